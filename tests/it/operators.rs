//! What a new operator meets in the first weeks: the `weft` commands from a shell that does not
//! hold the service's secrets, reloads, approvals, reminders, the HTTP mailbox.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{config_value, wait_until};
use crate::fake_llm::{FakeLlm, Reply};
use crate::process::{free_port, weft, write_config, Daemon};

const T: Duration = Duration::from_secs(30);

/// Run `weft --config CFG ARGS` as from a new shell: `env -i` with only HOME, PATH and
/// CLAWFT_HOME (no channel secret).
async fn run(dir: &Path, cfg: &Path, args: &[&str]) -> Output {
    let (dir, cfg) = (dir.to_path_buf(), cfg.to_path_buf());
    let args: Vec<String> = args.iter().map(|a| (*a).to_string()).collect();
    tokio::task::spawn_blocking(move || {
        weft(&dir)
            .env("RUST_LOG", "warn")
            .arg("--config")
            .arg(&cfg)
            .args(&args)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A config whose Telegram token is read from `TELEGRAM_BOT_TOKEN`, with pairing on.
fn telegram_env_config(dir: &Path, llm: &FakeLlm, port: u16, api_url: &str) -> PathBuf {
    write_config(
        dir,
        &config_value(
            &llm.base_url(),
            dir,
            json!({"channels": {
                "http": {"bind": format!("127.0.0.1:{port}")},
                "telegram": {"token_env": "TELEGRAM_BOT_TOKEN", "api_url": api_url,
                             "allow_from": [111], "pairing": true, "stream_edits": false},
            }}),
        ),
    )
}

/// The channel token lives only in the service's environment (and its `service.env`): every
/// command an operator runs from a new shell works against the running gateway, `doctor`
/// reports the token as a finding, and only the gateway itself insists on it, naming it.
#[tokio::test]
async fn commands_work_from_a_shell_without_the_services_channel_secrets() {
    use clawft_channel_telegram::fake::FakeTelegram;
    let tg = FakeTelegram::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = telegram_env_config(dir.path(), &llm, port, &tg.api_url());
    let home = dir.path().join(".clawft");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("service.env"),
        format!("TELEGRAM_BOT_TOKEN={}\n", FakeTelegram::TOKEN),
    )
    .unwrap();

    // The gateway itself needs the token, and says which setting and variable.
    let out = run(dir.path(), &cfg, &["gateway"]).await;
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("TELEGRAM_BOT_TOKEN"),
        "{}",
        text(&out)
    );

    let d = Daemon::start_with_env(
        dir.path(),
        &cfg,
        port,
        &[("TELEGRAM_BOT_TOKEN", FakeTelegram::TOKEN)],
    )
    .await;
    // A stranger asks for a pairing code.
    tg.push_user_message(222, 222, "let me in");
    assert!(
        wait_until(T, || tg
            .sent()
            .iter()
            .any(|m| m.visible.contains("pairing approve ")))
        .await
    );
    let code = tg
        .sent()
        .iter()
        .find_map(|m| {
            m.visible
                .split("pairing approve ")
                .nth(1)
                .map(|r| r.split(['`', ' ', '\n']).next().unwrap_or("").to_string())
        })
        .unwrap();

    for args in [
        vec!["status"],
        vec!["sessions", "list"],
        vec!["usage"],
        vec!["cron", "list"],
        vec!["pairing", "list"],
        vec!["mcp", "list"],
        vec!["config", "show"],
    ] {
        let out = run(dir.path(), &cfg, &args).await;
        assert!(out.status.success(), "weft {args:?}: {}", text(&out));
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("cannot read secret"),
            "weft {args:?}: {}",
            text(&out)
        );
    }
    let out = run(dir.path(), &cfg, &["pairing", "approve", &code]).await;
    assert!(out.status.success(), "{}", text(&out));

    llm.push(Reply::Text("through the gateway".into()));
    let out = run(dir.path(), &cfg, &["agent", "-m", "hello"]).await;
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "through the gateway"
    );

    // `config show` says where the token is instead of failing.
    let out = run(dir.path(), &cfg, &["config", "show"]).await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("not in this shell"),
        "{}",
        text(&out)
    );

    // `doctor` reports it as a finding: the service's file has it, so a warning.
    let out = run(dir.path(), &cfg, &["doctor", "--json"]).await;
    let rows: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    let tgrow = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["check"] == "channel telegram")
        .cloned()
        .unwrap_or_else(|| panic!("{rows:#}"));
    assert_eq!(tgrow["level"], "warn", "{rows:#}");
    assert!(
        tgrow["detail"]
            .as_str()
            .unwrap()
            .contains("TELEGRAM_BOT_TOKEN"),
        "{rows:#}"
    );
    // Without it in the service's file either, a failure that says how to give it.
    std::fs::write(home.join("service.env"), "").unwrap();
    let out = run(dir.path(), &cfg, &["doctor", "--json"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    let tgrow = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["check"] == "channel telegram")
        .cloned()
        .unwrap();
    assert_eq!(tgrow["level"], "fail", "{rows:#}");
    assert_eq!(d.term().code(), Some(0));
}

