//! One agent section resolved (`agents.defaults`, or `agents.NAME` over it): its behaviour,
//! its providers in fallback order (from `providers.*`, API keys in the environment, or the
//! local default), its prompt window and the models `/model` may choose. Holds no other
//! section.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::agents::merge_subagents;
use super::env::{expand, Env};
use super::error::ConfigError;
use super::file;
use super::provenance::{Origin, Provenance};
use super::secrets::{resolve_secret, secret_origin};
use super::subagents::{SubagentSettings, SubagentsFile};
use super::types::{
    AgentConfig, ProviderConfig, ProviderKind, ProviderSource, TimeZone, Vision, WindowSettings,
    DEFAULT_COMPACTION_THRESHOLD, DEFAULT_LOOP_REPEAT_LIMIT, DEFAULT_MAX_TOOL_CALLS_PER_TURN,
    DEFAULT_MAX_TOOL_ITERATIONS, DEFAULT_OLLAMA_KEEP_ALIVE, DEFAULT_OLLAMA_NUM_CTX_MAX,
    DEFAULT_PROMPT_BUDGET, LOCAL_DEFAULT_BASE_URL, OLLAMA_DEFAULT_BASE_URL,
};
use crate::types::Secret;

/// What resolving an agent needs beside its section.
pub(super) struct AgentEnv<'a> {
    /// `~/.clawft`.
    pub home: &'a Path,
    /// The workspace's directory beneath `home` when the section sets none.
    pub default_workspace: String,
    /// `tools.timeout_secs`.
    pub tool_timeout: Duration,
    /// The config file's directory.
    pub config_dir: &'a Path,
    /// The environment.
    pub env: &'a Env,
    /// The system's zone, the default of `timezone`.
    pub local_zone: &'a TimeZone,
}

