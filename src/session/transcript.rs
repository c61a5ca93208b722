//! Transcript repair: a stored transcript is made one a strict provider accepts before it is
//! replayed. Every assistant tool call has arguments that are a JSON object and an id that is
//! non-empty and unique in the transcript, and exactly one result, right after it; every result
//! answers such a call.
//!
//! Transcripts stored before these rules (or cut by a crash mid-turn) are repaired on load, the
//! same way every time: invalid arguments become `{}` (their result already says they were
//! invalid), an empty or reused id gets a fresh one in the call and in its result (results are
//! matched to calls in order, the k-th result carrying an id answering the k-th call with it),
//! a call without a result gets a synthetic error result, a result that answers no call is
//! dropped. Only synthetic results at the very end are stored (the caller appends them); the
//! rest is fixed in memory on every load.

use std::collections::HashSet;

use crate::llm::{Message, Role};
use crate::turn::guard::{check_arguments, fresh_id};
use crate::turn::synthetic_result;

/// What the model is told about a call whose result was lost to a crash.
pub const INTERRUPTED: &str = "interrupted: the daemon stopped before this tool call finished; its effects are unknown, check before retrying";

/// Repair `msgs` in place. Returns the synthetic results to store: those that answer calls of
/// the transcript's last message block, carrying the ids as stored (so the next load, which
/// renames the same way, matches them again). Everything else is fixed in memory only.
pub fn repair(msgs: &mut Vec<Message>) -> Vec<Message> {
    // Fresh ids avoid every id in the transcript, later ones included.
    let mut taken: HashSet<String> = msgs
        .iter()
        .flat_map(|m| m.tool_calls.iter().map(|c| c.id.clone()))
        .collect();
    let mut seen: HashSet<String> = HashSet::new();
    let mut out = Vec::with_capacity(msgs.len());
    let mut to_store = Vec::new();
    let mut dropped = 0usize;
    let mut rest = std::mem::take(msgs).into_iter().peekable();
    while let Some(mut m) = rest.next() {
        match m.role {
            Role::Tool => {
                // Not right after its call (the block case is handled below): unanswerable.
                dropped += 1;
            }
            Role::Assistant if !m.tool_calls.is_empty() => {
                let mut results = Vec::new();
                while let Some(r) = rest.next_if(|n| n.role == Role::Tool) {
                    results.push(Some(r));
                }
                let at_end = rest.peek().is_none();
                let stored_ids: Vec<String> = m.tool_calls.iter().map(|c| c.id.clone()).collect();
                for c in &mut m.tool_calls {
                    if c.id.is_empty() || !seen.insert(c.id.clone()) {
                        c.id = fresh_id(&c.id, &mut taken);
                        seen.insert(c.id.clone());
                    }
                    if check_arguments(&c.arguments).is_err() || c.arguments.trim().is_empty() {
                        c.arguments = "{}".into();
                    }
                }
                let mut answers = Vec::with_capacity(m.tool_calls.len());
                for (c, stored) in m.tool_calls.iter().zip(&stored_ids) {
                    let found = results.iter_mut().find(|r| {
                        r.as_ref()
                            .is_some_and(|r| r.tool_call_id.as_deref() == Some(stored.as_str()))
                    });
                    match found.and_then(Option::take) {
                        Some(mut r) => {
                            r.tool_call_id = Some(c.id.clone());
                            answers.push(r);
                        }
                        None => {
                            let r = synthetic_result(c, INTERRUPTED);
                            if at_end {
                                let mut stored_r = r.clone();
                                stored_r.tool_call_id = Some(stored.clone());
                                to_store.push(stored_r);
                            }
                            answers.push(r);
                        }
                    }
                }
                dropped += results.iter().flatten().count();
                out.push(m);
                out.extend(answers);
            }
            Role::Assistant | Role::System | Role::User => out.push(m),
        }
    }
    if dropped > 0 {
        tracing::warn!(
            dropped,
            "tool results that answer no call dropped from the transcript"
        );
    }
    *msgs = out;
    to_store
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::llm::ToolCall;

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "read_file".into(),
            arguments: "{}".into(),
        }
    }

    fn asst(ids: &[&str]) -> Message {
        let mut m = Message::assistant("");
        m.tool_calls = ids.iter().map(|i| call(i)).collect();
        m
    }

    #[test]
    fn orphans_at_the_end_get_results_appended() {
        let mut t = vec![
            Message::user("hi"),
            asst(&["a", "b"]),
            Message::tool_result("a", "read_file", "{}"),
        ];
        let added = repair(&mut t);
        assert_eq!(added.len(), 1);
        assert_eq!(added[0].tool_call_id.as_deref(), Some("b"));
        assert!(added[0].content.contains("interrupted"));
        assert_eq!(t.len(), 4);
    }

    #[test]
    fn orphans_in_the_middle_are_fixed_in_memory() {
        let mut t = vec![
            Message::user("hi"),
            asst(&["a"]),
            Message::user("again"),
            Message::tool_result("zzz", "x", "{}"),
        ];
        let added = repair(&mut t);
        assert!(added.is_empty());
        assert_eq!(t[2].tool_call_id.as_deref(), Some("a"));
        assert_eq!(t.len(), 4);
        assert_eq!(t[3], Message::user("again"));
    }

    fn call_args(id: &str, args: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "read_file".into(),
            arguments: args.into(),
        }
    }

    /// What a strict provider checks: unique non-empty ids, object arguments, each call
    /// answered once right after it, no stray results.
    fn assert_valid(t: &[Message]) {
        let mut ids = HashSet::new();
        let mut i = 0;
        while i < t.len() {
            let m = &t[i];
            assert_ne!(m.role, Role::Tool, "stray result at {i}: {t:#?}");
            i += 1;
            if m.role != Role::Assistant {
                continue;
            }
            let mut open: Vec<&str> = Vec::new();
            for c in &m.tool_calls {
                assert!(
                    !c.id.is_empty() && ids.insert(c.id.clone()),
                    "id {:?}",
                    c.id
                );
                check_arguments(&c.arguments).unwrap();
                assert!(!c.arguments.trim().is_empty());
                open.push(&c.id);
            }
            while i < t.len() && t[i].role == Role::Tool {
                let id = t[i].tool_call_id.as_deref().unwrap();
                let k = open
                    .iter()
                    .position(|o| *o == id)
                    .expect("answers its call");
                open.remove(k);
                i += 1;
            }
            assert!(open.is_empty(), "unanswered {open:?}");
        }
    }

    #[test]
    fn duplicate_and_empty_ids_and_invalid_arguments_stored_by_older_versions_are_repaired() {
        let mut a1 = Message::assistant("");
        a1.tool_calls = vec![
            call_args("call_1", r#"{"path":"a"#),
            call_args("call_1", r#"{"path":"b"}"#),
        ];
        let mut a2 = Message::assistant("");
        a2.tool_calls = vec![call_args("call_1", r#"{"path":"c"}"#), call_args("", "")];
        let stored = vec![
            Message::user("one"),
            a1,
            Message::tool_result("call_1", "read_file", "invalid json"),
            Message::tool_result("call_1", "read_file", "content of b"),
            Message::assistant("done"),
            Message::user("two"),
            a2,
            Message::tool_result("call_1", "read_file", "content of c"),
            Message::tool_result("", "read_file", "listing"),
            Message::assistant("done again"),
        ];
        let mut t = stored.clone();
        assert!(repair(&mut t).is_empty());
        assert_valid(&t);
        assert_eq!(t.len(), stored.len());
        // Results stay with their calls, in order.
        let pairs: Vec<(String, String)> = [1, 6]
            .iter()
            .flat_map(|&i| t[i].tool_calls.iter().map(|c| c.id.clone()))
            .zip([2, 3, 7, 8].iter().map(|&j| t[j].content.clone()))
            .collect();
        let ids: Vec<&str> = pairs.iter().map(|(i, _)| i.as_str()).collect();
        assert_eq!(ids, ["call_1", "call_1_2", "call_1_3", "call_2"]);
        for (k, &j) in [2, 3, 7, 8].iter().enumerate() {
            assert_eq!(t[j].tool_call_id.as_deref(), Some(ids[k]));
        }
        assert_eq!(t[1].tool_calls[0].arguments, "{}");
        assert_eq!(t[6].tool_calls[1].arguments, "{}");
        // The same every time.
        let mut again = stored;
        repair(&mut again);
        assert_eq!(again, t);
    }

    #[test]
    fn results_stored_for_renamed_calls_after_a_crash_match_on_the_next_load() {
        let mut a = Message::assistant("");
        a.tool_calls = vec![call_args("x", "{}"), call_args("x", r#"{"n":2}"#)];
        let mut stored = vec![
            Message::user("go"),
            a,
            Message::tool_result("x", "read_file", "first"),
        ];
        let mut t = stored.clone();
        let added = repair(&mut t);
        assert_valid(&t);
        assert_eq!(added.len(), 1);
        // Stored under the id as stored, so the next load pairs it again.
        assert_eq!(added[0].tool_call_id.as_deref(), Some("x"));
        assert_eq!(t[3].tool_call_id.as_deref(), Some("x_2"));
        stored.extend(added);
        let mut t2 = stored;
        assert!(repair(&mut t2).is_empty());
        assert_valid(&t2);
        assert_eq!(t2, t);
    }

    #[test]
    fn valid_transcript_unchanged() {
        let mut t = vec![
            Message::user("hi"),
            asst(&["a"]),
            Message::tool_result("a", "read_file", "{}"),
            Message::assistant("done"),
        ];
        let before = t.clone();
        assert!(repair(&mut t).is_empty());
        assert_eq!(t, before);
    }
}
