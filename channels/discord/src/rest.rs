//! Discord's REST API over reqwest: bot authentication, error classification and per-route
//! rate-limit buckets (`X-RateLimit-Remaining: 0` + `X-RateLimit-Reset-After` block the route
//! until the reset; a 429 blocks its route, or every route when `global`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use clawft_channel_core::lock::MutexExt;
use clawft_channel_core::ChannelError;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use tokio::time::Instant;

/// Discord's public API host; `DiscordConfig::api_base_url` replaces it.
pub const DISCORD_BASE: &str = "https://discord.com";
/// Longest wait for a blocked route before failing fast with `RateLimited`.
const MAX_LOCAL_WAIT: Duration = Duration::from_secs(5);
/// Per-request timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Per-request timeout of a file upload (10 MiB over a slow uplink: about 80 s at 1 Mbit/s).
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(180);

/// How a 413 answer starts ([`is_too_large`]).
const TOO_LARGE: &str = "Discord API 413";

/// Whether `e` is Discord's 413 (`Request entity too large`, code 40005): the upload is over
/// the limit of that chat.
pub(crate) fn is_too_large(e: &ChannelError) -> bool {
    matches!(e, ChannelError::Rejected(m) if m.starts_with(TOO_LARGE))
}

/// The body of a REST call.
pub(crate) enum Body<'a> {
    None,
    Json(&'a Value),
    /// `multipart/form-data`: the `Content-Type` (with its boundary) and the bytes.
    Multipart(String, Vec<u8>),
}

pub(crate) struct Rest {
    http: reqwest::Client,
    /// `{base}/api/v10`.
    api: String,
    auth: String,
    /// Route key → blocked until.
    buckets: Mutex<HashMap<String, Instant>>,
    global: Mutex<Option<Instant>>,
}

fn is_loopback(url: &str) -> bool {
    let rest = url.split("://").nth(1).unwrap_or(url);
    rest.starts_with("127.") || rest.starts_with("localhost") || rest.starts_with("[::1]")
}

impl Rest {
    pub(crate) fn new(base: &str, token: &str) -> Result<Self, ChannelError> {
        let base = base.trim_end_matches('/');
        let mut b = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!(
                "DiscordBot (https://github.com/clawft, ",
                env!("CARGO_PKG_VERSION"),
                ")"
            ));
        if is_loopback(base) {
            b = b.no_proxy();
        }
        let http = b
            .build()
            .map_err(|e| ChannelError::Fatal(format!("HTTP client: {e}")))?;
        Ok(Self {
            http,
            api: format!("{base}/api/v10"),
            auth: format!("Bot {token}"),
            buckets: Mutex::new(HashMap::new()),
            global: Mutex::new(None),
        })
    }

    fn blocked_until(&self, route: &str) -> Option<Instant> {
        let g = *self.global.locked();
        let r = self.buckets.locked().get(route).copied();
        match (g, r) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    fn block(&self, route: &str, until: Instant, global: bool) {
        if global {
            *self.global.locked() = Some(until);
        } else {
            let mut b = self.buckets.locked();
            b.retain(|_, t| *t > Instant::now());
            b.insert(route.to_string(), until);
        }
    }

    /// One API call. `route` is the rate-limit bucket key (method + path with the major
    /// parameter, e.g. `POST /channels/1/messages`). A 2xx without a JSON body is `Null`.
    pub(crate) async fn call(
        &self,
        method: Method,
        route: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, ChannelError> {
        self.call_with(method, route, path, body.map_or(Body::None, Body::Json))
            .await
    }

    /// [`Rest::call`] with any [`Body`] (a `multipart/form-data` upload gets
    /// [`UPLOAD_TIMEOUT`] instead of the usual per-request timeout).
    pub(crate) async fn call_with(
        &self,
        method: Method,
        route: &str,
        path: &str,
        body: Body<'_>,
    ) -> Result<Value, ChannelError> {
        if let Some(until) = self.blocked_until(route) {
            let now = Instant::now();
            if until > now {
                let wait = until - now;
                if wait > MAX_LOCAL_WAIT {
                    return Err(ChannelError::RateLimited {
                        retry_after: Some(wait),
                    });
                }
                tokio::time::sleep(wait).await;
            }
        }
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.api))
            .header(reqwest::header::AUTHORIZATION, &self.auth);
        match body {
            Body::None => {}
            Body::Json(b) => req = req.json(b),
            Body::Multipart(content_type, bytes) => {
                req = req
                    .header(reqwest::header::CONTENT_TYPE, content_type)
                    .timeout(UPLOAD_TIMEOUT)
                    .body(bytes);
            }
        }
        let resp = req.send().await.map_err(|e| {
            ChannelError::Transient(format!("Discord API unreachable: {}", without_url(&e)))
        })?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let header_secs = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(|s| Duration::from_secs_f64(s.min(3600.0)))
        };
        let reset_after = header_secs("x-ratelimit-reset-after");
        if headers
            .get("x-ratelimit-remaining")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() == "0")
        {
            if let Some(d) = reset_after {
                self.block(route, Instant::now() + d, false);
            }
        }
        let text = resp.text().await.unwrap_or_default();
        let json: Option<Value> = serde_json::from_str(&text).ok();
        if status.is_success() {
            return Ok(json.unwrap_or(Value::Null));
        }
        let detail = json
            .as_ref()
            .map(|v| {
                let msg = v.get("message").and_then(Value::as_str).unwrap_or("");
                match v.get("code").and_then(Value::as_i64) {
                    Some(c) => format!("{msg} (code {c})"),
                    None => msg.to_string(),
                }
            })
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| text.chars().take(200).collect());
        Err(match status {
            StatusCode::TOO_MANY_REQUESTS => {
                let body_secs = json
                    .as_ref()
                    .and_then(|v| v.get("retry_after"))
                    .and_then(Value::as_f64)
                    .filter(|s| s.is_finite() && *s >= 0.0)
                    .map(|s| Duration::from_secs_f64(s.min(3600.0)));
                let retry_after = body_secs
                    .or_else(|| header_secs("retry-after"))
                    .or(reset_after);
                let global = json
                    .as_ref()
                    .and_then(|v| v.get("global"))
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
                    || headers.contains_key("x-ratelimit-global");
                if let Some(d) = retry_after {
                    self.block(route, Instant::now() + d, global);
                }
                if global {
                    ChannelError::RateLimitedGlobal { retry_after }
                } else {
                    ChannelError::RateLimited { retry_after }
                }
            }
            StatusCode::UNAUTHORIZED => ChannelError::Auth(format!(
                "Discord refused the bot token (401 {detail}): set a valid bot token in channels.discord.token"
            )),
            s if s.is_server_error() => {
                ChannelError::Transient(format!("Discord API error {}: {detail}", s.as_u16()))
            }
            StatusCode::PAYLOAD_TOO_LARGE => {
                ChannelError::Rejected(format!("{TOO_LARGE}: {detail}"))
            }
            s => ChannelError::Rejected(format!("Discord API {}: {detail}", s.as_u16())),
        })
    }
}

/// A reqwest error without its URL (which is harmless here, but keep messages short).
fn without_url(e: &reqwest::Error) -> String {
    let s = e.to_string();
    match e.url() {
        Some(u) => s.replace(u.as_str(), "Discord API"),
        None => s,
    }
}
