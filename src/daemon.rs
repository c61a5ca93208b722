//! Builds the actor tree, recovers what a crash left behind, and owns the shutdown order.
//!
//! Start: store → bus → channel actors (intake closed) → resend the outbox → replay the journal
//! → open intake. Stop: close intake → drain sessions (grace, then cancel) → flush outboxes →
//! stop actors → wait for tasks → flush the store.

use std::sync::Arc;
use std::time::Duration;

use clawft_channel_core::Channel;
use ractor::Actor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::bus::{BusActor, BusArgs, BusMsg, BusRef};
use crate::config::{Config, ProviderKind, ProviderSource};
use crate::egress::{ChannelActor, ChannelArgs, ChannelMsg, ChannelRef};
use crate::llm::anthropic::{Anthropic, AnthropicConfig};
use crate::llm::openai::{OpenAiCompat, OpenAiConfig};
use crate::llm::retry::{ResilientModel, RetryPolicy};
use crate::llm::{DynModel, LlmError};
use crate::mcp::client::McpManager;
use crate::session::{SessionMsg, SessionStatus};
use crate::store::{Store, StoreError};
use crate::tools::message::MessageSink;
use crate::tools::{build_registry, Workspace};
use crate::turn::TurnDeps;

/// Timeout of calls to actors from the daemon (status, drain steps).
const ACTOR_CALL_TIMEOUT_MS: u64 = 5_000;
/// Timeout of calls bounded by an outer deadline instead (drain, flush).
const LONG_CALL_MS: u64 = 3_600_000;
/// How long shutdown waits for outboxes to drain.
const OUTBOX_DRAIN: Duration = Duration::from_secs(5);
/// How long shutdown waits for cancelled turns to finish writing.
const CANCEL_SETTLE: Duration = Duration::from_secs(5);

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The store could not be opened or read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The workspace directory could not be created or opened.
    #[error("cannot open workspace {path}: {source}")]
    Workspace {
        /// Path.
        path: String,
        /// Error.
        source: std::io::Error,
    },
    /// A provider could not be built.
    #[error(transparent)]
    Llm(#[from] LlmError),
    /// An actor could not be spawned.
    #[error("cannot start actor: {0}")]
    Spawn(String),
}

/// Build the model chain (retries per provider, then failover in order).
///
/// # Errors
/// A provider whose client cannot be built.
pub fn build_model(config: &Config) -> Result<DynModel, LlmError> {
    let mut models: Vec<DynModel> = Vec::new();
    let mut retries = 3;
    for p in &config.providers {
        retries = p.max_retries;
        let m: DynModel = match p.kind {
            ProviderKind::OpenAi => Arc::new(OpenAiCompat::new(OpenAiConfig {
                name: p.name.clone(),
                base_url: p.base_url.clone(),
                api_key: p.api_key.as_ref().map(|s| s.expose().to_string()),
                model: p.model.clone(),
                timeout: p.timeout,
                extra_headers: p.headers.clone(),
            })?),
            ProviderKind::Anthropic => Arc::new(Anthropic::new(AnthropicConfig {
                name: p.name.clone(),
                base_url: p.base_url.clone(),
                api_key: p.api_key.as_ref().map(|s| s.expose().to_string()),
                model: p.model.clone(),
                timeout: p.timeout,
                max_tokens: config.agent.max_tokens.unwrap_or(4096),
            })?),
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
            config.providers.first().map_or("", |p| p.base_url.as_str()),
            config
                .path
                .as_ref()
                .map_or_else(|| "~/.clawft/config.json".to_string(), |p| p.display().to_string())
        )),
        ProviderSource::Environment(_) | ProviderSource::Configured => None,
    }
}

/// The running daemon.
pub struct Daemon {
    bus: BusRef,
    channels: Vec<(String, ChannelRef)>,
    store: Store,
    tasks: TaskTracker,
    intake: CancellationToken,
    stop_channels: CancellationToken,
    channel_stops: std::collections::HashMap<String, CancellationToken>,
    channels_slot: ChannelsSlot,
    open: CancellationToken,
    turns: CancellationToken,
    grace: Duration,
    mcp: McpSlot,
    tools: Arc<crate::tools::registry::ToolsHandle>,
    sink: Arc<BusSink>,
    approvals: Arc<crate::approval::Approvals>,
    subagents: Arc<crate::subagent::SubagentHub>,
    supervisor: crate::subagent::SupervisorRef,
    config: Config,
}

