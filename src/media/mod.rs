//! ④ Files that arrive with chat messages: downloaded (size caps per file and per message,
//! the SSRF guard for every URL that is not the platform's configured API origin), typed by
//! their bytes ([`sniff`]), written into the agent's workspace under
//! `inbox/<date>/<id>-<name>` (contained like every file tool), voice notes transcribed through
//! an OpenAI-compatible `/audio/transcriptions` endpoint, and the message the model gets
//! rewritten to name the files ([`Media::prepare`]).
//!
//! Everything here is idempotent per event: a turn resumed after a crash finds the files (and
//! transcripts) it already wrote instead of fetching them again.

pub mod generate;
pub mod tools;

use crate::types::sniff;
use crate::types::sniff::safe_file_name;

use std::sync::Arc;
use std::time::Duration;

use clawft_channel_core::media::{MediaKind, MediaRef, MediaRequest, Multipart};
use clawft_channel_core::{Channel, InboundEvent};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tokio_util::sync::CancellationToken;

use crate::llm::ImagePart;
use crate::net::ssrf::{ClientBuildError, GuardedClient, GuardedRequest, SsrfPolicy};
use crate::tools::workspace::{write_atomic, Workspace};
use crate::types::Secret;

/// Default of `media.max_file_mb`.
pub const DEFAULT_MAX_FILE_MB: u64 = 20;
/// Default of `media.max_message_mb`.
pub const DEFAULT_MAX_MESSAGE_MB: u64 = 50;
/// Largest image sent to a model as an image part: Anthropic's limit per image (OpenAI's is
/// 20 MB); larger images are only named in the text.
pub const MAX_MODEL_IMAGE_BYTES: u64 = 5 * 1024 * 1024;
/// Longest a download or a transcription may take.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(120);

/// `media.transcription`: where voice notes and audio are transcribed.
#[derive(Clone, Debug, PartialEq)]
pub struct TranscriptionSettings {
    /// Base URL of an OpenAI-compatible API (`https://api.openai.com/v1`, a local
    /// whisper.cpp server); `/audio/transcriptions` is appended.
    pub base_url: String,
    /// The model (`whisper-1`, `gpt-4o-mini-transcribe`, ...).
    pub model: String,
    /// Bearer key, if the endpoint wants one.
    pub api_key: Option<Secret>,
    /// Language hint (ISO-639-1), if set.
    pub language: Option<String>,
}

/// `media.*`, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct MediaSettings {
    /// Largest file downloaded, in bytes.
    pub max_file_bytes: u64,
    /// Most bytes downloaded for one message, in bytes.
    pub max_message_bytes: u64,
    /// The transcription endpoint, if configured.
    pub transcription: Option<TranscriptionSettings>,
    /// What speaks (`media.tts`).
    pub tts: generate::SpeechBackend,
    /// Longest text spoken at once, in characters.
    pub tts_max_chars: usize,
    /// What turns speech into an Ogg/Opus voice note, when the system has one.
    pub transcoder: Option<generate::Transcoder>,
    /// The image endpoint, if configured (`media.images`).
    pub images: Option<generate::ImageSettings>,
}

impl Default for MediaSettings {
    fn default() -> Self {
        Self {
            max_file_bytes: DEFAULT_MAX_FILE_MB * 1024 * 1024,
            max_message_bytes: DEFAULT_MAX_MESSAGE_MB * 1024 * 1024,
            transcription: None,
            tts: generate::SpeechBackend::None,
            tts_max_chars: generate::DEFAULT_TTS_MAX_CHARS,
            transcoder: None,
            images: None,
        }
    }
}

/// Why one attachment was not fetched.
#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    /// Over a cap.
    #[error("over the size limit")]
    TooLarge,
    /// Refused by the SSRF guard (or an unusable URL).
    #[error("refused: {0}")]
    Refused(String),
    /// The platform or the network failed.
    #[error("{0}")]
    Failed(String),
    /// A URL an endpoint's answer named, refused by the SSRF guard.
    #[error("{0}")]
    Blocked(String),
}

