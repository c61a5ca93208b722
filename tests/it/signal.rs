//! Signal end to end: the gateway with the real Signal adapter against the fake signal-cli
//! HTTP daemon (`clawft_channel_signal::fake`, JSON-RPC + Server-Sent Events on 127.0.0.1).

use std::time::{Duration, Instant};

use clawft_channel_signal::fake::{FakeSignal, NewFile};
use serde_json::{json, Value};

use crate::common::{config, config_value, last_user, test_env, wait_until, TestGateway};
use crate::fake_llm::{FakeLlm, Reply};

const T: Duration = Duration::from_secs(30);
const ALICE: &str = "+15551111111";
const STRANGER: &str = "+15559999999";
const GROUP: &str = "RmFtaWx5R3JvdXBJZA==";

fn section(fake: &FakeSignal, extra: Value) -> Value {
    let mut s = json!({"number": clawft_channel_signal::fake::ACCOUNT, "api_url": fake.api_url(), "allow_from": [ALICE]});
    crate::common::merge(&mut s, extra);
    json!({"channels": {"signal": s}})
}

#[tokio::test]
async fn an_allowed_number_is_answered_in_signal_styles_and_a_stranger_is_paired() {
    let fake = FakeSignal::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    // The turn takes a while: typing is shown meanwhile.
    llm.push(Reply::Delay(
        Duration::from_millis(1500),
        Box::new(Reply::Text("**Hello** Alice, `ls` works".into())),
    ));
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        section(&fake, json!({"pairing": true})),
    ))
    .await;
    fake.push_message(ALICE, "hi there");
    let sent = fake.wait_sent(1, T).await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].chat, ALICE);
    assert_eq!(sent[0].text, "Hello Alice, ls works");
    assert_eq!(sent[0].styles, ["0:5:BOLD", "13:2:MONOSPACE"]);
    assert!(last_user(&llm.requests()[0]).contains("hi there"));
    assert!(
        fake.typing().iter().any(|t| t.chat == ALICE),
        "no typing while the turn ran: {:?}",
        fake.calls()
    );

    // A stranger never reaches the model and is given one pairing code.
    fake.push_message(STRANGER, "let me in");
    assert!(wait_until(T, || fake.sent_to(STRANGER).len() == 1).await);
    let code_msg = fake.sent_to(STRANGER)[0].text.clone();
    let code = code_msg
        .split("pairing approve ")
        .nth(1)
        .unwrap()
        .split(|c: char| !c.is_ascii_alphanumeric())
        .next()
        .unwrap()
        .to_string();
    fake.push_message(STRANGER, "please");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(fake.sent_to(STRANGER).len(), 1, "a second code was sent");
    assert_eq!(llm.requests().len(), 1, "the stranger reached the model");
    let v = clawft::admin::pairing_command(
        gw.gateway.daemon.store(),
        "pairing/approve",
        &json!({ "code": code }),
    )
    .unwrap();
    assert_eq!(v["approved"], format!("signal:{STRANGER}"));
    llm.push(Reply::Text("welcome".into()));
    fake.push_message(STRANGER, "hello again");
    assert!(
        wait_until(T, || fake
            .sent_to(STRANGER)
            .iter()
            .any(|s| s.text == "welcome"))
        .await,
        "{:?}",
        fake.sent()
    );
    // No read receipts, and every call the adapter made was valid signal-cli JSON-RPC.
    assert!(fake.receipts().is_empty(), "read receipts were sent");
    assert!(!fake.calls().iter().any(|c| c == "sendReceipt"));
    assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
    gw.stop().await;
}

#[tokio::test]
async fn a_group_mention_is_answered_in_the_group_quoting_it_other_group_chatter_is_not_read() {
    let fake = FakeSignal::start().await;
    fake.add_group(GROUP, &[clawft_channel_signal::fake::ACCOUNT, ALICE]);
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("dinner is at 7".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), section(&fake, json!({})))).await;
    fake.push_group_message(GROUP, ALICE, "just chatting", false);
    let ev = fake.push_group_message(GROUP, ALICE, "when is dinner?", true);
    let chat = format!("group.{GROUP}");
    assert!(
        wait_until(T, || fake.sent_to(&chat).len() == 1).await,
        "{:?}",
        fake.sent()
    );
    let s = &fake.sent_to(&chat)[0];
    assert_eq!(s.text, "dinner is at 7");
    let ts: u64 = ev.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(s.quote, Some(ts), "the reply does not quote the question");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 1);
    assert!(last_user(&reqs[0]).contains("when is dinner?"));
    assert!(!last_user(&reqs[0]).contains('\u{FFFC}'));
    assert!(fake.sent_to(ALICE).is_empty(), "answered in a DM instead");
    assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
    gw.stop().await;
}

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR a chart";

