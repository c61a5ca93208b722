//! Transcript repair: every assistant tool call must have exactly one result before the next
//! request. After a crash mid-turn, calls without a result get a synthetic error result.

use std::collections::HashSet;

use crate::llm::{Message, Role};
use crate::turn::synthetic_result;

/// What the model is told about a call whose result was lost to a crash.
pub const INTERRUPTED: &str = "interrupted: the daemon stopped before this tool call finished; its effects are unknown, check before retrying";

/// Repair `msgs` in place. Returns the synthetic results that were appended at the end (which
/// the caller persists); orphans found elsewhere are fixed in memory only.
pub fn repair(msgs: &mut Vec<Message>) -> Vec<Message> {
    let mut i = 0;
    let mut appended = Vec::new();
    while i < msgs.len() {
        if msgs[i].role != Role::Assistant || msgs[i].tool_calls.is_empty() {
            i += 1;
            continue;
        }
        // Results that directly follow this assistant message.
        let mut j = i + 1;
        let mut answered = HashSet::new();
        while j < msgs.len() && msgs[j].role == Role::Tool {
            if let Some(id) = &msgs[j].tool_call_id {
                answered.insert(id.clone());
            }
            j += 1;
        }
        let missing: Vec<Message> = msgs[i]
            .tool_calls
            .iter()
            .filter(|c| !answered.contains(&c.id))
            .map(|c| synthetic_result(c, INTERRUPTED))
            .collect();
        let n = missing.len();
        if n > 0 {
            if j == msgs.len() {
                appended.extend(missing.iter().cloned());
            }
            msgs.splice(j..j, missing);
        }
        i = j + n;
    }
    // Tool results that answer no call (cannot normally happen) are dropped.
    let mut known = HashSet::new();
    msgs.retain(|m| match m.role {
        Role::Assistant => {
            known.extend(m.tool_calls.iter().map(|c| c.id.clone()));
            true
        }
        Role::Tool => m.tool_call_id.as_ref().is_some_and(|id| known.contains(id)),
        Role::System | Role::User => true,
    });
    appended
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
