#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;

fn cfg() -> AnthropicConfig {
    AnthropicConfig {
        name: "anthropic".into(),
        base_url: "https://api.anthropic.com".into(),
        api_key: None,
        model: "claude".into(),
        timeout: Duration::from_secs(5),
        max_tokens: 1024,
    }
}

#[test]
fn sent_body_equals_the_built_body_and_tools_are_serialised_once() {
    let p = Anthropic::new(cfg()).unwrap();
    let tool = |n: &str| crate::llm::ToolSpec {
        name: n.into(),
        description: format!("{n} does things"),
        parameters: json!({"type": "object", "properties": {"tools": {"type": "null"}}}),
    };
    let mut req = ChatRequest {
        model: String::new(),
        messages: vec![Message::system("sys"), Message::user("\"tools\":null")],
        tools: vec![tool("a"), tool("b")].into(),
        max_tokens: None,
        temperature: Some(0.25),
    };
    for stream in [false, true] {
        let sent: Value = serde_json::from_slice(&p.body(&req, stream)).unwrap();
        assert_eq!(sent, build_body(&cfg(), &req, stream));
    }
    let _ = p.tools_json.get(&req.tools, |_| panic!("rendered twice"));
    req.tools = Vec::new().into();
    let sent: Value = serde_json::from_slice(&p.body(&req, false)).unwrap();
    assert_eq!(sent, build_body(&cfg(), &req, false));
    assert!(sent.get("tools").is_none());
}

#[test]
fn body_alternates_roles_and_groups_tool_results() {
    let mut a = Message::assistant("let me look");
    a.tool_calls = vec![
        ToolCall {
            id: "t1".into(),
            name: "read_file".into(),
            arguments: r#"{"path":"a"}"#.into(),
        },
        ToolCall {
            id: "t2".into(),
            name: "list_directory".into(),
            arguments: "{bad".into(),
        },
    ];
    let req = ChatRequest {
        model: String::new(),
        messages: vec![
            Message::system("sys"),
            Message::user("hi"),
            a,
            Message::tool_result("t1", "read_file", "A"),
            Message::tool_result("t2", "list_directory", "B"),
            Message::user("and?"),
        ],
        tools: Vec::new().into(),
        max_tokens: None,
        temperature: None,
    };
    let b = build_body(&cfg(), &req, false);
    assert_eq!(b["system"][0]["text"], "sys");
    assert_eq!(b["max_tokens"], 1024);
    let msgs = b["messages"].as_array().unwrap();
    let roles: Vec<_> = msgs.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "user"]);
    assert_eq!(msgs[1]["content"][1]["input"], json!({"path": "a"}));
    assert_eq!(msgs[1]["content"][2]["input"], json!({}));
    let last = msgs[2]["content"].as_array().unwrap();
    assert_eq!(last[0]["type"], "tool_result");
    assert_eq!(last[0]["tool_use_id"], "t1");
    assert_eq!(last[1]["tool_use_id"], "t2");
    assert_eq!(last[2], json!({"type": "text", "text": "and?"}));
}

#[test]
fn stream_events_assemble_text_and_tool_use() {
    let events = [
        json!({"type":"message_start","message":{"usage":{"input_tokens":12}}}),
        json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
        json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi "}}),
        json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"there"}}),
        json!({"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"read_file","input":{}}}),
        json!({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"pa"}}),
        json!({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"th\":\"x\"}"}}),
        json!({"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":9}}),
    ];
    let mut acc = Acc::default();
    let deltas: Vec<_> = events.iter().filter_map(|e| acc.apply(e)).collect();
    assert_eq!(deltas, ["Hi ", "there"]);
    let r = acc.finish();
    assert_eq!(r.content, "Hi there");
    assert_eq!(r.tool_calls[0].id, "toolu_1");
    assert_eq!(r.tool_calls[0].arguments, r#"{"path":"x"}"#);
    assert_eq!(
        r.usage,
        Usage {
            input_tokens: 12,
            output_tokens: 9,
            ..Usage::default()
        }
    );
    assert_eq!(r.finish_reason.as_deref(), Some("tool_use"));
}

