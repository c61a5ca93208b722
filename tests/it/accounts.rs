//! Several bots of one platform in one gateway (`channels.telegram.accounts.NAME`): each bot
//! answers its own users with its own token, keeps its own sessions, update offset and
//! pairings, against one fake Bot API serving both tokens.

use std::time::Duration;

use clawft_channel_telegram::fake::FakeTelegram;
use serde_json::{json, Value};

use crate::common::{config, echo_model, messages, wait_until, TestGateway};
use crate::fake_llm::{FakeLlm, Reply};

const T: Duration = Duration::from_secs(30);
const WORK_TOKEN: &str = "777:WORK-fake_token-abcdefghijklmnopqrs";

fn shown(tg: &FakeTelegram) -> Vec<String> {
    tg.sent().into_iter().map(|m| m.visible).collect()
}

/// The `offset` of the `n`-th `getUpdates` of `tg` (0-based), once it was made.
async fn offset_of_poll(tg: &FakeTelegram, n: usize) -> Value {
    let polls = tg.wait_calls("getUpdates", n + 1, T).await;
    assert!(polls.len() > n, "poll {n} never came: {polls:?}");
    polls[n]["offset"].clone()
}

fn two_bots(tg: &FakeTelegram, extra: Value) -> Value {
    let mut telegram = json!({
        "token": FakeTelegram::TOKEN, "api_url": tg.api_url(), "allow_from": [111],
        "stream_edits": false,
        "accounts": {"work": {"token": WORK_TOKEN}},
    });
    crate::common::merge(&mut telegram, extra);
    json!({"channels": {"telegram": telegram}})
}

