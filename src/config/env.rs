//! [`Env`]: the snapshot of the process environment the loader reads (tests pass their own).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// A snapshot of the process environment (tests pass their own).
///
/// The second field is set by [`Env::for_client`]: secrets only the running service uses may
/// then be missing from this environment, and are recorded there instead of failing the load.
#[derive(Clone, Debug, Default)]
pub struct Env(
    pub(super) BTreeMap<String, String>,
    Option<Arc<Mutex<Vec<DeferredSecret>>>>,
);

/// A secret of the running service (a chat channel's bot token, a webhook's signing secret,
/// the transcription key) that a client command's environment does not hold: the service
/// reads it from its own environment (`service.env`, systemd credentials).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeferredSecret {
    /// The setting, e.g. `channels.telegram.token`.
    pub key: String,
    /// The environment variable that holds it (`*_env`), if it is given that way.
    pub var: Option<String>,
    /// Why it could not be read here, e.g. `channels.telegram.token_env: environment variable
    /// TELEGRAM_BOT_TOKEN is not set`.
    pub reason: String,
}

impl Env {
    /// The current process environment.
    pub fn from_process() -> Self {
        Self(std::env::vars().collect(), None)
    }
    /// The same environment, for a command that is not the service itself (`weft status`,
    /// `weft pairing approve` …): the secrets only the service uses (chat channel tokens,
    /// webhook secrets, the transcription key) may be missing from it. The loaded
    /// [`Config::deferred_secrets`](super::Config::deferred_secrets) lists the ones that were.
    #[must_use]
    pub fn for_client(self) -> Self {
        Self(self.0, Some(Arc::default()))
    }
    /// Record a service secret this (client) environment does not hold; `false` when the
    /// environment is the service's own, and the missing secret is an error.
    pub(super) fn defer(&self, secret: DeferredSecret) -> bool {
        match &self.1 {
            Some(list) => {
                if let Ok(mut l) = list.lock() {
                    l.push(secret);
                }
                true
            }
            None => false,
        }
    }
    /// The secrets recorded by [`Env::defer`] since the last call.
    pub(super) fn take_deferred(&self) -> Vec<DeferredSecret> {
        self.1
            .as_ref()
            .and_then(|l| l.lock().ok().map(|mut l| std::mem::take(&mut *l)))
            .unwrap_or_default()
    }
    /// An environment made of these pairs.
    pub fn from_pairs<I, K, V>(pairs: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        Self(
            pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            None,
        )
    }
    /// One variable, if set and not empty.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
    /// The crash point a test asks for (`WEFT_FAULT`; unset in production): the daemon
    /// SIGKILLs itself there.
    pub fn fault_point() -> Option<String> {
        std::env::var("WEFT_FAULT").ok().filter(|v| !v.is_empty())
    }
    /// The user's home directory.
    pub fn home(&self) -> PathBuf {
        self.get("HOME")
            .map_or_else(|| PathBuf::from("/"), PathBuf::from)
    }
}
