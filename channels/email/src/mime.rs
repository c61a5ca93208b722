//! Mail in (parsed with `mail-parser`: charsets, encoded words, multipart, HTML read as text)
//! and mail out (built here: `multipart/alternative` text + HTML, `multipart/mixed` with files).

use base64::Engine as _;
use mail_parser::{MessageParser, MimeHeaders};

/// An attachment of an inbound mail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    /// Its file name, if it has one.
    pub name: Option<String>,
    /// Its declared media type.
    pub mime: String,
    /// Its decoded size.
    pub size: u64,
}

/// What the channel reads of an inbound mail.
#[derive(Clone, Debug, Default)]
pub struct Inbound {
    /// The `From:` address, lower-cased.
    pub from: String,
    /// The `From:` display name (`"Ada Lovelace" <ada@…>`), cleaned; decoration only.
    pub from_name: Option<String>,
    /// `Message-ID` without angle brackets.
    pub message_id: Option<String>,
    /// `References`, oldest first.
    pub references: Vec<String>,
    /// `In-Reply-To`.
    pub in_reply_to: Option<String>,
    /// The subject.
    pub subject: String,
    /// The text (HTML read as text), without the quoted history of a reply.
    pub text: String,
    /// The files.
    pub attachments: Vec<Attachment>,
    /// `Authentication-Results` values, topmost first.
    pub auth_results: Vec<String>,
    /// Sent by a machine (`Auto-Submitted`, `Precedence: bulk/list/junk`): never answered.
    pub automatic: bool,
    /// The `Date:` as written.
    pub date: Option<String>,
}

fn ids(v: &mail_parser::HeaderValue<'_>) -> Vec<String> {
    match v {
        mail_parser::HeaderValue::Text(t) => vec![t.to_string()],
        mail_parser::HeaderValue::TextList(l) => l.iter().map(ToString::to_string).collect(),
        _ => Vec::new(),
    }
}

/// Parse a raw mail; `None` when it has no `From:` address.
pub fn parse(raw: &[u8]) -> Option<Inbound> {
    let msg = MessageParser::default().parse(raw)?;
    let from = msg
        .from()
        .and_then(|a| a.first())
        .and_then(|a| a.address())?
        .trim()
        .to_ascii_lowercase();
    let from_name = msg
        .from()
        .and_then(|a| a.first())
        .and_then(|a| a.name())
        .and_then(|n| clawft_channel_core::display_name([n]));
    let mut auth_results = Vec::new();
    let mut automatic = false;
    for (name, value) in msg.headers_raw() {
        let value = value.trim();
        if name.eq_ignore_ascii_case("Authentication-Results") {
            auth_results.push(value.replace(['\r', '\n'], " "));
        } else if name.eq_ignore_ascii_case("Auto-Submitted") {
            automatic |= !value.eq_ignore_ascii_case("no");
        } else if name.eq_ignore_ascii_case("Precedence") {
            automatic |= matches!(
                value.to_ascii_lowercase().as_str(),
                "bulk" | "list" | "junk"
            );
        }
    }
    let text = msg
        .body_text(0)
        .map(std::borrow::Cow::into_owned)
        .unwrap_or_default();
    let attachments = msg
        .attachments()
        .map(|p| Attachment {
            name: p.attachment_name().map(str::to_string),
            mime: p
                .content_type()
                .map(|c| match c.subtype() {
                    Some(s) => format!("{}/{s}", c.ctype()),
                    None => c.ctype().to_string(),
                })
                .unwrap_or_else(|| "application/octet-stream".into())
                .to_ascii_lowercase(),
            size: p.contents().len() as u64,
        })
        .collect();
    Some(Inbound {
        from,
        from_name,
        message_id: msg.message_id().map(str::to_string),
        references: ids(msg.references()),
        in_reply_to: ids(msg.in_reply_to()).pop(),
        subject: msg.subject().unwrap_or("").trim().to_string(),
        text: strip_quoted(&text),
        attachments,
        auth_results,
        automatic,
        date: msg.header_raw("Date").map(|d| d.trim().to_string()),
    })
}