/// The message a turn starts from once its attachments are in the workspace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Prepared {
    /// The text for the model: the user's text (or a voice note's transcript) and one line per
    /// file saying where it is.
    pub text: String,
    /// The images, for models that can see.
    pub images: Vec<ImagePart>,
}

/// Downloads and transcriptions (one per daemon; cheap to share).
pub struct Media {
    settings: MediaSettings,
    guarded: GuardedClient,
    direct: reqwest::Client,
}

impl std::fmt::Debug for Media {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Media")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// `12.3 MB`, `45 KB`.
pub fn human_size(n: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let mb = n as f64 / (1024.0 * 1024.0);
    if mb >= 1.0 {
        format!("{mb:.1} MB")
    } else {
        format!("{} KB", n.div_ceil(1024))
    }
}

/// The UTC date of `ms` since the epoch, `YYYY-MM-DD`.
fn date_of(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map_or_else(
            || "1970-01-01".to_string(),
            |d| d.format("%Y-%m-%d").to_string(),
        )
}

/// One attachment's outcome, for the text.
enum Saved {
    File {
        rel: String,
        mime: &'static str,
        size: u64,
        transcript: Option<String>,
        transcript_error: Option<String>,
    },
    Skipped(String),
}

impl Media {
    /// The downloader: the guarded client for platform URLs, a direct one for the configured
    /// API origins and the transcription endpoint.
    ///
    /// # Errors
    /// An HTTP client cannot be built (TLS initialisation).
    pub fn new(settings: MediaSettings) -> Result<Self, ClientBuildError> {
        let guarded = GuardedClient::new(
            SsrfPolicy::new(Vec::new()),
            3,
            Duration::from_secs(10),
            concat!("weft/", env!("CARGO_PKG_VERSION")),
        )?;
        let direct = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| ClientBuildError {
                tool: "media",
                reason: e.to_string(),
            })?;
        Ok(Self {
            settings,
            guarded,
            direct,
        })
    }

    /// The settings in use.
    pub fn settings(&self) -> &MediaSettings {
        &self.settings
    }

    /// Fetch the attachments of `ev` through `channel` into `ws`, transcribe speech, and build
    /// the message the model gets. Never fails: a file that cannot be fetched is named with the
    /// reason instead.
    pub async fn prepare(
        &self,
        ws: &Workspace,
        ev: &InboundEvent,
        channel: Option<Arc<dyn Channel>>,
        cancel: &CancellationToken,
    ) -> Prepared {
        let date = date_of(ev.received_at_ms);
        let id = safe_file_name(ev.event_id.as_str());
        let many = ev.attachments.len() > 1;
        let mut budget = self.settings.max_message_bytes;
        let mut saved = Vec::with_capacity(ev.attachments.len());
        for (i, m) in ev.attachments.iter().enumerate() {
            let shown = m
                .name
                .clone()
                .unwrap_or_else(|| m.kind.describe().to_string());
            let stem = match &m.name {
                Some(n) => safe_file_name(n),
                None => m.kind.describe().replace(' ', "_"),
            };
            let base = if many {
                format!("inbox/{date}/{id}-{}-{stem}", i + 1)
            } else {
                format!("inbox/{date}/{id}-{stem}")
            };
            let outcome = tokio::select! {
                r = self.save_one(ws, m, &base, &shown, channel.as_deref(), &mut budget) => r,
                () = cancel.cancelled() => Saved::Skipped(format!("{shown}: the download was stopped")),
            };
            saved.push((m.kind, outcome));
        }
        self.compose(ev, saved)
    }

