//! Which runs are due now: the occurrences since the last run, reduced by the job's catch-up
//! policy after a downtime, each with the run id that makes it exactly-once. Pure: times are
//! passed in.

use chrono::{DateTime, SecondsFormat, Timelike, Utc};
use serde::{Deserialize, Serialize};

use super::schedule::Compiled;

/// Most runs a `catch_up = "all"` job makes after a downtime (100): an hourly job down for
/// four days runs its last 100 occurrences, the older ones are dropped (counted in
/// [`Plan::missed`], not run). Each run is a turn: an unbounded backlog would flood the chat and
/// the token budget.
pub const CATCH_UP_ALL_CAP: usize = 100;

/// How late a run may start and still count as on time (60 s): the daemon's timer, a busy
/// machine or a short restart delay a run by seconds; only a run missed by more is "late" (and
/// dropped by `catch_up = "skip"`).
pub const ON_TIME_GRACE_SECS: i64 = 60;

/// Suffix of the run id of a run started by hand (`cron` action `run`, `weft cron run`): it is
/// not an occurrence of the schedule and never collides with one.
pub const MANUAL_SUFFIX: &str = "~manual";

/// Most missed occurrences counted for [`Plan::missed`] (10,000): counting walks the schedule.
const COUNT_LIMIT: u64 = 10_000;

/// What a job does about the occurrences it missed while the gateway was down.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CatchUp {
    /// One run now, flagged late, for all that were missed (the default).
    #[default]
    Once,
    /// Every missed occurrence, oldest first, at most [`CATCH_UP_ALL_CAP`].
    All,
    /// None: wait for the next occurrence.
    Skip,
}

/// The identity of one run: the job id and the scheduled time (RFC 3339 UTC, whole seconds),
/// e.g. `0193…@2026-11-24T09:00:00Z`. The dedupe key of the exactly-once path: the same
/// occurrence computed twice (two restarts, two timers) has the same id.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RunId(String);

impl RunId {
    /// The id of `job`'s run scheduled at `scheduled` (sub-second parts are dropped).
    pub fn new(job: &str, scheduled: DateTime<Utc>) -> Self {
        Self(format!(
            "{job}@{}",
            scheduled.to_rfc3339_opts(SecondsFormat::Secs, true)
        ))
    }

    /// The id of a run of `job` started by hand at `at`.
    pub fn manual(job: &str, at: DateTime<Utc>) -> Self {
        Self(format!("{}{MANUAL_SUFFIX}", Self::new(job, at).0))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The job id part (before the `@`).
    pub fn job(&self) -> &str {
        self.0.split_once('@').map_or(&self.0, |(j, _)| j)
    }
}

impl std::fmt::Display for RunId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One run to start now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// Its dedupe key.
    pub id: RunId,
    /// The occurrence it stands for.
    pub scheduled: DateTime<Utc>,
    /// Started more than [`ON_TIME_GRACE_SECS`] after it was due, or standing in for missed
    /// occurrences (`once`): the run says so to the agent and in the run history.
    pub late: bool,
    /// Started by hand, not by the schedule: it does not move the schedule.
    pub manual: bool,
}

impl Run {
    /// The run a run id stands for (its job id, occurrence and whether it was manual), read
    /// back from the id alone: a run finished after a restart is recorded with it. `late` is
    /// not in the id and comes back false. `None` for text that is not a run id.
    pub fn from_id(id: &str) -> Option<Self> {
        let (rest, manual) = match id.strip_suffix(MANUAL_SUFFIX) {
            Some(r) => (r, true),
            None => (id, false),
        };
        let (job, at) = rest.split_once('@')?;
        if job.is_empty() {
            return None;
        }
        let scheduled = DateTime::parse_from_rfc3339(at).ok()?.with_timezone(&Utc);
        Some(Self {
            id: RunId(id.to_string()),
            scheduled,
            late: false,
            manual,
        })
    }

    /// A run of `job` started by hand at `now`.
    pub fn manual(job: &str, now: DateTime<Utc>) -> Self {
        let at = now.with_nanosecond(0).unwrap_or(now);
        Self {
            id: RunId::manual(job, at),
            scheduled: at,
            late: false,
            manual: true,
        }
    }
}

/// The runs due now and what comes next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Runs to start now, oldest first.
    pub runs: Vec<Run>,
    /// Occurrences that were due more than the grace ago (missed), counted up to 10,000,
    /// including those run late.
    pub missed: u64,
    /// The next occurrence after `now` (`None`: the schedule is over, e.g. a past `at`).
    pub next: Option<DateTime<Utc>>,
}

