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

    /// The longest a call may take: the largest timeout plus an approval wait and cleanup.
    pub fn time_budget(&self) -> Duration {
        self.settings.max_timeout + self.settings.approval_timeout + Duration::from_secs(10)
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
                // The group kill covers the child too; this is in case it was not delivered.
                let _ = child.start_kill();
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
        _ if e.raw_os_error() == Some(libc::E2BIG) => ToolError::ExecutionFailed(format!(
            "`{p}`: the command line is too long for the OS (at most 128 KiB per argument); write the script to a file in the workspace and run that file instead"
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
        "{intro} Runs in the workspace directory with HOME set to it; writes are only possible inside the workspace and $TMPDIR, and files outside the workspace and system directories cannot be read.{net} {policy} stdin is closed: do not run interactive programs; background processes (`&`) are killed when the call returns. Non-zero exit codes are results, not errors. Timeout default {}s, max {}s; on timeout the whole process group is killed. Returns: {returns}",
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
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::tools::shell_policy::Approval;
    use crate::tools::Workspace;
    use crate::types::SessionKey;

    const CANARY_TEXT: &str = "CANARY-7f3a9c-do-not-leak";

    /// A workspace, a canary directory outside it, and a runtime over them.
    struct Fx {
        root: tempfile::TempDir,
        outside: tempfile::TempDir,
        ws: PathBuf,
        canary: PathBuf,
        rt: Arc<ExecRuntime>,
        ctx: ToolContext,
    }

    fn env_source() -> Vec<(OsString, OsString)> {
        [
            ("PATH", "/usr/local/bin:/usr/bin:/bin"),
            ("LANG", "C.UTF-8"),
            ("FOO_TOKEN", "tok-5d1e2b-value"),
            ("API_KEY", "key-9a8b7c-value"),
            ("MY_VAR", "visible-value"),
            ("LEAKY_VAR", "prefix-daemon-secret-9q8w-suffix"),
            ("OTHER_VAR", "not-passed-value"),
        ]
        .into_iter()
        .map(|(a, b)| (a.into(), b.into()))
        .collect()
    }

    fn fixture_with(
        settings: ExecSettings,
        protected: impl FnOnce(&Path) -> Vec<PathBuf>,
        approver: Option<Arc<dyn Approver>>,
    ) -> Fx {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let ws = root.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        let canary = outside.path().join("CANARY");
        std::fs::write(&canary, CANARY_TEXT).unwrap();
        let deps = ExecDeps {
            protected_paths: protected(&ws),
            secrets: vec!["daemon-secret-9q8w".into()],
            env: env_source(),
            approver,
            tmp_base: root.path().to_path_buf(),
        };
        let rt = Arc::new(ExecRuntime::new(settings, deps).unwrap());
        let ctx = ToolContext {
            workspace: Arc::new(Workspace::open(&ws).unwrap()),
            session: SessionKey::parse("t:1").unwrap(),
            cancel: CancellationToken::new(),
        };
        Fx {
            root,
            outside,
            ws,
            canary,
            rt,
            ctx,
        }
    }

    fn fixture() -> Fx {
        fixture_with(ExecSettings::default(), |_| Vec::new(), None)
    }

    /// Landlock is what these tests check; say so loudly where the kernel lacks it.
    fn landlock_or_skip(fx: &Fx) -> bool {
        let s = fx.rt.sandbox_status();
        if !s.fs_enforced {
            println!(
                "SKIPPED: Landlock unavailable on this kernel: {}",
                s.summary()
            );
        }
        s.fs_enforced
    }

    async fn sh(fx: &Fx, command: &str) -> Result<Value, ToolError> {
        ExecShell::new(fx.rt.clone())
            .execute(json!({ "command": command }), &fx.ctx)
            .await
    }

    async fn sh_ok(fx: &Fx, command: &str) -> Value {
        sh(fx, command)
            .await
            .unwrap_or_else(|e| panic!("{command}: {e}"))
    }

    fn alive(pid: i32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => false,
            Ok(s) => !matches!(
                s.rsplit(')')
                    .next()
                    .and_then(|r| r.split_whitespace().next()),
                Some("Z" | "X")
            ),
        }
    }

    /// Whether `pid` is gone (or a zombie) within `within`.
    async fn gone_within(pid: i32, within: Duration) -> bool {
        let end = Instant::now() + within;
        while Instant::now() < end {
            if !alive(pid) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        !alive(pid)
    }

    async fn wait_for_file(p: &Path) -> String {
        for _ in 0..250 {
            if let Ok(s) = std::fs::read_to_string(p) {
                if s.ends_with('\n') {
                    return s;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{} never appeared", p.display());
    }

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
    async fn large_commands_run_and_oversized_ones_fail_clearly() {
        let fx = fixture();
        let big = "x".repeat(100_000);
        let v = sh_ok(&fx, &format!("echo {big} | wc -c")).await;
        assert_eq!(v["stdout"].as_str().unwrap().trim(), "100001");
        let huge = "y".repeat(200_000);
        let e = sh(&fx, &format!("echo {huge}")).await.unwrap_err();
        assert_eq!(e.code(), "EXECUTION_FAILED");
        assert!(e.to_string().contains("too long"), "{e}");
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
    async fn canary_outside_the_workspace_survives_everything() {
        let fx = fixture();
        if !landlock_or_skip(&fx) {
            return;
        }
        let c = fx.canary.to_str().unwrap().to_string();
        let dir = fx.outside.path().to_str().unwrap().to_string();
        let attempts = [
            format!("rm -f {c}"),
            format!("echo x > {c}"),
            format!("echo x >> {c}"),
            format!("cat {c}"),
            format!("head -c 100 < {c}"),
            format!("ln -s {c} link; echo pwned > link; cat link"),
            format!("cp {c} ./x; cat ./x"),
            format!("mv {c} ./moved"),
            format!("ln {c} ./hard; cat ./hard"),
            format!("truncate -s 0 {c}"),
            format!("chmod 000 {c}"),
            format!("ls -la {dir}"),
            format!("python3 -c \"open('{c}','w').write('x')\""),
            format!("python3 -c \"print(open('{c}').read())\""),
            // Not on the denylist, but destructive: contained all the same.
            format!("rm -r -f {dir}"),
            format!("find {dir} -delete"),
        ];
        for cmd in &attempts {
            let shown = match sh(&fx, cmd).await {
                Ok(v) => v.to_string(),
                Err(e) => e.to_json().to_string(),
            };
            assert!(!shown.contains(CANARY_TEXT), "{cmd} leaked: {shown}");
            assert_eq!(
                std::fs::read_to_string(&fx.canary).unwrap(),
                CANARY_TEXT,
                "{cmd} changed the canary"
            );
        }
        for copy in ["x", "moved", "hard"] {
            let p = fx.ws.join(copy);
            assert!(
                std::fs::read_to_string(&p).map_or(true, |s| !s.contains(CANARY_TEXT)),
                "{copy}"
            );
        }
        // Inside, the same operations work.
        let v = sh_ok(&fx, "echo data > in.txt && cp in.txt b.txt && mv b.txt c.txt && cat c.txt && rm in.txt && mkdir -p d/e && ls").await;
        assert_eq!(v["exit_code"], 0, "{v}");
        assert_eq!(v["stdout"], "data\nc.txt\nd\nlink\n");
    }

    #[tokio::test]
    async fn protected_paths_beneath_allowed_roots_are_unreadable() {
        let extra = tempfile::tempdir().unwrap();
        let extra_root = extra.path().to_path_buf();
        std::fs::create_dir_all(extra_root.join("secret")).unwrap();
        std::fs::write(extra_root.join("public.txt"), "public-ok").unwrap();
        std::fs::write(extra_root.join("secret/creds.txt"), CANARY_TEXT).unwrap();
        let settings = ExecSettings {
            read_paths: vec![extra_root.clone()],
            ..ExecSettings::default()
        };
        let protected_extra = extra_root.join("secret");
        let fx = fixture_with(
            settings,
            move |ws| vec![protected_extra, ws.join("store")],
            None,
        );
        if !landlock_or_skip(&fx) {
            return;
        }
        std::fs::create_dir_all(fx.ws.join("store")).unwrap();
        std::fs::write(fx.ws.join("store/db"), CANARY_TEXT).unwrap();
        std::fs::create_dir_all(fx.ws.join("src")).unwrap();
        std::fs::write(fx.ws.join("src/main.rs"), "fn main() {}").unwrap();
        let e = extra_root.to_str().unwrap();

        let v = sh_ok(&fx, &format!("cat {e}/public.txt")).await;
        assert_eq!(v["stdout"], "public-ok");
        let v = sh_ok(&fx, "cat src/main.rs").await;
        assert_eq!(v["stdout"], "fn main() {}");
        for cmd in [
            format!("cat {e}/secret/creds.txt"),
            format!("ls {e}/secret"),
            format!("cd {e}/secret && cat creds.txt"),
            "cat store/db".to_string(),
            "cat ./src/../store/db".to_string(),
            "ln -s store s2 2>/dev/null; cat s2/db".to_string(),
            "grep -r CANARY . 2>/dev/null".to_string(),
            format!("echo x > {e}/secret/creds.txt"),
            "echo x > store/db".to_string(),
        ] {
            let v = sh_ok(&fx, &cmd).await;
            assert!(!v.to_string().contains(CANARY_TEXT), "{cmd} leaked: {v}");
        }
        assert_eq!(
            std::fs::read_to_string(fx.ws.join("store/db")).unwrap(),
            CANARY_TEXT
        );
        assert_eq!(
            std::fs::read_to_string(extra_root.join("secret/creds.txt")).unwrap(),
            CANARY_TEXT
        );
        // System secrets too.
        let v = sh_ok(&fx, "cat /etc/shadow").await;
        assert_ne!(v["exit_code"], 0);
        assert_eq!(v["stdout"], "");
    }

    #[tokio::test]
    async fn shared_tmp_is_off_limits_and_tmpdir_is_writable() {
        let fx = fixture();
        if !landlock_or_skip(&fx) {
            return;
        }
        let probe = std::env::temp_dir().join(format!("clawft-probe-{}", fastrand::u64(..)));
        let p = probe.to_str().unwrap();
        let v = sh_ok(&fx, &format!("echo x > {p}")).await;
        assert_ne!(v["exit_code"], 0);
        assert!(!probe.exists(), "wrote into the shared temp dir");
        // The canary's directory is in the shared temp dir too: not listable.
        let v = sh_ok(&fx, &format!("ls {}", std::env::temp_dir().display())).await;
        assert_ne!(v["exit_code"], 0);
        assert_eq!(v["stdout"], "");

        let v = sh_ok(&fx, "echo tmp-ok > \"$TMPDIR/f\" && cat \"$TMPDIR/f\"").await;
        assert_eq!(v["stdout"], "tmp-ok\n");
        assert_eq!(
            std::fs::read_to_string(fx.rt.tmp_dir().join("f")).unwrap(),
            "tmp-ok\n"
        );
        let v = sh_ok(&fx, "python3 -c 'import tempfile; f = tempfile.NamedTemporaryFile(); print(f.name.startswith(__import__(\"os\").environ[\"TMPDIR\"]))'").await;
        assert_eq!(v["stdout"], "True\n", "{v}");
    }

    #[tokio::test]
    async fn common_tools_work_inside_the_sandbox() {
        let fx = fixture();
        std::fs::write(fx.ws.join("notes.txt"), "alpha\nbeta\n").unwrap();
        for cmd in [
            "ls -la",
            "cat notes.txt",
            "grep -c a notes.txt",
            "python3 -c 'import json, sys; print(json.dumps({\"a\": 1}))'",
            "git --version",
            "echo hi > /dev/null",
            "head -c 4 /dev/urandom | wc -c",
            "sort notes.txt | uniq | wc -l",
            "sh -c 'echo nested'",
            "date +%s",
        ] {
            let v = sh_ok(&fx, cmd).await;
            assert_eq!(v["exit_code"], 0, "{cmd}: {v}");
        }
        let v = sh_ok(
            &fx,
            "git init -q repo && cd repo && git status --short && echo ok",
        )
        .await;
        assert_eq!(v["stdout"], "ok\n", "{v}");
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
    async fn timeout_kills_the_whole_process_group() {
        let fx = fixture();
        let started = Instant::now();
        let e = ExecShell::new(fx.rt.clone())
            .execute(
                json!({"command": "sleep 300 & echo $! > pid; wait", "timeout": 0.5}),
                &fx.ctx,
            )
            .await
            .unwrap_err();
        assert_eq!(e, ToolError::Timeout(1));
        assert!(started.elapsed() < Duration::from_secs(3));
        let pid: i32 = std::fs::read_to_string(fx.ws.join("pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(
            gone_within(pid, Duration::from_secs(2)).await,
            "grandchild {pid} survived"
        );
    }

    #[tokio::test]
    async fn background_grandchild_holding_the_pipes_does_not_hang_the_call() {
        let fx = fixture();
        let started = Instant::now();
        let v = sh_ok(&fx, "sleep 300 & echo $!").await;
        assert!(started.elapsed() < Duration::from_secs(3), "hung");
        let pid: i32 = v["stdout"].as_str().unwrap().trim().parse().unwrap();
        assert!(
            gone_within(pid, Duration::from_secs(2)).await,
            "background job {pid} survived"
        );
    }

    #[tokio::test]
    async fn cancellation_kills_the_group_quickly() {
        let fx = fixture();
        let (rt, ctx) = (fx.rt.clone(), fx.ctx.clone());
        let call = tokio::spawn(async move {
            ExecShell::new(rt)
                .execute(json!({"command": "sleep 300 & echo $! > pid; wait"}), &ctx)
                .await
        });
        let pid: i32 = wait_for_file(&fx.ws.join("pid"))
            .await
            .trim()
            .parse()
            .unwrap();
        let t = Instant::now();
        fx.ctx.cancel.cancel();
        let r = tokio::time::timeout(Duration::from_secs(2), call)
            .await
            .expect("cancel was not quick")
            .unwrap();
        assert_eq!(r.unwrap_err(), ToolError::Cancelled);
        assert!(t.elapsed() < Duration::from_secs(1));
        assert!(
            gone_within(pid, Duration::from_secs(2)).await,
            "{pid} survived"
        );
    }

    #[tokio::test]
    async fn dropping_the_call_kills_the_group() {
        let fx = fixture();
        let tool = ExecShell::new(fx.rt.clone());
        let fut = tool.execute(
            json!({"command": "sleep 300 & echo $! > pid; wait", "timeout": 300}),
            &fx.ctx,
        );
        assert!(tokio::time::timeout(Duration::from_millis(400), fut)
            .await
            .is_err());
        let pid: i32 = wait_for_file(&fx.ws.join("pid"))
            .await
            .trim()
            .parse()
            .unwrap();
        assert!(
            gone_within(pid, Duration::from_secs(2)).await,
            "{pid} survived"
        );
    }

    #[tokio::test]
    async fn environment_is_scrubbed() {
        let settings = ExecSettings {
            env_passthrough: vec!["MY_VAR".into(), "LEAKY_VAR".into()],
            ..ExecSettings::default()
        };
        let fx = fixture_with(settings, |_| Vec::new(), None);
        let v = sh_ok(&fx, "env").await;
        let out = v["stdout"].as_str().unwrap();
        for leaked in [
            "FOO_TOKEN",
            "API_KEY",
            "tok-5d1e2b",
            "key-9a8b7c",
            "daemon-secret-9q8w",
            "LEAKY_VAR",
            "OTHER_VAR",
        ] {
            assert!(!out.contains(leaked), "{leaked} leaked:\n{out}");
        }
        assert!(out.contains("MY_VAR=visible-value\n"), "{out}");
        assert!(
            out.contains(&format!("HOME={}\n", fx.ws.display())),
            "{out}"
        );
        assert!(out.contains("PATH=/usr/local/bin:/usr/bin:/bin\n"), "{out}");
        if landlock_or_skip(&fx) {
            // The daemon's own environment is out of reach through /proc too.
            let v = sh_ok(&fx, "cat /proc/$PPID/environ | tr '\\0' '\\n'").await;
            assert_eq!(v["stdout"], "", "{v}");
        }
    }

    #[tokio::test]
    async fn commands_have_no_capabilities_and_no_new_privileges() {
        let fx = fixture();
        let v = sh_ok(
            &fx,
            "grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs)' /proc/self/status",
        )
        .await;
        let out = v["stdout"].as_str().unwrap();
        for line in [
            "CapEff:\t0000000000000000",
            "CapPrm:\t0000000000000000",
            "CapBnd:\t0000000000000000",
            "NoNewPrivs:\t1",
        ] {
            assert!(out.contains(line), "{line} missing:\n{out}");
        }
    }

    #[tokio::test]
    async fn network_false_blocks_tcp_connections() {
        let connect = |port: u16| {
            format!("python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=2); print(\"connected\")'")
        };
        // Control: with network allowed the same command does connect, so the check below
        // can tell a blocked connection from a broken test.
        let open = fixture();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let v = sh_ok(&open, &connect(port)).await;
        assert_eq!(v["stdout"], "connected\n", "{v}");
        assert!(listener.accept().is_ok());

        let settings = ExecSettings {
            network: false,
            ..ExecSettings::default()
        };
        let fx = fixture_with(settings, |_| Vec::new(), None);
        if !fx.rt.sandbox_status().net_enforced {
            println!(
                "SKIPPED: Landlock TCP restriction (ABI >= 4) unsupported: {}",
                fx.rt.sandbox_status().summary()
            );
            return;
        }
        let v = sh_ok(&fx, &connect(port)).await;
        assert_ne!(v["exit_code"], 0, "{v}");
        let v = sh_ok(&fx, "python3 -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); print(\"bound\")'").await;
        assert_ne!(v["stdout"], "bound\n", "{v}");
        assert_eq!(
            listener.accept().map_err(|e| e.kind()).err(),
            Some(std::io::ErrorKind::WouldBlock),
            "a connection got through"
        );
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
        let e = s
            .execute(
                json!({"command": "sleep", "args": ["5"], "timeout": 0.3}),
                &fx.ctx,
            )
            .await
            .unwrap_err();
        assert_eq!(e, ToolError::Timeout(1));
    }

    #[tokio::test]
    async fn programs_outside_the_allowed_trees_cannot_run() {
        use std::os::unix::fs::PermissionsExt;
        let fx = fixture();
        if !landlock_or_skip(&fx) {
            return;
        }
        let script = fx.outside.path().join("evil.sh");
        let marker = fx.ws.join("evil-ran");
        std::fs::write(&script, format!("#!/bin/sh\ntouch {}\n", marker.display())).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = Spawn::new(fx.rt.clone())
            .execute(json!({"command": script.to_str().unwrap()}), &fx.ctx)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "PERMISSION_DENIED", "{e}");
        let v = sh_ok(&fx, script.to_str().unwrap()).await;
        assert_ne!(v["exit_code"], 0);
        assert!(!marker.exists());
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

    #[tokio::test]
    async fn output_is_capped_per_stream() {
        let settings = ExecSettings {
            max_output_bytes: 1000,
            ..ExecSettings::default()
        };
        let fx = fixture_with(settings, |_| Vec::new(), None);
        let v = sh_ok(
            &fx,
            "head -c 3000000 /dev/zero | tr '\\0' a; echo small >&2",
        )
        .await;
        assert_eq!(v["exit_code"], 0);
        assert_eq!(v["stdout"].as_str().unwrap().len(), 1000);
        assert_eq!(v["stdout_truncated"], true);
        assert_eq!(v["stderr"], "small\n");
        assert!(v.get("stderr_truncated").is_none());

        let settings = ExecSettings {
            max_output_bytes: 5,
            ..ExecSettings::default()
        };
        let fx = fixture_with(settings, |_| Vec::new(), None);
        let v = sh_ok(&fx, "printf 'ééé'").await;
        assert_eq!(v["stdout"], "éé");

        let fx = fixture();
        let v = sh_ok(&fx, "yes | head -c 3000000").await;
        assert_eq!(
            v["stdout"].as_str().unwrap().len(),
            DEFAULT_MAX_OUTPUT_BYTES
        );
        assert_eq!(v["stdout_truncated"], true);
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
        async fn approve(&self, _session: &SessionKey, _command: &str) -> Approval {
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
    fn config_resolves_defaults_and_names_bad_keys() {
        let d = ExecFile::default().resolve().unwrap();
        assert_eq!(d.mode, ExecMode::Denylist);
        assert_eq!(d.timeout, Duration::from_secs(30));
        assert_eq!(d.spawn_timeout, Duration::from_secs(60));
        assert_eq!(d.max_timeout, Duration::from_secs(300));
        assert_eq!(d.max_output_bytes, 1 << 20);
        assert_eq!(d.max_concurrent_spawns, 5);
        assert_eq!(d.approval_timeout, Duration::from_secs(120));
        assert!(d.network && d.sandbox && !d.require_sandbox);
        assert_eq!(d.deny_patterns.len(), DEFAULT_DENY_PATTERNS.len());

        let f: ExecFile = serde_json::from_value(json!({
            "mode": "ask",
            "deny_patterns": ["foo"],
            "extra_deny_patterns": ["bar *baz"],
            "allow_commands": ["ls"],
            "network": false,
            "read_paths": ["/srv/data"],
            "env_passthrough": ["RUST_LOG"],
            "max_output_bytes": 4096
        }))
        .unwrap();
        let s = f.resolve().unwrap();
        assert_eq!(s.mode, ExecMode::Ask);
        assert_eq!(s.deny_patterns, ["foo", "bar *baz"]);
        assert!(!s.network);
        assert_eq!(s.max_output_bytes, 4096);

        assert!(serde_json::from_value::<ExecFile>(json!({"modee": "x"})).is_err());
        for (f, key) in [
            (json!({"mode": "yolo"}), "`mode`"),
            (json!({"mode": "allowlist"}), "`allow_commands`"),
            (json!({"allow_commands": ["ls -la"]}), "`allow_commands`"),
            (json!({"timeout_secs": 0}), "`timeout_secs`"),
            (json!({"timeout_secs": 400}), "`timeout_secs`"),
            (json!({"max_timeout_secs": 10}), "`timeout_secs`"),
            (json!({"read_paths": ["relative/dir"]}), "`read_paths`"),
            (json!({"write_paths": ["/a/../etc"]}), "`write_paths`"),
            (
                json!({"env_passthrough": ["GITHUB_TOKEN"]}),
                "`env_passthrough`",
            ),
            (
                json!({"env_passthrough": ["LD_PRELOAD"]}),
                "`env_passthrough`",
            ),
            (json!({"max_output_bytes": 0}), "`max_output_bytes`"),
            (
                json!({"max_concurrent_spawns": 0}),
                "`max_concurrent_spawns`",
            ),
            (json!({"deny_patterns": [" * "]}), "`deny_patterns`"),
        ] {
            let e = serde_json::from_value::<ExecFile>(f.clone())
                .unwrap()
                .resolve()
                .unwrap_err();
            assert!(e.contains(key), "{f}: {e}");
        }
        let schema = serde_json::to_value(schemars::schema_for!(ExecFile)).unwrap();
        assert!(schema["properties"]["mode"].is_object());
    }

    #[test]
    fn tools_describe_their_results() {
        let fx = fixture();
        let e = ExecShell::new(fx.rt.clone());
        let s = Spawn::new(fx.rt.clone());
        assert!(e
            .description()
            .contains("Returns: {exit_code, stdout, stderr, duration_ms"));
        assert!(s
            .description()
            .contains("Returns: {exit_code, stdout, stderr, command, description"));
        assert!(s.description().contains("At most 5"));
        assert_eq!(e.parameters()["required"], json!(["command"]));
        assert_eq!(s.effect(), Effect::Executes);
        let _ = &fx.root;
    }
}
