//! The `cron` tool (seed 004, group `automation`): a session adds, lists, changes, removes and
//! runs its own scheduled jobs. A job delivers to the session's own chat unless the operator's
//! `tools.message.allow` lists another; the limits are `scheduler.*`.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::Utc;
use serde::Deserialize;
use serde_json::{json, Value};

use super::catchup::CatchUp;
use super::jobs::{Deliver, Job, JobError, JobPatch, NewJob, Payload, RunRecord, Target};
use super::runtime::{RunError, Scheduler};
use super::schedule::Schedule;
use crate::tools::{parse_args, Effect, Tool, ToolContext, ToolError};
use crate::types::SessionKey;

/// Arguments of `cron`; which fields an action reads is in [`CronTool::parameters`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CronArgs {
    action: String,
    id: Option<String>,
    name: Option<String>,
    schedule: Option<Schedule>,
    message: Option<String>,
    deliver: Option<Deliver>,
    target: Option<Target>,
    catch_up: Option<CatchUp>,
    enabled: Option<bool>,
}

/// The JSON Schema of the tool's arguments.
const PARAMETERS: &str = r#"{"type":"object","properties":{
"action":{"enum":["add","list","update","remove","run","runs"]},
"id":{"type":"string"},"name":{"type":"string"},
"schedule":{"type":"object","description":"{kind:at,at:RFC3339+offset} | {kind:every,seconds} | {kind:cron,expr,tz}","properties":{"kind":{"enum":["at","every","cron"]},"at":{"type":"string"},"seconds":{"type":"integer"},"expr":{"type":"string"},"tz":{"type":"string"}},"required":["kind"]},
"message":{"type":"string"},"deliver":{"enum":["turn","text"]},
"target":{"type":"object","description":"another chat (if allowed); default this one","properties":{"channel":{"type":"string"},"chat_id":{"type":"string"},"thread":{"type":"string"}},"required":["channel","chat_id"]},
"catch_up":{"enum":["once","all","skip"]},"enabled":{"type":"boolean"}},
"required":["action"]}"#;

/// The `cron` tool.
pub struct CronTool {
    scheduler: Arc<Scheduler>,
}

impl CronTool {
    /// The tool over `scheduler`.
    pub fn new(scheduler: Arc<Scheduler>) -> Self {
        Self { scheduler }
    }
}

/// A recorded run as the tool, `weft cron runs` and the admin API show it: its stored form.
pub fn run_json(r: &RunRecord) -> Value {
    serde_json::to_value(r).unwrap_or(Value::Null)
}

/// A job as shown (derived, so it shares the serialisers of the stored records; a `json!` of
/// the same fields is several KB of code).
#[derive(serde::Serialize)]
struct JobView<'a> {
    id: &'a str,
    name: &'a str,
    schedule: &'a Schedule,
    catch_up: CatchUp,
    message: &'a str,
    deliver: Deliver,
    target: &'a Target,
    owner: &'a str,
    enabled: bool,
    paused_reason: Option<&'a str>,
    next_run: Option<chrono::DateTime<Utc>>,
    last_run: Option<&'a RunRecord>,
    consecutive_failures: u32,
}

/// A job as the tool, `weft cron` and the admin API show it.
pub fn job_json(j: &Job) -> Value {
    serde_json::to_value(JobView {
        id: &j.id,
        name: &j.name,
        schedule: &j.schedule,
        catch_up: j.catch_up,
        message: &j.payload.message,
        deliver: j.payload.deliver,
        target: &j.target,
        owner: j.owner.as_str(),
        enabled: j.enabled,
        paused_reason: j.paused_reason.as_deref(),
        next_run: j.next_run.filter(|_| j.enabled),
        last_run: j.last_run.as_ref(),
        consecutive_failures: j.consecutive_failures,
    })
    .unwrap_or(Value::Null)
}

fn job_error(e: JobError) -> ToolError {
    // `ToolError::NotFound` means an unknown tool; an unknown job id is a bad argument.
    if e.is_refusal() {
        ToolError::InvalidArgs(e.to_string())
    } else {
        ToolError::ExecutionFailed(e.to_string())
    }
}

/// The runs going now: `[{id, run_id}]`, by job id.
pub fn running_json(scheduler: &Scheduler) -> Value {
    let mut running = scheduler.running();
    running.sort();
    running
        .iter()
        .map(|(job, run)| json!({"id": job, "run_id": run}))
        .collect()
}

/// The actions [`apply`] knows.
pub const ACTIONS: &[&str] = &[
    "add", "list", "update", "remove", "run", "runs", "pause", "resume",
];

