//! The egress proxy for commands (`exec_shell`, `spawn`): commands have no network of their
//! own (see `tools::exec`); what they may reach goes through this proxy, which the daemon runs
//! on a Unix socket and the command's sandbox bridges to `127.0.0.1:3128` inside its network
//! namespace, exported as `HTTP_PROXY`/`HTTPS_PROXY`/`ALL_PROXY`.
//!
//! # What it serves
//!
//! - `CONNECT host:port` (HTTPS, and any TLS or TCP protocol a client tunnels): the target is
//!   checked, dialled, then bytes are relayed both ways. TLS is end to end; the proxy sees only
//!   the host name and port.
//! - Absolute-form plain HTTP (`GET http://host/path HTTP/1.1`): the target is checked, the
//!   request is rewritten to origin form with `Connection: close` (one request per
//!   connection, so a second request cannot ride on a connection checked for another host),
//!   and the response is relayed.
//!
//! # What it guarantees
//!
//! The same rules as `web_fetch` ([`super::ssrf`]): the address dialled is an address that was
//! checked (names go through [`GuardedResolver::resolve_checked`]; IP literals in any spelling
//! are normalised by the WHATWG URL parser first), so loopback, private, link-local (cloud
//! metadata), CGNAT, unique-local and multicast targets are refused unless the operator allowed
//! the network (`tools.exec.allow_private`). Metadata host names are refused before any lookup.
//! With `tools.exec.allow_domains`, only those names (and their subdomains) are reachable, and
//! IP literals are refused. Every redirect is a new request from the client, so every hop is
//! checked. A refusal is an HTTP `403` whose body says what was refused and which setting
//! opens it.
//!
//! # What it does not guarantee
//!
//! Public hosts are reachable by design: a command can send what it reads to any public
//! server unless `allow_domains` is set. Content is not inspected. Clients that ignore the
//! proxy variables have no network at all (rather than a direct one).

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener};
use tokio::sync::Semaphore;
use url::{Host, Url};

use super::ssrf::{Blocked, DnsFailure, GuardedResolver, SsrfPolicy};

/// Longest request head (request line + headers) accepted.
const MAX_HEAD: usize = 64 * 1024;
/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long dialling one target may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Connections served at once (further ones wait).
const MAX_CONNECTIONS: usize = 256;

/// What the proxy lets through.
#[derive(Debug, Clone, Default)]
pub struct ProxyPolicy {
    /// Which addresses may be dialled (public ones plus the operator's `allow_private`).
    pub ssrf: SsrfPolicy,
    /// When not empty, the only host names reachable (each also covers its subdomains);
    /// IP literals are then refused.
    pub allow_domains: Vec<String>,
    /// Single non-public endpoints (address and port) reachable although their network is
    /// not in `ssrf`'s allow list (`tools.browser.allow_private = ["127.0.0.1:8080"]`): the
    /// other ports of that address stay refused. Reachable by IP literal even with
    /// `allow_domains` set.
    pub allow_endpoints: Vec<SocketAddr>,
    /// The settings table named in refusals (`tools.exec` when empty).
    pub settings: &'static str,
}

impl ProxyPolicy {
    fn key(&self) -> &'static str {
        if self.settings.is_empty() {
            "tools.exec"
        } else {
            self.settings
        }
    }

    fn endpoint_allowed(&self, ip: std::net::IpAddr, port: u16) -> bool {
        self.allow_endpoints
            .iter()
            .any(|e| e.ip() == ip && e.port() == port)
    }

    fn domain_allowed(&self, host: &str) -> bool {
        if self.allow_domains.is_empty() {
            return true;
        }
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.allow_domains.iter().any(|d| {
            let d = d.trim_start_matches("*.").trim_end_matches('.');
            host == d || host.strip_suffix(d).is_some_and(|rest| rest.ends_with('.'))
        })
    }
}

/// The running proxy: serves until dropped, then removes its socket (and its private
/// directory, when it made one).
#[derive(Debug)]
pub struct EgressProxy {
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
    /// The 0700 directory made by [`EgressProxy::start_private`].
    dir: Option<PathBuf>,
}

impl EgressProxy {
    /// Listen on the Unix socket `path` (a stale socket there is replaced; the file is made
    /// mode 0600) and serve until dropped. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// The socket cannot be created.
    pub fn start(path: &Path, policy: ProxyPolicy) -> io::Result<Self> {
        Self::start_with(path, policy, None)
    }

