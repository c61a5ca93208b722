//! The session log of the cluster (docs/cluster.md, "Session state"): the JetStream stream
//! `WEFT_STATE`, one subject per session partition (`weft.state.<n>`), authoritative for the
//! partition's sessions; each node's local store is its cache. The partition's owner appends a
//! `Turn` record when a turn finishes (the transcript messages it appended, the prompt window,
//! the inbound message it answered, the replies it put in the outbox) and a `Delivered` record
//! as soon as the platform accepted a reply. Every append names the last sequence number the
//! writer knows for the subject (`Nats-Expected-Last-Subject-Sequence`): a node that lost the
//! partition cannot write after the new owner did; refused, its writer stops and the node stops
//! consuming the partition. A new owner first replays the subject from the last record its
//! store applied into its store ([`replay`]), then consumes the partition's inbound messages.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use clawft_channel_core::OutboundMessage;
use futures::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::node::Cluster;
use super::streams::partition_of;
pub use super::streams::{
    ensure_session_log as ensure_stream, state_subject as subject, STATE_STREAM,
};
use crate::store::replica::{Record, Replica, TurnRecord};
use crate::store::shared::SharedErrorKind;
use crate::store::Store;
use crate::types::SessionKey;

/// The store namespace of the last record applied per partition.
const APPLIED_NS: &str = "cluster-state-applied";
/// How long the replay waits for the next record at most.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Records sent in one JetStream message at most.
const MAX_BATCH: usize = 64;

/// An inbound message (channel, platform event id).
type Inbound = (String, String);

/// A record on its way, with the inbound message it settles once stored.
type Queued = (Record, Option<Inbound>);

#[derive(Default)]
struct Inner {
    /// The writers of the partitions owned and replayed.
    writers: HashMap<u32, (u64, mpsc::UnboundedSender<Queued>)>,
    /// Writers started so far (tells a writer's entry from its successor's).
    started: u64,
    /// Per session, the first transcript sequence number not in the log.
    covered: HashMap<SessionKey, u64>,
    /// Replies recorded and not yet delivered: their partition and inbound message.
    replies: HashMap<String, (u32, Option<Inbound>)>,
    /// Records of an inbound message not yet stored in the log.
    unsettled: HashMap<Inbound, u32>,
    /// Per partition, the records a stopped writer could not store and those of turns that
    /// finished here after it stopped, with the last sequence it knew: the next writer of the
    /// partition here stores them first if nobody wrote in between (else they are dropped: the
    /// node that wrote answered those messages). Their inbound messages stay unsettled (not
    /// acknowledged) until then.
    stash: HashMap<u32, (u64, Vec<Queued>)>,
    /// Partitions whose consumer is starting again here while the lease stays this node's:
    /// turns finishing between the two writers are kept for the next one.
    resuming: std::collections::HashSet<u32>,
}

/// The session log of this node: the store's [`Replica`] in cluster mode.
#[derive(Clone)]
pub struct SessionLog {
    partitions: u32,
    inner: Arc<Mutex<Inner>>,
    /// Moves when records of inbound messages were stored (or given up): [`SessionLog::stored`].
    stored: Arc<watch::Sender<u64>>,
}

impl SessionLog {
    /// The log of a cluster of `partitions` partitions.
    pub fn new(partitions: u32) -> Self {
        Self {
            partitions,
            inner: Arc::default(),
            stored: Arc::new(watch::channel(0).0),
        }
    }

    /// An event that moves when an inbound message's records were stored in the log (or will
    /// not be: its writer stopped), so [`SessionLog::settled`] may have changed.
    pub fn stored(&self) -> watch::Receiver<u64> {
        self.stored.subscribe()
    }

