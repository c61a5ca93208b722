//! The MCP client side: [`McpManager`] connects every configured server in the background,
//! keeps each one's state (connecting / connected / reconnecting / failed), health-checks it,
//! reconnects with backoff, and offers the servers' tools to the [`ToolRegistry`] as
//! [`ToolSource`] (`{server}__{tool}`). It never blocks startup, and a call to a server that is
//! down fails at once with the reason.
//!
//! [`ToolRegistry`]: crate::tools::ToolRegistry

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, ClientRequest, Implementation,
    PingRequest, ProtocolVersion,
};
use rmcp::service::{NotificationContext, Peer, PeerRequestOptions, RoleClient, ServiceError};
use rmcp::ClientHandler;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::child::{self, ChildGuard, StderrTail};
use super::config::{McpServerSettings, McpTransport};
use super::http;
use super::sse;
use crate::net::ssrf::SsrfPolicy;
use crate::tools::registry::{SourcedTool, ToolSource};
use crate::tools::{Effect, Tool, ToolContext, ToolError};

/// Longest tool name handed to the model (OpenAI and Anthropic accept 64).
const MAX_TOOL_NAME: usize = 64;
/// Longest tool description kept (bytes).
const MAX_DESCRIPTION: usize = 4096;
/// Most tools taken from one server.
const MAX_TOOLS_PER_SERVER: usize = 256;

/// Timing of the manager (seed 004 §7 defaults); tests shorten them.
#[derive(Clone, Debug)]
pub struct McpOptions {
    /// Interval of the `ping` health check (default 30 s).
    pub health_interval: Duration,
    /// Deadline of one `ping` (default 10 s).
    pub ping_timeout: Duration,
    /// First reconnect delay (default 2 s), doubled per attempt …
    pub backoff_initial: Duration,
    /// … up to this (default 60 s).
    pub backoff_max: Duration,
    /// Reconnect attempts before the server is `failed` until restarted (default 10).
    pub max_attempts: u32,
    /// Grace between SIGTERM and SIGKILL when a stdio server is stopped (default 1 s).
    pub stop_grace: Duration,
    /// The SSRF policy of untrusted URL servers (default: only public addresses).
    pub ssrf: Arc<SsrfPolicy>,
}

impl Default for McpOptions {
    fn default() -> Self {
        Self {
            health_interval: Duration::from_secs(30),
            ping_timeout: Duration::from_secs(10),
            backoff_initial: Duration::from_secs(2),
            backoff_max: Duration::from_secs(60),
            max_attempts: 10,
            stop_grace: Duration::from_secs(1),
            ssrf: Arc::new(SsrfPolicy::default()),
        }
    }
}

impl McpOptions {
    fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(1).min(16);
        self.backoff_initial
            .saturating_mul(factor)
            .min(self.backoff_max)
    }
}

/// Where a server stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum McpState {
    /// First connection in progress.
    Connecting,
    /// Initialized; its tools are offered.
    Connected,
    /// Lost or never reached; retrying with backoff (`attempt`).
    Reconnecting,
    /// Given up (or misconfigured) until `restart`.
    Failed,
}

/// One server's state, for `weft status` and `weft mcp list`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct McpServerStatus {
    /// Server name.
    pub name: String,
    /// `stdio`, `http` (streamable HTTP) or `sse` (the legacy HTTP+SSE transport a URL
    /// server fell back to).
    pub transport: &'static str,
    /// Command line, or URL without credentials and query.
    pub target: String,
    /// State.
    pub state: McpState,
    /// Number of tools offered (kept while reconnecting).
    pub tools: usize,
    /// Reconnect attempt in progress (when `reconnecting`).
    pub attempt: Option<u32>,
    /// The last error (why it is reconnecting or failed).
    pub last_error: Option<String>,
    /// Whether its tools are hidden unless a skill exposes them.
    pub internal_only: bool,
    /// Process id of a running stdio server.
    pub pid: Option<u32>,
}

impl fmt::Display for McpServerStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.state {
            McpState::Connecting => write!(f, "connecting"),
            McpState::Connected => write!(f, "connected ({} tools)", self.tools),
            McpState::Reconnecting => write!(
                f,
                "reconnecting (attempt {}): {}",
                self.attempt.unwrap_or(0),
                self.last_error.as_deref().unwrap_or("-")
            ),
            McpState::Failed => write!(
                f,
                "failed: {}",
                self.last_error.as_deref().unwrap_or("unknown error")
            ),
        }
    }
}

