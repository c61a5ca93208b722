//! The platform contract: what a chat platform crate gives the gateway so that one path
//! configures, builds, checks and fails over any of its channels without knowing the platform.
//! A crate implements [`PlatformSpec`] once (its section's own keys as written, their defaults
//! and validation, how its connection reaches the gateway) and its validated settings implement
//! [`ChannelSetup`] (the constructor, the identity of an account, what `weft doctor` asks of
//! it).
//!
//! Must not: read the environment or secret files (the gateway's config loader resolves
//! `*_env`/`*_file` secrets through [`Resolver`]), know another platform, or hold any of the
//! send path.

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::secret::Secret;
use crate::{Channel, ChannelError, ChannelId, GroupMode, StateStore};

/// The account name of a platform's own section (`channels.<platform>`), whose channel id is
/// the bare platform name.
pub const DEFAULT_ACCOUNT: &str = "default";

/// The end of every message refusing an `allow_from` id: how to admit someone whose id is not
/// known.
pub const PAIRING_HINT: &str = "or set `pairing = true` and admit the sender with `weft pairing approve CODE` (`weft pairing list` shows their id)";

/// One bot account of a platform: its section `channels.<platform>` (the account `default`)
/// or `channels.<platform>.accounts.<name>`. Names the full config key of every setting, and
/// the channel id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    platform: &'static str,
    name: Option<String>,
}

impl Account {
    /// The account `name` of `platform` (`None`: the platform's own section).
    pub fn new(platform: &'static str, name: Option<&str>) -> Self {
        Self {
            platform,
            name: name.map(str::to_string),
        }
    }

    /// The platform (its config section and cargo feature): `telegram`.
    pub fn platform(&self) -> &'static str {
        self.platform
    }

    /// The account's name: `None` for the platform's own section.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The dotted config key of setting `key`: `channels.<platform>.<key>`, or
    /// `channels.<platform>.accounts.<name>.<key>`.
    pub fn key(&self, key: &str) -> String {
        let p = self.platform;
        match &self.name {
            None => format!("channels.{p}.{key}"),
            Some(a) => format!("channels.{p}.accounts.{a}.{key}"),
        }
    }

    /// The channel id: `<platform>` for the platform's own section (so sessions, the journal
    /// and the adapter's state of a gateway from before accounts stay valid),
    /// `<platform>.<name>` for the others.
    pub fn channel_id(&self) -> ChannelId {
        match &self.name {
            None => ChannelId::new(self.platform),
            Some(a) => ChannelId::new(format!("{}.{a}", self.platform)),
        }
    }

    /// The error refusing setting `key` of this account.
    pub fn invalid(&self, key: &str, detail: impl Into<String>) -> SettingsError {
        SettingsError::Invalid {
            key: self.key(key),
            detail: detail.into(),
        }
    }
}

/// Why a channel's settings were refused. Every variant names the full dotted key and what to
/// do; the gateway reports them as its own configuration errors of the same kind.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// A value of the right type but not acceptable (or missing).
    #[error("invalid value for `{key}`: {detail}")]
    Invalid {
        /// Dotted key path.
        key: String,
        /// What is expected, and how to fix it.
        detail: String,
    },
    /// A secret given by indirection could not be read (`*_env` unset, `*_file` unreadable).
    #[error("cannot read secret for `{key}`: {detail}")]
    Secret {
        /// Dotted key path (of the `*_env` or `*_file` form).
        key: String,
        /// What went wrong and how to fix it.
        detail: String,
    },
}

/// The three ways a secret setting `K` may be written: `K` inline, `K_env` (an environment
/// variable's name), `K_file` (a file, relative to `$CREDENTIALS_DIRECTORY`).
#[derive(Clone, Debug, Default)]
pub struct SecretForms {
    /// `K`: the value itself.
    pub inline: Option<String>,
    /// `K_env`: the environment variable holding it.
    pub env: Option<String>,
    /// `K_file`: the file holding it.
    pub file: Option<String>,
}

