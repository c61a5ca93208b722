//! The Slack channel: Socket Mode inbound, Web API outbound.
//!
//! It speaks the protocol directly (reqwest for the Web API, tokio-tungstenite for the Socket
//! Mode WebSocket) rather than through slack-morphism: slack-morphism sends the envelope ack as
//! the return value of its event callback, runs its own reconnect loop, and brings hyper-rustls
//! with native certs, signal-hook and a dozen other crates; here every part of the flow the
//! daemon's invariants depend on (ack only after the event is journaled, reconnect, watchdog)
//! is a few lines in [`socket`].
//!
//! - **Inbound** ([`Channel::listen`]): `auth.test` (bot token), `apps.connections.open`
//!   (app-level token) → WebSocket; every `events_api` envelope that is a user message for the
//!   bot becomes one [`InboundDelivery`]; its envelope is acknowledged only after the daemon's
//!   [`Ack`](clawft_channel_core::Ack) arrives. An envelope not acknowledged within 3 s is
//!   redelivered by Slack (`retry_attempt` 1..3) with the same `event_id`, which the daemon
//!   deduplicates. Which events are delivered: see [`events`].
//! - **Outbound** ([`Channel::send`]): Markdown rendered to mrkdwn ([`render`]), split at
//!   3,000 characters, posted with `chat.postMessage` in the message's thread.
//! - **Streaming**: `Delta`s create a draft with `chat.postMessage` and edit it with
//!   `chat.update` at most once per `edit_interval`; the `Final` edits it into its first chunk.
//! - **Slack app setup**: enable Socket Mode; an app-level token with `connections:write`
//!   (`app_token`); bot scopes `chat:write`, `app_mentions:read`, `im:history`,
//!   `channels:history`, `groups:history`, `mpim:history`, `files:read` (download what users
//!   attach), `files:write` (send files) (`token`); bot events `app_mention`,
//!   `message.im`, `message.channels`, `message.groups`, `message.mpim`. Optional slash
//!   commands `/stop`, `/new`, `/status`, `/approve`, `/deny` arrive as `slash_commands`
//!   envelopes and are delivered as text (in a DM Slack would otherwise refuse `/stop` as an
//!   unknown command; in channels `@bot /stop` works without them).
//! - **Rate limits**: one gate per Web API method (Slack's tiers are per method and
//!   workspace): after a 429 no call of that method is made until its `Retry-After` passed;
//!   final replies wait at the gate, streamed drafts skip the call (see [`api`]).
//! - **Files in**: the `files` of a message become the event's attachments ([`events`]);
//!   [`Channel::media_request`] names their `url_private_download` with the bot token as a
//!   bearer header, but only for `https://files.slack.com/` or the configured `api_url`'s
//!   origin (any other URL a payload names gets no credentials and is fetched through the
//!   daemon's SSRF guard). A file the event named without a URL is looked up with `files.info`.
//! - **Files out**: after the text, each attachment of a final reply is uploaded with
//!   `files.getUploadURLExternal` (form fields `filename`, `length`), a POST of the bytes to the
//!   upload URL (accepted only on `https://files.slack.com/` or the configured API origin), and
//!   `files.completeUploadExternal` into the chat and thread; the count delivered is journaled
//!   after each, so a retry uploads only the rest. A file over
//!   [`SlackConfig::max_upload_bytes`] (100 MiB: uploads are held in memory; Slack's own limit
//!   is 1 GB) is replaced by a short note. Scopes `files:write` (and `files:read` for
//!   `files.info`).
//! - **Typing**: a no-op. Slack offers bots in Socket Mode no typing indicator (the RTM
//!   `typing` event is gone; `assistant.threads.setStatus` only works in assistant threads).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use clawft_channel_core::draft::{DraftOptions, DraftPlatform, Edited, Slot};
use clawft_channel_core::lock::MutexExt;
use clawft_channel_core::media::{MediaRef, MediaRequest, OutboundFile};
use clawft_channel_core::send::{SendFiles, SendPath, SendPlatform};
use clawft_channel_core::text::{split_markdown, Measure};
use clawft_channel_core::{
    Capabilities, Channel, ChannelError, ChannelId, ChatId, InboundDelivery, MemoryState,
    OutboundKind, OutboundMessage, SentRef, StateStore, ThreadId,
};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

