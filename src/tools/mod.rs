//! ⑥ Tools: the [`Tool`] trait, [`ToolError`] and its model-facing JSON, the [`ToolRegistry`]
//! (dispatch, scrubbing, truncation) and the built-in tools.
//!
//! Tools never see the transcript or the store; the registry turns every model-visible failure
//! into a tool result so the loop carries on.

pub mod builtin;
pub mod canvas;
pub mod discovery;
pub mod exec;
pub mod file_settings;
pub mod fs;
pub mod gateway;
pub mod html;
pub mod memory;
pub mod message;
pub mod nodes;
pub mod policy;
pub mod protected;
pub mod ratelimit;
pub mod registry;
pub mod sandbox;
pub mod scrub;
pub mod search;
pub mod sessions;
pub mod shared_docs;
pub mod shell_policy;
pub mod truncate;
pub mod web;
pub mod workspace;

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

pub use registry::ToolRegistry;
pub use workspace::Workspace;

use crate::types::MutexExt;
use crate::types::SessionKey;

/// Max bytes of tool output returned to the model (64 KiB, seed 002): keeps one result under
/// ~16k tokens.
pub const MAX_TOOL_RESULT_BYTES: usize = 65_536;

/// Why a tool call failed. All variants but [`ToolError::Fatal`] go back to the model as
/// `{"error": ..., "error_code": ...}` and the turn continues.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ToolError {
    /// The tool name is not in the registry.
    #[error("unknown tool {0}")]
    NotFound(String),
    /// The arguments do not satisfy the schema (or are not JSON).
    #[error("{0}")]
    InvalidArgs(String),
    /// A runtime error.
    #[error("{0}")]
    ExecutionFailed(String),
    /// Blocked by a safety check.
    #[error("{0}")]
    PermissionDenied(String),
    /// A required file does not exist.
    #[error("{0}")]
    FileNotFound(String),
    /// The path is invalid or escapes the workspace.
    #[error("{0}")]
    InvalidPath(String),
    /// The file is not text.
    #[error("{0}")]
    BinaryFile(String),
    /// Exceeded its time limit (seconds).
    #[error("timed out after {0}s")]
    Timeout(u64),
    /// Cancelled by `/stop` or shutdown.
    #[error("cancelled")]
    Cancelled,
    /// The session made too many tool calls too fast.
    #[error("{0}")]
    RateLimited(String),
    /// Infrastructure broken: ends the turn, reported to the user.
    #[error("fatal: {0}")]
    Fatal(String),
}

impl ToolError {
    /// The machine-readable `error_code` shown to the model.
    pub fn code(&self) -> &'static str {
        match self {
            ToolError::NotFound(_) => "NOT_FOUND",
            ToolError::InvalidArgs(_) => "INVALID_ARGS",
            ToolError::ExecutionFailed(_) => "EXECUTION_FAILED",
            ToolError::PermissionDenied(_) => "PERMISSION_DENIED",
            ToolError::FileNotFound(_) => "FILE_NOT_FOUND",
            ToolError::InvalidPath(_) => "INVALID_PATH",
            ToolError::BinaryFile(_) => "BINARY_FILE",
            ToolError::Timeout(_) => "TIMEOUT",
            ToolError::Cancelled => "CANCELLED",
            ToolError::RateLimited(_) => "RATE_LIMITED",
            ToolError::Fatal(_) => "FATAL",
        }
    }

    /// The tool result the model sees.
    pub fn to_json(&self) -> Value {
        json!({ "error": self.to_string(), "error_code": self.code() })
    }

    /// Whether the turn must end.
    pub fn is_fatal(&self) -> bool {
        matches!(self, ToolError::Fatal(_))
    }
}

/// What a tool does to the world, for policy decisions. Unknown means [`Effect::Executes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Reads only.
    ReadOnly,
    /// Writes files or memory.
    Writes,
    /// Runs programs.
    Executes,
    /// Talks to the network.
    Network,
}

