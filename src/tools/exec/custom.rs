//! Custom tools from the config (seed 004 §8, without the database): `tools.custom.NAME =
//! { description, parameters, command, timeout_secs }`. The command is a shell template
//! (`dig +short {{record_type}} {{domain}}`) written by the operator; the model only fills the
//! placeholders.
//!
//! **A value never becomes shell syntax**: the template is run as `sh -c TEMPLATE custom V1 V2
//! …` with every `{{name}}` replaced by `"$N"` (a quoted positional parameter), so a value
//! reaches the program as one literal argument whatever it holds (`;`, `$(…)`, backticks,
//! newlines, quotes). Values are checked against the tool's JSON Schema first (types, `enum`,
//! `required`, no unknown argument). The command runs in the exec sandbox with `exec_shell`'s
//! network rules, limits and output handling.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ExecRuntime;
use crate::tools::{Effect, Tool, ToolContext, ToolError};
use crate::types::SettingError;

/// Default deadline of a custom tool's command (30 s).
pub const DEFAULT_CUSTOM_TIMEOUT_SECS: u64 = 30;

/// `tools.custom.NAME` in the config file.
#[derive(Debug, Default, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CustomToolFile {
    /// What the tool does, shown to the model.
    pub description: String,
    /// JSON Schema of the arguments: an object whose properties are strings, numbers,
    /// integers or booleans (default: no arguments).
    #[schemars(with = "Option<serde_json::Value>")]
    pub parameters: Option<serde_json::Value>,
    /// Shell template; `{{name}}` stands for the argument `name`, passed as one literal word.
    pub command: String,
    /// Deadline in seconds (default 30, at most 300).
    pub timeout_secs: Option<u64>,
    /// Extra environment of the command: `VAR = "value"`, `VAR_env = "DAEMON_VARIABLE"` (read
    /// from the daemon's environment) or `VAR_file = "/run/secrets/x"` (read from a file); the
    /// last two are secrets, scrubbed from every result (default: none).
    pub env: Option<BTreeMap<String, String>>,
}

/// A checked custom tool.
#[derive(Clone, Debug, PartialEq)]
pub struct CustomToolSettings {
    /// Tool name.
    pub name: String,
    /// Description.
    pub description: String,
    /// JSON Schema of the arguments (an object schema).
    pub parameters: Map<String, Value>,
    /// The template with `{{name}}` turned into `"$N"`.
    script: String,
    /// Argument names, in positional order (`$1`, `$2`, …).
    order: Vec<String>,
    /// Deadline.
    pub timeout: Duration,
    /// Extra environment (values resolved by the config layer).
    pub env: Vec<(String, String)>,
}

/// Variables a custom tool's `env` may not set: they change which code runs.
const DISALLOWED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "SHELL",
    "ENV",
    "BASH_ENV",
    "IFS",
    "NODE_OPTIONS",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "PERL5OPT",
    "RUBYOPT",
];

/// Check an environment variable name of `tools.custom.NAME.env` (without its `_env`/`_file`
/// suffix).
///
/// # Errors
/// Not a name (`[A-Za-z_][A-Za-z0-9_]*`), or one that changes which code runs.
pub fn check_env_name(key: &str, name: &str) -> Result<(), SettingError> {
    let ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        return Err(SettingError::new(
            key,
            format!("`{name}` is not an environment variable name"),
        ));
    }
    let upper = name.to_ascii_uppercase();
    if DISALLOWED_ENV.contains(&upper.as_str())
        || upper.starts_with("LD_")
        || upper.starts_with("DYLD_")
    {
        return Err(SettingError::new(
            key,
            format!("`{name}` changes which code the command runs and cannot be set"),
        ));
    }
    Ok(())
}

/// Whether `name` is a built-in tool's (every built-in is in a policy group), or `process`,
/// seed 004's runtime tool still to come: a custom tool may not shadow one.
fn is_builtin(name: &str) -> bool {
    crate::tools::policy::group_of(name).is_some() || name == "process"
}

