//! Usage counters shared by the nodes of the cluster, so that budgets count cluster-wide.
//!
//! Bucket [`USAGE_BUCKET`] (entries expire after [`USAGE_KEPT`]): `usage.<node>.<day>` → that
//! node's counters of that UTC day (a JSON array of usage rows, one per session, user and
//! model). Each node writes only its own keys, so writes never conflict: it keeps its day's
//! counters in memory, adds each turn's rows to them and replaces the day's entry in the
//! background (coalesced: the latest counters win). A budget check adds the other nodes'
//! entries of the month as a watch on the bucket last told them (within milliseconds of their
//! publication), so a check never waits on NATS.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::kv;
use tokio::sync::Notify;

use super::node::{Cluster, LazyBucket};
use crate::store::usage::UsageRow;
use crate::types::MutexExt;

/// The key-value bucket of the usage counters.
pub const USAGE_BUCKET: &str = "weft_usage";
/// How long a day's counters are kept (63 days: a whole month is always there).
pub const USAGE_KEPT: Duration = Duration::from_secs(63 * 24 * 3600);
/// How long a read waits for NATS.
pub const WAIT: Duration = Duration::from_secs(2);

/// A session's, user's and model's row of the day.
type RowKey = (String, String, String);

/// This node's counters of its current day, as published.
#[derive(Default)]
struct Mine {
    day: String,
    rows: HashMap<RowKey, UsageRow>,
    /// Changed since last published.
    dirty: bool,
}

/// The other nodes' counters, kept up to date by a watch on the bucket.
#[derive(Default)]
struct Others {
    /// Key (`usage.<node>.<day>`) → its rows.
    rows: HashMap<String, Vec<UsageRow>>,
    /// The watch was established once (the map holds what the bucket held then, and after).
    ready: bool,
}

/// The cluster's shared usage counters (cheap to clone).
#[derive(Clone)]
pub struct ClusterUsage {
    cluster: Cluster,
    bucket: LazyBucket,
    mine: Arc<Mutex<Mine>>,
    others: Arc<Mutex<Others>>,
    wake: Arc<Notify>,
}

fn key_of(r: &UsageRow) -> RowKey {
    (r.session.clone(), r.user.clone(), r.model.clone())
}

impl ClusterUsage {
    /// The shared usage of `cluster`; starts the publisher.
    pub fn new(cluster: Cluster) -> Self {
        let u = Self {
            cluster,
            bucket: LazyBucket::new(USAGE_BUCKET, USAGE_KEPT, "weft usage counters"),
            mine: Arc::new(Mutex::new(Mine::default())),
            others: Arc::new(Mutex::new(Others::default())),
            wake: Arc::new(Notify::new()),
        };
        let p = u.clone();
        u.cluster.spawn(async move { p.publisher().await });
        let w = u.clone();
        u.cluster.spawn(async move { w.watcher().await });
        u
    }

    /// The day's counters to publish, when they changed (serialised here, on the cluster's
    /// runtime, at most once per publication however many turns added to them).
    fn take_dirty(&self) -> Option<(String, Vec<u8>)> {
        let (day, rows) = {
            let mut m = self.mine.locked();
            if !m.dirty {
                return None;
            }
            m.dirty = false;
            (m.day.clone(), m.rows.values().cloned().collect::<Vec<_>>())
        };
        serde_json::to_vec(&rows).ok().map(|b| (day, b))
    }

