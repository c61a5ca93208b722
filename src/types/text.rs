//! Text sanitising shared by every path that lets outside text in: [`sanitize_content`] for
//! what users send, [`sanitize_output`] for what tools return.

use std::borrow::Cow;

/// Strip NUL, DEL and ASCII control characters except `\n`, `\r`, `\t` (seed 002).
pub fn sanitize_content(s: &str) -> String {
    s.chars()
        .filter(|&c| matches!(c, '\n' | '\r' | '\t') || !(c.is_ascii_control()))
        .collect()
}

/// Tool output made safe to show to the model, to store and to send to a chat (the registry
/// applies it to every string of every result, MCP tools included, before scrubbing):
///
/// - terminal escape sequences are removed: CSI (`ESC [` … colours, cursor moves, erase),
///   OSC (`ESC ]` … titles, OSC 8 hyperlinks, OSC 52 clipboard writes), DCS/SOS/PM/APC strings
///   (terminated by BEL, `ESC \` or U+009C) and the two-character escapes (`ESC 7`, `ESC M`,
///   `ESC ( B`…). A sequence that never ends shows its ESC as `␛` and keeps the rest as text, so
///   an unterminated string cannot hide what follows it;
/// - `\r\n` becomes `\n` and a lone `\r` becomes `\n`, so carriage-return overwrites show every
///   line that was overwritten; U+2028/U+2029 become `\n` too;
/// - every other C0 control but `\n` and `\t`, and DEL, becomes its visible control picture
///   (BEL → `␇`, NUL → `␀`, BS → `␈`, DEL → `␡`); C1 controls (U+0080–U+009F) become `[U+009B]`;
/// - bidirectional embeddings, overrides and isolates (U+202A–U+202E, U+2066–U+2069) become
///   `[U+202E]`: text that reads one way and displays another ("Trojan Source") shows its
///   tricks;
/// - Unicode tag characters (U+E0000–U+E007F, invisible "ASCII smuggling") and invisible
///   characters with no place in tool output (U+200B zero-width space, U+2060–U+2064 word
///   joiner and invisible operators, U+FEFF, U+180E, U+00AD soft hyphen, U+FFF9–U+FFFB
///   annotation marks) are removed, so the model reads what a human sees. Zero-width joiner and
///   non-joiner (U+200C, U+200D: emoji sequences, Persian and Indic scripts), LRM/RLM/ALM and
///   variation selectors are kept.
///
/// Borrowed when nothing needed changing (the common case: one byte scan).
pub fn sanitize_output(s: &str) -> Cow<'_, str> {
    let Some(first) = first_special_byte(s.as_bytes()) else {
        return Cow::Borrowed(s);
    };
    // The position is a character boundary: an ASCII byte or a lead byte.
    let rest = &s[first..];
    if !rest.chars().any(needs_change) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    out.push_str(&s[..first]);
    // Past this offset of `s` no string terminator (BEL, ESC \, U+009C) was found: an escape
    // string starting there is unterminated without searching again (no quadratic time).
    let mut no_terminator_from = usize::MAX;
    let mut i = first;
    loop {
        // Ordinary text up to the next byte that may need a change, copied in one go.
        let Some(k) = first_special_byte(&s.as_bytes()[i..]) else {
            out.push_str(&s[i..]);
            break;
        };
        out.push_str(&s[i..i + k]);
        i += k;
        let Some(c) = s[i..].chars().next() else {
            break;
        };
        let next = i + c.len_utf8();
        match c {
            '\u{1b}' => match escape_len(s, next, &mut no_terminator_from) {
                Some(end) => {
                    i = end;
                    continue;
                }
                None => out.push('\u{241b}'),
            },
            '\r' => {
                if !s[next..].starts_with('\n') {
                    out.push('\n');
                }
            }
            '\n' | '\t' => out.push(c),
            '\u{0}'..='\u{1f}' => out.push(char::from_u32(0x2400 + c as u32).unwrap_or('\u{fffd}')),
            '\u{7f}' => out.push('\u{2421}'),
            '\u{2028}' | '\u{2029}' => out.push('\n'),
            '\u{80}'..='\u{9f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => {
                out.push_str(&format!("[U+{:04X}]", c as u32));
            }
            c if is_removed(c) => {}
            c => out.push(c),
        }
        i = next;
    }
    Cow::Owned(out)
}

