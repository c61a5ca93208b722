//! The `weft` binary as a user runs it: bad configs, one-shot agent, a gateway killed with
//! SIGKILL mid-turn and restarted, CLI commands going through a running gateway.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{config_value, messages, wait_until, Api};
use crate::fake_llm::{check_tool_pairing, FakeLlm, Reply};

const T: Duration = Duration::from_secs(30);

pub fn weft(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weft"));
    c.env_clear()
        .env("HOME", dir)
        .env("CLAWFT_HOME", dir.join(".clawft"))
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null());
    c
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `k` distinct free ports: their listeners are held until all are taken (ports taken one
/// by one may repeat: a NATS server once got the same port for clients and routes).
#[cfg(feature = "cluster")]
pub(crate) fn free_ports(k: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..k)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

pub fn write_config(dir: &Path, v: &Value) -> PathBuf {
    let p = dir.join("config.json");
    std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
    p
}

/// `weft --config CFG ARGS` run in `dir` (its HOME), which must succeed; its stdout parsed as
/// JSON (ARGS end with `--json`).
pub(crate) fn weft_json(dir: &Path, cfg: &Path, args: &[&str]) -> Value {
    let out = weft(dir)
        .arg("--config")
        .arg(cfg)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

pub(crate) struct Daemon {
    pub(crate) child: Child,
    /// The API with the gateway's control token (read from `control.json` in its store).
    pub(crate) api: Api,
}

/// The control token the gateway of config file `cfg` wrote into its store.
pub(crate) fn control_token(cfg: &Path) -> Option<String> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(cfg).ok()?).ok()?;
    let store = PathBuf::from(v["store"]["path"].as_str()?);
    let c: Value = serde_json::from_slice(&std::fs::read(store.join("control.json")).ok()?).ok()?;
    c["token"].as_str().map(str::to_string)
}

impl Drop for Daemon {
    /// A test that fails before stopping its gateway does not leave it running.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Daemon {
    pub(crate) async fn start(dir: &Path, cfg: &Path, port: u16) -> Self {
        Self::start_with_env(dir, cfg, port, &[]).await
    }

    /// As [`Daemon::start`], with these variables in the gateway's environment (a service's
    /// own secrets, which the shell running the other commands does not hold).
    pub(crate) async fn start_with_env(
        dir: &Path,
        cfg: &Path,
        port: u16,
        env: &[(&str, &str)],
    ) -> Self {
        // A file left by a gateway killed with SIGKILL: wait for the new one.
        let stale = control_token(cfg);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("gateway.log"))
            .unwrap();
        let child = weft(dir)
            .envs(env.iter().copied())
            .arg("--config")
            .arg(cfg)
            .arg("gateway")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let api = Api::new(&format!("http://127.0.0.1:{port}"));
        let mut d = Self { child, api };
        let deadline = std::time::Instant::now() + T;
        loop {
            if let Ok(r) = d
                .api
                .http
                .get(format!("{}/readyz", d.api.base))
                .send()
                .await
            {
                if r.status().is_success() {
                    break;
                }
            }
            if let Ok(Some(st)) = d.child.try_wait() {
                panic!("gateway exited: {st}\n{}", log_of(dir));
            }
            assert!(
                std::time::Instant::now() < deadline,
                "gateway not ready\n{}",
                log_of(dir)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Ready: control.json is written just before the gateway says so.
        let deadline = std::time::Instant::now() + T;
        let token = loop {
            if let Some(t) = control_token(cfg).filter(|t| Some(t) != stale.as_ref()) {
                break t;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no control.json\n{}",
                log_of(dir)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        d.api = Api::with_token(&d.api.base, Some(&token));
        d
    }

    /// Its exit status once it exits (a `WEFT_FAULT` point killing it), or `None` if it is
    /// still running after `limit`.
    pub(crate) async fn exited_within(
        &mut self,
        limit: std::time::Duration,
    ) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return Some(st);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    pub(crate) fn kill9(mut self) {
        self.child.kill().unwrap(); // SIGKILL
        self.child.wait().unwrap();
    }

    pub(crate) fn term(mut self) -> std::process::ExitStatus {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        self.child.wait().unwrap()
    }
}

/// A config file for a gateway whose HTTP API listens on `port`, with `extra` merged in.
pub(crate) fn gateway_config(dir: &Path, llm: &FakeLlm, port: u16, extra: Value) -> PathBuf {
    let v = config_value(
        &llm.base_url(),
        dir,
        crate::common::merged(
            json!({"channels": {"http": {"bind": format!("127.0.0.1:{port}")}}}),
            extra,
        ),
    );
    write_config(dir, &v)
}

pub(crate) fn log_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("gateway.log")).unwrap_or_default()
}

#[test]
fn bad_config_files_fail_with_the_key_and_what_is_expected() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "unknown.json",
            r#"{"agents":{"defaults":{"max_tool_iteratons":3}}}"#,
            &["max_tool_iteratons"],
        ),
        (
            "type.toml",
            "[agents.defaults]\nmax_tool_iterations = \"lots\"\n",
            &["max_tool_iterations"],
        ),
        ("syntax.json", r#"{"agents": {"#, &["syntax.json"]),
        (
            "bind.json",
            r#"{"channels":{"http":{"bind":"0.0.0.0:9"}}}"#,
            &["channels.http.bind", "token"],
        ),
        (
            "secret.json",
            r#"{"providers":{"openai":{"api_key_env":"NOT_SET_ANYWHERE"}}}"#,
            &["providers.openai.api_key_env", "NOT_SET_ANYWHERE"],
        ),
    ];
    for (name, text, needles) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        let out = weft(dir.path())
            .arg("--config")
            .arg(&p)
            .arg("status")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name} accepted");
        for n in *needles {
            assert!(err.contains(n), "{name}: `{n}` not in: {err}");
        }
        assert!(!err.contains("panicked"), "{err}");
    }
    let out = weft(dir.path())
        .args(["--config", "/nonexistent/x.json", "status"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
}

#[test]
fn every_command_has_help() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        vec!["--help"],
        vec!["onboard", "--help"],
        vec!["agent", "--help"],
        vec!["gateway", "--help"],
        vec!["status", "--help"],
        vec!["sessions", "--help"],
        vec!["sessions", "list", "--help"],
        vec!["sessions", "show", "--help"],
        vec!["sessions", "clear", "--help"],
    ] {
        let out = weft(dir.path()).args(&args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Usage"),
            "{args:?}"
        );
    }
}

