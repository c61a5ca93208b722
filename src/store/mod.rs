//! ⑦ The store: transcripts per session, the inbound journal (dedupe + recovery), and the
//! outbound outbox, on sled (or in memory for tests).
//!
//! Durability points (the only places that flush): an inbound event is flushed before the
//! platform is acknowledged; a finished turn (reply in the outbox, journal entry done) is flushed
//! before the reply is sent. Everything else rides sled's 500 ms background flush. Flushes go
//! through one flusher thread that coalesces concurrent requests ([`commit`]: group commit).
//!
//! Faults ([`integrity`]): values carry a checksum, the store carries a manifest record (schema
//! version, store id) and a sidecar file outside sled (`clawft-store.json`) with a durable
//! high-water mark, so a damaged store is detected at open instead of loading part of it; a
//! failed write degrades the store ([`health`]) until a retry works (ENOSPC recovery).

pub mod backup;
mod commit;
pub mod health;
pub mod integrity;
pub mod kv;
pub mod replica;
pub mod shared;
pub mod usage;
pub mod window;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clawft_channel_core::{InboundEvent, OutboundMessage};
use serde::{Deserialize, Serialize};

use crate::llm::Message;
use crate::types::SessionKey;
pub use commit::FlushTicket;
pub use health::StoreHealth;
pub use integrity::{OnCorruption, SCHEMA_VERSION};
use kv::{Kv, MemKv, Op};

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another process (a running `weft gateway`) holds the database.
    #[error("the store at {0} is in use by another weft process")]
    Locked(String),
    /// Filesystem error.
    #[error("store I/O error at {path}: {source}")]
    Io {
        /// Path involved.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The backend failed.
    #[error("store error: {0}")]
    Backend(String),
    /// A record could not be decoded (corruption or an incompatible version).
    #[error("corrupt store record {key}: {detail}")]
    Corrupt {
        /// Printable key.
        key: String,
        /// Decoder message.
        detail: String,
    },
    /// A flush (group commit) failed; `kind` as [`StoreError::kind`] of the backend error.
    #[error("store flush failed: {detail}")]
    Flush {
        /// Kind of the underlying error.
        kind: &'static str,
        /// The error.
        detail: String,
    },
    /// The store is damaged (found at open): what was found.
    #[error("the store at {path} is damaged: {detail}")]
    Damaged {
        /// The store directory.
        path: String,
        /// What was found.
        detail: String,
    },
    /// The store was written by a newer weft.
    #[error("the store at {path} was written by a newer weft (schema {schema}, this weft knows up to {known}); upgrade weft or restore a backup (`weft store restore`)", known = SCHEMA_VERSION)]
    Newer {
        /// The store directory.
        path: String,
        /// Its schema version.
        schema: u32,
    },
}

impl StoreError {
    /// A short name for metrics and health: `no_space`, `file_too_large`, `io`, `backend`,
    /// `corrupt`, `damaged`, `newer`, `locked`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Locked(_) => "locked",
            Self::Io { source, .. } => io_kind(source),
            Self::Backend(_) => "backend",
            Self::Corrupt { .. } => "corrupt",
            Self::Flush { kind, .. } => kind,
            Self::Damaged { .. } => "damaged",
            Self::Newer { .. } => "newer",
        }
    }
}

fn io_kind(e: &std::io::Error) -> &'static str {
    use std::io::ErrorKind;
    // sled hands back copies of its first I/O error that keep its kind (and its text).
    match e.kind() {
        ErrorKind::StorageFull => "no_space",
        ErrorKind::FileTooLarge => "file_too_large",
        _ => "io",
    }
}

/// Where an inbound event is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InboxState {
    /// Journaled, not yet started.
    Pending,
    /// Its user message is in the transcript; the turn has not finished.
    Started,
    /// Answered (the reply is in the outbox or delivered).
    Done,
}

/// A journaled inbound event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InboxEntry {
    /// Journal order.
    pub seq: u64,
    /// Session it belongs to.
    pub session: SessionKey,
    /// State.
    pub state: InboxState,
    /// The event (content dropped once done).
    pub event: Option<InboundEvent>,
}

/// Result of journaling an inbound event.
#[derive(Debug)]
// `New` is the common case and is moved once, into the session; boxing it would cost an
// allocation per message to save stack space in the rare `Duplicate`.
#[allow(clippy::large_enum_variant)]
pub enum JournalOutcome {
    /// New: journaled and flushed.
    New(InboxEntry),
    /// Seen before (same channel and platform event id).
    Duplicate,
}

