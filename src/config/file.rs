//! The raw shape of the configuration file: every field optional, unknown keys refused.
//! [`super::Config::load`] turns it into the validated [`super::Config`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use super::channels::{ChannelsFile, HttpFile, IdFile};

/// The whole file (`~/.clawft/config.json` or `.toml`).
#[derive(Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Agents: `agents.defaults` (the default agent, `main`, and what every other agent
    /// inherits) and `agents.NAME` for more agents (any `agents.defaults` key, over the
    /// defaults). A map rather than a struct with a flattened rest: one code path less.
    #[serde(default)]
    pub agents: BTreeMap<String, AgentDefaultsFile>,
    /// LLM providers by name (`openai`, `anthropic`, `openrouter`, `ollama`, or any name with
    /// `kind` set).
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderFile>,
    /// Chat channels.
    #[serde(default)]
    pub channels: ChannelsFile,
    /// The session store.
    #[serde(default)]
    pub store: StoreFile,
    /// Sessions in memory and their queues.
    #[serde(default)]
    pub sessions: SessionsFile,
    /// Tools.
    #[serde(default)]
    pub tools: ToolsFile,
    /// Prices of models, USD per million tokens, by model name or prefix (over built-in
    /// defaults for well-known models).
    #[serde(default)]
    pub prices: BTreeMap<String, super::usage::PriceFile>,
    /// Spending limits: a turn is refused once one is reached.
    #[serde(default)]
    pub budgets: super::usage::BudgetsFile,
    /// Memory: per-user or shared, and what `memory_search` covers.
    #[serde(default)]
    pub memory: crate::memory::settings::MemoryFile,
    /// Scheduled jobs (the `cron` tool, `weft cron`): limits.
    #[serde(default)]
    pub scheduler: crate::scheduler::SchedulerFile,
    /// The periodic heartbeat turn driven by `HEARTBEAT.md` (off by default).
    #[serde(default)]
    pub heartbeat: crate::scheduler::HeartbeatFile,
    /// Which agent serves a message: `[[bindings]]` with `agent` and any of `channel`,
    /// `account`, `chat`, `user`, `thread`; the most specific match wins, the default agent
    /// (`main`) when none matches.
    #[serde(default)]
    pub bindings: Vec<BindingFile>,
    /// Signed inbound webhooks: `hooks.NAME` serves `POST /v1/hooks/NAME` (docs/webhooks.md).
    #[serde(default)]
    pub hooks: BTreeMap<String, super::hooks::HookFile>,
    /// Files that arrive with chat messages: size caps and voice transcription
    /// (docs/media.md).
    #[serde(default)]
    pub media: super::media::MediaFile,
    /// This machine as a node host of a gateway elsewhere (`weft node`; docs/nodes.md): the
    /// command-line options win over these.
    #[serde(default)]
    pub node: NodeFile,
    /// Cluster mode on NATS JetStream (docs/cluster.md); single-node when absent.
    pub cluster: Option<crate::cluster::settings::ClusterFile>,
}

/// `[node]`: the settings of `weft node`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeFile {
    /// The gateway: `wss://HOST[:PORT]` (`ws://` only on loopback).
    pub gateway: Option<String>,
    /// This node's name (default: the host name).
    pub name: Option<String>,
    /// The workspace the gateway's agent works in (default: `agent.workspace`); `~/` expands.
    pub workspace: Option<String>,
    /// What the node offers: `info`, `read`, `write`, `list`, `run`, `notify` (default: all
    /// but `notify`, which is offered when `notify-send` is installed).
    pub offer: Option<Vec<String>>,
    /// The gateway's key fingerprint (`SHA256:...`, as `weft nodes list` prints it there),
    /// pinned before the first connection (default: the key of the gateway that approves
    /// this node, pinned then).
    pub gateway_key: Option<String>,
    /// A PEM file of the authority (or the self-signed certificate) that signed a `wss://`
    /// gateway's certificate, trusted instead of the public web roots.
    pub gateway_ca: Option<String>,
}

/// One `[[bindings]]` entry.
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BindingFile {
    /// The agent serving the messages it matches (`main` or a name of `agents.NAME`).
    pub agent: String,
    /// Channel: `telegram`, `discord`, `slack`, `http`, `cli`.
    pub channel: Option<String>,
    /// Bot account of the channel (`default` for the channel's own token, or a name of
    /// `channels.<platform>.accounts`).
    pub account: Option<String>,
    /// Chat, guild channel or Slack channel id.
    pub chat: Option<IdFile>,
    /// Sender's platform user id.
    pub user: Option<IdFile>,
    /// Thread or topic id.
    pub thread: Option<IdFile>,
}

