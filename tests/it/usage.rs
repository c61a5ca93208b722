//! Token accounting and cost budgets (issue 15, items 1 and 6): the usage each provider call
//! reports (or an estimate) is summed per session, day, model and user in the store, shown by
//! `weft usage`, `/status`, `weft sessions show` and `/metrics`; a turn after a budget is
//! reached is refused with the reason, and the provider never sees it.

use std::path::Path;

use serde_json::{json, Value};

use crate::common::{config, config_value, Api, TestGateway};
use crate::fake_llm::{est_tokens, FakeLlm, Reply};
use crate::process::{free_port, gateway_config, log_of, weft, Daemon};

/// Prices of the fake's model: $1 per output token, input free, so a reply's cost is exactly
/// its length / 4 (rounded up) in dollars.
fn output_priced() -> Value {
    json!({"prices": {"fake-model": {"input": 0.0, "cached": 0.0, "output": 1_000_000.0}}})
}

/// The prompt of a recorded request as the fake sizes it (tools, then messages, serialised).
fn prompt_of(req: &Value) -> Vec<u8> {
    let mut v = serde_json::to_vec(&req["tools"]).unwrap();
    v.extend(serde_json::to_vec(&req["messages"]).unwrap());
    v
}

/// (prompt tokens, cached tokens) the fake reported for request `i`.
fn reported(reqs: &[Value], i: usize) -> (u64, u64) {
    let p = prompt_of(&reqs[i]);
    let cached = match i {
        0 => 0,
        _ => {
            let prev = prompt_of(&reqs[i - 1]);
            let n = p
                .iter()
                .zip(prev.iter())
                .take_while(|(a, b)| a == b)
                .count();
            est_tokens(n) & !63
        }
    };
    (est_tokens(p.len()), cached)
}

