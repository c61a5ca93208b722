//! In-process gateway: HTTP API in, fake LLM behind, real sled store in a temp dir.

use std::time::Duration;

use serde_json::json;

use crate::common::{config, messages, tool_results, wait_until, TestGateway};
use crate::fake_llm::{check_tool_pairing, FakeLlm, Reply};

const T: Duration = Duration::from_secs(20);

fn calls(v: &[(&str, &str, &str)]) -> Reply {
    Reply::ToolCalls(
        v.iter()
            .map(|(id, name, args)| (id.to_string(), name.to_string(), args.to_string()))
            .collect(),
    )
}

fn assert_pairing(llm: &FakeLlm) {
    for (i, r) in llm.requests().iter().enumerate() {
        check_tool_pairing(r).unwrap_or_else(|e| panic!("request {i}: {e}\n{r:#}"));
    }
}

#[tokio::test]
async fn chat_with_two_tool_rounds_links_results_by_call_id() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws/notes")).unwrap();
    std::fs::write(dir.path().join("ws/notes/todo.txt"), "buy milk\n").unwrap();
    let llm = FakeLlm::start().await;
    llm.push(calls(&[(
        "call_1",
        "list_directory",
        r#"{"path":"notes"}"#,
    )]));
    llm.push(calls(&[(
        "call_2",
        "read_file",
        r#"{"path":"notes/todo.txt"}"#,
    )]));
    llm.push(Reply::Text("You need to buy milk.".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;

    let (status, body) = gw.api.chat("c1", "what is on my todo list?").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["reply"], "You need to buy milk.");

    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3);
    // The model saw the tools, sorted by name.
    let names: Vec<_> = reqs[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_string())
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    assert!(
        names.contains(&"list_directory".to_string()) && names.contains(&"read_file".to_string())
    );
    let r1 = tool_results(&reqs[1]);
    assert_eq!(r1.len(), 1);
    assert_eq!(r1[0].0, "call_1");
    assert_eq!(r1[0].1["entries"][0]["name"], "todo.txt");
    let r2 = tool_results(&reqs[2]);
    assert_eq!(r2[1].0, "call_2");
    assert_eq!(r2[1].1["content"], "buy milk\n");
    // The API key never reaches the model's view, and the system prompt comes first.
    assert_eq!(messages(&reqs[0])[0]["role"], "system");
    assert_pairing(&llm);

    // The session is stored and listed.
    let (_, sessions) = gw.api.get("/v1/sessions").await;
    assert_eq!(sessions["sessions"][0]["key"], "http:c1");
    assert_eq!(sessions["sessions"][0]["messages"], 6);
    gw.stop().await;
}

#[tokio::test]
async fn invalid_arguments_and_unknown_tools_go_back_to_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(calls(&[
        ("c_bad", "read_file", "{not json"),
        ("c_unknown", "launch_rockets", "{}"),
        ("c_schema", "read_file", r#"{"file":"x"}"#),
        ("c_escape", "read_file", r#"{"path":"../../etc/passwd"}"#),
    ]));
    llm.push(Reply::Text("sorry".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let (status, body) = gw.api.chat("c1", "go").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["reply"], "sorry");
    let results = tool_results(&llm.requests()[1]);
    let codes: Vec<_> = results
        .iter()
        .map(|(id, v)| (id.as_str(), v["error_code"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(
        codes,
        [
            ("c_bad", "INVALID_ARGS"),
            ("c_unknown", "NOT_FOUND"),
            ("c_schema", "INVALID_ARGS"),
            ("c_escape", "INVALID_PATH"),
        ]
    );
    assert_pairing(&llm);
    gw.stop().await;
}

#[tokio::test]
async fn iteration_limit_stops_the_loop_with_a_clear_reply() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    for i in 0..5 {
        llm.push(calls(&[(
            &format!("c{i}"),
            "list_directory",
            r#"{"path":"."}"#,
        )]));
    }
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"agents": {"defaults": {"max_tool_iterations": 2}}}),
    ))
    .await;
    let (status, body) = gw.api.chat("c1", "loop forever").await;
    assert_eq!(status, 502, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("2 rounds"),
        "{body}"
    );
    assert_eq!(llm.requests().len(), 2);
    assert_pairing(&llm);
    gw.stop().await;
}

#[tokio::test]
async fn rate_limit_then_success_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Status(429, Some(1), "slow down".into()));
    llm.push(Reply::Status(500, None, "oops".into()));
    llm.push(Reply::Text("finally".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let (status, body) = gw.api.chat("c1", "hi").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["reply"], "finally");
    assert_eq!(llm.requests().len(), 3);
    gw.stop().await;
}

