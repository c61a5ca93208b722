//! Usage counters shared by the gateways of a cluster, so that budgets count cluster-wide: a
//! piece of shared state ([`crate::store::shared`]) the usage ledger is given at construction
//! in cluster mode.
//!
//! Bucket [`USAGE_BUCKET`] (entries kept 63 days): `usage.<node>.<day>` → that node's counters
//! of that UTC day (its usage rows, one per session, user and model). Each node writes only
//! its own keys, so writes never conflict: it keeps its day's counters in memory, adds each
//! turn's rows to them and replaces the day's entry in the background (coalesced: the latest
//! counters win). A budget check adds the other nodes' entries of the month as a watch on the
//! bucket last delivered them, so a check never waits on NATS.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::store::shared::{
    Bucket, Payload, Replicated, Shared, SharedError, SharedErrorKind, Watched,
};
use crate::store::usage::UsageRow;
use crate::types::MutexExt;

/// The bucket of the usage counters: kept 63 days, so a whole month is always there.
pub const USAGE_BUCKET: Bucket = Bucket {
    name: "weft_usage",
    max_age: Duration::from_secs(63 * 24 * 3600),
    description: "weft usage counters",
    wait: Duration::from_secs(2),
};

/// How soon counters the cluster did not take are published again.
const REPUBLISH_AFTER: Duration = Duration::from_secs(1);

/// One node's counters of one day, as the bucket holds them.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct DayRows(pub Vec<UsageRow>);

impl Payload for DayRows {}

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
    /// (node, day) → its rows.
    rows: HashMap<(String, String), Vec<UsageRow>>,
    /// The watch was established once (the map holds what the bucket held then, and after).
    ready: bool,
}

/// The cluster's usage counters (cheap to clone).
#[derive(Clone)]
pub struct SharedUsage {
    rows: Shared<DayRows>,
    mine: Arc<Mutex<Mine>>,
    others: Arc<Mutex<Others>>,
    wake: Arc<Notify>,
}

fn key_of(r: &UsageRow) -> RowKey {
    (r.session.clone(), r.user.clone(), r.model.clone())
}

impl SharedUsage {
    /// The usage counters kept through `seam`; starts their publisher and the watch of the
    /// other nodes' on the current runtime.
    pub fn start(seam: Arc<dyn Replicated>) -> Self {
        let u = Self {
            rows: Shared::new(seam, USAGE_BUCKET, "usage"),
            mine: Arc::default(),
            others: Arc::default(),
            wake: Arc::new(Notify::new()),
        };
        tokio::spawn(u.clone().publisher());
        tokio::spawn(u.clone().watcher());
        u
    }

    /// The day's counters to publish, when they changed (copied at most once per publication
    /// however many turns added to them).
    fn take_dirty(&self) -> Option<(String, DayRows)> {
        let mut m = self.mine.locked();
        if !m.dirty {
            return None;
        }
        m.dirty = false;
        Some((m.day.clone(), DayRows(m.rows.values().cloned().collect())))
    }

    async fn publisher(self) {
        let me = self.rows.node().to_string();
        loop {
            self.wake.notified().await;
            while let Some((day, rows)) = self.take_dirty() {
                if let Err(e) = self.rows.put(&[&me, &day], &rows).await {
                    tracing::warn!(error = %e, "cluster: usage counters not published; retrying");
                    // Published again (with whatever came meanwhile) shortly.
                    {
                        let mut m = self.mine.locked();
                        if m.day == day {
                            m.dirty = true;
                        }
                    }
                    tokio::time::sleep(REPUBLISH_AFTER).await;
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
    /// [`crate::store::shared::SharedErrorKind::Unavailable`]: the counters were never read
    /// yet (the cluster is not reachable, or the watch is being set up).
    pub fn others(&self, since: &str) -> Result<Vec<UsageRow>, SharedError> {
        let o = self.others.locked();
        if !o.ready {
            return Err(SharedError::unavailable(
                "the other nodes' usage is not read yet",
            ));
        }
        Ok(o.rows
            .iter()
            .filter(|((_, day), _)| day.as_str() >= since)
            .flat_map(|(_, rows)| rows.iter().cloned())
            .collect())
    }

    /// Keep [`Others`] up to date: every other node's key of the bucket, as it changes.
    async fn watcher(self) {
        let me = self.rows.node().to_string();
        let mut watch = self.rows.watch();
        while let Some(w) = watch.next().await {
            let mut o = self.others.locked();
            match w {
                Watched::Started => o.ready = true,
                Watched::Put { key, value, .. } => {
                    if let [node, day] = key.as_slice() {
                        if *node != me {
                            o.rows.insert((node.clone(), day.clone()), value.0);
                        }
                    }
                }
                Watched::Removed { key, .. } => {
                    if let [node, day] = key.as_slice() {
                        o.rows.remove(&(node.clone(), day.clone()));
                    }
                }
            }
        }
    }
}

/// Every node's counters of `since` (`YYYY-MM-DD`) or later, by node id, read from the bucket
/// now (`weft usage` in cluster mode).
///
/// # Errors
/// The cluster failed or did not answer.
pub async fn by_node(
    seam: Arc<dyn Replicated>,
    since: &str,
) -> Result<BTreeMap<String, Vec<UsageRow>>, SharedError> {
    let rows: Shared<DayRows> = Shared::new(seam, USAGE_BUCKET, "usage");
    let mut out = BTreeMap::<String, Vec<UsageRow>>::new();
    for k in rows.keys().await? {
        let [node, day] = k.as_slice() else {
            continue;
        };
        if day.as_str() < since {
            continue;
        }
        match rows.get(&[node, day]).await {
            Ok(Some(v)) => out.entry(node.clone()).or_default().extend(v.value.0),
            Ok(None) => {}
            Err(e) if e.kind() == SharedErrorKind::Invalid => {
                tracing::warn!(node = %node, day = %day, error = %e, "cluster: usage counters undecodable; skipped");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}
