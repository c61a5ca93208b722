//! Secrets by indirection: inline values (refused where they do not belong), `*_env`
//! variables and `*_file` files (relative to `$CREDENTIALS_DIRECTORY`), for the gateway's own
//! settings and, through [`ChannelSecrets`], for the chat platforms' crates.

use std::path::{Path, PathBuf};

use clawft_channel_core::spec::{Resolver, SecretForms, SettingsError};

use super::env::{expand, DeferredSecret, Env};
use super::provenance::{Origin, Provenance};
use crate::types::Secret;

/// The secret of setting `key` from whichever of its forms is set; `None` when none is.
///
/// # Errors
/// More than one form set; the variable unset; the file unreadable or empty.
pub(super) fn resolve_secret(
    key: &str,
    inline: Option<String>,
    env_name: Option<String>,
    file: Option<String>,
    config_dir: &Path,
    env: &Env,
) -> Result<Option<Secret>, SettingsError> {
    let set = [inline.is_some(), env_name.is_some(), file.is_some()]
        .iter()
        .filter(|b| **b)
        .count();
    if set > 1 {
        return Err(SettingsError::Invalid {
            key: key.into(),
            detail: format!("set only one of `{key}`, `{key}_env`, `{key}_file`"),
        });
    }
    if let Some(v) = inline {
        return Ok(Some(Secret::new(v)));
    }
    if let Some(name) = env_name {
        return match env.get(&name) {
            Some(v) => Ok(Some(Secret::new(v))),
            None => Err(SettingsError::Secret {
                key: format!("{key}_env"),
                detail: format!("environment variable {name} is not set"),
            }),
        };
    }
    if let Some(f) = file {
        let p = expand(&f, env);
        let p = if p.is_absolute() {
            p
        } else if let Some(dir) = env.get("CREDENTIALS_DIRECTORY") {
            Path::new(dir).join(p)
        } else {
            config_dir.join(p)
        };
        return match std::fs::read_to_string(&p) {
            Ok(v) if !v.trim().is_empty() => Ok(Some(Secret::from_file(v.trim(), p))),
            Ok(_) => Err(SettingsError::Secret {
                key: format!("{key}_file"),
                detail: format!("{} is empty", p.display()),
            }),
            Err(e) => Err(SettingsError::Secret {
                key: format!("{key}_file"),
                detail: format!("{}: {e}", p.display()),
            }),
        };
    }
    Ok(None)
}

/// A secret only the running service uses (a chat channel's tokens, a webhook's secret, the
/// transcription key): as [`resolve_secret`], but in a client's environment
/// ([`Env::for_client`]) one that cannot be read is recorded in the config's
/// `deferred_secrets` and stands in as an empty value, so commands that never use it work
/// from a shell that does not hold it.
pub(super) fn resolve_service_secret(
    key: &str,
    inline: Option<String>,
    env_name: Option<String>,
    file: Option<String>,
    config_dir: &Path,
    env: &Env,
) -> Result<Option<Secret>, SettingsError> {
    let var = env_name.clone();
    match resolve_secret(key, inline, env_name, file, config_dir, env) {
        Err(SettingsError::Secret { key: via, detail })
            if env.defer(DeferredSecret {
                key: key.to_string(),
                var,
                reason: format!("{via}: {detail}"),
            }) =>
        {
            // Distinct per key: two accounts both unread must not look like one shared token.
            Ok(Some(Secret::new(format!("(unset: {key})"))))
        }
        r => r,
    }
}

/// Where the secret of `key` resolved by [`resolve_secret`] came from, given which of its
/// forms was set (`env_name`: the `*_env` variable) and the secret read.
pub(super) fn secret_origin(
    key: &str,
    env_name: Option<&str>,
    secret: Option<&crate::types::Secret>,
    provenance: &Provenance,
) -> Origin {
    if let Some(file) = secret.and_then(crate::types::Secret::file) {
        return Origin::SecretFile {
            file: file.to_path_buf(),
            via: format!("{key}_file"),
        };
    }
    if let Some(var) = env_name {
        let via = match provenance.origin(&format!("{key}_env")) {
            Origin::Env { var: v, .. } => format!("{key}_env set by {v}"),
            Origin::File { .. } | Origin::SecretFile { .. } | Origin::Default => {
                format!("{key}_env")
            }
        };
        return Origin::Env {
            var: var.to_string(),
            via: Some(via),
        };
    }
    provenance.origin(key)
}

/// The chat platforms' secrets (their crates' settings ask for them through [`Resolver`]):
/// service secrets, each registered with the scrubber.
pub(super) struct ChannelSecrets<'a> {
    /// The config file's directory (`*_file` without `$CREDENTIALS_DIRECTORY`, other files).
    pub config_dir: &'a Path,
    /// The environment.
    pub env: &'a Env,
    /// Every secret value, for the scrubber.
    pub secrets: &'a mut Vec<Secret>,
}

impl Resolver for ChannelSecrets<'_> {
    fn secret(&mut self, key: &str, forms: SecretForms) -> Result<Option<Secret>, SettingsError> {
        let s = resolve_service_secret(
            key,
            forms.inline,
            forms.env,
            forms.file,
            self.config_dir,
            self.env,
        )?;
        if let Some(s) = s.as_ref().filter(|s| !s.expose().is_empty()) {
            self.secrets.push(s.clone());
        }
        Ok(s)
    }

    fn config_path(&self, path: &str) -> PathBuf {
        self.config_dir.join(path)
    }
}
