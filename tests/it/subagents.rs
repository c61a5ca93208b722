//! Subagents driven by a scripted LLM that answers each agent by what its request holds: the
//! parent chat session and its children call the same fake model concurrently.

use std::time::Duration;

use clawft::subagent::{SupervisorMsg, TaskRecord, TaskStatus};
use serde_json::{json, Value};

use crate::common::{config, messages, wait_until, TestGateway};
use crate::fake_llm::{FakeLlm, Reply};

const T: Duration = Duration::from_secs(20);

fn system(req: &Value) -> String {
    messages(req)
        .first()
        .and_then(|m| m["content"].as_str().map(str::to_string))
        .unwrap_or_default()
}

fn is_child(req: &Value) -> bool {
    system(req).contains("You are a subagent")
}

fn users(req: &Value) -> Vec<String> {
    messages(req)
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap_or("").to_string())
        .collect()
}

fn first_user(req: &Value) -> String {
    users(req).first().cloned().unwrap_or_default()
}

fn last_user(req: &Value) -> String {
    users(req).last().cloned().unwrap_or_default()
}

fn last_is_tool(req: &Value) -> bool {
    messages(req).last().is_some_and(|m| m["role"] == "tool")
}

fn tool_count(req: &Value) -> usize {
    messages(req).iter().filter(|m| m["role"] == "tool").count()
}

/// The tools a request makes reachable: offered in full, or listed to be loaded on demand.
fn offered(req: &Value) -> Vec<String> {
    crate::common::reachable_tools(req)
}

const ANNOUNCE: &str = "[Automatic message from the gateway";

fn call(id: &str, args: Value) -> (String, String, String) {
    (id.to_string(), "subagents".to_string(), args.to_string())
}

fn spawn(id: &str, task: &str) -> (String, String, String) {
    call(id, json!({"action": "spawn", "task": task, "label": task}))
}

/// Distinct announcement messages seen by the parent, in the order they first appeared.
fn announcements(llm: &FakeLlm) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in llm.requests() {
        for u in users(&r) {
            if u.starts_with(ANNOUNCE) && !out.contains(&u) {
                out.push(u);
            }
        }
    }
    out
}

/// Every task the supervisor knows under chat session `http:CHAT`.
async fn tasks(gw: &TestGateway, chat: &str) -> Vec<TaskRecord> {
    let caller = clawft::types::SessionKey::parse(&format!("http:{chat}")).unwrap();
    ractor::call_t!(
        gw.gateway.daemon.supervisor(),
        |reply| SupervisorMsg::List {
            caller,
            archived: true,
            reply
        },
        5000
    )
    .unwrap()
}

