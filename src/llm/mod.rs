//! ⑤ LLM providers behind one [`ChatModel`] trait: OpenAI-compatible chat completions
//! (streaming and not), Anthropic Messages, and a retrying/failover wrapper.
//!
//! Providers translate between the provider-neutral [`Message`] transcript and the wire format.
//! They hold no conversation state and never touch the store.

pub mod anthropic;
pub mod error;
pub mod health;
pub(crate) mod http;
pub mod models;
pub mod ollama;
pub mod openai;
pub mod retry;
pub mod text_calls;
pub mod tokens;

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

pub use error::LlmError;

/// Who said a message in a transcript.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The system prompt.
    System,
    /// The human (or a channel on their behalf).
    User,
    /// The model.
    Assistant,
    /// A tool result, linked to an assistant tool call by `tool_call_id`.
    Tool,
}

/// One tool call requested by the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Provider-assigned id (`call_…`, `toolu_…`); tool results refer to it.
    pub id: String,
    /// Tool name as the model wrote it.
    pub name: String,
    /// Raw JSON argument text as the model wrote it (may be malformed: the loop reports that).
    pub arguments: String,
}

/// One message of a transcript, provider-neutral.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who said it.
    pub role: Role,
    /// Text content (may be empty for an assistant message that only calls tools).
    #[serde(default)]
    pub content: String,
    /// Tool calls of an assistant message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For `Role::Tool`: the id of the call this answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// For `Role::Tool`: the tool's name (Anthropic and some OpenAI-compatible servers want it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// For `Role::User`: images that came with the message (files in the workspace). Sent to
    /// the model as image parts only once their bytes are loaded ([`ImagePart::data`]), which
    /// the turn does for the message it answers when the model can see.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImagePart>,
    /// For `Role::User`: when the message was sent (milliseconds since the epoch). The turn
    /// shows it to the model before the text, in the agent's time zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
    /// For `Role::User`: who wrote it, for the operator's view of the transcript (the control
    /// UI). Never sent to the model. Absent in messages stored before it existed and in the
    /// gateway's own (scheduled runs, announcements).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Author>,
}

/// The writer of a user message, as the operator sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Author {
    /// `channel:sender` (`telegram:111`): what access and usage know the user by.
    pub id: String,
    /// The display name the platform gave with the message, if any. Decoration only: nothing
    /// is decided on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// An image attached to a user message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ImagePart {
    /// Its path in the agent's workspace (`inbox/2026-11-24/…jpg`).
    pub path: String,
    /// Its media type, sniffed from the bytes (`image/jpeg`, `image/png`, `image/gif`,
    /// `image/webp`).
    pub mime: String,
    /// The bytes, base64, for this request only: never stored.
    #[serde(skip)]
    pub data: Option<std::sync::Arc<str>>,
}

impl ImagePart {
    /// `data:<mime>;base64,<data>` when loaded.
    pub fn data_url(&self) -> Option<String> {
        self.data
            .as_ref()
            .map(|d| format!("data:{};base64,{d}", self.mime))
    }
}

impl Message {
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::text(Role::System, content)
    }
    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::text(Role::User, content)
    }
    /// A user message sent at `at_ms` (milliseconds since the epoch).
    pub fn user_at(content: impl Into<String>, at_ms: u64) -> Self {
        Self {
            at_ms: Some(at_ms),
            ..Self::text(Role::User, content)
        }
    }
    /// An assistant text message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::text(Role::Assistant, content)
    }
    fn text(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            images: Vec::new(),
            at_ms: None,
            from: None,
        }
    }
    /// A tool result answering `call_id`.
    pub fn tool_result(
        call_id: impl Into<String>,
        name: impl Into<String>,
        content: impl Into<String>,
    ) -> Self {
        Self {
            role: Role::Tool,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: Some(call_id.into()),
            name: Some(name.into()),
            images: Vec::new(),
            at_ms: None,
            from: None,
        }
    }
}

/// A tool as shown to the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Tool name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of its arguments.
    pub parameters: serde_json::Value,
}

