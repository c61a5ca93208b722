//! The XMPP channel's side of the platform contract ([`Xmpp`]): the keys of
//! `[channels.xmpp]` (and of each account: one JID each) as written, their validation (the
//! JID, the server and its TLS, a private CA), the constructor from them and what `weft
//! doctor` checks (a login). Reads no environment: the password comes through the gateway's
//! [`Resolver`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawft_channel_core::secret::Secret;
use clawft_channel_core::spec::{
    redact, Account, ChannelSetup, Handles, Intake, PlatformSpec, Resolver, Resume, SecretForms,
    SettingsError, Verdict, PAIRING_HINT,
};
use clawft_channel_core::{Channel, ChannelError};
use serde::{Deserialize, Serialize};

use crate::conn::{self, Login, TlsMode};
use crate::{is_bare_jid, XmppChannel, XmppConfig};

/// The XMPP platform (`[channels.xmpp]`).
pub struct Xmpp;

/// The XMPP channel's own keys of `[channels.xmpp]` and of each account.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct XmppFile {
    /// The bot's account, a bare JID (`assistant@example.org`).
    pub jid: Option<String>,
    /// Its password, inline (prefer `password_env` or `password_file`).
    pub password: Option<String>,
    /// Environment variable holding the password.
    pub password_env: Option<String>,
    /// File holding the password (relative paths resolve in `$CREDENTIALS_DIRECTORY`).
    pub password_file: Option<String>,
    /// The server to connect to (default: the JID's domain).
    pub host: Option<String>,
    /// Its port (default 5222 with `tls = "starttls"`, 5223 with `direct`).
    pub port: Option<u16>,
    /// `starttls` (default) or `direct` (XEP-0368 direct TLS).
    pub tls: Option<String>,
    /// The resource bound (default `weft`).
    pub resource: Option<String>,
    /// A PEM file of the CA certificates to trust instead of the public roots (a private CA, a
    /// self-signed server); relative to the config file.
    pub tls_ca_file: Option<String>,
}

/// Validated settings of one XMPP account.
#[derive(Clone, Debug, PartialEq)]
pub struct XmppSettings {
    /// The bare JID.
    pub jid: String,
    /// Its password.
    pub password: Secret,
    /// Server host.
    pub host: String,
    /// Server port.
    pub port: u16,
    /// TLS mode.
    pub tls: TlsMode,
    /// Resource.
    pub resource: String,
    /// CA certificates (PEM) trusted instead of the public roots.
    pub ca_pem: Option<Vec<u8>>,
}

impl XmppSettings {
    fn login(&self, timeout: Duration) -> Login {
        Login {
            host: self.host.clone(),
            port: self.port,
            tls: self.tls,
            jid: self.jid.clone(),
            password: self.password.expose().to_string(),
            resource: self.resource.clone(),
            ca_pem: self.ca_pem.clone(),
            timeout,
        }
    }
}

impl PlatformSpec for Xmpp {
    type File = XmppFile;
    type Settings = XmppSettings;

    /// The server keeps what arrives while the bot is offline (offline storage) and hands it
    /// over at the next login.
    const INTAKE: Intake = Intake::Connection(Resume::Redelivered);
    const NO_STREAMING: Option<&'static str> = Some("XMPP replies are sent whole for now (message corrections, XEP-0308, are not used yet), so the xmpp channel does not stream");

    fn names_account(f: &XmppFile) -> bool {
        f.jid.is_some()
    }

    /// Every key but the account itself (JID and password).
    fn inherit(account: XmppFile, section: &XmppFile) -> XmppFile {
        let t = section.clone();
        XmppFile {
            host: account.host.or(t.host),
            port: account.port.or(t.port),
            tls: account.tls.or(t.tls),
            resource: account.resource.or(t.resource),
            tls_ca_file: account.tls_ca_file.or(t.tls_ca_file),
            ..account
        }
    }

