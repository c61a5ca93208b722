//! The state this node shares with the cluster, built once from the cluster handle before the
//! daemon builds the pieces that use it, and given to them at construction: the seam of
//! shared state ([`crate::store::shared::Replicated`], the cluster's key-value buckets) and
//! each domain module's typed view of it (jobs, usage, pairing, approvals), plus the session
//! log the store tells finished turns. Everything is `None` when the gateway runs alone (and in
//! a build without the `cluster` feature). No slot is filled later.

use std::sync::Arc;

use crate::approval::SharedApprovals;
use crate::cluster::Cluster;
use crate::ingress::access::SharedAccess;
use crate::scheduler::jobs::SharedJobs;
use crate::store::shared::Replicated;
use crate::turn::shared_usage::SharedUsage;

/// What this node shares with the cluster (cluster mode; all `None` otherwise).
#[derive(Clone, Default)]
pub struct SharedState {
    /// The seam the pieces are kept through.
    pub seam: Option<Arc<dyn Replicated>>,
    /// The scheduled jobs and their claims.
    pub jobs: Option<SharedJobs>,
    /// The usage counters the budgets add up (its publisher and watch run on the daemon's
    /// runtime).
    pub usage: Option<SharedUsage>,
    /// Pairing.
    pub access: Option<SharedAccess>,
    /// Approvals.
    pub approvals: Option<SharedApprovals>,
}

impl SharedState {
    /// The shared state of `cluster` (`None`: nothing shared). Call on the daemon's runtime:
    /// the usage counters' publisher starts here.
    pub fn of(cluster: Option<&Cluster>) -> Self {
        let Some(seam) = seam(cluster) else {
            return Self::default();
        };
        Self {
            jobs: Some(SharedJobs::new(seam.clone())),
            usage: Some(SharedUsage::start(seam.clone())),
            access: Some(SharedAccess::new(seam.clone())),
            approvals: Some(SharedApprovals::new(seam.clone())),
            seam: Some(seam),
        }
    }
}

/// The seam of shared state on `cluster`'s key-value buckets.
pub fn seam(cluster: Option<&Cluster>) -> Option<Arc<dyn Replicated>> {
    #[cfg(feature = "cluster")]
    {
        cluster
            .map(|c| Arc::new(crate::cluster::kv::ClusterKv::new(c.clone())) as Arc<dyn Replicated>)
    }
    #[cfg(not(feature = "cluster"))]
    {
        cluster.map(|c| match *c {})
    }
}
