//! OpenAI-compatible chat completions (`POST {base_url}/chat/completions`): OpenAI, OpenRouter,
//! Ollama, vLLM, llama.cpp. Non-streaming, and SSE streaming with tool calls assembled from
//! deltas by `index`.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::http::{http_client, join_url, Endpoint};
use super::{
    ChatModel, ChatRequest, ChatResponse, LlmError, Message, Role, StreamEvent, ToolCall, ToolSpec,
    Usage,
};
use crate::types::scrub::Scrubber;
use crate::types::MutexExt;

/// Settings of one OpenAI-compatible provider.
#[derive(Clone, Debug)]
pub struct OpenAiConfig {
    /// Provider name for logs and errors.
    pub name: String,
    /// Base URL, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// Bearer token, if the server needs one.
    pub api_key: Option<String>,
    /// Model used when the request does not name one.
    pub model: String,
    /// Whole-request timeout.
    pub timeout: Duration,
    /// Extra headers sent with every request.
    pub extra_headers: Vec<(String, String)>,
}

/// An OpenAI-compatible provider.
pub struct OpenAiCompat {
    cfg: OpenAiConfig,
    url: String,
    http: reqwest::Client,
    /// The serialised `tools` array of the last request and the specs it was made from: the
    /// tool list rarely changes between requests, so it is serialised once, not per request.
    tools_json: ToolsJsonCache,
    /// Redacts the key (and any configured secret, [`OpenAiCompat::with_secrets`]) from the
    /// errors this provider returns.
    scrubber: Scrubber,
    /// Compare the prompt tokens the server reports with our estimate and treat a prompt it
    /// read far less of as cut ([`OpenAiCompat::checking_truncation`]).
    check_truncation: bool,
    /// How tool calls are read ([`OpenAiCompat::reading_tool_calls`]).
    tool_call_format: super::text_calls::ToolCallFormat,
    /// Ids of tool calls read from text.
    text_call_ids: std::sync::atomic::AtomicU64,
}

/// Serialised tool lists, reused while the specs are equal (compared, not hashed).
#[derive(Default)]
pub(crate) struct ToolsJsonCache(std::sync::Mutex<Option<CachedTools>>);

/// A tool list and its JSON.
type CachedTools = (std::sync::Arc<[ToolSpec]>, std::sync::Arc<str>);

impl ToolsJsonCache {
    /// The JSON of `specs` rendered by `render`, from the cache when `specs` did not change.
    pub(crate) fn get(
        &self,
        specs: &std::sync::Arc<[ToolSpec]>,
        render: impl FnOnce(&[ToolSpec]) -> String,
    ) -> std::sync::Arc<str> {
        let mut slot = self.0.locked();
        if let Some((cached, json)) = slot.as_ref() {
            // The same list (a turn's later calls) is recognised without comparing schemas.
            if std::sync::Arc::ptr_eq(cached, specs) {
                return json.clone();
            }
            if **cached == **specs {
                // An equal copy: keep this one so the turn's next calls match by pointer.
                let json = json.clone();
                *slot = Some((specs.clone(), json.clone()));
                return json;
            }
        }
        let json: std::sync::Arc<str> = render(specs).into();
        *slot = Some((specs.clone(), json.clone()));
        json
    }
}

