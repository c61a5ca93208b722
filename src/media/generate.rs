//! Media made for chats: speech (an OpenAI-compatible `/audio/speech` endpoint, or the
//! system's `espeak-ng` offline, made an Ogg/Opus voice note when the system has `ffmpeg` or
//! `opusenc`) and images (an OpenAI-compatible `/images/generations` endpoint).
//!
//! Every call is bounded: the text spoken, the bytes read back, the images per call and the
//! time a call may take. An image the endpoint names by URL is fetched directly when the URL is
//! on the configured origin and through the SSRF guard otherwise.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use tokio::io::AsyncWriteExt as _;

use super::{read_capped, Media, MediaError};
use crate::net::ssrf::GuardedRequest;
use crate::types::Secret;

/// Default of `media.tts.max_chars` (OpenAI's limit per request).
pub const DEFAULT_TTS_MAX_CHARS: usize = 4096;
/// Default of `media.images.max_count`.
pub const DEFAULT_IMAGE_COUNT: u32 = 4;
/// Largest `media.images.max_count`.
pub const MAX_IMAGE_COUNT: u32 = 10;
/// Largest audio read back from a speech endpoint or a local program.
pub const MAX_AUDIO_BYTES: u64 = 25 * 1024 * 1024;
/// Largest image read back.
pub const MAX_IMAGE_BYTES: u64 = 20 * 1024 * 1024;
/// Longest a speech or image call may take.
pub const GENERATE_TIMEOUT: Duration = Duration::from_secs(120);
/// The model name spend of the offline voice is counted under (priced 0 unless the operator
/// prices it).
pub const ESPEAK_MODEL: &str = "espeak-ng";

/// `media.tts` with an endpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct TtsSettings {
    /// Base URL of an OpenAI-compatible API; `/audio/speech` is appended.
    pub base_url: String,
    /// The model.
    pub model: String,
    /// The voice.
    pub voice: String,
    /// Bearer key, if the endpoint wants one.
    pub api_key: Option<Secret>,
}

/// What speaks.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum SpeechBackend {
    /// Nothing: `tts` is refused.
    #[default]
    None,
    /// An OpenAI-compatible endpoint.
    Http(TtsSettings),
    /// The system's `espeak-ng`, found at start.
    Espeak {
        /// Its path.
        path: PathBuf,
        /// `-v VOICE`, if set.
        voice: Option<String>,
    },
}

impl SpeechBackend {
    /// One line for `weft doctor` and errors.
    pub fn describe(&self) -> String {
        match self {
            Self::None => "none".into(),
            Self::Http(t) => format!("{} at {}", t.model, t.base_url),
            Self::Espeak { path, .. } => format!("espeak-ng (offline) at {}", path.display()),
        }
    }
}

/// A program that makes Ogg/Opus out of WAV.
#[derive(Clone, Debug, PartialEq)]
pub enum Transcoder {
    /// `ffmpeg -i - -c:a libopus -f ogg -`.
    Ffmpeg(PathBuf),
    /// `opusenc - -`.
    Opusenc(PathBuf),
}

impl Transcoder {
    /// Its path.
    pub fn path(&self) -> &std::path::Path {
        match self {
            Self::Ffmpeg(p) | Self::Opusenc(p) => p,
        }
    }
}

/// `media.images`.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageSettings {
    /// Base URL of an OpenAI-compatible API; `/images/generations` is appended.
    pub base_url: String,
    /// The model.
    pub model: String,
    /// Bearer key, if the endpoint wants one.
    pub api_key: Option<Secret>,
    /// The size asked when a call names none.
    pub size: String,
    /// Most images per call.
    pub max_count: u32,
}

/// Whether `s` is an image size an endpoint takes: `auto` or `WxH`, 256 to 4096 each.
pub fn valid_size(s: &str) -> bool {
    if s == "auto" {
        return true;
    }
    let Some((w, h)) = s.split_once('x') else {
        return false;
    };
    [w, h]
        .iter()
        .all(|n| n.parse::<u32>().is_ok_and(|n| (256..=4096).contains(&n)))
}

/// Speech made.
#[derive(Clone, Debug, PartialEq)]
pub struct Spoken {
    /// The audio.
    pub bytes: Vec<u8>,
    /// Its type, sniffed (`audio/ogg`, `audio/wav`, `audio/mpeg`, ...).
    pub mime: &'static str,
    /// The model spend is counted under (`espeak-ng` offline).
    pub model: String,
    /// Characters spoken.
    pub chars: u64,
    /// Seconds of audio, when known (WAV).
    pub seconds: Option<f64>,
}

