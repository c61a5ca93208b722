//! Where a chat user's own memory lives: `users/<channel>-<user>` beneath the workspace.

use super::embed::fnv1a;
pub use crate::tools::memory::{user_name, USERS_DIR};

/// Longest user directory name kept (bytes, before the hash suffix).
const MAX_NAME: usize = 80;

/// The memory directory of `sender` on `channel`, as the model sees it:
/// `users/<channel>-<sender>`. Bytes other than ASCII letters, digits, `.`, `_` and `-` become
/// `_`, a leading `.` too; a name that had to change (or was cut at 80 bytes) gets the FNV-1a
/// hash of the original appended, so two ids never share a directory.
pub fn user_dir(channel: &str, sender: &str) -> String {
    let raw = format!("{channel}-{sender}");
    let mut name: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.starts_with('.') {
        name.replace_range(0..1, "_");
    }
    let changed = name != raw || name.len() > MAX_NAME;
    name.truncate(MAX_NAME);
    if changed {
        name.push_str(&format!("-{:08x}", fnv1a(raw.as_bytes()) as u32));
    }
    format!("{USERS_DIR}/{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_ids_are_kept_and_others_are_made_safe_and_distinct() {
        assert_eq!(user_dir("telegram", "42"), "users/telegram-42");
        assert_eq!(user_dir("slack", "U01AB"), "users/slack-U01AB");
        let a = user_dir("http", "../../etc");
        assert!(a.starts_with("users/http-.._.._etc-"), "{a}");
        assert!(!a[USERS_DIR.len() + 1..].contains('/'));
        // Different ids that sanitise alike still get different directories.
        assert_ne!(user_dir("http", "a/b"), user_dir("http", "a_b"));
        assert_ne!(user_dir("http", "a/b"), user_dir("http", "a:b"));
        let long = user_dir("http", &"x".repeat(500));
        assert!(long.len() < 100, "{long}");
        assert_ne!(long, user_dir("http", &"x".repeat(501)));
        assert!(!user_dir(".", "x")[USERS_DIR.len() + 1..].starts_with('.'));
        assert_eq!(user_name("users/telegram-42"), "telegram-42");
    }
}
