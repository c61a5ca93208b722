//! The Signal channel's side of the platform contract ([`Signal`]): the keys of
//! `channels.signal` (and of each account: one number each) as written, their validation, the
//! constructor from them, the resume key and what `weft doctor` checks (signal-cli's daemon
//! reachable and running the account). signal-cli holds the account's keys: no secret here.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawft_channel_core::spec::{
    check_http_url, Account, ChannelSetup, Handles, Intake, PlatformSpec, Resolver, Resume,
    SettingsError, Verdict, PAIRING_HINT,
};
use clawft_channel_core::{Channel, ChannelError};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::{is_e164, is_uuid, SignalChannel, SignalConfig, CURSOR_KEY};

/// The Signal platform (`channels.signal`).
pub struct Signal;

/// Signal's own keys of `channels.signal` and of each account.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct SignalFile {
    /// The account's phone number in international format (`+15551234567`), as registered or
    /// linked in signal-cli.
    pub number: Option<String>,
    /// signal-cli's HTTP daemon (default `http://127.0.0.1:8080`).
    pub api_url: Option<String>,
    /// Not a Signal setting (signal-cli holds the keys): refused, saying so.
    #[serde(alias = "access_token")]
    pub token: Option<String>,
    /// Not a Signal setting: refused.
    #[serde(alias = "access_token_env")]
    pub token_env: Option<String>,
    /// Not a Signal setting: refused.
    #[serde(alias = "access_token_file")]
    pub token_file: Option<String>,
}

/// Validated settings of one Signal account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignalSettings {
    /// The account signal-cli runs, in E.164.
    pub number: String,
    /// signal-cli's HTTP address, when not the default.
    pub api_url: Option<String>,
}

impl PlatformSpec for Signal {
    type File = SignalFile;
    type Settings = SignalSettings;

    const INTAKE: Intake = Intake::Connection(Resume::Keys(&[CURSOR_KEY]));
    const NO_STREAMING: Option<&'static str> = Some("Signal replies are sent whole: a Signal edit reaches every device as a new message and clients accept only a few edits of one message, so the signal channel does not stream");

    fn names_account(f: &SignalFile) -> bool {
        f.number.is_some() || f.token.is_some() || f.token_env.is_some() || f.token_file.is_some()
    }

    /// Each account is its own number; signal-cli's address is inherited.
    fn inherit(account: SignalFile, section: &SignalFile) -> SignalFile {
        SignalFile {
            api_url: account.api_url.or_else(|| section.api_url.clone()),
            ..account
        }
    }

    fn resolve(
        f: SignalFile,
        account: &Account,
        _secrets: &mut dyn Resolver,
    ) -> Result<SignalSettings, SettingsError> {
        // signal-cli's HTTP daemon has no credentials: the account is `number`.
        if f.token.is_some() || f.token_env.is_some() || f.token_file.is_some() {
            return Err(account.invalid("token", "the signal channel takes no token: signal-cli holds the account's keys; set `number` to the account and `api_url` to the daemon (`signal-cli -a +NUMBER daemon --http 127.0.0.1:8080`)"));
        }
        let number = match f.number {
            Some(n) if is_e164(n.trim()) => n.trim().to_string(),
            Some(n) => {
                return Err(account.invalid("number", format!("`{n}` is not a phone number in international format: write the account signal-cli runs as + and the country code and number, like \"+15551234567\"")))
            }
            None => {
                return Err(account.invalid("number", "the signal channel needs the account's number (`number = \"+15551234567\"`), registered or linked in signal-cli first (see the Signal section of the channels guide)"))
            }
        };
        if let Some(u) = &f.api_url {
            check_http_url(account, "api_url", u)?;
        }
        Ok(SignalSettings {
            number,
            api_url: f.api_url,
        })
    }

    /// Its own key elsewhere is `number` (the account signal-cli runs).
    fn taken_elsewhere(_key: &str, owner: &str, platform: &str) -> String {
        format!("only the {owner} channel takes a number, not {platform}")
    }

    fn user_id(id: &str, account: &Account) -> Result<String, SettingsError> {
        // A phone number (what a sender with one is known by) or an ACI (a UUID).
        if is_e164(id) || is_uuid(id) {
            return Ok(id.to_string());
        }
        Err(account.invalid(
            "allow_from",
            format!(
            "`{id}` is not a Signal sender: write phone numbers in international format like \"+15551234567\" (or a user's ACI, a UUID, for someone without a visible number), {PAIRING_HINT}"
            ),
        ))
    }
}

#[async_trait]
impl ChannelSetup for SignalSettings {
    fn build(&self, h: Handles) -> Result<Arc<dyn Channel>, ChannelError> {
        let mut s = SignalConfig {
            number: self.number.clone(),
            group_mode: h.shared.group_mode,
            state: h.state,
            id: h.account.channel_id(),
            ..SignalConfig::default()
        };
        if let Some(u) = &self.api_url {
            s.api_url.clone_from(u);
        }
        Ok(Arc::new(SignalChannel::new(s)?))
    }

    fn identity(&self) -> Vec<(&'static str, &str)> {
        vec![("number", self.number.as_str())]
    }

    fn account_label(&self) -> Option<(&'static str, String)> {
        Some(("number", self.number.clone()))
    }

    /// signal-cli's daemon: reachable (`GET /api/v1/check`), and running the account (a
    /// JSON-RPC `listGroups` for it answers without an account error).
    async fn doctor(&self, account: &Account, timeout: Duration) -> Verdict {
        let base = self
            .api_url
            .as_deref()
            .unwrap_or("http://127.0.0.1:8080")
            .trim_end_matches('/');
        let number = &self.number;
        let client = match reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()
        {
            Ok(c) => c,
            Err(e) => return Verdict::Fail(format!("signal-cli at {base}: {e}")),
        };
        if let Err(e) = client.get(format!("{base}/api/v1/check")).send().await {
            return Verdict::Fail(format!(
                "signal-cli unreachable at {base} ({e}): run `signal-cli -a {number} daemon --http 127.0.0.1:8080` (or set {})",
                account.key("api_url")
            ));
        }
        let req = json!({"jsonrpc": "2.0", "method": "listGroups", "id": 1, "params": {"account": number}});
        let body: serde_json::Value = match client
            .post(format!("{base}/api/v1/rpc"))
            .json(&req)
            .send()
            .await
        {
            Ok(r) => r.json().await.unwrap_or_default(),
            Err(e) => return Verdict::Fail(format!("signal-cli at {base}: {e}")),
        };
        match body["error"]["message"].as_str() {
            None => Verdict::Ok(format!("signal-cli runs {number}")),
            Some(e) => Verdict::Fail(format!(
                "signal-cli at {base} refused {number} ({e}): register or link it in signal-cli, or fix {}",
                account.key("number")
            )),
        }
    }
}
