//! What a turn checks about the model's tool calls before it stores or runs them.
//!
//! - **A history the provider accepts.** Every call that enters the transcript has arguments
//!   that are a JSON object and an id that is non-empty and unique in the conversation: strict
//!   providers reject the whole request otherwise, on this turn and every later one. Arguments
//!   that are not a JSON object (a truncated `{"path":"a`) are stored as `{}` and the call is
//!   not run: its result tells the model why, quoting the raw text. An empty or reused id gets a
//!   fresh one (the call and its result use it alike). The same rules repair transcripts
//!   stored before them ([`crate::session::transcript::repair`] uses [`check_arguments`] and
//!   [`fresh_id`]).
//! - **A loop breaker.** The same tool with the same arguments `loop_repeat_limit` times in a
//!   row, or two calls alternating (A, B, A, B), adds a notice to the result ("the result will
//!   not change"); twice as many ends the turn with a message to the user. At most
//!   `max_tool_calls_per_turn` calls run in one turn; the rest are answered "not run" and the
//!   turn ends.

use std::collections::HashSet;

use serde_json::Value;

use crate::config::AgentConfig;
use crate::llm::{Message, ToolCall};
use crate::tools::registry::ToolOutcome;
use crate::tools::ToolError;
use crate::types::scrub::Scrubber;

/// Most characters of a call's raw argument text quoted back to the model.
const MAX_QUOTED_ARGS: usize = 2_000;

/// Most characters of a provider-given id kept in a fresh id (OpenAI allows 40 in all).
const MAX_ID_STEM: usize = 30;

/// Whether `raw` can be stored as a call's arguments: a JSON object, or nothing (stored as
/// `{}`, which every tool reads as "no arguments").
///
/// # Errors
/// Why not, for the model.
pub fn check_arguments(raw: &str) -> Result<(), String> {
    if raw.trim().is_empty() {
        return Ok(());
    }
    match serde_json::from_str::<Value>(raw) {
        Ok(Value::Object(_)) => Ok(()),
        Ok(other) => Err(format!(
            "the arguments must be a JSON object, not {}",
            crate::types::json_type_name(&other)
        )),
        Err(e) if e.is_eof() => Err(format!(
            "the arguments are not valid JSON: they end before the object is complete ({e}); they were probably cut off"
        )),
        Err(e) => Err(format!("the arguments are not valid JSON ({e})")),
    }
}

/// An id that is not in `taken` (and now is), made from `base`: its letters, digits, `_` and
/// `-` (what every provider accepts), then `_2`, `_3`… An empty `base` gives `call_1`, `call_2`…
pub fn fresh_id(base: &str, taken: &mut HashSet<String>) -> String {
    let stem: String = base
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .take(MAX_ID_STEM)
        .collect();
    let (stem, first) = if stem.is_empty() {
        ("call".to_string(), 1)
    } else {
        (stem, 2)
    };
    let mut n: u64 = first;
    loop {
        let id = format!("{stem}_{n}");
        if taken.insert(id.clone()) {
            return id;
        }
        n += 1;
    }
}

/// `raw`, quoted for the model (cut to [`MAX_QUOTED_ARGS`] characters).
fn quoted(raw: &str) -> String {
    let n = raw.chars().count();
    if n <= MAX_QUOTED_ARGS {
        return raw.to_string();
    }
    let head: String = raw.chars().take(MAX_QUOTED_ARGS).collect();
    format!("{head}… ({} more characters)", n - MAX_QUOTED_ARGS)
}

/// What the turn does with one call.
#[derive(Clone, Debug, PartialEq)]
pub struct Admit {
    /// `Err`: the call is not run; this error is its result.
    pub run: Result<(), ToolError>,
    /// Added to the call's result: it repeats (see the module docs).
    pub notice: Option<String>,
}

impl Admit {
    /// The result of a call that is not run, if this one is not.
    pub fn refused(&self) -> Option<&ToolError> {
        self.run.as_ref().err()
    }
}

/// `notice` added to a tool result `v` (a field of an object result; other results are
/// wrapped as `{"result": v, "notice": …}`).
pub fn add_notice(v: &mut Value, notice: &str) {
    match v {
        Value::Object(m) => {
            m.insert("notice".into(), Value::String(notice.to_string()));
        }
        other => {
            let inner = other.take();
            *other = serde_json::json!({ "result": inner, "notice": notice });
        }
    }
}

