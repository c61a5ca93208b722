//! A zero-latency OpenAI-compatible LLM on 127.0.0.1: `POST .../chat/completions`, JSON or SSE
//! (when the request says `"stream": true`), keep-alive, `TCP_NODELAY`, each response written
//! with one write call.
//!
//! Script, decided from the request alone: when the last message is a tool result the answer is
//! the final text [`FINAL_TEXT`]; otherwise it is one `read_file` call of [`TOOL_FILE`], or, when
//! the user message starts with [`EXEC_PREFIX`], one `exec_shell` call of the rest of the
//! message. So every turn is 2 LLM calls + 1 tool call, whatever the session.
//!
//! It records the tool-call leg (its tool-call response written → the request carrying that
//! call's result fully received), the body size of each session's first request, and counts.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};

use crate::http::{write_response, Reader};

/// The final answer of every turn.
pub const FINAL_TEXT: &str = "Done: the note says hello.";
/// The workspace file the tool call reads.
pub const TOOL_FILE: &str = "note.txt";
/// A user message starting with this asks for an `exec_shell` call of the rest.
pub const EXEC_PREFIX: &str = "exec: ";
/// A user message starting with this names a sequence of tool calls, one per request: the
/// rest is a JSON array of `[name, arguments]`; the final text follows the last result.
pub const CALLS_PREFIX: &str = "calls: ";

/// The next call of a [`CALLS_PREFIX`] script, from the messages of the request: the user's
/// script and how many tool results follow it.
fn scripted_call(msgs: &[Value]) -> Option<(String, String)> {
    let i = msgs.iter().rposition(|m| m["role"] == "user")?;
    let text = strip_stamp(msgs[i]["content"].as_str()?);
    let script: Vec<(String, Value)> =
        serde_json::from_str(text.strip_prefix(CALLS_PREFIX)?).ok()?;
    let done = msgs[i..].iter().filter(|m| m["role"] == "tool").count();
    script
        .get(done)
        .map(|(name, args)| (name.clone(), args.to_string()))
}

#[derive(Default)]
struct Rec {
    /// Tool-call id → when its response was written.
    pending: HashMap<String, Instant>,
    /// Tool-call legs measured.
    legs: Vec<Duration>,
    /// Body sizes of first requests (no assistant message yet), in arrival order, with the
    /// last user message and the size of each part ([`request_parts`]).
    first_bodies: Vec<(String, usize, Parts)>,
    /// Requests that asked for SSE.
    streamed: u64,
    /// Requests answered.
    requests: u64,
    /// Requests that could not be parsed.
    bad: u64,
    /// When on: the body size of every request whose last message is the user's (the first
    /// request of each chat turn; memory flushes excluded), in arrival order.
    turn_bodies: Option<Vec<usize>>,
    /// Requests without tools (compaction summaries).
    summaries: u64,
}

