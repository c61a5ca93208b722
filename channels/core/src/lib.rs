//! The channel contract: what every chat platform adapter (HTTP API, terminal, Telegram, Slack,
//! Discord) implements and what the daemon's ingress/egress consume.
//!
//! This crate depends on neither the root `clawft` crate nor ractor: an adapter only pushes
//! [`InboundDelivery`]s into a channel and sends already-rendered [`OutboundMessage`]s. A
//! platform crate describes itself to the gateway through [`spec`] (its settings, constructor,
//! resume keys and doctor check).

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::lock::MutexExt;

pub mod backoff;
pub mod bounded;
pub mod command;
pub mod draft;
pub mod draft_journal;
pub mod lock;
pub mod media;
pub mod secret;
pub mod send;
pub mod spec;
#[cfg(feature = "tls")]
pub mod stream;
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

/// The gateway's own surfaces, which are channels too but not chat platforms: the terminal
/// (`cli`), the HTTP API (`http`) and the control UI's web chat (`web`). Their channel ids
/// are fixed; everything that treats one of them specially asks [`ChannelId::surface`]
/// instead of comparing ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Surface {
    /// The terminal: `weft agent` in process, or through a gateway's HTTP API with the
    /// control token. Its messages are the operator's.
    Terminal,
    /// The HTTP API (`/v1/chat`, the OpenAI-compatible endpoint).
    Http,
    /// The control UI's web chat.
    Web,
}

impl Surface {
    /// Its channel id.
    pub const fn id(self) -> &'static str {
        match self {
            Surface::Terminal => "cli",
            Surface::Http => "http",
            Surface::Web => "web",
        }
    }

    /// Its channel id as a [`ChannelId`].
    pub fn channel(self) -> ChannelId {
        ChannelId::new(self.id())
    }

    /// The surface whose channel id is `id`, if any.
    pub fn of(id: &str) -> Option<Surface> {
        [Surface::Terminal, Surface::Http, Surface::Web]
            .into_iter()
            .find(|s| s.id() == id)
    }
}

impl ChannelId {
    /// Which of the gateway's own surfaces this channel is (`None`: a chat platform).
    pub fn surface(&self) -> Option<Surface> {
        Surface::of(&self.0)
    }
}

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
    /// The sender's display name as the platform gives it (Telegram's first and last name,
    /// Discord's global name, Matrix's displayname, an email's From name…), cleaned by
    /// [`display_name`]. Shown to the operator next to the id; never used for access,
    /// routing or anything that grants authority (anyone can choose any name). Absent in
    /// events stored before it existed and on platforms that do not give one cheaply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender_name: Option<String>,
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

/// The longest display name kept, in characters (a longer one is cut, with `…`).
pub const MAX_DISPLAY_NAME_CHARS: usize = 64;

/// A platform's display name as it is kept for [`InboundEvent::sender_name`]: the non-empty
/// parts joined by a space, control characters (newlines, bidi overrides included) dropped,
/// runs of blanks folded to one space, cut at [`MAX_DISPLAY_NAME_CHARS`]. `None` when nothing
/// is left. A name is decoration for the operator only: it never grants anything.
pub fn display_name<'a>(parts: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let mut out = String::new();
    for part in parts {
        for word in part
            .split(|c: char| c.is_whitespace() || c.is_control() || is_format_char(c))
            .filter(|w| !w.is_empty())
        {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(word);
        }
    }
    if out.chars().count() > MAX_DISPLAY_NAME_CHARS {
        out = out.chars().take(MAX_DISPLAY_NAME_CHARS - 1).collect();
        out.push('…');
    }
    (!out.is_empty()).then_some(out)
}

