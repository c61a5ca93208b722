//! `process` tests: start, poll, write, log, kill, the per-session cap, the idle timeout,
//! sessions kept apart, the output ring, `/new` and shutdown, the sandbox.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::*;
use crate::tools::exec::test_support::*;
use crate::tools::exec::ExecSettings;
use crate::tools::{Tool, ToolContext, ToolError};
use crate::types::SessionKey;

fn tool(fx: &Fx, table: &Arc<ProcessTable>) -> ProcessTool {
    ProcessTool::new(fx.rt.clone(), table.clone())
}

async fn call(t: &ProcessTool, ctx: &ToolContext, args: Value) -> Value {
    t.execute(args.clone(), ctx)
        .await
        .unwrap_or_else(|e| panic!("{args}: {e}"))
}

async fn start(t: &ProcessTool, ctx: &ToolContext, command: &str) -> (String, i32) {
    let v = call(t, ctx, json!({"action": "start", "command": command})).await;
    assert_eq!(v["status"], "running", "{v}");
    let pid = i32::try_from(v["pid"].as_u64().unwrap()).unwrap();
    assert!(pid > 1, "{v}");
    (v["id"].as_str().unwrap().to_string(), pid)
}

/// Poll until the output gathered satisfies `done`; returns it and the last poll.
async fn poll_until(
    t: &ProcessTool,
    ctx: &ToolContext,
    id: &str,
    done: impl Fn(&str) -> bool,
) -> (String, Value) {
    let mut all = String::new();
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let v = call(t, ctx, json!({"action": "poll", "id": id})).await;
        all.push_str(v["output"].as_str().unwrap());
        if done(&all) {
            return (all, v);
        }
        assert!(
            Instant::now() < end,
            "gave up; output so far {all:?}, last {v}"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

#[tokio::test]
async fn started_polled_written_logged_and_killed() {
    let fx = fixture();
    let table = ProcessTable::new();
    let t = tool(&fx, &table);
    let (id, pid) = start(&t, &fx.ctx, "echo a; sleep 100").await;
    let (out, v) = poll_until(&t, &fx.ctx, &id, |o| o.contains('a')).await;
    assert_eq!(out, "a\n");
    assert_eq!(
        (v["status"].as_str(), v["pid"].as_i64()),
        (Some("running"), Some(i64::from(pid)))
    );
    // Nothing new since.
    let v = call(&t, &fx.ctx, json!({"action": "poll", "id": id})).await;
    assert_eq!(v["output"], "", "{v}");
    assert_eq!(v["unread_bytes"], 0, "{v}");
    let v = call(&t, &fx.ctx, json!({"action": "list"})).await;
    assert_eq!(v["processes"][0]["id"], id.as_str(), "{v}");
    assert_eq!(v["processes"][0]["command"], "echo a; sleep 100", "{v}");
    // kill: the whole group is gone (and reaped), the entry says so until removed.
    let v = call(&t, &fx.ctx, json!({"action": "kill", "id": id})).await;
    assert_eq!(
        (
            v["status"].as_str(),
            v["killed_by"].as_str(),
            v["signal"].as_i64()
        ),
        (Some("killed"), Some("kill"), Some(9)),
        "{v}"
    );
    assert!(gone_within(pid, Duration::from_secs(5)).await);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "not reaped"
    );
    let v = call(&t, &fx.ctx, json!({"action": "kill", "id": id})).await;
    assert_eq!(v["removed"], true, "{v}");
    let e = t
        .execute(json!({"action": "poll", "id": id}), &fx.ctx)
        .await
        .unwrap_err();
    assert!(matches!(e, ToolError::NotFound(_)), "{e}");

    // stdin: what is written reaches the process; eof closes it and `cat` ends.
    let (id, _) = start(&t, &fx.ctx, "cat; echo bye").await;
    let v = call(
        &t,
        &fx.ctx,
        json!({"action": "write", "id": id, "data": "hello\n"}),
    )
    .await;
    assert_eq!(v["written_bytes"], 6, "{v}");
    poll_until(&t, &fx.ctx, &id, |o| o == "hello\n").await;
    call(
        &t,
        &fx.ctx,
        json!({"action": "write", "id": id, "data": "end\n", "eof": true}),
    )
    .await;
    let (out, v) = poll_until(&t, &fx.ctx, &id, |o| o.contains("bye")).await;
    assert_eq!(out, "end\nbye\n");
    let end = Instant::now() + Duration::from_secs(5);
    let mut v = v;
    while v["status"] == "running" && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
        v = call(&t, &fx.ctx, json!({"action": "poll", "id": id})).await;
    }
    assert_eq!(
        (v["status"].as_str(), v["exit_code"].as_i64()),
        (Some("exited"), Some(0)),
        "{v}"
    );
    let e = t
        .execute(json!({"action": "write", "id": id, "data": "x"}), &fx.ctx)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no stdin"), "{e}");
    // A finished process stays listed with its exit status.
    let v = call(&t, &fx.ctx, json!({"action": "list"})).await;
    assert_eq!(v["processes"][0]["exit_code"], 0, "{v}");

    // log: the last lines, without moving the poll cursor.
    let (id, _) = start(&t, &fx.ctx, "seq 1 100 | sed 's/^/line/'; sleep 100").await;
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let v = call(&t, &fx.ctx, json!({"action": "log", "id": id, "lines": 3})).await;
        if v["output"] == "line98\nline99\nline100\n" {
            assert_eq!(v["earlier_output_omitted"], true);
            break;
        }
        assert!(Instant::now() < end, "{v}");
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let v = call(
        &t,
        &fx.ctx,
        json!({"action": "poll", "id": id, "max_bytes": 12}),
    )
    .await;
    assert_eq!(
        (v["output"].as_str(), v["more"].as_bool()),
        (Some("line1\nline2\n"), Some(true)),
        "{v}"
    );

    // Bad input names what is missing.
    for (args, want) in [
        (json!({"action": "start"}), "needs `command`"),
        (json!({"action": "poll"}), "needs `id`"),
        (json!({"action": "write", "id": id}), "needs `data`"),
        (json!({"action": "frob"}), "unknown action"),
        (
            json!({"action": "log", "id": id, "lines": 0}),
            "lines must be at least 1",
        ),
    ] {
        let e = t.execute(args.clone(), &fx.ctx).await.unwrap_err();
        assert!(e.to_string().contains(want), "{args}: {e}");
    }
    table.shutdown().await;
}

