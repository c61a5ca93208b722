//! The OpenAI-compatible routes: `POST /v1/chat/completions` (plain and `stream: true`) and
//! `GET /v1/models`, so OpenAI clients talk to a weft agent (docs/openai-api.md).
//!
//! A completion request becomes ONE inbound event of this channel, like `POST /v1/chat`: chat
//! `SESSION@AGENT`, sender [`OPENAI_SENDER`] (which `/v1/chat` refuses), so the daemon files it
//! under the session `http:SESSION` served by `AGENT`. Only the last user message of the
//! request is sent: the conversation's history is the session's, kept by weft. The agent's tools
//! run in the daemon; the client sees the final answer (and, streamed, the text as it comes).
//! This module never decides anything about sessions or agents beyond the names it was given.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use clawft_channel_core::{ErrorReason, OutboundBody, OutboundKind, OutboundMessage};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use crate::{async_stream, body_limit, submit, ChatReq, Inner, Waiter, SSE_KEEPALIVE};

/// The sender of the events of `POST /v1/chat/completions`. The daemon reads the agent from
/// their chat (`SESSION@AGENT`); a `/v1/chat` request naming this sender is refused (400), so
/// only this route selects an agent that way.
pub const OPENAI_SENDER: &str = "weft-openai";

/// The model id of the default agent (`main`); `agent:<name>` names any agent.
pub const DEFAULT_MODEL: &str = "weft";

/// The default agent's name.
const MAIN_AGENT: &str = "main";

/// Longest session id (`user` or `X-Session-Id`), in bytes.
const MAX_SESSION_BYTES: usize = 128;

/// An OpenAI-shaped error: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    param: Option<&'static str>,
    code: Option<&'static str>,
}

impl ApiError {
    fn invalid(param: Option<&'static str>, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
        }
    }

    fn server(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: Some(code),
        }
    }

    /// A refused credential, as OpenAI answers it (401 `invalid_api_key`), with `message`.
    pub(crate) fn unauthorized(message: &str) -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// A spending limit reached, as OpenAI answers it (429 `insufficient_quota`).
    fn over_budget(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: message.into(),
            kind: "insufficient_quota",
            param: None,
            code: Some("insufficient_quota"),
        }
    }

    fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        if self.status.is_server_error() {
            // The message is journaled and its turn ran (or still runs): a retry by the
            // client's SDK would send it a second time. The OpenAI SDKs honour this header.
            r.headers_mut()
                .insert("x-should-retry", HeaderValue::from_static("false"));
        }
        r
    }
}

/// A parsed completion request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Completion {
    /// `model` as the client wrote it (echoed in the answer).
    pub model: String,
    /// The agent it names.
    pub agent: String,
    /// The session id (`user`, `X-Session-Id`, or a fresh one).
    pub session: String,
    /// The text of the last user message.
    pub content: String,
    /// `stream: true`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
}

/// The agent `model` names: `weft` is `main`, `agent:<name>` one of `agents`.
fn agent_of(model: &str, agents: &[String]) -> Option<String> {
    let name = if model == DEFAULT_MODEL {
        MAIN_AGENT
    } else {
        model.strip_prefix("agent:")?
    };
    (name == MAIN_AGENT || agents.iter().any(|a| a == name)).then(|| name.to_string())
}

/// The ids of `GET /v1/models`: `weft`, then `agent:<name>` for every agent.
pub(crate) fn model_ids(agents: &[String]) -> Vec<String> {
    let mut ids = vec![DEFAULT_MODEL.to_string(), format!("agent:{MAIN_AGENT}")];
    for a in agents.iter().filter(|a| a.as_str() != MAIN_AGENT) {
        ids.push(format!("agent:{a}"));
    }
    ids
}

/// The text of one message's `content`: a string, or the `text` parts of an array.
fn text_of(content: &Value) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut texts = Vec::new();
            for p in parts {
                match p.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        if let Some(t) = p.get("text").and_then(Value::as_str) {
                            texts.push(t);
                        }
                    }
                    Some(other) => {
                        return Err(ApiError::invalid(
                            Some("messages"),
                            format!("content parts of type `{other}` are not supported: send text parts only"),
                        ))
                    }
                    None => {
                        return Err(ApiError::invalid(
                            Some("messages"),
                            "every content part needs a `type` (`text`)",
                        ))
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        Value::Null => Ok(String::new()),
        _ => Err(ApiError::invalid(
            Some("messages"),
            "a message's `content` must be a string or an array of text parts",
        )),
    }
}

/// A session id: what a chat id may hold (no `:`, `/`, `\`, `..`, whitespace or control
/// characters), at most [`MAX_SESSION_BYTES`].
fn check_session(id: &str, from: &'static str) -> Result<(), ApiError> {
    let bad = id.is_empty()
        || id.len() > MAX_SESSION_BYTES
        || id.contains("..")
        || id
            .chars()
            .any(|c| matches!(c, ':' | '/' | '\\') || c.is_whitespace() || c.is_control());
    if bad {
        return Err(ApiError::invalid(
            (from == "user").then_some("user"),
            format!("`{from}` names the session: 1 to {MAX_SESSION_BYTES} bytes without `:`, `/`, `\\`, `..`, spaces or control characters (e.g. `alice` or a uuid)"),
        ));
    }
    Ok(())
}

