//! ⓪ Configuration: reads the file (JSON or TOML) and `CLAWFT_…` overrides through the `config`
//! crate, resolves secrets by `*_env`/`*_file` indirection, validates, and returns [`Config`].
//!
//! This is the only module that reads the process environment; everything else receives typed
//! sub-configs.

pub mod file;
pub mod subagents;

use crate::types::{Secret, SettingError};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use file::ConfigFile;

/// Default bind address of the local HTTP API.
pub const DEFAULT_HTTP_BIND: &str = "127.0.0.1:18790";
/// Ollama's default OpenAI-compatible endpoint, used when nothing else is configured.
pub const LOCAL_DEFAULT_BASE_URL: &str = "http://127.0.0.1:11434/v1";
/// Default `agents.defaults.max_tool_iterations` (seed 000).
pub const DEFAULT_MAX_TOOL_ITERATIONS: u32 = 20;

/// Why the configuration could not be loaded. Every variant names the key and what is expected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file given with `--config` does not exist.
    #[error("config file {0} does not exist (run `weft onboard` to create one)")]
    Missing(PathBuf),
    /// The file is not valid JSON/TOML, has unknown keys or values of the wrong type.
    #[error("invalid configuration in {source_name}: {detail}")]
    Parse {
        /// File (or environment) the error came from.
        source_name: String,
        /// What the parser said, with the key path.
        detail: String,
    },
    /// A value is of the right type but not acceptable.
    #[error("invalid value for `{key}`: {detail}")]
    Invalid {
        /// Dotted key path.
        key: String,
        /// What is expected.
        detail: String,
    },
    /// A secret given by indirection could not be read.
    #[error("cannot read secret for `{key}`: {detail}")]
    Secret {
        /// Dotted key path.
        key: String,
        /// What went wrong and how to fix it.
        detail: String,
    },
}

impl From<SettingError> for ConfigError {
    fn from(e: SettingError) -> Self {
        ConfigError::Invalid {
            key: e.key,
            detail: e.detail,
        }
    }
}

/// A snapshot of the process environment (tests pass their own).
#[derive(Clone, Debug, Default)]
pub struct Env(BTreeMap<String, String>);

impl Env {
    /// The current process environment.
    pub fn from_process() -> Self {
        Self(std::env::vars().collect())
    }
    /// An environment made of these pairs.
    pub fn from_pairs<I, K, V>(pairs: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        Self(
            pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
    /// One variable, if set and not empty.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
    /// The user's home directory.
    pub fn home(&self) -> PathBuf {
        self.get("HOME")
            .map_or_else(|| PathBuf::from("/"), PathBuf::from)
    }
}

/// Which wire protocol a provider speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    /// OpenAI-compatible chat completions.
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
}

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
}

/// The store.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreConfig {
    /// Directory of the sled database.
    pub path: PathBuf,
    /// Page cache bound in bytes.
    pub cache_bytes: u64,
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
}

/// The validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The file it was read from, if any.
    pub path: Option<PathBuf>,
    /// `~/.clawft`.
    pub home: PathBuf,
    /// Agent behaviour.
    pub agent: AgentConfig,
    /// Providers in fallback order (never empty).
    pub providers: Vec<ProviderConfig>,
    /// Where the providers came from.
    pub provider_source: ProviderSource,
    /// The HTTP API.
    pub http: HttpChannelConfig,
    /// The store.
    pub store: StoreConfig,
    /// Session limits.
    pub sessions: SessionLimits,
    /// Tool settings.
    pub tools: ToolsConfig,
    /// Chat platform channels (Telegram, Discord, Slack) that are enabled.
    pub chat_channels: Vec<ChatChannelConfig>,
    /// Every secret value, so tool output and logs can be scrubbed of them.
    pub secrets: Vec<Secret>,
    /// The service manager's notification socket (`$NOTIFY_SOCKET`; a leading `@` names an
    /// abstract socket). `None` when not run by systemd with `Type=notify`.
    pub notify_socket: Option<PathBuf>,
    /// How often to send `WATCHDOG=1`: half of `$WATCHDOG_USEC`, when it is set and
    /// `$WATCHDOG_PID` (if set) is this process.
    pub watchdog: Option<Duration>,
}