/// One edit per top-level section of the config file, and what a reload must answer for it:
/// a word of the change it applies or reports as waiting for a restart.
fn section_edits() -> Vec<(&'static str, Value, &'static str)> {
    vec![
        (
            "agents",
            json!({"agents": {"defaults": {"max_tool_iterations": 7}}}),
            "agents changed: takes effect at the next restart",
        ),
        (
            "providers",
            json!({"providers": {"openai": {"timeout_secs": 31}}}),
            "providers changed: takes effect at the next restart",
        ),
        (
            "channels",
            json!({"channels": {"http": {"reply_timeout_secs": 61}}}),
            "channels.http changed: takes effect at the next restart",
        ),
        (
            "store",
            json!({"store": {"cache_mb": 5}}),
            "store changed: takes effect at the next restart",
        ),
        (
            "sessions",
            json!({"sessions": {"idle_secs": 1234}}),
            "sessions changed: takes effect at the next restart",
        ),
        (
            "tools",
            json!({"tools": {"rate_limit": {"per_minute": 33}}}),
            "tools: policy, limits and tool settings reloaded",
        ),
        (
            "prices",
            json!({"prices": {"fake-model": {"input": 1.0, "output": 2.0}}}),
            "prices and budgets reloaded",
        ),
        (
            "budgets",
            json!({"budgets": {"per_session_daily_tokens": 10}}),
            "prices and budgets reloaded",
        ),
        (
            "memory",
            json!({"memory": {"scope": "agent"}}),
            "memory changed: takes effect at the next restart",
        ),
        (
            "scheduler",
            json!({"scheduler": {"max_jobs_per_session": 3}}),
            "scheduler changed: takes effect at the next restart",
        ),
        (
            "heartbeat",
            json!({"heartbeat": {"enabled": true, "every": "30m", "target": {"channel": "http", "chat_id": "hb"}}}),
            "heartbeat changed: takes effect at the next restart",
        ),
        (
            "bindings",
            json!({"bindings": [{"agent": "main", "channel": "http"}]}),
            "bindings changed: takes effect at the next restart",
        ),
        (
            "hooks",
            json!({"hooks": {"deploy": {"secret": "hook-secret-0123456789abcdef"}}}),
            "hooks changed: takes effect at the next restart",
        ),
        (
            "media",
            json!({"media": {"max_file_mb": 3}}),
            "media changed: takes effect at the next restart",
        ),
        (
            "node",
            json!({"node": {"name": "homeserver"}}),
            "node changed: the settings of `weft node`, not used by the gateway; a node host reads them at its next restart",
        ),
        (
            "cluster",
            json!({"cluster": {"nats_url": "nats://127.0.0.1:1", "node_id": "n1"}}),
            "cluster changed: takes effect at the next restart",
        ),
    ]
}

