//! [`SettingError`]: a setting that does not validate, with the dotted key it is about.

/// A setting that does not validate: which key (dotted path, e.g. `tools.exec.timeout`) and what
/// is expected. Settings types of every module return it, so the config loader reports the key
/// without parsing message text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {detail}")]
pub struct SettingError {
    /// Dotted key path.
    pub key: String,
    /// What is expected, and how to fix it.
    pub detail: String,
}

impl SettingError {
    /// A setting error about `key`.
    pub fn new(key: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            detail: detail.into(),
        }
    }
}
