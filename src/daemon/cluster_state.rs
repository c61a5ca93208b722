//! The state every node of a cluster shares, wired into the domain code (cluster mode): the
//! domain modules define what they need as traits; the cluster's key-value buckets provide it.

use std::sync::Arc;

use crate::approval::{ApprovalInfo, Decision, SharedApprovals};
use crate::cluster::access::ClusterAccess;
use crate::cluster::approvals::ClusterApprovals;
use crate::cluster::jobs::{Claimed, ClusterJobs, Known};
use crate::cluster::usage::ClusterUsage;
use crate::cluster::Cluster;
use crate::ingress::access::SharedAccess;
use crate::scheduler::shared::{SharedJobs, SharedState};
use crate::store::usage::UsageRow;
use crate::turn::usage::SharedUsage;

impl SharedUsage for ClusterUsage {
    fn publish(&self, day: &str, rows: Vec<UsageRow>) {
        ClusterUsage::publish(self, day, &rows);
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
