//! Tool discovery: which tools a turn is offered in full, and `tool_search`, which loads the
//! others into the turn when the model needs them (docs/tools.md, "Core tools and
//! `tool_search`").
//!
//! Every request carries the **core** tools ([`super::builtin::Builtin::core`], plus the operator's pins
//! `agents.*.tools.always`) with their schemas; the other allowed tools are listed by name and
//! one line in the system prompt ([`list_section`]). `tool_search` ranks every allowed tool by
//! BM25 over its name, description and parameter names ([`rank`]); the turn appends the
//! schemas of the tools it returns to the tool list, after the ones already there, so the
//! request prefix a provider caches never changes order (`turn::offer`).
//!
//! This module decides nothing about permissions: the policy has already filtered what it
//! sees, and a call is checked again by the registry.

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::{schema_of, Effect, Tool, ToolContext, ToolError};

/// The name of the search tool.
pub const TOOL_SEARCH: &str = super::builtin::Builtin::ToolSearch.name();

/// Tools found by one `tool_search` at most (default 3).
const MAX_RESULTS: usize = 8;
/// Default number of tools one `tool_search` returns and loads.
const DEFAULT_RESULTS: usize = 3;
/// Most characters of a description kept on a tool's line in the list.
const LINE_CHARS: usize = 60;
/// Most bytes of the list of tools loaded on demand (2 KiB): past it, the remaining tools are
/// counted, not listed (an MCP server with a hundred tools must not refill the prompt).
const LIST_BYTES: usize = 2048;

/// The header of the list of tools loaded on demand (weft-bench finds the section by it).
pub const LIST_HEADER: &str =
    "\n\nMore tools (load with tool_search, by name or by what you need):";

/// The first clause of a description (up to a sentence's end, `:`, `;` or ` (`), at most
/// [`LINE_CHARS`] characters: a tool's line in the list.
pub fn one_line(description: &str) -> String {
    let first = description.lines().next().unwrap_or_default().trim();
    let sentence = first
        .char_indices()
        .find(|(i, c)| {
            let next = first[i + 1..].chars().next();
            match c {
                '.' | ':' | ';' => next.is_none_or(char::is_whitespace),
                ' ' => next == Some('('),
                _ => false,
            }
        })
        .map_or(first, |(i, _)| &first[..i]);
    if sentence.chars().count() <= LINE_CHARS {
        return sentence.to_string();
    }
    let mut s: String = sentence.chars().take(LINE_CHARS - 1).collect();
    s.push('…');
    s
}

/// The system prompt's list of tools that are not loaded: `(name, one line)`, in the order
/// given (empty without any).
pub fn list_section(deferred: &[(String, String)]) -> String {
    if deferred.is_empty() {
        return String::new();
    }
    let mut s = String::from(LIST_HEADER);
    for (i, (name, line)) in deferred.iter().enumerate() {
        let entry = if line.is_empty() {
            format!("\n- {name}")
        } else {
            format!("\n- {name}: {line}")
        };
        if s.len() + entry.len() > LIST_BYTES {
            s.push_str(&format!(
                "\n- … and {} more (find them with tool_search)",
                deferred.len() - i
            ));
            break;
        }
        s.push_str(&entry);
    }
    s
}

/// English words a search ignores.
const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "i", "in", "is", "it", "me",
    "my", "of", "on", "or", "that", "the", "this", "to", "with", "you", "your",
];

/// The terms of `text` for [`bm25`]: words of letters and digits (`_`, `-`, `.` and every other
/// character split them, so `sessions_list` is `sessions list`), lower-cased, English stop
/// words dropped, and a light stemming (`reminders` = `reminder`, `scheduled` = `schedule`,
/// `running` = `run`) so a query and a description meet on the word, not its form. Small on
/// purpose: tool and skill descriptions are short; `memory::text` is the full analyser.
pub fn terms(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .filter(|w| !STOP_WORDS.contains(&w.as_str()))
        .map(|w| stem(&w))
        .collect()
}