impl SecretForms {
    /// The forms as written.
    pub fn new(inline: Option<String>, env: Option<String>, file: Option<String>) -> Self {
        Self { inline, env, file }
    }

    /// Whether any form is written.
    pub fn is_set(&self) -> bool {
        self.inline.is_some() || self.env.is_some() || self.file.is_some()
    }
}

/// What a platform's validation may ask of the gateway's config loader, the only reader of the
/// environment and of secret files.
pub trait Resolver {
    /// The secret of setting `key` (its full dotted key) from whichever of its forms is
    /// written; `None` when none is. The secret is registered with the gateway's scrubber.
    ///
    /// # Errors
    /// More than one form written, the variable unset, the file unreadable or empty.
    fn secret(&mut self, key: &str, forms: SecretForms) -> Result<Option<Secret>, SettingsError>;

    /// A path written in the config, relative to the config file's directory (an absolute
    /// path as it is).
    fn config_path(&self, path: &str) -> PathBuf;
}

/// The state an adapter's next connection holder needs to carry on where the last one
/// stopped (cluster mode keeps these keys of its [`StateStore`] in the cluster).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resume {
    /// These state keys (a poll offset, a session and sequence, a stream cursor).
    Keys(&'static [&'static str]),
    /// Nothing: the platform itself redelivers what was not acknowledged (Slack's Socket
    /// Mode).
    Redelivered,
}

/// How a platform's messages reach the gateway, which decides how cluster mode runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intake {
    /// One long-lived connection per account (a long poll, a socket, an event stream): in
    /// cluster mode it runs only on the node holding the account's lease, and the next holder
    /// resumes from [`Resume`].
    Connection(Resume),
    /// Webhooks the platform posts to the gateway's HTTP listener, on every node alike (no
    /// lease).
    Webhooks {
        /// The error when the HTTP listener is off (`channels.http.enabled = false`): what to
        /// do about it.
        without_listener: &'static str,
    },
}

impl Intake {
    /// The state keys cluster mode keeps in the cluster (none for webhooks, or when the
    /// platform redelivers).
    pub fn resume_keys(self) -> &'static [&'static str] {
        match self {
            Intake::Connection(Resume::Keys(k)) => k,
            Intake::Connection(Resume::Redelivered) | Intake::Webhooks { .. } => &[],
        }
    }
}