impl OpenAiCompat {
    /// Build the provider and its HTTP client.
    ///
    /// # Errors
    /// The HTTP client cannot be built.
    pub fn new(cfg: OpenAiConfig) -> Result<Self, LlmError> {
        let http = http_client(&cfg.name, cfg.timeout)?;
        let url = join_url(&cfg.base_url, "/chat/completions");
        let scrubber = Scrubber::new(
            cfg.api_key
                .iter()
                .cloned()
                .chain(cfg.extra_headers.iter().map(|(_, v)| v.clone()))
                .collect(),
        );
        Ok(Self {
            cfg,
            url,
            http,
            tools_json: ToolsJsonCache::default(),
            scrubber,
            check_truncation: false,
            tool_call_format: super::text_calls::ToolCallFormat::Native,
            text_call_ids: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Read tool calls the model wrote as text in `format` (`auto` for local servers: see
    /// [`super::text_calls`]); `native` (the default) only takes the server's `tool_calls`.
    #[must_use]
    pub fn reading_tool_calls(mut self, format: super::text_calls::ToolCallFormat) -> Self {
        self.tool_call_format = format;
        self
    }

    /// Check every answer for a prompt the server cut silently (local servers: Ollama's
    /// OpenAI-compatible endpoint, llama-server, LM Studio, vLLM): when the server reports
    /// reading fewer than 75% of the prompt tokens we estimate (and the prompt is over 1,024
    /// tokens), the answer is discarded and a [`LlmError::ContextLength`] carrying the count it
    /// read (and the window that suggests) is returned instead, so the session shrinks its
    /// window, compacts and retries once.
    #[must_use]
    pub fn checking_truncation(mut self, on: bool) -> Self {
        self.check_truncation = on;
        self
    }

    /// `resp`, unless it answers a prompt the server cut (see [`Self::checking_truncation`]).
    fn untruncated(&self, req: &ChatRequest, resp: ChatResponse) -> Result<ChatResponse, LlmError> {
        if !self.check_truncation {
            return Ok(resp);
        }
        match truncated(req, &resp.usage) {
            Some((read, sent)) => Err(LlmError::ContextLength {
                provider: self.cfg.name.clone(),
                status: 200,
                body: format!(
                    "the server read only {read} prompt tokens of the ~{sent} sent: it cut the front of the prompt (the instructions and tools) without saying so; its context window is smaller than the agent's"
                ),
                // Ollama keeps half its window of a prompt that overruns it (other servers
                // keep more): twice what was read, at most what was sent. A guess too large
                // is caught again on the retry, and the window shrinks further.
                window: Some((read * 2).min(sent)),
            }),
            None => Ok(resp),
        }
    }

    /// Redact with `scrubber` instead (the daemon builds one for every provider, from every
    /// configured secret and each provider's key and header values, which it must include).
    #[must_use]
    pub fn with_scrubber(mut self, scrubber: Scrubber) -> Self {
        self.scrubber = scrubber;
        self
    }

    /// The request body: the transcript serialised straight from the messages (no JSON tree
    /// copy) and the tools array from the cache.
    fn body(&self, req: &ChatRequest, stream: bool) -> Vec<u8> {
        let mut rest = json!({
            "model": if req.model.is_empty() { &self.cfg.model } else { &req.model },
        });
        if let Some(m) = req.max_tokens {
            rest["max_tokens"] = json!(m);
        }
        if let Some(t) = req.temperature {
            rest["temperature"] = json!(t);
        }
        if stream {
            rest["stream"] = json!(true);
            rest["stream_options"] = json!({"include_usage": true});
        }
        let mut out = Vec::with_capacity(16 * 1024);
        out.extend_from_slice(b"{\"messages\":");
        // Serialising borrowed data into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, &WireMessages(&req.messages));
        if !req.tools.is_empty() {
            let tools = self.tools_json.get(&req.tools, |specs| {
                let v: Vec<Value> = specs
                    .iter()
                    .map(|t| {
                        json!({"type": "function", "function": {
                            "name": t.name, "description": t.description, "parameters": t.parameters,
                        }})
                    })
                    .collect();
                Value::Array(v).to_string()
            });
            out.extend_from_slice(b",\"tools\":");
            out.extend_from_slice(tools.as_bytes());
        }
        if let Value::Object(m) = rest {
            for (k, v) in m {
                out.push(b',');
                let _ = serde_json::to_writer(&mut out, &k);
                out.push(b':');
                let _ = serde_json::to_writer(&mut out, &v);
            }
        }
        out.push(b'}');
        out
    }

    /// The request body bytes sent for `req` (what [`ChatModel::complete`] posts), for the
    /// request-building benchmark (`benches/hot_paths.rs`).
    #[doc(hidden)]
    pub fn encode_request(&self, req: &ChatRequest, stream: bool) -> Vec<u8> {
        serde_json::to_vec(&self.body(req, stream)).unwrap_or_default()
    }

    /// Where requests go, and the names errors carry.
    fn endpoint(&self) -> Endpoint<'_> {
        Endpoint {
            http: &self.http,
            provider: &self.cfg.name,
            url: &self.url,
            timeout: self.cfg.timeout,
            full_cause: true,
            scrubber: &self.scrubber,
        }
    }

    fn invalid(&self, detail: impl Into<String>) -> LlmError {
        self.endpoint().invalid(detail)
    }

    /// POST `body` with the bearer token and the extra headers.
    async fn send(&self, body: Vec<u8>) -> Result<reqwest::Response, LlmError> {
        let ep = self.endpoint();
        let mut rb = ep.post(body);
        if let Some(k) = &self.cfg.api_key {
            rb = rb.bearer_auth(k);
        }
        for (k, v) in &self.cfg.extra_headers {
            rb = rb.header(k, v);
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
        let mut acc = StreamAcc::default();
        while let Some(ev) = events.next().await {
            let ev = ev?;
            let data = ev.data.trim_start();
            if data == "[DONE]" {
                return acc.finish(self);
            }
            let v: Value = serde_json::from_str(data)
                .map_err(|e| self.invalid(format!("bad stream chunk: {e}")))?;
            if let Some(err) = v.get("error") {
                return Err(self.invalid(format!("stream error: {err}")));
            }
            if let Some(text) = acc.apply(&v) {
                let _ = tx.send(StreamEvent::TextDelta(text)).await;
            }
        }
        // Some servers end the stream without [DONE], but never without a finish reason: a
        // stream that just stops was cut off mid-answer (its text and tool arguments are
        // partial).
        if acc.finish_reason.is_none() {
            return Err(self.endpoint().cut(if acc.saw_chunk {
                "the stream ended without a finish reason or [DONE]"
            } else {
                "the stream ended before its first chunk"
            }));
        }
        acc.finish(self)
    }
}

/// The transcript in OpenAI's wire format, serialised from borrowed messages (the same JSON as
/// [`wire_message`], without building it as a tree first).
struct WireMessages<'a>(&'a [Message]);

impl serde::Serialize for WireMessages<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(WireMessage))
    }
}

