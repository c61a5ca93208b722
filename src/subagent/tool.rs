//! The `subagents` tool: spawn, run, list, status, result, cancel and steer child agents.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{
    CancelReason, CancelTarget, Mode, SpawnRequest, SubagentHub, SupervisorMsg, SupervisorRef,
    TaskRecord, TaskStatus, STEER_SETTLE,
};
use crate::tools::{parse_args, schema_of, Effect, Tool, ToolContext, ToolError};
use crate::types::SessionKey;

/// Timeout of calls to the supervisor (it never awaits anything slow).
const CALL_MS: u64 = 10_000;

#[derive(Deserialize, JsonSchema, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "snake_case")]
enum Action {
    Spawn,
    Run,
    List,
    Status,
    Result,
    Cancel,
    Steer,
}

/// Arguments of `subagents`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// spawn (background; the result arrives later as a message), run (wait for the result),
    /// list, status, result, cancel, steer (restart `id` with a new `task`).
    action: Action,
    /// Self-contained instruction (spawn, run, steer); the subagent does not see this chat.
    task: Option<String>,
    /// Short name for list (default: the task's first words).
    label: Option<String>,
    /// Task id (status, result, steer, cancel); cancel also takes `all` or `last`.
    id: Option<String>,
    /// run: seconds to wait, then cancel (default and max: tools.subagents.run_timeout_secs).
    timeout_secs: Option<u64>,
    /// list: include archived tasks (default: false).
    include_archived: Option<bool>,
}

/// The `subagents` tool.
pub struct SubagentsTool {
    hub: Arc<SubagentHub>,
    description: String,
}

impl SubagentsTool {
    /// A tool reaching the supervisor through `hub`.
    pub fn new(hub: Arc<SubagentHub>) -> Self {
        let s = hub.settings();
        let description = format!(
            "Delegate self-contained work to subagents: child agents with your tools that run in parallel and report back. Limits: {} running overall, {} per agent, depth {}, {} tool rounds, {}s each. Returns: spawn {{id, status}}; run/status/result {{id, status, result, error, usage}}; list {{tasks, running, usage}}; cancel {{cancelled}}; steer {{cancelled, id}}.",
            s.max_concurrent,
            s.max_children_per_agent,
            s.max_spawn_depth,
            s.max_iterations,
            s.run_timeout.as_secs()
        );
        Self { hub, description }
    }

    fn actor(&self) -> Result<&SupervisorRef, ToolError> {
        self.hub.actor().ok_or_else(|| {
            ToolError::ExecutionFailed(
                "subagents only run inside the gateway (`weft gateway` or `weft agent`)".into(),
            )
        })
    }
}

fn call_err(e: impl std::fmt::Display) -> ToolError {
    ToolError::Fatal(format!("the subagent supervisor is not answering: {e}"))
}

/// Start a task; a refusal names the limit.
async fn spawn(actor: &SupervisorRef, req: SpawnRequest) -> Result<super::Spawned, ToolError> {
    ractor::call_t!(actor, |reply| SupervisorMsg::Spawn { req, reply }, CALL_MS)
        .map_err(call_err)?
        .map_err(|e| ToolError::PermissionDenied(e.to_string()))
}

/// One task of `caller`'s tree with its subtree's usage, or `None`.
async fn get(
    actor: &SupervisorRef,
    caller: &SessionKey,
    id: &str,
) -> Result<Option<(TaskRecord, super::TaskUsage)>, ToolError> {
    ractor::call_t!(
        actor,
        |reply| SupervisorMsg::Get {
            caller: caller.clone(),
            id: id.to_string(),
            reply
        },
        CALL_MS
    )
    .map_err(call_err)
}

/// [`get`], with an unknown id an error for the model.
async fn get_known(
    actor: &SupervisorRef,
    caller: &SessionKey,
    id: &str,
) -> Result<(TaskRecord, super::TaskUsage), ToolError> {
    get(actor, caller, id).await?.ok_or_else(|| {
        ToolError::InvalidArgs(format!(
            "no subagent task `{id}` of yours; call subagents list for the ids"
        ))
    })
}

/// Cancel `target` among `caller`'s tasks; the ids cancelled.
async fn cancel(
    actor: &SupervisorRef,
    caller: &SessionKey,
    target: CancelTarget,
    reason: CancelReason,
) -> Result<Vec<String>, ToolError> {
    ractor::call_t!(
        actor,
        |reply| SupervisorMsg::Cancel {
            caller: caller.clone(),
            target,
            reason,
            reply
        },
        CALL_MS
    )
    .map_err(call_err)?
    .map_err(|e| ToolError::InvalidArgs(e.to_string()))
}

fn full(r: &TaskRecord, usage: Option<super::TaskUsage>) -> Value {
    let mut v = r.summary(clawft_channel_core::now_ms());
    v["result"] = json!(r.result);
    v["error"] = json!(r.error);
    v["usage"] = json!(usage.unwrap_or(r.usage));
    v
}