/// A platform: its settings as written and validated, and how it reaches the gateway. The
/// gateway's config aggregates one section per platform (`channels.<platform>`, with more bot
/// accounts under `accounts.NAME`) and adds the keys every chat channel shares: `enabled`,
/// `allow_from`, `pairing`, `max_chats_in_flight`, `accounts` and, with
/// [`PlatformSpec::CHAT_KEYS`], `group_mode`, `group_sessions`, `stream_edits`,
/// `edit_interval_ms`. A key of the section that is neither shared nor in [`PlatformSpec::File`]
/// is refused, naming the platform that takes it.
pub trait PlatformSpec: 'static {
    /// The platform's own keys of its section and of each account, as written: a plain struct
    /// (no `flatten`, every field optional), read with the shared keys beside it.
    type File: DeserializeOwned + Serialize + Clone + fmt::Debug + Default + Send + Sync;
    /// The validated settings of one account.
    type Settings: ChannelSetup + Clone + fmt::Debug + PartialEq + Send + Sync + 'static;

    /// How the platform's messages reach the gateway.
    const INTAKE: Intake;
    /// What one account is, in messages (`bot`, `mailbox`).
    const ACCOUNT: &'static str = "bot";
    /// Whether the platform takes the shared chat keys (`group_mode`, `group_sessions`,
    /// `stream_edits`, `edit_interval_ms`): it has group chats and may stream by edits.
    const CHAT_KEYS: bool = true;
    /// `Some(why)`: the platform never streams, and `stream_edits = true` is refused with this
    /// reason.
    const NO_STREAMING: Option<&'static str> = None;
    /// The section's keys are not known to this build (a platform compiled out): they are
    /// accepted unread.
    const ANY_KEYS: bool = false;

    /// Whether the platform's own section is an account (its credential is written). When it
    /// is not and the section has accounts, only they run; when it has none, the section is
    /// the account anyway, so its missing credential is the error.
    fn names_account(file: &Self::File) -> bool;

    /// Account `account` with every key it does not set taken from its platform's `section`,
    /// except what makes it its own account (its credentials, its address).
    fn inherit(account: Self::File, section: &Self::File) -> Self::File;

    /// Validate one account's own keys, defaults filled in.
    ///
    /// # Errors
    /// A missing or refused setting, or a secret that cannot be read, named by its key.
    fn resolve(
        file: Self::File,
        account: &Account,
        secrets: &mut dyn Resolver,
    ) -> Result<Self::Settings, SettingsError>;

    /// An `allow_from` entry of `account` (trimmed, not empty) as senders are compared with
    /// it.
    ///
    /// # Errors
    /// The id cannot be a sender of this platform: refused under `allow_from`, saying why and
    /// how to find the right id.
    fn user_id(id: &str, account: &Account) -> Result<String, SettingsError>;

    /// The error when the section of `platform` sets `key`, a key only this platform (named
    /// `owner`) takes.
    fn taken_elsewhere(key: &str, owner: &str, platform: &str) -> String {
        let _ = platform;
        format!("only the {owner} channel takes {key}")
    }

    /// The error when two accounts of the platform have the same `what` (a key of
    /// [`ChannelSetup::identity`]), written as `first` and `second` (full keys).
    fn same_account(what: &str, first: &str, second: &str) -> String {
        format!(
            "`{first}` and `{second}` are the same {what}: each account is its own bot and needs its own token (remove one of them, or give it its bot's token)"
        )
    }
}

/// The shared settings of an account that an adapter uses, validated by the gateway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shared {
    /// `allow_from`: the users admitted (Matrix accepts their room invites).
    pub allow_from: BTreeSet<String>,
    /// `group_mode`: which group messages are delivered.
    pub group_mode: GroupMode,
    /// `stream_edits`: stream replies by editing a draft.
    pub stream_edits: bool,
    /// `edit_interval_ms`: least time between two edits of a draft.
    pub edit_interval: Duration,
}

/// Whether a user was admitted by pairing (`weft pairing approve`).
pub type PairedCheck = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// What the gateway gives a platform's constructor beside its settings.
pub struct Handles {
    /// The account (its channel id and config keys).
    pub account: Account,
    /// Its shared settings.
    pub shared: Shared,
    /// Its durable state (the store, or the cluster for the [`Resume`] keys).
    pub state: Arc<dyn StateStore>,
    /// Whether a user was admitted by pairing (Matrix accepts their invites too).
    pub is_paired: PairedCheck,
}

/// What `weft doctor` found about one channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Works (what was checked).
    Ok(String),
    /// Works, with something to know.
    Warn(String),
    /// Does not work (what to do about it).
    Fail(String),
}

/// The validated settings of one account, as the gateway uses them without knowing the
/// platform.
#[async_trait]
pub trait ChannelSetup: fmt::Debug + Send + Sync {
    /// Build the channel (no network yet).
    ///
    /// # Errors
    /// A setting the adapter refuses, or its client cannot be built.
    fn build(&self, handles: Handles) -> Result<Arc<dyn Channel>, ChannelError>;

