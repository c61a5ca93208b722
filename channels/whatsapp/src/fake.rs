//! A fake WhatsApp Business Cloud API on 127.0.0.1, strict like Meta's: the Graph API
//! endpoints the channel calls (`POST /{version}/{phone-number-id}/messages`,
//! `POST /{version}/{phone-number-id}/media`, `GET /{version}/{media-id}`, the media download),
//! each refusing a wrong access token with the error object of code 190, bad payloads with
//! Graph error objects (code 100), messages outside the 24-hour customer-service window with
//! 131047 and unknown templates with 132001; and Meta's side of the webhooks: every user
//! message is POSTed to the configured webhook URL signed with the app secret
//! (`X-Hub-Signature-256`), and retried until it is answered 200.
//!
//! ```ignore
//! let wa = FakeWhatsApp::start().await;
//! wa.set_webhook(format!("http://{gateway}/whatsapp/whatsapp"));
//! let wamid = wa.push_text("15550001111", "hello");
//! let sent = wa.wait_sent(1, Duration::from_secs(5)).await;
//! ```

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clawft_channel_core::lock::MutexExt;
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// The access token the fake accepts.
pub const TOKEN: &str = "EAAG-fake-access-token";
/// The business phone number's id.
pub const PHONE_NUMBER_ID: &str = "106540352242922";
/// The Graph API version.
pub const VERSION: &str = "v21.0";
/// The one approved template.
pub const TEMPLATE: &str = "reply_waiting";

/// A failure the next message send answers (status reads and typing are not affected).
#[derive(Clone, Debug)]
pub enum Failure {
    /// HTTP 429 with `Retry-After` (seconds) and error code 80007.
    Http429 { retry_after_secs: u64 },
    /// HTTP 400 with this Graph error code (130429 throughput, 131056 pair rate, ...).
    Code(i64),
    /// The token expired: HTTP 401, code 190.
    TokenExpired,
    /// HTTP 500 after the message was accepted (the answer is lost: the client cannot know).
    AcceptedThen500,
    /// No failure: this send goes through (to fail a later one).
    Succeed,
}

/// A message the business sent.
#[derive(Clone, Debug, Default)]
pub struct Sent {
    pub wamid: String,
    pub to: String,
    /// `text`, `image`, `audio`, `video`, `document`, `template`.
    pub kind: String,
    pub text: String,
    /// `context.message_id`.
    pub context: Option<String>,
    pub media_id: Option<String>,
    pub filename: Option<String>,
    pub template: Option<String>,
}

#[derive(Default)]
struct Shared {
    sent: Vec<Sent>,
    /// Typing indicators / read marks: the message ids.
    reads: Vec<String>,
    /// Media by id: (mime, file name, bytes).
    media: HashMap<String, (String, Option<String>, Vec<u8>)>,
    /// Users whose 24-hour window is open.
    open: HashSet<String>,
    failures: VecDeque<Failure>,
    webhook: Option<String>,
    /// Webhook deliveries: (wamid, answered status).
    deliveries: Vec<(String, u16)>,
    /// Inbound wamids.
    inbound: HashSet<String>,
    /// Payloads by wamid, for redelivery.
    payloads: HashMap<String, Value>,
    seq: u64,
    /// Requests refused for the token (canary of a leaked or wrong token).
    unauthorized: usize,
    /// Sends refused with a Graph error: the codes.
    refused: Vec<i64>,
}

/// The fake.
#[derive(Clone)]
pub struct FakeWhatsApp {
    shared: Arc<Mutex<Shared>>,
    /// The app secret this fake signs webhooks with: its own, so the gateways of parallel
    /// tests in one process never take each other's webhooks.
    secret: String,
    base: String,
    http: reqwest::Client,
}

