//! What the `weft` binary prints, run as a user runs it: colour only on a terminal, hints
//! naming where a value came from, errors printed once, help pages with examples, shell
//! completions, `weft config show|check` and `weft logs`.

use std::path::Path;
use std::process::Output;

use serde_json::json;

use crate::common::config_value;
use crate::fake_llm::{FakeLlm, Reply};
use crate::process::{free_port, gateway_config, log_of, weft, write_config, Daemon};

const ESC: char = '\u{1b}';

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Run `weft` in `dir` with `args` and extra environment (an empty value removes the
/// variable, e.g. `RUST_LOG` for the default filter), off the test's runtime.
async fn run(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = weft(dir);
    for (k, v) in env {
        if v.is_empty() {
            c.env_remove(k);
        } else {
            c.env(k, v);
        }
    }
    c.args(args);
    tokio::task::spawn_blocking(move || c.output().unwrap())
        .await
        .unwrap()
}

/// A config whose loading logs a warning (an MCP server with neither command nor url).
fn warning_config(dir: &Path) -> std::path::PathBuf {
    write_config(
        dir,
        &json!({
            "store": {"path": dir.join("store").to_str().unwrap()},
            "agents": {"defaults": {"workspace": dir.join("ws").to_str().unwrap()}},
            "tools": {"mcp_servers": {"empty": {}}},
        }),
    )
}

#[tokio::test]
async fn the_gateway_log_through_a_pipe_has_no_colour() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = gateway_config(dir.path(), &llm, port, json!({}));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    assert!(d.term().success());
    let log = log_of(dir.path());
    assert!(log.contains("INFO"), "{log}");
    assert!(!log.contains(ESC), "ANSI escapes in a log file:\n{log:?}");
}

#[tokio::test]
async fn color_always_colours_and_never_or_no_color_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = warning_config(dir.path());
    let cfg = cfg.to_str().unwrap();
    let base = ["--config", cfg, "skills", "list"];
    // A pipe, no option: plain.
    let out = run(dir.path(), &[("RUST_LOG", "warn")], &base).await;
    let err = text(&out.stderr);
    assert!(err.contains("neither `command` nor `url`"), "{err}");
    assert!(!err.contains(ESC), "{err:?}");
    // --color always: coloured even into a pipe, NO_COLOR or not (the option overrides).
    for env in [
        vec![("RUST_LOG", "warn")],
        vec![("RUST_LOG", "warn"), ("NO_COLOR", "1")],
    ] {
        let mut args = vec!["--color", "always"];
        args.extend(base);
        let out = run(dir.path(), &env, &args).await;
        let err = text(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(err.contains(ESC), "no colour with --color always: {err:?}");
    }
    let mut args = vec!["--color", "never"];
    args.extend(base);
    let out = run(dir.path(), &[("RUST_LOG", "warn")], &args).await;
    assert!(!text(&out.stderr).contains(ESC));
    let out = run(dir.path(), &[], &["--color", "sometimes", "status"]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("always"),
        "{}",
        text(&out.stderr)
    );
}

/// `weft ARGS` with stderr on a terminal (util-linux `script` gives it a pty); `None` when
/// `script` is not installed.
async fn on_a_terminal(dir: &Path, env: &[(&str, &str)], args: &str) -> Option<String> {
    let line = format!("{} {args} >/dev/null", env!("CARGO_BIN_EXE_weft"));
    let mut c = std::process::Command::new("script");
    c.args(["-qec", &line, "/dev/null"])
        .env_clear()
        .env("HOME", dir)
        .env("CLAWFT_HOME", dir.join(".clawft"))
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    let out = tokio::task::spawn_blocking(move || c.output())
        .await
        .unwrap()
        .ok()?;
    Some(text(&out.stdout))
}

#[tokio::test]
async fn on_a_terminal_logs_are_coloured_unless_no_color_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = warning_config(dir.path());
    let args = format!("--config {} skills list", cfg.display());
    let Some(tty) = on_a_terminal(dir.path(), &[], &args).await else {
        eprintln!("util-linux `script` is not installed: no terminal to test on");
        return;
    };
    assert!(tty.contains("neither `command` nor `url`"), "{tty:?}");
    assert!(tty.contains(ESC), "no colour on a terminal: {tty:?}");
    let plain = on_a_terminal(dir.path(), &[("NO_COLOR", "1")], &args)
        .await
        .unwrap();
    assert!(plain.contains("neither `command` nor `url`"), "{plain:?}");
    assert!(!plain.contains(ESC), "NO_COLOR ignored: {plain:?}");
    // An empty NO_COLOR counts as unset (no-color.org).
    let empty = on_a_terminal(dir.path(), &[("NO_COLOR", "")], &args)
        .await
        .unwrap();
    assert!(empty.contains(ESC), "{empty:?}");
    let never = on_a_terminal(dir.path(), &[], &format!("--color never {args}"))
        .await
        .unwrap();
    assert!(!never.contains(ESC), "{never:?}");
}