#[test]
fn onboard_writes_config_and_workspace_and_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let out = weft(dir.path()).arg("onboard").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cfg = dir.path().join(".clawft/config.toml");
    assert!(cfg.exists());
    assert!(dir.path().join(".clawft/workspace/memory").is_dir());
    std::fs::write(&cfg, "# mine\n").unwrap();
    let out = weft(dir.path()).arg("onboard").output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    assert_eq!(std::fs::read_to_string(&cfg).unwrap(), "# mine\n");
    let out = weft(dir.path())
        .args(["onboard", "--force"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(std::fs::read_to_string(&cfg)
        .unwrap()
        .contains("max_tool_iterations"));
    // The written config loads.
    let out = weft(dir.path()).arg("status").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn agent_one_shot_prints_the_reply_and_fails_clearly_on_provider_errors() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let cfg = write_config(
        dir.path(),
        &config_value(
            &llm.base_url(),
            dir.path(),
            json!({"channels": {"http": {"bind": format!("127.0.0.1:{}", free_port())}}}),
        ),
    );
    llm.push(Reply::Text("hello from the model".into()));
    let d = dir.path().to_path_buf();
    let c = cfg.clone();
    let out = tokio::task::spawn_blocking(move || {
        weft(&d)
            .arg("--config")
            .arg(&c)
            .args(["agent", "-m", "hi"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.trim(), "hello from the model");
    assert!(String::from_utf8_lossy(&out.stderr).contains("store opened directly"));

    llm.push(Reply::Status(401, None, "invalid api key".into()));
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
    assert!(stderr.contains("authentication failed"), "{stderr}");
}

#[tokio::test]
async fn no_provider_and_nothing_listening_says_what_to_set() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = write_config(
        dir.path(),
        &json!({
            "store": {"path": dir.path().join("store").to_str().unwrap()},
            "agents": {"defaults": {"workspace": dir.path().join("ws").to_str().unwrap()}},
            "channels": {"http": {"bind": format!("127.0.0.1:{}", free_port())}},
        }),
    );
    let d = dir.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        weft(&d)
            .arg("--config")
            .arg(&cfg)
            // Point the local default at a closed port so the test never depends on Ollama.
            .env("OPENAI_BASE_URL", format!("http://127.0.0.1:{port}/v1"))
            .args(["agent", "-m", "hi"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for needle in ["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY"] {
        assert!(stderr.contains(needle), "{stderr}");
    }
}

#[tokio::test]
async fn kill_9_mid_turn_then_restart_answers_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    std::fs::write(dir.path().join("ws/a.txt"), "alpha").unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = gateway_config(dir.path(), &llm, port, json!({}));
    // First life: one tool round completes, then the model hangs and the daemon is killed.
    llm.push(Reply::ToolCalls(vec![(
        "call_a".into(),
        "read_file".into(),
        r#"{"path":"a.txt"}"#.into(),
    )]));
    llm.push(Reply::Hang);
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let api = d.api.clone();
    let pending = tokio::spawn(async move { api.chat("k9", "read a.txt please").await });
    assert!(
        wait_until(T, || llm.requests().len() == 2).await,
        "{}",
        log_of(dir.path())
    );
    // Past sled's background flush interval, so the tool round is on disk.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    d.kill9();
    let _ = pending.await; // the HTTP client sees the connection drop

    // Second life: the journaled message is resumed from the transcript, answered once.
    llm.push(Reply::Text("alpha it is".into()));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    assert!(
        wait_until(T, || llm.requests().len() == 3).await,
        "{}",
        log_of(dir.path())
    );
    let resumed = llm.requests()[2].clone();
    check_tool_pairing(&resumed).unwrap();
    let users: Vec<_> = messages(&resumed)
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(users, ["read a.txt please"]);
    // Wait for the answer to land in the transcript.
    let api = d.api.clone();
    let mut transcript = Value::Null;
    for _ in 0..200 {
        let (s, v) = api.get("/v1/sessions/http:k9").await;
        if s == 200 && v.to_string().contains("alpha it is") {
            transcript = v;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let msgs = transcript["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let roles: Vec<_> = msgs
        .iter()
        .map(|m| m["role"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        roles,
        ["user", "assistant", "tool", "assistant"],
        "{transcript:#}"
    );
    assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));

    // Third life: nothing left to do; the model is not called again.
    let d = Daemon::start(dir.path(), &cfg, port).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(llm.requests().len(), 3);
    assert_eq!(d.term().code(), Some(0));
}

#[tokio::test]
async fn kill_9_before_the_model_answers_replays_the_journaled_message() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = gateway_config(dir.path(), &llm, port, json!({}));
    llm.push(Reply::Hang);
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let api = d.api.clone();
    let pending = tokio::spawn(async move { api.chat("j", "remember me").await });
    // The request reaching the model proves the message was journaled (flushed) first.
    assert!(wait_until(T, || llm.requests().len() == 1).await);
    d.kill9();
    let _ = pending.await;

    llm.push(Reply::Text("remembered".into()));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    assert!(
        wait_until(T, || llm.requests().len() == 2).await,
        "{}",
        log_of(dir.path())
    );
    let users: Vec<_> = messages(&llm.requests()[1])
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(users, ["remember me"]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(llm.requests().len(), 2, "answered more than once");
    assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));
}

#[tokio::test]
async fn cli_commands_use_the_running_gateway_instead_of_the_locked_store() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = gateway_config(dir.path(), &llm, port, json!({}));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    llm.push(Reply::Text("via gateway".into()));
    let run = |args: &'static [&'static str]| {
        let dir = dir.path().to_path_buf();
        let cfg = cfg.clone();
        tokio::task::spawn_blocking(move || {
            weft(&dir)
                .arg("--config")
                .arg(&cfg)
                .args(args)
                .output()
                .unwrap()
        })
    };
    let out = run(&["agent", "-m", "hello"]).await.unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    );
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout.trim(), "via gateway");
    assert!(stderr.contains("using the running gateway"), "{stderr}");

    let out = run(&["status", "--json"]).await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["mode"], "gateway");
    assert_eq!(v["sessions"]["stored"], 1);

    let out = run(&["sessions", "list", "--json"]).await.unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["sessions"][0]["key"], "cli:default");

    let out = run(&["sessions", "show", "cli:default", "--json"])
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["messages"][1]["content"], "via gateway");

    let out = run(&["sessions", "clear", "cli:default", "--json"])
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["cleared"], true);
    let out = run(&["sessions", "show", "cli:default"]).await.unwrap();
    assert!(!out.status.success());

    let out = run(&["sessions", "show", "../etc"]).await.unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid session id"));

    assert_eq!(d.term().code(), Some(0));
    // With the gateway gone, the same commands open the store directly.
    let out = run(&["status", "--json"]).await.unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["mode"], "direct");
}

