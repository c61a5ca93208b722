//! The composition root's builders: everything that reads `&Config` and assembles objects
//! (the model chain, the tool registry and its exec runtime, the MCP manager, the access rules,
//! the paths tools must never touch). Nothing below the daemon reads `Config` to build itself.

use std::sync::Arc;

use crate::config::{Config, ProviderKind, ProviderSource};
use crate::llm::anthropic::{Anthropic, AnthropicConfig};
use crate::llm::openai::{OpenAiCompat, OpenAiConfig};
use crate::llm::retry::{ResilientModel, RetryPolicy};
use crate::llm::{DynModel, LlmError};
use crate::mcp::client::McpManager;
use crate::tools::{exec, fs, message, ratelimit, registry, shell_policy, web, ToolRegistry};

/// Build the model chain (retries per provider, then failover in order).
///
/// # Errors
/// A provider whose client cannot be built.
pub fn build_model(config: &Config) -> Result<DynModel, LlmError> {
    let mut models: Vec<DynModel> = Vec::new();
    let mut retries = 3;
    // Provider errors echo request headers and URLs: every configured secret is redacted from
    // them (docs/tools.md, "Output handling").
    let secrets: Vec<String> = config
        .secrets
        .iter()
        .map(|s| s.expose().to_string())
        .collect();
    for p in &config.providers {
        retries = p.max_retries;
        let m: DynModel = match p.kind {
            ProviderKind::OpenAi => Arc::new(
                OpenAiCompat::new(OpenAiConfig {
                    name: p.name.clone(),
                    base_url: p.base_url.clone(),
                    api_key: p.api_key.as_ref().map(|s| s.expose().to_string()),
                    model: p.model.clone(),
                    timeout: p.timeout,
                    extra_headers: p.headers.clone(),
                })?
                .with_secrets(secrets.clone()),
            ),
            ProviderKind::Anthropic => Arc::new(
                Anthropic::new(AnthropicConfig {
                    name: p.name.clone(),
                    base_url: p.base_url.clone(),
                    api_key: p.api_key.as_ref().map(|s| s.expose().to_string()),
                    model: p.model.clone(),
                    timeout: p.timeout,
                    max_tokens: config.agent.max_tokens.unwrap_or(4096),
                })?
                .with_secrets(secrets.clone()),
            ),
        };
        models.push(m);
    }
    let policy = RetryPolicy {
        max_attempts: retries.saturating_add(1),
        ..RetryPolicy::default()
    };
    Ok(Arc::new(ResilientModel::new(models, policy)))
}

/// What to tell the user when the provider cannot be reached, given where it came from.
pub fn connect_hint(config: &Config) -> Option<String> {
    match &config.provider_source {
        ProviderSource::LocalDefault => Some(format!(
            "No LLM provider is configured and nothing answered at {} (Ollama's default). Set OPENAI_API_KEY (and OPENAI_BASE_URL for another OpenAI-compatible server), ANTHROPIC_API_KEY or OPENROUTER_API_KEY, or add providers.<name> to {}",
            config
                .providers
                .first()
                .map_or(Default::default(), |p| crate::types::scrub::redact_url(&p.base_url)),
            config
                .path
                .as_ref()
                .map_or_else(|| "~/.clawft/config.json".to_string(), |p| p.display().to_string())
        )),
        ProviderSource::Environment(_) | ProviderSource::Configured => None,
    }
}

/// Start the configured MCP servers in the background (never blocks), behind the same SSRF
/// exemptions as `web_fetch`.
pub fn start_mcp(config: &Config) -> Option<Arc<McpManager>> {
    if config.tools.mcp_servers.is_empty() {
        return None;
    }
    let options = crate::mcp::client::McpOptions {
        ssrf: Arc::new(crate::net::ssrf::SsrfPolicy::new(
            config.tools.web_fetch.allow_private.clone(),
        )),
        ..crate::mcp::client::McpOptions::default()
    };
    Some(McpManager::start(config.tools.mcp_servers.clone(), options))
}

/// Access rules: every chat platform is restricted to its `allow_from` (and paired senders);
/// the HTTP API and the terminal are open (the bind address and token guard them).
pub fn access_rules(config: &Config) -> crate::ingress::access::Access {
    use crate::ingress::access::{Access, AccessRule};
    Access::new(
        config
            .chat_channels
            .iter()
            .map(|c| {
                (
                    c.platform.name().to_string(),
                    AccessRule::Restricted {
                        allow_from: c.allow_from.clone(),
                        pairing: c.pairing,
                    },
                )
            })
            .collect(),
    )
    .with_per_user(
        config
            .chat_channels
            .iter()
            .filter(|c| c.per_user_sessions)
            .map(|c| c.platform.name().to_string()),
    )
}