#[tokio::test]
async fn a_refused_key_from_the_environment_is_blamed_on_the_variable_once() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Status(401, None, "invalid api key".into()));
    let url = llm.base_url();
    let out = run(
        dir.path(),
        &[
            ("OPENAI_API_KEY", "sk-from-env-7f3a9c"),
            ("OPENAI_BASE_URL", &url),
            ("RUST_LOG", ""),
        ],
        &["agent", "-m", "hi"],
    )
    .await;
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("came from environment variable OPENAI_API_KEY"),
        "{err}"
    );
    assert!(!err.contains("providers.<name>"), "{err}");
    assert!(!err.contains("sk-from-env-7f3a9c"), "the key leaked: {err}");
    assert_eq!(
        err.matches("authentication failed").count(),
        1,
        "the error is printed more than once:\n{err}"
    );
}

#[tokio::test]
async fn a_refused_key_from_the_file_names_the_file_key() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Status(401, None, "invalid api key".into()));
    let cfg = write_config(
        dir.path(),
        &config_value(
            &llm.base_url(),
            dir.path(),
            json!({"channels": {"http": {"bind": format!("127.0.0.1:{}", free_port())}}}),
        ),
    );
    let out = run(
        dir.path(),
        &[("RUST_LOG", "")],
        &["--config", cfg.to_str().unwrap(), "agent", "-m", "hi"],
    )
    .await;
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!(
            "came from providers.openai.api_key in {}",
            cfg.display()
        )),
        "{err}"
    );
}

#[tokio::test]
async fn an_invalid_clawft_variable_is_blamed_on_the_variable_not_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = warning_config(dir.path());
    let out = run(
        dir.path(),
        &[("CLAWFT_AGENTS__DEFAULTS__TEMPERATURE", "warm")],
        &["--config", cfg.to_str().unwrap(), "status"],
    )
    .await;
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("environment variable CLAWFT_AGENTS__DEFAULTS__TEMPERATURE"),
        "{err}"
    );
    assert!(!err.contains(&cfg.display().to_string()), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[tokio::test]
async fn no_provider_and_a_refused_connection_fails_at_once_with_one_message() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = write_config(
        dir.path(),
        &json!({
            "store": {"path": dir.path().join("store").to_str().unwrap()},
            "agents": {"defaults": {"workspace": dir.path().join("ws").to_str().unwrap()}},
            "channels": {"http": {"bind": format!("127.0.0.1:{}", free_port())}},
        }),
    );
    let base = format!("http://127.0.0.1:{port}/v1");
    let out = run(
        dir.path(),
        &[("OPENAI_BASE_URL", &base), ("RUST_LOG", "")],
        &["--config", cfg.to_str().unwrap(), "agent", "-m", "hi"],
    )
    .await;
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("No LLM provider is configured"), "{err}");
    assert!(
        !err.contains("retrying"),
        "a refused local default was retried:\n{err}"
    );
    assert_eq!(
        err.matches("Connection refused").count(),
        1,
        "the failure is printed more than once:\n{err}"
    );
    assert!(!err.contains("WARN llm"), "{err}");

    // `doctor` gives the same fix (a key), not "set providers.local.base_url".
    let out = run(
        dir.path(),
        &[("OPENAI_BASE_URL", &base), ("RUST_LOG", "")],
        &["--config", cfg.to_str().unwrap(), "doctor"],
    )
    .await;
    let stdout = text(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.contains("provider local"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.starts_with("fail"), "{line}");
    assert!(line.contains("No LLM provider is configured"), "{line}");
    assert!(line.contains("OPENAI_API_KEY"), "{line}");
    assert!(!line.contains("providers.local.base_url"), "{line}");
}

