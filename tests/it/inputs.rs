//! Inputs the daemon must bound or refuse (issue 14): oversized inbound messages on every
//! channel, allowlist entries that cannot match, protected paths in the file tools.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::common::{config, wait_until, TestGateway};
use crate::fake_llm::{FakeLlm, Reply};

const T: Duration = Duration::from_secs(30);

/// Marks the oversized text so its bytes can be looked for everywhere.
const BIG_MARK: &str = "OVERSIZED-7c1e";
/// What every channel's notice says (`clawft_channel_core::oversized_notice`).
const NOTICE: &str = "over the 32 KB limit for one message";

fn big_text(bytes: usize) -> String {
    let mut s = String::with_capacity(bytes + 64);
    while s.len() < bytes {
        s.push_str(BIG_MARK);
        s.push_str(" lorem ipsum dolor sit amet ");
    }
    s.truncate(bytes);
    s
}

/// Every byte of the store directory (read after the gateway stopped).
fn store_bytes(dir: &Path) -> String {
    let mut disk = Vec::new();
    let mut stack = vec![dir.join("store")];
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                disk.extend(std::fs::read(e.path()).unwrap());
            }
        }
    }
    assert!(!disk.is_empty());
    String::from_utf8_lossy(&disk).into_owned()
}

/// The model saw the normal message only, the oversized one never; the store holds none of it.
fn assert_never_seen(llm: &FakeLlm, dir: &Path) {
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 1, "one request expected (the normal message)");
    let sent = serde_json::to_string(&reqs).unwrap();
    assert!(
        !sent.contains(BIG_MARK),
        "the oversized text reached the model"
    );
    assert!(sent.contains("hello again"));
    let disk = store_bytes(dir);
    assert!(
        disk.contains("hello again"),
        "the store is readable in clear"
    );
    assert!(
        !disk.contains(BIG_MARK),
        "the oversized text is in the store"
    );
}

#[tokio::test]
async fn an_oversized_telegram_text_gets_a_notice_and_the_chat_keeps_answering() {
    use clawft_channel_telegram::fake::FakeTelegram;
    let tg = FakeTelegram::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("second answer".into()));
    let cfg = config(
        &llm,
        dir.path(),
        json!({"channels": {"telegram": {"token": FakeTelegram::TOKEN, "api_url": tg.api_url(), "allow_from": [111], "stream_edits": false}}}),
    );
    let gw = TestGateway::start(cfg).await;
    // The 10 MB text of the report.
    tg.push_user_message(111, 111, &big_text(10 * 1024 * 1024));
    let sent = tg.wait_sent(1, T).await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].chat, 111);
    assert!(sent[0].visible.contains(NOTICE), "{}", sent[0].visible);
    assert!(sent[0].visible.contains("10240 KB"), "{}", sent[0].visible);
    // The update is confirmed (not fetched again), and the chat answers the next message.
    assert!(wait_until(T, || tg.pending_updates().is_empty()).await);
    tg.push_user_message(111, 111, "hello again");
    assert!(
        wait_until(T, || tg.sent().iter().any(|m| m.visible == "second answer")).await,
        "{:?}",
        tg.sent()
    );
    gw.stop().await;
    assert_never_seen(&llm, dir.path());
}

#[tokio::test]
async fn an_oversized_discord_text_gets_a_notice_and_the_chat_keeps_answering() {
    use clawft_channel_discord::fake::{FakeDiscord, FAKE_TOKEN};
    let dc = FakeDiscord::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("second answer".into()));
    let cfg = config(
        &llm,
        dir.path(),
        json!({"channels": {"discord": {"token": FAKE_TOKEN, "proxy": dc.base_url(), "allow_from": ["111"], "stream_edits": false}}}),
    );
    let gw = TestGateway::start(cfg).await;
    dc.push_user_message("500", "111", &big_text(1024 * 1024));
    assert!(wait_until(T, || !dc.sent().is_empty()).await);
    let sent = dc.sent();
    assert_eq!(sent[0].chat, "500");
    assert!(sent[0].text.contains(NOTICE), "{}", sent[0].text);
    dc.push_user_message("500", "111", "hello again");
    assert!(
        wait_until(T, || dc.sent().iter().any(|m| m.text == "second answer")).await,
        "{:?}",
        dc.sent()
    );
    gw.stop().await;
    assert_never_seen(&llm, dir.path());
}

