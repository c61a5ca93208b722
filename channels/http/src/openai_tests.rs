#![allow(clippy::unwrap_used, clippy::expect_used)]

use axum::http::{header, HeaderValue, StatusCode};
use serde_json::json;

use super::*;

fn agents() -> Vec<String> {
    vec!["main".into(), "work".into()]
}

fn parse(body: serde_json::Value, headers: &header::HeaderMap) -> Result<Completion, ApiError> {
    parse_completion(body.to_string().as_bytes(), headers, &agents(), 1000)
}

#[test]
fn the_last_user_message_is_the_message_and_model_names_the_agent() {
    let h = header::HeaderMap::new();
    let c = parse(
        json!({"model": "agent:work", "user": "alice", "stream": true,
               "stream_options": {"include_usage": true},
               "messages": [
                 {"role": "system", "content": "ignored"},
                 {"role": "user", "content": "first"},
                 {"role": "assistant", "content": "ok"},
                 {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
               ]}),
        &h,
    )
    .unwrap();
    assert_eq!(
        c,
        Completion {
            model: "agent:work".into(),
            agent: "work".into(),
            session: "alice".into(),
            content: "a\nb".into(),
            stream: true,
            include_usage: true,
        }
    );
    let c = parse(
        json!({"model": "weft", "messages": [{"role": "user", "content": "hi"}]}),
        &h,
    )
    .unwrap();
    assert_eq!((c.agent.as_str(), c.stream), ("main", false));
    // A fresh session per request without `user` or `X-Session-Id`.
    let c2 = parse(
        json!({"model": "weft", "messages": [{"role": "user", "content": "hi"}]}),
        &h,
    )
    .unwrap();
    assert_ne!(c.session, c2.session);
    assert!(!c.session.contains(':'));
    let mut h = header::HeaderMap::new();
    h.insert("x-session-id", HeaderValue::from_static("s-1"));
    let c = parse(
        json!({"model": "agent:main", "messages": [{"role": "user", "content": "hi"}]}),
        &h,
    )
    .unwrap();
    assert_eq!((c.agent.as_str(), c.session.as_str()), ("main", "s-1"));
}

#[test]
fn bad_requests_are_openai_shaped_errors_naming_the_param() {
    let h = header::HeaderMap::new();
    let e = parse(
        json!({"model": "agent:nope", "messages": [{"role": "user", "content": "hi"}]}),
        &h,
    )
    .unwrap_err();
    assert_eq!(e.status, StatusCode::NOT_FOUND);
    let b = e.body();
    assert_eq!(b["error"]["type"], "invalid_request_error");
    assert_eq!(b["error"]["param"], "model");
    assert_eq!(b["error"]["code"], "model_not_found");
    assert!(b["error"]["message"]
        .as_str()
        .unwrap()
        .contains("agent:work"));
    for (body, param) in [
        (
            json!({"messages": [{"role": "user", "content": "hi"}]}),
            "model",
        ),
        (json!({"model": "weft", "messages": []}), "messages"),
        (
            json!({"model": "weft", "messages": [{"role": "user", "content": "  "}]}),
            "messages",
        ),
        (
            json!({"model": "weft", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages",
        ),
        (
            json!({"model": "weft", "n": 2, "messages": [{"role": "user", "content": "hi"}]}),
            "n",
        ),
        (
            json!({"model": "weft", "user": "a:b", "messages": [{"role": "user", "content": "hi"}]}),
            "user",
        ),
        (
            json!({"model": "weft", "user": "../x", "messages": [{"role": "user", "content": "hi"}]}),
            "user",
        ),
    ] {
        let e = parse(body.clone(), &h).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(e.body()["error"]["param"], param, "{body}");
    }
    let mut h = header::HeaderMap::new();
    h.insert("x-session-id", HeaderValue::from_static("a/b"));
    let e = parse(
        json!({"model": "weft", "messages": [{"role": "user", "content": "hi"}]}),
        &h,
    )
    .unwrap_err();
    assert!(e.message.contains("X-Session-Id"), "{}", e.message);
    let e = parse(
        json!({"model": "weft", "messages": [{"role": "user", "content": "x".repeat(1001)}]}),
        &header::HeaderMap::new(),
    )
    .unwrap_err();
    assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[test]
fn models_list_weft_and_every_agent() {
    assert_eq!(model_ids(&agents()), ["weft", "agent:main", "agent:work"]);
    assert_eq!(model_ids(&[]), ["weft", "agent:main"]);
}
