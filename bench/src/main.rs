//! `weft-bench`: the end-to-end load tool of issue 8. Starts a zero-latency fake
//! OpenAI-compatible LLM, starts `weft gateway` as a separate process against it, drives the
//! HTTP API and reads the daemon's CPU and memory from `/proc`. Prints one JSON line per figure
//! with its budget, then a table. See `docs/performance.md`.

mod browser;
mod cluster;
mod fake_llm;
mod gateway;
mod http;
mod platforms;
mod slow_disk;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::fake_llm::{FakeLlm, FINAL_TEXT};
use crate::gateway::{Gateway, Home};
use crate::http::Client;

const MIB: f64 = 1024.0 * 1024.0;
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const TURN_TIMEOUT: Duration = Duration::from_secs(120);
/// Turns per session before a worker moves to a new session (keeps histories short and alike).
const TURNS_PER_SESSION: u64 = 10;

const SCENARIOS: &[(&str, &str)] = &[
    ("binary", "size of the --weft file, and whether it is stripped"),
    ("start", "spawn -> first 200 from /healthz, HTTP API only (min/median of N)"),
    ("idle", "VmRSS 1 s after ready, HTTP API only"),
    ("channels", "start and idle RSS with Telegram, Discord and Slack on local fakes (needs --features platform-fakes)"),
    ("turn", "sequential turns: CPU per turn, tool-call leg p50/p99, first LLM request size, store bytes per turn"),
    ("exec", "sequential turns whose tool call is exec_shell `true`: the exec tool leg p50/p99, daemon CPU per turn"),
    ("throughput", "turns/s with 100 sessions in flight"),
    ("burst", "1,000 sessions sent at once: errors, p50/p99; RSS after the settle time"),
    ("idle_sessions", "RSS growth per 1,000 idle sessions"),
    ("slow_disk", "every fsync +50 ms (LD_PRELOAD shim, built with cc), 20 ms model: p99 of 50 chats doing turns, then with 16 chats flooding /new and /status"),
    ("ui", "the control UI: bytes of the first load (the page and every asset it names), and the largest page's total compressed"),
    ("browser", "the browser tool with the system's Chromium: chat turn to the first snapshot cold and warm, the browser's PSS idle, the gateway's RSS with the browser idle and closed"),
    ("cluster", "cluster mode on a real three-server NATS cluster, Telegram on its fake, a 100 ms model: one node's cost, turns/s and p99 with 1 and 3 nodes, failover when the Telegram lease holder is killed (needs --features platform-fakes, a weft built with the cluster feature, nats-server)"),
    ("conversation", "one session, 200 messages of 1 KB: prompt bytes and estimated tokens per turn, with an 8k context window, with a 128k window under the default 24k prompt budget, and without a bound (informational)"),
];

struct Args {
    weft: PathBuf,
    quick: bool,
    scenarios: Vec<String>,
    settle: Duration,
    no_fail: bool,
}

const USAGE: &str = "weft-bench: end-to-end figures of `weft gateway` against a fake LLM

usage: weft-bench [--weft PATH] [--quick] [--scenario NAME]... [--settle-secs N] [--no-fail]

  --weft PATH       the weft binary (default: $CARGO_TARGET_DIR/release/weft or target/release/weft)
  --quick           small N (CI): 3 starts, 50 turns, 200 turns at 100 in flight, 100 at once
  --scenario NAME   run only these (repeat or comma-separate); --list shows them
  --settle-secs N   wait after the burst before reading RSS (default 30; 1 with --quick)
  --no-fail         exit 0 even when a figure is over budget (CI prints, never fails on a figure)

Output: one JSON line per figure {metric, value, unit, budget, cmp, ok, n, note}, then a table.
Exit status: 0, or 2 when a figure is over budget (without --no-fail), 1 on an error.";