/// The first byte that can start something [`sanitize_output`] changes: a C0 control but `\n`
/// and `\t`, DEL, or the lead byte of U+0080–U+00BF (0xC2), U+1800–U+1FFF (0xE1),
/// U+2000–U+2FFF (0xE2), U+F000–U+FFFF (0xEF) or U+C0000–U+FFFFF (0xF3). Printable ASCII is
/// skipped eight bytes at a time (this runs on every tool result).
fn first_special_byte(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let special = |b: u8| {
        (b < 0x20 && b != b'\n' && b != b'\t')
            || matches!(b, 0x7f | 0xc2 | 0xe1 | 0xe2 | 0xef | 0xf3)
    };
    let chunks = bytes.chunks_exact(8);
    let tail = chunks.remainder();
    for (n, chunk) in chunks.enumerate() {
        let Ok(w) = <[u8; 8]>::try_from(chunk) else {
            continue;
        };
        let w = u64::from_le_bytes(w);
        // Some byte below 0x20, or at or above 0x7F (never a miss; a false alarm only costs
        // the byte-wise look at this chunk).
        let low = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
        let high = (w.wrapping_add(ONES) | w) & HIGH;
        if low | high != 0 {
            if let Some(i) = chunk.iter().position(|&b| special(b)) {
                return Some(n * 8 + i);
            }
        }
    }
    let base = bytes.len() - tail.len();
    tail.iter().position(|&b| special(b)).map(|i| base + i)
}

/// Invisible characters [`sanitize_output`] removes.
fn is_removed(c: char) -> bool {
    matches!(c,
        '\u{e0000}'..='\u{e007f}'
        | '\u{200b}'
        | '\u{2060}'..='\u{2064}'
        | '\u{feff}'
        | '\u{180e}'
        | '\u{ad}'
        | '\u{fff9}'..='\u{fffb}')
}

/// Whether [`sanitize_output`] changes `c`.
fn needs_change(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{8}' | '\u{b}'..='\u{1f}' | '\u{7f}'..='\u{9f}'
        | '\u{2028}' | '\u{2029}'
        | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        || is_removed(c)
}

/// The end (byte offset in `s`) of the escape sequence whose ESC ends at `at`, or `None` when
/// what follows the ESC is not a complete sequence.
fn escape_len(s: &str, at: usize, no_terminator_from: &mut usize) -> Option<usize> {
    let b = s.as_bytes();
    match b.get(at)? {
        // CSI: parameter bytes, intermediate bytes, one final byte.
        b'[' => {
            let mut j = at + 1;
            while b.get(j).is_some_and(|x| (0x30..=0x3f).contains(x)) {
                j += 1;
            }
            while b.get(j).is_some_and(|x| (0x20..=0x2f).contains(x)) {
                j += 1;
            }
            b.get(j)
                .filter(|x| (0x40..=0x7e).contains(*x))
                .map(|_| j + 1)
        }
        // OSC, DCS, SOS, PM, APC: a string up to BEL, ST (ESC \) or the 8-bit ST (U+009C).
        b']' | b'P' | b'X' | b'^' | b'_' => {
            let from = at + 1;
            if from >= *no_terminator_from {
                return None;
            }
            let body = &b[from..];
            let mut k = 0;
            while k < body.len() {
                match body[k] {
                    0x07 => return Some(from + k + 1),
                    0x1b if body.get(k + 1) == Some(&b'\\') => return Some(from + k + 2),
                    0xc2 if body.get(k + 1) == Some(&0x9c) => return Some(from + k + 2),
                    _ => k += 1,
                }
            }
            *no_terminator_from = from;
            None
        }
        // nF escapes: intermediates then a final byte (`ESC ( B`, `ESC # 8`).
        0x20..=0x2f => {
            let mut j = at;
            while b.get(j).is_some_and(|x| (0x20..=0x2f).contains(x)) {
                j += 1;
            }
            b.get(j)
                .filter(|x| (0x30..=0x7e).contains(*x))
                .map(|_| j + 1)
        }
        // Fp, Fe, Fs: one byte (`ESC 7`, `ESC M`, `ESC c`, `ESC =`).
        0x30..=0x7e => Some(at + 1),
        _ => None,
    }
}

