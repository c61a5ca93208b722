//! The composition root's builders: everything that reads `&Config` and assembles objects
//! (the model chain, the tool registry and its exec runtime, the MCP manager, the access rules,
//! the paths tools must never touch). Nothing below the daemon reads `Config` to build itself.

use std::sync::Arc;

use crate::config::{Config, ProviderKind, ProviderSource};
use crate::llm::anthropic::{Anthropic, AnthropicConfig};
use crate::llm::ollama::{Ollama, OllamaConfig};
use crate::llm::openai::{OpenAiCompat, OpenAiConfig};
use crate::llm::retry::{ResilientModel, RetryPolicy};
use crate::llm::text_calls::ToolCallFormat;
use crate::llm::{DynModel, LlmError};
use crate::mcp::client::McpManager;
use crate::net::proxy::{EgressProxy, ProxyPolicy};
use crate::net::ssrf::SsrfPolicy;
use crate::tools::protected::ProtectedPaths;
use crate::tools::{exec, fs, message, ratelimit, registry, shell_policy, web, ToolRegistry};
use crate::types::scrub::Scrubber;

/// Build the model chain (retries per provider, then failover in order).
///
/// # Errors
/// A provider whose client cannot be built.
pub fn build_model(config: &Config) -> Result<DynModel, LlmError> {
    build_model_sharing(config, None)
}

/// [`build_model`], recording each call's outcome in `health` (the gateway's, shared by its
/// agents) or in a health of its own.
///
/// # Errors
/// As [`build_model`].
pub fn build_model_sharing(
    config: &Config,
    health: Option<crate::llm::health::ProviderHealth>,
) -> Result<DynModel, LlmError> {
    let mut models: Vec<DynModel> = Vec::new();
    let mut retries = 3;
    // Provider errors echo request headers and URLs: every configured secret, and every
    // provider's key and header values, is redacted from them (docs/tools.md, "Output
    // handling"). One scrubber, built once, serves every provider.
    let mut secrets: Vec<String> = config
        .secrets
        .iter()
        .map(|s| s.expose().to_string())
        .collect();
    for p in &config.providers {
        secrets.extend(p.api_key.as_ref().map(|k| k.expose().to_string()));
        secrets.extend(p.headers.iter().map(|(_, v)| v.clone()));
    }
    let scrubber = Scrubber::new(secrets);
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
                .with_scrubber(scrubber.clone())
                .checking_truncation(is_local_server(&p.base_url))
                .reading_tool_calls(tool_call_format(p)),
            ),
            ProviderKind::Ollama => Arc::new(
                Ollama::new(OllamaConfig {
                    name: p.name.clone(),
                    base_url: p.base_url.clone(),
                    model: p.model.clone(),
                    timeout: p.timeout,
                    window: config.agent.window.context_window,
                    num_ctx_max: p.num_ctx_max,
                    keep_alive: p.keep_alive.clone(),
                    tool_call_format: tool_call_format(p),
                })?
                .with_scrubber(scrubber.clone()),
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
                .with_scrubber(scrubber.clone()),
            ),
        };
        models.push(m);
    }
    let policy = RetryPolicy {
        max_attempts: retries.saturating_add(1),
        fail_fast_refused: config.provider_source == ProviderSource::LocalDefault,
        ..RetryPolicy::default()
    };
    let pairs: Vec<(String, String)> = config
        .providers
        .iter()
        .map(|p| (p.name.clone(), p.model.clone()))
        .collect();
    let health = match health {
        Some(h) => {
            for (name, model) in &pairs {
                h.declare(name, model);
            }
            h
        }
        None => crate::llm::health::ProviderHealth::new(&pairs),
    };
    let defaults = pairs.into_iter().map(|(_, m)| m).collect();
    Ok(Arc::new(
        ResilientModel::new(models, policy).with_health(health, defaults),
    ))
}