/// Invisible formatting characters a name could use to look like another text (bidi
/// overrides and isolates, zero-width characters).
fn is_format_char(c: char) -> bool {
    matches!(c, '\u{200B}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
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
    /// Not stored, because the gateway cannot store anything now (a full disk, a failed
    /// store): the adapter must not acknowledge the platform, so the event is delivered again
    /// later. The text says why, in a sentence for the user.
    Unavailable(String),
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
///
/// Stored in the outbox as it always was (`kind`, `content` and an optional `meta` object):
/// [`OutboundBody`] is converted to and from that form at the serde boundary only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "WireOutbound", into = "WireOutbound")]
pub struct OutboundMessage {
    /// Unique id of this outbound message (the idempotency key of the outbox).
    pub id: String,
    /// Channel to send on.
    pub channel: ChannelId,
    /// Conversation to send to.
    pub chat: ChatId,
    /// Thread, if any.
    pub thread: Option<ThreadId>,
    /// The inbound event this answers, if any (HTTP correlates replies to requests with it).
    pub in_reply_to: Option<PlatformEventId>,
    /// What it carries.
    pub body: OutboundBody,
    /// Files to send after the text (durable kinds only), in order. A retry of the same
    /// `id` must not resend the files already delivered.
    pub attachments: Vec<media::OutboundFile>,
}

/// What an outbound message carries. Durable bodies ([`OutboundKind::is_durable`]) are
/// journaled in the outbox and retried until delivered; the others are best effort and reach
/// only channels whose [`Capabilities`] take them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutboundBody {
    /// A final text (Markdown): the answer to an inbound event, or a message that answers none
    /// (the `message` tool, `weft send`, a reminder, a pairing code, a notice).
    Reply {
        /// The text.
        text: String,
        /// The tokens of the turn that produced it, for clients that report them.
        usage: Option<Usage>,
    },
    /// A question asking the user to approve a command (durable, like a reply).
    Approval {
        /// The question as the chat shows it (with the `/approve ID` and `/deny ID` to type).
        text: String,
        /// What is asked, for clients that offer buttons.
        ask: ApprovalAsk,
    },
    /// The turn (or a command) failed; the text tells the user why (durable).
    Error {
        /// The reason, for the user.
        text: String,
        /// What kind of failure, for clients that answer each differently (an HTTP status).
        reason: ErrorReason,
    },
    /// A streamed fragment of a reply still being produced (best effort; streaming channels).
    Delta {
        /// The fragment.
        text: String,
    },
    /// Withdraw the text streamed so far for this reply (the model's answer was cut off and is
    /// asked for again): a draft restarts empty, a client showing the deltas clears them.
    Restart,
    /// A tool started or finished (best effort; channels that show progress).
    Progress(ToolProgress),
}

/// Why a turn did not answer ([`OutboundBody::Error`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorReason {
    /// It failed (the provider, a tool loop, the store, a message refused for its size...).
    #[default]
    Failed,
    /// A spending limit (`budgets.*`) is reached: nothing was asked of the model.
    OverBudget,
}

/// The token usage of a turn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt (input) tokens of the turn's LLM calls.
    pub prompt_tokens: u64,
    /// Completion (output) tokens.
    pub completion_tokens: u64,
}

/// An approval question's subject.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalAsk {
    /// The pending approval's id (what `/approve ID` names).
    pub approval_id: String,
    /// The command (or action) to approve.
    pub command: String,
    /// Asked of the terminal through a gateway: it goes only to the terminal's stream on the
    /// HTTP API, not to the HTTP chat's mailbox.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub terminal: bool,
}

/// A tool's progress in a running turn. Serialised as the HTTP stream's `progress` event:
/// `{"event": "tool_started", "tool", "call_id"}` / `{"event": "tool_finished", …, "error_code"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ToolProgress {
    /// The call started.
    ToolStarted {
        /// The tool's name.
        tool: String,
        /// The call's id.
        call_id: String,
        /// The call's arguments (JSON text) as the transcript keeps them (credentials masked),
        /// cut at [`PROGRESS_TEXT_CHARS`]. Absent in events written before it existed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        arguments: Option<String>,
    },
    /// The call ended.
    ToolFinished {
        /// The tool's name.
        tool: String,
        /// The call's id.
        call_id: String,
        /// The error code of a failed call (`NOT_FOUND`, `TIMEOUT` …); `None`: it succeeded.
        error_code: Option<String>,
        /// Its result as the transcript keeps it (scrubbed), cut at [`PROGRESS_TEXT_CHARS`].
        /// Absent in events written before it existed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<String>,
    },
}

