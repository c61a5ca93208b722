//! Cron expressions: 5 fields (`minute hour day-of-month month day-of-week`) or 6 with seconds
//! first; `*`, numbers, ranges `a-b`, lists `a,b`, steps `*/n` and `a-b/n`, month and weekday
//! names. Day of month and day of week match if either does when both are restricted (Vixie
//! cron). Occurrences are found on the wall clock of a [`Zone`] with Vixie cron's daylight
//! saving rules (see [`super::schedule`]).

use chrono::{Datelike, NaiveDate, NaiveDateTime, TimeDelta, Timelike};

use super::tz::Zone;

/// Years searched ahead for a match (10): February 29th recurs within 8.
const SEARCH_YEARS: i32 = 10;
/// Longest repeated hour looked through for an earlier instant (3 h, more than any zone's).
const OVERLAP_SECS: i64 = 3 * 3600;

/// A parsed cron expression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CronExpr {
    seconds: u64,
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    /// Day of month or day of week starts with `*`: the other alone decides.
    dom_star: bool,
    dow_star: bool,
    /// Seconds, minutes and hours are fixed (no `*`): in a skipped hour it runs at the jump,
    /// in a repeated hour once.
    fixed_time: bool,
}

const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// What is wrong with a cron expression, naming the field (`what`: `minute`, `day-of-week`…).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    /// Not 5 or 6 fields.
    #[error("it has {0} fields")]
    FieldCount(usize),
    /// A value that is neither a number nor (where the field has names) a name.
    #[error("{what} `{text}` is not a number{}", if *.named { " or a name" } else { "" })]
    NotANumber {
        /// The field.
        what: &'static str,
        /// The value as written.
        text: String,
        /// Whether the field also takes names (`MON`, `JAN`).
        named: bool,
    },
    /// A value outside the field's range.
    #[error("{what} {value} is out of range {min}-{max}")]
    OutOfRange {
        /// The field.
        what: &'static str,
        /// The value.
        value: u32,
        /// The field's least value.
        min: u32,
        /// The field's greatest value.
        max: u32,
    },
    /// A step that is not a number.
    #[error("{what} step `{text}` is not a number")]
    BadStep {
        /// The field.
        what: &'static str,
        /// The step as written.
        text: String,
    },
    /// A step of 0.
    #[error("{0} step must be at least 1")]
    ZeroStep(&'static str),
    /// A range whose end is before its start.
    #[error("{what} range {from}-{to} goes backwards")]
    Backwards {
        /// The field.
        what: &'static str,
        /// The start.
        from: u32,
        /// The end.
        to: u32,
    },
    /// `5/2`: a step after a single value.
    #[error("{what} step `{item}` needs a range or `*` before the `/`")]
    StepNeedsRange {
        /// The field.
        what: &'static str,
        /// The item as written.
        item: String,
    },
}

fn field(
    text: &str,
    what: &'static str,
    min: u32,
    max: u32,
    names: &[&str],
    base: u32,
) -> Result<u64, CronError> {
    let value = |s: &str| -> Result<u32, CronError> {
        if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(s)) {
            return Ok(base + i as u32);
        }
        let v: u32 = s.parse().map_err(|_| CronError::NotANumber {
            what,
            text: s.to_string(),
            named: !names.is_empty(),
        })?;
        if v < min || v > max {
            return Err(CronError::OutOfRange {
                what,
                value: v,
                min,
                max,
            });
        }
        Ok(v)
    };
    let mut bits = 0u64;
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s.parse().map_err(|_| CronError::BadStep {
                    what,
                    text: s.to_string(),
                })?;
                if step == 0 {
                    return Err(CronError::ZeroStep(what));
                }
                (r, step)
            }
            None => (item, 1),
        };
        let (lo, hi) = if range == "*" {
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            let (a, b) = (value(a)?, value(b)?);
            if a > b {
                return Err(CronError::Backwards {
                    what,
                    from: a,
                    to: b,
                });
            }
            (a, b)
        } else {
            if step != 1 {
                return Err(CronError::StepNeedsRange {
                    what,
                    item: item.to_string(),
                });
            }
            let v = value(range)?;
            (v, v)
        };
        let mut v = lo;
        while v <= hi {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok(bits)
}

