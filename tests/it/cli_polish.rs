//! Issue 17, the polish: `weft service` where systemd does not run and the service's
//! credentials file, the onboard template's examples and `--force` backup, human output with
//! `--json` on request, hints in empty lists, MCP tools in `tools list`, `/help` and `/start` in
//! a chat, `-m ""`, no Rust debug text, the unknown-tool message, the API's 404 body, and the
//! README's quick start from a fresh HOME. All run the real `weft` binary.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

use crate::common::{config_value, everything_js};
use crate::fake_llm::{FakeLlm, Reply};
use crate::process::{free_port, gateway_config, weft, write_config, Daemon};

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

async fn run(cmd: Command) -> Output {
    let mut cmd = cmd;
    tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap()
}

/// A `systemctl` that records its arguments and fails as it does without a running systemd.
fn fake_systemctl(home: &Path) -> (PathBuf, PathBuf) {
    let bin = home.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let calls = home.join("calls.txt");
    let fake = bin.join("systemctl");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\necho \"$*\" >> '{}'\necho 'Failed to connect to bus: No medium found' >&2\nexit 1\n",
            calls.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    (bin, calls)
}

#[test]
fn service_with_systemctl_but_no_running_systemd_writes_and_removes_the_unit_and_says_what_to_run()
{
    let home = tempfile::tempdir().unwrap();
    let (bin, calls) = fake_systemctl(home.path());
    let service = |args: &[&str]| {
        weft(home.path())
            .env("PATH", &bin)
            .env(
                "WEFT_TEST_SYSTEMD_PROBE",
                home.path().join("no-run-systemd-system"),
            )
            .arg("service")
            .args(args)
            .output()
            .unwrap()
    };
    let unit = home.path().join(".config/systemd/user/clawft.service");

    let out = service(&["install"]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(unit.exists(), "{t}");
    assert!(t.contains("systemd is not running here"), "{t}");
    assert!(
        t.contains("systemctl --user enable --now clawft.service"),
        "{t}"
    );
    assert!(!t.contains("journalctl"), "{t}");

    let out = service(&["status"]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(3), "{t}");
    assert!(t.contains(&format!("unit file: {}", unit.display())), "{t}");
    assert!(t.contains("systemd is not running here"), "{t}");

    let out = service(&["uninstall"]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(!unit.exists(), "{t}");
    assert!(t.contains(&format!("removed {}", unit.display())), "{t}");
    // systemctl was never asked to do what it cannot.
    assert_eq!(std::fs::read_to_string(&calls).unwrap_or_default(), "");
}

#[test]
fn service_install_says_which_credentials_the_service_sees_and_writes_them_on_request() {
    let home = tempfile::tempdir().unwrap();
    let (bin, _) = fake_systemctl(home.path());
    let cmd = || {
        let mut c = weft(home.path());
        c.env("PATH", &bin)
            .env(
                "WEFT_TEST_SYSTEMD_PROBE",
                home.path().join("no-run-systemd-system"),
            )
            .env("OPENAI_API_KEY", "sk-quickstart-secret-42")
            .env("OPENAI_BASE_URL", "http://127.0.0.1:9/v1");
        c
    };
    let out = cmd().arg("onboard").output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let env_file = home.path().join(".clawft/service.env");

    let out = cmd().args(["service", "install"]).output().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("the service will NOT see OPENAI_API_KEY, OPENAI_BASE_URL"),
        "{t}"
    );
    assert!(t.contains("--write-credentials"), "{t}");
    assert!(!env_file.exists());
    let unit =
        std::fs::read_to_string(home.path().join(".config/systemd/user/clawft.service")).unwrap();
    assert!(
        unit.contains(&format!("\nEnvironmentFile=-{}\n", env_file.display())),
        "{unit}"
    );

    // doctor says the service would not see the key.
    let doctor = || {
        let out = cmd().args(["doctor"]).output().unwrap();
        stdout(&out)
            .lines()
            .find(|l| l.contains("service credentials"))
            .unwrap_or_else(|| panic!("{}", text(&out)))
            .to_string()
    };
    let line = doctor();
    assert!(line.starts_with("warn"), "{line}");
    assert!(line.contains("OPENAI_API_KEY"), "{line}");
    assert!(line.contains("--write-credentials"), "{line}");

    let out = cmd()
        .args(["service", "install", "--write-credentials"])
        .output()
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains(&format!("wrote {}", env_file.display())), "{t}");
    let mode = std::fs::metadata(&env_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    let written = std::fs::read_to_string(&env_file).unwrap();
    assert!(
        written.contains("\nOPENAI_API_KEY=sk-quickstart-secret-42\n"),
        "{written}"
    );
    assert!(
        written.contains("\nOPENAI_BASE_URL=http://127.0.0.1:9/v1\n"),
        "{written}"
    );
    // The key itself is never printed.
    assert!(!t.contains("sk-quickstart-secret-42"), "{t}");

    let line = doctor();
    assert!(line.starts_with("ok"), "{line}");

    let out = cmd().args(["service", "install"]).output().unwrap();
    let t = text(&out);
    assert!(
        t.contains("the service will see OPENAI_API_KEY, OPENAI_BASE_URL"),
        "{t}"
    );
}

/// On a terminal, install asks (default no) before writing the credentials file.
#[test]
fn service_install_on_a_terminal_asks_before_writing_the_credentials() {
    for (answer, written) in [("n\n", false), ("y\n", true)] {
        let home = tempfile::tempdir().unwrap();
        let (bin, _) = fake_systemctl(home.path());
        // `script` runs the command on a pseudo-terminal, fed from our stdin.
        let line = format!("'{}' service install", env!("CARGO_BIN_EXE_weft"));
        let mut child = Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .env_clear()
            .env("HOME", home.path())
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    bin.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .env(
                "WEFT_TEST_SYSTEMD_PROBE",
                home.path().join("no-run-systemd-system"),
            )
            .env("OPENAI_API_KEY", "sk-tty-secret-7")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("`script` (util-linux) runs the command on a terminal");
        {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(answer.as_bytes())
                .unwrap();
        }
        let out = child.wait_with_output().unwrap();
        let t = text(&out);
        let env_file = home.path().join(".clawft/service.env");
        assert!(
            t.contains(
                "The service will not see OPENAI_API_KEY (set in this shell only). Write it to"
            ),
            "{t}"
        );
        assert!(t.contains("[y/N]"), "{t}");
        assert_eq!(env_file.exists(), written, "{answer:?}: {t}");
        if written {
            assert!(std::fs::read_to_string(&env_file)
                .unwrap()
                .contains("\nOPENAI_API_KEY=sk-tty-secret-7\n"));
        } else {
            assert!(t.contains("--write-credentials"), "{t}");
        }
    }
}

/// The template with the `# key = value` / `# [table]` lines of one example block uncommented
/// (a block: consecutive comment lines, ended by a bare `#`, a blank or an active line).
fn example_blocks(template: &str) -> Vec<String> {
    let lines: Vec<&str> = template.lines().collect();
    let is_example = |l: &str| {
        let Some(rest) = l.strip_prefix("# ") else {
            return false;
        };
        let rest = rest.trim_start();
        (rest.starts_with('[') && rest.trim_end().ends_with(']'))
            || rest
                .split_once(" = ")
                .is_some_and(|(k, _)| !k.is_empty() && !k.contains(' ') && !k.contains(':'))
    };
    let mut blocks: Vec<Vec<usize>> = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if l.starts_with('#') && l.trim() != "#" {
            if is_example(l) {
                cur.push(i);
            }
        } else if !cur.is_empty() {
            blocks.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        blocks.push(cur);
    }
    blocks
        .into_iter()
        .map(|b| {
            lines
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    if b.contains(&i) {
                        l.trim_start_matches("# ").to_string()
                    } else {
                        (*l).to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect()
}

#[test]
fn onboard_force_keeps_a_backup_and_every_template_example_loads_when_uncommented() {
    let dir = tempfile::tempdir().unwrap();
    let out = weft(dir.path()).arg("onboard").output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let cfg = dir.path().join(".clawft/config.toml");
    let template = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, "# mine\n").unwrap();
    let out = weft(dir.path())
        .args(["onboard", "--force"])
        .output()
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let bak = dir.path().join(".clawft/config.toml.bak");
    assert_eq!(std::fs::read_to_string(&bak).unwrap(), "# mine\n");
    assert!(
        t.contains(&format!("kept the previous config as {}", bak.display())),
        "{t}"
    );
    assert_eq!(std::fs::read_to_string(&cfg).unwrap(), template);

    let blocks = example_blocks(&template);
    assert!(blocks.len() > 20, "{} example blocks", blocks.len());
    for (i, b) in blocks.iter().enumerate() {
        let p = dir.path().join(format!("example-{i}.toml"));
        std::fs::write(&p, b).unwrap();
        // Variables the examples name (`*_env`) are set, as a user following them would.
        let out = weft(dir.path())
            .env("TELEGRAM_BOT_TOKEN", "123:abc")
            .env("TELEGRAM_WORK_BOT_TOKEN", "456:def")
            .env("DISCORD_BOT_TOKEN", "discord-token")
            .env("SLACK_BOT_TOKEN", "xoxb-1")
            .env("SLACK_APP_TOKEN", "xapp-1")
            .env("CLAWFT_HTTP_TOKEN", "http-token-1234567890")
            .env("REMOTE_MCP_AUTH", "Bearer x")
            .env("BRAVE_API_KEY", "brave")
            .env("OPENAI_API_KEY", "sk-1")
            .env("ANTHROPIC_API_KEY", "sk-ant-1")
            .arg("--config")
            .arg(&p)
            .args(["skills", "list", "--json"])
            .output()
            .unwrap();
        let changed: Vec<&str> = b
            .lines()
            .zip(template.lines())
            .filter(|(a, t)| a != t)
            .map(|(a, _)| a)
            .collect();
        assert!(
            out.status.success(),
            "example block {i} does not load:\n{}\n---\n{}",
            changed.join("\n"),
            text(&out)
        );
    }
}

#[tokio::test]
async fn status_sessions_mcp_skills_and_usage_print_text_and_json_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let cfg = write_config(
        dir.path(),
        &config_value(&llm.base_url(), dir.path(), json!({})),
    );
    let w = |args: &[&str]| {
        let mut c = weft(dir.path());
        c.arg("--config").arg(&cfg).args(args);
        c
    };
    llm.push(Reply::Text("the answer is 42".into()));
    let out = run(w(&["agent", "-m", "hello there"])).await;
    assert!(out.status.success(), "{}", text(&out));

    let out = run(w(&["status"])).await;
    let t = stdout(&out);
    assert!(out.status.success(), "{}", text(&out));
    assert!(serde_json::from_str::<Value>(&t).is_err(), "{t}");
    assert!(t.contains("no gateway running"), "{t}");
    assert!(t.contains("openai fake-model at http://127.0.0.1"), "{t}");
    assert!(t.contains("config file (providers.*)"), "{t}");
    assert!(t.contains("1 stored"), "{t}");
    let v: Value = serde_json::from_slice(&run(w(&["status", "--json"])).await.stdout).unwrap();
    assert_eq!(v["mode"], "direct");
    assert_eq!(v["sessions"]["stored"], 1);

    let v: Value =
        serde_json::from_slice(&run(w(&["sessions", "list", "--json"])).await.stdout).unwrap();
    let key = v["sessions"][0]["key"].as_str().unwrap().to_string();
    let out = run(w(&["sessions", "list"])).await;
    let t = stdout(&out);
    assert!(t.starts_with("SESSION"), "{t}");
    assert!(t.contains(&key) && t.contains("UPDATED (UTC)"), "{t}");
    let out = run(w(&["sessions", "show", &key])).await;
    let t = stdout(&out);
    assert!(t.contains(&format!("session {key}: 2 messages")), "{t}");
    assert!(t.contains("[user] hello there"), "{t}");
    assert!(t.contains("[assistant] the answer is 42"), "{t}");
    let v: Value =
        serde_json::from_slice(&run(w(&["sessions", "show", &key, "--json"])).await.stdout)
            .unwrap();
    assert_eq!(v["messages"][1]["content"], "the answer is 42");

    // No MCP servers, no skills: where they go, not a bare `[]`.
    let out = run(w(&["mcp", "list"])).await;
    let t = stdout(&out);
    assert!(out.status.success(), "{}", text(&out));
    assert!(t.contains("no MCP servers configured"), "{t}");
    assert!(t.contains("[tools.mcp_servers.files]"), "{t}");
    assert!(t.contains(&cfg.display().to_string()), "{t}");
    let out = run(w(&["mcp", "list", "--json"])).await;
    assert_eq!(stdout(&out).trim(), "[]");
    assert!(String::from_utf8_lossy(&out.stderr).contains("tools.mcp_servers"));
    let out = run(w(&["skills", "list"])).await;
    let t = stdout(&out);
    assert!(t.contains("no skills found"), "{t}");
    assert!(
        t.contains(&dir.path().join("ws/skills").display().to_string()),
        "{t}"
    );
    assert!(t.contains("SKILL.md") && t.contains("description:"), "{t}");
    let out = run(w(&["skills", "list", "--json"])).await;
    assert_eq!(stdout(&out).trim(), "[]");

    // A skill: listed as a table row.
    let skill = dir.path().join("ws/skills/weather");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: weather\ndescription: Look up the weather\nallowed_tools: [\"web_fetch\"]\n---\nUse web_fetch.\n",
    )
    .unwrap();
    let out = run(w(&["skills", "list"])).await;
    let t = stdout(&out);
    assert!(t.starts_with("SKILL"), "{}", text(&out));
    let row = t
        .lines()
        .find(|l| l.starts_with("weather "))
        .unwrap_or_else(|| panic!("{t}"));
    assert!(
        row.contains("Look up the weather") && row.contains("web_fetch"),
        "{row}"
    );

    let out = run(w(&["usage"])).await;
    assert!(stdout(&out).contains("COST (USD)"), "{}", text(&out));
    let v: Value = serde_json::from_slice(&run(w(&["usage", "--json"])).await.stdout).unwrap();
    assert_eq!(v["total"]["calls"], 1);

    let out = run(w(&["sessions", "clear", &key])).await;
    assert_eq!(
        stdout(&out),
        "cleared: the transcript is deleted\n",
        "{}",
        text(&out)
    );
    let out = run(w(&["sessions", "list"])).await;
    assert!(
        stdout(&out).starts_with("no stored sessions yet"),
        "{}",
        text(&out)
    );

    // No Rust debug text: where the provider came from, the tool profile.
    // (no config file at the default path: the key comes from the environment)
    let out = run({
        let mut c = weft(dir.path());
        c.env("OPENAI_API_KEY", "sk-env-1")
            .env("OPENAI_BASE_URL", llm.base_url())
            .arg("status");
        c
    })
    .await;
    let t = text(&out);
    assert!(t.contains("environment (OPENAI_API_KEY)"), "{t}");
    assert!(!t.contains("Environment(["), "{t}");
    let out = run(w(&["tools", "list"])).await;
    let t = stdout(&out);
    assert!(t.contains("profile: full;"), "{t}");
    assert!(!t.contains("profile: Full"), "{t}");
}

#[tokio::test]
async fn agent_refuses_an_empty_message_and_answers_help_and_start_itself() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let cfg = write_config(
        dir.path(),
        &config_value(&llm.base_url(), dir.path(), json!({})),
    );
    for m in ["", "   ", "\n\t"] {
        let out = run({
            let mut c = weft(dir.path());
            c.arg("--config").arg(&cfg).args(["agent", "-m", m]);
            c
        })
        .await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{m:?}: {err}");
        assert!(err.contains("the message is empty"), "{err}");
    }
    for m in ["/help", "/start"] {
        let out = run({
            let mut c = weft(dir.path());
            c.arg("--config").arg(&cfg).args(["agent", "-m", m]);
            c
        })
        .await;
        let t = stdout(&out);
        assert!(out.status.success(), "{}", text(&out));
        assert!(t.starts_with("Chat commands:"), "{m}: {t}");
        for c in [
            "/new", "/stop", "/status", "/compact", "/approve", "/deny", "/help",
        ] {
            assert!(t.contains(c), "{m}: {c} missing: {t}");
        }
    }
    assert_eq!(llm.requests().len(), 0, "the model was asked");
}

#[tokio::test]
async fn unknown_tool_error_quotes_the_name_and_the_api_answers_404_with_json() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = gateway_config(dir.path(), &llm, port, json!({}));
    let out = run({
        let mut c = weft(dir.path());
        c.arg("--config")
            .arg(&cfg)
            .args(["tools", "call", "no_such_tool"]);
        c
    })
    .await;
    let t = stdout(&out);
    assert!(!out.status.success());
    assert!(
        t.contains("unknown tool `no_such_tool`; available tools: "),
        "{t}"
    );

    let d = Daemon::start(dir.path(), &cfg, port).await;
    for path in ["/nope", "/v1/nope", "/v1/sessions/x/y"] {
        let (status, body) = d.api.get(path).await;
        assert_eq!(status, 404, "{path}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("no route GET") && e.contains("POST /v1/chat")),
            "{path}: {body}"
        );
    }
    let (status, body) = d.api.get("/v1/chat").await;
    assert_eq!(status, 405);
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("GET is not allowed on /v1/chat")),
        "{body}"
    );
    assert_eq!(d.term().code(), Some(0));
}

