//! The Signal channel, through signal-cli's JSON-RPC daemon in HTTP mode
//! (`signal-cli -a +NUMBER daemon --http 127.0.0.1:8080`), the way every gateway integrates
//! Signal: there is no official bot API, and signal-cli holds the account's keys.
//!
//! A small hand-written client on reqwest (no SDK: the protocol is three HTTP endpoints):
//!
//! - **Inbound** ([`Channel::listen`]): `GET /api/v1/events` is a Server-Sent Events stream of
//!   `receive` notifications (`{"envelope": …, "account": …}`), each with an `id`. The id of the
//!   last event ingress answered is stored ([`StateStore`], key `events_cursor`) and sent as
//!   `Last-Event-ID` on every reconnect, so signal-cli replays what came while the stream was
//!   down (it keeps its last 1,000 events) and nothing is lost across a reconnect or a restart
//!   of the gateway. An event ingress could not store is not passed: the stream reconnects from
//!   before it. Which envelopes are delivered: see [`events`].
//! - **Outbound** ([`Channel::send`]): `send` with `recipient` (a direct chat) or `groupId`
//!   (`group.<id>` chats), the Markdown rendered to Signal's text styles ([`render`],
//!   `textStyle` ranges) and split under 2,000 bytes. In groups the first chunk quotes the
//!   message it answers.
//! - **Exactly once**: signal-cli has no idempotency key, so the timestamp Signal gave each
//!   chunk is journaled (`sent:<outbound id>`) as soon as `send` answers, and attachments
//!   delivered are counted (`files:<outbound id>`); a resend of the same outbound id (after a
//!   crash, a retry) skips what is journaled. What remains is the milliseconds between
//!   signal-cli's answer and the journal write.
//! - **Rate limits**: signal-cli's `RateLimitErrorException` (code -5) becomes
//!   [`ChannelError::RateLimited`] with the `retryAfterSeconds` Signal named (else 10 s): the
//!   outbox waits, then resends what is not journaled.
//! - **Files in**: an envelope's attachments are journaled by id; [`Channel::media_request`]
//!   points the daemon at a loopback-only file endpoint of this adapter (a random path per
//!   process) that reads them through signal-cli's `getAttachment`.
//! - **Files out**: each attachment of a final reply is sent after the text as its own `send`
//!   with a `data:` URI (works with a signal-cli on another host), counted as it goes.
//! - **Typing**: `sendTyping` while a turn runs. **Read receipts**: never sent (no
//!   `sendReceipt`); signal-cli's own delivery receipts are its business.
//! - **No streaming**: a Signal edit is a new message to every device of every recipient, and
//!   clients accept only a few edits of a message, so replies are sent whole.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use clawft_channel_core::draft::{DraftOptions, DraftPlatform, Edited, Slot};
use clawft_channel_core::lock::MutexExt;
use clawft_channel_core::media::{MediaRef, MediaRequest, OutboundFile};
use clawft_channel_core::send::{SendFiles, SendPath, SendPlatform};
use clawft_channel_core::{
    Capabilities, Channel, ChannelError, ChannelId, ChatId, InboundDelivery, MemoryState,
    OutboundMessage, SentRef, StateStore, ThreadId,
};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub mod events;
#[cfg(any(test, feature = "testing"))]
pub mod fake;
mod files;
pub mod render;
mod rpc;
mod settings;
mod sse;
#[cfg(test)]
mod tests;

pub use settings::{Signal, SignalFile, SignalSettings};

use render::Rendered;

/// Which group messages are delivered (direct messages always are).
pub use clawft_channel_core::GroupMode;
use rpc::Rpc;

/// Largest file sent (Signal's own limit is 100 MiB; the file travels base64 in one request).
pub const MAX_UPLOAD_BYTES: u64 = 100 * 1024 * 1024;
/// Outbound messages whose progress is remembered in memory (the journal keeps the rest).
const PROGRESS_KEPT: usize = 512;
/// The state key of the SSE cursor (the id of the last event answered).
pub const CURSOR_KEY: &str = "events_cursor";

/// Resolved settings of the Signal channel.
#[derive(Clone)]
pub struct SignalConfig {
    /// Channel id (default `signal`).
    pub id: ChannelId,
    /// The Signal account signal-cli runs, in E.164 (`+15551234567`): `channels.signal.number`.
    pub number: String,
    /// signal-cli's HTTP address (default `http://127.0.0.1:8080`): `channels.signal.api_url`.
    pub api_url: String,
    /// Which group messages are delivered (default [`GroupMode::Mention`]).
    pub group_mode: GroupMode,
    /// Durable adapter state: the SSE cursor and the send journal.
    pub state: Arc<dyn StateStore>,
    /// First reconnect delay, doubled per failed attempt (default 1 s).
    pub backoff_min: Duration,
    /// Largest reconnect delay (default 60 s).
    pub backoff_max: Duration,
    /// Reconnect when nothing (event or keep-alive) arrived for this long (default 90 s).
    pub idle_timeout: Duration,
    /// Largest attachment sent, in bytes (default [`MAX_UPLOAD_BYTES`]); a bigger one is
    /// replaced by a note in the chat.
    pub max_upload_bytes: u64,
}

