//! The Discord channel's side of the platform contract ([`Discord`]): the keys of
//! `channels.discord` (and of each account) as written, their validation, the constructor from
//! them, the resume keys and what `weft doctor` checks. Reads no environment: secrets come
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

use crate::{DiscordChannel, DiscordConfig, RESUME_URL_KEY, SEQ_KEY, SESSION_ID_KEY};

/// The Discord platform (`channels.discord`).
pub struct Discord;

/// Discord's own keys of `channels.discord` and of each account.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct DiscordFile {
    /// Bot token, inline (prefer `token_env` or `token_file`).
    #[serde(alias = "access_token")]
    pub token: Option<String>,
    /// Environment variable holding the bot token.
    #[serde(alias = "access_token_env")]
    pub token_env: Option<String>,
    /// File holding the bot token (relative paths resolve in `$CREDENTIALS_DIRECTORY`).
    #[serde(alias = "access_token_file")]
    pub token_file: Option<String>,
    /// Base URL replacing `https://discord.com` for every REST call (a relay that speaks
    /// Discord's API, such as twilight-http-proxy; not an HTTP CONNECT proxy).
    pub api_base_url: Option<String>,
    /// Gateway WebSocket URL (`wss://...`), skipping `GET /gateway/bot`.
    pub gateway_url: Option<String>,
    /// Deprecated name of `api_base_url` (it never was an HTTP proxy); still read, with a
    /// warning at load.
    pub proxy: Option<String>,
    /// Not a Discord setting (the other platforms' API base): refused, naming the right one.
    pub api_url: Option<String>,
}

/// Validated settings of one Discord bot.
#[derive(Clone, Debug, PartialEq)]
pub struct DiscordSettings {
    /// The bot token.
    pub token: Secret,
    /// The REST base URL (`api_base_url`, formerly `proxy`), when not Discord's.
    pub api_base_url: Option<String>,
    /// The gateway WebSocket URL, when not asked of Discord.
    pub gateway_url: Option<String>,
}

impl PlatformSpec for Discord {
    type File = DiscordFile;
    type Settings = DiscordSettings;

    const INTAKE: Intake =
        Intake::Connection(Resume::Keys(&[SESSION_ID_KEY, SEQ_KEY, RESUME_URL_KEY]));

    fn names_account(f: &DiscordFile) -> bool {
        f.token.is_some() || f.token_env.is_some() || f.token_file.is_some()
    }

    fn inherit(account: DiscordFile, section: &DiscordFile) -> DiscordFile {
        let s = section.clone();
        // `proxy` is the old name of `api_base_url`: an account setting either replaces both.
        let (api_base_url, proxy) = if account.api_base_url.is_some() || account.proxy.is_some() {
            (account.api_base_url, account.proxy)
        } else {
            (s.api_base_url, s.proxy)
        };
        DiscordFile {
            api_base_url,
            proxy,
            gateway_url: account.gateway_url.or(s.gateway_url),
            api_url: account.api_url.or(s.api_url),
            ..account
        }
    }

    fn resolve(
        f: DiscordFile,
        account: &Account,
        secrets: &mut dyn Resolver,
    ) -> Result<DiscordSettings, SettingsError> {
        let forms = SecretForms::new(f.token, f.token_env, f.token_file);
        let token = require_token(account, "token", forms, secrets)?;
        if f.api_url.is_some() {
            return Err(account.invalid(
                "api_url",
                "the discord channel takes `api_base_url` (the base URL of its REST API) and `gateway_url`, not api_url",
            ));
        }
        let api_base_url = match (f.api_base_url, f.proxy) {
            (Some(_), Some(_)) => {
                return Err(account.invalid(
                    "proxy",
                    "`proxy` is the old name of `api_base_url`: remove it",
                ))
            }
            (Some(u), None) => Some(u),
            (None, Some(u)) => {
                tracing::warn!(
                    channel = "discord",
                    "channels.discord.proxy is deprecated: it is the base URL of Discord's REST API, not an HTTP proxy; rename it to api_base_url"
                );
                Some(u)
            }
            (None, None) => None,
        };
        if let Some(u) = &f.gateway_url {
            if !(u.starts_with("ws://") || u.starts_with("wss://")) {
                return Err(account.invalid(
                    "gateway_url",
                    format!("expected a ws:// or wss:// URL, got `{u}`"),
                ));
            }
        }
        if let Some(u) = &api_base_url {
            check_http_url(account, "api_base_url", u)?;
        }
        Ok(DiscordSettings {
            token,
            api_base_url,
            gateway_url: f.gateway_url,
        })
    }

    /// Its own keys (`api_base_url`, `gateway_url`, `proxy`) elsewhere: the others take `api_url`.
    fn taken_elsewhere(key: &str, owner: &str, platform: &str) -> String {
        format!("only the {owner} channel takes {key}; {platform} takes api_url")
    }

    fn user_id(id: &str, account: &Account) -> Result<String, SettingsError> {
        // Snowflakes: unsigned 64-bit numbers.
        if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) && id.parse::<u64>().is_ok() {
            return Ok(id.to_string());
        }
        Err(account.invalid(
            "allow_from",
            format!(
            "`{id}` is not a Discord user id: user ids are numbers (snowflakes) like \"123456789012345678\", not names; in Discord turn on Developer Mode and use Copy User ID on the user, {PAIRING_HINT}"
            ),
        ))
    }
}

#[async_trait]
impl ChannelSetup for DiscordSettings {
    fn build(&self, h: Handles) -> Result<Arc<dyn Channel>, ChannelError> {
        let mut d = DiscordConfig::new(self.token.expose(), h.state);
        d.api_base_url.clone_from(&self.api_base_url);
        d.gateway_url.clone_from(&self.gateway_url);
        d.group_mode = h.shared.group_mode;
        d.stream_edits = h.shared.stream_edits;
        d.edit_interval = h.shared.edit_interval;
        d.id = h.account.channel_id();
        Ok(Arc::new(DiscordChannel::new(d)?))
    }

    fn identity(&self) -> Vec<(&'static str, &str)> {
        vec![("token", self.token.expose())]
    }

    /// `GET /api/v10/users/@me` with the bot token.
    async fn doctor(&self, account: &Account, timeout: Duration) -> Verdict {
        let base = self
            .api_base_url
            .as_deref()
            .unwrap_or("https://discord.com");
        let url = format!("{}/api/v10/users/@me", base.trim_end_matches('/'));
        let answer = async {
            let client = reqwest::Client::builder()
                .timeout(timeout)
                .connect_timeout(timeout)
                .build()?;
            let r = client
                .get(url)
                .header("authorization", format!("Bot {}", self.token.expose()))
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