#[tokio::test]
async fn two_telegram_bots_answer_their_own_users_keep_their_sessions_and_offsets_across_a_restart()
{
    let tg = FakeTelegram::start().await;
    let work = tg.add_bot(WORK_TOKEN, 7777, "work_bot");
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let cfg = || config(&llm, dir.path(), two_bots(&tg, json!({})));
    let gw = TestGateway::start(cfg()).await;

    // The main bot gets two messages first, so the bots' update ids (and offsets) differ.
    tg.push_user_message(111, 111, "main one");
    assert!(
        wait_until(T, || shown(&tg).len() == 1).await,
        "{:?}",
        tg.sent()
    );
    tg.push_user_message(111, 111, "main two");
    // The same user, the same chat id, the same update id as the main bot's first: the
    // work bot's own conversation, not a duplicate of the main bot's.
    work.push_user_message(111, 111, "work one");
    assert!(
        wait_until(T, || shown(&tg).len() == 2 && shown(&work).len() == 1).await,
        "main {:?} work {:?}",
        tg.sent(),
        work.sent()
    );
    assert_eq!(shown(&tg), ["answer: main one", "answer: main two"]);
    assert_eq!(shown(&work), ["answer: work one"]);

    // Two sessions, one per bot; the default bot keeps the channel id `telegram`.
    let (_, sessions) = gw.api.get("/v1/sessions").await;
    let mut keys: Vec<String> = sessions["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["key"].as_str().unwrap().to_string())
        .filter(|k| k.starts_with("telegram"))
        .collect();
    keys.sort();
    assert_eq!(keys, ["telegram.work:111", "telegram:111"], "{sessions}");
    let (_, work_session) = gw.api.get("/v1/sessions/telegram.work:111").await;
    assert_eq!(
        work_session["messages"].as_array().map(Vec::len),
        Some(2),
        "{work_session}"
    );
    // Status lists both bots by channel id.
    let (_, st) = gw.api.get("/v1/status").await;
    for id in ["telegram", "telegram.work"] {
        let state = st["channel_states"][id].as_str().unwrap_or_default();
        assert!(state.contains("connected"), "{id}: {st}");
    }
    assert!(
        st["channel_states"]["telegram.work"]
            .as_str()
            .unwrap()
            .contains("@work_bot"),
        "{st}"
    );
    // Both updates are confirmed at their own bot.
    assert!(
        wait_until(T, || tg.pending_updates().is_empty()
            && work.pending_updates().is_empty())
        .await
    );
    gw.stop().await;

    // A restart: each bot resumes from its own offset, nothing is answered twice.
    let (main_polls, work_polls) = (tg.calls("getUpdates").len(), work.calls("getUpdates").len());
    let asked = llm.requests().len();
    let gw = TestGateway::start(cfg()).await;
    assert_eq!(offset_of_poll(&tg, main_polls).await, json!(100_002));
    assert_eq!(offset_of_poll(&work, work_polls).await, json!(100_001));
    tg.push_user_message(111, 111, "main three");
    work.push_user_message(111, 111, "work two");
    assert!(
        wait_until(T, || shown(&tg).len() == 3 && shown(&work).len() == 2).await,
        "main {:?} work {:?}",
        tg.sent(),
        work.sent()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        shown(&tg),
        ["answer: main one", "answer: main two", "answer: main three"]
    );
    assert_eq!(shown(&work), ["answer: work one", "answer: work two"]);
    assert_eq!(llm.requests().len(), asked + 2, "an update was replayed");
    // The work bot's conversation went on in its own session.
    let last = llm.requests().last().cloned().unwrap();
    let texts: Vec<String> = messages(&last)
        .iter()
        .skip(1)
        .map(|m| m["content"].as_str().unwrap_or("").to_string())
        .collect();
    if texts.last().map(String::as_str) == Some("work two") {
        assert_eq!(texts, ["work one", "answer: work one", "work two"]);
    }
    gw.stop().await;
}

#[tokio::test]
async fn a_sender_paired_with_one_bot_is_a_stranger_to_the_other() {
    let tg = FakeTelegram::start().await;
    let work = tg.add_bot(WORK_TOKEN, 7777, "work_bot");
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        two_bots(&tg, json!({"pairing": true})),
    ))
    .await;
    // 222 asks the work bot: a pairing code, from the work bot.
    work.push_user_message(222, 222, "let me in");
    assert!(wait_until(T, || shown(&work).len() == 1).await);
    let code = shown(&work)[0]
        .split("pairing approve ")
        .nth(1)
        .unwrap()
        .split(|c: char| !c.is_ascii_alphanumeric())
        .next()
        .unwrap()
        .to_string();
    assert!(shown(&tg).is_empty(), "{:?}", tg.sent());
    let v = clawft::admin::pairing_command(
        gw.gateway.daemon.store(),
        "pairing/approve",
        &json!({ "code": code }),
    )
    .unwrap();
    assert_eq!(v["approved"], "telegram.work:222");
    work.push_user_message(222, 222, "hello work");
    assert!(
        wait_until(T, || shown(&work).len() == 2).await,
        "{:?}",
        work.sent()
    );
    assert_eq!(shown(&work)[1], "answer: hello work");
    // The main bot does not know 222: a code of its own, and the model is not asked.
    tg.push_user_message(222, 222, "hello main");
    assert!(wait_until(T, || shown(&tg).len() == 1).await);
    assert!(shown(&tg)[0].contains("pairing code"), "{:?}", shown(&tg));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(llm.requests().len(), 1);
    // 111 is allowed on both (allow_from is inherited).
    work.push_user_message(111, 111, "me too");
    assert!(
        wait_until(T, || shown(&work).len() == 3).await,
        "{:?}",
        work.sent()
    );
    assert_eq!(shown(&work)[2], "answer: me too");
    // `weft send` (the admin API) reaches a bot by its channel id.
    let main_sent = tg.sent().len();
    let r = gw
        .api
        .http
        .post(format!("{}/v1/admin/send", gw.api.base))
        .json(
            &json!({"channel": "telegram.work", "chat_id": "555", "content": "from the operator"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert!(
        wait_until(T, || work
            .sent()
            .iter()
            .any(|m| m.chat == 555 && m.visible == "from the operator"))
        .await,
        "{:?}",
        work.sent()
    );
    assert_eq!(tg.sent().len(), main_sent, "{:?}", tg.sent());
    gw.stop().await;
}

#[tokio::test]
async fn a_reload_starts_restarts_and_stops_one_account_and_leaves_the_other_running() {
    let tg = FakeTelegram::start().await;
    let work = tg.add_bot(WORK_TOKEN, 7777, "work_bot");
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let main_only = json!({"channels": {"telegram": {
        "token": FakeTelegram::TOKEN, "api_url": tg.api_url(), "allow_from": [111], "stream_edits": false,
    }}});
    let mut gw = TestGateway::start(config(&llm, dir.path(), main_only.clone())).await;
    let changes = |c: Vec<String>| c.join("; ");
    // Add the work bot.
    let c = changes(
        gw.gateway
            .daemon
            .reload(config(&llm, dir.path(), two_bots(&tg, json!({}))))
            .await,
    );
    assert!(c.contains("channel telegram.work started"), "{c}");
    assert!(!c.contains("channel telegram "), "{c}");
    work.push_user_message(111, 111, "work one");
    assert!(
        wait_until(T, || shown(&work).len() == 1).await,
        "{:?}",
        work.sent()
    );
    // Change only the work bot's settings: only it restarts.
    let c = changes(
        gw.gateway
            .daemon
            .reload(config(
                &llm,
                dir.path(),
                two_bots(
                    &tg,
                    json!({"accounts": {"work": {"allow_from": [111, 222]}}}),
                ),
            ))
            .await,
    );
    assert!(
        c.contains("channel telegram.work restarted with its new settings"),
        "{c}"
    );
    assert!(!c.contains("channel telegram "), "{c}");
    work.push_user_message(222, 222, "work two");
    assert!(
        wait_until(T, || shown(&work).len() == 2).await,
        "{:?}",
        work.sent()
    );
    assert_eq!(shown(&work)[1], "answer: work two");
    // Remove it: it stops, the main bot still answers.
    let c = changes(
        gw.gateway
            .daemon
            .reload(config(&llm, dir.path(), main_only))
            .await,
    );
    assert!(c.contains("channel telegram.work stopped"), "{c}");
    tg.push_user_message(111, 111, "main one");
    assert!(
        wait_until(T, || shown(&tg).len() == 1).await,
        "{:?}",
        tg.sent()
    );
    let (_, st) = gw.api.get("/v1/status").await;
    assert!(st["channel_states"]["telegram.work"].is_null(), "{st}");
    gw.stop().await;
}

#[tokio::test]
async fn a_refused_token_of_one_account_names_its_key_and_the_other_bot_keeps_answering() {
    let tg = FakeTelegram::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    // No bot of the fake has this token: Telegram answers 401.
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        two_bots(
            &tg,
            json!({"accounts": {"work": {"token": "999:REVOKED-token-abcdefghijklmnop"}}}),
        ),
    ))
    .await;
    let mut state = String::new();
    for _ in 0..200 {
        let (_, st) = gw.api.get("/v1/status").await;
        state = st["channel_states"]["telegram.work"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if state.contains("auth") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(state.contains("auth failed"), "{state}");
    assert!(
        state.contains("channels.telegram.accounts.work.token"),
        "{state}"
    );
    assert!(!state.contains("REVOKED"), "the token leaked: {state}");
    tg.push_user_message(111, 111, "still there?");
    assert!(
        wait_until(T, || shown(&tg).len() == 1).await,
        "{:?}",
        tg.sent()
    );
    assert_eq!(shown(&tg), ["answer: still there?"]);
    gw.stop().await;
}

/// Issue 20: "two bot tokens in one gateway each reach their own agent" — a binding on the
/// bot account sends the second bot's users to the work agent.
#[tokio::test]
async fn two_bots_bound_by_account_each_reach_their_own_agent() {
    let tg = FakeTelegram::start().await;
    let work = tg.add_bot(WORK_TOKEN, 7777, "work_bot");
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.route(|req| {
        let system = messages(req)
            .first()
            .and_then(|m| m["content"].as_str().map(str::to_string))
            .unwrap_or_default();
        let who = if system.contains("You are WORK.") {
            "work"
        } else {
            "main"
        };
        Some(Reply::Text(format!("{who} agent, {}", req["model"])))
    });
    let mut extra = two_bots(&tg, json!({}));
    crate::common::merge(
        &mut extra,
        json!({
            "agents": {"work": {"system_prompt": "You are WORK.", "model": "work-model"}},
            "bindings": [{"agent": "work", "channel": "telegram", "account": "work"}],
        }),
    );
    let gw = TestGateway::start(config(&llm, dir.path(), extra)).await;
    tg.push_user_message(111, 111, "hello main bot");
    work.push_user_message(111, 111, "hello work bot");
    assert!(
        wait_until(T, || shown(&tg).len() == 1 && shown(&work).len() == 1).await,
        "main {:?} work {:?}",
        tg.sent(),
        work.sent()
    );
    assert_eq!(shown(&tg), [r#"main agent, "fake-model""#]);
    assert_eq!(shown(&work), [r#"work agent, "work-model""#]);
    let (_, sessions) = gw.api.get("/v1/sessions").await;
    let keys = sessions.to_string();
    assert!(keys.contains("@work:telegram.work:111"), "{keys}");
    assert!(keys.contains("\"telegram:111\""), "{keys}");
    gw.stop().await;
}
