//! The scheduler on the control plane: the `cron/*` admin commands (`weft cron`), the
//! `scheduler` object of the status report and the scheduler's `/metrics` gauges.
//!
//! The operator is not a session: a job added with `cron/add` is owned by the session of its
//! target chat (`channel:chat[:thread]`), so that chat sees and manages it with the `cron` tool
//! like its own, and its limits (`scheduler.max_jobs_per_session`) count there. The operator
//! manages every job (`owner = None`).

use chrono::{DateTime, SecondsFormat, Utc};
use clawft_channel_http::AdminError;
use serde_json::{json, Value};

use crate::metrics::Gauge;
use crate::scheduler::runtime::{RunCounts, RunError};
use crate::scheduler::tool::{running_json, Caller, ACTIONS};
use crate::scheduler::{HeartbeatSettings, Job, Scheduler};
use crate::tools::ToolError;

/// How many upcoming runs the status report lists.
const NEXT_RUNS: usize = 5;

fn when(t: Option<DateTime<Utc>>) -> Value {
    t.map_or(Value::Null, |t| {
        json!(t.to_rfc3339_opts(SecondsFormat::Secs, true))
    })
}

/// Run `cron/<name>` on `scheduler` as the operator (`scheduler::tool::apply`, the `cron`
/// tool's implementation, with every job in reach); `channels` are the running channels (a
/// new job's target must be one of them).
///
/// # Errors
/// A refusal (bad or missing field, unknown job, a limit, a busy job) as 400, the scheduler not
/// running as 503, a store failure as 500.
pub fn command(
    scheduler: &Scheduler,
    channels: &[String],
    name: &str,
    body: &Value,
) -> Result<Value, AdminError> {
    let mut args = match body {
        Value::Object(m) => Value::Object(m.clone()),
        Value::Null => json!({}),
        _ => {
            return Err(AdminError::BadRequest(format!(
                "cron/{name}: the body must be a JSON object"
            )))
        }
    };
    if !ACTIONS.contains(&name) {
        return Err(AdminError::BadRequest(format!(
            "unknown admin command `cron/{name}`: one of cron/{}",
            ACTIONS.join(", cron/")
        )));
    }
    if name == "run" && !scheduler.is_running() {
        return Err(AdminError::Unavailable(RunError::NotRunning.to_string()));
    }
    args["action"] = json!(name);
    crate::scheduler::tool::apply(scheduler, args, Caller::Operator { channels }).map_err(|e| {
        match e {
            ToolError::ExecutionFailed(m) | ToolError::Fatal(m) => AdminError::Internal(m),
            other => AdminError::BadRequest(other.to_string()),
        }
    })
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
