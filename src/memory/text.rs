//! Text analysis for memory search: terms and chunks.
//!
//! The same analyser runs over the indexed chunks and over the query, so every folding here
//! (case, accents, stemming, stop words) is symmetric. It keeps no state and allocates only
//! the terms it returns; it must not depend on the index (layer 4 leaf).

use std::ops::Range;

use rust_stemmers::{Algorithm, Stemmer};
use unicode_normalization::char::{decompose_compatible, is_combining_mark};

/// Longest indexed term in bytes: longer "words" are hashes, base64 or URLs run together,
/// which nobody types as a query and which would bloat the dictionary.
const MAX_TERM_BYTES: usize = 64;

/// Most bytes in one chunk (~1,000): a hit shows the model a passage it can quote without
/// reading the whole file, and BM25 length normalisation stays meaningful.
const CHUNK_MAX_BYTES: usize = 1000;

/// Most lines in one chunk (40), for documents of many short lines (lists, logs).
const CHUNK_MAX_LINES: u32 = 40;

/// English stop words dropped from both documents and queries: Lucene's classic English set
/// without "no" and "not" (negation matters in notes: "not allergic"), plus the "s" and "t"
/// that splitting at apostrophes leaves ("user's", "don't"). Sorted for the binary search.
const STOP_WORDS: [&str; 33] = [
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it",
    "of", "on", "or", "s", "such", "t", "that", "the", "their", "then", "there", "these", "they",
    "this", "to", "was", "will", "with",
];

/// CJK ideographs, kana and hangul: scripts written without spaces, indexed one character
/// per term (a query "東京" is then the phrase 東 京). Kept out of the accent folding: NFKD
/// would split a hangul syllable into jamo and strip the voicing mark of ガ.
fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x1100..=0x11FF        // hangul jamo
        | 0x3040..=0x30FF      // hiragana, katakana
        | 0x3130..=0x318F      // hangul compatibility jamo
        | 0x31F0..=0x31FF      // katakana phonetic extensions
        | 0x3400..=0x4DBF      // CJK extension A
        | 0x4E00..=0x9FFF      // CJK unified ideographs
        | 0xA960..=0xA97F      // hangul jamo extended-A
        | 0xAC00..=0xD7FF      // hangul syllables, jamo extended-B
        | 0xF900..=0xFAFF      // CJK compatibility ideographs
        | 0x20000..=0x3134F // CJK extensions B to G
    )
}

/// The folded words of `text` in order, unstemmed, stop words kept: unicode letters and digits
/// (everything else separates words), lower-cased, compatibility-decomposed with combining
/// marks dropped ("Café" → "cafe", "ﬁ" → "fi"), each CJK character a word of its own.
fn words(text: &str, mut emit: impl FnMut(&str)) {
    fn flush(word: &mut String, emit: &mut impl FnMut(&str)) {
        if !word.is_empty() {
            emit(word);
            word.clear();
        }
    }
    let mut word = String::new();
    let mut cjk = [0u8; 4];
    for c in text.chars() {
        if is_cjk(c) {
            flush(&mut word, &mut emit);
            emit(c.encode_utf8(&mut cjk));
            continue;
        }
        decompose_compatible(c, |d| {
            if is_combining_mark(d) {
            } else if is_cjk(d) {
                // Half-width katakana decompose to the full-width ones.
                flush(&mut word, &mut emit);
                emit(d.encode_utf8(&mut cjk));
            } else if d.is_alphanumeric() {
                if d == 'ß' || d == 'ẞ' {
                    word.push_str("ss");
                } else {
                    word.extend(d.to_lowercase().filter(|l| !is_combining_mark(*l)));
                }
            } else {
                flush(&mut word, &mut emit);
            }
        });
    }
    flush(&mut word, &mut emit);
}

/// The analysed terms of `text` with their word positions (stop words and over-long words
/// are dropped but still count as a position, so a phrase keeps its gaps): what the index
/// stores and what a query is matched with.
pub(crate) fn analyse(text: &str, mut emit: impl FnMut(&str, u32)) {
    let stemmer = Stemmer::create(Algorithm::English);
    let mut position = 0u32;
    words(text, |word| {
        let at = position;
        position = position.saturating_add(1);
        if word.len() > MAX_TERM_BYTES || STOP_WORDS.binary_search(&word).is_ok() {
            return;
        }
        // Snowball English only for Latin-script words: "v1", "2026" and other scripts are
        // kept as they are.
        if word.bytes().all(|b| b.is_ascii_lowercase()) {
            emit(&stemmer.stem(word), at);
        } else {
            emit(word, at);
        }
    });
}

