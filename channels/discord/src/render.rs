//! Markdown (as the model writes it) to Discord Markdown.
//!
//! Discord understands most of CommonMark's inline syntax (`**bold**`, `*italic*`, `` `code` ``,
//! fenced blocks, `> quotes`, `#`/`##`/`###` headings, `[masked](links)`, lists), and shows HTML
//! as plain text, so most text passes through unchanged: `<script>` and `&` need no escaping.
//! What differs, and is rewritten outside code spans and blocks:
//!
//! - mass and user/role/channel mentions (`@everyone`, `@here`, `<@id>`, `<@&id>`, `<#id>`) are
//!   defused so they neither ping (every message is also sent with `allowed_mentions.parse =
//!   []`) nor render as mentions;
//! - `||` (Discord spoilers, e.g. shell `a || b`) is escaped;
//! - `__x__` (bold in Markdown, underline on Discord) becomes `**x**`;
//! - `####`..`######` headings (unsupported) become bold lines, a leading `-# ` (Discord
//!   subtext) and `>>> ` (Discord's quote-everything-after) are escaped, horizontal rules become
//!   a line of box-drawing characters, and images `![alt](url)` become links.
//!
//! Rendering can at most double a text's length (`||` → `\|\|`), which [`render_chunks`] uses
//! to stay under the limit.

use clawft_channel_core::text::{split_markdown, Measure};

/// Discord's message length limit, in characters.
pub const LIMIT: usize = 2000;
/// Chunk size before rendering (headroom for what rendering adds).
const SPLIT_AT: usize = 1900;

/// Render Markdown `md` for Discord (no length limit applied).
pub fn render(md: &str) -> String {
    let mut out = String::with_capacity(md.len() + 16);
    let mut fence: Option<(char, usize)> = None;
    for (i, line) in md.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        if let Some((ch, n)) = fence {
            out.push_str(line);
            if closes_fence(line, ch, n) {
                fence = None;
            }
            continue;
        }
        if let Some(f) = opens_fence(line) {
            fence = Some(f);
            out.push_str(line);
            continue;
        }
        render_line(line, &mut out);
    }
    out
}

/// Split `md` under Discord's limit and render every chunk; each result has at most
/// [`LIMIT`] characters and balanced code fences.
pub fn render_chunks(md: &str) -> Vec<String> {
    let mut out = Vec::new();
    for chunk in split_markdown(md, SPLIT_AT, Measure::Chars) {
        let r = render(&chunk);
        if Measure::Chars.len(&r) <= LIMIT {
            out.push(r);
            continue;
        }
        // Rendering at most doubles the length: half the limit always fits.
        for small in split_markdown(&chunk, LIMIT / 2 - 8, Measure::Chars) {
            let r = render(&small);
            if Measure::Chars.len(&r) <= LIMIT {
                out.push(r);
            } else {
                out.push(r.chars().take(LIMIT).collect());
            }
        }
    }
    out
}

/// `(fence char, run length)` when `line` opens a fenced code block.
fn opens_fence(line: &str) -> Option<(char, usize)> {
    let t = line.trim_start();
    let ch = t.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let n = t.chars().take_while(|c| *c == ch).count();
    (n >= 3).then_some((ch, n))
}

fn closes_fence(line: &str, ch: char, n: usize) -> bool {
    let t = line.trim();
    t.chars().take_while(|c| *c == ch).count() >= n && t.chars().all(|c| c == ch)
}

fn is_rule(line: &str) -> bool {
    let t: String = line.chars().filter(|c| !c.is_whitespace()).collect();
    t.chars().count() >= 3 && ['-', '*', '_'].iter().any(|r| t.chars().all(|c| c == *r))
}

fn render_line(line: &str, out: &mut String) {
    if is_rule(line) {
        out.push_str("──────────");
        return;
    }
    let indent_len = line.len() - line.trim_start().len();
    let (indent, body) = line.split_at(indent_len);
    // Headings Discord does not support become bold lines.
    let hashes = body.chars().take_while(|c| *c == '#').count();
    if (4..=6).contains(&hashes) && body[hashes..].starts_with(' ') {
        let text = body[hashes..].trim();
        out.push_str(indent);
        out.push_str("**");
        render_inline(text, out);
        out.push_str("**");
        return;
    }
    out.push_str(indent);
    let body = if let Some(rest) = body.strip_prefix("-# ") {
        out.push_str("\\-# ");
        rest
    } else if let Some(rest) = body.strip_prefix(">>> ") {
        out.push_str("> ");
        rest
    } else {
        body
    };
    render_inline(body, out);
}

/// Inline text: code spans verbatim, everything else escaped.
fn render_inline(s: &str, out: &mut String) {
    let mut rest = s;
    while let Some(start) = rest.find('`') {
        let run = rest[start..].chars().take_while(|c| *c == '`').count();
        let ticks = &rest[start..start + run];
        let after = &rest[start + run..];
        // The closing run must have exactly the same length.
        let close = find_run(after, run);
        match close {
            Some(end) => {
                escape_text(&rest[..start], out);
                out.push_str(ticks);
                out.push_str(&after[..end + run]);
                rest = &after[end + run..];
            }
            None => {
                // Unbalanced backticks: literal, escaped so they cannot pair across chunks.
                escape_text(&rest[..start], out);
                for _ in 0..run {
                    out.push_str("\\`");
                }
                rest = after;
            }
        }
    }
    escape_text(rest, out);
}

