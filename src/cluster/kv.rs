//! The cluster's key-value buckets as the gateway's shared-state seam
//! ([`crate::store::shared::Replicated`]): a bucket is made or opened on first use (replicated
//! on three servers when the cluster has them), every operation runs on the cluster's own
//! thread, bounded by its bucket's wait, and is refused at once while the cluster is
//! unhealthy. Failures are classified by the client's error kinds (a lost race, a message
//! over the server's limit), never by their text. It knows no piece of shared state: the
//! modules that own them give it their buckets.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{
    self, context::PublishError, context::PublishErrorKind, kv, ErrorCode,
};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::{mpsc, OnceCell};

use super::node::Cluster;
use crate::store::shared::{
    Bucket, Entry, Replicated, SharedError, SharedErrorKind, Versioned, Watched,
};
use crate::types::MutexExt;

/// How long a watch waits before it is made again after NATS went away.
const REWATCH_AFTER: Duration = Duration::from_secs(1);

/// A bucket, once made or opened.
type Opened = Arc<OnceCell<kv::Store>>;

/// The shared-state seam on the buckets of `cluster` (cheap to clone).
#[derive(Clone)]
pub struct ClusterKv {
    cluster: Cluster,
    /// Each bucket by name.
    buckets: Arc<Mutex<HashMap<&'static str, Opened>>>,
}

