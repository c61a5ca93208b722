//! Web tools: `web_fetch` (model-chosen URLs, behind the SSRF guard of [`crate::net::ssrf`]) and
//! `web_search` (the operator's search backend: SearXNG or Brave).
//!
//! `web_fetch` never dials an address it has not checked (see [`crate::net::ssrf`]), reads at most
//! `max_bytes` of a body as a stream, and returns text only. `web_search` is deliberately NOT
//! behind the SSRF guard: its endpoint comes from the operator's config (people run SearXNG on
//! localhost), never from the model, and the query only goes into the query string.

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

use super::html;
use crate::net::ssrf::{self, Cidr, FetchError, GuardedClient, GuardedRequest, SsrfPolicy};
use super::{parse_args, schema_of, Effect, Tool, ToolContext, ToolError};
use crate::types::Secret;

/// Default cap on a fetched body (10 MB, seed 001); the registry later cuts the result to
/// 64 KiB, so this bounds memory and transfer, not what the model sees.
pub const DEFAULT_MAX_BYTES: usize = 10 * 1024 * 1024;
/// Largest `max_bytes` accepted (100 MiB): one call must not be able to exhaust memory.
pub const MAX_MAX_BYTES: usize = 100 * 1024 * 1024;
/// Default whole-fetch deadline (seconds): DNS, connect, every redirect and the body.
pub const DEFAULT_FETCH_TIMEOUT_SECS: u64 = 30;
/// Longest deadline accepted for either web tool (seconds), as for exec_shell.
pub const MAX_TIMEOUT_SECS: u64 = 300;
/// Default redirect hops followed by `web_fetch`.
pub const DEFAULT_MAX_REDIRECTS: usize = 5;
/// Most redirect hops an operator may allow.
pub const MAX_MAX_REDIRECTS: usize = 10;
/// Default `web_search` deadline (seconds).
pub const DEFAULT_SEARCH_TIMEOUT_SECS: u64 = 15;
/// Default `num_results` of `web_search`.
pub const DEFAULT_NUM_RESULTS: usize = 5;
/// Most results one `web_search` call returns (Brave's own per-request limit).
pub const MAX_NUM_RESULTS: usize = 20;
/// Largest search backend response read (2 MiB): a results page is a few KiB.
const MAX_SEARCH_RESPONSE_BYTES: usize = 2 * 1024 * 1024;
/// Brave's web search API, used when `provider = "brave"` has no `endpoint`.
pub const BRAVE_DEFAULT_ENDPOINT: &str = "https://api.search.brave.com/res/v1/web/search";
/// Bytes inspected for NUL to decide that an untyped body is binary.
const BINARY_SNIFF_BYTES: usize = 8192;
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

fn default_user_agent() -> String {
    concat!("clawft/", env!("CARGO_PKG_VERSION"), " (web_fetch)").to_string()
}

