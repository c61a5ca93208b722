//! The Slack Web API over reqwest: `auth.test`, `apps.connections.open`, `chat.postMessage`,
//! `chat.update`, `files.info` and the three calls of a file upload
//! (`files.getUploadURLExternal`, the POST of the bytes, `files.completeUploadExternal`), with
//! Slack's error conventions mapped onto [`ChannelError`].
//!
//! Slack answers most errors with HTTP 200 and `{"ok": false, "error": "..."}`; rate limits are
//! HTTP 429 with a `Retry-After` header (seconds).
//!
//! Slack's rate limits are per method and workspace, so the client keeps one gate per method:
//! after a 429 (or a `ratelimited` error) no call of that method leaves until the
//! `Retry-After` passed (1 s when Slack did not say). A call that must be delivered (a final
//! reply, `auth.test`) waits at the gate; a streamed draft's call is not made at all
//! ([`Gate::Skip`]): it fails at once with the time left, and the draft shows the text later.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use clawft_channel_core::lock::MutexExt;
use clawft_channel_core::ChannelError;
use serde_json::Value;

/// Largest response body read from the Web API.
const MAX_RESPONSE_BYTES: usize = 2 * 1024 * 1024;
/// Longest a single Web API call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Pause of a method after a rate-limit answer that did not say how long (seconds).
const DEFAULT_RATE_LIMIT_PAUSE: Duration = Duration::from_secs(1);

/// What a call does while its method is paused by a rate limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Wait until the pause ends, then call (final replies, everything not streamed).
    Wait,
    /// Do not call: fail at once with [`ChannelError::RateLimited`] and the time left
    /// (streamed drafts: a later edit or the final shows the text).
    Skip,
}

/// Which token a call uses: the setting named in `Auth` errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Token {
    /// The bot token (`xoxb-...`), `channels.slack.token`.
    Bot,
    /// The app-level token (`xapp-...`), `channels.slack.app_token`.
    App,
}

impl Token {
    pub(crate) fn setting(self) -> &'static str {
        match self {
            Token::Bot => "channels.slack.token",
            Token::App => "channels.slack.app_token",
        }
    }
}

/// Who the bot is, from `auth.test`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Identity {
    /// The bot user's id (`U...`): mentions are `<@user_id>`.
    pub user_id: String,
    /// The bot user's name.
    pub user: String,
    /// The workspace name.
    pub team: String,
}