fn parse_args() -> Result<Option<Args>, String> {
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from);
    let mut a = Args {
        weft: target.join("release").join("weft"),
        quick: false,
        scenarios: Vec::new(),
        settle: Duration::from_secs(30),
        no_fail: false,
    };
    let mut settle = None;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--weft" => a.weft = it.next().ok_or("--weft needs a path")?.into(),
            "--quick" => a.quick = true,
            "--no-fail" => a.no_fail = true,
            "--scenario" => {
                let v = it.next().ok_or("--scenario needs a name")?;
                for s in v.split(',').filter(|s| !s.is_empty()) {
                    if !SCENARIOS.iter().any(|(n, _)| *n == s) {
                        return Err(format!("unknown scenario `{s}`; --list shows them"));
                    }
                    a.scenarios.push(s.to_string());
                }
            }
            "--settle-secs" => {
                let v = it.next().ok_or("--settle-secs needs a number")?;
                settle = Some(
                    v.parse::<f64>()
                        .map_err(|e| format!("--settle-secs `{v}`: {e}"))?,
                );
            }
            "--list" => {
                for (n, d) in SCENARIOS {
                    println!("{n:14} {d}");
                }
                return Ok(None);
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            other => return Err(format!("unknown argument `{other}`\n\n{USAGE}")),
        }
    }
    a.settle = Duration::from_secs_f64(settle.unwrap_or(if a.quick { 1.0 } else { 30.0 }));
    if a.scenarios.is_empty() {
        a.scenarios = SCENARIOS.iter().map(|(n, _)| (*n).to_string()).collect();
    }
    Ok(Some(a))
}

/// One printed figure.
struct Metric {
    name: String,
    value: Option<f64>,
    unit: &'static str,
    budget: Option<f64>,
    /// `<=` (a ceiling) or `>=` (a floor).
    cmp: &'static str,
    n: Option<u64>,
    note: String,
}

impl Metric {
    fn ok(&self) -> Option<bool> {
        let (v, b) = (self.value?, self.budget?);
        Some(if self.cmp == ">=" { v >= b } else { v <= b })
    }
}

#[derive(Default)]
struct Report {
    metrics: Vec<Metric>,
    errors: Vec<String>,
}

impl Report {
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        name: &str,
        value: Option<f64>,
        unit: &'static str,
        budget: Option<f64>,
        cmp: &'static str,
        n: Option<u64>,
        note: impl Into<String>,
    ) {
        let m = Metric {
            name: name.into(),
            value,
            unit,
            budget,
            cmp,
            n,
            note: note.into(),
        };
        let round = |v: f64| (v * 1000.0).round() / 1000.0;
        let line = json!({
            "metric": m.name,
            "value": m.value.map(round),
            "unit": m.unit,
            "budget": m.budget,
            "cmp": m.budget.map(|_| m.cmp),
            "ok": m.ok(),
            "n": m.n,
            "note": if m.note.is_empty() { Value::Null } else { json!(m.note) },
        });
        println!("{line}");
        self.metrics.push(m);
    }

    fn table(&self) -> String {
        let mut rows = vec![[
            "metric".to_string(),
            "value".into(),
            "unit".into(),
            "budget".into(),
            "ok".into(),
            "n".into(),
        ]];
        for m in &self.metrics {
            rows.push([
                m.name.clone(),
                m.value.map_or_else(|| "-".into(), fmt_num),
                m.unit.into(),
                m.budget
                    .map_or_else(String::new, |b| format!("{} {}", m.cmp, fmt_num(b))),
                match m.ok() {
                    Some(true) => "ok".into(),
                    Some(false) => "OVER".into(),
                    None => String::new(),
                },
                m.n.map_or_else(String::new, |n| n.to_string()),
            ]);
        }
        let mut w = [0usize; 6];
        for r in &rows {
            for (i, c) in r.iter().enumerate() {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let mut out = String::new();
        for (k, r) in rows.iter().enumerate() {
            let line: Vec<String> = r
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    if i == 1 || i == 5 {
                        format!("{c:>width$}", width = w[i])
                    } else {
                        format!("{c:<width$}", width = w[i])
                    }
                })
                .collect();
            out.push_str(line.join("  ").trim_end());
            out.push('\n');
            if k == 0 {
                out.push_str(&"-".repeat(w.iter().sum::<usize>() + 10));
                out.push('\n');
            }
        }
        for m in self.metrics.iter().filter(|m| !m.note.is_empty()) {
            out.push_str(&format!("  {}: {}\n", m.name, m.note));
        }
        out
    }
}

