//! Opening a store safely: leftovers of a crash removed, damage detected instead of a silent
//! partial load, the schema version checked (older migrated, newer refused), and a damaged
//! store moved aside (`store.on_corruption = "quarantine"`) or refused (`"fail"`).
//!
//! What detects damage:
//! - sled's own errors at open (a garbage `conf`, a log it cannot read);
//! - our manifest record `m/manifest` (schema version, store id, creation time), checksummed
//!   like every value we write;
//! - the sidecar file `clawft-store.json` beside sled's files, which repeats the schema and
//!   store id and records a durable high-water mark: how many sessions the store held at the
//!   last record (written every few seconds after a flush, at a clean close, and lowered
//!   *before* a session is deleted). A store that opens without its manifest, with another
//!   store's id, or with fewer sessions than recorded has lost data: sled opened what it could
//!   read (flipped bytes: 0 of 5 sessions; a file cut in half: 3 of 5).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::kv::{Kv, Op, SledKv};
use super::{Store, StoreError};

use crate::types::MutexExt;

/// The schema version this weft writes. 0: stores written before versions existed (no
/// manifest, values bare JSON); 1: manifest, sidecar, checksummed values.
pub const SCHEMA_VERSION: u32 = 1;

/// The sidecar file's name, inside the store directory.
pub const SIDECAR: &str = "clawft-store.json";

/// Key of the manifest record.
pub(crate) const MANIFEST_KEY: &[u8] = b"m\0manifest";

/// What to do when the store is found damaged at open (`store.on_corruption`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnCorruption {
    /// Move the damaged files aside to `<store>.corrupt-<timestamp>`, log and alert, start
    /// with a fresh store.
    #[default]
    Quarantine,
    /// Refuse to start with one clear error (exit code 78, which the systemd units do not
    /// restart on).
    Fail,
}

impl OnCorruption {
    /// Parse the config value.
    ///
    /// # Errors
    /// Anything but `quarantine` or `fail`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "quarantine" => Ok(Self::Quarantine),
            "fail" => Ok(Self::Fail),
            other => Err(format!(
                "store.on_corruption: `{other}` is not a policy; use \"quarantine\" (move the damaged store aside and start fresh) or \"fail\" (refuse to start)"
            )),
        }
    }
}

/// The manifest record and the sidecar's content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Schema version.
    pub schema: u32,
    /// Random id of this store, made at creation.
    pub store_id: String,
    /// Creation time, milliseconds since the epoch.
    pub created_ms: u64,
}

/// The sidecar file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SidecarFile {
    /// Same as the manifest.
    #[serde(flatten)]
    pub manifest: Manifest,
    /// Sessions the store held, durably, when this was written.
    pub sessions: u64,
    /// When this was written.
    pub updated_ms: u64,
}

/// The sidecar of an open store: where it is and the last content written.
pub(crate) struct Sidecar {
    path: PathBuf,
    last: Mutex<SidecarFile>,
}

impl Sidecar {
    fn write_file(path: &Path, content: &SidecarFile) -> std::io::Result<()> {
        use std::io::Write as _;
        let tmp = path.with_extension("json.tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(content).map_err(std::io::Error::other)?)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    }

    /// Write `sessions` as the mark (durably: temp file, fsync, rename), then remember it.
    fn write_mark(&self, last: &mut SidecarFile, sessions: u64) -> Result<(), StoreError> {
        let next = SidecarFile {
            sessions,
            updated_ms: clawft_channel_core::now_ms(),
            ..last.clone()
        };
        Self::write_file(&self.path, &next).map_err(|e| StoreError::Io {
            path: self.path.display().to_string(),
            source: e,
        })?;
        *last = next;
        Ok(())
    }

    /// Record the durable high-water mark: count, flush, then write (so the file never claims
    /// more than is durable).
    ///
    /// Returns false when a deletion holds the mark (it waits for the flusher thread, which
    /// runs this: waiting here would deadlock); the next tick records instead.
    pub(crate) fn record(&self, kv: &dyn Kv) -> Result<bool, StoreError> {
        let mut last = match self.last.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Ok(false),
        };
        let sessions = kv.scan_prefix(b"s\0")?.len() as u64;
        kv.flush()?;
        if sessions == last.sessions {
            return Ok(true);
        }
        self.write_mark(&mut last, sessions)?;
        Ok(true)
    }

    /// Run `delete` (which removes `gone` sessions and flushes) with the mark lowered first, so
    /// a crash in between never leaves the file claiming sessions that were deleted on purpose.
    pub(crate) fn lowered<T>(
        &self,
        gone: u64,
        delete: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut last = self.last.locked();
        if gone > 0 && last.sessions > 0 {
            let sessions = last.sessions.saturating_sub(gone);
            self.write_mark(&mut last, sessions)?;
        }
        delete()
    }

    /// The manifest it holds.
    pub(crate) fn manifest(&self) -> Manifest {
        self.last.locked().manifest.clone()
    }
}

/// Files of sled (and ours) that make up the store, as opposed to `control.json` or anything
/// else an operator keeps in the directory.
fn store_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            matches!(name, "db" | "conf" | "blobs" | SIDECAR)
                || name.starts_with("snap.")
                || name.starts_with("clawft-store.json")
        })
        .collect()
}

