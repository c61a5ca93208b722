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

use crate::common::{config_value, messages};
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
                serde_json::to_value(m.role).unwrap().as_str().unwrap().to_string(),
                m.content,
            )
        })
        .collect()
}

fn assert_prompt_exit(t: &Timed) {
    assert!(t.status.success(), "{}", t.stderr);
    let after = t.after_reply.expect("no reply on stdout");
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
