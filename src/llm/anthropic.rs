//! Anthropic Messages (`POST {base}/v1/messages`) with native `tool_use` / `tool_result`
//! blocks, non-streaming and SSE streaming (`text_delta`, `input_json_delta`).

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::http::{http_client, join_url, Endpoint};
use super::{
    ChatModel, ChatRequest, ChatResponse, LlmError, Message, Role, StreamEvent, ToolCall, Usage,
};
use crate::types::scrub::Scrubber;

/// API version header value.
const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Settings of an Anthropic provider.
#[derive(Clone, Debug)]
pub struct AnthropicConfig {
    /// Provider name.
    pub name: String,
    /// Base URL (`https://api.anthropic.com`, with or without `/v1`).
    pub base_url: String,
    /// `x-api-key`.
    pub api_key: Option<String>,
    /// Default model.
    pub model: String,
    /// Whole-request timeout.
    pub timeout: Duration,
    /// `max_tokens` when the request sets none (the API requires it).
    pub max_tokens: u32,
}

/// An Anthropic Messages provider.
pub struct Anthropic {
    cfg: AnthropicConfig,
    url: String,
    http: reqwest::Client,
    /// The serialised `tools` array, reused while the tool list is unchanged.
    tools_json: super::openai::ToolsJsonCache,
    /// Redacts the key (and any configured secret, [`Anthropic::with_secrets`]) from the errors
    /// this provider returns.
    scrubber: Scrubber,
}

impl Anthropic {
    /// Build the provider.
    ///
    /// # Errors
    /// The HTTP client cannot be built.
    pub fn new(cfg: AnthropicConfig) -> Result<Self, LlmError> {
        let http = http_client(&cfg.name, cfg.timeout)?;
        let path = cfg.base_url.split(['?', '#']).next().unwrap_or_default();
        let url = if path.trim_end_matches('/').ends_with("/v1") {
            join_url(&cfg.base_url, "/messages")
        } else {
            join_url(&cfg.base_url, "/v1/messages")
        };
        let scrubber = Scrubber::new(cfg.api_key.iter().cloned().collect());
        Ok(Self {
            cfg,
            url,
            http,
            tools_json: super::openai::ToolsJsonCache::default(),
            scrubber,
        })
    }

    /// Redact with `scrubber` instead (the daemon builds one for every provider, from every
    /// configured secret and each provider's key, which it must include).
    #[must_use]
    pub fn with_scrubber(mut self, scrubber: Scrubber) -> Self {
        self.scrubber = scrubber;
        self
    }

    /// [`build_body`] serialised, the tools array from the cache instead of rebuilt.
    fn body(&self, req: &ChatRequest, stream: bool) -> Vec<u8> {
        let mut out = build_body_without_tools(&self.cfg, req, stream)
            .to_string()
            .into_bytes();
        if !req.tools.is_empty() {
            let tools = self
                .tools_json
                .get(&req.tools, |specs| tools_value(specs).to_string());
            // The object always has `model`, so a comma after its last member is valid.
            out.pop();
            out.extend_from_slice(b",\"tools\":");
            out.extend_from_slice(tools.as_bytes());
            out.push(b'}');
        }
        out
    }

    /// Where requests go, and the names errors carry.
    fn endpoint(&self) -> Endpoint<'_> {
        Endpoint {
            http: &self.http,
            provider: &self.cfg.name,
            url: &self.url,
            timeout: self.cfg.timeout,
            full_cause: false,
            scrubber: &self.scrubber,
        }
    }

    fn invalid(&self, detail: impl Into<String>) -> LlmError {
        self.endpoint().invalid(detail)
    }

    /// POST `body` with the API version and key headers.
    async fn send(&self, body: Vec<u8>) -> Result<reqwest::Response, LlmError> {
        let ep = self.endpoint();
        let mut rb = ep.post(body).header("anthropic-version", ANTHROPIC_VERSION);
        if let Some(k) = &self.cfg.api_key {
            rb = rb.header("x-api-key", k);
        }
        ep.send(rb).await
    }

    async fn complete_stream(
        &self,
        req: &ChatRequest,
        tx: &mpsc::Sender<StreamEvent>,
    ) -> Result<ChatResponse, LlmError> {
        let resp = self.send(self.body(req, true)).await?;
        let mut events = self.endpoint().events(resp);
        let mut acc = Acc::default();
        while let Some(ev) = events.next().await {
            // The JSON's `type` is authoritative; the SSE `event:` name repeats it.
            let v: Value = serde_json::from_str(&ev?.data)
                .map_err(|e| self.invalid(format!("bad stream event: {e}")))?;
            match v["type"].as_str() {
                Some("error") => {
                    let kind = v["error"]["type"].as_str().unwrap_or("");
                    let msg = v["error"]["message"].as_str().unwrap_or("").to_string();
                    return Err(match kind {
                        "overloaded_error" | "api_error" => LlmError::Server {
                            provider: self.cfg.name.clone(),
                            status: 529,
                            body: msg,
                            retry_after: None,
                        },
                        "rate_limit_error" => LlmError::RateLimited {
                            provider: self.cfg.name.clone(),
                            retry_after: None,
                        },
                        _ => self.invalid(format!("{kind}: {msg}")),
                    });
                }
                Some("message_stop") => return Ok(acc.finish()),
                _ => {
                    if let Some(t) = acc.apply(&v) {
                        let _ = tx.send(StreamEvent::TextDelta(t)).await;
                    }
                }
            }
        }
        // Every complete answer ends with `message_stop` (its `message_delta` carries the stop
        // reason): a stream that just stops was cut off mid-answer.
        if acc.stop_reason.is_some() {
            Ok(acc.finish())
        } else {
            Err(self.endpoint().cut(if acc.started {
                "the stream ended without message_stop"
            } else {
                "the stream ended before its first event"
            }))
        }
    }
}

