//! Ollama's native chat API (`POST {base}/api/chat`, streamed as one JSON object a line), so
//! the gateway chooses the model's window instead of living with the server's default.
//!
//! Ollama serves a model with the server's `num_ctx` (its `OLLAMA_CONTEXT_LENGTH`, 4,096 or
//! more by version), not the model's own window, and a prompt longer than that is cut from the
//! front without an error: the system prompt and the tool schemas go first. This provider
//! sends `options.num_ctx` equal to the agent's window, capped by the model's
//! `context_length` (read once from `POST {base}/api/show`) and by the provider's
//! `num_ctx_max` (the machine's memory); keeps the model loaded (`keep_alive`); and refuses to
//! send a prompt it can see will not fit, with a [`LlmError::ContextLength`] naming the window,
//! so the session compacts and retries instead of answering from a cut prompt.
//! It holds no conversation state and never touches the store.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, OnceCell};

use super::http::{http_client, join_url, Endpoint};
use super::{ChatModel, ChatRequest, ChatResponse, LlmError, Message, Role, StreamEvent, ToolCall};
use super::{ToolSpec, Usage};
use crate::types::scrub::Scrubber;

/// Settings of one Ollama provider.
#[derive(Clone, Debug)]
pub struct OllamaConfig {
    /// Provider name for logs and errors.
    pub name: String,
    /// The server's root, e.g. `http://127.0.0.1:11434` (a trailing `/v1` is ignored).
    pub base_url: String,
    /// Model used when the request does not name one.
    pub model: String,
    /// Whole-request timeout.
    pub timeout: Duration,
    /// The agent's window in tokens: what `num_ctx` asks for before the caps.
    pub window: u64,
    /// Most tokens of context to ask for (the KV cache grows with it: the machine's memory).
    pub num_ctx_max: u64,
    /// How long Ollama keeps the model loaded after a request (`"30m"`, `"-1"` for ever).
    pub keep_alive: String,
    /// How tool calls are read: the server's `tool_calls`, else (`auto`) calls the model
    /// wrote as text ([`super::text_calls`]).
    pub tool_call_format: super::text_calls::ToolCallFormat,
}

/// What `/api/show` says about a model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelFacts {
    /// The model's own context length (`model_info["<arch>.context_length"]`), if reported.
    pub context_length: Option<u64>,
    /// Whether its template takes tools (`capabilities` contains `tools`), if reported.
    pub tools: Option<bool>,
}

/// An Ollama provider on the native API.
pub struct Ollama {
    cfg: OllamaConfig,
    chat_url: String,
    show_url: String,
    http: reqwest::Client,
    /// The model's facts, asked once (a failed ask is not cached).
    facts: OnceCell<ModelFacts>,
    /// Tool-call ids: Ollama gives none, results must refer to one.
    next_id: AtomicU64,
    scrubber: Scrubber,
}

impl Ollama {
    /// Build the provider and its HTTP client.
    ///
    /// # Errors
    /// The HTTP client cannot be built.
    pub fn new(cfg: OllamaConfig) -> Result<Self, LlmError> {
        let http = http_client(&cfg.name, cfg.timeout)?;
        let root = server_root(&cfg.base_url);
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            << 16;
        Ok(Self {
            chat_url: join_url(&root, "/api/chat"),
            show_url: join_url(&root, "/api/show"),
            cfg,
            http,
            facts: OnceCell::new(),
            next_id: AtomicU64::new(seed),
            scrubber: Scrubber::new(Vec::new()),
        })
    }

    /// Redact with `scrubber` (the daemon's, built from every configured secret).
    #[must_use]
    pub fn with_scrubber(mut self, scrubber: Scrubber) -> Self {
        self.scrubber = scrubber;
        self
    }

    fn endpoint<'a>(&'a self, url: &'a str) -> Endpoint<'a> {
        Endpoint {
            http: &self.http,
            provider: &self.cfg.name,
            url,
            timeout: self.cfg.timeout,
            full_cause: true,
            scrubber: &self.scrubber,
        }
    }

