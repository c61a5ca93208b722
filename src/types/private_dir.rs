//! A fresh directory only this user can enter, under a name no one can guess in advance.

use std::fs::DirBuilder;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// Create `<base>/<prefix>-<pid>-<random>` with mode 0700 (a name that exists already is
/// skipped, up to 16 tries) and return its path; the caller removes it.
///
/// # Errors
/// The directory cannot be created.
pub fn create(base: &Path, prefix: &str) -> io::Result<PathBuf> {
    let mut last = None;
    for _ in 0..16 {
        let path = base.join(format!(
            "{prefix}-{}-{:016x}",
            std::process::id(),
            fastrand::u64(..)
        ));
        match DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free directory name")))
}
