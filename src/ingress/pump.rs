//! The inbound side of one channel: the adapter's `listen` loop (restarted with backoff) and the
//! ingress pump (check access, derive the session, refuse oversized messages, journal,
//! acknowledge, route).

use std::sync::Arc;
use std::time::Duration;

use clawft_channel_core::backoff::Backoff;
use clawft_channel_core::{Ack, Channel, InboundDelivery, InboundEvent, OutboundMessage};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::access::{Access, Verdict};
use crate::bus::Inbox;
use crate::egress::Outbox;
use crate::store::{JournalOutcome, Store};

/// Longest wait between two restarts of a failing `listen`.
const MAX_LISTEN_BACKOFF: Duration = Duration::from_secs(60);

/// What the inbound side of a channel needs.
pub struct IngressArgs {
    /// The adapter.
    pub channel: Arc<dyn Channel>,
    /// The store (journal, access and pairing).
    pub store: Store,
    /// Where journaled messages are routed.
    pub inbox: Inbox,
    /// Where refusals (pairing codes) go.
    pub outbox: Outbox,
    /// Who may talk on this channel.
    pub access: Arc<Access>,
    /// Fires to stop accepting new messages (first step of shutdown).
    pub intake: CancellationToken,
    /// Fires once recovery is done: inbound messages wait until then, so replayed ones come
    /// first.
    pub open: CancellationToken,
    /// Fires to stop the adapter.
    pub stop: CancellationToken,
    /// `channels.max_inbound_bytes`: longer messages are refused before they are journaled.
    pub max_inbound_bytes: usize,
    /// Cluster mode: accepted messages are journaled in the cluster (the partition's owner
    /// processes them), not in the local store.
    pub cluster: Option<crate::cluster::Cluster>,
}

/// Start the listener and the pump of a channel on `tasks`.
pub fn spawn(args: IngressArgs, tasks: &TaskTracker) {
    let id = args.channel.id().to_string();
    let (tx, rx) = mpsc::channel(64);
    tasks.spawn(
        listen_loop(args.channel.clone(), tx, args.stop.clone())
            .instrument(tracing::info_span!("listen", channel = %id)),
    );
    tasks.spawn(pump(rx, args).instrument(tracing::info_span!("ingress", channel = %id)));
}

async fn listen_loop(
    channel: Arc<dyn Channel>,
    tx: mpsc::Sender<InboundDelivery>,
    stop: CancellationToken,
) {
    let mut backoff = Backoff::new(Duration::from_secs(1), MAX_LISTEN_BACKOFF);
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
        let delay = backoff.next_delay();
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
    }
}

/// Refuse `event`, longer than `limit` bytes, before it is journaled (so it never reaches a
/// transcript, where it would be resent with every later request of the session and make the
/// provider refuse them all), and tell the sender in the same chat.
fn refuse_oversized(outbox: &Outbox, event: &InboundEvent, limit: usize) -> Ack {
    let bytes = event.content.len();
    tracing::info!(
        bytes,
        limit,
        "message over channels.max_inbound_bytes refused"
    );
    let msg = OutboundMessage::proactive(
        event.channel.clone(),
        event.chat.clone(),
        event.thread.clone(),
        clawft_channel_core::oversized_notice(bytes, limit),
    );
    if let Err(e) = outbox.send(msg) {
        tracing::error!(error = %e, "could not queue the size notice");
    }
    Ack::Rejected(format!(
        "message of {bytes} bytes is over the limit of {limit} bytes (channels.max_inbound_bytes)"
    ))
}

/// Refuse `event` from a sender who is not allowed, telling them (once) how to pair.
fn refuse_sender(outbox: &Outbox, event: &InboundEvent, reply: Option<String>) -> Ack {
    tracing::info!(sender = %event.sender, "message from a sender who is not allowed");
    if let Some(text) = reply {
        let msg = OutboundMessage::proactive(
            event.channel.clone(),
            event.chat.clone(),
            event.thread.clone(),
            text,
        );
        if let Err(e) = outbox.send(msg) {
            tracing::error!(error = %e, "could not queue the pairing reply");
        }
    }
    Ack::Rejected(format!(
        "sender {} is not allowed on channel {}",
        event.sender, event.channel
    ))
}

