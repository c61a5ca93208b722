#![allow(clippy::unwrap_used, clippy::expect_used)]

use chrono::TimeZone;
use pretty_assertions::assert_eq;
use serde_json::json;

use super::*;

fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, s).single().unwrap()
}

fn cron(expr: &str, tz: &str) -> Schedule {
    Schedule::Cron {
        expr: expr.into(),
        tz: Some(tz.into()),
    }
}

fn now() -> DateTime<Utc> {
    utc(2026, 11, 24, 12, 0, 0)
}

#[test]
fn the_three_kinds_parse_from_the_tool_argument_shape() {
    let at: Schedule =
        serde_json::from_value(json!({"kind":"at","at":"2026-12-01T09:00:00+01:00"})).unwrap();
    assert_eq!(
        at,
        Schedule::At {
            at: DateTime::parse_from_rfc3339("2026-12-01T09:00:00+01:00").unwrap()
        }
    );
    let every: Schedule = serde_json::from_value(json!({"kind":"every","seconds":3600})).unwrap();
    assert_eq!(every, Schedule::Every { seconds: 3600 });
    let c: Schedule =
        serde_json::from_value(json!({"kind":"cron","expr":"0 9 * * 1-5","tz":"Europe/Berlin"}))
            .unwrap();
    assert_eq!(c, cron("0 9 * * 1-5", "Europe/Berlin"));
    let no_tz: Schedule =
        serde_json::from_value(json!({"kind":"cron","expr":"0 9 * * *"})).unwrap();
    assert_eq!(
        no_tz,
        Schedule::Cron {
            expr: "0 9 * * *".into(),
            tz: None
        }
    );
}

#[test]
fn schedules_serialise_back_to_the_same_shape() {
    for v in [
        json!({"kind":"at","at":"2026-12-01T09:00:00+01:00"}),
        json!({"kind":"every","seconds":3600}),
        json!({"kind":"cron","expr":"0 9 * * 1-5","tz":"Europe/Berlin"}),
    ] {
        let s: Schedule = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(&s).unwrap(), v);
    }
}

#[test]
fn malformed_arguments_are_refused_by_serde_with_the_field() {
    for (v, needle) in [
        (json!({"kind":"weekly"}), "unknown variant `weekly`"),
        (json!({"kind":"every"}), "missing field `seconds`"),
        (json!({"kind":"every","seconds":-5}), "invalid value"),
        (
            json!({"kind":"at","at":"tomorrow"}),
            "input contains invalid characters",
        ),
        (
            json!({"kind":"cron","expr":"* * * * *","zone":"UTC"}),
            "unknown field `zone`",
        ),
    ] {
        let err = serde_json::from_value::<Schedule>(v.clone())
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{v}: {err}");
    }
}

#[test]
fn good_schedules_validate() {
    for s in [
        cron("0 9 * * 1-5", "Europe/Berlin"),
        cron("*/15 8-18 * * MON-FRI", "America/New_York"),
        cron("30 0 9 1,15 JAN,JUL *", "Asia/Tokyo"),
        cron("0 0 29 2 *", "UTC"),
        Schedule::Cron {
            expr: "0 12 * * SUN".into(),
            tz: None,
        },
        Schedule::Every { seconds: 60 },
        Schedule::At {
            at: DateTime::parse_from_rfc3339("2026-12-01T09:00:00+01:00").unwrap(),
        },
    ] {
        assert!(
            s.validate(now(), DEFAULT_MIN_INTERVAL_SECS).is_ok(),
            "{s:?}"
        );
    }
}

#[test]
fn bad_schedules_are_refused_with_a_message_naming_the_field_and_the_fix() {
    let cases = [
        (
            cron("0 9 * *", "UTC"),
            "schedule.expr `0 9 * *` is not a valid cron expression",
        ),
        (cron("61 * * * *", "UTC"), "schedule.expr `61 * * * *` is not a valid cron expression"),
        (cron("0 9 * * 1-5 2027", "UTC"), "use 5 fields"),
        (cron("0 0 9 * * * 2027", "UTC"), "is not a valid cron expression"),
        (cron("0 9 * * FOO", "UTC"), "is not a valid cron expression"),
        (
            cron("0 9 * * *", "Europe/Atlantis"),
            "schedule.tz `Europe/Atlantis` is not a time zone known to this system",
        ),
        (cron("0 9 * * *", "../../etc/passwd"), "schedule.tz `../../etc/passwd`"),
        (cron("0 0 30 2 *", "UTC"), "schedule.expr `0 0 30 2 *` never matches a date"),
        (
            Schedule::Every { seconds: 1 },
            "schedule.seconds 1 is below the minimum interval of 60 s (setting `scheduler.min_interval_secs`)",
        ),
        (
            Schedule::At {
                at: DateTime::parse_from_rfc3339("2026-11-24T12:00:00+00:00").unwrap(),
            },
            "schedule.at 2026-11-24T12:00:00+00:00 is in the past (now is 2026-11-24T12:00:00+00:00)",
        ),
    ];
    for (s, needle) in cases {
        let err = s
            .validate(now(), DEFAULT_MIN_INTERVAL_SECS)
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{s:?}: {err}");
    }
}

