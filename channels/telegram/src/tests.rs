#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use clawft_channel_core::{
    Ack, Channel, ChannelError, ChatId, InboundDelivery, MemoryState, OutboundKind,
    OutboundMessage, PlatformEventId, StateStore, ThreadId,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::fake::{Failure, FakeMessage, FakeTelegram};
use crate::{GroupMode, TelegramChannel, TelegramConfig, OFFSET_KEY};

const WAIT: Duration = Duration::from_secs(8);

fn config(fake: &FakeTelegram, state: Arc<MemoryState>) -> TelegramConfig {
    TelegramConfig {
        api_url: fake.api_url(),
        poll_timeout: Duration::from_secs(1),
        edit_interval: Duration::from_millis(300),
        state,
        ..TelegramConfig::new(FakeTelegram::TOKEN)
    }
}

struct Harness {
    ch: Arc<TelegramChannel>,
    rx: mpsc::Receiver<InboundDelivery>,
    cancel: CancellationToken,
    task: JoinHandle<Result<(), ChannelError>>,
}

fn run(cfg: TelegramConfig) -> Harness {
    let ch = Arc::new(TelegramChannel::new(cfg).unwrap());
    let (tx, rx) = mpsc::channel(8);
    let cancel = CancellationToken::new();
    let (c2, k2) = (ch.clone(), cancel.clone());
    let task = tokio::spawn(async move { c2.listen(tx, k2).await });
    Harness {
        ch,
        rx,
        cancel,
        task,
    }
}

impl Harness {
    async fn next(&mut self) -> InboundDelivery {
        tokio::time::timeout(WAIT, self.rx.recv())
            .await
            .expect("no delivery in time")
            .expect("listener ended")
    }

    async fn none_within(&mut self, d: Duration) {
        if let Ok(Some(x)) = tokio::time::timeout(d, self.rx.recv()).await {
            panic!("unexpected delivery {:?}", x.event);
        }
    }

    async fn stop(self) {
        self.cancel.cancel();
        let r = tokio::time::timeout(WAIT, self.task)
            .await
            .unwrap()
            .unwrap();
        assert!(r.is_ok(), "{r:?}");
    }
}

fn ack(d: InboundDelivery, a: Ack) {
    d.ack.unwrap().send(a).unwrap();
}

fn reply(chat: &str, kind: OutboundKind, id: &str, content: &str) -> OutboundMessage {
    OutboundMessage {
        id: id.into(),
        channel: clawft_channel_core::ChannelId::new("telegram"),
        chat: ChatId::new(chat),
        thread: None,
        in_reply_to: Some(PlatformEventId::new("ev-1")),
        body: clawft_channel_core::OutboundBody::text_of(kind, content.into()),
        attachments: Vec::new(),
    }
}

async fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn message_in_delivers_with_ids_and_confirms_after_ack() {
    let fake = FakeTelegram::start().await;
    let state = Arc::new(MemoryState::default());
    let mut h = run(config(&fake, state.clone()));
    let ev = fake.push_user_message(1001, 1001, "hello ünïcode 😀");
    let d = h.next().await;
    assert_eq!(d.event.chat.as_str(), "1001");
    assert_eq!(d.event.sender.as_str(), "1001");
    assert_eq!(d.event.thread, None);
    assert_eq!(d.event.event_id.as_str(), ev);
    assert_eq!(d.event.content, "hello ünïcode 😀");
    assert_eq!(d.event.channel.as_str(), "telegram");
    // Not confirmed before the ack: still pending at the fake, no offset stored.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(fake.pending_updates().len(), 1);
    assert_eq!(state.get(OFFSET_KEY), None);
    ack(d, Ack::Accepted);
    let next = (ev.parse::<i64>().unwrap() + 1).to_string();
    eventually("offset stored", || {
        state.get(OFFSET_KEY).as_deref() == Some(next.as_str())
    })
    .await;
    eventually("update confirmed", || fake.pending_updates().is_empty()).await;
    assert!(h.ch.state().starts_with("connected as @clawft_test_bot"));
    h.stop().await;

    // A restart resumes from the stored offset.
    let h = run(config(&fake, state.clone()));
    let polls = fake.wait_calls("getUpdates", 1, WAIT).await;
    let last = polls.last().unwrap();
    assert_eq!(last["offset"].to_string(), next);
    h.stop().await;
}

