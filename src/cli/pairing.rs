//! `weft pairing list|approve|revoke` and `weft send`: through the running gateway's admin
//! API, or (pairing only) directly on the store when no gateway runs.

use serde_json::{json, Value};

use super::agent::{backend, Backend};
use super::client::GatewayClient;
use super::{CliError, PairingAction};
use crate::admin::pairing_command;
use crate::config::Config;

/// Run a pairing action, printing text for people (JSON with `--json`).
///
/// # Errors
/// Unknown code, no access to gateway or store.
pub async fn run(config: &Config, action: PairingAction) -> Result<(), CliError> {
    let (name, body, as_json) = match action {
        PairingAction::List { json } => ("pairing/list", Value::Null, json),
        PairingAction::Approve { code, json } => ("pairing/approve", json!({ "code": code }), json),
        PairingAction::Revoke { who, json } => ("pairing/revoke", json!({ "who": who }), json),
    };
    let v = match backend(config).await? {
        Backend::Gateway(c) => c.post(&format!("/v1/admin/{name}"), &body).await?,
        Backend::Store(_) if config.cluster.is_some() && name != "pairing/list" => {
            return Err(CliError::msg(
                "in cluster mode pairing changes go through a running gateway (it writes them to the cluster); start `weft gateway` with this config, or run the command on a node where it runs",
            ))
        }
        Backend::Store(s) => pairing_command(&s, name, &body).map_err(CliError::msg)?,
    };
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(CliError::msg)?
        );
    } else {
        print!("{}", human(name, &body, &v));
    }
    Ok(())
}

/// What a pairing action printed for people.
fn human(name: &str, body: &Value, v: &Value) -> String {
    use std::fmt::Write as _;
    let s = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_string);
    match name {
        "pairing/list" => {
            let mut out = String::new();
            let pending = v["pending"].as_array().cloned().unwrap_or_default();
            if pending.is_empty() {
                out.push_str("no pairing requests waiting\n");
            } else {
                out.push_str(
                    "WAITING CODE  WHO                       CHAT                 ASKED (UTC)\n",
                );
                for p in &pending {
                    let asked = p["created_ms"]
                        .as_i64()
                        .and_then(chrono::DateTime::from_timestamp_millis)
                        .map_or_else(|| "-".into(), |t| t.format("%Y-%m-%d %H:%M").to_string());
                    let _ = writeln!(
                        out,
                        "{:<13} {:<25} {:<20} {asked}",
                        s(&p["code"]),
                        format!("{}:{}", s(&p["channel"]), s(&p["user"])),
                        s(&p["chat"]),
                    );
                }
                out.push_str("admit one with `weft pairing approve CODE`\n");
            }
            let paired = v["paired"].as_array().cloned().unwrap_or_default();
            if paired.is_empty() {
                out.push_str("no paired senders\n");
            } else {
                out.push_str("PAIRED\n");
                for p in &paired {
                    let _ = writeln!(out, "  {}", s(p));
                }
            }
            out
        }
        "pairing/approve" => format!(
            "approved {}: they can talk to the agent now\n",
            s(&v["approved"])
        ),
        _ if v["revoked"] == Value::Bool(false) => {
            format!("{} was not paired: nothing to revoke\n", s(&body["who"]))
        }
        _ => format!(
            "revoked {}: their next message gets a new pairing code\n",
            s(&body["who"])
        ),
    }
}

/// `weft send CHANNEL CHAT_ID TEXT`.
///
/// # Errors
/// No gateway running, or the gateway refused the message.
pub async fn send(
    config: &Config,
    channel: &str,
    chat: &str,
    text: &str,
    as_json: bool,
) -> Result<(), CliError> {
    crate::admin::operator_message(channel, chat, text).map_err(CliError::msg)?;
    let c = GatewayClient::detect(config).await?.ok_or_else(|| {
        CliError::Failed(format!(
            "weft send needs a running gateway for this config's store ({}), and none runs: start `weft gateway` with this config",
            config.store.path.display()
        ))
    })?;
    let v = c
        .post(
            "/v1/admin/send",
            &json!({"channel": channel, "chat_id": chat, "content": text}),
        )
        .await?;
    if as_json {
        println!("{v}");
    } else {
        println!(
            "queued for {channel}:{chat} (message {}); the gateway delivers it, also across a restart",
            v["id"].as_str().unwrap_or("?")
        );
    }
    Ok(())
}