/// Resolved `web_fetch` settings.
#[derive(Debug, Clone)]
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
    pub fn resolve(&self) -> Result<WebFetchSettings, String> {
        let d = WebFetchSettings::default();
        let mut allow_private = Vec::new();
        for (i, s) in self.allow_private.iter().flatten().enumerate() {
            allow_private.push(
                s.parse::<Cidr>()
                    .map_err(|e| format!("tools.web_fetch.allow_private[{i}]: {e}"))?,
            );
        }
        let max_bytes = match self.max_bytes {
            None => d.max_bytes,
            Some(n) => match usize::try_from(n) {
                Ok(n) if (1..=MAX_MAX_BYTES).contains(&n) => n,
                _ => {
                    return Err(format!(
                        "tools.web_fetch.max_bytes: expected 1..={MAX_MAX_BYTES} bytes, got {n}"
                    ))
                }
            },
        };
        let timeout = match self.timeout_secs {
            None => d.timeout,
            Some(n) if (1..=MAX_TIMEOUT_SECS).contains(&n) => Duration::from_secs(n),
            Some(n) => {
                return Err(format!(
                    "tools.web_fetch.timeout_secs: expected 1..={MAX_TIMEOUT_SECS} seconds, got {n}"
                ))
            }
        };
        let user_agent = match &self.user_agent {
            None => d.user_agent,
            Some(ua) => {
                ssrf::validate_user_agent(ua)
                    .map_err(|e| format!("tools.web_fetch.user_agent: {e}"))?;
                ua.clone()
            }
        };
        let max_redirects = match self.max_redirects {
            None => d.max_redirects,
            Some(n) => match usize::try_from(n) {
                Ok(n) if n <= MAX_MAX_REDIRECTS => n,
                _ => {
                    return Err(format!(
                        "tools.web_fetch.max_redirects: expected 0..={MAX_MAX_REDIRECTS}, got {n}"
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
    /// URL to fetch; must start with `http://` or `https://`.
    pub url: String,
    /// HTTP method: GET, HEAD, POST, PUT, PATCH or DELETE (default: GET).
    pub method: Option<HttpMethod>,
    /// Request headers as name → value strings (default: none).
    pub headers: Option<BTreeMap<String, String>>,
    /// Request body, for POST, PUT, PATCH or DELETE (default: none).
    pub body: Option<String>,
}

/// `web_fetch`: fetch a URL and return its body as text.
pub struct WebFetch {
    client: GuardedClient,
    max_bytes: usize,
    timeout: Duration,
    description: String,
}

impl WebFetch {
    /// Build the tool and its guarded HTTP client.
    ///
    /// # Errors
    /// The HTTP client cannot be built.
    pub fn new(settings: WebFetchSettings) -> Result<Self, String> {
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
            settings.max_redirects,
        ))
    }

    fn with_client(
        client: GuardedClient,
        max_bytes: usize,
        timeout: Duration,
        max_redirects: usize,
    ) -> Self {
        let description = format!(
            "Fetch a URL over http(s) and return the response body as text. HTML is converted to \
             readable text with links as `text (url)`; binary content (images, archives…) is \
             described, not returned. Redirects are followed (up to {max_redirects}). Private, \
             loopback, link-local and cloud-metadata addresses are refused. Bodies over \
             {max_bytes} bytes are cut (truncated: true). `url` is the final URL after redirects \
             and `bytes` the body bytes read. Returns: {{status, content_type, body, url, bytes, \
             truncated}}"
        );
        Self {
            client,
            max_bytes,
            timeout,
            description,
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

    async fn fetch(&self, req: GuardedRequest) -> Result<Value, ToolError> {
        let requested = req.url.clone();
        let is_head = req.method == Method::HEAD;
        let (mut resp, final_url) = self
            .client
            .send(req)
            .await
            .map_err(|e| self.map_fetch_error(e, &requested))?;
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let mime = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        let result = |body: String, bytes: usize, truncated: bool| {
            json!({
                "status": status,
                "content_type": content_type,
                "body": body,
                "url": final_url.as_str(),
                "bytes": bytes,
                "truncated": truncated,
            })
        };
        if is_head {
            return Ok(result(String::new(), 0, false));
        }
        if is_binary_mime(&mime) {
            // Not read at all: the model gets a description, never bytes.
            let size = resp
                .content_length()
                .map_or_else(|| "unknown size".to_string(), |n| format!("{n} bytes"));
            return Ok(result(
                format!("[binary content: {mime}, {size}; web_fetch returns text only]"),
                0,
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
            let chunk = resp.chunk().await.map_err(|e| {
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
        let untyped = mime.is_empty() || mime == "application/octet-stream";
        if untyped && buf[..bytes.min(BINARY_SNIFF_BYTES)].contains(&0) {
            return Ok(result(
                format!("[binary content: {bytes} bytes without a text type; web_fetch returns text only]"),
                bytes,
                truncated,
            ));
        }
        let mut text = decode_text(&buf, &content_type, truncated);
        drop(buf);
        let is_html = matches!(mime.as_str(), "text/html" | "application/xhtml+xml")
            || ((untyped || mime == "text/plain") && html::looks_like_html(text.as_bytes()));
        if is_html {
            text = html::html_to_text(&text, Some(&final_url));
        }
        if truncated {
            text.push_str(&format!("\n... [truncated: body exceeded {cap} bytes]"));
        }
        Ok(result(text, bytes, truncated))
    }
}

/// Types that are never text: described instead of read.
fn is_binary_mime(mime: &str) -> bool {
    let (top, sub) = mime.split_once('/').unwrap_or((mime, ""));
    matches!(top, "image" | "audio" | "video" | "font" | "model")
        || (top == "application"
            && !sub.ends_with("+xml")
            && !sub.ends_with("+json")
            && matches!(
                sub,
                "pdf"
                    | "zip"
                    | "gzip"
                    | "x-gzip"
                    | "x-tar"
                    | "x-bzip2"
                    | "x-xz"
                    | "x-7z-compressed"
                    | "x-rar-compressed"
                    | "vnd.rar"
                    | "zstd"
                    | "wasm"
                    | "java-archive"
                    | "x-msdownload"
                    | "x-executable"
                    | "x-sharedlib"
                    | "msword"
                    | "vnd.ms-excel"
                    | "vnd.ms-powerpoint"
                    | "x-shockwave-flash"
            )
            || sub.starts_with("vnd.openxmlformats")
            || sub.starts_with("vnd.oasis.opendocument"))
}

/// Bytes → text: windows-1252/latin-1 when declared, else UTF-8 (lossy). A multi-byte
/// sequence cut by truncation is dropped rather than shown as U+FFFD.
fn decode_text(buf: &[u8], content_type: &str, truncated: bool) -> String {
    let charset = content_type
        .split(';')
        .skip(1)
        .filter_map(|p| p.trim().split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("charset"))
        .map(|(_, v)| v.trim().trim_matches('"').to_ascii_lowercase());
    if let Some("iso-8859-1" | "latin1" | "latin-1" | "windows-1252" | "cp1252" | "us-ascii") =
        charset.as_deref()
    {
        return buf.iter().map(|&b| cp1252(b)).collect();
    }
    let mut buf = buf.strip_prefix(b"\xef\xbb\xbf").unwrap_or(buf);
    if truncated {
        if let Err(e) = std::str::from_utf8(buf) {
            if e.error_len().is_none() {
                buf = &buf[..e.valid_up_to()];
            }
        }
    }
    String::from_utf8_lossy(buf).into_owned()
}

/// One windows-1252 byte as a char (latin-1 except 0x80..=0x9F).
fn cp1252(b: u8) -> char {
    const HIGH: [char; 32] = [
        '€', '\u{81}', '‚', 'ƒ', '„', '…', '†', '‡', 'ˆ', '‰', 'Š', '‹', 'Œ', '\u{8d}', 'Ž',
        '\u{8f}', '\u{90}', '‘', '’', '“', '”', '•', '–', '—', '˜', '™', 'š', '›', 'œ', '\u{9d}',
        'ž', 'Ÿ',
    ];
    match b {
        0x80..=0x9f => HIGH[usize::from(b - 0x80)],
        _ => char::from(b),
    }
}

#[async_trait]
impl Tool for WebFetch {
    fn name(&self) -> &str {
        "web_fetch"
    }
    fn description(&self) -> &str {
        &self.description
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
            r = tokio::time::timeout(self.timeout, self.fetch(req)) => {
                r.unwrap_or_else(|_| Err(self.timeout_error()))
            }
        }
    }
}

/// A search backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchProvider {
    /// A SearXNG instance with the JSON format enabled.
    Searxng,
    /// The Brave Search API.
    Brave,
}

/// Resolved `web_search` settings. `provider: None` means not configured: the tool answers
/// with an informational result.
#[derive(Debug, Clone)]
pub struct WebSearchSettings {
    /// The backend (default: none, not configured).
    pub provider: Option<SearchProvider>,
    /// Base URL of the backend (SearXNG: the instance root; Brave: the full API URL).
    pub endpoint: Option<Url>,
    /// The API key resolved by the config layer from `api_key`/`api_key_env`/`api_key_file`.
    pub api_key: Option<Secret>,
    /// Deadline of one search (default 15 s).
    pub timeout: Duration,
}

impl Default for WebSearchSettings {
    fn default() -> Self {
        Self {
            provider: None,
            endpoint: None,
            api_key: None,
            timeout: Duration::from_secs(DEFAULT_SEARCH_TIMEOUT_SECS),
        }
    }
}

/// `tools.web_search` in the config file.
#[derive(Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WebSearchFile {
    /// `searxng` or `brave` (default `searxng` when `endpoint` is set; unset with no endpoint:
    /// search not configured).
    pub provider: Option<String>,
    /// Backend URL: the SearXNG instance (e.g. `http://127.0.0.1:8888`), or for Brave
    /// optionally another API URL (default `https://api.search.brave.com/res/v1/web/search`).
    /// Operator-chosen, so it is not subject to web_fetch's private-address blocking.
    pub endpoint: Option<String>,
    /// API key, inline (Brave; prefer `api_key_env` or `api_key_file`).
    pub api_key: Option<String>,
    /// Environment variable holding the API key.
    pub api_key_env: Option<String>,
    /// File holding the API key (relative paths resolve in `$CREDENTIALS_DIRECTORY`).
    pub api_key_file: Option<String>,
    /// Deadline of one search in seconds (default 15, 1..=300).
    pub timeout_secs: Option<u64>,
}

impl WebSearchFile {
    /// Validate into [`WebSearchSettings`]. `api_key` is the key the config layer resolved from
    /// `api_key`/`api_key_env`/`api_key_file` (this type only holds those strings).
    ///
    /// # Errors
    /// A message naming the key (`tools.web_search.…`) and what is expected.
    pub fn resolve(&self, api_key: Option<Secret>) -> Result<WebSearchSettings, String> {
        let provider = match self.provider.as_deref().map(str::trim) {
            None if self.endpoint.is_none() => None,
            None => Some(SearchProvider::Searxng),
            Some(p) if p.eq_ignore_ascii_case("searxng") => Some(SearchProvider::Searxng),
            Some(p) if p.eq_ignore_ascii_case("brave") => Some(SearchProvider::Brave),
            Some(p) => {
                return Err(format!(
                    "tools.web_search.provider: expected \"searxng\" or \"brave\", got \"{p}\""
                ))
            }
        };
        let endpoint = match &self.endpoint {
            None => None,
            Some(e) => {
                let u = Url::parse(e.trim()).map_err(|err| {
                    format!("tools.web_search.endpoint: `{e}` is not a URL ({err}); expected e.g. http://127.0.0.1:8888")
                })?;
                if !matches!(u.scheme(), "http" | "https") {
                    return Err(format!(
                        "tools.web_search.endpoint: expected an http:// or https:// URL, got `{e}`"
                    ));
                }
                Some(u)
            }
        };
        let endpoint = match provider {
            Some(SearchProvider::Searxng) if endpoint.is_none() => {
                return Err("tools.web_search.endpoint: the searxng provider needs the URL of a SearXNG instance (e.g. http://127.0.0.1:8888)".into())
            }
            Some(SearchProvider::Brave) if api_key.is_none() => {
                return Err("tools.web_search.api_key: the brave provider needs an API key (set tools.web_search.api_key_env or api_key_file)".into())
            }
            Some(SearchProvider::Brave) if endpoint.is_none() => {
                Some(Url::parse(BRAVE_DEFAULT_ENDPOINT).map_err(|e| e.to_string())?)
            }
            _ => endpoint,
        };
        let timeout = match self.timeout_secs {
            None => Duration::from_secs(DEFAULT_SEARCH_TIMEOUT_SECS),
            Some(n) if (1..=MAX_TIMEOUT_SECS).contains(&n) => Duration::from_secs(n),
            Some(n) => {
                return Err(format!(
                "tools.web_search.timeout_secs: expected 1..={MAX_TIMEOUT_SECS} seconds, got {n}"
            ))
            }
        };
        Ok(WebSearchSettings {
            provider,
            endpoint,
            api_key,
            timeout,
        })
    }
}

/// Arguments of `web_search`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WebSearchArgs {
    /// Search query.
    pub query: String,
    /// Maximum number of results, 1 to 20 (default: 5).
    pub num_results: Option<u64>,
}

#[derive(Deserialize)]
struct SearxngResponse {
    results: Vec<SearxngResult>,
}

#[derive(Deserialize)]
struct SearxngResult {
    #[serde(default)]
    title: String,
    #[serde(default)]
    url: String,
    #[serde(default)]
    content: Option<String>,
}

#[derive(Deserialize)]
struct BraveResponse {
    #[serde(default)]
    web: Option<BraveWeb>,
}

#[derive(Deserialize)]
struct BraveWeb {
    #[serde(default)]
    results: Vec<BraveResult>,
}

#[derive(Deserialize)]
struct BraveResult {
    #[serde(default)]
    title: String,
    #[serde(default)]
    url: String,
    #[serde(default)]
    description: Option<String>,
}

/// `web_search`: query the operator's search backend.
pub struct WebSearch {
    client: reqwest::Client,
    settings: WebSearchSettings,
}

impl WebSearch {
    /// Build the tool and its HTTP client (system proxies off, as everywhere in the daemon,
    /// which reads the environment only in config).
    ///
    /// # Errors
    /// The HTTP client cannot be built.
    pub fn new(settings: WebSearchSettings) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::limited(3))
            .connect_timeout(settings.timeout.min(Duration::from_secs(10)))
            .user_agent(default_user_agent())
            .build()
            .map_err(|e| format!("cannot build the web_search HTTP client: {e}"))?;
        Ok(Self { client, settings })
    }

    fn timeout_error(&self) -> ToolError {
        ToolError::Timeout(self.settings.timeout.as_secs_f64().ceil() as u64)
    }

    async fn search(
        &self,
        provider: SearchProvider,
        endpoint: &Url,
        query: &str,
        n: usize,
    ) -> Result<Vec<Value>, ToolError> {
        let (what, rb) = match provider {
            SearchProvider::Searxng => {
                let mut u = endpoint.clone();
                if !u.path().trim_end_matches('/').ends_with("/search") {
                    let p = format!("{}/search", u.path().trim_end_matches('/'));
                    u.set_path(&p);
                }
                u.query_pairs_mut()
                    .append_pair("q", query)
                    .append_pair("format", "json");
                ("SearXNG", self.client.get(u))
            }
            SearchProvider::Brave => {
                let mut u = endpoint.clone();
                u.query_pairs_mut()
                    .append_pair("q", query)
                    .append_pair("count", &n.to_string());
                let mut rb = self.client.get(u).header("Accept", "application/json");
                if let Some(k) = &self.settings.api_key {
                    rb = rb.header("X-Subscription-Token", k.expose());
                }
                ("Brave", rb)
            }
        };
        let mut resp = rb.send().await.map_err(|e| {
            if e.is_timeout() {
                self.timeout_error()
            } else {
                ToolError::ExecutionFailed(format!(
                    "the {what} search backend at {} cannot be reached: {e}",
                    endpoint.origin().ascii_serialization()
                ))
            }
        })?;
        let status = resp.status();
        if !status.is_success() {
            let hint = match (provider, status.as_u16()) {
                (_, 429) => "; the backend is rate limiting, retry later",
                (SearchProvider::Searxng, 403) => {
                    "; SearXNG answers 403 when `json` is not in search.formats of its settings.yml"
                }
                (SearchProvider::Brave, 401 | 403) => "; check the Brave API key",
                _ => "",
            };
            return Err(ToolError::ExecutionFailed(format!(
                "the {what} search backend answered HTTP {status}{hint}"
            )));
        }
        let mut buf = Vec::new();
        while let Some(c) = resp.chunk().await.map_err(|e| {
            if e.is_timeout() {
                self.timeout_error()
            } else {
                ToolError::ExecutionFailed(format!("reading the {what} response failed: {e}"))
            }
        })? {
            if buf.len() + c.len() > MAX_SEARCH_RESPONSE_BYTES {
                return Err(ToolError::ExecutionFailed(format!(
                    "the {what} response is larger than {MAX_SEARCH_RESPONSE_BYTES} bytes"
                )));
            }
            buf.extend_from_slice(&c);
        }
        let snippet =
            |s: Option<String>| s.map(|s| html::html_to_text(&s, None)).unwrap_or_default();
        let results: Vec<Value> = match provider {
            SearchProvider::Searxng => {
                let r: SearxngResponse = serde_json::from_slice(&buf).map_err(|e| {
                    ToolError::ExecutionFailed(format!(
                        "the SearXNG response is not the expected JSON (an object with `results`: [{{title, url, content}}]): {e}"
                    ))
                })?;
                r.results
                    .into_iter()
                    .map(|x| json!({"title": html::html_to_text(&x.title, None), "url": x.url, "snippet": snippet(x.content)}))
                    .collect()
            }
            SearchProvider::Brave => {
                let r: BraveResponse = serde_json::from_slice(&buf).map_err(|e| {
                    ToolError::ExecutionFailed(format!(
                        "the Brave response is not the expected JSON (an object with `web.results`: [{{title, url, description}}]): {e}"
                    ))
                })?;
                r.web
                    .map(|w| w.results)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|x| json!({"title": html::html_to_text(&x.title, None), "url": x.url, "snippet": snippet(x.description)}))
                    .collect()
            }
        };
        Ok(results.into_iter().take(n).collect())
    }
}

#[async_trait]
impl Tool for WebSearch {
    fn name(&self) -> &str {
        "web_search"
    }
    fn description(&self) -> &str {
        "Search the web with the configured search backend and return titles, URLs and snippets \
         (use web_fetch to read a result). Returns: {query, results: [{title, url, snippet}], count}"
    }
    fn parameters(&self) -> Value {
        schema_of::<WebSearchArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::Network
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: WebSearchArgs = parse_args(self.name(), args)?;
        let query = a.query.trim();
        if query.is_empty() {
            return Err(ToolError::InvalidArgs(
                "`query` is empty: give the words to search for".into(),
            ));
        }
        let n = match a.num_results {
            None => DEFAULT_NUM_RESULTS,
            Some(0) => {
                return Err(ToolError::InvalidArgs(format!(
                    "`num_results` must be 1 to {MAX_NUM_RESULTS}"
                )))
            }
            Some(n) => usize::try_from(n)
                .unwrap_or(MAX_NUM_RESULTS)
                .min(MAX_NUM_RESULTS),
        };
        let (Some(provider), Some(endpoint)) = (self.settings.provider, &self.settings.endpoint)
        else {
            return Ok(json!({
                "error": "web search not configured",
                "message": "No search API endpoint is configured. Set 'tools.web_search.endpoint' in your config.",
                "query": query,
            }));
        };
        let results = tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => return Err(ToolError::Cancelled),
            r = tokio::time::timeout(self.settings.timeout, self.search(provider, endpoint, query, n)) => {
                r.unwrap_or_else(|_| Err(self.timeout_error()))?
            }
        };
        Ok(json!({"query": query, "count": results.len(), "results": results}))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::collections::HashMap;
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    use axum::body::Body;
    use axum::extract::{Path, Query, State};
    use axum::http::{HeaderMap as AxHeaders, Method as AxMethod, StatusCode};
    use axum::response::{IntoResponse, Response};
    use axum::routing::{any, get};
    use axum::Router;
    use tokio::net::TcpListener;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::tools::Workspace;
    use crate::types::SessionKey;

    struct Ctx {
        _dir: tempfile::TempDir,
        ctx: ToolContext,
    }

    fn ctx() -> Ctx {
        crate::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext {
            workspace: Arc::new(Workspace::open(dir.path()).unwrap()),
            session: SessionKey::parse("t:1").unwrap(),
            cancel: CancellationToken::new(),
        };
        Ctx { _dir: dir, ctx }
    }

    /// Listeners on 127.0.0.1 (and [::1] when it binds) that count accepted connections.
    struct Canary {
        port: u16,
        v6_port: Option<u16>,
        hits: Arc<AtomicUsize>,
    }

    async fn canary() -> Canary {
        let hits = Arc::new(AtomicUsize::new(0));
        let l4 = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l4.local_addr().unwrap().port();
        let l6 = match TcpListener::bind(("::1", port)).await {
            Ok(l) => Some(l),
            Err(_) => TcpListener::bind("[::1]:0").await.ok(),
        };
        let v6_port = l6.as_ref().map(|l| l.local_addr().unwrap().port());
        for l in std::iter::once(l4).chain(l6) {
            let hits = hits.clone();
            tokio::spawn(async move {
                while let Ok((s, _)) = l.accept().await {
                    hits.fetch_add(1, Ordering::SeqCst);
                    drop(s);
                }
            });
        }
        Canary {
            port,
            v6_port,
            hits,
        }
    }

    /// One request seen by the echo route: method, headers, body.
    type Recorded = (String, HashMap<String, String>, String);

    #[derive(Clone, Default)]
    struct Seen {
        requests: Arc<Mutex<Vec<Recorded>>>,
    }

    fn chunked(total: Option<usize>) -> Body {
        let chunk = Bytes::from(vec![b'a'; 64 * 1024]);
        let stream = futures::stream::unfold(0usize, move |sent| {
            let chunk = chunk.clone();
            async move {
                match total {
                    Some(t) if sent >= t => None,
                    _ => Some((Ok::<_, std::io::Error>(chunk.clone()), sent + chunk.len())),
                }
            }
        });
        Body::from_stream(stream)
    }

    fn redirect(to: &str) -> Response {
        (StatusCode::FOUND, [("location", to.to_string())]).into_response()
    }

    /// The allowed test server on 127.0.0.2.
    async fn server() -> (SocketAddr, Seen) {
        let seen = Seen::default();
        let app = Router::new()
            .route(
                "/page",
                get(|| async {
                    (
                        [("content-type", "text/html; charset=utf-8")],
                        "<html><head><title>x</title><script>var TOKEN = 'SCRIPT_ONLY';</script></head>\
                         <body><h1>Title</h1><p>Read the <a href=\"/docs\">docs page</a> now.</p></body></html>",
                    )
                }),
            )
            .route(
                "/untyped",
                get(|| async {
                    Response::builder()
                        .body(Body::from("<!doctype html><p>sniffed <b>html</b></p>"))
                        .unwrap()
                }),
            )
            .route(
                "/unicode",
                get(|| async {
                    (
                        [("content-type", "text/plain; charset=utf-8")],
                        "héllo 世界 🌍 — ok",
                    )
                }),
            )
            .route(
                "/latin1",
                get(|| async {
                    (
                        [("content-type", "text/plain; charset=ISO-8859-1")],
                        Bytes::from_static(b"caf\xe9 \x80"),
                    )
                }),
            )
            .route(
                "/image",
                get(|| async { ([("content-type", "image/png")], vec![0x89u8, b'P', b'N', b'G', 0, 0, 1, 2]) }),
            )
            .route("/empty", get(|| async { ([("content-type", "text/plain")], "") }))
            .route("/missing", get(|| async { (StatusCode::NOT_FOUND, "no such page") }))
            .route(
                "/big",
                get(|| async { ([("content-type", "text/plain")], chunked(Some(12 * 1024 * 1024))) }),
            )
            .route(
                "/endless",
                get(|| async { ([("content-type", "text/plain")], chunked(None)) }),
            )
            .route(
                "/redir",
                get(|Query(q): Query<HashMap<String, String>>| async move {
                    redirect(q.get("to").map_or("/", String::as_str))
                }),
            )
            .route(
                "/hop/{n}",
                get(|Path(n): Path<u32>| async move {
                    if n == 0 {
                        "done".into_response()
                    } else {
                        redirect(&format!("/hop/{}", n - 1))
                    }
                }),
            )
            .route(
                "/echo",
                any(
                    |State(seen): State<Seen>, m: AxMethod, h: AxHeaders, body: Bytes| async move {
                        let headers = h
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
                            .collect();
                        let body = String::from_utf8_lossy(&body).into_owned();
                        seen.requests.lock().unwrap().push((m.to_string(), headers, body));
                        ([("content-type", "application/json")], r#"{"ok":true}"#)
                    },
                ),
            )
            .route(
                "/see-other",
                any(|| async {
                    (StatusCode::SEE_OTHER, [("location", "/echo")]).into_response()
                }),
            )
            .with_state(seen.clone());
        let l = TcpListener::bind("127.0.0.2:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await });
        (addr, seen)
    }

    /// A server on 127.0.0.2 that accepts and never answers.
    async fn silent_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.2:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = l.accept().await {
                held.push(s);
            }
        });
        addr
    }

    fn settings() -> WebFetchSettings {
        WebFetchSettings {
            allow_private: vec!["127.0.0.2/32".parse().unwrap()],
            ..WebFetchSettings::default()
        }
    }

    fn fetcher(s: WebFetchSettings) -> WebFetch {
        WebFetch::new(s).unwrap()
    }

    fn enc(s: &str) -> String {
        url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
    }

    #[tokio::test]
    async fn loopback_spellings_and_redirects_never_connect() {
        let c = ctx();
        let canary = canary().await;
        let (srv, _) = server().await;
        let tool = fetcher(settings());
        let p = canary.port;
        let mut targets: Vec<String> = [
            "http://127.0.0.1:{P}/",
            "http://2130706433:{P}/",
            "http://0x7f000001:{P}/",
            "http://0x7f.1:{P}/",
            "http://0177.0.0.1:{P}/",
            "http://127.1:{P}/",
            "http://127.0.0.1.:{P}/",
            "http://[::ffff:127.0.0.1]:{P}/",
            "http://[::127.0.0.1]:{P}/",
            "http://[64:ff9b::7f00:1]:{P}/",
            "http://localhost:{P}/",
            "http://LOCALHOST.:{P}/",
            "https://127.0.0.1:{P}/",
        ]
        .iter()
        .map(|t| t.replace("{P}", &p.to_string()))
        .collect();
        if let Some(p6) = canary.v6_port {
            targets.push(format!("http://[::1]:{p6}/"));
            targets.push(format!("http://[0:0:0:0:0:0:0:1]:{p6}/"));
        }
        let mut all = targets.clone();
        for t in &targets {
            all.push(format!("http://{srv}/redir?to={}", enc(t)));
        }
        // A redirect chain that ends on loopback after an allowed hop.
        all.push(format!(
            "http://{srv}/redir?to={}",
            enc(&format!("/redir?to={}", enc(&targets[0])))
        ));
        for u in &all {
            let e = tool
                .execute(json!({ "url": u }), &c.ctx)
                .await
                .expect_err(u);
            assert_eq!(e.code(), "PERMISSION_DENIED", "{u}: {e}");
            assert!(
                e.to_string().contains("tools.web_fetch.allow_private"),
                "{e}"
            );
        }
        assert_eq!(
            canary.hits.load(Ordering::SeqCst),
            0,
            "a blocked target was dialled"
        );
    }

    #[tokio::test]
    async fn canary_detects_connections_when_allowed() {
        // Positive control: the same canary counts a connection when policy allows it, so the
        // zero above means "not dialled", not "canary broken".
        let c = ctx();
        let canary = canary().await;
        let tool = fetcher(WebFetchSettings {
            allow_private: vec!["127.0.0.0/8".parse().unwrap()],
            timeout: Duration::from_secs(2),
            ..WebFetchSettings::default()
        });
        let e = tool
            .execute(
                json!({"url": format!("http://localhost:{}/", canary.port)}),
                &c.ctx,
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), "EXECUTION_FAILED", "{e}");
        assert_eq!(canary.hits.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn rebinding_dns_only_dials_checked_addresses() {
        // A hostile DNS server: answers alternate between loopback only, and loopback mixed
        // with the allowed 127.0.0.2. Whatever it says, only 127.0.0.2 is ever dialled.
        let c = ctx();
        let canary = canary().await;
        let (srv, _) = server().await;
        let calls = Arc::new(AtomicUsize::new(0));
        let calls2 = calls.clone();
        let lookup = Arc::new(move |_h: String| {
            let n = calls2.fetch_add(1, Ordering::SeqCst);
            let answer: Vec<SocketAddr> = if n.is_multiple_of(2) {
                vec!["127.0.0.1:0".parse().unwrap()]
            } else {
                vec![
                    "127.0.0.1:0".parse().unwrap(),
                    "127.0.0.2:0".parse().unwrap(),
                    "[::1]:0".parse().unwrap(),
                ]
            };
            Box::pin(async move { Ok(answer) }) as _
        });
        let s = settings();
        let client = GuardedClient::with_lookup(
            SsrfPolicy::new(s.allow_private.clone()),
            s.max_redirects,
            Duration::from_secs(2),
            &s.user_agent,
            lookup,
        )
        .unwrap();
        let tool = WebFetch::with_client(client, s.max_bytes, s.timeout, s.max_redirects);
        let port = srv.port();
        for i in 0..6 {
            let r = tool
                .execute(
                    json!({"url": format!("http://rebind.test:{port}/unicode")}),
                    &c.ctx,
                )
                .await;
            let reached = matches!(&r, Ok(v) if v["status"] == 200);
            let denied = matches!(&r, Err(e) if e.code() == "PERMISSION_DENIED");
            assert!(reached || denied, "attempt {i}: {r:?}");
        }
        assert!(calls.load(Ordering::SeqCst) >= 2);
        assert_eq!(canary.hits.load(Ordering::SeqCst), 0);
        // Same port on the canary address: a bypass would have hit it.
        let lookup_canary = Arc::new(move |_h: String| {
            Box::pin(async move { Ok(vec!["127.0.0.1:0".parse().unwrap()]) }) as _
        });
        let client = GuardedClient::with_lookup(
            SsrfPolicy::new(s.allow_private.clone()),
            5,
            Duration::from_secs(2),
            &s.user_agent,
            lookup_canary,
        )
        .unwrap();
        let tool = WebFetch::with_client(client, s.max_bytes, s.timeout, 5);
        let e = tool
            .execute(
                json!({"url": format!("http://evil.test:{}/", canary.port)}),
                &c.ctx,
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), "PERMISSION_DENIED", "{e}");
        assert_eq!(canary.hits.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn metadata_names_are_refused_without_dns() {
        let c = ctx();
        let tool = fetcher(WebFetchSettings {
            allow_private: vec!["0.0.0.0/0".parse().unwrap(), "::/0".parse().unwrap()],
            ..WebFetchSettings::default()
        });
        for u in [
            "http://metadata.google.internal/computeMetadata/v1/",
            "http://metadata.google.internal./",
            "http://METADATA/",
            "http://metadata.goog/",
            "http://instance-data/latest/meta-data/",
        ] {
            let e = tool.execute(json!({ "url": u }), &c.ctx).await.unwrap_err();
            assert_eq!(e.code(), "PERMISSION_DENIED", "{u}: {e}");
            assert!(e.to_string().contains("metadata"), "{e}");
        }
        assert_eq!(tool.client.resolver().lookups(), 0, "no DNS query was made");
        // The metadata address itself (not allowed here) is refused before any connection.
        let strict = fetcher(WebFetchSettings::default());
        let e = strict
            .execute(
                json!({"url": "http://169.254.169.254/latest/meta-data/"}),
                &c.ctx,
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), "PERMISSION_DENIED");
        assert!(e.to_string().contains("cloud metadata"), "{e}");
    }

    #[tokio::test]
    async fn redirect_limit_and_schemes() {
        let c = ctx();
        let (srv, _) = server().await;
        let tool = fetcher(settings());
        let v = tool
            .execute(json!({"url": format!("http://{srv}/hop/5")}), &c.ctx)
            .await
            .unwrap();
        assert_eq!(v["status"], 200);
        assert_eq!(v["body"], "done");
        assert_eq!(v["url"], format!("http://{srv}/hop/0"));
        let e = tool
            .execute(json!({"url": format!("http://{srv}/hop/6")}), &c.ctx)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "EXECUTION_FAILED");
        assert!(e.to_string().contains("more than 5 redirects"), "{e}");

        for u in [
            "file:///etc/passwd",
            "ftp://127.0.0.2/x",
            "gopher://127.0.0.2/",
            "not a url",
            "",
        ] {
            let e = tool.execute(json!({ "url": u }), &c.ctx).await.unwrap_err();
            assert_eq!(e.code(), "INVALID_ARGS", "{u}: {e}");
        }
        for to in ["file:///etc/passwd", "ftp://127.0.0.2/"] {
            let e = tool
                .execute(
                    json!({"url": format!("http://{srv}/redir?to={}", enc(to))}),
                    &c.ctx,
                )
                .await
                .unwrap_err();
            assert_eq!(e.code(), "EXECUTION_FAILED", "{to}: {e}");
            assert!(e.to_string().contains("only http and https"), "{e}");
        }
    }

    #[tokio::test]
    async fn html_text_unicode_binary_and_status() {
        let c = ctx();
        let (srv, _) = server().await;
        let tool = fetcher(settings());
        let get = |path: &str| {
            let url = format!("http://{srv}{path}");
            let tool = &tool;
            let ctx = &c.ctx;
            async move { tool.execute(json!({ "url": url }), ctx).await.unwrap() }
        };
        let v = get("/page").await;
        let body = v["body"].as_str().unwrap();
        assert_eq!(
            body,
            format!("# Title\n\nRead the docs page (http://{srv}/docs) now.")
        );
        assert!(!body.contains("SCRIPT_ONLY"));
        assert_eq!(v["content_type"], "text/html; charset=utf-8");
        assert_eq!(v["truncated"], false);

        let v = get("/untyped").await;
        assert_eq!(v["body"], "sniffed html");

        let v = get("/unicode").await;
        assert_eq!(v["body"], "héllo 世界 🌍 — ok");
        assert_eq!(v["bytes"], "héllo 世界 🌍 — ok".len());

        let v = get("/latin1").await;
        assert_eq!(v["body"], "café €");

        let v = get("/image").await;
        let body = v["body"].as_str().unwrap();
        assert!(
            body.starts_with("[binary content: image/png, 8 bytes"),
            "{body}"
        );
        assert!(!body.contains("PNG"));

        let v = get("/empty").await;
        assert_eq!(
            (v["body"].as_str(), v["bytes"].as_u64()),
            (Some(""), Some(0))
        );

        let v = get("/missing").await;
        assert_eq!(v["status"], 404);
        assert_eq!(v["body"], "no such page");

        let v = tool
            .execute(
                json!({"url": format!("http://{srv}/page"), "method": "HEAD"}),
                &c.ctx,
            )
            .await
            .unwrap();
        assert_eq!(
            (v["status"].as_u64(), v["body"].as_str()),
            (Some(200), Some(""))
        );
    }

    #[tokio::test]
    async fn large_bodies_are_cut_while_streaming() {
        let c = ctx();
        let (srv, _) = server().await;
        let tool = fetcher(settings());
        let v = tool
            .execute(json!({"url": format!("http://{srv}/big")}), &c.ctx)
            .await
            .unwrap();
        let suffix = format!("\n... [truncated: body exceeded {DEFAULT_MAX_BYTES} bytes]");
        let body = v["body"].as_str().unwrap();
        assert!(body.ends_with(&suffix));
        assert_eq!(body.len(), DEFAULT_MAX_BYTES + suffix.len());
        assert_eq!(v["bytes"], DEFAULT_MAX_BYTES);
        assert_eq!(v["truncated"], true);

        // An endless body: only a streaming reader that stops at the cap returns at all.
        let tool = fetcher(WebFetchSettings {
            max_bytes: 1024 * 1024,
            timeout: Duration::from_secs(5),
            ..settings()
        });
        let t = Instant::now();
        let v = tool
            .execute(json!({"url": format!("http://{srv}/endless")}), &c.ctx)
            .await
            .unwrap();
        assert!(t.elapsed() < Duration::from_secs(4));
        assert_eq!(v["truncated"], true);
        assert_eq!(v["bytes"], 1024 * 1024);
    }

    #[tokio::test]
    async fn post_with_headers_and_body_reaches_the_server() {
        let c = ctx();
        let (srv, seen) = server().await;
        let tool = fetcher(settings());
        let v = tool
            .execute(
                json!({
                    "url": format!("http://{srv}/echo"),
                    "method": "POST",
                    "headers": {"X-Test": "yes", "Content-Type": "application/json"},
                    "body": "{\"q\": \"ünïcode\"}",
                }),
                &c.ctx,
            )
            .await
            .unwrap();
        assert_eq!(v["status"], 200);
        assert_eq!(v["body"], r#"{"ok":true}"#);
        {
            let reqs = seen.requests.lock().unwrap();
            let (m, h, b) = &reqs[0];
            assert_eq!(m, "POST");
            assert_eq!(h["x-test"], "yes");
            assert_eq!(h["content-type"], "application/json");
            assert!(h["user-agent"].starts_with("clawft/"));
            assert_eq!(b, "{\"q\": \"ünïcode\"}");
        }
        // 303 after POST continues as GET without the body.
        tool.execute(
            json!({"url": format!("http://{srv}/see-other"), "method": "post", "body": "x"}),
            &c.ctx,
        )
        .await
        .unwrap();
        let reqs = seen.requests.lock().unwrap();
        let (m, _, b) = reqs.last().unwrap();
        assert_eq!((m.as_str(), b.as_str()), ("GET", ""));
    }

    #[tokio::test]
    async fn credentials_are_dropped_on_cross_origin_redirects() {
        let c = ctx();
        let (a, seen_a) = server().await;
        let (b, seen_b) = server().await;
        let tool = fetcher(settings());
        let headers = json!({"Authorization": "Bearer SECRET", "Cookie": "s=1", "X-Keep": "k"});
        // Same origin: kept.
        tool.execute(
            json!({"url": format!("http://{a}/redir?to=/echo"), "headers": headers}),
            &c.ctx,
        )
        .await
        .unwrap();
        let (_, h, _) = seen_a.requests.lock().unwrap()[0].clone();
        assert_eq!(h["authorization"], "Bearer SECRET");
        // Other origin (another port): credentials dropped, other headers kept.
        let to = enc(&format!("http://{b}/echo"));
        tool.execute(
            json!({"url": format!("http://{a}/redir?to={to}"), "headers": headers}),
            &c.ctx,
        )
        .await
        .unwrap();
        let (_, h, _) = seen_b.requests.lock().unwrap()[0].clone();
        assert!(
            !h.contains_key("authorization") && !h.contains_key("cookie"),
            "{h:?}"
        );
        assert_eq!(h["x-keep"], "k");
    }

    #[test]
    fn schemas_and_descriptions() {
        crate::install_crypto_provider();
        let f = fetcher(settings());
        assert!(f
            .description()
            .ends_with("Returns: {status, content_type, body, url, bytes, truncated}"));
        let p = f.parameters();
        assert_eq!(p["required"], json!(["url"]));
        assert_eq!(p["additionalProperties"], json!(false));
        let text = p.to_string();
        for m in ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"] {
            assert!(text.contains(&format!("\"{m}\"")), "{text}");
        }
        assert_eq!(f.effect(), Effect::Network);
        let s = WebSearch::new(WebSearchSettings::default()).unwrap();
        assert!(s
            .description()
            .ends_with("Returns: {query, results: [{title, url, snippet}], count}"));
        assert_eq!(s.parameters()["required"], json!(["query"]));
        assert_eq!(s.effect(), Effect::Network);
    }

    #[tokio::test]
    async fn invalid_arguments() {
        let c = ctx();
        let tool = fetcher(settings());
        let u = "http://127.0.0.2:9/";
        for args in [
            json!({"url": u, "method": "TRACE"}),
            json!({"url": u, "body": "x"}),
            json!({"url": u, "headers": {"bad header": "x"}}),
            json!({"url": u, "headers": {"x": "line\nbreak"}}),
            json!({"url": u, "headers": {"Host": "other"}}),
            json!({"url": u, "headers": {"x": 1}}),
            json!({"url": u, "extra": true}),
            json!({}),
        ] {
            let e = tool.execute(args.clone(), &c.ctx).await.unwrap_err();
            assert_eq!(e.code(), "INVALID_ARGS", "{args}: {e}");
        }
    }

    #[tokio::test]
    async fn connect_failure_timeout_and_cancel() {
        let c = ctx();
        // A port with nothing listening on the allowed address.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
            l.local_addr().unwrap()
        };
        let tool = fetcher(settings());
        let e = tool
            .execute(json!({"url": format!("http://{closed}/")}), &c.ctx)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "EXECUTION_FAILED", "{e}");

        let silent = silent_server().await;
        let tool = fetcher(WebFetchSettings {
            timeout: Duration::from_millis(400),
            ..settings()
        });
        let t = Instant::now();
        let e = tool
            .execute(json!({"url": format!("http://{silent}/")}), &c.ctx)
            .await
            .unwrap_err();
        assert_eq!(e, ToolError::Timeout(1));
        assert!(t.elapsed() < Duration::from_secs(2));

        let tool = fetcher(settings());
        let cancel = c.ctx.cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            cancel.cancel();
        });
        let t = Instant::now();
        let e = tool
            .execute(json!({"url": format!("http://{silent}/")}), &c.ctx)
            .await
            .unwrap_err();
        assert_eq!(e, ToolError::Cancelled);
        assert!(t.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn fetch_config_resolves_and_rejects() {
        let s = WebFetchFile::default().resolve().unwrap();
        assert_eq!(s.max_bytes, DEFAULT_MAX_BYTES);
        assert_eq!(s.max_redirects, 5);
        assert_eq!(s.timeout, Duration::from_secs(30));
        assert!(s.allow_private.is_empty());
        let s = WebFetchFile {
            allow_private: Some(vec![
                "10.0.0.0/8".into(),
                "127.0.0.2".into(),
                "fd00::/8".into(),
            ]),
            max_bytes: Some(1000),
            timeout_secs: Some(5),
            user_agent: Some("bot/1".into()),
            max_redirects: Some(10),
        }
        .resolve()
        .unwrap();
        assert_eq!(s.allow_private.len(), 3);
        assert_eq!((s.max_bytes, s.max_redirects), (1000, 10));
        for (f, key) in [
            (
                WebFetchFile {
                    allow_private: Some(vec!["ok".into()]),
                    ..Default::default()
                },
                "allow_private[0]",
            ),
            (
                WebFetchFile {
                    allow_private: Some(vec!["10.0.0.0/8".into(), "1.2.3.4/40".into()]),
                    ..Default::default()
                },
                "allow_private[1]",
            ),
            (
                WebFetchFile {
                    max_bytes: Some(0),
                    ..Default::default()
                },
                "max_bytes",
            ),
            (
                WebFetchFile {
                    max_bytes: Some(1 << 40),
                    ..Default::default()
                },
                "max_bytes",
            ),
            (
                WebFetchFile {
                    timeout_secs: Some(0),
                    ..Default::default()
                },
                "timeout_secs",
            ),
            (
                WebFetchFile {
                    timeout_secs: Some(301),
                    ..Default::default()
                },
                "timeout_secs",
            ),
            (
                WebFetchFile {
                    max_redirects: Some(11),
                    ..Default::default()
                },
                "max_redirects",
            ),
            (
                WebFetchFile {
                    user_agent: Some(String::new()),
                    ..Default::default()
                },
                "user_agent",
            ),
            (
                WebFetchFile {
                    user_agent: Some("a\nb".into()),
                    ..Default::default()
                },
                "user_agent",
            ),
        ] {
            let e = f.resolve().unwrap_err();
            assert!(e.starts_with(&format!("tools.web_fetch.{key}")), "{e}");
        }
        let f: Result<WebFetchFile, _> = serde_json::from_value(json!({"allow": []}));
        assert!(f.is_err());
    }

    // ---- web_search ----

    type Captured = Arc<Mutex<Vec<(HashMap<String, String>, Option<String>)>>>;

    async fn search_server(status: u16, body: &'static str) -> (SocketAddr, Captured) {
        let seen: Captured = Arc::default();
        let handler = move |State(seen): State<Captured>,
                            Query(q): Query<HashMap<String, String>>,
                            h: AxHeaders| async move {
            let token = h
                .get("x-subscription-token")
                .map(|v| v.to_str().unwrap().to_string());
            seen.lock().unwrap().push((q, token));
            (
                StatusCode::from_u16(status).unwrap(),
                [("content-type", "application/json")],
                body,
            )
        };
        let app = Router::new()
            .route("/search", get(handler))
            .route("/res/v1/web/search", get(handler))
            .with_state(seen.clone());
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await });
        (addr, seen)
    }

    const SEARXNG_JSON: &str = r#"{"query":"rust","number_of_results":0,"results":[
        {"url":"https://www.rust-lang.org/","title":"Rust Programming Language","content":"A language empowering everyone","engine":"duckduckgo","score":1.0},
        {"url":"https://doc.rust-lang.org/book/","title":"The Rust Book","content":"Learn Rust","engine":"bing"},
        {"url":"https://crates.io/","title":"crates.io","engine":"google"}],
        "answers":[],"corrections":[],"infoboxes":[],"suggestions":[],"unresponsive_engines":[]}"#;

    const BRAVE_JSON: &str = r#"{"type":"search","query":{"original":"rust"},"mixed":{},
        "web":{"type":"search","results":[
        {"title":"Rust Programming Language","url":"https://www.rust-lang.org/","description":"A language empowering <strong>everyone</strong> &amp; more","is_source_local":false,"language":"en"},
        {"title":"Rust (video game)","url":"https://rust.facepunch.com/","description":"Survive"}],"family_friendly":true}}"#;

    fn searcher(provider: SearchProvider, endpoint: String, key: Option<&str>) -> WebSearch {
        crate::install_crypto_provider();
        WebSearch::new(WebSearchSettings {
            provider: Some(provider),
            endpoint: Some(Url::parse(&endpoint).unwrap()),
            api_key: key.map(Secret::new),
            timeout: Duration::from_secs(5),
        })
        .unwrap()
    }

    #[tokio::test]
    async fn searxng_results_are_normalised() {
        let c = ctx();
        let (addr, seen) = search_server(200, SEARXNG_JSON).await;
        let tool = searcher(SearchProvider::Searxng, format!("http://{addr}/"), None);
        let v = tool
            .execute(
                json!({"query": "rust ünïcode & more", "num_results": 2}),
                &c.ctx,
            )
            .await
            .unwrap();
        assert_eq!(
            v,
            json!({"query": "rust ünïcode & more", "count": 2, "results": [
                {"title": "Rust Programming Language", "url": "https://www.rust-lang.org/", "snippet": "A language empowering everyone"},
                {"title": "The Rust Book", "url": "https://doc.rust-lang.org/book/", "snippet": "Learn Rust"},
            ]})
        );
        let (q, _) = seen.lock().unwrap()[0].clone();
        assert_eq!(q["q"], "rust ünïcode & more");
        assert_eq!(q["format"], "json");
        let v = tool
            .execute(json!({"query": "rust"}), &c.ctx)
            .await
            .unwrap();
        assert_eq!(v["count"], 3);
        assert_eq!(v["results"][2]["snippet"], "");
    }

    #[tokio::test]
    async fn brave_sends_the_key_and_count() {
        let c = ctx();
        let (addr, seen) = search_server(200, BRAVE_JSON).await;
        let tool = searcher(
            SearchProvider::Brave,
            format!("http://{addr}/res/v1/web/search"),
            Some("KEY123"),
        );
        let v = tool
            .execute(json!({"query": "rust", "num_results": 50}), &c.ctx)
            .await
            .unwrap();
        assert_eq!(v["count"], 2);
        assert_eq!(
            v["results"][0],
            json!({"title": "Rust Programming Language", "url": "https://www.rust-lang.org/", "snippet": "A language empowering everyone & more"})
        );
        let (q, token) = seen.lock().unwrap()[0].clone();
        assert_eq!(token.as_deref(), Some("KEY123"));
        assert_eq!(q["count"], "20", "num_results is capped at 20");
        assert_eq!(q["q"], "rust");
        tool.execute(json!({"query": "rust", "num_results": 1}), &c.ctx)
            .await
            .unwrap();
        assert_eq!(seen.lock().unwrap()[1].0["count"], "1");
    }

    #[tokio::test]
    async fn search_errors() {
        let c = ctx();
        for status in [500u16, 429, 403] {
            let (addr, _) = search_server(status, "{}").await;
            let tool = searcher(SearchProvider::Searxng, format!("http://{addr}"), None);
            let e = tool
                .execute(json!({"query": "x"}), &c.ctx)
                .await
                .unwrap_err();
            assert_eq!(e.code(), "EXECUTION_FAILED");
            assert!(e.to_string().contains(&status.to_string()), "{e}");
        }
        let (addr, _) = search_server(200, "<html>not json</html>").await;
        let tool = searcher(SearchProvider::Searxng, format!("http://{addr}"), None);
        let e = tool
            .execute(json!({"query": "x"}), &c.ctx)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "EXECUTION_FAILED");
        assert!(e.to_string().contains("expected JSON"), "{e}");
        let (addr, _) = search_server(200, r#"{"web": {"results": "nope"}}"#).await;
        let tool = searcher(
            SearchProvider::Brave,
            format!("http://{addr}/res/v1/web/search"),
            Some("k"),
        );
        let e = tool
            .execute(json!({"query": "x"}), &c.ctx)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("web.results"), "{e}");
        // Brave omits `web` when nothing is found.
        let (addr, _) = search_server(200, r#"{"type":"search"}"#).await;
        let tool = searcher(
            SearchProvider::Brave,
            format!("http://{addr}/res/v1/web/search"),
            Some("k"),
        );
        let v = tool.execute(json!({"query": "x"}), &c.ctx).await.unwrap();
        assert_eq!(v["count"], 0);

        for args in [
            json!({"query": "  "}),
            json!({"query": "x", "num_results": 0}),
            json!({"q": "x"}),
        ] {
            let e = tool.execute(args, &c.ctx).await.unwrap_err();
            assert_eq!(e.code(), "INVALID_ARGS");
        }
        // Nothing listening: a clear execution failure; a silent backend: timeout.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let tool = searcher(SearchProvider::Searxng, format!("http://{closed}"), None);
        let e = tool
            .execute(json!({"query": "x"}), &c.ctx)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "EXECUTION_FAILED", "{e}");
        let silent = silent_server().await;
        let mut s = searcher(SearchProvider::Searxng, format!("http://{silent}"), None);
        s.settings.timeout = Duration::from_millis(300);
        let e = s.execute(json!({"query": "x"}), &c.ctx).await.unwrap_err();
        assert_eq!(e.code(), "TIMEOUT");
    }

    #[tokio::test]
    async fn search_not_configured_is_informational() {
        let c = ctx();
        let tool = WebSearch::new(WebSearchSettings::default()).unwrap();
        let v = tool
            .execute(json!({"query": "rust"}), &c.ctx)
            .await
            .unwrap();
        assert_eq!(
            v,
            json!({
                "error": "web search not configured",
                "message": "No search API endpoint is configured. Set 'tools.web_search.endpoint' in your config.",
                "query": "rust",
            })
        );
    }

    #[test]
    fn search_config_resolves_and_rejects() {
        let s = WebSearchFile::default().resolve(None).unwrap();
        assert!(s.provider.is_none());
        let s = WebSearchFile {
            endpoint: Some("http://127.0.0.1:8888".into()),
            ..Default::default()
        }
        .resolve(None)
        .unwrap();
        assert_eq!(s.provider, Some(SearchProvider::Searxng));
        let s = WebSearchFile {
            provider: Some("brave".into()),
            api_key_env: Some("BRAVE_KEY".into()),
            ..Default::default()
        }
        .resolve(Some(Secret::new("k")))
        .unwrap();
        assert_eq!(s.endpoint.unwrap().as_str(), BRAVE_DEFAULT_ENDPOINT);
        assert_eq!(s.api_key.unwrap().expose(), "k");
        for (f, key) in [
            (
                WebSearchFile {
                    provider: Some("google".into()),
                    ..Default::default()
                },
                "provider",
            ),
            (
                WebSearchFile {
                    provider: Some("searxng".into()),
                    ..Default::default()
                },
                "endpoint",
            ),
            (
                WebSearchFile {
                    provider: Some("brave".into()),
                    ..Default::default()
                },
                "api_key",
            ),
            (
                WebSearchFile {
                    endpoint: Some("ftp://x".into()),
                    ..Default::default()
                },
                "endpoint",
            ),
            (
                WebSearchFile {
                    endpoint: Some("nope".into()),
                    ..Default::default()
                },
                "endpoint",
            ),
            (
                WebSearchFile {
                    endpoint: Some("http://x".into()),
                    timeout_secs: Some(0),
                    ..Default::default()
                },
                "timeout_secs",
            ),
        ] {
            let e = f.resolve(None).unwrap_err();
            assert!(e.starts_with(&format!("tools.web_search.{key}")), "{e}");
        }
    }
}
