//! `kill -9` of a process writing sled batches: every batch is all-or-nothing and every batch a
//! flush returned for is there (vendor/sled/PATCHES.md, 7: buffers are written without a sync
//! and the log is synced once per flush).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "WEFT_TEST_SLED_CRASH_CHILD";
const KEYS: usize = 20;

fn open(path: &str) -> sled::Db {
    sled::Config::new()
        .path(path)
        .flush_every_ms(Some(500))
        .open()
        .unwrap()
}

/// The batch number every key holds (all the same, or the store is empty).
fn recovered(db: &sled::Db) -> Option<u64> {
    let vals: Vec<Option<u64>> = (0..KEYS)
        .map(|k| {
            db.get(format!("k{k:02}")).unwrap().map(|v| {
                let s = std::str::from_utf8(&v).unwrap();
                s.split(':').next().unwrap().parse().unwrap()
            })
        })
        .collect();
    assert!(
        vals.iter().all(|v| *v == vals[0]),
        "a batch was recovered in part: {vals:?}"
    );
    vals[0]
}

/// The writer: batch n puts every key to "n:<padding>"; every third batch is flushed and its
/// number printed once the flush returned.
fn child(path: &str) -> ! {
    let db = open(path);
    let mut n = recovered(&db).map_or(1, |v| v + 1);
    let pad = "x".repeat(700);
    let mut out = std::io::stdout();
    loop {
        let mut b = sled::Batch::default();
        for k in 0..KEYS {
            b.insert(
                format!("k{k:02}").as_bytes(),
                format!("{n}:{pad}").as_bytes(),
            );
        }
        db.apply_batch(b).unwrap();
        if n.is_multiple_of(3) {
            db.flush().unwrap();
            writeln!(out, "flushed {n}").unwrap();
            out.flush().unwrap();
        }
        n += 1;
    }
}

#[test]
fn store_sled_kill_9_keeps_every_flushed_batch_and_no_partial_one() {
    if let Ok(path) = std::env::var(CHILD_ENV) {
        child(&path);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db").display().to_string();
    let mut last_seen = None;
    for delay_ms in [0u64, 30, 120, 250, 400, 700, 1000] {
        let mut c = Command::new(std::env::current_exe().unwrap())
            .args([
                "store_crash::store_sled_kill_9_keeps_every_flushed_batch_and_no_partial_one",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(c.stdout.take().unwrap()).lines();
        let mut flushed = 0u64;
        // Wait for its first flush, then let it run a while and kill it mid-write.
        for l in lines.by_ref() {
            let l = l.unwrap();
            if let Some(n) = l.strip_prefix("flushed ") {
                flushed = n.parse().unwrap();
                break;
            }
        }
        assert!(flushed > 0, "the writer never flushed");
        let until = Instant::now() + Duration::from_millis(delay_ms);
        while Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        c.kill().unwrap();
        c.wait().unwrap();
        for l in lines {
            let Ok(l) = l else { break };
            if let Some(n) = l.strip_prefix("flushed ") {
                flushed = n.parse().unwrap();
            }
        }
        let db = open(&path);
        let got = recovered(&db).expect("the store is empty after flushes");
        assert!(
            got >= flushed,
            "batch {flushed} was flushed but only {got} recovered (kill after {delay_ms} ms)"
        );
        eprintln!("kill after {delay_ms} ms: flushed {flushed}, recovered {got}");
        if let Some(prev) = last_seen {
            assert!(got >= prev, "went back from {prev} to {got}");
        }
        last_seen = Some(got);
        drop(db);
    }
}
