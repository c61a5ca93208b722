//! A fake Discord on 127.0.0.1 speaking the real wire protocol, for tests: the REST API
//! (`/api/v10/...`, axum) and the gateway (WebSocket, tokio-tungstenite).
//!
//! ```ignore
//! let fake = FakeDiscord::start().await;
//! let ch = DiscordChannel::new(fake.config(Arc::new(MemoryState::default())))?;
//! // listen(...) in a task, then:
//! let id = fake.push_user_message("111", "42", "hello");   // a DM; returns the message id
//! // ... the daemon answers through ch.send(...)
//! assert_eq!(fake.sent()[0].text, "echo: hello");
//! ```
//!
//! REST: `GET /gateway/bot`, `GET /users/@me`, `POST /channels/{id}/messages` (content ≤ 2000
//! characters, `nonce` + `enforce_nonce` dedupe), `PATCH /channels/{id}/messages/{mid}`,
//! `POST /channels/{id}/typing`; every request needs `Authorization: Bot <FAKE_TOKEN>` (else
//! 401); [`FakeDiscord::fail_next`] scripts 429/401/403/404/400/5xx/malformed answers for the
//! next `/channels/...` request, [`FakeDiscord::exhaust_bucket`] makes the next one report an
//! empty rate-limit bucket.
//!
//! Files: users' messages may carry attachments ([`FakeDiscord::push_user_files`],
//! [`FakeDiscord::push_voice_message`], [`FakeDiscord::push_crafted_attachment`] with any URL),
//! served by the CDN route `GET /attachments/{channel}/{id}/{name}?ex=&is=&hm=` on the REST
//! origin (no token needed; a URL whose signature does not match is 404, like Discord's CDN).
//! A `multipart/form-data` `POST /channels/{id}/messages` (`payload_json` + `files[n]`) is an
//! upload, checked like Discord does (no content and no file: 400 code 50006; a file over
//! 10 MiB: 413 code 40005; `attachments[].id` without its `files[id]` part or an unreadable
//! body: 400 code 50035; invalid `payload_json`: 400 code 50109), deduplicated by `nonce` +
//! `enforce_nonce`, shown as one `Post` in [`FakeDiscord::sent`] per message and one
//! [`FakeUpload`] per file in [`FakeDiscord::uploads`]; `fail_next`, `hold_answers` and
//! [`FakeDiscord::hold_uploads`] apply to it.
//!
//! Gateway: HELLO (heartbeat interval from [`FakeOptions`]), IDENTIFY → READY (`session_id`,
//! `resume_gateway_url`, user), heartbeat → ACK (unless [`FakeDiscord::set_heartbeat_ack`]
//! turned it off), MESSAGE_CREATE dispatches with increasing `s` (logged per session), RESUME →
//! replay of the events after `seq` then RESUMED (or INVALID_SESSION for an unknown session), a
//! wrong token → close 4004; [`FakeDiscord::disconnect`], [`FakeDiscord::close`],
//! [`FakeDiscord::send_reconnect`] (op 7), [`FakeDiscord::invalidate_session`] (op 9).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post};
use axum::Router;
use clawft_channel_core::lock::MutexExt;
use clawft_channel_core::StateStore;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

use crate::DiscordConfig;

/// The bot token the fake accepts.
pub const FAKE_TOKEN: &str = "fake-bot-token";
/// The fake bot's user id.
pub const BOT_ID: &str = "900000000000000001";
/// The fake bot's username.
pub const BOT_NAME: &str = "clawbot";

/// Options of the fake.
#[derive(Clone, Debug)]
pub struct FakeOptions {
    /// HELLO's `heartbeat_interval` in milliseconds (default 1000; Discord sends ~41250).
    pub heartbeat_interval_ms: u64,
}

impl Default for FakeOptions {
    fn default() -> Self {
        Self {
            heartbeat_interval_ms: 1000,
        }
    }
}

/// A scripted answer for the next `/channels/...` request.
#[derive(Clone, Debug, PartialEq)]
pub enum FakeFailure {
    /// 429 with `{"retry_after": s, "global": g}` and `Retry-After` / `X-RateLimit-*` headers.
    RateLimited {
        /// Seconds.
        retry_after: f64,
        /// Global rate limit.
        global: bool,
    },
    /// 401 Unauthorized.
    Unauthorized,
    /// 403 Missing Permissions (code 50013).
    Forbidden,
    /// 404 Unknown Channel (code 10003).
    NotFound,
    /// 400 Invalid Form Body (code 50035).
    BadRequest,
    /// 500 (or any 5xx given).
    ServerError(u16),
    /// The request succeeds (a message is created) but the answer is not JSON.
    Malformed,
}

/// What the bot posted or edited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SentOp {
    /// `POST /channels/{id}/messages`.
    Post,
    /// `PATCH /channels/{id}/messages/{mid}`.
    Edit,
}

/// A message the bot posted or edited, in order.
#[derive(Clone, Debug)]
pub struct SentMessage {
    /// Post or edit.
    pub op: SentOp,
    /// Channel id.
    pub chat: String,
    /// Always `None` (Discord threads are channels: `chat` is the thread's id).
    pub thread: Option<String>,
    /// Id of the message posted or edited.
    pub message_id: String,
    /// Its text.
    pub text: String,
    /// The full JSON body of the request.
    pub body: Value,
    /// When the fake received it.
    pub at: Instant,
}

