#![allow(clippy::unwrap_used, clippy::expect_used)]

use clawft_channel_core::{ChannelId, ChatId, OutboundKind, PlatformEventId, UserId};

use super::*;

fn ev(id: &str) -> InboundEvent {
    InboundEvent {
        channel: ChannelId::new("http"),
        chat: ChatId::new("c1"),
        thread: None,
        sender: UserId::new("u"),
        event_id: PlatformEventId::new(id),
        content: format!("hello {id}"),
        received_at_ms: 1,
    }
}

fn both(f: impl Fn(Store)) {
    f(Store::memory());
    let dir = tempfile::tempdir().unwrap();
    f(Store::open(&dir.path().join("db"), 1 << 20).unwrap());
}

#[test]
fn journal_dedupes_and_recovers_in_order() {
    both(|s| {
        let key = SessionKey::parse("http:c1").unwrap();
        let JournalOutcome::New(a) = s.journal_inbound(&ev("a"), &key).unwrap() else {
            panic!("a not new")
        };
        assert!(matches!(
            s.journal_inbound(&ev("a"), &key).unwrap(),
            JournalOutcome::Duplicate
        ));
        let JournalOutcome::New(_b) = s.journal_inbound(&ev("b"), &key).unwrap() else {
            panic!("b not new")
        };
        let pending = s.pending_inbound().unwrap();
        let ids: Vec<_> = pending
            .iter()
            .map(|e| e.event.as_ref().unwrap().event_id.as_str().to_string())
            .collect();
        assert_eq!(ids, ["a", "b"]);

        s.begin_turn(&a, &Message::user("hello a")).unwrap();
        let pending = s.pending_inbound().unwrap();
        assert_eq!(pending[0].state, InboxState::Started);

        let reply = OutboundMessage {
            id: "r1".into(),
            channel: ChannelId::new("http"),
            chat: ChatId::new("c1"),
            thread: None,
            in_reply_to: Some(PlatformEventId::new("a")),
            kind: OutboundKind::Final,
            content: "hi".into(),
            meta: None,
        };
        s.finish_turn(&key, Some(&a), &[Message::assistant("hi")], Some(&reply))
            .unwrap();
        assert_eq!(s.pending_inbound().unwrap().len(), 1);
        // Still deduped after done.
        assert!(matches!(
            s.journal_inbound(&ev("a"), &key).unwrap(),
            JournalOutcome::Duplicate
        ));
        assert_eq!(s.pending_outbound().unwrap(), vec![reply]);
        s.outbound_done("r1").unwrap();
        assert!(s.pending_outbound().unwrap().is_empty());

        let t = s.load_transcript(&key).unwrap();
        assert_eq!(t, vec![Message::user("hello a"), Message::assistant("hi")]);
        assert_eq!(s.sessions().unwrap().len(), 1);
        assert!(s.clear_session(&key).unwrap());
        assert!(s.load_transcript(&key).unwrap().is_empty());
        assert!(!s.clear_session(&key).unwrap());
    });
}

#[test]
fn transcript_order_survives_many_appends_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let key = SessionKey::parse("http:x").unwrap();
    {
        let s = Store::open(&dir.path().join("db"), 1 << 20).unwrap();
        for i in 0..300 {
            s.append_messages(&key, &[Message::user(format!("m{i}"))])
                .unwrap();
        }
        s.flush().unwrap();
    }
    let s = Store::open(&dir.path().join("db"), 1 << 20).unwrap();
    let t = s.load_transcript(&key).unwrap();
    assert_eq!(t.len(), 300);
    assert_eq!(t[299].content, "m299");
    assert_eq!(t[256].content, "m256");
}
