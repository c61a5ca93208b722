//! `[channels.email]`: one mailbox read over IMAP and answered over SMTP (docs/channels.md,
//! "Email").

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::env::Env;
use super::secrets::resolve_service_secret;
use super::types::{
    channel_key, ChatChannelConfig, ConfigError, Platform, DEFAULT_MAX_CHATS_IN_FLIGHT,
};
use crate::types::Secret;

/// `[channels.email]` as written.
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EmailFile {
    /// Run this channel (default true when the section is present).
    pub enabled: Option<bool>,
    /// IMAP server host.
    pub imap_host: Option<String>,
    /// IMAP port (default 993 with `imap_tls = "implicit"`, else 143).
    pub imap_port: Option<u16>,
    /// `implicit` (default), `starttls` or `none` (only to a loopback address).
    pub imap_tls: Option<String>,
    /// SMTP submission host (default: `imap_host`).
    pub smtp_host: Option<String>,
    /// SMTP port (default 465 with `smtp_tls = "implicit"`, 587 with `starttls`, 25 with
    /// `none`).
    pub smtp_port: Option<u16>,
    /// `starttls` (default), `implicit` or `none` (only to a loopback address).
    pub smtp_tls: Option<String>,
    /// Login name for IMAP and SMTP (default: `address`).
    pub username: Option<String>,
    /// Password, inline (prefer `password_env` or `password_file`).
    pub password: Option<String>,
    /// Environment variable holding the password.
    pub password_env: Option<String>,
    /// File holding the password (relative paths resolve in `$CREDENTIALS_DIRECTORY`).
    pub password_file: Option<String>,
    /// The bot's address: `From:` of its mail.
    pub address: Option<String>,
    /// Display name on `From:`.
    pub from_name: Option<String>,
    /// The mailbox read (default `INBOX`).
    pub mailbox: Option<String>,
    /// A mailbox that keeps a copy of every mail sent, looked up before a resend (e.g.
    /// `Sent`). Default: none.
    pub sent_mailbox: Option<String>,
    /// Addresses allowed to talk to the bot. Empty: nobody (unless paired).
    pub allow_from: Option<Vec<String>>,
    /// Give unknown senders a one-time pairing code by mail (default false).
    pub pairing: Option<bool>,
    /// The `authserv-id` of the receiving mail server's `Authentication-Results` headers: a
    /// mail is read only when that server reports DMARC, or aligned DKIM or SPF, passed.
    pub authserv_id: Option<String>,
    /// `"unchecked"`: the server does no sender checks, `From:` is taken as written (only
    /// reported failures are refused). Required when `authserv_id` is not set.
    pub sender_auth: Option<String>,
    /// Seconds one IMAP IDLE lasts before it is renewed (default 600, 60 to 1740).
    pub idle_timeout_secs: Option<u64>,
    /// Largest inbound mail read, in MB (default 25).
    pub max_mail_mb: Option<u64>,
    /// Largest total of files attached to one outbound mail, in MB (default 20).
    pub max_upload_mb: Option<u64>,
    /// Replies of how many threads may be sent at the same time (default 8).
    pub max_chats_in_flight: Option<usize>,
    /// A PEM file of the CA certificates to trust for IMAP and SMTP instead of the public
    /// roots (a private CA, a self-signed server); relative to the config file.
    pub tls_ca_file: Option<String>,
    /// More mailboxes, by account name (`a-z`, `0-9`, `_`, `-`; at most 32): each is the
    /// channel `email.NAME` with its own `address`, `username` and password, and inherits every
    /// other key it does not set from this section.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub accounts: std::collections::BTreeMap<String, EmailFile>,
}

/// How `From:` is believed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SenderAuthSetting {
    /// Require a pass from this authserv-id.
    Trusted(String),
    /// The server checks nothing.
    Unchecked,
}

/// TLS of one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MailTls {
    /// TLS from the first byte.
    Implicit,
    /// `STARTTLS`.
    StartTls,
    /// None (loopback only).
    None,
}

/// Validated `[channels.email]`.
#[derive(Clone, Debug, PartialEq)]
pub struct EmailSettings {
    /// IMAP host.
    pub imap_host: String,
    /// IMAP port.
    pub imap_port: u16,
    /// IMAP TLS.
    pub imap_tls: MailTls,
    /// SMTP host.
    pub smtp_host: String,
    /// SMTP port.
    pub smtp_port: u16,
    /// SMTP TLS.
    pub smtp_tls: MailTls,
    /// Login name.
    pub username: String,
    /// The bot's address.
    pub address: String,
    /// Display name.
    pub from_name: Option<String>,
    /// Mailbox read.
    pub mailbox: String,
    /// Mailbox of sent copies.
    pub sent_mailbox: Option<String>,
    /// Sender authentication.
    pub sender_auth: SenderAuthSetting,
    /// IDLE renewal.
    pub idle_timeout: Duration,
    /// Largest inbound mail, bytes.
    pub max_mail_bytes: u64,
    /// Largest outbound attachments, bytes.
    pub max_upload_bytes: u64,
    /// CA certificates (PEM) trusted instead of the public roots.
    pub ca_pem: Option<Vec<u8>>,
}

