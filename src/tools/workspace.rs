//! The workspace root as an open directory handle. File tools open paths beneath it with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`, so the kernel, not a string check,
//! refuses `..`, absolute paths and symlinks that lead out, with no check-then-open race.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};

use super::ToolError;

/// An open workspace directory.
#[derive(Debug)]
pub struct Workspace {
    root: PathBuf,
    dir: OwnedFd,
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
        })
    }

    /// Its path (for messages and the system prompt; never for access checks).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Open `rel` beneath the workspace with `flags`.
    ///
    /// # Errors
    /// `InvalidPath` for escapes, `FileNotFound`, `PermissionDenied`, or `ExecutionFailed`.
    pub fn open_beneath(&self, rel: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, ToolError> {
        if rel.contains('\0') {
            return Err(ToolError::InvalidPath(format!(
                "invalid path {rel:?}: contains NUL"
            )));
        }
        let rel = if rel.is_empty() { "." } else { rel };
        rustix::fs::openat2(
            &self.dir,
            rel,
            flags | OFlags::CLOEXEC,
            mode,
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| map_errno(rel, e))
    }
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
