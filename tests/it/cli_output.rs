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
}
