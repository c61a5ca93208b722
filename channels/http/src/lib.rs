//! The local HTTP API channel (axum): `POST /v1/chat` returns the final reply, `POST
//! /v1/chat/stream` streams it as SSE, `GET /healthz` / `/readyz`, and the admin routes
//! (`/v1/status`, `/v1/sessions`, `/v1/admin/*`, `/metrics`) served through the [`Admin`] trait,
//! and the OpenAI-compatible `POST /v1/chat/completions` and `GET /v1/models` ([`openai`]).
//!
//! Deny by default, on every bind, loopback included: the admin routes need a bearer token (the
//! gateway's control token, or the operator's `channels.http.token`); the chat routes need one
//! too unless the operator opted in to tokenless chat on a loopback bind
//! ([`HttpConfig::allow_loopback_without_token`]). Only `/healthz` and the bare status of
//! `/readyz` answer anyone. It binds a non-loopback address only with a configured token. It
//! knows nothing of sessions or the store; replies come back through [`Channel::send`],
//! correlated by the inbound event id.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clawft_channel_core::lock::MutexExt;
use clawft_channel_core::{
    now_ms, Ack, Capabilities, Channel, ChannelError, ChannelId, ChatId, InboundDelivery,
    InboundEvent, OutboundBody, OutboundKind, OutboundMessage, PlatformEventId, SentRef, Surface,
    UserId,
};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub mod mailbox;
pub mod openai;
pub mod tls;
#[cfg(feature = "ui")]
pub mod ui;
pub use mailbox::{MailEntry, MailStore, MemoryMail};
pub use openai::OPENAI_SENDER;
pub use tls::TlsListen;
#[cfg(feature = "ui")]
pub use ui::WebChannel;

/// Largest accepted request body (1 MiB), or more when `max_inbound_bytes` needs it (see
/// [`body_limit`]).
const MAX_BODY_BYTES: usize = 1024 * 1024;
/// What a build without the control UI answers where the UI would be.
pub const NO_UI: &str =
    "this build of weft has no control UI (it was built without the `ui` cargo feature)";
/// Messages kept per HTTP chat until acknowledged; beyond it the oldest are dropped.
pub const MAILBOX_PER_CHAT: usize = 1000;
/// Most messages one `GET /v1/chats/{chat_id}/messages` returns.
const MAILBOX_PAGE: usize = 100;
/// Interval of SSE keep-alive comments.
const SSE_KEEPALIVE: Duration = Duration::from_secs(15);

/// The sender of the messages the local `weft` CLI sends for the terminal's conversation: a
/// chat request with `"channel": "cli"`, admitted only with the gateway's control token. The
/// daemon files them under the session `cli:<chat_id>`, the one `weft agent` uses without a
/// gateway, so the terminal keeps one conversation whichever path serves it. A request that
/// names this sender itself is refused (400).
pub const TERMINAL_SENDER: &str = "weft-terminal";

/// Settings of the HTTP channel.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// Address to bind.
    pub bind: SocketAddr,
    /// The operator's bearer token (`channels.http.token`): admits every route; required for
    /// a non-loopback bind.
    pub token: Option<String>,
    /// The gateway's control token, generated at each start and handed to the local CLI
    /// through a 0600 file: admits every route, like `token`.
    pub control_token: Option<String>,
    /// Serve the chat routes (`/v1/chat`, `/v1/chat/stream`, `/v1/chats/*/messages`) to
    /// callers without a token. Loopback binds only; the admin routes always need a token.
    pub allow_loopback_without_token: bool,
    /// How long `POST /v1/chat` waits for the reply.
    pub reply_timeout: Duration,
    /// Channel id (`http`).
    pub channel_id: String,
    /// `channels.max_inbound_bytes`: a `content` longer than this is refused with 413 and
    /// [`clawft_channel_core::oversized_notice`], as the daemon refuses it on every channel.
    pub max_inbound_bytes: usize,
    /// The agents `POST /v1/chat/completions` may name as `agent:<name>` (listed by `GET
    /// /v1/models`); `main` (model `weft`) is always there.
    pub agents: Vec<String>,
    /// Host names the control UI answers for besides loopback and the bind address
    /// (`channels.http.ui_hosts`: the name a reverse proxy serves it under).
    pub ui_hosts: Vec<String>,
    /// A second listener serving the same routes over TLS (`channels.http.tls_*`).
    pub tls: Option<TlsListen>,
}

/// The request body bound for messages of up to `max_inbound_bytes`: JSON escaping can make
/// text up to six times longer (`\u0001`), plus room for the other fields; at least
/// [`MAX_BODY_BYTES`].
fn body_limit(max_inbound_bytes: usize) -> usize {
    max_inbound_bytes
        .saturating_mul(6)
        .saturating_add(64 * 1024)
        .max(MAX_BODY_BYTES)
}

/// Why the HTTP channel could not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// A non-loopback bind without a token.
    #[error("refusing to serve the HTTP API on non-loopback address {addr} without a bearer token: set channels.http.token (or token_env / token_file), or bind 127.0.0.1")]
    NonLoopbackWithoutToken {
        /// The address.
        addr: SocketAddr,
    },
    /// Tokenless chat asked for on a non-loopback bind.
    #[error("channels.http.allow_loopback_without_token = true is only accepted on a loopback bind, and the API binds {addr}: remove the key (clients then send channels.http.token), or bind 127.0.0.1")]
    OpenChatOnNonLoopback {
        /// The address.
        addr: SocketAddr,
    },
    /// The TLS certificate or key cannot be used.
    #[error("channels.http.{0}")]
    Tls(String),
    /// The address could not be bound.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
}

