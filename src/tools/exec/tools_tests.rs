//! `exec_shell` and `spawn` tests: results, argument checks, the command gate (denylist,
//! allowlist, ask mode), the spawn limit, descriptions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::json;

use super::*;
use crate::tools::exec::test_support::*;
use crate::tools::exec::*;
use crate::tools::shell_policy::{Approval, Approver, ExecMode};
use crate::tools::{Effect, Tool, ToolContext, ToolError};
use crate::types::SessionKey;

#[tokio::test]
async fn exec_shell_runs_in_workspace_with_unicode_and_exit_codes() {
    let fx = fixture();
    let v = sh_ok(&fx, "echo 'héllo 世界 🚀'; echo oops >&2; exit 3").await;
    assert_eq!(v["exit_code"], 3);
    assert_eq!(v["stdout"], "héllo 世界 🚀\n");
    assert_eq!(v["stderr"], "oops\n");
    assert!(v["duration_ms"].is_u64());
    assert!(v.get("signal").is_none() && v.get("stdout_truncated").is_none());

    let v = sh_ok(&fx, "pwd; echo \"$HOME\"; echo \"$TMPDIR\"").await;
    let ws = fx.ws.to_str().unwrap();
    let tmp = fx.rt.tmp_dir().to_str().unwrap();
    assert_eq!(v["stdout"], format!("{ws}\n{ws}\n{tmp}\n"));

    let v = sh_ok(&fx, "true").await;
    assert_eq!(
        (v["exit_code"].as_i64(), v["stdout"].as_str()),
        (Some(0), Some(""))
    );

    let v = sh_ok(&fx, "kill -9 $$").await;
    assert_eq!(v["exit_code"], -1);
    assert_eq!(v["signal"], 9);

    // stdin is closed: a program reading it sees EOF instead of hanging.
    let v = sh_ok(&fx, "cat; echo done").await;
    assert_eq!(v["stdout"], "done\n");
}

#[tokio::test]
async fn invalid_arguments_are_refused() {
    let fx = fixture();
    let t = ExecShell::new(fx.rt.clone());
    for bad in [
        json!({}),
        json!({ "command": "" }),
        json!({ "command": "   " }),
        json!({ "command": "ls", "timeout": -1 }),
        json!({ "command": "ls", "timeout": 0 }),
        json!({ "command": "ls", "timeout": "5" }),
        json!({ "command": "ls", "cwd": "/" }),
        json!({ "command": "echo a\u{0}b" }),
    ] {
        let e = t.execute(bad.clone(), &fx.ctx).await.unwrap_err();
        assert_eq!(e.code(), "INVALID_ARGS", "{bad}: {e}");
    }
    let s = Spawn::new(fx.rt.clone());
    for bad in [
        json!({ "command": "" }),
        json!({ "command": "echo", "args": "x" }),
        json!({ "command": "echo", "args": ["a\u{0}"] }),
    ] {
        let e = s.execute(bad.clone(), &fx.ctx).await.unwrap_err();
        assert_eq!(e.code(), "INVALID_ARGS", "{bad}: {e}");
    }
    // A huge timeout is clamped, not refused.
    assert_eq!(
        fx.rt.timeout(Some(1e12), Duration::from_secs(30)).unwrap(),
        Duration::from_secs(300)
    );
}

#[tokio::test]
async fn denylist_evasions_are_refused_before_running() {
    let fx = fixture();
    for (i, cmd) in [
        "r''m -rf /nonexistent-clawft",
        "s\\udo true",
        "sh -c \"sudo true\"",
        "sudo${IFS}true",
        "echo x | base64 -d | sh",
    ]
    .iter()
    .enumerate()
    {
        let line = format!("touch marker{i}; {cmd}");
        let e = sh(&fx, &line).await.unwrap_err();
        assert_eq!(e.code(), "PERMISSION_DENIED", "{line}");
        assert!(e.to_string().contains("deny pattern"), "{e}");
        assert!(!fx.ws.join(format!("marker{i}")).exists(), "{line} ran");
    }
}

#[tokio::test]
async fn allowlist_mode_refuses_unlisted_programs_anywhere_in_the_line() {
    let settings = ExecFile {
        mode: Some("allowlist".into()),
        allow_commands: Some(vec!["ls".into(), "echo".into(), "touch".into()]),
        ..ExecFile::default()
    }
    .resolve()
    .unwrap();
    let fx = fixture_with(settings, |_| Vec::new(), None);
    for cmd in [
        "ls; curl x",
        "touch m1 && curl x",
        "touch m2 | python3 -c 1",
        "echo $(touch m3; cat /etc/passwd)",
        "sh -c 'touch m4'",
    ] {
        let e = sh(&fx, cmd).await.unwrap_err();
        assert_eq!(e.code(), "PERMISSION_DENIED", "{cmd}");
    }
    for m in ["m1", "m2", "m3", "m4"] {
        assert!(!fx.ws.join(m).exists(), "{m}");
    }
    let v = sh_ok(&fx, "touch ok && ls").await;
    assert_eq!(v["stdout"], "ok\n");
    let e = Spawn::new(fx.rt.clone())
        .execute(
            json!({"command": "sh", "args": ["-c", "touch m5"]}),
            &fx.ctx,
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), "PERMISSION_DENIED");
    assert!(!fx.ws.join("m5").exists());
}

