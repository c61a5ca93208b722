//! Splitting long Markdown replies into chunks a platform accepts (Telegram 4096 UTF-16 units,
//! Discord 2000 characters, Slack 40,000 characters of text / 3,000 per section block).
//!
//! Chunks break at the best boundary available: a blank line (paragraph), else a line break,
//! else a space, else a character boundary; never inside a UTF-8 character. A fenced code
//! block cut in two is closed at the end of one chunk and reopened, with its info string, at
//! the start of the next, so every chunk renders on its own. Render each chunk for the
//! platform after splitting (so no HTML entity or tag is ever cut), leaving headroom in `max`
//! for what rendering adds.

/// How a platform counts message length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    /// UTF-8 bytes.
    Bytes,
    /// Unicode scalar values (Discord, Slack).
    Chars,
    /// UTF-16 code units (Telegram).
    Utf16,
}

impl Measure {
    /// Length of `s` in this unit.
    pub fn len(self, s: &str) -> usize {
        match self {
            Measure::Bytes => s.len(),
            Measure::Chars => s.chars().count(),
            Measure::Utf16 => s.encode_utf16().count(),
        }
    }

    /// Byte index of the longest prefix of `s` measuring at most `max`.
    fn prefix(self, s: &str, max: usize) -> usize {
        let mut used = 0;
        for (i, c) in s.char_indices() {
            let w = match self {
                Measure::Bytes => c.len_utf8(),
                Measure::Chars => 1,
                Measure::Utf16 => c.len_utf16(),
            };
            if used + w > max {
                return i;
            }
            used += w;
        }
        s.len()
    }
}

/// The fence line opening a code block, if `line` opens or closes one.
fn fence(line: &str) -> Option<&str> {
    let t = line.trim_start();
    (t.starts_with("```") || t.starts_with("~~~")).then_some(t.trim_end())
}

/// Split `text` into chunks each measuring at most `max` (which must leave room for a fence
/// line: at least 16 units).
pub fn split_markdown(text: &str, max: usize, m: Measure) -> Vec<String> {
    let max = max.max(16);
    if m.len(text) <= max {
        return if text.is_empty() {
            Vec::new()
        } else {
            vec![text.to_string()]
        };
    }
    let mut chunks = Vec::new();
    let mut rest = text;
    // The fence a chunk starts inside of (to reopen), e.g. "```rust".
    let mut open: Option<String> = None;
    while !rest.is_empty() {
        let prefix = open.as_ref().map(|f| format!("{f}\n")).unwrap_or_default();
        // Room for the reopened fence and a closing "\n```".
        let room = max.saturating_sub(m.len(&prefix) + 4).max(1);
        if m.len(rest) <= room {
            chunks.push(format!("{prefix}{rest}"));
            break;
        }
        let hard = m
            .prefix(rest, room)
            .max(rest.chars().next().map_or(1, char::len_utf8));
        let window = &rest[..hard];
        let cut = window
            .rfind("\n\n")
            .map(|i| i + 2)
            .or_else(|| window.rfind('\n').map(|i| i + 1))
            .or_else(|| window.rfind(' ').map(|i| i + 1))
            .filter(|i| *i > 0)
            .unwrap_or(hard);
        let piece = &rest[..cut];
        // Track fences inside this piece to know whether we end inside a code block.
        let mut state = open.clone();
        for line in piece.lines() {
            if let Some(f) = fence(line) {
                state = match state {
                    Some(_) => None,
                    None => Some(f.to_string()),
                };
            }
        }
        let mut chunk = format!("{prefix}{}", piece.trim_end_matches('\n'));
        if state.is_some() {
            chunk.push_str("\n```");
        }
        if !chunk.trim().is_empty() {
            chunks.push(chunk);
        }
        open = state;
        rest = &rest[cut..];
        if open.is_none() {
            rest = rest.trim_start_matches('\n');
        }
    }
    chunks
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn short_text_is_one_chunk() {
        assert_eq!(split_markdown("hi", 100, Measure::Chars), ["hi"]);
        assert!(split_markdown("", 100, Measure::Chars).is_empty());
    }

    #[test]
    fn prefers_paragraphs_then_lines_then_spaces() {
        let text = format!("{}\n\n{}", "a".repeat(30), "b".repeat(30));
        assert_eq!(
            split_markdown(&text, 40, Measure::Chars),
            ["a".repeat(30), "b".repeat(30)]
        );
        let text = format!("{}\n{}", "a".repeat(30), "b".repeat(30));
        assert_eq!(
            split_markdown(&text, 40, Measure::Chars),
            ["a".repeat(30), "b".repeat(30)]
        );
        let words = "word ".repeat(40);
        for c in split_markdown(&words, 32, Measure::Chars) {
            assert!(c.chars().count() <= 32);
            assert!(!c.starts_with(' ') && c.split(' ').all(|w| w.is_empty() || w == "word"));
        }
    }

    #[test]
    fn never_cuts_a_character_and_respects_the_unit() {
        let text = "😀é✓".repeat(500);
        for m in [Measure::Bytes, Measure::Chars, Measure::Utf16] {
            let chunks = split_markdown(&text, 100, m);
            assert!(chunks.iter().all(|c| m.len(c) <= 100), "{m:?}");
            assert_eq!(chunks.concat(), text, "{m:?}");
        }
    }

    #[test]
    fn code_fences_are_closed_and_reopened() {
        let code: String = (0..60).map(|i| format!("let x{i} = {i};\n")).collect();
        let text = format!("Here:\n\n```rust\n{code}```\n\nDone.");
        let chunks = split_markdown(&text, 200, Measure::Chars);
        assert!(chunks.len() > 3);
        for c in &chunks {
            assert!(c.chars().count() <= 200, "{c}");
            let fences = c.lines().filter(|l| l.starts_with("```")).count();
            assert_eq!(fences % 2, 0, "unbalanced fences in:\n{c}");
        }
        assert!(chunks[1].starts_with("```rust\n"));
        // Every line of code survives, in order.
        let joined = chunks.join("\n");
        let mut pos = 0;
        for i in 0..60 {
            let l = format!("let x{i} = {i};");
            pos += joined[pos..].find(&l).unwrap();
        }
        assert!(chunks.last().unwrap().ends_with("Done."));
    }
}
