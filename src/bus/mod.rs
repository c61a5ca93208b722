//! ② The [`BusActor`] routes journaled inbound messages to one session actor per
//! [`SessionKey`] (spawned on first message, supervised) and replies to channel actors.
//!
//! It holds no conversation state and never awaits the LLM.

use std::collections::HashMap;
use std::time::Duration;

use clawft_channel_core::{ChannelId, OutboundMessage};
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::egress::{ChannelMsg, ChannelRef};
use crate::session::{SessionActor, SessionArgs, SessionMsg, SessionRef};
use crate::store::InboxEntry;
use crate::turn::TurnDeps;
use crate::types::SessionKey;

/// Handle to the bus.
pub type BusRef = ActorRef<BusMsg>;

/// Messages understood by [`BusActor`].
pub enum BusMsg {
    /// From ingress: a journaled user message. Spawns the session if needed.
    Inbound(InboxEntry),
    /// From sessions (and the `message` tool): send on the message's channel.
    Outbound(OutboundMessage),
    /// From a session while a turn runs: show the typing indicator (best effort).
    Typing {
        /// Channel.
        channel: ChannelId,
        /// Chat.
        chat: clawft_channel_core::ChatId,
        /// Thread.
        thread: Option<clawft_channel_core::ThreadId>,
    },
    /// From the daemon: a channel actor to route replies to, and whether it streams.
    RegisterChannel {
        /// Channel id.
        id: ChannelId,
        /// Its actor.
        actor: ChannelRef,
        /// Whether it shows deltas/progress.
        streaming: bool,
    },
    /// From the daemon on a reload: forget a channel that was stopped (its replies stay in the
    /// outbox until it runs again).
    UnregisterChannel {
        /// Channel id.
        id: ChannelId,
    },
    /// From a session's idle timer: evict it if nothing was routed to it since.
    SessionIdle {
        /// Session.
        key: SessionKey,
        /// Inbound count the session had seen.
        routed: u64,
    },
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
        reply: RpcReplyPort<Result<bool, String>>,
    },
}

/// Arguments of the bus.
pub struct BusArgs {
    /// Shared by every session.
    pub deps: TurnDeps,
    /// Tracks turn tasks.
    pub tasks: TaskTracker,
    /// Parent of turn cancellation.
    pub shutdown: CancellationToken,
    /// Session idle time.
    pub idle: Duration,
    /// Session queue bound.
    pub max_queue: usize,
    /// Stream from the provider when the channel can show it.
    pub stream: bool,
}

struct Live {
    actor: SessionRef,
    routed: u64,
}

/// State of the bus.
pub struct BusState {
    args: BusArgs,
    sessions: HashMap<SessionKey, Live>,
    by_id: HashMap<ActorId, SessionKey>,
    channels: HashMap<ChannelId, (ChannelRef, bool)>,
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
            channels: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<BusMsg>,
        msg: BusMsg,
        state: &mut BusState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            BusMsg::Inbound(entry) => route_inbound(&myself, state, entry).await,
            BusMsg::Outbound(out) => match state.channels.get(&out.channel) {
                Some((ch, _)) => {
                    if ch.cast(ChannelMsg::Send(out)).is_err() {
                        tracing::warn!("channel actor gone; reply stays in the outbox");
                    }
                }
                None => {
                    tracing::warn!(channel = %out.channel, "reply for an unknown channel; it stays in the outbox")
                }
            },
            BusMsg::Typing {
                channel,
                chat,
                thread,
            } => {
                if let Some((ch, _)) = state.channels.get(&channel) {
                    let _ = ch.cast(ChannelMsg::Typing { chat, thread });
                }
            }
            BusMsg::RegisterChannel {
                id,
                actor,
                streaming,
            } => {
                state.channels.insert(id, (actor, streaming));
            }
            BusMsg::UnregisterChannel { id } => {
                state.channels.remove(&id);
            }
            BusMsg::SessionIdle { key, routed } => {
                if state.sessions.get(&key).is_some_and(|l| l.routed == routed) {
                    if let Some(live) = state.sessions.remove(&key) {
                        state.by_id.remove(&live.actor.get_id());
                        live.actor.stop(Some("idle".into()));
                        tracing::debug!(session = %key, "idle session left memory");
                    }
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
                            .map_err(|e| e.to_string());
                        let _ = reply.send(r);
                    });
                }
                None => {
                    let _ = reply.send(
                        state
                            .args
                            .deps
                            .store
                            .clear_session(&key)
                            .map_err(|e| e.to_string()),
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

async fn route_inbound(myself: &ActorRef<BusMsg>, state: &mut BusState, entry: InboxEntry) {
    let key = entry.session.clone();
    if let Some(live) = state.sessions.get_mut(&key) {
        live.routed += 1;
        if let Err(e) = live.actor.cast(SessionMsg::Inbound(entry)) {
            tracing::error!(session = %key, error = %e, "session unreachable; message stays journaled");
        }
        return;
    }
    let streaming = state
        .channels
        .get(&clawft_channel_core::ChannelId::new(key.channel()))
        .is_some_and(|(_, s)| *s);
    let args = SessionArgs {
        key: key.clone(),
        deps: state.args.deps.clone(),
        bus: myself.clone(),
        tasks: state.args.tasks.clone(),
        shutdown: state.args.shutdown.clone(),
        stream: streaming && state.args.stream,
        idle: state.args.idle,
        max_queue: state.args.max_queue,
    };
    match Actor::spawn_linked(None, SessionActor, args, myself.get_cell()).await {
        Ok((actor, _)) => {
            state.by_id.insert(actor.get_id(), key.clone());
            if let Err(e) = actor.cast(SessionMsg::Inbound(entry)) {
                tracing::error!(session = %key, error = %e, "new session unreachable");
            }
            state.sessions.insert(key, Live { actor, routed: 1 });
        }
        Err(e) => {
            tracing::error!(session = %key, error = %e, "could not start session; message stays journaled");
        }
    }
}
