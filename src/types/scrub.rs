//! Credential scrubbing, shared by every layer (seed 004 §8 plus the daemon's own secrets). The
//! registry passes every tool result through a [`Scrubber`] before the model, the store, the
//! logs or a channel see it (and before truncation, so a key cut at the 64 KiB boundary is still
//! caught); the LLM providers pass their error texts through one before an error leaves them;
//! URLs shown by `weft status`, `doctor`, `/readyz` and the logs go through [`redact_url`].
//!
//! Three layers:
//! 1. the exact values of every secret in the loaded configuration (provider keys, channel
//!    tokens, search API keys...), whatever they look like, **and their encoded forms**: base64
//!    (standard and URL-safe, padded or not, and the part of the encoding that does not depend
//!    on the secret's offset inside a larger encoded blob, for each of the three offsets mod 3),
//!    hex (lower and upper case), percent-encoding (the usual encoder variants) and JSON string
//!    escaping. Lines of a wrapped base64/hex block (`base64`, `xxd -p`) are joined before
//!    looking for them, so a secret encoded across a line break is caught too;
//! 2. patterns of well-known credential formats: OpenAI/Anthropic/OpenRouter keys, GitHub
//!    tokens, AWS access key ids, Slack and Telegram bot tokens, private key blocks, JWTs;
//! 3. secrets by position: `api_key=`/`token:`/`password=` assignments, `Authorization:
//!    Bearer`/`Basic` header echoes, the password of a URL's userinfo
//!    (`postgres://app:PASS@db`) and URL query parameters named like a credential
//!    (`?key=`, `&access_token=`, `&X-Amz-Signature=`, `&sig=`...).
//!
//! Matches become `[REDACTED]`; for the positional layer the name is kept (`api_key=[REDACTED]`,
//! `postgres://app:[REDACTED]@db`) so the text stays useful.
//!
//! The scrubber must not import anything of the crate: it is layer 0 so the providers (layer 1)
//! can use it.

use std::borrow::Cow;
use std::sync::{Arc, LazyLock, OnceLock};

use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use regex::{Regex, RegexSet};
use serde_json::Value;

use super::RwLockExt;

/// What replaces a secret.
pub const REDACTED: &str = "[REDACTED]";

/// Shortest configured secret that is scrubbed by value (shorter values would redact ordinary
/// words; such secrets are still caught by the patterns when they look like credentials).
pub const MIN_SECRET_LEN: usize = 6;

/// Shortest encoded form of a secret that is scrubbed (characters): an 8-character base64 or
/// hex string does not occur by chance in ordinary text. A 6-byte secret's base64 at offsets 1
/// and 2 mod 3 has only 7 stable characters, so it is matched at offset 0 only; from 7 bytes on
/// every offset is covered.
pub const MIN_ENCODED_LEN: usize = 8;

/// A line of a wrapped base64/hex block (every line but the last) has at least this many
/// characters; shorter runs of letters are words, not an encoder's output.
const MIN_WRAPPED_LINE: usize = 16;

/// Whole-match patterns: the entire match is a credential.
const TOKEN_PATTERNS: &[&str] = &[
    // Anthropic before OpenAI: both start with `sk-`.
    r"sk-ant-[A-Za-z0-9_\-]{20,}",
    r"sk-or-v1-[A-Za-z0-9]{20,}",
    r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}",
    r"gh[pousr]_[A-Za-z0-9]{36,}",
    r"github_pat_[A-Za-z0-9_]{22,}",
    r"(?:AKIA|ASIA)[A-Z0-9]{16}",
    r"xox[abposr]-[A-Za-z0-9\-]{10,}",
    r"xapp-[0-9]-[A-Za-z0-9\-]{10,}",
    // Telegram bot token: <bot id>:<35 chars>; in API URLs it follows `/bot` (no word
    // boundary there). A leading `\b` or literal keeps the set's scan fast on digit-heavy text.
    r"\b[0-9]{8,10}:AA[A-Za-z0-9_\-]{33}\b",
    r"bot[0-9]{8,10}:AA[A-Za-z0-9_\-]{33}\b",
    r"AIza[0-9A-Za-z_\-]{35}",
    r"eyJ[A-Za-z0-9_\-]{10,}\.eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}",
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|\z)",
];

