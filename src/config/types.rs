//! The resolved sections of the configuration (agents, providers, the HTTP API, the store,
//! sessions, tools): plain data with no behaviour beyond lookups. [`super::loaded::Config`]
//! aggregates them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::types::Secret;

/// Default bind address of the local HTTP API.
pub const DEFAULT_HTTP_BIND: &str = "127.0.0.1:18790";
/// Ollama's default OpenAI-compatible endpoint, used when nothing else is configured.
pub const LOCAL_DEFAULT_BASE_URL: &str = "http://127.0.0.1:11434/v1";
/// Default `agents.defaults.max_tool_iterations` (seed 000).
pub const DEFAULT_MAX_TOOL_ITERATIONS: u32 = 20;
/// Default `agents.defaults.loop_repeat_limit`: the same call this many times in a row gets a
/// notice; twice as many ends the turn.
pub const DEFAULT_LOOP_REPEAT_LIMIT: u32 = 3;
/// Default `agents.defaults.max_tool_calls_per_turn`.
pub const DEFAULT_MAX_TOOL_CALLS_PER_TURN: u32 = 100;

/// Which wire protocol a provider speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    /// OpenAI-compatible chat completions.
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
    /// Ollama's native chat API (`/api/chat`): the window is chosen per request (`num_ctx`).
    Ollama,
}

/// Default `providers.*.num_ctx_max` of an Ollama provider: the most context asked of it,
/// whatever the agent's window (Ollama's memory for the window grows with it).
pub const DEFAULT_OLLAMA_NUM_CTX_MAX: u64 = 16_384;
/// Default `providers.*.keep_alive` of an Ollama provider.
pub const DEFAULT_OLLAMA_KEEP_ALIVE: &str = "30m";
/// Ollama's native API when nothing is configured.
pub const OLLAMA_DEFAULT_BASE_URL: &str = "http://127.0.0.1:11434";

/// Where the provider list came from: decides the hint given when it fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProviderSource {
    /// `providers.*` in the config file.
    Configured,
    /// API keys found in the environment (names listed).
    Environment(Vec<String>),
    /// Nothing configured: the local Ollama default.
    LocalDefault,
}

impl std::fmt::Display for ProviderSource {
    /// For people: `config file`, `environment (OPENAI_API_KEY)`, `local default (Ollama)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProviderSource::Configured => f.write_str("config file (providers.*)"),
            ProviderSource::Environment(names) => {
                write!(f, "environment ({})", names.join(", "))
            }
            ProviderSource::LocalDefault => f.write_str("local default (Ollama)"),
        }
    }
}

/// One resolved LLM provider.
#[derive(Clone, Debug, PartialEq)]
pub struct ProviderConfig {
    /// Name (`openai`, `anthropic`, …).
    pub name: String,
    /// Wire protocol.
    pub kind: ProviderKind,
    /// Base URL.
    pub base_url: String,
    /// API key, if any.
    pub api_key: Option<Secret>,
    /// Model to request.
    pub model: String,
    /// Request timeout.
    pub timeout: Duration,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// Retries before falling over to the next provider.
    pub max_retries: u32,
    /// Ollama: the most context tokens asked for (`num_ctx_max`).
    pub num_ctx_max: u64,
    /// Ollama: how long the model stays loaded after a request (`keep_alive`).
    pub keep_alive: String,
    /// `tool_call_format`: how tool calls are read (`None`: `auto` for a server on this
    /// machine or the local network, else `native`).
    pub tool_call_format: Option<crate::llm::text_calls::ToolCallFormat>,
}

/// Agent behaviour.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentConfig {
    /// Root of the file tools.
    pub workspace: PathBuf,
    /// Tool-call rounds per message (>= 1).
    pub max_tool_iterations: u32,
    /// System prompt override.
    pub system_prompt: Option<String>,
    /// Max generated tokens.
    pub max_tokens: Option<u32>,
    /// Temperature.
    pub temperature: Option<f32>,
    /// Stream deltas from the provider when the channel can show them.
    pub stream: bool,
    /// Per-call tool timeout.
    pub tool_timeout: Duration,
    /// The prompt window: context size and compaction.
    pub window: WindowSettings,
    /// The same tool call (or two alternating) this many times in a row gets a notice in its
    /// result; twice as many ends the turn (>= 2).
    pub loop_repeat_limit: u32,
    /// Tool calls one turn may make; the turn ends at the limit (>= 1).
    pub max_tool_calls_per_turn: u32,
    /// Models `/model NAME` may switch a chat to (`models`; the agent's own model first).
    pub models: Vec<String>,
    /// This agent's subagent limits when it sets its own (`subagents`); `None`: the
    /// gateway's (`tools.subagents`).
    pub subagents: Option<super::subagents::SubagentSettings>,
    /// `vision`: whether images from chats are shown to the model.
    pub vision: Vision,
    /// Whether the agent's own model takes images (the model table), for `vision = "auto"`.
    pub model_sees_images: bool,
    /// `reply_with_voice`: when answers are spoken (a chat's `/voice` overrides it).
    pub reply_with_voice: crate::types::VoiceReplies,
    /// `timezone`: the zone the times of messages are shown in.
    pub timezone: TimeZone,
    /// `nodes`: the nodes the `nodes` tool may reach (`None`: every approved node).
    pub nodes: Option<Vec<String>>,
}

