//! Markdown → WhatsApp's own formatting: `*bold*`, `_italic_`, `~strike~`, `` `code` ``,
//! ```` ```mono``` ````. Headings become bold lines, links `text (url)`, fenced code blocks stay
//! fenced (WhatsApp shows them monospace). WhatsApp has no escaping: a stray marker that could
//! pair with another is left as it is (it shows literally unless it pairs).

/// Render one chunk of Markdown for WhatsApp.
pub fn render(md: &str) -> String {
    let mut out = String::with_capacity(md.len());
    let mut in_fence = false;
    for (i, line) in md.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            in_fence = !in_fence;
            // WhatsApp's monospace block: ``` without an info string.
            out.push_str("```");
            continue;
        }
        if in_fence {
            out.push_str(line);
            continue;
        }
        let hashes = t.bytes().take_while(|b| *b == b'#').count();
        if (1..=6).contains(&hashes) && t[hashes..].starts_with(' ') {
            let title = inline(t[hashes..].trim());
            let title = title.trim_matches('*');
            out.push('*');
            out.push_str(title);
            out.push('*');
            continue;
        }
        out.push_str(&inline(line));
    }
    out
}

/// Whether the delimiter run at `i..i+n` of `s` can open (followed by a non-space) or close
/// (preceded by a non-space).
fn flank(s: &[char], i: usize, n: usize) -> (bool, bool) {
    let before = i.checked_sub(1).and_then(|j| s.get(j)).copied();
    let after = s.get(i + n).copied();
    let open = after.is_some_and(|c| !c.is_whitespace());
    let close = before.is_some_and(|c| !c.is_whitespace());
    (open, close)
}

/// Find the closing run of `delim` (n chars) after `from` on this line.
fn find_close(s: &[char], from: usize, delim: char, n: usize) -> Option<usize> {
    let mut j = from;
    while j + n <= s.len() {
        if s[j] == '`' {
            // Skip a code span.
            match s[j + 1..].iter().position(|c| *c == '`') {
                Some(k) => {
                    j += k + 2;
                    continue;
                }
                None => return None,
            }
        }
        if s[j..j + n].iter().all(|c| *c == delim)
            && s.get(j + n) != Some(&delim)
            && j > from
            && flank(s, j, n).1
        {
            return Some(j);
        }
        j += 1;
    }
    None
}

/// Inline Markdown of one line → WhatsApp markers.
fn inline(line: &str) -> String {
    let s: Vec<char> = line.chars().collect();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        // Code span: verbatim.
        if c == '`' {
            if let Some(k) = s[i + 1..].iter().position(|c| *c == '`') {
                out.extend(&s[i..=i + 1 + k]);
                i += k + 2;
                continue;
            }
        }
        // Link [text](url) → text (url).
        if c == '[' {
            if let Some(close) = s[i + 1..].iter().position(|c| *c == ']') {
                let mid = i + 1 + close;
                if s.get(mid + 1) == Some(&'(') {
                    if let Some(end) = s[mid + 2..].iter().position(|c| *c == ')') {
                        let text: String = s[i + 1..mid].iter().collect();
                        let url: String = s[mid + 2..mid + 2 + end].iter().collect();
                        let text = inline(&text);
                        if text == url {
                            out.push_str(&url);
                        } else {
                            out.push_str(&format!("{text} ({url})"));
                        }
                        i = mid + 3 + end;
                        continue;
                    }
                }
            }
        }
        // Bullet `* item` at the start of a line: a dash, not a bold marker.
        if c == '*' && s.get(i + 1) == Some(&' ') && s[..i].iter().all(|c| c.is_whitespace()) {
            out.push_str("- ");
            i += 2;
            continue;
        }
        let (delim, n, to) = match c {
            '*' | '_' if s.get(i + 1) == Some(&c) => (c, 2, '*'),
            '*' | '_' => (c, 1, '_'),
            '~' if s.get(i + 1) == Some(&'~') => ('~', 2, '~'),
            _ => {
                out.push(c);
                i += 1;
                continue;
            }
        };
        // `_` inside a word (snake_case) is not emphasis.
        let word_inside = delim == '_'
            && i > 0
            && s[i - 1].is_alphanumeric()
            && s.get(i + n).is_some_and(|c| c.is_alphanumeric());
        if !word_inside && flank(&s, i, n).0 {
            if let Some(j) = find_close(&s, i + n, delim, n) {
                let inner: String = s[i + n..j].iter().collect();
                out.push(to);
                out.push_str(&inline(&inner));
                out.push(to);
                i = j + n;
                continue;
            }
        }
        out.extend(&s[i..i + n]);
        i += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::render;

    #[test]
    fn markdown_becomes_whatsapp_markers() {
        assert_eq!(
            render("**bold** and *it* and _it2_"),
            "*bold* and _it_ and _it2_"
        );
        assert_eq!(render("~~gone~~ `x*y*z`"), "~gone~ `x*y*z`");
        assert_eq!(render("# Title\ntext"), "*Title*\ntext");
        assert_eq!(
            render("see [docs](https://x.y/z)"),
            "see docs (https://x.y/z)"
        );
        assert_eq!(
            render("```rust\nlet a = **b**;\n```"),
            "```\nlet a = **b**;\n```"
        );
        assert_eq!(render("* one\n* two"), "- one\n- two");
        assert_eq!(
            render("snake_case_name and 2 * 3 * 4"),
            "snake_case_name and 2 * 3 * 4"
        );
        assert_eq!(render("**bold _in_ it**"), "*bold _in_ it*");
    }
}