fn fmt_num(v: f64) -> String {
    if v == v.trunc() && v.abs() < 1e12 {
        format!("{v:.0}")
    } else if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

/// The `p`-quantile (0..=1) by nearest rank.
fn quantile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

fn median_f(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

struct Ctx {
    args: Args,
    llm: FakeLlm,
    report: Report,
}

impl Ctx {
    fn n(&self, quick: u64, full: u64) -> u64 {
        if self.args.quick {
            quick
        } else {
            full
        }
    }

    async fn start_gateway(&self, home: Home) -> Result<(Home, Gateway), String> {
        let weft = self.args.weft.clone();
        tokio::task::spawn_blocking(move || {
            let gw = Gateway::start(&weft, &home, READY_TIMEOUT)?;
            Ok((home, gw))
        })
        .await
        .map_err(|e| format!("start task: {e}"))?
    }

    async fn fresh(&self, tag: &str) -> Result<(Home, Gateway), String> {
        let home = Home::new(tag, &self.llm.base_url(), None)?;
        self.start_gateway(home).await
    }
}

/// One turn through `POST /v1/chat`: its latency, or why it failed.
async fn turn(c: &mut Client, chat_id: &str, text: &str) -> Result<Duration, String> {
    let body = json!({ "chat_id": chat_id, "content": text }).to_string();
    let t0 = Instant::now();
    let (status, resp) = c.request("POST", "/v1/chat", Some(body.as_bytes())).await?;
    let took = t0.elapsed();
    if status != 200 {
        return Err(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&resp)
                .chars()
                .take(300)
                .collect::<String>()
        ));
    }
    let v: Value = serde_json::from_slice(&resp).map_err(|e| format!("reply not JSON: {e}"))?;
    if v["reply"] != FINAL_TEXT {
        return Err(format!("unexpected reply {}", v["reply"]));
    }
    Ok(took)
}

async fn sleep(d: Duration) {
    tokio::time::sleep(d).await;
}

async fn binary(ctx: &mut Ctx) -> Result<(), String> {
    let meta = std::fs::metadata(&ctx.args.weft)
        .map_err(|e| format!("{}: {e}", ctx.args.weft.display()))?;
    let note = match gateway::elf_has_symtab(&ctx.args.weft) {
        Some(false) => "stripped (no .symtab)".to_string(),
        Some(true) => "NOT stripped: has a .symtab; the stripped size is smaller".to_string(),
        None => "not an ELF64 file: cannot tell whether stripped".to_string(),
    };
    ctx.report.add(
        "binary_size",
        Some(meta.len() as f64 / MIB),
        "MiB",
        Some(8.0),
        "<=",
        None,
        format!("{}; {note}", ctx.args.weft.display()),
    );
    Ok(())
}

async fn start(ctx: &mut Ctx) -> Result<(), String> {
    let n = ctx.n(3, 10);
    let mut home = Home::new("start", &ctx.llm.base_url(), None)?;
    let mut times = Vec::new();
    for _ in 0..n {
        let (h, gw) = ctx.start_gateway(home).await?;
        home = h;
        times.push(ms(gw.start_to_ready));
        drop(gw);
    }
    let min = times.iter().copied().fold(f64::INFINITY, f64::min);
    let med = median_f(&mut times);
    ctx.report.add(
        "start_to_ready_min",
        Some(min),
        "ms",
        None,
        "<=",
        Some(n),
        "",
    );
    ctx.report.add(
        "start_to_ready_median",
        med,
        "ms",
        Some(10.0),
        "<=",
        Some(n),
        "spawn -> first 200 from /healthz, HTTP API only; the store exists after the first start",
    );
    Ok(())
}