#[tokio::test]
async fn dropped_ack_is_redelivered_and_not_confirmed() {
    let fake = FakeTelegram::start().await;
    let state = Arc::new(MemoryState::default());
    let mut h = run(config(&fake, state.clone()));
    let ev = fake.push_user_message(7, 7, "first");
    let d = h.next().await;
    assert_eq!(d.event.event_id.as_str(), ev);
    drop(d); // the daemon died before journaling
    let again = h.next().await;
    assert_eq!(again.event.event_id.as_str(), ev);
    assert_eq!(again.event.content, "first");
    assert_eq!(fake.pending_updates().len(), 1, "confirmed too early");
    assert_eq!(state.get(OFFSET_KEY), None);
    ack(again, Ack::Accepted);
    eventually("confirmed", || fake.pending_updates().is_empty()).await;
    h.stop().await;
}

/// The daemon could not store the message (a full disk): the update is not confirmed and comes
/// again (it was confirmed like a refusal, and lost).
#[tokio::test]
async fn an_update_the_daemon_cannot_store_is_fetched_again() {
    let fake = FakeTelegram::start().await;
    let state = Arc::new(MemoryState::default());
    let mut h = run(config(&fake, state.clone()));
    let ev = fake.push_user_message(8, 8, "while the disk is full");
    let d = h.next().await;
    ack(d, Ack::Unavailable("disk full".into()));
    let again = h.next().await;
    assert_eq!(again.event.event_id.as_str(), ev);
    assert_eq!(state.get(OFFSET_KEY), None);
    assert_eq!(
        fake.pending_updates().len(),
        1,
        "confirmed though not stored"
    );
    ack(again, Ack::Accepted);
    eventually("confirmed", || fake.pending_updates().is_empty()).await;
    h.stop().await;
}

#[tokio::test]
async fn redelivery_after_a_crash_keeps_the_event_id_and_duplicate_confirms() {
    let fake = FakeTelegram::start().await;
    let state = Arc::new(MemoryState::default());
    let mut h = run(config(&fake, state.clone()));
    let ev = fake.push_user_message(7, 7, "once");
    let d = h.next().await;
    // The adapter stops between the daemon journaling and confirming to Telegram.
    h.cancel.cancel();
    let _ = tokio::time::timeout(WAIT, h.task).await.unwrap();
    let _ = d.ack.unwrap().send(Ack::Accepted);
    assert_eq!(fake.pending_updates().len(), 1);

    let mut h = run(config(&fake, state.clone()));
    let d = h.next().await;
    assert_eq!(
        d.event.event_id.as_str(),
        ev,
        "same event id for the daemon to dedupe"
    );
    ack(d, Ack::Duplicate);
    eventually("confirmed", || fake.pending_updates().is_empty()).await;
    h.none_within(Duration::from_millis(300)).await;
    h.stop().await;
}

