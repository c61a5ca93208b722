//! Memory documents and context files shared by the nodes of a cluster (seed 004's managed
//! mode): in cluster mode a shared store (wired in by the daemon through [`SharedDocs`]) is
//! authoritative for them, and the workspace holds a local copy kept current, so the prompt
//! loader and the memory index keep reading files.
//!
//! Writes go to the shared store first, with the revision this node's copy came from: a write
//! made meanwhile on another node is never overwritten. [`apply`] puts a shared revision into
//! the local copy (the daemon calls it for every change it sees in the store). Without a shared
//! store (single-node mode) every function here does nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use super::workspace::{check_replaceable, write_atomic};
use super::{ToolError, Workspace};
use crate::types::MutexExt;

/// Largest document kept in the shared store (bytes): a larger write is refused in cluster
/// mode.
pub const MAX_SHARED_BYTES: usize = 1_000_000;

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

/// What a conditional write found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Put {
    /// Written; the new revision.
    Written(u64),
    /// The document changed since the given revision (or exists, for a create).
    Conflict,
}

/// The shared store of documents (the cluster's key-value bucket), keyed by [`key_of`].
pub trait SharedDocs: Send + Sync {
    /// The document's bytes and revision, `None` when absent or deleted.
    ///
    /// # Errors
    /// The store did not answer.
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u64)>, String>;
    /// Write `data` if the document's revision is still `expected` (`0`: it must not exist).
    ///
    /// # Errors
    /// The store did not answer.
    fn put(&self, key: &str, data: &[u8], expected: u64) -> Result<Put, String>;
}

/// Which workspace a document is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope<'a> {
    /// The agent's workspace.
    Agent,
    /// A chat user's own memory directory (`users/<name>`).
    User(&'a str),
}

struct Docs {
    store: Arc<dyn SharedDocs>,
    workspace: Arc<Workspace>,
    /// The shared revision each local copy holds.
    revs: Mutex<HashMap<String, u64>>,
}

static DOCS: OnceLock<Docs> = OnceLock::new();

/// Serialises changes to shared documents in this process (tools and the store's watch).
static LOCK: Mutex<()> = Mutex::new(());

/// Share the documents of `workspace` (and its users' directories) through `store`: cluster
/// mode, once per process.
pub fn install(store: Arc<dyn SharedDocs>, workspace: Arc<Workspace>) {
    let _ = DOCS.set(Docs {
        store,
        workspace,
        revs: Mutex::new(HashMap::new()),
    });
}

/// Whether documents are shared (cluster mode).
pub fn active() -> bool {
    DOCS.get().is_some()
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

fn enc(s: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "={b:02X}");
        }
    }
    out
}

