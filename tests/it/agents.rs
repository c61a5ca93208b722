//! Several agents in one gateway (issue 20): bindings choose the agent by chat; each agent
//! answers with its own system prompt, model, tools and memory; `/model` switches a chat's
//! model among those its agent allows; the store keeps each agent's sessions apart.

use std::sync::Arc;
use std::time::Duration;

use clawft_channel_telegram::fake::FakeTelegram;
use serde_json::json;

use crate::common::{
    config, shown_in, system_of, tool_names, tool_results, wait_until, TestGateway,
};
use crate::fake_llm::{FakeLlm, Reply};

const T: Duration = Duration::from_secs(30);
const FAMILY_CHAT: i64 = 111;
const WORK_CHAT: i64 = 222;
const OTHER_CHAT: i64 = 333;

/// The model: asked a question, it reads its memory; given the memory, it answers with the
/// agent its system prompt names, the model it was asked as, and what its memory holds.
fn model(llm: &FakeLlm) {
    llm.route(|req| {
        let results = tool_results(req);
        if results.is_empty() {
            return Some(Reply::ToolCalls(vec![(
                "m1".into(),
                "memory_read".into(),
                "{}".into(),
            )]));
        }
        let system = system_of(req);
        let who = ["FAMILY", "WORK", "MAIN"]
            .into_iter()
            .find(|w| system.contains(&format!("You are {w}.")))
            .unwrap_or("nobody");
        let memory = results
            .iter()
            .map(|(_, v)| v.to_string())
            .collect::<String>();
        let mem = ["family-notes", "work-notes", "main-notes"]
            .into_iter()
            .find(|m| memory.contains(m))
            .unwrap_or("no-notes");
        Some(Reply::Text(format!(
            "{who} {} {mem}",
            req["model"].as_str().unwrap_or("?")
        )))
    });
}

fn workspace(dir: &std::path::Path, name: &str, notes: &str) -> String {
    let ws = dir.join(name);
    std::fs::create_dir_all(ws.join("memory")).unwrap();
    std::fs::write(ws.join("memory/MEMORY.md"), format!("# Notes\n\n{notes}\n")).unwrap();
    ws.to_str().unwrap().to_string()
}