fn graph_error(status: StatusCode, code: i64, message: &str) -> Response {
    (
        status,
        Json(json!({ "error": {
            "message": message,
            "type": if code == 190 { "OAuthException" } else { "GraphMethodException" },
            "code": code,
            "error_data": { "messaging_product": "whatsapp", "details": message },
            "fbtrace_id": "AbCdEfFake",
        }})),
    )
        .into_response()
}

fn authorized(h: &HeaderMap) -> bool {
    h.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {TOKEN}"))
}

fn bad_token(s: &Arc<Mutex<Shared>>) -> Response {
    s.locked().unauthorized += 1;
    graph_error(
        StatusCode::UNAUTHORIZED,
        190,
        "Error validating access token: Session has expired.",
    )
}

impl FakeWhatsApp {
    /// Start on an ephemeral port.
    ///
    /// # Panics
    /// If it cannot bind.
    #[allow(clippy::unwrap_used, clippy::expect_used)]
    pub async fn start() -> Self {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let shared = Arc::new(Mutex::new(Shared::default()));
        let base = format!("http://{addr}");
        let app = Router::new()
            .route("/dl/{id}", get(download))
            .route("/{version}/{id}", get(media_info))
            .route("/{version}/{phone}/messages", post(messages))
            .route("/{version}/{phone}/media", post(upload))
            .with_state((shared.clone(), base.clone()));
        tokio::spawn(async move {
            let _ = axum::serve(l, app).await;
        });
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        Self {
            shared,
            secret: format!("fake-app-secret-{}-{nanos:09}", addr.port()),
            base,
            http: reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("client"),
        }
    }

    /// The Graph API origin (the channel's `api_url`).
    pub fn api_url(&self) -> String {
        self.base.clone()
    }

    /// The app secret the webhooks are signed with.
    pub fn app_secret(&self) -> String {
        self.secret.clone()
    }

    /// A verify token for the handshake (the gateway's setting; the fake does not check it).
    pub fn verify_token(&self) -> String {
        format!("verify-{}", self.secret)
    }

    /// Where webhooks go (the gateway's `/whatsapp/<channel>`).
    pub fn set_webhook(&self, url: impl Into<String>) {
        self.shared.locked().webhook = Some(url.into());
    }

    /// The next message send fails so.
    pub fn fail_next(&self, f: Failure) {
        self.shared.locked().failures.push_back(f);
    }

    /// Close `user`'s 24-hour window (their last message is older than a day).
    pub fn close_window(&self, user: &str) {
        self.shared.locked().open.remove(user);
    }

    /// What the business sent.
    pub fn sent(&self) -> Vec<Sent> {
        self.shared.locked().sent.clone()
    }

    /// Message ids marked read (with a typing indicator).
    pub fn reads(&self) -> Vec<String> {
        self.shared.locked().reads.clone()
    }

    /// The Graph error codes sends were refused with (rate limits, the window...).
    pub fn refused(&self) -> Vec<i64> {
        self.shared.locked().refused.clone()
    }

    /// Requests refused for their token.
    pub fn unauthorized(&self) -> usize {
        self.shared.locked().unauthorized
    }

    /// The bytes of an uploaded (or inbound) media id.
    pub fn media(&self, id: &str) -> Option<(String, Option<String>, Vec<u8>)> {
        self.shared.locked().media.get(id).cloned()
    }

    /// The webhook deliveries of `wamid` so far: the status each was answered.
    pub fn deliveries(&self, wamid: &str) -> Vec<u16> {
        self.shared
            .locked()
            .deliveries
            .iter()
            .filter(|(w, _)| w == wamid)
            .map(|(_, s)| *s)
            .collect()
    }

