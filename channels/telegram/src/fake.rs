//! A fake Telegram Bot API on 127.0.0.1 speaking the real wire protocol
//! (`POST|GET /bot<TOKEN>/<method>`, JSON or query parameters, `{"ok":...}` answers), for
//! tests of this crate and of the daemon (feature `testing`).
//!
//! ```ignore
//! let fake = FakeTelegram::start().await;
//! let mut cfg = TelegramConfig::new(FakeTelegram::TOKEN);
//! cfg.api_url = fake.api_url();
//! let event_id = fake.push_user_message(1001, 1001, "hello"); // a private chat
//! // ... run the channel ...
//! let replies = fake.wait_sent(1, Duration::from_secs(5)).await;
//! ```
//!
//! What it does like Telegram:
//! - `getUpdates` is a real long poll: it holds the request until an update with
//!   `update_id >= offset` exists or `timeout` seconds pass; an `offset` confirms (drops) every
//!   update below it; a second concurrent poll ends the first with 409 Conflict.
//! - `sendMessage` / `editMessageText` parse `parse_mode = "HTML"` strictly (only Telegram's
//!   tags and entities, proper nesting) and answer 400 "can't parse entities" otherwise; they
//!   refuse empty text and text over 4096 UTF-16 units after parsing; editing to the same text
//!   answers 400 "message is not modified"; editing an unknown message 400 "message to edit
//!   not found".
//! - A wrong token gets 401 `{"ok":false,"error_code":401,"description":"Unauthorized"}`.
//! - `sendChatAction`, `getFile`, `deleteWebhook`, `getMe` answer as Telegram does.
//! - Files: users send photos, voice notes, audio, videos, video notes and documents
//!   ([`FakeTelegram::push_media`], [`FakeTelegram::push_photo`], ...). `getFile` answers
//!   `{file_id, file_unique_id, file_size, file_path}` (400 "invalid file_id" for an unknown
//!   id, 400 "file is too big" over 20 MB), and `GET /file/bot<TOKEN>/<file_path>` serves the
//!   bytes (404 for a wrong token or path). `sendPhoto`, `sendVoice`, `sendAudio`, `sendVideo`,
//!   `sendVideoNote` and `sendDocument` take `multipart/form-data` uploads (or the `file_id` of
//!   a file the bot knows), refuse malformed ones as Telegram does (no `chat_id`, no file,
//!   empty file, a photo that is not a JPEG/PNG/WebP or is over 10 MB, a caption over 1024
//!   characters; 413 over the upload limit, 50 MB unless [`FakeTelegram::set_upload_limit`]),
//!   answer a `Message` with its `photo`/`voice`/`audio`/`video`/`video_note`/`document`, and
//!   are recorded in [`FakeTelegram::uploads`] and, as one message each (text = the caption),
//!   in [`FakeTelegram::sent`]. [`FakeTelegram::hold_uploads`] makes uploads hang unanswered
//!   and unrecorded, as if the bot died mid-upload.
//!
//! Scripting: [`FakeTelegram::fail_next`] (429 with `retry_after`, 5xx, 401, 400, "can't parse
//! entities", a dropped connection), [`FakeTelegram::set_stall`] (polls hang: a dead
//! connection), [`FakeTelegram::disconnect`] (drop every poll in flight). Everything is
//! recorded: [`FakeTelegram::requests`], [`FakeTelegram::sent`], [`FakeTelegram::actions`].
//!
//! Several bots: [`FakeTelegram::add_bot`] serves another token on the same server, as
//! Telegram does, each bot with its own updates, messages, log and failures (a request is
//! routed by the token in `/bot<TOKEN>/method`; one with a token no bot has is answered 401
//! and recorded with the first bot's requests).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use clawft_channel_core::lock::MutexExt;
use clawft_channel_core::media::parse_multipart;
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio::time::Instant;

/// A scripted failure of the next call of one method.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// 429 with `parameters.retry_after` = this many seconds.
    RateLimit(u64),
    /// This HTTP status (500, 502, ...) with a Telegram-style JSON body.
    Status(u16, String),
    /// 401 Unauthorized (a revoked token).
    Unauthorized,
    /// 400 with this description (e.g. `Bad Request: chat not found`).
    BadRequest(String),
    /// 400 "can't parse entities" — consumed by the next call that uses `parse_mode`.
    CantParseEntities,
    /// The connection is dropped before the answer's body.
    Disconnect,
}

/// A message the bot posted or edited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentMessage {
    /// `sendMessage` or `editMessageText`, or the `send*` method of an uploaded file.
    pub method: String,
    /// Chat id.
    pub chat: i64,
    /// `message_thread_id` given (forum topic).
    pub thread: Option<i64>,
    /// The message's id (new or edited).
    pub message_id: i64,
    /// `text` as sent (HTML when `parse_mode` is HTML).
    pub text: String,
    /// The text as the user sees it (tags removed, entities decoded).
    pub visible: String,
    /// `parse_mode` given.
    pub parse_mode: Option<String>,
    /// The message this replies to (`reply_parameters.message_id` / `reply_to_message_id`).
    pub reply_to: Option<i64>,
    /// When the fake accepted it (just before answering the request).
    pub at: std::time::Instant,
}

/// A `sendChatAction` call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatAction {
    /// Chat id.
    pub chat: i64,
    /// Topic.
    pub thread: Option<i64>,
    /// `typing`, ...
    pub action: String,
}

/// One request as received.
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    /// Bot API method (`getUpdates`, ...).
    pub method: String,
    /// Whether the token was right.
    pub authorized: bool,
    /// Parameters (JSON body or query string).
    pub params: Value,
}

/// A user message to inject, for cases [`FakeTelegram::push_user_message`] does not cover.
#[derive(Clone, Debug)]
pub struct FakeMessage {
    /// Chat id: positive for a private chat, negative for a (super)group.
    pub chat: i64,
    /// Sender's user id.
    pub user: i64,
    /// Whether the sender is a bot.
    pub user_is_bot: bool,
    /// Text; `@name` mentions and a leading `/command[@bot]` get entities as Telegram adds.
    pub text: String,
    /// Forum topic (`message_thread_id`, `is_topic_message`).
    pub topic: Option<i64>,
    /// Id of the message this replies to (a bot message id from [`FakeTelegram::sent`]).
    pub reply_to: Option<i64>,
}

impl FakeMessage {
    /// A message from `user` in `chat`.
    pub fn new(chat: i64, user: i64, text: &str) -> Self {
        Self {
            chat,
            user,
            user_is_bot: false,
            text: text.to_string(),
            topic: None,
            reply_to: None,
        }
    }
}

