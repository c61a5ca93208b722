//! Scheduled jobs and the heartbeat (issue 19), end to end: jobs added by the model through
//! the `cron` tool run at their time in a fake Telegram chat, exactly once across restarts and
//! `kill -9`, follow their catch-up policy after a downtime, stop on `/stop`; the heartbeat
//! makes no model call for an empty `HEARTBEAT.md` and delivers nothing for `HEARTBEAT_OK`.

use std::sync::Arc;
use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use clawft_channel_telegram::fake::FakeTelegram;
use serde_json::{json, Value};

use crate::common::{
    config, config_value, has_tool_results, last_user, tool_results, wait_until, TestGateway,
};
use crate::fake_llm::{FakeLlm, Reply};
use crate::process::{free_port, log_of, write_config, Daemon};

const T: Duration = Duration::from_secs(30);
const CHAT: i64 = 111;

fn telegram_section(tg: &FakeTelegram) -> Value {
    json!({"token": FakeTelegram::TOKEN, "api_url": tg.api_url(), "allow_from": [CHAT], "stream_edits": false})
}

/// The texts the Telegram chat shows, in order.
fn shown(tg: &FakeTelegram) -> Vec<String> {
    crate::common::shown_in(tg, CHAT)
}

/// RFC 3339 with a +01:00 offset, `secs` from now (the offset a Berlin user would give).
fn in_secs(secs: i64) -> String {
    let off = chrono::FixedOffset::east_opt(3600).unwrap();
    (Utc::now() + chrono::TimeDelta::seconds(secs))
        .with_timezone(&off)
        .to_rfc3339_opts(SecondsFormat::Secs, false)
}

/// A model that answers the user's request with `calls` (built when it is asked), confirms
/// the tool results, and answers each scheduled run by the job name it carries.
fn scheduling_model(
    llm: &FakeLlm,
    calls: impl Fn() -> Vec<(String, String, String)> + Send + Sync + 'static,
) {
    llm.route(move |req| {
        let user = last_user(req);
        if user.starts_with("[Scheduled task") {
            let name = user.split('"').nth(1).unwrap_or("?").to_string();
            return Some(Reply::Text(format!("run of {name}")));
        }
        if has_tool_results(req) {
            return Some(Reply::Text("Scheduled.".into()));
        }
        Some(Reply::ToolCalls(calls()))
    });
}

fn scheduled_requests(llm: &FakeLlm) -> Vec<String> {
    llm.requests()
        .iter()
        .map(last_user)
        .filter(|u| u.starts_with("[Scheduled task"))
        .collect()
}

/// A state directory, the fake LLM and Telegram, and the config file of a `weft` process using
/// them (HTTP API on a free port).
async fn process_setup() -> (
    tempfile::TempDir,
    FakeLlm,
    Arc<FakeTelegram>,
    std::path::PathBuf,
    u16,
) {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let tg = Arc::new(FakeTelegram::start().await);
    let port = free_port();
    let cfg = write_config(
        dir.path(),
        &config_value(
            &llm.base_url(),
            dir.path(),
            json!({"channels": {"http": {"bind": format!("127.0.0.1:{port}")}, "telegram": telegram_section(&tg)}}),
        ),
    );
    (dir, llm, tg, cfg, port)
}