/// A recorded REST request.
#[derive(Clone, Debug)]
pub struct FakeRequest {
    /// HTTP method.
    pub method: String,
    /// Path, e.g. `/api/v10/channels/1/typing`.
    pub path: String,
    /// The `Authorization` header.
    pub auth: String,
    /// JSON body (`Null` when none).
    pub body: Value,
    /// When the fake received it.
    pub at: Instant,
}

/// A message a user sends (see [`FakeDiscord::push_message`]).
#[derive(Clone, Debug, Default)]
pub struct FakeMessage {
    /// Channel id.
    pub chat: String,
    /// Author id.
    pub user: String,
    /// Text.
    pub text: String,
    /// Guild id: `Some` for a server channel, `None` for a DM.
    pub guild: Option<String>,
    /// The author is a bot.
    pub bot: bool,
    /// Id of the message this replies to (its author is looked up among the bot's messages).
    pub reply_to: Option<String>,
    /// Files attached (served by the fake's CDN route unless given a crafted `url`).
    pub attachments: Vec<FakeAttachment>,
    /// Message flags (`1 << 13`: a voice message).
    pub flags: u64,
}

/// A file attached to a message a user sends (see [`FakeDiscord::push_user_files`]).
#[derive(Clone, Debug, Default)]
pub struct FakeAttachment {
    /// File name.
    pub filename: String,
    /// Declared media type (`content_type`), if any.
    pub content_type: Option<String>,
    /// The bytes the CDN serves (`size` is their length).
    pub bytes: Vec<u8>,
    /// `duration_secs` (voice messages).
    pub duration_secs: Option<f64>,
    /// A crafted `url` (and `proxy_url`) put in the payload instead of the fake's signed CDN
    /// URL; nothing is served for it.
    pub url: Option<String>,
}

impl FakeAttachment {
    /// A file with a name, a declared media type and its bytes.
    pub fn new(filename: &str, content_type: &str, bytes: impl Into<Vec<u8>>) -> Self {
        Self {
            filename: filename.into(),
            content_type: Some(content_type.into()),
            bytes: bytes.into(),
            ..Self::default()
        }
    }
}

/// One file the bot uploaded (a `files[n]` part of a multipart message creation), in order.
#[derive(Clone, Debug)]
pub struct FakeUpload {
    /// Channel id.
    pub chat: String,
    /// Id of the message that carries it.
    pub message_id: String,
    /// The part's field name (`files[0]`).
    pub field: String,
    /// The part's file name (`attachments[].filename` of `payload_json` when it names one).
    pub file_name: String,
    /// The part's `Content-Type`.
    pub content_type: Option<String>,
    /// The bytes.
    pub bytes: Vec<u8>,
    /// The message's `content` (caption), empty when none.
    pub text: String,
    /// The `nonce` of `payload_json`, if any.
    pub nonce: Option<String>,
    /// `payload_json` (`Null` when the request had none).
    pub payload: Value,
    /// When the fake received it.
    pub at: Instant,
}

/// A request to the fake's CDN route (`GET /attachments/...`).
#[derive(Clone, Debug)]
pub struct FakeCdnRequest {
    /// Path and query.
    pub url: String,
    /// The `Authorization` header, if one was sent (Discord's CDN needs none).
    pub auth: Option<String>,
    /// The status answered.
    pub status: u16,
}

enum Cmd {
    Frame(Value),
    Close(u16),
    Drop,
}

struct FakeSession {
    id: String,
    seq: u64,
    log: Vec<(u64, Value)>,
}

#[derive(Default)]
struct St {
    requests: Vec<FakeRequest>,
    sent: Vec<SentMessage>,
    /// mid → (channel, author id).
    messages: HashMap<String, (String, String)>,
    nonces: HashMap<(String, String), String>,
    /// Scripted answers for the next channel requests (`None`: answer normally).
    fail_next: VecDeque<Option<FakeFailure>>,
    exhaust_bucket: Option<f64>,
    next_id: u64,
    session: Option<FakeSession>,
    sessions_made: u64,
    /// Dispatches waiting for a session.
    pending: Vec<(String, Value)>,
    /// The connection that has identified or resumed.
    live: Option<mpsc::UnboundedSender<Cmd>>,
    /// Every open connection.
    conns: Vec<mpsc::UnboundedSender<Cmd>>,
    no_heartbeat_ack: bool,
    /// Posts and edits are applied but never answered (a crash while the answer is in flight).
    hold_answers: bool,
    connections: usize,
    client_frames: Vec<Value>,
    /// When each of `client_frames` arrived.
    client_frame_times: Vec<Instant>,
    /// Close frames of the fake that the client answered with a Close frame.
    closes_answered: usize,
    /// Files the CDN serves: path (`/attachments/{channel}/{id}/{name}`) → (type, bytes).
    cdn: HashMap<String, (String, Vec<u8>)>,
    cdn_requests: Vec<FakeCdnRequest>,
    uploads: Vec<FakeUpload>,
    /// Multipart uploads are read but never answered nor recorded.
    hold_uploads: bool,
    /// Largest file accepted (default [`FAKE_MAX_UPLOAD_BYTES`]).
    max_upload: Option<usize>,
}

struct Shared {
    st: Mutex<St>,
    opts: FakeOptions,
    gw_addr: SocketAddr,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, St> {
        self.st.locked()
    }
}

impl St {
    fn snowflake(&mut self) -> String {
        self.next_id += 1;
        (1_100_000_000_000_000_000u64 + self.next_id).to_string()
    }

