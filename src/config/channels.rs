//! `channels.*`: the chat platforms of the gateway and the keys their sections share. Each
//! platform describes itself through its crate's contract
//! ([`clawft_channel_core::spec::PlatformSpec`]: its own keys, their validation, its
//! constructor, resume keys and doctor check); this file registers them, one line each in
//! `platforms!`, and validates what every chat channel shares: `enabled`, `allow_from`,
//! `pairing`, `group_mode`, `group_sessions`, `stream_edits`, `edit_interval_ms`,
//! `max_chats_in_flight` and the bot accounts (`accounts.NAME`).
//!
//! Must not: know a platform's own keys (they are its crate's), or read the environment
//! itself (secrets resolve through the [`Resolver`] the loader gives).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_trait::async_trait;
use clawft_channel_core::spec::{
    file_keys, Account, ChannelSetup, Handles, Intake, PlatformSpec, Resolver, Resume,
    SettingsError, Shared, Verdict,
};
use clawft_channel_core::{Channel, ChannelError, GroupMode};
use serde::{Deserialize, Serialize};

use super::error::ConfigError;

pub use clawft_channel_core::spec::DEFAULT_ACCOUNT;

/// Default of `channels.<x>.max_chats_in_flight`: chats of one channel sending at once.
pub const DEFAULT_MAX_CHATS_IN_FLIGHT: usize = 8;