/// The most characters of a call's arguments or result a progress event carries (the whole
/// text is in the transcript).
pub const PROGRESS_TEXT_CHARS: usize = 2000;

/// `text` cut at [`PROGRESS_TEXT_CHARS`] characters, with `… (N more characters)` when cut.
pub fn progress_text(text: &str) -> String {
    match text.char_indices().nth(PROGRESS_TEXT_CHARS) {
        None => text.to_string(),
        Some((at, _)) => format!(
            "{}… ({} more characters)",
            &text[..at],
            text[at..].chars().count()
        ),
    }
}

impl ToolProgress {
    /// One line for a person: `running read_file` / `finished read_file`.
    pub fn line(&self) -> String {
        match self {
            ToolProgress::ToolStarted { tool, .. } => format!("running {tool}"),
            ToolProgress::ToolFinished { tool, .. } => format!("finished {tool}"),
        }
    }
}

impl OutboundBody {
    /// A body of `kind` carrying `text`: a reply, an error, a delta; for progress, a started
    /// call of the tool `text` names.
    pub fn text_of(kind: OutboundKind, text: String) -> Self {
        match kind {
            OutboundKind::Final => OutboundBody::Reply { text, usage: None },
            OutboundKind::Progress => OutboundBody::Progress(ToolProgress::ToolStarted {
                tool: text,
                call_id: String::new(),
                arguments: None,
            }),
            OutboundKind::Error => OutboundBody::Error {
                text,
                reason: ErrorReason::Failed,
            },
            OutboundKind::Delta => OutboundBody::Delta { text },
        }
    }

    /// Its kind: how it is delivered.
    pub fn kind(&self) -> OutboundKind {
        match self {
            OutboundBody::Reply { .. } | OutboundBody::Approval { .. } => OutboundKind::Final,
            OutboundBody::Error { .. } => OutboundKind::Error,
            OutboundBody::Delta { .. } | OutboundBody::Restart => OutboundKind::Delta,
            OutboundBody::Progress(_) => OutboundKind::Progress,
        }
    }
}

impl OutboundMessage {
    /// How it is delivered (durable or not, streamed, progress).
    pub fn kind(&self) -> OutboundKind {
        self.body.kind()
    }

    /// Its text: the reply, question, error or fragment; empty for a restart and for progress
    /// (see [`ToolProgress::line`]).
    pub fn text(&self) -> &str {
        match &self.body {
            OutboundBody::Reply { text, .. }
            | OutboundBody::Approval { text, .. }
            | OutboundBody::Error { text, .. }
            | OutboundBody::Delta { text } => text,
            OutboundBody::Restart | OutboundBody::Progress(_) => "",
        }
    }

    /// Its text to change in place (`None` for a restart and for progress).
    pub fn text_mut(&mut self) -> Option<&mut String> {
        match &mut self.body {
            OutboundBody::Reply { text, .. }
            | OutboundBody::Approval { text, .. }
            | OutboundBody::Error { text, .. }
            | OutboundBody::Delta { text } => Some(text),
            OutboundBody::Restart | OutboundBody::Progress(_) => None,
        }
    }

    /// Whether this is a restart delta ([`OutboundBody::Restart`]).
    pub fn is_restart(&self) -> bool {
        self.body == OutboundBody::Restart
    }

    /// The turn's usage, on a reply that has it.
    pub fn usage(&self) -> Option<Usage> {
        match &self.body {
            OutboundBody::Reply { usage, .. } => *usage,
            _ => None,
        }
    }

    /// A durable message that answers no inbound event (pairing codes, the `message` tool,
    /// `weft send`), with a fresh outbox id.
    pub fn proactive(
        channel: ChannelId,
        chat: ChatId,
        thread: Option<ThreadId>,
        content: String,
    ) -> Self {
        Self::proactive_body(
            channel,
            chat,
            thread,
            OutboundBody::Reply {
                text: content,
                usage: None,
            },
        )
    }

    /// [`OutboundMessage::proactive`] with any durable body (an approval question).
    pub fn proactive_body(
        channel: ChannelId,
        chat: ChatId,
        thread: Option<ThreadId>,
        body: OutboundBody,
    ) -> Self {
        Self {
            id: uuid::Uuid::now_v7().to_string(),
            channel,
            chat,
            thread,
            in_reply_to: None,
            body,
            attachments: Vec::new(),
        }
    }
}