/// Bytes of a request by part: `(part, bytes)`, see [`request_parts`].
pub type Parts = Vec<(&'static str, usize)>;

/// Where the sections the gateway appends to its system prompt begin (the texts of
/// `turn::context::assemble`, `skills::prompt_section` and `tools::discovery::list_section`;
/// the bench does not link the gateway, so they are repeated here).
const SECTION_MARKERS: &[(&str, &str)] = &[
    ("context_files", "\n\n# Context files\n\n"),
    ("skills_section", "\n\nSkills ("),
    ("tool_list", "\n\nMore tools ("),
];

/// The bytes of a request by part: the system prompt's base text, its context files, its
/// skills section and its list of tools loaded on demand; the tool schemas (the `tools` array
/// as sent); and the rest of the body (messages, model, options, JSON framing).
pub fn request_parts(req: &Value) -> Parts {
    let system = req["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "system"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default();
    let mut starts: Vec<(usize, &'static str)> = SECTION_MARKERS
        .iter()
        .filter_map(|(name, marker)| system.find(marker).map(|at| (at, *name)))
        .collect();
    starts.sort_unstable();
    let base = starts.first().map_or(system.len(), |(at, _)| *at);
    let mut parts = vec![("system_prompt", base)];
    for (i, (at, name)) in starts.iter().enumerate() {
        let end = starts.get(i + 1).map_or(system.len(), |(next, _)| *next);
        parts.push((name, end - at));
    }
    for (name, _) in SECTION_MARKERS {
        if !parts.iter().any(|(n, _)| n == name) {
            parts.push((name, 0));
        }
    }
    let tools = serde_json::to_vec(&req["tools"]).map_or(0, |v| v.len());
    parts.push(("tool_schemas", tools));
    let body = serde_json::to_vec(req).map_or(0, |v| v.len());
    parts.push(("other", body.saturating_sub(system.len() + tools)));
    parts
}

/// The running fake. Its tasks end with the runtime.
#[derive(Clone)]
pub struct FakeLlm {
    addr: SocketAddr,
    rec: Arc<Mutex<Rec>>,
    seq: Arc<AtomicU64>,
    /// Microseconds every answer waits before it is written (0: none).
    delay_us: Arc<AtomicU64>,
}

impl FakeLlm {
    /// Bind 127.0.0.1:0 and serve.
    pub async fn start() -> Result<FakeLlm, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("bind fake LLM: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("fake LLM addr: {e}"))?;
        let me = FakeLlm {
            addr,
            rec: Arc::default(),
            seq: Arc::default(),
            delay_us: Arc::default(),
        };
        let srv = me.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let _ = s.set_nodelay(true);
                let srv = srv.clone();
                tokio::spawn(async move { srv.serve(s).await });
            }
        });
        Ok(me)
    }

    /// `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    fn rec(&self) -> std::sync::MutexGuard<'_, Rec> {
        self.rec.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Make every answer wait `d` before it is written (a model that takes time to answer).
    pub fn set_delay(&self, d: Duration) {
        self.delay_us.store(
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Forget the legs measured so far (after a warm-up).
    pub fn reset_legs(&self) {
        let mut r = self.rec();
        r.legs.clear();
    }

    /// The tool-call legs measured so far.
    pub fn legs(&self) -> Vec<Duration> {
        self.rec().legs.clone()
    }

    /// Body size of the first request whose last user message is `text`, and its parts
    /// ([`request_parts`]).
    pub fn first_body_size(&self, text: &str) -> Option<(usize, Parts)> {
        self.rec()
            .first_bodies
            .iter()
            .find(|(t, _, _)| t == text)
            .map(|(_, n, parts)| (*n, parts.clone()))
    }

    /// Start recording the first request of every turn (see `Rec::turn_bodies`), forgetting
    /// earlier ones; and the summary count.
    pub fn record_turns(&self) {
        let mut r = self.rec();
        r.turn_bodies = Some(Vec::new());
        r.summaries = 0;
    }

    /// The recorded first-request sizes and the summary requests since `record_turns`.
    pub fn turn_bodies(&self) -> (Vec<usize>, u64) {
        let r = self.rec();
        (r.turn_bodies.clone().unwrap_or_default(), r.summaries)
    }

    /// (requests, streamed, unparsable).
    pub fn counts(&self) -> (u64, u64, u64) {
        let r = self.rec();
        (r.requests, r.streamed, r.bad)
    }

    async fn serve(self, mut s: TcpStream) {
        let mut reader = Reader::new();
        loop {
            let (head, body) = match reader.read_message(&mut s, false).await {
                Ok(Some(m)) => m,
                Ok(None) | Err(_) => return,
            };
            let received = Instant::now();
            if !head.start.starts_with("POST ") || !head.start.ends_with("/chat/completions") {
                let _ = write_response(
                    &mut s,
                    "404 Not Found",
                    "application/json",
                    br#"{"error":{"message":"not found"}}"#,
                )
                .await;
                continue;
            }
            let Ok(req) = serde_json::from_slice::<Value>(&body) else {
                self.rec().bad += 1;
                let _ = write_response(
                    &mut s,
                    "400 Bad Request",
                    "application/json",
                    br#"{"error":{"message":"body is not JSON"}}"#,
                )
                .await;
                continue;
            };
            let stream = req["stream"].as_bool().unwrap_or(false);
            let msgs = req["messages"].as_array().map_or(&[][..], Vec::as_slice);
            let last = msgs.last();
            let after_tool = last.is_some_and(|m| m["role"] == "tool");
            // A compaction summary: the only request without tools.
            let summary = req["tools"].as_array().is_none_or(Vec::is_empty);
            {
                let mut r = self.rec();
                r.requests += 1;
                if summary {
                    r.summaries += 1;
                }
                let flush = last
                    .and_then(|m| m["content"].as_str())
                    .is_some_and(|c| c.starts_with("[Context maintenance"));
                if !summary && !flush && last.is_some_and(|m| m["role"] == "user") {
                    if let Some(t) = r.turn_bodies.as_mut() {
                        t.push(body.len());
                    }
                }
                if stream {
                    r.streamed += 1;
                }
                if after_tool {
                    let id = last
                        .and_then(|m| m["tool_call_id"].as_str())
                        .unwrap_or_default();
                    if let Some(t) = r.pending.remove(id) {
                        r.legs.push(received.saturating_duration_since(t));
                    }
                } else if !msgs.iter().any(|m| m["role"] == "assistant") {
                    let text =
                        strip_stamp(last.and_then(|m| m["content"].as_str()).unwrap_or_default())
                            .to_string();
                    r.first_bodies.push((text, body.len(), request_parts(&req)));
                }
            }
            let model = req["model"].as_str().unwrap_or("fake").to_string();
            let delay = self.delay_us.load(Ordering::Relaxed);
            if delay > 0 {
                tokio::time::sleep(Duration::from_micros(delay)).await;
            }
            if summary {
                let text = json_text(&model)
                    .replace(FINAL_TEXT, SUMMARY_TEXT)
                    .into_bytes();
                let (ct, bytes) = if stream {
                    ("text/event-stream", sse_text(&model))
                } else {
                    ("application/json", text)
                };
                if write_response(&mut s, "200 OK", ct, &bytes).await.is_err() {
                    return;
                }
            } else if let Some((tool, args)) = scripted_call(msgs) {
                let id = format!("call_{}", self.seq.fetch_add(1, Ordering::Relaxed));
                let (ct, bytes) = if stream {
                    ("text/event-stream", sse_tool(&model, &tool, &id, &args))
                } else {
                    ("application/json", json_tool(&model, &tool, &id, &args))
                };
                if write_response(&mut s, "200 OK", ct, &bytes).await.is_err() {
                    return;
                }
            } else if after_tool {
                let (ct, bytes) = if stream {
                    ("text/event-stream", sse_text(&model))
                } else {
                    ("application/json", json_text(&model).into_bytes())
                };
                if write_response(&mut s, "200 OK", ct, &bytes).await.is_err() {
                    return;
                }
            } else {
                let id = format!("call_{}", self.seq.fetch_add(1, Ordering::Relaxed));
                let user =
                    strip_stamp(last.and_then(|m| m["content"].as_str()).unwrap_or_default());
                let (tool, args) = match user.strip_prefix(EXEC_PREFIX) {
                    Some(command) => ("exec_shell", json!({ "command": command }).to_string()),
                    None => ("read_file", json!({ "path": TOOL_FILE }).to_string()),
                };
                let (ct, bytes) = if stream {
                    ("text/event-stream", sse_tool(&model, tool, &id, &args))
                } else {
                    ("application/json", json_tool(&model, tool, &id, &args))
                };
                if write_response(&mut s, "200 OK", ct, &bytes).await.is_err() {
                    return;
                }
                self.rec().pending.insert(id, Instant::now());
            }
        }
    }
}

const USAGE: &str = r#"{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}"#;

/// The answer to a compaction's summary request.
pub const SUMMARY_TEXT: &str =
    "- The user sends numbered paragraphs; the assistant reads note.txt (it says hello) for each.";

fn json_text(model: &str) -> String {
    json!({
        "id": "chatcmpl-bench", "object": "chat.completion", "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": FINAL_TEXT}}],
        "usage": serde_json::from_str::<Value>(USAGE).unwrap_or(Value::Null),
    })
    .to_string()
}

