//! The `gateway` tool (seed 004, group `automation`): an agent the operator opted in
//! (`also_allow = ["gateway"]`, [`super::builtin::Builtin::opt_in`]) reads the gateway's status and asks
//! for a configuration reload, nothing else. Denied by default and to every subagent.
//!
//! The tool sits below the daemon: it talks to the running gateway through [`GatewayControl`],
//! implemented by the admin layer and put in a [`GatewaySlot`] once the gateway runs. The slot
//! outlives registry rebuilds (a reload builds a new registry with the same slot).

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{parse_args, Effect, Tool, ToolContext, ToolError};

/// What the `gateway` tool may do to the running gateway.
#[async_trait]
pub trait GatewayControl: Send + Sync {
    /// A compact, secret-free status: version, uptime, channels, sessions, scheduler, store.
    async fn status(&self) -> Value;
    /// Reload the configuration file as SIGHUP does: the changes applied, or why the new
    /// configuration was rejected (the running one stays in force).
    async fn reload(&self) -> Result<Vec<String>, String>;
}

/// Where the running gateway puts its [`GatewayControl`]; empty until it runs.
pub type GatewaySlot = Arc<OnceLock<Arc<dyn GatewayControl>>>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GatewayArgs {
    action: String,
}

/// The `gateway` tool.
pub struct GatewayTool {
    slot: GatewaySlot,
}

impl GatewayTool {
    /// The tool over `slot`.
    pub fn new(slot: GatewaySlot) -> Self {
        Self { slot }
    }
}

#[async_trait]
impl Tool for GatewayTool {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::Gateway.name()
    }
    fn description(&self) -> &str {
        "Read the gateway's status (version, uptime, channels, sessions, scheduled jobs, store health) or reload its configuration file (as SIGHUP does) after the operator edited it. Actions: status, reload. Returns: the status, or the changes the reload applied."
    }
    fn parameters(&self) -> Value {
        serde_json::from_str(
            r#"{"type":"object","properties":{"action":{"type":"string","enum":["status","reload"]}},"required":["action"]}"#,
        )
        .unwrap_or_default()
    }
    fn effect(&self) -> Effect {
        Effect::Writes
    }
    async fn execute(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: GatewayArgs = parse_args(self.name(), args)?;
        if a.action != "status" && a.action != "reload" {
            return Err(ToolError::InvalidArgs(format!(
                "unknown action `{}`; one of status, reload",
                a.action
            )));
        }
        let Some(gw) = self.slot.get() else {
            return Err(ToolError::ExecutionFailed(
                "the gateway is not available yet (it is starting, or this is not `weft gateway`)"
                    .into(),
            ));
        };
        if a.action == "status" {
            return Ok(gw.status().await);
        }
        match gw.reload().await {
            Ok(changes) => Ok(json!({"status": "reloaded", "changes": changes})),
            Err(why) => Err(ToolError::ExecutionFailed(format!(
                "the new configuration was rejected and the running one stays in force: {why}"
            ))),
        }
    }
}
