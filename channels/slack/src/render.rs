//! Markdown → Slack `mrkdwn`.
//!
//! Slack's `mrkdwn` is not Markdown: `*bold*`, `_italic_`, `~strike~`, `` `code` ``, ```` ``` ````
//! blocks without a language, `<url|text>` links, no headings, no lists (we draw `•`), and `&`,
//! `<`, `>` must be sent as `&amp;`, `&lt;`, `&gt;` everywhere (else `<!channel>`, `<@U123>` or
//! `<https://evil|innocent>` in a reply would ping or disguise a link).
//!
//! Slack has no escape character for `*`, `_`, `~` and `` ` ``. A marker the Markdown author
//! meant literally (`\*`, an unmatched `*`), that sits where Slack could take it as the start or
//! end of a span, is replaced by a look-alike (`∗`, `＿`, `∼`, `ˋ`); markers inside words and
//! between spaces (`snake_case`, `2 * 3`) are kept. Spans we emit next to a letter are padded
//! with a zero-width space so Slack still formats them (`foo**bar**` → `foo\u{200B}*bar*`).
//!
//! Pure functions; render each chunk after splitting (never split rendered text).

/// Zero-width space: lets a span start or end next to a letter.
const ZWSP: char = '\u{200B}';

/// Render Markdown as Slack `mrkdwn`.
pub fn render(md: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    // Inside a fenced block: the fence (e.g. "```" or "~~~~") that closes it.
    let mut fence: Option<String> = None;
    for raw in md.split('\n') {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let trimmed = line.trim_start();
        if let Some(open) = &fence {
            if trimmed.starts_with(open.as_str())
                && trimmed[open.len()..]
                    .trim()
                    .chars()
                    .all(|c| c == open_char(open))
            {
                out.push("```".into());
                fence = None;
            } else {
                out.push(code_text(line));
            }
            continue;
        }
        if let Some(f) = fence_of(trimmed) {
            fence = Some(f);
            out.push("```".into());
            continue;
        }
        out.push(block_line(line));
    }
    if fence.is_some() {
        out.push("```".into());
    }
    // Slack renders "```\ncode\n```"; a fence line directly against the text is fine too.
    out.join("\n").trim_end().to_string()
}

fn open_char(fence: &str) -> char {
    fence.chars().next().unwrap_or('`')
}

/// The fence opening a code block (3+ backticks or tildes), if `trimmed` is one.
fn fence_of(trimmed: &str) -> Option<String> {
    for c in ['`', '~'] {
        let n = trimmed.chars().take_while(|x| *x == c).count();
        if n >= 3 {
            let info = &trimmed[n..];
            if c == '`' && info.contains('`') {
                return None;
            }
            return Some(std::iter::repeat_n(c, n).collect());
        }
    }
    None
}

/// A line of a code block: escaped, and unable to close the block early.
fn code_text(line: &str) -> String {
    escape(line).replace("```", "ˋˋˋ")
}

/// Escape the three characters Slack requires escaped.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        push_escaped(&mut out, c);
    }
    out
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '&' => out.push_str("&amp;"),
        '<' => out.push_str("&lt;"),
        '>' => out.push_str("&gt;"),
        _ => out.push(c),
    }
}

/// One line outside code blocks: headings, rules, quotes, lists, then inline formatting.
fn block_line(line: &str) -> String {
    let trimmed = line.trim();
    if trimmed.is_empty() {
        return String::new();
    }
    let indent = line.len() - line.trim_start().len();
    // Heading: "# text" … "###### text" → bold.
    let hashes = trimmed.chars().take_while(|c| *c == '#').count();
    if (1..=6).contains(&hashes) {
        let rest = &trimmed[hashes..];
        if rest.is_empty() || rest.starts_with(' ') {
            let text = rest.trim().trim_end_matches('#').trim();
            if text.is_empty() {
                return String::new();
            }
            // No nested bold inside the bold heading.
            let inner = inline(&text.replace("**", "").replace("__", ""));
            return format!("*{inner}*");
        }
    }
    // Thematic break.
    let compact: String = trimmed.chars().filter(|c| !c.is_whitespace()).collect();
    if compact.len() >= 3
        && (compact.chars().all(|c| c == '-')
            || compact.chars().all(|c| c == '*')
            || compact.chars().all(|c| c == '_'))
    {
        return "──────────".into();
    }
    // Block quote: Slack wants a raw '>' at the start of the line.
    if let Some(rest) = trimmed.strip_prefix('>') {
        return format!("> {}", block_line(rest.trim_start()));
    }
    let pad = "    ".repeat(indent / 2);
    // Bullet list.
    for b in ["- ", "* ", "+ "] {
        if let Some(rest) = trimmed.strip_prefix(b) {
            let rest = rest.trim_start();
            // Task list boxes.
            let (boxed, rest) = if let Some(r) = rest.strip_prefix("[ ] ") {
                ("☐ ", r)
            } else if let Some(r) = rest
                .strip_prefix("[x] ")
                .or_else(|| rest.strip_prefix("[X] "))
            {
                ("☑ ", r)
            } else {
                ("", rest)
            };
            return format!("{pad}• {boxed}{}", inline(rest));
        }
    }
    // Ordered list: keep the number.
    let digits = trimmed.chars().take_while(char::is_ascii_digit).count();
    if (1..=9).contains(&digits) {
        let rest = &trimmed[digits..];
        if let Some(r) = rest.strip_prefix(". ").or_else(|| rest.strip_prefix(") ")) {
            return format!("{pad}{}. {}", &trimmed[..digits], inline(r.trim_start()));
        }
    }
    format!("{pad}{}", inline(trimmed))
}