/// The control UI's first load: `/ui/` and every `/ui/...` asset it names (`src`/`href`),
/// as a browser fetches them on a first visit (uncompressed).
/// A page of the control UI and every `/ui/` asset it names: (bytes, gzip -9 bytes, assets).
async fn ui_page(c: &mut Client, path: &str) -> Result<(usize, usize, usize), String> {
    let (status, page) = c.request("GET", path, None).await?;
    if status != 200 {
        return Err(format!("GET {path} answered {status}"));
    }
    let html = String::from_utf8_lossy(&page).into_owned();
    let mut total = page.len();
    let mut gz = gzip_len(&page)?;
    let mut assets = Vec::new();
    for attr in ["src=\"", "href=\""] {
        for part in html.split(attr).skip(1) {
            let Some(url) = part.split('"').next() else {
                continue;
            };
            if url.starts_with("/ui/") && !assets.iter().any(|a: &String| a == url) {
                assets.push(url.to_string());
            }
        }
    }
    for a in &assets {
        let (status, body) = c.request("GET", a, None).await?;
        if status != 200 {
            return Err(format!("GET {a} answered {status}"));
        }
        total += body.len();
        gz += gzip_len(&body)?;
    }
    Ok((total, gz, assets.len()))
}

/// The size of `bytes` compressed by `gzip -9` (each file on its own, as a server or proxy
/// compressing responses would send it).
fn gzip_len(bytes: &[u8]) -> Result<usize, String> {
    use std::io::Write as _;
    let mut child = std::process::Command::new("gzip")
        .arg("-9c")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("gzip: {e}"))?;
    child
        .stdin
        .take()
        .ok_or("gzip: no stdin")?
        .write_all(bytes)
        .map_err(|e| format!("gzip: {e}"))?;
    let out = child.wait_with_output().map_err(|e| format!("gzip: {e}"))?;
    Ok(out.stdout.len())
}

async fn ui(ctx: &mut Ctx) -> Result<(), String> {
    let (home, _gw) = ctx.fresh("ui").await?;
    let mut c = Client::new(home.addr(), Duration::from_secs(10));
    // Every page of the UI is one document (pages are its sections): its first load is the
    // whole page; the login page is the other document.
    let (total, gz, n) = ui_page(&mut c, "/ui/").await?;
    let (login, login_gz, login_n) = ui_page(&mut c, "/ui/login").await?;
    ctx.report.add(
        "ui_first_load_bytes",
        Some(total as f64),
        "bytes",
        Some(200.0 * 1024.0),
        "<=",
        None,
        format!("/ui/ and its {n} assets, uncompressed"),
    );
    ctx.report.add(
        "ui_largest_page_gzip_bytes",
        Some(gz.max(login_gz) as f64),
        "bytes",
        Some(150.0 * 1024.0),
        "<=",
        None,
        format!(
            "the largest page with every asset it loads, each gzip -9: /ui/ {gz} B ({total} B raw), /ui/login {login_gz} B ({login} B raw, {login_n} assets)"
        ),
    );
    Ok(())
}

async fn idle(ctx: &mut Ctx) -> Result<(), String> {
    let (_home, gw) = ctx.fresh("idle").await?;
    sleep(Duration::from_secs(1)).await;
    let rss = gw.rss()?;
    ctx.report.add(
        "idle_rss_http_only",
        Some(rss as f64 / MIB),
        "MiB",
        Some(6.0),
        "<=",
        None,
        "VmRSS 1 s after ready",
    );
    Ok(())
}

