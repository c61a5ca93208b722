#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;

use super::{DraftBook, DraftKey, DraftOptions, DraftPlatform, Edited, Slot};
use crate::{ChannelError, ChannelId, ChatId, OutboundKind, OutboundMessage, PlatformEventId};

#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    Post(Slot, String),
    Edit(u32, String),
}

/// A platform that records what was posted and edited; ids start at 100.
#[derive(Default)]
struct Fake {
    ops: Mutex<Vec<Op>>,
    attempts: AtomicUsize,
    /// The next calls fail with these (`None`: an edit answers `Gone`).
    fail: Mutex<VecDeque<Option<ChannelError>>>,
    empty_final: Option<String>,
}

impl Fake {
    fn ops(&self) -> Vec<Op> {
        self.ops.lock().unwrap().clone()
    }
    fn fail_next(&self, e: ChannelError) {
        self.fail.lock().unwrap().push_back(Some(e));
    }
    fn gone_next(&self) {
        self.fail.lock().unwrap().push_back(None);
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

    fn empty_final(&self) -> Option<String> {
        self.empty_final.clone()
    }

    async fn post(&self, slot: Slot, text: &String) -> Result<Option<u32>, ChannelError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        if let Some(Some(e)) = self.fail.lock().unwrap().pop_front() {
            return Err(e);
        }
        let mut ops = self.ops.lock().unwrap();
        let id = 100 + u32::try_from(ops.len()).unwrap();
        ops.push(Op::Post(slot, text.clone()));
        Ok(Some(id))
    }

    async fn edit(&self, id: &u32, text: &String) -> Result<Edited, ChannelError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        match self.fail.lock().unwrap().pop_front() {
            Some(Some(e)) => return Err(e),
            Some(None) => return Ok(Edited::Gone),
            None => {}
        }
        self.ops.lock().unwrap().push(Op::Edit(*id, text.clone()));
        Ok(Edited::Done)
    }
}

fn msg(kind: OutboundKind, id: &str, content: &str) -> OutboundMessage {
    OutboundMessage {
        id: id.into(),
        channel: ChannelId::new("test"),
        chat: ChatId::new("c1"),
        thread: None,
        in_reply_to: Some(PlatformEventId::new("ev1")),
        body: crate::OutboundBody::text_of(kind, content.into()),
        attachments: Vec::new(),
    }
}

fn delta(id: &str, content: &str) -> OutboundMessage {
    msg(OutboundKind::Delta, id, content)
}

fn fin(id: &str) -> OutboundMessage {
    msg(OutboundKind::Final, id, "(rendered by the platform)")
}

fn book(interval: Duration) -> DraftBook<u32, String> {
    DraftBook::new(DraftOptions {
        edit_interval: interval,
        ..DraftOptions::default()
    })
}

fn chunks(c: &[&str]) -> Vec<String> {
    c.iter().map(|s| (*s).to_string()).collect()
}

fn post(slot: Slot, t: &str) -> Op {
    Op::Post(slot, t.into())
}

fn edit(id: u32, t: &str) -> Op {
    Op::Edit(id, t.into())
}

#[tokio::test]
async fn a_restart_withdraws_the_text_streamed_so_far() {
    let p = Fake::default();
    let b = book(Duration::ZERO);
    b.delta(&p, &delta("d1", "The answer is fo")).await.unwrap();
    let mut restart = delta("r", "");
    restart.body = crate::OutboundBody::Restart;
    assert!(restart.is_restart() && !delta("d", "x").is_restart());
    b.delta(&p, &restart).await.unwrap();
    b.delta(&p, &delta("d2", "The answer")).await.unwrap();
    b.delta(&p, &delta("d3", " is 42.")).await.unwrap();
    assert_eq!(
        p.ops(),
        vec![
            post(Slot::Draft, "The answer is fo"),
            edit(100, "The answer"),
            edit(100, "The answer is 42."),
        ]
    );
}

#[tokio::test]
async fn deltas_post_a_draft_then_edit_it_and_the_final_takes_it_over() {
    let p = Fake::default();
    let b = book(Duration::ZERO);
    assert_eq!(b.delta(&p, &delta("d1", "Hel")).await.unwrap().0, "100");
    assert_eq!(b.delta(&p, &delta("d2", "lo")).await.unwrap().0, "100");
    let key = DraftKey::of(&delta("x", "")).unwrap();
    assert_eq!(b.message_id(&key).await, Some(100));
    let r = b.finish(&p, &fin("f"), chunks(&["A", "B"])).await.unwrap();
    assert_eq!(r.0, "100");
    assert_eq!(
        p.ops(),
        vec![
            post(Slot::Draft, "Hel"),
            edit(100, "Hello"),
            edit(100, "A"),
            post(Slot::Chunk(1), "B"),
        ]
    );
    // The draft is gone and a late fragment changes nothing.
    assert_eq!(b.message_id(&key).await, None);
    assert_eq!(b.delta(&p, &delta("late", "zzz")).await.unwrap().0, "");
    assert_eq!(p.ops().len(), 4);
}