/// One completion request.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    /// Model name; empty means the provider's configured default.
    pub model: String,
    /// The transcript, system prompt first.
    pub messages: Vec<Message>,
    /// Tools the model may call, sorted by name. Shared: a turn builds the list once and every
    /// LLM call of the turn reuses it without copying the schemas.
    pub tools: std::sync::Arc<[ToolSpec]>,
    /// Upper bound on generated tokens, if set.
    pub max_tokens: Option<u32>,
    /// Sampling temperature, if set.
    pub temperature: Option<f32>,
}

/// Token accounting of one response (or the sum of several).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens, cached ones included.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Of `input_tokens`, how many the provider served from its prompt cache.
    #[serde(default)]
    pub cached_tokens: u64,
    /// Whether any part was estimated ([`tokens::estimate`]) because the provider reported none.
    #[serde(default)]
    pub estimated: bool,
}

impl Usage {
    /// Add `o` to `self`.
    pub fn add(&mut self, o: &Usage) {
        self.input_tokens += o.input_tokens;
        self.output_tokens += o.output_tokens;
        self.cached_tokens += o.cached_tokens;
        self.estimated |= o.estimated;
    }

    /// Whether nothing was reported.
    pub fn is_empty(&self) -> bool {
        self.input_tokens == 0 && self.output_tokens == 0
    }
}

/// The model's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatResponse {
    /// Text content (may be empty when the model only calls tools).
    pub content: String,
    /// Tool calls, in the order the model gave them.
    pub tool_calls: Vec<ToolCall>,
    /// Why generation stopped, as the provider said it (`stop`, `tool_calls`, `end_turn`…).
    pub finish_reason: Option<String>,
    /// Token usage, when reported.
    pub usage: Usage,
    /// The model that answered (each provider fills in the model it asked for), for pricing
    /// and `weft usage --by model`. Empty from fakes that do not say.
    pub model: String,
}

impl ChatResponse {
    /// Tool calls the model wrote as text (a local model whose template or server did not
    /// make them `tool_calls`), read by `format` when the request offered tools and the
    /// answer has no native calls. Ids are `text_call_<n>`; a call whose JSON was repaired is
    /// marked so the turn tells the model.
    pub(crate) fn with_text_calls(
        mut self,
        req: &ChatRequest,
        format: text_calls::ToolCallFormat,
        next_id: &std::sync::atomic::AtomicU64,
    ) -> Self {
        if format == text_calls::ToolCallFormat::Native
            || req.tools.is_empty()
            || !self.tool_calls.is_empty()
        {
            return self;
        }
        let Some((calls, said)) = text_calls::read(&self.content, format) else {
            return self;
        };
        self.tool_calls = calls
            .into_iter()
            .map(|c| ToolCall {
                id: format!(
                    "text_call_{}",
                    next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                ),
                name: c.name,
                arguments: c.arguments,
            })
            .collect();
        self.content = said;
        self.finish_reason = Some("tool_calls".into());
        self
    }

    /// This response named after the model asked for: the request's, else the provider's
    /// configured default.
    pub(crate) fn answered_by(mut self, requested: &str, configured: &str) -> Self {
        self.model = if requested.is_empty() {
            configured
        } else {
            requested
        }
        .to_string();
        self
    }
}

/// A streamed fragment, sent while a streaming completion runs.
#[derive(Clone, Debug, PartialEq)]
pub enum StreamEvent {
    /// Text produced so far was extended by this fragment.
    TextDelta(String),
}

/// A chat completion provider.
#[async_trait]
pub trait ChatModel: Send + Sync + 'static {
    /// Provider name for logs and status (`openai`, `anthropic`, `openrouter`…).
    fn name(&self) -> &str;

    /// Run one completion. When `stream` is given, text deltas are sent to it as they arrive
    /// (providers that cannot stream simply send nothing); the full response is still returned.
    ///
    /// # Errors
    /// A classified [`LlmError`]: callers branch on `is_retryable()`, never on the text.
    async fn complete(
        &self,
        req: &ChatRequest,
        stream: Option<&mpsc::Sender<StreamEvent>>,
    ) -> Result<ChatResponse, LlmError>;

    /// The health this model keeps of the providers it calls (a chain of providers keeps it;
    /// a single client does not).
    fn health(&self) -> Option<health::ProviderHealth> {
        None
    }
}

/// Shared handle to a model.
pub type DynModel = Arc<dyn ChatModel>;
