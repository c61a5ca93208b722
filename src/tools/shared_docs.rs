//! Memory documents and context files as the tools that write them share them: one
//! [`MemoryDocs`] per daemon, given to the tools and the memory index at construction (no
//! global). It holds the count of writes the index watches, the lock that serialises memory
//! appends and, in cluster mode (seed 004's managed mode), the cluster's copy: the bucket
//! [`DOCS_BUCKET`] is authoritative for the default agent's documents, and the workspace holds
//! a local copy kept current, so the prompt loader and the memory index keep reading files.
//!
//! Writes go to the cluster first, with the revision this node's copy came from: a write made
//! meanwhile on another node is never overwritten ([`DocError::Conflict`]). [`MemoryDocs::follow`]
//! keeps the local copy current with every change the bucket sees. Without the cluster nothing
//! here reaches the network. Nothing here decides on the text of an error.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::workspace::{check_replaceable, write_atomic};
use super::{ToolError, Workspace};
use crate::store::shared::{
    self, key_part, unkey_part, Bucket, Replicated, Shared, SharedError, SharedErrorKind, Watched,
};
use crate::types::MutexExt;

/// Largest document kept in the shared store (bytes): a larger write is refused in cluster
/// mode.
pub const MAX_SHARED_BYTES: usize = 1_000_000;

/// The bucket of the shared documents (`ws.<path>`, `user.<name>.<path>`; no expiry).
pub const DOCS_BUCKET: Bucket = Bucket {
    name: "weft_docs",
    max_age: Duration::ZERO,
    description: "weft memory documents and context files",
    wait: Duration::from_secs(3),
};

/// The context files shared in cluster mode (the prompt's files and the heartbeat file).
pub const CONTEXT_FILES: &[&str] = &[
    "SOUL.md",
    "IDENTITY.md",
    "AGENTS.md",
    "TOOLS.md",
    "USER.md",
    "BOOTSTRAP.md",
    "HEARTBEAT.md",
    "MEMORY.md",
];

/// Which workspace a document is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope<'a> {
    /// The agent's workspace.
    Agent,
    /// A chat user's own memory directory (`users/<name>`).
    User(&'a str),
}

/// Why a change to a shared document was not kept.
#[derive(Debug, thiserror::Error)]
pub enum DocError {
    /// Another node changed the document meanwhile: nothing of this write was kept (the local
    /// copy is the cluster's again).
    #[error("`{0}` was changed on another node of the cluster meanwhile; your change was not saved. Read it again and redo the change")]
    Conflict(String),
    /// The cluster did not answer: nothing was written.
    #[error("memory and context files are shared by the cluster and the shared store did not answer ({0}); nothing was written, try again")]
    Unavailable(SharedError),
    /// Larger than the cluster keeps.
    #[error("`{rel}` would be {len} bytes; shared memory and context files are limited to {MAX_SHARED_BYTES} bytes")]
    TooLarge {
        /// The document.
        rel: String,
        /// Its size.
        len: usize,
    },
    /// The local copy failed.
    #[error(transparent)]
    Local(#[from] ToolError),
}

impl From<DocError> for ToolError {
    fn from(e: DocError) -> Self {
        match e {
            DocError::Conflict(_) | DocError::Unavailable(_) => {
                ToolError::ExecutionFailed(e.to_string())
            }
            DocError::TooLarge { .. } => ToolError::InvalidArgs(e.to_string()),
            DocError::Local(t) => t,
        }
    }
}

/// The cluster's copy of the default agent's documents.
struct SharedCopy {
    docs: Shared<Vec<u8>>,
    workspace: Arc<Workspace>,
    /// The cluster's revision each local copy holds.
    revs: Mutex<HashMap<String, u64>>,
    /// Serialises changes to shared documents in this process (tools and the watch).
    lock: Mutex<()>,
}

#[derive(Default)]
struct Inner {
    /// Writes to memory documents through a tool or from the cluster: the memory index
    /// looks at the files again before its next search when this moved.
    writes: AtomicU64,
    /// Serialises `memory_write`'s read-modify-write appends (sessions share a workspace).
    append: Mutex<()>,
    shared: Option<SharedCopy>,
}

/// The memory documents of a daemon (cheap to clone; [`Default`]: nothing shared).
#[derive(Clone, Default)]
pub struct MemoryDocs {
    inner: Arc<Inner>,
}

/// Whether `rel` (relative to a workspace or a user's directory) is a shared document: a
/// context file at the top, or a Markdown file under `memory/`.
pub fn is_shared(rel: &str) -> bool {
    let rel = rel.trim_start_matches("./");
    if rel.contains('\0')
        || rel
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return false;
    }
    CONTEXT_FILES.contains(&rel) || (rel.starts_with("memory/") && rel.ends_with(".md"))
}

