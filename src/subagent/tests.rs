#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::announce::*;
use super::*;
use crate::types::session_key::{subagent_key as session_key_of, subagent_task_id as task_id_of};
use crate::types::SessionKey;

fn record(id: &str, parent: &str) -> TaskRecord {
    TaskRecord {
        id: id.into(),
        label: "l".into(),
        task: "t".into(),
        parent: parent.into(),
        root: "http:c".into(),
        depth: 1,
        mode: Mode::Spawn,
        status: TaskStatus::Completed,
        created_ms: 1,
        ended_ms: Some(2),
        archived_ms: None,
        result: Some("r".into()),
        error: None,
        usage: TaskUsage::default(),
        announced: false,
    }
}

#[test]
fn subagent_session_keys_round_trip_and_chat_keys_are_not_tasks() {
    let k = session_key_of("0192-abc").unwrap();
    assert_eq!(k.as_str(), "subagent:0192-abc");
    assert_eq!(task_id_of(&k), Some("0192-abc"));
    assert_eq!(task_id_of(&SessionKey::parse("http:c").unwrap()), None);
    assert_eq!(task_id_of(&SessionKey::parse("subagentx:1").unwrap()), None);
}

#[test]
fn a_long_result_is_cut_in_the_announcement_with_a_pointer_to_the_whole() {
    let mut r = record("a", "http:c");
    r.result = Some("é".repeat(ANNOUNCE_RESULT_CHARS + 10));
    let d = describe(&r);
    assert!(d.contains("completed after"));
    assert!(d.ends_with("call subagents result for the whole text]"));
    assert!(d.chars().count() < ANNOUNCE_RESULT_CHARS + 300);
    r.status = TaskStatus::Failed;
    r.result = None;
    r.error = Some("interrupted by restart".into());
    assert!(describe(&r).ends_with("error: interrupted by restart"));
}

#[test]
fn records_survive_serialisation_and_old_records_without_new_fields_load() {
    let r = record("a", "http:c");
    let v = serde_json::to_string(&r).unwrap();
    assert_eq!(serde_json::from_str::<TaskRecord>(&v).unwrap(), r);
    let minimal = r#"{"id":"a","label":"l","task":"t","parent":"http:c","root":"http:c","depth":1,"mode":"run","status":"running","created_ms":5}"#;
    let m: TaskRecord = serde_json::from_str(minimal).unwrap();
    assert_eq!(
        (m.mode, m.status, m.announced),
        (Mode::Run, TaskStatus::Running, false)
    );
}

#[test]
fn finished_and_told_tasks_are_archived_after_the_period_then_deleted_a_week_later() {
    let hour = 3_600_000;
    let mut r = record("a", "http:c");
    r.ended_ms = Some(10);
    r.announced = true;
    assert_eq!(sweep_action(&r, 10 + hour - 1, hour), SweepAction::Keep);
    assert_eq!(sweep_action(&r, 10 + hour, hour), SweepAction::Archive);
    // Not yet told: kept until the announcement is out.
    r.announced = false;
    assert_eq!(sweep_action(&r, 10 + 5 * hour, hour), SweepAction::Keep);
    // Running: never archived.
    r.announced = true;
    r.status = TaskStatus::Running;
    r.ended_ms = None;
    assert_eq!(sweep_action(&r, 10 + 5 * hour, hour), SweepAction::Keep);
    r.status = TaskStatus::Archived;
    r.archived_ms = Some(100);
    assert_eq!(sweep_action(&r, 100 + 24 * hour, hour), SweepAction::Keep);
    assert_eq!(
        sweep_action(&r, 100 + 7 * 24 * hour, hour),
        SweepAction::Delete
    );
}

#[test]
fn status_names_are_the_stored_ones() {
    for s in [
        TaskStatus::Spawning,
        TaskStatus::Running,
        TaskStatus::Completed,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
        TaskStatus::Archived,
    ] {
        assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
    }
}
