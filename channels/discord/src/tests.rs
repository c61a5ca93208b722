#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use clawft_channel_core::{
    Ack, Channel, ChannelError, ChatId, InboundDelivery, MemoryState, OutboundKind,
    OutboundMessage, PlatformEventId, StateStore, ThreadId,
};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::fake::{
    FakeDiscord, FakeFailure, FakeMessage, FakeOptions, SentOp, BOT_ID, BOT_NAME, FAKE_TOKEN,
};
use crate::{DiscordChannel, DiscordConfig, GroupMode};

const WAIT: Duration = Duration::from_secs(5);

struct Listening {
    ch: Arc<DiscordChannel>,
    rx: mpsc::Receiver<InboundDelivery>,
    cancel: CancellationToken,
    task: JoinHandle<Result<(), ChannelError>>,
}

fn listen_with(cfg: DiscordConfig) -> Listening {
    let ch = Arc::new(DiscordChannel::new(cfg).unwrap());
    let (tx, rx) = mpsc::channel(16);
    let cancel = CancellationToken::new();
    let (c, k) = (ch.clone(), cancel.clone());
    let task = tokio::spawn(async move { c.listen(tx, k).await });
    Listening {
        ch,
        rx,
        cancel,
        task,
    }
}

impl Listening {
    async fn next(&mut self) -> InboundDelivery {
        tokio::time::timeout(WAIT, self.rx.recv())
            .await
            .expect("no delivery within 5 s")
            .expect("listen ended")
    }

    /// Next delivery, acknowledged with `ack`.
    async fn next_acked(&mut self, ack: Ack) -> clawft_channel_core::InboundEvent {
        let mut d = self.next().await;
        d.ack.take().unwrap().send(ack).unwrap();
        d.event
    }

    async fn nothing_for(&mut self, d: Duration) {
        if let Ok(Some(x)) = tokio::time::timeout(d, self.rx.recv()).await {
            panic!("unexpected delivery: {:?}", x.event);
        }
    }

    async fn stop(self) -> Result<(), ChannelError> {
        self.cancel.cancel();
        tokio::time::timeout(WAIT, self.task)
            .await
            .unwrap()
            .unwrap()
    }
}

async fn wait_until(what: &str, f: impl FnMut() -> bool) {
    wait_until_for(what, WAIT, f).await;
}