/// The bytes of attachment `index` of a raw mail.
pub fn attachment_bytes(raw: &[u8], index: usize) -> Option<Vec<u8>> {
    let msg = MessageParser::default().parse(raw)?;
    let bytes = msg.attachments().nth(index).map(|p| p.contents().to_vec());
    bytes
}

/// The text without the quoted history a mail client appends to a reply (`On ... wrote:` and
/// the `>` lines after it) and without a `-- ` signature.
pub fn strip_quoted(text: &str) -> String {
    let text = text.replace("\r\n", "\n");
    let lines: Vec<&str> = text.lines().collect();
    let mut end = lines.len();
    if let Some(sig) = lines.iter().position(|l| *l == "-- ") {
        end = sig;
    }
    // Trailing quoted lines (and blank lines between them).
    while end > 0 {
        let l = lines[end - 1].trim();
        if l.is_empty() || l.starts_with('>') {
            end -= 1;
        } else {
            break;
        }
    }
    // Their attribution line.
    if end < lines.len() && end > 0 {
        let l = lines[end - 1].trim();
        if l.ends_with("wrote:") || l.ends_with("a écrit :") || l.ends_with("schrieb:") {
            end -= 1;
        }
    }
    let out = lines[..end].join("\n");
    let out = out.trim();
    if out.is_empty() {
        text.trim().to_string()
    } else {
        out.to_string()
    }
}

/// A header value, as an RFC 2047 encoded word when it is not plain ASCII.
pub fn encode_header(value: &str) -> String {
    let clean: String = value
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if clean.is_ascii() {
        return clean;
    }
    // Encoded words of at most 45 bytes of text each (75 characters encoded).
    let mut words = Vec::new();
    let mut cur = String::new();
    for c in clean.chars() {
        if cur.len() + c.len_utf8() > 45 {
            words.push(std::mem::take(&mut cur));
        }
        cur.push(c);
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    words
        .iter()
        .map(|w| {
            format!(
                "=?UTF-8?B?{}?=",
                base64::engine::general_purpose::STANDARD.encode(w)
            )
        })
        .collect::<Vec<_>>()
        .join("\r\n ")
}

fn base64_lines(data: &[u8]) -> String {
    let enc = base64::engine::general_purpose::STANDARD.encode(data);
    let mut out = String::with_capacity(enc.len() + enc.len() / 38);
    for chunk in enc.as_bytes().chunks(76) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push_str("\r\n");
    }
    out
}

/// Markdown as HTML; raw HTML in the Markdown is shown as text, never passed through.
pub fn markdown_to_html(md: &str) -> String {
    use pulldown_cmark::{Event, Options, Parser};
    let parser = Parser::new_ext(md, Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH).map(
        |e| match e {
            Event::Html(h) | Event::InlineHtml(h) => Event::Text(h),
            other => other,
        },
    );
    let mut out = String::new();
    pulldown_cmark::html::push_html(&mut out, parser);
    out
}

fn escape_html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A file to attach.
pub struct OutFile {
    /// Its name.
    pub name: String,
    /// Its media type.
    pub mime: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

/// The quoted mail a reply answers.
pub struct Quote {
    /// `On DATE, ADDRESS wrote:`.
    pub attribution: String,
    /// The text quoted.
    pub text: String,
}

/// An outbound mail.
pub struct Outgoing<'a> {
    /// `From:` address.
    pub from: &'a str,
    /// Display name of `From:`.
    pub from_name: Option<&'a str>,
    /// `To:` address.
    pub to: &'a str,
    /// Subject.
    pub subject: &'a str,
    /// `Message-ID` without brackets.
    pub message_id: &'a str,
    /// `In-Reply-To` without brackets.
    pub in_reply_to: Option<&'a str>,
    /// `References` without brackets, oldest first.
    pub references: &'a [String],
    /// `Date:` value.
    pub date: &'a str,
    /// The text, Markdown.
    pub markdown: &'a str,
    /// The quoted mail.
    pub quote: Option<Quote>,
    /// Files.
    pub files: Vec<OutFile>,
}

