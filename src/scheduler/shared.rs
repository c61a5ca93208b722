//! Jobs shared between gateways (cluster mode): the job store keeps its records in the local
//! store as a cache of a shared, authoritative copy, and claims each occurrence before running
//! it so that it runs on one gateway only. Two pieces of shared state
//! ([`crate::store::shared`]): the bucket [`JOBS_BUCKET`] holds `job.<id>` (a job; a removed
//! job leaves a delete marker) and `runs.<id>` (the last run records, updated with the key's
//! revision so two nodes never overwrite each other's), the bucket [`CLAIMS_BUCKET`] holds
//! `claim.<id>.<scheduled time>` (the node that runs it, created once).
//!
//! This file holds the buckets and what the shared copy answers; the job store's view of it,
//! [`super::jobs::SharedJobs`], is given to the job store at construction in cluster mode
//! (without one nothing here is used). It imports nothing of the scheduler.

use std::time::Duration;

use crate::store::shared::Bucket;

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
