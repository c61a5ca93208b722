//! Nodes: a gateway and two real `weft node` hosts (separate homes) on loopback. Pairing needs
//! approval; `run` answers from the node's own workspace and cannot read its configuration; a
//! file written on a node is read back; revoking cuts a node off mid-command; kill -9 of a
//! node mid-command gives the model an error within the timeout; an unknown key, a wrong key,
//! a replayed handshake, a skewed clock and a node sending commands are refused.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures::{SinkExt as _, StreamExt as _};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::common::{config_value, test_env, tool_results, Api, TestGateway};
use crate::fake_llm::{FakeLlm, Reply};
use crate::process::weft;
use clawft::tools::nodes::{NodeCallError, NodeControl};

const T: Duration = Duration::from_secs(30);
/// Only in the node's configuration: must never reach the gateway.
const NODE_SECRET: &str = "sk-node-only-secret-7f3a91";

pub(crate) struct Node {
    child: Child,
    dir: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    fn ws(&self) -> PathBuf {
        self.dir.join("ws")
    }
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("node.log")).unwrap_or_default()
    }
}

/// A node host: its own HOME, config (holding [`NODE_SECRET`]) and workspace.
pub(crate) fn start_node(dir: &Path, llm: &str, gateway: &str, name: &str) -> Node {
    start_node_with(dir, llm, gateway, name, &[], None)
}

/// [`start_node`] with more options, and `bin` first on its `PATH`.
fn start_node_with(
    dir: &Path,
    llm: &str,
    gateway: &str,
    name: &str,
    extra: &[&str],
    bin: Option<&Path>,
) -> Node {
    std::fs::create_dir_all(dir.join(".clawft")).unwrap();
    let cfg = config_value(
        llm,
        dir,
        json!({"providers": {"openai": {"api_key": NODE_SECRET}}}),
    );
    let path = dir.join(".clawft/config.json");
    std::fs::write(&path, cfg.to_string()).unwrap();
    let log = std::fs::File::create(dir.join("node.log")).unwrap();
    let mut cmd = weft(dir);
    if let Some(bin) = bin {
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        cmd.env("PATH", path);
    }
    let child = cmd
        .arg("--config")
        .arg(&path)
        .args(["node", "--gateway", gateway, "--name", name, "--workspace"])
        .arg(dir.join("ws"))
        .args(extra)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    Node {
        child,
        dir: dir.to_path_buf(),
    }
}

