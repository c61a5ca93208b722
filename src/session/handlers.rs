//! Chat commands answered by the session at once (`/stop`, `/new`, `/status`, `/model`,
//! `/approve` …), and where every other inbound entry goes: the queue.

use super::*;

/// Store namespace of the models chats chose with `/model`, by session key.
pub(super) const MODEL_NS: &str = "session.model";

/// The model this chat's turns ask for: its `/model` choice, or the agent's.
pub(super) fn current_model(state: &SessionState) -> &str {
    state
        .model
        .as_deref()
        .or_else(|| state.args.deps.agent.models.first().map(String::as_str))
        .unwrap_or("?")
}

/// `/model` (show) or `/model NAME` (switch this chat, stored).
pub(super) fn switch_model(
    state: &mut SessionState,
    name: Option<String>,
) -> (OutboundKind, String) {
    let allowed = state.args.deps.agent.models.join(", ");
    let Some(name) = name else {
        return (
            OutboundKind::Final,
            format!(
                "This chat uses {}. Models of this assistant: {allowed}. Switch with /model NAME.",
                current_model(state)
            ),
        );
    };
    if !state.args.deps.agent.models.contains(&name) {
        return (
            OutboundKind::Error,
            format!("`{name}` is not a model of this assistant. Choose one of: {allowed} (the operator lists them in agents.<name>.models)."),
        );
    }
    let default = state.args.deps.agent.models.first() == Some(&name);
    let stored = if default { None } else { Some(name.as_str()) };
    // Durable with the flush of the answer written right after it (the reply waits for it).
    if let Err(e) =
        state
            .args
            .deps
            .store
            .state_put_unflushed(MODEL_NS, state.args.key.as_str(), stored)
    {
        return (
            OutboundKind::Error,
            format!("The model could not be saved: {e}"),
        );
    }
    state.model = stored.map(str::to_string);
    (OutboundKind::Final, format!("This chat now uses {name}."))
}

/// Where a chat's `/voice` choice is stored (absent: the agent's `reply_with_voice`).
pub(super) const VOICE_NS: &str = "session.voice";

/// `/voice [MODE]`: show or set when this chat's answers are spoken.
pub(super) fn switch_voice(
    state: &mut SessionState,
    mode: Option<String>,
) -> (OutboundKind, String) {
    let agent = state.args.deps.agent.reply_with_voice;
    let current = state.voice.unwrap_or(agent);
    let Some(mode) = mode else {
        return (
            OutboundKind::Final,
            format!(
                "Voice replies in this chat: {}{}. Set with /voice never, /voice when_asked (when you ask), /voice to_voice (voice notes are answered with voice notes), or /voice default.",
                current.as_str(),
                if state.voice.is_none() { " (the assistant's default)" } else { "" }
            ),
        );
    };
    let chosen = if mode == "default" {
        None
    } else {
        match crate::types::VoiceReplies::parse(&mode) {
            Some(v) => Some(v),
            None => {
                return (
                    OutboundKind::Error,
                    format!(
                        "`{mode}` is not a voice setting. Choose one of: never, when_asked, to_voice, default."
                    ),
                )
            }
        }
    };
    let stored = chosen.map(crate::types::VoiceReplies::as_str);
    if let Err(e) =
        state
            .args
            .deps
            .store
            .state_put_unflushed(VOICE_NS, state.args.key.as_str(), stored)
    {
        return (
            OutboundKind::Error,
            format!("The voice setting could not be saved: {e}"),
        );
    }
    state.voice = chosen;
    (
        OutboundKind::Final,
        format!(
            "Voice replies in this chat: {}.",
            chosen.unwrap_or(agent).as_str()
        ),
    )
}