    /// The model's facts from `/api/show` (asked once per provider; a failure is asked again
    /// next time).
    ///
    /// # Errors
    /// The server cannot be reached or answers with an error (an unknown model: 404).
    pub async fn facts(&self, model: &str) -> Result<ModelFacts, LlmError> {
        if model == self.cfg.model {
            if let Some(f) = self.facts.get() {
                return Ok(f.clone());
            }
        }
        let ep = self.endpoint(&self.show_url);
        let body = serde_json::to_vec(&json!({ "model": model })).unwrap_or_default();
        let resp = ep.send(ep.post(body)).await?;
        let (_, v) = ep.json_body(resp).await?;
        let f = facts_of(&v);
        if model == self.cfg.model {
            let _ = self.facts.set(f.clone());
        }
        Ok(f)
    }

    /// The `num_ctx` sent for `model`: the agent's window, capped by the model's context
    /// length (when the server says it) and by `num_ctx_max`.
    pub async fn num_ctx(&self, model: &str) -> u64 {
        let own = self
            .facts(model)
            .await
            .ok()
            .and_then(|f| f.context_length)
            .unwrap_or(u64::MAX);
        self.cfg.window.min(self.cfg.num_ctx_max).min(own).max(512)
    }

    fn body(&self, req: &ChatRequest, model: &str, num_ctx: u64, stream: bool) -> Vec<u8> {
        let mut options = Map::new();
        options.insert("num_ctx".into(), json!(num_ctx));
        if let Some(t) = req.temperature {
            options.insert("temperature".into(), json!(t));
        }
        if let Some(m) = req.max_tokens {
            options.insert("num_predict".into(), json!(m));
        }
        let mut body = json!({
            "model": model,
            "messages": req.messages.iter().map(wire_message).collect::<Vec<_>>(),
            "stream": stream,
            "keep_alive": self.cfg.keep_alive,
            "options": options,
        });
        if !req.tools.is_empty() {
            body["tools"] = wire_tools(&req.tools);
        }
        serde_json::to_vec(&body).unwrap_or_default()
    }

    fn call_id(&self) -> String {
        format!("call_{:x}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    async fn run(
        &self,
        req: &ChatRequest,
        stream: Option<&mpsc::Sender<StreamEvent>>,
    ) -> Result<ChatResponse, LlmError> {
        let model = if req.model.is_empty() {
            self.cfg.model.as_str()
        } else {
            req.model.as_str()
        };
        let num_ctx = self.num_ctx(model).await;
        // Ollama would cut the front of a prompt over `num_ctx` silently: refuse it here, so
        // the session compacts to fit instead (with room for a short answer).
        let sent = super::tokens::of_request(req);
        let answer_room = u64::from(req.max_tokens.unwrap_or(256)).min(num_ctx / 4);
        if sent + answer_room > num_ctx {
            return Err(LlmError::ContextLength {
                provider: self.cfg.name.clone(),
                // Not sent: the status Ollama would have owed us.
                status: 413,
                body: format!(
                    "not sent: the prompt (~{sent} tokens) does not fit the window asked of Ollama (num_ctx {num_ctx}), which would cut its front silently"
                ),
                window: Some(num_ctx),
            });
        }
        let ep = self.endpoint(&self.chat_url);
        let resp = ep
            .send(ep.post(self.body(req, model, num_ctx, stream.is_some())))
            .await?;
        let mut acc = Acc::default();
        if let Some(tx) = stream {
            let mut bytes = resp.bytes_stream();
            let mut buf: Vec<u8> = Vec::new();
            while let Some(chunk) = bytes.next().await {
                let chunk = chunk.map_err(|e| ep.body_error(&e))?;
                buf.extend_from_slice(&chunk);
                while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=nl).collect();
                    if let Some(delta) = self.line(&ep, &line, &mut acc)? {
                        let _ = tx.send(StreamEvent::TextDelta(delta)).await;
                    }
                }
            }
            if !buf.is_empty() {
                if let Some(delta) = self.line(&ep, &buf, &mut acc)? {
                    let _ = tx.send(StreamEvent::TextDelta(delta)).await;
                }
            }
            if !acc.done {
                return Err(ep.cut(if acc.saw_line {
                    "the stream ended before its `done` line"
                } else {
                    "the stream ended before its first line"
                }));
            }
        } else {
            let (_, v) = ep.json_body(resp).await?;
            acc.apply(&v, self);
        }
        Ok(acc.finish(sent))
    }

    /// Fold one NDJSON line in; returns its text delta.
    fn line(
        &self,
        ep: &Endpoint<'_>,
        line: &[u8],
        acc: &mut Acc,
    ) -> Result<Option<String>, LlmError> {
        let text = String::from_utf8_lossy(line);
        let text = text.trim();
        if text.is_empty() {
            return Ok(None);
        }
        let v: Value =
            serde_json::from_str(text).map_err(|e| ep.invalid(format!("bad stream line: {e}")))?;
        if let Some(err) = v.get("error") {
            return Err(ep.invalid(format!("stream error: {err}")));
        }
        Ok(acc.apply(&v, self))
    }
}

