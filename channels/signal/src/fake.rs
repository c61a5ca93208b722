//! A fake signal-cli HTTP daemon on 127.0.0.1 (`signal-cli daemon --http`, multi-account
//! mode, one account registered: [`ACCOUNT`]) speaking its documented wire protocol:
//!
//! - `POST /api/v1/rpc`: JSON-RPC 2.0. Parse errors are `-32700`, a request without `method`
//!   `-32600` ("method field must be set"), an unknown method `-32601` ("Method not
//!   implemented"), a missing `account` `-32602` ("Method requires valid account parameter"),
//!   an unknown one `-32602` ("Specified account does not exist"). Stricter than signal-cli
//!   (which ignores parameters it does not know): an unknown parameter, a wrong type, a
//!   malformed `textStyle`, a `quoteTimestamp` without `quoteAuthor`, both or neither of
//!   `recipient` and `groupId` are `-32602`, so a typo in the adapter fails a test. User
//!   errors (an unknown group, a bad number) are `-1`; a rate limit is `-5` with signal-cli's
//!   `data.response.results[].type = "RATE_LIMIT_FAILURE"` and `retryAfterSeconds`. Methods:
//!   `send`, `sendTyping`, `sendReceipt`, `getAttachment`, `listGroups`, `version`.
//! - `GET /api/v1/events`: Server-Sent Events, `id:N`, `event:receive`,
//!   `data:{"envelope":…,"account":…}` in signal-cli's exact JSON shape, `:` keep-alives; the
//!   last 1,000 events are kept and replayed after `Last-Event-ID` (all of them for an unknown
//!   id). [`FakeSignal::set_down`] drops the streams and refuses new ones (503) while events
//!   queue, like a daemon restarting behind a proxy.
//! - `GET /api/v1/check`: 200.
//!
//! Like signal-cli, `POST /api/v1/rpc` without `Content-Type: application/json` is 415, and an
//! events stream for an account it does not have is 400.
//!
//! Every successful `send` is recorded ([`Sent`]); `sendTyping` and `sendReceipt` calls too.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use clawft_channel_core::lock::MutexExt;
use serde_json::{json, Map, Value};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, Notify};
use tokio_util::sync::CancellationToken;

/// The account registered in the fake.
pub const ACCOUNT: &str = "+15550000000";
/// How many events the fake keeps for `Last-Event-ID` replays (signal-cli's number).
const KEPT_EVENTS: usize = 1000;
/// Keep-alive interval of the event stream.
const KEEPALIVE: Duration = Duration::from_secs(5);
/// The styles signal-cli accepts in `textStyle`.
const STYLES: [&str; 5] = ["BOLD", "ITALIC", "STRIKETHROUGH", "MONOSPACE", "SPOILER"];

/// A file in a message the account sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentFile {
    /// The file name of the data URI (`filename=`).
    pub name: String,
    /// Its media type.
    pub mime: String,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// A message the account sent (`send` succeeded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// The timestamp Signal gave it (its id).
    pub timestamp: u64,
    /// The recipient's number, or `group.<groupId>` for a group.
    pub chat: String,
    /// The text (`message`, empty when absent).
    pub text: String,
    /// `textStyle` as sent.
    pub styles: Vec<String>,
    /// `quoteTimestamp`, when it quotes a message.
    pub quote: Option<u64>,
    /// The attachments.
    pub files: Vec<SentFile>,
}

/// A `sendTyping` call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Typing {
    /// The recipient's number, or `group.<groupId>`.
    pub chat: String,
    /// `stop`.
    pub stop: bool,
}

/// An attachment a user sends ([`FakeSignal::push_files`]).
#[derive(Clone, Debug)]
pub struct NewFile {
    /// File name (`null` for a voice note).
    pub name: Option<String>,
    /// Media type.
    pub mime: String,
    /// Bytes (served by `getAttachment`).
    pub bytes: Vec<u8>,
}