#[tokio::test]
async fn bots_edits_and_unmentioned_group_messages_are_ignored() {
    let fake = FakeTelegram::start().await;
    let state = Arc::new(MemoryState::default());
    let mut h = run(config(&fake, state));
    let mut bot = FakeMessage::new(7, 99, "I am a bot");
    bot.user_is_bot = true;
    fake.push_message(bot);
    fake.push_user_message(-100, 7, "just chatting in the group");
    fake.push_user_message(-100, 7, "hey @someone_else look");
    fake.push_update(serde_json::json!({"edited_message": {
        "message_id": 1, "date": 0, "chat": {"id": 7, "type": "private"},
        "from": {"id": 7, "is_bot": false, "first_name": "U"}, "text": "edited"}}));
    let ev = fake.push_user_message(-100, 7, "@clawft_test_bot what is 2+2?");
    let d = h.next().await;
    assert_eq!(d.event.event_id.as_str(), ev);
    assert_eq!(d.event.content, "what is 2+2?");
    assert_eq!(d.event.chat.as_str(), "-100");
    ack(d, Ack::Accepted);
    eventually("all confirmed", || fake.pending_updates().is_empty()).await;

    // A reply to the bot counts as addressed to it; commands are normalised.
    let sent =
        h.ch.send(&reply("-100", OutboundKind::Final, "o1", "4"))
            .await
            .unwrap();
    let mut m = FakeMessage::new(-100, 7, "and times 3?");
    m.reply_to = Some(sent.0.parse().unwrap());
    fake.push_message(m);
    let d = h.next().await;
    assert_eq!(d.event.content, "and times 3?");
    ack(d, Ack::Accepted);
    fake.push_user_message(-100, 7, "/stop@clawft_test_bot");
    let d = h.next().await;
    assert_eq!(d.event.content, "/stop");
    ack(d, Ack::Rejected("not allowed".into()));
    eventually("rejected is confirmed too", || {
        fake.pending_updates().is_empty()
    })
    .await;
    h.stop().await;
}

#[tokio::test]
async fn group_mode_all_delivers_everything_but_bots() {
    let fake = FakeTelegram::start().await;
    let mut cfg = config(&fake, Arc::new(MemoryState::default()));
    cfg.group_mode = GroupMode::All;
    let mut h = run(cfg);
    fake.push_user_message(-100, 7, "no mention");
    let d = h.next().await;
    assert_eq!(d.event.content, "no mention");
    ack(d, Ack::Accepted);
    h.stop().await;
}

#[tokio::test]
async fn forum_topic_thread_in_and_out() {
    let fake = FakeTelegram::start().await;
    let mut h = run(config(&fake, Arc::new(MemoryState::default())));
    let mut m = FakeMessage::new(-200, 8, "@clawft_test_bot status?");
    m.topic = Some(55);
    let ev = fake.push_message(m);
    let d = h.next().await;
    assert_eq!(d.event.thread, Some(ThreadId::new("55")));
    ack(d, Ack::Accepted);
    let mut out = reply("-200", OutboundKind::Final, "o1", "all **good**");
    out.thread = Some(ThreadId::new("55"));
    out.in_reply_to = Some(PlatformEventId::new(ev));
    h.ch.send(&out).await.unwrap();
    let sent = fake.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].thread, Some(55));
    assert_eq!(sent[0].text, "all <b>good</b>");
    assert_eq!(sent[0].parse_mode.as_deref(), Some("HTML"));
    // The reply quotes the user's message (the fake's first message id is 1).
    assert_eq!(sent[0].reply_to, Some(1));
    h.ch.typing(&ChatId::new("-200"), Some(&ThreadId::new("55")))
        .await
        .unwrap();
    let actions = fake.actions();
    assert_eq!(actions.len(), 1);
    assert_eq!(
        (
            actions[0].chat,
            actions[0].thread,
            actions[0].action.as_str()
        ),
        (-200, Some(55), "typing")
    );
    h.stop().await;
}