    /// Post the bot's message `content` (request `payload`) in `chat`, unless its enforced
    /// nonce was seen in that channel: the message id, and whether it is new.
    fn post(&mut self, chat: &str, payload: &Value, content: &str) -> (String, bool) {
        let nonce = enforced_nonce(payload);
        if let Some(mid) = nonce.and_then(|n| self.nonces.get(&(chat.to_string(), n.to_string()))) {
            return (mid.clone(), false);
        }
        let mid = self.snowflake();
        if let Some(n) = nonce {
            self.nonces
                .insert((chat.to_string(), n.to_string()), mid.clone());
        }
        self.messages
            .insert(mid.clone(), (chat.to_string(), BOT_ID.to_string()));
        self.sent.push(SentMessage {
            op: SentOp::Post,
            chat: chat.to_string(),
            thread: None,
            message_id: mid.clone(),
            text: content.to_string(),
            body: payload.clone(),
            at: Instant::now(),
        });
        (mid, true)
    }

    /// Dispatch an event: logged in the session (for RESUME) and sent when a client is live.
    fn dispatch(&mut self, t: &str, d: Value) {
        let Some(s) = self.session.as_mut() else {
            self.pending.push((t.to_string(), d));
            return;
        };
        s.seq += 1;
        let frame = json!({"op": 0, "t": t, "s": s.seq, "d": d});
        s.log.push((s.seq, frame.clone()));
        if let Some(live) = &self.live {
            let _ = live.send(Cmd::Frame(frame));
        }
    }
}

/// The fake Discord. Dropping it stops both servers.
pub struct FakeDiscord {
    shared: Arc<Shared>,
    rest_addr: SocketAddr,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for FakeDiscord {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        for c in &self.shared.lock().conns {
            let _ = c.send(Cmd::Drop);
        }
    }
}

impl FakeDiscord {
    /// Start with default options.
    ///
    /// # Panics
    /// When it cannot bind 127.0.0.1.
    pub async fn start() -> Self {
        Self::start_with(FakeOptions::default()).await
    }

    /// Start the REST and gateway servers on ephemeral 127.0.0.1 ports.
    ///
    /// # Panics
    /// When it cannot bind 127.0.0.1.
    #[allow(clippy::expect_used)]
    pub async fn start_with(opts: FakeOptions) -> Self {
        let rest = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake REST");
        let gw = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake gateway");
        let rest_addr = rest.local_addr().expect("addr");
        let gw_addr = gw.local_addr().expect("addr");
        let shared = Arc::new(Shared {
            st: Mutex::new(St::default()),
            opts,
            gw_addr,
        });
        let app = Router::new()
            .route("/api/v10/gateway/bot", get(gateway_bot))
            .route("/api/v10/users/@me", get(users_me))
            .route("/api/v10/channels/{id}/messages", post(create_message))
            .route("/api/v10/channels/{id}/messages/{mid}", patch(edit_message))
            .route("/api/v10/channels/{id}/typing", post(typing))
            .route("/attachments/{channel}/{id}/{name}", get(cdn_file))
            .fallback(fallback)
            .layer(axum::extract::DefaultBodyLimit::max(UPLOAD_BODY_LIMIT))
            .with_state(shared.clone());
        let t1 = tokio::spawn(async move {
            let _ = axum::serve(rest, app).await;
        });
        let sh = shared.clone();
        let t2 = tokio::spawn(async move {
            while let Ok((stream, _)) = gw.accept().await {
                let sh = sh.clone();
                tokio::spawn(async move { gateway_conn(sh, stream).await });
            }
        });
        Self {
            shared,
            rest_addr,
            tasks: vec![t1, t2],
        }
    }

