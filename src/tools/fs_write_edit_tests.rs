#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

use serde_json::json;

use super::*;
use crate::tools::workspace::testutil::{Fixture, CANARY};

fn w() -> WriteFile {
    WriteFile::new(&FileToolsSettings::default())
}
fn e() -> EditFile {
    EditFile::new(&FileToolsSettings::default())
}

#[tokio::test]
async fn write_file_creates_parents_overwrites_and_backs_up() {
    let fx = Fixture::new();
    let v = w()
        .execute(
            json!({"path": "a/b/ünï 文件.txt", "content": "héllo 🌍\n"}),
            &fx.ctx,
        )
        .await
        .unwrap();
    let bytes = "héllo 🌍\n".len();
    assert_eq!(
        v,
        json!({"message": format!("Successfully wrote {bytes} bytes to a/b/ünï 文件.txt"), "bytes": bytes, "created": true})
    );
    let p = fx.ws.join("a/b/ünï 文件.txt");
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "héllo 🌍\n");

    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    let v = w()
        .execute(
            json!({"path": "a/b/ünï 文件.txt", "content": "new", "backup": true}),
            &fx.ctx,
        )
        .await
        .unwrap();
    assert_eq!(v["created"], json!(false));
    assert_eq!(v["backup"], json!("a/b/ünï 文件.txt.bak"));
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "new");
    assert_eq!(
        std::fs::read_to_string(fx.ws.join("a/b/ünï 文件.txt.bak")).unwrap(),
        "héllo 🌍\n"
    );
    assert_eq!(
        std::fs::metadata(&p).unwrap().mode() & 0o777,
        0o600,
        "mode kept"
    );

    // Without backup the .bak is left alone; empty content makes an empty file.
    w().execute(json!({"path": "a/b/ünï 文件.txt", "content": ""}), &fx.ctx)
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "");
    assert_eq!(
        std::fs::read_to_string(fx.ws.join("a/b/ünï 文件.txt.bak")).unwrap(),
        "héllo 🌍\n"
    );

    // `.` and `x/..` inside the workspace are fine; no temporary files are left behind.
    w().execute(json!({"path": "./a/../top.txt", "content": "t"}), &fx.ctx)
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(fx.ws.join("top.txt")).unwrap(), "t");
    let mut names: Vec<_> = std::fs::read_dir(fx.ws.join("a/b"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["ünï 文件.txt", "ünï 文件.txt.bak"]);
    fx.assert_outside_intact();
}

#[tokio::test]
async fn write_file_errors() {
    let fx = Fixture::new();
    fx.put("dir/x.txt", "x");
    fx.put("file", "f");
    let cases = [
        (json!({"path": "dir", "content": "c"}), "INVALID_ARGS"),
        (json!({"path": "file/x", "content": "c"}), "INVALID_PATH"),
        (json!({"path": "", "content": "c"}), "INVALID_PATH"),
        (json!({"path": "dir/", "content": "c"}), "INVALID_PATH"),
        (json!({"path": "dir/..", "content": "c"}), "INVALID_PATH"),
        (json!({"path": ".", "content": "c"}), "INVALID_PATH"),
        (json!({"path": "a\u{0}b", "content": "c"}), "INVALID_PATH"),
        (json!({"path": "x"}), "INVALID_ARGS"),
        (
            json!({"path": "x", "content": "c", "mode": 1}),
            "INVALID_ARGS",
        ),
        (json!({"path": "x", "content": 5}), "INVALID_ARGS"),
    ];
    for (args, code) in cases {
        let err = w().execute(args.clone(), &fx.ctx).await.unwrap_err();
        assert_eq!(err.code(), code, "{args}: {err}");
    }
    assert!(fx.ws.join("dir").is_dir());
    assert_eq!(std::fs::read_to_string(fx.ws.join("file")).unwrap(), "f");
    let small = WriteFile::new(&FileToolsSettings {
        max_write_bytes: 4,
        ..FileToolsSettings::default()
    });
    let err = small
        .execute(json!({"path": "big", "content": "12345"}), &fx.ctx)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "INVALID_ARGS");
    assert!(!fx.ws.join("big").exists());
    fx.assert_outside_intact();
}

