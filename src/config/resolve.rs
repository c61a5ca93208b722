//! File + environment → [`Config`]: paths, providers, chat channels, tools, validation.

use super::{env::*, secrets::*, types::*};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::file::{self, ConfigFile};
use crate::types::session_key::DEFAULT_AGENT;
use crate::types::Secret;

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

/// Largest `channels.max_inbound_bytes` (4 MiB): beyond it one message alone would fill a
/// model's context, and the Slack adapter's WebSocket bound is the same.
const MAX_INBOUND_BYTES_LIMIT: u64 = 4 * 1024 * 1024;

/// The credentials file of the service in `$CLAWFT_HOME` (`weft service install
/// --write-credentials`; read by the unit through `EnvironmentFile=`).
pub const SERVICE_ENV_FILE: &str = "service.env";

/// `$CLAWFT_HOME` or `~/.clawft`.
pub fn clawft_home(env: &Env) -> PathBuf {
    env.get("CLAWFT_HOME")
        .map_or_else(|| env.home().join(".clawft"), PathBuf::from)
}

pub(super) fn expand(path: &str, env: &Env) -> PathBuf {
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
        let provenance = super::provenance::Provenance::new(exists.then_some(path.as_path()), env);
        let locate = provenance.clone();
        Self::resolve(raw, exists.then_some(path), &config_dir, env, provenance)
            .map_err(|e| e.located(&locate))
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
        Self::resolve(
            raw,
            None,
            &clawft_home(env),
            env,
            super::provenance::Provenance::default(),
        )
    }

    fn resolve(
        raw: ConfigFile,
        path: Option<PathBuf>,
        config_dir: &Path,
        env: &Env,
        mut provenance: super::provenance::Provenance,
    ) -> Result<Config, ConfigError> {
        let home = clawft_home(env);
        let mut secrets = Vec::new();
        let tool_timeout = Duration::from_secs(raw.tools.timeout_secs.unwrap_or(120).max(1));
        let local_zone = local_zone(env);
        let mut named_files = raw.agents;
        let defaults = named_files.remove("defaults").unwrap_or_default();
        let mut main_file = match named_files.remove(DEFAULT_AGENT) {
            Some(over) => super::agents::merge_agent(&defaults, over),
            None => defaults.clone(),
        };
        let mut agent_budgets = BTreeMap::new();
        let (main_subagents, main_budgets) = (main_file.subagents.take(), main_file.budgets.take());
        let mcp_names: Vec<String> = raw.tools.mcp_servers.keys().cloned().collect();
        let raw_providers = raw.providers.clone();
        let ResolvedAgent {
            mut agent,
            providers,
            source: provider_source,
            tools: agent_tools,
        } = resolve_agent(
            main_file,
            raw.providers,
            &mcp_names,
            &AgentEnv {
                home: &home,
                default_workspace: "workspace".into(),
                tool_timeout,
                config_dir,
                env,
                local_zone: &local_zone,
            },
            &mut secrets,
            &mut provenance,
        )?;
        agent.subagents = agent_subagents(&raw.tools.subagents, main_subagents, "agents.defaults")?;
        if let Some(b) = main_budgets.filter(|b| !b.is_empty()) {
            b.check("agents.defaults.budgets")?;
            agent_budgets.insert(DEFAULT_AGENT.to_string(), b);
        }
        let mut agents = Vec::new();
        for (name, over) in named_files.clone() {
            let name = &name;
            super::agents::check_agent_name(name)?;
            let rename = |e| super::agents::rename_error(e, name);
            // Not inherited: each agent has its own workspace (its memory and context files)
            // unless it names one.
            let base = super::file::AgentDefaultsFile {
                workspace: None,
                ..defaults.clone()
            };
            let mut merged = super::agents::merge_agent(&base, over);
            let (sub, budgets) = (merged.subagents.take(), merged.budgets.take());
            if let Some(b) = budgets.filter(|b| !b.is_empty()) {
                b.check(&format!("agents.{name}.budgets"))?;
                agent_budgets.insert(name.clone(), b);
            }
            let mut r = resolve_agent(
                merged,
                raw_providers.clone(),
                &mcp_names,
                &AgentEnv {
                    home: &home,
                    default_workspace: format!("workspace-{name}"),
                    tool_timeout,
                    config_dir,
                    env,
                    local_zone: &local_zone,
                },
                &mut Vec::new(),
                &mut super::provenance::Provenance::default(),
            )
            .map_err(rename)?;
            r.agent.subagents =
                agent_subagents(&raw.tools.subagents, sub, &format!("agents.{name}"))?;
            let layer = r
                .tools
                .as_ref()
                .map(|a| a.resolve(&format!("agents.{name}.tools")))
                .transpose()?
                .unwrap_or_default();
            let policy = raw
                .tools
                .policy
                .resolve(r.providers.first().map(|p| p.name.as_str()), &layer)?;
            agents.push(super::agents::NamedAgent {
                name: name.clone(),
                agent: r.agent,
                providers: r.providers,
                policy,
            });
        }
        let bindings = super::agents::Bindings::resolve(raw.bindings, &named_files)?;
        let hooks = {
            let names: Vec<&str> = std::iter::once(DEFAULT_AGENT)
                .chain(agents.iter().map(|a| a.name.as_str()))
                .collect();
            super::hooks::resolve(raw.hooks, &names, config_dir, env, &mut secrets)?
        };
        let media = super::media::resolve(raw.media, config_dir, env, &mut secrets)?;

        let http = resolve_http(raw.channels.http, config_dir, env, &mut secrets)?;

        let store = resolve_store(raw.store, &home, env)?;
        let sessions = resolve_sessions(&raw.sessions);
        let max_inbound_bytes = resolve_max_inbound(raw.channels.max_inbound_bytes)?;
        let mut chat_channels = resolve_chat_channels(
            vec![
                (Platform::Telegram, raw.channels.telegram),
                (Platform::Discord, raw.channels.discord),
                (Platform::Slack, raw.channels.slack),
                (Platform::WhatsApp, raw.channels.whatsapp),
                (Platform::Matrix, raw.channels.matrix),
                (Platform::Signal, raw.channels.signal),
            ],
            config_dir,
            env,
            &mut secrets,
        )?;
        // WhatsApp's webhooks arrive on the HTTP listener.
        if let Some(w) = chat_channels
            .iter()
            .find(|c| c.platform == Platform::WhatsApp && !http.enabled)
        {
            return Err(ConfigError::Invalid {
                key: w.config_key("enabled"),
                detail: "WhatsApp delivers messages as webhooks to the HTTP listener, and channels.http.enabled is false: enable the HTTP API (behind a reverse proxy for Meta) or disable this channel".into(),
            });
        }
        chat_channels.extend(super::email::resolve(
            raw.channels.email,
            config_dir,
            env,
            &mut secrets,
        )?);
        let mut tools = resolve_tools(
            raw.tools,
            agent_tools.as_ref(),
            providers.first().map(|p| p.name.as_str()),
            config_dir,
            env,
            &mut secrets,
        )?;
        let custom: Vec<String> = tools.custom.iter().map(|c| c.name.clone()).collect();
        tools.policy.expand_custom(&custom);
        crate::tools::policy::expand_custom_in(&mut tools.subagents.deny, &custom);
        for a in &mut agents {
            a.policy.expand_custom(&custom);
            if let Some(s) = &mut a.agent.subagents {
                crate::tools::policy::expand_custom_in(&mut s.deny, &custom);
            }
        }
        if let Some(s) = &mut agent.subagents {
            crate::tools::policy::expand_custom_in(&mut s.deny, &custom);
        }
        let memory = resolve_memory(&raw.memory, config_dir, env, &mut secrets)?;
        let cluster = raw
            .cluster
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
            usage: super::usage::UsageConfig {
                agents: agent_budgets,
                ..super::usage::resolve_usage(&raw.prices, &raw.budgets)?
            },
            memory,
            scheduler: raw.scheduler.resolve()?,
            heartbeat: raw.heartbeat.resolve()?,
            node: super::file::NodeFile {
                workspace: raw
                    .node
                    .workspace
                    .as_deref()
                    .map(|w| expand(w, env).display().to_string()),
                gateway_ca: raw
                    .node
                    .gateway_ca
                    .as_deref()
                    .map(|w| expand(w, env).display().to_string()),
                ..raw.node.clone()
            },
            cluster,
            provenance,
            deferred_secrets: env.take_deferred(),
        })
    }
}

