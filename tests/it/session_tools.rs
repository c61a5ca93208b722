//! The session tools (issue 20, item 2) through the gateway, two Telegram users (Alice in her
//! DM 111, Bob in his DM 222) and the fake LLM: by default Alice's conversation cannot read
//! Bob's (`sessions_history` refused, `sessions_list` shows only hers, with its last activity),
//! with `tools.sessions.visibility = "agent"` it can; `sessions_send` from Alice's session makes
//! exactly one turn in Bob's, answered once in Bob's chat, across a `kill -9` of the real `weft`
//! process while that turn runs, and a replay of the same call is not delivered again.
//!
//! Across agents: a binding gives Bob's chat to the agent `work`; Alice's (agent `main`) may
//! hand it a message only with `visibility = "all"` and both agents in
//! `tools.sessions.agent_to_agent.allow`, and the `work` agent answers it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clawft_channel_telegram::fake::FakeTelegram;
use serde_json::{json, Value};

use crate::common::{
    config, config_value, has_tool_results, last_user, messages, shown_in, tool_results,
    wait_until, TestGateway,
};
use crate::fake_llm::{FakeLlm, Reply};
use crate::process::{free_port, log_of, write_config, Daemon};

const T: Duration = Duration::from_secs(30);
const ALICE: i64 = 111;
const BOB: i64 = 222;
const HANDOFF: &str = "[Message from session";

fn telegram_section(tg: &FakeTelegram) -> Value {
    json!({"token": FakeTelegram::TOKEN, "api_url": tg.api_url(), "allow_from": [ALICE, BOB], "stream_edits": false})
}

/// The result of the tool call `id` in any recorded request.
fn result_of(llm: &FakeLlm, id: &str) -> Option<Value> {
    llm.requests()
        .iter()
        .flat_map(tool_results)
        .find(|(c, _)| c == id)
        .map(|(_, v)| v)
}

/// Bob and Alice each talk once; then Alice asks about Bob's conversation and her model calls
/// `sessions_history` on it and `sessions_list`.
async fn alice_reads_bob(visibility: Option<&str>) -> (Value, Value) {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let tg = Arc::new(FakeTelegram::start().await);
    llm.route(|req| {
        let user = last_user(req);
        Some(match user.as_str() {
            "what did bob say?" if has_tool_results(req) => Reply::Text("done".into()),
            "what did bob say?" => Reply::ToolCalls(vec![
                (
                    "h1".into(),
                    "sessions_history".into(),
                    json!({"session_key": format!("telegram:{BOB}")}).to_string(),
                ),
                ("l1".into(), "sessions_list".into(), "{}".into()),
            ]),
            other => Reply::Text(format!("ack: {other}")),
        })
    });
    let mut extra = json!({"channels": {"telegram": telegram_section(&tg)}});
    if let Some(v) = visibility {
        extra["tools"] = json!({"sessions": {"visibility": v}});
    }
    let gw = TestGateway::start(config(&llm, dir.path(), extra)).await;
    tg.push_user_message(BOB, BOB, "my pin is in the blue drawer");
    assert!(wait_until(T, || !shown_in(&tg, BOB).is_empty()).await);
    // A configured secret (the provider's key) pasted into the chat.
    tg.push_user_message(BOB, BOB, "the key is sk-test-secret-123456");
    assert!(wait_until(T, || shown_in(&tg, BOB).len() == 2).await);
    tg.push_user_message(ALICE, ALICE, "hi");
    assert!(wait_until(T, || !shown_in(&tg, ALICE).is_empty()).await);
    tg.push_user_message(ALICE, ALICE, "what did bob say?");
    assert!(
        wait_until(T, || shown_in(&tg, ALICE).iter().any(|t| t == "done")).await,
        "{:?}",
        shown_in(&tg, ALICE)
    );
    let history = result_of(&llm, "h1").unwrap();
    let list = result_of(&llm, "l1").unwrap();
    gw.stop().await;
    (history, list)
}