#[tokio::test]
async fn an_at_job_three_seconds_ahead_is_delivered_once_and_restarts_never_double_it() {
    let (dir, llm, tg, cfg, port) = process_setup().await;
    scheduling_model(&llm, || {
        vec![(
            "c1".into(),
            "cron".into(),
            json!({"action": "add", "name": "stretch", "schedule": {"kind": "at", "at": in_secs(3)}, "message": "remind me to stretch"}).to_string(),
        )]
    });
    let d = Daemon::start(dir.path(), &cfg, port).await;
    tg.push_user_message(CHAT, CHAT, "remind me to stretch in 3 seconds");
    assert!(
        wait_until(T, || shown(&tg).iter().any(|t| t == "Scheduled.")).await,
        "{:?}\n{}",
        shown(&tg),
        log_of(dir.path())
    );
    let added = llm
        .requests()
        .iter()
        .flat_map(tool_results)
        .map(|(_, v)| v)
        .next()
        .unwrap();
    assert_eq!(added["status"], "added", "{added}");
    assert!(added["job"]["next_run"].is_string(), "{added}");
    assert!(
        wait_until(Duration::from_secs(15), || shown(&tg)
            .iter()
            .any(|t| t == "run of stretch"))
        .await,
        "the job never ran: {:?}\n{}",
        shown(&tg),
        log_of(dir.path())
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let runs = |tg: &FakeTelegram| {
        shown(tg)
            .iter()
            .filter(|t| t.as_str() == "run of stretch")
            .count()
    };
    assert_eq!(runs(&tg), 1, "{:?}", shown(&tg));
    // The run was the asking user's, in their chat's conversation.
    let sched = scheduled_requests(&llm);
    assert_eq!(sched.len(), 1, "{sched:?}");
    assert!(sched[0].contains("remind me to stretch"), "{}", sched[0]);

    // Two more lives of the gateway: nothing runs again.
    assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    d.kill9();
    let d = Daemon::start(dir.path(), &cfg, port).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(runs(&tg), 1, "{:?}", shown(&tg));
    assert_eq!(scheduled_requests(&llm).len(), 1);
    assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));
}

/// Jobs due while the gateway is killed and down for over a minute: `once` runs one late run
/// after the restart, `skip` none, and further restarts add nothing.
#[tokio::test]
async fn a_job_due_during_a_kill_9_downtime_runs_once_with_once_and_never_with_skip() {
    let (dir, llm, tg, cfg, port) = process_setup().await;
    scheduling_model(&llm, || {
        let at = in_secs(3);
        vec![
            (
                "c1".into(),
                "cron".into(),
                json!({"action": "add", "name": "once-job", "schedule": {"kind": "at", "at": at}, "message": "water the plants", "catch_up": "once"}).to_string(),
            ),
            (
                "c2".into(),
                "cron".into(),
                json!({"action": "add", "name": "skip-job", "schedule": {"kind": "at", "at": at}, "message": "feed the cat", "catch_up": "skip"}).to_string(),
            ),
        ]
    });
    let d = Daemon::start(dir.path(), &cfg, port).await;
    tg.push_user_message(CHAT, CHAT, "two reminders in 3 seconds please");
    assert!(
        wait_until(T, || shown(&tg).iter().any(|t| t == "Scheduled.")).await,
        "{:?}\n{}",
        shown(&tg),
        log_of(dir.path())
    );
    d.kill9();
    // Past the due time plus the one-minute on-time grace: the occurrence was missed.
    tokio::time::sleep(Duration::from_secs(3 + 62)).await;
    assert!(scheduled_requests(&llm).is_empty());
    let d = Daemon::start(dir.path(), &cfg, port).await;
    assert!(
        wait_until(T, || shown(&tg).iter().any(|t| t == "run of once-job")).await,
        "{:?}\n{}",
        shown(&tg),
        log_of(dir.path())
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let sched = scheduled_requests(&llm);
    assert_eq!(sched.len(), 1, "{sched:?}");
    assert!(
        sched[0].contains("once-job") && sched[0].contains("late"),
        "{}",
        sched[0]
    );
    d.kill9();
    let d = Daemon::start(dir.path(), &cfg, port).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(scheduled_requests(&llm).len(), 1);
    assert!(!shown(&tg).iter().any(|t| t.contains("skip-job")));
    assert_eq!(
        shown(&tg)
            .iter()
            .filter(|t| *t == "run of once-job")
            .count(),
        1
    );
    assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));
}