impl Default for SignalConfig {
    fn default() -> Self {
        Self {
            id: ChannelId::new("signal"),
            number: String::new(),
            api_url: "http://127.0.0.1:8080".into(),
            group_mode: GroupMode::Mention,
            state: Arc::new(MemoryState::default()),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(90),
            max_upload_bytes: MAX_UPLOAD_BYTES,
        }
    }
}

impl fmt::Debug for SignalConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignalConfig")
            .field("id", &self.id)
            .field("number", &self.number)
            .field("api_url", &self.api_url)
            .field("group_mode", &self.group_mode)
            .field("backoff_min", &self.backoff_min)
            .field("backoff_max", &self.backoff_max)
            .field("idle_timeout", &self.idle_timeout)
            .field("max_upload_bytes", &self.max_upload_bytes)
            .finish_non_exhaustive()
    }
}

/// Whether `s` is an E.164 phone number (`+` and 7 to 15 digits).
pub fn is_e164(s: &str) -> bool {
    s.strip_prefix('+').is_some_and(|d| {
        (7..=15).contains(&d.len()) && d.bytes().all(|b| b.is_ascii_digit()) && !d.starts_with('0')
    })
}

/// Whether `s` is a Signal ACI (a UUID, lower- or upper-case hex).
pub fn is_uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

pub(crate) struct Inner {
    pub(crate) cfg: SignalConfig,
    pub(crate) rpc: Rpc,
    pub(crate) http: reqwest::Client,
    pub(crate) status: Mutex<String>,
    /// Delivery progress of final replies and the attachments delivered (`files:<id>`); no
    /// drafts: Signal replies are not streamed.
    send: SendPath<u64, Rendered>,
    /// The loopback file endpoint for inbound attachments, started on first use.
    files: files::FileServer,
}

impl Inner {
    pub(crate) fn set_status(&self, s: impl Into<String>) {
        *self.status.locked() = s.into();
    }
}

/// The Signal channel adapter.
pub struct SignalChannel {
    inner: Arc<Inner>,
}

impl Drop for SignalChannel {
    fn drop(&mut self) {
        self.inner.files.stop();
    }
}

impl SignalChannel {
    /// Validate the settings and build the client (no network until [`Channel::listen`]).
    ///
    /// # Errors
    /// [`ChannelError::Fatal`] naming the setting that is wrong.
    pub fn new(cfg: SignalConfig) -> Result<Self, ChannelError> {
        if !is_e164(&cfg.number) {
            return Err(ChannelError::Fatal(format!(
                "channels.signal.number `{}` is not a phone number in international format like +15551234567 (the account registered or linked in signal-cli)",
                cfg.number
            )));
        }
        let url = reqwest::Url::parse(&cfg.api_url).map_err(|e| {
            ChannelError::Fatal(format!(
                "channels.signal.api_url `{}` is not a URL: {e}",
                cfg.api_url
            ))
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ChannelError::Fatal(format!(
                "channels.signal.api_url `{}` must be the http:// address of `signal-cli daemon --http`",
                cfg.api_url
            )));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .no_proxy()
            .build()
            .map_err(|e| ChannelError::Fatal(format!("HTTP client: {e}")))?;
        let rpc = Rpc::new(http.clone(), &cfg.api_url, &cfg.number);
        Ok(Self {
            inner: Arc::new(Inner {
                send: SendPath::new(
                    DraftOptions {
                        edit_interval: Duration::from_secs(1),
                        capacity: PROGRESS_KEPT,
                        skip_repeated_deltas: true,
                    },
                    cfg.state.clone(),
                ),
                rpc,
                http,
                cfg,
                status: Mutex::new("not started".into()),
                files: files::FileServer::default(),
            }),
        })
    }

    /// Where a chat's messages go: `recipient` or `groupId`.
    fn target_params(chat: &str) -> Map<String, Value> {
        let mut p = Map::new();
        match chat.strip_prefix(events::GROUP_PREFIX) {
            Some(g) => {
                p.insert("groupId".into(), Value::String(g.to_string()));
            }
            None => {
                p.insert("recipient".into(), json!([chat]));
            }
        }
        p
    }

    /// `send`; answers the timestamp Signal gave the message (if signal-cli said it).
    async fn send_raw(&self, p: Map<String, Value>) -> Result<Option<u64>, ChannelError> {
        let r = self.inner.rpc.call("send", p).await?;
        Ok(r.get("timestamp").and_then(Value::as_u64))
    }
}

/// One outbound message's target, for the draft book.
struct Target<'a> {
    ch: &'a SignalChannel,
    msg: &'a OutboundMessage,
}

