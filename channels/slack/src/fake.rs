//! A fake Slack on 127.0.0.1 speaking the real wire protocol: the Web API (`auth.test`,
//! `apps.connections.open`, `chat.postMessage`, `chat.update`, JSON bodies, bearer tokens) and
//! the Socket Mode WebSocket (`hello`, `events_api` envelopes, acks, retries of unacknowledged
//! envelopes with `retry_attempt` 1..3, `disconnect`).
//!
//! ```ignore
//! let fake = FakeSlack::start().await;
//! let ch = SlackChannel::new(SlackConfig { api_url: fake.api_url(), ..fake.config() })?;
//! let ev = fake.push_user_message("D1", "U1", "hello");   // a DM
//! // ... the daemon receives a delivery with event_id == ev, then:
//! fake.wait_acks(1, Duration::from_secs(2)).await;
//! let posted = fake.wait_posted(1, Duration::from_secs(2)).await;
//! ```
//!
//! Files: [`push_files`](FakeSlack::push_files) posts a user's message with files hosted by the
//! fake (`url_private(_download)` on its own origin, served only with the bot token as a bearer
//! header; without it, like Slack, an HTML login page with status 200);
//! [`push_crafted_file`](FakeSlack::push_crafted_file) names any URL. The bot uploads with
//! `files.getUploadURLExternal` (form fields only, like Slack), a POST of the bytes to the upload
//! URL and `files.completeUploadExternal`; each completed file is in
//! [`uploads`](FakeSlack::uploads) and shows in the chat as one [`Posted`] with method
//! `files.completeUploadExternal` and the file's title as text.
//!
//! Channel ids starting with `D` are DMs (`channel_type` `im`), `C` public channels, `G`
//! private channels. The bot is user [`BOT_USER_ID`] (`<@UBOT>` mentions it), bot [`BOT_ID`].

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::handshake::server::{
    ErrorResponse, Request as WsRequest, Response as WsResponse,
};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use crate::SlackConfig;

use clawft_channel_core::lock::MutexExt;

/// The bot token the fake accepts.
pub const BOT_TOKEN: &str = "xoxb-fake-bot-token";
/// The app-level token the fake accepts.
pub const APP_TOKEN: &str = "xapp-fake-app-token";
/// The bot's user id (`<@UBOT>`).
pub const BOT_USER_ID: &str = "UBOT";
/// The bot's bot id (on its own messages).
pub const BOT_ID: &str = "BBOT";
/// How many times Slack retries an unacknowledged event.
const MAX_RETRIES: u64 = 3;

/// A message the bot posted or edited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Posted {
    /// `chat.postMessage` or `chat.update`.
    pub method: String,
    /// Channel id.
    pub chat: String,
    /// `thread_ts`, if posted in a thread.
    pub thread: Option<String>,
    /// The message's `ts` (for an update: the edited message).
    pub ts: String,
    /// The text as sent (mrkdwn).
    pub text: String,
}

/// A scripted Web API failure.
#[derive(Clone, Debug)]
pub enum Failure {
    /// HTTP 429 with `Retry-After: secs`.
    RateLimited {
        /// The header value.
        retry_after_secs: u64,
    },
    /// HTTP 500.
    ServerError,
    /// HTTP 200 `{"ok": false, "error": "invalid_auth"}`.
    InvalidAuth,
    /// HTTP 200 `{"ok": false, "error": <this>}` (e.g. `channel_not_found`).
    SlackError(String),
    /// HTTP 200 with a body that is not JSON.
    Garbage,
}

/// A file a user attaches to a message pushed with [`FakeSlack::push_files`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewFile {
    /// File name (`name`).
    pub name: String,
    /// Media type (`mimetype`).
    pub mime: String,
    /// The bytes the fake serves.
    pub bytes: Vec<u8>,
    /// A Slack audio clip recorded in the app (`subtype: slack_audio`).
    pub voice: bool,
}

impl NewFile {
    /// A file (photo, document...).
    pub fn new(name: &str, mime: &str, bytes: impl Into<Vec<u8>>) -> Self {
        Self {
            name: name.into(),
            mime: mime.into(),
            bytes: bytes.into(),
            voice: false,
        }
    }

    /// An audio clip recorded in Slack (`subtype: slack_audio`).
    pub fn voice(name: &str, mime: &str, bytes: impl Into<Vec<u8>>) -> Self {
        Self {
            voice: true,
            ..Self::new(name, mime, bytes)
        }
    }
}

/// A file the bot uploaded and shared (`files.completeUploadExternal` succeeded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upload {
    /// Always `files.completeUploadExternal` (the call that shared it).
    pub method: String,
    /// The channel it was shared in (`channel_id`; empty: not shared, the file stays private).
    pub chat: String,
    /// `thread_ts`, if shared in a thread.
    pub thread: Option<String>,
    /// The file id `files.getUploadURLExternal` gave.
    pub file_id: String,
    /// `filename` given to `files.getUploadURLExternal`.
    pub name: String,
    /// `title` given to `files.completeUploadExternal`, if any.
    pub title: Option<String>,
    /// The `Content-Type` of the uploaded part (or of the request, for raw bytes).
    pub content_type: Option<String>,
    /// The bytes received at the upload URL.
    pub bytes: Vec<u8>,
    /// The `ts` of the file's message in the chat.
    pub ts: String,
}