fn boundary(message_id: &str, n: u8) -> String {
    format!("weft-{:016x}-{n}", crate::fnv64(message_id.as_bytes()))
}

/// The mail as RFC 5322 bytes (CRLF line ends). The same input gives the same bytes.
pub fn build(o: &Outgoing<'_>) -> Vec<u8> {
    let mut h = String::new();
    match o.from_name {
        Some(n) if !n.is_empty() => {
            let n = if n.is_ascii() {
                format!("\"{}\"", n.replace(['"', '\\'], ""))
            } else {
                encode_header(n)
            };
            h.push_str(&format!("From: {n} <{}>\r\n", o.from));
        }
        _ => h.push_str(&format!("From: <{}>\r\n", o.from)),
    }
    h.push_str(&format!("To: <{}>\r\n", o.to));
    h.push_str(&format!("Subject: {}\r\n", encode_header(o.subject)));
    h.push_str(&format!("Date: {}\r\n", o.date));
    h.push_str(&format!("Message-ID: <{}>\r\n", o.message_id));
    if let Some(r) = o.in_reply_to {
        h.push_str(&format!("In-Reply-To: <{r}>\r\n"));
    }
    if !o.references.is_empty() {
        let refs: Vec<String> = o.references.iter().map(|r| format!("<{r}>")).collect();
        h.push_str(&format!("References: {}\r\n", refs.join("\r\n ")));
    }
    h.push_str("Auto-Submitted: auto-replied\r\nMIME-Version: 1.0\r\n");

    let mut plain = o.markdown.trim_end().to_string();
    let mut html = markdown_to_html(o.markdown);
    if let Some(q) = &o.quote {
        plain.push_str("\r\n\r\n");
        plain.push_str(&q.attribution);
        for l in q.text.lines() {
            plain.push_str("\r\n> ");
            plain.push_str(l);
        }
        html.push_str(&format!(
            "<p>{}</p><blockquote style=\"margin:0 0 0 .8ex;border-left:1px solid #ccc;padding-left:1ex\">{}</blockquote>",
            escape_html(&q.attribution),
            escape_html(&q.text).replace('\n', "<br>\n")
        ));
    }
    let plain = plain.replace("\r\n", "\n").replace('\n', "\r\n");
    let html = format!("<!DOCTYPE html><html><body>{html}</body></html>");
    let alt_b = boundary(o.message_id, 1);
    let alternative = format!(
        "Content-Type: multipart/alternative; boundary=\"{alt_b}\"\r\n\r\n--{alt_b}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n\r\n{}--{alt_b}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n\r\n{}--{alt_b}--\r\n",
        base64_lines(plain.as_bytes()),
        base64_lines(html.as_bytes())
    );
    let mut out = h.into_bytes();
    if o.files.is_empty() {
        out.extend_from_slice(alternative.as_bytes());
        return out;
    }
    let mix_b = boundary(o.message_id, 0);
    out.extend_from_slice(
        format!("Content-Type: multipart/mixed; boundary=\"{mix_b}\"\r\n\r\n--{mix_b}\r\n")
            .as_bytes(),
    );
    out.extend_from_slice(alternative.as_bytes());
    for f in &o.files {
        let name = encode_header(&f.name.replace(['"', '\\'], "_"));
        let mime =
            if f.mime.contains('/') && f.mime.is_ascii() && !f.mime.contains(['\r', '\n', ';']) {
                f.mime.as_str()
            } else {
                "application/octet-stream"
            };
        out.extend_from_slice(
            format!(
                "--{mix_b}\r\nContent-Type: {mime}; name=\"{name}\"\r\nContent-Disposition: attachment; filename=\"{name}\"\r\nContent-Transfer-Encoding: base64\r\n\r\n{}",
                base64_lines(&f.bytes)
            )
            .as_bytes(),
        );
    }
    out.extend_from_slice(format!("--{mix_b}--\r\n").as_bytes());
    out
}

