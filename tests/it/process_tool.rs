//! The `process` tool through the gateway (issue 20, item 3): a process started in a turn is
//! listed and polled in the next one, killed by `/new`, and one started after is gone once the
//! gateway has shut down (checked by the host pid the tool reports).

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{config, reachable_tools, tool_results, wait_until, TestGateway};
use crate::fake_llm::{FakeLlm, Reply};

fn call(id: &str, args: Value) -> Reply {
    Reply::ToolCalls(vec![(id.into(), "process".into(), args.to_string())])
}

/// The result of the tool call `id` in the last request that has it.
fn result_of(llm: &FakeLlm, id: &str) -> Value {
    llm.requests()
        .iter()
        .rev()
        .find_map(|r| {
            tool_results(r)
                .into_iter()
                .find(|(c, _)| c == id)
                .map(|(_, v)| v)
        })
        .unwrap_or_else(|| panic!("no result for {id}"))
}

fn alive(pid: u64) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[tokio::test]
async fn a_process_is_listed_polled_killed_by_new_and_gone_after_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;

    // Turn 1: start it.
    llm.push(call(
        "c1",
        json!({"action": "start", "command": "echo started; echo $$ > pid; exec sleep 300"}),
    ));
    llm.push(Reply::Text("started".into()));
    assert_eq!(gw.api.chat("c", "run the server").await.0, 200);
    assert!(reachable_tools(&llm.requests()[0]).contains(&"process".to_string()));
    let started = result_of(&llm, "c1");
    assert_eq!(started["status"], "running", "{started}");
    let id = started["id"].as_str().unwrap().to_string();
    let pid = started["pid"].as_u64().unwrap();
    assert!(alive(pid), "{started}");
    assert!(wait_until(Duration::from_secs(10), || ws.join("pid").exists()).await);

    // Turn 2: list and poll; the model gets the id, status, pid and the new output.
    llm.push(Reply::ToolCalls(vec![
        (
            "c2".into(),
            "process".into(),
            json!({"action": "list"}).to_string(),
        ),
        (
            "c3".into(),
            "process".into(),
            json!({"action": "poll", "id": id}).to_string(),
        ),
    ]));
    llm.push(Reply::Text("still running".into()));
    assert_eq!(gw.api.chat("c", "how is it?").await.0, 200);
    let list = result_of(&llm, "c2");
    let listed = &list["processes"][0];
    assert_eq!(
        (
            listed["id"].as_str(),
            listed["status"].as_str(),
            listed["pid"].as_u64()
        ),
        (Some(id.as_str()), Some("running"), Some(pid)),
        "{list}"
    );
    let polled = result_of(&llm, "c3");
    assert_eq!(polled["output"], "started\n", "{polled}");
    assert_eq!(polled["status"], "running", "{polled}");

    // `/new` kills it (and it is reaped: no zombie left under the gateway).
    assert_eq!(gw.api.chat("c", "/new").await.0, 200);
    assert!(
        wait_until(Duration::from_secs(10), || !alive(pid)).await,
        "pid {pid} still there after /new"
    );

    // A second process is gone once the gateway has shut down.
    llm.push(call(
        "c4",
        json!({"action": "start", "command": "exec sleep 300"}),
    ));
    llm.push(Reply::Text("again".into()));
    assert_eq!(gw.api.chat("c", "run it again").await.0, 200);
    let second = result_of(&llm, "c4");
    let pid2 = second["pid"].as_u64().unwrap();
    assert!(alive(pid2), "{second}");
    gw.stop().await;
    assert!(!alive(pid2), "pid {pid2} outlived the gateway's shutdown");
}