fn dec(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'=' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The store's key of document `rel` in `scope`: `ws.<rel>` or `user.<name>.<rel>` (bytes
/// other than letters, digits, `-` and `_` as `=XX`).
pub fn key_of(scope: Scope<'_>, rel: &str) -> String {
    let rel = rel.trim_start_matches("./");
    match scope {
        Scope::Agent => format!("ws.{}", enc(rel)),
        Scope::User(name) => format!("user.{}.{}", enc(name), enc(rel)),
    }
}

/// The scope and path of a store key (`None`: not a document key).
pub fn parse_key(key: &str) -> Option<(Option<String>, String)> {
    if let Some(rel) = key.strip_prefix("ws.") {
        return Some((None, dec(rel)?));
    }
    let (name, rel) = key.strip_prefix("user.")?.split_once('.')?;
    Some((Some(dec(name)?), dec(rel)?))
}

fn scope_ws(docs: &Docs, user: Option<&str>) -> Result<Arc<Workspace>, ToolError> {
    match user {
        None => Ok(docs.workspace.clone()),
        Some(name) => Ok(Arc::new(docs.workspace.open_user(name, true)?)),
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

fn apply_locked(docs: &Docs, key: &str, data: Option<&[u8]>, rev: u64) -> Result<bool, ToolError> {
    if docs.revs.locked().get(key).is_some_and(|&r| r >= rev) {
        return Ok(false);
    }
    let Some((user, rel)) = parse_key(key) else {
        return Ok(false);
    };
    if !is_shared(&rel) {
        return Ok(false);
    }
    let ws = scope_ws(docs, user.as_deref())?;
    write_local(&ws, &rel, data)?;
    docs.revs.locked().insert(key.to_string(), rev);
    super::memory::touched();
    Ok(true)
}

/// Put revision `rev` of document `key` (`None`: deleted) into the local copy, unless the copy
/// is already at that revision or later. Whether the local file changed.
///
/// # Errors
/// The local file could not be written.
pub fn apply(key: &str, data: Option<&[u8]>, rev: u64) -> Result<bool, ToolError> {
    let Some(docs) = DOCS.get() else {
        return Ok(false);
    };
    let _g = LOCK.locked();
    apply_locked(docs, key, data, rev)
}

/// On joining the cluster: put every local shared document the store lacks into it (never
/// replacing the store's copy). The names uploaded.
pub fn upload_missing() -> Vec<String> {
    let Some(docs) = DOCS.get() else {
        return Vec::new();
    };
    let mut found: Vec<(Option<String>, String)> = Vec::new();
    let root = docs.workspace.root().to_path_buf();
    list_into(&root, None, &mut found);
    if let Some(users) = docs.workspace.users_dir() {
        if let Ok(rd) = std::fs::read_dir(users) {
            for e in rd.flatten() {
                if let Some(name) = e.file_name().to_str() {
                    list_into(&e.path(), Some(name.to_string()), &mut found);
                }
            }
        }
    }
    let _g = LOCK.locked();
    let mut done = Vec::new();
    for (user, rel) in found {
        let Ok(ws) = scope_ws(docs, user.as_deref()) else {
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
        let key = key_of(user.as_deref().map_or(Scope::Agent, Scope::User), &rel);
        if let Ok(Put::Written(rev)) = docs.store.put(&key, &data, 0) {
            docs.revs.locked().insert(key, rev);
            done.push(match user {
                Some(u) => format!("users/{u}/{rel}"),
                None => rel,
            });
        }
    }
    done
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

/// A change to a shared document under way: made with [`begin`], published with
/// [`Pending::finish`].
pub struct Pending {
    key: String,
    rel: String,
    user: Option<String>,
    rev: u64,
}

fn unavailable(e: &str) -> ToolError {
    ToolError::ExecutionFailed(format!(
        "memory and context files are shared by the cluster and the shared store did not answer ({e}); nothing was written, try again"
    ))
}

/// Before changing shared document `rel` of `scope` of the agent working in `agent`: bring the
/// local copy up to the store's revision. `None` when `rel` is not shared, there is no shared
/// store, or `agent` is not the workspace shared (another agent's).
///
/// # Errors
/// The store did not answer or the local copy could not be written.
pub fn begin(agent: &Workspace, scope: Scope<'_>, rel: &str) -> Result<Option<Pending>, ToolError> {
    let Some(docs) = DOCS.get() else {
        return Ok(None);
    };
    if agent.root() != docs.workspace.root() {
        return Ok(None);
    }
    let rel = rel.trim_start_matches("./");
    if !is_shared(rel) {
        return Ok(None);
    }
    let key = key_of(scope, rel);
    let current = docs.store.get(&key).map_err(|e| unavailable(&e))?;
    let _g = LOCK.locked();
    let rev = match current {
        Some((data, rev)) => {
            apply_locked(docs, &key, Some(&data), rev)?;
            rev
        }
        None => 0,
    };
    Ok(Some(Pending {
        key,
        rel: rel.to_string(),
        user: match scope {
            Scope::Agent => None,
            Scope::User(u) => Some(u.to_string()),
        },
        rev,
    }))
}

impl Pending {
    /// Refuse `len` bytes before anything is written (the store's size limit).
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

    /// Put the local copy back to the store's current revision (nothing of this change kept).
    fn restore(&self, docs: &Docs) -> Result<(), ToolError> {
        let Ok(current) = docs.store.get(&self.key) else {
            // Re-read at the next chance.
            docs.revs.locked().remove(&self.key);
            return Ok(());
        };
        // Absent from the store: the local file is left as it is (it may predate the cluster).
        let Some((d, r)) = current else {
            return Ok(());
        };
        let ws = scope_ws(docs, self.user.as_deref())?;
        write_local(&ws, &self.rel, Some(&d))?;
        docs.revs.locked().insert(self.key.clone(), r);
        super::memory::touched();
        Ok(())
    }

    /// Publish the local copy's new content `data`, written from the revision [`begin`] saw.
    /// On a conflict the local copy is put back to the store's current revision.
    ///
    /// # Errors
    /// `Conflict` (another node changed the document meanwhile: nothing of this write is kept),
    /// the store did not answer, or the document is too large.
    pub fn finish(self, data: &[u8]) -> Result<(), ToolError> {
        let Some(docs) = DOCS.get() else {
            return Ok(());
        };
        if data.len() > MAX_SHARED_BYTES {
            let _g = LOCK.locked();
            self.restore(docs)?;
            return Err(ToolError::InvalidArgs(format!(
                "`{}` would be {} bytes; shared memory and context files are limited to {MAX_SHARED_BYTES} bytes",
                self.rel,
                data.len()
            )));
        }
        let _g = LOCK.locked();
        match docs.store.put(&self.key, data, self.rev) {
            Ok(Put::Written(rev)) => {
                docs.revs.locked().insert(self.key.clone(), rev);
                Ok(())
            }
            Ok(Put::Conflict) => {
                self.restore(docs)?;
                Err(ToolError::ExecutionFailed(format!(
                    "`{}` was changed on another node of the cluster meanwhile; your change was not saved. Read it again and redo the change",
                    self.rel
                )))
            }
            Err(e) => {
                // The local copy is ahead of the store: re-read it at the next chance.
                docs.revs.locked().remove(&self.key);
                Err(unavailable(&e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_only_documents_are_shared() {
        for (scope, rel) in [
            (Scope::Agent, "MEMORY.md"),
            (Scope::Agent, "memory/2026-11/a b.md"),
            (Scope::User("telegram-42"), "USER.md"),
            (Scope::User("http-x.y"), "memory/n.md"),
        ] {
            let k = key_of(scope, rel);
            let (user, r) = parse_key(&k).unwrap_or_default();
            assert_eq!(r, rel);
            match scope {
                Scope::Agent => assert!(user.is_none()),
                Scope::User(u) => assert_eq!(user.as_deref(), Some(u)),
            }
        }
        assert_ne!(
            key_of(Scope::Agent, "a/b.md"),
            key_of(Scope::Agent, "a.b.md")
        );
        assert!(is_shared("USER.md") && is_shared("./MEMORY.md") && is_shared("memory/x.md"));
        assert!(
            !is_shared("notes.md") && !is_shared("memory/../x.md") && !is_shared("memory/x.txt")
        );
    }
}
