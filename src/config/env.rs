//! [`Env`]: the snapshot of the process environment the loader reads (tests pass their own),
//! and what is read from it before the file: the state directory, the default config path, the
//! `CLAWFT_SECTION__KEY` overrides and their merge with the file. Uses no other file of
//! `config/`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
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

/// The credentials file of the service in `$CLAWFT_HOME` (`weft service install
/// --write-credentials`; read by the unit through `EnvironmentFile=`).
pub const SERVICE_ENV_FILE: &str = "service.env";

/// `$CLAWFT_HOME` or `~/.clawft`.
pub fn clawft_home(env: &Env) -> PathBuf {
    env.get("CLAWFT_HOME")
        .map_or_else(|| env.home().join(".clawft"), PathBuf::from)
}

/// Where the config file is looked for when `--config` is not given.
pub fn default_path(env: &Env) -> PathBuf {
    let dir = clawft_home(env);
    let toml = dir.join("config.toml");
    if toml.exists() {
        toml
    } else {
        dir.join("config.json")
    }
}

/// `path` with a leading `~` or `~/` made the home directory.
pub(super) fn expand(path: &str, env: &Env) -> PathBuf {
    if path == "~" {
        env.home()
    } else if let Some(rest) = path.strip_prefix("~/") {
        env.home().join(rest)
    } else {
        PathBuf::from(path)
    }
}

/// The `CLAWFT_<SECTION>__<KEY>` variables of `env` (the config overrides).
pub(super) fn env_overrides(env: &Env) -> config::Map<String, String> {
    env.0
        .iter()
        .filter(|(k, _)| k.starts_with("CLAWFT_") && k.contains("__"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The dotted key a `CLAWFT_SECTION__KEY` variable sets (as the `config` crate reads it).
pub fn override_key(var: &str) -> Option<String> {
    let rest = var.strip_prefix("CLAWFT_")?;
    rest.contains("__").then(|| {
        rest.split("__")
            .collect::<Vec<_>>()
            .join(".")
            .to_lowercase()
    })
}

/// The file (if any) and the `CLAWFT_…` overrides, merged as untyped values.
pub(super) fn merged(
    file: Option<(&Path, config::FileFormat)>,
    overrides: &config::Map<String, String>,
) -> Result<config::Config, config::ConfigError> {
    let mut builder = config::Config::builder();
    if let Some((path, format)) = file {
        builder = builder.add_source(config::File::from(path).format(format));
    }
    if !overrides.is_empty() {
        builder = builder.add_source(
            config::Environment::with_prefix("CLAWFT")
                .prefix_separator("_")
                .separator("__")
                .try_parsing(true)
                .source(Some(overrides.clone())),
        );
    }
    builder.build()
}
