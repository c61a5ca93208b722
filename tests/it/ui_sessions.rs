//! The control UI beyond its first pages: the sessions page's search (by key, channel, user
//! and transcript text, paged), window and usage, and Compact; the web chat's agent choice and
//! attachments; canvas changes pushed on the UI's event stream; the canvas snapshot through a
//! real Chromium; and UI sessions kept across a restart by the hash of their cookie only.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use crate::control_ui::{exchange, link, plain, run, ui_get, ui_post};
use crate::fake_llm::{FakeLlm, Reply};
use crate::process::{free_port, gateway_config, Daemon};

const T: Duration = Duration::from_secs(30);

/// A 1×1 PNG.
const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
    0x89, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8, 0xcf, 0xc0, 0xf0,
    0x1f, 0x00, 0x05, 0x00, 0x01, 0xff, 0x89, 0x99, 0x3d, 0x1d, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45,
    0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];

struct Ui {
    base: String,
    cookie: String,
    csrf: String,
}

impl Ui {
    async fn login(dir: &Path, cfg: &Path, base: &str, extra: &[&str]) -> Self {
        let url = link(dir, cfg, extra).await;
        let (s, cookie, set) = exchange(base, &url, base).await;
        assert_eq!(s, 200, "{set}");
        let cookie = cookie.unwrap();
        let (s, me) = ui_get(base, "/ui/api/me", &cookie).await;
        assert_eq!(s, 200, "{me}");
        Self {
            base: base.to_string(),
            csrf: me["csrf"].as_str().unwrap().to_string(),
            cookie,
        }
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        ui_post(
            &self.base,
            path,
            &self.cookie,
            Some(&self.base),
            Some(&self.csrf),
            body,
        )
        .await
    }

    async fn search(&self, body: Value) -> Value {
        let (s, v) = self.post("/ui/api/admin/sessions/search", body).await;
        assert_eq!(s, 200, "{v}");
        v
    }