/// Why an admin request failed; the variant decides the HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminError {
    /// The request is wrong (unknown command, bad key, missing field): 400.
    #[error("{0}")]
    BadRequest(String),
    /// The daemon is not running yet: 503.
    #[error("{0}")]
    Unavailable(String),
    /// The daemon failed (the store): 500.
    #[error("{0}")]
    Internal(String),
}

impl AdminError {
    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            AdminError::BadRequest(_) => StatusCode::BAD_REQUEST,
            AdminError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            AdminError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// What the daemon exposes to the admin routes.
#[async_trait]
pub trait Admin: Send + Sync + 'static {
    /// `GET /v1/status`.
    async fn status(&self) -> Value;
    /// `GET /v1/sessions`.
    async fn sessions(&self) -> Result<Value, AdminError>;
    /// `GET /v1/sessions/{key}`; `None` is 404.
    async fn session(&self, key: &str) -> Result<Option<Value>, AdminError>;
    /// `DELETE /v1/sessions/{key}`; whether anything was stored.
    async fn clear_session(&self, key: &str) -> Result<bool, AdminError>;
    /// `GET /readyz`: `Ok` when ready (200), `Err` when not (503).
    async fn ready(&self) -> Result<Value, Value>;
    /// `POST /v1/admin/{name}` with a JSON body (`send`, `pairing/list`, `pairing/approve`,
    /// ...): `Err` is its status with the text.
    async fn command(&self, name: &str, _body: Value) -> Result<Value, AdminError> {
        Err(AdminError::BadRequest(format!(
            "unknown admin command `{name}`"
        )))
    }
    /// `GET /metrics`: the Prometheus text exposition.
    async fn metrics(&self) -> String {
        String::new()
    }
    /// `POST /v1/hooks/{name}`: a signed inbound webhook. No bearer token: the daemon checks the
    /// hook's own signature over the raw body. Answers its status and JSON body; 404 for a
    /// hook that is not configured.
    async fn hook(
        &self,
        name: &str,
        _headers: &header::HeaderMap,
        _body: axum::body::Bytes,
    ) -> (StatusCode, Value) {
        (
            StatusCode::NOT_FOUND,
            json!({ "error": format!("no webhook `{name}` is configured (hooks.{name} in the configuration)") }),
        )
    }
}

enum Waiter {
    /// `POST /v1/chat`: only the final reply.
    Once(oneshot::Sender<OutboundMessage>),
    /// `POST /v1/chat/stream`: deltas, progress and the final reply, and the approval
    /// questions for its chat (`chat`; `terminal`: the terminal's session `cli:<chat>`).
    Stream {
        tx: mpsc::Sender<OutboundMessage>,
        chat: String,
        terminal: bool,
    },
}

/// The question of `m` if it asks the user to approve a tool call.
fn approval_of(m: &OutboundMessage) -> Option<&clawft_channel_core::ApprovalAsk> {
    match &m.body {
        OutboundBody::Approval { ask, .. } => Some(ask),
        _ => None,
    }
}

#[derive(Default)]
struct Shared {
    waiters: HashMap<PlatformEventId, Waiter>,
}

struct Inner {
    cfg: HttpConfig,
    id: ChannelId,
    admin: Arc<dyn Admin>,
    /// The chats' mailboxes and the replies by request (see [`mailbox`]).
    mail: Arc<dyn MailStore>,
    shared: Mutex<Shared>,
    tx: Mutex<Option<mpsc::Sender<InboundDelivery>>>,
    seq: AtomicU64,
    shutdown: CancellationToken,
    /// The control UI's login links and sessions.
    #[cfg(feature = "ui")]
    ui: ui::Auth,
    /// The web chat the UI talks through.
    #[cfg(feature = "ui")]
    web: Arc<WebChannel>,
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.locked()
    }
}

/// The HTTP API channel.
pub struct HttpChannel {
    inner: Arc<Inner>,
    listener: Mutex<Option<std::net::TcpListener>>,
    addr: SocketAddr,
    /// The TLS listener and its settings, until it listens.
    tls: Mutex<Option<(std::net::TcpListener, Arc<rustls::ServerConfig>)>>,
    tls_addr: Option<SocketAddr>,
    /// Routes served on the same listener that authenticate on their own (the node hosts'
    /// WebSocket), added before the channel listens.
    extra: Mutex<Option<Router>>,
}

/// Bind `addr` now (non-blocking), so a bind error surfaces at start.
fn bind_std(addr: SocketAddr) -> Result<(std::net::TcpListener, SocketAddr), HttpError> {
    let bind = |source| HttpError::Bind { addr, source };
    let l = std::net::TcpListener::bind(addr).map_err(bind)?;
    l.set_nonblocking(true).map_err(bind)?;
    let local = l.local_addr().map_err(bind)?;
    Ok((l, local))
}

/// Removes a waiter when its request ends (reply, timeout or client gone).
struct WaiterGuard {
    inner: Arc<Inner>,
    id: PlatformEventId,
}

impl Drop for WaiterGuard {
    fn drop(&mut self) {
        self.inner.lock().waiters.remove(&self.id);
    }
}

impl HttpChannel {
    /// Validate the config and bind the listener now, so bind errors surface at startup. The
    /// mailboxes are kept in memory ([`Self::bind_with_mail`] keeps them in a store).
    ///
    /// # Errors
    /// A non-loopback bind without a token or with tokenless chat, or a bind failure.
    pub async fn bind(
        cfg: HttpConfig,
        admin: Arc<dyn Admin>,
    ) -> Result<Arc<HttpChannel>, HttpError> {
        Self::bind_with_mail(cfg, admin, Arc::new(MemoryMail::default())).await
    }

