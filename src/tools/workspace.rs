//! The workspace root as an open directory handle. File tools open paths beneath it with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`, so the kernel, not a string check,
//! refuses `..`, absolute paths and symlinks that lead out, with no check-then-open race.
//!
//! Every descriptor opened here is then checked against the daemon's protected paths
//! ([`super::protected::Guard`]): the config, credentials and store are refused even when they
//! lie inside the workspace, by whatever name, symlink or hard link the model reaches them.

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::protected::{Guard, ProtectedPaths};
use super::ToolError;

use crate::types::RwLockExt;

/// An open workspace directory.
#[derive(Debug)]
pub struct Workspace {
    root: PathBuf,
    dir: OwnedFd,
    /// The daemon's own files, refused to every open; replaced when a reload changes them.
    guard: RwLock<Arc<Guard>>,
    /// The list the guard was made from (for [`Self::open_user`]).
    paths: RwLock<ProtectedPaths>,
    /// The chat users' own memory directories (see [`Self::open_user`]).
    users: Option<PathBuf>,
}

impl Workspace {
    /// Create (if needed) and open the workspace directory.
    ///
    /// # Errors
    /// The directory cannot be created or opened.
    pub fn open(root: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(root)?;
        let dir = rustix::fs::open(
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Self {
            root: root.to_path_buf(),
            dir,
            guard: RwLock::new(Arc::new(Guard::default())),
            paths: RwLock::new(ProtectedPaths::default()),
            users: None,
        })
    }

    /// With `dir` as the directory of the chat users' own memory (`~/.clawft/users`, outside
    /// the workspace: see [`Self::open_user`]).
    #[must_use]
    pub fn with_users_dir(mut self, dir: PathBuf) -> Self {
        self.users = Some(dir);
        self
    }

    /// The directory of the chat users' own memory, if this workspace has one.
    pub fn users_dir(&self) -> Option<&Path> {
        self.users.as_deref()
    }

