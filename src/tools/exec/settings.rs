//! `tools.exec`: the raw section ([`ExecFile`]) and its validated form ([`ExecSettings`]).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::net::ssrf::Cidr;
use crate::tools::sandbox;
use crate::tools::shell_policy::{ExecMode, RunsOn, DEFAULT_DENY_PATTERNS};
use crate::types::SettingError;

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
/// `process` background commands one session may have running at once.
pub const DEFAULT_MAX_BACKGROUND_PROCESSES: usize = 4;
/// A background command nobody polled, read or wrote for this long is killed (30 min).
pub const DEFAULT_BACKGROUND_IDLE_SECS: u64 = 1800;
/// Tasks (processes and threads) one command may have at once (`tools.exec.max_processes`).
pub const DEFAULT_MAX_PROCESSES: u32 = 512;
/// Memory one command may use, in MiB (`tools.exec.max_memory_mb`).
pub const DEFAULT_MAX_MEMORY_MB: u64 = 1024;
/// Smallest non-zero `max_processes`: the jail's own two helper processes, a shell and a pipe.
const MIN_PROCESSES: u64 = 8;
/// Smallest non-zero `max_memory_mb`: below it not even a shell starts reliably.
const MIN_MEMORY_MB: u64 = 16;
/// Upper bound for any configured timeout (1 day): catches unit mistakes.
const MAX_CONFIG_SECS: u64 = 86_400;
/// Upper bound for `max_output_bytes` (64 MiB): output is held in memory.
const MAX_CONFIG_OUTPUT_BYTES: u64 = 64 * 1024 * 1024;

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
    /// Network of commands: "proxy" (no direct network at all, in their own network namespace;
    /// HTTP and HTTPS go through the daemon's egress proxy, which applies the same SSRF rules as
    /// web_fetch, via HTTP_PROXY/HTTPS_PROXY), "off" (no network at all) or "direct" (the host's
    /// network, unrestricted: opts out of these guarantees). true means "proxy", false "off".
    /// (default: "proxy")
    pub network: Option<NetworkSetting>,
    /// Host names the egress proxy lets commands reach (each also covers its subdomains; a
    /// leading "*." is accepted). Empty: any public host. (default: none)
    pub allow_domains: Option<Vec<String>>,
    /// Private, loopback or link-local networks the egress proxy lets commands reach anyway, as
    /// addresses or CIDRs (e.g. ["10.1.0.0/16"]). (default: none)
    pub allow_private: Option<Vec<String>>,
    /// Tasks (processes plus threads) one command may have at once; further forks fail. 0: no
    /// limit. Enforced by a cgroup, or RLIMIT_NPROC in the command's own user namespace.
    /// (default: 512)
    pub max_processes: Option<u64>,
    /// Memory one command may use, in MiB; past it the kernel's OOM killer ends it. 0: no limit.
    /// Needs a memory cgroup the daemon can create. (default: 1024)
    pub max_memory_mb: Option<u64>,
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
    /// Who may approve a command in "ask" mode: "chat" (anyone in the chat that asked) or
    /// "operator" (only the control UI, `weft approvals`, the admin API and the chat users in
    /// `approver_ids`). Anyone in the asking chat may still deny. (default: "chat" for commands
    /// on the gateway, "operator" for commands on nodes)
    pub approvers: Option<String>,
    /// Chat users who may approve any command from any chat, as "channel:user id" (e.g.
    /// ["telegram:1111111"]). Checked when the answer arrives: one removed by a reload can no
    /// longer approve. (default: none)
    pub approver_ids: Option<Vec<String>>,
    /// Bytes of stdout and of stderr kept per command; the rest is discarded and flagged.
    /// (default: 1048576)
    pub max_output_bytes: Option<u64>,
    /// `spawn` processes that may run at once across all sessions. (default: 5)
    pub max_concurrent_spawns: Option<u64>,
    /// Background commands (the `process` tool) one session may have running at once;
    /// starting one more is refused. (default: 4)
    pub max_background_processes: Option<u64>,
    /// Seconds after which a background command nobody polled, read or wrote is killed (a
    /// finished one is forgotten). (default: 1800)
    pub background_idle_secs: Option<u64>,
}

/// `tools.exec.network` as written: the mode, or the boolean of earlier versions.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum NetworkSetting {
    /// `true` ("proxy") or `false` ("off").
    Bool(bool),
    /// "proxy", "off" or "direct".
    Mode(String),
}