#[tokio::test]
async fn interactive_agent_reads_lines_streams_and_exits_on_eof() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let cfg = write_config(
        dir.path(),
        &config_value(
            &llm.base_url(),
            dir.path(),
            json!({"channels": {"http": {"bind": format!("127.0.0.1:{}", free_port())}}}),
        ),
    );
    llm.push(Reply::Text("first reply".into()));
    llm.push(Reply::Text("second reply".into()));
    let d = dir.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = weft(&d)
            .arg("--config")
            .arg(&cfg)
            .arg("agent")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"one\ntwo\n").unwrap();
        drop(stdin); // Ctrl-D
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        ["first reply", "second reply"]
    );
    // Deltas were streamed from the provider.
    assert_eq!(llm.requests()[0]["stream"], true);
}

#[tokio::test]
async fn planted_keys_never_reach_the_logs_even_at_trace_level() {
    use crate::tools::{planted_file, PLANTED};
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    std::fs::write(dir.path().join("ws/leak.txt"), planted_file()).unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = gateway_config(dir.path(), &llm, port, json!({}));
    llm.push(Reply::ToolCalls(vec![(
        "c1".into(),
        "read_file".into(),
        r#"{"path":"leak.txt"}"#.into(),
    )]));
    llm.push(Reply::EchoToolResults);
    // Everything the daemon can log, as JSON (what a log shipper would keep).
    std::fs::write(dir.path().join("gateway.log"), "").unwrap();
    let d = {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("gateway.log"))
            .unwrap();
        let child = weft(dir.path())
            .env("RUST_LOG", "trace")
            .args(["--log-format", "json", "--config"])
            .arg(&cfg)
            .arg("gateway")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        assert!(
            wait_until(T, || control_token(&cfg).is_some()).await,
            "{}",
            log_of(dir.path())
        );
        let api = Api::with_token(
            &format!("http://127.0.0.1:{port}"),
            control_token(&cfg).as_deref(),
        );
        Daemon { child, api }
    };
    let token = control_token(&cfg).unwrap();
    let (s, body) = d.api.chat("leak", "read leak.txt").await;
    assert_eq!(s, 200, "{body}");
    assert!(body["reply"].as_str().unwrap().contains("[REDACTED]"));
    assert_eq!(d.term().code(), Some(0));
    let log = log_of(dir.path());
    // The log is not empty: trace level really logged the turn.
    assert!(log.contains("tool"), "{log}");
    for key in PLANTED {
        assert!(!log.contains(key), "{key} in the logs");
    }
    assert!(!log.contains(&token), "the control token is in the logs");
}

