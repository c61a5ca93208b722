//! The WhatsApp channel: the WhatsApp Business Cloud API (Meta's Graph API), spoken directly
//! with reqwest (no SDK).
//!
//! - **Inbound**: Meta POSTs webhooks to the gateway's HTTP listener, at
//!   `/whatsapp/<channel id>` ([`routes`]). Each is verified before anything else:
//!   `X-Hub-Signature-256: sha256=<hex>` is the HMAC-SHA256 of the raw body with the app
//!   secret, compared in constant time; unsigned or wrongly signed → 401, nothing delivered.
//!   The `GET` of the same path answers Meta's verification handshake (`hub.mode=subscribe`,
//!   `hub.verify_token` = the configured verify token → `hub.challenge` echoed; else 403).
//!   Every user message of the body becomes one [`InboundDelivery`] whose event id is the
//!   message's `wamid`; the webhook is answered 200 only after the daemon acknowledged every
//!   one (journaled, duplicate or refused), else 503, so Meta delivers it again (and the
//!   daemon deduplicates the retry by `wamid`).
//! - **Outbound**: `POST /{version}/{phone-number-id}/messages`. Markdown rendered to
//!   WhatsApp's markers ([`render`]), split under 4,096 characters; the first chunk quotes
//!   the user's message (`context.message_id`). The Cloud API has no idempotency key: the
//!   wamid of every chunk delivered is journaled (per outbound id and chunk) before the next
//!   is sent, and a resend skips the journaled ones.
//! - **24-hour window**: error 131047 (the user wrote more than 24 h ago) → the configured
//!   template is sent in place of the reply, or the send fails for good with a clear error.
//! - **Rate limits**: 130429, 131056, 80007, HTTP 429 → `RateLimited` with a delay (the
//!   `Retry-After` when given); 190 (token expired) → `Auth`.
//! - **Files**: inbound media ids become attachments, downloaded through `GET /{media-id}` →
//!   URL → `GET` with the access token; outbound files are uploaded
//!   (`POST /{phone-number-id}/media`) and sent by id, the count delivered journaled.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use clawft_channel_core::draft_journal::DraftJournal;
use clawft_channel_core::lock::MutexExt;
use clawft_channel_core::media::{MediaKind, MediaRef, MediaRequest, OutboundFile};
use clawft_channel_core::send::{send_files, SendFiles};
use clawft_channel_core::text::{split_markdown, Measure};
use clawft_channel_core::{
    Ack, Capabilities, Channel, ChannelError, ChannelId, ChatId, InboundDelivery, InboundEvent,
    OutboundMessage, PlatformEventId, SentRef, StateStore, ThreadId, UserId,
};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

mod api;
#[cfg(any(test, feature = "testing"))]
pub mod fake;
pub mod render;
mod settings;
#[cfg(test)]
mod tests;

pub use settings::{WhatsApp, WhatsAppFile, WhatsAppSettings};

use api::{Graph, OUTSIDE_WINDOW};

/// WhatsApp's limit for a text message body, in characters.
pub const MAX_MESSAGE_CHARS: usize = 4096;
/// Markdown characters per chunk before rendering (rendering only removes characters, but a
/// reopened code fence adds a few).
const CHUNK_CHARS: usize = 4000;
/// The Graph API version used when none is configured.
pub const DEFAULT_API_VERSION: &str = "v21.0";
/// The Graph API.
pub const DEFAULT_API_URL: &str = "https://graph.facebook.com";

/// A message template sent when a reply falls outside the 24-hour customer-service window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    /// Its name, as approved in WhatsApp Manager.
    pub name: String,
    /// Its language code (`en_US`).
    pub language: String,
}

/// What the channel needs.
pub struct WhatsAppConfig {
    /// Channel id (`whatsapp`, `whatsapp.work`): also the webhook path `/whatsapp/<id>`.
    pub id: ChannelId,
    /// The access token (a system user's permanent token).
    pub access_token: String,
    /// The app secret that signs the webhooks.
    pub app_secret: String,
    /// The verify token of the webhook handshake.
    pub verify_token: String,
    /// The business phone number's id.
    pub phone_number_id: String,
    /// The Graph API origin (`https://graph.facebook.com`; a fake in tests).
    pub api_url: String,
    /// The Graph API version (`v21.0`).
    pub api_version: String,
    /// The template for replies outside the 24-hour window.
    pub template: Option<Template>,
    /// The config key of the access token (named in auth errors).
    pub token_key: String,
    /// Durable state: the chunks and files delivered of each reply.
    pub state: Arc<dyn StateStore>,
}