/// What network commands get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// Their own network namespace with only a loopback interface, on which a bridge to the
    /// daemon's egress proxy listens (`127.0.0.1:3128`, exported as `HTTP_PROXY` & co.).
    Proxy,
    /// Their own network namespace with only a loopback interface: no network at all.
    Off,
    /// The host's network, unrestricted (the behaviour before the egress proxy).
    Direct,
}

impl NetworkMode {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Proxy => "proxy",
            Self::Off => "off",
            Self::Direct => "direct",
        }
    }
}

/// Who may approve a command in "ask" mode (`tools.exec.approvers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Approvers {
    /// Anyone in the chat that asked (and the operator).
    Chat,
    /// Only the operator: the control UI, `weft approvals`, the admin API, and the chat users
    /// listed in `approver_ids`.
    Operator,
}

impl Approvers {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Operator => "operator",
        }
    }
}

/// Who may answer approval questions: `tools.exec.approvers` and `approver_ids`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApproverRules {
    /// As configured; `None`: the default of where the command runs.
    pub approvers: Option<Approvers>,
    /// Chat users ("channel:user id") who may approve from any chat.
    pub approver_ids: Vec<String>,
}

impl ApproverRules {
    /// Who approves a command that runs `on`: the configured value, else "chat" on the gateway
    /// and "operator" on nodes (a chat member must not approve a command on the home machine).
    pub fn for_run(&self, on: RunsOn) -> Approvers {
        match (self.approvers, on) {
            (Some(a), _) => a,
            (None, RunsOn::Gateway) => Approvers::Chat,
            (None, RunsOn::Node) => Approvers::Operator,
        }
    }

    /// Whether chat user `who` ("channel:user id") is a listed approver.
    pub fn is_listed(&self, who: &str) -> bool {
        self.approver_ids.iter().any(|a| a == who)
    }
}

/// Resolved, validated settings of the process tools.
#[derive(Clone, Debug, PartialEq)]
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
    /// Network of commands.
    pub network: NetworkMode,
    /// Host names the egress proxy lets commands reach (empty: any public host).
    pub allow_domains: Vec<String>,
    /// Non-public networks the egress proxy lets commands reach.
    pub allow_private: Vec<Cidr>,
    /// Tasks one command may have at once (0: no limit).
    pub max_processes: u32,
    /// Memory one command may use, in MiB (0: no limit).
    pub max_memory_mb: u64,
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
    /// Who may answer approval questions.
    pub approver_rules: ApproverRules,
    /// Cap per stream.
    pub max_output_bytes: usize,
    /// `spawn` concurrency.
    pub max_concurrent_spawns: usize,
    /// Background commands one session may have running at once (`process`).
    pub max_background_processes: usize,
    /// A background command unused for this long is killed (`process`).
    pub background_idle: Duration,
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
            network: NetworkMode::Proxy,
            allow_domains: Vec::new(),
            allow_private: Vec::new(),
            max_processes: DEFAULT_MAX_PROCESSES,
            max_memory_mb: DEFAULT_MAX_MEMORY_MB,
            sandbox: true,
            require_sandbox: false,
            read_paths: Vec::new(),
            write_paths: Vec::new(),
            env_passthrough: Vec::new(),
            approval_timeout: Duration::from_secs(DEFAULT_APPROVAL_TIMEOUT_SECS),
            approver_rules: ApproverRules::default(),
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            max_concurrent_spawns: DEFAULT_MAX_CONCURRENT_SPAWNS,
            max_background_processes: DEFAULT_MAX_BACKGROUND_PROCESSES,
            background_idle: Duration::from_secs(DEFAULT_BACKGROUND_IDLE_SECS),
        }
    }
}

fn secs(key: &str, v: Option<u64>, default: u64) -> Result<Duration, SettingError> {
    match v {
        None => Ok(Duration::from_secs(default)),
        Some(s) if (1..=MAX_CONFIG_SECS).contains(&s) => Ok(Duration::from_secs(s)),
        Some(s) => Err(invalid(format!(
            "`{key}`: expected a number of seconds from 1 to {MAX_CONFIG_SECS}, got {s}"
        ))),
    }
}

fn paths(key: &str, v: Option<&Vec<PathBuf>>) -> Result<Vec<PathBuf>, SettingError> {
    let v = v.cloned().unwrap_or_default();
    if let Some(bad) = v.iter().find(|p| !sandbox::is_clean_absolute(p)) {
        return Err(invalid(format!(
            "`{key}`: expected absolute paths without `..`, got {}",
            bad.display()
        )));
    }
    Ok(v)
}

