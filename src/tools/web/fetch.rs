//! `web_fetch`: fetch a model-chosen URL through the SSRF guard of [`crate::net::ssrf`] and
//! return its body as text; its settings (`tools.web_fetch`).

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use reqwest::Method;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use url::Url;

use super::{decode, default_user_agent, MAX_TIMEOUT_SECS};
use crate::net::ssrf::{
    self, Cidr, ClientBuildError, FetchError, GuardedClient, GuardedRequest, SsrfPolicy,
};
use crate::tools::{parse_args, schema_of, Effect, Tool, ToolContext, ToolError};
use crate::types::SettingError;

/// Default cap on a fetched body (10 MB, seed 001); the registry later cuts the result to
/// 64 KiB, so this bounds memory and transfer, not what the model sees.
pub const DEFAULT_MAX_BYTES: usize = 10 * 1024 * 1024;
/// Largest `max_bytes` accepted (100 MiB): one call must not be able to exhaust memory.
pub const MAX_MAX_BYTES: usize = 100 * 1024 * 1024;
/// Default whole-fetch deadline (seconds): DNS, connect, every redirect and the body.
pub const DEFAULT_FETCH_TIMEOUT_SECS: u64 = 30;
/// Default redirect hops followed by `web_fetch`.
pub const DEFAULT_MAX_REDIRECTS: usize = 5;
/// Most redirect hops an operator may allow.
pub const MAX_MAX_REDIRECTS: usize = 10;
/// Request headers the model may not set: framing and hop-by-hop headers (request smuggling,
/// connection reuse) and proxy credentials.
const FORBIDDEN_HEADERS: [&str; 10] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-authorization",
    "proxy-connection",
];

/// Resolved `web_fetch` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct WebFetchSettings {
    /// Non-public networks the operator allows (default: none).
    pub allow_private: Vec<Cidr>,
    /// Body bytes read at most (default 10 MB).
    pub max_bytes: usize,
    /// Whole-fetch deadline (default 30 s).
    pub timeout: Duration,
    /// `User-Agent` sent unless the call sets one (default `clawft/VERSION (web_fetch)`).
    pub user_agent: String,
    /// Redirect hops followed (default 5).
    pub max_redirects: usize,
}

impl Default for WebFetchSettings {
    fn default() -> Self {
        Self {
            allow_private: Vec::new(),
            max_bytes: DEFAULT_MAX_BYTES,
            timeout: Duration::from_secs(DEFAULT_FETCH_TIMEOUT_SECS),
            user_agent: default_user_agent(),
            max_redirects: DEFAULT_MAX_REDIRECTS,
        }
    }
}

/// `tools.web_fetch` in the config file.
#[derive(Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WebFetchFile {
    /// Private, loopback or link-local networks web_fetch may reach anyway, as addresses or
    /// CIDRs (e.g. `["10.1.0.0/16", "127.0.0.1"]`). Default: none. Cloud metadata host names
    /// stay blocked.
    pub allow_private: Option<Vec<String>>,
    /// Most body bytes read per fetch; longer bodies are cut (default 10485760, at most
    /// 104857600).
    pub max_bytes: Option<u64>,
    /// Deadline of one fetch in seconds, redirects and body included (default 30, 1..=300).
    pub timeout_secs: Option<u64>,
    /// `User-Agent` header (default `clawft/VERSION (web_fetch)`).
    pub user_agent: Option<String>,
    /// Redirects followed, each one checked (default 5, at most 10).
    pub max_redirects: Option<u32>,
}

impl WebFetchFile {
    /// Validate into [`WebFetchSettings`].
    ///
    /// # Errors
    /// A message naming the key (`tools.web_fetch.…`) and what is expected.
    pub fn resolve(&self) -> Result<WebFetchSettings, SettingError> {
        let d = WebFetchSettings::default();
        let mut allow_private = Vec::new();
        for (i, s) in self.allow_private.iter().flatten().enumerate() {
            allow_private.push(s.parse::<Cidr>().map_err(|e| {
                SettingError::new(format!("tools.web_fetch.allow_private[{i}]"), e)
            })?);
        }
        let max_bytes = match self.max_bytes {
            None => d.max_bytes,
            Some(n) => match usize::try_from(n) {
                Ok(n) if (1..=MAX_MAX_BYTES).contains(&n) => n,
                _ => {
                    return Err(SettingError::new(
                        "tools.web_fetch.max_bytes",
                        format!("expected 1..={MAX_MAX_BYTES} bytes, got {n}"),
                    ))
                }
            },
        };
        let timeout = match self.timeout_secs {
            None => d.timeout,
            Some(n) if (1..=MAX_TIMEOUT_SECS).contains(&n) => Duration::from_secs(n),
            Some(n) => {
                return Err(SettingError::new(
                    "tools.web_fetch.timeout_secs",
                    format!("expected 1..={MAX_TIMEOUT_SECS} seconds, got {n}"),
                ))
            }
        };
        let user_agent = match &self.user_agent {
            None => d.user_agent,
            Some(ua) => {
                ssrf::validate_user_agent("tools.web_fetch.user_agent", ua)?;
                ua.clone()
            }
        };
        let max_redirects = match self.max_redirects {
            None => d.max_redirects,
            Some(n) => match usize::try_from(n) {
                Ok(n) if n <= MAX_MAX_REDIRECTS => n,
                _ => {
                    return Err(SettingError::new(
                        "tools.web_fetch.max_redirects",
                        format!("expected 0..={MAX_MAX_REDIRECTS}, got {n}"),
                    ))
                }
            },
        };
        Ok(WebFetchSettings {
            allow_private,
            max_bytes,
            timeout,
            user_agent,
            max_redirects,
        })
    }
}

