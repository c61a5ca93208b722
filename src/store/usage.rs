//! Token and spend counters: one record per (UTC day, session, chat user, model) under the
//! `u\0` prefix, its value a JSON [`UsageRow`] that each turn adds to.
//!
//! A record has one writer at a time: only its session's turn (and the calls made inside that
//! turn) adds to it, and a session runs one turn at a time, so the read-add-write of
//! [`Store::usage_ops`] loses nothing. The turn's records ride the batch of
//! [`Store::finish_turn_with`] (no flush of their own).

use serde::{Deserialize, Serialize};

use super::kv::Op;
use super::{decode, encode, Store, StoreError};

/// Spend and tokens of one (day, session, user, model), or a sum of several.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageRow {
    /// UTC day, `YYYY-MM-DD`.
    pub day: String,
    /// Session key.
    pub session: String,
    /// Chat user (the inbound event's sender); empty when unknown (subagents, memory calls).
    #[serde(default)]
    pub user: String,
    /// Model that answered.
    pub model: String,
    /// LLM calls.
    pub calls: u64,
    /// Prompt tokens (cached included).
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Prompt tokens served from the provider's cache.
    pub cached_tokens: u64,
    /// Calls whose usage the provider did not report, so it was estimated.
    #[serde(default)]
    pub estimated_calls: u64,
    /// US dollars, from the price table at the time of the call (0 for unpriced models).
    pub cost_usd: f64,
}

impl UsageRow {
    /// Add the counters of `o` (the identifying fields stay).
    pub fn add(&mut self, o: &UsageRow) {
        self.calls += o.calls;
        self.input_tokens += o.input_tokens;
        self.output_tokens += o.output_tokens;
        self.cached_tokens += o.cached_tokens;
        self.estimated_calls += o.estimated_calls;
        self.cost_usd += o.cost_usd;
    }

    /// Tokens that count against token budgets: input plus output.
    pub fn tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }
}

fn usage_key(r: &UsageRow) -> Vec<u8> {
    let mut k = b"u\0".to_vec();
    for (i, part) in [&r.day, &r.session, &r.user, &r.model].iter().enumerate() {
        if i > 0 {
            k.push(super::SEP);
        }
        k.extend(part.as_bytes());
    }
    k
}

impl Store {
    /// The writes that add `deltas` to their records (read now: call it from the records' one
    /// writer, see the module docs), to put in a batch. Deltas of the same record are merged.
    ///
    /// # Errors
    /// Backend failure or a corrupt record.
    pub fn usage_ops(&self, deltas: &[UsageRow]) -> Result<Vec<Op>, StoreError> {
        let mut merged: std::collections::BTreeMap<Vec<u8>, UsageRow> =
            std::collections::BTreeMap::new();
        for d in deltas {
            let k = usage_key(d);
            if let Some(r) = merged.get_mut(&k) {
                r.add(d);
                continue;
            }
            let mut row: UsageRow = match self.kv.get(&k)? {
                Some(v) => decode(&k, &v)?,
                None => UsageRow {
                    calls: 0,
                    input_tokens: 0,
                    output_tokens: 0,
                    cached_tokens: 0,
                    estimated_calls: 0,
                    cost_usd: 0.0,
                    ..d.clone()
                },
            };
            row.add(d);
            merged.insert(k, row);
        }
        merged
            .into_iter()
            .map(|(k, r)| Ok(Op::Put(k, encode(&r)?)))
            .collect()
    }

    /// Add `deltas` to their records now (not flushed: they ride the next flush).
    ///
    /// # Errors
    /// Backend failure or a corrupt record.
    pub fn record_usage(&self, deltas: &[UsageRow]) -> Result<(), StoreError> {
        let ops = self.usage_ops(deltas)?;
        self.kv.apply(ops)
    }

    /// Every usage record of `since` (a `YYYY-MM-DD` day) or later, oldest day first.
    ///
    /// # Errors
    /// Backend failure or a corrupt record.
    pub fn usage_rows(&self, since: &str) -> Result<Vec<UsageRow>, StoreError> {
        let mut start = b"u\0".to_vec();
        start.extend(since.as_bytes());
        self.kv
            .scan_prefix(b"u\0")?
            .iter()
            .filter(|(k, _)| k.as_slice() >= start.as_slice())
            .map(|(k, v)| decode(k, v))
            .collect()
    }
}

/// The UTC day (`YYYY-MM-DD`) of `ms` milliseconds since the epoch.
pub fn day_of(ms: u64) -> String {
    // Howard Hinnant's civil_from_days.
    let days = i64::try_from(ms / 86_400_000).unwrap_or(0);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The first day of the month of `day` (`YYYY-MM-01`).
pub fn month_start(day: &str) -> String {
    format!("{}-01", day.get(..7).unwrap_or(day))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn row(day: &str, session: &str, model: &str, input: u64) -> UsageRow {
        UsageRow {
            day: day.into(),
            session: session.into(),
            user: "u1".into(),
            model: model.into(),
            calls: 1,
            input_tokens: input,
            output_tokens: 1,
            cached_tokens: 0,
            estimated_calls: 0,
            cost_usd: 0.5,
        }
    }

    #[test]
    fn utc_days_and_months() {
        assert_eq!(day_of(0), "1970-01-01");
        // 2024-02-29T23:59:59.999Z and one millisecond later.
        assert_eq!(day_of(1_709_251_199_999), "2024-02-29");
        assert_eq!(day_of(1_709_251_200_000), "2024-03-01");
        assert_eq!(month_start("2024-03-17"), "2024-03-01");
    }

    #[test]
    fn records_add_up_per_key_and_scan_from_a_day() {
        let s = Store::memory();
        s.record_usage(&[row("2024-01-31", "a", "m", 10)]).unwrap();
        s.record_usage(&[
            row("2024-02-01", "a", "m", 10),
            row("2024-02-01", "a", "m", 5),
        ])
        .unwrap();
        s.record_usage(&[row("2024-02-01", "a", "m", 7)]).unwrap();
        let rows = s.usage_rows("2024-02-01").unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].input_tokens, 22);
        assert_eq!(rows[0].calls, 3);
        assert_eq!(s.usage_rows("2024-01-01").unwrap().len(), 2);
    }
}
