//! Replies are never doubled: the real `weft` is killed with SIGKILL at each point of the send
//! path (before the send, between the send and the delivered mark, after the mark, and while a
//! streamed draft is shown), restarted on the same store, and the chat on each platform's fake
//! must show exactly ONE reply.
//!
//! The exact points are hit with `WEFT_FAULT=<point>`: the daemon SIGKILLs itself when it
//! reaches that point of the egress (`src/egress/scheduler.rs`). The draft case kills it from
//! outside while the model stalls mid-answer and the draft is on screen.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{config_value, wait_until};
use crate::fake_llm::{FakeLlm, Reply};
use crate::process::{free_port, log_of, weft, write_config, Daemon};

const T: Duration = Duration::from_secs(30);
const ANSWER: &str = "the one and only answer";

/// Where the first life of the gateway dies.
#[derive(Clone, Copy, Debug)]
enum Point {
    /// The reply is in the outbox and about to be sent.
    BeforeSend,
    /// The platform accepted the reply; its outbox entry is not removed yet.
    AfterSend,
    /// The outbox removal is on disk and the adapter dropped what it journaled for a resend.
    AfterMark,
    /// A streamed draft is on screen, the model still answering.
    DuringDraft,
}

/// A platform fake: how the gateway is pointed at it, how a user writes, and the messages the
/// chat shows (each visible message once, with its latest text; edits add nothing).
struct Platform {
    name: &'static str,
    section: Box<dyn Fn(bool) -> Value>,
    push: Box<dyn Fn()>,
    visible: Box<dyn Fn() -> Vec<String>>,
}

/// Messages in order of first appearance, each with its latest text.
fn latest_by_id(ops: impl IntoIterator<Item = (String, String)>) -> Vec<String> {
    let mut order: Vec<String> = Vec::new();
    let mut text = std::collections::HashMap::new();
    for (id, t) in ops {
        if !text.contains_key(&id) {
            order.push(id.clone());
        }
        text.insert(id, t);
    }
    order.into_iter().map(|id| text[&id].clone()).collect()
}

fn telegram(tg: &Arc<clawft_channel_telegram::fake::FakeTelegram>) -> Platform {
    use clawft_channel_telegram::fake::FakeTelegram;
    let (a, b, url) = (tg.clone(), tg.clone(), tg.api_url());
    Platform {
        name: "telegram",
        section: Box::new(
            move |stream| json!({"token": FakeTelegram::TOKEN, "api_url": url, "allow_from": [111], "stream_edits": stream, "edit_interval_ms": 0}),
        ),
        push: Box::new(move || {
            a.push_user_message(111, 111, "are you there?");
        }),
        visible: Box::new(move || {
            latest_by_id(
                b.sent()
                    .into_iter()
                    .filter(|m| m.chat == 111)
                    .map(|m| (m.message_id.to_string(), m.visible)),
            )
        }),
    }
}

fn discord(dc: &Arc<clawft_channel_discord::fake::FakeDiscord>) -> Platform {
    use clawft_channel_discord::fake::FAKE_TOKEN;
    let (a, b, url) = (dc.clone(), dc.clone(), dc.base_url());
    Platform {
        name: "discord",
        section: Box::new(
            move |stream| json!({"token": FAKE_TOKEN, "proxy": url, "allow_from": ["111"], "stream_edits": stream, "edit_interval_ms": 0}),
        ),
        push: Box::new(move || {
            a.push_user_message("500", "111", "are you there?");
        }),
        visible: Box::new(move || {
            latest_by_id(
                b.sent()
                    .into_iter()
                    .filter(|m| m.chat == "500")
                    .map(|m| (m.message_id, m.text)),
            )
        }),
    }
}