impl CronExpr {
    /// Parse an expression.
    ///
    /// # Errors
    /// What is wrong, naming the field.
    pub fn parse(expr: &str) -> Result<Self, CronError> {
        let parts: Vec<&str> = expr.split_whitespace().collect();
        let (sec, rest) = match parts.len() {
            5 => ("0", &parts[..]),
            6 => (parts[0], &parts[1..]),
            n => return Err(CronError::FieldCount(n)),
        };
        let mut weekdays = field(rest[4], "day-of-week", 0, 7, &DAYS, 0)?;
        if weekdays & (1 << 7) != 0 {
            weekdays = (weekdays | 1) & !(1 << 7);
        }
        Ok(Self {
            seconds: field(sec, "second", 0, 59, &[], 0)?,
            minutes: field(rest[0], "minute", 0, 59, &[], 0)?,
            hours: field(rest[1], "hour", 0, 23, &[], 0)?,
            days: field(rest[2], "day-of-month", 1, 31, &[], 0)?,
            months: field(rest[3], "month", 1, 12, &MONTHS, 1)?,
            weekdays,
            dom_star: rest[2].starts_with('*'),
            dow_star: rest[4].starts_with('*'),
            fixed_time: !(sec.contains('*') || rest[0].contains('*') || rest[1].contains('*')),
        })
    }

    fn day_matches(&self, d: NaiveDate) -> bool {
        let dom = self.days & (1 << d.day()) != 0;
        let dow = self.weekdays & (1 << d.weekday().num_days_from_sunday()) != 0;
        match (self.dom_star, self.dow_star) {
            (true, true) | (false, true) => dom,
            (true, false) => dow,
            (false, false) => dom || dow,
        }
    }

    /// The first wall-clock time at or after `from` (whole seconds) that matches.
    fn next_civil(&self, from: NaiveDateTime) -> Option<NaiveDateTime> {
        let limit = from.year() + SEARCH_YEARS;
        let mut t = from.with_nanosecond(0)?;
        loop {
            if t.year() > limit {
                return None;
            }
            let date = t.date();
            if self.months & (1 << t.month()) == 0 {
                let (y, m) = if t.month() == 12 {
                    (t.year() + 1, 1)
                } else {
                    (t.year(), t.month() + 1)
                };
                t = NaiveDate::from_ymd_opt(y, m, 1)?.and_hms_opt(0, 0, 0)?;
            } else if !self.day_matches(date) {
                t = date.succ_opt()?.and_hms_opt(0, 0, 0)?;
            } else if self.hours & (1 << t.hour()) == 0 {
                t = date.and_hms_opt(t.hour(), 0, 0)? + TimeDelta::hours(1);
            } else if self.minutes & (1 << t.minute()) == 0 {
                t = date.and_hms_opt(t.hour(), t.minute(), 0)? + TimeDelta::minutes(1);
            } else if self.seconds & (1 << t.second()) == 0 {
                t += TimeDelta::seconds(1);
            } else {
                return Some(t);
            }
        }
    }

    /// The instants (UTC seconds) of the wall-clock match `civil` in `zone`: one; in a repeated
    /// hour both (a fixed-time job: the first only); in a skipped hour none (a fixed-time job:
    /// the instant of the jump).
    fn instants(&self, zone: &Zone, civil: NaiveDateTime) -> Vec<i64> {
        let local = civil.and_utc().timestamp();
        let mut all = zone.instants(local);
        match all.len() {
            0 if self.fixed_time => vec![zone.first_at_or_after(local)],
            2 if self.fixed_time => {
                all.truncate(1);
                all
            }
            _ => all,
        }
    }