/// Registers the chat platforms: each line gives the [`ChannelSettings`] variant, the field and
/// name of its section `channels.<name>` (also its cargo feature), and its crate's
/// [`PlatformSpec`]. Everything the gateway does per platform is generated from this list, in
/// its order (the order channels start in).
macro_rules! platforms {
    ($( $(#[doc = $doc:literal])* $variant:ident $field:ident $name:literal $spec:path; )*) => {
        /// The platform contract of each chat platform in this build: its crate's, or
        /// [`Absent`] when the build has no cargo feature of its name.
        pub mod spec {
            $(
                #[cfg(feature = $name)]
                #[doc = concat!("The `", $name, "` platform.")]
                pub type $variant = $spec;
                #[cfg(not(feature = $name))]
                #[doc = concat!("The `", $name, "` platform, not in this build.")]
                pub type $variant = super::Absent;
            )*
        }

        /// The validated settings of one bot account, by platform.
        #[derive(Clone, Debug, PartialEq)]
        pub enum ChannelSettings {
            $( $(#[doc = $doc])* $variant(<spec::$variant as PlatformSpec>::Settings), )*
        }

        impl ChannelSettings {
            /// The platform: its config section `channels.<name>`, the channel ids of its
            /// accounts.
            pub fn platform(&self) -> &'static str {
                match self {
                    $( ChannelSettings::$variant(_) => $name, )*
                }
            }

            /// The account's settings as the gateway uses them: build, identity, doctor.
            pub fn setup(&self) -> &dyn ChannelSetup {
                match self {
                    $( ChannelSettings::$variant(s) => s, )*
                }
            }

            /// How the platform's messages reach the gateway (which decides how cluster mode
            /// runs it, and what it resumes from).
            pub fn intake(&self) -> Intake {
                match self {
                    $( ChannelSettings::$variant(_) => <spec::$variant as PlatformSpec>::INTAKE, )*
                }
            }
        }

        /// Every registered platform, in order, and how its messages reach the gateway.
        pub const PLATFORMS: &[(&str, Intake)] = &[
            $( ($name, <spec::$variant as PlatformSpec>::INTAKE), )*
        ];

        /// `channels`.
        #[derive(Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
        #[serde(deny_unknown_fields)]
        pub struct ChannelsFile {
            /// The local HTTP API.
            #[serde(default)]
            pub http: HttpFile,
            $(
                $(#[doc = $doc])*
                #[schemars(with = "Option<serde_json::Value>")]
                pub $field: Option<SectionFile<<spec::$variant as PlatformSpec>::File>>,
            )*
            /// Largest message accepted from any channel, in bytes of UTF-8 text (default:
            /// 32768, from 1024 to 4194304). A longer one is refused before it is stored or
            /// reaches the model, and its sender is told in the same chat (the HTTP API
            /// answers 413).
            pub max_inbound_bytes: Option<u64>,
        }

        impl ChannelsFile {
            /// Every enabled bot account of every platform section, in platform order
            /// (the section's own account first, then `accounts` by name). The sections are
            /// taken out of the file.
            ///
            /// # Errors
            /// A setting refused, named by its key.
            pub(super) fn resolve_chat(
                &mut self,
                secrets: &mut dyn Resolver,
            ) -> Result<Vec<ChatChannelConfig>, ConfigError> {
                let owners = [
                    $(
                        Owner {
                            platform: $name,
                            keys: file_keys::<<spec::$variant as PlatformSpec>::File>(),
                            taken_elsewhere: <spec::$variant as PlatformSpec>::taken_elsewhere,
                        },
                    )*
                ];
                let mut out = Vec::new();
                $(
                    out.extend(resolve_section::<spec::$variant>(
                        $name,
                        self.$field.take(),
                        ChannelSettings::$variant,
                        &owners,
                        secrets,
                    )?);
                )*
                Ok(out)
            }
        }
    };
}

platforms! {
    /// Telegram (Bot API, long polling).
    Telegram telegram "telegram" clawft_channel_telegram::Telegram;
    /// Discord (gateway + REST).
    Discord discord "discord" clawft_channel_discord::Discord;
    /// Slack (Socket Mode + Web API).
    Slack slack "slack" clawft_channel_slack::Slack;
    /// WhatsApp (Business Cloud API: webhooks in, Graph API out).
    WhatsApp whatsapp "whatsapp" clawft_channel_whatsapp::WhatsApp;
    /// Matrix (Client-Server API: `/sync` long-poll, a bot account's access token).
    Matrix matrix "matrix" clawft_channel_matrix::Matrix;
    /// Signal (signal-cli's JSON-RPC daemon over HTTP).
    Signal signal "signal" clawft_channel_signal::Signal;
    /// Email (IMAP IDLE in, SMTP out).
    Email email "email" clawft_channel_email::Email;
    /// XMPP (a client connection: STARTTLS or direct TLS, SASL SCRAM).
    Xmpp xmpp "xmpp" clawft_channel_xmpp::Xmpp;
}

/// A platform user id, written as a number or a string.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum IdFile {
    /// A numeric id (Telegram, Discord).
    Int(i64),
    /// A string id (Slack `U0123...`).
    Str(String),
}

impl std::fmt::Display for IdFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IdFile::Int(i) => write!(f, "{i}"),
            IdFile::Str(s) => f.write_str(s.trim()),
        }
    }
}

/// `channels.<platform>` and each of its `accounts.NAME`: the keys every chat channel shares,
/// the platform's own (`own`, its crate's), and what is left (refused, naming the platform
/// that takes it).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct SectionFile<F> {
    /// Run this channel (default true when the section is present).
    pub enabled: Option<bool>,
    /// Platform user ids allowed to talk to the bot (ids, not usernames; addresses for
    /// email). Empty: nobody (unless paired).
    pub allow_from: Option<Vec<IdFile>>,
    /// Give unknown senders a one-time code that `weft pairing approve CODE` admits
    /// (default false).
    pub pairing: Option<bool>,
    /// In group chats answer only when mentioned or replied to (`mention`, default) or to
    /// every message (`all`).
    pub group_mode: Option<String>,
    /// `chat` (default): one conversation per chat (and thread); `user`: one per sender inside
    /// each chat, so group members do not share a context.
    pub group_sessions: Option<String>,
    /// Stream replies by editing a draft message (default true).
    pub stream_edits: Option<bool>,
    /// Least time between two edits of a streamed draft, in milliseconds (default 1500).
    pub edit_interval_ms: Option<u64>,
    /// How many chats may be sending at the same time (default 8, at least 1). Replies of one
    /// chat are always sent one after the other.
    pub max_chats_in_flight: Option<usize>,
    /// The platform's own keys.
    #[serde(flatten)]
    pub own: F,
    /// Keys neither shared nor the platform's: refused at load.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
    /// More bots of this platform in the same gateway, by account name (`a-z`, `0-9`, `_`,
    /// `-`; at most 32): each takes the keys of this section and its own credentials, and
    /// inherits every other key it does not set from this section. Account NAME is the
    /// channel `<platform>.NAME`; this section, when it has its credentials, is the account
    /// `default` (channel `<platform>`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub accounts: BTreeMap<String, SectionFile<F>>,
}