/// A reload reports every edit of every top-level section (applied, or waiting for a restart),
/// never "nothing changed"; undoing an applied edit is reported and undone too, because the
/// diff is against what is in force, and undoing one that waited for a restart changes nothing.
#[tokio::test]
async fn a_reload_reports_an_edit_of_every_section_against_what_is_in_force() {
    use crate::common::{config, TestGateway};
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let edits = section_edits();
    // The table covers every section the file has.
    let sections: Vec<String> = serde_json::to_value(clawft::config::file::ConfigFile::default())
        .unwrap()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    let mut covered: Vec<String> = edits.iter().map(|(s, _, _)| (*s).to_string()).collect();
    covered.sort();
    assert_eq!(covered, sections, "a section has no edit in this test");

    let mut gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    for (section, edit, said) in &edits {
        let c = gw
            .gateway
            .daemon
            .reload(config(&llm, dir.path(), edit.clone()))
            .await
            .join("; ");
        assert!(c.contains(said), "edit of {section}: {c}");
        let back = gw
            .gateway
            .daemon
            .reload(config(&llm, dir.path(), json!({})))
            .await
            .join("; ");
        if said.contains("next restart") {
            assert!(!back.contains(said), "undo of {section}: {back}");
        } else {
            assert!(back.contains(said), "undo of {section}: {back}");
        }
    }

    // The reported case: a budget added, then removed: sessions are served again.
    crate::common::echo_model(&llm);
    gw.gateway
        .daemon
        .reload(config(
            &llm,
            dir.path(),
            json!({"budgets": {"per_session_daily_tokens": 1}}),
        ))
        .await;
    let (status, _) = gw.api.chat("b1", "first").await;
    assert_eq!(status, 200);
    let (status, v) = gw.api.chat("b1", "second").await;
    assert_ne!(status, 200, "{v}");
    let c = gw
        .gateway
        .daemon
        .reload(config(&llm, dir.path(), json!({})))
        .await
        .join("; ");
    assert!(c.contains("prices and budgets reloaded"), "{c}");
    let (status, v) = gw.api.chat("b1", "third").await;
    assert_eq!(status, 200, "{v}");
    gw.stop().await;
}

fn exec_call(id: &str, command: &str) -> Reply {
    Reply::ToolCalls(vec![(
        id.into(),
        "exec_shell".into(),
        json!({ "command": command }).to_string(),
    )])
}

/// Events of an SSE response as (event, data), read as they arrive.
struct Sse {
    resp: reqwest::Response,
    buf: String,
}

impl Sse {
    async fn next(&mut self) -> Option<(String, Value)> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut event = String::from("message");
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(e) = line.strip_prefix("event:") {
                        event = e.trim().to_string();
                    } else if let Some(d) = line.strip_prefix("data:") {
                        data.push_str(d.trim_start());
                    }
                }
                if data.is_empty() {
                    continue;
                }
                return Some((event, serde_json::from_str(&data).unwrap_or(Value::Null)));
            }
            let chunk = tokio::time::timeout(T, self.resp.chunk())
                .await
                .ok()?
                .ok()??;
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// Skip to the first event named `name`.
    async fn until(&mut self, name: &str) -> Value {
        loop {
            let (e, v) = self
                .next()
                .await
                .unwrap_or_else(|| panic!("no `{name}` event"));
            if e == name {
                return v;
            }
        }
    }
}

