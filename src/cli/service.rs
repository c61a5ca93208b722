//! `weft service install|uninstall|status [--system]`: write, enable and inspect the systemd
//! unit (`deploy/systemd/*.service`, with this binary and the config path filled in). Without
//! `systemctl` it prints what to run instead. It never overwrites a different unit without
//! `--force`, and prints every file it writes or removes.

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
        Self { system, unit_path }
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

/// The unit text for this scope with `ExecStart=` running `exe` on `config`.
pub fn render_unit(system: bool, exe: &Path, config: &Path) -> String {
    let template = if system { SYSTEM_UNIT } else { USER_UNIT };
    let exec = format!(
        "ExecStart={} gateway --config {}",
        exec_word(&exe.to_string_lossy()),
        exec_word(&config.to_string_lossy())
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

fn absolute(p: &Path) -> Result<PathBuf, CliError> {
    std::path::absolute(p).map_err(|e| CliError(format!("cannot resolve {}: {e}", p.display())))
}

/// Run `weft service ACTION`; `config` is the `--config` argument, if given.
///
/// # Errors
/// A unit that differs (without `--force`), unwritable paths, a failing `systemctl`.
pub fn run(config: Option<&Path>, env: &Env, action: ServiceAction) -> Result<(), CliError> {
    let systemctl = find_systemctl(env);
    match action {
        ServiceAction::Install { system, force } => {
            let scope = Scope::new(system, env);
            let config = match config {
                Some(p) => absolute(p)?,
                None if system => PathBuf::from(SYSTEM_CONFIG),
                None => absolute(&default_path(env))?,
            };
            let exe = std::env::current_exe()
                .map_err(|e| CliError(format!("cannot find the weft binary's path: {e}")))?;
            install(&scope, &exe, &config, force, systemctl.as_deref())
        }
        ServiceAction::Uninstall { system } => {
            uninstall(&Scope::new(system, env), systemctl.as_deref())
        }
        ServiceAction::Status { system } => status(&Scope::new(system, env), systemctl.as_deref()),
    }
}

fn run_systemctl(scope: &Scope, systemctl: &Path, args: &[&str]) -> Result<(), CliError> {
    println!("running: {}", scope.systemctl_line(&args.join(" ")));
    let st = scope
        .systemctl(systemctl, args)
        .status()
        .map_err(|e| CliError(format!("cannot run {}: {e}", systemctl.display())))?;
    if st.success() {
        Ok(())
    } else {
        Err(CliError(format!(
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
    systemctl: Option<&Path>,
) -> Result<(), CliError> {
    let unit = render_unit(scope.system, exe, config);
    let path = &scope.unit_path;
    match std::fs::read_to_string(path) {
        Ok(existing) if existing == unit => {
            println!("unchanged {}", path.display());
        }
        Ok(_) if !force => {
            return Err(CliError(format!(
                "{} exists and differs from the unit this weft would write: keep it, or rerun \
                 with --force to replace it",
                path.display()
            )))
        }
        Ok(_) | Err(_) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| CliError(format!("cannot create {}: {e}", dir.display())))?;
            }
            std::fs::write(path, &unit).map_err(|e| {
                CliError(format!(
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
    match systemctl {
        Some(sc) => {
            run_systemctl(scope, sc, &["daemon-reload"])?;
            run_systemctl(scope, sc, &["enable", "--now", UNIT_NAME])?;
            println!(
                "clawft is enabled and started: `{}`",
                scope.systemctl_line("status clawft")
            );
        }
        None => {
            println!("systemctl not found on PATH; to enable and start the service, run:");
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

fn uninstall(scope: &Scope, systemctl: Option<&Path>) -> Result<(), CliError> {
    let path = &scope.unit_path;
    if !path.exists() {
        println!("{} is not installed (no {})", UNIT_NAME, path.display());
        return Ok(());
    }
    if let Some(sc) = systemctl {
        run_systemctl(scope, sc, &["disable", "--now", UNIT_NAME])?;
    }
    std::fs::remove_file(path)
        .map_err(|e| CliError(format!("cannot remove {}: {e}", path.display())))?;
    println!("removed {}", path.display());
    match systemctl {
        Some(sc) => run_systemctl(scope, sc, &["daemon-reload"])?,
        None => {
            println!("systemctl not found on PATH; if the service was running, run:");
            println!(
                "  {}",
                scope.systemctl_line(&format!("disable --now {UNIT_NAME}"))
            );
            println!("  {}", scope.systemctl_line("daemon-reload"));
        }
    }
    Ok(())
}

fn status(scope: &Scope, systemctl: Option<&Path>) -> Result<(), CliError> {
    let installed = scope.unit_path.exists();
    match systemctl {
        Some(sc) => {
            // `systemctl status` exits 3 for a stopped unit: its output says it all.
            let st = scope
                .systemctl(sc, &["status", "--no-pager", UNIT_NAME])
                .status()
                .map_err(|e| CliError(format!("cannot run {}: {e}", sc.display())))?;
            if !installed && !st.success() {
                println!(
                    "{} is not installed: `weft service install{}`",
                    scope.unit_path.display(),
                    if scope.system { " --system" } else { "" }
                );
            }
            Ok(())
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
                "systemctl not found on PATH, so the service state is unknown here; \
                 `weft status` shows whether a gateway is running"
            );
            Ok(())
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
        );
        let exec: Vec<&str> = u.lines().filter(|l| l.starts_with("ExecStart=")).collect();
        assert_eq!(
            exec,
            ["ExecStart=\"/opt/my tools/weft\" gateway --config /home/u/100%%/c.toml"]
        );
        assert!(u.contains("Type=notify"));
        let s = render_unit(true, Path::new("/usr/bin/weft"), Path::new(SYSTEM_CONFIG));
        assert!(s.contains("\nExecStart=/usr/bin/weft gateway --config /etc/clawft/config.toml\n"));
        assert!(s.contains("\nUser=clawft\n"));
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