/// A GET of a hosted file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Download {
    /// The file id.
    pub file_id: String,
    /// Whether it carried the bot token (and so got the bytes, not the login page).
    pub authorized: bool,
}

/// An envelope the fake sent over the WebSocket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// Its `envelope_id` (new for each attempt).
    pub envelope_id: String,
    /// The Events API `event_id` (same for every attempt).
    pub event_id: String,
    /// 0 for the first delivery, then 1..3.
    pub retry_attempt: u64,
}

/// One Web API request (without its token).
#[derive(Clone, Debug)]
pub struct Call {
    /// The method, e.g. `chat.postMessage`.
    pub method: String,
    /// The JSON body.
    pub body: Value,
    /// When the fake received it.
    pub at: Instant,
}

enum Cmd {
    Send(String),
    Close,
    Freeze,
}

struct Pending {
    event_id: String,
    envelope_type: &'static str,
    payload: Value,
    attempt: u64,
    envelope_ids: Vec<String>,
    last_sent: Option<Instant>,
    acked: bool,
}

struct St {
    posted: Vec<Posted>,
    calls: Vec<Call>,
    fail: VecDeque<(Option<String>, usize, Failure)>,
    bot_valid: bool,
    app_valid: bool,
    seq: u64,
    pending: Vec<Pending>,
    envelopes: Vec<Envelope>,
    acks: Vec<String>,
    connections: usize,
    tickets: HashSet<String>,
    conn: Option<(u64, mpsc::UnboundedSender<Cmd>)>,
    retry_delay: Duration,
    /// Files users attached, by id.
    hosted: HashMap<String, NewFile>,
    downloads: Vec<Download>,
    /// Uploads started with `files.getUploadURLExternal`, by file id.
    slots: HashMap<String, Slot>,
    uploads: Vec<Upload>,
    upload_fail: VecDeque<(usize, Failure)>,
    hold_uploads: bool,
    held: usize,
    upload_base: Option<String>,
}

/// An upload started with `files.getUploadURLExternal`.
struct Slot {
    ticket: String,
    name: String,
    length: u64,
    /// The bytes and content type received at the upload URL.
    data: Option<(Vec<u8>, Option<String>)>,
    completed: bool,
}

struct Shared {
    st: Mutex<St>,
    changed: Notify,
    ws_addr: std::net::SocketAddr,
    api_addr: std::net::SocketAddr,
    stop: CancellationToken,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, St> {
        self.st.locked()
    }
    fn bump(&self) {
        self.changed.notify_waiters();
    }
}

/// The fake Slack. Stops when dropped.
pub struct FakeSlack {
    shared: Arc<Shared>,
    api_addr: std::net::SocketAddr,
    stop: CancellationToken,
}

