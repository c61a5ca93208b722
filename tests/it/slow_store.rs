//! A slow disk never holds a session: a chat command's reply waits for its flush, its session
//! does not. The store's flush is held shut by a gate the test opens (no timing involved).

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use clawft::config::Config;
use clawft::daemon::{build_model, Daemon};
use clawft::store::kv::{Kv, MemKv, Op, Pairs};
use clawft::store::{Store, StoreError};
use clawft_channel_core::testing::FakeChannel;
use clawft_channel_core::{
    now_ms, Ack, Channel, ChannelId, ChatId, InboundEvent, PlatformEventId, UserId,
};
use serde_json::json;
use tokio::sync::mpsc;

use crate::common::{config_value, test_env};
use crate::fake_llm::FakeLlm;

const T: Duration = Duration::from_secs(20);

/// An in-memory store whose flushes, once armed, pass `n` more times and then wait for
/// [`GatedKv::open`], telling the test when one starts waiting.
struct GatedKv {
    inner: MemKv,
    /// `None`: not armed; `Some(n)`: n more flushes pass, then they wait.
    passes: Mutex<Option<usize>>,
    open: (Mutex<bool>, Condvar),
    waiting: mpsc::UnboundedSender<()>,
}

impl GatedKv {
    fn new() -> (Arc<Self>, mpsc::UnboundedReceiver<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let kv = Self {
            inner: MemKv::default(),
            passes: Mutex::new(None),
            open: (Mutex::new(false), Condvar::new()),
            waiting: tx,
        };
        (Arc::new(kv), rx)
    }

    fn arm(&self, passes: usize) {
        *self.passes.lock().unwrap() = Some(passes);
    }

    fn open(&self) {
        *self.open.0.lock().unwrap() = true;
        self.open.1.notify_all();
    }
}

impl Kv for GatedKv {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(key)
    }
    fn scan_prefix(&self, prefix: &[u8]) -> Result<Pairs, StoreError> {
        self.inner.scan_prefix(prefix)
    }
    fn apply(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        self.inner.apply(ops)
    }
    fn flush(&self) -> Result<(), StoreError> {
        let wait = {
            let mut p = self.passes.lock().unwrap();
            match *p {
                Some(0) => true,
                Some(n) => {
                    *p = Some(n - 1);
                    false
                }
                None => false,
            }
        };
        if wait {
            let _ = self.waiting.send(());
            let mut open = self.open.0.lock().unwrap();
            while !*open {
                open = self.open.1.wait(open).unwrap();
            }
        }
        self.inner.flush()
    }
    fn next_id(&self) -> Result<u64, StoreError> {
        self.inner.next_id()
    }
    fn size_on_disk(&self) -> u64 {
        0
    }
}

/// Opens the gate when dropped, so a failed assertion never leaves the flusher thread stuck.
struct OpenOnDrop(Arc<GatedKv>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

fn event(chat: &str, id: &str, text: &str) -> InboundEvent {
    InboundEvent {
        channel: ChannelId::new("telegram"),
        chat: ChatId::new(chat),
        thread: None,
        sender: UserId::new("42"),
        sender_name: None,
        event_id: PlatformEventId::new(id),
        content: text.into(),
        received_at_ms: now_ms(),
        attachments: Vec::new(),
        origin: clawft_channel_core::Origin::User,
    }
}

async fn start(
    llm: &FakeLlm,
    dir: &std::path::Path,
    kv: Arc<GatedKv>,
    fake: &FakeChannel,
) -> Daemon {
    clawft::install_crypto_provider();
    let v = config_value(
        &llm.base_url(),
        dir,
        json!({
            "channels": {
                "http": {"enabled": false},
                "telegram": {"token": "123456:AAtest-token", "allow_from": [42]},
            },
        }),
    );
    let config = Config::from_str(&v.to_string(), false, &test_env(dir)).unwrap();
    let model = build_model(&config).unwrap();
    let channels: Vec<Arc<dyn Channel>> = vec![Arc::new(fake.clone())];
    Daemon::start(&config, Store::with_kv(kv), model, channels)
        .await
        .unwrap()
}

/// `/status` is journaled (that flush passes), then its answer waits for a flush that the disk
/// holds. Meanwhile the session answers a status query at once (it did not wait for the disk in
/// its handler), and the reply is not sent before its flush; once the disk lets it through, it
/// is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_waits_for_its_flush_in_a_task_not_in_its_session() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let fake = FakeChannel::new("telegram");
    let (kv, mut waiting) = GatedKv::new();
    let daemon = start(&llm, dir.path(), kv.clone(), &fake).await;
    let gate = OpenOnDrop(kv.clone());

    // The journal's flush passes; the next one (the answer's) waits at the gate.
    kv.arm(1);
    assert_eq!(
        fake.inject(event("chat-a", "a1", "/status")).await,
        Some(Ack::Accepted)
    );
    tokio::time::timeout(T, waiting.recv())
        .await
        .expect("the answer's flush reaches the disk")
        .unwrap();

    // The session is free while its answer's flush is pending.
    let live = tokio::time::timeout(T, daemon.live_sessions())
        .await
        .unwrap();
    assert!(
        live.iter()
            .any(|s| s.key == "telegram:chat-a" && !s.running && s.queued == 0),
        "the session did not answer while its reply waited for the disk: {live:?}"
    );
    // Durable before sent: nothing went out yet.
    assert!(
        fake.sent().is_empty(),
        "sent before durable: {:?}",
        fake.sent()
    );

    drop(gate);
    let sent = fake.wait_sent(1, T).await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(
        sent[0].text().starts_with("session telegram:chat-a"),
        "{}",
        sent[0].text()
    );
    daemon.shutdown().await;
}