/// Summary of a stored session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionMeta {
    /// Key.
    pub key: SessionKey,
    /// Milliseconds since the epoch.
    pub created_ms: u64,
    /// Milliseconds since the epoch of the last write.
    pub updated_ms: u64,
    /// Next transcript sequence number (= messages ever appended).
    pub next_seq: u64,
}

const SEP: u8 = 0;

fn session_meta_key(s: &SessionKey) -> Vec<u8> {
    let mut k = b"s\0".to_vec();
    k.extend(s.to_store_key());
    k
}

fn transcript_prefix(s: &SessionKey) -> Vec<u8> {
    let mut k = b"t\0".to_vec();
    k.extend(s.to_store_key());
    k.push(SEP);
    k
}

fn inbox_key(ev: &InboundEvent) -> Vec<u8> {
    inbox_key_of(ev.channel.as_str(), ev.event_id.as_str())
}

fn inbox_key_of(channel: &str, event_id: &str) -> Vec<u8> {
    let mut k = b"i\0".to_vec();
    k.extend(channel.as_bytes());
    k.push(SEP);
    k.extend(event_id.as_bytes());
    k
}

fn queue_key(seq: u64) -> Vec<u8> {
    let mut k = b"q\0".to_vec();
    k.extend(seq.to_be_bytes());
    k
}

fn outbox_key(id: &str) -> Vec<u8> {
    let mut k = b"o\0".to_vec();
    k.extend(id.as_bytes());
    k
}

/// State namespace of the chat users who spoke in each session.
const NS_PARTICIPANTS: &str = "session-users";
/// State namespace of the chat users' display names (`channel:sender` → the name the platform
/// gave with their last message). For the operator's view only.
const NS_USER_NAMES: &str = "user-names";
/// Between the session key and the user in a participant key (a session key holds no control
/// characters).
const PARTICIPANT_SEP: char = '\u{1f}';

fn participant_key(session: &SessionKey, who: &str) -> String {
    format!("{session}{PARTICIPANT_SEP}{who}")
}

fn state_key(ns: &str, key: &str) -> Vec<u8> {
    let mut k = b"k\0".to_vec();
    k.extend(ns.as_bytes());
    k.push(SEP);
    k.extend(key.as_bytes());
    k
}

/// First byte of a checksummed value (schema 1): `TAG`, CRC-32 of the payload (little
/// endian), payload. Never the first byte of JSON or UTF-8 text, so values written by schema 0
/// (bare JSON, bare text) still decode.
const TAG: u8 = 0xC1;

/// Printable form of a key.
pub(crate) fn show_key(key: &[u8]) -> String {
    String::from_utf8_lossy(key).replace('\0', "/")
}

/// Wrap `payload` with the tag and its checksum.
pub(crate) fn seal(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 5);
    out.push(TAG);
    out.extend(crc32fast::hash(payload).to_le_bytes());
    out.extend(payload);
    out
}

/// The payload of a stored value, its checksum verified (untagged values are schema 0).
pub(crate) fn unseal<'a>(key: &[u8], v: &'a [u8]) -> Result<&'a [u8], StoreError> {
    if v.first() != Some(&TAG) {
        return Ok(v);
    }
    let corrupt = |detail: String| StoreError::Corrupt {
        key: show_key(key),
        detail,
    };
    let (Some(crc), Some(payload)) = (v.get(1..5), v.get(5..)) else {
        return Err(corrupt("value shorter than its checksum".into()));
    };
    let want = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    let got = crc32fast::hash(payload);
    if want != got {
        return Err(corrupt(format!(
            "checksum mismatch (stored {want:08x}, computed {got:08x})"
        )));
    }
    Ok(payload)
}

/// A journal entry, its event's origin filled in for records written before events carried one.
fn decode_entry(key: &[u8], v: &[u8]) -> Result<InboxEntry, StoreError> {
    let mut e: InboxEntry = decode(key, v)?;
    if let Some(ev) = e.event.as_mut() {
        ev.origin = crate::types::session_key::legacy_origin(ev);
    }
    Ok(e)
}

fn decode<T: serde::de::DeserializeOwned>(key: &[u8], v: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(unseal(key, v)?).map_err(|e| StoreError::Corrupt {
        key: show_key(key),
        detail: e.to_string(),
    })
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(v)
        .map(|j| seal(&j))
        .map_err(|e| StoreError::Backend(format!("encode: {e}")))
}

