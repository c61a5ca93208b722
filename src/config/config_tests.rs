#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn env(pairs: &[(&str, &str)]) -> Env {
    let mut v: Vec<(String, String)> = vec![("HOME".into(), "/home/u".into())];
    v.extend(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Env::from_pairs(v)
}

#[test]
fn defaults_without_file_use_local_provider() {
    let dir = tempfile::tempdir().unwrap();
    let e = env(&[("CLAWFT_HOME", dir.path().to_str().unwrap())]);
    let c = Config::load(None, &e).unwrap();
    assert_eq!(c.agent.max_tool_iterations, 20);
    assert_eq!(c.provider_source, ProviderSource::LocalDefault);
    assert_eq!(c.providers[0].base_url, LOCAL_DEFAULT_BASE_URL);
    assert_eq!(c.agent.workspace, dir.path().join("workspace"));
    assert_eq!(c.http.bind.to_string(), DEFAULT_HTTP_BIND);
}

#[test]
fn env_keys_pick_providers_in_order_and_honour_base_url() {
    let e = env(&[
        ("ANTHROPIC_API_KEY", "sk-ant"),
        ("OPENAI_API_KEY", "sk-oa"),
        ("OPENAI_BASE_URL", "http://127.0.0.1:9/v1/"),
    ]);
    let c = Config::from_str("{}", false, &e).unwrap();
    let names: Vec<_> = c.providers.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["openai", "anthropic"]);
    assert_eq!(c.providers[0].base_url, "http://127.0.0.1:9/v1");
    assert_eq!(c.providers[1].kind, ProviderKind::Anthropic);
    assert!(c.secrets.iter().any(|s| s.expose() == "sk-oa"));
}

#[test]
fn unknown_key_is_reported_with_its_path() {
    let err = Config::from_str(r#"{"agents":{"defaults":{"modle":"x"}}}"#, false, &env(&[]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("modle"), "{err}");
    assert!(
        err.contains("agents.defaults") || err.contains("model"),
        "{err}"
    );
}

#[test]
fn wrong_type_is_reported_with_key() {
    let err = Config::from_str(
        "[agents.defaults]\nmax_tool_iterations = \"many\"\n",
        true,
        &env(&[]),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("max_tool_iterations"), "{err}");
}

#[test]
fn iterations_clamped_to_at_least_one() {
    let c = Config::from_str(
        "[agents.defaults]\nmax_tool_iterations = 0\n",
        true,
        &env(&[]),
    )
    .unwrap();
    assert_eq!(c.agent.max_tool_iterations, 1);
}

#[test]
fn loop_limits_have_defaults_and_are_validated() {
    let c = Config::from_str("{}", false, &env(&[])).unwrap();
    assert_eq!(c.agent.loop_repeat_limit, DEFAULT_LOOP_REPEAT_LIMIT);
    assert_eq!(
        c.agent.max_tool_calls_per_turn,
        DEFAULT_MAX_TOOL_CALLS_PER_TURN
    );
    let c = Config::from_str(
        "[agents.defaults]\nloop_repeat_limit = 5\nmax_tool_calls_per_turn = 40\n",
        true,
        &env(&[]),
    )
    .unwrap();
    assert_eq!(
        (c.agent.loop_repeat_limit, c.agent.max_tool_calls_per_turn),
        (5, 40)
    );
    for (text, key) in [
        ("loop_repeat_limit = 1", "agents.defaults.loop_repeat_limit"),
        (
            "loop_repeat_limit = -3",
            "agents.defaults.loop_repeat_limit",
        ),
        (
            "max_tool_calls_per_turn = 0",
            "agents.defaults.max_tool_calls_per_turn",
        ),
    ] {
        let err = Config::from_str(&format!("[agents.defaults]\n{text}\n"), true, &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{err}");
    }
}

#[test]
fn env_override_beats_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("config.toml");
    std::fs::write(&p, "[agents.defaults]\nmax_tool_iterations = 5\n").unwrap();
    let e = env(&[("CLAWFT_AGENTS__DEFAULTS__MAX_TOOL_ITERATIONS", "7")]);
    let c = Config::load(Some(&p), &e).unwrap();
    assert_eq!(c.agent.max_tool_iterations, 7);
}

#[test]
fn secret_indirection_by_env_and_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tok"), "s3cret\n").unwrap();
    let e = env(&[
        ("MY_KEY", "k-123"),
        ("CREDENTIALS_DIRECTORY", dir.path().to_str().unwrap()),
    ]);
    let c = Config::from_str(
        r#"{"providers":{"openai":{"api_key_env":"MY_KEY"}},"channels":{"http":{"token_file":"tok"}}}"#,
        false,
        &e,
    )
    .unwrap();
    assert_eq!(c.providers[0].api_key.as_ref().unwrap().expose(), "k-123");
    assert_eq!(c.http.token.as_ref().unwrap().expose(), "s3cret");
    assert_eq!(format!("{:?}", c.http.token), "Some(Secret(***))");

    let err = Config::from_str(
        r#"{"providers":{"openai":{"api_key_env":"NOPE"}}}"#,
        false,
        &e,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("providers.openai.api_key_env") && err.contains("NOPE"),
        "{err}"
    );
}

