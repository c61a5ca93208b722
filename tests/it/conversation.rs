//! Ways a conversation used to die for good (issue 15, items 3, 4, 5, 7), each against a strict
//! fake provider that rejects what real providers reject: a history it refuses, an answer that
//! is empty or cut off, a provider error that is retried when it should not be or told badly,
//! a model that calls the same tool forever.

use std::path::Path;

use clawft::llm::{Message, ToolCall};
use clawft::store::Store;
use clawft::types::SessionKey;
use serde_json::{json, Value};

use crate::common::{config, config_value, messages, tool_results, TestGateway};
use crate::fake_llm::{check_tool_pairing, strict_rejection, FakeLlm, Reply};
use crate::process::{free_port, weft, write_config};

/// The provider key of the test configs.
const KEY: &str = "sk-test-secret-123456";

fn calls(v: &[(&str, &str, &str)]) -> Reply {
    Reply::ToolCalls(
        v.iter()
            .map(|(id, name, args)| (id.to_string(), name.to_string(), args.to_string()))
            .collect(),
    )
}

/// Every request the fake received is one a strict provider accepts.
fn assert_all_accepted(llm: &FakeLlm) {
    for (i, r) in llm.requests().iter().enumerate() {
        assert_eq!(strict_rejection(r, None), None, "request {i}:\n{r:#}");
        check_tool_pairing(r).unwrap();
    }
}

async fn strict_gateway(dir: &Path, extra: Value) -> (FakeLlm, TestGateway) {
    std::fs::create_dir_all(dir.join("ws")).unwrap();
    std::fs::write(dir.join("ws/a.txt"), "alpha").unwrap();
    std::fs::write(dir.join("ws/b.txt"), "beta").unwrap();
    let llm = FakeLlm::start().await;
    llm.strict(None);
    let gw = TestGateway::start(config(&llm, dir, extra)).await;
    (llm, gw)
}

