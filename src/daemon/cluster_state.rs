//! The state every node of a cluster shares, wired into the domain code (cluster mode): the
//! domain modules define what they need as traits; the cluster's key-value buckets provide it.

use std::sync::Arc;

use crate::approval::{ApprovalInfo, Decision, SharedApprovals};
use crate::cluster::access::ClusterAccess;
use crate::cluster::approvals::ClusterApprovals;
use crate::cluster::docs::{ClusterDocs, Written};
use crate::cluster::jobs::{Claimed, ClusterJobs, Known};
use crate::cluster::usage::ClusterUsage;
use crate::cluster::Cluster;
use crate::ingress::access::SharedAccess;
use crate::scheduler::shared::{SharedJobs, SharedState};
use crate::store::usage::UsageRow;
use crate::tools::shared_docs::{Put, SharedDocs};
use crate::turn::usage::SharedUsage;

impl SharedUsage for ClusterUsage {
    fn publish(&self, day: &str, rows: Vec<UsageRow>) {
        ClusterUsage::publish(self, day, &rows);
    }

    fn add(&self, day: &str, rows: &[UsageRow]) {
        ClusterUsage::add(self, day, rows);
    }

    fn others(&self, since: &str) -> Result<Vec<UsageRow>, String> {
        ClusterUsage::others(self, since)
    }
}

impl SharedAccess for ClusterAccess {
    fn pending(&self, code: &str, record: Option<&str>) {
        self.publish_pending(code, record);
    }

    fn approve(&self, code: &str, who: &str, value: &str) -> Result<(), String> {
        ClusterAccess::approve(self, code, who, value)
    }

    fn revoke(&self, who: &str) -> Result<(), String> {
        ClusterAccess::revoke(self, who)
    }
}

#[async_trait::async_trait]
impl SharedApprovals for ClusterApprovals {
    fn asked(&self, info: &ApprovalInfo) {
        if let Ok(record) = serde_json::to_string(info) {
            ClusterApprovals::asked(self, &info.id, &record);
        }
    }

    fn settled(&self, id: &str) {
        ClusterApprovals::settled(self, id);
    }

    fn others(&self) -> Result<Vec<ApprovalInfo>, String> {
        Ok(ClusterApprovals::others(self)?
            .into_iter()
            .filter_map(|(node, record)| {
                let mut a = serde_json::from_str::<ApprovalInfo>(&record).ok()?;
                a.node = Some(node);
                Some(a)
            })
            .collect())
    }

    fn forward(&self, id: &str, d: Decision) -> Result<Option<String>, String> {
        ClusterApprovals::forward(self, id, crate::approval::decision_str(d))
    }

    async fn always(&self, session: &str, command: &str) -> bool {
        ClusterApprovals::always(self, session, command).await
    }

    fn remember_always(&self, session: &str, command: &str) {
        ClusterApprovals::remember_always(self, session, command);
    }
}

/// The cluster's pairing records, for the admin commands.
pub fn shared_access(cluster: &Cluster) -> Arc<dyn SharedAccess> {
    Arc::new(ClusterAccess::new(cluster.clone()))
}

impl SharedJobs for ClusterJobs {
    fn publish(&self, id: &str, job: Option<&str>) -> Result<(), String> {
        ClusterJobs::publish(self, id, job)
    }

    fn all(&self) -> Result<Vec<String>, String> {
        self.jobs()
    }

    fn state(&self, id: &str) -> Result<SharedState, String> {
        Ok(match self.known(id)? {
            Known::Absent => SharedState::Absent,
            Known::Present => SharedState::Present,
            Known::Removed => SharedState::Removed,
        })
    }

    fn claim(&self, id: &str, run: &str) -> Result<Option<String>, String> {
        Ok(match ClusterJobs::claim(self, id, run)? {
            Claimed::Won => None,
            Claimed::Taken(node) => Some(node),
        })
    }

    fn add_run(&self, id: &str, record: &str, keep: usize) -> Result<(), String> {
        ClusterJobs::add_run(self, id, record, keep)
    }

    fn runs(&self, id: &str) -> Result<Vec<String>, String> {
        ClusterJobs::runs(self, id)
    }
}

impl SharedDocs for ClusterDocs {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u64)>, String> {
        ClusterDocs::get(self, key)
    }

    fn put(&self, key: &str, data: &[u8], expected: u64) -> Result<Put, String> {
        Ok(match ClusterDocs::put(self, key, data, expected)? {
            Written::Rev(r) => Put::Written(r),
            Written::Conflict => Put::Conflict,
        })
    }
}

/// Share the agent's memory documents and context files: the cluster's copy is authoritative,
/// the workspace keeps a local copy current. Once NATS answers, the local documents the
/// cluster lacks are uploaded (never over the cluster's), then the bucket is watched.
fn share_docs(daemon: &super::Daemon, cluster: &Cluster) {
    let ws = match super::open_workspace(daemon.config()) {
        Ok(ws) => ws,
        Err(e) => {
            tracing::warn!(error = %e, "memory documents not shared with the cluster");
            return;
        }
    };
    let docs = ClusterDocs::new(cluster.clone());
    crate::tools::shared_docs::install(Arc::new(docs.clone()), ws);
    let spawned = std::thread::Builder::new()
        .name("weft-docs-join".into())
        .spawn(move || {
            while !docs.healthy() {
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            let up = crate::tools::shared_docs::upload_missing();
            if !up.is_empty() {
                tracing::info!(files = ?up, "local memory documents uploaded to the cluster");
            }
            docs.watch(|key, data, rev| {
                if let Err(e) = crate::tools::shared_docs::apply(&key, data.as_deref(), rev) {
                    tracing::warn!(key = %key, error = %e, "shared document not written locally");
                }
            });
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "memory documents not shared with the cluster");
    }
}

/// Share this node's state with the cluster: call right after the daemon started, before its
/// timers first run (they start at the daemon's first await).
pub fn share(daemon: &super::Daemon, cluster: &Cluster) {
    daemon
        .scheduler()
        .jobs()
        .set_shared(Arc::new(ClusterJobs::new(cluster.clone())));
    daemon
        .usage()
        .set_shared(Arc::new(ClusterUsage::new(cluster.clone())));
    share_docs(daemon, cluster);
    let access = ClusterAccess::new(cluster.clone());
    access.mirror(
        daemon.store().clone(),
        crate::ingress::access::PENDING,
        crate::ingress::access::PAIRED,
    );
    daemon.shared_access().set(Arc::new(access));
    let approvals = ClusterApprovals::new(cluster.clone());
    let here = Arc::downgrade(daemon.approvals());
    approvals.watch_answers(Arc::new(move |id: &str, decision: &str| {
        here.upgrade()
            .is_some_and(|a| a.answer_from_cluster(id, decision))
    }));
    daemon.approvals().set_shared(Arc::new(approvals));
}
