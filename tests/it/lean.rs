//! Lean requests (issue 32): the core tools in full and the others listed and loaded on demand
//! by `tool_search` (built-in and MCP tools alike), `skill_search`, pins, and a long
//! conversation against a small model that enforces an 8k-token window counted at 3 bytes a
//! token, tools included. Every request goes to a strict fake that also refuses a call to a
//! tool the request does not declare.

use serde_json::{json, Value};

use crate::common::{
    config, listed_tools, messages, system_of, tool_names, tool_results, TestGateway,
};
use crate::fake_llm::{check_tool_pairing, undeclared_call, FakeLlm, Reply};
use crate::mcp::connected;
use crate::window::{kind, route, Kind};

/// Bytes of the tools and messages of a request as the small model counts them.
fn prompt_bytes(req: &Value) -> usize {
    serde_json::to_vec(&req["tools"]).unwrap().len()
        + serde_json::to_vec(&req["messages"]).unwrap().len()
}

/// Every request was valid for a strict provider: calls paired with results, every called
/// tool declared.
fn assert_valid_history(reqs: &[Value]) {
    for (i, r) in reqs.iter().enumerate() {
        check_tool_pairing(r).unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(undeclared_call(r), None, "request {i}");
    }
}

fn lean_config(llm: &FakeLlm, dir: &std::path::Path, extra: Value) -> clawft::config::Config {
    let mut v = json!({
        "agents": {"defaults": {"context_window": 8192, "stream": false}},
        "tools": {"rate_limit": {"per_minute": 0}},
    });
    crate::common::merge(&mut v, extra);
    config(llm, dir, v)
}

#[tokio::test]
async fn a_hundred_and_twenty_messages_through_a_small_models_8k_window_are_all_answered() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.strict_small_model(8192);
    route(&llm);
    let gw = TestGateway::start(lean_config(&llm, dir.path(), json!({}))).await;
    // ~1 KB each.
    let text = |i: usize| {
        format!(
            "m{i:03} {}",
            "a small model on a desk reads this. ".repeat(28)
        )
    };
    for i in 0..120 {
        let (s, body) = gw.api.chat("small", &text(i)).await;
        assert_eq!(s, 200, "message {i}: {body}");
        let reply = body["reply"].as_str().unwrap();
        assert!(reply.starts_with("ok "), "message {i}: {reply}");
    }
    let reqs = llm.requests();
    assert_valid_history(&reqs);
    let kinds: Vec<Kind> = reqs.iter().map(kind).collect();
    assert_eq!(kinds.iter().filter(|k| **k == Kind::Chat).count(), 120);
    let summaries = kinds.iter().filter(|k| **k == Kind::Summary).count();
    assert!(
        summaries >= 5,
        "120 KB through 8k needs compactions: {summaries}"
    );
    // No request passed the window (the fake would have refused it: no retry happened).
    for (i, r) in reqs.iter().enumerate() {
        assert!(
            prompt_bytes(r).div_ceil(3) <= 8192,
            "request {i}: {} bytes",
            prompt_bytes(r)
        );
    }
    // The fixed overhead of a chat request (system prompt and tools) is within 8 KB.
    let first = &reqs[0];
    let overhead = serde_json::to_vec(&first["tools"]).unwrap().len() + system_of(first).len();
    assert!(overhead <= 8192, "overhead {overhead} bytes");
    gw.stop().await;
}

#[tokio::test]
async fn a_tool_outside_the_core_set_is_found_with_tool_search_and_called_in_the_same_turn() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.strict_small_model(8192);
    let gw = TestGateway::start(lean_config(&llm, dir.path(), json!({}))).await;
    llm.push(Reply::ToolCalls(vec![(
        "s1".into(),
        "tool_search".into(),
        json!({"query": "status of this conversation: tokens and budgets left"}).to_string(),
    )]));
    llm.push(Reply::ToolCalls(vec![(
        "c1".into(),
        "session_status".into(),
        "{}".into(),
    )]));
    llm.push(Reply::Text("done".into()));
    let (s, body) = gw.api.chat("ts", "how many tokens have we used?").await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["reply"], "done", "{body}");
    llm.push(Reply::Text("again".into()));
    let (s, body) = gw.api.chat("ts", "thanks").await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["reply"], "again", "{body}");

    let reqs = llm.requests();
    assert_eq!(reqs.len(), 4);
    assert_valid_history(&reqs);
    let names: Vec<Vec<String>> = reqs.iter().map(tool_names).collect();
    // Listed, not offered, at first.
    assert!(
        !names[0].contains(&"session_status".to_string()),
        "{:?}",
        names[0]
    );
    assert!(listed_tools(&reqs[0]).contains(&"session_status".to_string()));
    assert!(names[0].contains(&"tool_search".to_string()));
    // The search found it first and loaded what it found: appended, in its order, the earlier
    // tools unchanged.
    let found = &tool_results(&reqs[1])[0].1;
    assert_eq!(found["tools"][0]["name"], "session_status", "{found}");
    let found: Vec<&str> = found["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names[1][..names[0].len()], names[0][..]);
    assert_eq!(names[1][names[0].len()..], found[..]);
    // Called in the same turn, and it ran.
    let result = &tool_results(&reqs[2])[1].1;
    assert!(result.get("error").is_none(), "{result}");
    assert!(result["session_key"].is_string(), "{result}");
    // The next turn: still declared (its call is in the window), the same prefix: tools and
    // system prompt byte-identical.
    assert_eq!(names[3], names[2]);
    assert_eq!(
        serde_json::to_string(&reqs[3]["tools"]).unwrap(),
        serde_json::to_string(&reqs[2]["tools"]).unwrap()
    );
    assert_eq!(system_of(&reqs[3]), system_of(&reqs[0]));
    gw.stop().await;
}