#[tokio::test]
async fn the_cap_is_per_session_and_sessions_do_not_see_each_other() {
    let fx = fixture_with(
        ExecSettings {
            max_background_processes: 2,
            ..ExecSettings::default()
        },
        |_| Vec::new(),
        None,
    );
    let table = ProcessTable::new();
    let t = tool(&fx, &table);
    let (a, pa) = start(&t, &fx.ctx, "sleep 100").await;
    let (_b, pb) = start(&t, &fx.ctx, "sleep 100").await;
    let e = t
        .execute(json!({"action": "start", "command": "sleep 100"}), &fx.ctx)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("at most 2") && e.to_string().contains("max_background_processes"),
        "{e}"
    );
    // Another session has its own cap, and sees none of these.
    let mut other = fx.ctx.clone();
    other.session = SessionKey::parse("t:2").unwrap();
    let v = call(&t, &other, json!({"action": "list"})).await;
    assert_eq!(v["processes"], json!([]), "{v}");
    for action in ["poll", "log", "kill"] {
        let e = t
            .execute(json!({"action": action, "id": a}), &other)
            .await
            .unwrap_err();
        assert!(matches!(e, ToolError::NotFound(_)), "{action}: {e}");
    }
    assert!(alive(pa), "another session's kill reached it");
    let (_c, pc) = start(&t, &other, "sleep 100").await;
    // Once one has ended, there is room again.
    call(&t, &fx.ctx, json!({"action": "kill", "id": a})).await;
    let (_d, pd) = start(&t, &fx.ctx, "sleep 100").await;
    // `/new` kills one session's processes only; shutdown the rest, and refuses new ones.
    table.kill_session(&fx.ctx.session);
    for pid in [pa, pb, pd] {
        assert!(gone_within(pid, Duration::from_secs(5)).await, "{pid}");
    }
    assert!(alive(pc));
    assert_eq!(table.running(), 1);
    table.shutdown().await;
    assert!(!alive(pc) && !std::path::Path::new(&format!("/proc/{pc}")).exists());
    let e = t
        .execute(json!({"action": "start", "command": "true"}), &other)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("shutting down"), "{e}");
}

