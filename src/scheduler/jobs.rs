//! Jobs in the store: add, list, update, remove, pause and resume them within the limits, find
//! the due ones and record runs exactly once (a run id recorded twice counts once). Holds no
//! timer and starts no run: the daemon's scheduler asks [`JobStore::due`] and reports back with
//! [`JobStore::record_run`].
//!
//! Layout in the store's state namespaces: `sched.jobs`/`<job id>` → the [`Job`] as JSON;
//! `sched.runs.<job id>`/`<scheduled time>` → its [`RunRecord`]s (the last
//! [`RUNS_KEPT`]), written in the same atomic batch as the job they update.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};

use super::catchup::{self, CatchUp, Plan, Run, RunId};
use super::schedule::{Schedule, ScheduleError};
use super::settings::SchedulerSettings;
use super::shared::{Claim, SharedState, CLAIMS_BUCKET, JOBS_BUCKET};
use crate::store::shared::{self as seam, Entry, Replicated, Shared, SharedError, SharedErrorKind};
use crate::store::{Store, StoreError};
use crate::types::MutexExt;
use crate::types::SessionKey;

/// State namespace of the job records.
pub const JOBS_NS: &str = "sched.jobs";
/// Prefix of the per-job run namespaces (`sched.runs.<job id>`).
const RUNS_NS_PREFIX: &str = "sched.runs.";
/// Run records kept per job (100, the `catch_up = "all"` cap): the dedupe window of
/// [`JobStore::record_run`] and the `runs` history.
pub const RUNS_KEPT: usize = 100;
/// Longest job name in bytes (100): it is shown in lists and notifications.
const MAX_NAME_BYTES: usize = 100;
/// Longest job message in bytes (16 KiB): it becomes a user message on every run.
const MAX_MESSAGE_BYTES: usize = 16 * 1024;

/// How a run's message reaches the target chat.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Deliver {
    /// Run a turn with the message as the user's; the reply goes to the chat.
    #[default]
    Turn,
    /// Send the message as it is, with no LLM call (a reminder).
    Text,
}

/// What a run does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payload {
    /// The message (the turn's input, or the text sent).
    pub message: String,
    /// Turn or plain text.
    #[serde(default)]
    pub deliver: Deliver,
}

/// The chat a run answers in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// Channel instance id (`telegram:main`).
    pub channel: String,
    /// Chat id on that channel.
    pub chat_id: String,
    /// Thread in that chat, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
}

impl Target {
    /// The session key of this chat: `channel:chat[:thread]`.
    ///
    /// # Errors
    /// A component that is empty or holds `:`.
    pub fn session_key(&self) -> Result<SessionKey, crate::types::session_key::InvalidSessionKey> {
        let mut parts = vec![self.channel.as_str(), self.chat_id.as_str()];
        if let Some(t) = self.thread.as_deref() {
            parts.push(t);
        }
        SessionKey::from_parts(&parts)
    }
}

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Delivered.
    Ok,
    /// Failed (LLM, tool or delivery error); counts towards the auto-pause.
    Failed,
    /// Stopped by `/stop` or shutdown; neither a success nor a failure.
    Cancelled,
}

