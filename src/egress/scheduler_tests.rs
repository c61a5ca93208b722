#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use clawft_channel_core::{
    Channel, ChannelError, ChannelId, ChatId, InboundDelivery, OutboundKind, OutboundMessage,
    PlatformEventId, SentRef,
};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{outbox_worker, Work};
use crate::store::Store;

/// A platform that records what arrived, in order, and fails a chat's next sends on demand.
#[derive(Default)]
struct Recorder {
    id: Option<ChannelId>,
    arrived: Mutex<Vec<(String, String)>>,
    attempts: Mutex<Vec<String>>,
    fail: Mutex<HashMap<String, VecDeque<ChannelError>>>,
    settled: Mutex<Vec<String>>,
    latency: Duration,
}

impl Recorder {
    fn new(latency: Duration) -> Arc<Self> {
        Arc::new(Self {
            id: Some(ChannelId::new("rec")),
            latency,
            ..Self::default()
        })
    }
    fn fail(&self, chat: &str, e: ChannelError) {
        self.fail
            .lock()
            .unwrap()
            .entry(chat.into())
            .or_default()
            .push_back(e);
    }
    fn arrived(&self) -> Vec<(String, String)> {
        self.arrived.lock().unwrap().clone()
    }
    fn attempts_of(&self, chat: &str) -> usize {
        self.attempts
            .lock()
            .unwrap()
            .iter()
            .filter(|c| *c == chat)
            .count()
    }
}

#[async_trait]
impl Channel for Recorder {
    fn id(&self) -> &ChannelId {
        self.id.as_ref().unwrap()
    }
    async fn listen(
        &self,
        _tx: mpsc::Sender<InboundDelivery>,
        cancel: CancellationToken,
    ) -> Result<(), ChannelError> {
        cancel.cancelled().await;
        Ok(())
    }
    async fn send(&self, msg: &OutboundMessage) -> Result<SentRef, ChannelError> {
        let chat = msg.chat.to_string();
        self.attempts.lock().unwrap().push(chat.clone());
        tokio::time::sleep(self.latency).await;
        if let Some(e) = self
            .fail
            .lock()
            .unwrap()
            .get_mut(&chat)
            .and_then(VecDeque::pop_front)
        {
            return Err(e);
        }
        self.arrived
            .lock()
            .unwrap()
            .push((chat, msg.text().to_string()));
        Ok(SentRef::Nothing)
    }
    fn settled(&self, msg: &OutboundMessage) {
        self.settled.lock().unwrap().push(msg.id.clone());
    }
}

fn msg(chat: &str, kind: OutboundKind, text: &str) -> OutboundMessage {
    OutboundMessage {
        id: uuid::Uuid::now_v7().to_string(),
        channel: ChannelId::new("rec"),
        chat: ChatId::new(chat),
        thread: None,
        in_reply_to: Some(PlatformEventId::new(format!("in-{chat}"))),
        body: clawft_channel_core::OutboundBody::text_of(kind, text.into()),
        attachments: Vec::new(),
    }
}

struct Worker {
    tx: mpsc::UnboundedSender<Work>,
    stop: CancellationToken,
    store: Store,
}

impl Worker {
    fn start(ch: Arc<Recorder>, max: usize) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let store = Store::memory();
        tokio::spawn(outbox_worker(ch, store.clone(), rx, stop.clone(), max));
        Self { tx, stop, store }
    }
    /// Persist (durable kinds) and route, as the `Outbox` does.
    fn send(&self, m: OutboundMessage) {
        if m.kind().is_durable() {
            self.store.enqueue_outbound(&m).unwrap();
        }
        self.tx.send(Work::Send(Box::new(m))).unwrap();
    }
    async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Work::Flush(tx)).unwrap();
        tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .unwrap()
            .unwrap();
    }
}

async fn wait_for(mut f: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    f()
}