async fn chat_as(api: &Api, chat: &str, sender: &str, text: &str) -> (u16, Value) {
    let r = api
        .http
        .post(format!("{}/v1/chat", api.base))
        .json(&json!({"chat_id": chat, "content": text, "sender": sender}))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn usage(api: &Api, by: &str) -> Value {
    let r = api
        .http
        .post(format!("{}/v1/admin/usage", api.base))
        .json(&json!({"by": by, "days": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

fn row<'a>(v: &'a Value, key: &str) -> &'a Value {
    v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == key)
        .unwrap_or_else(|| panic!("no row {key} in {v:#}"))
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

/// The value of the sample `line_start` (name and labels) in a Prometheus text.
fn sample(text: &str, line_start: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(line_start))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn reported_tokens_are_summed_per_session_day_and_model_and_missing_ones_estimated() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("one".into()));
    llm.push(Reply::Text("two".into()));
    llm.push(Reply::NoUsage("three".into()));
    let prices = json!({"prices": {"fake-model": {"input": 1.0, "cached": 0.5, "output": 2.0}}});
    let gw = TestGateway::start(config(&llm, dir.path(), prices)).await;
    assert_eq!(gw.api.chat("a", "first").await.1["reply"], "one");
    assert_eq!(gw.api.chat("a", "second").await.1["reply"], "two");
    assert_eq!(gw.api.chat("b", "third").await.1["reply"], "three");
    // What was sent, the times before the messages included: what the fake counted.
    let reqs = llm.raw_requests();
    assert_eq!(reqs.len(), 3);
    let (p0, c0) = reported(&reqs, 0);
    let (p1, c1) = reported(&reqs, 1);
    assert!(
        c1 > 0,
        "the fake should report a cached prefix for the second call"
    );
    // "one" and "two": 1 completion token each.
    let (input, cached, output) = (p0 + p1, c0 + c1, 2);

    let by_session = usage(&gw.api, "session").await;
    let a = row(&by_session, "http:a");
    assert_eq!(a["calls"], 2);
    assert_eq!(a["input_tokens"], input);
    assert_eq!(a["cached_tokens"], cached);
    assert_eq!(a["output_tokens"], output);
    assert_eq!(a["estimated_calls"], 0);
    let cost = ((input - cached) as f64 + cached as f64 * 0.5 + output as f64 * 2.0) / 1e6;
    assert!(
        (a["cost_usd"].as_f64().unwrap() - cost).abs() < 1e-12,
        "{a}"
    );
    // The provider reported nothing for "three": estimated, and flagged.
    let b = row(&by_session, "http:b");
    assert_eq!(b["estimated_calls"], 1);
    assert!(b["input_tokens"].as_u64().unwrap() > 0, "{b}");
    assert_eq!(b["output_tokens"], 2, "\"three\" is 5 bytes: 2 tokens");

    let by_model = usage(&gw.api, "model").await;
    assert_eq!(row(&by_model, "fake-model")["calls"], 3);
    let by_day = usage(&gw.api, "day").await;
    assert_eq!(by_day["rows"].as_array().unwrap().len(), 1);
    assert_eq!(
        by_day["total"]["input_tokens"].as_u64().unwrap(),
        input + b["input_tokens"].as_u64().unwrap()
    );
    assert_eq!(by_day["total"]["cached_tokens"], cached);

    // /status in the chat, and `weft sessions show` (the API it reads through).
    let (_, st) = gw.api.chat("a", "/status").await;
    let text = st["reply"].as_str().unwrap();
    assert!(
        text.contains(&format!(
            "this conversation {input} tokens in ({cached} cached), {output} out"
        )),
        "{text}"
    );
    let (_, show) = gw.api.get("/v1/sessions/http:a").await;
    assert_eq!(show["usage"]["today"]["input_tokens"], input);
    assert_eq!(show["usage"]["total"]["output_tokens"], output);

    let m = metrics(&gw.api).await;
    assert!(m.contains("clawft_llm_tokens_total{provider=\"openai\",kind=\"cached\"}"));
    assert!(m.contains("clawft_llm_cost_microusd_total{model=\"fake-model\"}"));
    gw.stop().await;
}

#[tokio::test]
async fn the_turn_after_the_daily_budget_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("ok".into())); // $1
    llm.push(Reply::Text("x".repeat(40))); // $10: crosses $5
    let extra = crate::common::merged(output_priced(), json!({"budgets": {"daily_usd": 5.0}}));
    let gw = TestGateway::start(config(&llm, dir.path(), extra)).await;
    assert_eq!(gw.api.chat("a", "one").await.1["reply"], "ok");
    assert_eq!(gw.api.chat("b", "two").await.1["reply"], "x".repeat(40));
    let (status, body) = gw.api.chat("c", "three").await;
    // 429 (what clients expect of a quota), not 502 (a failure of the gateway).
    assert_eq!(status, 429, "{body}");
    let err = body["error"].as_str().unwrap_or_default();
    assert!(
        err.contains("reached its daily budget (US$11.00 of US$5.00, resets at 00:00 UTC)")
            && err.contains("budgets.daily_usd"),
        "{body}"
    );
    assert_eq!(
        llm.requests().len(),
        2,
        "the refused turn reached the provider"
    );
    let m = metrics(&gw.api).await;
    assert!(
        sample(
            &m,
            "clawft_budget_refusals_total{budget=\"budgets.daily_usd\"}"
        ) >= 1.0,
        "{m}"
    );
    assert!(sample(&m, "clawft_llm_cost_microusd_total{model=\"fake-model\"}") >= 11e6);
    // /status says how much is left.
    let (_, st) = gw.api.chat("a", "/status").await;
    assert!(
        st["reply"]
            .as_str()
            .unwrap()
            .contains("US$0.00 left of the daily budget US$5.00"),
        "{st}"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_budget_reached_between_the_llm_calls_of_a_turn_stops_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    let llm = FakeLlm::start().await;
    // 40 bytes of arguments: 10 output tokens, $10.
    let args = format!("{{\"path\":\".\"{}}}", " ".repeat(28));
    assert_eq!(args.len(), 40);
    llm.push(Reply::ToolCalls(vec![(
        "c1".into(),
        "list_directory".into(),
        args,
    )]));
    llm.push(Reply::Text("never".into()));
    let extra = crate::common::merged(output_priced(), json!({"budgets": {"daily_usd": 5.0}}));
    let gw = TestGateway::start(config(&llm, dir.path(), extra)).await;
    let (_, body) = gw.api.chat("a", "list").await;
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("reached its daily budget"),
        "{body}"
    );
    assert_eq!(llm.requests().len(), 1, "a second LLM call was made");
    gw.stop().await;
}

#[tokio::test]
async fn session_and_token_budgets_refuse_one_conversation_and_not_another() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.route(|_| Some(Reply::Text("x".repeat(12)))); // 3 tokens: $3 a turn
    let extra = crate::common::merged(
        output_priced(),
        json!({"budgets": {"per_session_daily_usd": 5.0}}),
    );
    let gw = TestGateway::start(config(&llm, dir.path(), extra)).await;
    assert_eq!(gw.api.chat("a", "1").await.0, 200);
    assert_eq!(gw.api.chat("a", "2").await.0, 200); // $6 in session a
    let (_, body) = gw.api.chat("a", "3").await;
    let err = body["error"].as_str().unwrap_or_default();
    assert!(
        err.contains("This conversation reached its daily budget (US$6.00 of US$5.00")
            && err.contains("budgets.per_session_daily_usd"),
        "{body}"
    );
    assert_eq!(gw.api.chat("b", "4").await.1["reply"], "x".repeat(12));
    assert_eq!(llm.requests().len(), 3);
    let m = metrics(&gw.api).await;
    assert!(
        sample(
            &m,
            "clawft_budget_refusals_total{budget=\"budgets.per_session_daily_usd\"}"
        ) >= 1.0
    );
    gw.stop().await;

    // A chat user with a token budget of 1: their first turn runs, the next is refused, in any
    // conversation; another user is still answered.
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.route(|_| Some(Reply::Text("fine".into())));
    let extra = json!({"budgets": {"per_user_daily_tokens": 1}});
    let gw = TestGateway::start(config(&llm, dir.path(), extra)).await;
    assert_eq!(chat_as(&gw.api, "c", "alice", "5").await.0, 200);
    let (_, body) = chat_as(&gw.api, "d", "alice", "6").await;
    let err = body["error"].as_str().unwrap_or_default();
    assert!(
        err.contains("You reached your daily token budget")
            && err.contains("budgets.per_user_daily_tokens"),
        "{body}"
    );
    assert_eq!(chat_as(&gw.api, "e", "bob", "7").await.0, 200);
    assert_eq!(llm.requests().len(), 2);
    let by_user = usage(&gw.api, "user").await;
    assert_eq!(row(&by_user, "http:alice")["calls"], 1);
    let m = metrics(&gw.api).await;
    assert!(
        sample(
            &m,
            "clawft_budget_refusals_total{budget=\"budgets.per_user_daily_tokens\"}"
        ) >= 1.0
    );
    gw.stop().await;
}

