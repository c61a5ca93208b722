#![allow(clippy::unwrap_used, clippy::expect_used)]

use chrono::TimeZone;
use pretty_assertions::assert_eq;

use super::*;

fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).single().unwrap()
}

fn t0() -> DateTime<Utc> {
    utc(2026, 11, 20, 9, 30)
}

fn owner(chat: &str) -> SessionKey {
    SessionKey::from_parts(&["telegram", chat]).unwrap()
}

fn hourly(name: &str, chat: &str) -> NewJob {
    NewJob {
        name: name.into(),
        schedule: Schedule::Cron {
            expr: "0 * * * *".into(),
            tz: Some("Europe/Berlin".into()),
        },
        catch_up: CatchUp::Once,
        payload: Payload {
            message: "check the inbox".into(),
            deliver: Deliver::Turn,
        },
        target: Target {
            channel: "telegram".into(),
            chat_id: chat.into(),
            thread: None,
        },
        owner: owner(chat),
        created_by: None,
    }
}

fn jobs() -> JobStore {
    JobStore::new(Store::memory(), SchedulerSettings::default())
}

#[test]
fn an_added_job_is_stored_with_its_next_run() {
    let js = jobs();
    let job = js.add(hourly("inbox", "42"), t0()).unwrap();
    assert_eq!(job.next_run, Some(utc(2026, 11, 20, 10, 0)));
    assert!(job.enabled);
    assert_eq!(job.anchor, t0());
    assert_eq!(uuid::Uuid::parse_str(&job.id).unwrap().get_version_num(), 7);
    assert_eq!(js.list().unwrap(), vec![job.clone()]);
    assert_eq!(js.get(&job.id, Some(&owner("42"))).unwrap(), job);
}

#[test]
fn lists_by_owner_and_scopes_changes_to_the_owner() {
    let js = jobs();
    let a = js.add(hourly("a", "1"), t0()).unwrap();
    let b = js.add(hourly("b", "2"), t0()).unwrap();
    assert_eq!(js.list_by_owner(&owner("1")).unwrap(), vec![a.clone()]);
    assert_eq!(js.list().unwrap().len(), 2);
    // Session 2 cannot see, pause or remove session 1's job.
    for err in [
        js.get(&a.id, Some(&owner("2"))).unwrap_err(),
        js.pause(&a.id, Some(&owner("2"))).unwrap_err(),
        js.remove(&a.id, Some(&owner("2"))).unwrap_err(),
    ] {
        assert!(matches!(err, JobError::NotFound { .. }), "{err}");
    }
    // The operator (no owner) can.
    js.remove(&a.id, None).unwrap();
    assert_eq!(js.list().unwrap(), vec![b]);
}

#[test]
fn jobs_per_session_are_limited() {
    let js = JobStore::new(
        Store::memory(),
        SchedulerSettings {
            max_jobs_per_session: 2,
            ..SchedulerSettings::default()
        },
    );
    js.add(hourly("a", "1"), t0()).unwrap();
    js.add(hourly("b", "1"), t0()).unwrap();
    let err = js.add(hourly("c", "1"), t0()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "this session already has 2 scheduled jobs (setting `scheduler.max_jobs_per_session`); remove one first"
    );
    assert!(err.is_refusal());
    // Another session has its own allowance.
    js.add(hourly("a", "2"), t0()).unwrap();
}

#[test]
fn a_one_second_interval_is_refused_by_the_minimum() {
    let js = jobs();
    let mut new = hourly("fast", "1");
    new.schedule = Schedule::Every { seconds: 1 };
    let err = js.add(new, t0()).unwrap_err();
    assert!(
        err.to_string()
            .contains("below the minimum interval of 60 s"),
        "{err}"
    );
    assert_eq!(js.list().unwrap(), vec![]);
}