async fn wait_tasks(
    gw: &TestGateway,
    chat: &str,
    f: impl Fn(&[TaskRecord]) -> bool,
) -> Vec<TaskRecord> {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let t = tasks(gw, chat).await;
        if f(&t) || tokio::time::Instant::now() > deadline {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

/// The JSON tool results quoted in a reply made by `Reply::EchoToolResults` (every tool result
/// of the conversation so far: the last ones are this turn's).
fn echoed(reply: &Value) -> Vec<Value> {
    reply["reply"]
        .as_str()
        .unwrap_or("")
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[tokio::test]
async fn two_children_finishing_out_of_order_are_announced_together_once() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.route(|req| {
        if is_child(req) {
            return Some(match first_user(req).as_str() {
                "TASK slow" => Reply::Delay(
                    Duration::from_millis(600),
                    Box::new(Reply::Text("slow result".into())),
                ),
                "TASK fast" => Reply::Text("fast result".into()),
                _ => Reply::Text("?".into()),
            });
        }
        if last_is_tool(req) {
            return Some(Reply::EchoToolResults);
        }
        if last_user(req).starts_with(ANNOUNCE) {
            return Some(Reply::Text("both reported".into()));
        }
        if let Some(id) = last_user(req).strip_prefix("result of ") {
            return Some(Reply::ToolCalls(vec![
                call("r", json!({"action": "result", "id": id})),
                call("st", json!({"action": "status", "id": id})),
            ]));
        }
        Some(Reply::ToolCalls(vec![
            spawn("c1", "TASK slow"),
            spawn("c2", "TASK fast"),
        ]))
    });
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"tools": {"subagents": {"announce_debounce_ms": 1500}}}),
    ))
    .await;
    let (s, body) = gw.api.chat("p", "delegate two tasks").await;
    assert_eq!(s, 200, "{body}");
    // spawn answers at once with an id, before either child finished.
    let spawned = echoed(&body);
    assert_eq!(spawned.len(), 2, "{body}");
    for v in &spawned {
        assert_eq!(v["status"], "running", "{v}");
        assert_eq!(v["depth"], 1);
    }
    // The parent is woken once with both results, the fast one listed first.
    assert!(wait_until(T, || !announcements(&llm).is_empty()).await);
    let mut reply = Vec::new();
    for _ in 0..200 {
        let (_, mb) = gw.api.get("/v1/chats/p/messages").await;
        reply.extend(mb["messages"].as_array().cloned().unwrap_or_default());
        if !reply.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(reply.len(), 1, "{reply:?}");
    assert_eq!(reply[0]["content"], "both reported");
    let a = announcements(&llm);
    assert_eq!(a.len(), 1, "one batch: {a:?}");
    let (fast, slow) = (
        a[0].find("fast result").unwrap(),
        a[0].find("slow result").unwrap(),
    );
    assert!(fast < slow, "{}", a[0]);
    assert_eq!(a[0].matches("completed after").count(), 2, "{}", a[0]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let woken = llm
        .requests()
        .iter()
        .filter(|r| !is_child(r) && last_user(r).starts_with(ANNOUNCE))
        .count();
    assert_eq!(woken, 1, "the parent was woken once");
    let t = tasks(&gw, "p").await;
    assert_eq!(t.len(), 2);
    assert!(t
        .iter()
        .all(|r| r.status == TaskStatus::Completed && r.announced));
    assert!(t.iter().all(|r| r.usage.llm_calls == 1));
    // `result` gives the text, `status` the state without it.
    let slow = t.iter().find(|r| r.task == "TASK slow").unwrap();
    let (s, body) = gw.api.chat("p", &format!("result of {}", slow.id)).await;
    assert_eq!(s, 200, "{body}");
    let e = echoed(&body);
    let (res, st) = (&e[e.len() - 2], &e[e.len() - 1]);
    assert_eq!(res["result"], "slow result", "{body}");
    assert_eq!(res["status"], "completed");
    assert_eq!(st["status"], "completed");
    assert!(st.get("result").is_none(), "{st}");
    gw.stop().await;
    // The records outlive the process.
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let again = tasks(&gw, "p").await;
    assert_eq!(again, t);
    gw.stop().await;
}

#[tokio::test]
async fn run_returns_the_result_inline_and_cancels_a_child_slower_than_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.route(|req| {
        if is_child(req) {
            return Some(match first_user(req).as_str() {
                "TASK quick" => Reply::Text("quick result".into()),
                _ => Reply::Hang,
            });
        }
        if last_is_tool(req) {
            return Some(Reply::EchoToolResults);
        }
        Some(Reply::ToolCalls(vec![match last_user(req).as_str() {
            "run quick" => call("r1", json!({"action": "run", "task": "TASK quick"})),
            _ => call(
                "r2",
                json!({"action": "run", "task": "TASK slow", "timeout_secs": 1}),
            ),
        }]))
    });
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let (s, body) = gw.api.chat("r", "run quick").await;
    assert_eq!(s, 200, "{body}");
    let v = &echoed(&body)[0];
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(v["result"], "quick result");
    assert_eq!(v["usage"]["llm_calls"], 1);

    let started = std::time::Instant::now();
    let (s, body) = gw.api.chat("r", "run slow").await;
    assert_eq!(s, 200, "{body}");
    let v = &echoed(&body).last().cloned().unwrap();
    assert_eq!(v["status"], "failed", "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("timed out after 1s"),
        "{v}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    let t = tasks(&gw, "r").await;
    assert_eq!(
        t.iter().map(|r| r.status).collect::<Vec<_>>(),
        [TaskStatus::Completed, TaskStatus::Failed]
    );
    // run results are returned, not announced.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(announcements(&llm).is_empty());
    gw.stop().await;
}

#[tokio::test]
async fn children_limit_allows_exactly_n() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.route(|req| {
        if is_child(req) {
            return Some(Reply::Hang);
        }
        if last_is_tool(req) {
            return Some(Reply::EchoToolResults);
        }
        if last_user(req) == "cancel the last" {
            return Some(Reply::ToolCalls(vec![call(
                "k",
                json!({"action": "cancel", "id": "last"}),
            )]));
        }
        Some(Reply::ToolCalls(
            (0..4)
                .map(|i| spawn(&format!("s{i}"), "TASK wait"))
                .collect(),
        ))
    });
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"tools": {"subagents": {"max_children_per_agent": 3}}}),
    ))
    .await;
    let (s, body) = gw.api.chat("c", "spawn four").await;
    assert_eq!(s, 200, "{body}");
    let results = echoed(&body);
    let ok = results.iter().filter(|v| v["status"] == "running").count();
    let refused: Vec<_> = results
        .iter()
        .filter(|v| v["error_code"] == "PERMISSION_DENIED")
        .collect();
    assert_eq!((ok, refused.len()), (3, 1), "{body}");
    assert!(
        refused[0]["error"]
            .as_str()
            .unwrap()
            .contains("max_children_per_agent (3)"),
        "{body}"
    );
    let t = tasks(&gw, "c").await;
    assert_eq!(t.len(), 3);
    // `cancel last` takes the newest child only.
    let (s, body) = gw.api.chat("c", "cancel the last").await;
    assert_eq!(s, 200, "{body}");
    let v = echoed(&body).last().cloned().unwrap();
    assert_eq!(v["cancelled"], json!([t[2].id]), "{body}");
    let t = wait_tasks(&gw, "c", |t| t[2].status == TaskStatus::Cancelled).await;
    assert_eq!(
        t.iter().map(|r| r.status).collect::<Vec<_>>(),
        [
            TaskStatus::Running,
            TaskStatus::Running,
            TaskStatus::Cancelled
        ]
    );
    gw.stop().await;
}

