//! The turn task of a session: runs one turn (or `/compact`) off the actor, streams its deltas
//! and progress to the chat, keeps the typing indicator alive, records the end of the turn and
//! reports back with [`SessionMsg::TurnFinished`]. It never touches the actor's state.

use super::*;

/// What the session decided about the turn it starts.
pub(super) struct TurnPlan {
    /// The journaled entry the turn answers.
    pub entry: InboxEntry,
    /// Its event.
    pub ev: clawft_channel_core::InboundEvent,
    /// The dependencies as of this turn (prompt, model).
    pub deps: TurnDeps,
    /// `/compact`: summarise instead of answering.
    pub compact: bool,
    /// A heartbeat run: a reply with nothing to report is not sent.
    pub heartbeat: bool,
    /// Who the turn's spend counts against.
    pub user: String,
}

/// Run the turn of `plan` in a tracked task; the session is busy until it reports back.
pub(super) fn spawn(myself: &ActorRef<SessionMsg>, state: &mut SessionState, plan: TurnPlan) {
    let cancel = state.args.shutdown.child_token();
    state.running = Some(RunningTurn {
        cancel: cancel.clone(),
    });
    let outbox = state.args.hooks.outbox.clone();
    // Streamed from the provider when the agent streams and the chat's channel takes deltas
    // (the outbox decides; the terminal served through the HTTP API streams as it does).
    let stream = plan.deps.shared.agent.stream
        && outbox
            .channels()
            .takes(plan.ev.channel.as_str(), OutboundKind::Delta);
    let task = TurnTask {
        key: state.args.key.clone(),
        outbox,
        hooks: state.args.hooks.clone(),
        stream,
        cancel,
    };
    let history = state.transcript.clone();
    let win = state.window.clone();
    let me = myself.clone();
    let span = tracing::Span::current();
    state
        .args
        .tasks
        .spawn(async move { task.run(me, plan, history, win).await }.instrument(span));
}

/// What the turn task holds of its session: owned copies, the actor's state is never touched.
struct TurnTask {
    key: SessionKey,
    outbox: Outbox,
    hooks: SessionHooks,
    /// Whether the session's channel streams (deltas and progress are forwarded).
    stream: bool,
    /// The turn's own token (a child of the session's shutdown token).
    cancel: CancellationToken,
}

impl TurnTask {
    /// Run the turn, compose its reply, record its end durably and report back.
    async fn run(
        self,
        me: ActorRef<SessionMsg>,
        plan: TurnPlan,
        history: Vec<Message>,
        win: window::WindowState,
    ) {
        let TurnPlan {
            entry,
            ev,
            deps,
            compact,
            heartbeat,
            user,
        } = plan;
        let (mut outcome, window, reload) = self
            .run_turn(&deps, &entry, &ev, compact, history, win)
            .await;
        count_turn(&self.key, &outcome.status);
        let reply = self
            .compose_reply(&deps, &entry, &ev, heartbeat, &mut outcome)
            .await;
        self.record_end(&deps, &entry, &user, &outcome, reply.as_ref())
            .await;
        let (run, detail) = run_outcome(&outcome.status);
        tell_scheduler(&self.hooks, &ev, run, detail);
        let _ = me.cast(SessionMsg::TurnFinished {
            outcome: Box::new(outcome),
            reply,
            reload,
            window: window.map(Box::new),
        });
    }

    /// The turn itself (or `/compact`), with its deltas and progress forwarded to a streaming
    /// chat and the typing indicator kept alive; a panic is caught and becomes a failed turn
    /// whose session reloads its transcript (`true`).
    async fn run_turn(
        &self,
        deps: &TurnDeps,
        entry: &InboxEntry,
        ev: &clawft_channel_core::InboundEvent,
        compact: bool,
        history: Vec<Message>,
        win: window::WindowState,
    ) -> (TurnOutcome, Option<window::WindowUpdate>, bool) {
        let (events_tx, forwarder) = if self.stream {
            let (tx, rx) = mpsc::channel(256);
            let f = tokio::spawn(forward_events(rx, self.outbox.clone(), entry.clone()));
            (Some(tx), Some(f))
        } else {
            (None, None)
        };
        // The typing indicator, refreshed while the turn runs (platforms expire it ~5 s).
        let typing_done = CancellationToken::new();
        let typing = tokio::spawn(typing_ticker(
            self.outbox.clone(),
            ev.clone(),
            typing_done.clone(),
        ));
        let run = async {
            if compact {
                window::compact_now(deps, &self.key, win, history, &self.cancel).await
            } else {
                window::run_windowed(
                    deps,
                    &self.key,
                    win,
                    history,
                    events_tx.as_ref(),
                    &self.cancel,
                )
                .await
            }
        };
        let ran = match AssertUnwindSafe(run).catch_unwind().await {
            Ok((o, w)) => (o, w, false),
            Err(_) => {
                tracing::error!("turn panicked; the session reloads its transcript");
                (
                    TurnOutcome::failed(
                        "Internal error: this turn crashed. Your message was received; try again.",
                    ),
                    None,
                    true,
                )
            }
        };
        typing_done.cancel();
        let _ = typing.await;
        drop(events_tx);
        if let Some(f) = forwarder {
            let _ = f.await;
        }
        ran
    }

