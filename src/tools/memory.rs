//! Memory tools: `memory_read` and `memory_write` on `memory/MEMORY.md` beneath the session
//! workspace (opened through the workspace handle with the kernel check, written atomically).
//! A legacy fallback file (`~/.nanobot/workspace/memory/MEMORY.md`, chosen by the operator) is
//! only ever read, and only when the primary file does not exist.
//!
//! Under `memory.scope = "user"` a chat user's turn carries their directory
//! ([`ToolContext::user_dir`], `users/<channel>-<id>`): `memory_write` writes there, and
//! `memory_read` reads there first, then the agent's file (shared knowledge), then the legacy
//! file. The user's directory (`~/.clawft/users/<name>`, outside the workspace) is opened as a
//! workspace of its own ([`Workspace::open_user`]), so nothing reaches another user's.

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use rustix::fs::{Mode, OFlags};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use super::file_settings::{blocking, DEFAULT_MEMORY_MAX_BYTES};
use super::shared_docs::{DocError, MemoryDocs};
use super::workspace::{check_replaceable, write_atomic_checked, WriteError};
use super::{parse_args, schema_of, Effect, Tool, ToolContext, ToolError, Workspace};

/// The memory file, relative to the workspace.
pub const MEMORY_FILE: &str = "memory/MEMORY.md";

/// How a chat user's memory is named in paths the model sees (`users/<name>/MEMORY.md`); on
/// disk it is `~/.clawft/users/<name>`, outside the workspace.
pub const USERS_DIR: &str = "users";

/// The directory name of a `users/<name>` path (`memory::scope::user_dir`'s result).
pub fn user_name(user_dir: &str) -> &str {
    user_dir
        .strip_prefix(USERS_DIR)
        .and_then(|r| r.strip_prefix('/'))
        .unwrap_or(user_dir)
        .trim_end_matches('/')
}

/// Whether `rel` (workspace-relative, as written by the model) names a memory document:
/// `MEMORY.md` or a file under `memory/`.
pub fn is_memory_path(rel: &str) -> bool {
    let rel = rel.trim_start_matches("./");
    rel == "MEMORY.md" || rel.starts_with("memory/")
}

/// The workspace a memory tool works in: the chat user's own directory (made when `create`),
/// or the agent's workspace. `Ok(None)`: the user has no directory yet.
///
/// # Errors
/// As [`Workspace::open_user`].
pub fn scope_workspace(
    ctx: &ToolContext,
    create: bool,
) -> Result<Option<Arc<Workspace>>, ToolError> {
    match &ctx.user_dir {
        None => Ok(Some(ctx.workspace.clone())),
        Some(dir) => match ctx.workspace.open_user(user_name(dir), create) {
            Ok(ws) => Ok(Some(Arc::new(ws))),
            Err(ToolError::FileNotFound(_)) if !create => Ok(None),
            Err(e) => Err(e),
        },
    }
}

/// A document path `memory_write` may write (relative to the memory's root): `MEMORY.md`,
/// `USER.md` or a Markdown file under `memory/`, without `.`/`..` components.
///
/// # Errors
/// `InvalidPath` saying what is allowed.
pub fn document_path(file: &str) -> Result<String, ToolError> {
    let f = file.trim().trim_start_matches("./");
    let bad = || {
        ToolError::InvalidPath(format!(
            "file `{file}` is not a memory document: use `memory/MEMORY.md` (the default), a note under `memory/` such as `memory/2026-11-23.md`, `MEMORY.md` or `USER.md`"
        ))
    };
    if f.is_empty()
        || f.starts_with('/')
        || f.contains('\0')
        || f.split('/').any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(bad());
    }
    let ok = f == "MEMORY.md"
        || f == "USER.md"
        || (f.starts_with("memory/") && f.ends_with(".md") && f.len() > "memory/.md".len());
    if ok {
        Ok(f.to_string())
    } else {
        Err(bad())
    }
}

/// Read at most `max` bytes from `r`; whether more was there.
pub(crate) fn read_up_to(r: impl Read, max: u64, what: &str) -> Result<(String, bool), ToolError> {
    let mut buf = Vec::new();
    r.take(max.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(|e| ToolError::ExecutionFailed(format!("reading {what}: {e}")))?;
    let cut = buf.len() as u64 > max;
    buf.truncate(usize::try_from(max).unwrap_or(usize::MAX));
    Ok((String::from_utf8_lossy(&buf).into_owned(), cut))
}

/// Arguments of `memory_read`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryReadArgs {
    /// Only return paragraphs (blocks separated by blank lines) containing this text,
    /// case-insensitive (default: the whole file).
    pub query: Option<String>,
}

