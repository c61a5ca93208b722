//! `weft store check|backup|restore`: verify every record, copy the store while the gateway
//! runs (through its control API) or not, and put a backup back (gateway stopped).

use std::path::{Path, PathBuf};

use clap::Subcommand;
use serde_json::json;

use super::client::GatewayClient;
use super::CliError;
use crate::config::Config;
use crate::store::backup::{self, CheckReport};
use crate::store::{Store, StoreError};

/// `weft store` actions.
#[derive(Debug, Subcommand)]
pub enum StoreAction {
    /// Verify every record (decodes, checksum matches) and count them per kind; exit 1 on
    /// damage.
    Check {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write a consistent copy of the store to PATH (JSON lines with a checksum); works while
    /// the gateway runs.
    Backup {
        /// File to write.
        path: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Replace the store with the backup at PATH (stop the gateway first). The current store
    /// files are kept in `<store>.before-restore-<timestamp>`.
    Restore {
        /// Backup file written by `weft store backup`.
        path: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// What `weft store backup` printed: a sentence, or the JSON with `--json`.
fn print_backup(v: &serde_json::Value, as_json: bool) {
    if as_json {
        println!("{v}");
    } else {
        let kinds: Vec<String> = v["counts"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(_, n)| n.as_u64().is_some_and(|n| n > 0))
                    .map(|(k, n)| format!("{n} {k}"))
                    .collect()
            })
            .unwrap_or_default();
        println!(
            "wrote {} records ({}) to {} (put it back with `weft store restore {}`)",
            v["records"],
            kinds.join(", "),
            v["path"].as_str().unwrap_or("?"),
            v["path"].as_str().unwrap_or("PATH")
        );
    }
}

fn absolute(p: &Path) -> Result<PathBuf, CliError> {
    if p.is_absolute() {
        return Ok(p.to_path_buf());
    }
    std::env::current_dir()
        .map(|d| d.join(p))
        .map_err(|e| CliError::Failed(format!("cannot resolve {}: {e}", p.display())))
}

fn print_check(r: &CheckReport, json: bool) -> Result<(), CliError> {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(r).map_err(CliError::msg)?
        );
    } else {
        println!(
            "schema {} store {}",
            r.schema
                .map_or_else(|| "0 (none)".into(), |s| s.to_string()),
            r.store_id.as_deref().unwrap_or("-")
        );
        for (k, n) in &r.counts {
            println!("{k:<10} {n}");
        }
        for p in &r.problems {
            println!("damaged: {p}");
        }
        println!(
            "{}",
            if r.ok {
                "ok: every record decodes".to_string()
            } else {
                format!("{} damaged record(s)", r.damaged)
            }
        );
    }
    if r.ok {
        Ok(())
    } else {
        Err(CliError::Failed(format!(
            "the store has {} damaged record(s)",
            r.damaged
        )))
    }
}

/// Run one store action.
///
/// # Errors
/// Damage found (check), the gateway unreachable, I/O.
pub async fn run(config: &Config, action: StoreAction) -> Result<(), CliError> {
    let gateway = GatewayClient::detect(config).await?;
    let dir = &config.store.path;
    match (action, gateway) {
        (StoreAction::Check { json }, Some(c)) => {
            let v = c.post("/v1/admin/store/check", &json!({})).await?;
            let r: CheckReport = serde_json::from_value(v).map_err(CliError::msg)?;
            print_check(&r, json)
        }
        (StoreAction::Check { json }, None) => match Store::open(dir, config.store.cache_bytes) {
            Ok(s) => print_check(&backup::check(&s).map_err(CliError::msg)?, json),
            Err(e @ (StoreError::Damaged { .. } | StoreError::Newer { .. })) => {
                if json {
                    println!(
                        "{}",
                        json!({"ok": false, "error": e.to_string(), "kind": e.kind()})
                    );
                }
                Err(CliError::msg(e))
            }
            Err(e) => Err(CliError::msg(e)),
        },
        (StoreAction::Backup { path, json }, Some(c)) => {
            let path = absolute(&path)?;
            let v = c
                .post(
                    "/v1/admin/store/backup",
                    &json!({"path": path.display().to_string()}),
                )
                .await?;
            print_backup(&v, json);
            Ok(())
        }
        (StoreAction::Backup { path, json }, None) => {
            let s = Store::open(dir, config.store.cache_bytes).map_err(CliError::msg)?;
            let n = backup::backup(&s, &path).map_err(CliError::msg)?;
            print_backup(
                &json!({"path": path.display().to_string(), "records": n.records, "counts": n.counts}),
                json,
            );
            Ok(())
        }
        (StoreAction::Restore { .. }, Some(_)) => Err(CliError::Failed(format!(
            "a gateway is running on the store at {}: stop it first (`systemctl stop clawft` or Ctrl-C), then restore",
            dir.display()
        ))),
        (StoreAction::Restore { path, json }, None) => {
            match backup::restore(&path, dir, config.store.cache_bytes) {
                Ok(done) => {
                    let previous = done.previous_store.map(|p| p.display().to_string());
                    if json {
                        println!(
                            "{}",
                            json!({
                                "restored": path.display().to_string(),
                                "records": done.counts.records,
                                "counts": done.counts.counts,
                                "previous_store": previous,
                            })
                        );
                    } else {
                        println!(
                            "restored {} records from {} ({}; every count matches the backup's manifest)",
                            done.counts.records,
                            path.display(),
                            done.counts.sentence()
                        );
                        if let Some(p) = previous {
                            println!("the store found before was kept at {p}");
                        }
                    }
                    Ok(())
                }
                Err(StoreError::Locked(p)) => Err(CliError::Failed(format!(
                    "another weft process holds the store at {p}: stop the gateway first"
                ))),
                Err(e) => Err(CliError::msg(e)),
            }
        }
    }
}