/// What spawning a channel actor needs.
struct ChannelKit<'a> {
    store: &'a Store,
    bus: &'a BusRef,
    intake: &'a CancellationToken,
    open: &'a CancellationToken,
    stop: &'a CancellationToken,
    tasks: &'a TaskTracker,
    access: &'a Arc<crate::ingress::access::Access>,
}

impl ChannelKit<'_> {
    /// Spawn the actor of `ch` with its own stop token (a child of the daemon's) and register
    /// it with the bus.
    async fn spawn(
        &self,
        ch: Arc<dyn Channel>,
    ) -> Result<(String, ChannelRef, CancellationToken), DaemonError> {
        let id = ch.id().clone();
        let streaming = ch.capabilities().streaming;
        let stop = self.stop.child_token();
        let (actor, _) = Actor::spawn(
            None,
            ChannelActor,
            ChannelArgs {
                channel: ch,
                store: self.store.clone(),
                bus: self.bus.clone(),
                intake: self.intake.clone(),
                open: self.open.clone(),
                stop: stop.clone(),
                tasks: self.tasks.clone(),
                access: self.access.clone(),
            },
        )
        .await
        .map_err(|e| DaemonError::Spawn(e.to_string()))?;
        let _ = self.bus.cast(BusMsg::RegisterChannel {
            id: id.clone(),
            actor: actor.clone(),
            streaming,
        });
        Ok((id.to_string(), actor, stop))
    }
}

/// The channel actors in force, shared with the admin API (changed by a reload).
pub type ChannelsSlot = Arc<std::sync::RwLock<Vec<(String, ChannelRef)>>>;

/// The MCP manager in force, shared with the admin API (replaced on a reload).
pub type McpSlot = Arc<std::sync::RwLock<Option<Arc<McpManager>>>>;

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

impl Daemon {
    /// Start the actor tree over `store` with `model` and `channels`.
    ///
    /// # Errors
    /// [`DaemonError`] when the workspace, the store or an actor cannot start.
    pub async fn start(
        config: &Config,
        store: Store,
        model: DynModel,
        channels: Vec<Arc<dyn Channel>>,
    ) -> Result<Self, DaemonError> {
        let workspace =
            Workspace::open(&config.agent.workspace).map_err(|e| DaemonError::Workspace {
                path: config.agent.workspace.display().to_string(),
                source: e,
            })?;
        let sink = Arc::new(BusSink {
            bus: std::sync::OnceLock::new(),
            store: store.clone(),
            channels: channels.iter().map(|c| c.id().to_string()).collect(),
        });
        let approvals = Arc::new(crate::approval::Approvals::new(
            sink.clone() as Arc<dyn MessageSink>
        ));
        let mcp = start_mcp(config);
        let subagents = crate::subagent::SubagentHub::new(config.tools.subagents.clone());
        let registry = build_registry(
            config,
            Some(sink.clone() as Arc<dyn MessageSink>),
            Some(approvals.clone() as Arc<dyn crate::tools::shell_policy::Approver>),
            mcp.iter()
                .map(|m| m.clone() as Arc<dyn crate::tools::registry::ToolSource>)
                .collect(),
            Some(subagents.clone()),
        );
        let tools = crate::tools::registry::ToolsHandle::new(registry);
        let deps = TurnDeps {
            model,
            tools: tools.clone(),
            store: store.clone(),
            agent: Arc::new(config.agent.clone()),
            system_prompt: crate::session::prompt::system_prompt(
                config.agent.system_prompt.as_deref(),
                workspace.root(),
            )
            .into(),
            workspace: Arc::new(workspace),
            connect_hint: connect_hint(config).map(Into::into),
            skills_global: Some(config.home.join("skills")),
            approvals: Some(approvals.clone()),
            subagents: Some(subagents.clone()),
        };
        let tasks = TaskTracker::new();
        let turns = CancellationToken::new();
        let (bus, _) = Actor::spawn(
            None,
            BusActor,
            BusArgs {
                deps: deps.clone(),
                tasks: tasks.clone(),
                shutdown: turns.clone(),
                idle: config.sessions.idle,
                max_queue: config.sessions.max_queue,
                stream: config.agent.stream,
            },
        )
        .await
        .map_err(|e| DaemonError::Spawn(e.to_string()))?;
        let _ = sink.bus.set(bus.clone());
        let intake = CancellationToken::new();
        // Before the journal is replayed: it fails the tasks a crash interrupted and journals
        // their announcements, which the replay below then routes.
        let supervisor = crate::subagent::start(crate::subagent::SupervisorArgs {
            hub: subagents.clone(),
            deps,
            bus: bus.clone(),
            tasks: tasks.clone(),
            root_cancel: turns.child_token(),
            intake: intake.clone(),
        })
        .await
        .map_err(|e| DaemonError::Spawn(format!("subagent supervisor: {e}")))?;

        let access = Arc::new(access_rules(config));
        let stop_channels = CancellationToken::new();
        let open = CancellationToken::new();
        let mut refs = Vec::new();
        let mut channel_stops = std::collections::HashMap::new();
        let kit = ChannelKit {
            store: &store,
            bus: &bus,
            intake: &intake,
            open: &open,
            stop: &stop_channels,
            tasks: &tasks,
            access: &access,
        };
        for ch in channels {
            let (id, actor, stop) = kit.spawn(ch).await?;
            channel_stops.insert(id.clone(), stop);
            refs.push((id, actor));
        }

        // Replies answered before a crash but not delivered.
        let outbound = store.pending_outbound()?;
        if !outbound.is_empty() {
            tracing::info!(count = outbound.len(), "resending undelivered replies");
        }
        for m in outbound {
            let _ = bus.cast(BusMsg::Outbound(m));
        }
        // Messages accepted before a crash but not answered.
        let inbound = store.pending_inbound()?;
        if !inbound.is_empty() {
            tracing::info!(
                count = inbound.len(),
                "processing messages accepted before a restart"
            );
        }
        for e in inbound {
            let _ = bus.cast(BusMsg::Inbound(e));
        }
        open.cancel();

        Ok(Self {
            bus,
            channels: refs.clone(),
            store,
            tasks,
            intake,
            stop_channels,
            channel_stops,
            channels_slot: Arc::new(std::sync::RwLock::new(refs)),
            open,
            turns,
            grace: config.sessions.shutdown_grace,
            mcp: Arc::new(std::sync::RwLock::new(mcp)),
            tools,
            sink,
            approvals,
            subagents,
            supervisor,
            config: config.clone(),
        })
    }

