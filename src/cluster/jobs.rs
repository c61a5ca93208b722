//! Scheduled jobs shared by the nodes of the cluster: every node has every job, and each
//! occurrence runs on one node only.
//!
//! Bucket [`JOBS_BUCKET`] (no expiry) is authoritative for the job definitions
//! (`job.<id>` → the job as JSON; a removed job leaves a delete marker) and holds each job's
//! run history (`runs.<id>` → a JSON array of the last run records, updated with the key's
//! revision). Each node keeps its local store as a cache and re-reads the bucket every couple of
//! seconds. Bucket [`CLAIMS_BUCKET`] (entries expire after a week) holds the claims: before a
//! node runs an occurrence it `create`s `claim.<id>.<scheduled time>` with its node id, which
//! fails when another node has claimed it.
//!
//! The methods wait for NATS from synchronous code (never call them on the cluster's thread),
//! at most [`WAIT`], and fail at once while the cluster is unhealthy.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;

use super::node::Cluster;

/// The key-value bucket of the job definitions and run histories (no expiry).
pub const JOBS_BUCKET: &str = "weft_jobs";
/// The key-value bucket of the occurrence claims (entries expire after [`CLAIMS_KEPT`]).
pub const CLAIMS_BUCKET: &str = "weft_job_claims";
/// How long a claim is kept (7 days): longer than any catch-up looks back for a run.
pub const CLAIMS_KEPT: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long one call waits for NATS.
pub const WAIT: Duration = Duration::from_secs(3);

/// What the cluster knows of a job id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Known {
    /// Never written to the cluster.
    Absent,
    /// Defined.
    Present,
    /// Removed (a delete marker).
    Removed,
}

/// Who has an occurrence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claimed {
    /// This node (now or before).
    Won,
    /// Another node, named.
    Taken(String),
}

type Buckets = (kv::Store, kv::Store);

/// The cluster's shared jobs (cheap to clone).
#[derive(Clone)]
pub struct ClusterJobs {
    cluster: Cluster,
    buckets: Arc<tokio::sync::OnceCell<Buckets>>,
}

fn job_key(id: &str) -> String {
    format!("job.{}", super::key_part(id))
}

fn runs_key(id: &str) -> String {
    format!("runs.{}", super::key_part(id))
}

impl ClusterJobs {
    /// The shared jobs of `cluster`.
    pub fn new(cluster: Cluster) -> Self {
        Self {
            cluster,
            buckets: Arc::new(tokio::sync::OnceCell::new()),
        }
    }

    fn call<T, F, Fut>(&self, f: F) -> Result<T, String>
    where
        F: FnOnce(Buckets, String) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, String>> + Send + 'static,
        T: Send + 'static,
    {
        let js = self.cluster.healthy_jetstream()?;
        let cell = self.buckets.clone();
        let node = self.cluster.settings().node_id.clone();
        self.cluster
            .block_on(
                async move {
                    let b = cell
                        .get_or_try_init(|| async {
                            let jobs = super::node::bucket(
                                &js,
                                JOBS_BUCKET,
                                Duration::ZERO,
                                "weft scheduled jobs",
                            )
                            .await?;
                            let claims = super::node::bucket(
                                &js,
                                CLAIMS_BUCKET,
                                CLAIMS_KEPT,
                                "weft scheduled run claims",
                            )
                            .await?;
                            Ok::<_, super::node::ClusterError>((jobs, claims))
                        })
                        .await
                        .map_err(|e| e.to_string())?
                        .clone();
                    f(b, node).await
                },
                WAIT,
            )
            .ok_or_else(|| "NATS did not answer in time".to_string())?
    }

    /// Write job `id`'s record (`Some(json)`) or remove it with its run history (`None`).
    ///
    /// # Errors
    /// NATS failed or did not answer.
    pub fn publish(&self, id: &str, job: Option<&str>) -> Result<(), String> {
        let (k, r) = (job_key(id), runs_key(id));
        let body = job.map(|j| bytes::Bytes::from(j.to_string()));
        self.call(move |(jobs, _), _| async move {
            match body {
                Some(b) => jobs.put(&k, b).await.map(|_| ()).map_err(|e| e.to_string()),
                None => {
                    jobs.delete(&k).await.map_err(|e| e.to_string())?;
                    jobs.delete(&r).await.map_err(|e| e.to_string())
                }
            }
        })
    }

