//! The XML of an XMPP stream, as far as a client needs it: a stream reader that yields the
//! stream's opening tag, each complete top-level stanza as an [`Element`], and the stream's
//! end; and escaping for the stanzas we write.
//!
//! Not a general XML parser: no DTDs, no entities beyond the five predefined ones and character
//! references (RFC 6120 §11 forbids the rest), no namespace resolution (names are kept as
//! written, `xmlns` as an attribute). Must not: buffer more than [`MAX_STANZA`] bytes.

use std::fmt;

/// Largest stanza read (Prosody's default `c2s_stanza_size_limit` is 256 KiB).
pub const MAX_STANZA: usize = 1 << 20;

/// One element of a stanza: its name as written, its attributes, its text and children.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Element {
    /// The name as written (`message`, `stream:features`).
    pub name: String,
    /// Attributes, in order, unescaped.
    pub attrs: Vec<(String, String)>,
    /// The text directly inside it, unescaped and concatenated.
    pub text: String,
    /// Child elements, in order.
    pub children: Vec<Element>,
}

impl Element {
    /// The value of attribute `name`.
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Its `xmlns` attribute (empty when it inherits one).
    pub fn ns(&self) -> &str {
        self.attr("xmlns").unwrap_or("")
    }

    /// The first child named `name` (with namespace `ns` when given).
    pub fn child(&self, name: &str, ns: Option<&str>) -> Option<&Element> {
        self.children
            .iter()
            .find(|c| c.name == name && ns.is_none_or(|n| c.ns() == n))
    }
}

/// What the stream reader found.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// The server's `<stream:stream …>` (its attributes).
    Open(Element),
    /// A complete top-level element.
    Stanza(Element),
    /// `</stream:stream>`.
    Close,
}

/// The stream is not XML we can read.
#[derive(Debug, PartialEq, Eq)]
pub struct XmlError(pub String);

impl fmt::Display for XmlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed XML from the server: {}", self.0)
    }
}

impl std::error::Error for XmlError {}

/// Bytes read so far, parsed into events as they complete.
#[derive(Default)]
pub struct Reader {
    buf: Vec<u8>,
}

enum Step<T> {
    Done(T, usize),
    More,
}