#[tokio::test]
async fn tools_list_includes_mcp_tools_with_their_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = everything_js();
    let cfg = write_config(
        dir.path(),
        &config_value(
            "http://127.0.0.1:9/v1",
            dir.path(),
            json!({"tools": {"mcp_servers": {
                "everything": {"command": "node", "args": [server.as_str(), "stdio"], "internal_only": false},
                "ghost": {"command": "/nonexistent/mcp-server"},
            }}}),
        ),
    );
    let w = |args: &[&str]| {
        let mut c = weft(dir.path());
        c.arg("--config").arg(&cfg).args(args);
        c
    };
    let out = run(w(&["tools", "list"])).await;
    let t = stdout(&out);
    assert!(out.status.success(), "{}", text(&out));
    let echo = t
        .lines()
        .find(|l| l.starts_with("everything__echo "))
        .unwrap_or_else(|| panic!("{}", text(&out)));
    assert!(echo.contains("mcp:everything"), "{echo}");
    assert!(t.contains("read_file "), "{t}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("MCP server `ghost` is failed"),
        "{}",
        text(&out)
    );
    let v: Value =
        serde_json::from_slice(&run(w(&["tools", "list", "--json"])).await.stdout).unwrap();
    let row = v
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "everything__echo")
        .unwrap();
    assert_eq!(row["server"], "everything");
    assert_eq!(row["group"], "mcp");

    // `mcp list` as a table: state, tools, and why the failed one failed.
    let out = run(w(&["mcp", "list"])).await;
    let t = stdout(&out);
    assert!(t.starts_with("SERVER"), "{}", text(&out));
    let line = |name: &str| {
        t.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{t}"))
            .to_string()
    };
    assert!(line("everything").contains("connected"), "{t}");
    assert!(line("ghost").contains("failed"), "{t}");
    assert!(line("ghost").contains("/nonexistent/mcp-server"), "{t}");
}