/// Approvals reach the person asked: an `approval` event on the HTTP stream of the asking chat,
/// the question on the terminal talking through the gateway; the operator lists and answers
/// them with `weft approvals` (also as JSON), and one nobody answers is shown as expired.
#[tokio::test]
async fn approvals_reach_the_asking_chat_and_the_operator_answers_them() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = crate::process::gateway_config(
        dir.path(),
        &llm,
        port,
        json!({"tools": {"exec": {"mode": "ask", "approval_timeout_secs": 6}}}),
    );
    let d = Daemon::start(dir.path(), &cfg, port).await;

    // The HTTP stream shows the question; the operator approves it from the CLI.
    llm.push(exec_call("c1", "echo yes > approved.txt"));
    llm.push(Reply::Text("ran it".into()));
    let resp = d
        .api
        .http
        .post(format!("{}/v1/chat/stream", d.api.base))
        .json(&json!({"chat_id": "asker", "content": "make the file"}))
        .send()
        .await
        .unwrap();
    let mut sse = Sse {
        resp,
        buf: String::new(),
    };
    let ev = sse.until("approval").await;
    let id = ev["id"].as_str().unwrap().to_string();
    assert!(
        ev["command"].as_str().unwrap().contains("approved.txt"),
        "{ev}"
    );
    let out = run(dir.path(), &cfg, &["approvals", "list", "--json"]).await;
    assert!(out.status.success(), "{}", text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["approvals"][0]["id"], id.as_str(), "{v}");
    assert_eq!(v["approvals"][0]["state"], "pending", "{v}");
    assert_eq!(v["approvals"][0]["session"], "http:asker", "{v}");
    let out = run(dir.path(), &cfg, &["approvals", "approve", &id]).await;
    assert!(out.status.success(), "{}", text(&out));
    let done = sse.until("done").await;
    assert_eq!(done["reply"], "ran it");
    assert!(dir.path().join("ws/approved.txt").exists());
    // Answered once is answered.
    let out = run(dir.path(), &cfg, &["approvals", "deny", &id]).await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no longer pending: it was approved"),
        "{}",
        text(&out)
    );

    // The terminal through the gateway shows the question; the operator denies it.
    llm.push(exec_call("c2", "echo no > denied.txt"));
    llm.push(Reply::Text("as you wish".into()));
    let mut agent = weft(dir.path())
        .env("RUST_LOG", "warn")
        .arg("--config")
        .arg(&cfg)
        .args(["agent", "-m", "make another"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = agent.stderr.take().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let id2 = loop {
        let line = tokio::time::timeout(T, rx.recv())
            .await
            .unwrap()
            .expect("the terminal showed no question");
        if let Some(rest) = line.split("weft approvals deny ").nth(1) {
            break rest.trim_end_matches(['`', ']']).to_string();
        }
    };
    let out = run(dir.path(), &cfg, &["approvals", "deny", &id2]).await;
    assert!(out.status.success(), "{}", text(&out));
    let st = tokio::task::spawn_blocking(move || agent.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(st.status.success());
    assert_eq!(String::from_utf8_lossy(&st.stdout).trim(), "as you wish");
    assert!(!dir.path().join("ws/denied.txt").exists());

    // Nobody answers: the call is denied at the timeout and the approval shows as expired.
    llm.push(exec_call("c3", "echo late > late.txt"));
    llm.push(Reply::Text("nobody answered".into()));
    let (status, v) = d.api.chat("asker", "one more").await;
    assert_eq!(status, 200, "{v}");
    let out = run(dir.path(), &cfg, &["approvals", "list"]).await;
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    let expired = table
        .lines()
        .find(|l| l.contains("late.txt"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(expired.contains("expired"), "{table}");
    assert!(table.contains(&id2) && table.contains("denied"), "{table}");
    assert_eq!(d.term().code(), Some(0));
}

/// A question still undelivered when the gateway stopped is never asked after the restart
/// (nobody waits for its answer): it is listed as expired instead.
#[tokio::test]
async fn an_approval_question_left_undelivered_is_not_asked_after_a_restart() {
    use crate::common::{config, TestGateway};
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    {
        let store = clawft::store::Store::open(&dir.path().join("store"), 4 << 20).unwrap();
        let m = clawft_channel_core::OutboundMessage::proactive_body(
            clawft_channel_core::ChannelId::new("http"),
            clawft_channel_core::ChatId::new("asker"),
            None,
            clawft_channel_core::OutboundBody::Approval {
                text: "Approval needed to run: rm -rf build".into(),
                ask: clawft_channel_core::ApprovalAsk {
                    approval_id: "0a1b2c3d".into(),
                    command: "rm -rf build".into(),
                    terminal: false,
                },
            },
        );
        store.enqueue_outbound(&m).unwrap();
    }
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let r = gw
        .api
        .http
        .post(format!("{}/v1/admin/approvals/list", gw.api.base))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["approvals"][0]["id"], "0a1b2c3d", "{v}");
    assert_eq!(v["approvals"][0]["state"], "expired", "{v}");
    let (_, mb) = gw.api.get("/v1/chats/asker/messages").await;
    assert_eq!(mb["messages"], json!([]), "{mb}");
    gw.stop().await;
}

/// POST /v1/chat with `event_id` → (status, body).
async fn chat_with_id(
    api: &crate::common::Api,
    chat: &str,
    content: &str,
    event_id: &str,
) -> (u16, Value) {
    let r = api
        .http
        .post(format!("{}/v1/chat", api.base))
        .json(&json!({"chat_id": chat, "content": content, "event_id": event_id}))
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    (s, r.json().await.unwrap_or(Value::Null))
}

/// The HTTP mailbox is kept in the store until the reader acknowledges it (it was an
/// in-memory map, emptied by every read and lost on a restart), and a request resent with its
/// `event_id` after the gateway died gets the reply (it got `409 duplicate event_id`).
#[tokio::test]
async fn the_http_mailbox_survives_kill_9_until_acknowledged_and_a_resent_request_gets_its_reply() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = crate::process::gateway_config(dir.path(), &llm, port, json!({}));
    llm.push(Reply::Hang);
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let out = run(dir.path(), &cfg, &["send", "http", "room1", "deploy done"]).await;
    assert!(out.status.success(), "{}", text(&out));
    let api = d.api.clone();
    let first = tokio::spawn(async move { chat_with_id(&api, "j", "remember me", "req-1").await });
    assert!(wait_until(T, || llm.requests().len() == 1).await);
    let deadline = std::time::Instant::now() + T;
    while d.api.get("/v1/chats/room1/messages").await.1["messages"][0].is_null() {
        assert!(
            std::time::Instant::now() < deadline,
            "not delivered\n{}",
            std::fs::read_to_string(dir.path().join("gateway.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Read twice without acknowledging: the message stays.
    for _ in 0..2 {
        let (s, v) = d.api.get("/v1/chats/room1/messages").await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["messages"][0]["content"], "deploy done", "{v}");
        assert_eq!(v["messages"].as_array().unwrap().len(), 1, "{v}");
    }
    d.kill9();
    let _ = first.await;

    // Second life: the journaled request is answered again; the client resends it.
    llm.push(Reply::Text("remembered".into()));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let (s, v) = chat_with_id(&d.api, "j", "remember me", "req-1").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["reply"], "remembered", "{v}");
    // Once more: the recorded reply, the model not asked again.
    let (s, v) = chat_with_id(&d.api, "j", "remember me", "req-1").await;
    assert_eq!(
        (s, &v["reply"], &v["replayed"]),
        (200, &json!("remembered"), &json!(true)),
        "{v}"
    );
    assert_eq!(llm.requests().len(), 2, "answered more than once");
    // The proactive message survived the kill, once.
    let (_, v) = d.api.get("/v1/chats/room1/messages").await;
    let msgs = v["messages"].as_array().unwrap().clone();
    assert_eq!(msgs.len(), 1, "{v}");
    assert_eq!(msgs[0]["content"], "deploy done", "{v}");
    let seq = msgs[0]["seq"].as_u64().unwrap();
    assert_eq!(v["next_after"], json!(seq), "{v}");
    // Acknowledged: gone, and still gone after a restart.
    let (_, v) = d
        .api
        .get(&format!("/v1/chats/room1/messages?after={seq}"))
        .await;
    assert_eq!(v["messages"], json!([]), "{v}");
    assert_eq!(d.term().code(), Some(0));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let (_, v) = d.api.get("/v1/chats/room1/messages").await;
    assert_eq!(v["messages"], json!([]), "{v}");
    let (s, v) = d.api.get("/v1/chats/room1/messages?after=x").await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(d.term().code(), Some(0));
}

/// A gateway started by hand, as the README shows, keeps its log where `weft logs` reads it
/// (it logged to stderr only, and `weft logs` found nothing).
#[tokio::test]
async fn weft_logs_shows_the_log_of_a_gateway_started_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = crate::process::gateway_config(dir.path(), &llm, port, json!({}));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    // The same request twice: the second is logged as a duplicate, inside its spans.
    llm.push(Reply::Text("once".into()));
    for _ in 0..2 {
        assert_eq!(chat_with_id(&d.api, "logs", "hi", "dup-1").await.0, 200);
    }
    let out = run(dir.path(), &cfg, &["logs", "-n", "200"]).await;
    assert!(out.status.success(), "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(shown.contains("weft gateway ready"), "{}", text(&out));
    // Each span says its own fields once: the channel is the ingress span's, not repeated.
    let dup = shown
        .lines()
        .find(|l| l.contains("duplicate event ignored"))
        .unwrap_or_else(|| panic!("no duplicate line:\n{shown}"));
    assert!(
        dup.contains("ingress{channel=http}:inbound{event_id=dup-1}"),
        "{dup}"
    );
    assert!(
        !shown.contains("\u{1b}["),
        "no colour escapes in the file: {shown}"
    );
    let file = dir.path().join(".clawft/logs/gateway.log");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(d.term().code(), Some(0));
}

/// The model is told when each message was sent, in the users' time zone, so "remind me in a
/// minute" has a base (it was never told the date or the time). Each message keeps its stamp
/// from one request to the next and the system prompt's note does not change: the provider's
/// prompt cache keeps working.
#[tokio::test]
async fn the_model_sees_when_each_message_was_sent_in_the_users_time_zone() {
    use crate::common::{config, messages, system_of, TestGateway};
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("one".into()));
    llm.push(Reply::Text("two".into()));
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"agents": {"defaults": {"timezone": "Asia/Tokyo"}}}),
    ))
    .await;
    let before = chrono::Utc::now();
    assert_eq!(gw.api.chat("tz", "remind me in 1 minute").await.0, 200);
    assert_eq!(gw.api.chat("tz", "and again").await.0, 200);
    let after = chrono::Utc::now();
    let raw = llm.raw_requests();
    let users = |req: &Value| -> Vec<String> {
        messages(req)
            .iter()
            .filter(|m| m["role"] == "user")
            .map(|m| m["content"].as_str().unwrap().to_string())
            .collect()
    };
    let (first, second) = (users(&raw[0]), users(&raw[1]));
    assert_eq!(first.len(), 1, "{first:?}");
    // Tokyo is UTC+9 all year: the stamp is the local time of the message, said so.
    let tokyo = chrono::FixedOffset::east_opt(9 * 3600).unwrap();
    let stamps: Vec<String> = [before, after]
        .iter()
        .map(|t| {
            t.with_timezone(&tokyo)
                .format("[%a %Y-%m-%d %H:%M +09:00] ")
                .to_string()
        })
        .collect();
    assert!(
        stamps
            .iter()
            .any(|s| first[0] == format!("{s}remind me in 1 minute")),
        "{first:?} vs {stamps:?}"
    );
    // The first message carries the same stamp in the second request (a byte-stable prefix).
    assert_eq!(second[0], first[0]);
    assert!(second[1].ends_with("] and again"), "{second:?}");
    let system = system_of(&raw[0]);
    assert!(system.contains("Asia/Tokyo"), "{system}");
    assert_eq!(system, system_of(&raw[1]));
    // The transcript keeps the text as the user wrote it.
    let (_, v) = gw.api.get("/v1/sessions/http:tz").await;
    assert_eq!(v["messages"][0]["content"], "remind me in 1 minute", "{v}");
    gw.stop().await;

    // An unknown zone is a configuration error naming the key.
    let e = clawft::config::Config::from_str(
        r#"{"agents": {"defaults": {"timezone": "Mars/Olympus"}}}"#,
        false,
        &clawft::config::Env::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("agents.defaults.timezone"), "{e}");
}