/// `[cluster]`: the NATS servers, this node, its credentials (secrets by indirection).
fn resolve_cluster(
    c: &crate::cluster::settings::ClusterFile,
    config_dir: &Path,
    env: &Env,
    secrets: &mut Vec<Secret>,
) -> Result<crate::cluster::settings::ClusterSettings, ConfigError> {
    let password = super::secrets::resolve_service_secret(
        "cluster.password",
        c.password.clone(),
        c.password_env.clone(),
        c.password_file.clone(),
        config_dir,
        env,
    )?;
    let token = super::secrets::resolve_service_secret(
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
    h: file::HttpFile,
    config_dir: &Path,
    env: &Env,
    secrets: &mut Vec<crate::types::Secret>,
) -> Result<HttpChannelConfig, ConfigError> {
    let bind_text = h.bind.as_deref().unwrap_or(DEFAULT_HTTP_BIND);
    let bind: SocketAddr = bind_text.parse().map_err(|_| ConfigError::Invalid {
        key: "channels.http.bind".into(),
        detail: format!("expected an address like 127.0.0.1:18790, got `{bind_text}`"),
    })?;
    let token = super::secrets::resolve_service_secret(
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
    secrets: &mut Vec<crate::types::Secret>,
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

/// What resolving an agent needs beside its section.
struct AgentEnv<'a> {
    home: &'a Path,
    /// The workspace's directory beneath `home` when the section sets none.
    default_workspace: String,
    tool_timeout: Duration,
    config_dir: &'a Path,
    env: &'a Env,
    /// The system's zone, the default of `timezone`.
    local_zone: &'a crate::config::types::TimeZone,
}

/// The system's time zone: `TZ` (a zone name), else the zone `/etc/localtime` links to, else
/// UTC (a zone that cannot be read is UTC too, with a warning).
fn local_zone(env: &Env) -> crate::config::types::TimeZone {
    use crate::config::types::TimeZone;
    let name = env
        .get("TZ")
        .map(|t| t.trim_start_matches(':').to_string())
        .filter(|t| !t.is_empty())
        .or_else(|| {
            let target = std::fs::read_link("/etc/localtime").ok()?;
            let s = target.to_string_lossy().into_owned();
            s.split_once("zoneinfo/").map(|(_, n)| n.to_string())
        });
    match name {
        None => TimeZone::default(),
        Some(name) => match crate::types::tz::Zone::load(&name) {
            Ok(zone) => TimeZone {
                name,
                zone: std::sync::Arc::new(zone),
            },
            Err(e) => {
                tracing::warn!(zone = %name, error = %e, "the system's time zone cannot be read; messages are timed in UTC (set agents.defaults.timezone)");
                TimeZone::default()
            }
        },
    }
}

/// One agent resolved: behaviour, providers, and its raw tool policy layer.
struct ResolvedAgent {
    agent: AgentConfig,
    providers: Vec<ProviderConfig>,
    source: ProviderSource,
    tools: Option<crate::tools::policy::PolicyLayerFile>,
}

/// An agent section (`agents.defaults`, or `agents.NAME` over it): its behaviour, its
/// providers in fallback order, the models `/model` may choose, and its MCP grants (servers
/// left out become denied `group:mcp:NAME` patterns of its tool layer).
fn resolve_agent(
    d: super::file::AgentDefaultsFile,
    raw_providers: BTreeMap<String, file::ProviderFile>,
    mcp_names: &[String],
    e: &AgentEnv<'_>,
    secrets: &mut Vec<Secret>,
    provenance: &mut super::provenance::Provenance,
) -> Result<ResolvedAgent, ConfigError> {
    let mut d = d;
    let mut agent_tools = d.tools.take();
    let max_tool_iterations = match d.max_tool_iterations {
        None => DEFAULT_MAX_TOOL_ITERATIONS,
        Some(n) => u32::try_from(n.clamp(1, 10_000)).unwrap_or(DEFAULT_MAX_TOOL_ITERATIONS),
    };
    let in_range = |key: &str, v: Option<i64>, default: u32, lo: u32, hi: u32| match v {
        None => Ok(default),
        Some(n) => u32::try_from(n)
            .ok()
            .filter(|n| (lo..=hi).contains(n))
            .ok_or_else(|| ConfigError::Invalid {
                key: format!("agents.defaults.{key}"),
                detail: format!("expected a whole number from {lo} to {hi}, got {n}"),
            }),
    };
    let loop_repeat_limit = in_range(
        "loop_repeat_limit",
        d.loop_repeat_limit,
        DEFAULT_LOOP_REPEAT_LIMIT,
        2,
        100,
    )?;
    let max_tool_calls_per_turn = in_range(
        "max_tool_calls_per_turn",
        d.max_tool_calls_per_turn,
        DEFAULT_MAX_TOOL_CALLS_PER_TURN,
        1,
        10_000,
    )?;
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
        .map_or_else(|| e.home.join(&e.default_workspace), |w| expand(w, e.env));
    let window_override = d.context_window;
    let compaction = d.compaction.take().unwrap_or_default();
    let mut agent = AgentConfig {
        workspace,
        max_tool_iterations,
        system_prompt: d.system_prompt,
        max_tokens: d.max_tokens,
        temperature: d.temperature,
        stream: d.stream.unwrap_or(true),
        tool_timeout: e.tool_timeout,
        window: crate::config::types::WindowSettings::default(),
        loop_repeat_limit,
        max_tool_calls_per_turn,
        models: Vec::new(),
        subagents: None,
        vision: match d.vision.as_deref().map(str::trim) {
            None | Some("auto") => crate::config::types::Vision::Auto,
            Some("on") => crate::config::types::Vision::On,
            Some("off") => crate::config::types::Vision::Off,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    key: "agents.defaults.vision".into(),
                    detail: format!("expected \"auto\", \"on\" or \"off\", got \"{other}\""),
                })
            }
        },
        model_sees_images: false,
        timezone: match d.timezone.as_deref().map(str::trim) {
            None => e.local_zone.clone(),
            Some(name) => crate::config::types::TimeZone {
                name: name.to_string(),
                zone: std::sync::Arc::new(crate::types::tz::Zone::load(name).map_err(
                    |detail| ConfigError::Invalid {
                        key: "agents.defaults.timezone".into(),
                        detail: detail.to_string(),
                    },
                )?),
            },
        },
        nodes: d.nodes.clone(),
        reply_with_voice: match d.reply_with_voice.as_deref() {
            None => crate::types::VoiceReplies::default(),
            Some(v) => {
                crate::types::VoiceReplies::parse(v).ok_or_else(|| ConfigError::Invalid {
                    key: "agents.defaults.reply_with_voice".into(),
                    detail: format!(
                        "expected \"never\", \"when_asked\" or \"to_voice\", got \"{v}\""
                    ),
                })?
            }
        },
    };

    let (providers, source) = resolve_providers(
        raw_providers,
        d.provider.as_deref(),
        d.fallback.as_deref(),
        d.model.as_deref(),
        e.config_dir,
        e.env,
        secrets,
        provenance,
    )?;
    agent.window = resolve_window(window_override, compaction, &providers)?;
    agent.model_sees_images = providers
        .first()
        .is_some_and(|p| crate::llm::models::supports_vision(&p.model));
    agent.models = agent_models(&providers, d.models.unwrap_or_default());
    if let Some(granted) = d.mcp_servers {
        for g in &granted {
            if !mcp_names.contains(g) {
                return Err(ConfigError::Invalid {
                    key: "agents.defaults.mcp_servers".into(),
                    detail: format!(
                        "no MCP server named `{g}`; configured: {}",
                        mcp_names.join(", ")
                    ),
                });
            }
        }
        let layer = agent_tools.get_or_insert_with(Default::default);
        let deny = layer.deny.get_or_insert_with(Vec::new);
        for n in mcp_names.iter().filter(|n| !granted.contains(n)) {
            deny.push(format!("group:mcp:{n}"));
        }
    }
    Ok(ResolvedAgent {
        agent,
        providers,
        source,
        tools: agent_tools,
    })
}