    /// [`Self::bind`] with the chats' mailboxes and the reply record kept in `mail`.
    ///
    /// # Errors
    /// As [`Self::bind`].
    pub async fn bind_with_mail(
        cfg: HttpConfig,
        admin: Arc<dyn Admin>,
        mail: Arc<dyn MailStore>,
    ) -> Result<Arc<HttpChannel>, HttpError> {
        // The TLS listener serves the same routes: the same rules for a non-loopback address.
        for addr in std::iter::once(cfg.bind).chain(cfg.tls.as_ref().map(|t| t.bind)) {
            if !addr.ip().is_loopback() {
                if cfg.token.as_deref().is_none_or(str::is_empty) {
                    return Err(HttpError::NonLoopbackWithoutToken { addr });
                }
                if cfg.allow_loopback_without_token {
                    return Err(HttpError::OpenChatOnNonLoopback { addr });
                }
            }
        }
        let tls = match &cfg.tls {
            Some(t) => {
                let config = tls::server_config(&t.cert, &t.key).map_err(HttpError::Tls)?;
                let (listener, addr) = bind_std(t.bind)?;
                Some((listener, config, addr))
            }
            None => None,
        };
        let (std_listener, addr) = bind_std(cfg.bind)?;
        let tls_addr = tls.as_ref().map(|t| t.2);
        Ok(Arc::new(HttpChannel {
            inner: Arc::new(Inner {
                id: ChannelId::new(cfg.channel_id.clone()),
                cfg,
                admin,
                mail,
                shared: Mutex::new(Shared::default()),
                tx: Mutex::new(None),
                seq: AtomicU64::new(0),
                shutdown: CancellationToken::new(),
                #[cfg(feature = "ui")]
                ui: ui::Auth::default(),
                #[cfg(feature = "ui")]
                web: Arc::new(WebChannel::new()),
            }),
            listener: Mutex::new(Some(std_listener)),
            tls: Mutex::new(tls.map(|(l, c, _)| (l, c))),
            tls_addr,
            extra: Mutex::new(None),
            addr,
        }))
    }

    /// The TLS listener's bound address, when it serves TLS.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls_addr
    }

    /// Keep the control UI's sessions in `store` (by the hash of their cookie only): they
    /// survive a restart, and `weft dashboard --revoke-all` removes them there too. Without
    /// it they live in memory.
    #[cfg(feature = "ui")]
    pub fn keep_ui_sessions(&self, store: Arc<dyn clawft_channel_core::StateStore>) {
        self.inner.ui.keep_in(store);
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serve `routes` on this listener too (before it listens). They bypass the bearer-token
    /// check: each must authenticate its callers itself.
    pub fn add_routes(&self, routes: Router) {
        let mut slot = self.extra.locked();
        *slot = Some(match slot.take() {
            Some(r) => r.merge(routes),
            None => routes,
        });
    }

    /// The web chat of the control UI (channel `web`), served on this listener: the daemon
    /// runs it like any other channel.
    #[cfg(feature = "ui")]
    pub fn web(&self) -> Arc<WebChannel> {
        self.inner.web.clone()
    }

    /// Pending reply waiters (for tests: none may leak).
    pub fn pending_waiters(&self) -> usize {
        self.inner.lock().waiters.len()
    }
}

fn err(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(json!({ "error": msg.into() }))).into_response()
}

/// A refused request: status and JSON body.
type Refusal = (StatusCode, Value);

fn refuse(status: StatusCode, msg: impl Into<String>) -> Refusal {
    (status, json!({ "error": msg.into() }))
}

/// An unknown route: 404 with a JSON body naming the routes, like every other error.
async fn not_found(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    err(
        StatusCode::NOT_FOUND,
        format!(
            "no route {method} {}: the API has POST /v1/chat, POST /v1/chat/stream, \
             GET /v1/chats/CHAT_ID/messages, POST /v1/chat/completions, GET /v1/models, GET /healthz, GET /readyz, POST /v1/hooks/NAME, GET /v1/status, \
             GET /v1/sessions, GET|DELETE /v1/sessions/KEY, POST /v1/admin/COMMAND, GET /metrics{}",
            uri.path(),
            if cfg!(feature = "ui") {
                ", and the control UI under /ui/"
            } else {
                " (this build has no control UI)"
            }
        ),
    )
}

/// A known route with another method: 405 with a JSON body.
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    err(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{method} is not allowed on {} (POST /v1/chat and /v1/chat/stream; GET for status, \
             sessions and mailboxes; DELETE /v1/sessions/KEY)",
            uri.path()
        ),
    )
}

fn router(inner: Arc<Inner>) -> Router {
    let chat = Router::new()
        .route("/v1/chat", post(chat))
        .route("/v1/chat/stream", post(chat_stream))
        .route("/v1/chats/{chat_id}/messages", get(mailbox))
        .route("/v1/chat/completions", post(openai::completions))
        .route("/v1/models", get(openai::models))
        .route_layer(middleware::from_fn_with_state(inner.clone(), auth_chat));
    let admin = Router::new()
        .route("/v1/status", get(status))
        .route("/v1/sessions", get(sessions))
        .route("/v1/sessions/{key}", get(session).delete(clear_session))
        .route("/v1/admin/{*name}", post(admin_command))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(inner.clone(), auth_admin));
    let r = Router::new()
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
        // Signed webhooks: authenticated by their signature, not a bearer token.
        .route("/v1/hooks/{name}", post(hook))
        .merge(chat)
        .merge(admin);
    #[cfg(feature = "ui")]
    let r = r.merge(ui::routes(inner.clone()));
    r.fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(body_limit(
            inner.cfg.max_inbound_bytes,
        )))
        .with_state(inner)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What the caller presented, judged against the tokens this API accepts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// No `Authorization` header.
    Anonymous,
    /// A bearer token that is neither the control token nor the configured one.
    BadToken,
    /// The control token or the configured token.
    Authenticated,
}