/// A chat platform.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Platform {
    /// Telegram.
    Telegram,
    /// Discord.
    Discord,
    /// Slack.
    Slack,
}

impl Platform {
    /// The channel id and config key.
    pub fn name(self) -> &'static str {
        match self {
            Platform::Telegram => "telegram",
            Platform::Discord => "discord",
            Platform::Slack => "slack",
        }
    }
}

/// A validated `channels.<platform>` section.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatChannelConfig {
    /// Which platform.
    pub platform: Platform,
    /// Bot token.
    pub token: Secret,
    /// Slack's app-level token.
    pub app_token: Option<Secret>,
    /// Admitted user ids.
    pub allow_from: std::collections::BTreeSet<String>,
    /// Pairing of unknown senders.
    pub pairing: bool,
    /// Answer every group message (`true`) or only mentions/replies.
    pub group_all: bool,
    /// One session per sender in each chat.
    pub per_user_sessions: bool,
    /// API base override.
    pub api_url: Option<String>,
    /// Discord REST proxy.
    pub proxy: Option<String>,
    /// Stream by editing a draft.
    pub stream_edits: bool,
    /// Least time between draft edits.
    pub edit_interval: Duration,
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
    /// `tools.web_fetch`.
    pub web_fetch: crate::tools::web::WebFetchSettings,
    /// `tools.web_search`.
    pub web_search: crate::tools::web::WebSearchSettings,
    /// `tools.subagents`.
    pub subagents: subagents::SubagentSettings,
}

/// Where the config file is looked for when `--config` is not given.
pub fn default_path(env: &Env) -> PathBuf {
    let dir = clawft_home(env);
    let toml = dir.join("config.toml");
    if toml.exists() {
        toml
    } else {
        dir.join("config.json")
    }
}

/// `$CLAWFT_HOME` or `~/.clawft`.
pub fn clawft_home(env: &Env) -> PathBuf {
    env.get("CLAWFT_HOME")
        .map_or_else(|| env.home().join(".clawft"), PathBuf::from)
}

fn expand(path: &str, env: &Env) -> PathBuf {
    if path == "~" {
        env.home()
    } else if let Some(rest) = path.strip_prefix("~/") {
        env.home().join(rest)
    } else {
        PathBuf::from(path)
    }
}

