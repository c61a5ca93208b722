//! Jobs shared between gateways (cluster mode): the job store keeps its records in the local
//! store as a cache of a shared, authoritative copy, and claims each occurrence before running
//! it so that it runs on one gateway only. The daemon provides the implementation; without one
//! (single-node mode) nothing here is used.

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

/// The shared copy of the jobs. Every method may block for a bounded time and fails when the
/// shared copy cannot be reached.
pub trait SharedJobs: Send + Sync {
    /// Write job `id`'s record (JSON), or remove it and its run history (`None`).
    ///
    /// # Errors
    /// Not reachable.
    fn publish(&self, id: &str, job: Option<&str>) -> Result<(), String>;
    /// Every shared job record (JSON).
    ///
    /// # Errors
    /// Not reachable.
    fn all(&self) -> Result<Vec<String>, String>;
    /// What the shared copy knows of job `id`.
    ///
    /// # Errors
    /// Not reachable.
    fn state(&self, id: &str) -> Result<SharedState, String>;
    /// Claim occurrence `run` (its scheduled time, RFC 3339) of job `id` for this gateway:
    /// `Ok(None)` when it is this gateway's, `Ok(Some(other))` when another one has it.
    ///
    /// # Errors
    /// Not reachable: the occurrence must not run now.
    fn claim(&self, id: &str, run: &str) -> Result<Option<String>, String>;
    /// Add a run record (JSON) to job `id`'s shared history, keeping the last `keep`.
    ///
    /// # Errors
    /// Not reachable.
    fn add_run(&self, id: &str, record: &str, keep: usize) -> Result<(), String>;
    /// Job `id`'s shared run records (JSON), oldest first.
    ///
    /// # Errors
    /// Not reachable.
    fn runs(&self, id: &str) -> Result<Vec<String>, String>;
}
