//! The Telegram channel's side of the platform contract ([`Telegram`]): the keys of
//! `channels.telegram` (and of each account) as written, their validation, the constructor
//! from them, the resume key and what `weft doctor` checks. Reads no environment: secrets come
//! through the gateway's [`Resolver`].

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

use crate::{TelegramChannel, TelegramConfig, OFFSET_KEY};

/// The Telegram platform (`channels.telegram`).
pub struct Telegram;

/// Telegram's own keys of `channels.telegram` and of each account.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct TelegramFile {
    /// Bot token, inline (prefer `token_env` or `token_file`).
    #[serde(alias = "access_token")]
    pub token: Option<String>,
    /// Environment variable holding the bot token.
    #[serde(alias = "access_token_env")]
    pub token_env: Option<String>,
    /// File holding the bot token (relative paths resolve in `$CREDENTIALS_DIRECTORY`).
    #[serde(alias = "access_token_file")]
    pub token_file: Option<String>,
    /// Bot API base URL (a local `telegram-bot-api` server, a proxy).
    pub api_url: Option<String>,
}

/// Validated settings of one Telegram bot.
#[derive(Clone, Debug, PartialEq)]
pub struct TelegramSettings {
    /// The bot token from @BotFather.
    pub token: Secret,
    /// The Bot API base URL, when not Telegram's.
    pub api_url: Option<String>,
}

impl PlatformSpec for Telegram {
    type File = TelegramFile;
    type Settings = TelegramSettings;

    const INTAKE: Intake = Intake::Connection(Resume::Keys(&[OFFSET_KEY]));

    fn names_account(f: &TelegramFile) -> bool {
        f.token.is_some() || f.token_env.is_some() || f.token_file.is_some()
    }

    fn inherit(account: TelegramFile, section: &TelegramFile) -> TelegramFile {
        TelegramFile {
            api_url: account.api_url.or_else(|| section.api_url.clone()),
            ..account
        }
    }

    fn resolve(
        f: TelegramFile,
        account: &Account,
        secrets: &mut dyn Resolver,
    ) -> Result<TelegramSettings, SettingsError> {
        let forms = SecretForms::new(f.token, f.token_env, f.token_file);
        let token = require_token(account, "token", forms, secrets)?;
        if let Some(u) = &f.api_url {
            check_http_url(account, "api_url", u)?;
        }
        Ok(TelegramSettings {
            token,
            api_url: f.api_url,
        })
    }

    fn user_id(id: &str, account: &Account) -> Result<String, SettingsError> {
        // User ids are positive; negative numbers are group and channel chat ids.
        let digits = !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit());
        if digits && id.len() <= 16 && !id.starts_with('0') {
            return Ok(id.to_string());
        }
        let why = if id.starts_with('-') {
            format!("`{id}` is a Telegram group or channel id; allow_from lists the user ids of the people who may talk to the bot (positive numbers like 123456789): ask @userinfobot for yours, {PAIRING_HINT}")
        } else {
            format!("`{id}` is not a Telegram user id: user ids are positive numbers like 123456789, not @usernames (which can change hands); ask @userinfobot for yours, {PAIRING_HINT}")
        };
        Err(account.invalid("allow_from", why))
    }
}

#[async_trait]
impl ChannelSetup for TelegramSettings {
    fn build(&self, h: Handles) -> Result<Arc<dyn Channel>, ChannelError> {
        let mut t = TelegramConfig::new(self.token.expose());
        if let Some(u) = &self.api_url {
            t.api_url.clone_from(u);
        }
        t.group_mode = h.shared.group_mode;
        t.stream_edits = h.shared.stream_edits;
        t.edit_interval = h.shared.edit_interval;
        t.state = h.state;
        t.id = h.account.channel_id();
        Ok(Arc::new(TelegramChannel::new(t)?))
    }

    fn identity(&self) -> Vec<(&'static str, &str)> {
        vec![("token", self.token.expose())]
    }

    /// `getMe` with the token.
    async fn doctor(&self, account: &Account, timeout: Duration) -> Verdict {
        let base = self
            .api_url
            .as_deref()
            .unwrap_or("https://api.telegram.org");
        let url = format!(
            "{}/bot{}/getMe",
            base.trim_end_matches('/'),
            self.token.expose()
        );
        let answer = async {
            let client = reqwest::Client::builder()
                .timeout(timeout)
                .connect_timeout(timeout)
                .build()?;
            let r = client.get(url).send().await?;
            let status = r.status().as_u16();
            let body = r.bytes().await.unwrap_or_default();
            Ok::<_, reqwest::Error>((status, serde_json::from_slice(&body).unwrap_or_default()))
        }
        .await;
        token_verdict(account, answer, &self.token, "token")
    }
}
