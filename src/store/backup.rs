//! Operator tools over a store: `check` (every record decodes, checksums match, counts per
//! kind), `backup` (a JSON-lines copy with a checksum, taken from an open store, so also from a
//! running gateway) and `restore` (a backup into the store directory, the current files kept
//! aside).
//!
//! Backup file: a header line `{"clawft_store_backup":1,"schema":..,"store_id":..,"taken_ms":..}`,
//! one line per record `{"k":"<hex>","v":"<hex>"}`, and a trailer
//! `{"records":N,"counts":{"<kind>":n,..},"crc32":"xxxxxxxx"}` whose CRC-32 covers every byte
//! before it. The record kinds come from one table ([`Kind::ALL`]) that `check`, `backup` and
//! `restore` all read, so a kind cannot be left out of one of them.
//!
//! Must not: decide what a record means (that is the store's); write outside the given paths.

use std::collections::BTreeMap;
use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::kv::{Kv as _, Op, SledKv};
use super::{decode, integrity, show_key, unseal, InboxEntry, SessionMeta, Store, StoreError};
use crate::llm::Message;
use clawft_channel_core::OutboundMessage;

/// One kind of record the store keeps, by its key prefix. Every key the store writes starts
/// with the prefix of exactly one kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `m`: the manifest (and the write probe, which backups skip).
    Meta,
    /// `k`: sealed state (namespaced key/values, secrets, the node-signing key).
    State,
    /// `s`: session metadata.
    Sessions,
    /// `t`: transcript messages.
    Messages,
    /// `i`: inbound events (the dedup inbox).
    Inbox,
    /// `q`: the journal queue (each names an inbox record).
    Queue,
    /// `o`: outbound messages not yet delivered.
    Outbox,
    /// `u`: usage rows (tokens and cost per turn; budgets count from them).
    Usage,
    /// `w`: compaction windows (where a compacted conversation starts).
    Window,
}

impl Kind {
    /// Every kind, in backup order.
    pub const ALL: [Kind; 9] = [
        Kind::Meta,
        Kind::State,
        Kind::Sessions,
        Kind::Messages,
        Kind::Inbox,
        Kind::Queue,
        Kind::Outbox,
        Kind::Usage,
        Kind::Window,
    ];

    /// The key prefix of this kind.
    #[must_use]
    pub fn prefix(self) -> &'static [u8] {
        match self {
            Kind::Meta => b"m\0",
            Kind::State => b"k\0",
            Kind::Sessions => b"s\0",
            Kind::Messages => b"t\0",
            Kind::Inbox => b"i\0",
            Kind::Queue => b"q\0",
            Kind::Outbox => b"o\0",
            Kind::Usage => b"u\0",
            Kind::Window => b"w\0",
        }
    }

    /// The name used in `store check` counts and backup manifests.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Kind::Meta => "meta",
            Kind::State => "state",
            Kind::Sessions => "sessions",
            Kind::Messages => "messages",
            Kind::Inbox => "inbox",
            Kind::Queue => "queue",
            Kind::Outbox => "outbox",
            Kind::Usage => "usage",
            Kind::Window => "window",
        }
    }

    /// The kind of the record at `key`, if its prefix is known.
    #[must_use]
    pub fn of(key: &[u8]) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| key.starts_with(k.prefix()))
    }

    /// Whether `key` goes into a backup (the write probe does not).
    fn backed_up(key: &[u8]) -> bool {
        key != PROBE_KEY
    }
}

/// The write probe's key: a throwaway record the store writes to test the disk.
const PROBE_KEY: &[u8] = b"m\0probe";