    /// The chat user `name`'s own memory directory (`<users dir>/<name>`, made with mode 0700
    /// when missing and `create`) as a workspace of its own: every open in it stays beneath it
    /// (`openat2`), and the daemon's protected paths are still refused. It lies outside the
    /// agent's workspace, which the file tools and the exec sandbox never leave, and the users
    /// directory is itself a protected path: only the memory tools reach it, each user their
    /// own directory.
    ///
    /// # Errors
    /// `InvalidPath` for a name that is not one path component; `FileNotFound` when it does not
    /// exist (without `create`); `ExecutionFailed` when this workspace has no users directory.
    pub fn open_user(&self, name: &str, create: bool) -> Result<Self, ToolError> {
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
            return Err(ToolError::InvalidPath(format!(
                "invalid user directory {name:?}"
            )));
        }
        let Some(users) = &self.users else {
            return Err(ToolError::ExecutionFailed(
                "per-user memory is not available here (no users directory)".into(),
            ));
        };
        if create {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(users)
                .map_err(|e| {
                    ToolError::ExecutionFailed(format!("cannot make {}: {e}", users.display()))
                })?;
        }
        let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let base = rustix::fs::open(users, dir_flags, Mode::empty()).map_err(|e| {
            if e == Errno::NOENT {
                ToolError::FileNotFound(format!("users/{name}: no such directory"))
            } else {
                map_errno("users", e)
            }
        })?;
        let how = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_SYMLINKS;
        let open = || rustix::fs::openat2(&base, name, dir_flags, Mode::empty(), how);
        let fd = match open() {
            Ok(fd) => fd,
            Err(Errno::NOENT) if create => {
                match rustix::fs::mkdirat(&base, name, Mode::from_raw_mode(0o700)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(map_errno(name, e)),
                }
                open().map_err(|e| map_errno(name, e))?
            }
            Err(Errno::NOENT) => {
                return Err(ToolError::FileNotFound(format!(
                    "users/{name}: no such directory"
                )))
            }
            Err(e) => return Err(map_errno(name, e)),
        };
        let paths = self.paths.read_locked().clone();
        let root = users.join(name);
        let guard = Guard::new(&paths, &root);
        guard.check_fd(fd.as_fd(), name)?;
        Ok(Self {
            root,
            dir: fd,
            guard: RwLock::new(Arc::new(guard)),
            paths: RwLock::new(paths),
            users: None,
        })
    }

    /// With `paths` refused to every file tool (see [`Self::set_protected`]).
    pub fn with_protected(self, paths: &ProtectedPaths) -> Self {
        self.set_protected(paths);
        self
    }

    /// Refuse `paths` (the daemon's config, credentials, store and state directory) to every
    /// open from now on, whatever the workspace is.
    pub fn set_protected(&self, paths: &ProtectedPaths) {
        let guard = Arc::new(Guard::new(paths, &self.root));
        *self.guard.write_locked() = guard;
        *self.paths.write_locked() = paths.clone();
    }

    /// The protected-path checks in force.
    pub fn guard(&self) -> Arc<Guard> {
        self.guard.read_locked().clone()
    }

    /// Its path (for messages and the system prompt; never for access checks).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Open `rel` beneath the workspace with `flags`, refusing the daemon's protected paths.
    ///
    /// # Errors
    /// `InvalidPath` for escapes, `FileNotFound`, `PermissionDenied` (a protected path too), or
    /// `ExecutionFailed`.
    pub fn open_beneath(&self, rel: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, ToolError> {
        if rel.contains('\0') {
            return Err(ToolError::InvalidPath(format!(
                "invalid path {rel:?}: contains NUL"
            )));
        }
        let rel = if rel.is_empty() { "." } else { rel };
        let fd = self
            .open_raw(rel, flags, mode)
            .map_err(|e| map_errno(rel, e))?;
        self.guard().check_fd(fd.as_fd(), rel)?;
        Ok(fd)
    }

    /// The first `max` bytes of the regular file `rel`, opened with [`Self::open_beneath`]
    /// (no symlink out, no protected path, no blocking on a FIFO); `None` when it does not
    /// exist. For the files the gateway reads itself (context files, `HEARTBEAT.md`).
    ///
    /// # Errors
    /// As [`Self::open_beneath`]; `ExecutionFailed` for a non-regular file or a read error.
    pub fn read_beneath(&self, rel: &str, max: u64) -> Result<Option<Vec<u8>>, ToolError> {
        use std::io::Read;
        let fd = match self.open_beneath(rel, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty()) {
            Ok(fd) => fd,
            Err(ToolError::FileNotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let f = std::fs::File::from(fd);
        if !f.metadata().is_ok_and(|m| m.is_file()) {
            return Err(ToolError::ExecutionFailed(format!(
                "{rel} is not a regular file"
            )));
        }
        let mut buf = Vec::new();
        f.take(max)
            .read_to_end(&mut buf)
            .map_err(|e| ToolError::ExecutionFailed(format!("{rel}: {e}")))?;
        Ok(Some(buf))
    }
}

/// Most tries to pick an unused temporary name for an atomic write.
const TEMP_NAME_TRIES: usize = 16;

impl Workspace {
    /// The open workspace directory (for `*at` calls relative to it).
    pub fn dir_fd(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }

    /// Open `rel` beneath the workspace, returning the raw errno, without the protected-path
    /// check: every caller checks what it opened with the guard.
    fn open_raw(&self, rel: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
        let rel = if rel.is_empty() { "." } else { rel };
        if rel.contains('\0') {
            return Err(Errno::INVAL);
        }
        rustix::fs::openat2(
            &self.dir,
            rel,
            flags | OFlags::CLOEXEC,
            mode,
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
        )
    }

    /// Open the directory that holds the file `rel` and return it with the file's name, so the
    /// file is then created, replaced or inspected with `*at` calls on that directory handle
    /// and never through a string path.
    ///
    /// With `create`, missing parent directories are made one component at a time: each prefix
    /// is opened beneath the workspace by the kernel (`openat2` RESOLVE_BENEATH), a missing
    /// component is made with `mkdirat` relative to its already-opened parent, then reopened
    /// with the kernel check. A symlink planted anywhere on the way is either followed inside
    /// the workspace or refused; nothing is ever created outside.
    ///
    /// The directory and the file's path are checked against the daemon's protected paths
    /// (before anything is created).
    ///
    /// # Errors
    /// `InvalidPath` for absolute paths, escapes, an empty name or a final `.`/`..`;
    /// `FileNotFound` for a missing parent without `create`; `PermissionDenied` for a protected
    /// path; others from [`map_errno`].
    pub fn open_parent(&self, rel: &str, create: bool) -> Result<(OwnedFd, String), ToolError> {
        if rel.contains('\0') {
            return Err(ToolError::InvalidPath(format!(
                "invalid path {rel:?}: contains NUL"
            )));
        }
        if rel.starts_with('/') {
            return Err(map_errno(rel, Errno::XDEV));
        }
        check_shape(rel)?;
        let (parent, name) = match rel.rsplit_once('/') {
            Some((p, n)) => (p, n),
            None => ("", rel),
        };
        if name.is_empty() || name == "." || name == ".." {
            return Err(ToolError::InvalidPath(format!(
                "`{rel}` does not name a file; give a path like `dir/file.txt`"
            )));
        }
        let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY;
        let guard = self.guard();
        let dir = match self.open_raw(parent, dir_flags, Mode::empty()) {
            Ok(fd) => {
                guard.check_fd(fd.as_fd(), rel)?;
                fd
            }
            Err(Errno::NOENT) if create => self.make_dirs(parent, rel, &guard)?,
            Err(e) => return Err(map_errno(if parent.is_empty() { "." } else { parent }, e)),
        };
        guard.check_entry(dir.as_fd(), name, rel)?;
        Ok((dir, name.to_string()))
    }

    /// Create the directories of `parent` component by component (see [`Self::open_parent`]),
    /// never inside a protected directory nor at a protected path (`rel` names the file for
    /// refusals).
    fn make_dirs(&self, parent: &str, rel: &str, guard: &Guard) -> Result<OwnedFd, ToolError> {
        let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY;
        let mut cur = self
            .open_raw(".", dir_flags, Mode::empty())
            .map_err(|e| map_errno(".", e))?;
        let mut prefix = String::new();
        for comp in parent.split('/') {
            if comp.is_empty() || comp == "." {
                continue;
            }
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(comp);
            match self.open_raw(&prefix, dir_flags, Mode::empty()) {
                Ok(fd) => {
                    guard.check_fd(fd.as_fd(), rel)?;
                    cur = fd;
                }
                Err(Errno::NOENT) if comp != ".." => {
                    guard.check_entry(cur.as_fd(), comp, rel)?;
                    match rustix::fs::mkdirat(&cur, comp, Mode::from_raw_mode(0o755)) {
                        // EEXIST: made concurrently (or a dangling symlink): reopen decides.
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(map_errno(&prefix, e)),
                    }
                    cur = self
                        .open_raw(&prefix, dir_flags, Mode::empty())
                        .map_err(|e| map_errno(&prefix, e))?;
                    guard.check_fd(cur.as_fd(), rel)?;
                }
                Err(e) => return Err(map_errno(&prefix, e)),
            }
        }
        Ok(cur)
    }
}

/// The deepest path a file tool opens or creates, in components.
pub const MAX_PATH_DEPTH: usize = 64;
/// The longest path a file tool takes, in bytes (Linux's `PATH_MAX` less its NUL).
pub const MAX_PATH_BYTES: usize = 4095;
/// The longest name of one component, in bytes (Linux's `NAME_MAX`).
pub const MAX_NAME_BYTES: usize = 255;

/// Refuse, before anything is opened or created, a path too deep or too long for a file tool:
/// the work of a call stays bounded whatever path the model sends.
fn check_shape(rel: &str) -> Result<(), ToolError> {
    let shown = || {
        let mut end = rel.len().min(60);
        while !rel.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &rel[..end])
    };
    if rel.len() > MAX_PATH_BYTES {
        return Err(ToolError::InvalidPath(format!(
            "path `{}` is {} bytes long; the limit is {MAX_PATH_BYTES}",
            shown(),
            rel.len()
        )));
    }
    let mut depth = 0;
    for comp in rel.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if comp.len() > MAX_NAME_BYTES {
            return Err(ToolError::InvalidPath(format!(
                "a name in `{}` is {} bytes long; the limit is {MAX_NAME_BYTES}",
                shown(),
                comp.len()
            )));
        }
        depth += 1;
    }
    if depth > MAX_PATH_DEPTH {
        return Err(ToolError::InvalidPath(format!(
            "path `{}` is {depth} directories deep; the limit is {MAX_PATH_DEPTH}",
            shown()
        )));
    }
    Ok(())
}

