//! The first hour of a new user (issue 17, items 1–4), with the real `weft` binary: a direct
//! one-shot exits as soon as it has answered, MCP tools are there on the first turn, the terminal
//! keeps one conversation whichever path serves it, and Ctrl-C cancels the running turn.

use std::io::{BufRead, Read};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use clawft::store::Store;
use clawft::types::SessionKey;
use serde_json::{json, Value};

use crate::common::{config_value, everything_js, last_user, messages, reachable_tools};
use crate::fake_llm::{FakeLlm, Reply};
use crate::process::{free_port, weft, write_config};

/// Generous bound between a one-shot's reply and its exit (the stall it replaces was 5 s).
const EXIT_AFTER_REPLY: Duration = Duration::from_millis(1500);

/// What a finished `weft` run showed.
pub(crate) struct Timed {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// From the first line on stdout to the process's exit.
    pub after_reply: Option<Duration>,
    /// From the spawn to the exit.
    pub total: Duration,
}

/// Run `cmd` with stdout and stderr piped, writing `stdin` (then closing it: Ctrl-D), and note
/// when the first line of stdout arrived.
pub(crate) fn run_timed(mut cmd: Command, stdin: Option<&str>) -> Timed {
    let start = Instant::now();
    let mut child = cmd
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(text) = stdin {
        use std::io::Write;
        let mut w = child.stdin.take().unwrap();
        w.write_all(text.as_bytes()).unwrap();
    }
    let mut err = child.stderr.take().unwrap();
    let errs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let mut first = None;
    let mut stdout = String::new();
    for line in std::io::BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        first.get_or_insert_with(Instant::now);
        stdout.push_str(&line);
        stdout.push('\n');
    }
    let status = child.wait().unwrap();
    let end = Instant::now();
    Timed {
        status,
        stdout,
        stderr: errs.join().unwrap(),
        after_reply: first.map(|f| end - f),
        total: end - start,
    }
}

/// A config file for `weft agent` against `llm`, with an HTTP API on a free port, `extra`
/// merged in.
fn agent_config(dir: &Path, llm: &FakeLlm, extra: Value) -> std::path::PathBuf {
    write_config(
        dir,
        &config_value(
            &llm.base_url(),
            dir,
            crate::common::merged(
                json!({"channels": {"http": {"bind": format!("127.0.0.1:{}", free_port())}}}),
                extra,
            ),
        ),
    )
}

fn agent(dir: &Path, cfg: &Path, args: &[&str]) -> Command {
    let mut c = weft(dir);
    c.arg("--config").arg(cfg).arg("agent").args(args);
    c
}

/// The transcript of `key`, read from the store once no process holds it.
fn transcript(dir: &Path, key: &str) -> Vec<(String, String)> {
    let store = Store::open(&dir.join("store"), 4 << 20).unwrap();
    store
        .load_transcript(&SessionKey::parse(key).unwrap())
        .unwrap()
        .into_iter()
        .map(|m| {
            (
                serde_json::to_value(m.role)
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .to_string(),
                m.content,
            )
        })
        .collect()
}

fn assert_prompt_exit(t: &Timed) {
    assert!(t.status.success(), "{}", t.stderr);
    let after = t.after_reply.expect("no reply on stdout");
    eprintln!("exited {after:?} after its reply (run: {:?})", t.total);
    assert!(
        after < EXIT_AFTER_REPLY,
        "exited {after:?} after its reply (total {:?})\n{}",
        t.total,
        t.stderr
    );
    assert!(!t.stderr.contains("did not stop in time"), "{}", t.stderr);
}