/// Remove what a crash during a snapshot leaves (`snap.<n>.generating`): sled would refuse to
/// start over it. Returns what was removed.
fn remove_leftovers(dir: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return removed;
    };
    for e in rd.filter_map(Result::ok) {
        let p = e.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("snap.")
            && name.ends_with(".generating")
            && std::fs::remove_file(&p).is_ok()
        {
            removed.push(p);
        }
    }
    removed
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |e| StoreError::Io {
        path: path.display().to_string(),
        source: e,
    }
}

/// Move the store's files to a new `<store>.corrupt-<timestamp>` directory beside it.
/// Returns that directory.
///
/// # Errors
/// The directory cannot be made or a file cannot be moved.
pub fn quarantine(dir: &Path) -> Result<PathBuf, StoreError> {
    let aside = aside_path(dir, "corrupt");
    move_files(dir, &aside)?;
    Ok(aside)
}

/// A fresh name `<dir>.<what>-<UTC timestamp>` beside `dir`.
pub(crate) fn aside_path(dir: &Path, what: &str) -> PathBuf {
    let stamp = stamp();
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("store");
    let mut p = dir.with_file_name(format!("{name}.{what}-{stamp}"));
    let mut n = 1;
    while p.exists() {
        p = dir.with_file_name(format!("{name}.{what}-{stamp}-{n}"));
        n += 1;
    }
    p
}

/// Move the store's files (not `control.json` or others) from `dir` into the new `to`.
pub(crate) fn move_files(dir: &Path, to: &Path) -> Result<(), StoreError> {
    std::fs::create_dir_all(to).map_err(io_err(to))?;
    for f in store_files(dir) {
        let Some(name) = f.file_name() else { continue };
        std::fs::rename(&f, to.join(name)).map_err(io_err(&f))?;
    }
    Ok(())
}

/// `YYYYMMDDTHHMMSSZ` now, UTC.
fn stamp() -> String {
    let secs = clawft_channel_core::now_ms() / 1000;
    let (days, rem) = (secs / 86400, secs % 86400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn read_sidecar(dir: &Path) -> Result<Option<SidecarFile>, StoreError> {
    let path = dir.join(SIDECAR);
    match std::fs::read(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(&path)(e)),
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| StoreError::Damaged {
                path: dir.display().to_string(),
                detail: format!("{SIDECAR} is unreadable ({e})"),
            }),
    }
}

fn damaged(dir: &Path, detail: String) -> StoreError {
    StoreError::Damaged {
        path: dir.display().to_string(),
        detail,
    }
}

/// Open the store at `dir`, checked; on damage apply `policy`.
///
/// # Errors
/// Locked, I/O, a newer schema, or (policy `fail`) [`StoreError::Damaged`].
pub fn open(dir: &Path, cache_bytes: u64, policy: OnCorruption) -> Result<Store, StoreError> {
    match open_checked(dir, cache_bytes) {
        Err(StoreError::Damaged { path, detail }) if policy == OnCorruption::Quarantine => {
            let aside = quarantine(dir)?;
            let text = format!(
                "the store was damaged ({detail}); its files were moved to {} and a fresh store was started; `weft store check` inspects the damaged copy, `weft store restore` brings back a backup",
                aside.display()
            );
            tracing::error!(store = %path, moved_to = %aside.display(), "{text}");
            let store = open_checked(dir, cache_bytes)?;
            store.core.health.alert(text);
            Ok(store)
        }
        other => other,
    }
}