impl Drop for FakeSlack {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl FakeSlack {
    /// Start the Web API and the Socket Mode server on 127.0.0.1 (ephemeral ports).
    ///
    /// # Panics
    /// If 127.0.0.1 cannot be bound (test helper).
    #[allow(clippy::expect_used)]
    pub async fn start() -> FakeSlack {
        let api = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake api");
        let ws = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake ws");
        let api_addr = api.local_addr().expect("addr");
        let ws_addr = ws.local_addr().expect("addr");
        let shared = Arc::new(Shared {
            st: Mutex::new(St {
                posted: Vec::new(),
                calls: Vec::new(),
                fail: VecDeque::new(),
                bot_valid: true,
                app_valid: true,
                seq: 0,
                pending: Vec::new(),
                envelopes: Vec::new(),
                acks: Vec::new(),
                connections: 0,
                tickets: HashSet::new(),
                conn: None,
                retry_delay: Duration::from_millis(300),
                hosted: HashMap::new(),
                downloads: Vec::new(),
                slots: HashMap::new(),
                uploads: Vec::new(),
                upload_fail: VecDeque::new(),
                hold_uploads: false,
                held: 0,
                upload_base: None,
            }),
            changed: Notify::new(),
            ws_addr,
            api_addr,
            stop: CancellationToken::new(),
        });
        let stop = shared.stop.clone();
        let app = Router::new()
            .route("/api/{method}", post(web_api))
            .route("/files-pri/{team_file}/{*rest}", get(download))
            .route("/upload/v1/{ticket}", post(upload))
            .with_state(shared.clone());
        let s = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(api, app)
                .with_graceful_shutdown(s.cancelled_owned())
                .await;
        });
        tokio::spawn(accept_loop(ws, shared.clone(), stop.clone()));
        tokio::spawn(dispatcher(shared.clone(), stop.clone()));
        FakeSlack {
            shared,
            api_addr,
            stop,
        }
    }

    /// The Web API base to configure as `api_url` (`http://127.0.0.1:P/api/`).
    pub fn api_url(&self) -> String {
        format!("http://{}/api/", self.api_addr)
    }

    /// A [`SlackConfig`] pointing at this fake with its tokens and short test timings
    /// (backoff 50 ms, ping 200 ms, watchdog 1 s, edit interval 1.5 s).
    pub fn config(&self) -> SlackConfig {
        SlackConfig {
            token: BOT_TOKEN.into(),
            app_token: APP_TOKEN.into(),
            api_url: self.api_url(),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_millis(400),
            ping_interval: Duration::from_millis(200),
            watchdog_timeout: Duration::from_secs(1),
            ..SlackConfig::default()
        }
    }

    fn next(&self, prefix: &str) -> String {
        let mut st = self.shared.lock();
        st.seq += 1;
        format!("{prefix}{:06}", st.seq)
    }

    fn ts(&self) -> String {
        let mut st = self.shared.lock();
        st.seq += 1;
        format!("1700000000.{:06}", st.seq)
    }

    fn enqueue(&self, event_id: &str, envelope_type: &'static str, payload: Value) {
        self.shared.lock().pending.push(Pending {
            event_id: event_id.to_string(),
            envelope_type,
            payload,
            attempt: 0,
            envelope_ids: Vec::new(),
            last_sent: None,
            acked: false,
        });
        self.shared.bump();
    }

    /// Push a raw Events API `event` (wrapped in an `event_callback`); returns its `event_id`.
    pub fn push_event(&self, event: Value) -> String {
        let event_id = self.next("Ev");
        let payload = json!({
            "token": "verification-token",
            "team_id": "T1",
            "api_app_id": "A1",
            "type": "event_callback",
            "event_id": event_id,
            "event_time": 1_700_000_000,
            "event": event,
        });
        self.enqueue(&event_id, "events_api", payload);
        event_id
    }

    /// A user's message as Slack sends it. In a channel (`C...`/`G...`) a text mentioning
    /// `<@UBOT>` produces two events like Slack does, a `message` and an `app_mention`; the
    /// returned id is then the `app_mention`'s (the one delivered in `GroupMode::Mention`).
    pub fn push_user_message(&self, chat: &str, user: &str, text: &str) -> String {
        self.push_message(chat, None, user, text).1
    }

    /// Like [`push_user_message`](Self::push_user_message), inside the thread `thread_ts`
    /// started by `parent_user`; returns `(message event id, delivered event id)`.
    pub fn push_message(
        &self,
        chat: &str,
        thread: Option<(&str, &str)>,
        user: &str,
        text: &str,
    ) -> (String, String) {
        self.push_message_with(chat, thread, user, text, Vec::new())
    }

    /// A user's message with files, as Slack sends it (`subtype: file_share`, a `files`
    /// array; the `app_mention` twin of a mention in a channel carries them too). The fake
    /// hosts each file at its `url_private` and `url_private_download` on its own origin.
    /// Returns the delivered event id, like [`push_user_message`](Self::push_user_message).
    pub fn push_files(&self, chat: &str, user: &str, text: &str, files: Vec<NewFile>) -> String {
        self.push_files_in(chat, None, user, text, files).1
    }

    /// [`push_files`](Self::push_files) inside the thread `thread_ts` started by
    /// `parent_user`; returns `(message event id, delivered event id)`.
    pub fn push_files_in(
        &self,
        chat: &str,
        thread: Option<(&str, &str)>,
        user: &str,
        text: &str,
        files: Vec<NewFile>,
    ) -> (String, String) {
        let objects = files
            .into_iter()
            .map(|f| {
                let id = self.next("F");
                let base = format!("http://{}/files-pri/T1-{id}", self.api_addr);
                let name = f.name.clone();
                let mut o = json!({
                    "id": id,
                    "created": 1_700_000_000,
                    "timestamp": 1_700_000_000,
                    "name": name,
                    "title": name,
                    "mimetype": f.mime,
                    "filetype": name.rsplit_once('.').map_or("binary", |(_, e)| e),
                    "user": user,
                    "size": f.bytes.len(),
                    "mode": "hosted",
                    "is_external": false,
                    "is_public": false,
                    "url_private": format!("{base}/{name}"),
                    "url_private_download": format!("{base}/download/{name}"),
                    "permalink": format!("https://fake.slack.com/files/{user}/{id}/{name}"),
                });
                if f.voice {
                    o["subtype"] = json!("slack_audio");
                    o["duration_ms"] = json!(1000);
                }
                self.shared.lock().hosted.insert(id, f);
                o
            })
            .collect();
        self.push_message_with(chat, thread, user, text, objects)
    }

    /// A user's message whose one file names `url` (any string) as its `url_private` and
    /// `url_private_download`: for the daemon's tests of where it downloads from. The fake
    /// does not host it. Returns the delivered event id.
    pub fn push_crafted_file(&self, chat: &str, user: &str, text: &str, url: &str) -> String {
        let id = self.next("F");
        let file = json!({
            "id": id,
            "name": "crafted.bin",
            "title": "crafted.bin",
            "mimetype": "application/octet-stream",
            "filetype": "binary",
            "size": 16,
            "mode": "hosted",
            "url_private": url,
            "url_private_download": url,
        });
        self.push_message_with(chat, None, user, text, vec![file]).1
    }

    fn push_message_with(
        &self,
        chat: &str,
        thread: Option<(&str, &str)>,
        user: &str,
        text: &str,
        files: Vec<Value>,
    ) -> (String, String) {
        let ts = self.ts();
        let channel_type = match chat.chars().next() {
            Some('D') => "im",
            Some('G') => "group",
            _ => "channel",
        };
        let mut ev = json!({
            "type": "message",
            "channel": chat,
            "channel_type": channel_type,
            "user": user,
            "text": text,
            "ts": ts,
            "event_ts": ts,
            "team": "T1",
        });
        if !files.is_empty() {
            ev["subtype"] = json!("file_share");
            ev["upload"] = json!(false);
            ev["display_as_bot"] = json!(false);
            ev["files"] = Value::Array(files);
        }
        if let Some((thread_ts, parent)) = thread {
            ev["thread_ts"] = json!(thread_ts);
            ev["parent_user_id"] = json!(parent);
        }
        let msg_id = self.push_event(ev.clone());
        if channel_type != "im" && text.contains(&format!("<@{BOT_USER_ID}")) {
            let mut m = ev;
            m["type"] = json!("app_mention");
            if let Some(o) = m.as_object_mut() {
                o.remove("channel_type");
                o.remove("subtype");
            }
            let mention_id = self.push_event(m);
            return (msg_id, mention_id);
        }
        (msg_id.clone(), msg_id)
    }

    /// A slash command (`/stop`...) as Socket Mode delivers it; returns the event id the
    /// adapter gives it (`slash-<trigger_id>`).
    pub fn push_slash_command(&self, chat: &str, user: &str, command: &str, text: &str) -> String {
        let trigger = self.next("trig");
        let payload = json!({
            "command": command,
            "text": text,
            "user_id": user,
            "channel_id": chat,
            "trigger_id": trigger,
            "team_id": "T1",
        });
        let id = format!("slash-{trigger}");
        self.enqueue(&id, "slash_commands", payload);
        id
    }

    /// Every message the bot posted or edited, in order.
    pub fn sent(&self) -> Vec<Posted> {
        self.shared.lock().posted.clone()
    }

    /// Every Web API request, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.shared.lock().calls.clone()
    }

    /// Envelope ids the bot acknowledged, in order.
    pub fn acks(&self) -> Vec<String> {
        self.shared.lock().acks.clone()
    }

    /// Envelopes sent to the bot, in order (retries included).
    pub fn envelopes(&self) -> Vec<Envelope> {
        self.shared.lock().envelopes.clone()
    }

    /// Whether the event was acknowledged (under any of its envelopes).
    pub fn is_acked(&self, event_id: &str) -> bool {
        self.shared
            .lock()
            .pending
            .iter()
            .any(|p| p.event_id == event_id && p.acked)
    }

    /// WebSocket connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.lock().connections
    }

    /// Fail the next `chat.postMessage` / `chat.update` call.
    pub fn fail_next(&self, f: Failure) {
        self.fail_after(0, f);
    }

    /// Let `ok` more `chat.postMessage` / `chat.update` calls succeed, then fail one.
    pub fn fail_after(&self, ok: usize, f: Failure) {
        self.shared.lock().fail.push_back((None, ok, f));
    }

    /// Fail the next call of `method` (e.g. `auth.test`, `apps.connections.open`).
    pub fn fail_method(&self, method: &str, f: Failure) {
        self.shared
            .lock()
            .fail
            .push_back((Some(method.to_string()), 0, f));
    }

    /// Every file the bot uploaded and shared, in order (one per completed file).
    pub fn uploads(&self) -> Vec<Upload> {
        self.shared.lock().uploads.clone()
    }

    /// Wait until `n` files were uploaded and shared (or `timeout`); returns them all.
    pub async fn wait_uploads(&self, n: usize, timeout: Duration) -> Vec<Upload> {
        self.wait(timeout, |s| {
            (s.uploads.len() >= n).then(|| s.uploads.clone())
        })
        .await
        .unwrap_or_else(|| self.uploads())
    }

    /// Every GET of a hosted file, in order.
    pub fn downloads(&self) -> Vec<Download> {
        self.shared.lock().downloads.clone()
    }

    /// Fail the next POST of bytes to an upload URL (`RateLimited` → 429 with `Retry-After`,
    /// `ServerError` → 500, the others as for the Web API).
    pub fn fail_upload(&self, f: Failure) {
        self.fail_upload_after(0, f);
    }

    /// Let `ok` more POSTs of bytes to upload URLs succeed, then fail one.
    pub fn fail_upload_after(&self, ok: usize, f: Failure) {
        self.shared.lock().upload_fail.push_back((ok, f));
    }

    /// While on, a POST of bytes to an upload URL is read but never answered and not
    /// recorded (as if the bot died mid-upload). Switched off, the held requests are answered
    /// 500 and still not recorded.
    pub fn hold_uploads(&self, hold: bool) {
        self.shared.lock().hold_uploads = hold;
        self.shared.bump();
    }

    /// Make `files.getUploadURLExternal` name upload URLs under `base` (e.g.
    /// `https://evil.example`) instead of the fake's own origin; `None` restores it.
    pub fn set_upload_url_base(&self, base: Option<&str>) {
        self.shared.lock().upload_base = base.map(str::to_string);
    }

    /// Upload requests being held now ([`hold_uploads`](Self::hold_uploads)).
    pub fn held_uploads(&self) -> usize {
        self.shared.lock().held
    }

    /// Wait until `n` upload requests are being held (or `timeout`); returns how many are.
    pub async fn wait_held_uploads(&self, n: usize, timeout: Duration) -> usize {
        self.wait(timeout, |s| (s.held >= n).then_some(s.held))
            .await
            .unwrap_or_else(|| self.held_uploads())
    }

    /// Make the bot token invalid (`invalid_auth`) or valid again.
    pub fn set_bot_token_valid(&self, valid: bool) {
        self.shared.lock().bot_valid = valid;
    }

    /// Make the app-level token invalid (`invalid_auth`) or valid again.
    pub fn set_app_token_valid(&self, valid: bool) {
        self.shared.lock().app_valid = valid;
    }

    /// Delay before an unacknowledged envelope is sent again (default 300 ms; Slack: ~3 s).
    pub fn set_retry_delay(&self, d: Duration) {
        self.shared.lock().retry_delay = d;
    }

    fn command(&self, cmd: Cmd) -> bool {
        let st = self.shared.lock();
        st.conn.as_ref().is_some_and(|(_, tx)| tx.send(cmd).is_ok())
    }

    /// Send Slack's `disconnect` frame (reason `refresh_requested`) on the current connection.
    pub fn disconnect(&self) -> bool {
        self.disconnect_with("refresh_requested")
    }

    /// Send a `disconnect` frame with this reason (`link_disabled` is fatal for the client).
    pub fn disconnect_with(&self, reason: &str) -> bool {
        let frame = json!({"type": "disconnect", "reason": reason, "debug_info": {"host": "fake"}});
        self.command(Cmd::Send(frame.to_string()))
    }

    /// Drop the current connection without a close frame.
    pub fn close_socket(&self) -> bool {
        self.command(Cmd::Close)
    }

    /// Stop reading and writing on the current connection, keeping TCP open (a dead link).
    pub fn freeze(&self) -> bool {
        self.command(Cmd::Freeze)
    }

    async fn wait<T>(&self, timeout: Duration, f: impl Fn(&St) -> Option<T>) -> Option<T> {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.shared.changed.notified();
            if let Some(v) = f(&self.shared.lock()) {
                return Some(v);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return f(&self.shared.lock());
            }
        }
    }

    /// Wait until `n` messages were posted or edited (or `timeout`); returns them all.
    pub async fn wait_posted(&self, n: usize, timeout: Duration) -> Vec<Posted> {
        self.wait(timeout, |s| (s.posted.len() >= n).then(|| s.posted.clone()))
            .await
            .unwrap_or_else(|| self.sent())
    }

    /// Wait until `n` acks arrived (or `timeout`); returns them all.
    pub async fn wait_acks(&self, n: usize, timeout: Duration) -> Vec<String> {
        self.wait(timeout, |s| (s.acks.len() >= n).then(|| s.acks.clone()))
            .await
            .unwrap_or_else(|| self.acks())
    }

    /// Wait until `n` envelopes were sent (or `timeout`); returns them all.
    pub async fn wait_envelopes(&self, n: usize, timeout: Duration) -> Vec<Envelope> {
        self.wait(timeout, |s| {
            (s.envelopes.len() >= n).then(|| s.envelopes.clone())
        })
        .await
        .unwrap_or_else(|| self.envelopes())
    }

    /// Wait until `n` WebSocket connections were accepted and one is open.
    pub async fn wait_connections(&self, n: usize, timeout: Duration) -> usize {
        self.wait(timeout, |s| {
            (s.connections >= n && s.conn.is_some()).then_some(s.connections)
        })
        .await
        .unwrap_or_else(|| self.connections())
    }
}