#[tokio::test]
async fn a_429_for_one_chat_does_not_hold_another_chats_reply() {
    let ch = Recorder::new(Duration::ZERO);
    ch.fail(
        "A",
        ChannelError::RateLimited {
            retry_after: Some(Duration::from_secs(12)),
        },
    );
    let w = Worker::start(ch.clone(), 8);
    w.send(msg("A", OutboundKind::Final, "a1"));
    w.send(msg("A", OutboundKind::Final, "a2"));
    assert!(wait_for(|| ch.attempts_of("A") == 1).await);
    let started = std::time::Instant::now();
    w.send(msg("B", OutboundKind::Final, "b1"));
    // B is delivered at once (a generous bound, far below A's 12 s pause).
    assert!(wait_for(|| ch.arrived().iter().any(|(c, _)| c == "B")).await);
    assert!(started.elapsed() < Duration::from_secs(5));
    // A waits as Telegram asked: nothing of it arrived, its second reply not tried out of order.
    assert_eq!(ch.attempts_of("A"), 1);
    assert_eq!(ch.arrived(), vec![("B".to_string(), "b1".to_string())]);
    // Both of A's replies are still in the outbox; B's is gone from it.
    let left: Vec<_> = w
        .store
        .pending_outbound()
        .unwrap()
        .into_iter()
        .map(|m| m.text().to_string())
        .collect();
    assert_eq!(left, ["a1", "a2"]);
    w.stop.cancel();
}

#[tokio::test]
async fn a_flooding_chat_does_not_delay_another_chat() {
    let ch = Recorder::new(Duration::from_millis(1));
    let w = Worker::start(ch.clone(), 2);
    for i in 0..1000 {
        w.send(msg("A", OutboundKind::Final, &format!("a{i}")));
    }
    w.send(msg("B", OutboundKind::Final, "b"));
    w.flush().await;
    let arrived = ch.arrived();
    assert_eq!(arrived.len(), 1001);
    let b_at = arrived.iter().position(|(c, _)| c == "B").unwrap();
    // Round-robin: B goes out among the first sends, not after A's queue drained.
    assert!(b_at <= 3, "B arrived at position {b_at} of 1001");
    // A's replies arrived in order.
    let a: Vec<_> = arrived
        .iter()
        .filter(|(c, _)| c == "A")
        .map(|(_, t)| t.clone())
        .collect();
    let want: Vec<_> = (0..1000).map(|i| format!("a{i}")).collect();
    assert_eq!(a, want);
    assert!(w.store.pending_outbound().unwrap().is_empty());
    assert_eq!(ch.settled.lock().unwrap().len(), 1001);
    w.stop.cancel();
}

#[tokio::test]
async fn a_global_rate_limit_pauses_every_chat_and_retries_in_order() {
    let ch = Recorder::new(Duration::ZERO);
    ch.fail(
        "A",
        ChannelError::RateLimitedGlobal {
            retry_after: Some(Duration::from_millis(600)),
        },
    );
    let w = Worker::start(ch.clone(), 8);
    let started = std::time::Instant::now();
    w.send(msg("A", OutboundKind::Final, "a1"));
    assert!(wait_for(|| ch.attempts_of("A") == 1).await);
    w.send(msg("B", OutboundKind::Final, "b1"));
    w.flush().await;
    assert!(started.elapsed() >= Duration::from_millis(550));
    assert_eq!(ch.arrived().len(), 2);
    assert_eq!(
        ch.attempts_of("B"),
        1,
        "B was tried during the global pause"
    );
    w.stop.cancel();
}

#[tokio::test]
async fn queued_deltas_of_one_reply_are_merged_and_order_is_kept() {
    let ch = Recorder::new(Duration::from_millis(50));
    let w = Worker::start(ch.clone(), 8);
    w.send(msg("A", OutboundKind::Final, "first"));
    for part in ["He", "llo", " wor", "ld"] {
        w.send(msg("A", OutboundKind::Delta, part));
    }
    w.send(msg("A", OutboundKind::Final, "Hello world"));
    w.flush().await;
    let arrived: Vec<_> = ch.arrived().into_iter().map(|(_, t)| t).collect();
    assert_eq!(arrived, ["first", "Hello world", "Hello world"]);
    w.stop.cancel();
}

#[tokio::test]
async fn a_transient_failure_is_retried_and_the_reply_delivered_once() {
    let ch = Recorder::new(Duration::ZERO);
    ch.fail("A", ChannelError::Transient("502".into()));
    let w = Worker::start(ch.clone(), 8);
    w.send(msg("A", OutboundKind::Final, "a1"));
    w.flush().await;
    assert_eq!(ch.arrived(), vec![("A".to_string(), "a1".to_string())]);
    assert_eq!(ch.attempts_of("A"), 2);
    assert!(w.store.pending_outbound().unwrap().is_empty());
    w.stop.cancel();
}