/// The system's time zone: `TZ` (a zone name), else the zone `/etc/localtime` links to, else
/// UTC (a zone that cannot be read is UTC too, with a warning).
pub(super) fn local_zone(env: &Env) -> TimeZone {
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
pub(super) struct ResolvedAgent {
    /// Its behaviour.
    pub agent: AgentConfig,
    /// Its providers, in fallback order.
    pub providers: Vec<ProviderConfig>,
    /// Where they came from.
    pub source: ProviderSource,
    /// Its tool policy layer as written (with the MCP servers it is not granted denied).
    pub tools: Option<crate::tools::policy::PolicyLayerFile>,
}

/// An agent section (`agents.defaults`, or `agents.NAME` over it): its behaviour, its
/// providers in fallback order, the models `/model` may choose, and its MCP grants (servers
/// left out become denied `group:mcp:NAME` patterns of its tool layer).
pub(super) fn resolve_agent(
    d: file::AgentDefaultsFile,
    raw_providers: BTreeMap<String, file::ProviderFile>,
    mcp_names: &[String],
    e: &AgentEnv<'_>,
    secrets: &mut Vec<Secret>,
    provenance: &mut Provenance,
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
    let prompt_budget = d.prompt_budget_tokens;
    let compaction = d.compaction.take().unwrap_or_default();
    let mut agent = AgentConfig {
        workspace,
        max_tool_iterations,
        system_prompt: d.system_prompt,
        max_tokens: d.max_tokens,
        temperature: d.temperature,
        stream: d.stream.unwrap_or(true),
        tool_timeout: e.tool_timeout,
        window: WindowSettings::default(),
        loop_repeat_limit,
        max_tool_calls_per_turn,
        models: Vec::new(),
        subagents: None,
        vision: match d.vision.as_deref().map(str::trim) {
            None | Some("auto") => Vision::Auto,
            Some("on") => Vision::On,
            Some("off") => Vision::Off,
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
            Some(name) => TimeZone {
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
    agent.window = resolve_window(window_override, prompt_budget, compaction, &providers)?;
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
pub(super) fn agent_subagents(
    global: &SubagentsFile,
    own: Option<SubagentsFile>,
    key: &str,
) -> Result<Option<SubagentSettings>, ConfigError> {
    let Some(own) = own else {
        return Ok(None);
    };
    let mut merged = global.clone();
    merge_subagents(&mut merged, own);
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

/// The model a provider is asked for when neither it nor the agent names one.
fn default_model(name: &str, kind: ProviderKind) -> &'static str {
    match (name, kind) {
        (_, ProviderKind::Anthropic) => "claude-sonnet-4-5",
        (_, ProviderKind::Ollama) => "llama3.2",
        ("openrouter", _) => "openai/gpt-4o-mini",
        ("ollama" | "local", _) => "llama3.2",
        _ => "gpt-4o-mini",
    }
}

/// A provider's base URL when none is configured.
fn default_base_url(name: &str, kind: ProviderKind) -> &'static str {
    match (name, kind) {
        (_, ProviderKind::Anthropic) => "https://api.anthropic.com",
        (_, ProviderKind::Ollama) => OLLAMA_DEFAULT_BASE_URL,
        ("openrouter", _) => "https://openrouter.ai/api/v1",
        ("ollama" | "local", _) => LOCAL_DEFAULT_BASE_URL,
        _ => "https://api.openai.com/v1",
    }
}

/// One provider from its settings, defaults filled in.
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
        num_ctx_max: DEFAULT_OLLAMA_NUM_CTX_MAX,
        keep_alive: DEFAULT_OLLAMA_KEEP_ALIVE.to_string(),
        tool_call_format: None,
    }
}

/// The providers of an agent in fallback order: `providers.*` (or the keys found in the
/// environment, or the local default), `first` then `fallback`.
#[allow(clippy::too_many_arguments)]
fn resolve_providers(
    raw: BTreeMap<String, file::ProviderFile>,
    first: Option<&str>,
    fallback: Option<&[String]>,
    model_override: Option<&str>,
    config_dir: &Path,
    env: &Env,
    secrets: &mut Vec<Secret>,
    provenance: &mut Provenance,
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
            None if name == "ollama" => ProviderKind::Ollama,
            None | Some("openai") => ProviderKind::OpenAi,
            Some("anthropic") => ProviderKind::Anthropic,
            Some("ollama") => ProviderKind::Ollama,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    key: format!("{key}.kind"),
                    detail: format!("expected `openai`, `anthropic` or `ollama`, got `{other}`"),
                })
            }
        };
        if matches!(p.num_ctx_max, Some(n) if n < 1024) {
            return Err(ConfigError::Invalid {
                key: format!("{key}.num_ctx_max"),
                detail: format!(
                    "expected the most context tokens to ask of Ollama (at least 1024), got {}",
                    p.num_ctx_max.unwrap_or_default()
                ),
            });
        }
        let tool_call_format = match p.tool_call_format.as_deref() {
            None => None,
            Some(f) => Some(crate::llm::text_calls::ToolCallFormat::parse(f).ok_or_else(|| {
                ConfigError::Invalid {
                    key: format!("{key}.tool_call_format"),
                    detail: format!(
                        "expected `native`, `auto`, `hermes`, `llama`, `mistral` or `json`, got `{f}`"
                    ),
                }
            })?),
        };
        let num_ctx_max = p.num_ctx_max;
        let keep_alive = p.keep_alive.clone();
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
        let mut resolved = provider(
            &name,
            kind,
            p.base_url,
            api_key,
            model,
            p.timeout_secs,
            headers,
            p.max_retries,
        );
        if let Some(n) = num_ctx_max {
            resolved.num_ctx_max = n;
        }
        resolved.tool_call_format = tool_call_format;
        if let Some(k) = keep_alive.filter(|k| !k.trim().is_empty()) {
            resolved.keep_alive = k;
        }
        all.insert(name.clone(), resolved);
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
    prompt_budget: Option<u64>,
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
        // Ollama serves the window asked of it, at most `num_ctx_max`: the agent's window is
        // that (the model's own length, read at run time, can only lower it further).
        None => providers
            .first()
            .map_or(crate::llm::models::DEFAULT_CONTEXT_WINDOW, |p| {
                match p.kind {
                    ProviderKind::Ollama => {
                        crate::llm::models::context_window(&p.model).min(p.num_ctx_max)
                    }
                    ProviderKind::OpenAi | ProviderKind::Anthropic => {
                        crate::llm::models::context_window(&p.model)
                    }
                }
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
    let asked = match prompt_budget {
        Some(b) if b < 1024 => {
            return Err(ConfigError::Invalid {
                key: "agents.defaults.prompt_budget_tokens".into(),
                detail: format!(
                    "expected the most tokens a request's prompt may carry (at least 1024), got {b}"
                ),
            })
        }
        Some(b) => b,
        None => DEFAULT_PROMPT_BUDGET,
    };
    Ok(WindowSettings {
        context_window,
        prompt_budget: asked.min(context_window),
        prompt_budget_set: prompt_budget,
        threshold,
        summary_model: compaction.model.filter(|m| !m.trim().is_empty()),
    })
}
