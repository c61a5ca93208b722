//! The control UI under `/ui/`: pages and assets compiled into the binary, a login with a
//! one-time link (made by `weft dashboard` through `POST /v1/admin/ui/link`) exchanged for a
//! session cookie, and a JSON API for the pages that is a client of the same [`Admin`] handles
//! as the admin routes.
//!
//! Security model: the link's token is single-use and short-lived and travels in the URL's
//! fragment (never sent to a server or written to a log); the page posts it back once and
//! gets an `HttpOnly; SameSite=Strict` cookie (`Secure` behind TLS). Every state change needs
//! the request's `Origin` to be this server's own and the session's CSRF token in
//! `X-CSRF-Token`; a read-only session may only read. Every page carries a strict
//! `Content-Security-Policy` (scripts and styles from this origin only, nothing else). A bearer
//! token (control token, `channels.http.token`) is accepted instead of the cookie, with no
//! CSRF check (it is never sent by a browser on its own). `POST /v1/admin/ui/revoke-all` ends
//! every session. Sessions are kept by the hash of their cookie only, in the store when the
//! daemon gives one ([`crate::HttpChannel::keep_ui_sessions`]): they survive a restart.
//!
//! The web chat is a channel of its own, [`WebChannel`] (`web`): the page posts to it (text,
//! files, the agent to answer) and reads its replies, deltas, approval questions and canvas
//! changes from an SSE stream.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clawft_channel_core::lock::MutexExt;
use clawft_channel_core::{
    now_ms, Ack, Capabilities, Channel, ChannelError, ChannelId, ChatId, InboundDelivery,
    InboundEvent, OutboundBody, OutboundKind, OutboundMessage, PlatformEventId, SentRef,
    StateStore, UserId,
};
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::{caller, constant_time_eq, err, Caller, Inner};

/// How long a one-time login link stays valid.
pub const LINK_TTL: Duration = Duration::from_secs(300);
/// How long a UI session lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept at most (the oldest goes first).
const MAX_SESSIONS: usize = 64;
/// Unused links kept at most.
const MAX_LINKS: usize = 32;
/// The session cookie.
pub const COOKIE: &str = "weft_ui";
/// The header carrying the CSRF token.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// The channel id of the web chat.
pub const WEB_CHANNEL: &str = clawft_channel_core::Surface::Web.id();
/// The sender id of messages typed in the web chat.
pub const WEB_SENDER: &str = "operator";

/// The policy of every UI page: this origin's scripts, styles and API only; frames only from
/// this origin (the canvas, itself sandboxed); nothing may frame the UI.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";
/// The policy of the canvas frame: a unique opaque origin (`sandbox allow-scripts`, never
/// `allow-same-origin`) that may run its own inline script and style and reach nothing.
pub(crate) const CANVAS_CSP: &str = "sandbox allow-scripts; default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'self'";

/// The embedded assets: (path under `/ui/`, content type, bytes).
const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "",
        "text/html; charset=utf-8",
        include_bytes!("../ui/index.html"),
    ),
    (
        "login",
        "text/html; charset=utf-8",
        include_bytes!("../ui/login.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../ui/app.js"),
    ),
    (
        "login.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../ui/login.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_bytes!("../ui/app.css"),
    ),
    (
        "favicon.svg",
        "image/svg+xml",
        include_bytes!("../ui/favicon.svg"),
    ),
];

/// What a UI session may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Read every page, change nothing.
    ReadOnly,
    /// Everything the admin routes allow.
    Operator,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::ReadOnly => "read-only",
            Role::Operator => "operator",
        }
    }
}

struct Link {
    role: Role,
    expires_ms: u64,
}

/// A UI session as kept (in memory and, with [`Auth::keep_in`], in the store): never the
/// cookie's value, only its SHA-256 (the map's key). The CSRF token is derived from the value
/// ([`csrf_of`]), so it is not kept either.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Session {
    role: Role,
    created_ms: u64,
    expires_ms: u64,
}

/// The state key under which the sessions are kept (one small JSON map: at most
/// [`MAX_SESSIONS`] entries).
const STATE_KEY: &str = "sessions";