struct Inner {
    cfg: WhatsAppConfig,
    graph: Graph,
    journal: DraftJournal,
    tx: Mutex<Option<mpsc::Sender<InboundDelivery>>>,
    /// The last inbound wamid of each chat (the read mark and typing indicator need one).
    last_inbound: Mutex<HashMap<String, String>>,
    state: Mutex<String>,
}

/// The WhatsApp channel of one phone number.
pub struct WhatsAppChannel {
    inner: Arc<Inner>,
}

/// The channels of this process, by id, that a webhook may be for. Several gateways in one
/// process (tests) may have a channel of the same id: the one whose app secret signed the
/// body (or whose verify token was given) is it.
static REGISTRY: Mutex<Vec<(String, Weak<Inner>)>> = Mutex::new(Vec::new());

fn registered(channel: &str) -> Vec<Arc<Inner>> {
    let mut reg = REGISTRY.locked();
    reg.retain(|(_, w)| w.strong_count() > 0);
    reg.iter()
        .filter(|(id, _)| id == channel)
        .filter_map(|(_, w)| w.upgrade())
        .collect()
}

impl WhatsAppChannel {
    /// Build the channel (no network yet).
    ///
    /// # Errors
    /// A setting missing or the HTTP client cannot be built.
    pub fn new(cfg: WhatsAppConfig) -> Result<Self, ChannelError> {
        for (what, v) in [
            ("access token", &cfg.access_token),
            ("app secret", &cfg.app_secret),
            ("verify token", &cfg.verify_token),
            ("phone number id", &cfg.phone_number_id),
        ] {
            if v.is_empty() {
                return Err(ChannelError::Fatal(format!("the WhatsApp {what} is empty")));
            }
        }
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| ChannelError::Fatal(format!("http client: {e}")))?;
        let graph = Graph {
            http,
            base: cfg.api_url.trim_end_matches('/').to_string(),
            version: cfg.api_version.clone(),
            phone_number_id: cfg.phone_number_id.clone(),
            token: cfg.access_token.clone(),
        };
        let inner = Arc::new(Inner {
            journal: DraftJournal::new(cfg.state.clone()),
            graph,
            cfg,
            tx: Mutex::new(None),
            last_inbound: Mutex::new(HashMap::new()),
            state: Mutex::new("waiting for webhooks".into()),
        });
        REGISTRY
            .locked()
            .push((inner.cfg.id.as_str().to_string(), Arc::downgrade(&inner)));
        Ok(Self { inner })
    }
}