mod api;
mod events;
#[cfg(any(test, feature = "testing"))]
pub mod fake;
#[cfg(test)]
mod media_tests;
pub mod render;
mod settings;
mod socket;
#[cfg(test)]
mod tests;

pub use settings::{Slack, SlackFile, SlackSettings};

use api::{Gate, Token, WebApi};

/// Longest message we post, in characters (Slack truncates block text at 3,000).
pub const MAX_MESSAGE_CHARS: usize = 3000;
/// Markdown characters per chunk before rendering (rendering adds escapes; a chunk that
/// still renders too long is split again).
const SPLIT_CHARS: usize = 2800;
/// Largest file we upload (the whole file is read into memory for the upload; Slack's own
/// limit is 1 GB).
pub const MAX_UPLOAD_BYTES: u64 = 100 * 1024 * 1024;
/// Slack's file host: the only host besides the configured API origin that gets the bot token.
const FILE_HOST: &str = "files.slack.com";
/// Outbound messages whose progress is remembered (for retries of the same id), drafts and
/// finished replies (each).
const PROGRESS_KEPT: usize = 512;

/// Which group messages are delivered (DMs always are).
pub use clawft_channel_core::GroupMode;

/// Resolved settings of the Slack channel.
#[derive(Clone)]
pub struct SlackConfig {
    /// Channel id (default `slack`).
    pub id: ChannelId,
    /// Bot token (`xoxb-...`), `channels.slack.token`: Web API calls. Never printed.
    pub token: String,
    /// App-level token (`xapp-...`, scope `connections:write`), `channels.slack.app_token`:
    /// opens Socket Mode connections. Never printed.
    pub app_token: String,
    /// Web API base (default `https://slack.com/api/`); `http://127.0.0.1:P/api/` in tests.
    pub api_url: String,
    /// Which channel messages are delivered (default [`GroupMode::Mention`]).
    pub group_mode: GroupMode,
    /// Stream replies by editing a draft message (default true).
    pub stream_edits: bool,
    /// Least time between two edits of a streamed draft (default 1.5 s).
    pub edit_interval: Duration,
    /// Durable adapter state. Slack needs no cursor (it redelivers unacknowledged envelopes
    /// itself), so nothing is stored today.
    pub state: Arc<dyn StateStore>,
    /// First reconnect delay, doubled per failed attempt (default 1 s).
    pub backoff_min: Duration,
    /// Largest reconnect delay (default 60 s).
    pub backoff_max: Duration,
    /// Interval of WebSocket pings (default 10 s).
    pub ping_interval: Duration,
    /// Reconnect when nothing (frame or pong) arrived for this long (default 30 s).
    pub watchdog_timeout: Duration,
    /// Largest attachment uploaded, in bytes (default [`MAX_UPLOAD_BYTES`]); a bigger one is
    /// replaced by a note in the chat.
    pub max_upload_bytes: u64,
}

impl Default for SlackConfig {
    fn default() -> Self {
        Self {
            id: ChannelId::new("slack"),
            token: String::new(),
            app_token: String::new(),
            api_url: "https://slack.com/api/".into(),
            group_mode: GroupMode::Mention,
            stream_edits: true,
            edit_interval: Duration::from_millis(1500),
            state: Arc::new(MemoryState::default()),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            ping_interval: Duration::from_secs(10),
            watchdog_timeout: Duration::from_secs(30),
            max_upload_bytes: MAX_UPLOAD_BYTES,
        }
    }
}