/// The key parts of document `rel` in `scope`: `ws.<rel>` or `user.<name>.<rel>` in the bucket
/// (bytes other than letters, digits, `-` and `_` as `=XX`).
fn parts_of<'a>(scope: Scope<'a>, rel: &'a str) -> Vec<&'a str> {
    let rel = rel.trim_start_matches("./");
    match scope {
        Scope::Agent => vec!["ws", rel],
        Scope::User(name) => vec!["user", name, rel],
    }
}

/// The bucket key of document `rel` in `scope`.
pub fn key_of(scope: Scope<'_>, rel: &str) -> String {
    parts_of(scope, rel)
        .iter()
        .map(|p| key_part(p))
        .collect::<Vec<_>>()
        .join(".")
}

/// The scope (a user's name) and path of a bucket key (`None`: not a document key).
pub fn parse_key(key: &str) -> Option<(Option<String>, String)> {
    let parts: Vec<String> = key.split('.').map(unkey_part).collect::<Option<_>>()?;
    scope_of(&parts)
}

fn scope_of(parts: &[String]) -> Option<(Option<String>, String)> {
    match parts {
        [ws, rel] if ws == "ws" => Some((None, rel.clone())),
        [user, name, rel] if user == "user" => Some((Some(name.clone()), rel.clone())),
        _ => None,
    }
}

fn write_local(ws: &Workspace, rel: &str, data: Option<&[u8]>) -> Result<(), ToolError> {
    let (dir, name) = ws.open_parent(rel, data.is_some())?;
    let existing = check_replaceable(ws, &dir, &name, rel)?;
    match data {
        Some(d) => {
            let mode = existing.map_or(0o644, |e| e.mode);
            write_atomic(&dir, &name, d, mode, existing, rel)
        }
        None if existing.is_some() => {
            rustix::fs::unlinkat(&dir, name.as_str(), rustix::fs::AtFlags::empty())
                .map_err(|e| super::workspace::map_errno(rel, e))
        }
        None => Ok(()),
    }
}

impl SharedCopy {
    fn scope_ws(&self, user: Option<&str>) -> Result<Arc<Workspace>, ToolError> {
        match user {
            None => Ok(self.workspace.clone()),
            Some(name) => Ok(Arc::new(self.workspace.open_user(name, true)?)),
        }
    }
}

impl MemoryDocs {
    /// The documents of `workspace` (the default agent's) shared through `seam`: cluster mode.
    pub fn shared(seam: Arc<dyn Replicated>, workspace: Arc<Workspace>) -> Self {
        Self {
            inner: Arc::new(Inner {
                shared: Some(SharedCopy {
                    docs: Shared::new(seam, DOCS_BUCKET, ""),
                    workspace,
                    revs: Mutex::new(HashMap::new()),
                    lock: Mutex::new(()),
                }),
                ..Inner::default()
            }),
        }
    }

    /// Whether documents are shared (cluster mode).
    pub fn is_shared(&self) -> bool {
        self.inner.shared.is_some()
    }

    /// How many writes to memory documents this daemon made (moves on each).
    pub fn writes(&self) -> u64 {
        self.inner.writes.load(Ordering::Acquire)
    }

    /// Note a write to a memory document.
    pub fn touched(&self) {
        self.inner.writes.fetch_add(1, Ordering::AcqRel);
    }