/// Who manages jobs: a session through the `cron` tool, or the operator (`weft cron`, the
/// admin API's `cron/*`).
#[derive(Clone, Copy, Debug)]
pub enum Caller<'a> {
    /// A session: its own jobs only; targets its own chat or a chat `tools.message.allow`
    /// lists; a job it adds is its sender's.
    Session {
        /// The session.
        session: &'a SessionKey,
        /// Its chat user (sender id), if any.
        sender: Option<&'a str>,
    },
    /// The operator: every job. A job it adds needs a target on a running channel and is owned
    /// by the target chat's session (that chat sees and manages it with the `cron` tool).
    Operator {
        /// The channels running now.
        channels: &'a [String],
    },
}

impl Caller<'_> {
    fn owner(&self) -> Option<&SessionKey> {
        match self {
            Caller::Session { session, .. } => Some(session),
            Caller::Operator { .. } => None,
        }
    }
}

/// The session of the chat `target` names (`channel:chat[:thread]`).
fn session_of(target: &Target) -> Result<SessionKey, ToolError> {
    target.session_key().map_err(|e| {
        ToolError::InvalidArgs(format!(
            "target: {e}; give a channel id and a chat id (and a thread) without `:`"
        ))
    })
}

/// The target of a new or changed job, checked against what `caller` may reach.
fn target(
    scheduler: &Scheduler,
    caller: Caller<'_>,
    given: Option<Target>,
) -> Result<Target, ToolError> {
    match caller {
        Caller::Session { session, .. } => {
            let (c, chat, thread) = session.route();
            let target = given.unwrap_or_else(|| Target {
                channel: c.to_string(),
                chat_id: chat.to_string(),
                thread: thread.map(str::to_string),
            });
            if !scheduler.may_target(Some(session), &target) {
                return Err(ToolError::PermissionDenied(format!(
                    "this session may schedule only for its own chat; {}:{} is not in tools.message.allow (the operator's list of other chats)",
                    target.channel, target.chat_id
                )));
            }
            Ok(target)
        }
        Caller::Operator { channels } => {
            let target = given.ok_or_else(|| {
                ToolError::InvalidArgs("`target` ({channel, chat_id, thread?}) is required".into())
            })?;
            if !channels.contains(&target.channel) {
                return Err(ToolError::InvalidArgs(format!(
                    "target.channel: no channel `{}` is running; running channels: {}",
                    target.channel,
                    channels.join(", ")
                )));
            }
            session_of(&target)?;
            Ok(target)
        }
    }
}

fn id(a: &CronArgs) -> Result<&str, ToolError> {
    a.id.as_deref().filter(|s| !s.is_empty()).ok_or_else(|| {
        ToolError::InvalidArgs(format!(
            "`id` is required for `{}`; `list` shows the ids",
            a.action
        ))
    })
}