async fn wait_until_for(what: &str, wait: Duration, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + wait;
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn msg(id: &str, chat: &str, kind: OutboundKind, content: &str) -> OutboundMessage {
    OutboundMessage {
        id: id.into(),
        channel: clawft_channel_core::ChannelId::new("discord"),
        chat: ChatId::new(chat),
        thread: None,
        in_reply_to: Some(PlatformEventId::new("1100000000000000042")),
        body: clawft_channel_core::OutboundBody::text_of(kind, content.into()),
        attachments: Vec::new(),
    }
}

fn posts(fake: &FakeDiscord) -> Vec<crate::fake::SentMessage> {
    fake.sent()
        .into_iter()
        .filter(|s| s.op == SentOp::Post)
        .collect()
}

fn stored(state: &MemoryState, key: &str) -> Option<String> {
    state.get(key)
}

fn sender_only(fake: &FakeDiscord) -> (Arc<DiscordChannel>, Arc<MemoryState>) {
    let state = Arc::new(MemoryState::default());
    (
        Arc::new(DiscordChannel::new(fake.config(state.clone())).unwrap()),
        state,
    )
}

// ---------------------------------------------------------------------------------------------
// Inbound

#[tokio::test]
async fn dm_is_delivered_with_platform_ids() {
    let fake = FakeDiscord::start().await;
    let state = Arc::new(MemoryState::default());
    let mut l = listen_with(fake.config(state.clone()));
    let id = fake.push_user_message("111", "42", "hello ünïcode 😀");
    let ev = l.next_acked(Ack::Accepted).await;
    assert_eq!(ev.channel.as_str(), "discord");
    assert_eq!(ev.chat.as_str(), "111");
    assert_eq!(ev.thread, None);
    assert_eq!(ev.sender.as_str(), "42");
    assert_eq!(ev.event_id.as_str(), id);
    assert_eq!(ev.content, "hello ünïcode 😀");
    assert!(ev.received_at_ms > 0);
    assert_eq!(l.ch.state(), format!("connected as @{BOT_NAME}"));
    // IDENTIFY with the token and the three intents; REST with `Bot <token>`.
    let ident = fake
        .client_frames()
        .into_iter()
        .find(|f| f["op"] == 2)
        .unwrap();
    assert_eq!(ident["d"]["token"], FAKE_TOKEN);
    assert_eq!(ident["d"]["intents"], (1 << 9) | (1 << 12) | (1 << 15));
    assert!(fake
        .requests()
        .iter()
        .all(|r| r.auth == format!("Bot {FAKE_TOKEN}")));
    let (sid, seq) = fake.session().unwrap();
    wait_until("seq stored", || {
        stored(&state, "seq") == Some(seq.to_string())
    })
    .await;
    assert_eq!(stored(&state, "session_id"), Some(sid));
    assert_eq!(stored(&state, "resume_url"), Some(fake.gateway_url()));
    l.stop().await.unwrap();
}

#[tokio::test]
async fn seq_advances_only_after_ack_and_an_unacked_event_is_redelivered() {
    let fake = FakeDiscord::start().await;
    let state = Arc::new(MemoryState::default());
    let mut l = listen_with(fake.config(state.clone()));
    let first = fake.push_user_message("111", "42", "one");
    l.next_acked(Ack::Accepted).await;
    let acked_seq = fake.session().unwrap().1;
    wait_until("first seq stored", || {
        stored(&state, "seq") == Some(acked_seq.to_string())
    })
    .await;

    let second = fake.push_user_message("111", "42", "two");
    let d = l.next().await;
    assert_eq!(d.event.event_id.as_str(), second);
    // Not acknowledged yet: the stored sequence has not moved past it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(stored(&state, "seq"), Some(acked_seq.to_string()));
    // The daemon dies before journaling it: the ack is dropped.
    drop(d);
    // The adapter RESUMEs from the acknowledged sequence; Discord replays the event.
    let again = l.next_acked(Ack::Accepted).await;
    assert_eq!(again.event_id.as_str(), second);
    assert_ne!(again.event_id.as_str(), first);
    let resume = fake
        .client_frames()
        .into_iter()
        .find(|f| f["op"] == 6)
        .expect("a RESUME");
    assert_eq!(resume["d"]["seq"], acked_seq);
    assert_eq!(fake.sessions_created(), 1);
    let (_, seq) = fake.session().unwrap();
    wait_until("second seq stored", || {
        stored(&state, "seq").and_then(|s| s.parse::<u64>().ok()) >= Some(seq - 1)
    })
    .await;
    l.stop().await.unwrap();
}

#[tokio::test]
async fn restart_resumes_the_stored_session_and_gets_missed_events() {
    let fake = FakeDiscord::start().await;
    let state = Arc::new(MemoryState::default());
    let mut l = listen_with(fake.config(state.clone()));
    fake.push_user_message("111", "42", "before");
    l.next_acked(Ack::Accepted).await;
    let seq = fake.session().unwrap().1;
    wait_until("seq stored", || {
        stored(&state, "seq") == Some(seq.to_string())
    })
    .await;
    l.stop().await.unwrap();

    // Messages sent while the daemon is down.
    let missed = fake.push_user_message("111", "42", "while down");
    let mut l = listen_with(fake.config(state.clone()));
    let ev = l.next_acked(Ack::Accepted).await;
    assert_eq!(ev.event_id.as_str(), missed);
    assert_eq!(ev.content, "while down");
    let resumes: Vec<Value> = fake
        .client_frames()
        .into_iter()
        .filter(|f| f["op"] == 6)
        .collect();
    assert_eq!(resumes.len(), 1);
    assert_eq!(resumes[0]["d"]["seq"], seq);
    assert_eq!(resumes[0]["d"]["session_id"], fake.session().unwrap().0);
    assert_eq!(fake.sessions_created(), 1, "no new IDENTIFY");
    wait_until("resumed state", || l.ch.state().contains("resumed")).await;
    l.stop().await.unwrap();
}

#[tokio::test]
async fn stale_session_is_replaced_by_a_new_identify() {
    let fake = FakeDiscord::start().await;
    let state = Arc::new(MemoryState::default());
    state.put("session_id", "long-gone").unwrap();
    state.put("seq", "77").unwrap();
    state.put("resume_url", &fake.gateway_url()).unwrap();
    let mut l = listen_with(fake.config(state.clone()));
    wait_until("identified", || fake.sessions_created() == 1).await;
    let id = fake.push_user_message("111", "42", "fresh");
    assert_eq!(l.next_acked(Ack::Accepted).await.event_id.as_str(), id);
    assert_eq!(stored(&state, "session_id"), fake.session().map(|s| s.0));
    l.stop().await.unwrap();
}

#[tokio::test]
async fn platform_duplicate_passes_through_with_the_same_event_id() {
    let fake = FakeDiscord::start().await;
    let mut l = listen_with(fake.config(Arc::new(MemoryState::default())));
    let id = fake.push_user_message("111", "42", "hi");
    assert_eq!(l.next_acked(Ack::Accepted).await.event_id.as_str(), id);
    assert!(fake.redeliver(&id));
    let dup = l.next_acked(Ack::Duplicate).await;
    assert_eq!(dup.event_id.as_str(), id);
    // Rejected is an answer too: the adapter moves on.
    let id2 = fake.push_user_message("111", "43", "not allowed");
    assert_eq!(
        l.next_acked(Ack::Rejected("no".into()))
            .await
            .event_id
            .as_str(),
        id2
    );
    let id3 = fake.push_user_message("111", "42", "next");
    assert_eq!(l.next_acked(Ack::Accepted).await.event_id.as_str(), id3);
    l.stop().await.unwrap();
}

#[tokio::test]
async fn bots_and_unmentioned_guild_messages_are_ignored() {
    let fake = FakeDiscord::start().await;
    let mut l = listen_with(fake.config(Arc::new(MemoryState::default())));
    let guild = |text: &str| FakeMessage {
        chat: "222".into(),
        user: "42".into(),
        text: text.into(),
        guild: Some("333".into()),
        ..FakeMessage::default()
    };
    fake.push_message(FakeMessage {
        bot: true,
        ..guild(&format!("<@{BOT_ID}> from another bot"))
    });
    fake.push_message(FakeMessage {
        bot: true,
        ..FakeMessage {
            chat: "111".into(),
            user: "7".into(),
            text: "bot DM".into(),
            ..FakeMessage::default()
        }
    });
    fake.push_message(FakeMessage {
        user: BOT_ID.into(),
        ..guild(&format!("<@{BOT_ID}> myself"))
    });
    fake.push_message(guild("just chatting"));
    fake.push_message(guild("<@12345> someone else"));
    fake.push_message(guild(&format!("<@{BOT_ID}>")));
    fake.push_dispatch("GUILD_CREATE", serde_json::json!({"id": "333"}));
    let id = fake.push_message(guild(&format!("<@{BOT_ID}> what's up?")));
    let ev = l.next_acked(Ack::Accepted).await;
    assert_eq!(ev.event_id.as_str(), id);
    assert_eq!(ev.content, "what's up?");
    assert_eq!(ev.chat.as_str(), "222");
    // Nickname mention form and a command addressed to the bot.
    fake.push_message(guild(&format!("<@!{BOT_ID}> /stop@{BOT_NAME}")));
    assert_eq!(l.next_acked(Ack::Accepted).await.content, "/stop");
    fake.push_message(guild(&format!(
        "/approve@{BOT_NAME} abc always <@{BOT_ID}>"
    )));
    assert_eq!(
        l.next_acked(Ack::Accepted).await.content,
        "/approve abc always"
    );
    // A reply to one of the bot's messages counts as addressing it.
    let (sender, _) = sender_only(&fake);
    let bot_msg = sender
        .send(&msg("o1", "222", OutboundKind::Final, "I am the bot"))
        .await
        .unwrap();
    fake.push_message(FakeMessage {
        reply_to: Some(bot_msg.0.clone()),
        ..guild("thanks")
    });
    assert_eq!(l.next_acked(Ack::Accepted).await.content, "thanks");
    // A reply to somebody else is not.
    let other = fake.push_message(guild(&format!("<@{BOT_ID}> x")));
    l.next_acked(Ack::Accepted).await;
    fake.push_message(FakeMessage {
        reply_to: Some(other),
        ..guild("to the human")
    });
    l.nothing_for(Duration::from_millis(200)).await;
    l.stop().await.unwrap();
}

#[tokio::test]
async fn group_mode_all_delivers_every_guild_message() {
    let fake = FakeDiscord::start().await;
    let mut cfg = fake.config(Arc::new(MemoryState::default()));
    cfg.group_mode = GroupMode::All;
    let mut l = listen_with(cfg);
    fake.push_message(FakeMessage {
        chat: "222".into(),
        user: "42".into(),
        text: "no mention".into(),
        guild: Some("333".into()),
        ..FakeMessage::default()
    });
    assert_eq!(l.next_acked(Ack::Accepted).await.content, "no mention");
    l.stop().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Liveness

#[tokio::test]
async fn reconnects_after_disconnect_and_keeps_receiving() {
    let fake = FakeDiscord::start().await;
    let mut l = listen_with(fake.config(Arc::new(MemoryState::default())));
    fake.push_user_message("111", "42", "one");
    l.next_acked(Ack::Accepted).await;

    fake.disconnect();
    let id = fake.push_user_message("111", "42", "after a network failure");
    assert_eq!(l.next_acked(Ack::Accepted).await.event_id.as_str(), id);
    assert_eq!(fake.connections(), 2);

    fake.send_reconnect();
    wait_until("third connection", || fake.connections() == 3).await;
    let id = fake.push_user_message("111", "42", "after op 7");
    assert_eq!(l.next_acked(Ack::Accepted).await.event_id.as_str(), id);

    fake.close(4000);
    let id = fake.push_user_message("111", "42", "after close 4000");
    assert_eq!(l.next_acked(Ack::Accepted).await.event_id.as_str(), id);
    assert_eq!(fake.sessions_created(), 1, "all of these RESUMEd");

    // A non-resumable INVALID_SESSION: a new IDENTIFY.
    fake.invalidate_session(false);
    // Op 9 waits 1-5 s before the IDENTIFY.
    wait_until_for("new session", Duration::from_secs(8), || {
        fake.sessions_created() == 2
    })
    .await;
    let id = fake.push_user_message("111", "42", "new session");
    assert_eq!(l.next_acked(Ack::Accepted).await.event_id.as_str(), id);
    wait_until("connected", || l.ch.state().starts_with("connected as")).await;
    l.stop().await.unwrap();
}

#[tokio::test]
async fn watchdog_reconnects_when_heartbeats_are_not_acked() {
    let fake = FakeDiscord::start_with(FakeOptions {
        heartbeat_interval_ms: 150,
    })
    .await;
    let mut l = listen_with(fake.config(Arc::new(MemoryState::default())));
    wait_until("identified", || fake.sessions_created() == 1).await;
    wait_until("heartbeats", || {
        fake.client_frames().iter().filter(|f| f["op"] == 1).count() >= 2
    })
    .await;
    let before = fake.connections();
    fake.set_heartbeat_ack(false);
    wait_until("zombie detected", || fake.connections() > before).await;
    fake.set_heartbeat_ack(true);
    let id = fake.push_user_message("111", "42", "still here");
    assert_eq!(l.next_acked(Ack::Accepted).await.event_id.as_str(), id);
    // Heartbeats carry the last sequence received.
    let last = fake
        .client_frames()
        .into_iter()
        .rev()
        .find(|f| f["op"] == 1)
        .unwrap();
    assert!(last["d"].is_u64(), "{last}");
    l.stop().await.unwrap();
}

#[tokio::test]
async fn invalid_token_fails_listen_with_auth_naming_the_setting() {
    let fake = FakeDiscord::start().await;
    let mut cfg = fake.config(Arc::new(MemoryState::default()));
    cfg.token = "not-the-token".into();
    let l = listen_with(cfg);
    let r = tokio::time::timeout(WAIT, l.task).await.unwrap().unwrap();
    match r {
        Err(ChannelError::Auth(m)) => assert!(m.contains("channels.discord.token"), "{m}"),
        other => panic!("expected Auth, got {other:?}"),
    }
    assert!(l.ch.state().starts_with("auth failed:"), "{}", l.ch.state());
    assert_eq!(fake.connections(), 0);
    let e =
        l.ch.send(&msg("x", "111", OutboundKind::Final, "hi"))
            .await
            .unwrap_err();
    assert!(matches!(e, ChannelError::Auth(_)), "{e:?}");
    // An empty token is refused up front.
    let e =
        DiscordChannel::new(DiscordConfig::new(" ", Arc::new(MemoryState::default()))).unwrap_err();
    assert!(e.to_string().contains("channels.discord.token"));
}

#[tokio::test]
async fn gateway_close_codes_4004_and_4014_are_fatal() {
    let fake = FakeDiscord::start().await;
    let l = listen_with(fake.config(Arc::new(MemoryState::default())));
    wait_until("identified", || fake.sessions_created() == 1).await;
    fake.close(4004);
    let r = tokio::time::timeout(WAIT, l.task).await.unwrap().unwrap();
    assert!(
        matches!(&r, Err(ChannelError::Auth(m)) if m.contains("channels.discord.token")),
        "{r:?}"
    );
    let l = listen_with(fake.config(Arc::new(MemoryState::default())));
    wait_until("identified", || fake.sessions_created() == 2).await;
    fake.close(4014);
    let r = tokio::time::timeout(WAIT, l.task).await.unwrap().unwrap();
    assert!(
        matches!(&r, Err(ChannelError::Fatal(m)) if m.contains("Message Content Intent")),
        "{r:?}"
    );
    assert!(l.ch.state().starts_with("failed:"));
}

#[tokio::test]
async fn cancel_stops_listen_without_ending_the_session() {
    let fake = FakeDiscord::start().await;
    let l = listen_with(fake.config(Arc::new(MemoryState::default())));
    wait_until("identified", || fake.sessions_created() == 1).await;
    let ch = l.ch.clone();
    l.stop().await.unwrap();
    assert_eq!(ch.state(), "stopped");
    assert!(fake.session().is_some());
}

// ---------------------------------------------------------------------------------------------
// Outbound

#[tokio::test]
async fn long_reply_arrives_as_valid_chunks_in_order() {
    let fake = FakeDiscord::start().await;
    let (ch, _) = sender_only(&fake);
    let code: String = (0..120)
        .map(|i| format!("    let value_{i:03} = compute({i}); // note\n"))
        .collect();
    let prose: String = (0..40)
        .map(|i| format!("Paragraph {i:02} with **bold**, @everyone and <@1> mention.\n\n"))
        .collect();
    let md = format!("{prose}```rust\n{code}```\n\nThe end.");
    assert!(md.chars().count() > 3 * 2000);
    let r = ch
        .send(&msg("long", "111", OutboundKind::Final, &md))
        .await
        .unwrap();
    let p = posts(&fake);
    assert!(p.len() >= 4, "{}", p.len());
    assert_eq!(r.0, p[0].message_id);
    for s in &p {
        assert_eq!(s.chat, "111");
        assert!(s.text.chars().count() <= 2000);
        assert_eq!(
            s.text.lines().filter(|l| l.starts_with("```")).count() % 2,
            0,
            "unbalanced fences:\n{}",
            s.text
        );
        assert_eq!(s.body["allowed_mentions"]["parse"], serde_json::json!([]));
        assert!(s.body["nonce"].as_str().unwrap().len() <= 25);
        assert!(!s.text.contains("@everyone") && !s.text.contains(" <@1>"));
    }
    // Only the first chunk replies to the user's message.
    assert_eq!(
        p[0].body["message_reference"]["message_id"],
        "1100000000000000042"
    );
    assert!(p[1..]
        .iter()
        .all(|s| s.body.get("message_reference").is_none()));
    // Everything arrives, in order.
    let joined: String = p
        .iter()
        .map(|s| s.text.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let mut pos = 0;
    for i in 0..40 {
        pos += joined[pos..].find(&format!("Paragraph {i:02}")).unwrap();
    }
    for i in 0..120 {
        pos += joined[pos..].find(&format!("let value_{i:03}")).unwrap();
    }
    assert!(joined[pos..].contains("The end."));
}

#[tokio::test]
async fn retried_send_after_a_failure_on_chunk_two_does_not_resend_chunk_one() {
    let fake = FakeDiscord::start().await;
    let (ch, _) = sender_only(&fake);
    let md = format!(
        "{}\n\n{}\n\n{}",
        "a".repeat(1500),
        "b".repeat(1500),
        "c".repeat(1500)
    );
    fake.pass_next(1);
    fake.fail_next(FakeFailure::ServerError(502));
    let m = msg("retry-me", "111", OutboundKind::Error, &md);
    let e = ch.send(&m).await.unwrap_err();
    assert!(matches!(e, ChannelError::Transient(_)), "{e:?}");
    assert!(e.is_retryable());
    assert_eq!(posts(&fake).len(), 1);
    let r = ch.send(&m).await.unwrap();
    let p = posts(&fake);
    let texts: Vec<char> = p.iter().map(|s| s.text.chars().next().unwrap()).collect();
    assert_eq!(texts, ['a', 'b', 'c']);
    assert_eq!(r.0, p[0].message_id);
    // Chunk 1 was not even requested again: a, b (502), then b, c.
    let post_requests = || {
        fake.requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/messages"))
            .count()
    };
    assert_eq!(post_requests(), 4);
    // A late retry of a completed message sends nothing.
    assert_eq!(ch.send(&m).await.unwrap().0, p[0].message_id);
    assert_eq!(posts(&fake).len(), 3);
    // After a restart (memory lost), Discord's enforced nonce still dedupes the chunks.
    let (fresh, _) = sender_only(&fake);
    fresh.send(&m).await.unwrap();
    assert_eq!(post_requests(), 7);
    assert_eq!(posts(&fake).len(), 3);
}

#[tokio::test]
async fn rate_limit_maps_retry_after_and_blocks_the_route() {
    let fake = FakeDiscord::start().await;
    let (ch, _) = sender_only(&fake);
    fake.fail_next(FakeFailure::RateLimited {
        retry_after: 0.4,
        global: false,
    });
    let e = ch
        .send(&msg("r1", "111", OutboundKind::Final, "hi"))
        .await
        .unwrap_err();
    assert_eq!(e.retry_after(), Some(Duration::from_millis(400)));
    assert!(e.is_retryable());
    let limited_at = fake.requests().last().unwrap().at;
    // The next send on that route waits out the bucket before calling Discord.
    ch.send(&msg("r1", "111", OutboundKind::Final, "hi"))
        .await
        .unwrap();
    let sent_at = fake.requests().last().unwrap().at;
    assert!(sent_at - limited_at >= Duration::from_millis(380));

    // An empty bucket (remaining 0 + reset-after) is honoured before the next send.
    fake.exhaust_bucket(0.3);
    ch.send(&msg("r2", "111", OutboundKind::Final, "a"))
        .await
        .unwrap();
    let first = fake.requests().last().unwrap().at;
    ch.send(&msg("r3", "111", OutboundKind::Final, "b"))
        .await
        .unwrap();
    let second = fake.requests().last().unwrap().at;
    assert!(second - first >= Duration::from_millis(280));

    // A long wait fails fast without calling Discord; other routes are not blocked.
    fake.fail_next(FakeFailure::RateLimited {
        retry_after: 30.0,
        global: false,
    });
    let e = ch
        .send(&msg("r4", "111", OutboundKind::Final, "x"))
        .await
        .unwrap_err();
    assert_eq!(e.retry_after(), Some(Duration::from_secs(30)));
    let n = fake.requests().len();
    let e = ch
        .send(&msg("r4", "111", OutboundKind::Final, "x"))
        .await
        .unwrap_err();
    assert!(
        matches!(e, ChannelError::RateLimited { retry_after: Some(d) } if d > Duration::from_secs(25))
    );
    assert_eq!(fake.requests().len(), n, "no request while blocked");
    ch.send(&msg("r5", "999", OutboundKind::Final, "other channel"))
        .await
        .unwrap();
    assert_eq!(fake.requests().len(), n + 1);
}

#[tokio::test]
async fn global_rate_limit_blocks_every_route() {
    let fake = FakeDiscord::start().await;
    let (ch, _) = sender_only(&fake);
    fake.fail_next(FakeFailure::RateLimited {
        retry_after: 0.3,
        global: true,
    });
    let e = ch.typing(&ChatId::new("111"), None).await.unwrap_err();
    assert_eq!(e.retry_after(), Some(Duration::from_millis(300)));
    assert_eq!(e.kind(), "rate_limited_global", "{e:?}");
    let at = fake.requests().last().unwrap().at;
    ch.send(&msg("g", "222", OutboundKind::Final, "x"))
        .await
        .unwrap();
    assert!(fake.requests().last().unwrap().at - at >= Duration::from_millis(280));
}

#[tokio::test]
async fn error_statuses_are_classified() {
    let fake = FakeDiscord::start().await;
    let (ch, _) = sender_only(&fake);
    let cases = [
        (FakeFailure::ServerError(500), "transient"),
        (FakeFailure::ServerError(503), "transient"),
        (FakeFailure::BadRequest, "rejected"),
        (FakeFailure::Forbidden, "rejected"),
        (FakeFailure::NotFound, "rejected"),
        (FakeFailure::Unauthorized, "auth"),
    ];
    for (i, (f, kind)) in cases.into_iter().enumerate() {
        fake.fail_next(f.clone());
        let e = ch
            .send(&msg(&format!("e{i}"), "111", OutboundKind::Final, "x"))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), kind, "{f:?}: {e}");
    }
    let e = ch
        .send(&msg("e-forbidden", "111", OutboundKind::Final, "x"))
        .await;
    assert!(e.is_ok());
    // Discord's message and code are kept for the operator.
    fake.fail_next(FakeFailure::Forbidden);
    let e = ch
        .send(&msg("e9", "111", OutboundKind::Final, "x"))
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("Missing Permissions (code 50013)"),
        "{e}"
    );
    // A 2xx with an unreadable body was delivered: no resend on retry.
    fake.fail_next(FakeFailure::Malformed);
    let before = posts(&fake).len();
    let m = msg("mal", "111", OutboundKind::Final, "once");
    ch.send(&m).await.unwrap();
    ch.send(&m).await.unwrap();
    assert_eq!(posts(&fake).len(), before + 1);
    // Not a channel id: refused without a request.
    let n = fake.requests().len();
    let e = ch
        .send(&msg("bad", "../users/@me", OutboundKind::Final, "x"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "rejected");
    assert_eq!(fake.requests().len(), n);
}

#[tokio::test]
async fn unreachable_api_is_transient() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let mut cfg = DiscordConfig::new("t", Arc::new(MemoryState::default()));
    cfg.api_base_url = Some(format!("http://{addr}"));
    let ch = DiscordChannel::new(cfg).unwrap();
    let e = ch
        .send(&msg("u", "111", OutboundKind::Final, "x"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "transient", "{e}");
}

#[tokio::test]
async fn hostile_text_never_pings_and_is_shown_literally() {
    let fake = FakeDiscord::start().await;
    let (ch, _) = sender_only(&fake);
    let hostile = "@everyone @here <@&123> <script>alert(1)</script> & *_~ **unclosed || `x";
    ch.send(&msg("h", "111", OutboundKind::Final, hostile))
        .await
        .unwrap();
    let p = posts(&fake);
    assert_eq!(p.len(), 1);
    assert_eq!(
        p[0].text,
        "@\u{200B}everyone @\u{200B}here \\<@&123> <script>alert(1)</script> & *_~ **unclosed \\|\\| \\`x"
    );
    assert_eq!(
        p[0].body["allowed_mentions"]["parse"],
        serde_json::json!([])
    );
    assert_eq!(p[0].body["allowed_mentions"]["replied_user"], false);
}

#[tokio::test]
async fn streaming_edits_are_bounded_by_edit_interval() {
    let fake = FakeDiscord::start().await;
    let (ch, _) = sender_only(&fake); // edit_interval 200 ms
    let started = tokio::time::Instant::now();
    for i in 0..15 {
        ch.send(&msg("d", "111", OutboundKind::Delta, &format!("w{i} ")))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    // Progress is ignored.
    ch.send(&msg("p", "111", OutboundKind::Progress, "running tool"))
        .await
        .unwrap();
    let stream = fake.sent();
    assert_eq!(stream[0].op, SentOp::Post);
    assert!(stream[1..].iter().all(|s| s.op == SentOp::Edit));
    // At most one update per interval (plus the first post), however slow the machine.
    let bound = (started.elapsed().as_millis() / 200) as usize + 1;
    assert!(
        stream.len() >= 2 && stream.len() <= bound,
        "{} > {bound}",
        stream.len()
    );
    for w in stream.windows(2) {
        assert!(w[1].at - w[0].at >= Duration::from_millis(190));
    }
    assert!(stream.last().unwrap().text.starts_with("w0 w1 "));
    let draft = stream[0].message_id.clone();
    // The final edits the draft into its first chunk and posts the rest.
    let long = format!("{}\n\n{}", "x".repeat(1800), "y".repeat(1800));
    let r = ch
        .send(&msg("f", "111", OutboundKind::Final, &long))
        .await
        .unwrap();
    assert_eq!(r.0, draft);
    let after = &fake.sent()[stream.len()..];
    assert_eq!(after.len(), 2);
    assert_eq!(
        (&after[0].op, after[0].message_id.as_str()),
        (&SentOp::Edit, draft.as_str())
    );
    assert!(after[0].text.starts_with('x'));
    assert_eq!(after[1].op, SentOp::Post);
    assert!(after[1].text.starts_with('y'));
    assert_eq!(posts(&fake).len(), 2);

    // Without stream_edits, deltas are ignored.
    let mut cfg = fake.config(Arc::new(MemoryState::default()));
    cfg.stream_edits = false;
    let plain = DiscordChannel::new(cfg).unwrap();
    let n = fake.requests().len();
    plain
        .send(&msg("d2", "111", OutboundKind::Delta, "ignored"))
        .await
        .unwrap();
    assert_eq!(fake.requests().len(), n);
    assert!(!plain.capabilities().streaming);
}

#[tokio::test]
async fn typing_posts_to_the_channel_or_thread() {
    let fake = FakeDiscord::start().await;
    let (ch, _) = sender_only(&fake);
    ch.typing(&ChatId::new("111"), None).await.unwrap();
    ch.typing(&ChatId::new("111"), Some(&ThreadId::new("444")))
        .await
        .unwrap();
    let r = fake.requests();
    assert_eq!(r[0].method, "POST");
    assert_eq!(r[0].path, "/api/v10/channels/111/typing");
    assert_eq!(r[1].path, "/api/v10/channels/444/typing");
    fake.fail_next(FakeFailure::ServerError(500));
    assert_eq!(
        ch.typing(&ChatId::new("111"), None)
            .await
            .unwrap_err()
            .kind(),
        "transient"
    );
}

#[test]
fn config_debug_hides_the_token() {
    let cfg = DiscordConfig::new("super-secret-token", Arc::new(MemoryState::default()));
    let s = format!("{cfg:?}");
    assert!(!s.contains("super-secret-token"), "{s}");
    let ch = DiscordChannel::new(cfg).unwrap();
    assert!(!format!("{ch:?}").contains("super-secret-token"));
    assert_eq!(ch.state(), "not started");
    let bad = DiscordConfig {
        api_base_url: Some("ftp://x".into()),
        ..DiscordConfig::new("t", Arc::new(MemoryState::default()))
    };
    assert!(DiscordChannel::new(bad)
        .unwrap_err()
        .to_string()
        .contains("channels.discord.api_base_url"));
}

#[test]
fn parse_message_normalises_commands_and_threads() {
    use crate::{parse_message, BotUser};
    let bot = BotUser {
        id: BOT_ID.into(),
        name: BOT_NAME.into(),
    };
    let id = clawft_channel_core::ChannelId::new("discord");
    let dm = |content: &str| {
        serde_json::json!({"id": "5", "channel_id": "777", "content": content, "type": 0,
            "author": {"id": "42"}})
    };
    let p = |v: Value| parse_message(&v, &bot, GroupMode::Mention, &id).map(|e| e.content);
    assert_eq!(p(dm("/new@clawbot")), Some("/new".into()));
    assert_eq!(p(dm("/deny@x 17")), Some("/deny 17".into()));
    assert_eq!(p(dm("/status")), Some("/status".into()));
    assert_eq!(p(dm("mail me@x.y")), Some("mail me@x.y".into()));
    assert_eq!(p(dm("   ")), None);
    // System messages (joins, pins) and webhooks are ignored.
    let mut v = dm("joined");
    v["type"] = serde_json::json!(7);
    assert_eq!(p(v), None);
    let mut v = dm("hook");
    v["webhook_id"] = serde_json::json!("9");
    assert_eq!(p(v), None);
    // A thread is a channel: its id is the chat.
    let ev = parse_message(&dm("in thread"), &bot, GroupMode::Mention, &id).unwrap();
    assert_eq!((ev.chat.as_str(), ev.thread), ("777", None));
}

#[tokio::test]
async fn unreachable_gateway_backs_off_and_reports_the_attempt() {
    let fake = FakeDiscord::start().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let mut cfg = fake.config(Arc::new(MemoryState::default()));
    cfg.gateway_url = Some(format!("ws://{addr}"));
    let l = listen_with(cfg);
    let started = std::time::Instant::now();
    wait_until("third attempt", || l.ch.state().contains("attempt 3")).await;
    // 20 ms then 40 ms between attempts (doubling).
    assert!(started.elapsed() >= Duration::from_millis(60));
    let s = l.ch.state();
    assert!(
        s.starts_with("reconnecting (attempt 3): gateway connect failed"),
        "{s}"
    );
    assert_eq!(fake.connections(), 0);
    // `gateway_url` overrides GET /gateway/bot.
    assert!(fake.requests().iter().all(|r| !r.path.contains("gateway")));
    l.stop().await.unwrap();
}

#[tokio::test]
async fn resumable_invalid_session_resumes() {
    let fake = FakeDiscord::start().await;
    let mut l = listen_with(fake.config(Arc::new(MemoryState::default())));
    fake.push_user_message("111", "42", "one");
    l.next_acked(Ack::Accepted).await;
    fake.invalidate_session(true);
    let id = fake.push_user_message("111", "42", "two");
    assert_eq!(l.next_acked(Ack::Accepted).await.event_id.as_str(), id);
    assert_eq!(fake.sessions_created(), 1);
    assert_eq!(
        fake.client_frames().iter().filter(|f| f["op"] == 6).count(),
        1
    );
    l.stop().await.unwrap();
}

#[tokio::test]
async fn empty_and_unicode_finals() {
    let fake = FakeDiscord::start().await;
    let (ch, _) = sender_only(&fake);
    ch.send(&msg("empty", "111", OutboundKind::Final, ""))
        .await
        .unwrap();
    assert!(fake.requests().is_empty(), "Discord refuses empty messages");
    // 2000 emoji are 2000 characters: exactly one message, not split on bytes.
    let emoji = "😀".repeat(1900);
    ch.send(&msg("emoji", "111", OutboundKind::Final, &emoji))
        .await
        .unwrap();
    let p = posts(&fake);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].text, emoji);
    let more = "é".repeat(4500);
    ch.send(&msg("accents", "111", OutboundKind::Final, &more))
        .await
        .unwrap();
    let p = posts(&fake);
    assert_eq!(p.len(), 4);
    assert_eq!(
        p[1..].iter().map(|s| s.text.as_str()).collect::<String>(),
        more
    );
}

