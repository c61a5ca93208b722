#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;

#[test]
fn signatures_are_checked_over_the_raw_body() {
    let body = br#"{"object":"whatsapp_business_account"}"#;
    let sig = sign("s3cret", body);
    assert!(signature_ok("s3cret", &sig, body));
    assert!(!signature_ok("other", &sig, body));
    assert!(!signature_ok("s3cret", &sig, b"{}"));
    assert!(!signature_ok("s3cret", "", body));
    assert!(!signature_ok(
        "s3cret",
        &sig.replace("sha256=", "sha1="),
        body
    ));
}

#[test]
fn long_replies_split_under_the_limit() {
    let text = "word ".repeat(3000);
    let c = chunks(&text);
    assert!(c.len() >= 4);
    assert!(c.iter().all(|c| c.chars().count() <= MAX_MESSAGE_CHARS));
    assert!(chunks("  ").is_empty());
}

#[test]
fn graph_errors_are_classified() {
    let e = |status, code| api::GraphError {
        status,
        code,
        message: "m".into(),
        retry_after: None,
    };
    for code in [130_429, 131_056, 80_007] {
        assert!(matches!(
            e(400, code).classify("k"),
            ChannelError::RateLimited {
                retry_after: Some(_)
            }
        ));
    }
    assert!(matches!(
        e(429, 0).classify("k"),
        ChannelError::RateLimited { .. }
    ));
    assert!(matches!(e(401, 190).classify("k"), ChannelError::Auth(_)));
    assert!(matches!(
        e(500, 1).classify("k"),
        ChannelError::Transient(_)
    ));
    assert!(matches!(
        e(400, 100).classify("k"),
        ChannelError::Rejected(_)
    ));
}