/// The outcome of a call that is not run: its error (with the notice, if any), cleaned like
/// every tool result (the raw arguments it quotes came from the model).
pub fn refused_outcome(e: &ToolError, admit: &Admit, scrubber: &Scrubber) -> ToolOutcome {
    let mut value = e.to_json();
    if let Some(n) = &admit.notice {
        add_notice(&mut value, n);
    }
    scrubber.clean_value(&mut value);
    ToolOutcome {
        value,
        error: Some(e.clone()),
    }
}

/// One call as the loop breaker compares them: the tool and its arguments, canonical (key
/// order and spacing do not matter).
fn signature(name: &str, args: &str) -> String {
    let canon = serde_json::from_str::<Value>(args)
        .map_or_else(|_| args.trim().to_string(), |v| v.to_string());
    format!("{name}\u{0}{canon}")
}

/// The checks of one turn (see the module docs).
#[derive(Debug)]
pub struct TurnGuard {
    /// Ids of every call in the conversation so far.
    ids: HashSet<String>,
    /// `loop_repeat_limit`.
    repeat_limit: usize,
    /// `max_tool_calls_per_turn`.
    max_calls: usize,
    /// This turn's calls, in order: (tool, signature).
    seq: Vec<(String, String)>,
    /// Why the turn ends after this round, for the user.
    stop: Option<String>,
}

impl TurnGuard {
    /// The guard of a turn over `history` (whose call ids are taken).
    pub fn new(agent: &AgentConfig, history: &[Message]) -> Self {
        Self::with_limits(
            agent.loop_repeat_limit,
            agent.max_tool_calls_per_turn,
            history,
        )
    }

    /// The same with explicit limits.
    pub fn with_limits(repeat_limit: u32, max_calls: u32, history: &[Message]) -> Self {
        Self {
            ids: history
                .iter()
                .flat_map(|m| m.tool_calls.iter().map(|c| c.id.clone()))
                .collect(),
            repeat_limit: usize::try_from(repeat_limit.max(2)).unwrap_or(usize::MAX),
            max_calls: usize::try_from(max_calls.max(1)).unwrap_or(usize::MAX),
            seq: Vec::new(),
            stop: None,
        }
    }

    /// Make the calls of one response safe to store (in place: fresh ids, `{}` for arguments
    /// that are not a JSON object) and decide what to do with each, in order.
    pub fn admit(&mut self, calls: &mut [ToolCall]) -> Vec<Admit> {
        calls.iter_mut().map(|c| self.admit_one(c)).collect()
    }

    fn admit_one(&mut self, call: &mut ToolCall) -> Admit {
        if call.id.is_empty() || !self.ids.insert(call.id.clone()) {
            let fresh = fresh_id(&call.id, &mut self.ids);
            tracing::warn!(tool = %call.name, id = %call.id, fresh = %fresh, "tool call with an empty or reused id renamed");
            call.id = fresh;
        }
        let sig = signature(&call.name, &call.arguments);
        let mut run = Ok(());
        if let Err(why) = check_arguments(&call.arguments) {
            tracing::warn!(tool = %call.name, error = %why, "tool call with invalid arguments not run");
            run = Err(ToolError::InvalidArgs(format!(
                "{}: {why}, so the call was not run. The text received was: {}\nSend the complete arguments again as one JSON object matching the tool's schema.",
                call.name,
                quoted(&call.arguments)
            )));
            call.arguments = "{}".into();
        } else if call.arguments.trim().is_empty() {
            call.arguments = "{}".into();
        }
        if let Some(stop) = &self.stop {
            return Admit {
                run: Err(not_run(stop)),
                notice: None,
            };
        }
        self.seq.push((call.name.clone(), sig));
        if self.seq.len() > self.max_calls {
            let why = format!(
                "I stopped after {} tool calls in this turn (agents.defaults.max_tool_calls_per_turn) without reaching a final answer. Ask me to continue, or narrow the task.",
                self.max_calls
            );
            tracing::warn!(max = self.max_calls, "tool call limit of the turn reached");
            self.stop = Some(why.clone());
            return Admit {
                run: Err(not_run(&why)),
                notice: None,
            };
        }
        let (notice, stop) = self.repeats();
        if let Some(why) = stop {
            tracing::warn!(tool = %call.name, "the model repeats itself; the turn ends");
            self.stop = Some(why.clone());
            return Admit {
                run: Err(not_run(&why)),
                notice: None,
            };
        }
        Admit { run, notice }
    }

