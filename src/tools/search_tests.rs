#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::os::unix::fs::symlink;
use std::time::{Duration, SystemTime};

use super::*;
use crate::tools::workspace::testutil::{Fixture, CANARY, CANARY_MARK};

fn s() -> FileToolsSettings {
    FileToolsSettings::default()
}
async fn glob(fx: &Fixture, args: Value) -> Result<Value, ToolError> {
    Glob::new(&s()).execute(args, &fx.ctx).await
}
async fn grep(fx: &Fixture, args: Value) -> Result<Value, ToolError> {
    let v = Grep::new(&s()).execute(args, &fx.ctx).await;
    if let Ok(v) = &v {
        Fixture::assert_clean(v);
    }
    v
}

/// A small tree: sources, an ignored dir and file, hidden files, unicode names.
fn tree(fx: &Fixture) {
    fx.put(".gitignore", "target/\n*.log\n");
    fx.put("src/main.rs", "fn main() {\n    helper();\n}\n");
    fx.put("src/lib.rs", "pub fn helper() {}\n// TODO: more\n");
    fx.put("src/deep/mod.rs", "fn inner() {} // todo\n");
    fx.put("docs/ünïcødé 文档.md", "# Título\nTODO traducir\n");
    fx.put("target/gen.rs", "fn generated() {}\n");
    fx.put("app.log", "fn logged() {}\n");
    fx.put(".hidden/h.rs", "fn hidden() {}\n");
    fx.put("notes.txt", "nothing\n");
}

#[tokio::test]
async fn glob_matches_respects_ignores_and_pages() {
    let fx = Fixture::new();
    tree(&fx);
    let v = glob(&fx, json!({"pattern": "**/*.rs"})).await.unwrap();
    assert_eq!(
        v,
        json!({"matches": ["src/deep/mod.rs", "src/lib.rs", "src/main.rs"], "count": 3, "total_found": 3, "truncated": false})
    );
    let v = glob(&fx, json!({"pattern": "*"})).await.unwrap();
    assert_eq!(
        v["matches"],
        json!(["notes.txt"]),
        "`*` stays at the top; .gitignore'd and hidden skipped"
    );
    let v = glob(&fx, json!({"pattern": "*.md", "directory": "docs"}))
        .await
        .unwrap();
    assert_eq!(v["matches"], json!(["docs/ünïcødé 文档.md"]));
    let v = glob(&fx, json!({"pattern": "src/*.rs"})).await.unwrap();
    assert_eq!(v["matches"], json!(["src/lib.rs", "src/main.rs"]));
    let v = glob(
        &fx,
        json!({"pattern": "**/*.rs", "head_limit": 1, "offset": 1}),
    )
    .await
    .unwrap();
    assert_eq!(
        v,
        json!({"matches": ["src/lib.rs"], "count": 1, "total_found": 3, "truncated": true})
    );
    let v = glob(&fx, json!({"pattern": "**/*.rs", "offset": 2}))
        .await
        .unwrap();
    assert_eq!(
        v,
        json!({"matches": ["src/main.rs"], "count": 1, "total_found": 3, "truncated": false})
    );
    let v = glob(&fx, json!({"pattern": "**/*.rs", "offset": 9}))
        .await
        .unwrap();
    assert_eq!(
        v,
        json!({"matches": [], "count": 0, "total_found": 3, "truncated": false})
    );
    let v = glob(&fx, json!({"pattern": "**/*.xyz"})).await.unwrap();
    assert_eq!(
        v,
        json!({"matches": [], "count": 0, "total_found": 0, "truncated": false})
    );
    // The root .gitignore still applies when searching a subdirectory; an explicitly
    // requested ignored directory is searched.
    fx.put("src/target/x.rs", "");
    fx.put("src/x.log", "");
    let v = glob(&fx, json!({"pattern": "**", "directory": "src"}))
        .await
        .unwrap();
    assert_eq!(
        v["matches"],
        json!(["src/deep/mod.rs", "src/lib.rs", "src/main.rs"])
    );
    let v = glob(
        &fx,
        json!({"pattern": "*", "directory": "./target/../target"}),
    )
    .await
    .unwrap();
    assert_eq!(v["matches"], json!(["target/gen.rs"]));
}