#[test]
fn tools_list_and_call_use_the_configured_policy_and_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("hello.txt"), "héllo\n").unwrap();
    std::fs::write(dir.path().join("outside.txt"), "outside-secret").unwrap();
    let cfg = write_config(
        dir.path(),
        &json!({
            "agents": {"defaults": {"workspace": ws.to_str().unwrap()}},
            "store": {"path": dir.path().join("store").to_str().unwrap()},
            "tools": {"policy": {"deny": ["web_fetch"]}},
        }),
    );
    let out = weft(dir.path())
        .arg("--config")
        .arg(&cfg)
        .args(["tools", "list", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = |n: &str| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == n)
            .cloned()
            .unwrap_or_else(|| panic!("{n} not listed: {rows}"))
    };
    assert_eq!(row("web_fetch")["allowed"], false);
    assert_eq!(row("read_file")["allowed"], true);
    assert_eq!(row("exec_shell")["group"], "runtime");
    assert!(row("read_file")["parameters"]
        .as_str()
        .unwrap()
        .contains("path*"));

    let call = |name: &str, args: Value| {
        let out = weft(dir.path())
            .arg("--config")
            .arg(&cfg)
            .args(["tools", "call", name, "--args", &args.to_string()])
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stdout)));
        (out.status.code(), v)
    };
    let (code, v) = call("read_file", json!({"path": "hello.txt"}));
    assert_eq!((code, v["content"].as_str()), (Some(0), Some("héllo\n")));
    let (code, v) = call("read_file", json!({"path": "../outside.txt"}));
    assert_eq!(
        (code, v["error_code"].as_str()),
        (Some(1), Some("INVALID_PATH"))
    );
    let (code, v) = call("web_fetch", json!({"url": "https://example.com"}));
    assert_eq!(
        (code, v["error_code"].as_str()),
        (Some(1), Some("PERMISSION_DENIED"))
    );
    let (code, v) = call(
        "exec_shell",
        json!({"command": "cat ../outside.txt; echo done"}),
    );
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["stdout"], "done\n");
    assert!(!v.to_string().contains("outside-secret"));
}

#[tokio::test]
async fn send_and_pairing_go_through_the_running_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = gateway_config(dir.path(), &llm, port, json!({}));
    let run = |args: Vec<&'static str>| {
        let dir = dir.path().to_path_buf();
        let cfg = cfg.clone();
        tokio::task::spawn_blocking(move || {
            weft(&dir)
                .arg("--config")
                .arg(&cfg)
                .args(args)
                .output()
                .unwrap()
        })
    };
    // Without a gateway, `send` says what to do.
    let out = run(vec!["send", "http", "room1", "hello"]).await.unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs a running gateway"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Pairing works on the store directly: text for people, JSON for scripts.
    let out = run(vec!["pairing", "list"]).await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "no pairing requests waiting\nno paired senders\n"
    );
    let out = run(vec!["pairing", "list", "--json"]).await.unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["pending"], json!([]));

    let d = Daemon::start(dir.path(), &cfg, port).await;
    let out = run(vec!["send", "http", "room1", "deploy **done**"])
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("queued for http:room1 (message "),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let mut got = Vec::new();
    for _ in 0..100 {
        let (_, v) = d.api.get("/v1/chats/room1/messages").await;
        got.extend(v["messages"].as_array().cloned().unwrap_or_default());
        if !got.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["content"], "deploy **done**");
    let out = run(vec!["send", "nowhere", "c", "x"]).await.unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("running channels: http"));
    let out = run(vec!["pairing", "approve", "NOSUCHCODE"]).await.unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no pending pairing code"));
    assert_eq!(d.term().code(), Some(0));
}

/// A platform the kill -9 test drives: where to point the gateway, how to send a user
/// message, and what the bot has posted so far.
struct PlatformCase {
    section: (&'static str, Value),
    push: Box<dyn Fn() -> String>,
    posted: Box<dyn Fn() -> Vec<String>>,
}

/// The gateway accepts a message, is killed with SIGKILL before it answers, restarts, and the
/// user gets exactly one answer on the platform.
async fn kill_9_after_accepting_then_restart_answers_once(case: PlatformCase) {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let (name, section) = case.section;
    let cfg = write_config(
        dir.path(),
        &config_value(
            &llm.base_url(),
            dir.path(),
            json!({"channels": {"http": {"bind": format!("127.0.0.1:{port}")}, name: section}}),
        ),
    );
    llm.push(Reply::Hang);
    let d = Daemon::start(dir.path(), &cfg, port).await;
    (case.push)();
    // The model being asked proves the message was accepted (journaled and acknowledged).
    assert!(
        wait_until(T, || llm.requests().len() == 1).await,
        "{}",
        log_of(dir.path())
    );
    d.kill9();
    assert!((case.posted)().is_empty());

    llm.push(Reply::Text("answered after the crash".into()));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    assert!(
        wait_until(T, || (case.posted)()
            .iter()
            .any(|t| t.contains("answered after the crash")))
        .await,
        "no answer after restart: {:?}\n{}",
        (case.posted)(),
        log_of(dir.path())
    );
    // Give a duplicate every chance to show up.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let answers = (case.posted)()
        .iter()
        .filter(|t| t.contains("answered after the crash"))
        .count();
    assert_eq!(answers, 1, "{:?}", (case.posted)());
    let users: Vec<_> = messages(llm.requests().last().unwrap())
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(users, ["are you there?"]);
    assert_eq!(
        llm.requests().len(),
        2,
        "the model was asked more than once after restart"
    );
    assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));
}