/// `Re: subject` (once).
pub fn reply_subject(subject: &str) -> String {
    let s = subject.trim();
    if s.len() >= 3 && s[..3].eq_ignore_ascii_case("re:") {
        s.to_string()
    } else if s.is_empty() {
        "Re: your message".into()
    } else {
        format!("Re: {s}")
    }
}

/// An RFC 5322 date for `unix` seconds (UTC).
pub fn rfc5322_date(unix: u64) -> String {
    let days = unix / 86_400;
    let secs = unix % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    const WD: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MO: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{}, {d:02} {} {y} {:02}:{:02}:{:02} +0000",
        WD[(days % 7) as usize],
        MO[(m - 1) as usize],
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn dates_are_rfc5322() {
        assert_eq!(rfc5322_date(0), "Thu, 01 Jan 1970 00:00:00 +0000");
        assert_eq!(
            rfc5322_date(1_795_809_736),
            "Fri, 27 Nov 2026 20:02:16 +0000"
        );
    }

    #[test]
    fn quoted_history_and_signature_are_dropped() {
        let t = "Yes please.\n\nOn Mon, bob@x.org wrote:\n> old\n> older\n";
        assert_eq!(strip_quoted(t), "Yes please.");
        assert_eq!(strip_quoted("hi\n-- \nBob"), "hi");
        assert_eq!(strip_quoted("> only a quote"), "> only a quote");
    }

    #[test]
    fn a_built_mail_parses_back_with_its_threading_text_and_files() {
        let refs = vec!["root@x.org".to_string(), "parent@x.org".to_string()];
        let raw = build(&Outgoing {
            from: "bot@example.org",
            from_name: Some("Wéft"),
            to: "alice@x.org",
            subject: "Re: Grüße",
            message_id: "weft.1@example.org",
            in_reply_to: Some("parent@x.org"),
            references: &refs,
            date: "Fri, 27 Nov 2026 20:02:16 +0000",
            markdown: "**bold** <script>x</script>\n.\nend",
            quote: Some(Quote {
                attribution: "On then, alice@x.org wrote:".into(),
                text: "question".into(),
            }),
            files: vec![OutFile {
                name: "a.txt".into(),
                mime: "text/plain".into(),
                bytes: b"file body".to_vec(),
            }],
        });
        let m = MessageParser::default().parse(&raw).unwrap();
        assert_eq!(m.subject(), Some("Re: Grüße"));
        assert_eq!(m.message_id(), Some("weft.1@example.org"));
        assert_eq!(ids(m.in_reply_to()), ["parent@x.org"]);
        assert_eq!(ids(m.references()), refs);
        let text = m.body_text(0).unwrap();
        assert!(
            text.contains("**bold**") && text.contains("> question"),
            "{text}"
        );
        let html = m.body_html(0).unwrap();
        assert!(
            html.contains("<strong>bold</strong>") && html.contains("&lt;script&gt;"),
            "{html}"
        );
        assert_eq!(m.attachment(0).unwrap().contents(), b"file body");
        assert_eq!(m.attachment(0).unwrap().attachment_name(), Some("a.txt"));
    }

    #[test]
    fn html_only_mail_reads_as_text() {
        let raw = b"From: Bob <Bob@X.org>\r\nSubject: hi\r\nMessage-ID: <m1@x.org>\r\nContent-Type: text/html\r\n\r\n<html><body><p>Hello <b>there</b></p><script>evil()</script></body></html>\r\n";
        let m = parse(raw).unwrap();
        assert_eq!(m.from, "bob@x.org");
        assert!(
            m.text.contains("Hello") && m.text.contains("there"),
            "{}",
            m.text
        );
        assert!(!m.text.contains('<'), "{}", m.text);
    }
}
