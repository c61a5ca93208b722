//! ⑧ The way out. [`ChannelActor`]: one per channel, it runs the outbox worker
//! ([`scheduler`]: in order per chat, concurrent and fair across chats, retry retryable errors
//! honouring `retry_after` for that chat only, remove from the store durably once delivered),
//! the typing indicator and the adapter's state. [`Outbox`]: the handle every sender uses (persist,
//! then route through the live [`ChannelTable`]).
//!
//! The actor's `handle` only enqueues; all I/O runs in its tasks. The inbound side of a channel
//! (its `listen` loop and the ingress pump) lives in [`crate::ingress`].

pub mod outbox;
pub mod scheduler;
mod typing;

pub use outbox::{ChannelEntry, ChannelTable, Outbox};
pub use scheduler::DEFAULT_MAX_CHATS_IN_FLIGHT;

use std::sync::Arc;
use std::time::Duration;

use clawft_channel_core::{Channel, OutboundMessage};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::store::Store;
use scheduler::{outbox_worker, Work};

/// Handle to a channel actor.
pub type ChannelRef = ActorRef<ChannelMsg>;

/// Messages understood by [`ChannelActor`].
pub enum ChannelMsg {
    /// From the [`Outbox`]: send this message (durable ones are already in the store).
    Send(OutboundMessage),
    /// Show the typing indicator in a chat (best effort, never queued behind sends).
    Typing {
        /// Chat.
        chat: clawft_channel_core::ChatId,
        /// Thread.
        thread: Option<clawft_channel_core::ThreadId>,
    },
    /// The adapter's one-line state, for `weft status`.
    State {
        /// Answer.
        reply: RpcReplyPort<String>,
    },
    /// From the daemon at shutdown: reply once everything queued before it was attempted.
    Flush {
        /// Answered when the queue ahead is done.
        reply: RpcReplyPort<()>,
    },
}

/// Arguments of a channel actor.
pub struct ChannelArgs {
    /// The adapter.
    pub channel: Arc<dyn Channel>,
    /// The store (outbox entries are removed once delivered).
    pub store: Store,
    /// Fires to stop the outbox worker (after the outbox drained).
    pub stop: CancellationToken,
    /// Where the actor's tasks are tracked.
    pub tasks: TaskTracker,
    /// How many chats may be sending at the same time
    /// ([`DEFAULT_MAX_CHATS_IN_FLIGHT`]; at least 1).
    pub max_chats_in_flight: usize,
}

/// State of a channel actor.
pub struct ChannelState {
    outbox: mpsc::UnboundedSender<Work>,
    channel: Arc<dyn Channel>,
    typing_busy: Arc<std::sync::atomic::AtomicBool>,
    /// Chats whose typing indicator is failing (each failure streak is logged once).
    typing_failing: typing::Failing,
}

/// The channel actor.
pub struct ChannelActor;

#[ractor::async_trait]
impl Actor for ChannelActor {
    type Msg = ChannelMsg;
    type State = ChannelState;
    type Arguments = ChannelArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<ChannelMsg>,
        args: ChannelArgs,
    ) -> Result<ChannelState, ActorProcessingErr> {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = args.channel.id().to_string();
        args.tasks.spawn(
            outbox_worker(
                args.channel.clone(),
                args.store.clone(),
                rx,
                args.stop.clone(),
                args.max_chats_in_flight,
            )
            .instrument(tracing::info_span!("outbox", channel = %id)),
        );
        Ok(ChannelState {
            outbox: tx,
            channel: args.channel.clone(),
            typing_busy: Arc::default(),
            typing_failing: typing::Failing::default(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<ChannelMsg>,
        msg: ChannelMsg,
        state: &mut ChannelState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ChannelMsg::Send(m) => {
                let _ = state.outbox.send(Work::Send(Box::new(m)));
            }
            ChannelMsg::Typing { chat, thread } => {
                use std::sync::atomic::Ordering;
                // One typing call at a time per channel; a slow platform skips ticks.
                if !state.typing_busy.swap(true, Ordering::AcqRel) {
                    let ch = state.channel.clone();
                    let busy = state.typing_busy.clone();
                    let failing = state.typing_failing.clone();
                    tokio::spawn(async move {
                        let r = tokio::time::timeout(
                            Duration::from_secs(5),
                            ch.typing(&chat, thread.as_ref()),
                        )
                        .await;
                        failing.record(ch.id(), &chat, r);
                        busy.store(false, Ordering::Release);
                    });
                }
            }
            ChannelMsg::State { reply } => {
                let _ = reply.send(state.channel.state());
            }
            ChannelMsg::Flush { reply } => {
                let (tx, rx) = oneshot::channel();
                if state.outbox.send(Work::Flush(tx)).is_ok() {
                    tokio::spawn(async move {
                        let _ = rx.await;
                        let _ = reply.send(());
                    });
                } else {
                    let _ = reply.send(());
                }
            }
        }
        Ok(())
    }
}
