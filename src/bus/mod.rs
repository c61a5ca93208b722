//! ② The [`BusActor`] routes journaled inbound messages to one session actor per
//! [`SessionKey`] (spawned on first message, supervised, evicted when idle). Senders of inbound
//! messages (ingress, the subagent supervisor) hold an [`Inbox`], not the actor's ref; replies
//! do not pass through the bus (sessions hold an [`crate::egress::Outbox`]).
//!
//! It holds no conversation state and never awaits the LLM.
//!
//! **Memory budget.** Beside the idle timeout (`sessions.idle_secs`), at most `max_live`
//! sessions stay in memory: over it, the least recently routed ones are asked whether they are
//! idle (the same `IdleCheck` the idle timer sends: no running turn, nothing queued, nothing
//! routed since) and leave memory if so; a sweep repeats every second while over budget. After
//! evictions the freed heap is handed back to the OS ([`trim`]).

mod trim;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::session::{SessionActor, SessionArgs, SessionHooks, SessionMsg, SessionRef};
use crate::store::{InboxEntry, StoreError};
use crate::types::SessionKey;

/// Handle to the bus.
pub type BusRef = ActorRef<BusMsg>;

/// The narrow handle of those who route journaled inbound messages (ingress, the subagent
/// supervisor): they can hand the bus an entry, nothing else.
#[derive(Clone)]
pub struct Inbox(BusRef);

impl Inbox {
    /// The inbox of `bus`.
    pub fn new(bus: BusRef) -> Self {
        Self(bus)
    }

    /// Route a journaled entry to its session. False when the bus is gone (the entry stays
    /// journaled and is replayed at the next start).
    pub fn route(&self, entry: InboxEntry) -> bool {
        self.0.cast(BusMsg::Inbound(Box::new(entry))).is_ok()
    }
}

/// Messages understood by [`BusActor`].
pub enum BusMsg {
    /// From ingress: a journaled user message. Spawns the session if needed. (Boxed: the
    /// entry is by far the largest message.)
    Inbound(Box<InboxEntry>),
    /// From a session's idle timer: evict it if nothing was routed to it since.
    SessionIdle {
        /// Session.
        key: SessionKey,
        /// Inbound count the session had seen.
        routed: u64,
    },
    /// From the bus's own timer while over the memory budget or after evictions: ask the
    /// least recently used sessions to leave, hand freed memory back to the OS.
    Sweep,
    /// Live sessions (for status, drain and shutdown).
    Sessions {
        /// Answer.
        reply: RpcReplyPort<Vec<(SessionKey, SessionRef)>>,
    },
    /// Clear a session (live or stored). Replies whether anything was stored.
    Clear {
        /// Session.
        key: SessionKey,
        /// Answer.
        reply: RpcReplyPort<Result<bool, ClearError>>,
    },
}

/// Why a session could not be cleared.
#[derive(Debug, thiserror::Error)]
pub enum ClearError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The live session did not answer.
    #[error("the session did not answer: {0}")]
    Session(String),
}

/// Arguments of the bus.
pub struct BusArgs {
    /// Every agent's turn dependencies (a session gets its agent's).
    pub agents: crate::turn::Agents,
    /// The store (`Clear` of a session not in memory).
    pub store: crate::store::Store,
    /// What sessions use beside their turns (outbox, approvals, subagent tree).
    pub hooks: SessionHooks,
    /// Tracks turn tasks.
    pub tasks: TaskTracker,
    /// Parent of turn cancellation.
    pub shutdown: CancellationToken,
    /// Session idle time.
    pub idle: Duration,
    /// Session queue bound.
    pub max_queue: usize,
    /// Most sessions in memory (`sessions.max_in_memory`); idle ones over it are evicted.
    pub max_live: usize,
}

/// Time between two sweeps while over the memory budget (and after evictions, before the
/// heap is trimmed): evictions are batched, and a trim runs at most once a second.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

struct Live {
    actor: SessionRef,
    routed: u64,
    /// When a message was last routed to it (least recently used leave first).
    last_used: Instant,
}

/// State of the bus.
pub struct BusState {
    args: BusArgs,
    sessions: HashMap<SessionKey, Live>,
    by_id: HashMap<ActorId, SessionKey>,
    /// A sweep is scheduled.
    sweep_armed: bool,
    /// Sessions left memory since the last trim.
    evicted: bool,
}

/// The bus actor.
pub struct BusActor;

