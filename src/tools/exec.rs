//! Process tools: `exec_shell` (a `sh -c` command line) and `spawn` (a program with arguments,
//! at most 5 at once). Both vet the command with the [`CommandGate`] (denylist, allowlist or
//! human approval: a speed bump), then run it in the workspace directory, in its own process
//! group, inside the [`sandbox`](super::sandbox) (the boundary), with a scrubbed environment,
//! stdin closed and stdout/stderr captured up to a cap.
//!
//! Every exit path kills the whole process group with SIGKILL: timeout, cancellation, the
//! call's future being dropped (the registry's own timeout) and normal exit (background jobs do
//! not outlive the call, and a grandchild holding the pipes open cannot make it hang).
//! Tools never decide what reaches the model beyond their result: the registry scrubs secrets
//! and truncates to 64 KiB.

use std::ffi::{OsStr, OsString};
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::Semaphore;

use super::sandbox::{self, PrivateTmp, SandboxPlan, SandboxStatus};
use super::shell_policy::{Approver, CommandGate, ExecMode, ShellPolicy, DEFAULT_DENY_PATTERNS};
use super::{parse_args, schema_of, Effect, Tool, ToolContext, ToolError};

/// Default `exec_shell` timeout (seed 000: 30 s).
pub const DEFAULT_TIMEOUT_SECS: u64 = 30;
/// Default `spawn` timeout (seed 000: 60 s).
pub const DEFAULT_SPAWN_TIMEOUT_SECS: u64 = 60;
/// Largest timeout a call may request (seed 000: 300 s); larger requests are clamped.
pub const DEFAULT_MAX_TIMEOUT_SECS: u64 = 300;
/// Bytes of stdout and of stderr kept per command (1 MiB each); the rest is read and dropped.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 1024 * 1024;
/// How long `ask` mode waits for a human (goclaw: 2 minutes); no answer means deny.
pub const DEFAULT_APPROVAL_TIMEOUT_SECS: u64 = 120;
/// `spawn` processes running at once across all sessions (seed 000: 5).
pub const DEFAULT_MAX_CONCURRENT_SPAWNS: usize = 5;
/// Upper bound for any configured timeout (1 day): catches unit mistakes.
const MAX_CONFIG_SECS: u64 = 86_400;
/// Upper bound for `max_output_bytes` (64 MiB): output is held in memory.
const MAX_CONFIG_OUTPUT_BYTES: u64 = 64 * 1024 * 1024;
/// After the command exits and its group is killed, how long to wait for the pipes to reach
/// EOF (a process that left the group may still hold them) before returning what was read.
const DRAIN_GRACE: Duration = Duration::from_millis(500);
/// Read buffer for stdout/stderr.
const READ_CHUNK: usize = 16 * 1024;