#[tokio::test]
async fn concurrency_limit_counts_every_parent() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.route(|req| {
        if is_child(req) {
            return Some(Reply::Hang);
        }
        if last_is_tool(req) {
            return Some(Reply::EchoToolResults);
        }
        let n = if last_user(req) == "two" { 2 } else { 1 };
        Some(Reply::ToolCalls(
            (0..n)
                .map(|i| spawn(&format!("s{i}"), "TASK wait"))
                .collect(),
        ))
    });
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"tools": {"subagents": {"max_concurrent": 2}}}),
    ))
    .await;
    let (_, a) = gw.api.chat("a", "two").await;
    assert_eq!(
        echoed(&a)
            .iter()
            .filter(|v| v["status"] == "running")
            .count(),
        2,
        "{a}"
    );
    // Another session, well under its own children limit, is refused by the global one.
    let (_, b) = gw.api.chat("b", "one").await;
    let v = &echoed(&b)[0];
    assert_eq!(v["error_code"], "PERMISSION_DENIED", "{b}");
    assert!(
        v["error"].as_str().unwrap().contains("max_concurrent (2)"),
        "{b}"
    );
    // Once one is cancelled there is room again.
    let (s, _) = gw.api.chat("a", "/stop").await;
    assert_eq!(s, 200);
    let t = wait_tasks(&gw, "a", |t| t.iter().all(|r| !r.status.is_active())).await;
    assert!(t.iter().all(|r| r.status == TaskStatus::Cancelled), "{t:?}");
    let (_, b) = gw.api.chat("b", "one").await;
    assert_eq!(echoed(&b).last().unwrap()["status"], "running", "{b}");
    gw.stop().await;
}