/// The stored (and wire) form of an [`OutboundMessage`]: the shape outbox records have always
/// had. `meta` holds the structured part of a body: `{"usage": …}` on a reply,
/// `{"approval_id", "command"}` on an approval question, `{"event": "restart"}` on a restart
/// delta, the [`ToolProgress`] object on progress.
#[derive(Serialize, Deserialize)]
struct WireOutbound {
    id: String,
    channel: ChannelId,
    chat: ChatId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    thread: Option<ThreadId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    in_reply_to: Option<PlatformEventId>,
    kind: OutboundKind,
    content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    meta: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    attachments: Vec<media::OutboundFile>,
}

#[derive(Serialize, Deserialize)]
struct UsageMeta {
    usage: Usage,
}

impl From<OutboundMessage> for WireOutbound {
    fn from(m: OutboundMessage) -> Self {
        let kind = m.kind();
        let meta = |v: Result<serde_json::Value, serde_json::Error>| v.ok();
        let (content, meta) = match m.body {
            OutboundBody::Reply { text, usage } => (
                text,
                usage.and_then(|usage| meta(serde_json::to_value(UsageMeta { usage }))),
            ),
            OutboundBody::Approval { text, ask } => (text, meta(serde_json::to_value(ask))),
            OutboundBody::Error {
                text,
                reason: ErrorReason::OverBudget,
            } => (text, Some(serde_json::json!({ "reason": "over_budget" }))),
            OutboundBody::Error { text, .. } | OutboundBody::Delta { text } => (text, None),
            OutboundBody::Restart => (
                String::new(),
                Some(serde_json::json!({ "event": "restart" })),
            ),
            OutboundBody::Progress(p) => (p.line(), meta(serde_json::to_value(p))),
        };
        WireOutbound {
            id: m.id,
            channel: m.channel,
            chat: m.chat,
            thread: m.thread,
            in_reply_to: m.in_reply_to,
            kind,
            content,
            meta,
            attachments: m.attachments,
        }
    }
}

impl From<WireOutbound> for OutboundMessage {
    fn from(w: WireOutbound) -> Self {
        fn parse<T: serde::de::DeserializeOwned>(v: &serde_json::Value) -> Option<T> {
            T::deserialize(v).ok()
        }
        let meta = w.meta;
        let body = match w.kind {
            OutboundKind::Final => match meta.as_ref().and_then(parse) {
                Some(ask) => OutboundBody::Approval {
                    text: w.content,
                    ask,
                },
                None => OutboundBody::Reply {
                    text: w.content,
                    usage: meta
                        .as_ref()
                        .and_then(|v| parse(v).map(|u: UsageMeta| u.usage)),
                },
            },
            OutboundKind::Error => OutboundBody::Error {
                text: w.content,
                reason: meta
                    .as_ref()
                    .and_then(|m| m.get("reason"))
                    .and_then(parse)
                    .unwrap_or_default(),
            },
            OutboundKind::Delta
                if meta
                    .as_ref()
                    .and_then(|m| m.get("event"))
                    .and_then(serde_json::Value::as_str)
                    == Some("restart") =>
            {
                OutboundBody::Restart
            }
            OutboundKind::Delta => OutboundBody::Delta { text: w.content },
            OutboundKind::Progress => match meta.as_ref().and_then(parse) {
                Some(p) => OutboundBody::Progress(p),
                // No structured part (never written so): the line names the tool.
                None => OutboundBody::Progress(ToolProgress::ToolStarted {
                    tool: w.content,
                    call_id: String::new(),
                    arguments: None,
                }),
            },
        };
        OutboundMessage {
            id: w.id,
            channel: w.channel,
            chat: w.chat,
            thread: w.thread,
            in_reply_to: w.in_reply_to,
            body,
            attachments: w.attachments,
        }
    }
}

/// The platform's id of a message it accepted (Telegram `message_id`, Discord snowflake, Slack
/// `ts`, Matrix event id, Signal timestamp, WhatsApp `wamid`, a mail's `Message-ID`), as text.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MessageRef(pub String);

