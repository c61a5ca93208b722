//! `weft dashboard [--read-only] [--no-open] [--revoke-all]`: a one-time login link to the
//! control UI of the running gateway (served on its HTTP listener under `/ui/`), or the end of
//! every UI session.

use serde_json::json;

use super::client::GatewayClient;
use super::CliError;
use crate::config::Config;

/// Run `weft dashboard`.
///
/// # Errors
/// No gateway runs for this config's store, or it refused.
pub async fn run(
    config: &Config,
    read_only: bool,
    no_open: bool,
    revoke_all: bool,
) -> Result<(), CliError> {
    if !cfg!(feature = "ui") {
        return Err(CliError::Failed(clawft_channel_http::NO_UI.to_string()));
    }
    let c = GatewayClient::detect(config).await?.ok_or_else(|| {
        CliError::Failed(format!(
            "weft dashboard needs a running gateway for this config's store ({}), and none runs: start `weft gateway` (with channels.http enabled, as by default)",
            config.store.path.display()
        ))
    })?;
    if revoke_all {
        let v = c.post("/v1/admin/ui/revoke-all", &json!({})).await?;
        println!(
            "ended {} control UI session(s) and every unused login link",
            v["revoked"].as_u64().unwrap_or(0)
        );
        return Ok(());
    }
    let role = if read_only { "read-only" } else { "operator" };
    let v = c
        .post("/v1/admin/ui/link", &json!({ "role": role }))
        .await?;
    let path = v["path"]
        .as_str()
        .ok_or_else(|| CliError::Failed("the gateway answered without a link".into()))?;
    let url = format!("{}{path}", c.base());
    println!("{url}");
    eprintln!(
        "One-time {role} login to the control UI: valid for {} s, for the first browser that opens it.",
        v["expires_in_secs"].as_u64().unwrap_or(0)
    );
    if !no_open {
        open_browser(&url);
    }
    Ok(())
}

/// Open `url` in the desktop's browser when there is a desktop and an opener; otherwise the
/// printed link is all.
fn open_browser(url: &str) {
    let env = crate::config::env::Env::from_process();
    let opener = if cfg!(target_os = "macos") {
        Some("open")
    } else if env.get("DISPLAY").is_some() || env.get("WAYLAND_DISPLAY").is_some() {
        Some("xdg-open")
    } else {
        None
    };
    if let Some(cmd) = opener {
        let _ = std::process::Command::new(cmd)
            .arg(url)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
    }
}
