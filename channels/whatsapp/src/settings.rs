//! The WhatsApp channel's side of the platform contract ([`WhatsApp`]): the keys of
//! `channels.whatsapp` (and of each account: one phone number each) as written, their
//! validation, the constructor from them and what `weft doctor` checks. Messages arrive as
//! webhooks on every node: nothing to resume, no lease. Reads no environment: secrets come
//! through the gateway's [`Resolver`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawft_channel_core::secret::Secret;
use clawft_channel_core::spec::{
    check_http_url, require_token, token_verdict, Account, ChannelSetup, Handles, Intake,
    PlatformSpec, Resolver, SecretForms, SettingsError, Verdict, PAIRING_HINT,
};
use clawft_channel_core::{Channel, ChannelError};
use serde::{Deserialize, Serialize};

use crate::{Template, WhatsAppChannel, WhatsAppConfig, DEFAULT_API_URL, DEFAULT_API_VERSION};

/// The WhatsApp platform (`channels.whatsapp`).
pub struct WhatsApp;

/// WhatsApp's own keys of `channels.whatsapp` and of each account.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct WhatsAppFile {
    /// The access token (a system user's permanent token), inline (prefer `token_env` or
    /// `token_file`).
    #[serde(alias = "access_token")]
    pub token: Option<String>,
    /// Environment variable holding the access token.
    #[serde(alias = "access_token_env")]
    pub token_env: Option<String>,
    /// File holding the access token (relative paths resolve in `$CREDENTIALS_DIRECTORY`).
    #[serde(alias = "access_token_file")]
    pub token_file: Option<String>,
    /// The business phone number's id (WhatsApp Manager → API Setup).
    pub phone_number_id: Option<String>,
    /// The app secret that signs webhooks, inline (prefer the env or file).
    pub app_secret: Option<String>,
    /// Environment variable holding the app secret.
    pub app_secret_env: Option<String>,
    /// File holding the app secret.
    pub app_secret_file: Option<String>,
    /// The webhook verify token (any string you also give Meta), inline.
    pub verify_token: Option<String>,
    /// Environment variable holding the verify token.
    pub verify_token_env: Option<String>,
    /// File holding the verify token.
    pub verify_token_file: Option<String>,
    /// Graph API version (default `v21.0`).
    pub api_version: Option<String>,
    /// An approved template sent instead of a reply outside the 24-hour customer-service
    /// window (without it such a reply fails with a clear error).
    pub template: Option<String>,
    /// The template's language code (default `en_US`).
    pub template_language: Option<String>,
    /// The Graph API origin (a proxy).
    pub api_url: Option<String>,
}

/// Validated settings of one WhatsApp phone number.
#[derive(Clone, Debug, PartialEq)]
pub struct WhatsAppSettings {
    /// The access token.
    pub token: Secret,
    /// The business phone number's id.
    pub phone_number_id: String,
    /// The app secret that signs webhooks.
    pub app_secret: Secret,
    /// The webhook verify token.
    pub verify_token: Secret,
    /// The Graph API version.
    pub api_version: String,
    /// The template sent instead of a reply outside the 24-hour window.
    pub template: Option<Template>,
    /// The Graph API origin, when not Meta's.
    pub api_url: Option<String>,
}

impl PlatformSpec for WhatsApp {
    type File = WhatsAppFile;
    type Settings = WhatsAppSettings;

    const INTAKE: Intake = Intake::Webhooks {
        without_listener: "WhatsApp delivers messages as webhooks to the HTTP listener, and channels.http.enabled is false: enable the HTTP API (behind a reverse proxy for Meta) or disable this channel",
    };

    fn names_account(f: &WhatsAppFile) -> bool {
        f.token.is_some() || f.token_env.is_some() || f.token_file.is_some()
    }

    /// Each account is its own phone number (and token); one app (secret, verify token,
    /// template) may serve several.
    fn inherit(account: WhatsAppFile, section: &WhatsAppFile) -> WhatsAppFile {
        let s = section.clone();
        WhatsAppFile {
            app_secret: account.app_secret.or(s.app_secret),
            app_secret_env: account.app_secret_env.or(s.app_secret_env),
            app_secret_file: account.app_secret_file.or(s.app_secret_file),
            verify_token: account.verify_token.or(s.verify_token),
            verify_token_env: account.verify_token_env.or(s.verify_token_env),
            verify_token_file: account.verify_token_file.or(s.verify_token_file),
            api_version: account.api_version.or(s.api_version),
            template: account.template.or(s.template),
            template_language: account.template_language.or(s.template_language),
            api_url: account.api_url.or(s.api_url),
            ..account
        }
    }