/// `e` and its sources, `: `-separated, each message once (reqwest's and rmcp's own messages
/// are often bare, e.g. "error sending request").
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_keeps_whitespace_and_unicode() {
        assert_eq!(
            sanitize_content("a\0b\x7fc\x1b[31m\n\r\tdé✓"),
            "abc[31m\n\r\tdé✓"
        );
    }

    #[test]
    fn output_escapes_are_stripped_and_controls_shown() {
        for (input, expect) in [
            // Colours and cursor moves.
            (
                "\u{1b}[1;31mred\u{1b}[0m \u{1b}[2K\u{1b}[1Agone",
                "red gone",
            ),
            // OSC 8 hyperlink: the hidden URL goes, the text stays.
            (
                "\u{1b}]8;;https://evil.example/\u{1b}\\click\u{1b}]8;;\u{1b}\\",
                "click",
            ),
            // OSC 52 clipboard write (BEL-terminated) and a title set.
            ("a\u{1b}]52;c;cm0gLXJmIC8=\u{7}b\u{1b}]0;title\u{7}c", "abc"),
            // DCS and 8-bit ST.
            ("x\u{1b}Pq#0;2;0;0;0\u{9c}y", "xy"),
            // Two-character escapes (save cursor, reverse index, charset).
            ("\u{1b}7a\u{1b}Mb\u{1b}(Bc", "abc"),
            // Carriage-return overwrite: every line shows.
            (
                "safe output\rrm -rf ~     \r\nnext",
                "safe output\nrm -rf ~     \nnext",
            ),
            // BEL, BS, NUL, DEL, a lone ESC.
            (
                "ding\u{7} x\u{8}y \u{0} \u{7f} end\u{1b}",
                "ding\u{2407} x\u{2408}y \u{2400} \u{2421} end\u{241b}",
            ),
            // An unterminated OSC cannot hide what follows.
            ("a\u{1b}]0;never ends", "a\u{241b}]0;never ends"),
            // Tag characters removed; bidi overrides and C1 controls shown.
            (
                "hi\u{e0049}\u{e0067}\u{e006e}\u{e006f}\u{e0072}\u{e0065}!",
                "hi!",
            ),
            (
                "abc\u{202e}fed\u{202c} \u{2066}x\u{2069}",
                "abc[U+202E]fed[U+202C] [U+2066]x[U+2069]",
            ),
            ("a\u{9b}31mb\u{85}c", "a[U+009B]31mb[U+0085]c"),
            // Invisible characters removed; joiners kept.
            ("s\u{200b}k\u{feff}-\u{ad}1\u{2060}", "sk-1"),
            (
                "\u{1f468}\u{200d}\u{1f469} \u{200c}",
                "\u{1f468}\u{200d}\u{1f469} \u{200c}",
            ),
            ("line\u{2028}break", "line\nbreak"),
        ] {
            assert_eq!(sanitize_output(input), expect, "{input:?}");
        }
    }

    #[test]
    fn the_fast_scan_finds_every_special_byte_at_every_position() {
        for special in [
            "\u{7}",
            "\u{1b}",
            "\u{7f}",
            "\u{85}",
            "\u{202e}",
            "\u{e0041}",
            "\r",
        ] {
            for at in 0..20 {
                let s = format!("{}{special}{}", "a".repeat(at), "b\n\tc".repeat(3));
                assert_eq!(
                    first_special_byte(s.as_bytes()),
                    Some(at),
                    "{special:?} at {at}"
                );
                assert!(matches!(sanitize_output(&s), Cow::Owned(_)), "{s:?}");
            }
        }
        for at in 0..20 {
            let s = format!("{}\n\t~ é {}", "x".repeat(at), "y".repeat(at));
            assert_eq!(first_special_byte(s.as_bytes()), None, "{s:?}");
        }
    }

    #[test]
    fn random_text_comes_out_with_nothing_left_to_change() {
        let alphabet: Vec<char> = "ab \n\t\r\u{1b}[]\\;P_^X(7M\u{7}\u{0}\u{7f}\u{9c}\u{9b}é—\u{200b}\u{200d}\u{202e}\u{2066}\u{2028}\u{e0041}\u{feff}\u{ad}"
            .chars()
            .collect();
        let mut rng = fastrand::Rng::with_seed(14);
        for _ in 0..5000 {
            let len = rng.usize(0..40);
            let s: String = (0..len)
                .map(|_| alphabet[rng.usize(..alphabet.len())])
                .collect();
            let out = sanitize_output(&s);
            assert!(!out.chars().any(needs_change), "{s:?} -> {out:?}");
            // Idempotent: sanitised text is left as it is.
            assert!(
                matches!(sanitize_output(&out), Cow::Borrowed(_)),
                "{s:?} -> {out:?}"
            );
        }
    }

    #[test]
    fn clean_output_is_borrowed() {
        for s in ["plain ascii\n\tindent", "héllo — “quoted” ✓ 日本語", ""] {
            assert!(matches!(sanitize_output(s), Cow::Borrowed(_)), "{s}");
        }
    }

    #[test]
    fn many_unterminated_strings_take_linear_time() {
        let s = "\u{1b}]".repeat(200_000);
        let t = std::time::Instant::now();
        let out = sanitize_output(&s);
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
        assert_eq!(out.matches('\u{241b}').count(), 200_000);
    }
}