impl fmt::Debug for SlackConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redact = |s: &str| {
            if s.is_empty() {
                "<empty>"
            } else {
                "<redacted>"
            }
        };
        f.debug_struct("SlackConfig")
            .field("id", &self.id)
            .field("token", &redact(&self.token))
            .field("app_token", &redact(&self.app_token))
            .field("api_url", &self.api_url)
            .field("group_mode", &self.group_mode)
            .field("stream_edits", &self.stream_edits)
            .field("edit_interval", &self.edit_interval)
            .field("backoff_min", &self.backoff_min)
            .field("backoff_max", &self.backoff_max)
            .field("ping_interval", &self.ping_interval)
            .field("watchdog_timeout", &self.watchdog_timeout)
            .field("max_upload_bytes", &self.max_upload_bytes)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    pub(crate) cfg: SlackConfig,
    pub(crate) api: WebApi,
    pub(crate) tls: Arc<rustls::ClientConfig>,
    pub(crate) status: Mutex<String>,
    /// Streamed drafts, the delivery progress of final replies and the attachments delivered
    /// (`files:<id>`).
    send: SendPath<String, String>,
    /// The origin of `api_url` (the fakes' 127.0.0.1 in tests): trusted for downloads and
    /// uploads.
    api_origin: reqwest::Url,
}

impl Inner {
    pub(crate) fn set_status(&self, s: impl Into<String>) {
        *self.status.locked() = s.into();
    }
}

/// The Slack channel adapter.
pub struct SlackChannel {
    inner: Arc<Inner>,
}

impl SlackChannel {
    /// Validate the settings and build the clients (no network until [`Channel::listen`]).
    ///
    /// # Errors
    /// [`ChannelError::Auth`] for a missing or misplaced token, [`ChannelError::Fatal`] for a
    /// bad `api_url`.
    pub fn new(cfg: SlackConfig) -> Result<Self, ChannelError> {
        if cfg.token.trim().is_empty() {
            return Err(ChannelError::Auth(
                "channels.slack.token is empty: set it to the app's bot token (xoxb-...)".into(),
            ));
        }
        if cfg.token.starts_with("xapp-") {
            return Err(ChannelError::Auth(
                "channels.slack.token is an app-level token (xapp-...): set it to the bot token (xoxb-...) and put the xapp- token in channels.slack.app_token".into(),
            ));
        }
        if !cfg.app_token.starts_with("xapp-") {
            return Err(ChannelError::Auth(
                "channels.slack.app_token must be an app-level token (xapp-...) with the connections:write scope (Basic Information → App-Level Tokens), and Socket Mode must be enabled".into(),
            ));
        }
        let url = reqwest::Url::parse(&cfg.api_url).map_err(|e| {
            ChannelError::Fatal(format!(
                "channels.slack.api_url `{}` is not a URL: {e}",
                cfg.api_url
            ))
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ChannelError::Fatal(format!(
                "channels.slack.api_url `{}` must be an http(s) URL like https://slack.com/api/",
                cfg.api_url
            )));
        }
        let api = WebApi::new(&cfg.api_url, &cfg.token, &cfg.app_token)?;
        let tls = socket::tls_config()?;
        Ok(Self {
            inner: Arc::new(Inner {
                api_origin: url,
                send: SendPath::new(
                    DraftOptions {
                        edit_interval: cfg.edit_interval,
                        capacity: PROGRESS_KEPT,
                        // A retried delta is not appended twice.
                        skip_repeated_deltas: true,
                    },
                    cfg.state.clone(),
                ),
                cfg,
                api,
                tls,
                status: Mutex::new("not started".into()),
            }),
        })
    }

    async fn post(
        &self,
        chat: &str,
        thread: Option<&str>,
        text: &str,
        gate: Gate,
    ) -> Result<String, ChannelError> {
        let mut body = json!({
            "channel": chat,
            "text": text,
            "mrkdwn": true,
            "unfurl_links": false,
            "unfurl_media": false,
        });
        if let Some(t) = thread {
            body["thread_ts"] = Value::String(t.to_string());
        }
        let v = self
            .inner
            .api
            .call_gated("chat.postMessage", Token::Bot, &body, gate)
            .await?;
        Ok(v.get("ts")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string())
    }

    async fn update(
        &self,
        chat: &str,
        ts: &str,
        text: &str,
        gate: Gate,
    ) -> Result<(), ChannelError> {
        let body = json!({"channel": chat, "ts": ts, "text": text});
        self.inner
            .api
            .call_gated("chat.update", Token::Bot, &body, gate)
            .await
            .map(drop)
    }

