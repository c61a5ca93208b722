//! Text sanitising shared by every path that lets outside text in.

/// Strip NUL, DEL and ASCII control characters except `\n`, `\r`, `\t` (seed 002).
pub fn sanitize_content(s: &str) -> String {
    s.chars()
        .filter(|&c| matches!(c, '\n' | '\r' | '\t') || !(c.is_ascii_control()))
        .collect()
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
}