    /// Fetch (or find) one attachment and transcribe it when it is speech.
    async fn save_one(
        &self,
        ws: &Workspace,
        m: &MediaRef,
        base: &str,
        shown: &str,
        channel: Option<&dyn Channel>,
        budget: &mut u64,
    ) -> Saved {
        let limit = self.settings.max_file_bytes.min(*budget);
        let over = |size: u64| {
            if size > self.settings.max_file_bytes {
                format!(
                    "{shown} ({}) is over the {} limit per file",
                    human_size(size),
                    human_size(self.settings.max_file_bytes)
                )
            } else {
                format!(
                    "{shown} ({}) would exceed the {} limit per message",
                    human_size(size),
                    human_size(self.settings.max_message_bytes)
                )
            }
        };
        // A file saved by an earlier attempt of this turn (any extension).
        let (bytes, rel, mime) = match find_saved(ws, base, limit) {
            Some((b, rel)) => {
                let mime = sniff::sniff(&b).unwrap_or("application/octet-stream");
                (b, rel, mime)
            }
            None => {
                if let Some(size) = m.size.filter(|s| *s > limit) {
                    return Saved::Skipped(over(size));
                }
                let Some(ch) = channel else {
                    return Saved::Skipped(format!(
                        "{shown}: its channel is not running, so it could not be downloaded"
                    ));
                };
                let req = match ch.media_request(m).await {
                    Ok(r) => r,
                    Err(e) => return Saved::Skipped(format!("{shown}: {e}")),
                };
                let bytes = match self.download(&req, limit).await {
                    Ok(b) => b,
                    Err(MediaError::TooLarge) => {
                        return Saved::Skipped(over(limit.saturating_add(1)));
                    }
                    Err(e) => {
                        tracing::warn!(file = %shown, error = %e, "attachment not downloaded");
                        return Saved::Skipped(format!("{shown} could not be downloaded: {e}"));
                    }
                };
                let mime = sniff::sniff(&bytes).unwrap_or("application/octet-stream");
                let rel = with_extension(base, mime);
                if let Err(e) = write_file(ws, &rel, &bytes) {
                    return Saved::Skipped(format!("{shown} could not be saved: {e}"));
                }
                (bytes, rel, mime)
            }
        };
        let size = bytes.len() as u64;
        *budget = budget.saturating_sub(size);
        let (mut transcript, mut transcript_error) = (None, None);
        let speech = m.kind.is_audio() || mime.starts_with("audio/");
        if speech {
            if let Some(t) = &self.settings.transcription {
                let sidecar = format!("{rel}.txt");
                match ws.read_beneath(&sidecar, 1 << 20) {
                    Ok(Some(b)) => transcript = Some(String::from_utf8_lossy(&b).into_owned()),
                    _ => match self.transcribe(t, &bytes, &rel, mime).await {
                        Ok(text) => {
                            if let Err(e) = write_file(ws, &sidecar, text.as_bytes()) {
                                tracing::warn!(error = %e, "transcript not cached");
                            }
                            transcript = Some(text);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "transcription failed");
                            transcript_error = Some(e.to_string());
                        }
                    },
                }
            }
        }
        Saved::File {
            rel,
            mime,
            size,
            transcript,
            transcript_error,
        }
    }

    /// The text and images of the prepared message.
    fn compose(&self, ev: &InboundEvent, saved: Vec<(MediaKind, Saved)>) -> Prepared {
        let mut body = ev.content.trim().to_string();
        let mut notes = Vec::new();
        let mut images = Vec::new();
        let only_speech = body.is_empty()
            && saved.len() == 1
            && matches!(
                &saved[0].1,
                Saved::File {
                    transcript: Some(_),
                    ..
                }
            );
        for (kind, s) in saved {
            match s {
                Saved::File {
                    rel,
                    mime,
                    size,
                    transcript,
                    transcript_error,
                } => {
                    let what = if mime.starts_with("image/") {
                        "image"
                    } else {
                        kind.describe()
                    };
                    let mut line =
                        format!("[Attached {what}: {rel} ({mime}, {})", human_size(size));
                    if sniff::is_model_image(mime) {
                        if size <= MAX_MODEL_IMAGE_BYTES {
                            images.push(ImagePart {
                                path: rel.clone(),
                                mime: mime.to_string(),
                                data: None,
                            });
                        } else {
                            line.push_str(&format!(
                                "; over the {} a model is shown, read it with a tool",
                                human_size(MAX_MODEL_IMAGE_BYTES)
                            ));
                        }
                    }
                    match (transcript, transcript_error) {
                        (Some(t), _) if only_speech => {
                            body = t.trim().to_string();
                            line.push_str("; transcribed above");
                        }
                        (Some(t), _) => {
                            line.push_str(&format!("; transcript: {}", t.trim()));
                        }
                        (None, Some(e)) => {
                            line.push_str(&format!("; it could not be transcribed: {e}"));
                        }
                        (None, None) if kind.is_audio() => {
                            line.push_str("; no transcription is configured");
                        }
                        (None, None) => {}
                    }
                    line.push(']');
                    notes.push(line);
                }
                Saved::Skipped(why) => notes.push(format!("[Not downloaded: {why}]")),
            }
        }
        let mut text = body;
        if !notes.is_empty() {
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            text.push_str(&notes.join("\n"));
        }
        Prepared { text, images }
    }

    /// GET `req` with at most `limit` bytes of body.
    ///
    /// # Errors
    /// [`MediaError::TooLarge`] past `limit`, [`MediaError::Refused`] by the guard,
    /// [`MediaError::Failed`] otherwise.
    pub async fn download(&self, req: &MediaRequest, limit: u64) -> Result<Vec<u8>, MediaError> {
        // A file the channel already holds (a mail's attachment): handed over inline.
        if req.trusted && req.url.starts_with("data:") {
            return data_url(&req.url, limit);
        }
        let url = reqwest::Url::parse(&req.url)
            .map_err(|e| MediaError::Refused(format!("not a URL: {e}")))?;
        let mut headers = HeaderMap::new();
        for (k, v) in &req.headers {
            if let (Ok(k), Ok(v)) = (HeaderName::try_from(k.as_str()), HeaderValue::from_str(v)) {
                headers.insert(k, v);
            }
        }
        let fetch = async {
            let resp = if req.trusted {
                self.direct
                    .get(url)
                    .headers(headers)
                    .send()
                    .await
                    .map_err(|e| MediaError::Failed(e.without_url().to_string()))?
            } else {
                let (resp, _) = self
                    .guarded
                    .send(GuardedRequest {
                        method: reqwest::Method::GET,
                        url,
                        headers,
                        body: None,
                    })
                    .await
                    .map_err(|e| match e {
                        crate::net::ssrf::FetchError::Blocked(b) => {
                            MediaError::Refused(b.to_string())
                        }
                        crate::net::ssrf::FetchError::Scheme(_)
                        | crate::net::ssrf::FetchError::BadUrl(_) => {
                            MediaError::Refused(e.to_string())
                        }
                        other => MediaError::Failed(other.to_string()),
                    })?;
                resp
            };
            if !resp.status().is_success() {
                return Err(MediaError::Failed(format!(
                    "the platform answered {}",
                    resp.status()
                )));
            }
            read_capped(resp, limit).await
        };
        tokio::time::timeout(TRANSFER_TIMEOUT, fetch)
            .await
            .map_err(|_| MediaError::Failed("the download timed out".into()))?
    }

    /// Send `bytes` to `{base_url}/audio/transcriptions` and return the text.
    async fn transcribe(
        &self,
        t: &TranscriptionSettings,
        bytes: &[u8],
        rel: &str,
        mime: &str,
    ) -> Result<String, MediaError> {
        let name = rel.rsplit('/').next().unwrap_or(rel);
        let mut form = Multipart::new()
            .text("model", &t.model)
            .text("response_format", "json");
        if let Some(l) = &t.language {
            form = form.text("language", l);
        }
        let (ct, body) = form.file("file", name, mime, bytes).finish();
        let url = format!("{}/audio/transcriptions", t.base_url.trim_end_matches('/'));
        let mut rb = self
            .direct
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, ct)
            .body(body);
        if let Some(k) = &t.api_key {
            rb = rb.bearer_auth(k.expose());
        }
        let call = async {
            let resp = rb
                .send()
                .await
                .map_err(|e| MediaError::Failed(e.without_url().to_string()))?;
            let status = resp.status();
            let text = resp
                .text()
                .await
                .map_err(|e| MediaError::Failed(e.without_url().to_string()))?;
            if !status.is_success() {
                let brief: String = text.chars().take(200).collect();
                return Err(MediaError::Failed(format!(
                    "the transcription endpoint answered {status}: {brief}"
                )));
            }
            let v: serde_json::Value = serde_json::from_str(&text).map_err(|_| {
                MediaError::Failed("the transcription endpoint did not answer JSON".into())
            })?;
            v.get("text")
                .and_then(serde_json::Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| MediaError::Failed("the transcription answer has no `text`".into()))
        };
        tokio::time::timeout(TRANSFER_TIMEOUT, call)
            .await
            .map_err(|_| MediaError::Failed("the transcription timed out".into()))?
    }
}

