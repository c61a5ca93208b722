//! What a [`DraftBook`](crate::draft::DraftBook) writes down so that a reply resent after a
//! crash edits the messages it already posted instead of posting new ones.
//!
//! Two kinds of entries, in the adapter's [`StateStore`] (durable: flushed before `put`
//! returns):
//!
//! - `draft:<chat>:<in_reply_to>` → the platform message id of the streamed draft of that
//!   reply, written as soon as the draft is posted. After a restart the deltas of the replayed
//!   turn and the final reply edit that message.
//! - `sent:<outbound id>` → the platform ids of the chunks of that final reply delivered so
//!   far (JSON array, `null` where the platform did not say), written after each chunk. A
//!   resend skips them; a final whose chunks were all delivered sends nothing.
//!
//! - `files:<outbound id>` → how many of that reply's attachments were delivered, written
//!   after each upload. A resend uploads only the others.
//!
//! All are removed when the daemon reports the reply settled ([`Channel::settled`]: its
//! removal from the outbox is on disk, so it is never resent), so the journal holds only the
//! replies in flight.
//!
//! [`Channel::settled`]: crate::Channel::settled

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::draft::DraftKey;
use crate::{OutboundMessage, StateStore};

/// The durable side of a [`DraftBook`](crate::draft::DraftBook).
#[derive(Clone)]
pub struct DraftJournal {
    state: Arc<dyn StateStore>,
}

impl fmt::Debug for DraftJournal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DraftJournal").finish_non_exhaustive()
    }
}

fn draft_key(key: &DraftKey) -> String {
    format!("draft:{}:{}", key.chat, key.in_reply_to)
}

fn sent_key(outbound: &str) -> String {
    format!("sent:{outbound}")
}

fn files_key(outbound: &str) -> String {
    format!("files:{outbound}")
}

impl DraftJournal {
    /// A journal over `state`.
    pub fn new(state: Arc<dyn StateStore>) -> Self {
        Self { state }
    }

    fn get(&self, key: &str) -> Option<String> {
        self.state.get(key).filter(|v| !v.is_empty())
    }

    fn put(&self, key: &str, value: &str) {
        if let Err(e) = self.state.put(key, value) {
            tracing_warn(&format!("could not journal {key}: {e}"));
        }
    }

    /// The journaled draft message id of reply `key`.
    pub fn draft<Id: FromStr>(&self, key: &DraftKey) -> Option<Id> {
        self.get(&draft_key(key))?.parse().ok()
    }

    /// Journal the draft message id of reply `key`.
    pub fn set_draft(&self, key: &DraftKey, id: &impl fmt::Display) {
        self.put(&draft_key(key), &id.to_string());
    }

    /// The journaled chunks delivered of final `outbound`.
    pub fn chunks<Id: FromStr>(&self, outbound: &str) -> Option<Vec<Option<Id>>> {
        let v: Vec<Option<String>> = serde_json::from_str(&self.get(&sent_key(outbound))?).ok()?;
        Some(
            v.into_iter()
                .map(|id| id.and_then(|s| s.parse().ok()))
                .collect(),
        )
    }

    /// Journal the chunks delivered of final `outbound`.
    pub fn set_chunks<Id: fmt::Display>(&self, outbound: &str, ids: &[Option<Id>]) {
        let v: Vec<Option<String>> = ids
            .iter()
            .map(|i| i.as_ref().map(ToString::to_string))
            .collect();
        match serde_json::to_string(&v) {
            Ok(s) => self.put(&sent_key(outbound), &s),
            Err(e) => tracing_warn(&format!("could not encode the chunks of {outbound}: {e}")),
        }
    }

    /// How many of the attachments of final `outbound` were delivered (in order).
    pub fn files_sent(&self, outbound: &str) -> usize {
        self.get(&files_key(outbound))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// Journal that the first `n` attachments of final `outbound` were delivered.
    pub fn set_files_sent(&self, outbound: &str, n: usize) {
        self.put(&files_key(outbound), &n.to_string());
    }

    /// `msg` will never be sent again: forget its entries.
    pub fn settle(&self, msg: &OutboundMessage) {
        let mut keys = vec![sent_key(&msg.id), files_key(&msg.id)];
        if let Some(k) = DraftKey::of(msg) {
            keys.push(draft_key(&k));
        }
        for k in keys {
            if self.state.get(&k).is_some_and(|v| !v.is_empty()) {
                if let Err(e) = self.state.remove(&k) {
                    tracing_warn(&format!("could not remove {k}: {e}"));
                }
            }
        }
    }
}

fn tracing_warn(what: &str) {
    tracing::warn!("draft journal: {what}");
}