fn text_blocks(m: &Message) -> Vec<Value> {
    if m.content.is_empty() {
        Vec::new()
    } else {
        vec![json!({"type": "text", "text": m.content})]
    }
}

/// The request body: system prompt on top, roles alternating, tool results as user blocks.
#[cfg(test)]
pub(crate) fn build_body(cfg: &AnthropicConfig, req: &ChatRequest, stream: bool) -> Value {
    let mut body = build_body_without_tools(cfg, req, stream);
    if !req.tools.is_empty() {
        body["tools"] = tools_value(&req.tools);
    }
    body
}

/// The `tools` array in Anthropic's format. The last tool carries a prompt-cache breakpoint:
/// the tool list is byte-stable between turns, so it is read from the cache.
fn tools_value(specs: &[super::ToolSpec]) -> Value {
    let last = specs.len().saturating_sub(1);
    specs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut v =
                json!({"name": t.name, "description": t.description, "input_schema": t.parameters});
            if i == last {
                v["cache_control"] = json!({"type": "ephemeral"});
            }
            v
        })
        .collect()
}

/// [`build_body`] without `tools` (added by the caller from its cache).
fn build_body_without_tools(cfg: &AnthropicConfig, req: &ChatRequest, stream: bool) -> Value {
    let mut system = Vec::new();
    let mut msgs: Vec<(String, Vec<Value>)> = Vec::new();
    for m in &req.messages {
        let (role, blocks) = match m.role {
            Role::System => {
                system.push(m.content.clone());
                continue;
            }
            Role::User => {
                // Images first (Anthropic's advice), then the text.
                let mut b: Vec<Value> = m
                    .images
                    .iter()
                    .filter_map(|i| {
                        i.data.as_ref().map(|d| {
                            json!({"type": "image", "source": {"type": "base64", "media_type": i.mime, "data": d.as_ref()}})
                        })
                    })
                    .collect();
                b.extend(text_blocks(m));
                ("user", b)
            }
            Role::Assistant => {
                let mut b = text_blocks(m);
                for c in &m.tool_calls {
                    let input: Value = serde_json::from_str(&c.arguments)
                        .ok()
                        .filter(Value::is_object)
                        .unwrap_or_else(|| json!({}));
                    b.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}));
                }
                ("assistant", b)
            }
            Role::Tool => (
                "user",
                vec![json!({
                    "type": "tool_result",
                    "tool_use_id": m.tool_call_id.as_deref().unwrap_or(""),
                    "content": m.content,
                })],
            ),
        };
        if blocks.is_empty() {
            continue;
        }
        match msgs.last_mut() {
            Some((r, b)) if r == role => b.extend(blocks),
            _ => msgs.push((role.to_string(), blocks)),
        }
    }
    let mut body = json!({
        "model": if req.model.is_empty() { &cfg.model } else { &req.model },
        "max_tokens": req.max_tokens.unwrap_or(cfg.max_tokens),
        "messages": msgs.into_iter().map(|(role, content)| json!({"role": role, "content": content})).collect::<Vec<_>>(),
    });
    if !system.is_empty() {
        // One text block with a prompt-cache breakpoint: tools and system prompt (stable
        // between turns) are cached together.
        body["system"] = json!([{
            "type": "text",
            "text": system.join("\n\n"),
            "cache_control": {"type": "ephemeral"},
        }]);
    }
    if let Some(t) = req.temperature {
        body["temperature"] = json!(t);
    }
    if stream {
        body["stream"] = json!(true);
    }
    body
}