/// Load the images of the last user message of `messages` (the one this turn answers) from the
/// workspace, base64, for a model that can see. An image gone or grown past
/// [`MAX_MODEL_IMAGE_BYTES`] is left out (its path is in the text).
pub fn load_images(ws: &Workspace, messages: &mut [crate::llm::Message]) {
    use base64::Engine as _;
    let Some(user) = messages
        .iter_mut()
        .rev()
        .find(|m| m.role == crate::llm::Role::User)
    else {
        return;
    };
    for img in user.images.iter_mut().filter(|i| i.data.is_none()) {
        match ws.read_beneath(&img.path, MAX_MODEL_IMAGE_BYTES + 1) {
            Ok(Some(b)) if b.len() as u64 <= MAX_MODEL_IMAGE_BYTES => {
                img.data = Some(base64::engine::general_purpose::STANDARD.encode(&b).into());
            }
            other => {
                tracing::warn!(path = %img.path, ok = other.is_ok(), "image not shown to the model");
            }
        }
    }
}

/// The images tool results point at (`"image": "<path in the workspace>"`, e.g. the browser's
/// screenshots), as one user message for a model that can see: sent for the rest of the turn,
/// never stored (the results keep the path). `None` when no result has a loadable image.
pub fn tool_result_images(
    ws: &Workspace,
    results: &[crate::llm::Message],
) -> Option<crate::llm::Message> {
    use base64::Engine as _;
    let mut images = Vec::new();
    let mut names = Vec::new();
    for r in results {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&r.content) else {
            continue;
        };
        let Some(path) = v.get("image").and_then(serde_json::Value::as_str) else {
            continue;
        };
        let Ok(Some(b)) = ws.read_beneath(path, MAX_MODEL_IMAGE_BYTES + 1) else {
            continue;
        };
        let Some(mime) = sniff::sniff(&b).filter(|m| sniff::is_model_image(m)) else {
            continue;
        };
        if b.len() as u64 > MAX_MODEL_IMAGE_BYTES {
            continue;
        }
        names.push(format!(
            "{} ({})",
            path,
            r.name.as_deref().unwrap_or("tool")
        ));
        images.push(ImagePart {
            path: path.to_string(),
            mime: mime.to_string(),
            data: Some(base64::engine::general_purpose::STANDARD.encode(&b).into()),
        });
    }
    if images.is_empty() {
        return None;
    }
    let mut m = crate::llm::Message::user(format!(
        "[The image{} a tool call just produced: {}. It shows untrusted content.]",
        if images.len() == 1 { "" } else { "s" },
        names.join(", ")
    ));
    m.images = images;
    Some(m)
}

