//! `memory_search` and `memory_get` (seed 004, group `memory`): ranked search over the memory
//! documents the caller may see, and reading one of them (or a slice).

use std::sync::Arc;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use super::service::MemoryService;
use crate::tools::{parse_args, schema_of, Effect, Tool, ToolContext, ToolError};

/// Results returned when `max_results` is not given.
pub const DEFAULT_RESULTS: usize = 8;
/// Most results one search returns.
pub const MAX_RESULTS: usize = 50;
/// Lines `memory_get` returns when `lines` is not given.
pub const DEFAULT_LINES: usize = 200;
/// Longest query (bytes).
const MAX_QUERY_BYTES: usize = 1024;

/// Arguments of `memory_search`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemorySearchArgs {
    /// Words to look for.
    pub query: String,
    /// Default 8, max 50.
    pub max_results: Option<usize>,
    /// E.g. `memory/2026-11`.
    pub path_prefix: Option<String>,
}

/// `memory_search`: ranked full-text search over the memory documents.
pub struct MemorySearch {
    service: Arc<MemoryService>,
}

impl MemorySearch {
    /// Over `service`'s indexes.
    pub fn new(service: Arc<MemoryService>) -> Self {
        Self { service }
    }
}

#[async_trait]
impl Tool for MemorySearch {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::MemorySearch.name()
    }
    fn description(&self) -> &str {
        "Search saved memory (MEMORY.md, memory/ notes); best first."
    }
    fn parameters(&self) -> Value {
        schema_of::<MemorySearchArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::ReadOnly
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: MemorySearchArgs = parse_args(self.name(), args)?;
        let query = a.query.trim();
        if query.is_empty() {
            return Err(ToolError::InvalidArgs("query is empty".into()));
        }
        if query.len() > MAX_QUERY_BYTES {
            return Err(ToolError::InvalidArgs(format!(
                "query is {} bytes; the limit is {MAX_QUERY_BYTES}",
                query.len()
            )));
        }
        let max = a
            .max_results
            .unwrap_or(DEFAULT_RESULTS)
            .clamp(1, MAX_RESULTS);
        let prefix = a
            .path_prefix
            .as_deref()
            .map(|p| p.trim().trim_start_matches("./"))
            .filter(|p| !p.is_empty());
        let out = self.service.search(ctx, query, max, prefix).await?;
        let mut v = json!({ "results": out.results, "mode": out.mode });
        if let Some(n) = &out.note {
            v["note"] = json!(n);
        }
        if out.indexing {
            v["indexing"] = json!(true);
            v["message"] = json!("the memory index is still being built; results may be incomplete, try again shortly");
        } else if out.results.is_empty() {
            v["message"] = json!(
                "no memory matches; try other words, or memory_read for the whole memory file"
            );
        }
        Ok(v)
    }
}

/// Arguments of `memory_get`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryGetArgs {
    /// As `memory_search` names it.
    pub path: String,
    /// 1-based, default 1.
    pub from_line: Option<usize>,
    /// Default 200.
    pub lines: Option<usize>,
}

/// `memory_get`: one memory document, or a slice of its lines.
pub struct MemoryGet {
    service: Arc<MemoryService>,
}

impl MemoryGet {
    /// Reading through `service` (which knows the scopes).
    pub fn new(service: Arc<MemoryService>) -> Self {
        Self { service }
    }
}

#[async_trait]
impl Tool for MemoryGet {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::MemoryGet.name()
    }
    fn description(&self) -> &str {
        "Read a memory document (a path from memory_search), or `lines` lines from `from_line`. Returns: {path, from_line, to_line, total_lines, content}"
    }
    fn parameters(&self) -> Value {
        schema_of::<MemoryGetArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::ReadOnly
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: MemoryGetArgs = parse_args(self.name(), args)?;
        let from = a.from_line.unwrap_or(1).max(1);
        let count = a.lines.unwrap_or(DEFAULT_LINES).max(1);
        let service = self.service.clone();
        let ctx = ctx.clone();
        let path = a.path.clone();
        let text = tokio::task::spawn_blocking(move || service.read(&ctx, &path))
            .await
            .map_err(|e| ToolError::ExecutionFailed(format!("memory_get failed: {e}")))??;
        let total = text.lines().count();
        let content: Vec<&str> = text.lines().skip(from - 1).take(count).collect();
        let to = (from - 1 + content.len()).max(from.saturating_sub(1));
        let mut v = json!({
            "path": a.path.trim(),
            "from_line": from,
            "to_line": to,
            "total_lines": total,
            "content": content.join("\n"),
        });
        if from > total && total > 0 {
            v["message"] = json!(format!("the document has {total} lines"));
        }
        Ok(v)
    }
}