fn slack_error(error: &str) -> Response {
    Json(json!({"ok": false, "error": error})).into_response()
}

fn failure(f: Failure) -> Response {
    match f {
        Failure::RateLimited { retry_after_secs } => (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", retry_after_secs.to_string())],
            Json(json!({"ok": false, "error": "ratelimited"})),
        )
            .into_response(),
        Failure::ServerError => {
            (StatusCode::INTERNAL_SERVER_ERROR, "upstream error").into_response()
        }
        Failure::InvalidAuth => slack_error("invalid_auth"),
        Failure::SlackError(e) => slack_error(&e),
        Failure::Garbage => (StatusCode::OK, "<html>definitely not json").into_response(),
    }
}

async fn web_api(
    State(sh): State<Arc<Shared>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("")
        .to_string();
    let form = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    let body: Value = if body.is_empty() {
        json!({})
    } else if form {
        match parse_form(&body) {
            Some(v) => v,
            None => return slack_error("invalid_form_data"),
        }
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(_) => return slack_error("invalid_json"),
        }
    };
    let mut st = sh.lock();
    st.calls.push(Call {
        method: method.clone(),
        body: body.clone(),
        at: Instant::now(),
    });
    let chat_method = method.starts_with("chat.");
    if let Some(pos) = st.fail.iter().position(|(m, _, _)| match m {
        Some(m) => *m == method,
        None => chat_method,
    }) {
        if st.fail[pos].1 > 0 {
            st.fail[pos].1 -= 1;
        } else if let Some((_, _, f)) = st.fail.remove(pos) {
            return failure(f);
        }
    }
    let s = |k: &str| body.get(k).and_then(Value::as_str).map(str::to_string);
    match method.as_str() {
        "apps.connections.open" => {
            if token == BOT_TOKEN {
                return slack_error("not_allowed_token_type");
            }
            if token != APP_TOKEN || !st.app_valid {
                return slack_error("invalid_auth");
            }
            st.seq += 1;
            let ticket = format!("ticket{}", st.seq);
            st.tickets.insert(ticket.clone());
            let url = format!("ws://{}/link/?ticket={ticket}&app_id=A1", sh.ws_addr);
            Json(json!({"ok": true, "url": url})).into_response()
        }
        _ if token != BOT_TOKEN || !st.bot_valid => slack_error("invalid_auth"),
        "auth.test" => Json(json!({
            "ok": true, "url": "https://fake.slack.com/", "team": "Fake Team", "user": "clawbot",
            "team_id": "T1", "user_id": BOT_USER_ID, "bot_id": BOT_ID, "is_enterprise_install": false,
        }))
        .into_response(),
        "chat.postMessage" | "chat.update" => {
            let (Some(chat), Some(text)) = (s("channel"), s("text")) else {
                return slack_error(if s("channel").is_none() { "channel_not_found" } else { "no_text" });
            };
            if text.trim().is_empty() {
                return slack_error("no_text");
            }
            if text.chars().count() > 40_000 {
                return slack_error("msg_too_long");
            }
            let (ts, thread) = if method == "chat.update" {
                let Some(ts) = s("ts") else {
                    return slack_error("message_not_found");
                };
                let Some(orig) = st
                    .posted
                    .iter()
                    .find(|p| p.method == "chat.postMessage" && p.ts == ts && p.chat == chat)
                else {
                    return slack_error("message_not_found");
                };
                (ts, orig.thread.clone())
            } else {
                st.seq += 1;
                (format!("1700000001.{:06}", st.seq), s("thread_ts"))
            };
            st.posted.push(Posted {
                method: method.clone(),
                chat: chat.clone(),
                thread,
                ts: ts.clone(),
                text: text.clone(),
            });
            drop(st);
            sh.bump();
            Json(json!({"ok": true, "channel": chat, "ts": ts, "message": {"text": text, "user": BOT_USER_ID, "bot_id": BOT_ID}}))
                .into_response()
        }
        "files.info" => {
            let Some(f) = s("file").and_then(|id| st.hosted.get(&id).map(|f| (id, f.clone())))
            else {
                return slack_error("file_not_found");
            };
            let (id, f) = f;
            let base = format!("http://{}/files-pri/T1-{id}", sh.api_addr);
            Json(json!({"ok": true, "file": {
                "id": id, "name": f.name, "title": f.name, "mimetype": f.mime, "size": f.bytes.len(),
                "url_private": format!("{base}/{}", f.name),
                "url_private_download": format!("{base}/download/{}", f.name),
            }}))
            .into_response()
        }
        "files.getUploadURLExternal" => {
            // Slack reads this method's arguments from form fields or the query only: a JSON
            // body gets `invalid_arguments` ("missing required field").
            if !form {
                return slack_error("invalid_arguments");
            }
            let Some(name) = s("filename").filter(|n| !n.trim().is_empty()) else {
                return slack_error("invalid_arguments");
            };
            let Some(length) = s("length").and_then(|l| l.trim().parse::<u64>().ok()) else {
                return slack_error("invalid_arguments");
            };
            if length == 0 {
                return slack_error("missing_argument");
            }
            st.seq += 1;
            let file_id = format!("FU{:06}", st.seq);
            let ticket = format!("up{:06}x", st.seq);
            st.slots.insert(
                file_id.clone(),
                Slot {
                    ticket: ticket.clone(),
                    name,
                    length,
                    data: None,
                    completed: false,
                },
            );
            let base = st
                .upload_base
                .clone()
                .unwrap_or_else(|| format!("http://{}", sh.api_addr));
            let url = format!("{base}/upload/v1/{ticket}");
            Json(json!({"ok": true, "upload_url": url, "file_id": file_id})).into_response()
        }
        "files.completeUploadExternal" => {
            // `files` is a JSON array (a JSON string of one in a form body).
            let files = match body.get("files") {
                Some(Value::Array(a)) => a.clone(),
                Some(Value::String(t)) => match serde_json::from_str::<Value>(t) {
                    Ok(Value::Array(a)) => a,
                    _ => return slack_error("invalid_arguments"),
                },
                _ => return slack_error("invalid_arguments"),
            };
            let mut done = Vec::new();
            for f in &files {
                let Some(id) = f.get("id").and_then(Value::as_str) else {
                    return slack_error("invalid_arguments");
                };
                // Unknown, already completed, or never uploaded.
                let Some(slot) = st.slots.get(id).filter(|sl| !sl.completed) else {
                    return slack_error("file_not_found");
                };
                let Some((bytes, _)) = &slot.data else {
                    return slack_error("file_not_found");
                };
                if bytes.len() as u64 != slot.length {
                    // Slack does not document this case; the fake refuses the file.
                    return slack_error("file_upload_size_mismatch");
                }
                let title = f.get("title").and_then(Value::as_str).map(str::to_string);
                done.push((id.to_string(), title));
            }
            if done.is_empty() {
                return slack_error("invalid_arguments");
            }
            let chat = s("channel_id").unwrap_or_default();
            let thread = s("thread_ts");
            let mut answer = Vec::new();
            for (id, title) in done {
                st.seq += 1;
                let ts = format!("1700000001.{:06}", st.seq);
                let Some(slot) = st.slots.get_mut(&id) else {
                    continue;
                };
                slot.completed = true;
                let (bytes, content_type) = slot.data.clone().unwrap_or_default();
                let name = slot.name.clone();
                answer.push(json!({"id": id, "title": title.clone().unwrap_or_else(|| name.clone())}));
                if !chat.is_empty() {
                    st.posted.push(Posted {
                        method: method.clone(),
                        chat: chat.clone(),
                        thread: thread.clone(),
                        ts: ts.clone(),
                        text: title.clone().unwrap_or_else(|| name.clone()),
                    });
                }
                st.uploads.push(Upload {
                    method: method.clone(),
                    chat: chat.clone(),
                    thread: thread.clone(),
                    file_id: id,
                    name,
                    title,
                    content_type,
                    bytes,
                    ts,
                });
            }
            drop(st);
            sh.bump();
            Json(json!({"ok": true, "files": answer})).into_response()
        }
        _ => slack_error("unknown_method"),
    }
}