#[tokio::test]
async fn an_idle_process_is_killed_and_a_polled_one_is_not() {
    let fx = fixture_with(
        ExecSettings {
            background_idle: Duration::from_secs(1),
            ..ExecSettings::default()
        },
        |_| Vec::new(),
        None,
    );
    let table = ProcessTable::with_sweep(Duration::from_millis(100));
    let t = tool(&fx, &table);
    let (idle, pid) = start(&t, &fx.ctx, "sleep 100").await;
    let (used, pid2) = start(&t, &fx.ctx, "sleep 100").await;
    let end = Instant::now() + Duration::from_millis(1600);
    while Instant::now() < end {
        call(&t, &fx.ctx, json!({"action": "poll", "id": used})).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(gone_within(pid, Duration::from_secs(5)).await);
    let v = call(&t, &fx.ctx, json!({"action": "list"})).await;
    let idle_entry = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == idle.as_str())
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(idle_entry["status"], "killed", "{v}");
    assert!(idle_entry["killed_by"]
        .as_str()
        .unwrap()
        .contains("background_idle_secs"));
    assert!(alive(pid2));
    table.shutdown().await;
}

#[tokio::test]
async fn the_output_ring_keeps_the_newest_bytes_and_says_how_many_were_dropped() {
    let fx = fixture();
    let table = ProcessTable::new();
    let t = tool(&fx, &table);
    let total = RING_BYTES + 40_000;
    let (id, _) = start(
        &t,
        &fx.ctx,
        &format!("head -c {total} /dev/zero | tr '\\0' x; echo END; sleep 100"),
    )
    .await;
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let v = call(&t, &fx.ctx, json!({"action": "list"})).await;
        if v["processes"][0]["unread_bytes"] == RING_BYTES {
            break;
        }
        assert!(Instant::now() < end, "{v}");
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let (out, _) = {
        let v = call(
            &t,
            &fx.ctx,
            json!({"action": "poll", "id": id, "max_bytes": 1_000_000}),
        )
        .await;
        assert_eq!(
            v["dropped_bytes"],
            total + 4 - RING_BYTES,
            "{}",
            v["dropped_bytes"]
        );
        assert_eq!(v["more"], true);
        (v["output"].as_str().unwrap().to_string(), v)
    };
    assert_eq!(out.len(), 60 * 1024, "capped at max_bytes' maximum");
    let (rest, _) = poll_until(&t, &fx.ctx, &id, |o| o.ends_with("END\n")).await;
    assert_eq!(out.len() + rest.len(), RING_BYTES);
    table.shutdown().await;
}

#[tokio::test]
async fn background_commands_run_in_the_exec_sandbox() {
    let fx = fixture();
    let table = ProcessTable::new();
    let t = tool(&fx, &table);
    let (id, _) = start(
        &t,
        &fx.ctx,
        &format!(
            "echo \"tok=$FOO_TOKEN home=$HOME\"; cat {} 2>/dev/null; echo rc=$?; sleep 100",
            fx.canary.display()
        ),
    )
    .await;
    let (out, _) = poll_until(&t, &fx.ctx, &id, |o| o.contains("rc=")).await;
    assert!(
        out.starts_with(&format!("tok= home={}\n", fx.ws.display())),
        "{out}"
    );
    if landlock_or_skip(&fx) {
        assert!(!out.contains(CANARY_TEXT) && !out.contains("rc=0"), "{out}");
    }
    // The command gate applies as for exec_shell.
    let e = t
        .execute(json!({"action": "start", "command": "sudo id"}), &fx.ctx)
        .await
        .unwrap_err();
    assert!(matches!(e, ToolError::PermissionDenied(_)), "{e}");
    // A call cancelled (`/stop`, `/new`) while starting leaves nothing running.
    let mut cancelled = fx.ctx.clone();
    cancelled.cancel = tokio_util::sync::CancellationToken::new();
    cancelled.cancel.cancel();
    let e = t
        .execute(
            json!({"action": "start", "command": "sleep 100"}),
            &cancelled,
        )
        .await
        .unwrap_err();
    assert!(matches!(e, ToolError::Cancelled), "{e}");
    assert_eq!(table.running(), 1, "only the first one runs");
    table.shutdown().await;
}

#[test]
fn characters_are_not_cut_between_reads() {
    let s = "aé€😀".as_bytes();
    assert_eq!(complete_prefix(s), s.len());
    for cut in 1..4 {
        let b = &"😀".as_bytes()[..cut];
        assert_eq!(complete_prefix(b), 0, "{cut}");
        let mut v = b"ab".to_vec();
        v.extend_from_slice(b);
        assert_eq!(complete_prefix(&v), 2, "{cut}");
    }
    assert_eq!(cut_head(&"😀".as_bytes()[1..]), 3);
    assert_eq!(cut_head(b"abc"), 0);
    let mut r = Ring::new(4);
    r.push(b"abcdef");
    assert_eq!((r.start, r.end(), r.from(0)), (2, 6, b"cdef".to_vec()));
}