/// Item 1: `weft agent -m` without a gateway exits right after its reply (it used to wait 5 s
/// for the terminal's ingress task and warn), and the reply is in the store after the exit.
#[tokio::test]
async fn a_direct_one_shot_exits_as_soon_as_it_has_answered_and_its_turn_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let cfg = agent_config(dir.path(), &llm, json!({}));
    llm.push(Reply::Text("hello from the model".into()));
    let d = dir.path().to_path_buf();
    let c = cfg.clone();
    let t = tokio::task::spawn_blocking(move || run_timed(agent(&d, &c, &["-m", "hi"]), None))
        .await
        .unwrap();
    assert_prompt_exit(&t);
    assert_eq!(t.stdout.trim(), "hello from the model");
    let tr = transcript(dir.path(), "cli:default");
    assert_eq!(
        tr.last().unwrap(),
        &("assistant".to_string(), "hello from the model".to_string())
    );

    // The same with piped stdin ended by Ctrl-D (end of input).
    llm.push(Reply::Text("second answer".into()));
    let d = dir.path().to_path_buf();
    let t = tokio::task::spawn_blocking(move || run_timed(agent(&d, &cfg, &[]), Some("again\n")))
        .await
        .unwrap();
    assert_prompt_exit(&t);
    assert_eq!(t.stdout.trim(), "second answer");
    let tr = transcript(dir.path(), "cli:default");
    assert_eq!(
        tr.last().unwrap(),
        &("assistant".to_string(), "second answer".to_string())
    );
    // The second turn saw the first (one conversation).
    let reqs = llm.requests();
    assert!(messages(&reqs[1])
        .iter()
        .any(|m| m["content"] == "hello from the model"));
}

/// server-everything, started after `delay_s` seconds (a server slow to connect).
fn everything_after(delay_s: f64) -> Value {
    json!({
        "command": "sh",
        "args": ["-c", format!("sleep {delay_s}; exec node \"$0\" stdio"), everything_js()],
        "internal_only": false,
    })
}

/// Item 2: the first turn of a direct one-shot is offered the tools of an MCP server that is
/// still connecting when the turn starts (here it takes a second), and calls one; a broken
/// server beside it (its command exits at once) delays nothing.
#[tokio::test]
async fn mcp_tools_are_there_on_the_first_turn_of_a_one_shot() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let cfg = agent_config(
        dir.path(),
        &llm,
        json!({"tools": {"mcp_servers": {
            "everything": everything_after(1.0),
            "broken": {"command": "sh", "args": ["-c", "exit 3"]},
        }}}),
    );
    llm.push(Reply::ToolCalls(vec![(
        "m1".into(),
        "everything__echo".into(),
        r#"{"message":"hello through MCP"}"#.into(),
    )]));
    llm.push(Reply::Text("echoed".into()));
    let d = dir.path().to_path_buf();
    let t = tokio::task::spawn_blocking(move || {
        run_timed(agent(&d, &cfg, &["-m", "echo something"]), None)
    })
    .await
    .unwrap();
    assert!(t.status.success(), "{}", t.stderr);
    assert_eq!(t.stdout.trim(), "echoed", "{}", t.stderr);
    let reqs = llm.requests();
    assert!(
        reachable_tools(&reqs[0]).contains(&"everything__echo".to_string()),
        "{:?}\n{}",
        reachable_tools(&reqs[0]),
        t.stderr
    );
    let r = crate::common::tool_results(&reqs[1]);
    assert!(
        r[0].1.to_string().contains("hello through MCP"),
        "{:?}",
        r[0].1
    );
    assert!(!r[0].1.to_string().contains("unknown tool"), "{:?}", r[0].1);
    // Waited for the slow server's first attempt (about 1 s), not for the broken one's
    // reconnects nor the 10 s bound.
    assert!(
        t.total < Duration::from_secs(8),
        "{:?}\n{}",
        t.total,
        t.stderr
    );
}

/// Item 2: a server whose first connection never ends within `tools.mcp_connect_wait_secs`
/// holds a turn for that long only; a failed one holds nothing.
#[tokio::test]
async fn a_broken_or_hanging_mcp_server_delays_a_one_shot_by_the_bound_at_most() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let cfg = agent_config(
        dir.path(),
        &llm,
        json!({"tools": {
            "mcp_connect_wait_secs": 1,
            "mcp_servers": {
                // Never answers `initialize` (its init timeout is far longer than the bound).
                "mute": {"command": "sh", "args": ["-c", "sleep 60"]},
                "missing": {"command": "/nonexistent/mcp-server"},
            },
        }}),
    );
    llm.push(Reply::Text("answered anyway".into()));
    let d = dir.path().to_path_buf();
    let t = tokio::task::spawn_blocking(move || run_timed(agent(&d, &cfg, &["-m", "hi"]), None))
        .await
        .unwrap();
    assert!(t.status.success(), "{}", t.stderr);
    assert_eq!(t.stdout.trim(), "answered anyway");
    assert!(
        t.total < Duration::from_secs(6),
        "{:?}\n{}",
        t.total,
        t.stderr
    );
    assert!(t.stderr.contains("mcp_connect_wait_secs"), "{}", t.stderr);
}