/// An invalid `tools.exec` value. The key is the section and the detail starts with the field
/// in backquotes: the text users have always seen (`tools.exec`: `mode`: expected ...).
fn invalid(detail: impl Into<String>) -> SettingError {
    SettingError::new("tools.exec", detail)
}

impl ExecFile {
    /// `approvers` and `approver_ids`, checked.
    fn approver_rules(&self) -> Result<ApproverRules, SettingError> {
        let approvers = match self.approvers.as_deref() {
            None => None,
            Some("chat") => Some(Approvers::Chat),
            Some("operator") => Some(Approvers::Operator),
            Some(other) => {
                return Err(invalid(format!(
                    "`approvers`: expected \"chat\" (anyone in the chat that asked) or \"operator\" (the control UI, `weft approvals` and the users in `approver_ids`), got {other:?}"
                )))
            }
        };
        let approver_ids = self.approver_ids.clone().unwrap_or_default();
        if let Some(bad) = approver_ids.iter().find(|id| {
            id.split_once(':').is_none_or(|(c, u)| {
                c.is_empty() || u.is_empty() || id.contains(char::is_whitespace)
            })
        }) {
            return Err(invalid(format!(
                "`approver_ids`: expected \"channel:user id\" such as \"telegram:1111111\", got {bad:?}"
            )));
        }
        Ok(ApproverRules {
            approvers,
            approver_ids,
        })
    }

    /// Validate and fill in defaults.
    ///
    /// # Errors
    /// A message naming the offending key and what is expected.
    pub fn resolve(&self) -> Result<ExecSettings, SettingError> {
        let d = ExecSettings::default();
        let mode = match self.mode.as_deref() {
            None => d.mode,
            Some(m) => ExecMode::parse(m).ok_or_else(|| {
                invalid(format!(
                    "`mode`: expected \"denylist\", \"allowlist\" or \"ask\", got {m:?}"
                ))
            })?,
        };
        let mut deny_patterns = self.deny_patterns.clone().unwrap_or(d.deny_patterns);
        deny_patterns.extend(self.extra_deny_patterns.iter().flatten().cloned());
        if let Some(bad) = deny_patterns.iter().find(|p| {
            p.split('*')
                .all(|piece| crate::tools::shell_policy::normalise(piece).is_empty())
        }) {
            return Err(invalid(format!(
                "`deny_patterns`/`extra_deny_patterns`: pattern {bad:?} matches everything or nothing; write the text to refuse, with `*` for any text in between"
            )));
        }
        let allow_commands = self.allow_commands.clone().unwrap_or_default();
        if let Some(bad) = allow_commands
            .iter()
            .find(|c| c.trim().is_empty() || c.chars().any(char::is_whitespace))
        {
            return Err(invalid(format!(
                "`allow_commands`: expected program names such as \"ls\" or \"/usr/bin/git\", got {bad:?}"
            )));
        }
        if mode == ExecMode::Allowlist && allow_commands.is_empty() {
            return Err(invalid(
                "`allow_commands`: mode \"allowlist\" needs at least one allowed program name",
            ));
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
                return Err(invalid(format!(
                    "`{key}`: expected at most `max_timeout_secs` ({}), got {}",
                    max_timeout.as_secs(),
                    t.as_secs()
                )));
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
                usize::try_from(n).map_err(|_| invalid("`max_output_bytes`: too large"))?
            }
            Some(n) => {
                return Err(invalid(format!(
                    "`max_output_bytes`: expected 1 to {MAX_CONFIG_OUTPUT_BYTES}, got {n}"
                )))
            }
        };
        let max_concurrent_spawns = match self.max_concurrent_spawns {
            None => d.max_concurrent_spawns,
            Some(n @ 1..=64) => usize::try_from(n).unwrap_or(DEFAULT_MAX_CONCURRENT_SPAWNS),
            Some(n) => {
                return Err(invalid(format!(
                    "`max_concurrent_spawns`: expected 1 to 64, got {n}"
                )))
            }
        };
        let max_background_processes = match self.max_background_processes {
            None => d.max_background_processes,
            Some(n @ 1..=64) => usize::try_from(n).unwrap_or(DEFAULT_MAX_BACKGROUND_PROCESSES),
            Some(n) => {
                return Err(invalid(format!(
                    "`max_background_processes`: expected 1 to 64 (background commands per session; deny the `process` tool to turn them off), got {n}"
                )))
            }
        };
        let background_idle = secs(
            "background_idle_secs",
            self.background_idle_secs,
            DEFAULT_BACKGROUND_IDLE_SECS,
        )?;
        let env_passthrough = self.env_passthrough.clone().unwrap_or_default();
        for name in &env_passthrough {
            if name.is_empty() || name.contains(['=', '\0']) {
                return Err(invalid(format!(
                    "`env_passthrough`: expected environment variable names, got {name:?}"
                )));
            }
            if sandbox::is_secret_name(name) {
                return Err(invalid(format!(
                    "`env_passthrough`: {name:?} looks like a secret (contains KEY, TOKEN, SECRET, PASSWORD, PASSWD or CREDENTIAL) and is never passed to commands; remove it"
                )));
            }
            if name.starts_with("LD_") || matches!(name.as_str(), "HOME" | "TMPDIR") {
                return Err(invalid(format!(
                    "`env_passthrough`: {name:?} cannot be passed (HOME and TMPDIR are set by the sandbox, LD_* would change how programs load)"
                )));
            }
        }
        Ok(ExecSettings {
            mode,
            deny_patterns,
            allow_commands,
            timeout,
            spawn_timeout,
            max_timeout,
            network: self.network_mode(d.network)?,
            allow_domains: self.allow_domains()?,
            allow_private: self.allow_private()?,
            max_processes: match self.max_processes {
                None => d.max_processes,
                Some(0) => 0,
                Some(n) if (MIN_PROCESSES..=u64::from(u32::MAX)).contains(&n) => {
                    u32::try_from(n).unwrap_or(u32::MAX)
                }
                Some(n) => {
                    return Err(invalid(format!(
                        "`max_processes`: expected 0 (no limit) or {MIN_PROCESSES} to {}, got {n}",
                        u32::MAX
                    )))
                }
            },
            max_memory_mb: match self.max_memory_mb {
                None => d.max_memory_mb,
                Some(n) if n == 0 || (MIN_MEMORY_MB..=(1 << 30)).contains(&n) => n,
                Some(n) => {
                    return Err(invalid(format!(
                        "`max_memory_mb`: expected 0 (no limit) or {MIN_MEMORY_MB} to {}, got {n}",
                        1u64 << 30
                    )))
                }
            },
            sandbox: self.sandbox.unwrap_or(d.sandbox),
            require_sandbox: self.require_sandbox.unwrap_or(d.require_sandbox),
            read_paths: paths("read_paths", self.read_paths.as_ref())?,
            write_paths: paths("write_paths", self.write_paths.as_ref())?,
            env_passthrough,
            approval_timeout,
            approver_rules: self.approver_rules()?,
            max_output_bytes,
            max_concurrent_spawns,
            max_background_processes,
            background_idle,
        })
    }
}

