//! The tool layer through the gateway: policy (what the model is shown and may call), rate
//! limits, the `message` tool's routes, and secrets that never leave.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{config, tool_names, tool_results, TestGateway};
use crate::fake_llm::{FakeLlm, Reply};

fn calls(v: &[(&str, &str, &str)]) -> Reply {
    Reply::ToolCalls(
        v.iter()
            .map(|(id, name, args)| (id.to_string(), name.to_string(), args.to_string()))
            .collect(),
    )
}

#[tokio::test]
async fn the_policy_hides_tools_and_refuses_calls_to_hidden_ones() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    std::fs::write(dir.path().join("ws/a.txt"), "alpha").unwrap();
    let llm = FakeLlm::start().await;
    llm.push(calls(&[
        ("c1", "list_directory", r#"{"path":"."}"#),
        ("c2", "read_file", r#"{"path":"a.txt"}"#),
    ]));
    llm.push(Reply::Text("done".into()));
    let cfg = config(
        &llm,
        dir.path(),
        json!({
            "tools": {"policy": {"profile": "coding", "deny": ["list_directory"]}},
            "agents": {"defaults": {"tools": {"deny": ["group:runtime"]}}},
        }),
    );
    let gw = TestGateway::start(cfg).await;
    let (s, body) = gw.api.chat("p", "look").await;
    assert_eq!(s, 200, "{body}");
    let reqs = llm.requests();
    let shown = tool_names(&reqs[0]);
    assert!(shown.contains(&"read_file".to_string()), "{shown:?}");
    for hidden in ["list_directory", "message", "exec_shell", "spawn"] {
        assert!(
            !shown.contains(&hidden.to_string()),
            "{hidden} shown: {shown:?}"
        );
    }
    let results = tool_results(&reqs[1]);
    assert_eq!(results[0].0, "c1");
    assert_eq!(results[0].1["error_code"], "PERMISSION_DENIED");
    assert_eq!(results[1].1["content"], "alpha");
    gw.stop().await;
}

#[tokio::test]
async fn a_session_over_its_rate_limit_gets_rate_limited_results() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    std::fs::write(dir.path().join("ws/a.txt"), "alpha").unwrap();
    let llm = FakeLlm::start().await;
    let read = r#"{"path":"a.txt"}"#;
    llm.push(calls(&[
        ("c1", "read_file", read),
        ("c2", "read_file", read),
        ("c3", "read_file", read),
    ]));
    llm.push(Reply::Text("done".into()));
    // Another session has its own bucket.
    llm.push(calls(&[("d1", "read_file", read)]));
    llm.push(Reply::Text("done".into()));
    let cfg = config(
        &llm,
        dir.path(),
        json!({"tools": {"rate_limit": {"per_minute": 1, "burst": 2}}}),
    );
    let gw = TestGateway::start(cfg).await;
    assert_eq!(gw.api.chat("r1", "go").await.0, 200);
    assert_eq!(gw.api.chat("r2", "go").await.0, 200);
    let reqs = llm.requests();
    let codes: Vec<Value> = tool_results(&reqs[1])
        .into_iter()
        .map(|(_, v)| v["error_code"].clone())
        .collect();
    assert_eq!(codes, [Value::Null, Value::Null, json!("RATE_LIMITED")]);
    let other = tool_results(&reqs[3]);
    assert_eq!(other[0].1["content"], "alpha");
    gw.stop().await;
}