/// `weft doctor` says when the provider does not serve the configured model (every turn would
/// fail with "model not found"; it said "ok").
#[tokio::test]
async fn doctor_says_when_the_provider_does_not_serve_the_configured_model() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = crate::process::gateway_config(
        dir.path(),
        &llm,
        port,
        json!({"agents": {"defaults": {"model": "gpt-4o-typo"}}}),
    );
    let out = run(dir.path(), &cfg, &["doctor", "--json"]).await;
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.contains("does not list the model `gpt-4o-typo`") && said.contains("fake-model"),
        "{}",
        text(&out)
    );
    // Every turn would fail: a failure, not a warning.
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_str(&said).unwrap();
    let finding = v
        .as_array()
        .or_else(|| v["findings"].as_array())
        .and_then(|a| {
            a.iter().find(|f| {
                f["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("does not list"))
            })
        })
        .cloned()
        .unwrap_or_default();
    assert_eq!(finding["level"], "fail", "{said}");
    let cfg = crate::process::gateway_config(dir.path(), &llm, port, json!({}));
    let out = run(dir.path(), &cfg, &["doctor", "--json"]).await;
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(said.contains("serves model fake-model"), "{}", text(&out));
}

/// A new agent's workspace, made by the gateway, gets the context-file templates onboard
/// writes for the first one (it got none); an existing workspace is left alone.
#[tokio::test]
async fn a_new_agents_workspace_gets_the_context_file_templates() {
    use crate::common::{config, TestGateway};
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let helper_ws = dir.path().join("ws-helper");
    let kept_ws = dir.path().join("ws-kept");
    std::fs::create_dir_all(&kept_ws).unwrap();
    std::fs::write(kept_ws.join("SOUL.md"), "mine").unwrap();
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"agents": {
            "helper": {"workspace": helper_ws.to_str().unwrap()},
            "kept": {"workspace": kept_ws.to_str().unwrap()},
        }}),
    ))
    .await;
    for f in [
        "SOUL.md",
        "IDENTITY.md",
        "AGENTS.md",
        "USER.md",
        "BOOTSTRAP.md",
    ] {
        assert!(helper_ws.join(f).is_file(), "{f} missing");
    }
    assert_eq!(
        std::fs::read_to_string(kept_ws.join("SOUL.md")).unwrap(),
        "mine"
    );
    assert!(!kept_ws.join("BOOTSTRAP.md").exists());
    gw.stop().await;
}