#[tokio::test]
async fn a_one_second_interval_is_refused_by_the_minimum() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::ToolCalls(vec![(
        "c1".into(),
        "cron".into(),
        json!({"action": "add", "name": "spam", "schedule": {"kind": "every", "seconds": 1}, "message": "ping"}).to_string(),
    )]));
    llm.push(Reply::Text("Could not schedule that.".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let (status, _) = gw.api.chat("c", "ping me every second").await;
    assert_eq!(status, 200);
    let reqs = llm.requests();
    assert!(crate::common::reachable_tools(&reqs[0]).contains(&"cron".to_string()));
    let (_, result) = tool_results(&reqs[1]).pop().unwrap();
    let text = result.to_string();
    assert!(text.contains("scheduler.min_interval_secs"), "{text}");
    assert!(gw
        .gateway
        .daemon
        .scheduler()
        .jobs()
        .list()
        .unwrap()
        .is_empty());
    gw.stop().await;
}

fn tg_config(
    llm: &FakeLlm,
    dir: &std::path::Path,
    tg: &FakeTelegram,
    extra: Value,
) -> clawft::config::Config {
    let mut v = json!({"channels": {"telegram": telegram_section(tg)}});
    crate::common::merge(&mut v, extra);
    config(llm, dir, v)
}

#[tokio::test]
async fn heartbeat_ok_is_not_delivered_and_a_finding_is_delivered_once() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let tg = Arc::new(FakeTelegram::start().await);
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    std::fs::write(
        dir.path().join("ws/HEARTBEAT.md"),
        "# Checks\n- is the disk full?\n",
    )
    .unwrap();
    let beats = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let b = beats.clone();
    llm.route(move |req| {
        if !last_user(req).starts_with("[Heartbeat") {
            return None;
        }
        let n = b.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Some(Reply::Text(if n == 1 {
            "The disk is 95% full.".into()
        } else {
            "HEARTBEAT_OK".into()
        }))
    });
    let gw = TestGateway::start(tg_config(
        &llm,
        dir.path(),
        &tg,
        json!({"heartbeat": {"enabled": true, "every": "1s", "model": "cheap-model",
            "target": {"channel": "telegram", "chat_id": CHAT.to_string()}}}),
    ))
    .await;
    assert!(
        wait_until(T, || shown(&tg).iter().any(|t| t.contains("95% full"))).await,
        "{:?}",
        shown(&tg)
    );
    assert!(wait_until(T, || beats.load(std::sync::atomic::Ordering::SeqCst) >= 4).await);
    // The heartbeat's tokens are counted like any turn's, under its own session.
    let usage = clawft::admin::usage_json(gw.gateway.daemon.store(), "session", 1).unwrap();
    let row = usage["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == format!("telegram:{CHAT}:-:heartbeat"))
        .cloned()
        .unwrap_or_else(|| panic!("{usage}"));
    assert!(row.to_string().contains("tokens"), "{row}");
    assert!(
        usage["total"]["input_tokens"].as_u64().unwrap_or(0) > 0,
        "{usage}"
    );
    gw.stop().await;
    let texts = shown(&tg);
    assert_eq!(
        texts,
        ["The disk is 95% full."],
        "only the finding is shown"
    );
    for req in llm.requests() {
        assert_eq!(req["model"], "cheap-model", "heartbeat.model is asked for");
        assert!(last_user(&req).contains("is the disk full?"));
    }
}

#[tokio::test]
async fn an_empty_heartbeat_file_makes_no_model_call() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let tg = Arc::new(FakeTelegram::start().await);
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    std::fs::write(
        dir.path().join("ws/HEARTBEAT.md"),
        "# Checks\n\n<!-- nothing yet -->\n",
    )
    .unwrap();
    let gw = TestGateway::start(tg_config(
        &llm,
        dir.path(),
        &tg,
        json!({"heartbeat": {"enabled": true, "every": "1s",
            "target": {"channel": "telegram", "chat_id": CHAT.to_string()}}}),
    ))
    .await;
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(llm.requests().is_empty());
    // Something to do: the next beat calls the model.
    llm.push(Reply::Text("HEARTBEAT_OK".into()));
    std::fs::write(dir.path().join("ws/HEARTBEAT.md"), "- check the backups\n").unwrap();
    assert_eq!(llm.wait_requests(1, T).await.len(), 1);
    gw.stop().await;
    assert!(shown(&tg).is_empty(), "{:?}", shown(&tg));
}