/// A named time zone (`agents.*.timezone`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimeZone {
    /// Its IANA name (`Europe/Paris`, `UTC`).
    pub name: String,
    /// Its offsets.
    pub zone: std::sync::Arc<crate::types::tz::Zone>,
}

impl Default for TimeZone {
    fn default() -> Self {
        Self {
            name: "UTC".into(),
            zone: std::sync::Arc::new(crate::types::tz::Zone::utc()),
        }
    }
}

/// `text` without the stamp [`TimeZone::stamp`] and a space put before a user message, if it
/// starts with one.
pub fn unstamped(text: &str) -> &str {
    let shape = b"[WWW 0000-00-00 00:00 +00:00] ";
    let b = text.as_bytes();
    let fits = b.len() >= shape.len()
        && shape.iter().zip(b).all(|(s, c)| match s {
            b'W' => c.is_ascii_alphabetic(),
            b'0' => c.is_ascii_digit(),
            b'+' => *c == b'+' || *c == b'-',
            other => other == c,
        });
    if fits {
        &text[shape.len()..]
    } else {
        text
    }
}

impl TimeZone {
    /// `[Fri 2026-11-27 18:03 +01:00]`: the instant `at_ms` (milliseconds since the epoch) in
    /// this zone, as the model is shown it before a message.
    pub fn stamp(&self, at_ms: u64) -> String {
        let t = i64::try_from(at_ms / 1000).unwrap_or(i64::MAX);
        let off = self.zone.offset_at(t);
        let local = chrono::DateTime::from_timestamp(t.saturating_add(i64::from(off)), 0)
            .unwrap_or_default()
            .naive_utc();
        let sign = if off < 0 { '-' } else { '+' };
        let a = off.unsigned_abs();
        format!(
            "[{} {sign}{:02}:{:02}]",
            local.format("%a %Y-%m-%d %H:%M"),
            a / 3600,
            a % 3600 / 60
        )
    }
}

/// `agents.*.vision`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Vision {
    /// When the model is known to take images.
    #[default]
    Auto,
    /// Always (the operator knows the model can).
    On,
    /// Never: the model is only told where the image is.
    Off,
}

impl AgentConfig {
    /// Whether images are shown to the model this turn, which may ask `model` (a `/model`
    /// choice) instead of the agent's own.
    pub fn shows_images(&self, model: Option<&str>) -> bool {
        match self.vision {
            Vision::On => true,
            Vision::Off => false,
            Vision::Auto => {
                model.map_or(self.model_sees_images, crate::llm::models::supports_vision)
            }
        }
    }
}

/// Default `agents.defaults.compaction.threshold`.
pub const DEFAULT_COMPACTION_THRESHOLD: f64 = 0.75;

/// Default `agents.defaults.prompt_budget_tokens`: about 24k tokens of prompt a request
/// (docs/architecture.md, "Prompt budget": enough for instructions, tools, a summary and
/// dozens of recent messages; a tenth of a cent a turn on gpt-4o-mini).
pub const DEFAULT_PROMPT_BUDGET: u64 = 24_000;

/// The prompt window of the agent's model (docs/architecture.md, "Prompt window and
/// compaction").
#[derive(Clone, Debug, PartialEq)]
pub struct WindowSettings {
    /// The model's context window in tokens.
    pub context_window: u64,
    /// Most estimated tokens a request's prompt carries before older turns are summarised
    /// (`prompt_budget_tokens`, capped at `context_window`).
    pub prompt_budget: u64,
    /// `prompt_budget_tokens` as set (`None`: the default), to say when it was capped.
    pub prompt_budget_set: Option<u64>,
    /// Compact when the prompt would pass this fraction of the window.
    pub threshold: f64,
    /// The model writing summaries (`None`: the agent's model).
    pub summary_model: Option<String>,
}

impl WindowSettings {
    /// When `prompt_budget_tokens` is set above the model's window: what to tell the operator
    /// (at start and in `weft doctor`).
    pub fn budget_capped(&self) -> Option<String> {
        self.prompt_budget_set
            .filter(|&b| b > self.context_window)
            .map(|b| {
                format!(
                    "prompt_budget_tokens is {b} but the model's context window is {} tokens: the budget is capped at the window",
                    self.context_window
                )
            })
    }
}

