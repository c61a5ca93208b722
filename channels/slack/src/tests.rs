#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use clawft_channel_core::{
    Ack, Channel, ChannelError, ChannelId, ChatId, InboundDelivery, OutboundKind, OutboundMessage,
    PlatformEventId, ThreadId,
};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::fake::{Failure, FakeSlack, Posted, BOT_ID, BOT_USER_ID};
use crate::{GroupMode, SlackChannel, SlackConfig, MAX_MESSAGE_CHARS};

pub(crate) const WAIT: Duration = Duration::from_secs(3);

/// A channel listening to a fake Slack (shared with `media_tests`).
pub(crate) struct H {
    pub(crate) fake: FakeSlack,
    pub(crate) ch: Arc<SlackChannel>,
    pub(crate) rx: mpsc::Receiver<InboundDelivery>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), ChannelError>>,
}

pub(crate) async fn start_with(f: impl FnOnce(&mut SlackConfig)) -> H {
    let fake = FakeSlack::start().await;
    let mut cfg = fake.config();
    f(&mut cfg);
    let ch = Arc::new(SlackChannel::new(cfg).unwrap());
    let (tx, rx) = mpsc::channel(16);
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let ch = ch.clone();
        let cancel = cancel.clone();
        async move { ch.listen(tx, cancel).await }
    });
    assert_eq!(fake.wait_connections(1, WAIT).await, 1);
    wait_state(&ch, "connected as @clawbot").await;
    H {
        fake,
        ch,
        rx,
        cancel,
        task,
    }
}