/// The message field a user's file comes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FakeMediaKind {
    /// `photo`: an array of sizes (a thumbnail, a 1280 px one for big photos, the full one).
    Photo,
    /// `voice` (default type `audio/ogg`).
    Voice,
    /// `audio` (default type `audio/mpeg`).
    Audio,
    /// `video` (default type `video/mp4`).
    Video,
    /// `video_note` (round video; Telegram gives no name or type).
    VideoNote,
    /// `document`.
    Document,
}

/// A user message with a file, for [`FakeTelegram::push_media`].
#[derive(Clone, Debug)]
pub struct FakeMedia {
    /// Chat id: positive for a private chat, negative for a (super)group.
    pub chat: i64,
    /// Sender's user id.
    pub user: i64,
    /// Which field the file comes in.
    pub kind: FakeMediaKind,
    /// The file's bytes (served by `/file/bot<TOKEN>/<file_path>`).
    pub bytes: Vec<u8>,
    /// `file_name` (audio, video, document).
    pub file_name: Option<String>,
    /// `mime_type` (voice, audio, video, document); defaults per kind when `None`.
    pub mime: Option<String>,
    /// Caption (with entities for `@mentions` and a leading `/command`, as Telegram adds).
    pub caption: Option<String>,
    /// `duration` in seconds (voice, audio, video, video note).
    pub duration: u32,
    /// Width and height of a photo or video (default 1280 x 960).
    pub size_px: (u32, u32),
    /// Forum topic.
    pub topic: Option<i64>,
    /// Id of the message this replies to.
    pub reply_to: Option<i64>,
}

impl FakeMedia {
    /// A file of `kind` from `user` in `chat`, without caption.
    pub fn new(chat: i64, user: i64, kind: FakeMediaKind, bytes: impl Into<Vec<u8>>) -> Self {
        Self {
            chat,
            user,
            kind,
            bytes: bytes.into(),
            file_name: None,
            mime: None,
            caption: None,
            duration: 3,
            size_px: (1280, 960),
            topic: None,
            reply_to: None,
        }
    }

    /// With this caption.
    #[must_use]
    pub fn caption(mut self, caption: &str) -> Self {
        self.caption = Some(caption.to_string());
        self
    }

    /// With this file name.
    #[must_use]
    pub fn name(mut self, name: &str) -> Self {
        self.file_name = Some(name.to_string());
        self
    }

    /// With this media type.
    #[must_use]
    pub fn mime(mut self, mime: &str) -> Self {
        self.mime = Some(mime.to_string());
        self
    }
}

/// A file the fake holds (sent by a user or uploaded by the bot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredFile {
    /// `file_id`.
    pub file_id: String,
    /// `file_unique_id`.
    pub file_unique_id: String,
    /// `file_path` (`photos/file_3.jpg`), served under `/file/bot<TOKEN>/`.
    pub file_path: String,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// One file the bot uploaded (a `send*` call Telegram accepted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upload {
    /// `sendPhoto`, `sendVoice`, `sendAudio`, `sendVideo`, `sendVideoNote` or `sendDocument`.
    pub method: String,
    /// Chat id.
    pub chat: i64,
    /// `message_thread_id` given.
    pub thread: Option<i64>,
    /// The message's id (also in [`FakeTelegram::sent`]).
    pub message_id: i64,
    /// The file part's field (`photo`, `document`, ...).
    pub field: String,
    /// The file part's `filename`.
    pub file_name: Option<String>,
    /// The file part's `Content-Type`.
    pub content_type: Option<String>,
    /// The bytes.
    pub bytes: Vec<u8>,
    /// `caption` given.
    pub caption: Option<String>,
    /// `reply_parameters.message_id` given.
    pub reply_to: Option<i64>,
    /// The `file_id` the fake gave it (`getFile` knows it).
    pub file_id: String,
}

#[derive(Default)]
struct St {
    next_update: i64,
    updates: Vec<Value>,
    next_message: i64,
    /// (chat, message id) → (visible text, parse mode, sent by the bot).
    messages: HashMap<(i64, i64), (String, Option<String>, bool)>,
    sent: Vec<SentMessage>,
    actions: Vec<ChatAction>,
    requests: Vec<Recorded>,
    failures: HashMap<String, VecDeque<(usize, Failure)>>,
    poll_generation: u64,
    /// `getUpdates` requests being answered now (their connection open), and the most ever
    /// at once: more than one means two bot instances poll together.
    polls_in_flight: usize,
    max_polls_in_flight: usize,
    kicks: u64,
    stall: bool,
    /// `getUpdates` answers at once, ignoring `timeout` (a misbehaving Bot API server).
    ignore_timeout: bool,
    /// file_id → the file (sent by users or uploaded by the bot).
    files: HashMap<String, StoredFile>,
    next_file: u64,
    uploads: Vec<Upload>,
    /// Uploads hang unanswered and unrecorded.
    hold_uploads: bool,
    /// Largest upload body (413 over it); `None`: 50 MB.
    upload_limit: Option<u64>,
    /// `file_path`s downloaded through `/file/bot<TOKEN>/...`.
    downloads: Vec<String>,
}

struct Shared {
    st: Mutex<St>,
    changed: Notify,
    token: String,
    /// This bot's user id and username (`getMe`, the sender of its messages).
    bot_id: i64,
    username: String,
}

