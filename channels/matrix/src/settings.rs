//! The Matrix channel's side of the platform contract ([`Matrix`]): the keys of
//! `channels.matrix` (and of each account: one bot user each) as written, their validation,
//! the constructor from them, the resume key and what `weft doctor` checks. Reads no
//! environment: secrets come through the gateway's [`Resolver`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawft_channel_core::secret::Secret;
use clawft_channel_core::spec::{
    missing_token, token_verdict, Account, ChannelSetup, Handles, Intake, PlatformSpec, Resolver,
    Resume, SecretForms, SettingsError, Verdict, PAIRING_HINT,
};
use clawft_channel_core::{Channel, ChannelError};
use serde::{Deserialize, Serialize};

use crate::{MatrixChannel, MatrixConfig, SINCE_KEY};

/// The Matrix platform (`channels.matrix`).
pub struct Matrix;

/// Matrix's own keys of `channels.matrix` and of each account.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct MatrixFile {
    /// The bot account's access token, inline (prefer `access_token_env` or
    /// `access_token_file`); also written `token`.
    #[serde(alias = "access_token")]
    pub token: Option<String>,
    /// Environment variable holding the access token (also `token_env`).
    #[serde(alias = "access_token_env")]
    pub token_env: Option<String>,
    /// File holding the access token (relative paths resolve in `$CREDENTIALS_DIRECTORY`;
    /// also `token_file`).
    #[serde(alias = "access_token_file")]
    pub token_file: Option<String>,
    /// The homeserver's base URL (`https://matrix.example.org`).
    pub homeserver: Option<String>,
    /// The bot's user id (`@bot:example.org`), checked against the token.
    pub user_id: Option<String>,
    /// Not a Matrix setting (the other platforms' API base): refused, naming the right one.
    pub api_url: Option<String>,
}

/// Validated settings of one Matrix bot user.
#[derive(Clone, Debug, PartialEq)]
pub struct MatrixSettings {
    /// The access token.
    pub token: Secret,
    /// The homeserver's base URL.
    pub homeserver: String,
    /// The bot's user id, if configured.
    pub user_id: Option<String>,
}

/// Whether `id` is a Matrix user id (`@localpart:server`).
fn is_user_id(id: &str) -> bool {
    id.strip_prefix('@').is_some_and(|rest| {
        rest.split_once(':').is_some_and(|(l, s)| {
            !l.is_empty() && !s.is_empty() && !rest.contains(char::is_whitespace)
        })
    })
}

/// Why `id` is refused where a Matrix user id is expected, and how to find one.
fn not_a_user_id(id: &str) -> String {
    format!(
        "`{id}` is not a Matrix user id: user ids look like \"@alice:example.org\" (in Element: your name at the top left shows it), not display names, {PAIRING_HINT}"
    )
}

impl PlatformSpec for Matrix {
    type File = MatrixFile;
    type Settings = MatrixSettings;

    const INTAKE: Intake = Intake::Connection(Resume::Keys(&[SINCE_KEY]));

    fn names_account(f: &MatrixFile) -> bool {
        f.token.is_some() || f.token_env.is_some() || f.token_file.is_some()
    }

    /// Each account is its own bot user (token, user id); the homeserver is inherited.
    fn inherit(account: MatrixFile, section: &MatrixFile) -> MatrixFile {
        MatrixFile {
            homeserver: account.homeserver.or_else(|| section.homeserver.clone()),
            api_url: account.api_url.or_else(|| section.api_url.clone()),
            ..account
        }
    }

    fn resolve(
        f: MatrixFile,
        account: &Account,
        secrets: &mut dyn Resolver,
    ) -> Result<MatrixSettings, SettingsError> {
        if f.api_url.is_some() {
            return Err(account.invalid(
                "api_url",
                "the matrix channel takes `homeserver` (the homeserver's base URL), not api_url",
            ));
        }
        let hs = f.homeserver.ok_or_else(|| {
            account.invalid("homeserver", "the matrix channel needs the homeserver's base URL, e.g. homeserver = \"https://matrix.example.org\"")
        })?;
        if !(hs.starts_with("http://") || hs.starts_with("https://")) {
            return Err(account.invalid(
                "homeserver",
                format!("expected an http:// or https:// URL like https://matrix.example.org, got `{hs}`"),
            ));
        }
        if let Some(u) = f.user_id.as_deref().filter(|u| !is_user_id(u)) {
            return Err(account.invalid("user_id", not_a_user_id(u)));
        }
        // Matrix calls it an access token (`access_token_env`, read into the same keys).
        let forms = SecretForms::new(f.token, f.token_env, f.token_file);
        let token = match (secrets.secret(&account.key("access_token"), forms)?, account.name()) {
            (Some(t), _) => t,
            (None, None) => return Err(account.invalid("access_token", "the matrix channel is enabled but has no access token: set access_token_env or access_token_file to the bot account's access token (Element: Settings → Help & About → Access Token, or a login of the bot account), or enabled = false")),
            (None, Some(_)) => return Err(missing_token(account, "access_token")),
        };
        Ok(MatrixSettings {
            token,
            homeserver: hs,
            user_id: f.user_id,
        })
    }

    fn user_id(id: &str, account: &Account) -> Result<String, SettingsError> {
        if is_user_id(id) {
            return Ok(id.to_string());
        }
        Err(account.invalid("allow_from", not_a_user_id(id)))
    }
}

#[async_trait]
impl ChannelSetup for MatrixSettings {
    fn build(&self, h: Handles) -> Result<Arc<dyn Channel>, ChannelError> {
        Ok(Arc::new(MatrixChannel::new(MatrixConfig {
            id: h.account.channel_id(),
            homeserver: self.homeserver.clone(),
            access_token: self.token.expose().to_string(),
            user_id: self.user_id.clone(),
            invite_from: h.shared.allow_from,
            // Paired users may invite the bot too.
            invite_paired: Some(h.is_paired),
            group_mode: h.shared.group_mode,
            stream_edits: h.shared.stream_edits,
            edit_interval: h.shared.edit_interval,
            state: h.state,
            ..MatrixConfig::default()
        })?))
    }

    fn identity(&self) -> Vec<(&'static str, &str)> {
        vec![("access_token", self.token.expose())]
    }

    /// `whoami` with the access token.
    async fn doctor(&self, account: &Account, timeout: Duration) -> Verdict {
        let url = format!(
            "{}/_matrix/client/v3/account/whoami",
            self.homeserver.trim_end_matches('/')
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