#[tokio::test]
async fn edits_wait_for_the_interval() {
    let p = Fake::default();
    let b = book(Duration::from_millis(80));
    b.delta(&p, &delta("d1", "a")).await.unwrap();
    b.delta(&p, &delta("d2", "b")).await.unwrap();
    b.delta(&p, &delta("d3", "c")).await.unwrap();
    assert_eq!(p.ops(), vec![post(Slot::Draft, "a")]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    b.delta(&p, &delta("d4", "d")).await.unwrap();
    assert_eq!(p.ops(), vec![post(Slot::Draft, "a"), edit(100, "abcd")]);
    // The final is never throttled.
    b.finish(&p, &fin("f"), chunks(&["abcde"])).await.unwrap();
    assert_eq!(p.ops().last(), Some(&edit(100, "abcde")));
}

#[tokio::test]
async fn nothing_is_posted_until_the_text_shows_something_and_identical_edits_are_skipped() {
    let p = Fake::default();
    let b = book(Duration::from_secs(3600));
    b.delta(&p, &delta("d0", "\n")).await.unwrap();
    assert!(p.ops().is_empty());
    // Not posted yet, so not throttled.
    b.delta(&p, &delta("d1", "Hi")).await.unwrap();
    assert_eq!(p.ops(), vec![post(Slot::Draft, "Hi")]);

    let b = book(Duration::ZERO);
    let p = Fake::default();
    b.delta(&p, &delta("d1", "Hi")).await.unwrap();
    b.delta(&p, &delta("d2", "  ")).await.unwrap();
    assert_eq!(p.ops(), vec![post(Slot::Draft, "Hi")]);
}

#[tokio::test]
async fn a_final_without_a_draft_posts_every_chunk() {
    let p = Fake::default();
    let b = book(Duration::ZERO);
    let r = b.finish(&p, &fin("f"), chunks(&["x", "y"])).await.unwrap();
    assert_eq!(r.0, "100");
    assert_eq!(
        p.ops(),
        vec![post(Slot::Chunk(0), "x"), post(Slot::Chunk(1), "y")]
    );
    // Without in_reply_to there is no draft either; deltas are ignored.
    let mut proactive = fin("g");
    proactive.in_reply_to = None;
    b.finish(&p, &proactive, chunks(&["z"])).await.unwrap();
    let mut orphan = delta("d", "orphan");
    orphan.in_reply_to = None;
    assert_eq!(b.delta(&p, &orphan).await.unwrap().0, "");
    assert_eq!(p.ops().len(), 3);
    assert_eq!(p.ops()[2], post(Slot::Chunk(0), "z"));
}

#[tokio::test]
async fn a_final_that_fails_midway_resumes_where_it_stopped() {
    let p = Fake::default();
    let b = book(Duration::ZERO);
    b.delta(&p, &delta("d1", "draft")).await.unwrap();
    let three = chunks(&["one", "two", "three"]);
    // First attempt: the edit of chunk 0 works, posting chunk 1 fails.
    let first = {
        let p = FailOnCall {
            inner: &p,
            fail_at: p.attempts.load(Ordering::SeqCst) + 1,
        };
        b.finish(&p, &fin("f"), three.clone()).await
    };
    assert!(matches!(first, Err(ChannelError::Transient(_))));
    // Late deltas no longer touch the draft (it holds chunk 0 now).
    b.delta(&p, &delta("late", "zzz")).await.unwrap();
    let r = b.finish(&p, &fin("f"), three.clone()).await.unwrap();
    assert_eq!(r.0, "100");
    assert_eq!(
        p.ops(),
        vec![
            post(Slot::Draft, "draft"),
            edit(100, "one"),
            post(Slot::Chunk(1), "two"),
            post(Slot::Chunk(2), "three"),
        ]
    );
    // Delivered already: nothing is sent again, the first id is answered.
    let again = b.finish(&p, &fin("f"), three).await.unwrap();
    assert_eq!(again.0, "100");
    assert_eq!(p.ops().len(), 4);
}

/// Wraps [`Fake`], failing its `fail_at`-th call overall (counted by `attempts`).
struct FailOnCall<'a> {
    inner: &'a Fake,
    fail_at: usize,
}

