//! The HTTP chats' mailbox and reply record.
//!
//! A message for an HTTP chat that no request is waiting for (a reminder, a `message` send,
//! `weft send`, a subagent's report, an approval question, a reply whose request was cut off)
//! is kept in the chat's mailbox until the reader acknowledges it: `GET
//! /v1/chats/{chat_id}/messages` returns what is there, oldest first, each with a `seq`, and
//! `?after=SEQ` acknowledges everything up to `SEQ` (it is removed) before returning the rest.
//! The final reply to a request is also recorded under its `event_id`, so a client that resends
//! a request after a crash (its own or the gateway's) gets the reply instead of a conflict.
//!
//! The daemon backs both with its store ([`MailStore`]); writes are applied at once and made
//! durable by the flush that settles the message in the outbox, so a message the outbox counts
//! as delivered is on disk.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use clawft_channel_core::lock::MutexExt;
use clawft_channel_core::StateError;
use serde::{Deserialize, Serialize};

/// One message kept for an HTTP chat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailEntry {
    /// Position in the chat's mailbox (increasing; 0 in the reply record).
    #[serde(default)]
    pub seq: u64,
    /// The outbound message's id.
    pub id: String,
    /// `final`, `error`, ...
    pub kind: String,
    /// The text.
    pub content: String,
    /// The request it answers, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<String>,
    /// When it was kept (milliseconds since the epoch).
    #[serde(default)]
    pub at_ms: u64,
}

/// Where the mailbox lives. Errors are the backing store's (a [`StateError`], like the
/// adapters' own state).
pub trait MailStore: Send + Sync + 'static {
    /// Append `entry` to `chat`'s mailbox (its `seq` is assigned here, and returned). The oldest
    /// entries beyond `keep` are dropped. A message already there (same `id`: the outbox sends
    /// it again after a crash) is kept once, with its first `seq`.
    ///
    /// # Errors
    /// The store failed.
    fn append(&self, chat: &str, entry: MailEntry, keep: usize) -> Result<u64, StateError>;
    /// Up to `limit` entries of `chat` with `seq > after`, oldest first.
    ///
    /// # Errors
    /// The store failed.
    fn list(&self, chat: &str, after: u64, limit: usize) -> Result<Vec<MailEntry>, StateError>;
    /// Remove the entries of `chat` with `seq <= upto`.
    ///
    /// # Errors
    /// The store failed.
    fn ack(&self, chat: &str, upto: u64) -> Result<(), StateError>;
    /// Record the final reply to request `event_id`.
    ///
    /// # Errors
    /// The store failed.
    fn put_reply(&self, event_id: &str, entry: &MailEntry) -> Result<(), StateError>;
    /// The recorded reply to request `event_id`.
    fn reply(&self, event_id: &str) -> Option<MailEntry>;
}

/// A [`MailStore`] in memory (tests; a channel run without a store).
#[derive(Default)]
pub struct MemoryMail {
    inner: Mutex<MemInner>,
}

#[derive(Default)]
struct MemInner {
    next: u64,
    chats: HashMap<String, BTreeMap<u64, MailEntry>>,
    replies: HashMap<String, MailEntry>,
}

impl MailStore for MemoryMail {
    fn append(&self, chat: &str, mut entry: MailEntry, keep: usize) -> Result<u64, StateError> {
        let mut g = self.inner.locked();
        if let Some(e) = g
            .chats
            .get(chat)
            .and_then(|mb| mb.values().find(|e| e.id == entry.id))
        {
            return Ok(e.seq);
        }
        g.next += 1;
        let seq = g.next;
        entry.seq = seq;
        let mb = g.chats.entry(chat.to_string()).or_default();
        mb.insert(seq, entry);
        while mb.len() > keep {
            mb.pop_first();
        }
        Ok(seq)
    }
    fn list(&self, chat: &str, after: u64, limit: usize) -> Result<Vec<MailEntry>, StateError> {
        let g = self.inner.locked();
        Ok(g.chats
            .get(chat)
            .map(|mb| {
                mb.range(after.saturating_add(1)..)
                    .take(limit)
                    .map(|(_, e)| e.clone())
                    .collect()
            })
            .unwrap_or_default())
    }
    fn ack(&self, chat: &str, upto: u64) -> Result<(), StateError> {
        let mut g = self.inner.locked();
        if let Some(mb) = g.chats.get_mut(chat) {
            mb.retain(|seq, _| *seq > upto);
        }
        Ok(())
    }
    fn put_reply(&self, event_id: &str, entry: &MailEntry) -> Result<(), StateError> {
        self.inner
            .locked()
            .replies
            .insert(event_id.to_string(), entry.clone());
        Ok(())
    }
    fn reply(&self, event_id: &str) -> Option<MailEntry> {
        self.inner.locked().replies.get(event_id).cloned()
    }
}