fn json_tool(model: &str, tool: &str, id: &str, args: &str) -> Vec<u8> {
    json!({
        "id": "chatcmpl-bench", "object": "chat.completion", "model": model,
        "choices": [{"index": 0, "finish_reason": "tool_calls",
                     "message": {"role": "assistant", "content": null, "tool_calls": [
                         {"id": id, "type": "function", "function": {"name": tool, "arguments": args}}
                     ]}}],
        "usage": serde_json::from_str::<Value>(USAGE).unwrap_or(Value::Null),
    })
    .to_string()
    .into_bytes()
}

fn chunk(model: &str, delta: &Value, finish: Option<&str>) -> String {
    let c = json!({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "model": model,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {c}\n\n")
}

fn usage_chunk() -> String {
    format!(
        "data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{USAGE}}}\n\n"
    )
}

fn sse_text(model: &str) -> Vec<u8> {
    let mut out = chunk(model, &json!({"role": "assistant", "content": ""}), None);
    let (a, b) = FINAL_TEXT.split_at(FINAL_TEXT.len() / 2);
    out.push_str(&chunk(model, &json!({ "content": a }), None));
    out.push_str(&chunk(model, &json!({ "content": b }), None));
    out.push_str(&chunk(model, &json!({}), Some("stop")));
    out.push_str(&usage_chunk());
    out.push_str("data: [DONE]\n\n");
    out.into_bytes()
}

fn sse_tool(model: &str, tool: &str, id: &str, args: &str) -> Vec<u8> {
    let mut out = chunk(model, &json!({"role": "assistant", "content": null}), None);
    out.push_str(&chunk(
        model,
        &json!({"tool_calls": [{"index": 0, "id": id, "type": "function",
                                "function": {"name": tool, "arguments": ""}}]}),
        None,
    ));
    let (a, b) = args.split_at(args.len() / 2);
    for piece in [a, b] {
        out.push_str(&chunk(
            model,
            &json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
            None,
        ));
    }
    out.push_str(&chunk(model, &json!({}), Some("tool_calls")));
    out.push_str(&usage_chunk());
    out.push_str("data: [DONE]\n\n");
    out.into_bytes()
}

/// `text` without the time the gateway puts before a user message
/// (`[Fri 2026-11-27 18:03 +01:00] `), if it has one.
fn strip_stamp(text: &str) -> &str {
    let b = text.as_bytes();
    let shape = b"[WWW 0000-00-00 00:00 +00:00] ";
    let fits = b.len() >= shape.len()
        && shape.iter().zip(b).all(|(s, c)| match s {
            b'W' => c.is_ascii_alphabetic(),
            b'0' => c.is_ascii_digit(),
            b'+' => *c == b'+' || *c == b'-',
            other => other == c,
        });
    if fits {
        &text[shape.len()..]
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn sse_frames_are_json() {
        let body = String::from_utf8(sse_tool(
            "m",
            "read_file",
            "call_1",
            r#"{"path":"note.txt"}"#,
        ))
        .unwrap();
        let mut args = String::new();
        for line in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
            if line == "[DONE]" {
                continue;
            }
            let v: Value = serde_json::from_str(line).unwrap();
            if let Some(a) =
                v["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str()
            {
                args.push_str(a);
            }
        }
        assert_eq!(args, r#"{"path":"note.txt"}"#);
        assert!(String::from_utf8(sse_text("m"))
            .unwrap()
            .ends_with("data: [DONE]\n\n"));
    }
}
