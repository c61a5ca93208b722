//! `weft`: clap → config → telemetry → command.

use std::process::ExitCode;

use clawft::cli::{self, Cli, Command};
use clawft::config::{Config, ConfigError, Env};

fn main() -> ExitCode {
    // Everything weft writes (store, index, logs, media, backups) is private to this user,
    // whatever the umask it was started with (docs/security.md, "Private files").
    clawft::types::private::restrict_umask();
    clawft::install_crypto_provider();
    let cli = cli::parse();
    if cli.command.prints_only() {
        cli::end_on_closed_stdout();
    }
    let env = Env::from_process();
    let journald = env.get("JOURNAL_STREAM").is_some();
    let default_level = match cli.command {
        Command::Gateway => "info",
        // A failed turn's reason is the command's error, printed once (not logged as well).
        Command::Agent { .. } => "warn,clawft::turn::failure=off",
        _ => "warn",
    };
    let ansi = cli.color.colour(
        env.get("NO_COLOR"),
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
    );
    // A gateway not run by systemd keeps its log in a file too, where `weft logs` finds it.
    let (log_file, log_file_error) = match cli.command {
        Command::Gateway if !journald => {
            let path = clawft::config::clawft_home(&env).join(cli::logs::LOG_FILE);
            match clawft::telemetry::RotatingFile::open(&path) {
                Ok(f) => (Some(f), None),
                Err(e) => (None, Some(format!("{}: {e}", path.display()))),
            }
        }
        _ => (None, None),
    };
    clawft::telemetry::init_with_file(
        cli.log_format,
        default_level,
        env.get("RUST_LOG"),
        journald,
        ansi,
        log_file,
    );
    if let Some(e) = log_file_error {
        tracing::warn!(error = %e, "the log file cannot be written; logging to stderr only");
    }

    if let Command::Onboard { force } = cli.command {
        return match cli::onboard::run(cli.config.as_deref(), &env, force) {
            Ok(paths) => {
                for p in paths {
                    println!("wrote {}", p.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e.to_string()),
        };
    }
    if let Command::Completions { shell } = cli.command {
        use clap::CommandFactory;
        let mut cmd = cli::help::decorate(Cli::command());
        print!("{}", cli::completions::script(shell, &mut cmd));
        return ExitCode::SUCCESS;
    }
    if let Command::Logs {
        follow,
        lines,
        system,
        print_command,
    } = cli.command
    {
        return match cli::logs::run(&env, follow, lines, system, print_command) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e.to_string()),
        };
    }
    if let Command::Config {
        action: cli::config_cmd::ConfigAction::Check,
    } = cli.command
    {
        return match cli::config_cmd::check(cli.config.as_deref(), &env) {
            Ok(msg) => {
                println!("{msg}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e.to_string()),
        };
    }
    if let Command::Service { action } = cli.command {
        // Needs no valid config: the unit only names the config file.
        return match cli::service::run(cli.config.as_deref(), &env, action) {
            Ok(code) => ExitCode::from(code),
            Err(e) => fail(&e.to_string()),
        };
    }
    // Only the gateway uses the chat channels' tokens, the webhooks' secrets and the
    // transcription key: every other command works from a shell that does not hold them (they
    // may live only in the service's environment) and says so where it matters.
    let load_env = match cli.command {
        Command::Gateway => env.clone(),
        _ => env.clone().for_client(),
    };
    let config = match Config::load(cli.config.as_deref(), &load_env) {
        Ok(c) => c,
        Err(e) if matches!(cli.command, Command::Doctor { .. }) => {
            println!("{:<5} {:<22} {e}", "fail", "config");
            return fail("1 check(s) failed");
        }
        Err(e) if talks_to_the_gateway(&cli.command) && !matches!(e, ConfigError::Missing(_)) => {
            // The running gateway keeps the configuration it loaded: what finds it (the store's
            // control file) is enough, and pending approvals must not expire over a typo.
            match Config::load_to_find_gateway(cli.config.as_deref(), &load_env) {
                // Without a running gateway only the store commands work from the store alone;
                // `status` would show defaults instead of the settings.
                Ok(c) if gateway_runs(&c) || matches!(cli.command, Command::Store { .. }) => {
                    eprintln!(
                        "warning: the config file on disk does not load ({e}); a running gateway keeps the configuration it loaded, but it will refuse this file at its next reload or restart. Fix it, then check with `weft config check`."
                    );
                    c
                }
                Ok(_) | Err(_) => return fail(&e.to_string()),
            }
        }
        Err(e) => return fail(&e.to_string()),
    };
    // One thread for the actors and I/O (blocking work goes to the blocking pool): measured
    // against 2 workers (docs/performance-optimisations.md), it starts faster (-1.2 ms CPU),
    // idles smaller (-0.7 MiB) and at 100 turns in flight holds a lower p99 and RSS for the
    // same throughput.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the runtime: {e}")),
    };
    let result = rt.block_on(async move {
        match cli.command {
            Command::Onboard { .. } | Command::Service { .. } => Ok(()),
            Command::Completions { .. } | Command::Logs { .. } => Ok(()),
            Command::Config { action } => match action {
                cli::config_cmd::ConfigAction::Show { json } => {
                    cli::config_cmd::show(&config, &env, json)
                }
                cli::config_cmd::ConfigAction::Check => Ok(()),
            },
            Command::Agent {
                message,
                session,
                agent,
            } => match cli::agents::terminal_session(&config, &session, agent.as_deref()) {
                Ok(session) => cli::agent::run(&config, message, &session).await,
                Err(e) => Err(e),
            },
            Command::Agents { action } => cli::agents::run(&config, action),
            Command::Gateway => cli::gateway::run(config, cli::gateway::signals()).await,
            Command::Status { json } => cli::status::run(&config, json).await,
            Command::Sessions { action } => cli::sessions::run(&config, action).await,
            Command::Usage {
                by,
                days,
                session,
                json,
            } => cli::usage::run(&config, by, days, session, json).await,
            Command::Tools { action } => cli::tools::run(&config, action).await,
            Command::Pairing { action } => cli::pairing::run(&config, action).await,
            Command::Approvals { action } => cli::approvals::run(&config, action).await,
            Command::Dashboard {
                read_only,
                no_open,
                revoke_all,
            } => cli::dashboard::run(&config, read_only, no_open, revoke_all).await,
            Command::Cron { action } => cli::cron::run(&config, action).await,
            Command::Store { action } => cli::store::run(&config, action).await,
            Command::Doctor { json } => cli::doctor::run(&config, json).await,
            Command::Mcp { action } => cli::mcp::run(&config, action).await,
            Command::McpServer => cli::mcp::serve(&config).await,
            Command::Memory { action } => cli::memory::run(&config, action).await,
            Command::Skills {
                action: cli::SkillsAction::List { json },
            } => cli::tools::skills_list(&config, json),
            Command::Node {
                gateway,
                name,
                workspace,
                offer,
                state_dir,
                gateway_key,
                gateway_ca,
            } => {
                cli::node::run(
                    &config,
                    cli::node::NodeOptions {
                        gateway,
                        name,
                        workspace,
                        offers: offer,
                        state_dir,
                        gateway_key,
                        gateway_ca,
                    },
                )
                .await
            }
            Command::Nodes { action } => cli::node::nodes(&config, action).await,
            Command::Cluster { action } => cli::cluster::run(&config, action).await,
            Command::Send {
                channel,
                chat_id,
                text,
                json,
            } => cli::pairing::send(&config, &channel, &chat_id, &text, json).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weft: {e}");
            ExitCode::from(e.code())
        }
    }
}

fn fail(msg: &str) -> ExitCode {
    eprintln!("weft: {msg}");
    ExitCode::FAILURE
}

/// Commands that only talk to the running gateway (or read its store): they need only what
/// finds it, so a typo elsewhere in the file on disk does not lock the operator out.
fn talks_to_the_gateway(command: &Command) -> bool {
    match command {
        Command::Status { .. }
        | Command::Approvals { .. }
        | Command::Pairing { .. }
        | Command::Dashboard { .. }
        | Command::Store { .. } => true,
        // Prices, budgets and agents come from the whole file.
        Command::Sessions { .. } | Command::Usage { .. } => false,
        Command::Onboard { .. }
        | Command::Service { .. }
        | Command::Completions { .. }
        | Command::Logs { .. }
        | Command::Config { .. }
        | Command::Agent { .. }
        | Command::Agents { .. }
        | Command::Gateway
        | Command::Tools { .. }
        | Command::Cron { .. }
        | Command::Doctor { .. }
        | Command::Mcp { .. }
        | Command::McpServer
        | Command::Memory { .. }
        | Command::Skills { .. }
        | Command::Node { .. }
        | Command::Nodes { .. }
        | Command::Cluster { .. }
        | Command::Send { .. } => false,
    }
}

/// Whether a gateway runs on `config`'s store (its control file names a live process).
fn gateway_runs(config: &Config) -> bool {
    matches!(cli::control::read(&config.store.path), Ok(Some(info)) if cli::control::pid_alive(info.pid))
}
