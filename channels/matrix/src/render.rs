//! Markdown → a Matrix message body: `formatted_body` in `org.matrix.custom.html` (the HTML
//! subset Matrix clients render) plus the plain `body` every client shows when it renders no
//! HTML (and notifications use).
//!
//! Every piece of text, including raw HTML the Markdown contains (a hostile `<script>` or an
//! `<a href="javascript:…">`), is escaped; only the tags of the spec's recommended subset are
//! produced, links only for `http(s)`, `mailto:` and `matrix:` URLs (others are written out as
//! text). Images become links (a Markdown image names a URL, not an uploaded `mxc://` file).
//!
//! Pure functions; render each chunk after splitting (never split rendered text).

use pulldown_cmark::{CodeBlockKind, Event, HeadingLevel, Options, Parser, Tag, TagEnd};

/// A rendered chunk: the plain body and its HTML form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendered {
    /// `body`: the text without markup.
    pub plain: String,
    /// `formatted_body` (`format: org.matrix.custom.html`).
    pub html: String,
}

impl Rendered {
    /// Bytes both forms take in an event.
    pub fn size(&self) -> usize {
        self.plain.len() + self.html.len()
    }
}

fn push_escaped(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
}

/// Escape text for HTML content or a quoted attribute.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    push_escaped(&mut out, s);
    out
}

fn safe_href(url: &str) -> Option<&str> {
    let u = url.trim();
    let lower = u.to_ascii_lowercase();
    let ok = ["http://", "https://", "mailto:", "matrix:"]
        .iter()
        .any(|p| lower.starts_with(p));
    (ok && !u.chars().any(char::is_control)).then_some(u)
}

fn language(info: &str) -> Option<String> {
    let word = info.split_whitespace().next()?;
    let lang: String = word
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '+' | '-' | '#' | '.'))
        .take(32)
        .collect();
    (!lang.is_empty()).then_some(lang)
}

/// Render Markdown as a Matrix message body (plain and HTML).
pub fn render(md: &str) -> Rendered {
    let mut html = String::new();
    // Links not rendered as `<a>`: the URL to write after their text.
    let mut links: Vec<Option<String>> = Vec::new();
    let mut in_code = false;
    let opts = Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TABLES;
    for ev in Parser::new_ext(md, opts) {
        match ev {
            Event::Start(tag) => match tag {
                Tag::Paragraph => html.push_str("<p>"),
                Tag::Heading { level, .. } => {
                    html.push_str(&format!("<h{}>", heading(level)));
                }
                Tag::BlockQuote(_) => html.push_str("<blockquote>"),
                Tag::CodeBlock(kind) => {
                    in_code = true;
                    match kind {
                        CodeBlockKind::Fenced(info) => match language(&info) {
                            Some(l) => {
                                html.push_str(&format!("<pre><code class=\"language-{l}\">"));
                            }
                            None => html.push_str("<pre><code>"),
                        },
                        CodeBlockKind::Indented => html.push_str("<pre><code>"),
                    }
                }
                Tag::List(Some(1)) => html.push_str("<ol>"),
                Tag::List(Some(n)) => html.push_str(&format!("<ol start=\"{n}\">")),
                Tag::List(None) => html.push_str("<ul>"),
                Tag::Item => html.push_str("<li>"),
                Tag::Emphasis => html.push_str("<em>"),
                Tag::Strong => html.push_str("<strong>"),
                Tag::Strikethrough => html.push_str("<del>"),
                Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. } => {
                    match safe_href(&dest_url) {
                        Some(u) => {
                            html.push_str("<a href=\"");
                            push_escaped(&mut html, u);
                            html.push_str("\">");
                            links.push(None);
                        }
                        None => links.push(Some(dest_url.to_string())),
                    }
                }
                Tag::Table(_) => html.push_str("<table>"),
                Tag::TableHead => html.push_str("<thead><tr>"),
                Tag::TableRow => html.push_str("<tr>"),
                Tag::TableCell => html.push_str("<td>"),
                _ => {}
            },
            Event::End(tag) => match tag {
                TagEnd::Paragraph => html.push_str("</p>"),
                TagEnd::Heading(level) => html.push_str(&format!("</h{}>", heading(level))),
                TagEnd::BlockQuote(_) => html.push_str("</blockquote>"),
                TagEnd::CodeBlock => {
                    in_code = false;
                    html.push_str("</code></pre>");
                }
                TagEnd::List(true) => html.push_str("</ol>"),
                TagEnd::List(false) => html.push_str("</ul>"),
                TagEnd::Item => html.push_str("</li>"),
                TagEnd::Emphasis => html.push_str("</em>"),
                TagEnd::Strong => html.push_str("</strong>"),
                TagEnd::Strikethrough => html.push_str("</del>"),
                TagEnd::Link | TagEnd::Image => match links.pop().flatten() {
                    None => html.push_str("</a>"),
                    Some(url) if !url.is_empty() => {
                        html.push_str(" (");
                        push_escaped(&mut html, &url);
                        html.push(')');
                    }
                    Some(_) => {}
                },
                TagEnd::Table => html.push_str("</table>"),
                TagEnd::TableHead => html.push_str("</tr></thead>"),
                TagEnd::TableRow => html.push_str("</tr>"),
                TagEnd::TableCell => html.push_str("</td>"),
                _ => {}
            },
            Event::Text(t) => push_escaped(&mut html, &t),
            Event::Code(t) => {
                html.push_str("<code>");
                push_escaped(&mut html, &t);
                html.push_str("</code>");
            }
            // Raw HTML in the Markdown is shown as text, never interpreted.
            Event::Html(t) | Event::InlineHtml(t) => push_escaped(&mut html, &t),
            Event::SoftBreak if in_code => html.push('\n'),
            Event::SoftBreak => html.push('\n'),
            Event::HardBreak => html.push_str("<br>"),
            Event::Rule => html.push_str("<hr>"),
            Event::TaskListMarker(done) => html.push_str(if done { "[x] " } else { "[ ] " }),
            _ => {}
        }
    }
    Rendered {
        plain: md.trim().to_string(),
        html,
    }
}

fn heading(level: HeadingLevel) -> u8 {
    match level {
        HeadingLevel::H1 => 1,
        HeadingLevel::H2 => 2,
        HeadingLevel::H3 => 3,
        HeadingLevel::H4 => 4,
        HeadingLevel::H5 => 5,
        HeadingLevel::H6 => 6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_becomes_the_html_subset_and_the_plain_body_keeps_the_text() {
        let r = render(
            "# Title\n\n**bold** and *it* and `x<y`\n\n- one\n- two\n\n```rust\nfn a() {}\n```",
        );
        assert_eq!(
            r.html,
            "<h1>Title</h1><p><strong>bold</strong> and <em>it</em> and <code>x&lt;y</code></p><ul><li>one</li><li>two</li></ul><pre><code class=\"language-rust\">fn a() {}\n</code></pre>"
        );
        assert!(r.plain.contains("**bold**"));
    }

    #[test]
    fn raw_html_and_unsafe_links_are_text_not_markup() {
        let r = render(
            "<script>alert(1)</script>\n\nhi <b onclick=x>there</b> [x](javascript:alert(1)) [ok](https://e.org/?a=\"b\")",
        );
        assert!(!r.html.contains("<script"), "{}", r.html);
        assert!(!r.html.contains("<b "), "{}", r.html);
        assert!(!r.html.contains("href=\"javascript"), "{}", r.html);
        assert!(
            r.html
                .contains("<a href=\"https://e.org/?a=&quot;b&quot;\">ok</a>"),
            "{}",
            r.html
        );
    }
}