#[tokio::test]
async fn help_pages_show_examples_and_the_environment_variables() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), &[], &["--help"]).await;
    assert!(out.status.success());
    let help = text(&out.stdout);
    for var in [
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "RUST_LOG",
        "CLAWFT_HOME",
        "NO_COLOR",
        "CLAWFT_<SECTION>__<KEY>",
    ] {
        assert!(help.contains(var), "{var} missing from --help:\n{help}");
    }
    assert!(help.contains("Examples:"), "{help}");
    assert!(help.contains("--color"), "{help}");
    for cmd in [
        "agent",
        "gateway",
        "sessions",
        "config",
        "logs",
        "completions",
    ] {
        let out = run(dir.path(), &[], &[cmd, "--help"]).await;
        assert!(out.status.success(), "{cmd}");
        let help = text(&out.stdout);
        assert!(
            help.contains("Examples:") && help.contains(&format!("weft {cmd}")),
            "{cmd} --help has no examples:\n{help}"
        );
    }
}

/// Check a script with the shell's own parser, when that shell is installed (`.ci/run`
/// installs zsh and fish).
fn syntax_ok(shell: &str, flag: &str, script: &Path) -> Option<bool> {
    let out = std::process::Command::new(shell)
        .arg(flag)
        .arg(script)
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "{shell} {flag}: {}",
        text(&out.stderr)
    );
    Some(true)
}

#[tokio::test]
async fn completion_scripts_parse_and_complete_subcommands_and_flags() {
    let dir = tempfile::tempdir().unwrap();
    for (shell, check) in [
        ("bash", ("bash", "-n")),
        ("zsh", ("zsh", "-n")),
        ("fish", ("fish", "--no-execute")),
    ] {
        let out = run(dir.path(), &[], &["completions", shell]).await;
        assert!(out.status.success(), "{}", text(&out.stderr));
        let script = text(&out.stdout);
        for word in ["sessions", "completions", "config", "--color", "--message"] {
            assert!(
                script.contains(word.trim_start_matches('-')),
                "{shell}: {word} missing"
            );
        }
        assert!(script.contains("always"), "{shell}: --color values missing");
        let file = dir.path().join(format!("weft.{shell}"));
        std::fs::write(&file, &script).unwrap();
        let checked = syntax_ok(check.0, check.1, &file);
        if shell == "bash" {
            assert_eq!(checked, Some(true), "bash is needed to check the script");
        } else if checked.is_none() {
            eprintln!("{shell} is not installed: its script was not parsed");
        }
    }
    // Bash completes a subcommand, then that subcommand's flags.
    let file = dir.path().join("weft.bash");
    let probe = format!(
        "source {}; COMP_WORDS=(weft sess); COMP_CWORD=1; _weft; echo \"${{COMPREPLY[@]}}\"; \
         COMP_WORDS=(weft agent --); COMP_CWORD=2; _weft; echo \"${{COMPREPLY[@]}}\"; \
         COMP_WORDS=(weft --color a); COMP_CWORD=2; _weft; echo \"${{COMPREPLY[@]}}\"",
        file.display()
    );
    let out = std::process::Command::new("bash")
        .args(["-c", &probe])
        .output()
        .unwrap();
    let lines: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
    assert_eq!(lines[0], "sessions", "{lines:?}");
    assert!(lines[1].split(' ').any(|w| w == "--message"), "{lines:?}");
    assert_eq!(lines[2], "auto always", "{lines:?}");
    let out = run(dir.path(), &[], &["completions", "powershell"]).await;
    assert!(!out.status.success());
}

