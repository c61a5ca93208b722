//! The `cron` tool (seed 004, group `automation`): a session adds, lists, changes, removes and
//! runs its own scheduled jobs. A job delivers to the session's own chat unless the operator's
//! `tools.message.allow` lists another; the limits are `scheduler.*`.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{SecondsFormat, Utc};
use serde::Deserialize;
use serde_json::{json, Value};

use super::catchup::CatchUp;
use super::jobs::{Deliver, Job, JobError, JobPatch, NewJob, Payload, RunRecord, Target};
use super::runtime::{RunError, Scheduler};
use super::schedule::Schedule;
use crate::tools::{parse_args, Effect, Tool, ToolContext, ToolError};

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
    target: Option<TargetArg>,
    catch_up: Option<CatchUp>,
    enabled: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TargetArg {
    channel: String,
    chat_id: String,
    thread: Option<String>,
}

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

fn when(t: Option<chrono::DateTime<Utc>>) -> Value {
    t.map_or(Value::Null, |t| {
        json!(t.to_rfc3339_opts(SecondsFormat::Secs, true))
    })
}

/// A recorded run as the tool, `weft cron runs` and the admin API show it.
pub fn run_json(r: &RunRecord) -> Value {
    json!({
        "run_id": r.run_id.as_str(),
        "scheduled": when(Some(r.scheduled)),
        "finished": when(Some(r.finished)),
        "outcome": r.outcome.as_str(),
        "late": r.late,
        "detail": r.detail,
    })
}

/// A job as the tool, `weft cron` and the admin API show it.
pub fn job_json(j: &Job) -> Value {
    json!({
        "id": j.id,
        "name": j.name,
        "schedule": j.schedule,
        "catch_up": j.catch_up,
        "message": j.payload.message,
        "deliver": j.payload.deliver,
        "target": j.target,
        "owner": j.owner.as_str(),
        "enabled": j.enabled,
        "paused_reason": j.paused_reason,
        "next_run": when(j.next_run.filter(|_| j.enabled)),
        "last_run": j.last_run.as_ref().map(run_json),
        "consecutive_failures": j.consecutive_failures,
    })
}

fn job_error(e: JobError) -> ToolError {
    if e.is_refusal() {
        match e {
            JobError::NotFound { .. } => ToolError::NotFound(e.to_string()),
            other => ToolError::InvalidArgs(other.to_string()),
        }
    } else {
        ToolError::ExecutionFailed(e.to_string())
    }
}

impl CronTool {
    fn target(&self, ctx: &ToolContext, t: Option<TargetArg>) -> Result<Target, ToolError> {
        let (c, chat, thread) = ctx.session.route();
        let target = match t {
            None => Target {
                channel: c.to_string(),
                chat_id: chat.to_string(),
                thread: thread.map(str::to_string),
            },
            Some(t) => Target {
                channel: t.channel,
                chat_id: t.chat_id,
                thread: t.thread,
            },
        };
        if !self.scheduler.may_target(Some(&ctx.session), &target) {
            return Err(ToolError::PermissionDenied(format!(
                "this session may schedule only for its own chat; {}:{} is not in tools.message.allow (the operator's list of other chats)",
                target.channel, target.chat_id
            )));
        }
        Ok(target)
    }

    fn id(a: &CronArgs) -> Result<&str, ToolError> {
        a.id.as_deref().filter(|s| !s.is_empty()).ok_or_else(|| {
            ToolError::InvalidArgs(format!(
                "`id` is required for `{}`; `list` shows the ids",
                a.action
            ))
        })
    }
}

