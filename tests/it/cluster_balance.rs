//! Partition balancing against a real three-server NATS cluster and `weft gateway` processes
//! with the fake Telegram and the fake LLM: three nodes share eight partitions (two or three
//! each), a fourth node joining takes its share while messages flow (each answered once), and
//! a node killed with SIGKILL has its partitions taken by the others after the lease TTL.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use clawft_channel_telegram::fake::FakeTelegram;
use serde_json::json;

use crate::cluster::{cluster_status, logs_of, start_nodes_with, Nats};
use crate::cluster_bus::{answered, push_round_to, replies};
use crate::common::{echo_model, wait_until};
use crate::fake_llm::FakeLlm;
use crate::process::{free_port, gateway_config, Daemon};

const CHATS: i64 = 40;
const PARTITIONS: u64 = 8;

fn push_round(tg: &FakeTelegram, round: usize) -> Vec<String> {
    push_round_to(tg, round, 2000..2000 + CHATS)
}

/// Partitions held per node, as `weft cluster status --json` shows them.
fn owners(dir: &Path) -> BTreeMap<String, u64> {
    let st = cluster_status(dir);
    st["partitions"]["owners"]
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default()
}

/// Every partition held, by exactly `nodes`, each holding `lo..=hi`.
fn balanced(o: &BTreeMap<String, u64>, nodes: &[&str], lo: u64, hi: u64) -> bool {
    o.values().sum::<u64>() == PARTITIONS
        && o.keys().map(String::as_str).eq(nodes.iter().copied())
        && o.values().all(|n| (lo..=hi).contains(n))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_are_shared_handed_over_and_taken_after_a_kill() {
    let _heavy = crate::cluster::HEAVY.lock().await;
    let Some(nats) = Nats::start(3).await else {
        return;
    };
    let tg = FakeTelegram::start().await;
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let allow: Vec<i64> = (2000..2000 + CHATS).collect();
    let channels = json!({"telegram": {"token": FakeTelegram::TOKEN, "api_url": tg.api_url(), "allow_from": allow, "stream_edits": false}});
    let (mut dirs, mut nodes) = start_nodes_with(
        3,
        &nats,
        &llm,
        channels.clone(),
        json!({"partitions": PARTITIONS}),
    )
    .await;
    let mut last = BTreeMap::new();
    assert!(
        wait_until(Duration::from_secs(30), || {
            last = owners(dirs[0].path());
            balanced(&last, &["n1", "n2", "n3"], 2, 3)
        })
        .await,
        "not balanced: {last:?}\n{}",
        logs_of(&dirs)
    );

    // A fourth node joins while messages flow: it takes its share (two each now), and every
    // message is answered once.
    let mut texts = push_round(&tg, 1);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = gateway_config(
        dir.path(),
        &llm,
        port,
        json!({
            "channels": channels,
            "cluster": {"nats_url": nats.urls(), "node_id": "n4", "lease_ttl_secs": 4, "partitions": PARTITIONS},
        }),
    );
    let joined = Instant::now();
    nodes.push(Some(Daemon::start(dir.path(), &cfg, port).await));
    dirs.push(dir);
    texts.extend(push_round(&tg, 2));
    assert!(
        wait_until(Duration::from_secs(30), || {
            last = owners(dirs[0].path());
            balanced(&last, &["n1", "n2", "n3", "n4"], 2, 2)
        })
        .await,
        "the fourth node got no share: {last:?}\n{}",
        logs_of(&dirs)
    );
    let share_after = joined.elapsed();
    texts.extend(push_round(&tg, 3));
    let all = texts.len();
    assert!(
        wait_until(Duration::from_secs(40), || answered(&tg, &texts) == all).await,
        "{} of {all} answered\n{}",
        answered(&tg, &texts),
        logs_of(&dirs)
    );
    let handed = logs_of(&dirs)
        .matches("partition handed over to its new owner")
        .count();
    assert!(handed >= 2, "no handover logged\n{}", logs_of(&dirs));
    // A reply sent again would come within a turn's time: wait for the last round's
    // answers to settle, then count.
    let r = replies(&tg);
    let doubled: Vec<_> = texts.iter().filter(|t| r.get(*t) != Some(&1)).collect();
    assert!(doubled.is_empty(), "answered more than once: {doubled:?}");
    eprintln!("the fourth node had its share {share_after:?} after it started ({handed} partitions handed over)");

    // A node killed: its two partitions are the others' after the lease TTL (4 s) and a
    // few seconds; nothing sent meanwhile is lost.
    nodes[3].take().unwrap().kill9();
    let killed = Instant::now();
    let round4 = push_round(&tg, 4);
    assert!(
        wait_until(Duration::from_secs(30), || {
            last = owners(dirs[0].path());
            balanced(&last, &["n1", "n2", "n3"], 2, 3)
        })
        .await,
        "the killed node's partitions were not taken: {last:?}\n{}",
        logs_of(&dirs)
    );
    let taken_after = killed.elapsed();
    eprintln!("a killed node's partitions taken {taken_after:?} after the kill");
    assert!(
        taken_after < Duration::from_secs(4 + 8),
        "taken only after {taken_after:?}"
    );
    assert!(
        wait_until(Duration::from_secs(40), || answered(&tg, &round4)
            == round4.len())
        .await,
        "{} of {} answered after the kill\n{}",
        answered(&tg, &round4),
        round4.len(),
        logs_of(&dirs)
    );
    assert_eq!(tg.max_concurrent_polls(), 1, "two nodes polled at once");
    crate::process::term_all(nodes, &dirs);
}
