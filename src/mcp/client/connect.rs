//! One connection to a server: spawn a stdio child, or dial a URL server over streamable HTTP
//! (behind the SSRF guard unless `trusted`), falling back to the legacy HTTP+SSE transport when
//! the initialize POST is refused with 400/404/405; then `initialize` and `tools/list`.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, ProtocolVersion};
use rmcp::service::{NotificationContext, Peer, RoleClient};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::ClientHandler;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::adapter::make_tools;
use super::chain;
use super::manager::{McpOptions, Slot};
use super::transport::ClientTransport;
use crate::mcp::child::{self, ChildGuard};
use crate::mcp::config::McpTransport;
use crate::mcp::{http, sse};

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
pub(super) struct Conn {
    pub(super) peer: Peer<RoleClient>,
    pub(super) ct: CancellationToken,
    /// The service task; `None` once it has been awaited to the end.
    pub(super) done: Option<JoinHandle<()>>,
    pub(super) child: Option<ChildGuard>,
    pub(super) list_changed: Arc<Notify>,
}

impl Conn {
    pub(super) async fn close(mut self, grace: Duration) {
        self.ct.cancel();
        if let Some(done) = self.done.take() {
            let _ = tokio::time::timeout(Duration::from_secs(2), done).await;
        }
        if let Some(c) = self.child.take() {
            c.terminate(grace).await;
        }
    }
}

pub(super) enum ConnectError {
    /// Retrying cannot help (missing program, refused address).
    Permanent(String),
    /// Worth retrying.
    Transient(String),
}

pub(super) async fn connect(slot: &Arc<Slot>, opts: &McpOptions) -> Result<Conn, ConnectError> {
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
                rmcp::service::serve_client_with_ct(
                    handler,
                    ClientTransport::new(AsyncRwTransport::new_client(out, inp)),
                    ct.clone(),
                ),
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
                rmcp::service::serve_client_with_ct(
                    handler.clone(),
                    ClientTransport::new(transport),
                    ct.clone(),
                ),
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
                            rmcp::service::serve_client_with_ct(
                                handler,
                                ClientTransport::new(t),
                                ct.clone(),
                            )
                            .await?,
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