#[async_trait]
impl Tool for CronTool {
    fn name(&self) -> &str {
        "cron"
    }
    fn description(&self) -> &str {
        "Schedule work in this chat: a reminder (deliver text: sent as is) or a task (deliver turn: you get the message then). Actions: add, list, update (enabled false/true pauses/resumes), remove, run (now), runs (history). Times need the user's offset or tz."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "action": {"enum": ["add", "list", "update", "remove", "run", "runs"]},
                "id": {"type": "string"},
                "name": {"type": "string"},
                "schedule": {
                    "type": "object",
                    "description": "{kind:at,at:RFC3339+offset} | {kind:every,seconds} | {kind:cron,expr,tz}",
                    "properties": {
                        "kind": {"enum": ["at", "every", "cron"]},
                        "at": {"type": "string"},
                        "seconds": {"type": "integer"},
                        "expr": {"type": "string"},
                        "tz": {"type": "string"}
                    },
                    "required": ["kind"]
                },
                "message": {"type": "string"},
                "deliver": {"enum": ["turn", "text"]},
                "target": {
                    "type": "object",
                    "description": "another chat (if allowed); default this one",
                    "properties": {"channel": {"type": "string"}, "chat_id": {"type": "string"}, "thread": {"type": "string"}},
                    "required": ["channel", "chat_id"]
                },
                "catch_up": {"enum": ["once", "all", "skip"]},
                "enabled": {"type": "boolean"}
            },
            "required": ["action"]
        })
    }
    fn effect(&self) -> Effect {
        Effect::Writes
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: CronArgs = parse_args(self.name(), args)?;
        let owner = Some(&ctx.session);
        let jobs = self.scheduler.jobs();
        let now = Utc::now();
        match a.action.as_str() {
            "add" => {
                let (Some(name), Some(schedule), Some(message)) =
                    (a.name.clone(), a.schedule.clone(), a.message.clone())
                else {
                    return Err(ToolError::InvalidArgs(
                        "`add` needs `name`, `schedule` and `message`".into(),
                    ));
                };
                let target = self.target(ctx, a.target)?;
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
                            owner: ctx.session.clone(),
                            created_by: ctx.sender.as_deref().map(str::to_string),
                        },
                        now,
                    )
                    .map_err(job_error)?;
                self.scheduler.changed();
                Ok(json!({"status": "added", "job": job_json(&job)}))
            }
            "list" => {
                let list = jobs.list_by_owner(&ctx.session).map_err(job_error)?;
                Ok(json!({"jobs": list.iter().map(job_json).collect::<Vec<_>>()}))
            }
            "update" => {
                let id = Self::id(&a)?.to_string();
                let id = id.as_str();
                let target = match a.target {
                    Some(t) => Some(self.target(ctx, Some(t))?),
                    None => None,
                };
                let payload = if a.message.is_some() || a.deliver.is_some() {
                    let old = jobs.get(id, owner).map_err(job_error)?.payload;
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
                let mut job = jobs.update(id, owner, patch, now).map_err(job_error)?;
                match a.enabled {
                    Some(false) => job = jobs.pause(id, owner).map_err(job_error)?,
                    Some(true) => job = jobs.resume(id, owner, now).map_err(job_error)?,
                    None => {}
                }
                self.scheduler.changed();
                Ok(json!({"status": "updated", "job": job_json(&job)}))
            }
            "remove" => {
                let id = Self::id(&a)?;
                let job = jobs.remove(id, owner).map_err(job_error)?;
                self.scheduler.changed();
                Ok(json!({"status": "removed", "id": job.id, "name": job.name}))
            }
            "run" => {
                let id = Self::id(&a)?;
                match self.scheduler.run_now(id, owner) {
                    Ok(run) => Ok(json!({
                        "status": "started",
                        "run_id": run.id.as_str(),
                        "note": "the run is queued in its chat and answers there after the current turn"
                    })),
                    Err(RunError::Job(e)) => Err(job_error(e)),
                    Err(e) => Err(ToolError::ExecutionFailed(e.to_string())),
                }
            }
            "runs" => {
                let id = Self::id(&a)?;
                let runs = jobs.runs(id, owner).map_err(job_error)?;
                Ok(
                    json!({"id": id, "runs": runs.iter().rev().take(20).map(run_json).collect::<Vec<_>>()}),
                )
            }
            other => Err(ToolError::InvalidArgs(format!(
                "unknown action `{other}`; one of add, list, update, remove, run, runs"
            ))),
        }
    }
}
