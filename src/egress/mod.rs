//! ⑧ The [`ChannelActor`]: one per channel. It runs the adapter's `listen` (restarted with
//! backoff), the ingress pump (sanitise, derive the session, journal, acknowledge, route), and
//! the outbox worker (send in order, retry retryable errors honouring `retry_after`, remove from
//! the store once delivered).
//!
//! The actor's `handle` only enqueues; all I/O runs in its tasks.

use std::sync::Arc;
use std::time::Duration;

use clawft_channel_core::{
    Ack, Channel, ChannelError, InboundDelivery, InboundEvent, OutboundMessage,
};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::bus::{BusMsg, BusRef};
use crate::ingress::access::{Access, Verdict};
use crate::store::{JournalOutcome, Store};
use crate::types::sanitize_content;

/// Handle to a channel actor.
pub type ChannelRef = ActorRef<ChannelMsg>;

/// Longest wait between two send attempts of one message.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(60);
/// First wait after a failed send.
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(500);
/// Longest wait between two restarts of a failing `listen`.
const MAX_LISTEN_BACKOFF: Duration = Duration::from_secs(60);

/// Messages understood by [`ChannelActor`].
pub enum ChannelMsg {
    /// From the bus: send this message (journaled ones are already in the outbox).
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
    /// The store (journal and outbox).
    pub store: Store,
    /// The bus to route inbound messages to.
    pub bus: BusRef,
    /// Fires to stop accepting new messages (first step of shutdown).
    pub intake: CancellationToken,
    /// Fires once recovery is done: inbound messages wait until then, so replayed ones come
    /// first.
    pub open: CancellationToken,
    /// Fires to stop the adapter and the outbox (after the outbox drained).
    pub stop: CancellationToken,
    /// Where the actor's tasks are tracked.
    pub tasks: TaskTracker,
    /// Who may talk on this channel.
    pub access: Arc<Access>,
}

enum Work {
    Send(OutboundMessage),
    Flush(oneshot::Sender<()>),
}