/// A validated bot account: `channels.<platform>` (the account `default`) or
/// `channels.<platform>.accounts.<NAME>` with the keys it inherits filled in.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatChannelConfig {
    /// The bot account: `None` for the platform's own section (the account `default`),
    /// `Some(NAME)` for `channels.<platform>.accounts.NAME`.
    pub account: Option<String>,
    /// Admitted user ids.
    pub allow_from: BTreeSet<String>,
    /// Pairing of unknown senders.
    pub pairing: bool,
    /// Answer every group message (`true`) or only mentions/replies.
    pub group_all: bool,
    /// One session per sender in each chat.
    pub per_user_sessions: bool,
    /// Stream by editing a draft.
    pub stream_edits: bool,
    /// Least time between draft edits.
    pub edit_interval: Duration,
    /// Chats sending at the same time (`channels.<x>.max_chats_in_flight`).
    pub max_chats_in_flight: usize,
    /// The platform's own settings.
    pub settings: ChannelSettings,
}

impl ChatChannelConfig {
    /// The platform (`telegram`).
    pub fn platform(&self) -> &'static str {
        self.settings.platform()
    }

    /// The account: its config keys and channel id.
    pub fn account_ref(&self) -> Account {
        Account::new(self.platform(), self.account.as_deref())
    }

    /// The channel id: `<platform>` for the default account (so sessions, the journal and
    /// adapter offsets of a gateway from before accounts stay valid), `<platform>.<NAME>`
    /// for account NAME. Session keys, the outbox, access rules, pairing and the adapter's
    /// stored state all use it.
    pub fn id(&self) -> String {
        self.account_ref().channel_id().as_str().to_string()
    }

    /// The dotted config key of this account's setting `key` (for messages to the operator).
    pub fn config_key(&self, key: &str) -> String {
        self.account_ref().key(key)
    }

    /// The shared settings its adapter uses.
    pub fn shared(&self) -> Shared {
        Shared {
            allow_from: self.allow_from.clone(),
            group_mode: if self.group_all {
                GroupMode::All
            } else {
                GroupMode::Mention
            },
            stream_edits: self.stream_edits,
            edit_interval: self.edit_interval,
        }
    }
}

/// A channel id split into its platform (or channel) and its bot account: `telegram.work` →
/// (`telegram`, `work`), `telegram` → (`telegram`, `default`), `http` → (`http`, `default`).
pub fn split_channel_id(id: &str) -> (&str, &str) {
    id.split_once('.').unwrap_or((id, DEFAULT_ACCOUNT))
}

/// Whether `name` can name a bot account: it becomes part of the channel id
/// (`telegram.NAME`), of session keys and of store keys.
pub fn check_account_name(name: &str) -> Result<(), String> {
    let ok = (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if name == DEFAULT_ACCOUNT {
        return Err("`default` is the name of the platform's own section (its token and settings directly under channels.<platform>): give this account another name".into());
    }
    if ok {
        return Ok(());
    }
    Err(format!(
        "{name:?} is not an account name: use 1 to 32 of a-z, 0-9, `_` and `-` (it becomes part of the channel id, e.g. telegram.work)"
    ))
}

/// A registered platform, as the check of a section's keys sees it.
struct Owner {
    /// Its name.
    platform: &'static str,
    /// The keys of its own file type.
    keys: &'static [&'static str],
    /// Its error when another platform's section sets one of them.
    taken_elsewhere: fn(&str, &str, &str) -> String,
}

