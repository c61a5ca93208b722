//! Context files (`SOUL.md`, `IDENTITY.md`, `AGENTS.md`, `TOOLS.md`, `USER.md`,
//! `BOOTSTRAP.md`) in the system prompt the fake LLM receives: order, headings, caps, reload on
//! change, byte stability, the workspace jail, the operator's replacement prompt, subagents and
//! the onboard templates.

use std::path::Path;

use serde_json::{json, Value};

use crate::common::{config, messages, TestGateway};
use crate::fake_llm::{FakeLlm, Reply};

fn system(req: &Value) -> String {
    let m = messages(req);
    assert_eq!(m[0]["role"], "system", "{req:#}");
    m[0]["content"].as_str().unwrap().to_string()
}

/// The system message of each request, after one chat turn per message in `chats`.
async fn prompts(dir: &Path, extra: Value, mut between: impl FnMut(usize)) -> Vec<String> {
    let llm = FakeLlm::start().await;
    let gw = TestGateway::start(config(&llm, dir, extra)).await;
    for i in 0..3 {
        between(i);
        llm.push(Reply::Text(format!("answer {i}")));
        let (status, body) = gw.api.chat("c1", &format!("question {i}")).await;
        assert_eq!(status, 200, "{body}");
    }
    gw.stop().await;
    llm.requests().iter().map(system).collect()
}

fn ws(dir: &Path) -> std::path::PathBuf {
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    ws
}

#[tokio::test]
async fn soul_change_shows_in_the_next_request_and_the_prompt_is_byte_identical_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let ws = ws(dir.path());
    std::fs::write(ws.join("SOUL.md"), "Speak like a calm librarian.\n").unwrap();
    let p = prompts(dir.path(), json!({}), |i| {
        if i == 2 {
            std::fs::write(ws.join("SOUL.md"), "Speak like an excited pirate, arr!\n").unwrap();
        }
    })
    .await;
    assert_eq!(p.len(), 3);
    assert!(
        p[0].contains("## SOUL.md\n\nSpeak like a calm librarian."),
        "{}",
        p[0]
    );
    assert_eq!(
        p[0], p[1],
        "the prompt changed between turns without a file change"
    );
    assert!(
        p[2].contains("Speak like an excited pirate, arr!"),
        "{}",
        p[2]
    );
    assert!(!p[2].contains("librarian"), "{}", p[2]);
}

#[tokio::test]
async fn files_come_in_the_documented_order_under_headings_and_heartbeat_stays_out() {
    let dir = tempfile::tempdir().unwrap();
    let ws = ws(dir.path());
    let order = [
        "SOUL.md",
        "IDENTITY.md",
        "AGENTS.md",
        "TOOLS.md",
        "USER.md",
        "BOOTSTRAP.md",
    ];
    for f in order.iter().rev() {
        std::fs::write(ws.join(f), format!("body of {f}\n")).unwrap();
    }
    std::fs::write(ws.join("HEARTBEAT.md"), "check the mail every hour\n").unwrap();
    let p = prompts(dir.path(), json!({}), |_| {}).await;
    let s = &p[0];
    assert!(
        s.starts_with("You are weft"),
        "the base text comes first: {s}"
    );
    let mut last = 0;
    for f in order {
        let at = s
            .find(&format!("\n\n## {f}\n\nbody of {f}"))
            .unwrap_or_else(|| panic!("{f} missing: {s}"));
        assert!(at > last, "{f} out of order: {s}");
        last = at;
    }
    assert!(
        !s.contains("check the mail"),
        "HEARTBEAT.md is not in the prompt: {s}"
    );
}

#[tokio::test]
async fn a_big_file_is_cut_at_20_kb_with_a_visible_marker() {
    let dir = tempfile::tempdir().unwrap();
    let ws = ws(dir.path());
    std::fs::write(ws.join("SOUL.md"), "a".repeat(50 * 1024)).unwrap();
    let p = prompts(dir.path(), json!({}), |_| {}).await;
    assert!(
        p[0].contains("[… SOUL.md truncated at 20 KB]"),
        "marker missing"
    );
    assert!(p[0].len() < 22 * 1024, "{} bytes", p[0].len());
}

#[tokio::test]
async fn a_soul_md_symlinked_outside_the_workspace_is_not_included() {
    let dir = tempfile::tempdir().unwrap();
    let ws = ws(dir.path());
    std::fs::write(dir.path().join("secret.txt"), "TOP-SECRET-CANARY").unwrap();
    std::os::unix::fs::symlink(dir.path().join("secret.txt"), ws.join("SOUL.md")).unwrap();
    std::fs::write(ws.join("IDENTITY.md"), "I am Loom.").unwrap();
    let p = prompts(dir.path(), json!({}), |_| {}).await;
    assert!(!p[0].contains("TOP-SECRET-CANARY"), "{}", p[0]);
    assert!(!p[0].contains("## SOUL.md"), "{}", p[0]);
    assert!(p[0].contains("I am Loom."), "{}", p[0]);
}