#[tokio::test]
async fn write_5mb_then_read_pages() {
    let fx = Fixture::new();
    let content: String = (1..=100_000)
        .map(|i| format!("line {i:06} {}\n", "x".repeat(38)))
        .collect();
    assert!(content.len() >= 5_000_000);
    let v = w()
        .execute(json!({"path": "big.txt", "content": content}), &fx.ctx)
        .await
        .unwrap();
    assert_eq!(v["bytes"], json!(content.len()));
    let r = ReadFile
        .execute(
            json!({"path": "big.txt", "offset": 99_999, "limit": 5}),
            &fx.ctx,
        )
        .await
        .unwrap();
    assert_eq!(r["total_lines"], json!(100_000));
    let got = r["content"].as_str().unwrap();
    assert!(
        got.starts_with("line 099999 ") && got.contains("line 100000 "),
        "{got}"
    );
    // A 5 MB edit works too.
    let v = e()
        .execute(
            json!({"path": "big.txt", "old_text": "line 050000 ", "new_text": "LINE 50000 "}),
            &fx.ctx,
        )
        .await
        .unwrap();
    assert_eq!(v["replacements"], json!(1));
    assert!(std::fs::read_to_string(fx.ws.join("big.txt"))
        .unwrap()
        .contains("LINE 50000 x"));
}

#[tokio::test]
async fn writes_and_edits_never_leave_the_workspace() {
    let fx = Fixture::new();
    let canary = fx.canary();
    symlink(&fx.outside, fx.ws.join("out")).unwrap();
    symlink("../outside", fx.ws.join("out_rel")).unwrap();
    symlink(&canary, fx.ws.join("lnk")).unwrap();
    symlink(fx.outside.join("newdir"), fx.ws.join("dangling")).unwrap();
    std::fs::create_dir(fx.ws.join("sub")).unwrap();
    let abs = canary.to_str().unwrap().to_string();
    for path in [
        "../outside/canary.txt",
        abs.as_str(),
        "sub/../../outside/canary.txt",
        "out/canary.txt",
        "out/new.txt",
        "out_rel/canary.txt",
        "out/deeper/new.txt",
        "lnk",
        "dangling/x.txt",
        "dangling/a/b/x.txt",
    ] {
        let err = w()
            .execute(json!({"path": path, "content": "pwned"}), &fx.ctx)
            .await
            .unwrap_err();
        assert_eq!(err.code(), "INVALID_PATH", "write {path}: {err}");
        let err = e()
            .execute(
                json!({"path": path, "old_text": "top secret", "new_text": "pwned"}),
                &fx.ctx,
            )
            .await
            .unwrap_err();
        assert!(
            matches!(err.code(), "INVALID_PATH" | "FILE_NOT_FOUND"),
            "edit {path}: {err}"
        );
        fx.assert_outside_intact();
    }
    // A hard link to the canary inside the workspace: refused, canary unchanged.
    std::fs::hard_link(&canary, fx.ws.join("hard.txt")).unwrap();
    let err = w()
        .execute(json!({"path": "hard.txt", "content": "pwned"}), &fx.ctx)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "PERMISSION_DENIED", "{err}");
    assert!(err.to_string().contains("hard link"), "{err}");
    let err = e()
        .execute(
            json!({"path": "hard.txt", "old_text": "top secret", "new_text": "pwned"}),
            &fx.ctx,
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "PERMISSION_DENIED", "{err}");
    let err = w()
        .execute(
            json!({"path": "hard.txt", "content": "x", "backup": true}),
            &fx.ctx,
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "PERMISSION_DENIED");
    assert_eq!(
        std::fs::read_to_string(fx.ws.join("hard.txt")).unwrap(),
        CANARY
    );
    // A symlink inside the workspace to an inside file is not written through either.
    fx.put("real.txt", "real");
    symlink("real.txt", fx.ws.join("alias")).unwrap();
    let err = w()
        .execute(json!({"path": "alias", "content": "x"}), &fx.ctx)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "PERMISSION_DENIED");
    assert_eq!(
        std::fs::read_to_string(fx.ws.join("real.txt")).unwrap(),
        "real"
    );
    symlink("missing.txt", fx.ws.join("dangling_in")).unwrap();
    let err = w()
        .execute(json!({"path": "dangling_in", "content": "x"}), &fx.ctx)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "PERMISSION_DENIED", "{err}");
    assert!(!fx.ws.join("missing.txt").exists());
    assert!(!fx.outside.join("newdir").exists());
    fx.assert_outside_intact();
}

