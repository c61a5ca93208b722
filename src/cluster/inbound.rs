//! The inbound journal of the cluster (docs/cluster.md): the node that receives a chat message
//! publishes it to the JetStream stream `WEFT_IN` on the subject of its session's partition
//! (`weft.in.<n>`, deduplicated by channel + platform event id) and confirms it to the platform
//! only once JetStream has stored it; each partition is leased (`part.<n>`) and consumed in
//! order by its holder, which journals the message in its local store, routes it to the
//! session, and acknowledges it in JetStream only once the turn is finished and its reply
//! delivered. A message whose owner died before that is delivered again to the next owner.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, stream};
use clawft_channel_core::{InboundEvent, OutboundMessage};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::node::{Cluster, ClusterError};
use crate::store::{InboxEntry, InboxState, JournalOutcome, Store};
use crate::types::SessionKey;

/// The stream of the inbound journal.
pub const IN_STREAM: &str = "WEFT_IN";
/// How long JetStream remembers a message id to drop a second publication of it: longer than
/// any platform redelivers an unconfirmed update (Telegram keeps them 24 h).
pub const DEDUP_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// Messages of a partition handed to sessions and not yet acknowledged, at most.
const MAX_IN_FLIGHT: i64 = 256;
/// Acknowledgements of an answered message tried at most (then the next owner may answer it
/// again).
const MAX_ACK_TRIES: u32 = 400;
/// How often the owner looks for finished turns to acknowledge.
const ACK_EVERY: Duration = Duration::from_millis(25);

/// The partition of a session key (FNV-1a, stable across builds and machines).
pub fn partition_of(key: &str, partitions: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    u32::try_from(h % u64::from(partitions.max(1))).unwrap_or(0)
}

/// The subject of partition `p`.
pub fn subject(p: u32) -> String {
    format!("weft.in.{p}")
}

/// The lease key of partition `p`.
pub fn lease_key(p: u32) -> String {
    format!("part.{p}")
}

/// What is published: the accepted event and its session.
#[derive(Serialize, Deserialize)]
struct Envelope {
    session: SessionKey,
    event: InboundEvent,
}

/// Make the stream if missing: replicated on three servers when the cluster has them.
///
/// # Errors
/// JetStream refused or did not answer.
pub async fn ensure_stream(js: &jetstream::Context) -> Result<(), ClusterError> {
    if js.get_stream(IN_STREAM).await.is_ok() {
        return Ok(());
    }
    let mut last = String::new();
    for replicas in [3, 1] {
        match js
            .create_stream(stream::Config {
                name: IN_STREAM.into(),
                description: Some("weft inbound journal".into()),
                subjects: vec!["weft.in.>".into()],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                num_replicas: replicas,
                duplicate_window: DEDUP_WINDOW,
                ..Default::default()
            })
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) => last = e.to_string(),
        }
        if js.get_stream(IN_STREAM).await.is_ok() {
            return Ok(());
        }
    }
    Err(ClusterError::Nats(format!("stream {IN_STREAM}: {last}")))
}

/// What became of a publication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Published {
    /// Stored in the cluster.
    New,
    /// The cluster had it already (same channel and event id).
    Duplicate,
}

/// Publish accepted events (with their sessions) to their partitions, in this order, and
/// wait until JetStream has stored each (replicated): one answer per event.
pub async fn publish(
    cluster: &Cluster,
    events: Vec<(SessionKey, InboundEvent)>,
) -> Vec<Result<Published, String>> {
    let n = events.len();
    let Some(js) = cluster.jetstream() else {
        return vec![Err("the cluster is not reachable yet".to_string()); n];
    };
    let partitions = cluster.settings().partitions;
    let fut = async move {
        // Sent one after the other (so a chat's messages keep their order in the stream),
        // then the confirmations awaited together.
        let mut acks = Vec::with_capacity(events.len());
        for (session, event) in events {
            let p = partition_of(session.as_str(), partitions);
            let id = format!("{}:{}", event.channel, event.event_id);
            let body = match serde_json::to_vec(&Envelope { session, event }) {
                Ok(b) => b,
                Err(e) => {
                    acks.push(Err(e.to_string()));
                    continue;
                }
            };
            let sent = js
                .send_publish(
                    subject(p),
                    jetstream::message::PublishMessage::build()
                        .payload(body.into())
                        .message_id(id),
                )
                .await
                .map_err(|e| e.to_string());
            acks.push(sent);
        }
        futures::future::join_all(acks.into_iter().map(|a| async move {
            let ack = a?.await.map_err(|e| e.to_string())?;
            Ok(if ack.duplicate {
                Published::Duplicate
            } else {
                Published::New
            })
        }))
        .await
    };
    match tokio::time::timeout(Duration::from_secs(10), cluster.run_here(fut)).await {
        Ok(Some(r)) => r,
        Ok(None) => vec![Err("the cluster stopped".to_string()); n],
        Err(_) => vec![Err("JetStream did not confirm in time".to_string()); n],
    }
}