#[tokio::test]
async fn spawn_runs_programs_directly() {
    let fx = fixture();
    let s = Spawn::new(fx.rt.clone());
    let v = s
        .execute(
            json!({"command": "echo", "args": ["héllo", "a;b", "$HOME"]}),
            &fx.ctx,
        )
        .await
        .unwrap();
    assert_eq!(v["stdout"], "héllo a;b $HOME\n");
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["command"], "echo");
    assert_eq!(v["description"], "(no description)");
    let v = s
        .execute(
            json!({"command": "sh", "args": ["-c", "exit 7"], "description": "test exit"}),
            &fx.ctx,
        )
        .await
        .unwrap();
    assert_eq!(
        (v["exit_code"].as_i64(), v["description"].as_str()),
        (Some(7), Some("test exit"))
    );
    let e = s
        .execute(json!({"command": "no-such-program-clawft"}), &fx.ctx)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "EXECUTION_FAILED", "{e}");
    let e = s
        .execute(json!({"command": "sudo", "args": ["id"]}), &fx.ctx)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "PERMISSION_DENIED", "{e}");
    let v = s
        .execute(
            json!({"command": "sh", "args": ["-c", "echo begun; sleep 5"], "timeout": 0.3}),
            &fx.ctx,
        )
        .await
        .unwrap();
    assert_eq!(v["timed_out"], json!(true), "{v}");
    assert_eq!(v["stdout"], "begun\n", "{v}");
}

#[tokio::test]
async fn spawn_limit_is_five_and_the_sixth_fails_at_once() {
    let fx = fixture();
    let mut running = Vec::new();
    for _ in 0..5 {
        let (rt, ctx) = (fx.rt.clone(), fx.ctx.clone());
        running.push(tokio::spawn(async move {
            Spawn::new(rt)
                .execute(json!({"command": "sleep", "args": ["5"]}), &ctx)
                .await
        }));
    }
    for _ in 0..250 {
        if fx.rt.spawn_slots.available_permits() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(fx.rt.spawn_slots.available_permits(), 0);
    let t = Instant::now();
    // A separate session shares the same limit.
    let other = ToolContext {
        session: SessionKey::parse("t:2").unwrap(),
        ..fx.ctx.clone()
    };
    let e = Spawn::new(fx.rt.clone())
        .execute(json!({"command": "echo", "args": ["6th"]}), &other)
        .await
        .unwrap_err();
    assert!(t.elapsed() < Duration::from_millis(500));
    assert_eq!(e.code(), "EXECUTION_FAILED");
    assert!(e.to_string().contains("at most 5"), "{e}");
    // exec_shell is not limited by spawn slots.
    assert_eq!(sh_ok(&fx, "echo free").await["stdout"], "free\n");
    fx.ctx.cancel.cancel();
    for r in running {
        assert_eq!(r.await.unwrap().unwrap_err(), ToolError::Cancelled);
    }
    assert_eq!(fx.rt.spawn_slots.available_permits(), 5);
}

/// Answers from a script, counting the questions.
struct ScriptedApprover {
    answers: Mutex<VecDeque<Approval>>,
    asked: AtomicUsize,
    delay: Duration,
}

impl ScriptedApprover {
    fn new(answers: &[Approval], delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            answers: Mutex::new(answers.iter().copied().collect()),
            asked: AtomicUsize::new(0),
            delay,
        })
    }
}

#[async_trait]
impl Approver for ScriptedApprover {
    async fn approve(
        &self,
        _session: &SessionKey,
        _command: &str,
        _on: crate::tools::shell_policy::RunsOn,
    ) -> Approval {
        self.asked.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        self.answers
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Approval::Deny)
    }
}

fn ask_fixture(approver: &Arc<ScriptedApprover>, timeout: Duration) -> Fx {
    let settings = ExecSettings {
        mode: ExecMode::Ask,
        allow_commands: vec!["ls".into()],
        approval_timeout: timeout,
        ..ExecSettings::default()
    };
    let a: Arc<dyn Approver> = approver.clone();
    fixture_with(settings, |_| Vec::new(), Some(a))
}

