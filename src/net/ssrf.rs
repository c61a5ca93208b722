//! SSRF guard for `web_fetch`: decides which addresses the daemon may dial on behalf of the
//! model, and a guarded HTTP client that only dials what was checked. It must not be used for
//! endpoints the operator chose (LLM providers, `web_search`): those are trusted config.
//!
//! # What is guaranteed
//!
//! - **The dialled address is the checked address, on every hop.** Host names are resolved by
//!   [`GuardedResolver`], which hands reqwest only addresses that passed
//!   [`SsrfPolicy::check_ip`]; hyper connects to exactly those, so a DNS answer that changes
//!   between check and connect (DNS rebinding) cannot slip a private address through. reqwest
//!   skips the resolver for IP-literal hosts, so [`GuardedClient::send`] checks the literal
//!   host of every request itself, after WHATWG URL parsing has already normalised
//!   `2130706433`, `0x7f.1`, `0177.0.0.1` and `127.1` to `127.0.0.1`.
//! - **Redirects are followed by hand** (reqwest's are off), at most `max_redirects` hops, and
//!   each hop is re-checked (scheme http/https, literal host or resolver) before it is sent.
//!   Credentials (`Authorization`, `Cookie`, `Proxy-Authorization`) are dropped when a redirect
//!   leaves the origin.
//! - **No proxies**: system proxy variables are ignored (`no_proxy()`), so the connection goes
//!   to the checked address and not to a proxy that would resolve the name again.
//! - **Fail closed**: a failed lookup, an answer with only blocked addresses, or a resolver
//!   error is an error, never a fallback to another resolver. Where reqwest reports the peer
//!   address of a response, it is checked again (belt and braces).
//! - `localhost` and `*.localhost` are answered as loopback by the resolver itself (RFC 6761),
//!   so they never reach a DNS server and are refused unless loopback is allowed.
//! - Well-known metadata host names (`metadata.google.internal`, `metadata`, `metadata.goog`,
//!   `instance-data`) are refused before any DNS query, whatever the allow list says.
//! - IPv6 forms that embed an IPv4 address (mapped `::ffff:a.b.c.d`, compatible `::a.b.c.d`,
//!   translated `::ffff:0:a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) are judged by the
//!   IPv4 address they carry.
//!
//! # What is not guaranteed
//!
//! - Public addresses are reachable by design: a public server may still be an internal
//!   service of the operator's (e.g. a firewall that trusts the host's public IP). Firewall
//!   egress rules are the real boundary for that.
//! - The operator's `allow_private` list opens exactly what it names, including for hosts
//!   whose DNS points there.
//! - Content is not inspected: a public page may still contain a prompt injection.
//! - Teredo (`2001::/32`) and the local-use NAT64 prefix are refused outright rather than
//!   decoded; other tunnelling (e.g. a public open proxy the model names itself) is not
//!   detected.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, COOKIE, LOCATION};
use reqwest::{Method, Response, StatusCode};
use url::{Host, Url};

use crate::types::text::error_chain as chain;
use crate::types::SettingError;

/// Host names refused before any DNS lookup (cloud metadata services), compared without case
/// and without trailing dots.
const BLOCKED_HOSTNAMES: [&str; 4] = [
    "metadata.google.internal",
    "metadata",
    "metadata.goog",
    "instance-data",
];

/// Why an address or host was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// What was refused: an address, or `host (addr, addr)`.
    pub target: String,
    /// The category, e.g. `loopback`, `private`, `cloud metadata`.
    pub reason: &'static str,
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} is a {} address", self.target, self.reason)
    }
}

impl std::error::Error for Blocked {}

/// The non-public category of an address, or `None` for a public (allowed) one. Addresses that
/// embed an IPv4 address are judged by that IPv4 address.
pub fn classify(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, d] = ip.octets();
    let reason = match (a, b, c) {
        (0, _, _) => "this-network (0.0.0.0/8)",
        (10, _, _) => "private",
        (100, 64..=127, _) => "carrier-grade NAT",
        (127, _, _) => "loopback",
        (169, 254, 169) if d == 254 => "cloud metadata",
        (169, 254, _) => "link-local",
        (172, 16..=31, _) => "private",
        (192, 0, 0) => "IETF protocol assignment",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "documentation",
        (192, 88, 99) => "6to4 relay anycast",
        (192, 168, _) => "private",
        (198, 18..=19, _) => "benchmarking",
        (224..=239, _, _) => "multicast",
        (255, 255, 255) if d == 255 => "broadcast",
        (240..=255, _, _) => "reserved",
        _ => return None,
    };
    Some(reason)
}