#[tokio::test]
async fn long_reply_arrives_as_valid_chunks_in_order() {
    let fake = FakeTelegram::start().await;
    let ch = TelegramChannel::new(config(&fake, Arc::new(MemoryState::default()))).unwrap();
    let mut md = String::from("# Report\n\nIntro with <tags> & **bold**.\n\n```rust\n");
    let mut i = 0;
    while md.encode_utf16().count() < 3 * 4096 {
        md.push_str(&format!("let x{i} = a < b && c > d; // ünï 😀\n"));
        i += 1;
    }
    md.push_str("```\n\nThe end.");
    let sent = ch
        .send(&reply("5", OutboundKind::Final, "long", &md))
        .await
        .unwrap();
    let msgs = fake.sent();
    assert!(msgs.len() >= 3, "{} chunks", msgs.len());
    assert_eq!(sent.0, msgs[0].message_id.to_string());
    let mut joined = String::new();
    for m in &msgs {
        assert_eq!(m.method, "sendMessage");
        assert_eq!(
            m.parse_mode.as_deref(),
            Some("HTML"),
            "fell back to plain text"
        );
        assert!(m.visible.encode_utf16().count() <= 4096);
        joined.push_str(&m.visible);
        joined.push('\n');
    }
    let mut pos = 0;
    for k in 0..i {
        let line = format!("let x{k} = a < b && c > d; // ünï 😀");
        pos += joined[pos..]
            .find(&line)
            .unwrap_or_else(|| panic!("line {k} missing/out of order"));
    }
    assert!(msgs[0].visible.starts_with("Report"));
    assert!(msgs.last().unwrap().visible.ends_with("The end."));
}

#[tokio::test]
async fn retry_after_failure_on_chunk_two_does_not_resend_chunk_one() {
    let fake = FakeTelegram::start().await;
    let ch = TelegramChannel::new(config(&fake, Arc::new(MemoryState::default()))).unwrap();
    let md: String = (0..3)
        .map(|p| format!("{}\n\n", format!("para{p} ").repeat(500)))
        .collect();
    fake.fail_later("sendMessage", 1, Failure::RateLimit(7));
    let msg = reply("5", OutboundKind::Final, "retry-me", &md);
    let err = ch.send(&msg).await.unwrap_err();
    assert!(
        matches!(err, ChannelError::RateLimited { retry_after: Some(d) } if d == Duration::from_secs(7)),
        "{err:?}"
    );
    assert_eq!(fake.sent().len(), 1);
    ch.send(&msg).await.unwrap();
    let sent = fake.sent();
    assert_eq!(sent.len(), 3, "chunk 1 resent?");
    for (p, m) in sent.iter().enumerate() {
        assert!(m.visible.starts_with(&format!("para{p} ")), "{p}: order");
    }
    // A third send of the same id is a no-op.
    ch.send(&msg).await.unwrap();
    assert_eq!(fake.sent().len(), 3);
}

#[tokio::test]
async fn errors_are_classified() {
    let fake = FakeTelegram::start().await;
    let ch = TelegramChannel::new(config(&fake, Arc::new(MemoryState::default()))).unwrap();
    fake.fail_next(
        "sendMessage",
        Failure::BadRequest("Bad Request: chat not found".into()),
    );
    let e = ch
        .send(&reply("5", OutboundKind::Final, "a", "x"))
        .await
        .unwrap_err();
    assert!(
        matches!(e, ChannelError::Rejected(ref m) if m.contains("chat not found")),
        "{e:?}"
    );
    fake.fail_next("sendMessage", Failure::Disconnect);
    let e = ch
        .send(&reply("5", OutboundKind::Final, "b", "x"))
        .await
        .unwrap_err();
    assert!(matches!(e, ChannelError::Transient(_)), "{e:?}");
    assert!(!e.to_string().contains("fake_token"), "token leaked: {e}");
    fake.fail_next("sendMessage", Failure::Unauthorized);
    let e = ch
        .send(&reply("5", OutboundKind::Error, "c", "x"))
        .await
        .unwrap_err();
    assert!(
        matches!(e, ChannelError::Auth(ref m) if m.contains("channels.telegram.token")),
        "{e:?}"
    );
    fake.fail_next("sendChatAction", Failure::RateLimit(2));
    let e = ch.typing(&ChatId::new("5"), None).await.unwrap_err();
    assert_eq!(e.retry_after(), Some(Duration::from_secs(2)));
    // Non-numeric thread ids are refused before any request.
    let mut m = reply("5", OutboundKind::Final, "d", "x");
    m.thread = Some(ThreadId::new("abc"));
    assert!(matches!(ch.send(&m).await, Err(ChannelError::Rejected(_))));
}