/// What is currently at `name` in `dir` (not following a symlink there).
#[derive(Clone, Copy, Debug)]
pub struct Existing {
    /// Permission bits to keep on the replacement.
    pub mode: u32,
    /// Device and inode, to notice a concurrent replacement.
    pub id: (u64, u64),
}

/// Check the entry `name` in `dir` before replacing it: `Ok(None)` if absent; refuses
/// directories, symlinks, special files and hard-linked files (`st_nlink > 1`, which would
/// alias a file elsewhere, possibly outside the workspace).
///
/// `ws` and `rel` are used to classify a symlink that leads out as `InvalidPath`.
///
/// # Errors
/// `InvalidArgs` (directory, special file), `PermissionDenied` (symlink, hard link),
/// `InvalidPath` (symlink leading out), or a mapped errno.
pub fn check_replaceable(
    ws: &Workspace,
    dir: &OwnedFd,
    name: &str,
    rel: &str,
) -> Result<Option<Existing>, ToolError> {
    let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(map_errno(rel, e)),
    };
    let ft = FileType::from_raw_mode(st.st_mode);
    if ft.is_dir() {
        return Err(ToolError::InvalidArgs(format!(
            "`{rel}` is a directory; give the path of a file inside it"
        )));
    }
    if ft.is_symlink() {
        // Say "outside" when it leads out, so the model does not try the target either.
        if let Err(e @ ToolError::InvalidPath(_)) =
            ws.open_beneath(rel, OFlags::PATH, Mode::empty())
        {
            return Err(e);
        }
        return Err(ToolError::PermissionDenied(format!(
            "`{rel}` is a symbolic link; writes do not go through symlinks: use the path of its target"
        )));
    }
    if !ft.is_file() {
        return Err(ToolError::InvalidArgs(format!(
            "`{rel}` is not a regular file"
        )));
    }
    refuse_hard_link(&st, rel)?;
    Ok(Some(Existing {
        mode: st.st_mode & 0o777,
        id: (st.st_dev, st.st_ino),
    }))
}