/// `agents.defaults` and `agents.NAME`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentDefaultsFile {
    /// Model name sent to the provider (overrides each provider's default model).
    pub model: Option<String>,
    /// Maximum rounds of tool calls per message (default 20, clamped to >= 1).
    pub max_tool_iterations: Option<i64>,
    /// The same tool call with the same arguments this many times in a row (or two calls
    /// alternating) gets a notice that the result will not change; twice as many ends the turn
    /// (default 3, 2-100).
    pub loop_repeat_limit: Option<i64>,
    /// Most tool calls in one turn, every round counted; the turn ends at the limit (default
    /// 100, 1-10000).
    pub max_tool_calls_per_turn: Option<i64>,
    /// Root directory of the file tools (default `~/.clawft/workspace`).
    pub workspace: Option<String>,
    /// Name of the provider to use first (default: the first configured, alphabetically).
    pub provider: Option<String>,
    /// Providers to fall back to, in order, when the first one fails.
    pub fallback: Option<Vec<String>>,
    /// Replaces the built-in system prompt.
    pub system_prompt: Option<String>,
    /// Upper bound on generated tokens per LLM call.
    pub max_tokens: Option<u32>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Stream text deltas from the provider (default true).
    pub stream: Option<bool>,
    /// This agent's tool policy layer (`profile`, `allow`, `deny`, `also_allow`); the most
    /// specific layer of the policy engine.
    pub tools: Option<crate::tools::policy::PolicyLayerFile>,
    /// The model's context window in tokens (default: from the built-in table of model
    /// families, 32768 for a model it does not know).
    pub context_window: Option<u64>,
    /// When and how the prompt window is compacted.
    pub compaction: Option<CompactionFile>,
    /// Most tokens a request's prompt may carry before older turns are summarised (default
    /// 24000, at least 1024; capped at the model's context window). Keeps the cost of a turn
    /// flat however long the chat grows.
    pub prompt_budget_tokens: Option<u64>,
    /// Models a chat may switch to with `/model NAME` (the agent's own model always can).
    pub models: Option<Vec<String>>,
    /// MCP servers (names of `tools.mcp_servers`) whose tools this agent gets (default: all).
    pub mcp_servers: Option<Vec<String>>,
    /// This agent's own spending limits (its conversations and subagents together).
    pub budgets: Option<super::usage::AgentBudgetsFile>,
    /// This agent's subagent limits, over `tools.subagents` (`max_concurrent` stays the
    /// gateway's).
    pub subagents: Option<super::subagents::SubagentsFile>,
    /// Whether images that arrive in chats are shown to the model: `auto` (default: when the
    /// model is known to take images), `on`, `off`.
    pub vision: Option<String>,
    /// The users' time zone (an IANA name, `Europe/Paris`): each message is shown to the model
    /// with the time it was sent in this zone (default: the system's zone, else UTC).
    pub timezone: Option<String>,
    /// When answers are spoken: `never`, `when_asked` (default: the model calls `tts` when
    /// the user asks), `to_voice` (a voice note is answered with a voice note, the text kept
    /// alongside). A chat's `/voice` overrides it.
    pub reply_with_voice: Option<String>,
    /// The nodes (names or ids) the `nodes` tool may reach for this agent (default: every
    /// approved node, once the tool is allowed).
    pub nodes: Option<Vec<String>>,
}

/// `agents.defaults.compaction`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompactionFile {
    /// Fraction of the context window at which older turns are summarised (default 0.75,
    /// between 0.2 and 0.95).
    pub threshold: Option<f64>,
    /// Model that writes the summary (default: the agent's model), e.g. a cheaper one of the
    /// same provider.
    pub model: Option<String>,
}

/// `providers.NAME`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderFile {
    /// `openai` (any OpenAI-compatible server), `anthropic`, or `ollama` (Ollama's native
    /// API, which sizes the model's window per request). Default from the name (`anthropic`
    /// and `ollama` for providers so named, else `openai`).
    pub kind: Option<String>,
    /// Base URL, e.g. `https://api.openai.com/v1` or `http://127.0.0.1:11434/v1`.
    pub base_url: Option<String>,
    /// The API key, inline (prefer `api_key_env` or `api_key_file`).
    pub api_key: Option<String>,
    /// Name of an environment variable holding the API key.
    pub api_key_env: Option<String>,
    /// File holding the API key (relative paths resolve in `$CREDENTIALS_DIRECTORY`).
    pub api_key_file: Option<String>,
    /// Default model of this provider.
    pub model: Option<String>,
    /// Request timeout in seconds (default 120).
    pub timeout_secs: Option<u64>,
    /// Extra HTTP headers.
    pub headers: Option<BTreeMap<String, String>>,
    /// Retries on 429/5xx/connection errors before falling over (default 3).
    pub max_retries: Option<u32>,
    /// `kind = "ollama"`: the most context tokens asked of the server (`num_ctx`), whatever
    /// the agent's window (default 16384). Ollama's memory for the window grows with it: lower
    /// it on a small machine, raise it on a large one.
    pub num_ctx_max: Option<u64>,
    /// `kind = "ollama"`: how long the model stays loaded after a request (default `30m`;
    /// `-1` keeps it loaded).
    pub keep_alive: Option<String>,
    /// How tool calls are read: `native` (only the server's `tool_calls`), `auto` (those, else
    /// calls the model wrote as text in any format below), or one format: `hermes` (Qwen's
    /// `<tool_call>`), `llama` (`<|python_tag|>`, bare `{"name", "parameters"}`), `mistral`
    /// (`[TOOL_CALLS]`), `json` (a fenced JSON block). Default: `auto` for servers on this
    /// machine or the local network, `native` for the others.
    pub tool_call_format: Option<String>,
}

