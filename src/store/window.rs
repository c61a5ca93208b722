//! The compaction record of a session: the summary of its older messages and the transcript
//! sequence number where the prompt window starts. Compaction never deletes transcript
//! records; it only moves this mark (docs/architecture.md, "Prompt window and compaction").

use serde::{Deserialize, Serialize};

use super::kv::Op;
use super::{decode, encode, session_meta_key, transcript_prefix, Store, StoreError};
use crate::llm::Message;
use crate::types::SessionKey;

/// Where a session's prompt window starts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compaction {
    /// The summary of every message before `from_seq` (and of earlier summaries).
    pub summary: String,
    /// Transcript sequence number of the first message of the window.
    pub from_seq: u64,
    /// Tool results of messages before this sequence number are shortened in the window (they
    /// were kept verbatim at compaction time but shortened).
    pub shortened_until: u64,
    /// Messages summarised so far, over all compactions.
    pub summarised: u64,
    /// How many compactions this session has had.
    pub count: u64,
}

pub(super) fn window_key(s: &SessionKey) -> Vec<u8> {
    let mut k = b"w\0".to_vec();
    k.extend(s.to_store_key());
    k
}

impl Store {
    /// The session's compaction record, if it was ever compacted.
    ///
    /// # Errors
    /// Backend failure or a corrupt record.
    pub fn compaction(&self, session: &SessionKey) -> Result<Option<Compaction>, StoreError> {
        let k = window_key(session);
        self.kv.get(&k)?.map(|v| decode(&k, &v)).transpose()
    }

    /// Record a compaction; the ticket resolves once it is durable.
    ///
    /// # Errors
    /// Backend failure.
    pub fn put_compaction(
        &self,
        session: &SessionKey,
        c: &Compaction,
    ) -> Result<super::FlushTicket, StoreError> {
        self.apply(vec![Op::Put(window_key(session), encode(c)?)])?;
        Ok(self.flush_ticket())
    }

    /// Next transcript sequence number of a session (= messages ever appended).
    ///
    /// # Errors
    /// Backend failure or a corrupt record.
    pub fn next_seq(&self, session: &SessionKey) -> Result<u64, StoreError> {
        let k = session_meta_key(session);
        Ok(match self.kv.get(&k)? {
            Some(v) => decode::<super::SessionMeta>(&k, &v)?.next_seq,
            None => 0,
        })
    }

    /// The transcript from sequence number `from` on, in order (only those records are
    /// decoded).
    ///
    /// # Errors
    /// Backend failure or corrupt records.
    pub fn load_transcript_from(
        &self,
        session: &SessionKey,
        from: u64,
    ) -> Result<Vec<(u64, Message)>, StoreError> {
        let prefix = transcript_prefix(session);
        let mut out = Vec::new();
        for (k, v) in self.kv.scan_prefix(&prefix)? {
            let seq = k
                .get(prefix.len()..)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map_or(0, u64::from_be_bytes);
            if seq >= from {
                out.push((seq, decode(&k, &v)?));
            }
        }
        Ok(out)
    }
}