impl CustomToolFile {
    /// Check `tools.custom.NAME`.
    ///
    /// # Errors
    /// A bad name, template, schema or timeout, naming its key.
    pub fn resolve(&self, name: &str) -> Result<CustomToolSettings, SettingError> {
        let key = format!("tools.custom.{name}");
        let name_ok = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            && !name.contains("__");
        if !name_ok {
            return Err(SettingError::new(
                key,
                "a tool name is 1–64 of A–Z, a–z, 0–9, `_` and `-`, without `__` (MCP tools use it)",
            ));
        }
        if is_builtin(name) {
            return Err(SettingError::new(
                key,
                format!("`{name}` is a built-in tool; choose another name"),
            ));
        }
        if self.description.trim().is_empty() {
            return Err(SettingError::new(
                format!("{key}.description"),
                "say what the tool does: the model chooses tools by it",
            ));
        }
        let parameters = match &self.parameters {
            None => {
                let mut m = Map::new();
                m.insert("type".into(), "object".into());
                m.insert("properties".into(), Value::Object(Map::new()));
                m
            }
            Some(Value::Object(m)) if m.get("type").and_then(Value::as_str) == Some("object") => {
                m.clone()
            }
            Some(_) => {
                return Err(SettingError::new(
                    format!("{key}.parameters"),
                    "must be a JSON Schema object: { type = \"object\", properties = { … } }",
                ))
            }
        };
        let props = parameters
            .get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        for (p, schema) in &props {
            let ty = schema.get("type").and_then(Value::as_str).unwrap_or("");
            if !["string", "number", "integer", "boolean"].contains(&ty) {
                return Err(SettingError::new(
                    format!("{key}.parameters.properties.{p}"),
                    "each argument needs `type` = \"string\", \"number\", \"integer\" or \"boolean\"",
                ));
            }
        }
        let (script, order) = compile(&self.command, &props)
            .map_err(|e| SettingError::new(format!("{key}.command"), e))?;
        let timeout = match self.timeout_secs {
            None => Duration::from_secs(DEFAULT_CUSTOM_TIMEOUT_SECS),
            Some(n) if (1..=300).contains(&n) => Duration::from_secs(n),
            Some(n) => {
                return Err(SettingError::new(
                    format!("{key}.timeout_secs"),
                    format!("expected 1..=300 seconds, got {n}"),
                ))
            }
        };
        Ok(CustomToolSettings {
            name: name.to_string(),
            description: self.description.trim().to_string(),
            parameters,
            script,
            order,
            timeout,
            env: Vec::new(),
        })
    }
}

/// The template with each `{{name}}` replaced by `"$N"`, and the names in positional order.
fn compile(template: &str, props: &Map<String, Value>) -> Result<(String, Vec<String>), String> {
    if template.trim().is_empty() {
        return Err("is empty: give the command line, e.g. \"dig +short {{domain}}\"".into());
    }
    let mut order: Vec<String> = Vec::new();
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(i) = rest.find("{{") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let j = after.find("}}").ok_or_else(|| {
            format!(
                "`{{{{` at byte {} is not closed with `}}}}`",
                template.len() - rest.len() + i
            )
        })?;
        let name = after[..j].trim();
        if !props.contains_key(name) {
            return Err(format!(
                "`{{{{{name}}}}}` names no argument of `parameters.properties`"
            ));
        }
        let n = match order.iter().position(|o| o == name) {
            Some(k) => k + 1,
            None => {
                order.push(name.to_string());
                order.len()
            }
        };
        out.push_str(&format!("\"${{{n}}}\""));
        rest = &after[j + 2..];
    }
    out.push_str(rest);
    Ok((out, order))
}

/// The arguments as words, in positional order, checked against the schema.
fn words(s: &CustomToolSettings, args: &Value) -> Result<Vec<String>, ToolError> {
    let empty = Map::new();
    let given = match args {
        Value::Object(m) => m,
        Value::Null => &empty,
        _ => {
            return Err(ToolError::InvalidArgs(
                "arguments must be a JSON object".into(),
            ))
        }
    };
    let no_props = Map::new();
    let props = s
        .parameters
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&no_props);
    if let Some(k) = given.keys().find(|k| !props.contains_key(*k)) {
        return Err(ToolError::InvalidArgs(format!(
            "unknown argument `{k}`; the tool takes: {}",
            props.keys().cloned().collect::<Vec<_>>().join(", ")
        )));
    }
    let required: Vec<&str> = s
        .parameters
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for r in required {
        if !given.contains_key(r) {
            return Err(ToolError::InvalidArgs(format!("`{r}` is required")));
        }
    }
    let mut out = Vec::with_capacity(s.order.len());
    for name in &s.order {
        let schema = &props[name];
        let Some(v) = given.get(name) else {
            out.push(String::new());
            continue;
        };
        let ty = schema.get("type").and_then(Value::as_str).unwrap_or("");
        let word = match (ty, v) {
            ("string", Value::String(t)) => t.clone(),
            ("integer", Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
            ("number", Value::Number(n)) => n.to_string(),
            ("boolean", Value::Bool(b)) => b.to_string(),
            _ => {
                return Err(ToolError::InvalidArgs(format!(
                    "`{name}` must be a {ty}, got {v}"
                )))
            }
        };
        if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
            if !allowed.contains(v) {
                return Err(ToolError::InvalidArgs(format!(
                    "`{name}` must be one of {}",
                    Value::Array(allowed.clone())
                )));
            }
        }
        if word.contains('\0') {
            return Err(ToolError::InvalidArgs(format!("`{name}` contains NUL")));
        }
        out.push(word);
    }
    Ok(out)
}