/// Verify `value` as a record of `kind` at `key`.
fn verify(kind: Kind, key: &[u8], value: &[u8], r: &mut CheckReport) -> Result<(), StoreError> {
    match kind {
        Kind::Sessions => decode::<SessionMeta>(key, value).map(drop),
        Kind::Messages => decode::<Message>(key, value).map(drop),
        Kind::Inbox => decode::<InboxEntry>(key, value).map(drop),
        Kind::Outbox => decode::<OutboundMessage>(key, value).map(drop),
        Kind::State => unseal(key, value).map(drop),
        Kind::Queue => {
            if value.starts_with(Kind::Inbox.prefix()) {
                Ok(())
            } else {
                Err(StoreError::Corrupt {
                    key: show_key(key),
                    detail: "queue entry does not name an inbox record".into(),
                })
            }
        }
        Kind::Usage => decode::<super::usage::UsageRow>(key, value).map(drop),
        Kind::Window => decode::<super::window::Compaction>(key, value).map(drop),
        Kind::Meta => {
            if key == integrity::MANIFEST_KEY {
                decode::<integrity::Manifest>(key, value).map(|m| {
                    r.schema = Some(m.schema);
                    r.store_id = Some(m.store_id);
                })
            } else {
                Ok(())
            }
        }
    }
}

/// What `weft store check` found.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CheckReport {
    /// No problem found.
    pub ok: bool,
    /// Schema version and store id, from the manifest.
    pub schema: Option<u32>,
    /// The store's id.
    pub store_id: Option<String>,
    /// Records per kind (`sessions`, `messages`, `inbox`, `queue`, `outbox`, `state`, `usage`, `window`, `meta`).
    pub counts: BTreeMap<String, u64>,
    /// Each damaged record: key and what is wrong (at most 100 listed).
    pub problems: Vec<String>,
    /// Damaged records in all.
    pub damaged: u64,
}

/// Verify every record of `store`.
///
/// # Errors
/// The backend cannot be read.
pub fn check(store: &Store) -> Result<CheckReport, StoreError> {
    let mut r = CheckReport::default();
    for (k, v) in store.kv.scan_prefix(b"")? {
        let (kind, res) = match Kind::of(&k) {
            Some(kind) => (kind.name(), verify(kind, &k, &v, &mut r)),
            None => (
                "unknown",
                Err(StoreError::Corrupt {
                    key: show_key(&k),
                    detail: "unknown key prefix".into(),
                }),
            ),
        };
        *r.counts.entry(kind.to_string()).or_insert(0) += 1;
        if let Err(e) = res {
            r.damaged += 1;
            if r.problems.len() < 100 {
                r.problems.push(e.to_string());
            }
        }
    }
    r.ok = r.damaged == 0;
    Ok(r)
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> StoreError + '_ {
    move |e| StoreError::Io {
        path: path.display().to_string(),
        source: e,
    }
}

/// What a backup holds (and what a restore put back): records in all and per kind.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Counts {
    /// Records in all.
    pub records: u64,
    /// Records per kind name (every kind of [`Kind::ALL`], zero included).
    pub counts: BTreeMap<String, u64>,
}

impl Counts {
    fn new() -> Self {
        Counts {
            records: 0,
            counts: Kind::ALL
                .iter()
                .map(|k| (k.name().to_string(), 0))
                .collect(),
        }
    }

    fn add(&mut self, kind: Kind) {
        self.records += 1;
        *self.counts.entry(kind.name().to_string()).or_insert(0) += 1;
    }

    /// "12 sessions, 340 messages, …": the non-zero kinds, for people.
    #[must_use]
    pub fn sentence(&self) -> String {
        let parts: Vec<String> = self
            .counts
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(k, n)| format!("{n} {k}"))
            .collect();
        if parts.is_empty() {
            "nothing".into()
        } else {
            parts.join(", ")
        }
    }
}