/// The IPv4 address an IPv6 address carries, for the forms that route to it.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let o = ip.octets();
    let tail = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    match s {
        // ::ffff:a.b.c.d (mapped) and ::ffff:0:a.b.c.d (translated).
        [0, 0, 0, 0, 0, 0xffff, _, _] | [0, 0, 0, 0, 0xffff, 0, _, _] => Some(tail),
        // ::a.b.c.d (compatible, deprecated); :: and ::1 are handled before.
        [0, 0, 0, 0, 0, 0, _, _] => Some(tail),
        // NAT64 well-known prefix 64:ff9b::/96.
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(tail),
        // 6to4 2002:AABB:CCDD::/48.
        [0x2002, _, _, _, _, _, _, _] => Some(Ipv4Addr::new(o[2], o[3], o[4], o[5])),
        _ => None,
    }
}

fn classify_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    if let Some(v4) = embedded_v4(ip) {
        return classify_v4(v4);
    }
    let s = ip.segments();
    let reason = match s[0] {
        0xfc00..=0xfdff if s == [0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x254] => "cloud metadata",
        0xfc00..=0xfdff => "unique local (private)",
        0xfe80..=0xfebf => "link-local",
        0xfec0..=0xfeff => "site-local",
        0xff00..=0xffff => "multicast",
        0x2001 if s[1] == 0x0db8 => "documentation",
        0x2001 if s[1] == 0 => "Teredo tunnel",
        0x3fff if s[1] < 0x1000 => "documentation",
        0x0064 if s[1] == 0xff9b && s[2] == 1 => "local-use NAT64",
        0x0100 if s[1..4] == [0, 0, 0] => "discard-only",
        // Everything else in ::/8 that is not a form decoded above is reserved.
        0x0000..=0x00ff => "reserved",
        _ => return None,
    };
    Some(reason)
}

/// Whether `host` is a refused metadata host name (case and trailing dots ignored).
pub fn is_blocked_hostname(host: &str) -> bool {
    let h = host.trim_end_matches('.');
    BLOCKED_HOSTNAMES.iter().any(|b| h.eq_ignore_ascii_case(b))
}

/// An IP network (`10.0.0.0/8`, `fd00::/8`) or a single address (`127.0.0.2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` lies in this network (same family only).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .map_err(|_| {
                format!("`{s}` is not an IP address or CIDR network (e.g. `10.0.0.5`, `10.0.0.0/8`, `fd00::/8`)")
            })?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(p) if p <= max => p,
                _ => {
                    return Err(format!(
                        "`{s}`: the prefix length must be a number from 0 to {max}"
                    ))
                }
            },
        };
        Ok(Self { addr, prefix })
    }
}

/// Which addresses may be dialled: every public address, plus non-public ones matching the
/// operator's allow list.
#[derive(Debug, Clone, Default)]
pub struct SsrfPolicy {
    allow: Vec<Cidr>,
}

impl SsrfPolicy {
    /// A policy exempting the networks in `allow_private`.
    pub fn new(allow_private: Vec<Cidr>) -> Self {
        Self {
            allow: allow_private,
        }
    }

    fn allowed_by_list(&self, ip: IpAddr) -> bool {
        let embedded = match ip {
            IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        self.allow
            .iter()
            .any(|n| n.contains(ip) || embedded.is_some_and(|e| n.contains(e)))
    }

    /// Check one address.
    ///
    /// # Errors
    /// [`Blocked`] naming the category when the address is not public and not allowed.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Blocked> {
        match classify(ip) {
            Some(reason) if !self.allowed_by_list(ip) => Err(Blocked {
                target: ip.to_string(),
                reason,
            }),
            _ => Ok(()),
        }
    }

