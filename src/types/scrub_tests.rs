#![allow(clippy::unwrap_used, clippy::expect_used)]
use serde_json::json;

use super::*;

#[test]
fn every_pattern_compiles() {
    for p in TOKEN_PATTERNS
        .iter()
        .chain(KEYED_PATTERNS)
        .chain(URL_PATTERNS.iter().map(|(_, p)| p))
    {
        Regex::new(p).unwrap();
    }
    assert!(RegexSet::new(TOKEN_PATTERNS).is_ok());
    assert_eq!(TOKENS.tokens.len(), TOKEN_PATTERNS.len());
    assert_eq!(KEYED.len(), KEYED_PATTERNS.len());
    // Every match of a URL pattern holds its literals (they gate the pattern).
    for ((lits, pattern), input) in URL_PATTERNS.iter().zip([
        "redis://:hunter22@cache:6379/0",
        "https://x/v1?key=SECRETVALUE",
    ]) {
        let m = Regex::new(pattern).unwrap().find(input).unwrap();
        assert!(lits.iter().all(|l| m.as_str().contains(l)), "{pattern}");
    }
}

#[test]
fn a_new_scrubber_builds_its_automaton_on_first_use() {
    // The daemon makes several scrubbers at start; none may pay for its automaton there.
    let s = Scrubber::new(vec!["plainvalue99".into()]);
    assert!(s.inner.exact.get().is_none());
    let copy = s.clone();
    assert_eq!(copy.scrub_str("x plainvalue99 y"), "x [REDACTED] y");
    assert!(s.inner.exact.get().is_some_and(Option::is_some));
    assert!(Scrubber::default().exact().is_none());
}

#[test]
fn a_plain_base_url_needs_no_url_pattern() {
    // What `redact_url` does for the provider hints at start: no literal of a URL pattern
    // in an ordinary base URL, so nothing is compiled or run for it.
    for url in ["https://api.openai.com/v1", "http://localhost:11434/v1"] {
        assert!(
            URL_PATTERNS
                .iter()
                .all(|(lits, _)| !lits.iter().all(|l| url.contains(l))),
            "{url}"
        );
        assert_eq!(redact_url(url), url);
    }
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
    let url = "GET https://api.telegram.org/bot123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw1/getMe failed";
    assert_eq!(
        s.scrub_str(url),
        "GET https://api.telegram.org/[REDACTED]/getMe failed"
    );
    let pem = "x\n-----BEGIN RSA PRIVATE KEY-----\nMIIEabc\ndef\n-----END RSA PRIVATE KEY-----\ny";
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
        "see https://example.com:8443/a?page=2&sort=key#top",
        "ssh://git@github.com/org/repo.git",
        "the monkey=1 and design=2 params",
    ] {
        assert_eq!(s.scrub_str(plain), plain);
    }
}

#[test]
fn header_echoes_in_provider_error_bodies_are_redacted() {
    let s = Scrubber::default();
    for (input, expect) in [
        (
            r#"{"error":{"message":"bad header Authorization: Bearer my-private-key-0001"}}"#,
            r#"{"error":{"message":"bad header Authorization: Bearer [REDACTED]"}}"#,
        ),
        (
            r#"{"headers":{"authorization":"Bearer my-private-key-0001"}}"#,
            r#"{"headers":{"authorization":"Bearer [REDACTED]"}}"#,
        ),
        (
            "{'Authorization': 'my-private-key-0001'}",
            "{'Authorization': '[REDACTED]'}",
        ),
        (
            r#"invalid x-api-key: "my-private-key-0001""#,
            r#"invalid x-api-key: "[REDACTED]""#,
        ),
        (
            "Authorization: Basic YXBwOnMzY3JldC1wYXNz",
            "Authorization: Basic [REDACTED]",
        ),
    ] {
        assert_eq!(s.scrub_str(input), expect, "{input}");
    }
}

