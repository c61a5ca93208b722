//! Jobs shared between gateways (cluster mode): the job store keeps its records in the local
//! store as a cache of a shared, authoritative copy, and claims each occurrence before running
//! it so that it runs on one gateway only. Two pieces of shared state
//! ([`crate::store::shared`]): the bucket [`JOBS_BUCKET`] holds `job.<id>` (a [`Job`]; a removed
//! job leaves a delete marker) and `runs.<id>` (the last run records, updated with the key's
//! revision so two nodes never overwrite each other's), the bucket [`CLAIMS_BUCKET`] holds
//! `claim.<id>.<scheduled time>` (the node that runs it, created once).
//!
//! The daemon gives the job store a [`SharedJobs`] at construction in cluster mode; without one
//! nothing here is used. Every method waits for the cluster (at most its bucket's wait): call
//! them off the runtime.

use std::sync::Arc;
use std::time::Duration;

use super::jobs::{Job, RunRecord};
use crate::store::shared::{
    self, Bucket, Entry, Payload, Replicated, Shared, SharedError, SharedErrorKind,
};

/// The bucket of the job definitions and run histories (no expiry).
pub const JOBS_BUCKET: Bucket = Bucket {
    name: "weft_jobs",
    max_age: Duration::ZERO,
    description: "weft scheduled jobs",
    wait: Duration::from_secs(3),
};

/// The bucket of the occurrence claims: kept 7 days, longer than any catch-up looks back for
/// a run.
pub const CLAIMS_BUCKET: Bucket = Bucket {
    name: "weft_job_claims",
    max_age: Duration::from_secs(7 * 24 * 3600),
    description: "weft scheduled run claims",
    wait: Duration::from_secs(3),
};

/// Times the run history is read and written again when another node wrote it in between.
const HISTORY_TRIES: usize = 5;

impl Payload for Job {}

/// A job's shared run history, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct RunHistory(pub Vec<RunRecord>);

impl Payload for RunHistory {}

/// What the shared copy knows of a job id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedState {
    /// Never shared.
    Absent,
    /// Defined.
    Present,
    /// Removed.
    Removed,
}

/// Who runs an occurrence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// This gateway (now or before).
    Mine,
    /// Another gateway, named.
    Taken(String),
}

/// The shared copy of the jobs (cheap to clone).
#[derive(Clone)]
pub struct SharedJobs {
    jobs: Shared<Job>,
    runs: Shared<RunHistory>,
    claims: Shared<String>,
}

impl SharedJobs {
    /// The jobs kept through `seam`.
    pub fn new(seam: Arc<dyn Replicated>) -> Self {
        Self {
            jobs: Shared::new(seam.clone(), JOBS_BUCKET, "job"),
            runs: Shared::new(seam.clone(), JOBS_BUCKET, "runs"),
            claims: Shared::new(seam, CLAIMS_BUCKET, "claim"),
        }
    }

    /// Write `job`.
    ///
    /// # Errors
    /// The cluster did not take it.
    pub fn publish(&self, job: &Job) -> Result<(), SharedError> {
        shared::wait(self.jobs.put(&[&job.id], job)).map(drop)
    }

    /// Remove job `id` and its run history.
    ///
    /// # Errors
    /// The cluster did not take it.
    pub fn remove(&self, id: &str) -> Result<(), SharedError> {
        shared::wait(async {
            self.jobs.delete(&[id]).await?;
            self.runs.delete(&[id]).await
        })
    }

    /// Every shared job (a record that does not decode is logged and left out).
    ///
    /// # Errors
    /// The cluster did not answer.
    pub fn all(&self) -> Result<Vec<Job>, SharedError> {
        shared::wait(async {
            let mut out = Vec::new();
            for k in self.jobs.keys().await? {
                let parts: Vec<&str> = k.iter().map(String::as_str).collect();
                match self.jobs.get(&parts).await {
                    Ok(Some(v)) => out.push(v.value),
                    Ok(None) => {}
                    Err(e) if e.kind() == SharedErrorKind::Invalid => {
                        tracing::warn!(job = ?k, error = %e, "shared job record undecodable; skipped");
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(out)
        })
    }

    /// What the shared copy knows of job `id`.
    ///
    /// # Errors
    /// The cluster did not answer.
    pub fn state(&self, id: &str) -> Result<SharedState, SharedError> {
        Ok(match shared::wait(self.jobs.entry(&[id]))? {
            Entry::Absent => SharedState::Absent,
            Entry::Present(_) => SharedState::Present,
            Entry::Removed(_) => SharedState::Removed,
        })
    }

    /// Claim occurrence `run` (its scheduled time) of job `id` for this gateway.
    ///
    /// # Errors
    /// The cluster did not answer: nobody can tell who runs it; it must not run now.
    pub fn claim(&self, id: &str, run: &str) -> Result<Claim, SharedError> {
        let me = self.claims.node().to_string();
        shared::wait(async {
            match self.claims.update(&[id, run], &me, 0).await {
                Ok(_) => Ok(Claim::Mine),
                Err(e) if e.kind() == SharedErrorKind::Conflict => {
                    let holder = self
                        .claims
                        .get(&[id, run])
                        .await?
                        .map(|v| v.value)
                        .unwrap_or_default();
                    Ok(if holder == me {
                        Claim::Mine
                    } else {
                        Claim::Taken(holder)
                    })
                }
                Err(e) => Err(e),
            }
        })
    }

    /// Add `record` to job `id`'s history, keeping the last `keep`.
    ///
    /// # Errors
    /// The cluster did not answer, or the history kept changing.
    pub fn add_run(&self, id: &str, record: &RunRecord, keep: usize) -> Result<(), SharedError> {
        shared::wait(async {
            for _ in 0..HISTORY_TRIES {
                let now = self.runs.entry(&[id]).await?;
                let rev = now.revision();
                let mut list = now.value().map(|v| v.value).unwrap_or_default();
                list.0.push(record.clone());
                let excess = list.0.len().saturating_sub(keep);
                list.0.drain(..excess);
                match self.runs.update(&[id], &list, rev).await {
                    Ok(_) => return Ok(()),
                    Err(e) if e.kind() == SharedErrorKind::Conflict => continue,
                    Err(e) => return Err(e),
                }
            }
            Err(SharedError::new(
                SharedErrorKind::Conflict,
                "the run history kept changing",
            ))
        })
    }

    /// Job `id`'s shared run records, oldest first.
    ///
    /// # Errors
    /// The cluster did not answer, or the history does not decode.
    pub fn runs(&self, id: &str) -> Result<Vec<RunRecord>, SharedError> {
        Ok(shared::wait(self.runs.get(&[id]))?
            .map(|v| v.value.0)
            .unwrap_or_default())
    }
}
