//! The daemon's own files, which no file tool reads, writes, lists or searches: its config, the
//! credentials, the store and the state directory (`~/.clawft`), wherever the workspace is.
//!
//! [`ProtectedPaths`] is computed once by the composition root (`daemon::build::protected_paths`)
//! for both the file tools and the exec sandbox. [`Guard`] checks what an open beneath the
//! workspace actually reached, not the path the model wrote: the opened object's device and inode
//! against every protected file and directory (any name of it: a hard link, a bind mount), the
//! kernel's path of the descriptor and of each directory above it against the protected paths
//! (any spelling, any symlink), and for a file with several links, the inodes of the store and
//! credentials directories. It never follows a string path the model gave.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType};
use rustix::io::Errno;

use super::ToolError;

/// Most directory entries looked at to find the other names of a hard-linked file in the store
/// and credentials directories; past it the file is refused (fail closed).
const LINK_SEARCH_BUDGET: usize = 10_000;

/// What a protected path is (named in refusals and in `weft doctor`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProtectedKind {
    /// The config file, its directory, or a config file in the state directory.
    Config,
    /// `$CREDENTIALS_DIRECTORY` or a file a secret was read from (`*_file`).
    Credentials,
    /// The store directory (sled, the gateway's files).
    Store,
    /// The state directory (`~/.clawft` or `$CLAWFT_HOME`).
    State,
    /// `~/.clawft/users`: each chat user's private memory and `USER.md` (`memory.scope =
    /// "user"`), reached only through the memory tools, each user their own.
    UserMemory,
}

impl ProtectedKind {
    /// "config", "credentials", "store" or "state directory".
    pub fn describe(self) -> &'static str {
        match self {
            ProtectedKind::Config => "config",
            ProtectedKind::Credentials => "credentials",
            ProtectedKind::Store => "store",
            ProtectedKind::State => "state directory",
            ProtectedKind::UserMemory => "per-user memory",
        }
    }
}

/// One protected file or directory (a directory protects everything beneath it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtectedPath {
    /// The path (absolute, or relative to the daemon's working directory).
    pub path: PathBuf,
    /// What it is.
    pub kind: ProtectedKind,
}

/// The daemon's protected paths, in the order they were added, without duplicates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProtectedPaths(Vec<ProtectedPath>);

impl ProtectedPaths {
    /// Add `path` (ignored when already there).
    pub fn push(&mut self, path: impl Into<PathBuf>, kind: ProtectedKind) {
        let path = path.into();
        if path.as_os_str().is_empty() || self.0.iter().any(|p| p.path == path) {
            return;
        }
        self.0.push(ProtectedPath { path, kind });
    }

    /// Keep the entries `keep` accepts.
    pub fn retain(&mut self, keep: impl FnMut(&ProtectedPath) -> bool) {
        self.0.retain(keep);
    }

    /// The entries.
    pub fn iter(&self) -> impl Iterator<Item = &ProtectedPath> {
        self.0.iter()
    }

    /// The paths alone (the exec sandbox's list).
    pub fn paths(&self) -> Vec<PathBuf> {
        self.0.iter().map(|p| p.path.clone()).collect()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// `p` made absolute with its symbolic links resolved: the canonical path of its longest
/// existing ancestor, then the rest as written (a protected path may not exist yet and must still
/// be refused to a write that would create it).
pub fn canonical(p: &Path) -> PathBuf {
    let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let mut rest: Vec<&OsStr> = Vec::new();
    let mut cur = abs.as_path();
    loop {
        if let Ok(mut c) = std::fs::canonicalize(cur) {
            for r in rest.iter().rev() {
                c.push(r);
            }
            return c;
        }
        match (cur.parent(), cur.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name);
                cur = parent;
            }
            _ => return abs,
        }
    }
}

/// A protected path resolved for checks.
#[derive(Debug)]
struct Entry {
    /// Canonical path (resolved when the guard was made).
    path: PathBuf,
    kind: ProtectedKind,
}

/// The identity of what a protected path names now.
struct Live {
    id: (u64, u64),
    is_dir: bool,
    kind: ProtectedKind,
}

/// The checks the workspace runs on every open (see the module doc). Empty: checks nothing.
#[derive(Debug, Default)]
pub struct Guard {
    entries: Vec<Entry>,
    /// The workspace root, canonical: the directories above an opened file are examined up to
    /// it.
    root: PathBuf,
}

