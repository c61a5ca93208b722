//! The `slow_disk` scenario: the gateway on storage whose every `fsync` takes 50 ms longer (an
//! SD card, a network disk), against a model that takes 20 ms an answer. 50 chats do turns;
//! then the same while 16 other chats send `/new` and `/status` as fast as they are answered.
//! The shim (`slowfsync.c`, an `LD_PRELOAD` library) is compiled with `cc` at run time into the
//! scenario's temp dir; without `cc` the scenario says so and is skipped.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::gateway::{Gateway, Home, TempDir};
use crate::http::Client;
use crate::{drive, ms, quantile, Ctx, READY_TIMEOUT, TURN_TIMEOUT};

/// The shim's source: every `fsync`, `fdatasync`, `sync_file_range` and `syncfs` takes
/// `SLOWFS_MS` more milliseconds.
const SHIM_SRC: &str = include_str!("slowfsync.c");
/// Added to every fsync.
const SLOW_FSYNC_MS: u64 = 50;
/// How long each model answer takes.
const MODEL_DELAY: Duration = Duration::from_millis(20);
/// Chats doing turns.
const CHATS: u64 = 50;
/// Chats flooding the gateway with commands.
const FLOOD_CHATS: u64 = 16;
/// Budget: p99 of a turn of the 50 chats on the slow disk.
const P99_BUDGET_MS: f64 = 1000.0;
/// Budget: how much the command flood may move that p99.
const FLOOD_BUDGET_PCT: f64 = 25.0;

/// Compile the shim into `dir`; `Err` says why it cannot be (no `cc`, a failed compile).
fn build_shim(dir: &Path) -> Result<PathBuf, String> {
    let src = dir.join("slowfsync.c");
    let so = dir.join("slowfsync.so");
    std::fs::write(&src, SHIM_SRC).map_err(|e| format!("write shim source: {e}"))?;
    let out = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&so)
        .arg(&src)
        .arg("-ldl")
        .output()
        .map_err(|e| {
            format!("cannot run cc ({e}): install a C compiler to measure on a slow disk")
        })?;
    if !out.status.success() {
        return Err(format!(
            "cc failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(so)
}

/// One command through `POST /v1/chat`; any 200 answer counts.
async fn command(c: &mut Client, chat_id: &str, text: &str) -> Result<(), String> {
    let body = json!({ "chat_id": chat_id, "content": text }).to_string();
    let (status, resp) = c.request("POST", "/v1/chat", Some(body.as_bytes())).await?;
    if status != 200 {
        return Err(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&resp)
                .chars()
                .take(200)
                .collect::<String>()
        ));
    }
    let v: Value = serde_json::from_slice(&resp).map_err(|e| format!("reply not JSON: {e}"))?;
    if v["reply"].as_str().is_none_or(str::is_empty) {
        return Err(format!("empty reply to {text}"));
    }
    Ok(())
}

/// `/new` and `/status` in turn from `FLOOD_CHATS` chats until `stop`; returns how many were
/// answered and the errors.
fn flood(
    addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<(u64, Vec<String>)>> {
    (0..FLOOD_CHATS)
        .map(|i| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut c = Client::new(addr, TURN_TIMEOUT);
                let (mut n, mut errs) = (0u64, Vec::new());
                let chat = format!("flood-{i}");
                while !stop.load(Ordering::Relaxed) {
                    let text = if n % 2 == 0 { "/new" } else { "/status" };
                    match command(&mut c, &chat, text).await {
                        Ok(()) => n += 1,
                        Err(e) => errs.push(e),
                    }
                }
                (n, errs)
            })
        })
        .collect()
}

pub async fn slow_disk(ctx: &mut Ctx) -> Result<(), String> {
    let scratch = TempDir::new("slowfs")?;
    let so = match build_shim(scratch.path()) {
        Ok(so) => so,
        Err(why) => {
            let note = format!("skipped: {why}");
            eprintln!("slow_disk: {note}");
            for name in ["slow_disk_p99", "slow_disk_flood_p99"] {
                ctx.report
                    .add(name, None, "ms", None, "<=", None, note.clone());
            }
            return Ok(());
        }
    };
    let n = ctx.n(CHATS * 4, CHATS * 20);
    let home = Home::new("slow-disk", &ctx.llm.base_url(), None)?;
    let weft = ctx.args.weft.clone();
    let env = vec![
        ("LD_PRELOAD".to_string(), so.display().to_string()),
        ("SLOWFS_MS".to_string(), SLOW_FSYNC_MS.to_string()),
    ];
    let (home, gw) = tokio::task::spawn_blocking(move || {
        let gw = Gateway::start_with_env(&weft, &home, READY_TIMEOUT, &env)?;
        Ok::<_, String>((home, gw))
    })
    .await
    .map_err(|e| format!("start task: {e}"))??;
    ctx.llm.set_delay(MODEL_DELAY);
    let result = measure(ctx, &home, &gw, n).await;
    ctx.llm.set_delay(Duration::ZERO);
    result
}

