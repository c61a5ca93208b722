//! Where each configuration value came from: a key of the config file, a `CLAWFT_…` override
//! or another environment variable, a secret file, or the built-in default. Hints and
//! `weft config show` name it, so a user fixes the value where it is set.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use super::env::{env_overrides, merged, override_key, Env};
use super::error::ConfigError;

/// The origin of one value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A key of the config file.
    File {
        /// The config file.
        path: PathBuf,
        /// Dotted key.
        key: String,
    },
    /// An environment variable.
    Env {
        /// Its name.
        var: String,
        /// The key that named the variable (`providers.x.api_key_env`), if any.
        via: Option<String>,
    },
    /// A secret read from a file (`*_file`).
    SecretFile {
        /// The file read.
        file: PathBuf,
        /// The key that named it.
        via: String,
    },
    /// Nothing set it: the built-in default.
    Default,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File { path, key } => write!(f, "{key} in {}", path.display()),
            Origin::Env { var, via: None } => write!(f, "environment variable {var}"),
            Origin::Env { var, via: Some(k) } => {
                write!(f, "environment variable {var} (named by {k})")
            }
            Origin::SecretFile { file, via } => {
                write!(f, "file {} (named by {via})", file.display())
            }
            Origin::Default => write!(f, "default"),
        }
    }
}

/// The origins of the loaded configuration's values.
#[derive(Clone, Debug, Default)]
pub struct Provenance {
    file: Option<PathBuf>,
    /// Leaf keys set in the file (dotted, as written).
    file_keys: BTreeSet<String>,
    /// Keys set by `CLAWFT_SECTION__KEY` overrides → the variable.
    env_keys: BTreeMap<String, String>,
    /// Values whose origin the loader recorded itself (secrets, providers from the
    /// environment).
    explicit: BTreeMap<String, Origin>,
}

impl Provenance {
    /// The origins of a load from `file` (if it exists) with these overrides.
    pub(super) fn new(file: Option<&Path>, env: &Env) -> Self {
        let file_keys = file.map(file_leaf_keys).unwrap_or_default();
        Self {
            file: file.map(Path::to_path_buf),
            file_keys,
            env_keys: override_keys(env),
            explicit: BTreeMap::new(),
        }
    }

    /// Record the origin of `key`.
    pub(super) fn set(&mut self, key: impl Into<String>, origin: Origin) {
        self.explicit.insert(key.into(), origin);
    }

    /// The config file, if one was read.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Where `key` (dotted, e.g. `providers.openai.api_key`) came from: what the loader
    /// recorded, else a `CLAWFT_…` override, else the file, else the default. A section key
    /// (`tools.mcp_servers.x`) is set by the file when any key under it is.
    pub fn origin(&self, key: &str) -> Origin {
        if let Some(o) = self.explicit.get(key) {
            return o.clone();
        }
        if let Some(var) = self.env_keys.get(&key.to_lowercase()) {
            return Origin::Env {
                var: var.clone(),
                via: None,
            };
        }
        if let Some(path) = &self.file {
            let under = format!("{key}.");
            let in_file = self.file_keys.contains(key)
                || self
                    .file_keys
                    .range(under.clone()..)
                    .next()
                    .is_some_and(|k| k.starts_with(&under));
            if in_file {
                return Origin::File {
                    path: path.clone(),
                    key: key.to_string(),
                };
            }
        }
        Origin::Default
    }

    /// The `CLAWFT_…` overrides in effect: (dotted key, variable).
    pub fn overrides(&self) -> impl Iterator<Item = (&str, &str)> {
        self.env_keys.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Every leaf key the file sets.
    pub fn file_keys(&self) -> impl Iterator<Item = &str> {
        self.file_keys.iter().map(String::as_str)
    }
}

fn override_keys(env: &Env) -> BTreeMap<String, String> {
    env.0
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .filter_map(|(k, _)| override_key(k).map(|key| (key, k.clone())))
        .collect()
}

/// The leaf keys of a config file (empty when it cannot be read: the loader reports that).
fn file_leaf_keys(path: &Path) -> BTreeSet<String> {
    let format = match path.extension().and_then(|e| e.to_str()) {
        Some("toml") => config::FileFormat::Toml,
        _ => config::FileFormat::Json,
    };
    let mut out = BTreeSet::new();
    if let Ok(map) = config::Config::builder()
        .add_source(config::File::from(path).format(format))
        .build()
        .and_then(|c| c.cache.into_table())
    {
        for (k, v) in map {
            flatten(&k, v, &mut out);
        }
    }
    out
}

fn flatten(prefix: &str, v: config::Value, out: &mut BTreeSet<String>) {
    match v.kind {
        config::ValueKind::Table(t) if !t.is_empty() => {
            for (k, v) in t {
                flatten(&format!("{prefix}.{k}"), v, out);
            }
        }
        _ => {
            out.insert(prefix.to_string());
        }
    }
}

/// What to tell the user when one provider refuses its key or cannot be reached: where the
/// key and the base URL came from, so the fix goes where the value is set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderHints {
    /// For a 401/403.
    pub auth: String,
    /// For a connection that failed.
    pub connect: String,
}

/// Every leaf value the file and the `CLAWFT_…` overrides set (dotted key → value as text,
/// secrets included: callers mask them), for `weft config show`.
pub fn set_values(file: Option<&Path>, env: &Env) -> BTreeMap<String, String> {
    let format = |path: &Path| match path.extension().and_then(|e| e.to_str()) {
        Some("toml") => config::FileFormat::Toml,
        _ => config::FileFormat::Json,
    };
    let file = file.filter(|p| p.exists()).map(|p| (p, format(p)));
    let merged = merged(file, &env_overrides(env));
    let mut out = BTreeMap::new();
    if let Ok(map) = merged.and_then(|c| c.cache.into_table()) {
        for (k, v) in map {
            flatten_values(&k, v, &mut out);
        }
    }
    out
}

