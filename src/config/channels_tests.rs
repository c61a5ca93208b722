//! The platform registry: every registered platform describes itself completely, each one's
//! section reaches its own variant of the settings enum, and a key of another platform is
//! refused naming the platform that takes it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use clawft_channel_core::spec::{Intake, Resume};
use serde_json::{json, Value};

use super::super::env::Env;
use super::super::error::ConfigError;
use super::super::loaded::Config;
use super::*;

fn env() -> Env {
    Env::from_pairs([("HOME", "/home/u")])
}

fn load(channels: &Value) -> Result<Config, ConfigError> {
    Config::from_str(&json!({ "channels": channels }).to_string(), false, &env())
}

fn invalid(channels: &Value) -> (String, String) {
    match load(channels).unwrap_err() {
        ConfigError::Invalid { key, detail } => (key, detail),
        other => panic!("expected an invalid value, got {other}"),
    }
}

/// The least section that runs, of each registered platform: a new platform fails this test
/// until it has one.
fn sample(platform: &str) -> Value {
    match platform {
        "telegram" => json!({"token": "1:abc", "allow_from": [42]}),
        "discord" => json!({"token": "d-token", "allow_from": ["42"]}),
        "slack" => json!({"token": "xoxb-1", "app_token": "xapp-1", "allow_from": ["U111"]}),
        "whatsapp" => json!({"token": "w-token", "phone_number_id": "123", "app_secret": "s",
            "verify_token": "v", "allow_from": ["4915112345678"]}),
        "matrix" => json!({"homeserver": "https://hs.example.org", "access_token": "m-token",
            "allow_from": ["@alice:example.org"]}),
        "signal" => json!({"number": "+15551234567", "allow_from": ["+15557654321"]}),
        "email" => json!({"imap_host": "imap.example.org", "address": "bot@example.org",
            "password": "p", "authserv_id": "mx.example.org", "allow_from": ["a@example.org"]}),
        "xmpp" => json!({"jid": "bot@example.org", "password": "p",
            "allow_from": ["alice@example.org"]}),
        other => panic!("no sample section for the platform `{other}`: add one here"),
    }
}

/// Cluster mode carries a connection's resume state over to the next lease holder only
/// through the keys the platform names: a platform with a long-lived connection names some,
/// or says its platform redelivers (no silent empty list).
#[test]
fn every_platform_that_holds_a_connection_names_what_it_resumes_from() {
    let mut names: Vec<&str> = PLATFORMS.iter().map(|(n, _)| *n).collect();
    assert_eq!(names.len(), 8, "{names:?}");
    for (name, intake) in PLATFORMS {
        match intake {
            Intake::Connection(Resume::Keys(keys)) => {
                assert!(
                    !keys.is_empty(),
                    "{name}: a connection that resumes from nothing"
                );
                assert_eq!(intake.resume_keys(), *keys, "{name}");
            }
            Intake::Connection(Resume::Redelivered) => {
                assert!(intake.resume_keys().is_empty(), "{name}");
            }
            Intake::Webhooks { without_listener } => {
                assert!(!without_listener.is_empty(), "{name}");
                assert!(intake.resume_keys().is_empty(), "{name}");
            }
        }
    }
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), PLATFORMS.len(), "a platform registered twice");
    // What the adapters store, as their crates name it.
    let keys = |p: &str| {
        PLATFORMS
            .iter()
            .find(|(n, _)| *n == p)
            .map(|(_, i)| i.resume_keys())
            .unwrap()
    };
    assert_eq!(keys("telegram"), ["offset"]);
    assert_eq!(keys("discord"), ["session_id", "seq", "resume_url"]);
    assert_eq!(keys("matrix"), ["since"]);
    assert_eq!(keys("signal"), ["events_cursor"]);
    assert_eq!(keys("email"), ["cursor"]);
    assert!(keys("slack").is_empty() && keys("whatsapp").is_empty());
    // The XMPP server keeps what arrives for an offline account and hands it over at login.
    assert!(keys("xmpp").is_empty());
}

