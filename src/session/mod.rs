//! ③ One [`SessionActor`] per conversation: owns the in-memory transcript and the queue of
//! journaled messages, runs one turn at a time in a spawned task, handles `/stop`, `/new`,
//! `/status`.
//!
//! It never awaits the LLM or a tool in `handle`: turns run in tracked tasks that report back
//! with [`SessionMsg::TurnFinished`].

mod handlers;
mod prepare;
pub mod prompt;
pub mod tools;
pub mod transcript;
mod turn_task;
pub mod window;

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use clawft_channel_core::{OutboundBody, OutboundKind, OutboundMessage};
use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::approval::Approvals;
use crate::egress::Outbox;
use crate::llm::{Message, Role};
use crate::scheduler::jobs::Outcome as RunOutcome;
use crate::scheduler::runtime::heartbeat_reply;
use crate::store::{InboxEntry, InboxState};
use crate::turn::{AgentDeps, TurnDeps, TurnEvent, TurnOutcome, TurnStatus};
use crate::types::session_key::{is_gateway_event, SYSTEM_SENDER};
use crate::types::SessionKey;
use clawft_channel_core::command::{self, ChatCommand};
use handlers::{on_inbound, MODEL_NS, VOICE_NS};
use prepare::{on_prepared, start_prepare};

/// Handle to a session actor.
pub type SessionRef = ActorRef<SessionMsg>;

/// Messages understood by [`SessionActor`].
pub enum SessionMsg {
    /// A journaled user message routed by the bus. Queued if a turn is running.
    Inbound(InboxEntry),
    /// Sent by this session's own turn task when the turn ends (already persisted).
    TurnFinished {
        /// The outcome.
        outcome: Box<TurnOutcome>,
        /// The reply put in the outbox (none: a heartbeat with nothing to report).
        reply: Option<OutboundMessage>,
        /// The turn panicked: reload the transcript from the store.
        reload: bool,
        /// The prompt window changed (compaction, calibration).
        window: Option<Box<window::WindowUpdate>>,
    },
    /// Abort the running turn, if any (shutdown after the grace period).
    Cancel,
    /// Clear the conversation (after the running turn, if any, is cancelled and finished).
    /// Replies whether anything was stored.
    Reset {
        /// Answer.
        reply: RpcReplyPort<bool>,
    },
    /// Stop taking new turns; reply once no turn is running.
    Drain {
        /// Answered when idle.
        reply: RpcReplyPort<()>,
    },
    /// A snapshot for `/status`, the admin API and tests.
    Status {
        /// Answer.
        reply: RpcReplyPort<SessionStatus>,
    },
    /// Sent by this session's own download task: the attachments of `entry` are in the
    /// workspace; its turn can start.
    Prepared {
        /// The entry, to run next.
        entry: InboxEntry,
        /// The message the model gets.
        prepared: Box<crate::media::Prepared>,
    },
    /// Sent by the session's own idle timer.
    IdleCheck {
        /// `routed` count when the timer was set.
        routed: u64,
    },
    /// Sent by this session's own clearing task (`/new`, a reset) once the store has
    /// forgotten the conversation durably; turns held meanwhile may start.
    Cleared,
}

/// A snapshot of a live session.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct SessionStatus {
    /// Key.
    pub key: String,
    /// Messages in the transcript.
    pub messages: usize,
    /// Whether a turn is running.
    pub running: bool,
    /// Messages waiting behind it.
    pub queued: usize,
}

/// Cancels the subagents of a chat session (`/stop`, `/new`); the subagent hub implements it,
/// so sessions need not know the supervisor.
pub trait SubagentTree: Send + Sync + 'static {
    /// Cancel every subagent started from `session` (and their children).
    fn cancel_session(&self, session: &SessionKey);
}

/// What every session uses beside its turns.
#[derive(Clone)]
pub struct SessionHooks {
    /// Where replies, deltas and typing go.
    pub outbox: Outbox,
    /// Pending approvals, answered by `/approve` and `/deny` in the session's chat.
    pub approvals: Option<Arc<Approvals>>,
    /// The subagents (`/stop` and `/new` cancel a session's subagents).
    pub subagents: Option<Arc<dyn SubagentTree>>,
    /// The scheduler: told how each scheduled run and heartbeat ended.
    pub scheduler: Option<Arc<crate::scheduler::Scheduler>>,
    /// Background processes (`process`): `/new` kills the session's.
    pub processes: Option<Arc<crate::tools::exec::process::ProcessTable>>,
    /// Attachments: downloaded into the workspace before the turn starts.
    pub media: Option<Arc<crate::media::Media>>,
}