/// The section of platform `S` (named `platform`), resolved into its enabled bot accounts.
fn resolve_section<S: PlatformSpec>(
    platform: &'static str,
    file: Option<SectionFile<S::File>>,
    wrap: fn(S::Settings) -> ChannelSettings,
    owners: &[Owner],
    secrets: &mut dyn Resolver,
) -> Result<Vec<ChatChannelConfig>, ConfigError> {
    let Some(mut f) = file else {
        return Ok(Vec::new());
    };
    if !f.enabled.unwrap_or(true) {
        return Ok(Vec::new());
    }
    let accounts = std::mem::take(&mut f.accounts);
    let top = Account::new(platform, None);
    let mut bots = Vec::new();
    // The section itself is the account `default` when it has its credentials (or nothing
    // else could run: then their absence is the error).
    if S::names_account(&f.own) || accounts.is_empty() {
        bots.push(resolve_account::<S>(
            top.clone(),
            f.clone(),
            wrap,
            owners,
            secrets,
        )?);
    } else {
        refuse_other_keys::<S>(&top, &f, owners)?;
    }
    for (name, acc) in accounts {
        let key = top.key(&format!("accounts.{name}"));
        check_account_name(&name).map_err(|detail| ConfigError::Invalid {
            key: key.clone(),
            detail,
        })?;
        if !acc.accounts.is_empty() {
            return Err(ConfigError::Invalid {
                key: format!("{key}.accounts"),
                detail: format!(
                    "accounts do not nest: put every {} directly under channels.{platform}.accounts",
                    S::ACCOUNT
                ),
            });
        }
        if !acc.enabled.unwrap_or(true) {
            continue;
        }
        let merged = inherit::<S>(acc, &f);
        let account = Account::new(platform, Some(&name));
        bots.push(resolve_account::<S>(
            account, merged, wrap, owners, secrets,
        )?);
    }
    check_distinct::<S>(&bots)?;
    Ok(bots)
}

/// Account `acc` with every shared key it does not set taken from its platform's section
/// `top`, and the platform's own keys as its crate inherits them.
fn inherit<S: PlatformSpec>(
    acc: SectionFile<S::File>,
    top: &SectionFile<S::File>,
) -> SectionFile<S::File> {
    let t = top.clone();
    SectionFile {
        enabled: acc.enabled,
        allow_from: acc.allow_from.or(t.allow_from),
        pairing: acc.pairing.or(t.pairing),
        group_mode: acc.group_mode.or(t.group_mode),
        group_sessions: acc.group_sessions.or(t.group_sessions),
        stream_edits: acc.stream_edits.or(t.stream_edits),
        edit_interval_ms: acc.edit_interval_ms.or(t.edit_interval_ms),
        max_chats_in_flight: acc.max_chats_in_flight.or(t.max_chats_in_flight),
        own: S::inherit(acc.own, &top.own),
        // The section's own unknown keys are refused with the section.
        other: acc.other,
        accounts: BTreeMap::new(),
    }
}

/// Refuse the keys of a section that are neither shared nor its platform's: each is named with
/// the platform that takes it, when one does.
fn refuse_other_keys<S: PlatformSpec>(
    account: &Account,
    f: &SectionFile<S::File>,
    owners: &[Owner],
) -> Result<(), ConfigError> {
    if S::ANY_KEYS {
        return Ok(());
    }
    if let Some(key) = f.other.keys().next() {
        let takers: Vec<&Owner> = owners
            .iter()
            .filter(|o| o.keys.contains(&key.as_str()))
            .collect();
        // A secret's `_env` and `_file` forms are named by the secret's key.
        let named = key
            .strip_suffix("_env")
            .or_else(|| key.strip_suffix("_file"))
            .filter(|base| owners.iter().any(|o| o.keys.contains(base)))
            .unwrap_or(key);
        let detail = match takers[..] {
            [one] => (one.taken_elsewhere)(named, one.platform, account.platform()),
            _ => format!(
                "`{named}` is not a setting of the {} channel",
                account.platform()
            ),
        };
        return Err(account.invalid(named, detail).into());
    }
    if !S::CHAT_KEYS {
        for (key, set) in [
            ("group_mode", f.group_mode.is_some()),
            ("group_sessions", f.group_sessions.is_some()),
            ("stream_edits", f.stream_edits.is_some()),
            ("edit_interval_ms", f.edit_interval_ms.is_some()),
        ] {
            if set {
                return Err(account
                    .invalid(
                        key,
                        format!(
                            "`{key}` is not a setting of the {} channel",
                            account.platform()
                        ),
                    )
                    .into());
            }
        }
    }
    Ok(())
}

