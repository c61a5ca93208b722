//! The `nodes` tool (seed 004): the user's other machines paired with the gateway (`weft node`
//! on each). The model lists them, describes one, runs a command in its workspace (in the
//! node's own jail), and reads, writes or lists files there. Opt-in ([`super::builtin::Builtin::opt_in`])
//! and denied to every subagent.
//!
//! The tool sits below the gateway: it talks to the connected nodes through [`NodeControl`],
//! implemented by the admin layer and put in a [`NodesSlot`] once the gateway runs.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{parse_args, Effect, Tool, ToolContext, ToolError};
use crate::types::{MutexExt as _, SessionKey};

/// Most commands remembered per session by an "always" answer (as for local commands).
const MAX_ALWAYS_PER_SESSION: usize = 1_000;

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
    /// `timeout`; the node's text answer, or why it failed.
    ///
    /// # Errors
    /// See [`NodeCallError`].
    async fn call(
        &self,
        node: &str,
        op: &str,
        args: Value,
        timeout: Duration,
    ) -> Result<String, NodeCallError>;
}

/// Why a call on a node has no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeCallError {
    /// A paired node that is not connected now.
    #[error("node `{0}` is offline")]
    Offline(String),
    /// No approved node has that name or id.
    #[error("no node `{node}`; paired nodes: {}", if .paired.is_empty() { "none".to_string() } else { .paired.join(", ") })]
    Unknown {
        /// The name asked for.
        node: String,
        /// The names of the approved nodes.
        paired: Vec<String>,
    },
    /// The node does not offer the operation.
    #[error("node `{node}` does not offer `{op}` (it offers: {})", .offers.join(", "))]
    NotOffered {
        /// The node's name.
        node: String,
        /// The operation asked for.
        op: String,
        /// What it offers.
        offers: Vec<String>,
    },
    /// The connection was gone before the call was sent.
    #[error("node `{0}` disconnected")]
    Disconnected(String),
    /// The connection ended while the call ran (the node stops what it ran).
    #[error(
        "node `{0}` disconnected before answering; a command it was running was stopped there"
    )]
    DroppedCall(String),
    /// No answer in time; the call was cancelled on the node.
    #[error("node `{node}` did not answer within {secs} s; the call was cancelled")]
    TimedOut {
        /// The node's name.
        node: String,
        /// The time allowed.
        secs: u64,
    },
    /// The node answered with an error (its own words).
    #[error("{0}")]
    Failed(String),
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
    message: Option<String>,
    title: Option<String>,
    urgency: Option<String>,
}

/// The `nodes` tool.
pub struct NodesTool {
    slot: NodesSlot,
    /// `Some` when the gateway asks a person before its own commands (`tools.exec.mode =
    /// "ask"`): commands on nodes are put to the same approver, or refused without one.
    ask: Option<Ask>,
    /// The nodes this agent may reach (`agents.*.nodes`); `None`: every approved node.
    allowed: Option<Vec<String>>,
}

/// Who approves commands on nodes, and how long they have.
struct Ask {
    approver: Option<Arc<dyn super::shell_policy::Approver>>,
    timeout: Duration,
    /// Per session, the `(node id, command)` pairs answered "always": not asked again in that
    /// session (in memory only, as for local commands).
    always: Mutex<HashMap<SessionKey, HashSet<(String, String)>>>,
}

impl NodesTool {
    /// The tool over `slot`.
    pub fn new(slot: NodesSlot) -> Self {
        Self {
            slot,
            ask: None,
            allowed: None,
        }
    }

    /// Reach only these nodes (names or ids).
    #[must_use]
    pub fn only(mut self, nodes: Option<Vec<String>>) -> Self {
        self.allowed = nodes;
        self
    }

    fn may_reach(&self, node: &Value) -> bool {
        self.allowed.as_ref().is_none_or(|a| {
            a.iter().any(|n| {
                Some(n.as_str()) == node["name"].as_str() || Some(n.as_str()) == node["id"].as_str()
            })
        })
    }

    /// Ask `approver` (within `timeout`) before every command on a node, as in `ask` mode for
    /// the gateway's own commands; without an approver such commands are refused.
    #[must_use]
    pub fn with_approval(
        mut self,
        approver: Option<Arc<dyn super::shell_policy::Approver>>,
        timeout: Duration,
    ) -> Self {
        self.ask = Some(Ask {
            approver,
            timeout,
            always: Mutex::default(),
        });
        self
    }
}

fn need(v: Option<String>, what: &str, action: &str) -> Result<String, ToolError> {
    v.ok_or_else(|| ToolError::InvalidArgs(format!("`{what}` is required for `{action}`")))
}