fn caller(inner: &Inner, headers: &header::HeaderMap) -> Caller {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Caller::Anonymous;
    };
    let given = value
        .to_str()
        .ok()
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map_or("", |(_, token)| token.trim());
    // Both candidates are compared, in constant time each, whichever matches.
    let mut ok = false;
    for t in [
        inner.cfg.control_token.as_deref(),
        inner.cfg.token.as_deref(),
    ]
    .into_iter()
    .flatten()
    .filter(|t| !t.is_empty())
    {
        ok |= !given.is_empty() && constant_time_eq(given.as_bytes(), t.as_bytes());
    }
    if ok {
        Caller::Authenticated
    } else {
        Caller::BadToken
    }
}

fn unauthorized(msg: &str) -> Response {
    let mut r = err(StatusCode::UNAUTHORIZED, msg);
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    r
}

/// What a refused admin request is told.
const ADMIN_UNAUTHORIZED: &str = "missing or invalid bearer token: the admin routes need `Authorization: Bearer <token>` with channels.http.token, or the gateway's control token (written at each start to control.json in the gateway's store directory, mode 0600; the `weft` commands use it by themselves)";
/// What a refused chat request is told when no token is configured.
const CHAT_NEEDS_OPT_IN: &str = "missing bearer token: set channels.http.token (or token_env / token_file) and send `Authorization: Bearer <token>`, or set channels.http.allow_loopback_without_token = true to let local programs chat without one (`weft agent` needs neither)";
/// What a refused chat request is told when a token is configured or a wrong one was sent.
const CHAT_UNAUTHORIZED: &str =
    "missing or invalid bearer token: send `Authorization: Bearer <channels.http.token>`";

/// The admin routes: always a token, whatever the bind.
async fn auth_admin(State(inner): State<Arc<Inner>>, req: Request, next: Next) -> Response {
    match caller(&inner, req.headers()) {
        Caller::Authenticated => next.run(req).await,
        Caller::Anonymous | Caller::BadToken => unauthorized(ADMIN_UNAUTHORIZED),
    }
}

/// The chat routes: a token, unless the operator opted in to tokenless chat on loopback (a
/// token that is sent is still checked).
async fn auth_chat(State(inner): State<Arc<Inner>>, req: Request, next: Next) -> Response {
    let open = inner.cfg.allow_loopback_without_token && inner.cfg.bind.ip().is_loopback();
    // OpenAI's clients read OpenAI's error object.
    let openai = matches!(req.uri().path(), "/v1/chat/completions" | "/v1/models");
    let refuse = |msg: &str| {
        if openai {
            let mut r = openai::ApiError::unauthorized(msg).into_response();
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            r
        } else {
            unauthorized(msg)
        }
    };
    match caller(&inner, req.headers()) {
        Caller::Authenticated => next.run(req).await,
        Caller::Anonymous if open => next.run(req).await,
        Caller::Anonymous if inner.cfg.token.as_deref().is_none_or(str::is_empty) => {
            refuse(CHAT_NEEDS_OPT_IN)
        }
        Caller::Anonymous | Caller::BadToken => refuse(CHAT_UNAUTHORIZED),
    }
}

/// Readiness for anyone (probes, load balancers): the status code and `status`; the details
/// (channels, providers, MCP servers) only for an authenticated caller.
async fn readyz(State(inner): State<Arc<Inner>>, headers: header::HeaderMap) -> Response {
    let full = caller(&inner, &headers) == Caller::Authenticated;
    let shown = |v: Value| {
        if full {
            v
        } else {
            json!({ "status": v.get("status").cloned().unwrap_or(Value::Null) })
        }
    };
    match inner.admin.ready().await {
        Ok(v) => Json(shown(v)).into_response(),
        Err(v) => (StatusCode::SERVICE_UNAVAILABLE, Json(shown(v))).into_response(),
    }
}

async fn status(State(inner): State<Arc<Inner>>) -> Response {
    Json(inner.admin.status().await).into_response()
}

async fn sessions(State(inner): State<Arc<Inner>>) -> Response {
    match inner.admin.sessions().await {
        Ok(v) => Json(v).into_response(),
        Err(e) => err(e.status(), e.to_string()),
    }
}

async fn session(State(inner): State<Arc<Inner>>, Path(key): Path<String>) -> Response {
    match inner.admin.session(&key).await {
        Ok(Some(v)) => Json(v).into_response(),
        Ok(None) => err(StatusCode::NOT_FOUND, format!("no session `{key}`")),
        Err(e) => err(e.status(), e.to_string()),
    }
}

async fn clear_session(State(inner): State<Arc<Inner>>, Path(key): Path<String>) -> Response {
    match inner.admin.clear_session(&key).await {
        Ok(b) => Json(json!({ "cleared": b })).into_response(),
        Err(e) => err(e.status(), e.to_string()),
    }
}

async fn hook(
    State(inner): State<Arc<Inner>>,
    Path(name): Path<String>,
    headers: header::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let (status, v) = inner.admin.hook(&name, &headers, body).await;
    (status, Json(v)).into_response()
}

async fn metrics(State(inner): State<Arc<Inner>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        inner.admin.metrics().await,
    )
        .into_response()
}

