//! `weft mcp list|restart` and `weft mcp-server`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::client::GatewayClient;
use super::{CliError, McpAction};
use crate::config::Config;
use crate::daemon::build_registry;
use crate::mcp::server::{serve_stdio, BuiltinProvider};

/// How long `weft mcp list` without a gateway waits for servers to connect.
const SETTLE: Duration = Duration::from_secs(20);

/// Run `weft mcp list|restart`.
///
/// # Errors
/// No gateway for `restart`, or the gateway refused.
pub async fn run(config: &Config, action: McpAction) -> Result<(), CliError> {
    let as_json = matches!(action, McpAction::List { json: true });
    let list = matches!(action, McpAction::List { .. });
    if list && config.tools.mcp_servers.is_empty() {
        // Nothing to connect to: say where servers go (stderr with --json, which stays `[]`).
        let hint = super::human::mcp_hint(config.path.as_deref());
        if as_json {
            println!("[]");
            eprint!("{hint}");
        } else {
            print!("{hint}");
        }
        return Ok(());
    }
    let gateway = GatewayClient::detect(config).await?;
    let mut not_loaded = None;
    let v = match (action, gateway) {
        (McpAction::List { .. }, Some(c)) => {
            eprintln!("(using the running gateway at {})", c.base());
            let v = c.post("/v1/admin/mcp/list", &json!({})).await?;
            not_loaded = not_loaded_note(config, &v);
            v
        }
        (McpAction::List { .. }, None) => {
            eprintln!("(no gateway running: connecting to each server from here)");
            match crate::daemon::start_mcp(config) {
                None => json!([]),
                Some(m) => {
                    m.settle(SETTLE).await;
                    let v = crate::admin::mcp_json(Some(&m));
                    m.shutdown().await;
                    v
                }
            }
        }
        (McpAction::Restart { name }, Some(c)) => {
            c.post("/v1/admin/mcp/restart", &json!({ "name": name }))
                .await?
        }
        (McpAction::Restart { .. }, None) => {
            return Err(CliError::Failed(format!(
                "weft mcp restart needs a running gateway for the store {}, and none runs",
                config.store.path.display()
            )));
        }
    };
    if list && !as_json {
        match &not_loaded {
            Some(note) if v.as_array().is_none_or(Vec::is_empty) => print!("{note}"),
            Some(note) => print!("{}\n{note}", super::human::mcp(&v, config.path.as_deref())),
            None => print!("{}", super::human::mcp(&v, config.path.as_deref())),
        }
    } else {
        if let Some(note) = &not_loaded {
            eprint!("{note}");
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(CliError::msg)?
        );
    }
    Ok(())
}

/// The servers the configuration file names that the running gateway's list (`v`) lacks: it
/// was started before they were added, and has not reloaded since.
fn not_loaded_note(config: &Config, v: &serde_json::Value) -> Option<String> {
    let running: Vec<&str> = v
        .as_array()
        .map(|a| a.iter().filter_map(|r| r["name"].as_str()).collect())
        .unwrap_or_default();
    let missing: Vec<&str> = config
        .tools
        .mcp_servers
        .iter()
        .map(|s| s.name.as_str())
        .filter(|n| !running.contains(n))
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "the configuration file names MCP servers the running gateway has not loaded: {}. It reads its file again on SIGHUP: `systemctl --user reload clawft` for the service (`--system`: `systemctl reload clawft`), or `kill -HUP <the gateway's pid>`; then run `weft mcp list` again.\n",
            missing.join(", ")
        )
    })
}

/// Run `weft mcp-server`: the built-in tools over stdio (logs go to stderr). MCP servers of the
/// config are not proxied.
///
/// # Errors
/// The workspace cannot be opened, or the transport failed.
pub async fn serve(config: &Config) -> Result<(), CliError> {
    let registry = Arc::new(build_registry(
        config,
        None,
        None,
        Vec::new(),
        Default::default(),
    ));
    let ws = super::open_workspace(config)?;
    let provider = BuiltinProvider::new(registry, Arc::new(ws)).map_err(CliError::msg)?;
    serve_stdio(Arc::new(provider)).await.map_err(CliError::msg)
}