/// How `p`'s tool calls are read: its setting, else `auto` for a local server and Ollama,
/// `native` for the others.
fn tool_call_format(p: &crate::config::ProviderConfig) -> ToolCallFormat {
    p.tool_call_format.unwrap_or(
        if p.kind == ProviderKind::Ollama || is_local_server(&p.base_url) {
            ToolCallFormat::Auto
        } else {
            ToolCallFormat::Native
        },
    )
}

/// Whether `base_url` points at a server on this machine or the local network (loopback,
/// private and link-local addresses, `localhost`, `.local`/`.lan`/`.internal` names, single-label
/// host names): the local servers (Ollama, llama-server, LM Studio, vLLM) whose answers are
/// checked for a prompt they cut silently.
pub fn is_local_server(base_url: &str) -> bool {
    let Ok(url) = url::Url::parse(base_url) else {
        return false;
    };
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback() || ip.is_private() || ip.is_link_local(),
        Some(url::Host::Ipv6(ip)) => {
            ip.is_loopback() || (ip.segments()[0] & 0xfe00) == 0xfc00 // unique local
                || (ip.segments()[0] & 0xffc0) == 0xfe80 // link-local
        }
        Some(url::Host::Domain(d)) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            d == "localhost"
                || !d.contains('.')
                || [".localhost", ".local", ".lan", ".internal", ".home.arpa"]
                    .iter()
                    .any(|s| d.ends_with(s))
        }
        None => false,
    }
}

/// What to tell the user when the provider cannot be reached, given where it came from.
pub fn connect_hint(config: &Config) -> Option<String> {
    match &config.provider_source {
        ProviderSource::LocalDefault => Some(format!(
            "No LLM provider is configured and nothing answered at {} (Ollama's default, used when nothing else is configured). Set OPENAI_API_KEY (and OPENAI_BASE_URL for another OpenAI-compatible server), ANTHROPIC_API_KEY or OPENROUTER_API_KEY, or add providers.<name> to {}",
            config
                .providers
                .first()
                .map_or(Default::default(), |p| crate::types::scrub::redact_url(&p.base_url)),
            config
                .path
                .as_ref()
                .map_or_else(|| config.home.join("config.toml").display().to_string(), |p| p.display().to_string())
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
        first_connect_wait: config.tools.mcp_connect_wait,
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
                    c.id(),
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
            .map(crate::config::ChatChannelConfig::id),
    )
    .with_bindings(config.bindings.clone())
}

/// The daemon's own paths, which no tool may touch wherever the workspace is: the config
/// (file and directory), the files secrets were read from, `$CREDENTIALS_DIRECTORY`, the store
/// (which also holds the gateway's own files), the state directory (`~/.clawft`) and the
/// config files it may hold. The one list of both the file tools ([`crate::tools::Workspace`])
/// and the exec sandbox (carved out of allowed trees).
///
/// A path that contains the workspace cannot be refused whole (the workspace would go with
/// it): the config directory and the state directory are then represented by the files above
/// (config, secret files, store), and the store and credentials directories, sensitive
/// throughout, by their entries outside the workspace's branch.
pub fn protected_paths(config: &Config) -> ProtectedPaths {
    use crate::tools::protected::{canonical, ProtectedKind};
    let mut all = ProtectedPaths::default();
    if let Some(p) = &config.path {
        all.push(p.clone(), ProtectedKind::Config);
        if let Some(dir) = p.parent() {
            all.push(dir, ProtectedKind::Config);
        }
    }
    for s in &config.secrets {
        if let Some(f) = s.file() {
            all.push(f, ProtectedKind::Credentials);
        }
    }
    if let Some(d) = &config.tools.credentials_dir {
        all.push(d.clone(), ProtectedKind::Credentials);
    }
    all.push(config.store.path.clone(), ProtectedKind::Store);
    all.push(config.home.clone(), ProtectedKind::State);
    for name in ["config.toml", "config.json"] {
        all.push(config.home.join(name), ProtectedKind::Config);
    }
    // Each chat user's memory: only the memory tools, each user their own directory, ever
    // open it.
    for name in config.agent_names() {
        all.push(users_dir_of(config, name), ProtectedKind::UserMemory);
    }
    // The service's credentials file (`weft service install --write-credentials`).
    all.push(
        config.home.join(crate::config::SERVICE_ENV_FILE),
        ProtectedKind::Credentials,
    );
    let ws = canonical(&config.agent.workspace);
    let mut out = ProtectedPaths::default();
    for p in all.iter() {
        let c = canonical(&p.path);
        if !ws.starts_with(&c) {
            out.push(p.path.clone(), p.kind);
        } else if c != ws && matches!(p.kind, ProtectedKind::Store | ProtectedKind::Credentials) {
            carve(&c, &ws, p.kind, &mut out);
        }
    }
    out
}

/// Protect the entries of `dir` (which strictly contains `ws`) except those on the way to the
/// workspace, recursively.
fn carve(
    dir: &std::path::Path,
    ws: &std::path::Path,
    kind: crate::tools::protected::ProtectedKind,
    out: &mut ProtectedPaths,
) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if !ws.starts_with(&p) {
            out.push(p, kind);
        } else if p != ws {
            carve(&p, ws, kind, out);
        }
    }
}

