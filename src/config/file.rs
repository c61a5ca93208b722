//! The raw shape of the configuration file: every field optional, unknown keys refused.
//! [`super::Config::load`] turns it into the validated [`super::Config`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
    /// `openai` (any OpenAI-compatible server) or `anthropic`. Default from the name
    /// (`anthropic` for a provider named anthropic, else `openai`).
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
}

/// `channels`.
#[derive(Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChannelsFile {
    /// The local HTTP API.
    #[serde(default)]
    pub http: HttpFile,
    /// Telegram (Bot API, long polling).
    pub telegram: Option<ChatChannelFile>,
    /// Discord (gateway + REST).
    pub discord: Option<ChatChannelFile>,
    /// Slack (Socket Mode + Web API).
    pub slack: Option<ChatChannelFile>,
    /// WhatsApp (Business Cloud API: webhooks in, Graph API out).
    pub whatsapp: Option<ChatChannelFile>,
    /// Matrix (Client-Server API: `/sync` long-poll, a bot account's access token).
    pub matrix: Option<ChatChannelFile>,
    /// Signal (signal-cli's JSON-RPC daemon over HTTP).
    pub signal: Option<ChatChannelFile>,
    /// Email (IMAP IDLE in, SMTP out).
    pub email: Option<super::email::EmailFile>,
    /// Largest message accepted from any channel, in bytes of UTF-8 text (default: 32768,
    /// from 1024 to 4194304). A longer one is refused before it is stored or reaches the model,
    /// and its sender is told in the same chat (the HTTP API answers 413).
    pub max_inbound_bytes: Option<u64>,
}

/// A platform user id, written as a number or a string.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum IdFile {
    /// A numeric id (Telegram, Discord).
    Int(i64),
    /// A string id (Slack `U0123...`).
    Str(String),
}

impl std::fmt::Display for IdFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IdFile::Int(i) => write!(f, "{i}"),
            IdFile::Str(s) => f.write_str(s.trim()),
        }
    }
}