/// Login links (in memory: a link lives 5 minutes) and sessions (in memory, and in the store
/// when one is given: a restart keeps them).
#[derive(Default)]
pub(crate) struct Auth {
    links: Mutex<HashMap<String, Link>>,
    /// By the hex SHA-256 of the cookie's value.
    sessions: Mutex<HashMap<String, Session>>,
    store: Mutex<Option<Arc<dyn StateStore>>>,
}

/// 32 random bytes from the OS, as hex.
fn random_hex() -> std::io::Result<String> {
    use std::io::Read;
    let mut buf = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(clawft_channel_core::hex(&buf))
}

fn sha256_hex(parts: &[&[u8]]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for p in parts {
        ctx.update(p);
    }
    clawft_channel_core::hex(ctx.finish().as_ref())
}

/// What a session is kept under: the hash of its cookie's value.
fn session_id(cookie: &str) -> String {
    sha256_hex(&[b"weft-ui-session\0", cookie.as_bytes()])
}

/// The CSRF token of the session with this cookie value: derived from the value (one-way), so
/// only a holder of the cookie (the page, through `/ui/api/me`) learns it.
fn csrf_of(cookie: &str) -> String {
    sha256_hex(&[b"weft-ui-csrf\0", cookie.as_bytes()])
}

impl Auth {
    /// Keep the sessions in `store` from now on, starting with the live ones it holds.
    pub(crate) fn keep_in(&self, store: Arc<dyn StateStore>) {
        let now = now_ms();
        let kept: HashMap<String, Session> = store
            .get(STATE_KEY)
            .filter(|v| !v.is_empty())
            .and_then(|v| serde_json::from_str(&v).ok())
            .unwrap_or_default();
        {
            let mut s = self.sessions.locked();
            for (k, x) in kept {
                if x.expires_ms > now {
                    s.insert(k, x);
                }
            }
        }
        // Nothing is written at start (a durable write is an fsync on the way to ready):
        // expired entries are dropped when read, and from the store at the next login,
        // logout or revocation.
        *self.store.locked() = Some(store);
    }

    /// Write the sessions to the store, if one is kept (a failure is logged: the sessions
    /// still work until a restart).
    fn save(&self, sessions: &HashMap<String, Session>) {
        let Some(store) = self.store.locked().clone() else {
            return;
        };
        let text = serde_json::to_string(sessions).unwrap_or_default();
        if let Err(e) = store.put(STATE_KEY, &text) {
            tracing::warn!(error = %e, "control UI sessions not saved");
        }
    }

    /// A new one-time login token.
    fn new_link(&self, role: Role) -> std::io::Result<String> {
        let t = random_hex()?;
        let now = now_ms();
        let mut links = self.links.locked();
        links.retain(|_, l| l.expires_ms > now);
        if links.len() >= MAX_LINKS {
            return Err(std::io::Error::other(
                "too many unused login links: use one or wait a few minutes",
            ));
        }
        links.insert(
            t.clone(),
            Link {
                role,
                expires_ms: now + LINK_TTL.as_millis() as u64,
            },
        );
        Ok(t)
    }

    /// Consume a login token: the role it grants, once.
    fn take_link(&self, token: &str) -> Option<Role> {
        let now = now_ms();
        let mut links = self.links.locked();
        let key = links
            .keys()
            .find(|k| constant_time_eq(k.as_bytes(), token.as_bytes()))
            .cloned()?;
        let l = links.remove(&key)?;
        (l.expires_ms > now).then_some(l.role)
    }

    /// A new session: (cookie value, CSRF token).
    fn new_session(&self, role: Role) -> std::io::Result<(String, String)> {
        let cookie = random_hex()?;
        let now = now_ms();
        let mut s = self.sessions.locked();
        s.retain(|_, x| x.expires_ms > now);
        while s.len() >= MAX_SESSIONS {
            let Some(oldest) = s
                .iter()
                .min_by_key(|(_, x)| x.created_ms)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            s.remove(&oldest);
        }
        s.insert(
            session_id(&cookie),
            Session {
                role,
                created_ms: now,
                expires_ms: now + SESSION_TTL.as_millis() as u64,
            },
        );
        self.save(&s);
        let csrf = csrf_of(&cookie);
        Ok((cookie, csrf))
    }