#[tokio::test]
async fn telegram_kill_9_after_accepting_then_restart_answers_once() {
    use clawft_channel_telegram::fake::FakeTelegram;
    let tg = std::sync::Arc::new(FakeTelegram::start().await);
    let (a, b) = (tg.clone(), tg.clone());
    kill_9_after_accepting_then_restart_answers_once(PlatformCase {
        section: (
            "telegram",
            json!({"token": FakeTelegram::TOKEN, "api_url": tg.api_url(), "allow_from": [111], "stream_edits": false}),
        ),
        push: Box::new(move || a.push_user_message(111, 111, "are you there?")),
        posted: Box::new(move || b.sent().into_iter().map(|m| m.visible).collect()),
    })
    .await;
}

#[tokio::test]
async fn discord_kill_9_after_accepting_then_restart_answers_once() {
    use clawft_channel_discord::fake::{FakeDiscord, FAKE_TOKEN};
    let dc = std::sync::Arc::new(FakeDiscord::start().await);
    let (a, b) = (dc.clone(), dc.clone());
    kill_9_after_accepting_then_restart_answers_once(PlatformCase {
        section: (
            "discord",
            json!({"token": FAKE_TOKEN, "proxy": dc.base_url(), "allow_from": ["111"], "stream_edits": false}),
        ),
        push: Box::new(move || a.push_user_message("500", "111", "are you there?")),
        posted: Box::new(move || b.sent().into_iter().map(|m| m.text).collect()),
    })
    .await;
}

#[tokio::test]
async fn slack_kill_9_after_accepting_then_restart_answers_once() {
    use clawft_channel_slack::fake::{FakeSlack, APP_TOKEN, BOT_TOKEN};
    let sl = std::sync::Arc::new(FakeSlack::start().await);
    let (a, b) = (sl.clone(), sl.clone());
    kill_9_after_accepting_then_restart_answers_once(PlatformCase {
        section: (
            "slack",
            json!({"token": BOT_TOKEN, "app_token": APP_TOKEN, "api_url": sl.api_url(), "allow_from": ["U111"], "stream_edits": false}),
        ),
        push: Box::new(move || a.push_user_message("D111", "U111", "are you there?")),
        posted: Box::new(move || b.sent().into_iter().map(|m| m.text).collect()),
    })
    .await;
}

#[tokio::test]
async fn doctor_names_each_problem_of_a_broken_setup_and_passes_a_good_one() {
    use clawft_channel_telegram::fake::FakeTelegram;
    use std::os::unix::fs::PermissionsExt;
    let tg = FakeTelegram::start().await;
    let llm = FakeLlm::start().await;
    let dir = tempfile::tempdir().unwrap();
    let dead = free_port();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_port = busy.local_addr().unwrap().port();
    let broken = write_config(
        dir.path(),
        &json!({
            "agents": {"defaults": {"workspace": dir.path().join("ws").to_str().unwrap()}},
            "store": {"path": dir.path().join("store").to_str().unwrap()},
            "providers": {"openai": {"base_url": format!("http://127.0.0.1:{dead}/v1"), "api_key": "sk-test-doctor-123456"}},
            "channels": {
                "http": {"bind": format!("127.0.0.1:{busy_port}")},
                "telegram": {"token": "999:WRONG-doctor-token-abcdefghijklmnop", "api_url": tg.api_url(), "allow_from": [1]},
            },
            "tools": {"mcp_servers": {"ghost": {"command": "/nonexistent/mcp"}}},
        }),
    );
    std::fs::set_permissions(&broken, std::fs::Permissions::from_mode(0o644)).unwrap();
    let run = |cfg: PathBuf| {
        let d = dir.path().to_path_buf();
        tokio::task::spawn_blocking(move || {
            weft(&d)
                .arg("--config")
                .arg(&cfg)
                .args(["doctor", "--json"])
                .output()
                .unwrap()
        })
    };
    let out = run(broken.clone()).await.unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    let find = |check: &str| -> Value {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["check"] == check)
            .cloned()
            .unwrap_or_else(|| panic!("no {check} finding: {rows:#}"))
    };
    assert_eq!(find("provider openai")["level"], "fail");
    assert!(find("provider openai")["detail"]
        .as_str()
        .unwrap()
        .contains("unreachable"));
    assert_eq!(find("channel telegram")["level"], "fail");
    assert!(find("channel telegram")["detail"]
        .as_str()
        .unwrap()
        .contains("channels.telegram.token"));
    assert_eq!(find("mcp ghost")["level"], "fail");
    assert_eq!(find("config permissions")["level"], "warn");
    assert!(find("config permissions")["detail"]
        .as_str()
        .unwrap()
        .contains("chmod 600"));
    assert_eq!(find("http")["level"], "fail");
    assert!(
        !out.stdout.windows(12).any(|w| w == b"WRONG-doctor"),
        "token printed"
    );
    drop(busy);

    // A good setup passes.
    let good = write_config(
        dir.path(),
        &json!({
            "agents": {"defaults": {"workspace": dir.path().join("ws").to_str().unwrap()}},
            "store": {"path": dir.path().join("store").to_str().unwrap()},
            "providers": {"openai": {"base_url": llm.base_url(), "api_key": "sk-test-doctor-123456"}},
            "channels": {
                "http": {"bind": format!("127.0.0.1:{}", free_port())},
                "telegram": {"token": FakeTelegram::TOKEN, "api_url": tg.api_url(), "allow_from": [1]},
            },
        }),
    );
    std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = run(good).await.unwrap();
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{rows:#}");
    assert!(rows
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["level"] != "fail"));
}