impl Guard {
    /// Resolve `paths` for the workspace at `root`. Paths that contain the workspace are left
    /// out (the workspace itself cannot be refused; what they hold outside it is out of the file
    /// tools' reach anyway); `daemon::build::protected_paths` lists the files of such a
    /// directory that lie inside the workspace separately.
    pub fn new(paths: &ProtectedPaths, root: &Path) -> Self {
        let root = canonical(root);
        let entries = paths
            .iter()
            .map(|p| Entry {
                path: canonical(&p.path),
                kind: p.kind,
            })
            .filter(|e| !root.starts_with(&e.path))
            .collect();
        Self { entries, root }
    }

    /// Whether there is nothing to check.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The protected entries as they are now (device and inode; a missing one is skipped).
    fn live(&self) -> Vec<Live> {
        self.entries
            .iter()
            .filter_map(|e| {
                let m = std::fs::metadata(&e.path).ok()?;
                Some(Live {
                    id: (m.dev(), m.ino()),
                    is_dir: m.is_dir(),
                    kind: e.kind,
                })
            })
            .collect()
    }

    /// The protected path that is `path` or holds it, if any.
    fn covering(&self, path: &Path) -> Option<ProtectedKind> {
        self.entries
            .iter()
            .find(|e| path.starts_with(&e.path))
            .map(|e| e.kind)
    }

    /// Refuse the descriptor `fd`, just opened beneath the workspace as `rel`, when it is a
    /// protected file or directory or lies beneath one, by whatever name it was reached.
    ///
    /// # Errors
    /// `PermissionDenied` naming what it is; `ExecutionFailed` when it cannot be checked (fails
    /// closed).
    pub fn check_fd(&self, fd: BorrowedFd<'_>, rel: &str) -> Result<(), ToolError> {
        if self.entries.is_empty() {
            return Ok(());
        }
        let st = rustix::fs::fstat(fd).map_err(|e| unverifiable(rel, &e.to_string()))?;
        let live = self.live();
        let id = (st.st_dev, st.st_ino);
        // The object itself, by any name: a hard link to a protected file, a bind mount.
        if let Some(l) = live.iter().find(|l| l.id == id) {
            return Err(refusal(rel, l.kind));
        }
        // Where the kernel says it is: every spelling and symlink resolved.
        let path = fd_path(fd, rel)?;
        if let Some(kind) = self.covering(&path) {
            return Err(refusal(rel, kind));
        }
        // The directories above it inside the workspace, by identity: a protected directory
        // mounted or linked under another name.
        if path.starts_with(&self.root) {
            for dir in path.ancestors().skip(1) {
                if dir == self.root || !dir.starts_with(&self.root) {
                    break;
                }
                let Ok(m) = std::fs::metadata(dir) else {
                    continue;
                };
                if let Some(l) = live.iter().find(|l| l.is_dir && l.id == (m.dev(), m.ino())) {
                    return Err(refusal(rel, l.kind));
                }
            }
        }
        // Another name of a file inside the store or the credentials directory.
        if FileType::from_raw_mode(st.st_mode).is_file() && st.st_nlink > 1 {
            match self.linked(id, &live) {
                Ok(None) => {}
                Ok(Some(kind)) => return Err(refusal(rel, kind)),
                Err(TooMany) => return Err(unverifiable(
                    rel,
                    "it has several hard links and the protected directories are too large to search for the others",
                )),
            }
        }
        Ok(())
    }

    /// Which of the store and credentials directories holds another name of the file `id`, if
    /// any (a bounded walk).
    ///
    /// # Errors
    /// [`TooMany`] past [`LINK_SEARCH_BUDGET`] entries: the caller fails closed.
    fn linked(&self, id: (u64, u64), live: &[Live]) -> Result<Option<ProtectedKind>, TooMany> {
        let mut budget = LINK_SEARCH_BUDGET;
        let mut seen = HashSet::new();
        let dirs = self.entries.iter().filter(|e| {
            matches!(e.kind, ProtectedKind::Store | ProtectedKind::Credentials)
                && live.iter().any(|l| l.kind == e.kind && l.is_dir)
        });
        for e in dirs {
            let mut stack = vec![e.path.clone()];
            while let Some(dir) = stack.pop() {
                let Ok(rd) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for ent in rd.flatten() {
                    if budget == 0 {
                        return Err(TooMany);
                    }
                    budget -= 1;
                    let Ok(m) = ent.metadata() else { continue };
                    if (m.dev(), m.ino()) == id {
                        return Ok(Some(e.kind));
                    }
                    if m.is_dir() && seen.insert((m.dev(), m.ino())) {
                        stack.push(ent.path());
                    }
                }
            }
        }
        Ok(None)
    }