/// The webhook routes (`GET`/`POST /whatsapp/{channel}`) to serve on the gateway's HTTP
/// listener. They authenticate on their own (signature, verify token): no bearer token.
pub fn routes() -> Router {
    Router::new().route("/whatsapp/{channel}", get(verify).post(webhook))
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn text(status: StatusCode, body: impl Into<String>) -> Response {
    (status, body.into()).into_response()
}

/// Meta's verification handshake.
async fn verify(Path(channel): Path<String>, Query(q): Query<HashMap<String, String>>) -> Response {
    let mode = q.get("hub.mode").map(String::as_str);
    let given = q.get("hub.verify_token").map_or("", String::as_str);
    let challenge = q.get("hub.challenge").map_or("", String::as_str);
    let ok = mode == Some("subscribe")
        && !given.is_empty()
        && registered(&channel)
            .iter()
            .any(|i| ct_eq(given.as_bytes(), i.cfg.verify_token.as_bytes()));
    if ok {
        tracing::info!(channel, "WhatsApp webhook verified");
        text(StatusCode::OK, challenge)
    } else {
        text(
            StatusCode::FORBIDDEN,
            "verification refused: hub.mode must be subscribe and hub.verify_token the configured verify token",
        )
    }
}

/// Whether `header` (`sha256=<hex>`) is the HMAC-SHA256 of `body` with `secret`.
pub fn signature_ok(secret: &str, header: &str, body: &[u8]) -> bool {
    let Some(hex) = header.trim().strip_prefix("sha256=") else {
        return false;
    };
    let Some(tag) = clawft_channel_core::unhex(hex) else {
        return false;
    };
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    // Constant time.
    ring::hmac::verify(&key, body, &tag).is_ok()
}

/// `sha256=<hex>` of `body` with `secret` (what Meta sends; the fake signs with it).
pub fn sign(secret: &str, body: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = ring::hmac::sign(&key, body);
    format!("sha256={}", clawft_channel_core::hex(tag.as_ref()))
}

/// A webhook delivery.
async fn webhook(Path(channel): Path<String>, headers: HeaderMap, body: Bytes) -> Response {
    let candidates = registered(&channel);
    if candidates.is_empty() {
        return text(
            StatusCode::NOT_FOUND,
            format!("no WhatsApp channel `{channel}` runs here"),
        );
    }
    let sig = headers
        .get("x-hub-signature-256")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mut signed: Vec<Arc<Inner>> = candidates
        .into_iter()
        .filter(|i| signature_ok(&i.cfg.app_secret, sig, &body))
        .collect();
    // A channel being replaced (reload) may still exist: the one listening takes it.
    signed.sort_by_key(|i| i.tx.locked().is_none());
    let Some(inner) = signed.into_iter().next() else {
        tracing::warn!(
            channel,
            "WhatsApp webhook refused: bad or missing X-Hub-Signature-256"
        );
        return text(
            StatusCode::UNAUTHORIZED,
            "X-Hub-Signature-256 missing or wrong: it must be sha256=HMAC-SHA256(app secret, body)",
        );
    };
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return text(StatusCode::BAD_REQUEST, "the body is not JSON");
    };
    let events = inner.events(&v);
    let tx = inner.tx.locked().clone();
    let Some(tx) = tx else {
        // Not listening (starting, restarting): Meta delivers it again.
        return text(StatusCode::SERVICE_UNAVAILABLE, "not ready, retry later");
    };
    for ev in events {
        let chat = ev.chat.as_str().to_string();
        let wamid = ev.event_id.as_str().to_string();
        let (d, ack) = InboundDelivery::new(ev);
        if tx.send(d).await.is_err() {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting down, retry later",
            );
        }
        match ack.await {
            Ok(Ack::Accepted | Ack::Duplicate) => {
                inner.last_inbound.locked().insert(chat, wamid);
            }
            Ok(Ack::Rejected(why)) => {
                tracing::debug!(channel, why, "WhatsApp message refused");
            }
            Ok(Ack::Unavailable(why)) => {
                return text(StatusCode::SERVICE_UNAVAILABLE, why);
            }
            Err(_) => {
                return text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not journaled, retry later",
                )
            }
        }
    }
    text(StatusCode::OK, "ok")
}

impl Inner {
    /// The user messages of a webhook body for this phone number.
    fn events(&self, v: &Value) -> Vec<InboundEvent> {
        let mut out = Vec::new();
        let empty = Vec::new();
        for entry in v["entry"].as_array().unwrap_or(&empty) {
            for change in entry["changes"].as_array().unwrap_or(&empty) {
                if change["field"] != "messages" {
                    continue;
                }
                let value = &change["value"];
                let phone = value["metadata"]["phone_number_id"].as_str().unwrap_or("");
                if phone != self.cfg.phone_number_id {
                    tracing::debug!(phone, "WhatsApp webhook for another phone number ignored");
                    continue;
                }
                for st in value["statuses"].as_array().unwrap_or(&empty) {
                    if st["status"] == "failed" {
                        tracing::warn!(
                            channel = %self.cfg.id,
                            recipient = st["recipient_id"].as_str().unwrap_or(""),
                            error = %st["errors"][0]["title"],
                            "WhatsApp reports a message undelivered"
                        );
                    }
                }
                for m in value["messages"].as_array().unwrap_or(&empty) {
                    if let Some(mut ev) = self.event(m) {
                        // The sender's profile name, from the contact entry with its wa_id.
                        ev.sender_name = value["contacts"]
                            .as_array()
                            .unwrap_or(&empty)
                            .iter()
                            .find(|c| c["wa_id"].as_str() == Some(ev.sender.as_str()))
                            .and_then(|c| c["profile"]["name"].as_str())
                            .and_then(|n| clawft_channel_core::display_name([n]));
                        out.push(ev);
                    }
                }
            }
        }
        out
    }

