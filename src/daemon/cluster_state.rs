//! The state every node of a cluster shares, wired into the domain code (cluster mode): the
//! domain modules define what they need as traits; the cluster's key-value buckets provide it.

use std::sync::Arc;

use crate::cluster::jobs::{Claimed, ClusterJobs, Known};
use crate::cluster::usage::ClusterUsage;
use crate::cluster::Cluster;
use crate::scheduler::shared::{SharedJobs, SharedState};
use crate::store::usage::UsageRow;
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
}