    /// Hold while a memory document is read, changed and written back.
    pub fn append_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner.append.locked()
    }

    /// Put `rev` of document `key` (its bucket key parts; `None`: deleted) into the local copy,
    /// unless the copy is already at that revision or later. Whether the file changed. The
    /// caller holds the lock.
    fn apply_locked(
        &self,
        copy: &SharedCopy,
        key: &[String],
        data: Option<&[u8]>,
        rev: u64,
    ) -> Result<bool, ToolError> {
        let Some((user, rel)) = scope_of(key) else {
            return Ok(false);
        };
        let k = key_of(user.as_deref().map_or(Scope::Agent, Scope::User), &rel);
        if copy.revs.locked().get(&k).is_some_and(|&r| r >= rev) {
            return Ok(false);
        }
        if !is_shared(&rel) {
            return Ok(false);
        }
        let ws = copy.scope_ws(user.as_deref())?;
        write_local(&ws, &rel, data)?;
        copy.revs.locked().insert(k, rev);
        self.touched();
        Ok(true)
    }

    /// Put a change the cluster holds into the local copy (blocking: file writes).
    fn apply(&self, key: &[String], data: Option<&[u8]>, rev: u64) -> Result<bool, ToolError> {
        let Some(copy) = &self.inner.shared else {
            return Ok(false);
        };
        let _g = copy.lock.locked();
        self.apply_locked(copy, key, data, rev)
    }

    /// On joining the cluster: put every local shared document the cluster lacks into it
    /// (never replacing the cluster's copy); the names uploaded. Blocking: call it off the
    /// runtime.
    fn upload_missing(&self) -> Vec<String> {
        let Some(copy) = &self.inner.shared else {
            return Vec::new();
        };
        let mut found: Vec<(Option<String>, String)> = Vec::new();
        let root = copy.workspace.root().to_path_buf();
        list_into(&root, None, &mut found);
        if let Some(users) = copy.workspace.users_dir() {
            if let Ok(rd) = std::fs::read_dir(users) {
                for e in rd.flatten() {
                    if let Some(name) = e.file_name().to_str() {
                        list_into(&e.path(), Some(name.to_string()), &mut found);
                    }
                }
            }
        }
        let _g = copy.lock.locked();
        let mut done = Vec::new();
        for (user, rel) in found {
            let Ok(ws) = copy.scope_ws(user.as_deref()) else {
                continue;
            };
            let Ok(Some(data)) = ws.read_beneath(&rel, MAX_SHARED_BYTES as u64 + 1) else {
                continue;
            };
            if data.len() > MAX_SHARED_BYTES {
                tracing::warn!(
                    file = %rel,
                    "not shared with the cluster: larger than {MAX_SHARED_BYTES} bytes"
                );
                continue;
            }
            let scope = user.as_deref().map_or(Scope::Agent, Scope::User);
            let parts = parts_of(scope, &rel);
            if let Ok(rev) = shared::wait(copy.docs.update(&parts, &data, 0)) {
                copy.revs.locked().insert(key_of(scope, &rel), rev);
                done.push(match user {
                    Some(u) => format!("users/{u}/{rel}"),
                    None => rel,
                });
            }
        }
        done
    }

    /// Cluster mode: once the cluster answers, upload the local documents it lacks, then keep
    /// the local copy current with every change of the bucket, until the cluster stops. Runs
    /// on the caller's runtime; the file writes go to blocking threads.
    pub async fn follow(self) {
        let Some(copy) = &self.inner.shared else {
            return;
        };
        while !copy.docs.healthy() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let me = self.clone();
        let up = tokio::task::spawn_blocking(move || me.upload_missing())
            .await
            .unwrap_or_default();
        if !up.is_empty() {
            tracing::info!(files = ?up, "local memory documents uploaded to the cluster");
        }
        let mut watch = copy.docs.watch();
        while let Some(w) = watch.next().await {
            let (key, data, rev) = match w {
                Watched::Started => continue,
                Watched::Put {
                    key,
                    value,
                    revision,
                } => (key, Some(value), revision),
                Watched::Removed { key, revision } => (key, None, revision),
            };
            let me = self.clone();
            let shown = key.join("/");
            let applied =
                tokio::task::spawn_blocking(move || me.apply(&key, data.as_deref(), rev)).await;
            if let Ok(Err(e)) = applied {
                tracing::warn!(key = %shown, error = %e, "shared document not written locally");
            }
        }
    }

    /// Before changing shared document `rel` of `scope` of the agent working in `agent`: bring
    /// the local copy up to the cluster's revision. `None` when `rel` is not shared, nothing is
    /// shared, or `agent` is not the workspace shared (another agent's). Blocking.
    ///
    /// # Errors
    /// The cluster did not answer, or the local copy could not be written.
    pub fn begin(
        &self,
        agent: &Workspace,
        scope: Scope<'_>,
        rel: &str,
    ) -> Result<Option<Pending>, DocError> {
        let Some(copy) = &self.inner.shared else {
            return Ok(None);
        };
        if agent.root() != copy.workspace.root() {
            return Ok(None);
        }
        let rel = rel.trim_start_matches("./");
        if !is_shared(rel) {
            return Ok(None);
        }
        let parts = parts_of(scope, rel);
        let current = shared::wait(copy.docs.get(&parts)).map_err(DocError::Unavailable)?;
        let _g = copy.lock.locked();
        let owned: Vec<String> = parts.iter().map(|p| (*p).to_string()).collect();
        let rev = match current {
            Some(v) => {
                self.apply_locked(copy, &owned, Some(&v.value), v.revision)?;
                v.revision
            }
            None => 0,
        };
        Ok(Some(Pending {
            docs: self.clone(),
            key: key_of(scope, rel),
            parts: owned,
            rel: rel.to_string(),
            user: match scope {
                Scope::Agent => None,
                Scope::User(u) => Some(u.to_string()),
            },
            rev,
        }))
    }
}