/// The session store. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    kv: Arc<dyn Kv>,
    path: Option<PathBuf>,
    core: Arc<Core>,
    commit: Arc<commit::GroupCommit>,
    /// Where this handle tells finished turns and deliveries (cluster mode: the session log),
    /// given with [`Store::with_replica`] before the handle is shared ([`replica`]).
    replica: Option<Arc<dyn replica::Replica>>,
}

/// What the flusher thread shares with the store's handles.
pub(crate) struct Core {
    kv: Arc<dyn Kv>,
    pub(crate) health: health::Health,
    sidecar: Option<integrity::Sidecar>,
    /// Batches applied (to tell whether the sidecar needs a new record).
    writes: AtomicU64,
    recorded: AtomicU64,
    /// Changes announced to whoever shows them live ([`Store::announce`]).
    changes: tokio::sync::broadcast::Sender<Change>,
    /// Moves after every batch that may settle an inbound message: a turn's end, a reply
    /// delivered, a record another node wrote ([`Store::settled`]).
    settled: tokio::sync::watch::Sender<u64>,
}

/// A change of a stored value, announced after it is written (the control UI shows the canvas
/// live with these).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// What changed (`canvas`).
    pub ns: &'static str,
    /// Which one (a session key).
    pub key: String,
    /// What the announcer says of it (the canvas's version, title, visibility).
    pub detail: serde_json::Value,
}

/// How often the sidecar's high-water mark is brought up to date while writes happen.
const RECORD_EVERY: Duration = Duration::from_secs(5);
/// How often a degraded store retries its backend.
const RETRY_EVERY: Duration = Duration::from_secs(1);

impl Core {
    /// Reopen the backend and write a probe; healthy again if it is durable.
    fn recover(&self) {
        let probe = || -> Result<(), StoreError> {
            self.kv.reopen()?;
            self.kv.apply(vec![Op::Put(
                b"m\0probe".to_vec(),
                clawft_channel_core::now_ms().to_be_bytes().to_vec(),
            )])?;
            self.kv.flush()
        };
        match probe() {
            Ok(()) => self.health.recovered(),
            Err(e) => tracing::debug!(error = %e, "store still failing"),
        }
    }
}

impl commit::Housekeeping for Core {
    fn flush_once(&self) -> Result<(), StoreError> {
        match self.kv.flush() {
            Ok(()) => {
                self.health.recovered();
                Ok(())
            }
            Err(e) => {
                self.health.failed(e.kind(), &e.to_string(), true);
                Err(e)
            }
        }
    }

    fn tick(&self) -> Duration {
        if self.health.is_degraded() {
            self.recover();
            return RETRY_EVERY;
        }
        if let Some(sc) = &self.sidecar {
            let w = self.writes.load(Ordering::Relaxed);
            if w != self.recorded.load(Ordering::Relaxed) {
                match sc.record(self.kv.as_ref()) {
                    Ok(true) => self.recorded.store(w, Ordering::Relaxed),
                    Ok(false) => return Duration::from_millis(100),
                    Err(e) => self.health.failed(e.kind(), &e.to_string(), true),
                }
            }
        }
        RECORD_EVERY
    }
}

impl Store {
    /// Open the sled store at `path`; a damaged store is refused ([`OnCorruption::Fail`]).
    ///
    /// # Errors
    /// [`StoreError::Locked`] when a gateway holds it; [`StoreError::Damaged`],
    /// [`StoreError::Newer`].
    pub fn open(path: &Path, cache_bytes: u64) -> Result<Self, StoreError> {
        integrity::open(path, cache_bytes, OnCorruption::Fail)
    }

    /// Open the sled store at `path`, applying `policy` if it is found damaged.
    ///
    /// # Errors
    /// As [`Store::open`]; [`StoreError::Damaged`] only with [`OnCorruption::Fail`].
    pub fn open_with(
        path: &Path,
        cache_bytes: u64,
        policy: OnCorruption,
    ) -> Result<Self, StoreError> {
        integrity::open(path, cache_bytes, policy)
    }

    /// A store in memory (tests).
    pub fn memory() -> Self {
        Self::with_kv(Arc::new(MemKv::default()))
    }

    /// A store over any [`Kv`] backend (tests inject faults and count flushes this way).
    pub fn with_kv(kv: Arc<dyn Kv>) -> Self {
        Self::assemble(kv, None, None)
    }

