//! The scheduler as it runs in the daemon: one timer for the earliest due job, runs journaled
//! as inbound events and answered by their session through the exactly-once path of a user
//! message, and the heartbeat.
//!
//! A run of job `J` scheduled at `T` is the inbound event `cron:J@T` (or `cron-text:J@T` for a
//! text delivered as it is) on the target's channel. The journal deduplicates by (channel, event
//! id), so the same occurrence found due twice (two timers, a restart before the run was
//! recorded) is journaled once and answered once; the reply is written to the outbox in the same
//! batch that marks the event done, as for every user message. The job moves to its next
//! occurrence only when its session reports how the run ended ([`Scheduler::finished`]); a run
//! interrupted by a crash is replayed from the journal at the next start and reported then.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use clawft_channel_core::{
    ChannelId, ChatId, InboundEvent, Origin, PlatformEventId, ThreadId, UserId,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::catchup::Run;
use super::jobs::{Deliver, Job, JobError, JobStore, Outcome, Target};
use super::settings::{HeartbeatSettings, SchedulerSettings};
use crate::store::{InboxEntry, InboxState, JournalOutcome, Store};
use crate::tools::message::MessageSink;
use crate::types::session_key::SYSTEM_SENDER;
use crate::types::MutexExt;
use crate::types::SessionKey;

/// Event-id prefix of a scheduled run that is a turn.
pub const TURN_PREFIX: &str = "cron:";
/// Event-id prefix of a scheduled run that delivers its text as it is.
pub const TEXT_PREFIX: &str = "cron-text:";
/// Event-id prefix of a heartbeat turn.
pub const HEARTBEAT_PREFIX: &str = "heartbeat:";
/// The reply that means "nothing to report": a heartbeat reply that is this token (with at
/// most [`HEARTBEAT_ACK_MAX_CHARS`] other characters) is not delivered.
pub const HEARTBEAT_OK: &str = "HEARTBEAT_OK";
/// Characters besides the token that a heartbeat reply may carry and still be dropped (300).
pub const HEARTBEAT_ACK_MAX_CHARS: usize = 300;
/// The heartbeat's instructions file, in the workspace.
pub const HEARTBEAT_FILE: &str = "HEARTBEAT.md";
/// Longest sleep of the timer while jobs exist: the wall clock may jump (suspend, NTP), and
/// a wake-up every few minutes re-reads it.
const MAX_SLEEP: Duration = Duration::from_secs(300);
/// Shortest and longest sleep of the timer when the jobs are shared (cluster mode): jobs
/// added on another node are seen within the longest.
const SHARED_MIN_SLEEP: Duration = Duration::from_millis(200);
const SHARED_MAX_SLEEP: Duration = Duration::from_secs(2);
/// Most bytes of `HEARTBEAT.md` put in a heartbeat turn (16 KiB).
const HEARTBEAT_MAX_BYTES: usize = 16 * 1024;

/// Hands a journaled entry to its session (the bus's inbox); false when the bus is gone.
pub type Router = Arc<dyn Fn(InboxEntry) -> bool + Send + Sync>;

/// Why a run was not started by hand.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The job or the store.
    #[error(transparent)]
    Job(#[from] JobError),
    /// The job has a run going.
    #[error("job `{0}` is running now; runs of one job never overlap: wait for it to finish")]
    Busy(String),
    /// The daemon is not running (no bus to hand the run to).
    #[error("the scheduler is not running")]
    NotRunning,
}

/// Run counts since the start, by outcome, for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RunCounts {
    /// Runs that ended well.
    pub ok: u64,
    /// Runs that failed.
    pub failed: u64,
    /// Runs cancelled (`/stop`, shutdown).
    pub cancelled: u64,
    /// Runs started late (after a downtime).
    pub late: u64,
    /// Seconds of lateness summed over the late runs.
    pub late_seconds: u64,
    /// Heartbeat turns started.
    pub heartbeats: u64,
    /// Heartbeat replies not delivered (nothing to report).
    pub heartbeats_quiet: u64,
}