#[tokio::test]
async fn a_photo_in_reaches_the_workspace_and_a_file_out_arrives_once() {
    let fake = FakeSignal::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join("charts")).unwrap();
    std::fs::write(ws.join("charts/week.png"), PNG).unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text(
        "Nice cat. Here is the chart.\nMEDIA: charts/week.png".into(),
    ));
    let gw = TestGateway::start(config(&llm, dir.path(), section(&fake, json!({})))).await;
    fake.push_files(
        ALICE,
        Some("look"),
        &[NewFile {
            name: Some("cat.png".into()),
            mime: "image/png".into(),
            bytes: PNG.to_vec(),
        }],
    );
    assert!(
        wait_until(T, || fake.sent_to(ALICE).len() >= 2).await,
        "{:?}",
        fake.sent()
    );
    let user = last_user(&llm.requests()[0]);
    assert!(user.contains("[Attached image: inbox/"), "{user}");
    // The saved file holds the bytes signal-cli served.
    let inbox = ws.join("inbox");
    let saved: Vec<_> = walk(&inbox);
    assert_eq!(saved.len(), 1, "{saved:?}");
    assert_eq!(std::fs::read(&saved[0]).unwrap(), PNG);
    let sent = fake.sent_to(ALICE);
    assert!(sent[0].text.starts_with("Nice cat"), "{sent:?}");
    let files: Vec<_> = sent.iter().flat_map(|s| s.files.clone()).collect();
    assert_eq!(files.len(), 1, "{sent:?}");
    assert_eq!(files[0].bytes, PNG);
    assert_eq!(files[0].mime, "image/png");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fake.sent_to(ALICE).len(), sent.len(), "sent twice");
    gw.stop().await;
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[tokio::test]
async fn a_rate_limit_is_waited_out_and_a_dropped_stream_loses_no_message() {
    let fake = FakeSignal::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("first answer".into()));
    llm.push(Reply::Text("second answer".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), section(&fake, json!({})))).await;
    fake.rate_limit_next_send(1);
    let started = Instant::now();
    fake.push_message(ALICE, "one");
    assert!(
        wait_until(T, || fake.sent_to(ALICE).len() == 1).await,
        "{:?}",
        fake.rejected()
    );
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "the rate limit's delay was not honoured"
    );
    assert_eq!(fake.sent_to(ALICE)[0].text, "first answer");
    // signal-cli's stream goes away; a message arrives meanwhile; the adapter reconnects
    // with Last-Event-ID and gets it, and the first message is not answered again.
    fake.set_down(true);
    fake.push_message(ALICE, "two");
    tokio::time::sleep(Duration::from_millis(300)).await;
    fake.set_down(false);
    assert!(
        wait_until(T, || fake.sent_to(ALICE).len() == 2).await,
        "{:?}",
        fake.sent()
    );
    assert_eq!(fake.sent_to(ALICE)[1].text, "second answer");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(llm.requests().len(), 2);
    assert_eq!(fake.sent_to(ALICE).len(), 2);
    gw.stop().await;
}

#[test]
fn a_bad_signal_config_is_refused_at_load_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let load = |section: Value| {
        let v = config_value(
            "http://127.0.0.1:9",
            dir.path(),
            json!({"channels": {"signal": section}}),
        );
        clawft::config::Config::from_str(&v.to_string(), false, &test_env(dir.path()))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let e = load(json!({"number": "5551234567", "allow_from": [ALICE]}));
    assert!(e.contains("channels.signal.number"), "{e}");
    assert!(e.contains("+15551234567"), "{e}");
    let e = load(json!({"allow_from": [ALICE]}));
    assert!(e.contains("channels.signal.number"), "{e}");
    let e = load(json!({"number": ALICE, "allow_from": ["alice"]}));
    assert!(e.contains("channels.signal.allow_from"), "{e}");
    let e = load(json!({"number": ALICE, "token": "x"}));
    assert!(e.contains("channels.signal.token"), "{e}");
    let e = load(json!({"number": ALICE, "api_url": "127.0.0.1:8080"}));
    assert!(e.contains("channels.signal.api_url"), "{e}");
    assert_eq!(
        load(
            json!({"number": ALICE, "allow_from": [ALICE, "0d1f2e3c-4b5a-4968-8776-655443322110"]})
        ),
        ""
    );
}

#[tokio::test]
async fn an_oversized_message_is_refused_with_a_notice_and_nothing_stored() {
    let fake = FakeSignal::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("short one answered".into()));
    let mut extra = section(&fake, json!({}));
    extra["channels"]["max_inbound_bytes"] = json!(1024);
    let gw = TestGateway::start(config(&llm, dir.path(), extra)).await;
    let marker = "OVERSIZED-CANARY-";
    let big = marker.repeat(200);
    fake.push_message(ALICE, &big);
    assert!(
        wait_until(T, || fake.sent_to(ALICE).len() == 1).await,
        "{:?}",
        fake.sent()
    );
    let notice = fake.sent_to(ALICE)[0].text.clone();
    assert!(notice.contains("over the 1 KB limit"), "{notice}");
    fake.push_message(ALICE, "short");
    assert!(wait_until(T, || fake.sent_to(ALICE).len() == 2).await);
    assert_eq!(fake.sent_to(ALICE)[1].text, "short one answered");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 1);
    assert!(!reqs[0].to_string().contains(marker));
    gw.stop().await;
    assert!(
        !crate::common::bytes_under(&dir.path().join("store")).contains(marker),
        "the oversized text was stored"
    );
}