fn slack(sl: &Arc<clawft_channel_slack::fake::FakeSlack>) -> Platform {
    use clawft_channel_slack::fake::{APP_TOKEN, BOT_TOKEN};
    let (a, b, url) = (sl.clone(), sl.clone(), sl.api_url());
    Platform {
        name: "slack",
        section: Box::new(
            move |stream| json!({"token": BOT_TOKEN, "app_token": APP_TOKEN, "api_url": url, "allow_from": ["U111"], "stream_edits": stream, "edit_interval_ms": 0}),
        ),
        push: Box::new(move || {
            a.push_user_message("D111", "U111", "are you there?");
        }),
        visible: Box::new(move || {
            latest_by_id(
                b.sent()
                    .into_iter()
                    .filter(|m| m.chat == "D111")
                    .map(|m| (m.ts, m.text)),
            )
        }),
    }
}

/// Start the gateway with `WEFT_FAULT=point`, let the user write once it is ready, and wait
/// until it killed itself there.
async fn run_until_fault(dir: &Path, cfg: &Path, port: u16, point: &str, p: &Platform) {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("gateway.log"))
        .unwrap();
    let mut child = weft(dir)
        .env("WEFT_FAULT", point)
        .arg("--config")
        .arg(cfg)
        .arg("gateway")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();
    let ready = format!("http://127.0.0.1:{port}/readyz");
    let deadline = std::time::Instant::now() + T;
    loop {
        if let Ok(r) = http.get(&ready).send().await {
            if r.status().is_success() {
                break;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not ready\n{}",
            log_of(dir)
        );
        assert!(child.try_wait().unwrap().is_none(), "{}", log_of(dir));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (p.push)();
    let deadline = std::time::Instant::now() + T;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("{point} never reached\n{}", log_of(dir));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status.signal(), Some(9), "{status:?}\n{}", log_of(dir));
}

/// One cycle: first life dies at `point`, the second answers; the chat shows one reply.
async fn cycle(p: &Platform, point: Point) {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let streamed = matches!(point, Point::DuringDraft);
    let cfg = write_config(
        dir.path(),
        &config_value(
            &llm.base_url(),
            dir.path(),
            json!({"channels": {"http": {"bind": format!("127.0.0.1:{port}")}, p.name: (p.section)(streamed)}}),
        ),
    );
    let before = (p.visible)().len();
    let fault = match point {
        Point::BeforeSend => Some("egress.before_send"),
        Point::AfterSend => Some("egress.after_send"),
        Point::AfterMark => Some("egress.after_mark"),
        Point::DuringDraft => None,
    };
    if let Some(f) = fault {
        llm.push(Reply::Text(ANSWER.into()));
        run_until_fault(dir.path(), &cfg, port, f, p).await;
        let shown = (p.visible)().len() - before;
        let want = usize::from(!matches!(point, Point::BeforeSend));
        assert_eq!(shown, want, "{point:?}: {:?}", (p.visible)());
    } else {
        llm.push(Reply::Stall("Working on it, one moment".into()));
        let d = Daemon::start(dir.path(), &cfg, port).await;
        (p.push)();
        assert!(
            wait_until(T, || (p.visible)()[before..]
                .iter()
                .any(|t| t.starts_with("Working")))
            .await,
            "no draft: {:?}\n{}",
            (p.visible)(),
            log_of(dir.path())
        );
        // Past the answer to the draft's post (the at-least-once window, milliseconds long):
        // the draft's id is journaled.
        tokio::time::sleep(Duration::from_millis(500)).await;
        d.kill9();
        llm.push(Reply::Text(ANSWER.into()));
    }

    let d = Daemon::start(dir.path(), &cfg, port).await;
    let mine = || (p.visible)()[before..].to_vec();
    assert!(
        wait_until(T, || mine().iter().any(|t| t.contains(ANSWER))).await,
        "{} {point:?}: no answer after the restart: {:?}\n{}",
        p.name,
        mine(),
        log_of(dir.path())
    );
    // Give a duplicate every chance to show up.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        mine().len(),
        1,
        "{} {point:?}: the chat shows {:?}\n{}",
        p.name,
        mine(),
        log_of(dir.path())
    );
    assert!(mine()[0].contains(ANSWER), "{:?}", mine());
    assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));
}