#[derive(Default)]
struct St {
    next_ts: u64,
    next_event: u64,
    events: VecDeque<(u64, String)>,
    sent: Vec<Sent>,
    typing: Vec<Typing>,
    receipts: Vec<Value>,
    calls: Vec<String>,
    rejected: Vec<Value>,
    attachments: HashMap<String, Vec<u8>>,
    groups: HashMap<String, Vec<String>>,
    /// Scripted answers of the next sends: `None` passes, `Some(secs)` is rate limited.
    rate_limits: VecDeque<Option<u64>>,
    down: bool,
    streams_open: usize,
    most_streams_open: usize,
}

struct Shared {
    st: Mutex<St>,
    live: broadcast::Sender<(u64, String)>,
    changed: Notify,
    /// Cancelled by [`FakeSignal::set_down`]: every open stream ends.
    drop_streams: Mutex<CancellationToken>,
}

/// The fake daemon. Stops when dropped.
pub struct FakeSignal {
    shared: Arc<Shared>,
    addr: std::net::SocketAddr,
    stop: CancellationToken,
}

impl Drop for FakeSignal {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn rpc_error(id: &Value, code: i64, message: &str, data: Value) -> Value {
    json!({"jsonrpc": "2.0", "error": {"code": code, "message": message, "data": data}, "id": id})
}

impl FakeSignal {
    /// Start on a free port of 127.0.0.1.
    ///
    /// # Panics
    /// When no port can be bound (tests only).
    #[allow(clippy::expect_used)]
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (live, _) = broadcast::channel(1024);
        let shared = Arc::new(Shared {
            st: Mutex::new(St {
                next_ts: 1_700_000_000_000,
                next_event: 1,
                ..St::default()
            }),
            live,
            changed: Notify::new(),
            drop_streams: Mutex::new(CancellationToken::new()),
        });
        let app = Router::new()
            .route("/api/v1/rpc", post(rpc))
            .route("/api/v1/events", get(events))
            .route("/api/v1/check", get(|| async { StatusCode::OK }))
            .with_state(shared.clone());
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(s.cancelled_owned())
                .await;
        });
        Self { shared, addr, stop }
    }

    /// The daemon's base URL (`channels.signal.api_url`).
    pub fn api_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn st(&self) -> std::sync::MutexGuard<'_, St> {
        self.shared.st.locked()
    }

    /// Register group `id` (base64) with `members`: sends to it are accepted.
    pub fn add_group(&self, id: &str, members: &[&str]) {
        self.st()
            .groups
            .insert(id.into(), members.iter().map(ToString::to_string).collect());
    }

    fn push_envelope(&self, from: &str, data_message: impl FnOnce(u64) -> Value) -> String {
        let (id, line) = {
            let mut st = self.st();
            st.next_ts += 1;
            let ts = st.next_ts;
            let env = json!({
                "envelope": {
                    "source": from, "sourceNumber": from,
                    "sourceUuid": format!("00000000-0000-4000-8000-{:012}", from.trim_start_matches('+').parse::<u64>().unwrap_or(0) % 1_000_000_000_000),
                    "sourceName": format!("User {from}"), "sourceDevice": 1,
                    "timestamp": ts, "serverReceivedTimestamp": ts + 5, "serverDeliveredTimestamp": ts + 9,
                    "dataMessage": data_message(ts),
                },
                "account": ACCOUNT,
            });
            let id = st.next_event;
            st.next_event += 1;
            let line = env.to_string();
            st.events.push_back((id, line.clone()));
            while st.events.len() > KEPT_EVENTS {
                st.events.pop_front();
            }
            (format!("{from}:{ts}"), (id, line))
        };
        let _ = self.shared.live.send(line);
        id
    }

    fn data_message(ts: u64, text: Option<&str>, group: Option<&str>) -> Value {
        let mut dm = json!({
            "timestamp": ts, "message": text, "expiresInSeconds": 0, "viewOnce": false,
            "mentions": [], "attachments": [], "contacts": [],
        });
        if let Some(g) = group {
            dm["groupInfo"] =
                json!({"groupId": g, "groupName": "Family", "revision": 3, "type": "DELIVER"});
        }
        dm
    }

    /// A direct message from `from` to the account; answers its event id (`from:timestamp`).
    pub fn push_message(&self, from: &str, text: &str) -> String {
        self.push_envelope(from, |ts| Self::data_message(ts, Some(text), None))
    }

    /// A group message from `from` that @mentions the account (U+FFFC at the start, as Signal
    /// writes it) when `mention` is true.
    pub fn push_group_message(&self, group: &str, from: &str, text: &str, mention: bool) -> String {
        self.push_envelope(from, |ts| {
            let mut dm = Self::data_message(
                ts,
                Some(&if mention {
                    format!("\u{FFFC} {text}")
                } else {
                    text.to_string()
                }),
                Some(group),
            );
            if mention {
                dm["mentions"] = json!([{"name": ACCOUNT, "number": ACCOUNT,
                    "uuid": "00000000-0000-4000-8000-0000000000aa", "start": 0, "length": 1}]);
            }
            dm
        })
    }

    /// A direct message with attachments (stored, served by `getAttachment`).
    pub fn push_files(&self, from: &str, text: Option<&str>, files: &[NewFile]) -> String {
        let mut metas = Vec::new();
        {
            let mut st = self.st();
            for (i, f) in files.iter().enumerate() {
                let ext = f.mime.rsplit('/').next().unwrap_or("bin");
                let id = format!("att{}x{i}.{ext}", st.next_event);
                st.attachments.insert(id.clone(), f.bytes.clone());
                metas.push(json!({"contentType": f.mime, "filename": f.name, "id": id,
                    "size": f.bytes.len(), "width": null, "height": null, "caption": null,
                    "uploadTimestamp": null}));
            }
        }
        self.push_envelope(from, move |ts| {
            let mut dm = Self::data_message(ts, text, None);
            dm["attachments"] = Value::Array(metas);
            dm
        })
    }

    /// A typing notification from `from` (not a message: never delivered).
    pub fn push_typing(&self, from: &str) {
        let line = {
            let mut st = self.st();
            st.next_ts += 1;
            let ts = st.next_ts;
            let id = st.next_event;
            st.next_event += 1;
            let line = json!({"envelope": {"source": from, "sourceNumber": from, "sourceDevice": 1,
                "timestamp": ts, "typingMessage": {"action": "STARTED", "timestamp": ts}}, "account": ACCOUNT})
            .to_string();
            st.events.push_back((id, line.clone()));
            (id, line)
        };
        let _ = self.shared.live.send(line);
    }

    /// The next `send` fails with signal-cli's rate-limit error naming `retry_after_secs`.
    pub fn rate_limit_next_send(&self, retry_after_secs: u64) {
        self.rate_limit_send_after(0, retry_after_secs);
    }

    /// The next `ok` sends succeed, the one after fails with the rate-limit error.
    pub fn rate_limit_send_after(&self, ok: usize, retry_after_secs: u64) {
        let mut st = self.st();
        st.rate_limits.extend(std::iter::repeat_n(None, ok));
        st.rate_limits.push_back(Some(retry_after_secs));
    }

    /// Drop every open event stream and refuse new ones with 503 (`true`), or accept them
    /// again (`false`). Events pushed meanwhile are kept for the replay.
    pub fn set_down(&self, down: bool) {
        self.st().down = down;
        if down {
            let mut t = self.shared.drop_streams.locked();
            t.cancel();
            *t = CancellationToken::new();
        }
    }

    /// Event streams open now.
    pub fn streams_open(&self) -> usize {
        self.st().streams_open
    }

    /// The most event streams that were ever open at the same time.
    pub fn most_streams_open(&self) -> usize {
        self.st().most_streams_open
    }

    /// Every message sent, in order.
    pub fn sent(&self) -> Vec<Sent> {
        self.st().sent.clone()
    }

    /// The messages sent to `chat`.
    pub fn sent_to(&self, chat: &str) -> Vec<Sent> {
        self.sent().into_iter().filter(|s| s.chat == chat).collect()
    }

    /// Every `sendTyping` call.
    pub fn typing(&self) -> Vec<Typing> {
        self.st().typing.clone()
    }

    /// Every `sendReceipt` call's params (read receipts the account sent).
    pub fn receipts(&self) -> Vec<Value> {
        self.st().receipts.clone()
    }

    /// The methods called, in order (rejected calls included).
    pub fn calls(&self) -> Vec<String> {
        self.st().calls.clone()
    }

    /// The error answers given (the JSON-RPC error objects), in order.
    pub fn rejected(&self) -> Vec<Value> {
        self.st().rejected.clone()
    }

    /// Wait until at least `n` messages were sent (or `timeout`); answers them.
    pub async fn wait_sent(&self, n: usize, timeout: Duration) -> Vec<Sent> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.shared.changed.notified();
            let s = self.sent();
            if s.len() >= n || tokio::time::Instant::now() >= deadline {
                return s;
            }
            let _ = tokio::time::timeout_at(deadline, notified).await;
        }
    }
}

