//! `weft service install|uninstall|status [--system]`: write, enable and inspect the systemd
//! unit (`deploy/systemd/*.service`, with this binary and the config path filled in). Without
//! `systemctl`, or where systemd is not running (containers, WSL: no `/run/systemd/system`), it
//! writes or removes the unit file and prints what to run instead. It never overwrites a
//! different unit without `--force`, and prints every file it writes or removes.
//!
//! A service does not inherit the shell's environment: install says which of the variables the
//! config needs (provider keys, `*_env` names) the service will see, and with
//! `--write-credentials` (or a "y" on a terminal) writes them to a 0600 credentials file that
//! the unit reads with `EnvironmentFile=`.

use std::collections::BTreeMap;
use std::io::IsTerminal;

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Subcommand;

use super::CliError;
use crate::config::{default_path, Env};

/// The system unit template (dedicated user, hardening).
pub const SYSTEM_UNIT: &str = include_str!("../../deploy/systemd/clawft.service");
/// The user unit template.
pub const USER_UNIT: &str = include_str!("../../deploy/systemd/clawft-user.service");
/// The unit's name.
pub const UNIT_NAME: &str = "clawft.service";
/// Where the system unit reads its config when `--config` is not given.
pub const SYSTEM_CONFIG: &str = "/etc/clawft/config.toml";
/// The system unit's credentials file.
pub const SYSTEM_ENV_FILE: &str = "/etc/clawft/service.env";
/// Exists when systemd is the running init system (what `sd_booted(3)` checks).
pub const SYSTEMD_PROBE: &str = "/run/systemd/system";
/// For tests only: a path checked instead of [`SYSTEMD_PROBE`].
pub const SYSTEMD_PROBE_ENV: &str = "WEFT_TEST_SYSTEMD_PROBE";
/// The provider variables read from the environment when no provider is configured.
pub const PROVIDER_VARS: &[&str] = &[
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "OPENROUTER_API_KEY",
];

/// `weft service` actions.
#[derive(Debug, Subcommand)]
pub enum ServiceAction {
    /// Write the unit (user: ~/.config/systemd/user/clawft.service; --system:
    /// /etc/systemd/system/clawft.service), then daemon-reload and enable --now.
    Install {
        /// Install the system unit (runs as user `clawft`; needs root).
        #[arg(long)]
        system: bool,
        /// Replace an existing unit file that differs.
        #[arg(long)]
        force: bool,
        /// Write the credentials the config needs from this shell's environment (API keys,
        /// `*_env` variables) to the service's credentials file (~/.clawft/service.env, mode
        /// 600), which the unit reads. On a terminal, install asks.
        #[arg(long)]
        write_credentials: bool,
    },
    /// Disable and stop the service, then remove the unit file.
    Uninstall {
        /// The system unit.
        #[arg(long)]
        system: bool,
    },
    /// `systemctl status clawft`, or what to check without systemd.
    Status {
        /// The system unit.
        #[arg(long)]
        system: bool,
    },
}

/// Where a unit lives and how `systemctl` is called for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// The system manager (`--system`) or the user's.
    pub system: bool,
    /// The unit file path.
    pub unit_path: PathBuf,
    /// The credentials file the unit reads (`EnvironmentFile=-…`).
    pub env_file: PathBuf,
}

impl Scope {
    /// The scope for `--system` or the current user (`$XDG_CONFIG_HOME` or `~/.config`).
    pub fn new(system: bool, env: &Env) -> Self {
        let unit_path = if system {
            PathBuf::from("/etc/systemd/system").join(UNIT_NAME)
        } else {
            env.get("XDG_CONFIG_HOME")
                .map_or_else(|| env.home().join(".config"), PathBuf::from)
                .join("systemd/user")
                .join(UNIT_NAME)
        };
        let env_file = if system {
            PathBuf::from(SYSTEM_ENV_FILE)
        } else {
            crate::config::clawft_home(env).join(crate::config::SERVICE_ENV_FILE)
        };
        Self {
            system,
            unit_path,
            env_file,
        }
    }