    /// The live session of this cookie value: (role, CSRF token).
    fn session(&self, cookie: &str) -> Option<(Role, String)> {
        let now = now_ms();
        let id = session_id(cookie);
        let s = self.sessions.locked();
        s.get(&id)
            .filter(|x| x.expires_ms > now)
            .map(|x| (x.role, csrf_of(cookie)))
    }

    fn end(&self, cookie: &str) {
        let mut s = self.sessions.locked();
        if s.remove(&session_id(cookie)).is_some() {
            self.save(&s);
        }
    }

    /// End every session and unused link; how many sessions there were.
    pub(crate) fn revoke_all(&self) -> usize {
        self.links.locked().clear();
        let mut s = self.sessions.locked();
        let n = s.len();
        s.clear();
        self.save(&s);
        n
    }
}

/// `POST /v1/admin/ui/*` (control or configured token): `link {"role"}` makes a one-time
/// login path, `revoke-all` ends every session. `None` for another command.
pub(crate) fn admin_command(inner: &Inner, name: &str, body: &Value) -> Option<Response> {
    match name {
        "ui/link" => {
            let role = match body.get("role").and_then(Value::as_str) {
                None | Some("operator") => Role::Operator,
                Some("read-only") => Role::ReadOnly,
                Some(other) => {
                    return Some(err(
                        StatusCode::BAD_REQUEST,
                        format!("`role` must be \"operator\" or \"read-only\", got `{other}`"),
                    ))
                }
            };
            Some(match inner.ui.new_link(role) {
                Ok(t) => Json(json!({
                    "path": format!("/ui/login#{t}"),
                    "role": role.as_str(),
                    "expires_in_secs": LINK_TTL.as_secs(),
                }))
                .into_response(),
                Err(e) => err(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
            })
        }
        "ui/revoke-all" => Some(Json(json!({"revoked": inner.ui.revoke_all()})).into_response()),
        _ => None,
    }
}

/// The routes under `/ui`.
pub(crate) fn routes(inner: Arc<Inner>) -> Router<Arc<Inner>> {
    let inner_for_hosts = inner.clone();
    let api = Router::new()
        .route("/ui/api/me", get(me))
        .route("/ui/api/logout", post(logout))
        // The same handlers as `/v1/status` and `/v1/sessions[/{key}]`, behind the UI's guard.
        .route("/ui/api/status", get(crate::status))
        .route("/ui/api/sessions", get(crate::sessions))
        .route("/ui/api/sessions/{key}", get(crate::session))
        .route("/ui/api/sessions/{key}/clear", post(clear_session))
        .route("/ui/api/admin/{*name}", post(admin))
        .route("/ui/api/chat", post(chat))
        .route("/ui/api/events", get(events))
        .route_layer(middleware::from_fn_with_state(inner, guard));
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(asset_index))
        .route("/ui/login", get(asset_login).post(login))
        .route("/ui/canvas/{key}", get(canvas))
        .route("/ui/{file}", get(asset))
        .merge(api)
        .route_layer(middleware::from_fn_with_state(inner_for_hosts, own_host))
}

/// Whether `host` (a `Host` header: name and optional port) names this server: loopback, the
/// bind address, or a name the operator listed (`channels.http.ui_hosts`). A page of another
/// site whose name was made to resolve to this address (DNS rebinding) sends its own name.
fn host_allowed(cfg: &crate::HttpConfig, host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']')
            .next()
            .map(|h| format!("[{h}]"))
            .unwrap_or_default()
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h).to_string()
    }
    .to_ascii_lowercase();
    let bind = cfg.bind.ip();
    matches!(name.as_str(), "localhost" | "127.0.0.1" | "[::1]")
        || (!bind.is_unspecified() && (name == bind.to_string() || name == format!("[{bind}]")))
        || cfg.ui_hosts.contains(&name)
}

/// Every `/ui` route answers only for this server's own names (421 otherwise).
async fn own_host(State(inner): State<Arc<Inner>>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !host_allowed(&inner.cfg, host) {
        return err(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "the control UI does not answer for the host `{host}`: list it in channels.http.ui_hosts if it is this gateway's name"
            ),
        );
    }
    next.run(req).await
}