/// What the partition owners need.
#[derive(Clone)]
pub struct Consume {
    /// The local store (journal, transcripts, outbox: the cache of the partition's state).
    pub store: Store,
    /// Route a journaled entry to its session.
    pub route: Arc<dyn Fn(InboxEntry) -> bool + Send + Sync>,
    /// Fires to stop taking new messages (first step of shutdown).
    pub intake: CancellationToken,
    /// Fires when the turns are over (after the shutdown grace): stop acknowledging too.
    pub done: CancellationToken,
    /// The session log: replayed before consuming, written while consuming.
    pub log: Option<super::session_log::SessionLog>,
    /// Send a reply the session log holds undelivered (put in the store's outbox already).
    pub send: Arc<dyn Fn(OutboundMessage) + Send + Sync>,
}

/// How long a node handing a partition over waits for its turns under way to be answered
/// and acknowledged before it releases the lease (the next owner answers those still open).
const HANDOVER_WAIT: Duration = Duration::from_secs(10);

/// Hold and consume this node's share of the partitions ([`super::balance`]), on `tasks`.
pub fn spawn_partitions(cluster: &Cluster, args: &Consume, tasks: &TaskTracker) {
    let wanted = super::balance::start(cluster, args.done.clone());
    for p in 0..cluster.settings().partitions {
        let c = cluster.clone();
        let a = args.clone();
        let w = wanted.clone();
        tasks.spawn(async move { partition_loop(c, p, a, w).await });
    }
}

/// One message handed to a session and not yet acknowledged: its JetStream deliveries.
type Waiting = HashMap<(String, String), (Vec<jetstream::Message>, u32)>;

/// Why a partition's owner stops consuming it.
enum Stop {
    /// The node shuts down.
    Shutdown,
    /// The partition is another node's share now; the session log's writer, kept until the
    /// turns under way are recorded.
    Handover(Option<tokio_util::sync::DropGuard>),
}

async fn partition_loop(
    cluster: Cluster,
    p: u32,
    args: Consume,
    mut wanted: super::balance::Wanted,
) {
    let mut waiting = Waiting::new();
    loop {
        // Not this node's share: messages this node answered are still acknowledged, as soon
        // as NATS takes it, so the next owner does not answer them again.
        let go = loop {
            tokio::select! {
                w = super::balance::wanted(&mut wanted, p) => break w,
                () = args.intake.cancelled() => break false,
                () = tokio::time::sleep(ACK_EVERY), if !waiting.is_empty() => {
                    ack_finished(&args.store, args.log.as_ref(), &mut waiting).await;
                }
            }
        };
        if !go {
            break;
        }
        let hold = cluster.hold(&lease_key(p));
        let stop = own(&cluster, p, &args, &hold, &mut wanted, &mut waiting).await;
        match stop {
            Stop::Shutdown => {
                // The turns under way finish within the grace; acknowledge them while the
                // lease is still ours, so the next owner does not answer them again.
                drain(&args, &hold, &mut waiting, None).await;
                hold.release().await;
                break;
            }
            Stop::Handover(writer) => {
                let n = waiting.len();
                drain(&args, &hold, &mut waiting, Some(HANDOVER_WAIT)).await;
                drop(writer);
                tracing::info!(
                    partition = p,
                    in_flight = n,
                    left = waiting.len(),
                    "cluster: partition handed over to its new owner"
                );
                hold.release().await;
            }
        }
    }
}

/// Acknowledge the turns under way as they finish, while the lease is this node's: until none
/// is left, the turns are over (`done`), or `bound` has passed.
async fn drain(
    args: &Consume,
    hold: &super::node::LeaseHold,
    waiting: &mut Waiting,
    bound: Option<Duration>,
) {
    if hold.current().is_none() {
        return;
    }
    let deadline = bound.map(|b| tokio::time::Instant::now() + b);
    while !waiting.is_empty() {
        tokio::select! {
            () = tokio::time::sleep(ACK_EVERY) => {}
            () = args.done.cancelled() => break,
        }
        if hold.current().is_none() || deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            break;
        }
        ack_finished(&args.store, args.log.as_ref(), waiting).await;
    }
}