#[async_trait]
impl DraftPlatform for FailOnCall<'_> {
    type Id = u32;
    type Text = String;
    fn preview(&self, markdown: &str) -> Option<String> {
        self.inner.preview(markdown)
    }
    async fn post(&self, slot: Slot, text: &String) -> Result<Option<u32>, ChannelError> {
        if self.inner.attempts.load(Ordering::SeqCst) == self.fail_at {
            self.inner.attempts.fetch_add(1, Ordering::SeqCst);
            return Err(ChannelError::Transient("down".into()));
        }
        self.inner.post(slot, text).await
    }
    async fn edit(&self, id: &u32, text: &String) -> Result<Edited, ChannelError> {
        if self.inner.attempts.load(Ordering::SeqCst) == self.fail_at {
            self.inner.attempts.fetch_add(1, Ordering::SeqCst);
            return Err(ChannelError::Transient("down".into()));
        }
        self.inner.edit(id, text).await
    }
}

#[tokio::test]
async fn a_draft_the_platform_lost_is_replaced_by_a_post() {
    let p = Fake::default();
    let b = book(Duration::ZERO);
    b.delta(&p, &delta("d1", "Hello")).await.unwrap();
    p.gone_next();
    let r = b
        .finish(&p, &fin("f"), chunks(&["Hello world"]))
        .await
        .unwrap();
    assert_eq!(r.0, "101");
    assert_eq!(
        p.ops(),
        vec![
            post(Slot::Draft, "Hello"),
            post(Slot::Chunk(0), "Hello world")
        ]
    );
}

#[tokio::test]
async fn a_rate_limit_pauses_the_draft_but_not_the_final() {
    let p = Fake::default();
    let b = book(Duration::ZERO);
    b.delta(&p, &delta("d1", "a")).await.unwrap();
    p.fail_next(ChannelError::RateLimited {
        retry_after: Some(Duration::from_secs(3600)),
    });
    assert!(b.delta(&p, &delta("d2", "b")).await.is_err());
    let attempts = p.attempts.load(Ordering::SeqCst);
    b.delta(&p, &delta("d3", "c")).await.unwrap();
    assert_eq!(p.attempts.load(Ordering::SeqCst), attempts, "paused");
    b.finish(&p, &fin("f"), chunks(&["abc"])).await.unwrap();
    assert_eq!(p.ops(), vec![post(Slot::Draft, "a"), edit(100, "abc")]);
}

#[tokio::test]
async fn a_failed_first_post_is_retried_by_the_next_delta() {
    let p = Fake::default();
    let b = book(Duration::from_secs(3600));
    p.fail_next(ChannelError::Transient("down".into()));
    assert!(b.delta(&p, &delta("d1", "a")).await.is_err());
    b.delta(&p, &delta("d2", "b")).await.unwrap();
    assert_eq!(p.ops(), vec![post(Slot::Draft, "ab")]);
}

#[tokio::test]
async fn repeated_delta_ids_are_appended_once_only_when_asked() {
    let p = Fake::default();
    let b = book(Duration::ZERO);
    b.delta(&p, &delta("d", "x")).await.unwrap();
    b.delta(&p, &delta("d", "y")).await.unwrap();
    assert_eq!(p.ops().last(), Some(&edit(100, "xy")));

    let p = Fake::default();
    let b: DraftBook<u32, String> = DraftBook::new(DraftOptions {
        edit_interval: Duration::ZERO,
        skip_repeated_deltas: true,
        ..DraftOptions::default()
    });
    p.fail_next(ChannelError::Transient("down".into()));
    let d = delta("d1", "once ");
    assert!(b.delta(&p, &d).await.is_err());
    b.delta(&p, &d).await.unwrap();
    b.delta(&p, &delta("d2", "twice")).await.unwrap();
    assert_eq!(
        p.ops(),
        vec![post(Slot::Draft, "once"), edit(100, "once twice")]
    );
}