/// A form body as a JSON object of strings (`None` when it is not one).
fn parse_form(body: &[u8]) -> Option<Value> {
    let text = std::str::from_utf8(body).ok()?;
    let url = reqwest::Url::parse(&format!("http://form.invalid/?{text}")).ok()?;
    let map: serde_json::Map<String, Value> = url
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), Value::String(v.into_owned())))
        .collect();
    Some(Value::Object(map))
}

/// GET of a hosted file (`/files-pri/T1-<id>/<name>` or `.../download/<name>`): the bytes with
/// the bot token as a bearer header, else Slack's HTML login page with status 200.
async fn download(
    State(sh): State<Arc<Shared>>,
    Path((team_file, _rest)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let id = team_file
        .split_once('-')
        .map_or(team_file.as_str(), |(_, id)| id)
        .to_string();
    let authorized = {
        let st = sh.lock();
        st.bot_valid
            && headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v == format!("Bearer {BOT_TOKEN}"))
    };
    let file = {
        let mut st = sh.lock();
        st.downloads.push(Download {
            file_id: id.clone(),
            authorized,
        });
        st.hosted.get(&id).cloned()
    };
    sh.bump();
    let Some(file) = file else {
        return (StatusCode::NOT_FOUND, "file not found").into_response();
    };
    if !authorized {
        return (
            StatusCode::OK,
            [("content-type", "text/html; charset=utf-8")],
            "<!DOCTYPE html><html><head><title>Slack</title></head><body>Sign in to your workspace</body></html>",
        )
            .into_response();
    }
    (StatusCode::OK, [("content-type", file.mime)], file.bytes).into_response()
}

