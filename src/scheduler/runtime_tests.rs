#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use chrono::TimeZone;

use super::*;
use crate::scheduler::catchup::CatchUp;
use crate::scheduler::jobs::{NewJob, Payload};
use crate::scheduler::schedule::Schedule;
use crate::tools::workspace::Workspace;

type Routed = Arc<Mutex<Vec<InboxEntry>>>;

fn scheduler(store: &Store, dir: &Path, hb: Option<HeartbeatSettings>) -> (Arc<Scheduler>, Routed) {
    let ws = Arc::new(Workspace::open(&dir.join("ws")).unwrap());
    let s = Scheduler::new(
        store.clone(),
        SchedulerSettings::default(),
        None,
        Vec::new(),
        hb,
        ws,
    );
    let routed: Routed = Arc::default();
    let r = routed.clone();
    s.attach(Arc::new(move |e| {
        r.lock().unwrap().push(e);
        true
    }));
    (s, routed)
}

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 5, 8, 0, 0).unwrap()
}

fn hourly(name: &str, catch_up: CatchUp, deliver: Deliver) -> NewJob {
    NewJob {
        name: name.into(),
        schedule: Schedule::Every { seconds: 3600 },
        catch_up,
        payload: Payload {
            message: format!("{name}: check the inbox"),
            deliver,
        },
        target: Target {
            channel: "telegram".into(),
            chat_id: "42".into(),
            thread: None,
        },
        owner: SessionKey::parse("telegram:42").unwrap(),
        created_by: Some("42".into()),
    }
}

fn ids(r: &Routed) -> Vec<String> {
    r.lock()
        .unwrap()
        .iter()
        .map(|e| e.event.as_ref().unwrap().event_id.to_string())
        .collect()
}

#[test]
fn a_due_run_is_journaled_once_and_recorded_once_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store"), 1 << 20).unwrap();
    let (s, routed) = scheduler(&store, dir.path(), None);
    let job = s
        .jobs()
        .add(hourly("inbox", CatchUp::Once, Deliver::Turn), t0())
        .unwrap();
    let due = t0() + chrono::TimeDelta::hours(1);
    // Not due yet: nothing, and the timer is told when.
    assert_eq!(s.tick(due - chrono::TimeDelta::seconds(1)), Some(due));
    assert!(ids(&routed).is_empty());
    let at = due + chrono::TimeDelta::seconds(5);
    s.tick(at);
    let run_event = format!("cron:{}@2026-01-05T09:00:00Z", job.id);
    assert_eq!(ids(&routed), [run_event]);
    let entry = routed.lock().unwrap()[0].clone();
    let ev = entry.event.clone().unwrap();
    assert_eq!(entry.session.as_str(), "telegram:42");
    assert_eq!(ev.sender.as_str(), "42", "the asking user's run");
    assert!(
        ev.content.contains("inbox: check the inbox"),
        "{}",
        ev.content
    );
    // While it runs, the same occurrence is not started again.
    s.tick(at);
    assert_eq!(ids(&routed).len(), 1);

    // A restart before the run ended: the journal has it (pending), so it is not routed again
    // (the daemon's journal replay hands it to its session).
    let (s2, routed2) = scheduler(&store, dir.path(), None);
    s2.tick(at);
    assert!(ids(&routed2).is_empty());
    assert_eq!(s2.jobs().get(&job.id, None).unwrap().next_run, Some(due));

    // The replayed turn answers; a third start finds the run answered and records it (once).
    store
        .finish_turn(&entry.session, Some(&entry), &[], None)
        .unwrap();
    let (s3, routed3) = scheduler(&store, dir.path(), None);
    s3.tick(at);
    assert!(ids(&routed3).is_empty());
    let j = s3.jobs().get(&job.id, None).unwrap();
    assert_eq!(j.next_run, Some(due + chrono::TimeDelta::hours(1)));
    assert_eq!(j.last_run.as_ref().unwrap().outcome, Outcome::Ok);
    // The first scheduler's session reports the same run late: nothing changes.
    s.finished(&ev, Outcome::Failed, Some("late report".into()));
    let runs = s.jobs().runs(&job.id, None).unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].outcome, Outcome::Ok);
    assert_eq!(s.jobs().get(&job.id, None).unwrap().consecutive_failures, 0);
}

