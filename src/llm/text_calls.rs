//! The tolerant tool-call reader: tool calls a local model wrote as text (its chat template or
//! the server's flags did not turn them into `tool_calls`), read into proper [`ToolCall`]s.
//!
//! Formats: Hermes/Qwen `<tool_call>{"name": …, "arguments": …}</tool_call>`, Llama 3.x
//! `<|python_tag|>{…}` or a bare `{"name": …, "parameters": …}`, Mistral
//! `[TOOL_CALLS][{…}, …]`, and a fenced JSON block. Small JSON mistakes are repaired (single
//! quotes, trailing commas, arguments given as a JSON string, unquoted keys are not guessed),
//! and each repaired call says so ([`TextCall::repaired`]). Pure functions: no I/O, no state.

use serde_json::{Map, Value};

/// How a provider's tool calls are read (`providers.*.tool_call_format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// Only the server's `tool_calls` (hosted APIs).
    Native,
    /// The server's `tool_calls`, else any text format below (default for local servers).
    Auto,
    /// Hermes/Qwen `<tool_call>…</tool_call>` only.
    Hermes,
    /// Llama 3.x `<|python_tag|>` or a bare `{"name", "parameters"}` only.
    Llama,
    /// Mistral `[TOOL_CALLS]` only.
    Mistral,
    /// A fenced or bare JSON object only.
    Json,
}

impl ToolCallFormat {
    /// Parse a setting value.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "native" => Self::Native,
            "auto" => Self::Auto,
            "hermes" | "qwen" => Self::Hermes,
            "llama" | "llama3" => Self::Llama,
            "mistral" => Self::Mistral,
            "json" => Self::Json,
            _ => return None,
        })
    }

    /// The setting's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Auto => "auto",
            Self::Hermes => "hermes",
            Self::Llama => "llama",
            Self::Mistral => "mistral",
            Self::Json => "json",
        }
    }
}

/// One tool call read from text.
#[derive(Clone, Debug, PartialEq)]
pub struct TextCall {
    /// The tool's name.
    pub name: String,
    /// Its arguments as a JSON object's text.
    pub arguments: String,
    /// Whether the JSON needed repairs (the model is told).
    pub repaired: bool,
}

/// The tool calls written in `content`, with the text around them (what the model said besides
/// the calls); `None` when it holds no call in the formats `format` reads, or a name no tool
/// of `offered` would make sense for is empty.
pub fn read(content: &str, format: ToolCallFormat) -> Option<(Vec<TextCall>, String)> {
    let t = content.trim();
    let try_all = format == ToolCallFormat::Auto;
    if try_all || format == ToolCallFormat::Hermes {
        if let Some(r) = hermes(t) {
            return Some(r);
        }
    }
    if try_all || format == ToolCallFormat::Mistral {
        if let Some(rest) = t.strip_prefix("[TOOL_CALLS]") {
            let calls = calls_of(rest.trim())?;
            return Some((calls, String::new()));
        }
    }
    if try_all || format == ToolCallFormat::Llama {
        if let Some(idx) = t.find("<|python_tag|>") {
            let body = t[idx + "<|python_tag|>".len()..]
                .trim()
                .trim_end_matches("<|eom_id|>")
                .trim_end_matches("<|eot_id|>");
            let calls = body
                .split(';')
                .filter(|p| !p.trim().is_empty())
                .map(|p| calls_of(p.trim()))
                .collect::<Option<Vec<_>>>()?
                .concat();
            return Some((calls, t[..idx].trim().to_string()));
        }
    }
    if try_all || format == ToolCallFormat::Json || format == ToolCallFormat::Llama {
        if let Some(r) = fenced(t) {
            return Some(r);
        }
        if t.starts_with('{') || t.starts_with('[') {
            return calls_of(t).map(|c| (c, String::new()));
        }
    }
    None
}

fn hermes(t: &str) -> Option<(Vec<TextCall>, String)> {
    const OPEN: &str = "<tool_call>";
    const CLOSE: &str = "</tool_call>";
    let first = t.find(OPEN)?;
    let mut calls = Vec::new();
    let mut rest = &t[first..];
    let mut said = t[..first].trim().to_string();
    while let Some(start) = rest.find(OPEN) {
        let after = &rest[start + OPEN.len()..];
        // A missing close tag (the model stopped at it) ends the call at the text's end.
        let (body, next) = match after.find(CLOSE) {
            Some(end) => (&after[..end], &after[end + CLOSE.len()..]),
            None => (after, ""),
        };
        calls.extend(calls_of(body.trim())?);
        let between = &next[..next.find(OPEN).unwrap_or(next.len())];
        if !between.trim().is_empty() {
            if !said.is_empty() {
                said.push('\n');
            }
            said.push_str(between.trim());
        }
        rest = next;
    }
    (!calls.is_empty()).then_some((calls, said))
}

fn fenced(t: &str) -> Option<(Vec<TextCall>, String)> {
    let start = t.find("```")?;
    let after = &t[start + 3..];
    let body_start = after.find('\n')?;
    let lang = after[..body_start].trim();
    if !(lang.is_empty() || lang == "json" || lang == "tool_call") {
        return None;
    }
    let body = &after[body_start + 1..];
    let end = body.find("```")?;
    let calls = calls_of(body[..end].trim())?;
    let said = format!("{} {}", t[..start].trim(), body[end + 3..].trim());
    Some((calls, said.trim().to_string()))
}