#[test]
fn doctor_reports_a_broken_config_file_as_a_failed_check() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("config.toml");
    std::fs::write(&p, "[agents.defaults]\nmax_tool_iterations = \"many\"\n").unwrap();
    let out = weft(dir.path())
        .arg("--config")
        .arg(&p)
        .arg("doctor")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("fail") && stdout.contains("max_tool_iterations"),
        "{stdout}"
    );
}

#[tokio::test]
async fn sigterm_mid_turn_lets_the_turn_finish_delivers_the_reply_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = write_config(
        dir.path(),
        &config_value(
            &llm.base_url(),
            dir.path(),
            json!({"channels": {"http": {"bind": format!("127.0.0.1:{port}")}},
                   "sessions": {"shutdown_grace_secs": 10}}),
        ),
    );
    llm.push(Reply::Delay(
        Duration::from_millis(1500),
        Box::new(Reply::Text("finished during shutdown".into())),
    ));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let api = d.api.clone();
    let pending = tokio::spawn(async move { api.chat("t", "slow question").await });
    assert!(wait_until(T, || llm.requests().len() == 1).await);
    let started = std::time::Instant::now();
    let status = tokio::task::spawn_blocking(move || d.term()).await.unwrap();
    assert_eq!(status.code(), Some(0), "{}", log_of(dir.path()));
    let (s, body) = pending.await.unwrap();
    assert_eq!(
        (s, body["reply"].as_str()),
        (200, Some("finished during shutdown")),
        "{body}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // Nothing is left to replay: a restart does not ask the model again.
    let d = Daemon::start(dir.path(), &cfg, port).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(llm.requests().len(), 1);
    assert_eq!(d.term().code(), Some(0));
}

#[tokio::test]
async fn under_journald_log_lines_carry_their_priority_and_no_timestamp() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = write_config(
        dir.path(),
        &config_value(
            &llm.base_url(),
            dir.path(),
            json!({"channels": {"http": {"bind": format!("127.0.0.1:{port}")}},
                   "tools": {"mcp_servers": {"empty": {}}}}),
        ),
    );
    let log = std::fs::File::create(dir.path().join("gateway.log")).unwrap();
    let mut child = weft(dir.path())
        .env("JOURNAL_STREAM", "8:12345")
        .arg("--config")
        .arg(&cfg)
        .arg("gateway")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    assert!(
        wait_until(T, || log_of(dir.path()).contains("gateway ready")).await,
        "{}",
        log_of(dir.path())
    );
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    let text = log_of(dir.path());
    let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    assert!(lines.iter().all(|l| l.starts_with('<')), "{text}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("<4>") && l.contains("skipped")),
        "{text}"
    );
    assert!(lines
        .iter()
        .any(|l| l.starts_with("<6>") && l.contains("gateway ready")));
    // No timestamp: journald adds its own.
    assert!(
        !lines.iter().any(|l| l.contains("Z ") && l.contains("20")),
        "{text}"
    );
}

