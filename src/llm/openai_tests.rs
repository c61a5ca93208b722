#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;

#[test]
fn stream_chunks_assemble_parallel_tool_calls() {
    let mut acc = StreamAcc::default();
    let chunks = [
        json!({"choices":[{"delta":{"content":"Hel"}}]}),
        json!({"choices":[{"delta":{"content":"lo"}}]}),
        json!({"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"read_file","arguments":""}}]}}]}),
        json!({"choices":[{"delta":{"tool_calls":[{"index":1,"id":"call_b","function":{"name":"list_directory","arguments":"{\"pa"}}]}}]}),
        json!({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"path\":\"x\"}"}}]}}]}),
        json!({"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"arguments":"th\":\".\"}"}}]},"finish_reason":"tool_calls"}]}),
        json!({"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5}}),
    ];
    let deltas: Vec<_> = chunks.iter().filter_map(|c| acc.apply(c)).collect();
    assert_eq!(deltas, ["Hel", "lo"]);
    let p = OpenAiCompat::new(OpenAiConfig {
        name: "t".into(),
        base_url: "http://x".into(),
        api_key: None,
        model: "m".into(),
        timeout: Duration::from_secs(1),
        extra_headers: vec![],
    })
    .unwrap();
    let r = acc.finish(&p).unwrap();
    assert_eq!(r.content, "Hello");
    assert_eq!(r.tool_calls.len(), 2);
    assert_eq!(r.tool_calls[0].arguments, r#"{"path":"x"}"#);
    assert_eq!(r.tool_calls[1].name, "list_directory");
    assert_eq!(r.tool_calls[1].arguments, r#"{"path":"."}"#);
    assert_eq!(r.usage.input_tokens, 10);
    assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
}

fn provider() -> OpenAiCompat {
    OpenAiCompat::new(OpenAiConfig {
        name: "t".into(),
        base_url: "http://x".into(),
        api_key: None,
        model: "m".into(),
        timeout: Duration::from_secs(1),
        extra_headers: vec![],
    })
    .unwrap()
}

#[test]
fn serialised_transcript_equals_the_tree_form() {
    let mut a = Message::assistant("");
    a.tool_calls = vec![
        ToolCall {
            id: "c1".into(),
            name: "read_file".into(),
            arguments: "{\"path\":\"ü\"}".into(),
        },
        ToolCall {
            id: "c2".into(),
            name: "list_directory".into(),
            arguments: String::new(),
        },
    ];
    let mut b = Message::assistant("thinking");
    b.tool_calls = a.tool_calls.clone();
    let msgs = vec![
        Message::system("sys"),
        Message::user("a \"quoted\" ünïcode line\n"),
        a,
        Message::tool_result("c1", "read_file", "{\"ok\":1}"),
        b,
        Message::assistant(""),
        Message::assistant("done"),
    ];
    let streamed: Value =
        serde_json::from_slice(&serde_json::to_vec(&WireMessages(&msgs)).unwrap()).unwrap();
    let tree: Vec<Value> = msgs.iter().map(wire_message).collect();
    assert_eq!(streamed, Value::Array(tree));
}

#[test]
fn body_carries_tools_and_options_and_serialises_the_tools_once() {
    let p = provider();
    let tool = |n: &str| ToolSpec {
        name: n.into(),
        description: format!("{n} does things"),
        parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
    };
    let mut req = ChatRequest {
        model: String::new(),
        messages: vec![Message::system("s"), Message::user("hi")],
        tools: vec![tool("a"), tool("b")].into(),
        max_tokens: Some(100),
        temperature: Some(0.5),
    };
    let v: Value = serde_json::from_slice(&p.body(&req, true)).unwrap();
    assert_eq!(v["model"], "m");
    assert_eq!(v["messages"][1], json!({"role": "user", "content": "hi"}));
    assert_eq!(v["tools"][1]["type"], "function");
    assert_eq!(v["tools"][1]["function"]["name"], "b");
    assert_eq!(
        v["tools"][1]["function"]["parameters"],
        req.tools[1].parameters
    );
    assert_eq!(v["max_tokens"], 100);
    assert_eq!(v["temperature"], 0.5);
    assert_eq!(v["stream"], true);
    assert_eq!(v["stream_options"]["include_usage"], true);
    // Unchanged tools: served from the cache, not rendered again, whether the same list or
    // an equal copy.
    let again = p.tools_json.get(&req.tools, |_| panic!("rendered twice"));
    assert!(again.contains("\"b does things\""));
    let copy: std::sync::Arc<[ToolSpec]> = req.tools.to_vec().into();
    p.tools_json.get(&copy, |_| panic!("rendered twice"));
    // Changed tools: rendered again.
    req.tools = vec![tool("a"), tool("b"), tool("c")].into();
    req.model = "other".into();
    req.max_tokens = None;
    req.temperature = None;
    let v: Value = serde_json::from_slice(&p.body(&req, false)).unwrap();
    assert_eq!(v["tools"].as_array().unwrap().len(), 3);
    assert_eq!(v["model"], "other");
    assert!(v.get("stream").is_none() && v.get("max_tokens").is_none());
    // No tools: no `tools` key at all.
    req.tools = Vec::new().into();
    let v: Value = serde_json::from_slice(&p.body(&req, false)).unwrap();
    assert!(v.get("tools").is_none());
}

#[test]
fn wire_format_of_tool_round() {
    let mut a = Message::assistant("");
    a.tool_calls = vec![ToolCall {
        id: "c1".into(),
        name: "read_file".into(),
        arguments: "{}".into(),
    }];
    assert_eq!(
        wire_message(&a),
        json!({"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"read_file","arguments":"{}"}}]})
    );
    assert_eq!(
        wire_message(&Message::tool_result("c1", "read_file", "{\"ok\":1}")),
        json!({"role":"tool","tool_call_id":"c1","content":"{\"ok\":1}"})
    );
}

/// Serve `body` (SSE when `sse`) as every answer of `/v1/chat/completions`; the provider that
/// talks to it.
async fn serve(body: &'static str, sse: bool) -> OpenAiCompat {
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || async move {
            let ct = if sse {
                "text/event-stream"
            } else {
                "application/json"
            };
            ([(axum::http::header::CONTENT_TYPE, ct)], body)
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    OpenAiCompat::new(OpenAiConfig {
        name: "t".into(),
        base_url: format!("http://{addr}/v1"),
        api_key: None,
        model: "m".into(),
        timeout: Duration::from_secs(5),
        extra_headers: vec![],
    })
    .unwrap()
}

fn hi() -> ChatRequest {
    ChatRequest {
        model: String::new(),
        messages: vec![Message::user("hi")],
        tools: Vec::new().into(),
        max_tokens: None,
        temperature: None,
    }
}

#[tokio::test]
async fn a_stream_that_stops_without_a_finish_reason_was_cut_off() {
    let p = serve(
        "data: {\"choices\":[{\"delta\":{\"content\":\"Hal\"}}]}\n\n\
         data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"pa\"}}]}}]}\n\n",
        true,
    )
    .await;
    let (tx, _rx) = mpsc::channel(8);
    let e = p.complete(&hi(), Some(&tx)).await.unwrap_err();
    assert_eq!(e.kind(), "cut", "{e}");
    assert!(e.is_incomplete_answer() && !e.is_retryable());
    // Finished but without [DONE] (some servers): a complete answer.
    let p = serve(
        "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"},\"finish_reason\":\"stop\"}]}\n\n",
        true,
    )
    .await;
    let r = p.complete(&hi(), Some(&tx)).await.unwrap();
    assert_eq!(r.content, "Hi");
}

#[tokio::test]
async fn a_body_cut_short_was_cut_off_and_a_malformed_one_is_invalid() {
    let p = serve(r#"{"choices":[{"message":{"content":"half an ans"#, false).await;
    assert_eq!(p.complete(&hi(), None).await.unwrap_err().kind(), "cut");
    let p = serve(r#"{"choices": nope}"#, false).await;
    assert_eq!(
        p.complete(&hi(), None).await.unwrap_err().kind(),
        "invalid_response"
    );
}

fn with_image(loaded: bool) -> Message {
    let mut m = Message::user("what is this?");
    m.images.push(crate::llm::ImagePart {
        path: "inbox/2026-11-24/1-photo.jpg".into(),
        mime: "image/jpeg".into(),
        data: loaded.then(|| "QUJD".into()),
    });
    m
}

#[test]
fn a_loaded_image_is_an_image_url_part_and_an_unloaded_one_is_plain_text() {
    let sent = |m: &Message| serde_json::to_value(WireMessage(m)).unwrap();
    let v = sent(&with_image(true));
    assert_eq!(v, wire_message(&with_image(true)));
    assert_eq!(
        v["content"][0],
        json!({"type": "text", "text": "what is this?"})
    );
    assert_eq!(
        v["content"][1],
        json!({"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,QUJD"}})
    );
    // Stored messages carry the path only; without the bytes the wire form is text.
    assert_eq!(sent(&with_image(false))["content"], "what is this?");
    let stored = serde_json::to_value(with_image(true)).unwrap();
    assert!(!stored.to_string().contains("QUJD"), "{stored}");
    assert_eq!(stored["images"][0]["path"], "inbox/2026-11-24/1-photo.jpg");
}