const POINTS: [Point; 4] = [
    Point::BeforeSend,
    Point::AfterSend,
    Point::AfterMark,
    Point::DuringDraft,
];

#[tokio::test]
async fn telegram_kill_9_at_every_point_of_the_send_path_shows_one_reply() {
    for point in POINTS {
        let tg = Arc::new(clawft_channel_telegram::fake::FakeTelegram::start().await);
        cycle(&telegram(&tg), point).await;
    }
}

#[tokio::test]
async fn discord_kill_9_at_every_point_of_the_send_path_shows_one_reply() {
    for point in POINTS {
        let dc = Arc::new(clawft_channel_discord::fake::FakeDiscord::start().await);
        cycle(&discord(&dc), point).await;
    }
}

#[tokio::test]
async fn slack_kill_9_at_every_point_of_the_send_path_shows_one_reply() {
    for point in POINTS {
        let sl = Arc::new(clawft_channel_slack::fake::FakeSlack::start().await);
        cycle(&slack(&sl), point).await;
    }
}

/// The one window Discord closes by itself: the daemon dies after Discord created the reply
/// but before its answer arrived (nothing journaled). The resend carries the same nonce with
/// `enforce_nonce`, and Discord answers with the message it already has.
#[tokio::test]
async fn discord_kill_9_while_the_answer_to_the_post_is_in_flight_shows_one_reply() {
    let dc = Arc::new(clawft_channel_discord::fake::FakeDiscord::start().await);
    let p = discord(&dc);
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = write_config(
        dir.path(),
        &config_value(
            &llm.base_url(),
            dir.path(),
            json!({"channels": {"http": {"bind": format!("127.0.0.1:{port}")}, "discord": (p.section)(false)}}),
        ),
    );
    llm.push(Reply::Text(ANSWER.into()));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    dc.hold_answers(true);
    (p.push)();
    assert!(
        wait_until(T, || (p.visible)().iter().any(|t| t.contains(ANSWER))).await,
        "{}",
        log_of(dir.path())
    );
    d.kill9();
    dc.hold_answers(false);
    let d = Daemon::start(dir.path(), &cfg, port).await;
    // The resend reached Discord (two posts with the same nonce), and the chat shows one reply.
    assert!(
        wait_until(T, || dc
            .requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/channels/500/messages"))
            .count()
            >= 2)
        .await,
        "no resend: {:?}\n{}",
        dc.requests(),
        log_of(dir.path())
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!((p.visible)(), [ANSWER], "{}", log_of(dir.path()));
    assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));
}

fn signal(sg: &Arc<clawft_channel_signal::fake::FakeSignal>) -> Platform {
    use clawft_channel_signal::fake::ACCOUNT;
    let (a, b, url) = (sg.clone(), sg.clone(), sg.api_url());
    Platform {
        name: "signal",
        // Signal replies are not streamed: no draft case.
        section: Box::new(
            move |_stream| json!({"number": ACCOUNT, "api_url": url, "allow_from": ["+15551111111"]}),
        ),
        push: Box::new(move || {
            a.push_message("+15551111111", "are you there?");
        }),
        visible: Box::new(move || {
            b.sent_to("+15551111111")
                .into_iter()
                .map(|s| s.text)
                .collect()
        }),
    }
}

/// signal-cli has no idempotency key: the timestamps of the chunks sent are journaled, and the
/// resend after the restart skips them.
#[tokio::test]
async fn signal_kill_9_at_every_point_of_the_send_path_shows_one_reply() {
    for point in [Point::BeforeSend, Point::AfterSend, Point::AfterMark] {
        let sg = Arc::new(clawft_channel_signal::fake::FakeSignal::start().await);
        cycle(&signal(&sg), point).await;
    }
}
