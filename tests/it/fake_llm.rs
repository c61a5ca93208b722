//! An OpenAI-compatible LLM server for tests: real HTTP on 127.0.0.1, scripted replies (text,
//! tool calls, error statuses, delays, hangs, empty answers, streams cut mid-answer), SSE
//! streaming in OpenAI's chunk format, and a record of every request body (recorded before
//! answering).
//!
//! Usage is reported as a real server does: `prompt_tokens` estimated from the request (4 bytes
//! a token), `completion_tokens` from the answer, and `prompt_tokens_details.cached_tokens` for
//! the prefix shared with the previous request (as OpenAI's automatic prompt cache would).
//!
//! [`FakeLlm::strict`] makes it reject what real providers reject, with their status and error
//! shape: a prompt over the context window (400 `context_length_exceeded`), a tool result that
//! answers no call or a call left without a result, tool-call arguments that are not valid JSON,
//! and duplicate tool-call ids (400 `invalid_request_error`).

use std::collections::{HashSet, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, Response, StatusCode};
use axum::routing::post;
use axum::serve::ListenerExt;
use axum::{Json, Router};
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::Notify;

/// One scripted answer.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A final text answer.
    Text(String),
    /// Tool calls: (id, name, raw argument text).
    ToolCalls(Vec<(String, String, String)>),
    /// An HTTP error: status, `Retry-After` seconds, body.
    Status(u16, Option<u64>, String),
    /// Wait, then answer.
    Delay(Duration, Box<Reply>),
    /// Never answer (until the client goes away).
    Hang,
    /// A text answer quoting every tool result of the request, as a model repeating what a
    /// tool returned would.
    EchoToolResults,
    /// A completion with no content and no tool calls (`finish_reason: stop`).
    #[allow(dead_code)]
    Empty,
    /// This text, then the connection drops: streamed, the SSE stops without a finish reason or
    /// `[DONE]`; not streamed, the JSON body is cut in half.
    #[allow(dead_code)]
    Cut(String),
    /// Streamed: this text, then the stream stays open without another byte (a model that
    /// stalls mid-answer). Not streamed: like [`Reply::Hang`].
    #[allow(dead_code)]
    Stall(String),
    /// A final text answer whose response reports no `usage` (as some local servers do).
    #[allow(dead_code)]
    NoUsage(String),
}

/// Picks the reply from the request itself (for concurrent agents whose calls interleave);
/// `None` falls back to the queued script.
pub type ReplyRouter = Arc<dyn Fn(&Value) -> Option<Reply> + Send + Sync>;

#[derive(Default)]
struct Inner {
    script: VecDeque<Reply>,
    requests: Vec<Value>,
    /// The same bodies as sent, the time stamps before user messages included.
    raw_requests: Vec<Value>,
    router: Option<ReplyRouter>,
    strict: Option<Strict>,
    /// The serialised prompt of the previous request (for `cached_tokens`).
    last_prompt: Vec<u8>,
    /// Behave like Ollama ([`FakeLlm::ollama`]).
    ollama: Option<OllamaMode>,
    /// What the model read of each request (after any silent cut), in order, with whether
    /// it was cut.
    read: Vec<(Value, bool)>,
}

/// How the fake behaves as an Ollama server.
#[derive(Clone, Copy, Debug)]
struct OllamaMode {
    /// The server's window when a request does not set `options.num_ctx` (always, on its
    /// OpenAI-compatible endpoint): `OLLAMA_CONTEXT_LENGTH`, 4096 by default.
    default_ctx: u64,
    /// The model's own `context_length` (`/api/show`); a larger `num_ctx` is capped to it.
    context_length: u64,
}

/// What a model answers once its instructions were cut away: the tests assert no user ever
/// sees it.
pub const CUT_ANSWER: &str = "I have no instructions or tools; how can I help?";

