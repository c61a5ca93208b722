//! Usage counters shared by the nodes of the cluster, so that budgets count cluster-wide.
//!
//! Bucket [`USAGE_BUCKET`] (entries expire after [`USAGE_KEPT`]): `usage.<node>.<day>` → that
//! node's counters of that UTC day (a JSON array of usage rows, one per session, user and
//! model). Each node writes only its own keys, so writes never conflict: it replaces the day's
//! entry after each turn (in the background, the latest counters winning). A budget check adds
//! the other nodes' entries of the month, read again at most every couple of seconds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::kv;
use tokio::sync::Notify;

use super::node::Cluster;
use crate::store::usage::UsageRow;
use crate::types::MutexExt;

/// The key-value bucket of the usage counters.
pub const USAGE_BUCKET: &str = "weft_usage";
/// How long a day's counters are kept (63 days: a whole month is always there).
pub const USAGE_KEPT: Duration = Duration::from_secs(63 * 24 * 3600);
/// How long a read waits for NATS.
pub const WAIT: Duration = Duration::from_secs(2);

/// Counters waiting to be published: (day, rows as JSON).
type Pending = (String, Vec<u8>);

/// The cluster's shared usage counters (cheap to clone).
#[derive(Clone)]
pub struct ClusterUsage {
    cluster: Cluster,
    bucket: Arc<tokio::sync::OnceCell<kv::Store>>,
    /// The latest counters to publish: (day, rows as JSON).
    pending: Arc<Mutex<Option<Pending>>>,
    wake: Arc<Notify>,
}

async fn open(
    cell: &tokio::sync::OnceCell<kv::Store>,
    js: async_nats::jetstream::Context,
) -> Result<kv::Store, String> {
    cell.get_or_try_init(|| async {
        super::node::bucket(&js, USAGE_BUCKET, USAGE_KEPT, "weft usage counters").await
    })
    .await
    .cloned()
    .map_err(|e| e.to_string())
}

impl ClusterUsage {
    /// The shared usage of `cluster`; starts the publisher.
    pub fn new(cluster: Cluster) -> Self {
        let u = Self {
            cluster,
            bucket: Arc::new(tokio::sync::OnceCell::new()),
            pending: Arc::new(Mutex::new(None)),
            wake: Arc::new(Notify::new()),
        };
        let p = u.clone();
        u.cluster.spawn(async move { p.publisher().await });
        u
    }

    async fn publisher(self) {
        let me = super::key_part(&self.cluster.settings().node_id);
        loop {
            self.wake.notified().await;
            loop {
                let next = self.pending.locked().take();
                let Some((day, body)) = next else {
                    break;
                };
                let key = format!("usage.{me}.{}", super::key_part(&day));
                let put = async {
                    let js = self
                        .cluster
                        .jetstream()
                        .ok_or("the cluster is not connected yet")?;
                    let b = open(&self.bucket, js).await?;
                    b.put(&key, body.clone().into())
                        .await
                        .map_err(|e| e.to_string())
                };
                if let Err(e) = tokio::time::timeout(WAIT, put)
                    .await
                    .unwrap_or_else(|_| Err("NATS did not answer in time".into()))
                {
                    tracing::warn!(error = %e, "cluster: usage counters not published; retrying");
                    // Keep them unless newer ones came meanwhile, and try again shortly.
                    {
                        let mut p = self.pending.locked();
                        if p.is_none() {
                            *p = Some((day, body));
                        }
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// Publish this node's counters of `day` (in the background; the latest win).
    pub fn publish(&self, day: &str, rows: &[UsageRow]) {
        let Ok(body) = serde_json::to_vec(rows) else {
            return;
        };
        *self.pending.locked() = Some((day.to_string(), body));
        self.wake.notify_one();
    }

    /// The other nodes' counters of `since` (`YYYY-MM-DD`) or later.
    ///
    /// # Errors
    /// NATS failed or did not answer, or the cluster is not healthy.
    pub fn others(&self, since: &str) -> Result<Vec<UsageRow>, String> {
        let js = self.cluster.healthy_jetstream()?;
        let cell = self.bucket.clone();
        let mine = format!(
            "usage.{}.",
            super::key_part(&self.cluster.settings().node_id)
        );
        let since = since.to_string();
        self.cluster
            .block_on(
                async move {
                    use futures::StreamExt;
                    let b = open(&cell, js).await?;
                    let mut keys = b.keys().await.map_err(|e| e.to_string())?;
                    let mut wanted = Vec::new();
                    while let Some(k) = keys.next().await {
                        let k = k.map_err(|e| e.to_string())?;
                        let day = k.rsplit('.').next().unwrap_or_default();
                        if k.starts_with("usage.") && !k.starts_with(&mine) && *day >= *since {
                            wanted.push(k);
                        }
                    }
                    let mut out = Vec::new();
                    for k in wanted {
                        if let Some(v) = b.get(&k).await.map_err(|e| e.to_string())? {
                            match serde_json::from_slice::<Vec<UsageRow>>(&v) {
                                Ok(rows) => out.extend(rows),
                                Err(e) => tracing::warn!(key = %k, error = %e, "cluster: usage counters undecodable; skipped"),
                            }
                        }
                    }
                    Ok(out)
                },
                WAIT,
            )
            .ok_or_else(|| "NATS did not answer in time".to_string())?
    }
}

/// Every node's counters of `since` (`YYYY-MM-DD`) or later, by node id (`weft usage` in
/// cluster mode).
///
/// # Errors
/// NATS failed or did not answer, or the cluster is not healthy.
pub async fn by_node(
    cluster: &Cluster,
    since: &str,
) -> Result<std::collections::BTreeMap<String, Vec<UsageRow>>, String> {
    let js = cluster.healthy_jetstream()?;
    let since = since.to_string();
    let read = async move {
        use futures::StreamExt;
        let b = super::node::bucket(&js, USAGE_BUCKET, USAGE_KEPT, "weft usage counters")
            .await
            .map_err(|e| e.to_string())?;
        let mut keys = b.keys().await.map_err(|e| e.to_string())?;
        let mut wanted = Vec::new();
        while let Some(k) = keys.next().await {
            let k = k.map_err(|e| e.to_string())?;
            let Some((node, day)) = k
                .strip_prefix("usage.")
                .and_then(|rest| rest.rsplit_once('.'))
            else {
                continue;
            };
            let Some(node) = super::access::unkey_part(node) else {
                continue;
            };
            if *day >= *since {
                wanted.push((node, k.clone()));
            }
        }
        let mut out = std::collections::BTreeMap::<String, Vec<UsageRow>>::new();
        for (node, k) in wanted {
            if let Some(v) = b.get(&k).await.map_err(|e| e.to_string())? {
                match serde_json::from_slice::<Vec<UsageRow>>(&v) {
                    Ok(rows) => out.entry(node).or_default().extend(rows),
                    Err(e) => {
                        tracing::warn!(key = %k, error = %e, "cluster: usage counters undecodable; skipped");
                    }
                }
            }
        }
        Ok(out)
    };
    cluster
        .run_here(async move { tokio::time::timeout(WAIT, read).await })
        .await
        .ok_or_else(|| "the cluster's thread stopped".to_string())?
        .map_err(|_| "NATS did not answer in time".to_string())?
}
