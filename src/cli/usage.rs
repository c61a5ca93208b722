//! `weft usage [--by day|session|model|user] [--days N] [--json]`: tokens and spend from the
//! store, through the running gateway when one holds it; `weft usage --session KEY`: one
//! chat's life day by day, with its turns and the tokens and cost per turn.

use serde_json::{json, Value};

use super::agent::{backend, Backend};
use super::CliError;
use crate::config::Config;

/// How `weft usage` groups its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum UsageBy {
    /// One row per UTC day.
    Day,
    /// One row per session.
    Session,
    /// One row per model.
    Model,
    /// One row per chat user (`channel:sender`).
    User,
    /// One row per agent.
    Agent,
}

impl UsageBy {
    fn as_str(self) -> &'static str {
        match self {
            UsageBy::Day => "day",
            UsageBy::Session => "session",
            UsageBy::Model => "model",
            UsageBy::User => "user",
            UsageBy::Agent => "agent",
        }
    }
}

/// Print the usage table (or its JSON).
///
/// # Errors
/// Neither a gateway nor the store can be reached.
pub async fn run(
    config: &Config,
    by: UsageBy,
    days: u64,
    session: Option<String>,
    as_json: bool,
) -> Result<(), CliError> {
    if let Some(key) = session {
        return run_session(config, &key, days, as_json).await;
    }
    let v = match backend(config).await? {
        Backend::Gateway(c) => {
            c.post(
                "/v1/admin/usage",
                &json!({ "by": by.as_str(), "days": days }),
            )
            .await?
        }
        Backend::Store(s) => {
            crate::admin::usage_json(&s, by.as_str(), days).map_err(CliError::msg)?
        }
    };
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(CliError::msg)?
        );
    } else {
        print!("{}", table(&v, by.as_str()));
    }
    Ok(())
}

/// `weft usage --session KEY`: the chat's days with their turns and cost per turn.
async fn run_session(config: &Config, key: &str, days: u64, as_json: bool) -> Result<(), CliError> {
    crate::types::SessionKey::parse(key).map_err(CliError::msg)?;
    let v = match backend(config).await? {
        Backend::Gateway(c) => {
            c.post("/v1/admin/usage", &json!({ "session": key, "days": days }))
                .await?
        }
        Backend::Store(s) => {
            crate::admin::session_usage_json(&s, key, days).map_err(CliError::msg)?
        }
    };
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(CliError::msg)?
        );
    } else {
        print!("{}", session_table(&v));
    }
    Ok(())
}

fn session_line(key: &str, r: &Value) -> String {
    let n = |k: &str| r[k].as_u64().unwrap_or(0);
    let per_turn = match (
        r["input_tokens_per_turn"].as_u64(),
        r["cost_usd_per_turn"].as_f64(),
    ) {
        (Some(t), Some(c)) => format!("{t:>12} {c:>14.5}"),
        _ => format!("{:>12} {:>14}", "-", "-"),
    };
    format!(
        "{key:<12} {:>6} {:>7} {:>12} {:>12} {:>12.4} {per_turn}{}\n",
        n("turns"),
        n("calls"),
        n("input_tokens"),
        n("output_tokens"),
        r["cost_usd"].as_f64().unwrap_or(0.0),
        if n("estimated_calls") > 0 { " *" } else { "" }
    )
}

fn session_table(v: &Value) -> String {
    let mut out = format!(
        "session {}\n{:<12} {:>6} {:>7} {:>12} {:>12} {:>12} {:>12} {:>14}\n",
        v["session"].as_str().unwrap_or("?"),
        "DAY",
        "TURNS",
        "CALLS",
        "INPUT",
        "OUTPUT",
        "COST (USD)",
        "INPUT/TURN",
        "COST/TURN",
    );
    for r in v["rows"].as_array().into_iter().flatten() {
        out.push_str(&session_line(r["key"].as_str().unwrap_or("?"), r));
    }
    out.push_str(&session_line("total", &v["total"]));
    out.push_str(&format!(
        "(UTC days since {}; a turn is a message the chat sent; * = some calls' tokens were estimated)\n",
        v["since"].as_str().unwrap_or("?")
    ));
    out
}

fn line(key: &str, r: &Value) -> String {
    let n = |k: &str| r[k].as_u64().unwrap_or(0);
    format!(
        "{key:<40} {:>7} {:>12} {:>12} {:>12} {:>12.4}{}\n",
        n("calls"),
        n("input_tokens"),
        n("cached_tokens"),
        n("output_tokens"),
        r["cost_usd"].as_f64().unwrap_or(0.0),
        if n("estimated_calls") > 0 { " *" } else { "" }
    )
}

fn table(v: &Value, by: &str) -> String {
    let mut out = format!(
        "{:<40} {:>7} {:>12} {:>12} {:>12} {:>12}\n",
        by.to_uppercase(),
        "CALLS",
        "INPUT",
        "CACHED",
        "OUTPUT",
        "COST (USD)"
    );
    for r in v["rows"].as_array().into_iter().flatten() {
        let key = match r["key"].as_str() {
            Some(k) if !k.is_empty() => k,
            // Turns no chat user asked for: counted, but against nobody's budget.
            _ if by == "user" => "(gateway: subagents, scheduled runs)",
            _ => "(none)",
        };
        out.push_str(&line(key, r));
    }
    out.push_str(&line("total", &v["total"]));
    // Cluster mode: each node's share.
    for (node, t) in v["nodes"].as_object().into_iter().flatten() {
        out.push_str(&line(&format!("  node {node}"), t));
    }
    if let Some(e) = v["cluster_error"].as_str() {
        out.push_str(&format!("({e})\n"));
    }
    out.push_str(&format!(
        "(UTC days since {}; * = some calls' tokens were estimated, the provider reported none)\n",
        v["since"].as_str().unwrap_or("?")
    ));
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_row_has_a_label() {
        let v = serde_json::json!({"since": "2026-11-01", "total": {"calls": 3},
            "rows": [{"key": "telegram:42", "calls": 1}, {"key": "", "calls": 2}]});
        let t = table(&v, "user");
        let unlabeled = t.lines().filter(|l| l.starts_with(' ')).count();
        assert_eq!(unlabeled, 0, "{t}");
        assert!(t.contains("(gateway: subagents, scheduled runs)"), "{t}");
    }
}