impl Shared {
    fn new(token: &str, bot_id: i64, username: &str) -> Arc<Self> {
        Arc::new(Shared {
            st: Mutex::new(St {
                next_update: 100_000,
                next_message: 1,
                ..St::default()
            }),
            changed: Notify::new(),
            token: token.to_string(),
            bot_id,
            username: username.to_string(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, St> {
        self.st.locked()
    }
}

/// The bots one server answers for, by token; the first is the one of [`FakeTelegram::start`].
struct Bots {
    first: Arc<Shared>,
    by_token: Mutex<HashMap<String, Arc<Shared>>>,
}

/// The server task: stops when the last handle of one of its bots is dropped.
struct Server(tokio::task::JoinHandle<()>);

impl Drop for Server {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The fake Bot API server, seen as one of its bots. Stops when it and every other bot of the
/// server ([`FakeTelegram::add_bot`]) are dropped.
pub struct FakeTelegram {
    addr: SocketAddr,
    shared: Arc<Shared>,
    bots: Arc<Bots>,
    _server: Arc<Server>,
}

impl FakeTelegram {
    /// The token the fake accepts.
    pub const TOKEN: &'static str = "123456:TEST-fake_token-abcdefghijklmnopqrstu";
    /// The bot's user id.
    pub const BOT_ID: i64 = 4242;
    /// The bot's username (without `@`).
    pub const BOT_USERNAME: &'static str = "clawft_test_bot";

    /// Start on an ephemeral port of 127.0.0.1.
    ///
    /// # Panics
    /// If no port can be bound (tests only).
    #[allow(clippy::expect_used)]
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local addr");
        let shared = Shared::new(Self::TOKEN, Self::BOT_ID, Self::BOT_USERNAME);
        let bots = Arc::new(Bots {
            first: shared.clone(),
            by_token: Mutex::new(HashMap::from([(Self::TOKEN.to_string(), shared.clone())])),
        });
        let app = Router::new()
            .route("/{bot}/{method}", any(handle))
            .route("/file/{bot}/{*path}", get(download))
            // Uploads are up to 50 MB (and more, to answer 413 like Telegram).
            .layer(DefaultBodyLimit::disable())
            .with_state(bots.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            addr,
            shared,
            bots,
            _server: Arc::new(Server(task)),
        }
    }

    /// Another bot served by the same server (the same `api_url`): `token` is its token, and
    /// it has its own user id, username, updates, messages, recorded requests and scripted
    /// failures. Replaces a bot of the same token.
    pub fn add_bot(&self, token: &str, bot_id: i64, username: &str) -> FakeTelegram {
        let shared = Shared::new(token, bot_id, username);
        self.bots
            .by_token
            .locked()
            .insert(token.to_string(), shared.clone());
        FakeTelegram {
            addr: self.addr,
            shared,
            bots: self.bots.clone(),
            _server: self._server.clone(),
        }
    }

    /// This bot's token.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// The base URL to configure as `api_url`.
    pub fn api_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A user message: a private chat when `chat > 0`, a supergroup when `chat < 0`. Returns
    /// the event id the adapter will deliver it with (the `update_id`).
    pub fn push_user_message(&self, chat: i64, user: i64, text: &str) -> String {
        self.push_message(FakeMessage::new(chat, user, text))
    }

    /// Inject a message update; returns its event id (the `update_id`).
    pub fn push_message(&self, m: FakeMessage) -> String {
        let mut st = self.shared.lock();
        let message_id = st.next_message;
        st.next_message += 1;
        let mut msg = json!({
            "message_id": message_id,
            "date": 1_700_000_000,
            "chat": chat_json(m.chat, m.topic.is_some()),
            "from": {"id": m.user, "is_bot": m.user_is_bot, "first_name": "User", "username": format!("user{}", m.user)},
            "text": m.text,
        });
        let entities = entities_of(&m.text);
        if !entities.is_empty() {
            msg["entities"] = Value::Array(entities);
        }
        self.topic_and_reply(&st, &mut msg, m.chat, m.user, m.topic, m.reply_to);
        st.messages
            .insert((m.chat, message_id), (m.text, None, false));
        drop(st);
        self.push_update(json!({ "message": msg })).to_string()
    }

    /// Inject any update (e.g. `{"edited_message": {...}}`); an `update_id` is assigned unless
    /// given. Returns the update id.
    pub fn push_update(&self, mut update: Value) -> i64 {
        let mut st = self.shared.lock();
        let id = match update.get("update_id").and_then(Value::as_i64) {
            Some(id) => id,
            None => {
                let id = st.next_update;
                update["update_id"] = json!(id);
                id
            }
        };
        st.next_update = st.next_update.max(id + 1);
        st.updates.push(update);
        st.updates
            .sort_by_key(|u| u.get("update_id").and_then(Value::as_i64));
        drop(st);
        self.shared.changed.notify_waiters();
        id
    }

    /// `message_thread_id` for a topic, and `reply_to_message` (by the bot when the replied-to
    /// message is one the bot sent), as Telegram sets them.
    fn topic_and_reply(
        &self,
        st: &St,
        msg: &mut Value,
        chat: i64,
        user: i64,
        topic: Option<i64>,
        reply_to: Option<i64>,
    ) {
        if let Some(t) = topic {
            msg["message_thread_id"] = json!(t);
            msg["is_topic_message"] = json!(true);
        }
        if let Some(r) = reply_to {
            let by_bot = st.messages.get(&(chat, r)).is_some_and(|(_, _, b)| *b);
            let from = if by_bot {
                json!({"id": self.shared.bot_id, "is_bot": true, "first_name": "Clawft", "username": self.shared.username})
            } else {
                json!({"id": user, "is_bot": false, "first_name": "User"})
            };
            msg["reply_to_message"] = json!({
                "message_id": r, "date": 1_700_000_000,
                "chat": chat_json(chat, topic.is_some()), "from": from, "text": "..."
            });
        }
    }

    /// A user message with a file (see [`FakeMedia`]); returns its event id (the
    /// `update_id`). The file's `file_id` is in the delivered attachment (and in
    /// [`FakeTelegram::files`]).
    pub fn push_media(&self, m: FakeMedia) -> String {
        let mut st = self.shared.lock();
        let message_id = st.next_message;
        st.next_message += 1;
        let mut msg = json!({
            "message_id": message_id,
            "date": 1_700_000_000,
            "chat": chat_json(m.chat, m.topic.is_some()),
            "from": {"id": m.user, "is_bot": false, "first_name": "User", "username": format!("user{}", m.user)},
        });
        if let Some(c) = &m.caption {
            msg["caption"] = json!(c);
            let entities = entities_of(c);
            if !entities.is_empty() {
                msg["caption_entities"] = Value::Array(entities);
            }
        }
        self.topic_and_reply(&st, &mut msg, m.chat, m.user, m.topic, m.reply_to);
        let (field, value) = media_json(&mut st, &m);
        msg[field] = value;
        st.messages.insert(
            (m.chat, message_id),
            (m.caption.clone().unwrap_or_default(), None, false),
        );
        drop(st);
        self.push_update(json!({ "message": msg })).to_string()
    }

    /// A photo (JPEG bytes) with an optional caption; returns the event id.
    pub fn push_photo(&self, chat: i64, user: i64, bytes: &[u8], caption: Option<&str>) -> String {
        let mut m = FakeMedia::new(chat, user, FakeMediaKind::Photo, bytes);
        m.caption = caption.map(str::to_string);
        self.push_media(m)
    }

    /// A voice note (OGG/Opus bytes) of `duration` seconds, without caption; returns the event
    /// id.
    pub fn push_voice(&self, chat: i64, user: i64, bytes: &[u8], duration: u32) -> String {
        let mut m = FakeMedia::new(chat, user, FakeMediaKind::Voice, bytes);
        m.duration = duration;
        self.push_media(m)
    }

    /// A document with its file name, type and an optional caption; returns the event id.
    pub fn push_document(
        &self,
        chat: i64,
        user: i64,
        bytes: &[u8],
        name: &str,
        mime: &str,
        caption: Option<&str>,
    ) -> String {
        let mut m = FakeMedia::new(chat, user, FakeMediaKind::Document, bytes)
            .name(name)
            .mime(mime);
        m.caption = caption.map(str::to_string);
        self.push_media(m)
    }

    /// Every file the fake holds (users' and the bot's uploads), by `file_id`.
    pub fn files(&self) -> HashMap<String, StoredFile> {
        self.shared.lock().files.clone()
    }

    /// Files the bot uploaded (accepted `send*` calls), in order.
    pub fn uploads(&self) -> Vec<Upload> {
        self.shared.lock().uploads.clone()
    }

    /// Wait until at least `n` files were uploaded, or `timeout` passes.
    pub async fn wait_uploads(&self, n: usize, timeout: Duration) -> Vec<Upload> {
        self.wait(timeout, |st| st.uploads.len() >= n).await;
        self.uploads()
    }

    /// The `file_path`s downloaded with the right token, in order.
    pub fn downloads(&self) -> Vec<String> {
        self.shared.lock().downloads.clone()
    }

    /// While on, an upload (`send*` with a file) is read but never answered nor recorded as an
    /// upload, as if the bot died mid-upload; switching it off drops the held connections.
    pub fn hold_uploads(&self, on: bool) {
        self.shared.lock().hold_uploads = on;
        self.shared.changed.notify_waiters();
    }

    /// The largest upload request body accepted (default 50 MB); a bigger one is answered 413
    /// `Request Entity Too Large`, as Telegram does.
    pub fn set_upload_limit(&self, bytes: u64) {
        self.shared.lock().upload_limit = Some(bytes);
    }

    /// Updates not yet confirmed by an `offset`.
    pub fn pending_updates(&self) -> Vec<i64> {
        self.shared
            .lock()
            .updates
            .iter()
            .filter_map(|u| u.get("update_id").and_then(Value::as_i64))
            .collect()
    }

    /// Messages the bot posted or edited, in order: what the chat shows. An uploaded file is
    /// one entry too (`method` = `sendDocument`, ..., text = its caption, usually empty); filter
    /// on `method == "sendMessage"` for the texts.
    pub fn sent(&self) -> Vec<SentMessage> {
        self.shared.lock().sent.clone()
    }

    /// `sendChatAction` calls, in order.
    pub fn actions(&self) -> Vec<ChatAction> {
        self.shared.lock().actions.clone()
    }

    /// Every request, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.lock().requests.clone()
    }

    /// The parameters of every call of `method`, in order.
    pub fn calls(&self, method: &str) -> Vec<Value> {
        self.shared
            .lock()
            .requests
            .iter()
            .filter(|r| r.method == method)
            .map(|r| r.params.clone())
            .collect()
    }

    /// Make the next call of `method` fail (queued in order).
    pub fn fail_next(&self, method: &str, failure: Failure) {
        self.fail_later(method, 0, failure);
    }

    /// Let `after` more calls of `method` succeed, then fail the next one.
    pub fn fail_later(&self, method: &str, after: usize, failure: Failure) {
        self.shared
            .lock()
            .failures
            .entry(method.to_string())
            .or_default()
            .push_back((after, failure));
    }

    /// `getUpdates` requests in flight now (answered requests and closed connections do not
    /// count).
    pub fn polls_in_flight(&self) -> usize {
        self.shared.lock().polls_in_flight
    }

    /// The most `getUpdates` requests ever in flight at once: more than 1 means two pollers
    /// overlapped (Telegram answers the first one 409 Conflict then).
    pub fn max_concurrent_polls(&self) -> usize {
        self.shared.lock().max_polls_in_flight
    }

    /// While on, `getUpdates` never answers (a dead connection); turning it off lets new
    /// polls work again.
    pub fn set_stall(&self, on: bool) {
        self.shared.lock().stall = on;
        self.shared.changed.notify_waiters();
    }

    /// While on, `getUpdates` answers at once with what is ready (often nothing), ignoring its
    /// `timeout`, like a misbehaving Bot API server or proxy.
    pub fn set_ignore_timeout(&self, on: bool) {
        self.shared.lock().ignore_timeout = on;
        self.shared.changed.notify_waiters();
    }

    /// Drop every `getUpdates` in flight (their connections close without an answer).
    pub fn disconnect(&self) {
        self.shared.lock().kicks += 1;
        self.shared.changed.notify_waiters();
    }

    /// Wait until at least `n` messages were sent or edited, or `timeout` passes.
    pub async fn wait_sent(&self, n: usize, timeout: Duration) -> Vec<SentMessage> {
        self.wait(timeout, |st| st.sent.len() >= n).await;
        self.sent()
    }

    /// Wait until `method` was called at least `n` times, or `timeout` passes.
    pub async fn wait_calls(&self, method: &str, n: usize, timeout: Duration) -> Vec<Value> {
        self.wait(timeout, |st| {
            st.requests.iter().filter(|r| r.method == method).count() >= n
        })
        .await;
        self.calls(method)
    }

    async fn wait(&self, timeout: Duration, done: impl Fn(&St) -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.shared.changed.notified();
            if done(&self.shared.lock()) {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return;
            }
        }
    }
}

fn chat_json(chat: i64, forum: bool) -> Value {
    if chat > 0 {
        json!({"id": chat, "type": "private", "first_name": "User"})
    } else {
        json!({"id": chat, "type": "supergroup", "title": "Test group", "is_forum": forum})
    }
}

/// `mention` entities for `@name` and a `bot_command` for a leading `/cmd[@bot]`, with
/// offsets in UTF-16 units as Telegram gives them.
fn entities_of(text: &str) -> Vec<Value> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut pos16 = 0usize;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let starts = i == 0 || chars[i - 1].is_whitespace();
        if starts && (c == '@' || (c == '/' && i == 0)) {
            let mut j = i + 1;
            while j < chars.len() && word(chars[j]) {
                j += 1;
            }
            if c == '/' && j < chars.len() && chars[j] == '@' {
                j += 1;
                while j < chars.len() && word(chars[j]) {
                    j += 1;
                }
            }
            if j > i + 1 {
                let len: usize = chars[i..j].iter().map(|c| c.len_utf16()).sum();
                let kind = if c == '@' { "mention" } else { "bot_command" };
                out.push(json!({"type": kind, "offset": pos16, "length": len}));
                pos16 += len;
                i = j;
                continue;
            }
        }
        pos16 += c.len_utf16();
        i += 1;
    }
    out
}