#[test]
fn a_schedule_over_the_daily_run_cap_is_refused() {
    let js = jobs();
    let mut new = hourly("busy", "1");
    new.schedule = Schedule::Cron {
        expr: "*/5 * * * *".into(),
        tz: None,
    };
    let err = js.add(new, t0()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "this schedule runs more than 144 times in the next 24 hours, the most allowed per day (setting `scheduler.max_runs_per_day`); choose a longer interval"
    );
    let mut ok = hourly("ok", "1");
    ok.schedule = Schedule::Every { seconds: 600 };
    js.add(ok, t0()).unwrap();
}

#[test]
fn empty_fields_are_refused_naming_them() {
    let js = jobs();
    let mut new = hourly(" ", "1");
    assert_eq!(
        js.add(new.clone(), t0()).unwrap_err().to_string(),
        "name: must not be empty"
    );
    new.name = "x".into();
    new.payload.message = String::new();
    assert_eq!(
        js.add(new.clone(), t0()).unwrap_err().to_string(),
        "message: must not be empty"
    );
    new.payload.message = "m".into();
    new.target.chat_id = String::new();
    assert!(js
        .add(new, t0())
        .unwrap_err()
        .to_string()
        .starts_with("target:"));
}

#[test]
fn due_finds_jobs_whose_next_run_has_come() {
    let js = jobs();
    let a = js.add(hourly("a", "1"), t0()).unwrap();
    assert_eq!(js.due(utc(2026, 11, 20, 9, 59)).unwrap(), vec![]);
    let due = js.due(utc(2026, 11, 20, 10, 0)).unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].job.id, a.id);
    assert_eq!(due[0].plan.runs.len(), 1);
    assert_eq!(
        due[0].plan.runs[0].id,
        RunId::new(&a.id, utc(2026, 11, 20, 10, 0))
    );
    assert!(!due[0].plan.runs[0].late);
    // Until it is recorded it stays due, with the same run id (a crash re-finds it).
    let again = js.due(utc(2026, 11, 20, 10, 1)).unwrap();
    assert_eq!(again[0].plan.runs[0].id, due[0].plan.runs[0].id);
}

#[test]
fn recording_a_run_moves_the_job_to_its_next_occurrence() {
    let js = jobs();
    let a = js.add(hourly("a", "1"), t0()).unwrap();
    let now = utc(2026, 11, 20, 10, 0);
    let run = js.due(now).unwrap().remove(0).plan.runs.remove(0);
    let rec = js.record_run(&a.id, &run, Outcome::Ok, None, now).unwrap();
    assert!(!rec.duplicate && !rec.paused);
    assert_eq!(rec.job.next_run, Some(utc(2026, 11, 20, 11, 0)));
    assert_eq!(rec.job.anchor, utc(2026, 11, 20, 10, 0));
    assert_eq!(rec.job.runs_today, 1);
    assert_eq!(js.due(utc(2026, 11, 20, 10, 30)).unwrap(), vec![]);
    assert_eq!(js.runs(&a.id, None).unwrap().len(), 1);
}

#[test]
fn recording_the_same_run_twice_counts_it_once() {
    let js = jobs();
    let a = js.add(hourly("a", "1"), t0()).unwrap();
    let now = utc(2026, 11, 20, 10, 0);
    let run = js.due(now).unwrap().remove(0).plan.runs.remove(0);
    let first = js
        .record_run(&a.id, &run, Outcome::Failed, Some("llm down".into()), now)
        .unwrap();
    let second = js
        .record_run(&a.id, &run, Outcome::Failed, Some("llm down".into()), now)
        .unwrap();
    assert!(!first.duplicate);
    assert!(second.duplicate);
    let job = js.get(&a.id, None).unwrap();
    assert_eq!(job, first.job);
    assert_eq!((job.consecutive_failures, job.runs_today), (1, 1));
    assert_eq!(js.runs(&a.id, None).unwrap().len(), 1);
    // Even with another outcome, a recorded run id is final.
    let third = js.record_run(&a.id, &run, Outcome::Ok, None, now).unwrap();
    assert!(third.duplicate);
    assert_eq!(js.get(&a.id, None).unwrap().consecutive_failures, 1);
}