/// Strip one common English suffix, leaving at least 3 letters (not the `s` of `-ss`/`-us`:
/// `process`, `status`), and a final `e`.
fn stem(w: &str) -> String {
    for suffix in ["ing", "ies", "es", "ed", "s"] {
        if let Some(base) = w.strip_suffix(suffix) {
            if base.chars().count() >= 3 && !w.ends_with("ss") && !w.ends_with("us") {
                let base = match suffix {
                    "ies" => format!("{base}y"),
                    "ing" | "ed" => {
                        // running → run, scheduled → schedul(e): keep comparable forms.
                        let b: Vec<char> = base.chars().collect();
                        if b.len() >= 2 && b[b.len() - 1] == b[b.len() - 2] {
                            b[..b.len() - 1].iter().collect()
                        } else {
                            base.trim_end_matches('e').to_string()
                        }
                    }
                    _ => base.to_string(),
                };
                return base.trim_end_matches('e').to_string();
            }
        }
    }
    w.trim_end_matches('e').to_string()
}

/// BM25 (k1 = 1.2, b = 0.75) of `query` over `docs` (each a list of terms, see [`terms`]):
/// `(index, score)` of the documents with a score above zero, best first, ties in document
/// order.
pub fn bm25(docs: &[Vec<String>], query: &[String]) -> Vec<(usize, f64)> {
    const K1: f64 = 1.2;
    const B: f64 = 0.75;
    if docs.is_empty() || query.is_empty() {
        return Vec::new();
    }
    #[allow(clippy::cast_precision_loss)]
    let n = docs.len() as f64;
    #[allow(clippy::cast_precision_loss)]
    let average = (docs.iter().map(Vec::len).sum::<usize>() as f64 / n).max(1.0);
    let mut distinct: Vec<&String> = query.iter().collect();
    distinct.sort_unstable();
    distinct.dedup();
    let mut scores: Vec<(usize, f64)> = docs
        .iter()
        .enumerate()
        .map(|(i, doc)| {
            #[allow(clippy::cast_precision_loss)]
            let len = doc.len() as f64;
            let score = distinct
                .iter()
                .map(|term| {
                    #[allow(clippy::cast_precision_loss)]
                    let df = docs.iter().filter(|d| d.contains(term)).count() as f64;
                    #[allow(clippy::cast_precision_loss)]
                    let tf = doc.iter().filter(|t| t == term).count() as f64;
                    if tf == 0.0 {
                        return 0.0;
                    }
                    let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
                    idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * len / average))
                })
                .sum::<f64>();
            (i, score)
        })
        .filter(|(_, s)| *s > 0.0)
        .collect();
    scores.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    scores
}

/// One tool as `tool_search` sees it.
pub struct Candidate {
    /// Its name.
    pub name: String,
    /// Its description.
    pub description: String,
    /// Its parameters' names.
    pub params: Vec<String>,
}

impl Candidate {
    /// The candidate of a tool.
    pub fn of(tool: &dyn Tool) -> Self {
        let params = tool.parameters()["properties"]
            .as_object()
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default();
        Self {
            name: tool.name().to_string(),
            description: tool.description().to_string(),
            params,
        }
    }
}

/// The best `limit` of `candidates` for `query`: a candidate named exactly by the query (or by
/// one of its words) first, then by BM25 over name (weighted twice), description and
/// parameter names.
pub fn rank(candidates: &[Candidate], query: &str, limit: usize) -> Vec<usize> {
    let docs: Vec<Vec<String>> = candidates
        .iter()
        .map(|c| {
            let name = terms(&c.name);
            let mut d = name.clone();
            d.extend(name);
            d.extend(terms(&c.description));
            d.extend(terms(&c.params.join(" ")));
            d
        })
        .collect();
    let words: Vec<&str> = query
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|w| !w.is_empty())
        .collect();
    let mut out: Vec<usize> = Vec::new();
    for w in &words {
        if let Some(i) = candidates
            .iter()
            .position(|c| w.eq_ignore_ascii_case(&c.name))
            .filter(|i| !out.contains(i))
        {
            out.push(i);
        }
    }
    for (i, _) in bm25(&docs, &terms(query)) {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out.truncate(limit);
    out
}

