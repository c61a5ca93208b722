//! The Slack channel's side of the platform contract ([`Slack`]): the keys of
//! `channels.slack` (and of each account) as written, their validation, the constructor from
//! them and what `weft doctor` checks. Slack keeps no resume state: Socket Mode redelivers an
//! envelope that was not acknowledged. Reads no environment: secrets come through the
//! gateway's [`Resolver`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawft_channel_core::secret::Secret;
use clawft_channel_core::spec::{
    check_http_url, require_token, token_verdict, Account, ChannelSetup, Handles, Intake,
    PlatformSpec, Resolver, Resume, SecretForms, SettingsError, Verdict, PAIRING_HINT,
};
use clawft_channel_core::{Channel, ChannelError};
use serde::{Deserialize, Serialize};

use crate::{SlackChannel, SlackConfig};

/// The Slack platform (`channels.slack`).
pub struct Slack;

/// Slack's own keys of `channels.slack` and of each account.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct SlackFile {
    /// Bot token (`xoxb-...`), inline (prefer `token_env` or `token_file`).
    #[serde(alias = "access_token")]
    pub token: Option<String>,
    /// Environment variable holding the bot token.
    #[serde(alias = "access_token_env")]
    pub token_env: Option<String>,
    /// File holding the bot token (relative paths resolve in `$CREDENTIALS_DIRECTORY`).
    #[serde(alias = "access_token_file")]
    pub token_file: Option<String>,
    /// The app-level token (`xapp-...`) for Socket Mode, inline.
    pub app_token: Option<String>,
    /// Environment variable holding the app-level token.
    pub app_token_env: Option<String>,
    /// File holding the app-level token.
    pub app_token_file: Option<String>,
    /// Web API base URL (a proxy).
    pub api_url: Option<String>,
}

/// Validated settings of one Slack app.
#[derive(Clone, Debug, PartialEq)]
pub struct SlackSettings {
    /// The bot token (Web API calls).
    pub token: Secret,
    /// The app-level token (opens Socket Mode connections).
    pub app_token: Secret,
    /// The Web API base URL, when not Slack's.
    pub api_url: Option<String>,
}

impl PlatformSpec for Slack {
    type File = SlackFile;
    type Settings = SlackSettings;

    const INTAKE: Intake = Intake::Connection(Resume::Redelivered);

    fn names_account(f: &SlackFile) -> bool {
        f.token.is_some() || f.token_env.is_some() || f.token_file.is_some()
    }

    fn inherit(account: SlackFile, section: &SlackFile) -> SlackFile {
        SlackFile {
            api_url: account.api_url.or_else(|| section.api_url.clone()),
            ..account
        }
    }

    fn resolve(
        f: SlackFile,
        account: &Account,
        secrets: &mut dyn Resolver,
    ) -> Result<SlackSettings, SettingsError> {
        let forms = SecretForms::new(f.token, f.token_env, f.token_file);
        let token = require_token(account, "token", forms, secrets)?;
        let forms = SecretForms::new(f.app_token, f.app_token_env, f.app_token_file);
        let app_token = secrets.secret(&account.key("app_token"), forms)?.ok_or_else(|| {
            account.invalid(
                "app_token",
                "Slack's Socket Mode needs the app-level token (xapp-...): set app_token_env or app_token_file",
            )
        })?;
        if let Some(u) = &f.api_url {
            check_http_url(account, "api_url", u)?;
        }
        Ok(SlackSettings {
            token,
            app_token,
            api_url: f.api_url,
        })
    }

    /// Its own key elsewhere is the app-level token (`app_token`).
    fn taken_elsewhere(_key: &str, owner: &str, platform: &str) -> String {
        format!("only the {owner} channel has an app token, not {platform}")
    }

    fn user_id(id: &str, account: &Account) -> Result<String, SettingsError> {
        // Member ids: U… (or W… on Enterprise Grid), upper-case letters and digits.
        if id.len() >= 3
            && (id.starts_with('U') || id.starts_with('W'))
            && id
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
        {
            return Ok(id.to_string());
        }
        Err(account.invalid(
            "allow_from",
            format!(
            "`{id}` is not a Slack user id: member ids look like \"U0123ABCD\" (or W… on Enterprise Grid), not @names or emails; open the profile, ⋮ → Copy member ID, {PAIRING_HINT}"
            ),
        ))
    }
}

#[async_trait]
impl ChannelSetup for SlackSettings {
    fn build(&self, h: Handles) -> Result<Arc<dyn Channel>, ChannelError> {
        let mut s = SlackConfig {
            token: self.token.expose().to_string(),
            app_token: self.app_token.expose().to_string(),
            group_mode: h.shared.group_mode,
            stream_edits: h.shared.stream_edits,
            edit_interval: h.shared.edit_interval,
            state: h.state,
            id: h.account.channel_id(),
            ..SlackConfig::default()
        };
        if let Some(u) = &self.api_url {
            s.api_url.clone_from(u);
        }
        Ok(Arc::new(SlackChannel::new(s)?))
    }

    fn identity(&self) -> Vec<(&'static str, &str)> {
        vec![
            ("token", self.token.expose()),
            ("app_token", self.app_token.expose()),
        ]
    }

    /// `auth.test` with the bot token.
    async fn doctor(&self, account: &Account, timeout: Duration) -> Verdict {
        let base = self.api_url.as_deref().unwrap_or("https://slack.com/api/");
        let url = format!("{}/auth.test", base.trim_end_matches('/'));
        let answer = async {
            let client = reqwest::Client::builder()
                .timeout(timeout)
                .connect_timeout(timeout)
                .build()?;
            let r = client
                .post(url)
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