#[test]
fn after_a_downtime_once_runs_one_late_run_and_skip_runs_none() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store"), 1 << 20).unwrap();
    let (s, routed) = scheduler(&store, dir.path(), None);
    let once = s
        .jobs()
        .add(hourly("once", CatchUp::Once, Deliver::Turn), t0())
        .unwrap();
    let skip = s
        .jobs()
        .add(hourly("skip", CatchUp::Skip, Deliver::Turn), t0())
        .unwrap();
    let text = s
        .jobs()
        .add(hourly("text", CatchUp::Once, Deliver::Text), t0())
        .unwrap();
    // Down from 08:00 to 13:10: five occurrences missed by each job.
    let back = Utc.with_ymd_and_hms(2026, 1, 5, 13, 10, 0).unwrap();
    s.tick(back);
    let got = ids(&routed);
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got.contains(&format!("cron:{}@2026-01-05T13:00:00Z", once.id)));
    assert!(got.contains(&format!("cron-text:{}@2026-01-05T13:00:00Z", text.id)));
    let contents: Vec<String> = routed
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.event.as_ref().unwrap().content.clone())
        .collect();
    assert!(contents.iter().all(|c| c.contains("late")), "{contents:?}");
    let skipped = s.jobs().get(&skip.id, None).unwrap();
    assert_eq!(
        skipped.next_run,
        Some(Utc.with_ymd_and_hms(2026, 1, 5, 14, 0, 0).unwrap())
    );
    assert!(skipped.last_run.is_none());
}

#[test]
fn a_manual_run_does_not_overlap_a_running_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store"), 1 << 20).unwrap();
    let (s, routed) = scheduler(&store, dir.path(), None);
    let job = s
        .jobs()
        .add(hourly("inbox", CatchUp::Once, Deliver::Turn), Utc::now())
        .unwrap();
    let owner = SessionKey::parse("telegram:42").unwrap();
    let run = s.run_now(&job.id, Some(&owner)).unwrap();
    assert!(matches!(
        s.run_now(&job.id, Some(&owner)),
        Err(RunError::Busy(_))
    ));
    let other = SessionKey::parse("telegram:43").unwrap();
    assert!(matches!(
        s.run_now(&job.id, Some(&other)),
        Err(RunError::Job(JobError::NotFound { .. }))
    ));
    let ev = routed.lock().unwrap()[0].event.clone().unwrap();
    assert_eq!(ev.event_id.as_str(), format!("cron:{}", run.id));
    s.finished(&ev, Outcome::Cancelled, None);
    let j = s.jobs().get(&job.id, None).unwrap();
    assert_eq!(j.last_run.unwrap().outcome, Outcome::Cancelled);
    assert!(s.running().is_empty());
    // The manual run did not move the schedule.
    assert_eq!(j.next_run, job.next_run);
}

/// Records what the scheduler sends on its own (the pause notice).
#[derive(Default)]
struct Sent(Mutex<Vec<clawft_channel_core::OutboundMessage>>);

impl MessageSink for Sent {
    fn channels(&self) -> Vec<String> {
        vec!["telegram".into()]
    }
    fn send(
        &self,
        msg: clawft_channel_core::OutboundMessage,
    ) -> Result<(), crate::store::StoreError> {
        self.0.lock().unwrap().push(msg);
        Ok(())
    }
}

#[test]
fn three_failures_pause_the_job_and_tell_its_chat() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store"), 1 << 20).unwrap();
    let sent = Arc::new(Sent::default());
    let s = Scheduler::new(
        store,
        SchedulerSettings::default(),
        Some(sent.clone() as Arc<dyn MessageSink>),
        Vec::new(),
        None,
        Arc::new(Workspace::open(&dir.path().join("ws")).unwrap()),
    );
    let routed: Routed = Arc::default();
    let r = routed.clone();
    s.attach(Arc::new(move |e| {
        r.lock().unwrap().push(e);
        true
    }));
    let job = s
        .jobs()
        .add(hourly("inbox", CatchUp::Once, Deliver::Turn), t0())
        .unwrap();
    for h in 1..=3 {
        s.tick(t0() + chrono::TimeDelta::hours(h) + chrono::TimeDelta::seconds(1));
        let ev = routed
            .lock()
            .unwrap()
            .last()
            .unwrap()
            .event
            .clone()
            .unwrap();
        s.finished(&ev, Outcome::Failed, Some("provider down".into()));
    }
    let j = s.jobs().get(&job.id, None).unwrap();
    assert!(!j.enabled);
    assert!(j.paused_reason.unwrap().contains("3 failed runs"));
    // Paused: no more runs.
    s.tick(t0() + chrono::TimeDelta::hours(4) + chrono::TimeDelta::seconds(1));
    assert_eq!(ids(&routed).len(), 3);
    // The owner's chat was told once, with the error and how to resume.
    let notes = sent.0.lock().unwrap().clone();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(notes[0].chat.as_str(), "42");
    assert!(notes[0].text().contains("paused after 3 failed runs"));
    assert!(notes[0].text().contains("provider down"));
}