fn keys(list: &Value) -> Vec<String> {
    list["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .map(|s| s["session_key"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn another_users_history_is_refused_by_default_and_shared_with_visibility_agent() {
    let (history, list) = alice_reads_bob(None).await;
    assert_eq!(history["error_code"], "PERMISSION_DENIED", "{history}");
    let why = history["error"].as_str().unwrap();
    assert!(why.contains("tools.sessions.visibility"), "{why}");
    assert!(!history.to_string().contains("blue drawer"), "{history}");
    // Only her own conversation, with its last activity.
    assert_eq!(keys(&list), [format!("telegram:{ALICE}")], "{list}");
    let own = &list["sessions"][0];
    assert!(own["current"].as_bool().unwrap(), "{own}");
    assert!(
        own["last_activity"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{own}"
    );
    assert!(own["messages"].as_u64().unwrap() >= 2, "{own}");

    let (history, list) = alice_reads_bob(Some("agent")).await;
    assert!(history["error"].is_null(), "{history}");
    let texts: Vec<&str> = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        texts,
        [
            "my pin is in the blue drawer",
            "ack: my pin is in the blue drawer",
            "the key is [REDACTED]",
            "ack: the key is [REDACTED]"
        ],
        "read and scrubbed: {history}"
    );
    assert!(!history.to_string().contains("sk-test-secret"), "{history}");
    let mut k = keys(&list);
    k.sort();
    assert_eq!(k, [format!("telegram:{ALICE}"), format!("telegram:{BOB}")]);
}

/// `sessions_send` from Alice's conversation into Bob's: Bob's turn hangs at the model and the
/// `weft` process is killed with SIGKILL (Alice's turn is also unfinished: its model call after
/// the tool hangs). After the restart Bob's turn runs to one reply in Bob's chat, Alice's turn
/// resumes and its model repeats the hand-off (the gateway gives the reused call id a fresh
/// one), which is answered `duplicate` and delivers nothing more.
#[tokio::test]
async fn sessions_send_from_agent_main_lands_once_in_agent_works_session_and_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let tg = Arc::new(FakeTelegram::start().await);
    let port = free_port();
    let cfg = write_config(
        dir.path(),
        &config_value(
            &llm.base_url(),
            dir.path(),
            json!({
                "channels": {"http": {"bind": format!("127.0.0.1:{port}")}, "telegram": telegram_section(&tg)},
                // Agent A (`main`, Alice's chat) hands off to agent B (`work`, Bob's chat).
                "agents": {"work": {"system_prompt": "You are WORK."}},
                "bindings": [{"agent": "work", "channel": "telegram", "chat": BOB}],
                "tools": {"sessions": {"visibility": "all",
                    "agent_to_agent": {"enabled": true, "allow": ["main", "work"]}}},
            }),
        ),
    );
    let restarted = Arc::new(AtomicBool::new(false));
    let repeated = Arc::new(AtomicUsize::new(0));
    let send = (
        "send-1".to_string(),
        "sessions_send".to_string(),
        json!({"session_key": format!("@work:telegram:{BOB}"), "message": "please call the plumber"})
            .to_string(),
    );
    {
        let (restarted, repeated, send) = (restarted.clone(), repeated.clone(), send.clone());
        llm.route(move |req| {
            let user = last_user(req);
            let after = restarted.load(Ordering::SeqCst);
            Some(if user.starts_with(HANDOFF) {
                if after {
                    Reply::Text("Bob's assistant: I will call the plumber.".into())
                } else {
                    Reply::Hang
                }
            } else if user == "tell bob to call the plumber" {
                if !has_tool_results(req) {
                    Reply::ToolCalls(vec![send.clone()])
                } else if !after {
                    Reply::Hang
                } else if repeated.fetch_add(1, Ordering::SeqCst) == 0 {
                    // A model repeating itself after the restart: the same call again.
                    Reply::ToolCalls(vec![send.clone()])
                } else {
                    Reply::Text("Sent to Bob.".into())
                }
            } else {
                Reply::Text(format!("ack: {user}"))
            })
        });
    }
    let d = Daemon::start(dir.path(), &cfg, port).await;
    tg.push_user_message(BOB, BOB, "hello");
    assert!(
        wait_until(T, || shown_in(&tg, BOB) == ["ack: hello"]).await,
        "{:?}\n{}",
        shown_in(&tg, BOB),
        log_of(dir.path())
    );
    tg.push_user_message(ALICE, ALICE, "tell bob to call the plumber");
    let handoffs = |llm: &FakeLlm| {
        llm.requests()
            .iter()
            .filter(|r| last_user(r).starts_with(HANDOFF))
            .count()
    };
    let alice_after_tool = |llm: &FakeLlm| {
        llm.requests()
            .iter()
            .filter(|r| last_user(r) == "tell bob to call the plumber" && has_tool_results(r))
            .count()
    };
    assert!(
        wait_until(T, || handoffs(&llm) == 1 && alice_after_tool(&llm) == 1).await,
        "{}",
        log_of(dir.path())
    );
    let sent = result_of(&llm, "send-1").unwrap();
    assert_eq!(sent["status"], "sent", "{sent}");
    // Bob's model saw the message once, from Alice's session.
    let req = llm
        .requests()
        .into_iter()
        .find(|r| last_user(r).starts_with(HANDOFF))
        .unwrap();
    let text = last_user(&req);
    assert!(
        text.contains(&format!("session telegram:{ALICE}"))
            && text.ends_with("please call the plumber"),
        "{text}"
    );
    // It reached agent B: the work agent's prompt.
    let system = messages(&req)[0]["content"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(system.contains("You are WORK."), "{system}");
    // Past sled's background flush of the tool round, then the crash.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    d.kill9();
    assert!(
        shown_in(&tg, BOB) == ["ack: hello"],
        "{:?}",
        shown_in(&tg, BOB)
    );

    restarted.store(true, Ordering::SeqCst);
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let reply = "Bob's assistant: I will call the plumber.";
    assert!(
        wait_until(T, || shown_in(&tg, BOB).iter().any(|t| t == reply)
            && shown_in(&tg, ALICE).iter().any(|t| t == "Sent to Bob."))
        .await,
        "bob: {:?} alice: {:?}\n{}",
        shown_in(&tg, BOB),
        shown_in(&tg, ALICE),
        log_of(dir.path())
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        shown_in(&tg, BOB),
        ["ack: hello", reply],
        "one turn, one reply in Bob's chat; results {:?}\n{}",
        llm.requests()
            .iter()
            .flat_map(tool_results)
            .collect::<Vec<_>>(),
        log_of(dir.path())
    );
    // The repeated hand-off was recognised.
    let results: Vec<Value> = llm
        .requests()
        .iter()
        .flat_map(tool_results)
        .filter(|(c, _)| c.starts_with("send-1"))
        .map(|(_, v)| v)
        .collect();
    assert!(
        results.iter().any(|v| v["status"] == "duplicate"),
        "{results:?}"
    );
    // One hand-off turn before the crash (hung) and its resumption after: the message is in
    // Bob's transcript once.
    assert_eq!(handoffs(&llm), 2, "{}", log_of(dir.path()));
    let last = llm
        .requests()
        .into_iter()
        .rfind(|r| last_user(r).starts_with(HANDOFF))
        .unwrap();
    let copies = messages(&last)
        .iter()
        .filter(|m| {
            m["role"] == "user"
                && m["content"]
                    .as_str()
                    .is_some_and(|c| c.starts_with(HANDOFF))
        })
        .count();
    assert_eq!(copies, 1, "{last}");
    // A third life adds nothing.
    d.kill9();
    let d = Daemon::start(dir.path(), &cfg, port).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(shown_in(&tg, BOB), ["ack: hello", reply]);
    assert_eq!(handoffs(&llm), 2);
    assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));
}