/// Arguments of `tool_search`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolSearchArgs {
    /// What the tool should do, or names.
    pub query: String,
    /// Default 3, max 8.
    pub limit: Option<usize>,
}

impl ToolSearchArgs {
    /// The number of tools to return.
    pub fn limit(&self) -> usize {
        self.limit.unwrap_or(DEFAULT_RESULTS).clamp(1, MAX_RESULTS)
    }
}

/// `tool_search`: find tools that are not loaded and load them into the turn. Answered by the
/// registry itself ([`super::ToolRegistry`] knows every tool and the policy); this type gives
/// its name, schema and description.
pub struct ToolSearch;

#[async_trait]
impl Tool for ToolSearch {
    fn name(&self) -> &str {
        TOOL_SEARCH
    }
    fn description(&self) -> &str {
        "Load tools from \"More tools\" by name or by what they do."
    }
    fn parameters(&self) -> Value {
        schema_of::<ToolSearchArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::ReadOnly
    }
    async fn execute(&self, _args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        // Only reached outside a registry (a registry answers `tool_search` itself).
        Err(ToolError::ExecutionFailed(
            "tool_search runs inside the tool registry".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn c(name: &str, description: &str, params: &[&str]) -> Candidate {
        Candidate {
            name: name.into(),
            description: description.into(),
            params: params.iter().map(|p| (*p).to_string()).collect(),
        }
    }

    #[test]
    fn rank_by_name_description_and_parameters() {
        let all = [
            c(
                "cron",
                "Schedule jobs: reminders and recurring tasks",
                &["schedule"],
            ),
            c(
                "process",
                "Run a background command and poll its output",
                &["action"],
            ),
            c("sessions_list", "List the chat sessions", &["limit"]),
            c(
                "github__create_issue",
                "Open an issue in a repository",
                &["title", "body"],
            ),
        ];
        let names = |q: &str, n: usize| -> Vec<&str> {
            rank(&all, q, n)
                .into_iter()
                .map(|i| all[i].name.as_str())
                .collect()
        };
        assert_eq!(names("remind me tomorrow: schedule", 1), ["cron"]);
        assert_eq!(names("background command output", 3), ["process"]);
        assert_eq!(
            names("open a github issue with a title", 1),
            ["github__create_issue"]
        );
        assert_eq!(names("sessions", 3), ["sessions_list"]);
        // An exact name comes first, whatever the scores.
        assert_eq!(names("process cron", 2), ["process", "cron"]);
        assert!(names("zebra", 3).is_empty());
    }

    #[test]
    fn terms_split_names_fold_case_and_stem() {
        assert_eq!(terms("sessions_list"), ["session", "list"]);
        assert_eq!(terms("Reminders"), terms("reminder"));
        assert_eq!(terms("scheduled"), terms("schedule"));
        assert_eq!(terms("running"), terms("run"));
        assert_eq!(terms("the status of my chat"), ["status", "chat"]);
        assert_eq!(terms("process"), ["process"]);
    }

    #[test]
    fn one_line_and_the_list_cap() {
        assert_eq!(one_line("Schedule jobs. Returns: {x}"), "Schedule jobs");
        assert_eq!(one_line("Read v1.2 of it\nmore"), "Read v1.2 of it");
        assert_eq!(one_line("Save notes: append or overwrite"), "Save notes");
        assert_eq!(
            one_line("Read a document (a path) or lines"),
            "Read a document"
        );
        assert_eq!(one_line("Search memory; best first"), "Search memory");
        assert_eq!(one_line(&"x".repeat(200)).chars().count(), LINE_CHARS);
        let many: Vec<(String, String)> = (0..100)
            .map(|i| (format!("srv__tool_{i}"), "does a thing".to_string()))
            .collect();
        let s = list_section(&many);
        assert!(
            s.starts_with(LIST_HEADER) && s.len() < LIST_BYTES + 100,
            "{s}"
        );
        assert!(s.contains("more (find them with tool_search)"), "{s}");
        assert!(list_section(&[]).is_empty());
    }
}