    fn tell_stored(&self) {
        self.stored.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether every record of the inbound message (channel, event id) handed to the log is
    /// stored in it (its turn, and the delivery of its replies).
    pub fn settled(&self, channel: &str, event_id: &str) -> bool {
        self.locked()
            .unreplied_key(channel, event_id)
            .is_none_or(|n| n == 0)
    }

    fn settle(&self, key: Option<&Inbound>) {
        if let Some(k) = key {
            self.locked().unsettle(k);
            self.tell_stored();
        }
    }

    /// Partition `p`'s writer `generation` stopped at sequence `at`, with `left` not stored:
    /// kept for the next writer here, and what finishes here meanwhile is kept with it (a
    /// consumer started again after a NATS server was lost must not acknowledge a message
    /// whose turn the log never got: the next owner would answer without it in the history).
    fn stop_writing(&self, p: u32, generation: u64, at: u64, mut left: Vec<Queued>) {
        let mut g = self.locked();
        if g.writers.get(&p).is_some_and(|(n, _)| *n != generation) {
            // A newer writer started meanwhile (it replayed what this one stored): what this
            // one could not store goes to it.
            if let Some((_, tx)) = g.writers.get(&p).cloned() {
                for q in left {
                    g.queue(p, Some(&tx), q);
                }
            }
            return;
        }
        g.writers.remove(&p);
        let parts = self.partitions;
        g.covered
            .retain(|s, _| partition_of(s.as_str(), parts) != p);
        if left.is_empty() && !g.resuming.contains(&p) && !g.stash.contains_key(&p) {
            return;
        }
        // Records handed over while it stopped come after its own.
        let entry = g.stash.entry(p).or_insert((0, Vec::new()));
        left.append(&mut entry.1);
        *entry = (at, left);
    }

    /// Partition `p`'s consumer failed and starts again while the lease stays this node's:
    /// what finishes before its next writer is kept for that writer (and not acknowledged
    /// before it is stored).
    pub fn resume_later(&self, p: u32) {
        self.locked().resuming.insert(p);
    }

    /// Partition `p` is not being started again here (its lease was lost or handed over, or
    /// the node stops): a turn finishing now is left to the partition's owner.
    pub fn not_resuming(&self, p: u32) {
        self.locked().resuming.remove(&p);
    }
}

impl Inner {
    /// Whether partition `p`'s records are taken here: it has a writer, or its next writer
    /// here is on its way.
    fn keeps(&self, p: u32) -> bool {
        self.writers.contains_key(&p) || self.resuming.contains(&p)
    }

    /// One record of inbound message `k` is stored (or will not be).
    fn unsettle(&mut self, k: &Inbound) {
        if let Some(n) = self.unsettled.get_mut(k) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.unsettled.remove(k);
            }
        }
    }

    fn unreplied_key(&self, channel: &str, event_id: &str) -> Option<u32> {
        self.unsettled
            .get(&(channel.to_string(), event_id.to_string()))
            .copied()
    }

    /// Hand `q` to partition `p`'s writer, or keep it for the next writer here when there is
    /// none now or it just stopped (its inbound message stays unsettled until then).
    fn queue(&mut self, p: u32, writer: Option<&mpsc::UnboundedSender<Queued>>, q: Queued) {
        let q = match writer {
            Some(tx) => match tx.send(q) {
                Ok(()) => return,
                Err(mpsc::error::SendError(q)) => q,
            },
            None => q,
        };
        // The sequence is set by the stopping writer ([`SessionLog::stop_writing`]).
        self.stash.entry(p).or_insert((0, Vec::new())).1.push(q);
    }
}

impl Replica for SessionLog {
    fn covered(&self, session: &SessionKey) -> u64 {
        self.locked().covered.get(session).copied().unwrap_or(0)
    }

    fn records(&self, session: &SessionKey) -> bool {
        let p = partition_of(session.as_str(), self.partitions);
        let g = self.locked();
        g.keeps(p)
    }

    fn turn(&self, rec: TurnRecord) {
        let p = partition_of(rec.session.as_str(), self.partitions);
        let mut g = self.locked();
        let writer = g.writers.get(&p).map(|(_, tx)| tx.clone());
        if !g.keeps(p) {
            // Not written here: the partition's owner records it.
            return;
        }
        if writer.is_some() {
            g.covered.insert(
                rec.session.clone(),
                rec.from_seq + rec.messages.len() as u64,
            );
        }
        for r in &rec.replies {
            g.replies.insert(r.id.clone(), (p, rec.inbound.clone()));
        }
        if let Some(k) = &rec.inbound {
            *g.unsettled.entry(k.clone()).or_insert(0) += 1 + rec.replies.len() as u32;
        }
        let key = rec.inbound.clone();
        g.queue(p, writer.as_ref(), (Record::Turn(rec), key));
    }