pub(super) fn on_inbound(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    entry: InboxEntry,
) {
    // The gateway's own messages are never chat commands (a reminder may start with `/`).
    let command = entry
        .event
        .as_ref()
        .filter(|e| e.origin.is_user())
        .and_then(|e| ChatCommand::parse(&e.content));
    if let Some(ev) = entry.event.as_ref().filter(|e| {
        matches!(
            e.origin,
            clawft_channel_core::Origin::Scheduled { text: true, .. }
        )
    }) {
        // A scheduled text: delivered as it is, in order with the chat's other answers, through
        // the same exactly-once path (the entry is done in the batch that queues the reply).
        if state.draining {
            return;
        }
        let text = ev.content.clone();
        tell_scheduler(&state.args.hooks, ev, RunOutcome::Ok, None);
        answer_now(state, &entry, OutboundKind::Final, text);
        return;
    }
    match command {
        Some(ChatCommand::Stop) => {
            if let Some(h) = &state.args.hooks.subagents {
                h.cancel_session(&state.args.key);
            }
            let text = match &state.running {
                Some(r) => {
                    r.cancel.cancel();
                    "Stopping the running turn.".to_string()
                }
                None => "Nothing is running.".to_string(),
            };
            answer_now(state, &entry, OutboundKind::Final, text);
        }
        Some(ChatCommand::New) => {
            if let Some(h) = &state.args.hooks.subagents {
                h.cancel_session(&state.args.key);
            }
            if let Some(p) = &state.args.hooks.processes {
                p.kill_session(&state.args.key);
            }
            if let Some(r) = &state.running {
                r.cancel.cancel();
            }
            // Clear once the running turn (if any) has finished writing.
            let (tx, _rx) = tokio::sync::oneshot::channel();
            state.resets.push(RpcReplyPort::from(tx));
            if state.running.is_none() {
                finish_resets(myself, state);
            }
            answer_now(
                state,
                &entry,
                OutboundKind::Final,
                "Started a new conversation.".into(),
            );
        }
        Some(ChatCommand::Status) => {
            let s = status(state);
            let text = format!(
                "session {} (agent {}, model {}): {} messages, {}, {} queued\n{}",
                s.key,
                state.args.key.agent(),
                current_model(state),
                s.messages,
                if s.running {
                    "a turn is running"
                } else {
                    "idle"
                },
                s.queued,
                state.args.deps.usage.status_text(&s.key)
            );
            answer_now(state, &entry, OutboundKind::Final, text);
        }
        Some(ChatCommand::Compact) => {
            // Runs like a turn, in order with the queued messages.
            if !state.draining {
                state.queue.push_back(Queued {
                    entry,
                    compact: true,
                });
                maybe_start(myself, state);
            }
        }
        Some(ChatCommand::Help) => {
            answer_now(state, &entry, OutboundKind::Final, command::HELP.into());
        }
        Some(ChatCommand::Model(name)) => {
            let (kind, text) = switch_model(state, name);
            answer_now(state, &entry, kind, text);
        }
        Some(ChatCommand::Voice(mode)) => {
            let (kind, text) = switch_voice(state, mode);
            answer_now(state, &entry, kind, text);
        }
        Some(ChatCommand::Approval { id, decision }) => {
            let (kind, text) = match &state.args.hooks.approvals {
                Some(a) => match answer_approval(a, &state.args.key, &entry, &id, decision) {
                    Ok(t) => (OutboundKind::Final, t),
                    Err(e) => (OutboundKind::Error, e.to_string()),
                },
                None => (
                    OutboundKind::Error,
                    "Nothing here asks for approvals.".to_string(),
                ),
            };
            answer_now(state, &entry, kind, text);
        }
        None => {
            if state.draining {
                // Left pending in the journal: processed after the restart.
                return;
            }
            if state.queue.len() >= state.args.max_queue {
                refuse(
                    state,
                    &entry,
                    format!(
                        "Too many messages are waiting ({}); this one was not processed. Send it again when the current work is done.",
                        state.queue.len()
                    ),
                );
                return;
            }
            state.queue.push_back(Queued {
                entry,
                compact: false,
            });
            maybe_start(myself, state);
        }
    }
}

/// A chat's `/approve` or `/deny`: the terminal (`weft agent`, local or through the gateway
/// with the control token) is the operator; anyone else answers as the chat user they are.
fn answer_approval(
    approvals: &crate::approval::Approvals,
    session: &SessionKey,
    entry: &InboxEntry,
    id: &str,
    decision: crate::approval::Decision,
) -> Result<String, crate::approval::Refused> {
    if clawft_channel_core::Surface::of(session.route().0)
        == Some(clawft_channel_core::Surface::Terminal)
    {
        return approvals
            .answer_any(id, decision)
            .map_err(crate::approval::Refused::NotPending);
    }
    let sender = entry
        .event
        .as_ref()
        .map(|e| format!("{}:{}", e.channel.as_str(), e.sender.as_str()))
        .unwrap_or_default();
    approvals.answer(session, &sender, id, decision)
}
