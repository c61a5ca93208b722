//! The channel contract: what every chat platform adapter (HTTP API, terminal, Telegram, Slack,
//! Discord) implements and what the daemon's ingress/egress consume.
//!
//! This crate depends on neither the root `clawft` crate nor ractor: an adapter only pushes
//! [`InboundDelivery`]s into a channel and sends already-rendered [`OutboundMessage`]s.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub mod bounded;
pub mod command;
pub mod draft;
pub mod draft_journal;
pub mod media;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod text;

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Wraps a raw identifier.
            pub fn new(s: impl Into<String>) -> Self {
                Self(s.into())
            }
            /// The raw identifier.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

string_id!(
    /// A configured channel instance, e.g. `http`, `cli`, `telegram`.
    ChannelId
);
string_id!(
    /// A conversation on a platform (Telegram chat id, Slack channel id, HTTP `chat_id`).
    ChatId
);
string_id!(
    /// The sender of a message as the platform identifies them (ids, never usernames).
    UserId
);
string_id!(
    /// A thread inside a chat (Slack `thread_ts`, Telegram topic), when the platform has them.
    ThreadId
);
string_id!(
    /// The platform's own id of an inbound event: the dedupe key together with the channel.
    PlatformEventId
);

/// Who an inbound event comes from: a person on a channel, or the gateway itself. Carried
/// with the event through the journal and the turn, so nothing downstream guesses it from the
/// event id. Ingress refuses anything but [`Origin::User`] from a channel: only the gateway
/// makes the others.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Origin {
    /// A person wrote it on a channel (the only origin an adapter makes).
    #[default]
    User,
    /// A run of a scheduled job: a turn, or (`text`) a message delivered as it is.
    Scheduled {
        /// The run's id (job and occurrence): what the scheduler records its outcome under.
        run: String,
        /// Deliver the content as it is instead of running a turn.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        text: bool,
    },
    /// The periodic heartbeat check.
    Heartbeat,
    /// The result of a subagent, announced to the chat that started it.
    Subagent,
    /// A message another session handed this one (`sessions_send`).
    Session {
        /// The sending session's key.
        from: String,
    },
    /// A signed webhook delivery.
    Webhook {
        /// The hook's name.
        hook: String,
    },
}

impl Origin {
    /// Whether a person sent it. Only these can be chat commands, and only their replies
    /// answer an event (stream deltas, correlate with the request).
    pub fn is_user(&self) -> bool {
        matches!(self, Origin::User)
    }
}

/// One message a user sent, as an adapter saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboundEvent {
    /// Channel that received it.
    pub channel: ChannelId,
    /// Conversation it belongs to.
    pub chat: ChatId,
    /// Thread inside the conversation, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<ThreadId>,
    /// Who sent it.
    pub sender: UserId,
    /// Platform event id; `(channel, event_id)` is deduplicated by ingress.
    pub event_id: PlatformEventId,
    /// Text content as sent (sanitised later by ingress).
    pub content: String,
    /// Milliseconds since the Unix epoch when the adapter received it.
    pub received_at_ms: u64,
    /// Files attached to the message (photos, voice notes, documents), downloaded by the
    /// daemon when the turn starts. A message may be only attachments (`content` empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<media::MediaRef>,
    /// Who it comes from (adapters: always [`Origin::User`]).
    #[serde(default, skip_serializing_if = "Origin::is_user")]
    pub origin: Origin,
}

/// Default of the one inbound size limit of every channel (`channels.max_inbound_bytes`):
/// 32 KiB of UTF-8 text, about 8,000 tokens, far beyond what a person types into a chat.
pub const DEFAULT_MAX_INBOUND_BYTES: usize = 32 * 1024;

/// What the sender of a message over the inbound size limit is told, in the same chat, by every
/// channel (the HTTP API returns it with status 413).
pub fn oversized_notice(bytes: usize, limit: usize) -> String {
    format!(
        "Your message is {} KB, over the {} KB limit for one message, so it was not read. Send it in shorter parts, or as a link to the text.",
        bytes.div_ceil(1024),
        limit / 1024
    )
}

