//! Builds the actor tree, recovers what a crash left behind, and owns the shutdown order.
//!
//! Start: store → bus → channel actors (intake closed) → resend the outbox → replay the journal
//! → open intake. Stop: close intake → drain sessions (grace, then cancel) → flush outboxes →
//! stop actors → wait for tasks → flush the store.
//!
//! This is the composition root: [`build`] turns `&Config` into objects, [`channels`] builds
//! the chat adapters; the layers below never read the config to assemble themselves.

pub mod build;
pub mod channels;
pub mod cluster_state;

pub use build::{
    access_rules, build_model, build_model_sharing, build_registry, connect_hint, protected_paths,
    start_mcp,
};

use std::sync::Arc;
use std::time::Duration;

use clawft_channel_core::Channel;
use ractor::Actor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::bus::{BusActor, BusArgs, BusMsg, BusRef, Inbox};
use crate::config::Config;
use crate::egress::{ChannelActor, ChannelArgs, ChannelEntry, ChannelMsg, ChannelTable, Outbox};
use crate::ingress::access::Access;
use crate::llm::{DynModel, LlmError};
use crate::mcp::client::McpManager;
use crate::session::{SessionHooks, SessionMsg, SessionStatus};
use crate::store::{Store, StoreError};
use crate::tools::message::MessageSink;
use crate::tools::Workspace;
use crate::turn::AgentDeps;
use crate::types::RwLockExt;

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

/// Each agent's name, tools and workspace (the default agent first).
pub type AgentHandles = Vec<(
    String,
    Arc<crate::tools::registry::ToolsHandle>,
    Arc<Workspace>,
)>;

/// The MCP manager in force, shared with the admin API (replaced on a reload).
pub type McpSlot = Arc<std::sync::RwLock<Option<Arc<McpManager>>>>;

/// The running daemon.
pub struct Daemon {
    bus: BusRef,
    inbox: Inbox,
    /// Persists and routes through the one table of running channels (the `message` tool and
    /// the admin API read the same one, so a reload is seen everywhere).
    outbox: Outbox,
    store: Store,
    tasks: TaskTracker,
    intake: CancellationToken,
    stop_channels: CancellationToken,
    open: CancellationToken,
    turns: CancellationToken,
    grace: Duration,
    mcp: McpSlot,
    tools: Arc<crate::tools::registry::ToolsHandle>,
    /// The other agents' tools and workspaces (`agents.NAME`), reloaded with the default's.
    others: Vec<(String, AgentRuntime)>,
    approvals: Arc<crate::approval::Approvals>,
    subagents: Arc<crate::subagent::SubagentHub>,
    /// The memory search service (its indexes survive a tools reload).
    memory: Arc<crate::memory::service::MemoryService>,
    /// Scheduled jobs and the heartbeat.
    scheduler: Arc<crate::scheduler::Scheduler>,
    /// The `gateway` tool's controls, filled in by `weft gateway` (kept across reloads).
    gateway: crate::tools::gateway::GatewaySlot,
    /// The `nodes` tool's hub, filled in by `weft gateway` (kept across reloads).
    nodes: crate::tools::nodes::NodesSlot,
    /// Background processes of every session (`process`; kept across reloads).
    processes: Arc<crate::tools::exec::process::ProcessTable>,
    /// What the session tools read and send to (outlives registry rebuilds).
    sessions: Arc<crate::session::tools::SessionDirectory>,
    /// Downloads, transcription, speech and images (settings taken at start).
    media: Arc<crate::media::Media>,
    supervisor: crate::subagent::SupervisorRef,
    /// The workspace of every session, to refresh its protected paths on reload.
    workspace: Arc<Workspace>,
    /// Prices and budgets (reloaded on SIGHUP).
    usage: Arc<crate::turn::usage::UsageLedger>,
    /// This node in the cluster (cluster mode), for channels started on a reload.
    cluster: Option<crate::cluster::Cluster>,
    /// Pairing shared with the cluster (cluster mode), for the access rules of a reload.
    shared_access: Option<crate::ingress::access::SharedAccess>,
    config: Config,
}

impl Daemon {
    /// Start a channel: its actor (outbox worker) and its inbound side (listener and ingress
    /// pump), each with a stop token that is a child of the daemon's, entered in the table.
    async fn start_channel(
        &self,
        ch: Arc<dyn Channel>,
        access: &Arc<Access>,
    ) -> Result<(), DaemonError> {
        start_channel(
            ChannelKit {
                store: &self.store,
                inbox: &self.inbox,
                outbox: &self.outbox,
                intake: &self.intake,
                open: &self.open,
                stop: &self.stop_channels,
                tasks: &self.tasks,
                max_inbound_bytes: self.config.max_inbound_bytes,
                chat_channels: &self.config.chat_channels,
                cluster: self.cluster.as_ref(),
            },
            ch,
            access,
        )
        .await
    }
}