/// The parameters a method accepts (besides `account`), with a check of each value.
/// A parameter name and the check of its value.
type Param = (&'static str, fn(&Value) -> bool);

fn allowed(method: &str) -> Option<&'static [Param]> {
    fn string(v: &Value) -> bool {
        v.is_string()
    }
    fn strings(v: &Value) -> bool {
        v.is_string() || v.as_array().is_some_and(|a| a.iter().all(Value::is_string))
    }
    fn int(v: &Value) -> bool {
        v.is_u64()
    }
    fn boolean(v: &Value) -> bool {
        v.is_boolean()
    }
    const SEND: &[Param] = &[
        ("recipient", strings),
        ("groupId", string),
        ("message", string),
        ("attachment", strings),
        ("attachments", strings),
        ("textStyle", strings),
        ("textStyles", strings),
        ("quoteTimestamp", int),
        ("quoteAuthor", string),
        ("quoteMessage", string),
        ("editTimestamp", int),
        ("notifySelf", boolean),
    ];
    const TYPING: &[Param] = &[
        ("recipient", strings),
        ("groupId", string),
        ("stop", boolean),
    ];
    const RECEIPT: &[Param] = &[
        ("recipient", string),
        ("targetTimestamp", int),
        ("type", string),
    ];
    const ATTACHMENT: &[Param] = &[("id", string), ("recipient", string), ("groupId", string)];
    match method {
        "send" => Some(SEND),
        "sendTyping" => Some(TYPING),
        "sendReceipt" => Some(RECEIPT),
        "getAttachment" => Some(ATTACHMENT),
        "listGroups" | "version" => Some(&[]),
        _ => None,
    }
}