    /// The reply to put in the outbox: the answer or the failure, each decoration by its own
    /// function (the `MEDIA:` lines, a spoken answer, the files the tools made). `None`: a
    /// heartbeat with nothing to report (answered, not sent).
    async fn compose_reply(
        &self,
        deps: &TurnDeps,
        entry: &InboxEntry,
        ev: &clawft_channel_core::InboundEvent,
        heartbeat: bool,
        outcome: &mut TurnOutcome,
    ) -> Option<OutboundMessage> {
        let Some(body) = reply_body(outcome, heartbeat, ev.channel.surface().is_none()) else {
            if let Some(s) = &self.hooks.scheduler {
                s.heartbeat_quiet();
            }
            return None;
        };
        let mut reply = reply_to(entry, body)?;
        if reply.kind() == OutboundKind::Final {
            attach_media_lines(&self.outbox, &deps.shared.workspace, &mut reply);
        }
        // Files the turn's tools made go out also when the turn then failed (a budget
        // reached after the image was paid for): they were made for this chat.
        let mut files = std::mem::take(&mut outcome.files);
        if let Some(spoken) = self.spoken_reply(deps, ev, &reply, &files).await {
            deps.shared
                .usage
                .tally_media(&mut outcome.by_model, &[spoken.1]);
            files.push(spoken.0);
        }
        attach_made_files(&self.outbox, &deps.shared.workspace, &mut reply, &files);
        Some(reply)
    }

    /// The answer spoken (`reply_with_voice = "to_voice"`, to a message sent as a voice note,
    /// when the tools made no audio): the file and its spend.
    async fn spoken_reply(
        &self,
        deps: &TurnDeps,
        ev: &clawft_channel_core::InboundEvent,
        reply: &OutboundMessage,
        files: &[String],
    ) -> Option<(String, crate::tools::MediaUse)> {
        let wanted = reply.kind() == OutboundKind::Final
            && deps.turn.voice == crate::types::VoiceReplies::ToVoice
            && asked_by_voice(ev)
            && !files.iter().any(|f| is_audio_path(f));
        let media = self.hooks.media.as_ref().filter(|m| wanted && m.speaks())?;
        voice_reply(media, &deps.shared.workspace, reply.text(), &self.cancel).await
    }

    /// Write the end of the turn in one batch (the messages not yet stored, the journal entry
    /// done, the reply in the outbox, the usage) and await its flush, shared with every
    /// session finishing now (group commit): durable before the reply is routed.
    async fn record_end(
        &self,
        deps: &TurnDeps,
        entry: &InboxEntry,
        user: &str,
        outcome: &TurnOutcome,
        reply: Option<&OutboundMessage>,
    ) {
        let skip = outcome.messages.len().saturating_sub(outcome.unpersisted);
        let tail = &outcome.messages[skip..];
        let finished =
            deps.shared
                .usage
                .finish_turn(self.key.as_str(), user, &outcome.by_model, |ops| {
                    deps.shared.store.finish_turn_unflushed(
                        &self.key,
                        Some(entry),
                        tail,
                        reply,
                        ops,
                    )
                });
        let finished = match finished {
            Ok(()) => deps.shared.store.flush_async().await,
            Err(e) => Err(e),
        };
        if let Err(e) = finished {
            tracing::error!(error = %e, "could not record the end of the turn");
        }
    }
}

/// Count the turn in `clawft_turns_total` by agent and status.
fn count_turn(key: &SessionKey, status: &TurnStatus) {
    let status = match status {
        TurnStatus::Completed => "completed",
        TurnStatus::IterationLimit => "iteration_limit",
        TurnStatus::Cancelled => "cancelled",
        TurnStatus::Failed(_) => "failed",
        TurnStatus::OverBudget(_) => "over_budget",
    };
    crate::metrics::inc(
        "clawft_turns_total",
        &[("agent", key.agent()), ("status", status)],
        1,
    );
}

