//! [`Env`]: the snapshot of the process environment the loader reads (tests pass their own).

use std::collections::BTreeMap;
use std::path::PathBuf;

/// A snapshot of the process environment (tests pass their own).
#[derive(Clone, Debug, Default)]
pub struct Env(pub(super) BTreeMap<String, String>);

impl Env {
    /// The current process environment.
    pub fn from_process() -> Self {
        Self(std::env::vars().collect())
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
        )
    }
    /// One variable, if set and not empty.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
    /// The user's home directory.
    pub fn home(&self) -> PathBuf {
        self.get("HOME")
            .map_or_else(|| PathBuf::from("/"), PathBuf::from)
    }
}
