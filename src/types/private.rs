//! Private files: the one place that decides the modes of what weft writes under its data
//! directory (`~/.clawft`: the store, the memory index, logs, media, the workspace) and of
//! backups: directories 0700, files 0600, whatever the umask the process was started with.
//!
//! [`restrict_umask`] makes every file the process creates private (sled's, the index's, the
//! logs'); [`create_file`] and [`create_dir_all`] set the mode explicitly where a path is chosen
//! by the operator (a backup); [`tighten`] closes what an older start left open; [`too_open`]
//! lists it without changing anything (for `weft doctor`).
//!
//! Must not: follow symlinks out of the tree it walks; change the owner's own bits of a file
//! beyond removing what others may do; touch anything outside the given root.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of a private directory.
pub const DIR_MODE: u32 = 0o700;
/// Mode of a private file.
pub const FILE_MODE: u32 = 0o600;

/// Set the process's umask to 0077, so that everything it creates from now on (and what its
/// child processes create) is private to this user. Returns the umask it had.
pub fn restrict_umask() -> u32 {
    let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    old.as_raw_mode()
}

/// Create (or truncate) `path` for writing, with mode 0600 whatever the umask (an existing
/// file is made 0600 too).
///
/// # Errors
/// The file cannot be created or its mode set.
pub fn create_file(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))?;
    Ok(f)
}

/// Create `path` and its missing parents with mode 0700. Directories that exist are left as
/// they are (a backup may go to `/tmp` or a shared mount).
///
/// # Errors
/// A directory cannot be created.
pub fn create_dir_all(path: &Path) -> io::Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(path)
}

/// Whether a file of `mode` lets other users (group or others) in.
fn open_to_others(mode: u32) -> bool {
    mode & 0o077 != 0
}

/// Walk `root` (not following symlinks) and call `f` on each directory and regular file that
/// group or others may read, write or enter.
fn walk(root: &Path, f: &mut dyn FnMut(&Path, &std::fs::Metadata)) {
    let Ok(meta) = std::fs::symlink_metadata(root) else {
        return;
    };
    if (meta.is_dir() || meta.is_file()) && open_to_others(meta.permissions().mode()) {
        f(root, &meta);
    }
    if meta.is_dir() {
        let Ok(entries) = std::fs::read_dir(root) else {
            return;
        };
        for e in entries.flatten() {
            walk(&e.path(), f);
        }
    }
}

/// What under `root` group or others may read, write or enter (at most `limit` paths).
#[must_use]
pub fn too_open(root: &Path, limit: usize) -> Vec<PathBuf> {
    let mut out = Vec::new();
    walk(root, &mut |p, _| {
        if out.len() < limit {
            out.push(p.to_path_buf());
        }
    });
    out
}

/// Remove group and other permissions from every directory and file under `root` (symlinks
/// are not followed); returns the paths changed. A path that cannot be changed is skipped.
pub fn tighten(root: &Path) -> Vec<PathBuf> {
    let mut changed = Vec::new();
    walk(root, &mut |p, meta| {
        let mode = meta.permissions().mode() & 0o7700;
        if std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).is_ok() {
            changed.push(p.to_path_buf());
        }
    });
    changed
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn open_files_are_tightened_and_created_ones_are_private_whatever_the_umask() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("data");
        std::fs::create_dir_all(root.join("store")).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(root.join("store/db"), b"x").unwrap();
        std::fs::set_permissions(
            root.join("store/db"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        std::fs::write(root.join("run.sh"), b"x").unwrap();
        std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        let outside = d.path().join("outside");
        std::fs::write(&outside, b"x").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();

        assert_eq!(too_open(&root, 10).len(), 4, "{:?}", too_open(&root, 10));
        let changed = tighten(&root);
        assert_eq!(changed.len(), 4);
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(&root.join("store/db")), 0o600);
        assert_eq!(
            mode(&root.join("run.sh")),
            0o700,
            "the owner keeps its own bits"
        );
        assert_eq!(mode(&outside), 0o644, "a symlink was followed");
        assert!(too_open(&root, 10).is_empty());
        assert!(tighten(&root).is_empty(), "a second start changes nothing");

        let file = d.path().join("b/c/backup.jsonl");
        create_dir_all(file.parent().unwrap()).unwrap();
        create_file(&file).unwrap();
        assert_eq!(mode(&file), 0o600);
        assert_eq!(mode(file.parent().unwrap()), 0o700);
        assert_eq!(mode(&d.path().join("b")), 0o700);
        let shared = d.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        create_dir_all(&shared).unwrap();
        assert_eq!(mode(&shared), 0o777, "an existing directory was changed");
    }
}