#[tokio::test]
async fn sighup_reloads_the_policy_without_dropping_sessions_and_rejects_a_bad_config() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    std::fs::write(dir.path().join("ws/a.txt"), "alpha").unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let base = |extra: Value| {
        config_value(
            &llm.base_url(),
            dir.path(),
            crate::common::merged(
                json!({"channels": {"http": {"bind": format!("127.0.0.1:{port}")}}}),
                extra,
            ),
        )
    };
    let cfg = write_config(
        dir.path(),
        &base(json!({"tools": {"policy": {"deny": ["read_file"]}}})),
    );
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let read = || {
        Reply::ToolCalls(vec![(
            "r".into(),
            "read_file".into(),
            r#"{"path":"a.txt"}"#.into(),
        )])
    };
    llm.push(read());
    llm.push(Reply::Text("first".into()));
    assert_eq!(d.api.chat("s", "read it").await.0, 200);
    let denied = crate::common::tool_results(&llm.requests()[1]);
    assert_eq!(denied[0].1["error_code"], "PERMISSION_DENIED");

    let pid = rustix::process::Pid::from_child(&d.child);
    let hup = || rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    write_config(dir.path(), &base(json!({})));
    hup();
    assert!(
        wait_until(T, || log_of(dir.path())
            .contains("policy, limits and tool settings reloaded"))
        .await,
        "{}",
        log_of(dir.path())
    );
    llm.push(read());
    llm.push(Reply::Text("second".into()));
    assert_eq!(d.api.chat("s", "read it again").await.0, 200);
    let reqs = llm.requests();
    assert_eq!(
        crate::common::tool_results(&reqs[3])[1].1["content"],
        "alpha"
    );
    // The session kept its history across the reload.
    let users: Vec<_> = messages(&reqs[3])
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(users, ["read it", "read it again"]);

    // A config that does not load is rejected and the running one stays.
    std::fs::write(&cfg, "{ not json").unwrap();
    hup();
    assert!(
        wait_until(T, || log_of(dir.path())
            .contains("new configuration rejected"))
        .await,
        "{}",
        log_of(dir.path())
    );
    llm.push(read());
    llm.push(Reply::Text("third".into()));
    assert_eq!(d.api.chat("s", "once more").await.0, 200);
    assert_eq!(
        crate::common::tool_results(&llm.requests()[5])
            .last()
            .unwrap()
            .1["content"],
        "alpha"
    );
    assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));
}

#[tokio::test]
async fn sighup_starts_and_restarts_chat_channels_with_their_new_settings() {
    use clawft_channel_telegram::fake::FakeTelegram;
    let tg = FakeTelegram::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let telegram = |allow: Value| json!({"token": FakeTelegram::TOKEN, "api_url": tg.api_url(), "allow_from": allow, "stream_edits": false});
    let with = |section: Option<Value>| {
        let mut channels = json!({"http": {"bind": format!("127.0.0.1:{port}")}});
        if let Some(t) = section {
            channels["telegram"] = t;
        }
        config_value(&llm.base_url(), dir.path(), json!({ "channels": channels }))
    };
    // Start without Telegram; SIGHUP adds it.
    let cfg = write_config(dir.path(), &with(None));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let pid = rustix::process::Pid::from_child(&d.child);
    let hup = || rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    write_config(dir.path(), &with(Some(telegram(json!([111])))));
    hup();
    assert!(
        wait_until(T, || log_of(dir.path())
            .contains("channel telegram started"))
        .await,
        "{}",
        log_of(dir.path())
    );
    llm.push(Reply::Text("hello 111".into()));
    tg.push_user_message(111, 111, "hi");
    assert!(wait_until(T, || tg.sent().iter().any(|m| m.visible == "hello 111")).await);
    // 222 is refused until a reload admits it.
    tg.push_user_message(222, 222, "me too");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(llm.requests().len(), 1);
    write_config(dir.path(), &with(Some(telegram(json!([111, 222])))));
    hup();
    assert!(
        wait_until(T, || log_of(dir.path())
            .contains("channel telegram restarted"))
        .await,
        "{}",
        log_of(dir.path())
    );
    llm.push(Reply::Text("hello 222".into()));
    tg.push_user_message(222, 222, "now?");
    assert!(
        wait_until(T, || tg.sent().iter().any(|m| m.visible == "hello 222")).await,
        "{:?}\n{}",
        tg.sent(),
        log_of(dir.path())
    );
    assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));
}

/// Issue 13's reload bug: the `message` tool kept the channel list of start-up, so after a
/// SIGHUP that added Telegram it answered "no channel `telegram` is running" although the
/// channel was up. The tool now reads the daemon's one live channel table.
#[tokio::test]
async fn after_a_reload_adds_telegram_the_message_tool_reaches_it() {
    use clawft_channel_telegram::fake::FakeTelegram;
    let tg = FakeTelegram::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let with = |telegram: bool| {
        let mut channels = json!({"http": {"bind": format!("127.0.0.1:{port}")}});
        if telegram {
            channels["telegram"] = json!({"token": FakeTelegram::TOKEN, "api_url": tg.api_url(), "allow_from": [111], "stream_edits": false});
        }
        config_value(
            &llm.base_url(),
            dir.path(),
            json!({ "channels": channels, "tools": {"message": {"allow": ["telegram:555"]}} }),
        )
    };
    let cfg = write_config(dir.path(), &with(false));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    write_config(dir.path(), &with(true));
    let pid = rustix::process::Pid::from_child(&d.child);
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    assert!(
        wait_until(T, || log_of(dir.path())
            .contains("channel telegram started"))
        .await,
        "{}",
        log_of(dir.path())
    );
    llm.push(Reply::ToolCalls(vec![(
        "m1".into(),
        "message".into(),
        json!({"channel": "telegram", "chat_id": "555", "content": "the build is green"})
            .to_string(),
    )]));
    llm.push(Reply::Text("told telegram".into()));
    let (s, body) = d.api.chat("ops", "tell telegram").await;
    assert_eq!(s, 200, "{body}");
    let result = crate::common::tool_results(&llm.requests()[1]);
    assert_eq!(result[0].1["status"], "sent", "{:?}", result[0].1);
    assert!(
        wait_until(T, || tg
            .sent()
            .iter()
            .any(|m| m.chat == 555 && m.visible == "the build is green"))
        .await,
        "{:?}",
        tg.sent()
    );
    assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));
}

