//! The inbound journal of the cluster (docs/cluster.md): the node that receives a chat message
//! publishes it to the JetStream stream `WEFT_IN` on the subject of its session's partition
//! (`weft.in.<n>`, deduplicated by channel + platform event id) and confirms it to the platform
//! only once JetStream has stored it; each partition is leased (`part.<n>`) and consumed in
//! order by its holder, which journals the message in its local store, routes it to the
//! session, and acknowledges it in JetStream only once the turn is finished and its reply
//! delivered. A message whose owner died before that is delivered again to the next owner.
//!
//! The owner looks at its messages under way only when something could have settled one: the
//! store's event of a turn finished or a reply delivered ([`Store::settled`]), or the session
//! log's of a record stored ([`SessionLog::stored`]); it never polls the store. The streams
//! and the partition helpers live in [`super::streams`], below this file.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, consumer::pull::MessagesErrorKind};
use clawft_channel_core::{InboundEvent, OutboundMessage};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::error::ClusterError;
use super::node::Cluster;
use super::session_log::SessionLog;
pub use super::streams::{
    ensure_inbound as ensure_stream, in_subject as subject, lease_key, partition_of, DEDUP_WINDOW,
    IN_STREAM,
};
use crate::store::shared::SharedError;
use crate::store::{InboxEntry, InboxState, JournalOutcome, Store};
use crate::types::SessionKey;

/// Messages of a partition handed to sessions and not yet acknowledged, at most.
const MAX_IN_FLIGHT: i64 = 256;
/// Acknowledgements of an answered message tried at most (then the next owner may answer it
/// again).
const MAX_ACK_TRIES: u32 = 400;
/// How soon an acknowledgement JetStream did not confirm (NATS away) is tried again.
const ACK_RETRY: Duration = Duration::from_millis(25);

