//! HTML → readable text for `web_fetch` (and search snippets). A small hand-written tokenizer:
//! drops `script`/`style`/`noscript`/`head`/`template`/`svg`, turns block elements into line
//! breaks, renders links as `text (url)`, decodes entities and collapses whitespace. It does not
//! build a DOM, run scripts, apply CSS or fetch anything.
//!
//! Why not `html2text`: it pulls html5ever, markup5ever, tendril, string_cache and a 2,000-entry
//! entity table for what is, here, a best-effort view for a model; this converter is a few
//! hundred lines with no dependency, linear in the input and never recursive.

use url::Url;

/// Elements whose content is raw text up to their end tag (never parsed as markup).
const RAW_TEXT: [&str; 6] = ["script", "style", "xmp", "iframe", "noembed", "noframes"];
/// Elements whose content is parsed but not shown.
const HIDDEN: [&str; 6] = ["head", "noscript", "template", "svg", "math", "select"];
/// Elements that end a paragraph (blank line around them).
const PARAGRAPH: [&str; 16] = [
    "p",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "pre",
    "blockquote",
    "table",
    "ul",
    "ol",
    "dl",
    "figure",
    "hr",
    "form",
];
/// Elements that start on a new line.
const LINE: [&str; 22] = [
    "div",
    "section",
    "article",
    "header",
    "footer",
    "nav",
    "aside",
    "main",
    "tr",
    "dt",
    "dd",
    "figcaption",
    "address",
    "details",
    "summary",
    "caption",
    "fieldset",
    "legend",
    "option",
    "body",
    "html",
    "center",
];

/// Named entities decoded (the common ones; others are left as written).
const ENTITIES: &[(&str, char)] = &[
    ("amp", '&'),
    ("lt", '<'),
    ("gt", '>'),
    ("quot", '"'),
    ("apos", '\''),
    ("nbsp", '\u{a0}'),
    ("copy", '©'),
    ("reg", '®'),
    ("trade", '™'),
    ("hellip", '…'),
    ("mdash", '—'),
    ("ndash", '–'),
    ("lsquo", '‘'),
    ("rsquo", '’'),
    ("sbquo", '‚'),
    ("ldquo", '“'),
    ("rdquo", '”'),
    ("bdquo", '„'),
    ("laquo", '«'),
    ("raquo", '»'),
    ("lsaquo", '‹'),
    ("rsaquo", '›'),
    ("bull", '•'),
    ("middot", '·'),
    ("deg", '°'),
    ("plusmn", '±'),
    ("times", '×'),
    ("divide", '÷'),
    ("minus", '−'),
    ("frac12", '½'),
    ("frac14", '¼'),
    ("frac34", '¾'),
    ("sup2", '²'),
    ("sup3", '³'),
    ("micro", 'µ'),
    ("para", '¶'),
    ("sect", '§'),
    ("cent", '¢'),
    ("pound", '£'),
    ("euro", '€'),
    ("yen", '¥'),
    ("curren", '¤'),
    ("iexcl", '¡'),
    ("iquest", '¿'),
    ("shy", '\u{ad}'),
    ("ensp", '\u{2002}'),
    ("emsp", '\u{2003}'),
    ("thinsp", '\u{2009}'),
    ("zwnj", '\u{200c}'),
    ("zwj", '\u{200d}'),
    ("larr", '←'),
    ("rarr", '→'),
    ("uarr", '↑'),
    ("darr", '↓'),
    ("harr", '↔'),
    ("rArr", '⇒'),
    ("lArr", '⇐'),
    ("le", '≤'),
    ("ge", '≥'),
    ("ne", '≠'),
    ("asymp", '≈'),
    ("infin", '∞'),
    ("check", '✓'),
    ("dagger", '†'),
    ("Dagger", '‡'),
    ("prime", '′'),
    ("Prime", '″'),
    ("acute", '´'),
    ("uml", '¨'),
    ("ordf", 'ª'),
    ("ordm", 'º'),
    ("not", '¬'),
    ("macr", '¯'),
    ("szlig", 'ß'),
    ("auml", 'ä'),
    ("ouml", 'ö'),
    ("uuml", 'ü'),
    ("Auml", 'Ä'),
    ("Ouml", 'Ö'),
    ("Uuml", 'Ü'),
    ("eacute", 'é'),
    ("egrave", 'è'),
    ("ecirc", 'ê'),
    ("Eacute", 'É'),
    ("aacute", 'á'),
    ("agrave", 'à'),
    ("acirc", 'â'),
    ("atilde", 'ã'),
    ("aring", 'å'),
    ("aelig", 'æ'),
    ("ccedil", 'ç'),
    ("Ccedil", 'Ç'),
    ("iacute", 'í'),
    ("igrave", 'ì'),
    ("icirc", 'î'),
    ("iuml", 'ï'),
    ("ntilde", 'ñ'),
    ("Ntilde", 'Ñ'),
    ("oacute", 'ó'),
    ("ograve", 'ò'),
    ("ocirc", 'ô'),
    ("otilde", 'õ'),
    ("oslash", 'ø'),
    ("Oslash", 'Ø'),
    ("uacute", 'ú'),
    ("ugrave", 'ù'),
    ("ucirc", 'û'),
    ("yacute", 'ý'),
    ("yuml", 'ÿ'),
    ("alpha", 'α'),
    ("beta", 'β'),
    ("gamma", 'γ'),
    ("delta", 'δ'),
    ("epsilon", 'ε'),
    ("lambda", 'λ'),
    ("mu", 'μ'),
    ("pi", 'π'),
    ("sigma", 'σ'),
    ("omega", 'ω'),
    ("Omega", 'Ω'),
];