fn exec_runtime(
    config: &Config,
    approver: Option<Arc<dyn shell_policy::Approver>>,
) -> std::io::Result<Arc<exec::ExecRuntime>> {
    let proxy = egress_proxy(config);
    let deps = exec::ExecDeps {
        protected_paths: protected_paths(config).paths(),
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
        proxy_socket: proxy.as_ref().map(|p| p.path().to_path_buf()),
        proxy,
    };
    let rt = exec::ExecRuntime::new(config.tools.exec.clone(), deps)?;
    let st = rt.sandbox_status();
    if st.fs_enforced {
        tracing::info!(sandbox = %st.summary(), "exec sandbox ready");
    } else {
        tracing::warn!(sandbox = %st.summary(), "Landlock is unavailable: exec_shell and spawn run without the filesystem sandbox (policy and environment scrubbing still apply)");
    }
    if st.jail.is_some_and(|j| !j.pid_namespace) {
        tracing::warn!(sandbox = %st.summary(), "commands cannot get their own namespaces: no network at all for them (seccomp), and processes that leave their process group can outlive them");
    }
    Ok(Arc::new(rt))
}

/// The egress proxy that commands reach in `tools.exec.network = "proxy"` mode, in its own
/// 0700 directory beneath the temp base; `None` in the other modes, outside a tokio runtime,
/// or when it cannot start (then commands have no network at all, and the log says why).
fn egress_proxy(config: &Config) -> Option<Arc<EgressProxy>> {
    let exec = &config.tools.exec;
    // The jail (network namespace and bridge) applies with or without Landlock (`sandbox`).
    if exec.network != exec::NetworkMode::Proxy {
        return None;
    }
    tokio::runtime::Handle::try_current().ok()?;
    let policy = ProxyPolicy {
        ssrf: SsrfPolicy::new(exec.allow_private.clone()),
        allow_domains: exec.allow_domains.clone(),
        ..ProxyPolicy::default()
    };
    match EgressProxy::start_private(&config.tools.tmp_base, policy) {
        Ok(p) => Some(Arc::new(p)),
        Err(e) => {
            tracing::warn!(error = %e, base = %config.tools.tmp_base.display(), "cannot start the egress proxy for commands: they get no network at all");
            None
        }
    }
}