/// What one [`Channel::send`] delivered: the platform's reference to the (first) message it
/// accepted, or nothing (a kind the channel does not show, a delta dropped or not yet shown, a
/// reply that renders to nothing). Written as the message id, or `""` for nothing, wherever it
/// is serialised.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum SentRef {
    /// Nothing was sent (or the platform's answer did not say what).
    #[default]
    Nothing,
    /// The platform accepted this message.
    Message(MessageRef),
}

impl SentRef {
    /// The platform accepted message `id`.
    pub fn message(id: impl Into<String>) -> Self {
        Self::Message(MessageRef(id.into()))
    }

    /// A platform id that may be missing: nothing when there is none.
    pub fn of<Id: fmt::Display>(id: Option<&Id>) -> Self {
        id.map_or(Self::Nothing, |i| Self::message(i.to_string()))
    }

    /// Whether nothing was sent.
    pub fn is_nothing(&self) -> bool {
        matches!(self, Self::Nothing)
    }

    /// This, or `other` when this is nothing.
    #[must_use]
    pub fn or(self, other: SentRef) -> SentRef {
        match self {
            Self::Nothing => other,
            Self::Message(m) => Self::Message(m),
        }
    }
}

impl From<String> for SentRef {
    fn from(s: String) -> Self {
        if s.is_empty() {
            Self::Nothing
        } else {
            Self::message(s)
        }
    }
}

impl From<SentRef> for String {
    fn from(s: SentRef) -> Self {
        match s {
            SentRef::Nothing => String::new(),
            SentRef::Message(m) => m.0,
        }
    }
}

/// Tests written when a send answered a bare string read it as `sent.0` (`""` for nothing):
/// they still can, and only they (production code matches on [`SentRef`]).
#[cfg(any(test, feature = "testing"))]
impl std::ops::Deref for SentRef {
    type Target = MessageRef;

    fn deref(&self) -> &MessageRef {
        static NOTHING: MessageRef = MessageRef(String::new());
        match self {
            Self::Nothing => &NOTHING,
            Self::Message(m) => m,
        }
    }
}

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

impl Capabilities {
    /// Whether messages of `kind` reach this channel: durable ones always, deltas (and
    /// restarts) only when it streams, tool progress only when it shows it. The one rule the
    /// outbox routes by (and the shared send path keeps to, for a caller that skips the outbox).
    pub fn takes(&self, kind: OutboundKind) -> bool {
        match kind {
            OutboundKind::Final | OutboundKind::Error => true,
            OutboundKind::Delta => self.streaming,
            OutboundKind::Progress => self.progress,
        }
    }
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
        self.0.locked().get(key).cloned()
    }
    fn put(&self, key: &str, value: &str) -> Result<(), StateError> {
        self.0.locked().insert(key.to_string(), value.to_string());
        Ok(())
    }
    fn remove(&self, key: &str) -> Result<(), StateError> {
        self.0.locked().remove(key);
        Ok(())
    }
}