    /// Make a new directory `clawft-egress-<pid>-<random>` (mode 0700) beneath `base`, and
    /// listen on `egress.sock` in it; both are removed when the proxy is dropped. Must be
    /// called inside a tokio runtime.
    ///
    /// # Errors
    /// The directory or the socket cannot be created.
    pub fn start_private(base: &Path, policy: ProxyPolicy) -> io::Result<Self> {
        let dir = crate::types::private_dir::create(base, "clawft-egress")?;
        match Self::start_with(&dir.join("egress.sock"), policy, None) {
            Ok(mut p) => {
                p.dir = Some(dir);
                Ok(p)
            }
            Err(e) => {
                let _ = std::fs::remove_dir(&dir);
                Err(e)
            }
        }
    }

    fn start_with(
        path: &Path,
        policy: ProxyPolicy,
        resolver: Option<GuardedResolver>,
    ) -> io::Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let ssrf = Arc::new(policy.ssrf.clone());
        let shared = Arc::new(Shared {
            resolver: resolver.unwrap_or_else(|| GuardedResolver::new(ssrf)),
            policy,
            slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        });
        let task = tokio::spawn(accept_loop(listener, shared));
        Ok(Self {
            path: path.to_path_buf(),
            task,
            dir: None,
        })
    }

    /// Listen on `127.0.0.1` at a port the system picks, for a client that can only speak to
    /// a TCP proxy (Chromium's `--proxy-server`); serves until the returned task is aborted
    /// or dropped through [`TcpEgressProxy`]. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// The socket cannot be bound.
    pub async fn start_tcp(policy: ProxyPolicy) -> io::Result<TcpEgressProxy> {
        let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let ssrf = Arc::new(policy.ssrf.clone());
        let shared = Arc::new(Shared {
            resolver: GuardedResolver::new(ssrf),
            policy,
            slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        });
        let task = tokio::spawn(async move {
            loop {
                let Ok(permit) = shared.slots.clone().acquire_owned().await else {
                    return;
                };
                match listener.accept().await {
                    Ok((stream, _)) => {
                        let _ = stream.set_nodelay(true);
                        let shared = shared.clone();
                        tokio::spawn(async move {
                            serve(stream, &shared).await;
                            drop(permit);
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "egress proxy: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        });
        Ok(TcpEgressProxy { addr, task })
    }

    /// The socket the proxy listens on.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The egress proxy on a loopback TCP port ([`EgressProxy::start_tcp`]); stops when dropped.
#[derive(Debug)]
pub struct TcpEgressProxy {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl TcpEgressProxy {
    /// The address it listens on (`127.0.0.1:PORT`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for TcpEgressProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Shared {
    policy: ProxyPolicy,
    resolver: GuardedResolver,
    slots: Arc<Semaphore>,
}

async fn accept_loop(listener: UnixListener, shared: Arc<Shared>) {
    loop {
        let Ok(permit) = shared.slots.clone().acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((stream, _)) => {
                let shared = shared.clone();
                tokio::spawn(async move {
                    serve(stream, &shared).await;
                    drop(permit);
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "egress proxy: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Why a request was not forwarded: the status line and the text for the client.
#[derive(Debug, PartialEq, Eq)]
struct Refusal {
    status: &'static str,
    reason: String,
}

impl Refusal {
    fn bad(reason: impl Into<String>) -> Self {
        Self {
            status: "400 Bad Request",
            reason: reason.into(),
        }
    }

    fn forbidden(reason: impl Into<String>) -> Self {
        Self {
            status: "403 Forbidden",
            reason: reason.into(),
        }
    }

    fn bad_gateway(reason: impl Into<String>) -> Self {
        Self {
            status: "502 Bad Gateway",
            reason: reason.into(),
        }
    }

    fn response(&self) -> Vec<u8> {
        let body = format!("clawft egress proxy: {}\n", self.reason);
        format!(
            "HTTP/1.1 {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.status,
            body.len()
        )
        .into_bytes()
    }
}

/// One parsed request head.
#[derive(Debug)]
struct Head {
    method: String,
    target: String,
    version: String,
    /// Header lines as received (name, value).
    headers: Vec<(String, String)>,
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut client: S, shared: &Shared) {
    let (head, rest) = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client)).await {
        Ok(Ok(Some(read))) => read,
        Ok(Ok(None)) => return,
        Ok(Err(refusal)) => {
            let _ = client.write_all(&refusal.response()).await;
            return;
        }
        Err(_) => {
            let refusal = Refusal {
                status: "408 Request Timeout",
                reason: "no complete request head within 30 s".into(),
            };
            let _ = client.write_all(&refusal.response()).await;
            return;
        }
    };
    let result = if head.method.eq_ignore_ascii_case("CONNECT") {
        tunnel(&mut client, &head, &rest, shared).await
    } else {
        forward(&mut client, &head, &rest, shared).await
    };
    if let Err(refusal) = result {
        tracing::info!(
            method = %head.method,
            target = %head.target,
            reason = %refusal.reason,
            "egress proxy: refused"
        );
        let _ = client.write_all(&refusal.response()).await;
    }
}

/// Read up to the end of the head; `None` when the client closed before sending anything.
async fn read_head<S: AsyncRead + Unpin>(
    client: &mut S,
) -> Result<Option<(Head, Vec<u8>)>, Refusal> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let n = client
            .read(&mut chunk)
            .await
            .map_err(|e| Refusal::bad(format!("reading the request: {e}")))?;
        if n == 0 {
            if buf.is_empty() {
                return Ok(None);
            }
            return Err(Refusal::bad(
                "the connection closed inside the request head",
            ));
        }
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = find(&buf[from..], b"\r\n\r\n").map(|i| from + i + 4) {
            let head = parse_head(&buf[..end])?;
            return Ok(Some((head, buf[end..].to_vec())));
        }
        if buf.len() > MAX_HEAD {
            return Err(Refusal {
                status: "431 Request Header Fields Too Large",
                reason: format!("the request head is over {} KiB", MAX_HEAD / 1024),
            });
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn parse_head(raw: &[u8]) -> Result<Head, Refusal> {
    let text =
        std::str::from_utf8(raw).map_err(|_| Refusal::bad("the request head is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refusal::bad(format!("malformed request line `{line}`")));
    };
    if method.is_empty() || !version.starts_with("HTTP/1.") {
        return Err(Refusal::bad(format!("malformed request line `{line}`")));
    }
    let mut headers = Vec::new();
    for l in lines.filter(|l| !l.is_empty()) {
        let Some((name, value)) = l.split_once(':') else {
            return Err(Refusal::bad(format!("malformed header line `{l}`")));
        };
        headers.push((name.trim().to_string(), value.trim().to_string()));
    }
    Ok(Head {
        method: method.to_string(),
        target: target.to_string(),
        version: version.to_string(),
        headers,
    })
}

/// `CONNECT host:port`: check, dial, answer 200, relay.
async fn tunnel<S: AsyncRead + AsyncWrite + Unpin>(
    client: &mut S,
    head: &Head,
    rest: &[u8],
    shared: &Shared,
) -> Result<(), Refusal> {
    let bad = || {
        Refusal::bad(format!(
            "CONNECT target must be host:port, got `{}`",
            head.target
        ))
    };
    let (host_part, port) = match head.target.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && (!h.contains(':') || h.ends_with(']')) => {
            let port = p.parse::<u16>().map_err(|_| {
                Refusal::bad(format!("CONNECT target `{}` has no port", head.target))
            })?;
            (h, port)
        }
        _ => {
            return Err(Refusal::bad(format!(
                "CONNECT target `{}` has no port",
                head.target
            )))
        }
    };
    // The WHATWG parser normalises every IP spelling (2130706433, 0x7f.1, [::ffff:…]).
    let url = Url::parse(&format!("http://{host_part}/"))
        .map_err(|e| Refusal::bad(format!("CONNECT target `{}`: {e}", head.target)))?;
    if !url.username().is_empty() || url.password().is_some() || url.path() != "/" {
        return Err(bad());
    }
    let host = url.host().ok_or_else(bad)?;
    let mut upstream = dial(host, port, shared).await?;
    client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .map_err(|e| Refusal::bad(e.to_string()))?;
    if !rest.is_empty() && upstream.write_all(rest).await.is_err() {
        return Ok(());
    }
    let _ = tokio::io::copy_bidirectional(client, &mut upstream).await;
    Ok(())
}

/// Absolute-form plain HTTP: check, dial, rewrite to origin form, relay.
async fn forward<S: AsyncRead + AsyncWrite + Unpin>(
    client: &mut S,
    head: &Head,
    rest: &[u8],
    shared: &Shared,
) -> Result<(), Refusal> {
    let url = Url::parse(&head.target).map_err(|_| {
        Refusal::bad(format!(
            "`{} {}`: a proxy request needs an absolute http:// URL (HTTPS goes through CONNECT)",
            head.method, head.target
        ))
    })?;
    if url.scheme() != "http" {
        return Err(Refusal::bad(format!(
            "only http:// URLs are forwarded as plain requests (HTTPS goes through CONNECT), not `{}`",
            url.scheme()
        )));
    }
    let host = url
        .host()
        .ok_or_else(|| Refusal::bad(format!("`{}` has no host", head.target)))?;
    let port = url.port_or_known_default().unwrap_or(80);
    let mut upstream = dial(host, port, shared).await?;
    let mut out = Vec::with_capacity(512 + rest.len());
    let path = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    };
    out.extend_from_slice(format!("{} {path} {}\r\n", head.method, head.version).as_bytes());
    let mut has_host = false;
    for (name, value) in &head.headers {
        let lower = name.to_ascii_lowercase();
        if matches!(
            lower.as_str(),
            "proxy-connection" | "proxy-authorization" | "connection" | "keep-alive"
        ) {
            continue;
        }
        has_host |= lower == "host";
        out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    if !has_host {
        let authority = match url.port() {
            Some(p) => format!("{}:{p}", url.host_str().unwrap_or_default()),
            None => url.host_str().unwrap_or_default().to_string(),
        };
        out.extend_from_slice(format!("Host: {authority}\r\n").as_bytes());
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out.extend_from_slice(rest);
    if upstream.write_all(&out).await.is_err() {
        return Err(Refusal::bad_gateway(format!(
            "{} closed the connection",
            url.host_str().unwrap_or_default()
        )));
    }
    let _ = tokio::io::copy_bidirectional(client, &mut upstream).await;
    Ok(())
}

/// Check `host` against the policy and connect to one of its checked addresses.
async fn dial(host: Host<&str>, port: u16, shared: &Shared) -> Result<TcpStream, Refusal> {
    let policy = &shared.policy;
    let key = policy.key();
    let opens = format!("the operator can allow networks with {key}.allow_private");
    let addrs: Vec<SocketAddr> = match host {
        Host::Domain(name) => {
            if !policy.domain_allowed(name) {
                return Err(Refusal::forbidden(format!(
                    "{name} is not in {key}.allow_domains"
                )));
            }
            let answer = shared.resolver.resolve_checked(name).await;
            match answer {
                Ok(addrs) => addrs,
                Err(e) => {
                    if let Some(b) = e.downcast_ref::<Blocked>() {
                        return Err(Refusal::forbidden(format!("refused {b}; {opens}")));
                    }
                    if let Some(d) = e.downcast_ref::<DnsFailure>() {
                        return Err(Refusal::bad_gateway(d.0.clone()));
                    }
                    return Err(Refusal::bad_gateway(format!("cannot resolve {name}: {e}")));
                }
            }
        }
        Host::Ipv4(v4) => vec![check_literal(std::net::IpAddr::V4(v4), port, policy)?],
        Host::Ipv6(v6) => vec![check_literal(std::net::IpAddr::V6(v6), port, policy)?],
    };
    let mut last = String::from("no address");
    for mut addr in addrs {
        addr.set_port(port);
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Ok(Err(e)) => last = format!("{addr}: {e}"),
            Err(_) => last = format!("{addr}: timed out"),
        }
    }
    Err(Refusal::bad_gateway(format!("cannot connect: {last}")))
}

/// An IP-literal target: refused when only named domains are allowed, else by the address rules.
fn check_literal(
    ip: std::net::IpAddr,
    port: u16,
    policy: &ProxyPolicy,
) -> Result<SocketAddr, Refusal> {
    let key = policy.key();
    if policy.endpoint_allowed(ip, port) {
        return Ok(SocketAddr::new(ip, 0));
    }
    if !policy.allow_domains.is_empty() {
        return Err(Refusal::forbidden(format!(
            "{ip} is an address, and only the names in {key}.allow_domains are reachable"
        )));
    }
    policy.ssrf.check_ip(ip).map_err(|b| {
        Refusal::forbidden(format!(
            "refused {b}; the operator can allow networks with {key}.allow_private"
        ))
    })?;
    Ok(SocketAddr::new(ip, 0))
}

#[cfg(test)]
#[path = "proxy_tests.rs"]
mod tests;