/// Run one `cron` action for `caller`: the `cron` tool's and the operator's one implementation.
/// Besides the tool's actions (`add`, `list`, `update`, `remove`, `run`, `runs`), `pause` and
/// `resume` take an `id`.
///
/// # Errors
/// `INVALID_ARGS` (a field, a limit, a busy job), `NOT_FOUND` (not a job of the caller),
/// `PERMISSION_DENIED` (a target the session may not reach), `EXECUTION_FAILED` (the store).
pub fn apply(scheduler: &Scheduler, args: Value, caller: Caller<'_>) -> Result<Value, ToolError> {
    let a: CronArgs = parse_args("cron", args)?;
    let owner = caller.owner();
    let jobs = scheduler.jobs();
    let now = Utc::now();
    let out = match a.action.as_str() {
        "add" => {
            let (Some(name), Some(schedule), Some(message)) =
                (a.name.clone(), a.schedule.clone(), a.message.clone())
            else {
                return Err(ToolError::InvalidArgs(
                    "`add` needs `name`, `schedule` and `message`".into(),
                ));
            };
            let target = target(scheduler, caller, a.target)?;
            let (owner, created_by) = match caller {
                Caller::Session { session, sender } => {
                    (session.clone(), sender.map(str::to_string))
                }
                Caller::Operator { .. } => (session_of(&target)?, None),
            };
            let job = jobs
                .add(
                    NewJob {
                        name,
                        schedule,
                        catch_up: a.catch_up.unwrap_or_default(),
                        payload: Payload {
                            message: crate::types::sanitize_content(&message),
                            deliver: a.deliver.unwrap_or_default(),
                        },
                        target,
                        owner,
                        created_by,
                    },
                    now,
                )
                .map_err(job_error)?;
            json!({"status": "added", "job": job_json(&job)})
        }
        "list" => {
            let list = match owner {
                Some(o) => jobs.list_by_owner(o),
                None => jobs.list(),
            }
            .map_err(job_error)?;
            return Ok(json!({
                "jobs": list.iter().map(job_json).collect::<Vec<_>>(),
                "running": running_json(scheduler),
            }));
        }
        "update" => {
            let id = id(&a)?.to_string();
            let target = match a.target {
                Some(t) => Some(target(scheduler, caller, Some(t))?),
                None => None,
            };
            let payload = if a.message.is_some() || a.deliver.is_some() {
                let old = jobs.get(&id, owner).map_err(job_error)?.payload;
                Some(Payload {
                    message: a
                        .message
                        .as_deref()
                        .map_or(old.message, crate::types::sanitize_content),
                    deliver: a.deliver.unwrap_or(old.deliver),
                })
            } else {
                None
            };
            let patch = JobPatch {
                name: a.name.clone(),
                schedule: a.schedule.clone(),
                catch_up: a.catch_up,
                payload,
                target,
            };
            let mut job = jobs.update(&id, owner, patch, now).map_err(job_error)?;
            match a.enabled {
                Some(false) => job = jobs.pause(&id, owner).map_err(job_error)?,
                Some(true) => job = jobs.resume(&id, owner, now).map_err(job_error)?,
                None => {}
            }
            json!({"status": "updated", "job": job_json(&job)})
        }
        "pause" => {
            let job = jobs.pause(id(&a)?, owner).map_err(job_error)?;
            json!({"status": "paused", "job": job_json(&job)})
        }
        "resume" => {
            let job = jobs.resume(id(&a)?, owner, now).map_err(job_error)?;
            json!({"status": "resumed", "job": job_json(&job)})
        }
        "remove" => {
            let job = jobs.remove(id(&a)?, owner).map_err(job_error)?;
            json!({"status": "removed", "id": job.id, "name": job.name})
        }
        "run" => {
            return match scheduler.run_now(id(&a)?, owner) {
                Ok(run) => Ok(json!({
                    "status": "started",
                    "run_id": run.id.as_str(),
                    "note": "the run is queued in its chat and answers there after the current turn"
                })),
                Err(RunError::Job(e)) => Err(job_error(e)),
                Err(e @ RunError::Busy(_)) => Err(ToolError::InvalidArgs(e.to_string())),
                Err(e) => Err(ToolError::ExecutionFailed(e.to_string())),
            };
        }
        "runs" => {
            let id = id(&a)?;
            let runs = jobs.runs(id, owner).map_err(job_error)?;
            // A session sees the last 20 (they go into the model's context); the operator all.
            let shown = if owner.is_some() { 20 } else { usize::MAX };
            return Ok(
                json!({"id": id, "runs": runs.iter().rev().take(shown).map(run_json).collect::<Vec<_>>()}),
            );
        }
        other => {
            return Err(ToolError::InvalidArgs(format!(
                "unknown action `{other}`; one of {}",
                ACTIONS.join(", ")
            )))
        }
    };
    scheduler.changed();
    Ok(out)
}

#[async_trait]
impl Tool for CronTool {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::Cron.name()
    }
    fn description(&self) -> &str {
        "Schedule work in this chat: a reminder (deliver text: sent as is) or a task (deliver turn: you get the message then). Actions: add, list, update (enabled false/true pauses/resumes), remove, run (now), runs (history). Times need the user's offset or tz."
    }
    fn parameters(&self) -> Value {
        // Parsed from text once (a `json!` literal of this size is ~9 KB of code); asked for at
        // every request, like `schema_of`'s cache.
        static SCHEMA: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
        SCHEMA
            .get_or_init(|| serde_json::from_str(PARAMETERS).unwrap_or_default())
            .clone()
    }
    fn effect(&self) -> Effect {
        Effect::Writes
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        if self.scheduler.jobs().is_shared() {
            // Shared jobs (cluster mode): the change waits on the cluster (a few seconds at
            // worst), on the blocking pool rather than the daemon's thread.
            let scheduler = self.scheduler.clone();
            let session = ctx.session.clone();
            let sender = ctx.sender.clone();
            return tokio::task::spawn_blocking(move || {
                apply(
                    &scheduler,
                    args,
                    Caller::Session {
                        session: &session,
                        sender: sender.as_deref(),
                    },
                )
            })
            .await
            .map_err(|e| ToolError::ExecutionFailed(e.to_string()))?;
        }
        apply(
            &self.scheduler,
            args,
            Caller::Session {
                session: &ctx.session,
                sender: ctx.sender.as_deref(),
            },
        )
    }
}
