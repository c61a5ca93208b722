//! `weft config show [--json]` (the effective configuration, each value with where it came
//! from, secrets masked) and `weft config check` (load and validate; the error once, naming
//! the key and where it was set).

use std::path::Path;

use clap::Subcommand;

use super::CliError;
use crate::config::provenance::set_values;
use crate::config::show::{rows, rows_json};
use crate::config::{Config, Env};

/// `weft config` actions.
#[derive(Debug, Subcommand)]
pub enum ConfigAction {
    /// The effective configuration: each value and its source (a key of the file, an
    /// environment variable, or the default). Secrets are masked.
    Show {
        /// Print JSON: `[{"key", "value", "source"}]`.
        #[arg(long)]
        json: bool,
    },
    /// Load and validate the configuration: exit 0 when it is valid, else 1 with the error.
    Check,
}

/// Run `weft config show`.
///
/// # Errors
/// The JSON cannot be printed.
pub fn show(config: &Config, env: &Env, json: bool) -> Result<(), CliError> {
    let set = set_values(config.path.as_deref(), env);
    let rows = rows(config, &set);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows_json(&rows)).map_err(CliError::msg)?
        );
        return Ok(());
    }
    println!(
        "config file: {}",
        config.path.as_deref().map_or_else(
            || "none (defaults and the environment)".to_string(),
            |p: &Path| p.display().to_string()
        )
    );
    let kw = rows.iter().map(|r| r.key.len()).max().unwrap_or(0);
    let vw = rows
        .iter()
        .map(|r| r.value.chars().count())
        .max()
        .unwrap_or(0)
        .min(48);
    for r in &rows {
        println!("{:<kw$}  {:<vw$}  {}", r.key, r.value, r.source);
    }
    Ok(())
}

/// Run `weft config check`: load and validate.
///
/// # Errors
/// The configuration does not load: the error names the key and where it was set.
pub fn check(path: Option<&Path>, env: &Env) -> Result<String, CliError> {
    let config = Config::load(path, env).map_err(CliError::msg)?;
    let providers: Vec<&str> = config.providers.iter().map(|p| p.name.as_str()).collect();
    Ok(format!(
        "ok: {} is valid (providers: {}; channels: {})",
        config.path.as_deref().map_or_else(
            || "the default configuration (no config file)".to_string(),
            |p| p.display().to_string()
        ),
        providers.join(", "),
        std::iter::once("http".to_string())
            .filter(|_| config.http.enabled)
            .chain(
                config
                    .chat_channels
                    .iter()
                    .map(crate::config::ChatChannelConfig::id)
            )
            .collect::<Vec<_>>()
            .join(", ")
    ))
}