    fn assemble(
        kv: Arc<dyn Kv>,
        path: Option<PathBuf>,
        sidecar: Option<integrity::Sidecar>,
    ) -> Self {
        let core = Arc::new(Core {
            kv: kv.clone(),
            health: health::Health::default(),
            sidecar,
            writes: AtomicU64::new(0),
            recorded: AtomicU64::new(0),
            changes: tokio::sync::broadcast::channel(64).0,
            settled: tokio::sync::watch::channel(0).0,
        });
        let commit = Arc::new(commit::GroupCommit::start(core.clone()));
        Self {
            kv,
            path,
            core,
            commit,
            replica: None,
        }
    }

    /// Where it lives, if on disk.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Bytes on disk.
    pub fn size_on_disk(&self) -> u64 {
        self.kv.size_on_disk()
    }

    /// Health: ok or degraded (writes failing), and the quarantine alert if any.
    pub fn health(&self) -> StoreHealth {
        self.core.health.snapshot()
    }

    /// The manifest (schema version, store id, creation time) of a store on disk.
    pub fn manifest(&self) -> Option<integrity::Manifest> {
        self.core.sidecar.as_ref().map(integrity::Sidecar::manifest)
    }

    /// Apply a batch, recording a failure in the health state.
    fn apply(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        match self.kv.apply(ops) {
            Ok(()) => {
                self.core.writes.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                self.core.health.failed(e.kind(), &e.to_string(), true);
                Err(e)
            }
        }
    }

    /// Announce that `ns`/`key` changed (after writing it) to the [`Store::changes`]
    /// receivers, if any.
    pub fn announce(&self, ns: &'static str, key: &str, detail: serde_json::Value) {
        let _ = self.core.changes.send(Change {
            ns,
            key: key.to_string(),
            detail,
        });
    }

    /// The changes announced from now on (a slow receiver misses the oldest ones). The
    /// receiver holds no handle on the store: it ends (`Closed`) once the store is closed.
    pub fn changes(&self) -> tokio::sync::broadcast::Receiver<Change> {
        self.core.changes.subscribe()
    }

    /// An event that moves after every batch that may settle an inbound message: a turn's end
    /// written ([`Store::finish_turn_unflushed`] and its flushed forms), a reply removed from
    /// the outbox ([`Store::outbound_done`]), a record of another node applied
    /// ([`Store::apply_remote`]). The cluster's partition owners acknowledge messages on it
    /// instead of polling the store.
    pub fn settled(&self) -> tokio::sync::watch::Receiver<u64> {
        self.core.settled.subscribe()
    }