    /// Check the host of a URL before a request: IP literals against the address rules, names
    /// against the metadata names (names are checked again after resolution).
    ///
    /// # Errors
    /// [`Blocked`] for a refused literal or name.
    pub fn check_host(&self, host: &Host<&str>) -> Result<(), Blocked> {
        match host {
            Host::Ipv4(v4) => self.check_ip(IpAddr::V4(*v4)),
            Host::Ipv6(v6) => self.check_ip(IpAddr::V6(*v6)),
            Host::Domain(d) => {
                if is_blocked_hostname(d) {
                    return Err(Blocked {
                        target: (*d).to_string(),
                        reason: "cloud metadata",
                    });
                }
                // A name that parses as an address would bypass the resolver in hyper.
                match d
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<IpAddr>()
                {
                    Ok(ip) => self.check_ip(ip),
                    Err(_) => Ok(()),
                }
            }
        }
    }
}

/// A lookup that produced no usable address (as opposed to [`Blocked`]).
#[derive(Debug)]
pub struct DnsFailure(pub String);

impl fmt::Display for DnsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DnsFailure {}

/// The name lookup behind [`GuardedResolver`] (tokio's `getaddrinfo` in production; tests
/// inject answers, e.g. a rebinding DNS server, without touching the network).
type LookupFn = Arc<
    dyn Fn(String) -> futures::future::BoxFuture<'static, std::io::Result<Vec<SocketAddr>>>
        + Send
        + Sync,
>;

fn system_lookup() -> LookupFn {
    Arc::new(|host: String| {
        Box::pin(async move {
            tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map(Iterator::collect)
        })
    })
}

/// A boxed error of the resolver ([`Blocked`] or [`DnsFailure`] inside).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// reqwest resolver that returns only addresses allowed by the policy, and fails closed.
pub struct GuardedResolver {
    policy: Arc<SsrfPolicy>,
    lookup: LookupFn,
    /// Number of lookups started, so tests can prove a refusal happened without DNS.
    lookups: AtomicUsize,
}

impl fmt::Debug for GuardedResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedResolver")
            .field("policy", &self.policy)
            .field("lookups", &self.lookups)
            .finish_non_exhaustive()
    }
}

impl GuardedResolver {
    /// A resolver enforcing `policy` over the system resolver.
    pub fn new(policy: Arc<SsrfPolicy>) -> Self {
        Self::with_lookup(policy, system_lookup())
    }

    fn with_lookup(policy: Arc<SsrfPolicy>, lookup: LookupFn) -> Self {
        Self {
            policy,
            lookup,
            lookups: AtomicUsize::new(0),
        }
    }

    /// How many host name lookups were started.
    pub fn lookups(&self) -> usize {
        self.lookups.load(Ordering::Relaxed)
    }
}

