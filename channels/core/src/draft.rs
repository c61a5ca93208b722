//! Streamed replies shown as one draft message, shared by the platform adapters (Telegram,
//! Discord, Slack, Matrix; Signal for its finals) through their one send path
//! ([`crate::send`]).
//!
//! The state machine lives in [`DraftBook`]; the platform supplies rendering and its API calls
//! through [`DraftPlatform`]:
//!
//! - The first [`OutboundKind::Delta`](crate::OutboundKind::Delta) of a reply (keyed by chat
//!   and `in_reply_to`, [`DraftKey`]) whose text shows something posts the draft
//!   ([`Slot::Draft`]); later deltas edit it, at most once per
//!   [`DraftOptions::edit_interval`] (measured from the start of the last attempt), never with
//!   the same preview twice, and not before a `retry_after` the platform asked for. Deltas
//!   without `in_reply_to` are ignored.
//! - The final reply ([`DraftBook::finish`]) edits the draft into its first chunk (a draft the
//!   platform says is gone is replaced by a new post) and posts the other chunks
//!   ([`Slot::Chunk`]). Progress per outbound id makes a retried final skip the chunks already
//!   delivered; a final already delivered sends nothing and answers the first message id again.
//! - Once the final has delivered its first chunk the draft is closed: later deltas for the
//!   same reply are dropped.
//! - A restart delta ([`OutboundMessage::is_restart`]) empties the draft's text: the next
//!   deltas replace what it shows instead of extending it.
//!
//! The draft's platform message id is kept explicitly ([`Draft::message_id`],
//! [`DraftBook::message_id`]).
//!
//! With a journal ([`DraftBook::with_journal`], [`crate::draft_journal`]) the draft's id and the
//! chunks delivered survive a restart: the replayed reply edits the journaled draft and skips
//! the journaled chunks; [`DraftBook::settled`] forgets them once the reply is never resent.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::bounded::BoundedMap;
use crate::draft_journal::DraftJournal;
use crate::lock::MutexExt;
use crate::{ChannelError, ChatId, OutboundMessage, PlatformEventId, SentRef};

/// Which message a reply's deltas and final belong to: the chat and the inbound event replied to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DraftKey {
    /// The conversation.
    pub chat: ChatId,
    /// The inbound event the reply answers.
    pub in_reply_to: PlatformEventId,
}

impl DraftKey {
    /// The key of `msg`, or `None` when it answers no inbound event (no draft then).
    pub fn of(msg: &OutboundMessage) -> Option<Self> {
        msg.in_reply_to.as_ref().map(|r| Self {
            chat: msg.chat.clone(),
            in_reply_to: r.clone(),
        })
    }
}

/// What a post is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// The draft of a streamed reply (no idempotency nonce: it is best effort).
    Draft,
    /// Chunk `i` of a final reply (chunk 0 is the one that quotes the user, where a platform
    /// does that).
    Chunk(usize),
}

/// How an edit went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edited {
    /// The message shows the new text (or already did).
    Done,
    /// The message can no longer be edited (deleted by the user): post instead.
    Gone,
}

/// The platform side of a draft: rendering and the post/edit calls. Built per outbound message
/// by the adapter, so it carries that message's target (chat, thread, reply-to, outbound id).
#[async_trait]
pub trait DraftPlatform: Send + Sync {
    /// The platform's message id (Telegram `message_id`, Discord snowflake, Slack `ts`).
    type Id: Clone + fmt::Display + Send + Sync + 'static;
    /// Rendered text, ready to post.
    type Text: PartialEq + Send + Sync + 'static;

    /// What the draft shows for the Markdown received so far; `None` when it would show
    /// nothing (nothing is posted then).
    fn preview(&self, markdown: &str) -> Option<Self::Text>;

    /// What a draft becomes when the final reply renders to nothing; `None` leaves the draft
    /// as it is.
    fn empty_final(&self) -> Option<Self::Text> {
        None
    }

    /// Post a new message. `Ok(None)`: delivered, but the platform's answer did not say its id.
    ///
    /// # Errors
    /// The classified failure.
    async fn post(&self, slot: Slot, text: &Self::Text) -> Result<Option<Self::Id>, ChannelError>;

    /// Edit message `id` to show `text`.
    ///
    /// # Errors
    /// The classified failure.
    async fn edit(&self, id: &Self::Id, text: &Self::Text) -> Result<Edited, ChannelError>;
}

/// Settings of a [`DraftBook`].
#[derive(Clone, Debug)]
pub struct DraftOptions {
    /// Least time between the starts of two attempts to show a draft.
    pub edit_interval: Duration,
    /// How many drafts, finished replies and outbound progress entries are remembered (each).
    pub capacity: usize,
    /// Append a delta whose outbound id was already appended only once (a retried delta).
    pub skip_repeated_deltas: bool,
}

