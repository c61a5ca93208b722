//! Partition balancing (docs/cluster.md): every node computes the same assignment of the
//! session partitions to the live nodes of the registry (each gets at most
//! ceil(partitions / live nodes), a partition going to the node ranking highest for it by
//! rendezvous hashing among those with room left), and wants exactly its own share. A node
//! holding a partition it no longer wants hands it over (the partition loop stops taking new
//! messages, waits for its turns under way to be acknowledged, then releases the lease so the
//! new owner takes it at once). The registry is read on the cluster's own runtime, every third
//! of the lease TTL; the partition loops only watch the result.

use std::collections::BTreeSet;
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt;
use tokio::sync::{watch, Semaphore};
use tokio_util::sync::CancellationToken;

use super::node::{Cluster, NodeInfo};
use crate::store::shared::SharedError;

/// Partition consumers created at once by this node (JetStream answers the creation of an
/// R3 consumer only once the three servers agreed; dozens at once timed out at start).
pub static CONSUMER_CREATION: Semaphore = Semaphore::const_new(4);

/// The partitions this node wants (empty until the registry was read once).
pub type Wanted = watch::Receiver<BTreeSet<u32>>;

fn mix(mut h: u64) -> u64 {
    // splitmix64's finaliser: spreads FNV's low-entropy high bits.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The rendezvous score of node `node` for partition `p` (stable across builds and machines).
fn score(p: u32, node: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in p.to_le_bytes().iter().chain(node.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

/// The partitions of `me` among the `live` nodes: every node computes the same assignment
/// from the same registry. Each node gets at most ceil(partitions / nodes); the
/// (partition, node) pairs are taken by descending score, so a partition goes to the node
/// ranking it highest that still has room (the assignment moves little when a node comes or
/// goes).
pub fn assignment(me: &str, partitions: u32, live: &BTreeSet<String>) -> BTreeSet<u32> {
    let n = u32::try_from(live.len()).unwrap_or(u32::MAX);
    if n <= 1 {
        return (0..partitions).collect();
    }
    let target = partitions.div_ceil(n);
    let nodes: Vec<&str> = live.iter().map(String::as_str).collect();
    let mut pairs: Vec<(u64, u32, usize)> = (0..partitions)
        .flat_map(|p| {
            nodes
                .iter()
                .enumerate()
                .map(move |(i, node)| (score(p, node), p, i))
        })
        .collect();
    pairs.sort_unstable_by(|a, b| b.cmp(a));
    let mut owner: Vec<Option<usize>> = vec![None; partitions as usize];
    let mut count = vec![0u32; nodes.len()];
    for (_, p, i) in pairs {
        let slot = &mut owner[p as usize];
        if slot.is_none() && count[i] < target {
            *slot = Some(i);
            count[i] += 1;
        }
    }
    let Some(mine) = nodes.iter().position(|n| *n == me) else {
        return BTreeSet::new();
    };
    (0..partitions)
        .filter(|p| owner[*p as usize] == Some(mine))
        .collect()
}

/// The nodes whose heartbeat is younger than `fresh`, and this node.
async fn live_nodes(
    nodes: &kv::Store,
    me: &str,
    fresh: Duration,
) -> Result<BTreeSet<String>, SharedError> {
    let now = clawft_channel_core::now_ms();
    let fresh_ms = u64::try_from(fresh.as_millis()).unwrap_or(u64::MAX);
    let mut out = BTreeSet::from([me.to_string()]);
    let mut keys = nodes.keys().await.map_err(SharedError::unavailable)?;
    let mut found = Vec::new();
    while let Some(k) = keys.next().await {
        found.push(k.map_err(SharedError::unavailable)?);
    }
    for k in found {
        if let Some(v) = nodes.get(&k).await.map_err(SharedError::unavailable)? {
            if let Ok(n) = serde_json::from_slice::<NodeInfo>(&v) {
                if now.saturating_sub(n.seen_ms) < fresh_ms {
                    out.insert(n.node);
                }
            }
        }
    }
    Ok(out)
}

/// Start the balancer of `cluster` on its runtime (until `stop`): the partitions this node
/// wants, updated as nodes come and go.
pub fn start(cluster: &Cluster, stop: CancellationToken) -> Wanted {
    let (tx, rx) = watch::channel(BTreeSet::new());
    let c = cluster.clone();
    cluster.spawn(async move { run(c, tx, stop).await });
    rx
}

async fn run(cluster: Cluster, tx: watch::Sender<BTreeSet<u32>>, stop: CancellationToken) {
    let s = cluster.settings().clone();
    let every = cluster
        .fence()
        .renew_every()
        .max(Duration::from_millis(200));
    // A node silent for a whole lease TTL has lost its leases: its share goes to the others.
    let fresh = s.lease_ttl;
    let mut bucket: Option<kv::Store> = None;
    let mut last_live = BTreeSet::new();
    loop {
        let read = async {
            let js = cluster
                .jetstream()
                .ok_or_else(|| SharedError::unavailable("the cluster is not connected yet"))?;
            if bucket.is_none() {
                bucket = Some(
                    js.get_key_value(super::node::NODE_BUCKET)
                        .await
                        .map_err(SharedError::unavailable)?,
                );
            }
            match &bucket {
                Some(b) => live_nodes(b, &s.node_id, fresh).await,
                None => Err(SharedError::unavailable("no registry")),
            }
        };
        match tokio::time::timeout(every.max(Duration::from_secs(1)), read).await {
            Ok(Ok(live)) => {
                let mine = assignment(&s.node_id, s.partitions, &live);
                if live != last_live {
                    tracing::info!(
                        nodes = live.len(),
                        partitions = mine.len(),
                        "cluster: live nodes changed: this node's share of the partitions"
                    );
                    last_live = live;
                }
                tx.send_if_modified(|w| {
                    if *w == mine {
                        false
                    } else {
                        *w = mine;
                        true
                    }
                });
            }
            // The share stays as it was while the registry cannot be read.
            Ok(Err(e)) => tracing::debug!(error = %e, "cluster: node registry not read"),
            Err(_) => tracing::debug!("cluster: node registry not read in time"),
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// Resolves when partition `p` is no longer wanted (never when the balancer is gone).
pub async fn unwanted(rx: &mut Wanted, p: u32) {
    loop {
        if !rx.borrow_and_update().contains(&p) {
            return;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Resolves when partition `p` is wanted; `false` when the balancer is gone.
pub async fn wanted(rx: &mut Wanted, p: u32) -> bool {
    loop {
        if rx.borrow_and_update().contains(&p) {
            return true;
        }
        if rx.changed().await.is_err() {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(n: usize) -> BTreeSet<String> {
        (1..=n).map(|i| format!("n{i}")).collect()
    }

    #[test]
    fn every_partition_has_one_owner_within_the_target() {
        for (parts, n) in [(8u32, 3u32), (8, 4), (64, 3), (64, 5), (1, 3), (3, 8)] {
            let nodes = live(n as usize);
            let mut seen = BTreeSet::new();
            let target = parts.div_ceil(n);
            for me in &nodes {
                let mine = assignment(me, parts, &nodes);
                assert!(mine.len() as u32 <= target, "{parts}/{n}: {mine:?}");
                for p in mine {
                    assert!(seen.insert(p), "{p} owned twice");
                }
            }
            assert_eq!(seen.len() as u32, parts, "{parts}/{n}");
        }
    }

    #[test]
    fn alone_a_node_wants_all_and_a_stranger_none() {
        assert_eq!(assignment("n1", 4, &live(1)).len(), 4);
        assert!(assignment("x", 4, &live(3)).is_empty());
    }

    #[test]
    fn a_joining_node_moves_few_partitions() {
        let before: Vec<_> = live(3)
            .iter()
            .map(|m| assignment(m, 64, &live(3)))
            .collect();
        let after: Vec<_> = live(4)
            .iter()
            .map(|m| assignment(m, 64, &live(4)))
            .collect();
        let kept: usize = (0..3)
            .map(|i| before[i].intersection(&after[i]).count())
            .sum();
        // 16 go to the new node; the others keep most of theirs.
        assert!(kept >= 40, "kept {kept}");
    }
}