/// State of a channel actor.
pub struct ChannelState {
    outbox: mpsc::UnboundedSender<Work>,
    channel: Arc<dyn Channel>,
    typing_busy: Arc<std::sync::atomic::AtomicBool>,
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
            )
            .instrument(tracing::info_span!("outbox", channel = %id)),
        );
        let (in_tx, in_rx) = mpsc::channel(64);
        args.tasks.spawn(
            ingress_pump(
                in_rx,
                args.store.clone(),
                args.bus.clone(),
                args.intake.clone(),
                args.open.clone(),
                args.access.clone(),
            )
            .instrument(tracing::info_span!("ingress", channel = %id)),
        );
        args.tasks.spawn(
            listen_loop(args.channel.clone(), in_tx, args.stop.clone())
                .instrument(tracing::info_span!("listen", channel = %id)),
        );
        Ok(ChannelState {
            outbox: tx,
            channel: args.channel.clone(),
            typing_busy: Arc::default(),
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
                let _ = state.outbox.send(Work::Send(m));
            }
            ChannelMsg::Typing { chat, thread } => {
                use std::sync::atomic::Ordering;
                // One typing call at a time per channel; a slow platform skips ticks.
                if !state.typing_busy.swap(true, Ordering::AcqRel) {
                    let ch = state.channel.clone();
                    let busy = state.typing_busy.clone();
                    tokio::spawn(async move {
                        let r = tokio::time::timeout(
                            Duration::from_secs(5),
                            ch.typing(&chat, thread.as_ref()),
                        )
                        .await;
                        if let Ok(Err(e)) = r {
                            tracing::debug!(error = %e, "typing indicator failed");
                        }
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

async fn listen_loop(
    channel: Arc<dyn Channel>,
    tx: mpsc::Sender<InboundDelivery>,
    stop: CancellationToken,
) {
    let mut backoff = Duration::from_secs(1);
    loop {
        let r = channel.listen(tx.clone(), stop.clone()).await;
        if stop.is_cancelled() {
            return;
        }
        crate::metrics::inc(
            "clawft_channel_restarts_total",
            &[("channel", channel.id().as_str())],
            1,
        );
        match r {
            Ok(()) => tracing::warn!("channel listener returned; restarting"),
            Err(e) => {
                tracing::error!(error = %e, kind = e.kind(), "channel listener failed; restarting")
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_LISTEN_BACKOFF);
    }
}

/// Refuse `event` from a sender who is not allowed, telling them (once) how to pair.
fn refuse_sender(store: &Store, bus: &BusRef, event: &InboundEvent, reply: Option<String>) -> Ack {
    tracing::info!(sender = %event.sender, "message from a sender who is not allowed");
    if let Some(text) = reply {
        let msg = OutboundMessage::proactive(
            event.channel.clone(),
            event.chat.clone(),
            event.thread.clone(),
            text,
        );
        match store.enqueue_outbound(&msg) {
            Ok(()) => {
                let _ = bus.cast(BusMsg::Outbound(msg));
            }
            Err(e) => tracing::error!(error = %e, "could not queue the pairing reply"),
        }
    }
    Ack::Rejected(format!(
        "sender {} is not allowed on channel {}",
        event.sender, event.channel
    ))
}

async fn ingress_pump(
    mut rx: mpsc::Receiver<InboundDelivery>,
    store: Store,
    bus: BusRef,
    intake: CancellationToken,
    open: CancellationToken,
    access: Arc<Access>,
) {
    open.cancelled().await;
    while let Some(InboundDelivery { mut event, ack }) = rx.recv().await {
        let span =
            tracing::info_span!("inbound", channel = %event.channel, event_id = %event.event_id);
        let _g = span.enter();
        let answer = if intake.is_cancelled() {
            Ack::Rejected("the gateway is shutting down; retry shortly".into())
        } else {
            event.content = sanitize_content(&event.content);
            match (
                access.check(&store, &event, clawft_channel_core::now_ms()),
                access.session_key(&event),
            ) {
                (Err(e), _) => {
                    tracing::error!(error = %e, "access check failed");
                    Ack::Rejected(format!("could not check access: {e}"))
                }
                (Ok(Verdict::Denied { reply }), _) => refuse_sender(&store, &bus, &event, reply),
                (Ok(Verdict::Allowed), Err(e)) => Ack::Rejected(e.to_string()),
                (Ok(Verdict::Allowed), Ok(key)) => match store.journal_inbound(&event, &key) {
                    Ok(JournalOutcome::Duplicate) => {
                        tracing::info!("duplicate event ignored");
                        Ack::Duplicate
                    }
                    Ok(JournalOutcome::New(entry)) => {
                        if bus.cast(BusMsg::Inbound(entry)).is_err() {
                            tracing::error!("bus gone; message stays journaled");
                        }
                        Ack::Accepted
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "could not journal inbound message");
                        Ack::Rejected(format!("could not store the message: {e}"))
                    }
                },
            }
        };
        if let Some(ack) = ack {
            let _ = ack.send(answer);
        }
    }
}

async fn outbox_worker(
    channel: Arc<dyn Channel>,
    store: Store,
    mut rx: mpsc::UnboundedReceiver<Work>,
    stop: CancellationToken,
) {
    loop {
        let work = tokio::select! {
            () = stop.cancelled() => return,
            w = rx.recv() => match w { Some(w) => w, None => return },
        };
        match work {
            Work::Flush(done) => {
                let _ = done.send(());
            }
            Work::Send(msg) => send_one(channel.as_ref(), &store, &msg, &stop).await,
        }
    }
}

async fn send_one(
    channel: &dyn Channel,
    store: &Store,
    msg: &OutboundMessage,
    stop: &CancellationToken,
) {
    let durable = msg.kind.is_durable();
    let mut delay = FIRST_RETRY_DELAY;
    let mut attempt: u32 = 0;
    loop {
        attempt += 1;
        let span = tracing::info_span!("send", channel = %msg.channel, chat = %msg.chat, attempt);
        let r = channel.send(msg).instrument(span).await;
        match r {
            Ok(_) => break,
            Err(ChannelError::Gone(why)) => {
                tracing::debug!(why, "recipient gone; message dropped");
                break;
            }
            Err(e) if durable && e.is_retryable() => {
                let wait = e.retry_after().unwrap_or(delay).min(MAX_RETRY_DELAY);
                tracing::warn!(error = %e, attempt, wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX), "send failed; retrying");
                tokio::select! {
                    () = stop.cancelled() => return, // stays in the outbox for the next start
                    () = tokio::time::sleep(wait) => {}
                }
                delay = (delay * 2).min(MAX_RETRY_DELAY);
            }
            Err(e) => {
                if durable {
                    tracing::error!(error = %e, kind = e.kind(), "send failed permanently; message dropped");
                }
                break;
            }
        }
    }
    if durable {
        if let Err(e) = store.outbound_done(&msg.id) {
            tracing::error!(error = %e, "could not clear the outbox entry");
        }
    }
}
