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
    let v = match (action, gateway) {
        (McpAction::List { .. }, Some(c)) => {
            eprintln!("(using the running gateway at {})", c.base());
            c.post("/v1/admin/mcp/list", &json!({})).await?
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
        print!("{}", super::human::mcp(&v, config.path.as_deref()));
    } else {
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(CliError::msg)?
        );
    }
    Ok(())
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