struct SlotInner {
    state: McpState,
    attempt: u32,
    last_error: Option<String>,
    tools: Vec<Arc<McpTool>>,
    peer: Option<Peer<RoleClient>>,
    pid: Option<u32>,
    /// The transport of the current (or last) connection: `stdio`, `http` or `sse`.
    transport: &'static str,
}

/// One configured server.
struct Slot {
    settings: McpServerSettings,
    inner: Mutex<SlotInner>,
    restart: Notify,
    changed: Arc<watch::Sender<u64>>,
    tail: StderrTail,
}

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, SlotInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, f: impl FnOnce(&mut SlotInner)) {
        f(&mut self.lock());
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    fn name(&self) -> &str {
        &self.settings.name
    }

    fn status(&self) -> McpServerStatus {
        let g = self.lock();
        McpServerStatus {
            name: self.settings.name.clone(),
            transport: g.transport,
            target: self.settings.target(),
            state: g.state,
            tools: if matches!(g.state, McpState::Connected | McpState::Reconnecting) {
                g.tools.len()
            } else {
                0
            },
            attempt: (g.state == McpState::Reconnecting).then_some(g.attempt),
            last_error: g.last_error.clone(),
            internal_only: self.settings.internal_only,
            pid: g.pid,
        }
    }

    /// Why a call cannot be made now.
    fn down_message(&self) -> String {
        let g = self.lock();
        let name = self.name();
        let err = g.last_error.as_deref().unwrap_or("no details");
        match g.state {
            McpState::Connecting => {
                format!("MCP server {name} is still connecting; try again in a few seconds")
            }
            McpState::Reconnecting => {
                format!("MCP server {name} is reconnecting (attempt {}): {err}", g.attempt)
            }
            McpState::Failed => format!(
                "MCP server {name} has failed and is not retried until `weft mcp restart {name}`: {err}"
            ),
            McpState::Connected => format!("MCP server {name} is not connected"),
        }
    }
}

/// The MCP client manager: one background supervisor per server.
pub struct McpManager {
    slots: Vec<Arc<Slot>>,
    shutdown: CancellationToken,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    changed: watch::Receiver<u64>,
    options: Arc<McpOptions>,
}

impl fmt::Debug for McpManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpManager")
            .field("servers", &self.status())
            .finish_non_exhaustive()
    }
}

impl McpManager {
    /// Start connecting to every server in the background and return at once. Must be called
    /// inside a Tokio runtime. Servers with duplicate names are skipped (logged).
    pub fn start(servers: Vec<McpServerSettings>, options: McpOptions) -> Arc<Self> {
        let (tx, rx) = watch::channel(0u64);
        let tx = Arc::new(tx);
        let options = Arc::new(options);
        let shutdown = CancellationToken::new();
        let mut seen = BTreeSet::new();
        let mut slots = Vec::new();
        let mut tasks = Vec::new();
        for settings in servers {
            if !seen.insert(settings.name.clone()) {
                tracing::warn!(mcp_server = %settings.name, "duplicate MCP server name: skipped");
                continue;
            }
            let transport = settings.transport_kind();
            let slot = Arc::new(Slot {
                settings,
                inner: Mutex::new(SlotInner {
                    state: McpState::Connecting,
                    attempt: 0,
                    last_error: None,
                    tools: Vec::new(),
                    peer: None,
                    pid: None,
                    transport,
                }),
                restart: Notify::new(),
                changed: tx.clone(),
                tail: StderrTail::default(),
            });
            tasks.push(tokio::spawn(supervise(
                slot.clone(),
                options.clone(),
                shutdown.clone(),
            )));
            slots.push(slot);
        }
        Arc::new(Self {
            slots,
            shutdown,
            tasks: Mutex::new(tasks),
            changed: rx,
            options,
        })
    }

    /// The state of every server, in configuration order.
    pub fn status(&self) -> Vec<McpServerStatus> {
        self.slots.iter().map(|s| s.status()).collect()
    }