/// The body of a Web API call: JSON (most methods), or form fields (methods that refuse JSON,
/// like `files.getUploadURLExternal`, which answers a JSON body with `invalid_arguments`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Body<'a> {
    /// `application/json`.
    Json(&'a Value),
    /// `application/x-www-form-urlencoded`.
    Form(&'a [(&'a str, &'a str)]),
}

/// A Web API client holding both tokens.
pub(crate) struct WebApi {
    http: reqwest::Client,
    base: String,
    bot_token: String,
    app_token: String,
    /// Method → when its rate-limit pause ends.
    paused: Mutex<HashMap<String, Instant>>,
}

impl WebApi {
    /// A client for `base` (ending in `/`, e.g. `https://slack.com/api/`).
    pub(crate) fn new(base: &str, bot_token: &str, app_token: &str) -> Result<Self, ChannelError> {
        let http = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .connect_timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("clawft-channel-slack/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ChannelError::Fatal(format!("cannot build the HTTP client: {e}")))?;
        let mut base = base.trim().to_string();
        if !base.ends_with('/') {
            base.push('/');
        }
        Ok(Self {
            http,
            base,
            bot_token: bot_token.to_string(),
            app_token: app_token.to_string(),
            paused: Mutex::new(HashMap::new()),
        })
    }

    /// When the rate-limit pause of `method` ends, if it is paused now.
    fn paused_until(&self, method: &str) -> Option<Instant> {
        let mut paused = self.paused.locked();
        let now = Instant::now();
        paused.retain(|_, until| *until > now);
        paused.get(method).copied()
    }

    fn pause(&self, method: &str, wait: Duration) {
        let until = Instant::now() + wait;
        let mut paused = self.paused.locked();
        let e = paused.entry(method.to_string()).or_insert(until);
        *e = (*e).max(until);
    }

    /// Call `method` when its rate-limit gate allows ([`Gate`]); a rate-limit answer closes
    /// the gate for every later call of the method.
    ///
    /// # Errors
    /// As [`WebApi::call`]; [`ChannelError::RateLimited`] at once for [`Gate::Skip`] while
    /// the method is paused.
    pub(crate) async fn call_gated(
        &self,
        method: &str,
        token: Token,
        body: &Value,
        gate: Gate,
    ) -> Result<Value, ChannelError> {
        self.call_body(method, token, Body::Json(body), gate).await
    }

    /// [`WebApi::call_gated`] with a JSON or form body.
    ///
    /// # Errors
    /// As [`WebApi::call_gated`].
    pub(crate) async fn call_body(
        &self,
        method: &str,
        token: Token,
        body: Body<'_>,
        gate: Gate,
    ) -> Result<Value, ChannelError> {
        while let Some(until) = self.paused_until(method) {
            match gate {
                Gate::Skip => {
                    return Err(ChannelError::RateLimited {
                        retry_after: Some(until.saturating_duration_since(Instant::now())),
                    })
                }
                Gate::Wait => tokio::time::sleep_until(until).await,
            }
        }
        let r = self.call_once(method, token, body).await;
        if let Err(ChannelError::RateLimited { retry_after }) = &r {
            self.pause(method, retry_after.unwrap_or(DEFAULT_RATE_LIMIT_PAUSE));
        }
        r
    }

    /// Call `method`, waiting at its rate-limit gate if it is paused.
    ///
    /// # Errors
    /// The classified failure.
    pub(crate) async fn call(
        &self,
        method: &str,
        token: Token,
        body: &Value,
    ) -> Result<Value, ChannelError> {
        self.call_gated(method, token, body, Gate::Wait).await
    }

    /// Call `method`; the parsed `ok: true` response, or a classified error.
    async fn call_once(
        &self,
        method: &str,
        token: Token,
        body: Body<'_>,
    ) -> Result<Value, ChannelError> {
        let secret = match token {
            Token::Bot => &self.bot_token,
            Token::App => &self.app_token,
        };
        let url = format!("{}{method}", self.base);
        let req = self.http.post(&url).bearer_auth(secret);
        let req = match body {
            Body::Json(v) => req.json(v),
            Body::Form(fields) => req.form(fields),
        };
        let resp = req
            .send()
            .await
            .map_err(|e| ChannelError::Transient(format!("{method}: {}", without_url(&e))))?;
        let status = resp.status();
        let retry_after = retry_after_of(&resp);
        let bytes = if status.as_u16() == 429 {
            Vec::new()
        } else {
            read_capped(resp)
                .await
                .map_err(|e| ChannelError::Transient(format!("{method}: {e}")))?
        };
        http_status(method, status.as_u16(), retry_after, token)?;
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| {
            ChannelError::Transient(format!("{method}: unparseable response from Slack: {e}"))
        })?;
        if v.get("ok").and_then(Value::as_bool) == Some(true) {
            return Ok(v);
        }
        let error = v
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("unknown_error");
        Err(classify(method, token, error))
    }

    /// `files.info` with the bot token: where file `id` can be downloaded (for file objects
    /// an event delivered without their URLs, `file_access: check_file_info`).
    pub(crate) async fn file_url(&self, id: &str) -> Result<String, ChannelError> {
        let v = self
            .call_body(
                "files.info",
                Token::Bot,
                Body::Form(&[("file", id)]),
                Gate::Wait,
            )
            .await?;
        let file = v.get("file").unwrap_or(&Value::Null);
        ["url_private_download", "url_private"]
            .iter()
            .find_map(|k| {
                file.get(*k)
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
            })
            .map(str::to_string)
            .ok_or_else(|| ChannelError::Rejected(format!("files.info: file {id} has no URL")))
    }

    /// `files.getUploadURLExternal` (form fields, as Slack wants): the upload URL and the
    /// file id.
    pub(crate) async fn upload_url(
        &self,
        name: &str,
        length: u64,
    ) -> Result<(String, String), ChannelError> {
        let length = length.to_string();
        let v = self
            .call_body(
                "files.getUploadURLExternal",
                Token::Bot,
                Body::Form(&[("filename", name), ("length", &length)]),
                Gate::Wait,
            )
            .await?;
        let s = |k: &str| {
            v.get(k)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        match (s("upload_url"), s("file_id")) {
            (Some(url), Some(id)) => Ok((url, id)),
            _ => Err(ChannelError::Transient(
                "files.getUploadURLExternal returned no upload_url or file_id".into(),
            )),
        }
    }

    /// POST the bytes of a file to the `upload_url` Slack gave (already checked to be on
    /// Slack's file host or the configured API origin, so the bot token may go with it), as
    /// `multipart/form-data`.
    pub(crate) async fn upload_bytes(
        &self,
        upload_url: &str,
        name: &str,
        mime: &str,
        bytes: &[u8],
    ) -> Result<(), ChannelError> {
        const WHAT: &str = "file upload";
        let (content_type, body) = clawft_channel_core::media::Multipart::new()
            .file("filename", name, mime, bytes)
            .finish();
        // A 100 MB file over a slow uplink: 60 s plus one second per 256 KiB.
        let timeout = Duration::from_secs(60 + (bytes.len() as u64 >> 18));
        let resp = self
            .http
            .post(upload_url)
            .bearer_auth(&self.bot_token)
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| ChannelError::Transient(format!("{WHAT}: {}", without_url(&e))))?;
        let status = resp.status().as_u16();
        let retry_after = retry_after_of(&resp);
        if status != 429 {
            read_capped(resp)
                .await
                .map_err(|e| ChannelError::Transient(format!("{WHAT}: {e}")))?;
        }
        http_status(WHAT, status, retry_after, Token::Bot)
    }

    /// `auth.test` with the bot token.
    pub(crate) async fn auth_test(&self) -> Result<Identity, ChannelError> {
        let v = self
            .call("auth.test", Token::Bot, &Value::Object(Default::default()))
            .await?;
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let user_id = s("user_id");
        if user_id.is_empty() {
            return Err(ChannelError::Auth(
                "auth.test returned no user_id: channels.slack.token must be a bot token (xoxb-...)"
                    .into(),
            ));
        }
        Ok(Identity {
            user_id,
            user: s("user"),
            team: s("team"),
        })
    }

    /// `apps.connections.open` with the app-level token: the Socket Mode WebSocket URL.
    pub(crate) async fn open_connection(&self) -> Result<String, ChannelError> {
        let v = self
            .call(
                "apps.connections.open",
                Token::App,
                &Value::Object(Default::default()),
            )
            .await?;
        v.get("url")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| ChannelError::Transient("apps.connections.open returned no url".into()))
    }
}

