//! Several bot accounts of one platform: `channels.<platform>.accounts.NAME`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

fn env(pairs: &[(&str, &str)]) -> Env {
    let mut v: Vec<(String, String)> = vec![("HOME".into(), "/home/u".into())];
    v.extend(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Env::from_pairs(v)
}

fn load(toml: &str) -> Result<Config, ConfigError> {
    Config::from_str(toml, true, &env(&[("WORK_TOKEN", "222:work")]))
}

fn err(toml: &str) -> (String, String) {
    match load(toml).unwrap_err() {
        ConfigError::Invalid { key, detail } => (key, detail),
        other => panic!("expected an invalid value, got {other}"),
    }
}

fn ids(c: &Config) -> Vec<String> {
    c.chat_channels.iter().map(ChatChannelConfig::id).collect()
}

#[test]
fn an_account_inherits_every_key_it_does_not_set_except_the_token() {
    let c = load(
        r#"
[channels.telegram]
token = "111:main"
allow_from = [42]
pairing = true
group_mode = "all"
group_sessions = "user"
api_url = "http://127.0.0.1:9"
stream_edits = false
edit_interval_ms = 700
max_chats_in_flight = 3

[channels.telegram.accounts.work]
token_env = "WORK_TOKEN"

[channels.telegram.accounts.ops]
token = "333:ops"
allow_from = [7]
pairing = false
max_chats_in_flight = 1
"#,
    )
    .unwrap();
    assert_eq!(ids(&c), ["telegram", "telegram.ops", "telegram.work"]);
    let [main, ops, work] = &c.chat_channels[..] else {
        panic!("{:?}", ids(&c))
    };
    assert_eq!(main.account, None);
    assert_eq!(work.account.as_deref(), Some("work"));
    let tg = |c: &ChatChannelConfig| {
        let ChannelSettings::Telegram(t) = &c.settings else {
            panic!("{c:?}")
        };
        t.clone()
    };
    assert_eq!(tg(work).token.expose(), "222:work");
    assert_eq!(tg(ops).token.expose(), "333:ops");
    // Inherited whole by `work`.
    for (k, v) in [
        ("allow_from", format!("{:?}", work.allow_from)),
        ("pairing", work.pairing.to_string()),
        ("group_all", work.group_all.to_string()),
        ("per_user_sessions", work.per_user_sessions.to_string()),
        ("api_url", format!("{:?}", tg(work).api_url)),
        ("stream_edits", work.stream_edits.to_string()),
        ("edit_interval", format!("{:?}", work.edit_interval)),
        ("max_chats_in_flight", work.max_chats_in_flight.to_string()),
    ] {
        let m = match k {
            "allow_from" => format!("{:?}", main.allow_from),
            "pairing" => main.pairing.to_string(),
            "group_all" => main.group_all.to_string(),
            "per_user_sessions" => main.per_user_sessions.to_string(),
            "api_url" => format!("{:?}", tg(main).api_url),
            "stream_edits" => main.stream_edits.to_string(),
            "edit_interval" => format!("{:?}", main.edit_interval),
            _ => main.max_chats_in_flight.to_string(),
        };
        assert_eq!(v, m, "{k} not inherited");
    }
    assert_eq!(tg(work).api_url.as_deref(), Some("http://127.0.0.1:9"));
    assert_eq!(work.max_chats_in_flight, 3);
    // What `ops` sets is its own; the rest still comes from the section.
    assert_eq!(ops.allow_from.iter().collect::<Vec<_>>(), ["7"]);
    assert!(!ops.pairing);
    assert_eq!(ops.max_chats_in_flight, 1);
    assert!(ops.group_all);
    // Every token is scrubbed from tool output and logs.
    for t in ["111:main", "222:work", "333:ops"] {
        assert!(c.secrets.iter().any(|s| s.expose() == t), "{t}");
    }
    assert_eq!(
        work.config_key("token"),
        "channels.telegram.accounts.work.token"
    );
    assert_eq!(main.config_key("token"), "channels.telegram.token");
}

#[test]
fn the_json_form_and_a_platform_with_only_accounts() {
    let c = Config::from_str(
        r#"{"channels": {"telegram": {"allow_from": [42], "accounts": {
            "home": {"token": "1:home"}, "work": {"token": "2:work", "allow_from": [43]}}}}}"#,
        false,
        &env(&[]),
    )
    .unwrap();
    // No token in the section: no `default` account, and that is not an error.
    assert_eq!(ids(&c), ["telegram.home", "telegram.work"]);
    assert_eq!(
        c.chat_channels[0].allow_from.iter().collect::<Vec<_>>(),
        ["42"]
    );
    assert_eq!(
        c.chat_channels[1].allow_from.iter().collect::<Vec<_>>(),
        ["43"]
    );
}