/// Parse a request of `POST /v1/chat/completions`.
pub(crate) fn parse_completion(
    body: &[u8],
    headers: &header::HeaderMap,
    agents: &[String],
    max_inbound_bytes: usize,
) -> Result<Completion, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(
            None,
            format!("the body must be a JSON chat completion request: {e}"),
        )
    })?;
    let model = v
        .get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(
                Some("model"),
                "`model` is required: `weft` (the default agent) or `agent:<name>` (GET /v1/models lists them)",
            )
        })?
        .to_string();
    let agent = agent_of(&model, agents).ok_or_else(|| ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!(
            "The model `{model}` does not exist: use one of {} (GET /v1/models)",
            model_ids(agents).join(", ")
        ),
        kind: "invalid_request_error",
        param: Some("model"),
        code: Some("model_not_found"),
    })?;
    if let Some(n) = v.get("n").filter(|n| !n.is_null()) {
        if n.as_u64() != Some(1) {
            return Err(ApiError::invalid(Some("n"), "only `n: 1` is supported"));
        }
    }
    let messages = v
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::invalid(Some("messages"), "`messages` must be an array"))?;
    let last_user = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .ok_or_else(|| {
            ApiError::invalid(
                Some("messages"),
                "`messages` holds no `user` message: the last one is what the agent answers",
            )
        })?;
    let content = text_of(last_user.get("content").unwrap_or(&Value::Null))?;
    if content.trim().is_empty() {
        return Err(ApiError::invalid(
            Some("messages"),
            "the last `user` message is empty",
        ));
    }
    if content.len() > max_inbound_bytes {
        return Err(ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: clawft_channel_core::oversized_notice(content.len(), max_inbound_bytes),
            kind: "invalid_request_error",
            param: Some("messages"),
            code: Some("message_too_large"),
        });
    }
    let user = v
        .get("user")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty());
    let session = match user {
        Some(u) => {
            check_session(u, "user")?;
            u.to_string()
        }
        None => match headers.get("x-session-id") {
            Some(h) => {
                let s = h.to_str().unwrap_or_default().trim();
                check_session(s, "X-Session-Id")?;
                s.to_string()
            }
            None => fresh_session(),
        },
    };
    let stream = v.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let include_usage = v
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(Completion {
        model,
        agent,
        session,
        content,
        stream,
        include_usage,
    })
}

/// A session id for a request that names none: random, used once.
fn fresh_session() -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    // Two independently seeded SipHash states: 128 random bits without another dependency.
    let mut out = String::from("oai-");
    for _ in 0..2 {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(clawft_channel_core::now_ms());
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

/// `usage` of the reply (set by the daemon from the turn's accounting; zeros when unknown).
fn usage_of(m: &OutboundMessage) -> Value {
    let u = m.usage().unwrap_or_default();
    let (p, c) = (u.prompt_tokens, u.completion_tokens);
    json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c})
}

fn unix_secs() -> u64 {
    clawft_channel_core::now_ms() / 1000
}

/// `GET /v1/models`.
pub(crate) async fn models(State(inner): State<Arc<Inner>>) -> Response {
    let created = unix_secs();
    let data: Vec<Value> = model_ids(&inner.cfg.agents)
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "created": created, "owned_by": "weft"}))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

/// `POST /v1/chat/completions`.
pub(crate) async fn completions(
    State(inner): State<Arc<Inner>>,
    headers: header::HeaderMap,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return ApiError {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                message: format!(
                    "The request body is over {} bytes: send a shorter conversation (only the last user message is used)",
                    body_limit(inner.cfg.max_inbound_bytes)
                ),
                kind: "invalid_request_error",
                param: None,
                code: None,
            }
            .into_response()
        }
        Err(e) => return ApiError::invalid(None, e.body_text()).into_response(),
    };
    let req = match parse_completion(
        &body,
        &headers,
        &inner.cfg.agents,
        inner.cfg.max_inbound_bytes,
    ) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let chat = ChatReq {
        chat_id: format!("{}@{}", req.session, req.agent),
        content: req.content.clone(),
        event_id: None,
        sender: Some(OPENAI_SENDER.to_string()),
        terminal: false,
    };
    if req.stream {
        stream_completion(inner, req, chat).await
    } else {
        once_completion(inner, req, chat).await
    }
}

/// A refusal of [`submit`] (its `{"error": "..."}` body) as an OpenAI error.
fn refused(status: StatusCode, v: &Value) -> Response {
    let message = v["error"].as_str().unwrap_or("refused").to_string();
    ApiError {
        status,
        message,
        kind: if status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        },
        param: None,
        code: None,
    }
    .into_response()
}

fn completion_id(event_id: &str) -> String {
    format!("chatcmpl-{event_id}")
}