#[ractor::async_trait]
impl Actor for BusActor {
    type Msg = BusMsg;
    type State = BusState;
    type Arguments = BusArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<BusMsg>,
        args: BusArgs,
    ) -> Result<BusState, ActorProcessingErr> {
        Ok(BusState {
            args,
            sessions: HashMap::new(),
            by_id: HashMap::new(),
            sweep_armed: false,
            evicted: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<BusMsg>,
        msg: BusMsg,
        state: &mut BusState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            BusMsg::Inbound(entry) => route_inbound(&myself, state, *entry).await,
            BusMsg::SessionIdle { key, routed } => {
                if state.sessions.get(&key).is_some_and(|l| l.routed == routed) {
                    if let Some(live) = state.sessions.remove(&key) {
                        state.by_id.remove(&live.actor.get_id());
                        live.actor.stop(Some("idle".into()));
                        tracing::debug!(session = %key, "idle session left memory");
                        state.evicted = true;
                        arm_sweep(&myself, state);
                    }
                }
            }
            BusMsg::Sweep => {
                state.sweep_armed = false;
                if state.evicted {
                    state.evicted = false;
                    trim::release_free_memory();
                }
                if ask_lru_to_leave(state) {
                    arm_sweep(&myself, state);
                }
            }
            BusMsg::Sessions { reply } => {
                let v = state
                    .sessions
                    .iter()
                    .map(|(k, l)| (k.clone(), l.actor.clone()))
                    .collect();
                let _ = reply.send(v);
            }
            BusMsg::Clear { key, reply } => match state.sessions.get(&key) {
                Some(live) => {
                    // The session clears itself once its running turn is done.
                    let actor = live.actor.clone();
                    tokio::spawn(async move {
                        let r = ractor::call_t!(actor, |reply| SessionMsg::Reset { reply }, 30_000)
                            .map_err(|e| ClearError::Session(e.to_string()));
                        let _ = reply.send(r);
                    });
                }
                None => {
                    let _ = reply.send(
                        state
                            .args
                            .store
                            .clear_session(&key)
                            .map_err(ClearError::from),
                    );
                }
            },
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<BusMsg>,
        evt: SupervisionEvent,
        state: &mut BusState,
    ) -> Result<(), ActorProcessingErr> {
        match evt {
            SupervisionEvent::ActorFailed(cell, err) => {
                // A panicking session is dropped from memory; its next message respawns it
                // from the store. Other sessions are untouched.
                if let Some(key) = state.by_id.remove(&cell.get_id()) {
                    state.sessions.remove(&key);
                    tracing::error!(session = %key, error = %err, "session actor failed; it restarts on its next message");
                }
            }
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                if let Some(key) = state.by_id.remove(&cell.get_id()) {
                    state.sessions.remove(&key);
                }
            }
            SupervisionEvent::ActorStarted(_) | SupervisionEvent::ProcessGroupChanged(_) => {}
        }
        Ok(())
    }
}

/// Schedule a [`BusMsg::Sweep`] unless one is.
fn arm_sweep(myself: &ActorRef<BusMsg>, state: &mut BusState) {
    if !state.sweep_armed {
        state.sweep_armed = true;
        myself.send_after(SWEEP_EVERY, || BusMsg::Sweep);
    }
}

/// Over the budget: ask the least recently used sessions, as many as are over, to leave if
/// idle (they answer with [`BusMsg::SessionIdle`]; busy ones ignore it). True while over.
fn ask_lru_to_leave(state: &BusState) -> bool {
    let over = state.sessions.len().saturating_sub(state.args.max_live);
    if over == 0 {
        return false;
    }
    let mut by_age: Vec<(&Instant, &Live)> =
        state.sessions.values().map(|l| (&l.last_used, l)).collect();
    if over < by_age.len() {
        by_age.select_nth_unstable_by_key(over, |(t, _)| **t);
        by_age.truncate(over);
    }
    for (_, live) in by_age {
        let _ = live.actor.cast(SessionMsg::IdleCheck {
            routed: live.routed,
        });
    }
    true
}

async fn route_inbound(myself: &ActorRef<BusMsg>, state: &mut BusState, entry: InboxEntry) {
    let key = entry.session.clone();
    if let Some(live) = state.sessions.get_mut(&key) {
        live.routed += 1;
        live.last_used = Instant::now();
        if let Err(e) = live.actor.cast(SessionMsg::Inbound(entry)) {
            tracing::error!(session = %key, error = %e, "session unreachable; message stays journaled");
        }
        return;
    }
    let bus = myself.clone();
    let args = SessionArgs {
        key: key.clone(),
        deps: state.args.agents.for_key(&key).clone(),
        hooks: state.args.hooks.clone(),
        on_idle: Arc::new(move |key, routed| {
            let _ = bus.cast(BusMsg::SessionIdle { key, routed });
        }),
        tasks: state.args.tasks.clone(),
        shutdown: state.args.shutdown.clone(),
        idle: state.args.idle,
        max_queue: state.args.max_queue,
    };
    match Actor::spawn_linked(None, SessionActor, args, myself.get_cell()).await {
        Ok((actor, _)) => {
            state.by_id.insert(actor.get_id(), key.clone());
            if let Err(e) = actor.cast(SessionMsg::Inbound(entry)) {
                tracing::error!(session = %key, error = %e, "new session unreachable");
            }
            state.sessions.insert(
                key,
                Live {
                    actor,
                    routed: 1,
                    last_used: Instant::now(),
                },
            );
            if state.sessions.len() > state.args.max_live {
                arm_sweep(myself, state);
            }
        }
        Err(e) => {
            tracing::error!(session = %key, error = %e, "could not start session; message stays journaled");
        }
    }
}
