//! Signed inbound webhooks (`POST /v1/hooks/NAME`, docs/webhooks.md): a valid call runs one
//! turn in the configured session; unsigned, badly signed, stale and replayed calls get 401
//! and no turn; a delivery survives `kill -9`.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{config, messages, wait_until, TestGateway};
use crate::fake_llm::{FakeLlm, Reply};
use crate::process::{free_port, gateway_config, log_of, Daemon};

const SECRET: &str = "whsec-test-0123456789";
const T: Duration = Duration::from_secs(20);

fn hooks_config() -> Value {
    json!({"hooks": {"gh": {"secret": SECRET, "session": "http:hooks-gh"}}})
}

/// HMAC-SHA256(secret, "<ts>.<delivery>.<body>") as the caller computes it.
fn signature(secret: &str, ts: &str, delivery: &str, body: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = ring::hmac::sign(&key, format!("{ts}.{delivery}.{body}").as_bytes());
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// POST /v1/hooks/`name` without a bearer token, with the given signature headers.
async fn post(base: &str, name: &str, body: &str, headers: &[(&str, String)]) -> (u16, Value) {
    let mut req = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("{base}/v1/hooks/{name}"))
        .body(body.to_string());
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn signed(ts: i64, delivery: &str, body: &str, secret: &str) -> Vec<(&'static str, String)> {
    let ts = ts.to_string();
    vec![
        ("X-Weft-Timestamp", ts.clone()),
        ("X-Weft-Delivery", delivery.to_string()),
        ("X-Weft-Signature", signature(secret, &ts, delivery, body)),
    ]
}

fn user_texts(req: &Value) -> Vec<String> {
    messages(req)
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test]
async fn signed_webhook_runs_one_turn_and_bad_calls_get_401() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let gw = TestGateway::start(config(&llm, dir.path(), hooks_config())).await;
    let base = gw.api.base.clone();
    let body = r#"{"action":"opened","title":"Fix the build"}"#;

    // Unsigned, badly signed (wrong secret), stale: 401, no turn.
    let (s, v) = post(&base, "gh", body, &[]).await;
    assert_eq!(s, 401, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("x-weft-timestamp"),
        "{v}"
    );
    let (s, v) = post(&base, "gh", body, &signed(now(), "d1", body, "wrong")).await;
    assert_eq!(s, 401, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("bad signature"),
        "{v}"
    );
    let (s, v) = post(&base, "gh", body, &signed(now() - 600, "d1", body, SECRET)).await;
    assert_eq!(s, 401, "{v}");
    assert!(v["error"].as_str().unwrap().contains("stale"), "{v}");
    // A body altered after signing.
    let h = signed(now(), "d1", body, SECRET);
    let (s, _) = post(&base, "gh", r#"{"action":"deleted"}"#, &h).await;
    assert_eq!(s, 401);
    // Unknown hook: 404, whatever the signature.
    let (s, v) = post(&base, "nope", body, &signed(now(), "d1", body, SECRET)).await;
    assert_eq!(s, 404, "{v}");

    // A valid call: 202 with the event id, one turn with the rendered payload.
    llm.push(Reply::Text("PR noted".into()));
    let (s, v) = post(&base, "gh", body, &h).await;
    assert_eq!(s, 202, "{v}");
    assert_eq!(v["event_id"], "hook:gh:d1", "{v}");
    let reqs = llm.wait_requests(1, T).await;
    let users = user_texts(&reqs[0]);
    assert_eq!(users.len(), 1, "{users:?}");
    assert!(
        users[0].contains("external webhook payload"),
        "{}",
        users[0]
    );
    assert!(
        users[0].contains("Webhook gh delivery d1:\n"),
        "{}",
        users[0]
    );
    assert!(users[0].contains(body), "{}", users[0]);

    // The reply lands in the configured session's chat (the HTTP mailbox of hooks-gh).
    let mut got = Value::Null;
    for _ in 0..250 {
        got = gw.api.get("/v1/chats/hooks-gh/messages").await.1;
        if got["messages"][0].is_object() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(got["messages"][0]["content"], "PR noted", "{got}");
    let (s, sess) = gw.api.get("/v1/sessions/http:hooks-gh").await;
    assert_eq!(s, 200, "{sess}");
    assert!(sess.to_string().contains("PR noted"), "{sess}");

    // The same delivery again (freshly signed): replay, 401, still one turn.
    let (s, v) = post(&base, "gh", body, &signed(now(), "d1", body, SECRET)).await;
    assert_eq!(s, 401, "{v}");
    assert_eq!(v["error"], "replayed delivery", "{v}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(llm.requests().len(), 1, "one turn only");

    // Over max_body_bytes (64 KiB by default): 413.
    let big = "x".repeat(64 * 1024 + 1);
    let (s, v) = post(&base, "gh", &big, &signed(now(), "d2", &big, SECRET)).await;
    assert_eq!(s, 413, "{v}");
    gw.stop().await;
}

#[test]
fn hook_config_errors_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let v = crate::common::config_value("http://127.0.0.1:9", dir.path(), json!({}));
    let load = |extra: Value| {
        let v = crate::common::merged(v.clone(), extra);
        clawft::config::Config::from_str(
            &v.to_string(),
            false,
            &crate::common::test_env(dir.path()),
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
    };
    let e = load(json!({"hooks": {"gh": {"session": "http:x"}}})).unwrap_err();
    assert!(e.contains("hooks.gh.secret"), "{e}");
    let e = load(json!({"hooks": {"gh": {"secret": "s", "agent": "ghost"}}})).unwrap_err();
    assert!(e.contains("hooks.gh.agent") && e.contains("ghost"), "{e}");
    let e = load(json!({"hooks": {"gh": {"secret": "s", "session": "a/../b"}}})).unwrap_err();
    assert!(e.contains("hooks.gh.session"), "{e}");
    let e = load(json!({"hooks": {"gh": {"secret_env": "NOPE_SECRET"}}})).unwrap_err();
    assert!(e.contains("hooks.gh.secret_env"), "{e}");
    let e = load(json!({"hooks": {"g h": {"secret": "s"}}})).unwrap_err();
    assert!(e.contains("hooks.g h"), "{e}");
    load(json!({"hooks": {"gh": {"secret": "s"}}})).unwrap();
}

/// The gateway accepts a delivery, is killed with SIGKILL while the model has not answered,
/// restarts: the delivery is answered exactly once.
#[tokio::test]
async fn kill_9_after_a_webhook_was_accepted_answers_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = gateway_config(dir.path(), &llm, port, hooks_config());
    llm.push(Reply::Hang);
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let base = d.api.base.clone();
    let body = r#"{"event":"deploy"}"#;
    let (s, v) = post(&base, "gh", body, &signed(now(), "k1", body, SECRET)).await;
    assert_eq!(s, 202, "{v}");
    assert!(wait_until(T, || llm.requests().len() == 1).await);
    d.kill9();

    llm.push(Reply::Text("deployed".into()));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    assert!(
        wait_until(T, || llm.requests().len() == 2).await,
        "{}",
        log_of(dir.path())
    );
    let users = user_texts(&llm.requests()[1]);
    assert_eq!(users.len(), 1, "{users:?}");
    assert!(users[0].contains(body), "{users:?}");
    let mut got = Value::Null;
    for _ in 0..250 {
        got = d.api.get("/v1/chats/hooks-gh/messages").await.1;
        if got["messages"][0].is_object() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(got["messages"][0]["content"], "deployed", "{got}");
    // The replayed delivery id is still refused after the restart.
    let (s, v) = post(&base, "gh", body, &signed(now(), "k1", body, SECRET)).await;
    assert_eq!(s, 401, "{v}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(llm.requests().len(), 2, "answered more than once");
    assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));
}