#[test]
fn server_errors_are_transient_and_never_show_the_token() {
    use teloxide_core::{ApiError, RequestError};
    let token = FakeTelegram::TOKEN;
    for d in ["Internal Server Error", "Bad Gateway", "Gateway Timeout"] {
        let e = crate::api::CallError::Request(RequestError::Api(ApiError::Unknown(d.into())))
            .classify(token);
        assert!(matches!(e, ChannelError::Transient(_)), "{d}: {e:?}");
    }
    let e = crate::api::CallError::Request(RequestError::Api(ApiError::Unknown(format!(
        "Bad Request: weird {token}"
    ))))
    .classify(token);
    assert!(matches!(e, ChannelError::Rejected(_)));
    assert!(!e.to_string().contains("fake_token"), "{e}");
    let e = crate::api::CallError::Request(RequestError::Api(ApiError::BotBlocked)).classify(token);
    assert!(matches!(e, ChannelError::Rejected(_)), "{e:?}");
}

#[tokio::test]
async fn invalid_token_is_auth_naming_the_setting() {
    let fake = FakeTelegram::start().await;
    let mut cfg = config(&fake, Arc::new(MemoryState::default()));
    cfg.token = "999:wrong-token-value".into();
    let h = run(cfg);
    let r = tokio::time::timeout(WAIT, h.task).await.unwrap().unwrap();
    match r {
        Err(ChannelError::Auth(m)) => {
            assert!(m.contains("channels.telegram.token"), "{m}");
            assert!(!m.contains("wrong-token-value"));
        }
        other => panic!("{other:?}"),
    }
    assert!(h.ch.state().starts_with("auth failed"), "{}", h.ch.state());
    assert!(fake.requests().iter().all(|r| !r.authorized));
    assert_eq!(fake.calls("getUpdates").len(), 0);
    // Malformed tokens and URLs are refused at construction.
    for bad in ["", "no-colon", "12:ab/../x", "12:a b"] {
        let e = TelegramChannel::new(TelegramConfig::new(bad))
            .err()
            .unwrap();
        assert!(matches!(e, ChannelError::Auth(ref m) if m.contains("channels.telegram.token")));
    }
    for url in ["mailto:x@y", "ftp://h", "not a url", "http://h/?q=1"] {
        let mut c = TelegramConfig::new("1:abc");
        c.api_url = url.into();
        let e = TelegramChannel::new(c).err().unwrap();
        assert!(
            matches!(e, ChannelError::Fatal(ref m) if m.contains("api_url")),
            "{url}"
        );
    }
}

#[tokio::test]
async fn disconnect_reconnects_and_keeps_receiving() {
    let fake = FakeTelegram::start().await;
    let mut h = run(config(&fake, Arc::new(MemoryState::default())));
    fake.push_user_message(7, 7, "one");
    let d = h.next().await;
    ack(d, Ack::Accepted);
    fake.wait_calls("getUpdates", 2, WAIT).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    fake.disconnect();
    eventually("reconnecting state", || {
        h.ch.state().starts_with("reconnecting (attempt 1)")
    })
    .await;
    fake.push_user_message(7, 7, "two");
    let d = h.next().await;
    assert_eq!(d.event.content, "two");
    ack(d, Ack::Accepted);
    eventually("connected again", || {
        h.ch.state().starts_with("connected as")
    })
    .await;
    h.stop().await;
}