/// The scheduler of one daemon.
pub struct Scheduler {
    jobs: JobStore,
    store: Store,
    route: OnceLock<Router>,
    sink: Option<Arc<dyn MessageSink>>,
    /// `tools.message.allow`: the chats besides its own that a session may target.
    allow: Vec<String>,
    heartbeat: Option<HeartbeatSettings>,
    workspace: Arc<crate::tools::workspace::Workspace>,
    wake: Notify,
    /// Job id → the run going now.
    running: Mutex<HashMap<String, Run>>,
    heartbeat_running: AtomicBool,
    counts: Mutex<RunCounts>,
}

/// The dedicated session of the heartbeat delivering to `target`: `channel:chat:thread:heartbeat`
/// (four components, so it routes to the target chat yet is not that chat's conversation).
pub fn heartbeat_session(target: &Target) -> Option<SessionKey> {
    SessionKey::from_parts(&[
        &target.channel,
        &target.chat_id,
        target.thread.as_deref().unwrap_or("-"),
        "heartbeat",
    ])
    .ok()
}

/// Whether `HEARTBEAT.md`'s text asks for anything: blank lines, Markdown headings and HTML
/// comments alone do not.
pub fn heartbeat_has_content(text: &str) -> bool {
    let mut in_comment = false;
    for line in text.lines() {
        let mut l = line.trim();
        loop {
            if in_comment {
                match l.find("-->") {
                    Some(i) => {
                        in_comment = false;
                        l = l[i + 3..].trim();
                    }
                    None => break,
                }
            } else if let Some(rest) = l.strip_prefix("<!--") {
                in_comment = true;
                l = rest;
            } else {
                if !l.is_empty() && !l.starts_with('#') {
                    return true;
                }
                break;
            }
        }
    }
    false
}

/// What of a heartbeat reply is delivered: `None` when it says there is nothing to report
/// ([`HEARTBEAT_OK`] at its start or end and at most [`HEARTBEAT_ACK_MAX_CHARS`] other
/// characters); otherwise the reply with the token removed.
pub fn heartbeat_reply(reply: &str) -> Option<String> {
    let t = reply.trim();
    let rest = t
        .strip_prefix(HEARTBEAT_OK)
        .or_else(|| t.strip_suffix(HEARTBEAT_OK));
    match rest {
        Some(rest) => {
            let rest = rest.trim_matches(|c: char| c.is_whitespace() || ".:-!*`".contains(c));
            (rest.chars().count() > HEARTBEAT_ACK_MAX_CHARS).then(|| rest.to_string())
        }
        None => Some(reply.to_string()),
    }
}

impl Scheduler {
    /// A scheduler over the jobs in `store`; runs start once [`Scheduler::attach`] gives it
    /// the bus.
    pub fn new(
        store: Store,
        limits: SchedulerSettings,
        sink: Option<Arc<dyn MessageSink>>,
        allow: Vec<String>,
        heartbeat: Option<HeartbeatSettings>,
        workspace: Arc<crate::tools::workspace::Workspace>,
    ) -> Arc<Self> {
        Self::over(
            JobStore::new(store.clone(), limits),
            store,
            sink,
            allow,
            heartbeat,
            workspace,
        )
    }

    /// [`Scheduler::new`] over the job store `jobs` (in cluster mode, one sharing its jobs:
    /// [`JobStore::sharing`]).
    pub fn over(
        jobs: JobStore,
        store: Store,
        sink: Option<Arc<dyn MessageSink>>,
        allow: Vec<String>,
        heartbeat: Option<HeartbeatSettings>,
        workspace: Arc<crate::tools::workspace::Workspace>,
    ) -> Arc<Self> {
        Arc::new(Self {
            jobs,
            store,
            route: OnceLock::new(),
            sink,
            allow,
            heartbeat,
            workspace,
            wake: Notify::new(),
            running: Mutex::new(HashMap::new()),
            heartbeat_running: AtomicBool::new(false),
            counts: Mutex::new(RunCounts::default()),
        })
    }

    /// Connect it to the bus.
    pub fn attach(&self, route: Router) {
        let _ = self.route.set(route);
    }

    /// Whether it has the bus (runs can start).
    pub fn is_running(&self) -> bool {
        self.route.get().is_some()
    }

    /// The job table.
    pub fn jobs(&self) -> &JobStore {
        &self.jobs
    }