/// Refuse a file with more than one hard link.
///
/// # Errors
/// `PermissionDenied`.
pub fn refuse_hard_link(st: &rustix::fs::Stat, rel: &str) -> Result<(), ToolError> {
    if st.st_nlink > 1 {
        return Err(ToolError::PermissionDenied(format!(
            "`{rel}` has {} hard links; hard links are refused because writing would also change the other names of the file, possibly outside the workspace. Write a new file instead",
            st.st_nlink
        )));
    }
    Ok(())
}

/// Replace (or create) `name` in `dir` atomically: the data goes to a fresh temporary file in
/// the same directory (`O_CREAT|O_EXCL|O_NOFOLLOW` relative to `dir`), is fsynced, then
/// `renameat` puts it in place; the directory is fsynced afterwards. A reader sees the old or
/// the new content, never a mix, and a symlink or hard link at `name` is replaced, never
/// written through.
///
/// `expect`: when the target existed, the identity seen by [`check_replaceable`]; if the entry
/// changed since, nothing is replaced.
///
/// # Errors
/// `ExecutionFailed` (I/O, or the entry was replaced meanwhile), or a mapped errno
/// (`InvalidArgs` if `name` became a directory).
pub fn write_atomic(
    dir: &OwnedFd,
    name: &str,
    data: &[u8],
    mode: u32,
    expect: Option<Existing>,
    rel: &str,
) -> Result<(), ToolError> {
    write_atomic_checked(dir, name, data, mode, expect, rel).map_err(ToolError::from)
}