/// Positional patterns: group 2 is the secret and is redacted; the rest of the match is kept.
const KEYED_PATTERNS: &[&str] = &[
    // `name = value` assignments.
    r#"(?i)((?:api[_-]?key|access[_-]?key|secret[_-]?key|client[_-]?secret|auth[_-]?token|access[_-]?token|refresh[_-]?token|token|secret|password|passwd)["']?\s*[:=]\s*["']?)([^\s"',;&}{]{4,})"#,
    // `Authorization: Bearer x`, `Authorization: x`, `Bearer x`, `Basic x`, `token x`.
    r#"(?i)((?:authorization["']?\s*[:=]\s*["']?(?:(?:bearer|basic|token)\s+)?)|(?:bearer|basic|token)\s+)([A-Za-z0-9._~+/=\-]{8,})"#,
];

/// Positional patterns of URLs (group 2 redacted), also applied by [`redact_url`], each with
/// the literals every match contains (the pattern is compiled and run only on text that holds
/// them all: most tool output has no URL, and an ordinary base URL, checked by the provider
/// hints at start, has neither userinfo nor query).
const URL_PATTERNS: &[(&[&str], &str)] = &[
    // The password of a URL's userinfo: `scheme://user:PASSWORD@host` (the last `@` before the
    // path ends the userinfo: passwords are not always percent-encoded).
    (
        &["://", "@"],
        r#"(?i)(\b[a-z][a-z0-9+.\-]*://[^\s:/?#@"'<>\[\]]*:)([^\s/?#"'<>]+)@"#,
    ),
    // URL query parameters named like a credential, with an optional `x-amz-`-style prefix.
    (
        &["="],
        r#"(?i)([?&;](?:[a-z0-9]+[_.\-])*(?:api[_\-]?key|apikey|key|token|access[_\-]?token|secret|password|passwd|pwd|sig|signature|auth|credentials?)=)([^&#\s"'<>]+)"#,
    ),
];

/// Redacts secrets from text and JSON values. Cheap to clone.
#[derive(Clone)]
pub struct Scrubber {
    inner: Arc<Inner>,
}

struct Inner {
    /// The configured values, longest first.
    values: Vec<String>,
    /// The values and their encoded forms, sorted and deduplicated.
    needles: Vec<String>,
    /// `needles` matched in one pass (longest match wins), built when the first text is
    /// scrubbed: a daemon makes several scrubbers at start (providers, registry) and building
    /// each automaton there cost start-up time (docs/performance.md).
    exact: OnceLock<Option<AhoCorasick>>,
    /// Values learned while running ([`Scrubber::learn`]: a credential the agent typed into a
    /// page), shared by every clone, replaced before anything else.
    learned: std::sync::RwLock<Vec<String>>,
}

/// Most values a scrubber learns while running (the oldest are forgotten first).
pub const MAX_LEARNED: usize = 256;
/// Shortest value learned (shorter ones would mask ordinary words).
pub const MIN_LEARNED_LEN: usize = 4;

/// The compiled credential patterns: the same for every scrubber, so compiled once per process
/// and only when the first text is scrubbed (not at start). Each group is compiled on its own:
/// [`redact_url`], used at start for the provider hints, needs only the URL patterns, and only
/// those whose literals the text holds.
struct TokenPatterns {
    tokens: Vec<Regex>,
    any_token: Option<RegexSet>,
}

// The patterns are constants checked by a test; a failure here would only disable them.
static TOKENS: LazyLock<TokenPatterns> = LazyLock::new(|| TokenPatterns {
    tokens: TOKEN_PATTERNS
        .iter()
        .filter_map(|p| Regex::new(p).ok())
        .collect(),
    any_token: RegexSet::new(TOKEN_PATTERNS).ok(),
});

static KEYED: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    KEYED_PATTERNS
        .iter()
        .filter_map(|p| Regex::new(p).ok())
        .collect()
});

/// [`URL_PATTERNS`], each compiled on the first text holding its literals.
static URL: [OnceLock<Option<Regex>>; URL_PATTERNS.len()] =
    [const { OnceLock::new() }; URL_PATTERNS.len()];

impl Default for Scrubber {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrubber")
            .field("secret_values", &self.inner.values.len())
            .field("exact_forms", &self.inner.needles.len())
            .field(
                "patterns",
                &(TOKEN_PATTERNS.len() + KEYED_PATTERNS.len() + URL_PATTERNS.len()),
            )
            .finish()
    }
}