#[tokio::test]
async fn edit_file_replaces_once_or_all() {
    let fx = Fixture::new();
    fx.put(
        "ü/s.rs",
        "fn main() {\n    let x = 1; // ß\n    let x = 2;\n}\n",
    );
    let v = e()
            .execute(json!({"path": "ü/s.rs", "old_text": "let x = 1; // ß", "new_text": "let y = 1; // 日本"}), &fx.ctx)
            .await
            .unwrap();
    assert_eq!(
        v,
        json!({"message": "Successfully edited ü/s.rs (1 replacement)", "replacements": 1})
    );
    let v = e()
            .execute(json!({"path": "ü/s.rs", "old_text": "let ", "new_text": "const ", "replace_all": true}), &fx.ctx)
            .await
            .unwrap();
    assert_eq!(v["replacements"], json!(2));
    assert_eq!(
        std::fs::read_to_string(fx.ws.join("ü/s.rs")).unwrap(),
        "fn main() {\n    const y = 1; // 日本\n    const x = 2;\n}\n"
    );
    // Replacing with nothing deletes the text.
    e().execute(
        json!({"path": "ü/s.rs", "old_text": "    const x = 2;\n", "new_text": ""}),
        &fx.ctx,
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(fx.ws.join("ü/s.rs")).unwrap(),
        "fn main() {\n    const y = 1; // 日本\n}\n"
    );
}

#[tokio::test]
async fn edit_file_errors_leave_the_file_alone() {
    let fx = Fixture::new();
    let text = "alpha\n  beta   gamma\nDelta\nrep\nrep\nrep\n";
    fx.put("f.txt", text);
    fx.put("d/x", "x");
    std::fs::write(fx.ws.join("bin"), b"ab\0cd").unwrap();
    std::fs::write(fx.ws.join("latin1"), b"caf\xe9").unwrap();
    let run = |args: Value| {
        let c = fx.ctx.clone();
        async move { e().execute(args, &c).await.unwrap_err() }
    };
    let err = run(json!({"path": "f.txt", "old_text": "zzz", "new_text": "y"})).await;
    assert_eq!(err.code(), "INVALID_ARGS");
    assert!(err.to_string().contains("not found"), "{err}");
    let err = run(json!({"path": "f.txt", "old_text": "beta gamma", "new_text": "y"})).await;
    assert!(
        err.to_string().contains("whitespace") && err.to_string().contains("line 2"),
        "{err}"
    );
    let err = run(json!({"path": "f.txt", "old_text": "delta", "new_text": "y"})).await;
    assert!(
        err.to_string().contains("case") && err.to_string().contains("line 3"),
        "{err}"
    );
    let err = run(json!({"path": "f.txt", "old_text": "rep", "new_text": "y"})).await;
    assert_eq!(err.code(), "INVALID_ARGS");
    let m = err.to_string();
    assert!(
        m.contains("3 times") && m.contains("lines 4, 5, 6") && m.contains("replace_all"),
        "{m}"
    );
    let err = run(json!({"path": "f.txt", "old_text": "", "new_text": "y"})).await;
    assert_eq!(err.code(), "INVALID_ARGS");
    let err = run(json!({"path": "nope.txt", "old_text": "a", "new_text": "y"})).await;
    assert_eq!(err.code(), "FILE_NOT_FOUND");
    let err = run(json!({"path": "missing/nope.txt", "old_text": "a", "new_text": "y"})).await;
    assert_eq!(err.code(), "FILE_NOT_FOUND");
    let err = run(json!({"path": "d", "old_text": "a", "new_text": "y"})).await;
    assert_eq!(err.code(), "INVALID_ARGS");
    let err = run(json!({"path": "bin", "old_text": "ab", "new_text": "y"})).await;
    assert_eq!(err.code(), "BINARY_FILE");
    let err = run(json!({"path": "latin1", "old_text": "caf", "new_text": "y"})).await;
    assert_eq!(err.code(), "BINARY_FILE");
    let err = run(json!({"path": "f.txt", "old": "a", "new_text": "y"})).await;
    assert_eq!(err.code(), "INVALID_ARGS");
    let small = EditFile::new(&FileToolsSettings {
        max_edit_bytes: 8,
        ..FileToolsSettings::default()
    });
    let err = small
        .execute(
            json!({"path": "f.txt", "old_text": "alpha", "new_text": "y"}),
            &fx.ctx,
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "INVALID_ARGS");
    assert_eq!(std::fs::read_to_string(fx.ws.join("f.txt")).unwrap(), text);
}

