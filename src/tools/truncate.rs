//! Type-aware truncation of tool results to a byte budget (seed 002): strings get a suffix,
//! arrays keep leading elements plus a sentinel, objects have their longest strings cut (and
//! are wrapped in `_truncated_json` when that is not enough).
//!
//! The budget is measured on the wire: a tool result reaches the provider as the `content`
//! string of a tool message, i.e. its JSON text JSON-encoded once more, where every escape of
//! binary output (`\u0001`) grows again. Must not decide what a tool may return; only its size.

use serde_json::{json, Value};

/// Bytes `v` takes in a provider request: its JSON text, encoded as a JSON string.
pub fn size(v: &Value) -> usize {
    serde_json::to_string(v)
        .and_then(|text| serde_json::to_string(&Value::String(text)))
        .map_or(usize::MAX, |s| s.len())
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

/// Cut a string so its wire size ([`size`]) fits `budget` bytes, with a suffix saying so.
fn truncate_string(s: &str, budget: usize) -> Value {
    let suffix = format!("\n... [truncated: {} bytes total]", s.len());
    // JSON escaping can grow text; shrink until the encoding fits.
    let mut keep = budget.saturating_sub(suffix.len() + 4);
    loop {
        let cut = floor_char(s, keep);
        let v = Value::String(format!("{cut}{suffix}"));
        if size(&v) <= budget || keep == 0 {
            return v;
        }
        // Escapes make some text take up to 7 bytes a byte on the wire: shrink in proportion.
        let n = size(&v);
        let scaled = cut.len().saturating_mul(budget) / n.max(1);
        keep = scaled.min(cut.len().saturating_sub(16));
    }
}

/// Truncate `v` so it takes at most `max` bytes in a provider request ([`size`]).
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
        Value::Object(map) => match shorten_strings(map, max) {
            Ok(v) => v,
            Err(v) => wrap(v, max, total),
        },
        other => wrap(other, max, total),
    }
}

/// Cut the long string members of an object until it fits `max`, keeping its shape (an exec
/// result keeps `exit_code`, `timed_out` and its `note`): every string gets at most the same
/// share of the room the other members leave, so stdout and stderr are both seen. `Err` with
/// the object when its strings are not what makes it large.
fn shorten_strings(mut map: serde_json::Map<String, Value>, max: usize) -> Result<Value, Value> {
    /// Room kept for the suffixes and rounding of each pass.
    const SLACK: usize = 64;
    for pass in 0..3 {
        let total = size(&Value::Object(map.clone()));
        if total <= max {
            return Ok(Value::Object(map));
        }
        let mut strings: Vec<(String, usize)> = map
            .iter()
            .filter_map(|(k, v)| v.as_str().map(|_| (k.clone(), size(v))))
            .collect();
        let in_strings: usize = strings.iter().map(|(_, n)| n).sum();
        let Some(mut room) =
            (max + in_strings).checked_sub(total + SLACK * (pass + 1) * strings.len().max(1))
        else {
            break;
        };
        // Water-filling: short strings stay whole, the rest share what is left equally.
        strings.sort_by_key(|(_, n)| *n);
        let mut ceiling = usize::MAX;
        for (i, (_, n)) in strings.iter().enumerate() {
            let left = strings.len() - i;
            if n.saturating_mul(left) <= room {
                room -= n;
            } else {
                ceiling = room / left;
                break;
            }
        }
        for (key, n) in strings {
            if n > ceiling {
                if let Some(Value::String(s)) = map.get(&key) {
                    let cut = truncate_string(s, ceiling);
                    map.insert(key, cut);
                }
            }
        }
    }
    let v = Value::Object(map);
    if size(&v) <= max {
        Ok(v)
    } else {
        Err(v)
    }
}

/// The whole value as text in `{"_truncated_json": …, "original_bytes": …}`.
fn wrap(other: Value, max: usize, total: usize) -> Value {
    let text = serde_json::to_string(&other).unwrap_or_default();
    let envelope_room = 128;
    let inner = truncate_string(&text, max.saturating_sub(envelope_room));
    json!({ "_truncated_json": inner, "original_bytes": total })
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
    fn objects_keep_their_shape_and_their_short_members() {
        let v = json!({ "content": "x".repeat(100_000), "exit_code": 0, "note": "timed out" });
        let out = truncate_result(v, 65_536);
        assert!(size(&out) <= 65_536, "{}", size(&out));
        let content = out["content"].as_str().unwrap();
        assert!(content.starts_with("xxx"));
        assert!(content.ends_with("[truncated: 100000 bytes total]"));
        assert_eq!(out["exit_code"], 0);
        assert_eq!(out["note"], "timed out");
    }

    #[test]
    fn objects_of_many_small_members_are_wrapped() {
        let v = Value::Object((0..10_000).map(|i| (format!("k{i}"), json!(i))).collect());
        let out = truncate_result(v, 65_536);
        assert!(out["_truncated_json"].as_str().unwrap().starts_with("{\"k"));
        assert!(out["original_bytes"].as_u64().unwrap() > 65_536);
        assert!(size(&out) <= 65_536);
    }

    #[test]
    fn binary_text_is_measured_as_the_provider_receives_it() {
        // Control characters escape to `\u0001` in the result's JSON, and that backslash is
        // escaped again in the request body.
        let s: String = (0..200_000u32)
            .map(|i| char::from_u32(i % 32).unwrap())
            .collect();
        let out = truncate_result(
            json!({ "stdout": s, "stderr": "e".repeat(300_000), "timed_out": true }),
            65_536,
        );
        let wire = serde_json::to_string(&Value::String(out.to_string()))
            .unwrap()
            .len();
        assert!(wire <= 65_536, "{wire}");
        assert_eq!(out["timed_out"], true);
        // Both streams get a share.
        assert!(out["stderr"].as_str().unwrap().len() > 20_000, "{out}");
        assert!(out["stdout"].as_str().unwrap().len() > 2_000, "{out}");
    }
}