    /// Wait until `n` messages were sent (or `timeout`).
    pub async fn wait_sent(&self, n: usize, timeout: Duration) -> Vec<Sent> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let s = self.sent();
            if s.len() >= n || tokio::time::Instant::now() > deadline {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn next_id(&self, prefix: &str) -> String {
        let mut s = self.shared.locked();
        s.seq += 1;
        format!("{prefix}{:016X}", s.seq)
    }

    /// The webhook body of one message from `from`.
    pub fn payload(from: &str, message: Value) -> Value {
        json!({
            "object": "whatsapp_business_account",
            "entry": [{
                "id": "102290129340398",
                "changes": [{
                    "field": "messages",
                    "value": {
                        "messaging_product": "whatsapp",
                        "metadata": { "display_phone_number": "15550783881", "phone_number_id": PHONE_NUMBER_ID },
                        "contacts": [{ "profile": { "name": "Test User" }, "wa_id": from }],
                        "messages": [message],
                    },
                }],
            }],
        })
    }

    /// `from` writes `text`: their window opens and the webhook is delivered (retried until
    /// answered 200). The message's wamid.
    pub fn push_text(&self, from: &str, text: &str) -> String {
        let wamid = self.next_id("wamid.HBgL");
        let msg = json!({
            "from": from, "id": wamid, "timestamp": "1700000000",
            "type": "text", "text": { "body": text },
        });
        self.push(from, &wamid, msg);
        wamid
    }

    /// `from` sends a file (`kind` `image`, `audio`, `video`, `document`) with a caption.
    pub fn push_media(
        &self,
        from: &str,
        kind: &str,
        mime: &str,
        bytes: &[u8],
        caption: &str,
    ) -> String {
        let media_id = self.next_id("");
        self.shared
            .locked()
            .media
            .insert(media_id.clone(), (mime.to_string(), None, bytes.to_vec()));
        let wamid = self.next_id("wamid.HBgL");
        let mut file = json!({ "id": media_id, "mime_type": mime, "sha256": "fake" });
        if !caption.is_empty() {
            file["caption"] = json!(caption);
        }
        if kind == "audio" {
            file["voice"] = json!(true);
        }
        let msg = json!({
            "from": from, "id": wamid, "timestamp": "1700000000",
            "type": kind, kind: file,
        });
        self.push(from, &wamid, msg);
        wamid
    }

    fn push(&self, from: &str, wamid: &str, msg: Value) {
        let body = Self::payload(from, msg);
        {
            let mut s = self.shared.locked();
            s.open.insert(from.to_string());
            s.inbound.insert(wamid.to_string());
            s.payloads.insert(wamid.to_string(), body.clone());
        }
        self.deliver(wamid, body);
    }

    /// Deliver the webhook of `wamid` once more (Meta's at-least-once delivery).
    pub fn redeliver(&self, wamid: &str) -> bool {
        let body = self.shared.locked().payloads.get(wamid).cloned();
        match body {
            Some(b) => {
                self.deliver(wamid, b);
                true
            }
            None => false,
        }
    }

    /// POST `body` signed to the webhook, retrying (100 ms, doubling to 2 s; at most 30
    /// attempts) until it is answered 200.
    fn deliver(&self, wamid: &str, body: Value) {
        let this = self.clone();
        let wamid = wamid.to_string();
        tokio::spawn(async move {
            let raw = body.to_string();
            let sig = crate::sign(&this.secret, raw.as_bytes());
            let mut wait = Duration::from_millis(100);
            for _ in 0..30 {
                let url = this.shared.locked().webhook.clone();
                if let Some(url) = url {
                    let r = this
                        .http
                        .post(&url)
                        .header("content-type", "application/json")
                        .header("x-hub-signature-256", &sig)
                        .body(raw.clone())
                        .send()
                        .await;
                    let status = r.map(|r| r.status().as_u16()).unwrap_or(0);
                    this.shared
                        .locked()
                        .deliveries
                        .push((wamid.clone(), status));
                    if status == 200 {
                        return;
                    }
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
        });
    }
}

type St = State<(Arc<Mutex<Shared>>, String)>;

async fn messages(
    State((s, _)): St,
    Path((_version, phone)): Path<(String, String)>,
    h: HeaderMap,
    body: Bytes,
) -> Response {
    if !authorized(&h) {
        return bad_token(&s);
    }
    if phone != PHONE_NUMBER_ID {
        return graph_error(
            StatusCode::BAD_REQUEST,
            100,
            &format!("Unsupported post request. Object with ID '{phone}' does not exist"),
        );
    }
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return graph_error(StatusCode::BAD_REQUEST, 100, "(#100) Invalid JSON body");
    };
    if v["messaging_product"] != "whatsapp" {
        return graph_error(
            StatusCode::BAD_REQUEST,
            100,
            "(#100) The parameter messaging_product is required.",
        );
    }
    // Read mark + typing indicator.
    if v["status"] == "read" {
        let id = v["message_id"].as_str().unwrap_or("");
        let mut g = s.locked();
        if !g.inbound.contains(id) {
            return graph_error(
                StatusCode::BAD_REQUEST,
                100,
                "(#100) Invalid parameter: message_id",
            );
        }
        g.reads.push(id.to_string());
        return Json(json!({ "success": true })).into_response();
    }
    let to = v["to"].as_str().unwrap_or("");
    if to.is_empty() || !to.bytes().all(|b| b.is_ascii_digit()) {
        return graph_error(StatusCode::BAD_REQUEST, 100, "(#100) Invalid parameter: to");
    }
    let kind = v["type"].as_str().unwrap_or("text").to_string();
    let mut sent = Sent {
        to: to.to_string(),
        kind: kind.clone(),
        context: v["context"]["message_id"].as_str().map(str::to_string),
        ..Sent::default()
    };
    let mut g = s.locked();
    match kind.as_str() {
        "text" => {
            let Some(b) = v["text"]["body"].as_str().filter(|b| !b.is_empty()) else {
                return graph_error(
                    StatusCode::BAD_REQUEST,
                    100,
                    "(#100) The parameter text['body'] is required.",
                );
            };
            if b.chars().count() > 4096 {
                return graph_error(
                    StatusCode::BAD_REQUEST,
                    100,
                    "(#100) Param text['body'] must be at most 4096 characters long.",
                );
            }
            sent.text = b.to_string();
        }
        "image" | "audio" | "video" | "document" | "sticker" => {
            let id = v[kind.as_str()]["id"].as_str().unwrap_or("");
            if !g.media.contains_key(id) {
                return graph_error(
                    StatusCode::BAD_REQUEST,
                    131_053,
                    "Media upload error: unknown media id",
                );
            }
            sent.media_id = Some(id.to_string());
            sent.filename = v[kind.as_str()]["filename"].as_str().map(str::to_string);
            sent.text = v[kind.as_str()]["caption"]
                .as_str()
                .unwrap_or("")
                .to_string();
        }
        "template" => {
            let name = v["template"]["name"].as_str().unwrap_or("");
            if name != TEMPLATE || v["template"]["language"]["code"].as_str().is_none() {
                return graph_error(
                    StatusCode::BAD_REQUEST,
                    132_001,
                    "Template name does not exist in the translation",
                );
            }
            sent.template = Some(name.to_string());
        }
        other => {
            return graph_error(
                StatusCode::BAD_REQUEST,
                100,
                &format!("(#100) Invalid parameter: type {other}"),
            )
        }
    }
    if kind != "template" && !g.open.contains(to) {
        g.refused.push(131_047);
        return graph_error(
            StatusCode::BAD_REQUEST,
            131_047,
            "Message failed to send because more than 24 hours have passed since the customer last replied to this number.",
        );
    }
    let fail = g.failures.pop_front();
    g.seq += 1;
    sent.wamid = format!("wamid.OUT{:016X}", g.seq);
    match fail {
        Some(Failure::Http429 { retry_after_secs }) => {
            g.refused.push(80_007);
            let mut r = graph_error(
                StatusCode::TOO_MANY_REQUESTS,
                80_007,
                "Rate limit issues: the WhatsApp Business Account reached its rate limit.",
            );
            if let Ok(v) = retry_after_secs.to_string().parse() {
                r.headers_mut().insert("retry-after", v);
            }
            return r;
        }
        Some(Failure::Code(code)) => {
            g.refused.push(code);
            return graph_error(StatusCode::BAD_REQUEST, code, "Rate limit hit (fake)");
        }
        Some(Failure::TokenExpired) => {
            g.unauthorized += 1;
            return graph_error(
                StatusCode::UNAUTHORIZED,
                190,
                "Error validating access token: Session has expired.",
            );
        }
        Some(Failure::AcceptedThen500) => {
            g.sent.push(sent);
            return graph_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                1,
                "An unknown error occurred",
            );
        }
        Some(Failure::Succeed) | None => {}
    }
    let wamid = sent.wamid.clone();
    g.sent.push(sent);
    Json(json!({
        "messaging_product": "whatsapp",
        "contacts": [{ "input": to, "wa_id": to }],
        "messages": [{ "id": wamid }],
    }))
    .into_response()
}

async fn upload(
    State((s, _)): St,
    Path((_version, phone)): Path<(String, String)>,
    h: HeaderMap,
    body: Bytes,
) -> Response {
    if !authorized(&h) {
        return bad_token(&s);
    }
    if phone != PHONE_NUMBER_ID {
        return graph_error(StatusCode::BAD_REQUEST, 100, "Unsupported post request.");
    }
    let ct = h
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let Some(parts) = clawft_channel_core::media::parse_multipart(ct, &body) else {
        return graph_error(
            StatusCode::BAD_REQUEST,
            100,
            "(#100) multipart/form-data expected",
        );
    };
    let field = |n: &str| parts.iter().find(|p| p.name == n);
    if field("messaging_product").map(|p| p.data.as_slice()) != Some(b"whatsapp") {
        return graph_error(
            StatusCode::BAD_REQUEST,
            100,
            "(#100) The parameter messaging_product is required.",
        );
    }
    let (Some(file), Some(_)) = (field("file"), field("type")) else {
        return graph_error(
            StatusCode::BAD_REQUEST,
            100,
            "(#100) The parameters file and type are required.",
        );
    };
    let mime = file.content_type.clone().unwrap_or_default();
    let mut g = s.locked();
    g.seq += 1;
    let id = format!("{}", 900_000 + g.seq);
    g.media.insert(
        id.clone(),
        (mime, file.file_name.clone(), file.data.clone()),
    );
    Json(json!({ "id": id })).into_response()
}

async fn media_info(
    State((s, base)): St,
    Path((_version, id)): Path<(String, String)>,
    h: HeaderMap,
) -> Response {
    if !authorized(&h) {
        return bad_token(&s);
    }
    if id == PHONE_NUMBER_ID {
        // The phone number itself (what `weft doctor` asks).
        return Json(json!({
            "verified_name": "Test Business",
            "display_phone_number": "+1 555-078-3881",
            "quality_rating": "GREEN",
            "id": PHONE_NUMBER_ID,
        }))
        .into_response();
    }
    let g = s.locked();
    let Some((mime, _, bytes)) = g.media.get(&id) else {
        return graph_error(
            StatusCode::BAD_REQUEST,
            100,
            &format!("Unsupported get request. Object with ID '{id}' does not exist"),
        );
    };
    Json(json!({
        "messaging_product": "whatsapp",
        "url": format!("{base}/dl/{id}"),
        "mime_type": mime,
        "sha256": "fake",
        "file_size": bytes.len(),
        "id": id,
    }))
    .into_response()
}

async fn download(State((s, _)): St, Path(id): Path<String>, h: HeaderMap) -> Response {
    if !authorized(&h) {
        return bad_token(&s);
    }
    let g = s.locked();
    match g.media.get(&id) {
        Some((mime, _, bytes)) => ([("content-type", mime.clone())], bytes.clone()).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}
