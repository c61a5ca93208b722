//! The file tools never touch the daemon's own files, even inside the workspace: by path, by
//! symlink, by hard link, by a directory symlinked or created on the way (issue 14, finding 3).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::tools::fs::{file_tools, FileToolsSettings};
use crate::tools::{Tool, ToolContext, Workspace};
use crate::types::SessionKey;

const CONFIG: &str = "[tools.exec]\nsandbox = true\n# CONFIG-MARK-41d2\n";
const TOKEN: &str = "TOKEN-MARK-9b07-123456:AAsecret";
const CONTROL: &str = "{\"token\": \"CONTROL-MARK-77aa\"}";

/// The service's home used as the workspace, holding the state directory (config, store) and
/// a credentials directory.
struct Home {
    _tmp: tempfile::TempDir,
    ws: std::path::PathBuf,
    ctx: ToolContext,
    tools: Vec<Arc<dyn Tool>>,
}

impl Home {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("home");
        std::fs::create_dir_all(ws.join(".clawft/store")).unwrap();
        std::fs::create_dir_all(ws.join("creds")).unwrap();
        std::fs::write(ws.join(".clawft/config.toml"), CONFIG).unwrap();
        std::fs::write(ws.join(".clawft/store/db"), "sled pages").unwrap();
        std::fs::write(ws.join("creds/telegram.token"), TOKEN).unwrap();
        std::fs::write(ws.join("notes.txt"), "my notes\n").unwrap();
        let mut p = ProtectedPaths::default();
        p.push(ws.join(".clawft/config.toml"), ProtectedKind::Config);
        p.push(ws.join(".clawft"), ProtectedKind::Config);
        p.push(ws.join("creds"), ProtectedKind::Credentials);
        p.push(ws.join(".clawft/store"), ProtectedKind::Store);
        // Not there yet: a write must not create it.
        p.push(ws.join("state"), ProtectedKind::State);
        // Contains the workspace: ignored, or nothing could be opened.
        p.push(tmp.path(), ProtectedKind::State);
        let ctx = ToolContext {
            workspace: Arc::new(Workspace::open(&ws).unwrap().with_protected(&p)),
            session: SessionKey::parse("t:1").unwrap(),
            cancel: CancellationToken::new(),
            user_dir: None,
            sender: None,
            call_id: None,
            turn: Default::default(),
        };
        let tools = file_tools(&FileToolsSettings::default(), None);
        Self {
            _tmp: tmp,
            ws,
            ctx,
            tools,
        }
    }

    async fn call(&self, name: &str, args: Value) -> Result<Value, ToolError> {
        let t = self.tools.iter().find(|t| t.name() == name).unwrap();
        t.execute(args, &self.ctx).await
    }

    /// The call is refused as a protected path, and neither result nor error carries a secret.
    async fn refused(&self, name: &str, args: Value) -> String {
        let r = self.call(name, args.clone()).await;
        let e = match r {
            Err(e) => e,
            Ok(v) => panic!("{name} {args} was allowed: {v}"),
        };
        assert_eq!(e.code(), "PERMISSION_DENIED", "{name} {args}: {e}");
        let text = e.to_string();
        assert!(text.contains("the daemon's"), "{text}");
        assert!(text.contains("file tools never"), "{text}");
        assert_secret_free(&text);
        text
    }

    /// The protected files are byte-identical and nothing new appeared in them.
    fn assert_intact(&self) {
        assert_eq!(
            std::fs::read_to_string(self.ws.join(".clawft/config.toml")).unwrap(),
            CONFIG
        );
        assert_eq!(
            std::fs::read_to_string(self.ws.join("creds/telegram.token")).unwrap(),
            TOKEN
        );
        let names = |d: &str| -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(self.ws.join(d))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(".clawft"), ["config.toml", "store"]);
        assert_eq!(names("creds"), ["telegram.token"]);
        assert!(
            !self.ws.join("state").exists(),
            "a protected path was created"
        );
    }
}

fn assert_secret_free(text: &str) {
    for mark in ["CONFIG-MARK", "TOKEN-MARK", "CONTROL-MARK"] {
        assert!(!text.contains(mark), "{mark} leaked: {text}");
    }
}