impl Config {
    /// Load from `path` (or the default location; a missing default file means defaults),
    /// apply `CLAWFT_SECTION__KEY` overrides from `env`, resolve secrets, validate.
    ///
    /// # Errors
    /// [`ConfigError`] naming the key and what is expected.
    pub fn load(path: Option<&Path>, env: &Env) -> Result<Config, ConfigError> {
        let explicit = path.is_some();
        let path = path.map_or_else(|| default_path(env), Path::to_path_buf);
        let exists = path.exists();
        if explicit && !exists {
            return Err(ConfigError::Missing(path));
        }
        let mut builder = config::Config::builder();
        if exists {
            let format = match path.extension().and_then(|e| e.to_str()) {
                Some("toml") => config::FileFormat::Toml,
                Some("json") | None => config::FileFormat::Json,
                Some(other) => {
                    return Err(ConfigError::Invalid {
                        key: "--config".into(),
                        detail: format!(
                            "unsupported extension `.{other}`: use a .json or .toml file"
                        ),
                    })
                }
            };
            builder = builder.add_source(config::File::from(path.as_path()).format(format));
        }
        let overrides: config::Map<String, String> = env
            .0
            .iter()
            .filter(|(k, _)| k.starts_with("CLAWFT_") && k.contains("__"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !overrides.is_empty() {
            builder = builder.add_source(
                config::Environment::with_prefix("CLAWFT")
                    .prefix_separator("_")
                    .separator("__")
                    .try_parsing(true)
                    .source(Some(overrides)),
            );
        }
        let source_name = if exists {
            path.display().to_string()
        } else {
            "defaults".to_string()
        };
        let raw = builder
            .build()
            .map_err(|e| ConfigError::Parse {
                source_name: source_name.clone(),
                detail: e.to_string(),
            })?
            .try_deserialize::<ConfigFile>()
            .map_err(|e| ConfigError::Parse {
                source_name,
                detail: e.to_string(),
            })?;
        let config_dir = path
            .parent()
            .map_or_else(|| clawft_home(env), Path::to_path_buf);
        Self::resolve(raw, exists.then_some(path), &config_dir, env)
    }

    /// Parse configuration text directly (used by tests of the example config).
    ///
    /// # Errors
    /// As [`Config::load`].
    pub fn from_str(text: &str, toml: bool, env: &Env) -> Result<Config, ConfigError> {
        let format = if toml {
            config::FileFormat::Toml
        } else {
            config::FileFormat::Json
        };
        let raw = config::Config::builder()
            .add_source(config::File::from_str(text, format))
            .build()
            .and_then(config::Config::try_deserialize::<ConfigFile>)
            .map_err(|e| ConfigError::Parse {
                source_name: "text".into(),
                detail: e.to_string(),
            })?;
        Self::resolve(raw, None, &clawft_home(env), env)
    }

    fn resolve(
        raw: ConfigFile,
        path: Option<PathBuf>,
        config_dir: &Path,
        env: &Env,
    ) -> Result<Config, ConfigError> {
        let home = clawft_home(env);
        let mut secrets = Vec::new();
        let mut d = raw.agents.defaults;
        let agent_tools = d.tools.take();
        let max_tool_iterations = match d.max_tool_iterations {
            None => DEFAULT_MAX_TOOL_ITERATIONS,
            Some(n) => u32::try_from(n.clamp(1, 10_000)).unwrap_or(DEFAULT_MAX_TOOL_ITERATIONS),
        };
        if let Some(t) = d.temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err(ConfigError::Invalid {
                    key: "agents.defaults.temperature".into(),
                    detail: format!("expected a number between 0 and 2, got {t}"),
                });
            }
        }
        let workspace = d
            .workspace
            .as_deref()
            .map_or_else(|| home.join("workspace"), |w| expand(w, env));
        let tool_timeout = Duration::from_secs(raw.tools.timeout_secs.unwrap_or(120).max(1));
        let agent = AgentConfig {
            workspace,
            max_tool_iterations,
            system_prompt: d.system_prompt,
            max_tokens: d.max_tokens,
            temperature: d.temperature,
            stream: d.stream.unwrap_or(true),
            tool_timeout,
        };

        let (providers, provider_source) = resolve_providers(
            raw.providers,
            d.provider.as_deref(),
            d.fallback.as_deref(),
            d.model.as_deref(),
            config_dir,
            env,
            &mut secrets,
        )?;

        let h = raw.channels.http;
        let bind_text = h.bind.as_deref().unwrap_or(DEFAULT_HTTP_BIND);
        let bind: SocketAddr = bind_text.parse().map_err(|_| ConfigError::Invalid {
            key: "channels.http.bind".into(),
            detail: format!("expected an address like 127.0.0.1:18790, got `{bind_text}`"),
        })?;
        let token = resolve_secret(
            "channels.http.token",
            h.token,
            h.token_env,
            h.token_file,
            config_dir,
            env,
        )?;
        if let Some(t) = &token {
            secrets.push(t.clone());
        }
        let http = HttpChannelConfig {
            enabled: h.enabled.unwrap_or(true),
            bind,
            token,
            reply_timeout: Duration::from_secs(h.reply_timeout_secs.unwrap_or(300).max(1)),
        };
        if http.enabled && !bind.ip().is_loopback() && http.token.is_none() {
            return Err(ConfigError::Invalid {
                key: "channels.http.bind".into(),
                detail: format!(
                    "{bind} is not a loopback address: set channels.http.token (or token_env / token_file) so the API requires a bearer token, or bind 127.0.0.1"
                ),
            });
        }

        let store = StoreConfig {
            path: raw
                .store
                .path
                .as_deref()
                .map_or_else(|| home.join("store"), |p| expand(p, env)),
            cache_bytes: raw.store.cache_mb.unwrap_or(8).clamp(1, 4096) * 1024 * 1024,
        };
        let sessions = SessionLimits {
            idle: Duration::from_secs(raw.sessions.idle_secs.unwrap_or(600).max(1)),
            max_queue: raw.sessions.max_queue.unwrap_or(100).max(1),
            shutdown_grace: Duration::from_secs(raw.sessions.shutdown_grace_secs.unwrap_or(10)),
        };
        let chat_channels = resolve_chat_channels(
            raw.channels.telegram,
            raw.channels.discord,
            raw.channels.slack,
            config_dir,
            env,
            &mut secrets,
        )?;
        let tools = resolve_tools(
            raw.tools,
            agent_tools.as_ref(),
            providers.first().map(|p| p.name.as_str()),
            config_dir,
            env,
            &mut secrets,
        )?;
        Ok(Config {
            path,
            home,
            agent,
            providers,
            provider_source,
            http,
            store,
            sessions,
            tools,
            chat_channels,
            secrets,
            notify_socket: env.get("NOTIFY_SOCKET").map(PathBuf::from),
            watchdog: watchdog_interval(env, std::process::id()),
        })
    }
}