    fn resolve(
        f: XmppFile,
        account: &Account,
        secrets: &mut dyn Resolver,
    ) -> Result<XmppSettings, SettingsError> {
        let jid = match f.jid.as_deref().map(str::trim) {
            Some(j) if is_bare_jid(j) => j.to_lowercase(),
            Some(j) => return Err(account.invalid("jid", format!("`{j}` is not a bare JID: write the bot's account as user@domain, like \"assistant@example.org\" (no /resource)"))),
            None => return Err(account.invalid("jid", "the xmpp channel needs the bot's account: jid = \"assistant@example.org\" (create it on your server first)")),
        };
        let domain = jid.split_once('@').map_or("", |(_, d)| d).to_string();
        let tls = match f.tls.as_deref() {
            None | Some("starttls") => TlsMode::StartTls,
            Some("direct") => TlsMode::Direct,
            Some(other) => return Err(account.invalid("tls", format!("expected \"starttls\" or \"direct\", got \"{other}\" (there is no plain-text mode: the password is never sent without TLS)"))),
        };
        let host = f.host.map(|h| h.trim().to_string()).unwrap_or(domain);
        if host.is_empty() || host.contains(['/', ' ']) {
            return Err(account.invalid(
                "host",
                format!("expected a host name or address like xmpp.example.org, got `{host}`"),
            ));
        }
        let port = f.port.unwrap_or(match tls {
            TlsMode::StartTls => 5222,
            TlsMode::Direct => 5223,
        });
        if port == 0 {
            return Err(account.invalid("port", "must be a port number from 1 to 65535"));
        }
        let forms = SecretForms::new(f.password, f.password_env, f.password_file);
        let password = secrets
            .secret(&account.key("password"), forms)?
            .ok_or_else(|| account.invalid("password", "the xmpp channel is enabled but has no password: set password_env or password_file (or enabled = false)"))?;
        let resource = f.resource.unwrap_or_else(|| "weft".into());
        if resource.trim().is_empty() {
            return Err(account.invalid("resource", "must not be empty"));
        }
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
                if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
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
        Ok(XmppSettings {
            jid,
            password,
            host,
            port,
            tls,
            resource,
            ca_pem,
        })
    }

    fn user_id(id: &str, account: &Account) -> Result<String, SettingsError> {
        if is_bare_jid(id) {
            return Ok(id.to_lowercase());
        }
        Err(account.invalid(
            "allow_from",
            format!("`{id}` is not an XMPP user: write bare JIDs like \"alice@example.org\" (no /resource), {PAIRING_HINT}"),
        ))
    }
}

#[async_trait]
impl ChannelSetup for XmppSettings {
    fn build(&self, h: Handles) -> Result<Arc<dyn Channel>, ChannelError> {
        let mut cfg = XmppConfig::new(self.login(Duration::from_secs(30)));
        cfg.id = h.account.channel_id();
        cfg.allow_from = h.shared.allow_from;
        cfg.is_paired = h.is_paired;
        cfg.state = h.state;
        Ok(Arc::new(XmppChannel::new(cfg)))
    }

    fn identity(&self) -> Vec<(&'static str, &str)> {
        vec![("jid", self.jid.as_str())]
    }

    fn account_label(&self) -> Option<(&'static str, String)> {
        Some(("jid", self.jid.clone()))
    }

    /// A login: TLS, SCRAM and a bound resource (the stream is closed at once).
    async fn doctor(&self, account: &Account, timeout: Duration) -> Verdict {
        let mut l = self.login(timeout);
        l.resource = format!("{}-doctor", self.resource);
        match conn::connect(&l).await {
            Ok(mut s) => {
                use tokio::io::AsyncWriteExt;
                let _ = s.stream.write_all(b"</stream:stream>").await;
                Verdict::Ok(format!(
                    "logged in to {}:{} as {}",
                    self.host, self.port, s.bound
                ))
            }
            Err(e) => {
                let detail = redact(&e.to_string(), self.password.expose());
                let fix = match e {
                    conn::ConnError::Auth(_) => format!(
                        "check {} and {}",
                        account.key("jid"),
                        account.key("password")
                    ),
                    conn::ConnError::Unsupported(_) => {
                        "the server must offer TLS and a SCRAM login".to_string()
                    }
                    conn::ConnError::Io(_)
                    | conn::ConnError::Xml(_)
                    | conn::ConnError::Closed(_) => format!(
                        "check {} and {} (and {} for a private CA)",
                        account.key("host"),
                        account.key("port"),
                        account.key("tls_ca_file")
                    ),
                };
                Verdict::Fail(format!("{}:{}: {detail}: {fix}", self.host, self.port))
            }
        }
    }
}