async fn turns(ctx: &mut Ctx) -> Result<(), String> {
    let n = ctx.n(50, 2000);
    let (home, gw) = ctx.fresh("turn").await?;
    let mut c = Client::new(home.addr(), TURN_TIMEOUT);
    for i in 0..5 {
        turn(&mut c, "warm-up", &format!("warm-up {i}")).await?;
    }
    // A one-line message in a fresh session: the first LLM request's size.
    let probe = "What does note.txt say?";
    turn(&mut c, "size-probe", probe).await?;
    let probed = ctx.llm.first_body_size(probe);
    ctx.report.add(
        "llm_request_bytes",
        probed.as_ref().map(|(s, _)| *s as f64),
        "bytes",
        Some(8192.0),
        "<=",
        None,
        "first request body for a one-line message with the built-in tools",
    );
    ctx.report.add(
        "llm_request_tokens_est",
        probed.as_ref().map(|(s, _)| s.div_ceil(4) as f64),
        "tokens",
        None,
        "<=",
        None,
        "the same body at 4 bytes a token (weft's estimate; ~3 bytes a token is a small model's tokenizer)",
    );
    for (part, bytes) in probed.map(|(_, p)| p).unwrap_or_default() {
        ctx.report.add(
            &format!("llm_request_bytes_{part}"),
            Some(bytes as f64),
            "bytes",
            None,
            "<=",
            None,
            "part of the same body",
        );
    }
    ctx.llm.reset_legs();
    let store0 = home.store_bytes();
    let cpu0 = gw.cpu_secs()?;
    let mut lat = Vec::with_capacity(n as usize);
    let t0 = Instant::now();
    for i in 0..n {
        let chat = format!("seq-{}", i / TURNS_PER_SESSION);
        lat.push(
            turn(
                &mut c,
                &chat,
                &format!("message {i}: what does note.txt say?"),
            )
            .await?,
        );
    }
    let wall = t0.elapsed();
    let cpu1 = gw.cpu_secs()?;
    let store1 = home.store_bytes();
    let per_turn_ms = (cpu1 - cpu0) * 1e3 / n as f64;
    ctx.report.add(
        "cpu_per_turn",
        Some(per_turn_ms),
        "ms",
        Some(0.5),
        "<=",
        Some(n),
        format!("utime+stime / turns (2 LLM calls + 1 tool call, sequential, {TURNS_PER_SESSION} turns per session); 10 ms tick resolution over the run"),
    );
    lat.sort();
    ctx.report.add(
        "turn_latency_p50",
        quantile(&lat, 0.5).map(ms),
        "ms",
        None,
        "<=",
        Some(n),
        "",
    );
    ctx.report.add(
        "turns_per_s_sequential",
        Some(n as f64 / wall.as_secs_f64()),
        "turns/s",
        None,
        ">=",
        Some(n),
        "",
    );
    let mut legs = ctx.llm.legs();
    legs.sort();
    let nl = legs.len() as u64;
    ctx.report.add(
        "tool_leg_p50",
        quantile(&legs, 0.5).map(|d| d.as_secs_f64() * 1e6),
        "us",
        Some(100.0),
        "<=",
        Some(nl),
        "fake LLM: tool-call response written -> next request of that session fully received",
    );
    ctx.report.add(
        "tool_leg_p99",
        quantile(&legs, 0.99).map(|d| d.as_secs_f64() * 1e6),
        "us",
        Some(500.0),
        "<=",
        Some(nl),
        "",
    );
    ctx.report.add(
        "store_bytes_per_turn",
        Some(store1.saturating_sub(store0) as f64 / n as f64),
        "bytes",
        Some(2048.0),
        "<=",
        Some(n),
        "growth of the store directory (apparent file sizes) / turns; sled grows its files in steps, so small N is coarse",
    );
    let (reqs, streamed, bad) = ctx.llm.counts();
    if bad > 0 {
        ctx.report
            .errors
            .push(format!("{bad} LLM requests were not JSON"));
    }
    eprintln!("turn: {reqs} LLM requests so far, {streamed} of them streaming (SSE)");
    Ok(())
}

/// Turns whose one tool call is `exec_shell true`: what the exec path (policy, sandbox set-up,
/// spawn, wait, output) costs end to end, as the tool-call leg the fake LLM measures.
async fn exec_turns(ctx: &mut Ctx) -> Result<(), String> {
    let n = ctx.n(30, 300);
    let (home, gw) = ctx.fresh("exec").await?;
    let mut c = Client::new(home.addr(), TURN_TIMEOUT);
    let text = format!("{}true", fake_llm::EXEC_PREFIX);
    for _ in 0..3 {
        turn(&mut c, "exec-warm-up", &text).await?;
    }
    ctx.llm.reset_legs();
    let cpu0 = gw.cpu_secs()?;
    for i in 0..n {
        turn(&mut c, &format!("exec-{}", i / TURNS_PER_SESSION), &text).await?;
    }
    let cpu1 = gw.cpu_secs()?;
    let mut legs = ctx.llm.legs();
    legs.sort();
    let nl = legs.len() as u64;
    ctx.report.add(
        "exec_leg_p50",
        quantile(&legs, 0.5).map(ms),
        "ms",
        None,
        "<=",
        Some(nl),
        "fake LLM: exec_shell `true` call written -> its result received (sandbox, spawn, wait)",
    );
    ctx.report.add(
        "exec_leg_p99",
        quantile(&legs, 0.99).map(ms),
        "ms",
        None,
        "<=",
        Some(nl),
        "",
    );
    ctx.report.add(
        "cpu_per_exec_turn",
        Some((cpu1 - cpu0) * 1e3 / n as f64),
        "ms",
        None,
        "<=",
        Some(n),
        "daemon utime+stime / turns (the command's own CPU not included)",
    );
    Ok(())
}

