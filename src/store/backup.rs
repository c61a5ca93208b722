//! Operator tools over a store: `check` (every record decodes, checksums match, counts per
//! kind), `backup` (a JSON-lines copy with a checksum, taken from an open store, so also from a
//! running gateway) and `restore` (a backup into the store directory, the current files kept
//! aside).
//!
//! Backup file: a header line `{"clawft_store_backup":1,"schema":..,"store_id":..,"taken_ms":..}`,
//! one line per record `{"k":"<hex>","v":"<hex>"}`, and a trailer
//! `{"records":N,"crc32":"xxxxxxxx"}` whose CRC-32 covers every byte before it.

use std::collections::BTreeMap;
use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::kv::{Kv as _, Op, SledKv};
use super::{decode, integrity, show_key, unseal, InboxEntry, SessionMeta, Store, StoreError};
use crate::llm::Message;
use clawft_channel_core::OutboundMessage;

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
        let kind: &'static str;
        let res: Result<(), StoreError> = match k.get(..2) {
            Some(b"s\0") => {
                kind = "sessions";
                decode::<SessionMeta>(&k, &v).map(drop)
            }
            Some(b"t\0") => {
                kind = "messages";
                decode::<Message>(&k, &v).map(drop)
            }
            Some(b"i\0") => {
                kind = "inbox";
                decode::<InboxEntry>(&k, &v).map(drop)
            }
            Some(b"o\0") => {
                kind = "outbox";
                decode::<OutboundMessage>(&k, &v).map(drop)
            }
            Some(b"k\0") => {
                kind = "state";
                unseal(&k, &v).map(drop)
            }
            Some(b"q\0") => {
                kind = "queue";
                if v.starts_with(b"i\0") {
                    Ok(())
                } else {
                    Err(StoreError::Corrupt {
                        key: show_key(&k),
                        detail: "queue entry does not name an inbox record".into(),
                    })
                }
            }
            Some(b"u\0") => {
                kind = "usage";
                decode::<super::usage::UsageRow>(&k, &v).map(drop)
            }
            Some(b"w\0") => {
                kind = "window";
                decode::<super::window::Compaction>(&k, &v).map(drop)
            }
            Some(b"m\0") => {
                kind = "meta";
                if k == integrity::MANIFEST_KEY {
                    decode::<integrity::Manifest>(&k, &v).map(|m| {
                        r.schema = Some(m.schema);
                        r.store_id = Some(m.store_id);
                    })
                } else {
                    Ok(())
                }
            }
            _ => {
                kind = "unknown";
                Err(StoreError::Corrupt {
                    key: show_key(&k),
                    detail: "unknown key prefix".into(),
                })
            }
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

/// Write a backup of `store` to `to` (through a temporary file, renamed when complete).
/// Returns the number of records.
///
/// # Errors
/// The store cannot be read or the file written.
pub fn backup(store: &Store, to: &Path) -> Result<u64, StoreError> {
    let manifest = store.manifest();
    let tmp = to.with_extension("partial");
    let file = std::fs::File::create(&tmp).map_err(io(&tmp))?;
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
    let mut n = 0u64;
    // One prefix at a time keeps memory bounded by the largest kind, not the whole store.
    for prefix in [b"m\0", b"k\0", b"s\0", b"t\0", b"i\0", b"q\0", b"o\0"] {
        for (k, v) in store.kv.scan_prefix(prefix)? {
            if k == b"m\0probe" {
                continue;
            }
            put(
                &mut w,
                &json!({"k": clawft_channel_core::hex(&k), "v": clawft_channel_core::hex(&v)}),
            )?;
            n += 1;
        }
    }
    let sum = crc.clone().finalize();
    let trailer = json!({"records": n, "crc32": format!("{sum:08x}")});
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

/// Read and verify a backup: its records.
fn read_backup(from: &Path) -> Result<super::kv::Pairs, StoreError> {
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
            return Ok(out);
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

/// Restore the backup `from` into the store directory `dir` (no gateway may hold it). The
/// current store files, if any, are moved to `<dir>.before-restore-<timestamp>`, which is
/// returned.
///
/// # Errors
/// The backup is damaged, the store is locked, or I/O.
pub fn restore(from: &Path, dir: &Path, cache_bytes: u64) -> Result<Option<PathBuf>, StoreError> {
    let records = read_backup(from)?;
    std::fs::create_dir_all(dir).map_err(io(dir))?;
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
    drop(integrity::open(
        dir,
        cache_bytes,
        integrity::OnCorruption::Fail,
    )?);
    Ok(aside)
}