/// An agent's own subagent limits: its `subagents` over `tools.subagents`, key by key; `None`
/// when it sets none.
fn agent_subagents(
    global: &super::subagents::SubagentsFile,
    own: Option<super::subagents::SubagentsFile>,
    key: &str,
) -> Result<Option<super::subagents::SubagentSettings>, ConfigError> {
    let Some(own) = own else {
        return Ok(None);
    };
    let mut merged = global.clone();
    super::agents::merge_subagents(&mut merged, own);
    merged
        .resolve()
        .map(Some)
        .map_err(|e| ConfigError::Invalid {
            key: e
                .key
                .replacen("tools.subagents", &format!("{key}.subagents"), 1),
            detail: e.detail,
        })
}

/// The models `/model` may choose: the primary provider's model, then `models` (deduplicated).
fn agent_models(providers: &[ProviderConfig], extra: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = providers
        .first()
        .map(|p| p.model.clone())
        .into_iter()
        .collect();
    for m in extra {
        let m = m.trim().to_string();
        if !m.is_empty() && !out.contains(&m) {
            out.push(m);
        }
    }
    out
}

/// The `CLAWFT_<SECTION>__<KEY>` variables of `env` (the config overrides).
pub(super) fn env_overrides(env: &Env) -> config::Map<String, String> {
    env.0
        .iter()
        .filter(|(k, _)| k.starts_with("CLAWFT_") && k.contains("__"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The file (if any) and the `CLAWFT_…` overrides, merged and deserialised.
fn read_raw(
    file: Option<(&Path, config::FileFormat)>,
    overrides: &config::Map<String, String>,
) -> Result<ConfigFile, config::ConfigError> {
    merged(file, overrides)?.try_deserialize::<ConfigFile>()
}

/// The file (if any) and the `CLAWFT_…` overrides, merged as untyped values.
pub(super) fn merged(
    file: Option<(&Path, config::FileFormat)>,
    overrides: &config::Map<String, String>,
) -> Result<config::Config, config::ConfigError> {
    let mut builder = config::Config::builder();
    if let Some((path, format)) = file {
        builder = builder.add_source(config::File::from(path).format(format));
    }
    if !overrides.is_empty() {
        builder = builder.add_source(
            config::Environment::with_prefix("CLAWFT")
                .prefix_separator("_")
                .separator("__")
                .try_parsing(true)
                .source(Some(overrides.clone())),
        );
    }
    builder.build()
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
            .find(|v| super::provenance::override_key(v).as_deref() == Some(key.as_str()))
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

/// The chat channels' sections (`channels.<platform>`, each platform once), resolved into
/// their bot accounts.
pub(super) fn resolve_chat_channels(
    sections: Vec<(Platform, Option<file::ChatChannelFile>)>,
    config_dir: &Path,
    env: &Env,
    secrets: &mut Vec<Secret>,
) -> Result<Vec<ChatChannelConfig>, ConfigError> {
    let mut out = Vec::new();
    for (platform, f) in sections {
        let Some(mut f) = f else { continue };
        if !f.enabled.unwrap_or(true) {
            continue;
        }
        let accounts = std::mem::take(&mut f.accounts);
        let mut bots: Vec<ChatChannelConfig> = Vec::new();
        // The section itself is the account `default` when it has a token (or nothing else
        // could run: then its missing token is the error).
        if f.token.is_some()
            || f.token_env.is_some()
            || f.token_file.is_some()
            || f.number.is_some()
            || accounts.is_empty()
        {
            bots.push(resolve_account(
                platform,
                None,
                f.clone(),
                config_dir,
                env,
                secrets,
            )?);
        }
        for (name, acc) in accounts {
            let key = channel_key(platform, None, &format!("accounts.{name}"));
            check_account_name(&name).map_err(|detail| ConfigError::Invalid {
                key: key.clone(),
                detail,
            })?;
            if !acc.accounts.is_empty() {
                return Err(ConfigError::Invalid {
                    key: format!("{key}.accounts"),
                    detail: format!(
                        "accounts do not nest: put every bot directly under channels.{}.accounts",
                        platform.name()
                    ),
                });
            }
            if !acc.enabled.unwrap_or(true) {
                continue;
            }
            let merged = inherit(acc, &f);
            bots.push(resolve_account(
                platform,
                Some(&name),
                merged,
                config_dir,
                env,
                secrets,
            )?);
        }
        check_distinct_tokens(&bots)?;
        out.extend(bots);
    }
    Ok(out)
}

/// Whether `name` can name a bot account: it becomes part of the channel id
/// (`telegram.NAME`), of session keys and of store keys.
pub(super) fn check_account_name(name: &str) -> Result<(), String> {
    let ok = (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if name == DEFAULT_ACCOUNT {
        return Err("`default` is the name of the platform's own section (its token and settings directly under channels.<platform>): give this account another name".into());
    }
    if ok {
        return Ok(());
    }
    Err(format!(
        "{name:?} is not an account name: use 1 to 32 of a-z, 0-9, `_` and `-` (it becomes part of the channel id, e.g. telegram.work)"
    ))
}

/// Account `acc` with every key it does not set taken from its platform's section `top`,
/// except the tokens: each account is its own bot.
fn inherit(acc: file::ChatChannelFile, top: &file::ChatChannelFile) -> file::ChatChannelFile {
    let t = top.clone();
    file::ChatChannelFile {
        enabled: acc.enabled,
        token: acc.token,
        token_env: acc.token_env,
        token_file: acc.token_file,
        app_token: acc.app_token,
        app_token_env: acc.app_token_env,
        app_token_file: acc.app_token_file,
        // Each Signal account is its own number.
        number: acc.number,
        allow_from: acc.allow_from.or(t.allow_from),
        pairing: acc.pairing.or(t.pairing),
        group_mode: acc.group_mode.or(t.group_mode),
        group_sessions: acc.group_sessions.or(t.group_sessions),
        api_url: acc.api_url.or(t.api_url),
        // `proxy` is the old name of `api_base_url`: an account setting either replaces both.
        api_base_url: acc.api_base_url.clone().or(if acc.proxy.is_some() {
            None
        } else {
            t.api_base_url
        }),
        proxy: acc.proxy.clone().or(if acc.api_base_url.is_some() {
            None
        } else {
            t.proxy
        }),
        gateway_url: acc.gateway_url.or(t.gateway_url),
        stream_edits: acc.stream_edits.or(t.stream_edits),
        edit_interval_ms: acc.edit_interval_ms.or(t.edit_interval_ms),
        max_chats_in_flight: acc.max_chats_in_flight.or(t.max_chats_in_flight),
        // WhatsApp: each account is its own phone number; one app (secret, verify token,
        // template) may serve several.
        phone_number_id: acc.phone_number_id,
        app_secret: acc.app_secret.or(t.app_secret),
        app_secret_env: acc.app_secret_env.or(t.app_secret_env),
        app_secret_file: acc.app_secret_file.or(t.app_secret_file),
        verify_token: acc.verify_token.or(t.verify_token),
        verify_token_env: acc.verify_token_env.or(t.verify_token_env),
        verify_token_file: acc.verify_token_file.or(t.verify_token_file),
        api_version: acc.api_version.or(t.api_version),
        template: acc.template.or(t.template),
        template_language: acc.template_language.or(t.template_language),
        homeserver: acc.homeserver.or(t.homeserver),
        // Each account is its own bot user.
        user_id: acc.user_id,
        accounts: BTreeMap::new(),
    }
}

/// Two accounts of one platform with the same bot token (or Slack app token) would be one bot
/// run twice: Telegram hands each update to one poller only, Slack splits the events between
/// the connections.
fn check_distinct_tokens(bots: &[ChatChannelConfig]) -> Result<(), ConfigError> {
    for (i, b) in bots.iter().enumerate() {
        for a in &bots[..i] {
            if let (Some(x), Some(y)) = (&a.whatsapp, &b.whatsapp) {
                // One access token may serve several numbers: the number is the bot.
                if x.phone_number_id == y.phone_number_id {
                    return Err(ConfigError::Invalid {
                        key: b.config_key("phone_number_id"),
                        detail: format!(
                            "`{}` is the same phone number id: each account is its own number",
                            a.config_key("phone_number_id")
                        ),
                    });
                }
                continue;
            }
            let same_app = matches!((&a.app_token, &b.app_token), (Some(x), Some(y)) if x.expose() == y.expose());
            let same_number = a.number.is_some() && a.number == b.number;
            let what = if same_number {
                "number"
            } else if !b.token.expose().is_empty() && a.token.expose() == b.token.expose() {
                "token"
            } else if same_app {
                "app_token"
            } else {
                continue;
            };
            return Err(ConfigError::Invalid {
                key: b.config_key(what),
                detail: format!(
                    "`{}` and `{}` are the same {what}: each account is its own bot and needs its own token (remove one of them, or give it its bot's token)",
                    a.config_key(what),
                    b.config_key(what)
                ),
            });
        }
    }
    Ok(())
}

/// One bot account: `channels.<platform>` (`account` `None`) or
/// `channels.<platform>.accounts.<account>` with its inherited keys already filled in.
fn resolve_account(
    platform: Platform,
    account: Option<&str>,
    f: file::ChatChannelFile,
    config_dir: &Path,
    env: &Env,
    secrets: &mut Vec<Secret>,
) -> Result<ChatChannelConfig, ConfigError> {
    {
        let name = platform.name();
        let key = |k: &str| channel_key(platform, account, k);
        let whatsapp = resolve_whatsapp(platform, account, &f, config_dir, env, secrets)?;
        let (homeserver, user_id) = check_matrix_keys(platform, &key, &f)?;
        // Matrix calls it an access token (`access_token_env`, read into the same keys).
        let token_key = if platform == Platform::Matrix {
            "access_token"
        } else {
            "token"
        };
        let token = super::secrets::resolve_service_secret(
            &key(token_key),
            f.token,
            f.token_env,
            f.token_file,
            config_dir,
            env,
        )?;
        let token = match (platform, token) {
            // signal-cli's HTTP daemon has no credentials: the account is `number`.
            (Platform::Signal, Some(_)) => {
                return Err(ConfigError::Invalid {
                    key: key("token"),
                    detail: "the signal channel takes no token: signal-cli holds the account's keys; set `number` to the account and `api_url` to the daemon (`signal-cli -a +NUMBER daemon --http 127.0.0.1:8080`)".into(),
                })
            }
            (Platform::Signal, None) => Secret::new(String::new()),
            (_, Some(t)) => t,
            (_, None) => {
                return Err(ConfigError::Invalid {
                    key: key(token_key),
                    detail: match account {
                        None if platform == Platform::Matrix => "the matrix channel is enabled but has no access token: set access_token_env or access_token_file to the bot account's access token (Element: Settings → Help & About → Access Token, or a login of the bot account), or enabled = false".into(),
                        None => format!("the {name} channel is enabled but has no bot token: set token_env or token_file (or enabled = false), or give each bot a section channels.{name}.accounts.NAME with its token"),
                        Some(a) => format!("the {name} account {a} has no bot token: each account is its own bot and needs its own token (token_env or token_file; it is not inherited from channels.{name}), or set enabled = false"),
                    },
                })
            }
        };
        if !token.expose().is_empty() {
            secrets.push(token.clone());
        }
        let number = match (platform, f.number) {
            (Platform::Signal, Some(n)) if is_e164(n.trim()) => Some(n.trim().to_string()),
            (Platform::Signal, Some(n)) => {
                return Err(ConfigError::Invalid {
                    key: key("number"),
                    detail: format!("`{n}` is not a phone number in international format: write the account signal-cli runs as + and the country code and number, like \"+15551234567\""),
                })
            }
            (Platform::Signal, None) => {
                return Err(ConfigError::Invalid {
                    key: key("number"),
                    detail: "the signal channel needs the account's number (`number = \"+15551234567\"`), registered or linked in signal-cli first (see the Signal section of the channels guide)".into(),
                })
            }
            (_, Some(_)) => {
                return Err(ConfigError::Invalid {
                    key: key("number"),
                    detail: format!("only the signal channel takes a number, not {name}"),
                })
            }
            (_, None) => None,
        };
        if platform == Platform::Signal && f.stream_edits == Some(true) {
            return Err(ConfigError::Invalid {
                key: key("stream_edits"),
                detail: "Signal replies are sent whole: a Signal edit reaches every device as a new message and clients accept only a few edits of one message, so the signal channel does not stream".into(),
            });
        }
        let app_token = super::secrets::resolve_service_secret(
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
            (
                Platform::Telegram | Platform::Discord | Platform::WhatsApp | Platform::Matrix | Platform::Signal,
                Some(_),
            ) => {
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
        for (k, v) in [
            ("proxy", &f.proxy),
            ("api_base_url", &f.api_base_url),
            ("gateway_url", &f.gateway_url),
        ] {
            if v.is_some() && platform != Platform::Discord {
                return Err(ConfigError::Invalid {
                    key: key(k),
                    detail: format!("only the discord channel takes {k}; {name} takes api_url"),
                });
            }
        }
        if f.api_url.is_some() && platform == Platform::Discord {
            return Err(ConfigError::Invalid {
                key: key("api_url"),
                detail: "the discord channel takes `api_base_url` (the base URL of its REST API) and `gateway_url`, not api_url".into(),
            });
        }
        let api_base_url = match (f.api_base_url, f.proxy) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::Invalid {
                    key: key("proxy"),
                    detail: "`proxy` is the old name of `api_base_url`: remove it".into(),
                })
            }
            (Some(u), None) => Some(u),
            (None, Some(u)) => {
                tracing::warn!(
                    channel = name,
                    "channels.{name}.proxy is deprecated: it is the base URL of Discord's REST API, not an HTTP proxy; rename it to api_base_url"
                );
                Some(u)
            }
            (None, None) => None,
        };
        if let Some(u) = &f.gateway_url {
            if !(u.starts_with("ws://") || u.starts_with("wss://")) {
                return Err(ConfigError::Invalid {
                    key: key("gateway_url"),
                    detail: format!("expected a ws:// or wss:// URL, got `{u}`"),
                });
            }
        }
        for (k, v) in [("api_url", &f.api_url), ("api_base_url", &api_base_url)] {
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
        for id in &allow_from {
            check_user_id(platform, id).map_err(|detail| ConfigError::Invalid {
                key: key("allow_from"),
                detail,
            })?;
        }
        let pairing = f.pairing.unwrap_or(false);
        if allow_from.is_empty() && !pairing {
            let k = key("allow_from");
            tracing::warn!(
                channel = name,
                account = account.unwrap_or(DEFAULT_ACCOUNT),
                "{k} is empty and pairing is off: nobody can talk to this bot"
            );
        }
        Ok(ChatChannelConfig {
            platform,
            account: account.map(str::to_string),
            token,
            app_token,
            number,
            allow_from,
            pairing,
            group_all,
            per_user_sessions,
            api_url: f.api_url,
            api_base_url,
            gateway_url: f.gateway_url,
            stream_edits: f.stream_edits.unwrap_or(true),
            edit_interval: Duration::from_millis(f.edit_interval_ms.unwrap_or(1500).max(200)),
            max_chats_in_flight: match f.max_chats_in_flight {
                None => DEFAULT_MAX_CHATS_IN_FLIGHT,
                Some(0) => {
                    return Err(ConfigError::Invalid {
                        key: key("max_chats_in_flight"),
                        detail: "must be at least 1 (1 sends one chat at a time; default 8)".into(),
                    })
                }
                Some(n) => n,
            },
            whatsapp,
            homeserver,
            user_id,
            email: None,
        })
    }
}

/// `channels.whatsapp`'s own keys (refused on the other platforms).
fn resolve_whatsapp(
    platform: Platform,
    account: Option<&str>,
    f: &file::ChatChannelFile,
    config_dir: &Path,
    env: &Env,
    secrets: &mut Vec<Secret>,
) -> Result<Option<super::types::WhatsAppSettings>, ConfigError> {
    let key = |k: &str| channel_key(platform, account, k);
    if platform != Platform::WhatsApp {
        for (k, set) in [
            ("phone_number_id", f.phone_number_id.is_some()),
            (
                "app_secret",
                f.app_secret.is_some() || f.app_secret_env.is_some() || f.app_secret_file.is_some(),
            ),
            (
                "verify_token",
                f.verify_token.is_some()
                    || f.verify_token_env.is_some()
                    || f.verify_token_file.is_some(),
            ),
            ("api_version", f.api_version.is_some()),
            ("template", f.template.is_some()),
            ("template_language", f.template_language.is_some()),
        ] {
            if set {
                return Err(ConfigError::Invalid {
                    key: key(k),
                    detail: format!("only the whatsapp channel takes {k}"),
                });
            }
        }
        return Ok(None);
    }
    let phone_number_id = f.phone_number_id.clone().unwrap_or_default();
    if phone_number_id.is_empty() || !phone_number_id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ConfigError::Invalid {
            key: key("phone_number_id"),
            detail: format!(
                "expected the phone number's id (digits, WhatsApp Manager → API Setup → \"Phone number ID\"), not the phone number itself; got `{phone_number_id}`"
            ),
        });
    }
    let app_secret = super::secrets::resolve_service_secret(
        &key("app_secret"),
        f.app_secret.clone(),
        f.app_secret_env.clone(),
        f.app_secret_file.clone(),
        config_dir,
        env,
    )?
    .ok_or_else(|| ConfigError::Invalid {
        key: key("app_secret"),
        detail: "webhooks are verified with the app secret (Meta app → App settings → Basic): set app_secret_env or app_secret_file".into(),
    })?;
    let verify_token = super::secrets::resolve_service_secret(
        &key("verify_token"),
        f.verify_token.clone(),
        f.verify_token_env.clone(),
        f.verify_token_file.clone(),
        config_dir,
        env,
    )?
    .ok_or_else(|| ConfigError::Invalid {
        key: key("verify_token"),
        detail: "Meta's webhook handshake needs a verify token (any random string you also enter in the app's Webhooks settings): set verify_token_env or verify_token_file".into(),
    })?;
    secrets.push(app_secret.clone());
    secrets.push(verify_token.clone());
    let api_version = f.api_version.clone().unwrap_or_else(|| "v21.0".into());
    let v = api_version.strip_prefix('v').unwrap_or("");
    if v.split('.').count() != 2
        || !v
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(ConfigError::Invalid {
            key: key("api_version"),
            detail: format!("expected a Graph API version like \"v21.0\", got `{api_version}`"),
        });
    }
    let template = match &f.template {
        None => {
            if f.template_language.is_some() {
                return Err(ConfigError::Invalid {
                    key: key("template_language"),
                    detail: "template_language is the language of `template`, which is not set"
                        .into(),
                });
            }
            None
        }
        Some(t) => {
            if t.is_empty()
                || !t
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            {
                return Err(ConfigError::Invalid {
                    key: key("template"),
                    detail: format!("template names are lower-case letters, digits and `_` (as approved in WhatsApp Manager), got `{t}`"),
                });
            }
            Some((
                t.clone(),
                f.template_language
                    .clone()
                    .unwrap_or_else(|| "en_US".into()),
            ))
        }
    };
    Ok(Some(super::types::WhatsAppSettings {
        phone_number_id,
        app_secret,
        verify_token,
        api_version,
        template,
    }))
}

/// Matrix's own keys: `homeserver` (required, an http(s) URL) and `user_id` (a Matrix user
/// id); on any other platform they are an error.
fn check_matrix_keys(
    platform: Platform,
    key: &dyn Fn(&str) -> String,
    f: &file::ChatChannelFile,
) -> Result<(Option<String>, Option<String>), ConfigError> {
    if platform != Platform::Matrix {
        for (k, v) in [("homeserver", &f.homeserver), ("user_id", &f.user_id)] {
            if v.is_some() {
                return Err(ConfigError::Invalid {
                    key: key(k),
                    detail: format!("only the matrix channel takes {k}"),
                });
            }
        }
        return Ok((None, None));
    }
    if f.api_url.is_some() {
        return Err(ConfigError::Invalid {
            key: key("api_url"),
            detail:
                "the matrix channel takes `homeserver` (the homeserver's base URL), not api_url"
                    .into(),
        });
    }
    let hs = f.homeserver.clone().ok_or_else(|| ConfigError::Invalid {
        key: key("homeserver"),
        detail: "the matrix channel needs the homeserver's base URL, e.g. homeserver = \"https://matrix.example.org\"".into(),
    })?;
    if !(hs.starts_with("http://") || hs.starts_with("https://")) {
        return Err(ConfigError::Invalid {
            key: key("homeserver"),
            detail: format!(
                "expected an http:// or https:// URL like https://matrix.example.org, got `{hs}`"
            ),
        });
    }
    if let Some(u) = &f.user_id {
        check_user_id(Platform::Matrix, u).map_err(|detail| ConfigError::Invalid {
            key: key("user_id"),
            detail,
        })?;
    }
    Ok((Some(hs), f.user_id.clone()))
}

/// Whether `id` can ever match a sender on `platform` (ingress compares the platform's user
/// id, never a name): `Err` says why not and how to find the id.
pub(super) fn check_user_id(platform: Platform, id: &str) -> Result<(), String> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let how = "or set `pairing = true` and admit the sender with `weft pairing approve CODE` (`weft pairing list` shows their id)";
    let ok = match platform {
        // User ids are positive; negative numbers are group and channel chat ids.
        Platform::Telegram => digits(id) && id.len() <= 16 && !id.starts_with('0'),
        // Snowflakes: unsigned 64-bit numbers.
        Platform::Discord => digits(id) && id.parse::<u64>().is_ok(),
        // Member ids: U… (or W… on Enterprise Grid), upper-case letters and digits.
        Platform::Email => super::email::is_address(id),
        Platform::Slack => {
            id.len() >= 3
                && (id.starts_with('U') || id.starts_with('W'))
                && id
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
        }
        // wa_id: the number in international format, digits only (no `+`).
        Platform::WhatsApp => digits(id) && (7..=15).contains(&id.len()) && !id.starts_with('0'),
        // `@localpart:server`.
        Platform::Matrix => id.strip_prefix('@').is_some_and(|rest| {
            rest.split_once(':').is_some_and(|(l, s)| {
                !l.is_empty() && !s.is_empty() && !rest.contains(char::is_whitespace)
            })
        }),
        // A phone number (what a sender with one is known by) or an ACI (a UUID).
        Platform::Signal => is_e164(id) || is_uuid(id),
    };
    if ok {
        return Ok(());
    }
    Err(match platform {
        Platform::Telegram if id.starts_with('-') => format!(
            "`{id}` is a Telegram group or channel id; allow_from lists the user ids of the people who may talk to the bot (positive numbers like 123456789): ask @userinfobot for yours, {how}"
        ),
        Platform::Telegram => format!(
            "`{id}` is not a Telegram user id: user ids are positive numbers like 123456789, not @usernames (which can change hands); ask @userinfobot for yours, {how}"
        ),
        Platform::Discord => format!(
            "`{id}` is not a Discord user id: user ids are numbers (snowflakes) like \"123456789012345678\", not names; in Discord turn on Developer Mode and use Copy User ID on the user, {how}"
        ),
        Platform::WhatsApp => format!(
            "`{id}` is not a WhatsApp id: WhatsApp ids are phone numbers in international format, digits only, without `+`, spaces or a leading 0, like \"4915112345678\", {how}"
        ),
        Platform::Matrix => format!(
            "`{id}` is not a Matrix user id: user ids look like \"@alice:example.org\" (in Element: your name at the top left shows it), not display names, {how}"
        ),
        Platform::Signal => format!(
            "`{id}` is not a Signal sender: write phone numbers in international format like \"+15551234567\" (or a user's ACI, a UUID, for someone without a visible number), {how}"
        ),
        Platform::Email => format!(
            "`{id}` is not a mail address: allow_from lists addresses like alice@example.org, {how}"
        ),
        Platform::Slack => format!(
            "`{id}` is not a Slack user id: member ids look like \"U0123ABCD\" (or W… on Enterprise Grid), not @names or emails; open the profile, ⋮ → Copy member ID, {how}"
        ),
    })
}

/// Whether `s` is an E.164 phone number: `+` and 7 to 15 digits, the first not 0.
fn is_e164(s: &str) -> bool {
    s.strip_prefix('+').is_some_and(|d| {
        (7..=15).contains(&d.len()) && d.bytes().all(|b| b.is_ascii_digit()) && !d.starts_with('0')
    })
}

/// Whether `s` is a UUID (a Signal ACI).
fn is_uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

pub(super) fn resolve_tools(
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
                let s =
                    super::secrets::resolve_secret(&base(n), None, Some(v), None, config_dir, env)?;
                (n, s)
            } else if let Some(n) = k.strip_suffix("_file") {
                let s =
                    super::secrets::resolve_secret(&base(n), None, None, Some(v), config_dir, env)?;
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

pub(super) fn default_model(name: &str, kind: ProviderKind) -> &'static str {
    match (name, kind) {
        (_, ProviderKind::Anthropic) => "claude-sonnet-4-5",
        ("openrouter", _) => "openai/gpt-4o-mini",
        ("ollama" | "local", _) => "llama3.2",
        _ => "gpt-4o-mini",
    }
}

pub(super) fn default_base_url(name: &str, kind: ProviderKind) -> &'static str {
    match (name, kind) {
        (_, ProviderKind::Anthropic) => "https://api.anthropic.com",
        ("openrouter", _) => "https://openrouter.ai/api/v1",
        ("ollama" | "local", _) => LOCAL_DEFAULT_BASE_URL,
        _ => "https://api.openai.com/v1",
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn provider(
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

#[allow(clippy::too_many_arguments)]
pub(super) fn resolve_providers(
    raw: BTreeMap<String, file::ProviderFile>,
    first: Option<&str>,
    fallback: Option<&[String]>,
    model_override: Option<&str>,
    config_dir: &Path,
    env: &Env,
    secrets: &mut Vec<Secret>,
    provenance: &mut super::provenance::Provenance,
) -> Result<(Vec<ProviderConfig>, ProviderSource), ConfigError> {
    use super::provenance::Origin;
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
                let var = |v: &str| Origin::Env {
                    var: v.to_string(),
                    via: None,
                };
                provenance.set(format!("providers.{name}.api_key"), var(key_var));
                if let (Some(b), Some(_)) = (base_var, &base) {
                    provenance.set(format!("providers.{name}.base_url"), var(b));
                }
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
        if base.is_some() {
            provenance.set(
                "providers.local.base_url",
                Origin::Env {
                    var: "OPENAI_BASE_URL".into(),
                    via: None,
                },
            );
        }
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
        let env_name = p.api_key_env.clone();
        let api_key = resolve_secret(
            &format!("{key}.api_key"),
            p.api_key,
            p.api_key_env,
            p.api_key_file,
            config_dir,
            env,
        )?;
        if api_key.is_some() {
            let origin = secret_origin(
                &format!("{key}.api_key"),
                env_name.as_deref(),
                api_key.as_ref(),
                provenance,
            );
            provenance.set(format!("{key}.api_key"), origin);
        }
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

/// `agents.defaults.context_window` and `agents.defaults.compaction`, with the window of the
/// first provider's model from the built-in table when not set.
fn resolve_window(
    context_window: Option<u64>,
    compaction: file::CompactionFile,
    providers: &[ProviderConfig],
) -> Result<WindowSettings, ConfigError> {
    let context_window = match context_window {
        Some(w) if w < 1024 => {
            return Err(ConfigError::Invalid {
                key: "agents.defaults.context_window".into(),
                detail: format!(
                    "expected the model's context window in tokens (at least 1024), got {w}"
                ),
            })
        }
        Some(w) => w,
        None => providers
            .first()
            .map_or(crate::llm::models::DEFAULT_CONTEXT_WINDOW, |p| {
                crate::llm::models::context_window(&p.model)
            }),
    };
    let threshold = compaction.threshold.unwrap_or(DEFAULT_COMPACTION_THRESHOLD);
    if !(0.2..=0.95).contains(&threshold) {
        return Err(ConfigError::Invalid {
            key: "agents.defaults.compaction.threshold".into(),
            detail: format!(
                "expected a fraction of the context window between 0.2 and 0.95, got {threshold}"
            ),
        });
    }
    Ok(WindowSettings {
        context_window,
        threshold,
        summary_model: compaction.model.filter(|m| !m.trim().is_empty()),
    })
}
