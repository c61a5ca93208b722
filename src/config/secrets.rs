//! Secrets by indirection: inline values (refused where they do not belong), `*_env`
//! variables and `*_file` files (relative to `$CREDENTIALS_DIRECTORY`).

use super::{env::*, resolve::*, types::*};
use std::path::Path;

use crate::types::Secret;

pub(super) fn resolve_secret(
    key: &str,
    inline: Option<String>,
    env_name: Option<String>,
    file: Option<String>,
    config_dir: &Path,
    env: &Env,
) -> Result<Option<Secret>, ConfigError> {
    let set = [inline.is_some(), env_name.is_some(), file.is_some()]
        .iter()
        .filter(|b| **b)
        .count();
    if set > 1 {
        return Err(ConfigError::Invalid {
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
            None => Err(ConfigError::Secret {
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
            Ok(_) => Err(ConfigError::Secret {
                key: format!("{key}_file"),
                detail: format!("{} is empty", p.display()),
            }),
            Err(e) => Err(ConfigError::Secret {
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
) -> Result<Option<Secret>, ConfigError> {
    let var = env_name.clone();
    match resolve_secret(key, inline, env_name, file, config_dir, env) {
        Err(ConfigError::Secret { key: via, detail })
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
    provenance: &super::provenance::Provenance,
) -> super::provenance::Origin {
    use super::provenance::Origin;
    if let Some(file) = secret.and_then(crate::types::Secret::file) {
        return Origin::SecretFile {
            file: file.to_path_buf(),
            via: format!("{key}_file"),
        };
    }
    if let Some(var) = env_name {
        let via = match provenance.origin(&format!("{key}_env")) {
            Origin::Env { var: v, .. } => format!("{key}_env set by {v}"),
            _ => format!("{key}_env"),
        };
        return Origin::Env {
            var: var.to_string(),
            via: Some(via),
        };
    }
    provenance.origin(key)
}