/// The agent's `browser` tool, when it is on and a Chromium is installed; its profile lives in
/// `<state>/browser/<agent>/`.
#[cfg(feature = "browser")]
fn browser_tool(config: &Config) -> Option<Arc<crate::browser::tool::BrowserTool>> {
    let s = &config.tools.browser;
    if !s.enabled || s.find_executable().is_none() {
        return None;
    }
    let dir = config.home.join("browser").join(&config.agent_name);
    // The profile lives beneath the state dir, which is protected: leave the way to it open
    // (its siblings stay protected, as for a workspace beneath it).
    let _ = std::fs::create_dir_all(&dir);
    let dir_c = crate::tools::protected::canonical(&dir);
    let mut protected = ProtectedPaths::default();
    for p in protected_paths(config).iter() {
        let c = crate::tools::protected::canonical(&p.path);
        if !dir_c.starts_with(&c) {
            protected.push(p.path.clone(), p.kind);
        } else if c != dir_c {
            carve(&c, &dir_c, p.kind, &mut protected);
        }
    }
    // One browser per agent and profile: a registry built again (a reload) while the old one
    // is still in use shares the running browser rather than starting a second Chromium on
    // the same profile; changed settings take effect with a new browser.
    static LIVE: std::sync::Mutex<Vec<std::sync::Weak<crate::browser::session::Browser>>> =
        std::sync::Mutex::new(Vec::new());
    let paths = protected.paths();
    let mut live = crate::types::MutexExt::locked(&LIVE);
    live.retain(|w| w.strong_count() > 0);
    let same = live.iter().filter_map(std::sync::Weak::upgrade).find(|b| {
        b.dir() == dir.as_path() && b.settings() == s && b.protected() == paths.as_slice()
    });
    let b = match same {
        Some(b) => b,
        None => {
            let b = crate::browser::session::Browser::new(s.clone(), &config.agent_name, dir)
                .with_protected(paths);
            live.push(Arc::downgrade(&b));
            b
        }
    };
    Some(Arc::new(crate::browser::tool::BrowserTool::new(b)))
}

/// Where chat users' own memory lives (`memory.scope = "user"`): `~/.clawft/users`, outside
/// the workspace, so the exec sandbox (which can only leave paths out of a tree by splitting
/// the directories above them) keeps the workspace whole.
pub fn users_dir(config: &Config) -> std::path::PathBuf {
    users_dir_of(config, &config.agent_name)
}

/// [`users_dir`] of agent `name`: the default agent's `~/.clawft/users`, another agent's
/// `~/.clawft/agents/NAME/users` (each agent its own memory of each user).
pub fn users_dir_of(config: &Config, name: &str) -> std::path::PathBuf {
    if name == crate::types::session_key::DEFAULT_AGENT {
        config.home.join(crate::memory::scope::USERS_DIR)
    } else {
        config
            .home
            .join("agents")
            .join(name)
            .join(crate::memory::scope::USERS_DIR)
    }
}

/// The memory search service of `config` (snapshots beneath the state directory; past
/// conversations from `store` when `memory.search_transcripts`), watching the writes of
/// `docs`, the memory documents the tools it is built with write.
pub fn memory_service(
    config: &Config,
    store: Option<crate::store::Store>,
    docs: crate::tools::shared_docs::MemoryDocs,
) -> Arc<crate::memory::service::MemoryService> {
    Arc::new(
        crate::memory::service::MemoryService::new(
            config.home.clone(),
            config.memory.clone(),
            store,
        )
        .with_max_file_bytes(config.tools.files.memory_max_bytes)
        .with_docs(docs),
    )
}

/// The daemon's own services some tools work through; a tool whose service is absent is not
/// registered (`weft tools` lists without them), except memory search, which builds its own.
#[derive(Default)]
pub struct RegistryParts {
    /// The subagent hub (`subagents`).
    pub subagents: Option<Arc<crate::subagent::SubagentHub>>,
    /// The memory search service (`memory_search`, `memory_get`).
    pub memory: Option<Arc<crate::memory::service::MemoryService>>,
    /// The scheduler (`cron`).
    pub scheduler: Option<Arc<crate::scheduler::Scheduler>>,
    /// The running gateway's controls (`gateway`; opt-in, see `tools::builtin::Builtin::opt_in`).
    pub gateway: Option<crate::tools::gateway::GatewaySlot>,
    /// The connected nodes (`nodes`; opt-in, see `tools::builtin::Builtin::opt_in`).
    pub nodes: Option<crate::tools::nodes::NodesSlot>,
    /// The background processes of every session (`process`).
    pub processes: Option<Arc<exec::process::ProcessTable>>,
    /// The sessions the session tools read and send to (`sessions_*`, `session_status`).
    pub sessions: Option<Arc<crate::session::tools::SessionDirectory>>,
    /// The store the canvases live in (`canvas`).
    pub canvas: Option<crate::store::Store>,
    /// Speech and images (`tts`, `image`); `None`: made from `config.media`.
    pub media: Option<Arc<crate::media::Media>>,
}