fn flatten_values(prefix: &str, v: config::Value, out: &mut BTreeMap<String, String>) {
    match v.kind {
        config::ValueKind::Table(t) if !t.is_empty() => {
            for (k, v) in t {
                flatten_values(&format!("{prefix}.{k}"), v, out);
            }
        }
        kind => {
            out.insert(
                prefix.to_string(),
                shown_value(config::Value::new(None, kind)),
            );
        }
    }
}

/// A value as `weft config show` prints it: a string as it is, anything else (numbers, lists,
/// tables in lists) as compact JSON, never the loader's debug text.
fn shown_value(v: config::Value) -> String {
    use serde::Deserialize as _;
    match serde_json::Value::deserialize(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(e) => format!("(unreadable: {e})"),
    }
}

/// Whether the value of `key` is a secret (never printed): API keys, tokens, passwords,
/// header and MCP environment values; not the `*_env` / `*_file` names that point at them.
pub fn is_secret_key(key: &str) -> bool {
    let last = key.rsplit('.').next().unwrap_or(key);
    if last.ends_with("_env") || last.ends_with("_file") {
        return false;
    }
    let under = |section: &str| key.split('.').rev().skip(1).any(|s| s == section);
    last == "token"
        || last.ends_with("_token")
        || last.ends_with("_key")
        || last.contains("secret")
        || last.contains("password")
        || under("headers")
        || under("env")
}

impl ConfigError {
    /// This error with where its key was set (a `CLAWFT_…` variable or the file), when known.
    pub(super) fn located(self, provenance: &Provenance) -> Self {
        let suffix = |key: &str| match provenance.origin(key) {
            Origin::Default => String::new(),
            o @ Origin::File { .. } => format!(" (set as {o})"),
            o => format!(" (set by {o})"),
        };
        match self {
            ConfigError::Invalid { key, detail } => {
                let detail = format!("{detail}{}", suffix(&key));
                ConfigError::Invalid { key, detail }
            }
            ConfigError::Secret { key, detail } => {
                let detail = format!("{detail}{}", suffix(&key));
                ConfigError::Secret { key, detail }
            }
            e @ (ConfigError::Missing(_) | ConfigError::Parse { .. }) => e,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn lists_and_tables_in_lists_are_shown_as_json_not_debug_text() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.toml");
        std::fs::write(
            &f,
            "[tools.policy]\ndeny = [\"exec_shell\", \"web_*\"]\n[[bindings]]\nagent = \"work\"\nchannel = \"slack\"\n[agents.defaults]\nmax_tokens = 512\nmodel = \"m\"\n",
        )
        .unwrap();
        let v = set_values(Some(&f), &Env::default());
        assert_eq!(v["tools.policy.deny"], r#"["exec_shell","web_*"]"#);
        assert_eq!(v["bindings"], r#"[{"agent":"work","channel":"slack"}]"#);
        assert_eq!(v["agents.defaults.max_tokens"], "512");
        assert_eq!(v["agents.defaults.model"], "m");
    }

    #[test]
    fn secrets_are_recognised_by_key_and_pointers_are_not() {
        for k in [
            "providers.openai.api_key",
            "channels.http.token",
            "channels.slack.app_token",
            "tools.web_search.api_key",
            "providers.x.headers.Authorization",
            "tools.mcp_servers.gh.env.GH_TOKEN",
            "tools.mcp_servers.gh.env.ANYTHING",
        ] {
            assert!(is_secret_key(k), "{k}");
        }
        for k in [
            "providers.openai.api_key_env",
            "providers.openai.api_key_file",
            "channels.http.bind",
            "tools.mcp_servers.gh.headers_env",
            "agents.defaults.max_tokens",
        ] {
            assert!(!is_secret_key(k), "{k}");
        }
        assert_eq!(
            override_key("CLAWFT_AGENTS__DEFAULTS__MODEL").as_deref(),
            Some("agents.defaults.model")
        );
        assert_eq!(override_key("CLAWFT_HOME"), None);
    }

    #[test]
    fn origins_follow_file_environment_and_default() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.json");
        std::fs::write(
            &path,
            r#"{"providers": {"openai": {"api_key_env": "MY_KEY", "base_url": "http://127.0.0.1:9/v1"}},
                "store": {"path": "/tmp/x"}}"#,
        )
        .unwrap();
        let env = Env::from_pairs([
            ("HOME", dir.path().to_str().unwrap()),
            ("MY_KEY", "k"),
            ("CLAWFT_SESSIONS__MAX_QUEUE", "3"),
        ]);
        let c = super::super::Config::load(Some(&path), &env).unwrap();
        let p = &c.provenance;
        assert_eq!(
            p.origin("providers.openai.api_key").to_string(),
            "environment variable MY_KEY (named by providers.openai.api_key_env)"
        );
        assert_eq!(
            p.origin("providers.openai.base_url").to_string(),
            format!("providers.openai.base_url in {}", path.display())
        );
        assert_eq!(
            p.origin("sessions.max_queue").to_string(),
            "environment variable CLAWFT_SESSIONS__MAX_QUEUE"
        );
        assert_eq!(p.origin("sessions.idle_secs"), Origin::Default);
        let hints = c.provider_hints();
        assert!(hints["openai"].auth.contains("MY_KEY"), "{hints:?}");
        assert!(hints["openai"]
            .connect
            .contains("providers.openai.base_url in"));
    }
}