/// What is published: the accepted event and its session.
#[derive(Serialize, Deserialize)]
struct Envelope {
    session: SessionKey,
    event: InboundEvent,
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
) -> Vec<Result<Published, SharedError>> {
    let n = events.len();
    let Some(js) = cluster.jetstream() else {
        return vec![Err(SharedError::unavailable("the cluster is not reachable yet")); n];
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
                    acks.push(Err(SharedError::new(
                        crate::store::shared::SharedErrorKind::Invalid,
                        e,
                    )));
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
                .map_err(|e| SharedError::unavailable(&e));
            acks.push(sent);
        }
        futures::future::join_all(acks.into_iter().map(|a| async move {
            let ack = a?.await.map_err(|e| SharedError::unavailable(&e))?;
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
        Ok(None) => vec![Err(SharedError::unavailable("the cluster stopped")); n],
        Err(_) => vec![
            Err(SharedError::unavailable(
                "JetStream did not confirm in time"
            ));
            n
        ],
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
    pub log: Option<SessionLog>,
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

/// The messages of a partition handed to sessions and not yet acknowledged (`M`: a JetStream
/// delivery), and what tells the owner that one of them may have settled.
struct InFlight<M> {
    /// (channel, event id) → its deliveries and the acknowledgements tried so far.
    waiting: HashMap<(String, String), (Vec<M>, u32)>,
    /// Moves when a turn finished or a reply was delivered ([`Store::settled`]).
    store: watch::Receiver<u64>,
    /// Moves when the session log stored a record ([`SessionLog::stored`]).
    log: Option<watch::Receiver<u64>>,
    /// Look now: a message was added (it may be settled already: a duplicate delivery of an
    /// answered one), or the loop looking at them started again.
    due: bool,
    /// An acknowledgement was not confirmed (NATS away): try again soon.
    retry: bool,
}

impl<M> InFlight<M> {
    fn new(store: &Store, log: Option<&SessionLog>) -> Self {
        Self {
            waiting: HashMap::new(),
            store: store.settled(),
            log: log.map(SessionLog::stored),
            due: false,
            retry: false,
        }
    }

    fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Add delivery `m` of message `key`: acknowledged with its other deliveries. `settled`:
    /// it may be settled already (answered before), so look at once.
    fn add(&mut self, key: (String, String), m: M, settled: bool) {
        self.waiting
            .entry(key)
            .or_insert_with(|| (Vec::new(), 0))
            .0
            .push(m);
        self.due |= settled;
    }

    /// Resolves when one of the messages may have settled: at once when due, else on the
    /// store's or the session log's event, or when an unconfirmed acknowledgement is to be
    /// tried again. Never while none waits: nothing is polled.
    async fn changed(&mut self) {
        if self.waiting.is_empty() {
            return std::future::pending().await;
        }
        if std::mem::take(&mut self.due) {
            return;
        }
        let (store, log, retry) = (&mut self.store, &mut self.log, self.retry);
        let logged = async move {
            match log {
                Some(rx) => {
                    if rx.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = store.changed() => if r.is_err() {
                // The store is gone (shutdown): only retries are left to wait for.
                std::future::pending::<()>().await;
            },
            () = logged => {}
            () = tokio::time::sleep(ACK_RETRY), if retry => {}
        }
    }
}

impl InFlight<jetstream::Message> {
    /// Acknowledge the messages whose turn is finished and whose replies are delivered.
    async fn ack_finished(&mut self, store: &Store, log: Option<&SessionLog>) {
        self.retry = false;
        // The cheap checks first: the turn finished, and its records are stored in the session
        // log (a message is either answered again, its turn not recorded, or its recorded
        // reply sent again, never both). Only then is the outbox read.
        let finished: std::collections::HashSet<(String, String)> = self
            .waiting
            .keys()
            .filter(|(ch, id)| {
                let done = match store.journaled(ch, id) {
                    Ok(Some(e)) => e.state == InboxState::Done,
                    Ok(None) => true,
                    Err(_) => false,
                };
                done && log.is_none_or(|l| l.settled(ch, id))
            })
            .cloned()
            .collect();
        if finished.is_empty() {
            return;
        }
        let Ok(pending) = store.pending_outbound() else {
            self.retry = true;
            return;
        };
        // ... and whose replies are delivered.
        let batches: Vec<_> = self
            .waiting
            .extract_if(|key, _| {
                finished.contains(key)
                    && !pending.iter().any(|o| {
                        o.channel.as_str() == key.0.as_str()
                            && o.in_reply_to
                                .as_ref()
                                .is_some_and(|r| r.as_str() == key.1.as_str())
                    })
            })
            .collect();
        // All at once: the sooner an answered message is acknowledged, the shorter the window
        // in which a kill makes the next owner answer it again. One not confirmed is tried
        // again (NATS away): acknowledging it late still spares the next owner answering it
        // again.
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
                self.waiting.insert(k, (ms, tries + 1));
                self.retry = true;
            }
        }
    }
}

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
    let mut flight = InFlight::new(&args.store, args.log.as_ref());
    loop {
        // Not this node's share: messages this node answered are still acknowledged, as soon
        // as NATS takes it, so the next owner does not answer them again.
        flight.due = true;
        let go = loop {
            tokio::select! {
                w = super::balance::wanted(&mut wanted, p) => break w,
                () = args.intake.cancelled() => break false,
                () = flight.changed() => {
                    flight.ack_finished(&args.store, args.log.as_ref()).await;
                }
            }
        };
        if !go {
            break;
        }
        let hold = cluster.hold(&lease_key(p));
        let stop = own(&cluster, p, &args, &hold, &mut wanted, &mut flight).await;
        match stop {
            Stop::Shutdown => {
                // The turns under way finish within the grace; acknowledge them while the
                // lease is still ours, so the next owner does not answer them again.
                drain(&args, &hold, &mut flight, None).await;
                hold.release().await;
                break;
            }
            Stop::Handover(writer) => {
                let n = flight.len();
                drain(&args, &hold, &mut flight, Some(HANDOVER_WAIT)).await;
                drop(writer);
                tracing::info!(
                    partition = p,
                    in_flight = n,
                    left = flight.len(),
                    "cluster: partition handed over to its new owner"
                );
                hold.release().await;
            }
        }
    }
}

/// Acknowledge the turns under way as they finish, while the lease is this node's: until none
/// is left, the turns are over (`done`), the lease is lost, or `bound` has passed.
async fn drain(
    args: &Consume,
    hold: &super::node::LeaseHold,
    flight: &mut InFlight<jetstream::Message>,
    bound: Option<Duration>,
) {
    let Some(h) = hold.current() else {
        return;
    };
    let mut rx = hold.watch();
    let lost = super::leased::lost(&mut rx, h.token);
    tokio::pin!(lost);
    let deadline = async {
        match bound {
            Some(b) => tokio::time::sleep(b).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    flight.due = true;
    while !flight.is_empty() {
        tokio::select! {
            () = flight.changed() => {}
            () = args.done.cancelled() => break,
            () = &mut lost => break,
            () = &mut deadline => break,
        }
        flight.ack_finished(&args.store, args.log.as_ref()).await;
    }
}

/// Take the lease of `p` and consume it while it is this node's and wanted here.
async fn own(
    cluster: &Cluster,
    p: u32,
    args: &Consume,
    hold: &super::node::LeaseHold,
    wanted: &mut super::balance::Wanted,
    flight: &mut InFlight<jetstream::Message>,
) -> Stop {
    let mut rx = hold.watch();
    // The session log's writer of the last consumer: it outlives a consumer stopped for a
    // handover, so the turns under way are still recorded (and then acknowledged).
    let mut writer = None;
    let leave = |stop: Stop| {
        if let Some(log) = &args.log {
            log.not_resuming(p);
        }
        stop
    };
    loop {
        flight.due = true;
        let h = loop {
            tokio::select! {
                h = super::leased::held(&mut rx) => break h,
                () = args.intake.cancelled() => return leave(Stop::Shutdown),
                () = super::balance::unwanted(wanted, p) => return leave(Stop::Handover(None)),
                () = flight.changed() => {
                    flight.ack_finished(&args.store, args.log.as_ref()).await;
                }
            }
        };
        let Some(h) = h else {
            return leave(Stop::Shutdown);
        };
        tracing::info!(
            partition = p,
            token = h.token,
            "cluster: this node owns the partition"
        );
        let r = tokio::select! {
            r = consume(cluster, p, args, flight, &mut writer) => Some(r),
            () = super::leased::lost(&mut rx, h.token) => None,
            () = super::balance::unwanted(wanted, p) => return leave(Stop::Handover(writer.take())),
        };
        // Lost or failed: this writer stops (the next owner, or the next consumer here after
        // a replay, writes the partition's records; turns finishing in between wait for the
        // latter).
        if let Some(log) = &args.log {
            match &r {
                Some(Err(_)) => log.resume_later(p),
                None | Some(Ok(())) => log.not_resuming(p),
            }
        }
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
                    () = args.intake.cancelled() => return leave(Stop::Shutdown),
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
    flight: &mut InFlight<jetstream::Message>,
    writer_slot: &mut Option<tokio_util::sync::DropGuard>,
) -> Result<(), ClusterError> {
    let nats = |e: &dyn std::fmt::Display| ClusterError::Nats(e.to_string());
    let js = cluster
        .jetstream()
        .ok_or_else(|| ClusterError::Nats("the cluster is not reachable yet".into()))?;
    // The partition's sessions as the log has them, then its writer (fenced by the last
    // record); the replies recorded and never delivered are sent (once, from here).
    let fenced = CancellationToken::new();
    *writer_slot = match &args.log {
        Some(log) => {
            let started = std::time::Instant::now();
            let (last, replies) = super::session_log::replay(log, &js, &args.store, p)
                .await
                .map_err(|e| nats(&e))?;
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
    let stream = js.get_stream(IN_STREAM).await.map_err(|e| nats(&e))?;
    // A work queue keeps exactly the unacknowledged messages: a new consumer starts at the
    // oldest of them (the previous owner's in-flight turns come first, in order).
    let creating = super::balance::CONSUMER_CREATION
        .acquire()
        .await
        .map_err(|e| nats(&e))?;
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
        .map_err(|e| nats(&e))?;
    drop(creating);
    let open = || async {
        consumer
            .stream()
            .heartbeat(Duration::from_secs(5))
            .expires(Duration::from_secs(30))
            .messages()
            .await
            .map_err(|e| nats(&e))
    };
    let mut msgs = open().await?;
    loop {
        tokio::select! {
            m = msgs.next() => match m {
                None => return Err(ClusterError::Nats("the consumer's stream ended".into())),
                Some(Err(e)) => match e.kind() {
                    // The consumer is gone (deleted by an operator, or not a pull consumer):
                    // made again from the partition's oldest unacknowledged message.
                    MessagesErrorKind::ConsumerDeleted | MessagesErrorKind::PushBasedConsumer => {
                        return Err(nats(&e))
                    }
                    // The durable consumer survives a lost server or a leader moving (it is
                    // replicated): only the pull is asked again, on the connection as it is
                    // now. Replaying the log and making every partition's consumer again here
                    // queued dozens of JetStream requests while its leaders moved, and a
                    // partition's messages waited for the queue for tens of seconds.
                    MessagesErrorKind::MissingHeartbeat
                    | MessagesErrorKind::Pull
                    | MessagesErrorKind::NoResponders
                    | MessagesErrorKind::Other => {
                        tracing::debug!(partition = p, error = %e, "cluster: partition pull interrupted; pulling again");
                        if e.kind() != MessagesErrorKind::MissingHeartbeat {
                            // Told at once (no JetStream answering): not a busy loop.
                            tokio::time::sleep(Duration::from_millis(250)).await;
                        }
                        msgs = open().await?;
                    }
                },
                Some(Ok(m)) => take(args, m, flight).await?,
            },
            () = flight.changed() => flight.ack_finished(&args.store, args.log.as_ref()).await,
            () = args.intake.cancelled() => {
                // Shutdown: the turns under way are still recorded (until they are over).
                if let Some(w) = writer_slot.take() {
                    w.disarm();
                }
                return Ok(());
            }
            () = fenced.cancelled() => return Err(ClusterError::Nats("the session log is written by another node".into())),
        }
    }
}

/// Journal a message in the local store and hand it to its session (once on this node).
async fn take(
    args: &Consume,
    m: jetstream::Message,
    flight: &mut InFlight<jetstream::Message>,
) -> Result<(), ClusterError> {
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
    if flight.waiting.contains_key(&key) {
        // Delivered again while its turn runs here: acknowledged with it.
        flight.add(key, m, false);
        return Ok(());
    }
    let answered = match args
        .store
        .journal_inbound_async(&env.event, &env.session)
        .await?
    {
        JournalOutcome::New(entry) => {
            (args.route)(entry);
            false
        }
        JournalOutcome::Duplicate => match args.store.journaled(&key.0, &key.1)? {
            // Journaled on this node before and not finished (a turn interrupted by a restart
            // or a lease lost and taken back): resumed once, here.
            Some(e) if e.state != InboxState::Done && e.event.is_some() => {
                (args.route)(e);
                false
            }
            // Answered here before: acknowledged as soon as its records are stored.
            Some(_) | None => true,
        },
    };
    flight.add(key, m, answered);
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The owner looks at its messages under way only when the store says a turn finished
    /// (or a reply was delivered): minutes without an event cost nothing.
    #[tokio::test(start_paused = true)]
    async fn messages_under_way_are_looked_at_on_events_not_on_a_timer() {
        let store = Store::memory();
        let mut flight: InFlight<()> = InFlight::new(&store, None);
        // Nothing waits: never resolves.
        assert!(
            tokio::time::timeout(Duration::from_secs(60), flight.changed())
                .await
                .is_err()
        );
        flight.add(("telegram".into(), "e0".into()), (), true);
        // An answered message delivered again: looked at once, at once.
        tokio::time::timeout(Duration::from_millis(1), flight.changed())
            .await
            .unwrap();
        flight.add(("telegram".into(), "e1".into()), (), false);
        // Then nothing until something settles: no polling.
        assert!(
            tokio::time::timeout(Duration::from_secs(600), flight.changed())
                .await
                .is_err(),
            "woke without an event"
        );
        // A turn finishes: the event wakes the owner.
        let session = SessionKey::parse("telegram:c1").unwrap();
        let wake = tokio::spawn(async move {
            flight.changed().await;
            flight
        });
        tokio::task::yield_now().await;
        store
            .finish_turn_unflushed(&session, None, &[], None, Vec::new())
            .unwrap();
        tokio::time::timeout(Duration::from_millis(1), wake)
            .await
            .unwrap()
            .unwrap();
    }
}
