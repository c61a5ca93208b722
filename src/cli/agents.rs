//! `weft agents list`: the agents of the configuration (the default one, `main`, and every
//! `agents.NAME`), what each runs with, and the `[[bindings]]` that choose them.

use clap::Subcommand;

use super::CliError;
use crate::config::Config;
use crate::types::session_key::DEFAULT_AGENT;

/// `weft agents …`.
#[derive(Debug, Subcommand)]
pub enum AgentsAction {
    /// Every agent: workspace, model, providers, tool layer, and its bindings.
    List {
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Run `weft agents`.
///
/// # Errors
/// Never for `list` (kept for the shape of the other commands).
pub fn run(config: &Config, action: AgentsAction) -> Result<(), CliError> {
    match action {
        AgentsAction::List { json } => {
            let v = list(config);
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&v).map_err(CliError::msg)?
                );
            } else {
                print!("{}", human(&v));
            }
            Ok(())
        }
    }
}

/// The agents as JSON (the admin API's `agents/list` adds their tools and skills).
pub fn list(config: &Config) -> serde_json::Value {
    crate::admin::inspect::agents_json(config)
}

fn human(v: &serde_json::Value) -> String {
    let mut out = String::new();
    for a in v["agents"].as_array().into_iter().flatten() {
        let s = |k: &str| a[k].as_str().unwrap_or("-").to_string();
        let list = |k: &str| {
            a[k].as_array()
                .map(|x| {
                    x.iter()
                        .filter_map(serde_json::Value::as_str)
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default()
        };
        let default = if a["default"].as_bool() == Some(true) {
            " (default: serves what no binding matches)"
        } else {
            ""
        };
        out.push_str(&format!("{}{default}\n", s("name")));
        out.push_str(&format!("  workspace  {}\n", s("workspace")));
        out.push_str(&format!(
            "  model      {} (providers: {})\n",
            s("model"),
            list("providers")
        ));
        out.push_str(&format!("  /model     {}\n", list("models")));
        let b = a["bindings"].as_array().map_or(0, Vec::len);
        if b == 0 {
            out.push_str("  bindings   none\n");
        }
        for x in a["bindings"].as_array().into_iter().flatten() {
            out.push_str(&format!("  binding    {}\n", x.as_str().unwrap_or("")));
        }
    }
    out
}

/// The terminal's chat id for `weft agent --session S --agent NAME`: `S@NAME` (the gateway
/// reads the agent from it), `S` for the default agent or none.
///
/// # Errors
/// An agent the configuration does not have (naming those it has).
pub fn terminal_session(
    config: &Config,
    session: &str,
    agent: Option<&str>,
) -> Result<String, CliError> {
    if session.contains('@') {
        return Err(CliError::Failed(format!(
            "`{session}`: a session name cannot contain `@` (it names the agent); use --agent NAME"
        )));
    }
    match agent {
        None | Some(DEFAULT_AGENT) => Ok(session.to_string()),
        Some(a) if config.agent_names().contains(&a) => Ok(format!("{session}@{a}")),
        Some(a) => Err(CliError::Failed(format!(
            "no agent named `{a}`; agents: {} (`weft agents list`)",
            config.agent_names().join(", ")
        ))),
    }
}