impl Scrubber {
    /// A scrubber for these secret values (and their encoded forms) plus the built-in credential
    /// patterns.
    pub fn new(secrets: Vec<String>) -> Self {
        let mut values: Vec<String> = secrets
            .into_iter()
            .filter(|s| s.len() >= MIN_SECRET_LEN)
            .collect();
        // Longest first, so a secret containing another is replaced whole.
        values.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        values.dedup();
        let mut needles: Vec<String> = Vec::new();
        for v in &values {
            needles.push(v.clone());
            needles.extend(encoded_forms(v.as_bytes()));
        }
        needles.sort();
        needles.dedup();
        Self {
            inner: Arc::new(Inner {
                values,
                needles,
                exact: OnceLock::new(),
                learned: std::sync::RwLock::default(),
            }),
        }
    }

    /// The automaton of the values and their encoded forms (`None` without values), built on
    /// first use.
    fn exact(&self) -> Option<&AhoCorasick> {
        self.inner
            .exact
            .get_or_init(|| {
                if self.inner.needles.is_empty() {
                    return None;
                }
                // Building fails only for absurd sizes; the values are still scrubbed by the
                // patterns then, and the test of this module builds one.
                // A contiguous NFA: built in microseconds (a DFA of every encoded form took
                // milliseconds) and fast enough for tool results.
                AhoCorasick::builder()
                    .match_kind(MatchKind::LeftmostLongest)
                    .kind(Some(AhoCorasickKind::ContiguousNFA))
                    .build(&self.inner.needles)
                    .ok()
            })
            .as_ref()
    }

    /// Scrub `value` too from now on, in this scrubber and every clone of it (a credential
    /// learned while running: what the agent typed into a password field). Values shorter
    /// than [`MIN_LEARNED_LEN`] characters are ignored.
    pub fn learn(&self, value: &str) {
        if value.chars().count() < MIN_LEARNED_LEN {
            return;
        }
        let mut l = self.inner.learned.write_locked();
        if l.iter().any(|v| v == value) {
            return;
        }
        if l.len() >= MAX_LEARNED {
            l.remove(0);
        }
        l.push(value.to_string());
        // Longest first, so a value containing another is replaced whole.
        l.sort_by_key(|v| std::cmp::Reverse(v.len()));
    }

    /// `text` with every learned value replaced by `[REDACTED]`.
    fn scrub_learned<'a>(&self, text: Cow<'a, str>) -> Cow<'a, str> {
        let l = self.inner.learned.read_locked();
        let mut out = text;
        for v in l.iter() {
            if out.contains(v.as_str()) {
                out = Cow::Owned(out.replace(v.as_str(), REDACTED));
            }
        }
        out
    }

    /// The configured secret values (for other layers, e.g. the exec environment filter).
    pub fn secret_values(&self) -> &[String] {
        &self.inner.values
    }

    /// `text` with every secret replaced by `[REDACTED]`.
    pub fn scrub_str<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out: Cow<'a, str> = self.scrub_learned(Cow::Borrowed(text));
        if let Some(ac) = self.exact() {
            if let Some(s) = replace_exact(ac, &out) {
                out = Cow::Owned(s);
            }
            if let Some(s) = replace_in_wrapped_blocks(ac, &out) {
                out = Cow::Owned(s);
            }
        }
        let p = &*TOKENS;
        if p.any_token.as_ref().is_some_and(|s| s.is_match(&out)) {
            for re in &p.tokens {
                if let Cow::Owned(s) = re.replace_all(&out, REDACTED) {
                    out = Cow::Owned(s);
                }
            }
        }
        for re in KEYED.iter() {
            if let Some(s) = redact_group(re, &out) {
                out = Cow::Owned(s);
            }
        }
        redact_url_parts(out)
    }

    /// Scrub every string (and object key) inside a JSON value in place.
    pub fn scrub_value(&self, v: &mut Value) {
        map_strings(v, &|s| self.scrub_str(s));
    }

    /// What the registry does to every tool result: each string (and object key) is made safe
    /// to show ([`sanitize_output`](super::text::sanitize_output): terminal escapes, controls,
    /// invisible characters), then scrubbed. Sanitising first joins a secret that escapes or
    /// zero-width characters were splitting.
    pub fn clean_value(&self, v: &mut Value) {
        map_strings(v, &|s| match super::text::sanitize_output(s) {
            Cow::Borrowed(b) => self.scrub_str(b),
            Cow::Owned(o) => Cow::Owned(self.scrub_str(&o).into_owned()),
        });
    }
}