#[async_trait]
impl Tool for NodesTool {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::Nodes.name()
    }
    fn description(&self) -> &str {
        "Work on the user's other machines paired with the gateway (nodes). Actions: list (nodes, online or not, and what each offers), describe (OS, load, disk, uptime of `node`), run (`command` in the node's workspace, sandboxed there; `timeout` seconds, default 60), read (`path`), write (`path`, `content`), list_files (`path`, `.` for the root), notify (a desktop notification on `node`: `message`, optional `title`, `urgency` low/normal/critical). Paths are relative to the node's workspace. Returns: text from the node, or why it failed."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["list", "describe", "run", "read", "write", "list_files", "notify"]},
                "node": {"type": "string", "description": "node name or id"},
                "command": {"type": "string"},
                "path": {"type": "string"},
                "content": {"type": "string"},
                "timeout": {"type": "number"},
                "message": {"type": "string"},
                "title": {"type": "string"},
                "urgency": {"type": "string", "enum": ["low", "normal", "critical"]}
            },
            "required": ["action"]
        })
    }
    fn effect(&self) -> Effect {
        Effect::Writes
    }
    fn time_budget(&self) -> Option<Duration> {
        let approval = self.ask.as_ref().map_or(Duration::ZERO, |a| a.timeout);
        Some(MAX_RUN_TIMEOUT + approval + Duration::from_secs(15))
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
            "list" => {
                let mut v = hub.list();
                if let Some(all) = v["nodes"].as_array() {
                    let kept: Vec<Value> =
                        all.iter().filter(|n| self.may_reach(n)).cloned().collect();
                    v["nodes"] = Value::Array(kept);
                }
                return Ok(v);
            }
            "describe" => ("info", json!({}), FILE_TIMEOUT),
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
            "notify" => (
                "notify",
                json!({"message": need(a.message, "message", action)?, "title": a.title, "urgency": a.urgency}),
                FILE_TIMEOUT,
            ),
            other => {
                return Err(ToolError::InvalidArgs(format!(
                    "unknown action `{other}`; one of list, describe, run, read, write, list_files, notify"
                )))
            }
        };
        let node = need(a.node, "node", action)?;
        if let Some(allowed) = &self.allowed {
            // By name or id, checked against what the hub knows of the node.
            let listed = hub.list();
            let known = listed["nodes"].as_array().and_then(|all| {
                all.iter()
                    .find(|n| n["name"] == node.as_str() || n["id"] == node.as_str())
                    .cloned()
            });
            if !known.is_some_and(|n| self.may_reach(&n)) {
                return Err(ToolError::PermissionDenied(format!(
                    "node `{node}` is not among the nodes this agent may use ({})",
                    allowed.join(", ")
                )));
            }
        }
        if let (Some(ask), "run") = (&self.ask, op) {
            let command = args["command"].as_str().unwrap_or_default();
            // The same command on the same node (by its id, however the model names it),
            // remembered verbatim (trimmed) as for local commands.
            let node_id = hub.list()["nodes"]
                .as_array()
                .and_then(|all| {
                    all.iter()
                        .find(|n| n["name"] == node.as_str() || n["id"] == node.as_str())
                        .and_then(|n| n["id"].as_str().map(str::to_string))
                })
                .unwrap_or_else(|| node.clone());
            let key = (node_id, command.trim().to_string());
            let remembered = ask
                .always
                .locked()
                .get(&ctx.session)
                .is_some_and(|s| s.contains(&key));
            if !remembered {
                let Some(approver) = &ask.approver else {
                    return Err(ToolError::PermissionDenied(
                        "commands on nodes need a person's approval (tools.exec.mode = \"ask\") and nobody can be asked here".into(),
                    ));
                };
                let question = format!("[on node {node}] {command}");
                let answer = tokio::select! {
                    r = tokio::time::timeout(ask.timeout, approver.approve(&ctx.session, &question, super::shell_policy::RunsOn::Node)) => r.unwrap_or(super::shell_policy::Approval::Deny),
                    () = ctx.cancel.cancelled() => return Err(ToolError::ExecutionFailed("cancelled".into())),
                };
                match answer {
                    super::shell_policy::Approval::Deny => {
                        return Err(ToolError::PermissionDenied(format!(
                            "the command on node `{node}` was not approved (denied, or no answer in {} s)",
                            ask.timeout.as_secs()
                        )));
                    }
                    super::shell_policy::Approval::AllowAlways => {
                        let mut always = ask.always.locked();
                        let set = always.entry(ctx.session.clone()).or_default();
                        if set.len() < MAX_ALWAYS_PER_SESSION {
                            set.insert(key);
                        }
                    }
                    super::shell_policy::Approval::AllowOnce => {}
                }
            }
        }
        // The node's own limit plus a margin for the round trip; never longer.
        let wait = timeout + Duration::from_secs(5);
        tokio::select! {
            r = hub.call(&node, op, args, wait) => r.map(Value::String).map_err(|e| ToolError::ExecutionFailed(e.to_string())),
            () = ctx.cancel.cancelled() => Err(ToolError::ExecutionFailed("cancelled".into())),
        }
    }
}