    /// Reconnect `name` now: a `failed` server is retried from attempt 0, a connected one is
    /// closed and reconnected, a waiting one skips its backoff.
    ///
    /// # Errors
    /// No server has that name.
    pub fn restart(&self, name: &str) -> Result<(), String> {
        match self.slots.iter().find(|s| s.name() == name) {
            Some(s) => {
                s.restart.notify_one();
                Ok(())
            }
            None => Err(format!(
                "no MCP server named `{name}`; configured: {}",
                self.slots
                    .iter()
                    .map(|s| s.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }

    /// Wait until `pred` holds for the statuses, or `timeout`. Returns whether it held.
    pub async fn wait_for(
        &self,
        pred: impl Fn(&[McpServerStatus]) -> bool,
        timeout: Duration,
    ) -> bool {
        let mut rx = self.changed.clone();
        let fut = async {
            loop {
                if pred(&self.status()) {
                    return;
                }
                if rx.changed().await.is_err() {
                    // Manager gone: nothing will change any more.
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::time::timeout(timeout, fut).await.is_ok()
    }

    /// Wait (up to `timeout`) until no server is still making its first connection; for
    /// `weft mcp list`. Returns whether that happened.
    pub async fn settle(&self, timeout: Duration) -> bool {
        self.wait_for(
            |st| st.iter().all(|s| s.state != McpState::Connecting),
            timeout,
        )
        .await
    }

    /// Close every connection and stop every server process (SIGTERM, then SIGKILL after
    /// the grace), and wait for it. Idempotent.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        let tasks: Vec<_> =
            std::mem::take(&mut *self.tasks.lock().unwrap_or_else(PoisonError::into_inner));
        let bound = self.options.stop_grace + Duration::from_secs(5);
        for t in tasks {
            let abort = t.abort_handle();
            if tokio::time::timeout(bound, t).await.is_err() {
                abort.abort();
            }
        }
    }
}

impl Drop for McpManager {
    fn drop(&mut self) {
        self.shutdown.cancel();
        // Aborting drops each supervisor's connection, whose child guard SIGKILLs the
        // server's process group synchronously.
        for t in self
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            t.abort();
        }
    }
}

impl ToolSource for McpManager {
    fn tools(&self) -> Vec<SourcedTool> {
        let mut out = Vec::new();
        for s in &self.slots {
            let g = s.lock();
            if matches!(g.state, McpState::Connected | McpState::Reconnecting) {
                out.extend(g.tools.iter().map(|t| SourcedTool {
                    tool: t.clone() as Arc<dyn Tool>,
                    internal: s.settings.internal_only,
                }));
            }
        }
        out
    }
}

/// Tells the supervisor about `notifications/tools/list_changed`.
#[derive(Clone)]
struct Handler {
    list_changed: Arc<Notify>,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("clawft", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed.notify_one();
    }
}

/// A live connection.
struct Conn {
    peer: Peer<RoleClient>,
    ct: CancellationToken,
    /// The service task; `None` once it has been awaited to the end.
    done: Option<JoinHandle<()>>,
    child: Option<ChildGuard>,
    list_changed: Arc<Notify>,
}

impl Conn {
    async fn close(mut self, grace: Duration) {
        self.ct.cancel();
        if let Some(done) = self.done.take() {
            let _ = tokio::time::timeout(Duration::from_secs(2), done).await;
        }
        if let Some(c) = self.child.take() {
            c.terminate(grace).await;
        }
    }
}

enum ConnectError {
    /// Retrying cannot help (missing program, refused address).
    Permanent(String),
    /// Worth retrying.
    Transient(String),
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

async fn connect(slot: &Arc<Slot>, opts: &McpOptions) -> Result<Conn, ConnectError> {
    let list_changed = Arc::new(Notify::new());
    let handler = Handler {
        list_changed: list_changed.clone(),
    };
    let ct = CancellationToken::new();
    let init = slot.settings.init_timeout;
    let name = slot.name().to_string();
    let (running, child) = match &slot.settings.transport {
        McpTransport::Stdio { command, args, env } => {
            let (guard, out, inp) =
                child::spawn(&name, command, args, env, &slot.tail).map_err(|e| {
                    let msg = format!("cannot start `{command}`: {e}");
                    match e.kind() {
                        std::io::ErrorKind::NotFound => ConnectError::Permanent(format!(
                            "{msg} (is it installed, and on the PATH the daemon sees?)"
                        )),
                        std::io::ErrorKind::PermissionDenied => ConnectError::Permanent(msg),
                        _ => ConnectError::Transient(msg),
                    }
                })?;
            slot.update(|g| g.pid = guard.pid());
            let r = tokio::time::timeout(
                init,
                rmcp::service::serve_client_with_ct(handler, (out, inp), ct.clone()),
            )
            .await;
            match r {
                Ok(Ok(running)) => (running, Some(guard)),
                Ok(Err(e)) => {
                    guard.terminate(opts.stop_grace).await;
                    slot.update(|g| g.pid = None);
                    return Err(ConnectError::Transient(format!(
                        "initialize failed: {}{}",
                        chain(&e),
                        slot.tail.suffix()
                    )));
                }
                Err(_) => {
                    guard.terminate(opts.stop_grace).await;
                    slot.update(|g| g.pid = None);
                    return Err(ConnectError::Transient(format!(
                        "no answer to initialize within {}s{}",
                        init.as_secs_f32(),
                        slot.tail.suffix()
                    )));
                }
            }
        }
        McpTransport::Http {
            url,
            headers,
            trusted,
        } => {
            let setup = |e| match e {
                http::HttpSetupError::Blocked(b) => ConnectError::Permanent(blocked_msg(&b)),
                http::HttpSetupError::Other(m) => ConnectError::Permanent(m),
            };
            let client = http::client(url, *trusted, &opts.ssrf).map_err(setup)?;
            let headers = http::header_map(headers).map_err(setup)?;
            if !*trusted {
                http::preflight(url, &opts.ssrf)
                    .await
                    .map_err(|e| match e {
                        http::HttpSetupError::Blocked(b) => {
                            ConnectError::Permanent(blocked_msg(&b))
                        }
                        http::HttpSetupError::Other(m) => ConnectError::Transient(m),
                    })?;
            }
            let started = tokio::time::Instant::now();
            let transport = http::transport(url, client.clone(), headers.clone());
            let r = tokio::time::timeout(
                init,
                rmcp::service::serve_client_with_ct(handler.clone(), transport, ct.clone()),
            )
            .await;
            match r {
                Ok(Ok(running)) => {
                    slot.update(|g| g.transport = "http");
                    (running, None)
                }
                Ok(Err(e)) => {
                    if let Some(b) = http::find_blocked(&e) {
                        return Err(ConnectError::Permanent(blocked_msg(&b)));
                    }
                    let Some(status) = legacy_status(&e) else {
                        return Err(ConnectError::Transient(format!(
                            "initialize failed: {}",
                            chain(&e)
                        )));
                    };
                    // The backwards-compatibility rule of the spec: a 4xx to the
                    // initialize POST means the server may only speak the 2024-11-05
                    // HTTP+SSE transport.
                    let left = init.saturating_sub(started.elapsed());
                    let legacy = async {
                        let t = sse::SseTransport::connect(client, url, headers).await?;
                        Ok::<_, LegacyError>(
                            rmcp::service::serve_client_with_ct(handler, t, ct.clone()).await?,
                        )
                    };
                    match tokio::time::timeout(left, legacy).await {
                        Ok(Ok(running)) => {
                            slot.update(|g| g.transport = "sse");
                            (running, None)
                        }
                        Ok(Err(le)) => {
                            let blocked = match &le {
                                LegacyError::Sse(se) => http::find_blocked(se),
                                LegacyError::Init(ie) => http::find_blocked(ie.as_ref()),
                            };
                            if let Some(b) = blocked {
                                return Err(ConnectError::Permanent(blocked_msg(&b)));
                            }
                            return Err(ConnectError::Transient(format!(
                                "initialize failed: streamable HTTP answered HTTP {status}, and the legacy SSE transport failed: {}",
                                le.describe()
                            )));
                        }
                        Err(_) => {
                            return Err(ConnectError::Transient(format!(
                                "streamable HTTP answered HTTP {status}, and the legacy SSE transport gave no answer to initialize within {}s",
                                init.as_secs_f32()
                            )))
                        }
                    }
                }
                Err(_) => {
                    return Err(ConnectError::Transient(format!(
                        "no answer to initialize within {}s",
                        init.as_secs_f32()
                    )))
                }
            }
        }
    };
    let peer = running.peer().clone();
    let done = Some(tokio::spawn(async move {
        let _ = running.waiting().await;
    }));
    let conn = Conn {
        peer,
        ct,
        done,
        child,
        list_changed,
    };
    match tokio::time::timeout(init, conn.peer.list_all_tools()).await {
        Ok(Ok(list)) => {
            let tools = make_tools(slot, list);
            slot.update(|g| g.tools = tools);
            Ok(conn)
        }
        Ok(Err(e)) => {
            conn.close(opts.stop_grace).await;
            Err(ConnectError::Transient(format!(
                "tools/list failed: {}{}",
                chain(&e),
                slot.tail.suffix()
            )))
        }
        Err(_) => {
            conn.close(opts.stop_grace).await;
            Err(ConnectError::Transient(format!(
                "no answer to tools/list within {}s",
                init.as_secs_f32()
            )))
        }
    }
}

/// Why the legacy SSE fallback failed.
#[derive(Debug)]
enum LegacyError {
    Sse(sse::SseError),
    Init(Box<rmcp::service::ClientInitializeError>),
}

impl From<sse::SseError> for LegacyError {
    fn from(e: sse::SseError) -> Self {
        Self::Sse(e)
    }
}

impl From<rmcp::service::ClientInitializeError> for LegacyError {
    fn from(e: rmcp::service::ClientInitializeError) -> Self {
        Self::Init(Box::new(e))
    }
}

impl LegacyError {
    fn describe(&self) -> String {
        match self {
            Self::Sse(e) => chain(e),
            Self::Init(e) => chain(e.as_ref()),
        }
    }
}

/// The 4xx status (400, 404 or 405) with which a streamable-HTTP initialize was refused: what
/// a server that only speaks the legacy SSE transport answers.
fn legacy_status(e: &rmcp::service::ClientInitializeError) -> Option<u16> {
    type StreamErr = rmcp::transport::streamable_http_client::StreamableHttpError<reqwest13::Error>;
    // `TransportError` does not expose its transport error as `source()`.
    let mut cur: Option<&(dyn std::error::Error + 'static)> = match e {
        rmcp::service::ClientInitializeError::TransportError { error, .. } => Some(error),
        other => Some(other),
    };
    while let Some(c) = cur {
        let status = match c.downcast_ref::<StreamErr>() {
            Some(StreamErr::UnexpectedServerResponse(m)) => m
                .strip_prefix("HTTP ")
                .and_then(|r| r.get(..3))
                .and_then(|n| n.parse::<u16>().ok()),
            Some(StreamErr::Client(r)) => r.status().map(|s| s.as_u16()),
            Some(StreamErr::HttpStatus(h)) => Some(h.status),
            _ => None,
        };
        if let Some(s @ (400 | 404 | 405)) = status {
            return Some(s);
        }
        cur = c.source();
    }
    None
}

fn blocked_msg(b: &crate::net::ssrf::Blocked) -> String {
    format!("refused by the SSRF guard: {b}; set `trusted = true` on a server you run yourself on a private or loopback address")
}

/// `[A-Za-z0-9_-]` only, at most [`MAX_TOOL_NAME`] with the prefix (a hash suffix keeps
/// shortened names distinct).
fn exposed_name(server: &str, tool: &str) -> String {
    let clean: String = tool
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let full = format!("{server}__{clean}");
    if full.len() <= MAX_TOOL_NAME {
        return full;
    }
    // FNV-1a of the original name.
    let mut h: u32 = 0x811c_9dc5;
    for b in tool.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    let suffix = format!("_{h:08x}");
    let keep = MAX_TOOL_NAME - suffix.len();
    format!("{}{suffix}", &full[..keep])
}

fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn make_tools(slot: &Arc<Slot>, list: Vec<rmcp::model::Tool>) -> Vec<Arc<McpTool>> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for t in list {
        if out.len() == MAX_TOOLS_PER_SERVER {
            tracing::warn!(mcp_server = %slot.name(), "more than {MAX_TOOLS_PER_SERVER} tools: the rest are ignored");
            break;
        }
        let name = exposed_name(slot.name(), &t.name);
        if !seen.insert(name.clone()) {
            tracing::warn!(mcp_server = %slot.name(), tool = %t.name, "tool name clashes after sanitising: skipped");
            continue;
        }
        let description = t
            .description
            .as_deref()
            .or(t.title.as_deref())
            .unwrap_or("");
        out.push(Arc::new(McpTool {
            name,
            remote: t.name.to_string(),
            description: cut(description, MAX_DESCRIPTION).to_string(),
            schema: Value::Object((*t.input_schema).clone()),
            slot: Arc::downgrade(slot),
            timeout: slot.settings.call_timeout,
        }));
    }
    out
}

/// Why the connection ended.
enum Ended {
    Shutdown,
    Restart,
    Lost(String),
}

async fn run_connected(
    slot: &Arc<Slot>,
    mut conn: Conn,
    opts: &McpOptions,
    shutdown: &CancellationToken,
) -> Ended {
    let start = tokio::time::Instant::now() + opts.health_interval;
    let mut health = tokio::time::interval_at(start, opts.health_interval);
    health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => {
                conn.close(opts.stop_grace).await;
                return Ended::Shutdown;
            }
            () = slot.restart.notified() => {
                conn.close(opts.stop_grace).await;
                return Ended::Restart;
            }
            () = async {
                match conn.done.as_mut() {
                    Some(h) => { let _ = h.await; }
                    None => std::future::pending::<()>().await,
                }
            } => {
                conn.done = None;
                let exit = match conn.child.as_mut() {
                    Some(c) => c.exit_status(Duration::from_millis(500)).await,
                    None => None,
                };
                let why = match exit {
                    Some(st) => format!("the server process ended ({st})"),
                    None => "the connection closed".to_string(),
                };
                conn.close(opts.stop_grace).await;
                return Ended::Lost(format!("{why}{}", slot.tail.suffix()));
            }
            () = conn.list_changed.notified() => {
                match tokio::time::timeout(slot.settings.init_timeout, conn.peer.list_all_tools()).await {
                    Ok(Ok(list)) => {
                        let tools = make_tools(slot, list);
                        tracing::info!(mcp_server = %slot.name(), tools = tools.len(), "tool list changed");
                        slot.update(|g| g.tools = tools);
                    }
                    Ok(Err(e)) => tracing::warn!(mcp_server = %slot.name(), error = %chain(&e), "cannot refresh the tool list"),
                    Err(_) => tracing::warn!(mcp_server = %slot.name(), "tools/list timed out after list_changed"),
                }
            }
            _ = health.tick() => {
                let req = ClientRequest::PingRequest(PingRequest::default());
                let r = match conn.peer.send_request_with_option(req, PeerRequestOptions::with_timeout(opts.ping_timeout)).await {
                    Ok(h) => h.await_response().await.map(|_| ()),
                    Err(e) => Err(e),
                };
                match r {
                    // An error answer still proves the server is alive.
                    Ok(()) | Err(ServiceError::McpError(_)) => {}
                    Err(e) => {
                        conn.close(opts.stop_grace).await;
                        return Ended::Lost(format!("health check failed: {}", chain(&e)));
                    }
                }
            }
        }
    }
}

/// Wait for a restart (true) or shutdown (false).
async fn wait_restart(slot: &Slot, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = shutdown.cancelled() => false,
        () = slot.restart.notified() => true,
    }
}

async fn supervise(slot: Arc<Slot>, opts: Arc<McpOptions>, shutdown: CancellationToken) {
    let name = slot.name().to_string();
    let mut attempt: u32 = 0;
    loop {
        let res = tokio::select! {
            r = connect(&slot, &opts) => r,
            () = shutdown.cancelled() => break,
            () = slot.restart.notified() => {
                attempt = 0;
                slot.update(|g| { g.state = McpState::Connecting; g.pid = None; });
                continue;
            }
        };
        let err = match res {
            Ok(conn) => {
                attempt = 0;
                tracing::info!(mcp_server = %name, "connected");
                slot.update(|g| {
                    g.state = McpState::Connected;
                    g.attempt = 0;
                    g.peer = Some(conn.peer.clone());
                    g.pid = conn.child.as_ref().and_then(ChildGuard::pid);
                });
                let ended = run_connected(&slot, conn, &opts, &shutdown).await;
                slot.update(|g| {
                    g.peer = None;
                    g.pid = None;
                });
                match ended {
                    Ended::Shutdown => break,
                    Ended::Restart => {
                        slot.update(|g| g.state = McpState::Connecting);
                        continue;
                    }
                    Ended::Lost(e) => e,
                }
            }
            Err(ConnectError::Permanent(e)) => {
                tracing::error!(mcp_server = %name, error = %e, "MCP server failed");
                slot.update(|g| {
                    g.state = McpState::Failed;
                    g.last_error = Some(e);
                    g.tools.clear();
                    g.pid = None;
                });
                if !wait_restart(&slot, &shutdown).await {
                    break;
                }
                attempt = 0;
                slot.update(|g| g.state = McpState::Connecting);
                continue;
            }
            Err(ConnectError::Transient(e)) => e,
        };
        attempt += 1;
        if attempt > opts.max_attempts {
            tracing::error!(mcp_server = %name, error = %err, "MCP server failed after {} reconnect attempts", opts.max_attempts);
            slot.update(|g| {
                g.state = McpState::Failed;
                g.last_error = Some(format!(
                    "gave up after {} reconnect attempts: {err}",
                    opts.max_attempts
                ));
                g.tools.clear();
                g.pid = None;
            });
            if !wait_restart(&slot, &shutdown).await {
                break;
            }
            attempt = 0;
            slot.update(|g| g.state = McpState::Connecting);
            continue;
        }
        let delay = opts.backoff(attempt);
        tracing::warn!(mcp_server = %name, error = %err, attempt, delay_ms = delay.as_millis() as u64, "MCP server down: reconnecting");
        slot.update(|g| {
            g.state = McpState::Reconnecting;
            g.attempt = attempt;
            g.last_error = Some(err);
            g.pid = None;
        });
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.cancelled() => break,
            () = slot.restart.notified() => {
                attempt = 0;
                slot.update(|g| g.state = McpState::Connecting);
            }
        }
    }
    slot.update(|g| {
        g.peer = None;
        g.pid = None;
        if g.state != McpState::Failed {
            g.state = McpState::Failed;
            g.last_error = Some("shut down".into());
        }
        g.tools.clear();
    });
}

/// One tool of an MCP server, as the registry sees it.
pub struct McpTool {
    name: String,
    remote: String,
    description: String,
    schema: Value,
    slot: Weak<Slot>,
    timeout: Duration,
}

impl McpTool {
    /// The tool's name on its server.
    pub fn remote_name(&self) -> &str {
        &self.remote
    }
}

#[async_trait]
impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn parameters(&self) -> Value {
        self.schema.clone()
    }
    fn effect(&self) -> Effect {
        // Server annotations are hints from another program: assume the worst.
        Effect::Executes
    }
    fn time_budget(&self) -> Option<Duration> {
        Some(self.timeout + Duration::from_secs(1))
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let slot = self
            .slot
            .upgrade()
            .ok_or_else(|| ToolError::ExecutionFailed("the MCP client has shut down".into()))?;
        let peer = {
            let g = slot.lock();
            if g.state == McpState::Connected {
                g.peer.clone()
            } else {
                None
            }
        };
        let Some(peer) = peer else {
            return Err(ToolError::ExecutionFailed(slot.down_message()));
        };
        let arguments = match args {
            Value::Object(m) => Some(m),
            Value::Null => None,
            other => {
                return Err(ToolError::InvalidArgs(format!(
                    "arguments for {} must be a JSON object, got {}",
                    self.name,
                    type_name(&other)
                )))
            }
        };
        let mut params = CallToolRequestParams::new(self.remote.clone());
        params.arguments = arguments;
        // Dropping the call future (timeout, cancel) makes rmcp send notifications/cancelled.
        let call = tokio::time::timeout(self.timeout, peer.call_tool(params));
        let r = tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => return Err(ToolError::Cancelled),
            r = call => r,
        };
        match r {
            Err(_) => Err(ToolError::Timeout(self.timeout.as_secs())),
            Ok(Ok(result)) => map_result(&self.name, &result),
            Ok(Err(ServiceError::TransportClosed)) => Err(ToolError::ExecutionFailed(format!(
                "MCP server {} closed the connection during the call; it is being reconnected, try again shortly{}",
                slot.name(),
                slot.tail.suffix()
            ))),
            Ok(Err(ServiceError::McpError(e))) => Err(ToolError::ExecutionFailed(format!(
                "MCP server {} refused the call to {}: {} (code {})",
                slot.name(),
                self.remote,
                e.message,
                e.code.0
            ))),
            Ok(Err(e)) => Err(ToolError::ExecutionFailed(format!(
                "MCP server {}: {}",
                slot.name(),
                chain(&e)
            ))),
        }
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Decoded size of base64 text.
fn b64_len(s: &str) -> usize {
    let s = s.trim_end();
    let pad = s.bytes().rev().take_while(|b| *b == b'=').count();
    (s.len() / 4 * 3 + (s.len() % 4) * 3 / 4).saturating_sub(pad)
}

/// One content block as text: text as is, the rest as a short placeholder.
fn describe_block(b: &Value) -> String {
    let s = |k: &str| b.get(k).and_then(Value::as_str).unwrap_or("");
    match s("type") {
        "text" => s("text").to_string(),
        kind @ ("image" | "audio") => {
            format!("[{kind}: {}, {} bytes]", s("mimeType"), b64_len(s("data")))
        }
        "resource" => {
            let r = b.get("resource").cloned().unwrap_or(Value::Null);
            let rs = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            let size = match (
                r.get("text").and_then(Value::as_str),
                r.get("blob").and_then(Value::as_str),
            ) {
                (Some(t), _) => format!("{} bytes of text", t.len()),
                (None, Some(bl)) => format!("{} bytes", b64_len(bl)),
                _ => "empty".into(),
            };
            let mime = rs("mimeType");
            if mime.is_empty() {
                format!("[resource: {}, {size}]", rs("uri"))
            } else {
                format!("[resource: {}, {mime}, {size}]", rs("uri"))
            }
        }
        "resource_link" => format!("[resource link: {} ({})]", s("uri"), s("name")),
        other => format!("[{other} content]"),
    }
}

/// The model-facing value of a `tools/call` result: text joined; structured content as JSON;
/// media as placeholders; `isError` → `ExecutionFailed` with the text.
fn map_result(tool: &str, result: &rmcp::model::CallToolResult) -> Result<Value, ToolError> {
    let v = serde_json::to_value(result)
        .map_err(|e| ToolError::ExecutionFailed(format!("unreadable result from {tool}: {e}")))?;
    let blocks = v
        .get("content")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let only_text = blocks
        .iter()
        .all(|b| b.get("type").and_then(Value::as_str) == Some("text"));
    let text = blocks
        .iter()
        .map(describe_block)
        .collect::<Vec<_>>()
        .join("\n");
    if result.is_error == Some(true) {
        let msg = if text.trim().is_empty() {
            match &result.structured_content {
                Some(s) => s.to_string(),
                None => format!("{tool} reported an error without details"),
            }
        } else {
            text
        };
        return Err(ToolError::ExecutionFailed(msg));
    }
    Ok(match &result.structured_content {
        // The text blocks are (by the spec) its serialisation: do not send it twice.
        Some(s) if only_text => s.clone(),
        Some(s) => json!({ "structured_content": s, "content": text }),
        None => Value::String(text),
    })
}

#[cfg(test)]
mod unit_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn names_are_sanitised_and_bounded() {
        assert_eq!(exposed_name("fs", "read_file"), "fs__read_file");
        assert_eq!(exposed_name("e", "get-sum"), "e__get-sum");
        assert_eq!(exposed_name("e", "a.b/c d"), "e__a_b_c_d");
        assert_eq!(exposed_name("e", "ünï"), "e___n_");
        let long = "x".repeat(100);
        let n = exposed_name("srv", &long);
        assert_eq!(n.len(), 64);
        assert_ne!(n, exposed_name("srv", &format!("{long}y")));
    }