    /// The REST base URL (set as `DiscordConfig::api_base_url`), e.g. `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.rest_addr)
    }

    /// The gateway URL that `GET /gateway/bot` returns, e.g. `ws://127.0.0.1:PORT`.
    pub fn gateway_url(&self) -> String {
        format!("ws://{}", self.shared.gw_addr)
    }

    /// A config pointing at this fake with [`FAKE_TOKEN`], fast reconnects and short edits.
    pub fn config(&self, state: Arc<dyn StateStore>) -> DiscordConfig {
        let mut c = DiscordConfig::new(FAKE_TOKEN, state);
        c.api_base_url = Some(self.base_url());
        c.reconnect_backoff = Duration::from_millis(20);
        c.edit_interval = Duration::from_millis(200);
        c
    }

    /// A user's DM to the bot in channel `chat`; returns the message id (the event id).
    pub fn push_user_message(&self, chat: &str, user: &str, text: &str) -> String {
        self.push_message(FakeMessage {
            chat: chat.into(),
            user: user.into(),
            text: text.into(),
            ..FakeMessage::default()
        })
    }

    /// A user's DM with files (`text` may be empty: an attachment-only message); returns the
    /// message id. Each file is served at the signed CDN URL its attachment names.
    pub fn push_user_files(
        &self,
        chat: &str,
        user: &str,
        text: &str,
        files: Vec<FakeAttachment>,
    ) -> String {
        self.push_message(FakeMessage {
            chat: chat.into(),
            user: user.into(),
            text: text.into(),
            attachments: files,
            ..FakeMessage::default()
        })
    }

    /// A user's voice message in DM `chat` (flag `IS_VOICE_MESSAGE`, one `audio/ogg`
    /// attachment `voice-message.ogg` with `duration_secs`); returns the message id.
    pub fn push_voice_message(
        &self,
        chat: &str,
        user: &str,
        ogg: impl Into<Vec<u8>>,
        duration_secs: f64,
    ) -> String {
        self.push_message(FakeMessage {
            chat: chat.into(),
            user: user.into(),
            attachments: vec![FakeAttachment {
                duration_secs: Some(duration_secs),
                ..FakeAttachment::new("voice-message.ogg", "audio/ogg", ogg)
            }],
            flags: VOICE_MESSAGE_FLAG,
            ..FakeMessage::default()
        })
    }

    /// A user's DM whose one attachment names `url` (any string) as its `url` and
    /// `proxy_url`; returns the message id. For SSRF tests: nothing is served for it.
    pub fn push_crafted_attachment(&self, chat: &str, user: &str, text: &str, url: &str) -> String {
        self.push_user_files(
            chat,
            user,
            text,
            vec![FakeAttachment {
                url: Some(url.into()),
                ..FakeAttachment::new("crafted.bin", "application/octet-stream", vec![0u8; 16])
            }],
        )
    }

    /// Any message (guild, bot author, reply, files); returns its id.
    pub fn push_message(&self, m: FakeMessage) -> String {
        let base = self.base_url();
        let mut st = self.shared.lock();
        let id = st.snowflake();
        let attachments: Vec<Value> = m
            .attachments
            .iter()
            .map(|a| {
                let aid = st.snowflake();
                let url = a.url.clone().unwrap_or_else(|| {
                    let path = format!("/attachments/{}/{aid}/{}", m.chat, a.filename);
                    let url = format!("{base}{}", signed(&path));
                    st.cdn.insert(
                        path,
                        (
                            a.content_type
                                .clone()
                                .unwrap_or_else(|| "application/octet-stream".into()),
                            a.bytes.clone(),
                        ),
                    );
                    url
                });
                let mut v = json!({
                    "id": aid,
                    "filename": a.filename,
                    "size": a.bytes.len(),
                    "url": url,
                    "proxy_url": url,
                });
                if let Some(ct) = &a.content_type {
                    v["content_type"] = json!(ct);
                }
                if let Some(d) = a.duration_secs {
                    v["duration_secs"] = json!(d);
                    v["waveform"] = json!("AAAA");
                }
                v
            })
            .collect();
        let mut d = json!({
            "id": id,
            "type": if m.reply_to.is_some() { 19 } else { 0 },
            "channel_id": m.chat,
            "content": m.text,
            "author": {"id": m.user, "username": format!("user{}", m.user), "bot": m.bot},
            "mentions": [],
            "attachments": attachments,
            "flags": m.flags,
            "timestamp": "2025-01-01T00:00:00.000000+00:00",
        });
        if let Some(g) = &m.guild {
            d["guild_id"] = json!(g);
        }
        if let Some(r) = &m.reply_to {
            let author = st
                .messages
                .get(r)
                .map_or_else(|| "1".to_string(), |(_, a)| a.clone());
            d["message_reference"] = json!({"message_id": r, "channel_id": m.chat});
            d["referenced_message"] = json!({"id": r, "author": {"id": author}, "content": ""});
        }
        st.messages.insert(id.clone(), (m.chat, m.user));
        st.dispatch("MESSAGE_CREATE", d);
        id
    }

    /// Dispatch an arbitrary event (e.g. `GUILD_CREATE`).
    pub fn push_dispatch(&self, t: &str, d: Value) {
        self.shared.lock().dispatch(t, d);
    }

    /// Dispatch the MESSAGE_CREATE of `message_id` again, with a new sequence number (the
    /// platform delivering a duplicate). Returns false for an unknown id.
    pub fn redeliver(&self, message_id: &str) -> bool {
        let mut st = self.shared.lock();
        let frame = st.session.as_ref().and_then(|s| {
            s.log
                .iter()
                .find(|(_, f)| f["t"] == "MESSAGE_CREATE" && f["d"]["id"] == message_id)
                .map(|(_, f)| f["d"].clone())
        });
        match frame {
            Some(d) => {
                st.dispatch("MESSAGE_CREATE", d);
                true
            }
            None => false,
        }
    }

    /// Messages the bot posted or edited, in order (a message carrying an upload is one
    /// `Post` whose `text` is its caption, often empty; its files are in
    /// [`FakeDiscord::uploads`]).
    pub fn sent(&self) -> Vec<SentMessage> {
        self.shared.lock().sent.clone()
    }

    /// Files the bot uploaded, one entry per file, in order (a message deduplicated by its
    /// nonce adds none).
    pub fn uploads(&self) -> Vec<FakeUpload> {
        self.shared.lock().uploads.clone()
    }

    /// Requests to the CDN route, in order.
    pub fn cdn_requests(&self) -> Vec<FakeCdnRequest> {
        self.shared.lock().cdn_requests.clone()
    }

    /// While on, a multipart message creation (an upload) is read, checked (token, scripted
    /// failure) and then never answered nor applied: no message, nothing in
    /// [`FakeDiscord::sent`] or [`FakeDiscord::uploads`] (as when the process dies
    /// mid-upload). Held requests stay unanswered after it is switched off.
    pub fn hold_uploads(&self, on: bool) {
        self.shared.lock().hold_uploads = on;
    }

    /// Refuse files over `bytes` with 413 code 40005 (default 10 MiB; a chat whose limit is
    /// lower than the adapter's).
    pub fn set_max_upload_bytes(&self, bytes: usize) {
        self.shared.lock().max_upload = Some(bytes);
    }

    /// Every REST request, in order.
    pub fn requests(&self) -> Vec<FakeRequest> {
        self.shared.lock().requests.clone()
    }

    /// Frames the clients sent on the gateway (IDENTIFY, RESUME, heartbeats), in order.
    pub fn client_frames(&self) -> Vec<Value> {
        self.shared.lock().client_frames.clone()
    }

    /// Frames the clients sent on the gateway with the time each arrived, in order.
    pub fn client_frames_at(&self) -> Vec<(Instant, Value)> {
        let st = self.shared.lock();
        st.client_frame_times
            .iter()
            .copied()
            .zip(st.client_frames.iter().cloned())
            .collect()
    }

    /// How many Close frames of the fake ([`FakeDiscord::close`]) the client answered with a
    /// Close frame (RFC 6455 §5.5.1) within 2 s.
    pub fn closes_answered(&self) -> usize {
        self.shared.lock().closes_answered
    }

    /// Gateway connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.lock().connections
    }

    /// Sessions created by IDENTIFY so far.
    pub fn sessions_created(&self) -> u64 {
        self.shared.lock().sessions_made
    }

    /// The current session's id and last dispatched sequence.
    pub fn session(&self) -> Option<(String, u64)> {
        self.shared
            .lock()
            .session
            .as_ref()
            .map(|s| (s.id.clone(), s.seq))
    }

    /// Answer the next `/channels/...` request with `f` (queued, in order, after any
    /// [`FakeDiscord::pass_next`]).
    pub fn fail_next(&self, f: FakeFailure) {
        self.shared.lock().fail_next.push_back(Some(f));
    }

    /// Let the next `n` `/channels/...` requests through before a queued failure.
    pub fn pass_next(&self, n: usize) {
        let mut st = self.shared.lock();
        for _ in 0..n {
            st.fail_next.push_back(None);
        }
    }

    /// The next successful `/channels/...` answer says the route's bucket is empty
    /// (`X-RateLimit-Remaining: 0`, `X-RateLimit-Reset-After: secs`).
    pub fn exhaust_bucket(&self, secs: f64) {
        self.shared.lock().exhaust_bucket = Some(secs);
    }

    /// Drop every gateway connection without a close frame (a network failure).
    pub fn disconnect(&self) {
        let mut st = self.shared.lock();
        for c in st.conns.drain(..) {
            let _ = c.send(Cmd::Drop);
        }
        st.live = None;
    }

    /// Close every gateway connection with `code` (e.g. 4000 unknown error, 4004 auth).
    pub fn close(&self, code: u16) {
        let mut st = self.shared.lock();
        for c in st.conns.drain(..) {
            let _ = c.send(Cmd::Close(code));
        }
        st.live = None;
    }

    /// Send op 7 RECONNECT on the live connection.
    pub fn send_reconnect(&self) {
        if let Some(l) = &self.shared.lock().live {
            let _ = l.send(Cmd::Frame(json!({"op": 7, "d": null})));
        }
    }

    /// Send op 9 INVALID_SESSION; when not `resumable` the session is also forgotten.
    pub fn invalidate_session(&self, resumable: bool) {
        let mut st = self.shared.lock();
        if let Some(l) = &st.live {
            let _ = l.send(Cmd::Frame(json!({"op": 9, "d": resumable})));
        }
        if !resumable {
            st.session = None;
        }
        st.live = None;
    }

    /// Whether heartbeats are answered with op 11 (default true).
    pub fn set_heartbeat_ack(&self, on: bool) {
        self.shared.lock().no_heartbeat_ack = !on;
    }

    /// While on, message posts and edits are applied (and recorded) but their HTTP answer never
    /// comes: the client sees a request in flight forever, as when it dies before the answer.
    pub fn hold_answers(&self, on: bool) {
        self.shared.lock().hold_answers = on;
    }
}