async fn wait_state(ch: &SlackChannel, prefix: &str) {
    let deadline = Instant::now() + WAIT;
    while !ch.state().starts_with(prefix) {
        assert!(Instant::now() < deadline, "state: {}", ch.state());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub(crate) async fn start() -> H {
    start_with(|_| {}).await
}

pub(crate) async fn next(rx: &mut mpsc::Receiver<InboundDelivery>) -> InboundDelivery {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("no delivery in time")
        .expect("listener ended")
}

fn ack(d: InboundDelivery, a: Ack) {
    d.ack.unwrap().send(a).unwrap();
}

pub(crate) async fn nothing_within(rx: &mut mpsc::Receiver<InboundDelivery>, ms: u64) {
    if let Ok(Some(d)) = tokio::time::timeout(Duration::from_millis(ms), rx.recv()).await {
        panic!("unexpected delivery {:?}", d.event);
    }
}

pub(crate) fn out(kind: OutboundKind, id: &str, chat: &str, content: &str) -> OutboundMessage {
    OutboundMessage {
        id: id.into(),
        channel: ChannelId::new("slack"),
        chat: ChatId::new(chat),
        thread: None,
        in_reply_to: Some(PlatformEventId::new("Ev-in")),
        body: clawft_channel_core::OutboundBody::text_of(kind, content.into()),
        attachments: Vec::new(),
    }
}

impl H {
    pub(crate) async fn stop(self) {
        self.cancel.cancel();
        let r = tokio::time::timeout(WAIT, self.task)
            .await
            .unwrap()
            .unwrap();
        assert!(r.is_ok(), "{r:?}");
    }
}

#[tokio::test]
async fn dm_is_delivered_with_ids_and_acked_only_after_the_daemon_ack() {
    let mut h = start().await;
    assert_eq!(h.ch.state(), "connected as @clawbot (Fake Team)");
    let ev = h.fake.push_user_message("D1", "U42", "hello <b> & you");
    let d = next(&mut h.rx).await;
    assert_eq!(d.event.channel.as_str(), "slack");
    assert_eq!(d.event.chat.as_str(), "D1");
    assert_eq!(d.event.thread, None);
    assert_eq!(d.event.sender.as_str(), "U42");
    assert_eq!(d.event.event_id.as_str(), ev);
    assert_eq!(d.event.content, "hello <b> & you");
    // Not acknowledged while the daemon has not answered.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(h.fake.acks().is_empty());
    assert!(!h.fake.is_acked(&ev));
    ack(d, Ack::Accepted);
    assert_eq!(h.fake.wait_acks(1, WAIT).await.len(), 1);
    assert!(h.fake.is_acked(&ev));
    h.stop().await;
}

#[tokio::test]
async fn dropped_ack_leaves_the_envelope_unacked_and_slack_redelivers_the_same_event() {
    let mut h = start().await;
    h.fake.set_retry_delay(Duration::from_millis(200));
    let ev = h.fake.push_user_message("D1", "U1", "one");
    let first = next(&mut h.rx).await;
    assert_eq!(first.event.event_id.as_str(), ev);
    drop(first); // the daemon died before journaling
    let retry = next(&mut h.rx).await;
    assert_eq!(retry.event.event_id.as_str(), ev);
    assert!(h.fake.acks().is_empty());
    let envs = h.fake.envelopes();
    assert_eq!(envs.len(), 2);
    assert_eq!(envs[1].retry_attempt, 1);
    assert_ne!(envs[0].envelope_id, envs[1].envelope_id);
    ack(retry, Ack::Accepted);
    h.fake.wait_acks(1, WAIT).await;
    assert!(h.fake.is_acked(&ev));
    nothing_within(&mut h.rx, 400).await;
    h.stop().await;
}

#[tokio::test]
async fn slow_ack_retry_passes_through_with_the_same_event_id_and_both_are_acked() {
    let mut h = start().await;
    h.fake.set_retry_delay(Duration::from_millis(150));
    let ev = h.fake.push_user_message("D1", "U1", "slow");
    let first = next(&mut h.rx).await;
    let second = next(&mut h.rx).await;
    assert_eq!(first.event.event_id, second.event.event_id);
    assert_eq!(first.event.event_id.as_str(), ev);
    ack(first, Ack::Accepted);
    ack(second, Ack::Duplicate);
    assert_eq!(h.fake.wait_acks(2, WAIT).await.len(), 2);
    assert!(h.fake.is_acked(&ev));
    h.stop().await;
}

#[tokio::test]
async fn rejected_delivery_is_acknowledged() {
    let mut h = start().await;
    let ev = h.fake.push_user_message("D1", "Ustranger", "let me in");
    let d = next(&mut h.rx).await;
    ack(d, Ack::Rejected("sender not allowed".into()));
    h.fake.wait_acks(1, WAIT).await;
    assert!(h.fake.is_acked(&ev));
    h.stop().await;
}

#[tokio::test]
async fn bot_own_subtype_and_unmentioned_channel_messages_are_ignored_but_acked() {
    let mut h = start().await;
    let ignored = [
        h.fake.push_event(json!({"type":"message","channel":"D1","channel_type":"im","user":"U9","bot_id":"B9","text":"from another bot","ts":"1.1"})),
        h.fake.push_event(json!({"type":"message","channel":"D1","channel_type":"im","user":BOT_USER_ID,"bot_id":BOT_ID,"text":"my own","ts":"1.2"})),
        h.fake.push_event(json!({"type":"message","subtype":"message_changed","channel":"D1","channel_type":"im","message":{"text":"edited"},"ts":"1.3"})),
        h.fake.push_user_message("C1", "U1", "just chatting, no mention"),
    ];
    let marker = h.fake.push_user_message("D1", "U1", "marker");
    let d = next(&mut h.rx).await;
    assert_eq!(d.event.event_id.as_str(), marker);
    ack(d, Ack::Accepted);
    h.fake.wait_acks(5, WAIT).await;
    for ev in &ignored {
        assert!(h.fake.is_acked(ev), "{ev} not acked");
    }
    nothing_within(&mut h.rx, 200).await;
    h.stop().await;
}

#[tokio::test]
async fn channel_mention_is_delivered_once_with_the_mention_stripped() {
    let mut h = start().await;
    let ev = h
        .fake
        .push_user_message("C1", "U1", "<@UBOT> summarise this");
    let d = next(&mut h.rx).await;
    assert_eq!(d.event.event_id.as_str(), ev);
    assert_eq!(d.event.chat.as_str(), "C1");
    assert_eq!(d.event.content, "summarise this");
    ack(d, Ack::Accepted);
    // The message twin is acknowledged without a delivery.
    let marker = h.fake.push_user_message("D1", "U1", "marker");
    let d = next(&mut h.rx).await;
    assert_eq!(d.event.event_id.as_str(), marker);
    ack(d, Ack::Accepted);
    assert_eq!(h.fake.wait_acks(3, WAIT).await.len(), 3);
    assert_eq!(h.fake.envelopes().len(), 3);
    h.stop().await;
}

#[tokio::test]
async fn all_mode_delivers_every_channel_message_once() {
    let mut h = start_with(|c| c.group_mode = GroupMode::All).await;
    let (msg_id, mention_id) = h.fake.push_message("C1", None, "U1", "<@UBOT|clawbot> hi");
    assert_ne!(msg_id, mention_id);
    let d = next(&mut h.rx).await;
    assert_eq!(d.event.event_id.as_str(), msg_id);
    assert_eq!(d.event.content, "hi");
    ack(d, Ack::Accepted);
    let plain = h.fake.push_user_message("G7", "U1", "no mention needed");
    let d = next(&mut h.rx).await;
    assert_eq!(d.event.event_id.as_str(), plain);
    ack(d, Ack::Accepted);
    nothing_within(&mut h.rx, 200).await;
    h.stop().await;
}

#[tokio::test]
async fn thread_reply_to_the_bot_is_delivered_and_answered_in_the_thread() {
    let mut h = start().await;
    let (ev, _) = h.fake.push_message(
        "C1",
        Some(("1700000000.000001", BOT_USER_ID)),
        "U1",
        "and then?",
    );
    let d = next(&mut h.rx).await;
    assert_eq!(d.event.event_id.as_str(), ev);
    assert_eq!(
        d.event.thread.as_ref().map(ThreadId::as_str),
        Some("1700000000.000001")
    );
    let thread = d.event.thread.clone();
    ack(d, Ack::Accepted);
    let mut m = out(OutboundKind::Final, "o1", "C1", "in the thread");
    m.thread = thread;
    h.ch.send(&m).await.unwrap();
    let posted = h.fake.sent();
    assert_eq!(posted.len(), 1);
    assert_eq!(posted[0].thread.as_deref(), Some("1700000000.000001"));
    h.stop().await;
}

#[tokio::test]
async fn commands_pass_through_as_text() {
    let mut h = start().await;
    h.fake.push_user_message("C1", "U1", "<@UBOT> /stop");
    assert_eq!(next(&mut h.rx).await.event.content, "/stop");
    let ev = h
        .fake
        .push_slash_command("D1", "U1", "/approve", "12 always");
    let d = next(&mut h.rx).await;
    assert_eq!(d.event.content, "/approve 12 always");
    assert_eq!(d.event.event_id.as_str(), ev);
    assert_eq!(d.event.sender.as_str(), "U1");
    h.fake.push_user_message("D1", "U1", "/new@clawbot");
    assert_eq!(next(&mut h.rx).await.event.content, "/new");
    h.stop().await;
}

fn long_reply() -> String {
    let mut s = String::new();
    let mut n = 0;
    while s.chars().count() < 3 * MAX_MESSAGE_CHARS {
        n += 1;
        s.push_str(&format!(
            "Paragraph {n} has **bold** words & <tags> in it.\n\n"
        ));
        if n == 40 {
            s.push_str("```rust\n");
            for i in 0..60 {
                s.push_str(&format!("let line_{i} = \"a < b && c\";\n"));
            }
            s.push_str("```\n\n");
        }
    }
    s
}

#[tokio::test]
async fn long_reply_arrives_as_valid_chunks_in_order() {
    let h = start().await;
    let text = long_reply();
    h.ch.send(&out(OutboundKind::Final, "long", "C1", &text))
        .await
        .unwrap();
    let posted = h.fake.sent();
    assert!(posted.len() >= 3, "{} chunks", posted.len());
    let mut last = 0;
    for p in &posted {
        assert_eq!(p.method, "chat.postMessage");
        assert!(p.text.chars().count() <= MAX_MESSAGE_CHARS);
        assert_eq!(
            p.text.matches("```").count() % 2,
            0,
            "unbalanced fence in {}",
            p.text
        );
        assert!(!p.text.contains('<') && !p.text.contains('>'));
        for num in p.text.split("Paragraph ").skip(1) {
            let k: usize = num.split(' ').next().unwrap().parse().unwrap();
            assert_eq!(k, last + 1);
            last = k;
        }
    }
    assert_eq!(last, text.matches("Paragraph ").count());
    let all: String = posted.iter().map(|p| p.text.as_str()).collect();
    assert_eq!(all.matches("let line_").count(), 60);
    h.stop().await;
}

#[tokio::test]
async fn retried_send_after_a_failure_on_chunk_two_does_not_resend_chunk_one() {
    let h = start().await;
    let text = long_reply();
    h.fake.fail_after(1, Failure::ServerError);
    let err =
        h.ch.send(&out(OutboundKind::Final, "retry-me", "C1", &text))
            .await
            .unwrap_err();
    assert!(matches!(err, ChannelError::Transient(_)), "{err:?}");
    assert!(err.is_retryable());
    assert_eq!(h.fake.sent().len(), 1);
    h.ch.send(&out(OutboundKind::Final, "retry-me", "C1", &text))
        .await
        .unwrap();
    let posted = h.fake.sent();
    let texts: Vec<&str> = posted.iter().map(|p| p.text.as_str()).collect();
    let unique: std::collections::HashSet<&str> = texts.iter().copied().collect();
    assert_eq!(unique.len(), texts.len(), "a chunk was sent twice");
    assert_eq!(posted.len(), crate::chunks(&text).len());
    // A third send of a completed message posts nothing.
    h.ch.send(&out(OutboundKind::Final, "retry-me", "C1", &text))
        .await
        .unwrap();
    assert_eq!(h.fake.sent().len(), posted.len());
    h.stop().await;
}

#[tokio::test]
async fn rate_limit_maps_to_retry_after_from_the_header() {
    let h = start().await;
    h.fake.fail_next(Failure::RateLimited {
        retry_after_secs: 7,
    });
    let err =
        h.ch.send(&out(OutboundKind::Final, "rl", "C1", "hi"))
            .await
            .unwrap_err();
    assert!(matches!(err, ChannelError::RateLimited { .. }));
    assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
    h.ch.send(&out(OutboundKind::Final, "rl", "C1", "hi"))
        .await
        .unwrap();
    assert_eq!(h.fake.sent().len(), 1);
    h.stop().await;
}

#[tokio::test]
async fn web_api_errors_are_classified() {
    let h = start().await;
    let cases: Vec<(Failure, &str)> = vec![
        (Failure::InvalidAuth, "auth"),
        (Failure::SlackError("token_revoked".into()), "auth"),
        (Failure::SlackError("channel_not_found".into()), "rejected"),
        (Failure::SlackError("msg_too_long".into()), "rejected"),
        (Failure::ServerError, "transient"),
        (Failure::Garbage, "transient"),
    ];
    for (i, (f, kind)) in cases.into_iter().enumerate() {
        h.fake.fail_next(f);
        let err =
            h.ch.send(&out(OutboundKind::Final, &format!("e{i}"), "C1", "x"))
                .await
                .unwrap_err();
        assert_eq!(err.kind(), kind, "{err:?}");
        if kind == "auth" {
            assert!(err.to_string().contains("channels.slack.token"), "{err}");
        }
    }
    // Nothing leaked the token into an error or a request body.
    assert!(h
        .fake
        .calls()
        .iter()
        .all(|c| !c.body.to_string().contains("xoxb")));
    h.stop().await;
}

#[tokio::test]
async fn invalid_bot_token_makes_listen_fail_with_auth_naming_the_setting() {
    let fake = FakeSlack::start().await;
    fake.set_bot_token_valid(false);
    let ch = SlackChannel::new(fake.config()).unwrap();
    let (tx, _rx) = mpsc::channel(4);
    let r = tokio::time::timeout(WAIT, ch.listen(tx, CancellationToken::new()))
        .await
        .unwrap();
    match r {
        Err(ChannelError::Auth(m)) => assert!(m.contains("channels.slack.token"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(ch.state().starts_with("auth failed"), "{}", ch.state());
    assert_eq!(fake.connections(), 0);
}

#[tokio::test]
async fn invalid_app_token_makes_listen_fail_with_auth_naming_app_token() {
    let fake = FakeSlack::start().await;
    fake.set_app_token_valid(false);
    let ch = SlackChannel::new(fake.config()).unwrap();
    let (tx, _rx) = mpsc::channel(4);
    let r = tokio::time::timeout(WAIT, ch.listen(tx, CancellationToken::new()))
        .await
        .unwrap();
    match r {
        Err(ChannelError::Auth(m)) => assert!(m.contains("channels.slack.app_token"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn config_is_validated_and_debug_redacts_tokens() {
    let ok = SlackConfig {
        token: "xoxb-secret-1".into(),
        app_token: "xapp-secret-2".into(),
        ..SlackConfig::default()
    };
    let dbg = format!("{ok:?}");
    assert!(!dbg.contains("secret"), "{dbg}");
    assert!(dbg.contains("<redacted>"));
    assert!(SlackChannel::new(ok.clone()).is_ok());
    let err = |c: SlackConfig| SlackChannel::new(c).err().unwrap();
    let e = err(SlackConfig {
        token: String::new(),
        ..ok.clone()
    });
    assert!(matches!(&e, ChannelError::Auth(m) if m.contains("channels.slack.token")));
    let e = err(SlackConfig {
        token: "xapp-x".into(),
        ..ok.clone()
    });
    assert!(matches!(&e, ChannelError::Auth(m) if m.contains("channels.slack.app_token")));
    let e = err(SlackConfig {
        app_token: "xoxb-x".into(),
        ..ok.clone()
    });
    assert!(matches!(&e, ChannelError::Auth(m) if m.contains("channels.slack.app_token")));
    let e = err(SlackConfig {
        api_url: "ftp://x/".into(),
        ..ok
    });
    assert!(matches!(&e, ChannelError::Fatal(m) if m.contains("channels.slack.api_url")));
    let d = SlackConfig::default();
    assert_eq!(d.id.as_str(), "slack");
    assert_eq!(d.api_url, "https://slack.com/api/");
    assert_eq!(d.group_mode, GroupMode::Mention);
    assert!(d.stream_edits);
    assert_eq!(d.edit_interval, Duration::from_millis(1500));
}

#[tokio::test]
async fn disconnect_frame_reconnects_and_keeps_receiving() {
    let mut h = start().await;
    assert!(h.fake.disconnect());
    assert_eq!(h.fake.wait_connections(2, WAIT).await, 2);
    let ev = h.fake.push_user_message("D1", "U1", "after refresh");
    let d = next(&mut h.rx).await;
    assert_eq!(d.event.event_id.as_str(), ev);
    ack(d, Ack::Accepted);
    h.fake.wait_acks(1, WAIT).await;
    assert!(h.fake.is_acked(&ev));
    h.stop().await;
}

#[tokio::test]
async fn forced_close_reconnects_and_an_unacked_event_is_redelivered() {
    let mut h = start().await;
    h.fake.set_retry_delay(Duration::from_millis(300));
    let ev = h.fake.push_user_message("D1", "U1", "in flight");
    let first = next(&mut h.rx).await;
    // The connection dies before the daemon answers: the late ack cannot be sent on it.
    assert!(h.fake.close_socket());
    assert_eq!(h.fake.wait_connections(2, WAIT).await, 2);
    // The session holding its ack port is gone: the answer goes nowhere.
    assert!(first.ack.unwrap().send(Ack::Accepted).is_err());
    let again = next(&mut h.rx).await;
    assert_eq!(again.event.event_id.as_str(), ev);
    ack(again, Ack::Duplicate);
    h.fake.wait_acks(1, WAIT).await;
    assert!(h.fake.is_acked(&ev));
    h.stop().await;
}

#[tokio::test]
async fn watchdog_reconnects_a_dead_connection() {
    let mut h = start().await;
    let t = Instant::now();
    assert!(h.fake.freeze());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(h.ch.state().starts_with("connected"));
    assert_eq!(h.fake.wait_connections(2, WAIT).await, 2);
    // Watchdog 1 s with pings every 200 ms.
    assert!(
        t.elapsed() >= Duration::from_millis(800),
        "{:?}",
        t.elapsed()
    );
    let ev = h.fake.push_user_message("D1", "U1", "still there?");
    assert_eq!(next(&mut h.rx).await.event.event_id.as_str(), ev);
    h.stop().await;
}

#[tokio::test]
async fn reconnect_state_is_reported_and_backoff_applies_between_failures() {
    let h = start().await;
    // Web API down while reconnecting: the adapter keeps trying and says so.
    for _ in 0..3 {
        h.fake.fail_method("auth.test", Failure::ServerError);
    }
    let t = Instant::now();
    h.fake.close_socket();
    assert_eq!(h.fake.wait_connections(2, WAIT).await, 2);
    // Backoff 50 ms doubling: 50 + 100 + 200 before the 4th attempt succeeds.
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    let auth_calls = h
        .fake
        .calls()
        .iter()
        .filter(|c| c.method == "auth.test")
        .count();
    assert_eq!(auth_calls, 5);
    wait_state(&h.ch, "connected as @clawbot").await;
    h.stop().await;
}

#[tokio::test]
async fn reconnecting_state_names_the_attempt() {
    let h = start().await;
    for _ in 0..50 {
        h.fake
            .fail_method("apps.connections.open", Failure::ServerError);
    }
    h.fake.close_socket();
    let deadline = Instant::now() + WAIT;
    loop {
        let s = h.ch.state();
        if s.starts_with("reconnecting (attempt 3)") {
            assert!(s.contains("apps.connections.open"), "{s}");
            break;
        }
        assert!(Instant::now() < deadline, "state: {s}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.stop().await;
}

#[tokio::test]
async fn link_disabled_is_fatal() {
    let h = start().await;
    h.fake.disconnect_with("link_disabled");
    let r = tokio::time::timeout(WAIT, h.task).await.unwrap().unwrap();
    assert!(matches!(r, Err(ChannelError::Fatal(m)) if m.contains("Socket Mode")));
}

#[tokio::test]
async fn streaming_edits_are_bounded_by_the_interval_and_the_final_edits_the_draft() {
    let interval = Duration::from_millis(250);
    let h = start_with(|c| c.edit_interval = interval).await;
    let t = Instant::now();
    for i in 0..30 {
        h.ch.send(&out(
            OutboundKind::Delta,
            &format!("d{i}"),
            "C1",
            &format!("word{i} "),
        ))
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let elapsed = t.elapsed();
    let posted = h.fake.sent();
    let posts = posted
        .iter()
        .filter(|p| p.method == "chat.postMessage")
        .count();
    let edits = posted.iter().filter(|p| p.method == "chat.update").count();
    assert_eq!(posts, 1);
    let bound = (elapsed.as_millis() / interval.as_millis()) as usize + 1;
    assert!(edits >= 1 && edits <= bound, "{edits} edits in {elapsed:?}");
    // Edits are spaced by at least the interval (checked through the fake's order).
    let draft_ts = posted[0].ts.clone();
    assert!(posted.iter().all(|p| p.ts == draft_ts));
    h.ch.send(&out(OutboundKind::Final, "final", "C1", "**the answer**"))
        .await
        .unwrap();
    let posted = h.fake.sent();
    let last: &Posted = posted.last().unwrap();
    assert_eq!(last.method, "chat.update");
    assert_eq!(last.ts, draft_ts);
    assert_eq!(last.text, "*the answer*");
    assert_eq!(
        posted
            .iter()
            .filter(|p| p.method == "chat.postMessage")
            .count(),
        1
    );
    // A late delta for a finished reply is dropped.
    let n = posted.len();
    h.ch.send(&out(OutboundKind::Delta, "late", "C1", "late"))
        .await
        .unwrap();
    assert_eq!(h.fake.sent().len(), n);
    h.stop().await;
}

#[tokio::test]
async fn streamed_final_longer_than_the_limit_edits_the_draft_then_posts_the_rest() {
    let h = start().await;
    h.ch.send(&out(OutboundKind::Delta, "d", "C1", "Thinking"))
        .await
        .unwrap();
    let text = long_reply();
    h.ch.send(&out(OutboundKind::Final, "f", "C1", &text))
        .await
        .unwrap();
    let posted = h.fake.sent();
    let chunks = crate::chunks(&text);
    assert_eq!(posted.len(), chunks.len() + 1);
    assert_eq!(posted[0].method, "chat.postMessage");
    assert_eq!(posted[1].method, "chat.update");
    assert_eq!(posted[1].ts, posted[0].ts);
    assert_eq!(posted[1].text, chunks[0]);
    for (p, c) in posted[2..].iter().zip(&chunks[1..]) {
        assert_eq!(
            (p.method.as_str(), p.text.as_str()),
            ("chat.postMessage", c.as_str())
        );
    }
    h.stop().await;
}

#[tokio::test]
async fn a_retried_delta_is_not_appended_twice_and_deltas_without_a_reply_are_ignored() {
    let h = start_with(|c| c.edit_interval = Duration::ZERO).await;
    let d = out(OutboundKind::Delta, "d1", "C1", "once ");
    h.fake.fail_next(Failure::ServerError);
    assert!(h.ch.send(&d).await.is_err());
    h.ch.send(&d).await.unwrap();
    h.ch.send(&out(OutboundKind::Delta, "d2", "C1", "twice"))
        .await
        .unwrap();
    let posted = h.fake.sent();
    assert_eq!(posted.last().unwrap().text, "once twice");
    let mut orphan = out(OutboundKind::Delta, "d3", "C2", "orphan");
    orphan.in_reply_to = None;
    h.ch.send(&orphan).await.unwrap();
    assert_eq!(h.fake.sent().len(), posted.len());
    h.stop().await;
}

#[tokio::test]
async fn without_stream_edits_deltas_and_progress_are_ignored() {
    let h = start_with(|c| c.stream_edits = false).await;
    assert!(!h.ch.capabilities().streaming);
    h.ch.send(&out(OutboundKind::Delta, "d", "C1", "partial"))
        .await
        .unwrap();
    h.ch.send(&out(
        OutboundKind::Progress,
        "p",
        "C1",
        "running exec_shell",
    ))
    .await
    .unwrap();
    assert!(h.fake.sent().is_empty());
    h.ch.send(&out(
        OutboundKind::Error,
        "e",
        "C1",
        "The turn failed: timeout",
    ))
    .await
    .unwrap();
    let posted = h.fake.sent();
    assert_eq!(posted.len(), 1);
    assert_eq!(posted[0].text, "The turn failed: timeout");
    h.stop().await;
}

#[tokio::test]
async fn typing_is_a_noop_that_makes_no_request() {
    let h = start().await;
    let before = h.fake.calls().len();
    h.ch.typing(&ChatId::new("C1"), None).await.unwrap();
    h.ch.typing(&ChatId::new("C1"), Some(&ThreadId::new("1.2")))
        .await
        .unwrap();
    assert_eq!(h.fake.calls().len(), before);
    h.stop().await;
}

#[tokio::test]
async fn hostile_reply_cannot_ping_or_disguise_links_on_the_wire() {
    let h = start().await;
    let hostile = "<!channel> <@U1> <https://evil.example|bank.com> <script>x</script> & *_~`";
    h.ch.send(&out(OutboundKind::Final, "h", "C1", hostile))
        .await
        .unwrap();
    let text = &h.fake.sent()[0].text;
    assert!(text.contains("&lt;!channel&gt;"), "{text}");
    assert!(text.contains("&lt;@U1&gt;"), "{text}");
    assert!(!text.contains("<!") && !text.contains("<@") && !text.contains("<https://evil"));
    assert!(text.contains("&lt;script&gt;") && text.contains("&amp;"));
    h.stop().await;
}

#[tokio::test]
async fn unicode_and_empty_messages() {
    let mut h = start().await;
    let ev = h.fake.push_user_message("D1", "U1", "héllo 😀 日本語");
    let d = next(&mut h.rx).await;
    assert_eq!(
        (d.event.event_id.as_str(), d.event.content.as_str()),
        (ev.as_str(), "héllo 😀 日本語")
    );
    // An empty reply posts nothing (Slack would refuse it with no_text).
    h.ch.send(&out(OutboundKind::Final, "empty", "D1", ""))
        .await
        .unwrap();
    assert!(h.fake.sent().is_empty());
    let emoji = "😀".repeat(2 * MAX_MESSAGE_CHARS);
    h.ch.send(&out(OutboundKind::Final, "emoji", "D1", &emoji))
        .await
        .unwrap();
    let posted = h.fake.sent();
    assert!(posted.len() >= 2);
    assert!(posted
        .iter()
        .all(|p| p.text.chars().count() <= MAX_MESSAGE_CHARS));
    let total: usize = posted.iter().map(|p| p.text.chars().count()).sum();
    assert_eq!(total, 2 * MAX_MESSAGE_CHARS);
    h.stop().await;
}

#[tokio::test]
async fn cancel_stops_listen_promptly() {
    let h = start().await;
    let t = Instant::now();
    h.stop().await;
    assert!(t.elapsed() < Duration::from_secs(1));
}

#[test]
fn chunks_fit_even_when_escaping_multiplies_the_length() {
    let hostile = "&<>".repeat(5000);
    let chunks = crate::chunks(&hostile);
    assert!(chunks.len() > 1);
    let mut back = String::new();
    for c in &chunks {
        assert!(
            c.chars().count() <= MAX_MESSAGE_CHARS,
            "{}",
            c.chars().count()
        );
        // Only entities, plus a raw '>' quote marker when a cut makes a chunk start with '>':
        // never a raw '<' that Slack could parse.
        assert!(!c.contains('<'));
        back.push_str(
            &c.replace(' ', "")
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&amp;", "&"),
        );
    }
    assert!(back == hostile, "content changed");
}

/// Issue 16 finding 7: after Slack answered a streamed draft's `chat.postMessage` with 429
/// `Retry-After: 1`, other drafts posted at once. Now no `chat.postMessage` leaves until the
/// second passed (drafts skip, the final waits), and the final reply arrives.
#[tokio::test]
async fn a_rate_limited_draft_pauses_every_post_until_retry_after() {
    let h = start_with(|c| c.edit_interval = Duration::from_millis(50)).await;
    h.fake.fail_next(Failure::RateLimited {
        retry_after_secs: 1,
    });
    let r =
        h.ch.send(&out(OutboundKind::Delta, "a1", "C1", "one "))
            .await;
    assert!(matches!(r, Err(ChannelError::RateLimited { .. })), "{r:?}");
    let limited_at = h
        .fake
        .calls()
        .iter()
        .rfind(|c| c.method == "chat.postMessage")
        .map(|c| c.at)
        .unwrap();
    // Drafts of this reply and of other chats are due meanwhile.
    for i in 0..4 {
        let chat = format!("C{}", i + 2);
        let _ =
            h.ch.send(&out(OutboundKind::Delta, &format!("b{i}"), &chat, "two "))
                .await;
        let _ =
            h.ch.send(&out(
                OutboundKind::Delta,
                &format!("a{}", i + 2),
                "C1",
                "more ",
            ))
            .await;
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    h.ch.send(&out(OutboundKind::Final, "final", "C3", "the answer"))
        .await
        .unwrap();
    let calls = h.fake.calls();
    let posts: Vec<_> = calls
        .iter()
        .filter(|c| c.method == "chat.postMessage" && c.at > limited_at)
        .collect();
    for p in &posts {
        let after = p.at.duration_since(limited_at);
        assert!(
            after >= Duration::from_millis(950),
            "chat.postMessage {after:?} after the 429: {:?}",
            p.body
        );
    }
    assert!(
        h.fake
            .sent()
            .iter()
            .any(|p| p.chat == "C3" && p.text == "the answer"),
        "{:?}",
        h.fake.sent()
    );
    h.stop().await;
}
