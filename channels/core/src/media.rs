//! Files in and out of chats: what an adapter reports of an inbound attachment
//! ([`MediaRef`]), how it says where to download it ([`MediaRequest`]), the files an outbound
//! message carries ([`OutboundFile`]), and a `multipart/form-data` body builder the adapters
//! upload with ([`Multipart`]).
//!
//! The adapter never downloads by itself: it names the file ([`MediaRef`], journaled with the
//! event, so no secret goes in it), and on request ([`crate::Channel::media_request`]) turns
//! it into a URL plus the headers the platform wants. The daemon downloads it (size caps,
//! content sniffing, the SSRF guard for every URL that is not on the platform's configured
//! API origin) into the session's workspace.

use serde::{Deserialize, Serialize};

/// What kind of file an attachment is, as the platform describes it (the daemon sniffs the
/// bytes before trusting a type).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MediaKind {
    /// A photo or picture (sent to the model as an image when it can see).
    Image,
    /// A recorded voice note (transcribed when `media.transcription` is set).
    Voice,
    /// An audio file (transcribed like a voice note).
    Audio,
    /// A video or Telegram video note.
    Video,
    /// Any other file.
    Document,
}

impl MediaKind {
    /// A lowercase word for messages and logs (`image`, `voice note`, ...).
    pub fn describe(self) -> &'static str {
        match self {
            MediaKind::Image => "image",
            MediaKind::Voice => "voice note",
            MediaKind::Audio => "audio",
            MediaKind::Video => "video",
            MediaKind::Document => "file",
        }
    }

    /// Whether it is speech to transcribe.
    pub fn is_audio(self) -> bool {
        matches!(self, MediaKind::Voice | MediaKind::Audio)
    }

    /// The kind a media type (`image/png`) suggests.
    pub fn of_mime(mime: &str) -> Self {
        let m = mime.to_ascii_lowercase();
        if m.starts_with("image/") {
            MediaKind::Image
        } else if m.starts_with("audio/") {
            MediaKind::Audio
        } else if m.starts_with("video/") {
            MediaKind::Video
        } else {
            MediaKind::Document
        }
    }
}

/// One file attached to an inbound message, as the platform described it. Journaled with the
/// event: it holds ids and public metadata only, never a token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MediaRef {
    /// What it is.
    pub kind: MediaKind,
    /// The platform's id of the file (Telegram `file_id`, Discord attachment id, Slack file id).
    pub id: String,
    /// The file name the sender gave, if any (not trusted: the daemon sanitises it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The media type the platform declared, if any (not trusted: the bytes are sniffed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime: Option<String>,
    /// The size the platform declared, in bytes, if any (checked against the caps before the
    /// download starts, and again while it runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Where the platform payload says the file is (Discord CDN, Slack `url_private`), if it
    /// says; Telegram files are found with `getFile` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Length in seconds of a voice note, audio or video, if declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_secs: Option<u32>,
}

impl MediaRef {
    /// A reference with only the required parts.
    pub fn new(kind: MediaKind, id: impl Into<String>) -> Self {
        Self {
            kind,
            id: id.into(),
            name: None,
            mime: None,
            size: None,
            url: None,
            duration_secs: None,
        }
    }
}

/// How to download one [`MediaRef`]: the answer of [`crate::Channel::media_request`].
#[derive(Clone, PartialEq, Eq)]
pub struct MediaRequest {
    /// The URL to `GET` (it may hold the bot token, as Telegram's file URLs do: never log it).
    pub url: String,
    /// Headers to send (Slack's `Authorization: Bearer`): only ever for the platform's own
    /// file hosts.
    pub headers: Vec<(String, String)>,
    /// The URL is on the platform API origin the operator configured (Telegram's file server,
    /// a test fake): fetched directly. Every other URL goes through the SSRF guard.
    pub trusted: bool,
}

impl std::fmt::Debug for MediaRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL and headers may carry credentials.
        f.debug_struct("MediaRequest")
            .field("trusted", &self.trusted)
            .finish_non_exhaustive()
    }
}

/// A file to send with an outbound message. The daemon copies it out of the workspace when
/// the message is queued (so later edits of the workspace file do not change what is sent, and
/// a resend after a crash sends the same bytes) and removes the copy once the message is
/// settled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboundFile {
    /// Absolute path of the file to upload.
    pub path: String,
    /// File name shown in the chat.
    pub name: String,
    /// What it is (picks Telegram's `sendPhoto` / `sendVoice` / `sendDocument`).
    pub kind: MediaKind,
    /// Its media type, sniffed from the bytes.
    pub mime: String,
    /// Its size in bytes.
    pub size: u64,
}

/// The bytes of an attachment to upload.
///
/// # Errors
/// [`crate::ChannelError::Rejected`] when the file is gone (it cannot appear by retrying).
pub async fn read_file(file: &OutboundFile) -> Result<Vec<u8>, crate::ChannelError> {
    tokio::fs::read(&file.path)
        .await
        .map_err(|e| crate::ChannelError::Rejected(format!("cannot read {}: {e}", file.name)))
}

/// A `multipart/form-data` body, built in memory (uploads are capped well below memory
/// limits).
#[derive(Debug)]
pub struct Multipart {
    boundary: String,
    body: Vec<u8>,
}

impl Default for Multipart {
    fn default() -> Self {
        Self::new()
    }
}

impl Multipart {
    /// An empty form with a random boundary.
    pub fn new() -> Self {
        Self {
            boundary: format!("----weft{}", uuid::Uuid::now_v7().simple()),
            body: Vec::new(),
        }
    }