/// The value of a counter on `/metrics` (summed over the matching label sets).
async fn counter(gw: &TestGateway, name: &str, labels: &[(&str, &str)]) -> f64 {
    let text = gw
        .api
        .http
        .get(format!("{}/metrics", gw.api.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

#[tokio::test]
async fn a_call_with_truncated_arguments_is_refused_with_the_raw_text_and_the_chat_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (llm, gw) = strict_gateway(dir.path(), json!({})).await;
    llm.push(calls(&[("call_1", "read_file", r#"{"path":"a"#)]));
    llm.push(Reply::Text("the call was cut off".into()));
    let (s, body) = gw.api.chat("c", "read a").await;
    assert_eq!(
        (s, body["reply"].as_str()),
        (200, Some("the call was cut off")),
        "{body}"
    );
    let r = tool_results(&llm.requests()[1]);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].1["error_code"], "INVALID_ARGS", "{r:?}");
    let why = r[0].1["error"].as_str().unwrap();
    assert!(why.contains("not valid JSON"), "{why}");
    assert!(
        why.contains(r#"{"path":"a"#),
        "the raw text is quoted: {why}"
    );
    // The call itself is stored (and replayed) with arguments the provider accepts.
    let call = &messages(&llm.requests()[1])[2]["tool_calls"][0];
    assert_eq!(call["function"]["arguments"], "{}");

    // The next message is answered: the stored history is accepted.
    llm.push(Reply::Text("second answer".into()));
    let (s, body) = gw.api.chat("c", "and now?").await;
    assert_eq!(
        (s, body["reply"].as_str()),
        (200, Some("second answer")),
        "{body}"
    );
    assert_all_accepted(&llm);
    gw.stop().await;
}

#[tokio::test]
async fn duplicate_ids_in_one_answer_and_ids_reused_later_all_run_and_replay() {
    let dir = tempfile::tempdir().unwrap();
    let (llm, gw) = strict_gateway(dir.path(), json!({})).await;
    llm.push(calls(&[
        ("call_1", "read_file", r#"{"path":"a.txt"}"#),
        ("call_1", "read_file", r#"{"path":"b.txt"}"#),
    ]));
    llm.push(Reply::Text("read both".into()));
    let (s, body) = gw.api.chat("c", "read a and b").await;
    assert_eq!(
        (s, body["reply"].as_str()),
        (200, Some("read both")),
        "{body}"
    );
    let r = tool_results(&llm.requests()[1]);
    let contents: Vec<_> = r.iter().map(|(_, v)| v["content"].clone()).collect();
    assert_eq!(contents, [json!("alpha"), json!("beta")], "{r:?}");
    assert_ne!(r[0].0, r[1].0, "each result answers its own call");

    // A later turn reuses the id.
    llm.push(calls(&[("call_1", "read_file", r#"{"path":"b.txt"}"#)]));
    llm.push(Reply::Text("read b again".into()));
    let (s, body) = gw.api.chat("c", "read b again").await;
    assert_eq!(
        (s, body["reply"].as_str()),
        (200, Some("read b again")),
        "{body}"
    );
    let last = llm.requests().last().cloned().unwrap();
    assert_eq!(tool_results(&last).len(), 3);
    assert_eq!(tool_results(&last)[2].1["content"], "beta");

    // And the conversation still goes on, after a restart too.
    llm.push(Reply::Text("still here".into()));
    let (s, _) = gw.api.chat("c", "hello").await;
    assert_eq!(s, 200);
    gw.stop().await;
    llm.push(Reply::Text("after the restart".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let (s, body) = gw.api.chat("c", "hello again").await;
    assert_eq!(
        (s, body["reply"].as_str()),
        (200, Some("after the restart")),
        "{body}"
    );
    assert_all_accepted(&llm);
    gw.stop().await;
}

fn assistant_calls(v: &[(&str, &str)]) -> Message {
    let mut m = Message::assistant("");
    m.tool_calls = v
        .iter()
        .map(|(id, args)| ToolCall {
            id: id.to_string(),
            name: "read_file".into(),
            arguments: args.to_string(),
        })
        .collect();
    m
}

#[tokio::test]
async fn a_transcript_stored_with_such_defects_loads_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    // What earlier versions stored as the model sent it: truncated arguments, one id twice in
    // an answer, an id reused by a later turn, an empty id, a result answering nothing, and a
    // last round cut by a crash (a call without a result).
    {
        let store = Store::open(&dir.path().join("store"), 4 * 1024 * 1024).unwrap();
        let key = SessionKey::parse("http:c").unwrap();
        store
            .append_messages(
                &key,
                &[
                    Message::user("first"),
                    assistant_calls(&[("call_1", r#"{"path":"a"#), ("call_1", r#"{"path":"b"}"#)]),
                    Message::tool_result("call_1", "read_file", r#"{"error":"invalid JSON"}"#),
                    Message::tool_result("call_1", "read_file", r#"{"content":"beta"}"#),
                    Message::assistant("done"),
                    Message::user("second"),
                    assistant_calls(&[("call_1", r#"{"path":"c"}"#), ("", "")]),
                    Message::tool_result("call_1", "read_file", r#"{"content":"c"}"#),
                    Message::tool_result("", "read_file", r#"{"entries":[]}"#),
                    Message::tool_result("call_zzz", "read_file", "stray"),
                    Message::assistant("done again"),
                    Message::user("third"),
                    assistant_calls(&[("call_2", r#"{"path":"d"}"#), ("call_2", "{")]),
                ],
            )
            .unwrap();
        store.flush().unwrap();
    }
    let llm = FakeLlm::start().await;
    llm.strict(None);
    llm.push(Reply::Text("replayed".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let (s, body) = gw.api.chat("c", "fourth").await;
    assert_eq!(
        (s, body["reply"].as_str()),
        (200, Some("replayed")),
        "{body}"
    );
    assert_all_accepted(&llm);
    // Every stored exchange reached the model, the crash-cut calls with interrupted results.
    let req = &llm.requests()[0];
    let users: Vec<_> = messages(req)
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(users, ["first", "second", "third", "fourth"]);
    let results = tool_results(req);
    assert_eq!(results.len(), 6, "{results:?}");
    assert!(results[4].1.to_string().contains("interrupted"));
    gw.stop().await;

    // And again after a restart (the repair is the same on every load).
    llm.push(Reply::Text("again".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let (s, body) = gw.api.chat("c", "fifth").await;
    assert_eq!((s, body["reply"].as_str()), (200, Some("again")), "{body}");
    assert_all_accepted(&llm);
    gw.stop().await;
}

#[tokio::test]
async fn an_empty_answer_is_asked_for_once_more_then_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (llm, gw) = strict_gateway(dir.path(), json!({})).await;
    llm.push(Reply::Empty);
    llm.push(Reply::Text("the real answer".into()));
    let (s, body) = gw.api.chat("c", "hi").await;
    assert_eq!(
        (s, body["reply"].as_str()),
        (200, Some("the real answer")),
        "{body}"
    );
    assert_eq!(llm.requests().len(), 2);

    // A third request would be answered "(no script)": the turn would not fail.
    llm.push(Reply::Empty);
    llm.push(Reply::Empty);
    let (s, body) = gw.api.chat("c", "hi again").await;
    assert_eq!(s, 502, "{body}");
    let err = body["error"].as_str().unwrap();
    assert!(err.contains("empty answer twice"), "{err}");
    assert_eq!(llm.requests().len(), 4, "one retry, not more");
    assert!(counter(&gw, "clawft_llm_errors_total", &[("kind", "empty")]).await >= 3.0);

    // The failed turn left nothing the provider refuses.
    llm.push(Reply::Text("fine".into()));
    assert_eq!(gw.api.chat("c", "and now").await.0, 200);
    assert_all_accepted(&llm);
    gw.stop().await;
}

/// The text a client of `/v1/chat/stream` shows: deltas appended, a restart clearing them;
/// and the final reply or error.
fn shown_by_stream(sse: &str) -> (String, Option<String>, Option<String>) {
    let mut shown = String::new();
    let (mut done, mut error) = (None, None);
    for block in sse.split("\n\n") {
        let event = block
            .lines()
            .find_map(|l| l.strip_prefix("event:"))
            .map(str::trim);
        let data = block
            .lines()
            .find_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .unwrap_or("null");
        let v: Value = serde_json::from_str(data).unwrap_or_default();
        match event {
            Some("delta") if v["restart"] == true => shown.clear(),
            Some("delta") => shown.push_str(v["text"].as_str().unwrap()),
            Some("done") => done = Some(v["reply"].as_str().unwrap().to_string()),
            Some("error") => error = Some(v["error"].as_str().unwrap().to_string()),
            _ => {}
        }
    }
    (shown, done, error)
}

async fn chat_stream(gw: &TestGateway, chat: &str, content: &str) -> String {
    let resp = gw
        .api
        .http
        .post(format!("{}/v1/chat/stream", gw.api.base))
        .json(&json!({"chat_id": chat, "content": content}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.text().await.unwrap()
}

#[tokio::test]
async fn a_stream_cut_mid_answer_is_asked_for_again_and_shown_once() {
    let dir = tempfile::tempdir().unwrap();
    let (llm, gw) = strict_gateway(dir.path(), json!({})).await;
    llm.push(Reply::Cut("The answer is forty".into()));
    llm.push(Reply::Text("The answer is forty-two.".into()));
    let sse = chat_stream(&gw, "s", "what is the answer?").await;
    let (shown, done, error) = shown_by_stream(&sse);
    assert_eq!(error, None, "{sse}");
    assert_eq!(done.as_deref(), Some("The answer is forty-two."), "{sse}");
    assert_eq!(shown, "The answer is forty-two.", "{sse}");
    // The half answer was streamed, then withdrawn.
    let restart = sse.find(r#""restart":true"#).expect("a restart delta");
    assert!(sse[..restart].contains(r#"{"text":"The "#), "{sse}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0]["stream"], true);
    assert_eq!(
        reqs[0]["messages"], reqs[1]["messages"],
        "the same request again"
    );

    // Cut twice: a clear error, and no half answer left as the reply.
    llm.push(Reply::Cut("Half".into()));
    llm.push(Reply::Cut("Half again".into()));
    let sse = chat_stream(&gw, "s", "again").await;
    let (shown, done, error) = shown_by_stream(&sse);
    assert_eq!(done, None, "{sse}");
    let error = error.unwrap();
    assert!(error.contains("cut off twice"), "{error}");
    assert!(!shown.contains("HalfHalf"), "{sse}");
    assert_eq!(llm.requests().len(), 4);
    assert!(counter(&gw, "clawft_llm_errors_total", &[("kind", "cut")]).await >= 3.0);

    // The transcript holds neither half answer, and goes on.
    llm.push(Reply::Text("ok".into()));
    let sse = chat_stream(&gw, "s", "third").await;
    assert_eq!(shown_by_stream(&sse).1.as_deref(), Some("ok"));
    let last = llm.requests().last().cloned().unwrap();
    let text = serde_json::to_string(&last["messages"]).unwrap();
    assert!(
        !text.contains("Half") && !text.contains("forty\""),
        "{text}"
    );
    assert_all_accepted(&llm);
    gw.stop().await;
}

#[tokio::test]
async fn a_cut_body_without_streaming_is_asked_for_again() {
    let dir = tempfile::tempdir().unwrap();
    let (llm, gw) = strict_gateway(
        dir.path(),
        json!({"agents": {"defaults": {"stream": false}}}),
    )
    .await;
    llm.push(Reply::Cut("a long answer that the connection cut".into()));
    llm.push(Reply::Text("complete".into()));
    let (s, body) = gw.api.chat("c", "hi").await;
    assert_eq!(
        (s, body["reply"].as_str()),
        (200, Some("complete")),
        "{body}"
    );
    assert_eq!(llm.requests().len(), 2);
    gw.stop().await;
}

#[tokio::test]
async fn quota_and_auth_errors_are_not_retried_and_say_what_to_fix() {
    let dir = tempfile::tempdir().unwrap();
    let (llm, gw) = strict_gateway(dir.path(), json!({})).await;
    let before = counter(
        &gw,
        "clawft_llm_errors_total",
        &[("provider", "openai"), ("kind", "quota")],
    )
    .await;
    llm.push(Reply::Status(
        429,
        None,
        "You exceeded your current quota, please check your plan and billing details. (insufficient_quota)".into(),
    ));
    // A retry would be answered "(no script)": the turn would not fail.
    let (s, body) = gw.api.chat("q", "hi").await;
    assert_eq!(s, 502, "{body}");
    let err = body["error"].as_str().unwrap();
    assert!(err.contains("out of credit or over its quota"), "{err}");
    assert!(err.contains("billing"), "{err}");
    assert_eq!(llm.requests().len(), 1, "a quota error is not retried");
    let after = counter(
        &gw,
        "clawft_llm_errors_total",
        &[("provider", "openai"), ("kind", "quota")],
    )
    .await;
    assert!(after >= before + 1.0, "{before} -> {after}");

    llm.push(Reply::Status(401, None, "invalid api key".into()));
    let (s, body) = gw.api.chat("k", "hi").await;
    assert_eq!(s, 502, "{body}");
    let err = body["error"].as_str().unwrap();
    assert!(err.contains("refused the API key"), "{err}");
    assert_eq!(llm.requests().len(), 2, "an auth error is not retried");
    assert!(
        counter(
            &gw,
            "clawft_llm_errors_total",
            &[("provider", "openai"), ("kind", "auth")]
        )
        .await
            >= 1.0
    );
    gw.stop().await;
}

#[tokio::test]
async fn the_same_call_over_and_over_gets_a_notice_then_ends_the_turn() {
    let dir = tempfile::tempdir().unwrap();
    let (llm, gw) = strict_gateway(dir.path(), json!({})).await;
    for i in 0..30 {
        llm.push(calls(&[(
            &format!("c{i}"),
            "read_file",
            r#"{"path":"a.txt"}"#,
        )]));
    }
    let (s, body) = gw.api.chat("c", "read a").await;
    assert_eq!(s, 502, "{body}");
    let err = body["error"].as_str().unwrap();
    assert!(
        err.contains("going in circles") && err.contains("read_file"),
        "{err}"
    );
    let reqs = llm.requests();
    // Notice at the 3rd call, the turn ends at the 6th (not run): 6 requests, not 20.
    assert_eq!(reqs.len(), 6);
    let results = tool_results(&reqs[3]);
    assert_eq!(results.len(), 3);
    assert!(results[1].1.get("notice").is_none(), "{results:?}");
    let notice = results[2].1["notice"].as_str().unwrap();
    assert!(
        notice.contains("3 times") && notice.contains("will not change"),
        "{notice}"
    );
    assert_eq!(results[2].1["content"], "alpha", "the call still ran");
    assert_all_accepted(&llm);

    // The stored history replays: the next message is answered.
    let n = reqs.len();
    llm.route(|_| Some(Reply::Text("done".into())));
    let (s, body) = gw.api.chat("c", "stop that").await;
    assert_eq!((s, body["reply"].as_str()), (200, Some("done")), "{body}");
    assert_eq!(llm.requests().len(), n + 1);
    assert_all_accepted(&llm);
    gw.stop().await;
}

#[tokio::test]
async fn two_calls_alternating_are_a_loop_too() {
    let dir = tempfile::tempdir().unwrap();
    let (llm, gw) = strict_gateway(dir.path(), json!({})).await;
    for i in 0..20 {
        let path = if i % 2 == 0 { "a.txt" } else { "b.txt" };
        llm.push(calls(&[(
            &format!("c{i}"),
            "read_file",
            &format!(r#"{{"path":"{path}"}}"#),
        )]));
    }
    let (s, body) = gw.api.chat("c", "compare").await;
    assert_eq!(s, 502, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("alternated"),
        "{body}"
    );
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 8);
    let results = tool_results(&reqs[4]);
    assert!(results[2].1.get("notice").is_none());
    assert!(results[3].1["notice"]
        .as_str()
        .unwrap()
        .contains("alternated"));
    assert_all_accepted(&llm);
    gw.stop().await;
}

#[tokio::test]
async fn the_cap_on_tool_calls_per_turn_ends_the_turn() {
    let dir = tempfile::tempdir().unwrap();
    let (llm, gw) = strict_gateway(
        dir.path(),
        json!({"agents": {"defaults": {"max_tool_calls_per_turn": 5}}}),
    )
    .await;
    for round in 0..2 {
        let v: Vec<(String, String, String)> = (0..3)
            .map(|k| {
                (
                    format!("r{round}k{k}"),
                    "list_directory".to_string(),
                    format!(r#"{{"path":".","n":{}}}"#, round * 3 + k),
                )
            })
            .collect();
        llm.push(Reply::ToolCalls(v));
    }
    let (s, body) = gw.api.chat("c", "fan out").await;
    assert_eq!(s, 502, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("5 tool calls"),
        "{body}"
    );
    assert_eq!(llm.requests().len(), 2);
    gw.stop().await;
    // The refused call has its result in the stored history (the next turn replays it).
    llm.push(Reply::Text("ok".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    assert_eq!(gw.api.chat("c", "go on").await.0, 200);
    let results = tool_results(llm.requests().last().unwrap());
    assert_eq!(results.len(), 6);
    assert!(results[5].1["error"].as_str().unwrap().contains("not run"));
    assert_all_accepted(&llm);
    gw.stop().await;
}

#[tokio::test]
async fn the_reason_reaches_weft_agent_with_the_key_scrubbed() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.strict(None);
    llm.push(Reply::Status(
        401,
        None,
        format!("Incorrect API key provided: {KEY}."),
    ));
    let cfg = write_config(
        dir.path(),
        &config_value(
            &llm.base_url(),
            dir.path(),
            json!({"channels": {"http": {"bind": format!("127.0.0.1:{}", free_port())}}}),
        ),
    );
    let d = dir.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        weft(&d)
            .arg("--config")
            .arg(&cfg)
            .args(["agent", "-m", "hi"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(llm.requests().len(), 1);
    // The command fails with the reason, once, not with "the turn failed".
    let last = stderr.lines().rfind(|l| !l.trim().is_empty()).unwrap();
    assert!(
        last.starts_with("weft: ") && last.contains("refused the API key"),
        "{stderr}"
    );
    assert!(!stderr.contains("the turn failed"), "{stderr}");
    assert!(!crate::scrubbing::recoverable(&stderr, KEY), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains(KEY));
}

#[tokio::test]
async fn the_reason_reaches_the_chat_with_the_key_scrubbed() {
    let dir = tempfile::tempdir().unwrap();
    let (llm, gw) = strict_gateway(dir.path(), json!({})).await;
    llm.push(Reply::Status(
        402,
        None,
        format!("Insufficient credits for key {KEY}; add billing details"),
    ));
    let (s, body) = gw.api.chat("c", "hi").await;
    assert_eq!(s, 502, "{body}");
    let err = body["error"].as_str().unwrap();
    assert!(err.contains("out of credit"), "{err}");
    assert!(!crate::scrubbing::recoverable(err, KEY), "{err}");
    assert_eq!(llm.requests().len(), 1);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_answer_after_the_message_tool_sent_the_words_ends_the_turn_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let (llm, gw) = strict_gateway(
        dir.path(),
        json!({"tools": {"message": {"allow": ["http:ops-*"]}}}),
    )
    .await;
    llm.push(Reply::ToolCalls(vec![(
        "m1".into(),
        "message".into(),
        r#"{"channel":"http","chat_id":"ops-room","content":"deploy finished"}"#.into(),
    )]));
    // The model has said everything through the tool: its last answer is empty.
    llm.push(Reply::Empty);
    let (s, body) = gw.api.chat("me", "tell ops").await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["reply"], "", "{body}");
    assert_eq!(llm.requests().len(), 2, "no second ask for an empty answer");
    let mut v = Value::Null;
    for _ in 0..100 {
        v = gw.api.get("/v1/chats/ops-room/messages").await.1;
        if v["messages"][0].is_object() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(v["messages"][0]["content"], "deploy finished", "{v}");
    gw.stop().await;
}