#[tokio::test]
async fn depth_limit_allows_exactly_n_levels_and_usage_sums_up_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.route(|req| {
        if is_child(req) {
            if last_is_tool(req) {
                return Some(Reply::EchoToolResults);
            }
            return Some(Reply::ToolCalls(vec![match first_user(req).as_str() {
                "TASK level1" => call("l2", json!({"action": "run", "task": "TASK level2"})),
                _ => spawn("l3", "TASK level3"),
            }]));
        }
        if last_is_tool(req) {
            return Some(Reply::EchoToolResults);
        }
        if last_user(req).starts_with(ANNOUNCE) {
            return Some(Reply::Text("noted".into()));
        }
        if last_user(req) == "what ran?" {
            return Some(Reply::ToolCalls(vec![call(
                "ls",
                json!({"action": "list"}),
            )]));
        }
        Some(Reply::ToolCalls(vec![spawn("l1", "TASK level1")]))
    });
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"tools": {"subagents": {"max_spawn_depth": 2, "announce_debounce_ms": 0}}}),
    ))
    .await;
    let (s, body) = gw.api.chat("d", "go deep").await;
    assert_eq!(s, 200, "{body}");
    assert!(wait_until(T, || !announcements(&llm).is_empty()).await);
    let a = announcements(&llm);
    assert!(a[0].contains("max_spawn_depth (2) reached"), "{a:?}");
    // Depth 2 (the leaf) is refused a third level and is not offered `spawn`; depth 1 is.
    let reqs = llm.requests();
    assert!(!reqs.iter().any(|r| first_user(r) == "TASK level3"));
    let l1 = reqs
        .iter()
        .find(|r| first_user(r) == "TASK level1")
        .unwrap();
    let l2 = reqs
        .iter()
        .find(|r| first_user(r) == "TASK level2")
        .unwrap();
    assert!(offered(l1).contains(&"spawn".to_string()));
    assert!(!offered(l2).contains(&"spawn".to_string()));
    for r in [l1, l2] {
        for denied in ["message", "memory_write"] {
            assert!(!offered(r).contains(&denied.to_string()), "{denied}");
        }
    }
    let t = wait_tasks(&gw, "d", |t| {
        t.len() == 2 && t.iter().all(|r| r.status == TaskStatus::Completed)
    })
    .await;
    assert_eq!(t.iter().map(|r| r.depth).collect::<Vec<_>>(), [1, 2]);
    // Usage of level 1 (2 calls) includes level 2's (2 calls).
    let caller = clawft::types::SessionKey::parse("http:d").unwrap();
    let (rec, usage) = ractor::call_t!(
        gw.gateway.daemon.supervisor(),
        |reply| SupervisorMsg::Get {
            caller,
            id: t[0].id.clone(),
            reply
        },
        5000
    )
    .unwrap()
    .unwrap();
    assert_eq!(rec.usage.llm_calls, 2);
    assert_eq!(usage.llm_calls, 4);
    assert_eq!(usage.tool_calls, 2);
    // The parent's `list` shows its whole tree and the summed usage.
    let (s, body) = gw.api.chat("d", "what ran?").await;
    assert_eq!(s, 200, "{body}");
    let v = echoed(&body).last().cloned().unwrap();
    let listed = v["tasks"].as_array().unwrap();
    assert_eq!(listed.len(), 2, "{v}");
    assert_eq!(listed[1]["parent"], format!("subagent:{}", t[0].id));
    assert_eq!(v["running"], 0);
    assert_eq!(v["usage"]["llm_calls"], 4, "{v}");
    gw.stop().await;
}

