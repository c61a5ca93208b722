//! Credential scrubbing (seed 004 §8 plus the daemon's own secrets): every tool result is passed
//! through a [`Scrubber`] before the model, the store, the logs or a channel see it, and before
//! it is truncated, so a key cut at the 64 KiB boundary is still caught.
//!
//! Two layers:
//! 1. the exact values of every secret in the loaded configuration (provider keys, channel
//!    tokens, search API keys...), whatever they look like;
//! 2. patterns of well-known credential formats: OpenAI/Anthropic/OpenRouter keys, GitHub
//!    tokens, AWS access key ids, Slack and Telegram bot tokens, private key blocks, JWTs, and
//!    `api_key=`/`token:`/`password=`/`Authorization: Bearer` style assignments.
//!
//! Matches become `[REDACTED]`; for assignments the name is kept (`api_key=[REDACTED]`) so the
//! model still understands the text.

use std::borrow::Cow;
use std::sync::Arc;

use regex::{Regex, RegexSet};
use serde_json::Value;

/// What replaces a secret.
pub const REDACTED: &str = "[REDACTED]";

/// Shortest configured secret that is scrubbed by value (shorter values would redact ordinary
/// words; such secrets are still caught by the patterns when they look like credentials).
pub const MIN_SECRET_LEN: usize = 6;

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
    // Telegram bot token: <bot id>:<35 chars>.
    r"\b[0-9]{8,10}:AA[A-Za-z0-9_\-]{33}\b",
    r"AIza[0-9A-Za-z_\-]{35}",
    r"eyJ[A-Za-z0-9_\-]{10,}\.eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}",
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|\z)",
];

/// `name = value` assignments whose value is redacted (group 1 kept, group 2 redacted).
const ASSIGNMENT_PATTERN: &str = r#"(?i)((?:api[_-]?key|access[_-]?key|secret[_-]?key|client[_-]?secret|auth[_-]?token|access[_-]?token|refresh[_-]?token|token|secret|password|passwd)["']?\s*[:=]\s*["']?)([^\s"',;&}{]{4,})"#;
/// `Authorization: Bearer x`, `Bearer x`, `Authorization: Basic x`.
const BEARER_PATTERN: &str =
    r"(?i)((?:authorization\s*[:=]\s*)?(?:bearer|basic|token)\s+)([A-Za-z0-9._~+/=\-]{8,})";

/// Redacts secrets from text and JSON values. Cheap to clone.
#[derive(Clone)]
pub struct Scrubber {
    inner: Arc<Inner>,
}

struct Inner {
    values: Vec<String>,
}

/// The compiled credential patterns: the same for every scrubber, so compiled once per process
/// and only when the first text is scrubbed (not at start).
struct Patterns {
    tokens: Vec<Regex>,
    any_token: Option<RegexSet>,
    assignment: Option<Regex>,
    bearer: Option<Regex>,
}

static PATTERNS: std::sync::LazyLock<Patterns> = std::sync::LazyLock::new(|| Patterns {
    // The patterns are constants checked by a test; a failure here would only disable them.
    tokens: TOKEN_PATTERNS
        .iter()
        .filter_map(|p| Regex::new(p).ok())
        .collect(),
    any_token: RegexSet::new(TOKEN_PATTERNS).ok(),
    assignment: Regex::new(ASSIGNMENT_PATTERN).ok(),
    bearer: Regex::new(BEARER_PATTERN).ok(),
});

impl Default for Scrubber {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrubber")
            .field("secret_values", &self.inner.values.len())
            .field("patterns", &TOKEN_PATTERNS.len())
            .finish()
    }
}

impl Scrubber {
    /// A scrubber for these secret values plus the built-in credential patterns.
    pub fn new(secrets: Vec<String>) -> Self {
        let mut values: Vec<String> = secrets
            .into_iter()
            .filter(|s| s.len() >= MIN_SECRET_LEN)
            .collect();
        // Longest first, so a secret containing another is replaced whole.
        values.sort_by_key(|s| std::cmp::Reverse(s.len()));
        values.dedup();
        Self {
            inner: Arc::new(Inner { values }),
        }
    }

    /// The configured secret values (for other layers, e.g. the exec environment filter).
    pub fn secret_values(&self) -> &[String] {
        &self.inner.values
    }

