//! File + environment → [`Config`]: read and merge the sources, then resolve the file section
//! by section (each with its own function below, or its module's resolver), secrets by
//! indirection recorded for the scrubber. The top of `config/`: nothing here imports it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clawft_channel_core::spec::Intake;

use super::agents::{self, NamedAgent};
use super::channels::{ChannelsFile, ChatChannelConfig, HttpFile};
use super::env::{clawft_home, default_path, env_overrides, expand, merged, override_key, Env};
use super::error::ConfigError;
use super::file::{self, ConfigFile};
use super::loaded::Config;
use super::provenance::Provenance;
use super::providers::{agent_subagents, local_zone, resolve_agent, AgentEnv, ResolvedAgent};
use super::secrets::{resolve_secret, resolve_service_secret, ChannelSecrets};
use super::types::{
    AgentConfig, HttpChannelConfig, ProviderConfig, ProviderSource, SessionLimits, StoreConfig,
    ToolsConfig, DEFAULT_HTTP_BIND,
};
use super::usage::{resolve_usage, AgentBudgetsFile, UsageConfig};
use crate::types::session_key::DEFAULT_AGENT;
use crate::types::Secret;

/// Largest `channels.max_inbound_bytes` (4 MiB): beyond it one message alone would fill a
/// model's context, and the Slack adapter's WebSocket bound is the same.
const MAX_INBOUND_BYTES_LIMIT: u64 = 4 * 1024 * 1024;

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
        let format = if exists {
            match path.extension().and_then(|e| e.to_str()) {
                Some("toml") => Some(config::FileFormat::Toml),
                Some("json") | None => Some(config::FileFormat::Json),
                Some(other) => {
                    return Err(ConfigError::Invalid {
                        key: "--config".into(),
                        detail: format!(
                            "unsupported extension `.{other}`: use a .json or .toml file"
                        ),
                    })
                }
            }
        } else {
            None
        };
        let overrides = env_overrides(env);
        let file_source = format.map(|f| (path.as_path(), f));
        let raw = match read_raw(file_source, &overrides) {
            Ok(raw) => raw,
            Err(e) => return Err(parse_error(&e, file_source, &overrides)),
        };
        let config_dir = path
            .parent()
            .map_or_else(|| clawft_home(env), Path::to_path_buf);
        let provenance = Provenance::new(exists.then_some(path.as_path()), env);
        let locate = provenance.clone();
        Self::resolve(raw, exists.then_some(path), &config_dir, env, provenance)
            .map_err(|e| e.located(&locate))
    }

    /// What finds the running gateway when the whole file does not load (an unknown key, a
    /// bad value elsewhere): the file's `store` section alone (where the gateway's control
    /// file and token are), every other setting at its default. For the commands that only
    /// talk to the running gateway, which keeps the configuration it loaded.
    ///
    /// # Errors
    /// The file is missing, is not JSON/TOML at all, or its `store` section is itself invalid.
    pub fn load_to_find_gateway(path: Option<&Path>, env: &Env) -> Result<Config, ConfigError> {
        let explicit = path.is_some();
        let path = path.map_or_else(|| default_path(env), Path::to_path_buf);
        let exists = path.exists();
        if explicit && !exists {
            return Err(ConfigError::Missing(path));
        }
        let format = match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => config::FileFormat::Toml,
            Some(_) | None => config::FileFormat::Json,
        };
        let overrides = env_overrides(env);
        let file_source = exists.then_some((path.as_path(), format));
        let merged = merged(file_source, &overrides)
            .map_err(|e| parse_error(&e, file_source, &overrides))?;
        let store = match merged.get::<file::StoreFile>("store") {
            Ok(s) => s,
            Err(config::ConfigError::NotFound(_)) => file::StoreFile::default(),
            Err(e) => return Err(parse_error(&e, file_source, &overrides)),
        };
        let raw = ConfigFile {
            store,
            ..ConfigFile::default()
        };
        let config_dir = path
            .parent()
            .map_or_else(|| clawft_home(env), Path::to_path_buf);
        Self::resolve(
            raw,
            exists.then_some(path),
            &config_dir,
            env,
            Provenance::default(),
        )
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
        Self::resolve(raw, None, &clawft_home(env), env, Provenance::default())
    }

    /// Every section of the file resolved, in the order their errors are reported.
    fn resolve(
        raw: ConfigFile,
        path: Option<PathBuf>,
        config_dir: &Path,
        env: &Env,
        mut provenance: Provenance,
    ) -> Result<Config, ConfigError> {
        let home = clawft_home(env);
        let mut secrets = Vec::new();
        // Every section of the file: a new one fails the build here until it is resolved.
        let ConfigFile {
            agents: agent_files,
            providers: provider_files,
            mut channels,
            store,
            sessions,
            tools: tools_file,
            prices,
            budgets,
            memory,
            scheduler,
            heartbeat,
            bindings,
            hooks,
            media,
            node,
            cluster,
        } = raw;
        let Agents {
            mut agent,
            mut agents,
            providers,
            provider_source,
            tools_layer,
            budgets: agent_budgets,
            named,
        } = resolve_agents(
            agent_files,
            provider_files,
            &tools_file,
            &AgentsEnv {
                home: &home,
                config_dir,
                env,
            },
            &mut secrets,
            &mut provenance,
        )?;
        let bindings = agents::Bindings::resolve(bindings, &named)?;
        let hooks = {
            let names: Vec<&str> = std::iter::once(DEFAULT_AGENT)
                .chain(agents.iter().map(|a| a.name.as_str()))
                .collect();
            super::hooks::resolve(hooks, &names, config_dir, env, &mut secrets)?
        };
        let media = super::media::resolve(media, config_dir, env, &mut secrets)?;
        let http = resolve_http(
            std::mem::take(&mut channels.http),
            config_dir,
            env,
            &mut secrets,
        )?;
        let store = resolve_store(store, &home, env)?;
        let sessions = resolve_sessions(&sessions);
        let max_inbound_bytes = resolve_max_inbound(channels.max_inbound_bytes)?;
        let chat_channels = resolve_chat(channels, &http, config_dir, env, &mut secrets)?;
        let mut tools = resolve_tools(
            tools_file,
            tools_layer.as_ref(),
            providers.first().map(|p| p.name.as_str()),
            config_dir,
            env,
            &mut secrets,
        )?;
        expand_custom_tools(&mut tools, &mut agent, &mut agents);
        let memory = resolve_memory(&memory, config_dir, env, &mut secrets)?;
        let cluster = cluster
            .as_ref()
            .map(|c| resolve_cluster(c, config_dir, env, &mut secrets))
            .transpose()?;
        Ok(Config {
            path,
            home,
            agent_name: DEFAULT_AGENT.to_string(),
            agent,
            agents,
            bindings,
            hooks,
            media,
            providers,
            provider_source,
            http,
            store,
            sessions,
            tools,
            chat_channels,
            max_inbound_bytes,
            secrets,
            notify_socket: env.get("NOTIFY_SOCKET").map(PathBuf::from),
            watchdog: watchdog_interval(env, std::process::id()),
            usage: UsageConfig {
                agents: agent_budgets,
                ..resolve_usage(&prices, &budgets)?
            },
            memory,
            scheduler: scheduler.resolve()?,
            heartbeat: heartbeat.resolve()?,
            node: resolve_node(node, env),
            cluster,
            provenance,
            deferred_secrets: env.take_deferred(),
        })
    }
}

