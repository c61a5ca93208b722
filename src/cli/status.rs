//! `weft status`: configuration, store, providers, channels and sessions.

use super::agent::{backend, Backend};
use super::CliError;
use crate::admin::status_json;
use crate::config::Config;

/// Print the status report: labelled lines, or JSON with `as_json`.
///
/// # Errors
/// Neither a gateway nor the store can be reached.
pub async fn run(config: &Config, as_json: bool) -> Result<(), CliError> {
    let mut v = match backend(config).await? {
        Backend::Gateway(c) => c.get("/v1/status").await?,
        Backend::Store(store) => {
            let mut v = status_json(config, &store, None);
            v["mode"] = serde_json::json!("direct");
            v
        }
    };
    if v.get("mode").is_none() {
        v["mode"] = serde_json::json!("gateway");
    }
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(CliError::msg)?
        );
    } else {
        print!("{}", super::human::status(&v));
    }
    Ok(())
}
