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
//! every session.
//!
//! The web chat is a channel of its own, [`WebChannel`] (`web`): the page posts to it and
//! reads its replies, deltas and approval questions from an SSE stream.

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
    InboundEvent, OutboundBody, OutboundKind, OutboundMessage, PlatformEventId, SentRef, UserId,
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
pub const WEB_CHANNEL: &str = "web";
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
];

/// What a UI session may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

struct Session {
    csrf: String,
    role: Role,
    created_ms: u64,
    expires_ms: u64,
}

/// Login links and sessions (in memory: a restart logs everyone out).
#[derive(Default)]
pub(crate) struct Auth {
    links: Mutex<HashMap<String, Link>>,
    sessions: Mutex<HashMap<String, Session>>,
}

/// 32 random bytes from the OS, as hex.
fn random_hex() -> std::io::Result<String> {
    use std::io::Read;
    let mut buf = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

impl Auth {
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
        let id = random_hex()?;
        let csrf = random_hex()?;
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
            id.clone(),
            Session {
                csrf: csrf.clone(),
                role,
                created_ms: now,
                expires_ms: now + SESSION_TTL.as_millis() as u64,
            },
        );
        Ok((id, csrf))
    }

    /// The live session of this cookie value: (role, CSRF token).
    fn session(&self, id: &str) -> Option<(Role, String)> {
        let now = now_ms();
        let s = self.sessions.locked();
        s.iter()
            .find(|(k, x)| x.expires_ms > now && constant_time_eq(k.as_bytes(), id.as_bytes()))
            .map(|(_, x)| (x.role, x.csrf.clone()))
    }

    fn end(&self, id: &str) {
        self.sessions.locked().remove(id);
    }

    /// End every session and unused link; how many sessions there were.
    pub(crate) fn revoke_all(&self) -> usize {
        self.links.locked().clear();
        let mut s = self.sessions.locked();
        let n = s.len();
        s.clear();
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

async fn me(req: Request) -> Response {
    let w = who(req.extensions());
    Json(json!({
        "role": w.as_ref().map(|w| w.role.as_str()),
        "csrf": w.and_then(|w| w.csrf),
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

/// `POST /ui/api/chat {"chat", "content"}`: a message in the web chat `chat`.
async fn chat(State(inner): State<Arc<Inner>>, req: Request) -> Response {
    if let Err(r) = operator(&who(req.extensions())) {
        return *r;
    }
    let body = match axum::body::to_bytes(
        req.into_body(),
        crate::body_limit(inner.cfg.max_inbound_bytes),
    )
    .await
    {
        Ok(b) => serde_json::from_slice::<Value>(&b).unwrap_or(Value::Null),
        Err(_) => return err(StatusCode::PAYLOAD_TOO_LARGE, "message too large"),
    };
    let chat = body["chat"].as_str().unwrap_or("main").trim().to_string();
    let content = body["content"].as_str().unwrap_or("").to_string();
    if chat.is_empty() || chat.contains(':') || chat.len() > 64 || content.trim().is_empty() {
        return err(
            StatusCode::BAD_REQUEST,
            "`chat` (up to 64 characters, without `:`) and a non-empty `content` are required",
        );
    }
    if content.len() > inner.cfg.max_inbound_bytes {
        return err(
            StatusCode::PAYLOAD_TOO_LARGE,
            clawft_channel_core::oversized_notice(content.len(), inner.cfg.max_inbound_bytes),
        );
    }
    match inner.web.submit(&chat, content).await {
        Ok(id) => Json(json!({"chat": chat, "event_id": id})).into_response(),
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
}

impl WebChannel {
    pub(crate) fn new() -> Self {
        Self {
            id: ChannelId::new(WEB_CHANNEL),
            tx: Mutex::new(None),
            events: broadcast::channel(512).0,
            seq: AtomicU64::new(0),
        }
    }

    async fn submit(&self, chat: &str, content: String) -> Result<String, (StatusCode, String)> {
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
            event_id: PlatformEventId::new(event_id.clone()),
            content,
            received_at_ms: now_ms(),
            attachments: Vec::new(),
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

    async fn send(&self, msg: &OutboundMessage) -> Result<SentRef, ChannelError> {
        // Pages that are open see it at once; the transcript keeps it for the others.
        let _ = self.events.send(event_json(msg).to_string());
        Ok(SentRef(msg.id.clone()))
    }
}