async fn pump(mut rx: mpsc::Receiver<InboundDelivery>, args: IngressArgs) {
    let IngressArgs {
        store,
        inbox,
        outbox,
        access,
        intake,
        open,
        max_inbound_bytes,
        cluster,
        ..
    } = args;
    open.cancelled().await;
    while let Some(first) = rx.recv().await {
        // Journal every delivery already waiting, then one flush (shared through the store's
        // group commit) makes them all durable before any is acknowledged or routed.
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(d) => batch.push(d),
                Err(_) => break,
            }
        }
        let mut decided = Vec::with_capacity(batch.len());
        for InboundDelivery { event, ack } in batch {
            // Inside the pump's `ingress{channel}` span: the channel is not repeated.
            let span = tracing::info_span!("inbound", event_id = %event.event_id);
            let _g = span.enter();
            let answer = if intake.is_cancelled() {
                Decided::Done(Ack::Rejected(
                    "the gateway is shutting down; retry shortly".into(),
                ))
            } else {
                decide(
                    &store,
                    &access,
                    &outbox,
                    &event,
                    max_inbound_bytes,
                    cluster.is_some(),
                )
            };
            decided.push((span.clone(), answer, ack));
        }
        #[cfg(feature = "cluster")]
        if let Some(c) = &cluster {
            publish_all(c, &mut decided).await;
        }
        let journaled = decided
            .iter()
            .any(|(_, d, _)| matches!(d, Decided::New(_) | Decided::Duplicate));
        let flushed = if journaled {
            store.flush_async().await.map_err(|e| {
                tracing::error!(error = %e, "could not journal inbound messages");
                cannot_store(&e)
            })
        } else {
            Ok(())
        };
        for (span, d, ack) in decided {
            let _g = span.enter();
            let answer = match (d, &flushed) {
                (Decided::Done(a), _) => a,
                // Not published (a build without cluster support never gets here).
                (Decided::Publish(..), _) => {
                    Ack::Unavailable("the gateway cannot store messages right now".into())
                }
                (_, Err(e)) => Ack::Unavailable(e.clone()),
                (Decided::Duplicate, Ok(())) => {
                    tracing::info!("duplicate event ignored");
                    Ack::Duplicate
                }
                (Decided::New(entry), Ok(())) => {
                    if !inbox.route(*entry) {
                        tracing::error!("bus gone; message stays journaled");
                    }
                    Ack::Accepted
                }
            };
            if let Some(ack) = ack {
                let _ = ack.send(answer);
            }
        }
    }
}

/// Most deliveries journaled under one flush.
const MAX_BATCH: usize = 64;

/// What became of one delivery before the batch's flush.
enum Decided {
    /// Answered already (refused, failed).
    Done(Ack),
    /// Seen before; acknowledged as a duplicate once the batch is durable.
    Duplicate,
    /// Journaled; routed and acknowledged once the batch is durable.
    New(Box<crate::store::InboxEntry>),
    /// Accepted in cluster mode: to publish to the cluster's inbound journal (never made in a
    /// build without cluster support).
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    Publish(Box<(crate::types::SessionKey, InboundEvent)>),
}

