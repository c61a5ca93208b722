//! Text sanitising shared by every path that lets outside text in.

/// Strip NUL, DEL and ASCII control characters except `\n`, `\r`, `\t` (seed 002).
pub fn sanitize_content(s: &str) -> String {
    s.chars()
        .filter(|&c| matches!(c, '\n' | '\r' | '\t') || !(c.is_ascii_control()))
        .collect()
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