#[tokio::test]
async fn the_message_tool_reaches_allowed_chats_only() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(calls(&[
        (
            "m1",
            "message",
            r#"{"channel":"http","chat_id":"ops-room","content":"deploy finished"}"#,
        ),
        (
            "m2",
            "message",
            r#"{"channel":"http","chat_id":"stranger","content":"spam"}"#,
        ),
    ]));
    llm.push(Reply::Text("told ops".into()));
    let cfg = config(
        &llm,
        dir.path(),
        json!({"tools": {"message": {"allow": ["http:ops-*"]}}}),
    );
    let gw = TestGateway::start(cfg).await;
    let (s, body) = gw.api.chat("me", "tell ops").await;
    assert_eq!(s, 200, "{body}");
    let results = tool_results(&llm.requests()[1]);
    assert_eq!(results[0].1["status"], "sent");
    assert_eq!(results[1].1["error_code"], "PERMISSION_DENIED");
    let mut got = Vec::new();
    let api = gw.api.clone();
    for _ in 0..100 {
        let (_, v) = api.get("/v1/chats/ops-room/messages").await;
        got.extend(v["messages"].as_array().cloned().unwrap_or_default());
        if !got.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["content"], "deploy finished");
    let (_, v) = api.get("/v1/chats/stranger/messages").await;
    assert_eq!(v["messages"], json!([]));
    gw.stop().await;
}

/// Fake credentials of several kinds, planted in a file the agent reads.
pub const PLANTED: &[&str] = &[
    "sk-test-secret-123456", // the configured provider key (scrubbed by value)
    "ghp_0123456789abcdefghijklmnopqrstuvwxyzAB",
    "AKIAIOSFODNN7EXAMPLE",
    "sk-ant-api03-abcdefghijklmnopqrstuvwxyz-0123",
    "hunter2hunter2",
];

pub fn planted_file() -> String {
    format!(
        "provider={}\ngithub: {}\naws {}\nanthropic {}\npassword=hunter2hunter2\n",
        PLANTED[0], PLANTED[1], PLANTED[2], PLANTED[3]
    )
}