/// `body` as Ollama's runner reads it with a window of `num_ctx` tokens: a prompt that fits
/// is read whole; a longer one loses its front silently: the tools and the messages from the
/// first on, until what is left fills half the window (Ollama keeps `num_ctx/2` tokens of an
/// over-long prompt). Returns the body read and whether it was cut.
fn ollama_read(body: &Value, num_ctx: u64) -> (Value, bool) {
    if est_tokens(prompt_bytes(body).len()) <= num_ctx {
        return (body.clone(), false);
    }
    let mut read = body.clone();
    read["tools"] = Value::Null;
    let msgs = messages_of(body);
    let mut start = 0;
    loop {
        read["messages"] = Value::Array(msgs[start..].to_vec());
        if est_tokens(prompt_bytes(&read).len()) <= num_ctx / 2 || start + 1 >= msgs.len() {
            return (read, true);
        }
        start += 1;
    }
}

fn messages_of(body: &Value) -> Vec<Value> {
    body["messages"].as_array().cloned().unwrap_or_default()
}

/// What a strict fake rejects.
#[derive(Clone, Copy, Debug)]
struct Strict {
    /// Context window in (estimated) tokens: prompt plus `max_tokens`.
    window: Option<u64>,
    /// Bytes a token when counting the prompt (and reporting its usage): 4, or 3 for
    /// [`FakeLlm::strict_small_model`] (a small model's tokenizer on English text).
    bytes_per_token: usize,
    /// Also refuse a tool call in the messages naming a tool the request does not declare.
    declared_tools: bool,
}

/// Estimated tokens of bytes, the rule weft documents (4 bytes a token, rounded up).
pub fn est_tokens(bytes: usize) -> u64 {
    bytes.div_ceil(4) as u64
}

/// The prompt of a request as the fake sizes it: its messages and tools, serialised.
fn prompt_bytes(body: &Value) -> Vec<u8> {
    let mut v = serde_json::to_vec(&body["tools"]).unwrap_or_default();
    v.extend(serde_json::to_vec(&body["messages"]).unwrap_or_default());
    v
}

#[derive(Clone, Default)]
struct Shared {
    inner: Arc<Mutex<Inner>>,
    changed: Arc<Notify>,
}

/// The fake server.
pub struct FakeLlm {
    addr: std::net::SocketAddr,
    shared: Shared,
    _server: tokio::task::JoinHandle<()>,
}

