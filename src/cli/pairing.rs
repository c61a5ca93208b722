//! `weft pairing list|approve|revoke` and `weft send`: through the running gateway's admin
//! API, or (pairing only) directly on the store when no gateway runs.

use serde_json::{json, Value};

use super::agent::{backend, Backend};
use super::client::GatewayClient;
use super::{CliError, PairingAction};
use crate::admin::pairing_command;
use crate::config::Config;

/// Run a pairing action, printing JSON.
///
/// # Errors
/// Unknown code, no access to gateway or store.
pub async fn run(config: &Config, action: PairingAction) -> Result<(), CliError> {
    let (name, body) = match action {
        PairingAction::List => ("pairing/list", Value::Null),
        PairingAction::Approve { code } => ("pairing/approve", json!({ "code": code })),
        PairingAction::Revoke { who } => ("pairing/revoke", json!({ "who": who })),
    };
    let v = match backend(config).await? {
        Backend::Gateway(c) => c.post(&format!("/v1/admin/{name}"), &body).await?,
        Backend::Store(s) => pairing_command(&s, name, &body).map_err(CliError::msg)?,
    };
    println!(
        "{}",
        serde_json::to_string_pretty(&v).map_err(CliError::msg)?
    );
    Ok(())
}

/// `weft send CHANNEL CHAT_ID TEXT`.
///
/// # Errors
/// No gateway running, or the gateway refused the message.
pub async fn send(config: &Config, channel: &str, chat: &str, text: &str) -> Result<(), CliError> {
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
    println!("{v}");
    Ok(())
}