/// `weft config show` is the effective configuration: defaults of the settings operators look
/// for included, and lists as JSON (they were debug text, and many defaults were missing).
#[tokio::test]
async fn config_show_lists_defaults_and_renders_lists_plainly() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let cfg = crate::process::gateway_config(
        dir.path(),
        &llm,
        free_port(),
        json!({"tools": {"policy": {"deny": ["web_fetch", "web_search"]}}}),
    );
    let out = run(dir.path(), &cfg, &["config", "show"]).await;
    assert!(out.status.success(), "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    for key in [
        "agents.defaults.timezone",
        "agents.defaults.max_tool_calls_per_turn",
        "tools.exec.mode",
        "tools.exec.network",
        "memory.scope",
        "scheduler.max_jobs_per_session",
    ] {
        assert!(shown.contains(key), "{key} missing:\n{shown}");
    }
    assert!(shown.contains(r#"["web_fetch","web_search"]"#), "{shown}");
    assert!(
        !shown.contains("ValueKind") && !shown.contains("Value {"),
        "{shown}"
    );
}

/// A gateway started with a stale key (the provider answers its calls 401) while the shell
/// holds a good one: `weft status`, `/readyz` and `weft doctor` report what the gateway meets,
/// not what the shell sees; doctor fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_status_and_readyz_report_the_running_gateways_provider_failure() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    // Every completion is refused as a stale key is; /v1/models answers (the shell's key is good).
    llm.route(|_| {
        Some(Reply::Status(
            401,
            None,
            "{\"error\": {\"message\": \"Incorrect API key provided\"}}".into(),
        ))
    });
    let port = free_port();
    let mut v = config_value(
        &llm.base_url(),
        dir.path(),
        json!({"channels": {"http": {"bind": format!("127.0.0.1:{port}")}}}),
    );
    v["providers"]["openai"]
        .as_object_mut()
        .unwrap()
        .remove("api_key");
    v["providers"]["openai"]["api_key_env"] = json!("LLM_KEY");
    let cfg = write_config(dir.path(), &v);
    let d = Daemon::start_with_env(dir.path(), &cfg, port, &[("LLM_KEY", "sk-stale-000000")]).await;
    let (s, _) = d.api.get("/readyz").await;
    assert_eq!(s, 200, "ready before any call");
    let (s, reply) = d.api.chat("family", "hello").await;
    assert!(s != 200 || reply.to_string().len() < 10_000, "{reply}");
    let (_, status) = d.api.get("/v1/status").await;
    let p = &status["providers"][0];
    assert_eq!(p["name"], "openai", "{status}");
    assert_eq!(p["model"], "fake-model", "{status}");
    assert_eq!(p["state"], "failing", "{status}");
    assert_eq!(p["last_error"]["kind"], "auth", "{status}");
    assert!(p["failing_since_ms"].as_u64().is_some(), "{status}");
    assert_eq!(p["last_success_ms"], Value::Null, "{status}");
    let (s, ready) = d.api.get("/readyz").await;
    assert_eq!(s, 503, "{ready}");
    assert_eq!(ready["status"], "provider_failing", "{ready}");
    // Doctor from a shell holding a good key.
    let (dd, cc) = (dir.path().to_path_buf(), cfg.clone());
    let out = tokio::task::spawn_blocking(move || {
        weft(&dd)
            .env("RUST_LOG", "warn")
            .env("LLM_KEY", "sk-good-111111")
            .arg("--config")
            .arg(&cc)
            .args(["doctor", "--json"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["check"] == "gateway's openai")
        .cloned()
        .unwrap_or_default();
    assert_eq!(row["level"], "fail", "{rows}");
    let detail = row["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("auth") && detail.contains("service.env"),
        "{detail}"
    );
    assert!(!detail.contains("sk-stale-000000"), "{detail}");
    // Once the provider answers again, it is ok and ready.
    llm.route(|_| Some(Reply::Text("back".into())));
    let (s, _) = d.api.chat("family", "hello again").await;
    assert_eq!(s, 200);
    let (_, status) = d.api.get("/v1/status").await;
    assert_eq!(status["providers"][0]["state"], "ok", "{status}");
    let (s, _) = d.api.get("/readyz").await;
    assert_eq!(s, 200);
    assert!(d.term().success());
}

/// A typo in the config file on disk (`modle`) while the gateway runs on the good one: the
/// commands that only talk to the gateway (`status`, `approvals`) warn and carry on, so a
/// pending approval is still answered; a command that needs the whole file fails naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typo_on_disk_does_not_lock_the_cli_out_of_the_running_gateway() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = crate::process::gateway_config(
        dir.path(),
        &llm,
        port,
        json!({"tools": {"exec": {"mode": "ask"}}}),
    );
    let d = Daemon::start(dir.path(), &cfg, port).await;
    llm.push(exec_call("t1", "echo yes > typo.txt"));
    llm.push(Reply::Text("ran it".into()));
    let api = d.api.clone();
    let turn = tokio::spawn(async move { api.chat("asker", "make the file").await });
    // The operator edits the file and mistypes a key.
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v["agents"]["defaults"]["modle"] = json!("gpt-4o");
    std::fs::write(&cfg, serde_json::to_string_pretty(&v).unwrap()).unwrap();

    let out = run(dir.path(), &cfg, &["status"]).await;
    assert!(out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning") && err.contains("modle"),
        "{}",
        text(&out)
    );
    let mut id = None;
    for _ in 0..250 {
        let out = run(dir.path(), &cfg, &["approvals", "list", "--json"]).await;
        assert!(out.status.success(), "{}", text(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        if let Some(a) = v["approvals"].as_array().and_then(|a| a.first()) {
            id = a["id"].as_str().map(str::to_string);
            break;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    let id = id.expect("no pending approval listed");
    let out = run(dir.path(), &cfg, &["approvals", "approve", &id]).await;
    assert!(out.status.success(), "{}", text(&out));
    let (s, body) = turn.await.unwrap();
    assert_eq!((s, body["reply"].as_str()), (200, Some("ran it")), "{body}");
    assert!(dir.path().join("ws/typo.txt").exists());

    // A command that needs the whole file fails with the key.
    let out = run(dir.path(), &cfg, &["config", "show"]).await;
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("modle"),
        "{}",
        text(&out)
    );
    drop(d);
}