fn heartbeat_settings() -> HeartbeatSettings {
    HeartbeatSettings {
        every: Duration::from_secs(30 * 60),
        target: Target {
            channel: "telegram".into(),
            chat_id: "42".into(),
            thread: None,
        },
        model: None,
        active_hours: None,
    }
}

#[tokio::test(start_paused = true)]
async fn an_empty_heartbeat_file_starts_no_turn_in_an_hour() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store"), 1 << 20).unwrap();
    let (s, routed) = scheduler(&store, dir.path(), Some(heartbeat_settings()));
    let file = dir.path().join("ws").join(HEARTBEAT_FILE);
    std::fs::write(
        &file,
        "# Heartbeat\n\n<!-- add what to check,\n one per line -->\n\n",
    )
    .unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(s.clone().run_heartbeat(stop.clone()));
    tokio::time::sleep(Duration::from_secs(3600 + 1)).await;
    assert!(
        ids(&routed).is_empty(),
        "an empty HEARTBEAT.md started a turn"
    );
    assert_eq!(s.counts().heartbeats, 0);

    // With something to do: one turn per interval, never two at once.
    std::fs::write(&file, "# Heartbeat\n- check the backups ran\n").unwrap();
    tokio::time::sleep(Duration::from_secs(30 * 60)).await;
    assert_eq!(ids(&routed).len(), 1);
    let first = routed.lock().unwrap()[0].clone();
    assert_eq!(first.session.as_str(), "telegram:42:-:heartbeat");
    let ev = first.event.unwrap();
    assert!(ev.content.contains("check the backups ran"));
    assert!(ev.content.contains(HEARTBEAT_OK));
    tokio::time::sleep(Duration::from_secs(30 * 60)).await;
    assert_eq!(ids(&routed).len(), 1, "a heartbeat started while one ran");
    s.finished(&ev, Outcome::Ok, None);
    tokio::time::sleep(Duration::from_secs(30 * 60)).await;
    assert_eq!(ids(&routed).len(), 2);
    stop.cancel();
    task.await.unwrap();
}

#[test]
fn heartbeat_outside_active_hours_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store"), 1 << 20).unwrap();
    let mut hb = heartbeat_settings();
    hb.active_hours = Some(super::super::settings::ActiveHours {
        start: 8 * 60,
        end: 22 * 60,
        tz: "UTC".into(),
    });
    let (s, routed) = scheduler(&store, dir.path(), Some(hb));
    std::fs::write(
        dir.path().join("ws").join(HEARTBEAT_FILE),
        "check the disk\n",
    )
    .unwrap();
    assert!(!s.beat(Utc.with_ymd_and_hms(2026, 1, 5, 23, 0, 0).unwrap()));
    assert!(ids(&routed).is_empty());
    assert!(s.beat(Utc.with_ymd_and_hms(2026, 1, 5, 9, 0, 0).unwrap()));
    assert_eq!(ids(&routed).len(), 1);
}

#[test]
fn heartbeat_content_and_replies() {
    assert!(!heartbeat_has_content(""));
    assert!(!heartbeat_has_content("# Title\n\n## Sub\n   \n"));
    assert!(!heartbeat_has_content(
        "<!-- nothing -->\n# x\n<!--\n- a\n-->"
    ));
    assert!(heartbeat_has_content("# x\n- check mail"));
    assert!(heartbeat_has_content("<!-- c --> check mail"));
    assert_eq!(heartbeat_reply("HEARTBEAT_OK"), None);
    assert_eq!(heartbeat_reply("  HEARTBEAT_OK.  "), None);
    assert_eq!(heartbeat_reply("All quiet. HEARTBEAT_OK"), None);
    assert_eq!(
        heartbeat_reply("The backup failed last night."),
        Some("The backup failed last night.".into())
    );
    let long = format!("HEARTBEAT_OK {}", "x".repeat(400));
    assert_eq!(heartbeat_reply(&long), Some("x".repeat(400)));
}

#[test]
fn a_job_of_another_agent_runs_in_that_agents_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store"), 1 << 20).unwrap();
    let (s, routed) = scheduler(&store, dir.path(), None);
    let mut own = hourly("own", CatchUp::Once, Deliver::Turn);
    own.owner = SessionKey::parse("@work:telegram:42").unwrap();
    let mut other = hourly("other", CatchUp::Once, Deliver::Turn);
    other.owner = SessionKey::parse("@work:telegram:42").unwrap();
    other.target.chat_id = "43".into();
    s.jobs().add(own, t0()).unwrap();
    s.jobs().add(other, t0()).unwrap();
    s.tick(t0() + chrono::TimeDelta::hours(1) + chrono::TimeDelta::seconds(5));
    let mut sessions: Vec<String> = routed
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.session.to_string())
        .collect();
    sessions.sort();
    assert_eq!(sessions, ["@work:telegram:42", "@work:telegram:43"]);
}
