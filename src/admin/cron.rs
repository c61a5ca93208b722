//! The scheduler on the control plane: the `cron/*` admin commands (`weft cron`), the
//! `scheduler` object of the status report and the scheduler's `/metrics` gauges.
//!
//! The operator is not a session: a job added with `cron/add` is owned by the session of its
//! target chat (`channel:chat[:thread]`), so that chat sees and manages it with the `cron` tool
//! like its own, and its limits (`scheduler.max_jobs_per_session`) count there. The operator
//! manages every job (`owner = None`).

use chrono::{DateTime, SecondsFormat, Utc};
use clawft_channel_http::AdminError;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::metrics::Gauge;
use crate::scheduler::runtime::{RunCounts, RunError};
use crate::scheduler::tool::{job_json, run_json};
use crate::scheduler::{
    CatchUp, Deliver, HeartbeatSettings, Job, JobError, NewJob, Payload, Schedule, Scheduler,
    Target,
};
use crate::types::SessionKey;

/// How many upcoming runs the status report lists.
const NEXT_RUNS: usize = 5;

/// The body of `cron/add`: the `cron` tool's `add` fields, with the target required.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AddBody {
    name: String,
    schedule: Schedule,
    message: String,
    #[serde(default)]
    deliver: Option<Deliver>,
    #[serde(default)]
    catch_up: Option<CatchUp>,
    target: Target,
}

fn job_error(e: JobError) -> AdminError {
    if e.is_refusal() {
        AdminError::BadRequest(e.to_string())
    } else {
        AdminError::Internal(e.to_string())
    }
}

fn id(body: &Value) -> Result<&str, AdminError> {
    body["id"]
        .as_str()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            AdminError::BadRequest("`id` (a job id, as `cron/list` shows) is required".into())
        })
}

fn when(t: Option<DateTime<Utc>>) -> Value {
    t.map_or(Value::Null, |t| {
        json!(t.to_rfc3339_opts(SecondsFormat::Secs, true))
    })
}

/// The session that owns a job the operator adds for `target`: the target chat's own.
///
/// # Errors
/// A channel, chat or thread that cannot be part of a session key (empty, or with `:`).
pub fn owner_of(target: &Target) -> Result<SessionKey, AdminError> {
    let mut parts = vec![target.channel.as_str(), target.chat_id.as_str()];
    if let Some(t) = target.thread.as_deref() {
        parts.push(t);
    }
    SessionKey::from_parts(&parts).map_err(|e| {
        AdminError::BadRequest(format!(
            "target: {e}; give a channel id and a chat id (and a thread) without `:`"
        ))
    })
}

/// Run `cron/<name>` on `scheduler`; `channels` are the running channels (a job's target must
/// be one of them).
///
/// # Errors
/// A refusal (bad or missing field, unknown job, a limit) as 400, a store failure as 500.
pub fn command(
    scheduler: &Scheduler,
    channels: &[String],
    name: &str,
    body: &Value,
) -> Result<Value, AdminError> {
    let jobs = scheduler.jobs();
    let now = Utc::now();
    match name {
        "list" => {
            let list = jobs.list().map_err(job_error)?;
            Ok(json!({
                "jobs": list.iter().map(job_json).collect::<Vec<_>>(),
                "running": running_json(scheduler),
            }))
        }
        "add" => {
            let a: AddBody = serde_json::from_value(body.clone())
                .map_err(|e| AdminError::BadRequest(format!("cron/add: {e}")))?;
            if !channels.contains(&a.target.channel) {
                return Err(AdminError::BadRequest(format!(
                    "target.channel: no channel `{}` is running; running channels: {}",
                    a.target.channel,
                    channels.join(", ")
                )));
            }
            let owner = owner_of(&a.target)?;
            let job = jobs
                .add(
                    NewJob {
                        name: a.name,
                        schedule: a.schedule,
                        catch_up: a.catch_up.unwrap_or_default(),
                        payload: Payload {
                            message: crate::types::sanitize_content(&a.message),
                            deliver: a.deliver.unwrap_or_default(),
                        },
                        target: a.target,
                        owner,
                        created_by: None,
                    },
                    now,
                )
                .map_err(job_error)?;
            scheduler.changed();
            Ok(json!({"status": "added", "job": job_json(&job)}))
        }
        "remove" => {
            let job = jobs.remove(id(body)?, None).map_err(job_error)?;
            scheduler.changed();
            Ok(json!({"status": "removed", "id": job.id, "name": job.name}))
        }
        "pause" => {
            let job = jobs.pause(id(body)?, None).map_err(job_error)?;
            scheduler.changed();
            Ok(json!({"status": "paused", "job": job_json(&job)}))
        }
        "resume" => {
            let job = jobs.resume(id(body)?, None, now).map_err(job_error)?;
            scheduler.changed();
            Ok(json!({"status": "resumed", "job": job_json(&job)}))
        }
        "run" => match scheduler.run_now(id(body)?, None) {
            Ok(run) => Ok(json!({
                "status": "started",
                "run_id": run.id.as_str(),
                "note": "the run is queued in its chat and answers there after the current turn",
            })),
            Err(RunError::Job(e)) => Err(job_error(e)),
            Err(e @ RunError::Busy(_)) => Err(AdminError::BadRequest(e.to_string())),
            Err(e @ RunError::NotRunning) => Err(AdminError::Unavailable(e.to_string())),
        },
        "runs" => {
            let id = id(body)?;
            let runs = jobs.runs(id, None).map_err(job_error)?;
            Ok(json!({
                "id": id,
                "runs": runs.iter().rev().map(run_json).collect::<Vec<_>>(),
            }))
        }
        other => Err(AdminError::BadRequest(format!(
            "unknown admin command `cron/{other}`: one of cron/list, cron/add, cron/remove, cron/run, cron/pause, cron/resume, cron/runs"
        ))),
    }
}