/// The body of the reply to a turn that ended so: the answer with the turn's tokens (for
/// clients that report them), or the failure with its reason; `None` for a heartbeat with
/// nothing to report. In a chat (`chat_user`: a platform, not the terminal, the HTTP API or
/// the control UI, which the operator and integrators use) a provider failure is a plain
/// sentence: status codes, the provider's text and the fix are the operator's (log, status).
fn reply_body(outcome: &TurnOutcome, heartbeat: bool, chat_user: bool) -> Option<OutboundBody> {
    let reason = match outcome.status {
        TurnStatus::Completed => {
            let text = if heartbeat {
                heartbeat_reply(&outcome.reply)?
            } else {
                outcome.reply.clone()
            };
            return Some(OutboundBody::Reply {
                text,
                usage: Some(clawft_channel_core::Usage {
                    prompt_tokens: outcome.usage.input_tokens,
                    completion_tokens: outcome.usage.output_tokens,
                }),
            });
        }
        TurnStatus::OverBudget(_) => clawft_channel_core::ErrorReason::OverBudget,
        TurnStatus::IterationLimit | TurnStatus::Cancelled | TurnStatus::Failed(_) => {
            clawft_channel_core::ErrorReason::Failed
        }
    };
    let text = match outcome.provider_failure {
        Some(f) if chat_user => f.plain_text().to_string(),
        Some(_) | None => outcome.reply.clone(),
    };
    Some(OutboundBody::Error { text, reason })
}

/// What the scheduler records of a run that ended so.
fn run_outcome(status: &TurnStatus) -> (RunOutcome, Option<String>) {
    match status {
        TurnStatus::Completed => (RunOutcome::Ok, None),
        TurnStatus::Cancelled => (RunOutcome::Cancelled, None),
        TurnStatus::IterationLimit => (
            RunOutcome::Failed,
            Some("stopped at the tool-call iteration limit".to_string()),
        ),
        TurnStatus::Failed(e) | TurnStatus::OverBudget(e) => (RunOutcome::Failed, Some(e.clone())),
    }
}

/// `MEDIA: path` lines of a final reply become its attachments (copied out of the workspace
/// now, so the reply sends these bytes even after a crash); a file that cannot be attached is
/// named in the text instead.
fn attach_media_lines(outbox: &Outbox, ws: &crate::tools::Workspace, reply: &mut OutboundMessage) {
    // Most replies name no file: no channel lookup, no copy of the text.
    if !reply.text().contains("MEDIA:") {
        return;
    }
    // A channel that sends no files (the HTTP API, the terminal) shows the lines as written.
    if !crate::tools::message::MessageSink::sends_files(outbox, reply.channel.as_str()) {
        return;
    }
    let (text, paths) = crate::tools::message::media_lines(reply.text());
    if paths.is_empty() {
        return;
    }
    let mut text = text;
    let limit = crate::tools::message::MAX_ATTACHMENTS;
    for (p, r) in paths.iter().zip(crate::tools::message::attach_each(
        outbox,
        ws,
        &reply.id,
        &paths[..paths.len().min(limit)],
    )) {
        match r {
            Ok(f) => reply.attachments.push(f),
            Err(e) => {
                tracing::warn!(path = %p, error = %e, "reply attachment refused");
                text.push_str(&format!("\n\n(Could not attach {p}: {e})"));
            }
        }
    }
    for p in paths.iter().skip(limit) {
        text.push_str(&format!("\n\n(Not attached, over {limit} files: {p})"));
    }
    if let Some(t) = reply.text_mut() {
        *t = text;
    }
}

/// Whether the message a turn answers carried a voice note.
fn asked_by_voice(ev: &clawft_channel_core::InboundEvent) -> bool {
    ev.attachments
        .iter()
        .any(|m| m.kind == clawft_channel_core::media::MediaKind::Voice)
}

/// Whether workspace path `p` names an audio file (by its extension).
fn is_audio_path(p: &str) -> bool {
    let ext = p.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    matches!(
        ext.as_deref(),
        Some("ogg" | "opus" | "wav" | "mp3" | "m4a" | "flac" | "aac")
    )
}