/// Whether channel `id` journals its messages in the cluster (cluster mode): the chat
/// channels do; the HTTP API, the OpenAI endpoint and the web chat answer on the node that
/// received the request.
fn clustered(chat_channels: &[crate::config::ChatChannelConfig], id: &str) -> bool {
    chat_channels.iter().any(|c| c.id() == id)
}

/// What starting a channel needs.
struct ChannelKit<'a> {
    store: &'a Store,
    inbox: &'a Inbox,
    outbox: &'a Outbox,
    intake: &'a CancellationToken,
    open: &'a CancellationToken,
    stop: &'a CancellationToken,
    tasks: &'a TaskTracker,
    /// `channels.max_inbound_bytes` (fixed at start, as the HTTP API's own check).
    max_inbound_bytes: usize,
    /// The chat channels' settings (`max_chats_in_flight`).
    chat_channels: &'a [crate::config::ChatChannelConfig],
    /// Cluster mode: the chat channels journal their messages in the cluster.
    cluster: Option<&'a crate::cluster::Cluster>,
}

async fn start_channel(
    kit: ChannelKit<'_>,
    ch: Arc<dyn Channel>,
    access: &Arc<Access>,
) -> Result<(), DaemonError> {
    let id = ch.id().to_string();
    let caps = ch.capabilities();
    let adapter = Arc::downgrade(&ch);
    let stop = kit.stop.child_token();
    let (actor, _) = Actor::spawn(
        None,
        ChannelActor,
        ChannelArgs {
            channel: ch.clone(),
            store: kit.store.clone(),
            stop: stop.clone(),
            tasks: kit.tasks.clone(),
            max_chats_in_flight: kit
                .chat_channels
                .iter()
                .find(|c| c.id() == id)
                .map_or(crate::egress::DEFAULT_MAX_CHATS_IN_FLIGHT, |c| {
                    c.max_chats_in_flight
                }),
        },
    )
    .await
    .map_err(|e| DaemonError::Spawn(e.to_string()))?;
    crate::ingress::pump::spawn(
        crate::ingress::pump::IngressArgs {
            channel: ch,
            store: kit.store.clone(),
            inbox: kit.inbox.clone(),
            outbox: kit.outbox.clone(),
            access: access.clone(),
            intake: kit.intake.clone(),
            open: kit.open.clone(),
            stop: stop.clone(),
            max_inbound_bytes: kit.max_inbound_bytes,
            cluster: kit
                .cluster
                .filter(|_| clustered(kit.chat_channels, &id))
                .cloned(),
        },
        kit.tasks,
    );
    kit.outbox.channels().insert(
        &id,
        ChannelEntry {
            actor,
            caps,
            stop,
            adapter,
        },
    );
    Ok(())
}

/// The daemon's services every agent shares.
#[derive(Clone)]
struct Shared {
    store: Store,
    outbox: Outbox,
    approvals: Arc<crate::approval::Approvals>,
    mcp: Option<Arc<McpManager>>,
    memory: Arc<crate::memory::service::MemoryService>,
    subagents: Arc<crate::subagent::SubagentHub>,
    scheduler: Arc<crate::scheduler::Scheduler>,
    gateway: crate::tools::gateway::GatewaySlot,
    nodes: crate::tools::nodes::NodesSlot,
    usage: Arc<crate::turn::usage::UsageLedger>,
    processes: Arc<crate::tools::exec::process::ProcessTable>,
    /// What the session tools read and send to.
    sessions: Arc<crate::session::tools::SessionDirectory>,
    /// Downloads, transcription, speech and images.
    media: Arc<crate::media::Media>,
}

impl Shared {
    /// The registry of the agent `config` is for, over the shared services.
    fn registry(
        &self,
        config: &Config,
        mcp: Option<Arc<McpManager>>,
    ) -> crate::tools::ToolRegistry {
        build_registry(
            config,
            Some(Arc::new(self.outbox.clone()) as Arc<dyn MessageSink>),
            Some(self.approvals.clone() as Arc<dyn crate::tools::shell_policy::Approver>),
            mcp.into_iter()
                .map(|m| m as Arc<dyn crate::tools::registry::ToolSource>)
                .collect(),
            build::RegistryParts {
                subagents: Some(self.subagents.clone()),
                memory: Some(self.memory.clone()),
                scheduler: Some(self.scheduler.clone()),
                gateway: Some(self.gateway.clone()),
                nodes: Some(self.nodes.clone()),
                processes: Some(self.processes.clone()),
                sessions: Some(self.sessions.clone()),
                canvas: Some(self.store.clone()),
                media: Some(self.media.clone()),
            },
        )
    }
}