/// HTTP method of `web_fetch` (GET, HEAD, POST, PUT, PATCH, DELETE; lowercase accepted).
/// Variants carry no docs so the schema is a plain inline string `enum`, which every
/// provider's function-calling dialect understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
#[schemars(inline)]
#[allow(missing_docs)]
pub enum HttpMethod {
    #[serde(alias = "get")]
    Get,
    #[serde(alias = "head")]
    Head,
    #[serde(alias = "post")]
    Post,
    #[serde(alias = "put")]
    Put,
    #[serde(alias = "patch")]
    Patch,
    #[serde(alias = "delete")]
    Delete,
}

impl HttpMethod {
    fn method(self) -> Method {
        match self {
            HttpMethod::Get => Method::GET,
            HttpMethod::Head => Method::HEAD,
            HttpMethod::Post => Method::POST,
            HttpMethod::Put => Method::PUT,
            HttpMethod::Patch => Method::PATCH,
            HttpMethod::Delete => Method::DELETE,
        }
    }
}

/// Arguments of `web_fetch`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WebFetchArgs {
    /// `http://` or `https://`.
    pub url: String,
    /// Default GET.
    pub method: Option<HttpMethod>,
    /// Request headers.
    pub headers: Option<BTreeMap<String, String>>,
    /// Request body.
    pub body: Option<String>,
}

/// `web_fetch`: fetch a URL and return its body as text.
pub struct WebFetch {
    client: GuardedClient,
    max_bytes: usize,
    timeout: Duration,
}

impl WebFetch {
    /// Build the tool and its guarded HTTP client.
    ///
    /// # Errors
    /// The HTTP client cannot be built.
    pub fn new(settings: WebFetchSettings) -> Result<Self, ClientBuildError> {
        let client = GuardedClient::new(
            SsrfPolicy::new(settings.allow_private),
            settings.max_redirects,
            settings.timeout.min(Duration::from_secs(10)),
            &settings.user_agent,
        )?;
        Ok(Self::with_client(
            client,
            settings.max_bytes,
            settings.timeout,
        ))
    }

    fn with_client(client: GuardedClient, max_bytes: usize, timeout: Duration) -> Self {
        Self {
            client,
            max_bytes,
            timeout,
        }
    }

    fn timeout_error(&self) -> ToolError {
        ToolError::Timeout(self.timeout.as_secs_f64().ceil() as u64)
    }

    fn map_fetch_error(&self, e: FetchError, url: &Url) -> ToolError {
        match e {
            FetchError::Blocked(b) if b.reason == "cloud metadata" && b.target.parse::<std::net::IpAddr>().is_err() => {
                ToolError::PermissionDenied(format!(
                    "web_fetch refused {url}: {} is a cloud metadata host name, which is always blocked",
                    b.target
                ))
            }
            FetchError::Blocked(b) => ToolError::PermissionDenied(format!(
                "web_fetch refused {url}: {b}. Private, loopback, link-local, metadata and reserved \
                 addresses are blocked; if this host must be reachable, an operator can add its \
                 address or network to tools.web_fetch.allow_private"
            )),
            FetchError::Scheme(s) => ToolError::ExecutionFailed(format!(
                "{url} redirected to a `{s}` URL; web_fetch follows only http and https"
            )),
            FetchError::TooManyRedirects(n) => ToolError::ExecutionFailed(format!(
                "{url}: more than {n} redirects; fetch the last URL directly if it is intended"
            )),
            FetchError::Dns(m) => ToolError::ExecutionFailed(format!(
                "{m}; check the host name in the URL"
            )),
            FetchError::Timeout => self.timeout_error(),
            FetchError::Connect(m) => {
                ToolError::ExecutionFailed(format!("cannot connect for {url}: {m}"))
            }
            FetchError::BadUrl(m) | FetchError::Http(m) => {
                ToolError::ExecutionFailed(format!("fetching {url} failed: {m}"))
            }
        }
    }

