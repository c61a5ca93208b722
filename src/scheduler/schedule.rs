//! When a job runs: a one-shot time (`at`), a fixed interval (`every`) or a cron expression in
//! an IANA time zone (`cron`), and the next occurrence after a given instant. Pure: no clock,
//! no store; the time zone database is the system's (`/usr/share/zoneinfo`, or `$TZDIR`).
//!
//! Daylight saving time follows Vixie cron / cronie: a fixed-time job
//! whose wall-clock time falls in a spring-forward gap runs once right after the gap (a daily
//! `30 2 * * *` in Europe/Berlin runs at 03:00 CEST on 2026-03-29); in a fall-back overlap it
//! runs once, at the first pass (02:30 CEST on 2026-10-25, not again at 02:30 CET). Jobs with
//! `*` or a step in the second, minute or hour field run on every matching wall-clock time that
//! exists, in both passes of a repeated hour.

use chrono::{DateTime, FixedOffset, Utc};
use serde::{Deserialize, Serialize};

use super::cron::CronExpr;
use super::tz::Zone;

/// Minimum interval of an `every` schedule unless configured otherwise (60 s): one run a minute
/// is already more turns than most jobs deserve.
pub const DEFAULT_MIN_INTERVAL_SECS: u64 = 60;

/// A job's schedule, in the `cron` tool's argument shape:
/// `{"kind":"at","at":"2026-12-01T09:00:00+01:00"}`, `{"kind":"every","seconds":3600}`,
/// `{"kind":"cron","expr":"0 9 * * 1-5","tz":"Europe/Berlin"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Schedule {
    /// Once, at this instant (the offset the user gave is kept for display).
    At {
        /// RFC 3339 with an offset.
        at: DateTime<FixedOffset>,
    },
    /// Every `seconds`, counted from the previous scheduled time (not from when the run
    /// finished, so runs do not drift).
    Every {
        /// The interval in seconds (at least the configured minimum).
        seconds: u64,
    },
    /// A cron expression, 5 fields (`min hour dom month dow`) or 6 with seconds first, in a
    /// time zone.
    Cron {
        /// The expression: numbers, `*`, ranges `a-b`, lists `a,b`, steps `*/n` and `a-b/n`,
        /// month and weekday names (`JAN`, `MON`); day of month and day of week match if
        /// either does (as in Vixie cron).
        expr: String,
        /// IANA time zone name (`Europe/Berlin`); `UTC` when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tz: Option<String>,
    },
}

/// Why a schedule was refused. The messages name the field and say how to fix it; the `cron`
/// tool hands them to the model as they are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// The cron expression does not parse.
    #[error("schedule.expr `{expr}` is not a valid cron expression ({detail}); use 5 fields `minute hour day-of-month month day-of-week` or 6 with seconds first, e.g. `0 9 * * 1-5`")]
    BadExpression {
        /// The expression as given.
        expr: String,
        /// The parser's message.
        detail: String,
    },
    /// The time zone is not in the system's time zone database.
    #[error("schedule.tz `{tz}` is not a time zone known to this system ({detail}); use an IANA name such as `Europe/Berlin` or `UTC` (the zone files come from the system's tzdata package, /usr/share/zoneinfo)")]
    UnknownTimeZone {
        /// The name as given.
        tz: String,
        /// What the lookup said.
        detail: String,
    },
    /// An `at` schedule in the past.
    #[error("schedule.at {at} is in the past (now is {now}); give a future time with its offset, e.g. `2026-12-01T09:00:00+01:00`")]
    PastAt {
        /// The time given.
        at: String,
        /// The current time.
        now: String,
    },
    /// An `every` interval below the minimum.
    #[error("schedule.seconds {seconds} is below the minimum interval of {min} s (setting `scheduler.min_interval_secs`)")]
    IntervalTooShort {
        /// The interval given.
        seconds: u64,
        /// The minimum.
        min: u64,
    },
    /// A cron expression that never matches (e.g. `0 0 30 2 *`, February 30th).
    #[error(
        "schedule.expr `{expr}` never matches a date; check the day of month against the month"
    )]
    NeverMatches {
        /// The expression.
        expr: String,
    },
}

/// A schedule checked and ready to compute occurrences: the cron expression parsed and the time
/// zone loaded once.
#[derive(Clone, Debug)]
pub struct Compiled {
    kind: CompiledKind,
}

#[derive(Clone, Debug)]
enum CompiledKind {
    At(DateTime<Utc>),
    Every(u64),
    Cron(Box<CronExpr>, Zone),
}

impl Schedule {
    /// Check the schedule as given by a user at `now`: the expression parses and matches some
    /// date, the zone exists, an `at` is in the future, an interval is at least
    /// `min_interval_secs`.
    ///
    /// # Errors
    /// [`ScheduleError`], naming the field and the fix.
    pub fn validate(
        &self,
        now: DateTime<Utc>,
        min_interval_secs: u64,
    ) -> Result<Compiled, ScheduleError> {
        if let Schedule::At { at } = self {
            if at.with_timezone(&Utc) <= now {
                return Err(ScheduleError::PastAt {
                    at: at.to_rfc3339(),
                    now: now.to_rfc3339(),
                });
            }
        }
        if let Schedule::Every { seconds } = self {
            if *seconds < min_interval_secs {
                return Err(ScheduleError::IntervalTooShort {
                    seconds: *seconds,
                    min: min_interval_secs,
                });
            }
        }
        let compiled = self.compile()?;
        if let Schedule::Cron { expr, .. } = self {
            if compiled.next_after(now).is_none() {
                return Err(ScheduleError::NeverMatches { expr: expr.clone() });
            }
        }
        Ok(compiled)
    }

