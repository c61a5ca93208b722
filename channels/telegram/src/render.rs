//! Markdown → Telegram HTML (`parse_mode = "HTML"`).
//!
//! Telegram's HTML dialect accepts a handful of tags and only the entities `&lt;`, `&gt;`,
//! `&amp;`, `&quot;` (plus numeric ones); any other `<` or `&` makes the whole message fail
//! with "can't parse entities". So every piece of text, including raw HTML the Markdown
//! contains (a hostile `<script>`), is escaped, and only these tags are produced:
//! `<b>`, `<i>`, `<s>`, `<code>`, `<pre>`, `<pre><code class="language-x">`, `<a href>`,
//! `<blockquote>`. Headings become bold lines, list items `• ` (or `N. `) lines, rules a line
//! of dashes. Entities Telegram refuses to nest are never nested: a code span inside a link is
//! plain text, a code block inside a quote closes the quote around it, nested quotes flatten,
//! and links whose scheme Telegram does not open (`javascript:`, relative paths) are written
//! out as text.

use pulldown_cmark::{CodeBlockKind, Event, Options, Parser, Tag, TagEnd};

/// Escape `&`, `<`, `>` for text content.
pub fn escape_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    push_escaped(&mut out, s, false);
    out
}

fn push_escaped(out: &mut String, s: &str, attr: bool) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' if attr => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
}