/// The `[tools.exec]` config section (raw). Every field is optional; see
/// [`ExecFile::resolve`] for defaults and validation.
#[derive(Debug, Default, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecFile {
    /// How command lines are vetted before running: "denylist" (refuse matches of
    /// `deny_patterns`), "allowlist" (every program must be in `allow_commands`) or "ask" (a
    /// human approves commands not in `allow_commands`). The denylist applies in every mode.
    /// This is a speed bump; the sandbox is the boundary. (default: "denylist")
    pub mode: Option<String>,
    /// Deny patterns replacing the built-in list. `*` matches any text; matched
    /// case-insensitively on the normalised command (quotes, backslashes and `$IFS` removed) at
    /// word boundaries. (default: the built-in list: rm -rf /, sudo, mkfs, dd if=, curl * | sh, ...)
    pub deny_patterns: Option<Vec<String>>,
    /// Deny patterns added to the list in use. (default: none)
    pub extra_deny_patterns: Option<Vec<String>>,
    /// Program names (or exact paths) allowed in "allowlist" mode and run without asking in
    /// "ask" mode. Allowing a shell or an interpreter (sh, python3) allows anything. (default: none)
    pub allow_commands: Option<Vec<String>>,
    /// Default `exec_shell` timeout in seconds. (default: 30)
    pub timeout_secs: Option<u64>,
    /// Default `spawn` timeout in seconds. (default: 60)
    pub spawn_timeout_secs: Option<u64>,
    /// Largest timeout a call may request, in seconds; larger requests are clamped. (default: 300)
    pub max_timeout_secs: Option<u64>,
    /// Whether commands may open TCP connections and listen. false denies TCP connect/bind
    /// (needs Linux >= 6.7; UDP is not restricted). (default: true)
    pub network: Option<bool>,
    /// Whether commands run in the Landlock sandbox (writes only in the workspace and a private
    /// temp dir, reads only in system paths). Turning it off removes the security boundary.
    /// (default: true)
    pub sandbox: Option<bool>,
    /// Refuse to run commands when the kernel cannot enforce the filesystem sandbox (instead of
    /// running them unconfined with a warning). (default: false)
    pub require_sandbox: Option<bool>,
    /// Extra absolute paths commands may read and execute (e.g. a toolchain in /home/u/.cargo).
    /// (default: none)
    pub read_paths: Option<Vec<PathBuf>>,
    /// Extra absolute paths commands may write (and read). (default: none)
    pub write_paths: Option<Vec<PathBuf>>,
    /// Extra environment variable names passed to commands, besides PATH, LANG, LC_*, TZ, TERM,
    /// USER, LOGNAME. Names containing KEY, TOKEN, SECRET, PASSWORD, PASSWD or CREDENTIAL are
    /// refused. (default: none)
    pub env_passthrough: Option<Vec<String>>,
    /// Seconds to wait for a human's approval in "ask" mode; no answer means deny. (default: 120)
    pub approval_timeout_secs: Option<u64>,
    /// Bytes of stdout and of stderr kept per command; the rest is discarded and flagged.
    /// (default: 1048576)
    pub max_output_bytes: Option<u64>,
    /// `spawn` processes that may run at once across all sessions. (default: 5)
    pub max_concurrent_spawns: Option<u64>,
}

/// Resolved, validated settings of the process tools.
#[derive(Clone, Debug)]
pub struct ExecSettings {
    /// How commands are vetted.
    pub mode: ExecMode,
    /// Deny patterns in use (built-in or configured, plus extras).
    pub deny_patterns: Vec<String>,
    /// Allowed program names.
    pub allow_commands: Vec<String>,
    /// Default `exec_shell` timeout.
    pub timeout: Duration,
    /// Default `spawn` timeout.
    pub spawn_timeout: Duration,
    /// Largest timeout a call may request.
    pub max_timeout: Duration,
    /// TCP allowed.
    pub network: bool,
    /// Landlock sandbox on.
    pub sandbox: bool,
    /// Refuse to run commands without an enforced filesystem sandbox.
    pub require_sandbox: bool,
    /// Extra read+exec trees.
    pub read_paths: Vec<PathBuf>,
    /// Extra writable trees.
    pub write_paths: Vec<PathBuf>,
    /// Extra environment names passed on.
    pub env_passthrough: Vec<String>,
    /// `ask` mode wait.
    pub approval_timeout: Duration,
    /// Cap per stream.
    pub max_output_bytes: usize,
    /// `spawn` concurrency.
    pub max_concurrent_spawns: usize,
}

impl Default for ExecSettings {
    fn default() -> Self {
        Self {
            mode: ExecMode::Denylist,
            deny_patterns: DEFAULT_DENY_PATTERNS
                .iter()
                .map(|s| (*s).to_string())
                .collect(),
            allow_commands: Vec::new(),
            timeout: Duration::from_secs(DEFAULT_TIMEOUT_SECS),
            spawn_timeout: Duration::from_secs(DEFAULT_SPAWN_TIMEOUT_SECS),
            max_timeout: Duration::from_secs(DEFAULT_MAX_TIMEOUT_SECS),
            network: true,
            sandbox: true,
            require_sandbox: false,
            read_paths: Vec::new(),
            write_paths: Vec::new(),
            env_passthrough: Vec::new(),
            approval_timeout: Duration::from_secs(DEFAULT_APPROVAL_TIMEOUT_SECS),
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            max_concurrent_spawns: DEFAULT_MAX_CONCURRENT_SPAWNS,
        }
    }
}