/// Headers every UI response carries.
fn harden(mut r: Response, csp: &'static str) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(csp),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if csp == CSP {
        h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    }
    r
}

fn serve(name: &str) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, ct, bytes)) => {
            harden(([(header::CONTENT_TYPE, *ct)], *bytes).into_response(), CSP)
        }
        None => harden(
            err(StatusCode::NOT_FOUND, format!("no page /ui/{name}")),
            CSP,
        ),
    }
}

async fn asset_index() -> Response {
    serve("")
}

async fn asset_login() -> Response {
    serve("login")
}

async fn asset(Path(file): Path<String>) -> Response {
    serve(&file)
}

/// The origin this request was addressed to, as a browser would write it.
fn own_origin(headers: &HeaderMap) -> Option<String> {
    let host = headers.get(header::HOST)?.to_str().ok()?;
    Some(format!(
        "{}://{host}",
        if tls(headers) { "https" } else { "http" }
    ))
}

/// Whether the request came over TLS (a TLS-terminating proxy in front says so).
fn tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.eq_ignore_ascii_case("https"))
}

/// Whether `Origin` names this server (a state change from another site is refused).
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    own_origin(headers).is_some_and(|own| own == origin)
}

fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
}

/// Who is calling the UI API.
#[derive(Clone)]
struct Who {
    role: Role,
    /// The session's cookie value (none for a bearer token).
    session: Option<String>,
    csrf: Option<String>,
}

const LOGIN_NEEDED: &str =
    "not logged in: run `weft dashboard` on the gateway's host and open the link it prints";

/// The UI API's gate: a session cookie (plus, for a state change, this origin and the CSRF
/// token, and the operator role) or a bearer token.
async fn guard(State(inner): State<Arc<Inner>>, mut req: Request, next: Next) -> Response {
    let headers = req.headers();
    let who = if headers.contains_key(header::AUTHORIZATION) {
        match caller(&inner, headers) {
            Caller::Authenticated => Who {
                role: Role::Operator,
                session: None,
                csrf: None,
            },
            Caller::Anonymous | Caller::BadToken => {
                return err(StatusCode::UNAUTHORIZED, "invalid bearer token")
            }
        }
    } else {
        let Some((id, (role, csrf))) =
            cookie(headers).and_then(|id| inner.ui.session(&id).map(|s| (id, s)))
        else {
            return err(StatusCode::UNAUTHORIZED, LOGIN_NEEDED);
        };
        if req.method() != axum::http::Method::GET {
            if !same_origin(headers) {
                return err(
                    StatusCode::FORBIDDEN,
                    "cross-origin request refused: the Origin header must be this server's own",
                );
            }
            let sent = headers
                .get(CSRF_HEADER)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if !constant_time_eq(sent.as_bytes(), csrf.as_bytes()) {
                return err(
                    StatusCode::FORBIDDEN,
                    "missing or wrong X-CSRF-Token: reload the page",
                );
            }
        }
        Who {
            role,
            session: Some(id),
            csrf: Some(csrf),
        }
    };
    req.extensions_mut().insert(who);
    next.run(req).await
}

fn who(req_ext: &axum::http::Extensions) -> Option<Who> {
    req_ext.get::<Who>().cloned()
}

/// Refuse a state change to a read-only session.
fn operator(w: &Option<Who>) -> Result<(), Box<Response>> {
    match w {
        Some(Who {
            role: Role::Operator,
            ..
        }) => Ok(()),
        _ => Err(Box::new(err(
            StatusCode::FORBIDDEN,
            "this session is read-only: ask for an operator link (`weft dashboard`)",
        ))),
    }
}