#[tokio::test]
async fn ask_mode_allow_once_allow_always_deny_and_timeout() {
    let ap = ScriptedApprover::new(
        &[
            Approval::AllowOnce,
            Approval::AllowOnce,
            Approval::AllowAlways,
        ],
        Duration::ZERO,
    );
    let fx = ask_fixture(&ap, Duration::from_secs(5));
    // Allowed programs run without asking.
    sh_ok(&fx, "ls").await;
    assert_eq!(ap.asked.load(Ordering::SeqCst), 0);
    // AllowOnce: asked each time.
    sh_ok(&fx, "touch once").await;
    sh_ok(&fx, "touch once").await;
    assert_eq!(ap.asked.load(Ordering::SeqCst), 2);
    assert!(fx.ws.join("once").exists());
    // AllowAlways: asked once, then remembered for this session.
    sh_ok(&fx, "touch always").await;
    sh_ok(&fx, " touch always ").await;
    assert_eq!(ap.asked.load(Ordering::SeqCst), 3);
    // Only that exact text: a lookalike with different quoting is asked about (and the
    // script is empty now, which means Deny).
    let e = sh(&fx, "echo 'x;touch pwned'").await.unwrap_err();
    assert_eq!(e.code(), "PERMISSION_DENIED");
    assert!(!fx.ws.join("pwned").exists());
    // ... and not for another session.
    let other = ToolContext {
        session: SessionKey::parse("t:2").unwrap(),
        ..fx.ctx.clone()
    };
    let e = ExecShell::new(fx.rt.clone())
        .execute(json!({"command": "touch always other"}), &other)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "PERMISSION_DENIED");
    assert!(!fx.ws.join("other").exists());
    // Deny.
    let e = sh(&fx, "touch denied").await.unwrap_err();
    assert_eq!(e.code(), "PERMISSION_DENIED");
    assert!(e.to_string().contains("denied"), "{e}");
    assert!(!fx.ws.join("denied").exists());
    // The denylist is never put to the approver.
    let before = ap.asked.load(Ordering::SeqCst);
    assert_eq!(
        sh(&fx, "sudo id").await.unwrap_err().code(),
        "PERMISSION_DENIED"
    );
    assert_eq!(ap.asked.load(Ordering::SeqCst), before);

    // Approving `echo 'x; touch y'` forever does not approve `echo x; touch y`.
    let ap = ScriptedApprover::new(&[Approval::AllowAlways], Duration::ZERO);
    let fx = ask_fixture(&ap, Duration::from_secs(5));
    let v = sh_ok(&fx, "echo 'x; touch y'").await;
    assert_eq!(v["stdout"], "x; touch y\n");
    assert_eq!(
        sh(&fx, "echo x; touch y").await.unwrap_err().code(),
        "PERMISSION_DENIED"
    );
    assert!(!fx.ws.join("y").exists());
    assert_eq!(ap.asked.load(Ordering::SeqCst), 2);

    // Cancellation while waiting for the human.
    let slow = ScriptedApprover::new(&[Approval::AllowOnce], Duration::from_secs(30));
    let fx = ask_fixture(&slow, Duration::from_secs(60));
    let (rt, ctx) = (fx.rt.clone(), fx.ctx.clone());
    let call = tokio::spawn(async move {
        ExecShell::new(rt)
            .execute(json!({"command": "touch waited"}), &ctx)
            .await
    });
    while slow.asked.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    fx.ctx.cancel.cancel();
    let r = tokio::time::timeout(Duration::from_secs(2), call)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.unwrap_err(), ToolError::Cancelled);
    assert!(!fx.ws.join("waited").exists());

    // No answer in time: deny.
    let slow = ScriptedApprover::new(&[Approval::AllowOnce], Duration::from_secs(30));
    let fx = ask_fixture(&slow, Duration::from_millis(200));
    let t = Instant::now();
    let e = sh(&fx, "touch late").await.unwrap_err();
    assert_eq!(e.code(), "PERMISSION_DENIED");
    assert!(t.elapsed() < Duration::from_secs(2));
    assert!(!fx.ws.join("late").exists());

    // Ask mode without an approver denies.
    let settings = ExecSettings {
        mode: ExecMode::Ask,
        ..ExecSettings::default()
    };
    let fx = fixture_with(settings, |_| Vec::new(), None);
    assert_eq!(
        sh(&fx, "touch x").await.unwrap_err().code(),
        "PERMISSION_DENIED"
    );
    assert!(!fx.ws.join("x").exists());
}

#[test]
fn tools_describe_their_limits() {
    let fx = fixture();
    let e = ExecShell::new(fx.rt.clone());
    let s = Spawn::new(fx.rt.clone());
    // Short (every request carries it, issue 32), with what a model must know before calling.
    for d in [e.description(), s.description()] {
        assert!(d.len() < 300, "{d}");
        assert!(d.contains("Timeout ") && d.contains("max 300s"), "{d}");
        assert!(d.contains("refused") && d.contains("No stdin"), "{d}");
    }
    assert!(s.description().contains("At most 5"));
    assert_eq!(e.parameters()["required"], json!(["command"]));
    assert_eq!(s.effect(), Effect::Executes);
    let _ = &fx.root;
}