#[tokio::test]
async fn a_looping_spawning_model_stays_within_limits_and_stop_cancels_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.route(|req| {
        if is_child(req) {
            // A child tries to spawn too (refused: depth), then hangs.
            if tool_count(req) > 0 {
                return Some(Reply::Hang);
            }
            return Some(Reply::ToolCalls(vec![spawn("g", "TASK grandchild")]));
        }
        if last_user(req) == "hello" {
            return Some(Reply::Text("hi".into()));
        }
        // The parent spawns on every round, forever.
        let n = tool_count(req);
        Some(Reply::ToolCalls(vec![spawn(&format!("b{n}"), "TASK bomb")]))
    });
    // The same spawn every round: the loop breaker (which would end the turn at the 6th) is
    // set aside, so the spawn limits are what holds.
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"agents": {"defaults": {"max_tool_iterations": 12, "loop_repeat_limit": 100}}}),
    ))
    .await;
    let (s, body) = gw.api.chat("f", "fork bomb").await;
    assert_eq!(s, 502, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("12 rounds"),
        "{body}"
    );
    let t = tasks(&gw, "f").await;
    assert_eq!(t.len(), 5, "children limit (5) held: {t:?}");
    assert!(t
        .iter()
        .all(|r| r.depth == 1 && r.status == TaskStatus::Running));
    // 7 refusals went back to the parent; every child was refused a grandchild.
    let last_parent = llm
        .requests()
        .into_iter()
        .rfind(|r| !is_child(r) && first_user(r) == "fork bomb")
        .unwrap();
    let refused = messages(&last_parent)
        .iter()
        .filter(|m| {
            m["role"] == "tool"
                && m["content"]
                    .as_str()
                    .unwrap_or("")
                    .contains("max_children_per_agent (5)")
        })
        .count();
    assert_eq!(
        refused, 6,
        "12 rounds: 5 accepted, 6 refused in the last request"
    );
    assert!(
        wait_until(T, || {
            llm.requests()
                .iter()
                .filter(|r| is_child(r) && tool_count(r) > 0)
                .count()
                == 5
        })
        .await
    );
    for r in llm
        .requests()
        .iter()
        .filter(|r| is_child(r) && tool_count(r) > 0)
    {
        assert!(r.to_string().contains("max_spawn_depth (1) reached"), "{r}");
    }
    assert!(!llm
        .requests()
        .iter()
        .any(|r| first_user(r) == "TASK grandchild"));
    // The gateway still answers others.
    let (s, body) = gw.api.chat("other", "hello").await;
    assert_eq!((s, body["reply"].as_str()), (200, Some("hi")));
    // /stop in the parent's chat cancels the whole tree; nothing is announced.
    let (s, _) = gw.api.chat("f", "/stop").await;
    assert_eq!(s, 200);
    let t = wait_tasks(&gw, "f", |t| t.iter().all(|r| !r.status.is_active())).await;
    assert!(t.iter().all(|r| r.status == TaskStatus::Cancelled), "{t:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(announcements(&llm).is_empty());
    gw.stop().await;
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

#[tokio::test]
async fn cancel_all_stops_running_children_and_kills_their_processes() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.route(|req| {
        if is_child(req) {
            if tool_count(req) > 0 {
                return Some(Reply::Text("done".into()));
            }
            let name = first_user(req).replace("TASK ", "");
            return Some(Reply::ToolCalls(vec![(
                "x".into(),
                "exec_shell".into(),
                // The host pid (commands have their own pid namespace; /proc is the host's).
                json!({"command": format!("read p r < /proc/self/stat; echo $p > {name}.pid; exec sleep 60")}).to_string(),
            )]));
        }
        if last_is_tool(req) {
            return Some(Reply::EchoToolResults);
        }
        Some(Reply::ToolCalls(if last_user(req) == "stop them" {
            vec![call("k", json!({"action": "cancel", "id": "all"}))]
        } else {
            vec![spawn("a", "TASK a"), spawn("b", "TASK b")]
        }))
    });
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let (s, _) = gw.api.chat("k", "start two").await;
    assert_eq!(s, 200);
    let ws = dir.path().join("ws");
    let mut pids = Vec::new();
    for name in ["a", "b"] {
        let f = ws.join(format!("{name}.pid"));
        assert!(
            wait_until(T, || std::fs::read_to_string(&f)
                .is_ok_and(|s| s.trim().parse::<i32>().is_ok()))
            .await
        );
        pids.push(
            std::fs::read_to_string(&f)
                .unwrap()
                .trim()
                .parse::<i32>()
                .unwrap(),
        );
    }
    assert!(pids.iter().all(|p| alive(*p)));
    let (s, body) = gw.api.chat("k", "stop them").await;
    assert_eq!(s, 200, "{body}");
    let v = echoed(&body).last().cloned().unwrap();
    assert_eq!(v["cancelled"].as_array().unwrap().len(), 2, "{body}");
    assert!(
        wait_until(T, || pids.iter().all(|p| !alive(*p))).await,
        "processes survived"
    );
    let t = wait_tasks(&gw, "k", |t| t.iter().all(|r| !r.status.is_active())).await;
    assert!(t.iter().all(|r| r.status == TaskStatus::Cancelled
        && r.error.as_deref() == Some("cancelled by its parent")));
    gw.stop().await;
}