/// A connected MCP server whose tools the model never sees (`internal_only`, the default, and
/// no skill names them) is the first-hour surprise: `doctor` warns and says what to change,
/// `tools list` marks its tools as offered through a skill only; a skill that names them ends
/// the warning.
#[tokio::test]
async fn doctor_warns_when_a_connected_mcp_server_is_hidden_from_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let server = everything_js();
    let cfg = write_config(
        dir.path(),
        &config_value(
            "http://127.0.0.1:9/v1",
            dir.path(),
            json!({"tools": {"mcp_servers": {
                "everything": {"command": "node", "args": [server.as_str(), "stdio"]},
            }}}),
        ),
    );
    let w = |args: &[&str]| {
        let mut c = weft(dir.path());
        c.arg("--config").arg(&cfg).args(args);
        c
    };
    let mcp_line = |out: &std::process::Output| {
        stdout(out)
            .lines()
            .find(|l| l.contains("mcp everything"))
            .unwrap_or_else(|| panic!("{}", text(out)))
            .to_string()
    };
    let out = run(w(&["doctor"])).await;
    let line = mcp_line(&out);
    assert!(line.starts_with("warn"), "{line}");
    assert!(line.contains("hidden from the model"), "{line}");
    assert!(
        line.contains("tools.mcp_servers.everything.internal_only = false"),
        "{line}"
    );

    let out = run(w(&["tools", "list"])).await;
    let echo = stdout(&out)
        .lines()
        .find(|l| l.starts_with("everything__echo "))
        .unwrap_or_else(|| panic!("{}", text(&out)))
        .to_string();
    assert!(echo.contains(" skill "), "{echo}");

    let skill = dir.path().join("ws/skills/echoer");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: echoer\ndescription: Echo things\nallowed_tools: [\"everything__*\"]\n---\nUse everything__echo.\n",
    )
    .unwrap();
    let out = run(w(&["doctor"])).await;
    let line = mcp_line(&out);
    assert!(line.starts_with("ok"), "{line}");
}