    /// What makes the account its own (a bot token, a phone number id, an address), each with
    /// its key: two accounts of the platform with the same value are refused. Compared, never
    /// shown.
    fn identity(&self) -> Vec<(&'static str, &str)>;

    /// A setting that names the account in place of a secret (Signal's `number`), shown by
    /// `weft config show`; `None` when a token names it.
    fn account_label(&self) -> Option<(&'static str, String)> {
        None
    }

    /// Check the account against its platform (a token accepted, a login, a daemon reachable)
    /// within `timeout` per request.
    async fn doctor(&self, account: &Account, timeout: Duration) -> Verdict;
}

/// The token of `key` (a secret setting written as `key`, `key_env` or `key_file`), or
/// [`missing_token`].
///
/// # Errors
/// No form of it written; the secret cannot be read.
pub fn require_token(
    account: &Account,
    key: &str,
    forms: SecretForms,
    secrets: &mut dyn Resolver,
) -> Result<Secret, SettingsError> {
    secrets
        .secret(&account.key(key), forms)?
        .ok_or_else(|| missing_token(account, key))
}

/// The error of an account without its token `key`: each account is its own bot, and the
/// token of the platform's own section is not inherited.
pub fn missing_token(account: &Account, key: &str) -> SettingsError {
    let name = account.platform();
    match account.name() {
        None => account.invalid(
            key,
            format!("the {name} channel is enabled but has no bot token: set token_env or token_file (or enabled = false), or give each bot a section channels.{name}.accounts.NAME with its token"),
        ),
        Some(a) => account.invalid(
            key,
            format!("the {name} account {a} has no bot token: each account is its own bot and needs its own token (token_env or token_file; it is not inherited from channels.{name}), or set enabled = false"),
        ),
    }
}

/// Refuse a URL setting that is not `http://` or `https://`.
///
/// # Errors
/// Another scheme, or none.
pub fn check_http_url(account: &Account, key: &str, url: &str) -> Result<(), SettingsError> {
    if url.starts_with("http://") || url.starts_with("https://") {
        return Ok(());
    }
    Err(account.invalid(
        key,
        format!("expected an http:// or https:// URL, got `{url}`"),
    ))
}

/// `text` with `secret` replaced by `[REDACTED]` (a secret under 6 characters would match too
/// much to be replaced).
pub fn redact(text: &str, secret: &str) -> String {
    if secret.len() >= 6 {
        text.replace(secret, "[REDACTED]")
    } else {
        text.to_string()
    }
}

/// The verdict of a token check against a platform's "who am I" endpoint: `answer` is its
/// HTTP status and JSON body, or why it could not be reached (the HTTP client's error). The platform's own error text
/// and the name of the bot are shown; the token never is.
pub fn token_verdict<E: fmt::Display>(
    account: &Account,
    answer: Result<(u16, serde_json::Value), E>,
    token: &Secret,
    token_key: &str,
) -> Verdict {
    let name = account.platform();
    match answer {
        Err(e) => Verdict::Fail(format!(
            "{name} API unreachable: {}",
            redact(&e.to_string(), token.expose())
        )),
        Ok((status, body)) => {
            let accepted =
                (200..300).contains(&status) && body["ok"] != serde_json::Value::Bool(false);
            if accepted {
                let who = body["result"]["username"]
                    .as_str()
                    .or_else(|| body["username"].as_str())
                    .or_else(|| body["user"].as_str())
                    .or_else(|| body["verified_name"].as_str())
                    .or_else(|| body["user_id"].as_str())
                    .unwrap_or("?");
                Verdict::Ok(format!("token accepted (bot {who})"))
            } else {
                Verdict::Fail(format!(
                    "the {name} API refused the token (HTTP {status}{}): set {} (token_env / token_file)",
                    body["error"]
                        .as_str()
                        .or_else(|| body["description"].as_str())
                        .map(|e| format!(", {e}"))
                        .unwrap_or_default(),
                    account.key(token_key)
                ))
            }
        }
    }
}

/// The keys a settings file type takes, as serde names them (aliases included): those of a
/// plain struct deriving `Deserialize`, empty for anything else.
pub fn file_keys<F: DeserializeOwned>() -> &'static [&'static str] {
    let mut probe = Probe(&[]);
    // The probe always ends the deserialisation with its error, having seen the fields.
    let _ = F::deserialize(&mut probe);
    probe.0
}