#[tokio::test]
async fn two_agents_bound_to_two_chats_answer_with_their_own_prompt_model_tools_and_memory() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    model(&llm);
    let tg = Arc::new(FakeTelegram::start().await);
    let main_ws = workspace(dir.path(), "ws", "main-notes");
    let family_ws = workspace(dir.path(), "ws-family", "family-notes");
    let work_ws = workspace(dir.path(), "ws-work", "work-notes");
    let cfg = config(
        &llm,
        dir.path(),
        json!({
            "agents": {
                "defaults": {"workspace": main_ws, "system_prompt": "You are MAIN."},
                "family": {"workspace": family_ws, "system_prompt": "You are FAMILY.", "model": "family-model", "tools": {"deny": ["exec_shell"]}},
                "work": {"workspace": work_ws, "system_prompt": "You are WORK.", "model": "work-model", "models": ["work-big"]},
            },
            "bindings": [
                {"agent": "family", "channel": "telegram", "chat": FAMILY_CHAT},
                {"agent": "work", "channel": "telegram", "chat": WORK_CHAT},
            ],
            "channels": {"telegram": {"token": FakeTelegram::TOKEN, "api_url": tg.api_url(),
                "allow_from": [FAMILY_CHAT, WORK_CHAT, OTHER_CHAT], "stream_edits": false}},
        }),
    );
    let gw = TestGateway::start(cfg).await;
    for chat in [FAMILY_CHAT, WORK_CHAT, OTHER_CHAT] {
        tg.push_user_message(chat, chat, "who are you?");
    }
    let expect = [
        (FAMILY_CHAT, "FAMILY family-model family-notes"),
        (WORK_CHAT, "WORK work-model work-notes"),
        (OTHER_CHAT, "MAIN fake-model main-notes"),
    ];
    for (chat, text) in expect {
        assert!(
            wait_until(T, || shown_in(&tg, chat).iter().any(|t| t == text)).await,
            "chat {chat}: {:?}",
            shown_in(&tg, chat)
        );
    }
    // Each agent's own tools: the family agent is never offered exec_shell, the others are.
    let reqs = llm.requests();
    for r in &reqs {
        let offered = tool_names(r).contains(&"exec_shell".to_string());
        let family = system_of(r).contains("You are FAMILY.");
        assert_eq!(offered, !family, "{}", system_of(r));
    }
    // The store keeps the agents' conversations apart: the key names the agent.
    let store = gw.gateway.daemon.store().clone();
    let keys: Vec<String> = store
        .sessions()
        .unwrap()
        .into_iter()
        .map(|s| s.key.to_string())
        .collect();
    for k in [
        format!("@family:telegram:{FAMILY_CHAT}"),
        format!("@work:telegram:{WORK_CHAT}"),
        format!("telegram:{OTHER_CHAT}"),
    ] {
        assert!(keys.contains(&k), "{k} not in {keys:?}");
    }

    // `/model`: the work chat switches to a model its agent allows, and only to one.
    tg.push_user_message(WORK_CHAT, WORK_CHAT, "/model gpt-5-turbo");
    tg.push_user_message(WORK_CHAT, WORK_CHAT, "/model work-big");
    assert!(
        wait_until(T, || shown_in(&tg, WORK_CHAT)
            .iter()
            .any(|t| t == "This chat now uses work-big."))
        .await,
        "{:?}",
        shown_in(&tg, WORK_CHAT)
    );
    assert!(
        shown_in(&tg, WORK_CHAT)
            .iter()
            .any(|t| t.contains("gpt-5-turbo") && t.contains("is not a model of this assistant")),
        "{:?}",
        shown_in(&tg, WORK_CHAT)
    );
    tg.push_user_message(WORK_CHAT, WORK_CHAT, "again?");
    assert!(
        wait_until(T, || shown_in(&tg, WORK_CHAT)
            .iter()
            .any(|t| t == "WORK work-big work-notes"))
        .await,
        "{:?}",
        shown_in(&tg, WORK_CHAT)
    );
    tg.push_user_message(WORK_CHAT, WORK_CHAT, "/status");
    assert!(
        wait_until(T, || shown_in(&tg, WORK_CHAT)
            .iter()
            .any(|t| t.contains("(agent work, model work-big)")))
        .await,
        "{:?}",
        shown_in(&tg, WORK_CHAT)
    );
    // `/metrics` counts each agent's turns.
    let text = gw.api.text("/metrics").await;
    for agent in ["family", "work", "main"] {
        assert!(
            text.contains(&format!(
                "clawft_turns_total{{agent=\"{agent}\",status=\"completed\"}}"
            )),
            "{agent}: {text}"
        );
    }
    // The family chat's model did not change.
    tg.push_user_message(FAMILY_CHAT, FAMILY_CHAT, "and you?");
    assert!(
        wait_until(T, || shown_in(&tg, FAMILY_CHAT)
            .iter()
            .filter(|t| *t == "FAMILY family-model family-notes")
            .count()
            == 2)
        .await,
        "{:?}",
        shown_in(&tg, FAMILY_CHAT)
    );
    gw.stop().await;
}

#[tokio::test]
async fn bindings_that_tie_and_unknown_agents_are_config_errors_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let env = crate::common::test_env(dir.path());
    let text = r#"
[agents.work]
system_prompt = "w"
[[bindings]]
agent = "work"
chat = "1"
[[bindings]]
agent = "main"
user = "7"
"#;
    let e = clawft::config::Config::from_str(text, true, &env)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("[[bindings]] #1") && e.contains("[[bindings]] #2") && e.contains("ambiguous"),
        "{e}"
    );
    let e = clawft::config::Config::from_str(
        "[[bindings]]\nagent = \"wrok\"\nchannel = \"telegram\"\n",
        true,
        &env,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("no agent named `wrok`"), "{e}");
    let e = clawft::config::Config::from_str("[agents.Work]\nmodel = \"x\"\n", true, &env)
        .unwrap_err()
        .to_string();
    assert!(e.contains("agents.Work"), "{e}");
}