#[test]
fn non_loopback_bind_needs_token() {
    let err = Config::from_str(
        r#"{"channels":{"http":{"bind":"0.0.0.0:80"}}}"#,
        false,
        &env(&[]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("channels.http.bind") && err.contains("token"),
        "{err}"
    );
    Config::from_str(
        r#"{"channels":{"http":{"bind":"0.0.0.0:80","token":"t"}}}"#,
        false,
        &env(&[]),
    )
    .unwrap();
}

#[test]
fn tokenless_chat_is_an_opt_in_refused_on_a_non_loopback_bind() {
    let c = Config::from_str("{}", false, &env(&[])).unwrap();
    assert!(!c.http.allow_loopback_without_token);
    let c = Config::from_str(
        r#"{"channels":{"http":{"allow_loopback_without_token":true}}}"#,
        false,
        &env(&[]),
    )
    .unwrap();
    assert!(c.http.allow_loopback_without_token);
    let err = Config::from_str(
        r#"{"channels":{"http":{"bind":"0.0.0.0:80","token":"t","allow_loopback_without_token":true}}}"#,
        false,
        &env(&[]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("channels.http.allow_loopback_without_token") && err.contains("127.0.0.1"),
        "{err}"
    );
}

#[test]
fn a_tls_listener_needs_all_three_settings_and_a_token_off_loopback() {
    let parse = |http: &str| {
        Config::from_str(
            &format!(r#"{{"channels":{{"http":{http}}}}}"#),
            false,
            &env(&[]),
        )
    };
    let c =
        parse(r#"{"tls_bind":"127.0.0.1:18443","tls_cert":"/c.pem","tls_key":"/k.pem"}"#).unwrap();
    let (bind, cert, key) = c.http.tls.unwrap();
    assert_eq!(bind.to_string(), "127.0.0.1:18443");
    assert_eq!(cert, std::path::PathBuf::from("/c.pem"));
    assert_eq!(key, std::path::PathBuf::from("/k.pem"));
    assert!(parse("{}").unwrap().http.tls.is_none());
    for (http, needle) in [
        (r#"{"tls_bind":"127.0.0.1:18443"}"#, "go together"),
        (r#"{"tls_cert":"/c.pem","tls_key":"/k.pem"}"#, "go together"),
        (
            r#"{"tls_bind":"nope","tls_cert":"/c.pem","tls_key":"/k.pem"}"#,
            "0.0.0.0:18443",
        ),
        (
            r#"{"bind":"127.0.0.1:18443","tls_bind":"127.0.0.1:18443","tls_cert":"/c","tls_key":"/k"}"#,
            "its own port",
        ),
        (
            r#"{"tls_bind":"0.0.0.0:18443","tls_cert":"/c.pem","tls_key":"/k.pem"}"#,
            "channels.http.token",
        ),
        (
            r#"{"tls_bind":"0.0.0.0:18443","tls_cert":"/c","tls_key":"/k","token":"t","allow_loopback_without_token":true}"#,
            "allow_loopback_without_token",
        ),
    ] {
        let err = parse(http).unwrap_err().to_string();
        assert!(err.contains(needle), "{http}: {err}");
    }
    parse(r#"{"tls_bind":"0.0.0.0:18443","tls_cert":"/c","tls_key":"/k","token":"t"}"#).unwrap();
}

#[test]
fn unknown_fallback_provider_is_named() {
    let err = Config::from_str(
        r#"{"providers":{"openai":{}},"agents":{"defaults":{"fallback":["nope"]}}}"#,
        false,
        &env(&[]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("agents.defaults.fallback") && err.contains("nope"),
        "{err}"
    );
}

#[test]
fn missing_explicit_file_is_clear() {
    let err = Config::load(Some(Path::new("/nonexistent/c.json")), &env(&[]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("/nonexistent/c.json") && err.contains("weft onboard"),
        "{err}"
    );
}

#[test]
fn shipped_example_config_parses_to_the_defaults() {
    let text = include_str!("../../config/clawft.example.toml");
    let c = Config::from_str(text, true, &env(&[])).unwrap();
    assert_eq!(c.agent.max_tool_iterations, DEFAULT_MAX_TOOL_ITERATIONS);
    assert_eq!(
        c.agent.workspace,
        PathBuf::from("/home/u/.clawft/workspace")
    );
    assert_eq!(c.http.bind.to_string(), DEFAULT_HTTP_BIND);
    assert_eq!(c.store.cache_bytes, 8 * 1024 * 1024);
    let d = Config::from_str("", true, &env(&[])).unwrap();
    assert_eq!(c.tools.rate_limit, d.tools.rate_limit);
    assert_eq!(c.tools.policy.profile(), d.tools.policy.profile());
    assert_eq!(c.tools.policy.global.deny, d.tools.policy.global.deny);
    assert_eq!(c.tools.web_fetch.max_bytes, d.tools.web_fetch.max_bytes);
    assert_eq!(c.tools.web_fetch.timeout, d.tools.web_fetch.timeout);
    assert_eq!(
        c.tools.web_fetch.max_redirects,
        d.tools.web_fetch.max_redirects
    );
    assert_eq!(c.tools.web_search.timeout, d.tools.web_search.timeout);
}

#[test]
fn bad_tool_settings_name_the_key() {
    for (text, key) in [
        (
            "[tools.policy]\ndeny = [\"group:nope\"]",
            "tools.policy.deny",
        ),
        (
            "[agents.defaults.tools]\nallow = [\"group:bogus\"]",
            "agents.defaults.tools.allow",
        ),
        ("[tools.policy]\nprofile = \"everything\"", "profile"),
        (
            "[tools.web_fetch]\nallow_private = [\"10.0.0.0/99\"]",
            "tools.web_fetch.allow_private[0]",
        ),
        (
            "[tools.web_search]\nprovider = \"brave\"",
            "tools.web_search.api_key",
        ),
        (
            "[tools.message]\nallow = [\"nochannel\"]",
            "tools.message.allow",
        ),
    ] {
        let err = Config::from_str(text, true, &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{text}: {err}");
    }
    let c = Config::from_str("[tools.rate_limit]\nper_minute = 0", true, &env(&[])).unwrap();
    assert!(c.tools.rate_limit.is_none());
}

#[test]
fn notify_socket_and_watchdog_come_from_the_environment() {
    let c = Config::from_str("{}", false, &env(&[])).unwrap();
    assert_eq!(c.notify_socket, None);
    assert_eq!(c.watchdog, None);
    let pid = std::process::id().to_string();
    let e = env(&[
        ("NOTIFY_SOCKET", "@clawft-test"),
        ("WATCHDOG_USEC", "400000"),
        ("WATCHDOG_PID", pid.as_str()),
    ]);
    let c = Config::from_str("{}", false, &e).unwrap();
    assert_eq!(c.notify_socket, Some(PathBuf::from("@clawft-test")));
    assert_eq!(c.watchdog, Some(Duration::from_millis(200)));
    // Meant for another process (e.g. inherited by a child): no pings.
    let e = env(&[("WATCHDOG_USEC", "400000"), ("WATCHDOG_PID", "1")]);
    assert_eq!(watchdog_interval(&e, 4242), None);
    for bad in ["0", "soon", "-5"] {
        assert_eq!(
            watchdog_interval(&env(&[("WATCHDOG_USEC", bad)]), 1),
            None,
            "{bad}"
        );
    }
}

#[test]
fn allow_from_entries_that_cannot_match_a_sender_are_refused_with_how_to_find_the_id() {
    let section = |platform: &str, allow: &str| {
        let extra = if platform == "slack" {
            "app_token = \"xapp-1\"\n"
        } else {
            ""
        };
        format!("[channels.{platform}]\ntoken = \"t-123456\"\n{extra}allow_from = {allow}\n")
    };
    for (platform, allow, needles) in [
        (
            "telegram",
            r#"["@alice"]"#,
            &["`@alice`", "@userinfobot", "weft pairing"][..],
        ),
        ("telegram", "[-1001234]", &["group or channel id"][..]),
        ("telegram", r#"["alice"]"#, &["positive numbers"][..]),
        (
            "discord",
            r#"["@alice"]"#,
            &["Copy User ID", "weft pairing"][..],
        ),
        ("discord", r#"["alice#1234"]"#, &["snowflakes"][..]),
        ("slack", r#"["@alice"]"#, &["U0123ABCD", "weft pairing"][..]),
        ("slack", r#"["alice@example.com"]"#, &["member ids"][..]),
        ("slack", "[12345]", &["member ids"][..]),
    ] {
        let text = section(platform, allow);
        let err = Config::from_str(&text, true, &env(&[]))
            .unwrap_err()
            .to_string();
        let key = format!("channels.{platform}.allow_from");
        assert!(err.contains(&key), "{text}: {err}");
        for n in needles {
            assert!(err.contains(n), "{text}: `{n}` not in: {err}");
        }
    }
    for (platform, allow, want) in [
        (
            "telegram",
            r#"[123456789, "987654321"]"#,
            &["123456789", "987654321"][..],
        ),
        (
            "discord",
            r#"["123456789012345678", 42]"#,
            &["123456789012345678", "42"][..],
        ),
        (
            "slack",
            r#"["U0123ABCD", "W0AB12"]"#,
            &["U0123ABCD", "W0AB12"][..],
        ),
    ] {
        let c = Config::from_str(&section(platform, allow), true, &env(&[])).unwrap();
        let got: Vec<&str> = c.chat_channels[0]
            .allow_from
            .iter()
            .map(String::as_str)
            .collect();
        let mut want = want.to_vec();
        want.sort_unstable();
        assert_eq!(got, want, "{platform}");
    }
}

#[test]
fn discord_api_base_url_and_gateway_url_with_proxy_as_a_deprecated_alias() {
    let section = |extra: &str| {
        format!("[channels.discord]\ntoken = \"t-123456\"\nallow_from = [\"42\"]\n{extra}")
    };
    let c = Config::from_str(
        &section("api_base_url = \"http://127.0.0.1:9/\"\ngateway_url = \"ws://127.0.0.1:10\"\n"),
        true,
        &env(&[]),
    )
    .unwrap();
    let discord = |c: &Config| {
        let ChannelSettings::Discord(d) = &c.chat_channels[0].settings else {
            panic!("{:?}", c.chat_channels)
        };
        d.clone()
    };
    assert_eq!(
        discord(&c).api_base_url.as_deref(),
        Some("http://127.0.0.1:9/")
    );
    assert_eq!(
        discord(&c).gateway_url.as_deref(),
        Some("ws://127.0.0.1:10")
    );
    // The old name still works (with a warning at load).
    let c = Config::from_str(
        &section("proxy = \"http://127.0.0.1:9/\"\n"),
        true,
        &env(&[]),
    )
    .unwrap();
    assert_eq!(
        discord(&c).api_base_url.as_deref(),
        Some("http://127.0.0.1:9/")
    );
    for (extra, key, needle) in [
        (
            "proxy = \"http://a\"\napi_base_url = \"http://b\"\n",
            "channels.discord.proxy",
            "old name of `api_base_url`",
        ),
        (
            "gateway_url = \"https://gateway.discord.gg\"\n",
            "channels.discord.gateway_url",
            "ws:// or wss://",
        ),
        (
            "api_base_url = \"ftp://x\"\n",
            "channels.discord.api_base_url",
            "http:// or https://",
        ),
        (
            "api_url = \"http://x\"\n",
            "channels.discord.api_url",
            "api_base_url",
        ),
    ] {
        let err = Config::from_str(&section(extra), true, &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains(key) && err.contains(needle), "{extra}: {err}");
    }
    let err = Config::from_str(
        "[channels.telegram]\ntoken = \"1:x\"\nallow_from = [1]\ngateway_url = \"ws://x\"\n",
        true,
        &env(&[]),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("channels.telegram.gateway_url"), "{err}");
}

#[test]
fn sessions_max_in_memory_defaults_to_256_and_is_at_least_one() {
    let c = Config::from_str("", true, &env(&[])).unwrap();
    assert_eq!(c.sessions.max_in_memory, 256);
    let c = Config::from_str("[sessions]\nmax_in_memory = 0\n", true, &env(&[])).unwrap();
    assert_eq!(c.sessions.max_in_memory, 1);
}

#[test]
fn max_chats_in_flight_defaults_to_8_and_zero_is_refused_with_the_key() {
    let text = |extra: &str| {
        format!("[channels.telegram]\ntoken = \"t-123456\"\nallow_from = [1]\n{extra}")
    };
    let c = Config::from_str(&text(""), true, &env(&[])).unwrap();
    assert_eq!(c.chat_channels[0].max_chats_in_flight, 8);
    let c = Config::from_str(&text("max_chats_in_flight = 2\n"), true, &env(&[])).unwrap();
    assert_eq!(c.chat_channels[0].max_chats_in_flight, 2);
    let err = Config::from_str(&text("max_chats_in_flight = 0\n"), true, &env(&[]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("channels.telegram.max_chats_in_flight") && err.contains("at least 1"),
        "{err}"
    );
}

#[test]
fn context_window_comes_from_the_model_table_unless_set_and_bad_values_name_the_key() {
    let toml = |extra: &str| {
        format!("[agents.defaults]\nmodel = \"claude-sonnet-4-5\"\n{extra}\n[providers.anthropic]\napi_key = \"k\"\n")
    };
    let c = Config::from_str(&toml(""), true, &env(&[])).unwrap();
    assert_eq!(c.agent.window.context_window, 200_000);
    assert_eq!(c.agent.window.threshold, DEFAULT_COMPACTION_THRESHOLD);
    assert_eq!(c.agent.window.summary_model, None);
    let c = Config::from_str(
        &toml("context_window = 8192\n[agents.defaults.compaction]\nthreshold = 0.5\nmodel = \"claude-haiku-4-5\""),
        true,
        &env(&[]),
    )
    .unwrap();
    assert_eq!(c.agent.window.context_window, 8192);
    assert_eq!(c.agent.window.threshold, 0.5);
    assert_eq!(
        c.agent.window.summary_model.as_deref(),
        Some("claude-haiku-4-5")
    );
    let err = Config::from_str(&toml("context_window = 100"), true, &env(&[]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("agents.defaults.context_window"), "{err}");
    let err = Config::from_str(
        &toml("[agents.defaults.compaction]\nthreshold = 1.5"),
        true,
        &env(&[]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("agents.defaults.compaction.threshold"),
        "{err}"
    );
}

#[test]
fn mcp_connect_wait_has_a_default_and_a_bound_named_in_the_error() {
    let e = env(&[]);
    let c = Config::from_str("{}", false, &e).unwrap();
    assert_eq!(c.tools.mcp_connect_wait, Duration::from_secs(10));
    let c = Config::from_str(r#"{"tools": {"mcp_connect_wait_secs": 0}}"#, false, &e).unwrap();
    assert_eq!(c.tools.mcp_connect_wait, Duration::ZERO);
    let err = Config::from_str(r#"{"tools": {"mcp_connect_wait_secs": 9999}}"#, false, &e)
        .unwrap_err()
        .to_string();
    assert!(err.contains("tools.mcp_connect_wait_secs"), "{err}");
    assert!(err.contains("at most 300"), "{err}");
}

#[test]
fn an_agent_inherits_the_defaults_takes_its_own_provider_and_mcp_servers() {
    let text = r#"
[agents.defaults]
model = "m-default"
system_prompt = "base"
max_tool_iterations = 7
tools = { deny = ["spawn"] }

[agents.work]
provider = "b"
mcp_servers = ["github"]
tools = { also_allow = ["gateway"] }

[providers.a]
base_url = "http://127.0.0.1:1/v1"
[providers.b]
base_url = "http://127.0.0.1:2/v1"
model = "m-b"

[tools.mcp_servers.github]
command = "gh-mcp"
[tools.mcp_servers.files]
command = "fs-mcp"
"#;
    let c = Config::from_str(text, true, &env(&[])).unwrap();
    assert_eq!(c.agent_names(), ["main", "work"]);
    let w = c.for_agent("work").unwrap();
    assert_eq!(w.agent_name, "work");
    assert_eq!(w.agent.system_prompt.as_deref(), Some("base"));
    assert_eq!(w.agent.max_tool_iterations, 7);
    // The model of agents.defaults applies to every provider, the agent's provider first.
    assert_eq!(w.providers[0].name, "b");
    assert_eq!(w.providers[0].model, "m-default");
    assert_eq!(c.providers[0].name, "a");
    // Its own workspace, not the default's.
    assert_eq!(
        w.agent.workspace,
        PathBuf::from("/home/u/.clawft/workspace-work")
    );
    assert_eq!(
        c.agent.workspace,
        PathBuf::from("/home/u/.clawft/workspace")
    );
    // Its tool layer: the defaults' deny merged with its also_allow; only its MCP server.
    assert!(!w.tools.policy.allows("spawn"));
    assert!(w.tools.policy.allows("gateway"));
    assert!(!c.tools.policy.allows("gateway"));
    assert!(w.tools.policy.allows("github__create_issue"));
    assert!(!w.tools.policy.allows("files__read"));
    assert!(c.tools.policy.allows("files__read"));

    let e = Config::from_str(
        "[agents.work]\nmcp_servers = [\"nope\"]\n[tools.mcp_servers.github]\ncommand = \"x\"\n",
        true,
        &env(&[]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("agents.work.mcp_servers") && e.contains("no MCP server named `nope`"),
        "{e}"
    );
    let e = Config::from_str("[agents.work]\ntemperature = 5.0\n", true, &env(&[]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("agents.work.temperature"), "{e}");
}

#[test]
fn group_custom_names_every_custom_tool_in_every_layer() {
    let text = r#"
[tools.policy]
deny = ["group:custom"]
[agents.ops]
tools = { also_allow = ["group:custom"] }
[tools.custom.dig]
description = "DNS"
command = "dig {{name}}"
parameters = { type = "object", properties = { name = { type = "string" } }, required = ["name"] }
[tools.subagents]
deny = ["group:custom"]
"#;
    let c = Config::from_str(text, true, &env(&[])).unwrap();
    assert!(!c.tools.policy.allows("dig"));
    assert!(c.tools.policy.allows("read_file"));
    // A deny wins over also_allow: the ops agent still cannot, as documented for every group.
    assert!(!c.for_agent("ops").unwrap().tools.policy.allows("dig"));
    assert!(c.tools.subagents.deny.iter().any(|p| p.matches("dig")));
    let c = Config::from_str(
        &text.replace("deny = [\"group:custom\"]\n[agents", "[agents"),
        true,
        &env(&[]),
    )
    .unwrap();
    assert!(c.tools.policy.allows("dig"));
}

#[test]
fn media_and_vision_settings_resolve_and_bad_values_name_the_key() {
    let toml = |agent: &str, media: &str| {
        format!("[agents.defaults]\nmodel = \"llama3.1\"\n{agent}\n[providers.openai]\napi_key = \"k\"\n{media}\n")
    };
    let c = Config::from_str(&toml("", ""), true, &env(&[])).unwrap();
    assert_eq!(c.media.max_file_bytes, 20 * 1024 * 1024);
    assert_eq!(c.media.max_message_bytes, 50 * 1024 * 1024);
    assert!(c.media.transcription.is_none());
    // `auto`: the model table (llama3.1 sees nothing; a /model choice of gpt-4o does).
    assert!(!c.agent.shows_images(None));
    assert!(c.agent.shows_images(Some("gpt-4o-mini")));
    let c = Config::from_str(&toml("vision = \"on\"", ""), true, &env(&[])).unwrap();
    assert!(c.agent.shows_images(None));
    let c = Config::from_str(
        &toml(
            "",
            "[media]\nmax_file_mb = 5\n[media.transcription]\nbase_url = \"http://127.0.0.1:8080/v1/\"\nmodel = \"whisper-1\"\napi_key_env = \"WHISPER_KEY\"",
        ),
        true,
        &env(&[("WHISPER_KEY", "wk-secret-1234")]),
    )
    .unwrap();
    assert_eq!(c.media.max_file_bytes, 5 * 1024 * 1024);
    let t = c.media.transcription.as_ref().unwrap();
    assert_eq!(t.base_url, "http://127.0.0.1:8080/v1");
    assert_eq!(t.api_key.as_ref().unwrap().expose(), "wk-secret-1234");
    assert!(
        c.secrets.iter().any(|s| s.expose() == "wk-secret-1234"),
        "the key is scrubbed"
    );
    for (agent, media, key) in [
        ("vision = \"maybe\"", "", "agents.defaults.vision"),
        ("", "[media]\nmax_file_mb = 0", "media.max_file_mb"),
        ("", "[media]\nmax_file_mb = 60", "media.max_message_mb"),
        (
            "",
            "[media.transcription]\nbase_url = \"ftp://x\"\nmodel = \"w\"",
            "media.transcription.base_url",
        ),
        (
            "",
            "[media.transcription]\nbase_url = \"http://x\"\nmodel = \" \"",
            "media.transcription.model",
        ),
        ("", "[media]\nmax_size = 3", "max_size"),
    ] {
        let err = Config::from_str(&toml(agent, media), true, &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{key}: {err}");
    }
}

#[test]
fn speech_images_and_voice_replies_resolve_and_bad_values_name_the_key() {
    use crate::media::generate::SpeechBackend;
    use crate::types::VoiceReplies;
    let toml = |agent: &str, media: &str| {
        format!("[agents.defaults]\nmodel = \"llama3.1\"\n{agent}\n[providers.openai]\napi_key = \"k\"\n{media}\n")
    };
    // espeak-ng is looked for on PATH at start; a PATH without it: no speech.
    let bin = tempfile::tempdir().unwrap();
    let espeak = bin.path().join("espeak-ng");
    std::fs::write(&espeak, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&espeak, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = bin.path().to_str().unwrap();
    let c = Config::from_str(&toml("", ""), true, &env(&[("PATH", path)])).unwrap();
    assert_eq!(
        c.media.tts,
        SpeechBackend::Espeak {
            path: espeak,
            voice: None
        }
    );
    assert_eq!(c.agent.reply_with_voice, VoiceReplies::WhenAsked);
    assert!(c.media.images.is_none() && c.media.transcoder.is_none());
    let empty = tempfile::tempdir().unwrap();
    let none = env(&[("PATH", empty.path().to_str().unwrap())]);
    let c = Config::from_str(&toml("", ""), true, &none).unwrap();
    assert_eq!(c.media.tts, SpeechBackend::None);
    let c = Config::from_str(
        &toml("", "[media.tts]\noffline = false"),
        true,
        &env(&[("PATH", path)]),
    )
    .unwrap();
    assert_eq!(c.media.tts, SpeechBackend::None);
    // An endpoint, its key a scrubbed secret; images with their limits; a chat answered in
    // voice.
    let c = Config::from_str(
        &toml(
            "reply_with_voice = \"to_voice\"",
            "[media.tts]\nbase_url = \"https://api.openai.com/v1/\"\nmodel = \"tts-1\"\napi_key_env = \"K\"\n[media.images]\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"gpt-image-1\"\nmax_count = 2\n[prices.\"gpt-image-1\"]\nimage = 0.25",
        ),
        true,
        &env(&[("K", "sk-tts-secret-991")]),
    )
    .unwrap();
    let SpeechBackend::Http(t) = &c.media.tts else {
        panic!("{:?}", c.media.tts)
    };
    assert_eq!(
        (t.base_url.as_str(), t.model.as_str(), t.voice.as_str()),
        ("https://api.openai.com/v1", "tts-1", "alloy")
    );
    assert!(c.secrets.iter().any(|s| s.expose() == "sk-tts-secret-991"));
    let i = c.media.images.as_ref().unwrap();
    assert_eq!((i.max_count, i.size.as_str()), (2, "1024x1024"));
    assert_eq!(c.agent.reply_with_voice, VoiceReplies::ToVoice);
    let p = c.usage.price("gpt-image-1").unwrap();
    assert_eq!((p.image, p.input), (0.25, 0.0));
    assert_eq!(c.usage.price("tts-1").map(|p| p.characters), Some(15.0));
    for (agent, media, key) in [
        (
            "reply_with_voice = \"always\"",
            "",
            "agents.defaults.reply_with_voice",
        ),
        ("", "[media.tts]\nmodel = \"tts-1\"", "media.tts.base_url"),
        (
            "",
            "[media.tts]\nbase_url = \"http://x\"",
            "media.tts.model",
        ),
        ("", "[media.tts]\nmax_chars = 0", "media.tts.max_chars"),
        (
            "",
            "[media.images]\nbase_url = \"x\"\nmodel = \"m\"",
            "media.images.base_url",
        ),
        (
            "",
            "[media.images]\nbase_url = \"http://x\"\nmodel = \"m\"\nmax_count = 11",
            "media.images.max_count",
        ),
        (
            "",
            "[media.images]\nbase_url = \"http://x\"\nmodel = \"m\"\nsize = \"huge\"",
            "media.images.size",
        ),
        ("", "[prices.\"x\"]\nimage = -1.0", "prices.\"x\".image"),
        ("", "[media.tts]\nspeed = 2", "speed"),
    ] {
        let err = Config::from_str(&toml(agent, media), true, &none)
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{key}: {err}");
    }
}

#[test]
fn cluster_section_defaults_and_validation() {
    let e = env(&[("NATS_PW", "s3cret-nats-pw")]);
    // Absent: single-node mode.
    assert!(Config::from_str("{}", false, &e).unwrap().cluster.is_none());
    let c = Config::from_str("[cluster]\nnats_url = \"nats://10.0.0.1:4222\"\n", true, &e).unwrap();
    let s = c.cluster.unwrap();
    assert_eq!(s.nats_urls, ["nats://10.0.0.1:4222"]);
    assert_eq!(s.partitions, 64);
    assert_eq!(s.lease_ttl, Duration::from_secs(6));
    assert!(!s.node_id.is_empty());
    let c = Config::from_str(
        "[cluster]\nnats_url = [\"nats://a:4222\", \"tls://b:4222\"]\nnode_id = \"n-1\"\npartitions = 8\nuser = \"weft\"\npassword_env = \"NATS_PW\"\nlease_ttl_secs = 10\n",
        true,
        &e,
    )
    .unwrap();
    let s = c.cluster.as_ref().unwrap();
    assert_eq!(s.nats_urls.len(), 2);
    assert_eq!(s.node_id, "n-1");
    assert_eq!(s.partitions, 8);
    assert!(
        matches!(&s.auth, crate::cluster::settings::NatsAuth::UserPassword { user, password } if user == "weft" && password.expose() == "s3cret-nats-pw")
    );
    // The password is a secret the scrubber knows.
    assert!(c.secrets.iter().any(|x| x.expose() == "s3cret-nats-pw"));
    for (text, key) in [
        ("[cluster]\n", "cluster.nats_url"),
        ("[cluster]\nnats_url = \"http://x\"\n", "cluster.nats_url"),
        (
            "[cluster]\nnats_url = \"nats://x:4222\"\nnode_id = \"a b\"\n",
            "cluster.node_id",
        ),
        (
            "[cluster]\nnats_url = \"nats://x:4222\"\npartitions = 0\n",
            "cluster.partitions",
        ),
        (
            "[cluster]\nnats_url = \"nats://x:4222\"\nlease_ttl_secs = 1\n",
            "cluster.lease_ttl_secs",
        ),
        (
            "[cluster]\nnats_url = \"nats://x:4222\"\nuser = \"u\"\n",
            "cluster.password",
        ),
        (
            "[cluster]\nnats_url = \"nats://x:4222\"\ntoken = \"t\"\nnkey_file = \"k\"\n",
            "cluster.user",
        ),
        (
            "[cluster]\nnats_url = \"nats://x:4222\"\ntls_cert = \"c.pem\"\n",
            "cluster.tls_cert",
        ),
        (
            "[cluster]\nnats_url = \"nats://x:4222\"\nnode = \"x\"\n",
            "node",
        ),
    ] {
        let err = Config::from_str(text, true, &e).unwrap_err().to_string();
        assert!(err.contains(key), "{text}: {err}");
    }
}