#[test]
fn settings_resolve_defaults_and_reject_zero() {
    assert_eq!(
        FileToolsFile::default().resolve().unwrap(),
        FileToolsSettings::default()
    );
    let f = FileToolsFile {
        search_max_files: Some(0),
        ..FileToolsFile::default()
    };
    let e = f.resolve().unwrap_err().to_string();
    assert!(e.contains("tools.files.search_max_files"), "{e}");
    let f = FileToolsFile {
        memory_max_bytes: Some(2048),
        ..FileToolsFile::default()
    };
    assert_eq!(f.resolve().unwrap().memory_max_bytes, 2048);
}

#[test]
fn file_tools_lists_every_tool_with_the_right_effect() {
    let tools = file_tools(&FileToolsSettings::default(), None);
    let mut names: Vec<(&str, Effect)> = tools.iter().map(|t| (t.name(), t.effect())).collect();
    names.sort_by_key(|n| n.0);
    assert_eq!(
        names,
        [
            ("edit_file", Effect::Writes),
            ("glob", Effect::ReadOnly),
            ("grep", Effect::ReadOnly),
            ("list_directory", Effect::ReadOnly),
            ("memory_read", Effect::ReadOnly),
            ("memory_write", Effect::Writes),
            ("read_file", Effect::ReadOnly),
            ("write_file", Effect::Writes),
        ]
    );
    for t in &tools {
        // Short: the core ones are in every request (issue 32).
        assert!(t.description().len() <= 200, "{}", t.name());
        assert_eq!(t.parameters()["type"], json!("object"), "{}", t.name());
        let p = t.parameters();
        assert_eq!(p["additionalProperties"], json!(false), "{}", t.name());
        assert!(
            !p.to_string().contains("$ref"),
            "{}: inline schemas only",
            t.name()
        );
    }
}

#[tokio::test]
async fn special_files_are_refused_without_hanging() {
    let fx = Fixture::new();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        fx.ws.join("fifo"),
        rustix::fs::FileType::Fifo,
        Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let c = &fx.ctx;
    let r = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        let e1 = ReadFile
            .execute(json!({"path": "fifo"}), c)
            .await
            .unwrap_err();
        let e2 = w()
            .execute(json!({"path": "fifo", "content": "x"}), c)
            .await
            .unwrap_err();
        let e3 = e()
            .execute(json!({"path": "fifo", "old_text": "a", "new_text": "b"}), c)
            .await
            .unwrap_err();
        let v = crate::tools::search::Grep::new(&FileToolsSettings::default())
            .execute(json!({"pattern": "x"}), c)
            .await
            .unwrap();
        (e1, e2, e3, v)
    })
    .await
    .expect("a FIFO made a file tool hang");
    assert_eq!(
        (r.0.code(), r.1.code(), r.2.code()),
        ("INVALID_ARGS", "INVALID_ARGS", "INVALID_ARGS")
    );
    assert_eq!(r.3["total_found"], json!(0));
    assert!(rustix::fs::FileType::from_raw_mode(
        rustix::fs::stat(fx.ws.join("fifo")).unwrap().st_mode
    )
    .is_fifo());
}

/// A path of thousands of components is refused at once, before any directory is made (it
/// used to create directories one prefix at a time, each reopened from the root, until the
/// tool's timeout).
#[tokio::test]
async fn a_very_deep_path_is_refused_fast_and_creates_nothing() {
    let fx = Fixture::new();
    for (path, what) in [
        (format!("{}f.txt", "d/".repeat(3000)), "deep"),
        (format!("{}f.txt", "d/".repeat(2000)), "deep under PATH_MAX"),
        (format!("{}/f.txt", "x".repeat(300)), "long name"),
        (format!("{}f.txt", "abcdefghi/".repeat(420)), "long path"),
    ] {
        let started = std::time::Instant::now();
        let err = w()
            .execute(json!({"path": path, "content": "x"}), &fx.ctx)
            .await
            .unwrap_err();
        assert_eq!(err.code(), "INVALID_PATH", "{what}: {err}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "{what}: took {:?}",
            started.elapsed()
        );
        let entries: Vec<_> = std::fs::read_dir(&fx.ws)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n == "d" || n == "abcdefghi")
            .collect();
        assert!(entries.is_empty(), "{what}: created {entries:?}");
    }
    // A reasonably deep path still works.
    let ok = format!("{}f.txt", "d/".repeat(40));
    w().execute(json!({"path": ok, "content": "x"}), &fx.ctx)
        .await
        .unwrap();
    assert!(fx.ws.join(&ok).is_file());
}
