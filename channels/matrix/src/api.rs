//! The Client-Server API calls the channel makes, and how their failures are classified.

use std::time::Duration;

use clawft_channel_core::ChannelError;
use reqwest::{Method, Url};
use serde_json::Value;

/// A client of one homeserver with one access token.
pub(crate) struct Client {
    http: reqwest::Client,
    base: Url,
    token: String,
}

/// Classify a failed answer: `429` / `M_LIMIT_EXCEEDED` is a rate limit (with the wait the
/// server named in `retry_after_ms`, or `Retry-After`), `401` / `M_UNKNOWN_TOKEN` an
/// authentication failure, other `4xx` a refusal, `5xx` transient.
pub fn classify(status: u16, retry_after_header: Option<&str>, body: &Value) -> ChannelError {
    let errcode = body["errcode"].as_str().unwrap_or_default();
    let error = body["error"].as_str().unwrap_or_default();
    let what = if errcode.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status} {errcode}: {error}")
    };
    if status == 429 || errcode == "M_LIMIT_EXCEEDED" {
        let ms = body["retry_after_ms"]
            .as_u64()
            .or_else(|| body["error"]["retry_after_ms"].as_u64());
        let retry_after = ms.map(Duration::from_millis).or_else(|| {
            retry_after_header
                .and_then(|h| h.trim().parse::<u64>().ok())
                .map(Duration::from_secs)
        });
        return ChannelError::RateLimited { retry_after };
    }
    if status == 401 || matches!(errcode, "M_UNKNOWN_TOKEN" | "M_MISSING_TOKEN") {
        return ChannelError::Auth(format!(
            "{what} (check channels.matrix.access_token: it may be expired or logged out)"
        ));
    }
    if status >= 500 || status == 408 {
        return ChannelError::Transient(what);
    }
    ChannelError::Rejected(what)
}

impl Client {
    pub(crate) fn new(base: Url, token: String) -> Result<Self, ChannelError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| ChannelError::Fatal(format!("HTTP client: {e}")))?;
        Ok(Self { http, base, token })
    }

    pub(crate) fn token(&self) -> &str {
        &self.token
    }

    /// `base` + the path segments (each percent-encoded: room ids hold `!` and `:`).
    pub(crate) fn url(&self, segments: &[&str]) -> Url {
        let mut u = self.base.clone();
        if let Ok(mut p) = u.path_segments_mut() {
            p.pop_if_empty();
            p.extend(segments);
        }
        u
    }

    /// A JSON call; the answer's JSON body on success.
    pub(crate) async fn call(
        &self,
        method: Method,
        url: Url,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<Value, ChannelError> {
        let mut req = self
            .http
            .request(method, url)
            .bearer_auth(&self.token)
            .timeout(timeout);
        if let Some(b) = body {
            req = req.json(b);
        }
        let r = req.send().await.map_err(|e| transport(&e))?;
        answer(r).await
    }

    /// Upload `bytes` to the media repository; the `mxc://` URI.
    pub(crate) async fn upload(
        &self,
        name: &str,
        mime: &str,
        bytes: Vec<u8>,
    ) -> Result<String, ChannelError> {
        let mut url = self.url(&["_matrix", "media", "v3", "upload"]);
        url.query_pairs_mut().append_pair("filename", name);
        let r = self
            .http
            .post(url)
            .bearer_auth(&self.token)
            .header(reqwest::header::CONTENT_TYPE, mime)
            .body(bytes)
            .timeout(Duration::from_secs(300))
            .send()
            .await
            .map_err(|e| transport(&e))?;
        let v = answer(r).await?;
        v["content_uri"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| ChannelError::Transient("upload answered no content_uri".into()))
    }
}

fn transport(e: &reqwest::Error) -> ChannelError {
    // The error's text holds the URL, never the token (it travels in a header).
    ChannelError::Transient(format!("homeserver unreachable: {e}"))
}

async fn answer(r: reqwest::Response) -> Result<Value, ChannelError> {
    let status = r.status().as_u16();
    let retry_after = r
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string);
    let bytes = r.bytes().await.map_err(|e| transport(&e))?;
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if (200..300).contains(&status) {
        return Ok(body);
    }
    Err(classify(status, retry_after.as_deref(), &body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn limit_exceeded_is_a_rate_limit_with_the_servers_wait() {
        let e = classify(
            429,
            None,
            &json!({"errcode": "M_LIMIT_EXCEEDED", "error": "Too Many Requests", "retry_after_ms": 2500}),
        );
        assert!(e.is_retryable());
        assert_eq!(e.retry_after(), Some(Duration::from_millis(2500)));
        let e = classify(429, Some("3"), &json!({}));
        assert_eq!(e.retry_after(), Some(Duration::from_secs(3)));
        let e = classify(401, None, &json!({"errcode": "M_UNKNOWN_TOKEN"}));
        assert_eq!(e.kind(), "auth");
        let e = classify(403, None, &json!({"errcode": "M_FORBIDDEN"}));
        assert_eq!(e.kind(), "rejected");
        assert_eq!(classify(502, None, &Value::Null).kind(), "transient");
    }
}