/// `POST /ui/login {"token"}`: exchange a one-time link for a session cookie.
async fn login(State(inner): State<Arc<Inner>>, headers: HeaderMap, body: String) -> Response {
    if !same_origin(&headers) {
        return harden(
            err(StatusCode::FORBIDDEN, "cross-origin login refused"),
            CSP,
        );
    }
    let token = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v.get("token").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_default();
    let Some(role) = inner.ui.take_link(token.trim()) else {
        return harden(
            err(
                StatusCode::UNAUTHORIZED,
                "this login link was already used, has expired, or is not one: run `weft dashboard` for a new one",
            ),
            CSP,
        );
    };
    let (id, _) = match inner.ui.new_session(role) {
        Ok(x) => x,
        Err(e) => return err(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    let cookie = format!(
        "{COOKIE}={id}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}{}",
        SESSION_TTL.as_secs(),
        if tls(&headers) { "; Secure" } else { "" }
    );
    let mut r = Json(json!({"role": role.as_str()})).into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    harden(r, CSP)
}

async fn me(State(inner): State<Arc<Inner>>, req: Request) -> Response {
    let w = who(req.extensions());
    Json(json!({
        "role": w.as_ref().map(|w| w.role.as_str()),
        "csrf": w.and_then(|w| w.csrf),
        "agents": inner.cfg.agents,
    }))
    .into_response()
}

async fn logout(State(inner): State<Arc<Inner>>, req: Request) -> Response {
    if let Some(id) = who(req.extensions()).and_then(|w| w.session) {
        inner.ui.end(&id);
    }
    let mut r = Json(json!({"logged_out": true})).into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("weft_ui=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    r
}

/// `POST /ui/api/sessions/{key}/clear`: reset a session, as `DELETE /v1/sessions/{key}`.
async fn clear_session(
    State(inner): State<Arc<Inner>>,
    Path(key): Path<String>,
    req: Request,
) -> Response {
    if let Err(r) = operator(&who(req.extensions())) {
        return *r;
    }
    crate::clear_session(State(inner), Path(key)).await
}

/// Admin commands that only read: a read-only session may call these.
const READS: &[&str] = &[
    "approvals/list",
    "usage",
    "mcp/list",
    "pairing/list",
    "nodes/list",
    "logs/tail",
    "cron/list",
    "cron/runs",
    "canvas/get",
    "config/show",
    "config/validate",
    "agents/list",
    "memory/list",
    "memory/search",
    "sessions/search",
];

/// `POST /ui/api/admin/{name}`: the admin command of that name (the UI's own `ui/*` excepted).
async fn admin(
    State(inner): State<Arc<Inner>>,
    Path(name): Path<String>,
    req: Request,
) -> Response {
    let w = who(req.extensions());
    if !READS.contains(&name.as_str()) {
        if let Err(r) = operator(&w) {
            return *r;
        }
    }
    if name.starts_with("ui/") {
        return err(
            StatusCode::FORBIDDEN,
            "login links and revocation are for `weft dashboard` (the control token) only",
        );
    }
    let body = match axum::body::to_bytes(req.into_body(), 1024 * 1024).await {
        Ok(b) if b.is_empty() => Value::Null,
        Ok(b) => match serde_json::from_slice(&b) {
            Ok(v) => v,
            Err(e) => return err(StatusCode::BAD_REQUEST, format!("body must be JSON: {e}")),
        },
        Err(e) => return err(StatusCode::BAD_REQUEST, e.to_string()),
    };
    match inner.admin.command(&name, body).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => err(e.status(), e.to_string()),
    }
}

/// Files one web chat message may carry.
pub const WEB_MAX_FILES: usize = 10;
/// Bytes of files one web chat message may carry (the media caps, `media.max_file_mb` and
/// `media.max_message_mb`, apply on top when the session takes them).
pub const WEB_MAX_UPLOAD_BYTES: usize = 50 * 1024 * 1024;

/// The fields of a chat post: JSON `{"chat", "content", "agent"}`, or `multipart/form-data`
/// with those fields and `file` parts.
struct ChatPost {
    chat: String,
    content: String,
    agent: String,
    files: Vec<clawft_channel_core::media::Part>,
}

fn chat_post(content_type: &str, body: &[u8]) -> Result<ChatPost, String> {
    if content_type
        .to_ascii_lowercase()
        .starts_with("multipart/form-data")
    {
        let parts = clawft_channel_core::media::parse_multipart(content_type, body)
            .ok_or("the form could not be read (multipart/form-data with a boundary)")?;
        let mut post = ChatPost {
            chat: String::new(),
            content: String::new(),
            agent: String::new(),
            files: Vec::new(),
        };
        for p in parts {
            if p.file_name.is_some() {
                if !p.data.is_empty() {
                    post.files.push(p);
                }
                continue;
            }
            let text = String::from_utf8(p.data).map_err(|_| "a form field is not UTF-8")?;
            match p.name.as_str() {
                "chat" => post.chat = text,
                "content" => post.content = text,
                "agent" => post.agent = text,
                other => return Err(format!("unknown form field `{other}`")),
            }
        }
        return Ok(post);
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("body must be JSON: {e}"))?;
    Ok(ChatPost {
        chat: v["chat"].as_str().unwrap_or("").to_string(),
        content: v["content"].as_str().unwrap_or("").to_string(),
        agent: v["agent"].as_str().unwrap_or("").to_string(),
        files: Vec::new(),
    })
}

/// `POST /ui/api/chat`: a message in the web chat `chat` (default `main`), to the agent
/// `agent` (one of the configured agents; none: the one the bindings choose), with files.
/// The chat id is `CHAT@AGENT` when an agent is named, so each agent has its own session.
async fn chat(State(inner): State<Arc<Inner>>, req: Request) -> Response {
    if let Err(r) = operator(&who(req.extensions())) {
        return *r;
    }
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let limit = crate::body_limit(inner.cfg.max_inbound_bytes) + WEB_MAX_UPLOAD_BYTES;
    let body = match axum::body::to_bytes(req.into_body(), limit).await {
        Ok(b) => b,
        Err(_) => {
            return err(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "message too large: its files may total at most {} MB",
                    WEB_MAX_UPLOAD_BYTES / (1024 * 1024)
                ),
            )
        }
    };
    let post = match chat_post(&content_type, &body) {
        Ok(p) => p,
        Err(e) => return err(StatusCode::BAD_REQUEST, e),
    };
    let chat = match post.chat.trim() {
        "" => "main".to_string(),
        c => c.to_string(),
    };
    if chat.contains([':', '@']) || chat.len() > 64 {
        return err(
            StatusCode::BAD_REQUEST,
            "`chat` is up to 64 characters, without `:` or `@`",
        );
    }
    if post.content.trim().is_empty() && post.files.is_empty() {
        return err(
            StatusCode::BAD_REQUEST,
            "a message needs text or a file: both are empty",
        );
    }
    let agent = post.agent.trim();
    if !agent.is_empty() && !inner.cfg.agents.iter().any(|a| a == agent) {
        return err(
            StatusCode::BAD_REQUEST,
            format!(
                "no agent `{agent}`: the configured agents are {}",
                inner.cfg.agents.join(", ")
            ),
        );
    }
    if post.content.len() > inner.cfg.max_inbound_bytes {
        return err(
            StatusCode::PAYLOAD_TOO_LARGE,
            clawft_channel_core::oversized_notice(post.content.len(), inner.cfg.max_inbound_bytes),
        );
    }
    if post.files.len() > WEB_MAX_FILES {
        return err(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "{} files: a message carries at most {WEB_MAX_FILES}",
                post.files.len()
            ),
        );
    }
    let chat_id = if agent.is_empty() {
        chat
    } else {
        format!("{chat}@{agent}")
    };
    let files = post.files.len();
    match inner.web.submit(&chat_id, post.content, post.files).await {
        Ok(id) => Json(json!({"chat": chat_id, "event_id": id, "files": files})).into_response(),
        Err((s, m)) => err(s, m),
    }
}