#[test]
fn url_passwords_and_credential_query_parameters_are_redacted() {
    for (input, expect) in [
        (
            "postgres://app:S3cretPass@db/x",
            "postgres://app:[REDACTED]@db/x",
        ),
        (
            "DATABASE_URL=mysql://root:p@ss@w0rd@10.0.0.5:3306/app?ssl=true",
            "DATABASE_URL=mysql://root:[REDACTED]@10.0.0.5:3306/app?ssl=true",
        ),
        ("redis://:hunter22@cache:6379/0", "redis://:[REDACTED]@cache:6379/0"),
        (
            "https://x/v1?key=SECRETVALUE",
            "https://x/v1?key=[REDACTED]",
        ),
        (
            "https://gen.example/v1beta?alt=sse&key=AbC123&x=1",
            "https://gen.example/v1beta?alt=sse&key=[REDACTED]&x=1",
        ),
        (
            "https://b.s3.amazonaws.com/o?X-Amz-Credential=abc%2F2024&X-Amz-Signature=deadbeef&X-Amz-Security-Token=zzz",
            "https://b.s3.amazonaws.com/o?X-Amz-Credential=[REDACTED]&X-Amz-Signature=[REDACTED]&X-Amz-Security-Token=[REDACTED]",
        ),
        (
            "https://acct.blob.core.windows.net/c/b?sv=2021&sig=AbCd%2Bef",
            "https://acct.blob.core.windows.net/c/b?sv=2021&sig=[REDACTED]",
        ),
        (
            "wss://h/socket?access_token=abc&auth=def",
            "wss://h/socket?access_token=[REDACTED]&auth=[REDACTED]",
        ),
    ] {
        assert_eq!(redact_url(input), expect, "{input}");
        assert_eq!(Scrubber::default().scrub_str(input), expect, "{input}");
    }
    let plain = "https://api.openai.com/v1/chat/completions?api-version=2024-01-01";
    assert_eq!(redact_url(plain), plain);
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

#[test]
fn base64_matches_a_reference_encoder() {
    for (input, b64) in [
        ("", ""),
        ("f", "Zg"),
        ("fo", "Zm8"),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg"),
        ("fooba", "Zm9vYmE"),
        ("foobar", "Zm9vYmFy"),
        ("\u{ff}\u{fe}", "w7/Dvg"),
    ] {
        assert_eq!(base64_unpadded(input.as_bytes()), b64, "{input}");
    }
}

/// Standard base64 with padding, from the reference above (for the tests only).
fn b64(data: &[u8]) -> String {
    let s = base64_unpadded(data);
    let pad = "=".repeat((4 - s.len() % 4) % 4);
    format!("{s}{pad}")
}

const SECRET: &str = "Sup3r/Secret+Value?x";

#[test]
fn encoded_forms_of_a_configured_secret_are_redacted() {
    let s = Scrubber::new(vec![SECRET.into()]);
    let hex: String = SECRET.bytes().map(|b| format!("{b:02x}")).collect();
    let forms = [
        b64(SECRET.as_bytes()),
        base64_unpadded(SECRET.as_bytes()),
        url_safe(&b64(SECRET.as_bytes())),
        url_safe(&base64_unpadded(SECRET.as_bytes())),
        hex.clone(),
        hex.to_uppercase(),
        "Sup3r%2FSecret%2BValue%3Fx".to_string(),
        "Sup3r%2fSecret%2bValue%3fx".to_string(),
        "Sup3r/Secret%2BValue%3Fx".to_string(),
        SECRET.bytes().map(|b| format!("%{b:02X}")).collect(),
        SECRET.bytes().map(|b| format!("%{b:02x}")).collect(),
    ];
    for f in &forms {
        let text = format!("value: <{f}> end");
        let out = s.scrub_str(&text);
        assert!(!out.contains(f.as_str()), "{f} survived: {out}");
        assert!(out.contains("[REDACTED]"), "{out}");
        assert!(
            out.starts_with("value: <") && out.ends_with("> end"),
            "{out}"
        );
    }
}

#[test]
fn a_secret_inside_a_larger_base64_blob_is_caught_at_every_offset() {
    let s = Scrubber::new(vec![SECRET.into()]);
    for prefix_len in 0..9 {
        let mut file = "A".repeat(prefix_len).into_bytes();
        file.extend_from_slice(format!("KEY={SECRET}\nOTHER=1\n").as_bytes());
        for enc in [b64(&file), url_safe(&b64(&file))] {
            let out = s.scrub_str(&enc);
            assert!(
                out.contains("[REDACTED]"),
                "offset {prefix_len}: {enc} -> {out}"
            );
            // Nothing of the part of the encoding that the secret alone determines is left.
            let a = (prefix_len + "KEY=".len()) % 3;
            let mut buf = vec![0u8; a];
            buf.extend_from_slice(SECRET.as_bytes());
            let core = base64_unpadded(&buf);
            let core = &core[(8 * a).div_ceil(6)..(8 * a + 8 * SECRET.len()) / 6];
            let core = if enc.contains('_') || enc.contains('-') {
                url_safe(core)
            } else {
                core.to_string()
            };
            for w in core.as_bytes().windows(8) {
                let w = std::str::from_utf8(w).unwrap();
                assert!(!out.contains(w), "offset {prefix_len}: {w} left in {out}");
            }
        }
    }
}

#[test]
fn a_secret_encoded_across_wrapped_lines_is_caught() {
    let s = Scrubber::new(vec![SECRET.into()]);
    for prefix_len in [36, 40, 45, 50, 52, 53] {
        // `base64` wraps at 76 columns (57 bytes a line): the secret straddles the break.
        let mut file = "#".repeat(prefix_len).into_bytes();
        file.extend_from_slice(format!("KEY={SECRET}\n").as_bytes());
        let enc = b64(&file);
        let wrapped: Vec<&str> = enc
            .as_bytes()
            .chunks(76)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        let text = format!("$ base64 .env\n{}\n$ done", wrapped.join("\n"));
        let out = s.scrub_str(&text);
        assert!(out.contains("[REDACTED]"), "offset {prefix_len}: {out}");
        assert!(out.starts_with("$ base64 .env\n") && out.ends_with("\n$ done"));
        // Hex wrapped at 60 columns (`xxd -p`).
        let hex: String = file.iter().map(|b| format!("{b:02x}")).collect();
        let lines: Vec<&str> = hex
            .as_bytes()
            .chunks(60)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        let text = lines.join("\n");
        let out = s.scrub_str(&text);
        assert!(out.contains("[REDACTED]"), "hex offset {prefix_len}: {out}");
    }
    // Ordinary wrapped base64 without the secret is left as it was.
    let other = b64(&[7u8; 200]);
    let lines: Vec<&str> = other
        .as_bytes()
        .chunks(76)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    let text = lines.join("\n");
    assert_eq!(s.scrub_str(&text), text);
}

#[test]
fn short_secrets_do_not_redact_everything() {
    // Six bytes: the value and its offset-0 encodings only; nothing shorter than 8 characters.
    let s = Scrubber::new(vec!["abc123".into()]);
    assert!(s.inner.needles.len() > 1);
    let text = "YWJj is not it, nor is 616263 alone; abc12 neither";
    assert_eq!(s.scrub_str(text), text);
    assert_eq!(s.scrub_str("YWJjMTIz"), "[REDACTED]");
    assert_eq!(s.scrub_str("616263313233"), "[REDACTED]");
}

#[test]
fn clean_value_sanitises_then_scrubs() {
    let s = Scrubber::new(vec!["plainvalue99".into()]);
    // An escape sequence and a zero-width space splitting the secret do not hide it.
    let mut v = json!({"out": "plain\u{1b}[0mvalue\u{200b}99 \u{7}done\r\n"});
    s.clean_value(&mut v);
    assert_eq!(v, json!({"out": "[REDACTED] \u{2407}done\n"}));
}

#[test]
fn a_learned_value_is_scrubbed_by_every_clone_from_then_on() {
    let s = Scrubber::default();
    let clone = s.clone();
    assert_eq!(clone.scrub_str("pw Tr0ub4dor here"), "pw Tr0ub4dor here");
    s.learn("Tr0ub4dor");
    s.learn("abc");
    assert_eq!(
        clone.scrub_str("pw Tr0ub4dor here, abc"),
        format!("pw {REDACTED} here, abc")
    );
    let mut v = json!({"echo": "You typed Tr0ub4dor"});
    clone.clean_value(&mut v);
    assert_eq!(v["echo"], format!("You typed {REDACTED}"));
}
