//! `[cluster]`: the file's shape ([`ClusterFile`]) and the validated settings
//! ([`ClusterSettings`]). Always compiled, so a configuration with `[cluster]` parses (and is
//! refused with a clear message) in a build without the `cluster` feature.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::types::{Secret, SettingError};

/// Default number of session partitions.
pub const DEFAULT_PARTITIONS: u32 = 64;
/// Default lease time to live, seconds.
pub const DEFAULT_LEASE_TTL_SECS: u64 = 6;

/// `[cluster]` as written. Secrets (`password`, `token`) by indirection as elsewhere
/// (`*_env`, `*_file`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// The NATS servers: one URL (`nats://host:4222`, `tls://host:4222`) or a list; the client
    /// also learns the cluster's other servers from the first it reaches.
    pub nats_url: Option<NatsUrls>,
    /// This node's name in the cluster (default: the host name). 1-64 characters of
    /// A-Z a-z 0-9 - _.
    pub node_id: Option<String>,
    /// Number of session partitions (default 64, 1-4096). Fixed for the life of a cluster.
    pub partitions: Option<u32>,
    /// NATS user (with `password`).
    pub user: Option<String>,
    /// NATS password, inline (prefer `password_env` or `password_file`).
    pub password: Option<String>,
    /// The environment variable holding the password.
    pub password_env: Option<String>,
    /// A file holding the password.
    pub password_file: Option<String>,
    /// NATS token, inline (prefer `token_env` or `token_file`).
    pub token: Option<String>,
    /// The environment variable holding the token.
    pub token_env: Option<String>,
    /// A file holding the token.
    pub token_file: Option<String>,
    /// A file holding an nkey seed (`SU...`).
    pub nkey_file: Option<String>,
    /// A NATS credentials file (user JWT and nkey seed).
    pub creds_file: Option<String>,
    /// A PEM file of the authority that signed the servers' certificates (TLS is then
    /// required).
    pub tls_ca: Option<String>,
    /// The client certificate (PEM), with `tls_key`, for servers that verify clients.
    pub tls_cert: Option<String>,
    /// The client certificate's key (PEM).
    pub tls_key: Option<String>,
    /// Lease time to live in seconds (default 6, 2-300): how long a connection lease outlives
    /// its holder's last renewal.
    pub lease_ttl_secs: Option<u64>,
}

/// One URL or a list.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum NatsUrls {
    /// One server.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// How this node authenticates to NATS.
#[derive(Clone, Debug, PartialEq)]
pub enum NatsAuth {
    /// No credentials.
    None,
    /// User and password.
    UserPassword {
        /// User.
        user: String,
        /// Password.
        password: Secret,
    },
    /// A token.
    Token(Secret),
    /// An nkey seed file.
    NkeyFile(PathBuf),
    /// A credentials file.
    CredsFile(PathBuf),
}

/// The validated `[cluster]`.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSettings {
    /// The servers, as given.
    pub nats_urls: Vec<String>,
    /// This node.
    pub node_id: String,
    /// Session partitions.
    pub partitions: u32,
    /// Credentials.
    pub auth: NatsAuth,
    /// CA of the servers.
    pub tls_ca: Option<PathBuf>,
    /// Client certificate and key.
    pub tls_client: Option<(PathBuf, PathBuf)>,
    /// Lease time to live.
    pub lease_ttl: Duration,
}

/// The secrets of `[cluster]`, resolved by the configuration (which reads the environment).
pub struct ClusterSecrets {
    /// `password*`.
    pub password: Option<Secret>,
    /// `token*`.
    pub token: Option<Secret>,
}

fn key(k: &str) -> String {
    format!("cluster.{k}")
}