/// One image made.
#[derive(Clone, Debug, PartialEq)]
pub struct Made {
    /// The bytes.
    pub bytes: Vec<u8>,
    /// Their type, sniffed.
    pub mime: &'static str,
}

/// A WAV's playing time, from its header.
pub fn wav_seconds(b: &[u8]) -> Option<f64> {
    if b.len() < 44 || &b[..4] != b"RIFF" || &b[8..12] != b"WAVE" {
        return None;
    }
    let rate = u32::from_le_bytes([b[28], b[29], b[30], b[31]]);
    (rate > 0).then(|| (b.len() - 44) as f64 / f64::from(rate))
}

/// `espeak-ng --stdout` cannot seek back: its header says "unknown length". Write the real
/// lengths, so every player (and Telegram's) shows the right duration.
fn fix_wav_lengths(b: &mut [u8]) {
    if b.len() >= 44 && &b[..4] == b"RIFF" && &b[36..40] == b"data" {
        let total = u32::try_from(b.len() - 8).unwrap_or(u32::MAX);
        let data = u32::try_from(b.len() - 44).unwrap_or(u32::MAX);
        b[4..8].copy_from_slice(&total.to_le_bytes());
        b[40..44].copy_from_slice(&data.to_le_bytes());
    }
}

/// Run `cmd` with `input` on its stdin; its stdout, at most [`MAX_AUDIO_BYTES`].
async fn pipe(mut cmd: tokio::process::Command, input: &[u8]) -> Result<Vec<u8>, MediaError> {
    let name = cmd.as_std().get_program().to_string_lossy().into_owned();
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| MediaError::Failed(format!("{name} could not start: {e}")))?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| MediaError::Failed(format!("{name}: no stdin")))?;
    let input = input.to_vec();
    let writer = tokio::spawn(async move {
        let _ = stdin.write_all(&input).await;
        drop(stdin);
    });
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| MediaError::Failed(format!("{name}: no stdout")))?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        use tokio::io::AsyncReadExt as _;
        let n = stdout
            .read(&mut buf)
            .await
            .map_err(|e| MediaError::Failed(format!("{name}: {e}")))?;
        if n == 0 {
            break;
        }
        if (out.len() + n) as u64 > MAX_AUDIO_BYTES {
            let _ = child.kill().await;
            return Err(MediaError::TooLarge);
        }
        out.extend_from_slice(&buf[..n]);
    }
    let _ = writer.await;
    let status = child
        .wait()
        .await
        .map_err(|e| MediaError::Failed(format!("{name}: {e}")))?;
    if !status.success() || out.is_empty() {
        return Err(MediaError::Failed(format!("{name} failed ({status})")));
    }
    Ok(out)
}

impl Media {
    /// Whether `tts` has something to speak with.
    pub fn speaks(&self) -> bool {
        self.settings.tts != SpeechBackend::None
    }

    /// Speak `text` (with `voice`, or the configured one): Ogg/Opus from an endpoint, or
    /// `espeak-ng`'s WAV made Ogg/Opus when a transcoder is installed.
    ///
    /// # Errors
    /// No backend, text too long or empty, the endpoint or program failed, too large, timeout.
    pub async fn speak(&self, text: &str, voice: Option<&str>) -> Result<Spoken, MediaError> {
        let text = text.trim();
        let chars = text.chars().count();
        if chars == 0 {
            return Err(MediaError::Refused("there is no text to speak".into()));
        }
        if chars > self.settings.tts_max_chars {
            return Err(MediaError::Refused(format!(
                "the text is {chars} characters; at most {} are spoken at once (media.tts.max_chars): split it",
                self.settings.tts_max_chars
            )));
        }
        let call = async {
            match &self.settings.tts {
                SpeechBackend::None => Err(MediaError::Refused(NO_SPEECH.into())),
                SpeechBackend::Http(t) => {
                    let bytes = self.speak_http(t, text, voice).await?;
                    Ok((bytes, t.model.clone()))
                }
                SpeechBackend::Espeak { path, voice: v } => {
                    let mut cmd = tokio::process::Command::new(path);
                    if let Some(v) = voice.or(v.as_deref()) {
                        cmd.arg("-v").arg(v);
                    }
                    cmd.arg("--stdout");
                    let mut wav = pipe(cmd, text.as_bytes()).await?;
                    fix_wav_lengths(&mut wav);
                    let bytes = match &self.settings.transcoder {
                        Some(t) => match self.to_opus(t, &wav).await {
                            Ok(ogg) => ogg,
                            Err(e) => {
                                tracing::warn!(error = %e, "speech not made a voice note; sent as WAV");
                                wav
                            }
                        },
                        None => wav,
                    };
                    Ok((bytes, ESPEAK_MODEL.to_string()))
                }
            }
        };
        let (bytes, model) = tokio::time::timeout(GENERATE_TIMEOUT, call)
            .await
            .map_err(|_| MediaError::Failed("speech timed out".into()))??;
        let mime = crate::types::sniff::sniff(&bytes).unwrap_or("application/octet-stream");
        if !mime.starts_with("audio/") {
            return Err(MediaError::Failed(format!(
                "the speech endpoint answered {mime}, not audio"
            )));
        }
        Ok(Spoken {
            seconds: wav_seconds(&bytes),
            bytes,
            mime,
            model,
            chars: chars as u64,
        })
    }