/// How ingress answered an inbound delivery. The adapter acknowledges the platform only after
/// [`Ack::Accepted`] or [`Ack::Duplicate`]: both mean the event is durably journaled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ack {
    /// Journaled (flushed to disk) and queued for its session.
    Accepted,
    /// Already journaled earlier (a platform retry); nothing new was queued.
    Duplicate,
    /// Refused (sender not allowed, invalid session id, shutting down). The text says why.
    Rejected(String),
}

/// An inbound event plus the port on which ingress reports that it is journaled.
#[derive(Debug)]
pub struct InboundDelivery {
    /// The event itself.
    pub event: InboundEvent,
    /// Answered once the event is journaled or refused. Dropping it is allowed.
    pub ack: Option<oneshot::Sender<Ack>>,
}

impl InboundDelivery {
    /// A delivery together with the receiver of its acknowledgement.
    pub fn new(event: InboundEvent) -> (Self, oneshot::Receiver<Ack>) {
        let (tx, rx) = oneshot::channel();
        (
            Self {
                event,
                ack: Some(tx),
            },
            rx,
        )
    }
}

/// Which messages in group chats (Telegram groups, Discord guild channels, Slack channels) an
/// adapter delivers. Direct messages are always delivered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupMode {
    /// Only messages that mention the bot or reply to it; the mention is stripped.
    #[default]
    Mention,
    /// Every message the bot can see.
    All,
}

/// What an outbound message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutboundKind {
    /// The final reply to one inbound event (or a proactive message). Journaled in the outbox.
    Final,
    /// A streamed fragment of text of a reply still being produced. Best effort, not journaled.
    Delta,
    /// Tool progress (a tool started/finished). Best effort, not journaled.
    Progress,
    /// The turn failed; `content` tells the user why. Journaled like `Final`.
    Error,
}

impl OutboundKind {
    /// Whether this kind is journaled in the outbox and retried until delivered.
    pub fn is_durable(self) -> bool {
        matches!(self, OutboundKind::Final | OutboundKind::Error)
    }
}

/// A message to send on a channel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboundMessage {
    /// Unique id of this outbound message (the idempotency key of the outbox).
    pub id: String,
    /// Channel to send on.
    pub channel: ChannelId,
    /// Conversation to send to.
    pub chat: ChatId,
    /// Thread, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<ThreadId>,
    /// The inbound event this answers, if any (HTTP correlates replies to requests with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<PlatformEventId>,
    /// What it is.
    pub kind: OutboundKind,
    /// Text (Markdown for `Final`).
    pub content: String,
    /// Structured extra data (tool progress details), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<serde_json::Value>,
    /// Files to send after the text (durable kinds only), in order. A retry of the same
    /// `id` must not resend the files already delivered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<media::OutboundFile>,
}

/// The `meta` of a [`OutboundKind::Delta`] that withdraws the text streamed so far for its
/// reply (the model's answer was cut off and is being asked for again): a draft restarts empty,
/// a client showing the deltas clears them. Its `content` is empty.
pub fn restart_meta() -> serde_json::Value {
    serde_json::json!({ "event": "restart" })
}

impl OutboundMessage {
    /// Whether this is a restart delta ([`restart_meta`]).
    pub fn is_restart(&self) -> bool {
        self.kind == OutboundKind::Delta
            && self
                .meta
                .as_ref()
                .and_then(|m| m.get("event"))
                .and_then(serde_json::Value::as_str)
                == Some("restart")
    }

