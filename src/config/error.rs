//! [`ConfigError`]: why the configuration could not be loaded, naming the key and what is
//! expected. The bottom of `config/`: every other file may use it, it uses none of them.

use std::path::PathBuf;

use clawft_channel_core::spec::SettingsError;

use crate::types::SettingError;

/// Why the configuration could not be loaded. Every variant names the key and what is expected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file given with `--config` does not exist.
    #[error("config file {0} does not exist (run `weft onboard` to create one)")]
    Missing(PathBuf),
    /// The file is not valid JSON/TOML, has unknown keys or values of the wrong type.
    #[error("invalid configuration in {source_name}: {detail}")]
    Parse {
        /// File (or environment) the error came from.
        source_name: String,
        /// What the parser said, with the key path.
        detail: String,
    },
    /// A value is of the right type but not acceptable.
    #[error("invalid value for `{key}`: {detail}")]
    Invalid {
        /// Dotted key path.
        key: String,
        /// What is expected.
        detail: String,
    },
    /// A secret given by indirection could not be read.
    #[error("cannot read secret for `{key}`: {detail}")]
    Secret {
        /// Dotted key path.
        key: String,
        /// What went wrong and how to fix it.
        detail: String,
    },
}

impl From<SettingError> for ConfigError {
    fn from(e: SettingError) -> Self {
        ConfigError::Invalid {
            key: e.key,
            detail: e.detail,
        }
    }
}

impl From<SettingsError> for ConfigError {
    fn from(e: SettingsError) -> Self {
        match e {
            SettingsError::Invalid { key, detail } => ConfigError::Invalid { key, detail },
            SettingsError::Secret { key, detail } => ConfigError::Secret { key, detail },
        }
    }
}