/// The watchdog ping interval from `$WATCHDOG_USEC` (half of it, as sd_watchdog_enabled(3)
/// recommends), `None` when unset, zero, unparsable or meant for another pid (`$WATCHDOG_PID`).
pub fn watchdog_interval(env: &Env, pid: u32) -> Option<Duration> {
    if let Some(p) = env.get("WATCHDOG_PID") {
        if p.trim().parse::<u32>().ok() != Some(pid) {
            return None;
        }
    }
    let usec = env.get("WATCHDOG_USEC")?.trim().parse::<u64>().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec / 2).max(Duration::from_millis(1)))
}

fn resolve_chat_channels(
    telegram: Option<file::ChatChannelFile>,
    discord: Option<file::ChatChannelFile>,
    slack: Option<file::ChatChannelFile>,
    config_dir: &Path,
    env: &Env,
    secrets: &mut Vec<Secret>,
) -> Result<Vec<ChatChannelConfig>, ConfigError> {
    let mut out = Vec::new();
    for (platform, f) in [
        (Platform::Telegram, telegram),
        (Platform::Discord, discord),
        (Platform::Slack, slack),
    ] {
        let Some(f) = f else { continue };
        if !f.enabled.unwrap_or(true) {
            continue;
        }
        let name = platform.name();
        let key = |k: &str| format!("channels.{name}.{k}");
        let token = resolve_secret(&key("token"), f.token, f.token_env, f.token_file, config_dir, env)?
            .ok_or_else(|| ConfigError::Invalid {
                key: key("token"),
                detail: format!("the {name} channel is enabled but has no bot token: set token_env or token_file (or enabled = false)"),
            })?;
        secrets.push(token.clone());
        let app_token = resolve_secret(
            &key("app_token"),
            f.app_token,
            f.app_token_env,
            f.app_token_file,
            config_dir,
            env,
        )?;
        match (platform, &app_token) {
            (Platform::Slack, None) => {
                return Err(ConfigError::Invalid {
                    key: key("app_token"),
                    detail: "Slack's Socket Mode needs the app-level token (xapp-...): set app_token_env or app_token_file".into(),
                })
            }
            (Platform::Telegram | Platform::Discord, Some(_)) => {
                return Err(ConfigError::Invalid {
                    key: key("app_token"),
                    detail: format!("only the slack channel has an app token, not {name}"),
                })
            }
            _ => {}
        }
        if let Some(t) = &app_token {
            secrets.push(t.clone());
        }
        if f.proxy.is_some() && platform != Platform::Discord {
            return Err(ConfigError::Invalid {
                key: key("proxy"),
                detail: "only the discord channel takes a REST proxy; use api_url".into(),
            });
        }
        if f.api_url.is_some() && platform == Platform::Discord {
            return Err(ConfigError::Invalid {
                key: key("api_url"),
                detail: "the discord channel takes `proxy` (an HTTP proxy in front of Discord's REST API), not api_url".into(),
            });
        }
        for (k, v) in [("api_url", &f.api_url), ("proxy", &f.proxy)] {
            if let Some(u) = v {
                if !(u.starts_with("http://") || u.starts_with("https://")) {
                    return Err(ConfigError::Invalid {
                        key: key(k),
                        detail: format!("expected an http:// or https:// URL, got `{u}`"),
                    });
                }
            }
        }
        let group_all = match f.group_mode.as_deref() {
            None | Some("mention") => false,
            Some("all") => true,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    key: key("group_mode"),
                    detail: format!("expected \"mention\" or \"all\", got \"{other}\""),
                })
            }
        };
        let per_user_sessions = match f.group_sessions.as_deref() {
            None | Some("chat") => false,
            Some("user") => true,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    key: key("group_sessions"),
                    detail: format!("expected \"chat\" or \"user\", got \"{other}\""),
                })
            }
        };
        let allow_from = f
            .allow_from
            .unwrap_or_default()
            .iter()
            .map(ToString::to_string)
            .filter(|s| !s.is_empty())
            .collect::<std::collections::BTreeSet<_>>();
        let pairing = f.pairing.unwrap_or(false);
        if allow_from.is_empty() && !pairing {
            tracing::warn!(
                channel = name,
                "channels.{name}.allow_from is empty and pairing is off: nobody can talk to this bot"
            );
        }
        out.push(ChatChannelConfig {
            platform,
            token,
            app_token,
            allow_from,
            pairing,
            group_all,
            per_user_sessions,
            api_url: f.api_url,
            proxy: f.proxy,
            stream_edits: f.stream_edits.unwrap_or(true),
            edit_interval: Duration::from_millis(f.edit_interval_ms.unwrap_or(1500).max(200)),
        });
    }
    Ok(out)
}