struct WireMessage<'a>(&'a Message);

#[derive(serde::Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(serde::Serialize)]
struct WireCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

impl serde::Serialize for WireMessage<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let m = self.0;
        let mut map = s.serialize_map(None)?;
        match m.role {
            Role::User if m.images.iter().any(|i| i.data.is_some()) => {
                // Text then images, as content parts (`image_url` with a data URL).
                let mut parts = Vec::with_capacity(m.images.len() + 1);
                if !m.content.is_empty() {
                    parts.push(json!({"type": "text", "text": m.content}));
                }
                for url in m.images.iter().filter_map(super::ImagePart::data_url) {
                    parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
                }
                map.serialize_entry("content", &parts)?;
                map.serialize_entry("role", "user")?;
            }
            Role::System | Role::User => {
                map.serialize_entry("content", &m.content)?;
                map.serialize_entry(
                    "role",
                    if m.role == Role::System {
                        "system"
                    } else {
                        "user"
                    },
                )?;
            }
            Role::Assistant => {
                if m.content.is_empty() && !m.tool_calls.is_empty() {
                    map.serialize_entry("content", &())?;
                } else {
                    map.serialize_entry("content", &m.content)?;
                }
                map.serialize_entry("role", "assistant")?;
                if !m.tool_calls.is_empty() {
                    let calls: Vec<WireCall<'_>> = m
                        .tool_calls
                        .iter()
                        .map(|c| WireCall {
                            id: &c.id,
                            kind: "function",
                            function: WireFunction {
                                name: &c.name,
                                arguments: &c.arguments,
                            },
                        })
                        .collect();
                    map.serialize_entry("tool_calls", &calls)?;
                }
            }
            Role::Tool => {
                map.serialize_entry("content", &m.content)?;
                map.serialize_entry("role", "tool")?;
                map.serialize_entry("tool_call_id", m.tool_call_id.as_deref().unwrap_or(""))?;
            }
        }
        map.end()
    }
}

/// A transcript message in OpenAI's wire format.
#[cfg(test)]
fn wire_message(m: &Message) -> Value {
    match m.role {
        Role::System => json!({"role": "system", "content": m.content}),
        Role::User if m.images.iter().any(|i| i.data.is_some()) => {
            let mut parts = Vec::new();
            if !m.content.is_empty() {
                parts.push(json!({"type": "text", "text": m.content}));
            }
            for url in m.images.iter().filter_map(super::ImagePart::data_url) {
                parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
            }
            json!({"role": "user", "content": parts})
        }
        Role::User => json!({"role": "user", "content": m.content}),
        Role::Assistant => {
            let mut v = json!({"role": "assistant"});
            v["content"] = if m.content.is_empty() && !m.tool_calls.is_empty() {
                Value::Null
            } else {
                json!(m.content)
            };
            if !m.tool_calls.is_empty() {
                v["tool_calls"] = m
                    .tool_calls
                    .iter()
                    .map(|c| {
                        json!({"id": c.id, "type": "function",
                               "function": {"name": c.name, "arguments": c.arguments}})
                    })
                    .collect();
            }
            v
        }
        Role::Tool => json!({
            "role": "tool",
            "tool_call_id": m.tool_call_id.as_deref().unwrap_or(""),
            "content": m.content,
        }),
    }
}