const TAGS: &[&str] = &[
    "b",
    "strong",
    "i",
    "em",
    "u",
    "ins",
    "s",
    "strike",
    "del",
    "code",
    "pre",
    "a",
    "blockquote",
    "tg-spoiler",
    "span",
];

/// Why Telegram would refuse a text as HTML (the reason of its `can't parse entities`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct HtmlParseError {
    /// Telegram's wording, e.g. `Unclosed start tag at byte offset 3`.
    pub reason: String,
}

/// Parse Telegram HTML strictly; the visible text, or why Telegram would refuse it.
///
/// # Errors
/// [`HtmlParseError`] with the reason Telegram would give.
pub fn parse_telegram_html(html: &str) -> Result<String, HtmlParseError> {
    parse_html(html).map_err(|reason| HtmlParseError { reason })
}

fn parse_html(html: &str) -> Result<String, String> {
    let mut visible = String::new();
    let mut stack: Vec<String> = Vec::new();
    let mut i = 0;
    while i < html.len() {
        let rest = &html[i..];
        let Some(c) = rest.chars().next() else { break };
        match c {
            '<' => {
                let end = rest
                    .find('>')
                    .ok_or_else(|| format!("Unclosed start tag at byte offset {i}"))?;
                let inner = &rest[1..end];
                if let Some(name) = inner.strip_prefix('/') {
                    let name = name.trim().to_ascii_lowercase();
                    match stack.pop() {
                        Some(open) if open == name => {}
                        _ => {
                            return Err(format!(
                                "Unmatched end tag at byte offset {i}, expected \"</{}>\", found \"</{name}>\"",
                                stack.last().cloned().unwrap_or_default()
                            ))
                        }
                    }
                } else {
                    let name: String = inner
                        .chars()
                        .take_while(|c| !c.is_whitespace())
                        .collect::<String>()
                        .to_ascii_lowercase();
                    let attrs = inner[name.len()..].trim();
                    if !TAGS.contains(&name.as_str()) {
                        return Err(format!(
                            "Unsupported start tag \"{name}\" at byte offset {i}"
                        ));
                    }
                    let parent = stack.last().map(String::as_str);
                    let ok_nesting = match (parent, name.as_str()) {
                        (Some("pre"), "code") => true,
                        (Some("code" | "pre"), _) => false,
                        (_, "a") => !stack.iter().any(|t| t == "a"),
                        (_, "blockquote") => !stack.iter().any(|t| t == "blockquote"),
                        _ => true,
                    };
                    if !ok_nesting {
                        return Err(format!(
                            "Can't nest \"{name}\" in \"{}\" at byte offset {i}",
                            parent.unwrap_or("")
                        ));
                    }
                    match name.as_str() {
                        "a" => {
                            let href = attrs
                                .strip_prefix("href=\"")
                                .and_then(|a| a.strip_suffix('"'))
                                .ok_or_else(|| format!("Bad <a> attributes at byte offset {i}"))?;
                            if href.contains('<') || href.contains('"') {
                                return Err(format!("Bad href at byte offset {i}"));
                            }
                        }
                        "code" if !attrs.is_empty() => {
                            let ok = attrs
                                .strip_prefix("class=\"language-")
                                .and_then(|a| a.strip_suffix('"'))
                                .is_some_and(|l| !l.contains(['"', '<', '>']));
                            if !ok {
                                return Err(format!("Bad <code> attributes at byte offset {i}"));
                            }
                        }
                        "span" if attrs != "class=\"tg-spoiler\"" => {
                            return Err(format!("Bad <span> attributes at byte offset {i}"))
                        }
                        _ if !attrs.is_empty() && name != "blockquote" => {
                            return Err(format!("Unexpected attributes at byte offset {i}"))
                        }
                        _ => {}
                    }
                    stack.push(name);
                }
                i += end + 1;
            }
            '&' => {
                let end = rest
                    .find(';')
                    .filter(|e| *e <= 10)
                    .ok_or_else(|| format!("Character entity expected at byte offset {i}"))?;
                let ent = &rest[1..end];
                let ch = match ent {
                    "lt" => '<',
                    "gt" => '>',
                    "amp" => '&',
                    "quot" => '"',
                    _ => ent
                        .strip_prefix("#x")
                        .and_then(|h| u32::from_str_radix(h, 16).ok())
                        .or_else(|| ent.strip_prefix('#').and_then(|d| d.parse().ok()))
                        .and_then(char::from_u32)
                        .ok_or_else(|| format!("Unsupported entity at byte offset {i}"))?,
                };
                visible.push(ch);
                i += end + 1;
            }
            '>' => return Err(format!("Unexpected end tag at byte offset {i}")),
            c => {
                visible.push(c);
                i += c.len_utf8();
            }
        }
    }
    if let Some(open) = stack.last() {
        return Err(format!(
            "Can't find end tag corresponding to start tag \"{open}\""
        ));
    }
    Ok(visible)
}

