//! `hooks.NAME`: signed inbound webhooks (`POST /v1/hooks/NAME`, docs/webhooks.md).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::env::Env;
use super::error::ConfigError;
use super::secrets::resolve_service_secret;
use crate::types::session_key::SessionKey;
use crate::types::Secret;

/// The message template when `hooks.NAME.template` is not set.
pub const DEFAULT_TEMPLATE: &str = "Webhook {{name}} delivery {{delivery}}:\n{{body}}";
/// `hooks.NAME.max_body_bytes` when not set (64 KiB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024;

/// One `hooks.NAME` section as written.
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HookFile {
    /// The HMAC-SHA256 key, inline (prefer `secret_env` or `secret_file`). One of the three is
    /// required.
    pub secret: Option<String>,
    /// The environment variable holding the key.
    pub secret_env: Option<String>,
    /// A file holding the key.
    pub secret_file: Option<String>,
    /// The agent that answers (`main` when not set).
    pub agent: Option<String>,
    /// The session the delivery goes to: a chat (`telegram:12345`) or any session id
    /// (`hooks-github`, answered in the HTTP mailbox of that id). `http:hooks-NAME` when not set.
    pub session: Option<String>,
    /// The message, with `{{name}}`, `{{delivery}}` and `{{body}}`.
    pub template: Option<String>,
    /// Largest accepted request body (default 64 KiB; larger: 413).
    pub max_body_bytes: Option<usize>,
}

/// One resolved hook.
#[derive(Clone, Debug)]
pub struct HookConfig {
    /// `NAME`.
    pub name: String,
    /// The HMAC key.
    pub secret: Secret,
    /// The agent that answers.
    pub agent: String,
    /// The session, as written (without the agent).
    pub session: SessionKey,
    /// The message template.
    pub template: String,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
}

/// Whether `name` may name a hook (it is a URL segment and part of an event id).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
}

/// Resolve every `hooks.NAME`; the secrets are pushed to `secrets` (scrubbed everywhere).
///
/// # Errors
/// A bad name, a missing or unreadable secret, an unknown agent, a bad session.
pub(super) fn resolve(
    raw: BTreeMap<String, HookFile>,
    agents: &[&str],
    config_dir: &Path,
    env: &Env,
    secrets: &mut Vec<Secret>,
) -> Result<Vec<HookConfig>, ConfigError> {
    let mut out = Vec::new();
    for (name, f) in raw {
        let key = |k: &str| format!("hooks.{name}.{k}");
        if !valid_name(&name) {
            return Err(ConfigError::Invalid {
                key: format!("hooks.{name}"),
                detail: "a hook name is 1-64 characters of A-Z a-z 0-9 - _ (it is the URL /v1/hooks/NAME)".into(),
            });
        }
        let secret = resolve_service_secret(
            &key("secret"),
            f.secret,
            f.secret_env,
            f.secret_file,
            config_dir,
            env,
        )?
        .filter(|s| !s.expose().is_empty())
        .ok_or_else(|| ConfigError::Invalid {
            key: key("secret"),
            detail: "a hook needs its signing secret: set secret_env (or secret_file, or secret)"
                .into(),
        })?;
        secrets.push(secret.clone());
        let agent = f
            .agent
            .unwrap_or_else(|| crate::types::session_key::DEFAULT_AGENT.to_string());
        if !agents.contains(&agent.as_str()) {
            return Err(ConfigError::Invalid {
                key: key("agent"),
                detail: format!("no agent `{agent}`: expected one of {}", agents.join(", ")),
            });
        }
        let session_text = f.session.unwrap_or_else(|| format!("http:hooks-{name}"));
        let session = SessionKey::parse(&session_text)
            .ok()
            .filter(|s| !s.as_str().starts_with('@'))
            .ok_or_else(|| ConfigError::Invalid {
                key: key("session"),
                detail: format!(
                    "`{session_text}` is not a session: write `channel:chat` (like telegram:12345) or an id without `..`, `/`, `@` (set the agent with `agent`)"
                ),
            })?;
        let max_body_bytes = f.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
        if max_body_bytes == 0 || max_body_bytes > 1024 * 1024 {
            return Err(ConfigError::Invalid {
                key: key("max_body_bytes"),
                detail: format!("expected 1 to 1048576 bytes, got {max_body_bytes}"),
            });
        }
        out.push(HookConfig {
            name,
            secret,
            agent,
            session,
            template: f.template.unwrap_or_else(|| DEFAULT_TEMPLATE.to_string()),
            max_body_bytes,
        });
    }
    Ok(out)
}

/// What a reload compares: every setting of every hook, the secret included.
pub fn fingerprint(hooks: &[HookConfig]) -> Vec<(&str, &str, &str, &str, &str, usize)> {
    hooks
        .iter()
        .map(|h| {
            (
                h.name.as_str(),
                h.secret.expose(),
                h.agent.as_str(),
                h.session.as_str(),
                h.template.as_str(),
                h.max_body_bytes,
            )
        })
        .collect()
}