fn open_checked(dir: &Path, cache_bytes: u64) -> Result<Store, StoreError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    for p in remove_leftovers(dir) {
        tracing::warn!(file = %p.display(), "removed an unfinished sled snapshot left by a crash");
    }
    let existed = dir.join("db").exists() || dir.join("conf").exists();
    let sidecar = read_sidecar(dir)?;
    if let Some(s) = &sidecar {
        if s.manifest.schema > SCHEMA_VERSION {
            return Err(StoreError::Newer {
                path: dir.display().to_string(),
                schema: s.manifest.schema,
            });
        }
    }
    let kv: Arc<dyn Kv> = Arc::new(SledKv::open(dir, cache_bytes).map_err(|e| match e {
        StoreError::Backend(d) if existed => damaged(dir, d),
        StoreError::Io { source, .. }
            if existed
                && matches!(
                    source.kind(),
                    std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof
                ) =>
        {
            damaged(dir, format!("sled cannot read it: {source}"))
        }
        other => other,
    })?);
    let manifest = match kv.get(MANIFEST_KEY)? {
        Some(v) => Some(
            super::decode::<Manifest>(MANIFEST_KEY, &v)
                .map_err(|e| damaged(dir, format!("manifest record: {e}")))?,
        ),
        None => None,
    };
    let sessions = count_sessions(dir, kv.as_ref())?;
    let manifest = match (manifest, &sidecar) {
        (Some(m), _) if m.schema > SCHEMA_VERSION => {
            return Err(StoreError::Newer {
                path: dir.display().to_string(),
                schema: m.schema,
            })
        }
        (Some(m), Some(s)) => {
            if m.store_id != s.manifest.store_id {
                return Err(damaged(
                    dir,
                    format!(
                        "its records belong to store {} but {SIDECAR} names store {}",
                        m.store_id, s.manifest.store_id
                    ),
                ));
            }
            m
        }
        (Some(m), None) => m,
        (None, Some(s)) => {
            return Err(damaged(
                dir,
                format!(
                    "its manifest record is gone ({SIDECAR} names store {} with {} sessions; {sessions} could be read)",
                    s.manifest.store_id, s.sessions
                ),
            ))
        }
        (None, None) => {
            let m = Manifest {
                schema: SCHEMA_VERSION,
                store_id: uuid::Uuid::new_v4().to_string(),
                created_ms: clawft_channel_core::now_ms(),
            };
            if existed {
                // Schema 0 (written before versions): its values are bare JSON, which still
                // decode; giving it a manifest and a sidecar is the whole migration.
                tracing::info!(store = %dir.display(), "store migrated from schema 0 to {SCHEMA_VERSION}");
            }
            kv.apply(vec![Op::Put(MANIFEST_KEY.to_vec(), super::encode(&m)?)])?;
            m
        }
    };
    if let Some(s) = &sidecar {
        if sessions < s.sessions {
            return Err(damaged(
                dir,
                format!(
                    "{sessions} sessions could be read where {} were recorded on {}",
                    s.sessions, s.updated_ms
                ),
            ));
        }
    }
    let manifest = migrate(kv.as_ref(), manifest)?;
    kv.flush()?;
    let path = dir.join(SIDECAR);
    // The file already says this (a restart with no session added): it stays as it is, with
    // the time the count was recorded, and the start saves a write and an fsync.
    let content = match sidecar {
        Some(s) if s.manifest == manifest && s.sessions == sessions => s,
        _ => {
            let content = SidecarFile {
                manifest,
                sessions,
                updated_ms: clawft_channel_core::now_ms(),
            };
            Sidecar::write_file(&path, &content).map_err(io_err(&path))?;
            content
        }
    };
    let sidecar = Sidecar {
        path,
        last: Mutex::new(content),
    };
    Ok(Store::assemble(kv, Some(dir.to_path_buf()), Some(sidecar)))
}

/// Bring a manifest of an older schema up to [`SCHEMA_VERSION`].
fn migrate(kv: &dyn Kv, mut m: Manifest) -> Result<Manifest, StoreError> {
    if m.schema < SCHEMA_VERSION {
        // 0 → 1 needs no rewrite (see above). Later versions add their steps here.
        m.schema = SCHEMA_VERSION;
        kv.apply(vec![Op::Put(MANIFEST_KEY.to_vec(), super::encode(&m)?)])?;
    }
    Ok(m)
}

/// Sessions whose summaries decode (a summary that does not is damage).
fn count_sessions(dir: &Path, kv: &dyn Kv) -> Result<u64, StoreError> {
    let rows = kv.scan_prefix(b"s\0")?;
    for (k, v) in &rows {
        super::decode::<super::SessionMeta>(k, v)
            .map_err(|e| damaged(dir, format!("session summary: {e}")))?;
    }
    Ok(rows.len() as u64)
}