#[async_trait]
impl DraftPlatform for Target<'_> {
    type Id = u64;
    type Text = Rendered;

    /// Signal replies are not streamed: nothing is shown before the final reply.
    fn preview(&self, _markdown: &str) -> Option<Rendered> {
        None
    }

    async fn post(&self, slot: Slot, text: &Rendered) -> Result<Option<u64>, ChannelError> {
        let chat = self.msg.chat.as_str();
        let mut p = SignalChannel::target_params(chat);
        p.insert("message".into(), Value::String(text.text.clone()));
        if !text.styles.is_empty() {
            p.insert("textStyle".into(), json!(text.text_style_param()));
        }
        // In a group the first chunk quotes the message it answers (Signal's reply).
        if let (Slot::Chunk(0), true, Some(ev)) = (
            slot,
            chat.starts_with(events::GROUP_PREFIX),
            self.msg.in_reply_to.as_ref(),
        ) {
            if let Some((author, ts)) = ev.as_str().rsplit_once(':') {
                if let Ok(ts) = ts.parse::<u64>() {
                    p.insert("quoteTimestamp".into(), json!(ts));
                    p.insert("quoteAuthor".into(), json!(author));
                }
            }
        }
        self.ch.send_raw(p).await
    }

    /// Never reached (no drafts); a message to replace is posted again.
    async fn edit(&self, _id: &u64, _text: &Rendered) -> Result<Edited, ChannelError> {
        Ok(Edited::Gone)
    }
}

#[async_trait]
impl SendFiles for Target<'_> {
    /// Each file is its own `send` (a `data:` URI, so signal-cli may run on another host),
    /// quoting nothing; a file over the limit becomes a note. Answers its timestamp.
    async fn send_file(
        &self,
        _index: usize,
        f: &OutboundFile,
        _first: bool,
    ) -> Result<SentRef, ChannelError> {
        let sent = |ts: Option<u64>| SentRef::of(ts.as_ref());
        let limit = self.ch.inner.cfg.max_upload_bytes;
        let note = |size: u64| {
            format!(
                "{} ({} KB) is over the {} KB limit for files sent to Signal, so it was not sent.",
                f.name,
                size.div_ceil(1024),
                limit / 1024
            )
        };
        let mut p = SignalChannel::target_params(self.msg.chat.as_str());
        if f.size > limit {
            p.insert("message".into(), Value::String(note(f.size)));
            return self.ch.send_raw(p).await.map(sent);
        }
        let bytes = clawft_channel_core::media::read_file(f).await?;
        if bytes.len() as u64 > limit {
            p.insert("message".into(), Value::String(note(bytes.len() as u64)));
            return self.ch.send_raw(p).await.map(sent);
        }
        // signal-cli's data URI: `data:<mime>;filename=<name>;base64,<data>`.
        let name: String = f
            .name
            .chars()
            .map(|c| if matches!(c, ';' | ',' | '/') { '_' } else { c })
            .collect();
        let uri = format!(
            "data:{};filename={name};base64,{}",
            f.mime,
            base64::engine::general_purpose::STANDARD.encode(&bytes)
        );
        p.insert("attachments".into(), json!([uri]));
        self.ch.send_raw(p).await.map(sent)
    }
}

impl SendPlatform for Target<'_> {
    fn render(&self, markdown: &str) -> Vec<Rendered> {
        render::chunks(markdown)
    }
}

#[async_trait]
impl Channel for SignalChannel {
    fn id(&self) -> &ChannelId {
        &self.inner.cfg.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            streaming: false,
            progress: false,
            max_message_bytes: render::MAX_MESSAGE_BYTES,
            max_upload_bytes: self.inner.cfg.max_upload_bytes,
        }
    }

    async fn listen(
        &self,
        tx: mpsc::Sender<InboundDelivery>,
        cancel: CancellationToken,
    ) -> Result<(), ChannelError> {
        sse::run(self.inner.clone(), tx, cancel).await
    }

    async fn send(&self, msg: &OutboundMessage) -> Result<SentRef, ChannelError> {
        let caps = self.capabilities();
        self.inner
            .send
            .send(&caps, msg, || Ok(Target { ch: self, msg }))
            .await
    }

    async fn typing(&self, chat: &ChatId, _thread: Option<&ThreadId>) -> Result<(), ChannelError> {
        let p = Self::target_params(chat.as_str());
        self.inner.rpc.call("sendTyping", p).await.map(drop)
    }

    async fn media_request(&self, media: &MediaRef) -> Result<MediaRequest, ChannelError> {
        let url = self.inner.files.url_for(&self.inner, &media.id).await?;
        Ok(MediaRequest {
            url,
            headers: Vec::new(),
            trusted: true,
        })
    }

    fn state(&self) -> String {
        self.inner.status.locked().clone()
    }

    fn settled(&self, msg: &OutboundMessage) {
        self.inner.send.settled(msg);
    }
}