/// Apply `f` to every string and object key of `v`, replacing those it changed.
pub fn map_strings(v: &mut Value, f: &dyn Fn(&str) -> Cow<'_, str>) {
    match v {
        Value::String(s) => {
            if let Cow::Owned(new) = f(s) {
                *s = new;
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| map_strings(x, f)),
        Value::Object(o) => {
            let dirty_keys: Vec<(String, String)> = o
                .keys()
                .filter_map(|k| match f(k) {
                    Cow::Owned(new) => Some((k.clone(), new)),
                    Cow::Borrowed(_) => None,
                })
                .collect();
            for (k, new) in dirty_keys {
                if let Some(val) = o.remove(&k) {
                    o.insert(new, val);
                }
            }
            o.values_mut().for_each(|x| map_strings(x, f));
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// `url` with the password of its userinfo and the values of credential-like query parameters
/// redacted (`https://x/v1?key=[REDACTED]`, `postgres://app:[REDACTED]@db/x`); scheme, user,
/// host, path and the other parameters are kept. For URLs shown in status, doctor, logs and
/// errors. Works on any text holding URLs.
pub fn redact_url(url: &str) -> Cow<'_, str> {
    redact_url_parts(Cow::Borrowed(url))
}

/// [`URL_PATTERNS`] applied to `text`.
fn redact_url_parts(mut text: Cow<'_, str>) -> Cow<'_, str> {
    for ((lits, pattern), re) in URL_PATTERNS.iter().zip(&URL) {
        if !lits.iter().all(|l| text.contains(l)) {
            continue;
        }
        if let Some(re) = re.get_or_init(|| Regex::new(pattern).ok()) {
            if let Some(s) = redact_group(re, &text) {
                text = Cow::Owned(s);
            }
        }
    }
    text
}

/// `text` with group 2 of every match of `re` replaced by [`REDACTED`] (unless it already is);
/// `None` when nothing changed.
fn redact_group(re: &Regex, text: &str) -> Option<String> {
    let mut out = String::new();
    let mut last = 0;
    for c in re.captures_iter(text) {
        let Some(g) = c.get(2) else { continue };
        if g.as_str().starts_with("[REDACTED") {
            continue;
        }
        out.push_str(&text[last..g.start()]);
        out.push_str(REDACTED);
        last = g.end();
    }
    if last == 0 {
        return None;
    }
    out.push_str(&text[last..]);
    Some(out)
}

/// `text` with every match of `ac` replaced; `None` when there is none.
fn replace_exact(ac: &AhoCorasick, text: &str) -> Option<String> {
    let mut it = ac.find_iter(text).peekable();
    it.peek()?;
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for m in it {
        out.push_str(&text[last..m.start()]);
        out.push_str(REDACTED);
        last = m.end();
    }
    out.push_str(&text[last..]);
    Some(out)
}

/// Whether `b` can be part of base64 (either alphabet, with padding) or hex output.
fn is_code_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'-' | b'_')
}

/// Secrets encoded across the line breaks of a wrapped block (`base64` wraps at 76 columns,
/// `xxd -p` at 60, PEM at 64): each run of two or more lines made only of base64/hex
/// characters, every line but the last at least [`MIN_WRAPPED_LINE`] long, is joined and
/// searched; a block holding a secret is replaced by its joined, scrubbed text (on one line).
/// `None` when nothing changed.
fn replace_in_wrapped_blocks(ac: &AhoCorasick, text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    // Runs of code lines as byte ranges of `text` (end = end of the last line's content).
    let mut blocks: Vec<(usize, usize)> = Vec::new();
    let mut run: Option<(usize, usize, usize)> = None; // (start, end, lines)
    let mut prev_long = false;
    let mut pos = 0;
    while pos < bytes.len() {
        let nl = text[pos..].find('\n').map_or(bytes.len(), |i| pos + i);
        let end = if nl > pos && bytes[nl - 1] == b'\r' {
            nl - 1
        } else {
            nl
        };
        let line = &bytes[pos..end];
        let code = !line.is_empty() && line.iter().all(|&b| is_code_byte(b));
        run = match (run, code) {
            (Some((s, _, n)), true) if prev_long => Some((s, end, n + 1)),
            (r, true) => {
                if let Some((s, e, n)) = r {
                    if n >= 2 {
                        blocks.push((s, e));
                    }
                }
                (line.len() >= MIN_WRAPPED_LINE).then_some((pos, end, 1))
            }
            (r, false) => {
                if let Some((s, e, n)) = r {
                    if n >= 2 {
                        blocks.push((s, e));
                    }
                }
                None
            }
        };
        prev_long = line.len() >= MIN_WRAPPED_LINE;
        pos = nl + 1;
    }
    if let Some((s, e, n)) = run {
        if n >= 2 {
            blocks.push((s, e));
        }
    }
    let mut out = String::new();
    let mut last = 0;
    for (s, e) in blocks {
        let joined: String = text[s..e]
            .split('\n')
            .map(|l| l.strip_suffix('\r').unwrap_or(l))
            .collect();
        if let Some(clean) = replace_exact(ac, &joined) {
            out.push_str(&text[last..s]);
            out.push_str(&clean);
            last = e;
        }
    }
    if last == 0 {
        return None;
    }
    out.push_str(&text[last..]);
    Some(out)
}

const B64_STD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Base64 (standard alphabet) of `data`, without padding.
fn base64_unpadded(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for i in 0..chars {
            let idx = (n >> (18 - 6 * i)) & 63;
            out.push(char::from(B64_STD[idx as usize]));
        }
    }
    out
}

/// The URL-safe alphabet's version of standard base64 text.
fn url_safe(s: &str) -> String {
    s.replace('+', "-").replace('/', "_")
}

/// Percent-encoding of `v`, leaving unreserved characters (RFC 3986) and those in `safe` as
/// they are, hex digits upper or lower case.
fn percent_encode(v: &[u8], safe: &[u8], upper: bool) -> String {
    let mut out = String::with_capacity(v.len() * 3);
    for &b in v {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') || safe.contains(&b)
        {
            out.push(char::from(b));
        } else if upper {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out
}

/// The encoded forms of a secret worth matching (at least [`MIN_ENCODED_LEN`] characters, and
/// different from the secret itself).
fn encoded_forms(v: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    // Base64: the whole encoding (a secret encoded alone), padded and not...
    let whole = base64_unpadded(v);
    let pad = "=".repeat((4 - whole.len() % 4) % 4);
    for s in [format!("{whole}{pad}"), whole] {
        out.push(url_safe(&s));
        out.push(s);
    }
    // ...and, for a secret inside a larger blob, the characters that depend on its bytes only,
    // for each offset mod 3 (`a` bytes of the blob before it in its 3-byte group). Character i
    // of the encoding carries bits [6i, 6i + 6); the secret's bits are [8a, 8a + 8n).
    for a in 0..3usize {
        let mut buf = vec![0u8; a];
        buf.extend_from_slice(v);
        let enc = base64_unpadded(&buf);
        let start = (8 * a).div_ceil(6);
        let end = (8 * a + 8 * v.len()) / 6;
        if end > start && end - start >= MIN_ENCODED_LEN {
            let core = &enc[start..end];
            out.push(url_safe(core));
            out.push(core.to_string());
        }
    }
    // Hex.
    let hex: String = v.iter().map(|b| format!("{b:02x}")).collect();
    out.push(hex.to_uppercase());
    out.push(hex);
    // Percent-encoding as encoders write it: everything reserved encoded; `/` kept (Python's
    // `quote`); `!'()*` kept (JavaScript's `encodeURIComponent`); space as `+` (forms); every
    // byte encoded (`od | sed` one-liners, some escapers).
    for safe in [&b""[..], b"/", b"!'()*"] {
        for upper in [true, false] {
            let p = percent_encode(v, safe, upper);
            if v.contains(&b' ') {
                out.push(p.replace("%20", "+"));
            }
            out.push(p);
        }
    }
    let all: String = v.iter().map(|b| format!("%{b:02X}")).collect();
    out.push(all.to_lowercase());
    out.push(all);
    // JSON string escaping (a secret with a quote, a backslash or a control character).
    if let Ok(text) = std::str::from_utf8(v) {
        if let Ok(j) = serde_json::to_string(text) {
            out.push(j[1..j.len() - 1].to_string());
        }
    }
    out.retain(|f| f.len() >= MIN_ENCODED_LEN && f.as_bytes() != v);
    out
}

#[cfg(test)]
#[path = "scrub_tests.rs"]
mod tests;
