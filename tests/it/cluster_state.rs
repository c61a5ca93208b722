//! The state every node of a cluster shares, against a real three-server NATS cluster and
//! three `weft gateway` processes: a scheduled job defined on one node fires once per
//! occurrence across the cluster (also when the node that ran the last one is killed), and
//! its run history is the same on every node; a budget reached through one node is enforced
//! on another.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};

use crate::cluster::{logs_of, start_nodes_merged, Nats};
use crate::common::{echo_model, Api};
use crate::fake_llm::{FakeLlm, Reply};
use crate::process::{log_of, Daemon};
use futures::StreamExt;

/// POST `body` to `path` of `api` → (status, body).
async fn post(api: &Api, path: &str, body: &Value) -> (u16, Value) {
    let r = api
        .http
        .post(format!("{}{path}", api.base))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The scheduled turns the LLM was asked for, by anyone.
fn scheduled_turns(llm: &FakeLlm) -> usize {
    llm.requests()
        .iter()
        .filter(|r| r.to_string().contains("[Scheduled task \\\"beat\\\""))
        .count()
}

/// Job `id`'s run history as node `d` shows it (`weft cron runs`).
async fn runs(d: &Daemon, id: &str) -> Vec<Value> {
    let (s, v) = post(&d.api, "/v1/admin/cron/runs", &json!({ "id": id })).await;
    assert_eq!(s, 200, "{v}");
    v["runs"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_fires_once_per_occurrence_across_three_nodes_and_after_a_kill() {
    let Some(_nats) = Nats::start(3).await else {
        return;
    };
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let (dirs, mut nodes) = start_nodes_merged(
        3,
        &_nats,
        &llm,
        json!({"scheduler": {"min_interval_secs": 1, "max_runs_per_day": 100_000}}),
    )
    .await;

    // Added through node 1, every 2 s; a turn per run.
    let (s, added) = post(
        &nodes[0].as_ref().unwrap().api,
        "/v1/admin/cron/add",
        &json!({"name": "beat", "schedule": {"kind": "every", "seconds": 2}, "message": "say beat",
                    "deliver": "turn", "target": {"channel": "http", "chat_id": "ops"}}),
    )
    .await;
    assert_eq!(s, 200, "{added}");
    let id = added["job"]["id"].as_str().unwrap().to_string();

    // Every node lists it.
    for d in nodes.iter().flatten() {
        let mut seen = false;
        for _ in 0..100 {
            let (_, v) = post(&d.api, "/v1/admin/cron/list", &json!({})).await;
            if v["jobs"]
                .as_array()
                .is_some_and(|j| j.iter().any(|j| j["id"] == id.as_str()))
            {
                seen = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(seen, "a node does not list the job\n{}", logs_of(&dirs));
    }

    // A few occurrences.
    let first = nodes[0].as_ref().unwrap();
    let mut last = Vec::new();
    for _ in 0..200 {
        last = runs(first, &id).await;
        if last.len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(last.len() >= 3, "{last:?}\n{}", logs_of(&dirs));

    // Kill the node that ran the last occurrence, right after it was recorded.
    let run_id = last.last().unwrap()["run_id"].as_str().unwrap().to_string();
    let ran = (0..3)
        .find(|i| {
            log_of(dirs[*i].path())
                .lines()
                .any(|l| l.contains("scheduled run started") && l.contains(&run_id))
        })
        .unwrap_or_else(|| panic!("nobody logged {run_id}\n{}", logs_of(&dirs)));
    nodes[ran].take().unwrap().kill9();
    let killed_at = last.len();
    let other = nodes.iter().flatten().next().unwrap();
    let mut after = Vec::new();
    for _ in 0..200 {
        after = runs(other, &id).await;
        if after.len() >= killed_at + 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        after.len() >= killed_at + 3,
        "no runs after the kill: {after:?}\n{}",
        logs_of(&dirs)
    );

    // Pause it, let the last run finish, then compare: one turn per recorded occurrence, each
    // occurrence once, and the same history on every live node.
    let (s, v) = post(&other.api, "/v1/admin/cron/pause", &json!({ "id": id })).await;
    assert_eq!(s, 200, "{v}");
    let mut settled = false;
    let mut history = Vec::new();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        history = runs(other, &id).await;
        if history.len() == scheduled_turns(&llm) {
            settled = true;
            break;
        }
    }
    let scheduled: Vec<&str> = history
        .iter()
        .map(|r| r["scheduled"].as_str().unwrap())
        .collect();
    let distinct: BTreeSet<&str> = scheduled.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        scheduled.len(),
        "an occurrence ran twice: {scheduled:?}"
    );
    assert!(
        settled,
        "{} scheduled turns for {} recorded runs: {scheduled:?}\n{}",
        scheduled_turns(&llm),
        history.len(),
        logs_of(&dirs)
    );
    for d in nodes.iter().flatten() {
        let h = runs(d, &id).await;
        assert_eq!(h.len(), history.len(), "{h:?} vs {history:?}");
    }
    // The paused state reached every node: no more turns.
    let n = scheduled_turns(&llm);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        scheduled_turns(&llm),
        n,
        "a paused job ran\n{}",
        logs_of(&dirs)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_reached_through_one_node_is_enforced_on_another() {
    let Some(nats) = Nats::start(3).await else {
        return;
    };
    let llm = FakeLlm::start().await;
    // $1 per output token: this reply costs $10, over the $5 daily budget.
    llm.push(Reply::Text("x".repeat(40)));
    let (dirs, nodes) = start_nodes_merged(
        2,
        &nats,
        &llm,
        json!({"prices": {"fake-model": {"input": 0.0, "cached": 0.0, "output": 1_000_000.0}},
               "budgets": {"daily_usd": 5.0}}),
    )
    .await;
    let (a, b) = (nodes[0].as_ref().unwrap(), nodes[1].as_ref().unwrap());
    let (s, v) = a.api.chat("alice", "one").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["reply"], "x".repeat(40));

    // Until node 1's counters are in the cluster.
    let js = nats.jetstream().await;
    let mut published = false;
    for _ in 0..100 {
        if let Ok(kv) = js.get_key_value("weft_usage").await {
            let keys: Vec<String> = kv
                .keys()
                .await
                .unwrap()
                .filter_map(|k| async move { k.ok() })
                .collect()
                .await;
            if keys.iter().any(|k| k.starts_with("usage.n1.")) {
                published = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        published,
        "node 1's usage not published\n{}",
        logs_of(&dirs)
    );

    // Node 2 never served a turn, yet refuses: the budget counts the cluster's spend.
    let (s, v) = b.api.chat("bob", "two").await;
    assert_eq!(s, 429, "{v}\n{}", logs_of(&dirs));
    let err = v["error"].as_str().unwrap_or_default();
    assert!(
        err.contains("reached its daily budget (US$10.00 of US$5.00")
            && err.contains("budgets.daily_usd"),
        "{v}"
    );
    assert_eq!(
        llm.requests().len(),
        1,
        "the refused turn reached the provider"
    );
}
