//! `weft tools list|call`: the built-in tools as the configured policy sees them, and one tool
//! call run exactly as the daemon would (policy, rate limit, sandbox, scrubbing, truncation).

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::CliError;
use crate::config::Config;
use crate::daemon::build_registry;
use crate::tools::policy::group_of;
use crate::tools::ToolContext;
use crate::types::SessionKey;

/// `weft tools` actions.
#[derive(Debug, clap::Subcommand)]
pub enum ToolsAction {
    /// List the built-in tools: name, group, parameters, whether the policy allows it.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run one tool call and print its JSON result (exit code 1 when the result is an error).
    Call {
        /// Tool name, e.g. `read_file`.
        name: String,
        /// Arguments as a JSON object.
        #[arg(long, default_value = "{}")]
        args: String,
        /// Workspace directory (default: agents.defaults.workspace).
        #[arg(long, value_name = "DIR")]
        workspace: Option<PathBuf>,
        /// Session key the call is made for (rate limits, message routes).
        #[arg(long, default_value = "cli:tools")]
        session: String,
    },
}

/// Summary of a JSON schema's properties: `path*, offset, limit` (`*` = required).
fn params_summary(schema: &Value) -> String {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    schema["properties"]
        .as_object()
        .map(|props| {
            props
                .keys()
                .map(|k| {
                    if required.contains(&k.as_str()) {
                        format!("{k}*")
                    } else {
                        k.clone()
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

/// Run a `weft tools` action.
///
/// # Errors
/// Bad arguments, an unusable workspace, or (for `call`) a tool error result.
pub async fn run(config: &Config, action: ToolsAction) -> Result<(), CliError> {
    match action {
        ToolsAction::List { json } => {
            // `subagents` is listed (it is a built-in tool) though it only runs in the gateway.
            let hub = crate::subagent::SubagentHub::new(config.tools.subagents.clone());
            let reg = build_registry(config, None, None, Vec::new(), Some(hub));
            let rows: Vec<Value> = reg
                .all()
                .into_iter()
                .map(|s| {
                    let t = &s.tool;
                    let schema = t.parameters();
                    json!({
                        "name": t.name(),
                        "group": group_of(t.name()),
                        "allowed": reg.policy().allows(t.name()),
                        "internal": s.internal,
                        "parameters": params_summary(&schema),
                        "description": t.description(),
                    })
                })
                .collect();
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&rows).map_err(CliError::msg)?
                );
            } else {
                println!("{:<16} {:<10} {:<8} PARAMETERS", "TOOL", "GROUP", "ALLOWED");
                for r in &rows {
                    println!(
                        "{:<16} {:<10} {:<8} {}",
                        r["name"].as_str().unwrap_or_default(),
                        r["group"].as_str().unwrap_or("-"),
                        if r["allowed"] == json!(true) {
                            "yes"
                        } else {
                            "no"
                        },
                        r["parameters"].as_str().unwrap_or_default()
                    );
                }
                println!(
                    "\nprofile: {:?}; * = required parameter; `message` is available in sessions only",
                    reg.policy().profile()
                );
            }
            Ok(())
        }
        ToolsAction::Call {
            name,
            args,
            workspace,
            session,
        } => {
            let mut config = config.clone();
            if let Some(w) = workspace {
                config.agent.workspace = w;
            }
            let session = SessionKey::parse(&session).map_err(CliError::msg)?;
            let reg = build_registry(&config, None, None, Vec::new(), None);
            let ws = super::open_workspace(&config)?;
            let ctx = ToolContext {
                workspace: Arc::new(ws),
                session,
                cancel: CancellationToken::new(),
            };
            // Ctrl-C cancels the call like `/stop` would (child processes are killed).
            let cancel = ctx.cancel.clone();
            let watcher = tokio::spawn(async move {
                if tokio::signal::ctrl_c().await.is_ok() {
                    cancel.cancel();
                }
            });
            let outcome = reg.dispatch(&name, "cli", &args, &ctx).await;
            watcher.abort();
            println!("{}", outcome.content());
            match outcome.error {
                None => Ok(()),
                Some(e) => Err(CliError(format!("{} ({})", name, e.code()))),
            }
        }
    }
}

/// `weft skills list`: every skill as JSON.
///
/// # Errors
/// The workspace cannot be opened.
pub fn skills_list(config: &Config) -> Result<(), CliError> {
    let ws = super::open_workspace(config)?;
    let dirs = crate::skills::SkillDirs {
        global: Some(config.home.join("skills")),
        workspace: Arc::new(ws),
    };
    let rows: Vec<Value> = dirs
        .load()
        .into_iter()
        .map(|s| {
            json!({
                "name": s.name,
                "source": s.source,
                "description": s.description,
                "allowed_tools": s.allowed_tools,
            })
        })
        .collect();
    println!(
        "{}",
        serde_json::to_string_pretty(&rows).map_err(CliError::msg)?
    );
    Ok(())
}