/// `memory_read`: the long-term memory file, whole or filtered by paragraph.
pub struct MemoryRead {
    fallback: Option<PathBuf>,
    max_bytes: u64,
}

impl MemoryRead {
    /// `fallback`: legacy file read when `memory/MEMORY.md` does not exist in the workspace.
    pub fn new(fallback: Option<PathBuf>) -> Self {
        Self {
            fallback,
            max_bytes: DEFAULT_MEMORY_MAX_BYTES,
        }
    }

    /// Read at most `max` bytes of the memory file (default: 1 MiB).
    pub fn with_max_bytes(mut self, max: u64) -> Self {
        self.max_bytes = max;
        self
    }
}

#[async_trait]
impl Tool for MemoryRead {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::MemoryRead.name()
    }
    fn description(&self) -> &str {
        "Read the long-term memory file (memory/MEMORY.md). With query, only the paragraphs containing it (case-insensitive). Returns: {content, message?, truncated?} or, with query, {query, matches, count}"
    }
    fn parameters(&self) -> Value {
        schema_of::<MemoryReadArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::ReadOnly
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: MemoryReadArgs = parse_args(self.name(), args)?;
        let ws = ctx.workspace.clone();
        let ctx = ctx.clone();
        let fallback = self.fallback.clone();
        let max = self.max_bytes;
        blocking(move || {
            // The user's own file first; without one, the agent's.
            let mut primary = Err(ToolError::FileNotFound(MEMORY_FILE.into()));
            if ctx.user_dir.is_some() {
                if let Some(own) = scope_workspace(&ctx, false)? {
                    primary = own.open_beneath(
                        MEMORY_FILE,
                        OFlags::RDONLY | OFlags::NONBLOCK,
                        Mode::empty(),
                    );
                }
            }
            if matches!(primary, Err(ToolError::FileNotFound(_))) {
                primary = ws.open_beneath(
                    MEMORY_FILE,
                    OFlags::RDONLY | OFlags::NONBLOCK,
                    Mode::empty(),
                );
            }
            let read = match primary {
                Ok(fd) => {
                    let file = std::fs::File::from(fd);
                    let meta = file.metadata().map_err(|e| {
                        ToolError::ExecutionFailed(format!("{MEMORY_FILE}: {e}"))
                    })?;
                    if !meta.is_file() {
                        return Err(ToolError::ExecutionFailed(format!(
                            "{MEMORY_FILE} is not a regular file"
                        )));
                    }
                    Some(read_up_to(file, max, MEMORY_FILE)?)
                }
                // Only a missing primary falls back: an escaping symlink is an error.
                Err(ToolError::FileNotFound(_)) => match &fallback {
                    Some(p) => match std::fs::File::open(p) {
                        Ok(f) => Some(read_up_to(f, max, "the fallback memory file")?),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                        Err(e) => {
                            return Err(ToolError::ExecutionFailed(format!(
                                "reading the fallback memory file: {e}"
                            )))
                        }
                    },
                    None => None,
                },
                Err(e) => return Err(e),
            };
            let Some((content, truncated)) = read else {
                return Ok(json!({"content": "", "message": "No memory file found"}));
            };
            match a.query.as_deref().map(str::trim) {
                Some(q) if !q.is_empty() => {
                    let q = q.to_lowercase();
                    let matches: Vec<String> = paragraphs(&content)
                        .into_iter()
                        .filter(|p| p.to_lowercase().contains(&q))
                        .collect();
                    let mut v = json!({"query": a.query, "count": matches.len(), "matches": matches});
                    if truncated {
                        v["truncated"] = json!(true);
                    }
                    Ok(v)
                }
                _ => {
                    let mut v = json!({ "content": content });
                    if truncated {
                        v["truncated"] = json!(true);
                        v["message"] = json!(format!(
                            "the memory file is larger than {max} bytes; only the first {max} bytes are shown. Condense it with memory_write mode=overwrite"
                        ));
                    }
                    Ok(v)
                }
            }
        })
        .await
    }
}