fn resolve_tools(
    mut t: file::ToolsFile,
    agent: Option<&crate::tools::policy::PolicyLayerFile>,
    primary_provider: Option<&str>,
    config_dir: &Path,
    env: &Env,
    secrets: &mut Vec<Secret>,
) -> Result<ToolsConfig, ConfigError> {
    let agent_layer = agent
        .map(|a| a.resolve("agents.defaults.tools"))
        .transpose()?
        .unwrap_or_default();
    let policy = t.policy.resolve(primary_provider, &agent_layer)?;
    let per_minute = t.rate_limit.per_minute.unwrap_or(120);
    let rate_limit = (per_minute > 0).then(|| crate::tools::ratelimit::RateLimit {
        per_minute,
        burst: t.rate_limit.burst.unwrap_or(60).max(1),
    });
    let message_allow = t.message.allow.clone().unwrap_or_default();
    for r in &message_allow {
        if !r.contains(':') {
            return Err(ConfigError::Invalid {
                key: "tools.message.allow".into(),
                detail: format!("expected `channel:chat_id` patterns like \"telegram:12345\" or \"slack:C01*\", got `{r}`"),
            });
        }
    }
    let web_fetch = t.web_fetch.resolve()?;
    let search_key = resolve_secret(
        "tools.web_search.api_key",
        t.web_search.api_key.take(),
        t.web_search.api_key_env.take(),
        t.web_search.api_key_file.take(),
        config_dir,
        env,
    )?;
    if let Some(k) = &search_key {
        secrets.push(k.clone());
    }
    let web_search = t.web_search.resolve(search_key)?;
    let files = t.files.resolve()?;
    let mut mcp_servers = Vec::new();
    for (name, f) in &t.mcp_servers {
        match f.resolve(name, &|var| env.get(var).map(str::to_string))? {
            Some(s) => {
                secrets.extend(s.secrets().into_iter().map(Secret::new));
                mcp_servers.push(s);
            }
            None => tracing::warn!(
                server = %name,
                "tools.mcp_servers.{name} has neither `command` nor `url`: skipped"
            ),
        }
    }
    let exec = t.exec.resolve()?;
    let subagents = t.subagents.resolve()?;
    Ok(ToolsConfig {
        subagents,
        policy,
        rate_limit,
        message_allow,
        exec,
        exec_env: env.0.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        credentials_dir: env.get("CREDENTIALS_DIRECTORY").map(PathBuf::from),
        tmp_base: env
            .get("TMPDIR")
            .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from),
        files,
        mcp_servers,
        memory_fallback: Some(env.home().join(".nanobot/workspace/memory/MEMORY.md")),
        web_fetch,
        web_search,
    })
}