/// Take the lease of `p` and consume it while it is this node's and wanted here.
async fn own(
    cluster: &Cluster,
    p: u32,
    args: &Consume,
    hold: &super::node::LeaseHold,
    wanted: &mut super::balance::Wanted,
    waiting: &mut Waiting,
) -> Stop {
    let mut rx = hold.watch();
    // The session log's writer of the last consumer: it outlives a consumer stopped for a
    // handover, so the turns under way are still recorded (and then acknowledged).
    let mut writer = None;
    loop {
        let h = loop {
            tokio::select! {
                h = super::leased::held(&mut rx) => break h,
                () = args.intake.cancelled() => return Stop::Shutdown,
                () = super::balance::unwanted(wanted, p) => return Stop::Handover(None),
                () = tokio::time::sleep(ACK_EVERY), if !waiting.is_empty() => {
                    ack_finished(&args.store, args.log.as_ref(), waiting).await;
                }
            }
        };
        let Some(h) = h else { return Stop::Shutdown };
        tracing::info!(
            partition = p,
            token = h.token,
            "cluster: this node owns the partition"
        );
        let r = tokio::select! {
            r = consume(cluster, p, args, waiting, &mut writer) => Some(r),
            () = super::leased::lost(&mut rx, h.token) => None,
            () = super::balance::unwanted(wanted, p) => return Stop::Handover(writer.take()),
        };
        // Lost or failed: this writer stops (the next owner, or the next consumer here after
        // a replay, writes the partition's records).
        writer = None;
        match r {
            None => tracing::warn!(
                partition = p,
                "cluster: partition lease lost: stopped consuming"
            ),
            Some(Ok(())) => return Stop::Shutdown,
            Some(Err(e)) => {
                tracing::warn!(partition = p, error = %e, "cluster: partition consumer failed; trying again");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(500)) => {}
                    () = args.intake.cancelled() => return Stop::Shutdown,
                }
            }
        }
    }
}

/// Consume partition `p` from its oldest unacknowledged message until the intake closes.
async fn consume(
    cluster: &Cluster,
    p: u32,
    args: &Consume,
    waiting: &mut Waiting,
    writer_slot: &mut Option<tokio_util::sync::DropGuard>,
) -> Result<(), String> {
    let js = cluster
        .jetstream()
        .ok_or_else(|| "the cluster is not reachable yet".to_string())?;
    // The partition's sessions as the log has them, then its writer (fenced by the last
    // record); the replies recorded and never delivered are sent (once, from here).
    let fenced = CancellationToken::new();
    *writer_slot = match &args.log {
        Some(log) => {
            let started = std::time::Instant::now();
            let (last, replies) = super::session_log::replay(log, &js, &args.store, p)
                .await
                .map_err(|e| e.to_string())?;
            tracing::info!(
                partition = p,
                last,
                resent = replies.len(),
                ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                "cluster: session log replayed"
            );
            // Stopped when this consumer ends (lease lost, an error), after a handover's wait,
            // or at shutdown once the turns are over (their records are written while the
            // lease is ours).
            let stop = args.done.child_token();
            super::session_log::start_writer(
                log,
                cluster,
                js.clone(),
                p,
                last,
                stop.clone(),
                fenced.clone(),
            );
            for r in replies {
                (args.send)(r);
            }
            Some(stop.drop_guard())
        }
        None => None,
    };
    let name = format!("part-{p}");
    let stream = js.get_stream(IN_STREAM).await.map_err(|e| e.to_string())?;
    // A work queue keeps exactly the unacknowledged messages: a new consumer starts at the
    // oldest of them (the previous owner's in-flight turns come first, in order).
    let creating = super::balance::CONSUMER_CREATION
        .acquire()
        .await
        .map_err(|e| e.to_string())?;
    let _ = stream.delete_consumer(&name).await;
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(name),
            filter_subject: subject(p),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            deliver_policy: jetstream::consumer::DeliverPolicy::All,
            ack_wait: Duration::from_secs(600),
            max_ack_pending: MAX_IN_FLIGHT,
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    drop(creating);
    let mut msgs = consumer
        .stream()
        .heartbeat(Duration::from_secs(5))
        .expires(Duration::from_secs(30))
        .messages()
        .await
        .map_err(|e| e.to_string())?;
    let mut tick = tokio::time::interval(ACK_EVERY);
    loop {
        tokio::select! {
            m = msgs.next() => match m {
                None => return Err("the consumer's stream ended".into()),
                Some(Err(e)) => return Err(e.to_string()),
                Some(Ok(m)) => take(args, m, waiting).await?,
            },
            _ = tick.tick(), if !waiting.is_empty() => ack_finished(&args.store, args.log.as_ref(), waiting).await,
            () = args.intake.cancelled() => {
                // Shutdown: the turns under way are still recorded (until they are over).
                if let Some(w) = writer_slot.take() {
                    w.disarm();
                }
                return Ok(());
            }
            () = fenced.cancelled() => return Err("the session log is written by another node".into()),
        }
    }
}

