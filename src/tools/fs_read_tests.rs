//! `read_file` on large files: only what the requested lines need is read, and the memory one
//! call uses stays bounded by the result budget, not by the file (issue 14, finding 9).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::tools::workspace::testutil::Fixture;
use crate::tools::ToolRegistry;

/// Set in the child process that measures its own peak RSS (see
/// [`read_file_of_a_1gib_sparse_file_is_fast_bounded_and_uses_little_memory`]).
const PROBE_ENV: &str = "CLAWFT_READ_FILE_RSS_PROBE";
/// Most the peak RSS may grow while one `read_file` call of the 1 GiB file runs (KiB).
const MAX_RSS_GROWTH_KIB: u64 = 4096;

/// A 1 GiB sparse file: 2,000 text lines (about 200 KiB), then holes (NUL bytes) to 1 GiB.
fn sparse_file(fx: &Fixture) -> std::path::PathBuf {
    let p = fx.ws.join("huge.log");
    let mut f = std::fs::File::create(&p).unwrap();
    for i in 1..=2000 {
        writeln!(f, "line {i:04}: {}", "x".repeat(90)).unwrap();
    }
    f.set_len(1 << 30).unwrap();
    p
}

fn registry() -> ToolRegistry {
    let mut r = ToolRegistry::new();
    r.register(Arc::new(ReadFile));
    r
}

