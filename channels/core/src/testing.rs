//! A [`FakeChannel`] for tests: inject inbound events, read what was sent, make sends fail.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::lock::MutexExt;
use crate::{
    Ack, Capabilities, Channel, ChannelError, ChannelId, InboundDelivery, InboundEvent,
    OutboundMessage, SentRef,
};

#[derive(Default)]
struct Inner {
    sent: Vec<OutboundMessage>,
    fail_next: VecDeque<ChannelError>,
    listener: Option<mpsc::Sender<InboundDelivery>>,
}

/// An in-memory channel: [`FakeChannel::inject`] plays the platform, [`FakeChannel::sent`]
/// returns every message the daemon sent.
#[derive(Clone)]
pub struct FakeChannel {
    id: ChannelId,
    caps: Capabilities,
    inner: Arc<Mutex<Inner>>,
    changed: Arc<Notify>,
}

impl FakeChannel {
    /// A fake channel with the given id.
    pub fn new(id: &str) -> Self {
        Self {
            id: ChannelId::new(id),
            caps: Capabilities {
                streaming: false,
                progress: false,
                max_message_bytes: 4096,
                max_upload_bytes: 0,
            },
            inner: Arc::new(Mutex::new(Inner::default())),
            changed: Arc::new(Notify::new()),
        }
    }

    /// The same fake declaring `caps` (streaming, progress …).
    pub fn with_capabilities(mut self, caps: Capabilities) -> Self {
        self.caps = caps;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.locked()
    }

    /// Messages sent so far.
    pub fn sent(&self) -> Vec<OutboundMessage> {
        self.lock().sent.clone()
    }

    /// Make the next sends fail with these errors, in order.
    pub fn fail_next(&self, err: ChannelError) {
        self.lock().fail_next.push_back(err);
    }

    /// Deliver an event as the platform would, returning how ingress acknowledged it.
    /// Waits until the daemon is listening.
    pub async fn inject(&self, event: InboundEvent) -> Option<Ack> {
        let tx = loop {
            let notified = self.changed.notified();
            if let Some(tx) = self.lock().listener.clone() {
                break tx;
            }
            notified.await;
        };
        let (delivery, rx) = InboundDelivery::new(event);
        tx.send(delivery).await.ok()?;
        rx.await.ok()
    }

    /// Wait until at least `n` messages have been sent, or `timeout` passes.
    pub async fn wait_sent(&self, n: usize, timeout: std::time::Duration) -> Vec<OutboundMessage> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            let sent = self.sent();
            if sent.len() >= n {
                return sent;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.sent();
            }
        }
    }
}

#[async_trait]
impl Channel for FakeChannel {
    fn id(&self) -> &ChannelId {
        &self.id
    }

    fn capabilities(&self) -> Capabilities {
        self.caps.clone()
    }

    async fn listen(
        &self,
        tx: mpsc::Sender<InboundDelivery>,
        cancel: CancellationToken,
    ) -> Result<(), ChannelError> {
        self.lock().listener = Some(tx);
        self.changed.notify_waiters();
        cancel.cancelled().await;
        self.lock().listener = None;
        Ok(())
    }

    async fn send(&self, msg: &OutboundMessage) -> Result<SentRef, ChannelError> {
        let mut inner = self.lock();
        if let Some(err) = inner.fail_next.pop_front() {
            return Err(err);
        }
        inner.sent.push(msg.clone());
        let n = inner.sent.len();
        drop(inner);
        self.changed.notify_waiters();
        Ok(SentRef::message(format!("fake-{n}")))
    }
}