    /// Refuse creating or replacing `name` in the directory `dir` (already checked with
    /// [`Guard::check_fd`]) when that path, or what is there now, is protected.
    ///
    /// # Errors
    /// As [`Guard::check_fd`].
    pub fn check_entry(&self, dir: BorrowedFd<'_>, name: &str, rel: &str) -> Result<(), ToolError> {
        if self.entries.is_empty() {
            return Ok(());
        }
        if let Some(kind) = self.covering(&fd_path(dir, rel)?.join(name)) {
            return Err(refusal(rel, kind));
        }
        match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => {
                if let Some(l) = self
                    .live()
                    .into_iter()
                    .find(|l| l.id == (st.st_dev, st.st_ino))
                {
                    return Err(refusal(rel, l.kind));
                }
                Ok(())
            }
            Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(unverifiable(rel, &e.to_string())),
        }
    }

    /// What a listing shows as protected in the directory `dir`: see [`Listing::kind_of`].
    ///
    /// # Errors
    /// `ExecutionFailed` when the directory's path cannot be read.
    pub fn listing(&self, dir: BorrowedFd<'_>, rel: &str) -> Result<Listing<'_>, ToolError> {
        if self.entries.is_empty() {
            return Ok(Listing {
                guard: self,
                dir: PathBuf::new(),
                live: Vec::new(),
            });
        }
        Ok(Listing {
            guard: self,
            dir: fd_path(dir, rel)?,
            live: self.live(),
        })
    }

    /// Whether the workspace-relative path `rel` (as a walk found it, without following
    /// symlinks) is protected or beneath a protected path: searches prune it.
    pub fn covers_rel(&self, rel: &Path) -> bool {
        !self.entries.is_empty() && self.covering(&self.root.join(rel)).is_some()
    }
}

/// The protected entries of one directory, for listings.
pub struct Listing<'a> {
    guard: &'a Guard,
    dir: PathBuf,
    live: Vec<Live>,
}

impl Listing<'_> {
    /// The kind of protection of the entry `name` (with its `lstat`), if it is protected.
    pub fn kind_of(&self, name: &OsStr, st: Option<&rustix::fs::Stat>) -> Option<ProtectedKind> {
        if self.guard.entries.is_empty() {
            return None;
        }
        if let Some(k) = self.guard.covering(&self.dir.join(name)) {
            return Some(k);
        }
        let st = st?;
        let id = (st.st_dev, st.st_ino);
        if let Some(l) = self.live.iter().find(|l| l.id == id) {
            return Some(l.kind);
        }
        if FileType::from_raw_mode(st.st_mode).is_file() && st.st_nlink > 1 {
            // Too many to search: left unmarked; opening it is refused anyway.
            return self.guard.linked(id, &self.live).ok().flatten();
        }
        None
    }
}

/// The search for the other names of a hard-linked file ran out of budget.
#[derive(Debug)]
struct TooMany;

/// The path of an open descriptor, as the kernel has it (`/proc/self/fd`).
fn fd_path(fd: BorrowedFd<'_>, rel: &str) -> Result<PathBuf, ToolError> {
    let p = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| unverifiable(rel, &format!("/proc/self/fd is not readable: {e}")))?;
    // A file unlinked since it was opened: the kernel appends this to the name it had.
    Ok(
        match p.to_str().and_then(|s| s.strip_suffix(" (deleted)")) {
            Some(s) => PathBuf::from(s),
            None => p,
        },
    )
}

/// The refusal the model sees.
fn refusal(rel: &str, kind: ProtectedKind) -> ToolError {
    if kind == ProtectedKind::UserMemory {
        return ToolError::PermissionDenied(format!(
            "`{rel}` is a chat user's private memory; file tools never open it. Use memory_read, memory_write, memory_search and memory_get, which see the current user's own memory"
        ));
    }
    ToolError::PermissionDenied(format!(
        "`{rel}` is the daemon's {} (or inside it); file tools never read, write or list the daemon's config, credentials, store or state directory",
        kind.describe()
    ))
}

/// A check that could not be made: the file is refused.
fn unverifiable(rel: &str, why: &str) -> ToolError {
    ToolError::ExecutionFailed(format!(
        "`{rel}` was refused: cannot check that it is not one of the daemon's protected files ({why})"
    ))
}

#[cfg(test)]
#[path = "protected_tests.rs"]
mod tests;