    fn event(&self, m: &Value) -> Option<InboundEvent> {
        let from = m["from"].as_str()?;
        let id = m["id"].as_str()?;
        let kind = m["type"].as_str().unwrap_or("");
        let mut attachments = Vec::new();
        let content = match kind {
            "text" => m["text"]["body"].as_str().unwrap_or("").to_string(),
            "button" => m["button"]["text"].as_str().unwrap_or("").to_string(),
            "interactive" => {
                let i = &m["interactive"];
                i["button_reply"]["title"]
                    .as_str()
                    .or_else(|| i["list_reply"]["title"].as_str())
                    .unwrap_or("")
                    .to_string()
            }
            "image" | "audio" | "video" | "document" | "sticker" | "voice" => {
                let f = &m[kind];
                let media_id = f["id"].as_str()?;
                let mime = f["mime_type"].as_str().map(str::to_string);
                let media_kind = match kind {
                    "image" | "sticker" => MediaKind::Image,
                    "audio" if f["voice"].as_bool() == Some(true) => MediaKind::Voice,
                    "voice" => MediaKind::Voice,
                    "audio" => MediaKind::Audio,
                    "video" => MediaKind::Video,
                    _ => MediaKind::Document,
                };
                let mut r = MediaRef::new(media_kind, media_id);
                r.mime = mime;
                r.name = f["filename"].as_str().map(str::to_string);
                attachments.push(r);
                f["caption"].as_str().unwrap_or("").to_string()
            }
            other => {
                tracing::debug!(kind = other, "WhatsApp message type not handled");
                return None;
            }
        };
        Some(InboundEvent {
            channel: self.cfg.id.clone(),
            chat: ChatId::new(from),
            thread: None,
            sender: UserId::new(from),
            sender_name: None,
            event_id: PlatformEventId::new(id),
            content,
            received_at_ms: clawft_channel_core::now_ms(),
            attachments,
            origin: clawft_channel_core::Origin::User,
        })
    }
}

/// The Markdown chunks of a reply, each under WhatsApp's limit once rendered.
pub fn chunks(text: &str) -> Vec<String> {
    if text.trim().is_empty() {
        return Vec::new();
    }
    split_markdown(text, CHUNK_CHARS, Measure::Chars)
        .iter()
        .map(|c| render::render(c))
        .collect()
}

/// The Cloud API's size limits for a file sent as `kind`.
fn upload_limit(kind: &str) -> u64 {
    match kind {
        "image" => 5 << 20,
        "audio" | "video" => 16 << 20,
        "sticker" => 500 << 10,
        _ => 100 << 20,
    }
}

fn media_type(f: &OutboundFile) -> &'static str {
    match f.kind {
        MediaKind::Image if matches!(f.mime.as_str(), "image/jpeg" | "image/png") => "image",
        MediaKind::Voice | MediaKind::Audio
            if matches!(
                f.mime.as_str(),
                "audio/ogg" | "audio/mpeg" | "audio/mp4" | "audio/aac" | "audio/amr"
            ) =>
        {
            "audio"
        }
        MediaKind::Video if matches!(f.mime.as_str(), "video/mp4" | "video/3gpp") => "video",
        _ => "document",
    }
}

impl WhatsAppChannel {
    fn message(&self, to: &str, kind: &str, payload: Value, context: Option<&str>) -> Value {
        let mut v = json!({
            "messaging_product": "whatsapp",
            "recipient_type": "individual",
            "to": to,
            "type": kind,
            kind: payload,
        });
        if let Some(c) = context {
            v["context"] = json!({ "message_id": c });
        }
        v
    }

    fn classify(&self, e: api::GraphError) -> ChannelError {
        e.classify(&self.inner.cfg.token_key)
    }