/// The `Retry-After` of a response, in seconds.
fn retry_after_of(resp: &reqwest::Response) -> Option<Duration> {
    resp.headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// Classify an HTTP status: 429 → rate limited, 5xx → transient, 401/403 → auth, other
/// non-2xx → rejected.
fn http_status(
    what: &str,
    status: u16,
    retry_after: Option<Duration>,
    token: Token,
) -> Result<(), ChannelError> {
    match status {
        429 => Err(ChannelError::RateLimited { retry_after }),
        500..=599 => Err(ChannelError::Transient(format!(
            "{what}: HTTP {status} from Slack"
        ))),
        401 | 403 => Err(ChannelError::Auth(format!(
            "{what}: HTTP {status}: check {}",
            token.setting()
        ))),
        200..=299 => Ok(()),
        _ => Err(ChannelError::Rejected(format!(
            "{what}: HTTP {status} from Slack"
        ))),
    }
}

/// Map Slack's `error` string.
fn classify(method: &str, token: Token, error: &str) -> ChannelError {
    match error {
        "invalid_auth"
        | "not_authed"
        | "token_revoked"
        | "token_expired"
        | "account_inactive"
        | "not_allowed_token_type"
        | "missing_scope"
        | "no_permission"
        | "ekm_access_denied" => {
            let hint = match (token, error) {
                (Token::App, _) => {
                    "set channels.slack.app_token to an app-level token (xapp-...) with the connections:write scope, and enable Socket Mode"
                }
                (Token::Bot, "missing_scope") if method.starts_with("files.info") => {
                    "give the bot token (channels.slack.token) the files:read scope and reinstall the app"
                }
                (Token::Bot, "missing_scope") if method.starts_with("files.") => {
                    "give the bot token (channels.slack.token) the files:write scope and reinstall the app"
                }
                (Token::Bot, "missing_scope") => {
                    "give the bot token (channels.slack.token) the chat:write scope and reinstall the app"
                }
                (Token::Bot, _) => {
                    "set channels.slack.token to a valid bot token (xoxb-...)"
                }
            };
            ChannelError::Auth(format!("{method}: {error}: {hint}"))
        }
        "ratelimited" | "rate_limited" => ChannelError::RateLimited { retry_after: None },
        "internal_error" | "fatal_error" | "service_unavailable" | "request_timeout" => {
            ChannelError::Transient(format!("{method}: {error}"))
        }
        other => ChannelError::Rejected(format!("{method}: {other}")),
    }
}

/// Read at most [`MAX_RESPONSE_BYTES`] of a body.
async fn read_capped(mut resp: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| without_url(&e))? {
        if buf.len() + chunk.len() > MAX_RESPONSE_BYTES {
            return Err(format!("response larger than {MAX_RESPONSE_BYTES} bytes"));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf)
}

/// A reqwest error's text with its causes (the URL holds no secret: tokens go in a header).
fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn classification() {
        assert!(matches!(
            classify("chat.postMessage", Token::Bot, "invalid_auth"),
            ChannelError::Auth(m) if m.contains("channels.slack.token")
        ));
        assert!(matches!(
            classify("apps.connections.open", Token::App, "not_allowed_token_type"),
            ChannelError::Auth(m) if m.contains("channels.slack.app_token")
        ));
        assert!(matches!(
            classify("chat.postMessage", Token::Bot, "channel_not_found"),
            ChannelError::Rejected(_)
        ));
        assert!(matches!(
            classify("chat.postMessage", Token::Bot, "msg_too_long"),
            ChannelError::Rejected(_)
        ));
        assert!(matches!(
            classify("chat.postMessage", Token::Bot, "internal_error"),
            ChannelError::Transient(_)
        ));
    }
}