#[tokio::test]
async fn stalled_poll_is_abandoned_by_the_watchdog() {
    let fake = FakeTelegram::start().await;
    let mut h = run(config(&fake, Arc::new(MemoryState::default())));
    fake.wait_calls("getUpdates", 1, WAIT).await;
    fake.set_stall(true);
    let started = tokio::time::Instant::now();
    eventually("watchdog fired", || h.ch.state().contains("watchdog")).await;
    // poll timeout 1 s + grace 1 s (+ the poll in flight when the stall began).
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    fake.set_stall(false);
    fake.push_user_message(7, 7, "alive");
    let d = h.next().await;
    assert_eq!(d.event.content, "alive");
    ack(d, Ack::Accepted);
    h.stop().await;
}

#[tokio::test]
async fn streaming_edits_are_bounded_by_the_interval() {
    let fake = FakeTelegram::start().await;
    let ch = TelegramChannel::new(config(&fake, Arc::new(MemoryState::default()))).unwrap();
    assert!(ch.capabilities().streaming);
    let started = tokio::time::Instant::now();
    let mut full = String::new();
    for i in 0..30 {
        let part = format!("word{i} ");
        full.push_str(&part);
        ch.send(&reply("5", OutboundKind::Delta, &format!("d{i}"), &part))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let elapsed = started.elapsed();
    ch.send(&reply("5", OutboundKind::Progress, "p", "running x"))
        .await
        .unwrap();
    let before_final = fake.sent();
    assert_eq!(before_final[0].method, "sendMessage");
    let posts = before_final
        .iter()
        .filter(|m| m.method == "sendMessage")
        .count();
    let edits = before_final.len() - posts;
    assert_eq!(posts, 1, "one draft");
    let bound = (elapsed.as_millis() / 300) as usize + 1;
    assert!(edits >= 1 && edits <= bound, "{edits} edits in {elapsed:?}");
    ch.send(&reply(
        "5",
        OutboundKind::Final,
        "final",
        &format!("{full}**done**"),
    ))
    .await
    .unwrap();
    let all = fake.sent();
    let last = all.last().unwrap();
    assert_eq!(last.method, "editMessageText");
    assert_eq!(last.message_id, before_final[0].message_id);
    assert!(last.text.ends_with("<b>done</b>"));
    assert_eq!(all.iter().filter(|m| m.method == "sendMessage").count(), 1);
    // A late fragment after the final reply changes nothing.
    ch.send(&reply("5", OutboundKind::Delta, "late", "zzz"))
        .await
        .unwrap();
    assert_eq!(fake.sent().len(), all.len());
}

#[tokio::test]
async fn whitespace_first_delta_is_kept_and_a_deleted_draft_is_replaced() {
    let fake = FakeTelegram::start().await;
    let ch = TelegramChannel::new(config(&fake, Arc::new(MemoryState::default()))).unwrap();
    ch.send(&reply("5", OutboundKind::Delta, "d0", "\n"))
        .await
        .unwrap();
    assert!(fake.sent().is_empty());
    ch.send(&reply("5", OutboundKind::Delta, "d1", "Hello"))
        .await
        .unwrap();
    assert_eq!(fake.sent().len(), 1);
    // The user deleted the draft: the final reply is posted as a new message.
    fake.fail_next(
        "editMessageText",
        Failure::BadRequest("Bad Request: message to edit not found".into()),
    );
    ch.send(&reply("5", OutboundKind::Final, "f", "Hello world"))
        .await
        .unwrap();
    let sent = fake.sent();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[1].method, "sendMessage");
    assert_eq!(sent[1].visible, "Hello world");
}

#[tokio::test]
async fn deltas_are_ignored_without_stream_edits() {
    let fake = FakeTelegram::start().await;
    let mut cfg = config(&fake, Arc::new(MemoryState::default()));
    cfg.stream_edits = false;
    let ch = TelegramChannel::new(cfg).unwrap();
    assert!(!ch.capabilities().streaming);
    ch.send(&reply("5", OutboundKind::Delta, "d", "partial"))
        .await
        .unwrap();
    assert!(fake.sent().is_empty());
    ch.send(&reply("5", OutboundKind::Final, "f", "whole"))
        .await
        .unwrap();
    assert_eq!(fake.sent().len(), 1);
}