fn need<'a>(v: &'a Option<String>, what: &str, action: &str) -> Result<&'a str, ToolError> {
    v.as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ToolError::InvalidArgs(format!("`{what}` is required for action {action}")))
}

#[async_trait]
impl Tool for SubagentsTool {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::Subagents.name()
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Value {
        schema_of::<Args>()
    }

    fn time_budget(&self) -> Option<Duration> {
        Some(self.hub.settings().run_timeout + Duration::from_secs(30))
    }

    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: Args = parse_args("subagents", args)?;
        let actor = self.actor()?;
        let caller = ctx.session.clone();
        match a.action {
            Action::Spawn | Action::Run => {
                let task = need(&a.task, "task", "spawn/run")?.to_string();
                let mode = if a.action == Action::Run {
                    Mode::Run
                } else {
                    Mode::Spawn
                };
                if a.timeout_secs == Some(0) {
                    return Err(ToolError::InvalidArgs(
                        "timeout_secs must be at least 1".into(),
                    ));
                }
                let req = SpawnRequest {
                    caller: caller.clone(),
                    task,
                    label: a.label,
                    mode,
                    timeout: a.timeout_secs.map(Duration::from_secs),
                };
                let spawned = spawn(actor, req).await?;
                let Some(done) = spawned.done else {
                    let r = &spawned.record;
                    return Ok(json!({
                        "id": r.id,
                        "label": r.label,
                        "status": r.status,
                        "depth": r.depth,
                        "note": "Running in the background. Its result arrives as a message when it finishes; do not wait or poll for it.",
                    }));
                };
                // The child's own timeout bounds the wait. When the caller is cancelled the
                // registry drops this call, and the child goes with its tree: `/stop`, `/new`
                // and shutdown cancel a session's subagents, and a subagent's children hold
                // child tokens of its own.
                let fin = done
                    .await
                    .map_err(|_| call_err("the task ended without a result"))?;
                let usage = get(actor, &caller, &fin.id)
                    .await
                    .ok()
                    .flatten()
                    .map(|(_, u)| u);
                Ok(full(&fin, usage))
            }
            Action::List => {
                let archived = a.include_archived.unwrap_or(false);
                let tasks = ractor::call_t!(
                    actor,
                    |reply| SupervisorMsg::List {
                        caller: caller.clone(),
                        archived,
                        reply
                    },
                    CALL_MS
                )
                .map_err(call_err)?;
                let usage = ractor::call_t!(
                    actor,
                    |reply| SupervisorMsg::Usage { caller, reply },
                    CALL_MS
                )
                .map_err(call_err)?;
                let now = clawft_channel_core::now_ms();
                let running = tasks.iter().filter(|t| t.status.is_active()).count();
                Ok(json!({
                    "tasks": tasks.iter().map(|t| t.summary(now)).collect::<Vec<_>>(),
                    "running": running,
                    "usage": usage,
                }))
            }
            Action::Status | Action::Result => {
                let id = need(&a.id, "id", "status/result")?;
                let (r, usage) = get_known(actor, &caller, id).await?;
                let mut v = full(&r, Some(usage));
                if a.action == Action::Status {
                    if let Some(o) = v.as_object_mut() {
                        o.remove("result");
                    }
                } else if r.status.is_active() {
                    v["note"] = json!("still running: no result yet");
                }
                Ok(v)
            }
            Action::Cancel => {
                let which = need(&a.id, "id", "cancel")?;
                let target = match which {
                    "all" => CancelTarget::All,
                    "last" => CancelTarget::Last,
                    id => CancelTarget::Id(id.to_string()),
                };
                let ids = cancel(actor, &caller, target, CancelReason::ByParent).await?;
                Ok(json!({ "cancelled": ids }))
            }
            Action::Steer => {
                let id = need(&a.id, "id", "steer")?.to_string();
                let task = need(&a.task, "task", "steer")?.to_string();
                let (old, _) = get_known(actor, &caller, &id).await?;
                if old.status != TaskStatus::Running {
                    return Err(ToolError::InvalidArgs(format!(
                        "task `{id}` is not running (it is {}); spawn a new one instead",
                        old.status.as_str()
                    )));
                }
                cancel(
                    actor,
                    &caller,
                    CancelTarget::Id(id.clone()),
                    CancelReason::Steered,
                )
                .await?;
                tokio::time::sleep(STEER_SETTLE).await;
                let req = SpawnRequest {
                    caller,
                    task,
                    label: Some(a.label.unwrap_or(old.label)),
                    mode: Mode::Spawn,
                    timeout: None,
                };
                let spawned = spawn(actor, req).await?;
                Ok(json!({
                    "cancelled": id,
                    "id": spawned.record.id,
                    "label": spawned.record.label,
                    "status": spawned.record.status,
                }))
            }
        }
    }

    fn effect(&self) -> Effect {
        Effect::Executes
    }
}