    /// A durable message that answers no inbound event (pairing codes, approval questions, the
    /// `message` tool, `weft send`), with a fresh outbox id.
    pub fn proactive(
        channel: ChannelId,
        chat: ChatId,
        thread: Option<ThreadId>,
        content: String,
    ) -> Self {
        Self {
            id: uuid::Uuid::now_v7().to_string(),
            channel,
            chat,
            thread,
            in_reply_to: None,
            kind: OutboundKind::Final,
            content,
            meta: None,
            attachments: Vec::new(),
        }
    }
}

/// The platform's reference to a message it accepted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentRef(pub String);

/// What a platform supports beyond plain text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Accepts [`OutboundKind::Delta`] messages (streaming).
    pub streaming: bool,
    /// Wants [`OutboundKind::Progress`] messages.
    pub progress: bool,
    /// Longest message the platform accepts, in bytes of UTF-8.
    pub max_message_bytes: usize,
    /// Largest file it uploads, in bytes (0: it sends no files).
    pub max_upload_bytes: u64,
}

impl Default for Capabilities {
    fn default() -> Self {
        Self {
            streaming: false,
            progress: false,
            max_message_bytes: 4000,
            max_upload_bytes: 0,
        }
    }
}

/// ` (retry after 1.5 s)` for a wait the platform named, else nothing.
fn retry_note(after: Option<Duration>) -> String {
    after.map_or_else(String::new, |d| {
        format!(" (retry after {} s)", d.as_secs_f32())
    })
}

/// Why a channel operation failed, classified for the retry logic of the outbox.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// The platform asked us to slow down.
    #[error("rate limited{}", retry_note(*.retry_after))]
    RateLimited {
        /// How long the platform asked us to wait, if it said.
        retry_after: Option<Duration>,
    },
    /// A network or server error that may pass (5xx, connection reset).
    #[error("transient: {0}")]
    Transient(String),
    /// Credentials refused: retrying will not help; the operator must fix the token.
    #[error("authentication failed: {0}")]
    Auth(String),
    /// The message itself was refused (bad chat id, too long): retrying will not help.
    #[error("rejected: {0}")]
    Rejected(String),
    /// The recipient is gone (HTTP client disconnected). Dropping the message is right.
    #[error("recipient gone: {0}")]
    Gone(String),
    /// Anything else that is fatal for this adapter.
    #[error("{0}")]
    Fatal(String),
    /// The platform asked us to slow down on every chat of this bot (Discord's global rate
    /// limit): the whole channel pauses, not only the chat whose send got the answer.
    #[error("rate limited for every chat{}", retry_note(*.retry_after))]
    RateLimitedGlobal {
        /// How long the platform asked us to wait, if it said.
        retry_after: Option<Duration>,
    },
}

impl ChannelError {
    /// Whether sending again later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ChannelError::RateLimited { .. }
                | ChannelError::RateLimitedGlobal { .. }
                | ChannelError::Transient(_)
        )
    }

    /// The delay the platform asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ChannelError::RateLimited { retry_after }
            | ChannelError::RateLimitedGlobal { retry_after } => *retry_after,
            _ => None,
        }
    }

    /// A short stable name for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            ChannelError::RateLimited { .. } => "rate_limited",
            ChannelError::RateLimitedGlobal { .. } => "rate_limited_global",
            ChannelError::Transient(_) => "transient",
            ChannelError::Auth(_) => "auth",
            ChannelError::Rejected(_) => "rejected",
            ChannelError::Gone(_) => "gone",
            ChannelError::Fatal(_) => "fatal",
        }
    }
}