/// POST of a file's bytes to the URL `files.getUploadURLExternal` gave: multipart (the file
/// part) or raw bytes. Answers `OK - <bytes>` like Slack.
async fn upload(
    State(sh): State<Arc<Shared>>,
    Path(ticket): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let hold = {
        let mut st = sh.lock();
        if !st.slots.values().any(|sl| sl.ticket == ticket) {
            return (StatusCode::NOT_FOUND, "upload URL not found").into_response();
        }
        if let Some(front) = st.upload_fail.front_mut() {
            if front.0 > 0 {
                front.0 -= 1;
            } else if let Some((_, f)) = st.upload_fail.pop_front() {
                return failure(f);
            }
        }
        if st.hold_uploads {
            st.held += 1;
        }
        st.hold_uploads
    };
    if hold {
        sh.bump();
        loop {
            let notified = sh.changed.notified();
            if !sh.lock().hold_uploads {
                break;
            }
            tokio::select! {
                () = notified => {}
                () = sh.stop.cancelled() => break,
            }
        }
        sh.lock().held -= 1;
        sh.bump();
        return (StatusCode::INTERNAL_SERVER_ERROR, "upload interrupted").into_response();
    }
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let data = match &content_type {
        Some(ct) if ct.starts_with("multipart/form-data") => {
            let Some(parts) = clawft_channel_core::media::parse_multipart(ct, &body) else {
                return (StatusCode::BAD_REQUEST, "malformed multipart body").into_response();
            };
            let mut files = parts.into_iter().filter(|p| p.file_name.is_some());
            match (files.next(), files.next()) {
                (Some(p), None) => (p.data, p.content_type),
                _ => {
                    return (StatusCode::BAD_REQUEST, "expected exactly one file part")
                        .into_response()
                }
            }
        }
        _ => (body.to_vec(), content_type),
    };
    let n = data.0.len();
    let mut st = sh.lock();
    if let Some(slot) = st.slots.values_mut().find(|sl| sl.ticket == ticket) {
        slot.data = Some(data);
    }
    drop(st);
    sh.bump();
    (StatusCode::OK, format!("OK - {n}")).into_response()
}

