//! Talking to the running gateway of this config's store through its local HTTP API (sled
//! admits one process, so while a gateway runs, `weft agent`, `weft status`, `weft sessions`,
//! `weft send`, `weft pairing` and `weft mcp` go through it).
//!
//! The gateway is found through `control.json` in the store directory ([`super::control`]),
//! never by probing a port: a gateway of another store, or any other program, listening on the
//! configured address is never talked to, and every request carries the control token.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

use super::{control, CliError};
use crate::config::Config;

/// How long to wait for the gateway's `/healthz` before deciding it is gone.
const DETECT_TIMEOUT: Duration = Duration::from_millis(500);

/// A client of the running gateway of one store.
#[derive(Clone)]
pub struct GatewayClient {
    base: String,
    token: String,
    store: std::path::PathBuf,
    http: reqwest::Client,
}

/// One event of a streamed reply.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamItem {
    /// Text fragment.
    Delta(String),
    /// The text streamed so far is withdrawn (the model's answer was cut off and is asked for
    /// again).
    Restart,
    /// Tool progress.
    Progress(Value),
    /// The final reply.
    Done(String),
    /// The turn failed.
    Error(String),
    /// A tool call waits for the user's approval: the question and its id.
    Approval {
        /// The id to answer with.
        id: String,
        /// The question as the chat shows it.
        text: String,
    },
}

impl GatewayClient {
    /// The gateway of `config`'s store, if one runs: its `control.json` exists, names a live
    /// process, and something answers at the address it names. A file left by `kill -9` (dead
    /// pid, or nothing listening) counts as no gateway.
    ///
    /// # Errors
    /// The control file exists but cannot be read or parsed.
    pub async fn detect(config: &Config) -> Result<Option<Self>, CliError> {
        let store = &config.store.path;
        let Some(info) = control::read(store)? else {
            return Ok(None);
        };
        if !control::pid_alive(info.pid) {
            return Ok(None);
        }
        let http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(DETECT_TIMEOUT)
            .build()
            .map_err(CliError::msg)?;
        let base = format!("http://{}", info.addr);
        let answers = http
            .get(format!("{base}/healthz"))
            .timeout(DETECT_TIMEOUT)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        Ok(answers.then(|| Self {
            base,
            token: info.token,
            store: store.clone(),
            http,
        }))
    }

    /// Base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token)
    }

    /// What a 401 means here: whoever answers at the address is not this store's gateway.
    fn not_ours(&self) -> CliError {
        CliError::Failed(format!(
            "the gateway at {} refused this store's control token: it is not the gateway of {} (its control.json names a process that is not serving there). Stop the program on that address, or restart this store's gateway",
            self.base,
            self.store.display()
        ))
    }

    async fn json(&self, r: reqwest::RequestBuilder) -> Result<(u16, Value), CliError> {
        let resp = r.send().await.map_err(|e| {
            CliError::Failed(format!("gateway at {} did not answer: {e}", self.base))
        })?;
        if resp.status() == reqwest::StatusCode::UNAUTHORIZED {
            return Err(self.not_ours());
        }
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
            Err(CliError::Failed(format!(
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
            _ => Err(CliError::Failed(format!("gateway answered {status}: {v}"))),
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
            Err(CliError::Failed(
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
            Err(CliError::Failed(format!("gateway answered {status}: {v}")))
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
            // The terminal's session (`cli:<chat_id>`), the same one as without a gateway.
            .json(&json!({ "chat_id": chat_id, "content": content, "channel": "cli" }))
            .send()
            .await
            .map_err(|e| {
                CliError::Failed(format!("gateway at {} did not answer: {e}", self.base))
            })?;
        if resp.status() == reqwest::StatusCode::UNAUTHORIZED {
            return Err(self.not_ours());
        }
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp.text().await.unwrap_or_default();
            return Err(CliError::Failed(format!(
                "gateway answered {status}: {body}"
            )));
        }
        let mut stream = resp.bytes_stream();
        let mut buf = String::new();
        let mut event = String::new();
        let mut data = String::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| CliError::Failed(format!("stream broke: {e}")))?;
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
        Err(CliError::Failed(
            "the gateway closed the stream before the reply".into(),
        ))
    }
}

fn parse_event(event: &str, data: &str) -> Option<StreamItem> {
    let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
    let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    match event {
        "delta" if v.get("restart").and_then(Value::as_bool) == Some(true) => {
            Some(StreamItem::Restart)
        }
        "delta" => Some(StreamItem::Delta(text("text"))),
        "progress" => Some(StreamItem::Progress(v)),
        "done" => Some(StreamItem::Done(text("reply"))),
        "error" => Some(StreamItem::Error(text("error"))),
        "approval" => Some(StreamItem::Approval {
            id: text("id"),
            text: text("text"),
        }),
        _ => None,
    }
}