/// What resolving the agents needs beside their sections.
struct AgentsEnv<'a> {
    /// `~/.clawft`.
    home: &'a Path,
    /// The config file's directory.
    config_dir: &'a Path,
    /// The environment.
    env: &'a Env,
}

/// `agents.*` resolved.
struct Agents {
    /// The default agent's behaviour.
    agent: AgentConfig,
    /// The named agents.
    agents: Vec<NamedAgent>,
    /// The default agent's providers, in fallback order.
    providers: Vec<ProviderConfig>,
    /// Where they came from.
    provider_source: ProviderSource,
    /// The default agent's tool policy layer as written.
    tools_layer: Option<crate::tools::policy::PolicyLayerFile>,
    /// Each agent's own spending limits, by agent name.
    budgets: BTreeMap<String, AgentBudgetsFile>,
    /// The named agents' sections as written (bindings name them).
    named: BTreeMap<String, file::AgentDefaultsFile>,
}

/// `agents.*`: the default agent (`agents.defaults`, with `agents.main` over it) and each
/// named agent `agents.NAME` over the defaults, with their providers, subagent limits, budgets
/// and tool policies.
fn resolve_agents(
    mut named: BTreeMap<String, file::AgentDefaultsFile>,
    provider_files: BTreeMap<String, file::ProviderFile>,
    tools: &file::ToolsFile,
    e: &AgentsEnv<'_>,
    secrets: &mut Vec<Secret>,
    provenance: &mut Provenance,
) -> Result<Agents, ConfigError> {
    let tool_timeout = Duration::from_secs(tools.timeout_secs.unwrap_or(120).max(1));
    let local_zone = local_zone(e.env);
    let defaults = named.remove("defaults").unwrap_or_default();
    let mut main_file = match named.remove(DEFAULT_AGENT) {
        Some(over) => agents::merge_agent(&defaults, over),
        None => defaults.clone(),
    };
    let mut budgets = BTreeMap::new();
    let (main_subagents, main_budgets) = (main_file.subagents.take(), main_file.budgets.take());
    let mcp_names: Vec<String> = tools.mcp_servers.keys().cloned().collect();
    let ResolvedAgent {
        mut agent,
        providers,
        source: provider_source,
        tools: tools_layer,
    } = resolve_agent(
        main_file,
        provider_files.clone(),
        &mcp_names,
        &AgentEnv {
            home: e.home,
            default_workspace: "workspace".into(),
            tool_timeout,
            config_dir: e.config_dir,
            env: e.env,
            local_zone: &local_zone,
        },
        secrets,
        provenance,
    )?;
    agent.subagents = agent_subagents(&tools.subagents, main_subagents, "agents.defaults")?;
    if let Some(b) = main_budgets.filter(|b| !b.is_empty()) {
        b.check("agents.defaults.budgets")?;
        budgets.insert(DEFAULT_AGENT.to_string(), b);
    }
    let mut out = Vec::new();
    for (name, over) in named.clone() {
        let name = &name;
        agents::check_agent_name(name)?;
        let rename = |e| agents::rename_error(e, name);
        // Not inherited: each agent has its own workspace (its memory and context files)
        // unless it names one.
        let base = file::AgentDefaultsFile {
            workspace: None,
            ..defaults.clone()
        };
        let mut merged = agents::merge_agent(&base, over);
        let (sub, own_budgets) = (merged.subagents.take(), merged.budgets.take());
        if let Some(b) = own_budgets.filter(|b| !b.is_empty()) {
            b.check(&format!("agents.{name}.budgets"))?;
            budgets.insert(name.clone(), b);
        }
        let mut r = resolve_agent(
            merged,
            provider_files.clone(),
            &mcp_names,
            &AgentEnv {
                home: e.home,
                default_workspace: format!("workspace-{name}"),
                tool_timeout,
                config_dir: e.config_dir,
                env: e.env,
                local_zone: &local_zone,
            },
            &mut Vec::new(),
            &mut Provenance::default(),
        )
        .map_err(rename)?;
        r.agent.subagents = agent_subagents(&tools.subagents, sub, &format!("agents.{name}"))?;
        let layer = r
            .tools
            .as_ref()
            .map(|a| a.resolve(&format!("agents.{name}.tools")))
            .transpose()?
            .unwrap_or_default();
        let policy = tools
            .policy
            .resolve(r.providers.first().map(|p| p.name.as_str()), &layer)?;
        out.push(NamedAgent {
            name: name.clone(),
            agent: r.agent,
            providers: r.providers,
            policy,
        });
    }
    Ok(Agents {
        agent,
        agents: out,
        providers,
        provider_source,
        tools_layer,
        budgets,
        named,
    })
}