/// Alice's conversation (agent `main`) hands a message to Bob's, which a binding gives to the
/// agent `work` (key `@work:telegram:222`). Returns the tool's result and what Bob's chat shows.
async fn main_to_work(sessions: Value) -> (Value, Vec<String>, FakeLlm) {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let tg = Arc::new(FakeTelegram::start().await);
    llm.route(|req| {
        let user = last_user(req);
        let model = req["model"].as_str().unwrap_or("?").to_string();
        Some(if user.starts_with(HANDOFF) {
            Reply::Text(format!("{model} took the hand-off"))
        } else if user == "hand this to work" && !has_tool_results(req) {
            Reply::ToolCalls(vec![(
                "w1".into(),
                "sessions_send".into(),
                json!({"session_key": format!("@work:telegram:{BOB}"), "message": "book the meeting room"})
                    .to_string(),
            )])
        } else if user == "hand this to work" {
            Reply::Text("done".into())
        } else {
            Reply::Text(format!("{model}: ack"))
        })
    });
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({
            "agents": {"work": {"system_prompt": "You are WORK.", "model": "work-model"}},
            "bindings": [{"agent": "work", "channel": "telegram", "chat": BOB}],
            "channels": {"telegram": telegram_section(&tg)},
            "tools": {"sessions": sessions},
        }),
    ))
    .await;
    tg.push_user_message(BOB, BOB, "hello");
    assert!(wait_until(T, || shown_in(&tg, BOB) == ["work-model: ack"]).await);
    tg.push_user_message(ALICE, ALICE, "hand this to work");
    assert!(
        wait_until(T, || shown_in(&tg, ALICE).iter().any(|t| t == "done")).await,
        "{:?}",
        shown_in(&tg, ALICE)
    );
    let result = result_of(&llm, "w1").unwrap();
    if result["status"] == "sent" {
        assert!(wait_until(T, || shown_in(&tg, BOB).len() == 2).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let bob = shown_in(&tg, BOB);
    gw.stop().await;
    (result, bob, llm)
}

#[tokio::test]
async fn another_agents_session_needs_visibility_all_and_agent_to_agent_on_both_sides() {
    let (r, bob, _) = main_to_work(json!({"visibility": "agent"})).await;
    assert_eq!(r["error_code"], "PERMISSION_DENIED", "{r}");
    let why = r["error"].as_str().unwrap();
    assert!(why.contains("tools.sessions.visibility = \"all\""), "{why}");
    assert_eq!(bob, ["work-model: ack"]);

    let (r, bob, _) = main_to_work(
        json!({"visibility": "all", "agent_to_agent": {"enabled": true, "allow": ["work"]}}),
    )
    .await;
    assert_eq!(r["error_code"], "PERMISSION_DENIED", "{r}");
    assert!(r["error"].as_str().unwrap().contains("`main`"), "{r}");
    assert_eq!(bob, ["work-model: ack"]);

    let (r, bob, llm) = main_to_work(
        json!({"visibility": "all", "agent_to_agent": {"enabled": true, "allow": ["main", "work"]}}),
    )
    .await;
    assert_eq!(r["status"], "sent", "{r}");
    // The work agent answered it (its model and prompt), once, in Bob's chat.
    assert_eq!(bob, ["work-model: ack", "work-model took the hand-off"]);
    let handoff = llm
        .requests()
        .into_iter()
        .find(|q| last_user(q).starts_with(HANDOFF))
        .unwrap();
    assert!(
        last_user(&handoff).contains("(agent main)"),
        "{}",
        last_user(&handoff)
    );
    let system = messages(&handoff)[0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(system.contains("You are WORK."), "{system}");
}