fn is_marker(c: char) -> bool {
    matches!(c, '*' | '_' | '~' | '`')
}

fn lookalike(c: char) -> char {
    match c {
        '*' => '∗',
        '_' => '＿',
        '~' => '∼',
        '`' => 'ˋ',
        other => other,
    }
}

/// Whether a literal marker at this position could open or close a Slack span.
fn at_boundary(prev: Option<char>, next: Option<char>) -> bool {
    let opener =
        next.is_some_and(|n| !n.is_whitespace()) && !prev.is_some_and(char::is_alphanumeric);
    let closer =
        prev.is_some_and(|p| !p.is_whitespace()) && !next.is_some_and(char::is_alphanumeric);
    opener || closer
}

/// Inline formatting of one line of text.
pub fn inline(s: &str) -> String {
    let c: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len() + 8);
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        let prev = i.checked_sub(1).map(|p| c[p]);
        match ch {
            '\\' if c.get(i + 1).is_some_and(char::is_ascii_punctuation) => {
                let lit = c[i + 1];
                if is_marker(lit) {
                    out.push(lookalike(lit));
                } else {
                    push_escaped(&mut out, lit);
                }
                i += 2;
            }
            '`' => {
                let n = run(&c, i, '`');
                if let Some(end) = find_run(&c, i + n, '`', n) {
                    let inner: String = c[i + n..end].iter().collect();
                    let inner = strip_one_space(&inner);
                    if inner.trim().is_empty() {
                        push_literal_run(&mut out, &c, i, n);
                    } else {
                        open_span(&mut out);
                        out.push('`');
                        out.push_str(&escape(&inner.replace('`', "ˋ")));
                        out.push('`');
                        close_span(&mut out, c.get(end + n).copied());
                    }
                    i = end + n;
                } else {
                    push_literal_run(&mut out, &c, i, n);
                    i += n;
                }
            }
            '!' if c.get(i + 1) == Some(&'[') => {
                if let Some((text, used)) = link(&c, i + 1) {
                    out.push_str(&text);
                    i += 1 + used;
                } else {
                    out.push('!');
                    i += 1;
                }
            }
            '[' => {
                if let Some((text, used)) = link(&c, i) {
                    out.push_str(&text);
                    i += used;
                } else {
                    out.push('[');
                    i += 1;
                }
            }
            '<' => {
                if let Some(end) = c[i + 1..].iter().position(|x| *x == '>') {
                    let url: String = c[i + 1..i + 1 + end].iter().collect();
                    if safe_url(&url) {
                        out.push('<');
                        out.push_str(&escape(&url));
                        out.push('>');
                        i += end + 2;
                        continue;
                    }
                }
                out.push_str("&lt;");
                i += 1;
            }
            '*' | '_' | '~' => {
                let n = run(&c, i, ch);
                if let Some((text, used)) = emphasis(&c, i, ch, n) {
                    out.push_str(&text);
                    i += used;
                } else {
                    push_literal_run(&mut out, &c, i, n);
                    i += n;
                }
            }
            _ => {
                let _ = prev;
                push_escaped(&mut out, ch);
                i += 1;
            }
        }
    }
    out
}

fn strip_one_space(s: &str) -> String {
    if s.len() >= 2 && s.starts_with(' ') && s.ends_with(' ') {
        s[1..s.len() - 1].to_string()
    } else {
        s.to_string()
    }
}

/// Length of the run of `ch` starting at `i`.
fn run(c: &[char], i: usize, ch: char) -> usize {
    c[i..].iter().take_while(|x| **x == ch).count()
}

/// Start of the next run of exactly `n` `ch` at or after `from`.
fn find_run(c: &[char], from: usize, ch: char, n: usize) -> Option<usize> {
    let mut j = from;
    while j < c.len() {
        if c[j] == ch {
            let m = run(c, j, ch);
            if m == n {
                return Some(j);
            }
            j += m;
        } else {
            j += 1;
        }
    }
    None
}