/// Length in UTF-16 code units of the text Telegram shows for `html` (tags removed, entities
/// counted as one character): what Telegram's 4096 limit applies to.
pub fn visible_len(html: &str) -> usize {
    let mut n = 0;
    let mut rest = html;
    while let Some(c) = rest.chars().next() {
        match c {
            '<' => match rest.find('>') {
                Some(end) => rest = &rest[end + 1..],
                None => {
                    n += 1;
                    rest = &rest[1..];
                }
            },
            '&' => {
                let end = rest
                    .char_indices()
                    .take(12)
                    .find(|(_, c)| *c == ';')
                    .map(|(i, _)| i);
                n += 1;
                rest = &rest[end.map_or(1, |e| e + 1)..];
            }
            c => {
                n += c.len_utf16();
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    n
}

/// Schemes Telegram opens from a text link.
fn safe_href(url: &str) -> Option<String> {
    let lower = url.trim().to_ascii_lowercase();
    let ok = ["http://", "https://", "tg://", "mailto:"]
        .iter()
        .any(|p| lower.starts_with(p));
    if !ok || url.chars().any(char::is_control) {
        return None;
    }
    Some(url.trim().replace(' ', "%20"))
}

/// A fenced block's language, restricted to characters safe in a class attribute.
fn language(info: &str) -> Option<String> {
    let word = info.split_whitespace().next()?;
    let lang: String = word
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '+' | '-' | '#' | '.'))
        .take(32)
        .collect();
    (!lang.is_empty()).then_some(lang)
}

#[derive(Default)]
struct Renderer {
    out: String,
    /// Newlines to write before the next content.
    pending: usize,
    /// Nothing written since the last block opened (no separator needed).
    fresh: bool,
    bold: usize,
    italic: usize,
    strike: usize,
    quote: usize,
    /// An `<a>` is open.
    link_open: bool,
    /// Links (or images) not rendered as `<a>`: the URL to write after their text.
    link_stack: Vec<Option<String>>,
    /// Lists: `Some(next number)` for ordered ones.
    lists: Vec<Option<u64>>,
    in_code_block: bool,
    /// The open code block has a `<code class>` inside its `<pre>`.
    code_lang: bool,
    /// The quote was closed around a code block and must be reopened after it.
    reopen_quote: bool,
}

impl Renderer {
    fn flush(&mut self) {
        if self.reopen_quote && !self.in_code_block {
            self.reopen_quote = false;
            self.newlines();
            self.out.push_str("<blockquote>");
            return;
        }
        self.newlines();
    }

    fn newlines(&mut self) {
        for _ in 0..self.pending {
            self.out.push('\n');
        }
        self.pending = 0;
        self.fresh = false;
    }

    fn text(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        self.flush();
        push_escaped(&mut self.out, s, false);
    }

    fn raw(&mut self, s: &str) {
        self.flush();
        self.out.push_str(s);
    }

    /// A block starts: separate it from what came before.
    fn block(&mut self, newlines: usize) {
        if !self.fresh && !self.out.is_empty() {
            self.pending = self.pending.max(newlines);
        }
    }

    fn open_inline(&mut self, depth: usize, tag: &str) -> usize {
        if depth == 0 {
            self.raw(tag);
        }
        depth + 1
    }

    fn close_inline(&mut self, depth: usize, tag: &str) -> usize {
        if depth == 1 {
            self.out.push_str(tag);
        }
        depth.saturating_sub(1)
    }

    fn start(&mut self, tag: Tag<'_>) {
        match tag {
            Tag::Paragraph => {
                let n = if self.lists.is_empty() { 2 } else { 1 };
                self.block(n);
            }
            Tag::Heading { .. } => {
                self.block(2);
                self.bold = self.open_inline(self.bold, "<b>");
            }
            Tag::BlockQuote(_) => {
                self.block(2);
                if self.quote == 0 {
                    self.raw("<blockquote>");
                    self.fresh = true;
                }
                self.quote += 1;
            }
            Tag::CodeBlock(kind) => {
                self.block(if self.lists.is_empty() { 2 } else { 1 });
                if self.quote > 0 && !self.reopen_quote {
                    // Telegram does not nest <pre> in <blockquote>: close the quote around it.
                    self.out.push_str("</blockquote>");
                    self.reopen_quote = true;
                }
                self.in_code_block = true;
                self.newlines();
                match kind {
                    CodeBlockKind::Fenced(info) => match language(&info) {
                        Some(lang) => {
                            self.out.push_str("<pre><code class=\"language-");
                            self.out.push_str(&lang);
                            self.out.push_str("\">");
                            self.code_lang = true;
                        }
                        None => self.out.push_str("<pre>"),
                    },
                    CodeBlockKind::Indented => self.out.push_str("<pre>"),
                }
            }
            Tag::HtmlBlock => self.block(2),
            Tag::List(start) => {
                self.block(if self.lists.is_empty() { 2 } else { 1 });
                self.lists.push(start);
            }
            Tag::Item => {
                if !self.out.is_empty() {
                    self.pending = self.pending.max(1);
                }
                let depth = self.lists.len().saturating_sub(1);
                let bullet = match self.lists.last_mut() {
                    Some(Some(n)) => {
                        let b = format!("{n}. ");
                        *n += 1;
                        b
                    }
                    _ => "• ".to_string(),
                };
                self.flush();
                self.out.push_str(&"  ".repeat(depth));
                self.out.push_str(&bullet);
                self.fresh = true;
            }
            Tag::Emphasis => self.italic = self.open_inline(self.italic, "<i>"),
            Tag::Strong => self.bold = self.open_inline(self.bold, "<b>"),
            Tag::Strikethrough => self.strike = self.open_inline(self.strike, "<s>"),
            Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. } => {
                match safe_href(&dest_url).filter(|_| !self.link_open) {
                    Some(href) => {
                        self.flush();
                        self.out.push_str("<a href=\"");
                        push_escaped(&mut self.out, &href, true);
                        self.out.push_str("\">");
                        self.link_open = true;
                        self.link_stack.push(None);
                    }
                    None => {
                        let url = dest_url.trim().to_string();
                        self.link_stack.push((!url.is_empty()).then_some(url));
                    }
                }
            }
            _ => {}
        }
    }

    fn end(&mut self, tag: TagEnd) {
        match tag {
            TagEnd::Heading(_) => {
                self.bold = self.close_inline(self.bold, "</b>");
                self.pending = 0;
                self.block(2);
            }
            TagEnd::BlockQuote(_) => {
                self.quote = self.quote.saturating_sub(1);
                if self.quote == 0 {
                    if self.reopen_quote {
                        self.reopen_quote = false;
                    } else {
                        self.out.push_str("</blockquote>");
                    }
                }
            }
            TagEnd::CodeBlock => {
                while self.out.ends_with('\n') {
                    self.out.pop();
                }
                if self.out.ends_with("<pre>") || self.out.ends_with("\">") {
                    // Telegram refuses an empty entity.
                    self.out.push(' ');
                }
                let close = if self.code_lang {
                    "</code></pre>"
                } else {
                    "</pre>"
                };
                self.out.push_str(close);
                self.in_code_block = false;
                self.code_lang = false;
            }
            TagEnd::List(_) => {
                self.lists.pop();
            }
            TagEnd::Emphasis => self.italic = self.close_inline(self.italic, "</i>"),
            TagEnd::Strong => self.bold = self.close_inline(self.bold, "</b>"),
            TagEnd::Strikethrough => self.strike = self.close_inline(self.strike, "</s>"),
            TagEnd::Link | TagEnd::Image => match self.link_stack.pop() {
                Some(None) if self.link_open => {
                    self.out.push_str("</a>");
                    self.link_open = false;
                }
                Some(Some(url)) => self.text(&format!(" ({url})")),
                _ => {}
            },
            _ => {}
        }
    }

    fn event(&mut self, ev: Event<'_>) {
        match ev {
            Event::Start(tag) => self.start(tag),
            Event::End(tag) => self.end(tag),
            Event::Text(t) => self.text(&t),
            Event::Code(t) => {
                if self.link_open || t.is_empty() {
                    self.text(&t);
                } else {
                    self.raw("<code>");
                    push_escaped(&mut self.out, &t, false);
                    self.out.push_str("</code>");
                }
            }
            Event::Html(t) | Event::InlineHtml(t) => {
                // Raw HTML is shown as text. Trailing newlines of block HTML lines are kept
                // pending so the message never ends with them.
                let body = t.trim_end_matches('\n');
                self.text(body);
                let trailing = t.len() - body.len();
                if trailing > 0 && !self.out.is_empty() {
                    self.pending = self.pending.max(trailing);
                }
            }
            Event::SoftBreak | Event::HardBreak => {
                if self.in_code_block {
                    self.out.push('\n');
                } else {
                    self.flush();
                    self.out.push('\n');
                }
            }
            Event::Rule => {
                self.block(2);
                self.text("——————");
                self.block(2);
            }
            Event::FootnoteReference(t) => self.text(&format!("[{t}]")),
            Event::TaskListMarker(done) => self.text(if done { "☑ " } else { "☐ " }),
            Event::InlineMath(t) | Event::DisplayMath(t) => self.text(&t),
        }
    }
}

