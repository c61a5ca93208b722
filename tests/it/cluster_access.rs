//! Pairing and usage shared by the nodes of a cluster, against a real three-server NATS
//! cluster, `weft gateway` processes and the fake Telegram: a stranger gets a code through the
//! node holding the Telegram connection, the operator approves it on another node, the
//! stranger is answered also after the connection moved to a third node; a revocation on one
//! node refuses the sender everywhere; an approval asked on one node is answered from another
//! node's CLI and its "always" follows the session to another node; `weft usage --json` on any
//! node shows every node's turns.

use std::time::Duration;

use clawft_channel_telegram::fake::FakeTelegram;
use serde_json::{json, Value};

use crate::cluster::{cluster_status, logs_of, start_nodes_with, Nats, T};
use crate::common::{echo_model, wait_until};
use crate::fake_llm::{FakeLlm, Reply};
use crate::process::{free_port, gateway_config, weft, weft_json, Daemon};

/// `weft ARGS --json` on node `dir`. Tried again while the CLI does not find the gateway in
/// time (a loaded machine: its HTTP API answers late), which it reports as a failure.
fn weft_on(dir: &tempfile::TempDir, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let cfg = dir.path().join("config.json");
    for _ in 0..20 {
        let out = weft(dir.path())
            .arg("--config")
            .arg(&cfg)
            .args(&all)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            return serde_json::from_slice(&out.stdout).unwrap();
        }
        assert!(err.contains("no gateway of this store answers"), "{err}");
        std::thread::sleep(Duration::from_millis(500));
    }
    weft_json(dir.path(), &cfg, &all)
}

/// The index of the node holding the Telegram connection, as node `dir` sees it.
fn holder(dir: &tempfile::TempDir) -> Option<usize> {
    let st = cluster_status(dir.path());
    let h = st["connections"].as_array()?.first()?["holder"]
        .as_str()?
        .to_string();
    h.strip_prefix('n')?.parse::<usize>().ok()?.checked_sub(1)
}

/// The pairing codes sent to chat `chat`, in order.
fn codes(tg: &FakeTelegram, chat: i64) -> Vec<String> {
    tg.sent()
        .iter()
        .filter(|m| m.chat == chat)
        .filter_map(|m| {
            let rest = m.visible.split("Your pairing code is ").nth(1)?;
            Some(rest.split('.').next()?.to_string())
        })
        .collect()
}