    /// Whether `url` is on the configured API origin (trusted: fetched directly), and whether
    /// it may get the bot token (that origin, or `https://files.slack.com`).
    fn url_trust(&self, url: &str) -> (bool, bool) {
        let Ok(u) = reqwest::Url::parse(url) else {
            return (false, false);
        };
        let on_api = u.origin() == self.inner.api_origin.origin();
        let file_host = u.scheme() == "https"
            && u.host_str() == Some(FILE_HOST)
            && u.port_or_known_default() == Some(443);
        (on_api, on_api || file_host)
    }

    /// Upload one attachment of a final reply into its chat and thread; a file over the limit
    /// (or empty) becomes a note.
    async fn send_file(
        &self,
        chat: &str,
        thread: Option<&str>,
        f: &OutboundFile,
    ) -> Result<(), ChannelError> {
        let limit = self.inner.cfg.max_upload_bytes;
        if f.size > limit {
            return self
                .note(chat, thread, &too_big_note(&f.name, f.size, limit))
                .await;
        }
        let bytes = clawft_channel_core::media::read_file(f).await?;
        let size = bytes.len() as u64;
        if size > limit {
            return self
                .note(chat, thread, &too_big_note(&f.name, size, limit))
                .await;
        }
        if size == 0 {
            // Slack refuses a zero length (`missing_argument`).
            let note = format!("{} is empty, so it was not sent.", f.name);
            return self.note(chat, thread, &note).await;
        }
        let api = &self.inner.api;
        let (upload_url, file_id) = api.upload_url(&f.name, size).await?;
        if !self.url_trust(&upload_url).1 {
            return Err(ChannelError::Rejected(format!(
                "files.getUploadURLExternal returned an upload URL that is neither on https://{FILE_HOST}/ nor on channels.slack.api_url's origin; {} was not sent",
                f.name
            )));
        }
        api.upload_bytes(&upload_url, &f.name, &f.mime, &bytes)
            .await?;
        let mut body = json!({
            "files": [{"id": file_id, "title": f.name}],
            "channel_id": chat,
        });
        if let Some(t) = thread {
            body["thread_ts"] = Value::String(t.to_string());
        }
        api.call("files.completeUploadExternal", Token::Bot, &body)
            .await
            .map(drop)
    }

    /// Post a short plain note (a file that was not sent) in the message's thread.
    async fn note(&self, chat: &str, thread: Option<&str>, text: &str) -> Result<(), ChannelError> {
        for c in chunks(text) {
            self.post(chat, thread, &c, Gate::Wait).await?;
        }
        Ok(())
    }

    fn target<'a>(&'a self, msg: &'a OutboundMessage) -> Target<'a> {
        Target {
            ch: self,
            chat: msg.chat.as_str(),
            thread: msg.thread.as_ref().map(ThreadId::as_str),
            // A streamed draft is not worth waiting for: while the method is rate limited
            // its calls are skipped and the text shows later; a final reply waits.
            gate: if msg.kind() == OutboundKind::Delta {
                Gate::Skip
            } else {
                Gate::Wait
            },
        }
    }
}

/// The Slack side of a streamed draft or final reply: where one outbound message goes.
struct Target<'a> {
    ch: &'a SlackChannel,
    chat: &'a str,
    thread: Option<&'a str>,
    gate: Gate,
}

#[async_trait]
impl DraftPlatform for Target<'_> {
    type Id = String;
    type Text = String;

    fn preview(&self, markdown: &str) -> Option<String> {
        Some(draft_text(markdown)).filter(|t| !t.is_empty())
    }

    async fn post(&self, _slot: Slot, text: &String) -> Result<Option<String>, ChannelError> {
        self.ch
            .post(self.chat, self.thread, text, self.gate)
            .await
            .map(Some)
    }

    async fn edit(&self, ts: &String, text: &String) -> Result<Edited, ChannelError> {
        self.ch.update(self.chat, ts, text, self.gate).await?;
        Ok(Edited::Done)
    }
}