/// Builds the errors of one account, named by its keys.
struct Keys<'a>(Option<&'a str>);

impl Keys<'_> {
    fn key(&self, k: &str) -> String {
        channel_key(Platform::Email, self.0, k)
    }

    fn invalid(&self, k: &str, detail: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            key: self.key(k),
            detail: detail.into(),
        }
    }
}

fn is_loopback(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost")
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn tls(
    keys: &Keys<'_>,
    k: &str,
    v: Option<&str>,
    default: MailTls,
    host: &str,
) -> Result<MailTls, ConfigError> {
    let t = match v {
        None => default,
        Some("implicit") => MailTls::Implicit,
        Some("starttls") => MailTls::StartTls,
        Some("none") => MailTls::None,
        Some(other) => {
            return Err(keys.invalid(
                k,
                format!("expected \"implicit\", \"starttls\" or \"none\", got \"{other}\""),
            ))
        }
    };
    if t == MailTls::None && !is_loopback(host) {
        return Err(keys.invalid(
            k,
            format!("\"none\" sends the password in clear: it is allowed only to a loopback address, not {host}; use \"implicit\" or \"starttls\""),
        ));
    }
    Ok(t)
}

/// Whether `s` is a plain mail address (`local@domain.tld`).
pub fn is_address(s: &str) -> bool {
    let Some((local, domain)) = s.rsplit_once('@') else {
        return false;
    };
    !local.is_empty()
        && domain.contains('.')
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && !s.contains("..")
        && s.len() <= 254
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "@.!#$%&'*+-=?^_`{|}~".contains(c))
}

fn host(keys: &Keys<'_>, k: &str, v: Option<String>) -> Result<Option<String>, ConfigError> {
    match v.map(|h| h.trim().to_string()) {
        Some(h) if h.is_empty() || h.contains(['/', ':', ' ']) && !h.starts_with('[') => Err(keys
            .invalid(
                k,
                format!("expected a host name or address like mail.example.org, got `{h}`"),
            )),
        other => Ok(other),
    }
}

/// Resolve `[channels.email]` into the chat channel `email`, or `None` when absent or off.
///
/// # Errors
/// A missing or invalid setting, named by its key.
pub fn resolve(
    f: Option<EmailFile>,
    config_dir: &Path,
    env: &Env,
    secrets: &mut Vec<Secret>,
) -> Result<Vec<ChatChannelConfig>, ConfigError> {
    let Some(mut f) = f else {
        return Ok(Vec::new());
    };
    if !f.enabled.unwrap_or(true) {
        return Ok(Vec::new());
    }
    let accounts = std::mem::take(&mut f.accounts);
    let mut out = Vec::new();
    if f.address.is_some() || accounts.is_empty() {
        out.push(resolve_account(None, f.clone(), config_dir, env, secrets)?);
    }
    for (name, acc) in accounts {
        let keys = Keys(None);
        let k = format!("accounts.{name}");
        super::resolve::check_account_name(&name).map_err(|d| keys.invalid(&k, d))?;
        if !acc.accounts.is_empty() {
            return Err(keys.invalid(
                &format!("{k}.accounts"),
                "accounts do not nest: put every mailbox directly under channels.email.accounts",
            ));
        }
        if !acc.enabled.unwrap_or(true) {
            continue;
        }
        let merged = inherit(acc, &f);
        out.push(resolve_account(
            Some(&name),
            merged,
            config_dir,
            env,
            secrets,
        )?);
    }
    for (i, b) in out.iter().enumerate() {
        let addr = |c: &ChatChannelConfig| c.email.as_ref().map(|e| e.address.clone());
        if let Some(a) = out[..i].iter().find(|a| addr(a) == addr(b)) {
            return Err(ConfigError::Invalid {
                key: b.config_key("address"),
                detail: format!(
                    "`{}` and `{}` are the same mailbox: each account reads its own",
                    a.config_key("address"),
                    b.config_key("address")
                ),
            });
        }
    }
    Ok(out)
}