#[tokio::test]
async fn planted_keys_never_reach_the_model_the_store_or_the_channel() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    std::fs::write(dir.path().join("ws/leak.txt"), planted_file()).unwrap();
    let llm = FakeLlm::start().await;
    llm.push(calls(&[("c1", "read_file", r#"{"path":"leak.txt"}"#)]));
    // The model repeats what the tool returned: the channel output must still be clean.
    llm.push(Reply::EchoToolResults);
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let (s, body) = gw.api.chat("leak", "read leak.txt").await;
    assert_eq!(s, 200, "{body}");
    let reply = body["reply"].as_str().unwrap();
    assert!(reply.contains("[REDACTED]"), "{reply}");
    let sent = serde_json::to_string(&llm.requests()).unwrap();
    let (_, stored) = gw.api.get("/v1/sessions/http:leak").await;
    gw.stop().await;
    // Every byte of the store on disk.
    let disk = crate::common::bytes_under(&dir.path().join("store"));
    // The transcript is on disk in clear: the check below can see keys if they were stored.
    assert!(disk.contains("github: [REDACTED]"));
    for key in PLANTED {
        assert!(!reply.contains(key), "{key} in the reply");
        assert!(!sent.contains(key), "{key} sent to the model");
        assert!(!stored.to_string().contains(key), "{key} in the transcript");
        assert!(!disk.contains(key), "{key} on disk in the store");
    }
    // The text around the keys survived: the scrubbing is targeted.
    assert!(reply.contains("github: [REDACTED]"), "{reply}");
}

#[tokio::test]
async fn web_fetch_from_the_model_never_dials_loopback() {
    use std::sync::atomic::Ordering;
    // A canary on 127.0.0.1 counting every connection it accepts.
    let (canary, hits) = crate::common::counting_listener().await;
    let port = canary.port();
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let urls = [
        format!("http://127.0.0.1:{port}/"),
        format!("http://2130706433:{port}/"),
        format!("http://0x7f.1:{port}/"),
        format!("http://[::ffff:127.0.0.1]:{port}/"),
        format!("http://localhost:{port}/"),
        "http://169.254.169.254/latest/meta-data/".to_string(),
        "http://metadata.google.internal/".to_string(),
    ];
    let list: Vec<(String, String, String)> = urls
        .iter()
        .enumerate()
        .map(|(i, u)| {
            (
                format!("w{i}"),
                "web_fetch".to_string(),
                json!({ "url": u }).to_string(),
            )
        })
        .collect();
    llm.push(Reply::ToolCalls(list));
    llm.push(Reply::Text("blocked".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let (s, body) = gw.api.chat("ssrf", "fetch these").await;
    assert_eq!(s, 200, "{body}");
    let results = tool_results(&llm.requests()[1]);
    assert_eq!(results.len(), urls.len());
    for (i, (_, v)) in results.iter().enumerate() {
        assert_eq!(v["error_code"], "PERMISSION_DENIED", "{}: {v}", urls[i]);
    }
    gw.stop().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(hits.load(Ordering::SeqCst), 0, "the canary was dialled");
}

#[tokio::test]
async fn exec_shell_from_the_model_cannot_touch_anything_outside_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    std::fs::write(dir.path().join("canary.txt"), "canary-content-7f3a").unwrap();
    let llm = FakeLlm::start().await;
    let attacks = [
        "cat ../canary.txt",
        "rm -f ../canary.txt; r''m -r -f ../canary.txt",
        "echo pwned > ../pwned.txt",
        "ln -s ../canary.txt link && cat link && echo gone > link",
        "cp ../canary.txt stolen.txt",
        "ls ../store && cat ../store/conf",
        "python3 -c \"open('../canary.txt','w').write('x')\"",
        "echo made-inside > inside.txt && cat inside.txt",
    ];
    llm.push(Reply::ToolCalls(
        attacks
            .iter()
            .enumerate()
            .map(|(i, c)| {
                (
                    format!("x{i}"),
                    "exec_shell".to_string(),
                    json!({ "command": c }).to_string(),
                )
            })
            .collect(),
    ));
    llm.push(Reply::Text("done".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let (s, body) = gw.api.chat("x", "attack").await;
    assert_eq!(s, 200, "{body}");
    let results = tool_results(&llm.requests()[1]);
    assert_eq!(results.len(), attacks.len());
    gw.stop().await;
    assert_eq!(
        std::fs::read_to_string(dir.path().join("canary.txt")).unwrap(),
        "canary-content-7f3a"
    );
    assert!(!dir.path().join("pwned.txt").exists());
    assert!(!dir.path().join("ws/stolen.txt").exists());
    let all = serde_json::to_string(&results).unwrap();
    assert!(!all.contains("canary-content-7f3a"), "{all}");
    // The sandbox still lets ordinary work happen inside.
    assert_eq!(
        std::fs::read_to_string(dir.path().join("ws/inside.txt")).unwrap(),
        "made-inside\n"
    );
    assert_eq!(results[7].1["stdout"], "made-inside\n");
}

/// Wait for the approval question in the HTTP mailbox of `chat` and return its id.
async fn approval_id(api: &crate::common::Api, chat: &str) -> String {
    for _ in 0..250 {
        let (_, v) = api.get(&format!("/v1/chats/{chat}/messages")).await;
        let mut found = None;
        for m in v["messages"].as_array().cloned().unwrap_or_default() {
            let text = m["content"].as_str().unwrap_or_default();
            if let Some(rest) = text.split("`/approve ").nth(1) {
                found = Some(rest.split('`').next().unwrap().to_string());
            }
        }
        if let Some(id) = found {
            // Read: acknowledged, so the next question is the next one found.
            api.get(&format!(
                "/v1/chats/{chat}/messages?after={}",
                v["next_after"]
            ))
            .await;
            return id;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no approval question arrived");
}

#[tokio::test]
async fn ask_mode_runs_a_command_only_after_the_user_approves_it_in_the_chat() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    let llm = FakeLlm::start().await;
    llm.push(calls(&[(
        "a1",
        "exec_shell",
        r#"{"command":"echo yes > approved.txt"}"#,
    )]));
    llm.push(Reply::Text("ran".into()));
    llm.push(calls(&[(
        "a2",
        "exec_shell",
        r#"{"command":"echo no > denied.txt"}"#,
    )]));
    llm.push(Reply::Text("refused".into()));
    let cfg = config(
        &llm,
        dir.path(),
        json!({"tools": {"exec": {"mode": "ask"}}}),
    );
    let gw = TestGateway::start(cfg).await;

    let api = gw.api.clone();
    let turn = tokio::spawn(async move { api.chat("asker", "make the file").await });
    let id = approval_id(&gw.api, "asker").await;
    assert!(
        !dir.path().join("ws/approved.txt").exists(),
        "ran before approval"
    );
    // Another chat cannot approve it.
    let (_, other) = gw.api.chat("intruder", &format!("/approve {id}")).await;
    assert!(other.to_string().contains("No pending approval"), "{other}");
    let (s, ok) = gw.api.chat("asker", &format!("/approve {id}")).await;
    assert_eq!(s, 200, "{ok}");
    let (s, body) = turn.await.unwrap();
    assert_eq!((s, body["reply"].as_str()), (200, Some("ran")), "{body}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("ws/approved.txt")).unwrap(),
        "yes\n"
    );

    let api = gw.api.clone();
    let turn = tokio::spawn(async move { api.chat("asker", "make another").await });
    let id = approval_id(&gw.api, "asker").await;
    gw.api.chat("asker", &format!("/deny {id}")).await;
    let (s, _) = turn.await.unwrap();
    assert_eq!(s, 200);
    assert!(!dir.path().join("ws/denied.txt").exists());
    let results = tool_results(&llm.requests()[3]);
    assert_eq!(results.last().unwrap().1["error_code"], "PERMISSION_DENIED");
    gw.stop().await;
}

/// `/approve ID` sent to `chat_id` as chat user `sender` (HTTP channel: "http:<sender>").
async fn approve_as(api: &crate::common::Api, chat_id: &str, sender: &str, id: &str) -> String {
    let content = format!("/approve {id}");
    let r = api
        .http
        .post(format!("{}/v1/chat", api.base))
        .json(&json!({"chat_id": chat_id, "sender": sender, "content": content}))
        .send()
        .await
        .unwrap();
    r.json::<Value>().await.unwrap().to_string()
}

/// `tools.exec.approvers = "operator"`: the family member who asked cannot approve their own
/// command (told why, nothing runs, the question still waits); a listed approver can, from
/// their own chat, until a reload removes them (authority is judged when the answer arrives);
/// the operator's answer through the admin API is accepted.
#[tokio::test]
async fn under_operator_approvers_a_chat_user_cannot_approve_and_a_removed_approver_no_longer_can()
{
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    let llm = FakeLlm::start().await;
    for (i, file) in ["one", "two"].iter().enumerate() {
        llm.push(calls(&[(
            &format!("o{i}"),
            "exec_shell",
            &json!({"command": format!("echo yes > {file}.txt")}).to_string(),
        )]));
        llm.push(Reply::Text(format!("ran {file}")));
    }
    let with_ids = |ids: Value| {
        config(
            &llm,
            dir.path(),
            json!({"tools": {"exec": {"mode": "ask", "approvers": "operator", "approver_ids": ids}}}),
        )
    };
    let mut gw = TestGateway::start(with_ids(json!(["http:boss"]))).await;

    let api = gw.api.clone();
    let turn = tokio::spawn(async move { api.chat("family", "make one").await });
    let id = approval_id(&gw.api, "family").await;
    // The asker is told who may approve, and their own /approve changes nothing.
    let refused = approve_as(&gw.api, "family", "mia", &id).await;
    assert!(
        refused.contains("Only the operator can approve"),
        "{refused}"
    );
    assert!(
        !dir.path().join("ws/one.txt").exists(),
        "ran on a chat user's approval"
    );
    // The listed approver is removed by a reload before answering: no longer an approver.
    gw.gateway.daemon.reload(with_ids(json!([]))).await;
    let refused = approve_as(&gw.api, "boss-chat", "boss", &id).await;
    assert!(refused.contains("No pending approval"), "{refused}");
    assert!(!dir.path().join("ws/one.txt").exists());
    // The operator (admin API: the control UI and `weft approvals` use it) approves.
    let r = gw
        .api
        .http
        .post(format!("{}/v1/admin/approvals/answer", gw.api.base))
        .json(&json!({"id": id, "decision": "approve"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let (s, body) = turn.await.unwrap();
    assert_eq!(
        (s, body["reply"].as_str()),
        (200, Some("ran one")),
        "{body}"
    );
    assert!(dir.path().join("ws/one.txt").exists());

    // Listed again: the approver answers from their own chat.
    gw.gateway
        .daemon
        .reload(with_ids(json!(["http:boss"])))
        .await;
    let api = gw.api.clone();
    let turn = tokio::spawn(async move { api.chat("family", "make two").await });
    let id = approval_id(&gw.api, "family").await;
    let ok = approve_as(&gw.api, "boss-chat", "boss", &id).await;
    assert!(ok.contains("Approved"), "{ok}");
    let (s, body) = turn.await.unwrap();
    assert_eq!(
        (s, body["reply"].as_str()),
        (200, Some("ran two")),
        "{body}"
    );
    assert!(dir.path().join("ws/two.txt").exists());
    gw.stop().await;
}

#[tokio::test]
async fn stop_kills_the_whole_process_group_of_a_running_command() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    let llm = FakeLlm::start().await;
    llm.push(calls(&[(
        "s1",
        "exec_shell",
        r#"{"command":"(read p r < /proc/self/stat; echo $p > bg.pid; exec sleep 300) & sleep 300","timeout":300}"#,
    )]));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let api = gw.api.clone();
    let turn = tokio::spawn(async move { api.chat("k", "run forever").await });
    let pid_file = dir.path().join("ws/bg.pid");
    let mut pid = None;
    for _ in 0..250 {
        if let Some(p) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            pid = Some(p);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = pid.expect("the command started");
    let alive = |p: i32| {
        std::fs::read_to_string(format!("/proc/{p}/stat"))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false)
    };
    assert!(alive(pid));
    let (s, body) = gw.api.chat("k", "/stop").await;
    assert_eq!(s, 200, "{body}");
    let (s, _) = turn.await.unwrap();
    assert_eq!(s, 502);
    let mut gone = false;
    for _ in 0..100 {
        if !alive(pid) {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone, "background child {pid} survived /stop");
    gw.stop().await;
}

#[tokio::test]
async fn skills_are_listed_and_activated_by_command_or_by_use_skill() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join("skills/release")).unwrap();
    std::fs::write(
        ws.join("skills/release/SKILL.md"),
        "---\nname: release\ndescription: Cut a release\nallowed_tools: [\"read_file\"]\n---\nBump the version, then tag.\n",
    )
    .unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("releasing".into()));
    llm.push(calls(&[("u1", "use_skill", r#"{"name":"release"}"#)]));
    llm.push(Reply::Text("ok".into()));
    llm.push(calls(&[("u2", "use_skill", r#"{"name":"nope"}"#)]));
    llm.push(Reply::Text("ok".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;

    let (s, _) = gw.api.chat("sk", "/release 1.2.0").await;
    assert_eq!(s, 200);
    let req = &llm.requests()[0];
    let system = req["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("- release: Cut a release"), "{system}");
    assert!(system.contains("Bump the version, then tag."), "{system}");

    let (s, _) = gw.api.chat("sk2", "do a release").await;
    assert_eq!(s, 200);
    let reqs = llm.requests();
    let system = reqs[1]["messages"][0]["content"].as_str().unwrap();
    assert!(
        !system.contains("Bump the version"),
        "instructions leaked into an unrelated turn"
    );
    let r = tool_results(&reqs[2]);
    assert_eq!(r[0].1["instructions"], "Bump the version, then tag.");
    assert_eq!(r[0].1["allowed_tools"], json!(["read_file"]));

    let (s, _) = gw.api.chat("sk3", "use a missing skill").await;
    assert_eq!(s, 200);
    let r = tool_results(&llm.requests()[4]);
    assert_eq!(r[0].1["error_code"], "INVALID_ARGS");
    assert!(r[0].1["error"].as_str().unwrap().contains("release"));
    gw.stop().await;
}

#[tokio::test]
async fn metrics_are_valid_prometheus_text_and_count_turns_and_tools() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    std::fs::write(dir.path().join("ws/a.txt"), "alpha").unwrap();
    let llm = FakeLlm::start().await;
    llm.push(calls(&[
        ("c1", "read_file", r#"{"path":"a.txt"}"#),
        ("c2", "read_file", r#"{"path":"../x"}"#),
    ]));
    llm.push(Reply::Text("done".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    assert_eq!(gw.api.chat("metrics", "go").await.0, 200);
    let r = gw
        .api
        .http
        .get(format!("{}/metrics", gw.api.base))
        .send()
        .await
        .unwrap();
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let text = r.text().await.unwrap();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    let value = |name: &str, labels: &[(&str, &str)]| -> f64 {
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => 0.0,
            })
            .sum()
    };
    // Counters are process-wide (other tests run in this process): at least ours.
    assert!(
        value("clawft_turns_total", &[("status", "completed")]) >= 1.0,
        "{text}"
    );
    assert!(
        value(
            "clawft_tool_calls_total",
            &[("tool", "read_file"), ("outcome", "ok")]
        ) >= 1.0
    );
    assert!(
        value(
            "clawft_tool_calls_total",
            &[("tool", "read_file"), ("outcome", "INVALID_PATH")]
        ) >= 1.0
    );
    assert!(value("clawft_sessions_stored", &[]) >= 1.0);
    assert!(value("clawft_store_size_bytes", &[]) > 0.0);
    assert!(scrape
        .samples
        .iter()
        .any(|s| s.metric == "clawft_llm_request_duration_seconds"));
    gw.stop().await;
}

/// The 64 KB cap on a tool result holds on what the provider receives for the tool message (the
/// content string as written in the request body, escapes included), on every path: binary
/// output kept at a timeout, a long text result, and an error whose text echoes the call.
#[tokio::test]
async fn a_tool_result_is_held_to_its_cap_as_the_provider_receives_it() {
    const CAP: usize = 65_536;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    let llm = FakeLlm::start().await;
    let long_name = format!("no_such_tool_{}", "\u{1}\"x".repeat(40_000));
    llm.push(Reply::ToolCalls(vec![
        (
            "bin".into(),
            "exec_shell".into(),
            json!({"command": "head -c 3000000 /dev/urandom; sleep 30", "timeout": 2}).to_string(),
        ),
        (
            "text".into(),
            "exec_shell".into(),
            json!({"command": "yes '\"quoted\" \\\\ text' | head -c 900000"}).to_string(),
        ),
        ("err".into(), long_name, "{}".into()),
    ]));
    llm.push(Reply::Text("done".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let (s, body) = gw.api.chat("cap", "run them").await;
    assert_eq!(s, 200, "{body}");
    let req = &llm.requests()[1];
    let tools: Vec<&Value> = req["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(tools.len(), 3, "{req}");
    for m in &tools {
        let content = m["content"].as_str().unwrap();
        // The bytes of the tool message's content in the request body.
        let wire = serde_json::to_string(&m["content"]).unwrap().len();
        assert!(
            wire <= CAP,
            "{}: {wire} bytes on the wire ({} decoded)",
            m["tool_call_id"],
            content.len()
        );
        // Still JSON the model can read, saying it was cut.
        let v: Value = serde_json::from_str(content).unwrap();
        assert!(content.contains("truncated"), "{}: {v}", m["tool_call_id"]);
    }
    let results = tool_results(req);
    // What matters about the run survives the cut: that it timed out, and why.
    let bin = &results.iter().find(|(id, _)| id == "bin").unwrap().1;
    assert_eq!(bin["timed_out"], true, "{bin}");
    assert!(bin["note"].as_str().unwrap().contains("timed out"), "{bin}");
    let text = &results.iter().find(|(id, _)| id == "text").unwrap().1;
    assert_eq!(text["exit_code"], 0, "{text}");
    assert!(
        text["stdout"]
            .as_str()
            .unwrap()
            .starts_with("\"quoted\" \\\\ text\n"),
        "{text}"
    );
    let err = &results.iter().find(|(id, _)| id == "err").unwrap().1;
    assert_eq!(err["error_code"], "NOT_FOUND", "{err}");
    gw.stop().await;
}