fn parse_message(v: &Value) -> Option<ChatResponse> {
    let blocks = v.get("content")?.as_array()?;
    let mut content = String::new();
    let mut tool_calls = Vec::new();
    for b in blocks {
        match b["type"].as_str() {
            Some("text") => content.push_str(b["text"].as_str().unwrap_or("")),
            Some("tool_use") => tool_calls.push(ToolCall {
                id: b["id"].as_str().unwrap_or("").to_string(),
                name: b["name"].as_str().unwrap_or("").to_string(),
                arguments: b["input"].to_string(),
            }),
            _ => {}
        }
    }
    Some(ChatResponse {
        content,
        tool_calls,
        finish_reason: v["stop_reason"].as_str().map(str::to_string),
        usage: anthropic_usage(&v["usage"]),
        model: String::new(),
    })
}

/// Anthropic reports cache reads and writes beside `input_tokens` (which counts neither):
/// the prompt is their sum.
fn anthropic_usage(u: &Value) -> Usage {
    let n = |k: &str| u[k].as_u64().unwrap_or(0);
    let cached = n("cache_read_input_tokens");
    Usage {
        input_tokens: n("input_tokens") + cached + n("cache_creation_input_tokens"),
        output_tokens: n("output_tokens"),
        cached_tokens: cached,
        estimated: false,
    }
}

#[derive(Default)]
struct Acc {
    started: bool,
    content: String,
    tools: BTreeMap<u64, ToolCall>,
    stop_reason: Option<String>,
    usage: Usage,
}

impl Acc {
    fn apply(&mut self, v: &Value) -> Option<String> {
        self.started = true;
        match v["type"].as_str()? {
            "message_start" => {
                self.usage = anthropic_usage(&v["message"]["usage"]);
                None
            }
            "content_block_start" => {
                let b = &v["content_block"];
                if b["type"] == "tool_use" {
                    self.tools.insert(
                        v["index"].as_u64().unwrap_or(0),
                        ToolCall {
                            id: b["id"].as_str().unwrap_or("").to_string(),
                            name: b["name"].as_str().unwrap_or("").to_string(),
                            arguments: String::new(),
                        },
                    );
                } else if let Some(t) = b["text"].as_str().filter(|t| !t.is_empty()) {
                    self.content.push_str(t);
                    return Some(t.to_string());
                }
                None
            }
            "content_block_delta" => {
                let d = &v["delta"];
                match d["type"].as_str()? {
                    "text_delta" => {
                        let t = d["text"].as_str()?;
                        self.content.push_str(t);
                        Some(t.to_string())
                    }
                    "input_json_delta" => {
                        if let Some(c) = self.tools.get_mut(&v["index"].as_u64().unwrap_or(0)) {
                            c.arguments
                                .push_str(d["partial_json"].as_str().unwrap_or(""));
                        }
                        None
                    }
                    _ => None,
                }
            }
            "message_delta" => {
                if let Some(r) = v["delta"]["stop_reason"].as_str() {
                    self.stop_reason = Some(r.to_string());
                }
                if let Some(o) = v["usage"]["output_tokens"].as_u64() {
                    self.usage.output_tokens = o;
                }
                None
            }
            _ => None,
        }
    }

    fn finish(self) -> ChatResponse {
        ChatResponse {
            content: self.content,
            tool_calls: self
                .tools
                .into_values()
                .map(|mut c| {
                    if c.arguments.is_empty() {
                        c.arguments = "{}".into();
                    }
                    c
                })
                .collect(),
            finish_reason: self.stop_reason,
            usage: self.usage,
            model: String::new(),
        }
    }
}

#[async_trait]
impl ChatModel for Anthropic {
    fn name(&self) -> &str {
        &self.cfg.name
    }

    async fn complete(
        &self,
        req: &ChatRequest,
        stream: Option<&mpsc::Sender<StreamEvent>>,
    ) -> Result<ChatResponse, LlmError> {
        let r = match stream {
            Some(tx) => self.complete_stream(req, tx).await,
            None => {
                async {
                    let resp = self.send(self.body(req, false)).await?;
                    let (_, v) = self.endpoint().json_body(resp).await?;
                    parse_message(&v).ok_or_else(|| self.invalid("no content blocks"))
                }
                .await
            }
        };
        r.map(|resp| resp.answered_by(&req.model, &self.cfg.model))
            .map_err(|e| e.scrubbed(&self.scrubber))
    }
}

#[cfg(test)]
#[path = "anthropic_tests.rs"]
mod tests;
