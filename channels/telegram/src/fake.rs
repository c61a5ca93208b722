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
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
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
    /// `sendMessage` or `editMessageText`.
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
    kicks: u64,
    stall: bool,
    /// `getUpdates` answers at once, ignoring `timeout` (a misbehaving Bot API server).
    ignore_timeout: bool,
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
        self.st.lock().unwrap_or_else(PoisonError::into_inner)
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
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
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
        if let Some(t) = m.topic {
            msg["message_thread_id"] = json!(t);
            msg["is_topic_message"] = json!(true);
        }
        if let Some(r) = m.reply_to {
            let by_bot = st.messages.get(&(m.chat, r)).is_some_and(|(_, _, b)| *b);
            let from = if by_bot {
                json!({"id": self.shared.bot_id, "is_bot": true, "first_name": "Clawft", "username": self.shared.username})
            } else {
                json!({"id": m.user, "is_bot": false, "first_name": "User"})
            };
            msg["reply_to_message"] = json!({
                "message_id": r, "date": 1_700_000_000,
                "chat": chat_json(m.chat, m.topic.is_some()), "from": from, "text": "..."
            });
        }
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

    /// Updates not yet confirmed by an `offset`.
    pub fn pending_updates(&self) -> Vec<i64> {
        self.shared
            .lock()
            .updates
            .iter()
            .filter_map(|u| u.get("update_id").and_then(Value::as_i64))
            .collect()
    }

    /// Messages the bot posted or edited, in order.
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
    body: Bytes,
) -> Response {
    let params = params_of(query, &body);
    let known = bot.strip_prefix("bot").and_then(|t| {
        bots.by_token
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(t)
            .cloned()
    });
    let authorized = known.is_some();
    let sh = known.unwrap_or_else(|| bots.first.clone());
    let failure = {
        let mut st = sh.lock();
        st.requests.push(Recorded {
            method: method.clone(),
            authorized,
            params: params.clone(),
        });
        let html = params.get("parse_mode").is_some();
        let queue = st.failures.entry(method.clone()).or_default();
        match queue.front_mut() {
            Some((_, Failure::CantParseEntities)) if !html => None,
            Some((skip, _)) if *skip > 0 => {
                *skip -= 1;
                None
            }
            Some(_) => queue.pop_front().map(|(_, f)| f),
            None => None,
        }
    };
    sh.changed.notify_waiters();
    if !authorized {
        return api_error(401, "Unauthorized");
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
        "getFile" => match params.get("file_id").and_then(Value::as_str) {
            Some(id) => ok(json!({
                "file_id": id, "file_unique_id": format!("u{id}"), "file_size": 0,
                "file_path": format!("documents/{id}")
            })),
            None => api_error(400, "Bad Request: file_id is empty"),
        },
        "deleteWebhook" | "setMyCommands" => ok(json!(true)),
        _ => api_error(404, "Not Found: method not found"),
    }
}

fn as_i64(v: &Value) -> Option<i64> {
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

async fn get_updates(sh: &Arc<Shared>, params: &Value) -> Response {
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
