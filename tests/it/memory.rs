//! Memory that works: `memory_write` then `memory_search` across sessions, restarts and users;
//! per-user scope (`users/` closed to the other tools, each user their own); `memory_get` and
//! hostile paths; the policy groups; `weft memory` and the memory line of `weft status`.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{
    config, messages, reachable_tools, tool_results, wait_until, Api, TestGateway,
};
use crate::fake_llm::{FakeLlm, Reply};

/// POST /v1/chat as `sender` → (status, body).
pub(crate) async fn chat_as(api: &Api, chat: &str, sender: &str, content: &str) -> (u16, Value) {
    let r = api
        .http
        .post(format!("{}/v1/chat", api.base))
        .json(&json!({ "chat_id": chat, "content": content, "sender": sender }))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn call(id: &str, name: &str, args: Value) -> (String, String, String) {
    (id.to_string(), name.to_string(), args.to_string())
}

/// Run one turn in which the model makes `calls` then answers; the tool results by call id.
async fn turn(
    llm: &FakeLlm,
    api: &Api,
    chat: &str,
    sender: &str,
    calls: Vec<(String, String, String)>,
) -> Vec<(String, Value)> {
    let before = llm.requests().len();
    llm.push(Reply::ToolCalls(calls));
    llm.push(Reply::Text("done".into()));
    let (status, body) = chat_as(api, chat, sender, "go").await;
    assert_eq!(status, 200, "{body}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), before + 2, "one tool round, one answer");
    tool_results(&reqs[before + 1])
}

fn result<'a>(results: &'a [(String, Value)], id: &str) -> &'a Value {
    &results
        .iter()
        .find(|(i, _)| i == id)
        .unwrap_or_else(|| panic!("no result for {id}: {results:?}"))
        .1
}

fn system_of(req: &Value) -> String {
    messages(req)[0]["content"].as_str().unwrap().to_string()
}

const FACT: &str = "Dentist appointment with Dr. Okafor every second Friday at 9:30.";

#[tokio::test]
async fn a_fact_is_found_from_a_new_session_and_after_a_restart_but_never_by_another_user() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let cfg = || config(&llm, dir.path(), json!({}));
    let gw = TestGateway::start(cfg()).await;

    // Alice saves a fact (default scope: per user).
    let r = turn(
        &llm,
        &gw.api,
        "alice-1",
        "alice",
        vec![call("w", "memory_write", json!({ "content": FACT }))],
    )
    .await;
    assert!(
        result(&r, "w")["path"]
            .as_str()
            .unwrap()
            .ends_with("users/http-alice/memory/MEMORY.md"),
        "{r:?}"
    );
    // ... and a daily note.
    let r = turn(
        &llm,
        &gw.api,
        "alice-1",
        "alice",
        vec![call(
            "w",
            "memory_write",
            json!({ "content": "Bought oat milk for the cafe.", "file": "memory/2026-11-23.md" }),
        )],
    )
    .await;
    assert!(result(&r, "w")["message"].is_string(), "{r:?}");

    // A new session of Alice's finds both, with path, lines, score and snippet.
    let r = turn(
        &llm,
        &gw.api,
        "alice-2",
        "alice",
        vec![
            call(
                "s",
                "memory_search",
                json!({ "query": "when is the dentist" }),
            ),
            call("c", "memory_search", json!({ "query": "Café" })),
        ],
    )
    .await;
    let hits = result(&r, "s")["results"].as_array().unwrap().clone();
    assert_eq!(hits.len(), 1, "{r:?}");
    assert_eq!(hits[0]["path"], "users/http-alice/memory/MEMORY.md");
    assert_eq!(hits[0]["start_line"], 1);
    assert!(hits[0]["score"].as_f64().unwrap() > 0.0);
    assert!(hits[0]["snippet"].as_str().unwrap().contains("Dr. Okafor"));
    let cafe = result(&r, "c")["results"].as_array().unwrap().clone();
    assert_eq!(
        cafe[0]["path"], "users/http-alice/memory/2026-11-23.md",
        "accent and case folded: {r:?}"
    );

    // Bob, another user, finds nothing and cannot reach Alice's files by any tool.
    let r = turn(
        &llm,
        &gw.api,
        "bob-1",
        "bob",
        vec![
            call("s", "memory_search", json!({ "query": "dentist Okafor" })),
            call("r", "memory_read", json!({})),
            call(
                "g",
                "memory_get",
                json!({ "path": "users/http-alice/memory/MEMORY.md" }),
            ),
            call(
                "f",
                "read_file",
                json!({ "path": "users/http-alice/memory/MEMORY.md" }),
            ),
            call("l", "list_directory", json!({ "path": "users" })),
            call(
                "q",
                "grep",
                json!({ "pattern": "Okafor", "directory": "." }),
            ),
        ],
    )
    .await;
    assert_eq!(result(&r, "s")["results"], json!([]), "{r:?}");
    assert_eq!(result(&r, "g")["error_code"], "PERMISSION_DENIED", "{r:?}");
    // `users/` is not in the workspace: the file tools cannot name it.
    assert!(result(&r, "f")["error_code"].is_string(), "{r:?}");
    assert!(result(&r, "l")["error_code"].is_string(), "{r:?}");
    let all = serde_json::to_string(&r).unwrap();
    assert!(!all.contains("every second Friday"), "{all}");
    assert!(!all.contains("oat milk"), "{all}");

    // The snapshot is saved off the hot path, then survives a restart.
    let idx = dir.path().join(".clawft/memory-index");
    assert!(
        wait_until(Duration::from_secs(10), || {
            std::fs::read_dir(&idx)
                .into_iter()
                .flatten()
                .flatten()
                .any(|d| d.path().join("user-http-alice.idx").exists())
        })
        .await,
        "no snapshot under {}",
        idx.display()
    );
    gw.stop().await;
    let gw = TestGateway::start(cfg()).await;
    let r = turn(
        &llm,
        &gw.api,
        "alice-3",
        "alice",
        vec![call(
            "s",
            "memory_search",
            json!({ "query": "okafor friday" }),
        )],
    )
    .await;
    assert_eq!(
        result(&r, "s")["results"][0]["path"],
        "users/http-alice/memory/MEMORY.md",
        "{r:?}"
    );
    gw.stop().await;
}