/// `turns` turns over `workers` connections, each worker on its own sessions. Returns
/// (latencies of the successes, errors, wall time).
async fn drive(
    addr: std::net::SocketAddr,
    workers: u64,
    turns: u64,
    tag: &str,
) -> (Vec<Duration>, Vec<String>, Duration) {
    let next = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let next = next.clone();
        let tag = tag.to_string();
        tasks.push(tokio::spawn(async move {
            let mut c = Client::new(addr, TURN_TIMEOUT);
            let mut lat = Vec::new();
            let mut errs = Vec::new();
            let mut k = 0u64;
            while next.fetch_add(1, Ordering::Relaxed) < turns {
                let chat = format!("{tag}-{w}-{}", k / TURNS_PER_SESSION);
                match turn(
                    &mut c,
                    &chat,
                    &format!("message {k}: what does note.txt say?"),
                )
                .await
                {
                    Ok(d) => lat.push(d),
                    Err(e) => errs.push(e),
                }
                k += 1;
            }
            (lat, errs)
        }));
    }
    let mut lat = Vec::new();
    let mut errs = Vec::new();
    for t in tasks {
        match t.await {
            Ok((l, e)) => {
                lat.extend(l);
                errs.extend(e);
            }
            Err(e) => errs.push(format!("worker: {e}")),
        }
    }
    (lat, errs, t0.elapsed())
}

async fn throughput(ctx: &mut Ctx) -> Result<(), String> {
    let workers = 100;
    let n = ctx.n(200, 5000);
    let (home, gw) = ctx.fresh("throughput").await?;
    // Warm-up: one turn per worker's first session, so connections and sessions exist.
    let (_, errs, _) = drive(home.addr(), workers, workers, "tpw").await;
    if let Some(e) = errs.first() {
        return Err(format!(
            "throughput warm-up: {} errors, first: {e}",
            errs.len()
        ));
    }
    let cpu0 = gw.cpu_secs()?;
    let (mut lat, errs, wall) = drive(home.addr(), workers, n, "tp").await;
    let cpu1 = gw.cpu_secs()?;
    lat.sort();
    let ok = lat.len() as f64;
    ctx.report.add(
        "throughput_100_in_flight",
        Some(ok / wall.as_secs_f64()),
        "turns/s",
        Some(2000.0),
        ">=",
        Some(n),
        format!(
            "{} errors{}; p50 {:.1} ms, p99 {:.1} ms; daemon CPU {:.3} ms/turn",
            errs.len(),
            errs.first()
                .map_or_else(String::new, |e| format!(" (first: {e})")),
            quantile(&lat, 0.5).map_or(0.0, ms),
            quantile(&lat, 0.99).map_or(0.0, ms),
            (cpu1 - cpu0) * 1e3 / n as f64
        ),
    );
    Ok(())
}