/// Account `acc` with every key it does not set taken from the section `top`, except the
/// mailbox itself (address, login and password).
fn inherit(acc: EmailFile, top: &EmailFile) -> EmailFile {
    let t = top.clone();
    EmailFile {
        enabled: acc.enabled,
        imap_host: acc.imap_host.or(t.imap_host),
        imap_port: acc.imap_port.or(t.imap_port),
        imap_tls: acc.imap_tls.or(t.imap_tls),
        smtp_host: acc.smtp_host.or(t.smtp_host),
        smtp_port: acc.smtp_port.or(t.smtp_port),
        smtp_tls: acc.smtp_tls.or(t.smtp_tls),
        username: acc.username,
        password: acc.password,
        password_env: acc.password_env,
        password_file: acc.password_file,
        address: acc.address,
        from_name: acc.from_name.or(t.from_name),
        mailbox: acc.mailbox.or(t.mailbox),
        sent_mailbox: acc.sent_mailbox.or(t.sent_mailbox),
        allow_from: acc.allow_from.or(t.allow_from),
        pairing: acc.pairing.or(t.pairing),
        // The two are one choice: an account that makes it does not inherit the other.
        authserv_id: acc.authserv_id.clone().or(if acc.sender_auth.is_some() {
            None
        } else {
            t.authserv_id
        }),
        sender_auth: acc.sender_auth.or(if acc.authserv_id.is_some() {
            None
        } else {
            t.sender_auth
        }),
        idle_timeout_secs: acc.idle_timeout_secs.or(t.idle_timeout_secs),
        max_mail_mb: acc.max_mail_mb.or(t.max_mail_mb),
        max_upload_mb: acc.max_upload_mb.or(t.max_upload_mb),
        max_chats_in_flight: acc.max_chats_in_flight.or(t.max_chats_in_flight),
        tls_ca_file: acc.tls_ca_file.or(t.tls_ca_file),
        accounts: std::collections::BTreeMap::new(),
    }
}

