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
    let TurnPlan {
        entry,
        ev,
        deps,
        compact,
        heartbeat,
        user,
    } = plan;
    let cancel = state.args.shutdown.child_token();
    state.running = Some(RunningTurn {
        cancel: cancel.clone(),
    });
    let key = state.args.key.clone();
    let history = state.transcript.clone();
    let win = state.window.clone();
    let me = myself.clone();
    let outbox = state.args.hooks.outbox.clone();
    let hooks = state.args.hooks.clone();
    // Streamed from the provider when the agent streams and the chat's channel takes deltas
    // (the outbox decides; the terminal served through the HTTP API streams as it does).
    let stream = deps.agent.stream
        && outbox
            .channels()
            .takes(ev.channel.as_str(), OutboundKind::Delta);
    let span = tracing::Span::current();
    state.args.tasks.spawn(
        async move {
            let (events_tx, forwarder) = if stream {
                let (tx, rx) = mpsc::channel(256);
                let f = tokio::spawn(forward_events(rx, outbox.clone(), entry.clone()));
                (Some(tx), Some(f))
            } else {
                (None, None)
            };
            // The typing indicator, refreshed while the turn runs (platforms expire it ~5 s).
            let typing_done = CancellationToken::new();
            let ev_done = ev.clone();
            let typing = tokio::spawn(typing_ticker(
                outbox.clone(),
                ev,
                typing_done.clone(),
            ));
            let run = async {
                if compact {
                    window::compact_now(&deps, &key, win, history, &cancel).await
                } else {
                    window::run_windowed(&deps, &key, win, history, events_tx.as_ref(), &cancel)
                        .await
                }
            };
            let (outcome, window, reload) = match AssertUnwindSafe(run).catch_unwind().await {
                Ok((o, w)) => (o, w, false),
                Err(_) => {
                    tracing::error!("turn panicked; the session reloads its transcript");
                    (TurnOutcome::failed("Internal error: this turn crashed. Your message was received; try again."), None, true)
                }
            };
            typing_done.cancel();
            let _ = typing.await;
            drop(events_tx);
            if let Some(f) = forwarder {
                let _ = f.await;
            }
            crate::metrics::inc(
                "clawft_turns_total",
                &[
                    ("agent", key.agent()),
                    (
                        "status",
                        match outcome.status {
                            TurnStatus::Completed => "completed",
                            TurnStatus::IterationLimit => "iteration_limit",
                            TurnStatus::Cancelled => "cancelled",
                            TurnStatus::Failed(_) => "failed",
                            TurnStatus::OverBudget(_) => "over_budget",
                        },
                    ),
                ],
                1,
            );
            let kind = match outcome.status {
                TurnStatus::Completed => OutboundKind::Final,
                TurnStatus::IterationLimit
                | TurnStatus::Cancelled
                | TurnStatus::Failed(_)
                | TurnStatus::OverBudget(_) => OutboundKind::Error,
            };
            // A heartbeat with nothing to report is answered (the entry is done) but not sent.
            let text = if heartbeat && kind == OutboundKind::Final {
                heartbeat_reply(&outcome.reply)
            } else {
                Some(outcome.reply.clone())
            };
            if text.is_none() {
                if let Some(s) = &hooks.scheduler {
                    s.heartbeat_quiet();
                }
            }
            // The turn's tokens, for clients that report them (the OpenAI-compatible API).
            let usage = clawft_channel_core::Usage {
                prompt_tokens: outcome.usage.input_tokens,
                completion_tokens: outcome.usage.output_tokens,
            };
            let reason = match outcome.status {
                TurnStatus::OverBudget(_) => clawft_channel_core::ErrorReason::OverBudget,
                _ => clawft_channel_core::ErrorReason::Failed,
            };
            let body = |text| match kind {
                OutboundKind::Error => OutboundBody::Error { text, reason },
                _ => OutboundBody::Reply {
                    text,
                    usage: Some(usage),
                },
            };
            let mut outcome = outcome;
            let mut reply = text.and_then(|t| reply_to(&entry, body(t))).map(|mut r| {
                if r.kind() == OutboundKind::Final {
                    attach_media_lines(&outbox, &deps.workspace, &mut r);
                }
                r
            });
            // Files the turn's tools made go out also when the turn then failed (a budget
            // reached after the image was paid for): they were made for this chat.
            if let Some(r) = reply.as_mut().filter(|r| {
                matches!(r.kind(), OutboundKind::Final | OutboundKind::Error)
            }) {
                let mut files = std::mem::take(&mut outcome.files);
                if r.kind() == OutboundKind::Final
                    && deps.voice == crate::types::VoiceReplies::ToVoice
                    && asked_by_voice(&ev_done)
                    && !files.iter().any(|f| is_audio_path(f))
                {
                    if let Some(media) = hooks.media.as_ref().filter(|m| m.speaks()) {
                        if let Some((path, used)) =
                            voice_reply(media, &deps.workspace, r.text(), &cancel).await
                        {
                            deps.usage.tally_media(&mut outcome.by_model, &[used]);
                            files.push(path);
                        }
                    }
                }
                attach_made_files(&outbox, &deps.workspace, r, &files);
            }
            let skip = outcome.messages.len().saturating_sub(outcome.unpersisted);
            let tail = &outcome.messages[skip..];
            let finished = deps
                .usage
                .finish_turn(key.as_str(), &user, &outcome.by_model, |ops| {
                    deps.store
                        .finish_turn_unflushed(&key, Some(&entry), tail, reply.as_ref(), ops)
                });
            // Durable before the reply is routed: one flush shared with every session
            // finishing now (group commit).
            let finished = match finished {
                Ok(()) => deps.store.flush_async().await,
                Err(e) => Err(e),
            };
            if let Err(e) = finished {
                tracing::error!(error = %e, "could not record the end of the turn");
            }
            let (run, detail) = match &outcome.status {
                TurnStatus::Completed => (RunOutcome::Ok, None),
                TurnStatus::Cancelled => (RunOutcome::Cancelled, None),
                TurnStatus::IterationLimit => (
                    RunOutcome::Failed,
                    Some("stopped at the tool-call iteration limit".to_string()),
                ),
                TurnStatus::Failed(e) | TurnStatus::OverBudget(e) => {
                    (RunOutcome::Failed, Some(e.clone()))
                }
            };
            tell_scheduler(&hooks, &ev_done, run, detail);
            let _ = me.cast(SessionMsg::TurnFinished {
                outcome: Box::new(outcome),
                reply,
                reload,
                window: window.map(Box::new),
            });
        }
        .instrument(span),
    );
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