#[tokio::test]
async fn each_user_gets_their_own_user_md_with_the_agents_as_fallback_and_commands_see_no_users_dir(
) {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let users = dir.path().join(".clawft/users");
    std::fs::create_dir_all(users.join("http-alice")).unwrap();
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("USER.md"), "A member of the book club.\n").unwrap();
    std::fs::write(
        users.join("http-alice/USER.md"),
        "Alice: vegetarian, prefers tea.\n",
    )
    .unwrap();
    let llm = FakeLlm::start().await;
    let cfg = config(&llm, dir.path(), json!({}));
    let fs_enforced = clawft::tools::exec::sandbox_status(&cfg.tools.exec).fs_enforced;
    let gw = TestGateway::start(cfg).await;
    llm.push(Reply::Text("hi".into()));
    assert_eq!(chat_as(&gw.api, "a", "alice", "hi").await.0, 200);
    llm.push(Reply::Text("hi".into()));
    assert_eq!(chat_as(&gw.api, "b", "bob", "hi").await.0, 200);
    let reqs = llm.requests();
    let (alice, bob) = (system_of(&reqs[0]), system_of(&reqs[1]));
    assert!(alice.contains("Alice: vegetarian, prefers tea."), "{alice}");
    assert!(!alice.contains("book club"), "{alice}");
    assert!(bob.contains("A member of the book club."), "{bob}");
    assert!(!bob.contains("vegetarian"), "{bob}");

    // Commands cannot read `users/` either (when the sandbox can enforce it here).
    if fs_enforced {
        let r = turn(
            &llm,
            &gw.api,
            "b",
            "bob",
            vec![call(
                "x",
                "exec_shell",
                json!({ "command": format!("cat {}/http-alice/USER.md; ls {}", users.display(), users.display()) }),
            )],
        )
        .await;
        let out = serde_json::to_string(&r).unwrap();
        assert!(!out.contains("prefers tea"), "{out}");
    }
    gw.stop().await;
}