#[tokio::test]
async fn an_empty_final_closes_the_draft_or_replaces_it_when_the_platform_says() {
    let p = Fake::default();
    let b = book(Duration::ZERO);
    b.delta(&p, &delta("d1", "partial")).await.unwrap();
    assert_eq!(b.finish(&p, &fin("f"), Vec::new()).await.unwrap().0, "");
    b.delta(&p, &delta("late", "more")).await.unwrap();
    assert_eq!(p.ops(), vec![post(Slot::Draft, "partial")]);

    let p = Fake {
        empty_final: Some("…".into()),
        ..Fake::default()
    };
    let b = book(Duration::ZERO);
    b.delta(&p, &delta("d1", "partial")).await.unwrap();
    assert_eq!(b.finish(&p, &fin("f"), Vec::new()).await.unwrap().0, "100");
    assert_eq!(p.ops(), vec![post(Slot::Draft, "partial"), edit(100, "…")]);
    // Without a draft an empty final sends nothing.
    let b = book(Duration::ZERO);
    assert_eq!(b.finish(&p, &fin("g"), Vec::new()).await.unwrap().0, "");
    assert_eq!(p.ops().len(), 2);
}

#[tokio::test]
async fn drafts_are_per_chat_and_reply() {
    let p = Fake::default();
    let b = book(Duration::ZERO);
    b.delta(&p, &delta("d1", "one")).await.unwrap();
    let mut other = delta("d2", "two");
    other.in_reply_to = Some(PlatformEventId::new("ev2"));
    b.delta(&p, &other).await.unwrap();
    let mut elsewhere = delta("d3", "three");
    elsewhere.chat = ChatId::new("c2");
    b.delta(&p, &elsewhere).await.unwrap();
    assert_eq!(
        p.ops(),
        vec![
            post(Slot::Draft, "one"),
            post(Slot::Draft, "two"),
            post(Slot::Draft, "three")
        ]
    );
}

// ---- The journal: what survives a restart (a new book over the same state store). ----

fn journaled(state: &std::sync::Arc<crate::MemoryState>) -> DraftBook<u32, String> {
    book(Duration::ZERO).with_journal(state.clone())
}

#[tokio::test]
async fn after_a_restart_the_final_edits_the_journaled_draft_instead_of_posting() {
    let state = std::sync::Arc::new(crate::MemoryState::default());
    let p = Fake::default();
    journaled(&state)
        .delta(&p, &delta("d1", "Hel"))
        .await
        .unwrap();
    // The process dies; a new one resends the final of the same reply.
    let b = journaled(&state);
    b.finish(&p, &fin("f"), chunks(&["Hello"])).await.unwrap();
    assert_eq!(
        p.ops(),
        vec![post(Slot::Draft, "Hel"), edit(100, "Hello")],
        "one visible message"
    );
}

#[tokio::test]
async fn after_a_restart_the_deltas_of_the_replayed_turn_edit_the_journaled_draft() {
    let state = std::sync::Arc::new(crate::MemoryState::default());
    let p = Fake::default();
    journaled(&state)
        .delta(&p, &delta("d1", "Hel"))
        .await
        .unwrap();
    let b = journaled(&state);
    b.delta(&p, &delta("e1", "Again")).await.unwrap();
    b.finish(&p, &fin("f"), chunks(&["Again!"])).await.unwrap();
    assert_eq!(
        p.ops(),
        vec![
            post(Slot::Draft, "Hel"),
            edit(100, "Again"),
            edit(100, "Again!")
        ]
    );
}

#[tokio::test]
async fn after_a_restart_journaled_chunks_are_skipped_and_a_delivered_final_sends_nothing() {
    let state = std::sync::Arc::new(crate::MemoryState::default());
    let p = Fake::default();
    journaled(&state)
        .finish(&p, &fin("f"), chunks(&["A"]))
        .await
        .unwrap();
    // The same final resent after a crash: already delivered, nothing posted.
    let r = journaled(&state)
        .finish(&p, &fin("f"), chunks(&["A"]))
        .await
        .unwrap();
    assert_eq!(r.0, "100");
    assert_eq!(p.ops(), vec![post(Slot::Chunk(0), "A")]);
    // Chunk B is delivered, C fails, the process dies: the resend posts only C.
    p.fail.lock().unwrap().push_back(None);
    p.fail_next(ChannelError::Transient("502".into()));
    journaled(&state)
        .finish(&p, &fin("g"), chunks(&["B", "C"]))
        .await
        .unwrap_err();
    let b = journaled(&state);
    b.finish(&p, &fin("g"), chunks(&["B", "C"])).await.unwrap();
    assert_eq!(
        p.ops(),
        vec![
            post(Slot::Chunk(0), "A"),
            post(Slot::Chunk(0), "B"),
            post(Slot::Chunk(1), "C")
        ]
    );
    // Settled: the entries are gone.
    b.settled(&fin("g"));
    b.settled(&fin("f"));
    use crate::StateStore;
    assert_eq!(state.get("sent:g"), None);
    assert_eq!(state.get("sent:f"), None);
}