/// `store`.
#[derive(Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StoreFile {
    /// Directory of the sled store (default `~/.clawft/store`).
    pub path: Option<String>,
    /// sled page cache bound in MiB (default 8).
    pub cache_mb: Option<u64>,
    /// What the gateway does when it finds the store damaged at start: "quarantine" (default:
    /// move the damaged files to `<path>.corrupt-<timestamp>`, alert, start fresh) or "fail"
    /// (refuse to start with one error, exit code 78).
    pub on_corruption: Option<String>,
}

/// `sessions`.
#[derive(Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionsFile {
    /// Drop an idle session from memory after this many seconds (default 600); it is
    /// reloaded from the store on its next message.
    pub idle_secs: Option<u64>,
    /// Most messages queued behind a running turn per session (default 100). Over it, the
    /// message is refused with a clear reply rather than dropped silently.
    pub max_queue: Option<usize>,
    /// Seconds running turns get to finish at shutdown before they are cancelled (default 10).
    pub shutdown_grace_secs: Option<u64>,
    /// Most sessions kept in memory (default 256, at least 1). Over it, the least recently
    /// used idle sessions leave memory at once (they reload from the store on their next
    /// message); sessions with a running turn or queued messages are never evicted.
    pub max_in_memory: Option<usize>,
}

/// `tools`.
#[derive(Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolsFile {
    /// Per-call timeout of a tool in seconds (default 120).
    pub timeout_secs: Option<u64>,
    /// Which tools the model is shown and may call (profiles, groups, allow/deny).
    #[serde(default)]
    pub policy: crate::tools::policy::PolicyFile,
    /// Per-session rate limit of tool calls.
    #[serde(default)]
    pub rate_limit: RateLimitFile,
    /// The `message` tool.
    #[serde(default)]
    pub message: MessageFile,
    /// `exec_shell` and `spawn`: shell policy, sandbox, timeouts, environment.
    #[serde(default)]
    pub exec: crate::tools::exec::ExecFile,
    /// File, search and memory tools: size and work bounds.
    #[serde(default)]
    pub files: crate::tools::fs::FileToolsFile,
    /// How long a turn waits for MCP servers still making their first connection attempt, in
    /// seconds (default 10; 0: never wait). Failed or reconnecting servers are never waited for.
    pub mcp_connect_wait_secs: Option<u64>,
    /// MCP servers by name: their tools are registered as `NAME__tool`.
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, crate::mcp::config::McpServerFile>,
    /// `web_fetch`: SSRF guard exemptions, body cap, timeouts.
    #[serde(default)]
    pub web_fetch: crate::tools::web::WebFetchFile,
    /// `browser`: the headless Chromium of the `browser` tool: what it may reach, its bounds.
    #[serde(default)]
    pub browser: crate::browser::BrowserFile,
    /// `web_search`: the search backend (SearXNG or Brave).
    #[serde(default)]
    pub web_search: crate::tools::web::WebSearchFile,
    /// `subagents`: limits of the subagent supervisor.
    #[serde(default)]
    pub subagents: crate::config::subagents::SubagentsFile,
    /// Custom tools: `tools.custom.NAME = { description, parameters, command, timeout_secs }`,
    /// shell templates run in the exec sandbox (docs/tools.md#custom-tools).
    #[serde(default)]
    pub custom: BTreeMap<String, crate::tools::exec::custom::CustomToolFile>,
    /// The session tools: which sessions they see (`visibility`) and agent-to-agent access.
    #[serde(default)]
    pub sessions: crate::tools::sessions::SessionsFile,
}

/// `tools.rate_limit`.
#[derive(Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimitFile {
    /// Tool calls a session may make per minute, on average (default 120; 0 disables the
    /// limit).
    pub per_minute: Option<u32>,
    /// Calls allowed in a burst (default 60).
    pub burst: Option<u32>,
}

/// `tools.message`.
#[derive(Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageFile {
    /// Chats the `message` tool may reach besides the session's own, as `channel:chat_id`
    /// patterns with `*` wildcards (default: none).
    pub allow: Option<Vec<String>>,
}
