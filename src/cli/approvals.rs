//! `weft approvals`: the tool calls waiting for a person's approval, answered from outside the
//! chat, through the running gateway (approvals live in its memory).

use clap::Subcommand;
use serde_json::{json, Value};

use super::client::GatewayClient;
use super::CliError;
use crate::config::Config;

/// `weft approvals` actions.
#[derive(Debug, Subcommand)]
pub enum ApprovalsAction {
    /// Pending approvals, then the recently answered and expired ones.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Let the waiting tool call run.
    Approve {
        /// The approval's id (from the question in the chat, or `weft approvals list`).
        id: String,
        /// Also stop asking for this command in that session.
        #[arg(long)]
        always: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Refuse the waiting tool call.
    Deny {
        /// The approval's id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Run `weft approvals`.
///
/// # Errors
/// No gateway runs, or it refused the answer (no such pending approval).
pub async fn run(config: &Config, action: ApprovalsAction) -> Result<(), CliError> {
    let c = GatewayClient::detect(config).await?.ok_or_else(|| {
        CliError::Failed(format!(
            "weft approvals needs a running gateway for this config's store ({}), and none runs: approvals exist only while a gateway asks them (start `weft gateway` with this config)",
            config.store.path.display()
        ))
    })?;
    let (v, as_json) = match action {
        ApprovalsAction::List { json } => {
            (c.post("/v1/admin/approvals/list", &json!({})).await?, json)
        }
        ApprovalsAction::Approve { id, always, json } => {
            let decision = if always { "always" } else { "approve" };
            let body = json!({"id": id, "decision": decision});
            (c.post("/v1/admin/approvals/answer", &body).await?, json)
        }
        ApprovalsAction::Deny { id, json } => {
            let body = json!({"id": id, "decision": "deny"});
            (c.post("/v1/admin/approvals/answer", &body).await?, json)
        }
    };
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(CliError::msg)?
        );
    } else if let Some(rows) = v["approvals"].as_array() {
        print!("{}", table(rows));
    } else {
        println!("{}", v["answered"].as_str().unwrap_or_default());
    }
    Ok(())
}

/// The approvals as a table: id, state, asked (UTC), session, command.
fn table(rows: &[Value]) -> String {
    if rows.is_empty() {
        return "no approvals asked since the gateway started\n".into();
    }
    let mut out = format!(
        "{:<10} {:<16} {:<17} {:<24} COMMAND\n",
        "ID", "STATE", "ASKED (UTC)", "SESSION"
    );
    for r in rows {
        let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
        let asked = match r["asked_ms"].as_u64() {
            Some(0) | None => "before restart".to_string(),
            ms => super::human::utc_minute(ms),
        };
        // A question waiting on another node of the cluster says where.
        let session = match r["node"].as_str() {
            Some(n) => format!("{} (node {n})", s("session")),
            None => s("session"),
        };
        out.push_str(&format!(
            "{:<10} {:<16} {:<17} {:<24} {}\n",
            s("id"),
            s("state").replace('_', " "),
            asked,
            session,
            s("command").replace('\n', " ")
        ));
    }
    out
}
