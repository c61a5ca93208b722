//! Stdio server processes: spawned in their own process group with a scrubbed environment,
//! stderr forwarded to the log (and its last lines kept for error messages), and the whole
//! group killed when the guard is dropped, so `npx` → `node` chains leave no orphans.

use std::collections::{BTreeMap, VecDeque};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::types::MutexExt;

/// Lines of stderr kept per server for error messages.
const STDERR_KEEP_LINES: usize = 5;
/// Longest stderr line kept or logged (bytes); the rest is cut.
const STDERR_LINE_MAX: usize = 400;

/// The last lines a server wrote to stderr.
#[derive(Clone, Default)]
pub(crate) struct StderrTail(Arc<Mutex<VecDeque<String>>>);

impl StderrTail {
    fn push(&self, line: String) {
        let mut q = self.0.locked();
        if q.len() == STDERR_KEEP_LINES {
            q.pop_front();
        }
        q.push_back(line);
    }

    /// `; stderr: a | b` or empty.
    pub(crate) fn suffix(&self) -> String {
        let q = self.0.locked();
        if q.is_empty() {
            String::new()
        } else {
            let v: Vec<&str> = q.iter().map(String::as_str).collect();
            format!("; server stderr: {}", v.join(" | "))
        }
    }
}

/// A running server process; dropping it kills its process group.
pub(crate) struct ChildGuard {
    child: Option<Child>,
    pid: Option<u32>,
}

impl ChildGuard {
    /// The child's pid (also its process group id).
    pub(crate) fn pid(&self) -> Option<u32> {
        self.pid
    }

    fn kill_group(&self, sig: rustix::process::Signal) {
        if let Some(pgid) = self.pid.and_then(|p| i32::try_from(p).ok()) {
            if let Some(pid) = rustix::process::Pid::from_raw(pgid) {
                let _ = rustix::process::kill_process_group(pid, sig);
            }
        }
    }

    /// How the child ended, waiting up to `within` for it (its stdout may close just before
    /// the exit is reported).
    pub(crate) async fn exit_status(&mut self, within: Duration) -> Option<String> {
        let c = self.child.as_mut()?;
        match tokio::time::timeout(within, c.wait()).await {
            Ok(Ok(st)) => Some(st.to_string()),
            _ => None,
        }
    }

    /// Stop the server: SIGTERM to the group, a short grace, SIGKILL, and reap.
    pub(crate) async fn terminate(mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(None)) {
            self.kill_group(rustix::process::Signal::TERM);
            if tokio::time::timeout(grace, child.wait()).await.is_err() {
                self.kill_group(rustix::process::Signal::KILL);
                let _ = child.start_kill();
                let _ = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
            }
        }
        // Whatever else is left in the group (grandchildren that ignored SIGTERM).
        self.kill_group(rustix::process::Signal::KILL);
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if self.child.is_some() {
            // Synchronous, no runtime needed; tokio reaps the child (kill_on_drop).
            self.kill_group(rustix::process::Signal::KILL);
        }
    }
}

/// Spawn `command args` with exactly `env`, stdin/stdout piped, stderr forwarded to the log
/// under `server`.
pub(crate) fn spawn(
    server: &str,
    command: &str,
    args: &[String],
    env: &BTreeMap<String, String>,
    tail: &StderrTail,
) -> std::io::Result<(ChildGuard, ChildStdout, ChildStdin)> {
    let mut cmd = Command::new(command);
    cmd.args(args)
        .env_clear()
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn()?;
    let pid = child.id();
    let stdout = child.stdout.take();
    let stdin = child.stdin.take();
    let stderr = child.stderr.take();
    let guard = ChildGuard {
        child: Some(child),
        pid,
    };
    let (Some(stdout), Some(stdin)) = (stdout, stdin) else {
        return Err(std::io::Error::other("the child's stdio pipes are missing"));
    };
    if let Some(mut err) = stderr {
        let server = server.to_string();
        let tail = tail.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            let mut line: Vec<u8> = Vec::new();
            let flush = |line: &mut Vec<u8>| {
                let text = String::from_utf8_lossy(line).trim_end().to_string();
                line.clear();
                if !text.is_empty() {
                    tracing::info!(mcp_server = %server, "{text}");
                    tail.push(text);
                }
            };
            loop {
                match err.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        for &b in &buf[..n] {
                            if b == b'\n' {
                                flush(&mut line);
                            } else if line.len() < STDERR_LINE_MAX {
                                line.push(b);
                            }
                        }
                    }
                }
            }
            flush(&mut line);
        });
    }
    Ok((guard, stdout, stdin))
}