    /// `text` with every secret replaced by `[REDACTED]`.
    pub fn scrub_str<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out: Cow<'a, str> = Cow::Borrowed(text);
        for v in &self.inner.values {
            if out.contains(v.as_str()) {
                out = Cow::Owned(out.replace(v.as_str(), REDACTED));
            }
        }
        let i = &*PATTERNS;
        if i.any_token.as_ref().is_some_and(|s| s.is_match(&out)) {
            for re in &i.tokens {
                if let Cow::Owned(s) = re.replace_all(&out, REDACTED) {
                    out = Cow::Owned(s);
                }
            }
        }
        for re in [&i.assignment, &i.bearer].into_iter().flatten() {
            let replaced = re.replace_all(&out, |c: &regex::Captures<'_>| {
                let value = c.get(2).map_or("", |m| m.as_str());
                if value == REDACTED || value.starts_with("[REDACTED") {
                    c[0].to_string()
                } else {
                    format!("{}{REDACTED}", &c[1])
                }
            });
            if let Cow::Owned(s) = replaced {
                out = Cow::Owned(s);
            }
        }
        out
    }

    /// Scrub every string (and object key) inside a JSON value in place.
    pub fn scrub_value(&self, v: &mut Value) {
        match v {
            Value::String(s) => {
                if let Cow::Owned(new) = self.scrub_str(s) {
                    *s = new;
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| self.scrub_value(x)),
            Value::Object(o) => {
                let dirty_keys: Vec<String> = o
                    .keys()
                    .filter(|k| matches!(self.scrub_str(k), Cow::Owned(_)))
                    .cloned()
                    .collect();
                for k in dirty_keys {
                    if let Some(val) = o.remove(&k) {
                        o.insert(self.scrub_str(&k).into_owned(), val);
                    }
                }
                o.values_mut().for_each(|x| self.scrub_value(x));
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use serde_json::json;

    use super::*;

    #[test]
    fn every_pattern_compiles() {
        for p in TOKEN_PATTERNS
            .iter()
            .chain([ASSIGNMENT_PATTERN, BEARER_PATTERN].iter())
        {
            Regex::new(p).unwrap();
        }
        assert!(RegexSet::new(TOKEN_PATTERNS).is_ok());
    }

    #[test]
    fn known_credential_formats_are_redacted() {
        let s = Scrubber::default();
        let planted = [
            "sk-abcdefghijklmnopqrstuvwxyz012345",
            "sk-proj-abcdefghijklmnopqrstuvwxyz_0123-45",
            "sk-ant-api03-abcdefghijklmnopqrstuvwxyz-0123",
            "sk-or-v1-0123456789abcdef0123456789abcdef",
            "ghp_0123456789abcdefghijklmnopqrstuvwxyzAB",
            "github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
            "AKIAIOSFODNN7EXAMPLE",
            "xoxb-123456789012-1234567890123-abcdefghijkl",
            "xapp-1-A0123456789-0123456789012-abcdef",
            "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw1",
            "AIzaSyA-0123456789abcdefghijklmnopqrstu",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        ];
        for key in planted {
            let text = format!("before {key} after");
            let out = s.scrub_str(&text);
            assert!(!out.contains(key), "{key} survived: {out}");
            assert!(
                out.starts_with("before ") && out.ends_with(" after"),
                "{out}"
            );
        }
        let pem =
            "x\n-----BEGIN RSA PRIVATE KEY-----\nMIIEabc\ndef\n-----END RSA PRIVATE KEY-----\ny";
        let out = s.scrub_str(pem);
        assert!(!out.contains("MIIEabc"), "{out}");
        assert!(out.starts_with("x\n") && out.ends_with("\ny"));
    }

    #[test]
    fn assignments_keep_the_name_and_lose_the_value() {
        let s = Scrubber::default();
        for (input, expect) in [
            ("api_key=hunter2hunter2", "api_key=[REDACTED]"),
            ("PASSWORD: \"p4ssw0rd!\"", "PASSWORD: \"[REDACTED]\""),
            (
                "Authorization: Bearer abc.def-ghi_jkl",
                "Authorization: Bearer [REDACTED]",
            ),
            (r#"{"token": "t0k3n-value"}"#, r#"{"token": "[REDACTED]"}"#),
            (
                "export DB_PASSWORD=swordfish",
                "export DB_PASSWORD=[REDACTED]",
            ),
        ] {
            assert_eq!(s.scrub_str(input), expect, "{input}");
        }
        // Ordinary prose is untouched.
        for plain in [
            "the token bucket refills",
            "a secret garden",
            "password reset emails",
            "PWD=/home/u/work",
        ] {
            assert_eq!(s.scrub_str(plain), plain);
        }
    }

    #[test]
    fn configured_values_are_redacted_whatever_they_look_like() {
        let s = Scrubber::new(vec!["plainvalue99".into(), "short".into()]);
        assert_eq!(s.scrub_str("x plainvalue99 y"), "x [REDACTED] y");
        // Too short to scrub by value.
        assert_eq!(s.scrub_str("short"), "short");
        let mut v = json!({"a": ["plainvalue99"], "plainvalue99": 1, "n": 5});
        s.scrub_value(&mut v);
        assert_eq!(v, json!({"a": ["[REDACTED]"], "[REDACTED]": 1, "n": 5}));
    }
}
