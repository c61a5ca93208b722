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

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use clawft_channel_core::{
    Capabilities, Channel, ChannelError, ChannelId, ChatId, InboundDelivery, OutboundKind,
    OutboundMessage, PlatformEventId, SentRef, StateStore, ThreadId,
};
use reqwest::Method;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[cfg(any(test, feature = "testing"))]
pub mod fake;
mod gateway;
pub mod render;
mod rest;

pub use gateway::{parse_message, BotUser};

/// Outbound messages whose completion is remembered (a late retry is not resent).
const COMPLETED_CAP: usize = 1024;
/// Streaming drafts kept at once (a turn whose final never came is evicted).
const DRAFTS_CAP: usize = 256;

/// Which group messages are delivered (DMs always are).
pub use clawft_channel_core::GroupMode;

/// Resolved settings of the Discord channel.
#[derive(Clone)]
pub struct DiscordConfig {
    /// Channel id (default `discord`).
    pub id: ChannelId,
    /// Bot token (`channels.discord.token`). Never printed by `Debug`.
    pub token: String,
    /// Base URL replacing `https://discord.com` for every REST call (an operator's API proxy,
    /// or the fake in tests), e.g. `http://127.0.0.1:8080`. The gateway URL still comes from
    /// `GET /api/v10/gateway/bot` through it.
    pub proxy: Option<String>,
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
            proxy: None,
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
            .field("proxy", &self.proxy)
            .field("gateway_url", &self.gateway_url)
            .field("group_mode", &self.group_mode)
            .field("stream_edits", &self.stream_edits)
            .field("edit_interval", &self.edit_interval)
            .field("reconnect_backoff", &self.reconnect_backoff)
            .finish_non_exhaustive()
    }
}

/// A streamed reply being shown as one draft message.
#[derive(Default)]
struct Draft {
    text: String,
    message_id: Option<String>,
    last_update: Option<Instant>,
}

#[derive(Default)]
struct Outbox {
    /// msg.id → ids of the chunks already delivered.
    progress: HashMap<String, Vec<String>>,
    /// Completed msg.ids with their first message id, oldest first.
    completed: VecDeque<(String, String)>,
}

pub(crate) struct Inner {
    cfg: DiscordConfig,
    rest: rest::Rest,
    status: Mutex<String>,
    outbox: Mutex<Outbox>,
    drafts: Mutex<VecDeque<(String, Arc<tokio::sync::Mutex<Draft>>)>>,
    bot: Mutex<Option<BotUser>>,
}