/// What a failed write ran into, from the error's kinds and the server's error codes down its
/// sources: a write that lost a race (JetStream refused it for its expected last sequence: the
/// client's kind, or the server's code where the client has no kind for it, as for 10164 of
/// newer servers), a message over the server's limit, or NATS not answering.
pub(super) fn classify(e: &(dyn std::error::Error + 'static)) -> SharedErrorKind {
    let mut cur = Some(e);
    while let Some(x) = cur {
        if let Some(j) = x.downcast_ref::<jetstream::Error>() {
            match j.error_code() {
                ErrorCode::STREAM_WRONG_LAST_SEQUENCE
                | ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT => {
                    return SharedErrorKind::Conflict
                }
                ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM => return SharedErrorKind::TooLarge,
                _ => {}
            }
        }
        if let Some(p) = x.downcast_ref::<PublishError>() {
            match p.kind() {
                PublishErrorKind::WrongLastSequence => return SharedErrorKind::Conflict,
                PublishErrorKind::MaxPayloadExceeded => return SharedErrorKind::TooLarge,
                PublishErrorKind::StreamNotFound
                | PublishErrorKind::WrongLastMessageId
                | PublishErrorKind::TimedOut
                | PublishErrorKind::BrokenPipe
                | PublishErrorKind::MaxAckPending
                | PublishErrorKind::Other => {}
            }
        }
        cur = x.source();
    }
    SharedErrorKind::Unavailable
}

fn failed(e: &(dyn std::error::Error + 'static)) -> SharedError {
    SharedError::new(classify(e), e)
}

impl ClusterKv {
    /// The buckets of `cluster`.
    pub fn new(cluster: Cluster) -> Self {
        Self {
            cluster,
            buckets: Arc::default(),
        }
    }

    fn cell(&self, bucket: Bucket) -> Opened {
        self.buckets
            .locked()
            .entry(bucket.name)
            .or_default()
            .clone()
    }

    /// Run `op` on `bucket` on the cluster's thread, within the bucket's wait.
    async fn run<T, F, Fut>(&self, bucket: Bucket, op: F) -> Result<T, SharedError>
    where
        T: Send + 'static,
        F: FnOnce(kv::Store) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, SharedError>> + Send,
    {
        let js = self.cluster.healthy_jetstream()?;
        let cell = self.cell(bucket);
        let run = async move {
            let store = open(&cell, &js, bucket).await?;
            op(store).await
        };
        self.cluster
            .run_here(async move { tokio::time::timeout(bucket.wait, run).await })
            .await
            .ok_or_else(|| SharedError::unavailable("the cluster stopped"))?
            .unwrap_or_else(|_| Err(SharedError::unavailable("NATS did not answer in time")))
    }
}

async fn open(
    cell: &OnceCell<kv::Store>,
    js: &jetstream::Context,
    bucket: Bucket,
) -> Result<kv::Store, SharedError> {
    cell.get_or_try_init(|| {
        super::node::bucket(js, bucket.name, bucket.max_age, bucket.description)
    })
    .await
    .cloned()
    .map_err(SharedError::from)
}

#[async_trait]
impl Replicated for ClusterKv {
    fn node(&self) -> &str {
        &self.cluster.settings().node_id
    }

    fn healthy(&self) -> bool {
        self.cluster.healthy_jetstream().is_ok()
    }

    async fn entry(&self, bucket: Bucket, key: String) -> Result<Entry<Bytes>, SharedError> {
        self.run(bucket, move |b| async move {
            Ok(match b.entry(&key).await.map_err(|e| failed(&e))? {
                None => Entry::Absent,
                Some(e) if e.operation == kv::Operation::Put => Entry::Present(Versioned {
                    value: e.value,
                    revision: e.revision,
                }),
                Some(e) => Entry::Removed(e.revision),
            })
        })
        .await
    }

    async fn put(&self, bucket: Bucket, key: String, value: Bytes) -> Result<u64, SharedError> {
        self.run(bucket, move |b| async move {
            b.put(&key, value).await.map_err(|e| failed(&e))
        })
        .await
    }

    async fn update(
        &self,
        bucket: Bucket,
        key: String,
        value: Bytes,
        revision: u64,
    ) -> Result<u64, SharedError> {
        self.run(bucket, move |b| async move {
            if revision == 0 {
                return b.create(&key, value).await.map_err(|e| match e.kind() {
                    // The key exists, or another writer created it meanwhile (a lost race
                    // JetStream reports down the error's sources: `failed`).
                    kv::CreateErrorKind::AlreadyExists => {
                        SharedError::new(SharedErrorKind::Conflict, format!("{key} exists"))
                    }
                    kv::CreateErrorKind::InvalidKey => {
                        SharedError::new(SharedErrorKind::Invalid, &e)
                    }
                    kv::CreateErrorKind::Publish
                    | kv::CreateErrorKind::Ack
                    | kv::CreateErrorKind::Other => failed(&e),
                });
            }
            b.update(&key, value, revision)
                .await
                .map_err(|e| match e.kind() {
                    kv::UpdateErrorKind::WrongLastRevision => SharedError::new(
                        SharedErrorKind::Conflict,
                        format!("{key} is no longer at revision {revision}"),
                    ),
                    kv::UpdateErrorKind::InvalidKey => {
                        SharedError::new(SharedErrorKind::Invalid, &e)
                    }
                    kv::UpdateErrorKind::TimedOut | kv::UpdateErrorKind::Other => failed(&e),
                })
        })
        .await
    }

    async fn delete(&self, bucket: Bucket, key: String) -> Result<(), SharedError> {
        self.run(bucket, move |b| async move {
            b.delete(&key).await.map_err(|e| failed(&e))
        })
        .await
    }

    async fn purge(&self, bucket: Bucket, key: String) -> Result<(), SharedError> {
        self.run(bucket, move |b| async move {
            b.purge(&key).await.map_err(|e| failed(&e))
        })
        .await
    }

    async fn keys(&self, bucket: Bucket, prefix: String) -> Result<Vec<String>, SharedError> {
        self.run(bucket, move |b| async move {
            let mut keys = b.keys().await.map_err(|e| failed(&e))?;
            let mut out = Vec::new();
            while let Some(k) = keys.next().await {
                let k = k.map_err(|e| failed(&e))?;
                if k.starts_with(&prefix) {
                    out.push(k);
                }
            }
            Ok(out)
        })
        .await
    }

    fn watch(&self, bucket: Bucket, prefix: String) -> mpsc::Receiver<Watched<String, Bytes>> {
        let (tx, rx) = mpsc::channel(256);
        let me = self.clone();
        let pattern = format!("{prefix}>");
        self.cluster.spawn(async move {
            loop {
                let js = tokio::select! {
                    js = me.cluster.jetstream_ready() => js,
                    () = tx.closed() => return,
                };
                let Some(js) = js else { return };
                let cell = me.cell(bucket);
                let made = async {
                    open(&cell, &js, bucket)
                        .await?
                        .watch_with_history(&pattern)
                        .await
                        .map_err(|e| failed(&e))
                };
                match tokio::time::timeout(bucket.wait, made).await {
                    Ok(Ok(mut w)) => {
                        if tx.send(Watched::Started).await.is_err() {
                            return;
                        }
                        loop {
                            let next = tokio::select! {
                                e = w.next() => e,
                                () = tx.closed() => return,
                            };
                            let e = match next {
                                Some(Ok(e)) => e,
                                Some(Err(e)) => {
                                    tracing::debug!(bucket = bucket.name, error = %e, "cluster: watch interrupted");
                                    break;
                                }
                                None => break,
                            };
                            let w = match e.operation {
                                kv::Operation::Put => Watched::Put {
                                    key: e.key,
                                    value: e.value,
                                    revision: e.revision,
                                },
                                kv::Operation::Delete | kv::Operation::Purge => Watched::Removed {
                                    key: e.key,
                                    revision: e.revision,
                                },
                            };
                            if tx.send(w).await.is_err() {
                                return;
                            }
                        }
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(bucket = bucket.name, error = %e, "cluster: watch not made yet");
                    }
                    Err(_) => {
                        tracing::debug!(bucket = bucket.name, "cluster: watch not made in time");
                    }
                }
                tokio::select! {
                    () = tokio::time::sleep(REWATCH_AFTER) => {}
                    () = tx.closed() => return,
                }
            }
        });
        rx
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn server_error(code: u64) -> jetstream::Error {
        serde_json::from_value(
            serde_json::json!({"code": 400, "err_code": code, "description": "wrong last sequence"}),
        )
        .unwrap()
    }

    /// A lost race is a conflict whichever way the client reports it: its own kind, or the
    /// server's code under a kind it has none for (10164 of newer servers, seen as "failed
    /// getting entry: publish failed: wrong last sequence" on a create of a deleted key).
    #[test]
    fn lost_races_and_oversized_messages_are_told_by_kind_and_code() {
        let ours = PublishError::new(PublishErrorKind::WrongLastSequence);
        assert_eq!(classify(&ours), SharedErrorKind::Conflict);
        for code in [10071, 10164] {
            let publish = PublishError::with_source(PublishErrorKind::Other, server_error(code));
            let update = kv::UpdateError::with_source(kv::UpdateErrorKind::Other, publish);
            let create = kv::CreateError::with_source(kv::CreateErrorKind::Other, update);
            assert_eq!(classify(&create), SharedErrorKind::Conflict, "{code}");
        }
        let big = PublishError::with_source(PublishErrorKind::Other, server_error(10054));
        assert_eq!(classify(&big), SharedErrorKind::TooLarge);
        let away = kv::PutError::with_source(
            kv::PutErrorKind::Ack,
            PublishError::new(PublishErrorKind::StreamNotFound),
        );
        assert_eq!(classify(&away), SharedErrorKind::Unavailable);
    }
}