fn resolve_secret(
    key: &str,
    inline: Option<String>,
    env_name: Option<String>,
    file: Option<String>,
    config_dir: &Path,
    env: &Env,
) -> Result<Option<Secret>, ConfigError> {
    let set = [inline.is_some(), env_name.is_some(), file.is_some()]
        .iter()
        .filter(|b| **b)
        .count();
    if set > 1 {
        return Err(ConfigError::Invalid {
            key: key.into(),
            detail: format!("set only one of `{key}`, `{key}_env`, `{key}_file`"),
        });
    }
    if let Some(v) = inline {
        return Ok(Some(Secret::new(v)));
    }
    if let Some(name) = env_name {
        return match env.get(&name) {
            Some(v) => Ok(Some(Secret::new(v))),
            None => Err(ConfigError::Secret {
                key: format!("{key}_env"),
                detail: format!("environment variable {name} is not set"),
            }),
        };
    }
    if let Some(f) = file {
        let p = expand(&f, env);
        let p = if p.is_absolute() {
            p
        } else if let Some(dir) = env.get("CREDENTIALS_DIRECTORY") {
            Path::new(dir).join(p)
        } else {
            config_dir.join(p)
        };
        return match std::fs::read_to_string(&p) {
            Ok(v) if !v.trim().is_empty() => Ok(Some(Secret::new(v.trim()))),
            Ok(_) => Err(ConfigError::Secret {
                key: format!("{key}_file"),
                detail: format!("{} is empty", p.display()),
            }),
            Err(e) => Err(ConfigError::Secret {
                key: format!("{key}_file"),
                detail: format!("{}: {e}", p.display()),
            }),
        };
    }
    Ok(None)
}

fn default_model(name: &str, kind: ProviderKind) -> &'static str {
    match (name, kind) {
        (_, ProviderKind::Anthropic) => "claude-sonnet-4-5",
        ("openrouter", _) => "openai/gpt-4o-mini",
        ("ollama" | "local", _) => "llama3.2",
        _ => "gpt-4o-mini",
    }
}

fn default_base_url(name: &str, kind: ProviderKind) -> &'static str {
    match (name, kind) {
        (_, ProviderKind::Anthropic) => "https://api.anthropic.com",
        ("openrouter", _) => "https://openrouter.ai/api/v1",
        ("ollama" | "local", _) => LOCAL_DEFAULT_BASE_URL,
        _ => "https://api.openai.com/v1",
    }
}

#[allow(clippy::too_many_arguments)]
fn provider(
    name: &str,
    kind: ProviderKind,
    base_url: Option<String>,
    api_key: Option<Secret>,
    model: Option<&str>,
    timeout_secs: Option<u64>,
    headers: Vec<(String, String)>,
    max_retries: Option<u32>,
) -> ProviderConfig {
    ProviderConfig {
        name: name.to_string(),
        kind,
        base_url: base_url
            .unwrap_or_else(|| default_base_url(name, kind).to_string())
            .trim_end_matches('/')
            .to_string(),
        api_key,
        model: model.map_or_else(|| default_model(name, kind).to_string(), str::to_string),
        timeout: Duration::from_secs(timeout_secs.unwrap_or(120).max(1)),
        headers,
        max_retries: max_retries.unwrap_or(3),
    }
}

