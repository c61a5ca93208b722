#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::{send_files, SendFiles, SendPath, SendPlatform};
use crate::draft::{DraftOptions, DraftPlatform, Edited, Slot};
use crate::draft_journal::DraftJournal;
use crate::media::{MediaKind, OutboundFile};
use crate::{
    Capabilities, ChannelError, ChannelId, ChatId, MemoryState, OutboundBody, OutboundKind,
    OutboundMessage, PlatformEventId, SentRef,
};

#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    Post(Slot, String),
    Edit(u32, String),
    /// A file: its index and whether it was sent as the first message of its reply.
    File(usize, bool),
}

/// A platform that records its calls; message ids start at 100, file ids at 500. Clones
/// share the record (the adapter builds one per message).
#[derive(Clone, Default)]
struct Fake {
    ops: Arc<Mutex<Vec<Op>>>,
    /// The next file uploads fail with these.
    fail_files: Arc<Mutex<VecDeque<ChannelError>>>,
}

impl Fake {
    fn ops(&self) -> Vec<Op> {
        self.ops.lock().unwrap().clone()
    }
    fn record(&self, op: Op) -> u32 {
        let mut ops = self.ops.lock().unwrap();
        ops.push(op);
        u32::try_from(ops.len()).unwrap() + 99
    }
}

#[async_trait]
impl DraftPlatform for Fake {
    type Id = u32;
    type Text = String;

    fn preview(&self, markdown: &str) -> Option<String> {
        let t = markdown.trim();
        (!t.is_empty()).then(|| t.to_string())
    }

    async fn post(&self, slot: Slot, text: &String) -> Result<Option<u32>, ChannelError> {
        Ok(Some(self.record(Op::Post(slot, text.clone()))))
    }

    async fn edit(&self, id: &u32, text: &String) -> Result<Edited, ChannelError> {
        self.record(Op::Edit(*id, text.clone()));
        Ok(Edited::Done)
    }
}

#[async_trait]
impl SendFiles for Fake {
    async fn send_file(
        &self,
        index: usize,
        _file: &OutboundFile,
        first: bool,
    ) -> Result<SentRef, ChannelError> {
        if let Some(e) = self.fail_files.lock().unwrap().pop_front() {
            return Err(e);
        }
        let n = self.record(Op::File(index, first));
        Ok(SentRef::message((n + 400).to_string()))
    }
}

impl SendPlatform for Fake {
    /// A chunk per paragraph.
    fn render(&self, markdown: &str) -> Vec<String> {
        markdown
            .split("\n\n")
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect()
    }
}

fn msg(kind: OutboundKind, id: &str, text: &str) -> OutboundMessage {
    OutboundMessage {
        id: id.into(),
        channel: ChannelId::new("test"),
        chat: ChatId::new("c1"),
        thread: None,
        in_reply_to: Some(PlatformEventId::new("ev1")),
        body: OutboundBody::text_of(kind, text.into()),
        attachments: Vec::new(),
    }
}

fn file(name: &str) -> OutboundFile {
    OutboundFile {
        path: format!("/nowhere/{name}"),
        name: name.into(),
        kind: MediaKind::Document,
        mime: "text/plain".into(),
        size: 1,
    }
}

fn caps(streaming: bool) -> Capabilities {
    Capabilities {
        streaming,
        ..Capabilities::default()
    }
}

fn path(state: &Arc<MemoryState>) -> SendPath<u32, String> {
    SendPath::new(
        DraftOptions {
            edit_interval: Duration::ZERO,
            ..DraftOptions::default()
        },
        state.clone(),
    )
}

#[tokio::test]
async fn kinds_the_channel_does_not_take_send_nothing_and_build_no_target() {
    let state = Arc::new(MemoryState::default());
    let p = path(&state);
    let refuse = || -> Result<Fake, ChannelError> { Err(ChannelError::Rejected("bad".into())) };
    for kind in [OutboundKind::Delta, OutboundKind::Progress] {
        let sent = p.send(&caps(false), &msg(kind, "x", "hi"), refuse).await;
        assert_eq!(sent.unwrap(), SentRef::Nothing, "{kind:?}");
    }
    // Progress is shown by no chat platform, even one that claims it.
    let all = Capabilities {
        progress: true,
        ..caps(true)
    };
    let progress = msg(OutboundKind::Progress, "p", "grep");
    let sent = p.send(&all, &progress, refuse).await;
    assert_eq!(sent.unwrap(), SentRef::Nothing);
    // A delta that answers no event has no draft to go to.
    let mut orphan = msg(OutboundKind::Delta, "o", "hi");
    orphan.in_reply_to = None;
    assert_eq!(
        p.send(&caps(true), &orphan, refuse).await.unwrap(),
        SentRef::Nothing
    );
    // A final is refused by the target it needs.
    let fin = msg(OutboundKind::Final, "f", "hi");
    let sent = p.send(&caps(true), &fin, refuse).await;
    assert!(matches!(sent, Err(ChannelError::Rejected(_))));
}