/// The runs of `job` due at `now`, given its last scheduled run (or its creation time when it
/// never ran): the occurrences in `(last, now]`, reduced by `policy`. An occurrence within
/// [`ON_TIME_GRACE_SECS`] of `now` is on time and runs under every policy.
pub fn plan(
    job: &str,
    schedule: &Compiled,
    policy: CatchUp,
    last: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Plan {
    let cap = match policy {
        CatchUp::All => CATCH_UP_ALL_CAP,
        CatchUp::Once | CatchUp::Skip => 1,
    };
    let recent = schedule.latest(last, now, cap);
    let grace_start = now - chrono::TimeDelta::seconds(ON_TIME_GRACE_SECS);
    let missed = schedule.count(last, grace_start.max(last), COUNT_LIMIT);
    let next = recent
        .last()
        .map_or_else(|| schedule.next_after(last), |t| schedule.next_after(*t))
        .and_then(|n| {
            if n > now {
                Some(n)
            } else {
                schedule.next_after(now)
            }
        });
    let run = |t: DateTime<Utc>, late: bool| Run {
        id: RunId::new(job, t),
        scheduled: t,
        late,
        manual: false,
    };
    let runs = match policy {
        CatchUp::All => recent
            .into_iter()
            .map(|t| run(t, t < grace_start))
            .collect(),
        CatchUp::Once => recent.into_iter().map(|t| run(t, missed > 0)).collect(),
        CatchUp::Skip => recent
            .into_iter()
            .filter(|t| *t >= grace_start)
            .map(|t| run(t, false))
            .collect(),
    };
    Plan { runs, missed, next }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::scheduler::schedule::Schedule;
    use chrono::TimeZone;
    use pretty_assertions::assert_eq;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0)
            .single()
            .unwrap_or_default()
    }

    fn hourly() -> Compiled {
        Schedule::Cron {
            expr: "0 * * * *".into(),
            tz: Some("Europe/Berlin".into()),
        }
        .compile()
        .unwrap()
    }

    // An hourly job last run at 2026-11-20 10:00 UTC, the gateway down until 2026-11-23 10:30:
    // 72 occurrences missed (11:00 on the 20th … 10:00 on the 23rd).
    const LAST: (i32, u32, u32, u32, u32) = (2026, 11, 20, 10, 0);
    fn last() -> DateTime<Utc> {
        utc(LAST.0, LAST.1, LAST.2, LAST.3, LAST.4)
    }
    fn back() -> DateTime<Utc> {
        utc(2026, 11, 23, 10, 30)
    }

    #[test]
    fn once_after_three_days_down_runs_once_late_for_the_latest_occurrence() {
        let p = plan("job1", &hourly(), CatchUp::Once, last(), back());
        assert_eq!(
            p.runs,
            vec![Run {
                id: RunId("job1@2026-11-23T10:00:00Z".into()),
                scheduled: utc(2026, 11, 23, 10, 0),
                late: true,
                manual: false,
            }]
        );
        assert_eq!(p.missed, 72);
        assert_eq!(p.next, Some(utc(2026, 11, 23, 11, 0)));
    }

    #[test]
    fn all_after_three_days_down_runs_every_missed_occurrence_in_order() {
        let p = plan("job1", &hourly(), CatchUp::All, last(), back());
        assert_eq!(p.runs.len(), 72);
        assert_eq!(p.runs[0].scheduled, utc(2026, 11, 20, 11, 0));
        assert_eq!(p.runs[71].scheduled, utc(2026, 11, 23, 10, 0));
        assert!(p.runs.windows(2).all(|w| w[0].scheduled < w[1].scheduled));
        assert!(p.runs.iter().all(|r| r.late));
        assert_eq!(p.missed, 72);
        assert_eq!(p.next, Some(utc(2026, 11, 23, 11, 0)));
    }

    #[test]
    fn all_is_capped_at_the_most_recent_hundred() {
        // Five days down: 120 occurrences, the last 100 run.
        let p = plan(
            "j",
            &hourly(),
            CatchUp::All,
            last(),
            utc(2026, 11, 25, 10, 30),
        );
        assert_eq!(p.runs.len(), CATCH_UP_ALL_CAP);
        assert_eq!(p.missed, 120);
        assert_eq!(p.runs[0].scheduled, utc(2026, 11, 21, 7, 0));
        assert_eq!(p.runs[99].scheduled, utc(2026, 11, 25, 10, 0));
    }

    #[test]
    fn skip_after_three_days_down_runs_nothing_and_waits_for_the_next() {
        let p = plan("job1", &hourly(), CatchUp::Skip, last(), back());
        assert_eq!(p.runs, vec![]);
        assert_eq!(p.missed, 72);
        assert_eq!(p.next, Some(utc(2026, 11, 23, 11, 0)));
    }

    #[test]
    fn an_occurrence_on_time_runs_under_every_policy_and_is_not_late() {
        // The timer fired 2 s after 11:00.
        let now = utc(2026, 11, 20, 11, 0) + chrono::TimeDelta::seconds(2);
        for policy in [CatchUp::Once, CatchUp::All, CatchUp::Skip] {
            let p = plan("j", &hourly(), policy, last(), now);
            assert_eq!(
                p.runs,
                vec![Run {
                    id: RunId::new("j", utc(2026, 11, 20, 11, 0)),
                    scheduled: utc(2026, 11, 20, 11, 0),
                    late: false,
                    manual: false,
                }],
                "{policy:?}"
            );
            assert_eq!(p.missed, 0);
            assert_eq!(p.next, Some(utc(2026, 11, 20, 12, 0)));
        }
    }

    #[test]
    fn nothing_due_before_the_next_occurrence() {
        let p = plan(
            "j",
            &hourly(),
            CatchUp::Once,
            last(),
            utc(2026, 11, 20, 10, 59),
        );
        assert_eq!(p.runs, vec![]);
        assert_eq!(p.next, Some(utc(2026, 11, 20, 11, 0)));
    }

    #[test]
    fn every_catches_up_on_its_own_grid() {
        // Every 3600 s from 10:00:00 UTC; back at 13:30 → 11:00, 12:00, 13:00 missed.
        let every = Schedule::Every { seconds: 3600 }.compile().unwrap();
        let p = plan("e", &every, CatchUp::All, last(), utc(2026, 11, 20, 13, 30));
        let times: Vec<_> = p.runs.iter().map(|r| r.scheduled).collect();
        assert_eq!(
            times,
            vec![
                utc(2026, 11, 20, 11, 0),
                utc(2026, 11, 20, 12, 0),
                utc(2026, 11, 20, 13, 0)
            ]
        );
        assert_eq!(p.next, Some(utc(2026, 11, 20, 14, 0)));
        let once = plan(
            "e",
            &every,
            CatchUp::Once,
            last(),
            utc(2026, 11, 20, 13, 30),
        );
        assert_eq!(once.runs.len(), 1);
        assert_eq!(once.runs[0].scheduled, utc(2026, 11, 20, 13, 0));
        assert_eq!(once.missed, 3);
    }

    #[test]
    fn a_past_at_runs_once_late_then_is_over() {
        let at = Schedule::At {
            at: chrono::DateTime::parse_from_rfc3339("2026-11-20T12:00:00+01:00").unwrap(),
        }
        .compile()
        .unwrap();
        let created = utc(2026, 11, 19, 8, 0);
        let p = plan("a", &at, CatchUp::Once, created, back());
        assert_eq!(p.runs.len(), 1);
        assert_eq!(p.runs[0].scheduled, utc(2026, 11, 20, 11, 0));
        assert!(p.runs[0].late);
        assert_eq!(p.next, None);
        let skipped = plan("a", &at, CatchUp::Skip, created, back());
        assert_eq!((skipped.runs.len(), skipped.next), (0, None));
    }

    #[test]
    fn run_ids_are_stable_and_whole_seconds() {
        let t = utc(2026, 11, 23, 10, 0);
        let a = RunId::new("0193abcd", t);
        let b = RunId::new("0193abcd", t + chrono::TimeDelta::milliseconds(250));
        assert_eq!(a, b);
        assert_eq!(a.as_str(), "0193abcd@2026-11-23T10:00:00Z");
        // Computed again by a second plan (a restart), the id is the same.
        let p1 = plan("0193abcd", &hourly(), CatchUp::Once, last(), back());
        let p2 = plan(
            "0193abcd",
            &hourly(),
            CatchUp::Once,
            last(),
            back() + chrono::TimeDelta::seconds(20),
        );
        assert_eq!(p1.runs[0].id, p2.runs[0].id);
    }
}