/// Why [`write_atomic_checked`] wrote nothing: a caller that retries branches on
/// [`WriteError::Replaced`].
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The entry changed between the check and the write (another writer replaced it).
    #[error(
        "`{0}` was replaced by someone else while it was being written; read it again and retry"
    )]
    Replaced(String),
    /// Any other failure.
    #[error(transparent)]
    Failed(#[from] ToolError),
}

impl From<WriteError> for ToolError {
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::Replaced(_) => ToolError::ExecutionFailed(e.to_string()),
            WriteError::Failed(t) => t,
        }
    }
}

/// [`write_atomic`], telling a replaced entry apart ([`WriteError::Replaced`]).
///
/// # Errors
/// As [`write_atomic`].
pub fn write_atomic_checked(
    dir: &OwnedFd,
    name: &str,
    data: &[u8],
    mode: u32,
    expect: Option<Existing>,
    rel: &str,
) -> Result<(), WriteError> {
    let mut created = None;
    for _ in 0..TEMP_NAME_TRIES {
        let tmp = format!(".weft-{:016x}.tmp", fastrand::u64(..));
        match rustix::fs::openat(
            dir,
            tmp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        ) {
            Ok(fd) => {
                created = Some((tmp, fd));
                break;
            }
            Err(Errno::EXIST) => {}
            Err(e) => return Err(map_errno(rel, e).into()),
        }
    }
    let Some((tmp, fd)) = created else {
        return Err(ToolError::ExecutionFailed(format!(
            "`{rel}`: could not create a temporary file next to it"
        ))
        .into());
    };
    let result = (|| -> Result<(), WriteError> {
        let mut file = std::fs::File::from(fd);
        let io = |e: std::io::Error| ToolError::ExecutionFailed(format!("writing `{rel}`: {e}"));
        file.write_all(data).map_err(io)?;
        // Keep the old file's permissions (umask applied to new ones at create).
        if expect.is_some() {
            rustix::fs::fchmod(&file, Mode::from_raw_mode(mode)).map_err(|e| map_errno(rel, e))?;
        }
        file.sync_all().map_err(io)?;
        drop(file);
        if let Some(old) = expect {
            let now = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                .map(|st| (st.st_dev, st.st_ino))
                .ok();
            if now != Some(old.id) {
                return Err(WriteError::Replaced(rel.to_string()));
            }
        }
        rustix::fs::renameat(dir, tmp.as_str(), dir, name).map_err(|e| map_errno(rel, e).into())
    })();
    if result.is_err() {
        let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
        return result;
    }
    // Durability of the rename; failure here does not undo the write.
    let _ = rustix::fs::fsync(dir);
    Ok(())
}

/// Map an errno from an open beneath the workspace to the tool error the model sees.
pub fn map_errno(rel: &str, e: rustix::io::Errno) -> ToolError {
    use rustix::io::Errno;
    match e {
        Errno::XDEV | Errno::LOOP => ToolError::InvalidPath(format!(
            "path `{rel}` is outside the workspace (absolute paths, `..` and symlinks leading out are refused); use a path relative to the workspace"
        )),
        Errno::NOENT => ToolError::FileNotFound(format!(
            "`{rel}` does not exist in the workspace; use list_directory to see what is there"
        )),
        Errno::NOTDIR => ToolError::InvalidPath(format!("`{rel}`: a component is not a directory")),
        Errno::ISDIR => ToolError::InvalidArgs(format!("`{rel}` is a directory")),
        Errno::ACCESS | Errno::PERM => ToolError::PermissionDenied(format!("`{rel}`: permission denied")),
        Errno::NAMETOOLONG => ToolError::InvalidPath(format!("`{rel}`: name too long")),
        other => ToolError::ExecutionFailed(format!("`{rel}`: {other}")),
    }
}