fn job_for_chat(name: &str, deliver: clawft::scheduler::Deliver) -> clawft::scheduler::NewJob {
    clawft::scheduler::NewJob {
        name: name.into(),
        schedule: clawft::scheduler::Schedule::Every { seconds: 86_400 },
        catch_up: clawft::scheduler::CatchUp::Once,
        payload: clawft::scheduler::Payload {
            message: format!("{name} now"),
            deliver,
        },
        target: clawft::scheduler::Target {
            channel: "telegram".into(),
            chat_id: CHAT.to_string(),
            thread: None,
        },
        owner: clawft::types::SessionKey::parse(&format!("telegram:{CHAT}")).unwrap(),
        created_by: Some(CHAT.to_string()),
    }
}

#[tokio::test]
async fn stop_in_the_chat_cancels_a_running_scheduled_turn_and_a_text_job_needs_no_model() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let tg = Arc::new(FakeTelegram::start().await);
    llm.push(Reply::Hang);
    let gw = TestGateway::start(tg_config(&llm, dir.path(), &tg, json!({}))).await;
    let s = gw.gateway.daemon.scheduler().clone();
    let job = s
        .jobs()
        .add(
            job_for_chat("long task", clawft::scheduler::Deliver::Turn),
            Utc::now(),
        )
        .unwrap();
    s.run_now(&job.id, None).unwrap();
    assert_eq!(llm.wait_requests(1, T).await.len(), 1);
    tg.push_user_message(CHAT, CHAT, "/stop");
    let last = || {
        s.jobs()
            .get(&job.id, None)
            .unwrap()
            .last_run
            .map(|r| r.outcome)
    };
    assert!(
        wait_until(T, || last() == Some(clawft::scheduler::Outcome::Cancelled)).await,
        "{:?}",
        last()
    );
    assert!(wait_until(T, || shown(&tg).iter().any(|t| t.contains("Stopping"))).await);

    // A reminder is sent as it is: one message, no model call.
    let calls = llm.requests().len();
    let text = s
        .jobs()
        .add(
            job_for_chat("stand up", clawft::scheduler::Deliver::Text),
            Utc::now(),
        )
        .unwrap();
    s.run_now(&text.id, None).unwrap();
    assert!(wait_until(T, || shown(&tg).iter().any(|t| t == "stand up now")).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        shown(&tg).iter().filter(|t| *t == "stand up now").count(),
        1
    );
    assert_eq!(llm.requests().len(), calls);
    assert_eq!(
        s.jobs()
            .get(&text.id, None)
            .unwrap()
            .last_run
            .unwrap()
            .outcome,
        clawft::scheduler::Outcome::Ok
    );
    gw.stop().await;
}

/// A session schedules for its own chat only, unless the operator's `tools.message.allow`
/// lists the other chat; it never sees or changes another session's jobs.
#[tokio::test]
async fn a_session_targets_other_chats_only_when_the_operator_allows_and_sees_only_its_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let add = |chat: &str| {
        Reply::ToolCalls(vec![(
            "c1".into(),
            "cron".into(),
            json!({"action": "add", "name": "x", "schedule": {"kind": "every", "seconds": 3600},
                   "message": "hi", "target": {"channel": "http", "chat_id": chat}})
            .to_string(),
        )])
    };
    llm.push(add("elsewhere"));
    llm.push(Reply::Text("denied".into()));
    llm.push(add("team"));
    llm.push(Reply::Text("added".into()));
    llm.push(Reply::ToolCalls(vec![(
        "c2".into(),
        "cron".into(),
        json!({"action": "list"}).to_string(),
    )]));
    llm.push(Reply::Text("listed".into()));
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"tools": {"message": {"allow": ["http:team"]}}}),
    ))
    .await;
    gw.api.chat("me", "remind elsewhere").await;
    gw.api.chat("me", "remind the team").await;
    gw.api.chat("other", "what is scheduled?").await;
    let reqs = llm.requests();
    let result = |i: usize| tool_results(&reqs[i]).pop().unwrap().1.to_string();
    assert!(result(1).contains("PERMISSION_DENIED"), "{}", result(1));
    assert!(result(3).contains("\"added\""), "{}", result(3));
    // The job is `http:me`'s: the chat `other` lists nothing.
    assert!(result(5).contains("\"jobs\":[]"), "{}", result(5));
    let jobs = gw.gateway.daemon.scheduler().jobs().list().unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].owner.as_str(), "http:me");
    assert_eq!(jobs[0].target.chat_id, "team");
    gw.stop().await;
}
