//! The Discord channel: the gateway (WebSocket, API v10) for inbound messages and REST for
//! replies, typing and streamed edits.
//!
//! No loss: Discord has no per-event acknowledgement, so the adapter delivers gateway events
//! one at a time, waits for the daemon's [`Ack`](clawft_channel_core::Ack), and only then
//! advances the sequence it stores (`session_id`, `seq`, `resume_url` in the
//! [`StateStore`]). After a disconnect or a restart it RESUMEs from that sequence and Discord
//! replays what came after it; the daemon dedupes on `event_id` (the message id).
//!
//! The protocol is spoken directly (tokio-tungstenite + reqwest) rather than through serenity:
//! serenity 0.12's `Shard` always starts with `seq = 0` and no session (no RESUME across
//! restarts), advances its sequence when an event arrives rather than when it is handled, and
//! dispatches handlers on spawned tasks (no ordering, no acknowledgement point).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use clawft_channel_core::draft::{DraftOptions, DraftPlatform, Edited, Slot};
use clawft_channel_core::lock::MutexExt;
use clawft_channel_core::media::{self, MediaRef, MediaRequest, Multipart, OutboundFile};
use clawft_channel_core::send::{SendFiles, SendPath, SendPlatform};
use clawft_channel_core::{
    Capabilities, Channel, ChannelError, ChannelId, ChatId, InboundDelivery, OutboundMessage,
    PlatformEventId, SentRef, StateStore, ThreadId,
};
use reqwest::Method;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

#[cfg(any(test, feature = "testing"))]
pub mod fake;
mod gateway;
pub mod render;
mod rest;
mod settings;

pub use gateway::{parse_message, BotUser};
pub use settings::{Discord, DiscordFile, DiscordSettings};

/// State key of the gateway session id RESUME continues.
pub const SESSION_ID_KEY: &str = "session_id";
/// State key of the last sequence number the daemon acknowledged.
pub const SEQ_KEY: &str = "seq";
/// State key of the URL Discord named for resuming the session.
pub const RESUME_URL_KEY: &str = "resume_url";

/// Streaming drafts, finished replies and outbound progress entries remembered (each): a late
/// retry is not resent, a turn whose final never came is evicted.
const REMEMBERED: usize = 1024;

/// Largest file the bot uploads: Discord's limit for bots in servers without boosts (10 MiB).
/// A bigger attachment is replaced by a short note in the chat.
pub const MAX_UPLOAD_BYTES: u64 = 10 * 1024 * 1024;

/// Which group messages are delivered (DMs always are).
pub use clawft_channel_core::GroupMode;

/// Resolved settings of the Discord channel.
#[derive(Clone)]
pub struct DiscordConfig {
    /// Channel id (default `discord`).
    pub id: ChannelId,
    /// Bot token (`channels.discord.token`). Never printed by `Debug`.
    pub token: String,
    /// Base URL replacing `https://discord.com` for every REST call
    /// (`channels.discord.api_base_url`: a relay speaking Discord's API, or the fake in
    /// tests), e.g. `http://127.0.0.1:8080`. Not an HTTP proxy. The gateway URL still comes
    /// from `GET /api/v10/gateway/bot` through it unless `gateway_url` is set.
    pub api_base_url: Option<String>,
    /// Gateway WebSocket URL override (skips `GET /gateway/bot`), e.g.
    /// `wss://gateway.discord.gg`.
    pub gateway_url: Option<String>,
    /// Which guild messages are delivered (default `Mention`).
    pub group_mode: GroupMode,
    /// Stream replies by editing a draft message (default true).
    pub stream_edits: bool,
    /// Least time between two edits of a streamed draft (default 1.5 s).
    pub edit_interval: Duration,
    /// First reconnect delay, doubling up to 60 s (default 1 s).
    pub reconnect_backoff: Duration,
    /// Durable state: `session_id`, `seq`, `resume_url` for RESUME.
    pub state: Arc<dyn StateStore>,
}

impl DiscordConfig {
    /// Defaults for everything but the token and the state store.
    pub fn new(token: impl Into<String>, state: Arc<dyn StateStore>) -> Self {
        Self {
            id: ChannelId::new("discord"),
            token: token.into(),
            api_base_url: None,
            gateway_url: None,
            group_mode: GroupMode::Mention,
            stream_edits: true,
            edit_interval: Duration::from_millis(1500),
            reconnect_backoff: Duration::from_secs(1),
            state,
        }
    }
}

