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

fn describe(rt: &ExecRuntime, intro: &str, default_timeout: Duration) -> String {
    let s = &rt.settings;
    let net = match rt.status.jail.map(|j| j.network) {
        Some(NetworkStatus::Proxy) => " Network: HTTP(S) only, through $HTTPS_PROXY.",
        Some(NetworkStatus::Direct | NetworkStatus::Unisolated) => "",
        Some(_) => " No network.",
        None if rt.status.net_enforced => " No TCP network.",
        None => "",
    };
    let policy = match s.mode {
        ExecMode::Denylist => "Dangerous commands are refused.",
        ExecMode::Allowlist => "Only allowed programs run.",
        ExecMode::Ask => "Commands may need a human's approval.",
    };
    // What a model needs before calling; the rest (the sandbox's details, why a command was
    // refused) is in the error it gets and in docs/tools.md.
    format!(
        "{intro} Runs in the workspace; writes only there and in $TMPDIR.{net} {policy} No stdin; background processes die with the call. Timeout {}s, max {}s.",
        default_timeout.as_secs(),
        s.max_timeout.as_secs(),
    )
}

/// Arguments of `exec_shell`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecShellArgs {
    /// Shell command line.
    pub command: String,
    /// Seconds.
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
        let description = describe(&rt, "Run a shell command (`sh -c`).", rt.settings.timeout);
        Self { rt, description }
    }
}

#[async_trait]
impl Tool for ExecShell {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::ExecShell.name()
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
    /// A name in PATH, or a path (no pipes, globs or variables).
    pub command: String,
    /// Each passed as is.
    pub args: Option<Vec<String>>,
    /// What the task is, for the logs.
    pub description: Option<String>,
    /// Seconds.
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
            "Run a program with arguments, no shell. At most {} at once (all chats).",
            rt.settings.max_concurrent_spawns
        );
        let description = describe(&rt, &intro, rt.settings.spawn_timeout);
        Self { rt, description }
    }
}

#[async_trait]
impl Tool for Spawn {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::Spawn.name()
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
