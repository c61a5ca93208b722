#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;

#[test]
fn signatures_are_checked_over_the_raw_body() {
    let body = br#"{"object":"whatsapp_business_account"}"#;
    let sig = sign("s3cret", body);
    assert!(signature_ok("s3cret", &sig, body));
    assert!(!signature_ok("other", &sig, body));
    assert!(!signature_ok("s3cret", &sig, b"{}"));
    assert!(!signature_ok("s3cret", "", body));
    assert!(!signature_ok(
        "s3cret",
        &sig.replace("sha256=", "sha1="),
        body
    ));
}

#[test]
fn long_replies_split_under_the_limit() {
    let text = "word ".repeat(3000);
    let c = chunks(&text);
    assert!(c.len() >= 4);
    assert!(c.iter().all(|c| c.chars().count() <= MAX_MESSAGE_CHARS));
    assert!(chunks("  ").is_empty());
}

#[test]
fn graph_errors_are_classified() {
    let e = |status, code| api::GraphError {
        status,
        code,
        message: "m".into(),
        retry_after: None,
    };
    for code in [130_429, 131_056, 80_007] {
        assert!(matches!(
            e(400, code).classify("k"),
            ChannelError::RateLimited {
                retry_after: Some(_)
            }
        ));
    }
    assert!(matches!(
        e(429, 0).classify("k"),
        ChannelError::RateLimited { .. }
    ));
    assert!(matches!(e(401, 190).classify("k"), ChannelError::Auth(_)));
    assert!(matches!(
        e(500, 1).classify("k"),
        ChannelError::Transient(_)
    ));
    assert!(matches!(
        e(400, 100).classify("k"),
        ChannelError::Rejected(_)
    ));
}

fn channel() -> WhatsAppChannel {
    WhatsAppChannel::new(WhatsAppConfig {
        id: ChannelId::new("whatsapp-unit"),
        access_token: "t".into(),
        app_secret: "s".into(),
        verify_token: "v".into(),
        phone_number_id: "123".into(),
        api_url: "http://127.0.0.1:9".into(),
        api_version: DEFAULT_API_VERSION.into(),
        template: None,
        token_key: "channels.whatsapp.token".into(),
        state: Arc::new(clawft_channel_core::MemoryState::default()),
    })
    .unwrap()
}

fn body(phone: &str, messages: Value) -> Value {
    json!({"object": "whatsapp_business_account", "entry": [{"id": "1", "changes": [{"field": "messages",
        "value": {"messaging_product": "whatsapp", "metadata": {"phone_number_id": phone}, "messages": messages}}]}]})
}

#[test]
fn webhook_messages_become_events_with_their_files() {
    let ch = channel();
    let v = body(
        "123",
        json!([
            {"from": "4915100", "id": "wamid.A", "type": "text", "text": {"body": "hi"}},
            {"from": "4915100", "id": "wamid.B", "type": "audio", "audio": {"id": "m1", "mime_type": "audio/ogg; codecs=opus", "voice": true}},
            {"from": "4915100", "id": "wamid.C", "type": "document", "document": {"id": "m2", "mime_type": "application/pdf", "filename": "a.pdf", "caption": "read this"}},
            {"from": "4915100", "id": "wamid.D", "type": "reaction", "reaction": {"emoji": "👍"}},
            {"from": "4915100", "id": "wamid.E", "type": "interactive", "interactive": {"type": "button_reply", "button_reply": {"id": "b", "title": "Yes"}}},
        ]),
    );
    let evs = ch.inner.events(&v);
    let ids: Vec<&str> = evs.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids, ["wamid.A", "wamid.B", "wamid.C", "wamid.E"]);
    assert_eq!(evs[0].content, "hi");
    assert_eq!(evs[0].chat.as_str(), "4915100");
    assert_eq!(evs[0].sender.as_str(), "4915100");
    assert_eq!(evs[1].attachments[0].kind, MediaKind::Voice);
    assert_eq!(evs[1].attachments[0].id, "m1");
    assert_eq!(evs[2].content, "read this");
    assert_eq!(evs[2].attachments[0].name.as_deref(), Some("a.pdf"));
    assert_eq!(evs[3].content, "Yes");
    // Another phone number's webhook (same app) is not this channel's.
    assert!(ch
        .inner
        .events(&body(
            "999",
            json!([{"from": "1", "id": "wamid.X", "type": "text", "text": {"body": "x"}}])
        ))
        .is_empty());
}