fn ok(result: Value) -> Response {
    axum::Json(json!({"ok": true, "result": result})).into_response()
}

fn api_error(code: u16, description: &str) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        axum::Json(json!({"ok": false, "error_code": code, "description": description})),
    )
        .into_response()
}

/// An answer whose body never completes: the client sees the connection drop.
fn dropped() -> Response {
    let stream = futures::stream::once(async {
        Err::<Bytes, std::io::Error>(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "fake disconnect",
        ))
    });
    Response::new(Body::from_stream(stream))
}

fn failure_response(f: Failure) -> Response {
    match f {
        Failure::RateLimit(secs) => (
            StatusCode::TOO_MANY_REQUESTS,
            axum::Json(json!({
                "ok": false, "error_code": 429,
                "description": format!("Too Many Requests: retry after {secs}"),
                "parameters": {"retry_after": secs}
            })),
        )
            .into_response(),
        Failure::Status(code, d) => api_error(code, &d),
        Failure::Unauthorized => api_error(401, "Unauthorized"),
        Failure::BadRequest(d) => api_error(400, &d),
        Failure::CantParseEntities => api_error(
            400,
            "Bad Request: can't parse entities: Unsupported start tag \"x\" at byte offset 0",
        ),
        Failure::Disconnect => dropped(),
    }
}

fn params_of(query: HashMap<String, String>, body: &Bytes) -> Value {
    if let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(body) {
        return Value::Object(m);
    }
    let mut m = serde_json::Map::new();
    for (k, v) in query {
        let parsed = serde_json::from_str(&v).unwrap_or(Value::String(v));
        m.insert(k, parsed);
    }
    Value::Object(m)
}