    #[test]
    fn base64_sizes() {
        assert_eq!(b64_len(""), 0);
        assert_eq!(b64_len("YQ=="), 1);
        assert_eq!(b64_len("YWI="), 2);
        assert_eq!(b64_len("YWJj"), 3);
        assert_eq!(b64_len("YWJjZA"), 4);
    }

    #[test]
    fn backoff_doubles_to_the_cap() {
        let o = McpOptions::default();
        let d: Vec<u64> = (1..=10).map(|a| o.backoff(a).as_secs()).collect();
        assert_eq!(d, [2, 4, 8, 16, 32, 60, 60, 60, 60, 60]);
    }

    #[test]
    fn results_map_text_structured_media_and_errors() {
        let r: rmcp::model::CallToolResult = serde_json::from_value(json!({
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
        }))
        .unwrap();
        assert_eq!(map_result("t", &r).unwrap(), json!("a\nb"));
        let r: rmcp::model::CallToolResult = serde_json::from_value(json!({
            "content": [{"type": "text", "text": "{\"x\":1}"}], "structuredContent": {"x": 1}
        }))
        .unwrap();
        assert_eq!(map_result("t", &r).unwrap(), json!({"x": 1}));
        let r: rmcp::model::CallToolResult = serde_json::from_value(json!({
            "content": [
                {"type": "image", "data": "YWJj", "mimeType": "image/png"},
                {"type": "audio", "data": "YQ==", "mimeType": "audio/wav"},
                {"type": "resource", "resource": {"uri": "file:///a.txt", "mimeType": "text/plain", "text": "héllo"}},
                {"type": "resource_link", "uri": "file:///b", "name": "b"}
            ]
        }))
        .unwrap();
        assert_eq!(
            map_result("t", &r).unwrap(),
            json!("[image: image/png, 3 bytes]\n[audio: audio/wav, 1 bytes]\n[resource: file:///a.txt, text/plain, 6 bytes of text]\n[resource link: file:///b (b)]")
        );
        let r: rmcp::model::CallToolResult = serde_json::from_value(json!({
            "content": [{"type": "text", "text": "boom"}], "isError": true
        }))
        .unwrap();
        assert_eq!(
            map_result("t", &r).unwrap_err(),
            ToolError::ExecutionFailed("boom".into())
        );
        let r: rmcp::model::CallToolResult =
            serde_json::from_value(json!({"content": [], "isError": true})).unwrap();
        assert!(map_result("t", &r)
            .unwrap_err()
            .to_string()
            .contains("without details"));
        let r: rmcp::model::CallToolResult =
            serde_json::from_value(json!({"content": []})).unwrap();
        assert_eq!(map_result("t", &r).unwrap(), json!(""));
    }
}
