//! MCP tests against REAL servers from npm (`tests/mcp`, installed with
//! `npm ci --prefix tests/mcp`) and the TypeScript SDK client. They fail, not skip, when the
//! packages are missing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::tools::registry::ToolSource;
use crate::tools::{Tool, ToolContext, ToolError, ToolRegistry, Workspace};
use crate::types::SessionKey;

const WAIT: Duration = Duration::from_secs(20);

fn npm_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp")
}

/// `tests/mcp/node_modules/...`, asserting it is installed.
fn module(rel: &str) -> String {
    let p = npm_dir().join("node_modules").join(rel);
    assert!(
        p.exists(),
        "{} is missing: run `npm ci --prefix tests/mcp` (the MCP tests use real npm servers)",
        p.display()
    );
    p.to_string_lossy().into_owned()
}

fn script(name: &str) -> String {
    module("@modelcontextprotocol/sdk/package.json");
    npm_dir().join(name).to_string_lossy().into_owned()
}

fn child_env(home: &Path) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
        ("HOME".into(), home.to_string_lossy().into_owned()),
    ])
}

fn everything(name: &str, home: &Path) -> McpServerSettings {
    let entry = module("@modelcontextprotocol/server-everything/dist/index.js");
    McpServerSettings::stdio(name, "node", &[&entry, "stdio"], child_env(home))
}

fn test_server(name: &str, home: &Path) -> McpServerSettings {
    let s = script("test-server.mjs");
    McpServerSettings::stdio(name, "node", &[&s], child_env(home))
}

fn fast() -> McpOptions {
    McpOptions {
        backoff_initial: Duration::from_millis(100),
        backoff_max: Duration::from_millis(400),
        stop_grace: Duration::from_millis(300),
        ..McpOptions::default()
    }
}

fn ctx(dir: &Path) -> ToolContext {
    ToolContext {
        workspace: Arc::new(Workspace::open(dir).unwrap()),
        session: SessionKey::parse("t:1").unwrap(),
        cancel: CancellationToken::new(),
        user_dir: None,
        sender: None,
        call_id: None,
        turn: Default::default(),
    }
}

fn status(m: &McpManager, name: &str) -> McpServerStatus {
    m.status().into_iter().find(|s| s.name == name).unwrap()
}

async fn wait_state(m: &McpManager, name: &str, state: McpState) -> McpServerStatus {
    let ok = m
        .wait_for(
            |st| st.iter().any(|s| s.name == name && s.state == state),
            WAIT,
        )
        .await;
    assert!(ok, "{name} never became {state:?}: {:?}", m.status());
    status(m, name)
}

fn tool(m: &McpManager, name: &str) -> Arc<dyn Tool> {
    m.tools()
        .into_iter()
        .find(|t| t.tool.name() == name)
        .unwrap_or_else(|| panic!("no tool {name}"))
        .tool
}

/// Running (not a zombie, not gone).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