impl fmt::Debug for DiscordConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiscordConfig")
            .field("id", &self.id)
            .field("token", &"<redacted>")
            .field("api_base_url", &self.api_base_url)
            .field("gateway_url", &self.gateway_url)
            .field("group_mode", &self.group_mode)
            .field("stream_edits", &self.stream_edits)
            .field("edit_interval", &self.edit_interval)
            .field("reconnect_backoff", &self.reconnect_backoff)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    cfg: DiscordConfig,
    rest: rest::Rest,
    status: Mutex<String>,
    /// Streamed drafts, the delivery progress of final replies and the attachments delivered
    /// (`files:<id>`).
    send: SendPath<String, String>,
    /// The origin of the configured REST base: attachment URLs on it are fetched directly.
    api_origin: reqwest::Url,
    bot: Mutex<Option<BotUser>>,
}

impl Inner {
    fn set_status(&self, s: impl Into<String>) {
        *self.status.locked() = s.into();
    }
}

/// The Discord channel.
pub struct DiscordChannel {
    inner: Arc<Inner>,
}

impl fmt::Debug for DiscordChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiscordChannel")
            .field("cfg", &self.inner.cfg)
            .finish_non_exhaustive()
    }
}

/// A short, stable nonce for chunk `i` of outbound message `id` (Discord dedupes messages
/// with the same nonce when `enforce_nonce` is set, even across our restarts).
fn nonce(id: &str, i: usize) -> String {
    // FNV-1a 64.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}{i:x}").chars().take(25).collect()
}

/// The nonce of the streamed draft answering message `reply_to`.
fn draft_nonce(reply_to: &str) -> String {
    nonce(&format!("draft:{reply_to}"), 0)
}

/// `12.3 MB` (MiB, as Discord counts), rounded up to a tenth, `.0` dropped: a file just over
/// the limit reads `10.1 MB`, never `10 MB`.
fn megabytes(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let tenths = (bytes as f64 / (1024.0 * 1024.0) * 10.0).ceil();
    let s = format!("{:.1}", tenths / 10.0);
    format!("{} MB", s.strip_suffix(".0").unwrap_or(&s))
}

/// What the chat shows instead of a file over the upload limit (`limit`: ours; `None`: the one
/// Discord answered 413 for).
fn too_big_note(file: &OutboundFile, size: u64, limit: Option<u64>) -> String {
    let name: String = file
        .name
        .chars()
        .take(200)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    // The name shown literally: no Markdown in it takes effect.
    let mut escaped = String::with_capacity(name.len());
    for (i, c) in name.chars().enumerate() {
        let at_start = i == 0 && matches!(c, '#' | '-' | '>');
        if at_start || matches!(c, '\\' | '*' | '_' | '~' | '`' | '|') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    match limit {
        Some(limit) => format!(
            "{escaped} ({}) is over Discord's {} limit for bots, so it was not sent.",
            megabytes(size),
            megabytes(limit)
        ),
        None => format!(
            "{escaped} ({}) is over Discord's upload limit for this chat, so it was not sent.",
            megabytes(size)
        ),
    }
}

fn is_snowflake(s: &str) -> bool {
    !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit())
}

