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
    /// List the tools: the built-in ones and those of the configured MCP servers (connected for
    /// up to 10 s), with group, server, parameters and whether the policy allows each.
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

/// How long `weft tools list` waits for the MCP servers to connect.
const MCP_LIST_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

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
            let mcp = crate::daemon::start_mcp(config);
            let mut sources: Vec<Arc<dyn crate::tools::registry::ToolSource>> = Vec::new();
            if let Some(m) = &mcp {
                eprintln!("(connecting to the MCP servers to list their tools)");
                m.settle(MCP_LIST_WAIT).await;
                for s in m.status() {
                    if s.state != crate::mcp::client::McpState::Connected {
                        eprintln!(
                            "(MCP server `{}` is {}: its tools are not listed)",
                            s.name, s
                        );
                    }
                }
                sources.push(m.clone());
            }
            let reg = build_registry(
                config,
                None,
                None,
                sources,
                crate::daemon::build::RegistryParts {
                    subagents: Some(hub),
                    // Listed (built-ins of the `sessions` group); they read the gateway's store.
                    sessions: Some(crate::session::tools::SessionDirectory::new(
                        crate::store::Store::memory(),
                    )),
                    ..Default::default()
                },
            );
            let rows: Vec<Value> = reg
                .all()
                .into_iter()
                .map(|s| {
                    let t = &s.tool;
                    let schema = t.parameters();
                    let server = t
                        .name()
                        .split_once("__")
                        .map(|(s, _)| s)
                        .filter(|s| config.tools.mcp_servers.iter().any(|m| m.name == *s));
                    json!({
                        "name": t.name(),
                        "group": group_of(t.name()),
                        "server": server,
                        "allowed": reg.policy().allows(t.name()),
                        "internal": s.internal,
                        "parameters": params_summary(&schema),
                        "description": t.description(),
                    })
                })
                .collect();
            if let Some(m) = mcp {
                m.shutdown().await;
            }
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&rows).map_err(CliError::msg)?
                );
            } else {
                let width = rows
                    .iter()
                    .filter_map(|r| r["name"].as_str())
                    .map(str::len)
                    .max()
                    .unwrap_or(0)
                    .max(16);
                println!(
                    "{:<width$} {:<14} {:<8} PARAMETERS",
                    "TOOL", "GROUP", "ALLOWED"
                );
                for r in &rows {
                    let group = match (r["group"].as_str(), r["server"].as_str()) {
                        (_, Some(server)) => format!("mcp:{server}"),
                        (Some(g), None) => g.to_string(),
                        (None, None) => "-".to_string(),
                    };
                    println!(
                        "{:<width$} {:<14} {:<8} {}",
                        r["name"].as_str().unwrap_or_default(),
                        group,
                        match (r["allowed"] == json!(true), r["internal"] == json!(true)) {
                            (true, true) => "skill",
                            (true, false) => "yes",
                            (false, _) => "no",
                        },
                        r["parameters"].as_str().unwrap_or_default()
                    );
                }
                println!(
                    "\nprofile: {}; * = required parameter; `message` is available in sessions only; skill = an internal_only MCP server's tool, offered only while a skill that names it is active",
                    reg.policy().profile().as_str()
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
            let reg = build_registry(&config, None, None, Vec::new(), Default::default());
            let ws = super::open_workspace(&config)?;
            let ctx = ToolContext {
                workspace: Arc::new(ws),
                session,
                cancel: CancellationToken::new(),
                user_dir: None,
                sender: None,
                call_id: None,
                turn: Default::default(),
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
                Some(e) => Err(CliError::Failed(format!("{} ({})", name, e.code()))),
            }
        }
    }
}

/// `weft skills list`: every skill as a table (JSON with `as_json`); where skills go when
/// there are none.
///
/// # Errors
/// The workspace cannot be opened.
pub fn skills_list(config: &Config, as_json: bool) -> Result<(), CliError> {
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
    let hint = format!(
        "no skills found. A skill is a directory with a SKILL.md in {} (this workspace) or {} \
         (every workspace), e.g. {}/weather/SKILL.md:\n\n\
         ---\n\
         name: weather\n\
         description: Look up the weather for a city\n\
         allowed_tools: [\"web_fetch\"]\n\
         ---\n\
         Use web_fetch on https://wttr.in/CITY?format=3 and answer in one line.\n\n\
         (docs/mcp.md: `internal_only` and skills)\n",
        config.agent.workspace.join("skills").display(),
        config.home.join("skills").display(),
        config.agent.workspace.join("skills").display(),
    );
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).map_err(CliError::msg)?
        );
        if rows.is_empty() {
            eprint!("{hint}");
        }
    } else if rows.is_empty() {
        print!("{hint}");
    } else {
        println!(
            "{:<20} {:<10} {:<40} TOOLS",
            "SKILL", "SOURCE", "DESCRIPTION"
        );
        for r in &rows {
            let tools: Vec<&str> = r["allowed_tools"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            println!(
                "{:<20} {:<10} {:<40} {}",
                r["name"].as_str().unwrap_or_default(),
                r["source"].as_str().unwrap_or_default(),
                r["description"].as_str().unwrap_or_default(),
                if tools.is_empty() {
                    "-".to_string()
                } else {
                    tools.join(", ")
                }
            );
        }
    }
    Ok(())
}
