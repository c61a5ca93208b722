//! A fresh directory only this user can enter, under a name no one can guess in advance.

use std::fs::DirBuilder;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::types::MutexExt;

/// Create `<base>/<prefix>-<pid>-<random>` with mode 0700 (a name that exists already is
/// skipped, up to 16 tries) and return its path; the caller removes it. The first call of a
/// process for a `(base, prefix)` also starts the removal of such directories left by dead
/// processes ([`sweep_stale`], on a thread of its own).
///
/// # Errors
/// The directory cannot be created.
pub fn create(base: &Path, prefix: &str) -> io::Result<PathBuf> {
    sweep_once(base, prefix);
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

/// Remove the directories `<base>/<prefix>-<pid>-*` left by processes of this user that are
/// gone (killed before they could clean up, e.g. by `kill -9` or a power cut); how many. A
/// live process's directory, another user's, a symlink or anything else is left alone.
pub fn sweep_stale(base: &Path, prefix: &str) -> usize {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    let ours = std::process::id();
    let mut removed = 0;
    let Ok(entries) = std::fs::read_dir(base) else {
        return 0;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|n| n.strip_prefix('-'))
        else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid == ours || Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        let path = e.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() && meta.uid() == me && std::fs::remove_dir_all(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// [`sweep_stale`] once per process for each `(base, prefix)`.
fn sweep_once(base: &Path, prefix: &str) {
    static DONE: std::sync::Mutex<Vec<(PathBuf, String)>> = std::sync::Mutex::new(Vec::new());
    let key = (base.to_path_buf(), prefix.to_string());
    {
        let mut done = DONE.locked();
        if done.contains(&key) {
            return;
        }
        done.push(key);
    }
    // On a thread of its own: listing a busy /tmp is a fraction of a millisecond that the
    // gateway's start need not wait for (the directories of dead processes harm no one
    // meanwhile, and this process's own are never swept).
    let (base, prefix) = (base.to_path_buf(), prefix.to_string());
    let sweep = move || {
        let n = sweep_stale(&base, &prefix);
        if n > 0 {
            tracing::info!(base = %base.display(), prefix, removed = n, "removed directories left by processes that are gone");
        }
    };
    if std::thread::Builder::new()
        .name("sweep-stale".into())
        .spawn(sweep.clone())
        .is_err()
    {
        sweep();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn directories_of_dead_processes_are_swept_and_live_ones_kept() {
        let base = tempfile::tempdir().unwrap();
        // A pid that existed and is gone.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let stale = base.path().join(format!("clawft-egress-{dead}-00ff"));
        std::fs::create_dir(&stale).unwrap();
        std::fs::write(stale.join("egress.sock"), "").unwrap();
        let live = base
            .path()
            .join(format!("clawft-egress-{}-00aa", std::process::id()));
        std::fs::create_dir(&live).unwrap();
        let init = base.path().join("clawft-egress-1-00bb");
        std::fs::create_dir(&init).unwrap();
        let other = base.path().join(format!("clawft-exec-{dead}-00cc"));
        std::fs::create_dir(&other).unwrap();
        let link = base.path().join(format!("clawft-egress-{dead}-00dd"));
        std::os::unix::fs::symlink(base.path(), &link).unwrap();

        assert_eq!(sweep_stale(base.path(), "clawft-egress"), 1);
        assert!(!stale.exists(), "a dead process's directory stays");
        assert!(
            live.exists() && init.exists(),
            "a live process's directory went"
        );
        assert!(other.exists(), "another prefix was swept");
        assert!(
            link.symlink_metadata().is_ok(),
            "a symlink was followed or removed"
        );
        // `create` sweeps once per process and base: a new stale one after that stays.
        let made = create(base.path(), "clawft-egress").unwrap();
        assert!(made.exists());
    }
}