#[test]
fn an_account_without_its_own_token_is_refused_naming_its_key() {
    let (key, detail) = err(
        "[channels.telegram]\ntoken = \"111:main\"\nallow_from = [1]\n[channels.telegram.accounts.work]\nallow_from = [2]\n",
    );
    assert_eq!(key, "channels.telegram.accounts.work.token");
    assert!(detail.contains("its own token"), "{detail}");
    assert!(detail.contains("not inherited"), "{detail}");
    // Slack: the app-level token is per app too.
    let (key, detail) = err(
        "[channels.slack]\ntoken = \"xoxb-1\"\napp_token = \"xapp-1\"\nallow_from = [\"U111\"]\n[channels.slack.accounts.b]\ntoken = \"xoxb-2\"\n",
    );
    assert_eq!(key, "channels.slack.accounts.b.app_token", "{detail}");
    // A section with neither a token nor accounts keeps its old error.
    let (key, detail) = err("[channels.telegram]\nallow_from = [1]\n");
    assert_eq!(key, "channels.telegram.token");
    assert!(detail.contains("accounts.NAME"), "{detail}");
}

#[test]
fn two_accounts_with_one_token_are_refused_naming_both() {
    // The section and an account, the second given by indirection.
    let (key, detail) = err(
        "[channels.telegram]\ntoken = \"222:work\"\nallow_from = [1]\n[channels.telegram.accounts.work]\ntoken_env = \"WORK_TOKEN\"\n",
    );
    assert_eq!(key, "channels.telegram.accounts.work.token");
    assert!(detail.contains("`channels.telegram.token`"), "{detail}");
    assert!(
        detail.contains("`channels.telegram.accounts.work.token`"),
        "{detail}"
    );
    // Two accounts.
    let (key, detail) = err(
        "[channels.discord]\nallow_from = [\"1\"]\n[channels.discord.accounts.a]\ntoken = \"same\"\n[channels.discord.accounts.b]\ntoken = \"same\"\n",
    );
    assert_eq!(key, "channels.discord.accounts.b.token");
    assert!(
        detail.contains("channels.discord.accounts.a.token"),
        "{detail}"
    );
    // Slack: one app token for two bots.
    let (key, detail) = err(
        "[channels.slack]\nallow_from = [\"U111\"]\n[channels.slack.accounts.a]\ntoken = \"xoxb-1\"\napp_token = \"xapp-1\"\n[channels.slack.accounts.b]\ntoken = \"xoxb-2\"\napp_token = \"xapp-1\"\n",
    );
    assert_eq!(key, "channels.slack.accounts.b.app_token");
    assert!(
        detail.contains("channels.slack.accounts.a.app_token"),
        "{detail}"
    );
    // The same token on two platforms is not this error (it cannot be one bot anyway).
    load("[channels.telegram.accounts.a]\ntoken = \"x\"\nallow_from = [1]\n[channels.discord.accounts.a]\ntoken = \"x\"\nallow_from = [\"1\"]\n").unwrap();
}

