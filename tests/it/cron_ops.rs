//! Issue 19's operator surface: `weft cron` through the running gateway, the scheduler in
//! `weft status` and `/metrics`, and the `gateway` tool (opt-in, never for subagents, its
//! reload going through the SIGHUP path).

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{config, messages, reachable_tools, tool_results, Api, TestGateway};
use crate::fake_llm::{FakeLlm, Reply};
use crate::process::{free_port, gateway_config, weft, Daemon};

const T: Duration = Duration::from_secs(30);
const API_KEY: &str = "sk-test-secret-123456";

/// `weft --config CFG ARGS…`: (success, stdout, stderr).
async fn run(home: &Path, cfg: &Path, args: &[&str]) -> (bool, String, String) {
    let (home, cfg) = (home.to_path_buf(), cfg.to_path_buf());
    let args: Vec<String> = args.iter().map(ToString::to_string).collect();
    let out = tokio::task::spawn_blocking(move || {
        weft(&home)
            .arg("--config")
            .arg(&cfg)
            .args(&args)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `weft … ARGS --json` that must succeed, parsed.
async fn run_json(home: &Path, cfg: &Path, args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.push("--json");
    let (ok, out, err) = run(home, cfg, &args).await;
    assert!(ok, "weft {args:?} failed: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

async fn metrics(api: &Api) -> String {
    api.http
        .get(format!("{}/metrics", api.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn mailbox(api: &Api, chat: &str) -> Vec<Value> {
    let (s, v) = api.get(&format!("/v1/chats/{chat}/messages")).await;
    assert_eq!(s, 200, "{v}");
    v["messages"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn weft_cron_manages_jobs_through_the_gateway_and_status_and_metrics_show_them() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = gateway_config(home, &llm, port, json!({}));

    // No gateway: a clear error, not a direct write behind the scheduler's back.
    let (ok, _, err) = run(home, &cfg, &["cron", "list"]).await;
    assert!(!ok);
    assert!(
        err.contains("running gateway") && err.contains("weft gateway"),
        "{err}"
    );

    let d = Daemon::start(home, &cfg, port).await;
    let added = run_json(
        home,
        &cfg,
        &[
            "cron",
            "add",
            "--name",
            "stretch",
            "--every",
            "2h",
            "--text",
            "--message",
            "stand up and stretch",
            "--channel",
            "http",
            "--chat",
            "ops",
        ],
    )
    .await;
    let id = added["job"]["id"].as_str().unwrap().to_string();
    assert_eq!(
        added["job"]["schedule"],
        json!({"kind": "every", "seconds": 7200})
    );
    // Owned by the target chat's session, so that chat's `cron` tool sees it.
    assert_eq!(added["job"]["owner"], "http:ops");

    let list = run_json(home, &cfg, &["cron", "list"]).await;
    let jobs = list["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{list}");
    assert_eq!(jobs[0]["id"], id.as_str());
    assert!(jobs[0]["next_run"].is_string(), "{list}");
    assert_eq!(jobs[0]["enabled"], true);
    let (ok, table, _) = run(home, &cfg, &["cron", "list"]).await;
    assert!(
        ok && table.contains("stretch") && table.contains("every 2h") && table.contains("UTC)"),
        "{table}"
    );

    // Refused schedules name the setting; the exit code says it failed.
    let (ok, _, err) = run(
        home,
        &cfg,
        &[
            "cron",
            "add",
            "--name",
            "spam",
            "--every",
            "1",
            "--message",
            "x",
            "--channel",
            "http",
            "--chat",
            "ops",
        ],
    )
    .await;
    assert!(!ok);
    assert!(err.contains("scheduler.min_interval_secs"), "{err}");
    let (ok, _, err) = run(
        home,
        &cfg,
        &[
            "cron",
            "add",
            "--name",
            "x",
            "--every",
            "1h",
            "--message",
            "x",
            "--channel",
            "nope",
            "--chat",
            "ops",
        ],
    )
    .await;
    assert!(
        !ok && err.contains("target.channel") && err.contains("http"),
        "{err}"
    );

    // Status: the row, and the JSON object.
    let (ok, status, _) = run(home, &cfg, &["status"]).await;
    assert!(ok, "{status}");
    let row = status
        .lines()
        .find(|l| l.starts_with("scheduler"))
        .unwrap_or_else(|| panic!("no scheduler row: {status}"));
    assert!(
        row.contains("1 jobs (1 enabled, 0 paused)")
            && row.contains("next: stretch at")
            && row.contains("heartbeat off"),
        "{row}"
    );
    let st = run_json(home, &cfg, &["status"]).await;
    assert_eq!(st["scheduler"]["next_runs"][0]["id"], id.as_str(), "{st}");
    assert_eq!(st["scheduler"]["counts"]["ok"], 0, "{st}");

    let m = metrics(&d.api).await;
    assert!(
        m.contains("clawft_scheduler_jobs{state=\"enabled\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("clawft_scheduler_jobs{state=\"paused\"} 0"),
        "{m}"
    );
    assert!(m.contains("clawft_scheduler_next_run_seconds "), "{m}");
    assert!(
        m.contains("# TYPE clawft_scheduler_late_runs_total counter"),
        "{m}"
    );

    // A manual run delivers the text to the chat and is counted by outcome.
    let (ok, out, err) = run(home, &cfg, &["cron", "run", &id]).await;
    assert!(ok && out.contains("started run"), "{out}{err}");
    let deadline = std::time::Instant::now() + T;
    loop {
        let got = mailbox(&d.api, "ops").await;
        if got.iter().any(|m| m["content"] == "stand up and stretch") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not delivered: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = std::time::Instant::now() + T;
    loop {
        let m = metrics(&d.api).await;
        if m.contains("clawft_scheduler_runs_total{outcome=\"ok\"} 1") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "run not counted: {m}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let runs = run_json(home, &cfg, &["cron", "runs", &id]).await;
    assert_eq!(runs["runs"][0]["outcome"], "ok", "{runs}");

    let paused = run_json(home, &cfg, &["cron", "list"]).await;
    assert_eq!(paused["jobs"][0]["last_run"]["outcome"], "ok", "{paused}");
    let (ok, _, err) = run(home, &cfg, &["cron", "pause", &id]).await;
    assert!(ok, "{err}");
    let list = run_json(home, &cfg, &["cron", "list"]).await;
    assert_eq!(list["jobs"][0]["enabled"], false, "{list}");
    assert!(metrics(&d.api)
        .await
        .contains("clawft_scheduler_jobs{state=\"paused\"} 1"));
    let (ok, _, err) = run(home, &cfg, &["cron", "resume", &id]).await;
    assert!(ok, "{err}");
    let list = run_json(home, &cfg, &["cron", "list"]).await;
    assert_eq!(list["jobs"][0]["enabled"], true, "{list}");
    assert!(list["jobs"][0]["next_run"].is_string(), "{list}");

    let (ok, out, err) = run(home, &cfg, &["cron", "remove", &id]).await;
    assert!(ok && out.contains("removed stretch"), "{out}{err}");
    let list = run_json(home, &cfg, &["cron", "list"]).await;
    assert_eq!(list["jobs"], json!([]), "{list}");
    let (ok, _, err) = run(home, &cfg, &["cron", "pause", &id]).await;
    assert!(!ok && err.contains("no scheduled job"), "{err}");
    d.term();
}

/// The last tool result the fake LLM was sent, as text.
fn last_result(llm: &FakeLlm) -> Value {
    let reqs = llm.requests();
    let req = reqs.last().unwrap();
    tool_results(req)
        .last()
        .map(|(_, v)| v.clone())
        .unwrap_or(Value::Null)
}

/// Have the model call `gateway` with `args` in chat `chat`, then answer "done".
async fn call_gateway(api: &Api, llm: &FakeLlm, chat: &str, args: Value) -> Value {
    llm.push(Reply::ToolCalls(vec![(
        "g1".into(),
        "gateway".into(),
        args.to_string(),
    )]));
    llm.push(Reply::Text("done".into()));
    let (s, body) = api.chat(chat, "gateway please").await;
    assert_eq!(s, 200, "{body}");
    last_result(llm)
}

#[tokio::test]
async fn the_gateway_tool_is_denied_by_default_and_when_opted_in_shows_status_and_reloads() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = gateway_config(home, &llm, port, json!({}));
    let d = Daemon::start(home, &cfg, port).await;
    let r = call_gateway(&d.api, &llm, "a", json!({"action": "status"})).await;
    assert_eq!(r["error_code"], "PERMISSION_DENIED", "{r}");
    let first = &llm.requests()[0];
    let names = reachable_tools(first);
    assert!(!names.contains(&"gateway".to_string()), "{names:?}");
    assert!(names.contains(&"cron".to_string()), "{names:?}");
    d.term();

    // Opted in: the status, without a secret.
    let cfg = gateway_config(
        home,
        &llm,
        port,
        json!({"tools": {"policy": {"also_allow": ["gateway"]}}}),
    );
    let d = Daemon::start(home, &cfg, port).await;
    let r = call_gateway(&d.api, &llm, "b", json!({"action": "status"})).await;
    assert!(r["version"].is_string(), "{r}");
    assert!(r["uptime_secs"].is_u64(), "{r}");
    assert!(r["channels"]["http"].is_string(), "{r}");
    assert!(r["scheduler"]["jobs"]["total"].is_u64(), "{r}");
    assert_eq!(r["store"]["health"]["status"], "ok", "{r}");
    let req = llm.requests().last().cloned().unwrap();
    assert!(reachable_tools(&req).contains(&"gateway".to_string()));
    let seen = serde_json::to_string(&messages(&req)).unwrap();
    assert!(!seen.contains(API_KEY), "the API key reached the model");
    let token = crate::process::control_token(&cfg).unwrap();
    assert!(
        !seen.contains(&token),
        "the control token reached the model"
    );

    // Anything but status and reload is refused.
    let r = call_gateway(&d.api, &llm, "b", json!({"action": "restart"})).await;
    assert_eq!(r["error_code"], "INVALID_ARGS", "{r}");

    // Reload after the operator edited the file: applied, as SIGHUP would.
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    crate::common::merge(
        &mut v,
        json!({"tools": {"policy": {"deny": ["web_fetch"]}}}),
    );
    std::fs::write(&cfg, v.to_string()).unwrap();
    let r = call_gateway(&d.api, &llm, "b", json!({"action": "reload"})).await;
    assert_eq!(r["status"], "reloaded", "{r}");
    assert!(r["changes"].to_string().contains("tools: policy"), "{r}");
    llm.push(Reply::Text("ok".into()));
    let (s, _) = d.api.chat("b", "next").await;
    assert_eq!(s, 200);
    let names = reachable_tools(llm.requests().last().unwrap());
    assert!(!names.contains(&"web_fetch".to_string()), "{names:?}");
    assert!(names.contains(&"gateway".to_string()), "{names:?}");

    // A config that does not load is rejected with its reason; the running one stays.
    std::fs::write(
        &cfg,
        r#"{"agents": {"defaults": {"max_tool_iteratons": 3}}}"#,
    )
    .unwrap();
    let r = call_gateway(&d.api, &llm, "b", json!({"action": "reload"})).await;
    assert_eq!(r["error_code"], "EXECUTION_FAILED", "{r}");
    assert!(
        r["error"].as_str().unwrap().contains("max_tool_iteratons"),
        "{r}"
    );
    assert!(
        r["error"].as_str().unwrap().contains("stays in force"),
        "{r}"
    );
    d.term();
}

#[tokio::test]
async fn subagents_never_get_gateway_or_cron_even_when_opted_in() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.route(|req| {
        let msgs = messages(req);
        let child = msgs
            .first()
            .and_then(|m| m["content"].as_str())
            .is_some_and(|s| s.contains("You are a subagent"));
        let after_tool = msgs.last().is_some_and(|m| m["role"] == "tool");
        Some(match (child, after_tool) {
            (true, false) => Reply::ToolCalls(vec![
                (
                    "c1".into(),
                    "gateway".into(),
                    json!({"action": "status"}).to_string(),
                ),
                (
                    "c2".into(),
                    "cron".into(),
                    json!({"action": "list"}).to_string(),
                ),
            ]),
            (true, true) => Reply::Text("child done".into()),
            (false, false) => Reply::ToolCalls(vec![(
                "p1".into(),
                "subagents".into(),
                json!({"action": "run", "task": "look at the gateway"}).to_string(),
            )]),
            (false, true) => Reply::Text("parent done".into()),
        })
    });
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"tools": {"policy": {"also_allow": ["gateway", "group:automation"]}}}),
    ))
    .await;
    let (s, body) = gw.api.chat("p", "delegate").await;
    assert_eq!(s, 200, "{body}");
    let reqs = llm.requests();
    let is_child = |r: &Value| {
        messages(r)
            .first()
            .and_then(|m| m["content"].as_str())
            .is_some_and(|s| s.contains("You are a subagent"))
    };
    let parent = reqs.iter().find(|r| !is_child(r)).unwrap();
    assert!(reachable_tools(parent).contains(&"gateway".to_string()));
    let children: Vec<&Value> = reqs.iter().filter(|r| is_child(r)).collect();
    assert!(children.len() >= 2, "{reqs:?}");
    for n in ["gateway", "cron"] {
        assert!(
            !reachable_tools(children[0]).contains(&n.to_string()),
            "{n} offered to a child"
        );
    }
    let results = tool_results(children[1]);
    assert_eq!(results.len(), 2, "{results:?}");
    for (_, r) in &results {
        assert_eq!(r["error_code"], "PERMISSION_DENIED", "{r}");
    }
    gw.stop().await;
}