/// Per-call context handed to a tool.
#[derive(Clone)]
pub struct ToolContext {
    /// The session's workspace.
    pub workspace: Arc<Workspace>,
    /// The session calling.
    pub session: SessionKey,
    /// Fires on `/stop` or shutdown: tools must stop and kill their children.
    pub cancel: CancellationToken,
    /// The chat user's own memory directory (`users/<channel>-<user>`) under
    /// `memory.scope = "user"`; `None` for the agent's shared memory.
    pub user_dir: Option<Arc<str>>,
    /// The chat user whose message this turn answers (their sender id on the session's
    /// channel); `None` for the terminal, the operator and the gateway's own messages.
    pub sender: Option<Arc<str>>,
    /// The id of the tool call being run (the model's call id), set by the registry for each
    /// call: lets a tool make its effect idempotent per call (`sessions_send`).
    pub call_id: Option<Arc<str>>,
    /// The turn the call runs in (shared by every call of the turn).
    pub turn: Arc<TurnScope>,
}

/// What the calls of one turn share: which inbound event it answers, and the tools calls
/// made visible for the rest of the turn.
#[derive(Debug, Default)]
pub struct TurnScope {
    /// The event id of the inbound message the turn answers; the same when the turn is
    /// resumed after a restart, so a tool can make its effect idempotent per turn
    /// (`sessions_send`). `None` outside a turn (`weft tools call`).
    pub event_id: Option<Arc<str>>,
    /// Tool names (or `server__*` globs) a call exposed (`use_skill`), offered from the next
    /// round of the turn on.
    exposed: std::sync::Mutex<Vec<String>>,
    /// When the chat's answers are spoken (`reply_with_voice`, `/voice`).
    pub voice: crate::types::VoiceReplies,
    /// Workspace files a call made for the chat (`tts`, `image`), sent with the turn's reply.
    files: std::sync::Mutex<Vec<String>>,
    /// Paid media calls not yet counted against the budgets.
    spent: std::sync::Mutex<Vec<MediaUse>>,
    /// What the calls did that the turn acts on, not yet taken by it.
    effects: std::sync::Mutex<Vec<TurnEffect>>,
}

/// Something a call did that the turn acts on, reported by the tool itself (the turn never
/// recognises a tool by its name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnEffect {
    /// A message reached the chat (`message`): the turn has said what it had to say, so an
    /// empty final answer ends it instead of counting as a failed answer.
    MessageSent,
    /// The tools offered may have changed (`tool_search` loaded some, `use_skill` exposed
    /// some): the next request's tool list is worked out again.
    ToolsLoaded,
}

/// One paid call that is not an LLM call (speech, images): counted against the budgets at the
/// price table's entry for `model`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MediaUse {
    /// The model (`tts-1`, `gpt-image-1`, `espeak-ng`).
    pub model: String,
    /// Characters spoken.
    pub chars: u64,
    /// Seconds of audio made, when known.
    pub seconds: f64,
    /// Images made.
    pub images: u64,
}

impl TurnScope {
    /// The scope of a turn answering `event_id`.
    pub fn answering(event_id: Option<Arc<str>>) -> Arc<Self> {
        Self::answering_with(event_id, crate::types::VoiceReplies::default())
    }

    /// The scope of a turn answering `event_id` in a chat whose answers are spoken as `voice`
    /// says.
    pub fn answering_with(
        event_id: Option<Arc<str>>,
        voice: crate::types::VoiceReplies,
    ) -> Arc<Self> {
        Arc::new(Self {
            event_id,
            exposed: std::sync::Mutex::default(),
            voice,
            files: std::sync::Mutex::default(),
            spent: std::sync::Mutex::default(),
            effects: std::sync::Mutex::default(),
        })
    }

    /// Send workspace file `path` with the turn's reply.
    pub fn send_with_reply(&self, path: String) {
        let mut f = self.files.locked();
        if !f.contains(&path) {
            f.push(path);
        }
    }

    /// The files to send with the reply, taken.
    pub fn take_files(&self) -> Vec<String> {
        std::mem::take(&mut *self.files.locked())
    }