/// Message flag `IS_VOICE_MESSAGE`.
const VOICE_MESSAGE_FLAG: u64 = 1 << 13;
/// Largest file Discord takes from a bot without boosts (413 above).
pub const FAKE_MAX_UPLOAD_BYTES: usize = 10 * 1024 * 1024;
/// Largest request body the fake reads (bigger ones get axum's plain 413).
const UPLOAD_BODY_LIMIT: usize = 64 * 1024 * 1024;
/// The fake CDN's signing secret.
const CDN_SECRET: &str = "fake-cdn-secret";

fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// `path?ex=..&is=..&hm=..`: signed like Discord's CDN URLs (`hm` over the path and `ex`).
fn signed(path: &str) -> String {
    let ex = "7fffffff";
    let hm = fnv(&format!("{CDN_SECRET}{path}{ex}"));
    format!("{path}?ex={ex}&is=67000000&hm={hm:016x}&")
}

async fn cdn_file(
    State(sh): State<Arc<Shared>>,
    Path((channel, id, name)): Path<(String, String, String)>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    let path = format!("/attachments/{channel}/{id}/{name}");
    let q = |k: &str| {
        uri.query().unwrap_or("").split('&').find_map(|kv| {
            kv.split_once('=')
                .filter(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    };
    let good = match (q("ex"), q("hm")) {
        (Some(ex), Some(hm)) => hm == format!("{:016x}", fnv(&format!("{CDN_SECRET}{path}{ex}"))),
        _ => false,
    };
    let mut st = sh.lock();
    let file = st.cdn.get(&path).filter(|_| good).cloned();
    st.cdn_requests.push(FakeCdnRequest {
        url: uri.to_string(),
        auth: headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        status: if file.is_some() { 200 } else { 404 },
    });
    match file {
        Some((ct, bytes)) => {
            let mut r = bytes.into_response();
            if let Ok(v) = HeaderValue::from_str(&ct) {
                r.headers_mut().insert("content-type", v);
            }
            r
        }
        // What Discord's CDN answers for an unsigned, expired or unknown attachment URL.
        None => (
            StatusCode::NOT_FOUND,
            "This content is no longer available.",
        )
            .into_response(),
    }
}

/// A multipart message creation: `payload_json` and `files[n]`, checked like Discord does.
#[allow(clippy::too_many_lines)]
async fn create_message_multipart(
    sh: Arc<Shared>,
    id: String,
    headers: HeaderMap,
    content_type: &str,
    body: &[u8],
) -> Response {
    let path = format!("/api/v10/channels/{id}/messages");
    let parts = clawft_channel_core::media::parse_multipart(content_type, body);
    let payload_bytes: Vec<u8> = parts
        .as_ref()
        .and_then(|ps| ps.iter().find(|p| p.name == "payload_json"))
        .map(|p| p.data.clone())
        .unwrap_or_default();
    let (payload, malformed) = match begin(&sh, &Method::POST, &path, &headers, &payload_bytes) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Some(parts) = parts else {
        return discord_error(
            StatusCode::BAD_REQUEST,
            50035,
            "Invalid Form Body: the multipart/form-data body cannot be read.",
        );
    };
    if sh.lock().hold_uploads {
        std::future::pending::<()>().await;
    }
    let files: Vec<&clawft_channel_core::media::Part> =
        parts.iter().filter(|p| p.file_name.is_some()).collect();
    let content = payload["content"].as_str().unwrap_or("").to_string();
    if let Some(refused) = refuse_content(&content, !files.is_empty()) {
        return refused;
    }
    let max = sh.lock().max_upload.unwrap_or(FAKE_MAX_UPLOAD_BYTES);
    if files.iter().any(|f| f.data.len() > max) {
        return discord_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            40005,
            "Request entity too large",
        );
    }
    // Every `attachments[].id` must name a `files[id]` part.
    let listed: Vec<(String, Option<String>)> = payload["attachments"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| {
                    let n = match &x["id"] {
                        Value::String(s) => s.clone(),
                        v => v.to_string(),
                    };
                    (n, x["filename"].as_str().map(str::to_string))
                })
                .collect()
        })
        .unwrap_or_default();
    for (n, _) in &listed {
        if !files.iter().any(|f| f.name == format!("files[{n}]")) {
            return discord_error(
                StatusCode::BAD_REQUEST,
                50035,
                &format!("Invalid Form Body: attachments: no file part files[{n}]"),
            );
        }
    }
    let base = format!(
        "http://{}",
        headers
            .get("host")
            .and_then(|h| h.to_str().ok())
            .unwrap_or("127.0.0.1")
    );
    let (mid, attachments) = {
        let mut st = sh.lock();
        let nonce = enforced_nonce(&payload).map(str::to_string);
        match st.post(&id, &payload, &content) {
            (mid, false) => (mid, Vec::new()),
            (mid, true) => {
                let mut attachments = Vec::new();
                for f in &files {
                    let n = f.name.trim_start_matches("files[").trim_end_matches(']');
                    let name = listed
                        .iter()
                        .find(|(i, _)| i == n)
                        .and_then(|(_, name)| name.clone())
                        .or_else(|| f.file_name.clone())
                        .unwrap_or_default();
                    let aid = st.snowflake();
                    let path = format!("/attachments/{id}/{aid}/{name}");
                    let ct = f
                        .content_type
                        .clone()
                        .unwrap_or_else(|| "application/octet-stream".into());
                    st.cdn.insert(path.clone(), (ct.clone(), f.data.clone()));
                    let url = format!("{base}{}", signed(&path));
                    attachments.push(json!({"id": aid, "filename": name, "size": f.data.len(), "content_type": ct, "url": url, "proxy_url": url}));
                    st.uploads.push(FakeUpload {
                        chat: id.clone(),
                        message_id: mid.clone(),
                        field: f.name.clone(),
                        file_name: name,
                        content_type: f.content_type.clone(),
                        bytes: f.data.clone(),
                        text: content.clone(),
                        nonce: nonce.clone(),
                        payload: payload.clone(),
                        at: Instant::now(),
                    });
                }
                (mid, attachments)
            }
        }
    };
    held(&sh).await;
    finish(
        &sh,
        json!({"id": mid, "channel_id": id, "content": content, "attachments": attachments, "author": {"id": BOT_ID, "username": BOT_NAME, "bot": true}}),
        malformed,
    )
}