#[test]
fn three_failures_in_a_row_pause_the_job_once_and_say_so() {
    let js = jobs();
    let a = js.add(hourly("a", "1"), t0()).unwrap();
    let mut paused = Vec::new();
    for h in 10..13 {
        let now = utc(2026, 11, 20, h, 0);
        let run = js.due(now).unwrap().remove(0).plan.runs.remove(0);
        paused.push(
            js.record_run(&a.id, &run, Outcome::Failed, None, now)
                .unwrap()
                .paused,
        );
    }
    assert_eq!(paused, vec![false, false, true]);
    let job = js.get(&a.id, None).unwrap();
    assert!(!job.enabled);
    assert_eq!(job.consecutive_failures, 3);
    assert!(job
        .paused_reason
        .unwrap()
        .contains("paused after 3 failed runs in a row"));
    // A paused job is never due.
    assert_eq!(js.due(utc(2026, 11, 21, 0, 0)).unwrap(), vec![]);
    // Resumed, it counts from now (no catch-up of the paused hours) and its count is clear.
    let resumed = js.resume(&a.id, None, utc(2026, 11, 21, 0, 10)).unwrap();
    assert!(resumed.enabled);
    assert_eq!(resumed.consecutive_failures, 0);
    assert_eq!(resumed.next_run, Some(utc(2026, 11, 21, 1, 0)));
    let due = js.due(utc(2026, 11, 21, 1, 0)).unwrap();
    assert_eq!(due[0].plan.runs.len(), 1);
    assert!(!due[0].plan.runs[0].late);
}

#[test]
fn a_success_clears_the_failure_count_and_a_cancel_leaves_it() {
    let js = jobs();
    let a = js.add(hourly("a", "1"), t0()).unwrap();
    let outcomes = [
        Outcome::Failed,
        Outcome::Failed,
        Outcome::Cancelled,
        Outcome::Ok,
        Outcome::Failed,
    ];
    let mut counts = Vec::new();
    for (i, o) in outcomes.into_iter().enumerate() {
        let now = utc(2026, 11, 20, 10 + i as u32, 0);
        let run = js.due(now).unwrap().remove(0).plan.runs.remove(0);
        counts.push(
            js.record_run(&a.id, &run, o, None, now)
                .unwrap()
                .job
                .consecutive_failures,
        );
    }
    assert_eq!(counts, vec![1, 2, 2, 0, 1]);
    assert!(js.get(&a.id, None).unwrap().enabled);
}

#[test]
fn pause_and_resume_by_request() {
    let js = jobs();
    let a = js.add(hourly("a", "1"), t0()).unwrap();
    let p = js.pause(&a.id, Some(&owner("1"))).unwrap();
    assert!(!p.enabled);
    assert_eq!(p.paused_reason.as_deref(), Some("paused by request"));
    assert_eq!(js.due(utc(2026, 11, 20, 12, 0)).unwrap(), vec![]);
    let r = js
        .resume(&a.id, Some(&owner("1")), utc(2026, 11, 20, 12, 30))
        .unwrap();
    assert_eq!(r.next_run, Some(utc(2026, 11, 20, 13, 0)));
}

#[test]
fn an_hourly_job_after_three_days_down_catches_up_by_policy() {
    let down = utc(2026, 11, 20, 10, 0); // last run
    let back = utc(2026, 11, 23, 10, 30);
    let mut results = Vec::new();
    for policy in [CatchUp::Once, CatchUp::All, CatchUp::Skip] {
        let js = jobs();
        let mut new = hourly("a", "1");
        new.catch_up = policy;
        let a = js.add(new, t0()).unwrap();
        let run = js.due(down).unwrap().remove(0).plan.runs.remove(0);
        js.record_run(&a.id, &run, Outcome::Ok, None, down).unwrap();
        let due = js.due(back).unwrap();
        let runs: Vec<Run> = due.into_iter().flat_map(|d| d.plan.runs).collect();
        for r in &runs {
            js.record_run(&a.id, r, Outcome::Ok, None, back).unwrap();
        }
        let job = js.get(&a.id, None).unwrap();
        results.push((
            policy,
            runs.len(),
            runs.iter().all(|r| r.late),
            job.next_run,
        ));
        // Nothing more is due once recorded (or skipped).
        assert_eq!(js.due(back).unwrap(), vec![], "{policy:?}");
    }
    let next = Some(utc(2026, 11, 23, 11, 0));
    assert_eq!(
        results,
        vec![
            (CatchUp::Once, 1, true, next),
            (CatchUp::All, 72, true, next),
            (CatchUp::Skip, 0, true, next),
        ]
    );
}

