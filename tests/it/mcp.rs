//! MCP through the gateway and the binary: a full agent turn calling a real npm MCP server,
//! internal_only tools exposed by a skill, `weft mcp list`, and `weft mcp-server` driven by the
//! official TypeScript SDK client.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{config, tool_names, tool_results, Api, TestGateway};
use crate::fake_llm::{FakeLlm, Reply};
use crate::process::{weft, write_config};

fn npm(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mcp")
        .join(rel);
    assert!(
        p.exists(),
        "{} is missing: run `npm ci --prefix tests/mcp`",
        p.display()
    );
    p.to_string_lossy().into_owned()
}

fn everything(internal_only: bool) -> Value {
    json!({
        "command": "node",
        "args": [npm("node_modules/@modelcontextprotocol/server-everything/dist/index.js"), "stdio"],
        "internal_only": internal_only,
    })
}

/// Wait until the (only) MCP server reports `connected` in `/v1/status`.
pub async fn connected(api: &Api) -> bool {
    for _ in 0..200 {
        let (_, st) = api.get("/v1/status").await;
        if st["mcp_servers"][0]["state"] == "connected" {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn the_model_calls_a_real_mcp_server_tool_through_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let cfg = config(
        &llm,
        dir.path(),
        json!({"tools": {"mcp_servers": {"everything": everything(false)}}}),
    );
    let gw = TestGateway::start(cfg).await;
    // Startup did not wait for the server; it connects in the background.
    assert!(
        connected(&gw.api).await,
        "server-everything did not connect"
    );
    llm.push(Reply::ToolCalls(vec![(
        "m1".into(),
        "everything__echo".into(),
        r#"{"message":"hello from the model"}"#.into(),
    )]));
    llm.push(Reply::Text("echoed".into()));
    let (s, body) = gw.api.chat("mcp", "echo something").await;
    assert_eq!(s, 200, "{body}");
    let reqs = llm.requests();
    assert!(crate::common::reachable_tools(&reqs[0]).contains(&"everything__echo".to_string()));
    let r = tool_results(&reqs[1]);
    assert!(
        r[0].1.to_string().contains("hello from the model"),
        "{:?}",
        r[0].1
    );
    gw.stop().await;
}

#[tokio::test]
async fn internal_only_tools_are_hidden_until_a_skill_exposes_them() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join("skills/echoer")).unwrap();
    std::fs::write(
        ws.join("skills/echoer/SKILL.md"),
        "---\nname: echoer\ndescription: Echo things\nallowed_tools: [\"hidden__echo\"]\n---\nUse hidden__echo.\n",
    )
    .unwrap();
    let llm = FakeLlm::start().await;
    let cfg = config(
        &llm,
        dir.path(),
        json!({"tools": {"mcp_servers": {"hidden": everything(true)}}}),
    );
    let gw = TestGateway::start(cfg).await;
    assert!(connected(&gw.api).await);
    // Without the skill: not shown, and a call is refused.
    llm.push(Reply::ToolCalls(vec![(
        "h1".into(),
        "hidden__echo".into(),
        r#"{"message":"x"}"#.into(),
    )]));
    llm.push(Reply::Text("no".into()));
    gw.api.chat("a", "try it").await;
    let reqs = llm.requests();
    assert!(!tool_names(&reqs[0])
        .iter()
        .any(|n| n.starts_with("hidden__")));
    assert_eq!(
        tool_results(&reqs[1])[0].1["error_code"],
        "PERMISSION_DENIED"
    );
    // With the skill activated by the model: shown from the next round, and callable.
    llm.push(Reply::ToolCalls(vec![(
        "s1".into(),
        "use_skill".into(),
        r#"{"name":"echoer"}"#.into(),
    )]));
    llm.push(Reply::ToolCalls(vec![(
        "h2".into(),
        "hidden__echo".into(),
        r#"{"message":"exposed"}"#.into(),
    )]));
    llm.push(Reply::Text("done".into()));
    gw.api.chat("b", "use the skill").await;
    let reqs = llm.requests();
    assert!(!tool_names(&reqs[2]).contains(&"hidden__echo".to_string()));
    assert!(tool_names(&reqs[3]).contains(&"hidden__echo".to_string()));
    let r = tool_results(&reqs[4]);
    assert!(r.last().unwrap().1.to_string().contains("exposed"), "{r:?}");
    gw.stop().await;
}

#[tokio::test]
async fn weft_mcp_list_reports_states_without_a_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &json!({
            "agents": {"defaults": {"workspace": dir.path().join("ws").to_str().unwrap()}},
            "store": {"path": dir.path().join("store").to_str().unwrap()},
            "tools": {"mcp_servers": {
                "everything": everything(true),
                "ghost": {"command": "/nonexistent/mcp-server"},
            }},
        }),
    );
    let out = tokio::task::spawn_blocking(move || {
        weft(dir.path())
            .arg("--config")
            .arg(&cfg)
            .args(["mcp", "list", "--json"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let by = |n: &str| {
        v.as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == n)
            .cloned()
            .unwrap()
    };
    assert_eq!(by("everything")["state"], "connected", "{v}");
    assert!(by("everything")["tools"].as_u64().unwrap() > 3);
    assert_eq!(by("ghost")["state"], "failed");
    assert!(by("ghost")["last_error"]
        .as_str()
        .unwrap()
        .contains("/nonexistent/mcp-server"));
}

#[tokio::test]
async fn weft_mcp_server_serves_the_builtin_tools_to_the_typescript_sdk_client() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("note.txt"), "from the workspace").unwrap();
    std::fs::write(dir.path().join("outside.txt"), "outside-secret").unwrap();
    let cfg = write_config(
        dir.path(),
        &json!({
            "agents": {"defaults": {"workspace": ws.to_str().unwrap()}},
            "store": {"path": dir.path().join("store").to_str().unwrap()},
            "tools": {"policy": {"deny": ["exec_shell"]}},
        }),
    );
    let report = dir.path().join("report.json");
    let calls = json!([
        ["read_file", {"path": "note.txt"}],
        ["read_file", {"path": "../outside.txt"}],
    ]);
    let (report2, cfg2, d) = (report.clone(), cfg.clone(), dir.path().to_path_buf());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("node")
            .arg(npm("sdk-client.mjs"))
            .arg(&report2)
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_weft"))
            .arg("--config")
            .arg(&cfg2)
            .arg("mcp-server")
            .env("HOME", &d)
            .env("CLAWFT_HOME", d.join(".clawft"))
            .env("CALLS", calls.to_string())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let tools: Vec<&str> = r["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(tools.contains(&"read_file"), "{tools:?}");
    assert!(!tools.contains(&"exec_shell"), "policy ignored: {tools:?}");
    assert_eq!(r["results"][0]["isError"], false);
    assert!(r["results"][0]["text"]
        .as_str()
        .unwrap()
        .contains("from the workspace"));
    assert_eq!(r["results"][1]["isError"], true);
    assert!(r["results"][1]["text"]
        .as_str()
        .unwrap()
        .contains("INVALID_PATH"));
    assert!(!r.to_string().contains("outside-secret"));
}