    async fn to_opus(&self, t: &Transcoder, wav: &[u8]) -> Result<Vec<u8>, MediaError> {
        let mut cmd = tokio::process::Command::new(t.path());
        match t {
            Transcoder::Ffmpeg(_) => {
                cmd.args([
                    "-hide_banner",
                    "-loglevel",
                    "error",
                    "-i",
                    "pipe:0",
                    "-c:a",
                    "libopus",
                    "-b:a",
                    "32k",
                    "-f",
                    "ogg",
                    "pipe:1",
                ]);
            }
            Transcoder::Opusenc(_) => {
                cmd.args(["--quiet", "-", "-"]);
            }
        }
        let out = pipe(cmd, wav).await?;
        if crate::types::sniff::sniff(&out) == Some("audio/ogg") {
            Ok(out)
        } else {
            Err(MediaError::Failed("the transcoder made no Ogg".into()))
        }
    }

    async fn speak_http(
        &self,
        t: &TtsSettings,
        text: &str,
        voice: Option<&str>,
    ) -> Result<Vec<u8>, MediaError> {
        let body = serde_json::json!({
            "model": t.model,
            "input": text,
            "voice": voice.unwrap_or(&t.voice),
            "response_format": "opus",
        });
        let url = format!("{}/audio/speech", t.base_url);
        let mut rb = self.direct.post(url).json(&body);
        if let Some(k) = &t.api_key {
            rb = rb.bearer_auth(k.expose());
        }
        let resp = rb
            .send()
            .await
            .map_err(|e| MediaError::Failed(e.without_url().to_string()))?;
        if !resp.status().is_success() {
            return Err(endpoint_error("speech", resp).await);
        }
        read_capped(resp, MAX_AUDIO_BYTES).await
    }

    /// Whether `image` has an endpoint.
    pub fn draws(&self) -> bool {
        self.settings.images.is_some()
    }

    /// Make `count` images of `prompt` at `size` (or the configured one).
    ///
    /// # Errors
    /// No endpoint, a bad size or count, the endpoint failed, an image too large, timeout.
    pub async fn draw(
        &self,
        prompt: &str,
        size: Option<&str>,
        count: u32,
    ) -> Result<(Vec<Made>, String), MediaError> {
        let Some(s) = &self.settings.images else {
            return Err(MediaError::Refused(NO_IMAGES.into()));
        };
        if prompt.trim().is_empty() {
            return Err(MediaError::Refused("the prompt is empty".into()));
        }
        if prompt.chars().count() > MAX_PROMPT_CHARS {
            return Err(MediaError::Refused(format!(
                "the prompt is over {MAX_PROMPT_CHARS} characters"
            )));
        }
        if count == 0 || count > s.max_count {
            return Err(MediaError::Refused(format!(
                "count must be 1 to {} (media.images.max_count)",
                s.max_count
            )));
        }
        let size = size.unwrap_or(&s.size);
        if !valid_size(size) {
            return Err(MediaError::Refused(format!(
                "`{size}` is not a size; write WIDTHxHEIGHT such as 1024x1024, or auto"
            )));
        }
        let call = async {
            let body = serde_json::json!({
                "model": s.model,
                "prompt": prompt,
                "n": count,
                "size": size,
            });
            let url = format!("{}/images/generations", s.base_url);
            let mut rb = self.direct.post(url).json(&body);
            if let Some(k) = &s.api_key {
                rb = rb.bearer_auth(k.expose());
            }
            let resp = rb
                .send()
                .await
                .map_err(|e| MediaError::Failed(e.without_url().to_string()))?;
            if !resp.status().is_success() {
                return Err(endpoint_error("image", resp).await);
            }
            // Base64 of every image: a third more than the images themselves.
            let cap = MAX_IMAGE_BYTES * 4 / 3 * u64::from(count) + 64 * 1024;
            let raw = read_capped(resp, cap).await?;
            let v: serde_json::Value = serde_json::from_slice(&raw)
                .map_err(|_| MediaError::Failed("the image endpoint did not answer JSON".into()))?;
            let data = v
                .get("data")
                .and_then(serde_json::Value::as_array)
                .filter(|d| !d.is_empty())
                .ok_or_else(|| MediaError::Failed("the image answer has no `data`".into()))?;
            let mut made = Vec::new();
            for d in data.iter().take(count as usize) {
                let bytes = if let Some(b) = d.get("b64_json").and_then(serde_json::Value::as_str) {
                    let b = base64::engine::general_purpose::STANDARD
                        .decode(b.trim())
                        .map_err(|_| MediaError::Failed("an image is not valid base64".into()))?;
                    if b.len() as u64 > MAX_IMAGE_BYTES {
                        return Err(MediaError::TooLarge);
                    }
                    b
                } else if let Some(u) = d.get("url").and_then(serde_json::Value::as_str) {
                    self.fetch_image(&s.base_url, u).await?
                } else {
                    return Err(MediaError::Failed(
                        "an image has neither `b64_json` nor `url`".into(),
                    ));
                };
                let mime = crate::types::sniff::sniff(&bytes).unwrap_or("application/octet-stream");
                if !mime.starts_with("image/") {
                    return Err(MediaError::Failed(format!(
                        "the image endpoint sent {mime}, not an image"
                    )));
                }
                made.push(Made { bytes, mime });
            }
            Ok(made)
        };
        let made = tokio::time::timeout(GENERATE_TIMEOUT, call)
            .await
            .map_err(|_| MediaError::Failed("image generation timed out".into()))??;
        Ok((made, s.model.clone()))
    }