fn push_literal_run(out: &mut String, c: &[char], i: usize, n: usize) {
    for k in i..i + n {
        let prev = k.checked_sub(1).map(|p| c[p]);
        let next = c.get(k + 1).copied();
        if is_marker(c[k]) && at_boundary(prev, next) {
            out.push(lookalike(c[k]));
        } else {
            out.push(c[k]);
        }
    }
}

fn open_span(out: &mut String) {
    if out.chars().last().is_some_and(char::is_alphanumeric) {
        out.push(ZWSP);
    }
}

fn close_span(out: &mut String, next: Option<char>) {
    if next.is_some_and(char::is_alphanumeric) {
        out.push(ZWSP);
    }
}

/// `*x*`, `**x**`, `***x***`, `_x_`, `__x__`, `~x~`, `~~x~~` starting at `i` (a run of `n`).
/// Returns the rendered span and how many input chars it used.
fn emphasis(c: &[char], i: usize, ch: char, n: usize) -> Option<(String, usize)> {
    if n > 3 || (ch == '~' && n > 2) {
        return None;
    }
    let prev = i.checked_sub(1).map(|p| c[p]);
    let after = c.get(i + n).copied()?;
    if after.is_whitespace() {
        return None;
    }
    if ch == '_' && prev.is_some_and(char::is_alphanumeric) {
        return None;
    }
    // Find a closing run of the same length, preceded by a non-space.
    let mut j = i + n;
    while j < c.len() {
        if c[j] == '`' {
            // Skip code spans: markers inside them do not close.
            let m = run(c, j, '`');
            match find_run(c, j + m, '`', m) {
                Some(e) => j = e + m,
                None => j += m,
            }
            continue;
        }
        if c[j] == ch {
            let m = run(c, j, ch);
            let before = c[j - 1];
            let next = c.get(j + m).copied();
            if m == n
                && !before.is_whitespace()
                && !(ch == '_' && next.is_some_and(char::is_alphanumeric))
            {
                let inner: String = c[i + n..j].iter().collect();
                let body = inline(&inner);
                let (open, close) = match (ch, n) {
                    ('~', _) => ("~", "~"),
                    (_, 1) => ("_", "_"),
                    (_, 2) => ("*", "*"),
                    _ => ("*_", "_*"),
                };
                let mut out = String::new();
                if prev.is_some_and(char::is_alphanumeric) {
                    out.push(ZWSP);
                }
                out.push_str(open);
                out.push_str(&body);
                out.push_str(close);
                if next.is_some_and(char::is_alphanumeric) {
                    out.push(ZWSP);
                }
                return Some((out, j + m - i));
            }
            j += m;
        } else {
            j += 1;
        }
    }
    None
}

/// A URL Slack may link: http(s)/mailto, no whitespace or characters that end the `<...>`.
fn safe_url(url: &str) -> bool {
    let lower = url.to_ascii_lowercase();
    (lower.starts_with("https://") || lower.starts_with("http://") || lower.starts_with("mailto:"))
        && url.len() > 8
        && !url
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '<' | '>' | '|'))
}