    /// Send the text chunks of `msg` not yet delivered; the first chunk's wamid, or
    /// `template:<wamid>` when the template went in its place.
    async fn send_text(&self, msg: &OutboundMessage) -> Result<Option<String>, ChannelError> {
        let chunks = chunks(msg.text());
        let journal = &self.inner.journal;
        let mut done: Vec<Option<String>> = journal.chunks(&msg.id).unwrap_or_default();
        if done
            .first()
            .and_then(|d| d.as_deref())
            .is_some_and(|d| d.starts_with("template:"))
        {
            // The template went in place of this reply already.
            return Ok(done[0].clone());
        }
        let context = msg
            .in_reply_to
            .as_ref()
            .map(PlatformEventId::as_str)
            .filter(|id| id.starts_with("wamid."));
        let to = msg.chat.as_str();
        for (i, chunk) in chunks.iter().enumerate() {
            if done.get(i).is_some_and(Option::is_some) {
                continue;
            }
            let body = self.message(
                to,
                "text",
                json!({ "body": chunk, "preview_url": false }),
                if i == 0 { context } else { None },
            );
            match self.inner.graph.send(&body).await {
                Ok(wamid) => {
                    if done.len() <= i {
                        done.resize(i + 1, None);
                    }
                    done[i] = Some(wamid);
                    journal.set_chunks(&msg.id, &done);
                }
                Err(e) if e.code == OUTSIDE_WINDOW && i == 0 => {
                    return self.outside_window(msg, e).await.map(Some);
                }
                Err(e) => return Err(self.classify(e)),
            }
        }
        Ok(done.first().cloned().flatten())
    }

    /// Error 131047: the template instead, or a clear error.
    async fn outside_window(
        &self,
        msg: &OutboundMessage,
        e: api::GraphError,
    ) -> Result<String, ChannelError> {
        let Some(t) = &self.inner.cfg.template else {
            return Err(ChannelError::Rejected(format!(
                "WhatsApp refused the reply to {}: the user's last message is more than 24 hours old, and outside that window only approved templates may be sent (WhatsApp error {}: {}). Set channels.whatsapp.template to send one instead.",
                msg.chat, e.code, e.message
            )));
        };
        let body = self.message(
            msg.chat.as_str(),
            "template",
            json!({ "name": t.name, "language": { "code": t.language } }),
            None,
        );
        let wamid = self
            .inner
            .graph
            .send(&body)
            .await
            .map_err(|e| self.classify(e))?;
        tracing::info!(
            channel = %self.inner.cfg.id,
            chat = %msg.chat,
            template = t.name,
            "reply outside WhatsApp's 24-hour window: the template was sent instead"
        );
        let marker = format!("template:{wamid}");
        self.inner
            .journal
            .set_chunks(&msg.id, &[Some(marker.clone())]);
        Ok(marker)
    }

    async fn note(&self, to: &str, text: &str) -> Result<(), ChannelError> {
        let body = self.message(to, "text", json!({ "body": text }), None);
        self.inner
            .graph
            .send(&body)
            .await
            .map(|_| ())
            .map_err(|e| self.classify(e))
    }

    async fn send_file(&self, to: &str, f: &OutboundFile) -> Result<(), ChannelError> {
        let kind = media_type(f);
        let limit = upload_limit(kind);
        if f.size > limit {
            let note = format!(
                "{} ({} MB) is over WhatsApp's {} MB limit for this kind of file, so it was not sent.",
                f.name,
                f.size.div_ceil(1 << 20),
                limit >> 20
            );
            return self.note(to, &note).await;
        }
        let bytes = clawft_channel_core::media::read_file(f).await?;
        let media_id = match self.inner.graph.upload(&f.name, &f.mime, &bytes).await {
            Ok(id) => id,
            Err(e) if e.status == 400 || e.status == 413 => {
                let note = format!("WhatsApp refused {}: {}", f.name, e.message);
                return self.note(to, &note).await;
            }
            Err(e) => return Err(self.classify(e)),
        };
        let mut payload = json!({ "id": media_id });
        if kind == "document" {
            payload["filename"] = json!(f.name);
        }
        let body = self.message(to, kind, payload, None);
        self.inner
            .graph
            .send(&body)
            .await
            .map(|_| ())
            .map_err(|e| self.classify(e))
    }
}