#[tokio::test]
async fn an_oversized_slack_text_gets_a_notice_and_the_chat_keeps_answering() {
    use clawft_channel_slack::fake::{FakeSlack, APP_TOKEN, BOT_TOKEN};
    let sl = FakeSlack::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("second answer".into()));
    let cfg = config(
        &llm,
        dir.path(),
        json!({"channels": {"slack": {"token": BOT_TOKEN, "app_token": APP_TOKEN, "api_url": sl.api_url(), "allow_from": ["U111"], "stream_edits": false}}}),
    );
    let gw = TestGateway::start(cfg).await;
    let ev = sl.push_user_message("D111", "U111", &big_text(1024 * 1024));
    let posted = sl.wait_posted(1, T).await;
    assert_eq!(posted[0].chat, "D111");
    assert!(posted[0].text.contains(NOTICE), "{}", posted[0].text);
    // Acknowledged: Slack does not redeliver it.
    assert!(wait_until(T, || sl.is_acked(&ev)).await);
    sl.push_user_message("D111", "U111", "hello again");
    assert!(
        wait_until(T, || sl.sent().iter().any(|p| p.text == "second answer")).await,
        "{:?}",
        sl.sent()
    );
    gw.stop().await;
    assert_never_seen(&llm, dir.path());
}

#[tokio::test]
async fn an_oversized_http_message_is_413_with_the_notice_and_the_chat_keeps_answering() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("second answer".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    // Over the message limit, under the body limit: the same notice as every channel.
    let (s, body) = gw.api.chat("h", &big_text(200 * 1024)).await;
    assert_eq!(s, 413, "{body}");
    assert!(body["error"].as_str().unwrap().contains(NOTICE), "{body}");
    // Over the body limit too: 413 saying what the limit is.
    let (s, body) = gw.api.chat("h", &big_text(10 * 1024 * 1024)).await;
    assert_eq!(s, 413, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("at most 32 KB"),
        "{body}"
    );
    let (s, body) = gw.api.chat("h", "hello again").await;
    assert_eq!((s, body["reply"].as_str()), (200, Some("second answer")));
    gw.stop().await;
    assert_never_seen(&llm, dir.path());
}

#[tokio::test]
async fn the_inbound_limit_is_configurable_and_checked_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("fits".into()));
    let cfg = config(
        &llm,
        dir.path(),
        json!({"channels": {"max_inbound_bytes": 300 * 1024}}),
    );
    assert_eq!(cfg.max_inbound_bytes, 300 * 1024);
    let gw = TestGateway::start(cfg).await;
    let (s, body) = gw.api.chat("h", &big_text(200 * 1024)).await;
    assert_eq!((s, body["reply"].as_str()), (200, Some("fits")), "{body}");
    gw.stop().await;
    let v = crate::common::config_value(
        &llm.base_url(),
        dir.path(),
        json!({"channels": {"max_inbound_bytes": 10}}),
    );
    let err = clawft::config::Config::from_str(
        &v.to_string(),
        false,
        &crate::common::test_env(dir.path()),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("channels.max_inbound_bytes"), "{err}");
    assert!(err.contains("from 1024 to"), "{err}");
}

#[tokio::test]
async fn allow_from_usernames_stop_the_gateway_at_start_and_are_refused_by_a_reload() {
    use crate::process::{free_port, gateway_config, log_of, weft, Daemon};
    use clawft_channel_telegram::fake::FakeTelegram;
    let tg = FakeTelegram::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let telegram = |allow: serde_json::Value| json!({"channels": {"telegram": {"token": FakeTelegram::TOKEN, "api_url": tg.api_url(), "allow_from": allow, "stream_edits": false}}});

    // At start: the gateway does not start, and says which key, which entry, how to fix it.
    let cfg = gateway_config(dir.path(), &llm, port, telegram(json!(["@alice"])));
    let out = weft(dir.path())
        .arg("--config")
        .arg(&cfg)
        .arg("gateway")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started with @alice: {err}");
    for needle in [
        "channels.telegram.allow_from",
        "`@alice`",
        "@userinfobot",
        "weft pairing",
    ] {
        assert!(err.contains(needle), "`{needle}` not in: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");

    // On SIGHUP: the new file is rejected and the running allowlist stays in force.
    let cfg = gateway_config(dir.path(), &llm, port, telegram(json!([111])));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    gateway_config(dir.path(), &llm, port, telegram(json!(["@alice", 111])));
    let pid = rustix::process::Pid::from_child(&d.child);
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    assert!(
        wait_until(T, || log_of(dir.path())
            .contains("new configuration rejected"))
        .await,
        "{}",
        log_of(dir.path())
    );
    let log = log_of(dir.path());
    assert!(log.contains("channels.telegram.allow_from"), "{log}");
    assert!(!log.contains("channel telegram restarted"), "{log}");
    llm.push(Reply::Text("still here".into()));
    tg.push_user_message(111, 111, "hi");
    assert!(
        wait_until(T, || tg.sent().iter().any(|m| m.visible == "still here")).await,
        "{:?}\n{}",
        tg.sent(),
        log_of(dir.path())
    );
    assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));
}