    /// Count a paid media call.
    pub fn spend(&self, used: MediaUse) {
        self.spent.locked().push(used);
    }

    /// The media calls not yet counted, taken.
    pub fn take_spent(&self) -> Vec<MediaUse> {
        std::mem::take(&mut *self.spent.locked())
    }

    /// Offer `names` for the rest of the turn.
    pub fn expose(&self, names: impl IntoIterator<Item = String>) {
        {
            let mut e = self.exposed.locked();
            for n in names {
                if !e.contains(&n) {
                    e.push(n);
                }
            }
        }
        self.report(TurnEffect::ToolsLoaded);
    }

    /// Report what a call did ([`TurnEffect`]).
    pub fn report(&self, effect: TurnEffect) {
        let mut e = self.effects.locked();
        if !e.contains(&effect) {
            e.push(effect);
        }
    }

    /// The effects reported since the last call, taken.
    pub fn take_effects(&self) -> Vec<TurnEffect> {
        std::mem::take(&mut *self.effects.locked())
    }

    /// Every name exposed so far, in the order they were.
    pub fn exposed(&self) -> Vec<String> {
        self.exposed.locked().clone()
    }
}

/// A tool the model can call.
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    /// Unique name used in function calling.
    fn name(&self) -> &str;
    /// Summary shown to the model.
    fn description(&self) -> &str;
    /// JSON Schema of the arguments.
    fn parameters(&self) -> Value;
    /// What it does to the world.
    fn effect(&self) -> Effect {
        Effect::Executes
    }
    /// The longest one call may legitimately take when the tool enforces its own deadline
    /// (e.g. `exec_shell`'s `timeout` up to 300 s plus an approval wait): the registry's
    /// per-call timeout is raised to it, so the tool's own, more precise error is seen.
    fn time_budget(&self) -> Option<std::time::Duration> {
        None
    }
    /// The credentials these arguments carry (the text of a `browser` `type` into a password
    /// field): the turn stores the call with them masked, and the registry's scrubber learns
    /// them, so no later result, error or transcript holds their bytes. Asked before the call
    /// runs.
    fn credentials_in(&self, _args: &Value, _ctx: &ToolContext) -> Vec<String> {
        Vec::new()
    }
    /// Run it.
    ///
    /// # Errors
    /// A [`ToolError`]; all but `Fatal` go back to the model.
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError>;
}

/// Parse typed arguments, mapping failures to `InvalidArgs` naming the tool.
///
/// # Errors
/// `InvalidArgs` with serde's message.
pub fn parse_args<T: serde::de::DeserializeOwned>(tool: &str, args: Value) -> Result<T, ToolError> {
    serde_json::from_value(args)
        .map_err(|e| ToolError::InvalidArgs(format!("invalid arguments for {tool}: {e}")))
}

/// The JSON Schema of an argument struct, as shown to the model. Generated once per type and
/// process (tools are asked for their schema at every LLM request).
pub fn schema_of<T: schemars::JsonSchema + 'static>() -> Value {
    static CACHE: std::sync::Mutex<Vec<(std::any::TypeId, Value)>> =
        std::sync::Mutex::new(Vec::new());
    let id = std::any::TypeId::of::<T>();
    if let Some((_, v)) = CACHE.locked().iter().find(|(t, _)| *t == id) {
        return v.clone();
    }
    let mut v = serde_json::to_value(schemars::schema_for!(T)).unwrap_or_else(|_| json!({}));
    if let Some(o) = v.as_object_mut() {
        o.remove("$schema");
        o.remove("title");
        // The argument struct's own doc ("Arguments of `x`."): the tool's description says it.
        o.remove("description");
    }
    compact_schema(&mut v);
    CACHE.locked().push((id, v.clone()));
    v
}

