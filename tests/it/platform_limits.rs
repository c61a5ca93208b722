//! Issue 16 finding 5: sessions over `sessions.max_in_memory` leave memory once idle (least
//! recently used first) and come back from the store with their history.

use std::time::Duration;

use serde_json::json;

use crate::common::{config, messages, TestGateway};
use crate::fake_llm::{FakeLlm, Reply};

const T: Duration = Duration::from_secs(20);

async fn live(gw: &TestGateway) -> u64 {
    let (status, body) = gw.api.get("/v1/status").await;
    assert_eq!(status, 200, "{body}");
    body["sessions"]["live"].as_u64().unwrap()
}

#[tokio::test]
async fn sessions_over_the_memory_budget_are_evicted_and_reload_with_their_history() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.route(|_| Some(Reply::Text("noted".into())));
    let budget = 3;
    // idle_secs is long: only the budget can make sessions leave within the test.
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"sessions": {"idle_secs": 3600, "max_in_memory": budget}}),
    ))
    .await;
    for i in 0..10 {
        let (status, body) = gw
            .api
            .chat(&format!("burst-{i}"), &format!("my number is {i}"))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let deadline = tokio::time::Instant::now() + T;
    let mut n = live(&gw).await;
    while n > budget {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{n} sessions still in memory, budget {budget}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        n = live(&gw).await;
    }
    // The first session (evicted: least recently used) answers with its history.
    let before = llm.requests().len();
    let (status, body) = gw.api.chat("burst-0", "what is my number?").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["reply"], "noted");
    let reqs = llm.requests();
    let last = reqs.last().unwrap();
    assert_eq!(reqs.len(), before + 1);
    let seen: Vec<String> = messages(last)
        .iter()
        .filter_map(|m| m["content"].as_str().map(str::to_string))
        .collect();
    assert!(
        seen.iter().any(|c| c == "my number is 0") && seen.iter().any(|c| c == "noted"),
        "history lost: {seen:?}"
    );
    gw.stop().await;
}

/// Issue 16 finding 6: a chat whose typing indicator fails is logged once at debug (with the
/// channel and chat), not on every 4 s tick of a turn.
#[tokio::test]
async fn typing_failures_are_logged_once_per_chat() {
    use clawft_channel_telegram::fake::{Failure, FakeTelegram};

    use crate::process::{control_token, gateway_config, log_of, weft, Daemon};

    let tg = FakeTelegram::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    // Long enough for two typing ticks (at the start and 4 s in).
    llm.push(Reply::Delay(
        Duration::from_millis(4500),
        Box::new(Reply::Text("done".into())),
    ));
    for _ in 0..3 {
        tg.fail_next(
            "sendChatAction",
            Failure::BadRequest("Bad Request: not enough rights".into()),
        );
    }
    let port = crate::process::free_port();
    let cfg = gateway_config(
        dir.path(),
        &llm,
        port,
        json!({"channels": {"telegram": {
            "token": FakeTelegram::TOKEN, "api_url": tg.api_url(), "allow_from": [111],
            "stream_edits": false,
        }}}),
    );
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.path().join("gateway.log"))
        .unwrap();
    let child = weft(dir.path())
        .env("RUST_LOG", "info,clawft::egress=debug")
        .arg("--config")
        .arg(&cfg)
        .arg("gateway")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    assert!(
        crate::common::wait_until(T, || control_token(&cfg).is_some()).await,
        "{}",
        log_of(dir.path())
    );
    let d = Daemon {
        child,
        api: crate::common::Api::new(&format!("http://127.0.0.1:{port}")),
    };
    tg.push_user_message(111, 111, "take your time");
    let sent = tg.wait_sent(1, T).await;
    assert_eq!(sent.len(), 1, "{}", log_of(dir.path()));
    let tries = tg.calls("sendChatAction").len();
    assert!(tries >= 2, "{tries} typing calls");
    assert_eq!(d.term().code(), Some(0));
    // Without the terminal colours.
    let log: String = log_of(dir.path())
        .split('\x1b')
        .enumerate()
        .map(|(i, part)| match (i, part.find('m')) {
            (0, _) | (_, None) => part,
            (_, Some(end)) => &part[end + 1..],
        })
        .collect();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("typing indicator failed"))
        .collect();
    assert_eq!(lines.len(), 1, "{tries} failed typing calls:\n{log}");
    assert!(
        lines[0].contains("chat=111") && lines[0].contains("not enough rights"),
        "{}",
        lines[0]
    );
}