#[tokio::test]
async fn memory_get_reads_slices_and_refuses_hostile_paths() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join("memory")).unwrap();
    let users = dir.path().join(".clawft/users");
    std::fs::create_dir_all(users.join("http-bob/memory")).unwrap();
    let notes: String = (1..=30).map(|i| format!("line {i}\n")).collect();
    std::fs::write(ws.join("memory/notes.md"), &notes).unwrap();
    std::fs::write(
        users.join("http-bob/memory/MEMORY.md"),
        "bob's secret plan\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("outside.md"), "CANARY outside\n").unwrap();
    std::os::unix::fs::symlink(dir.path().join("outside.md"), ws.join("memory/out.md")).unwrap();
    std::os::unix::fs::symlink(
        users.join("http-bob/memory/MEMORY.md"),
        ws.join("memory/bob.md"),
    )
    .unwrap();
    // Alice's own directory, with a symlink planted towards Bob's.
    std::fs::create_dir_all(users.join("http-alice/memory")).unwrap();
    std::os::unix::fs::symlink(
        users.join("http-bob/memory/MEMORY.md"),
        users.join("http-alice/memory/bob.md"),
    )
    .unwrap();
    std::fs::write(ws.join("plain.txt"), "not memory\n").unwrap();
    let llm = FakeLlm::start().await;
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let r = turn(
        &llm,
        &gw.api,
        "a",
        "alice",
        vec![
            call(
                "ok",
                "memory_get",
                json!({ "path": "memory/notes.md", "from_line": 10, "lines": 3 }),
            ),
            call("up", "memory_get", json!({ "path": "../outside.md" })),
            call(
                "up2",
                "memory_get",
                json!({ "path": "memory/../../outside.md" }),
            ),
            call(
                "abs",
                "memory_get",
                json!({ "path": dir.path().join("outside.md") }),
            ),
            call("sym", "memory_get", json!({ "path": "memory/out.md" })),
            call("sym2", "memory_get", json!({ "path": "memory/bob.md" })),
            call(
                "other",
                "memory_get",
                json!({ "path": "users/http-bob/memory/MEMORY.md" }),
            ),
            call(
                "other2",
                "memory_get",
                json!({ "path": "users/http-alice/../http-bob/memory/MEMORY.md" }),
            ),
            call("plain", "memory_get", json!({ "path": "plain.txt" })),
            call(
                "own-sym",
                "memory_get",
                json!({ "path": "users/http-alice/memory/bob.md" }),
            ),
        ],
    )
    .await;
    let ok = result(&r, "ok");
    assert_eq!(ok["content"], "line 10\nline 11\nline 12", "{ok}");
    assert_eq!(ok["total_lines"], 30);
    assert_eq!(ok["to_line"], 12);
    for id in [
        "up", "up2", "abs", "sym", "sym2", "other", "other2", "plain", "own-sym",
    ] {
        let v = result(&r, id);
        assert!(v["error_code"].is_string(), "{id} was not refused: {v}");
    }
    let all = serde_json::to_string(&r).unwrap();
    assert!(!all.contains("CANARY"), "{all}");
    assert!(!all.contains("secret plan"), "{all}");
    gw.stop().await;
}

#[tokio::test]
async fn the_memory_group_holds_the_four_tools_and_subagents_never_get_search_or_get() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    // Denying the group removes all four.
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({ "tools": { "policy": { "deny": ["group:memory"] } } }),
    ))
    .await;
    llm.push(Reply::Text("ok".into()));
    assert_eq!(gw.api.chat("c", "hi").await.0, 200);
    let names = reachable_tools(&llm.requests()[0]);
    for t in ["memory_read", "memory_write", "memory_search", "memory_get"] {
        assert!(!names.contains(&t.to_string()), "{t} offered: {names:?}");
    }
    assert!(names.contains(&"read_file".to_string()), "{names:?}");
    gw.stop().await;

    // With the default policy, the parent has all four; a subagent neither search nor get.
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    llm.push(Reply::ToolCalls(vec![call(
        "s",
        "subagents",
        json!({ "action": "run", "task": "look something up" }),
    )]));
    llm.push(Reply::Text("child answer".into()));
    llm.push(Reply::Text("parent answer".into()));
    assert_eq!(gw.api.chat("c", "delegate").await.0, 200);
    let reqs = llm.requests();
    let parent = reachable_tools(&reqs[0]);
    for t in ["memory_read", "memory_write", "memory_search", "memory_get"] {
        assert!(parent.contains(&t.to_string()), "{t} missing: {parent:?}");
    }
    let child = reachable_tools(&reqs[1]);
    assert!(child.contains(&"read_file".to_string()), "{child:?}");
    for t in ["memory_search", "memory_get", "memory_write"] {
        assert!(
            !child.contains(&t.to_string()),
            "{t} offered to a subagent: {child:?}"
        );
    }
    gw.stop().await;
}