/// Paths commands must never touch even beneath an allowed tree: the config (its directory when
/// that does not hold the workspace), the store, the systemd credentials directory.
pub fn protected_paths(config: &Config) -> Vec<std::path::PathBuf> {
    let ws = &config.agent.workspace;
    let mut out = vec![config.store.path.clone()];
    if let Some(p) = &config.path {
        match p.parent() {
            Some(dir) if !dir.as_os_str().is_empty() && !ws.starts_with(dir) => {
                out.push(dir.to_path_buf());
            }
            _ => out.push(p.clone()),
        }
    }
    out.extend(config.tools.credentials_dir.clone());
    out.retain(|p| !ws.starts_with(p));
    out
}

fn exec_runtime(
    config: &Config,
    approver: Option<Arc<dyn shell_policy::Approver>>,
) -> std::io::Result<Arc<exec::ExecRuntime>> {
    let deps = exec::ExecDeps {
        protected_paths: protected_paths(config),
        secrets: config
            .secrets
            .iter()
            .map(|s| s.expose().to_string())
            .collect(),
        env: config
            .tools
            .exec_env
            .iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect(),
        approver,
        tmp_base: config.tools.tmp_base.clone(),
    };
    let rt = exec::ExecRuntime::new(config.tools.exec.clone(), deps)?;
    let st = rt.sandbox_status();
    if st.fs_enforced {
        tracing::debug!(sandbox = %st.summary(), "exec sandbox ready");
    } else {
        tracing::warn!(sandbox = %st.summary(), "Landlock is unavailable: exec_shell and spawn run without the filesystem sandbox (policy and environment scrubbing still apply)");
    }
    Ok(Arc::new(rt))
}

/// The registry of the daemon (and of `weft tools`): every built-in tool with the configured
/// policy, rate limit, timeout and secret scrubbing. `sink` is where the `message` tool sends;
/// without one the tool is not registered.
pub fn build_registry(
    config: &Config,
    sink: Option<Arc<dyn message::MessageSink>>,
    approver: Option<Arc<dyn shell_policy::Approver>>,
    sources: Vec<Arc<dyn registry::ToolSource>>,
    subagents: Option<Arc<crate::subagent::SubagentHub>>,
) -> ToolRegistry {
    let mut reg = ToolRegistry::new()
        .with_secrets(
            config
                .secrets
                .iter()
                .map(|s| s.expose().to_string())
                .collect(),
        )
        .with_timeout(config.agent.tool_timeout)
        .with_policy(config.tools.policy.clone())
        .with_rate_limit(
            config
                .tools
                .rate_limit
                .map(|l| Arc::new(ratelimit::RateLimiter::new(l))),
        );
    for src in sources {
        reg = reg.with_source(src);
    }
    for t in fs::file_tools(&config.tools.files, config.tools.memory_fallback.clone()) {
        reg.register(t);
    }
    match exec_runtime(config, approver) {
        Ok(rt) => {
            reg.register(Arc::new(exec::ExecShell::new(rt.clone())));
            reg.register(Arc::new(exec::Spawn::new(rt)));
        }
        Err(e) => tracing::error!(error = %e, "exec_shell and spawn are unavailable"),
    }
    match web::WebFetch::new(config.tools.web_fetch.clone()) {
        Ok(t) => reg.register(Arc::new(t)),
        Err(e) => tracing::error!(error = %e, "web_fetch is unavailable"),
    }
    match web::WebSearch::new(config.tools.web_search.clone()) {
        Ok(t) => reg.register(Arc::new(t)),
        Err(e) => tracing::error!(error = %e, "web_search is unavailable"),
    }
    reg.register(Arc::new(crate::skills::UseSkill::new(Some(
        config.home.join("skills"),
    ))));
    if let Some(hub) = subagents {
        reg.register(Arc::new(crate::subagent::tool::SubagentsTool::new(hub)));
    }
    if let Some(sink) = sink {
        reg.register(Arc::new(message::MessageTool::new(
            sink,
            config.tools.message_allow.clone(),
        )));
    }
    reg
}