    fn delivered(&self, id: &str) {
        let mut g = self.locked();
        let Some((p, key)) = g.replies.remove(id) else {
            return;
        };
        let writer = g.writers.get(&p).map(|(_, tx)| tx.clone());
        if !g.keeps(p) {
            // Not writable here any more (the partition moved): nothing more to wait for.
            drop(g);
            self.settle(key.as_ref());
            return;
        }
        g.queue(p, writer.as_ref(), (Record::Delivered(id.to_string()), key));
    }
}

/// Why a partition's log could not be written or read ([`LogError::kind`]: the shared-state
/// kind it is).
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// Another node wrote after the last record this node knows: it owns the partition now.
    #[error("fenced: another node wrote partition {0}'s session log")]
    Fenced(u32),
    /// NATS refused or did not answer.
    #[error("session log: {0}")]
    Nats(String),
    /// The local store failed.
    #[error("session log: local store: {0}")]
    Store(String),
    /// The node stopped consuming the partition.
    #[error("stopped")]
    Stopped,
}

impl LogError {
    /// The kind of failure, as the shared-state seam names it.
    pub fn kind(&self) -> SharedErrorKind {
        match self {
            LogError::Fenced(_) => SharedErrorKind::Fenced,
            LogError::Nats(_) | LogError::Store(_) | LogError::Stopped => {
                SharedErrorKind::Unavailable
            }
        }
    }
}

/// Replay partition `p`'s log into `store` from the record after the last one it applied, to
/// the end. Returns the subject's last sequence number (the writer's fence) and the replies
/// recorded but not delivered (now in the store's outbox, to send).
///
/// # Errors
/// NATS or the store failed: the partition is not consumed (tried again).
pub async fn replay(
    log: &SessionLog,
    js: &jetstream::Context,
    store: &Store,
    p: u32,
) -> Result<(u64, Vec<OutboundMessage>), LogError> {
    let nats = |e: &dyn std::fmt::Display| LogError::Nats(e.to_string());
    let subj = subject(p);
    let stream = js.get_stream(STATE_STREAM).await.map_err(|e| nats(&e))?;
    let last = match stream.get_last_raw_message_by_subject(&subj).await {
        Ok(m) => m.sequence,
        Err(e) if e.kind() == jetstream::stream::LastRawMessageErrorKind::NoMessageFound => 0,
        Err(e) => return Err(nats(&e)),
    };
    let key = p.to_string();
    let mark = (APPLIED_NS, key.as_str());
    let mut applied = store
        .applied_mark(mark)
        .map_err(|e| LogError::Store(e.to_string()))?;
    if applied > last {
        // The stream was made again: everything in it is new here.
        applied = 0;
    }
    let mut queued: HashMap<String, OutboundMessage> = HashMap::new();
    let mut covered: HashMap<SessionKey, u64> = HashMap::new();
    if last > applied {
        let consumer = stream
            .create_consumer(pull::OrderedConfig {
                filter_subject: subj.clone(),
                deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: applied + 1,
                },
                ..Default::default()
            })
            .await
            .map_err(|e| nats(&e))?;
        let mut msgs = consumer.messages().await.map_err(|e| nats(&e))?;
        // A replay that stalls (NATS away) fails and is tried again, rather than hold the
        // partition unconsumed.
        while let Some(m) = tokio::time::timeout(READ_TIMEOUT, msgs.next())
            .await
            .map_err(|_| LogError::Nats("the replay stalled".into()))?
        {
            let m = m.map_err(|e| nats(&e))?;
            let seq = m.info().map_err(|e| nats(&e))?.stream_sequence;
            let records: Vec<Record> = match serde_json::from_slice(&m.payload) {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(partition = p, seq, error = %e, "cluster: unreadable session log record; skipped");
                    Vec::new()
                }
            };
            for r in &records {
                match r {
                    Record::Turn(t) => {
                        covered.insert(t.session.clone(), t.from_seq + t.messages.len() as u64);
                    }
                    Record::Delivered(id) => {
                        queued.remove(id);
                    }
                }
                let put = store
                    .apply_remote(r, mark, seq)
                    .map_err(|e| LogError::Store(e.to_string()))?;
                for o in put {
                    queued.insert(o.id.clone(), o);
                }
            }
            if records.is_empty() {
                store
                    .apply_remote(&Record::Delivered(String::new()), mark, seq)
                    .map_err(|e| LogError::Store(e.to_string()))?;
            }
            if seq >= last {
                break;
            }
        }
        store
            .flush_async()
            .await
            .map_err(|e| LogError::Store(e.to_string()))?;
    }
    let mut g = log.locked();
    g.covered.extend(covered);
    for o in queued.values() {
        // A replayed reply, delivered here: its delivery is recorded too.
        g.replies.insert(o.id.clone(), (p, None));
    }
    Ok((last, queued.into_values().collect()))
}

