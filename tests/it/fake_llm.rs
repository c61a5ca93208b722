//! An OpenAI-compatible LLM server for tests: real HTTP on 127.0.0.1, scripted replies (text,
//! tool calls, error statuses, delays, hangs), SSE streaming in OpenAI's chunk format, and a
//! record of every request body (recorded before answering).

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
}

/// Picks the reply from the request itself (for concurrent agents whose calls interleave);
/// `None` falls back to the queued script.
pub type ReplyRouter = Arc<dyn Fn(&Value) -> Option<Reply> + Send + Sync>;

#[derive(Default)]
struct Inner {
    script: VecDeque<Reply>,
    requests: Vec<Value>,
    router: Option<ReplyRouter>,
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

async fn handle(State(s): State<Shared>, Json(body): Json<Value>) -> Response<Body> {
    let reply = {
        let mut g = s.inner.lock().unwrap();
        g.requests.push(body.clone());
        let routed = g.router.clone().and_then(|r| r(&body));
        match routed {
            Some(r) => r,
            None => g
                .script
                .pop_front()
                .unwrap_or_else(|| Reply::Text("(no script)".into())),
        }
    };
    s.changed.notify_waiters();
    let stream = body["stream"].as_bool().unwrap_or(false);
    let model = body["model"].as_str().unwrap_or("fake").to_string();
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
    answer(reply, stream, &model).await
}

async fn answer(mut reply: Reply, stream: bool, model: &str) -> Response<Body> {
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
            Reply::Text(t) => {
                return if stream {
                    sse(text_chunks(&t, model))
                } else {
                    json_response(json!({
                        "id": "chatcmpl-fake", "object": "chat.completion", "model": model,
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": t}}],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                    }))
                };
            }
            Reply::ToolCalls(calls) => {
                return if stream {
                    sse(tool_chunks(&calls, model))
                } else {
                    let tc: Vec<Value> = calls
                        .iter()
                        .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}))
                        .collect();
                    json_response(json!({
                        "id": "chatcmpl-fake", "object": "chat.completion", "model": model,
                        "choices": [{"index": 0, "finish_reason": "tool_calls",
                                     "message": {"role": "assistant", "content": null, "tool_calls": tc}}],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                    }))
                };
            }
        }
    }
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