/// `channels.<platform>`: every enabled bot account of every platform (its settings checked
/// by its crate); a platform whose messages arrive as webhooks needs the HTTP listener.
fn resolve_chat(
    mut channels: ChannelsFile,
    http: &HttpChannelConfig,
    config_dir: &Path,
    env: &Env,
    secrets: &mut Vec<Secret>,
) -> Result<Vec<ChatChannelConfig>, ConfigError> {
    let chat = channels.resolve_chat(&mut ChannelSecrets {
        config_dir,
        env,
        secrets,
    })?;
    for c in &chat {
        if let Intake::Webhooks { without_listener } = c.settings.intake() {
            if !http.enabled {
                return Err(ConfigError::Invalid {
                    key: c.config_key("enabled"),
                    detail: without_listener.into(),
                });
            }
        }
    }
    Ok(chat)
}

/// `tools.custom` named in tool policies and subagent deny lists: `custom:NAME` patterns made
/// the tools' names, once the custom tools are known.
fn expand_custom_tools(
    tools: &mut ToolsConfig,
    agent: &mut AgentConfig,
    agents: &mut [NamedAgent],
) {
    let custom: Vec<String> = tools.custom.iter().map(|c| c.name.clone()).collect();
    tools.policy.expand_custom(&custom);
    crate::tools::policy::expand_custom_in(&mut tools.subagents.deny, &custom);
    for a in agents {
        a.policy.expand_custom(&custom);
        if let Some(s) = &mut a.agent.subagents {
            crate::tools::policy::expand_custom_in(&mut s.deny, &custom);
        }
    }
    if let Some(s) = &mut agent.subagents {
        crate::tools::policy::expand_custom_in(&mut s.deny, &custom);
    }
}