impl FakeLlm {
    /// Bind 127.0.0.1:0 and serve.
    pub async fn start() -> FakeLlm {
        let shared = Shared::default();
        // No body limit: every request is recorded, however large (tests assert what the
        // model never received).
        let app = Router::new()
            .route("/v1/chat/completions", post(handle))
            // Ollama's native API ([`FakeLlm::ollama`]).
            .route("/api/chat", post(handle_native))
            .route("/api/show", post(handle_show))
            // The models it serves, as OpenAI lists them (`weft doctor` checks the configured
            // one is there).
            .route(
                "/v1/models",
                axum::routing::get(|| async {
                    axum::Json(json!({"object": "list", "data": [
                        {"id": "fake-model", "object": "model"},
                        {"id": "fake-small", "object": "model"},
                        // What onboard configures for OpenAI: the README's quick start runs
                        // against this fake standing in for OpenAI, which lists it.
                        {"id": "gpt-4o-mini", "object": "model"},
                    ]}))
                }),
            )
            .layer(axum::extract::DefaultBodyLimit::disable())
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let _ = axum::serve(listener, app).await;
        });
        FakeLlm {
            addr,
            shared,
            _server: server,
        }
    }

    /// `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Reject what real providers reject (see the module docs); `window` is the context
    /// window in estimated tokens, if any.
    #[allow(dead_code)]
    pub fn strict(&self, window: Option<u64>) {
        self.shared.inner.lock().unwrap().strict = Some(Strict {
            window,
            bytes_per_token: 4,
            declared_tools: false,
        });
    }

    /// [`FakeLlm::strict`] as a small local model enforces it: the prompt (tools included)
    /// counted at 3 bytes a token against `window`, usage reported the same way, and every
    /// tool call in the messages must name a tool the request declares.
    #[allow(dead_code)]
    pub fn strict_small_model(&self, window: u64) {
        self.shared.inner.lock().unwrap().strict = Some(Strict {
            window: Some(window),
            bytes_per_token: 3,
            declared_tools: true,
        });
    }

    /// Behave like Ollama: its OpenAI-compatible endpoint reads every prompt with the
    /// server's `default_ctx` window, and `/api/chat` with `options.num_ctx` when sent (capped
    /// by the model's `context_length`, which `/api/show` reports) else `default_ctx`. A
    /// longer prompt is cut from the front silently ([`ollama_read`]) and answered with
    /// [`CUT_ANSWER`]; the usage reports the tokens read (`prompt_eval_count`, or
    /// `prompt_tokens` on the OpenAI-compatible endpoint), as Ollama does.
    #[allow(dead_code)]
    pub fn ollama(&self, default_ctx: u64, context_length: u64) {
        self.shared.inner.lock().unwrap().ollama = Some(OllamaMode {
            default_ctx,
            context_length,
        });
    }

    /// The server's root (`http://127.0.0.1:PORT`), where Ollama's native API lives.
    #[allow(dead_code)]
    pub fn root_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What the model read of each request in Ollama mode (after any silent cut), and
    /// whether it was cut.
    #[allow(dead_code)]
    pub fn read(&self) -> Vec<(Value, bool)> {
        self.shared.inner.lock().unwrap().read.clone()
    }

    /// Queue a reply.
    pub fn push(&self, r: Reply) {
        self.shared.inner.lock().unwrap().script.push_back(r);
    }

    /// Answer by `f` (see [`ReplyRouter`]).
    #[allow(dead_code)]
    pub fn route(&self, f: impl Fn(&Value) -> Option<Reply> + Send + Sync + 'static) {
        self.shared.inner.lock().unwrap().router = Some(Arc::new(f));
    }

    /// Every request body received so far.
    pub fn requests(&self) -> Vec<Value> {
        self.shared.inner.lock().unwrap().requests.clone()
    }

    /// Every request body received so far exactly as sent: user messages start with the time
    /// they were sent (`[Fri 2026-11-27 18:03 +01:00] `), which [`Self::requests`] and the
    /// routers leave out so tests compare the texts the users wrote.
    #[allow(dead_code)]
    pub fn raw_requests(&self) -> Vec<Value> {
        self.shared.inner.lock().unwrap().raw_requests.clone()
    }

    /// Wait until `n` requests arrived (or `timeout`).
    #[allow(dead_code)]
    pub async fn wait_requests(&self, n: usize, timeout: Duration) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.shared.changed.notified();
            let r = self.requests();
            if r.len() >= n {
                return r;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.requests();
            }
        }
    }
}

/// `text` without the time stamp the gateway puts before a user message
/// (`[Fri 2026-11-27 18:03 +01:00] `), if it has one.
pub fn strip_stamp(text: &str) -> &str {
    clawft::config::types::unstamped(text)
}

/// `body` with the time stamps of its user messages left out (see [`strip_stamp`]).
pub fn unstamped(body: &Value) -> Value {
    let mut body = body.clone();
    if let Some(msgs) = body["messages"].as_array_mut() {
        for m in msgs.iter_mut().filter(|m| m["role"] == "user") {
            if let Some(t) = m["content"].as_str() {
                m["content"] = Value::String(strip_stamp(t).to_string());
            } else if let Some(parts) = m["content"].as_array_mut() {
                if let Some(p) = parts.iter_mut().find(|p| p["text"].is_string()) {
                    let t = strip_stamp(p["text"].as_str().unwrap_or_default()).to_string();
                    p["text"] = Value::String(t);
                }
            }
        }
    }
    body
}

/// Why a strict provider refuses `body`: (error code, message), as OpenAI words them.
pub fn strict_rejection(body: &Value, window: Option<u64>) -> Option<(&'static str, String)> {
    strict_rejection_by(body, window, 4, false)
}

/// A tool call in the messages of `body` naming a tool `body` does not declare, if any.
pub fn undeclared_call(body: &Value) -> Option<String> {
    let declared: HashSet<&str> = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|m| m["tool_calls"].as_array().into_iter().flatten())
        .filter_map(|c| c["function"]["name"].as_str())
        .find(|n| !declared.contains(n))
        .map(str::to_string)
}