/// The body of `resp`, failing past `limit` bytes (at once when its `Content-Length` says so).
async fn read_capped(mut resp: reqwest::Response, limit: u64) -> Result<Vec<u8>, MediaError> {
    if resp.content_length().is_some_and(|n| n > limit) {
        return Err(MediaError::TooLarge);
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| MediaError::Failed(e.without_url().to_string()))?
    {
        if (out.len() + chunk.len()) as u64 > limit {
            return Err(MediaError::TooLarge);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// `base` with the extension of `mime`, unless it already ends with it.
fn with_extension(base: &str, mime: &str) -> String {
    let ext = sniff::extension(mime);
    let file = base.rsplit('/').next().unwrap_or(base);
    let has = file.rsplit_once('.').is_some_and(|(_, e)| {
        e.eq_ignore_ascii_case(ext) || (ext == "jpg" && e.eq_ignore_ascii_case("jpeg"))
    });
    if has {
        base.to_string()
    } else {
        format!("{base}.{ext}")
    }
}

/// A file an earlier attempt saved at `base` (with or without an added extension), read only
/// when it is within `limit` bytes: the agent may have replaced it since, and a larger file is
/// not this attachment (it is downloaded again, and replaced).
fn find_saved(ws: &Workspace, base: &str, limit: u64) -> Option<(Vec<u8>, String)> {
    let (dir, stem) = base.rsplit_once('/')?;
    let entries = std::fs::read_dir(ws.root().join(dir)).ok()?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let hit = name == stem
            || name.strip_prefix(stem).is_some_and(|rest| {
                rest.starts_with('.')
                    && !rest.ends_with(".txt")
                    && rest[1..].chars().all(|c| c.is_ascii_alphanumeric())
            });
        if hit {
            let rel = format!("{dir}/{name}");
            match ws.read_beneath(&rel, limit.saturating_add(1)) {
                Ok(Some(b)) if b.len() as u64 <= limit => return Some((b, rel)),
                _ => {}
            }
        }
    }
    None
}

/// Write `bytes` at `rel` beneath the workspace (directories made, atomic).
fn write_file(ws: &Workspace, rel: &str, bytes: &[u8]) -> Result<(), crate::tools::ToolError> {
    let (dir, name) = ws.open_parent(rel, true)?;
    write_atomic(&dir, &name, bytes, 0o644, None, rel)
}

/// The bytes of a `data:<type>;base64,<data>` URL, at most `limit` of them.
fn data_url(url: &str, limit: u64) -> Result<Vec<u8>, MediaError> {
    use base64::Engine as _;
    let (head, data) = url
        .split_once(',')
        .ok_or_else(|| MediaError::Refused("a data: URL without data".into()))?;
    if !head.ends_with(";base64") {
        return Err(MediaError::Refused("a data: URL that is not base64".into()));
    }
    if (data.len() as u64 / 4).saturating_mul(3) > limit.saturating_add(3) {
        return Err(MediaError::TooLarge);
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| MediaError::Failed(format!("bad base64 in a data: URL: {e}")))?;
    if bytes.len() as u64 > limit {
        return Err(MediaError::TooLarge);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_saved_file_is_found_with_its_extension_only_within_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        std::fs::create_dir_all(dir.path().join("inbox/d")).unwrap();
        std::fs::write(dir.path().join("inbox/d/1-photo.jpg"), vec![7u8; 2048]).unwrap();
        std::fs::write(dir.path().join("inbox/d/1-photo.jpg.txt"), "a transcript").unwrap();
        let (bytes, rel) = find_saved(&ws, "inbox/d/1-photo", 2048).unwrap();
        assert_eq!((bytes.len(), rel.as_str()), (2048, "inbox/d/1-photo.jpg"));
        // Replaced by something larger than the attachment may be: not this attachment.
        assert!(find_saved(&ws, "inbox/d/1-photo", 2047).is_none());
        assert!(find_saved(&ws, "inbox/d/2-other", u64::MAX).is_none());
    }

    #[test]
    fn names_are_made_safe_and_dates_are_utc() {
        assert_eq!(safe_file_name("../../etc/passwd"), "passwd");
        assert_eq!(safe_file_name(".bashrc"), "bashrc");
        assert_eq!(
            safe_file_name("my report (final).pdf"),
            "my_report__final_.pdf"
        );
        assert_eq!(safe_file_name(""), "file");
        assert_eq!(date_of(0), "1970-01-01");
        assert_eq!(date_of(1_795_000_000_000), "2026-11-18");
        assert_eq!(
            with_extension("inbox/d/1-photo", "image/jpeg"),
            "inbox/d/1-photo.jpg"
        );
        assert_eq!(
            with_extension("inbox/d/1-a.JPEG", "image/jpeg"),
            "inbox/d/1-a.JPEG"
        );
        assert_eq!(
            with_extension("inbox/d/1-a.jpg", "image/png"),
            "inbox/d/1-a.jpg.png"
        );
        assert_eq!(human_size(1536), "2 KB");
        assert_eq!(human_size(25 * 1024 * 1024), "25.0 MB");
    }
}

#[cfg(test)]
#[path = "media_tests.rs"]
mod media_tests;