#[tokio::test]
async fn auth_error_is_not_retried_and_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Status(401, None, "bad key".into()));
    llm.push(Reply::Text("should not be used".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let (status, body) = gw.api.chat("c1", "hi").await;
    assert_eq!(status, 502, "{body}");
    let err = body["error"].as_str().unwrap();
    assert!(err.contains("authentication failed"), "{err}");
    assert!(!err.contains("sk-test-secret"), "{err}");
    assert_eq!(llm.requests().len(), 1);
    gw.stop().await;
}

#[tokio::test]
async fn stop_cancels_a_slow_llm_call_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Hang);
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let api = gw.api.clone();
    let slow = tokio::spawn(async move { api.chat("c1", "think hard").await });
    assert!(wait_until(T, || llm.requests().len() == 1).await);
    let started = std::time::Instant::now();
    let (status, body) = gw.api.chat("c1", "/stop").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["reply"], "Stopping the running turn.");
    let (status, body) = slow.await.unwrap();
    assert_eq!(status, 502, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("Stopped"),
        "{body}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    // The session still works afterwards, and the stopped message is in its history.
    llm.push(Reply::Text("back".into()));
    let (status, body) = gw.api.chat("c1", "hello again").await;
    assert_eq!((status, body["reply"].as_str()), (200, Some("back")));
    let last = llm.requests().last().cloned().unwrap();
    let contents: Vec<_> = messages(&last)
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(contents, ["think hard", "hello again"]);
    gw.stop().await;
}

#[tokio::test]
async fn messages_arriving_during_a_turn_are_queued_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Delay(
        Duration::from_millis(600),
        Box::new(Reply::Text("first answer".into())),
    ));
    llm.push(Reply::Text("second answer".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let api = gw.api.clone();
    let a = tokio::spawn(async move { api.chat("q", "first").await });
    assert!(wait_until(T, || llm.requests().len() == 1).await);
    let (s2, b2) = gw.api.chat("q", "second").await;
    let (s1, b1) = a.await.unwrap();
    assert_eq!((s1, b1["reply"].as_str()), (200, Some("first answer")));
    assert_eq!((s2, b2["reply"].as_str()), (200, Some("second answer")));
    // The second turn saw the whole first exchange.
    let second = &llm.requests()[1];
    let texts: Vec<_> = messages(second)
        .iter()
        .skip(1)
        .map(|m| m["content"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(texts, ["first", "first answer", "second"]);
    gw.stop().await;
}

#[tokio::test]
async fn other_sessions_keep_running_while_one_is_busy() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Hang);
    llm.push(Reply::Text("fast".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let api = gw.api.clone();
    let _slow = tokio::spawn(async move { api.chat("slow", "x").await });
    assert!(wait_until(T, || llm.requests().len() == 1).await);
    let (s, b) = gw.api.chat("other", "y").await;
    assert_eq!((s, b["reply"].as_str()), (200, Some("fast")));
    gw.stop().await;
}

#[tokio::test]
async fn history_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("nice to meet you, Ada".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let (s, _) = gw.api.chat("me", "my name is Ada").await;
    assert_eq!(s, 200);
    gw.stop().await;

    llm.push(Reply::Text("Ada".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let (s, b) = gw.api.chat("me", "what is my name?").await;
    assert_eq!((s, b["reply"].as_str()), (200, Some("Ada")));
    let texts: Vec<_> = messages(&llm.requests()[1])
        .iter()
        .skip(1)
        .map(|m| m["content"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        texts,
        [
            "my name is Ada",
            "nice to meet you, Ada",
            "what is my name?"
        ]
    );
    gw.stop().await;
}

#[tokio::test]
async fn streaming_endpoint_sends_deltas_then_done() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(calls(&[("c1", "list_directory", r#"{"path":"."}"#)]));
    llm.push(Reply::Text("streamed answer text".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let resp = gw
        .api
        .http
        .post(format!("{}/v1/chat/stream", gw.api.base))
        .json(&json!({"chat_id": "s", "content": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let mut deltas = String::new();
    let mut saw_progress = false;
    let mut done = None;
    for block in text.split("\n\n") {
        let event = block
            .lines()
            .find_map(|l| l.strip_prefix("event:"))
            .map(str::trim);
        let data = block
            .lines()
            .find_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .unwrap_or("null");
        let v: serde_json::Value = serde_json::from_str(data).unwrap_or_default();
        match event {
            Some("delta") => deltas.push_str(v["text"].as_str().unwrap()),
            Some("progress") => saw_progress = true,
            Some("done") => done = Some(v["reply"].as_str().unwrap().to_string()),
            _ => {}
        }
    }
    assert_eq!(deltas, "streamed answer text");
    assert!(saw_progress, "{text}");
    assert_eq!(done.as_deref(), Some("streamed answer text"));
    // The provider was asked to stream.
    assert_eq!(llm.requests()[1]["stream"], true);
    gw.stop().await;
}

#[tokio::test]
async fn secrets_are_scrubbed_from_tool_output_before_the_model_and_store() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    std::fs::write(
        dir.path().join("ws/leak.txt"),
        "key=sk-test-secret-123456\n",
    )
    .unwrap();
    let llm = FakeLlm::start().await;
    llm.push(calls(&[("c1", "read_file", r#"{"path":"leak.txt"}"#)]));
    llm.push(Reply::Text("ok".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let (s, _) = gw.api.chat("c", "read it").await;
    assert_eq!(s, 200);
    let sent = serde_json::to_string(&llm.requests()[1]).unwrap();
    assert!(!sent.contains("sk-test-secret-123456"));
    assert!(sent.contains("[REDACTED]"));
    let (_, stored) = gw.api.get("/v1/sessions/http:c").await;
    assert!(!stored.to_string().contains("sk-test-secret-123456"));
    gw.stop().await;
}