/// Test fixture shared by the file-tool tests: a workspace and, next to it, an outside
/// directory holding a canary file that no tool may read or change.
#[cfg(test)]
pub(crate) mod testutil {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::collections::BTreeMap;
    use std::os::unix::fs::MetadataExt;
    use std::path::PathBuf;
    use std::sync::Arc;

    use serde_json::Value;
    use tokio_util::sync::CancellationToken;

    use super::Workspace;
    use crate::tools::ToolContext;
    use crate::types::SessionKey;

    /// Marker text of the canary; it must never appear in any result.
    pub(crate) const CANARY_MARK: &str = "CANARY-7f3a9c";
    /// Full canary content.
    pub(crate) const CANARY: &str = "CANARY-7f3a9c top secret inside\n";

    pub(crate) struct Fixture {
        pub tmp: tempfile::TempDir,
        pub ws: PathBuf,
        pub outside: PathBuf,
        pub ctx: ToolContext,
        /// Outside files: name → (content, inode) expected at the end.
        expect: BTreeMap<String, (String, u64)>,
    }

    impl Fixture {
        pub fn new() -> Self {
            Self::with(tempfile::tempdir().unwrap())
        }

        /// On tmpfs when there is one (fsync is free there: for tests making thousands of
        /// writes), else as [`Self::new`].
        pub fn on_tmpfs() -> Self {
            match tempfile::tempdir_in("/dev/shm") {
                Ok(t) => Self::with(t),
                Err(_) => Self::new(),
            }
        }

        fn with(tmp: tempfile::TempDir) -> Self {
            let ws = tmp.path().join("ws");
            let outside = tmp.path().join("outside");
            std::fs::create_dir_all(&ws).unwrap();
            std::fs::create_dir_all(&outside).unwrap();
            let ctx = ToolContext {
                workspace: Arc::new(Workspace::open(&ws).unwrap()),
                session: SessionKey::parse("t:1").unwrap(),
                cancel: CancellationToken::new(),
                user_dir: None,
                sender: None,
                call_id: None,
                turn: Default::default(),
            };
            let mut f = Self {
                tmp,
                ws,
                outside,
                ctx,
                expect: BTreeMap::new(),
            };
            f.add_outside("canary.txt", CANARY);
            f
        }

        /// Put another file outside the workspace (checked like the canary).
        pub fn add_outside(&mut self, name: &str, content: &str) {
            let p = self.outside.join(name);
            std::fs::write(&p, content).unwrap();
            let ino = std::fs::metadata(&p).unwrap().ino();
            self.expect.insert(name.into(), (content.into(), ino));
        }

        pub fn canary(&self) -> PathBuf {
            self.outside.join("canary.txt")
        }

        /// Write a file in the workspace (parents created).
        pub fn put(&self, rel: &str, content: &str) {
            let p = self.ws.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }

        /// The outside directory holds exactly the files put there, unchanged (same content,
        /// same inode: not replaced either).
        pub fn assert_outside_intact(&self) {
            let mut names: Vec<String> = std::fs::read_dir(&self.outside)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            let want: Vec<String> = self.expect.keys().cloned().collect();
            assert_eq!(
                names, want,
                "files appeared or vanished outside the workspace"
            );
            for (name, (content, ino)) in &self.expect {
                let p = self.outside.join(name);
                assert_eq!(
                    &std::fs::read_to_string(&p).unwrap(),
                    content,
                    "{name} changed"
                );
                assert_eq!(
                    std::fs::metadata(&p).unwrap().ino(),
                    *ino,
                    "{name} replaced"
                );
            }
        }

        /// No result ever carries the canary.
        pub fn assert_clean(v: &Value) {
            assert!(
                !v.to_string().contains(CANARY_MARK),
                "canary leaked into a result: {v}"
            );
        }
    }
}