#[test]
fn non_streaming_response_parses() {
    let v = json!({"content":[{"type":"text","text":"ok"},{"type":"tool_use","id":"t","name":"n","input":{"a":1}}],"stop_reason":"tool_use","usage":{"input_tokens":1,"output_tokens":2}});
    let r = parse_message(&v).unwrap();
    assert_eq!(r.content, "ok");
    assert_eq!(r.tool_calls[0].arguments, r#"{"a":1}"#);
}

#[test]
fn base_url_with_or_without_v1() {
    let a = Anthropic::new(cfg()).unwrap();
    assert_eq!(a.url, "https://api.anthropic.com/v1/messages");
    let mut c = cfg();
    c.base_url = "http://127.0.0.1:9/v1/".into();
    assert_eq!(
        Anthropic::new(c).unwrap().url,
        "http://127.0.0.1:9/v1/messages"
    );
}

/// The provider over real HTTP: SSE frames split mid-line, CRLF line ends, an `event:` line
/// per event, a ping, and deltas sent as they arrive.
#[tokio::test]
async fn streams_over_http_with_frames_split_anywhere() {
    let sse = "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3}}}\r\n\r\n\
        event: ping\r\ndata: {\"type\": \"ping\"}\r\n\r\n\
        event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\r\n\r\n\
        event: message_delta\r\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":1}}\r\n\r\n\
        event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n";
    let frames: Vec<bytes::Bytes> = sse
        .as_bytes()
        .chunks(7)
        .map(bytes::Bytes::copy_from_slice)
        .collect();
    let app = axum::Router::new().route(
        "/v1/messages",
        axum::routing::post(move || {
            let frames = frames.clone();
            async move {
                axum::body::Body::from_stream(futures::stream::iter(
                    frames.into_iter().map(Ok::<_, std::convert::Infallible>),
                ))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let mut c = cfg();
    c.base_url = format!("http://{addr}");
    let p = Anthropic::new(c).unwrap();
    let req = ChatRequest {
        model: String::new(),
        messages: vec![Message::user("hi")],
        tools: Vec::new().into(),
        max_tokens: None,
        temperature: None,
    };
    let (tx, mut rx) = mpsc::channel(8);
    let r = p.complete(&req, Some(&tx)).await.unwrap();
    assert_eq!(r.content, "Hi");
    assert_eq!(r.finish_reason.as_deref(), Some("end_turn"));
    assert_eq!(
        r.usage,
        Usage {
            input_tokens: 3,
            output_tokens: 1,
            ..Usage::default()
        }
    );
    assert_eq!(rx.try_recv().unwrap(), StreamEvent::TextDelta("Hi".into()));
}

#[test]
fn the_stable_prefix_carries_cache_breakpoints() {
    let tool = |n: &str| crate::llm::ToolSpec {
        name: n.into(),
        description: format!("{n} does things"),
        parameters: json!({"type": "object"}),
    };
    let req = |user: &str| ChatRequest {
        model: String::new(),
        messages: vec![Message::system("sys"), Message::user(user)],
        tools: vec![tool("a"), tool("b")].into(),
        max_tokens: None,
        temperature: None,
    };
    let p = Anthropic::new(cfg()).unwrap();
    let b: Value = serde_json::from_slice(&p.body(&req("one"), false)).unwrap();
    let ephemeral = json!({"type": "ephemeral"});
    assert_eq!(
        b["system"],
        json!([{"type": "text", "text": "sys", "cache_control": ephemeral}])
    );
    assert_eq!(b["tools"][1]["cache_control"], ephemeral);
    assert!(b["tools"][0].get("cache_control").is_none());
    assert!(b["messages"][0].to_string().find("cache_control").is_none());
    // Two turns share the tools and system bytes exactly.
    let b2: Value = serde_json::from_slice(&p.body(&req("two"), false)).unwrap();
    assert_eq!(b["tools"].to_string(), b2["tools"].to_string());
    assert_eq!(b["system"].to_string(), b2["system"].to_string());
}

#[tokio::test]
async fn a_stream_that_stops_before_message_stop_was_cut_off() {
    let sse = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3}}}\n\n\
        event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hal\"}}\n\n";
    let app = axum::Router::new().route(
        "/v1/messages",
        axum::routing::post(move || async move { sse }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let mut c = cfg();
    c.base_url = format!("http://{addr}");
    let p = Anthropic::new(c).unwrap();
    let req = ChatRequest {
        model: String::new(),
        messages: vec![Message::user("hi")],
        tools: Vec::new().into(),
        max_tokens: None,
        temperature: None,
    };
    let (tx, _rx) = mpsc::channel(8);
    let e = p.complete(&req, Some(&tx)).await.unwrap_err();
    assert_eq!(e.kind(), "cut", "{e}");
}

#[test]
fn a_loaded_image_is_a_base64_image_block_before_the_text() {
    let mut m = Message::user("what is this?");
    m.images.push(crate::llm::ImagePart {
        path: "inbox/x.png".into(),
        mime: "image/png".into(),
        data: Some("QUJD".into()),
    });
    let req = ChatRequest {
        model: String::new(),
        messages: vec![Message::system("sys"), m],
        tools: Vec::new().into(),
        max_tokens: None,
        temperature: None,
    };
    let b = build_body(&cfg(), &req, false);
    let blocks = b["messages"][0]["content"].as_array().unwrap();
    assert_eq!(
        blocks[0],
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"}})
    );
    assert_eq!(blocks[1], json!({"type": "text", "text": "what is this?"}));
}