    async fn publisher(self) {
        let me = super::key_part(&self.cluster.settings().node_id);
        loop {
            self.wake.notified().await;
            while let Some((day, body)) = self.take_dirty() {
                let key = format!("usage.{me}.{}", super::key_part(&day));
                let put = async {
                    let js = self
                        .cluster
                        .jetstream()
                        .ok_or("the cluster is not connected yet")?;
                    let b = self.bucket.open(&js).await?;
                    b.put(&key, body.into()).await.map_err(|e| e.to_string())
                };
                if let Err(e) = tokio::time::timeout(WAIT, put)
                    .await
                    .unwrap_or_else(|_| Err("NATS did not answer in time".into()))
                {
                    tracing::warn!(error = %e, "cluster: usage counters not published; retrying");
                    // Published again (with whatever came meanwhile) shortly.
                    {
                        let mut m = self.mine.locked();
                        if m.day == day {
                            m.dirty = true;
                        }
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// Publish this node's counters of `day`: all of them, replacing what was published (in
    /// the background).
    pub fn publish(&self, day: &str, rows: &[UsageRow]) {
        self.merge(day, rows, true);
    }

    /// Add `rows` to this node's counters of `day` (a new day starts from nothing) and publish
    /// them in the background: the cost is the turn's rows, not the day's.
    pub fn add(&self, day: &str, rows: &[UsageRow]) {
        self.merge(day, rows, false);
    }

    /// Add `rows` of `day` to this node's counters, which start from nothing when `replace`
    /// or when `day` is a new day, and wake the publisher.
    fn merge(&self, day: &str, rows: &[UsageRow], replace: bool) {
        {
            let mut m = self.mine.locked();
            if replace || m.day != day {
                m.day = day.to_string();
                m.rows.clear();
            }
            for r in rows.iter().filter(|r| r.day == day) {
                m.rows
                    .entry(key_of(r))
                    .and_modify(|x| x.add(r))
                    .or_insert_with(|| r.clone());
            }
            m.dirty = true;
        }
        self.wake.notify_one();
    }

    /// The other nodes' counters of `since` (`YYYY-MM-DD`) or later, as the watch on the
    /// bucket last told them: never waits on NATS (the last known counters while the
    /// cluster is away).
    ///
    /// # Errors
    /// The counters were never read yet (the cluster is not reachable, or the watch is being
    /// set up).
    pub fn others(&self, since: &str) -> Result<Vec<UsageRow>, String> {
        let o = self.others.locked();
        if !o.ready {
            return Err("the other nodes' usage is not read yet".into());
        }
        Ok(o.rows
            .iter()
            .filter(|(k, _)| *k.rsplit('.').next().unwrap_or_default() >= *since)
            .flat_map(|(_, rows)| rows.iter().cloned())
            .collect())
    }

    /// Keep [`Others`] up to date: every other node's key of the bucket, as it changes.
    async fn watcher(self) {
        use futures::StreamExt;
        let mine = format!(
            "usage.{}.",
            super::key_part(&self.cluster.settings().node_id)
        );
        loop {
            let Some(js) = self.cluster.jetstream_ready().await else {
                return;
            };
            let watch = async {
                let b = self.bucket.open(&js).await?;
                b.watch_with_history("usage.>")
                    .await
                    .map_err(|e| e.to_string())
            };
            match tokio::time::timeout(WAIT, watch).await {
                Ok(Ok(mut w)) => {
                    self.others.locked().ready = true;
                    while let Some(e) = w.next().await {
                        let e = match e {
                            Ok(e) => e,
                            Err(e) => {
                                tracing::debug!(error = %e, "cluster: usage watch failed");
                                break;
                            }
                        };
                        if e.key.starts_with(&mine) {
                            continue;
                        }
                        let mut o = self.others.locked();
                        if e.operation != kv::Operation::Put {
                            o.rows.remove(&e.key);
                            continue;
                        }
                        match serde_json::from_slice::<Vec<UsageRow>>(&e.value) {
                            Ok(rows) => {
                                o.rows.insert(e.key, rows);
                            }
                            Err(err) => {
                                tracing::warn!(key = %e.key, error = %err, "cluster: usage counters undecodable; skipped")
                            }
                        }
                    }
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "cluster: usage watch not set up"),
                Err(_) => tracing::debug!("cluster: usage watch not set up in time"),
            }
            // Watched again shortly (the last counters stay in use meanwhile).
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
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