fn list(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

fn valid_recipient(r: &str) -> bool {
    crate::is_e164(r) || crate::is_uuid(r)
}

/// The chat a `send`/`sendTyping` targets, or the error.
fn target(st: &St, p: &Map<String, Value>) -> Result<String, (i64, String)> {
    let recipients = list(p.get("recipient"));
    match (
        recipients.as_slice(),
        p.get("groupId").and_then(Value::as_str),
    ) {
        ([], None) => Err((-32602, "No recipients given".into())),
        ([_, ..], Some(_)) => Err((
            -32602,
            "Cannot send to recipients and a group at the same time".into(),
        )),
        ([], Some(g)) => {
            if st.groups.contains_key(g) {
                Ok(format!("group.{g}"))
            } else {
                Err((-1, "Invalid group id: group not found".into()))
            }
        }
        ([r], None) if valid_recipient(r) => Ok(r.clone()),
        ([r], None) => Err((-1, format!("Invalid recipient: {r}"))),
        (_, None) => Err((-32602, "the fake takes one recipient per send".into())),
    }
}

/// A `data:` URI of signal-cli: `data:<mime>;filename=<name>;base64,<data>`.
fn data_uri(s: &str) -> Result<SentFile, String> {
    let rest = s.strip_prefix("data:").ok_or("not a data URI")?;
    let (head, data) = rest.split_once(',').ok_or("data URI without a comma")?;
    let mut parts = head.split(';');
    let mime = parts.next().unwrap_or_default().to_string();
    let mut name = String::from("attachment");
    let mut b64 = false;
    for p in parts {
        if let Some(n) = p.strip_prefix("filename=") {
            name = n.to_string();
        } else if p == "base64" {
            b64 = true;
        }
    }
    if !b64 || mime.is_empty() {
        return Err("only base64 data URIs with a media type are accepted".into());
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| format!("bad base64: {e}"))?;
    Ok(SentFile { name, mime, bytes })
}

fn check_styles(text: &str, styles: &[String]) -> Result<(), String> {
    let len = text.encode_utf16().count();
    for s in styles {
        let mut it = s.splitn(3, ':');
        let (Some(a), Some(b), Some(st)) = (it.next(), it.next(), it.next()) else {
            return Err(format!(
                "Invalid textStyle `{s}`: expected start:length:STYLE"
            ));
        };
        let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) else {
            return Err(format!("Invalid textStyle `{s}`"));
        };
        if !STYLES.contains(&st) {
            return Err(format!("Invalid textStyle `{s}`: unknown style {st}"));
        }
        if b == 0 || a + b > len {
            return Err(format!(
                "Invalid textStyle `{s}`: outside the message ({len} UTF-16 units)"
            ));
        }
    }
    Ok(())
}