#[test]
fn the_daily_count_starts_again_each_utc_day() {
    let js = JobStore::new(
        Store::memory(),
        SchedulerSettings {
            max_runs_per_day: 24,
            ..SchedulerSettings::default()
        },
    );
    let mut new = hourly("a", "1");
    new.catch_up = CatchUp::All;
    let a = js.add(new, utc(2026, 11, 20, 0, 30)).unwrap();
    // Down all day: 23 catch-up runs at 23:30 and one manual run: 24 recorded on the 20th.
    let now = utc(2026, 11, 20, 23, 30);
    for d in js.due(now).unwrap() {
        for r in &d.plan.runs {
            js.record_run(&a.id, r, Outcome::Ok, None, now).unwrap();
        }
    }
    js.record_run(&a.id, &Run::manual(&a.id, now), Outcome::Ok, None, now)
        .unwrap();
    let job = js.get(&a.id, None).unwrap();
    assert_eq!((job.runs_today, job.runs_day), (24, Some(now.date_naive())));
    // Midnight UTC: a new day, a new allowance.
    let midnight = utc(2026, 11, 21, 0, 0);
    let run = js.due(midnight).unwrap().remove(0).plan.runs.remove(0);
    let rec = js
        .record_run(&a.id, &run, Outcome::Ok, None, midnight)
        .unwrap();
    assert_eq!(rec.job.runs_today, 1);
}

#[test]
fn at_the_cap_a_due_job_is_moved_to_tomorrow() {
    let js = JobStore::new(
        Store::memory(),
        SchedulerSettings {
            max_runs_per_day: 2,
            ..SchedulerSettings::default()
        },
    );
    let mut new = hourly("a", "1");
    new.schedule = Schedule::Cron {
        expr: "0 9,17 * * *".into(),
        tz: None,
    };
    let a = js.add(new, utc(2026, 11, 20, 8, 0)).unwrap();
    let now = utc(2026, 11, 20, 9, 0);
    js.record_run(
        &a.id,
        &Run::manual(&a.id, utc(2026, 11, 20, 8, 30)),
        Outcome::Ok,
        None,
        now,
    )
    .unwrap();
    let run = js.due(now).unwrap().remove(0).plan.runs.remove(0);
    js.record_run(&a.id, &run, Outcome::Ok, None, now).unwrap();
    // Two runs today: the 17:00 occurrence is not started; the job moves to tomorrow 09:00.
    assert_eq!(js.due(utc(2026, 11, 20, 17, 0)).unwrap(), vec![]);
    assert_eq!(
        js.get(&a.id, None).unwrap().next_run,
        Some(utc(2026, 11, 21, 9, 0))
    );
    assert_eq!(js.due(utc(2026, 11, 21, 9, 0)).unwrap().len(), 1);
}

#[test]
fn a_manual_run_does_not_move_the_schedule() {
    let js = jobs();
    let a = js.add(hourly("a", "1"), t0()).unwrap();
    let now = utc(2026, 11, 20, 9, 45);
    let manual = Run::manual(&a.id, now);
    assert!(manual.id.as_str().ends_with("~manual"));
    let rec = js
        .record_run(&a.id, &manual, Outcome::Ok, None, now)
        .unwrap();
    assert_eq!(rec.job.next_run, Some(utc(2026, 11, 20, 10, 0)));
    assert_eq!(rec.job.anchor, t0());
    assert_eq!(js.due(utc(2026, 11, 20, 10, 0)).unwrap().len(), 1);
}