#[tokio::test]
async fn refused_html_is_resent_as_plain_text() {
    let fake = FakeTelegram::start().await;
    let ch = TelegramChannel::new(config(&fake, Arc::new(MemoryState::default()))).unwrap();
    fake.fail_next("sendMessage", Failure::CantParseEntities);
    ch.send(&reply("5", OutboundKind::Final, "f", "some **bold** text"))
        .await
        .unwrap();
    let sent = fake.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].parse_mode, None);
    assert_eq!(sent[0].visible, "some **bold** text");
    assert_eq!(fake.calls("sendMessage").len(), 2);
}

#[tokio::test]
async fn hostile_text_is_accepted_by_a_strict_html_parser_and_shown_literally() {
    let fake = FakeTelegram::start().await;
    let ch = TelegramChannel::new(config(&fake, Arc::new(MemoryState::default()))).unwrap();
    let hostile = [
        "<script>alert('x')</script> & &amp; &#x3c; <b>not bold",
        "*_~ **unbalanced *markup ~~ `tick [link](javascript:alert(1)) </pre></code>",
        "> quote\n> ```\n> </blockquote><b>\n> ```\n\n<a href=\"x\">y</a>",
        "[x](https://e.com/\"onmouseover=\"alert(1))",
    ];
    for (i, h) in hostile.iter().enumerate() {
        ch.send(&reply("5", OutboundKind::Final, &format!("h{i}"), h))
            .await
            .unwrap();
    }
    let sent = fake.sent();
    assert_eq!(sent.len(), hostile.len());
    for m in &sent {
        assert_eq!(
            m.parse_mode.as_deref(),
            Some("HTML"),
            "fell back: {}",
            m.text
        );
    }
    assert!(sent[0]
        .visible
        .starts_with("<script>alert('x')</script> & &amp; &#x3c; <b>"));
    assert!(sent[1].visible.contains("javascript:alert(1)"));
    // A text made only of characters that expand when escaped still fits each message.
    let lt = "<".repeat(20_000);
    ch.send(&reply("5", OutboundKind::Final, "lt", &lt))
        .await
        .unwrap();
    let chunks: Vec<_> = fake.sent().into_iter().skip(hostile.len()).collect();
    assert!(chunks.iter().all(|m| m.parse_mode.is_some()));
    let total: usize = chunks.iter().map(|m| m.visible.len()).sum();
    assert_eq!(total, 20_000);
}

#[tokio::test]
async fn empty_and_whitespace_replies_send_nothing() {
    let fake = FakeTelegram::start().await;
    let ch = TelegramChannel::new(config(&fake, Arc::new(MemoryState::default()))).unwrap();
    ch.send(&reply("5", OutboundKind::Final, "e", ""))
        .await
        .unwrap();
    ch.send(&reply("5", OutboundKind::Final, "w", " \n\n "))
        .await
        .unwrap();
    // Raw HTML is shown literally (escaped), so this is one message.
    ch.send(&reply("5", OutboundKind::Final, "c", "<!-- -->"))
        .await
        .unwrap();
    let sent = fake.sent();
    assert_eq!(sent.len(), 1);
}

#[test]
fn config_debug_hides_the_token_and_defaults() {
    let c = TelegramConfig::new("123:supersecretvalue");
    let dbg = format!("{c:?}");
    assert!(!dbg.contains("supersecretvalue"), "{dbg}");
    assert_eq!(c.id.as_str(), "telegram");
    assert_eq!(c.api_url, "https://api.telegram.org");
    assert_eq!(c.group_mode, GroupMode::Mention);
    assert!(c.stream_edits);
    assert_eq!(c.edit_interval, Duration::from_millis(1500));
    assert_eq!(c.poll_timeout, Duration::from_secs(25));
}