#[tokio::test]
async fn config_show_names_each_source_and_never_prints_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &json!({
            "store": {"path": dir.path().join("store").to_str().unwrap()},
            "agents": {"defaults": {"workspace": dir.path().join("ws").to_str().unwrap()}},
            "providers": {"openai": {"api_key_env": "MY_KEY", "model": "gpt-4o"}},
            "channels": {"http": {"token": "http-token-5b1e77"}},
            "tools": {"mcp_servers": {"gh": {"command": "gh-mcp", "env": {"GH_TOKEN": "ghp-secret-91ad"}}}},
        }),
    );
    let c = cfg.to_str().unwrap();
    let out = run(
        dir.path(),
        &[
            ("MY_KEY", "sk-file-named-0c4e2d"),
            ("CLAWFT_SESSIONS__MAX_QUEUE", "7"),
        ],
        &["--config", c, "config", "show"],
    )
    .await;
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for secret in [
        "sk-file-named-0c4e2d",
        "http-token-5b1e77",
        "ghp-secret-91ad",
    ] {
        assert!(!shown.contains(secret), "{secret} printed:\n{shown}");
    }
    let line = |key: &str| {
        shown
            .lines()
            .find(|l| l.starts_with(&format!("{key} ")))
            .unwrap_or_else(|| panic!("no {key}:\n{shown}"))
            .to_string()
    };
    assert!(
        line("providers.openai.api_key").contains("environment variable MY_KEY"),
        "{shown}"
    );
    assert!(line("providers.openai.model").contains(&format!("in {c}")));
    assert!(line("sessions.max_queue").contains("7"));
    assert!(line("sessions.max_queue").contains("environment variable CLAWFT_SESSIONS__MAX_QUEUE"));
    assert!(
        line("sessions.idle_secs").contains("600")
            && line("sessions.idle_secs").ends_with("default")
    );
    assert!(line("channels.http.token").contains("****"));
    assert!(
        line("tools.mcp_servers.gh.env.GH_TOKEN").contains("****"),
        "{shown}"
    );

    // No config file, the key from the environment.
    let out = run(
        dir.path(),
        &[("OPENAI_API_KEY", "sk-env-2f8b61")],
        &["config", "show", "--json"],
    )
    .await;
    let shown = text(&out.stdout);
    assert!(!shown.contains("sk-env-2f8b61"), "{shown}");
    let rows: serde_json::Value = serde_json::from_str(&shown).unwrap();
    let key = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == "providers.openai.api_key")
        .unwrap();
    assert_eq!(key["source"], "environment variable OPENAI_API_KEY");
}

#[tokio::test]
async fn config_check_exits_0_or_1_with_the_error_once_naming_key_and_source() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = warning_config(dir.path());
    let c = cfg.to_str().unwrap();
    let out = run(dir.path(), &[], &["--config", c, "config", "check"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("ok:"),
        "{}",
        text(&out.stdout)
    );

    let out = run(
        dir.path(),
        &[("CLAWFT_CHANNELS__HTTP__BIND", "0.0.0.0:1")],
        &["--config", c, "config", "check"],
    )
    .await;
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("channels.http.bind"), "{err}");
    assert!(
        err.contains("environment variable CLAWFT_CHANNELS__HTTP__BIND"),
        "{err}"
    );
    assert_eq!(err.matches("channels.http.bind").count(), 1, "{err}");
    assert!(text(&out.stdout).is_empty());

    // A bad value in the file names the file.
    let bad = write_config(
        dir.path(),
        &json!({"agents": {"defaults": {"temperature": 7.5}}}),
    );
    let out = run(
        dir.path(),
        &[],
        &["--config", bad.to_str().unwrap(), "config", "check"],
    )
    .await;
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        err.contains(&format!("agents.defaults.temperature in {}", bad.display())),
        "{err}"
    );
}

#[tokio::test]
async fn logs_without_a_service_or_a_log_file_say_what_to_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), &[], &["logs"]).await;
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no gateway log found"), "{err}");
    assert!(err.contains("weft service install"), "{err}");
    assert!(err.contains("`weft gateway`"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    // The log file of a gateway run by hand: the command that follows it.
    let logs = dir.path().join(".clawft/logs");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(logs.join("gateway.log"), "line one\nline two\n").unwrap();
    let out = run(
        dir.path(),
        &[],
        &["logs", "-f", "-n", "5", "--print-command"],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).trim(),
        format!("tail -n 5 -f {}", logs.join("gateway.log").display())
    );
    let out = run(dir.path(), &[], &["logs", "-n", "1"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "line two\n");
}

/// `weft config show | head -1` (and the other print-only commands): the closed pipe ends the
/// process quietly, as it ends `cat`; no panic, no backtrace on the terminal.
#[tokio::test]
async fn a_closed_stdout_pipe_ends_a_listing_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &json!({
            "store": {"path": dir.path().join("store").to_str().unwrap()},
            "agents": {"defaults": {"workspace": dir.path().join("ws").to_str().unwrap()}},
        }),
    );
    for args in [&["config", "show"][..], &["completions", "bash"][..]] {
        // A pipe whose reading end is already closed (what `head -1` leaves behind).
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = weft(dir.path())
            .arg("--config")
            .arg(&cfg)
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.contains("Broken pipe"), "{args:?}: {err}");
    }
}