#[tokio::test]
async fn a_pinned_tool_is_offered_in_full_from_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.strict_small_model(8192);
    let gw = TestGateway::start(lean_config(
        &llm,
        dir.path(),
        json!({"agents": {"defaults": {"tools": {"always": ["memory_write", "group:sessions"]}}}}),
    ))
    .await;
    llm.push(Reply::Text("hi".into()));
    let (s, body) = gw.api.chat("pin", "hello").await;
    assert_eq!(s, 200, "{body}");
    let req = &llm.requests()[0];
    let names = tool_names(req);
    for n in [
        "memory_write",
        "sessions_list",
        "session_status",
        "read_file",
    ] {
        assert!(names.contains(&n.to_string()), "{n} not offered: {names:?}");
    }
    let listed = listed_tools(req);
    assert!(!listed.contains(&"memory_write".to_string()), "{listed:?}");
    assert!(listed.contains(&"memory_read".to_string()), "{listed:?}");
    gw.stop().await;
}

#[tokio::test]
async fn a_skill_is_found_with_skill_search_and_used() {
    let dir = tempfile::tempdir().unwrap();
    let skills = dir.path().join("ws/skills");
    // More skills than the prompt lists.
    for i in 0..40 {
        let d = skills.join(format!("skill-{i:02}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("SKILL.md"),
            format!("---\nname: skill-{i:02}\ndescription: Helps with chores of kind {i}, step by step, for the household\n---\nDo chore {i}.\n"),
        )
        .unwrap();
    }
    let d = skills.join("zz-notes");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(
        d.join("SKILL.md"),
        "---\nname: zz-notes\ndescription: Write things down\n---\nCollect the merged pull requests and write the CHANGELOG entry.\n",
    )
    .unwrap();
    let llm = FakeLlm::start().await;
    llm.strict_small_model(8192);
    let gw = TestGateway::start(lean_config(&llm, dir.path(), json!({}))).await;
    llm.push(Reply::ToolCalls(vec![(
        "k1".into(),
        "skill_search".into(),
        json!({"query": "changelog for merged pull requests"}).to_string(),
    )]));
    llm.push(Reply::ToolCalls(vec![(
        "k2".into(),
        "use_skill".into(),
        json!({"name": "zz-notes"}).to_string(),
    )]));
    llm.push(Reply::Text("written".into()));
    let (s, body) = gw.api.chat("sk", "update the changelog").await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["reply"], "written", "{body}");
    let reqs = llm.requests();
    assert_valid_history(&reqs);
    let system = system_of(&reqs[0]);
    // The section lists some skills and sends the model to skill_search for the rest.
    assert!(system.contains("- skill-00: Helps with chores"), "{system}");
    assert!(!system.contains("zz-notes"), "{system}");
    assert!(
        system.contains("more (find them with skill_search)"),
        "{system}"
    );
    let names = tool_names(&reqs[0]);
    assert!(
        names.contains(&"skill_search".to_string()) && names.contains(&"use_skill".to_string())
    );
    // Found by its body, and the result says how to use it.
    let found = &tool_results(&reqs[1])[0].1;
    assert_eq!(found["skills"][0]["name"], "zz-notes", "{found}");
    assert!(
        found["how_to_use"].as_str().unwrap().contains("use_skill"),
        "{found}"
    );
    let used = &tool_results(&reqs[2])[1].1;
    assert!(
        used["instructions"].as_str().unwrap().contains("CHANGELOG"),
        "{used}"
    );
    gw.stop().await;
}