/// A custom tool.
pub struct CustomTool {
    settings: CustomToolSettings,
    rt: Arc<ExecRuntime>,
}

impl CustomTool {
    /// `settings` run on `rt` (the exec sandbox).
    pub fn new(settings: CustomToolSettings, rt: Arc<ExecRuntime>) -> Self {
        Self { settings, rt }
    }
}

#[async_trait]
impl Tool for CustomTool {
    fn name(&self) -> &str {
        &self.settings.name
    }
    fn description(&self) -> &str {
        &self.settings.description
    }
    fn parameters(&self) -> Value {
        Value::Object(self.settings.parameters.clone())
    }
    fn time_budget(&self) -> Option<Duration> {
        Some(self.settings.timeout + Duration::from_secs(5))
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let words = words(&self.settings, &args)?;
        let mut argv: Vec<OsString> = vec![
            "-c".into(),
            self.settings.script.clone().into(),
            self.settings.name.clone().into(),
        ];
        argv.extend(words.into_iter().map(OsString::from));
        let done = self
            .rt
            .run_with_env(
                ctx,
                OsStr::new("sh"),
                &argv,
                self.settings.timeout,
                &self.settings.env,
            )
            .await?;
        Ok(Value::Object(done.to_json()))
    }
    fn effect(&self) -> Effect {
        Effect::Executes
    }
}

/// The custom tools of `tools.custom`, checked.
///
/// # Errors
/// The first bad entry, naming its key.
pub fn resolve_all(
    file: &BTreeMap<String, CustomToolFile>,
) -> Result<Vec<CustomToolSettings>, SettingError> {
    file.iter().map(|(n, f)| f.resolve(n)).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::super::test_support::fixture;
    use super::*;

    fn tool(command: &str) -> CustomToolFile {
        CustomToolFile {
            description: "echo a value".into(),
            parameters: Some(serde_json::json!({
                "type": "object",
                "properties": {"value": {"type": "string"}, "n": {"type": "integer"}},
                "required": ["value"]
            })),
            command: command.into(),
            timeout_secs: None,
            env: None,
        }
    }

    #[test]
    fn templates_become_quoted_positional_parameters() {
        let s = tool("printf '%s|' {{value}} {{n}} {{value}}")
            .resolve("say")
            .unwrap();
        assert_eq!(s.script, "printf '%s|' \"${1}\" \"${2}\" \"${1}\"");
        assert_eq!(s.order, ["value", "n"]);
        let e = tool("echo {{nope}}").resolve("say").unwrap_err();
        assert_eq!(e.key, "tools.custom.say.command");
        let e = tool("echo {{value").resolve("say").unwrap_err();
        assert!(e.detail.contains("not closed"), "{}", e.detail);
        assert_eq!(
            tool("x").resolve("exec_shell").unwrap_err().key,
            "tools.custom.exec_shell"
        );
        assert!(tool("x").resolve("a__b").is_err());
    }

    #[test]
    fn arguments_are_checked_against_the_schema() {
        let s = tool("echo {{value}} {{n}}").resolve("say").unwrap();
        let w = |v: Value| words(&s, &v);
        assert_eq!(
            w(serde_json::json!({"value": "x", "n": 3})).unwrap(),
            ["x", "3"]
        );
        assert!(w(serde_json::json!({"n": 3})).is_err(), "required");
        assert!(w(serde_json::json!({"value": 5})).is_err(), "type");
        assert!(
            w(serde_json::json!({"value": "x", "n": 1.5})).is_err(),
            "integer"
        );
        assert!(
            w(serde_json::json!({"value": "x", "extra": 1})).is_err(),
            "unknown"
        );
    }

    #[tokio::test]
    async fn hostile_values_stay_literal_and_the_canary_survives() {
        let fx = fixture();
        // In the workspace, where a command may write: only quoting protects it.
        let canary_path = fx.ws.join("CANARY");
        std::fs::write(&canary_path, "alive").unwrap();
        let canary = canary_path.to_string_lossy().into_owned();
        let s = tool("printf '[%s]\\n' {{value}}").resolve("say").unwrap();
        let t = CustomTool::new(s, fx.rt.clone());
        for hostile in [
            format!("; rm -f {canary}"),
            format!("$(rm -f {canary})"),
            format!("`rm -f {canary}`"),
            format!("x\nrm -f {canary}"),
            format!("' ; rm -f {canary} ; '"),
            "-n".to_string(),
            "$HOME *".to_string(),
        ] {
            let out = t
                .execute(serde_json::json!({"value": hostile}), &fx.ctx)
                .await
                .unwrap();
            assert_eq!(out["exit_code"], 0, "{out}");
            assert_eq!(
                out["stdout"].as_str().unwrap(),
                format!("[{hostile}]\n"),
                "the value reaches the program as one literal word"
            );
            assert_eq!(std::fs::read_to_string(&canary_path).unwrap(), "alive");
        }
    }
}