/// Paragraphs of `text`: blocks separated by blank (or whitespace-only) lines.
fn paragraphs(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur: Vec<&str> = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            if !cur.is_empty() {
                out.push(cur.join("\n"));
                cur.clear();
            }
        } else {
            cur.push(line);
        }
    }
    if !cur.is_empty() {
        out.push(cur.join("\n"));
    }
    out
}

/// How `memory_write` writes.
#[derive(Clone, Copy, Debug, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
pub enum MemoryMode {
    /// Add to the end, after a blank line if the file has content.
    #[default]
    Append,
    /// Replace the whole file.
    Overwrite,
}

/// Arguments of `memory_write`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryWriteArgs {
    /// Text to store (Markdown).
    pub content: String,
    /// `append` or `overwrite` (default: append).
    #[serde(default)]
    pub mode: MemoryMode,
    /// `memory/MEMORY.md` (default), a dated note `memory/YYYY-MM-DD.md`, or `USER.md`.
    #[serde(default)]
    pub file: Option<String>,
}

/// `memory_write`: append to or replace the long-term memory file.
pub struct MemoryWrite {
    max_bytes: u64,
    /// The daemon's memory documents: the append lock, the write count the index watches,
    /// the cluster's copy (cluster mode).
    docs: MemoryDocs,
}

impl MemoryWrite {
    /// Writes `memory/MEMORY.md` in the workspace (never the fallback).
    pub fn new() -> Self {
        Self {
            max_bytes: DEFAULT_MEMORY_MAX_BYTES,
            docs: MemoryDocs::default(),
        }
    }

    /// Writing the daemon's memory documents `docs` (shared with the other nodes in cluster
    /// mode, watched by the memory index).
    #[must_use]
    pub fn with_docs(mut self, docs: MemoryDocs) -> Self {
        self.docs = docs;
        self
    }

    /// Refuse to make the memory file larger than `max` bytes (default: 1 MiB).
    pub fn with_max_bytes(mut self, max: u64) -> Self {
        self.max_bytes = max;
        self
    }
}

impl Default for MemoryWrite {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Tool for MemoryWrite {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::MemoryWrite.name()
    }
    fn description(&self) -> &str {
        "Save long-term notes to memory: append (default) or overwrite. Returns: {message, path}"
    }
    fn parameters(&self) -> Value {
        schema_of::<MemoryWriteArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::Writes
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: MemoryWriteArgs = parse_args(self.name(), args)?;
        if a.mode == MemoryMode::Append && a.content.is_empty() {
            return Err(ToolError::InvalidArgs(
                "content is empty: nothing to append".into(),
            ));
        }
        let file = match a.file.as_deref() {
            None => MEMORY_FILE.to_string(),
            Some(f) => document_path(f)?,
        };
        let ctx = ctx.clone();
        let max = self.max_bytes;
        let docs = self.docs.clone();
        blocking(move || {
            let _guard = docs.append_lock();
            let ws = scope_workspace(&ctx, true)?
                .ok_or_else(|| ToolError::ExecutionFailed("no memory directory".into()))?;
            // Cluster mode: from the shared copy, retried when another node wrote meanwhile.
            let scope = match ctx.user_dir.as_deref() {
                Some(d) => super::shared_docs::Scope::User(user_name(d)),
                None => super::shared_docs::Scope::Agent,
            };
            let mut tries = 0;
            loop {
                tries += 1;
                let pending = docs.begin(&ctx.workspace, scope, &file)?;
                let limit = if pending.is_some() {
                    max.min(super::shared_docs::MAX_SHARED_BYTES as u64)
                } else {
                    max
                };
                let out = match (write_memory(&ws, &file, &a, limit), &pending) {
                    (Ok(out), _) => {
                        docs.touched();
                        out
                    }
                    // The cluster's newer copy landed in the file while it was being written.
                    (Err(WriteError::Replaced(_)), Some(_)) if tries < 5 => continue,
                    (Err(e), _) => break Err(ToolError::from(e)),
                };
                let Some(p) = pending else {
                    break Ok(out);
                };
                match p.finish(out.1.as_bytes()) {
                    Ok(()) => break Ok(out),
                    Err(DocError::Conflict(_)) if tries < 5 => {
                        tracing::info!(file = %file, "memory document changed on another node meanwhile: writing again");
                        continue;
                    }
                    Err(e) => break Err(ToolError::from(e)),
                }
            }
            .map(|(v, _)| v)
        })
        .await
    }
}

