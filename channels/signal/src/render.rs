//! Markdown → Signal text with style ranges.
//!
//! Signal has no markup: a message is plain text plus a list of style ranges that signal-cli
//! takes as `textStyle` entries `"start:length:STYLE"`, where `start` and `length` count UTF-16
//! code units and STYLE is `BOLD`, `ITALIC`, `STRIKETHROUGH`, `MONOSPACE` or `SPOILER`. This
//! module turns the model's Markdown into that: `**bold**`/`__bold__`, `*italic*`/`_italic_`,
//! `~~strike~~`, `` `code` `` and fenced code blocks (monospace, fences removed), `||spoiler||`,
//! headings (bold), bullets (`•`), links (`text (url)`), backslash escapes. Anything it does not
//! recognise stays as it was written. It never fails and never drops text.

use clawft_channel_core::text::{split_markdown, Measure};

/// Longest message sent, in bytes of UTF-8. Signal clients turn a body over 2,000 bytes into a
/// "long text" attachment; staying under it keeps every chunk an ordinary message.
pub const MAX_MESSAGE_BYTES: usize = 2000;
/// Markdown bytes per chunk before rendering (rendering only removes markup, but a chunk that
/// still renders too long is split again).
const SPLIT_BYTES: usize = 1900;

/// A Signal text style.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// `BOLD`.
    Bold,
    /// `ITALIC`.
    Italic,
    /// `STRIKETHROUGH`.
    Strikethrough,
    /// `MONOSPACE`.
    Monospace,
    /// `SPOILER`.
    Spoiler,
}

impl Style {
    /// signal-cli's name of the style.
    pub fn name(self) -> &'static str {
        match self {
            Style::Bold => "BOLD",
            Style::Italic => "ITALIC",
            Style::Strikethrough => "STRIKETHROUGH",
            Style::Monospace => "MONOSPACE",
            Style::Spoiler => "SPOILER",
        }
    }
}

/// A rendered message: its text and its style ranges (UTF-16 units).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rendered {
    /// The plain text.
    pub text: String,
    /// `(start, length, style)` in UTF-16 code units of `text`.
    pub styles: Vec<(usize, usize, Style)>,
}

impl Rendered {
    /// The `textStyle` parameter of signal-cli's `send`: `"start:length:STYLE"` each.
    pub fn text_style_param(&self) -> Vec<String> {
        self.styles
            .iter()
            .map(|(s, l, st)| format!("{s}:{l}:{}", st.name()))
            .collect()
    }

    fn pos(&self) -> usize {
        self.text.encode_utf16().count()
    }

    fn push(&mut self, s: &str) {
        self.text.push_str(s);
    }

    fn styled(&mut self, style: Style, f: impl FnOnce(&mut Self)) {
        let start = self.pos();
        f(self);
        let len = self.pos() - start;
        if len > 0 {
            self.styles.push((start, len, style));
        }
    }
}

/// Markdown → one rendered message (no length limit: see [`chunks`]).
pub fn render(md: &str) -> Rendered {
    let mut out = Rendered::default();
    let mut in_code = false;
    let mut code_start = 0;
    let lines: Vec<&str> = md.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            if in_code {
                let len = out.pos() - code_start;
                // The newline that ended the last code line is not part of the block.
                let len = if out.text.ends_with('\n') {
                    len.saturating_sub(1)
                } else {
                    len
                };
                if len > 0 {
                    out.styles.push((code_start, len, Style::Monospace));
                }
                in_code = false;
            } else {
                in_code = true;
                code_start = out.pos();
            }
            continue;
        }
        if in_code {
            out.push(line);
            out.push("\n");
            continue;
        }
        let heading = t.trim_start_matches('#');
        if t.starts_with('#') && heading.starts_with(' ') && t.len() - heading.len() <= 6 {
            out.styled(Style::Bold, |o| inline(heading.trim(), o));
        } else if let Some(rest) = ["- ", "* ", "+ "]
            .iter()
            .find_map(|b| t.strip_prefix(b))
            .filter(|_| !t.starts_with("**"))
        {
            let indent = &line[..line.len() - t.len()];
            out.push(indent);
            out.push("• ");
            inline(rest, &mut out);
        } else {
            inline(line, &mut out);
        }
        if i + 1 < lines.len() {
            out.push("\n");
        }
    }
    if in_code {
        // An unclosed block: style what it holds.
        let len = out.pos() - code_start;
        if out.text.ends_with('\n') {
            out.text.pop();
        }
        let len = len.min(out.pos() - code_start);
        if len > 0 {
            out.styles.push((code_start, len, Style::Monospace));
        }
    }
    while out.text.ends_with('\n') {
        out.text.pop();
    }
    let end = out.pos();
    out.styles.retain_mut(|(s, l, _)| {
        *l = (*l).min(end.saturating_sub(*s));
        *l > 0
    });
    out.styles.sort_by_key(|(s, _, _)| *s);
    out
}

/// Whether `c` can sit next to an `_` that opens or closes emphasis (not inside snake_case).
fn boundary(c: Option<char>) -> bool {
    c.is_none_or(|c| !c.is_alphanumeric())
}

