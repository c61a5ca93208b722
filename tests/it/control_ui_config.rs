//! The control UI's Config page (the configuration in force with where each value came from,
//! secrets masked, validation of the file on disk, reload with its report) and its Agents page
//! (each agent's model, bindings, tools and skills; memory documents and search), through
//! their JSON routes with real cookie sessions against a real `weft gateway`, then the Config
//! page in a real headless Chromium.

use std::path::Path;

use serde_json::{json, Value};

use crate::control_ui::{driver, exchange, link, log_in, run, setup, ui_post, Browser};
use crate::fake_llm::FakeLlm;
use crate::process::Daemon;

const API_KEY: &str = "sk-test-secret-123456";

/// An operator or read-only session: (cookie, CSRF token).
async fn login(dir: &Path, cfg: &Path, base: &str, extra: &[&str]) -> (String, String) {
    let url = link(dir, cfg, extra).await;
    let (s, cookie, set) = exchange(base, &url, base).await;
    assert_eq!(s, 200, "{set}");
    let cookie = cookie.unwrap();
    let (_, me) = crate::control_ui::ui_get(base, "/ui/api/me", &cookie).await;
    (cookie, me["csrf"].as_str().unwrap().to_string())
}

/// `POST /ui/api/admin/{name}` as the page does it (this origin, the CSRF token).
async fn admin(base: &str, who: &(String, String), name: &str, body: Value) -> (u16, Value) {
    ui_post(
        base,
        &format!("/ui/api/admin/{name}"),
        &who.0,
        Some(base),
        Some(&who.1),
        body,
    )
    .await
}

/// The `config/show` row of `key`: (value, source).
fn row(show: &Value, key: &str) -> (String, String) {
    let r = show["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == key)
        .unwrap_or_else(|| panic!("no row {key}: {show}"));
    (
        r["value"].as_str().unwrap().to_string(),
        r["source"].as_str().unwrap().to_string(),
    )
}

fn edit_config(cfg: &Path, patch: Value) {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(cfg).unwrap()).unwrap();
    crate::common::merge(&mut v, patch);
    std::fs::write(cfg, v.to_string()).unwrap();
}

/// Values from the file, an environment variable and the default, each with its origin; the
/// API key never in the answer; validation names the bad key; a reload applies an edit and
/// reports it; a bad file is refused with nothing applied; a read-only session cannot reload.
#[tokio::test]
async fn config_page_shows_origins_masks_secrets_validates_and_reloads() {
    let llm = FakeLlm::start().await;
    let (dir, cfg, port) = setup(
        &llm,
        json!({"agents": {"defaults": {"max_tool_iterations": 7}}}),
    );
    let d = Daemon::start_with_env(
        dir.path(),
        &cfg,
        port,
        &[("CLAWFT_SESSIONS__MAX_QUEUE", "9")],
    )
    .await;
    let base = d.api.base.clone();
    let op = login(dir.path(), &cfg, &base, &[]).await;
    let ro = login(dir.path(), &cfg, &base, &["--read-only"]).await;
    let file = cfg.display().to_string();

    // A read-only session may read the configuration; the raw answer holds no secret.
    let r = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("{base}/ui/api/admin/config/show"))
        .header("cookie", format!("weft_ui={}", ro.0))
        .header("origin", &base)
        .header("x-csrf-token", &ro.1)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let raw = r.text().await.unwrap();
    assert!(!raw.contains(API_KEY), "the API key is in the page's data");
    let show: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(show["path"], file.as_str());
    let (v, src) = row(&show, "agents.defaults.max_tool_iterations");
    assert_eq!(v, "7");
    assert_eq!(
        src,
        format!("agents.defaults.max_tool_iterations in {file}")
    );
    let (v, src) = row(&show, "sessions.max_queue");
    assert_eq!(
        (v.as_str(), src.as_str()),
        ("9", "environment variable CLAWFT_SESSIONS__MAX_QUEUE")
    );
    let (_, src) = row(&show, "sessions.idle_secs");
    assert_eq!(src, "default");
    let (v, src) = row(&show, "providers.openai.api_key");
    assert_eq!(v, "******** (set)");
    assert!(src.contains(&file), "{src}");
    let (timeout_before, src) = row(&show, "tools.exec.timeout_secs");
    assert_eq!(src, "default");
    assert_ne!(timeout_before, "45");

    // Validate: the file as it is on disk now.
    let (s, v) = admin(&base, &ro, "config/validate", json!({})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["valid"], true, "{v}");

    // An edit on disk: a read-only session may not reload it, nor a post without the CSRF
    // token; nothing is applied.
    edit_config(&cfg, json!({"tools": {"exec": {"timeout_secs": 45}}}));
    let (s, v) = admin(&base, &ro, "config/reload", json!({})).await;
    assert_eq!(s, 403, "{v}");
    let (s, _) = ui_post(
        &base,
        "/ui/api/admin/config/reload",
        &op.0,
        Some(&base),
        None,
        json!({}),
    )
    .await;
    assert_eq!(s, 403);
    let (_, show) = admin(&base, &op, "config/show", json!({})).await;
    assert_eq!(row(&show, "tools.exec.timeout_secs").0, timeout_before);

    // The operator reloads: the change is applied and reported, and shown with its origin.
    let (s, v) = admin(&base, &op, "config/reload", json!({})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["status"], "reloaded", "{v}");
    assert!(
        v["changes"].to_string().contains("tools: policy, limits"),
        "{v}"
    );
    let (_, show) = admin(&base, &op, "config/show", json!({})).await;
    assert_eq!(
        row(&show, "tools.exec.timeout_secs"),
        (
            "45".to_string(),
            format!("tools.exec.timeout_secs in {file}")
        )
    );

    // A bad file: validation names the key; a reload is refused and nothing is applied.
    edit_config(
        &cfg,
        json!({"tools": {"exec": {"timeout_secs": 50}}, "agents": {"defaults": {"max_tool_iteratons": 3}}}),
    );
    let (s, v) = admin(&base, &ro, "config/validate", json!({})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["valid"], false, "{v}");
    assert_eq!(v["key"], "agents.defaults.max_tool_iteratons", "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("max_tool_iteratons"),
        "{v}"
    );
    let (s, v) = admin(&base, &op, "config/reload", json!({})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["status"], "rejected", "{v}");
    assert_eq!(v["key"], "agents.defaults.max_tool_iteratons", "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("max_tool_iteratons"),
        "{v}"
    );
    let (_, show) = admin(&base, &op, "config/show", json!({})).await;
    assert_eq!(row(&show, "tools.exec.timeout_secs").0, "45");
    d.term();
}