async fn admin(api: &Api, cmd: &str, body: Value) -> Value {
    let r = api
        .http
        .post(format!("{}/v1/admin/{cmd}", api.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let v: Value = r.json().await.unwrap();
    assert!(status.is_success(), "{cmd}: {status} {v}");
    v
}

async fn node_row(api: &Api, name: &str) -> Option<Value> {
    admin(api, "nodes/list", Value::Null).await["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .cloned()
}

/// Wait until the row of node `name` satisfies `f`.
async fn wait_row(api: &Api, name: &str, f: impl Fn(&Value) -> bool, why: &str) -> Value {
    let deadline = Instant::now() + T;
    loop {
        if let Some(r) = node_row(api, name).await.filter(|r| f(r)) {
            return r;
        }
        assert!(Instant::now() < deadline, "{why}: {name}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_file(p: &Path) {
    let deadline = Instant::now() + T;
    while !p.exists() {
        assert!(Instant::now() < deadline, "{} never appeared", p.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn hub(gw: &TestGateway) -> Arc<dyn NodeControl> {
    gw.gateway.daemon.nodes_slot().get().unwrap().clone()
}

async fn gateway(llm: &FakeLlm, dir: &Path) -> (TestGateway, PathBuf) {
    let v = config_value(
        &llm.base_url(),
        dir,
        json!({"tools": {"policy": {"also_allow": ["nodes"]}}}),
    );
    let path = dir.join("gateway.json");
    std::fs::write(&path, v.to_string()).unwrap();
    let config = clawft::config::Config::from_str(&v.to_string(), false, &test_env(dir)).unwrap();
    (TestGateway::start(config).await, path)
}

fn url(gw: &TestGateway) -> String {
    format!("ws://{}", gw.gateway.http_addr.unwrap())
}

/// `weft nodes ACTION ID --json` against the running gateway, as the operator runs it.
fn cli(dir: &Path, cfg: &Path, args: &[&str]) -> Value {
    let out = weft(dir)
        .arg("--config")
        .arg(cfg)
        .arg("nodes")
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "weft nodes {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_pair_run_share_files_and_are_cut_off() {
    let tmp = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let gdir = tmp.path().join("gw");
    std::fs::create_dir_all(&gdir).unwrap();
    let (gw, gcfg) = gateway(&llm, &gdir).await;
    let nodes = hub(&gw);
    let alpha = start_node(
        &tmp.path().join("alpha"),
        &llm.base_url(),
        &url(&gw),
        "alpha",
    );
    let beta = start_node(&tmp.path().join("beta"), &llm.base_url(), &url(&gw), "beta");

    // Pairing needs approval: both wait, pending, with a fingerprint; no call reaches them.
    for n in ["alpha", "beta"] {
        let r = wait_row(
            &gw.api,
            n,
            |r| r["state"] == "pending",
            "never asked to pair",
        )
        .await;
        assert!(r["fingerprint"].as_str().unwrap().starts_with("SHA256:"));
        assert_eq!(r["online"], false);
    }
    let e = nodes
        .call("alpha", "info", json!({}), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, NodeCallError::Unknown { node, .. } if node == "alpha"),
        "{e}"
    );
    let listed = cli(&gdir, &gcfg, &["list"]);
    assert_eq!(listed["nodes"].as_array().unwrap().len(), 2, "{listed}");
    for n in ["alpha", "beta"] {
        let id = node_row(&gw.api, n).await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        let v = cli(&gdir, &gcfg, &["approve", &id]);
        assert_eq!(v["state"], "approved", "{v}");
        wait_row(&gw.api, n, |r| r["online"] == true, "never came online").await;
    }

    // `run` answers from the node's own workspace, in its jail.
    let out = nodes
        .call(
            "alpha",
            "run",
            json!({"command": "echo from-alpha > made.txt; pwd; cat made.txt"}),
            T,
        )
        .await
        .unwrap();
    assert!(out.contains("from-alpha"), "{out}");
    assert!(
        out.contains(alpha.ws().to_str().unwrap()),
        "not run in alpha's workspace: {out}"
    );
    assert_eq!(
        std::fs::read_to_string(alpha.ws().join("made.txt")).unwrap(),
        "from-alpha\n"
    );
    assert!(!beta.ws().join("made.txt").exists());
    // The node's configuration (and its secret) stays out of reach.
    let node_cfg = alpha.dir.join(".clawft/config.json");
    for cmd in [
        format!("cat {}", node_cfg.display()),
        "cat ../.clawft/config.json".to_string(),
    ] {
        let r = nodes
            .call("alpha", "run", json!({"command": cmd}), T)
            .await
            .unwrap_or_else(|e| e.to_string());
        assert!(!r.contains(NODE_SECRET), "the node's secret leaked: {r}");
    }
    let r = nodes
        .call(
            "alpha",
            "read",
            json!({"path": "../.clawft/config.json"}),
            T,
        )
        .await;
    assert!(r.is_err(), "read outside the workspace: {r:?}");
    assert!(!format!("{r:?}").contains(NODE_SECRET));

    // A file written on one node is read back, and lands only there.
    nodes
        .call(
            "beta",
            "write",
            json!({"path": "notes/todo.txt", "content": "buy milk"}),
            T,
        )
        .await
        .unwrap();
    let back = nodes
        .call("beta", "read", json!({"path": "notes/todo.txt"}), T)
        .await
        .unwrap();
    assert!(back.contains("buy milk"), "{back}");
    assert!(beta.ws().join("notes/todo.txt").exists());
    assert!(!alpha.ws().join("notes").exists());
    let ls = nodes
        .call("beta", "list", json!({"path": "notes"}), T)
        .await
        .unwrap();
    assert!(ls.contains("todo.txt"), "{ls}");
    let info = nodes.call("beta", "info", json!({}), T).await.unwrap();
    assert!(info.contains("\"name\":\"beta\""), "{info}");

    // Revoke cuts alpha off mid-command: the call fails at once, the command is killed there.
    let started = alpha.ws().join("started");
    let call = {
        let nodes = nodes.clone();
        tokio::spawn(async move {
            let t0 = Instant::now();
            let r = nodes
                .call(
                    "alpha",
                    "run",
                    json!({"command": "touch started; sleep 3; touch finished"}),
                    T,
                )
                .await;
            (r, t0.elapsed())
        })
    };
    wait_file(&started).await;
    let id = node_row(&gw.api, "alpha").await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    cli(&gdir, &gcfg, &["revoke", &id]);
    let (r, took) = call.await.unwrap();
    let e = r.unwrap_err();
    assert!(
        matches!(
            e,
            NodeCallError::DroppedCall(_) | NodeCallError::Disconnected(_)
        ),
        "{e}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    // Its next connection is a new request, not a session.
    wait_row(
        &gw.api,
        "alpha",
        |r| r["state"] == "pending",
        "revoked node not back to pending",
    )
    .await;
    assert_eq!(node_row(&gw.api, "alpha").await.unwrap()["online"], false);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        !alpha.ws().join("finished").exists(),
        "the command outlived the revoked connection\n{}",
        alpha.log()
    );

    // kill -9 of beta mid-command: the model gets a clear error well within the timeout.
    llm.push(Reply::ToolCalls(vec![(
        "c1".into(),
        "nodes".into(),
        json!({"action": "run", "node": "beta", "command": "touch started; sleep 25", "timeout": 40})
            .to_string(),
    )]));
    llm.push(Reply::Text("done".into()));
    let chat = {
        let api = gw.api.clone();
        tokio::spawn(async move {
            let t0 = Instant::now();
            let r = api.chat("n1", "run it on beta").await;
            (r, t0.elapsed())
        })
    };
    wait_file(&beta.ws().join("started")).await;
    let mut beta = beta;
    beta.child.kill().unwrap(); // SIGKILL
    beta.child.wait().unwrap();
    let ((status, _), took) = chat.await.unwrap();
    assert_eq!(status, 200);
    assert!(took < Duration::from_secs(15), "{took:?}");
    let reqs = llm.requests();
    let results = tool_results(reqs.last().unwrap());
    let (_, content) = results.iter().find(|(id, _)| id == "c1").unwrap();
    let text = content.to_string();
    assert!(text.contains("disconnected"), "{text}");
    gw.stop().await;
    // No secret of the gateway reached a node: its provider key is nowhere in what the nodes
    // wrote (their workspaces, state and logs).
    for n in [&alpha, &beta] {
        let seen = crate::common::bytes_under(&n.ws())
            + &crate::common::bytes_under(&n.dir.join(".clawft/node"))
            + &n.log();
        assert!(
            !seen.contains("sk-test-secret-123456"),
            "the gateway's key reached a node"
        );
    }
}

/// One raw handshake: the refusal or welcome frame the gateway answered.
async fn handshake(
    url: &str,
    key: &ring::signature::Ed25519KeyPair,
    sign_with: &ring::signature::Ed25519KeyPair,
    skew_ms: i64,
    replay: Option<Value>,
) -> (Value, Value, Value) {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("{url}/v1/nodes/connect"))
        .await
        .unwrap();
    let Some(Ok(Message::Text(t))) = ws.next().await else {
        panic!("no challenge")
    };
    let ch: Value = serde_json::from_str(t.as_str()).unwrap();
    let hello = replay.unwrap_or_else(|| {
        let ts = (clawft_channel_core::now_ms() as i64 + skew_ms) as u64;
        let offers = vec!["info".to_string()];
        let text = clawft::admin::nodes::signed_text(
            ch["nonce"].as_str().unwrap(),
            ch["session"].as_str().unwrap(),
            ts,
            "raw",
            &offers,
        );
        let b64 = base64::engine::general_purpose::STANDARD;
        json!({"type": "hello", "key": b64.encode(ring::signature::KeyPair::public_key(key)),
               "name": "raw", "offers": offers, "ts_ms": ts,
               "sig": b64.encode(sign_with.sign(text.as_bytes()))})
    });
    ws.send(Message::Text(hello.to_string().into()))
        .await
        .unwrap();
    let answer: Value = match ws.next().await {
        Some(Ok(Message::Text(t))) => serde_json::from_str(t.as_str()).unwrap(),
        other => panic!("no answer: {other:?}"),
    };
    // After a welcome, a node that sends a command instead of a result is disconnected.
    let after = if answer["type"] == "welcome" {
        ws.send(Message::Text(
            json!({"type": "call", "id": 1, "op": "run", "args": {}})
                .to_string()
                .into(),
        ))
        .await
        .unwrap();
        let mut closed = json!("open");
        let deadline = Instant::now() + T;
        while Instant::now() < deadline {
            if let Ok(Some(Ok(Message::Close(_))) | None | Some(Err(_))) =
                tokio::time::timeout(Duration::from_secs(5), ws.next()).await
            {
                closed = json!("closed");
                break;
            }
        }
        closed
    } else {
        Value::Null
    };
    (hello, answer, after)
}

#[tokio::test]
async fn unknown_wrong_replayed_and_skewed_handshakes_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let (gw, _) = gateway(&llm, tmp.path()).await;
    let url = format!("ws://{}", gw.gateway.http_addr.unwrap());
    let rng = ring::rand::SystemRandom::new();
    let mk = || {
        ring::signature::Ed25519KeyPair::from_pkcs8(
            ring::signature::Ed25519KeyPair::generate_pkcs8(&rng)
                .unwrap()
                .as_ref(),
        )
        .unwrap()
    };
    let (key, other) = (mk(), mk());

    // Unknown key: a pending request with its fingerprint, not a session.
    let (_, a, _) = handshake(&url, &key, &key, 0, None).await;
    assert_eq!(a["reason"], "pending", "{a}");
    let id = a["id"].as_str().unwrap().to_string();
    assert!(a["fingerprint"].as_str().unwrap().starts_with("SHA256:"));
    admin(&gw.api, "nodes/approve", json!({"id": id})).await;

    // Approved: welcome; sending a command instead of a result ends the connection.
    let (hello, a, after) = handshake(&url, &key, &key, 0, None).await;
    assert_eq!(a["type"], "welcome", "{a}");
    assert_eq!(after, "closed");

    // That hello replayed on a new connection: refused (another challenge).
    let (_, a, _) = handshake(&url, &key, &key, 0, Some(hello)).await;
    assert_eq!(a["reason"], "bad_signature", "{a}");
    // The approved public key, signed by another key: refused.
    let (_, a, _) = handshake(&url, &key, &other, 0, None).await;
    assert_eq!(a["reason"], "bad_signature", "{a}");
    // A clock 10 minutes off: refused.
    let (_, a, _) = handshake(&url, &key, &key, 600_000, None).await;
    assert_eq!(a["reason"], "clock_skew", "{a}");
    // Denied: refused for good.
    admin(&gw.api, "nodes/deny", json!({"id": id})).await;
    let (_, a, _) = handshake(&url, &key, &key, 0, None).await;
    assert_eq!(a["reason"], "denied", "{a}");
    // Anyone can ask, so the waiting requests are bounded: past the cap a new key is refused
    // and nothing more is stored; a known key still gets its answer.
    for _ in 0..clawft::admin::nodes::MAX_PENDING {
        let k = mk();
        let (_, a, _) = handshake(&url, &k, &k, 0, None).await;
        assert_eq!(a["reason"], "pending", "{a}");
    }
    let k = mk();
    let (_, a, _) = handshake(&url, &k, &k, 0, None).await;
    assert_eq!(a["reason"], "busy", "{a}");
    let listed = admin(&gw.api, "nodes/list", Value::Null).await;
    assert_eq!(
        listed["nodes"].as_array().unwrap().len(),
        clawft::admin::nodes::MAX_PENDING + 1
    );
    let (_, a, _) = handshake(&url, &key, &key, 0, None).await;
    assert_eq!(a["reason"], "denied", "{a}");
    gw.stop().await;
}

#[test]
fn a_clear_text_gateway_url_off_this_machine_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = weft(tmp.path())
        .args(["node", "--gateway", "ws://192.0.2.7:8080"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("wss://"), "{err}");
    // No key was sent anywhere, and none was even made.
    assert!(!tmp.path().join(".clawft/node/node.key").exists());
}

/// The node chooses what it offers and the gateway cannot widen it; a gateway restart keeps
/// the pairing (the node reconnects and is served without a new approval).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_offers_only_what_it_chose_and_stays_paired_across_a_gateway_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let gdir = tmp.path().join("gw");
    std::fs::create_dir_all(&gdir).unwrap();
    let port = crate::process::free_port();
    let v = config_value(
        &llm.base_url(),
        &gdir,
        json!({"tools": {"policy": {"also_allow": ["nodes"]}},
               "channels": {"http": {"bind": format!("127.0.0.1:{port}")}}}),
    );
    let config =
        || clawft::config::Config::from_str(&v.to_string(), false, &test_env(&gdir)).unwrap();
    let gw = TestGateway::start(config()).await;
    let ndir = tmp.path().join("ro");
    std::fs::create_dir_all(ndir.join(".clawft")).unwrap();
    std::fs::write(
        ndir.join(".clawft/config.json"),
        // Set in the `[node]` section this time, not on the command line.
        config_value(
            &llm.base_url(),
            &ndir,
            json!({"node": {"gateway": format!("ws://localhost:{port}"), "name": "ro",
                            "offer": ["info", "read"], "workspace": ndir.join("ws")}}),
        )
        .to_string(),
    )
    .unwrap();
    let log = std::fs::File::create(ndir.join("node.log")).unwrap();
    let child = weft(&ndir)
        .arg("--config")
        .arg(ndir.join(".clawft/config.json"))
        .arg("node")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let node = Node { child, dir: ndir };
    let r = wait_row(&gw.api, "ro", |r| r["state"] == "pending", "never asked").await;
    assert_eq!(r["offers"], json!(["info", "read"]));
    // The key file is the node's alone.
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(node.dir.join(".clawft/node/node.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    admin(&gw.api, "nodes/approve", json!({"id": r["id"]})).await;
    wait_row(&gw.api, "ro", |r| r["online"] == true, "never online").await;
    let nodes = hub(&gw);
    std::fs::write(node.ws().join("a.txt"), "alpha").unwrap();
    for (op, args) in [
        ("run", json!({"command": "touch pwned"})),
        ("write", json!({"path": "b.txt", "content": "x"})),
    ] {
        let e = nodes.call("ro", op, args, T).await.unwrap_err();
        assert!(matches!(e, NodeCallError::NotOffered { .. }), "{op}: {e}");
    }
    assert!(!node.ws().join("pwned").exists() && !node.ws().join("b.txt").exists());
    let a = nodes
        .call("ro", "read", json!({"path": "a.txt"}), T)
        .await
        .unwrap();
    assert!(a.contains("alpha"), "{a}");

    // Restart: the pairing is in the store; the node comes back by itself.
    drop(nodes);
    gw.stop().await;
    let gw = TestGateway::start(config()).await;
    let r = wait_row(
        &gw.api,
        "ro",
        |r| r["online"] == true,
        "not back after restart",
    )
    .await;
    assert_eq!(r["state"], "approved");
    let a = hub(&gw)
        .call("ro", "read", json!({"path": "a.txt"}), T)
        .await
        .unwrap();
    assert!(a.contains("alpha"), "{a}\n{}", node.log());
    gw.stop().await;
}

/// In `ask` mode a command on a node is put to a person like a local one: approved it runs on
/// the node, denied it does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_on_nodes_wait_for_approval_in_ask_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let gdir = tmp.path().join("gw");
    std::fs::create_dir_all(&gdir).unwrap();
    let v = config_value(
        &llm.base_url(),
        &gdir,
        json!({"tools": {"policy": {"also_allow": ["nodes"]}, "exec": {"mode": "ask", "approval_timeout_secs": 20}},
               "agents": {"defaults": {"nodes": ["asked"]}}}),
    );
    let gw = TestGateway::start(
        clawft::config::Config::from_str(&v.to_string(), false, &test_env(&gdir)).unwrap(),
    )
    .await;
    let node = start_node(&tmp.path().join("n"), &llm.base_url(), &url(&gw), "asked");
    let r = wait_row(&gw.api, "asked", |r| r["state"] == "pending", "never asked").await;
    admin(&gw.api, "nodes/approve", json!({"id": r["id"]})).await;
    wait_row(&gw.api, "asked", |r| r["online"] == true, "never online").await;
    for (decision, file) in [("approve", "yes.txt"), ("deny", "no.txt")] {
        llm.push(Reply::ToolCalls(vec![(
            format!("c-{decision}"),
            "nodes".into(),
            json!({"action": "run", "node": "asked", "command": format!("echo hi > {file}")})
                .to_string(),
        )]));
        llm.push(Reply::Text("done".into()));
        let chat = {
            let api = gw.api.clone();
            tokio::spawn(async move { api.chat("asker", "run it").await })
        };
        let deadline = Instant::now() + T;
        let id = loop {
            let v = admin(&gw.api, "approvals/list", json!({})).await;
            let pending = v["approvals"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["state"] == "pending" && a.to_string().contains("[on node asked]"));
            if let Some(a) = pending {
                break a["id"].as_str().unwrap().to_string();
            }
            assert!(Instant::now() < deadline, "no approval asked: {v}");
            assert!(!node.ws().join(file).exists(), "ran before approval");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        admin(
            &gw.api,
            "approvals/answer",
            json!({"id": id, "decision": decision}),
        )
        .await;
        let (status, _) = chat.await.unwrap();
        assert_eq!(status, 200);
        let reqs = llm.requests();
        let results = tool_results(reqs.last().unwrap());
        let (_, content) = results
            .iter()
            .find(|(id, _)| *id == format!("c-{decision}"))
            .unwrap();
        if decision == "approve" {
            assert!(node.ws().join(file).exists(), "{content}");
        } else {
            assert!(!node.ws().join(file).exists());
            assert!(content.to_string().contains("not approved"), "{content}");
        }
    }
    // "always": the same command on the same node is not asked again in this session (as for
    // a local command); another command still is.
    let cmd = "echo again >> always.txt";
    let run = |id: &str, command: &str| {
        llm.push(Reply::ToolCalls(vec![(
            id.to_string(),
            "nodes".into(),
            json!({"action": "run", "node": "asked", "command": command}).to_string(),
        )]));
        llm.push(Reply::Text("done".into()));
        let api = gw.api.clone();
        tokio::spawn(async move { api.chat("asker", "run it").await })
    };
    let pending_for = |needle: &'static str| {
        let api = gw.api.clone();
        async move {
            let deadline = Instant::now() + T;
            loop {
                let v = admin(&api, "approvals/list", json!({})).await;
                let hit = v["approvals"].as_array().unwrap().iter().find(|a| {
                    a["state"] == "pending" && a["command"].as_str().unwrap_or("").contains(needle)
                });
                if let Some(a) = hit {
                    break a["id"].as_str().unwrap().to_string();
                }
                assert!(Instant::now() < deadline, "no approval asked: {v}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let chat = run("c-always", cmd);
    let id = pending_for("always.txt").await;
    admin(
        &gw.api,
        "approvals/answer",
        json!({"id": id, "decision": "always"}),
    )
    .await;
    assert_eq!(chat.await.unwrap().0, 200);
    let asked_before = admin(&gw.api, "approvals/list", json!({})).await["approvals"]
        .as_array()
        .unwrap()
        .len();
    // Again, spelled with the node's id and extra spaces: it runs without a question.
    llm.push(Reply::ToolCalls(vec![(
        "c-again".into(),
        "nodes".into(),
        json!({"action": "run", "node": r["id"], "command": format!("  {cmd} ")}).to_string(),
    )]));
    llm.push(Reply::Text("done".into()));
    let (status, _) = gw.api.chat("asker", "again").await;
    assert_eq!(status, 200);
    assert_eq!(
        std::fs::read_to_string(node.ws().join("always.txt")).unwrap(),
        "again\nagain\n"
    );
    assert_eq!(
        admin(&gw.api, "approvals/list", json!({})).await["approvals"]
            .as_array()
            .unwrap()
            .len(),
        asked_before,
        "asked again"
    );
    // Another command is still asked (and denied here: it does not run).
    let chat = run("c-new", "echo new > new.txt");
    let id = pending_for("new.txt").await;
    admin(
        &gw.api,
        "approvals/answer",
        json!({"id": id, "decision": "deny"}),
    )
    .await;
    assert_eq!(chat.await.unwrap().0, 200);
    assert!(!node.ws().join("new.txt").exists());
    // A second node, approved, but not among this agent's nodes: refused without a question.
    let other = start_node(&tmp.path().join("o"), &llm.base_url(), &url(&gw), "other");
    let r = wait_row(&gw.api, "other", |r| r["state"] == "pending", "never asked").await;
    admin(&gw.api, "nodes/approve", json!({"id": r["id"]})).await;
    wait_row(&gw.api, "other", |r| r["online"] == true, "never online").await;
    llm.push(Reply::ToolCalls(vec![
        (
            "c-other".into(),
            "nodes".into(),
            json!({"action": "run", "node": "other", "command": "echo hi > x.txt"}).to_string(),
        ),
        (
            "c-list".into(),
            "nodes".into(),
            json!({"action": "list"}).to_string(),
        ),
    ]));
    llm.push(Reply::Text("done".into()));
    let (status, _) = gw.api.chat("asker", "run it on other").await;
    assert_eq!(status, 200);
    let reqs = llm.requests();
    let results = tool_results(reqs.last().unwrap());
    let text = |id: &str| results.iter().find(|(i, _)| i == id).unwrap().1.to_string();
    assert!(
        text("c-other").contains("not among the nodes"),
        "{}",
        text("c-other")
    );
    assert!(!other.ws().join("x.txt").exists());
    assert!(
        text("c-list").contains("asked") && !text("c-list").contains("other"),
        "{}",
        text("c-list")
    );
    gw.stop().await;
}

/// A TLS front for gateways, as an operator's reverse proxy is: it terminates TLS with the
/// test certificate (signed by the test authority in `tests/fixtures/tls`) and forwards the
/// bytes to the gateway it currently points at. Repointing it cuts the open connections.
struct TlsFront {
    addr: std::net::SocketAddr,
    upstream: Arc<std::sync::Mutex<std::net::SocketAddr>>,
    cut: Arc<std::sync::Mutex<tokio_util::sync::CancellationToken>>,
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tls")
        .join(name)
}

impl TlsFront {
    async fn start(upstream: std::net::SocketAddr) -> Self {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(fixture("gateway.pem"))
                .unwrap()
                .map(Result::unwrap)
                .collect();
        let key = PrivateKeyDer::from_pem_file(fixture("gateway.key")).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front = Self {
            addr: listener.local_addr().unwrap(),
            upstream: Arc::new(std::sync::Mutex::new(upstream)),
            cut: Arc::default(),
        };
        let (up, cut) = (front.upstream.clone(), front.cut.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, to) = (acceptor.clone(), *up.lock().unwrap());
                let cut = cut.lock().unwrap().clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Ok(mut back) = tokio::net::TcpStream::connect(to).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut tls, &mut back) => {}
                        () = cut.cancelled() => {}
                    }
                });
            }
        });
        front
    }

    fn url(&self) -> String {
        format!("wss://localhost:{}", self.addr.port())
    }

    /// Forward to `to` from now on, cutting the connections open to the previous gateway.
    fn repoint(&self, to: std::net::SocketAddr) {
        *self.upstream.lock().unwrap() = to;
        let old = std::mem::take(&mut *self.cut.lock().unwrap());
        old.cancel();
    }
}

async fn approve(api: &Api, name: &str) {
    let r = wait_row(
        api,
        name,
        |r| r["state"] == "pending",
        "never asked to pair",
    )
    .await;
    admin(api, "nodes/approve", json!({"id": r["id"]})).await;
}

async fn wait_log(node: &Node, needle: &str) {
    assert!(
        crate::common::wait_until(T, || node.log().contains(needle)).await,
        "`{needle}` never logged:\n{}",
        node.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reaches_its_gateway_through_tls_and_pins_its_key() {
    let tmp = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let (adir, bdir) = (tmp.path().join("gw-a"), tmp.path().join("gw-b"));
    std::fs::create_dir_all(&adir).unwrap();
    std::fs::create_dir_all(&bdir).unwrap();
    let (a, _) = gateway(&llm, &adir).await;
    let front = TlsFront::start(a.gateway.http_addr.unwrap()).await;
    let ca = fixture("ca.pem");
    let ca = ca.to_str().unwrap();

    // A node that does not trust the test authority never gets past TLS: no request reaches
    // the gateway.
    let stranger = start_node(
        &tmp.path().join("stranger"),
        &llm.base_url(),
        &front.url(),
        "stranger",
    );
    wait_log(&stranger, "certificate").await;
    drop(stranger);
    assert!(node_row(&a.api, "stranger").await.is_none());

    // Trusting it (--gateway-ca), the node pairs through TLS and serves.
    let node = start_node_with(
        &tmp.path().join("tls"),
        &llm.base_url(),
        &front.url(),
        "tls",
        &["--gateway-ca", ca],
        None,
    );
    approve(&a.api, "tls").await;
    wait_row(&a.api, "tls", |r| r["online"] == true, "never came online").await;
    let out = hub(&a)
        .call("tls", "run", json!({"command": "echo over-tls"}), T)
        .await
        .unwrap();
    assert!(out.contains("over-tls"), "{out}");
    // It pinned this gateway's key, the one `weft nodes list` shows on the gateway.
    let a_fp = admin(&a.api, "nodes/list", Value::Null).await["gateway_fingerprint"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(a_fp.starts_with("SHA256:"), "{a_fp}");
    let pin = std::fs::read_to_string(node.dir.join(".clawft/node/gateway.pin")).unwrap();
    assert_eq!(pin.trim(), a_fp);

    // Another gateway behind the same address (a hijacked DNS name, a reinstalled server)
    // has another key: even once its operator approves the node, the node refuses to serve
    // it and stops, saying why.
    let (b, _) = gateway(&llm, &bdir).await;
    front.repoint(b.gateway.http_addr.unwrap());
    approve(&b.api, "tls").await;
    wait_log(&node, "the gateway's key changed").await;
    let mut node = node;
    let mut status = None;
    assert!(
        crate::common::wait_until(T, || {
            status = node.child.try_wait().unwrap();
            status.is_some()
        })
        .await,
        "the node kept running"
    );
    assert!(!status.unwrap().success());
    wait_row(&b.api, "tls", |r| r["online"] == false, "still online on B").await;
    let e = hub(&b)
        .call("tls", "run", json!({"command": "echo hijacked"}), T)
        .await
        .unwrap_err();
    assert!(matches!(e, NodeCallError::Offline(_)), "{e}");
    assert!(!node.log().contains("hijacked"));
    assert_eq!(
        std::fs::read_to_string(node.dir.join(".clawft/node/gateway.pin"))
            .unwrap()
            .trim(),
        a_fp,
        "the pin must not move"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_reaches_the_nodes_desktop_notifier() {
    let tmp = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let gdir = tmp.path().join("gw");
    std::fs::create_dir_all(&gdir).unwrap();
    let (gw, _) = gateway(&llm, &gdir).await;
    // The desktop's `notify-send`, as libnotify's: options, `--`, then title and text; it
    // records what it would show.
    let ndir = tmp.path().join("desk");
    let bin = ndir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let shown = ndir.join("shown.txt");
    let script = bin.join("notify-send");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do printf '%s|' \"$a\"; done >> {0}\necho >> {0}\n",
            shown.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let _desk = start_node_with(&ndir, &llm.base_url(), &url(&gw), "desk", &[], Some(&bin));
    // The notifier is there, but this node's operator left `notify` out of its offer.
    let _quiet = start_node_with(
        &tmp.path().join("quiet"),
        &llm.base_url(),
        &url(&gw),
        "quiet",
        &["--offer", "info,run"],
        Some(&bin),
    );
    // Without a notifier a node does not offer it; this one has one.
    let _server = start_node(
        &tmp.path().join("server"),
        &llm.base_url(),
        &url(&gw),
        "server",
    );
    approve(&gw.api, "desk").await;
    approve(&gw.api, "server").await;
    approve(&gw.api, "quiet").await;
    wait_row(&gw.api, "quiet", |r| r["online"] == true, "quiet offline").await;
    let desk = wait_row(&gw.api, "desk", |r| r["online"] == true, "desk offline").await;
    let server = wait_row(&gw.api, "server", |r| r["online"] == true, "server offline").await;
    assert!(
        desk["offers"]
            .as_array()
            .unwrap()
            .contains(&json!("notify")),
        "{desk}"
    );
    assert!(
        !server["offers"]
            .as_array()
            .unwrap()
            .contains(&json!("notify")),
        "{server}"
    );

    // The model asks for a notification; it reaches the desktop's notifier.
    llm.push(Reply::ToolCalls(vec![(
        "n1".into(),
        "nodes".into(),
        json!({"action": "notify", "node": "desk", "title": "Backup", "message": "The backup finished", "urgency": "critical"})
            .to_string(),
    )]));
    // Hostile text: shell syntax and option-looking words arrive as text and run nothing.
    let canary = tmp.path().join("canary");
    let hostile_title = "-v --version";
    let hostile_text = format!(
        "$(touch {0}) `touch {0}`; touch {0} --help",
        canary.display()
    );
    llm.push(Reply::ToolCalls(vec![(
        "n-hostile".into(),
        "nodes".into(),
        json!({"action": "notify", "node": "desk", "title": hostile_title, "message": hostile_text})
            .to_string(),
    )]));
    llm.push(Reply::ToolCalls(vec![(
        "n2".into(),
        "nodes".into(),
        json!({"action": "notify", "node": "server", "message": "nobody sees this"}).to_string(),
    )]));
    llm.push(Reply::ToolCalls(vec![
        (
            "n-quiet".into(),
            "nodes".into(),
            json!({"action": "notify", "node": "quiet", "message": "nor this"}).to_string(),
        ),
        (
            "d-quiet".into(),
            "nodes".into(),
            json!({"action": "describe", "node": "quiet"}).to_string(),
        ),
        (
            "d-server".into(),
            "nodes".into(),
            json!({"action": "describe", "node": "server"}).to_string(),
        ),
    ]));
    llm.push(Reply::Text("told you".into()));
    let (status, _) = gw.api.chat("nt", "tell me on my desktop").await;
    assert_eq!(status, 200);
    // Each notification reached the notifier exactly once, its words intact after `--`.
    assert_eq!(
        std::fs::read_to_string(&shown).unwrap(),
        format!(
            "--app-name=weft|--urgency=critical|--|Backup|The backup finished|\n\
             --app-name=weft|--urgency=normal|--|{hostile_title}|{hostile_text}|\n"
        )
    );
    assert!(!canary.exists(), "the hostile text ran a command");
    let reqs = llm.requests();
    let all: Vec<(String, Value)> = reqs.iter().flat_map(tool_results).collect();
    let text = |id: &str| {
        all.iter()
            .find(|(i, _)| i == id)
            .map(|(_, v)| v.to_string())
            .unwrap_or_else(|| panic!("no result for {id}: {all:?}"))
    };
    assert!(text("n1").contains("notification shown"), "{}", text("n1"));
    assert!(
        text("n2").contains("does not offer `notify`"),
        "{}",
        text("n2")
    );
    assert!(
        text("n-quiet").contains("does not offer `notify`"),
        "{}",
        text("n-quiet")
    );
    assert!(
        text("d-quiet").contains("left out of this node's --offer"),
        "{}",
        text("d-quiet")
    );
    assert!(
        text("d-server").contains("no notify-send on this node's PATH"),
        "{}",
        text("d-server")
    );
}

/// A self-signed certificate for `localhost` and `127.0.0.1` that no test authority signed
/// (another gateway's, or one an attacker made), made with the `openssl` command.
fn other_certificate(dir: &Path) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("other.pem"), dir.join("other.key"));
    let out = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("the openssl command (Debian: apt install openssl)");
    assert!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (cert, key)
}

/// The gateway serves TLS itself (`channels.http.tls_*`): a node pairs and works through
/// `wss://` trusting the test authority; the gateway restarted with a certificate that
/// authority did not sign is refused by the node, which says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_pairs_over_the_gateways_own_tls_and_refuses_another_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let gdir = tmp.path().join("gw");
    std::fs::create_dir_all(&gdir).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = |cert: &Path, key: &Path| {
        let v = config_value(
            &llm.base_url(),
            &gdir,
            json!({"tools": {"policy": {"also_allow": ["nodes"]}},
                   "channels": {"http": {"tls_bind": format!("127.0.0.1:{port}"),
                                         "tls_cert": cert, "tls_key": key}}}),
        );
        clawft::config::Config::from_str(&v.to_string(), false, &test_env(&gdir)).unwrap()
    };
    // A certificate that cannot be read, or a key that is not its own, stops the start with
    // the setting and the reason.
    let (other_cert, other_key) = other_certificate(tmp.path());
    clawft::install_crypto_provider();
    for (cert, key, needle) in [
        (
            tmp.path().join("missing.pem"),
            fixture("gateway.key"),
            "tls_cert",
        ),
        (
            fixture("gateway.pem"),
            other_key.clone(),
            "tls_cert and tls_key",
        ),
    ] {
        let e = clawft::cli::gateway::Gateway::start(Arc::new(config(&cert, &key)))
            .await
            .err()
            .expect("started with a bad certificate")
            .to_string();
        assert!(e.contains(needle), "{e}");
    }
    let gw = TestGateway::start(config(&fixture("gateway.pem"), &fixture("gateway.key"))).await;
    assert_eq!(
        gw.gateway.http_tls_addr.map(|a| a.port()),
        Some(port),
        "no TLS listener"
    );

    // Plain HTTP on the TLS port gets nowhere; HTTPS trusting the test authority is served.
    let ca_pem = std::fs::read(fixture("ca.pem")).unwrap();
    let https = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca_pem).unwrap())
        .build()
        .unwrap();
    let r = https
        .get(format!("https://localhost:{port}/healthz"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    assert!(reqwest::get(format!("http://127.0.0.1:{port}/healthz"))
        .await
        .is_err());

    let node = start_node_with(
        &tmp.path().join("n"),
        &llm.base_url(),
        &format!("wss://localhost:{port}"),
        "tlsnode",
        &["--gateway-ca", fixture("ca.pem").to_str().unwrap()],
        None,
    );
    approve(&gw.api, "tlsnode").await;
    wait_row(&gw.api, "tlsnode", |r| r["online"] == true, "never online").await;
    let out = hub(&gw)
        .call(
            "tlsnode",
            "run",
            json!({"command": "echo over-native-tls"}),
            T,
        )
        .await
        .unwrap();
    assert!(out.contains("over-native-tls"), "{out}");
    assert!(node.dir.join(".clawft/node/gateway.pin").exists());

    // The same gateway (same store, same port) restarted with another certificate: the node
    // does not connect, and its log says why and how to trust the new one.
    gw.stop().await;
    let gw = TestGateway::start(config(&other_cert, &other_key)).await;
    let before = node.log().len();
    assert!(
        crate::common::wait_until(T, || node.log()[before..]
            .contains("the gateway's TLS certificate is not trusted"))
        .await,
        "no refusal logged:\n{}",
        node.log()
    );
    assert!(
        node.log()[before..].contains("--gateway-ca"),
        "{}",
        node.log()
    );
    let r = node_row(&gw.api, "tlsnode").await.unwrap();
    assert_eq!(r["online"], false, "{r}");
    gw.stop().await;
}