async fn rpc(State(sh): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    // signal-cli answers 415 without a body unless the request says it is JSON.
    let json_body = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json_body {
        return StatusCode::UNSUPPORTED_MEDIA_TYPE.into_response();
    }
    let answer = handle_rpc(&sh, &body);
    if let Some(e) = answer.get("error") {
        sh.st.locked().rejected.push(e.clone());
    }
    sh.changed.notify_waiters();
    Json(answer).into_response()
}

fn handle_rpc(sh: &Shared, body: &[u8]) -> Value {
    let Ok(req) = serde_json::from_slice::<Value>(body) else {
        return rpc_error(&Value::Null, -32700, "Parse error", Value::Null);
    };
    let id = req.get("id").cloned().unwrap_or(Value::Null);
    if req.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return rpc_error(&id, -32600, "jsonrpc field must be 2.0", Value::Null);
    }
    let Some(method) = req.get("method").and_then(Value::as_str) else {
        return rpc_error(&id, -32600, "method field must be set", Value::Null);
    };
    let mut st = sh.st.locked();
    st.calls.push(method.to_string());
    let Some(allowed) = allowed(method) else {
        return rpc_error(&id, -32601, "Method not implemented", Value::Null);
    };
    let mut p = match req.get("params") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return rpc_error(&id, -32602, "params must be an object", Value::Null),
    };
    match p.remove("account") {
        None | Some(Value::Null) => {
            return rpc_error(
                &id,
                -32602,
                "Method requires valid account parameter",
                Value::Null,
            )
        }
        Some(a) if a.as_str() != Some(ACCOUNT) => {
            return rpc_error(&id, -32602, "Specified account does not exist", Value::Null)
        }
        Some(_) => {}
    }
    for (k, v) in &p {
        match allowed.iter().find(|(n, _)| n == k) {
            None => {
                return rpc_error(
                    &id,
                    -32602,
                    &format!("Unrecognized field \"{k}\" for {method}"),
                    Value::Null,
                )
            }
            Some((_, check)) if !check(v) => {
                return rpc_error(
                    &id,
                    -32602,
                    &format!("Invalid type of \"{k}\" for {method}"),
                    Value::Null,
                )
            }
            Some(_) => {}
        }
    }
    let ok = |result: Value| json!({"jsonrpc": "2.0", "result": result, "id": id});
    match method {
        "version" => ok(json!({"version": "0.13.18"})),
        "listGroups" => ok(Value::Array(
            st.groups
                .iter()
                .map(|(g, m)| json!({"id": g, "name": "Family", "isMember": true, "isBlocked": false, "members": m}))
                .collect(),
        )),
        "getAttachment" => {
            let aid = p.get("id").and_then(Value::as_str).unwrap_or_default();
            match st.attachments.get(aid) {
                Some(b) => ok(json!({"data": base64::engine::general_purpose::STANDARD.encode(b)})),
                None => rpc_error(
                    &id,
                    -32603,
                    &format!("An error occurred reading attachment: {aid}"),
                    Value::Null,
                ),
            }
        }
        "sendReceipt" => {
            st.receipts.push(Value::Object(p));
            ok(json!({}))
        }
        "sendTyping" => match target(&st, &p) {
            Ok(chat) => {
                let stop = p.get("stop").and_then(Value::as_bool).unwrap_or(false);
                st.typing.push(Typing { chat, stop });
                ok(json!({}))
            }
            Err((c, m)) => rpc_error(&id, c, &m, Value::Null),
        },
        "send" => send(&mut st, &id, &p),
        _ => rpc_error(&id, -32601, "Method not implemented", Value::Null),
    }
}