fn usage_of(v: &Value) -> Usage {
    Usage {
        input_tokens: v["prompt_tokens"].as_u64().unwrap_or(0),
        output_tokens: v["completion_tokens"].as_u64().unwrap_or(0),
        cached_tokens: v["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
        estimated: false,
    }
}

/// `(read, sent)` when the server reports reading far fewer prompt tokens than were sent:
/// under 75% of our estimate of a prompt over 1,024 tokens. Real tokenizers count 3.5–4.5
/// bytes a token where the estimate counts 4, so an honest count is never that far below;
/// a server that reports nothing (0) is not judged.
pub(crate) fn truncated(req: &ChatRequest, usage: &Usage) -> Option<(u64, u64)> {
    let read = usage.input_tokens;
    if read == 0 || usage.estimated {
        return None;
    }
    let sent = super::tokens::of_request(req);
    (sent >= 1024 && read * 4 < sent * 3).then_some((read, sent))
}

/// Parse a non-streaming completion body.
fn parse_completion(v: &Value) -> Option<ChatResponse> {
    let choice = v.get("choices")?.get(0)?;
    let msg = choice.get("message")?;
    let tool_calls = msg
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| {
            calls
                .iter()
                .enumerate()
                .map(|(i, c)| ToolCall {
                    id: c["id"]
                        .as_str()
                        .map_or_else(|| format!("call_{i}"), str::to_string),
                    name: c["function"]["name"].as_str().unwrap_or("").to_string(),
                    arguments: match &c["function"]["arguments"] {
                        Value::String(s) => s.clone(),
                        Value::Null => String::new(),
                        other => other.to_string(),
                    },
                })
                .collect()
        })
        .unwrap_or_default();
    Some(ChatResponse {
        content: msg["content"].as_str().unwrap_or("").to_string(),
        tool_calls,
        finish_reason: choice["finish_reason"].as_str().map(str::to_string),
        usage: usage_of(&v["usage"]),
        model: String::new(),
    })
}

#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

#[derive(Default)]
struct StreamAcc {
    content: String,
    calls: BTreeMap<u64, PartialCall>,
    finish_reason: Option<String>,
    usage: Usage,
    saw_chunk: bool,
}

impl StreamAcc {
    /// Fold one chunk in; returns the text delta it carried, if any.
    fn apply(&mut self, v: &Value) -> Option<String> {
        self.saw_chunk = true;
        if v.get("usage").is_some_and(Value::is_object) {
            self.usage = usage_of(&v["usage"]);
        }
        let choice = v.get("choices")?.get(0)?;
        if let Some(r) = choice["finish_reason"].as_str() {
            self.finish_reason = Some(r.to_string());
        }
        let delta = choice.get("delta")?;
        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
            for (pos, c) in calls.iter().enumerate() {
                let idx = c["index"].as_u64().unwrap_or(pos as u64);
                let p = self.calls.entry(idx).or_default();
                if let Some(id) = c["id"].as_str() {
                    p.id.push_str(id);
                }
                if let Some(n) = c["function"]["name"].as_str() {
                    p.name.push_str(n);
                }
                if let Some(a) = c["function"]["arguments"].as_str() {
                    p.arguments.push_str(a);
                }
            }
        }
        let text = delta["content"].as_str().filter(|t| !t.is_empty())?;
        self.content.push_str(text);
        Some(text.to_string())
    }

    fn finish(self, p: &OpenAiCompat) -> Result<ChatResponse, LlmError> {
        if !self.saw_chunk {
            return Err(p.invalid("empty stream"));
        }
        Ok(ChatResponse {
            content: self.content,
            tool_calls: self
                .calls
                .into_iter()
                .map(|(i, c)| ToolCall {
                    id: if c.id.is_empty() {
                        format!("call_{i}")
                    } else {
                        c.id
                    },
                    name: c.name,
                    arguments: c.arguments,
                })
                .collect(),
            finish_reason: self.finish_reason,
            usage: self.usage,
            model: String::new(),
        })
    }
}

/// The key and the extra header values of `cfg` (headers often carry credentials), plus `more`.

#[async_trait]
impl ChatModel for OpenAiCompat {
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
            None => self.complete_once(req).await,
        };
        r.and_then(|resp| self.untruncated(req, resp))
            .map(|resp| resp.with_text_calls(req, self.tool_call_format, &self.text_call_ids))
            .map(|resp| resp.answered_by(&req.model, &self.cfg.model))
            .map_err(|e| e.scrubbed(&self.scrubber))
    }
}

impl OpenAiCompat {
    /// One non-streaming completion.
    async fn complete_once(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let resp = self.send(self.body(req, false)).await?;
        let (bytes, v) = self.endpoint().json_body(resp).await?;
        parse_completion(&v).ok_or_else(|| {
            let shown: String = String::from_utf8_lossy(&bytes).chars().take(300).collect();
            self.invalid(format!("no choices[0].message in {shown}"))
        })
    }
}

#[cfg(test)]
#[path = "openai_tests.rs"]
mod tests;