    /// Every job record in the cluster.
    ///
    /// # Errors
    /// NATS failed or did not answer.
    pub fn jobs(&self) -> Result<Vec<String>, String> {
        self.call(|(jobs, _), _| async move {
            use futures::StreamExt;
            let mut keys = jobs.keys().await.map_err(|e| e.to_string())?;
            let mut names = Vec::new();
            while let Some(k) = keys.next().await {
                let k = k.map_err(|e| e.to_string())?;
                if k.starts_with("job.") {
                    names.push(k);
                }
            }
            let mut out = Vec::new();
            for k in names {
                if let Some(v) = jobs.get(&k).await.map_err(|e| e.to_string())? {
                    out.push(String::from_utf8_lossy(&v).into_owned());
                }
            }
            Ok(out)
        })
    }

    /// What the cluster knows of job `id`.
    ///
    /// # Errors
    /// NATS failed or did not answer.
    pub fn known(&self, id: &str) -> Result<Known, String> {
        let k = job_key(id);
        self.call(move |(jobs, _), _| async move {
            Ok(match jobs.entry(&k).await.map_err(|e| e.to_string())? {
                None => Known::Absent,
                Some(e) if e.operation == kv::Operation::Put => Known::Present,
                Some(_) => Known::Removed,
            })
        })
    }

    /// Claim the occurrence `run` (its scheduled time) of job `id` for this node.
    ///
    /// # Errors
    /// NATS failed or did not answer: nobody knows who has it; do not run it now.
    pub fn claim(&self, id: &str, run: &str) -> Result<Claimed, String> {
        let k = format!("claim.{}.{}", super::key_part(id), super::key_part(run));
        self.call(move |(_, claims), node| async move {
            match claims.create(&k, node.clone().into()).await {
                Ok(_) => Ok(Claimed::Won),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                    let holder = claims
                        .get(&k)
                        .await
                        .map_err(|e| e.to_string())?
                        .map(|v| String::from_utf8_lossy(&v).into_owned())
                        .unwrap_or_default();
                    Ok(if holder == node {
                        Claimed::Won
                    } else {
                        Claimed::Taken(holder)
                    })
                }
                Err(e) => Err(e.to_string()),
            }
        })
    }

    /// Add run record `record` (JSON) to job `id`'s history, keeping the last `keep`.
    ///
    /// # Errors
    /// NATS failed or did not answer, or the history kept changing.
    pub fn add_run(&self, id: &str, record: &str, keep: usize) -> Result<(), String> {
        let k = runs_key(id);
        let record: serde_json::Value =
            serde_json::from_str(record).map_err(|e| format!("run record: {e}"))?;
        self.call(move |(jobs, _), _| async move {
            for _ in 0..5 {
                let (mut list, rev) = match jobs.entry(&k).await.map_err(|e| e.to_string())? {
                    Some(e) if e.operation == kv::Operation::Put => (
                        serde_json::from_slice::<Vec<serde_json::Value>>(&e.value)
                            .unwrap_or_default(),
                        e.revision,
                    ),
                    Some(e) => (Vec::new(), e.revision),
                    None => (Vec::new(), 0),
                };
                list.push(record.clone());
                let excess = list.len().saturating_sub(keep);
                list.drain(..excess);
                let body: bytes::Bytes =
                    serde_json::to_vec(&list).map_err(|e| e.to_string())?.into();
                let r = if rev == 0 {
                    jobs.create(&k, body).await.map(|_| ()).map_err(|e| {
                        (
                            e.kind() == kv::CreateErrorKind::AlreadyExists,
                            e.to_string(),
                        )
                    })
                } else {
                    jobs.update(&k, body, rev).await.map(|_| ()).map_err(|e| {
                        (
                            e.kind() == kv::UpdateErrorKind::WrongLastRevision,
                            e.to_string(),
                        )
                    })
                };
                match r {
                    Ok(()) => return Ok(()),
                    Err((true, _)) => continue,
                    Err((false, e)) => return Err(e),
                }
            }
            Err("the run history kept changing".into())
        })
    }

    /// Job `id`'s run records (JSON), oldest first.
    ///
    /// # Errors
    /// NATS failed or did not answer.
    pub fn runs(&self, id: &str) -> Result<Vec<String>, String> {
        let k = runs_key(id);
        self.call(move |(jobs, _), _| async move {
            let Some(v) = jobs.get(&k).await.map_err(|e| e.to_string())? else {
                return Ok(Vec::new());
            };
            let list: Vec<serde_json::Value> =
                serde_json::from_slice(&v).map_err(|e| format!("run history: {e}"))?;
            Ok(list.iter().map(ToString::to_string).collect())
        })
    }
}
