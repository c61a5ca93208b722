//! [`McpManager`]: connects every configured server in the background, one supervisor task
//! per server; keeps each one's state (connecting / connected / reconnecting / failed),
//! health-checks it, reconnects with backoff, restarts on request, shuts everything down.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{ClientRequest, PingRequest};
use rmcp::service::{Peer, PeerRequestOptions, RoleClient, ServiceError};
use serde::Serialize;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::adapter::{make_tools, McpTool};
use super::chain;
use super::connect::{connect, Conn, ConnectError};
use crate::mcp::child::{ChildGuard, StderrTail};
use crate::mcp::config::McpServerSettings;
use crate::net::ssrf::SsrfPolicy;
use crate::types::MutexExt;

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
    /// How long a turn waits for servers still making their first connection attempt
    /// (`tools.mcp_connect_wait_secs`, default 10 s); never for failed or reconnecting ones.
    pub first_connect_wait: Duration,
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
            first_connect_wait: Duration::from_secs(10),
        }
    }
}

impl McpOptions {
    /// The delay before reconnect attempt `attempt` (from 1): the channels' backoff.
    fn backoff(&self, attempt: u32) -> Duration {
        clawft_channel_core::backoff::Backoff::new(self.backoff_initial, self.backoff_max)
            .nth(attempt)
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

pub(super) struct SlotInner {
    pub(super) state: McpState,
    pub(super) attempt: u32,
    pub(super) last_error: Option<String>,
    pub(super) tools: Vec<Arc<McpTool>>,
    pub(super) peer: Option<Peer<RoleClient>>,
    pub(super) pid: Option<u32>,
    /// The transport of the current (or last) connection: `stdio`, `http` or `sse`.
    pub(super) transport: &'static str,
    /// The first connection attempt has ended (connected or not); turns and `/readyz` wait
    /// only for servers where it has not.
    pub(super) first_done: bool,
}

/// One configured server.
pub(super) struct Slot {
    pub(super) settings: McpServerSettings,
    pub(super) inner: Mutex<SlotInner>,
    pub(super) restart: Notify,
    pub(super) changed: Arc<watch::Sender<u64>>,
    pub(super) tail: StderrTail,
}

impl Slot {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, SlotInner> {
        self.inner.locked()
    }

    pub(super) fn update(&self, f: impl FnOnce(&mut SlotInner)) {
        f(&mut self.lock());
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub(super) fn name(&self) -> &str {
        &self.settings.name
    }

    pub(super) fn status(&self) -> McpServerStatus {
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
    pub(super) fn down_message(&self) -> String {
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
    pub(super) slots: Vec<Arc<Slot>>,
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

/// `restart` of a server that is not configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no MCP server named `{name}`; configured: {configured}")]
pub struct UnknownServer {
    /// The name asked for.
    pub name: String,
    /// The configured servers, comma-separated.
    pub configured: String,
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
                    first_done: false,
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
    pub fn restart(&self, name: &str) -> Result<(), UnknownServer> {
        match self.slots.iter().find(|s| s.name() == name) {
            Some(s) => {
                s.restart.notify_one();
                Ok(())
            }
            None => Err(UnknownServer {
                name: name.to_string(),
                configured: self
                    .slots
                    .iter()
                    .map(|s| s.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
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

    /// The servers still making their first connection attempt, in configuration order
    /// (`/readyz` says "starting" while there are any).
    pub fn first_connecting(&self) -> Vec<String> {
        self.slots
            .iter()
            .filter(|s| !s.lock().first_done)
            .map(|s| s.name().to_string())
            .collect()
    }

    /// Wait, at most [`McpOptions::first_connect_wait`], until every server has ended its first
    /// connection attempt (connected, failed or reconnecting), so a turn started right after
    /// the daemon sees the tools of the servers that connect. Returns whether they all did.
    pub async fn first_attempts_done(&self) -> bool {
        let mut rx = self.changed.clone();
        let fut = async {
            loop {
                if self.slots.iter().all(|s| s.lock().first_done) {
                    return;
                }
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        let done = tokio::time::timeout(self.options.first_connect_wait, fut)
            .await
            .is_ok();
        if !done {
            tracing::warn!(
                servers = %self.first_connecting().join(", "),
                wait_s = self.options.first_connect_wait.as_secs_f64(),
                "MCP servers still connecting after tools.mcp_connect_wait_secs; this turn goes on without their tools"
            );
        }
        done
    }

    /// Close every connection and stop every server process (SIGTERM, then SIGKILL after
    /// the grace), and wait for it. Idempotent.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        let tasks: Vec<_> = std::mem::take(&mut *self.tasks.locked());
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
        for t in self.tasks.locked().iter() {
            t.abort();
        }
    }
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
                    g.first_done = true;
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
                    g.first_done = true;
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
            g.first_done = true;
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
        g.first_done = true;
        if g.state != McpState::Failed {
            g.state = McpState::Failed;
            g.last_error = Some("shut down".into());
        }
        g.tools.clear();
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap() {
        let o = McpOptions::default();
        let d: Vec<u64> = (1..=10).map(|a| o.backoff(a).as_secs()).collect();
        assert_eq!(d, [2, 4, 8, 16, 32, 60, 60, 60, 60, 60]);
    }
}