/// `base_url` without a trailing `/` or `/v1` (the OpenAI-compatible path people copy).
pub fn server_root(base_url: &str) -> String {
    let b = base_url.trim_end_matches('/');
    b.strip_suffix("/v1").unwrap_or(b).to_string()
}

/// The facts in an `/api/show` answer.
pub fn facts_of(v: &Value) -> ModelFacts {
    let context_length = v["model_info"].as_object().and_then(|m| {
        m.iter()
            .find(|(k, _)| k.ends_with(".context_length"))
            .and_then(|(_, v)| v.as_u64())
    });
    let tools = v["capabilities"]
        .as_array()
        .map(|c| c.iter().any(|x| x == "tools"));
    ModelFacts {
        context_length,
        tools,
    }
}

fn wire_tools(tools: &[ToolSpec]) -> Value {
    tools
        .iter()
        .map(|t| {
            json!({"type": "function", "function": {
                "name": t.name, "description": t.description, "parameters": t.parameters,
            }})
        })
        .collect()
}

/// A transcript message in Ollama's format: images as base64 beside the text, tool-call
/// arguments as objects, tool results named by `tool_name`.
fn wire_message(m: &Message) -> Value {
    match m.role {
        Role::System => json!({"role": "system", "content": m.content}),
        Role::User => {
            let mut v = json!({"role": "user", "content": m.content});
            let images: Vec<&str> = m.images.iter().filter_map(|i| i.data.as_deref()).collect();
            if !images.is_empty() {
                v["images"] = json!(images);
            }
            v
        }
        Role::Assistant => {
            let mut v = json!({"role": "assistant", "content": m.content});
            if !m.tool_calls.is_empty() {
                v["tool_calls"] = m
                    .tool_calls
                    .iter()
                    .map(|c| {
                        let args = serde_json::from_str::<Map<String, Value>>(&c.arguments)
                            .map_or_else(|_| json!({}), Value::Object);
                        json!({"function": {"name": c.name, "arguments": args}})
                    })
                    .collect();
            }
            v
        }
        Role::Tool => json!({
            "role": "tool",
            "content": m.content,
            "tool_name": m.name.as_deref().unwrap_or(""),
        }),
    }
}

#[derive(Default)]
struct Acc {
    content: String,
    calls: Vec<ToolCall>,
    done: bool,
    done_reason: Option<String>,
    prompt_eval: Option<u64>,
    eval: Option<u64>,
    saw_line: bool,
}