impl GuardedResolver {
    /// Resolve `host` to the addresses the policy allows (port 0), with the same rules as the
    /// reqwest resolver: metadata names refused, `localhost` answered locally, fail closed.
    /// The error is a [`Blocked`] or a [`DnsFailure`].
    ///
    /// # Errors
    /// The name is refused, cannot be resolved, or resolves only to refused addresses.
    pub fn resolve_checked(
        &self,
        host: &str,
    ) -> futures::future::BoxFuture<'static, Result<Vec<SocketAddr>, BoxError>> {
        let policy = self.policy.clone();
        let host = host.to_string();
        if is_blocked_hostname(&host) {
            return Box::pin(async move {
                Err(Box::new(Blocked {
                    target: host,
                    reason: "cloud metadata",
                }) as _)
            });
        }
        let bare = host.trim_end_matches('.').to_ascii_lowercase();
        if bare == "localhost" || bare.ends_with(".localhost") {
            // RFC 6761: loopback, answered here so the name never reaches a DNS server.
            let answer = vec![
                SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
                SocketAddr::from((Ipv6Addr::LOCALHOST, 0)),
            ];
            return Box::pin(async move { filter_answer(&policy, &host, answer) });
        }
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let lookup = (self.lookup)(host.clone());
        Box::pin(async move {
            let addrs = lookup.await.map_err(|e| -> BoxError {
                Box::new(DnsFailure(format!("cannot resolve {host}: {e}")))
            })?;
            filter_answer(&policy, &host, addrs)
        })
    }
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let answer = self.resolve_checked(name.as_str());
        Box::pin(async move {
            let addrs = answer.await?;
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Keep the allowed addresses of a lookup answer; none left is an error (fail closed).
fn filter_answer(
    policy: &SsrfPolicy,
    host: &str,
    addrs: Vec<SocketAddr>,
) -> Result<Vec<SocketAddr>, BoxError> {
    let mut ok: Vec<SocketAddr> = Vec::new();
    let mut refused: Vec<Blocked> = Vec::new();
    for a in addrs {
        match policy.check_ip(a.ip()) {
            Ok(()) => ok.push(a),
            Err(b) => refused.push(b),
        }
    }
    if ok.is_empty() {
        return Err(match refused.first() {
            Some(first) => {
                let list: Vec<&str> = refused.iter().map(|b| b.target.as_str()).collect();
                Box::new(Blocked {
                    target: format!("{host} ({})", list.join(", ")),
                    reason: first.reason,
                })
            }
            None => Box::new(DnsFailure(format!("{host} has no addresses"))),
        });
    }
    Ok(ok)
}

/// Why a guarded request failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The URL's scheme is not http or https.
    #[error("only http and https URLs can be fetched, not `{0}`")]
    Scheme(String),
    /// The URL has no host or cannot be parsed.
    #[error("{0}")]
    BadUrl(String),
    /// The target (or a redirect target) is refused by the policy.
    #[error("{0}")]
    Blocked(Blocked),
    /// More redirects than allowed.
    #[error("stopped after {0} redirects (the limit): the redirect chain is too long")]
    TooManyRedirects(usize),
    /// Name resolution failed.
    #[error("{0}")]
    Dns(String),
    /// A request timed out inside reqwest.
    #[error("request timed out")]
    Timeout,
    /// Connection refused, reset, TLS failure and the like.
    #[error("{0}")]
    Connect(String),
    /// Any other HTTP failure.
    #[error("{0}")]
    Http(String),
}

fn classify_reqwest(e: &reqwest::Error) -> FetchError {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(b) = c.downcast_ref::<Blocked>() {
            return FetchError::Blocked(b.clone());
        }
        if let Some(d) = c.downcast_ref::<DnsFailure>() {
            return FetchError::Dns(d.0.clone());
        }
        cur = c.source();
    }
    if e.is_timeout() {
        FetchError::Timeout
    } else if e.is_connect() {
        FetchError::Connect(chain(e))
    } else {
        FetchError::Http(chain(e))
    }
}

/// An HTTP client could not be built (TLS initialisation).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot build the {tool} HTTP client: {reason}")]
pub struct ClientBuildError {
    /// The tool the client is for (`web_fetch`, `web_search`).
    pub tool: &'static str,
    /// What the HTTP library said, with its sources.
    pub reason: String,
}

/// One request to send through [`GuardedClient::send`].
#[derive(Debug, Clone)]
pub struct GuardedRequest {
    /// HTTP method.
    pub method: Method,
    /// Target URL (http or https).
    pub url: Url,
    /// Request headers.
    pub headers: HeaderMap,
    /// Request body, if any.
    pub body: Option<Bytes>,
}

/// An HTTP client whose every connection goes to a checked address; see the module docs.
#[derive(Debug, Clone)]
pub struct GuardedClient {
    client: reqwest::Client,
    policy: Arc<SsrfPolicy>,
    resolver: Arc<GuardedResolver>,
    max_redirects: usize,
}

impl GuardedClient {
    /// Build the client: proxies off, redirects off (followed by [`Self::send`]), the guarded
    /// resolver, a connect timeout, and `user_agent`.
    ///
    /// # Errors
    /// The HTTP client cannot be built (TLS initialisation).
    pub fn new(
        policy: SsrfPolicy,
        max_redirects: usize,
        connect_timeout: Duration,
        user_agent: &str,
    ) -> Result<Self, ClientBuildError> {
        Self::build(
            policy,
            max_redirects,
            connect_timeout,
            user_agent,
            system_lookup(),
        )
    }

    /// [`Self::new`] with an injected name lookup (tests: fake and rebinding DNS answers).
    #[cfg(test)]
    pub(crate) fn with_lookup(
        policy: SsrfPolicy,
        max_redirects: usize,
        connect_timeout: Duration,
        user_agent: &str,
        lookup: LookupFn,
    ) -> Result<Self, ClientBuildError> {
        Self::build(policy, max_redirects, connect_timeout, user_agent, lookup)
    }