/// `VmHWM` (peak RSS) of this process, in KiB.
fn peak_rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The probe, run alone in a child process so no other test's allocations count: reset the
/// peak RSS, read the file through the registry (scrub and truncation included), report the
/// growth of the peak.
async fn probe() {
    let fx = Fixture::new();
    sparse_file(&fx);
    let reg = registry();
    // Warm up everything but the big read (schema cache, runtime threads, allocator arenas).
    fx.put("small.txt", "warm up\n");
    reg.dispatch("read_file", "w", r#"{"path":"small.txt"}"#, &fx.ctx)
        .await;
    // "5" resets VmHWM to the current RSS (Linux >= 4.0).
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let before = peak_rss_kib();
    let out = reg
        .dispatch("read_file", "r", r#"{"path":"huge.log"}"#, &fx.ctx)
        .await;
    let after = peak_rss_kib();
    assert!(out.error.is_none(), "{:?}", out.error);
    println!("RSS_GROWTH_KIB={}", after.saturating_sub(before));
}

#[tokio::test]
async fn read_file_of_a_1gib_sparse_file_is_fast_bounded_and_uses_little_memory() {
    if std::env::var_os(PROBE_ENV).is_some() {
        probe().await;
        return;
    }
    // Correct and bounded, here.
    let fx = Fixture::new();
    sparse_file(&fx);
    let started = std::time::Instant::now();
    let v = ReadFile
        .execute(json!({"path": "huge.log"}), &fx.ctx)
        .await
        .unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(v["truncated"], json!(true));
    let content = v["content"].as_str().unwrap();
    assert!(content.starts_with("line 0001: xxx"), "{}", &content[..50]);
    assert!(
        content.len() <= crate::tools::MAX_TOOL_RESULT_BYTES,
        "{} bytes",
        content.len()
    );
    // Paging still reaches later lines.
    let v = ReadFile
        .execute(
            json!({"path": "huge.log", "offset": 1500, "limit": 2}),
            &fx.ctx,
        )
        .await
        .unwrap();
    assert_eq!(
        v["content"],
        json!(format!(
            "line 1500: {x}\nline 1501: {x}\n",
            x = "x".repeat(90)
        ))
    );
    assert_eq!(v["truncated"], json!(true));

    // Memory, measured in a child process running only the probe.
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tools::fs::read_tests::read_file_of_a_1gib_sparse_file_is_fast_bounded_and_uses_little_memory",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(PROBE_ENV, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // libtest prints the test name on the same line, before the probe's output.
    let growth: u64 = stdout
        .split("RSS_GROWTH_KIB=")
        .nth(1)
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no measurement in: {stdout}"));
    println!("read_file of a 1 GiB sparse file: peak RSS grew by {growth} KiB");
    assert!(
        growth <= MAX_RSS_GROWTH_KIB,
        "peak RSS grew by {growth} KiB (at most {MAX_RSS_GROWTH_KIB})"
    );
}

fn lines(text: &[u8], start: u64, take: u64, budget: usize) -> Lines {
    read_lines(&mut std::io::Cursor::new(text), start, take, budget)
        .unwrap()
        .unwrap()
}

#[test]
fn read_lines_counts_selects_and_cuts_like_the_whole_file_read_did() {
    let l = lines(b"", 0, u64::MAX, 100);
    assert_eq!(
        (l.content.as_str(), l.total_lines, l.budget_hit),
        ("", 0, false)
    );
    let l = lines(b"a\nb", 0, u64::MAX, 100);
    assert_eq!((l.content.as_str(), l.total_lines), ("a\nb", 2));
    let l = lines(b"a\nb\n", 1, 1, 100);
    assert_eq!((l.content.as_str(), l.total_lines), ("b\n", 2));
    let l = lines(b"a\nb\nc\n", 5, 1, 100);
    assert_eq!((l.content.as_str(), l.total_lines), ("", 3));
    // The budget stops at a line boundary and says where to go on.
    let l = lines(b"aaaa\nbbbb\ncccc\n", 0, u64::MAX, 12);
    assert_eq!(l.content, "aaaa\nbbbb\n");
    assert!(l.budget_hit);
    assert_eq!((l.next_line, l.total_lines), (3, 3));
    // One line longer than the budget is cut, never inside a character.
    let l = lines("ééééé\nnext\n".as_bytes(), 0, u64::MAX, 5);
    assert_eq!(l.content, "éé");
    assert_eq!(l.next_line, 2);
    // Lines spanning read chunks are counted once.
    let long = format!("{}\n{}\n", "y".repeat(200_000), "z".repeat(10));
    let l = lines(long.as_bytes(), 1, 1, 100);
    assert_eq!((l.content.as_str(), l.total_lines), ("zzzzzzzzzz\n", 2));
    // Binary: a NUL in the first 8 KiB; a NUL later is text.
    assert!(read_lines(&mut std::io::Cursor::new(b"ab\0c"), 0, 1, 10)
        .unwrap()
        .is_none());
    let mut late = vec![b'a'; BINARY_SNIFF_BYTES];
    late.push(0);
    assert!(read_lines(&mut std::io::Cursor::new(late), 0, 1, 10)
        .unwrap()
        .is_some());
}

/// A page of a file full of quotes and backslashes (each escaped twice on its way to the
/// provider) fits the result cap whole: the registry never cuts it, so the note's offset
/// continues exactly where the content stops.
#[tokio::test]
async fn a_page_of_escaped_text_fits_the_cap_and_paging_loses_no_line() {
    let fx = Fixture::new();
    let line = format!("{}\n", r#""q" \ "#.repeat(20));
    let text: String = (1..=3000).map(|i| format!("{i:05} {line}")).collect();
    std::fs::write(fx.ws.join("quotes.txt"), &text).unwrap();
    let reg = registry();
    let out = reg
        .dispatch("read_file", "r", r#"{"path":"quotes.txt"}"#, &fx.ctx)
        .await;
    assert!(out.error.is_none(), "{:?}", out.error);
    let wire = serde_json::to_string(&serde_json::Value::String(out.content()))
        .unwrap()
        .len();
    assert!(wire <= crate::tools::MAX_TOOL_RESULT_BYTES, "{wire}");
    let v = &out.value;
    let content = v["content"].as_str().unwrap();
    assert!(content.starts_with("00001 "), "{v}");
    assert!(content.ends_with('\n'), "cut inside a line: {v}");
    let shown = content.lines().count();
    let note = v["note"].as_str().unwrap();
    assert!(
        note.ends_with(&format!("continue with offset {}", shown + 1)),
        "{note} after {shown} lines"
    );
}
