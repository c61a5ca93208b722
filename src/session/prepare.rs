//! Attachments fetched before a turn: a download task of the session, and its result.

use super::*;

/// The attachments of `entry` are fetched: run its turn next, unless `/stop`, `/new` or a
/// shutdown came meanwhile.
pub(super) fn on_prepared(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    entry: InboxEntry,
    prepared: crate::media::Prepared,
) {
    let cancelled = state
        .running
        .take()
        .is_some_and(|r| r.cancel.is_cancelled());
    if state.draining {
        // Still pending in the journal: fetched again (or found in the inbox) after the restart.
        for d in state.drains.drain(..) {
            let _ = d.send(());
        }
        return;
    }
    if cancelled {
        answer_now(
            state,
            &entry,
            OutboundKind::Final,
            "Stopped: the turn was cancelled.".into(),
        );
        finish_resets(myself, state);
        return maybe_start(myself, state);
    }
    if let Some(id) = entry
        .event
        .as_ref()
        .map(|e| e.event_id.as_str().to_string())
    {
        state.prepared = Some((id, prepared));
    }
    state.queue.push_front(Queued {
        entry,
        compact: false,
    });
    maybe_start(myself, state);
}

/// Fetch the attachments of `entry` in a task of the session; [`SessionMsg::Prepared`] brings
/// the message back. The session counts as busy meanwhile (`/stop` ends the download).
pub(super) fn start_prepare(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    entry: InboxEntry,
    media: Arc<crate::media::Media>,
) {
    let Some(ev) = entry.event.clone() else {
        return;
    };
    let cancel = state.args.shutdown.child_token();
    state.running = Some(RunningTurn {
        cancel: cancel.clone(),
    });
    let adapter = state
        .args
        .hooks
        .outbox
        .channels()
        .get(ev.channel.as_str())
        .and_then(|c| c.adapter.upgrade());
    let ws = state.args.deps.workspace.clone();
    let me = myself.clone();
    let span = tracing::Span::current();
    state.args.tasks.spawn(
        async move {
            let prepared = media.prepare(&ws, &ev, adapter, &cancel).await;
            let _ = me.cast(SessionMsg::Prepared {
                entry,
                prepared: Box::new(prepared),
            });
        }
        .instrument(span),
    );
}
