//! Results told to the root chat session: batched, written, journaled, routed.

use super::{supervisor::*, task::*};

use clawft_channel_core::{ChannelId, ChatId, InboundEvent, PlatformEventId, ThreadId, UserId};
use serde::{Deserialize, Serialize};

use crate::store::JournalOutcome;
use crate::types::session_key::SYSTEM_SENDER;
use crate::types::SessionKey;

/// An announcement: which tasks, and the message text.
#[derive(Serialize, Deserialize)]
pub(super) struct Batch {
    pub(super) root: String,
    pub(super) ids: Vec<String>,
    pub(super) content: String,
}

pub(super) fn describe(r: &TaskRecord) -> String {
    let secs = r.usage.wall_ms as f64 / 1000.0;
    let tokens = r.usage.input_tokens + r.usage.output_tokens;
    let head = format!(
        "- task {} \"{}\" {} after {secs:.1}s ({} LLM calls, {} tool calls, {tokens} tokens)",
        r.id,
        r.label,
        match r.status {
            TaskStatus::Completed => "completed",
            TaskStatus::Cancelled => "was cancelled",
            _ => "failed",
        },
        r.usage.llm_calls,
        r.usage.tool_calls,
    );
    let mut body = match (&r.result, &r.error) {
        (Some(res), None) => res.clone(),
        (res, Some(e)) => match res {
            Some(res) if !res.is_empty() => format!("error: {e}\n{res}"),
            _ => format!("error: {e}"),
        },
        (None, None) => String::new(),
    };
    if body.chars().count() > ANNOUNCE_RESULT_CHARS {
        body = body.chars().take(ANNOUNCE_RESULT_CHARS).collect::<String>()
            + "\n[result truncated; call subagents result for the whole text]";
    }
    format!("{head}:\n{body}")
}

/// Journal one message to `root` with every result not yet announced there; with `route`, also
/// hand it to the bus at once.
pub(super) fn announce(
    state: &mut SupervisorState,
    root: &str,
    route: bool,
) -> Result<(), crate::store::StoreError> {
    let mut due: Vec<TaskRecord> = state
        .records
        .values()
        .filter(|r| r.root == root && needs_announcing(r))
        .cloned()
        .collect();
    if due.is_empty() {
        return Ok(());
    }
    due.sort_by(|a, b| {
        a.ended_ms
            .cmp(&b.ended_ms)
            .then(a.created_ms.cmp(&b.created_ms))
    });
    let mut content = String::from(
        "[Automatic message from the gateway, not from the user: results of subagents you started. Use them to continue; the user has not seen them.]\n",
    );
    for r in &due {
        content.push_str(&describe(r));
        content.push('\n');
    }
    let batch_id = uuid::Uuid::now_v7().to_string();
    let batch = Batch {
        root: root.to_string(),
        ids: due.iter().map(|r| r.id.clone()).collect(),
        content,
    };
    let store = state.args.store.clone();
    store.state_put(
        NS_BATCHES,
        &batch_id,
        Some(&serde_json::to_string(&batch).unwrap_or_default()),
    )?;
    journal_batch(state, &batch_id, &batch, route && !state.shutting_down)
}

pub(super) fn journal_batch(
    state: &mut SupervisorState,
    batch_id: &str,
    batch: &Batch,
    route: bool,
) -> Result<(), crate::store::StoreError> {
    let store = state.args.store.clone();
    let Ok(session) = SessionKey::parse(&batch.root) else {
        tracing::error!(root = %batch.root, "invalid root session; announcement dropped");
        return store.state_put(NS_BATCHES, batch_id, None);
    };
    let (channel, chat, thread) = session.route();
    let ev = InboundEvent {
        channel: ChannelId::new(channel),
        chat: ChatId::new(chat),
        thread: thread.map(ThreadId::new),
        sender: UserId::new(SYSTEM_SENDER),
        sender_name: None,
        event_id: PlatformEventId::new(format!("subagents:{batch_id}")),
        content: batch.content.clone(),
        received_at_ms: now_ms(),
        attachments: Vec::new(),
        origin: clawft_channel_core::Origin::Subagent,
    };
    let outcome = store.journal_inbound(&ev, &session)?;
    for id in &batch.ids {
        if let Some(r) = state.records.get_mut(id) {
            r.announced = true;
            persist(&store, r);
        }
    }
    store.state_put(NS_BATCHES, batch_id, None)?;
    tracing::info!(session = %session, tasks = batch.ids.len(), "subagent results announced");
    if let (JournalOutcome::New(entry), true) =
        (outcome, route && !state.args.intake.is_cancelled())
    {
        state.args.inbox.route(entry);
    }
    Ok(())
}