/// Journal a message in the local store and hand it to its session (once on this node).
async fn take(args: &Consume, m: jetstream::Message, waiting: &mut Waiting) -> Result<(), String> {
    let env: Envelope = match serde_json::from_slice(&m.payload) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(error = %e, "cluster: unreadable message in the inbound journal; dropped");
            let _ = m.ack_with(jetstream::AckKind::Term).await;
            return Ok(());
        }
    };
    let key = (
        env.event.channel.to_string(),
        env.event.event_id.to_string(),
    );
    if let Some((w, _)) = waiting.get_mut(&key) {
        // Delivered again while its turn runs here: acknowledged with it.
        w.push(m);
        return Ok(());
    }
    match args
        .store
        .journal_inbound_async(&env.event, &env.session)
        .await
        .map_err(|e| format!("cannot journal: {e}"))?
    {
        JournalOutcome::New(entry) => {
            (args.route)(entry);
        }
        JournalOutcome::Duplicate => match args.store.journaled(&key.0, &key.1) {
            // Journaled on this node before and not finished (a turn interrupted by a restart
            // or a lease lost and taken back): resumed once, here.
            Ok(Some(e)) if e.state != InboxState::Done && e.event.is_some() => {
                (args.route)(e);
            }
            Ok(_) => {}
            Err(e) => return Err(format!("cannot read the journal: {e}")),
        },
    }
    waiting.insert(key, (vec![m], 0));
    Ok(())
}

/// Acknowledge the messages whose turn is finished and whose replies are delivered.
async fn ack_finished(
    store: &Store,
    log: Option<&super::session_log::SessionLog>,
    waiting: &mut Waiting,
) {
    let Ok(pending) = store.pending_outbound() else {
        return;
    };
    let batches: Vec<_> = waiting
        .extract_if(|(ch, id), _| {
            let finished = match store.journaled(ch, id) {
                Ok(Some(e)) => e.state == InboxState::Done,
                Ok(None) => true,
                Err(_) => false,
            };
            // ... and whose records are stored in the session log: a message is either answered
            // again (its turn not recorded) or its recorded reply sent again, never both.
            finished
                && log.is_none_or(|l| l.settled(ch, id))
                && !pending.iter().any(|o| {
                    o.channel.as_str() == ch.as_str()
                        && o.in_reply_to
                            .as_ref()
                            .is_some_and(|r| r.as_str() == id.as_str())
                })
        })
        .collect();
    // All at once: the sooner an answered message is acknowledged, the shorter the window in
    // which a kill makes the next owner answer it again. One not confirmed is tried again
    // (NATS away): acknowledging it late still spares the next owner answering it again.
    let results = futures::future::join_all(batches.iter().map(|(_, (ms, _))| async move {
        let mut ok = true;
        for m in ms {
            if let Err(e) = m.double_ack().await {
                tracing::debug!(error = %e, "cluster: acknowledgement not confirmed; trying again");
                ok = false;
            }
        }
        ok
    }))
    .await;
    for ((k, (ms, tries)), ok) in batches.into_iter().zip(results) {
        // Given up after a while: the consumer is gone (a new owner made its own), which
        // finds the message answered only when it owned it before.
        if !ok && tries < MAX_ACK_TRIES {
            waiting.insert(k, (ms, tries + 1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_stable_and_spread() {
        assert_eq!(
            partition_of("telegram:1", 64),
            partition_of("telegram:1", 64)
        );
        let mut seen = std::collections::HashSet::new();
        for i in 0..100 {
            seen.insert(partition_of(&format!("telegram:{i}"), 8));
        }
        assert_eq!(seen.len(), 8);
        assert_eq!(partition_of("x", 1), 0);
        assert_eq!(partition_of("x", 0), 0);
    }
}