fn answers(tg: &FakeTelegram, text: &str) -> usize {
    tg.sent().iter().filter(|m| m.visible == text).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_paired_on_one_node_is_admitted_and_revoked_everywhere() {
    let Some(nats) = Nats::start(3).await else {
        return;
    };
    let tg = FakeTelegram::start().await;
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let channels = json!({"telegram": {"token": FakeTelegram::TOKEN, "api_url": tg.api_url(),
        "allow_from": [111], "pairing": true, "stream_edits": false}});
    let (dirs, mut nodes) = start_nodes_with(3, &nats, &llm, channels, json!({})).await;
    assert!(
        wait_until(T, || tg.polls_in_flight() == 1).await,
        "nobody polls\n{}",
        logs_of(&dirs)
    );
    let h = holder(&dirs[0]).unwrap();

    // A stranger gets a code through the node that holds the connection.
    tg.push_user_message(222, 222, "hello");
    assert!(
        wait_until(T, || codes(&tg, 222).len() == 1).await,
        "no pairing code\n{}",
        logs_of(&dirs)
    );
    let code = codes(&tg, 222)[0].clone();

    // Another node lists it and approves it.
    let b = (h + 1) % 3;
    assert!(
        wait_until(T, || {
            weft_on(&dirs[b], &["pairing", "list"])["pending"]
                .as_array()
                .is_some_and(|p| p.iter().any(|p| p["code"] == code.as_str()))
        })
        .await,
        "node {} does not list the code issued on node {}\n{}",
        b + 1,
        h + 1,
        logs_of(&dirs)
    );
    let v = weft_on(&dirs[b], &["pairing", "approve", &code]);
    assert_eq!(v["approved"], "telegram:222", "{v}");
    // Every node knows it (the holder and the third through the cluster).
    for (i, d) in dirs.iter().enumerate() {
        assert!(
            wait_until(T, || {
                weft_on(d, &["pairing", "list"])["paired"]
                    .as_array()
                    .is_some_and(|p| p.iter().any(|p| p == "telegram:222"))
            })
            .await,
            "node {} does not have the pairing\n{}",
            i + 1,
            logs_of(&dirs)
        );
    }

    // The stranger is answered, also once the connection moved to another node.
    tg.push_user_message(222, 222, "first");
    assert!(
        wait_until(T, || answers(&tg, "answer: first") == 1).await,
        "{}",
        logs_of(&dirs)
    );
    nodes[h].take().unwrap().kill9();
    tg.push_user_message(222, 222, "second");
    assert!(
        wait_until(T, || answers(&tg, "answer: second") == 1).await,
        "not answered after the failover\n{}",
        logs_of(&dirs)
    );
    let alive: Vec<usize> = (0..3).filter(|i| *i != h).collect();
    let now = holder(&dirs[alive[0]]).unwrap();
    assert_ne!(now, h);
    assert_eq!(codes(&tg, 222).len(), 1, "a paired sender got a new code");

    // Revoked on the node that does not hold the connection: refused by the one that does
    // (it answers with a new code, as to any stranger).
    let other = alive.iter().copied().find(|i| *i != now).unwrap();
    let v = weft_on(&dirs[other], &["pairing", "revoke", "telegram:222"]);
    assert_eq!(v["revoked"], true, "{v}");
    for i in &alive {
        assert!(
            wait_until(T, || {
                weft_on(&dirs[*i], &["pairing", "list"])["paired"]
                    .as_array()
                    .is_some_and(Vec::is_empty)
            })
            .await,
            "node {} still has the pairing\n{}",
            i + 1,
            logs_of(&dirs)
        );
    }
    tg.push_user_message(222, 222, "third");
    assert!(
        wait_until(T, || codes(&tg, 222).len() == 2).await,
        "a revoked sender got no new code\n{}",
        logs_of(&dirs)
    );
    // Let the message through the pump if it were admitted: it is not answered.
    tg.push_user_message(111, 111, "allowed");
    assert!(
        wait_until(T, || answers(&tg, "answer: allowed") == 1).await,
        "{}",
        logs_of(&dirs)
    );
    assert_eq!(
        answers(&tg, "answer: third"),
        0,
        "a revoked sender was answered"
    );

    // NATS gone: approving is refused, saying why, and nothing changes.
    let code = codes(&tg, 222)[1].clone();
    let listed = |d: &tempfile::TempDir| {
        weft_on(d, &["pairing", "list"])["pending"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p["code"] == code.as_str()))
    };
    assert!(
        wait_until(T, || listed(&dirs[other])).await,
        "{}",
        logs_of(&dirs)
    );
    let mut nats = nats;
    for s in &mut nats.servers {
        s.kill();
    }
    let cfg = dirs[other].path().join("config.json");
    let out = weft(dirs[other].path())
        .arg("--config")
        .arg(&cfg)
        .args(["pairing", "approve", &code])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "approved without NATS");
    assert!(
        err.contains("pairing approval refused") && err.contains("nothing was changed"),
        "{err}"
    );
    assert!(listed(&dirs[other]), "the code went away");
    let v = weft_on(&dirs[other], &["pairing", "list"]);
    assert!(v["paired"].as_array().is_some_and(Vec::is_empty), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_lists_every_nodes_turns_on_any_node() {
    let Some(nats) = Nats::start(3).await else {
        return;
    };
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let (dirs, nodes) = start_nodes_with(2, &nats, &llm, json!({}), json!({})).await;
    let (a, b) = (nodes[0].as_ref().unwrap(), nodes[1].as_ref().unwrap());
    let (s, v) = a.api.chat("alice", "one").await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = b.api.chat("bob", "two").await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = b.api.chat("bob", "three").await;
    assert_eq!(s, 200, "{v}");
    for d in &dirs {
        let mut last = Value::Null;
        let ok = wait_until(Duration::from_secs(20), || {
            last = weft_on(d, &["usage", "--by", "session"]);
            last["nodes"]["n1"]["calls"] == 1
                && last["nodes"]["n2"]["calls"] == 2
                && last["total"]["calls"] == 3
        })
        .await;
        assert!(ok, "{last}\n{}", logs_of(&dirs));
        let users: Vec<&str> = last["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["key"].as_str())
            .collect();
        assert!(
            users.iter().any(|u| u.contains("alice")) && users.iter().any(|u| u.contains("bob")),
            "{last}"
        );
    }
}

/// `n` gateways in cluster mode with a workspace `ws` in their directory and `extra` config.
async fn nodes_with_workspace(
    n: usize,
    nats: &Nats,
    llm: &FakeLlm,
    extra: Value,
) -> (Vec<tempfile::TempDir>, Vec<Daemon>) {
    let mut dirs = Vec::new();
    let mut out = Vec::new();
    for i in 1..=n {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ws")).unwrap();
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
        out.push(Daemon::start(dir.path(), &cfg, port).await);
        dirs.push(dir);
    }
    (dirs, out)
}

fn exec_call(id: &str, command: &str) -> Reply {
    Reply::ToolCalls(vec![(
        id.into(),
        "exec_shell".into(),
        json!({ "command": command }).to_string(),
    )])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_asked_on_one_node_is_answered_on_another_and_always_moves() {
    let Some(nats) = Nats::start(3).await else {
        return;
    };
    let llm = FakeLlm::start().await;
    let (dirs, nodes) = nodes_with_workspace(
        2,
        &nats,
        &llm,
        json!({"tools": {"exec": {"mode": "ask", "approval_timeout_secs": 30}}}),
    )
    .await;
    // Node 1's session asks.
    llm.push(exec_call("c1", "echo one > one.txt"));
    llm.push(Reply::Text("ran one".into()));
    let api = nodes[0].api.clone();
    let asking = tokio::spawn(async move { api.chat("asker", "make one").await });

    // Node 2 lists it, with the node where it waits, and approves it "always".
    let mut id = String::new();
    let listed = wait_until(T, || {
        let v = weft_on(&dirs[1], &["approvals", "list"]);
        let found = v["approvals"].as_array().and_then(|a| {
            a.iter()
                .find(|a| a["state"] == "pending" && a["node"] == "n1")
                .cloned()
        });
        if let Some(a) = found {
            assert_eq!(a["session"], "http:asker", "{a}");
            assert!(a["command"].as_str().unwrap().contains("one.txt"), "{a}");
            id = a["id"].as_str().unwrap().to_string();
            true
        } else {
            false
        }
    })
    .await;
    assert!(
        listed,
        "node 2 does not list node 1's approval\n{}",
        logs_of(&dirs)
    );
    let v = weft_on(&dirs[1], &["approvals", "approve", &id, "--always"]);
    assert!(
        v["answered"].as_str().unwrap().contains("asked on node n1"),
        "{v}"
    );
    let (s, v) = tokio::time::timeout(T, asking).await.unwrap().unwrap();
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["reply"], "ran one", "{v}");
    assert!(dirs[0].path().join("ws/one.txt").exists());
    // Answered: no node lists it as pending any more.
    for d in &dirs {
        let v = weft_on(d, &["approvals", "list"]);
        assert!(
            !v["approvals"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["state"] == "pending"),
            "{v}"
        );
    }

    // The same session on node 2 runs the command without asking.
    llm.push(exec_call("c2", "echo one > one.txt"));
    llm.push(Reply::Text("ran it again".into()));
    let (s, v) = tokio::time::timeout(Duration::from_secs(20), nodes[1].api.chat("asker", "again"))
        .await
        .expect("node 2 asked again (waited for an answer)");
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["reply"], "ran it again", "{v}");
    assert!(dirs[1].path().join("ws/one.txt").exists());
    let v = weft_on(&dirs[1], &["approvals", "list"]);
    assert!(
        !v["approvals"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["node"].is_null()),
        "node 2 asked: {v}"
    );
    // Another command is still asked.
    llm.push(exec_call("c3", "echo two > two.txt"));
    llm.push(Reply::Text("not run".into()));
    let api = nodes[1].api.clone();
    let asking = tokio::spawn(async move { api.chat("asker", "make two").await });
    let mut id = String::new();
    assert!(
        wait_until(T, || {
            let v = weft_on(&dirs[0], &["approvals", "list"]);
            match v["approvals"].as_array().and_then(|a| {
                a.iter()
                    .find(|a| a["state"] == "pending" && a["node"] == "n2")
                    .cloned()
            }) {
                Some(a) => {
                    id = a["id"].as_str().unwrap().to_string();
                    true
                }
                None => false,
            }
        })
        .await,
        "{}",
        logs_of(&dirs)
    );
    let v = weft_on(&dirs[0], &["approvals", "deny", &id]);
    assert!(v["answered"].as_str().unwrap().contains("Denied"), "{v}");
    let (s, v) = tokio::time::timeout(T, asking).await.unwrap().unwrap();
    assert_eq!(s, 200, "{v}");
    assert!(!dirs[1].path().join("ws/two.txt").exists());
}