impl DiscordChannel {
    /// Build the channel (no network I/O until `listen`/`send`).
    ///
    /// # Errors
    /// `Auth` for an empty token, `Fatal` for an invalid `api_base_url`.
    pub fn new(cfg: DiscordConfig) -> Result<Self, ChannelError> {
        if cfg.token.trim().is_empty() {
            return Err(ChannelError::Auth(
                "no Discord bot token: set channels.discord.token".into(),
            ));
        }
        let base = cfg.api_base_url.as_deref().unwrap_or(rest::DISCORD_BASE);
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(ChannelError::Fatal(format!(
                "channels.discord.api_base_url must be an http:// or https:// URL, got `{base}`"
            )));
        }
        let api_origin = reqwest::Url::parse(base).map_err(|e| {
            ChannelError::Fatal(format!(
                "channels.discord.api_base_url `{base}` is not a valid URL: {e}"
            ))
        })?;
        let rest = rest::Rest::new(base, cfg.token.trim())?;
        Ok(Self {
            inner: Arc::new(Inner {
                send: SendPath::new(
                    DraftOptions {
                        edit_interval: cfg.edit_interval,
                        capacity: REMEMBERED,
                        skip_repeated_deltas: false,
                    },
                    cfg.state.clone(),
                ),
                api_origin,
                cfg,
                rest,
                status: Mutex::new("not started".into()),
                bot: Mutex::new(None),
            }),
        })
    }

    fn target(chat: &ChatId, thread: Option<&ThreadId>) -> Result<String, ChannelError> {
        // Threads are channels on Discord: a thread id, when given, is where to post.
        let id = thread.map_or(chat.as_str(), ThreadId::as_str);
        if is_snowflake(id) {
            Ok(id.to_string())
        } else {
            Err(ChannelError::Rejected(format!(
                "`{id}` is not a Discord channel id (a numeric snowflake)"
            )))
        }
    }

    async fn post(
        &self,
        channel: &str,
        content: &str,
        nonce: Option<String>,
        reply_to: Option<&str>,
    ) -> Result<String, ChannelError> {
        let mut body = json!({
            "content": content,
            "allowed_mentions": { "parse": [], "replied_user": false },
        });
        if let Some(n) = nonce {
            body["nonce"] = json!(n);
            body["enforce_nonce"] = json!(true);
        }
        if let Some(r) = reply_to.filter(|r| is_snowflake(r)) {
            body["message_reference"] = json!({"message_id": r, "fail_if_not_exists": false});
        }
        let v = self
            .inner
            .rest
            .call(
                Method::POST,
                &format!("POST /channels/{channel}/messages"),
                &format!("/channels/{channel}/messages"),
                Some(&body),
            )
            .await?;
        // A 2xx whose body we cannot read was still delivered: never post it again.
        Ok(v.get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string())
    }

    async fn edit(&self, channel: &str, mid: &str, content: &str) -> Result<(), ChannelError> {
        let body = json!({
            "content": content,
            "allowed_mentions": { "parse": [], "replied_user": false },
        });
        self.inner
            .rest
            .call(
                Method::PATCH,
                &format!("PATCH /channels/{channel}/messages/:id"),
                &format!("/channels/{channel}/messages/{mid}"),
                Some(&body),
            )
            .await
            .map(drop)
    }

    /// Upload one file as its own message (`payload_json` + `files[0]`), deduplicated by a
    /// nonce derived from the outbound id and the file's index. Answers the message id.
    async fn upload(
        &self,
        channel: &str,
        file: &OutboundFile,
        bytes: Vec<u8>,
        nonce: String,
    ) -> Result<String, ChannelError> {
        let payload = json!({
            "nonce": nonce,
            "enforce_nonce": true,
            "allowed_mentions": { "parse": [] },
            "attachments": [{ "id": 0, "filename": file.name }],
        });
        let mime = if file.mime.is_empty() {
            "application/octet-stream"
        } else {
            file.mime.as_str()
        };
        let (content_type, body) = Multipart::new()
            .text("payload_json", &payload.to_string())
            .file("files[0]", &file.name, mime, &bytes)
            .finish();
        // Only the body is held while it is on the wire.
        drop(bytes);
        let v = self
            .inner
            .rest
            .call_with(
                Method::POST,
                &format!("POST /channels/{channel}/messages"),
                &format!("/channels/{channel}/messages"),
                rest::Body::Multipart(content_type, body),
            )
            .await?;
        Ok(v.get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string())
    }

    fn target_of<'a>(&'a self, msg: &'a OutboundMessage) -> Result<Target<'a>, ChannelError> {
        Ok(Target {
            ch: self,
            channel: Self::target(&msg.chat, msg.thread.as_ref())?,
            msg_id: &msg.id,
            reply_to: msg.in_reply_to.as_ref().map(PlatformEventId::as_str),
        })
    }
}

/// The Discord side of a streamed draft or final reply: where one outbound message goes.
struct Target<'a> {
    ch: &'a DiscordChannel,
    channel: String,
    /// The outbound id (the nonces of its chunks derive from it).
    msg_id: &'a str,
    /// The user's message the draft and the first chunk reply to.
    reply_to: Option<&'a str>,
}

#[async_trait]
impl DraftPlatform for Target<'_> {
    type Id = String;
    type Text = String;

    /// The first chunk of the text so far, with an ellipsis when more follows.
    fn preview(&self, markdown: &str) -> Option<String> {
        if markdown.trim().is_empty() {
            return None;
        }
        let chunks = render::render_chunks(markdown);
        let first = chunks.first()?;
        Some(if chunks.len() > 1 {
            let mut p: String = first.chars().take(render::LIMIT - 1).collect();
            p.push('…');
            p
        } else {
            first.clone()
        })
    }

    /// Discord refuses empty messages: a draft whose final is empty shows an ellipsis.
    fn empty_final(&self) -> Option<String> {
        Some("\u{2026}".into())
    }

    async fn post(&self, slot: Slot, content: &String) -> Result<Option<String>, ChannelError> {
        match slot {
            Slot::Draft => {
                // The draft's nonce derives from the message it answers: a draft posted again
                // after a restart (its id not journaled yet) is deduplicated by Discord.
                let nonce = self.reply_to.map(draft_nonce);
                let mid = self
                    .ch
                    .post(&self.channel, content, nonce, self.reply_to)
                    .await?;
                Ok(Some(mid).filter(|m| !m.is_empty()))
            }
            Slot::Chunk(i) => {
                let reply_to = if i == 0 { self.reply_to } else { None };
                self.ch
                    .post(
                        &self.channel,
                        content,
                        Some(nonce(self.msg_id, i)),
                        reply_to,
                    )
                    .await
                    .map(Some)
            }
        }
    }

    async fn edit(&self, id: &String, content: &String) -> Result<Edited, ChannelError> {
        self.ch.edit(&self.channel, id, content).await?;
        Ok(Edited::Done)
    }
}

