//! `media.*`: caps on the files that arrive with chat messages and the transcription endpoint
//! for voice notes (docs/media.md).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::env::Env;
use super::secrets::resolve_service_secret;
use super::types::ConfigError;
use crate::media::{
    MediaSettings, TranscriptionSettings, DEFAULT_MAX_FILE_MB, DEFAULT_MAX_MESSAGE_MB,
};
use crate::types::Secret;

/// `[media]` as written.
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MediaFile {
    /// Largest attachment downloaded, in MB (default 20; 1-2000). Larger ones are named to the
    /// model as not downloaded.
    pub max_file_mb: Option<u64>,
    /// Most MB downloaded for one message, all its attachments together (default 50).
    pub max_message_mb: Option<u64>,
    /// Voice notes and audio transcribed through an OpenAI-compatible
    /// `/audio/transcriptions` endpoint (hosted Whisper, a local whisper.cpp server).
    pub transcription: Option<TranscriptionFile>,
}

/// `[media.transcription]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TranscriptionFile {
    /// Base URL of the API, e.g. `https://api.openai.com/v1` or `http://127.0.0.1:8080/v1`.
    pub base_url: String,
    /// The model (`whisper-1`, `gpt-4o-mini-transcribe`, or what the local server names).
    pub model: String,
    /// The environment variable holding the API key (none for a local server).
    pub api_key_env: Option<String>,
    /// A file holding the API key.
    pub api_key_file: Option<String>,
    /// Language hint, ISO-639-1 (`en`, `de`); the endpoint guesses when not set.
    pub language: Option<String>,
}

/// Resolve `[media]`; the key goes to `secrets` (scrubbed everywhere).
///
/// # Errors
/// Out-of-range sizes, a bad URL, an empty model, a missing key variable.
pub(super) fn resolve(
    raw: MediaFile,
    config_dir: &Path,
    env: &Env,
    secrets: &mut Vec<Secret>,
) -> Result<MediaSettings, ConfigError> {
    let mb = |key: &str, v: Option<u64>, default: u64| -> Result<u64, ConfigError> {
        let v = v.unwrap_or(default);
        if !(1..=2000).contains(&v) {
            return Err(ConfigError::Invalid {
                key: format!("media.{key}"),
                detail: format!("expected 1 to 2000 (MB), got {v}"),
            });
        }
        Ok(v * 1024 * 1024)
    };
    let max_file_bytes = mb("max_file_mb", raw.max_file_mb, DEFAULT_MAX_FILE_MB)?;
    let max_message_bytes = mb("max_message_mb", raw.max_message_mb, DEFAULT_MAX_MESSAGE_MB)?;
    if max_message_bytes < max_file_bytes {
        return Err(ConfigError::Invalid {
            key: "media.max_message_mb".into(),
            detail: "must be at least media.max_file_mb (one file is part of a message)".into(),
        });
    }
    let transcription = match raw.transcription {
        None => None,
        Some(t) => {
            let url = reqwest::Url::parse(t.base_url.trim())
                .ok()
                .filter(|u| matches!(u.scheme(), "http" | "https"))
                .ok_or_else(|| ConfigError::Invalid {
                    key: "media.transcription.base_url".into(),
                    detail: format!(
                        "`{}` is not an http(s) URL; write e.g. https://api.openai.com/v1",
                        t.base_url
                    ),
                })?;
            if t.model.trim().is_empty() {
                return Err(ConfigError::Invalid {
                    key: "media.transcription.model".into(),
                    detail: "name the transcription model, e.g. whisper-1".into(),
                });
            }
            let api_key = resolve_service_secret(
                "media.transcription.api_key",
                None,
                t.api_key_env,
                t.api_key_file,
                config_dir,
                env,
            )?
            .filter(|s| !s.expose().is_empty());
            if let Some(k) = &api_key {
                secrets.push(k.clone());
            }
            Some(TranscriptionSettings {
                base_url: url.as_str().trim_end_matches('/').to_string(),
                model: t.model.trim().to_string(),
                api_key,
                language: t.language.filter(|l| !l.trim().is_empty()),
            })
        }
    };
    Ok(MediaSettings {
        max_file_bytes,
        max_message_bytes,
        transcription,
    })
}