/// The README's "Quick start with a real provider", command by command, from a fresh HOME
/// (CLAWFT_HOME unset), with the fake LLM standing in for OpenAI through OPENAI_BASE_URL. The
/// one change: the gateway's port (CLAWFT_CHANNELS__HTTP__BIND), so tests running in parallel
/// do not fight over 18790.
#[tokio::test]
async fn readme_quick_start_works_from_a_fresh_home() {
    let home = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let quick = readme
        .split("## Quick start with a real provider")
        .nth(1)
        .unwrap();
    for step in [
        "export OPENAI_API_KEY=",
        "weft onboard ",
        "weft agent -m \"What files are in my workspace?\"",
        "weft agent  ",
        "weft gateway &",
        "~/.clawft/store/control.json",
        "localhost:18790/v1/chat",
        "weft status ",
    ] {
        assert!(quick.contains(step), "the README no longer says {step}");
    }
    let user = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_weft"));
        c.env_clear()
            .env("HOME", home.path())
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("OPENAI_API_KEY", "sk-readme-123")
            .env("OPENAI_BASE_URL", llm.base_url())
            .env("CLAWFT_CHANNELS__HTTP__BIND", format!("127.0.0.1:{port}"))
            .stdin(std::process::Stdio::null())
            .args(args);
        c
    };

    // ./target/release/weft onboard: writes ~/.clawft/config.toml and the workspace
    let out = run(user(&["onboard"])).await;
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let cfg = home.path().join(".clawft/config.toml");
    assert!(t.contains(&format!("wrote {}", cfg.display())), "{t}");
    assert!(home.path().join(".clawft/workspace").is_dir());

    // weft doctor: no failure (the provider answers)
    let out = run(user(&["doctor"])).await;
    let t = text(&out);
    assert!(out.status.success(), "{t}");

    // weft agent -m "What files are in my workspace?"
    llm.push(Reply::Text("Your workspace has a memory directory.".into()));
    let out = run(user(&["agent", "-m", "What files are in my workspace?"])).await;
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        stdout(&out).trim(),
        "Your workspace has a memory directory."
    );

    // weft agent: interactive; Ctrl-D (end of input) exits
    llm.push(Reply::Text("hi!".into()));
    let out = tokio::task::spawn_blocking({
        let mut c = user(&["agent"]);
        move || {
            use std::io::Write;
            let mut child = c
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
            child.wait_with_output().unwrap()
        }
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(stdout(&out).contains("hi!"), "{}", text(&out));

    // weft gateway &; TOKEN=$(sed … ~/.clawft/store/control.json); curl /v1/chat
    let log = std::fs::File::create(home.path().join("gateway.log")).unwrap();
    let gateway = Gateway(
        user(&["gateway"])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let control = home.path().join(".clawft/store/control.json");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let token = loop {
        // The README's sed: the value of "token" in control.json.
        let text = std::fs::read_to_string(&control).unwrap_or_default();
        if let Some(t) = text
            .split("\"token\": \"")
            .nth(1)
            .and_then(|r| r.split('"').next())
        {
            break t.to_string();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no control.json in the README's place: {text}\n{}",
            std::fs::read_to_string(home.path().join("gateway.log")).unwrap_or_default()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    llm.push(Reply::Text("hello from the gateway".into()));
    let r = reqwest::Client::new()
        .post(format!("http://localhost:{port}/v1/chat"))
        .header("Authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(r#"{"chat_id":"me","content":"hello"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["reply"], "hello from the gateway");

    // weft status: goes through the running gateway
    let out = run(user(&["status"])).await;
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("using the running gateway"), "{t}");
    assert!(t.contains("gateway running"), "{t}");
    assert!(t.contains("http running"), "{t}");
    assert!(t.contains("1 stored") || t.contains("2 stored"), "{t}");
    assert_eq!(gateway.term(), Some(0));
}

/// A gateway process, killed if the test fails before stopping it.
struct Gateway(std::process::Child);

impl Gateway {
    fn term(mut self) -> Option<i32> {
        let pid = rustix::process::Pid::from_child(&self.0);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        self.0.wait().unwrap().code()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