fn strict_rejection_by(
    body: &Value,
    window: Option<u64>,
    bytes_per_token: usize,
    declared_tools: bool,
) -> Option<(&'static str, String)> {
    if declared_tools {
        if let Some(n) = undeclared_call(body) {
            return Some((
                "invalid_request_error",
                format!("Invalid 'messages': tool call to `{n}`, which is not in 'tools'"),
            ));
        }
    }
    if let Some(window) = window {
        let prompt = prompt_bytes(body).len().div_ceil(bytes_per_token) as u64;
        let max = body["max_tokens"]
            .as_u64()
            .or(body["max_completion_tokens"].as_u64())
            .unwrap_or(0);
        if prompt + max > window {
            return Some((
                "context_length_exceeded",
                format!("This model's maximum context length is {window} tokens. However, you requested {} tokens ({prompt} in the messages, {max} in the completion). Please reduce the length of the messages or completion.", prompt + max),
            ));
        }
    }
    if let Err(e) = check_tool_pairing(body) {
        return Some(("invalid_request_error", format!("Invalid 'messages': {e}")));
    }
    if let Err(e) = check_content_parts(body) {
        return Some(("invalid_request_error", e));
    }
    let mut ids = HashSet::new();
    for (i, m) in body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        for (j, c) in m["tool_calls"].as_array().into_iter().flatten().enumerate() {
            let id = c["id"].as_str().unwrap_or("");
            if id.is_empty() || !ids.insert(id.to_string()) {
                return Some((
                    "invalid_request_error",
                    format!(
                        "Invalid 'messages[{i}].tool_calls[{j}].id': duplicate or empty id {id:?}"
                    ),
                ));
            }
            let args = c["function"]["arguments"].as_str().unwrap_or("");
            if serde_json::from_str::<serde_json::Map<String, Value>>(args).is_err() {
                return Some((
                    "invalid_request_error",
                    format!("Invalid 'messages[{i}].tool_calls[{j}].function.arguments': not a JSON object"),
                ));
            }
        }
    }
    None
}

async fn handle(State(s): State<Shared>, Json(body): Json<Value>) -> Response<Body> {
    let mut cut_answer = false;
    let (reply, usage) = {
        let mut g = s.inner.lock().unwrap();
        g.raw_requests.push(body.clone());
        g.requests.push(unstamped(&body));
        let prompt = prompt_bytes(&body);
        let cached = prompt
            .iter()
            .zip(g.last_prompt.iter())
            .take_while(|(a, b)| a == b)
            .count();
        let per_token = g.strict.map_or(4, |st| st.bytes_per_token);
        let mut usage = (
            prompt.len().div_ceil(per_token) as u64,
            cached.div_ceil(per_token) as u64 & !63,
        );
        g.last_prompt = prompt;
        if let Some(o) = g.ollama {
            // Ollama's OpenAI-compatible endpoint takes no window per request.
            let (read, cut) = ollama_read(&body, o.default_ctx);
            usage = (est_tokens(prompt_bytes(&read).len()), 0);
            g.read.push((unstamped(&read), cut));
            cut_answer = cut;
        }
        let rejected = g.strict.and_then(|st| {
            strict_rejection_by(&body, st.window, st.bytes_per_token, st.declared_tools)
        });
        let routed = g.router.clone().and_then(|r| r(&unstamped(&body)));
        let reply = match (rejected, routed) {
            (Some((code, msg)), _) => {
                drop(g);
                s.changed.notify_waiters();
                let body = json!({"error": {"message": msg, "type": "invalid_request_error", "param": "messages", "code": code}});
                return Response::builder()
                    .status(StatusCode::BAD_REQUEST)
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(body.to_string()))
                    .unwrap();
            }
            (None, Some(r)) => r,
            (None, None) => g
                .script
                .pop_front()
                .unwrap_or_else(|| Reply::Text("(no script)".into())),
        };
        (reply, usage)
    };
    s.changed.notify_waiters();
    let stream = body["stream"].as_bool().unwrap_or(false);
    let model = body["model"].as_str().unwrap_or("fake").to_string();
    // A model whose instructions were cut away answers without them.
    let reply = if cut_answer {
        Reply::Text(CUT_ANSWER.into())
    } else {
        reply
    };
    let reply = match reply {
        Reply::EchoToolResults => Reply::Text(
            body["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|m| m["role"] == "tool")
                .map(|m| m["content"].as_str().unwrap_or_default().to_string())
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        other => other,
    };
    answer(reply, stream, &model, usage).await
}

/// `/api/show`: the model's architecture facts (its `context_length`) and capabilities.
async fn handle_show(State(s): State<Shared>, Json(body): Json<Value>) -> Response<Body> {
    let mode = s.inner.lock().unwrap().ollama;
    let Some(o) = mode else {
        return Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Body::from("404 page not found"))
            .unwrap();
    };
    let model = body["model"].as_str().unwrap_or_default();
    if model.is_empty() || model == "missing-model" {
        return Response::builder()
            .status(StatusCode::NOT_FOUND)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(
                json!({"error": format!("model '{model}' not found")}).to_string(),
            ))
            .unwrap();
    }
    json_response(json!({
        "modelfile": "# fake", "template": "{{ .Prompt }}",
        "details": {"family": "qwen2", "parameter_size": "7.6B", "quantization_level": "Q4_K_M"},
        "model_info": {"general.architecture": "qwen2", "qwen2.context_length": o.context_length},
        "capabilities": ["completion", "tools"],
    }))
}