    fn resolve(
        f: WhatsAppFile,
        account: &Account,
        secrets: &mut dyn Resolver,
    ) -> Result<WhatsAppSettings, SettingsError> {
        let phone_number_id = f.phone_number_id.unwrap_or_default();
        if phone_number_id.is_empty() || !phone_number_id.bytes().all(|b| b.is_ascii_digit()) {
            return Err(account.invalid(
                "phone_number_id",
                format!("expected the phone number's id (digits, WhatsApp Manager → API Setup → \"Phone number ID\"), not the phone number itself; got `{phone_number_id}`"),
            ));
        }
        let forms = SecretForms::new(f.app_secret, f.app_secret_env, f.app_secret_file);
        let app_secret = secrets.secret(&account.key("app_secret"), forms)?.ok_or_else(|| {
            account.invalid("app_secret", "webhooks are verified with the app secret (Meta app → App settings → Basic): set app_secret_env or app_secret_file")
        })?;
        let forms = SecretForms::new(f.verify_token, f.verify_token_env, f.verify_token_file);
        let verify_token = secrets.secret(&account.key("verify_token"), forms)?.ok_or_else(|| {
            account.invalid("verify_token", "Meta's webhook handshake needs a verify token (any random string you also enter in the app's Webhooks settings): set verify_token_env or verify_token_file")
        })?;
        let api_version = f.api_version.unwrap_or_else(|| DEFAULT_API_VERSION.into());
        let v = api_version.strip_prefix('v').unwrap_or("");
        if v.split('.').count() != 2
            || !v
                .split('.')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(account.invalid(
                "api_version",
                format!("expected a Graph API version like \"v21.0\", got `{api_version}`"),
            ));
        }
        let template = match f.template {
            None => {
                if f.template_language.is_some() {
                    return Err(account.invalid(
                        "template_language",
                        "template_language is the language of `template`, which is not set",
                    ));
                }
                None
            }
            Some(t) => {
                if t.is_empty()
                    || !t
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                {
                    return Err(account.invalid(
                        "template",
                        format!("template names are lower-case letters, digits and `_` (as approved in WhatsApp Manager), got `{t}`"),
                    ));
                }
                Some(Template {
                    name: t,
                    language: f.template_language.unwrap_or_else(|| "en_US".into()),
                })
            }
        };
        let forms = SecretForms::new(f.token, f.token_env, f.token_file);
        let token = require_token(account, "token", forms, secrets)?;
        if let Some(u) = &f.api_url {
            check_http_url(account, "api_url", u)?;
        }
        Ok(WhatsAppSettings {
            token,
            phone_number_id,
            app_secret,
            verify_token,
            api_version,
            template,
            api_url: f.api_url,
        })
    }

    fn user_id(id: &str, account: &Account) -> Result<String, SettingsError> {
        // wa_id: the number in international format, digits only (no `+`).
        if id.bytes().all(|b| b.is_ascii_digit())
            && (7..=15).contains(&id.len())
            && !id.starts_with('0')
        {
            return Ok(id.to_string());
        }
        Err(account.invalid(
            "allow_from",
            format!(
            "`{id}` is not a WhatsApp id: WhatsApp ids are phone numbers in international format, digits only, without `+`, spaces or a leading 0, like \"4915112345678\", {PAIRING_HINT}"
            ),
        ))
    }

    /// One access token may serve several numbers: the number is the account.
    fn same_account(_what: &str, first: &str, _second: &str) -> String {
        format!("`{first}` is the same phone number id: each account is its own number")
    }
}

#[async_trait]
impl ChannelSetup for WhatsAppSettings {
    fn build(&self, h: Handles) -> Result<Arc<dyn Channel>, ChannelError> {
        Ok(Arc::new(WhatsAppChannel::new(WhatsAppConfig {
            id: h.account.channel_id(),
            access_token: self.token.expose().to_string(),
            app_secret: self.app_secret.expose().to_string(),
            verify_token: self.verify_token.expose().to_string(),
            phone_number_id: self.phone_number_id.clone(),
            api_url: self
                .api_url
                .clone()
                .unwrap_or_else(|| DEFAULT_API_URL.into()),
            api_version: self.api_version.clone(),
            template: self.template.clone(),
            token_key: h.account.key("token"),
            state: h.state,
        })?))
    }

    fn identity(&self) -> Vec<(&'static str, &str)> {
        vec![("phone_number_id", self.phone_number_id.as_str())]
    }

    /// The phone number's record in the Graph API, with the access token.
    async fn doctor(&self, account: &Account, timeout: Duration) -> Verdict {
        let base = self.api_url.as_deref().unwrap_or(DEFAULT_API_URL);
        let url = format!(
            "{}/{}/{}",
            base.trim_end_matches('/'),
            self.api_version,
            self.phone_number_id
        );
        let answer = async {
            let client = reqwest::Client::builder()
                .timeout(timeout)
                .connect_timeout(timeout)
                .build()?;
            let r = client
                .get(url)
                .bearer_auth(self.token.expose())
                .send()
                .await?;
            let status = r.status().as_u16();
            let body = r.bytes().await.unwrap_or_default();
            Ok::<_, reqwest::Error>((status, serde_json::from_slice(&body).unwrap_or_default()))
        }
        .await;
        token_verdict(account, answer, &self.token, "token")
    }
}