async fn wait_dead(pid: u32) {
    let t = Instant::now();
    while alive(pid) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "process {pid} is still running"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

#[tokio::test]
async fn stdio_everything_discovery_namespacing_and_calls() {
    let home = tempfile::tempdir().unwrap();
    let mut s = everything("everything", home.path());
    s.internal_only = false;
    let started = Instant::now();
    let m = McpManager::start(vec![s], fast());
    assert!(
        started.elapsed() < Duration::from_millis(200),
        "start blocked"
    );
    let st = wait_state(&m, "everything", McpState::Connected).await;
    assert!(st.tools >= 5, "{st:?}");
    assert_eq!(st.transport, "stdio");
    let pid = st.pid.unwrap();
    assert!(alive(pid));
    let reg = ToolRegistry::new().with_source(m.clone());
    let names = reg.allowed_names();
    for n in [
        "everything__echo",
        "everything__get-sum",
        "everything__get-tiny-image",
    ] {
        assert!(names.contains(&n.to_string()), "{names:?}");
    }
    // Schemas are passed through.
    let echo = tool(&m, "everything__echo");
    assert_eq!(echo.parameters()["properties"]["message"]["type"], "string");
    let d = tempfile::tempdir().unwrap();
    let c = ctx(d.path());
    let o = reg
        .dispatch(
            "everything__echo",
            "1",
            r#"{"message":"héllo wörld 🌍"}"#,
            &c,
        )
        .await;
    assert_eq!(o.content(), json!("Echo: héllo wörld 🌍").to_string());
    let o = reg
        .dispatch("everything__echo", "2", r#"{"message":""}"#, &c)
        .await;
    assert_eq!(o.content(), json!("Echo: ").to_string());
    let big = "x".repeat(200_000);
    let o = reg
        .dispatch(
            "everything__echo",
            "3",
            &json!({ "message": big }).to_string(),
            &c,
        )
        .await;
    assert!(o.error.is_none());
    assert!(o.content().len() <= crate::tools::MAX_TOOL_RESULT_BYTES + 200);
    let o = reg
        .dispatch("everything__get-sum", "4", r#"{"a":2,"b":3}"#, &c)
        .await;
    assert!(o.content().contains("is 5"), "{}", o.content());
    let o = reg
        .dispatch("everything__get-tiny-image", "5", "{}", &c)
        .await;
    assert!(
        o.content().contains("[image: image/png, "),
        "{}",
        o.content()
    );
    let o = reg
        .dispatch(
            "everything__get-structured-content",
            "6",
            r#"{"location":"Chicago"}"#,
            &c,
        )
        .await;
    let v: Value = o.value.clone();
    assert!(v["temperature"].is_number(), "{v}");
    // Invalid arguments come back as the server's error.
    let o = reg
        .dispatch("everything__get-sum", "7", r#"{"a":"x"}"#, &c)
        .await;
    assert_eq!(o.error.unwrap().code(), "EXECUTION_FAILED");
    let e = echo.execute(json!([1]), &c).await.unwrap_err();
    assert_eq!(e.code(), "INVALID_ARGS");
    m.shutdown().await;
    wait_dead(pid).await;
    assert!(m.tools().is_empty());
}

#[tokio::test]
async fn stdio_filesystem_is_confined_to_its_directory() {
    let home = tempfile::tempdir().unwrap();
    let allowed = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(allowed.path().join("in.txt"), "inside ✓").unwrap();
    let canary = outside.path().join("canary.txt");
    std::fs::write(&canary, "CANARY-7f3a").unwrap();
    let entry = module("@modelcontextprotocol/server-filesystem/dist/index.js");
    let dir = allowed.path().canonicalize().unwrap();
    let dir = dir.to_string_lossy();
    let m = McpManager::start(
        vec![McpServerSettings::stdio(
            "fs",
            "node",
            &[&entry, &dir],
            child_env(home.path()),
        )],
        fast(),
    );
    wait_state(&m, "fs", McpState::Connected).await;
    let c = ctx(home.path());
    let read = tool(&m, "fs__read_text_file");
    let v = read
        .execute(json!({"path": format!("{dir}/in.txt")}), &c)
        .await
        .unwrap();
    assert_eq!(v, json!({"content": "inside ✓"}));
    for p in [
        canary.to_string_lossy().into_owned(),
        format!(
            "{dir}/../{}/canary.txt",
            outside.path().file_name().unwrap().to_string_lossy()
        ),
    ] {
        let e = read.execute(json!({ "path": p }), &c).await.unwrap_err();
        assert_eq!(e.code(), "EXECUTION_FAILED");
        assert!(!e.to_string().contains("CANARY-7f3a"));
    }
    let w = tool(&m, "fs__write_file");
    assert!(w
        .execute(
            json!({"path": canary.to_string_lossy(), "content": "pwned"}),
            &c
        )
        .await
        .is_err());
    assert_eq!(std::fs::read_to_string(&canary).unwrap(), "CANARY-7f3a");
    m.shutdown().await;
}

/// `tool_allow`/`tool_deny` (seed 004 §7): the real filesystem server with
/// `tool_deny = ["*write*"]` never offers a writing tool, and `tool_allow` narrows to what it
/// names; deny wins over allow.
#[tokio::test]
async fn tool_deny_and_tool_allow_filter_a_servers_tools() {
    let home = tempfile::tempdir().unwrap();
    let allowed = tempfile::tempdir().unwrap();
    let entry = module("@modelcontextprotocol/server-filesystem/dist/index.js");
    let dir = allowed.path().canonicalize().unwrap();
    let dir = dir.to_string_lossy().into_owned();
    let names = |m: &McpManager| -> Vec<String> {
        m.tools()
            .into_iter()
            .map(|t| t.tool.name().to_string())
            .collect()
    };
    let server = |allow: Option<Vec<&str>>, deny: Vec<&str>| {
        let mut s = McpServerSettings::stdio("fs", "node", &[&entry, &dir], child_env(home.path()));
        s.tool_allow = allow.map(|a| a.into_iter().map(str::to_string).collect());
        s.tool_deny = deny.into_iter().map(str::to_string).collect();
        s
    };
    // Unfiltered, the server offers writing tools.
    let m = McpManager::start(vec![server(None, vec![])], fast());
    wait_state(&m, "fs", McpState::Connected).await;
    let all = names(&m);
    assert!(all.iter().any(|n| n.contains("write")), "{all:?}");
    m.shutdown().await;

    let m = McpManager::start(vec![server(None, vec!["*write*"])], fast());
    wait_state(&m, "fs", McpState::Connected).await;
    let left = names(&m);
    assert!(!left.is_empty());
    assert!(!left.iter().any(|n| n.contains("write")), "{left:?}");
    assert!(left.contains(&"fs__read_text_file".to_string()), "{left:?}");
    // The registry never reaches a denied tool either.
    let reg = ToolRegistry::new().with_source(m.clone() as Arc<dyn ToolSource>);
    assert!(!reg.names().iter().any(|n| n.contains("write")));
    m.shutdown().await;

    let m = McpManager::start(
        vec![server(Some(vec!["read_*", "list_*"]), vec!["read_media*"])],
        fast(),
    );
    wait_state(&m, "fs", McpState::Connected).await;
    let left = names(&m);
    assert!(!left.is_empty());
    assert!(
        left.iter().all(
            |n| (n.starts_with("fs__read_") || n.starts_with("fs__list_"))
                && !n.starts_with("fs__read_media")
        ),
        "{left:?}"
    );
    m.shutdown().await;
}

/// Spawn the 127.0.0.1-only streamable HTTP server-everything; returns it and its port.
async fn http_everything() -> (tokio::process::Child, u16) {
    node_server("http-everything.mjs", 0).await
}

/// Spawn a node script that listens on 127.0.0.1 (`port`, 0 for any) and prints `PORT n`.
async fn node_server(name: &str, port: u16) -> (tokio::process::Child, u16) {
    use tokio::io::AsyncBufReadExt;
    let s = script(name);
    let mut child = tokio::process::Command::new("node")
        .arg(s)
        .arg(port.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let port = tokio::time::timeout(WAIT, async {
        while let Some(l) = lines.next_line().await.unwrap() {
            if let Some(p) = l.strip_prefix("PORT ") {
                return p.trim().parse::<u16>().unwrap();
            }
        }
        panic!("{name} exited without a port");
    })
    .await
    .unwrap();
    (child, port)
}

#[tokio::test]
async fn http_everything_trusted_streamable_http() {
    let (_server, port) = http_everything().await;
    let url = url::Url::parse(&format!("http://127.0.0.1:{port}/mcp")).unwrap();
    let m = McpManager::start(vec![McpServerSettings::http("remote", url, true)], fast());
    let st = wait_state(&m, "remote", McpState::Connected).await;
    assert_eq!((st.transport, st.pid), ("http", None));
    let d = tempfile::tempdir().unwrap();
    let v = tool(&m, "remote__echo")
        .execute(json!({"message": "over http"}), &ctx(d.path()))
        .await
        .unwrap();
    assert_eq!(v, json!("Echo: over http"));
    m.shutdown().await;
}

#[tokio::test]
async fn untrusted_private_urls_are_refused_by_the_ssrf_guard() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let acc = accepted.clone();
    tokio::spawn(async move {
        while let Ok((_s, _)) = listener.accept().await {
            acc.fetch_add(1, Ordering::SeqCst);
        }
    });
    let u = |s: String| url::Url::parse(&s).unwrap();
    let m = McpManager::start(
        vec![
            McpServerSettings::http("lit", u(format!("http://127.0.0.1:{port}/mcp")), false),
            McpServerSettings::http("name", u(format!("http://localhost:{port}/mcp")), false),
            McpServerSettings::http(
                "mapped",
                u(format!("http://[::ffff:127.0.0.1]:{port}/mcp")),
                false,
            ),
        ],
        fast(),
    );
    for n in ["lit", "name", "mapped"] {
        let st = wait_state(&m, n, McpState::Failed).await;
        let e = st.last_error.unwrap();
        assert!(e.contains("SSRF") && e.contains("loopback"), "{n}: {e}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "the guard let a connection through"
    );
    m.shutdown().await;
    // Control: the same listener is reachable when trusted, so zero above means refused.
    let t = McpManager::start(
        vec![McpServerSettings::http(
            "trusted",
            u(format!("http://127.0.0.1:{port}/mcp")),
            true,
        )],
        fast(),
    );
    let start = Instant::now();
    while accepted.load(Ordering::SeqCst) == 0 {
        assert!(start.elapsed() < WAIT, "trusted client never connected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    t.shutdown().await;
}

#[tokio::test]
async fn internal_only_is_reflected_in_the_tool_source_and_skills_expose_it() {
    let home = tempfile::tempdir().unwrap();
    let mut public = test_server("pub", home.path());
    public.internal_only = false;
    let hidden = test_server("hid", home.path()); // internal_only defaults to true
    let m = McpManager::start(vec![public, hidden], fast());
    wait_state(&m, "pub", McpState::Connected).await;
    wait_state(&m, "hid", McpState::Connected).await;
    for t in m.tools() {
        assert_eq!(
            t.internal,
            t.tool.name().starts_with("hid__"),
            "{}",
            t.tool.name()
        );
    }
    let reg = ToolRegistry::new().with_source(m.clone());
    let shown: Vec<String> = reg.schemas().into_iter().map(|s| s.name).collect();
    assert!(shown.contains(&"pub__cancelled_count".to_string()));
    assert!(!shown.iter().any(|n| n.starts_with("hid__")), "{shown:?}");
    let skill = ["hid__cancelled_*".to_string()];
    let with: Vec<String> = reg
        .schemas_for_tools(&skill)
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert!(with.contains(&"hid__cancelled_count".to_string()));
    assert!(!with.contains(&"hid__slow".to_string()));
    let d = tempfile::tempdir().unwrap();
    let c = ctx(d.path());
    let o = reg.dispatch("hid__cancelled_count", "1", "{}", &c).await;
    let e = o.error.unwrap();
    assert_eq!(e.code(), "PERMISSION_DENIED");
    // It names what hides the tool (it used to blame the tool policy, which allows it).
    let text = e.to_string();
    assert!(
        text.contains("internal_only") && text.contains("skill") && !text.contains("tool policy"),
        "{text}"
    );
    let o = reg
        .dispatch_with("hid__cancelled_count", "2", "{}", &c, &skill)
        .await;
    assert_eq!(o.content(), r#""0""#);
    m.shutdown().await;
}

#[tokio::test]
async fn killed_server_mid_call_errors_then_reconnects() {
    let home = tempfile::tempdir().unwrap();
    let opts = McpOptions {
        backoff_initial: Duration::from_millis(500),
        ..fast()
    };
    let m = McpManager::start(vec![test_server("t", home.path())], opts);
    let pid = wait_state(&m, "t", McpState::Connected).await.pid.unwrap();
    let slow = tool(&m, "t__slow");
    let d = tempfile::tempdir().unwrap();
    let c = ctx(d.path());
    let call = tokio::spawn({
        let c = c.clone();
        let slow = slow.clone();
        async move { slow.execute(json!({"ms": 30000}), &c).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed = Instant::now();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(i32::try_from(pid).unwrap()).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let e = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("the call hung after the server died")
        .unwrap()
        .unwrap_err();
    assert!(killed.elapsed() < Duration::from_secs(3));
    assert_eq!(e.code(), "EXECUTION_FAILED");
    assert!(e.to_string().contains("closed the connection"), "{e}");
    // While it is down a call fails at once with the reason.
    let st = wait_state(&m, "t", McpState::Reconnecting).await;
    assert_eq!(st.attempt, Some(1));
    let err = st.last_error.unwrap();
    assert!(err.contains("signal: 9"), "{err}");
    let t0 = Instant::now();
    let e = tool(&m, "t__cancelled_count")
        .execute(json!({}), &c)
        .await
        .unwrap_err();
    assert!(t0.elapsed() < Duration::from_millis(100));
    assert!(
        e.to_string()
            .starts_with("MCP server t is reconnecting (attempt 1): the server process ended"),
        "{e}"
    );
    let st = wait_state(&m, "t", McpState::Connected).await;
    assert_ne!(st.pid, Some(pid));
    let v = tool(&m, "t__cancelled_count")
        .execute(json!({}), &c)
        .await
        .unwrap();
    assert_eq!(v, json!("0"));
    m.shutdown().await;
}

#[tokio::test]
async fn unanswered_initialize_times_out_without_blocking_others() {
    let home = tempfile::tempdir().unwrap();
    let mut mute = McpServerSettings::stdio(
        "mute",
        "sh",
        &["-c", "exec sleep 1000"],
        child_env(home.path()),
    );
    mute.init_timeout = Duration::from_millis(800);
    let opts = McpOptions {
        backoff_initial: Duration::from_secs(30),
        ..fast()
    };
    let started = Instant::now();
    let m = McpManager::start(vec![mute, test_server("good", home.path())], opts);
    assert!(started.elapsed() < Duration::from_millis(200));
    let st = status(&m, "mute");
    assert_eq!(st.state, McpState::Connecting);
    let mute_pid = {
        let t = Instant::now();
        loop {
            if let Some(p) = status(&m, "mute").pid {
                break p;
            }
            assert!(t.elapsed() < WAIT);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    wait_state(&m, "good", McpState::Connected).await;
    let d = tempfile::tempdir().unwrap();
    tool(&m, "good__cancelled_count")
        .execute(json!({}), &ctx(d.path()))
        .await
        .unwrap();
    let st = wait_state(&m, "mute", McpState::Reconnecting).await;
    assert!(
        st.last_error
            .unwrap()
            .contains("no answer to initialize within 0.8s"),
        "{:?}",
        status(&m, "mute")
    );
    assert_eq!(st.tools, 0);
    // The silent process was stopped, not left behind.
    wait_dead(mute_pid).await;
    m.shutdown().await;
}

#[tokio::test]
async fn missing_command_fails_clearly_and_others_are_unaffected() {
    let home = tempfile::tempdir().unwrap();
    let m = McpManager::start(
        vec![
            McpServerSettings::stdio(
                "ghost",
                "/nonexistent/mcp-server-ghost",
                &[],
                child_env(home.path()),
            ),
            test_server("ok", home.path()),
        ],
        fast(),
    );
    let st = wait_state(&m, "ghost", McpState::Failed).await;
    let e = st.last_error.clone().unwrap();
    assert!(
        e.contains("cannot start `/nonexistent/mcp-server-ghost`") && e.contains("installed"),
        "{e}"
    );
    assert_eq!(st.to_string(), format!("failed: {e}"));
    wait_state(&m, "ok", McpState::Connected).await;
    assert!(m.tools().iter().all(|t| t.tool.name().starts_with("ok__")));
    assert!(m.restart("ghost").is_ok());
    assert!(m
        .restart("nope")
        .unwrap_err()
        .configured
        .contains("ghost, ok"));
    // A restarted failure fails again, cleanly.
    wait_state(&m, "ghost", McpState::Failed).await;
    m.shutdown().await;
}

#[tokio::test]
async fn gives_up_after_max_attempts_until_restarted() {
    let home = tempfile::tempdir().unwrap();
    let opts = McpOptions {
        max_attempts: 2,
        backoff_initial: Duration::from_millis(20),
        ..fast()
    };
    let m = McpManager::start(
        vec![McpServerSettings::stdio(
            "flaky",
            "sh",
            &["-c", "echo 'boom: no config' >&2; exit 3"],
            child_env(home.path()),
        )],
        opts,
    );
    let st = wait_state(&m, "flaky", McpState::Failed).await;
    let e = st.last_error.unwrap();
    assert!(e.starts_with("gave up after 2 reconnect attempts"), "{e}");
    assert!(e.contains("boom: no config"), "stderr tail missing: {e}");
    m.restart("flaky").unwrap();
    wait_state(&m, "flaky", McpState::Reconnecting).await;
    wait_state(&m, "flaky", McpState::Failed).await;
    let json = serde_json::to_value(m.status()).unwrap();
    assert_eq!(json[0]["state"], "failed");
    m.shutdown().await;
}

#[tokio::test]
async fn shutdown_and_drop_leave_no_processes() {
    let home = tempfile::tempdir().unwrap();
    let s = script("test-server.mjs");
    // `sh` forks node (the `; true` prevents exec), like `npx` does: the grandchild must die too.
    let wrapped = McpServerSettings::stdio(
        "wrapped",
        "sh",
        &["-c", &format!("node {s}; true")],
        child_env(home.path()),
    );
    let m = McpManager::start(vec![wrapped, everything("ev", home.path())], fast());
    let w = wait_state(&m, "wrapped", McpState::Connected)
        .await
        .pid
        .unwrap();
    let ev = wait_state(&m, "ev", McpState::Connected).await.pid.unwrap();
    let grandchildren = children(w);
    assert!(!grandchildren.is_empty(), "sh did not fork node");
    m.shutdown().await;
    for p in [w, ev].into_iter().chain(grandchildren) {
        wait_dead(p).await;
    }
    let st = status(&m, "ev");
    assert_eq!((st.state, st.pid), (McpState::Failed, None));

    // Dropping the manager without shutdown kills them as well.
    let m = McpManager::start(vec![test_server("d", home.path())], fast());
    let pid = wait_state(&m, "d", McpState::Connected).await.pid.unwrap();
    drop(m);
    wait_dead(pid).await;
}

#[tokio::test]
async fn list_changed_refreshes_the_tools() {
    let home = tempfile::tempdir().unwrap();
    let m = McpManager::start(vec![test_server("t", home.path())], fast());
    let st = wait_state(&m, "t", McpState::Connected).await;
    assert_eq!(st.tools, 3);
    assert!(!m.tools().iter().any(|t| t.tool.name() == "t__extra"));
    let d = tempfile::tempdir().unwrap();
    let c = ctx(d.path());
    tool(&m, "t__add_tool")
        .execute(json!({}), &c)
        .await
        .unwrap();
    assert!(
        m.wait_for(|s| s[0].tools == 4, WAIT).await,
        "list_changed not applied: {:?}",
        m.status()
    );
    let v = tool(&m, "t__extra").execute(json!({}), &c).await.unwrap();
    assert_eq!(v, json!("extra"));
    m.shutdown().await;
}

#[tokio::test]
async fn timeout_and_cancel_send_notifications_cancelled() {
    let home = tempfile::tempdir().unwrap();
    let mut s = test_server("t", home.path());
    s.call_timeout = Duration::from_secs(1);
    let m = McpManager::start(vec![s], fast());
    wait_state(&m, "t", McpState::Connected).await;
    let d = tempfile::tempdir().unwrap();
    let c = ctx(d.path());
    let slow = tool(&m, "t__slow");
    assert_eq!(slow.time_budget(), Some(Duration::from_secs(2)));
    let t0 = Instant::now();
    let e = slow.execute(json!({}), &c).await.unwrap_err();
    assert_eq!(e, ToolError::Timeout(1));
    assert!(t0.elapsed() < Duration::from_secs(2));
    let count = tool(&m, "t__cancelled_count");
    let until = |n: &'static str| {
        let count = count.clone();
        let c = c.clone();
        async move {
            let t = Instant::now();
            loop {
                if count.execute(json!({}), &c).await.unwrap() == json!(n) {
                    return;
                }
                assert!(
                    t.elapsed() < Duration::from_secs(5),
                    "server never saw cancel {n}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    until("1").await;
    // ctx.cancel (the user's /stop) cancels on the server too.
    let c2 = ctx(d.path());
    let cancel = c2.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        cancel.cancel();
    });
    let e = slow.execute(json!({"ms": 30000}), &c2).await.unwrap_err();
    assert_eq!(e, ToolError::Cancelled);
    until("2").await;
    m.shutdown().await;
}

// ---- server mode ----

fn server_registry(dir: &Path) -> Arc<ToolRegistry> {
    std::fs::write(dir.join("a.txt"), "line one\nkey sk-live-SECRET99 end\n").unwrap();
    let mut reg = ToolRegistry::new().with_secrets(vec!["sk-live-SECRET99".into()]);
    reg.register(Arc::new(crate::tools::fs::ReadFile));
    Arc::new(reg)
}

#[tokio::test]
async fn server_mode_over_a_pipe_with_the_rmcp_client() {
    use rmcp::model::CallToolRequestParams;
    use rmcp::ServiceExt;
    let d = tempfile::tempdir().unwrap();
    let reg = server_registry(d.path());
    let provider: Arc<dyn ToolProvider> = Arc::new(
        BuiltinProvider::new(reg.clone(), Arc::new(Workspace::open(d.path()).unwrap())).unwrap(),
    );
    let (a, b) = tokio::io::duplex(1 << 16);
    let server = tokio::spawn(serve(provider, b));
    let client = ().serve(a).await.unwrap();
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
    let want: Vec<String> = reg.schemas().into_iter().map(|s| s.name).collect();
    assert_eq!(names, want);
    let call = |name: &str, args: Value| {
        let mut p = CallToolRequestParams::new(name.to_string());
        p.arguments = args.as_object().cloned();
        p
    };
    let r = client
        .call_tool(call("read_file", json!({"path": "a.txt"})))
        .await
        .unwrap();
    assert_ne!(r.is_error, Some(true));
    let text = serde_json::to_value(&r.content).unwrap()[0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        text.contains("line one") && text.contains("[REDACTED]"),
        "{text}"
    );
    assert!(!text.contains("SECRET99"));
    let r = client
        .call_tool(call("read_file", json!({"path": "../../etc/passwd"})))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(true));
    let text = serde_json::to_value(&r.content).unwrap()[0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error_code"], "INVALID_PATH");
    let r = client
        .call_tool(call("exec_shell", json!({"command": "id"})))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(true));
    client.cancel().await.unwrap();
    tokio::time::timeout(WAIT, server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn server_mode_with_the_typescript_sdk_client() {
    let d = tempfile::tempdir().unwrap();
    let reg = server_registry(d.path());
    let ws = Arc::new(Workspace::open(d.path()).unwrap());
    let builtin: Arc<dyn ToolProvider> = Arc::new(BuiltinProvider::new(reg, ws).unwrap());
    let provider: Arc<dyn ToolProvider> = Arc::new(CompositeProvider::new(vec![builtin]).unwrap());
    let report = d.path().join("report.json");
    let mut child = tokio::process::Command::new("node")
        .arg(script("sdk-client.mjs"))
        .arg(&report)
        .env(
            "CALLS",
            json!([
                ["clawft__read_file", {"path": "a.txt"}],
                ["clawft__read_file", {"path": "missing.txt"}],
                ["nope__x", {}]
            ])
            .to_string(),
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let inp = child.stdin.take().unwrap();
    let server = tokio::spawn(serve(provider, (out, inp)));
    let st = tokio::time::timeout(WAIT, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(st.success(), "the SDK client failed: {st}");
    let _ = tokio::time::timeout(WAIT, server).await;
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["tools"][0]["name"], "clawft__read_file");
    assert_eq!(r["tools"][0]["inputSchema"]["type"], "object");
    // The conditions of the conformance suite's server-initialize, ping and tools-list
    // scenarios (same SDK calls; the suite itself cannot drive a stdio server).
    assert!(
        r["server"]["name"].as_str().is_some_and(|n| !n.is_empty()),
        "{r}"
    );
    assert!(
        r["server"]["version"]
            .as_str()
            .is_some_and(|v| !v.is_empty()),
        "{r}"
    );
    assert!(r["capabilities"]["tools"].is_object(), "{r}");
    assert_eq!(r["ping"], json!({}));
    let tools = r["tools"].as_array().unwrap();
    assert!(!tools.is_empty());
    for t in tools {
        assert!(t["name"].as_str().is_some_and(|n| !n.is_empty()), "{t}");
        assert!(
            t["description"].as_str().is_some_and(|d| !d.is_empty()),
            "{t}"
        );
        assert!(t["inputSchema"].is_object(), "{t}");
    }
    let res = r["results"].as_array().unwrap();
    assert_eq!(res[0]["isError"], false);
    assert!(res[0]["text"].as_str().unwrap().contains("[REDACTED]"));
    assert_eq!(res[1]["isError"], true);
    assert!(res[1]["text"].as_str().unwrap().contains("FILE_NOT_FOUND"));
    assert_eq!(res[2]["isError"], true);
    assert!(res[2]["text"].as_str().unwrap().contains("NOT_FOUND"));
}

#[test]
fn composite_provider_rejects_bad_namespaces() {
    struct P(&'static str);
    #[async_trait::async_trait]
    impl ToolProvider for P {
        fn namespace(&self) -> &str {
            self.0
        }
        fn list_tools(&self) -> Vec<ToolDefinition> {
            vec![]
        }
        async fn call_tool(&self, _: &str, _: Value, _: CancellationToken) -> ToolCallOutput {
            ToolCallOutput {
                text: String::new(),
                is_error: false,
            }
        }
    }
    assert!(CompositeProvider::new(vec![Arc::new(P("a")), Arc::new(P("a"))]).is_err());
    assert!(CompositeProvider::new(vec![Arc::new(P("a__b"))]).is_err());
    assert!(CompositeProvider::new(vec![Arc::new(P(""))]).is_err());
    assert!(CompositeProvider::new(vec![Arc::new(P("a")), Arc::new(P("b"))]).is_ok());
}

#[tokio::test]
async fn health_check_detects_a_hung_server_and_reconnects() {
    let home = tempfile::tempdir().unwrap();
    let opts = McpOptions {
        health_interval: Duration::from_millis(300),
        ping_timeout: Duration::from_millis(300),
        ..fast()
    };
    let m = McpManager::start(vec![test_server("h", home.path())], opts);
    let pid = wait_state(&m, "h", McpState::Connected).await.pid.unwrap();
    // Alive but silent: the process is stopped, so only the ping can notice.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(i32::try_from(pid).unwrap()).unwrap(),
        rustix::process::Signal::STOP,
    )
    .unwrap();
    let st = wait_state(&m, "h", McpState::Reconnecting).await;
    assert!(
        st.last_error.unwrap().contains("health check failed"),
        "{:?}",
        status(&m, "h")
    );
    wait_dead(pid).await;
    let st = wait_state(&m, "h", McpState::Connected).await;
    assert_ne!(st.pid, Some(pid));
    m.shutdown().await;
}

/// Count the connections a 127.0.0.1 listener accepts (and drop them).
async fn counting_listener() -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let acc = accepted.clone();
    tokio::spawn(async move {
        while let Ok((_s, _)) = listener.accept().await {
            acc.fetch_add(1, Ordering::SeqCst);
        }
    });
    (port, accepted)
}

#[tokio::test]
async fn legacy_sse_server_fallback_discovery_calls_and_reconnect() {
    let (server, port) = node_server("sse-server.mjs", 0).await;
    let url = url::Url::parse(&format!("http://127.0.0.1:{port}/sse")).unwrap();
    let m = McpManager::start(vec![McpServerSettings::http("old", url, true)], fast());
    let st = wait_state(&m, "old", McpState::Connected).await;
    assert_eq!((st.transport, st.tools, st.pid), ("sse", 4, None));
    let d = tempfile::tempdir().unwrap();
    let c = ctx(d.path());
    let v = tool(&m, "old__echo")
        .execute(json!({"message": "über SSE ✓"}), &c)
        .await
        .unwrap();
    assert_eq!(v, json!("Echo: über SSE ✓"));
    // Concurrent calls are matched to their answers by id over the one stream.
    let add = tool(&m, "old__add");
    let calls = (0..8).map(|i| {
        let add = add.clone();
        let c = c.clone();
        async move { add.execute(json!({"a": i, "b": 100}), &c).await.unwrap() }
    });
    let sums = futures::future::join_all(calls).await;
    assert_eq!(
        sums,
        (0..8)
            .map(|i| json!((i + 100).to_string()))
            .collect::<Vec<_>>()
    );
    // The server dies mid-session (with a call pending): the stream ends, the pending call
    // fails at once, the manager reconnects once the server is back.
    let pid = server.id().unwrap();
    let slow = tool(&m, "old__slow");
    let pending = tokio::spawn({
        let c = c.clone();
        async move { slow.execute(json!({"ms": 30000}), &c).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = tool(&m, "old__exit").execute(json!({}), &c).await;
    wait_dead(pid).await;
    let died = Instant::now();
    let e = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("the pending call hung after the server died")
        .unwrap()
        .unwrap_err();
    assert!(died.elapsed() < Duration::from_secs(3));
    assert_eq!(e.code(), "EXECUTION_FAILED");
    assert!(e.to_string().contains("closed the connection"), "{e}");
    let st = wait_state(&m, "old", McpState::Reconnecting).await;
    assert!(st.attempt.is_some(), "{st:?}");
    let e = tool(&m, "old__echo")
        .execute(json!({"message": "x"}), &c)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("is reconnecting"), "{e}");
    let (_server2, port2) = node_server("sse-server.mjs", port).await;
    assert_eq!(port2, port);
    let st = wait_state(&m, "old", McpState::Connected).await;
    assert_eq!(st.transport, "sse");
    let v = tool(&m, "old__echo")
        .execute(json!({"message": "again"}), &c)
        .await
        .unwrap();
    assert_eq!(v, json!("Echo: again"));
    m.shutdown().await;
}

#[tokio::test]
async fn untrusted_loopback_sse_url_is_refused_by_the_ssrf_guard() {
    let (port, accepted) = counting_listener().await;
    let url = url::Url::parse(&format!("http://127.0.0.1:{port}/sse")).unwrap();
    let m = McpManager::start(
        vec![McpServerSettings::http("old", url.clone(), false)],
        fast(),
    );
    let st = wait_state(&m, "old", McpState::Failed).await;
    let e = st.last_error.unwrap();
    assert!(e.contains("SSRF") && e.contains("loopback"), "{e}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "the guard let a connection through"
    );
    m.shutdown().await;
    // Control: trusted, the same URL is dialled.
    let t = McpManager::start(vec![McpServerSettings::http("old", url, true)], fast());
    let start = Instant::now();
    while accepted.load(Ordering::SeqCst) == 0 {
        assert!(start.elapsed() < WAIT, "trusted client never connected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    t.shutdown().await;
}

/// A legacy-only server whose `endpoint` event points at another origin: the client must not
/// POST there (the configured headers would go with it).
#[tokio::test]
async fn sse_endpoint_on_another_origin_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (other, other_accepted) = counting_listener().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).into_owned();
                if head.starts_with("GET ") {
                    let body = format!(
                        "event: endpoint\ndata: http://127.0.0.1:{other}/messages?sessionId=1\n\n"
                    );
                    let _ = s
                        .write_all(
                            format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n{body}"
                            )
                            .as_bytes(),
                        )
                        .await;
                    tokio::time::sleep(Duration::from_secs(5)).await;
                } else {
                    let _ = s
                        .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                        .await;
                }
            });
        }
    });
    let url = url::Url::parse(&format!("http://127.0.0.1:{port}/sse")).unwrap();
    let m = McpManager::start(vec![McpServerSettings::http("old", url, true)], fast());
    let st = wait_state(&m, "old", McpState::Reconnecting).await;
    let e = st.last_error.unwrap();
    assert!(
        e.contains("HTTP 404") && e.contains("not on the origin of `http://127.0.0.1:"),
        "{e}"
    );
    assert_eq!(other_accepted.load(Ordering::SeqCst), 0);
    m.shutdown().await;
}