    fn head(&mut self, disposition: &str, content_type: Option<&str>) {
        self.body.extend_from_slice(b"--");
        self.body.extend_from_slice(self.boundary.as_bytes());
        self.body
            .extend_from_slice(b"\r\nContent-Disposition: form-data; ");
        self.body.extend_from_slice(disposition.as_bytes());
        self.body.extend_from_slice(b"\r\n");
        if let Some(ct) = content_type {
            self.body.extend_from_slice(b"Content-Type: ");
            self.body.extend_from_slice(ct.as_bytes());
            self.body.extend_from_slice(b"\r\n");
        }
        self.body.extend_from_slice(b"\r\n");
    }

    /// Add a text field.
    #[must_use]
    pub fn text(mut self, name: &str, value: &str) -> Self {
        self.head(&format!("name=\"{}\"", quote(name)), None);
        self.body.extend_from_slice(value.as_bytes());
        self.body.extend_from_slice(b"\r\n");
        self
    }

    /// Add a file field.
    #[must_use]
    pub fn file(mut self, name: &str, file_name: &str, content_type: &str, bytes: &[u8]) -> Self {
        self.head(
            &format!(
                "name=\"{}\"; filename=\"{}\"",
                quote(name),
                quote(file_name)
            ),
            Some(content_type),
        );
        self.body.extend_from_slice(bytes);
        self.body.extend_from_slice(b"\r\n");
        self
    }

    /// The `Content-Type` header value and the finished body.
    pub fn finish(mut self) -> (String, Vec<u8>) {
        self.body.extend_from_slice(b"--");
        self.body.extend_from_slice(self.boundary.as_bytes());
        self.body.extend_from_slice(b"--\r\n");
        (
            format!("multipart/form-data; boundary={}", self.boundary),
            self.body,
        )
    }
}

/// A name safe inside a quoted `Content-Disposition` parameter: quotes, backslashes and
/// control characters replaced.
fn quote(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c == '"' || c == '\\' || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// One part of a parsed `multipart/form-data` body (the fakes read uploads with
/// [`parse_multipart`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// The field name.
    pub name: String,
    /// The file name, for file fields.
    pub file_name: Option<String>,
    /// The part's `Content-Type`, if given.
    pub content_type: Option<String>,
    /// The bytes.
    pub data: Vec<u8>,
}

/// Parse a `multipart/form-data` body whose `Content-Type` is `content_type`. `None` when it
/// is not one (no boundary, malformed parts).
pub fn parse_multipart(content_type: &str, body: &[u8]) -> Option<Vec<Part>> {
    let boundary = content_type
        .split(';')
        .map(str::trim)
        .find_map(|p| p.strip_prefix("boundary="))?
        .trim_matches('"');
    let delim = format!("--{boundary}");
    let mut parts = Vec::new();
    let mut rest = body;
    let start = find(rest, delim.as_bytes())?;
    rest = &rest[start + delim.len()..];
    loop {
        if rest.starts_with(b"--") {
            return Some(parts);
        }
        rest = rest.strip_prefix(b"\r\n")?;
        let head_end = find(rest, b"\r\n\r\n")?;
        let head = std::str::from_utf8(&rest[..head_end]).ok()?;
        rest = &rest[head_end + 4..];
        let next = find(rest, format!("\r\n{delim}").as_bytes())?;
        let data = rest[..next].to_vec();
        rest = &rest[next + 2 + delim.len()..];
        let mut part = Part {
            name: String::new(),
            file_name: None,
            content_type: None,
            data,
        };
        for line in head.split("\r\n") {
            let (k, v) = line.split_once(':')?;
            let v = v.trim();
            if k.eq_ignore_ascii_case("content-type") {
                part.content_type = Some(v.to_string());
            } else if k.eq_ignore_ascii_case("content-disposition") {
                for p in v.split(';').map(str::trim) {
                    if let Some(n) = p.strip_prefix("name=") {
                        part.name = n.trim_matches('"').to_string();
                    } else if let Some(n) = p.strip_prefix("filename=") {
                        part.file_name = Some(n.trim_matches('"').to_string());
                    }
                }
            }
        }
        parts.push(part);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_built_form_parses_back_with_its_fields_and_files() {
        let bin: Vec<u8> = (0..=255u8).chain(b"\r\n--x".iter().copied()).collect();
        let (ct, body) = Multipart::new()
            .text("chat_id", "42")
            .file("document", "re\"port.pdf", "application/pdf", &bin)
            .finish();
        let parts = parse_multipart(&ct, &body).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].name, "chat_id");
        assert_eq!(parts[0].data, b"42");
        assert_eq!(parts[1].name, "document");
        assert_eq!(parts[1].file_name.as_deref(), Some("re_port.pdf"));
        assert_eq!(parts[1].content_type.as_deref(), Some("application/pdf"));
        assert_eq!(parts[1].data, bin);
        assert!(parse_multipart("text/plain", &body).is_none());
    }

    #[test]
    fn kinds_follow_the_media_type() {
        assert_eq!(MediaKind::of_mime("IMAGE/png"), MediaKind::Image);
        assert_eq!(MediaKind::of_mime("audio/ogg"), MediaKind::Audio);
        assert_eq!(MediaKind::of_mime("application/pdf"), MediaKind::Document);
        assert!(MediaKind::Voice.is_audio());
    }

    #[test]
    fn a_request_never_prints_its_url() {
        let r = MediaRequest {
            url: "https://api.telegram.org/file/bot123:SECRET/x".into(),
            headers: vec![],
            trusted: true,
        };
        assert!(!format!("{r:?}").contains("SECRET"));
    }
}