    fn build(
        policy: SsrfPolicy,
        max_redirects: usize,
        connect_timeout: Duration,
        user_agent: &str,
        lookup: LookupFn,
    ) -> Result<Self, ClientBuildError> {
        let policy = Arc::new(policy);
        let resolver = Arc::new(GuardedResolver::with_lookup(policy.clone(), lookup));
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(resolver.clone())
            .connect_timeout(connect_timeout)
            .user_agent(user_agent)
            .build()
            .map_err(|e| ClientBuildError {
                tool: "web_fetch",
                reason: chain(&e),
            })?;
        Ok(Self {
            client,
            policy,
            resolver,
            max_redirects,
        })
    }

    /// The resolver in use (its lookup counter).
    pub fn resolver(&self) -> &GuardedResolver {
        &self.resolver
    }

    /// Check scheme and host of one hop.
    ///
    /// # Errors
    /// [`FetchError::Scheme`], [`FetchError::BadUrl`] or [`FetchError::Blocked`].
    pub fn check_url(&self, url: &Url) -> Result<(), FetchError> {
        match url.scheme() {
            "http" | "https" => {}
            other => return Err(FetchError::Scheme(other.to_string())),
        }
        let host = url
            .host()
            .ok_or_else(|| FetchError::BadUrl(format!("`{url}` has no host")))?;
        self.policy.check_host(&host).map_err(FetchError::Blocked)
    }

    /// Send `req`, following redirects by hand (each hop checked). Returns the final response
    /// (whose body is not read yet) and its URL.
    ///
    /// # Errors
    /// A [`FetchError`]; the caller adds its own overall deadline.
    pub async fn send(&self, req: GuardedRequest) -> Result<(Response, Url), FetchError> {
        let GuardedRequest {
            mut method,
            mut url,
            mut headers,
            mut body,
        } = req;
        let mut hops = 0usize;
        loop {
            self.check_url(&url)?;
            let mut rb = self
                .client
                .request(method.clone(), url.clone())
                .headers(headers.clone());
            if let Some(b) = &body {
                rb = rb.body(b.clone());
            }
            let resp = rb.send().await.map_err(|e| classify_reqwest(&e))?;
            if let Some(peer) = resp.remote_addr() {
                self.policy
                    .check_ip(peer.ip())
                    .map_err(FetchError::Blocked)?;
            }
            let status = resp.status();
            if !status.is_redirection() {
                return Ok((resp, url));
            }
            let Some(loc) = resp.headers().get(LOCATION) else {
                return Ok((resp, url));
            };
            if hops >= self.max_redirects {
                return Err(FetchError::TooManyRedirects(self.max_redirects));
            }
            hops += 1;
            let loc = loc
                .to_str()
                .map_err(|_| FetchError::BadUrl("redirect Location is not valid text".into()))?;
            let next = url
                .join(loc)
                .map_err(|e| FetchError::BadUrl(format!("bad redirect Location `{loc}`: {e}")))?;
            if matches!(status, StatusCode::SEE_OTHER)
                || (matches!(status, StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND)
                    && method == Method::POST)
            {
                if method != Method::HEAD {
                    method = Method::GET;
                }
                body = None;
                headers.remove(reqwest::header::CONTENT_TYPE);
                headers.remove(reqwest::header::CONTENT_LENGTH);
            }
            if next.origin() != url.origin() {
                headers.remove(AUTHORIZATION);
                headers.remove(COOKIE);
                headers.remove(reqwest::header::PROXY_AUTHORIZATION);
            }
            url = next;
        }
    }
}