fn secs(key: &str, v: Option<u64>, default: u64) -> Result<Duration, String> {
    match v {
        None => Ok(Duration::from_secs(default)),
        Some(s) if (1..=MAX_CONFIG_SECS).contains(&s) => Ok(Duration::from_secs(s)),
        Some(s) => Err(format!(
            "`{key}`: expected a number of seconds from 1 to {MAX_CONFIG_SECS}, got {s}"
        )),
    }
}

fn paths(key: &str, v: Option<&Vec<PathBuf>>) -> Result<Vec<PathBuf>, String> {
    let v = v.cloned().unwrap_or_default();
    if let Some(bad) = v.iter().find(|p| !sandbox::is_clean_absolute(p)) {
        return Err(format!(
            "`{key}`: expected absolute paths without `..`, got {}",
            bad.display()
        ));
    }
    Ok(v)
}

impl ExecFile {
    /// Validate and fill in defaults.
    ///
    /// # Errors
    /// A message naming the offending key and what is expected.
    pub fn resolve(&self) -> Result<ExecSettings, String> {
        let d = ExecSettings::default();
        let mode = match self.mode.as_deref() {
            None => d.mode,
            Some(m) => ExecMode::parse(m).ok_or_else(|| {
                format!("`mode`: expected \"denylist\", \"allowlist\" or \"ask\", got {m:?}")
            })?,
        };
        let mut deny_patterns = self.deny_patterns.clone().unwrap_or(d.deny_patterns);
        deny_patterns.extend(self.extra_deny_patterns.iter().flatten().cloned());
        if let Some(bad) = deny_patterns.iter().find(|p| {
            p.split('*')
                .all(|piece| super::shell_policy::normalise(piece).is_empty())
        }) {
            return Err(format!(
                "`deny_patterns`/`extra_deny_patterns`: pattern {bad:?} matches everything or nothing; write the text to refuse, with `*` for any text in between"
            ));
        }
        let allow_commands = self.allow_commands.clone().unwrap_or_default();
        if let Some(bad) = allow_commands
            .iter()
            .find(|c| c.trim().is_empty() || c.chars().any(char::is_whitespace))
        {
            return Err(format!(
                "`allow_commands`: expected program names such as \"ls\" or \"/usr/bin/git\", got {bad:?}"
            ));
        }
        if mode == ExecMode::Allowlist && allow_commands.is_empty() {
            return Err(
                "`allow_commands`: mode \"allowlist\" needs at least one allowed program name"
                    .into(),
            );
        }
        let max_timeout = secs(
            "max_timeout_secs",
            self.max_timeout_secs,
            DEFAULT_MAX_TIMEOUT_SECS,
        )?;
        let timeout = secs("timeout_secs", self.timeout_secs, DEFAULT_TIMEOUT_SECS)?;
        let spawn_timeout = secs(
            "spawn_timeout_secs",
            self.spawn_timeout_secs,
            DEFAULT_SPAWN_TIMEOUT_SECS,
        )?;
        for (key, t) in [
            ("timeout_secs", timeout),
            ("spawn_timeout_secs", spawn_timeout),
        ] {
            if t > max_timeout {
                return Err(format!(
                    "`{key}`: expected at most `max_timeout_secs` ({}), got {}",
                    max_timeout.as_secs(),
                    t.as_secs()
                ));
            }
        }
        let approval_timeout = secs(
            "approval_timeout_secs",
            self.approval_timeout_secs,
            DEFAULT_APPROVAL_TIMEOUT_SECS,
        )?;
        let max_output_bytes = match self.max_output_bytes {
            None => d.max_output_bytes,
            Some(n) if (1..=MAX_CONFIG_OUTPUT_BYTES).contains(&n) => {
                usize::try_from(n).map_err(|_| "`max_output_bytes`: too large".to_string())?
            }
            Some(n) => {
                return Err(format!(
                    "`max_output_bytes`: expected 1 to {MAX_CONFIG_OUTPUT_BYTES}, got {n}"
                ))
            }
        };
        let max_concurrent_spawns = match self.max_concurrent_spawns {
            None => d.max_concurrent_spawns,
            Some(n @ 1..=64) => usize::try_from(n).unwrap_or(DEFAULT_MAX_CONCURRENT_SPAWNS),
            Some(n) => {
                return Err(format!(
                    "`max_concurrent_spawns`: expected 1 to 64, got {n}"
                ))
            }
        };
        let env_passthrough = self.env_passthrough.clone().unwrap_or_default();
        for name in &env_passthrough {
            if name.is_empty() || name.contains(['=', '\0']) {
                return Err(format!(
                    "`env_passthrough`: expected environment variable names, got {name:?}"
                ));
            }
            if sandbox::is_secret_name(name) {
                return Err(format!(
                    "`env_passthrough`: {name:?} looks like a secret (contains KEY, TOKEN, SECRET, PASSWORD, PASSWD or CREDENTIAL) and is never passed to commands; remove it"
                ));
            }
            if name.starts_with("LD_") || matches!(name.as_str(), "HOME" | "TMPDIR") {
                return Err(format!(
                    "`env_passthrough`: {name:?} cannot be passed (HOME and TMPDIR are set by the sandbox, LD_* would change how programs load)"
                ));
            }
        }
        Ok(ExecSettings {
            mode,
            deny_patterns,
            allow_commands,
            timeout,
            spawn_timeout,
            max_timeout,
            network: self.network.unwrap_or(d.network),
            sandbox: self.sandbox.unwrap_or(d.sandbox),
            require_sandbox: self.require_sandbox.unwrap_or(d.require_sandbox),
            read_paths: paths("read_paths", self.read_paths.as_ref())?,
            write_paths: paths("write_paths", self.write_paths.as_ref())?,
            env_passthrough,
            approval_timeout,
            max_output_bytes,
            max_concurrent_spawns,
        })
    }
}