impl ExecFile {
    fn network_mode(&self, default: NetworkMode) -> Result<NetworkMode, SettingError> {
        Ok(match &self.network {
            None => default,
            Some(NetworkSetting::Bool(true)) => NetworkMode::Proxy,
            Some(NetworkSetting::Bool(false)) => NetworkMode::Off,
            Some(NetworkSetting::Mode(m)) => match m.trim().to_ascii_lowercase().as_str() {
                "proxy" => NetworkMode::Proxy,
                "off" | "none" => NetworkMode::Off,
                "direct" => NetworkMode::Direct,
                _ => {
                    return Err(invalid(format!(
                        "`network`: expected \"proxy\" (the default: HTTP(S) through the egress proxy only), \"off\" (no network) or \"direct\" (the host's network, unrestricted), got {m:?}"
                    )))
                }
            },
        })
    }

    fn allow_domains(&self) -> Result<Vec<String>, SettingError> {
        let mut out = Vec::new();
        for d in self.allow_domains.iter().flatten() {
            let name = d.trim().trim_start_matches("*.").trim_end_matches('.');
            let ok = !name.is_empty()
                && name.len() <= 253
                && name.split('.').all(|label| {
                    !label.is_empty()
                        && label.len() <= 63
                        && label
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                });
            if !ok {
                return Err(invalid(format!(
                    "`allow_domains`: expected host names such as \"pypi.org\" or \"*.github.com\" (no scheme, port or path), got {d:?}"
                )));
            }
            out.push(name.to_ascii_lowercase());
        }
        Ok(out)
    }

    fn allow_private(&self) -> Result<Vec<Cidr>, SettingError> {
        self.allow_private
            .iter()
            .flatten()
            .map(|s| {
                s.parse::<Cidr>()
                    .map_err(|e| invalid(format!("`allow_private`: {e}")))
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "settings_tests.rs"]
mod tests;
