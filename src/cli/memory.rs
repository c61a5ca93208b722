//! `weft memory search|reindex`: the operator's view of the memory index, read directly from
//! the workspace and the index directory (no gateway needed; a running gateway picks up a
//! rebuilt index on its next search).

use std::sync::Arc;

use clap::Subcommand;
use tokio_util::sync::CancellationToken;

use super::CliError;
use crate::config::Config;
use crate::tools::ToolContext;
use crate::types::SessionKey;

/// `weft memory` actions.
#[derive(Debug, Subcommand)]
pub enum MemoryAction {
    /// Search the memory documents as the agent does (`memory_search`): the agent's, or with
    /// --user also that chat user's own.
    Search {
        /// Words to look for.
        #[arg(required = true, num_args = 1..)]
        query: Vec<String>,
        /// Search as this chat user (`CHANNEL:USER_ID`, e.g. `telegram:42`) under
        /// `memory.scope = "user"`.
        #[arg(long, value_name = "CHANNEL:USER_ID")]
        user: Option<String>,
        /// How many results.
        #[arg(short = 'n', long, default_value_t = 8)]
        max: usize,
        /// Only documents whose path starts with this (e.g. `memory/2026-11`).
        #[arg(long)]
        prefix: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Rebuild every memory index (the agent's and every user's) from the files.
    Reindex {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Run a `weft memory` action.
///
/// # Errors
/// The workspace cannot be opened, a bad `--user`, or the index cannot be written.
pub async fn run(config: &Config, action: MemoryAction) -> Result<(), CliError> {
    let ws = Arc::new(super::open_workspace(config)?);
    let service = crate::daemon::build::memory_service(config, None, Default::default());
    match action {
        MemoryAction::Search {
            query,
            user,
            max,
            prefix,
            json,
        } => {
            let user_dir = match user.as_deref() {
                None => None,
                Some(u) => {
                    let (channel, id) = u
                        .split_once(':')
                        .filter(|(c, i)| !c.is_empty() && !i.is_empty())
                        .ok_or_else(|| {
                            CliError::Failed(format!(
                                "--user {u}: expected CHANNEL:USER_ID, e.g. telegram:42"
                            ))
                        })?;
                    Some(Arc::from(crate::memory::scope::user_dir(channel, id)))
                }
            };
            let session = SessionKey::from_parts(&["cli", "memory"]).map_err(CliError::msg)?;
            let ctx = ToolContext {
                workspace: ws,
                session,
                cancel: CancellationToken::new(),
                user_dir,
                sender: None,
                call_id: None,
                turn: Default::default(),
            };
            let out = service
                .search(&ctx, &query.join(" "), max.clamp(1, 50), prefix.as_deref())
                .await
                .map_err(|e| CliError::Failed(e.to_string()))?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&out).map_err(CliError::msg)?
                );
                return Ok(());
            }
            if out.results.is_empty() {
                println!("No memory matches.");
            }
            for h in &out.results {
                println!(
                    "{}:{}-{}  (score {:.3})",
                    h.path, h.start_line, h.end_line, h.score
                );
                for line in h.snippet.lines() {
                    println!("    {line}");
                }
            }
            if out.indexing {
                println!("(the index is still being built: results may be missing)");
            }
            Ok(())
        }
        MemoryAction::Reindex { json } => {
            let stats = tokio::task::spawn_blocking(move || service.reindex_all(&ws))
                .await
                .map_err(CliError::msg)?
                .map_err(|e| CliError::Failed(e.to_string()))?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&stats).map_err(CliError::msg)?
                );
            } else {
                println!(
                    "Reindexed {} documents ({} chunks) in {} index(es), {} bytes on disk.",
                    stats.documents, stats.chunks, stats.indexes, stats.index_bytes
                );
            }
            Ok(())
        }
    }
}