/// The calls in a JSON text: one object or an array of them, each with `name` and
/// `arguments` or `parameters` (also the OpenAI shape `{"function": {…}}`).
fn calls_of(text: &str) -> Option<Vec<TextCall>> {
    let (v, repaired) = parse_lenient(text)?;
    let items = match v {
        Value::Array(a) => a,
        one @ Value::Object(_) => vec![one],
        _ => return None,
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let item = match item.get("function") {
            Some(f) if f.is_object() => f.clone(),
            _ => item,
        };
        let name = item["name"].as_str()?.trim().to_string();
        if name.is_empty() {
            return None;
        }
        let args = item
            .get("arguments")
            .or_else(|| item.get("parameters"))
            .cloned()
            .unwrap_or(Value::Object(Map::new()));
        let (args, fixed) = match args {
            Value::Object(m) => (Value::Object(m), false),
            // Arguments given as a JSON string: read the string.
            Value::String(s) => (parse_lenient(&s)?.0, true),
            Value::Null => (Value::Object(Map::new()), false),
            _ => return None,
        };
        if !args.is_object() {
            return None;
        }
        out.push(TextCall {
            name,
            arguments: args.to_string(),
            repaired: repaired || fixed,
        });
    }
    (!out.is_empty()).then_some(out)
}

/// `text` as JSON, else repaired (single-quoted strings, trailing commas, Python's
/// `True`/`False`/`None`): the value and whether a repair was needed.
pub fn parse_lenient(text: &str) -> Option<(Value, bool)> {
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        return Some((v, false));
    }
    let fixed = repair(text);
    serde_json::from_str::<Value>(&fixed)
        .ok()
        .map(|v| (v, true))
}

/// Single quotes turned into double quotes (outside double-quoted strings), trailing commas
/// dropped, and Python literals outside strings turned into JSON's.
fn repair(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    // The quote of the string we are in (`"` or `'`), if any.
    let mut quote: Option<char> = None;
    while i < chars.len() {
        let c = chars[i];
        match quote {
            Some(q) => {
                if c == '\\' && i + 1 < chars.len() {
                    // `\'` inside a single-quoted string is a plain quote in JSON.
                    if chars[i + 1] == '\'' {
                        out.push('\'');
                    } else {
                        out.push(c);
                        out.push(chars[i + 1]);
                    }
                    i += 2;
                    continue;
                }
                if c == q {
                    out.push('"');
                    quote = None;
                } else if c == '"' {
                    out.push_str("\\\"");
                } else {
                    out.push(c);
                }
            }
            None => match c {
                '"' | '\'' => {
                    out.push('"');
                    quote = Some(c);
                }
                ',' => {
                    let next = chars[i + 1..].iter().find(|c| !c.is_whitespace());
                    if !matches!(next, Some('}' | ']')) {
                        out.push(',');
                    }
                }
                _ => {
                    let rest: String = chars[i..chars.len().min(i + 5)].iter().collect();
                    let word = [("True", "true"), ("False", "false"), ("None", "null")]
                        .iter()
                        .find(|(py, _)| rest.starts_with(py));
                    if let Some((py, js)) = word {
                        out.push_str(js);
                        i += py.len();
                        continue;
                    }
                    out.push(c);
                }
            },
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn one(content: &str) -> (String, Value, bool) {
        let (calls, _) = read(content, ToolCallFormat::Auto).expect(content);
        assert_eq!(calls.len(), 1, "{content}");
        let c = &calls[0];
        (
            c.name.clone(),
            serde_json::from_str(&c.arguments).unwrap(),
            c.repaired,
        )
    }

    #[test]
    fn each_text_format_is_read() {
        let want = serde_json::json!({"path": "notes.md"});
        for text in [
            r#"<tool_call>{"name": "read_file", "arguments": {"path": "notes.md"}}</tool_call>"#,
            "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"notes.md\"}}\n</tool_call>",
            r#"<|python_tag|>{"name": "read_file", "parameters": {"path": "notes.md"}}<|eom_id|>"#,
            r#"{"name": "read_file", "parameters": {"path": "notes.md"}}"#,
            r#"[TOOL_CALLS][{"name": "read_file", "arguments": {"path": "notes.md"}}]"#,
            "Let me look.\n```json\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"notes.md\"}}\n```",
        ] {
            let (name, args, repaired) = one(text);
            assert_eq!(name, "read_file", "{text}");
            assert_eq!(args, want, "{text}");
            assert!(!repaired, "{text}");
        }
    }

    #[test]
    fn small_json_mistakes_are_repaired_and_say_so() {
        for text in [
            "<tool_call>{'name': 'read_file', 'arguments': {'path': 'notes.md'}}</tool_call>",
            r#"<tool_call>{"name": "read_file", "arguments": {"path": "notes.md",},}</tool_call>"#,
            r#"<tool_call>{"name": "read_file", "arguments": "{\"path\": \"notes.md\"}"}</tool_call>"#,
        ] {
            let (name, args, repaired) = one(text);
            assert_eq!(name, "read_file", "{text}");
            assert_eq!(args["path"], "notes.md", "{text}");
            assert!(repaired, "{text}");
        }
    }

    #[test]
    fn several_calls_and_the_text_around_them() {
        let (calls, said) = read(
            "Sure.\n<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"b\", \"arguments\": {\"x\": 1}}</tool_call>",
            ToolCallFormat::Auto,
        )
        .unwrap();
        assert_eq!(
            calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(said, "Sure.");
    }

    #[test]
    fn plain_text_and_other_formats_are_left_alone() {
        assert!(read("The answer is 42.", ToolCallFormat::Auto).is_none());
        assert!(read(r#"{"temperature": 20}"#, ToolCallFormat::Auto).is_none());
        let hermes = r#"<tool_call>{"name": "a", "arguments": {}}</tool_call>"#;
        assert!(read(hermes, ToolCallFormat::Native).is_none());
        assert!(read(hermes, ToolCallFormat::Mistral).is_none());
        assert!(read(hermes, ToolCallFormat::Hermes).is_some());
    }
}
