//! The adapter against the fake signal-cli daemon ([`crate::fake`]).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use clawft_channel_core::media::{MediaKind, OutboundFile};
use clawft_channel_core::{
    Ack, Channel, ChannelId, ChatId, MemoryState, OutboundMessage, PlatformEventId, StateStore,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::fake::{FakeSignal, NewFile, ACCOUNT};
use crate::{SignalChannel, SignalConfig, CURSOR_KEY};

const T: Duration = Duration::from_secs(5);

fn channel(fake: &FakeSignal, state: Arc<dyn StateStore>) -> SignalChannel {
    SignalChannel::new(SignalConfig {
        number: ACCOUNT.into(),
        api_url: fake.api_url(),
        state,
        backoff_min: Duration::from_millis(50),
        backoff_max: Duration::from_millis(200),
        ..SignalConfig::default()
    })
    .unwrap()
}

fn reply(chat: &str, text: &str, in_reply_to: Option<&str>) -> OutboundMessage {
    let mut m = OutboundMessage::proactive(
        ChannelId::new("signal"),
        ChatId::new(chat),
        None,
        text.into(),
    );
    m.in_reply_to = in_reply_to.map(PlatformEventId::new);
    m
}

#[tokio::test]
async fn a_reply_is_sent_with_text_styles_and_a_resend_posts_nothing_new() {
    let fake = FakeSignal::start().await;
    let state: Arc<dyn StateStore> = Arc::new(MemoryState::default());
    let ch = channel(&fake, state.clone());
    let msg = reply("+15551111111", "**Hello** _you_", None);
    ch.send(&msg).await.unwrap();
    let sent = fake.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].text, "Hello you");
    assert_eq!(sent[0].styles, ["0:5:BOLD", "6:3:ITALIC"]);
    // The same outbound id again (the outbox resending after a crash), even through a new
    // adapter on the same state: nothing is posted twice.
    let again = channel(&fake, state);
    again.send(&msg).await.unwrap();
    assert_eq!(fake.sent().len(), 1);
    assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
}

#[tokio::test]
async fn rate_limits_are_retryable_with_signals_delay_and_chunks_are_not_doubled() {
    let fake = FakeSignal::start().await;
    let ch = channel(&fake, Arc::new(MemoryState::default()));
    let long: String = (0..20)
        .map(|i| format!("para {i:02} {}\n\n", "word ".repeat(60)))
        .collect();
    let msg = reply("+15551111111", &long, None);
    let first = crate::render::chunks(&long);
    assert!(first.len() >= 3);
    ch.send(&reply("+15552222222", "warm up", None))
        .await
        .unwrap();
    fake.rate_limit_next_send(0);
    let e = ch.send(&msg).await.unwrap_err();
    assert!(e.is_retryable());
    assert_eq!(e.retry_after(), Some(crate::rpc::DEFAULT_RATE_LIMIT_WAIT));
    assert_eq!(fake.sent_to("+15551111111").len(), 0);
    ch.send(&msg).await.unwrap();
    let got = fake.sent_to("+15551111111");
    assert_eq!(got.len(), first.len());
    assert!(got
        .iter()
        .all(|s| s.text.len() <= crate::render::MAX_MESSAGE_BYTES));
    // Rate limited in the middle: the retry sends only the rest.
    let msg2 = reply("+15553333333", &long, None);
    fake.rate_limit_send_after(1, 7);
    let ch2 = channel(&fake, Arc::new(MemoryState::default()));
    let e = ch2.send(&msg2).await.unwrap_err();
    assert_eq!(e.retry_after(), Some(Duration::from_secs(7)));
    assert_eq!(fake.sent_to("+15553333333").len(), 1);
    ch2.send(&msg2).await.unwrap();
    assert_eq!(fake.sent_to("+15553333333").len(), first.len());
}

#[tokio::test]
async fn group_replies_quote_the_message_and_typing_goes_to_the_group() {
    let fake = FakeSignal::start().await;
    fake.add_group("R3JvdXBBQkM=", &[ACCOUNT, "+15551111111"]);
    let ch = channel(&fake, Arc::new(MemoryState::default()));
    ch.typing(&ChatId::new("group.R3JvdXBBQkM="), None)
        .await
        .unwrap();
    ch.send(&reply(
        "group.R3JvdXBBQkM=",
        "hi all",
        Some("+15551111111:1700000000042"),
    ))
    .await
    .unwrap();
    let s = fake.sent_to("group.R3JvdXBBQkM=");
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].quote, Some(1_700_000_000_042));
    assert_eq!(fake.typing().len(), 1);
    // An unknown group is a permanent error, not retried.
    let e = ch
        .send(&reply("group.Tm9wZQ==", "x", None))
        .await
        .unwrap_err();
    assert!(!e.is_retryable(), "{e}");
}