async fn measure(ctx: &mut Ctx, home: &Home, gw: &Gateway, n: u64) -> Result<(), String> {
    let addr = home.addr();
    // One chat alone: what a turn costs on this disk without contention.
    let mut c = Client::new(addr, TURN_TIMEOUT);
    let mut alone = Vec::new();
    for i in 0..10 {
        alone.push(
            crate::turn(
                &mut c,
                "alone",
                &format!("alone {i}: what does note.txt say?"),
            )
            .await?,
        );
    }
    alone.sort();
    // Warm-up: every worker's connection and first session.
    let (_, errs, _) = drive(addr, CHATS, CHATS, "sdw").await;
    if let Some(e) = errs.first() {
        return Err(format!(
            "slow_disk warm-up: {} errors, first: {e}",
            errs.len()
        ));
    }

    let cpu0 = gw.cpu_secs()?;
    let (mut base, errs, wall) = drive(addr, CHATS, n, "sd").await;
    let cpu1 = gw.cpu_secs()?;
    if let Some(e) = errs.first() {
        ctx.report
            .errors
            .push(format!("slow_disk: {} errors, first: {e}", errs.len()));
    }
    base.sort();
    let p99 = quantile(&base, 0.99).map(ms);

    let stop = Arc::new(AtomicBool::new(false));
    let flooders = flood(addr, stop.clone());
    let t0 = Instant::now();
    let (mut flooded, errs, _) = drive(addr, CHATS, n, "sdf").await;
    stop.store(true, Ordering::Relaxed);
    let flood_wall = t0.elapsed();
    let commands = AtomicU64::new(0);
    let mut flood_errs = Vec::new();
    for f in flooders {
        match f.await {
            Ok((k, e)) => {
                commands.fetch_add(k, Ordering::Relaxed);
                flood_errs.extend(e);
            }
            Err(e) => flood_errs.push(format!("flood task: {e}")),
        }
    }
    if let Some(e) = errs.first().or(flood_errs.first()) {
        ctx.report.errors.push(format!(
            "slow_disk with the flood: {} errors, first: {e}",
            errs.len() + flood_errs.len()
        ));
    }
    flooded.sort();
    let flood_p99 = quantile(&flooded, 0.99).map(ms);
    let moved = match (p99, flood_p99) {
        (Some(a), Some(b)) if a > 0.0 => Some((b - a) / a * 100.0),
        _ => None,
    };
    ctx.report.add(
        "slow_disk_p99",
        p99,
        "ms",
        Some(P99_BUDGET_MS),
        "<=",
        Some(n),
        format!(
            "{CHATS} chats doing turns (2 model calls of {} ms + 1 tool call), every fsync +{SLOW_FSYNC_MS} ms; p50 {:.0} ms; {:.1} turns/s; daemon CPU {:.2} ms/turn; one chat alone: p50 {:.0} ms",
            MODEL_DELAY.as_millis(),
            quantile(&base, 0.5).map_or(0.0, ms),
            base.len() as f64 / wall.as_secs_f64(),
            (cpu1 - cpu0) * 1e3 / n as f64,
            quantile(&alone, 0.5).map_or(0.0, ms),
        ),
    );
    ctx.report.add(
        "slow_disk_flood_p99",
        flood_p99,
        "ms",
        p99.map(|a| a * (1.0 + FLOOD_BUDGET_PCT / 100.0)),
        "<=",
        Some(n),
        format!(
            "the same while {FLOOD_CHATS} other chats send /new and /status as fast as answered ({} commands, {:.0}/s); moved p99 by {}; budget: slow_disk_p99 + {FLOOD_BUDGET_PCT}%",
            commands.load(Ordering::Relaxed),
            commands.load(Ordering::Relaxed) as f64 / flood_wall.as_secs_f64(),
            moved.map_or_else(|| "-".to_string(), |m| format!("{m:+.0}%")),
        ),
    );
    Ok(())
}