/// Each platform's section (written, read back as the file shape and written again) reaches
/// its own variant of [`ChannelSettings`], as the channel named after the platform.
#[test]
fn a_section_of_each_platform_round_trips_through_the_settings_enum() {
    for (name, intake) in PLATFORMS {
        let written = json!({ *name: sample(name) });
        let file: ChannelsFile = serde_json::from_value(written.clone()).unwrap();
        let again = serde_json::to_value(&file).unwrap();
        let c = load(&again).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            c.chat_channels,
            load(&written).unwrap().chat_channels,
            "{name}"
        );
        let [one] = &c.chat_channels[..] else {
            panic!("{name}: {:?}", c.chat_channels)
        };
        assert_eq!(one.platform(), *name);
        assert_eq!(one.settings.platform(), *name);
        assert_eq!(one.id(), *name);
        assert_eq!(one.settings.intake(), *intake, "{name}");
        assert_eq!(one.allow_from.len(), 1, "{name}");
        // A platform this build leaves out (xmpp is not a default feature) is read but has no
        // setup of its own to compare accounts by.
        if *name == "xmpp" && !cfg!(feature = "xmpp") {
            continue;
        }
        assert!(!one.settings.setup().identity().is_empty(), "{name}");
        // An account of it is the channel `<platform>.NAME`, of the same variant.
        let mut with_account = sample(name);
        with_account["accounts"] = json!({"work": sample(name)});
        let err = invalid(&json!({ *name: with_account }));
        assert_eq!(
            err.0,
            format!(
                "channels.{name}.accounts.work.{}",
                one.settings.setup().identity()[0].0
            ),
            "{name}: the same credentials twice are one account: {}",
            err.1
        );
    }
}

#[test]
fn a_key_of_another_platform_is_refused_naming_the_platform_that_takes_it() {
    let with = |platform: &str, extra: Value| {
        let mut s = sample(platform);
        for (k, v) in extra.as_object().unwrap() {
            s[k] = v.clone();
        }
        json!({ platform: s })
    };
    let (key, detail) = invalid(&with("telegram", json!({"phone_number_id": "1"})));
    assert_eq!(key, "channels.telegram.phone_number_id");
    assert_eq!(detail, "only the whatsapp channel takes phone_number_id");
    // A secret's other forms are named by the secret.
    let (key, detail) = invalid(&with("discord", json!({"app_token_env": "X"})));
    assert_eq!(key, "channels.discord.app_token");
    assert_eq!(
        detail,
        "only the slack channel has an app token, not discord"
    );
    let (key, detail) = invalid(&with("slack", json!({"gateway_url": "ws://x"})));
    assert_eq!(key, "channels.slack.gateway_url");
    assert_eq!(
        detail,
        "only the discord channel takes gateway_url; slack takes api_url"
    );
    // A key no platform takes.
    let (key, detail) = invalid(&with("telegram", json!({"tokn": "1:x"})));
    assert_eq!(key, "channels.telegram.tokn");
    assert!(
        detail.contains("not a setting of the telegram channel"),
        "{detail}"
    );
    // The shared chat keys are not the email channel's.
    let (key, _) = invalid(&with("email", json!({"group_mode": "all"})));
    assert_eq!(key, "channels.email.group_mode");
    // In an account, the account's key is named.
    let mut s = sample("telegram");
    s["accounts"] = json!({"work": {"token": "2:x", "homeserver": "https://hs"}});
    let (key, detail) = invalid(&json!({ "telegram": s }));
    assert_eq!(key, "channels.telegram.accounts.work.homeserver");
    assert_eq!(detail, "only the matrix channel takes homeserver");
}

/// A build without a platform's cargo feature reads its section without checking the keys it
/// does not know, and each account is reported (when built, and by `weft doctor`), never run.
#[tokio::test]
async fn a_platform_this_build_leaves_out_is_read_but_reported_not_run() {
    use clawft_channel_core::spec::{Handles, InlineSecrets, Shared, Verdict};
    let f: SectionFile<AbsentFile> = serde_json::from_value(
        json!({"token": "x", "gateway_url": "ws://x", "allow_from": ["anyone"]}),
    )
    .unwrap();
    let account = Account::new("discord", None);
    refuse_other_keys::<Absent>(&account, &f, &[]).unwrap();
    let mut secrets = InlineSecrets {
        config_dir: "/".into(),
        seen: Vec::new(),
    };
    let s = Absent::resolve(f.own, &account, &mut secrets).unwrap();
    let said = "this build of weft has no discord support (cargo feature `discord`)";
    let handles = Handles {
        account: account.clone(),
        shared: Shared {
            allow_from: std::collections::BTreeSet::new(),
            group_mode: clawft_channel_core::GroupMode::Mention,
            stream_edits: false,
            edit_interval: std::time::Duration::from_secs(1),
        },
        state: std::sync::Arc::new(clawft_channel_core::MemoryState::default()),
        is_paired: std::sync::Arc::new(|_: &str| false),
    };
    let Err(e) = s.build(handles) else {
        panic!("built")
    };
    assert_eq!(e.to_string(), said);
    assert_eq!(
        s.doctor(&account, std::time::Duration::ZERO).await,
        Verdict::Warn(said.into())
    );
}