/// Told when a session has been idle for its idle time: `(key, routed count)`. The bus evicts
/// the session if nothing was routed to it since.
pub type OnIdle = Arc<dyn Fn(SessionKey, u64) + Send + Sync>;

/// Arguments of a session actor.
pub struct SessionArgs {
    /// Its key.
    pub key: SessionKey,
    /// Its agent's dependencies (shared by the agent's sessions).
    pub deps: Arc<AgentDeps>,
    /// Outbox, approvals, subagents.
    pub hooks: SessionHooks,
    /// Idle reports.
    pub on_idle: OnIdle,
    /// Where turn tasks are tracked (the daemon waits for them at shutdown).
    pub tasks: TaskTracker,
    /// Parent of every turn's cancellation token.
    pub shutdown: CancellationToken,
    /// Idle time before the session leaves memory.
    pub idle: Duration,
    /// Most queued messages.
    pub max_queue: usize,
}

/// A journaled entry waiting for its turn, with what its text was parsed as when it arrived.
struct Queued {
    entry: InboxEntry,
    /// `/compact`: summarise instead of answering (parsed once, on arrival).
    compact: bool,
}

struct RunningTurn {
    cancel: CancellationToken,
}

/// State of a session actor.
pub struct SessionState {
    args: SessionArgs,
    /// The prompt window: the messages after the compaction point (the store keeps them all).
    transcript: Vec<Message>,
    window: window::WindowState,
    queue: VecDeque<Queued>,
    running: Option<RunningTurn>,
    routed: u64,
    resets: Vec<RpcReplyPort<bool>>,
    drains: Vec<RpcReplyPort<()>>,
    draining: bool,
    /// A clearing task runs (`/new`, a reset): no turn starts until [`SessionMsg::Cleared`].
    clearing: bool,
    /// The pending idle timer; replaced (and the old one aborted) each time the session idles,
    /// so a busy session holds one timer task, not one per turn.
    idle_timer: Option<tokio::task::JoinHandle<Result<(), ractor::MessagingErr<SessionMsg>>>>,
    /// The model `/model NAME` chose for this chat (stored, so it outlives a restart); `None`:
    /// the agent's.
    model: Option<String>,
    /// When this chat's answers are spoken, as `/voice` chose (stored); `None`: the agent's
    /// `reply_with_voice`.
    voice: Option<crate::types::VoiceReplies>,
    /// The attachments of the next entry, fetched (event id, message).
    prepared: Option<(String, crate::media::Prepared)>,
}

/// The session actor (stateless struct; state in [`SessionState`]).
pub struct SessionActor;

fn reply_to(entry: &InboxEntry, body: OutboundBody) -> Option<OutboundMessage> {
    let ev = entry.event.as_ref()?;
    // A turn woken by the gateway itself (subagent results, a scheduled run, a heartbeat)
    // answers the chat, not an event; its streaming deltas and progress go nowhere.
    let system = is_gateway_event(ev);
    if system && !body.kind().is_durable() {
        return None;
    }
    Some(OutboundMessage {
        id: uuid::Uuid::now_v7().to_string(),
        channel: ev.channel.clone(),
        chat: ev.chat.clone(),
        thread: ev.thread.clone(),
        in_reply_to: (!system).then(|| ev.event_id.clone()),
        body,
        attachments: Vec::new(),
    })
}