#[tokio::test]
async fn a_streamed_reply_is_drafted_finished_and_followed_by_its_files() {
    let state = Arc::new(MemoryState::default());
    let p = path(&state);
    let fake = Fake::default();
    let sent = p
        .send(
            &caps(true),
            &msg(OutboundKind::Delta, "d1", "Hello"),
            || Ok(fake.clone()),
        )
        .await
        .unwrap();
    assert_eq!(sent, SentRef::message("100"));
    let mut fin = msg(OutboundKind::Final, "f", "Hello\n\nworld");
    fin.attachments = vec![file("a.txt"), file("b.txt")];
    let sent = p
        .send(&caps(true), &fin, || Ok(fake.clone()))
        .await
        .unwrap();
    assert_eq!(
        sent,
        SentRef::message("100"),
        "the first message of the text"
    );
    assert_eq!(
        fake.ops(),
        vec![
            Op::Post(Slot::Draft, "Hello".into()),
            Op::Edit(100, "Hello".into()),
            Op::Post(Slot::Chunk(1), "world".into()),
            Op::File(0, false),
            Op::File(1, false),
        ]
    );
    // Delivered: a resend (after a crash, before the outbox forgot it) sends nothing again.
    let again = path(&state);
    let other = Fake::default();
    let sent = again
        .send(&caps(true), &fin, || Ok(other.clone()))
        .await
        .unwrap();
    assert_eq!(sent, SentRef::message("100"));
    assert_eq!(other.ops(), Vec::new());
    // Settled: the journal forgets it.
    again.settled(&fin);
    assert_eq!(DraftJournal::new(state).files_sent("f"), 0);
}

#[tokio::test]
async fn a_reply_of_files_only_answers_with_its_first_file_which_quotes_the_user() {
    let state = Arc::new(MemoryState::default());
    let p = path(&state);
    let fake = Fake::default();
    let mut fin = msg(OutboundKind::Final, "f", "");
    fin.attachments = vec![file("a.txt"), file("b.txt"), file("c.txt")];
    fake.fail_files
        .lock()
        .unwrap()
        .push_back(ChannelError::Transient("reset".into()));
    // The first upload fails: nothing is counted, the retry starts with it again.
    assert!(p
        .send(&caps(false), &fin, || Ok(fake.clone()))
        .await
        .is_err());
    let sent = p
        .send(&caps(false), &fin, || Ok(fake.clone()))
        .await
        .unwrap();
    assert_eq!(sent, SentRef::message("500"));
    assert_eq!(
        fake.ops(),
        vec![Op::File(0, true), Op::File(1, false), Op::File(2, false)]
    );
}

#[tokio::test]
async fn files_already_counted_are_not_sent_again_and_a_failure_keeps_the_count() {
    let state: Arc<MemoryState> = Arc::new(MemoryState::default());
    let journal = DraftJournal::new(state.clone());
    let fake = Fake::default();
    let mut fin = msg(OutboundKind::Final, "f", "text went first");
    fin.attachments = vec![file("a"), file("b"), file("c")];
    journal.set_files_sent("f", 1);
    fake.fail_files
        .lock()
        .unwrap()
        .extend([ChannelError::Rejected("no".into())]);
    assert!(send_files(&journal, &fake, &fin, true).await.is_err());
    assert_eq!(journal.files_sent("f"), 1);
    let first = send_files(&journal, &fake, &fin, true).await.unwrap();
    // The first file went before: none of these is the reply's first message.
    assert_eq!(fake.ops(), vec![Op::File(1, false), Op::File(2, false)]);
    assert_eq!(first, SentRef::message("500"));
    assert_eq!(journal.files_sent("f"), 3);
    // No attachments: nothing read, nothing sent.
    let plain = msg(OutboundKind::Final, "g", "x");
    assert_eq!(
        send_files(&journal, &fake, &plain, true).await.unwrap(),
        SentRef::Nothing
    );
}

#[test]
fn sent_refs_keep_the_string_form_and_say_nothing_in_a_type() {
    let id: SentRef = serde_json::from_str("\"42\"").unwrap();
    assert_eq!(id, SentRef::message("42"));
    let nothing: SentRef = serde_json::from_str("\"\"").unwrap();
    assert!(nothing.is_nothing());
    assert_eq!(serde_json::to_string(&SentRef::Nothing).unwrap(), "\"\"");
    assert_eq!(serde_json::to_string(&id).unwrap(), "\"42\"");
    assert_eq!(SentRef::Nothing.or(id.clone()), id);
    assert_eq!(SentRef::of::<u32>(None), SentRef::Nothing);
    assert_eq!(SentRef::of(Some(&7u32)), SentRef::message("7"));
}