    /// `systemctl [--user] ARGS…` as a shell line.
    fn systemctl_line(&self, args: &str) -> String {
        if self.system {
            format!("systemctl {args}")
        } else {
            format!("systemctl --user {args}")
        }
    }

    fn systemctl(&self, systemctl: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(systemctl);
        if !self.system {
            c.arg("--user");
        }
        c.args(args);
        c
    }
}

/// Quote one `ExecStart=` word for systemd: `%` doubled, and double quotes around words with
/// whitespace, quotes or backslashes.
fn exec_word(s: &str) -> String {
    let s = s.replace('%', "%%");
    if s.chars()
        .any(|c| c.is_whitespace() || c == '"' || c == '\'' || c == '\\')
    {
        format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        s
    }
}

/// The unit text for this scope with `ExecStart=` running `exe` on `config`, reading the
/// credentials file `env_file` if it exists.
pub fn render_unit(system: bool, exe: &Path, config: &Path, env_file: &Path) -> String {
    let template = if system { SYSTEM_UNIT } else { USER_UNIT };
    let exec = format!(
        "ExecStart={} gateway --config {}\n\
         # Credentials from `weft service install --write-credentials` (optional: `-`).\n\
         EnvironmentFile=-{}",
        exec_word(&exe.to_string_lossy()),
        exec_word(&config.to_string_lossy()),
        exec_word(&env_file.to_string_lossy())
    );
    let mut out = String::with_capacity(template.len() + 64);
    for line in template.lines() {
        if line.starts_with("ExecStart=") {
            out.push_str(&exec);
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// `systemctl` on `$PATH`, if any.
pub fn find_systemctl(env: &Env) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = env.get("PATH")?;
    std::env::split_paths(path)
        .map(|d| d.join("systemctl"))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Whether systemd is the running init system (`/run/systemd/system` exists). In containers and
/// WSL, `systemctl` may be installed while systemd is not running.
pub fn systemd_running(env: &Env) -> bool {
    Path::new(env.get(SYSTEMD_PROBE_ENV).unwrap_or(SYSTEMD_PROBE)).is_dir()
}

/// How the service manager can be reached here.
enum Manager {
    /// `systemctl` on PATH and systemd running.
    Running(PathBuf),
    /// `systemctl` on PATH, systemd not running.
    NotRunning,
    /// No `systemctl`.
    Absent,
}

impl Manager {
    fn detect(env: &Env) -> Self {
        match find_systemctl(env) {
            Some(sc) if systemd_running(env) => Manager::Running(sc),
            Some(_) => Manager::NotRunning,
            None => Manager::Absent,
        }
    }

    fn running(&self) -> Option<&Path> {
        match self {
            Manager::Running(p) => Some(p),
            _ => None,
        }
    }

    /// Why `systemctl` is not run here.
    fn why_not(&self) -> &'static str {
        match self {
            Manager::NotRunning => {
                "systemd is not running here (no /run/systemd/system: a container, or WSL \
                 without systemd enabled), so systemctl cannot manage the service"
            }
            _ => "systemctl not found on PATH",
        }
    }
}

/// The environment variable names a config file refers to: the values of `*_env` keys
/// (`api_key_env`, `token_env`, …) and of `headers_env` tables. Empty when it does not parse.
pub fn referenced_env(path: &Path) -> Vec<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    if k.ends_with("_env") {
                        match v {
                            serde_json::Value::String(s) => out.push(s.clone()),
                            serde_json::Value::Object(h) => out
                                .extend(h.values().filter_map(|s| s.as_str().map(str::to_string))),
                            _ => {}
                        }
                    } else {
                        walk(v, out);
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    if let Ok(v) = ::config::Config::builder()
        .add_source(::config::File::from(path.to_path_buf()))
        .build()
        .and_then(::config::Config::try_deserialize::<serde_json::Value>)
    {
        walk(&v, &mut out);
    }
    out
}

/// The environment variables the gateway on `config_path` needs from its environment: the
/// `*_env` names of the config, and the provider keys (and base URLs) it takes from the
/// environment when no provider is configured.
pub fn needed_env(config_path: &Path, env: &Env) -> Vec<String> {
    let mut out = referenced_env(config_path);
    let set = |n: &&&str| env.get(n).is_some_and(|v| !v.is_empty());
    match crate::config::Config::load(Some(config_path).filter(|p| p.exists()), env) {
        Ok(c) => match c.provider_source {
            crate::config::ProviderSource::Configured => {}
            crate::config::ProviderSource::Environment(names) => {
                out.extend(names);
                out.extend(
                    ["OPENAI_BASE_URL", "ANTHROPIC_BASE_URL"]
                        .iter()
                        .filter(&set)
                        .map(|s| (*s).to_string()),
                );
            }
            crate::config::ProviderSource::LocalDefault => {
                out.extend(
                    ["OPENAI_BASE_URL"]
                        .iter()
                        .filter(&set)
                        .map(|s| (*s).to_string()),
                );
            }
        },
        Err(_) => out.extend(PROVIDER_VARS.iter().filter(&set).map(|s| (*s).to_string())),
    }
    let mut seen = std::collections::BTreeSet::new();
    out.retain(|n| seen.insert(n.clone()));
    out
}

/// The `NAME=value` pairs of a credentials file (comments and blank lines skipped; quotes
/// around the value removed). Empty when it does not exist.
pub fn read_env_file(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .map_or_else(
                    || v.to_string(),
                    |v| v.replace("\\\"", "\"").replace("\\\\", "\\"),
                );
            (k.trim().to_string(), v)
        })
        .collect()
}

