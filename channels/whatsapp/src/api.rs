//! The Graph API calls of the Cloud API: `POST /{version}/{phone-number-id}/messages`,
//! `POST /{version}/{phone-number-id}/media`, `GET /{version}/{media-id}`; their errors
//! classified for the outbox.

use std::time::Duration;

use clawft_channel_core::media::Multipart;
use clawft_channel_core::ChannelError;
use serde_json::Value;

/// Re-engagement: more than 24 hours since the user's last message.
pub const OUTSIDE_WINDOW: i64 = 131_047;

/// A Graph API error: HTTP status and the `error` object's code and text.
#[derive(Debug)]
pub struct GraphError {
    pub status: u16,
    pub code: i64,
    pub message: String,
    pub retry_after: Option<Duration>,
}

impl GraphError {
    /// The outbox's view of it.
    pub fn classify(self, token_key: &str) -> ChannelError {
        let what = format!("WhatsApp error {}: {}", self.code, self.message);
        match self.code {
            // Throughput (130429), pair rate (131056: too many to one user), spam rate
            // (80007: the business account's limit), and the Graph API's app/user limits.
            130_429 | 131_056 | 80_007 | 4 | 17 | 32 | 613 => ChannelError::RateLimited {
                retry_after: Some(self.retry_after.unwrap_or(match self.code {
                    131_056 => Duration::from_secs(6),
                    80_007 | 4 | 17 | 32 | 613 => Duration::from_secs(60),
                    _ => Duration::from_secs(1),
                })),
            },
            _ if self.status == 429 => ChannelError::RateLimited {
                retry_after: Some(self.retry_after.unwrap_or(Duration::from_secs(1))),
            },
            // Expired or invalid access token; missing permission.
            190 | 10 | 200 | 3 => ChannelError::Auth(format!("{what} (check {token_key})")),
            _ if self.status == 401 => ChannelError::Auth(format!("{what} (check {token_key})")),
            // Temporary: "unknown error", "service unavailable", 131000 "something went
            // wrong", 131016 "service unavailable".
            1 | 2 | 131_000 | 131_016 => ChannelError::Transient(what),
            _ if self.status >= 500 => ChannelError::Transient(what),
            _ => ChannelError::Rejected(what),
        }
    }
}

/// The Graph API client of one phone number.
pub struct Graph {
    pub http: reqwest::Client,
    /// `https://graph.facebook.com` (no trailing slash).
    pub base: String,
    pub version: String,
    pub phone_number_id: String,
    pub token: String,
}

impl Graph {
    fn url(&self, path: &str) -> String {
        format!("{}/{}/{path}", self.base, self.version)
    }

    async fn answer(r: Result<reqwest::Response, reqwest::Error>) -> Result<Value, GraphError> {
        let r = r.map_err(|e| GraphError {
            status: 599,
            code: 0,
            message: format!("cannot reach the Graph API: {e}"),
            retry_after: None,
        })?;
        let status = r.status().as_u16();
        let retry_after = r
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body: Value = r.json().await.unwrap_or(Value::Null);
        if (200..300).contains(&status) {
            return Ok(body);
        }
        let e = &body["error"];
        Err(GraphError {
            status,
            code: e["code"].as_i64().unwrap_or(0),
            message: e["error_data"]["details"]
                .as_str()
                .or_else(|| e["message"].as_str())
                .unwrap_or("no error object")
                .to_string(),
            retry_after,
        })
    }

    /// `POST /{phone-number-id}/messages`; the new message's wamid.
    pub async fn send(&self, body: &Value) -> Result<String, GraphError> {
        let r = self
            .http
            .post(self.url(&format!("{}/messages", self.phone_number_id)))
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await;
        let v = Self::answer(r).await?;
        Ok(v["messages"][0]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    /// `POST /{phone-number-id}/media` (multipart); the media id.
    pub async fn upload(&self, name: &str, mime: &str, bytes: &[u8]) -> Result<String, GraphError> {
        let (content_type, body) = Multipart::new()
            .text("messaging_product", "whatsapp")
            .text("type", mime)
            .file("file", name, mime, bytes)
            .finish();
        let r = self
            .http
            .post(self.url(&format!("{}/media", self.phone_number_id)))
            .bearer_auth(&self.token)
            .header("content-type", content_type)
            .timeout(Duration::from_secs(180))
            .body(body)
            .send()
            .await;
        let v = Self::answer(r).await?;
        v["id"].as_str().map(str::to_string).ok_or(GraphError {
            status: 502,
            code: 0,
            message: "the media upload answered no id".into(),
            retry_after: None,
        })
    }

    /// `GET /{media-id}`: the download URL of an inbound file (valid for 5 minutes).
    pub async fn media_url(&self, media_id: &str) -> Result<String, GraphError> {
        let r = self
            .http
            .get(self.url(media_id))
            .bearer_auth(&self.token)
            .send()
            .await;
        let v = Self::answer(r).await?;
        v["url"].as_str().map(str::to_string).ok_or(GraphError {
            status: 502,
            code: 0,
            message: "the media lookup answered no url".into(),
            retry_after: None,
        })
    }
}