/// Whether a body looks like an HTML document (used when the content type says nothing).
pub fn looks_like_html(body: &[u8]) -> bool {
    let head = &body[..body.len().min(1024)];
    let head = head.strip_prefix(b"\xef\xbb\xbf").unwrap_or(head);
    let start = head
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(head.len());
    let head = &head[start..];
    ["<!doctype html", "<html", "<head", "<body"]
        .iter()
        .any(|p| head.len() >= p.len() && head[..p.len()].eq_ignore_ascii_case(p.as_bytes()))
}

/// Decode character references in `s` (`&amp;`, `&#233;`, `&#x1F600;`, and the common named
/// ones). Unknown or malformed references are kept as written.
pub fn decode_entities(s: &str) -> String {
    if !s.contains('&') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        match decode_one(rest) {
            Some((c, used)) => {
                out.push(c);
                rest = &rest[used..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Decode the reference at the start of `s` (which starts with `&`): the char and bytes used.
fn decode_one(s: &str) -> Option<(char, usize)> {
    let body = &s[1..];
    if let Some(num) = body.strip_prefix('#') {
        let (digits, radix, skip) = match num.strip_prefix(['x', 'X']) {
            Some(hex) => (hex, 16, 2),
            None => (num, 10, 1),
        };
        let len = digits
            .bytes()
            .take_while(|b| (*b as char).is_digit(radix))
            .count();
        if len == 0 || len > 8 {
            return None;
        }
        let n = u32::from_str_radix(&digits[..len], radix).ok()?;
        let c = match char::from_u32(n) {
            Some('\0') | None => '\u{fffd}',
            Some(c) => c,
        };
        let semi = usize::from(digits[len..].starts_with(';'));
        return Some((c, 1 + skip + len + semi));
    }
    let len = body.bytes().take_while(u8::is_ascii_alphanumeric).count();
    let name = &body[..len];
    let c = ENTITIES.iter().find(|(n, _)| *n == name).map(|(_, c)| *c)?;
    if body[len..].starts_with(';') {
        Some((c, 1 + len + 1))
    } else if matches!(name, "amp" | "lt" | "gt" | "quot" | "nbsp") {
        // Legacy references without `;`.
        Some((c, 1 + len))
    } else {
        None
    }
}

/// Position of `needle` (ASCII, lowercase) in `hay`, ignoring ASCII case.
fn find_ci(hay: &str, needle: &str) -> Option<usize> {
    let h = hay.as_bytes();
    let n = needle.as_bytes();
    if n.len() > h.len() {
        return None;
    }
    (0..=h.len() - n.len()).find(|&i| h[i..i + n.len()].eq_ignore_ascii_case(n))
}

/// Text output with whitespace collapsing and paragraph handling.
struct Out {
    text: String,
    /// A space is owed before the next word.
    space: bool,
    /// Line breaks owed before the next word (0, 1 or 2).
    breaks: u8,
}

impl Out {
    fn brk(&mut self, n: u8) {
        self.breaks = self.breaks.max(n);
    }

    fn open(&mut self) {
        if self.text.is_empty() {
            self.breaks = 0;
            self.space = false;
            return;
        }
        if self.breaks > 0 {
            while self.text.ends_with(' ') {
                self.text.pop();
            }
            let have = self.text.len() - self.text.trim_end_matches('\n').len();
            for _ in have..usize::from(self.breaks) {
                self.text.push('\n');
            }
        } else if self.space && !self.text.ends_with([' ', '\n']) {
            self.text.push(' ');
        }
        self.breaks = 0;
        self.space = false;
    }

    /// Text with whitespace collapsed.
    fn words(&mut self, s: &str) {
        let s = decode_entities(s);
        if s.starts_with(char::is_whitespace) {
            self.space = true;
        }
        let mut first = true;
        for w in s.split_whitespace() {
            if !first {
                self.space = true;
            }
            self.open();
            self.text.push_str(w);
            first = false;
        }
        if !first && s.ends_with(char::is_whitespace) {
            self.space = true;
        }
    }

    /// Preformatted text, kept as is.
    fn verbatim(&mut self, s: &str) {
        let s = decode_entities(s);
        if s.is_empty() {
            return;
        }
        self.open();
        self.text.push_str(&s);
    }
}

/// One parsed tag.
struct Tag<'a> {
    name: String,
    end: bool,
    attrs: &'a str,
}

/// The value of attribute `want` in a tag's attribute text, entity-decoded.
fn attr(attrs: &str, want: &str) -> Option<String> {
    let b = attrs.as_bytes();
    let mut i = 0;
    while i < b.len() {
        while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b'/') {
            i += 1;
        }
        let start = i;
        while i < b.len() && !b[i].is_ascii_whitespace() && b[i] != b'=' && b[i] != b'/' {
            i += 1;
        }
        let name = &attrs[start..i];
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let mut value = None;
        if i < b.len() && b[i] == b'=' {
            i += 1;
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            if i < b.len() && (b[i] == b'"' || b[i] == b'\'') {
                let q = b[i];
                let vs = i + 1;
                let ve = b[vs..]
                    .iter()
                    .position(|c| *c == q)
                    .map_or(b.len(), |p| vs + p);
                value = Some(&attrs[vs..ve]);
                i = (ve + 1).min(b.len());
            } else {
                let vs = i;
                while i < b.len() && !b[i].is_ascii_whitespace() {
                    i += 1;
                }
                value = Some(&attrs[vs..i]);
            }
        }
        if name.eq_ignore_ascii_case(want) {
            return value.map(decode_entities);
        }
        if start == i {
            i += 1;
        }
    }
    None
}

/// Parse the tag starting at `s` (which starts with `<`): the tag and its length, or `None`
/// when this `<` is literal text.
fn parse_tag(s: &str) -> Option<(Tag<'_>, usize)> {
    let b = s.as_bytes();
    let (end, ns) = if b.get(1) == Some(&b'/') {
        (true, 2)
    } else {
        (false, 1)
    };
    if !b.get(ns).is_some_and(u8::is_ascii_alphabetic) {
        return None;
    }
    let name_len = b[ns..]
        .iter()
        .take_while(|c| c.is_ascii_alphanumeric() || **c == b'-' || **c == b':')
        .count();
    let name = s[ns..ns + name_len].to_ascii_lowercase();
    // Find the closing `>` outside quotes.
    let mut i = ns + name_len;
    let mut quote = None;
    while i < b.len() {
        match (quote, b[i]) {
            (None, b'"' | b'\'') => quote = Some(b[i]),
            (Some(q), c) if c == q => quote = None,
            (None, b'>') => break,
            _ => {}
        }
        i += 1;
    }
    let attrs = &s[ns + name_len..i.min(b.len())];
    Some((Tag { name, end, attrs }, (i + 1).min(b.len())))
}

/// Convert an HTML document to readable text. `base` resolves relative link targets.
pub fn html_to_text(html: &str, base: Option<&Url>) -> String {
    let mut out = Out {
        text: String::with_capacity(html.len() / 4),
        space: false,
        breaks: 0,
    };
    let mut hidden: Vec<String> = Vec::new();
    let mut pre = 0usize;
    // Open links: (href shown after the text, text length when opened).
    let mut links: Vec<(Option<String>, usize)> = Vec::new();
    let mut rest = html;
    while !rest.is_empty() {
        let Some(lt) = rest.find('<') else {
            emit(&mut out, rest, pre, &hidden);
            break;
        };
        emit(&mut out, &rest[..lt], pre, &hidden);
        rest = &rest[lt..];
        if rest.starts_with("<!--") {
            rest = rest[4..].find("-->").map_or("", |p| &rest[4 + p + 3..]);
            continue;
        }
        if rest.starts_with("<!") || rest.starts_with("<?") {
            rest = rest.find('>').map_or("", |p| &rest[p + 1..]);
            continue;
        }
        let Some((tag, used)) = parse_tag(rest) else {
            emit(&mut out, "<", pre, &hidden);
            rest = &rest[1..];
            continue;
        };
        rest = &rest[used..];
        let name = tag.name.as_str();
        if !tag.end && RAW_TEXT.contains(&name) {
            let close = format!("</{name}");
            rest = find_ci(rest, &close).map_or("", |p| {
                rest[p..].find('>').map_or("", |q| &rest[p + q + 1..])
            });
            continue;
        }
        if name == "body" && !tag.end {
            // `<head>` is often left open.
            hidden.retain(|h| h != "head");
        }
        if HIDDEN.contains(&name) {
            if tag.end {
                if let Some(p) = hidden.iter().rposition(|h| h == name) {
                    hidden.truncate(p);
                }
            } else if !tag.attrs.trim_end().ends_with('/') {
                hidden.push(name.to_string());
            }
            continue;
        }
        if !hidden.is_empty() {
            continue;
        }
        match name {
            "br" => {
                out.open();
                out.text.push('\n');
                out.space = false;
            }
            "li" if !tag.end => {
                out.brk(1);
                out.open();
                out.text.push_str("- ");
            }
            "li" => out.brk(1),
            "td" | "th" if !tag.end => out.space = true,
            "img" if !tag.end => {
                if let Some(alt) = attr(tag.attrs, "alt").filter(|a| !a.trim().is_empty()) {
                    out.words(&format!(" [image: {}] ", alt.trim()));
                }
            }
            "a" if !tag.end => {
                let href = attr(tag.attrs, "href")
                    .map(|h| h.trim().to_string())
                    .filter(|h| !h.is_empty() && !h.starts_with('#'))
                    .filter(|h| !h.to_ascii_lowercase().starts_with("javascript:"))
                    .map(|h| match base.and_then(|b| b.join(&h).ok()) {
                        Some(u) => u.to_string(),
                        None => h,
                    });
                links.push((href, out.text.len()));
            }
            "a" => {
                if let Some((Some(href), start)) = links.pop() {
                    let text = out.text.get(start..).unwrap_or("").trim();
                    if text.is_empty() {
                        out.words(&href);
                    } else if text != href {
                        out.space = true;
                        out.open();
                        out.text.push('(');
                        out.text.push_str(&href);
                        out.text.push(')');
                    }
                }
            }
            "pre" => {
                out.brk(2);
                if tag.end {
                    pre = pre.saturating_sub(1);
                } else {
                    pre += 1;
                }
            }
            "hr" => {
                out.brk(2);
                out.open();
                out.text.push_str("---");
                out.brk(2);
            }
            "h1" | "h2" | "h3" | "h4" | "h5" | "h6" => {
                out.brk(2);
                if !tag.end {
                    out.open();
                    let level = usize::from(name.as_bytes()[1] - b'0');
                    out.text.push_str(&"#".repeat(level));
                    out.text.push(' ');
                }
            }
            _ if PARAGRAPH.contains(&name) => out.brk(2),
            _ if LINE.contains(&name) => out.brk(1),
            _ => {}
        }
    }
    let mut text = out.text;
    let trimmed = text.trim_end().len();
    text.truncate(trimmed);
    text
}

fn emit(out: &mut Out, s: &str, pre: usize, hidden: &[String]) {
    if !hidden.is_empty() || s.is_empty() {
        return;
    }
    if pre > 0 {
        out.verbatim(s);
    } else {
        out.words(s);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn converts_a_page() {
        let html = r#"<!DOCTYPE html><html><head><title>T</title>
            <style>body { color: red }</style><script>var secret = "S3CR3T";</script></head>
            <body><h1>Hello &amp; welcome</h1>
            <p>First   paragraph
               with <b>bold</b> and a <a href="/docs?a=1&amp;b=2">link</a>.</p>
            <noscript>enable JS</noscript>
            <ul><li>one</li><li>two</li></ul>
            <script type="module">alert("</scr" + "ipt")</script>
            <p>caf&eacute; &#233; &#x1F600; &lt;tag&gt; 日本語</p>
            <pre>  keep
   this</pre><!-- hidden comment --><img src="x.png" alt="A cat">
            <a href="https://ex.com/">https://ex.com/</a> <a href="javascript:x()">js</a>
            </body></html>"#;
        let base = Url::parse("https://site.test/page").unwrap();
        let t = html_to_text(html, Some(&base));
        assert_eq!(
            t,
            "# Hello & welcome\n\nFirst paragraph with bold and a link (https://site.test/docs?a=1&b=2).\n\n- one\n- two\n\ncafé é 😀 <tag> 日本語\n\n  keep\n   this\n\n[image: A cat] https://ex.com/ js"
        );
        assert!(!t.contains("S3CR3T") && !t.contains("color") && !t.contains("enable JS"));
        assert!(!t.contains("alert") && !t.contains("hidden comment"));
    }

    #[test]
    fn odd_input_does_not_break() {
        assert_eq!(html_to_text("", None), "");
        assert_eq!(html_to_text("a < b > c", None), "a < b > c");
        assert_eq!(html_to_text("<p>unclosed <a href='x'", None), "unclosed");
        assert_eq!(html_to_text("<script>never closed", None), "");
        assert_eq!(html_to_text("x<br>y<br/>z", None), "x\ny\nz");
        assert_eq!(
            html_to_text("&bogus; &amp &#xZZ; &#0;", None),
            "&bogus; & &#xZZ; \u{fffd}"
        );
        assert_eq!(html_to_text("<head><title>t</title><body>b", None), "b");
        let deep = "<div>".repeat(10_000) + "x";
        assert_eq!(html_to_text(&deep, None), "x");
    }

    #[test]
    fn sniffing() {
        assert!(looks_like_html(b"\xef\xbb\xbf  <!DOCTYPE html><p>"));
        assert!(looks_like_html(b"<HTML>"));
        assert!(!looks_like_html(b"{\"a\": \"<html>\"}"));
        assert!(!looks_like_html(b""));
    }
}