async fn handle(
    State(bots): State<Arc<Bots>>,
    Path((bot, method)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let content_type = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let form = content_type
        .to_ascii_lowercase()
        .starts_with("multipart/form-data")
        .then(|| parse_multipart(&content_type, &body));
    let params = match &form {
        Some(Some(parts)) => form_params(parts),
        _ => params_of(query, &body),
    };
    let upload = upload_field(&method).is_some();
    let known = bot
        .strip_prefix("bot")
        .and_then(|t| bots.by_token.locked().get(t).cloned());
    let authorized = known.is_some();
    let sh = known.unwrap_or_else(|| bots.first.clone());
    let (held, failure) = {
        let mut st = sh.lock();
        st.requests.push(Recorded {
            method: method.clone(),
            authorized,
            params: params.clone(),
        });
        let held = upload && authorized && st.hold_uploads;
        let html = params.get("parse_mode").is_some();
        let queue = st.failures.entry(method.clone()).or_default();
        let failure = match queue.front_mut() {
            _ if held => None,
            Some((_, Failure::CantParseEntities)) if !html => None,
            Some((skip, _)) if *skip > 0 => {
                *skip -= 1;
                None
            }
            Some(_) => queue.pop_front().map(|(_, f)| f),
            None => None,
        };
        (held, failure)
    };
    sh.changed.notify_waiters();
    if !authorized {
        return api_error(401, "Unauthorized");
    }
    if held {
        // As if the bot died mid-upload: never answered, never shown in the chat.
        loop {
            let notified = sh.changed.notified();
            if !sh.lock().hold_uploads {
                return dropped();
            }
            notified.await;
        }
    }
    if let Some(f) = failure {
        return failure_response(f);
    }
    match method.as_str() {
        "getMe" => ok(json!({
            "id": sh.bot_id, "is_bot": true, "first_name": "Clawft",
            "username": sh.username, "can_join_groups": true,
            "can_read_all_group_messages": false, "supports_inline_queries": false,
            "can_connect_to_business": false, "has_main_web_app": false
        })),
        "getUpdates" => get_updates(&sh, &params).await,
        "sendMessage" | "editMessageText" => send_or_edit(&sh, &method, &params),
        "sendChatAction" => {
            let chat = params.get("chat_id").and_then(as_i64);
            let action = params.get("action").and_then(Value::as_str).unwrap_or("");
            let Some(chat) = chat else {
                return api_error(400, "Bad Request: chat_id is empty");
            };
            if !matches!(action, "typing" | "upload_document" | "upload_photo") {
                return api_error(400, "Bad Request: wrong parameter action in request");
            }
            sh.lock().actions.push(ChatAction {
                chat,
                thread: params.get("message_thread_id").and_then(as_i64),
                action: action.to_string(),
            });
            sh.changed.notify_waiters();
            ok(json!(true))
        }
        "getFile" => get_file(&sh, &params),
        m if upload => match form {
            Some(None) => api_error(400, "Bad Request: can't parse multipart/form-data"),
            Some(Some(parts)) => receive_upload(&sh, m, &params, &parts, body.len()),
            None => receive_upload(&sh, m, &params, &[], body.len()),
        },
        "deleteWebhook" | "setMyCommands" => ok(json!(true)),
        _ => api_error(404, "Not Found: method not found"),
    }
}

fn as_i64(v: &Value) -> Option<i64> {
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

/// Counts a `getUpdates` in flight until it is answered or its connection closes (the server
/// drops the handler then).
struct InFlight(Arc<Shared>);

impl InFlight {
    fn new(sh: &Arc<Shared>) -> Self {
        let mut st = sh.lock();
        st.polls_in_flight += 1;
        st.max_polls_in_flight = st.max_polls_in_flight.max(st.polls_in_flight);
        drop(st);
        Self(sh.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.polls_in_flight = st.polls_in_flight.saturating_sub(1);
    }
}

async fn get_updates(sh: &Arc<Shared>, params: &Value) -> Response {
    let _in_flight = InFlight::new(sh);
    let offset = params.get("offset").and_then(as_i64);
    let timeout = params.get("timeout").and_then(as_i64).unwrap_or(0).max(0);
    let limit = params
        .get("limit")
        .and_then(as_i64)
        .unwrap_or(100)
        .clamp(1, 100);
    let (generation, kicks) = {
        let mut st = sh.lock();
        if let Some(o) = offset.filter(|o| *o > 0) {
            st.updates
                .retain(|u| u.get("update_id").and_then(Value::as_i64).unwrap_or(0) >= o);
        }
        st.poll_generation += 1;
        (st.poll_generation, st.kicks)
    };
    sh.changed.notify_waiters();
    let deadline = Instant::now() + Duration::from_secs(u64::try_from(timeout).unwrap_or(0));
    loop {
        let notified = sh.changed.notified();
        {
            let st = sh.lock();
            if st.kicks != kicks {
                return dropped();
            }
            if st.poll_generation != generation {
                return api_error(
                    409,
                    "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running",
                );
            }
            if !st.stall {
                let ready: Vec<Value> = st
                    .updates
                    .iter()
                    .filter(|u| {
                        offset.is_none_or(|o| {
                            u.get("update_id").and_then(Value::as_i64).unwrap_or(0) >= o
                        })
                    })
                    .take(usize::try_from(limit).unwrap_or(100))
                    .cloned()
                    .collect();
                if !ready.is_empty() || st.ignore_timeout || Instant::now() >= deadline {
                    return ok(Value::Array(ready));
                }
            }
        }
        let stall = sh.lock().stall;
        if stall {
            notified.await;
        } else {
            let _ = tokio::time::timeout_at(deadline, notified).await;
        }
    }
}

fn send_or_edit(sh: &Arc<Shared>, method: &str, params: &Value) -> Response {
    let Some(chat) = params.get("chat_id").and_then(as_i64) else {
        return api_error(400, "Bad Request: chat not found");
    };
    let text = params
        .get("text")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let parse_mode = params
        .get("parse_mode")
        .and_then(Value::as_str)
        .map(str::to_string);
    let visible = match parse_mode.as_deref() {
        None => text.clone(),
        Some(m) if m.eq_ignore_ascii_case("html") => match parse_telegram_html(&text) {
            Ok(v) => v,
            Err(why) => {
                return api_error(400, &format!("Bad Request: can't parse entities: {why}"))
            }
        },
        Some(_) => return api_error(400, "Bad Request: unsupported parse_mode"),
    };
    if visible.trim().is_empty() {
        return api_error(400, "Bad Request: message text is empty");
    }
    if visible.encode_utf16().count() > 4096 {
        return api_error(400, "Bad Request: message is too long");
    }
    let thread = params.get("message_thread_id").and_then(as_i64);
    let reply_to = params
        .get("reply_parameters")
        .and_then(|r| r.get("message_id"))
        .or_else(|| params.get("reply_to_message_id"))
        .and_then(as_i64);
    let mut st = sh.lock();
    let message_id = if method == "editMessageText" {
        let Some(id) = params.get("message_id").and_then(as_i64) else {
            return api_error(400, "Bad Request: message identifier is not specified");
        };
        match st.messages.get(&(chat, id)) {
            Some((_, _, false)) => {
                return api_error(400, "Bad Request: message can't be edited");
            }
            Some((old, old_mode, true)) if *old == visible && *old_mode == parse_mode => {
                return api_error(
                    400,
                    "Bad Request: message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message",
                );
            }
            Some(_) => id,
            None => return api_error(400, "Bad Request: message to edit not found"),
        }
    } else {
        let id = st.next_message;
        st.next_message += 1;
        id
    };
    st.messages.insert(
        (chat, message_id),
        (visible.clone(), parse_mode.clone(), true),
    );
    st.sent.push(SentMessage {
        method: method.to_string(),
        chat,
        thread,
        message_id,
        text,
        visible: visible.clone(),
        parse_mode,
        reply_to,
        at: std::time::Instant::now(),
    });
    drop(st);
    sh.changed.notify_waiters();
    let mut msg = json!({
        "message_id": message_id, "date": 1_700_000_000,
        "chat": chat_json(chat, thread.is_some()),
        "from": {"id": sh.bot_id, "is_bot": true, "first_name": "Clawft", "username": sh.username},
        "text": visible,
    });
    if let Some(t) = thread {
        msg["message_thread_id"] = json!(t);
        msg["is_topic_message"] = json!(true);
    }
    ok(msg)
}

/// Telegram's upload limit for bots.
const UPLOAD_LIMIT: u64 = 50 * 1024 * 1024;
/// `getFile` serves files up to 20 MB.
const DOWNLOAD_LIMIT: usize = 20 * 1024 * 1024;
/// `sendPhoto` takes photos up to 10 MB.
const PHOTO_LIMIT: usize = 10 * 1024 * 1024;

/// The file field of an upload method.
fn upload_field(method: &str) -> Option<&'static str> {
    Some(match method {
        "sendPhoto" => "photo",
        "sendVoice" => "voice",
        "sendAudio" => "audio",
        "sendVideo" => "video",
        "sendVideoNote" => "video_note",
        "sendDocument" => "document",
        _ => return None,
    })
}

fn extension(name: Option<&str>) -> String {
    name.and_then(|n| n.rsplit_once('.'))
        .map(|(_, e)| e)
        .filter(|e| !e.is_empty() && e.len() <= 8 && e.chars().all(|c| c.is_ascii_alphanumeric()))
        .map_or_else(String::new, |e| format!(".{e}"))
}

/// Store a file; returns its `file_id` and `file_unique_id`.
fn store_file(st: &mut St, dir: &str, ext: &str, bytes: Vec<u8>) -> (String, String) {
    st.next_file += 1;
    let n = st.next_file;
    let file_id = format!("AgAD{n:04}fake-file-id");
    let unique = format!("AQAD{n:04}");
    st.files.insert(
        file_id.clone(),
        StoredFile {
            file_id: file_id.clone(),
            file_unique_id: unique.clone(),
            file_path: format!("{dir}/file_{n}{ext}"),
            bytes,
        },
    );
    (file_id, unique)
}

/// The message field and its value for a user's file, storing the file (and a photo's smaller
/// sizes).
fn media_json(st: &mut St, m: &FakeMedia) -> (&'static str, Value) {
    let size = m.bytes.len();
    let name = m.file_name.as_deref();
    let (w, h) = m.size_px;
    match m.kind {
        FakeMediaKind::Photo => {
            let mut sizes = Vec::new();
            let long = w.max(h).max(1);
            let scaled = |side: u32| {
                (
                    (u64::from(w) * u64::from(side) / u64::from(long)).max(1),
                    (u64::from(h) * u64::from(side) / u64::from(long)).max(1),
                )
            };
            // Smaller sizes Telegram makes: distinct bytes (still JPEG) so tests see which
            // one was fetched.
            for side in [90u32, 1280] {
                if side < long {
                    let mut bytes = vec![0xFF, 0xD8, 0xFF];
                    bytes.extend_from_slice(format!(" {side}px").as_bytes());
                    let len = bytes.len();
                    let (id, unique) = store_file(st, "photos", ".jpg", bytes);
                    let (sw, sh) = scaled(side);
                    sizes.push(json!({"file_id": id, "file_unique_id": unique, "width": sw, "height": sh, "file_size": len}));
                }
            }
            let (id, unique) = store_file(st, "photos", ".jpg", m.bytes.clone());
            sizes.push(json!({"file_id": id, "file_unique_id": unique, "width": w, "height": h, "file_size": size}));
            ("photo", Value::Array(sizes))
        }
        FakeMediaKind::Voice => {
            let (id, unique) = store_file(st, "voice", ".oga", m.bytes.clone());
            let mime = m.mime.clone().unwrap_or_else(|| "audio/ogg".into());
            (
                "voice",
                json!({"file_id": id, "file_unique_id": unique, "duration": m.duration, "mime_type": mime, "file_size": size}),
            )
        }
        FakeMediaKind::Audio => {
            let ext = extension(name);
            let ext = if ext.is_empty() { ".mp3".into() } else { ext };
            let (id, unique) = store_file(st, "music", &ext, m.bytes.clone());
            let mime = m.mime.clone().unwrap_or_else(|| "audio/mpeg".into());
            let mut v = json!({"file_id": id, "file_unique_id": unique, "duration": m.duration, "mime_type": mime, "file_size": size});
            if let Some(n) = name {
                v["file_name"] = json!(n);
            }
            ("audio", v)
        }
        FakeMediaKind::Video => {
            let (id, unique) = store_file(st, "videos", ".mp4", m.bytes.clone());
            let mime = m.mime.clone().unwrap_or_else(|| "video/mp4".into());
            let mut v = json!({"file_id": id, "file_unique_id": unique, "width": w, "height": h, "duration": m.duration, "mime_type": mime, "file_size": size});
            if let Some(n) = name {
                v["file_name"] = json!(n);
            }
            ("video", v)
        }
        FakeMediaKind::VideoNote => {
            let (id, unique) = store_file(st, "video_notes", ".mp4", m.bytes.clone());
            (
                "video_note",
                json!({"file_id": id, "file_unique_id": unique, "length": w.min(h), "duration": m.duration, "file_size": size}),
            )
        }
        FakeMediaKind::Document => {
            let (id, unique) = store_file(st, "documents", &extension(name), m.bytes.clone());
            let mut v = json!({"file_id": id, "file_unique_id": unique, "file_size": size});
            if let Some(n) = name {
                v["file_name"] = json!(n);
            }
            if let Some(t) = &m.mime {
                v["mime_type"] = json!(t);
            }
            ("document", v)
        }
    }
}

fn get_file(sh: &Arc<Shared>, params: &Value) -> Response {
    let Some(id) = params.get("file_id").and_then(Value::as_str) else {
        return api_error(400, "Bad Request: file_id is empty");
    };
    let st = sh.lock();
    let Some(f) = st.files.get(id) else {
        return api_error(400, "Bad Request: invalid file_id");
    };
    if f.bytes.len() > DOWNLOAD_LIMIT {
        return api_error(400, "Bad Request: file is too big");
    }
    ok(json!({
        "file_id": f.file_id, "file_unique_id": f.file_unique_id,
        "file_size": f.bytes.len(), "file_path": f.file_path
    }))
}

/// `GET /file/bot<TOKEN>/<file_path>`: the bytes, or 404 as Telegram answers a wrong token or
/// path.
async fn download(
    State(bots): State<Arc<Bots>>,
    Path((bot, path)): Path<(String, String)>,
) -> Response {
    let known = bot
        .strip_prefix("bot")
        .and_then(|t| bots.by_token.locked().get(t).cloned());
    let Some(sh) = known else {
        return api_error(404, "Not Found");
    };
    let mut st = sh.lock();
    let Some(bytes) = st
        .files
        .values()
        .find(|f| f.file_path == path)
        .map(|f| f.bytes.clone())
    else {
        return api_error(404, "Not Found");
    };
    st.downloads.push(path);
    drop(st);
    sh.changed.notify_waiters();
    (
        [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
        bytes,
    )
        .into_response()
}

/// The text fields of a form as parameters (JSON values parsed), file fields as
/// `{"file_name", "size"}`.
fn form_params(parts: &[clawft_channel_core::media::Part]) -> Value {
    let mut m = serde_json::Map::new();
    for p in parts {
        let v = match &p.file_name {
            Some(n) => json!({"file_name": n, "size": p.data.len()}),
            None => {
                let text = String::from_utf8_lossy(&p.data).into_owned();
                serde_json::from_str(&text).unwrap_or(Value::String(text))
            }
        };
        m.insert(p.name.clone(), v);
    }
    Value::Object(m)
}

fn is_photo(bytes: &[u8]) -> bool {
    bytes.starts_with(&[0xFF, 0xD8, 0xFF])
        || bytes.starts_with(b"\x89PNG\r\n\x1a\n")
        || (bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP")
}

/// A `send*` upload: validated like Telegram, recorded, answered with the `Message`.
fn receive_upload(
    sh: &Arc<Shared>,
    method: &str,
    params: &Value,
    parts: &[clawft_channel_core::media::Part],
    body_len: usize,
) -> Response {
    let Some(field) = upload_field(method) else {
        return api_error(404, "Not Found: method not found");
    };
    let limit = sh.lock().upload_limit.unwrap_or(UPLOAD_LIMIT);
    if u64::try_from(body_len).unwrap_or(u64::MAX) > limit {
        return api_error(413, "Request Entity Too Large");
    }
    let Some(chat_param) = params.get("chat_id") else {
        return api_error(400, "Bad Request: chat_id is empty");
    };
    let Some(chat) = as_i64(chat_param) else {
        return api_error(400, "Bad Request: chat not found");
    };
    let caption = params
        .get("caption")
        .and_then(Value::as_str)
        .map(str::to_string);
    if caption
        .as_ref()
        .is_some_and(|c| c.encode_utf16().count() > 1024)
    {
        return api_error(400, "Bad Request: message caption is too long");
    }
    let thread = params.get("message_thread_id").and_then(as_i64);
    let reply_to = params
        .get("reply_parameters")
        .and_then(|r| r.get("message_id"))
        .or_else(|| params.get("reply_to_message_id"))
        .and_then(as_i64);
    let mut st = sh.lock();
    // The file: a part with a file name, else a text value naming a file the bot knows.
    let (file_name, content_type, bytes) = match parts.iter().find(|p| p.name == field) {
        Some(p) if p.file_name.is_some() => {
            (p.file_name.clone(), p.content_type.clone(), p.data.clone())
        }
        _ => match params.get(field) {
            None => {
                return api_error(
                    400,
                    &format!("Bad Request: there is no {field} in the request"),
                )
            }
            Some(v) => match v.as_str().and_then(|id| st.files.get(id)) {
                Some(f) => (None, None, f.bytes.clone()),
                None => {
                    return api_error(400, "Bad Request: wrong file identifier/HTTP URL specified")
                }
            },
        },
    };
    if bytes.is_empty() {
        return api_error(400, "Bad Request: file must be non-empty");
    }
    if method == "sendPhoto" {
        if !is_photo(&bytes) {
            return api_error(400, "Bad Request: IMAGE_PROCESS_FAILED");
        }
        if bytes.len() > PHOTO_LIMIT {
            return api_error(400, "Bad Request: PHOTO_SAVE_FILE_INVALID");
        }
    }
    let dir = match field {
        "photo" => "photos",
        "voice" => "voice",
        "audio" => "music",
        "video" => "videos",
        "video_note" => "video_notes",
        _ => "documents",
    };
    let size = bytes.len();
    let (file_id, unique) = store_file(
        &mut st,
        dir,
        &extension(file_name.as_deref()),
        bytes.clone(),
    );
    let message_id = st.next_message;
    st.next_message += 1;
    let shown = caption.clone().unwrap_or_default();
    st.messages
        .insert((chat, message_id), (shown.clone(), None, true));
    st.sent.push(SentMessage {
        method: method.to_string(),
        chat,
        thread,
        message_id,
        text: shown.clone(),
        visible: shown,
        parse_mode: None,
        reply_to,
        at: std::time::Instant::now(),
    });
    st.uploads.push(Upload {
        method: method.to_string(),
        chat,
        thread,
        message_id,
        field: field.to_string(),
        file_name: file_name.clone(),
        content_type: content_type.clone(),
        bytes,
        caption: caption.clone(),
        reply_to,
        file_id: file_id.clone(),
    });
    drop(st);
    sh.changed.notify_waiters();
    let mut file = json!({"file_id": file_id, "file_unique_id": unique, "file_size": size});
    let value = match field {
        "photo" => {
            file["width"] = json!(800);
            file["height"] = json!(600);
            json!([file])
        }
        "video_note" => {
            file["length"] = json!(240);
            file["duration"] = json!(1);
            file
        }
        _ => {
            if let Some(n) = &file_name {
                file["file_name"] = json!(n);
            }
            if let Some(t) = &content_type {
                file["mime_type"] = json!(t);
            }
            if matches!(field, "voice" | "audio" | "video") {
                file["duration"] = json!(1);
            }
            file
        }
    };
    let mut msg = json!({
        "message_id": message_id, "date": 1_700_000_000,
        "chat": chat_json(chat, thread.is_some()),
        "from": {"id": sh.bot_id, "is_bot": true, "first_name": "Clawft", "username": sh.username},
    });
    msg[field] = value;
    if let Some(c) = caption {
        msg["caption"] = json!(c);
    }
    if let Some(t) = thread {
        msg["message_thread_id"] = json!(t);
        msg["is_topic_message"] = json!(true);
    }
    ok(msg)
}