impl Default for WindowSettings {
    fn default() -> Self {
        Self {
            context_window: crate::llm::models::DEFAULT_CONTEXT_WINDOW,
            prompt_budget: DEFAULT_PROMPT_BUDGET.min(crate::llm::models::DEFAULT_CONTEXT_WINDOW),
            prompt_budget_set: None,
            threshold: DEFAULT_COMPACTION_THRESHOLD,
            summary_model: None,
        }
    }
}

/// The local HTTP API channel.
#[derive(Clone, Debug, PartialEq)]
pub struct HttpChannelConfig {
    /// Serve it.
    pub enabled: bool,
    /// Bind address.
    pub bind: SocketAddr,
    /// Bearer token.
    pub token: Option<Secret>,
    /// How long a request waits for its reply.
    pub reply_timeout: Duration,
    /// Chat routes without a token on a loopback bind (an explicit opt-in).
    pub allow_loopback_without_token: bool,
    /// Host names the control UI answers for besides loopback and the bind address.
    pub ui_hosts: Vec<String>,
    /// The TLS listener: its address, certificate and key files (`tls_bind`, `tls_cert`,
    /// `tls_key`).
    pub tls: Option<(SocketAddr, PathBuf, PathBuf)>,
}

/// The store.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreConfig {
    /// Directory of the sled database.
    pub path: PathBuf,
    /// Page cache bound in bytes.
    pub cache_bytes: u64,
    /// `store.on_corruption`.
    pub on_corruption: crate::store::OnCorruption,
}

/// Session limits.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionLimits {
    /// Idle time after which a session leaves memory.
    pub idle: Duration,
    /// Most queued messages per session.
    pub max_queue: usize,
    /// Grace period for running turns at shutdown.
    pub shutdown_grace: Duration,
    /// Most sessions in memory before idle ones are evicted early.
    pub max_in_memory: usize,
}

/// Validated `tools.*` settings.
#[derive(Clone, Debug)]
pub struct ToolsConfig {
    /// The policy engine's layers, resolved for the primary provider.
    pub policy: crate::tools::policy::ToolPolicy,
    /// Per-session rate limit (`None`: off).
    pub rate_limit: Option<crate::tools::ratelimit::RateLimit>,
    /// `tools.message.allow`.
    pub message_allow: Vec<String>,
    /// `tools.exec`.
    pub exec: crate::tools::exec::ExecSettings,
    /// The environment commands' environments are filtered from.
    pub exec_env: Vec<(String, String)>,
    /// `$CREDENTIALS_DIRECTORY` (systemd `LoadCredential=`), kept from commands.
    pub credentials_dir: Option<PathBuf>,
    /// Where the commands' private temp dir is made (`$TMPDIR` or `/tmp`).
    pub tmp_base: PathBuf,
    /// `tools.files`.
    pub files: crate::tools::fs::FileToolsSettings,
    /// Read by `memory_read` when the workspace has no `memory/MEMORY.md` (seed 000:
    /// `~/.nanobot/workspace/memory/MEMORY.md`).
    pub memory_fallback: Option<PathBuf>,
    /// `tools.mcp_servers` that have a command or a url.
    pub mcp_servers: Vec<crate::mcp::config::McpServerSettings>,
    /// `tools.mcp_connect_wait_secs`: how long a turn waits for servers still on their first
    /// connection attempt.
    pub mcp_connect_wait: std::time::Duration,
    /// `tools.web_fetch`.
    pub web_fetch: crate::tools::web::WebFetchSettings,
    /// `tools.browser`.
    pub browser: crate::browser::BrowserSettings,
    /// `tools.web_search`.
    pub web_search: crate::tools::web::WebSearchSettings,
    /// `tools.subagents`.
    pub subagents: super::subagents::SubagentSettings,
    /// `tools.custom`: the checked custom tools.
    pub custom: Vec<crate::tools::exec::custom::CustomToolSettings>,
    /// `tools.sessions`: the session tools' visibility.
    pub sessions: crate::tools::sessions::SessionsSettings,
}

#[cfg(test)]
mod stamp_tests {
    use super::*;

    #[test]
    fn a_stamp_is_recognised_and_removed_and_nothing_else_is() {
        let tz = TimeZone::default();
        // 2026-11-27 18:03:00 UTC
        let stamped = format!("{} remind me", tz.stamp(1_795_802_580_000));
        assert_eq!(stamped, "[Fri 2026-11-27 18:03 +00:00] remind me");
        assert_eq!(unstamped(&stamped), "remind me");
        for plain in ["remind me", "[note] remind me", "[Fri 2026-11-27] x", ""] {
            assert_eq!(unstamped(plain), plain);
        }
    }
}