/// One bot account of platform `S`, its inherited keys already filled in.
fn resolve_account<S: PlatformSpec>(
    account: Account,
    f: SectionFile<S::File>,
    wrap: fn(S::Settings) -> ChannelSettings,
    owners: &[Owner],
    secrets: &mut dyn Resolver,
) -> Result<ChatChannelConfig, ConfigError> {
    refuse_other_keys::<S>(&account, &f, owners)?;
    if let (Some(why), Some(true)) = (S::NO_STREAMING, f.stream_edits) {
        return Err(account.invalid("stream_edits", why).into());
    }
    let settings = wrap(S::resolve(f.own, &account, secrets)?);
    let group_all = match f.group_mode.as_deref() {
        None | Some("mention") => false,
        Some("all") => true,
        Some(other) => {
            return Err(account
                .invalid(
                    "group_mode",
                    format!("expected \"mention\" or \"all\", got \"{other}\""),
                )
                .into())
        }
    };
    let per_user_sessions = match f.group_sessions.as_deref() {
        None | Some("chat") => false,
        Some("user") => true,
        Some(other) => {
            return Err(account
                .invalid(
                    "group_sessions",
                    format!("expected \"chat\" or \"user\", got \"{other}\""),
                )
                .into())
        }
    };
    let mut allow_from = BTreeSet::new();
    for id in f.allow_from.unwrap_or_default() {
        let id = id.to_string();
        if id.is_empty() {
            continue;
        }
        allow_from.insert(S::user_id(&id, &account)?);
    }
    let pairing = f.pairing.unwrap_or(false);
    if allow_from.is_empty() && !pairing {
        let k = account.key("allow_from");
        tracing::warn!(
            channel = account.platform(),
            account = account.name().unwrap_or(DEFAULT_ACCOUNT),
            "{k} is empty and pairing is off: nobody can talk to this bot"
        );
    }
    let max_chats_in_flight = match f.max_chats_in_flight {
        None => DEFAULT_MAX_CHATS_IN_FLIGHT,
        Some(0) => {
            return Err(account
                .invalid(
                    "max_chats_in_flight",
                    "must be at least 1 (1 sends one chat at a time; default 8)",
                )
                .into())
        }
        Some(n) => n,
    };
    Ok(ChatChannelConfig {
        account: account.name().map(str::to_string),
        allow_from,
        pairing,
        group_all,
        per_user_sessions,
        stream_edits: S::CHAT_KEYS && S::NO_STREAMING.is_none() && f.stream_edits.unwrap_or(true),
        edit_interval: Duration::from_millis(f.edit_interval_ms.unwrap_or(1500).max(200)),
        max_chats_in_flight,
        settings,
    })
}

/// Two accounts of one platform with the same identity (bot token, app token, number,
/// address) would be one bot run twice: Telegram hands each update to one poller only, Slack
/// splits the events between the connections.
fn check_distinct<S: PlatformSpec>(bots: &[ChatChannelConfig]) -> Result<(), ConfigError> {
    for (i, b) in bots.iter().enumerate() {
        let mine = b.settings.setup().identity();
        for a in &bots[..i] {
            let theirs = a.settings.setup().identity();
            let same = mine
                .iter()
                .find(|(k, v)| !v.is_empty() && theirs.contains(&(*k, *v)));
            if let Some((what, _)) = same {
                return Err(ConfigError::Invalid {
                    key: b.config_key(what),
                    detail: S::same_account(what, &a.config_key(what), &b.config_key(what)),
                });
            }
        }
    }
    Ok(())
}