    /// The bus (for the admin API and tools).
    pub fn bus(&self) -> &BusRef {
        &self.bus
    }

    /// Apply a new configuration without dropping sessions: the tool policy, rate limit and
    /// tool settings (a new registry for turns that start from now on) and the MCP servers
    /// (restarted when their section changed). Returns what changed; settings that need a
    /// restart (providers, channels, HTTP API, store, agent) are reported as such and keep
    /// their old values.
    pub async fn reload(&mut self, new: Config) -> Vec<String> {
        let old = self.config.clone();
        let old = &old;
        let mut changes = Vec::new();
        let differs =
            |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") != format!("{b:?}");
        let mcp_changed = differs(&old.tools.mcp_servers, &new.tools.mcp_servers);
        let tools_changed = mcp_changed
            || differs(&old.tools.policy, &new.tools.policy)
            || old.tools.rate_limit != new.tools.rate_limit
            || old.tools.message_allow != new.tools.message_allow
            || differs(&old.tools.exec, &new.tools.exec)
            || differs(&old.tools.files, &new.tools.files)
            || differs(&old.tools.web_fetch, &new.tools.web_fetch)
            || differs(&old.tools.web_search, &new.tools.web_search)
            || old.tools.subagents != new.tools.subagents
            || old.secrets != new.secrets;
        if mcp_changed {
            let old_mcp = self
                .mcp
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            if let Some(m) = old_mcp {
                m.shutdown().await;
            }
            *self
                .mcp
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = start_mcp(&new);
            changes.push(format!(
                "MCP servers restarted ({} configured)",
                new.tools.mcp_servers.len()
            ));
        }
        if old.tools.subagents != new.tools.subagents {
            self.subagents.set_settings(new.tools.subagents.clone());
            changes.push("subagent limits reloaded (running subagents keep theirs)".into());
        }
        if tools_changed {
            let registry = build_registry(
                &new,
                Some(self.sink.clone() as Arc<dyn MessageSink>),
                Some(self.approvals.clone() as Arc<dyn crate::tools::shell_policy::Approver>),
                self.mcp()
                    .into_iter()
                    .map(|m| m as Arc<dyn crate::tools::registry::ToolSource>)
                    .collect(),
                Some(self.subagents.clone()),
            );
            self.tools.replace(registry);
            changes.push("tools: policy, limits and tool settings reloaded".into());
        }
        let channel_changes = self.reload_channels(&new).await;
        changes.extend(channel_changes);
        for (what, changed) in [
            ("providers", differs(&old.providers, &new.providers)),
            ("channels.http", differs(&old.http, &new.http)),
            ("store", differs(&old.store, &new.store)),
            ("agents", differs(&old.agent, &new.agent)),
            ("sessions", differs(&old.sessions, &new.sessions)),
        ] {
            if changed {
                changes.push(format!("{what} changed: takes effect at the next restart"));
            }
        }
        // Keep the old values of what was not applied, so the next diff is against what runs.
        let mut kept = self.config.clone();
        kept.tools = new.tools;
        kept.secrets = new.secrets;
        kept.chat_channels = new.chat_channels;
        self.config = kept;
        if changes.is_empty() {
            changes.push("nothing changed".into());
        }
        changes
    }