#[async_trait]
impl SendFiles for Target<'_> {
    /// Slack's upload answers no message `ts`: a file is delivered, nothing to refer to.
    async fn send_file(
        &self,
        _index: usize,
        file: &OutboundFile,
        _first: bool,
    ) -> Result<SentRef, ChannelError> {
        self.ch.send_file(self.chat, self.thread, file).await?;
        Ok(SentRef::Nothing)
    }
}

impl SendPlatform for Target<'_> {
    fn render(&self, markdown: &str) -> Vec<String> {
        chunks(markdown)
    }
}

/// The note posted instead of a file over the upload limit.
fn too_big_note(name: &str, size: u64, limit: u64) -> String {
    format!(
        "{name} ({}) is over the {} limit for files sent to Slack, so it was not sent.",
        human_size(size),
        human_size(limit)
    )
}

/// `150 MB`, `12 KB` (binary units, rounded up).
fn human_size(bytes: u64) -> String {
    const KB: u64 = 1024;
    const MB: u64 = 1024 * 1024;
    if bytes >= MB {
        format!("{} MB", bytes.div_ceil(MB))
    } else {
        format!("{} KB", bytes.div_ceil(KB))
    }
}

/// Markdown → rendered chunks of at most [`MAX_MESSAGE_CHARS`] characters, in order.
pub fn chunks(md: &str) -> Vec<String> {
    let mut out = Vec::new();
    chunk_into(md, SPLIT_CHARS, &mut out);
    out
}

fn chunk_into(md: &str, max: usize, out: &mut Vec<String>) {
    for piece in split_markdown(md, max, Measure::Chars) {
        let r = render::render(&piece);
        if r.chars().count() <= MAX_MESSAGE_CHARS || max <= 64 {
            if !r.trim().is_empty() {
                out.push(r);
            }
        } else {
            chunk_into(&piece, max / 2, out);
        }
    }
}

/// What a streamed draft shows: the first chunk of the text so far, with an ellipsis when
/// more follows.
fn draft_text(md: &str) -> String {
    let all = chunks(md);
    match all.len() {
        0 => String::new(),
        1 => all.into_iter().next().unwrap_or_default(),
        _ => {
            let first = all.into_iter().next().unwrap_or_default();
            let cut: String = first.chars().take(MAX_MESSAGE_CHARS - 2).collect();
            format!("{cut} …")
        }
    }
}

#[async_trait]
impl Channel for SlackChannel {
    fn id(&self) -> &ChannelId {
        &self.inner.cfg.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            streaming: self.inner.cfg.stream_edits,
            progress: false,
            max_message_bytes: MAX_MESSAGE_CHARS * 4,
            max_upload_bytes: self.inner.cfg.max_upload_bytes,
        }
    }

    async fn listen(
        &self,
        tx: mpsc::Sender<InboundDelivery>,
        cancel: CancellationToken,
    ) -> Result<(), ChannelError> {
        socket::run(self.inner.clone(), tx, cancel).await
    }

    async fn send(&self, msg: &OutboundMessage) -> Result<SentRef, ChannelError> {
        let caps = self.capabilities();
        // Repeated delta ids are ignored by the draft book.
        self.inner
            .send
            .send(&caps, msg, || Ok(self.target(msg)))
            .await
    }

    async fn media_request(&self, media: &MediaRef) -> Result<MediaRequest, ChannelError> {
        let url = match &media.url {
            Some(u) => u.clone(),
            // `file_access: check_file_info`: the event named the file without its URLs.
            None => self.inner.api.file_url(&media.id).await?,
        };
        let (trusted, credentials) = self.url_trust(&url);
        let headers = if credentials {
            vec![(
                "Authorization".to_string(),
                format!("Bearer {}", self.inner.cfg.token),
            )]
        } else {
            Vec::new()
        };
        Ok(MediaRequest {
            url,
            headers,
            trusted,
        })
    }

    /// A no-op: Slack has no typing indicator for bots in Socket Mode.
    async fn typing(&self, _chat: &ChatId, _thread: Option<&ThreadId>) -> Result<(), ChannelError> {
        Ok(())
    }

    fn state(&self) -> String {
        self.inner.status.locked().clone()
    }

    fn settled(&self, msg: &OutboundMessage) {
        self.inner.send.settled(msg);
    }
}
