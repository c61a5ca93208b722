//! Files in and out of Telegram chats.
//!
//! - **Download.** An inbound file is named by its `file_id` ([`MediaRef::id`]);
//!   [`TelegramChannel::file_request`] asks `getFile` for its `file_path` and answers
//!   `{api_url}/file/bot<token>/<file_path>`, on the configured API origin (so `trusted`). The
//!   Bot API serves files up to 20 MB; a bigger one is refused by `getFile` with 400 "file is
//!   too big", reported as [`ChannelError::Rejected`].
//! - **Upload.** After the text of a final reply, each attachment is uploaded in order with the
//!   method its kind and type call for (`sendPhoto`, `sendVoice`, `sendAudio`, `sendVideo`,
//!   else `sendDocument`), one `multipart/form-data` request per file. The shared send path
//!   (`clawft_channel_core::send`) journals the count uploaded after each one, so a retry of
//!   the same reply uploads only the others. A file over the upload limit (50 MB for bots) is
//!   replaced by a short note in the chat.

use std::time::Duration;

use async_trait::async_trait;
use clawft_channel_core::media::{
    read_file, MediaKind, MediaRef, MediaRequest, Multipart, OutboundFile,
};
use clawft_channel_core::send::SendFiles;
use clawft_channel_core::{ChannelError, SentRef};
use serde_json::Value;

use crate::api::{CallError, GetFile};
use crate::ids::MessageId;
use crate::{Chunk, Target, TelegramChannel};

/// `sendPhoto` takes photos up to 10 MB; bigger ones go as documents.
pub const PHOTO_UPLOAD_LIMIT: u64 = 10 * 1024 * 1024;

/// The Bot API method and the name of its file field for an attachment of `len` bytes.
pub(crate) fn upload_method(file: &OutboundFile, len: u64) -> (&'static str, &'static str) {
    let mime = file
        .mime
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match file.kind {
        MediaKind::Image
            if matches!(mime.as_str(), "image/jpeg" | "image/png" | "image/webp")
                && len <= PHOTO_UPLOAD_LIMIT =>
        {
            ("sendPhoto", "photo")
        }
        // Telegram shows a voice note only for OGG/Opus, MP3 and M4A.
        MediaKind::Voice if matches!(mime.as_str(), "audio/ogg" | "audio/mpeg" | "audio/mp4") => {
            ("sendVoice", "voice")
        }
        // The music player takes MP3 and M4A.
        MediaKind::Audio
            if matches!(
                mime.as_str(),
                "audio/mpeg" | "audio/mp3" | "audio/mp4" | "audio/m4a" | "audio/x-m4a"
            ) =>
        {
            ("sendAudio", "audio")
        }
        // Telegram plays MPEG-4 videos; other formats go as documents.
        MediaKind::Video if mime == "video/mp4" => ("sendVideo", "video"),
        _ => ("sendDocument", "document"),
    }
}

/// `1.5 MB`, `60 MB`, `900 KB`, `12 bytes`.
pub(crate) fn human_size(bytes: u64) -> String {
    const KB: u64 = 1024;
    const MB: u64 = 1024 * 1024;
    #[allow(clippy::cast_precision_loss)]
    let mb = bytes as f64 / MB as f64;
    if bytes < KB {
        format!("{bytes} bytes")
    } else if bytes < MB {
        format!("{} KB", bytes / KB)
    } else if mb < 10.0 {
        format!("{mb:.1} MB")
    } else {
        format!("{mb:.0} MB")
    }
}

/// The note posted in place of a file too big to upload.
pub(crate) fn too_big_note(name: &str, size: u64, limit: u64) -> String {
    format!(
        "{name} ({}) is over Telegram's {} limit for bots, so it was not sent.",
        human_size(size),
        human_size(limit)
    )
}

/// The note posted in place of a file Telegram refused.
pub(crate) fn refused_note(name: &str, why: &str) -> String {
    format!("{name} could not be sent: Telegram refused it ({why}).")
}

/// How long one upload of `len` bytes may take: a minute plus a second per 256 KiB (a slow
/// uplink of a small machine).
fn upload_deadline(len: u64) -> Duration {
    Duration::from_secs(60 + len / (256 * 1024))
}

#[async_trait]
impl SendFiles for Target<'_> {
    /// Upload one attachment with the method its kind and type call for; a file over the
    /// limit, or one Telegram refuses, becomes a note. The first file of a reply without text
    /// quotes the user's message (in groups). Answers the message id, when Telegram said it.
    async fn send_file(
        &self,
        _index: usize,
        file: &OutboundFile,
        first: bool,
    ) -> Result<SentRef, ChannelError> {
        let reply_to = self.reply_to.filter(|_| first);
        let limit = self.ch.cfg.max_upload_bytes;
        if file.size > limit {
            let note = too_big_note(&file.name, file.size, limit);
            return self.ch.note(self, reply_to, &note).await;
        }
        let bytes = read_file(file).await?;
        let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
        if len > limit {
            let note = too_big_note(&file.name, len, limit);
            return self.ch.note(self, reply_to, &note).await;
        }
        let (method, field) = upload_method(file, len);
        let mut r = self
            .ch
            .upload(self, reply_to, file, &bytes, method, field)
            .await;
        if method == "sendPhoto" && r.as_ref().is_err_and(|e| self.ch.refused(e)) {
            // Photos Telegram will not process (extreme proportions, odd encodings) still go,
            // as a file.
            r = self
                .ch
                .upload(self, reply_to, file, &bytes, "sendDocument", "document")
                .await;
        }
        match r {
            Ok(id) => Ok(SentRef::of(id.as_ref())),
            Err(CallError::TooLarge) => {
                let note = too_big_note(&file.name, len, limit);
                self.ch.note(self, reply_to, &note).await
            }
            // One file Telegram refuses does not cost the others: a note says so (if the chat
            // itself refuses, the note fails the same way).
            Err(e) => match self.ch.classify(&e) {
                ChannelError::Rejected(why) => {
                    let note = refused_note(&file.name, &why);
                    self.ch.note(self, reply_to, &note).await
                }
                other => Err(other),
            },
        }
    }
}

