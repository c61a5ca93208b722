//! The type of a file from its first bytes: what the platform or the sender declared is never
//! trusted (a "photo.jpg" may be an HTML page, an executable, anything).

/// The media type the bytes show, if they are of a kind the gateway knows.
pub fn sniff(b: &[u8]) -> Option<&'static str> {
    let starts = |p: &[u8]| b.starts_with(p);
    let at = |off: usize, p: &[u8]| b.get(off..off + p.len()) == Some(p);
    Some(if starts(b"\xFF\xD8\xFF") {
        "image/jpeg"
    } else if starts(b"\x89PNG\r\n\x1a\n") {
        "image/png"
    } else if starts(b"GIF87a") || starts(b"GIF89a") {
        "image/gif"
    } else if starts(b"RIFF") && at(8, b"WEBP") {
        "image/webp"
    } else if starts(b"RIFF") && at(8, b"WAVE") {
        "audio/wav"
    } else if starts(b"OggS") {
        "audio/ogg"
    } else if starts(b"ID3") || (b.len() > 1 && b[0] == 0xFF && b[1] & 0xE0 == 0xE0) {
        "audio/mpeg"
    } else if starts(b"fLaC") {
        "audio/flac"
    } else if starts(b"\x1a\x45\xdf\xa3") {
        "video/webm"
    } else if at(4, b"ftyp") {
        if at(8, b"M4A ") {
            "audio/mp4"
        } else {
            "video/mp4"
        }
    } else if starts(b"%PDF-") {
        "application/pdf"
    } else if starts(b"PK\x03\x04") {
        "application/zip"
    } else if starts(b"\x1f\x8b") {
        "application/gzip"
    } else if looks_like_text(b) {
        if b.trim_ascii_start()
            .get(..15)
            .is_some_and(|h| h.eq_ignore_ascii_case(b"<!doctype html>"))
            || b.trim_ascii_start()
                .get(..5)
                .is_some_and(|h| h.eq_ignore_ascii_case(b"<html"))
        {
            "text/html"
        } else {
            "text/plain"
        }
    } else {
        return None;
    })
}

/// UTF-8 without NUL or other control bytes (tabs and newlines allowed) in the first 4 KiB.
fn looks_like_text(b: &[u8]) -> bool {
    let head = &b[..b.len().min(4096)];
    let valid = match std::str::from_utf8(head) {
        Ok(_) => true,
        // A multi-byte character cut at the 4 KiB boundary.
        Err(e) => e.error_len().is_none(),
    };
    valid
        && !head.is_empty()
        && head
            .iter()
            .all(|&c| c >= 0x20 || matches!(c, b'\n' | b'\r' | b'\t'))
}

/// The usual file extension of a media type this module sniffs.
pub fn extension(mime: &str) -> &'static str {
    match mime {
        "image/jpeg" => "jpg",
        "image/png" => "png",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "audio/wav" => "wav",
        "audio/ogg" => "ogg",
        "audio/mpeg" => "mp3",
        "audio/flac" => "flac",
        "audio/mp4" => "m4a",
        "video/webm" => "webm",
        "video/mp4" => "mp4",
        "application/pdf" => "pdf",
        "application/zip" => "zip",
        "application/gzip" => "gz",
        "text/html" => "html",
        "text/plain" => "txt",
        _ => "bin",
    }
}

/// A file name safe in a path: letters, digits, `.`, `-`, `_` (others become `_`), no
/// directory part, no leading dot, at most 80 characters, never empty.
pub fn safe_file_name(name: &str) -> String {
    let cleaned: String = name
        .rsplit(['/', '\\'])
        .next()
        .unwrap_or("")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut out: String = cleaned.trim_start_matches('.').chars().take(80).collect();
    if out.is_empty() {
        out.push_str("file");
    }
    out
}

/// Whether models take images of this type (OpenAI and Anthropic both: JPEG, PNG, GIF, WebP).
pub fn is_model_image(mime: &str) -> bool {
    matches!(
        mime,
        "image/jpeg" | "image/png" | "image/gif" | "image/webp"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_decide_not_names() {
        assert_eq!(sniff(b"\xFF\xD8\xFF\xE0\0\x10JFIF"), Some("image/jpeg"));
        assert_eq!(sniff(b"\x89PNG\r\n\x1a\n\0\0"), Some("image/png"));
        assert_eq!(sniff(b"RIFF\0\0\0\0WEBPVP8 "), Some("image/webp"));
        assert_eq!(sniff(b"OggS\0\x02"), Some("audio/ogg"));
        assert_eq!(sniff(b"\0\0\0\x20ftypisom"), Some("video/mp4"));
        assert_eq!(sniff(b"%PDF-1.7\n"), Some("application/pdf"));
        assert_eq!(sniff(b"<!DOCTYPE html><html>"), Some("text/html"));
        assert_eq!(sniff("héllo\n".as_bytes()), Some("text/plain"));
        assert_eq!(sniff(b"\x7fELF\x02\x01\x01\0"), None);
        assert_eq!(extension("image/webp"), "webp");
        assert!(is_model_image("image/gif"));
        assert!(!is_model_image("image/svg+xml"));
    }
}