#[tokio::test]
async fn weft_agents_list_and_weft_agent_with_an_agent_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.route(|req| {
        Some(Reply::Text(format!(
            "[{}] {}",
            req["model"].as_str().unwrap_or("?"),
            system_of(req).lines().next().unwrap_or_default()
        )))
    });
    let cfg = crate::process::write_config(
        dir.path(),
        &crate::common::config_value(
            &llm.base_url(),
            dir.path(),
            json!({
                "agents": {
                    "work": {"system_prompt": "You are WORK.", "model": "work-model"},
                },
                "bindings": [{"agent": "work", "channel": "telegram", "chat": "42"}],
                "channels": {"http": {"enabled": false}},
            }),
        ),
    );
    let run = |args: &[&str]| {
        let out = crate::process::weft(dir.path())
            .arg("--config")
            .arg(&cfg)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, out, err) = run(&["agents", "list"]);
    assert!(ok, "{err}");
    assert!(out.contains("main (default"), "{out}");
    assert!(out.contains("work\n"), "{out}");
    assert!(out.contains("work-model"), "{out}");
    assert!(
        out.contains(r#"[[bindings]] #1 (agent = "work", channel = "telegram", chat = "42")"#),
        "{out}"
    );
    // The work agent's own workspace, made beneath the state directory.
    assert!(out.contains("workspace-work"), "{out}");

    let (ok, out, err) = tokio::task::spawn_blocking(move || {
        let out = crate::process::weft(dir.path())
            .arg("--config")
            .arg(&cfg)
            .args(["agent", "--agent", "work", "-m", "hello"])
            .output()
            .unwrap();
        let r = (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        );
        let bad = crate::process::weft(dir.path())
            .arg("--config")
            .arg(&cfg)
            .args(["agent", "--agent", "nope", "-m", "hello"])
            .output()
            .unwrap();
        assert!(!bad.status.success());
        let e = String::from_utf8_lossy(&bad.stderr).to_string();
        assert!(
            e.contains("no agent named `nope`; agents: main, work"),
            "{e}"
        );
        r
    })
    .await
    .unwrap();
    assert!(ok, "{err}");
    assert!(out.contains("[work-model] You are WORK."), "{out}\n{err}");
}

#[tokio::test]
async fn an_agents_own_subagent_limits_and_budget_apply_to_it_alone() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.route(|req| {
        let system = system_of(req);
        let results = tool_results(req);
        // The subagent itself answers at once, and so does the tight agent.
        if !system.contains("You are ") {
            return Some(Reply::Text("child done".into()));
        }
        if system.contains("You are TIGHT.") {
            return Some(Reply::Text("tight ok".into()));
        }
        if results.is_empty() {
            return Some(Reply::ToolCalls(vec![(
                "s1".into(),
                "subagents".into(),
                json!({"action": "spawn", "task": "look around", "label": "look"}).to_string(),
            )]));
        }
        Some(Reply::Text(format!(
            "spawn: {}",
            if results[0].1.to_string().contains("disabled") {
                "refused"
            } else {
                "started"
            }
        )))
    });
    let cfg = config(
        &llm,
        dir.path(),
        json!({
            "agents": {
                "defaults": {"system_prompt": "You are MAIN."},
                "work": {"system_prompt": "You are WORK.", "subagents": {"max_spawn_depth": 0}},
                "tight": {"system_prompt": "You are TIGHT.", "budgets": {"daily_tokens": 1}},
            },
            "bindings": [
                {"agent": "work", "channel": "http", "chat": "w-chat"},
                {"agent": "tight", "channel": "http", "chat": "t-chat"},
            ],
        }),
    );
    let gw = TestGateway::start(cfg).await;
    let (_, main) = gw.api.chat("m-chat", "spawn one").await;
    assert_eq!(main["reply"], "spawn: started", "{main}");
    let (_, work) = gw.api.chat("w-chat", "spawn one").await;
    assert_eq!(work["reply"], "spawn: refused", "{work}");
    // The tight agent's own budget (1 token a day) is spent by its first turn: its next turn
    // is refused…
    let (_, first) = gw.api.chat("t-chat", "hello").await;
    assert_eq!(first["reply"], "tight ok", "{first}");
    let (_, again) = gw.api.chat("t-chat", "and again").await;
    assert!(
        again
            .to_string()
            .contains("agents.tight.budgets.daily_tokens"),
        "{again}"
    );
    let (_, work) = gw.api.chat("w-chat", "spawn again").await;
    assert!(work["reply"].is_string(), "{work}");
    // …and the default agent still answers.
    let (_, main) = gw.api.chat("m-chat", "spawn another").await;
    assert_eq!(main["reply"], "spawn: started", "{main}");
    gw.stop().await;
}