impl TelegramChannel {
    /// Where to download `media`: `getFile`, then the Bot API's file URL (with the token, on
    /// the configured origin). A reference that names its own URL (Telegram payloads never
    /// do) gets it back without credentials, trusted only on the configured origin.
    pub(super) async fn file_request(
        &self,
        media: &MediaRef,
    ) -> Result<MediaRequest, ChannelError> {
        if let Some(raw) = &media.url {
            let url = reqwest::Url::parse(raw).map_err(|e| {
                ChannelError::Rejected(format!("the attachment's URL is not a URL: {e}"))
            })?;
            return Ok(MediaRequest {
                trusted: self.api.same_origin(&url),
                url: url.to_string(),
                headers: Vec::new(),
            });
        }
        if media.id.trim().is_empty() {
            return Err(ChannelError::Rejected(
                "the attachment has no Telegram file_id".into(),
            ));
        }
        let file = self
            .api
            .call_default(GetFile {
                file_id: media.id.clone(),
            })
            .await
            .map_err(|e| match self.classify(&e) {
                ChannelError::Rejected(d) if d.contains("file is too big") => {
                    ChannelError::Rejected(format!(
                        "{d} (the Telegram Bot API serves files up to 20 MB)"
                    ))
                }
                other => other,
            })?;
        let path = file
            .get("file_path")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                ChannelError::Rejected(
                    "Telegram's getFile answer has no file_path (the file cannot be downloaded)"
                        .into(),
                )
            })?;
        let url = self.api.file_url(path).ok_or_else(|| {
            ChannelError::Rejected(
                "the Bot API answered a file path outside its file server (a local \
                 telegram-bot-api server in --local mode?)"
                    .into(),
            )
        })?;
        Ok(MediaRequest {
            url: url.to_string(),
            headers: Vec::new(),
            trusted: true,
        })
    }

    /// Post a short plain note in place of a file.
    async fn note(
        &self,
        target: &Target<'_>,
        reply_to: Option<MessageId>,
        text: &str,
    ) -> Result<SentRef, ChannelError> {
        let chunk = Chunk {
            html: None,
            plain: text.to_string(),
        };
        let id = self
            .post(&target.chat, target.thread, reply_to, &chunk)
            .await?;
        Ok(SentRef::message(id.to_string()))
    }

    fn refused(&self, e: &CallError) -> bool {
        matches!(self.classify(e), ChannelError::Rejected(_))
    }

    async fn upload(
        &self,
        target: &Target<'_>,
        reply_to: Option<MessageId>,
        file: &OutboundFile,
        bytes: &[u8],
        method: &str,
        field: &str,
    ) -> Result<Option<MessageId>, CallError> {
        let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
        let mut form = Multipart::new().text("chat_id", &target.chat.to_string());
        if let Some(t) = target.thread {
            form = form.text("message_thread_id", &t.to_string());
        }
        if let Some(r) = reply_to {
            let params = serde_json::json!({"message_id": r, "allow_sending_without_reply": true});
            form = form.text("reply_parameters", &params.to_string());
        }
        let (content_type, body) = form.file(field, &file.name, &file.mime, bytes).finish();
        let sent = self
            .api
            .upload(method, content_type, body, upload_deadline(len))
            .await?;
        // The message was accepted: a missing id must not make it look failed (it would be
        // uploaded again).
        Ok(sent
            .get("message_id")
            .and_then(Value::as_i64)
            .map(MessageId))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(kind: MediaKind, mime: &str) -> OutboundFile {
        OutboundFile {
            path: "/x".into(),
            name: "x".into(),
            kind,
            mime: mime.into(),
            size: 1,
        }
    }

    #[test]
    fn methods_follow_kind_type_and_size() {
        let m = |k, mime, len| upload_method(&file(k, mime), len).0;
        assert_eq!(m(MediaKind::Image, "image/png", 5), "sendPhoto");
        assert_eq!(m(MediaKind::Image, "image/gif", 5), "sendDocument");
        assert_eq!(
            m(MediaKind::Image, "image/jpeg", PHOTO_UPLOAD_LIMIT + 1),
            "sendDocument"
        );
        assert_eq!(m(MediaKind::Voice, "audio/ogg", 5), "sendVoice");
        assert_eq!(m(MediaKind::Voice, "audio/wav", 5), "sendDocument");
        assert_eq!(m(MediaKind::Audio, "audio/mpeg", 5), "sendAudio");
        assert_eq!(m(MediaKind::Video, "video/mp4", 5), "sendVideo");
        assert_eq!(m(MediaKind::Video, "video/webm", 5), "sendDocument");
        assert_eq!(m(MediaKind::Document, "image/png", 5), "sendDocument");
    }

    #[test]
    fn sizes_read_like_people_write_them() {
        assert_eq!(human_size(12), "12 bytes");
        assert_eq!(human_size(900 * 1024), "900 KB");
        assert_eq!(human_size(1024 * 1024 * 3 / 2), "1.5 MB");
        assert_eq!(
            too_big_note("report.pdf", 60 * 1024 * 1024, 50 * 1024 * 1024),
            "report.pdf (60 MB) is over Telegram's 50 MB limit for bots, so it was not sent."
        );
    }
}