/// Write a backup of `store` to `to` (through a temporary file made private (0600) and renamed
/// when complete). Returns what it holds.
///
/// # Errors
/// The store cannot be read or the file written.
pub fn backup(store: &Store, to: &Path) -> Result<Counts, StoreError> {
    let manifest = store.manifest();
    let tmp = to.with_extension("partial");
    if let Some(parent) = to.parent().filter(|p| !p.as_os_str().is_empty()) {
        crate::types::private::create_dir_all(parent).map_err(io(parent))?;
    }
    let file = crate::types::private::create_file(&tmp).map_err(io(&tmp))?;
    let mut w = std::io::BufWriter::new(file);
    let mut crc = crc32fast::Hasher::new();
    let mut put = |w: &mut std::io::BufWriter<std::fs::File>, line: &Value| {
        let mut b = line.to_string().into_bytes();
        b.push(b'\n');
        crc.update(&b);
        w.write_all(&b).map_err(io(&tmp))
    };
    put(
        &mut w,
        &json!({
            "clawft_store_backup": 1,
            "schema": integrity::SCHEMA_VERSION,
            "store_id": manifest.as_ref().map(|m| m.store_id.clone()),
            "taken_ms": clawft_channel_core::now_ms(),
        }),
    )?;
    let mut n = Counts::new();
    // One kind at a time keeps memory bounded by the largest kind, not the whole store.
    for kind in Kind::ALL {
        for (k, v) in store.kv.scan_prefix(kind.prefix())? {
            if !Kind::backed_up(&k) {
                continue;
            }
            put(
                &mut w,
                &json!({"k": clawft_channel_core::hex(&k), "v": clawft_channel_core::hex(&v)}),
            )?;
            n.add(kind);
        }
    }
    let sum = crc.clone().finalize();
    let trailer = json!({"records": n.records, "counts": n.counts, "crc32": format!("{sum:08x}")});
    w.write_all(format!("{trailer}\n").as_bytes())
        .map_err(io(&tmp))?;
    let f = w.into_inner().map_err(|e| io(&tmp)(e.into_error()))?;
    f.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, to).map_err(io(to))?;
    Ok(n)
}

fn bad(path: &Path, what: &str) -> StoreError {
    StoreError::Corrupt {
        key: path.display().to_string(),
        detail: format!("not a usable weft store backup: {what}"),
    }
}

/// Read and verify a backup: its records, and the per-kind counts its trailer names (`None` for
/// a backup written before trailers named them).
fn read_backup(from: &Path) -> Result<(super::kv::Pairs, Option<Counts>), StoreError> {
    let f = std::fs::File::open(from).map_err(io(from))?;
    let mut lines = std::io::BufReader::new(f).lines();
    let mut crc = crc32fast::Hasher::new();
    let header = lines
        .next()
        .ok_or_else(|| bad(from, "empty file"))?
        .map_err(io(from))?;
    crc.update(header.as_bytes());
    crc.update(b"\n");
    let h: Value = serde_json::from_str(&header).map_err(|_| bad(from, "no header line"))?;
    if h["clawft_store_backup"] != json!(1) {
        return Err(bad(from, "no header line"));
    }
    if let Some(schema) = h["schema"].as_u64() {
        if schema > u64::from(integrity::SCHEMA_VERSION) {
            return Err(StoreError::Newer {
                path: from.display().to_string(),
                schema: u32::try_from(schema).unwrap_or(u32::MAX),
            });
        }
    }
    let mut out = Vec::new();
    for line in lines {
        let line = line.map_err(io(from))?;
        let v: Value = serde_json::from_str(&line).map_err(|_| bad(from, "a line is not JSON"))?;
        if let Some(want) = v["crc32"].as_str() {
            let got = format!("{:08x}", crc.clone().finalize());
            if got != want {
                return Err(bad(from, "checksum mismatch (the file was changed or cut)"));
            }
            if v["records"].as_u64() != Some(out.len() as u64) {
                return Err(bad(from, "record count mismatch"));
            }
            let manifest = match v.get("counts") {
                None => None,
                Some(c) => {
                    let counts: BTreeMap<String, u64> = serde_json::from_value(c.clone())
                        .map_err(|_| bad(from, "the trailer's counts are malformed"))?;
                    Some(Counts {
                        records: out.len() as u64,
                        counts,
                    })
                }
            };
            return Ok((out, manifest));
        }
        crc.update(line.as_bytes());
        crc.update(b"\n");
        let (Some(k), Some(val)) = (
            v["k"].as_str().and_then(clawft_channel_core::unhex),
            v["v"].as_str().and_then(clawft_channel_core::unhex),
        ) else {
            return Err(bad(from, "a record line is malformed"));
        };
        out.push((k, val));
    }
    Err(bad(from, "no trailer (the file was cut)"))
}