/// `/api/chat`: Ollama's native chat, streamed as one JSON object a line. The window is
/// `options.num_ctx` (capped by the model's length), else the server's default.
async fn handle_native(State(s): State<Shared>, Json(body): Json<Value>) -> Response<Body> {
    let (reply, read_tokens, cut) = {
        let mut g = s.inner.lock().unwrap();
        let Some(o) = g.ollama else {
            return Response::builder()
                .status(StatusCode::NOT_FOUND)
                .body(Body::from("404 page not found"))
                .unwrap();
        };
        g.raw_requests.push(body.clone());
        g.requests.push(unstamped(&body));
        let num_ctx = body["options"]["num_ctx"]
            .as_u64()
            .map_or(o.default_ctx, |n| n.min(o.context_length));
        let (read, cut) = ollama_read(&body, num_ctx);
        let read_tokens = est_tokens(prompt_bytes(&read).len());
        g.read.push((unstamped(&read), cut));
        let reply = if cut {
            Reply::Text(CUT_ANSWER.into())
        } else {
            let routed = g.router.clone().and_then(|r| r(&unstamped(&body)));
            routed.unwrap_or_else(|| {
                g.script
                    .pop_front()
                    .unwrap_or_else(|| Reply::Text("(no script)".into()))
            })
        };
        (reply, read_tokens, cut)
    };
    let _ = cut;
    s.changed.notify_waiters();
    let stream = body["stream"].as_bool().unwrap_or(true);
    let model = body["model"].as_str().unwrap_or("fake").to_string();
    let mut reply = reply;
    if let Reply::EchoToolResults = reply {
        reply = Reply::Text(
            messages_of(&body)
                .iter()
                .filter(|m| m["role"] == "tool")
                .map(|m| m["content"].as_str().unwrap_or_default().to_string())
                .collect::<Vec<_>>()
                .join("\n"),
        );
    }
    while let Reply::Delay(d, inner) = reply {
        tokio::time::sleep(d).await;
        reply = *inner;
    }
    let (content, calls): (String, Vec<Value>) = match reply {
        Reply::Text(t) | Reply::NoUsage(t) => (t, Vec::new()),
        Reply::ToolCalls(calls) => (
            String::new(),
            calls
                .iter()
                .map(|(_, name, args)| {
                    let args: Value = serde_json::from_str(args).unwrap_or_else(|_| json!({}));
                    json!({"function": {"name": name, "arguments": args}})
                })
                .collect(),
        ),
        Reply::Status(code, _, text) => {
            return Response::builder()
                .status(StatusCode::from_u16(code).unwrap())
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(json!({ "error": text }).to_string()))
                .unwrap();
        }
        other => panic!("the Ollama fake does not script {other:?}"),
    };
    let eval = est_tokens(content.len()).max(1);
    let last = json!({"model": model, "created_at": "2026-12-07T18:00:00Z",
        "message": {"role": "assistant", "content": ""}, "done": true, "done_reason": "stop",
        "total_duration": 1000, "prompt_eval_count": read_tokens, "eval_count": eval});
    if !stream {
        let mut v = last;
        v["message"] = json!({"role": "assistant", "content": content});
        if !calls.is_empty() {
            v["message"]["tool_calls"] = Value::Array(calls);
        }
        return json_response(v);
    }
    let mut lines: Vec<Value> = Vec::new();
    let chars: Vec<char> = content.chars().collect();
    for part in chars.chunks(chars.len().div_ceil(3).max(1)) {
        lines.push(json!({"model": model, "created_at": "2026-12-07T18:00:00Z",
            "message": {"role": "assistant", "content": part.iter().collect::<String>()}, "done": false}));
    }
    if !calls.is_empty() {
        lines.push(json!({"model": model, "created_at": "2026-12-07T18:00:00Z",
            "message": {"role": "assistant", "content": "", "tool_calls": calls}, "done": false}));
    }
    lines.push(last);
    let frames: Vec<Result<Bytes, Infallible>> = lines
        .into_iter()
        .map(|l| Ok(Bytes::from(format!("{l}\n"))))
        .collect();
    Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(futures::stream::iter(frames)))
        .unwrap()
}