impl Default for DraftOptions {
    fn default() -> Self {
        Self {
            edit_interval: Duration::from_millis(1500),
            capacity: 1024,
            skip_repeated_deltas: false,
        }
    }
}

/// One streamed reply being shown as a draft message.
#[derive(Debug)]
pub struct Draft<Id, T> {
    /// The platform id of the draft message, once posted.
    pub message_id: Option<Id>,
    /// Markdown received so far.
    pub text: String,
    /// What the draft message shows now (identical edits are skipped).
    pub shown: Option<T>,
    /// When the last post or edit was attempted.
    pub last_attempt: Option<Instant>,
    /// The platform asked us to wait (rate limit) until then.
    pub paused_until: Option<Instant>,
    /// The final reply took the draft over: deltas no longer touch it.
    pub closed: bool,
    /// Outbound ids of the deltas appended (with [`DraftOptions::skip_repeated_deltas`]).
    seen: HashSet<String>,
}

impl<Id, T> Default for Draft<Id, T> {
    fn default() -> Self {
        Self {
            message_id: None,
            text: String::new(),
            shown: None,
            last_attempt: None,
            paused_until: None,
            closed: false,
            seen: HashSet::new(),
        }
    }
}

type Shared<Id, T> = Arc<tokio::sync::Mutex<Draft<Id, T>>>;

struct Book<Id, T> {
    drafts: BoundedMap<DraftKey, Shared<Id, T>>,
    /// Replies whose final took the draft over: late deltas are dropped.
    finished: BoundedMap<DraftKey, ()>,
    /// Outbound id of a final → ids of the chunks delivered, in order.
    progress: BoundedMap<String, Vec<Option<Id>>>,
}

/// The drafts of one adapter and the delivery progress of its final replies.
pub struct DraftBook<Id, T> {
    opts: DraftOptions,
    book: Mutex<Book<Id, T>>,
    journal: Option<DraftJournal>,
}