    /// Stop the chat channels whose section changed or disappeared, start the changed and new
    /// ones (with their new access rules), and resend their undelivered replies.
    async fn reload_channels(&mut self, new: &Config) -> Vec<String> {
        use crate::config::ChatChannelConfig;
        fn fingerprint(c: &ChatChannelConfig) -> String {
            format!(
                "{c:?}{}{}",
                c.token.expose(),
                c.app_token.as_ref().map_or("", |t| t.expose())
            )
        }
        let old: std::collections::HashMap<&str, String> = self
            .config
            .chat_channels
            .iter()
            .map(|c| (c.platform.name(), fingerprint(c)))
            .collect();
        let fresh: std::collections::HashMap<&str, String> = new
            .chat_channels
            .iter()
            .map(|c| (c.platform.name(), fingerprint(c)))
            .collect();
        let mut changes = Vec::new();
        let stale: Vec<String> = old
            .iter()
            .filter(|(n, f)| fresh.get(*n) != Some(*f))
            .map(|(n, _)| (*n).to_string())
            .collect();
        for name in &stale {
            if let Some(t) = self.channel_stops.remove(name) {
                t.cancel();
            }
            if let Some(pos) = self.channels.iter().position(|(id, _)| id == name) {
                let (_, actor) = self.channels.remove(pos);
                actor.stop(Some("reload".into()));
            }
            let _ = self.bus.cast(BusMsg::UnregisterChannel {
                id: clawft_channel_core::ChannelId::new(name.as_str()),
            });
            if !fresh.contains_key(name.as_str()) {
                changes.push(format!("channel {name} stopped"));
            }
        }
        let access = Arc::new(access_rules(new));
        for c in &new.chat_channels {
            let name = c.platform.name();
            if old.get(name) == fresh.get(name) {
                continue;
            }
            let Some(ch) = crate::channels::chat_channel(c, &self.store) else {
                changes.push(format!("channel {name} could not start (see the log)"));
                continue;
            };
            let kit = ChannelKit {
                store: &self.store,
                bus: &self.bus,
                intake: &self.intake,
                open: &self.open,
                stop: &self.stop_channels,
                tasks: &self.tasks,
                access: &access,
            };
            match kit.spawn(ch).await {
                Ok((id, actor, stop)) => {
                    self.channel_stops.insert(id.clone(), stop);
                    self.channels.push((id, actor));
                    for m in self.store.pending_outbound().unwrap_or_default() {
                        if m.channel.as_str() == name {
                            let _ = self.bus.cast(BusMsg::Outbound(m));
                        }
                    }
                    changes.push(if old.contains_key(name) {
                        format!("channel {name} restarted with its new settings")
                    } else {
                        format!("channel {name} started")
                    });
                }
                Err(e) => changes.push(format!("channel {name} could not start: {e}")),
            }
        }
        *self
            .channels_slot
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = self.channels.clone();
        changes
    }

    /// The shared list of channel actors (for the admin API).
    pub fn channels_slot(&self) -> ChannelsSlot {
        self.channels_slot.clone()
    }

    /// The shared slot of the MCP manager (for the admin API).
    pub fn mcp_slot(&self) -> McpSlot {
        self.mcp.clone()
    }