async fn admin_command(
    State(inner): State<Arc<Inner>>,
    Path(name): Path<String>,
    body: Option<Json<Value>>,
) -> Response {
    let body = body.map_or(Value::Null, |Json(v)| v);
    #[cfg(feature = "ui")]
    if let Some(r) = ui::admin_command(&inner, &name, &body) {
        return r;
    }
    #[cfg(not(feature = "ui"))]
    if name.starts_with("ui/") {
        return err(StatusCode::NOT_FOUND, NO_UI);
    }
    match inner.admin.command(&name, body).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => err(e.status(), e.to_string()),
    }
}

/// The query of `GET /v1/chats/{chat_id}/messages`.
#[derive(serde::Deserialize)]
struct MailQuery {
    /// Acknowledge every message up to this `seq` (they are removed), then list the later ones.
    after: Option<u64>,
    /// At most this many (100).
    limit: Option<usize>,
}

/// `GET /v1/chats/{chat_id}/messages[?after=SEQ][&limit=N]`: the chat's waiting messages,
/// oldest first; `after` acknowledges what the reader has (see [`mailbox`]).
async fn mailbox(
    State(inner): State<Arc<Inner>>,
    Path(chat_id): Path<String>,
    query: Result<axum::extract::Query<MailQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(axum::extract::Query(q)) = query else {
        return err(
            StatusCode::BAD_REQUEST,
            "the query may hold `after` (the last `seq` you have: it and everything before it are acknowledged and removed) and `limit` (1-100), both whole numbers",
        );
    };
    let limit = q.limit.unwrap_or(MAILBOX_PAGE).clamp(1, MAILBOX_PAGE);
    let after = q.after.unwrap_or(0);
    let listed = (|| {
        if after > 0 {
            inner.mail.ack(&chat_id, after)?;
        }
        inner.mail.list(&chat_id, after, limit)
    })();
    match listed {
        Ok(entries) => {
            let next = entries.last().map_or(after, |e| e.seq);
            let msgs: Vec<Value> = entries
                .into_iter()
                .map(|e| {
                    let mut v =
                        json!({"seq": e.seq, "id": e.id, "kind": e.kind, "content": e.content});
                    if let Some(r) = e.in_reply_to {
                        v["in_reply_to"] = json!(r);
                    }
                    v
                })
                .collect();
            Json(json!({ "messages": msgs, "next_after": next })).into_response()
        }
        Err(e) => err(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the mailbox cannot be read now ({e}); nothing was removed, try again"),
        ),
    }
}

/// What a mailbox keeps of `m`.
fn mail_entry(m: &OutboundMessage) -> MailEntry {
    MailEntry {
        seq: 0,
        id: m.id.clone(),
        // The kind's own wire name (`final`, `error`), as the mailbox always showed it.
        kind: serde_json::to_value(m.kind())
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        content: m.text().to_string(),
        in_reply_to: m.in_reply_to.as_ref().map(|r| r.as_str().to_string()),
        at_ms: now_ms(),
    }
}

/// A parsed chat request.
struct ChatReq {
    chat_id: String,
    content: String,
    event_id: Option<String>,
    sender: Option<String>,
    /// `"channel": "cli"`: the terminal's session (control token only).
    terminal: bool,
}

/// Whether the caller presented the gateway's control token (the local `weft` CLI), as
/// opposed to the operator's token or none.
fn is_control(inner: &Inner, headers: &header::HeaderMap) -> bool {
    let Some(control) = inner.cfg.control_token.as_deref().filter(|t| !t.is_empty()) else {
        return false;
    };
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .is_some_and(|(_, t)| constant_time_eq(t.trim().as_bytes(), control.as_bytes()))
}

/// Refuse a request for the terminal's sessions from anyone but the local CLI.
fn check_terminal(
    inner: &Inner,
    headers: &header::HeaderMap,
    req: &ChatReq,
) -> Result<(), Refusal> {
    if req.terminal && !is_control(inner, headers) {
        return Err(refuse(
            StatusCode::FORBIDDEN,
            "`\"channel\": \"cli\"` addresses the terminal's sessions (`cli:*`), which only the local `weft` CLI may write to (with the gateway's control token); drop `channel` to use this API's own sessions (`http:<chat_id>`)",
        ));
    }
    Ok(())
}

/// The request of `POST /v1/chat[/stream]`; a body over the limit and a `content` over
/// `max_inbound_bytes` are 413 with the notice every channel gives.
fn parse_chat(
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
    max_inbound_bytes: usize,
) -> Result<ChatReq, Refusal> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "The request body is over {} bytes. One message may hold at most {} KB of text: send it in shorter parts, or as a link to the text.",
                    body_limit(max_inbound_bytes),
                    max_inbound_bytes / 1024
                ),
            )
        } else {
            refuse(e.status(), e.body_text())
        }
    })?;
    let v: Value = serde_json::from_slice(&body).map_err(|e| {
        refuse(
            StatusCode::BAD_REQUEST,
            format!("body must be JSON like {{\"chat_id\": \"...\", \"content\": \"...\"}}: {e}"),
        )
    })?;
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let chat_id = s("chat_id").filter(|c| !c.is_empty()).ok_or_else(|| {
        refuse(
            StatusCode::BAD_REQUEST,
            "`chat_id` must be a non-empty string",
        )
    })?;
    let content = s("content")
        .ok_or_else(|| refuse(StatusCode::BAD_REQUEST, "`content` must be a string"))?;
    let terminal = match v.get("channel") {
        None | Some(Value::Null) => false,
        Some(Value::String(c)) if Surface::of(c) == Some(Surface::Terminal) => true,
        Some(other) => {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                format!("`channel` may only be \"cli\" (the terminal's sessions, for the local `weft` CLI), got {other}"),
            ))
        }
    };
    let sender = s("sender").filter(|e| !e.is_empty());
    if sender.as_deref() == Some(TERMINAL_SENDER) {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            format!("`sender` \"{TERMINAL_SENDER}\" is reserved for the local `weft` CLI; choose another"),
        ));
    }
    if sender.as_deref() == Some(OPENAI_SENDER) {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            format!("`sender` \"{OPENAI_SENDER}\" is reserved for POST /v1/chat/completions; choose another"),
        ));
    }
    if content.len() > max_inbound_bytes {
        return Err(refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            clawft_channel_core::oversized_notice(content.len(), max_inbound_bytes),
        ));
    }
    Ok(ChatReq {
        chat_id,
        content,
        event_id: s("event_id").filter(|e| !e.is_empty()),
        sender,
        terminal,
    })
}