/// Item 2: `/readyz` says "starting" (503, naming the servers) until every MCP server has
/// ended its first attempt, then ready; the first request through the gateway is offered the
/// slow server's tools.
#[tokio::test]
async fn readyz_is_starting_until_mcp_servers_have_made_their_first_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = crate::process::gateway_config(
        dir.path(),
        &llm,
        port,
        json!({"tools": {"mcp_servers": {
            "slow": everything_after(1.5),
            "broken": {"command": "sh", "args": ["-c", "exit 3"]},
        }}}),
    );
    let log = std::fs::File::create(dir.path().join("gateway.log")).unwrap();
    let mut child = weft(dir.path())
        .arg("--config")
        .arg(&cfg)
        .arg("gateway")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    // The control token is written once the daemon runs, before MCP has connected.
    let token = loop {
        if let Some(t) = crate::process::control_token(&cfg) {
            break t;
        }
        assert!(child.try_wait().unwrap().is_none(), "gateway exited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let ready = || async {
        let r = http
            .get(format!("{base}/readyz"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    let (s, v) = ready().await;
    assert_eq!(s, 503, "{v}");
    assert_eq!(v["status"], "starting", "{v}");
    assert_eq!(v["mcp_connecting"], json!(["slow"]), "{v}");
    // Anyone sees the status, not the names.
    let r = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"status": "starting"})
    );

    // A request sent now waits for the slow server and is offered its tools.
    llm.push(Reply::Text("ok".into()));
    let api = crate::common::Api::with_token(&base, Some(&token));
    let (s, body) = api.chat("first", "hello").await;
    assert_eq!(s, 200, "{body}");
    assert!(reachable_tools(&llm.requests()[0]).contains(&"slow__echo".to_string()));

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (s, v) = ready().await;
        if s == 200 {
            assert_eq!(v["status"], "ready");
            break;
        }
        assert!(Instant::now() < deadline, "never ready: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    assert!(child.wait().unwrap().success());
}

/// Item 3: the terminal keeps one conversation (`cli:default`) whichever path serves it: a
/// message answered in-process, then a gateway started and `weft agent -m` through it (the
/// model sees the first exchange), then the gateway stopped and `weft agent -m` in-process
/// again (the model sees both). Ordinary API clients cannot write into `cli:*`.
#[tokio::test]
async fn the_terminal_keeps_one_conversation_with_or_without_a_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = crate::process::gateway_config(
        dir.path(),
        &llm,
        port,
        json!({"channels": {"http": {"token": "operator-token-0123456789"}}}),
    );
    let run = |args: &'static [&'static str]| {
        let d = dir.path().to_path_buf();
        let c = cfg.clone();
        tokio::task::spawn_blocking(move || run_timed(agent(&d, &c, args), None))
    };
    let saw = |req: &Value, text: &str| messages(req).iter().any(|m| m["content"] == text);

    llm.push(Reply::Text("first answer".into()));
    let t = run(&["-m", "first question"]).await.unwrap();
    assert!(t.status.success(), "{}", t.stderr);
    assert!(t.stderr.contains("store opened directly"), "{}", t.stderr);

    let gw = crate::process::Daemon::start(dir.path(), &cfg, port).await;
    llm.push(Reply::Text("second answer".into()));
    let t = run(&["-m", "second question"]).await.unwrap();
    assert!(t.status.success(), "{}", t.stderr);
    assert!(
        t.stderr.contains("using the running gateway"),
        "{}",
        t.stderr
    );
    assert_eq!(t.stdout.trim(), "second answer");
    let reqs = llm.requests();
    assert!(saw(&reqs[1], "first question") && saw(&reqs[1], "first answer"));

    // An ordinary client (the operator's token; a forged sender) cannot write into the
    // terminal's session.
    let anon = crate::common::Api::with_token(
        &format!("http://127.0.0.1:{port}"),
        Some("operator-token-0123456789"),
    );
    for body in [
        json!({"chat_id": "default", "content": "intruder", "channel": "cli"}),
        json!({"chat_id": "default", "content": "intruder", "sender": "weft-terminal"}),
    ] {
        let r = anon
            .http
            .post(format!("{}/v1/chat", anon.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        assert!(status == 403 || status == 400, "{status} {text}");
        assert!(text.contains("weft"), "{text}");
    }
    let r = gw
        .api
        .http
        .post(format!("{}/v1/chat", gw.api.base))
        .json(&json!({"chat_id": "default", "content": "intruder", "channel": "telegram"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let (_, v) = gw.api.get("/v1/sessions").await;
    let keys: Vec<&str> = v["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["cli:default"], "{v}");
    assert_eq!(gw.term().code(), Some(0));

    llm.push(Reply::Text("third answer".into()));
    let t = run(&["-m", "third question"]).await.unwrap();
    assert!(t.status.success(), "{}", t.stderr);
    assert!(t.stderr.contains("store opened directly"), "{}", t.stderr);
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3);
    assert!(saw(&reqs[2], "second question") && saw(&reqs[2], "second answer"));
    assert!(!reqs.iter().any(|r| saw(r, "intruder")));
    let tr = transcript(dir.path(), "cli:default");
    assert_eq!(tr.len(), 6, "{tr:?}");
}

/// Send SIGINT (Ctrl-C) to `child`.
fn ctrl_c(child: &std::process::Child) {
    let pid = rustix::process::Pid::from_child(child);
    rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
}

/// Wait for `child` to exit (at most `within`), collecting its output.
fn exit_within(mut child: std::process::Child, within: Duration) -> (ExitStatus, String, String) {
    let deadline = Instant::now() + within;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut out = String::new();
            let mut err = String::new();
            child
                .stdout
                .take()
                .unwrap()
                .read_to_string(&mut out)
                .unwrap();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (st, out, err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let mut err = String::new();
            let _ = child.wait();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            panic!("still running after {within:?}\n{err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Item 4: Ctrl-C on a direct `weft agent -m` whose model stalls cancels the turn (as `/stop`)
/// and its journal entry, says so and exits; the next `weft agent -m` answers at once and the
/// model is never asked the first message again. The transcript keeps the cancelled message
/// without an answer (as `/stop` leaves it).
#[tokio::test]
async fn ctrl_c_cancels_a_one_shot_turn_which_is_never_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let cfg = agent_config(dir.path(), &llm, json!({}));
    llm.push(Reply::Stall("a long answer that never ends".into()));
    let child = agent(dir.path(), &cfg, &["-m", "first"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(llm.wait_requests(1, Duration::from_secs(20)).await.len(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = Instant::now();
    ctrl_c(&child);
    let (st, _out, err) =
        tokio::task::spawn_blocking(move || exit_within(child, Duration::from_secs(10)))
            .await
            .unwrap();
    assert!(!st.success());
    assert!(err.contains("cancelled (Ctrl-C)"), "{err}");
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "{:?}",
        sent.elapsed()
    );

    llm.push(Reply::Text("second answer".into()));
    let d = dir.path().to_path_buf();
    let c = cfg.clone();
    let t = tokio::task::spawn_blocking(move || run_timed(agent(&d, &c, &["-m", "second"]), None))
        .await
        .unwrap();
    assert!(t.status.success(), "{}", t.stderr);
    assert_eq!(t.stdout.trim(), "second answer");
    assert!(t.total < Duration::from_secs(5), "{:?}", t.total);
    let reqs = llm.requests();
    assert_eq!(
        reqs.iter().map(last_user).collect::<Vec<_>>(),
        ["first", "second"]
    );
    let tr = transcript(dir.path(), "cli:default");
    assert_eq!(
        tr,
        [
            ("user".to_string(), "first".to_string()),
            ("user".to_string(), "second".to_string()),
            ("assistant".to_string(), "second answer".to_string()),
        ]
    );
}

/// A running `weft` whose stdout and stderr are collected as they come.
struct Live {
    child: std::process::Child,
    out: std::sync::Arc<std::sync::Mutex<String>>,
    err: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Live {
    fn spawn(mut cmd: Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let collect = |mut r: Box<dyn Read + Send>| {
            let buf = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
            let b = buf.clone();
            std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n) = r.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    b.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&chunk[..n]));
                }
            });
            buf
        };
        let out = collect(Box::new(child.stdout.take().unwrap()));
        let err = collect(Box::new(child.stderr.take().unwrap()));
        Self { child, out, err }
    }

    fn line(&mut self, text: &str) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(format!("{text}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    async fn wait_out(&self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.out.lock().unwrap().contains(text) {
            assert!(
                Instant::now() < deadline,
                "no `{text}` on stdout\n{}",
                self.err.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Wait for the exit (at most 10 s): status, stdout, stderr.
    async fn exit(mut self) -> (ExitStatus, String, String) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let st = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("still running\n{}", self.err.lock().unwrap());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        // The reader threads end at EOF, right after the exit.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let out = self.out.lock().unwrap().clone();
        let err = self.err.lock().unwrap().clone();
        (st, out, err)
    }
}

/// In the interactive terminal, Ctrl-C during a turn cancels it and returns to the prompt
/// (the next line is answered); Ctrl-C at the idle prompt exits with status 0.
async fn interactive_ctrl_c(with_gateway: bool) {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = crate::process::gateway_config(dir.path(), &llm, port, json!({}));
    let gw = if with_gateway {
        Some(crate::process::Daemon::start(dir.path(), &cfg, port).await)
    } else {
        None
    };
    llm.push(Reply::Stall("never ends".into()));
    llm.push(Reply::Text("second answer".into()));
    let mut live = Live::spawn(agent(dir.path(), &cfg, &[]));
    live.line("first");
    assert_eq!(llm.wait_requests(1, Duration::from_secs(20)).await.len(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    ctrl_c(&live.child);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        live.child.try_wait().unwrap().is_none(),
        "exited on the first Ctrl-C\n{}",
        live.err.lock().unwrap()
    );
    live.line("second");
    // The streamed text shows before the turn ends; the newline after it is printed when the
    // reply is done, and only then is the terminal back at the prompt.
    live.wait_out("second answer\n").await;
    // At the idle prompt now: Ctrl-C exits.
    ctrl_c(&live.child);
    let (st, out, err) = live.exit().await;
    assert!(st.success(), "{err}");
    assert!(err.contains("cancelling the running turn"), "{err}");
    assert!(err.contains("Stopped: the turn was cancelled."), "{err}");
    assert!(out.contains("second answer"), "{out}\n{err}");
    assert_eq!(
        err.contains("using the running gateway"),
        with_gateway,
        "{err}"
    );
    assert_eq!(
        llm.requests().iter().map(last_user).collect::<Vec<_>>(),
        ["first", "second"]
    );
    if let Some(gw) = gw {
        assert_eq!(gw.term().code(), Some(0));
    }
}

/// Item 4, interactive, in-process.
#[tokio::test]
async fn ctrl_c_in_the_interactive_terminal_cancels_then_exits_at_the_prompt() {
    interactive_ctrl_c(false).await;
}

/// Item 4, interactive, through a running gateway.
#[tokio::test]
async fn ctrl_c_in_the_interactive_terminal_through_a_gateway_cancels_then_exits() {
    interactive_ctrl_c(true).await;
}

/// Item 4 through a running gateway: Ctrl-C on `weft agent -m` cancels the turn in the
/// gateway (the session is free at once: the next message is answered) and says so.
#[tokio::test]
async fn ctrl_c_on_a_one_shot_through_a_gateway_cancels_the_turn_there() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = crate::process::gateway_config(dir.path(), &llm, port, json!({}));
    let gw = crate::process::Daemon::start(dir.path(), &cfg, port).await;
    llm.push(Reply::Stall("never ends".into()));
    let child = agent(dir.path(), &cfg, &["-m", "first"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(llm.wait_requests(1, Duration::from_secs(20)).await.len(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    ctrl_c(&child);
    let (st, _out, err) =
        tokio::task::spawn_blocking(move || exit_within(child, Duration::from_secs(10)))
            .await
            .unwrap();
    assert!(!st.success());
    assert!(err.contains("using the running gateway"), "{err}");
    assert!(err.contains("cancelled (Ctrl-C)"), "{err}");

    llm.push(Reply::Text("second answer".into()));
    let d = dir.path().to_path_buf();
    let c = cfg.clone();
    let t = tokio::task::spawn_blocking(move || run_timed(agent(&d, &c, &["-m", "second"]), None))
        .await
        .unwrap();
    assert!(t.status.success(), "{}", t.stderr);
    assert_eq!(t.stdout.trim(), "second answer");
    assert!(t.total < Duration::from_secs(5), "{:?}", t.total);
    assert_eq!(
        llm.requests().iter().map(last_user).collect::<Vec<_>>(),
        ["first", "second"]
    );
    assert_eq!(gw.term().code(), Some(0));
}
