//! The `browser` scenario: a real gateway driving the system's Chromium through the `browser`
//! tool, as a chat does (the fake model loads the tool with `tool_search`, then opens a page
//! served on loopback and snapshots it). Measures the chat turn to the first snapshot with the
//! browser closed (cold: Chromium starts) and running (warm), and the memory of the gateway
//! and of the browser's processes with the browser idle and after it closed.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::gateway::Home;
use crate::http::Client;
use crate::{turn, Ctx};

const CHROMIUM: &str = "/usr/bin/chromium";

/// A page server on loopback: every path answers a small shop page.
async fn page_server() -> Result<std::net::SocketAddr, String> {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("page server: {e}"))?;
    let addr = l.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = s.read(&mut buf).await;
                let body = "<!doctype html><title>Shop</title><h1>Welcome to the shop</h1><p>Fresh apples every day.</p><a href=\"/next\">Next page</a><form><input aria-label=Query name=q><button>Search</button></form>";
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    Ok(addr)
}

/// The processes descending from `root` whose command line names Chromium.
fn chromium_pids(root: u32) -> Vec<u32> {
    let mut parent = std::collections::HashMap::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for e in rd.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) {
            let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
            if let Some(pp) = after
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u32>().ok())
            {
                parent.insert(pid, pp);
            }
        }
    }
    parent
        .keys()
        .copied()
        .filter(|&p| {
            let mut cur = p;
            for _ in 0..64 {
                match parent.get(&cur) {
                    Some(&pp) if pp == root => return true,
                    Some(&pp) if pp > 1 => cur = pp,
                    _ => return false,
                }
            }
            false
        })
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("chromium"))
        })
        .collect()
}

/// Sum of `field` (kB) of `smaps_rollup` over `pids`, in bytes.
fn memory(pids: &[u32], field: &str) -> u64 {
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/smaps_rollup")).ok())
        .filter_map(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum::<u64>()
        * 1024
}

fn calls(list: &Value) -> String {
    format!("{}{list}", crate::fake_llm::CALLS_PREFIX)
}

pub async fn browser(ctx: &mut Ctx) -> Result<(), String> {
    if !Path::new(CHROMIUM).exists() {
        ctx.report.add(
            "browser_first_snapshot_cold_ms",
            None,
            "ms",
            None,
            "",
            None,
            format!("skipped: no {CHROMIUM} (apt install chromium)"),
        );
        return Ok(());
    }
    let site = page_server().await?;
    let home = Home::new("browser", &ctx.llm.base_url(), None)?;
    let text = std::fs::read_to_string(&home.config).map_err(|e| e.to_string())?;
    let mut cfg: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    cfg["tools"]["browser"] = json!({ "allow_private": [site.to_string()] });
    std::fs::write(&home.config, cfg.to_string()).map_err(|e| e.to_string())?;
    let (home, gw) = ctx.start_gateway(home).await?;
    let mut c = Client::new(home.addr(), Duration::from_secs(120));
    let search = json!(["tool_search", {"query": "browser"}]);
    let open_snapshot = |path: &str| {
        calls(&json!([
            search,
            ["browser", {"action": "open", "url": format!("http://{site}{path}")}],
            ["browser", {"action": "snapshot"}]
        ]))
    };
    let close = calls(&json!([search, ["browser", {"action": "close"}]]));
    let n = ctx.n(3, 5);
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    for _ in 0..n {
        turn(&mut c, "bench-browser", &close).await?;
        cold.push(turn(&mut c, "bench-browser", &open_snapshot("/")).await?);
        warm.push(turn(&mut c, "bench-browser", &open_snapshot("/next")).await?);
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1000.0
    };
    let (cold_ms, warm_ms) = (median(&mut cold), median(&mut warm));
    // Idle: one tab open, nothing running.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pids = chromium_pids(gw.pid);
    if pids.is_empty() {
        return Err("no Chromium process under the gateway after a snapshot".into());
    }
    let pss_open = memory(&pids, "Pss:");
    let gw_open = gw.rss()?;
    turn(&mut c, "bench-browser", &close).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let left = chromium_pids(gw.pid);
    let gw_closed = gw.rss()?;
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let note = "chat turn (tool_search, open, snapshot; zero-latency model) with the browser closed (Chromium starts) / running";
    ctx.report.add(
        "browser_first_snapshot_cold_ms",
        Some(cold_ms),
        "ms",
        None,
        "",
        Some(n),
        note,
    );
    ctx.report.add(
        "browser_first_snapshot_warm_ms",
        Some(warm_ms),
        "ms",
        None,
        "",
        Some(n),
        note,
    );
    ctx.report.add(
        "browser_idle_pss_mib",
        Some(mib(pss_open)),
        "MiB",
        None,
        "",
        None,
        format!(
            "PSS of the browser's {} processes with one tab open, idle",
            pids.len()
        ),
    );
    ctx.report.add(
        "browser_closed_pss_mib",
        Some(mib(memory(&left, "Pss:"))),
        "MiB",
        None,
        "",
        None,
        format!(
            "PSS of the browser's processes after `close` ({} left)",
            left.len()
        ),
    );
    ctx.report.add(
        "browser_gateway_rss_open_mib",
        Some(mib(gw_open)),
        "MiB",
        None,
        "",
        None,
        "the gateway's own VmRSS with the browser idle",
    );
    ctx.report.add(
        "browser_gateway_rss_closed_mib",
        Some(mib(gw_closed)),
        "MiB",
        None,
        "",
        None,
        format!(
            "the gateway's own VmRSS after `close` ({} browser processes left)",
            left.len()
        ),
    );
    Ok(())
}