fn resolve_providers(
    raw: BTreeMap<String, file::ProviderFile>,
    first: Option<&str>,
    fallback: Option<&[String]>,
    model_override: Option<&str>,
    config_dir: &Path,
    env: &Env,
    secrets: &mut Vec<Secret>,
) -> Result<(Vec<ProviderConfig>, ProviderSource), ConfigError> {
    if raw.is_empty() {
        let mut found = Vec::new();
        let mut out = Vec::new();
        let from_env = [
            (
                "openai",
                ProviderKind::OpenAi,
                "OPENAI_API_KEY",
                Some("OPENAI_BASE_URL"),
            ),
            (
                "anthropic",
                ProviderKind::Anthropic,
                "ANTHROPIC_API_KEY",
                Some("ANTHROPIC_BASE_URL"),
            ),
            (
                "openrouter",
                ProviderKind::OpenAi,
                "OPENROUTER_API_KEY",
                None,
            ),
        ];
        for (name, kind, key_var, base_var) in from_env {
            if let Some(key) = env.get(key_var) {
                let secret = Secret::new(key);
                secrets.push(secret.clone());
                found.push(key_var.to_string());
                let base = base_var.and_then(|b| env.get(b)).map(str::to_string);
                out.push(provider(
                    name,
                    kind,
                    base,
                    Some(secret),
                    model_override,
                    None,
                    Vec::new(),
                    None,
                ));
            }
        }
        if !out.is_empty() {
            return Ok((out, ProviderSource::Environment(found)));
        }
        let base = env.get("OPENAI_BASE_URL").map(str::to_string);
        return Ok((
            vec![provider(
                "local",
                ProviderKind::OpenAi,
                base,
                None,
                model_override,
                None,
                Vec::new(),
                None,
            )],
            ProviderSource::LocalDefault,
        ));
    }

    let mut all = BTreeMap::new();
    for (name, p) in raw {
        let key = format!("providers.{name}");
        let kind = match p.kind.as_deref() {
            None if name == "anthropic" => ProviderKind::Anthropic,
            None | Some("openai") => ProviderKind::OpenAi,
            Some("anthropic") => ProviderKind::Anthropic,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    key: format!("{key}.kind"),
                    detail: format!("expected `openai` or `anthropic`, got `{other}`"),
                })
            }
        };
        if let Some(url) = &p.base_url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(ConfigError::Invalid {
                    key: format!("{key}.base_url"),
                    detail: format!("expected an http:// or https:// URL, got `{url}`"),
                });
            }
        }
        let api_key = resolve_secret(
            &format!("{key}.api_key"),
            p.api_key,
            p.api_key_env,
            p.api_key_file,
            config_dir,
            env,
        )?;
        if let Some(s) = &api_key {
            secrets.push(s.clone());
        }
        let headers = p.headers.unwrap_or_default().into_iter().collect();
        let model = model_override.or(p.model.as_deref());
        all.insert(
            name.clone(),
            provider(
                &name,
                kind,
                p.base_url,
                api_key,
                model,
                p.timeout_secs,
                headers,
                p.max_retries,
            ),
        );
    }
    let mut order: Vec<String> = Vec::new();
    match first {
        Some(f) => order.push(f.to_string()),
        None => order.extend(all.keys().next().cloned()),
    }
    for f in fallback.unwrap_or_default() {
        if !order.contains(f) {
            order.push(f.clone());
        }
    }
    let mut out = Vec::new();
    for (i, name) in order.iter().enumerate() {
        let key = if i == 0 {
            "agents.defaults.provider"
        } else {
            "agents.defaults.fallback"
        };
        match all.get(name) {
            Some(p) => out.push(p.clone()),
            None => {
                return Err(ConfigError::Invalid {
                    key: key.into(),
                    detail: format!(
                        "no provider named `{name}`; configured: {}",
                        all.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                })
            }
        }
    }
    Ok((out, ProviderSource::Configured))
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