fn usage_json(prompt: u64, cached: u64, completion: &str) -> Value {
    let completion = est_tokens(completion.len()).max(1);
    json!({"prompt_tokens": prompt, "completion_tokens": completion,
           "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": cached}})
}

async fn answer(
    mut reply: Reply,
    stream: bool,
    model: &str,
    (prompt, cached): (u64, u64),
) -> Response<Body> {
    loop {
        match reply {
            Reply::Delay(d, inner) => {
                tokio::time::sleep(d).await;
                reply = *inner;
            }
            Reply::Hang => {
                std::future::pending::<()>().await;
            }
            Reply::EchoToolResults => reply = Reply::Text(String::new()),
            Reply::Empty => {
                return if stream {
                    let mut c = text_chunks("", model);
                    if let Some(last) = c.last_mut() {
                        last["usage"] = usage_json(prompt, cached, "");
                    }
                    sse(c)
                } else {
                    json_response(json!({
                        "id": "chatcmpl-fake", "object": "chat.completion", "model": model,
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": ""}}],
                        "usage": usage_json(prompt, cached, ""),
                    }))
                };
            }
            Reply::Stall(t) => {
                if !stream {
                    std::future::pending::<()>().await;
                }
                let mut c = text_chunks(&t, model);
                c.truncate(c.len().saturating_sub(2));
                let frames =
                    futures::StreamExt::chain(
                        futures::stream::iter(c.into_iter().map(|c| {
                            Ok::<_, std::io::Error>(Bytes::from(format!("data: {c}\n\n")))
                        })),
                        futures::stream::pending(),
                    );
                return Response::builder()
                    .header(header::CONTENT_TYPE, "text/event-stream")
                    .body(Body::from_stream(frames))
                    .unwrap();
            }
            Reply::Cut(t) => {
                return if stream {
                    let mut c = text_chunks(&t, model);
                    // Drop the finish chunk and the usage chunk: the connection ends mid-answer.
                    c.truncate(c.len().saturating_sub(2));
                    let frames: Vec<Result<Bytes, std::io::Error>> = c
                        .into_iter()
                        .map(|c| Ok(Bytes::from(format!("data: {c}\n\n"))))
                        .collect();
                    // The text reaches the client before the connection drops (an error in
                    // the same poll would abort the response before its headers: a connection
                    // error, not an answer cut mid-way).
                    let cut = futures::stream::once(async {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Err(std::io::Error::other("cut"))
                    });
                    Response::builder()
                        .header(header::CONTENT_TYPE, "text/event-stream")
                        .body(Body::from_stream(futures::StreamExt::chain(
                            futures::stream::iter(frames),
                            cut,
                        )))
                        .unwrap()
                } else {
                    let full = json!({
                        "id": "chatcmpl-fake", "object": "chat.completion", "model": model,
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": t}}],
                    })
                    .to_string();
                    let half = full.len() / 2;
                    json_response_raw(full[..half].to_string())
                };
            }
            Reply::Status(code, after, text) => {
                let mut b = Response::builder()
                    .status(StatusCode::from_u16(code).unwrap())
                    .header(header::CONTENT_TYPE, "application/json");
                if let Some(a) = after {
                    b = b.header(header::RETRY_AFTER, a.to_string());
                }
                let body = json!({"error": {"message": text, "type": "fake_error"}});
                return b.body(Body::from(body.to_string())).unwrap();
            }
            Reply::NoUsage(t) => {
                return if stream {
                    let mut c = text_chunks(&t, model);
                    c.pop(); // the usage chunk
                    sse(c)
                } else {
                    json_response(json!({
                        "id": "chatcmpl-fake", "object": "chat.completion", "model": model,
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": t}}],
                    }))
                };
            }
            Reply::Text(t) => {
                return if stream {
                    let mut c = text_chunks(&t, model);
                    if let Some(last) = c.last_mut() {
                        last["usage"] = usage_json(prompt, cached, &t);
                    }
                    sse(c)
                } else {
                    json_response(json!({
                        "id": "chatcmpl-fake", "object": "chat.completion", "model": model,
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": t}}],
                        "usage": usage_json(prompt, cached, &t),
                    }))
                };
            }
            Reply::ToolCalls(calls) => {
                let args: String = calls.iter().map(|c| c.2.as_str()).collect();
                return if stream {
                    let mut c = tool_chunks(&calls, model);
                    c.push(json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "choices": [],
                                  "usage": usage_json(prompt, cached, &args)}));
                    sse(c)
                } else {
                    let tc: Vec<Value> = calls
                        .iter()
                        .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}))
                        .collect();
                    json_response(json!({
                        "id": "chatcmpl-fake", "object": "chat.completion", "model": model,
                        "choices": [{"index": 0, "finish_reason": "tool_calls",
                                     "message": {"role": "assistant", "content": null, "tool_calls": tc}}],
                        "usage": usage_json(prompt, cached, &args),
                    }))
                };
            }
        }
    }
}