fn send(st: &mut St, id: &Value, p: &Map<String, Value>) -> Value {
    let chat = match target(st, p) {
        Ok(c) => c,
        Err((c, m)) => return rpc_error(id, c, &m, Value::Null),
    };
    let text = p
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let mut files = Vec::new();
    for a in list(p.get("attachments"))
        .into_iter()
        .chain(list(p.get("attachment")))
    {
        match data_uri(&a) {
            Ok(f) => files.push(f),
            Err(e) => {
                return rpc_error(
                    id,
                    -1,
                    &format!("Failed to add attachment: {e}"),
                    Value::Null,
                )
            }
        }
    }
    if text.is_empty() && files.is_empty() {
        return rpc_error(id, -1, "No message given", Value::Null);
    }
    let styles = list(p.get("textStyle"));
    if let Err(e) = check_styles(&text, &styles) {
        return rpc_error(id, -32602, &e, Value::Null);
    }
    let quote = p.get("quoteTimestamp").and_then(Value::as_u64);
    if quote.is_some() && p.get("quoteAuthor").is_none() {
        return rpc_error(id, -32602, "quoteTimestamp needs quoteAuthor", Value::Null);
    }
    st.next_ts += 1;
    let ts = st.next_ts;
    let address = |chat: &str| json!({"uuid": null, "number": chat});
    if let Some(Some(wait)) = st.rate_limits.pop_front() {
        return rpc_error(
            id,
            -5,
            "Failed to send message due to rate limiting",
            json!({"response": {"timestamp": ts, "results": [
                {"recipientAddress": address(&chat), "groupId": null, "type": "RATE_LIMIT_FAILURE", "token": "rl-token", "retryAfterSeconds": wait}]}}),
        );
    }
    st.sent.push(Sent {
        timestamp: ts,
        chat: chat.clone(),
        text,
        styles,
        quote,
        files,
    });
    json!({"jsonrpc": "2.0", "result": {"timestamp": ts, "results": [
        {"recipientAddress": address(&chat), "type": "SUCCESS"}]}, "id": id})
}

async fn events(
    State(sh): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if q.get("account").is_some_and(|a| a != ACCOUNT) {
        return (StatusCode::BAD_REQUEST, "Specified account does not exist").into_response();
    }
    let last: Option<u64> = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok());
    let (backlog, mut live, stop) = {
        let mut st = sh.st.locked();
        if st.down {
            return (StatusCode::SERVICE_UNAVAILABLE, "down").into_response();
        }
        let known = last.is_some_and(|l| st.events.iter().any(|(i, _)| *i == l));
        let backlog: Vec<(u64, String)> = st
            .events
            .iter()
            .filter(|(i, _)| !known || Some(*i) > last)
            .cloned()
            .collect();
        st.streams_open += 1;
        st.most_streams_open = st.most_streams_open.max(st.streams_open);
        (
            backlog,
            sh.live.subscribe(),
            sh.drop_streams.locked().clone(),
        )
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    tokio::spawn(async move {
        let frame =
            |(i, d): &(u64, String)| Bytes::from(format!("id:{i}\nevent:receive\ndata:{d}\n\n"));
        let mut sent_upto = 0;
        for e in &backlog {
            sent_upto = e.0;
            if tx.send(Ok(frame(e))).await.is_err() {
                break;
            }
        }
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(KEEPALIVE) => {
                    if tx.send(Ok(Bytes::from_static(b":\n"))).await.is_err() { break; }
                }
                e = live.recv() => match e {
                    Ok(e) if e.0 <= sent_upto => {}
                    Ok(e) => if tx.send(Ok(frame(&e))).await.is_err() { break; },
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => break,
                },
            }
        }
        sh.st.locked().streams_open -= 1;
    });
    let stream = tokio_stream_from(rx);
    (
        [
            ("content-type", "text/event-stream"),
            ("cache-control", "no-cache"),
        ],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
