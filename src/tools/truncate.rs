//! Type-aware truncation of tool results to a byte budget (seed 002): strings get a suffix,
//! arrays keep leading elements plus a sentinel, objects are wrapped in `_truncated_json`.

use serde_json::{json, Value};

fn size(v: &Value) -> usize {
    serde_json::to_string(v).map_or(usize::MAX, |s| s.len())
}

/// The largest prefix of `s` that is at most `max` bytes and ends on a char boundary.
pub fn floor_char(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Cut a string so its JSON encoding fits `budget` bytes, with a suffix saying so.
fn truncate_string(s: &str, budget: usize) -> Value {
    let suffix = format!("\n... [truncated: {} bytes total]", s.len());
    // JSON escaping can grow text; shrink until the encoding fits.
    let mut keep = budget.saturating_sub(suffix.len() + 2);
    loop {
        let cut = floor_char(s, keep);
        let v = Value::String(format!("{cut}{suffix}"));
        if size(&v) <= budget || keep == 0 {
            return v;
        }
        let over = size(&v) - budget;
        keep = cut.len().saturating_sub(over.max(16));
    }
}

/// Truncate `v` so its JSON encoding is at most `max` bytes (or close to it for the envelope).
pub fn truncate_result(v: Value, max: usize) -> Value {
    let total = size(&v);
    if total <= max {
        return v;
    }
    match v {
        Value::String(s) => truncate_string(&s, max),
        Value::Array(items) => {
            let n = items.len();
            let sentinel_room = 96;
            let mut used = 2;
            let mut kept = Vec::new();
            for item in items {
                let sz = size(&item) + 1;
                if used + sz + sentinel_room > max {
                    break;
                }
                used += sz;
                kept.push(item);
            }
            let shown = kept.len();
            kept.push(json!({ "_truncated": true, "total_items": n, "shown_items": shown }));
            Value::Array(kept)
        }
        other => {
            let text = serde_json::to_string(&other).unwrap_or_default();
            let envelope_room = 128;
            let inner = truncate_string(&text, max.saturating_sub(envelope_room));
            json!({ "_truncated_json": inner, "original_bytes": total })
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn small_values_pass_unchanged() {
        let v = json!({"a": 1});
        assert_eq!(truncate_result(v.clone(), 100), v);
    }

    #[test]
    fn strings_get_suffix_and_fit_even_with_escapes_and_multibyte() {
        for unit in ["a", "é", "\"", "✓\n"] {
            let s = unit.repeat(50_000);
            let v = truncate_result(Value::String(s.clone()), 1000);
            let out = v.as_str().unwrap();
            assert!(size(&v) <= 1000, "{unit}: {}", size(&v));
            assert!(out.contains(&format!("[truncated: {} bytes total]", s.len())));
            assert!(s.starts_with(out.split("\n... [truncated").next().unwrap()));
        }
    }

    #[test]
    fn arrays_keep_leading_items_and_sentinel() {
        let v = Value::Array((0..10_000).map(|i| json!({ "i": i })).collect());
        let out = truncate_result(v, 1000);
        let arr = out.as_array().unwrap();
        assert!(size(&out) <= 1000);
        assert_eq!(arr[0], json!({"i": 0}));
        let last = arr.last().unwrap();
        assert_eq!(last["_truncated"], json!(true));
        assert_eq!(last["total_items"], json!(10_000));
        assert_eq!(last["shown_items"], json!(arr.len() - 1));
    }

    #[test]
    fn objects_are_wrapped() {
        let v = json!({ "content": "x".repeat(100_000) });
        let out = truncate_result(v, 65_536);
        assert!(out["_truncated_json"]
            .as_str()
            .unwrap()
            .starts_with("{\"content\":\"xxx"));
        assert!(out["original_bytes"].as_u64().unwrap() > 100_000);
        assert!(size(&out) <= 65_536);
    }
}
