//! Usage counters shared by the nodes of the cluster, so that budgets count cluster-wide.
//!
//! Bucket [`USAGE_BUCKET`] (entries expire after [`USAGE_KEPT`]): `usage.<node>.<day>` → that
//! node's counters of that UTC day (a JSON array of usage rows, one per session, user and
//! model). Each node writes only its own keys, so writes never conflict: it keeps its day's
//! counters in memory, adds each turn's rows to them and replaces the day's entry in the
//! background (coalesced: the latest counters win). A budget check adds the other nodes'
//! entries of the month as last read; they are read again in the background when older than a
//! couple of seconds, so a check never waits on NATS.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// The other nodes' counters as last read.
#[derive(Default)]
struct Others {
    since: String,
    read_at: Option<Instant>,
    rows: Vec<UsageRow>,
    reading: bool,
}

/// How long the other nodes' counters are used before they are read again (in the
/// background: a budget check never waits on NATS).
pub const FRESH: Duration = Duration::from_secs(2);

/// The cluster's shared usage counters (cheap to clone).
#[derive(Clone)]
pub struct ClusterUsage {
    cluster: Cluster,
    bucket: Arc<tokio::sync::OnceCell<kv::Store>>,
    mine: Arc<Mutex<Mine>>,
    others: Arc<Mutex<Others>>,
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

fn key_of(r: &UsageRow) -> RowKey {
    (r.session.clone(), r.user.clone(), r.model.clone())
}

impl ClusterUsage {
    /// The shared usage of `cluster`; starts the publisher.
    pub fn new(cluster: Cluster) -> Self {
        let u = Self {
            cluster,
            bucket: Arc::new(tokio::sync::OnceCell::new()),
            mine: Arc::new(Mutex::new(Mine::default())),
            others: Arc::new(Mutex::new(Others::default())),
            wake: Arc::new(Notify::new()),
        };
        let p = u.clone();
        u.cluster.spawn(async move { p.publisher().await });
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
                    let b = open(&self.bucket, js).await?;
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
        {
            let mut m = self.mine.locked();
            m.day = day.to_string();
            m.rows.clear();
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

    /// Add `rows` to this node's counters of `day` (a new day starts from nothing) and publish
    /// them in the background: the cost is the turn's rows, not the day's.
    pub fn add(&self, day: &str, rows: &[UsageRow]) {
        {
            let mut m = self.mine.locked();
            if m.day != day {
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

    /// The other nodes' counters of `since` (`YYYY-MM-DD`) or later as last read, never
    /// waiting on NATS: read again in the background when older than [`FRESH`].
    ///
    /// # Errors
    /// Not read yet (the first read is under way), or the cluster is not healthy.
    pub fn others(&self, since: &str) -> Result<Vec<UsageRow>, String> {
        let mut o = self.others.locked();
        if o.since != since {
            *o = Others {
                since: since.to_string(),
                reading: o.reading,
                ..Others::default()
            };
        }
        let stale = o.read_at.is_none_or(|at| at.elapsed() >= FRESH);
        if stale && !o.reading {
            o.reading = true;
            let me = self.clone();
            let s = since.to_string();
            self.cluster.spawn(async move { me.refresh(s).await });
        }
        match o.read_at {
            Some(_) => Ok(o.rows.clone()),
            None => Err("the other nodes' usage is being read".into()),
        }
    }

    async fn refresh(self, since: String) {
        let read = match self.cluster.healthy_jetstream() {
            Ok(js) => tokio::time::timeout(WAIT, self.read_others(js, &since))
                .await
                .unwrap_or_else(|_| Err("NATS did not answer in time".into())),
            Err(e) => Err(e),
        };
        let mut o = self.others.locked();
        o.reading = false;
        match read {
            Ok(rows) if o.since == since => {
                o.rows = rows;
                o.read_at = Some(Instant::now());
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "cluster: the other nodes' usage not read"),
        }
    }

    async fn read_others(
        &self,
        js: async_nats::jetstream::Context,
        since: &str,
    ) -> Result<Vec<UsageRow>, String> {
        use futures::StreamExt;
        let mine = format!(
            "usage.{}.",
            super::key_part(&self.cluster.settings().node_id)
        );
        let b = open(&self.bucket, js).await?;
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
                    Err(e) => {
                        tracing::warn!(key = %k, error = %e, "cluster: usage counters undecodable; skipped")
                    }
                }
            }
        }
        Ok(out)
    }
}