#[tokio::test]
async fn glob_sorts_by_modified_and_size() {
    let fx = Fixture::new();
    let now = SystemTime::now();
    for (name, size, age) in [("a.txt", 30, 300), ("b.txt", 10, 100), ("c.txt", 20, 200)] {
        fx.put(name, &"x".repeat(size));
        let f = std::fs::File::options()
            .write(true)
            .open(fx.ws.join(name))
            .unwrap();
        f.set_modified(now - Duration::from_secs(age)).unwrap();
    }
    let m = |v: Value| v["matches"].clone();
    assert_eq!(
        m(glob(&fx, json!({"pattern": "*.txt"})).await.unwrap()),
        json!(["a.txt", "b.txt", "c.txt"])
    );
    assert_eq!(
        m(glob(&fx, json!({"pattern": "*.txt", "sort": "modified"}))
            .await
            .unwrap()),
        json!(["b.txt", "c.txt", "a.txt"])
    );
    assert_eq!(
        m(glob(
            &fx,
            json!({"pattern": "*.txt", "sort": "size", "head_limit": 2})
        )
        .await
        .unwrap()),
        json!(["a.txt", "c.txt"])
    );
    let e = glob(&fx, json!({"pattern": "*", "sort": "random"}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "INVALID_ARGS");
}

#[tokio::test]
async fn glob_and_grep_errors() {
    let fx = Fixture::new();
    tree(&fx);
    let e = glob(&fx, json!({"pattern": "src/[a"})).await.unwrap_err();
    assert_eq!(e.code(), "INVALID_ARGS");
    assert!(e.to_string().contains("src/[a"), "{e}");
    let e = grep(&fx, json!({"pattern": "fn("})).await.unwrap_err();
    assert_eq!(e.code(), "INVALID_ARGS");
    assert!(e.to_string().contains("regex"), "{e}");
    let e = grep(&fx, json!({"pattern": "x", "file_pattern": "{a"}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "INVALID_ARGS");
    let e = grep(&fx, json!({"pattern": "x", "type": "nosuchtype"}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "INVALID_ARGS");
    let e = grep(&fx, json!({"pattern": "x", "output_mode": "lines"}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "INVALID_ARGS");
    let e = glob(&fx, json!({"pattern": "*", "path": "src"}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "INVALID_ARGS");
    for (dir, code) in [("missing", "FILE_NOT_FOUND"), ("notes.txt", "INVALID_PATH")] {
        let e = glob(&fx, json!({"pattern": "*", "directory": dir}))
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{dir}");
        let e = grep(&fx, json!({"pattern": "x", "directory": dir}))
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{dir}");
    }
}

#[tokio::test]
async fn search_directories_outside_are_refused_and_symlinks_not_followed() {
    let mut fx = Fixture::new();
    fx.add_outside("outside.rs", "fn outside() { CANARY-7f3a9c }\n");
    fx.put("in/a.rs", "fn inside() {}\n");
    symlink(&fx.outside, fx.ws.join("in/link_dir")).unwrap();
    symlink(fx.canary(), fx.ws.join("in/link_file.rs")).unwrap();
    symlink(&fx.outside, fx.ws.join("out")).unwrap();
    let abs = fx.outside.to_str().unwrap().to_string();
    for dir in [
        "..",
        "../outside",
        abs.as_str(),
        "in/../..",
        "out",
        "in/link_dir",
        "/",
    ] {
        let e = glob(&fx, json!({"pattern": "**", "directory": dir}))
            .await
            .unwrap_err();
        assert_eq!(e.code(), "INVALID_PATH", "glob {dir}: {e}");
        let e = grep(&fx, json!({"pattern": "fn|CANARY", "directory": dir}))
            .await
            .unwrap_err();
        assert_eq!(e.code(), "INVALID_PATH", "grep {dir}: {e}");
    }
    let v = glob(&fx, json!({"pattern": "**"})).await.unwrap();
    assert_eq!(v["matches"], json!(["in/a.rs"]));
    for mode in ["content", "files_with_matches", "count"] {
        let v = grep(
            &fx,
            json!({"pattern": "fn|CANARY|secret", "output_mode": mode}),
        )
        .await
        .unwrap();
        assert_eq!(v["total_found"], json!(1), "{mode}: {v}");
        assert!(!v.to_string().contains("outside"), "{v}");
    }
    let v = grep(&fx, json!({"pattern": CANARY_MARK, "directory": "in"}))
        .await
        .unwrap();
    assert_eq!(v["total_found"], json!(0));
    assert_eq!(std::fs::read_to_string(fx.canary()).unwrap(), CANARY);
    fx.assert_outside_intact();
}

#[tokio::test]
async fn grep_modes_context_and_paging() {
    let fx = Fixture::new();
    tree(&fx);
    let v = grep(&fx, json!({"pattern": "fn\\s+\\w+\\(", "type": "rust"}))
        .await
        .unwrap();
    assert_eq!(
        v,
        json!({"matches": [
                {"file": "src/deep/mod.rs", "line": 1, "content": "fn inner() {} // todo"},
                {"file": "src/lib.rs", "line": 1, "content": "pub fn helper() {}"},
                {"file": "src/main.rs", "line": 1, "content": "fn main() {"},
            ], "count": 3, "total_found": 3, "truncated": false})
    );
    let v = grep(
        &fx,
        json!({"pattern": "todo", "case_insensitive": true, "output_mode": "files_with_matches"}),
    )
    .await
    .unwrap();
    assert_eq!(
        v,
        json!({"matches": ["docs/ünïcødé 文档.md", "src/deep/mod.rs", "src/lib.rs"], "count": 3, "total_found": 3, "truncated": false})
    );
    let v = grep(&fx, json!({"pattern": "TODO"})).await.unwrap();
    assert_eq!(v["total_found"], json!(2), "case-sensitive by default");
    fx.put("src/many.rs", "x\nx\nx\n");
    let v = grep(
        &fx,
        json!({"pattern": "x|helper", "output_mode": "count", "directory": "src"}),
    )
    .await
    .unwrap();
    assert_eq!(
        v,
        json!({"matches": [{"file": "src/lib.rs", "count": 1}, {"file": "src/main.rs", "count": 1}, {"file": "src/many.rs", "count": 3}],
                   "count": 3, "total_found": 5, "truncated": false})
    );
    let v = grep(&fx, json!({"pattern": "^x$", "offset": 1, "head_limit": 1}))
        .await
        .unwrap();
    assert_eq!(
        v,
        json!({"matches": [{"file": "src/many.rs", "line": 2, "content": "x"}], "count": 1, "total_found": 3, "truncated": true})
    );
    fx.put("ctx.txt", "l1\nl2\nHIT\nl4\nl5\n");
    let v = grep(
        &fx,
        json!({"pattern": "HIT", "context": 1, "after_context": 5}),
    )
    .await
    .unwrap();
    assert_eq!(
        v["matches"],
        json!([{"file": "ctx.txt", "line": 3, "content": "HIT", "before": ["l2"], "after": ["l4", "l5"]}])
    );
    let v = grep(&fx, json!({"pattern": "l1", "before_context": 3}))
        .await
        .unwrap();
    assert_eq!(
        v["matches"],
        json!([{"file": "ctx.txt", "line": 1, "content": "l1", "before": []}])
    );
    let v = grep(&fx, json!({"pattern": "fn", "file_pattern": "main.*"}))
        .await
        .unwrap();
    assert_eq!(v["total_found"], json!(1));
    let v = grep(&fx, json!({"pattern": "fn", "file_pattern": "src/*.rs"}))
        .await
        .unwrap();
    assert_eq!(v["total_found"], json!(2));
    // .gitignore'd and hidden files are not searched; the ignored dir is when asked for.
    let v = grep(&fx, json!({"pattern": "generated|logged|hidden"}))
        .await
        .unwrap();
    assert_eq!(v["total_found"], json!(0));
    let v = grep(&fx, json!({"pattern": "generated", "directory": "target"}))
        .await
        .unwrap();
    assert_eq!(v["total_found"], json!(1));
}

#[tokio::test]
async fn grep_skips_binary_and_cuts_long_lines() {
    let fx = Fixture::new();
    std::fs::write(fx.ws.join("bin.dat"), b"needle\0\x01\x02needle").unwrap();
    let mut late = "needle\n".repeat(2000).into_bytes();
    late.extend_from_slice(b"\0binary after 14000 bytes\n");
    std::fs::write(fx.ws.join("late.dat"), late).unwrap();
    fx.put(
        "long.txt",
        &format!("{}needle{}\n", "é".repeat(600), "z".repeat(600)),
    );
    fx.put("empty.txt", "");
    let v = grep(&fx, json!({"pattern": "needle"})).await.unwrap();
    assert_eq!(v["total_found"], json!(1), "{v}");
    let line = v["matches"][0]["content"].as_str().unwrap();
    assert!(
        line.starts_with("ééé") && line.contains("[line truncated: 1206 characters]"),
        "{line}"
    );
    assert_eq!(
        line.chars().count(),
        500 + "… [line truncated: 1206 characters]".chars().count()
    );
    let v = grep(&fx, json!({"pattern": "^$"})).await.unwrap();
    assert_eq!(v["total_found"], json!(0), "an empty file has no lines");
}

#[tokio::test]
async fn file_budget_bounds_the_walk() {
    let fx = Fixture::new();
    for i in 0..30 {
        fx.put(&format!("f{i:02}.txt"), "hit\n");
    }
    let small = FileToolsSettings {
        search_max_files: 10,
        ..FileToolsSettings::default()
    };
    let v = Glob::new(&small)
        .execute(json!({"pattern": "*"}), &fx.ctx)
        .await
        .unwrap();
    assert_eq!(v["count"], json!(10));
    assert_eq!(v["truncated"], json!(true));
    assert!(v["note"].as_str().unwrap().contains("10 files"));
    let v = Grep::new(&small)
        .execute(json!({"pattern": "hit"}), &fx.ctx)
        .await
        .unwrap();
    assert_eq!(v["total_found"], json!(10));
    assert_eq!(v["truncated"], json!(true));
}

/// A thread keeps swapping the workspace directory `d` with a symlink to the outside
/// directory (atomic `renameat2(RENAME_EXCHANGE)`), while read_file, write_file,
/// edit_file, grep and glob work on `d/...` thousands of times. The outside directory has
/// files of the same names. Nothing outside is ever read, listed, created or changed, and
/// every call succeeds inside or fails with INVALID_PATH / FILE_NOT_FOUND.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn race_swapping_a_directory_for_a_symlink_never_leads_out() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    use crate::tools::fs::{EditFile, ReadFile, WriteFile};

    let mut fx = Fixture::on_tmpfs();
    fx.add_outside("f.txt", "CANARY-7f3a9c inside\n");
    fx.add_outside("only_outside.txt", "CANARY-7f3a9c inside\n");
    fx.put("d/f.txt", "inside\n");
    symlink(&fx.outside, fx.ws.join("d_alt")).unwrap();
    let (d, d_alt) = (fx.ws.join("d"), fx.ws.join("d_alt"));
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicUsize::new(0));
    let swapper = {
        let (stop, swaps) = (stop.clone(), swaps.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    &d,
                    rustix::fs::CWD,
                    &d_alt,
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .unwrap();
                swaps.fetch_add(1, Ordering::Relaxed);
                std::thread::yield_now();
            }
        })
    };
    let set = s();
    let (read, write, edit) = (ReadFile, WriteFile::new(&set), EditFile::new(&set));
    let (gr, gl) = (Grep::new(&set), Glob::new(&set));
    let started = std::time::Instant::now();
    let (mut calls, mut ok, mut refused) = (0usize, 0usize, 0usize);
    while (started.elapsed() < Duration::from_secs(1) || calls < 2000)
        && started.elapsed() < Duration::from_secs(20)
    {
        let results = [
            read.execute(json!({"path": "d/f.txt"}), &fx.ctx).await,
            write
                .execute(json!({"path": "d/f.txt", "content": "inside\n"}), &fx.ctx)
                .await,
            write
                .execute(json!({"path": "d/new/w.txt", "content": "w"}), &fx.ctx)
                .await,
            edit.execute(
                json!({"path": "d/f.txt", "old_text": "inside", "new_text": "inside"}),
                &fx.ctx,
            )
            .await,
            gr.execute(
                json!({"pattern": "inside|CANARY", "directory": "d"}),
                &fx.ctx,
            )
            .await,
            gl.execute(json!({"pattern": "**", "directory": "d"}), &fx.ctx)
                .await,
            gr.execute(json!({"pattern": "CANARY"}), &fx.ctx).await,
        ];
        for (i, r) in results.into_iter().enumerate() {
            calls += 1;
            match r {
                Ok(v) => {
                    ok += 1;
                    Fixture::assert_clean(&v);
                    if i == 0 {
                        assert_eq!(v["content"], json!("inside\n"));
                    }
                    for m in v["matches"].as_array().into_iter().flatten() {
                        let f = m.as_str().or(m["file"].as_str()).unwrap();
                        assert!(
                            ["d/f.txt", "d/new/w.txt"].contains(&f),
                            "listed a file that is not in the workspace: {f}"
                        );
                    }
                }
                Err(e) => {
                    refused += 1;
                    assert!(
                        matches!(e.code(), "INVALID_PATH" | "FILE_NOT_FOUND"),
                        "call {i}: {e}"
                    );
                }
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    let swaps = swaps.load(Ordering::Relaxed);
    eprintln!(
        "race: {calls} calls ({ok} ok, {refused} refused), {swaps} swaps in {:?}",
        started.elapsed()
    );
    assert!(
        calls >= 2000 && swaps >= 100,
        "{calls} calls, {swaps} swaps"
    );
    assert!(
        ok > 0 && refused > 0,
        "both outcomes must occur: {ok} ok, {refused} refused"
    );
    fx.assert_outside_intact();
    let real = if fx.ws.join("d").is_symlink() {
        "d_alt"
    } else {
        "d"
    };
    assert_eq!(
        std::fs::read_to_string(fx.ws.join(real).join("f.txt")).unwrap(),
        "inside\n"
    );
}

#[tokio::test]
async fn cancelled_search_stops() {
    let fx = Fixture::new();
    fx.put("a.txt", "hit\n");
    fx.ctx.cancel.cancel();
    let e = grep(&fx, json!({"pattern": "hit"})).await.unwrap_err();
    assert_eq!(e.code(), "CANCELLED");
    let e = glob(&fx, json!({"pattern": "**"})).await.unwrap_err();
    assert_eq!(e.code(), "CANCELLED");
}

#[tokio::test]
async fn grep_pages_a_file_with_many_matches() {
    let fx = Fixture::new();
    fx.put("many.txt", &"m\n".repeat(5000));
    let v = grep(&fx, json!({"pattern": "m", "offset": 4998}))
        .await
        .unwrap();
    assert_eq!(v["total_found"], json!(5000));
    assert_eq!(v["count"], json!(2));
    assert_eq!(v["matches"][0]["line"], json!(4999));
    assert_eq!(v["truncated"], json!(false));
    let v = grep(&fx, json!({"pattern": "m"})).await.unwrap();
    assert_eq!(v["count"], json!(MAX_RESULTS));
    assert_eq!(v["truncated"], json!(true));
    let v = glob(&fx, json!({"pattern": "./*.txt"})).await.unwrap();
    assert_eq!(v["matches"], json!(["many.txt"]));
}

#[tokio::test]
async fn grep_lines_anchors_and_byte_order_marks() {
    // The line search that replaced grep-searcher: `^` is each line's, line numbers count
    // every line (CRLF ones too), a UTF-8 mark is dropped and UTF-16 is decoded. UTF-16 of
    // ASCII text holds NUL bytes and is skipped as binary, as before.
    let fx = Fixture::new();
    fx.put("a.txt", "alpha\nbeta alpha\n\nalpha beta\nalpha");
    let v = grep(&fx, json!({"pattern": "^alpha"})).await.unwrap();
    let lines: Vec<_> = v["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["line"].clone())
        .collect();
    assert_eq!(lines, [json!(1), json!(4), json!(5)], "{v}");
    // `$` is each line's end too, and `^$` finds the empty line (as with grep and ripgrep).
    let lines = |v: &Value| -> Vec<Value> {
        v["matches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["line"].clone())
            .collect()
    };
    let v = grep(&fx, json!({"pattern": "alpha$"})).await.unwrap();
    assert_eq!(lines(&v), [json!(1), json!(2), json!(5)], "{v}");
    let v = grep(&fx, json!({"pattern": "^$"})).await.unwrap();
    assert_eq!(lines(&v), [json!(3)], "{v}");
    let fx = Fixture::new();
    fx.put("crlf.txt", "one end\r\ntwo\r\nthree end\r\n");
    let v = grep(&fx, json!({"pattern": "end$"})).await.unwrap();
    assert_eq!(lines(&v), [json!(1), json!(3)], "{v}");

    let fx = Fixture::new();
    std::fs::write(
        fx.ws.join("bom8.txt"),
        b"\xEF\xBB\xBFneedle first\nsecond\n",
    )
    .unwrap();
    let mut le = vec![0xFF, 0xFE];
    let mut be = vec![0xFE, 0xFF];
    for u in "\u{4e2d}\u{6587}\u{4e2d}".encode_utf16() {
        le.extend(u.to_le_bytes());
        be.extend(u.to_be_bytes());
    }
    std::fs::write(fx.ws.join("le.txt"), &le).unwrap();
    std::fs::write(fx.ws.join("be.txt"), &be).unwrap();
    let v = grep(&fx, json!({"pattern": "^(needle|\u{4e2d})"}))
        .await
        .unwrap();
    assert_eq!(
        v["matches"],
        json!([
            {"file": "be.txt", "line": 1, "content": "\u{4e2d}\u{6587}\u{4e2d}"},
            {"file": "bom8.txt", "line": 1, "content": "needle first"},
            {"file": "le.txt", "line": 1, "content": "\u{4e2d}\u{6587}\u{4e2d}"},
        ]),
        "{v}"
    );

    let fx = Fixture::new();
    std::fs::write(fx.ws.join("crlf.txt"), b"one\r\ntwo\r\n").unwrap();
    let v = grep(&fx, json!({"pattern": "two"})).await.unwrap();
    assert_eq!(v["matches"][0]["line"], json!(2));
}