/// The terms of `text` for indexing and querying: unicode words (letters/digits; `_`/`-`/`'`
/// split), case folded, accents folded (NFKD and combining marks dropped: "café" = "cafe"),
/// CJK ideographs/kana/hangul one term per character, English stemming (Snowball/Porter2:
/// "running" = "runs" = "run") for Latin-script words, a short English stop-word list
/// dropped, terms over 64 bytes dropped. Numbers kept ("2026", "v1").
///
/// A query made only of stop words ("the", "to be or") has no terms, so the index finds
/// nothing for it: stop words are not indexed (they would be a third of the postings). The
/// memory tool can fall back to a literal scan with [`contains_phrase`] for such a query.
pub fn terms(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    analyse(text, |term, _| out.push(term.to_owned()));
    out
}

/// One chunk of a document: lines `start_line..=end_line` (1-based) and its byte range in the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkSpan {
    /// First line (1-based).
    pub start_line: u32,
    /// Last line (inclusive).
    pub end_line: u32,
    /// From the start of the first line to the end of the last one, line terminator excluded.
    pub bytes: Range<usize>,
}

impl ChunkSpan {
    /// Whether `self` extended to end at `end` stays within the chunk limits.
    fn fits(&self, end: &ChunkSpan) -> bool {
        end.bytes.end - self.bytes.start <= CHUNK_MAX_BYTES
            && end.end_line - self.start_line < CHUNK_MAX_LINES
    }
}

/// A Markdown ATX heading: up to three spaces, one to six `#`, then a space or the end.
fn is_heading(line: &str) -> bool {
    let indent = line.len() - line.trim_start_matches(' ').len();
    let rest = &line[indent..];
    let hashes = rest.len() - rest.trim_start_matches('#').len();
    indent <= 3
        && (1..=6).contains(&hashes)
        && rest[hashes..]
            .chars()
            .next()
            .is_none_or(|c| c == ' ' || c == '\t')
}

/// Adds one paragraph (its lines, in order) to the chunk being built, closing that chunk
/// first when the paragraph would pass the limits; a paragraph over the limits on its own is
/// cut at line boundaries.
fn add_paragraph(out: &mut Vec<ChunkSpan>, current: &mut Option<ChunkSpan>, lines: &[ChunkSpan]) {
    let (Some(first), Some(last)) = (lines.first(), lines.last()) else {
        return;
    };
    let whole = ChunkSpan {
        start_line: first.start_line,
        end_line: last.end_line,
        bytes: first.bytes.start..last.bytes.end,
    };
    let pieces = if whole.fits(&whole) {
        std::slice::from_ref(&whole)
    } else {
        lines
    };
    for piece in pieces {
        match current {
            Some(chunk) if chunk.fits(piece) => {
                chunk.end_line = piece.end_line;
                chunk.bytes.end = piece.bytes.end;
            }
            _ => out.extend(current.replace(piece.clone())),
        }
    }
}

/// Split a Markdown document into chunks: a heading starts a new chunk; paragraphs
/// (blank-line separated) are merged into the current chunk until it would pass ~1,000 bytes
/// or 40 lines; a single longer paragraph is cut at line boundaries. Blank lines between
/// chunks belong to no chunk. An empty document has no chunk.
///
/// Lines end at `\n` (a `\r` before it is not part of the chunk); a fenced code block
/// (```` ``` ```` or `~~~`) is one paragraph, its `#` lines are not headings.
pub fn chunks(text: &str) -> Vec<ChunkSpan> {
    let mut out = Vec::new();
    let mut current: Option<ChunkSpan> = None;
    let mut paragraph: Vec<ChunkSpan> = Vec::new();
    let mut in_fence = false;
    let mut offset = 0usize;
    for (number, raw) in (1u32..).zip(text.split_inclusive('\n')) {
        let start = offset;
        offset += raw.len();
        let line = raw.strip_suffix('\n').unwrap_or(raw);
        let line = line.strip_suffix('\r').unwrap_or(line);
        let trimmed = line.trim_start();
        let fence = trimmed.starts_with("```") || trimmed.starts_with("~~~");
        if !in_fence && line.trim().is_empty() {
            add_paragraph(&mut out, &mut current, &paragraph);
            paragraph.clear();
            continue;
        }
        if !in_fence && is_heading(line) {
            add_paragraph(&mut out, &mut current, &paragraph);
            paragraph.clear();
            out.extend(current.take());
        }
        if fence {
            in_fence = !in_fence;
        }
        paragraph.push(ChunkSpan {
            start_line: number,
            end_line: number,
            bytes: start..start + line.len(),
        });
    }
    add_paragraph(&mut out, &mut current, &paragraph);
    out.extend(current);
    out
}

