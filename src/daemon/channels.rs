//! The chat platform adapters of this build (cargo features `telegram`, `discord`, `slack`),
//! built from `channels.*` config, and the store-backed [`StateStore`] they keep offsets in.

use std::sync::Arc;

use clawft_channel_core::{Channel, StateStore};

use crate::config::Config;
use crate::store::Store;

/// An adapter's durable state: values under the namespace `chan:<id>` in the store.
pub struct StoreState {
    store: Store,
    ns: String,
}

impl StoreState {
    /// State of channel `id`.
    pub fn new(store: Store, id: &str) -> Self {
        Self {
            store,
            ns: format!("chan:{id}"),
        }
    }
}

impl StateStore for StoreState {
    fn get(&self, key: &str) -> Option<String> {
        self.store.state_get(&self.ns, key).ok().flatten()
    }
    fn put(&self, key: &str, value: &str) -> Result<(), clawft_channel_core::StateError> {
        self.store
            .state_put(&self.ns, key, Some(value))
            .map_err(|e| clawft_channel_core::StateError(e.to_string()))
    }
    fn remove(&self, key: &str) -> Result<(), clawft_channel_core::StateError> {
        self.store
            .state_put(&self.ns, key, None)
            .map_err(|e| clawft_channel_core::StateError(e.to_string()))
    }
}

/// Build the enabled chat channels. One that cannot be built is reported and left out; the
/// others (and the HTTP API) still run.
pub fn chat_channels(config: &Config, store: &Store) -> Vec<Arc<dyn Channel>> {
    config
        .chat_channels
        .iter()
        .filter_map(|c| chat_channel(c, store))
        .collect()
}

/// Build one chat channel; `None` (reported) when it cannot be built.
pub fn chat_channel(
    c: &crate::config::ChatChannelConfig,
    store: &Store,
) -> Option<Arc<dyn Channel>> {
    let state: Arc<dyn StateStore> = Arc::new(StoreState::new(store.clone(), &c.id()));
    match build(c, state) {
        Ok(ch) => Some(ch),
        Err(e) => {
            tracing::error!(channel = %c.id(), error = %e, "channel not started");
            None
        }
    }
}

fn build(
    c: &crate::config::ChatChannelConfig,
    state: Arc<dyn StateStore>,
) -> Result<Arc<dyn Channel>, String> {
    #[cfg(any(feature = "telegram", feature = "discord", feature = "slack"))]
    use crate::config::Platform;
    match c.platform {
        #[cfg(feature = "telegram")]
        Platform::Telegram => {
            use clawft_channel_telegram::{GroupMode, TelegramChannel, TelegramConfig};
            let mut t = TelegramConfig::new(c.token.expose());
            if let Some(u) = &c.api_url {
                t.api_url.clone_from(u);
            }
            t.group_mode = if c.group_all {
                GroupMode::All
            } else {
                GroupMode::Mention
            };
            t.stream_edits = c.stream_edits;
            t.edit_interval = c.edit_interval;
            t.state = state;
            t.id = clawft_channel_core::ChannelId::new(c.id());
            Ok(Arc::new(
                TelegramChannel::new(t).map_err(|e| e.to_string())?,
            ))
        }
        #[cfg(feature = "discord")]
        Platform::Discord => {
            use clawft_channel_discord::{DiscordChannel, DiscordConfig, GroupMode};
            let mut d = DiscordConfig::new(c.token.expose(), state);
            d.api_base_url.clone_from(&c.api_base_url);
            d.gateway_url.clone_from(&c.gateway_url);
            d.group_mode = if c.group_all {
                GroupMode::All
            } else {
                GroupMode::Mention
            };
            d.stream_edits = c.stream_edits;
            d.edit_interval = c.edit_interval;
            d.id = clawft_channel_core::ChannelId::new(c.id());
            Ok(Arc::new(DiscordChannel::new(d).map_err(|e| e.to_string())?))
        }
        #[cfg(feature = "slack")]
        Platform::Slack => {
            use clawft_channel_slack::{GroupMode, SlackChannel, SlackConfig};
            let mut s = SlackConfig {
                token: c.token.expose().to_string(),
                app_token: c
                    .app_token
                    .as_ref()
                    .map(|t| t.expose().to_string())
                    .unwrap_or_default(),
                group_mode: if c.group_all {
                    GroupMode::All
                } else {
                    GroupMode::Mention
                },
                stream_edits: c.stream_edits,
                edit_interval: c.edit_interval,
                state,
                id: clawft_channel_core::ChannelId::new(c.id()),
                ..SlackConfig::default()
            };
            if let Some(u) = &c.api_url {
                s.api_url.clone_from(u);
            }
            Ok(Arc::new(SlackChannel::new(s).map_err(|e| e.to_string())?))
        }
        #[allow(unreachable_patterns)]
        other => {
            let _ = state;
            Err(format!(
                "this build of weft has no {} support (cargo feature `{}`)",
                other.name(),
                other.name()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn state_survives_a_reopen() {
        let d = tempfile::tempdir().unwrap();
        {
            let s = Store::open(d.path(), 1 << 20).unwrap();
            let st = StoreState::new(s.clone(), "telegram");
            assert_eq!(st.get("offset"), None);
            st.put("offset", "42").unwrap();
            assert_eq!(StoreState::new(s, "discord").get("offset"), None);
        }
        let s = Store::open(d.path(), 1 << 20).unwrap();
        assert_eq!(
            StoreState::new(s, "telegram").get("offset").as_deref(),
            Some("42")
        );
    }
}