/// Byte offset of the next run of exactly `n` backticks in `s`.
fn find_run(s: &str, n: usize) -> Option<usize> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'`' {
            let len = b[i..].iter().take_while(|c| **c == b'`').count();
            if len == n {
                return Some(i);
            }
            i += len;
        } else {
            i += 1;
        }
    }
    None
}

/// Plain text outside code: defuse mentions and spoilers, map `__x__` and images.
fn escape_text(s: &str, out: &mut String) {
    let mut i = 0;
    // Whether a `__` we meet opens a pair (a later `__` exists) or closes one.
    let mut in_under = false;
    while i < s.len() {
        let r = &s[i..];
        if r.starts_with("@everyone") || r.starts_with("@here") {
            out.push_str("@\u{200B}");
            i += 1;
        } else if r.starts_with("<@") || r.starts_with("<#") {
            out.push_str("\\<");
            i += 1;
        } else if r.starts_with("||") {
            out.push_str("\\|\\|");
            i += 2;
        } else if r.starts_with("![") {
            i += 1;
        } else if let Some(after) = r.strip_prefix("__") {
            if in_under || after.contains("__") {
                out.push_str("**");
                in_under = !in_under;
            } else {
                out.push_str("__");
            }
            i += 2;
        } else {
            let Some(c) = r.chars().next() else { break };
            out.push(c);
            i += c.len_utf8();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn common_markdown_passes_through() {
        let md = "# Title\n## Sub\n### Small\n\n**bold** *italic* _also_ ~~strike~~ `code`\n\
                  - item\n* item\n1. first\n> quote\n[docs](https://example.com/a_b?x=1&y=2)";
        assert_eq!(render(md), md);
    }

    #[test]
    fn fenced_code_is_verbatim() {
        let md = "```rust\nlet x = a || b; // @everyone <@1> __init__\n```\nafter @here";
        assert_eq!(
            render(md),
            "```rust\nlet x = a || b; // @everyone <@1> __init__\n```\nafter @\u{200B}here"
        );
        // Tilde fences and longer backtick fences too.
        let md = "~~~\n||x||\n~~~\n````\n```\n<@&5>\n````";
        assert_eq!(render(md), md);
    }

    #[test]
    fn inline_code_is_verbatim_and_unbalanced_ticks_are_escaped() {
        assert_eq!(render("`a || b` and ``x ` y``"), "`a || b` and ``x ` y``");
        assert_eq!(render("run `ls -la"), "run \\`ls -la");
    }

    #[test]
    fn mentions_never_ping_or_render() {
        assert_eq!(
            render("hey @everyone and @here, <@123> <@!456> <@&789> <#42>"),
            "hey @\u{200B}everyone and @\u{200B}here, \\<@123> \\<@!456> \\<@&789> \\<#42>"
        );
        // Plain @names and e-mail addresses are left alone.
        assert_eq!(render("mail a@b.c @bob"), "mail a@b.c @bob");
    }

    #[test]
    fn discord_only_syntax_is_neutralised() {
        assert_eq!(render("a || b"), "a \\|\\| b");
        assert_eq!(render("||spoiler||"), "\\|\\|spoiler\\|\\|");
        assert_eq!(render("-# tiny"), "\\-# tiny");
        assert_eq!(render(">>> all of it\nnext"), "> all of it\nnext");
        assert_eq!(
            render("__strong__ and snake__case"),
            "**strong** and snake__case"
        );
        assert_eq!(render("#### Deep\n###### Deeper"), "**Deep**\n**Deeper**");
        assert_eq!(
            render("---\n***\n_ _ _"),
            "──────────\n──────────\n──────────"
        );
        assert_eq!(
            render("![logo](https://x/y.png)"),
            "[logo](https://x/y.png)"
        );
    }

    #[test]
    fn hostile_text_is_kept_literal() {
        // Discord shows HTML as text: no entity escaping (it would show `&amp;`).
        let md = "<script>alert('x')</script> & &amp; <b>b</b> *_~ **unclosed _x ~~y";
        assert_eq!(render(md), md);
        assert_eq!(render(""), "");
        assert_eq!(render("ünï 😀 @everyone"), "ünï 😀 @\u{200B}everyone");
    }

    #[test]
    fn chunks_respect_the_limit_even_when_rendering_grows_text() {
        let md = "||".repeat(3000);
        let chunks = render_chunks(&md);
        assert!(chunks.len() >= 3);
        for c in &chunks {
            assert!(c.chars().count() <= LIMIT, "{}", c.chars().count());
        }
        let total: usize = chunks.iter().map(|c| c.matches("\\|").count()).sum();
        assert_eq!(total, 6000);
    }

    #[test]
    fn long_code_block_chunks_are_balanced() {
        let code: String = (0..300).map(|i| format!("println!(\"{i}\");\n")).collect();
        let md = format!("Intro\n\n```rust\n{code}```\n\nDone @everyone");
        let chunks = render_chunks(&md);
        assert!(chunks.len() >= 3, "{}", chunks.len());
        for c in &chunks {
            assert!(c.chars().count() <= LIMIT);
            assert_eq!(c.lines().filter(|l| l.starts_with("```")).count() % 2, 0);
        }
        assert!(chunks[1].starts_with("```rust\n"));
        assert!(chunks.last().unwrap().ends_with("Done @\u{200B}everyone"));
    }
}