#[tokio::test]
async fn subagents_interrupted_by_kill_9_or_shutdown_are_failed_and_their_parent_is_told_once() {
    const ANNOUNCE: &str = "[Automatic message from the gateway";
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.route(|req| {
        let msgs = messages(req);
        let system = msgs[0]["content"].as_str().unwrap_or("").to_string();
        if system.contains("You are a subagent") {
            return Some(Reply::Hang);
        }
        let last = msgs.last().unwrap();
        if last["role"] == "tool" {
            return Some(Reply::Text("started".into()));
        }
        let text = last["content"].as_str().unwrap_or("");
        if text.starts_with(ANNOUNCE) {
            return Some(Reply::Text("your helper was interrupted".into()));
        }
        Some(Reply::ToolCalls(vec![(
            "s".into(),
            "subagents".into(),
            json!({"action": "spawn", "task": format!("TASK {text}")}).to_string(),
        )]))
    });
    let woken = |llm: &FakeLlm| -> Vec<String> {
        llm.requests()
            .iter()
            .filter_map(|r| {
                let m = messages(r);
                let last = m.last()?["content"].as_str()?.to_string();
                last.starts_with(ANNOUNCE).then_some(last)
            })
            .collect()
    };
    let children = |llm: &FakeLlm| {
        llm.requests()
            .iter()
            .filter(|r| r.to_string().contains("You are a subagent"))
            .count()
    };
    let port = free_port();
    let cfg = gateway_config(dir.path(), &llm, port, json!({}));

    // First life: a child is running (its model hangs) when the daemon is killed.
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let (s, body) = d.api.chat("p", "one").await;
    assert_eq!(
        (s, body["reply"].as_str()),
        (200, Some("started")),
        "{body}"
    );
    assert!(wait_until(T, || children(&llm) == 1).await);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    d.kill9();

    // Second life: the child is failed and the parent woken with it, once.
    let d = Daemon::start(dir.path(), &cfg, port).await;
    assert!(
        wait_until(T, || woken(&llm).len() == 1).await,
        "{}",
        log_of(dir.path())
    );
    assert!(
        woken(&llm)[0].contains("interrupted by restart"),
        "{:?}",
        woken(&llm)
    );
    let mut mailbox = Vec::new();
    for _ in 0..200 {
        let (_, mb) = d.api.get("/v1/chats/p/messages").await;
        mailbox.extend(mb["messages"].as_array().cloned().unwrap_or_default());
        if !mailbox.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(mailbox.len(), 1, "{mailbox:?}");
    assert_eq!(mailbox[0]["content"], "your helper was interrupted");
    // Another child is running at a graceful shutdown.
    let (s, _) = d.api.chat("p", "two").await;
    assert_eq!(s, 200);
    assert!(wait_until(T, || children(&llm) == 2).await);
    assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));

    // Third life: that one is reported as interrupted by the shutdown; the first is not
    // reported again.
    let d = Daemon::start(dir.path(), &cfg, port).await;
    assert!(
        wait_until(T, || woken(&llm).len() == 2).await,
        "{}",
        log_of(dir.path())
    );
    let w = woken(&llm);
    assert!(w[1].contains("the gateway shut down"), "{w:?}");
    assert!(!w[1].contains("interrupted by restart"), "{w:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(woken(&llm).len(), 2, "announced more than once");
    assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));
}

#[test]
fn rust_log_target_directives_select_the_dependencies_log_records() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &json!({
            "agents": {"defaults": {"workspace": dir.path().join("ws").to_str().unwrap()}},
            "store": {"path": dir.path().join("store").to_str().unwrap()},
        }),
    );
    // sled logs through the `log` crate; "load_snapshot" is one of its debug records at open.
    let sled_debug_lines = |rust_log: &str| {
        let out = weft(dir.path())
            .env("RUST_LOG", rust_log)
            .arg("--config")
            .arg(&cfg)
            .args(["store", "check"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| l.contains("load_snapshot"))
            .count()
    };
    assert!(sled_debug_lines("warn,sled=debug") > 0);
    assert_eq!(sled_debug_lines("debug,sled=info"), 0);
    assert_eq!(sled_debug_lines("warn,clawft=debug"), 0);
    assert_eq!(sled_debug_lines("info"), 0);
    // Unparsable: the command's default level (warn), not everything.
    assert_eq!(sled_debug_lines("sled=chatty"), 0);
}

/// SIGTERM every node still running and assert each shut down cleanly (exit 0); a node that
/// did not is named with its exit status and its log.
#[cfg(feature = "cluster")]
pub(crate) fn term_all(nodes: Vec<Option<Daemon>>, dirs: &[tempfile::TempDir]) {
    for (i, n) in nodes.into_iter().enumerate() {
        if let Some(n) = n {
            let st = n.term();
            assert_eq!(
                st.code(),
                Some(0),
                "node {} did not shut down cleanly: {st}\n{}",
                i + 1,
                log_of(dirs[i].path())
            );
        }
    }
}