/// The line the system prompt gets in cluster mode: workspace files are per node.
pub const PER_NODE_FILES: &str = "\nCluster: files you write (except memory and context files) stay on this node; a later turn may run on another node without them.";

/// One agent's own parts: its workspace and its tools (replaced on a reload).
struct AgentRuntime {
    workspace: Arc<Workspace>,
    tools: Arc<crate::tools::registry::ToolsHandle>,
}

/// The workspace of the agent `config` is for, with the paths no tool may touch.
fn open_workspace(config: &Config) -> Result<Arc<Workspace>, DaemonError> {
    let ws = Workspace::open(&config.agent.workspace)
        .map_err(|e| DaemonError::Workspace {
            path: config.agent.workspace.display().to_string(),
            source: e,
        })?
        .with_protected(&protected_paths(config))
        .with_users_dir(build::users_dir(config));
    Ok(Arc::new(ws))
}

impl AgentRuntime {
    fn start(config: &Config, workspace: Arc<Workspace>, shared: &Shared) -> Self {
        let tools =
            crate::tools::registry::ToolsHandle::new(shared.registry(config, shared.mcp.clone()));
        Self { workspace, tools }
    }

    /// The turn dependencies of the agent `config` is for.
    fn deps(&self, config: &Config, model: DynModel, shared: &Shared) -> Arc<AgentDeps> {
        let mut base = crate::session::prompt::system_prompt(None, self.workspace.root());
        if config.cluster.is_some() {
            base.push_str(PER_NODE_FILES);
        }
        let context = Arc::new(crate::turn::context::ContextPrompt::new(
            &base,
            config.agent.system_prompt.as_deref(),
            self.workspace.clone(),
        ));
        Arc::new(AgentDeps {
            model,
            tools: self.tools.clone(),
            store: shared.store.clone(),
            agent: Arc::new(config.agent.clone()),
            context,
            workspace: self.workspace.clone(),
            connect_hint: connect_hint(config).map(Into::into),
            provider_hints: Arc::new(config.provider_hints()),
            skills_global: Some(config.home.join("skills")),
            usage: shared.usage.clone(),
            memory_scope: config.memory.scope,
        })
    }
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
        Self::start_in(config, store, model, channels, None).await
    }

    /// [`Daemon::start`] as a node of `cluster` (cluster mode): the chat channels' messages
    /// are journaled in the cluster and processed by their partition's owner.
    ///
    /// # Errors
    /// As [`Daemon::start`].
    pub async fn start_in(
        config: &Config,
        store: Store,
        model: DynModel,
        channels: Vec<Arc<dyn Channel>>,
        cluster: Option<crate::cluster::Cluster>,
    ) -> Result<Self, DaemonError> {
        // Cluster mode: what this node shares with the others, given to each piece below at
        // construction; the store tells finished turns to the session log from here on.
        let shared_state = cluster_state::SharedState::of(cluster.as_ref());
        #[cfg(feature = "cluster")]
        let log = cluster
            .as_ref()
            .map(|c| crate::cluster::session_log::SessionLog::new(c.settings().partitions));
        #[cfg(feature = "cluster")]
        let store = match &log {
            Some(l) => store.with_replica(Arc::new(l.clone())),
            None => store,
        };
        let workspace = open_workspace(config)?;
        let docs = match &shared_state.seam {
            Some(seam) => {
                let d =
                    crate::tools::shared_docs::MemoryDocs::shared(seam.clone(), workspace.clone());
                tokio::spawn(d.clone().follow());
                d
            }
            None => crate::tools::shared_docs::MemoryDocs::default(),
        };
        let shared = shared_pieces(config, &store, &workspace, docs, &shared_state)?;
        let Shared {
            outbox,
            approvals,
            mcp,
            memory,
            subagents,
            scheduler,
            gateway,
            nodes,
            usage,
            processes,
            sessions,
            media,
            ..
        } = shared.clone();
        let StartedAgents {
            main,
            agents,
            others,
        } = start_agents(config, model, &shared, &workspace)?;
        let tools = main.tools.clone();
        let tasks = TaskTracker::new();
        let turns = CancellationToken::new();
        let (bus, _) = Actor::spawn(
            None,
            BusActor,
            BusArgs {
                agents: agents.clone(),
                store: store.clone(),
                hooks: SessionHooks {
                    outbox: outbox.clone(),
                    approvals: Some(approvals.clone()),
                    subagents: Some(subagents.clone() as Arc<dyn crate::session::SubagentTree>),
                    scheduler: Some(scheduler.clone()),
                    processes: Some(processes.clone()),
                    media: Some(media.clone()),
                },
                tasks: tasks.clone(),
                shutdown: turns.clone(),
                idle: config.sessions.idle,
                max_queue: config.sessions.max_queue,
                max_live: config.sessions.max_in_memory,
            },
        )
        .await
        .map_err(|e| DaemonError::Spawn(e.to_string()))?;
        let inbox = Inbox::new(bus.clone());
        let intake = CancellationToken::new();
        // Before the journal is replayed: it fails the tasks a crash interrupted and journals
        // their announcements, which the replay below then routes.
        let supervisor = crate::subagent::start(crate::subagent::SupervisorArgs {
            hub: subagents.clone(),
            store: store.clone(),
            agents,
            inbox: inbox.clone(),
            tasks: tasks.clone(),
            root_cancel: turns.child_token(),
            intake: intake.clone(),
        })
        .await
        .map_err(|e| DaemonError::Spawn(format!("subagent supervisor: {e}")))?;

        let shared_access = shared_state.access.clone();
        if let Some(a) = &shared_access {
            a.mirror(&store);
        }
        let access = Arc::new(access_rules(config).with_shared(shared_access.clone()));
        let stop_channels = CancellationToken::new();
        let open = CancellationToken::new();
        for ch in channels {
            start_channel(
                ChannelKit {
                    store: &store,
                    inbox: &inbox,
                    outbox: &outbox,
                    intake: &intake,
                    open: &open,
                    stop: &stop_channels,
                    tasks: &tasks,
                    max_inbound_bytes: config.max_inbound_bytes,
                    chat_channels: &config.chat_channels,
                    cluster: cluster.as_ref(),
                },
                ch,
                &access,
            )
            .await?;
        }

        replay(
            &store,
            &outbox,
            &approvals,
            &inbox,
            config,
            cluster.is_some(),
        )?;
        open.cancel();
        #[cfg(feature = "cluster")]
        if let (Some(c), Some(log)) = (&cluster, log) {
            let route_inbox = inbox.clone();
            // The partitions' sessions are recorded in the cluster's session log.
            let send_outbox = outbox.clone();
            crate::cluster::inbound::spawn_partitions(
                c,
                &crate::cluster::inbound::Consume {
                    store: store.clone(),
                    route: Arc::new(move |e| route_inbox.route(e)),
                    intake: intake.clone(),
                    done: turns.clone(),
                    log: Some(log),
                    send: Arc::new(move |m| send_outbox.route(m)),
                },
                &tasks,
            );
        }
        // After the replay: a run journaled before a crash is found again as a duplicate and
        // waits for its replayed turn instead of starting twice.
        let route_inbox = inbox.clone();
        scheduler.attach(Arc::new(move |e| route_inbox.route(e)));
        let route_inbox = inbox.clone();
        sessions.attach(Arc::new(move |e| route_inbox.route(e)));
        tasks.spawn(scheduler.clone().run(intake.clone()));
        tasks.spawn(scheduler.clone().run_heartbeat(intake.clone()));

        Ok(Self {
            bus,
            inbox,
            outbox,
            store,
            tasks,
            intake,
            stop_channels,
            open,
            turns,
            grace: config.sessions.shutdown_grace,
            mcp: Arc::new(std::sync::RwLock::new(mcp)),
            tools,
            others,
            approvals,
            subagents,
            memory,
            scheduler,
            gateway,
            nodes,
            processes,
            sessions,
            media,
            supervisor,
            workspace,
            usage,
            cluster,
            shared_access,
            config: config.clone(),
        })
    }

    /// This node in the cluster: channels started by a reload run behind their leases too.
    pub fn set_cluster(&mut self, cluster: Option<crate::cluster::Cluster>) {
        self.cluster = cluster;
    }

    /// The pending and recent approvals (for the admin API).
    pub fn approvals(&self) -> &Arc<crate::approval::Approvals> {
        &self.approvals
    }

    /// The usage ledger (prices, budgets, today's spend).
    pub fn usage(&self) -> &Arc<crate::turn::usage::UsageLedger> {
        &self.usage
    }

    /// The scheduler (for the admin API and `weft status`).
    pub fn scheduler(&self) -> &Arc<crate::scheduler::Scheduler> {
        &self.scheduler
    }

    /// The slot of the `gateway` tool's controls: `weft gateway` fills it once it runs.
    pub fn gateway_slot(&self) -> &crate::tools::gateway::GatewaySlot {
        &self.gateway
    }

    /// The slot of the `nodes` tool's hub: `weft gateway` fills it once it runs.
    pub fn nodes_slot(&self) -> &crate::tools::nodes::NodesSlot {
        &self.nodes
    }

    /// The bus (for the admin API and tools).
    pub fn bus(&self) -> &BusRef {
        &self.bus
    }

    /// Apply a new configuration without dropping sessions: the tool policy, rate limit and
    /// tool settings (a new registry for turns that start from now on) and the MCP servers
    /// (restarted when their section changed), the chat channels, prices and budgets. Returns
    /// what changed; settings that need a restart (providers, HTTP API, store, agents,
    /// sessions, memory, scheduler, heartbeat …) are reported as such and keep their old
    /// values. The diff is always against the settings in force.
    pub async fn reload(&mut self, new: Config) -> Vec<String> {
        let old = self.config.clone();
        let old = &old;
        let mut changes = Vec::new();
        let mcp_changed = old.tools.mcp_servers != new.tools.mcp_servers
            || old.tools.mcp_connect_wait != new.tools.mcp_connect_wait;
        let tools_changed = mcp_changed
            || old.tools.policy != new.tools.policy
            || old.tools.rate_limit != new.tools.rate_limit
            || old.tools.message_allow != new.tools.message_allow
            || old.tools.exec != new.tools.exec
            || old.tools.files != new.tools.files
            || old.tools.web_fetch != new.tools.web_fetch
            || old.tools.web_search != new.tools.web_search
            || old.tools.subagents != new.tools.subagents
            || old.tools.custom != new.tools.custom
            || old.tools.sessions != new.tools.sessions
            || old.secrets != new.secrets;
        if mcp_changed {
            let old_mcp = self.mcp.write_locked().take();
            if let Some(m) = old_mcp {
                m.shutdown().await;
            }
            *self.mcp.write_locked() = start_mcp(&new);
            changes.push(format!(
                "MCP servers restarted ({} configured)",
                new.tools.mcp_servers.len()
            ));
        }
        if old.usage != new.usage {
            self.usage.set_config(new.usage.clone());
            changes.push("prices and budgets reloaded".into());
        }
        if old.tools.exec.approver_rules != new.tools.exec.approver_rules {
            // Judged when an answer arrives: questions already asked follow the new rules.
            self.approvals
                .set_rules(new.tools.exec.approver_rules.clone());
        }
        if old.tools.subagents != new.tools.subagents {
            self.subagents.set_settings(new.tools.subagents.clone());
            changes.push("subagent limits reloaded (running subagents keep theirs)".into());
        }
        if tools_changed {
            let shared = Shared {
                store: self.store.clone(),
                outbox: self.outbox.clone(),
                approvals: self.approvals.clone(),
                mcp: self.mcp(),
                memory: self.memory.clone(),
                subagents: self.subagents.clone(),
                scheduler: self.scheduler.clone(),
                gateway: self.gateway.clone(),
                nodes: self.nodes.clone(),
                usage: self.usage.clone(),
                processes: self.processes.clone(),
                sessions: self.sessions.clone(),
                media: self.media.clone(),
            };
            self.tools.replace(shared.registry(&new, self.mcp()));
            for (name, rt) in &self.others {
                // An agent removed from the new file keeps its tools until the restart.
                if let Some(view) = new.for_agent(name) {
                    rt.tools.replace(shared.registry(&view, self.mcp()));
                }
            }
            changes.push("tools: policy, limits and tool settings reloaded".into());
        }
        let channel_changes = self.reload_channels(&new).await;
        changes.extend(channel_changes);
        // Every setting of the new file is applied above or reported here as waiting for a
        // restart: the exhaustive pattern fails the build on a new field until it is sorted.
        let Config {
            // Not settings of the file: where it was read, what the process was given.
            path: _,
            home: _,
            agent_name: _,
            provenance: _,
            notify_socket: _,
            watchdog: _,
            deferred_secrets: _,
            // Applied above.
            tools,
            secrets,
            chat_channels,
            usage,
            // Taken at start-up only.
            agent,
            agents,
            bindings,
            hooks,
            media,
            providers,
            provider_source: _,
            http,
            store,
            sessions,
            max_inbound_bytes,
            memory,
            scheduler,
            heartbeat,
            // `weft node`'s settings: the gateway does not use them.
            node,
            cluster,
        } = new;
        for (what, changed) in [
            ("providers", old.providers != providers),
            ("channels.http", old.http != http),
            (
                "channels.max_inbound_bytes",
                old.max_inbound_bytes != max_inbound_bytes,
            ),
            ("store", old.store != store),
            ("agents", old.agent != agent || old.agents != agents),
            ("bindings", old.bindings != bindings),
            ("sessions", old.sessions != sessions),
            ("media", old.media != media),
            (
                "hooks",
                crate::config::hooks::fingerprint(&old.hooks)
                    != crate::config::hooks::fingerprint(&hooks),
            ),
            ("memory", old.memory != memory),
            ("scheduler", old.scheduler != scheduler),
            ("heartbeat", old.heartbeat != heartbeat),
            ("cluster", old.cluster != cluster),
        ] {
            if changed {
                changes.push(format!("{what} changed: takes effect at the next restart"));
            }
        }
        if old.node != node {
            changes.push(
                "node changed: the settings of `weft node`, not used by the gateway; a node host reads them at its next restart"
                    .into(),
            );
        }
        // What runs now: the applied values, and the old ones of what waits for a restart, so
        // the next diff is against what is in force (a setting applied, then removed, is
        // reported and undone).
        let mut kept = self.config.clone();
        kept.tools = tools;
        kept.secrets = secrets;
        kept.chat_channels = chat_channels;
        kept.usage = usage;
        self.config = kept;
        // Secret files may have changed; the store and the workspaces did not (restart).
        self.workspace.set_protected(&protected_paths(&self.config));
        for (name, rt) in &self.others {
            if let Some(view) = self.config.for_agent(name) {
                rt.workspace.set_protected(&protected_paths(&view));
            }
        }
        if changes.is_empty() {
            changes.push("nothing changed".into());
        }
        changes
    }

    /// Stop the chat channels whose section changed or disappeared, start the changed and new
    /// ones (with their new access rules), and resend their undelivered replies.
    async fn reload_channels(&mut self, new: &Config) -> Vec<String> {
        use crate::config::ChatChannelConfig;
        // Compared by value (tokens included: `Secret` compares its value).
        let old: std::collections::HashMap<String, &ChatChannelConfig> = self
            .config
            .chat_channels
            .iter()
            .map(|c| (c.id(), c))
            .collect();
        let fresh: std::collections::HashMap<String, &ChatChannelConfig> =
            new.chat_channels.iter().map(|c| (c.id(), c)).collect();
        let mut changes = Vec::new();
        let stale: Vec<String> = old
            .iter()
            .filter(|(n, f)| fresh.get(*n) != Some(*f))
            .map(|(n, _)| n.clone())
            .collect();
        for name in &stale {
            if let Some(e) = self.outbox.channels().remove(name) {
                e.stop.cancel();
                e.actor.stop(Some("reload".into()));
            }
            if !fresh.contains_key(name.as_str()) {
                changes.push(format!("channel {name} stopped"));
            }
        }
        // Agents and bindings change at the next restart: a restarted channel keeps routing
        // to the agents that run.
        let access = Arc::new(
            access_rules(new)
                .with_bindings(self.config.bindings.clone())
                .with_shared(self.shared_access.clone()),
        );
        for c in &new.chat_channels {
            let name = c.id();
            let name = name.as_str();
            if old.get(name) == fresh.get(name) {
                continue;
            }
            let Some(ch) = channels::chat_channel(c, &self.store, self.cluster.as_ref()) else {
                changes.push(format!("channel {name} could not start (see the log)"));
                continue;
            };
            match self.start_channel(ch, &access).await {
                Ok(()) => {
                    for m in self.store.pending_outbound().unwrap_or_default() {
                        if m.channel.as_str() == name {
                            self.outbox.route(m);
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
        changes
    }

    /// The live table of running channels (for the admin API and tests).
    pub fn channel_table(&self) -> ChannelTable {
        self.outbox.channels().clone()
    }

    /// The outbox handle (persist, then route).
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// The configuration in force: what a reload applied, the start-up values of what waits
    /// for a restart.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Every agent's name, tools and workspace (the default one first) and the memory search
    /// service, for the admin API's Agents page.
    pub fn agent_parts(&self) -> (AgentHandles, Arc<crate::memory::service::MemoryService>) {
        let mut agents = vec![(
            crate::types::session_key::DEFAULT_AGENT.to_string(),
            self.tools.clone(),
            self.workspace.clone(),
        )];
        for (name, rt) in &self.others {
            agents.push((name.clone(), rt.tools.clone(), rt.workspace.clone()));
        }
        (agents, self.memory.clone())
    }

    /// The shared slot of the MCP manager (for the admin API).
    pub fn mcp_slot(&self) -> McpSlot {
        self.mcp.clone()
    }

    /// The MCP servers, when any is configured.
    pub fn mcp(&self) -> Option<Arc<McpManager>> {
        self.mcp.read_locked().clone()
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
        let channels = self.outbox.channels().actors();
        let flush = futures::future::join_all(channels.iter().map(|(_, c)| async move {
            ractor::call_t!(c, |reply| ChannelMsg::Flush { reply }, LONG_CALL_MS)
        }));
        if tokio::time::timeout(OUTBOX_DRAIN, flush).await.is_err() {
            tracing::warn!(
                "outboxes not drained in time; undelivered replies are sent at the next start"
            );
        }
        self.turns.cancel();
        // Turns are over: no new background process can start; kill and reap the rest.
        self.processes.shutdown().await;
        self.stop_channels.cancel();
        // Wait for the actors to stop, not only ask them: their states hold store handles, and
        // the store's lock is released only when the last one is dropped (a gateway started
        // right after this returns must be able to open it).
        let stopped = Some(Duration::from_secs(5));
        let why = || Some("shutdown".to_string());
        futures::future::join_all(
            sessions
                .iter()
                .map(|(_, s)| s.stop_and_wait(why(), stopped)),
        )
        .await;
        futures::future::join_all(
            channels
                .iter()
                .map(|(_, c)| c.stop_and_wait(why(), stopped)),
        )
        .await;
        let _ = self.supervisor.stop_and_wait(why(), stopped).await;
        let _ = self.bus.stop_and_wait(why(), stopped).await;
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
        if let Err(e) = self.store.flush_async().await {
            tracing::error!(error = %e, "final store flush failed");
        }
        tracing::info!("shutdown complete");
    }
}

/// Each channel adapter's one-line state.
pub async fn channel_states(channels: &ChannelTable) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for (id, c) in channels.actors() {
        let st = ractor::call_t!(
            c,
            |reply| ChannelMsg::State { reply },
            ACTOR_CALL_TIMEOUT_MS
        )
        .unwrap_or_else(|e| format!("not answering: {e}"));
        out.insert(id, serde_json::Value::String(st));
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

/// What every agent of the daemon shares (store, outbox, approvals, MCP, memory, subagents,
/// scheduler, usage, processes, sessions, media), each given its cluster handle when
/// `shared_state` has one.
fn shared_pieces(
    config: &Config,
    store: &Store,
    workspace: &Arc<Workspace>,
    docs: crate::tools::shared_docs::MemoryDocs,
    shared_state: &cluster_state::SharedState,
) -> Result<Shared, DaemonError> {
    let outbox = Outbox::new(store.clone(), ChannelTable::default())
        .with_files(config.home.join("outbox-files"));
    let approvals = crate::approval::Approvals::sharing(
        Arc::new(outbox.clone()) as Arc<dyn MessageSink>,
        shared_state.approvals.clone(),
    );
    approvals.set_rules(config.tools.exec.approver_rules.clone());
    let mcp = start_mcp(config);
    let memory = crate::daemon::build::memory_service(config, Some(store.clone()), docs);
    let subagents = crate::subagent::SubagentHub::new(config.tools.subagents.clone());
    let scheduler = crate::scheduler::Scheduler::over(
        crate::scheduler::JobStore::new(store.clone(), config.scheduler)
            .sharing(shared_state.jobs.clone()),
        store.clone(),
        Some(Arc::new(outbox.clone()) as Arc<dyn MessageSink>),
        config.tools.message_allow.clone(),
        config.heartbeat.clone(),
        workspace.clone(),
    );
    let gateway = crate::tools::gateway::GatewaySlot::default();
    let nodes = crate::tools::nodes::NodesSlot::default();
    let processes = crate::tools::exec::process::ProcessTable::new();
    let usage = Arc::new(
        crate::turn::usage::UsageLedger::load(store.clone(), config.usage.clone())?
            .sharing(shared_state.usage.clone()),
    );
    let sessions = crate::session::tools::SessionDirectory::new(store.clone());
    sessions.set_usage(usage.clone());
    let media = Arc::new(
        crate::media::Media::new(config.media.clone())
            .map_err(|e| DaemonError::Spawn(e.to_string()))?,
    );
    Ok(Shared {
        store: store.clone(),
        outbox,
        approvals,
        mcp,
        memory,
        subagents,
        scheduler,
        gateway,
        nodes,
        usage,
        processes,
        sessions,
        media,
    })
}

/// What [`start_agents`] started.
struct StartedAgents {
    /// The default agent's runtime.
    main: AgentRuntime,
    /// Every agent's dependencies, as the bus routes to them.
    agents: crate::turn::Agents,
    /// The named agents' runtimes.
    others: Vec<(String, AgentRuntime)>,
}

/// The default agent's runtime and every named agent's (`agents.NAME`, a new one's workspace
/// given the context-file templates), their dependencies as the bus sees them.
fn start_agents(
    config: &Config,
    model: DynModel,
    shared: &Shared,
    workspace: &Arc<Workspace>,
) -> Result<StartedAgents, DaemonError> {
    let main = AgentRuntime::start(config, workspace.clone(), shared);
    // Every agent's calls count in the one provider health the gateway reports.
    let health = model.health();
    let deps = main.deps(config, model, shared);
    let mut named = std::collections::BTreeMap::new();
    let mut others = Vec::new();
    for a in &config.agents {
        let Some(view) = config.for_agent(&a.name) else {
            continue;
        };
        // A new agent's workspace gets the context-file templates, as onboard writes them
        // for the first one.
        let fresh = !view.agent.workspace.exists();
        let ws = open_workspace(&view)?;
        if fresh {
            match crate::turn::context::write_templates(&view.agent.workspace) {
                Ok(files) => {
                    tracing::info!(agent = %a.name, files = files.len(), "new agent workspace: context-file templates written")
                }
                Err((path, e)) => {
                    tracing::warn!(agent = %a.name, path = %path.display(), error = %e, "could not write a context-file template")
                }
            }
        }
        let rt = AgentRuntime::start(&view, ws, shared);
        let d = rt.deps(&view, build_model_sharing(&view, health.clone())?, shared);
        tracing::info!(agent = %a.name, workspace = %view.agent.workspace.display(), model = %view.providers.first().map_or("", |p| p.model.as_str()), "agent ready");
        named.insert(a.name.clone(), d);
        others.push((a.name.clone(), rt));
    }
    let agents = crate::turn::Agents::new(deps, named);
    for (name, d) in agents.iter() {
        if let Err(e) = crate::session::window::check_fits(d) {
            tracing::error!(agent = name, "{e}");
        }
        if let Some(capped) = d.agent.window.budget_capped() {
            tracing::warn!(agent = name, "{capped}");
        }
    }
    Ok(StartedAgents {
        main,
        agents,
        others,
    })
}

/// Replay what a crash interrupted: replies answered but not delivered (an approval question
/// from before the restart is dropped: nobody waits for its answer), then messages accepted
/// but not answered (in cluster mode the chat channels' ones are in the cluster's journal,
/// where their partition's owner resumes them).
fn replay(
    store: &Store,
    outbox: &Outbox,
    approvals: &crate::approval::Approvals,
    inbox: &Inbox,
    config: &Config,
    clustered_mode: bool,
) -> Result<(), DaemonError> {
    // Replies answered before a crash but not delivered.
    let outbound = store.pending_outbound()?;
    if !outbound.is_empty() {
        tracing::info!(count = outbound.len(), "resending undelivered replies");
    }
    let swept = outbox.sweep_staged(&outbound);
    if swept > 0 {
        tracing::info!(
            count = swept,
            "removed attachment copies of messages never queued"
        );
    }
    for m in outbound {
        // An approval question from before the restart: nobody waits for its answer.
        if approvals.expired_at_start(&m) {
            if let Err(e) = store.outbound_done(&m.id) {
                tracing::warn!(error = %e, "could not drop an expired approval question");
            }
            continue;
        }
        outbox.route(m);
    }
    // Messages accepted before a crash but not answered (in cluster mode, the chat
    // channels' ones are in the cluster's journal: their partition's owner resumes them).
    let mut inbound = store.pending_inbound()?;
    if clustered_mode {
        inbound.retain(|e| {
            e.event
                .as_ref()
                .is_none_or(|ev| !clustered(&config.chat_channels, ev.channel.as_str()))
        });
    }
    if !inbound.is_empty() {
        tracing::info!(
            count = inbound.len(),
            "processing messages accepted before a restart"
        );
    }
    for e in inbound {
        inbox.route(e);
    }
    Ok(())
}
