//! The one send path of the chat adapters that post and edit messages (Telegram, Discord,
//! Slack, Matrix, Signal): what [`Channel::send`](crate::Channel::send) does with an outbound
//! message, whatever the platform. The platform plugs in its rendering and its calls (`post`,
//! `edit`, `send_file`) through [`SendPlatform`], built per message by the adapter.
//!
//! - A kind the channel does not take ([`Capabilities::takes`]: deltas without streaming,
//!   tool progress) sends nothing; the outbox does not route those either, this keeps a direct
//!   caller to the same rule. No chat platform shows tool progress.
//! - A delta (or a restart) of a reply goes to the reply's draft ([`DraftBook::delta`]); one
//!   that answers no inbound event sends nothing.
//! - A final reply (or error) is rendered and split by the platform
//!   ([`SendPlatform::render`]) and delivered over the draft ([`DraftBook::finish`]), then its
//!   attachments not sent yet, in order, each counted in the journal as soon as it is delivered
//!   ([`send_files`]), so a resend uploads only the others.
//! - It answers the first message of the text, else the first file's.
//!
//! It does not retry (the outbox does, by the error's kind) and keeps nothing besides the
//! draft book and the journal (both in the adapter's [`StateStore`]).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;

use crate::draft::{DraftBook, DraftOptions, DraftPlatform};
use crate::draft_journal::DraftJournal;
use crate::media::OutboundFile;
use crate::{Capabilities, ChannelError, OutboundKind, OutboundMessage, SentRef, StateStore};

/// Where a reply's attachments go, one at a time (the platform's upload). Built per outbound
/// message, so it knows the message's chat, thread and the event it answers.
#[async_trait]
pub trait SendFiles: Send + Sync {
    /// Deliver attachment number `index` of the reply (a file over the platform's limit
    /// becomes a short note in the chat). `first`: nothing of the reply went before it, so it
    /// is the message that answers the user (quotes them, where the platform does that).
    ///
    /// # Errors
    /// The classified failure; the files delivered before it stay counted.
    async fn send_file(
        &self,
        index: usize,
        file: &OutboundFile,
        first: bool,
    ) -> Result<SentRef, ChannelError>;
}

/// The platform side of the send path: rendering plus the post, edit and upload calls.
pub trait SendPlatform: DraftPlatform + SendFiles {
    /// A final reply's Markdown, rendered and split under the platform's limit (empty chunks
    /// left out).
    fn render(&self, markdown: &str) -> Vec<Self::Text>;
}

/// The drafts and delivery journal of one adapter, and the send path over them.
pub struct SendPath<Id, T> {
    drafts: DraftBook<Id, T>,
    /// How many attachments of each final reply were delivered (`files:<id>`).
    files: DraftJournal,
}

impl<Id, T> fmt::Debug for SendPath<Id, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendPath")
            .field("drafts", &self.drafts)
            .finish_non_exhaustive()
    }
}

impl<Id, T> SendPath<Id, T>
where
    Id: Clone + fmt::Display + FromStr + Send + Sync + 'static,
    T: PartialEq + Send + Sync + 'static,
{
    /// Drafts kept by `opts`; draft ids, chunks and files delivered journaled in `state`, so
    /// a reply resent after a restart edits and skips what was delivered.
    pub fn new(opts: DraftOptions, state: Arc<dyn StateStore>) -> Self {
        Self {
            drafts: DraftBook::new(opts).with_journal(state.clone()),
            files: DraftJournal::new(state),
        }
    }

    /// Send `msg` on a channel with `caps`; `target` builds the platform side for it (only
    /// when something is to be sent, so a message nothing is sent for is never refused).
    ///
    /// # Errors
    /// `target`'s refusal, or the platform's classified failure; what was delivered before
    /// it is journaled, so the outbox's retry resends only the rest.
    pub async fn send<P, F>(
        &self,
        caps: &Capabilities,
        msg: &OutboundMessage,
        target: F,
    ) -> Result<SentRef, ChannelError>
    where
        P: SendPlatform<Id = Id, Text = T>,
        F: FnOnce() -> Result<P, ChannelError> + Send,
    {
        let kind = msg.kind();
        if !caps.takes(kind) {
            return Ok(SentRef::Nothing);
        }
        match kind {
            // A line per tool call would flood a chat: no chat platform shows progress.
            OutboundKind::Progress => Ok(SentRef::Nothing),
            // Deltas belong to a reply; without one there is nothing to stream into.
            OutboundKind::Delta if msg.in_reply_to.is_none() => Ok(SentRef::Nothing),
            OutboundKind::Delta => self.drafts.delta(&target()?, msg).await,
            OutboundKind::Final | OutboundKind::Error => {
                let platform = target()?;
                let chunks = platform.render(msg.text());
                let sent = self.drafts.finish(&platform, msg, chunks).await?;
                let first_file = send_files(&self.files, &platform, msg, sent.is_nothing()).await?;
                Ok(sent.or(first_file))
            }
        }
    }

    /// `msg` will never be sent again ([`crate::Channel::settled`]): forget what was journaled
    /// for it.
    pub fn settled(&self, msg: &OutboundMessage) {
        self.drafts.settled(msg);
    }
}

/// Deliver the attachments of final `msg` not delivered yet, in order, journaling the count
/// after each one (so a resend delivers only the others). `nothing_before`: no text of the
/// reply was delivered, so the first attachment is the message that answers the user.
/// Answers the first file delivered by this call, if the platform said its id.
///
/// # Errors
/// The first file's failure; the files before it stay counted.
pub async fn send_files<P: SendFiles + ?Sized>(
    journal: &DraftJournal,
    platform: &P,
    msg: &OutboundMessage,
    nothing_before: bool,
) -> Result<SentRef, ChannelError> {
    if msg.attachments.is_empty() {
        return Ok(SentRef::Nothing);
    }
    let mut first = SentRef::Nothing;
    let done = journal.files_sent(&msg.id);
    for (i, file) in msg.attachments.iter().enumerate().skip(done) {
        let sent = platform
            .send_file(i, file, nothing_before && i == 0)
            .await?;
        journal.set_files_sent(&msg.id, i + 1);
        first = first.or(sent);
    }
    Ok(first)
}

#[cfg(test)]
#[path = "send_tests.rs"]
mod tests;
