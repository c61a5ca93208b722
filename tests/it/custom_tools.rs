//! Custom tools from the config (seed 004 §8, issue 20): the model sees them like built-ins and
//! calls them; hostile values reach the program as one literal word; a reload adds one.

use serde_json::json;

use crate::common::{config, reachable_tools, tool_results, TestGateway};
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
    assert!(reachable_tools(&reqs[0]).contains(&"shout".to_string()));
    let (_, result) = tool_results(&reqs[1]).pop().unwrap();
    assert_eq!(result["exit_code"], 0, "{result}");
    assert_eq!(result["stdout"], format!("[{hostile}]"), "{result}");
    assert_eq!(std::fs::read_to_string(&canary).unwrap(), "alive");
    gw.stop().await;
}

/// `env`: a literal variable and a secret read from the daemon's environment reach the
/// command; the secret's bytes are scrubbed from what the model sees.
#[tokio::test]
async fn a_custom_tools_secret_env_reaches_the_command_and_is_scrubbed() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::ToolCalls(vec![(
        "c1".into(),
        "whoami_api".into(),
        json!({}).to_string(),
    )]));
    llm.push(Reply::EchoToolResults);
    let v = crate::common::config_value(
        &llm.base_url(),
        dir.path(),
        json!({"tools": {"custom": {"whoami_api": {
            "description": "Show the API settings.",
            "command": "printf 'region=%s len=%s token=%s' \"$REGION\" \"${#API_TOKEN}\" \"$API_TOKEN\"",
            "env": {"REGION": "eu-1", "API_TOKEN_env": "CUSTOM_TEST_TOKEN"}
        }}}}),
    );
    let secret = "tok-3f9a7c2e1d5b-secret";
    let env = clawft::config::Env::from_pairs([
        ("HOME", dir.path().to_str().unwrap()),
        ("CLAWFT_HOME", dir.path().join(".clawft").to_str().unwrap()),
        ("CUSTOM_TEST_TOKEN", secret),
    ]);
    let cfg = clawft::config::Config::from_str(&v.to_string(), false, &env).unwrap();
    let gw = TestGateway::start(cfg).await;
    let (status, body) = gw.api.chat("c", "check the api").await;
    assert_eq!(status, 200);
    let reqs = llm.requests();
    let (_, result) = tool_results(&reqs[1]).pop().unwrap();
    let out = result["stdout"].as_str().unwrap();
    assert!(out.starts_with("region=eu-1 len=23 token="), "{result}");
    assert!(!result.to_string().contains(secret), "{result}");
    assert!(!body.to_string().contains(secret));
    gw.stop().await;
    // A variable that changes which code runs is refused, naming the key.
    let bad = crate::common::config_value(
        &llm.base_url(),
        dir.path(),
        json!({"tools": {"custom": {"t": {"description": "x", "command": "true", "env": {"LD_PRELOAD": "/x.so"}}}}}),
    );
    let e = clawft::config::Config::from_str(&bad.to_string(), false, &env)
        .unwrap_err()
        .to_string();
    assert!(e.contains("tools.custom.t.env.LD_PRELOAD"), "{e}");
}