/// Where the files of one reply go: its chat.
struct Files<'a> {
    ch: &'a WhatsAppChannel,
    to: &'a str,
}

#[async_trait]
impl SendFiles for Files<'_> {
    /// Uploaded to the media endpoint, then sent as its own message, quoting nothing; a file
    /// over WhatsApp's limit for its kind (or refused) becomes a note.
    async fn send_file(
        &self,
        _index: usize,
        file: &OutboundFile,
        _first: bool,
    ) -> Result<SentRef, ChannelError> {
        self.ch.send_file(self.to, file).await?;
        Ok(SentRef::Nothing)
    }
}

#[async_trait]
impl Channel for WhatsAppChannel {
    fn id(&self) -> &ChannelId {
        &self.inner.cfg.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            streaming: false,
            progress: false,
            max_message_bytes: MAX_MESSAGE_CHARS * 4,
            max_upload_bytes: 100 << 20,
        }
    }

    async fn listen(
        &self,
        tx: mpsc::Sender<InboundDelivery>,
        cancel: CancellationToken,
    ) -> Result<(), ChannelError> {
        *self.inner.tx.locked() = Some(tx);
        *self.inner.state.locked() = format!(
            "receiving webhooks at /whatsapp/{}",
            self.inner.cfg.id.as_str()
        );
        cancel.cancelled().await;
        *self.inner.tx.locked() = None;
        Ok(())
    }

    async fn send(&self, msg: &OutboundMessage) -> Result<SentRef, ChannelError> {
        // Deltas and progress: WhatsApp shows neither.
        if !self.capabilities().takes(msg.kind()) {
            return Ok(SentRef::Nothing);
        }
        let first = self.send_text(msg).await?;
        let templated = first.as_deref().is_some_and(|f| f.starts_with("template:"));
        if !templated {
            let files = Files {
                ch: self,
                to: msg.chat.as_str(),
            };
            send_files(&self.inner.journal, &files, msg, false).await?;
        }
        Ok(SentRef::of(first.as_ref()))
    }

    async fn typing(&self, chat: &ChatId, _thread: Option<&ThreadId>) -> Result<(), ChannelError> {
        // The typing indicator marks the user's last message read and shows "typing…" (up to
        // 25 s or until the reply); it needs that message's id.
        let last = self.inner.last_inbound.locked().get(chat.as_str()).cloned();
        let Some(wamid) = last else {
            return Ok(());
        };
        let body = json!({
            "messaging_product": "whatsapp",
            "status": "read",
            "message_id": wamid,
            "typing_indicator": { "type": "text" },
        });
        self.inner
            .graph
            .send(&body)
            .await
            .map(|_| ())
            .map_err(|e| self.classify(e))
    }

    async fn media_request(&self, media: &MediaRef) -> Result<MediaRequest, ChannelError> {
        let url = self
            .inner
            .graph
            .media_url(&media.id)
            .await
            .map_err(|e| self.classify(e))?;
        let base = &self.inner.graph.base;
        let on_api = url.starts_with(&format!("{base}/"));
        let host = url
            .split_once("://")
            .map(|(_, r)| r.split(['/', '?', ':']).next().unwrap_or(""))
            .unwrap_or("");
        // Meta's media hosts (lookaside.fbsbx.com) need the access token; no other host gets it.
        let meta_host = url.starts_with("https://")
            && (host.ends_with(".fbsbx.com")
                || host.ends_with(".facebook.com")
                || host.ends_with(".whatsapp.net"));
        let headers = if on_api || meta_host {
            vec![(
                "Authorization".to_string(),
                format!("Bearer {}", self.inner.cfg.access_token),
            )]
        } else {
            Vec::new()
        };
        Ok(MediaRequest {
            url,
            headers,
            trusted: on_api,
        })
    }

    fn state(&self) -> String {
        self.inner.state.locked().clone()
    }

    fn settled(&self, msg: &OutboundMessage) {
        self.inner.journal.settle(msg);
    }
}