#[test]
fn an_at_job_runs_once_then_has_no_next_run() {
    let js = jobs();
    let mut new = hourly("remind", "1");
    new.schedule = Schedule::At {
        at: DateTime::parse_from_rfc3339("2026-11-20T12:00:00+01:00").unwrap(),
    };
    new.payload.deliver = Deliver::Text;
    let a = js.add(new, t0()).unwrap();
    assert_eq!(a.next_run, Some(utc(2026, 11, 20, 11, 0)));
    let now = utc(2026, 11, 20, 11, 0);
    let run = js.due(now).unwrap().remove(0).plan.runs.remove(0);
    let rec = js.record_run(&a.id, &run, Outcome::Ok, None, now).unwrap();
    assert_eq!(rec.job.next_run, None);
    assert_eq!(js.due(utc(2027, 1, 1, 0, 0)).unwrap(), vec![]);
}

/// A fired reminder goes away: it is not listed and does not count towards
/// `scheduler.max_jobs_per_session`, whether it ran (any outcome) or its time was skipped.
#[test]
fn a_fired_one_time_job_is_removed_and_no_longer_counts() {
    let js = JobStore::new(
        Store::memory(),
        SchedulerSettings {
            max_jobs_per_session: 1,
            ..SchedulerSettings::default()
        },
    );
    let at = |h: u32| {
        let mut new = hourly("remind", "1");
        new.schedule = Schedule::At {
            at: Utc
                .with_ymd_and_hms(2026, 11, 20, h, 0, 0)
                .single()
                .unwrap()
                .into(),
        };
        new.payload.deliver = Deliver::Text;
        new
    };
    for outcome in [Outcome::Ok, Outcome::Failed, Outcome::Cancelled] {
        let a = js.add(at(11), t0()).unwrap();
        // The limit is reached while it waits.
        assert!(matches!(
            js.add(at(12), t0()),
            Err(JobError::TooManyJobs { .. })
        ));
        let now = utc(2026, 11, 20, 11, 0);
        let run = js.due(now).unwrap().remove(0).plan.runs.remove(0);
        js.record_run(&a.id, &run, outcome, None, now).unwrap();
        assert_eq!(js.list().unwrap(), vec![], "{outcome:?}");
    }
    // Passed over while the daemon was down (catch-up `skip`): gone as well.
    let mut skipped = at(11);
    skipped.catch_up = CatchUp::Skip;
    js.add(skipped, t0()).unwrap();
    assert_eq!(js.due(utc(2026, 11, 21, 0, 0)).unwrap(), vec![]);
    assert_eq!(js.list().unwrap(), vec![]);
    js.add(at(12), t0()).unwrap();
}