/// `[node]`: the settings of `weft node`, its paths with `~/` expanded.
fn resolve_node(node: file::NodeFile, env: &Env) -> file::NodeFile {
    file::NodeFile {
        workspace: node
            .workspace
            .as_deref()
            .map(|w| expand(w, env).display().to_string()),
        gateway_ca: node
            .gateway_ca
            .as_deref()
            .map(|w| expand(w, env).display().to_string()),
        ..node
    }
}

/// `[cluster]`: the NATS servers, this node, its credentials (secrets by indirection).
fn resolve_cluster(
    c: &crate::cluster::settings::ClusterFile,
    config_dir: &Path,
    env: &Env,
    secrets: &mut Vec<Secret>,
) -> Result<crate::cluster::settings::ClusterSettings, ConfigError> {
    let password = resolve_service_secret(
        "cluster.password",
        c.password.clone(),
        c.password_env.clone(),
        c.password_file.clone(),
        config_dir,
        env,
    )?;
    let token = resolve_service_secret(
        "cluster.token",
        c.token.clone(),
        c.token_env.clone(),
        c.token_file.clone(),
        config_dir,
        env,
    )?;
    secrets.extend(password.iter().chain(token.iter()).cloned());
    let path = |f: &str| {
        let p = expand(f, env);
        if p.is_absolute() {
            p
        } else {
            config_dir.join(p)
        }
    };
    Ok(c.resolve(
        crate::cluster::settings::ClusterSecrets { password, token },
        &path,
        &crate::cluster::settings::host_name(),
    )?)
}