    /// The first occurrence strictly after the instant `t` (UTC seconds) on `zone`'s clock.
    pub fn next_after(&self, zone: &Zone, t: i64) -> Option<i64> {
        // Start from the earliest wall-clock reading near `t`: in a repeated hour the second
        // pass reads earlier than the first.
        let low = [t - 86_400, t, t + 86_400]
            .iter()
            .map(|p| zone.offset_at(*p))
            .min()
            .unwrap_or(0);
        let mut civil = chrono::DateTime::from_timestamp(t + i64::from(low), 0)?.naive_utc();
        let mut best: Option<(i64, NaiveDateTime)> = None;
        loop {
            let m = self.next_civil(civil)?;
            if let Some((_, first)) = best {
                // A later wall-clock time can be an earlier instant only within a repeated hour.
                if (m - first).num_seconds() > OVERLAP_SECS {
                    return best.map(|(u, _)| u);
                }
            }
            for u in self.instants(zone, m) {
                if u > t && best.is_none_or(|(b, _)| u < b) {
                    best = Some((u, best.map_or(m, |(_, f)| f)));
                }
            }
            if let Some((u, _)) = best {
                // No transition near: the first match is the answer.
                if zone.offset_at(u - OVERLAP_SECS) == zone.offset_at(u + OVERLAP_SECS) {
                    return Some(u);
                }
            }
            civil = m + TimeDelta::seconds(1);
        }
    }

    /// The last occurrence at or before the instant `t` (UTC seconds), searching back at most
    /// `SEARCH_YEARS` years.
    pub fn prev_at_or_before(&self, zone: &Zone, t: i64) -> Option<i64> {
        // Step back in growing windows and take the last occurrence found in one.
        let mut window = 3600_i64;
        let floor = t - i64::from(SEARCH_YEARS) * 366 * 86_400;
        let mut hi = t;
        while hi > floor {
            let lo = hi - window;
            let mut cur = lo - 1;
            let mut last = None;
            while let Some(n) = self.next_after(zone, cur) {
                if n > hi {
                    break;
                }
                last = Some(n);
                cur = n;
            }
            if last.is_some() {
                return last;
            }
            hi = lo - 1;
            window = (window * 4).min(366 * 86_400);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn fields_parse_with_names_ranges_lists_and_steps() {
        let c = CronExpr::parse("*/15 8-18/5 1,15 JAN-mar mon-FRI").unwrap();
        assert_eq!(c.seconds, 1);
        assert_eq!(c.minutes, (1 << 0) | (1 << 15) | (1 << 30) | (1 << 45));
        assert_eq!(c.hours, (1 << 8) | (1 << 13) | (1 << 18));
        assert_eq!(c.days, (1 << 1) | (1 << 15));
        assert_eq!(c.months, 0b1110);
        assert_eq!(c.weekdays, 0b111110);
        assert!(!c.fixed_time && !c.dom_star && !c.dow_star);
        // Sunday as 7.
        assert_eq!(CronExpr::parse("0 0 * * 7").unwrap().weekdays, 1);
        assert!(CronExpr::parse("0 30 2 * * *").unwrap().fixed_time);
    }

    #[test]
    fn bad_fields_say_what_is_wrong() {
        for (e, msg) in [
            ("0 9 * *", "it has 4 fields"),
            ("61 * * * *", "minute 61 is out of range 0-59"),
            ("0 24 * * *", "hour 24 is out of range 0-23"),
            ("0 0 0 * *", "day-of-month 0 is out of range 1-31"),
            ("0 0 * 13 *", "month 13 is out of range 1-12"),
            ("0 0 * * FOO", "day-of-week `FOO` is not a number or a name"),
            ("*/0 * * * *", "minute step must be at least 1"),
            (
                "5/10 * * * *",
                "minute step `5/10` needs a range or `*` before the `/`",
            ),
            ("0 10-2 * * *", "hour range 10-2 goes backwards"),
            ("0 0 9 * * * 2027", "it has 7 fields"),
        ] {
            assert_eq!(CronExpr::parse(e).unwrap_err().to_string(), msg, "{e}");
        }
    }
}