/// A request the journal took, or had already taken.
struct Submitted {
    event_id: PlatformEventId,
    guard: WaiterGuard,
    /// A resent request (same `event_id`): its recorded reply when it has one already;
    /// otherwise the reply is still to come and reaches the waiter.
    replayed: Option<Option<MailEntry>>,
}

/// Register the waiter, deliver the event, and wait for the journal's ack.
async fn submit(inner: &Arc<Inner>, req: ChatReq, waiter: Waiter) -> Result<Submitted, Refusal> {
    if inner.shutdown.is_cancelled() {
        return Err(refuse(StatusCode::SERVICE_UNAVAILABLE, "shutting down"));
    }
    let event_id = PlatformEventId::new(req.event_id.unwrap_or_else(|| {
        format!(
            "h{:x}-{:x}-{:x}",
            now_ms(),
            std::process::id(),
            inner.seq.fetch_add(1, Ordering::Relaxed)
        )
    }));
    {
        let mut g = inner.lock();
        if g.waiters.contains_key(&event_id) {
            return Err((
                StatusCode::CONFLICT,
                json!({"error": "a request with this event_id is already waiting for its reply", "event_id": event_id}),
            ));
        }
        g.waiters.insert(event_id.clone(), waiter);
    }
    let guard = WaiterGuard {
        inner: inner.clone(),
        id: event_id.clone(),
    };
    let tx = inner.tx.locked().clone().ok_or_else(|| {
        refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "not accepting messages yet",
        )
    })?;
    let (delivery, ack) = InboundDelivery::new(InboundEvent {
        channel: inner.id.clone(),
        chat: ChatId::new(req.chat_id),
        thread: None,
        sender: UserId::new(if req.terminal {
            TERMINAL_SENDER.to_string()
        } else {
            req.sender.unwrap_or_else(|| "http".into())
        }),
        sender_name: None,
        event_id: event_id.clone(),
        content: req.content,
        received_at_ms: now_ms(),
        attachments: Vec::new(),
        origin: clawft_channel_core::Origin::User,
    });
    tx.send(delivery)
        .await
        .map_err(|_| refuse(StatusCode::SERVICE_UNAVAILABLE, "shutting down"))?;
    match ack.await {
        Ok(Ack::Accepted) => Ok(Submitted {
            event_id,
            guard,
            replayed: None,
        }),
        // Already journaled: the same request resent (event_id is the idempotency key). The
        // waiter is registered before the record is read, so a reply sent in between reaches
        // one or the other.
        Ok(Ack::Duplicate) => {
            let recorded = inner.mail.reply(event_id.as_str());
            Ok(Submitted {
                event_id,
                guard,
                replayed: Some(recorded),
            })
        }
        Ok(Ack::Rejected(why)) => Err(refuse(StatusCode::FORBIDDEN, why)),
        Ok(Ack::Unavailable(why)) => Err(refuse(StatusCode::SERVICE_UNAVAILABLE, why)),
        Err(_) => Err(refuse(StatusCode::SERVICE_UNAVAILABLE, "shutting down")),
    }
}

async fn chat(
    State(inner): State<Arc<Inner>>,
    headers: header::HeaderMap,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let req = match parse_chat(body, inner.cfg.max_inbound_bytes)
        .and_then(|r| check_terminal(&inner, &headers, &r).map(|()| r))
    {
        Ok(r) => r,
        Err((status, v)) => return (status, Json(v)).into_response(),
    };
    let chat_id = req.chat_id.clone();
    let (tx, rx) = oneshot::channel();
    let Submitted {
        event_id,
        guard: _guard,
        replayed,
    } = match submit(&inner, req, Waiter::Once(tx)).await {
        Ok(x) => x,
        Err((status, v)) => return (status, Json(v)).into_response(),
    };
    if let Some(Some(reply)) = &replayed {
        return if reply.kind == "error" {
            (
                StatusCode::BAD_GATEWAY,
                Json(json!({"error": reply.content, "event_id": event_id, "replayed": true})),
            )
                .into_response()
        } else {
            Json(json!({"chat_id": chat_id, "event_id": event_id, "reply": reply.content, "replayed": true}))
                .into_response()
        };
    }
    let shutdown = inner.shutdown.clone();
    // Biased: a reply already delivered wins over a shutdown that fires in the same instant
    // (the daemon delivers replies before it stops the channel).
    tokio::select! {
        biased;
        r = tokio::time::timeout(inner.cfg.reply_timeout, rx) => match r {
            Ok(Ok(m)) if m.kind() == OutboundKind::Final => {
                Json(json!({"chat_id": chat_id, "event_id": event_id, "reply": m.text()})).into_response()
            }
            Ok(Ok(OutboundMessage { body: OutboundBody::Error { text, reason: clawft_channel_core::ErrorReason::OverBudget }, .. })) => (
                StatusCode::TOO_MANY_REQUESTS,
                Json(json!({"error": text, "event_id": event_id})),
            )
                .into_response(),
            Ok(Ok(m)) => (
                StatusCode::BAD_GATEWAY,
                Json(json!({"error": m.text(), "event_id": event_id})),
            )
                .into_response(),
            Ok(Err(_)) => err(StatusCode::SERVICE_UNAVAILABLE, "shutting down"),
            Err(_) => (
                StatusCode::GATEWAY_TIMEOUT,
                Json(json!({
                    "error": format!("no reply within {}s; the message is stored and will still be processed", inner.cfg.reply_timeout.as_secs()),
                    "event_id": event_id,
                })),
            )
                .into_response(),
        },
        () = shutdown.cancelled() => err(StatusCode::SERVICE_UNAVAILABLE, "shutting down"),
    }
}

