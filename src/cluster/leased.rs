//! A channel whose long-lived connection (Telegram polling, the Discord gateway, the Slack
//! socket, Matrix sync, IMAP, Signal's event stream) runs only on the node holding its lease
//! `conn.<platform>.<account>`: started when this node takes the lease, stopped when it is
//! lost (at the fencing deadline on this node's clock, before another node can take it),
//! started again elsewhere when it lapses. Sending, typing and downloads go straight to the
//! adapter on every node.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use clawft_channel_core::{
    media, Capabilities, Channel, ChannelError, ChannelId, ChatId, InboundDelivery,
    OutboundMessage, SentRef, ThreadId,
};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::node::{Cluster, Holding};
use super::state::ClusterState;
use crate::store::shared::key_part;
use crate::types::MutexExt;

/// The lease key of the connection of channel `id` (`telegram`, `telegram.NAME`):
/// `conn.<platform>.<account>` (`default` for the channel's own account).
pub fn connection_lease_key(id: &str) -> String {
    let (platform, account) = id.split_once('.').unwrap_or((id, "default"));
    format!("conn.{}.{}", key_part(platform), key_part(account))
}

/// A channel behind a connection lease.
pub struct LeasedChannel {
    inner: Arc<dyn Channel>,
    cluster: Cluster,
    key: String,
    state: Option<Arc<ClusterState>>,
    status: Mutex<String>,
}

impl LeasedChannel {
    /// `inner` (built with `state` as its state store, when it has resume keys) behind the
    /// lease of channel `id`.
    pub fn new(
        inner: Arc<dyn Channel>,
        cluster: Cluster,
        id: &str,
        state: Option<Arc<ClusterState>>,
    ) -> Self {
        Self {
            inner,
            cluster,
            key: connection_lease_key(id),
            state,
            status: Mutex::new("standby: waiting for the cluster".into()),
        }
    }

    fn set_status(&self, s: impl Into<String>) {
        *self.status.locked() = s.into();
    }
}

/// Wait until the lease is this node's (and valid): its holding.
pub(super) async fn held(rx: &mut watch::Receiver<Option<Holding>>) -> Option<Holding> {
    loop {
        if let Some(h) = (*rx.borrow_and_update()).filter(Holding::valid) {
            return Some(h);
        }
        rx.changed().await.ok()?;
    }
}

/// Resolves when the lease is no longer this node's: lost, or its time on this node's clock
/// is over without a renewal.
pub(super) async fn lost(rx: &mut watch::Receiver<Option<Holding>>, token: u64) {
    loop {
        let now = *rx.borrow_and_update();
        let Some(h) = now.filter(|h| h.token == token && h.valid()) else {
            return;
        };
        let until = tokio::time::Instant::from_std(h.until);
        tokio::select! {
            r = rx.changed() => if r.is_err() { return },
            () = tokio::time::sleep_until(until) => {}
        }
    }
}

#[async_trait]
impl Channel for LeasedChannel {
    fn id(&self) -> &ChannelId {
        self.inner.id()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn listen(
        &self,
        tx: mpsc::Sender<InboundDelivery>,
        cancel: CancellationToken,
    ) -> Result<(), ChannelError> {
        let hold = self.cluster.hold(&self.key);
        let mut rx = hold.watch();
        let result = loop {
            self.set_status(format!(
                "standby: another node holds {} (or the cluster is unreachable)",
                self.key
            ));
            let h = tokio::select! {
                h = held(&mut rx) => h,
                () = cancel.cancelled() => break Ok(()),
            };
            let Some(h) = h else {
                break Err(ChannelError::Transient("the cluster stopped".into()));
            };
            if let Some(st) = &self.state {
                if let Err(e) = st.load(h, hold.watch()).await {
                    tracing::warn!(lease = %self.key, error = %e, "cluster: cannot read the channel's resume state; trying again");
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(500)) => continue,
                        () = cancel.cancelled() => break Ok(()),
                    }
                }
            }
            tracing::info!(channel = %self.inner.id(), lease = %self.key, token = h.token, "cluster: this node holds the connection");
            self.set_status(format!("holder of {}", self.key));
            let child = cancel.child_token();
            let fut = self.inner.listen(tx.clone(), child.clone());
            tokio::pin!(fut);
            let ended = tokio::select! {
                r = &mut fut => Some(r),
                () = lost(&mut rx, h.token) => None,
            };
            if let Some(st) = &self.state {
                st.unload();
            }
            match ended {
                Some(r) => break r,
                None => {
                    tracing::warn!(channel = %self.inner.id(), lease = %self.key, "cluster: connection lease lost: disconnecting");
                    child.cancel();
                    let _ = fut.await;
                    if cancel.is_cancelled() {
                        break Ok(());
                    }
                }
            }
        };
        hold.release().await;
        result
    }

    async fn send(&self, msg: &OutboundMessage) -> Result<SentRef, ChannelError> {
        self.inner.send(msg).await
    }

    async fn typing(&self, chat: &ChatId, thread: Option<&ThreadId>) -> Result<(), ChannelError> {
        self.inner.typing(chat, thread).await
    }

    async fn media_request(
        &self,
        m: &media::MediaRef,
    ) -> Result<media::MediaRequest, ChannelError> {
        self.inner.media_request(m).await
    }

    fn state(&self) -> String {
        let s = self.status.locked().clone();
        if s.starts_with("holder") {
            format!("{} ({s})", self.inner.state())
        } else {
            s
        }
    }

    fn settled(&self, msg: &OutboundMessage) {
        self.inner.settled(msg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_valid_and_distinct() {
        assert_eq!(connection_lease_key("telegram"), "conn.telegram.default");
        assert_eq!(connection_lease_key("telegram.bot2"), "conn.telegram.bot2");
    }
}