#[test]
fn plan_chunks_fit_and_render() {
    let md = format!("{}\n\n{}", "a".repeat(5000), "😀".repeat(3000));
    let chunks = crate::plan_chunks(&md);
    assert!(chunks.len() >= 3);
    for c in &chunks {
        let html = c.html.as_ref().unwrap();
        assert!(crate::render::visible_len(html) <= 4096);
        crate::fake::parse_telegram_html(html).unwrap();
    }
}

/// Issue 16 finding 6: a server that answers `getUpdates` at once, ignoring `timeout`, was
/// polled thousands of times a second. Empty polls are now paced to one a second, and a
/// message sent meanwhile still arrives.
#[tokio::test]
async fn a_server_ignoring_the_poll_timeout_is_not_polled_in_a_loop() {
    let fake = FakeTelegram::start().await;
    fake.set_ignore_timeout(true);
    let mut h = run(TelegramConfig {
        poll_timeout: Duration::from_secs(25),
        ..config(&fake, Arc::new(MemoryState::default()))
    });
    fake.wait_calls("getUpdates", 1, WAIT).await;
    let first = fake.calls("getUpdates").len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let polls = fake.calls("getUpdates").len() - first;
    assert!(polls <= 4, "{polls} getUpdates calls in 2 s");
    fake.push_user_message(7, 7, "still heard");
    let d = tokio::time::timeout(Duration::from_secs(3), h.rx.recv())
        .await
        .expect("the message did not arrive within 3 s")
        .expect("listener ended");
    assert_eq!(d.event.content, "still heard");
    ack(d, Ack::Accepted);
    h.stop().await;
}

#[tokio::test]
async fn one_fake_server_serves_two_bots_each_with_its_own_updates_and_messages() {
    const WORK: &str = "777:WORK-fake_token-abcdefghijklmnopqrs";
    let fake = FakeTelegram::start().await;
    let work = fake.add_bot(WORK, 7777, "work_bot");
    assert_eq!(work.api_url(), fake.api_url());
    let (s1, s2) = (
        Arc::new(MemoryState::default()),
        Arc::new(MemoryState::default()),
    );
    let mut main_h = run(config(&fake, s1.clone()));
    let mut work_cfg = config(&work, s2.clone());
    work_cfg.token = WORK.into();
    work_cfg.id = clawft_channel_core::ChannelId::new("telegram.work");
    let mut work_h = run(work_cfg);
    fake.push_user_message(1001, 1001, "to main");
    work.push_user_message(1001, 1001, "to work");
    let (a, b) = (main_h.next().await, work_h.next().await);
    assert_eq!(
        (a.event.content.as_str(), a.event.channel.as_str()),
        ("to main", "telegram")
    );
    assert_eq!(
        (b.event.content.as_str(), b.event.channel.as_str()),
        ("to work", "telegram.work")
    );
    ack(a, Ack::Accepted);
    ack(b, Ack::Accepted);
    eventually("both confirmed", || {
        fake.pending_updates().is_empty() && work.pending_updates().is_empty()
    })
    .await;
    assert!(
        work_h.ch.state().contains("@work_bot"),
        "{}",
        work_h.ch.state()
    );
    // Each bot posts into its own log.
    work_h
        .ch
        .send(&reply("1001", OutboundKind::Final, "o1", "from work"))
        .await
        .unwrap();
    assert_eq!(work.sent().len(), 1);
    assert!(fake.sent().is_empty(), "{:?}", fake.sent());
    // Polls of two bots do not conflict (409 is per bot).
    main_h.none_within(Duration::from_millis(300)).await;
    assert!(fake.requests().iter().all(|r| r.authorized));
    main_h.stop().await;
    work_h.stop().await;
}