/// `bytes` as lowercase hex, two digits a byte.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The bytes of hex text (either case); `None` for an odd length or a non-hex digit.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Milliseconds since the Unix epoch, for [`InboundEvent::received_at_ms`].
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod hex_tests {
    #[test]
    fn hex_round_trips_and_refuses_what_is_not_hex() {
        let bytes = [0x00, 0x0f, 0xa5, 0xff];
        assert_eq!(super::hex(&bytes), "000fa5ff");
        assert_eq!(super::unhex("000fa5ff").as_deref(), Some(&bytes[..]));
        assert_eq!(super::unhex("000FA5FF").as_deref(), Some(&bytes[..]));
        assert_eq!(super::unhex("abc"), None);
        assert_eq!(super::unhex("zz"), None);
        assert_eq!(super::unhex("é1"), None);
    }
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

#[cfg(test)]
mod outbound_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Outbox records keep the shape they always had: records written before the typed body
    /// read back as the body they meant, and every body writes that shape again.
    #[test]
    fn stored_outbound_records_keep_their_shape_and_read_as_typed_bodies() {
        let old = [
            (
                r#"{"id":"1","channel":"telegram","chat":"42","in_reply_to":"e1","kind":"final","content":"hi","meta":{"usage":{"prompt_tokens":10,"completion_tokens":3}}}"#,
                OutboundBody::Reply {
                    text: "hi".into(),
                    usage: Some(Usage {
                        prompt_tokens: 10,
                        completion_tokens: 3,
                    }),
                },
            ),
            (
                r#"{"id":"2","channel":"http","chat":"c","kind":"final","content":"Approval needed","meta":{"approval_id":"ab12","command":"rm -r build"}}"#,
                OutboundBody::Approval {
                    text: "Approval needed".into(),
                    ask: ApprovalAsk {
                        approval_id: "ab12".into(),
                        command: "rm -r build".into(),
                        terminal: false,
                    },
                },
            ),
            (
                r#"{"id":"3","channel":"http","chat":"c","kind":"error","content":"failed"}"#,
                OutboundBody::Error {
                    text: "failed".into(),
                    reason: ErrorReason::Failed,
                },
            ),
            (
                r#"{"id":"3b","channel":"http","chat":"c","kind":"error","content":"over","meta":{"reason":"over_budget"}}"#,
                OutboundBody::Error {
                    text: "over".into(),
                    reason: ErrorReason::OverBudget,
                },
            ),
            (
                r#"{"id":"4","channel":"http","chat":"c","kind":"delta","content":"","meta":{"event":"restart"}}"#,
                OutboundBody::Restart,
            ),
            (
                r#"{"id":"5","channel":"http","chat":"c","kind":"progress","content":"finished grep","meta":{"event":"tool_finished","tool":"grep","call_id":"c1","error_code":"TIMEOUT"}}"#,
                OutboundBody::Progress(ToolProgress::ToolFinished {
                    tool: "grep".into(),
                    call_id: "c1".into(),
                    error_code: Some("TIMEOUT".into()),
                    result: None,
                }),
            ),
            (
                r#"{"id":"6","channel":"telegram","chat":"42","kind":"final","content":"a notice"}"#,
                OutboundBody::Reply {
                    text: "a notice".into(),
                    usage: None,
                },
            ),
        ];
        for (json, body) in old {
            let m: OutboundMessage = serde_json::from_str(json).unwrap();
            assert_eq!(m.body, body, "{json}");
            let again: serde_json::Value = serde_json::to_value(&m).unwrap();
            let want: serde_json::Value = serde_json::from_str(json).unwrap();
            assert_eq!(again, want, "written back differently");
        }
    }
}

#[cfg(test)]
mod display_name_tests {
    use super::{display_name, MAX_DISPLAY_NAME_CHARS};

    #[test]
    fn parts_are_joined_and_cleaned() {
        assert_eq!(
            display_name(["Ada", "Lovelace"]).as_deref(),
            Some("Ada Lovelace")
        );
        assert_eq!(
            display_name(["  Ada\n\tL. ", ""]).as_deref(),
            Some("Ada L.")
        );
        // A bidi override cannot turn the name around; an emoji sequence stays whole.
        assert_eq!(display_name(["\u{202E}nimda"]).as_deref(), Some("nimda"));
        assert_eq!(
            display_name(["👨\u{200D}👩"]).as_deref(),
            Some("👨\u{200D}👩")
        );
        assert_eq!(display_name(["", " \u{200B} "]), None);
        let long = display_name(["x".repeat(500).as_str()]).unwrap_or_default();
        assert_eq!(long.chars().count(), MAX_DISPLAY_NAME_CHARS);
        assert!(long.ends_with('…'));
    }
}

#[cfg(test)]
mod progress_text_tests {
    use super::{progress_text, PROGRESS_TEXT_CHARS};

    #[test]
    fn long_texts_are_cut_on_a_character_and_say_how_much_is_left() {
        assert_eq!(progress_text("short"), "short");
        let long = "é".repeat(PROGRESS_TEXT_CHARS + 5);
        let cut = progress_text(&long);
        assert!(cut.ends_with("… (5 more characters)"), "{cut}");
        assert!(cut.starts_with(&"é".repeat(PROGRESS_TEXT_CHARS)));
    }
}