    /// Tell [`Store::settled`]'s receivers that a batch may have settled a message.
    pub(super) fn tell_settled(&self) {
        self.core.settled.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A small state value (adapter offsets, pairing) under `ns`/`key`.
    ///
    /// # Errors
    /// Backend failure.
    pub fn state_get(&self, ns: &str, key: &str) -> Result<Option<String>, StoreError> {
        let k = state_key(ns, key);
        self.kv
            .get(&k)?
            .map(|v| unseal(&k, &v).map(|p| String::from_utf8_lossy(p).into_owned()))
            .transpose()
    }

    /// Store (`Some`) or delete (`None`) a state value durably (flushed).
    ///
    /// # Errors
    /// Backend failure.
    pub fn state_put(&self, ns: &str, key: &str, value: Option<&str>) -> Result<(), StoreError> {
        let k = state_key(ns, key);
        self.apply(vec![match value {
            Some(v) => Op::Put(k, seal(v.as_bytes())),
            None => Op::Del(k),
        }])?;
        self.flush()
    }

    /// [`Store::state_put`] without the flush: applied now, durable with the next flush (an
    /// async caller awaits [`Store::flush_ticket`], or the ticket of a later write, before it
    /// acts on durability).
    ///
    /// # Errors
    /// Backend failure.
    pub fn state_put_unflushed(
        &self,
        ns: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<(), StoreError> {
        let k = state_key(ns, key);
        self.apply(vec![match value {
            Some(v) => Op::Put(k, seal(v.as_bytes())),
            None => Op::Del(k),
        }])
    }

    /// Store (`Some`) or delete (`None`) several state values, each `(ns, key, value)`, in one
    /// atomic batch, flushed: after a crash either all of them are there or none (the
    /// scheduler writes a job and its run record together).
    ///
    /// # Errors
    /// Backend failure.
    pub fn state_put_many(&self, writes: &[(&str, &str, Option<&str>)]) -> Result<(), StoreError> {
        let ops = writes
            .iter()
            .map(|(ns, key, value)| {
                let k = state_key(ns, key);
                match value {
                    Some(v) => Op::Put(k, seal(v.as_bytes())),
                    None => Op::Del(k),
                }
            })
            .collect();
        self.apply(ops)?;
        self.flush()
    }

    /// A number greater than every one this store returned before, across restarts and
    /// crashes (not contiguous).
    ///
    /// # Errors
    /// Backend failure.
    pub fn next_unique(&self) -> Result<u64, StoreError> {
        self.kv.next_id()
    }

    /// Every state value under `ns`, as (key, value).
    ///
    /// # Errors
    /// Backend failure.
    pub fn state_scan(&self, ns: &str) -> Result<Vec<(String, String)>, StoreError> {
        let prefix = state_key(ns, "");
        self.kv
            .scan_prefix(&prefix)?
            .into_iter()
            .map(|(k, v)| {
                Ok((
                    String::from_utf8_lossy(&k[prefix.len()..]).into_owned(),
                    String::from_utf8_lossy(unseal(&k, &v)?).into_owned(),
                ))
            })
            .collect()
    }

    /// Make every write applied before this call durable. Concurrent callers share one backend
    /// flush (group commit); this blocks the calling thread: code on the async runtime uses
    /// [`Store::flush_ticket`] or [`Store::flush_async`].
    ///
    /// # Errors
    /// Backend failure (the store is then degraded until a retry works).
    pub fn flush(&self) -> Result<(), StoreError> {
        let core = self.core.clone();
        self.commit
            .flush(&move || commit::Housekeeping::flush_once(core.as_ref()))
    }

    /// [`Store::flush`] for async callers: waits without blocking a runtime worker.
    ///
    /// # Errors
    /// Backend failure.
    pub async fn flush_async(&self) -> Result<(), StoreError> {
        self.flush_ticket().await
    }

    /// A ticket for the flush that makes every write applied before this call durable: the
    /// request joins the group commit now, and the ticket (a future) resolves when that flush
    /// is done. An actor takes the ticket in its handler and awaits it in a task, so it never
    /// waits for the disk itself.
    pub fn flush_ticket(&self) -> FlushTicket {
        let core = self.core.clone();
        self.commit.ticket(Arc::new(move || {
            commit::Housekeeping::flush_once(core.as_ref())
        }))
    }

    /// Journal an inbound event (deduplicated by channel + platform event id) and flush, so
    /// the adapter may acknowledge the platform.
    ///
    /// Ingress of one channel calls this sequentially; different channels never share keys.
    ///
    /// # Errors
    /// Backend failure: the adapter must not acknowledge.
    pub fn journal_inbound(
        &self,
        ev: &InboundEvent,
        session: &SessionKey,
    ) -> Result<JournalOutcome, StoreError> {
        let out = self.journal_inbound_unflushed(ev, session)?;
        if matches!(out, JournalOutcome::New(_)) {
            self.flush()?;
        }
        Ok(out)
    }

    /// [`Store::journal_inbound`] for async callers (the ingress pump): the flush is awaited
    /// through the group commit instead of blocking the runtime.
    ///
    /// # Errors
    /// Backend failure: the adapter must not acknowledge.
    pub async fn journal_inbound_async(
        &self,
        ev: &InboundEvent,
        session: &SessionKey,
    ) -> Result<JournalOutcome, StoreError> {
        let out = self.journal_inbound_unflushed(ev, session)?;
        if matches!(out, JournalOutcome::New(_)) {
            self.flush_async().await?;
        }
        Ok(out)
    }

    /// [`Store::journal_inbound`] without the flush: the caller flushes (once for a batch of
    /// events, [`Store::flush_async`]) before acknowledging any of them.
    ///
    /// # Errors
    /// Backend failure.
    pub fn journal_inbound_unflushed(
        &self,
        ev: &InboundEvent,
        session: &SessionKey,
    ) -> Result<JournalOutcome, StoreError> {
        let key = inbox_key(ev);
        if self.kv.get(&key)?.is_some() {
            return Ok(JournalOutcome::Duplicate);
        }
        let entry = InboxEntry {
            seq: self.kv.next_id()?,
            session: session.clone(),
            state: InboxState::Pending,
            // The one place outside text is sanitised: every inbound message (chat, subagent
            // announcement) enters through the journal.
            event: Some(InboundEvent {
                content: crate::types::sanitize_content(&ev.content),
                ..ev.clone()
            }),
        };
        self.apply(vec![
            Op::Put(key.clone(), encode(&entry)?),
            Op::Put(queue_key(entry.seq), key),
        ])?;
        Ok(JournalOutcome::New(entry))
    }

    /// The journal entry of the event `event_id` on `channel`, if it was journaled (a
    /// scheduled run found again after a restart: still pending, or done).
    ///
    /// # Errors
    /// Backend failure or a corrupt record.
    pub fn journaled(
        &self,
        channel: &str,
        event_id: &str,
    ) -> Result<Option<InboxEntry>, StoreError> {
        let key = inbox_key_of(channel, event_id);
        match self.kv.get(&key)? {
            Some(v) => decode_entry(&key, &v).map(Some),
            None => Ok(None),
        }
    }

    /// Journaled events not yet answered, in journal order.
    ///
    /// # Errors
    /// Backend failure or corrupt records.
    pub fn pending_inbound(&self) -> Result<Vec<InboxEntry>, StoreError> {
        let mut out = Vec::new();
        let mut stale = Vec::new();
        for (qk, ik) in self.kv.scan_prefix(b"q\0")? {
            match self.kv.get(&ik)? {
                Some(v) => {
                    let e = decode_entry(&ik, &v)?;
                    if e.state == InboxState::Done || e.event.is_none() {
                        stale.push(Op::Del(qk));
                    } else {
                        out.push(e);
                    }
                }
                None => stale.push(Op::Del(qk)),
            }
        }
        if !stale.is_empty() {
            self.apply(stale)?;
        }
        Ok(out)
    }

    fn meta_or_new(&self, session: &SessionKey) -> Result<SessionMeta, StoreError> {
        let k = session_meta_key(session);
        Ok(match self.kv.get(&k)? {
            Some(v) => decode(&k, &v)?,
            None => SessionMeta {
                key: session.clone(),
                created_ms: clawft_channel_core::now_ms(),
                updated_ms: 0,
                next_seq: 0,
            },
        })
    }

    fn append_ops(
        &self,
        session: &SessionKey,
        msgs: &[Message],
        ops: &mut Vec<Op>,
    ) -> Result<(), StoreError> {
        let mut meta = self.meta_or_new(session)?;
        let prefix = transcript_prefix(session);
        for m in msgs {
            let mut k = prefix.clone();
            k.extend(meta.next_seq.to_be_bytes());
            ops.push(Op::Put(k, encode(m)?));
            meta.next_seq += 1;
        }
        meta.updated_ms = clawft_channel_core::now_ms();
        ops.push(Op::Put(session_meta_key(session), encode(&meta)?));
        Ok(())
    }

    fn set_inbox_state(
        &self,
        entry: &InboxEntry,
        state: InboxState,
        ops: &mut Vec<Op>,
    ) -> Result<(), StoreError> {
        let Some(ev) = &entry.event else {
            return Ok(());
        };
        let key = inbox_key(ev);
        let mut updated = entry.clone();
        updated.state = state;
        if state == InboxState::Done {
            // Keep the key for dedupe, drop the content.
            updated.event = None;
            ops.push(Op::Del(queue_key(entry.seq)));
        }
        ops.push(Op::Put(key, encode(&updated)?));
        Ok(())
    }

    /// Append the user message of a journaled event and mark it started, atomically. After a
    /// crash the event is resumed from the transcript rather than appended again.
    ///
    /// # Errors
    /// Backend failure.
    pub fn begin_turn(&self, entry: &InboxEntry, user: &Message) -> Result<(), StoreError> {
        let mut ops = Vec::new();
        self.append_ops(&entry.session, std::slice::from_ref(user), &mut ops)?;
        self.set_inbox_state(entry, InboxState::Started, &mut ops)?;
        // Who spoke here (the session tools' `visibility = "user"`), with the time, in the same
        // batch: a chat user's message, not the gateway's own.
        if let Some(ev) = entry
            .event
            .as_ref()
            .filter(|e| !crate::types::session_key::is_gateway_event(e))
        {
            let who = crate::types::SenderId::of(ev);
            let k = state_key(
                NS_PARTICIPANTS,
                &participant_key(&entry.session, who.as_str()),
            );
            let now = clawft_channel_core::now_ms().to_string();
            ops.push(Op::Put(k, seal(now.as_bytes())));
            if let Some(name) = &ev.sender_name {
                let k = state_key(NS_USER_NAMES, who.as_str());
                ops.push(Op::Put(k, seal(name.as_bytes())));
            }
        }
        self.apply(ops)
    }

    /// The display name each chat user (`channel:sender`) gave with their last message, for
    /// the users whose platform gives one (recorded by [`Store::begin_turn`]).
    ///
    /// # Errors
    /// Backend failure.
    pub fn user_names(&self) -> Result<std::collections::HashMap<String, String>, StoreError> {
        Ok(self.state_scan(NS_USER_NAMES)?.into_iter().collect())
    }

    /// The chat users (`channel:sender`) who have spoken in each session, with the time of
    /// their last message (ms), as recorded by [`Store::begin_turn`].
    ///
    /// # Errors
    /// Backend failure.
    pub fn session_participants(
        &self,
    ) -> Result<std::collections::HashMap<SessionKey, Vec<(String, u64)>>, StoreError> {
        let mut out: std::collections::HashMap<SessionKey, Vec<(String, u64)>> =
            std::collections::HashMap::new();
        for (k, v) in self.state_scan(NS_PARTICIPANTS)? {
            let Some((session, who)) = k.split_once(PARTICIPANT_SEP) else {
                continue;
            };
            if let Ok(session) = SessionKey::parse(session) {
                out.entry(session)
                    .or_default()
                    .push((who.to_string(), v.parse().unwrap_or(0)));
            }
        }
        Ok(out)
    }

    /// Append messages to a transcript (not flushed).
    ///
    /// # Errors
    /// Backend failure.
    pub fn append_messages(
        &self,
        session: &SessionKey,
        msgs: &[Message],
    ) -> Result<(), StoreError> {
        let mut ops = Vec::new();
        self.append_ops(session, msgs, &mut ops)?;
        self.apply(ops)
    }

    /// End a turn atomically: append its last messages, mark its journal entry done and put the
    /// reply in the outbox; then flush, so the reply is sent at least once and the event is never
    /// processed again.
    ///
    /// # Errors
    /// Backend failure.
    pub fn finish_turn(
        &self,
        session: &SessionKey,
        entry: Option<&InboxEntry>,
        msgs: &[Message],
        reply: Option<&OutboundMessage>,
    ) -> Result<(), StoreError> {
        self.finish_turn_unflushed(session, entry, msgs, reply, Vec::new())?;
        self.flush()
    }

    /// [`Store::finish_turn`] with `ops` (the turn's usage counters, [`usage`]) written in the
    /// same atomic batch, under the same flush.
    ///
    /// # Errors
    /// Backend failure.
    pub fn finish_turn_with(
        &self,
        session: &SessionKey,
        entry: Option<&InboxEntry>,
        msgs: &[Message],
        reply: Option<&OutboundMessage>,
        ops: Vec<Op>,
    ) -> Result<(), StoreError> {
        self.finish_turn_unflushed(session, entry, msgs, reply, ops)?;
        self.flush()
    }

    /// The batch of [`Store::finish_turn_with`], applied but not flushed: the caller makes it
    /// durable with [`Store::flush_async`] before the reply is sent.
    ///
    /// # Errors
    /// Backend failure.
    pub fn finish_turn_unflushed(
        &self,
        session: &SessionKey,
        entry: Option<&InboxEntry>,
        msgs: &[Message],
        reply: Option<&OutboundMessage>,
        mut ops: Vec<Op>,
    ) -> Result<(), StoreError> {
        // Cluster mode: the turn goes to the session log before the local batch, so its
        // message is never acknowledged in the cluster before its record is on its way.
        if let Some(r) = self.replica() {
            if let Some(rec) = self.turn_record(r.as_ref(), session, entry, msgs, reply)? {
                r.turn(rec);
            }
        }
        if !msgs.is_empty() {
            self.append_ops(session, msgs, &mut ops)?;
        }
        if let Some(e) = entry {
            self.set_inbox_state(e, InboxState::Done, &mut ops)?;
        }
        if let Some(r) = reply {
            ops.push(Op::Put(outbox_key(&r.id), encode(r)?));
        }
        self.apply(ops)?;
        self.tell_settled();
        Ok(())
    }

    /// Put a message in the outbox and flush (proactive messages).
    ///
    /// # Errors
    /// Backend failure.
    pub fn enqueue_outbound(&self, msg: &OutboundMessage) -> Result<(), StoreError> {
        self.enqueue_outbound_unflushed(msg)?;
        self.flush()
    }

    /// [`Store::enqueue_outbound`] without the flush: the caller routes the message only once
    /// a [`Store::flush_ticket`] taken after this call has resolved.
    ///
    /// # Errors
    /// Backend failure.
    pub fn enqueue_outbound_unflushed(&self, msg: &OutboundMessage) -> Result<(), StoreError> {
        self.apply(vec![Op::Put(outbox_key(&msg.id), encode(msg)?)])
    }

    /// Outbox messages not yet delivered.
    ///
    /// # Errors
    /// Backend failure or corrupt records.
    pub fn pending_outbound(&self) -> Result<Vec<OutboundMessage>, StoreError> {
        self.kv
            .scan_prefix(b"o\0")?
            .iter()
            .map(|(k, v)| decode(k, v))
            .collect()
    }

    /// Remove a delivered (or undeliverable) message from the outbox. Not flushed: at worst a
    /// crash makes it send again, which channels dedupe by message id where they can.
    ///
    /// # Errors
    /// Backend failure.
    pub fn outbound_done(&self, id: &str) -> Result<(), StoreError> {
        // Cluster mode: the delivery goes to the session log at once, concurrently with the
        // local removal and its flush.
        if let Some(r) = self.replica() {
            r.delivered(id);
        }
        self.apply(vec![Op::Del(outbox_key(id))])?;
        self.tell_settled();
        Ok(())
    }

    /// Remove a delivered message from the outbox and wait until that removal is durable, so
    /// a crash can never send it again. The flush is shared (group commit) with every other
    /// caller waiting at the same time: a send per chat costs a share of one fsync, not one.
    ///
    /// # Errors
    /// Backend failure: the mark may not be durable.
    pub async fn outbound_done_durable(&self, id: &str) -> Result<(), StoreError> {
        self.outbound_done(id)?;
        self.flush_async().await
    }

    /// The transcript of a session, in order.
    ///
    /// # Errors
    /// Backend failure or corrupt records.
    pub fn load_transcript(&self, session: &SessionKey) -> Result<Vec<Message>, StoreError> {
        self.kv
            .scan_prefix(&transcript_prefix(session))?
            .iter()
            .map(|(k, v)| decode(k, v))
            .collect()
    }

    /// All stored sessions.
    ///
    /// # Errors
    /// Backend failure or corrupt records.
    pub fn sessions(&self) -> Result<Vec<SessionMeta>, StoreError> {
        self.kv
            .scan_prefix(b"s\0")?
            .iter()
            .map(|(k, v)| decode(k, v))
            .collect()
    }

    /// One session's summary.
    ///
    /// # Errors
    /// Backend failure or corrupt records.
    pub fn session_meta(&self, session: &SessionKey) -> Result<Option<SessionMeta>, StoreError> {
        let k = session_meta_key(session);
        self.kv.get(&k)?.map(|v| decode(&k, &v)).transpose()
    }

    /// Delete a session's transcript. Returns whether it existed.
    ///
    /// # Errors
    /// Backend failure.
    pub fn clear_session(&self, session: &SessionKey) -> Result<bool, StoreError> {
        let (existed, ops) = self.clear_ops(session)?;
        let delete = || {
            self.apply(ops)?;
            self.flush()
        };
        // The sidecar's high-water mark goes down first: a crash after the delete must not
        // make the smaller store look damaged.
        match &self.core.sidecar {
            Some(sc) => sc.lowered(u64::from(existed), delete)?,
            None => delete()?,
        }
        Ok(existed)
    }

    /// [`Store::clear_session`] for async callers: the sidecar's mark is lowered (a file
    /// write and an fsync) on a blocking thread when the session existed, the delete is
    /// applied after it, and its flush is awaited through the group commit. The caller makes
    /// no other write to `session` until this returns (the session actor holds its turns).
    ///
    /// # Errors
    /// Backend failure.
    pub async fn clear_session_async(&self, session: &SessionKey) -> Result<bool, StoreError> {
        let (existed, ops) = self.clear_ops(session)?;
        // A deleted session lowers the count: under the sidecar's lock, which the mark's
        // record also takes while it flushes, so on a blocking thread.
        if existed && self.core.sidecar.is_some() {
            let me = self.clone();
            tokio::task::spawn_blocking(move || match &me.core.sidecar {
                Some(sc) => sc.lowered(1, || me.apply(ops)),
                None => me.apply(ops),
            })
            .await
            .map_err(|e| StoreError::Backend(format!("clear task: {e}")))??;
        } else {
            self.apply(ops)?;
        }
        self.flush_ticket().await?;
        Ok(existed)
    }

    /// Whether a session is stored, and the batch that deletes it.
    fn clear_ops(&self, session: &SessionKey) -> Result<(bool, Vec<Op>), StoreError> {
        let mk = session_meta_key(session);
        let existed = self.kv.get(&mk)?.is_some();
        let mut ops: Vec<Op> = self
            .kv
            .scan_prefix(&transcript_prefix(session))?
            .into_iter()
            .map(|(k, _)| Op::Del(k))
            .collect();
        ops.push(Op::Del(mk));
        ops.push(Op::Del(window::window_key(session)));
        Ok((existed, ops))
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
