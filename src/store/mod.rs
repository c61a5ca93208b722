//! ⑦ The store: transcripts per session, the inbound journal (dedupe + recovery), and the
//! outbound outbox, on sled (or in memory for tests).
//!
//! Durability points (the only places that flush): an inbound event is flushed before the
//! platform is acknowledged; a finished turn (reply in the outbox, journal entry done) is flushed
//! before the reply is sent. Everything else rides sled's 500 ms background flush.

pub mod kv;
pub mod window;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clawft_channel_core::{InboundEvent, OutboundMessage};
use serde::{Deserialize, Serialize};

use crate::llm::Message;
use crate::types::SessionKey;
use kv::{Kv, MemKv, Op, SledKv};

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
    let mut k = b"i\0".to_vec();
    k.extend(ev.channel.as_str().as_bytes());
    k.push(SEP);
    k.extend(ev.event_id.as_str().as_bytes());
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

fn state_key(ns: &str, key: &str) -> Vec<u8> {
    let mut k = b"k\0".to_vec();
    k.extend(ns.as_bytes());
    k.push(SEP);
    k.extend(key.as_bytes());
    k
}

fn decode<T: serde::de::DeserializeOwned>(key: &[u8], v: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(v).map_err(|e| StoreError::Corrupt {
        key: String::from_utf8_lossy(key).replace('\0', "/"),
        detail: e.to_string(),
    })
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(v).map_err(|e| StoreError::Backend(format!("encode: {e}")))
}

/// The session store. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    kv: Arc<dyn Kv>,
    path: Option<PathBuf>,
}

impl Store {
    /// Open the sled store at `path`.
    ///
    /// # Errors
    /// [`StoreError::Locked`] when a gateway holds it.
    pub fn open(path: &Path, cache_bytes: u64) -> Result<Self, StoreError> {
        Ok(Self {
            kv: Arc::new(SledKv::open(path, cache_bytes)?),
            path: Some(path.to_path_buf()),
        })
    }

    /// A store in memory (tests).
    pub fn memory() -> Self {
        Self {
            kv: Arc::new(MemKv::default()),
            path: None,
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

    /// A small state value (adapter offsets, pairing) under `ns`/`key`.
    ///
    /// # Errors
    /// Backend failure.
    pub fn state_get(&self, ns: &str, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .kv
            .get(&state_key(ns, key))?
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// Store (`Some`) or delete (`None`) a state value durably (flushed).
    ///
    /// # Errors
    /// Backend failure.
    pub fn state_put(&self, ns: &str, key: &str, value: Option<&str>) -> Result<(), StoreError> {
        let k = state_key(ns, key);
        self.kv.apply(vec![match value {
            Some(v) => Op::Put(k, v.as_bytes().to_vec()),
            None => Op::Del(k),
        }])?;
        self.kv.flush()
    }

    /// Every state value under `ns`, as (key, value).
    ///
    /// # Errors
    /// Backend failure.
    pub fn state_scan(&self, ns: &str) -> Result<Vec<(String, String)>, StoreError> {
        let prefix = state_key(ns, "");
        Ok(self
            .kv
            .scan_prefix(&prefix)?
            .into_iter()
            .map(|(k, v)| {
                (
                    String::from_utf8_lossy(&k[prefix.len()..]).into_owned(),
                    String::from_utf8_lossy(&v).into_owned(),
                )
            })
            .collect())
    }

    /// Make every write durable.
    ///
    /// # Errors
    /// Backend failure.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.kv.flush()
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
        self.kv.apply(vec![
            Op::Put(key.clone(), encode(&entry)?),
            Op::Put(queue_key(entry.seq), key),
        ])?;
        self.kv.flush()?;
        Ok(JournalOutcome::New(entry))
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
                    let e: InboxEntry = decode(&ik, &v)?;
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
            self.kv.apply(stale)?;
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
        self.kv.apply(ops)
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
        self.kv.apply(ops)
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
        let mut ops = Vec::new();
        if !msgs.is_empty() {
            self.append_ops(session, msgs, &mut ops)?;
        }
        if let Some(e) = entry {
            self.set_inbox_state(e, InboxState::Done, &mut ops)?;
        }
        if let Some(r) = reply {
            ops.push(Op::Put(outbox_key(&r.id), encode(r)?));
        }
        self.kv.apply(ops)?;
        self.kv.flush()
    }

    /// Put a message in the outbox and flush (proactive messages).
    ///
    /// # Errors
    /// Backend failure.
    pub fn enqueue_outbound(&self, msg: &OutboundMessage) -> Result<(), StoreError> {
        self.kv
            .apply(vec![Op::Put(outbox_key(&msg.id), encode(msg)?)])?;
        self.kv.flush()
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
        self.kv.apply(vec![Op::Del(outbox_key(id))])
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
        self.kv.apply(ops)?;
        self.kv.flush()?;
        Ok(existed)
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
