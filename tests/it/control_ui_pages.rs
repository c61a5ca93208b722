//! The control UI as a person sees it, in a real headless Chromium: the overview's live channel
//! state (a wrong Telegram token, then fixed and reloaded), provider health, spend against the
//! budgets and what waits; the usage chart's values against `weft usage --json`; schedules in
//! words and Run now's feedback; Markdown and tool cards in the chat (never HTML from the
//! model); the canvas panel only when there is a canvas; the page without a login; no page
//! scrolls sideways at 1280 or 390 px. With `WEFT_UI_SCREENSHOTS=DIR` it saves a PNG of every
//! page at both widths there (docs/img holds the current ones).

use std::time::Duration;

use clawft_channel_telegram::fake::FakeTelegram;
use serde_json::{json, Value};

use crate::control_ui::{driver, log_in, plain, run, setup, Browser};
use crate::fake_llm::{FakeLlm, Reply};
use crate::process::Daemon;

const T: Duration = Duration::from_secs(30);

/// The pages, by their address.
const PAGES: &[&str] = &[
    "overview",
    "chat",
    "approvals",
    "usage",
    "sessions",
    "ops",
    "logs",
    "agents",
    "config",
];

async fn admin(d: &Daemon, name: &str, body: Value) -> Value {
    let r = d
        .api
        .http
        .post(format!("{}/v1/admin/{name}", d.api.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    assert_eq!(s, 200, "{name}: {v}");
    v
}

/// axe-core (`npm ci --prefix tests/ui`), or `None` outside CI when it is not installed.
fn axe_source() -> Option<String> {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/ui/node_modules/axe-core/axe.min.js"
    );
    match std::fs::read_to_string(p) {
        Ok(s) => Some(s),
        Err(e) => {
            assert!(
                std::env::var("CI").is_err(),
                "axe-core is needed for the control UI tests (npm ci --prefix tests/ui): {p}: {e}"
            );
            eprintln!("axe-core checks skipped: {p}: {e}");
            None
        }
    }
}

/// The serious and critical accessibility violations axe-core finds in the page as shown.
async fn axe_violations(b: &Browser, axe: &str) -> Value {
    if b.js("return typeof axe === 'undefined'", json!([])).await == true {
        b.js(axe, json!([])).await;
    }
    let v = b.js_async(
        "const done = arguments[arguments.length - 1];
         axe.run(document)
           .then((r) => done({passes: r.passes.length, bad: r.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical')
             .map((v) => ({id: v.id, impact: v.impact, help: v.help,
                           nodes: v.nodes.slice(0, 5).map((n) => n.target.join(' ') + ': ' + n.failureSummary)}))}))
           .catch((e) => done('axe failed: ' + e));",
    )
    .await;
    // It ran its rules (a page where no rule applied would pass vacuously).
    assert!(v["passes"].as_u64().unwrap_or(0) >= 10, "{v}");
    v["bad"].clone()
}

/// Open `page` and wait until it has loaded (its loader ran, no error shown).
async fn open(b: &Browser, port: u16, page: &str) {
    b.goto(&format!("http://127.0.0.1:{port}/ui/#{page}")).await;
    b.until(
        &format!(
            "const s = document.getElementById('page-{page}'); return s && !s.hidden && document.getElementById('notice').hidden && s.textContent.length > 40"
        ),
        &format!("page {page} shown"),
    )
    .await;
}

#[tokio::test]
async fn overview_usage_chart_words_and_fit_in_a_browser() {
    let Some(drv) = driver() else { return };
    let llm = FakeLlm::start().await;
    let tg = FakeTelegram::start().await;
    let (dir, cfg, port) = setup(
        &llm,
        json!({
            "channels": {"telegram": {"token": "123456:wrong-token", "api_url": tg.api_url(),
                                      "allow_from": [111], "stream_edits": false}},
            "prices": {"fake-model": {"input": 50.0, "output": 100.0}},
            "budgets": {"daily_usd": 5.0, "monthly_usd": 100.0},
            "tools": {"exec": {"mode": "ask", "approval_timeout_secs": 600,
                               "approver_ids": ["telegram:111"]}},
        }),
    );
    // The provider key in a file a tool reads: the live tool card shows it scrubbed.
    std::fs::write(
        dir.path().join("ws/notes.txt"),
        format!("milk, eggs\nkey {}", crate::common::PROVIDER_KEY),
    )
    .unwrap();
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let b = Browser::start(drv).await;
    b.resize(1280, 900).await;
    log_in(&b, dir.path(), &cfg).await;

    // The landing page is the overview: every channel with its live state, the web chat too,
    // and the Telegram bot whose token the Bot API refuses says so.
    let here = b.js("return location.hash", json!([])).await;
    assert!(here == "" || here == "#overview", "{here}");
    let tg_state = b
        .until(
            "const l = document.querySelector('#ov-channels li[data-channel^=\"telegram\"]'); return l && l.textContent.includes('auth failed') && l.textContent",
            "the overview shows the refused Telegram token",
        )
        .await;
    assert!(
        tg_state.as_str().unwrap().contains("Unauthorized"),
        "{tg_state}"
    );
    for ch in ["web", "http"] {
        b.until(
            &format!("return document.querySelector('#ov-channels li[data-channel=\"{ch}\"]')"),
            &format!("channel {ch} listed"),
        )
        .await;
    }
    let verdict = b
        .until(
            "const v = document.getElementById('ov-verdict'); return v.classList.contains('bad') && v.textContent",
            "the verdict names the failing channel",
        )
        .await;
    assert!(verdict.as_str().unwrap().contains("telegram"), "{verdict}");

    // The token fixed in the file and the configuration reloaded from the Config page: the
    // overview shows the bot connected.
    let mut file: Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    file["channels"]["telegram"]["token"] = json!(FakeTelegram::TOKEN);
    std::fs::write(&cfg, serde_json::to_string_pretty(&file).unwrap()).unwrap();
    open(&b, port, "config").await;
    b.click("#config-reload").await;
    b.until(
        "return document.getElementById('config-report').textContent.includes('Reloaded')",
        "reloaded",
    )
    .await;
    open(&b, port, "overview").await;
    b.until(
        "const l = document.querySelector('#ov-channels li[data-channel^=\"telegram\"]'); return l && l.textContent.includes('connected as @')",
        "the overview shows the bot connected after the reload",
    )
    .await;

    // Traffic from three users: Telegram, the HTTP API and the web chat (Markdown and a tool
    // call in its reply).
    // The Telegram user has a name: the transcript and the session list show it, the id on
    // hover.
    llm.push(Reply::Text("hello from telegram".into()));
    tg.push_update(json!({"message": {
        "message_id": 900, "date": 1_700_000_000,
        "chat": {"id": 111, "type": "private", "first_name": "Ada"},
        "from": {"id": 111, "is_bot": false, "first_name": "Ada", "last_name": "Lovelace\u{202e}", "username": "ada"},
        "text": "hi"}}));
    assert!(
        crate::common::wait_until(T, || !tg.sent().is_empty()).await,
        "no Telegram reply"
    );
    llm.push(Reply::Text("hello over http".into()));
    let (s, v) = d.api.chat("api-user", "hi").await;
    assert_eq!(s, 200, "{v}");

    open(&b, port, "chat").await;
    b.until("return document.body.dataset.live === 'yes'", "events")
        .await;
    // No canvas in this session: no canvas panel.
    assert_eq!(
        b.js(
            "return document.getElementById('canvas-panel').hidden",
            json!([])
        )
        .await,
        true
    );
    llm.push(Reply::ToolCalls(vec![(
        "r1".into(),
        "read_file".into(),
        json!({"path": "notes.txt"}).to_string(),
    )]));
    llm.push(Reply::Text(
        "Your **list**: `milk`\n\n- eggs\n- bread\n\n```\nuname -a\n```\n<img src=x onerror=\"document.title='owned'\">".into(),
    ));
    b.type_in("#chat-input", "what is on my list?").await;
    b.click("#chat-form button[type=submit]").await;
    let shown = b
        .until(
            "const l = [...document.querySelectorAll('#chat-log li.agent:not(.streaming)')].pop(); return l && l.querySelector('strong') && ({strong: l.querySelector('strong').textContent, code: l.querySelector('code').textContent, items: l.querySelectorAll('ul li').length, pre: l.querySelector('pre').textContent, img: !!l.querySelector('img'), text: l.textContent})",
            "the reply rendered as Markdown",
        )
        .await;
    assert_eq!(shown["strong"], "list", "{shown}");
    assert_eq!(shown["code"], "milk", "{shown}");
    assert_eq!(shown["items"], 2, "{shown}");
    assert_eq!(shown["pre"], "uname -a", "{shown}");
    assert_eq!(shown["img"], false, "HTML from the model became an element");
    let text = shown["text"].as_str().unwrap();
    assert!(!text.contains("**") && !text.contains("```"), "{text}");
    assert!(
        text.contains("<img src=x"),
        "the model's HTML shows as text: {text}"
    );
    assert_ne!(b.js("return document.title", json!([])).await, "owned");
    let card = b
        .until(
            "const c = document.querySelector('#chat-log details.tool summary'); return c && c.textContent",
            "the tool call as a card",
        )
        .await;
    assert_eq!(card, "read_file — done");
    // Live, from the stream (the chat log, not the transcript): the call's arguments and its
    // result, with the provider key the file holds scrubbed as in the transcript.
    let live = b
        .until(
            "const c = document.querySelector('#chat-log details.tool'); const r = c && c.querySelector('[data-part=result] pre'); return r && {args: c.querySelector('[data-part=arguments] pre').textContent, result: r.textContent, text: c.textContent}",
            "the tool card's arguments and result",
        )
        .await;
    assert!(
        live["args"]
            .as_str()
            .unwrap()
            .contains("\"path\": \"notes.txt\""),
        "{live}"
    );
    let result = live["result"].as_str().unwrap();
    assert!(result.contains("milk, eggs"), "{live}");
    assert!(
        !live["text"]
            .as_str()
            .unwrap()
            .contains(crate::common::PROVIDER_KEY),
        "a secret in the live card: {live}"
    );
    let shots = std::env::var("WEFT_UI_SCREENSHOTS").ok();
    if let Some(dir) = &shots {
        b.js(
            "const c = document.querySelector('#chat-log details.tool'); c.open = true; c.scrollIntoView()",
            json!([]),
        )
        .await;
        std::fs::write(format!("{dir}/ui-chat-tool-1280.png"), b.screenshot().await).unwrap();
    }
    // An approval asked in the web chat: the command, when it expires and who may answer;
    // answered from its buttons.
    llm.push(Reply::ToolCalls(vec![(
        "w1".into(),
        "exec_shell".into(),
        json!({"command": "touch from-web"}).to_string(),
    )]));
    llm.push(Reply::Text("not run".into()));
    b.type_in("#chat-input", "run it").await;
    b.click("#chat-form button[type=submit]").await;
    let ask = b
        .until(
            "const l = document.querySelector('#chat-log li[data-who=\"approval\"]'); return l && l.textContent",
            "the approval in the chat",
        )
        .await;
    let ask = ask.as_str().unwrap();
    assert!(
        ask.contains("touch from-web")
            && ask.contains("expires unanswered at")
            && ask.contains("/approve "),
        "{ask}"
    );
    b.click("#chat-log li[data-who=\"approval\"] button[data-decision=deny]")
        .await;
    b.until(
        "return [...document.querySelectorAll('#chat-log li.agent')].some(l => l.textContent === 'not run')",
        "the reply after the denial",
    )
    .await;
    assert!(!dir.path().join("ws/from-web").exists());
    open(&b, port, "sessions").await;
    b.click("#sessions-rows tr[data-key=\"web:main\"] a").await;
    let t = b
        .until(
            "const c = document.querySelector('#transcript details.tool'); return c && c.textContent",
            "the transcript's tool card",
        )
        .await;
    let t = t.as_str().unwrap();
    assert!(
        t.contains("read_file") && t.contains("notes.txt") && t.contains("milk, eggs"),
        "{t}"
    );
    // The Telegram user by name, the id on hover; found by the name too.
    b.type_in("#sessions-q", "lovelace").await;
    b.click("#sessions-form button[type=submit]").await;
    let chip = b
        .until(
            "const r = document.querySelectorAll('#sessions-rows tr[data-key]'); const c = r.length === 1 && r[0].querySelector('.chip[data-user=\"telegram:111\"]'); return c && [r[0].dataset.key, c.textContent, c.title]",
            "the session found by its user's name",
        )
        .await;
    assert_eq!(
        chip,
        json!([
            "telegram:111",
            "Ada Lovelace",
            "Ada Lovelace (telegram:111)"
        ])
    );
    b.click("#sessions-rows tr[data-key=\"telegram:111\"] a")
        .await;
    let said = b
        .until(
            "const t = document.getElementById('transcript-title'); const l = document.querySelector('#transcript li.user'); return t && t.textContent.startsWith('telegram:111:') && l && [l.dataset.who, l.title, l.textContent]",
            "the user's message by name",
        )
        .await;
    assert_eq!(
        said,
        json!(["Ada Lovelace", "Ada Lovelace (telegram:111)", "hi"])
    );

    // Something waits: a command asked on the HTTP API, its expiry in words.
    llm.push(Reply::ToolCalls(vec![(
        "e1".into(),
        "exec_shell".into(),
        json!({"command": "echo waiting"}).to_string(),
    )]));
    llm.push(Reply::Text("denied then".into()));
    let api = d.api.clone();
    let asker = tokio::spawn(async move { api.chat("asker", "run it").await });
    open(&b, port, "overview").await;
    let waiting = b
        .until(
            "const t = document.getElementById('ov-waiting').textContent; return t.includes('echo waiting') && t",
            "the approval waiting on the overview",
        )
        .await;
    assert!(
        waiting.as_str().unwrap().contains("expires in 10 min")
            || waiting.as_str().unwrap().contains("expires in 9 min"),
        "{waiting}"
    );
    // Who may answer it, per row (tools.exec.approvers "chat" by default, and the listed id).
    open(&b, port, "approvals").await;
    let who = b
        .until(
            "const t = document.querySelector('#approvals-rows tr td[data-col=who]'); return t && t.textContent.includes('asker') && t.textContent",
            "who may answer",
        )
        .await;
    assert_eq!(
        who,
        "The chat: anyone in http:asker, or an operator, or telegram:111 (from any chat).Anyone in the chat may deny."
    );
    if let Some(dir) = &shots {
        std::fs::write(
            format!("{dir}/ui-approvals-pending-1280.png"),
            b.screenshot().await,
        )
        .unwrap();
    }
    open(&b, port, "overview").await;
    // Providers answering, spend against the budget.
    let prov = b
        .until(
            "const l = document.querySelector('#ov-providers li[data-provider=\"openai\"]'); return l && l.textContent",
            "provider health",
        )
        .await;
    assert!(prov.as_str().unwrap().contains("answering"), "{prov}");
    let spend = b
        .js(
            "return document.getElementById('ov-spend').textContent",
            json!([]),
        )
        .await;
    let spend = spend.as_str().unwrap();
    assert!(
        spend.contains("of $5.00 budget") && spend.contains("of $100.00 budget"),
        "{spend}"
    );
    let (ok, out, err) = run(dir.path(), &cfg, &["usage", "--days", "1", "--json"]).await;
    assert!(ok, "{err}");
    let cli: Value = serde_json::from_str(&out).unwrap();
    let today = b
        .js(
            "return Number(document.getElementById('ov-spend').dataset.today)",
            json!([]),
        )
        .await;
    assert!(
        (today.as_f64().unwrap() - cli["total"]["cost_usd"].as_f64().unwrap()).abs() < 1e-9,
        "{today} vs {cli}"
    );
    let pending = admin(&d, "approvals/list", json!({})).await;
    let id = pending["approvals"][0]["id"].as_str().unwrap().to_string();
    admin(
        &d,
        "approvals/answer",
        json!({"id": id, "decision": "deny"}),
    )
    .await;
    let (s, _) = tokio::time::timeout(T, asker).await.unwrap().unwrap();
    assert_eq!(s, 200);

    // The usage chart, stacked by user: each day's bar and each user's part are the figures
    // of `weft usage --json`.
    open(&b, port, "usage").await;
    for measure in ["cost", "tokens"] {
        b.js(
            &format!(
                "document.getElementById('usage-measure').value = '{measure}'; const s = document.getElementById('usage-stack'); s.value = 'user'; s.dispatchEvent(new Event('change'));"
            ),
            json!([]),
        )
        .await;
        let chart = b
            .until(
                "const s = document.querySelector('#usage-chart svg'); return s && s.getAttribute('aria-label').includes('user') && {days: [...s.querySelectorAll('g[data-day]')].map(g => [g.dataset.day, Number(g.dataset.value)]), parts: [...s.querySelectorAll('rect[data-key]')].map(r => [r.dataset.key, Number(r.dataset.value), r.querySelector('title').textContent])}",
                "the chart drawn",
            )
            .await;
        let value = |r: &Value| -> f64 {
            if measure == "cost" {
                r["cost_usd"].as_f64().unwrap()
            } else {
                (r["input_tokens"].as_u64().unwrap() + r["output_tokens"].as_u64().unwrap()) as f64
            }
        };
        let (ok, out, err) = run(dir.path(), &cfg, &["usage", "--json"]).await;
        assert!(ok, "{err}");
        let by_day: Value = serde_json::from_str(&out).unwrap();
        let days = chart["days"].as_array().unwrap();
        assert_eq!(days.len(), 30, "{chart}");
        for day in days {
            let want = by_day["rows"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["key"] == day[0])
                .map_or(0.0, value);
            assert!(
                (day[1].as_f64().unwrap() - want).abs() < 1e-9,
                "{measure} {day} vs {by_day}"
            );
        }
        let (ok, out, err) = run(dir.path(), &cfg, &["usage", "--by", "user", "--json"]).await;
        assert!(ok, "{err}");
        let by_user: Value = serde_json::from_str(&out).unwrap();
        let users = by_user["rows"].as_array().unwrap();
        assert!(users.len() >= 3, "three users: {by_user}");
        for u in users {
            let shown: f64 = chart["parts"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| p[0] == u["key"])
                .map(|p| p[1].as_f64().unwrap())
                .sum();
            assert!(
                (shown - value(u)).abs() < 1e-9,
                "{measure} user {u} vs {chart}"
            );
        }
        // Values on hover, in words.
        let tip = chart["parts"][0][2].as_str().unwrap();
        assert!(
            tip.contains(if measure == "cost" { "$" } else { "tokens" }),
            "{tip}"
        );
    }
    // The table below: money as money, no float noise, no JSON key as a header.
    let table = b
        .js(
            "return document.getElementById('usage-table').innerText",
            json!([]),
        )
        .await;
    let table = table.as_str().unwrap();
    assert!(
        table.contains("Spend") && !table.contains("cost_usd") && !table.contains("0000000"),
        "{table}"
    );

    // Schedules in words, a job that never ran says so, Run now says what it did.
    admin(
        &d,
        "cron/add",
        json!({"name": "morning", "schedule": {"kind": "cron", "expr": "0 7 * * *", "tz": "Europe/Berlin"},
               "message": "good morning", "deliver": "turn", "target": {"channel": "http", "chat_id": "ops"}}),
    )
    .await;
    open(&b, port, "ops").await;
    let row = b
        .until(
            "const r = document.querySelector('#cron-table tbody tr'); return r && r.textContent.includes('morning') && r.textContent",
            "the job listed",
        )
        .await;
    let row = row.as_str().unwrap();
    assert!(
        row.contains("every day at 07:00 Europe/Berlin")
            && row.contains("never ran")
            && row.contains("in "),
        "{row}"
    );
    assert!(!row.contains('{'), "raw JSON in the job row: {row}");
    b.js(
        "[...document.querySelectorAll('#cron-table tbody button')].find(b => b.textContent === 'History').click()",
        json!([]),
    )
    .await;
    b.until(
        "return document.getElementById('cron-runs').textContent.includes('No runs yet')",
        "an empty history says so",
    )
    .await;
    llm.push(Reply::Text("good morning to you".into()));
    b.js(
        "[...document.querySelectorAll('#cron-table tbody button')].find(b => b.textContent === 'Run now').click()",
        json!([]),
    )
    .await;
    b.until(
        "const n = document.getElementById('notice'); return !n.hidden && n.textContent.includes('Started morning: see History')",
        "Run now says what it did",
    )
    .await;
    // Channels on this page: state, not configuration.
    let chans = b
        .js(
            "return document.getElementById('channels-table').textContent",
            json!([]),
        )
        .await;
    assert!(
        chans.as_str().unwrap().contains("connected as @")
            && !chans.as_str().unwrap().contains("allow_from"),
        "{chans}"
    );

    // Every page fits: no sideways scroll at a laptop's and a phone's width.
    let axe = axe_source();
    for (w, h) in [(1280, 900), (390, 844)] {
        b.resize(w, h).await;
        for page in PAGES {
            open(&b, port, page).await;
            let fit = b
                .js(
                    "return [document.documentElement.scrollWidth, window.innerWidth]",
                    json!([]),
                )
                .await;
            let (sw, iw) = (fit[0].as_u64().unwrap(), fit[1].as_u64().unwrap());
            assert!(
                sw <= iw,
                "page {page} scrolls sideways at {w} px: {sw} > {iw}"
            );
            // Accessible: no serious or critical axe-core violation (at both widths: the
            // phone layout has its own markup rules, such as the cards' labels).
            if let Some(axe) = &axe {
                let v = axe_violations(&b, axe).await;
                assert_eq!(v, json!([]), "page {page} at {w} px");
            }
            if let Some(dir) = &shots {
                b.js("window.scrollTo(0, 0)", json!([])).await;
                let png = b.screenshot().await;
                std::fs::write(format!("{dir}/ui-{page}-{w}.png"), png).unwrap();
            }
        }
    }
    if let Some(dir) = &shots {
        b.resize(1280, 900).await;
        b.color_scheme("dark").await;
        open(&b, port, "overview").await;
        std::fs::write(
            format!("{dir}/ui-overview-dark-1280.png"),
            b.screenshot().await,
        )
        .unwrap();
    }
    drop(b);

    // Without a login: a page that says how to get one, not the chat form; a favicon.
    let anon = Browser::start(drv).await;
    anon.goto(&format!("http://127.0.0.1:{port}/ui/#chat"))
        .await;
    anon.until(
        "return !document.getElementById('page-signed-out').hidden",
        "the signed-out page",
    )
    .await;
    let seen = anon
        .js(
            "return [document.getElementById('chat-form').offsetParent === null, document.body.innerText.includes('weft dashboard'), document.querySelector('link[rel=icon]').href]",
            json!([]),
        )
        .await;
    assert_eq!(seen[0], true, "the chat form shows without a login");
    assert_eq!(seen[1], true, "{seen}");
    if let Some(axe) = &axe {
        let v = axe_violations(&anon, axe).await;
        assert_eq!(v, json!([]), "the signed-out page");
    }
    let icon = plain().get(seen[2].as_str().unwrap()).send().await.unwrap();
    assert_eq!(icon.status(), 200);
    assert_eq!(icon.headers()["content-type"], "image/svg+xml");
    drop(anon);
    d.term();
}

/// The overview's cluster card on one gateway clustered on a real NATS server (one server, the
/// pinned `nats-server` the cluster tests use): this node alive, the partitions it holds and
/// the Telegram connection lease, the same as `weft cluster status --json` reads from NATS.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_shows_the_cluster_as_weft_cluster_status_does() {
    let Some(drv) = driver() else { return };
    let Some(nats) = crate::cluster::Nats::start(1).await else {
        return;
    };
    let llm = FakeLlm::start().await;
    let tg = FakeTelegram::start().await;
    let (dirs, nodes) = crate::cluster::start_nodes_merged(
        1,
        &nats,
        &llm,
        json!({"channels": {"telegram": {"token": FakeTelegram::TOKEN, "api_url": tg.api_url(),
                                         "allow_from": [111]}}}),
    )
    .await;
    let d = nodes[0].as_ref().unwrap();
    let dir = dirs[0].path();
    let port: u16 = d.api.base.rsplit(':').next().unwrap().parse().unwrap();
    // Wait until the node holds every partition and the Telegram connection.
    let deadline = std::time::Instant::now() + T;
    let cli = loop {
        let v = crate::cluster::cluster_status(dir);
        if v["partitions"]["held"] == v["partitions"]["count"]
            && v["connections"].as_array().is_some_and(|c| !c.is_empty())
        {
            break v;
        }
        assert!(std::time::Instant::now() < deadline, "{v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let b = Browser::start(drv).await;
    b.resize(1280, 900).await;
    log_in(&b, dir, &dir.join("config.json")).await;
    open(&b, port, "overview").await;
    let card = b
        .until(
            "const c = document.getElementById('ov-cluster-card'); const n = document.querySelector('#ov-cluster-nodes li[data-node]'); return c && !c.hidden && n && n.textContent.includes('holds') && {text: c.textContent, nodes: [...document.querySelectorAll('#ov-cluster-nodes li')].map(l => [l.dataset.node, l.className, l.textContent]), parts: document.getElementById('ov-cluster-parts').textContent}",
            "the cluster card with its nodes",
        )
        .await;
    let nodes_cli = cli["nodes"].as_array().unwrap();
    let shown = card["nodes"].as_array().unwrap();
    assert_eq!(shown.len(), nodes_cli.len(), "{card} vs {cli}");
    assert_eq!(shown[0][0], "n1", "{card}");
    let line = shown[0][2].as_str().unwrap();
    let held = cli["partitions"]["owners"]["n1"].as_u64().unwrap();
    assert!(
        line.contains("n1 (this node)")
            && line.contains("alive")
            && line.contains(&format!("{held} partitions"))
            && line.contains("holds telegram.default"),
        "{line} vs {cli}"
    );
    assert!(shown[0][1].as_str().unwrap().contains("s-ok"), "{card}");
    let count = cli["partitions"]["count"].as_u64().unwrap();
    assert_eq!(
        card["parts"],
        format!(
            "Partitions: {count} of {count} held; {} connection lease{}.",
            cli["connections"].as_array().unwrap().len(),
            if cli["connections"].as_array().unwrap().len() == 1 {
                ""
            } else {
                "s"
            }
        ),
        "{card}"
    );
    assert!(
        card["text"].as_str().unwrap().contains("Connected to NATS"),
        "{card}"
    );
    if let Ok(dir) = std::env::var("WEFT_UI_SCREENSHOTS") {
        std::fs::write(
            format!("{dir}/ui-overview-cluster-1280.png"),
            b.screenshot().await,
        )
        .unwrap();
    }
    drop(b);
    drop(nodes);
    drop(nats);
}