#[test]
fn the_minimum_interval_is_a_parameter() {
    let s = Schedule::Every { seconds: 30 };
    assert!(s.validate(now(), 10).is_ok());
    assert_eq!(
        s.validate(now(), 60).unwrap_err(),
        ScheduleError::IntervalTooShort {
            seconds: 30,
            min: 60
        }
    );
}

#[test]
fn seconds_are_optional_six_fields_put_them_first() {
    let five = cron("30 9 * * *", "UTC").compile().unwrap();
    let six = cron("15 30 9 * * *", "UTC").compile().unwrap();
    let t = utc(2026, 11, 24, 0, 0, 0);
    assert_eq!(five.next_after(t), Some(utc(2026, 11, 24, 9, 30, 0)));
    assert_eq!(six.next_after(t), Some(utc(2026, 11, 24, 9, 30, 15)));
}

#[test]
fn next_is_strictly_after_the_given_time() {
    let c = cron("0 9 * * *", "UTC").compile().unwrap();
    let nine = utc(2026, 11, 24, 9, 0, 0);
    assert_eq!(c.next_after(nine), Some(utc(2026, 11, 25, 9, 0, 0)));
    assert_eq!(
        c.next_after(nine - chrono::TimeDelta::seconds(1)),
        Some(nine)
    );
}

#[test]
fn weekdays_in_a_zone_cross_the_weekend() {
    // Friday 2026-11-27 09:00 Berlin (08:00 UTC) → Monday 2026-11-30 09:00 Berlin.
    let c = cron("0 9 * * 1-5", "Europe/Berlin").compile().unwrap();
    assert_eq!(
        c.next_after(utc(2026, 11, 27, 8, 0, 0)),
        Some(utc(2026, 11, 30, 8, 0, 0))
    );
}

#[test]
fn next_crosses_months_and_years() {
    let c = cron("0 0 31 * *", "UTC").compile().unwrap();
    // After January 31st the next 31st is March (February has none).
    assert_eq!(
        c.next_after(utc(2027, 1, 31, 0, 0, 0)),
        Some(utc(2027, 3, 31, 0, 0, 0))
    );
    let newyear = cron("0 0 1 1 *", "Europe/Berlin").compile().unwrap();
    assert_eq!(
        newyear.next_after(utc(2026, 6, 1, 0, 0, 0)),
        Some(utc(2026, 12, 31, 23, 0, 0))
    );
}

#[test]
fn february_29th_waits_for_the_leap_year() {
    let c = cron("0 12 29 2 *", "UTC").compile().unwrap();
    assert_eq!(
        c.next_after(utc(2026, 11, 24, 0, 0, 0)),
        Some(utc(2028, 2, 29, 12, 0, 0))
    );
    assert_eq!(
        c.next_after(utc(2028, 2, 29, 12, 0, 0)),
        Some(utc(2032, 2, 29, 12, 0, 0))
    );
}

#[test]
fn day_of_month_or_day_of_week_as_vixie_cron() {
    // The 1st of the month or any Monday: after Sat 2026-11-28, Mon 11-30, then Tue 12-01.
    let c = cron("0 9 1 * MON", "UTC").compile().unwrap();
    let a = c.next_after(utc(2026, 11, 28, 0, 0, 0)).unwrap();
    assert_eq!(a, utc(2026, 11, 30, 9, 0, 0));
    assert_eq!(c.next_after(a), Some(utc(2026, 12, 1, 9, 0, 0)));
}

/// Spring forward in Europe/Berlin: 2026-03-29 02:00 CET → 03:00 CEST; 02:30 does not exist.
/// As Vixie cron/cronie, the daily 02:30 job runs once right after the gap, at 03:00 CEST
/// (01:00 UTC), and at 02:30 CEST the next day.
#[test]
fn daily_0230_in_berlin_runs_at_0300_on_the_spring_forward_day() {
    let c = cron("30 2 * * *", "Europe/Berlin").compile().unwrap();
    let day_before = utc(2026, 3, 28, 1, 30, 0); // 02:30 CET
    assert_eq!(
        c.next_after(day_before - chrono::TimeDelta::seconds(1)),
        Some(day_before)
    );
    let spring = c.next_after(day_before).unwrap();
    assert_eq!(spring, utc(2026, 3, 29, 1, 0, 0)); // 03:00 CEST
    assert_eq!(c.next_after(spring), Some(utc(2026, 3, 30, 0, 30, 0))); // 02:30 CEST
                                                                        // Exactly one run that day.
    assert_eq!(
        c.count(utc(2026, 3, 28, 23, 0, 0), utc(2026, 3, 29, 22, 0, 0), 10),
        1
    );
}