/// What `restore` did.
#[derive(Clone, Debug)]
pub struct Restored {
    /// Where the store files found before were moved, if there were any.
    pub previous_store: Option<PathBuf>,
    /// What was restored (verified against the backup's manifest and counted in the store).
    pub counts: Counts,
}

/// Count what the backup's `records` hold per kind; refuse a record of no known kind.
fn count_records(from: &Path, records: &super::kv::Pairs) -> Result<Counts, StoreError> {
    let mut c = Counts::new();
    for (k, _) in records {
        let kind = Kind::of(k).ok_or_else(|| bad(from, "a record of an unknown kind"))?;
        c.add(kind);
    }
    Ok(c)
}

/// Restore the backup `from` into the store directory `dir` (no gateway may hold it). The
/// current store files, if any, are moved to `<dir>.before-restore-<timestamp>`. The records
/// are verified against the backup's manifest (per kind) before anything is moved, and counted
/// again in the restored store.
///
/// # Errors
/// The backup is damaged or its counts disagree with its records, the store is locked, the
/// restored store does not hold what the backup does, or I/O.
pub fn restore(from: &Path, dir: &Path, cache_bytes: u64) -> Result<Restored, StoreError> {
    let (records, manifest) = read_backup(from)?;
    let found = count_records(from, &records)?;
    if let Some(m) = &manifest {
        for kind in Kind::ALL {
            let want = m.counts.get(kind.name()).copied().unwrap_or(0);
            let got = found.counts.get(kind.name()).copied().unwrap_or(0);
            if want != got {
                return Err(bad(
                    from,
                    &format!(
                        "its manifest names {want} {} records but it holds {got}",
                        kind.name()
                    ),
                ));
            }
        }
    }
    crate::types::private::create_dir_all(dir).map_err(io(dir))?;
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .map_err(io(dir))?;
    // Refuse while a gateway holds the store: opening it takes sled's lock.
    let probe = SledKv::open(dir, cache_bytes);
    if let Err(StoreError::Locked(p)) = probe {
        return Err(StoreError::Locked(p));
    }
    drop(probe);
    let had_files = dir.join("db").exists() || dir.join("conf").exists();
    let aside = if had_files {
        let aside = integrity::aside_path(dir, "before-restore");
        integrity::move_files(dir, &aside)?;
        Some(aside)
    } else {
        let _ = std::fs::remove_file(dir.join(integrity::SIDECAR));
        None
    };
    {
        let kv = SledKv::open(dir, cache_bytes)?;
        let mut max_seq = 0u64;
        for chunk in records.chunks(1000) {
            let mut ops = Vec::with_capacity(chunk.len());
            for (k, v) in chunk {
                if let Some(seq) = k
                    .strip_prefix(b"q\0")
                    .and_then(|s| <[u8; 8]>::try_from(s).ok())
                {
                    max_seq = max_seq.max(u64::from_be_bytes(seq));
                }
                ops.push(Op::Put(k.clone(), v.clone()));
            }
            kv.apply(ops)?;
        }
        // New journal ids must not reuse the restored ones.
        while kv.next_id()? <= max_seq {}
        kv.flush()?;
    }
    // Opening writes the sidecar (and gives a backup without a manifest one).
    let store = integrity::open(dir, cache_bytes, integrity::OnCorruption::Fail)?;
    // Count again in the restored store: every kind but `meta` (opening may add the manifest
    // or the probe) must hold exactly what the backup does.
    let after = check(&store)?;
    for kind in Kind::ALL {
        if kind == Kind::Meta {
            continue;
        }
        let want = found.counts.get(kind.name()).copied().unwrap_or(0);
        let got = after.counts.get(kind.name()).copied().unwrap_or(0);
        if want != got {
            return Err(StoreError::Corrupt {
                key: dir.display().to_string(),
                detail: format!(
                    "the restored store holds {got} {} records, the backup {want}",
                    kind.name()
                ),
            });
        }
    }
    Ok(Restored {
        previous_store: aside,
        counts: found,
    })
}
