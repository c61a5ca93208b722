//! `media.*`: caps on the files that arrive with chat messages and the transcription endpoint
//! for voice notes (docs/media.md).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::env::Env;
use super::error::ConfigError;
use super::secrets::resolve_service_secret;
use crate::media::generate::{
    ImageSettings, SpeechBackend, Transcoder, TtsSettings, DEFAULT_IMAGE_COUNT,
    DEFAULT_TTS_MAX_CHARS, MAX_IMAGE_COUNT,
};
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
    /// Speech made by the `tts` tool and spoken answers: an OpenAI-compatible
    /// `/audio/speech` endpoint, or the system's `espeak-ng` when none is set.
    pub tts: Option<TtsFile>,
    /// Images made by the `image` tool: an OpenAI-compatible `/images/generations` endpoint.
    pub images: Option<ImagesFile>,
}

/// `[media.tts]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TtsFile {
    /// Base URL of the API, e.g. `https://api.openai.com/v1`; unset: the system's `espeak-ng`.
    pub base_url: Option<String>,
    /// The model (`gpt-4o-mini-tts`, `tts-1`, ...); required with `base_url`.
    pub model: Option<String>,
    /// The voice (`alloy`, `nova`, ... for the API; an espeak-ng voice such as `en` or `de`
    /// offline).
    pub voice: Option<String>,
    /// The environment variable holding the API key (none for a local server).
    pub api_key_env: Option<String>,
    /// A file holding the API key.
    pub api_key_file: Option<String>,
    /// Use the system's `espeak-ng` when no `base_url` is set (default true).
    pub offline: Option<bool>,
    /// Longest text spoken at once, in characters (default 4096; 1-100000).
    pub max_chars: Option<usize>,
}

/// `[media.images]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImagesFile {
    /// Base URL of the API, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// The model (`gpt-image-1`, `dall-e-3`, ...).
    pub model: String,
    /// The environment variable holding the API key (none for a local server).
    pub api_key_env: Option<String>,
    /// A file holding the API key.
    pub api_key_file: Option<String>,
    /// Size asked when the call names none (default `1024x1024`).
    pub size: Option<String>,
    /// Most images one call makes (default 4; 1-10).
    pub max_count: Option<u32>,
}

/// Where `name` is on `path` (a `PATH` value), if it is an executable file there.
pub fn find_program(path: &str, name: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    path.split(':').filter(|d| !d.is_empty()).find_map(|d| {
        let p = Path::new(d).join(name);
        let m = std::fs::metadata(&p).ok()?;
        (m.is_file() && m.permissions().mode() & 0o111 != 0).then_some(p)
    })
}

/// The search path when the environment has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// An http(s) URL, without its trailing `/`.
fn http_url(key: &str, v: &str) -> Result<String, ConfigError> {
    reqwest::Url::parse(v.trim())
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https"))
        .map(|u| u.as_str().trim_end_matches('/').to_string())
        .ok_or_else(|| ConfigError::Invalid {
            key: key.into(),
            detail: format!("`{v}` is not an http(s) URL; write e.g. https://api.openai.com/v1"),
        })
}

fn resolve_tts(
    raw: Option<TtsFile>,
    config_dir: &Path,
    env: &Env,
    secrets: &mut Vec<Secret>,
) -> Result<(SpeechBackend, usize), ConfigError> {
    let t = raw.unwrap_or_default();
    let max_chars = t.max_chars.unwrap_or(DEFAULT_TTS_MAX_CHARS);
    if !(1..=100_000).contains(&max_chars) {
        return Err(ConfigError::Invalid {
            key: "media.tts.max_chars".into(),
            detail: format!("expected 1 to 100000 (characters), got {max_chars}"),
        });
    }
    let voice = t.voice.filter(|v| !v.trim().is_empty());
    let Some(base) = t.base_url else {
        if t.model.is_some() || t.api_key_env.is_some() || t.api_key_file.is_some() {
            return Err(ConfigError::Invalid {
                key: "media.tts.base_url".into(),
                detail: "a model or key is set but no base_url; write e.g. base_url = \"https://api.openai.com/v1\"".into(),
            });
        }
        if !t.offline.unwrap_or(true) {
            return Ok((SpeechBackend::None, max_chars));
        }
        let path = env.get("PATH").unwrap_or(DEFAULT_PATH);
        return Ok((
            find_program(path, "espeak-ng").map_or(SpeechBackend::None, |path| {
                SpeechBackend::Espeak { path, voice }
            }),
            max_chars,
        ));
    };
    let base_url = http_url("media.tts.base_url", &base)?;
    let model = t
        .model
        .map(|m| m.trim().to_string())
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ConfigError::Invalid {
            key: "media.tts.model".into(),
            detail: "name the speech model, e.g. gpt-4o-mini-tts or tts-1".into(),
        })?;
    let api_key = resolve_service_secret(
        "media.tts.api_key",
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
    Ok((
        SpeechBackend::Http(TtsSettings {
            base_url,
            model,
            voice: voice.unwrap_or_else(|| "alloy".into()),
            api_key,
        }),
        max_chars,
    ))
}

fn resolve_images(
    raw: Option<ImagesFile>,
    config_dir: &Path,
    env: &Env,
    secrets: &mut Vec<Secret>,
) -> Result<Option<ImageSettings>, ConfigError> {
    let Some(i) = raw else {
        return Ok(None);
    };
    let base_url = http_url("media.images.base_url", &i.base_url)?;
    if i.model.trim().is_empty() {
        return Err(ConfigError::Invalid {
            key: "media.images.model".into(),
            detail: "name the image model, e.g. gpt-image-1 or dall-e-3".into(),
        });
    }
    let max_count = i.max_count.unwrap_or(DEFAULT_IMAGE_COUNT);
    if !(1..=MAX_IMAGE_COUNT).contains(&max_count) {
        return Err(ConfigError::Invalid {
            key: "media.images.max_count".into(),
            detail: format!("expected 1 to {MAX_IMAGE_COUNT}, got {max_count}"),
        });
    }
    let size = i.size.unwrap_or_else(|| "1024x1024".into());
    if !crate::media::generate::valid_size(&size) {
        return Err(ConfigError::Invalid {
            key: "media.images.size".into(),
            detail: format!("`{size}` is not a size; write WIDTHxHEIGHT (e.g. 1024x1024, 256 to 4096 each) or auto"),
        });
    }
    let api_key = resolve_service_secret(
        "media.images.api_key",
        None,
        i.api_key_env,
        i.api_key_file,
        config_dir,
        env,
    )?
    .filter(|s| !s.expose().is_empty());
    if let Some(k) = &api_key {
        secrets.push(k.clone());
    }
    Ok(Some(ImageSettings {
        base_url,
        model: i.model.trim().to_string(),
        api_key,
        size,
        max_count,
    }))
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
    let (tts, tts_max_chars) = resolve_tts(raw.tts, config_dir, env, secrets)?;
    let images = resolve_images(raw.images, config_dir, env, secrets)?;
    let path = env.get("PATH").unwrap_or(DEFAULT_PATH);
    let transcoder = find_program(path, "ffmpeg")
        .map(Transcoder::Ffmpeg)
        .or_else(|| find_program(path, "opusenc").map(Transcoder::Opusenc));
    Ok(MediaSettings {
        max_file_bytes,
        max_message_bytes,
        transcription,
        tts,
        tts_max_chars,
        transcoder,
        images,
    })
}