/// Whether `haystack` contains the query's words as a phrase, compared after the same folding
/// (case, accents, whitespace/punctuation runs = one space; no stemming): used to rank
/// exact-phrase chunks first. Stop words count here ("house of cards" is not "house cards");
/// a query without any word is no phrase.
pub fn contains_phrase(haystack: &str, query: &str) -> bool {
    let mut needle = String::from(" ");
    words(query, |w| {
        needle.push_str(w);
        needle.push(' ');
    });
    if needle.len() == 1 {
        return false;
    }
    let mut folded = String::with_capacity(haystack.len() + 2);
    folded.push(' ');
    words(haystack, |w| {
        folded.push_str(w);
        folded.push(' ');
    });
    folded.contains(&needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn span(start_line: u32, end_line: u32, bytes: Range<usize>) -> ChunkSpan {
        ChunkSpan {
            start_line,
            end_line,
            bytes,
        }
    }

    #[test]
    fn terms_fold_case_accents_and_stem() {
        assert_eq!(terms("Running RUNS run"), ["run", "run", "run"]);
        assert_eq!(terms("remembers"), terms("remembered"));
        assert_eq!(terms("Café CAFÉ cafe"), ["cafe", "cafe", "cafe"]);
        assert_eq!(terms("Straße"), terms("strasse"));
        assert_eq!(terms("ﬁle"), terms("file"));
        assert_eq!(terms("Ｗｅｆｔ"), ["weft"]);
    }

    #[test]
    fn terms_split_punctuation_keep_numbers_and_drop_stop_words() {
        assert_eq!(terms("snake_case-name"), ["snake", "case", "name"]);
        assert_eq!(
            terms("the user's v1 release in 2026"),
            ["user", "v1", "releas", "2026"]
        );
        assert_eq!(terms("The Who"), ["who"]);
        assert_eq!(terms("to be or"), Vec::<String>::new());
        assert_eq!(terms("not"), ["not"]);
        let long = "x".repeat(65);
        assert_eq!(
            terms(&format!("{long} short {}", "9".repeat(64))),
            ["short", &"9".repeat(64)]
        );
    }

    #[test]
    fn terms_split_cjk_per_character_and_keep_other_scripts() {
        assert_eq!(terms("東京タワー"), ["東", "京", "タ", "ワ", "ー"]);
        assert_eq!(terms("in東京"), ["東", "京"]);
        assert_eq!(terms("한국어"), ["한", "국", "어"]);
        assert_eq!(terms("ガ"), ["ガ"]);
        assert_eq!(terms("Москва МОСКВА"), ["москва", "москва"]);
        assert_eq!(terms("Ἀθῆναι"), ["αθηναι"]);
    }

    #[test]
    fn stop_words_are_sorted() {
        assert!(STOP_WORDS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn analyse_counts_dropped_words_as_positions() {
        let mut seen = Vec::new();
        analyse("House of the Cards", |t, p| seen.push((t.to_owned(), p)));
        assert_eq!(seen, [("hous".to_owned(), 0), ("card".to_owned(), 3)]);
    }

    #[test]
    fn phrase_folds_but_does_not_stem() {
        assert!(contains_phrase(
            "We saw a Blue-Whale, migrating.",
            "blue whale"
        ));
        assert!(contains_phrase("Le CAFÉ  du\ncoin", "café du coin"));
        assert!(contains_phrase("東京タワー", "東京"));
        assert!(!contains_phrase("blue whales", "blue whale"));
        assert!(!contains_phrase("a whale that is blue", "blue whale"));
        assert!(!contains_phrase("house cards", "house of cards"));
        assert!(!contains_phrase("anything", " ,. "));
        assert!(!contains_phrase("bluewhale", "blue whale"));
    }

    #[test]
    fn chunks_of_empty_and_blank_documents() {
        assert_eq!(chunks(""), Vec::<ChunkSpan>::new());
        assert_eq!(chunks("\n\n  \n"), Vec::<ChunkSpan>::new());
    }

    #[test]
    fn headings_start_chunks_and_short_paragraphs_merge() {
        let text = "# One\nalpha\n\nbeta\n\n\n## Two\ngamma\n#not a heading\n";
        assert_eq!(
            chunks(text),
            [span(1, 4, 0..17), span(7, 9, 20..47)],
            "{:?}",
            chunks(text)
                .iter()
                .map(|c| &text[c.bytes.clone()])
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn crlf_is_not_part_of_the_chunk() {
        let text = "# A\r\nline one\r\n\r\n# B\r\nline two";
        let got = chunks(text);
        assert_eq!(got, [span(1, 2, 0..13), span(4, 5, 17..30)]);
        assert_eq!(&text[got[0].bytes.clone()], "# A\r\nline one");
        assert_eq!(&text[got[1].bytes.clone()], "# B\r\nline two");
    }

    #[test]
    fn paragraphs_merge_until_the_byte_limit() {
        // Ten paragraphs of 300 bytes: three fit in 1,000 bytes (with their blank lines).
        let para = "w".repeat(300);
        let text = [para.as_str(); 10].join("\n\n");
        let got = chunks(&text);
        assert_eq!(got.len(), 4, "{got:?}");
        assert_eq!(got[0], span(1, 5, 0..904));
        assert_eq!(got[1].start_line, 7);
        assert_eq!(got[3], span(19, 19, 2718..3018));
        for c in &got {
            assert!(c.bytes.len() <= CHUNK_MAX_BYTES);
        }
    }

    #[test]
    fn a_long_paragraph_is_cut_at_line_boundaries() {
        // 100 short lines without a blank line: cut every 40 lines.
        let text: String = (0..100).map(|i| format!("item {i}\n")).collect();
        let got = chunks(&text);
        let lines: Vec<_> = got.iter().map(|c| (c.start_line, c.end_line)).collect();
        assert_eq!(lines, [(1, 40), (41, 80), (81, 100)]);
        // 30 lines of 99 bytes: ten lines with their newlines are 999 bytes.
        let text = format!("{}\n", "z".repeat(99)).repeat(30);
        let got = chunks(&text);
        let lines: Vec<_> = got.iter().map(|c| (c.start_line, c.end_line)).collect();
        assert_eq!(lines, [(1, 10), (11, 20), (21, 30)]);
        // One line longer than the limit is a chunk of its own.
        let text = format!("short\n{}\nshort", "q".repeat(1500));
        let got = chunks(&text);
        assert_eq!(
            got.iter()
                .map(|c| (c.start_line, c.end_line))
                .collect::<Vec<_>>(),
            [(1, 1), (2, 2), (3, 3)]
        );
    }

    #[test]
    fn fenced_code_keeps_blank_lines_and_hash_lines() {
        let text = "intro\n```sh\n# comment\n\necho hi\n```\n\nafter";
        assert_eq!(chunks(text), [span(1, 8, 0..text.len())]);
    }

    #[test]
    fn chunks_cover_every_non_blank_line_once_property() {
        // Deterministic pseudo-random documents: every non-blank line is in exactly one
        // chunk, chunks are ordered, within limits unless one line, and start/end on lines.
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..200 {
            let mut text = String::new();
            for _ in 0..rng.usize(0..120) {
                match rng.u8(0..10) {
                    0 => text.push_str("## heading\n"),
                    1 | 2 => text.push('\n'),
                    3 => text.push_str("\r\n"),
                    _ => {
                        text.push_str(&"word ".repeat(rng.usize(1..60)));
                        text.push('\n');
                    }
                }
            }
            let got = chunks(&text);
            let lines: Vec<&str> = text.split('\n').collect();
            let mut covered = vec![false; lines.len() + 1];
            let mut last_end = 0;
            for c in &got {
                assert!(
                    c.start_line > last_end && c.end_line >= c.start_line,
                    "{c:?}"
                );
                last_end = c.end_line;
                for n in c.start_line..=c.end_line {
                    covered[n as usize] = true;
                }
                let body = &text[c.bytes.clone()];
                assert!(!body.starts_with(['\n', '\r']) && !body.ends_with(['\n', '\r']));
                assert!(c.bytes.len() <= CHUNK_MAX_BYTES || c.start_line == c.end_line);
            }
            for (i, line) in lines.iter().enumerate() {
                if !line.trim().is_empty() {
                    assert!(covered[i + 1], "line {} not in a chunk: {got:?}", i + 1);
                }
            }
        }
    }
}