#[tokio::test]
async fn steer_replaces_a_running_child_and_only_the_new_one_reports() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.route(|req| {
        if is_child(req) {
            return Some(match first_user(req).as_str() {
                "TASK v2" => Reply::Text("v2 done".into()),
                _ => Reply::Hang,
            });
        }
        if last_is_tool(req) {
            return Some(Reply::EchoToolResults);
        }
        if last_user(req).starts_with(ANNOUNCE) {
            return Some(Reply::Text("reported".into()));
        }
        if last_user(req) == "change course" {
            // The id the spawn returned earlier in this conversation.
            let id = messages(req)
                .iter()
                .filter(|m| m["role"] == "tool")
                .find_map(|m| {
                    serde_json::from_str::<Value>(m["content"].as_str()?)
                        .ok()?
                        .get("id")?
                        .as_str()
                        .map(str::to_string)
                })
                .unwrap_or_default();
            return Some(Reply::ToolCalls(vec![call(
                "st",
                json!({"action": "steer", "id": id, "task": "TASK v2"}),
            )]));
        }
        Some(Reply::ToolCalls(vec![spawn("v1", "TASK v1")]))
    });
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"tools": {"subagents": {"announce_debounce_ms": 0}}}),
    ))
    .await;
    let (_, body) = gw.api.chat("s", "start").await;
    let old = echoed(&body)[0]["id"].as_str().unwrap().to_string();
    assert!(
        wait_until(T, || llm
            .requests()
            .iter()
            .any(|r| first_user(r) == "TASK v1"))
        .await
    );
    let (s, body) = gw.api.chat("s", "change course").await;
    assert_eq!(s, 200, "{body}");
    let v = &echoed(&body).last().cloned().unwrap();
    assert_eq!(v["cancelled"], old.as_str(), "{body}");
    let new = v["id"].as_str().unwrap().to_string();
    assert_ne!(new, old);
    assert!(wait_until(T, || !announcements(&llm).is_empty()).await);
    let a = announcements(&llm);
    assert_eq!(a.len(), 1);
    assert!(a[0].contains(&new) && a[0].contains("v2 done"), "{a:?}");
    assert!(!a[0].contains(&old), "{a:?}");
    let t = tasks(&gw, "s").await;
    let by = |id: &str| t.iter().find(|r| r.id == id).unwrap().clone();
    assert_eq!(by(&old).status, TaskStatus::Cancelled);
    assert_eq!(by(&old).error.as_deref(), Some("replaced by steer"));
    assert_eq!(by(&new).status, TaskStatus::Completed);
    gw.stop().await;
}

#[tokio::test]
async fn a_model_respawning_on_every_result_stops_at_the_hourly_budget() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.route(|req| {
        if is_child(req) {
            return Some(Reply::Text("done again".into()));
        }
        let refused = messages(req).last().is_some_and(|m| {
            m["role"] == "tool"
                && m["content"]
                    .as_str()
                    .unwrap_or("")
                    .contains("max_spawns_per_hour (3)")
        });
        if refused {
            return Some(Reply::Text("giving up".into()));
        }
        if last_is_tool(req) {
            return Some(Reply::Text("spawned".into()));
        }
        // Every wake (the user's message or a result) spawns another child.
        Some(Reply::ToolCalls(vec![spawn(
            &format!("c{}", tool_count(req)),
            "TASK again",
        )]))
    });
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"tools": {"subagents": {"max_spawns_per_hour": 3, "announce_debounce_ms": 0}}}),
    ))
    .await;
    let (s, _) = gw.api.chat("loop", "keep going").await;
    assert_eq!(s, 200);
    assert!(
        wait_until(T, || llm.requests().iter().any(|r| {
            !is_child(r)
                && messages(r).last().is_some_and(|m| {
                    m["content"]
                        .as_str()
                        .unwrap_or("")
                        .contains("max_spawns_per_hour (3)")
                })
        }))
        .await
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let t = tasks(&gw, "loop").await;
    assert_eq!(t.len(), 3, "{t:?}");
    assert_eq!(announcements(&llm).len(), 3);
    gw.stop().await;
}

#[tokio::test]
async fn a_spawned_child_over_the_run_timeout_is_cancelled_and_reported_as_timed_out() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.route(|req| {
        if is_child(req) {
            return Some(Reply::Hang);
        }
        if last_is_tool(req) {
            return Some(Reply::Text("started".into()));
        }
        if last_user(req).starts_with(ANNOUNCE) {
            return Some(Reply::Text("it timed out".into()));
        }
        Some(Reply::ToolCalls(vec![spawn("t", "TASK forever")]))
    });
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"tools": {"subagents": {"run_timeout_secs": 1, "announce_debounce_ms": 0}}}),
    ))
    .await;
    let (s, _) = gw.api.chat("t", "go").await;
    assert_eq!(s, 200);
    assert!(wait_until(T, || !announcements(&llm).is_empty()).await);
    let a = announcements(&llm);
    assert!(
        a[0].contains("timed out after 1s (tools.subagents.run_timeout_secs)"),
        "{a:?}"
    );
    let t = tasks(&gw, "t").await;
    assert_eq!(t[0].status, TaskStatus::Failed);
    gw.stop().await;
}