/// Each agent with its model, bindings, offered and deferred tools and skills; its memory
/// documents; a search finds the document `weft memory search` finds. Read-only may read it
/// all, and nothing secret is in it.
#[tokio::test]
async fn agents_page_lists_tools_skills_and_memory_search_finds_the_document() {
    let llm = FakeLlm::start().await;
    let (dir, cfg, port) = setup(&llm, json!({}));
    let ws = dir.path().join("ws");
    std::fs::write(
        ws.join("MEMORY.md"),
        "# Servers\n\nThe staging server is called heliotrope and runs on port 8443.\n",
    )
    .unwrap();
    std::fs::create_dir_all(ws.join("memory")).unwrap();
    std::fs::write(
        ws.join("memory/2026-11-27.md"),
        "Lunch with Ada: talked about gardening.\n",
    )
    .unwrap();
    let skill = ws.join("skills/weather");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: weather\ndescription: Look up the weather\nallowed_tools: [\"web_fetch\"]\n---\nUse web_fetch.\n",
    )
    .unwrap();
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let base = d.api.base.clone();
    let ro = login(dir.path(), &cfg, &base, &["--read-only"]).await;

    let (s, v) = admin(&base, &ro, "agents/list", json!({})).await;
    assert_eq!(s, 200, "{v}");
    assert!(!v.to_string().contains(API_KEY));
    let main = &v["agents"][0];
    assert_eq!(main["name"], "main", "{v}");
    assert_eq!(main["model"], "fake-model", "{v}");
    let names = |k: &str| -> Vec<String> {
        main["tools"][k]
            .as_array()
            .unwrap_or_else(|| panic!("no tools.{k}: {main}"))
            .iter()
            .map(|n| n.as_str().unwrap().to_string())
            .collect()
    };
    let (offered, deferred) = (names("offered"), names("deferred"));
    assert!(offered.contains(&"tool_search".to_string()), "{offered:?}");
    assert!(offered.contains(&"use_skill".to_string()), "{offered:?}");
    assert!(deferred.contains(&"canvas".to_string()), "{deferred:?}");
    assert!(
        offered.iter().all(|t| !deferred.contains(t)),
        "{offered:?} {deferred:?}"
    );
    assert_eq!(main["skills"][0]["name"], "weather", "{main}");
    assert_eq!(main["skills"][0]["allowed_tools"], json!(["web_fetch"]));

    let (s, v) = admin(&base, &ro, "memory/list", json!({})).await;
    assert_eq!(s, 200, "{v}");
    let docs: Vec<&str> = v["documents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap())
        .collect();
    assert!(docs.contains(&"MEMORY.md"), "{v}");
    assert!(docs.contains(&"memory/2026-11-27.md"), "{v}");

    let (s, v) = admin(
        &base,
        &ro,
        "memory/search",
        json!({"query": "heliotrope staging"}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["results"][0]["path"], "MEMORY.md", "{v}");
    assert!(
        v["results"][0]["snippet"]
            .as_str()
            .unwrap()
            .contains("heliotrope"),
        "{v}"
    );
    let (ok, out, err) = run(
        dir.path(),
        &cfg,
        &["memory", "search", "heliotrope", "staging", "--json"],
    )
    .await;
    assert!(ok, "{err}");
    let cli: Value = serde_json::from_str(&out).unwrap();
    let paths = |v: &Value| -> Vec<String> {
        v["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["path"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(paths(&v), paths(&cli));
    let (s, v) = admin(&base, &ro, "memory/search", json!({"query": " "})).await;
    assert_eq!(s, 400, "{v}");
    d.term();
}

/// In a real browser: the Config page shows a value with where it came from, and validation;
/// the Agents page shows the agent and finds a memory document.
#[tokio::test]
async fn in_a_browser_config_shows_origins_and_agents_page_searches_memory() {
    let Some(drv) = driver() else { return };
    let llm = FakeLlm::start().await;
    let (dir, cfg, port) = setup(
        &llm,
        json!({"agents": {"defaults": {"max_tool_iterations": 11}},
               "heartbeat": {"enabled": true, "every": "2h", "target": {"channel": "http", "chat_id": "ops"}}}),
    );
    std::fs::write(
        dir.path().join("ws/MEMORY.md"),
        "The staging server is called heliotrope.\n",
    )
    .unwrap();
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let b = Browser::start(drv).await;
    log_in(&b, dir.path(), &cfg).await;
    b.goto(&format!("http://127.0.0.1:{port}/ui/#config")).await;
    let shown = b
        .until(
            "const r = document.querySelector('#config-table tr[data-key=\"agents.defaults.max_tool_iterations\"]'); return r && r.textContent",
            "the value listed",
        )
        .await;
    let shown = shown.as_str().unwrap();
    assert!(shown.contains("11"), "{shown}");
    assert!(
        shown.contains(&format!(
            "agents.defaults.max_tool_iterations in {}",
            cfg.display()
        )),
        "{shown}"
    );
    let page = b.js("return document.body.innerText", json!([])).await;
    assert!(!page.as_str().unwrap().contains(API_KEY));
    b.click("#config-validate").await;
    b.until(
        "return document.getElementById('config-report').textContent.includes('valid')",
        "the validation report",
    )
    .await;

    // The Agents page: the agent with its model, and a memory search finding the document.
    b.goto(&format!("http://127.0.0.1:{port}/ui/#agents")).await;
    b.until(
        "const a = document.querySelector('#agents-list section[data-agent=\"main\"]'); return a && a.textContent.includes('fake-model') && a.textContent.includes('tool_search')",
        "the agent listed",
    )
    .await;
    b.until(
        "return [...document.querySelectorAll('#memory-docs tbody td')].some(t => t.textContent === 'MEMORY.md')",
        "the memory documents listed",
    )
    .await;
    b.type_in("#memory-query", "heliotrope").await;
    b.click("#memory-form button[type=submit]").await;
    b.until(
        "const l = document.querySelector('#memory-results li[data-path=\"MEMORY.md\"]'); return l && l.textContent.includes('heliotrope')",
        "the search result",
    )
    .await;

    // Automations: the heartbeat's schedule, and the allowlists (none without a chat platform).
    b.goto(&format!("http://127.0.0.1:{port}/ui/#ops")).await;
    b.until(
        "const t = document.getElementById('heartbeat').textContent; return t.startsWith('Heartbeat: every 2 hours, to ') && t.includes('ops')",
        "the heartbeat shown",
    )
    .await;
    b.until(
        "return document.getElementById('allow-list').textContent.includes('no chat platform configured')",
        "the allowlists shown",
    )
    .await;
    drop(b);
    d.term();
}