/// Render the inline Markdown of `s` into `out`.
fn inline(s: &str, out: &mut Rendered) {
    let mut i = 0;
    let b = s.as_bytes();
    while i < s.len() {
        let rest = &s[i..];
        let prev = s[..i].chars().next_back();
        // Backslash escape of ASCII punctuation.
        if b[i] == b'\\' && rest.len() > 1 && b[i + 1].is_ascii_punctuation() {
            out.push(&rest[1..2]);
            i += 2;
            continue;
        }
        if let Some(after) = rest.strip_prefix('`') {
            if let Some(end) = after.find('`') {
                let code = &after[..end];
                out.styled(Style::Monospace, |o| o.push(code));
                i += end + 2;
                continue;
            }
        }
        let mut matched = false;
        for (delim, style) in [
            ("**", Style::Bold),
            ("__", Style::Bold),
            ("~~", Style::Strikethrough),
            ("||", Style::Spoiler),
        ] {
            if delim == "__" && !boundary(prev) {
                continue;
            }
            if let Some(body) = rest.strip_prefix(delim) {
                if let Some(end) = body.find(delim).filter(|e| *e > 0) {
                    let inner = &body[..end];
                    out.styled(style, |o| inline(inner, o));
                    i += end + 2 * delim.len();
                    matched = true;
                    break;
                }
            }
        }
        if matched {
            continue;
        }
        for delim in ['*', '_'] {
            if !rest.starts_with(delim) || (delim == '_' && !boundary(prev)) {
                continue;
            }
            let body = &rest[1..];
            if body.starts_with(' ') || body.is_empty() {
                continue;
            }
            let close = body.char_indices().find(|(j, c)| {
                *c == delim
                    && *j > 0
                    && !body[..*j].ends_with(' ')
                    && (delim == '*' || boundary(body[j + 1..].chars().next()))
            });
            if let Some((end, _)) = close {
                let inner = &body[..end];
                out.styled(Style::Italic, |o| inline(inner, o));
                i += end + 2;
                matched = true;
                break;
            }
        }
        if matched {
            continue;
        }
        if rest.starts_with('[') {
            if let Some(close) = rest.find("](") {
                if let Some(paren) = rest[close + 2..].find(')') {
                    let label = &rest[1..close];
                    let url = &rest[close + 2..close + 2 + paren];
                    if !label.contains('\n') && !url.contains(' ') {
                        inline(label, out);
                        if label != url {
                            out.push(" (");
                            out.push(url);
                            out.push(")");
                        }
                        i += close + 3 + paren;
                        continue;
                    }
                }
            }
        }
        let ch = rest.chars().next().unwrap_or(' ');
        let mut buf = [0u8; 4];
        out.push(ch.encode_utf8(&mut buf));
        i += ch.len_utf8();
    }
}

/// Markdown → rendered chunks of at most [`MAX_MESSAGE_BYTES`] each, in order; empty chunks
/// are left out.
pub fn chunks(md: &str) -> Vec<Rendered> {
    let mut out = Vec::new();
    chunk_into(md, SPLIT_BYTES, &mut out);
    out
}

fn chunk_into(md: &str, max: usize, out: &mut Vec<Rendered>) {
    for piece in split_markdown(md, max, Measure::Bytes) {
        let r = render(&piece);
        if r.text.len() <= MAX_MESSAGE_BYTES || max <= 64 {
            if !r.text.trim().is_empty() {
                out.push(r);
            }
        } else {
            chunk_into(&piece, max / 2, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn styles(r: &Rendered) -> Vec<String> {
        r.text_style_param()
    }

    #[test]
    fn bold_italic_code_and_strike_become_ranges_in_utf16_units() {
        let r = render("**Hi** _there_ `x = 1` and ~~no~~");
        assert_eq!(r.text, "Hi there x = 1 and no");
        assert_eq!(
            styles(&r),
            [
                "0:2:BOLD",
                "3:5:ITALIC",
                "9:5:MONOSPACE",
                "19:2:STRIKETHROUGH"
            ]
        );
        // An emoji is two UTF-16 units: the range after it counts them.
        let r = render("😀 **ok**");
        assert_eq!(r.text, "😀 ok");
        assert_eq!(styles(&r), ["3:2:BOLD"]);
    }

    #[test]
    fn code_blocks_headings_lists_and_links() {
        let r = render("# Title\n\n- one\n- [docs](https://x.y)\n\n```rust\nlet a = 1;\n```\nend");
        assert_eq!(
            r.text,
            "Title\n\n• one\n• docs (https://x.y)\n\nlet a = 1;\nend"
        );
        let code_at = r.text[..r.text.find("let").unwrap_or(0)]
            .encode_utf16()
            .count();
        assert!(styles(&r).contains(&"0:5:BOLD".to_string()));
        assert!(styles(&r).contains(&format!("{code_at}:10:MONOSPACE")));
    }

    #[test]
    fn snake_case_and_lone_stars_stay_as_written() {
        let r = render("call my_var_name now, 2 * 3 * 4");
        assert_eq!(r.text, "call my_var_name now, 2 * 3 * 4");
        assert!(r.styles.is_empty());
        let r = render(r"a \*literal\* star");
        assert_eq!(r.text, "a *literal* star");
    }

    #[test]
    fn long_text_is_split_under_the_limit_in_order() {
        let md: String = (0..40)
            .map(|i| format!("para {i:02} {}\n\n", "word ".repeat(30)))
            .collect();
        let c = chunks(&md);
        assert!(c.len() > 1);
        assert!(c.iter().all(|r| r.text.len() <= MAX_MESSAGE_BYTES));
        let all: String = c.iter().map(|r| r.text.as_str()).collect();
        let mut pos = 0;
        for i in 0..40 {
            let tag = format!("para {i:02}");
            pos += all[pos..].find(&tag).unwrap_or_else(|| panic!("{tag}"));
        }
    }
}