/// `weft` with `args` against the config in `dir`: (exit code, stdout, stderr).
fn weft(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = crate::process::weft(dir)
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn weft_memory_ranks_the_exact_phrase_first_reindexes_and_status_counts_the_documents() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let ws = home.join("ws");
    std::fs::create_dir_all(ws.join("memory/2026")).unwrap();
    std::fs::create_dir_all(home.join(".clawft")).unwrap();
    std::fs::write(
        home.join(".clawft/config.toml"),
        format!(
            "[agents.defaults]\nworkspace = \"{}\"\n[store]\npath = \"{}\"\n",
            ws.display(),
            home.join("store").display()
        ),
    )
    .unwrap();
    std::fs::write(
        ws.join("memory/MEMORY.md"),
        "# Trips\n\nWhale watching: we saw a whale near the harbour.\n\n# Birds\n\nThe migration of blue tits, and a blue boat.\n",
    )
    .unwrap();
    std::fs::write(
        ws.join("memory/2026/03-azores.md"),
        "Azores trip: the blue whale migration passes the islands in spring.\n",
    )
    .unwrap();
    std::fs::write(ws.join("memory/whales.md"), "whale whale whale\n").unwrap();
    std::fs::write(
        ws.join("MEMORY.md"),
        "Root memory file: nothing about it.\n",
    )
    .unwrap();

    let (code, out, err) = weft(
        home,
        &["memory", "search", "blue whale migration", "--json"],
    );
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results[0]["path"], "memory/2026/03-azores.md", "{v:#}");
    assert!(results.len() >= 2, "{v:#}");

    let (code, out, err) = weft(home, &["memory", "reindex", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["documents"], 4, "{v:#}");

    let (code, out, err) = weft(home, &["status", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["memory"]["documents"], 4, "{v:#}");
    assert_eq!(v["memory"]["scope"], "user", "{v:#}");
    let (code, out, _) = weft(home, &["status"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("memory") && out.contains("4 documents"),
        "{out}"
    );

    let (code, out, err) = weft(home, &["memory", "search", "harbour"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("memory/MEMORY.md:"), "{out}");
    assert!(out.contains("near the harbour"), "{out}");

    // A user-scoped search sees the user's own notes as well as the agent's.
    std::fs::create_dir_all(home.join(".clawft/users/telegram-42/memory")).unwrap();
    std::fs::write(
        home.join(".clawft/users/telegram-42/memory/MEMORY.md"),
        "Harbour cafe opens at 7.\n",
    )
    .unwrap();
    let (code, out, err) = weft(
        home,
        &[
            "memory",
            "search",
            "--user",
            "telegram:42",
            "harbour",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let paths: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["path"].as_str().unwrap())
        .collect();
    assert!(
        paths.contains(&"users/telegram-42/memory/MEMORY.md"),
        "{paths:?}"
    );
    assert!(paths.contains(&"memory/MEMORY.md"), "{paths:?}");
    let (code, _, err) = weft(home, &["memory", "search", "--user", "nocolon", "x"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("CHANNEL:USER_ID"), "{err}");
}

#[tokio::test]
async fn past_conversations_are_searched_when_enabled_and_only_this_chats() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({ "memory": { "search_transcripts": true } }),
    ))
    .await;
    llm.push(Reply::Text("Nice, a folding bike!".into()));
    let (status, _) = chat_as(&gw.api, "alice-1", "alice", "My bike is a green Brompton.").await;
    assert_eq!(status, 200);
    llm.push(Reply::Text("ok".into()));
    assert_eq!(
        chat_as(&gw.api, "bob-1", "bob", "I ride a Brompton too, a red one.")
            .await
            .0,
        200
    );

    let r = turn(
        &llm,
        &gw.api,
        "alice-1",
        "alice",
        vec![call("s", "memory_search", json!({ "query": "brompton" }))],
    )
    .await;
    let hits = result(&r, "s")["results"].as_array().unwrap().clone();
    assert_eq!(hits.len(), 1, "{r:?}");
    assert_eq!(hits[0]["path"], "sessions/http:alice-1");
    assert!(
        hits[0]["snippet"]
            .as_str()
            .unwrap()
            .contains("green Brompton"),
        "{r:?}"
    );
    // Bob's chat sees his own conversation only, and cannot read Alice's.
    let r = turn(
        &llm,
        &gw.api,
        "bob-1",
        "bob",
        vec![
            call("s", "memory_search", json!({ "query": "brompton green" })),
            call(
                "g",
                "memory_get",
                json!({ "path": "sessions/http:alice-1" }),
            ),
        ],
    )
    .await;
    let all = serde_json::to_string(&r).unwrap();
    assert!(!all.contains("green Brompton"), "{all}");
    assert_eq!(
        result(&r, "s")["results"][0]["path"],
        "sessions/http:bob-1",
        "{all}"
    );
    assert_eq!(result(&r, "g")["error_code"], "PERMISSION_DENIED", "{all}");
    gw.stop().await;
}

/// The names a model uses for the memory file resolve to the file the memory tools write:
/// `memory_get` with `MEMORY.md` reads `memory/MEMORY.md` when the workspace has no
/// `MEMORY.md` of its own (it answered FILE_NOT_FOUND while its own error listed `MEMORY.md` as
/// a memory document).
#[tokio::test]
async fn memory_get_of_memory_md_reads_the_file_memory_write_writes() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join("memory")).unwrap();
    std::fs::write(ws.join("memory/MEMORY.md"), "remember the milk\n").unwrap();
    let llm = FakeLlm::start().await;
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let r = turn(
        &llm,
        &gw.api,
        "m",
        "alice",
        vec![
            call("bare", "memory_get", json!({ "path": "MEMORY.md" })),
            call("full", "memory_get", json!({ "path": "memory/MEMORY.md" })),
        ],
    )
    .await;
    for id in ["bare", "full"] {
        let v = result(&r, id);
        assert_eq!(v["content"], "remember the milk", "{id}: {v}");
    }
    gw.stop().await;
}