fn sse_event(m: &OutboundMessage) -> Event {
    if let (OutboundBody::Approval { text, ask }, None) = (&m.body, &m.in_reply_to) {
        let data = json!({"id": ask.approval_id, "command": ask.command, "text": text});
        return Event::default().event("approval").data(data.to_string());
    }
    let (name, data) = match m.kind() {
        // A restart withdraws the deltas received so far (the answer is asked for again).
        OutboundKind::Delta if m.is_restart() => ("delta", json!({"text": "", "restart": true})),
        OutboundKind::Delta => ("delta", json!({"text": m.text()})),
        OutboundKind::Progress => (
            "progress",
            match &m.body {
                OutboundBody::Progress(p) => serde_json::to_value(p).unwrap_or_default(),
                _ => json!({"text": m.text()}),
            },
        ),
        OutboundKind::Final => (
            "done",
            json!({"reply": m.text(), "event_id": m.in_reply_to}),
        ),
        OutboundKind::Error => (
            "error",
            json!({"error": m.text(), "event_id": m.in_reply_to}),
        ),
    };
    Event::default().event(name).data(data.to_string())
}

async fn chat_stream(
    State(inner): State<Arc<Inner>>,
    headers: header::HeaderMap,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let submitted = match parse_chat(body, inner.cfg.max_inbound_bytes)
        .and_then(|r| check_terminal(&inner, &headers, &r).map(|()| r))
    {
        Ok(req) => {
            let (tx, rx) = mpsc::channel::<OutboundMessage>(256);
            let waiter = Waiter::Stream {
                tx,
                chat: req.chat_id.clone(),
                terminal: req.terminal,
            };
            submit(&inner, req, waiter).await.map(|s| (s, rx))
        }
        Err(r) => Err(r),
    };
    let (
        Submitted {
            guard, replayed, ..
        },
        mut rx,
    ) = match submitted {
        Ok(x) => x,
        Err((status, v)) => {
            // Refusals become a single error event, so stream clients need one code path.
            let e = Event::default()
                .event("error")
                .data(json!({"error": v["error"], "status": status.as_u16()}).to_string());
            let s = futures::stream::iter([Ok::<_, Infallible>(e)]);
            return Sse::new(s).into_response();
        }
    };
    if let Some(Some(reply)) = replayed {
        // A resent request already answered: its recorded reply, as the one closing event.
        let e = if reply.kind == "error" {
            Event::default().event("error").data(
                json!({"error": reply.content, "event_id": reply.in_reply_to, "replayed": true})
                    .to_string(),
            )
        } else {
            Event::default().event("done").data(
                json!({"reply": reply.content, "event_id": reply.in_reply_to, "replayed": true})
                    .to_string(),
            )
        };
        drop(guard);
        return Sse::new(futures::stream::iter([Ok::<_, Infallible>(e)])).into_response();
    }
    let shutdown = inner.shutdown.clone();
    let stream = async_stream(move |yield_tx| async move {
        let _guard = guard;
        loop {
            tokio::select! {
                biased;
                m = rx.recv() => {
                    let Some(m) = m else { break };
                    let last = m.kind().is_durable() && m.in_reply_to.is_some();
                    if yield_tx.send(sse_event(&m)).await.is_err() || last {
                        break;
                    }
                }
                () = shutdown.cancelled() => {
                    let _ = yield_tx
                        .send(Event::default().event("error").data(json!({"error": "shutting down"}).to_string()))
                        .await;
                    break;
                }
            }
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(SSE_KEEPALIVE))
        .into_response()
}

/// A stream fed by a task (no extra dependency on an async-stream macro crate).
fn async_stream<F, Fut>(f: F) -> impl futures::Stream<Item = Result<Event, Infallible>>
where
    F: FnOnce(mpsc::Sender<Event>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Event>(16);
    tokio::spawn(f(tx));
    futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|e| (Ok(e), rx)) },
    )
}

impl HttpChannel {
    /// Keep `msg` in its chat's mailbox until the reader acknowledges it.
    fn keep(&self, msg: &OutboundMessage) -> Result<SentRef, ChannelError> {
        self.inner
            .mail
            .append(msg.chat.as_str(), mail_entry(msg), MAILBOX_PER_CHAT)
            .map_err(|e| ChannelError::Transient(format!("mailbox: {e}")))?;
        Ok(SentRef::message(msg.id.clone()))
    }
}