/// `GET /ui/api/events`: the web chat's outbound messages as SSE `message` events.
async fn events(State(inner): State<Arc<Inner>>) -> Response {
    let rx = inner.web.events.subscribe();
    let shutdown = inner.shutdown.clone();
    let stream = futures::stream::unfold((rx, shutdown), |(mut rx, shutdown)| async move {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return None,
                m = rx.recv() => match m {
                    Ok(data) => {
                        let e = Event::default().event("message").data(data);
                        return Some((Ok::<_, Infallible>(e), (rx, shutdown)));
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                },
            }
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(crate::SSE_KEEPALIVE))
        .into_response()
}

/// `GET /ui/canvas/{session}`: what the agent presented in that session's canvas, served with
/// a sandbox policy (an opaque origin: no cookie, no API, no network). Needs a UI session.
async fn canvas(
    State(inner): State<Arc<Inner>>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    let allowed = if headers.contains_key(header::AUTHORIZATION) {
        caller(&inner, &headers) == Caller::Authenticated
    } else {
        cookie(&headers).is_some_and(|c| inner.ui.session(&c).is_some())
    };
    if !allowed {
        return harden(err(StatusCode::UNAUTHORIZED, LOGIN_NEEDED), CANVAS_CSP);
    }
    let html = match inner
        .admin
        .command("canvas/get", json!({"session": key}))
        .await
    {
        Ok(v) if v["visible"].as_bool() == Some(true) => {
            v["html"].as_str().unwrap_or_default().to_string()
        }
        Ok(_) => "<!doctype html><p>Nothing is shown in this session's canvas.</p>".to_string(),
        Err(e) => format!(
            "<!doctype html><p>{}</p>",
            e.to_string().replace('&', "&amp;").replace('<', "&lt;")
        ),
    };
    harden(
        ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response(),
        CANVAS_CSP,
    )
}

/// The web chat: a channel of its own (`web`), fed by the UI's chat page and answered through
/// its SSE stream. Its sessions are `web:<chat>`; like every channel, its messages are
/// journaled before they are acknowledged and its replies go through the outbox.
pub struct WebChannel {
    id: ChannelId,
    tx: Mutex<Option<mpsc::Sender<InboundDelivery>>>,
    events: broadcast::Sender<String>,
    seq: AtomicU64,
    /// Files posted with messages, until the session takes them (by attachment id).
    files: Mutex<Vec<Held>>,
}

/// A file posted in the web chat, held in memory until its session fetches it (the media
/// pipeline then sniffs, caps and saves it in the workspace's inbox).
struct Held {
    id: String,
    mime: String,
    bytes: Vec<u8>,
    at_ms: u64,
}

/// Bytes of posted files held at most (the oldest go first), and how long.
const HELD_BYTES: usize = 2 * WEB_MAX_UPLOAD_BYTES;
const HELD_MS: u64 = 3_600_000;

/// A data URL of `bytes` (how a held file is handed to the media pipeline).
fn data_url(mime: &str, bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4 + mime.len() + 13);
    out.push_str("data:");
    out.push_str(mime);
    out.push_str(";base64,");
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(char::from(A[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

impl WebChannel {
    pub(crate) fn new() -> Self {
        Self {
            id: ChannelId::new(WEB_CHANNEL),
            tx: Mutex::new(None),
            events: broadcast::channel(512).0,
            seq: AtomicU64::new(0),
            files: Mutex::new(Vec::new()),
        }
    }

    /// Tell the open pages that the canvas of `session` (a session key whose chat is `chat`
    /// on this channel, or another channel's) changed: they reload its frame if they show it.
    pub fn canvas_changed(&self, session: &str, channel: &str, chat: &str, canvas: &Value) {
        let v = json!({
            "kind": "canvas",
            "session": session,
            "channel": channel,
            "chat": chat,
            "visible": canvas["visible"],
            "version": canvas["version"],
            "title": canvas["title"],
        });
        let _ = self.events.send(v.to_string());
    }

    /// Hold `files` for the message `event_id`; their references.
    fn hold(
        &self,
        event_id: &str,
        files: Vec<clawft_channel_core::media::Part>,
    ) -> Vec<clawft_channel_core::media::MediaRef> {
        use clawft_channel_core::media::{MediaKind, MediaRef};
        let now = now_ms();
        let mut held = self.files.locked();
        let mut refs = Vec::new();
        for (i, f) in files.into_iter().enumerate() {
            let declared = f
                .content_type
                .clone()
                .filter(|m| !m.is_empty() && !m.contains([';', ' ', ',']))
                .unwrap_or_else(|| "application/octet-stream".into());
            let mut r = MediaRef::new(MediaKind::of_mime(&declared), format!("{event_id}.{i}"));
            r.name = f.file_name.clone().filter(|n| !n.is_empty());
            r.mime = Some(declared.clone());
            r.size = Some(f.data.len() as u64);
            held.push(Held {
                id: r.id.clone(),
                mime: declared,
                bytes: f.data,
                at_ms: now,
            });
            refs.push(r);
        }
        held.retain(|h| h.at_ms + HELD_MS > now);
        let mut total: usize = held.iter().map(|h| h.bytes.len()).sum();
        while total > HELD_BYTES && held.len() > 1 {
            total -= held.remove(0).bytes.len();
        }
        refs
    }

    async fn submit(
        &self,
        chat: &str,
        content: String,
        files: Vec<clawft_channel_core::media::Part>,
    ) -> Result<String, (StatusCode, String)> {
        let tx = self.tx.locked().clone().ok_or((
            StatusCode::SERVICE_UNAVAILABLE,
            "the web chat is not running".to_string(),
        ))?;
        let event_id = format!(
            "w{:x}-{:x}-{:x}",
            now_ms(),
            std::process::id(),
            self.seq.fetch_add(1, Ordering::Relaxed)
        );
        let (delivery, ack) = InboundDelivery::new(InboundEvent {
            channel: self.id.clone(),
            chat: ChatId::new(chat),
            thread: None,
            sender: UserId::new(WEB_SENDER),
            sender_name: None,
            event_id: PlatformEventId::new(event_id.clone()),
            content,
            received_at_ms: now_ms(),
            attachments: self.hold(&event_id, files),
            origin: clawft_channel_core::Origin::User,
        });
        let gone = || (StatusCode::SERVICE_UNAVAILABLE, "shutting down".to_string());
        tx.send(delivery).await.map_err(|_| gone())?;
        match ack.await {
            Ok(Ack::Accepted) => Ok(event_id),
            Ok(Ack::Duplicate) => Err((StatusCode::CONFLICT, "duplicate message".into())),
            Ok(Ack::Rejected(why)) => Err((StatusCode::FORBIDDEN, why)),
            Ok(Ack::Unavailable(why)) => Err((StatusCode::SERVICE_UNAVAILABLE, why)),
            Err(_) => Err(gone()),
        }
    }
}

/// The JSON a page receives for an outbound message.
fn event_json(m: &OutboundMessage) -> Value {
    let kind = match (&m.body, m.kind()) {
        (OutboundBody::Approval { .. }, _) => "approval",
        (_, OutboundKind::Delta) => "delta",
        (_, OutboundKind::Progress) => "progress",
        (_, OutboundKind::Final) => "reply",
        (_, OutboundKind::Error) => "error",
    };
    let mut v = json!({
        "chat": m.chat.as_str(),
        "kind": kind,
        "text": m.text(),
        "in_reply_to": m.in_reply_to,
        "restart": m.kind() == OutboundKind::Delta && m.is_restart(),
    });
    if let OutboundBody::Approval { ask, .. } = &m.body {
        v["approval"] = json!({"id": ask.approval_id, "command": ask.command});
    }
    if let OutboundBody::Progress(p) = &m.body {
        v["progress"] = serde_json::to_value(p).unwrap_or_default();
    }
    v
}

#[async_trait]
impl Channel for WebChannel {
    fn id(&self) -> &ChannelId {
        &self.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            streaming: true,
            progress: true,
            max_message_bytes: crate::MAX_BODY_BYTES,
            max_upload_bytes: 0,
        }
    }

    async fn listen(
        &self,
        tx: mpsc::Sender<InboundDelivery>,
        cancel: CancellationToken,
    ) -> Result<(), ChannelError> {
        *self.tx.locked() = Some(tx);
        cancel.cancelled().await;
        *self.tx.locked() = None;
        Ok(())
    }

    async fn media_request(
        &self,
        media: &clawft_channel_core::media::MediaRef,
    ) -> Result<clawft_channel_core::media::MediaRequest, ChannelError> {
        let held = self.files.locked();
        let f = held.iter().find(|h| h.id == media.id).ok_or_else(|| {
            ChannelError::Rejected(
                "the file is no longer held (the gateway restarted, or it was posted over an hour ago): post it again".into(),
            )
        })?;
        Ok(clawft_channel_core::media::MediaRequest {
            url: data_url(&f.mime, &f.bytes),
            headers: Vec::new(),
            trusted: true,
        })
    }

    async fn send(&self, msg: &OutboundMessage) -> Result<SentRef, ChannelError> {
        // Pages that are open see it at once; the transcript keeps it for the others.
        let _ = self.events.send(event_json(msg).to_string());
        Ok(SentRef::message(msg.id.clone()))
    }
}