#[tokio::test]
async fn an_mcp_tool_is_found_with_tool_search_and_called() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.strict_small_model(8192);
    let gw = TestGateway::start(lean_config(
        &llm,
        dir.path(),
        json!({"tools": {"mcp_servers": {"everything": {
            "command": "node",
            "args": [crate::common::everything_js(), "stdio"],
            "internal_only": false,
        }}}}),
    ))
    .await;
    assert!(
        connected(&gw.api).await,
        "server-everything did not connect"
    );
    llm.push(Reply::ToolCalls(vec![(
        "s1".into(),
        "tool_search".into(),
        json!({"query": "echo the input back", "limit": 2}).to_string(),
    )]));
    llm.push(Reply::ToolCalls(vec![(
        "e1".into(),
        "everything__echo".into(),
        json!({"message": "hello through the search"}).to_string(),
    )]));
    llm.push(Reply::Text("echoed".into()));
    let (s, body) = gw.api.chat("mcp", "echo something").await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["reply"], "echoed", "{body}");
    let reqs = llm.requests();
    assert_valid_history(&reqs);
    assert!(!tool_names(&reqs[0]).contains(&"everything__echo".to_string()));
    assert!(listed_tools(&reqs[0]).contains(&"everything__echo".to_string()));
    let found = &tool_results(&reqs[1])[0].1;
    assert_eq!(found["tools"][0]["name"], "everything__echo", "{found}");
    assert!(tool_names(&reqs[1]).contains(&"everything__echo".to_string()));
    let r = &tool_results(&reqs[2])[1].1;
    assert!(r.to_string().contains("hello through the search"), "{r}");
    // Nothing else in the first request's messages but the system prompt and the user's.
    assert_eq!(messages(&reqs[0]).len(), 2);
    gw.stop().await;
}

/// A model whose window cannot hold the instructions, the core tools and one exchange is
/// reported at start, by `weft doctor` and in the gateway's log, before any message.
#[tokio::test]
async fn a_window_too_small_for_the_core_set_is_reported_at_start() {
    use crate::process::{free_port, log_of, weft, write_config, Daemon};
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = write_config(
        dir.path(),
        &crate::common::config_value(
            &llm.base_url(),
            dir.path(),
            json!({
                "agents": {"defaults": {"context_window": 1024}},
                "channels": {"http": {"bind": format!("127.0.0.1:{port}")}},
            }),
        ),
    );
    let mut doctor = weft(dir.path());
    doctor.arg("--config").arg(&cfg).arg("doctor");
    let out = tokio::task::spawn_blocking(move || doctor.output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let line = stdout
        .lines()
        .find(|l| l.contains("context window (main)"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.starts_with("fail"), "{line}");
    assert!(line.contains("context window is 1024 tokens"), "{line}");
    assert!(line.contains("no message can be answered"), "{line}");

    let d = Daemon::start(dir.path(), &cfg, port).await;
    let log = log_of(dir.path());
    assert!(
        log.contains("ERROR") && log.contains("context window is 1024 tokens"),
        "{log}"
    );
    // Before any message: the fake model was never asked.
    assert!(llm.requests().is_empty());
    d.term();

    // With the window of an 8k model: fine.
    let ok = dir.path().join("ok");
    std::fs::create_dir_all(&ok).unwrap();
    let cfg = write_config(
        &ok,
        &crate::common::config_value(
            &llm.base_url(),
            &ok,
            json!({"agents": {"defaults": {"context_window": 8192}}}),
        ),
    );
    let mut doctor = weft(&ok);
    doctor.arg("--config").arg(&cfg).arg("doctor");
    let out = tokio::task::spawn_blocking(move || doctor.output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let line = stdout
        .lines()
        .find(|l| l.contains("context window (main)"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.starts_with("ok"), "{line}");
}

/// What `weft onboard` writes, plus one skill: a one-line message costs at most 8 KB of
/// instructions (every system message) and tool schemas, through the real binary and the
/// config onboard wrote (the fake LLM standing in for OpenAI, as in the README's quick start).
#[tokio::test]
async fn onboards_defaults_and_one_skill_keep_a_one_line_message_within_8_kb() {
    use std::process::Command;
    let home = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let (home_dir, base_url) = (home.path().to_path_buf(), llm.base_url());
    let user = move |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_weft"));
        c.env_clear()
            .env("HOME", &home_dir)
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("OPENAI_API_KEY", "sk-onboard-123")
            .env("OPENAI_BASE_URL", &base_url)
            .stdin(std::process::Stdio::null())
            .args(args);
        c
    };
    let out = user(&["onboard"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let skill = home.path().join(".clawft/workspace/skills/groceries");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: groceries\ndescription: Keep the family's shopping list in groceries.md \
         and read it back by aisle\nallowed_tools: [\"read_file\", \"edit_file\"]\n---\n\
         1. Read groceries.md (create it when missing).\n2. Add or tick off items, one per \
         line, grouped by aisle.\n3. Answer with the list as it is now.\n",
    )
    .unwrap();
    llm.push(Reply::Text("Hello!".into()));
    let out = tokio::task::spawn_blocking(move || user(&["agent", "-m", "hi"]).output().unwrap())
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let req = &llm.requests()[0];
    let instructions: usize = messages(req)
        .iter()
        .filter(|m| m["role"] == "system")
        .map(|m| m["content"].as_str().unwrap_or_default().len())
        .sum();
    let tools = serde_json::to_vec(&req["tools"]).unwrap().len();
    // The templates and the skill are in the request.
    let system = system_of(req);
    assert!(system.contains("Be direct and friendly"), "{system}");
    assert!(system.contains("groceries"), "{system}");
    assert!(
        instructions + tools <= 8192,
        "instructions {instructions} + tools {tools} = {} bytes",
        instructions + tools
    );
    eprintln!("onboard + one skill: instructions {instructions} B + tools {tools} B");
}