/// What the daemon hands the process tools besides their settings.
#[derive(Clone)]
pub struct ExecDeps {
    /// Paths commands must never read or write even beneath an allowed tree: the config file,
    /// the credentials directory, the store directory.
    pub protected_paths: Vec<PathBuf>,
    /// The daemon's secret values: an environment variable whose value contains one is never
    /// passed to commands.
    pub secrets: Vec<String>,
    /// The daemon's environment, from which the commands' environment is filtered.
    pub env: Vec<(OsString, OsString)>,
    /// Who approves commands in `ask` mode (none: such commands are denied).
    pub approver: Option<Arc<dyn Approver>>,
    /// Where the private temp dir is created (usually `std::env::temp_dir()`).
    pub tmp_base: PathBuf,
}

/// State shared by `exec_shell` and `spawn` (one per daemon): settings, the command gate, the
/// sandbox plan and status, the private temp dir, the scrubbed environment and the spawn slots.
pub struct ExecRuntime {
    settings: ExecSettings,
    gate: CommandGate,
    plan: SandboxPlan,
    status: SandboxStatus,
    tmp: PrivateTmp,
    /// Scrubbed once; `HOME` is added per call (it is the caller's workspace).
    env: Vec<(OsString, OsString)>,
    /// Shared by every `spawn` call of every session (seed 000: max 5 concurrent).
    spawn_slots: Arc<Semaphore>,
}

impl ExecRuntime {
    /// Create the runtime: probes Landlock (once per process) and creates the private temp dir.
    ///
    /// # Errors
    /// The private temp dir cannot be created beneath `deps.tmp_base`.
    pub fn new(settings: ExecSettings, deps: ExecDeps) -> std::io::Result<Self> {
        let tmp = PrivateTmp::create_in(&deps.tmp_base)?;
        let kernel = sandbox::probe();
        let status = SandboxStatus {
            landlock_abi: kernel.landlock_abi,
            fs_enforced: settings.sandbox && kernel.fs_enforced,
            net_enforced: settings.sandbox && !settings.network && kernel.net_enforced,
            scoped: settings.sandbox && kernel.scoped,
        };
        let env = sandbox::scrub_env(
            &deps.env,
            &settings.env_passthrough,
            &deps.secrets,
            tmp.path(),
        );
        let policy = ShellPolicy::new(
            settings.mode,
            &settings.deny_patterns,
            &settings.allow_commands,
        );
        Ok(Self {
            gate: CommandGate::new(policy, deps.approver, settings.approval_timeout),
            plan: SandboxPlan {
                read_paths: settings.read_paths.clone(),
                write_paths: settings.write_paths.clone(),
                protected: deps.protected_paths,
                network: settings.network,
            },
            status,
            tmp,
            env,
            spawn_slots: Arc::new(Semaphore::new(settings.max_concurrent_spawns)),
            settings,
        })
    }

