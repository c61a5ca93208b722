//! Memory documents and context files shared by the nodes: the key-value bucket
//! [`DOCS_BUCKET`] (no expiry, one revision kept) is authoritative for them; every node keeps
//! its workspace copy current by watching the bucket.
//!
//! The methods wait for NATS from synchronous code (never call them on the cluster's thread),
//! at most [`WAIT`], and fail at once while the cluster is unhealthy.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;

use super::node::{Cluster, LazyBucket};

/// The key-value bucket of the shared documents (`ws.<path>`, `user.<name>.<path>`).
pub const DOCS_BUCKET: &str = "weft_docs";
/// How long one call waits for NATS.
pub const WAIT: Duration = Duration::from_secs(3);

/// What a conditional write found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// Written; the new revision.
    Rev(u64),
    /// Another revision is there (or the key exists, for a create).
    Conflict,
}

/// The cluster's shared documents (cheap to clone).
#[derive(Clone)]
pub struct ClusterDocs {
    cluster: Cluster,
    bucket: LazyBucket,
}

/// Whether a failed write lost a race with another writer: JetStream refused it for its
/// expected last sequence (the create of a key written meanwhile reports it as another kind).
fn lost_race(e: &str) -> bool {
    e.contains("wrong last sequence")
}

impl ClusterDocs {
    /// The shared documents of `cluster`.
    pub fn new(cluster: Cluster) -> Self {
        Self {
            cluster,
            bucket: LazyBucket::new(
                DOCS_BUCKET,
                Duration::ZERO,
                "weft memory documents and context files",
            ),
        }
    }

    /// Whether the cluster answers now.
    pub fn healthy(&self) -> bool {
        self.cluster.healthy_jetstream().is_ok()
    }

    /// The document `key`: its bytes and revision, `None` when absent or deleted.
    ///
    /// # Errors
    /// NATS failed or did not answer.
    pub fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u64)>, String> {
        let js = self.cluster.healthy_jetstream()?;
        let cell = self.bucket.clone();
        let key = key.to_string();
        self.cluster
            .block_on(
                async move {
                    let b = cell.open(&js).await?;
                    Ok(match b.entry(&key).await.map_err(|e| e.to_string())? {
                        Some(e) if e.operation == kv::Operation::Put => {
                            Some((e.value.to_vec(), e.revision))
                        }
                        _ => None,
                    })
                },
                WAIT,
            )
            .ok_or_else(|| "NATS did not answer in time".to_string())?
    }

    /// Write `data` to `key` if its revision is still `expected` (`0`: absent).
    ///
    /// # Errors
    /// NATS failed or did not answer.
    pub fn put(&self, key: &str, data: &[u8], expected: u64) -> Result<Written, String> {
        let js = self.cluster.healthy_jetstream()?;
        let cell = self.bucket.clone();
        let key = key.to_string();
        let data = bytes::Bytes::copy_from_slice(data);
        self.cluster
            .block_on(
                async move {
                    let b = cell.open(&js).await?;
                    if expected == 0 {
                        return match b.create(&key, data).await {
                            Ok(rev) => Ok(Written::Rev(rev)),
                            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                                Ok(Written::Conflict)
                            }
                            Err(e) if lost_race(&e.to_string()) => Ok(Written::Conflict),
                            Err(e) => Err(e.to_string()),
                        };
                    }
                    match b.update(&key, data, expected).await {
                        Ok(rev) => Ok(Written::Rev(rev)),
                        Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                            Ok(Written::Conflict)
                        }
                        Err(e) if lost_race(&e.to_string()) => Ok(Written::Conflict),
                        Err(e) => Err(e.to_string()),
                    }
                },
                WAIT,
            )
            .ok_or_else(|| "NATS did not answer in time".to_string())?
    }

    /// Watch every document (the current ones first, then each change) and hand each to
    /// `apply(key, bytes or None when deleted, revision)`, run off the cluster's thread; the
    /// watch is made again after NATS comes back, until the cluster stops.
    pub fn watch<F>(&self, apply: F)
    where
        F: Fn(String, Option<Vec<u8>>, u64) + Send + Sync + 'static,
    {
        let me = self.clone();
        let apply = Arc::new(apply);
        self.cluster.spawn(async move {
            use futures::StreamExt;
            loop {
                let Some(js) = me.cluster.jetstream() else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                let watch = match me.bucket.open(&js).await {
                    Ok(b) => b.watch_with_history(">").await.map_err(|e| e.to_string()),
                    Err(e) => Err(e),
                };
                let mut watch = match watch {
                    Ok(w) => w,
                    Err(e) => {
                        tracing::debug!(error = %e, "shared documents: watch not made yet");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                while let Some(entry) = watch.next().await {
                    let Ok(e) = entry else {
                        break;
                    };
                    let data = (e.operation == kv::Operation::Put).then(|| e.value.to_vec());
                    let f = apply.clone();
                    let _ = tokio::task::spawn_blocking(move || f(e.key, data, e.revision)).await;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }
}
