//! Talking to a running gateway through its local HTTP API (sled admits one process, so while a
//! gateway runs, `weft agent`, `weft status` and `weft sessions` go through it).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

use super::CliError;
use crate::config::Config;

/// How long to wait for a gateway's `/healthz` before deciding none runs.
const DETECT_TIMEOUT: Duration = Duration::from_millis(500);

/// A client of a running gateway.
#[derive(Clone)]
pub struct GatewayClient {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

/// One event of a streamed reply.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamItem {
    /// Text fragment.
    Delta(String),
    /// Tool progress.
    Progress(Value),
    /// The final reply.
    Done(String),
    /// The turn failed.
    Error(String),
}

impl GatewayClient {
    /// Where the API of `config` answers (a wildcard bind is reached on loopback).
    pub fn address(config: &Config) -> SocketAddr {
        let mut addr = config.http.bind;
        if addr.ip().is_unspecified() {
            addr.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        addr
    }

    /// A gateway answering `/healthz` at the configured address, if any.
    pub async fn detect(config: &Config) -> Option<Self> {
        if !config.http.enabled {
            return None;
        }
        let addr = Self::address(config);
        let http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(DETECT_TIMEOUT)
            .build()
            .ok()?;
        let base = format!("http://{addr}");
        let ok = http
            .get(format!("{base}/healthz"))
            .timeout(DETECT_TIMEOUT)
            .send()
            .await
            .map(|r| r.status().is_success())
            .unwrap_or(false);
        ok.then(|| Self {
            base,
            token: config.http.token.as_ref().map(|t| t.expose().to_string()),
            http,
        })
    }

    /// Base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    async fn json(&self, r: reqwest::RequestBuilder) -> Result<(u16, Value), CliError> {
        let resp = r
            .send()
            .await
            .map_err(|e| CliError(format!("gateway at {} did not answer: {e}", self.base)))?;
        let status = resp.status().as_u16();
        let v = resp.json::<Value>().await.unwrap_or(Value::Null);
        Ok((status, v))
    }

    /// `GET path` → JSON.
    ///
    /// # Errors
    /// Transport failure or a non-2xx answer.
    pub async fn get(&self, path: &str) -> Result<Value, CliError> {
        let (status, v) = self.json(self.req(reqwest::Method::GET, path)).await?;
        if (200..300).contains(&status) {
            Ok(v)
        } else {
            Err(CliError(format!(
                "gateway answered {status}: {}",
                v.get("error").and_then(Value::as_str).unwrap_or("")
            )))
        }
    }

    /// `GET path`, `None` on 404.
    ///
    /// # Errors
    /// Transport failure or another non-2xx answer.
    pub async fn get_opt(&self, path: &str) -> Result<Option<Value>, CliError> {
        let (status, v) = self.json(self.req(reqwest::Method::GET, path)).await?;
        match status {
            404 => Ok(None),
            200..=299 => Ok(Some(v)),
            _ => Err(CliError(format!("gateway answered {status}: {v}"))),
        }
    }

    /// `POST path` with a JSON body → JSON.
    ///
    /// # Errors
    /// Transport failure or a non-2xx answer (with the gateway's error text).
    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, CliError> {
        let (status, v) = self
            .json(self.req(reqwest::Method::POST, path).json(body))
            .await?;
        if (200..300).contains(&status) {
            Ok(v)
        } else {
            Err(CliError(
                v.get("error")
                    .and_then(Value::as_str)
                    .map_or_else(|| format!("gateway answered {status}: {v}"), str::to_string),
            ))
        }
    }

    /// `DELETE path` → JSON.
    ///
    /// # Errors
    /// Transport failure or a non-2xx answer.
    pub async fn delete(&self, path: &str) -> Result<Value, CliError> {
        let (status, v) = self.json(self.req(reqwest::Method::DELETE, path)).await?;
        if (200..300).contains(&status) {
            Ok(v)
        } else {
            Err(CliError(format!("gateway answered {status}: {v}")))
        }
    }

    /// Send a message and stream the reply, calling `on_item` for each event; returns the last
    /// event (`Done` or `Error`).
    ///
    /// # Errors
    /// Transport failure or a refused request.
    pub async fn chat_stream(
        &self,
        chat_id: &str,
        content: &str,
        mut on_item: impl FnMut(&StreamItem),
    ) -> Result<StreamItem, CliError> {
        let resp = self
            .req(reqwest::Method::POST, "/v1/chat/stream")
            .json(&json!({ "chat_id": chat_id, "content": content, "sender": "cli" }))
            .send()
            .await
            .map_err(|e| CliError(format!("gateway at {} did not answer: {e}", self.base)))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp.text().await.unwrap_or_default();
            return Err(CliError(format!("gateway answered {status}: {body}")));
        }
        let mut stream = resp.bytes_stream();
        let mut buf = String::new();
        let mut event = String::new();
        let mut data = String::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| CliError(format!("stream broke: {e}")))?;
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(nl) = buf.find('\n') {
                let line = buf[..nl].trim_end_matches('\r').to_string();
                buf.drain(..=nl);
                if line.is_empty() {
                    if let Some(item) = parse_event(&event, &data) {
                        on_item(&item);
                        if matches!(item, StreamItem::Done(_) | StreamItem::Error(_)) {
                            return Ok(item);
                        }
                    }
                    event.clear();
                    data.clear();
                } else if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    if !data.is_empty() {
                        data.push('\n');
                    }
                    data.push_str(v.strip_prefix(' ').unwrap_or(v));
                }
            }
        }
        Err(CliError(
            "the gateway closed the stream before the reply".into(),
        ))
    }
}

fn parse_event(event: &str, data: &str) -> Option<StreamItem> {
    let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
    let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    match event {
        "delta" => Some(StreamItem::Delta(text("text"))),
        "progress" => Some(StreamItem::Progress(v)),
        "done" => Some(StreamItem::Done(text("reply"))),
        "error" => Some(StreamItem::Error(text("error"))),
        _ => None,
    }
}