    /// What is enforced for commands (log it at start; show it in `weft status`).
    pub fn sandbox_status(&self) -> SandboxStatus {
        self.status
    }

    /// The settings.
    pub fn settings(&self) -> &ExecSettings {
        &self.settings
    }

    /// The private temp dir given to commands as `TMPDIR`.
    pub fn tmp_dir(&self) -> &Path {
        self.tmp.path()
    }

    fn timeout(&self, requested: Option<f64>, default: Duration) -> Result<Duration, ToolError> {
        match requested {
            None => Ok(default.min(self.settings.max_timeout)),
            Some(t) if t.is_finite() && t > 0.0 => {
                let max = self.settings.max_timeout;
                Ok(if t >= max.as_secs_f64() {
                    max
                } else {
                    Duration::from_secs_f64(t)
                })
            }
            Some(t) => Err(ToolError::InvalidArgs(format!(
                "timeout must be a positive number of seconds (at most {}), got {t}",
                self.settings.max_timeout.as_secs()
            ))),
        }
    }

    /// Run `program args` under the sandbox until it exits, `timeout` passes or the call is
    /// cancelled. The process group is killed on every path out of this function.
    async fn run(
        &self,
        ctx: &ToolContext,
        program: &OsStr,
        args: &[OsString],
        timeout: Duration,
    ) -> Result<Finished, ToolError> {
        if self.settings.require_sandbox && !self.status.fs_enforced {
            return Err(ToolError::PermissionDenied(format!(
                "commands are disabled: the exec sandbox is required but not enforced ({}); the operator must enable Landlock or set require_sandbox = false",
                self.status.summary()
            )));
        }
        let ws = ctx.workspace.root().to_path_buf();
        let ruleset = if self.status.fs_enforced {
            let (plan, tmp, ws) = (self.plan.clone(), self.tmp.path().to_path_buf(), ws.clone());
            tokio::task::spawn_blocking(move || plan.build_ruleset(&ws, &tmp))
                .await
                .map_err(|e| ToolError::ExecutionFailed(format!("sandbox setup task failed: {e}")))?
                .map_err(|e| {
                    ToolError::ExecutionFailed(format!("could not prepare the sandbox: {e}"))
                })?
        } else {
            None
        };
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .current_dir(&ws)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("HOME", &ws)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if self.settings.sandbox {
            sandbox::confine(&mut cmd, ruleset.as_ref().map(AsRawFd::as_raw_fd), true);
        }
        let started = Instant::now();
        let spawned = cmd.spawn();
        drop(ruleset);
        let mut child = spawned.map_err(|e| spawn_error(program, &e))?;
        let group = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw)
            .map(GroupKiller);
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let cap = self.settings.max_output_bytes;
        let (mut out, mut err) = (Capture::new(cap), Capture::new(cap));
        let status = {
            let reading = async { tokio::join!(out.fill(stdout), err.fill(stderr)) };
            tokio::pin!(reading);
            let deadline = tokio::time::sleep(timeout);
            tokio::pin!(deadline);
            let mut read_all = false;
            let ended = loop {
                tokio::select! {
                    s = child.wait() => break s.map_err(|e| ToolError::ExecutionFailed(format!("waiting for the command failed: {e}"))),
                    _ = &mut reading, if !read_all => read_all = true,
                    () = &mut deadline => break Err(ToolError::Timeout(timeout.as_secs_f64().ceil() as u64)),
                    () = ctx.cancel.cancelled() => break Err(ToolError::Cancelled),
                }
            };
            // Exited or not: nothing of this command outlives the call.
            drop(group);
            if ended.is_err() {
                let _ = child.wait().await;
            } else if !read_all {
                let _ = tokio::time::timeout(DRAIN_GRACE, &mut reading).await;
            }
            ended?
        };
        Ok(Finished {
            code: status.code(),
            signal: status.signal(),
            stdout: out,
            stderr: err,
            duration: started.elapsed(),
        })
    }
}