    /// Fetch `req`; the body is read until `deadline`, and what arrived by then is returned
    /// marked as partial.
    async fn fetch(
        &self,
        req: GuardedRequest,
        deadline: tokio::time::Instant,
    ) -> Result<Value, ToolError> {
        let requested = req.url.clone();
        let is_head = req.method == Method::HEAD;
        let (mut resp, final_url) = tokio::time::timeout_at(deadline, self.client.send(req))
            .await
            .map_err(|_| self.timeout_error())?
            .map_err(|e| self.map_fetch_error(e, &requested))?;
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let mime = decode::mime_of(&content_type);
        let mut partial = false;
        let result = |body: String, bytes: usize, truncated: bool, partial: bool| {
            let mut v = json!({
                "status": status,
                "content_type": content_type,
                "body": body,
                "url": final_url.as_str(),
                "bytes": bytes,
                "truncated": truncated || partial,
            });
            if partial {
                v["partial"] = json!(true);
            }
            v
        };
        if is_head {
            return Ok(result(String::new(), 0, false, false));
        }
        if decode::is_binary_mime(&mime) {
            // Not read at all: the model gets a description, never bytes.
            let size = resp
                .content_length()
                .map_or_else(|| "unknown size".to_string(), |n| format!("{n} bytes"));
            return Ok(result(
                format!("[binary content: {mime}, {size}; web_fetch returns text only]"),
                0,
                false,
                false,
            ));
        }
        let cap = self.max_bytes;
        let mut buf: Vec<u8> = Vec::with_capacity(
            resp.content_length()
                .map_or(0, |n| usize::try_from(n).unwrap_or(cap))
                .min(cap),
        );
        let mut truncated = false;
        loop {
            let Ok(chunk) = tokio::time::timeout_at(deadline, resp.chunk()).await else {
                // The body still trickling in at the deadline: keep what arrived.
                partial = true;
                break;
            };
            let chunk = chunk.map_err(|e| {
                if e.is_timeout() {
                    self.timeout_error()
                } else {
                    ToolError::ExecutionFailed(format!(
                        "reading the body of {final_url} failed: {e}"
                    ))
                }
            })?;
            let Some(chunk) = chunk else { break };
            let room = cap - buf.len();
            if chunk.len() > room {
                buf.extend_from_slice(&chunk[..room]);
                truncated = true;
                break;
            }
            buf.extend_from_slice(&chunk);
        }
        drop(resp);
        let bytes = buf.len();
        let Some(mut text) = decode::body_text(buf, &content_type, &mime, truncated, &final_url)
        else {
            return Ok(result(
                format!("[binary content: {bytes} bytes without a text type; web_fetch returns text only]"),
                bytes,
                truncated,
                partial,
            ));
        };
        if truncated {
            text.push_str(&format!("\n... [truncated: body exceeded {cap} bytes]"));
        }
        if partial {
            text.push_str(&format!(
                "\n... [partial: the body was still arriving when the {}s deadline passed; this is what came before]",
                self.timeout.as_secs_f64().ceil() as u64
            ));
        }
        Ok(result(text, bytes, truncated, partial))
    }
}

#[async_trait]
impl Tool for WebFetch {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::WebFetch.name()
    }
    fn description(&self) -> &str {
        // Redirects, the size cap and refused addresses are told in the result or the error
        // when they apply (docs/tools.md); every request carries this text (issue 32).
        "Fetch an http(s) URL; HTML comes back as readable text. Private addresses are refused."
    }
    fn parameters(&self) -> Value {
        schema_of::<WebFetchArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::Network
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: WebFetchArgs = parse_args(self.name(), args)?;
        let url = Url::parse(a.url.trim())
            .map_err(|e| ToolError::InvalidArgs(format!("`{}` is not a valid URL: {e}", a.url)))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ToolError::InvalidArgs(format!(
                "web_fetch only fetches http:// and https:// URLs, not `{}:`",
                url.scheme()
            )));
        }
        let method = a.method.unwrap_or(HttpMethod::Get);
        if a.body.is_some() && matches!(method, HttpMethod::Get | HttpMethod::Head) {
            return Err(ToolError::InvalidArgs(
                "`body` is sent only with POST, PUT, PATCH or DELETE: set `method`".into(),
            ));
        }
        let mut headers = HeaderMap::new();
        for (k, v) in a.headers.unwrap_or_default() {
            let name = HeaderName::from_bytes(k.as_bytes()).map_err(|_| {
                ToolError::InvalidArgs(format!("`{k}` is not a valid HTTP header name"))
            })?;
            if FORBIDDEN_HEADERS.contains(&name.as_str()) {
                return Err(ToolError::InvalidArgs(format!(
                    "header `{k}` is set by web_fetch itself and cannot be given"
                )));
            }
            let value = HeaderValue::from_str(&v).map_err(|_| {
                ToolError::InvalidArgs(format!(
                    "the value of header `{k}` must be visible ASCII text without line breaks"
                ))
            })?;
            headers.append(name, value);
        }
        let req = GuardedRequest {
            method: method.method(),
            url,
            headers,
            body: a.body.map(Bytes::from),
        };
        tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => Err(ToolError::Cancelled),
            r = self.fetch(req, tokio::time::Instant::now() + self.timeout) => r,
        }
    }
}

#[cfg(test)]
#[path = "fetch_tests.rs"]
mod tests;
