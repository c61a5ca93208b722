//! The HTTP client of URL servers (streamable HTTP, and legacy SSE in [`super::sse`]). rmcp's transport is implemented for reqwest
//! 0.13 (`reqwest13` here) while the rest of clawft uses 0.12; the guard itself is shared: the
//! 0.12 [`GuardedResolver`] is wrapped as a 0.13 resolver (both resolver traits use the same
//! `Box<dyn Iterator<Item = SocketAddr>>` / `Box<dyn Error>` types), so every name lookup of an
//! untrusted server goes through exactly the `web_fetch` checks. reqwest skips the resolver
//! for IP-literal hosts, so those are checked here before connecting; the URL never changes
//! (redirects are off) and proxies are off, so the dialled address is the checked one.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use reqwest13::header::{HeaderName, HeaderValue};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use url::Url;

use crate::net::ssrf::{Blocked, GuardedResolver, SsrfPolicy};

/// Connect timeout of the HTTP client.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The 0.12 guarded resolver offered to reqwest 0.13.
struct Resolver13(Arc<GuardedResolver>);

impl reqwest13::dns::Resolve for Resolver13 {
    fn resolve(&self, name: reqwest13::dns::Name) -> reqwest13::dns::Resolving {
        match name.as_str().parse::<reqwest::dns::Name>() {
            Ok(n) => reqwest::dns::Resolve::resolve(&*self.0, n),
            Err(e) => {
                let msg = format!("invalid host name `{}`: {e}", name.as_str());
                Box::pin(async move { Err(msg.into()) })
            }
        }
    }
}

/// Why the transport could not be built.
pub(crate) enum HttpSetupError {
    /// Refused by the SSRF guard (a configuration problem: retrying will not help).
    Blocked(Blocked),
    /// Anything else (TLS initialisation, bad header).
    Other(String),
}

/// The HTTP client for `url`; unless `trusted`, only public addresses (plus `policy`'s
/// exemptions) are dialled. Shared by the streamable HTTP and the legacy SSE transport.
pub(crate) fn client(
    url: &Url,
    trusted: bool,
    policy: &Arc<SsrfPolicy>,
) -> Result<reqwest13::Client, HttpSetupError> {
    crate::install_crypto_provider();
    let mut builder = reqwest13::Client::builder()
        .redirect(reqwest13::redirect::Policy::none())
        .connect_timeout(CONNECT_TIMEOUT)
        .user_agent(concat!("clawft/", env!("CARGO_PKG_VERSION"), " (mcp)"));
    if !trusted {
        let host = url
            .host()
            .ok_or_else(|| HttpSetupError::Other(format!("`{url}` has no host")))?;
        policy.check_host(&host).map_err(HttpSetupError::Blocked)?;
        builder = builder
            .no_proxy()
            .dns_resolver(Arc::new(Resolver13(Arc::new(GuardedResolver::new(
                policy.clone(),
            )))));
    }
    builder
        .build()
        .map_err(|e| HttpSetupError::Other(format!("cannot build the HTTP client: {e}")))
}

/// The configured headers, validated.
pub(crate) fn header_map(
    headers: &[(String, String)],
) -> Result<HashMap<HeaderName, HeaderValue>, HttpSetupError> {
    let mut custom = HashMap::new();
    for (k, v) in headers {
        let name = http_name(k)?;
        let value = HeaderValue::from_str(v)
            .map_err(|_| HttpSetupError::Other(format!("the value of header `{k}` is invalid")))?;
        custom.insert(name, value);
    }
    Ok(custom)
}

/// A streamable HTTP transport to `url` over `client` with `headers`.
pub(crate) fn transport(
    url: &Url,
    client: reqwest13::Client,
    headers: HashMap<HeaderName, HeaderValue>,
) -> StreamableHttpClientTransport<reqwest13::Client> {
    let config =
        StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(headers);
    StreamableHttpClientTransport::with_client(client, config)
}

fn http_name(k: &str) -> Result<HeaderName, HttpSetupError> {
    HeaderName::from_bytes(k.as_bytes())
        .map_err(|_| HttpSetupError::Other(format!("`{k}` is not a valid header name")))
}

/// Resolve an untrusted URL's host name through the guard before connecting, so a refused
/// address is reported as such (rmcp flattens the transport's error chain). Diagnostic only:
/// the connection itself resolves again through the same guard, which is what enforces it.
pub(crate) async fn preflight(url: &Url, policy: &Arc<SsrfPolicy>) -> Result<(), HttpSetupError> {
    let Some(url::Host::Domain(host)) = url.host() else {
        return Ok(()); // literals were checked when the transport was built
    };
    let name = host
        .parse::<reqwest::dns::Name>()
        .map_err(|e| HttpSetupError::Other(format!("invalid host name `{host}`: {e}")))?;
    let resolver = GuardedResolver::new(policy.clone());
    match reqwest::dns::Resolve::resolve(&resolver, name).await {
        Ok(_) => Ok(()),
        Err(e) => Err(match find_blocked(e.as_ref()) {
            Some(b) => HttpSetupError::Blocked(b),
            None => HttpSetupError::Other(e.to_string()),
        }),
    }
}

/// The SSRF refusal somewhere in an error's source chain, if any.
pub(crate) fn find_blocked(e: &(dyn std::error::Error + 'static)) -> Option<Blocked> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(b) = c.downcast_ref::<Blocked>() {
            return Some(b.clone());
        }
        cur = c.source();
    }
    None
}