/// One `EnvironmentFile=` line: the value bare when it is plain, else double-quoted.
fn env_line(name: &str, value: &str) -> String {
    if value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.:/+=@,".contains(&b))
    {
        format!("{name}={value}\n")
    } else {
        format!(
            "{name}=\"{}\"\n",
            value.replace('\\', "\\\\").replace('"', "\\\"")
        )
    }
}

/// Add or replace `vars` in the credentials file, created (or left) with mode 600.
fn write_env_file(path: &Path, vars: &[(String, String)]) -> Result<(), CliError> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if let Some((n, _)) = vars.iter().find(|(_, v)| v.contains(['\n', '\r'])) {
        return Err(CliError::Failed(format!(
            "{n} holds a line break, which an EnvironmentFile= cannot carry: write it to {} \
             yourself (mode 600), or pass it with a `*_file` setting instead",
            path.display()
        )));
    }
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let mut text = String::new();
    for line in old.lines() {
        let key = line.split_once('=').map(|(k, _)| k.trim());
        if !key.is_some_and(|k| vars.iter().any(|(n, _)| n == k)) {
            text.push_str(line);
            text.push('\n');
        }
    }
    if old.is_empty() {
        text.push_str(
            "# Environment of the clawft service (EnvironmentFile= of its unit), written by\n\
             # `weft service install --write-credentials`. Keep it mode 600.\n",
        );
    }
    for (n, v) in vars {
        text.push_str(&env_line(n, v));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| CliError::Failed(format!("cannot create {}: {e}", dir.display())))?;
    }
    let err = |e: std::io::Error| CliError::Failed(format!("cannot write {}: {e}", path.display()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(err)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    Ok(())
}

/// Ask a yes/no question on the terminal (default no).
fn ask(question: &str) -> bool {
    use std::io::Write;
    print!("{question} [y/N] ");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).is_ok()
        && matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

/// Say which credentials the service will see; write the missing ones that this shell has to
/// the credentials file when asked to. Returns whether the file was written.
fn credentials(scope: &Scope, needed: &[String], env: &Env, write: bool) -> Result<bool, CliError> {
    let file = &scope.env_file;
    let have = read_env_file(file);
    let visible: Vec<&str> = needed
        .iter()
        .filter(|n| have.contains_key(n.as_str()))
        .map(String::as_str)
        .collect();
    let (settable, unset): (Vec<&String>, Vec<&String>) = needed
        .iter()
        .filter(|n| !have.contains_key(n.as_str()))
        .partition(|n| env.get(n).is_some_and(|v| !v.is_empty()));
    if needed.is_empty() {
        println!(
            "credentials: the config needs no environment variables (a service does not \
             inherit this shell's environment)"
        );
    } else if !visible.is_empty() {
        println!(
            "credentials: the service will see {} (from {})",
            visible.join(", "),
            file.display()
        );
    }
    let mut wrote = false;
    if !settable.is_empty() {
        let names: Vec<&str> = settable.iter().map(|s| s.as_str()).collect();
        let interactive = std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
        let yes = write
            || (interactive
                && ask(&format!(
                    "The service will not see {} (set in this shell only). Write {} to {} \
                     (mode 600) for it?",
                    names.join(", "),
                    if names.len() == 1 { "it" } else { "them" },
                    file.display()
                )));
        if yes {
            let vars: Vec<(String, String)> = settable
                .iter()
                .map(|n| ((*n).clone(), env.get(n).unwrap_or_default().to_string()))
                .collect();
            write_env_file(file, &vars)?;
            println!(
                "wrote {} (mode 600): {}; the service will see them",
                file.display(),
                names.join(", ")
            );
            wrote = true;
        } else {
            let fallback = if names.iter().any(|n| n.ends_with("_API_KEY")) {
                " (without a provider key it falls back to a local Ollama at \
                 http://127.0.0.1:11434/v1)"
            } else {
                ""
            };
            println!(
                "credentials: the service will NOT see {}: it does not inherit this shell's \
                 environment{fallback}. Run `weft service install{} --write-credentials` to \
                 write {} to {} (mode 600), which the unit reads",
                names.join(", "),
                if scope.system { " --system" } else { "" },
                if names.len() == 1 { "it" } else { "them" },
                file.display()
            );
        }
    }
    if !unset.is_empty() {
        let names: Vec<&str> = unset.iter().map(|s| s.as_str()).collect();
        println!(
            "credentials: {} (named in the config) {} set neither in this shell nor in {}: add \
             NAME=value lines to that file (mode 600)",
            names.join(", "),
            if names.len() == 1 { "is" } else { "are" },
            file.display()
        );
    }
    Ok(wrote)
}

fn absolute(p: &Path) -> Result<PathBuf, CliError> {
    std::path::absolute(p)
        .map_err(|e| CliError::Failed(format!("cannot resolve {}: {e}", p.display())))
}

/// Run `weft service ACTION`; `config` is the `--config` argument, if given. Returns the exit
/// code: 0, or for `status` what `systemctl status` returned (3: not running), and 3 when the
/// state cannot be known here (no systemd).
///
/// # Errors
/// A unit that differs (without `--force`), unwritable paths, a failing `systemctl`.
pub fn run(config: Option<&Path>, env: &Env, action: ServiceAction) -> Result<u8, CliError> {
    let manager = Manager::detect(env);
    match action {
        ServiceAction::Install {
            system,
            force,
            write_credentials,
        } => {
            let scope = Scope::new(system, env);
            let config = match config {
                Some(p) => absolute(p)?,
                None if system => PathBuf::from(SYSTEM_CONFIG),
                None => absolute(&default_path(env))?,
            };
            let exe = std::env::current_exe().map_err(|e| {
                CliError::Failed(format!("cannot find the weft binary's path: {e}"))
            })?;
            let needed = needed_env(&config, env);
            install(&scope, &exe, &config, force, &manager, || {
                credentials(&scope, &needed, env, write_credentials)
            })?;
            Ok(0)
        }
        ServiceAction::Uninstall { system } => {
            uninstall(&Scope::new(system, env), &manager)?;
            Ok(0)
        }
        ServiceAction::Status { system } => status(&Scope::new(system, env), &manager),
    }
}

fn run_systemctl(scope: &Scope, systemctl: &Path, args: &[&str]) -> Result<(), CliError> {
    println!("running: {}", scope.systemctl_line(&args.join(" ")));
    let st = scope
        .systemctl(systemctl, args)
        .status()
        .map_err(|e| CliError::Failed(format!("cannot run {}: {e}", systemctl.display())))?;
    if st.success() {
        Ok(())
    } else {
        Err(CliError::Failed(format!(
            "`{}` failed ({st}); see `journalctl {}-u clawft`",
            scope.systemctl_line(&args.join(" ")),
            if scope.system { "" } else { "--user " }
        )))
    }
}

fn install(
    scope: &Scope,
    exe: &Path,
    config: &Path,
    force: bool,
    manager: &Manager,
    credentials: impl FnOnce() -> Result<bool, CliError>,
) -> Result<(), CliError> {
    let unit = render_unit(scope.system, exe, config, &scope.env_file);
    let path = &scope.unit_path;
    match std::fs::read_to_string(path) {
        Ok(existing) if existing == unit => {
            println!("unchanged {}", path.display());
        }
        Ok(_) if !force => {
            return Err(CliError::Failed(format!(
                "{} exists and differs from the unit this weft would write: keep it, or rerun \
                 with --force to replace it",
                path.display()
            )))
        }
        Ok(_) | Err(_) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| {
                    CliError::Failed(format!("cannot create {}: {e}", dir.display()))
                })?;
            }
            std::fs::write(path, &unit).map_err(|e| {
                CliError::Failed(format!(
                    "cannot write {}: {e}{}",
                    path.display(),
                    if scope.system {
                        " (the system unit needs root: sudo weft service install --system)"
                    } else {
                        ""
                    }
                ))
            })?;
            println!("wrote {}", path.display());
        }
    }
    if !config.exists() {
        println!(
            "note: {} does not exist yet: create it (`weft --config {} onboard`) before starting",
            config.display(),
            config.display()
        );
    }
    if scope.system {
        println!(
            "note: the system unit runs as user `clawft` with ProtectHome=yes: the binary ({}) \
             and config must be outside /home, and the user must exist \
             (useradd --system --home-dir /var/lib/clawft --shell /usr/sbin/nologin clawft); \
             see deploy/README.md",
            exe.display()
        );
    }
    let wrote_credentials = credentials()?;
    match manager.running() {
        Some(sc) => {
            run_systemctl(scope, sc, &["daemon-reload"])?;
            run_systemctl(scope, sc, &["enable", "--now", UNIT_NAME])?;
            if wrote_credentials {
                // A service that was already running reads the new credentials on restart.
                run_systemctl(scope, sc, &["try-restart", UNIT_NAME])?;
            }
            println!(
                "clawft is enabled and started: `{}`",
                scope.systemctl_line("status clawft")
            );
        }
        None => {
            println!(
                "{}; where systemd runs, enable and start the service with:",
                manager.why_not()
            );
            println!("  {}", scope.systemctl_line("daemon-reload"));
            println!(
                "  {}",
                scope.systemctl_line(&format!("enable --now {UNIT_NAME}"))
            );
            println!(
                "or without systemd: {} gateway --config {}",
                exe.display(),
                config.display()
            );
        }
    }
    Ok(())
}