/// Start writing partition `p`'s log from sequence `last` (the end of the replay). The writer
/// ends when `stop` fires or when it is fenced (then `fenced` fires).
pub fn start_writer(
    log: &SessionLog,
    cluster: &Cluster,
    js: jetstream::Context,
    p: u32,
    last: u64,
    stop: CancellationToken,
    fenced: CancellationToken,
) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let generation = {
        let mut g = log.locked();
        g.started += 1;
        let n = g.started;
        // What the last writer here could not store goes first, when the log is still where
        // that writer left it (nobody else wrote the partition meanwhile).
        g.resuming.remove(&p);
        if let Some((at, left)) = g.stash.remove(&p) {
            if at == last {
                tracing::info!(
                    partition = p,
                    records = left.len(),
                    "cluster: session log records of the last writer written now"
                );
                for q in left {
                    let _ = tx.send(q);
                }
            } else {
                tracing::warn!(
                    partition = p,
                    records = left.len(),
                    "cluster: session log records of the last writer dropped: another node wrote the partition since"
                );
                for k in left.into_iter().filter_map(|(_, k)| k) {
                    g.unsettle(&k);
                }
            }
        }
        g.writers.insert(p, (n, tx));
        n
    };
    log.tell_stored();
    let log = log.clone();
    cluster.spawn(async move {
        let (mut at, mut pending) = (last, Vec::new());
        let r = write_batches(&log, &js, p, &mut at, &mut rx, &mut pending, &stop).await;
        // Kept for the next writer of the partition on this node.
        rx.close();
        while let Ok(q) = rx.try_recv() {
            pending.push(q);
        }
        log.stop_writing(p, generation, at, pending);
        match r {
            Ok(()) | Err(LogError::Stopped) => {}
            Err(e) => {
                tracing::error!(partition = p, error = %e, "cluster: session log writer stopped; this node stops acting on the partition");
                fenced.cancel();
            }
        }
    });
}

/// Append what comes on `rx` to the subject of `p`, each batch fenced by the last sequence.
///
/// # Errors
/// [`LogError::Fenced`] when another node wrote in between.
pub async fn write_loop(
    log: &SessionLog,
    js: &jetstream::Context,
    p: u32,
    mut last: u64,
    mut rx: mpsc::UnboundedReceiver<Queued>,
    stop: &CancellationToken,
) -> Result<(), LogError> {
    let mut pending = Vec::new();
    write_batches(log, js, p, &mut last, &mut rx, &mut pending, stop).await
}

/// [`write_loop`], leaving in `pending` the batch it could not store and in `last` the last
/// sequence it knows.
async fn write_batches(
    log: &SessionLog,
    js: &jetstream::Context,
    p: u32,
    last: &mut u64,
    rx: &mut mpsc::UnboundedReceiver<Queued>,
    pending: &mut Vec<Queued>,
    stop: &CancellationToken,
) -> Result<(), LogError> {
    let subj = subject(p);
    let writer = format!(
        "{}-{}-{p}",
        std::process::id(),
        clawft_channel_core::now_ms()
    );
    let mut n: u64 = 0;
    loop {
        let first = tokio::select! {
            q = rx.recv() => q,
            () = stop.cancelled() => {
                // What was handed over before the stop is still written (one attempt).
                rx.close();
                rx.try_recv().ok()
            }
        };
        let Some(first) = first else {
            return Ok(());
        };
        pending.push(first);
        while pending.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(q) => pending.push(q),
                Err(_) => break,
            }
        }
        let records: Vec<&Record> = pending.iter().map(|(r, _)| r).collect();
        let body = serde_json::to_vec(&records).map_err(|e| LogError::Nats(e.to_string()))?;
        n += 1;
        let id = format!("{writer}-{n}");
        *last = append(js, &subj, p, &id, body, *last, stop).await?;
        for (_, k) in pending.drain(..) {
            log.settle(k.as_ref());
        }
    }
}