/// A deserializer that only records the field names a struct asks for.
struct Probe(&'static [&'static str]);

/// How [`Probe`] ends every deserialisation.
#[derive(Debug)]
struct ProbeEnd;

impl fmt::Display for ProbeEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("probed")
    }
}

impl std::error::Error for ProbeEnd {}

impl serde::de::Error for ProbeEnd {
    fn custom<T: fmt::Display>(_: T) -> Self {
        ProbeEnd
    }
}

impl<'de> serde::Deserializer<'de> for &mut Probe {
    type Error = ProbeEnd;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, ProbeEnd> {
        Err(ProbeEnd)
    }

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, ProbeEnd> {
        self.0 = fields;
        Err(ProbeEnd)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// A [`Resolver`] for tests of a platform's settings: secrets written inline are taken as they
/// are, the `*_env` and `*_file` forms are refused as unreadable; paths are relative to a fixed
/// directory.
#[cfg(any(test, feature = "testing"))]
pub struct InlineSecrets {
    /// What `config_path` resolves relative paths against.
    pub config_dir: PathBuf,
    /// Every secret resolved, in order.
    pub seen: Vec<Secret>,
}

#[cfg(any(test, feature = "testing"))]
impl Resolver for InlineSecrets {
    fn secret(&mut self, key: &str, forms: SecretForms) -> Result<Option<Secret>, SettingsError> {
        if forms.env.is_some() || forms.file.is_some() {
            return Err(SettingsError::Secret {
                key: key.to_string(),
                detail: "only inline secrets in this test".into(),
            });
        }
        let s = forms.inline.map(Secret::new);
        self.seen.extend(s.clone());
        Ok(s)
    }

    fn config_path(&self, path: &str) -> PathBuf {
        self.config_dir.join(path)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct Own {
        #[serde(alias = "access_token")]
        token: Option<String>,
        api_url: Option<String>,
    }

    #[test]
    fn the_keys_of_a_file_type_include_its_aliases() {
        assert_eq!(file_keys::<Own>(), ["access_token", "token", "api_url"]);
        assert!(file_keys::<String>().is_empty());
    }

    #[test]
    fn an_account_names_its_keys_and_its_channel() {
        let top = Account::new("telegram", None);
        let work = Account::new("telegram", Some("work"));
        assert_eq!(top.key("token"), "channels.telegram.token");
        assert_eq!(work.key("token"), "channels.telegram.accounts.work.token");
        assert_eq!(top.channel_id().as_str(), "telegram");
        assert_eq!(work.channel_id().as_str(), "telegram.work");
    }

    #[test]
    fn a_token_check_never_shows_the_token() {
        let a = Account::new("telegram", None);
        let t = Secret::new("123456:SECRET");
        let e = std::io::Error::other("GET /bot123456:SECRET/getMe: refused");
        let v = token_verdict(&a, Err(e), &t, "token");
        assert_eq!(
            v,
            Verdict::Fail("telegram API unreachable: GET /bot[REDACTED]/getMe: refused".into())
        );
        let v = token_verdict(
            &a,
            Ok::<_, std::io::Error>((
                401,
                serde_json::json!({"ok": false, "description": "Unauthorized"}),
            )),
            &t,
            "token",
        );
        assert_eq!(
            v,
            Verdict::Fail("the telegram API refused the token (HTTP 401, Unauthorized): set channels.telegram.token (token_env / token_file)".into())
        );
        let v = token_verdict(
            &a,
            Ok::<_, std::io::Error>((
                200,
                serde_json::json!({"ok": true, "result": {"username": "bot"}}),
            )),
            &t,
            "token",
        );
        assert_eq!(v, Verdict::Ok("token accepted (bot bot)".into()));
    }
}