/// Write `a` to memory document `file` of `ws`; the result and the file's new content.
fn write_memory(
    ws: &Workspace,
    file: &str,
    a: &MemoryWriteArgs,
    max: u64,
) -> Result<(Value, String), WriteError> {
    let (dir, name) = ws.open_parent(file, true)?;
    let existing = check_replaceable(ws, &dir, &name, file)?;
    let (data, mode_name) = match (a.mode, existing) {
        (MemoryMode::Append, Some(_)) => {
            let fd = rustix::fs::openat(
                &dir,
                name.as_str(),
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| super::workspace::map_errno(file, e))?;
            let (old, cut) = read_up_to(std::fs::File::from(fd), max, file)?;
            if cut {
                return Err(ToolError::InvalidArgs(format!(
                            "the memory file is already larger than {max} bytes; condense it with mode=overwrite"
                        )).into());
            }
            let sep = if old.is_empty() || old.ends_with("\n\n") {
                ""
            } else if old.ends_with('\n') {
                "\n"
            } else {
                "\n\n"
            };
            (format!("{old}{sep}{}", a.content), "append")
        }
        (MemoryMode::Append, None) => (a.content.clone(), "append"),
        (MemoryMode::Overwrite, _) => (a.content.clone(), "overwrite"),
    };
    if data.len() as u64 > max {
        return Err(ToolError::InvalidArgs(format!(
                    "the memory file would be {} bytes; the limit is {max}. Condense it with mode=overwrite",
                    data.len()
                )).into());
    }
    let mode = existing.map_or(0o644, |e| e.mode);
    write_atomic_checked(&dir, &name, data.as_bytes(), mode, existing, file)?;
    Ok((
        json!({
            "message": format!("Successfully wrote {} bytes to memory (mode: {mode_name})", a.content.len()),
            "path": ws.root().join(file).display().to_string(),
        }),
        data,
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::os::unix::fs::symlink;

    use super::*;
    use crate::tools::workspace::testutil::{Fixture, CANARY};

    async fn write(fx: &Fixture, args: Value) -> Result<Value, ToolError> {
        MemoryWrite::new().execute(args, &fx.ctx).await
    }
    async fn read(
        fx: &Fixture,
        fallback: Option<PathBuf>,
        args: Value,
    ) -> Result<Value, ToolError> {
        MemoryRead::new(fallback).execute(args, &fx.ctx).await
    }
    fn primary(fx: &Fixture) -> String {
        std::fs::read_to_string(fx.ws.join(MEMORY_FILE)).unwrap()
    }

    #[tokio::test]
    async fn append_separates_with_a_blank_line_and_overwrite_replaces() {
        let fx = Fixture::new();
        let v = read(&fx, None, json!({})).await.unwrap();
        assert_eq!(v, json!({"content": "", "message": "No memory file found"}));
        let v = write(&fx, json!({"content": "## Décision\nUse PostgreSQL 🐘"}))
            .await
            .unwrap();
        let n = "## Décision\nUse PostgreSQL 🐘".len();
        assert_eq!(
            v["message"],
            json!(format!(
                "Successfully wrote {n} bytes to memory (mode: append)"
            ))
        );
        assert_eq!(
            v["path"],
            json!(fx.ws.join(MEMORY_FILE).display().to_string())
        );
        write(&fx, json!({"content": "second", "mode": "append"}))
            .await
            .unwrap();
        assert_eq!(primary(&fx), "## Décision\nUse PostgreSQL 🐘\n\nsecond");
        // A file ending in a newline gets one more, not two.
        std::fs::write(fx.ws.join(MEMORY_FILE), "a\n").unwrap();
        write(&fx, json!({"content": "b"})).await.unwrap();
        assert_eq!(primary(&fx), "a\n\nb");
        let v = read(&fx, None, json!({})).await.unwrap();
        assert_eq!(v, json!({"content": "a\n\nb"}));
        let v = write(&fx, json!({"content": "fresh", "mode": "overwrite"}))
            .await
            .unwrap();
        assert!(v["message"].as_str().unwrap().contains("(mode: overwrite)"));
        assert_eq!(primary(&fx), "fresh");
        // Overwrite with nothing clears it; appending nothing is refused.
        write(&fx, json!({"content": "", "mode": "overwrite"}))
            .await
            .unwrap();
        assert_eq!(primary(&fx), "");
        let e = write(&fx, json!({"content": ""})).await.unwrap_err();
        assert_eq!(e.code(), "INVALID_ARGS");
        write(&fx, json!({"content": "first"})).await.unwrap();
        assert_eq!(primary(&fx), "first", "no separator in an empty file");
        for bad in [
            json!({"content": "x", "mode": "prepend"}),
            json!({"mode": "append"}),
            json!({"content": "x", "extra": 1}),
        ] {
            let e = write(&fx, bad.clone()).await.unwrap_err();
            assert_eq!(e.code(), "INVALID_ARGS", "{bad}");
        }
        let e = read(&fx, None, json!({"q": "x"})).await.unwrap_err();
        assert_eq!(e.code(), "INVALID_ARGS");
    }

    #[tokio::test]
    async fn query_returns_matching_paragraphs_case_insensitively() {
        let fx = Fixture::new();
        fx.put(
            MEMORY_FILE,
            "# Notes\n\nDecided JWT for Authentication.\nExpires in 1h.\n\n  \nDatabase: PostgreSQL\n\nauthentication via ÉCOLE sso\n",
        );
        let v = read(&fx, None, json!({"query": "AUTHENTICATION"}))
            .await
            .unwrap();
        assert_eq!(
            v,
            json!({
                "query": "AUTHENTICATION",
                "matches": ["Decided JWT for Authentication.\nExpires in 1h.", "authentication via ÉCOLE sso"],
                "count": 2
            })
        );
        let v = read(&fx, None, json!({"query": "école"})).await.unwrap();
        assert_eq!(v["count"], json!(1));
        let v = read(&fx, None, json!({"query": "nothing like it"}))
            .await
            .unwrap();
        assert_eq!(
            v,
            json!({"query": "nothing like it", "matches": [], "count": 0})
        );
    }

    #[tokio::test]
    async fn fallback_is_read_only_when_primary_is_missing_and_never_written() {
        let fx = Fixture::new();
        let legacy = fx.tmp.path().join("nanobot/MEMORY.md");
        std::fs::create_dir_all(legacy.parent().unwrap()).unwrap();
        std::fs::write(&legacy, "legacy note\n\nold auth paragraph").unwrap();
        let v = read(&fx, Some(legacy.clone()), json!({})).await.unwrap();
        assert_eq!(v, json!({"content": "legacy note\n\nold auth paragraph"}));
        let v = read(&fx, Some(legacy.clone()), json!({"query": "AUTH"}))
            .await
            .unwrap();
        assert_eq!(v["matches"], json!(["old auth paragraph"]));
        // Missing fallback too: the "no memory" answer.
        let v = read(&fx, Some(fx.tmp.path().join("none.md")), json!({}))
            .await
            .unwrap();
        assert_eq!(v["message"], json!("No memory file found"));
        // A write goes to the primary (append starts it fresh) and the fallback is untouched.
        write(&fx, json!({"content": "new note"})).await.unwrap();
        assert_eq!(primary(&fx), "new note");
        assert_eq!(
            std::fs::read_to_string(&legacy).unwrap(),
            "legacy note\n\nold auth paragraph"
        );
        let v = read(&fx, Some(legacy.clone()), json!({})).await.unwrap();
        assert_eq!(v, json!({"content": "new note"}));
        // An empty primary is still the primary.
        write(&fx, json!({"content": "", "mode": "overwrite"}))
            .await
            .unwrap();
        let v = read(&fx, Some(legacy), json!({})).await.unwrap();
        assert_eq!(v, json!({"content": ""}));
    }

    #[tokio::test]
    async fn memory_stays_in_the_workspace() {
        let mut fx = Fixture::new();
        // `memory` is a symlink to the outside dir, which holds a MEMORY.md of its own.
        fx.add_outside("MEMORY.md", CANARY);
        symlink(&fx.outside, fx.ws.join("memory")).unwrap();
        let legacy = fx.tmp.path().join("legacy.md");
        std::fs::write(&legacy, "legacy").unwrap();
        let e = read(&fx, Some(legacy), json!({})).await.unwrap_err();
        assert_eq!(
            e.code(),
            "INVALID_PATH",
            "an escape is not 'missing': no fallback"
        );
        let e = write(&fx, json!({"content": "pwned"})).await.unwrap_err();
        assert_eq!(e.code(), "INVALID_PATH");
        let e = write(&fx, json!({"content": "pwned", "mode": "overwrite"}))
            .await
            .unwrap_err();
        assert_eq!(e.code(), "INVALID_PATH");
        fx.assert_outside_intact();
        // MEMORY.md itself a symlink out, or a hard link to the canary.
        std::fs::remove_file(fx.ws.join("memory")).unwrap();
        std::fs::create_dir(fx.ws.join("memory")).unwrap();
        symlink(fx.canary(), fx.ws.join(MEMORY_FILE)).unwrap();
        let e = read(&fx, None, json!({})).await.unwrap_err();
        assert_eq!(e.code(), "INVALID_PATH");
        let e = write(&fx, json!({"content": "pwned"})).await.unwrap_err();
        assert_eq!(e.code(), "INVALID_PATH");
        std::fs::remove_file(fx.ws.join(MEMORY_FILE)).unwrap();
        std::fs::hard_link(fx.canary(), fx.ws.join(MEMORY_FILE)).unwrap();
        for mode in ["append", "overwrite"] {
            let e = write(&fx, json!({"content": "pwned", "mode": mode}))
                .await
                .unwrap_err();
            assert_eq!(e.code(), "PERMISSION_DENIED", "{mode}");
        }
        fx.assert_outside_intact();
    }

    #[tokio::test]
    async fn size_is_capped() {
        let fx = Fixture::new();
        let w = MemoryWrite::new().with_max_bytes(10);
        w.execute(json!({"content": "12345"}), &fx.ctx)
            .await
            .unwrap();
        let e = w
            .execute(json!({"content": "67890"}), &fx.ctx)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "INVALID_ARGS", "5 + 2 + 5 > 10");
        let e = w
            .execute(
                json!({"content": "x".repeat(11), "mode": "overwrite"}),
                &fx.ctx,
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), "INVALID_ARGS");
        assert_eq!(primary(&fx), "12345");
        fx.put(MEMORY_FILE, &"m".repeat(2 * 1024 * 1024));
        let v = read(&fx, None, json!({})).await.unwrap();
        assert_eq!(v["truncated"], json!(true));
        assert_eq!(v["content"].as_str().unwrap().len(), 1024 * 1024);
        assert!(v["message"].as_str().unwrap().contains("1048576"));
        let e = MemoryWrite::new()
            .execute(json!({"content": "more"}), &fx.ctx)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "INVALID_ARGS");
    }

    #[test]
    fn write_targets_are_memory_documents_only() {
        for ok in [
            "memory/MEMORY.md",
            "memory/2026-11-23.md",
            "./memory/a/b.md",
            "USER.md",
            "MEMORY.md",
        ] {
            assert!(document_path(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "notes.md",
            "memory/../SOUL.md",
            "../x.md",
            "/etc/x.md",
            "memory/x.txt",
            "memory/.md",
            "memory//x.md",
            "SOUL.md",
            "users/x/memory/a.md",
        ] {
            assert!(
                matches!(document_path(bad), Err(ToolError::InvalidPath(_))),
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn a_users_reads_fall_back_to_the_agents_file_and_writes_stay_in_their_directory() {
        let fx = Fixture::new();
        fx.put(MEMORY_FILE, "shared: the office closes at 6");
        let users = tempfile::tempdir().unwrap();
        let mut ctx = fx.ctx.clone();
        ctx.workspace = Arc::new(
            Workspace::open(&fx.ws)
                .unwrap()
                .with_users_dir(users.path().join("users")),
        );
        ctx.user_dir = Some(Arc::from("users/telegram-7"));
        let v = MemoryRead::new(None)
            .execute(json!({}), &ctx)
            .await
            .unwrap();
        assert_eq!(v["content"], "shared: the office closes at 6");
        MemoryWrite::new()
            .execute(
                json!({"content": "likes green tea", "file": "memory/2026-01-02.md"}),
                &ctx,
            )
            .await
            .unwrap();
        MemoryWrite::new()
            .execute(json!({"content": "mine"}), &ctx)
            .await
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(users.path().join("users/telegram-7/memory/2026-01-02.md"))
                .unwrap(),
            "likes green tea"
        );
        let v = MemoryRead::new(None)
            .execute(json!({}), &ctx)
            .await
            .unwrap();
        assert_eq!(v["content"], "mine");
        // Only the daemon's user can list the users or enter one's directory.
        use std::os::unix::fs::PermissionsExt;
        for d in ["users", "users/telegram-7"] {
            let mode = std::fs::metadata(users.path().join(d))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o700, "{d}");
        }
        assert_eq!(
            primary(&fx),
            "shared: the office closes at 6",
            "the agent's file untouched"
        );
    }
}