    /// An image the endpoint named by URL: directly on the configured origin, through the
    /// SSRF guard anywhere else.
    async fn fetch_image(&self, base: &str, url: &str) -> Result<Vec<u8>, MediaError> {
        let u = reqwest::Url::parse(url)
            .map_err(|e| MediaError::Refused(format!("the image URL is not a URL: {e}")))?;
        let same_origin = reqwest::Url::parse(base).is_ok_and(|b| b.origin() == u.origin());
        let resp = if same_origin {
            self.direct
                .get(u)
                .send()
                .await
                .map_err(|e| MediaError::Failed(e.without_url().to_string()))?
        } else {
            let (resp, _) = self
                .guarded
                .send(GuardedRequest {
                    method: reqwest::Method::GET,
                    url: u,
                    headers: reqwest::header::HeaderMap::new(),
                    body: None,
                })
                .await
                .map_err(|e| match e {
                    crate::net::ssrf::FetchError::Blocked(b) => MediaError::Blocked(format!(
                        "the image endpoint answered with a URL the SSRF guard refuses: {b}"
                    )),
                    other => MediaError::Failed(other.to_string()),
                })?;
            resp
        };
        if !resp.status().is_success() {
            return Err(MediaError::Failed(format!(
                "fetching the image answered {}",
                resp.status()
            )));
        }
        read_capped(resp, MAX_IMAGE_BYTES).await
    }
}

/// Longest image prompt, in characters (OpenAI's for `gpt-image-1`).
pub const MAX_PROMPT_CHARS: usize = 32_000;

/// The error of `tts` without a backend.
pub const NO_SPEECH: &str = "no speech backend is configured: set [media.tts] base_url and model (an OpenAI-compatible /audio/speech endpoint), or install espeak-ng for offline speech";
/// The error of `image` without an endpoint.
pub const NO_IMAGES: &str = "no image backend is configured: set [media.images] base_url and model (an OpenAI-compatible /images/generations endpoint)";

/// An endpoint's error answer, briefly (its `error.message` when it has one).
async fn endpoint_error(what: &str, resp: reqwest::Response) -> MediaError {
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    let msg = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .and_then(serde_json::Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_else(|| text.chars().take(200).collect());
    MediaError::Failed(format!("the {what} endpoint answered {status}: {msg}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sizes_and_wav_lengths() {
        assert!(valid_size("1024x1024") && valid_size("auto") && valid_size("1536x1024"));
        assert!(!valid_size("10x10") && !valid_size("big") && !valid_size("1024x"));
        let mut wav = b"RIFF\xff\xff\xff\x7fWAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00\x22\x56\x00\x00\x44\xac\x00\x00\x02\x00\x10\x00data\xff\xff\xff\x7f".to_vec();
        wav.extend(std::iter::repeat_n(0u8, 22050 * 2));
        fix_wav_lengths(&mut wav);
        assert_eq!(&wav[4..8], &(wav.len() as u32 - 8).to_le_bytes());
        assert_eq!(&wav[40..44], &(22050u32 * 2).to_le_bytes());
        assert!((wav_seconds(&wav).unwrap() - 1.0).abs() < 1e-9);
    }
}