fn uninstall(scope: &Scope, manager: &Manager) -> Result<(), CliError> {
    let path = &scope.unit_path;
    if !path.exists() {
        println!("{} is not installed (no {})", UNIT_NAME, path.display());
        return Ok(());
    }
    if let Some(sc) = manager.running() {
        run_systemctl(scope, sc, &["disable", "--now", UNIT_NAME])?;
    }
    std::fs::remove_file(path)
        .map_err(|e| CliError::Failed(format!("cannot remove {}: {e}", path.display())))?;
    println!("removed {}", path.display());
    if scope.env_file.exists() {
        println!(
            "kept the credentials file {} (delete it if you no longer need it)",
            scope.env_file.display()
        );
    }
    match manager.running() {
        Some(sc) => run_systemctl(scope, sc, &["daemon-reload"])?,
        None => {
            println!(
                "{}; if the service was enabled where systemd runs, also run:",
                manager.why_not()
            );
            println!(
                "  {}",
                scope.systemctl_line(&format!("disable --now {UNIT_NAME}"))
            );
            println!("  {}", scope.systemctl_line("daemon-reload"));
        }
    }
    Ok(())
}

fn status(scope: &Scope, manager: &Manager) -> Result<u8, CliError> {
    let installed = scope.unit_path.exists();
    match manager.running() {
        Some(sc) => {
            // `systemctl status` exits 3 for a stopped unit: its output says it all, and its
            // exit code is ours.
            let st = scope
                .systemctl(sc, &["status", "--no-pager", UNIT_NAME])
                .status()
                .map_err(|e| CliError::Failed(format!("cannot run {}: {e}", sc.display())))?;
            if !installed && !st.success() {
                println!(
                    "{} is not installed: `weft service install{}`",
                    scope.unit_path.display(),
                    if scope.system { " --system" } else { "" }
                );
            }
            Ok(st.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1))
        }
        None => {
            if installed {
                println!("unit file: {}", scope.unit_path.display());
            } else {
                println!(
                    "not installed ({} does not exist)",
                    scope.unit_path.display()
                );
            }
            println!(
                "{}, so the service state is unknown here; `weft status` shows whether a \
                 gateway is running",
                manager.why_not()
            );
            Ok(3)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn exec_start_is_filled_in_and_quoted() {
        let u = render_unit(
            false,
            Path::new("/opt/my tools/weft"),
            Path::new("/home/u/100%/c.toml"),
            Path::new("/home/u/.clawft/service.env"),
        );
        assert!(u.contains("\nEnvironmentFile=-/home/u/.clawft/service.env\n"));
        let exec: Vec<&str> = u.lines().filter(|l| l.starts_with("ExecStart=")).collect();
        assert_eq!(
            exec,
            ["ExecStart=\"/opt/my tools/weft\" gateway --config /home/u/100%%/c.toml"]
        );
        assert!(u.contains("Type=notify"));
        let s = render_unit(
            true,
            Path::new("/usr/bin/weft"),
            Path::new(SYSTEM_CONFIG),
            Path::new(SYSTEM_ENV_FILE),
        );
        assert!(s.contains("\nExecStart=/usr/bin/weft gateway --config /etc/clawft/config.toml\n"));
        assert!(s.contains("\nUser=clawft\n"));
    }

    #[test]
    fn credentials_file_round_trips_and_stays_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("service.env");
        std::fs::write(&p, "# mine\nKEEP=1\nOPENAI_API_KEY=old\n").unwrap();
        write_env_file(
            &p,
            &[
                ("OPENAI_API_KEY".into(), "sk-new".into()),
                ("ODD".into(), "a \"b\" \\c $d".into()),
            ],
        )
        .unwrap();
        let got = read_env_file(&p);
        assert_eq!(got["KEEP"], "1");
        assert_eq!(got["OPENAI_API_KEY"], "sk-new");
        assert_eq!(got["ODD"], "a \"b\" \\c $d");
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.starts_with("# mine\n"), "{text}");
        assert_eq!(text.matches("OPENAI_API_KEY=").count(), 1, "{text}");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let err = write_env_file(&p, &[("MULTI".into(), "a\nb".into())]).unwrap_err();
        assert!(
            err.to_string().contains("MULTI holds a line break"),
            "{err}"
        );
        assert!(!std::fs::read_to_string(&p).unwrap().contains("MULTI"));
    }

    #[test]
    fn scopes_put_the_unit_where_systemd_looks() {
        let env = Env::from_pairs([("HOME", "/home/u")]);
        assert_eq!(
            Scope::new(false, &env).unit_path,
            Path::new("/home/u/.config/systemd/user/clawft.service")
        );
        let env = Env::from_pairs([("HOME", "/home/u"), ("XDG_CONFIG_HOME", "/cfg")]);
        assert_eq!(
            Scope::new(false, &env).unit_path,
            Path::new("/cfg/systemd/user/clawft.service")
        );
        assert_eq!(
            Scope::new(true, &env).unit_path,
            Path::new("/etc/systemd/system/clawft.service")
        );
    }
}