/// `channels.telegram`, `channels.discord`, `channels.slack`, and each of their
/// `accounts.NAME`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatChannelFile {
    /// Run this channel (default true when the section is present).
    pub enabled: Option<bool>,
    /// Bot token, inline (prefer `token_env` or `token_file`). Matrix: the bot account's
    /// access token, also written `access_token`.
    #[serde(alias = "access_token")]
    pub token: Option<String>,
    /// Environment variable holding the bot token (Matrix: also `access_token_env`).
    #[serde(alias = "access_token_env")]
    pub token_env: Option<String>,
    /// File holding the bot token (relative paths resolve in `$CREDENTIALS_DIRECTORY`;
    /// Matrix: also `access_token_file`).
    #[serde(alias = "access_token_file")]
    pub token_file: Option<String>,
    /// Slack only: the app-level token (`xapp-...`) for Socket Mode, inline.
    pub app_token: Option<String>,
    /// Slack only: environment variable holding the app-level token.
    pub app_token_env: Option<String>,
    /// Slack only: file holding the app-level token.
    pub app_token_file: Option<String>,
    /// Signal only: the account's phone number in international format (`+15551234567`), as
    /// registered or linked in signal-cli.
    pub number: Option<String>,
    /// Platform user ids allowed to talk to the bot (ids, not usernames). Empty: nobody
    /// (unless paired).
    pub allow_from: Option<Vec<IdFile>>,
    /// Give unknown senders a one-time code that `weft pairing approve CODE` admits
    /// (default false).
    pub pairing: Option<bool>,
    /// In group chats answer only when mentioned or replied to (`mention`, default) or to
    /// every message (`all`).
    pub group_mode: Option<String>,
    /// `chat` (default): one conversation per chat (and thread); `user`: one per sender inside
    /// each chat, so group members do not share a context.
    pub group_sessions: Option<String>,
    /// Telegram/Slack: API base URL (a local `telegram-bot-api` server, a proxy).
    pub api_url: Option<String>,
    /// Discord: base URL replacing `https://discord.com` for every REST call (a relay that
    /// speaks Discord's API, such as twilight-http-proxy; not an HTTP CONNECT proxy).
    pub api_base_url: Option<String>,
    /// Discord: gateway WebSocket URL (`wss://...`), skipping `GET /gateway/bot`.
    pub gateway_url: Option<String>,
    /// Deprecated name of `api_base_url` (it never was an HTTP proxy); still read, with a
    /// warning at load.
    pub proxy: Option<String>,
    /// Stream replies by editing a draft message (default true).
    pub stream_edits: Option<bool>,
    /// Least time between two edits of a streamed draft, in milliseconds (default 1500).
    pub edit_interval_ms: Option<u64>,
    /// Matrix only: the homeserver's base URL (`https://matrix.example.org`).
    pub homeserver: Option<String>,
    /// Matrix only: the bot's user id (`@bot:example.org`), checked against the token.
    pub user_id: Option<String>,
    /// How many chats may be sending at the same time (default 8, at least 1). Replies of one
    /// chat are always sent one after the other.
    pub max_chats_in_flight: Option<usize>,
    /// WhatsApp only: the business phone number's id (WhatsApp Manager → API Setup).
    pub phone_number_id: Option<String>,
    /// WhatsApp only: the app secret that signs webhooks, inline (prefer the env or file).
    pub app_secret: Option<String>,
    /// WhatsApp only: environment variable holding the app secret.
    pub app_secret_env: Option<String>,
    /// WhatsApp only: file holding the app secret.
    pub app_secret_file: Option<String>,
    /// WhatsApp only: the webhook verify token (any string you also give Meta), inline.
    pub verify_token: Option<String>,
    /// WhatsApp only: environment variable holding the verify token.
    pub verify_token_env: Option<String>,
    /// WhatsApp only: file holding the verify token.
    pub verify_token_file: Option<String>,
    /// WhatsApp only: Graph API version (default `v21.0`).
    pub api_version: Option<String>,
    /// WhatsApp only: an approved template sent instead of a reply outside the 24-hour
    /// customer-service window (without it such a reply fails with a clear error).
    pub template: Option<String>,
    /// WhatsApp only: the template's language code (default `en_US`).
    pub template_language: Option<String>,
    /// More bots of this platform in the same gateway, by account name (`a-z`, `0-9`, `_`,
    /// `-`; at most 32): each takes the keys of this section and its own token, and inherits
    /// every other key it does not set from this section. Account NAME is the channel
    /// `<platform>.NAME`; this section, when it has a token, is the account `default` (channel
    /// `<platform>`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub accounts: BTreeMap<String, ChatChannelFile>,
}

/// `channels.http`.
#[derive(Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpFile {
    /// Serve the HTTP API (default true).
    pub enabled: Option<bool>,
    /// Address to bind (default `127.0.0.1:18790`). Non-loopback needs a token.
    pub bind: Option<String>,
    /// Bearer token, inline.
    pub token: Option<String>,
    /// Environment variable holding the bearer token.
    pub token_env: Option<String>,
    /// File holding the bearer token.
    pub token_file: Option<String>,
    /// How long `POST /v1/chat` waits for the reply, in seconds (default 300).
    pub reply_timeout_secs: Option<u64>,
    /// Let local programs use the chat routes (`/v1/chat`, `/v1/chat/stream`) without a
    /// bearer token (default false). Loopback binds only; the admin routes always need one.
    pub allow_loopback_without_token: Option<bool>,
    /// Host names (as browsers send them in `Host`, without the port) the control UI answers
    /// for besides `localhost`, `127.0.0.1`, `[::1]` and the bind address: the name a reverse
    /// proxy serves it under (default none; any other name gets 421).
    pub ui_hosts: Option<Vec<String>>,
    /// Also serve the API over TLS on this address (e.g. `0.0.0.0:18443`), with `tls_cert`
    /// and `tls_key` (default: no TLS listener). A non-loopback address needs a token.
    pub tls_bind: Option<String>,
    /// PEM file of the TLS listener's certificate (then its chain), relative to the
    /// configuration file's directory.
    pub tls_cert: Option<String>,
    /// PEM file of that certificate's private key.
    pub tls_key: Option<String>,
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