/// Never answer while [`FakeDiscord::hold_answers`] is on.
async fn held(sh: &Shared) {
    if sh.lock().hold_answers {
        std::future::pending::<()>().await;
    }
}

/// The request's `nonce` when it asks Discord to enforce it (`enforce_nonce: true`).
fn enforced_nonce(payload: &Value) -> Option<&str> {
    payload["nonce"]
        .as_str()
        .filter(|_| payload["enforce_nonce"] == true)
}

/// Discord's answer to a message's `content` it refuses: empty without files (50006), over
/// 2000 characters (50035).
fn refuse_content(content: &str, has_files: bool) -> Option<Response> {
    if content.is_empty() && !has_files {
        return Some(discord_error(
            StatusCode::BAD_REQUEST,
            50006,
            "Cannot send an empty message",
        ));
    }
    if content.chars().count() > 2000 {
        return Some(discord_error(
            StatusCode::BAD_REQUEST,
            50035,
            "Invalid Form Body: content: Must be 2000 or fewer in length.",
        ));
    }
    None
}

fn discord_error(status: StatusCode, code: u32, message: &str) -> Response {
    (
        status,
        axum::Json(json!({"code": code, "message": message})),
    )
        .into_response()
}

/// Record the request, check the token and (for channel routes) apply a scripted failure.
#[allow(clippy::result_large_err)]
fn begin(
    sh: &Shared,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Value, bool), Response> {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let parsed = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(body).unwrap_or(Value::Null)
    };
    let mut st = sh.lock();
    st.requests.push(FakeRequest {
        method: method.to_string(),
        path: path.to_string(),
        auth: auth.clone(),
        body: parsed.clone(),
        at: Instant::now(),
    });
    if auth != format!("Bot {FAKE_TOKEN}") {
        return Err(discord_error(
            StatusCode::UNAUTHORIZED,
            0,
            "401: Unauthorized",
        ));
    }
    if !body.is_empty() && parsed.is_null() {
        return Err(discord_error(
            StatusCode::BAD_REQUEST,
            50109,
            "The request body contains invalid JSON.",
        ));
    }
    if !path.starts_with("/api/v10/channels/") {
        return Ok((parsed, false));
    }
    let f = match st.fail_next.pop_front().flatten() {
        None => return Ok((parsed, false)),
        Some(FakeFailure::Malformed) => return Ok((parsed, true)),
        Some(f) => f,
    };
    Err(match f {
        FakeFailure::RateLimited {
            retry_after,
            global,
        } => {
            let mut r = (
                StatusCode::TOO_MANY_REQUESTS,
                axum::Json(json!({"message": "You are being rate limited.", "retry_after": retry_after, "global": global})),
            )
                .into_response();
            let h = r.headers_mut();
            if let Ok(v) = HeaderValue::from_str(&format!("{}", retry_after.ceil())) {
                h.insert("retry-after", v);
            }
            h.insert("x-ratelimit-remaining", HeaderValue::from_static("0"));
            if let Ok(v) = HeaderValue::from_str(&format!("{retry_after}")) {
                h.insert("x-ratelimit-reset-after", v);
            }
            if global {
                h.insert("x-ratelimit-global", HeaderValue::from_static("true"));
            }
            r
        }
        FakeFailure::Unauthorized => {
            discord_error(StatusCode::UNAUTHORIZED, 0, "401: Unauthorized")
        }
        FakeFailure::Forbidden => {
            discord_error(StatusCode::FORBIDDEN, 50013, "Missing Permissions")
        }
        FakeFailure::NotFound => discord_error(StatusCode::NOT_FOUND, 10003, "Unknown Channel"),
        FakeFailure::BadRequest => {
            discord_error(StatusCode::BAD_REQUEST, 50035, "Invalid Form Body")
        }
        FakeFailure::ServerError(s) => discord_error(
            StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            0,
            "500: Internal Server Error",
        ),
        FakeFailure::Malformed => discord_error(StatusCode::OK, 0, ""),
    })
}