    /// The heartbeat settings in force.
    pub fn heartbeat(&self) -> Option<&HeartbeatSettings> {
        self.heartbeat.as_ref()
    }

    /// Run counts since the start.
    pub fn counts(&self) -> RunCounts {
        *self.counts.locked()
    }

    /// The jobs with a run going now, and their run ids.
    pub fn running(&self) -> Vec<(String, String)> {
        self.lock_running()
            .iter()
            .map(|(j, r)| (j.clone(), r.id.to_string()))
            .collect()
    }

    /// Whether `owner` may have a job deliver to `target`: its own chat, or a chat matched by
    /// `tools.message.allow` (the `message` tool's routes). `None` (the operator) may target any.
    pub fn may_target(&self, owner: Option<&SessionKey>, target: &Target) -> bool {
        let Some(owner) = owner else { return true };
        let (c, chat, thread) = owner.route();
        if c == target.channel
            && chat == target.chat_id
            && (target.thread.is_none() || target.thread.as_deref() == thread)
        {
            return true;
        }
        crate::tools::message::route_listed(&self.allow, &target.channel, &target.chat_id)
    }

    /// Tell the timer that jobs changed (added, updated, resumed).
    pub fn changed(&self) {
        self.wake.notify_one();
    }

    fn lock_running(&self) -> std::sync::MutexGuard<'_, HashMap<String, Run>> {
        self.running.locked()
    }

    /// Start a run of job `id` now, by hand (`cron run`, `weft cron run`): it does not move the
    /// schedule. `owner` limits it to that session's jobs.
    ///
    /// # Errors
    /// [`RunError`].
    pub fn run_now(&self, id: &str, owner: Option<&SessionKey>) -> Result<Run, RunError> {
        let job = self.jobs.get(id, owner)?;
        let run = Run::manual(&job.id, Utc::now());
        self.start(&job, run.clone())?;
        Ok(run)
    }

    /// The timer: start the due runs, sleep until the next one (or a change), until `stop`.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        loop {
            // Shared jobs (cluster mode): reading the shared copy and claiming occurrences
            // wait on the cluster (a few seconds at worst); on the blocking pool, not on the
            // daemon's thread, so chats never wait on them.
            let next = if self.jobs.is_shared() {
                let me = self.clone();
                match tokio::task::spawn_blocking(move || me.tick(Utc::now())).await {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::error!(error = %e, "scheduled jobs tick failed");
                        Some(Utc::now() + chrono::TimeDelta::seconds(60))
                    }
                }
            } else {
                self.tick(Utc::now())
            };
            let sleep = match next {
                Some(t) => (t - Utc::now())
                    .to_std()
                    .unwrap_or(Duration::ZERO)
                    .min(MAX_SLEEP),
                None => Duration::from_secs(24 * 3600),
            };
            // Shared jobs: re-read the shared copy often (jobs added on other nodes), and do
            // not spin on an occurrence that could not be claimed.
            let sleep = if self.jobs.is_shared() {
                sleep.clamp(SHARED_MIN_SLEEP, SHARED_MAX_SLEEP)
            } else {
                sleep
            };
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(sleep) => {}
            }
        }
    }

    /// Start every run due at `now` whose job has none going; the time of the next thing to do.
    pub fn tick(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self.jobs.due(now) {
            Ok(due) => {
                for d in due {
                    if self.lock_running().contains_key(&d.job.id) {
                        continue;
                    }
                    if let Some(run) = d.plan.runs.into_iter().next() {
                        // Shared jobs (cluster mode): the gateway that claims an occurrence
                        // runs it; the others move past it.
                        match self.jobs.claim(&d.job.id, &run) {
                            Ok(None) => {}
                            Ok(Some(other)) => {
                                tracing::debug!(job = %d.job.id, run = %run.id, node = %other, "scheduled run claimed by another node");
                                if let Err(e) = self.jobs.passed(&d.job.id, &run) {
                                    tracing::error!(job = %d.job.id, error = %e, "could not move a scheduled job on");
                                }
                                continue;
                            }
                            Err(e) => {
                                tracing::warn!(job = %d.job.id, error = %e, "scheduled run not claimed (cluster unreachable); retried");
                                continue;
                            }
                        }
                        if let Err(e) = self.start(&d.job, run) {
                            tracing::error!(job = %d.job.id, error = %e, "could not start a scheduled run");
                        }
                    }
                }
            }
            Err(e) => tracing::error!(error = %e, "could not read the scheduled jobs"),
        }
        let running = self.lock_running();
        match self.jobs.list() {
            Ok(jobs) => jobs
                .iter()
                .filter(|j| j.enabled && !running.contains_key(&j.id))
                .filter_map(|j| j.next_run)
                .min(),
            Err(e) => {
                tracing::error!(error = %e, "could not read the scheduled jobs");
                Some(now + chrono::TimeDelta::seconds(60))
            }
        }
    }

    /// The session a run of `job` answers in: the owner's own when the target is its chat (so
    /// a per-user session stays per-user), else the target chat's, served by the owner's agent.
    fn session_of(job: &Job) -> Option<SessionKey> {
        let (c, chat, thread) = job.owner.route();
        let t = &job.target;
        if c == t.channel && chat == t.chat_id && t.thread.as_deref() == thread {
            return Some(job.owner.clone());
        }
        t.session_key()
            .and_then(|k| k.with_agent(job.owner.agent()))
            .ok()
    }

    fn event_of(job: &Job, run: &Run) -> InboundEvent {
        let scheduled = run.scheduled.to_rfc3339_opts(SecondsFormat::Secs, true);
        let late = if run.late {
            format!(
                ", due at {scheduled} and running late because the gateway was not running then"
            )
        } else {
            String::new()
        };
        let (prefix, content) = match job.payload.deliver {
            Deliver::Turn => (
                TURN_PREFIX,
                format!(
                    "[Scheduled task \"{}\" (job {}){late}. The user set this up earlier; do what it says now and answer with the result.]\n{}",
                    job.name, job.id, job.payload.message
                ),
            ),
            Deliver::Text if run.late => (
                TEXT_PREFIX,
                format!(
                    "{}\n\n(Scheduled for {scheduled}; delivered late because the gateway was not running then.)",
                    job.payload.message
                ),
            ),
            Deliver::Text => (TEXT_PREFIX, job.payload.message.clone()),
        };
        // In the owner's chat a run is the asking user's (their memory and budget); elsewhere the
        // gateway's.
        let sender = match &job.created_by {
            Some(u) if job.owner.channel() == job.target.channel => u.clone(),
            _ => SYSTEM_SENDER.to_string(),
        };
        InboundEvent {
            channel: ChannelId::new(job.target.channel.clone()),
            chat: ChatId::new(job.target.chat_id.clone()),
            thread: job.target.thread.clone().map(ThreadId::new),
            sender: UserId::new(sender),
            sender_name: None,
            event_id: PlatformEventId::new(format!("{prefix}{}", run.id)),
            content,
            received_at_ms: clawft_channel_core::now_ms(),
            attachments: Vec::new(),
            origin: clawft_channel_core::Origin::Scheduled {
                run: run.id.to_string(),
                text: matches!(job.payload.deliver, Deliver::Text),
            },
        }
    }

    /// Journal `run` of `job` and hand it to its session, unless its job has a run going.
    fn start(&self, job: &Job, run: Run) -> Result<(), RunError> {
        let route = self.route.get().ok_or(RunError::NotRunning)?;
        let Some(session) = Self::session_of(job) else {
            return Err(RunError::Job(JobError::Invalid {
                field: "target",
                detail: "is not a valid chat (a component is empty or contains `:`)".into(),
            }));
        };
        {
            let mut running = self.lock_running();
            if running.contains_key(&job.id) {
                return Err(RunError::Busy(job.id.clone()));
            }
            running.insert(job.id.clone(), run.clone());
        }
        let ev = Self::event_of(job, &run);
        let outcome = match self.store.journal_inbound(&ev, &session) {
            Ok(o) => o,
            Err(e) => {
                self.lock_running().remove(&job.id);
                return Err(RunError::Job(e.into()));
            }
        };
        match outcome {
            JournalOutcome::New(entry) => {
                tracing::info!(job = %job.id, run = %run.id, late = run.late, session = %session, "scheduled run started");
                if run.late {
                    let mut c = self.lock_counts();
                    c.late += 1;
                    c.late_seconds +=
                        u64::try_from((Utc::now() - run.scheduled).num_seconds()).unwrap_or(0);
                }
                if !route(entry) {
                    tracing::warn!(job = %job.id, "bus gone; the run stays journaled for the next start");
                }
            }
            JournalOutcome::Duplicate => {
                // Journaled before a restart: either answered (record it now) or replayed by
                // its session from the journal (recorded when it finishes).
                let done = self
                    .store
                    .journaled(ev.channel.as_str(), ev.event_id.as_str())
                    .ok()
                    .flatten()
                    .is_none_or(|e| e.state == InboxState::Done);
                if done {
                    tracing::info!(job = %job.id, run = %run.id, "scheduled run answered before a restart; recorded now");
                    self.finished(&ev, Outcome::Ok, Some("answered before a restart".into()));
                } else {
                    tracing::info!(job = %job.id, run = %run.id, "scheduled run resumes from the journal");
                }
            }
        }
        Ok(())
    }

    fn lock_counts(&self) -> std::sync::MutexGuard<'_, RunCounts> {
        self.counts.locked()
    }

    /// Told by a session when it has answered one of the gateway's own events: records a
    /// scheduled run (`outcome`, `detail`) and moves its job on, or ends a heartbeat. Other
    /// events are ignored.
    pub fn finished(&self, ev: &InboundEvent, outcome: Outcome, detail: Option<String>) {
        let id = ev.event_id.as_str();
        let run_id = match &ev.origin {
            Origin::Heartbeat => {
                self.heartbeat_running.store(false, Ordering::Release);
                return;
            }
            Origin::Scheduled { run, .. } => run.as_str(),
            Origin::User | Origin::Subagent | Origin::Session { .. } | Origin::Webhook { .. } => {
                return
            }
        };
        let Some(mut run) = Run::from_id(run_id) else {
            tracing::warn!(event_id = %id, "scheduled run id does not parse; not recorded");
            return;
        };
        let job_id = run.id.job().to_string();
        {
            let mut running = self.lock_running();
            if running.get(&job_id).is_some_and(|r| r.id == run.id) {
                if let Some(r) = running.remove(&job_id) {
                    run.late = r.late;
                }
            }
        }
        {
            let mut c = self.lock_counts();
            match outcome {
                Outcome::Ok => c.ok += 1,
                Outcome::Failed => c.failed += 1,
                Outcome::Cancelled => c.cancelled += 1,
            }
        }
        crate::metrics::inc(
            "clawft_scheduler_runs_total",
            &[("outcome", outcome.as_str())],
            1,
        );
        match self
            .jobs
            .record_run(&job_id, &run, outcome, detail.clone(), Utc::now())
        {
            Ok(r) if r.paused => self.tell_paused(&r.job, detail.as_deref()),
            Ok(_) => {}
            Err(JobError::NotFound { .. }) => {
                tracing::info!(job = %job_id, "scheduled run finished after its job was removed");
            }
            Err(e) => {
                tracing::error!(job = %job_id, error = %e, "could not record a scheduled run")
            }
        }
        self.changed();
    }

    /// Tell the owner's chat that `job` was paused after repeated failures.
    fn tell_paused(&self, job: &Job, detail: Option<&str>) {
        tracing::warn!(job = %job.id, "scheduled job paused after repeated failures");
        let Some(sink) = &self.sink else { return };
        let (c, chat, thread) = job.owner.route();
        let text = format!(
            "Scheduled job \"{}\" ({}) was paused after {} failed runs in a row{}. Resume it with the cron tool (action `update`, `\"enabled\": true`) or `weft cron resume {}` once the cause is fixed.",
            job.name,
            job.id,
            job.consecutive_failures,
            detail.map(|d| format!("; the last error: {d}")).unwrap_or_default(),
            job.id,
        );
        let msg = clawft_channel_core::OutboundMessage::proactive(
            ChannelId::new(c),
            ChatId::new(chat),
            thread.map(ThreadId::new),
            text,
        );
        if let Err(e) = sink.send(msg) {
            tracing::error!(error = %e, "could not queue the pause notice");
        }
    }

    /// The heartbeat: every `heartbeat.every`, a turn with `HEARTBEAT.md` in its own session
    /// when the file asks for anything and the time is inside `active_hours`; until `stop`.
    pub async fn run_heartbeat(self: Arc<Self>, stop: CancellationToken) {
        let Some(every) = self.heartbeat.as_ref().map(|h| h.every) else {
            return;
        };
        let mut timer = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = timer.tick() => {}
            }
            self.beat(Utc::now());
        }
    }

    /// One heartbeat at `now`: whether a turn was started.
    pub fn beat(&self, now: DateTime<Utc>) -> bool {
        let Some(h) = &self.heartbeat else {
            return false;
        };
        if h.active_hours.as_ref().is_some_and(|a| !a.contains(now)) {
            tracing::debug!("heartbeat outside active_hours: skipped");
            return false;
        }
        let text = match self.read_heartbeat_file() {
            Ok(Some(t)) => t,
            Ok(None) => return false,
            Err(e) => {
                tracing::warn!(error = %e, "could not read HEARTBEAT.md; heartbeat skipped");
                return false;
            }
        };
        if !heartbeat_has_content(&text) {
            tracing::debug!(
                "HEARTBEAT.md has nothing to do: heartbeat skipped without a model call"
            );
            return false;
        }
        if self.heartbeat_running.swap(true, Ordering::AcqRel) {
            tracing::info!("previous heartbeat still running: this one skipped");
            return false;
        }
        let (Some(route), Some(session)) = (self.route.get(), heartbeat_session(&h.target)) else {
            self.heartbeat_running.store(false, Ordering::Release);
            return false;
        };
        let ev = InboundEvent {
            channel: ChannelId::new(h.target.channel.clone()),
            chat: ChatId::new(h.target.chat_id.clone()),
            thread: h.target.thread.clone().map(ThreadId::new),
            sender: UserId::new(SYSTEM_SENDER),
            sender_name: None,
            event_id: PlatformEventId::new(format!(
                "{HEARTBEAT_PREFIX}{}",
                uuid::Uuid::now_v7()
            )),
            content: format!(
                "[Heartbeat at {}: a periodic check, not a message from the user. Follow the instructions of HEARTBEAT.md below. If nothing needs the user's attention, reply with exactly {HEARTBEAT_OK} and nothing else; otherwise reply with what they should know.]\n{text}",
                now.to_rfc3339_opts(SecondsFormat::Secs, true)
            ),
            received_at_ms: clawft_channel_core::now_ms(),
            attachments: Vec::new(),
            origin: clawft_channel_core::Origin::Heartbeat,
        };
        match self.store.journal_inbound(&ev, &session) {
            Ok(JournalOutcome::New(entry)) => {
                self.lock_counts().heartbeats += 1;
                crate::metrics::inc("clawft_heartbeats_total", &[], 1);
                route(entry);
                true
            }
            Ok(JournalOutcome::Duplicate) => {
                self.heartbeat_running.store(false, Ordering::Release);
                false
            }
            Err(e) => {
                tracing::error!(error = %e, "could not journal the heartbeat");
                self.heartbeat_running.store(false, Ordering::Release);
                false
            }
        }
    }

    /// `HEARTBEAT.md`, opened beneath the workspace (no symlink out of it), at most
    /// [`HEARTBEAT_MAX_BYTES`]; `None` when it does not exist.
    fn read_heartbeat_file(&self) -> Result<Option<String>, String> {
        Ok(self
            .workspace
            .read_beneath(HEARTBEAT_FILE, HEARTBEAT_MAX_BYTES as u64)
            .map_err(|e| e.to_string())?
            .map(|b| String::from_utf8_lossy(&b).into_owned()))
    }

    /// Count a heartbeat reply that was not delivered.
    pub fn heartbeat_quiet(&self) {
        self.lock_counts().heartbeats_quiet += 1;
        crate::metrics::inc("clawft_heartbeats_quiet_total", &[], 1);
    }
}

#[cfg(test)]
#[path = "runtime_tests.rs"]
mod tests;