#[tokio::test]
async fn wss_gateway_builds_a_tls_client_without_panicking() {
    // A TCP server that is not TLS: the handshake must fail as an error, not a panic
    // (rustls needs a crypto provider; ring is the only one compiled in).
    let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = server.accept().await {
            drop(s);
        }
    });
    let fake = FakeDiscord::start().await;
    let mut cfg = fake.config(Arc::new(MemoryState::default()));
    cfg.gateway_url = Some(format!("wss://{addr}"));
    let l = listen_with(cfg);
    wait_until("tls attempt failed", || l.ch.state().contains("attempt 2")).await;
    assert!(!l.task.is_finished());
    assert!(l.ch.state().contains("tls"), "{}", l.ch.state());
    l.stop().await.unwrap();
}

/// Time from `since` to the first IDENTIFY (op 2) or RESUME (op 6) sent after it.
async fn next_hello_after(fake: &FakeDiscord, since: tokio::time::Instant) -> Duration {
    let mut found = None;
    wait_until_for("IDENTIFY or RESUME", Duration::from_secs(10), || {
        found = fake
            .client_frames_at()
            .into_iter()
            .find(|(at, f)| *at > since && (f["op"] == 2 || f["op"] == 6))
            .map(|(at, _)| at - since);
        found.is_some()
    })
    .await;
    found.unwrap()
}