    /// Parse the expression and load the zone, without the checks that depend on the time or
    /// the limits (a stored job is compiled again at every start: its `at` may be past by then).
    ///
    /// # Errors
    /// [`ScheduleError::BadExpression`], [`ScheduleError::UnknownTimeZone`] (the zone may have
    /// gone from the system since the job was added).
    pub fn compile(&self) -> Result<Compiled, ScheduleError> {
        let kind = match self {
            Schedule::At { at } => CompiledKind::At(at.with_timezone(&Utc)),
            Schedule::Every { seconds } => CompiledKind::Every((*seconds).max(1)),
            Schedule::Cron { expr, tz } => {
                let cron =
                    CronExpr::parse(expr).map_err(|detail| ScheduleError::BadExpression {
                        expr: expr.clone(),
                        detail: detail.to_string(),
                    })?;
                let name = tz.as_deref().unwrap_or("UTC");
                let zone = Zone::load(name).map_err(|detail| ScheduleError::UnknownTimeZone {
                    tz: name.to_string(),
                    detail: detail.to_string(),
                })?;
                CompiledKind::Cron(Box::new(cron), zone)
            }
        };
        Ok(Compiled { kind })
    }

    /// The first occurrence strictly after `t`. For `every`, `t` is the previous scheduled
    /// time (or the creation time), so the next is exactly `t + seconds`.
    ///
    /// # Errors
    /// As [`Schedule::compile`].
    pub fn next_after(&self, t: DateTime<Utc>) -> Result<Option<DateTime<Utc>>, ScheduleError> {
        Ok(self.compile()?.next_after(t))
    }
}

impl Compiled {
    /// The first occurrence strictly after `t`; `None` when there is none (an `at` already
    /// past, a cron expression that never matches again).
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.kind {
            CompiledKind::At(at) => (*at > t).then_some(*at),
            CompiledKind::Every(seconds) => {
                let secs = i64::try_from(*seconds).ok()?;
                t.checked_add_signed(chrono::TimeDelta::try_seconds(secs)?)
            }
            CompiledKind::Cron(cron, zone) => {
                // Whole seconds: a run id is a whole second.
                DateTime::from_timestamp(cron.next_after(zone, t.timestamp())?, 0)
            }
        }
    }

    /// The most recent occurrences in `(after, until]`, at most `cap` of them, oldest first.
    /// An `every` schedule counts from `after` (the previous scheduled time). Cheap after a long
    /// downtime: an interval is arithmetic, a cron expression is walked backwards from `until`.
    pub fn latest(
        &self,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
        cap: usize,
    ) -> Vec<DateTime<Utc>> {
        if until <= after || cap == 0 {
            return Vec::new();
        }
        match &self.kind {
            CompiledKind::At(at) => {
                if *at > after && *at <= until {
                    vec![*at]
                } else {
                    Vec::new()
                }
            }
            CompiledKind::Every(seconds) => {
                let step = i64::try_from(*seconds).unwrap_or(i64::MAX);
                let k = (until - after).num_seconds() / step;
                let first = (k - i64::try_from(cap).unwrap_or(i64::MAX) + 1).max(1);
                (first..=k)
                    .filter_map(|i| i.checked_mul(step))
                    .filter_map(chrono::TimeDelta::try_seconds)
                    .filter_map(|d| after.checked_add_signed(d))
                    .collect()
            }
            CompiledKind::Cron(cron, zone) => {
                let mut out = Vec::new();
                let mut cursor = until.timestamp();
                while out.len() < cap {
                    let Some(prev) = cron.prev_at_or_before(zone, cursor) else {
                        break;
                    };
                    let Some(t) = DateTime::from_timestamp(prev, 0).filter(|t| *t > after) else {
                        break;
                    };
                    out.push(t);
                    cursor = prev - 1;
                }
                out.reverse();
                out
            }
        }
    }

    /// How many occurrences fall in `(after, until]`, counting at most `limit` (a cron
    /// expression is walked; an interval is arithmetic).
    pub fn count(&self, after: DateTime<Utc>, until: DateTime<Utc>, limit: u64) -> u64 {
        if until <= after {
            return 0;
        }
        match &self.kind {
            CompiledKind::At(at) => u64::from(*at > after && *at <= until),
            CompiledKind::Every(seconds) => {
                let k = u64::try_from((until - after).num_seconds()).unwrap_or(0) / seconds;
                k.min(limit)
            }
            CompiledKind::Cron(..) => {
                let mut n = 0;
                let mut t = after;
                while n < limit {
                    match self.next_after(t) {
                        Some(next) if next <= until => {
                            n += 1;
                            t = next;
                        }
                        _ => break,
                    }
                }
                n
            }
        }
    }
}

#[cfg(test)]
#[path = "schedule_tests.rs"]
mod tests;