/// The registry of the daemon (and of `weft tools`): every built-in tool with the configured
/// policy, rate limit, timeout and secret scrubbing. `sink` is where the `message` tool sends;
/// without one the tool is not registered.
pub fn build_registry(
    config: &Config,
    sink: Option<Arc<dyn message::MessageSink>>,
    approver: Option<Arc<dyn shell_policy::Approver>>,
    sources: Vec<Arc<dyn registry::ToolSource>>,
    parts: RegistryParts,
) -> ToolRegistry {
    let RegistryParts {
        subagents,
        memory,
        scheduler,
        gateway,
        nodes,
        processes,
        sessions,
        canvas,
        media,
    } = parts;
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
    let memory = memory.unwrap_or_else(|| memory_service(config, None, Default::default()));
    for t in fs::file_tools_writing(
        &config.tools.files,
        config.tools.memory_fallback.clone(),
        memory.docs(),
    ) {
        reg.register(t);
    }
    reg.register(Arc::new(crate::memory::tools::MemorySearch::new(
        memory.clone(),
    )));
    reg.register(Arc::new(crate::memory::tools::MemoryGet::new(memory)));
    let node_approver = approver.clone();
    match exec_runtime(config, approver) {
        Ok(rt) => {
            for c in &config.tools.custom {
                reg.register(Arc::new(exec::custom::CustomTool::new(
                    c.clone(),
                    rt.clone(),
                )));
            }
            reg.register(Arc::new(exec::ExecShell::new(rt.clone())));
            if let Some(table) = processes {
                reg.register(Arc::new(exec::process::ProcessTool::new(rt.clone(), table)));
            }
            reg.register(Arc::new(exec::Spawn::new(rt)));
        }
        Err(e) => tracing::error!(error = %e, "exec_shell and spawn are unavailable"),
    }
    match web::WebFetch::new(config.tools.web_fetch.clone()) {
        Ok(t) => reg.register(Arc::new(t)),
        Err(e) => tracing::error!(error = %e, "web_fetch is unavailable"),
    }
    #[cfg(feature = "browser")]
    let browser = browser_tool(config);
    #[cfg(feature = "browser")]
    if let Some(t) = &browser {
        reg.register(t.clone());
    }
    match web::WebSearch::new(config.tools.web_search.clone()) {
        Ok(t) => reg.register(Arc::new(t)),
        Err(e) => tracing::error!(error = %e, "web_search is unavailable"),
    }
    reg.register(Arc::new(crate::skills::UseSkill::new(Some(
        config.home.join("skills"),
    ))));
    reg.register(Arc::new(crate::skills::SkillSearch::new(Some(
        config.home.join("skills"),
    ))));
    reg.register(Arc::new(crate::tools::discovery::ToolSearch));
    if let Some(hub) = subagents {
        reg.register(Arc::new(crate::subagent::tool::SubagentsTool::new(hub)));
    }
    if let Some(s) = scheduler {
        reg.register(Arc::new(crate::scheduler::tool::CronTool::new(s)));
    }
    if let Some(store) = canvas {
        #[allow(unused_mut)]
        let mut t = crate::tools::canvas::CanvasTool::new(store);
        // `snapshot` renders through the agent's browser, when it has one.
        #[cfg(feature = "browser")]
        if let Some(b) = &browser {
            t = t.with_renderer(Arc::new(crate::browser::tool::CanvasRenderer(
                b.browser().clone(),
            )));
        }
        reg.register(Arc::new(t));
    }
    if let Some(slot) = gateway {
        reg.register(Arc::new(crate::tools::gateway::GatewayTool::new(slot)));
    }
    if let Some(slot) = nodes {
        let tool = crate::tools::nodes::NodesTool::new(slot).only(config.agent.nodes.clone());
        reg.register(Arc::new(
            if config.tools.exec.mode == crate::tools::shell_policy::ExecMode::Ask {
                tool.with_approval(node_approver, config.tools.exec.approval_timeout)
            } else {
                tool
            },
        ));
    }
    if let Some(dir) = sessions {
        let model = config
            .agent
            .models
            .first()
            .cloned()
            .or_else(|| config.providers.first().map(|p| p.model.clone()))
            .unwrap_or_default();
        for t in crate::session::tools::session_tools(dir, config.tools.sessions.clone(), model) {
            reg.register(t);
        }
    }
    // `tts` and `image` are always offered (on demand): without a backend a call says what
    // to configure.
    match media.map_or_else(
        || crate::media::Media::new(config.media.clone()).map(Arc::new),
        Ok,
    ) {
        Ok(m) => {
            reg.register(Arc::new(crate::media::tools::TtsTool::new(m.clone())));
            reg.register(Arc::new(crate::media::tools::ImageTool::new(m)));
        }
        Err(e) => tracing::error!(error = %e, "tts and image are unavailable"),
    }
    if let Some(sink) = sink {
        reg.register(Arc::new(message::MessageTool::new(
            sink,
            config.tools.message_allow.clone(),
        )));
    }
    reg
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::config::Env;
    use crate::tools::protected::{canonical, ProtectedKind};

    fn load(home: &Path, config: &Path, text: &str, extra: &[(&str, &str)]) -> Config {
        std::fs::create_dir_all(config.parent().unwrap()).unwrap();
        std::fs::write(config, text).unwrap();
        let mut env = vec![("HOME", home.to_str().unwrap())];
        env.extend_from_slice(extra);
        Config::load(Some(config), &Env::from_pairs(env)).unwrap()
    }

    fn set(c: &Config) -> Vec<(PathBuf, ProtectedKind)> {
        protected_paths(c)
            .iter()
            .map(|p| (canonical(&p.path), p.kind))
            .collect()
    }

    #[test]
    fn the_default_layout_protects_the_config_and_store_but_not_the_dirs_holding_the_workspace() {
        let tmp = tempfile::tempdir().unwrap();
        let home = canonical(tmp.path());
        let state = home.join(".clawft");
        let c = load(&home, &state.join("config.toml"), "", &[]);
        let s = set(&c);
        assert!(s.contains(&(state.join("config.toml"), ProtectedKind::Config)));
        assert!(s.contains(&(state.join("config.json"), ProtectedKind::Config)));
        assert!(s.contains(&(state.join("store"), ProtectedKind::Store)));
        // ~/.clawft holds the workspace: refusing it would refuse the workspace.
        assert!(!s.iter().any(|(p, _)| *p == state), "{s:?}");
    }

    #[test]
    fn a_workspace_holding_everything_keeps_everything_protected() {
        let tmp = tempfile::tempdir().unwrap();
        let home = canonical(tmp.path());
        std::fs::create_dir_all(home.join("creds")).unwrap();
        std::fs::write(home.join("creds/tg"), "123:token").unwrap();
        std::fs::write(home.join("weft.key"), "sk-1").unwrap();
        let text = format!(
            "[agents.defaults]\nworkspace = \"{h}\"\n[providers.openai]\napi_key_file = \"{h}/weft.key\"\n[channels.telegram]\ntoken_file = \"tg\"\nallow_from = [1]\n",
            h = home.display()
        );
        let c = load(
            &home,
            &home.join(".clawft/config.toml"),
            &text,
            &[(
                "CREDENTIALS_DIRECTORY",
                home.join("creds").to_str().unwrap(),
            )],
        );
        let s = set(&c);
        for (p, kind) in [
            (".clawft", ProtectedKind::Config),
            (".clawft/config.toml", ProtectedKind::Config),
            (".clawft/store", ProtectedKind::Store),
            ("creds", ProtectedKind::Credentials),
            ("creds/tg", ProtectedKind::Credentials),
            ("weft.key", ProtectedKind::Credentials),
        ] {
            assert!(s.contains(&(home.join(p), kind)), "{p}: {s:?}");
        }
        // The exec sandbox gets the same list.
        assert_eq!(protected_paths(&c).paths().len(), s.len());
    }

    #[test]
    fn a_store_holding_the_workspace_is_protected_entry_by_entry() {
        let tmp = tempfile::tempdir().unwrap();
        let home = canonical(tmp.path());
        let store = home.join("data");
        std::fs::create_dir_all(store.join("ws")).unwrap();
        std::fs::write(store.join("db"), "pages").unwrap();
        std::fs::write(store.join("conf"), "x").unwrap();
        let text = format!(
            "[agents.defaults]\nworkspace = \"{s}/ws\"\n[store]\npath = \"{s}\"\n",
            s = store.display()
        );
        let c = load(&home, &home.join("cfg/weft.toml"), &text, &[]);
        let s = set(&c);
        assert!(
            s.contains(&(store.join("db"), ProtectedKind::Store)),
            "{s:?}"
        );
        assert!(
            s.contains(&(store.join("conf"), ProtectedKind::Store)),
            "{s:?}"
        );
        assert!(
            !s.iter().any(|(p, _)| *p == store || *p == store.join("ws")),
            "{s:?}"
        );
    }

    /// Issue 32: what every request of the default configuration carries in tools (the core
    /// schemas and the list of the others) stays within its share of 8 KB, with every tool
    /// the gateway registers.
    #[tokio::test]
    async fn the_default_offer_fits_its_budget() {
        let tmp = tempfile::tempdir().unwrap();
        let home = canonical(tmp.path());
        let c = load(&home, &home.join(".clawft/config.toml"), "", &[]);
        let store = crate::store::Store::memory();
        let ws = Arc::new(crate::tools::Workspace::open(&home.join("ws")).unwrap());
        let reg = build_registry(
            &c,
            Some(Arc::new(message::NoSink)),
            None,
            Vec::new(),
            RegistryParts {
                subagents: Some(crate::subagent::SubagentHub::new(c.tools.subagents.clone())),
                memory: None,
                scheduler: Some(crate::scheduler::Scheduler::new(
                    store.clone(),
                    c.scheduler,
                    None,
                    c.tools.message_allow.clone(),
                    c.heartbeat.clone(),
                    ws,
                )),
                gateway: None,
                nodes: None,
                processes: Some(exec::process::ProcessTable::new()),
                sessions: Some(crate::session::tools::SessionDirectory::new(store.clone())),
                canvas: Some(store),
                media: None,
            },
        );
        let offer = reg.offer(&[], &[], crate::turn::offer::SKILL_TOOLS);
        let sizes: Vec<(String, usize)> = offer
            .specs
            .iter()
            .map(|s| {
                let v = serde_json::json!({"type": "function", "function": {
                    "name": s.name, "description": s.description, "parameters": s.parameters}});
                (s.name.clone(), v.to_string().len())
            })
            .collect();
        let schemas: usize = sizes.iter().map(|(_, n)| n).sum();
        let list = crate::tools::discovery::list_section(&offer.deferred);
        println!("{sizes:?}\nschemas {schemas}, list {}:{list}", list.len());
        let names: Vec<&str> = sizes.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "edit_file",
                "exec_shell",
                "glob",
                "list_directory",
                "memory_search",
                "read_file",
                "tool_search",
                "web_fetch",
                "web_search",
                "write_file"
            ]
        );
        // Every other tool is listed.
        for n in reg.allowed_names() {
            if crate::turn::offer::SKILL_TOOLS.contains(&n.as_str()) {
                continue; // offered when the agent has skills
            }
            assert!(
                names.contains(&n.as_str()) || offer.deferred.iter().any(|(d, _)| *d == n),
                "{n} is neither offered nor listed"
            );
        }
        // grep and message moved to the list: the schemas shrank by ~1.8 KB, the list grew
        // by two lines; what a request carries for both is budgeted together too.
        assert!(schemas <= 5_000, "core schemas: {schemas} bytes");
        assert!(list.len() <= 1_000, "tool list: {} bytes", list.len());
        assert!(
            schemas + list.len() <= 6_000,
            "schemas and list: {schemas} + {}",
            list.len()
        );
    }
}
