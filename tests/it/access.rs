//! Who may talk to the bot on a chat platform: deny by default, allow_from by id, pairing.

use std::sync::Arc;
use std::time::Duration;

use clawft::config::Config;
use clawft::daemon::{build_model, Daemon};
use clawft::store::Store;
use clawft_channel_core::testing::FakeChannel;
use clawft_channel_core::{
    now_ms, Ack, Channel, ChannelId, ChatId, InboundEvent, OutboundKind, PlatformEventId, UserId,
};
use serde_json::json;

use crate::common::{config_value, test_env};
use crate::fake_llm::{FakeLlm, Reply};

const T: Duration = Duration::from_secs(20);

fn event(user: &str, id: &str, text: &str) -> InboundEvent {
    InboundEvent {
        channel: ChannelId::new("telegram"),
        chat: ChatId::new(format!("chat-{user}")),
        thread: None,
        sender: UserId::new(user),
        sender_name: None,
        event_id: PlatformEventId::new(id),
        content: text.into(),
        received_at_ms: now_ms(),
        attachments: Vec::new(),
        origin: clawft_channel_core::Origin::User,
    }
}

async fn start(llm: &FakeLlm, dir: &std::path::Path, fake: &FakeChannel) -> Daemon {
    start_with(
        llm,
        dir,
        fake,
        json!({"token": "123456:AAtest-token", "allow_from": [42], "pairing": true}),
    )
    .await
}

async fn start_with(
    llm: &FakeLlm,
    dir: &std::path::Path,
    fake: &FakeChannel,
    telegram: serde_json::Value,
) -> Daemon {
    clawft::install_crypto_provider();
    let v = config_value(
        &llm.base_url(),
        dir,
        json!({
            "channels": {
                "http": {"enabled": false},
                "telegram": telegram,
            },
        }),
    );
    let config = Config::from_str(&v.to_string(), false, &test_env(dir)).unwrap();
    let store = Store::open(&config.store.path, config.store.cache_bytes).unwrap();
    let model = build_model(&config).unwrap();
    let channels: Vec<Arc<dyn Channel>> = vec![Arc::new(fake.clone())];
    Daemon::start(&config, store, model, channels)
        .await
        .unwrap()
}

#[tokio::test]
async fn strangers_are_refused_get_one_code_and_are_admitted_once_paired() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("hello 42".into()));
    llm.push(Reply::Text("hello 7".into()));
    let fake = FakeChannel::new("telegram");
    let daemon = start(&llm, dir.path(), &fake).await;

    // The allowed id is answered.
    assert_eq!(
        fake.inject(event("42", "u1", "hi")).await,
        Some(Ack::Accepted)
    );
    let sent = fake.wait_sent(1, T).await;
    assert_eq!(sent[0].text(), "hello 42");

    // A stranger is refused, never reaches the model, and gets one pairing code.
    let ack = fake.inject(event("7", "u2", "let me in")).await.unwrap();
    assert!(matches!(ack, Ack::Rejected(_)), "{ack:?}");
    let sent = fake.wait_sent(2, T).await;
    let code_msg = &sent[1];
    assert_eq!(code_msg.chat.as_str(), "chat-7");
    let code = code_msg
        .text()
        .split("pairing approve ")
        .nth(1)
        .unwrap()
        .split('`')
        .next()
        .unwrap()
        .to_string();
    let again = fake.inject(event("7", "u3", "please")).await.unwrap();
    assert!(matches!(again, Ack::Rejected(_)));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        fake.sent().len(),
        2,
        "a second code was sent: {:?}",
        fake.sent()
    );
    assert_eq!(llm.requests().len(), 1, "the stranger reached the model");

    // The operator approves the code: from now on the sender is answered.
    let v =
        clawft::admin::pairing_command(daemon.store(), "pairing/approve", &json!({ "code": code }))
            .unwrap();
    assert_eq!(v["approved"], "telegram:7");
    assert_eq!(
        fake.inject(event("7", "u4", "hi again")).await,
        Some(Ack::Accepted)
    );
    let sent = fake.wait_sent(3, T).await;
    assert_eq!(sent[2].text(), "hello 7");
    assert_eq!(sent[2].chat.as_str(), "chat-7");
    daemon.shutdown().await;
}

#[tokio::test]
async fn group_sessions_user_gives_each_member_their_own_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    for t in ["a1", "b1", "a2"] {
        llm.push(Reply::Text(t.into()));
    }
    let fake = FakeChannel::new("telegram");
    let daemon = start_with(
        &llm,
        dir.path(),
        &fake,
        json!({"token": "123456:AAtest-token", "allow_from": [42, 43], "group_sessions": "user"}),
    )
    .await;
    let group = |user: &str, id: &str, text: &str| {
        let mut e = event(user, id, text);
        e.chat = ChatId::new("-100");
        e
    };
    assert_eq!(
        fake.inject(group("42", "g1", "I am 42")).await,
        Some(Ack::Accepted)
    );
    fake.wait_sent(1, T).await;
    assert_eq!(
        fake.inject(group("43", "g2", "I am 43")).await,
        Some(Ack::Accepted)
    );
    fake.wait_sent(2, T).await;
    assert_eq!(
        fake.inject(group("42", "g3", "again 42")).await,
        Some(Ack::Accepted)
    );
    let sent = fake.wait_sent(3, T).await;
    // Replies go to the group chat.
    assert!(sent.iter().all(|m| m.chat.as_str() == "-100"));
    let users = |i: usize| -> Vec<String> {
        llm.requests()[i]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "user")
            .map(|m| m["content"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(users(1), ["I am 43"], "43 saw 42's conversation");
    assert_eq!(users(2), ["I am 42", "again 42"]);
    daemon.shutdown().await;
}

/// A channel receives only what its capabilities say it takes: one that streams but shows no
/// tool progress gets the deltas and the reply, never a progress note (they were sent to every
/// streaming adapter, which threw them away).
#[tokio::test]
async fn a_channel_gets_progress_notes_only_when_it_shows_them() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    for _ in 0..2 {
        llm.push(Reply::ToolCalls(vec![(
            "c1".into(),
            "list_directory".into(),
            r#"{"path": "."}"#.into(),
        )]));
        llm.push(Reply::Text("listed".into()));
    }
    let caps = |progress| clawft_channel_core::Capabilities {
        streaming: true,
        progress,
        max_message_bytes: 4096,
        max_upload_bytes: 0,
    };
    for progress in [false, true] {
        let fake = FakeChannel::new("telegram").with_capabilities(caps(progress));
        let daemon = start(&llm, &dir.path().join(format!("p{progress}")), &fake).await;
        assert_eq!(
            fake.inject(event("42", &format!("e{progress}"), "list it"))
                .await,
            Some(Ack::Accepted)
        );
        let mut sent = Vec::new();
        assert!(
            crate::common::wait_until(T, || {
                sent = fake.sent();
                sent.iter().any(|m| m.kind() == OutboundKind::Final)
            })
            .await,
            "no reply: {sent:?}"
        );
        let notes = sent
            .iter()
            .filter(|m| m.kind() == OutboundKind::Progress)
            .count();
        if progress {
            assert_eq!(notes, 2, "started and finished: {sent:?}");
        } else {
            assert_eq!(notes, 0, "progress reached a channel without it: {sent:?}");
        }
        assert_eq!(
            sent.last().map(clawft_channel_core::OutboundMessage::text),
            Some("listed")
        );
        daemon.shutdown().await;
    }
}