impl Outcome {
    /// `ok`, `failed`, `cancelled` (metrics label).
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// One recorded run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Its dedupe key.
    pub run_id: RunId,
    /// The occurrence it stood for.
    pub scheduled: DateTime<Utc>,
    /// When it was recorded (finished).
    pub finished: DateTime<Utc>,
    /// How it ended.
    pub outcome: Outcome,
    /// Started late (a catch-up).
    #[serde(default)]
    pub late: bool,
    /// A short error text for a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A scheduled job as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// UUID v7 (time-ordered).
    pub id: String,
    /// Name shown in lists.
    pub name: String,
    /// When it runs.
    pub schedule: Schedule,
    /// What it does about runs missed during a downtime.
    #[serde(default)]
    pub catch_up: CatchUp,
    /// What a run does.
    pub payload: Payload,
    /// Where a run answers.
    pub target: Target,
    /// The session that owns it (manages it, is told when it is paused).
    pub owner: SessionKey,
    /// Who asked for it: the sender id on the owner's channel (`None`: the operator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    /// False while paused.
    pub enabled: bool,
    /// Why it is paused (`by request`, or the failures that paused it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_reason: Option<String>,
    /// When it was added.
    pub created: DateTime<Utc>,
    /// The occurrence the schedule counts from: the creation (or last schedule change) time,
    /// then the latest occurrence run or skipped. Catch-up looks at the occurrences after it;
    /// an `every` job's grid is anchored on it.
    pub anchor: DateTime<Utc>,
    /// The last recorded run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<RunRecord>,
    /// The next occurrence (`None`: nothing more, e.g. an `at` that ran).
    pub next_run: Option<DateTime<Utc>>,
    /// Failed runs in a row.
    #[serde(default)]
    pub consecutive_failures: u32,
    /// Runs recorded on `runs_day`.
    #[serde(default)]
    pub runs_today: u32,
    /// The UTC day `runs_today` counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs_day: Option<NaiveDate>,
}

/// A job to add.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewJob {
    /// Name.
    pub name: String,
    /// Schedule, validated at add.
    pub schedule: Schedule,
    /// Catch-up policy.
    pub catch_up: CatchUp,
    /// Payload.
    pub payload: Payload,
    /// Target chat.
    pub target: Target,
    /// Owner session.
    pub owner: SessionKey,
    /// The chat user who asked for it (their sender id on the owner's channel): runs in the
    /// owner's chat are theirs (their memory, their budget). `None`: the operator, the terminal.
    pub created_by: Option<String>,
}

/// Changes to a job; `None` keeps the field.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobPatch {
    /// New name.
    pub name: Option<String>,
    /// New schedule (validated; the job counts from the time of the change).
    pub schedule: Option<Schedule>,
    /// New catch-up policy.
    pub catch_up: Option<CatchUp>,
    /// New payload.
    pub payload: Option<Payload>,
    /// New target.
    pub target: Option<Target>,
}

/// A job due now and the runs to start for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Due {
    /// The job as stored.
    pub job: Job,
    /// Its runs (non-empty), oldest first.
    pub plan: Plan,
}

/// What [`JobStore::record_run`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// The run id was recorded before: nothing changed.
    pub duplicate: bool,
    /// This run paused the job (N failures in a row): tell the owner.
    pub paused: bool,
    /// The job after the update.
    pub job: Job,
}