/// Append one batch with the fence `last`; tried again while NATS does not answer. Returns the
/// batch's sequence number.
async fn append(
    js: &jetstream::Context,
    subj: &str,
    p: u32,
    id: &str,
    body: Vec<u8>,
    last: u64,
    stop: &CancellationToken,
) -> Result<u64, LogError> {
    let body = bytes::Bytes::from(body);
    loop {
        let sent = async {
            js.send_publish(
                subj.to_string(),
                jetstream::message::PublishMessage::build()
                    .payload(body.clone())
                    .message_id(id)
                    .expected_last_subject_sequence(last),
            )
            .await?
            .await
        };
        match tokio::time::timeout(Duration::from_secs(10), sent).await {
            Ok(Ok(ack)) => return Ok(ack.sequence),
            // Another writer's record came first (the client's kind, or the server's code).
            Ok(Err(e)) if super::kv::classify(&e) == SharedErrorKind::Conflict => {
                return Err(LogError::Fenced(p));
            }
            Ok(Err(e)) => {
                tracing::debug!(partition = p, error = %e, "cluster: session log append not confirmed; trying again");
            }
            Err(_) => {
                tracing::debug!(
                    partition = p,
                    "cluster: session log append timed out; trying again"
                );
            }
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
            () = stop.cancelled() => return Err(LogError::Stopped),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::llm::Message;

    fn turn(event: &str) -> TurnRecord {
        TurnRecord {
            session: SessionKey::parse("telegram:7").unwrap(),
            inbound: Some(("telegram".into(), event.into())),
            from_seq: 0,
            messages: vec![Message::user(event)],
            window: None,
            replies: Vec::new(),
        }
    }

    /// A turn that finishes while the partition's consumer starts again here (its writer
    /// stopped, the next not started yet) is kept for the next writer, and its inbound
    /// message is not settled (acknowledged) before that writer stored it.
    #[tokio::test]
    async fn a_turn_between_two_writers_waits_for_the_next_one() {
        let log = SessionLog::new(1);
        let session = SessionKey::parse("telegram:7").unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        log.locked().writers.insert(0, (1, tx));
        log.locked().started = 1;
        assert!(log.records(&session));
        log.turn(turn("e1"));
        assert!(!log.settled("telegram", "e1"));
        // The writer stops with e1's record not stored (NATS away).
        rx.close();
        let left: Vec<Queued> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        log.resume_later(0);
        log.stop_writing(0, 1, 5, left);
        // A turn finishing now is still recorded, for the next writer.
        assert!(log.records(&session));
        log.turn(turn("e2"));
        assert!(!log.settled("telegram", "e1"));
        assert!(!log.settled("telegram", "e2"));
        {
            let g = log.locked();
            let (at, left) = g.stash.get(&0).unwrap();
            assert_eq!(*at, 5);
            let events: Vec<_> = left.iter().map(|(_, k)| k.clone().unwrap().1).collect();
            assert_eq!(events, ["e1", "e2"]);
        }
        // The next writer here (nobody wrote since) gets both first; once stored, settled.
        let (tx2, mut rx2) = mpsc::unbounded_channel();
        {
            let mut g = log.locked();
            let (at, left) = g.stash.remove(&0).unwrap();
            assert_eq!(at, 5);
            for q in left {
                tx2.send(q).unwrap();
            }
            g.writers.insert(0, (2, tx2));
        }
        while let Ok((_, k)) = rx2.try_recv() {
            log.settle(k.as_ref());
        }
        assert!(log.settled("telegram", "e1"));
        assert!(log.settled("telegram", "e2"));
    }

    /// A partition this node never wrote records nothing here (its owner does).
    #[test]
    fn a_partition_never_written_here_records_nothing() {
        let log = SessionLog::new(1);
        let session = SessionKey::parse("telegram:7").unwrap();
        assert!(!log.records(&session));
        log.turn(turn("e1"));
        assert!(log.settled("telegram", "e1"));
        assert!(log.locked().stash.is_empty());
        // Nor one whose lease was lost or handed over (its writer stopped, no consumer
        // starting again here): the new owner records its turns.
        let (tx, rx) = mpsc::unbounded_channel();
        log.locked().writers.insert(0, (1, tx));
        drop(rx);
        log.stop_writing(0, 1, 3, Vec::new());
        assert!(!log.records(&session));
        log.turn(turn("e2"));
        assert!(log.settled("telegram", "e2"));
        assert!(log.locked().stash.is_empty());
    }
}