#[async_trait]
impl Channel for HttpChannel {
    fn id(&self) -> &ChannelId {
        &self.inner.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            streaming: true,
            progress: true,
            max_message_bytes: MAX_BODY_BYTES,
            max_upload_bytes: 0,
        }
    }

    async fn listen(
        &self,
        tx: mpsc::Sender<InboundDelivery>,
        cancel: CancellationToken,
    ) -> Result<(), ChannelError> {
        let std_listener = self
            .listener
            .locked()
            .take()
            .ok_or_else(|| ChannelError::Fatal("listener already consumed".into()))?;
        let listener = tokio::net::TcpListener::from_std(std_listener)
            .map_err(|e| ChannelError::Fatal(format!("listener: {e}")))?;
        *self.inner.tx.locked() = Some(tx);
        let mut app = router(self.inner.clone());
        if let Some(extra) = self.extra.locked().take() {
            app = app.merge(extra);
        }
        let shutdown = self.inner.shutdown.clone();
        let stop = cancel.clone();
        let tls_serve = match self.tls.locked().take() {
            Some((std_listener, config)) => {
                let tcp = tokio::net::TcpListener::from_std(std_listener)
                    .map_err(|e| ChannelError::Fatal(format!("TLS listener: {e}")))?;
                let listener = tls::TlsListener::start(tcp, config, cancel.child_token())
                    .map_err(|e| ChannelError::Fatal(format!("TLS listener: {e}")))?;
                tracing::info!(addr = ?self.tls_addr, "HTTP API listening with TLS");
                // What came through this listener came over TLS, whatever the client says.
                let app =
                    app.clone()
                        .layer(middleware::map_request(|mut req: Request| async move {
                            req.headers_mut().insert(
                                "x-forwarded-proto",
                                axum::http::HeaderValue::from_static("https"),
                            );
                            req
                        }));
                let stop = cancel.clone();
                Some(
                    axum::serve(listener, app).with_graceful_shutdown(async move {
                        stop.cancelled().await;
                    }),
                )
            }
            None => None,
        };
        tracing::info!(addr = %self.addr, "HTTP API listening");
        let plain = axum::serve(listener, app).with_graceful_shutdown(async move {
            stop.cancelled().await;
            // Waiting requests are answered 503 so graceful shutdown can finish.
            shutdown.cancel();
        });
        use std::future::IntoFuture as _;
        let (r, r_tls) = match tls_serve {
            Some(t) => {
                let (a, b) = tokio::join!(plain.into_future(), t.into_future());
                (a, b.map_err(|e| format!("HTTPS server: {e}")))
            }
            None => (plain.await, Ok(())),
        };
        *self.inner.tx.locked() = None;
        r.map_err(|e| ChannelError::Fatal(format!("HTTP server: {e}")))?;
        r_tls.map_err(ChannelError::Fatal)
    }

    async fn send(&self, msg: &OutboundMessage) -> Result<SentRef, ChannelError> {
        let Some(reply_to) = &msg.in_reply_to else {
            // An approval question also goes to the streams open for its chat, where the
            // person who asked is waiting; one for the terminal only there.
            if let Some(ask) = approval_of(msg) {
                let terminal = ask.terminal;
                let streams: Vec<mpsc::Sender<OutboundMessage>> = self
                    .inner
                    .lock()
                    .waiters
                    .values()
                    .filter_map(|w| match w {
                        Waiter::Stream {
                            tx,
                            chat,
                            terminal: t,
                        } if chat == msg.chat.as_str() && *t == terminal => Some(tx.clone()),
                        Waiter::Stream { .. } | Waiter::Once(_) => None,
                    })
                    .collect();
                for tx in streams {
                    let _ = tx.send(msg.clone()).await;
                }
                if terminal {
                    return Ok(SentRef::message(msg.id.clone()));
                }
            }
            // A proactive message: keep it for `GET /v1/chats/{chat_id}/messages`.
            return self.keep(msg);
        };
        if msg.kind().is_durable() {
            // Recorded before any waiter is looked up: a request resent with this event_id
            // registers its waiter first and reads the record second, so it sees one or the
            // other (see `chat`).
            self.inner
                .mail
                .put_reply(reply_to.as_str(), &mail_entry(msg))
                .map_err(|e| ChannelError::Transient(format!("reply record: {e}")))?;
        }
        let stream_tx = {
            let mut g = self.inner.lock();
            match g.waiters.get(reply_to) {
                Some(Waiter::Stream { tx, .. }) => tx.clone(),
                Some(Waiter::Once(_)) if !msg.kind().is_durable() => {
                    // A plain request does not want deltas or progress.
                    return Ok(SentRef::message(msg.id.clone()));
                }
                Some(Waiter::Once(_)) => {
                    let sent = match g.waiters.remove(reply_to) {
                        Some(Waiter::Once(tx)) => tx.send(msg.clone()).is_ok(),
                        _ => false,
                    };
                    drop(g);
                    // The client left in the meantime: the reply waits in the mailbox.
                    return if sent {
                        Ok(SentRef::message(msg.id.clone()))
                    } else {
                        self.keep(msg)
                    };
                }
                None if msg.kind().is_durable() => {
                    drop(g);
                    // The request was cut off (a crash, a timeout, the client gone): the
                    // reply waits in the chat's mailbox.
                    return self.keep(msg);
                }
                None => {
                    return Err(ChannelError::Gone(format!(
                        "no request waiting for {reply_to}"
                    )))
                }
            }
        };
        match stream_tx.send(msg.clone()).await {
            Ok(()) => Ok(SentRef::message(msg.id.clone())),
            Err(_) if msg.kind().is_durable() => self.keep(msg),
            Err(_) => Err(ChannelError::Gone("stream closed".into())),
        }
    }
}

#[cfg(test)]
mod tests;