impl<Id, T> fmt::Debug for DraftBook<Id, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DraftBook")
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl<Id, T> DraftBook<Id, T>
where
    Id: Clone + fmt::Display + std::str::FromStr + Send + Sync + 'static,
    T: PartialEq + Send + Sync + 'static,
{
    /// An empty book.
    pub fn new(opts: DraftOptions) -> Self {
        let cap = opts.capacity;
        Self {
            opts,
            book: Mutex::new(Book {
                drafts: BoundedMap::new(cap),
                finished: BoundedMap::new(cap),
                progress: BoundedMap::new(cap),
            }),
            journal: None,
        }
    }

    /// Journal draft ids and delivered chunks in `state`, so a reply resent after a restart
    /// edits what was posted instead of posting again.
    #[must_use]
    pub fn with_journal(mut self, state: std::sync::Arc<dyn crate::StateStore>) -> Self {
        self.journal = Some(DraftJournal::new(state));
        self
    }

    /// `msg` will never be sent again (the daemon's [`crate::Channel::settled`]): forget what
    /// was journaled for it.
    pub fn settled(&self, msg: &OutboundMessage) {
        if let Some(j) = &self.journal {
            j.settle(msg);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Book<Id, T>> {
        self.book.locked()
    }

    /// The platform message id of the open draft under `key`, if one was posted.
    pub async fn message_id(&self, key: &DraftKey) -> Option<Id> {
        let draft = self.lock().drafts.get(key).cloned()?;
        let d = draft.lock().await;
        d.message_id.clone()
    }

    /// Append a streamed fragment to its draft and show it when due. Answers the draft's
    /// message id ([`SentRef::Nothing`] before it is posted, or when the fragment was dropped).
    ///
    /// # Errors
    /// The platform's failure to post or edit (the text stays appended; a `retry_after` pauses
    /// the draft until then).
    pub async fn delta<P>(
        &self,
        platform: &P,
        msg: &OutboundMessage,
    ) -> Result<SentRef, ChannelError>
    where
        P: DraftPlatform<Id = Id, Text = T>,
    {
        let Some(key) = DraftKey::of(msg) else {
            return Ok(SentRef::Nothing);
        };
        let draft = {
            let mut book = self.lock();
            if book.finished.contains_key(&key) {
                // A late fragment of a reply already delivered.
                return Ok(SentRef::Nothing);
            }
            match book.drafts.get(&key) {
                Some(d) => d.clone(),
                None => {
                    // A draft posted before a restart is edited, not posted again.
                    let d: Shared<Id, T> = Arc::new(tokio::sync::Mutex::new(Draft {
                        message_id: self.journal.as_ref().and_then(|j| j.draft(&key)),
                        ..Draft::default()
                    }));
                    book.drafts.insert(key.clone(), d.clone());
                    d
                }
            }
        };
        let mut d = draft.lock().await;
        if d.closed {
            return Ok(SentRef::Nothing);
        }
        if msg.is_restart() {
            // The text so far is withdrawn; the next deltas show the new attempt.
            d.text.clear();
        } else if !self.opts.skip_repeated_deltas || d.seen.insert(msg.id.clone()) {
            d.text.push_str(msg.text());
        }
        let now = Instant::now();
        let due = d.message_id.is_none()
            || d.last_attempt
                .is_none_or(|t| now.duration_since(t) >= self.opts.edit_interval);
        if !due || d.paused_until.is_some_and(|t| now < t) {
            return Ok(SentRef::of(d.message_id.as_ref()));
        }
        let Some(preview) = platform.preview(&d.text) else {
            return Ok(SentRef::of(d.message_id.as_ref()));
        };
        if d.shown.as_ref() == Some(&preview) {
            return Ok(SentRef::of(d.message_id.as_ref()));
        }
        d.last_attempt = Some(now);
        let r = match d.message_id.clone() {
            // A draft the user deleted keeps its id: the final reply replaces it.
            Some(id) => platform.edit(&id, &preview).await.map(|_| Some(id)),
            None => {
                let posted = platform.post(Slot::Draft, &preview).await;
                if let (Ok(Some(id)), Some(j)) = (&posted, &self.journal) {
                    j.set_draft(&key, id);
                }
                posted
            }
        };
        match r {
            Ok(id) => {
                d.message_id = id;
                d.shown = Some(preview);
                Ok(SentRef::of(d.message_id.as_ref()))
            }
            Err(e) => {
                if let Some(wait) = e.retry_after() {
                    d.paused_until = Some(now + wait);
                }
                Err(e)
            }
        }
    }

    /// Deliver the final reply `chunks` (already rendered and split by the platform): the
    /// first edits the reply's draft, if there is one, the others are posted. Chunks
    /// delivered by an earlier attempt with the same `msg.id` are skipped. Answers the first
    /// chunk's message id.
    ///
    /// # Errors
    /// The platform's failure; the chunks delivered so far are remembered for the retry.
    pub async fn finish<P>(
        &self,
        platform: &P,
        msg: &OutboundMessage,
        mut chunks: Vec<T>,
    ) -> Result<SentRef, ChannelError>
    where
        P: DraftPlatform<Id = Id, Text = T>,
    {
        let key = DraftKey::of(msg);
        let draft = key
            .as_ref()
            .and_then(|k| self.lock().drafts.get(k).cloned());
        // Wait for a draft post or edit in flight, then hold the draft.
        let mut guard = match &draft {
            Some(d) => Some(d.lock().await),
            None => None,
        };
        let draft_id = match &guard {
            Some(d) => (!d.closed).then(|| d.message_id.clone()).flatten(),
            // No draft in memory: one journaled before a restart, if any.
            None => self
                .journal
                .as_ref()
                .zip(key.as_ref())
                .and_then(|(j, k)| j.draft(k)),
        };
        if chunks.is_empty() {
            if let (Some(_), Some(t)) = (&draft_id, platform.empty_final()) {
                chunks.push(t);
            }
        }
        let remembered = self.lock().progress.get(&msg.id).cloned();
        let mut delivered = remembered
            .or_else(|| self.journal.as_ref().and_then(|j| j.chunks(&msg.id)))
            .unwrap_or_default();
        for (i, chunk) in chunks.iter().enumerate().skip(delivered.len()) {
            let id = match (&draft_id, i) {
                (Some(id), 0) => match platform.edit(id, chunk).await? {
                    Edited::Done => Some(id.clone()),
                    Edited::Gone => platform.post(Slot::Chunk(0), chunk).await?,
                },
                _ => platform.post(Slot::Chunk(i), chunk).await?,
            };
            delivered.push(id);
            if let Some(j) = &self.journal {
                j.set_chunks(&msg.id, &delivered);
            }
            self.lock()
                .progress
                .insert(msg.id.clone(), delivered.clone());
            if i == 0 {
                self.close(key.as_ref(), guard.as_deref_mut());
            }
        }
        self.close(key.as_ref(), guard.as_deref_mut());
        Ok(SentRef::of(delivered.first().and_then(Option::as_ref)))
    }

    /// The final took the reply over: the draft is closed and forgotten, late deltas dropped.
    fn close(&self, key: Option<&DraftKey>, draft: Option<&mut Draft<Id, T>>) {
        if let Some(d) = draft {
            d.closed = true;
        }
        if let Some(k) = key {
            let mut book = self.lock();
            book.drafts.remove(k);
            book.finished.insert(k.clone(), ());
        }
    }
}

#[cfg(test)]
#[path = "draft_tests.rs"]
mod tests;