#[test]
fn account_names_are_checked() {
    let long = "a".repeat(33);
    for bad in [
        "Work",
        "a.b",
        "a:b",
        "a b",
        "",
        "default",
        long.as_str(),
        "é",
    ] {
        let text = format!(
            "[channels.telegram]\nallow_from = [1]\n[channels.telegram.accounts.\"{bad}\"]\ntoken = \"1:x\"\n"
        );
        let (key, detail) = err(&text);
        assert_eq!(key, format!("channels.telegram.accounts.{bad}"), "{detail}");
        if bad == "default" {
            assert!(detail.contains("own section"), "{detail}");
        } else {
            assert!(detail.contains("a-z, 0-9"), "{bad}: {detail}");
        }
    }
    let ok = format!(
        "[channels.telegram]\nallow_from = [1]\n[channels.telegram.accounts.{}]\ntoken = \"1:x\"\n[channels.telegram.accounts.w_2-b]\ntoken = \"2:x\"\n",
        "z".repeat(32)
    );
    assert_eq!(load(&ok).unwrap().chat_channels.len(), 2);
    // Accounts do not nest.
    let (key, _) = err(
        "[channels.telegram.accounts.a]\ntoken = \"1:x\"\nallow_from = [1]\n[channels.telegram.accounts.a.accounts.b]\ntoken = \"2:x\"\n",
    );
    assert_eq!(key, "channels.telegram.accounts.a.accounts");
}

#[test]
fn enabled_false_turns_off_one_account_or_the_whole_platform() {
    let base = "[channels.telegram]\ntoken = \"1:main\"\nallow_from = [1]\n[channels.telegram.accounts.a]\ntoken = \"2:a\"\n[channels.telegram.accounts.b]\ntoken = \"3:b\"\n";
    assert_eq!(
        ids(&load(base).unwrap()),
        ["telegram", "telegram.a", "telegram.b"]
    );
    let one_off = base.replace("token = \"2:a\"\n", "token = \"2:a\"\nenabled = false\n");
    assert_eq!(ids(&load(&one_off).unwrap()), ["telegram", "telegram.b"]);
    // An account that is off is not checked for its token.
    let no_token = base.replace("token = \"2:a\"\n", "enabled = false\n");
    assert_eq!(ids(&load(&no_token).unwrap()), ["telegram", "telegram.b"]);
    let all_off = base.replace("allow_from = [1]\n", "allow_from = [1]\nenabled = false\n");
    assert!(load(&all_off).unwrap().chat_channels.is_empty());
    // Top-level off wins over an account that says on.
    let forced = all_off.replace("token = \"3:b\"\n", "token = \"3:b\"\nenabled = true\n");
    assert!(load(&forced).unwrap().chat_channels.is_empty());
}

#[test]
fn discord_and_slack_accounts_inherit_their_platform_keys() {
    let c = load(
        r#"
[channels.discord]
api_base_url = "http://127.0.0.1:9"
gateway_url = "ws://127.0.0.1:9/gw"
allow_from = ["1"]
[channels.discord.accounts.a]
token = "d-a"
[channels.discord.accounts.b]
token = "d-b"
proxy = "http://127.0.0.1:8"

[channels.slack]
token = "xoxb-1"
app_token = "xapp-1"
allow_from = ["U111"]
api_url = "http://127.0.0.1:7/api/"
[channels.slack.accounts.team2]
token = "xoxb-2"
app_token = "xapp-2"
"#,
    )
    .unwrap();
    assert_eq!(ids(&c), ["discord.a", "discord.b", "slack", "slack.team2"]);
    let (ChannelSettings::Discord(a), ChannelSettings::Discord(b), ChannelSettings::Slack(t2)) = (
        &c.chat_channels[0].settings,
        &c.chat_channels[1].settings,
        &c.chat_channels[3].settings,
    ) else {
        panic!("{:?}", c.chat_channels)
    };
    assert_eq!(a.api_base_url.as_deref(), Some("http://127.0.0.1:9"));
    assert_eq!(a.gateway_url.as_deref(), Some("ws://127.0.0.1:9/gw"));
    // The old name set on the account replaces the section's base URL.
    assert_eq!(b.api_base_url.as_deref(), Some("http://127.0.0.1:8"));
    assert_eq!(t2.app_token.expose(), "xapp-2");
    assert_eq!(t2.api_url.as_deref(), Some("http://127.0.0.1:7/api/"));
}

#[test]
fn channel_ids_split_into_platform_and_account() {
    assert_eq!(split_channel_id("telegram.work"), ("telegram", "work"));
    assert_eq!(split_channel_id("telegram"), ("telegram", "default"));
    assert_eq!(split_channel_id("http"), ("http", "default"));
    assert_eq!(split_channel_id("slack.team-2"), ("slack", "team-2"));
}