/// A `User-Agent` value check for config.
///
/// # Errors
/// About `key` (the setting that holds `ua`) when `ua` is empty or not a valid header value.
pub fn validate_user_agent(key: &str, ua: &str) -> Result<(), SettingError> {
    if ua.trim().is_empty() {
        return Err(SettingError::new(key, "must not be empty"));
    }
    HeaderValue::from_str(ua)
        .map(|_| ())
        .map_err(|_| SettingError::new(key, "must be visible ASCII text"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn classifier_table() {
        let blocked = [
            ("0.0.0.0", "this-network (0.0.0.0/8)"),
            ("0.1.2.3", "this-network (0.0.0.0/8)"),
            ("10.0.0.1", "private"),
            ("10.255.255.255", "private"),
            ("100.64.0.1", "carrier-grade NAT"),
            ("100.127.255.254", "carrier-grade NAT"),
            ("100.100.100.200", "carrier-grade NAT"),
            ("127.0.0.1", "loopback"),
            ("127.255.0.9", "loopback"),
            ("169.254.169.254", "cloud metadata"),
            ("169.254.1.1", "link-local"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.0.0.192", "IETF protocol assignment"),
            ("192.0.2.1", "documentation"),
            ("192.168.1.1", "private"),
            ("198.18.0.1", "benchmarking"),
            ("198.19.255.255", "benchmarking"),
            ("198.51.100.7", "documentation"),
            ("203.0.113.9", "documentation"),
            ("224.0.0.1", "multicast"),
            ("239.255.255.250", "multicast"),
            ("240.0.0.1", "reserved"),
            ("255.255.255.255", "broadcast"),
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("fc00::1", "unique local (private)"),
            ("fd12:3456::1", "unique local (private)"),
            ("fd00:ec2::254", "cloud metadata"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("fec0::1", "site-local"),
            ("ff02::1", "multicast"),
            ("2001:db8::1", "documentation"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:169.254.169.254", "cloud metadata"),
            ("::ffff:10.1.2.3", "private"),
            ("::127.0.0.1", "loopback"),
            ("::10.0.0.1", "private"),
            ("::ffff:0:127.0.0.1", "loopback"),
            ("64:ff9b::127.0.0.1", "loopback"),
            ("64:ff9b::a9fe:a9fe", "cloud metadata"),
            ("2002:7f00:1::", "loopback"),
            ("2002:c0a8:0101::1", "private"),
            ("2001::1", "Teredo tunnel"),
            ("64:ff9b:1::1", "local-use NAT64"),
        ];
        for (a, why) in blocked {
            assert_eq!(classify(ip(a)), Some(why), "{a}");
            assert!(SsrfPolicy::default().check_ip(ip(a)).is_err(), "{a}");
        }
        let public = [
            "1.1.1.1",
            "8.8.8.8",
            "93.184.216.34",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "169.253.255.255",
            "192.0.1.1",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "2606:4700::1111",
            "2001:4860:4860::8888",
            "2a00:1450:4001::200e",
            "::ffff:1.1.1.1",
            "64:ff9b::8.8.8.8",
            "2002:0808:0808::1",
        ];
        for a in public {
            assert_eq!(classify(ip(a)), None, "{a}");
            assert!(SsrfPolicy::default().check_ip(ip(a)).is_ok(), "{a}");
        }
    }

    #[test]
    fn allow_list_exempts_only_what_it_names() {
        let p = SsrfPolicy::new(vec![
            "127.0.0.2/32".parse().unwrap(),
            "10.1.0.0/16".parse().unwrap(),
            "fd00::/8".parse().unwrap(),
        ]);
        assert!(p.check_ip(ip("127.0.0.2")).is_ok());
        assert!(p.check_ip(ip("::ffff:127.0.0.2")).is_ok());
        assert_eq!(p.check_ip(ip("127.0.0.1")).unwrap_err().reason, "loopback");
        assert!(p.check_ip(ip("10.1.200.3")).is_ok());
        assert!(p.check_ip(ip("10.2.0.1")).is_err());
        assert!(p.check_ip(ip("fd12::1")).is_ok());
        assert!(p.check_ip(ip("fc00::1")).is_err());
        assert!(p.check_ip(ip("::1")).is_err());
    }

    #[test]
    fn cidr_parsing_errors_are_clear() {
        assert_eq!(
            "10.0.0.0/8".parse::<Cidr>().unwrap().to_string(),
            "10.0.0.0/8"
        );
        assert_eq!(
            "127.0.0.2".parse::<Cidr>().unwrap().to_string(),
            "127.0.0.2/32"
        );
        assert_eq!("::1".parse::<Cidr>().unwrap().to_string(), "::1/128");
        assert_eq!(
            "[fd00::]/8".parse::<Cidr>().unwrap().to_string(),
            "fd00::/8"
        );
        let e = "10.0.0.0/33".parse::<Cidr>().unwrap_err();
        assert!(e.contains("0 to 32"), "{e}");
        let e = "fd00::/129".parse::<Cidr>().unwrap_err();
        assert!(e.contains("0 to 128"), "{e}");
        let e = "localhost".parse::<Cidr>().unwrap_err();
        assert!(e.contains("not an IP address"), "{e}");
        assert!("10.0.0.0/x".parse::<Cidr>().is_err());
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("127.0.0.1")));
        assert!(!all.contains(ip("::1")));
    }

    #[test]
    fn whatwg_parsing_normalises_ipv4_spellings() {
        let p = SsrfPolicy::default();
        for u in [
            "http://2130706433/",
            "http://0x7f000001/",
            "http://0x7f.1/",
            "http://0177.0.0.1/",
            "http://127.1/",
            "http://127.0.0.1./",
            "http://[::ffff:7f00:1]/",
            "http://[0:0:0:0:0:ffff:127.0.0.1]/",
        ] {
            let url = Url::parse(u).unwrap();
            let host = url.host().unwrap();
            assert!(
                matches!(host, Host::Ipv4(_) | Host::Ipv6(_)),
                "{u} parsed as {host:?}"
            );
            assert_eq!(p.check_host(&host).unwrap_err().reason, "loopback", "{u}");
        }
        for u in [
            "http://metadata.google.internal/",
            "http://METADATA.google.internal./",
            "http://metadata/",
            "http://metadata.goog/",
            "http://instance-data./",
        ] {
            let url = Url::parse(u).unwrap();
            assert_eq!(
                p.check_host(&url.host().unwrap()).unwrap_err().reason,
                "cloud metadata",
                "{u}"
            );
        }
        let ok = Url::parse("http://example.com/").unwrap();
        assert!(p.check_host(&ok.host().unwrap()).is_ok());
    }

    #[tokio::test]
    async fn resolver_fails_closed_and_counts_lookups() {
        use reqwest::dns::Resolve;
        let r = GuardedResolver::new(Arc::new(SsrfPolicy::default()));
        let e = r
            .resolve("metadata.google.internal".parse().unwrap())
            .await
            .err()
            .unwrap();
        assert!(e.downcast_ref::<Blocked>().is_some(), "{e}");
        assert_eq!(r.lookups(), 0, "metadata names never reach DNS");
        let e = r.resolve("localhost".parse().unwrap()).await.err().unwrap();
        let b = e.downcast_ref::<Blocked>().expect("localhost is blocked");
        assert_eq!(b.reason, "loopback");
        assert_eq!(r.lookups(), 0, "localhost is answered without DNS");
        let e = r
            .resolve("a.LOCALHOST.".parse().unwrap())
            .await
            .err()
            .unwrap();
        assert!(e.downcast_ref::<Blocked>().is_some(), "{e}");
        // Lookup failures and empty answers fail closed (fake DNS: tests make no DNS queries).
        let failing = GuardedResolver::with_lookup(
            Arc::new(SsrfPolicy::default()),
            Arc::new(|_h: String| Box::pin(async { Err(std::io::Error::other("NXDOMAIN")) }) as _),
        );
        let e = failing
            .resolve("x.test".parse().unwrap())
            .await
            .err()
            .unwrap();
        assert!(e.downcast_ref::<DnsFailure>().is_some(), "{e}");
        let empty = GuardedResolver::with_lookup(
            Arc::new(SsrfPolicy::default()),
            Arc::new(|_h: String| Box::pin(async { Ok(Vec::new()) }) as _),
        );
        let e = empty
            .resolve("x.test".parse().unwrap())
            .await
            .err()
            .unwrap();
        assert!(e.downcast_ref::<DnsFailure>().is_some(), "{e}");
        // A mixed answer keeps only the allowed address.
        let mixed = GuardedResolver::with_lookup(
            Arc::new(SsrfPolicy::default()),
            Arc::new(|_h: String| {
                Box::pin(async {
                    Ok(vec![
                        "127.0.0.1:0".parse().unwrap(),
                        "1.1.1.1:0".parse().unwrap(),
                        "[::1]:0".parse().unwrap(),
                    ])
                }) as _
            }),
        );
        let got: Vec<SocketAddr> = mixed
            .resolve("x.test".parse().unwrap())
            .await
            .unwrap()
            .collect();
        assert_eq!(got, vec!["1.1.1.1:0".parse::<SocketAddr>().unwrap()]);

        let allowed = GuardedResolver::new(Arc::new(SsrfPolicy::new(vec!["127.0.0.0/8"
            .parse()
            .unwrap()])));
        let addrs: Vec<SocketAddr> = allowed
            .resolve("localhost".parse().unwrap())
            .await
            .unwrap()
            .collect();
        assert!(!addrs.is_empty());
        assert!(addrs.iter().all(|a| a.ip().is_ipv4()), "::1 filtered out");
    }
}
