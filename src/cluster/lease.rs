//! Leases on a JetStream key-value bucket (history 1, max age = the TTL): acquire is `create`
//! (refused while another holds it), renew is `update` with the last revision, release is a
//! delete with the expected revision. A lease nobody renews disappears with its entry after
//! the TTL; [`crate::cluster::fence`] says how long its holder may still act.

use std::time::{Duration, Instant};

use async_nats::jetstream::kv;
use serde::{Deserialize, Serialize};

use super::fence::{Fence, Held};

/// What a lease entry holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseValue {
    /// The holder.
    pub node: String,
    /// When it was taken (Unix ms, the holder's clock).
    pub acquired_ms: u64,
    /// When it was last renewed (Unix ms, the holder's clock).
    pub renewed_ms: u64,
}

/// A lease as `weft cluster status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LeaseInfo {
    /// The key.
    pub key: String,
    /// The holder.
    pub holder: String,
    /// The entry's revision.
    pub revision: u64,
    /// Milliseconds until it lapses unless renewed (from the server's write time).
    pub expires_in_ms: u64,
    /// When it was taken (Unix ms).
    pub acquired_ms: u64,
}

/// A lease operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Another node took it, or it expired and the revision moved on.
    #[error("lease {0} lost (revision moved on)")]
    Lost(String),
    /// This holder's time is over: it may not act, nor renew.
    #[error("lease {0} lapsed on this node before it could be renewed")]
    Lapsed(String),
    /// NATS did not answer or refused.
    #[error("NATS: {0}")]
    Nats(String),
}

/// The leases of one bucket, taken by one node.
#[derive(Clone)]
pub struct Leases {
    kv: kv::Store,
    fence: Fence,
    node: String,
}

fn now_ms() -> u64 {
    clawft_channel_core::now_ms()
}

impl Leases {
    /// Leases in `kv` (made with max age = `fence.ttl()`) for node `node`.
    pub fn new(kv: kv::Store, fence: Fence, node: impl Into<String>) -> Self {
        Self {
            kv,
            fence,
            node: node.into(),
        }
    }

    /// The timing rules.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    fn value(&self, acquired_ms: u64) -> bytes::Bytes {
        let v = LeaseValue {
            node: self.node.clone(),
            acquired_ms,
            renewed_ms: now_ms(),
        };
        serde_json::to_vec(&v).unwrap_or_default().into()
    }

    /// Take `key` if nobody holds it: `Ok(None)` while another node does.
    ///
    /// # Errors
    /// NATS failed.
    pub async fn acquire(&self, key: &str) -> Result<Option<Held>, LeaseError> {
        let sent = Instant::now();
        let acquired_ms = now_ms();
        match self.kv.create(key, self.value(acquired_ms)).await {
            Ok(rev) => Ok(Some(Held {
                key: key.to_string(),
                token: rev,
                revision: rev,
                sent,
                acquired_ms,
            })),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(LeaseError::Nats(e.to_string())),
        }
    }

    /// Renew `held` with its last revision; on success its revision and send time move on.
    ///
    /// # Errors
    /// [`LeaseError::Lapsed`] when this node's time was already over (it must acquire again),
    /// [`LeaseError::Lost`] when the revision moved on, [`LeaseError::Nats`] otherwise.
    pub async fn renew(&self, held: &mut Held) -> Result<(), LeaseError> {
        let sent = Instant::now();
        if !self.fence.owns(held.sent, sent) {
            return Err(LeaseError::Lapsed(held.key.clone()));
        }
        match self
            .kv
            .update(&held.key, self.value(held.acquired_ms), held.revision)
            .await
        {
            Ok(rev) => {
                held.revision = rev;
                held.sent = sent;
                Ok(())
            }
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                Err(LeaseError::Lost(held.key.clone()))
            }
            Err(e) => Err(LeaseError::Nats(e.to_string())),
        }
    }

    /// Give `held` up (only if it is still at the revision this node wrote), so another node
    /// can take it at once.
    ///
    /// # Errors
    /// NATS failed, or the revision moved on.
    pub async fn release(&self, held: &Held) -> Result<(), LeaseError> {
        self.kv
            .delete_expect_revision(&held.key, Some(held.revision))
            .await
            .map_err(|e| LeaseError::Nats(e.to_string()))
    }

    /// The lease `key` as it stands, `None` when free.
    ///
    /// # Errors
    /// NATS failed.
    pub async fn info(&self, key: &str) -> Result<Option<LeaseInfo>, LeaseError> {
        let e = self
            .kv
            .entry(key)
            .await
            .map_err(|e| LeaseError::Nats(e.to_string()))?;
        Ok(e.filter(|e| e.operation == kv::Operation::Put)
            .and_then(|e| info_of(&e, self.fence.ttl())))
    }

    /// Every held lease whose key starts with `prefix`.
    ///
    /// # Errors
    /// NATS failed.
    pub async fn list(&self, prefix: &str) -> Result<Vec<LeaseInfo>, LeaseError> {
        use futures::StreamExt;
        let mut keys = self
            .kv
            .keys()
            .await
            .map_err(|e| LeaseError::Nats(e.to_string()))?;
        let mut out = Vec::new();
        while let Some(k) = keys.next().await {
            let k = k.map_err(|e| LeaseError::Nats(e.to_string()))?;
            if !k.starts_with(prefix) {
                continue;
            }
            if let Some(i) = self.info(&k).await? {
                out.push(i);
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }
}

/// A lease entry as [`LeaseInfo`]: it lapses `ttl` after the server wrote it.
pub fn info_of(e: &kv::Entry, ttl: Duration) -> Option<LeaseInfo> {
    let v: LeaseValue = serde_json::from_slice(&e.value).ok()?;
    let written_ms = u64::try_from(e.created.unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    Some(LeaseInfo {
        key: e.key.clone(),
        holder: v.node,
        revision: e.revision,
        expires_in_ms: (written_ms + ttl_ms).saturating_sub(now_ms()),
        acquired_ms: v.acquired_ms,
    })
}
