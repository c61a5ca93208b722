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
    fn put(&self, key: &str, value: &str) -> Result<(), String> {
        self.store
            .state_put(&self.ns, key, Some(value))
            .map_err(|e| e.to_string())
    }
}

/// Build the enabled chat channels. One that cannot be built is reported and left out; the
/// others (and the HTTP API) still run.
pub fn chat_channels(config: &Config, store: &Store) -> Vec<Arc<dyn Channel>> {
    let mut out: Vec<Arc<dyn Channel>> = Vec::new();
    for c in &config.chat_channels {
        let state: Arc<dyn StateStore> =
            Arc::new(StoreState::new(store.clone(), c.platform.name()));
        match build(c, state) {
            Ok(ch) => out.push(ch),
            Err(e) => {
                tracing::error!(channel = c.platform.name(), error = %e, "channel not started")
            }
        }
    }
    out
}

#[allow(clippy::needless_pass_by_value)]
fn build(
    c: &crate::config::ChatChannelConfig,
    state: Arc<dyn StateStore>,
) -> Result<Arc<dyn Channel>, String> {
    let _ = &state;
    Err(format!(
        "this build of weft has no {} support (cargo feature `{}`)",
        c.platform.name(),
        c.platform.name()
    ))
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
