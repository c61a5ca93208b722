//! Custom tools from the config (seed 004 §8, issue 20): the model sees them like built-ins and
//! calls them; hostile values reach the program as one literal word; a reload adds one.

use serde_json::json;

use crate::common::{config, tool_names, tool_results, TestGateway};
use crate::fake_llm::{FakeLlm, Reply};

#[tokio::test]
async fn a_custom_tool_is_offered_and_its_values_stay_literal() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let canary = ws.join("CANARY");
    std::fs::write(&canary, "alive").unwrap();
    let hostile = format!(
        "$(rm -f {0}); rm -f {0} `rm -f {0}`\nrm -f {0}",
        canary.display()
    );
    llm.push(Reply::ToolCalls(vec![(
        "c1".into(),
        "shout".into(),
        json!({"text": hostile}).to_string(),
    )]));
    llm.push(Reply::EchoToolResults);
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"tools": {"custom": {"shout": {
            "description": "Print a text between brackets.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
            "command": "printf '[%s]' {{text}}"
        }}}}),
    ))
    .await;
    let (status, _) = gw.api.chat("c", "shout it").await;
    assert_eq!(status, 200);
    let reqs = llm.requests();
    assert!(tool_names(&reqs[0]).contains(&"shout".to_string()));
    let (_, result) = tool_results(&reqs[1]).pop().unwrap();
    assert_eq!(result["exit_code"], 0, "{result}");
    assert_eq!(result["stdout"], format!("[{hostile}]"), "{result}");
    assert_eq!(std::fs::read_to_string(&canary).unwrap(), "alive");
    gw.stop().await;
}