async fn once_completion(inner: Arc<Inner>, req: Completion, chat: ChatReq) -> Response {
    let (tx, rx) = oneshot::channel();
    let (event_id, _guard) = match submit(&inner, chat, Waiter::Once(tx)).await {
        // Always a new event id here: never a resent request.
        Ok(s) => (s.event_id, s.guard),
        Err((status, v)) => return refused(status, &v),
    };
    let shutdown = inner.shutdown.clone();
    let timeout = inner.cfg.reply_timeout;
    let m = tokio::select! {
        biased;
        r = tokio::time::timeout(timeout, rx) => match r {
            Ok(Ok(m)) => m,
            Ok(Err(_)) => return ApiError::server(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", "the gateway is shutting down").into_response(),
            Err(_) => return ApiError::server(
                StatusCode::GATEWAY_TIMEOUT,
                "reply_timeout",
                format!("no reply within {}s; the message is stored in session `{}` and will still be answered there", timeout.as_secs(), req.session),
            ).into_response(),
        },
        () = shutdown.cancelled() => return ApiError::server(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", "the gateway is shutting down").into_response(),
    };
    if let OutboundBody::Error {
        text,
        reason: ErrorReason::OverBudget,
    } = &m.body
    {
        return ApiError::over_budget(text.clone()).into_response();
    }
    if m.kind() != OutboundKind::Final {
        return ApiError::server(StatusCode::BAD_GATEWAY, "turn_failed", m.text()).into_response();
    }
    Json(json!({
        "id": completion_id(event_id.as_str()),
        "object": "chat.completion",
        "created": unix_secs(),
        "model": req.model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": m.text()},
            "logprobs": null,
            "finish_reason": "stop",
        }],
        "usage": usage_of(&m),
    }))
    .into_response()
}

/// One `chat.completion.chunk`.
fn chunk(id: &str, created: u64, model: &str, delta: Value, finish: Option<&str>) -> Event {
    Event::default().data(
        json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        })
        .to_string(),
    )
}

async fn stream_completion(inner: Arc<Inner>, req: Completion, chat: ChatReq) -> Response {
    let (tx, mut rx) = mpsc::channel::<OutboundMessage>(256);
    // No chat: OpenAI's stream format has no place for approval questions (they wait in the
    // chat's mailbox).
    let waiter = Waiter::Stream {
        tx,
        chat: String::new(),
        terminal: false,
    };
    let (event_id, guard) = match submit(&inner, chat, waiter).await {
        Ok(s) => (s.event_id, s.guard),
        Err((status, v)) => return refused(status, &v),
    };
    let shutdown = inner.shutdown.clone();
    let id = completion_id(event_id.as_str());
    let created = unix_secs();
    let model = req.model;
    let include_usage = req.include_usage;
    let stream = async_stream(move |out| async move {
        let _guard = guard;
        let send = |e: Event| {
            let out = out.clone();
            async move { out.send(e).await.is_ok() }
        };
        if !send(chunk(
            &id,
            created,
            &model,
            json!({"role": "assistant", "content": ""}),
            None,
        ))
        .await
        {
            return;
        }
        // The text streamed since the last tool call or restart: the final answer's start,
        // when the model streamed it (the rest of the answer is sent at the end).
        let mut round = String::new();
        let last = loop {
            tokio::select! {
                biased;
                m = rx.recv() => {
                    let Some(m) = m else { break None };
                    match m.kind() {
                        OutboundKind::Delta if m.is_restart() => round.clear(),
                        OutboundKind::Delta => {
                            round.push_str(m.text());
                            if !send(chunk(&id, created, &model, json!({"content": m.text()}), None)).await {
                                return;
                            }
                        }
                        OutboundKind::Progress => round.clear(),
                        OutboundKind::Final | OutboundKind::Error => break Some(m),
                    }
                }
                () = shutdown.cancelled() => break None,
            }
        };
        match last {
            Some(m) if m.kind() == OutboundKind::Final => {
                let rest = m.text().strip_prefix(round.as_str()).unwrap_or_default();
                let rest = if round.is_empty() { m.text() } else { rest };
                if !rest.is_empty()
                    && !send(chunk(&id, created, &model, json!({"content": rest}), None)).await
                {
                    return;
                }
                if !send(chunk(&id, created, &model, json!({}), Some("stop"))).await {
                    return;
                }
                if include_usage {
                    let e = Event::default().data(
                        json!({
                            "id": id,
                            "object": "chat.completion.chunk",
                            "created": created,
                            "model": model,
                            "choices": [],
                            "usage": usage_of(&m),
                        })
                        .to_string(),
                    );
                    if !send(e).await {
                        return;
                    }
                }
            }
            other => {
                // The SDKs raise an `APIError` on a data line holding `error`.
                let (code, message) = match other {
                    Some(m) => ("turn_failed", m.text().to_string()),
                    None => ("shutting_down", "the gateway is shutting down".to_string()),
                };
                let e = ApiError::server(StatusCode::BAD_GATEWAY, code, message);
                if !send(Event::default().data(e.body().to_string())).await {
                    return;
                }
            }
        }
        let _ = send(Event::default().data("[DONE]")).await;
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(SSE_KEEPALIVE))
        .into_response()
}

#[cfg(test)]
#[path = "openai_tests.rs"]
mod tests;