/// Fall back in Europe/Berlin: 2026-10-25 03:00 CEST → 02:00 CET; 02:30 happens twice. The
/// daily job runs once, at the first 02:30 (CEST, 00:30 UTC).
#[test]
fn daily_0230_in_berlin_runs_once_on_the_fall_back_day() {
    let c = cron("30 2 * * *", "Europe/Berlin").compile().unwrap();
    let first = c.next_after(utc(2026, 10, 24, 12, 0, 0)).unwrap();
    assert_eq!(first, utc(2026, 10, 25, 0, 30, 0));
    let next = c.next_after(first).unwrap();
    assert_eq!(next, utc(2026, 10, 26, 1, 30, 0)); // 02:30 CET the next day
    assert_eq!(
        c.count(utc(2026, 10, 24, 22, 0, 0), utc(2026, 10, 25, 22, 0, 0), 10),
        1
    );
}

/// A job with a wildcard hour runs on every wall-clock time that exists: in the repeated hour
/// both passes (as cron does for non-fixed jobs), none in the missing hour.
#[test]
fn an_every_half_hour_job_across_the_berlin_transitions() {
    let c = cron("*/30 * * * *", "Europe/Berlin").compile().unwrap();
    // Spring: 01:30 CET (00:30 UTC), then 03:00 CEST (01:00 UTC).
    assert_eq!(
        c.latest(utc(2026, 3, 29, 0, 0, 0), utc(2026, 3, 29, 1, 0, 0), 10),
        vec![utc(2026, 3, 29, 0, 30, 0), utc(2026, 3, 29, 1, 0, 0)]
    );
    // Autumn: 02:00 and 02:30 twice (00:00, 00:30 UTC in CEST; 01:00, 01:30 UTC in CET).
    assert_eq!(
        c.count(
            utc(2026, 10, 24, 23, 45, 0),
            utc(2026, 10, 25, 1, 45, 0),
            10
        ),
        4
    );
}

#[test]
fn every_adds_the_interval_to_the_previous_scheduled_time() {
    let e = Schedule::Every { seconds: 3600 }.compile().unwrap();
    let last = utc(2026, 11, 24, 10, 0, 0);
    // A run that finished late does not move the grid: next is last + interval.
    assert_eq!(e.next_after(last), Some(utc(2026, 11, 24, 11, 0, 0)));
    let mut t = last;
    for _ in 0..24 {
        t = e.next_after(t).unwrap();
    }
    assert_eq!(t, utc(2026, 11, 25, 10, 0, 0));
    assert_eq!(
        e.latest(last, utc(2026, 11, 24, 13, 59, 0), 10),
        vec![
            utc(2026, 11, 24, 11, 0, 0),
            utc(2026, 11, 24, 12, 0, 0),
            utc(2026, 11, 24, 13, 0, 0)
        ]
    );
    assert_eq!(e.count(last, utc(2026, 11, 27, 10, 0, 0), 1000), 72);
}

#[test]
fn at_fires_once() {
    let s = Schedule::At {
        at: DateTime::parse_from_rfc3339("2026-12-01T09:00:00+01:00").unwrap(),
    };
    let c = s.validate(now(), 60).unwrap();
    let when = utc(2026, 12, 1, 8, 0, 0);
    assert_eq!(c.next_after(now()), Some(when));
    assert_eq!(c.next_after(when), None);
    assert_eq!(s.next_after(now()).unwrap(), Some(when));
}

#[test]
fn latest_walks_back_from_until_and_keeps_the_most_recent() {
    let c = cron("0 * * * *", "UTC").compile().unwrap();
    let got = c.latest(utc(2026, 11, 1, 0, 0, 0), utc(2026, 11, 24, 12, 0, 0), 3);
    assert_eq!(
        got,
        vec![
            utc(2026, 11, 24, 10, 0, 0),
            utc(2026, 11, 24, 11, 0, 0),
            utc(2026, 11, 24, 12, 0, 0)
        ]
    );
}

/// Sydney springs forward on 2026-10-04 (02:00 AEST → 03:00 AEDT): the daily 02:30 job runs at
/// 03:00 AEDT (16:00 UTC the day before), as in Berlin.
#[test]
fn daily_0230_in_sydney_runs_at_0300_on_its_spring_forward_day() {
    let c = cron("30 2 * * *", "Australia/Sydney").compile().unwrap();
    assert_eq!(
        c.next_after(utc(2026, 10, 2, 17, 0, 0)),
        Some(utc(2026, 10, 3, 16, 0, 0))
    );
    // And in April (03:00 AEDT → 02:00 AEST, 2026-04-05) once, at the first pass.
    assert_eq!(
        c.next_after(utc(2026, 4, 4, 12, 0, 0)),
        Some(utc(2026, 4, 4, 15, 30, 0))
    );
    assert_eq!(
        c.next_after(utc(2026, 4, 4, 15, 30, 0)),
        Some(utc(2026, 4, 5, 16, 30, 0))
    );
}