fn resolve_account(
    account: Option<&str>,
    f: EmailFile,
    config_dir: &Path,
    env: &Env,
    secrets: &mut Vec<Secret>,
) -> Result<ChatChannelConfig, ConfigError> {
    let keys = Keys(account);
    let address = f
        .address
        .as_deref()
        .map(|a| a.trim().to_ascii_lowercase())
        .ok_or_else(|| keys.invalid("address", "the email channel needs the bot's own address (the From: of its mail), e.g. address = \"assistant@example.org\""))?;
    if !is_address(&address) {
        return Err(keys.invalid(
            "address",
            format!("`{address}` is not a mail address like assistant@example.org"),
        ));
    }
    let imap_host = host(&keys, "imap_host", f.imap_host)?
        .ok_or_else(|| keys.invalid("imap_host", "the email channel reads its mailbox over IMAP: set imap_host (e.g. \"imap.example.org\")"))?;
    let smtp_host = host(&keys, "smtp_host", f.smtp_host)?.unwrap_or_else(|| imap_host.clone());
    let imap_tls = tls(
        &keys,
        "imap_tls",
        f.imap_tls.as_deref(),
        MailTls::Implicit,
        &imap_host,
    )?;
    let smtp_tls = tls(
        &keys,
        "smtp_tls",
        f.smtp_tls.as_deref(),
        MailTls::StartTls,
        &smtp_host,
    )?;
    let imap_port = f.imap_port.unwrap_or(match imap_tls {
        MailTls::Implicit => 993,
        _ => 143,
    });
    let smtp_port = f.smtp_port.unwrap_or(match smtp_tls {
        MailTls::Implicit => 465,
        MailTls::StartTls => 587,
        MailTls::None => 25,
    });
    for (k, p) in [("imap_port", imap_port), ("smtp_port", smtp_port)] {
        if p == 0 {
            return Err(keys.invalid(k, "must be a port number from 1 to 65535"));
        }
    }
    let password = resolve_service_secret(
        &keys.key("password"),
        f.password,
        f.password_env,
        f.password_file,
        config_dir,
        env,
    )?
    .ok_or_else(|| keys.invalid("password", "the email channel is enabled but has no password: set password_env or password_file (or enabled = false)"))?;
    if password.expose().contains(['\r', '\n']) {
        return Err(keys.invalid("password", "the password holds a line break (a file with a trailing newline is trimmed; check the value)"));
    }
    secrets.push(password.clone());
    let sender_auth = match (f.authserv_id, f.sender_auth.as_deref()) {
        (Some(_), Some(_)) => {
            return Err(keys.invalid("sender_auth", "set either authserv_id (require the server's passing Authentication-Results) or sender_auth = \"unchecked\", not both"))
        }
        (Some(id), None) if !id.trim().is_empty() && !id.contains([';', ' ']) => {
            SenderAuthSetting::Trusted(id.trim().to_ascii_lowercase())
        }
        (Some(id), None) => {
            return Err(keys.invalid("authserv_id", format!("`{id}` is not an authserv-id: use the name your mail server writes first in its Authentication-Results headers, like mx.example.org")))
        }
        (None, Some("unchecked")) => SenderAuthSetting::Unchecked,
        (None, Some(other)) => {
            return Err(keys.invalid("sender_auth", format!("expected \"unchecked\", got \"{other}\" (to require checked senders, set authserv_id instead)")))
        }
        (None, None) => {
            return Err(keys.invalid("authserv_id", "anyone can write any From: address, so the email channel must know how senders are checked: set authserv_id to the name your mail server writes in its Authentication-Results headers (mail is then read only when SPF, DKIM or DMARC passed), or sender_auth = \"unchecked\" if the server checks nothing and you accept that From: can be forged"))
        }
    };
    let mut allow_from = BTreeSet::new();
    for a in f.allow_from.unwrap_or_default() {
        let a = a.trim().to_ascii_lowercase();
        if a.is_empty() {
            continue;
        }
        if !is_address(&a) {
            return Err(keys.invalid("allow_from", format!("`{a}` is not a mail address: allow_from lists the addresses allowed to write to the bot, like alice@example.org")));
        }
        allow_from.insert(a);
    }
    let pairing = f.pairing.unwrap_or(false);
    if allow_from.is_empty() && !pairing {
        tracing::warn!(
            "channels.email.allow_from is empty and pairing is off: nobody can write to this bot"
        );
    }
    let idle = f.idle_timeout_secs.unwrap_or(600);
    if !(60..=1740).contains(&idle) {
        return Err(keys.invalid(
            "idle_timeout_secs",
            format!("must be from 60 to 1740 (servers end an IDLE after 30 minutes), got {idle}"),
        ));
    }
    let mb = |k: &str, v: Option<u64>, d: u64| -> Result<u64, ConfigError> {
        match v.unwrap_or(d) {
            n @ 1..=2000 => Ok(n * 1024 * 1024),
            n => Err(keys.invalid(k, format!("must be from 1 to 2000 (MB), got {n}"))),
        }
    };
    let ca_pem = match &f.tls_ca_file {
        None => None,
        Some(p) => {
            let path = config_dir.join(p);
            let pem = std::fs::read(&path).map_err(|e| {
                keys.invalid(
                    "tls_ca_file",
                    format!("cannot read {}: {e}", path.display()),
                )
            })?;
            check_ca_pem(&pem)
                .map_err(|e| keys.invalid("tls_ca_file", format!("{}: {e}", path.display())))?;
            Some(pem)
        }
    };
    let settings = EmailSettings {
        username: f
            .username
            .map(|u| u.trim().to_string())
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| address.clone()),
        address,
        imap_host,
        imap_port,
        imap_tls,
        smtp_host,
        smtp_port,
        smtp_tls,
        from_name: f.from_name.filter(|n| !n.trim().is_empty()),
        mailbox: f.mailbox.unwrap_or_else(|| "INBOX".into()),
        sent_mailbox: f.sent_mailbox.filter(|m| !m.trim().is_empty()),
        sender_auth,
        idle_timeout: Duration::from_secs(idle),
        max_mail_bytes: mb("max_mail_mb", f.max_mail_mb, 25)?,
        max_upload_bytes: mb("max_upload_mb", f.max_upload_mb, 20)?,
        ca_pem,
    };
    Ok(ChatChannelConfig {
        platform: Platform::Email,
        account: account.map(str::to_string),
        token: password,
        app_token: None,
        allow_from,
        pairing,
        group_all: false,
        per_user_sessions: false,
        api_url: None,
        api_base_url: None,
        gateway_url: None,
        stream_edits: false,
        edit_interval: Duration::from_millis(1500),
        max_chats_in_flight: match f.max_chats_in_flight {
            None => DEFAULT_MAX_CHATS_IN_FLIGHT,
            Some(0) => {
                return Err(keys.invalid("max_chats_in_flight", "must be at least 1 (default 8)"))
            }
            Some(n) => n,
        },
        email: Some(Box::new(settings)),
        whatsapp: None,
        homeserver: None,
        user_id: None,
        number: None,
    })
}

/// Whether `pem` holds at least one certificate (checked at load, so a wrong file is an error
/// naming the key rather than a failed connection later).
fn check_ca_pem(pem: &[u8]) -> Result<(), String> {
    let text = String::from_utf8_lossy(pem);
    let n = text.matches("-----BEGIN CERTIFICATE-----").count();
    if n == 0 || n != text.matches("-----END CERTIFICATE-----").count() {
        return Err("no PEM certificate (-----BEGIN CERTIFICATE-----) in it".into());
    }
    Ok(())
}