/// Why a job operation was refused or failed. Every refusal's message names the field or the
/// setting and the fix; the `cron` tool shows them to the model.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The schedule does not validate.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// A field is empty or too long.
    #[error("{field}: {detail}")]
    Invalid {
        /// Argument name.
        field: &'static str,
        /// What is expected.
        detail: String,
    },
    /// The owner has as many jobs as allowed.
    #[error("this session already has {max} scheduled jobs (setting `scheduler.max_jobs_per_session`); remove one first")]
    TooManyJobs {
        /// The limit.
        max: u32,
    },
    /// The schedule would run more often than allowed.
    #[error("this schedule runs more than {max} times in the next 24 hours, the most allowed per day (setting `scheduler.max_runs_per_day`); choose a longer interval")]
    TooManyRuns {
        /// The limit.
        max: u32,
    },
    /// No such job (or not the caller's).
    #[error("no scheduled job with id `{id}` in this session; `list` shows the ids")]
    NotFound {
        /// The id asked for.
        id: String,
    },
    /// A stored record does not decode.
    #[error("scheduled job record {key} is corrupt: {detail}")]
    Corrupt {
        /// Key.
        key: String,
        /// Decoder message.
        detail: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl JobError {
    /// Whether the caller (the model, the operator) can fix it by changing the request.
    pub fn is_refusal(&self) -> bool {
        match self {
            JobError::Schedule(_)
            | JobError::Invalid { .. }
            | JobError::TooManyJobs { .. }
            | JobError::TooManyRuns { .. }
            | JobError::NotFound { .. } => true,
            JobError::Corrupt { .. } | JobError::Store(_) => false,
        }
    }
}

/// The scheduled jobs, on the [`Store`]. Cheap to clone; read-modify-write operations are
/// serialised by one lock (they are rare: a run, a tool call).
#[derive(Clone)]
pub struct JobStore {
    store: Store,
    limits: SchedulerSettings,
    lock: Arc<Mutex<()>>,
    /// The shared copy (cluster mode): authoritative for the definitions; the store caches it.
    shared: Option<SharedJobs>,
}

fn runs_ns(job: &str) -> String {
    format!("{RUNS_NS_PREFIX}{job}")
}

/// The run record key: the scheduled time (sorts by time), with the manual suffix for a run
/// started by hand.
fn run_key(run: &Run) -> String {
    let t = run
        .scheduled
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    if run.manual {
        format!("{t}{}", catchup::MANUAL_SUFFIX)
    } else {
        t
    }
}

/// Job `l` (this gateway's copy) brought in line with `r` (the shared copy): the definition
/// from `r`; the position in the schedule the later of the two (unless the schedule or the
/// enabled state changed, which reset it: then all of `r`).
fn merge(l: Job, r: Job) -> Job {
    if l.schedule != r.schedule || l.enabled != r.enabled {
        return r;
    }
    let mut m = r;
    if l.anchor > m.anchor {
        m.anchor = l.anchor;
        m.next_run = match m.schedule.compile() {
            Ok(c) => c.next_after(m.anchor),
            Err(_) => l.next_run,
        };
        if l.runs_day >= m.runs_day {
            m.runs_day = l.runs_day;
            m.runs_today = l.runs_today;
        }
    }
    if l.last_run.as_ref().map(|x| x.finished) > m.last_run.as_ref().map(|x| x.finished) {
        m.last_run = l.last_run;
    }
    m
}

/// A one-time (`at`) job with no run left: it ran, or its time was passed over.
fn finished(job: &Job) -> bool {
    matches!(job.schedule, Schedule::At { .. }) && job.next_run.is_none()
}

fn encode<T: Serialize>(v: &T) -> Result<String, JobError> {
    serde_json::to_string(v)
        .map_err(|e| JobError::Store(StoreError::Backend(format!("encode: {e}"))))
}

fn check_text(field: &'static str, text: &str, max: usize) -> Result<(), JobError> {
    if text.trim().is_empty() {
        return Err(JobError::Invalid {
            field,
            detail: "must not be empty".into(),
        });
    }
    if text.len() > max {
        return Err(JobError::Invalid {
            field,
            detail: format!("is {} bytes, at most {max} allowed", text.len()),
        });
    }
    Ok(())
}

fn check_target(t: &Target) -> Result<(), JobError> {
    if t.channel.trim().is_empty() || t.chat_id.trim().is_empty() {
        return Err(JobError::Invalid {
            field: "target",
            detail: "needs a non-empty `channel` and `chat_id`".into(),
        });
    }
    Ok(())
}

impl JobStore {
    /// The jobs in `store`, within `limits`.
    pub fn new(store: Store, limits: SchedulerSettings) -> Self {
        Self {
            store,
            limits,
            lock: Arc::new(Mutex::new(())),
            shared: None,
        }
    }

    /// These jobs shared with the other gateways through `shared` (cluster mode), given before
    /// the job store is used.
    #[must_use]
    pub fn sharing(mut self, shared: Option<SharedJobs>) -> Self {
        self.shared = shared;
        self
    }

    /// Whether the jobs are shared (cluster mode).
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// The limits in force.
    pub fn limits(&self) -> SchedulerSettings {
        self.limits
    }

    fn guard(&self) -> std::sync::MutexGuard<'_, ()> {
        // The lock guards no data: a panic while holding it leaves nothing half-written in
        // memory (the store batch is atomic).
        self.lock.locked()
    }

    fn load(&self, id: &str) -> Result<Option<Job>, JobError> {
        let Some(text) = self.store.state_get(JOBS_NS, id)? else {
            return Ok(None);
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| JobError::Corrupt {
                key: format!("{JOBS_NS}/{id}"),
                detail: e.to_string(),
            })
    }

    /// The job `id`, if `owner` is `None` (operator) or owns it.
    fn load_owned(&self, id: &str, owner: Option<&SessionKey>) -> Result<Job, JobError> {
        match self.load(id)? {
            Some(job) if owner.is_none_or(|o| *o == job.owner) => Ok(job),
            _ => Err(JobError::NotFound { id: id.to_string() }),
        }
    }

    fn save(&self, job: &Job) -> Result<(), JobError> {
        let text = encode(job)?;
        self.store.state_put(JOBS_NS, &job.id, Some(&text))?;
        if let Some(sh) = &self.shared {
            // Not lost when this fails: the next sync publishes a local job the shared copy
            // never had.
            if let Err(e) = sh.publish(job) {
                tracing::warn!(job = %job.id, error = %e, "scheduled job not shared yet; retried");
            }
        }
        Ok(())
    }

    /// Save a change someone asked for (add, update, pause, resume): with shared jobs, the
    /// shared copy first, so that a change the cluster did not take is refused, not kept on
    /// this node only until the next sync undoes it.
    fn save_asked(&self, job: &Job) -> Result<(), JobError> {
        let text = encode(job)?;
        if let Some(sh) = &self.shared {
            sh.publish(job).map_err(|e| {
                JobError::Store(StoreError::Backend(format!(
                    "the job could not be saved in the cluster ({e}); try again"
                )))
            })?;
        }
        self.store
            .state_put(JOBS_NS, &job.id, Some(&text))
            .map_err(JobError::from)
    }

    /// Bring the local cache in line with the shared copy (cluster mode; the caller holds the
    /// guard). The definition comes from the shared copy; the position in the schedule is the
    /// later of the two. Unreachable: the cache is used as it is.
    fn sync(&self) -> Result<(), JobError> {
        let Some(sh) = &self.shared else {
            return Ok(());
        };
        let remote = match sh.all() {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "shared jobs not reachable; using the local copy");
                return Ok(());
            }
        };
        let mut seen = std::collections::HashSet::new();
        for r in remote {
            seen.insert(r.id.clone());
            let merged = match self.load(&r.id) {
                Ok(Some(l)) => merge(l, r.clone()),
                _ => r.clone(),
            };
            if self.load(&r.id).ok().flatten().as_ref() != Some(&merged) {
                self.store
                    .state_put(JOBS_NS, &merged.id, Some(&encode(&merged)?))?;
            }
        }
        for (id, text) in self.store.state_scan(JOBS_NS)? {
            if seen.contains(&id) {
                continue;
            }
            match sh.state(&id) {
                Ok(SharedState::Removed) => {
                    let ns = runs_ns(&id);
                    let runs = self.store.state_scan(&ns)?;
                    let mut writes: Vec<(&str, &str, Option<&str>)> = runs
                        .iter()
                        .map(|(k, _)| (ns.as_str(), k.as_str(), None))
                        .collect();
                    writes.push((JOBS_NS, id.as_str(), None));
                    self.store.state_put_many(&writes)?;
                }
                Ok(SharedState::Absent) => {
                    // Made here before cluster mode, or its publication failed: share it.
                    let published = serde_json::from_str::<Job>(&text)
                        .map_err(|e| e.to_string())
                        .and_then(|job| sh.publish(&job).map_err(|e| e.to_string()));
                    if let Err(e) = published {
                        tracing::warn!(job = %id, error = %e, "scheduled job not shared yet");
                    }
                }
                Ok(SharedState::Present) | Err(_) => {}
            }
        }
        Ok(())
    }

    /// Claim occurrence `run` of job `id` before running it: `Ok(None)` when this gateway runs
    /// it (always, when the jobs are not shared), `Ok(Some(other))` when another gateway has it.
    ///
    /// # Errors
    /// The shared copy is not reachable: nobody can tell; do not run it now.
    pub fn claim(&self, id: &str, run: &Run) -> Result<Option<String>, SharedError> {
        match &self.shared {
            Some(sh) if !run.manual => Ok(match sh.claim(id, &run_key(run))? {
                Claim::Mine => None,
                Claim::Taken(node) => Some(node),
            }),
            _ => Ok(None),
        }
    }

    /// Occurrence `run` of job `id` was run by another gateway: move past it here without a
    /// run record of this gateway's (a one-time job goes).
    ///
    /// # Errors
    /// A store failure.
    pub fn passed(&self, id: &str, run: &Run) -> Result<(), JobError> {
        let _g = self.guard();
        let Some(mut job) = self.load(id)? else {
            return Ok(());
        };
        let compiled = job.schedule.compile()?;
        job.anchor = job.anchor.max(run.scheduled);
        job.next_run = compiled.next_after(job.anchor);
        if finished(&job) {
            self.delete(id)?;
        } else {
            self.store
                .state_put(JOBS_NS, &job.id, Some(&encode(&job)?))?;
        }
        Ok(())
    }

    /// Check the schedule against the limits at `now`: valid, at least the minimum interval,
    /// at most `max_runs_per_day` occurrences in the next 24 hours.
    fn check_schedule(&self, schedule: &Schedule, now: DateTime<Utc>) -> Result<(), JobError> {
        let compiled = schedule.validate(now, self.limits.min_interval_secs)?;
        let max = self.limits.max_runs_per_day;
        let runs = compiled.count(now, now + chrono::TimeDelta::days(1), u64::from(max) + 1);
        if runs > u64::from(max) {
            return Err(JobError::TooManyRuns { max });
        }
        Ok(())
    }

    /// Add a job at `now` (its schedule counts from `now`).
    ///
    /// # Errors
    /// A refusal ([`JobError::is_refusal`]) naming the field or limit; a store failure.
    pub fn add(&self, new: NewJob, now: DateTime<Utc>) -> Result<Job, JobError> {
        check_text("name", &new.name, MAX_NAME_BYTES)?;
        check_text("message", &new.payload.message, MAX_MESSAGE_BYTES)?;
        check_target(&new.target)?;
        self.check_schedule(&new.schedule, now)?;
        let _g = self.guard();
        let owned = self.list_by_owner(&new.owner)?.len();
        if owned >= self.limits.max_jobs_per_session as usize {
            return Err(JobError::TooManyJobs {
                max: self.limits.max_jobs_per_session,
            });
        }
        let next_run = new.schedule.next_after(now)?;
        let job = Job {
            id: uuid::Uuid::now_v7().to_string(),
            name: new.name,
            schedule: new.schedule,
            catch_up: new.catch_up,
            payload: new.payload,
            target: new.target,
            owner: new.owner,
            created_by: new.created_by,
            enabled: true,
            paused_reason: None,
            created: now,
            anchor: now,
            last_run: None,
            next_run,
            consecutive_failures: 0,
            runs_today: 0,
            runs_day: None,
        };
        self.save_asked(&job)?;
        Ok(job)
    }

    /// Every job, in id (creation) order.
    ///
    /// # Errors
    /// A store failure or a corrupt record.
    pub fn list(&self) -> Result<Vec<Job>, JobError> {
        self.store
            .state_scan(JOBS_NS)?
            .into_iter()
            .map(|(k, v)| {
                serde_json::from_str(&v).map_err(|e| JobError::Corrupt {
                    key: format!("{JOBS_NS}/{k}"),
                    detail: e.to_string(),
                })
            })
            .collect()
    }

    /// The jobs `owner` owns, in creation order.
    ///
    /// # Errors
    /// As [`JobStore::list`].
    pub fn list_by_owner(&self, owner: &SessionKey) -> Result<Vec<Job>, JobError> {
        let mut jobs = self.list()?;
        jobs.retain(|j| j.owner == *owner);
        Ok(jobs)
    }

    /// The job `id`; with `owner`, only if that session owns it.
    ///
    /// # Errors
    /// [`JobError::NotFound`]; a store failure.
    pub fn get(&self, id: &str, owner: Option<&SessionKey>) -> Result<Job, JobError> {
        self.load_owned(id, owner)
    }

    /// Change a job at `now`. A new schedule is validated and counts from `now`.
    ///
    /// # Errors
    /// As [`JobStore::add`]; [`JobError::NotFound`].
    pub fn update(
        &self,
        id: &str,
        owner: Option<&SessionKey>,
        patch: JobPatch,
        now: DateTime<Utc>,
    ) -> Result<Job, JobError> {
        if let Some(name) = &patch.name {
            check_text("name", name, MAX_NAME_BYTES)?;
        }
        if let Some(p) = &patch.payload {
            check_text("message", &p.message, MAX_MESSAGE_BYTES)?;
        }
        if let Some(t) = &patch.target {
            check_target(t)?;
        }
        if let Some(s) = &patch.schedule {
            self.check_schedule(s, now)?;
        }
        let _g = self.guard();
        let mut job = self.load_owned(id, owner)?;
        if let Some(name) = patch.name {
            job.name = name;
        }
        if let Some(c) = patch.catch_up {
            job.catch_up = c;
        }
        if let Some(p) = patch.payload {
            job.payload = p;
        }
        if let Some(t) = patch.target {
            job.target = t;
        }
        if let Some(s) = patch.schedule {
            job.next_run = s.next_after(now)?;
            job.schedule = s;
            job.anchor = now;
        }
        self.save_asked(&job)?;
        Ok(job)
    }

    /// Remove a job and its run history.
    ///
    /// # Errors
    /// [`JobError::NotFound`]; a store failure.
    pub fn remove(&self, id: &str, owner: Option<&SessionKey>) -> Result<Job, JobError> {
        let _g = self.guard();
        let job = self.load_owned(id, owner)?;
        if let Some(sh) = &self.shared {
            sh.remove(id).map_err(|e| {
                JobError::Store(StoreError::Backend(format!(
                    "the job could not be removed from the cluster ({e}); try again"
                )))
            })?;
        }
        self.delete(id)?;
        Ok(job)
    }

    /// Delete job `id` and its run history in one batch (the caller holds the guard).
    fn delete(&self, id: &str) -> Result<(), JobError> {
        let ns = runs_ns(id);
        let runs = self.store.state_scan(&ns)?;
        let mut writes: Vec<(&str, &str, Option<&str>)> = runs
            .iter()
            .map(|(k, _)| (ns.as_str(), k.as_str(), None))
            .collect();
        writes.push((JOBS_NS, id, None));
        self.store.state_put_many(&writes)?;
        if let Some(sh) = &self.shared {
            if let Err(e) = sh.remove(id) {
                tracing::warn!(job = %id, error = %e, "scheduled job removal not shared");
            }
        }
        Ok(())
    }

    /// Pause a job (it keeps its place; runs missed while paused are not caught up).
    ///
    /// # Errors
    /// [`JobError::NotFound`]; a store failure.
    pub fn pause(&self, id: &str, owner: Option<&SessionKey>) -> Result<Job, JobError> {
        let _g = self.guard();
        let mut job = self.load_owned(id, owner)?;
        job.enabled = false;
        job.paused_reason = Some("paused by request".into());
        self.save_asked(&job)?;
        Ok(job)
    }

    /// Resume a paused job at `now`: its failure count is cleared and it counts from `now`
    /// (occurrences while paused are not caught up).
    ///
    /// # Errors
    /// [`JobError::NotFound`]; a store failure; a schedule no longer valid (its zone gone).
    pub fn resume(
        &self,
        id: &str,
        owner: Option<&SessionKey>,
        now: DateTime<Utc>,
    ) -> Result<Job, JobError> {
        let _g = self.guard();
        let mut job = self.load_owned(id, owner)?;
        if !job.enabled {
            // Occurrences while paused are passed over; an `every` job keeps its grid.
            let compiled = job.schedule.compile()?;
            if let Some(t) = compiled.latest(job.anchor, now, 1).pop() {
                job.anchor = t;
            }
            job.next_run = compiled.next_after(job.anchor);
        }
        job.enabled = true;
        job.paused_reason = None;
        job.consecutive_failures = 0;
        self.save_asked(&job)?;
        Ok(job)
    }

    /// The enabled jobs whose next run is at or before `now`, each with its runs by its
    /// catch-up policy. Jobs with nothing to run (every missed occurrence skipped, or at their
    /// daily cap) are moved to their next occurrence here; the others move when their runs are
    /// recorded, so a crash before that finds them due again (with the same run ids).
    ///
    /// # Errors
    /// A store failure. A record that does not decode, or whose schedule no longer compiles
    /// (its zone removed from the system), is skipped with a warning.
    pub fn due(&self, now: DateTime<Utc>) -> Result<Vec<Due>, JobError> {
        let _g = self.guard();
        self.sync()?;
        let mut out = Vec::new();
        for (key, text) in self.store.state_scan(JOBS_NS)? {
            // One undecodable record (written by a newer weft, say) must not stop every job.
            let mut job: Job = match serde_json::from_str(&text) {
                Ok(job) => job,
                Err(e) => {
                    tracing::warn!(job = %key, error = %e, "scheduled job record undecodable; skipped");
                    continue;
                }
            };
            if finished(&job) {
                // A one-time job that has had its run (or whose time was passed over): it
                // will not run again, so it neither shows nor counts any more.
                self.delete(&job.id)?;
                continue;
            }
            if !job.enabled || job.next_run.is_none_or(|t| t > now) {
                continue;
            }
            let compiled = match job.schedule.compile() {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(job = %job.id, error = %e, "scheduled job cannot be computed; skipped");
                    continue;
                }
            };
            let today = now.date_naive();
            let capped =
                job.runs_day == Some(today) && job.runs_today >= self.limits.max_runs_per_day;
            let plan = catchup::plan(&job.id, &compiled, job.catch_up, job.anchor, now);
            if capped || plan.runs.is_empty() {
                // Nothing to run now: count from the latest occurrence passed over (up to the
                // end of today when capped) so it is not found due again.
                let until = if capped {
                    today
                        .succ_opt()
                        .and_then(|d| d.and_hms_opt(0, 0, 0))
                        .map_or(now, |d| d.and_utc() - chrono::TimeDelta::seconds(1))
                } else {
                    now
                };
                if let Some(t) = compiled.latest(job.anchor, until, 1).pop() {
                    job.anchor = t;
                }
                job.next_run = compiled.next_after(job.anchor);
                if finished(&job) {
                    self.delete(&job.id)?;
                } else {
                    self.save(&job)?;
                }
                continue;
            }
            out.push(Due { job, plan });
        }
        Ok(out)
    }

    /// Record how `run` of job `id` ended, at `now`. Idempotent: a run id recorded before
    /// changes nothing (`duplicate`). A scheduled run moves the job's anchor to its occurrence
    /// and its next run after it; `Failed` counts towards the auto-pause (`paused` is true on
    /// the run that pauses the job), `Ok` clears the count, `Cancelled` leaves it. The job and
    /// the run record are written in one atomic batch.
    ///
    /// # Errors
    /// [`JobError::NotFound`] (the job was removed meanwhile); a store failure.
    pub fn record_run(
        &self,
        id: &str,
        run: &Run,
        outcome: Outcome,
        detail: Option<String>,
        now: DateTime<Utc>,
    ) -> Result<Recorded, JobError> {
        let _g = self.guard();
        let mut job = self.load_owned(id, None)?;
        let ns = runs_ns(id);
        let key = run_key(run);
        if self.store.state_get(&ns, &key)?.is_some() {
            return Ok(Recorded {
                duplicate: true,
                paused: false,
                job,
            });
        }
        let record = RunRecord {
            run_id: run.id.clone(),
            scheduled: run.scheduled,
            finished: now,
            outcome,
            late: run.late,
            detail,
        };
        if !run.manual {
            let compiled = job.schedule.compile()?;
            job.anchor = job.anchor.max(run.scheduled);
            job.next_run = compiled.next_after(job.anchor);
        }
        let today = now.date_naive();
        if job.runs_day != Some(today) {
            job.runs_day = Some(today);
            job.runs_today = 0;
        }
        job.runs_today = job.runs_today.saturating_add(1);
        let mut paused = false;
        match outcome {
            Outcome::Ok => job.consecutive_failures = 0,
            Outcome::Cancelled => {}
            Outcome::Failed => {
                job.consecutive_failures = job.consecutive_failures.saturating_add(1);
                if job.enabled && job.consecutive_failures >= self.limits.pause_after_failures {
                    job.enabled = false;
                    job.paused_reason = Some(format!(
                        "paused after {} failed runs in a row (setting `scheduler.pause_after_failures`); resume it when the cause is fixed",
                        job.consecutive_failures
                    ));
                    paused = true;
                }
            }
        }
        job.last_run = Some(record.clone());
        if finished(&job) {
            // A one-time job's run is its last: it goes, with its history (the outcome is in
            // the log), and no longer counts towards `scheduler.max_jobs_per_session`.
            tracing::info!(job = %job.id, outcome = ?outcome, "one-time job done; removed");
            self.delete(id)?;
            return Ok(Recorded {
                duplicate: false,
                paused,
                job,
            });
        }
        let job_text = encode(&job)?;
        let record_text = encode(&record)?;
        let old = self.store.state_scan(&ns)?;
        let excess = (old.len() + 1).saturating_sub(RUNS_KEPT);
        let mut writes: Vec<(&str, &str, Option<&str>)> = old
            .iter()
            .take(excess)
            .map(|(k, _)| (ns.as_str(), k.as_str(), None))
            .collect();
        writes.push((ns.as_str(), key.as_str(), Some(record_text.as_str())));
        writes.push((JOBS_NS, id, Some(job_text.as_str())));
        self.store.state_put_many(&writes)?;
        if let Some(sh) = &self.shared {
            let shared = sh
                .add_run(id, &record, RUNS_KEPT)
                .and_then(|()| sh.publish(&job));
            if let Err(e) = shared {
                tracing::warn!(job = %id, error = %e, "scheduled run not shared");
            }
        }
        Ok(Recorded {
            duplicate: false,
            paused,
            job,
        })
    }

    /// The recorded runs of job `id`, oldest first (the last [`RUNS_KEPT`]).
    ///
    /// # Errors
    /// [`JobError::NotFound`]; a store failure or a corrupt record.
    pub fn runs(&self, id: &str, owner: Option<&SessionKey>) -> Result<Vec<RunRecord>, JobError> {
        self.load_owned(id, owner)?;
        if let Some(sh) = &self.shared {
            match sh.runs(id) {
                Ok(list) => return Ok(list),
                Err(e) if e.kind() == SharedErrorKind::Invalid => {
                    return Err(JobError::Corrupt {
                        key: format!("cluster runs of {id}"),
                        detail: e.to_string(),
                    })
                }
                Err(e) => {
                    tracing::warn!(job = %id, error = %e, "shared run history not reachable; showing this gateway's");
                }
            }
        }
        let ns = runs_ns(id);
        self.store
            .state_scan(&ns)?
            .into_iter()
            .map(|(k, v)| {
                serde_json::from_str(&v).map_err(|e| JobError::Corrupt {
                    key: format!("{ns}/{k}"),
                    detail: e.to_string(),
                })
            })
            .collect()
    }
}

/// Times the shared run history is read and written again when another node wrote it in
/// between.
const HISTORY_TRIES: usize = 5;

impl seam::Payload for Job {}

/// A job's shared run history, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct RunHistory(pub Vec<RunRecord>);

impl seam::Payload for RunHistory {}

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
        seam::wait(self.jobs.put(&[&job.id], job)).map(drop)
    }

    /// Remove job `id` and its run history.
    ///
    /// # Errors
    /// The cluster did not take it.
    pub fn remove(&self, id: &str) -> Result<(), SharedError> {
        seam::wait(async {
            self.jobs.delete(&[id]).await?;
            self.runs.delete(&[id]).await
        })
    }

    /// Every shared job (a record that does not decode is logged and left out).
    ///
    /// # Errors
    /// The cluster did not answer.
    pub fn all(&self) -> Result<Vec<Job>, SharedError> {
        seam::wait(async {
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
        Ok(match seam::wait(self.jobs.entry(&[id]))? {
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
        seam::wait(async {
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
        seam::wait(async {
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
        Ok(seam::wait(self.runs.get(&[id]))?
            .map(|v| v.value.0)
            .unwrap_or_default())
    }
}

#[cfg(test)]
#[path = "jobs_tests.rs"]
mod tests;