    /// The MCP servers, when any is configured.
    pub fn mcp(&self) -> Option<Arc<McpManager>> {
        self.mcp
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The channel actors by id.
    pub fn channels(&self) -> &[(String, ChannelRef)] {
        &self.channels
    }

    /// The subagent supervisor.
    pub fn supervisor(&self) -> &crate::subagent::SupervisorRef {
        &self.supervisor
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Status of every live session.
    pub async fn live_sessions(&self) -> Vec<SessionStatus> {
        live_sessions(&self.bus).await
    }

    /// Shut down in order; returns when everything is flushed.
    pub async fn shutdown(self) {
        tracing::info!("shutting down: intake closed");
        self.intake.cancel();
        let sessions = ractor::call_t!(
            self.bus,
            |reply| BusMsg::Sessions { reply },
            ACTOR_CALL_TIMEOUT_MS
        )
        .unwrap_or_default();
        let drain = futures::future::join_all(sessions.iter().map(|(_, s)| async move {
            ractor::call_t!(s, |reply| SessionMsg::Drain { reply }, LONG_CALL_MS)
        }));
        let drained = tokio::time::timeout(self.grace, drain).await.is_ok();
        // Subagents still running are cancelled (their parents are told at the next start);
        // a turn waiting on one then gets its result.
        let stop_subagents = async {
            ractor::call_t!(
                self.supervisor,
                |reply| crate::subagent::SupervisorMsg::Shutdown { reply },
                LONG_CALL_MS
            )
        };
        if tokio::time::timeout(CANCEL_SETTLE, stop_subagents)
            .await
            .is_err()
        {
            tracing::warn!(
                "some subagents did not stop in time; they are failed at the next start"
            );
        }
        if !drained {
            tracing::warn!(
                grace_s = self.grace.as_secs(),
                "turns still running after the grace period; cancelling them"
            );
            self.turns.cancel();
            let settle = futures::future::join_all(sessions.iter().map(|(_, s)| async move {
                ractor::call_t!(s, |reply| SessionMsg::Drain { reply }, LONG_CALL_MS)
            }));
            let _ = tokio::time::timeout(CANCEL_SETTLE, settle).await;
        }
        let flush = futures::future::join_all(self.channels.iter().map(|(_, c)| async move {
            ractor::call_t!(c, |reply| ChannelMsg::Flush { reply }, LONG_CALL_MS)
        }));
        if tokio::time::timeout(OUTBOX_DRAIN, flush).await.is_err() {
            tracing::warn!(
                "outboxes not drained in time; undelivered replies are sent at the next start"
            );
        }
        self.turns.cancel();
        self.stop_channels.cancel();
        for (_, s) in &sessions {
            s.stop(Some("shutdown".into()));
        }
        for (_, c) in &self.channels {
            c.stop(Some("shutdown".into()));
        }
        self.supervisor.stop(Some("shutdown".into()));
        let _ = self
            .bus
            .stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(5)))
            .await;
        if let Some(m) = self.mcp() {
            m.shutdown().await;
        }
        self.tasks.close();
        if tokio::time::timeout(Duration::from_secs(5), self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("some tasks did not stop in time");
        }
        if let Err(e) = self.store.flush() {
            tracing::error!(error = %e, "final store flush failed");
        }
        tracing::info!("shutdown complete");
    }
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

/// The `message` tool's way out: the durable outbox, then the bus.
struct BusSink {
    bus: std::sync::OnceLock<BusRef>,
    store: Store,
    channels: Vec<String>,
}

impl MessageSink for BusSink {
    fn channels(&self) -> Vec<String> {
        self.channels.clone()
    }

    fn send(&self, msg: clawft_channel_core::OutboundMessage) -> Result<(), String> {
        let bus = self.bus.get().ok_or("the bus is not running")?;
        self.store
            .enqueue_outbound(&msg)
            .map_err(|e| format!("outbox: {e}"))?;
        bus.cast(BusMsg::Outbound(msg))
            .map_err(|_| "the bus stopped; the message stays in the outbox".to_string())
    }
}

/// Each channel adapter's one-line state.
pub async fn channel_states(channels: &[(String, ChannelRef)]) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for (id, c) in channels {
        let st = ractor::call_t!(
            c,
            |reply| ChannelMsg::State { reply },
            ACTOR_CALL_TIMEOUT_MS
        )
        .unwrap_or_else(|e| format!("not answering: {e}"));
        out.insert(id.clone(), serde_json::Value::String(st));
    }
    serde_json::Value::Object(out)
}

/// Status of every live session behind `bus`.
pub async fn live_sessions(bus: &BusRef) -> Vec<SessionStatus> {
    let sessions = ractor::call_t!(
        bus,
        |reply| BusMsg::Sessions { reply },
        ACTOR_CALL_TIMEOUT_MS
    )
    .unwrap_or_default();
    let mut out = Vec::new();
    for (_, s) in sessions {
        if let Ok(st) = ractor::call_t!(
            s,
            |reply| SessionMsg::Status { reply },
            ACTOR_CALL_TIMEOUT_MS
        ) {
            out.push(st);
        }
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    out
}
