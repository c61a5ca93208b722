//! The key-value seam under [`super::Store`]: sled on disk, a `BTreeMap` in memory for tests.
//! All store logic lives above it, so both backends behave the same.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use super::StoreError;

use crate::types::{MutexExt, RwLockExt};

/// Key-value pairs returned by a scan.
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// One write of an atomic batch.
#[derive(Debug, Clone)]
pub enum Op {
    /// Insert or replace.
    Put(Vec<u8>, Vec<u8>),
    /// Remove (absent is fine).
    Del(Vec<u8>),
}

/// An ordered key-value store with atomic batches.
pub trait Kv: Send + Sync + 'static {
    /// Read one key.
    ///
    /// # Errors
    /// Backend I/O failure.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// All pairs whose key starts with `prefix`, in key order.
    ///
    /// # Errors
    /// Backend I/O failure.
    fn scan_prefix(&self, prefix: &[u8]) -> Result<Pairs, StoreError>;
    /// Apply all ops atomically.
    ///
    /// # Errors
    /// Backend I/O failure; nothing was applied.
    fn apply(&self, ops: Vec<Op>) -> Result<(), StoreError>;
    /// Make everything applied so far durable.
    ///
    /// # Errors
    /// Backend I/O failure.
    fn flush(&self) -> Result<(), StoreError>;
    /// A monotonically increasing id, unique across restarts.
    ///
    /// # Errors
    /// Backend I/O failure.
    fn next_id(&self) -> Result<u64, StoreError>;
    /// Bytes used on disk (0 in memory).
    fn size_on_disk(&self) -> u64;
    /// Close and open the backend again: how a backend that stays failed after an I/O error
    /// (sled keeps returning the first error forever) comes back. Writes applied and not yet
    /// flushed are lost. Default: nothing to do.
    ///
    /// # Errors
    /// The backend cannot be opened again yet.
    fn reopen(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// sled-backed [`Kv`].
pub struct SledKv {
    /// `None` only while [`Kv::reopen`] runs (or after it failed).
    db: std::sync::RwLock<Option<sled::Db>>,
    path: std::path::PathBuf,
    cache_bytes: u64,
}

/// How long a reopen waits for a lock still held by this process's own closing handle.
const OWN_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

impl SledKv {
    /// Open (or create) the database at `path` with a bounded page cache.
    ///
    /// # Errors
    /// [`StoreError::Locked`] when another process holds it; I/O errors otherwise.
    pub fn open(path: &Path, cache_bytes: u64) -> Result<Self, StoreError> {
        std::fs::create_dir_all(path).map_err(|e| StoreError::Io {
            path: path.display().to_string(),
            source: e,
        })?;
        // sled releases its lock file only when its last internal handle goes, and its IO
        // threads keep handles for jobs still running after the `Db` was dropped. A path this
        // process opened before may therefore still be locked by this process for a moment;
        // only then is the lock waited for (bounded). A lock held by another process is
        // reported at once.
        let ours = Self::opened_here(path);
        let deadline = std::time::Instant::now() + OWN_LOCK_WAIT;
        loop {
            match Self::try_open(path, cache_bytes) {
                Err(StoreError::Locked(_)) if ours && std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Ok(db) => {
                    return Ok(Self {
                        db: std::sync::RwLock::new(Some(db)),
                        path: path.to_path_buf(),
                        cache_bytes,
                    })
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether this process opened `path` before (and remember that it does now).
    fn opened_here(path: &Path) -> bool {
        static OPENED: std::sync::Mutex<Vec<std::path::PathBuf>> =
            std::sync::Mutex::new(Vec::new());
        let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let mut opened = OPENED.locked();
        if opened.contains(&path) {
            return true;
        }
        opened.push(path);
        false
    }

    fn try_open(path: &Path, cache_bytes: u64) -> Result<sled::Db, StoreError> {
        sled::Config::new()
            .path(path)
            .cache_capacity(cache_bytes)
            .flush_every_ms(Some(500))
            .open()
            .map_err(|e| match e {
                // Another process holds the lock (sled keeps the lock call's kind, patch 8 of
                // vendor/sled).
                sled::Error::Io(io) if io.kind() == std::io::ErrorKind::WouldBlock => {
                    StoreError::Locked(path.display().to_string())
                }
                sled::Error::Io(io) => StoreError::Io {
                    path: path.display().to_string(),
                    source: io,
                },
                other @ (sled::Error::Corruption { .. }
                | sled::Error::ReportableBug(_)
                | sled::Error::Unsupported(_)) => StoreError::Damaged {
                    path: path.display().to_string(),
                    detail: other.to_string(),
                },
                other => StoreError::Backend(other.to_string()),
            })
    }

    /// The open database (a cheap handle clone).
    fn db(&self) -> Result<sled::Db, StoreError> {
        self.db
            .read_locked()
            .clone()
            .ok_or_else(|| StoreError::Backend("the store is being reopened after an error".into()))
    }
}

fn be(e: sled::Error) -> StoreError {
    match e {
        // Keep the I/O error's kind: it tells "no space left" from other failures.
        sled::Error::Io(io) => StoreError::Io {
            path: "sled".into(),
            source: io,
        },
        other => StoreError::Backend(other.to_string()),
    }
}

impl Kv for SledKv {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.db()?.get(key).map_err(be)?.map(|v| v.to_vec()))
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Result<Pairs, StoreError> {
        self.db()?
            .scan_prefix(prefix)
            .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(be))
            .collect()
    }

    fn apply(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for op in ops {
            match op {
                Op::Put(k, v) => batch.insert(k, v),
                Op::Del(k) => batch.remove(k),
            }
        }
        self.db()?.apply_batch(batch).map_err(be)
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db()?.flush().map(|_| ()).map_err(be)
    }

    fn next_id(&self) -> Result<u64, StoreError> {
        self.db()?.generate_id().map_err(be)
    }

    fn size_on_disk(&self) -> u64 {
        self.db()
            .ok()
            .and_then(|d| d.size_on_disk().ok())
            .unwrap_or(0)
    }

    fn reopen(&self) -> Result<(), StoreError> {
        let mut slot = self.db.write_locked();
        drop(slot.take());
        // `open` waits (bounded) for handles of the old `Db` that sled's threads still hold.
        let fresh = Self::open(&self.path, self.cache_bytes)?;
        let db = fresh.db()?;
        *slot = Some(db);
        Ok(())
    }
}

/// In-memory [`Kv`] for tests and `--no-store` runs.
#[derive(Default)]
pub struct MemKv {
    inner: Mutex<MemInner>,
}

#[derive(Default)]
struct MemInner {
    map: BTreeMap<Vec<u8>, Vec<u8>>,
    next_id: u64,
}

impl MemKv {
    fn lock(&self) -> std::sync::MutexGuard<'_, MemInner> {
        self.inner.locked()
    }
}

impl Kv for MemKv {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.lock().map.get(key).cloned())
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Result<Pairs, StoreError> {
        Ok(self
            .lock()
            .map
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn apply(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        let mut g = self.lock();
        for op in ops {
            match op {
                Op::Put(k, v) => {
                    g.map.insert(k, v);
                }
                Op::Del(k) => {
                    g.map.remove(&k);
                }
            }
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn next_id(&self) -> Result<u64, StoreError> {
        let mut g = self.lock();
        g.next_id += 1;
        Ok(g.next_id)
    }

    fn size_on_disk(&self) -> u64 {
        0
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_reopen_waits_for_this_process_own_closing_handle() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("store");
        let first = SledKv::open(&path, 1 << 20).unwrap();
        // What sled's IO threads do after the `Db` is dropped: an internal handle (and with it the
        // lock file) lives on for a moment.
        let lingering = first.db().unwrap();
        drop(first);
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            drop(lingering);
        });
        let again = SledKv::open(&path, 1 << 20);
        release.join().unwrap();
        assert!(again.is_ok(), "{:?}", again.err());
    }

    #[test]
    fn a_lock_held_by_another_owner_is_reported_at_once() {
        use rustix::fs::{flock, FlockOperation};
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("store");
        std::fs::create_dir_all(&path).unwrap();
        // Another owner (as another process would): its own open file description, locked.
        let other = std::fs::File::create(path.join("db")).unwrap();
        flock(&other, FlockOperation::NonBlockingLockExclusive).unwrap();
        let started = std::time::Instant::now();
        let r = SledKv::open(&path, 1 << 20);
        assert!(matches!(r, Err(StoreError::Locked(_))), "{:?}", r.err());
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }
}