/// Shorten a generated schema without changing what it accepts from a model: Rust's numeric
/// `format`s go (`minimum` keeps unsigned integers non-negative), an optional field is typed
/// as its value (`["integer", "null"]` → `"integer"`; leaving it out is how a model says
/// "none", and `null` is still accepted), a zero-value `default` goes (it is what leaving the
/// field out means), a `oneOf` of constants becomes an `enum` (the
/// variants' own docs go: the field's description names them), and line breaks of doc
/// comments become spaces. Every request carries the schemas (issue 32: ~40 % smaller).
pub fn compact_schema(v: &mut Value) {
    match v {
        Value::Object(o) => {
            o.remove("format");
            // A default that is the type's zero value (`false`, `0`, `""`, `[]`, `null`) is
            // what leaving the field out means anyway.
            let zero = |d: &Value| match d {
                Value::Null => true,
                Value::Bool(b) => !b,
                Value::Number(n) => n.as_f64() == Some(0.0),
                Value::String(s) => s.is_empty(),
                Value::Array(a) => a.is_empty(),
                Value::Object(m) => m.is_empty(),
            };
            if o.get("default").is_some_and(zero) {
                o.remove("default");
            }
            if let Some(Value::Array(types)) = o.get("type") {
                let non_null: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
                if non_null.len() == 1 && types.len() == 2 {
                    o.insert("type".into(), non_null[0].clone());
                }
            }
            if let Some(Value::Array(e)) = o.get_mut("enum") {
                e.retain(|x| !x.is_null());
            }
            for key in ["anyOf", "oneOf"] {
                let Some(Value::Array(alts)) = o.get(key) else {
                    continue;
                };
                let non_null: Vec<&Value> = alts.iter().filter(|a| a["type"] != "null").collect();
                if non_null.len() == 1 && alts.len() == 2 {
                    // `Option<Struct>`: the struct's schema.
                    let one = non_null[0].clone();
                    o.remove(key);
                    if let Value::Object(inner) = one {
                        for (k, x) in inner {
                            o.entry(k).or_insert(x);
                        }
                    }
                    continue;
                }
                let consts: Option<Vec<Value>> =
                    alts.iter().map(|a| a.get("const").cloned()).collect();
                let ty = alts.first().and_then(|a| a.get("type")).cloned();
                if let (Some(consts), Some(ty)) = (consts, ty) {
                    if alts.iter().all(|a| a.get("type") == Some(&ty)) {
                        o.remove(key);
                        o.insert("type".into(), ty);
                        o.insert("enum".into(), Value::Array(consts));
                    }
                }
            }
            if let Some(Value::String(d)) = o.get_mut("description") {
                if d.contains('\n') {
                    *d = d.split_whitespace().collect::<Vec<_>>().join(" ");
                }
            }
            for (k, x) in o.iter_mut() {
                // Property names are data, not schema keywords.
                if k == "properties" {
                    if let Value::Object(props) = x {
                        props.values_mut().for_each(compact_schema);
                    }
                } else {
                    compact_schema(x);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(compact_schema),
        _ => {}
    }
}

#[cfg(test)]
mod schema_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn compact_schema_keeps_what_a_model_needs() {
        let mut v = json!({
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "format": {"type": ["integer", "null"], "format": "uint", "minimum": 0,
                           "description": "Two\nlines."},
                "all": {"type": "boolean", "default": false},
                "n": {"type": "integer", "default": 5},
                "sort": {"oneOf": [{"const": "a", "type": "string", "description": "A."},
                                   {"const": "b", "type": "string"}]},
                "m": {"type": ["string", "null"], "enum": ["GET", null]},
                "s": {"anyOf": [{"$ref": "#/$defs/S"}, {"type": "null"}]}
            },
            "required": ["format"]
        });
        compact_schema(&mut v);
        assert_eq!(
            v,
            json!({
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "format": {"type": "integer", "minimum": 0, "description": "Two lines."},
                    "all": {"type": "boolean"},
                    "n": {"type": "integer", "default": 5},
                    "sort": {"type": "string", "enum": ["a", "b"]},
                    "m": {"type": "string", "enum": ["GET"]},
                    "s": {"$ref": "#/$defs/S"}
                },
                "required": ["format"]
            })
        );
    }
}