    /// The notice for the last call, if it repeats, and why the turn ends, if it repeats far
    /// beyond the notice.
    fn repeats(&self) -> (Option<String>, Option<String>) {
        let n = self.seq.len();
        let Some((last_name, last)) = self.seq.last() else {
            return (None, None);
        };
        // The same call, again and again.
        let same = self.seq.iter().rev().take_while(|(_, s)| s == last).count();
        if same >= 2 * self.repeat_limit {
            return (None, Some(format!(
                "I stopped because I was going in circles: I called `{last_name}` with the same arguments {same} times in a row and the result did not change. Tell me what to try instead, or give me more to go on."
            )));
        }
        if same >= self.repeat_limit {
            return (Some(format!(
                "you called {last_name} with the same arguments {same} times in a row; the result will not change. Use the result you have, try something different, or answer the user."
            )), None);
        }
        // Two calls taking turns: A, B, A, B…
        let alternating = if n >= 2 && self.seq[n - 2].1 != *last {
            2 + (2..n)
                .rev()
                .take_while(|&k| self.seq[k].1 == self.seq[k - 2].1)
                .count()
        } else {
            0
        };
        let ping_pong = (2 * (self.repeat_limit - 1)).max(4);
        let other = self
            .seq
            .get(n.wrapping_sub(2))
            .map_or("", |(t, _)| t.as_str());
        if alternating >= 2 * ping_pong {
            return (None, Some(format!(
                "I stopped because I was going in circles: I alternated between `{other}` and `{last_name}` with the same arguments {alternating} times and the results did not change. Tell me what to try instead, or give me more to go on."
            )));
        }
        if alternating >= ping_pong {
            return (Some(format!(
                "you have alternated between {other} and {last_name} with the same arguments {alternating} times; the results will not change. Use the results you have, try something different, or answer the user."
            )), None);
        }
        (None, None)
    }

    /// Why the turn must end after this round (for the user), if it must.
    pub fn stop_reason(&self) -> Option<&str> {
        self.stop.as_deref()
    }
}