/// The spoken form of reply `text`: markup and code blocks dropped, cut at the speech limit
/// on a word.
fn speakable(text: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(text.len());
    let mut code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            // Code is not read aloud.
            code = !code;
            continue;
        }
        let line = line.trim().trim_start_matches(['#', '>', '-', '*']).trim();
        if code || line.is_empty() {
            continue;
        }
        let clean: String = line
            .chars()
            .filter(|c| !matches!(c, '*' | '_' | '`' | '~' | '|'))
            .collect();
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&clean);
    }
    if out.chars().count() <= max_chars {
        return out;
    }
    let cut: String = out.chars().take(max_chars).collect();
    match cut.rfind(char::is_whitespace) {
        Some(i) if i > 0 => cut[..i].to_string(),
        _ => cut,
    }
}

/// Speak the reply `text` into the workspace (`reply_with_voice = "to_voice"`): the file and
/// the spend, or `None` (logged) when speech failed: the text still goes.
async fn voice_reply(
    media: &crate::media::Media,
    ws: &crate::tools::Workspace,
    text: &str,
    cancel: &CancellationToken,
) -> Option<(String, crate::tools::MediaUse)> {
    let say = speakable(text, media.settings().tts_max_chars);
    if say.trim().is_empty() {
        return None;
    }
    let r = tokio::select! {
        r = crate::media::tools::speak_into(media, ws, &say, None) => r,
        () = cancel.cancelled() => return None,
    };
    match r {
        Ok((path, _, used)) => Some((path, used)),
        Err(e) => {
            tracing::warn!(error = %e, "the voice reply could not be made; the text goes alone");
            None
        }
    }
}

/// Attach the files the turn made (`tts`, `image`, a spoken reply) to the reply; a channel
/// that sends no files gets their paths in the text, a file that cannot be attached a note.
fn attach_made_files(
    outbox: &Outbox,
    ws: &crate::tools::Workspace,
    reply: &mut OutboundMessage,
    files: &[String],
) {
    if files.is_empty() {
        return;
    }
    let mut notes = String::new();
    if crate::tools::message::MessageSink::sends_files(outbox, reply.channel.as_str()) {
        let room = crate::tools::message::MAX_ATTACHMENTS.saturating_sub(reply.attachments.len());
        let (now, over) = files.split_at(files.len().min(room));
        for (p, r) in now.iter().zip(crate::tools::message::attach_each(
            outbox, ws, &reply.id, now,
        )) {
            match r {
                Ok(f) => reply.attachments.push(f),
                Err(e) => {
                    tracing::warn!(path = %p, error = %e, "made file not attached");
                    notes.push_str(&format!("\n\n(Could not attach {p}: {e})"));
                }
            }
        }
        for p in over {
            notes.push_str(&format!(
                "\n\n(Not attached, over {} files: {p})",
                crate::tools::message::MAX_ATTACHMENTS
            ));
        }
    } else {
        for p in files {
            notes.push_str(&format!("\n\n(Saved in the workspace: {p})"));
        }
    }
    if !notes.is_empty() {
        if let Some(t) = reply.text_mut() {
            t.push_str(&notes);
        }
    }
}

/// How often the typing indicator is refreshed while a turn runs.
const TYPING_EVERY: std::time::Duration = std::time::Duration::from_secs(4);

async fn typing_ticker(
    outbox: Outbox,
    ev: clawft_channel_core::InboundEvent,
    done: CancellationToken,
) {
    loop {
        outbox.typing(&ev.channel, ev.chat.clone(), ev.thread.clone());
        tokio::select! {
            () = done.cancelled() => return,
            () = tokio::time::sleep(TYPING_EVERY) => {}
        }
    }
}

async fn forward_events(mut rx: mpsc::Receiver<TurnEvent>, outbox: Outbox, entry: InboxEntry) {
    while let Some(ev) = rx.recv().await {
        let body = match ev {
            TurnEvent::Delta(text) => OutboundBody::Delta { text },
            TurnEvent::Restart => OutboundBody::Restart,
            TurnEvent::Tool(p) => OutboundBody::Progress(p),
        };
        if let Some(m) = reply_to(&entry, body) {
            outbox.route(m);
        }
    }
}

#[cfg(test)]
mod voice_tests {
    use super::*;

    #[test]
    fn a_reply_is_spoken_without_markup_and_cut_on_a_word() {
        let text = "# Plan\n\n**Milk** and `eggs`:\n- bread\n```\ncode\n```\n";
        assert_eq!(speakable(text, 100), "Plan\nMilk and eggs:\nbread");
        assert_eq!(speakable("one two three", 9), "one two");
        assert!(is_audio_path("media/d/speech-1.OGG") && !is_audio_path("media/d/a.png"));
    }
}