/// Render Markdown as Telegram HTML. Pure; never fails; the output only contains the tags
/// listed in the module documentation, properly nested, with all text escaped.
pub fn markdown_to_html(md: &str) -> String {
    let mut r = Renderer {
        fresh: true,
        ..Renderer::default()
    };
    for ev in Parser::new_ext(md, Options::ENABLE_STRIKETHROUGH) {
        r.event(ev);
    }
    // Anything still open (cannot happen with pulldown-cmark's balanced events, but be sure).
    if r.link_open {
        r.out.push_str("</a>");
    }
    for (depth, tag) in [(r.strike, "</s>"), (r.italic, "</i>"), (r.bold, "</b>")] {
        if depth > 0 {
            r.out.push_str(tag);
        }
    }
    if r.quote > 0 && !r.reopen_quote {
        r.out.push_str("</blockquote>");
    }
    r.out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn r(md: &str) -> String {
        markdown_to_html(md)
    }

    #[test]
    fn inline_styles() {
        assert_eq!(
            r("**bold** *it* _it2_ ~~gone~~ `x < y`"),
            "<b>bold</b> <i>it</i> <i>it2</i> <s>gone</s> <code>x &lt; y</code>"
        );
        assert_eq!(r("***both***"), "<i><b>both</b></i>");
        assert_eq!(r("**a **b** c**"), "<b>a b c</b>");
    }

    #[test]
    fn headings_become_bold_lines() {
        assert_eq!(
            r("# Title\n\nbody\n\n## Sub **x**\ntext"),
            "<b>Title</b>\n\nbody\n\n<b>Sub x</b>\n\ntext"
        );
    }

    #[test]
    fn lists_become_bullets() {
        assert_eq!(
            r("intro\n\n- one\n- two\n  - nested\n- three\n\nafter"),
            "intro\n\n• one\n• two\n  • nested\n• three\n\nafter"
        );
        assert_eq!(r("3. c\n4. d"), "3. c\n4. d");
        assert_eq!(
            r("- loose\n\n- items\n\n  second para"),
            "• loose\n• items\nsecond para"
        );
    }

    #[test]
    fn code_blocks() {
        assert_eq!(
            r("Here:\n\n```rust\nfn main() { a < b && c > d }\n```\n\nDone."),
            "Here:\n\n<pre><code class=\"language-rust\">fn main() { a &lt; b &amp;&amp; c &gt; d }</code></pre>\n\nDone."
        );
        assert_eq!(r("```\nplain\n```"), "<pre>plain</pre>");
        assert_eq!(r("    indented"), "<pre>indented</pre>");
        assert_eq!(r("```\n```"), "<pre> </pre>");
        // A hostile info string cannot break out of the attribute.
        assert_eq!(
            r("```rust\"><script>\nx\n```"),
            "<pre><code class=\"language-rustscript\">x</code></pre>"
        );
    }

    #[test]
    fn links() {
        assert_eq!(
            r("[site](https://example.com/a?b=1&c=\"2\")"),
            "<a href=\"https://example.com/a?b=1&amp;c=&quot;2&quot;\">site</a>"
        );
        assert_eq!(r("[x](javascript:alert(1))"), "x (javascript:alert(1))");
        assert_eq!(
            r("[`code`](https://e.com)"),
            "<a href=\"https://e.com\">code</a>"
        );
        assert_eq!(
            r("![alt](https://e.com/i.png)"),
            "<a href=\"https://e.com/i.png\">alt</a>"
        );
        assert_eq!(
            r("[![alt](https://e.com/i.png)](https://e.com)"),
            "<a href=\"https://e.com\">alt (https://e.com/i.png)</a>"
        );
        assert_eq!(
            r("<https://e.com>"),
            "<a href=\"https://e.com\">https://e.com</a>"
        );
    }

    #[test]
    fn quotes() {
        assert_eq!(
            r("> quoted **b**\n\nafter"),
            "<blockquote>quoted <b>b</b></blockquote>\n\nafter"
        );
        assert_eq!(r("> a\n>> b"), "<blockquote>a\n\nb</blockquote>");
        assert_eq!(
            r("> before\n> ```\n> code\n> ```\n> after"),
            "<blockquote>before</blockquote>\n\n<pre>code</pre>\n\n<blockquote>after</blockquote>"
        );
    }

    #[test]
    fn hostile_text_is_escaped() {
        assert_eq!(
            r("<script>alert('x')</script> & <b>not bold</b>"),
            "&lt;script&gt;alert('x')&lt;/script&gt; &amp; &lt;b&gt;not bold&lt;/b&gt;"
        );
        assert_eq!(
            r("<div>\nblock html\n</div>"),
            "&lt;div&gt;\nblock html\n&lt;/div&gt;"
        );
        assert_eq!(r("a &amp; b &#60; c"), "a &amp; b &lt; c");
        assert_eq!(
            r("**unbalanced *markup _here"),
            "**unbalanced *markup _here"
        );
        assert_eq!(
            r("snake_case_name and 2*3*4 ~x~"),
            "snake_case_name and 2<i>3</i>4 <s>x</s>"
        );
        assert_eq!(r("1 < 2 > 0 \"q\""), "1 &lt; 2 &gt; 0 \"q\"");
    }

    #[test]
    fn rule_and_breaks() {
        assert_eq!(r("a\n\n---\n\nb"), "a\n\n——————\n\nb");
        assert_eq!(r("line1\nline2  \nline3"), "line1\nline2\nline3");
    }

    #[test]
    fn unicode_and_empty() {
        assert_eq!(r(""), "");
        assert_eq!(r("   \n\n"), "");
        assert_eq!(r("**héllo** 😀 мир"), "<b>héllo</b> 😀 мир");
        assert_eq!(visible_len("<b>😀</b> &amp;"), 4);
    }

    #[test]
    fn visible_len_counts_text_only() {
        assert_eq!(visible_len(&r("**a** `b` [c](https://x.y)")), 5);
        assert_eq!(visible_len("&lt;&gt;&amp;&quot;"), 4);
    }
}
