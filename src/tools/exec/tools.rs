//! The process tools over [`ExecRuntime`]: `exec_shell` (a `sh -c` command line) and `spawn`
//! (a program with arguments, at most N at once across all sessions).

use std::ffi::{OsStr, OsString};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use super::ExecRuntime;
use crate::tools::sandbox::NetworkStatus;
use crate::tools::shell_policy::ExecMode;
use crate::tools::{parse_args, schema_of, Effect, Tool, ToolContext, ToolError};

fn check_text(what: &str, s: &str) -> Result<(), ToolError> {
    if s.contains('\0') {
        return Err(ToolError::InvalidArgs(format!(
            "{what} contains a NUL byte"
        )));
    }
    Ok(())
}

fn describe(rt: &ExecRuntime, intro: &str, default_timeout: Duration, returns: &str) -> String {
    let s = &rt.settings;
    let net = match rt.status.jail.map(|j| j.network) {
        Some(NetworkStatus::Proxy) => {
            " No direct network: HTTP and HTTPS work through the proxy in $HTTPS_PROXY/$HTTP_PROXY (curl, pip, git, npm use it; raw sockets, UDP, DNS lookups and programs ignoring the proxy variables do not work); private addresses are refused."
        }
        Some(NetworkStatus::Direct | NetworkStatus::Unisolated) => "",
        Some(_) => " No network access.",
        None if rt.status.net_enforced => " Network (TCP) access is disabled.",
        None => "",
    };
    let policy = match s.mode {
        ExecMode::Denylist => "Dangerous commands (sudo, rm -rf /, curl | sh, ...) are refused.",
        ExecMode::Allowlist => "Only allowed programs may run; others are refused.",
        ExecMode::Ask => "Commands may need a human's approval first.",
    };
    format!(
        "{intro} Runs in the workspace directory with HOME set to it; writes are only possible inside the workspace and $TMPDIR, and files outside the workspace and system directories cannot be read.{net} {policy} stdin is closed: do not run interactive programs; background processes (`&`, `setsid`, daemons) are killed when the call returns. Non-zero exit codes are results, not errors. Timeout default {}s, max {}s; on timeout the whole process group is killed. Returns: {returns}",
        default_timeout.as_secs(),
        s.max_timeout.as_secs(),
    )
}

/// Arguments of `exec_shell`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecShellArgs {
    /// Shell command line, run with `sh -c` in the workspace directory.
    pub command: String,
    /// Timeout in seconds (default: 30, max: 300; larger values are clamped).
    pub timeout: Option<f64>,
}

/// `exec_shell`: a shell command line, sandboxed.
pub struct ExecShell {
    rt: Arc<ExecRuntime>,
    description: String,
}

impl ExecShell {
    /// The tool over the shared runtime.
    pub fn new(rt: Arc<ExecRuntime>) -> Self {
        let description = describe(
            &rt,
            "Execute a shell command (`sh -c`) and capture its output.",
            rt.settings.timeout,
            "{exit_code, stdout, stderr, duration_ms, signal?, stdout_truncated?, stderr_truncated?} (exit_code -1 and signal set when killed by a signal)",
        );
        Self { rt, description }
    }
}

#[async_trait]
impl Tool for ExecShell {
    fn name(&self) -> &str {
        "exec_shell"
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn parameters(&self) -> Value {
        schema_of::<ExecShellArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::Executes
    }
    fn time_budget(&self) -> Option<Duration> {
        Some(self.rt.time_budget())
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: ExecShellArgs = parse_args(self.name(), args)?;
        if a.command.trim().is_empty() {
            return Err(ToolError::InvalidArgs(
                "command is empty: give a shell command line such as `ls -la`".into(),
            ));
        }
        check_text("command", &a.command)?;
        let timeout = self.rt.timeout(a.timeout, self.rt.settings.timeout)?;
        self.rt
            .gate
            .check_shell(&ctx.session, &a.command, &ctx.cancel)
            .await?;
        let done = self
            .rt
            .run(
                ctx,
                OsStr::new("sh"),
                &["-c".into(), a.command.into()],
                timeout,
            )
            .await?;
        Ok(Value::Object(done.to_json()))
    }
}

/// Arguments of `spawn`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnArgs {
    /// Program to run: a name looked up in PATH, or a path (no shell: no pipes, globs or
    /// variables).
    pub command: String,
    /// Arguments, each passed as is (default: none).
    pub args: Option<Vec<String>>,
    /// Human-readable description of the task (default: "(no description)").
    pub description: Option<String>,
    /// Timeout in seconds (default: 60, max: 300; larger values are clamped).
    pub timeout: Option<f64>,
}

/// `spawn`: a program with arguments, no shell, at most N at once across all sessions.
pub struct Spawn {
    rt: Arc<ExecRuntime>,
    description: String,
}

impl Spawn {
    /// The tool over the shared runtime.
    pub fn new(rt: Arc<ExecRuntime>) -> Self {
        let intro = format!(
            "Spawn a program directly (no shell) with arguments and capture its output. At most {} spawned processes run at once across all sessions; past that the call fails at once.",
            rt.settings.max_concurrent_spawns
        );
        let description = describe(
            &rt,
            &intro,
            rt.settings.spawn_timeout,
            "{exit_code, stdout, stderr, command, description, duration_ms, signal?, stdout_truncated?, stderr_truncated?}",
        );
        Self { rt, description }
    }
}

#[async_trait]
impl Tool for Spawn {
    fn name(&self) -> &str {
        "spawn"
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn parameters(&self) -> Value {
        schema_of::<SpawnArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::Executes
    }
    fn time_budget(&self) -> Option<Duration> {
        Some(self.rt.time_budget())
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: SpawnArgs = parse_args(self.name(), args)?;
        if a.command.trim().is_empty() {
            return Err(ToolError::InvalidArgs(
                "command is empty: give a program name such as `ls`".into(),
            ));
        }
        check_text("command", &a.command)?;
        let args = a.args.unwrap_or_default();
        for arg in &args {
            check_text("an argument", arg)?;
        }
        let timeout = self.rt.timeout(a.timeout, self.rt.settings.spawn_timeout)?;
        let argv: Vec<String> = std::iter::once(a.command.clone())
            .chain(args.iter().cloned())
            .collect();
        self.rt
            .gate
            .check_argv(&ctx.session, &argv, &ctx.cancel)
            .await?;
        let max = self.rt.settings.max_concurrent_spawns;
        let _slot = self.rt.spawn_slots.clone().try_acquire_owned().map_err(|_| {
            ToolError::ExecutionFailed(format!(
                "spawn limit reached: at most {max} spawned processes may run at once (shared by all sessions); wait for one to finish, then try again"
            ))
        })?;
        let os_args: Vec<OsString> = args.into_iter().map(OsString::from).collect();
        let done = self
            .rt
            .run(ctx, OsStr::new(&a.command), &os_args, timeout)
            .await?;
        let mut m = done.to_json();
        m.insert("command".into(), json!(a.command));
        m.insert(
            "description".into(),
            json!(a
                .description
                .filter(|d| !d.trim().is_empty())
                .unwrap_or_else(|| "(no description)".into())),
        );
        Ok(Value::Object(m))
    }
}

#[cfg(test)]
#[path = "tools_tests.rs"]
mod tests;