/// `[text](url)` starting at `i` (which is `[`). Returns the rendered link and chars used.
fn link(c: &[char], i: usize) -> Option<(String, usize)> {
    // Matching ']' with nesting.
    let mut depth = 0usize;
    let mut j = i;
    let close = loop {
        match c.get(j)? {
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth == 0 {
                    break j;
                }
            }
            '\\' => j += 1,
            _ => {}
        }
        j += 1;
    };
    if c.get(close + 1) != Some(&'(') {
        return None;
    }
    let mut depth = 0usize;
    let mut k = close + 1;
    let end = loop {
        match c.get(k)? {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    break k;
                }
            }
            _ => {}
        }
        k += 1;
    };
    let label: String = c[i + 1..close].iter().collect();
    let target: String = c[close + 2..end].iter().collect();
    // Drop an optional title: (url "title").
    let target = target.trim();
    let url = target
        .split_once(char::is_whitespace)
        .map_or(target, |(u, _)| u);
    let url = url
        .strip_prefix('<')
        .and_then(|u| u.strip_suffix('>'))
        .unwrap_or(url);
    let text = inline(&label);
    let rendered = if safe_url(url) && !text.contains('<') && !text.trim().is_empty() {
        format!("<{}|{}>", escape(url), text.replace('|', "¦"))
    } else if safe_url(url) {
        format!("<{}>", escape(url))
    } else if text.trim().is_empty() {
        escape(url)
    } else {
        format!("{text} ({})", escape(url))
    };
    Some((rendered, end + 1 - i))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn inline_formatting() {
        assert_eq!(render("**bold**"), "*bold*");
        assert_eq!(render("__bold__"), "*bold*");
        assert_eq!(render("*it* and _it_"), "_it_ and _it_");
        assert_eq!(render("***both***"), "*_both_*");
        assert_eq!(render("~~gone~~"), "~gone~");
        assert_eq!(render("a `x < y` b"), "a `x &lt; y` b");
        assert_eq!(
            render("**bold with _it_ inside**"),
            "*bold with _it_ inside*"
        );
    }

    #[test]
    fn intraword_spans_are_padded_and_identifiers_kept() {
        assert_eq!(render("foo**bar**baz"), "foo\u{200B}*bar*\u{200B}baz");
        assert_eq!(render("snake_case_name"), "snake_case_name");
        assert_eq!(render("2 * 3 * 4"), "2 * 3 * 4");
        assert_eq!(render("a ~ b"), "a ~ b");
    }

    #[test]
    fn links() {
        assert_eq!(
            render("see [the docs](https://example.com/a?b=1&c=2)"),
            "see <https://example.com/a?b=1&amp;c=2|the docs>"
        );
        assert_eq!(render("<https://x.org/p>"), "<https://x.org/p>");
        assert_eq!(
            render("[**bold** label](http://a.b/c \"title\")"),
            "<http://a.b/c|*bold* label>"
        );
        assert_eq!(
            render("![alt](https://i.example/p.png)"),
            "<https://i.example/p.png|alt>"
        );
        // Unsafe targets are shown, not linked.
        assert_eq!(
            render("[click](javascript:alert(1))"),
            "click (javascript:alert(1))"
        );
        assert_eq!(
            render("[x](https://a.b/|<!channel>)"),
            "x (https://a.b/|&lt;!channel&gt;)"
        );
        assert_eq!(render("[a|b](https://a.b/x)"), "<https://a.b/x|a¦b>");
        assert_eq!(render("[not a link] (x)"), "[not a link] (x)");
    }

    #[test]
    fn blocks() {
        let md = "# Title\n\nSome *text*.\n\n## Sub **x**\n- one\n- two\n  - nested\n* star\n1. first\n2) second\n- [ ] todo\n- [x] done\n> quoted **b**\n\n---\nend";
        let want = "*Title*\n\nSome _text_.\n\n*Sub x*\n• one\n• two\n    • nested\n• star\n1. first\n2. second\n• ☐ todo\n• ☑ done\n> quoted *b*\n\n──────────\nend";
        assert_eq!(render(md), want);
    }

    #[test]
    fn code_blocks_are_escaped_and_unformatted() {
        let md = "before\n```rust\nlet a = b && c < d; // **not bold**\n```\nafter";
        assert_eq!(
            render(md),
            "before\n```\nlet a = b &amp;&amp; c &lt; d; // **not bold**\n```\nafter"
        );
        // Unclosed fence is closed; a fence inside cannot end the block early.
        assert_eq!(render("~~~\nx ``` y"), "```\nx ˋˋˋ y\n```");
        assert_eq!(render("````\n```\n````"), "```\nˋˋˋ\n```");
    }

    #[test]
    fn hostile_text_is_escaped() {
        assert_eq!(
            render("<script>alert('x')</script> & <!channel> <@U123> <!here|here>"),
            "&lt;script&gt;alert('x')&lt;/script&gt; &amp; &lt;!channel&gt; &lt;@U123&gt; &lt;!here|here&gt;"
        );
        assert_eq!(render("&amp;"), "&amp;amp;");
        // Already-escaped-looking text stays literal.
        assert_eq!(render("&lt;b&gt;"), "&amp;lt;b&amp;gt;");
    }

    #[test]
    fn unbalanced_and_escaped_markers_cannot_format() {
        // Escaped markers that Slack would otherwise pair become look-alikes.
        assert_eq!(render(r"\*not bold\*"), "∗not bold∗");
        assert_eq!(render(r"\_x\_ \~y\~ \`z\`"), "＿x＿ ∼y∼ ˋzˋ");
        // Unmatched opener at a word start.
        assert_eq!(render("*args and **kwargs"), "∗args and ∗∗kwargs");
        assert_eq!(render("`unclosed code"), "ˋunclosed code");
        assert_eq!(render("** x **"), "∗∗ x ∗∗");
        // No rendered output pairs markers Slack could misread: every * _ ~ ` left is ours.
        for hostile in ["*a_b~c`", "_*~`", "~~~~", "**", "*_*_", "a*b*c_d_e"] {
            let r = render(hostile);
            assert!(!r.contains('<') && !r.contains('>'), "{hostile} -> {r}");
        }
    }

    #[test]
    fn unicode_and_empty() {
        assert_eq!(render(""), "");
        assert_eq!(render("**héllo 😀**"), "*héllo 😀*");
        // An intraword marker stays; one at a word edge becomes a look-alike.
        assert_eq!(render("日本語の_テキスト_"), "日本語の_テキスト＿");
        assert_eq!(render("line one\r\nline two  "), "line one\nline two");
    }
}