/// A chat platform adapter.
#[async_trait]
pub trait Channel: Send + Sync + 'static {
    /// The configured id of this channel instance.
    fn id(&self) -> &ChannelId;

    /// Optional platform capabilities.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// Push every inbound event into `tx` until `cancel` fires. Acknowledge the platform only
    /// after the delivery's ack says the event is journaled.
    ///
    /// # Errors
    /// Returns on a fatal error; the daemon restarts the adapter with backoff.
    async fn listen(
        &self,
        tx: mpsc::Sender<InboundDelivery>,
        cancel: CancellationToken,
    ) -> Result<(), ChannelError>;

    /// Send one message. Platform adapters render the Markdown `content` for their platform
    /// and split it under their length limit ([`text::split_markdown`]); a retry of the same
    /// `msg.id` must not resend chunks already delivered.
    ///
    /// # Errors
    /// A classified [`ChannelError`]; the outbox retries the retryable ones.
    async fn send(&self, msg: &OutboundMessage) -> Result<SentRef, ChannelError>;

    /// Show that the bot is working on a reply in `chat` (Telegram `sendChatAction`, Discord
    /// typing, ...). Called every few seconds while a turn runs; best effort.
    ///
    /// # Errors
    /// Ignored by the caller except for logging.
    async fn typing(&self, _chat: &ChatId, _thread: Option<&ThreadId>) -> Result<(), ChannelError> {
        Ok(())
    }

    /// How to download an attachment this adapter reported (Telegram asks `getFile`; Discord
    /// and Slack name the URL in the payload). Only the platform's own file hosts get its
    /// credentials; [`media::MediaRequest::trusted`] only for the configured API origin.
    ///
    /// # Errors
    /// The platform refused (file gone, too big for its bot API) or the adapter has no files.
    async fn media_request(
        &self,
        _media: &media::MediaRef,
    ) -> Result<media::MediaRequest, ChannelError> {
        Err(ChannelError::Rejected(
            "this channel does not download files".into(),
        ))
    }

    /// A one-line state for `weft status` (e.g. `connected as @bot`, `reconnecting: ...`).
    fn state(&self) -> String {
        "running".into()
    }

    /// The daemon is done with durable message `msg` for good: it was delivered (or refused
    /// permanently) and its removal from the outbox is on disk, so it will never be sent
    /// again. Adapters drop what they journaled to make a resend of it harmless (the draft's
    /// message id, the chunks delivered). Best effort.
    fn settled(&self, _msg: &OutboundMessage) {}
}

/// Small durable key-value state an adapter keeps across restarts (Telegram's update offset,
/// Discord's session id and sequence for RESUME). The daemon backs it with the store.
pub trait StateStore: Send + Sync + 'static {
    /// The value stored under `key`, if any.
    fn get(&self, key: &str) -> Option<String>;
    /// Store `value` under `key` durably (flushed before returning).
    ///
    /// # Errors
    /// The store failed.
    fn put(&self, key: &str, value: &str) -> Result<(), StateError>;
    /// Remove `key` durably. The default stores an empty value, which readers of journals
    /// treat as absent.
    ///
    /// # Errors
    /// The store failed.
    fn remove(&self, key: &str) -> Result<(), StateError> {
        self.put(key, "")
    }
}

/// A [`StateStore`] write that failed (the backing store's own error, as text: adapters only
/// log it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("state store: {0}")]
pub struct StateError(pub String);

/// A [`StateStore`] in memory (tests, and adapters run without a store).
#[derive(Debug, Default)]
pub struct MemoryState(std::sync::Mutex<std::collections::HashMap<String, String>>);

impl StateStore for MemoryState {
    fn get(&self, key: &str) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(key)
            .cloned()
    }
    fn put(&self, key: &str, value: &str) -> Result<(), StateError> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key.to_string(), value.to_string());
        Ok(())
    }
    fn remove(&self, key: &str) -> Result<(), StateError> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(key);
        Ok(())
    }
}

/// Milliseconds since the Unix epoch, for [`InboundEvent::received_at_ms`].
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod error_text_tests {
    use super::*;

    #[test]
    fn rate_limit_errors_read_as_text_not_debug() {
        let e = ChannelError::RateLimited {
            retry_after: Some(Duration::from_millis(1500)),
        };
        assert_eq!(e.to_string(), "rate limited (retry after 1.5 s)");
        let e = ChannelError::RateLimitedGlobal { retry_after: None };
        assert_eq!(e.to_string(), "rate limited for every chat");
    }
}
