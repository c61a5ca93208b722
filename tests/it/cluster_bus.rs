//! The bus between machines against a real three-server NATS cluster and three `weft gateway`
//! processes with the fake Telegram and the fake LLM: accepted messages are journaled in the
//! cluster, each session partition is consumed by its lease holder, and the messages a killed
//! node had taken but not answered are answered by the next owner.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use clawft_channel_telegram::fake::FakeTelegram;
use serde_json::json;

use crate::cluster::{cluster_status, logs_of, start_nodes_with, Nats};
use crate::common::{echo_model, wait_until};
use crate::fake_llm::FakeLlm;

const CHATS: i64 = 100;

/// The replies per message text (`answer: <text>`).
fn replies(tg: &FakeTelegram) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for m in tg.sent() {
        if let Some(t) = m.visible.strip_prefix("answer: ") {
            *out.entry(t.to_string()).or_insert(0) += 1;
        }
    }
    out
}

fn answered(tg: &FakeTelegram, texts: &[String]) -> usize {
    let r = replies(tg);
    texts.iter().filter(|t| r.contains_key(*t)).count()
}

/// Push one message to each chat (round `round`): their texts.
fn push_round(tg: &FakeTelegram, round: usize) -> Vec<String> {
    (0..CHATS)
        .map(|c| {
            let chat = 1000 + c;
            let text = format!("c{chat} r{round}");
            tg.push_user_message(chat, chat, &text);
            text
        })
        .collect()
}

fn telegram_holder(dir: &std::path::Path) -> Option<usize> {
    let st = cluster_status(dir);
    let h = st["connections"][0]["holder"].as_str()?.to_string();
    h.get(1..)?.parse::<usize>().ok().map(|n| n - 1)
}

/// `weft cluster status --json`, tried again while NATS settles (a server just restarted).
async fn status_retried(dir: &std::path::Path) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = crate::process::weft(dir)
            .arg("--config")
            .arg(dir.join("config.json"))
            .args(["cluster", "status", "--json"])
            .output()
            .unwrap();
        if out.status.success() {
            return serde_json::from_slice(&out.stdout).unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_of_killed_nodes_are_answered_by_the_next_partition_owner() {
    let Some(mut nats) = Nats::start(3).await else {
        return;
    };
    let tg = FakeTelegram::start().await;
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let allow: Vec<i64> = (1000..1000 + CHATS).collect();
    let channels = json!({"telegram": {"token": FakeTelegram::TOKEN, "api_url": tg.api_url(), "allow_from": allow, "stream_edits": false}});
    let (dirs, mut nodes) =
        start_nodes_with(3, &nats, &llm, channels, json!({"partitions": 8})).await;
    let started = Instant::now();
    assert!(
        wait_until(Duration::from_secs(30), || tg.polls_in_flight() == 1).await,
        "nobody polls\n{}",
        logs_of(&dirs)
    );

    // Round 1; mid-load, kill -9 the node holding the Telegram connection.
    let mut texts = push_round(&tg, 1);
    assert!(
        wait_until(Duration::from_secs(30), || answered(&tg, &texts) >= 30).await,
        "{}",
        logs_of(&dirs)
    );
    let first = telegram_holder(dirs[0].path()).unwrap();
    nodes[first].take().unwrap().kill9();
    let killed_at = answered(&tg, &texts);

    // Round 2 while the connection and the partitions move; one NATS server lost meanwhile.
    texts.extend(push_round(&tg, 2));
    nats.servers[0].kill();
    assert!(
        wait_until(Duration::from_secs(30), || answered(&tg, &texts) >= 150).await,
        "after the first kill ({killed_at} answered then): {} of {} answered\n{}",
        answered(&tg, &texts),
        texts.len(),
        logs_of(&dirs)
    );
    // Then another node (of the two left), mid-load too.
    let live: Vec<usize> = (0..3).filter(|i| nodes[*i].is_some()).collect();
    texts.extend(push_round(&tg, 3));
    let second = live[0];
    nodes[second].take().unwrap().kill9();

    // Every message is answered by the node left, which owns every partition now.
    let all = texts.len();
    assert!(
        wait_until(Duration::from_secs(40), || answered(&tg, &texts) == all).await,
        "{} of {all} answered; unanswered: {:?}\n{}",
        answered(&tg, &texts),
        texts
            .iter()
            .filter(|t| !replies(&tg).contains_key(*t))
            .take(10)
            .collect::<Vec<_>>(),
        logs_of(&dirs)
    );
    eprintln!(
        "300 messages over {CHATS} chats answered in {:?} with two nodes killed",
        started.elapsed()
    );
    // Nothing more comes (a reply sent again would come within the turn's time).
    let r = replies(&tg);
    let doubled: Vec<(&String, &usize)> = r.iter().filter(|(_, n)| **n > 1).collect();
    eprintln!("answered twice (the documented window): {doubled:?}");
    // The one at-least-once window: a reply delivered by a node killed before it recorded
    // the delivery is sent again by the next owner; never more than twice, and only for the
    // replies under way at the two kills.
    assert!(doubled.iter().all(|(_, n)| **n == 2), "{doubled:?}");
    assert!(doubled.len() <= 30, "{} answered twice", doubled.len());
    let survivor = (0..3).find(|i| nodes[*i].is_some()).unwrap();
    let log = crate::process::log_of(dirs[survivor].path());
    assert!(
        log.matches("this node owns the partition").count() >= 8,
        "{log}"
    );
    // `weft cluster status` shows who owns the partitions: the survivor, all of them.
    nats.restart(0);
    // (A lease being renewed while a NATS server comes back may be missing from one listing.)
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut st = status_retried(dirs[survivor].path()).await;
    while st["partitions"]["held"] != 8 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        st = status_retried(dirs[survivor].path()).await;
    }
    assert_eq!(st["partitions"]["held"], 8, "{st}");
    assert_eq!(
        st["partitions"]["owners"],
        json!({format!("n{}", survivor + 1): 8}),
        "{st}"
    );
    assert_eq!(tg.max_concurrent_polls(), 1, "two nodes polled at once");
    for n in nodes.into_iter().flatten() {
        assert_eq!(n.term().code(), Some(0));
    }
}