#[tokio::test]
async fn files_out_travel_as_data_uris_once_each() {
    let fake = FakeSignal::start().await;
    let dir = std::env::temp_dir().join(format!("sig-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("chart.png");
    std::fs::write(&path, b"\x89PNG fake bytes").unwrap();
    let ch = channel(&fake, Arc::new(MemoryState::default()));
    let mut msg = reply("+15551111111", "here it is", None);
    msg.attachments.push(OutboundFile {
        path: path.display().to_string(),
        name: "chart.png".into(),
        kind: MediaKind::Image,
        mime: "image/png".into(),
        size: 15,
    });
    ch.send(&msg).await.unwrap();
    ch.send(&msg).await.unwrap();
    let s = fake.sent();
    assert_eq!(s.len(), 2, "{s:?}");
    assert_eq!(s[1].files.len(), 1);
    assert_eq!(s[1].files[0].name, "chart.png");
    assert_eq!(s[1].files[0].bytes, b"\x89PNG fake bytes");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn inbound_messages_files_and_a_reconnect_that_loses_nothing() {
    let fake = FakeSignal::start().await;
    let state: Arc<dyn StateStore> = Arc::new(MemoryState::default());
    let ch = Arc::new(channel(&fake, state.clone()));
    let (tx, mut rx) = mpsc::channel(8);
    let cancel = CancellationToken::new();
    let c2 = ch.clone();
    let cc = cancel.clone();
    let task = tokio::spawn(async move { c2.listen(tx, cc).await });
    fake.push_typing("+15551111111");
    let id = fake.push_message("+15551111111", "hello");
    let mut d = tokio::time::timeout(T, rx.recv()).await.unwrap().unwrap();
    assert_eq!(d.event.event_id.as_str(), id);
    assert_eq!(d.event.content, "hello");
    d.ack.take().unwrap().send(Ack::Accepted).unwrap();
    // The stream drops; a message arrives while it is down; it is delivered after the
    // reconnect, and the first one is not delivered again.
    let deadline = tokio::time::Instant::now() + T;
    while state.get(CURSOR_KEY).is_none() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    fake.set_down(true);
    let id2 = fake.push_files(
        "+15551111111",
        Some("a photo"),
        &[NewFile {
            name: Some("cat.png".into()),
            mime: "image/png".into(),
            bytes: b"meow-bytes".to_vec(),
        }],
    );
    fake.set_down(false);
    let mut d = tokio::time::timeout(T, rx.recv()).await.unwrap().unwrap();
    assert_eq!(d.event.event_id.as_str(), id2);
    d.ack.take().unwrap().send(Ack::Accepted).unwrap();
    // The attachment downloads through the adapter's loopback endpoint.
    let req = ch.media_request(&d.event.attachments[0]).await.unwrap();
    assert!(req.trusted && req.url.starts_with("http://127.0.0.1:"));
    let body = reqwest::get(&req.url).await.unwrap().bytes().await.unwrap();
    assert_eq!(&body[..], b"meow-bytes");
    cancel.cancel();
    task.await.unwrap().unwrap();
    assert!(fake.receipts().is_empty(), "read receipts were sent");
}

#[tokio::test]
async fn the_fake_refuses_what_signal_cli_refuses() {
    let fake = FakeSignal::start().await;
    let url = format!("{}/api/v1/rpc", fake.api_url());
    let http = reqwest::Client::new();
    let call = |body: serde_json::Value| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let v: serde_json::Value = http
                .post(&url)
                .json(&body)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v["error"]["code"].as_i64()
        }
    };
    let no_account = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "send", "params": {"recipient": ["+15551111111"], "message": "x"}});
    assert_eq!(call(no_account).await, Some(-32602));
    let unknown = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "sendMessage", "params": {"account": ACCOUNT}});
    assert_eq!(call(unknown).await, Some(-32601));
    let typo = serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "send", "params": {"account": ACCOUNT, "recipients": ["+15551111111"], "message": "x"}});
    assert_eq!(call(typo).await, Some(-32602));
    let style = serde_json::json!({"jsonrpc": "2.0", "id": 4, "method": "send", "params": {"account": ACCOUNT, "recipient": "+15551111111", "message": "hi", "textStyle": ["0:9:BOLD"]}});
    assert_eq!(call(style).await, Some(-32602));
    let no_method = serde_json::json!({"jsonrpc": "2.0", "id": 5});
    assert_eq!(call(no_method).await, Some(-32600));
    let plain = http.post(&url).body("{}").send().await.unwrap();
    assert_eq!(plain.status().as_u16(), 415);
    assert!(fake.sent().is_empty());
}