/// The `channels.http` section.
#[derive(Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpFile {
    /// Serve the HTTP API (default true).
    pub enabled: Option<bool>,
    /// Address to bind (default `127.0.0.1:18790`). Non-loopback needs a token.
    pub bind: Option<String>,
    /// Bearer token, inline.
    pub token: Option<String>,
    /// Environment variable holding the bearer token.
    pub token_env: Option<String>,
    /// File holding the bearer token.
    pub token_file: Option<String>,
    /// How long `POST /v1/chat` waits for the reply, in seconds (default 300).
    pub reply_timeout_secs: Option<u64>,
    /// Let local programs use the chat routes (`/v1/chat`, `/v1/chat/stream`) without a
    /// bearer token (default false). Loopback binds only; the admin routes always need one.
    pub allow_loopback_without_token: Option<bool>,
    /// Host names (as browsers send them in `Host`, without the port) the control UI answers
    /// for besides `localhost`, `127.0.0.1`, `[::1]` and the bind address: the name a reverse
    /// proxy serves it under (default none; any other name gets 421).
    pub ui_hosts: Option<Vec<String>>,
    /// Also serve the API over TLS on this address (e.g. `0.0.0.0:18443`), with `tls_cert`
    /// and `tls_key` (default: no TLS listener). A non-loopback address needs a token.
    pub tls_bind: Option<String>,
    /// PEM file of the TLS listener's certificate (then its chain), relative to the
    /// configuration file's directory.
    pub tls_cert: Option<String>,
    /// PEM file of that certificate's private key.
    pub tls_key: Option<String>,
}

/// A platform this build was compiled without (its cargo feature off): its section is read
/// without its own keys being checked, and each of its accounts is reported when the gateway
/// starts (`this build of weft has no X support`), never built.
pub struct Absent;

/// The own keys of a platform not in this build: none known.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct AbsentFile {}

/// The settings of an account of a platform not in this build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AbsentSettings {
    platform: &'static str,
}

impl AbsentSettings {
    /// What the gateway and `weft doctor` say of it.
    fn unsupported(&self) -> String {
        format!(
            "this build of weft has no {p} support (cargo feature `{p}`)",
            p = self.platform
        )
    }
}

impl PlatformSpec for Absent {
    type File = AbsentFile;
    type Settings = AbsentSettings;

    // Never built: nothing runs, nothing resumes.
    const INTAKE: Intake = Intake::Connection(Resume::Redelivered);
    const ANY_KEYS: bool = true;

    fn names_account(_: &AbsentFile) -> bool {
        true
    }

    fn inherit(account: AbsentFile, _: &AbsentFile) -> AbsentFile {
        account
    }

    fn resolve(
        _: AbsentFile,
        account: &Account,
        _: &mut dyn Resolver,
    ) -> Result<AbsentSettings, SettingsError> {
        Ok(AbsentSettings {
            platform: account.platform(),
        })
    }

    fn user_id(id: &str, _: &Account) -> Result<String, SettingsError> {
        Ok(id.to_string())
    }
}

#[async_trait]
impl ChannelSetup for AbsentSettings {
    fn build(&self, _: Handles) -> Result<std::sync::Arc<dyn Channel>, ChannelError> {
        Err(ChannelError::Fatal(self.unsupported()))
    }

    fn identity(&self) -> Vec<(&'static str, &str)> {
        Vec::new()
    }

    async fn doctor(&self, _: &Account, _: Duration) -> Verdict {
        Verdict::Warn(self.unsupported())
    }
}

#[cfg(test)]
#[path = "channels_tests.rs"]
mod tests;
