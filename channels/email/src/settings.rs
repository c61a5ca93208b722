//! The email channel's side of the platform contract ([`Email`]): the keys of
//! `[channels.email]` (and of each account: one mailbox each) as written, their defaults and
//! validation (TLS modes, how senders are believed, sizes, a private CA), the constructor from
//! them, the resume key and what `weft doctor` checks (an IMAP login). Reads no environment:
//! the password comes through the gateway's [`Resolver`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawft_channel_core::secret::Secret;
use clawft_channel_core::spec::{
    redact, Account, ChannelSetup, Handles, Intake, PlatformSpec, Resolver, Resume, SecretForms,
    SettingsError, Verdict,
};
use clawft_channel_core::{Channel, ChannelError};
use serde::{Deserialize, Serialize};

use crate::imap::Imap;
use crate::{is_address, EmailChannel, EmailConfig, SenderAuth, TlsMode, CURSOR_KEY};

/// The email platform (`[channels.email]`).
pub struct Email;

/// The email channel's own keys of `[channels.email]` and of each account.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct EmailFile {
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
    /// A PEM file of the CA certificates to trust for IMAP and SMTP instead of the public
    /// roots (a private CA, a self-signed server); relative to the config file.
    pub tls_ca_file: Option<String>,
}

/// Validated settings of one mailbox.
#[derive(Clone, Debug, PartialEq)]
pub struct EmailSettings {
    /// IMAP host.
    pub imap_host: String,
    /// IMAP port.
    pub imap_port: u16,
    /// IMAP TLS.
    pub imap_tls: TlsMode,
    /// SMTP host.
    pub smtp_host: String,
    /// SMTP port.
    pub smtp_port: u16,
    /// SMTP TLS.
    pub smtp_tls: TlsMode,
    /// Login name.
    pub username: String,
    /// The password (IMAP and SMTP).
    pub password: Secret,
    /// The bot's address.
    pub address: String,
    /// Display name.
    pub from_name: Option<String>,
    /// Mailbox read.
    pub mailbox: String,
    /// Mailbox of sent copies.
    pub sent_mailbox: Option<String>,
    /// How `From:` is believed.
    pub sender_auth: SenderAuth,
    /// IDLE renewal.
    pub idle_timeout: Duration,
    /// Largest inbound mail, bytes.
    pub max_mail_bytes: u64,
    /// Largest outbound attachments, bytes.
    pub max_upload_bytes: u64,
    /// CA certificates (PEM) trusted instead of the public roots.
    pub ca_pem: Option<Vec<u8>>,
}