async fn accept_loop(listener: TcpListener, sh: Arc<Shared>, stop: CancellationToken) {
    let mut conn_no = 0u64;
    loop {
        let stream = tokio::select! {
            () = stop.cancelled() => return,
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(_) => continue,
            }
        };
        conn_no += 1;
        tokio::spawn(connection(stream, conn_no, sh.clone(), stop.clone()));
    }
}

async fn connection(
    stream: tokio::net::TcpStream,
    no: u64,
    sh: Arc<Shared>,
    stop: CancellationToken,
) {
    let check = sh.clone();
    #[allow(clippy::result_large_err)]
    let callback = move |req: &WsRequest, resp: WsResponse| -> Result<WsResponse, ErrorResponse> {
        let ticket = req
            .uri()
            .query()
            .unwrap_or("")
            .split('&')
            .find_map(|kv| kv.strip_prefix("ticket="))
            .unwrap_or("")
            .to_string();
        if check.lock().tickets.remove(&ticket) {
            Ok(resp)
        } else {
            let mut e = ErrorResponse::new(Some("invalid ticket".into()));
            *e.status_mut() = StatusCode::UNAUTHORIZED;
            Err(e)
        }
    };
    let Ok(ws) = tokio_tungstenite::accept_hdr_async(stream, callback).await else {
        return;
    };
    let (mut sink, mut read) = ws.split();
    let (tx, mut rx) = mpsc::unbounded_channel();
    {
        let mut st = sh.lock();
        st.connections += 1;
        st.conn = Some((no, tx));
    }
    let hello = json!({"type": "hello", "num_connections": 1, "debug_info": {"host": "fake"}, "connection_info": {"app_id": "A1"}});
    if sink
        .send(Message::Text(hello.to_string().into()))
        .await
        .is_err()
    {
        return;
    }
    sh.bump();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            cmd = rx.recv() => match cmd {
                Some(Cmd::Send(t)) => {
                    if sink.send(Message::Text(t.into())).await.is_err() {
                        break;
                    }
                }
                Some(Cmd::Close) | None => break,
                Some(Cmd::Freeze) => {
                    // Dead link: hold the socket open, answer nothing, until the client leaves
                    // (its TCP close is not observed since we do not read) or the fake stops.
                    {
                        let mut st = sh.lock();
                        if st.conn.as_ref().is_some_and(|(n, _)| *n == no) {
                            st.conn = None;
                        }
                    }
                    sh.bump();
                    stop.cancelled().await;
                    return;
                }
            },
            msg = read.next() => match msg {
                Some(Ok(Message::Text(t))) => {
                    if let Ok(v) = serde_json::from_str::<Value>(t.as_str()) {
                        if let Some(id) = v.get("envelope_id").and_then(Value::as_str) {
                            let mut st = sh.lock();
                            st.acks.push(id.to_string());
                            for p in &mut st.pending {
                                if p.envelope_ids.iter().any(|e| e == id) {
                                    p.acked = true;
                                }
                            }
                            drop(st);
                            sh.bump();
                        }
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break,
            }
        }
    }
    let mut st = sh.lock();
    if st.conn.as_ref().is_some_and(|(n, _)| *n == no) {
        st.conn = None;
    }
    drop(st);
    sh.bump();
}

