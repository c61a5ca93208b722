//! `weft logs [-f] [-n N] [--system] [--print-command]`: show the gateway's log where it is
//! kept: the journal of the `clawft.service` unit when systemd runs it, else the log file
//! `$CLAWFT_HOME/logs/gateway.log` (where a gateway run by hand, or by another supervisor, is
//! told to send its stderr). When neither exists it says so and what to run.

use std::path::{Path, PathBuf};

use super::service::{Scope, UNIT_NAME};
use super::CliError;
use crate::config::{clawft_home, Env};

/// Where systemd keeps its runtime state when it is the running init (sd_booted(3)).
const SYSTEMD_RUN_DIR: &str = "/run/systemd/system";

/// The log file of a gateway not run by systemd (relative to `$CLAWFT_HOME`).
pub const LOG_FILE: &str = "logs/gateway.log";

/// Where the log is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogSource {
    /// The journal of the unit (`--user` for the user unit).
    Journal {
        /// The system unit.
        system: bool,
    },
    /// A log file.
    File(PathBuf),
}

/// The source to read, given whether the unit is installed, systemd runs and the log file
/// exists: the journal first (the service's log), then the file.
pub fn choose(
    unit_installed: bool,
    systemd_running: bool,
    system: bool,
    log_file: &Path,
    log_file_exists: bool,
) -> Option<LogSource> {
    if unit_installed && systemd_running {
        Some(LogSource::Journal { system })
    } else if log_file_exists {
        Some(LogSource::File(log_file.to_path_buf()))
    } else {
        None
    }
}

/// The command line that shows the log of `source`.
pub fn command(source: &LogSource, follow: bool, lines: u32) -> Vec<String> {
    let mut c: Vec<String> = match source {
        LogSource::Journal { system } => {
            let mut c = vec!["journalctl".to_string()];
            if !system {
                c.push("--user".into());
            }
            c.extend(["-u".into(), UNIT_NAME.into(), "--no-pager".into()]);
            c
        }
        LogSource::File(_) => vec!["tail".to_string()],
    };
    c.extend(["-n".into(), lines.to_string()]);
    if follow {
        c.push("-f".into());
    }
    if let LogSource::File(p) = source {
        c.push(p.display().to_string());
    }
    c
}

/// Run `weft logs`.
///
/// # Errors
/// Neither a running service nor a log file (with what to run), or the viewer failed.
pub fn run(
    env: &Env,
    follow: bool,
    lines: u32,
    system: bool,
    print_command: bool,
) -> Result<(), CliError> {
    let scope = Scope::new(system, env);
    let unit_installed = scope.unit_path.exists();
    let systemd_running = Path::new(SYSTEMD_RUN_DIR).is_dir();
    let log_file = clawft_home(env).join(LOG_FILE);
    let Some(source) = choose(
        unit_installed,
        systemd_running,
        system,
        &log_file,
        log_file.exists(),
    ) else {
        let unit = if unit_installed {
            format!(
                "the unit {} is installed but systemd is not running here, so there is no journal to read",
                scope.unit_path.display()
            )
        } else {
            format!(
                "no service is installed ({} does not exist)",
                scope.unit_path.display()
            )
        };
        return Err(CliError::Failed(format!(
            "no gateway log found: {unit}, and there is no log file {} (a gateway started by hand, `weft gateway`, writes it; one started with another CLAWFT_HOME writes it under that one). Start the gateway, or run it as a service with `weft service install` (then `weft logs` follows its journal)",
            log_file.display(),
        )));
    };
    let argv = command(&source, follow, lines);
    if print_command {
        println!("{}", argv.join(" "));
        return Ok(());
    }
    let status = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .status()
        .map_err(|e| CliError::Failed(format!("cannot run `{}`: {e}", argv.join(" "))))?;
    if status.success() {
        Ok(())
    } else {
        Err(CliError::Failed(format!(
            "`{}` failed ({status})",
            argv.join(" ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_journal_comes_first_then_the_file() {
        let f = Path::new("/h/.clawft/logs/gateway.log");
        assert_eq!(
            choose(true, true, false, f, true),
            Some(LogSource::Journal { system: false })
        );
        assert_eq!(
            choose(true, false, false, f, true),
            Some(LogSource::File(f.to_path_buf()))
        );
        assert_eq!(choose(true, false, false, f, false), None);
        assert_eq!(
            command(&LogSource::Journal { system: false }, true, 50).join(" "),
            "journalctl --user -u clawft.service --no-pager -n 50 -f"
        );
        assert_eq!(
            command(&LogSource::Journal { system: true }, false, 10).join(" "),
            "journalctl -u clawft.service --no-pager -n 10"
        );
        assert_eq!(
            command(&LogSource::File(f.to_path_buf()), true, 5).join(" "),
            "tail -n 5 -f /h/.clawft/logs/gateway.log"
        );
    }
}