fn is_loopback(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost")
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The TLS mode of setting `k` (`default` when unset); `none` only to a loopback `host`.
fn tls(
    account: &Account,
    k: &str,
    v: Option<&str>,
    default: TlsMode,
    host: &str,
) -> Result<TlsMode, SettingsError> {
    let t = match v {
        None => default,
        Some("implicit") => TlsMode::Implicit,
        Some("starttls") => TlsMode::StartTls,
        Some("none") => TlsMode::None,
        Some(other) => {
            return Err(account.invalid(
                k,
                format!("expected \"implicit\", \"starttls\" or \"none\", got \"{other}\""),
            ))
        }
    };
    if t == TlsMode::None && !is_loopback(host) {
        return Err(account.invalid(
            k,
            format!("\"none\" sends the password in clear: it is allowed only to a loopback address, not {host}; use \"implicit\" or \"starttls\""),
        ));
    }
    Ok(t)
}

/// The host of setting `k`, trimmed, if set.
fn host(account: &Account, k: &str, v: Option<String>) -> Result<Option<String>, SettingsError> {
    match v.map(|h| h.trim().to_string()) {
        Some(h) if h.is_empty() || h.contains(['/', ':', ' ']) && !h.starts_with('[') => {
            Err(account.invalid(
                k,
                format!("expected a host name or address like mail.example.org, got `{h}`"),
            ))
        }
        other => Ok(other),
    }
}

/// How senders are believed: `authserv_id` (require a pass from it) or `sender_auth =
/// "unchecked"`, exactly one of them.
fn sender_auth(
    account: &Account,
    authserv_id: Option<String>,
    sender_auth: Option<&str>,
) -> Result<SenderAuth, SettingsError> {
    match (authserv_id, sender_auth) {
        (Some(_), Some(_)) => Err(account.invalid("sender_auth", "set either authserv_id (require the server's passing Authentication-Results) or sender_auth = \"unchecked\", not both")),
        (Some(id), None) if !id.trim().is_empty() && !id.contains([';', ' ']) => {
            Ok(SenderAuth::Trusted(id.trim().to_ascii_lowercase()))
        }
        (Some(id), None) => Err(account.invalid("authserv_id", format!("`{id}` is not an authserv-id: use the name your mail server writes first in its Authentication-Results headers, like mx.example.org"))),
        (None, Some("unchecked")) => Ok(SenderAuth::Unchecked),
        (None, Some(other)) => Err(account.invalid("sender_auth", format!("expected \"unchecked\", got \"{other}\" (to require checked senders, set authserv_id instead)"))),
        (None, None) => Err(account.invalid("authserv_id", "anyone can write any From: address, so the email channel must know how senders are checked: set authserv_id to the name your mail server writes in its Authentication-Results headers (mail is then read only when SPF, DKIM or DMARC passed), or sender_auth = \"unchecked\" if the server checks nothing and you accept that From: can be forged")),
    }
}

/// Whether `pem` holds at least one certificate (checked at load, so a wrong file is an error
/// naming the key rather than a failed connection later).
fn has_certificates(pem: &[u8]) -> bool {
    let text = String::from_utf8_lossy(pem);
    let n = text.matches("-----BEGIN CERTIFICATE-----").count();
    n > 0 && n == text.matches("-----END CERTIFICATE-----").count()
}

impl PlatformSpec for Email {
    type File = EmailFile;
    type Settings = EmailSettings;

    const INTAKE: Intake = Intake::Connection(Resume::Keys(&[CURSOR_KEY]));
    const ACCOUNT: &'static str = "mailbox";
    const CHAT_KEYS: bool = false;

    fn names_account(f: &EmailFile) -> bool {
        f.address.is_some()
    }

    /// Every key but the mailbox itself (address, login and password).
    fn inherit(account: EmailFile, section: &EmailFile) -> EmailFile {
        let t = section.clone();
        EmailFile {
            imap_host: account.imap_host.or(t.imap_host),
            imap_port: account.imap_port.or(t.imap_port),
            imap_tls: account.imap_tls.or(t.imap_tls),
            smtp_host: account.smtp_host.or(t.smtp_host),
            smtp_port: account.smtp_port.or(t.smtp_port),
            smtp_tls: account.smtp_tls.or(t.smtp_tls),
            from_name: account.from_name.or(t.from_name),
            mailbox: account.mailbox.or(t.mailbox),
            sent_mailbox: account.sent_mailbox.or(t.sent_mailbox),
            // The two are one choice: an account that makes it does not inherit the other.
            authserv_id: account
                .authserv_id
                .clone()
                .or(if account.sender_auth.is_some() {
                    None
                } else {
                    t.authserv_id
                }),
            sender_auth: account
                .sender_auth
                .clone()
                .or(if account.authserv_id.is_some() {
                    None
                } else {
                    t.sender_auth
                }),
            idle_timeout_secs: account.idle_timeout_secs.or(t.idle_timeout_secs),
            max_mail_mb: account.max_mail_mb.or(t.max_mail_mb),
            max_upload_mb: account.max_upload_mb.or(t.max_upload_mb),
            tls_ca_file: account.tls_ca_file.or(t.tls_ca_file),
            ..account
        }
    }

    fn resolve(
        f: EmailFile,
        account: &Account,
        secrets: &mut dyn Resolver,
    ) -> Result<EmailSettings, SettingsError> {
        let address = f
            .address
            .as_deref()
            .map(|a| a.trim().to_ascii_lowercase())
            .ok_or_else(|| account.invalid("address", "the email channel needs the bot's own address (the From: of its mail), e.g. address = \"assistant@example.org\""))?;
        if !is_address(&address) {
            return Err(account.invalid(
                "address",
                format!("`{address}` is not a mail address like assistant@example.org"),
            ));
        }
        let imap_host = host(account, "imap_host", f.imap_host)?
            .ok_or_else(|| account.invalid("imap_host", "the email channel reads its mailbox over IMAP: set imap_host (e.g. \"imap.example.org\")"))?;
        let smtp_host =
            host(account, "smtp_host", f.smtp_host)?.unwrap_or_else(|| imap_host.clone());
        let imap_tls = tls(
            account,
            "imap_tls",
            f.imap_tls.as_deref(),
            TlsMode::Implicit,
            &imap_host,
        )?;
        let smtp_tls = tls(
            account,
            "smtp_tls",
            f.smtp_tls.as_deref(),
            TlsMode::StartTls,
            &smtp_host,
        )?;
        let imap_port = f.imap_port.unwrap_or(match imap_tls {
            TlsMode::Implicit => 993,
            TlsMode::StartTls | TlsMode::None => 143,
        });
        let smtp_port = f.smtp_port.unwrap_or(match smtp_tls {
            TlsMode::Implicit => 465,
            TlsMode::StartTls => 587,
            TlsMode::None => 25,
        });
        for (k, p) in [("imap_port", imap_port), ("smtp_port", smtp_port)] {
            if p == 0 {
                return Err(account.invalid(k, "must be a port number from 1 to 65535"));
            }
        }
        let forms = SecretForms::new(f.password, f.password_env, f.password_file);
        let password = secrets
            .secret(&account.key("password"), forms)?
            .ok_or_else(|| account.invalid("password", "the email channel is enabled but has no password: set password_env or password_file (or enabled = false)"))?;
        if password.expose().contains(['\r', '\n']) {
            return Err(account.invalid("password", "the password holds a line break (a file with a trailing newline is trimmed; check the value)"));
        }
        let sender_auth = sender_auth(account, f.authserv_id, f.sender_auth.as_deref())?;
        let idle = f.idle_timeout_secs.unwrap_or(600);
        if !(60..=1740).contains(&idle) {
            return Err(account.invalid(
                "idle_timeout_secs",
                format!(
                    "must be from 60 to 1740 (servers end an IDLE after 30 minutes), got {idle}"
                ),
            ));
        }
        let mb = |k: &str, v: Option<u64>, d: u64| -> Result<u64, SettingsError> {
            match v.unwrap_or(d) {
                n @ 1..=2000 => Ok(n * 1024 * 1024),
                n => Err(account.invalid(k, format!("must be from 1 to 2000 (MB), got {n}"))),
            }
        };
        let ca_pem = match &f.tls_ca_file {
            None => None,
            Some(p) => {
                let path = secrets.config_path(p);
                let pem = std::fs::read(&path).map_err(|e| {
                    account.invalid(
                        "tls_ca_file",
                        format!("cannot read {}: {e}", path.display()),
                    )
                })?;
                if !has_certificates(&pem) {
                    return Err(account.invalid(
                        "tls_ca_file",
                        format!(
                            "{}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
                            path.display()
                        ),
                    ));
                }
                Some(pem)
            }
        };
        Ok(EmailSettings {
            username: f
                .username
                .map(|u| u.trim().to_string())
                .filter(|u| !u.is_empty())
                .unwrap_or_else(|| address.clone()),
            password,
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
        })
    }

    fn user_id(id: &str, account: &Account) -> Result<String, SettingsError> {
        let a = id.to_ascii_lowercase();
        if is_address(&a) {
            return Ok(a);
        }
        Err(account.invalid("allow_from", format!("`{a}` is not a mail address: allow_from lists the addresses allowed to write to the bot, like alice@example.org")))
    }

    fn same_account(_what: &str, first: &str, second: &str) -> String {
        format!("`{first}` and `{second}` are the same mailbox: each account reads its own")
    }
}

#[async_trait]
impl ChannelSetup for EmailSettings {
    fn build(&self, h: Handles) -> Result<Arc<dyn Channel>, ChannelError> {
        Ok(Arc::new(EmailChannel::new(EmailConfig {
            id: h.account.channel_id(),
            imap_host: self.imap_host.clone(),
            imap_port: self.imap_port,
            imap_tls: self.imap_tls,
            smtp_host: self.smtp_host.clone(),
            smtp_port: self.smtp_port,
            smtp_tls: self.smtp_tls,
            username: self.username.clone(),
            password: self.password.expose().to_string(),
            address: self.address.clone(),
            from_name: self.from_name.clone(),
            mailbox: self.mailbox.clone(),
            sent_mailbox: self.sent_mailbox.clone(),
            sender_auth: self.sender_auth.clone(),
            idle_timeout: self.idle_timeout,
            max_mail_bytes: self.max_mail_bytes,
            max_upload_bytes: self.max_upload_bytes,
            ca_pem: self.ca_pem.clone(),
            state: h.state,
        })?))
    }

    fn identity(&self) -> Vec<(&'static str, &str)> {
        vec![("address", self.address.as_str())]
    }

    /// Log in to the IMAP server.
    async fn doctor(&self, _account: &Account, _timeout: Duration) -> Verdict {
        match Imap::login(
            &self.imap_host,
            self.imap_port,
            self.imap_tls,
            &self.username,
            self.password.expose(),
            1 << 20,
            self.ca_pem.as_deref(),
        )
        .await
        {
            Ok(imap) => {
                imap.logout().await;
                Verdict::Ok(format!(
                    "IMAP login as {} accepted by {}",
                    self.username, self.imap_host
                ))
            }
            Err(err) => Verdict::Fail(redact(&err.to_string(), self.password.expose())),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use clawft_channel_core::spec::InlineSecrets;

    fn file() -> EmailFile {
        EmailFile {
            imap_host: Some("imap.example.org".into()),
            address: Some("Bot@Example.org".into()),
            password: Some("p".into()),
            authserv_id: Some("MX.example.org".into()),
            ..EmailFile::default()
        }
    }

    fn resolve(f: EmailFile, account: Option<&str>) -> Result<EmailSettings, SettingsError> {
        let mut secrets = InlineSecrets {
            config_dir: "/etc/weft".into(),
            seen: Vec::new(),
        };
        Email::resolve(f, &Account::new("email", account), &mut secrets)
    }

    #[test]
    fn a_mailbox_gets_its_defaults() {
        let s = resolve(file(), None).unwrap();
        assert_eq!(s.address, "bot@example.org");
        assert_eq!(s.username, "bot@example.org");
        assert_eq!((s.imap_port, s.imap_tls), (993, TlsMode::Implicit));
        assert_eq!(s.smtp_host, "imap.example.org");
        assert_eq!((s.smtp_port, s.smtp_tls), (587, TlsMode::StartTls));
        assert_eq!(s.sender_auth, SenderAuth::Trusted("mx.example.org".into()));
        assert_eq!(s.mailbox, "INBOX");
        assert_eq!(s.idle_timeout, Duration::from_secs(600));
        assert_eq!(s.max_mail_bytes, 25 * 1024 * 1024);
        assert_eq!(s.identity(), [("address", "bot@example.org")]);
    }

    #[test]
    fn clear_text_is_only_for_loopback_and_errors_name_the_account_key() {
        let none = |host: &str| EmailFile {
            imap_host: Some(host.into()),
            imap_tls: Some("none".into()),
            ..file()
        };
        assert_eq!(resolve(none("127.0.0.1"), None).unwrap().imap_port, 143);
        let e = resolve(none("imap.example.org"), Some("work")).unwrap_err();
        let SettingsError::Invalid { key, detail } = e else {
            panic!("{e}")
        };
        assert_eq!(key, "channels.email.accounts.work.imap_tls");
        assert!(detail.contains("in clear"), "{detail}");
    }

    #[test]
    fn an_account_keeps_its_mailbox_and_makes_its_own_sender_choice() {
        let top = EmailFile {
            from_name: Some("Assistant".into()),
            ..file()
        };
        let acc = EmailFile {
            address: Some("work@example.org".into()),
            sender_auth: Some("unchecked".into()),
            ..EmailFile::default()
        };
        let merged = Email::inherit(acc, &top);
        assert_eq!(merged.address.as_deref(), Some("work@example.org"));
        assert_eq!(merged.password, None, "the password is the mailbox's own");
        assert_eq!(merged.imap_host, top.imap_host);
        assert_eq!(merged.from_name.as_deref(), Some("Assistant"));
        assert_eq!(merged.authserv_id, None, "one choice with sender_auth");
    }
}
