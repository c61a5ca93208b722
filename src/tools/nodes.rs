//! The `nodes` tool (seed 004): the user's other machines paired with the gateway (`weft node`
//! on each). The model lists them, describes one, runs a command in its workspace (in the
//! node's own jail), and reads, writes or lists files there. Opt-in ([`super::policy::OPT_IN`])
//! and denied to every subagent.
//!
//! The tool sits below the gateway: it talks to the connected nodes through [`NodeControl`],
//! implemented by the admin layer and put in a [`NodesSlot`] once the gateway runs.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{parse_args, Effect, Tool, ToolContext, ToolError};

/// Default time a command on a node may run.
pub const DEFAULT_RUN_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest time a command on a node may run.
pub const MAX_RUN_TIMEOUT: Duration = Duration::from_secs(600);
/// Time a file operation on a node may take.
pub const FILE_TIMEOUT: Duration = Duration::from_secs(30);

/// What the `nodes` tool asks of the connected nodes.
#[async_trait]
pub trait NodeControl: Send + Sync {
    /// The approved nodes, online or not, with what each offers.
    fn list(&self) -> Value;
    /// Run `op` with `args` on the node named (or with the id) `node`, waiting at most
    /// `timeout`; the node's text answer, or why it failed (offline, disconnected, refused,
    /// timed out).
    async fn call(
        &self,
        node: &str,
        op: &str,
        args: Value,
        timeout: Duration,
    ) -> Result<String, String>;
}

/// Where the running gateway puts its [`NodeControl`]; empty until it runs.
pub type NodesSlot = Arc<OnceLock<Arc<dyn NodeControl>>>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodesArgs {
    action: String,
    node: Option<String>,
    command: Option<String>,
    path: Option<String>,
    content: Option<String>,
    timeout: Option<f64>,
}

/// The `nodes` tool.
pub struct NodesTool {
    slot: NodesSlot,
    /// Commands on nodes are refused: the gateway's own commands need a person's approval
    /// (`tools.exec.mode = "ask"`), which commands on nodes cannot get yet.
    ask: bool,
}

impl NodesTool {
    /// The tool over `slot`.
    pub fn new(slot: NodesSlot) -> Self {
        Self { slot, ask: false }
    }

    /// Refuse `run` when the gateway asks a person before its own commands (`ask`).
    #[must_use]
    pub fn with_ask(mut self, ask: bool) -> Self {
        self.ask = ask;
        self
    }
}

fn need(v: Option<String>, what: &str, action: &str) -> Result<String, ToolError> {
    v.ok_or_else(|| ToolError::InvalidArgs(format!("`{what}` is required for `{action}`")))
}

#[async_trait]
impl Tool for NodesTool {
    fn name(&self) -> &str {
        "nodes"
    }
    fn description(&self) -> &str {
        "Work on the user's other machines paired with the gateway (nodes). Actions: list (nodes, online or not, and what each offers), describe (OS, load, disk, uptime of `node`), run (`command` in the node's workspace, sandboxed there; `timeout` seconds, default 60), read (`path`), write (`path`, `content`), list_files (`path`, `.` for the root). Paths are relative to the node's workspace. Returns: text from the node, or why it failed."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["list", "describe", "run", "read", "write", "list_files"]},
                "node": {"type": "string", "description": "node name or id"},
                "command": {"type": "string"},
                "path": {"type": "string"},
                "content": {"type": "string"},
                "timeout": {"type": "number"}
            },
            "required": ["action"]
        })
    }
    fn effect(&self) -> Effect {
        Effect::Writes
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: NodesArgs = parse_args(self.name(), args)?;
        let Some(hub) = self.slot.get() else {
            return Err(ToolError::ExecutionFailed(
                "nodes are available only in `weft gateway` (it is starting, or this is another command)"
                    .into(),
            ));
        };
        let action = a.action.as_str();
        let (op, args, timeout) = match action {
            "list" => return Ok(hub.list()),
            "describe" => ("info", json!({}), FILE_TIMEOUT),
            "run" if self.ask => {
                return Err(ToolError::PermissionDenied(
                    "commands on nodes are refused while tools.exec.mode = \"ask\" on the gateway: they cannot be put to a person for approval yet; use read, write and list_files, or ask the operator"
                        .into(),
                ))
            }
            "run" => {
                let t = a
                    .timeout
                    .filter(|t| t.is_finite() && *t > 0.0)
                    .map_or(DEFAULT_RUN_TIMEOUT, Duration::from_secs_f64)
                    .min(MAX_RUN_TIMEOUT);
                (
                    "run",
                    json!({"command": need(a.command, "command", action)?, "timeout": t.as_secs_f64()}),
                    t,
                )
            }
            "read" => (
                "read",
                json!({"path": need(a.path, "path", action)?}),
                FILE_TIMEOUT,
            ),
            "write" => (
                "write",
                json!({"path": need(a.path, "path", action)?, "content": need(a.content, "content", action)?}),
                FILE_TIMEOUT,
            ),
            "list_files" => (
                "list",
                json!({"path": a.path.unwrap_or_else(|| ".".into())}),
                FILE_TIMEOUT,
            ),
            other => {
                return Err(ToolError::InvalidArgs(format!(
                    "unknown action `{other}`; one of list, describe, run, read, write, list_files"
                )))
            }
        };
        let node = need(a.node, "node", action)?;
        // The node's own limit plus a margin for the round trip; never longer.
        let wait = timeout + Duration::from_secs(5);
        tokio::select! {
            r = hub.call(&node, op, args, wait) => r.map(Value::String).map_err(ToolError::ExecutionFailed),
            () = ctx.cancel.cancelled() => Err(ToolError::ExecutionFailed("cancelled".into())),
        }
    }
}