/// Finish a successful channel-route answer: malformed body or bucket headers if scripted.
fn finish(sh: &Shared, v: Value, malformed: bool) -> Response {
    if malformed {
        return (StatusCode::OK, "{not json").into_response();
    }
    let mut st = sh.lock();
    let mut r = axum::Json(v).into_response();
    if let Some(secs) = st.exhaust_bucket.take() {
        let h = r.headers_mut();
        h.insert("x-ratelimit-limit", HeaderValue::from_static("5"));
        h.insert("x-ratelimit-remaining", HeaderValue::from_static("0"));
        if let Ok(v) = HeaderValue::from_str(&format!("{secs}")) {
            h.insert("x-ratelimit-reset-after", v);
        }
    }
    r
}

async fn gateway_bot(State(sh): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(r) = begin(&sh, &Method::GET, "/api/v10/gateway/bot", &headers, &[]) {
        return r;
    }
    axum::Json(json!({
        "url": format!("ws://{}", sh.gw_addr),
        "shards": 1,
        "session_start_limit": {"total": 1000, "remaining": 999, "reset_after": 14_400_000, "max_concurrency": 1},
    }))
    .into_response()
}

async fn users_me(State(sh): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(r) = begin(&sh, &Method::GET, "/api/v10/users/@me", &headers, &[]) {
        return r;
    }
    axum::Json(json!({"id": BOT_ID, "username": BOT_NAME, "discriminator": "0", "bot": true}))
        .into_response()
}