/// Sends pending events on the current connection, and again (retry_attempt + 1, a new
/// envelope id) when not acknowledged within the retry delay, up to 3 retries.
async fn dispatcher(sh: Arc<Shared>, stop: CancellationToken) {
    loop {
        {
            let mut st = sh.lock();
            let retry_delay = st.retry_delay;
            let mut out = Vec::new();
            let mut seq = st.seq;
            if let Some((_, tx)) = st.conn.clone() {
                for p in st.pending.iter_mut().filter(|p| !p.acked) {
                    let due = match p.last_sent {
                        None => true,
                        Some(t) => t.elapsed() >= retry_delay && p.attempt < MAX_RETRIES,
                    };
                    if !due {
                        continue;
                    }
                    if p.last_sent.is_some() {
                        p.attempt += 1;
                    }
                    seq += 1;
                    let envelope_id = format!("env-{seq:06}");
                    p.envelope_ids.push(envelope_id.clone());
                    p.last_sent = Some(Instant::now());
                    let frame = json!({
                        "envelope_id": envelope_id,
                        "type": p.envelope_type,
                        "accepts_response_payload": p.envelope_type != "events_api",
                        "retry_attempt": p.attempt,
                        "retry_reason": if p.attempt > 0 { "timeout" } else { "" },
                        "payload": p.payload,
                    });
                    if tx.send(Cmd::Send(frame.to_string())).is_ok() {
                        out.push(Envelope {
                            envelope_id,
                            event_id: p.event_id.clone(),
                            retry_attempt: p.attempt,
                        });
                    }
                }
            }
            st.seq = seq;
            let any = !out.is_empty();
            st.envelopes.extend(out);
            drop(st);
            if any {
                sh.bump();
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
    }
}