#[tokio::test]
async fn the_operators_system_prompt_replaces_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let ws = ws(dir.path());
    std::fs::write(ws.join("SOUL.md"), "Speak like a pirate.").unwrap();
    let extra = json!({"agents": {"defaults": {"system_prompt": "You answer in haiku."}}});
    let p = prompts(dir.path(), extra, |_| {}).await;
    // The operator's text, then only what the gateway appends to every prompt: the list of
    // tools loaded on demand (docs/tools.md).
    assert_eq!(
        p[0].split("\n\nMore tools (").next(),
        Some("You answer in haiku.")
    );
}

#[tokio::test]
async fn bootstrap_is_included_while_present_and_gone_after_it_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let ws = ws(dir.path());
    std::fs::write(ws.join("BOOTSTRAP.md"), "Ask the user for their name.").unwrap();
    let p = prompts(dir.path(), json!({}), |i| {
        if i == 2 {
            std::fs::remove_file(ws.join("BOOTSTRAP.md")).unwrap();
        }
    })
    .await;
    assert!(p[0].contains("## BOOTSTRAP.md\n\nAsk the user for their name."));
    assert!(p[1].contains("Ask the user for their name."));
    assert!(!p[2].contains("BOOTSTRAP"), "{}", p[2]);
}

#[tokio::test]
async fn a_subagent_gets_agents_md_and_tools_md_only() {
    let dir = tempfile::tempdir().unwrap();
    let ws = ws(dir.path());
    for f in [
        "SOUL.md",
        "AGENTS.md",
        "TOOLS.md",
        "USER.md",
        "BOOTSTRAP.md",
    ] {
        std::fs::write(ws.join(f), format!("body of {f}")).unwrap();
    }
    let llm = FakeLlm::start().await;
    llm.route(|req| {
        let sys = system(req);
        if sys.contains("You are a subagent") {
            return Some(Reply::Text("child done".into()));
        }
        if messages(req).last().is_some_and(|m| m["role"] == "tool") {
            return Some(Reply::Text("parent done".into()));
        }
        Some(Reply::ToolCalls(vec![(
            "r1".into(),
            "subagents".into(),
            json!({"action": "run", "task": "TASK x"}).to_string(),
        )]))
    });
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let (status, body) = gw.api.chat("c1", "delegate").await;
    assert_eq!(status, 200, "{body}");
    gw.stop().await;
    let reqs = llm.requests();
    let child = reqs
        .iter()
        .map(system)
        .find(|s| s.contains("You are a subagent"))
        .expect("no child request");
    assert!(
        child.contains("## AGENTS.md\n\nbody of AGENTS.md"),
        "{child}"
    );
    assert!(child.contains("## TOOLS.md\n\nbody of TOOLS.md"), "{child}");
    for f in ["SOUL.md", "USER.md", "BOOTSTRAP.md"] {
        assert!(!child.contains(f), "{f} in the child prompt: {child}");
    }
    let parent = system(&reqs[0]);
    assert!(parent.contains("body of SOUL.md") && parent.contains("body of USER.md"));
}

#[test]
fn onboard_writes_the_templates_and_never_overwrites_an_edited_one() {
    let dir = tempfile::tempdir().unwrap();
    let out = crate::process::weft(dir.path())
        .arg("onboard")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ws = dir.path().join(".clawft/workspace");
    for f in [
        "SOUL.md",
        "IDENTITY.md",
        "AGENTS.md",
        "USER.md",
        "BOOTSTRAP.md",
    ] {
        let text = std::fs::read_to_string(ws.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(text.starts_with("# ") && text.len() > 40, "{f}: {text}");
    }
    assert!(!ws.join("HEARTBEAT.md").exists());
    std::fs::write(ws.join("SOUL.md"), "my own soul\n").unwrap();
    std::fs::remove_file(ws.join("BOOTSTRAP.md")).unwrap();
    let out = crate::process::weft(dir.path())
        .args(["onboard", "--force"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("SOUL.md")).unwrap(),
        "my own soul\n"
    );
    assert!(
        !ws.join("BOOTSTRAP.md").exists(),
        "a deleted BOOTSTRAP.md came back: the first run would start again"
    );
}

#[tokio::test]
async fn the_size_check_of_a_new_message_counts_context_files_written_after_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let ws = ws(dir.path());
    let llm = FakeLlm::start().await;
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({ "agents": { "defaults": { "context_window": 8192 } } }),
    ))
    .await;
    // ~5,000 tokens of persona, written while the gateway runs.
    std::fs::write(ws.join("SOUL.md"), "Be thorough. ".repeat(1500)).unwrap();
    // ~2,500 tokens: fits the window without the file, not with it.
    let (status, body) = gw.api.chat("c1", &"word ".repeat(2000)).await;
    assert!(
        body.to_string().contains("context window"),
        "{status} {body}"
    );
    assert!(llm.requests().is_empty(), "the model was called");
    gw.stop().await;
}