/// Issue 16 finding 7: the reconnect delay accumulated across healthy reconnects (1, 2, 4.4,
/// 8, then 16 s before an IDENTIFY after op 9) and a server Close frame was not answered.
/// Now op 7 resumes at once, op 9 waits 1-5 s, the backoff restarts from its first step after
/// a healthy connection, and a Close frame gets a Close frame back.
#[tokio::test]
async fn reconnect_delays_follow_discord_and_reset_after_a_healthy_connection() {
    let step = Duration::from_millis(200);
    let fake = FakeDiscord::start().await;
    let mut cfg = fake.config(Arc::new(MemoryState::default()));
    cfg.reconnect_backoff = step;
    let l = listen_with(cfg);
    wait_until("identified", || fake.sessions_created() == 1).await;

    // Op 9, not resumable: a new IDENTIFY after 1 to 5 s.
    let t = tokio::time::Instant::now();
    fake.invalidate_session(false);
    let d = next_hello_after(&fake, t).await;
    assert!(
        d >= Duration::from_millis(950) && d <= Duration::from_millis(5500),
        "IDENTIFY {d:?} after op 9"
    );
    wait_until("new session", || fake.sessions_created() == 2).await;

    // Network failures on connections that never become healthy (no heartbeat ACK): the
    // backoff grows.
    fake.set_heartbeat_ack(false);
    let mut delays = Vec::new();
    for _ in 0..3 {
        let t = tokio::time::Instant::now();
        fake.disconnect();
        delays.push(next_hello_after(&fake, t).await);
        wait_until("resumed", || l.ch.state().contains("resumed")).await;
    }
    assert!(delays[2] >= step * 3, "backoff did not grow: {delays:?}");

    // Op 7 on an established session: RESUME at once, whatever the backoff.
    let t = tokio::time::Instant::now();
    fake.send_reconnect();
    let d = next_hello_after(&fake, t).await;
    assert!(d < Duration::from_secs(1), "RESUME {d:?} after op 7");
    wait_until("resumed", || l.ch.state().contains("resumed")).await;

    // A healthy connection (heartbeat acknowledged): the next failure waits the first step.
    fake.set_heartbeat_ack(true);
    let beats = fake.client_frames().iter().filter(|f| f["op"] == 1).count();
    wait_until("a heartbeat", || {
        fake.client_frames().iter().filter(|f| f["op"] == 1).count() > beats
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = tokio::time::Instant::now();
    fake.disconnect();
    let d = next_hello_after(&fake, t).await;
    assert!(
        d < step * 2,
        "{d:?} after a healthy connection (first step {step:?})"
    );
    wait_until("resumed", || l.ch.state().contains("resumed")).await;

    // A Close frame from the server is answered with a Close frame.
    fake.close(4000);
    wait_until_for("close answered", Duration::from_secs(3), || {
        fake.closes_answered() == 1
    })
    .await;
    l.stop().await.unwrap();
}