#[ractor::async_trait]
impl Actor for SessionActor {
    type Msg = SessionMsg;
    type State = SessionState;
    type Arguments = SessionArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: SessionArgs,
    ) -> Result<SessionState, ActorProcessingErr> {
        let (window, transcript) = load_repaired(&args)?;
        // A choice the agent no longer allows (its `models` changed) is dropped.
        let model = args
            .deps
            .store
            .state_get(MODEL_NS, args.key.as_str())
            .ok()
            .flatten()
            .filter(|m| args.deps.agent.models.contains(m));
        let voice = args
            .deps
            .store
            .state_get(VOICE_NS, args.key.as_str())
            .ok()
            .flatten()
            .and_then(|v| crate::types::VoiceReplies::parse(&v));
        Ok(SessionState {
            model,
            voice,
            args,
            transcript,
            window,
            queue: VecDeque::new(),
            running: None,
            routed: 0,
            resets: Vec::new(),
            drains: Vec::new(),
            draining: false,
            clearing: false,
            prepared: None,
            idle_timer: None,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: SessionMsg,
        state: &mut SessionState,
    ) -> Result<(), ActorProcessingErr> {
        let span = tracing::info_span!("session", session = %state.args.key, agent = state.args.key.agent());
        let _g = span.enter();
        match msg {
            SessionMsg::Inbound(entry) => {
                state.routed += 1;
                on_inbound(&myself, state, entry);
            }
            SessionMsg::TurnFinished {
                outcome,
                reply,
                reload,
                window,
            } => {
                if let Some(w) = window {
                    state.window = w.state;
                    if let Some(m) = w.messages {
                        state.transcript = m;
                    }
                }
                on_turn_finished(&myself, state, *outcome, reply, reload);
            }
            SessionMsg::Cancel => {
                if let Some(r) = &state.running {
                    r.cancel.cancel();
                }
            }
            SessionMsg::Reset { reply } => {
                state.resets.push(reply);
                match &state.running {
                    Some(r) => r.cancel.cancel(),
                    None => finish_resets(&myself, state),
                }
            }
            SessionMsg::Drain { reply } => {
                state.draining = true;
                if state.running.is_some() {
                    state.drains.push(reply);
                } else {
                    let _ = reply.send(());
                }
            }
            SessionMsg::Status { reply } => {
                let _ = reply.send(status(state));
            }
            SessionMsg::Prepared { entry, prepared } => {
                on_prepared(&myself, state, entry, *prepared);
            }
            SessionMsg::IdleCheck { routed } => {
                if routed == state.routed
                    && state.running.is_none()
                    && state.queue.is_empty()
                    && !state.clearing
                {
                    (state.args.on_idle)(state.args.key.clone(), routed);
                }
            }
            SessionMsg::Cleared => {
                state.clearing = false;
                // Resets asked for while it ran clear again (what a turn wrote meanwhile).
                finish_resets(&myself, state);
                maybe_start(&myself, state);
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut SessionState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(r) = &state.running {
            r.cancel.cancel();
        }
        if let Some(t) = state.idle_timer.take() {
            t.abort();
        }
        Ok(())
    }
}

/// The prompt window (the stored transcript after the compaction point), with orphan tool
/// calls repaired (and the repair persisted).
fn load_repaired(
    args: &SessionArgs,
) -> Result<(window::WindowState, Vec<Message>), crate::store::StoreError> {
    let (window, mut transcript) = window::load(&args.deps.store, &args.key)?;
    let added = transcript::repair(&mut transcript);
    if !added.is_empty() {
        tracing::warn!(session = %args.key, repaired = added.len(), "repaired tool calls left without a result");
        args.deps.store.append_messages(&args.key, &added)?;
    }
    Ok((window, transcript))
}

fn status(state: &SessionState) -> SessionStatus {
    SessionStatus {
        key: state.args.key.to_string(),
        messages: state.transcript.len(),
        running: state.running.is_some(),
        queued: state.queue.len(),
    }
}

/// Clear the conversation for the waiting resets: at once in memory, in the store by a task
/// of the session (the delete and its flush never run in the handler); turns wait for
/// [`SessionMsg::Cleared`].
fn finish_resets(myself: &ActorRef<SessionMsg>, state: &mut SessionState) {
    if state.resets.is_empty() || state.clearing {
        return;
    }
    state.clearing = true;
    state.transcript.clear();
    state.window = window::WindowState {
        calibration: state.window.calibration,
        ..window::WindowState::default()
    };
    let resets: Vec<_> = state.resets.drain(..).collect();
    let (store, key, me) = (
        state.args.deps.store.clone(),
        state.args.key.clone(),
        myself.clone(),
    );
    state.args.tasks.spawn(
        async move {
            let existed = match store.clear_session_async(&key).await {
                Ok(b) => b,
                Err(e) => {
                    tracing::error!(error = %e, "could not clear session");
                    false
                }
            };
            for r in resets {
                let _ = r.send(existed);
            }
            let _ = me.cast(SessionMsg::Cleared);
        }
        .instrument(tracing::Span::current()),
    );
}

/// Tell the scheduler how the gateway's own event `ev` ended (a scheduled run, a heartbeat);
/// nothing for a chat user's message.
fn tell_scheduler(
    hooks: &SessionHooks,
    ev: &clawft_channel_core::InboundEvent,
    outcome: RunOutcome,
    detail: Option<String>,
) {
    if let (true, Some(s)) = (is_gateway_event(ev), &hooks.scheduler) {
        s.finished(ev, outcome, detail);
    }
}

/// [`answer_now`] with an error that ends the entry without a turn (a budget, an oversized
/// message, a store failure): a scheduled run it ends has failed.
fn refuse(state: &SessionState, entry: &InboxEntry, text: String) {
    refuse_with(state, entry, text, clawft_channel_core::ErrorReason::Failed);
}

/// [`refuse`] for `reason`.
fn refuse_with(
    state: &SessionState,
    entry: &InboxEntry,
    text: String,
    reason: clawft_channel_core::ErrorReason,
) {
    if let Some(ev) = &entry.event {
        tell_scheduler(
            &state.args.hooks,
            ev,
            RunOutcome::Failed,
            Some(text.clone()),
        );
    }
    answer_body(state, entry, OutboundBody::Error { text, reason });
}

/// Answer a command or a refusal at once: the entry is done and the reply is in the outbox.
fn answer_now(state: &SessionState, entry: &InboxEntry, kind: OutboundKind, text: String) {
    answer_body(state, entry, OutboundBody::text_of(kind, text));
}

/// [`answer_now`] with `body`.
fn answer_body(state: &SessionState, entry: &InboxEntry, body: OutboundBody) {
    if let Some(reply) = reply_to(entry, body) {
        state
            .args
            .hooks
            .outbox
            .answer(&state.args.key, entry, reply);
    }
}

fn on_turn_finished(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    outcome: TurnOutcome,
    reply: Option<OutboundMessage>,
    reload: bool,
) {
    tracing::info!(
        status = ?outcome.status,
        llm_calls = outcome.llm_calls,
        tool_calls = outcome.tool_calls,
        input_tokens = outcome.usage.input_tokens,
        output_tokens = outcome.usage.output_tokens,
        "turn finished"
    );
    state.running = None;
    if reload {
        match load_repaired(&state.args) {
            Ok((w, t)) => {
                state.window = w;
                state.transcript = t;
            }
            Err(e) => tracing::error!(error = %e, "could not reload the transcript"),
        }
    } else {
        state.transcript.extend(outcome.messages);
    }
    if let Some(reply) = reply {
        state.args.hooks.outbox.route(reply);
    }
    finish_resets(myself, state);
    if state.draining {
        for d in state.drains.drain(..) {
            let _ = d.send(());
        }
        return;
    }
    maybe_start(myself, state);
}

fn maybe_start(myself: &ActorRef<SessionMsg>, state: &mut SessionState) {
    if state.running.is_some() || state.draining || state.clearing {
        return;
    }
    let Some(Queued { entry, compact }) = state.queue.pop_front() else {
        // Idle: leave memory after the idle period unless something arrives.
        let routed = state.routed;
        let timer = myself.send_after(state.args.idle, move || SessionMsg::IdleCheck { routed });
        if let Some(old) = state.idle_timer.replace(timer) {
            old.abort();
        }
        return;
    };
    let Some(ev) = entry.event.clone() else {
        return maybe_start(myself, state);
    };
    let user = budget_user(&ev);
    let admitted = state
        .args
        .deps
        .usage
        .admit(state.args.key.as_str(), &user, &[]);
    if let Err(refusal) = admitted {
        refuse_with(
            state,
            &entry,
            refusal.text,
            clawft_channel_core::ErrorReason::OverBudget,
        );
        return maybe_start(myself, state);
    }
    // The system prompt as of this turn (this user's files): one stat per context file, a read
    // only on a change.
    let mut deps = state.args.deps.for_turn(memory_user(&ev));
    deps.turn.turn_event = Some(ev.event_id.as_str().into());
    let heartbeat = ev.origin == clawft_channel_core::Origin::Heartbeat;
    if heartbeat {
        // `heartbeat.model`: a cheaper model for the periodic check.
        deps.turn.request_model = state
            .args
            .hooks
            .scheduler
            .as_ref()
            .and_then(|s| s.heartbeat())
            .and_then(|h| h.model.as_deref())
            .map(Into::into);
    }
    if !heartbeat {
        if let Some(m) = &state.model {
            deps.turn.request_model = Some(m.as_str().into());
        }
    }
    deps.turn.voice = state.voice.unwrap_or(deps.shared.agent.reply_with_voice);
    if compact {
        // `/compact`: nothing is appended to the transcript.
    } else if entry.state == InboxState::Pending {
        let prepared = state
            .prepared
            .take()
            .filter(|(id, _)| id == ev.event_id.as_str())
            .map(|(_, p)| p);
        if prepared.is_none() && !ev.attachments.is_empty() {
            if let Some(media) = state.args.hooks.media.clone() {
                return start_prepare(myself, state, entry, media);
            }
        }
        let (content, images) = match prepared {
            Some(p) => (p.text, p.images),
            None => (ev.content.clone(), Vec::new()),
        };
        if let Some(text) = window::too_large(&deps, &state.window, &content) {
            // Never stored: it could only make every later turn fail.
            tracing::warn!("message larger than the context window refused");
            refuse(state, &entry, text);
            return maybe_start(myself, state);
        }
        let mut user = Message::user(content);
        user.images = images;
        user.at_ms = Some(ev.received_at_ms).filter(|t| *t > 0);
        if !crate::types::session_key::is_gateway_event(&ev) {
            user.from = Some(crate::llm::Author {
                id: crate::types::SenderId::of(&ev).as_str().to_string(),
                name: ev.sender_name.clone(),
            });
        }
        if let Err(e) = state.args.deps.store.begin_turn(&entry, &user) {
            tracing::error!(error = %e, "could not record the user message");
            refuse(
                state,
                &entry,
                "Internal error: could not save your message.".into(),
            );
            return maybe_start(myself, state);
        }
        state.transcript.push(user);
    } else if state.transcript.last().map(|m| m.role) == Some(Role::Assistant)
        && state
            .transcript
            .last()
            .is_some_and(|m| m.tool_calls.is_empty())
    {
        // Resumed after a crash, but the answer was already recorded: nothing to do but
        // finish the entry. (Cannot normally happen: finishing is atomic.)
        let text = state
            .transcript
            .last()
            .map(|m| m.content.clone())
            .unwrap_or_default();
        tell_scheduler(&state.args.hooks, &ev, RunOutcome::Ok, None);
        answer_now(state, &entry, OutboundKind::Final, text);
        return maybe_start(myself, state);
    } else {
        tracing::info!(event_id = %ev.event_id, "resuming a turn interrupted by a restart");
    }

    turn_task::spawn(
        myself,
        state,
        turn_task::TurnPlan {
            entry,
            ev,
            deps,
            compact,
            heartbeat,
            user,
        },
    );
}

/// The chat user whose memory a turn uses under `memory.scope = "user"`: `None` for the
/// terminal (`cli`, the operator's) and the gateway's own messages, which use the agent's.
fn memory_user(ev: &clawft_channel_core::InboundEvent) -> Option<(&str, &str)> {
    ((ev.origin.is_user() || ev.sender.as_str() != SYSTEM_SENDER)
        && ev.channel.surface() != Some(clawft_channel_core::Surface::Terminal))
    .then(|| (ev.channel.as_str(), ev.sender.as_str()))
}

/// Who a turn's spend is counted against for `budgets.per_user_daily_*`: `channel:sender`
/// (empty for the gateway's own messages, such as subagent results).
fn budget_user(ev: &clawft_channel_core::InboundEvent) -> String {
    if !ev.origin.is_user() && ev.sender.as_str() == SYSTEM_SENDER {
        String::new()
    } else {
        crate::types::SenderId::of(ev).into()
    }
}