impl Acc {
    fn apply(&mut self, v: &Value, p: &Ollama) -> Option<String> {
        self.saw_line = true;
        if v["done"].as_bool() == Some(true) {
            self.done = true;
            self.done_reason = v["done_reason"].as_str().map(str::to_string);
            self.prompt_eval = v["prompt_eval_count"].as_u64();
            self.eval = v["eval_count"].as_u64();
        }
        let msg = v.get("message")?;
        for c in msg["tool_calls"].as_array().into_iter().flatten() {
            let f = &c["function"];
            self.calls.push(ToolCall {
                id: c["id"]
                    .as_str()
                    .filter(|s| !s.is_empty())
                    .map_or_else(|| p.call_id(), str::to_string),
                name: f["name"].as_str().unwrap_or("").to_string(),
                arguments: match &f["arguments"] {
                    Value::String(s) => s.clone(),
                    Value::Null => "{}".to_string(),
                    other => other.to_string(),
                },
            });
        }
        let text = msg["content"].as_str().filter(|t| !t.is_empty())?;
        self.content.push_str(text);
        Some(text.to_string())
    }

    fn finish(self, sent: u64) -> ChatResponse {
        let finish_reason = if self.calls.is_empty() {
            self.done_reason.or_else(|| Some("stop".into()))
        } else {
            Some("tool_calls".into())
        };
        // Older servers leave `prompt_eval_count` out (or count only the tokens not served
        // from their cache): the estimate stands in, marked as one.
        let usage = match (self.prompt_eval, self.eval) {
            (Some(p), e) if p > 0 => Usage {
                input_tokens: p,
                output_tokens: e.unwrap_or_else(|| super::tokens::of_text(&self.content)),
                cached_tokens: 0,
                estimated: e.is_none(),
            },
            (_, e) => Usage {
                input_tokens: sent,
                output_tokens: e.unwrap_or_else(|| super::tokens::of_text(&self.content)),
                cached_tokens: 0,
                estimated: true,
            },
        };
        ChatResponse {
            content: self.content,
            tool_calls: self.calls,
            finish_reason,
            usage,
            model: String::new(),
        }
    }
}

#[async_trait]
impl ChatModel for Ollama {
    fn name(&self) -> &str {
        &self.cfg.name
    }

    async fn complete(
        &self,
        req: &ChatRequest,
        stream: Option<&mpsc::Sender<StreamEvent>>,
    ) -> Result<ChatResponse, LlmError> {
        self.run(req, stream)
            .await
            .map(|r| r.with_text_calls(req, self.cfg.tool_call_format, &self.next_id))
            .map(|r| r.answered_by(&req.model, &self.cfg.model))
            .map_err(|e| e.scrubbed(&self.scrubber))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_root_drops_the_openai_path() {
        assert_eq!(server_root("http://h:11434/v1/"), "http://h:11434");
        assert_eq!(server_root("http://h:11434"), "http://h:11434");
    }

    #[test]
    fn show_facts_read_the_context_length_and_tools() {
        let v = json!({"model_info": {"general.architecture": "qwen2", "qwen2.context_length": 32768},
                       "capabilities": ["completion", "tools"]});
        assert_eq!(
            facts_of(&v),
            ModelFacts {
                context_length: Some(32768),
                tools: Some(true)
            }
        );
        assert_eq!(facts_of(&json!({})), ModelFacts::default());
    }

    #[test]
    fn tool_calls_go_back_with_object_arguments_and_results_by_name() {
        let mut m = Message::assistant("");
        m.tool_calls.push(ToolCall {
            id: "c1".into(),
            name: "read_file".into(),
            arguments: r#"{"path":"a"}"#.into(),
        });
        let v = wire_message(&m);
        assert_eq!(v["tool_calls"][0]["function"]["arguments"]["path"], "a");
        let r = wire_message(&Message::tool_result("c1", "read_file", "x"));
        assert_eq!(r["tool_name"], "read_file");
    }
}