async fn create_message(
    State(sh): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let ct = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    if ct.to_ascii_lowercase().starts_with("multipart/form-data") {
        return create_message_multipart(sh, id, headers, &ct, &body).await;
    }
    let path = format!("/api/v10/channels/{id}/messages");
    let (b, malformed) = match begin(&sh, &Method::POST, &path, &headers, &body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let content = b["content"].as_str().unwrap_or("").to_string();
    if let Some(refused) = refuse_content(&content, false) {
        return refused;
    }
    let (mid, _) = sh.lock().post(&id, &b, &content);
    held(&sh).await;
    finish(
        &sh,
        json!({"id": mid, "channel_id": id, "content": content, "author": {"id": BOT_ID, "username": BOT_NAME, "bot": true}}),
        malformed,
    )
}

async fn edit_message(
    State(sh): State<Arc<Shared>>,
    Path((id, mid)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let path = format!("/api/v10/channels/{id}/messages/{mid}");
    let (b, malformed) = match begin(&sh, &Method::PATCH, &path, &headers, &body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let content = b["content"].as_str().unwrap_or("").to_string();
    if content.chars().count() > 2000 {
        return discord_error(
            StatusCode::BAD_REQUEST,
            50035,
            "Invalid Form Body: content: Must be 2000 or fewer in length.",
        );
    }
    {
        let mut st = sh.lock();
        if st
            .messages
            .get(&mid)
            .is_none_or(|(c, a)| *c != id || a != BOT_ID)
        {
            return discord_error(StatusCode::NOT_FOUND, 10008, "Unknown Message");
        }
        st.sent.push(SentMessage {
            op: SentOp::Edit,
            chat: id.clone(),
            thread: None,
            message_id: mid.clone(),
            text: content.clone(),
            body: b,
            at: Instant::now(),
        });
    }
    held(&sh).await;
    finish(
        &sh,
        json!({"id": mid, "channel_id": id, "content": content}),
        malformed,
    )
}

async fn typing(
    State(sh): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let path = format!("/api/v10/channels/{id}/typing");
    let malformed = match begin(&sh, &Method::POST, &path, &headers, &[]) {
        Ok((_, m)) => m,
        Err(r) => return r,
    };
    let mut r = finish(&sh, Value::Null, malformed);
    *r.status_mut() = StatusCode::NO_CONTENT;
    *r.body_mut() = axum::body::Body::empty();
    r
}

async fn fallback(
    State(sh): State<Arc<Shared>>,
    method: Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = begin(&sh, &method, uri.path(), &headers, &[]) {
        return r;
    }
    discord_error(StatusCode::NOT_FOUND, 0, "404: Not Found")
}

async fn gateway_conn(sh: Arc<Shared>, stream: tokio::net::TcpStream) {
    let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
        return;
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<Cmd>();
    {
        let mut st = sh.lock();
        st.connections += 1;
        st.conns.push(tx.clone());
    }
    let hello = json!({"op": 10, "d": {"heartbeat_interval": sh.opts.heartbeat_interval_ms}});
    if ws.send(Message::text(hello.to_string())).await.is_err() {
        return;
    }
    loop {
        tokio::select! {
            cmd = rx.recv() => match cmd {
                Some(Cmd::Frame(v)) => {
                    if ws.send(Message::text(v.to_string())).await.is_err() {
                        break;
                    }
                }
                Some(Cmd::Close(code)) => {
                    let _ = ws.close(Some(CloseFrame { code: CloseCode::from(code), reason: "fake close".into() })).await;
                    // Wait (briefly) for the client's answering Close frame.
                    let answered = tokio::time::timeout(Duration::from_secs(2), async {
                        while let Some(Ok(m)) = ws.next().await {
                            if matches!(m, Message::Close(_)) {
                                return true;
                            }
                        }
                        false
                    })
                    .await
                    .unwrap_or(false);
                    if answered {
                        sh.lock().closes_answered += 1;
                    }
                    break;
                }
                Some(Cmd::Drop) | None => break,
            },
            frame = ws.next() => {
                let text = match frame {
                    Some(Ok(Message::Text(t))) => t.to_string(),
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => continue,
                };
                let Ok(v) = serde_json::from_str::<Value>(&text) else {
                    let _ = ws.close(Some(CloseFrame { code: CloseCode::from(4002), reason: "Error while decoding payload.".into() })).await;
                    break;
                };
                let mut st = sh.lock();
                st.client_frames.push(v.clone());
                st.client_frame_times.push(Instant::now());
                match v["op"].as_u64() {
                    Some(1) if !st.no_heartbeat_ack => {
                        let _ = tx.send(Cmd::Frame(json!({"op": 11})));
                    }
                    Some(2) => {
                        if v["d"]["token"] != FAKE_TOKEN {
                            let _ = tx.send(Cmd::Close(4004));
                            continue;
                        }
                        st.sessions_made += 1;
                        let id = format!("fake-session-{}", st.sessions_made);
                        st.session = Some(FakeSession { id: id.clone(), seq: 1, log: Vec::new() });
                        let ready = json!({"op": 0, "t": "READY", "s": 1, "d": {
                            "v": 10,
                            "session_id": id,
                            "resume_gateway_url": format!("ws://{}", sh.gw_addr),
                            "user": {"id": BOT_ID, "username": BOT_NAME, "bot": true},
                            "guilds": [],
                        }});
                        let _ = tx.send(Cmd::Frame(ready));
                        st.live = Some(tx.clone());
                        for (t, d) in std::mem::take(&mut st.pending) {
                            st.dispatch(&t, d);
                        }
                    }
                    Some(6) => {
                        if v["d"]["token"] != FAKE_TOKEN {
                            let _ = tx.send(Cmd::Close(4004));
                            continue;
                        }
                        let from = v["d"]["seq"].as_u64().unwrap_or(0);
                        let sid = v["d"]["session_id"].as_str().unwrap_or("");
                        let known = st.session.as_ref().is_some_and(|s| s.id == sid);
                        if !known {
                            let _ = tx.send(Cmd::Frame(json!({"op": 9, "d": false})));
                            continue;
                        }
                        if let Some(s) = st.session.as_mut() {
                            for (n, f) in &s.log {
                                if *n > from {
                                    let _ = tx.send(Cmd::Frame(f.clone()));
                                }
                            }
                            s.seq += 1;
                            let _ = tx.send(Cmd::Frame(json!({"op": 0, "t": "RESUMED", "s": s.seq, "d": {}})));
                        }
                        st.live = Some(tx.clone());
                    }
                    _ => {}
                }
            }
        }
    }
    let mut st = sh.lock();
    st.conns.retain(|c| !c.same_channel(&tx));
    if st.live.as_ref().is_some_and(|l| l.same_channel(&tx)) {
        st.live = None;
    }
}