    /// Wait until session `key`'s transcript holds `text`.
    async fn wait_transcript(&self, key: &str, text: &str) -> Value {
        let path = format!("/ui/api/sessions/{}", key.replace('@', "%40"));
        let deadline = std::time::Instant::now() + T;
        loop {
            let (s, v) = ui_get(&self.base, &path, &self.cookie).await;
            if s == 200 && v["messages"].to_string().contains(text) {
                return v;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{key} never held {text:?}: {v}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A multipart chat post with `files` (name, bytes).
    async fn post_files(&self, fields: &[(&str, &str)], files: &[(&str, &[u8])]) -> (u16, Value) {
        let boundary = "----weft-test-boundary-7d2";
        let mut body = Vec::new();
        for (k, v) in fields {
            body.extend(
                format!(
                    "--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n"
                )
                .as_bytes(),
            );
        }
        for (name, bytes) in files {
            body.extend(
                format!(
                    "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: image/jpeg\r\n\r\n"
                )
                .as_bytes(),
            );
            body.extend(*bytes);
            body.extend(b"\r\n");
        }
        body.extend(format!("--{boundary}--\r\n").as_bytes());
        let r = plain()
            .post(format!("{}/ui/api/chat", self.base))
            .header("cookie", format!("weft_ui={}", self.cookie))
            .header("origin", &self.base)
            .header("x-csrf-token", &self.csrf)
            .header(
                "content-type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .body(body)
            .send()
            .await
            .unwrap();
        let s = r.status().as_u16();
        (s, r.json().await.unwrap_or(Value::Null))
    }
}

fn setup(llm: &FakeLlm, extra: Value) -> (tempfile::TempDir, PathBuf, u16) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    let port = free_port();
    let cfg = gateway_config(dir.path(), llm, port, extra);
    (dir, cfg, port)
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The web chat: the agent chosen in the page answers (its own session, `CHAT@AGENT`), files
/// reach the model like a platform's attachments (typed by their bytes, saved in the inbox).
/// The sessions page: search by key, user, channel and text, paged, each row with its window
/// and usage; Compact summarises now, as `/compact` does.
#[tokio::test]
async fn sessions_search_window_compact_agent_choice_and_attachments() {
    let llm = FakeLlm::start().await;
    crate::window::route(&llm);
    let (dir, cfg, port) = setup(
        &llm,
        json!({"agents": {"work": {
            "workspace": "WS_WORK",
            "system_prompt": "You are WORK.",
            "model": "work-model",
        }}, "media": {"max_file_mb": 1}}),
    );
    // The second agent's workspace, inside the test's directory.
    let text = std::fs::read_to_string(&cfg).unwrap();
    let ws_work = dir.path().join("ws-work");
    std::fs::create_dir_all(&ws_work).unwrap();
    std::fs::write(
        &cfg,
        text.replace("WS_WORK", &ws_work.display().to_string()),
    )
    .unwrap();
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let ui = Ui::login(dir.path(), &cfg, &d.api.base, &[]).await;
    let (_, me) = ui_get(&ui.base, "/ui/api/me", &ui.cookie).await;
    assert_eq!(me["agents"], json!(["main", "work"]), "{me}");

    // The bound agent (main) in chat `main`; then the agent `work` in the same chat name.
    let (s, v) = ui
        .post(
            "/ui/api/chat",
            json!({"chat": "main", "content": "the haystack has a needle in it"}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["chat"], "main");
    ui.wait_transcript("web:main", "ok ").await;
    let (s, v) = ui
        .post(
            "/ui/api/chat",
            json!({"chat": "main", "agent": "work", "content": "hello work"}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["chat"], "main@work");
    ui.wait_transcript("@work:web:main@work", "ok ").await;
    let by_work: Vec<Value> = llm
        .requests()
        .into_iter()
        .filter(|r| crate::common::last_user(r).contains("hello work"))
        .collect();
    assert_eq!(by_work.len(), 1);
    assert_eq!(by_work[0]["model"], "work-model");
    assert!(by_work[0].to_string().contains("You are WORK."));
    // An agent that is not configured, a chat name holding `@`: refused, nothing sent.
    let before = llm.requests().len();
    for body in [
        json!({"chat": "main", "agent": "nobody", "content": "x"}),
        json!({"chat": "a@work", "content": "x"}),
    ] {
        let (s, v) = ui.post("/ui/api/chat", body).await;
        assert_eq!(s, 400, "{v}");
    }
    // Attachments: a real PNG, an HTML page that calls itself a JPEG, and a file over
    // `media.max_file_mb` (named to the model, not saved).
    let big = vec![b'x'; 1024 * 1024 + 10];
    let (s, v) = ui
        .post_files(
            &[
                ("chat", "main"),
                ("agent", ""),
                ("content", "what are these files"),
            ],
            &[
                ("pic.png", PNG),
                ("fake.jpg", b"<!doctype html><html><body>hi</body></html>"),
                ("big.bin", &big),
            ],
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["files"], 3);
    let reqs = llm.wait_requests(before + 1, T).await;
    let req = reqs
        .iter()
        .find(|r| r.to_string().contains("what are these files"))
        .unwrap();
    let user = crate::common::last_user(req);
    assert!(
        user.contains("inbox/") && user.contains("pic.png (image/png"),
        "{user}"
    );
    assert!(user.contains("text/html"), "typed by its bytes: {user}");
    assert!(
        user.contains("big.bin") && user.contains("over the 1.0 MB limit per file"),
        "{user}"
    );
    let saved = files_under(&dir.path().join("ws/inbox"));
    let png = saved
        .iter()
        .find(|p| p.to_string_lossy().ends_with("-pic.png"))
        .unwrap_or_else(|| panic!("{saved:?}"));
    assert_eq!(std::fs::read(png).unwrap(), PNG);
    assert!(
        !saved.iter().any(|p| p.to_string_lossy().contains("big")),
        "{saved:?}"
    );
    // Too many files: refused whole.
    let many: Vec<(&str, &[u8])> = (0..11).map(|_| ("p.png", PNG)).collect();
    let (s, v) = ui.post_files(&[("content", "many")], &many).await;
    assert_eq!(s, 413, "{v}");
    let deadline = std::time::Instant::now() + T;
    loop {
        let v = ui.wait_transcript("web:main", "what are these files").await;
        if v["messages"].as_array().unwrap().len() == 4 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no reply: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Search: everything, most recent first, each with its window and usage.
    let all = ui.search(json!({})).await;
    let rows = all["sessions"].as_array().unwrap();
    assert_eq!(all["total_sessions"], 2, "{all}");
    assert_eq!(rows.len(), 2, "{all}");
    assert_eq!(rows[0]["key"], "web:main", "the latest first: {all}");
    let main = &rows[0];
    assert_eq!(main["window"]["stored"], 4, "{main}");
    assert_eq!(main["window"]["in_window"], 4, "{main}");
    assert!(
        main["window"]["tokens_estimate"].as_u64().unwrap() > 10,
        "{main}"
    );
    assert!(main["usage"]["calls"].as_u64().unwrap() >= 2, "{main}");
    assert_eq!(main["users"], json!(["web:operator"]), "{main}");
    // By text in a transcript (with where it was found), by key, by user, by channel.
    let v = ui.search(json!({"q": "NEEDLE"})).await;
    let keys: Vec<&str> = v["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["web:main"], "{v}");
    assert_eq!(v["sessions"][0]["match"], "text");
    assert!(
        v["sessions"][0]["snippet"]
            .as_str()
            .unwrap()
            .contains("a needle in it"),
        "{v}"
    );
    let v = ui.search(json!({"q": "main@work"})).await;
    assert_eq!(v["sessions"][0]["key"], "@work:web:main@work", "{v}");
    assert_eq!(v["sessions"][0]["match"], "key");
    assert_eq!(v["sessions"].as_array().unwrap().len(), 1, "{v}");
    let v = ui.search(json!({"q": "operator"})).await;
    assert_eq!(v["sessions"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["sessions"][0]["match"], "user", "{v}");
    let v = ui.search(json!({"channel": "telegram"})).await;
    assert_eq!(v["sessions"], json!([]), "{v}");
    let v = ui.search(json!({"q": "nowhere to be found"})).await;
    assert_eq!(v["sessions"], json!([]), "{v}");
    // Paged.
    let p1 = ui.search(json!({"limit": 1})).await;
    assert_eq!(p1["next_offset"], 1, "{p1}");
    let p2 = ui.search(json!({"limit": 1, "offset": 1})).await;
    assert_eq!(p2["next_offset"], Value::Null, "{p2}");
    assert_ne!(p1["sessions"][0]["key"], p2["sessions"][0]["key"]);
    let (s, v) = ui
        .post("/ui/api/admin/sessions/search", json!({"limit": 1000}))
        .await;
    assert_eq!(s, 400, "{v}");

    // Compact: a read-only session may search, not compact; an unknown session is refused.
    let ro = Ui::login(dir.path(), &cfg, &d.api.base, &["--read-only"]).await;
    let (s, _) = ro.post("/ui/api/admin/sessions/search", json!({})).await;
    assert_eq!(s, 200);
    let (s, v) = ro
        .post(
            "/ui/api/admin/sessions/compact",
            json!({"session": "web:main"}),
        )
        .await;
    assert_eq!(s, 403, "{v}");
    let (s, v) = ui
        .post(
            "/ui/api/admin/sessions/compact",
            json!({"session": "web:nope"}),
        )
        .await;
    assert_eq!(s, 400, "{v}");
    let (s, v) = ui
        .post(
            "/ui/api/admin/sessions/compact",
            json!({"session": "web:main"}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    // The window moves: the older exchange is summarised, the last one stays; all stay stored.
    let deadline = std::time::Instant::now() + T;
    let w = loop {
        let v = ui.search(json!({"q": "web:main"})).await;
        let row = v["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["key"] == "web:main")
            .cloned()
            .unwrap();
        if row["window"]["compactions"] == 1 {
            break row["window"].clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never compacted: {row}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(w["summarised"], 2, "{w}");
    assert_eq!(w["from_seq"], 2, "{w}");
    assert_eq!(
        w["in_window"].as_u64().unwrap(),
        w["stored"].as_u64().unwrap() - 2,
        "{w}"
    );
    assert!(w["summary_tokens"].as_u64().unwrap() > 0, "{w}");
    assert!(
        llm.requests()
            .iter()
            .any(|r| r.to_string().contains("You summarise conversations")),
        "no summary was asked"
    );
    d.term();
}

/// A UI session outlives a gateway restart; the store holds the hash of its cookie, never the
/// cookie; `weft dashboard --revoke-all` ends it, and it stays ended after another restart.
#[tokio::test]
async fn ui_sessions_survive_a_restart_by_hash_and_revoke_all_ends_them() {
    let llm = FakeLlm::start().await;
    let (dir, cfg, port) = setup(&llm, json!({}));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let ui = Ui::login(dir.path(), &cfg, &d.api.base, &[]).await;
    d.term();

    // On disk: the hash is there, the cookie's bytes are not (in any file of the state).
    let hash = {
        let mut c = ring::digest::Context::new(&ring::digest::SHA256);
        c.update(b"weft-ui-session\0");
        c.update(ui.cookie.as_bytes());
        c.finish()
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let files = files_under(dir.path());
    let has = |needle: &[u8]| {
        files.iter().any(|f| {
            std::fs::read(f)
                .map(|b| b.windows(needle.len()).any(|w| w == needle))
                .unwrap_or(false)
        })
    };
    assert!(
        has(hash.as_bytes()),
        "the session's hash is not in the store"
    );
    assert!(!has(ui.cookie.as_bytes()), "the cookie's value is on disk");
    assert!(!has(ui.csrf.as_bytes()), "the CSRF token is on disk");

    // After the restart: the same cookie, the same CSRF token, state changes work.
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let (s, me) = ui_get(&ui.base, "/ui/api/me", &ui.cookie).await;
    assert_eq!(s, 200, "{me}");
    assert_eq!(me["role"], "operator");
    assert_eq!(me["csrf"], ui.csrf.as_str());
    let (s, v) = ui.post("/ui/api/admin/sessions/search", json!({})).await;
    assert_eq!(s, 200, "{v}");
    // A forged cookie is still nobody.
    let (s, _) = ui_get(&ui.base, "/ui/api/me", &"cd".repeat(32)).await;
    assert_eq!(s, 401);

    let (ok, out, err) = run(dir.path(), &cfg, &["dashboard", "--revoke-all"]).await;
    assert!(ok, "{out}{err}");
    assert!(out.contains("ended 1"), "{out}");
    let (s, _) = ui_get(&ui.base, "/ui/api/me", &ui.cookie).await;
    assert_eq!(s, 401);
    d.term();
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let (s, _) = ui_get(&ui.base, "/ui/api/me", &ui.cookie).await;
    assert_eq!(s, 401, "a revoked session came back after a restart");
    d.term();
}

/// Whether Chromium is installed; in CI its absence fails loudly.
fn have_chromium() -> bool {
    let ok = Path::new("/usr/bin/chromium").exists();
    if !ok {
        assert!(
            std::env::var("CI").is_err(),
            "no Chromium installed: .ci/run installs it (apt-get install chromium)"
        );
        eprintln!("skipped: no Chromium installed (apt install chromium)");
    }
    ok
}

/// The canvas: each change is pushed on the UI's event stream (the page reloads its frame
/// without reloading itself), and `snapshot` returns a PNG of what is shown, rendered by the
/// browser tool's Chromium.
#[tokio::test]
async fn canvas_changes_are_pushed_and_a_snapshot_is_a_png() {
    if !have_chromium() {
        return;
    }
    let llm = FakeLlm::start().await;
    let (dir, cfg, port) = setup(&llm, json!({"tools": {"rate_limit": {"per_minute": 0}}}));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let ui = Ui::login(dir.path(), &cfg, &d.api.base, &[]).await;
    let mut events = plain()
        .get(format!("{}/ui/api/events", ui.base))
        .header("cookie", format!("weft_ui={}", ui.cookie))
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 200);

    let call = |id: &str, name: &str, args: Value| {
        Reply::ToolCalls(vec![(id.into(), name.into(), args.to_string())])
    };
    llm.push(call("s1", "tool_search", json!({"query": "canvas"})));
    llm.push(call(
        "c1",
        "canvas",
        json!({"action": "present", "title": "Chart",
               "html": "<body style='background:#0a0'><h1>Forty-two</h1><script>document.querySelector('h1').textContent += ' (drawn)';</script></body>"}),
    ));
    llm.push(call("c2", "canvas", json!({"action": "snapshot"})));
    llm.push(Reply::Text("the snapshot is taken".into()));
    let (s, v) = ui
        .post(
            "/ui/api/chat",
            json!({"chat": "main", "content": "draw it"}),
        )
        .await;
    assert_eq!(s, 200, "{v}");

    // The push: a `canvas` event naming the session, its chat and the new version.
    let deadline = tokio::time::Instant::now() + T;
    let mut buf = String::new();
    let pushed = loop {
        // Whole lines only (the last one may still be arriving).
        let whole = buf.rsplit_once('\n').map_or("", |(w, _)| w);
        if let Some(line) = whole
            .lines()
            .find(|l| l.starts_with("data:") && l.contains("\"kind\":\"canvas\""))
        {
            break serde_json::from_str::<Value>(line.trim_start_matches("data:").trim()).unwrap();
        }
        let chunk = tokio::time::timeout_at(deadline, events.chunk())
            .await
            .expect("no canvas event was pushed")
            .unwrap()
            .unwrap();
        buf.push_str(&String::from_utf8_lossy(&chunk));
    };
    assert_eq!(pushed["session"], "web:main", "{pushed}");
    assert_eq!(pushed["channel"], "web");
    assert_eq!(pushed["chat"], "main");
    assert_eq!(pushed["version"], 1);
    assert_eq!(pushed["visible"], true);
    assert_eq!(pushed["title"], "Chart");

    // The snapshot: a PNG file in the workspace, named in the tool result.
    ui.wait_transcript("web:main", "the snapshot is taken")
        .await;
    let reqs = llm.requests();
    let result = reqs
        .iter()
        .flat_map(crate::common::tool_results)
        .find(|(id, _)| id == "c2")
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no snapshot result: {reqs:?}"));
    let rel = result["path"]
        .as_str()
        .unwrap_or_else(|| panic!("{result}"));
    assert_eq!(result["image"], rel);
    let png = std::fs::read(dir.path().join("ws").join(rel)).unwrap();
    assert!(png.len() > 100, "{} bytes", png.len());
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(&png[12..16], b"IHDR");
    let w = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert_eq!((w, h), (1024, 768));
    assert_eq!(result["bytes"], png.len());
    d.term();
}