/// Cluster mode: publish the accepted messages of a batch (all at once) and answer each with
/// what JetStream said: accepted once it stored the message, a duplicate when it had it.
#[cfg(feature = "cluster")]
async fn publish_all(
    cluster: &crate::cluster::Cluster,
    decided: &mut [(
        tracing::Span,
        Decided,
        Option<tokio::sync::oneshot::Sender<Ack>>,
    )],
) {
    use crate::cluster::inbound::{publish, Published};
    let events: Vec<_> = decided
        .iter()
        .filter_map(|(_, d, _)| match d {
            Decided::Publish(b) => Some((b.0.clone(), b.1.clone())),
            _ => None,
        })
        .collect();
    if events.is_empty() {
        return;
    }
    let mut results = publish(cluster, events).await.into_iter();
    for (span, d, _) in decided.iter_mut() {
        if !matches!(d, Decided::Publish(_)) {
            continue;
        }
        let _g = span.enter();
        match results.next() {
            None => {}
            Some(Ok(Published::New)) => {
                *d = Decided::Done(Ack::Accepted);
            }
            Some(Ok(Published::Duplicate)) => {
                tracing::info!("duplicate event ignored (the cluster has it)");
                *d = Decided::Done(Ack::Duplicate);
            }
            Some(Err(e)) => {
                tracing::error!(error = %e, "could not journal an inbound message in the cluster");
                *d = Decided::Done(Ack::Unavailable(
                    "The gateway cannot store messages right now; nothing was stored. Try again later.".into(),
                ));
            }
        }
    }
}

/// What the sender of a message the store could not take is told: a sentence, never the
/// store's own error (that is in the log).
fn cannot_store(e: &crate::store::StoreError) -> String {
    match e.kind() {
        "no_space" => "The gateway's disk is full, so it cannot take messages right now; nothing was stored. Try again later.".into(),
        _ => "The gateway cannot store messages right now; nothing was stored. Try again later.".into(),
    }
}

fn decide(
    store: &Store,
    access: &Access,
    outbox: &Outbox,
    event: &InboundEvent,
    max_inbound_bytes: usize,
    clustered: bool,
) -> Decided {
    match (
        access.check(store, event, clawft_channel_core::now_ms()),
        access.session_key(event),
    ) {
        (Err(e), _) => {
            tracing::error!(error = %e, "access check failed");
            Decided::Done(Ack::Rejected(format!("could not check access: {e}")))
        }
        (Ok(Verdict::Denied { reply }), _) => Decided::Done(refuse_sender(outbox, event, reply)),
        (Ok(Verdict::Allowed), Err(e)) => Decided::Done(Ack::Rejected(e.to_string())),
        // The gateway's own event ids (scheduled runs, heartbeats, subagent results): a client
        // choosing one could pre-empt a scheduled run or pass for the gateway.
        (Ok(Verdict::Allowed), Ok(_))
            if crate::types::session_key::is_reserved_event_id(event.event_id.as_str()) =>
        {
            tracing::info!("event id in the gateway's own namespace refused");
            Decided::Done(Ack::Rejected(format!(
                "event ids starting with {} are reserved for the gateway",
                crate::types::session_key::GATEWAY_EVENT_PREFIXES.join(", ")
            )))
        }
        // Only the gateway makes events of another origin; an adapter never does.
        (Ok(Verdict::Allowed), Ok(_)) if !event.origin.is_user() => {
            tracing::warn!(origin = ?event.origin, "a channel delivered a non-user event; refused");
            Decided::Done(Ack::Rejected(
                "only the gateway makes scheduled, subagent, session or webhook events".into(),
            ))
        }
        // After the access check: strangers get no notice, only refusal.
        (Ok(Verdict::Allowed), Ok(_)) if event.content.len() > max_inbound_bytes => {
            Decided::Done(refuse_oversized(outbox, event, max_inbound_bytes))
        }
        (Ok(Verdict::Allowed), Ok(key)) if clustered => {
            Decided::Publish(Box::new((key, event.clone())))
        }
        (Ok(Verdict::Allowed), Ok(key)) => match store.journal_inbound_unflushed(event, &key) {
            Ok(JournalOutcome::Duplicate) => Decided::Duplicate,
            Ok(JournalOutcome::New(entry)) => Decided::New(Box::new(entry)),
            Err(e) => {
                tracing::error!(error = %e, "could not journal inbound message");
                Decided::Done(Ack::Unavailable(cannot_store(&e)))
            }
        },
    }
}