fn json_response_raw(v: String) -> Response<Body> {
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(v))
        .unwrap()
}

fn json_response(v: Value) -> Response<Body> {
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(v.to_string()))
        .unwrap()
}

fn chunk(model: &str, delta: Value, finish: Option<&str>) -> Value {
    json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": model,
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

fn text_chunks(t: &str, model: &str) -> Vec<Value> {
    let mut out = vec![chunk(
        model,
        json!({"role": "assistant", "content": ""}),
        None,
    )];
    // Split into three pieces on char boundaries.
    let chars: Vec<char> = t.chars().collect();
    let n = chars.len();
    for part in [
        &chars[..n / 3],
        &chars[n / 3..2 * n / 3],
        &chars[2 * n / 3..],
    ] {
        if !part.is_empty() {
            out.push(chunk(
                model,
                json!({"content": part.iter().collect::<String>()}),
                None,
            ));
        }
    }
    out.push(chunk(model, json!({}), Some("stop")));
    out.push(
        json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "choices": [],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}),
    );
    out
}

fn tool_chunks(calls: &[(String, String, String)], model: &str) -> Vec<Value> {
    let mut out = vec![chunk(
        model,
        json!({"role": "assistant", "content": null}),
        None,
    )];
    for (i, (id, name, args)) in calls.iter().enumerate() {
        out.push(chunk(
            model,
            json!({"tool_calls": [{"index": i, "id": id, "type": "function",
                                   "function": {"name": name, "arguments": ""}}]}),
            None,
        ));
        let mid = args
            .char_indices()
            .nth(args.chars().count() / 2)
            .map_or(0, |(b, _)| b);
        for piece in [&args[..mid], &args[mid..]] {
            out.push(chunk(
                model,
                json!({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}),
                None,
            ));
        }
    }
    out.push(chunk(model, json!({}), Some("tool_calls")));
    out
}