fn valid_node_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl ClusterFile {
    /// Validate. `path` turns a file setting into a path (`~/` expanded, relative to the
    /// configuration's directory); `host` is the host name (the default node id).
    ///
    /// # Errors
    /// The first invalid setting, by key, with what is expected.
    pub fn resolve(
        &self,
        secrets: ClusterSecrets,
        path: &dyn Fn(&str) -> PathBuf,
        host: &str,
    ) -> Result<ClusterSettings, SettingError> {
        let urls = match &self.nats_url {
            None => Vec::new(),
            Some(NatsUrls::One(u)) => vec![u.clone()],
            Some(NatsUrls::Many(v)) => v.clone(),
        };
        if urls.is_empty() {
            return Err(SettingError::new(
                key("nats_url"),
                "cluster mode needs at least one NATS server, e.g. nats_url = \"nats://10.0.0.1:4222\" or a list",
            ));
        }
        for u in &urls {
            let scheme_ok = ["nats://", "tls://", "ws://", "wss://"]
                .iter()
                .any(|s| u.starts_with(s))
                || !u.contains("://");
            if !scheme_ok || u.trim().is_empty() || u.contains(char::is_whitespace) {
                return Err(SettingError::new(
                    key("nats_url"),
                    format!("`{u}` is not a NATS server URL (nats://HOST:PORT or tls://HOST:PORT)"),
                ));
            }
        }
        let node_id = match &self.node_id {
            Some(n) => n.clone(),
            None => host
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                        c
                    } else {
                        '-'
                    }
                })
                .take(64)
                .collect(),
        };
        if !valid_node_id(&node_id) {
            return Err(SettingError::new(
                key("node_id"),
                format!("`{node_id}`: a node id is 1-64 characters of A-Z a-z 0-9 - _ (it names the node in leases and in `weft cluster status`)"),
            ));
        }
        let partitions = self.partitions.unwrap_or(DEFAULT_PARTITIONS);
        if !(1..=4096).contains(&partitions) {
            return Err(SettingError::new(
                key("partitions"),
                format!("{partitions}: between 1 and 4096"),
            ));
        }
        let ttl = self.lease_ttl_secs.unwrap_or(DEFAULT_LEASE_TTL_SECS);
        if !(2..=300).contains(&ttl) {
            return Err(SettingError::new(
                key("lease_ttl_secs"),
                format!("{ttl}: between 2 and 300 seconds"),
            ));
        }
        let kinds = [
            secrets.password.is_some() || self.user.is_some(),
            secrets.token.is_some(),
            self.nkey_file.is_some(),
            self.creds_file.is_some(),
        ];
        if kinds.iter().filter(|b| **b).count() > 1 {
            return Err(SettingError::new(
                key("user"),
                "set one way to authenticate: user and password, token, nkey_file or creds_file",
            ));
        }
        let auth = match (&self.user, secrets.password, secrets.token) {
            (Some(u), Some(p), _) => NatsAuth::UserPassword {
                user: u.clone(),
                password: p,
            },
            (Some(_), None, _) => return Err(SettingError::new(
                key("password"),
                "cluster.user is set without a password (password, password_env or password_file)",
            )),
            (None, Some(_), _) => {
                return Err(SettingError::new(
                    key("user"),
                    "cluster.password is set without cluster.user",
                ))
            }
            (None, None, Some(t)) => NatsAuth::Token(t),
            (None, None, None) => match (&self.nkey_file, &self.creds_file) {
                (Some(f), _) => NatsAuth::NkeyFile(path(f)),
                (_, Some(f)) => NatsAuth::CredsFile(path(f)),
                _ => NatsAuth::None,
            },
        };
        let tls_client = match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => Some((path(c), path(k))),
            (None, None) => None,
            _ => {
                return Err(SettingError::new(
                    key("tls_cert"),
                    "tls_cert and tls_key go together (the client certificate and its key)",
                ))
            }
        };
        Ok(ClusterSettings {
            nats_urls: urls,
            node_id,
            partitions,
            auth,
            tls_ca: self.tls_ca.as_deref().map(path),
            tls_client,
            lease_ttl: Duration::from_secs(ttl),
        })
    }
}

/// This machine's host name (the default node id).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "node".into())
}