async fn burst(ctx: &mut Ctx) -> Result<(), String> {
    let n = ctx.n(100, 1000);
    let (home, gw) = ctx.fresh("burst").await?;
    sleep(Duration::from_secs(1)).await;
    let idle = gw.rss()?;
    let addr = home.addr();
    // Connect everyone first, then release all requests together.
    let gate = Arc::new(tokio::sync::Barrier::new(n as usize));
    let mut tasks = Vec::new();
    for i in 0..n {
        let gate = gate.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Client::new(addr, TURN_TIMEOUT);
            let pre = c.request("GET", "/healthz", None).await;
            gate.wait().await;
            pre?;
            turn(&mut c, &format!("burst-{i}"), "what does note.txt say?").await
        }));
    }
    let mut lat = Vec::new();
    let mut errs = Vec::new();
    for t in tasks {
        match t.await {
            Ok(Ok(d)) => lat.push(d),
            Ok(Err(e)) => errs.push(e),
            Err(e) => errs.push(format!("task: {e}")),
        }
    }
    lat.sort();
    let peak = gw.rss()?;
    ctx.report.add(
        "burst_errors",
        Some(errs.len() as f64),
        "errors",
        Some(0.0),
        "<=",
        Some(n),
        errs.first()
            .map_or_else(String::new, |e| format!("first: {e}")),
    );
    ctx.report.add(
        "burst_p50",
        quantile(&lat, 0.5).map(ms),
        "ms",
        None,
        "<=",
        Some(n),
        "",
    );
    ctx.report.add(
        "burst_p99",
        quantile(&lat, 0.99).map(ms),
        "ms",
        Some(500.0),
        "<=",
        Some(n),
        format!("RSS right after the burst: {:.1} MiB", peak as f64 / MIB),
    );
    sleep(ctx.args.settle).await;
    let after = gw.rss()?;
    let idle_mib = idle as f64 / MIB;
    ctx.report.add(
        "rss_after_burst",
        Some(after as f64 / MIB),
        "MiB",
        Some(idle_mib + 16.0),
        "<=",
        Some(n),
        format!(
            "VmRSS {:.0} s after the burst; budget = idle ({idle_mib:.1} MiB) + 16",
            ctx.args.settle.as_secs_f64()
        ),
    );
    Ok(())
}

async fn idle_sessions(ctx: &mut Ctx) -> Result<(), String> {
    let n = ctx.n(100, 1000);
    let (home, gw) = ctx.fresh("idle-sessions").await?;
    let mut c = Client::new(home.addr(), TURN_TIMEOUT);
    for i in 0..10 {
        turn(&mut c, "warm-up", &format!("warm-up {i}")).await?;
    }
    sleep(Duration::from_millis(500)).await;
    let rss0 = gw.rss()?;
    // One turn in each of n new sessions, 20 at a time; then they sit idle.
    let (_, errs, _) = drive(home.addr(), 20, n, "idle").await;
    if let Some(e) = errs.first() {
        return Err(format!("idle sessions: {} errors, first: {e}", errs.len()));
    }
    sleep(Duration::from_secs(1)).await;
    let rss1 = gw.rss()?;
    let growth = (rss1 as f64 - rss0 as f64) / MIB * 1000.0 / n as f64;
    ctx.report.add(
        "rss_growth_per_1000_idle_sessions",
        Some(growth),
        "MiB",
        Some(4.0),
        "<=",
        Some(n),
        format!(
            "VmRSS {:.1} -> {:.1} MiB after one turn in each of {n} sessions (20 at a time), 1 s later",
            rss0 as f64 / MIB,
            rss1 as f64 / MIB
        ),
    );
    Ok(())
}

async fn run(args: Args) -> Result<Report, String> {
    if !args.weft.exists() {
        return Err(format!(
            "{} does not exist: build it (cargo build --release) or pass --weft PATH",
            args.weft.display()
        ));
    }
    let llm = FakeLlm::start().await?;
    let scenarios = args.scenarios.clone();
    let mut ctx = Ctx {
        args,
        llm,
        report: Report::default(),
    };
    for s in &scenarios {
        let r = match s.as_str() {
            "binary" => binary(&mut ctx).await,
            "start" => start(&mut ctx).await,
            "idle" => idle(&mut ctx).await,
            "channels" => platforms::channels(&mut ctx).await,
            "turn" => turns(&mut ctx).await,
            "exec" => exec_turns(&mut ctx).await,
            "throughput" => throughput(&mut ctx).await,
            "burst" => burst(&mut ctx).await,
            "idle_sessions" => idle_sessions(&mut ctx).await,
            "conversation" => conversation(&mut ctx).await,
            "slow_disk" => slow_disk::slow_disk(&mut ctx).await,
            "ui" => ui(&mut ctx).await,
            "browser" => browser::browser(&mut ctx).await,
            "cluster" => cluster::cluster(&mut ctx).await,
            other => Err(format!("unknown scenario {other}")),
        };
        if let Err(e) = r {
            eprintln!("scenario {s} failed: {e}");
            ctx.report.errors.push(format!("{s}: {e}"));
        }
    }
    Ok(ctx.report)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(Some(a)) => a,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weft-bench: {e}");
            return ExitCode::from(1);
        }
    };
    let no_fail = args.no_fail;
    let quick = args.quick;
    let weft = args.weft.clone();
    // One thread: the tool takes at most one of the machine's cores from the gateway.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("weft-bench: runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let report = match rt.block_on(run(args)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("weft-bench: {e}");
            return ExitCode::from(1);
        }
    };
    println!();
    println!(
        "weft-bench: {}{}",
        weft.display(),
        if quick { " (--quick)" } else { "" }
    );
    print!("{}", report.table());
    for e in &report.errors {
        println!("ERROR {e}");
    }
    let over = report
        .metrics
        .iter()
        .filter(|m| m.ok() == Some(false))
        .count();
    println!(
        "{} figures, {over} over budget, {} errors",
        report.metrics.len(),
        report.errors.len()
    );
    if !report.errors.is_empty() {
        return ExitCode::from(1);
    }
    if over > 0 && !no_fail {
        return ExitCode::from(2);
    }
    ExitCode::SUCCESS
}