fn spawn_error(program: &OsStr, e: &std::io::Error) -> ToolError {
    let p = program.to_string_lossy();
    match e.kind() {
        std::io::ErrorKind::NotFound => ToolError::ExecutionFailed(format!(
            "`{p}`: program not found (nor the workspace directory); check the name, or use an absolute path"
        )),
        std::io::ErrorKind::PermissionDenied => ToolError::PermissionDenied(format!(
            "`{p}` may not be executed here: only programs under the system directories, the workspace and configured read_paths can run"
        )),
        _ => ToolError::ExecutionFailed(format!("could not start `{p}`: {e}")),
    }
}

/// Kills a process group with SIGKILL when dropped.
struct GroupKiller(rustix::process::Pid);

impl Drop for GroupKiller {
    fn drop(&mut self) {
        // ESRCH (the group is already gone) is the normal case.
        let _ = rustix::process::kill_process_group(self.0, rustix::process::Signal::KILL);
    }
}

/// Bytes read from one pipe, capped.
struct Capture {
    buf: Vec<u8>,
    cap: usize,
    truncated: bool,
}

impl Capture {
    fn new(cap: usize) -> Self {
        Self {
            buf: Vec::new(),
            cap,
            truncated: false,
        }
    }

    /// Read until EOF or an error, keeping the first `cap` bytes and discarding the rest.
    async fn fill(&mut self, pipe: Option<impl AsyncRead + Unpin>) {
        let Some(mut pipe) = pipe else { return };
        let mut chunk = vec![0u8; READ_CHUNK];
        loop {
            match pipe.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let room = self.cap.saturating_sub(self.buf.len());
                    if n > room {
                        self.truncated = true;
                    }
                    self.buf.extend_from_slice(&chunk[..n.min(room)]);
                }
            }
        }
    }

    /// The text (invalid UTF-8 replaced; a character cut by the cap dropped).
    fn text(&self) -> String {
        let mut bytes = self.buf.as_slice();
        if self.truncated {
            if let Err(e) = std::str::from_utf8(bytes) {
                if e.error_len().is_none() {
                    bytes = &bytes[..e.valid_up_to()];
                }
            }
        }
        String::from_utf8_lossy(bytes).into_owned()
    }
}

/// A command that ran to its end.
struct Finished {
    code: Option<i32>,
    signal: Option<i32>,
    stdout: Capture,
    stderr: Capture,
    duration: Duration,
}

impl Finished {
    /// `{exit_code, stdout, stderr, duration_ms}` plus `signal`, `stdout_truncated`,
    /// `stderr_truncated` when they apply.
    fn to_json(&self) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        m.insert("exit_code".into(), json!(self.code.unwrap_or(-1)));
        m.insert("stdout".into(), json!(self.stdout.text()));
        m.insert("stderr".into(), json!(self.stderr.text()));
        m.insert(
            "duration_ms".into(),
            json!(u64::try_from(self.duration.as_millis()).unwrap_or(u64::MAX)),
        );
        if let Some(sig) = self.signal {
            m.insert("signal".into(), json!(sig));
        }
        if self.stdout.truncated {
            m.insert("stdout_truncated".into(), json!(true));
        }
        if self.stderr.truncated {
            m.insert("stderr_truncated".into(), json!(true));
        }
        m
    }
}

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
    let net = if rt.status.net_enforced {
        " Network (TCP) access is disabled."
    } else {
        ""
    };
    let policy = match s.mode {
        ExecMode::Denylist => "Dangerous commands (sudo, rm -rf /, curl | sh, ...) are refused.",
        ExecMode::Allowlist => "Only allowed programs may run; others are refused.",
        ExecMode::Ask => "Commands may need a human's approval first.",
    };
    format!(
        "{intro} Runs in the workspace directory with HOME set to it; writes are only possible inside the workspace and $TMPDIR, and files outside the workspace and system directories cannot be read.{net} {policy} stdin is closed: do not run interactive programs. Non-zero exit codes are results, not errors. Timeout default {}s, max {}s; on timeout the whole process group is killed. Returns: {returns}",
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