#[tokio::test]
async fn writes_and_edits_of_protected_files_are_refused_and_leave_them_identical() {
    let h = Home::new();
    for path in [
        ".clawft/config.toml",
        "creds/telegram.token",
        ".clawft/store/db",
        ".clawft/store/control.json",
        ".clawft/new/dir/x.toml",
        "state/store/db",
        "./creds/../.clawft/config.toml",
        "creds//telegram.token",
    ] {
        h.refused(
            "write_file",
            json!({"path": path, "content": "[tools.exec]\nsandbox = false\n"}),
        )
        .await;
        let r = h
            .call(
                "edit_file",
                json!({"path": path, "old_text": "sandbox = true", "new_text": "sandbox = false"}),
            )
            .await
            .unwrap_err();
        // A path whose directories do not exist is not found before it could be refused.
        let missing = path.contains("/new/") || path.starts_with("state/");
        let want = if missing {
            "FILE_NOT_FOUND"
        } else {
            "PERMISSION_DENIED"
        };
        assert_eq!(r.code(), want, "edit_file {path}: {r}");
    }
    // A backup next to a protected file is refused too.
    h.refused(
        "write_file",
        json!({"path": ".clawft/config.toml", "content": "x", "backup": true}),
    )
    .await;
    h.assert_intact();
    // Everything else in the workspace still works.
    h.call("write_file", json!({"path": "notes.txt", "content": "new"}))
        .await
        .unwrap();
    h.call(
        "edit_file",
        json!({"path": "notes.txt", "old_text": "new", "new_text": "newer"}),
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(h.ws.join("notes.txt")).unwrap(),
        "newer"
    );
}

#[tokio::test]
async fn reads_of_protected_files_return_none_of_their_bytes_by_any_name() {
    let h = Home::new();
    std::fs::write(h.ws.join(".clawft/store/control.json"), CONTROL).unwrap();
    // Symlinks inside the workspace to a protected file and to a protected directory.
    std::os::unix::fs::symlink(".clawft/config.toml", h.ws.join("cfg-link")).unwrap();
    std::os::unix::fs::symlink("creds", h.ws.join("keys")).unwrap();
    // Hard links made after the guard: found by inode, not by a list made at start.
    std::fs::hard_link(h.ws.join(".clawft/config.toml"), h.ws.join("cfg-hard")).unwrap();
    std::fs::hard_link(h.ws.join("creds/telegram.token"), h.ws.join("tok-hard")).unwrap();
    std::fs::hard_link(
        h.ws.join(".clawft/store/control.json"),
        h.ws.join("control-hard"),
    )
    .unwrap();
    for path in [
        ".clawft/config.toml",
        "creds/telegram.token",
        ".clawft/store/control.json",
        "cfg-link",
        "keys/telegram.token",
        "cfg-hard",
        "tok-hard",
        "control-hard",
        "./.clawft/../.clawft/config.toml",
    ] {
        let msg = h.refused("read_file", json!({ "path": path })).await;
        assert!(msg.contains(&format!("`{path}`")), "{msg}");
    }
    for dir in [".clawft", ".clawft/store", "creds", "keys"] {
        h.refused("list_directory", json!({ "path": dir })).await;
        h.refused("glob", json!({"pattern": "*", "directory": dir}))
            .await;
        h.refused("grep", json!({"pattern": "MARK", "directory": dir}))
            .await;
    }
    // A hard link to an ordinary file is still readable.
    std::fs::hard_link(h.ws.join("notes.txt"), h.ws.join("notes-hard")).unwrap();
    let v = h
        .call("read_file", json!({"path": "notes-hard"}))
        .await
        .unwrap();
    assert_eq!(v["content"], "my notes\n");
    h.assert_intact();
}

#[tokio::test]
async fn listings_mark_protected_entries_and_searches_skip_them() {
    let h = Home::new();
    std::fs::hard_link(h.ws.join("creds/telegram.token"), h.ws.join("tok-hard")).unwrap();
    let v = h
        .call("list_directory", json!({"path": "."}))
        .await
        .unwrap();
    let by_name = |n: &str| {
        v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == n)
            .cloned()
            .unwrap_or_else(|| panic!("{n} not listed: {v}"))
    };
    assert_eq!(by_name(".clawft")["protected"], "config");
    assert_eq!(by_name("creds")["protected"], "credentials");
    assert_eq!(by_name("tok-hard")["protected"], "credentials");
    assert!(by_name("notes.txt").get("protected").is_none());
    assert_secret_free(&v.to_string());

    let v = h.call("glob", json!({"pattern": "**/*"})).await.unwrap();
    assert_eq!(v["matches"], json!(["notes.txt"]), "{v}");
    let v = h
        .call("grep", json!({"pattern": "MARK|notes"}))
        .await
        .unwrap();
    assert_eq!(v["count"], 1, "{v}");
    assert_eq!(v["matches"][0]["file"], "notes.txt");
    assert_secret_free(&v.to_string());
}

#[test]
fn canonical_resolves_symlinks_and_keeps_paths_that_do_not_exist_yet() {
    let tmp = tempfile::tempdir().unwrap();
    let real = tmp.path().join("real");
    std::fs::create_dir_all(&real).unwrap();
    std::os::unix::fs::symlink(&real, tmp.path().join("link")).unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    assert_eq!(canonical(&tmp.path().join("link")), root.join("real"));
    assert_eq!(
        canonical(&tmp.path().join("link/not/yet")),
        root.join("real/not/yet")
    );
}