impl Reader {
    /// Add bytes read from the socket.
    ///
    /// # Errors
    /// The buffer would pass [`MAX_STANZA`].
    pub fn feed(&mut self, bytes: &[u8]) -> Result<(), XmlError> {
        if self.buf.len() + bytes.len() > MAX_STANZA {
            return Err(XmlError(format!("a stanza over {MAX_STANZA} bytes")));
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    /// Forget everything buffered (a new stream after STARTTLS or SASL).
    pub fn reset(&mut self) {
        self.buf.clear();
    }

    /// The next complete event, `None` when more bytes are needed.
    ///
    /// # Errors
    /// Malformed XML.
    pub fn next_event(&mut self) -> Result<Option<Event>, XmlError> {
        let text = match std::str::from_utf8(&self.buf) {
            Ok(t) => t,
            // A multi-byte character cut at the end of a read: wait for the rest.
            Err(e) if e.error_len().is_none() => {
                match std::str::from_utf8(&self.buf[..e.valid_up_to()]) {
                    Ok(t) => t,
                    Err(e) => return Err(XmlError(e.to_string())),
                }
            }
            Err(e) => return Err(XmlError(e.to_string())),
        };
        let mut p = Parser { s: text, pos: 0 };
        let ev = p.event()?;
        match ev {
            Step::More => Ok(None),
            Step::Done(ev, end) => {
                self.buf.drain(..end);
                Ok(Some(ev))
            }
        }
    }
}

struct Parser<'a> {
    s: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn rest(&self) -> &str {
        &self.s[self.pos..]
    }

    fn skip_ws(&mut self) {
        let r = self.rest();
        self.pos += r.len() - r.trim_start().len();
    }

    fn event(&mut self) -> Result<Step<Event>, XmlError> {
        loop {
            self.skip_ws();
            let r = self.rest();
            if r.is_empty() {
                return Ok(Step::More);
            }
            if r.starts_with("<?") {
                match r.find("?>") {
                    Some(i) => self.pos += i + 2,
                    None => return Ok(Step::More),
                }
                continue;
            }
            if r.starts_with("</") {
                return match r.find('>') {
                    Some(i) if r[2..i].trim() == "stream:stream" => {
                        Ok(Step::Done(Event::Close, self.pos + i + 1))
                    }
                    Some(_) => Err(XmlError(format!(
                        "unexpected end tag at {}",
                        &r[..r.len().min(40)]
                    ))),
                    None => Ok(Step::More),
                };
            }
            if !r.starts_with('<') {
                return Err(XmlError(format!(
                    "text outside a stanza: {}",
                    &r[..r.len().min(40)]
                )));
            }
            if r.starts_with("<stream:stream") {
                return match self.start_tag()? {
                    Step::More => Ok(Step::More),
                    Step::Done((el, _), end) => Ok(Step::Done(Event::Open(el), end)),
                };
            }
            return match self.element()? {
                Step::More => Ok(Step::More),
                Step::Done(el, end) => Ok(Step::Done(Event::Stanza(el), end)),
            };
        }
    }

    /// A start tag at `pos`: the element (no children yet) and whether it closed itself.
    fn start_tag(&mut self) -> Result<Step<(Element, bool)>, XmlError> {
        let r = self.rest();
        let Some(body) = r.strip_prefix('<') else {
            return Err(XmlError("expected a tag".into()));
        };
        let name_len = body
            .find(|c: char| c.is_whitespace() || c == '/' || c == '>')
            .unwrap_or(body.len());
        if name_len == body.len() {
            return Ok(Step::More);
        }
        let mut el = Element {
            name: body[..name_len].to_string(),
            ..Element::default()
        };
        let mut i = 1 + name_len;
        loop {
            let r = &self.s[self.pos + i..];
            let t = r.trim_start();
            i += r.len() - t.len();
            if t.is_empty() {
                return Ok(Step::More);
            }
            if t.starts_with("/>") {
                self.pos += i + 2;
                return Ok(Step::Done((el, true), self.pos));
            }
            if t.starts_with('/') && t.len() == 1 {
                return Ok(Step::More);
            }
            if t.starts_with('>') {
                self.pos += i + 1;
                return Ok(Step::Done((el, false), self.pos));
            }
            let Some(eq) = t.find('=') else {
                return if t.contains('>') {
                    Err(XmlError(format!(
                        "attribute without a value in <{}>",
                        el.name
                    )))
                } else {
                    Ok(Step::More)
                };
            };
            let key = t[..eq].trim().to_string();
            let v = t[eq + 1..].trim_start();
            let skipped = t[eq + 1..].len() - v.len();
            let Some(q) = v.chars().next() else {
                return Ok(Step::More);
            };
            if q != '"' && q != '\'' {
                return Err(XmlError(format!(
                    "unquoted attribute {key} in <{}>",
                    el.name
                )));
            }
            let Some(close) = v[1..].find(q) else {
                return Ok(Step::More);
            };
            el.attrs.push((key, unescape(&v[1..1 + close])?));
            i += eq + 1 + skipped + close + 2;
        }
    }

    fn element(&mut self) -> Result<Step<Element>, XmlError> {
        let (mut el, closed) = match self.start_tag()? {
            Step::More => return Ok(Step::More),
            Step::Done(t, _) => t,
        };
        if closed {
            return Ok(Step::Done(el, self.pos));
        }
        loop {
            let r = self.rest();
            let Some(lt) = r.find('<') else {
                return Ok(Step::More);
            };
            el.text.push_str(&unescape(&r[..lt])?);
            self.pos += lt;
            let r = self.rest();
            if let Some(cd) = r.strip_prefix("<![CDATA[") {
                let Some(end) = cd.find("]]>") else {
                    return Ok(Step::More);
                };
                el.text.push_str(&cd[..end]);
                self.pos += 9 + end + 3;
            } else if r.starts_with("<!--") {
                let Some(end) = r.find("-->") else {
                    return Ok(Step::More);
                };
                self.pos += end + 3;
            } else if let Some(e) = r.strip_prefix("</") {
                let Some(gt) = e.find('>') else {
                    return Ok(Step::More);
                };
                if e[..gt].trim() != el.name {
                    return Err(XmlError(format!(
                        "</{}> closes <{}>",
                        e[..gt].trim(),
                        el.name
                    )));
                }
                self.pos += 2 + gt + 1;
                return Ok(Step::Done(el, self.pos));
            } else if r.len() < 9 && ("<![CDATA[".starts_with(r) || "<!--".starts_with(r)) {
                return Ok(Step::More);
            } else {
                match self.element()? {
                    Step::More => return Ok(Step::More),
                    Step::Done(c, _) => el.children.push(c),
                }
            }
        }
    }
}

/// Text with the five predefined entities and character references replaced.
fn unescape(s: &str) -> Result<String, XmlError> {
    if !s.contains('&') {
        return Ok(s.to_string());
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let after = &rest[amp + 1..];
        let Some(semi) = after.find(';') else {
            return Err(XmlError("an `&` without `;`".into()));
        };
        let ent = &after[..semi];
        let c = match ent {
            "lt" => '<',
            "gt" => '>',
            "amp" => '&',
            "quot" => '"',
            "apos" => '\'',
            _ => {
                let n = if let Some(h) = ent.strip_prefix("#x").or_else(|| ent.strip_prefix("#X")) {
                    u32::from_str_radix(h, 16).ok()
                } else {
                    ent.strip_prefix('#').and_then(|d| d.parse().ok())
                };
                n.and_then(char::from_u32)
                    .ok_or_else(|| XmlError(format!("unknown entity &{ent};")))?
            }
        };
        out.push(c);
        rest = &after[semi + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `s` escaped for text or an attribute value; characters XML 1.0 cannot hold are dropped.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn events(chunks: &[&str]) -> Vec<Event> {
        let mut r = Reader::default();
        let mut out = Vec::new();
        for c in chunks {
            r.feed(c.as_bytes()).unwrap();
            while let Some(e) = r.next_event().unwrap() {
                out.push(e);
            }
        }
        out
    }

    #[test]
    fn a_stream_read_in_pieces_yields_whole_stanzas() {
        let s = "<?xml version='1.0'?><stream:stream xmlns='jabber:client' id='abc' version='1.0'><message from='a@b/c' id='m&amp;1'><body>1 &lt; 2 &#x263A;</body><request xmlns='urn:xmpp:receipts'/></message> <iq type='get'/></stream:stream>";
        let mut whole = events(&[s]);
        let mut parts = Vec::new();
        for n in [1, 3, 7, 50] {
            let chunks: Vec<&str> = {
                let mut v = Vec::new();
                let mut i = 0;
                while i < s.len() {
                    let mut j = (i + n).min(s.len());
                    while !s.is_char_boundary(j) {
                        j += 1;
                    }
                    v.push(&s[i..j]);
                    i = j;
                }
                v
            };
            parts.push(events(&chunks));
        }
        for p in parts {
            assert_eq!(p, whole);
        }
        assert_eq!(whole.len(), 4);
        let Event::Stanza(m) = whole.remove(1) else {
            panic!("not a stanza")
        };
        assert_eq!(m.attr("id"), Some("m&1"));
        assert_eq!(m.child("body", None).unwrap().text, "1 < 2 \u{263A}");
        assert!(m.child("request", Some("urn:xmpp:receipts")).is_some());
        assert_eq!(whole.pop(), Some(Event::Close));
    }

    #[test]
    fn mismatched_tags_and_oversized_stanzas_are_errors() {
        let mut r = Reader::default();
        r.feed(b"<a><b></a>").unwrap();
        assert!(r.next_event().is_err());
        let mut r = Reader::default();
        assert!(r.feed(&vec![b' '; MAX_STANZA + 1]).is_err());
    }

    #[test]
    fn escaping_round_trips_and_drops_what_xml_cannot_hold() {
        let t = "a<b>&\"'\u{1}z";
        assert_eq!(escape(t), "a&lt;b&gt;&amp;&quot;&apos;z");
        assert_eq!(unescape(&escape(t)).unwrap(), "a<b>&\"'z");
    }
}