fn running_json(scheduler: &Scheduler) -> Value {
    let mut running = scheduler.running();
    running.sort();
    running
        .iter()
        .map(|(job, run)| json!({"id": job, "run_id": run}))
        .collect()
}

/// The `scheduler` object of the status report: job counts, the next runs, the heartbeat and,
/// from a running gateway, the runs going now and the counts since the start.
pub fn scheduler_json(
    jobs: &[Job],
    heartbeat: Option<&HeartbeatSettings>,
    running: Option<&Scheduler>,
) -> Value {
    let enabled = jobs.iter().filter(|j| j.enabled).count();
    let mut next: Vec<&Job> = jobs
        .iter()
        .filter(|j| j.enabled && j.next_run.is_some())
        .collect();
    next.sort_by_key(|j| j.next_run);
    let mut v = json!({
        "jobs": {"total": jobs.len(), "enabled": enabled, "paused": jobs.len() - enabled},
        "next_runs": next.iter().take(NEXT_RUNS).map(|j| json!({
            "id": j.id,
            "name": j.name,
            "next_run": when(j.next_run),
        })).collect::<Vec<_>>(),
        "heartbeat": match heartbeat {
            Some(h) => json!({
                "enabled": true,
                "every_secs": h.every.as_secs(),
                "target": h.target,
            }),
            None => json!({"enabled": false}),
        },
    });
    if let Some(s) = running {
        v["running"] = running_json(s);
        v["counts"] = serde_json::to_value(s.counts()).unwrap_or(Value::Null);
    }
    v
}

/// The scheduler's `/metrics` gauges (and its counts since the start, as counters).
pub fn gauges(jobs: &[Job], counts: RunCounts, now: DateTime<Utc>) -> Vec<Gauge> {
    let enabled = jobs.iter().filter(|j| j.enabled).count();
    #[allow(clippy::cast_precision_loss)]
    let mut out = vec![
        Gauge {
            name: "clawft_scheduler_jobs",
            help: "Scheduled jobs, by state (enabled, paused).",
            labels: vec![("state".into(), "enabled".into())],
            value: enabled as f64,
        },
        Gauge {
            name: "clawft_scheduler_jobs",
            help: "Scheduled jobs, by state (enabled, paused).",
            labels: vec![("state".into(), "paused".into())],
            value: (jobs.len() - enabled) as f64,
        },
    ];
    if let Some(next) = jobs
        .iter()
        .filter(|j| j.enabled)
        .filter_map(|j| j.next_run)
        .min()
    {
        #[allow(clippy::cast_precision_loss)]
        out.push(Gauge {
            name: "clawft_scheduler_next_run_seconds",
            help: "Seconds until the earliest next scheduled run (negative: overdue); absent without enabled jobs.",
            labels: vec![],
            value: (next - now).num_milliseconds() as f64 / 1000.0,
        });
    }
    #[allow(clippy::cast_precision_loss)]
    {
        out.push(Gauge {
            name: "clawft_scheduler_late_runs_total",
            help: "Scheduled runs started late (catch-up after a downtime), since the start.",
            labels: vec![],
            value: counts.late as f64,
        });
        out.push(Gauge {
            name: "clawft_scheduler_lateness_seconds_total",
            help: "Seconds of lateness summed over the late runs, since the start.",
            labels: vec![],
            value: counts.late_seconds as f64,
        });
    }
    out
}