#[async_trait]
impl SendFiles for Target<'_> {
    /// Each file is its own message (quoting nothing), deduplicated by a nonce from the
    /// outbound id and the file's index. A file over [`MAX_UPLOAD_BYTES`] (or the chat's lower
    /// limit) is replaced by a note.
    async fn send_file(
        &self,
        index: usize,
        file: &OutboundFile,
        _first: bool,
    ) -> Result<SentRef, ChannelError> {
        let nonce = nonce(&format!("file:{}", self.msg_id), index);
        if file.size > MAX_UPLOAD_BYTES {
            let note = too_big_note(file, file.size, Some(MAX_UPLOAD_BYTES));
            return self
                .ch
                .post(&self.channel, &note, Some(nonce), None)
                .await
                .map(SentRef::from);
        }
        let bytes = media::read_file(file).await?;
        let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
        if len > MAX_UPLOAD_BYTES {
            // It grew after it was queued.
            let note = too_big_note(file, len, Some(MAX_UPLOAD_BYTES));
            return self
                .ch
                .post(&self.channel, &note, Some(nonce), None)
                .await
                .map(SentRef::from);
        }
        match self
            .ch
            .upload(&self.channel, file, bytes, nonce.clone())
            .await
        {
            // A chat whose limit is lower than ours: a note as well.
            Err(e) if rest::is_too_large(&e) => {
                let note = too_big_note(file, len, None);
                self.ch
                    .post(&self.channel, &note, Some(nonce), None)
                    .await
                    .map(SentRef::from)
            }
            r => r.map(SentRef::from),
        }
    }
}

impl SendPlatform for Target<'_> {
    fn render(&self, markdown: &str) -> Vec<String> {
        render::render_chunks(markdown)
    }
}

#[async_trait]
impl Channel for DiscordChannel {
    fn id(&self) -> &ChannelId {
        &self.inner.cfg.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            streaming: self.inner.cfg.stream_edits,
            progress: false,
            // 2000 characters of at most 4 bytes.
            max_message_bytes: render::LIMIT * 4,
            max_upload_bytes: MAX_UPLOAD_BYTES,
        }
    }

    async fn listen(
        &self,
        tx: mpsc::Sender<InboundDelivery>,
        cancel: CancellationToken,
    ) -> Result<(), ChannelError> {
        gateway::run(self.inner.clone(), tx, cancel).await
    }

    async fn send(&self, msg: &OutboundMessage) -> Result<SentRef, ChannelError> {
        let caps = self.capabilities();
        self.inner
            .send
            .send(&caps, msg, || self.target_of(msg))
            .await
    }

    async fn typing(&self, chat: &ChatId, thread: Option<&ThreadId>) -> Result<(), ChannelError> {
        let channel = Self::target(chat, thread)?;
        self.inner
            .rest
            .call(
                Method::POST,
                &format!("POST /channels/{channel}/typing"),
                &format!("/channels/{channel}/typing"),
                None,
            )
            .await
            .map(drop)
    }

    /// The attachment's CDN `url` as the payload gave it, without credentials (Discord's CDN
    /// URLs are signed). Trusted only when it is on the configured API origin (the fake in
    /// tests); `cdn.discordapp.com` goes through the daemon's SSRF guard.
    async fn media_request(&self, m: &MediaRef) -> Result<MediaRequest, ChannelError> {
        let url = m.url.as_deref().unwrap_or_default();
        let parsed = reqwest::Url::parse(url)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
        let Some(parsed) = parsed else {
            return Err(ChannelError::Rejected(format!(
                "Discord attachment {} has no http(s) URL to download it from",
                m.id
            )));
        };
        Ok(MediaRequest {
            url: url.to_string(),
            headers: Vec::new(),
            trusted: parsed.origin() == self.inner.api_origin.origin(),
        })
    }

    fn state(&self) -> String {
        self.inner.status.locked().clone()
    }

    fn settled(&self, msg: &OutboundMessage) {
        self.inner.send.settled(msg);
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod media_tests;