/// One session, `n` messages of ~1 KB, through a gateway whose context window is `window`:
/// the first request of each turn, in bytes.
async fn conversation_run(
    ctx: &mut Ctx,
    n: u64,
    window: u64,
    budget: u64,
) -> Result<(Vec<usize>, u64), String> {
    let home = Home::new("conversation", &ctx.llm.base_url(), None)?;
    home.set_agent("context_window", json!(window))?;
    home.set_agent("prompt_budget_tokens", json!(budget))?;
    let (home, _gw) = ctx.start_gateway(home).await?;
    let mut c = Client::new(home.addr(), TURN_TIMEOUT);
    ctx.llm.record_turns();
    for i in 0..n {
        let text = format!("m{i:03} {}", "lorem ipsum dolor sit amet ".repeat(37));
        turn(&mut c, "conversation", &text).await?;
    }
    Ok(ctx.llm.turn_bodies())
}

/// Prompt size per turn over a long conversation, with an 8k window, with a 128k window and
/// the default prompt budget (24k), and without a bound (a window and budget too large to be
/// reached: what every turn sent before the prompt window existed).
async fn conversation(ctx: &mut Ctx) -> Result<(), String> {
    let n = ctx.n(50, 200);
    for (tag, window, budget) in [
        ("8k", 8192u64, 8192u64),
        ("budget24k", 128_000, 24_000),
        ("unbounded", 10_000_000, 10_000_000),
    ] {
        let (sizes, summaries) = conversation_run(ctx, n, window, budget).await?;
        if sizes.len() as u64 != n {
            return Err(format!("{} turns recorded, expected {n}", sizes.len()));
        }
        let tok = |b: usize| b.div_ceil(4) as f64;
        let max = sizes.iter().copied().max().unwrap_or(0);
        let mean = sizes.iter().sum::<usize>() as f64 / sizes.len().max(1) as f64;
        let note = format!("window {window} tokens, prompt budget {budget}; tokens = bytes / 4");
        for (what, bytes) in [("max", max as f64), ("mean", mean)] {
            ctx.report.add(
                &format!("conversation_{tag}_prompt_bytes_{what}"),
                Some(bytes),
                "bytes",
                None,
                "<=",
                Some(n),
                note.clone(),
            );
            ctx.report.add(
                &format!("conversation_{tag}_prompt_tokens_{what}"),
                Some((bytes / 4.0).ceil()),
                "tokens",
                None,
                "<=",
                Some(n),
                "",
            );
        }
        for at in [1usize, 10, 50, 100, 200] {
            if let Some(b) = sizes.get(at - 1) {
                ctx.report.add(
                    &format!("conversation_{tag}_prompt_tokens_turn_{at}"),
                    Some(tok(*b)),
                    "tokens",
                    None,
                    "<=",
                    None,
                    "",
                );
            }
        }
        ctx.report.add(
            &format!("conversation_{tag}_compactions"),
            Some(summaries as f64),
            "summaries",
            None,
            "<=",
            Some(n),
            "summary requests of the compactions",
        );
    }
    Ok(())
}