/// `channels.http`: the bind, the bearer token (a secret), and the rules a non-loopback bind
/// must follow.
fn resolve_http(
    h: HttpFile,
    config_dir: &Path,
    env: &Env,
    secrets: &mut Vec<Secret>,
) -> Result<HttpChannelConfig, ConfigError> {
    let bind_text = h.bind.as_deref().unwrap_or(DEFAULT_HTTP_BIND);
    let bind: SocketAddr = bind_text.parse().map_err(|_| ConfigError::Invalid {
        key: "channels.http.bind".into(),
        detail: format!("expected an address like 127.0.0.1:18790, got `{bind_text}`"),
    })?;
    let token = resolve_service_secret(
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
    let tls = match (h.tls_bind, h.tls_cert, h.tls_key) {
        (None, None, None) => None,
        (Some(b), Some(c), Some(k)) => {
            let addr: SocketAddr = b.parse().map_err(|_| ConfigError::Invalid {
                key: "channels.http.tls_bind".into(),
                detail: format!("expected an address like 0.0.0.0:18443, got `{b}`"),
            })?;
            if addr == bind {
                return Err(ConfigError::Invalid {
                    key: "channels.http.tls_bind".into(),
                    detail: format!("{addr} is channels.http.bind too: give TLS its own port"),
                });
            }
            let path = |p: String| {
                let p = PathBuf::from(p);
                if p.is_absolute() {
                    p
                } else {
                    config_dir.join(p)
                }
            };
            Some((addr, path(c), path(k)))
        }
        _ => {
            return Err(ConfigError::Invalid {
                key: "channels.http.tls_bind".into(),
                detail: "tls_bind, tls_cert and tls_key go together: set all three (or none)"
                    .into(),
            })
        }
    };
    let http = HttpChannelConfig {
        tls,
        enabled: h.enabled.unwrap_or(true),
        bind,
        token,
        reply_timeout: Duration::from_secs(h.reply_timeout_secs.unwrap_or(300).max(1)),
        allow_loopback_without_token: h.allow_loopback_without_token.unwrap_or(false),
        ui_hosts: h
            .ui_hosts
            .unwrap_or_default()
            .into_iter()
            .map(|n| n.trim().to_ascii_lowercase())
            .collect(),
    };
    if let Some(bad) = http.ui_hosts.iter().find(|n| {
        n.is_empty()
            || n.contains(['/', ':', ' '])
            || !n
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
    }) {
        return Err(ConfigError::Invalid {
            key: "channels.http.ui_hosts".into(),
            detail: format!(
                "`{bad}`: expected a host name like \"gateway.example.com\" (no scheme, port or path)"
            ),
        });
    }
    if let Some((tls_bind, ..)) = &http.tls {
        if http.enabled && !tls_bind.ip().is_loopback() {
            if http.token.is_none() {
                return Err(ConfigError::Invalid {
                    key: "channels.http.tls_bind".into(),
                    detail: format!(
                        "{tls_bind} is not loopback: set channels.http.token (or token_env / token_file) first"
                    ),
                });
            }
            if http.allow_loopback_without_token {
                return Err(ConfigError::Invalid {
                    key: "channels.http.allow_loopback_without_token".into(),
                    detail: format!(
                        "not accepted with a TLS listener on {tls_bind} (not loopback): remove it, clients then send the bearer token"
                    ),
                });
            }
        }
    }
    if http.enabled && http.allow_loopback_without_token && !bind.ip().is_loopback() {
        return Err(ConfigError::Invalid {
            key: "channels.http.allow_loopback_without_token".into(),
            detail: format!(
                "only accepted with a loopback bind, and channels.http.bind is {bind}: remove it (clients then send the bearer token), or bind 127.0.0.1"
            ),
        });
    }
    if http.enabled && !bind.ip().is_loopback() && http.token.is_none() {
        return Err(ConfigError::Invalid {
            key: "channels.http.bind".into(),
            detail: format!(
                "{bind} is not a loopback address: set channels.http.token (or token_env / token_file) so the API requires a bearer token, or bind 127.0.0.1"
            ),
        });
    }
    Ok(http)
}

/// `store`.
fn resolve_store(raw: file::StoreFile, home: &Path, env: &Env) -> Result<StoreConfig, ConfigError> {
    Ok(StoreConfig {
        path: raw
            .path
            .as_deref()
            .map_or_else(|| home.join("store"), |p| expand(p, env)),
        cache_bytes: raw.cache_mb.unwrap_or(8).clamp(1, 4096) * 1024 * 1024,
        on_corruption: match raw.on_corruption.as_deref() {
            None => crate::store::OnCorruption::default(),
            Some(v) => {
                crate::store::OnCorruption::parse(v).map_err(|detail| ConfigError::Invalid {
                    key: "store.on_corruption".into(),
                    detail,
                })?
            }
        },
    })
}

/// `sessions`.
fn resolve_sessions(raw: &file::SessionsFile) -> SessionLimits {
    SessionLimits {
        idle: Duration::from_secs(raw.idle_secs.unwrap_or(600).max(1)),
        max_queue: raw.max_queue.unwrap_or(100).max(1),
        shutdown_grace: Duration::from_secs(raw.shutdown_grace_secs.unwrap_or(10)),
        max_in_memory: raw.max_in_memory.unwrap_or(256).max(1),
    }
}

/// `channels.max_inbound_bytes`.
fn resolve_max_inbound(n: Option<u64>) -> Result<usize, ConfigError> {
    Ok(match n {
        None => clawft_channel_core::DEFAULT_MAX_INBOUND_BYTES,
        Some(n) if (1024..=MAX_INBOUND_BYTES_LIMIT).contains(&n) => {
            usize::try_from(n).unwrap_or(clawft_channel_core::DEFAULT_MAX_INBOUND_BYTES)
        }
        Some(n) => {
            return Err(ConfigError::Invalid {
                key: "channels.max_inbound_bytes".into(),
                detail: format!(
                    "expected a number of bytes from 1024 to {MAX_INBOUND_BYTES_LIMIT}, got {n} (the default is {})",
                    clawft_channel_core::DEFAULT_MAX_INBOUND_BYTES
                ),
            })
        }
    })
}

/// `memory`, with the embeddings key (a secret).
fn resolve_memory(
    raw: &crate::memory::settings::MemoryFile,
    config_dir: &Path,
    env: &Env,
    secrets: &mut Vec<Secret>,
) -> Result<crate::memory::settings::MemorySettings, ConfigError> {
    let mut memory = raw.resolve()?;
    if let Some(e) = &memory.embeddings {
        memory.embeddings_key = resolve_secret(
            "memory.embeddings.api_key",
            None,
            e.api_key_env.clone(),
            None,
            config_dir,
            env,
        )?;
        if let Some(k) = &memory.embeddings_key {
            secrets.push(k.clone());
        }
    }
    Ok(memory)
}

/// The file (if any) and the `CLAWFT_…` overrides, merged and deserialised.
fn read_raw(
    file: Option<(&Path, config::FileFormat)>,
    overrides: &config::Map<String, String>,
) -> Result<ConfigFile, config::ConfigError> {
    merged(file, overrides)?.try_deserialize::<ConfigFile>()
}

/// A parse error blamed on where the bad value is: the `CLAWFT_…` variable that sets the key
/// the error names, the overrides when the file alone is fine, else the file.
fn parse_error(
    e: &config::ConfigError,
    file: Option<(&Path, config::FileFormat)>,
    overrides: &config::Map<String, String>,
) -> ConfigError {
    let file_name = file.map_or_else(|| "defaults".to_string(), |(p, _)| p.display().to_string());
    let detail = e.to_string();
    if overrides.is_empty() {
        return ConfigError::Parse {
            source_name: file_name,
            detail,
        };
    }
    if let config::ConfigError::Type { key: Some(key), .. } = e {
        let key = key.to_lowercase();
        if let Some(var) = overrides
            .keys()
            .find(|v| override_key(v).as_deref() == Some(key.as_str()))
        {
            return ConfigError::Parse {
                source_name: format!("environment variable {var}"),
                detail,
            };
        }
    }
    if read_raw(file, &config::Map::new()).is_ok() {
        let vars: Vec<&str> = overrides.keys().map(String::as_str).collect();
        return ConfigError::Parse {
            source_name: format!("the environment overrides ({})", vars.join(", ")),
            detail,
        };
    }
    ConfigError::Parse {
        source_name: file_name,
        detail,
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

/// `tools`, with the default agent's policy layer over the policy of the primary provider.
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
    let browser = t.browser.resolve()?;
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
    let mcp_connect_wait = match t.mcp_connect_wait_secs {
        None => Duration::from_secs(10),
        Some(s) if s <= MAX_MCP_CONNECT_WAIT_SECS => Duration::from_secs(s),
        Some(s) => {
            return Err(ConfigError::Invalid {
                key: "tools.mcp_connect_wait_secs".into(),
                detail: format!(
                    "at most {MAX_MCP_CONNECT_WAIT_SECS} seconds (a turn waits this long for MCP servers still connecting), got {s}; use 0 to never wait"
                ),
            })
        }
    };
    let exec = t.exec.resolve()?;
    let subagents = t.subagents.resolve()?;
    let sessions = t.sessions.resolve()?;
    let mut custom = crate::tools::exec::custom::resolve_all(&t.custom)?;
    for c in &mut custom {
        let Some(vars) = t.custom.get(&c.name).and_then(|f| f.env.clone()) else {
            continue;
        };
        for (k, v) in vars {
            let key = format!("tools.custom.{}.env.{k}", c.name);
            let base = |n: &str| format!("tools.custom.{}.env.{n}", c.name);
            let (name, value) = if let Some(n) = k.strip_suffix("_env") {
                let s = resolve_secret(&base(n), None, Some(v), None, config_dir, env)?;
                (n, s)
            } else if let Some(n) = k.strip_suffix("_file") {
                let s = resolve_secret(&base(n), None, None, Some(v), config_dir, env)?;
                (n, s)
            } else {
                crate::tools::exec::custom::check_env_name(&key, &k)?;
                c.env.push((k.clone(), v));
                continue;
            };
            crate::tools::exec::custom::check_env_name(&key, name)?;
            if let Some(secret) = value {
                c.env.push((name.to_string(), secret.expose().to_string()));
                secrets.push(secret);
            }
        }
    }
    Ok(ToolsConfig {
        sessions,
        custom,
        mcp_connect_wait,
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
        browser,
        web_search,
    })
}

/// Upper bound of `tools.mcp_connect_wait_secs`.
const MAX_MCP_CONNECT_WAIT_SECS: u64 = 300;