fn list_into(
    root: &std::path::Path,
    user: Option<String>,
    out: &mut Vec<(Option<String>, String)>,
) {
    for f in CONTEXT_FILES {
        if root.join(f).is_file() {
            out.push((user.clone(), (*f).to_string()));
        }
    }
    let mut stack = vec!["memory".to_string()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(root.join(&dir)) else {
            continue;
        };
        for e in rd.flatten() {
            let Some(name) = e.file_name().to_str().map(str::to_string) else {
                continue;
            };
            let rel = format!("{dir}/{name}");
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(rel),
                Ok(t) if t.is_file() && is_shared(&rel) => out.push((user.clone(), rel)),
                _ => {}
            }
        }
    }
}

/// A change to a shared document under way: made with [`MemoryDocs::begin`], published with
/// [`Pending::finish`].
pub struct Pending {
    docs: MemoryDocs,
    key: String,
    parts: Vec<String>,
    rel: String,
    user: Option<String>,
    rev: u64,
}

impl Pending {
    /// Refuse `len` bytes before anything is written (the cluster's size limit).
    ///
    /// # Errors
    /// `InvalidArgs` saying the limit.
    pub fn check_size(&self, len: usize) -> Result<(), ToolError> {
        if len > MAX_SHARED_BYTES {
            return Err(ToolError::InvalidArgs(format!(
                "`{}` would be {len} bytes; in cluster mode memory and context files are limited to {MAX_SHARED_BYTES} bytes",
                self.rel
            )));
        }
        Ok(())
    }

    /// Put the local copy back to the cluster's current revision (nothing of this change
    /// kept).
    fn restore(&self, copy: &SharedCopy, parts: &[&str]) -> Result<(), ToolError> {
        let Ok(current) = shared::wait(copy.docs.get(parts)) else {
            // Re-read at the next chance.
            copy.revs.locked().remove(&self.key);
            return Ok(());
        };
        // Absent from the cluster: the local file is left as it is (it may predate the cluster).
        let Some(v) = current else {
            return Ok(());
        };
        let ws = copy.scope_ws(self.user.as_deref())?;
        write_local(&ws, &self.rel, Some(&v.value))?;
        copy.revs.locked().insert(self.key.clone(), v.revision);
        self.docs.touched();
        Ok(())
    }

    /// Publish the local copy's new content `data`, written from the revision
    /// [`MemoryDocs::begin`] saw. On a conflict the local copy is put back to the cluster's
    /// current revision.
    ///
    /// # Errors
    /// [`DocError::Conflict`] (another node changed the document meanwhile: nothing of this
    /// write is kept), [`DocError::Unavailable`], [`DocError::TooLarge`].
    pub fn finish(self, data: &[u8]) -> Result<(), DocError> {
        let Some(copy) = &self.docs.inner.shared else {
            return Ok(());
        };
        let parts: Vec<&str> = self.parts.iter().map(String::as_str).collect();
        let too_large = || DocError::TooLarge {
            rel: self.rel.clone(),
            len: data.len(),
        };
        let _g = copy.lock.locked();
        if data.len() > MAX_SHARED_BYTES {
            self.restore(copy, &parts)?;
            return Err(too_large());
        }
        let written = shared::wait(copy.docs.update(&parts, &data.to_vec(), self.rev));
        match written {
            Ok(rev) => {
                copy.revs.locked().insert(self.key.clone(), rev);
                Ok(())
            }
            Err(e) => match e.kind() {
                SharedErrorKind::Conflict => {
                    self.restore(copy, &parts)?;
                    Err(DocError::Conflict(self.rel.clone()))
                }
                SharedErrorKind::TooLarge => {
                    self.restore(copy, &parts)?;
                    Err(too_large())
                }
                SharedErrorKind::Unavailable
                | SharedErrorKind::Fenced
                | SharedErrorKind::Invalid => {
                    // The local copy is ahead of the cluster: re-read it at the next chance.
                    copy.revs.locked().remove(&self.key);
                    Err(DocError::Unavailable(e))
                }
            },
        }
    }
}

#[cfg(test)]
#[path = "shared_docs_tests.rs"]
mod tests;