#[test]
fn update_revalidates_and_reschedules() {
    let js = jobs();
    let a = js.add(hourly("a", "1"), t0()).unwrap();
    let err = js
        .update(
            &a.id,
            Some(&owner("1")),
            JobPatch {
                schedule: Some(Schedule::Every { seconds: 5 }),
                ..JobPatch::default()
            },
            t0(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("minimum interval"));
    let now = utc(2026, 11, 20, 9, 40);
    let u = js
        .update(
            &a.id,
            Some(&owner("1")),
            JobPatch {
                name: Some("renamed".into()),
                schedule: Some(Schedule::Every { seconds: 7200 }),
                catch_up: Some(CatchUp::Skip),
                ..JobPatch::default()
            },
            now,
        )
        .unwrap();
    assert_eq!(u.name, "renamed");
    assert_eq!(u.catch_up, CatchUp::Skip);
    assert_eq!(u.next_run, Some(utc(2026, 11, 20, 11, 40)));
    assert_eq!(js.get(&a.id, None).unwrap(), u);
}

#[test]
fn remove_deletes_the_job_and_its_runs() {
    let js = jobs();
    let a = js.add(hourly("a", "1"), t0()).unwrap();
    let now = utc(2026, 11, 20, 10, 0);
    let run = js.due(now).unwrap().remove(0).plan.runs.remove(0);
    js.record_run(&a.id, &run, Outcome::Ok, None, now).unwrap();
    js.remove(&a.id, Some(&owner("1"))).unwrap();
    assert!(js.list().unwrap().is_empty());
    assert!(js.store.state_scan(&runs_ns(&a.id)).unwrap().is_empty());
    assert!(matches!(
        js.record_run(&a.id, &run, Outcome::Ok, None, now),
        Err(JobError::NotFound { .. })
    ));
}

#[test]
fn run_history_keeps_the_last_hundred() {
    let js = jobs();
    let mut new = hourly("a", "1");
    new.catch_up = CatchUp::All;
    new.schedule = Schedule::Every { seconds: 900 };
    let a = js.add(new, t0()).unwrap();
    // 30 hours down: 120 occurrences, the last 100 run and are recorded; then 5 more.
    let back = t0() + chrono::TimeDelta::hours(30);
    let runs: Vec<Run> = js.due(back).unwrap().remove(0).plan.runs;
    assert_eq!(runs.len(), 100);
    let js = JobStore::new(
        js.store,
        SchedulerSettings {
            max_runs_per_day: 1000,
            ..SchedulerSettings::default()
        },
    );
    for r in &runs {
        js.record_run(&a.id, r, Outcome::Ok, None, back).unwrap();
    }
    for i in 1..=5 {
        let now = back + chrono::TimeDelta::minutes(15 * i);
        let due = js.due(now).unwrap();
        let run = &due[0].plan.runs[0];
        js.record_run(&a.id, run, Outcome::Ok, None, now).unwrap();
    }
    let history = js.runs(&a.id, None).unwrap();
    assert_eq!(history.len(), RUNS_KEPT);
    assert_eq!(
        history.last().unwrap().scheduled,
        back + chrono::TimeDelta::minutes(75)
    );
    assert!(history.windows(2).all(|w| w[0].scheduled < w[1].scheduled));
}

fn persist_round_trip(open: impl Fn() -> Store) {
    let id;
    let run;
    {
        let js = JobStore::new(open(), SchedulerSettings::default());
        let a = js.add(hourly("a", "1"), t0()).unwrap();
        id = a.id;
        run = js
            .due(utc(2026, 11, 20, 10, 0))
            .unwrap()
            .remove(0)
            .plan
            .runs
            .remove(0);
        js.record_run(
            &id,
            &run,
            Outcome::Failed,
            Some("boom".into()),
            utc(2026, 11, 20, 10, 1),
        )
        .unwrap();
    }
    let js = JobStore::new(open(), SchedulerSettings::default());
    let job = js.get(&id, None).unwrap();
    assert_eq!(job.next_run, Some(utc(2026, 11, 20, 11, 0)));
    assert_eq!(job.consecutive_failures, 1);
    assert_eq!(
        job.last_run.as_ref().unwrap().detail.as_deref(),
        Some("boom")
    );
    // The dedupe survives the reopen: the same run recorded again changes nothing.
    assert!(
        js.record_run(&id, &run, Outcome::Failed, None, utc(2026, 11, 20, 10, 2))
            .unwrap()
            .duplicate
    );
    assert_eq!(js.get(&id, None).unwrap().consecutive_failures, 1);
    assert_eq!(js.runs(&id, None).unwrap().len(), 1);
}

#[test]
fn jobs_survive_a_reopen_of_a_sled_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    persist_round_trip(|| Store::open(&path, 1 << 20).unwrap());
}

#[test]
fn jobs_survive_in_a_shared_memory_store() {
    let store = Store::memory();
    persist_round_trip(|| store.clone());
}

#[test]
fn an_undecodable_record_does_not_stop_the_other_jobs() {
    let js = jobs();
    let a = js.add(hourly("a", "1"), t0()).unwrap();
    js.store
        .state_put(JOBS_NS, "0000-broken", Some("{\"id\":1}"))
        .unwrap();
    let due = js.due(utc(2026, 11, 20, 10, 0)).unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].job.id, a.id);
    // Listing names the broken record.
    assert!(js
        .list()
        .unwrap_err()
        .to_string()
        .contains("sched.jobs/0000-broken"));
}