/// The result of a call that is not run because the turn ends.
fn not_run(why: &str) -> ToolError {
    ToolError::RateLimited(format!(
        "not run: this turn ends here. The user was told: {why}"
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn call(id: &str, name: &str, args: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: args.into(),
        }
    }

    fn guard() -> TurnGuard {
        TurnGuard::with_limits(3, 100, &[])
    }

    #[test]
    fn arguments_that_are_not_an_object_are_stored_as_one_and_refused_with_the_raw_text() {
        let mut g = guard();
        let mut calls = vec![
            call("a", "read_file", r#"{"path":"a"#),
            call("b", "read_file", r#"["x"]"#),
            call("c", "list_directory", ""),
            call("d", "read_file", r#" {"path": "ok"} "#),
        ];
        let admits = g.admit(&mut calls);
        let e = admits[0].refused().unwrap();
        assert_eq!(e.code(), "INVALID_ARGS");
        let text = e.to_string();
        assert!(text.contains("not valid JSON"), "{text}");
        assert!(text.contains("cut off"), "{text}");
        assert!(text.contains(r#"{"path":"a"#), "{text}");
        assert!(admits[1]
            .refused()
            .unwrap()
            .to_string()
            .contains("an array"));
        assert_eq!(admits[2].run, Ok(()));
        assert_eq!(admits[3].run, Ok(()));
        let args: Vec<_> = calls.iter().map(|c| c.arguments.as_str()).collect();
        assert_eq!(args, ["{}", "{}", "{}", r#" {"path": "ok"} "#]);
        for c in &calls {
            check_arguments(&c.arguments).unwrap();
        }
    }

    #[test]
    fn empty_and_reused_ids_get_fresh_unique_ones() {
        let mut old = Message::assistant("");
        old.tool_calls = vec![call("call_1", "x", "{}")];
        let mut g = TurnGuard::with_limits(3, 100, &[old]);
        let mut calls = vec![
            call("call_1", "x", r#"{"a":1}"#),
            call("call_1", "x", r#"{"a":2}"#),
            call("", "x", r#"{"a":3}"#),
            call("", "x", r#"{"a":4}"#),
            call("call_9", "x", r#"{"a":5}"#),
        ];
        g.admit(&mut calls);
        let ids: Vec<_> = calls.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["call_1_2", "call_1_3", "call_2", "call_3", "call_9"]);
        // Later rounds keep them unique too.
        let mut more = vec![call("call_9", "x", r#"{"a":6}"#)];
        g.admit(&mut more);
        assert_eq!(more[0].id, "call_9_2");
    }

    #[test]
    fn fresh_ids_keep_only_safe_characters() {
        let mut taken = HashSet::new();
        assert_eq!(fresh_id("toolu 01/ü", &mut taken), "toolu01_2");
        let long = "a".repeat(80);
        assert!(fresh_id(&long, &mut taken).len() <= MAX_ID_STEM + 3);
    }

    #[test]
    fn the_same_call_gets_a_notice_at_the_limit_and_ends_the_turn_at_twice_the_limit() {
        let mut g = guard();
        let mut notices = Vec::new();
        for i in 0..6 {
            // Key order and spacing do not make a call different.
            let args = if i % 2 == 0 {
                r#"{"path":"a","n":1}"#
            } else {
                r#"{ "n": 1, "path": "a" }"#
            };
            let a = g.admit(&mut [call(&format!("c{i}"), "read_file", args)]);
            notices.push((a[0].notice.is_some(), a[0].run.is_ok()));
        }
        assert_eq!(
            notices,
            [
                (false, true),
                (false, true),
                (true, true),
                (true, true),
                (true, true),
                (false, false)
            ]
        );
        let why = g.stop_reason().unwrap();
        assert!(
            why.contains("read_file") && why.contains("6 times"),
            "{why}"
        );
        // Calls after the end are not run.
        let a = g.admit(&mut [call("z", "list_directory", "{}")]);
        assert!(a[0].refused().unwrap().to_string().contains("not run"));
    }

    #[test]
    fn a_different_call_resets_the_count() {
        let mut g = guard();
        for (i, p) in ["a", "a", "b", "a", "a"].iter().enumerate() {
            let a = g.admit(&mut [call(
                &i.to_string(),
                "read_file",
                &format!(r#"{{"path":"{p}"}}"#),
            )]);
            assert_eq!(a[0].notice, None, "call {i}");
        }
    }

    #[test]
    fn ping_pong_is_detected() {
        let mut g = guard();
        let mut seen = Vec::new();
        for i in 0..8 {
            let (name, args) = if i % 2 == 0 {
                ("read_file", r#"{"path":"a"}"#)
            } else {
                ("list_directory", r#"{"path":"."}"#)
            };
            let a = g.admit(&mut [call(&i.to_string(), name, args)]);
            seen.push((a[0].notice.is_some(), a[0].run.is_ok()));
        }
        assert_eq!(&seen[..3], [(false, true); 3]);
        assert_eq!(&seen[3..7], [(true, true); 4]);
        assert_eq!(seen[7], (false, false));
        assert!(g.stop_reason().unwrap().contains("alternated"));
    }

    #[test]
    fn the_cap_on_calls_per_turn_ends_the_turn() {
        let mut g = TurnGuard::with_limits(3, 4, &[]);
        let mut calls: Vec<_> = (0..6)
            .map(|i| call(&i.to_string(), "read_file", &format!(r#"{{"path":"{i}"}}"#)))
            .collect();
        let a = g.admit(&mut calls);
        let ran: Vec<_> = a.iter().map(|a| a.run.is_ok()).collect();
        assert_eq!(ran, [true, true, true, true, false, false]);
        assert!(g.stop_reason().unwrap().contains("max_tool_calls_per_turn"));
    }

    #[test]
    fn notices_are_added_to_any_result() {
        let mut v = serde_json::json!({"content": "x"});
        add_notice(&mut v, "n");
        assert_eq!(v, serde_json::json!({"content": "x", "notice": "n"}));
        let mut v = serde_json::json!("text");
        add_notice(&mut v, "n");
        assert_eq!(v, serde_json::json!({"result": "text", "notice": "n"}));
    }
}
