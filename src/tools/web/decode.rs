//! A fetched body to text for `web_fetch`: content types that are never text, the binary
//! sniff of untyped bodies, charsets (windows-1252/latin-1 or UTF-8) and HTML to text.

use url::Url;

use crate::tools::html;

/// Bytes inspected for NUL to decide that an untyped body is binary.
const BINARY_SNIFF_BYTES: usize = 8192;

/// The media type of a `Content-Type` value: lowercase, without parameters (`""` if none).
pub(super) fn mime_of(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// A body read in full (or cut at `max_bytes` when `truncated`) as text for the model: decoded
/// by its charset, HTML turned into text with links resolved against `url`. `None`: an untyped
/// body that looks binary (a NUL in its first bytes); the caller describes it instead.
pub(super) fn body_text(
    buf: Vec<u8>,
    content_type: &str,
    mime: &str,
    truncated: bool,
    url: &Url,
) -> Option<String> {
    let untyped = mime.is_empty() || mime == "application/octet-stream";
    if untyped && buf[..buf.len().min(BINARY_SNIFF_BYTES)].contains(&0) {
        return None;
    }
    let mut text = decode_text(&buf, content_type, truncated);
    drop(buf);
    let is_html = matches!(mime, "text/html" | "application/xhtml+xml")
        || ((untyped || mime == "text/plain") && html::looks_like_html(text.as_bytes()));
    if is_html {
        text = html::html_to_text(&text, Some(url));
    }
    Some(text)
}

/// Types that are never text: described instead of read.
pub(super) fn is_binary_mime(mime: &str) -> bool {
    let (top, sub) = mime.split_once('/').unwrap_or((mime, ""));
    matches!(top, "image" | "audio" | "video" | "font" | "model")
        || (top == "application"
            && !sub.ends_with("+xml")
            && !sub.ends_with("+json")
            && matches!(
                sub,
                "pdf"
                    | "zip"
                    | "gzip"
                    | "x-gzip"
                    | "x-tar"
                    | "x-bzip2"
                    | "x-xz"
                    | "x-7z-compressed"
                    | "x-rar-compressed"
                    | "vnd.rar"
                    | "zstd"
                    | "wasm"
                    | "java-archive"
                    | "x-msdownload"
                    | "x-executable"
                    | "x-sharedlib"
                    | "msword"
                    | "vnd.ms-excel"
                    | "vnd.ms-powerpoint"
                    | "x-shockwave-flash"
            )
            || sub.starts_with("vnd.openxmlformats")
            || sub.starts_with("vnd.oasis.opendocument"))
}

/// Bytes → text: windows-1252/latin-1 when declared, else UTF-8 (lossy). A multi-byte
/// sequence cut by truncation is dropped rather than shown as U+FFFD.
fn decode_text(buf: &[u8], content_type: &str, truncated: bool) -> String {
    let charset = content_type
        .split(';')
        .skip(1)
        .filter_map(|p| p.trim().split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("charset"))
        .map(|(_, v)| v.trim().trim_matches('"').to_ascii_lowercase());
    if let Some("iso-8859-1" | "latin1" | "latin-1" | "windows-1252" | "cp1252" | "us-ascii") =
        charset.as_deref()
    {
        return buf.iter().map(|&b| cp1252(b)).collect();
    }
    let mut buf = buf.strip_prefix(b"\xef\xbb\xbf").unwrap_or(buf);
    if truncated {
        if let Err(e) = std::str::from_utf8(buf) {
            if e.error_len().is_none() {
                buf = &buf[..e.valid_up_to()];
            }
        }
    }
    String::from_utf8_lossy(buf).into_owned()
}

/// One windows-1252 byte as a char (latin-1 except 0x80..=0x9F).
fn cp1252(b: u8) -> char {
    const HIGH: [char; 32] = [
        '€', '\u{81}', '‚', 'ƒ', '„', '…', '†', '‡', 'ˆ', '‰', 'Š', '‹', 'Œ', '\u{8d}', 'Ž',
        '\u{8f}', '\u{90}', '‘', '’', '“', '”', '•', '–', '—', '˜', '™', 'š', '›', 'œ', '\u{9d}',
        'ž', 'Ÿ',
    ];
    match b {
        0x80..=0x9f => HIGH[usize::from(b - 0x80)],
        _ => char::from(b),
    }
}