impl Inner {
    fn set_status(&self, s: impl Into<String>) {
        *self.status.lock().unwrap_or_else(PoisonError::into_inner) = s.into();
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

fn is_snowflake(s: &str) -> bool {
    !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit())
}

impl DiscordChannel {
    /// Build the channel (no network I/O until `listen`/`send`).
    ///
    /// # Errors
    /// `Auth` for an empty token, `Fatal` for an invalid proxy URL.
    pub fn new(cfg: DiscordConfig) -> Result<Self, ChannelError> {
        if cfg.token.trim().is_empty() {
            return Err(ChannelError::Auth(
                "no Discord bot token: set channels.discord.token".into(),
            ));
        }
        let base = cfg.proxy.as_deref().unwrap_or(rest::DISCORD_BASE);
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(ChannelError::Fatal(format!(
                "channels.discord.proxy must be an http:// or https:// URL, got `{base}`"
            )));
        }
        let rest = rest::Rest::new(base, cfg.token.trim())?;
        Ok(Self {
            inner: Arc::new(Inner {
                cfg,
                rest,
                status: Mutex::new("not started".into()),
                outbox: Mutex::new(Outbox::default()),
                drafts: Mutex::new(VecDeque::new()),
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

    fn draft_key(msg: &OutboundMessage) -> Option<String> {
        msg.in_reply_to
            .as_ref()
            .map(|r| format!("{}\u{0}{}", msg.chat, r))
    }

    fn draft(&self, key: &str, create: bool) -> Option<Arc<tokio::sync::Mutex<Draft>>> {
        let mut d = self
            .inner
            .drafts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((_, v)) = d.iter().find(|(k, _)| k == key) {
            return Some(v.clone());
        }
        if !create {
            return None;
        }
        let v = Arc::new(tokio::sync::Mutex::new(Draft::default()));
        d.push_back((key.to_string(), v.clone()));
        while d.len() > DRAFTS_CAP {
            d.pop_front();
        }
        Some(v)
    }

    fn drop_draft(&self, key: &str) {
        self.inner
            .drafts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(k, _)| k != key);
    }

    async fn send_delta(&self, msg: &OutboundMessage) -> Result<SentRef, ChannelError> {
        let (Some(key), true) = (Self::draft_key(msg), self.inner.cfg.stream_edits) else {
            return Ok(SentRef(String::new()));
        };
        let channel = Self::target(&msg.chat, msg.thread.as_ref())?;
        let Some(draft) = self.draft(&key, true) else {
            return Ok(SentRef(String::new()));
        };
        let mut d = draft.lock().await;
        d.text.push_str(&msg.content);
        let due = d
            .last_update
            .is_none_or(|t| t.elapsed() >= self.inner.cfg.edit_interval);
        if !due || d.text.trim().is_empty() {
            return Ok(SentRef(d.message_id.clone().unwrap_or_default()));
        }
        let chunks = render::render_chunks(&d.text);
        let Some(first) = chunks.first() else {
            return Ok(SentRef(String::new()));
        };
        let preview = if chunks.len() > 1 {
            let mut p: String = first.chars().take(render::LIMIT - 1).collect();
            p.push('…');
            p
        } else {
            first.clone()
        };
        d.last_update = Some(Instant::now());
        match d.message_id.clone() {
            Some(mid) => {
                self.edit(&channel, &mid, &preview).await?;
                Ok(SentRef(mid))
            }
            None => {
                let reply_to = msg.in_reply_to.as_ref().map(PlatformEventId::as_str);
                let mid = self.post(&channel, &preview, None, reply_to).await?;
                d.message_id = Some(mid.clone()).filter(|m| !m.is_empty());
                Ok(SentRef(mid))
            }
        }
    }

    async fn send_final(&self, msg: &OutboundMessage) -> Result<SentRef, ChannelError> {
        {
            let ob = self
                .inner
                .outbox
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some((_, first)) = ob.completed.iter().find(|(id, _)| *id == msg.id) {
                return Ok(SentRef(first.clone()));
            }
        }
        let channel = Self::target(&msg.chat, msg.thread.as_ref())?;
        let key = Self::draft_key(msg).filter(|_| self.inner.cfg.stream_edits);
        let draft = key.as_deref().and_then(|k| self.draft(k, false));
        let mut draft_guard = match &draft {
            Some(d) => Some(d.lock().await),
            None => None,
        };
        let draft_id = draft_guard.as_ref().and_then(|d| d.message_id.clone());
        let mut chunks = render::render_chunks(&msg.content);
        if chunks.is_empty() {
            if draft_id.is_none() {
                return Ok(SentRef(String::new()));
            }
            chunks.push("\u{2026}".into());
        }
        let mut delivered = self
            .inner
            .outbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .progress
            .get(&msg.id)
            .cloned()
            .unwrap_or_default();
        let reply_to = msg.in_reply_to.as_ref().map(PlatformEventId::as_str);
        for (i, chunk) in chunks.iter().enumerate().skip(delivered.len()) {
            let r = match (&draft_id, i) {
                (Some(mid), 0) => self.edit(&channel, mid, chunk).await.map(|()| mid.clone()),
                _ => {
                    let r = if i == 0 { reply_to } else { None };
                    self.post(&channel, chunk, Some(nonce(&msg.id, i)), r).await
                }
            };
            match r {
                Ok(mid) => {
                    delivered.push(mid);
                    self.inner
                        .outbox
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .progress
                        .insert(msg.id.clone(), delivered.clone());
                }
                Err(e) => return Err(e),
            }
        }
        let first = delivered.first().cloned().unwrap_or_default();
        {
            let mut ob = self
                .inner
                .outbox
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            ob.progress.remove(&msg.id);
            ob.completed.push_back((msg.id.clone(), first.clone()));
            while ob.completed.len() > COMPLETED_CAP {
                ob.completed.pop_front();
            }
        }
        draft_guard.take();
        if let Some(k) = key {
            self.drop_draft(&k);
        }
        Ok(SentRef(first))
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
        match msg.kind {
            OutboundKind::Progress => Ok(SentRef(String::new())),
            OutboundKind::Delta => self.send_delta(msg).await,
            OutboundKind::Final | OutboundKind::Error => self.send_final(msg).await,
        }
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

    fn state(&self) -> String {
        self.inner
            .status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests;