#[test]
fn negative_budgets_and_prices_are_refused_at_load_with_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (json!({"budgets": {"daily_usd": -1.0}}), "budgets.daily_usd"),
        (
            json!({"prices": {"my-model": {"input": 1.0, "output": -2.0}}}),
            "prices.\"my-model\".output",
        ),
    ];
    for (extra, key) in cases {
        let v = config_value("http://127.0.0.1:9/v1", dir.path(), extra);
        let e = clawft::config::Config::from_str(
            &v.to_string(),
            false,
            &crate::common::test_env(dir.path()),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains(key), "{e}");
    }
}

fn weft_usage(dir: &Path, cfg: &Path, by: &str) -> Value {
    crate::process::weft_json(dir, cfg, &["usage", "--by", by, "--json"])
}

/// The process: `weft usage` through the running gateway and from the store, the spend
/// surviving a restart (the budget still refuses), and `weft agent` showing the reason.
#[tokio::test]
async fn usage_and_budgets_survive_a_restart_and_weft_usage_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.route(|_| Some(Reply::Text("x".repeat(12)))); // $3 a turn
    let port = free_port();
    let extra = crate::common::merged(output_priced(), json!({"budgets": {"daily_usd": 5.0}}));
    let cfg = gateway_config(dir.path(), &llm, port, extra);
    let d = Daemon::start(dir.path(), &cfg, port).await;
    assert_eq!(d.api.chat("a", "1").await.0, 200);
    assert_eq!(d.api.chat("b", "2").await.0, 200);
    let via_gateway = weft_usage(dir.path(), &cfg, "model");
    assert_eq!(via_gateway["rows"][0]["key"], "fake-model");
    assert_eq!(via_gateway["rows"][0]["calls"], 2);
    assert_eq!(via_gateway["total"]["cost_usd"], 6.0);
    assert!(d.term().success(), "{}", log_of(dir.path()));

    // No gateway: read from the store.
    let direct = weft_usage(dir.path(), &cfg, "session");
    assert_eq!(direct["rows"].as_array().unwrap().len(), 2);
    assert_eq!(direct["total"]["output_tokens"], 6);
    // By agent: both chats went to the default agent.
    let by_agent = weft_usage(dir.path(), &cfg, "agent");
    assert_eq!(by_agent["rows"].as_array().unwrap().len(), 1, "{by_agent}");
    assert_eq!(by_agent["rows"][0]["key"], "main");
    assert_eq!(by_agent["rows"][0]["calls"], 2);

    // The one-shot agent loads the spend: refused, with the reason, and no LLM request.
    let out = weft(dir.path())
        .arg("--config")
        .arg(&cfg)
        .args(["agent", "-m", "hello"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("reached its daily budget (US$6.00 of US$5.00"),
        "{stderr}"
    );

    // A restarted gateway too; the refusal is logged with the budget key.
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let (_, body) = d.api.chat("c", "3").await;
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("budgets.daily_usd"),
        "{body}"
    );
    assert_eq!(llm.requests().len(), 2);

    // The operator raises the budget and reloads (SIGHUP): answered again.
    let raised = crate::common::merged(output_priced(), json!({"budgets": {"daily_usd": 100.0}}));
    gateway_config(dir.path(), &llm, port, raised);
    let pid = rustix::process::Pid::from_child(&d.child);
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    assert!(
        crate::common::wait_until(std::time::Duration::from_secs(30), || log_of(dir.path())
            .contains("prices and budgets reloaded"))
        .await,
        "{}",
        log_of(dir.path())
    );
    assert_eq!(d.api.chat("c", "4").await.0, 200);
    assert_eq!(llm.requests().len(), 3);
    assert!(d.term().success());
    let log = log_of(dir.path());
    assert!(
        log.contains("budget reached") && log.contains("budgets.daily_usd"),
        "{log}"
    );
}