fn sse(chunks: Vec<Value>) -> Response<Body> {
    let mut frames: Vec<Result<Bytes, Infallible>> = chunks
        .into_iter()
        .map(|c| Ok(Bytes::from(format!("data: {c}\n\n"))))
        .collect();
    frames.push(Ok(Bytes::from_static(b"data: [DONE]\n\n")));
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from_stream(futures::stream::iter(frames)))
        .unwrap()
}

/// Every `tool` message answers an earlier assistant tool call, and every assistant tool call
/// has exactly one result before the next non-tool message (or the end).
/// Content parts as OpenAI checks them: only user messages may carry `image_url` parts; each
/// is a `data:` URL of a PNG, JPEG, GIF or WebP whose base64 decodes to bytes of that type
/// ("You uploaded an unsupported image" otherwise).
pub fn check_content_parts(req: &Value) -> Result<(), String> {
    use base64::Engine as _;
    for (i, m) in req["messages"].as_array().into_iter().flatten().enumerate() {
        let Some(parts) = m["content"].as_array() else {
            continue;
        };
        for (j, p) in parts.iter().enumerate() {
            let at = format!("Invalid 'messages[{i}].content[{j}]'");
            match p["type"].as_str() {
                Some("text") if p["text"].is_string() => {}
                Some("image_url") if m["role"] == "user" => {
                    let url = p["image_url"]["url"].as_str().unwrap_or("");
                    let Some((head, data)) = url
                        .strip_prefix("data:")
                        .and_then(|u| u.split_once(";base64,"))
                    else {
                        return Err(format!("{at}: expected a data URL"));
                    };
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(data)
                        .map_err(|_| format!("{at}: invalid base64"))?;
                    let ok = match head {
                        "image/png" => bytes.starts_with(b"\x89PNG"),
                        "image/jpeg" => bytes.starts_with(b"\xFF\xD8\xFF"),
                        "image/gif" => bytes.starts_with(b"GIF8"),
                        "image/webp" => bytes.get(8..12) == Some(b"WEBP"),
                        _ => false,
                    };
                    if !ok {
                        return Err(format!("{at}: You uploaded an unsupported image. Please make sure your image is valid."));
                    }
                }
                other => {
                    return Err(format!(
                        "{at}: unexpected part type {other:?} for role {}",
                        m["role"]
                    ))
                }
            }
        }
    }
    Ok(())
}

pub fn check_tool_pairing(req: &Value) -> Result<(), String> {
    let msgs = req["messages"].as_array().ok_or("no messages")?;
    let mut open: Vec<String> = Vec::new();
    let mut answered: HashSet<String> = HashSet::new();
    for (i, m) in msgs.iter().enumerate() {
        match m["role"].as_str() {
            Some("tool") => {
                let id = m["tool_call_id"]
                    .as_str()
                    .ok_or(format!("message {i}: tool without id"))?;
                if !open.iter().any(|o| o == id) {
                    return Err(format!(
                        "message {i}: result for unknown or closed call {id}"
                    ));
                }
                if !answered.insert(id.to_string()) {
                    return Err(format!("message {i}: second result for {id}"));
                }
            }
            role => {
                if let Some(missing) = open.iter().find(|o| !answered.contains(*o)) {
                    return Err(format!(
                        "message {i} ({role:?}): call {missing} has no result"
                    ));
                }
                open.clear();
                if role == Some("assistant") {
                    if let Some(calls) = m["tool_calls"].as_array() {
                        for c in calls {
                            open.push(c["id"].as_str().unwrap_or("").to_string());
                        }
                    }
                }
            }
        }
    }
    if let Some(missing) = open.iter().find(|o| !answered.contains(*o)) {
        return Err(format!("call {missing} has no result at the end"));
    }
    Ok(())
}
