//! The admin side of the local HTTP API (`/v1/status`, `/v1/sessions`, `/readyz`, the
//! `/v1/admin/*` commands, among them the scheduler's `cron/*` in [`cron`]), the status report
//! that `weft status` prints whether it reads the store directly or asks a running gateway, and
//! the `gateway` tool's controls ([`ops`]).

pub mod cron;
pub mod hooks;
pub mod inspect;
pub mod nodes;
pub mod ops;
pub mod request;
pub mod sessions;

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use serde_json::{json, Value};

use crate::bus::{BusMsg, BusRef};
use crate::config::Config;
use crate::egress::{ChannelTable, Outbox};
use crate::session::SessionStatus;
use crate::store::usage::UsageRow;
use crate::store::Store;
use crate::types::RwLockExt;
use crate::types::SessionKey;
use clawft_channel_http::AdminError;
use request::{AdminRequest, PairingRequest};

/// Timeout of a `Clear` call through the bus.
const CLEAR_TIMEOUT_MS: u64 = 35_000;

/// The status report (`weft status`, `GET /v1/status`).
pub fn status_json(config: &Config, store: &Store, live: Option<&[SessionStatus]>) -> Value {
    let stored = store.sessions().map(|s| s.len()).unwrap_or(0);
    json!({
        "config": config.path.as_ref().map(|p| p.display().to_string()),
        "workspace": config.agent.workspace.display().to_string(),
        "store": {
            "path": store.path().map(|p| p.display().to_string()),
            "size_bytes": store.size_on_disk(),
            "health": store.health(),
            "schema": store.manifest().map(|m| m.schema),
        },
        "providers": config.providers.iter().map(|p| json!({
            "name": p.name,
            "base_url": crate::types::scrub::redact_url(&p.base_url),
            "model": p.model,
            "api_key": p.api_key.is_some(),
        })).collect::<Vec<_>>(),
        "provider_source": config.provider_source.to_string(),
        "channels": {
            "http": if config.http.enabled { Value::String(config.http.bind.to_string()) } else { Value::Null },
            "chat": config.chat_channels.iter().map(|c| json!({
                "channel": c.id(),
                "allow_from": c.allow_from.len(),
                "pairing": c.pairing,
                "group_mode": if c.group_all { "all" } else { "mention" },
            })).collect::<Vec<_>>(),
        },
        "sessions": {
            "stored": stored,
            "live": live.map(<[SessionStatus]>::len),
        },
        "tools": {
            "profile": config.tools.policy.profile().as_str(),
            "exec_mode": config.tools.exec.mode.as_str(),
            "sandbox": sandbox_json(config),
        },
        "memory": crate::memory::service::saved_stats(&config.home, &config.memory, &config.agent.workspace),
        "scheduler": cron::scheduler_json(
            &crate::scheduler::JobStore::new(store.clone(), config.scheduler)
                .list()
                .unwrap_or_default(),
            config.heartbeat.as_ref(),
            None,
        ),
        "pid": std::process::id(),
    })
}

/// What the exec sandbox and jail enforce on this kernel, and a warning when they cannot.
fn sandbox_json(config: &Config) -> Value {
    let st = crate::tools::exec::sandbox_status(&config.tools.exec);
    let mut v = serde_json::to_value(st).unwrap_or(Value::Null);
    v["enabled"] = json!(config.tools.exec.sandbox);
    v["summary"] = json!(st.summary());
    if !config.tools.exec.sandbox {
        v["warning"] = json!("tools.exec.sandbox = false: commands run unconfined");
    } else if !st.fs_enforced {
        v["warning"] = json!(
            "Landlock is unavailable on this kernel: exec_shell and spawn run without the filesystem sandbox"
        );
    } else if st.jail.is_some_and(|j| !j.pid_namespace) {
        v["warning"] = json!(
            "commands cannot get their own namespaces here: they have no network at all (seccomp) and processes that leave their process group can outlive them; allow user, network and pid namespaces"
        );
    }
    v
}

/// Stored sessions as JSON rows.
///
/// # Errors
/// Store failure.
pub fn sessions_json(store: &Store) -> Result<Value, AdminError> {
    let rows = store.sessions().map_err(internal)?;
    Ok(json!({
        "sessions": rows.iter().map(|m| json!({
            "key": m.key.as_str(),
            "messages": m.next_seq,
            "created_ms": m.created_ms,
            "updated_ms": m.updated_ms,
        })).collect::<Vec<_>>()
    }))
}

/// One session's transcript as JSON, or `None` if it is not stored.
///
/// # Errors
/// Invalid key (bad request) or store failure (internal).
pub fn session_json(
    store: &Store,
    key: &str,
    windows: &sessions::Windows,
) -> Result<Option<Value>, AdminError> {
    let key = SessionKey::parse(key).map_err(bad_request)?;
    let Some(meta) = store.session_meta(&key).map_err(internal)? else {
        return Ok(None);
    };
    let msgs = store.load_transcript(&key).map_err(internal)?;
    let today = crate::store::usage::day_of(clawft_channel_core::now_ms());
    let (mut all, mut day) = (UsageRow::default(), UsageRow::default());
    for r in store.usage_rows("").map_err(internal)? {
        if r.session == key.as_str() {
            all.add(&r);
            if r.day == today {
                day.add(&r);
            }
        }
    }
    Ok(Some(json!({
        "key": key.as_str(),
        "created_ms": meta.created_ms,
        "updated_ms": meta.updated_ms,
        "usage": { "today": usage_totals(&day), "total": usage_totals(&all) },
        "window": sessions::window_json(store, &key, meta.next_seq, windows)?,
        "messages": msgs,
    })))
}

fn usage_totals(r: &UsageRow) -> Value {
    json!({
        "calls": r.calls,
        "input_tokens": r.input_tokens,
        "cached_tokens": r.cached_tokens,
        "output_tokens": r.output_tokens,
        "estimated_calls": r.estimated_calls,
        "cost_usd": r.cost_usd,
    })
}

/// Token and spend totals of the last `days` UTC days (today included), one row per `by`
/// (`day`, `session`, `model`, `user` or `agent`), with the grand total (`weft usage`).
///
/// # Errors
/// An unknown `by` (bad request) or a store failure.
pub fn usage_json(store: &Store, by: &str, days: u64) -> Result<Value, AdminError> {
    usage_json_stacked(store, by, days, None)
}

/// [`usage_json`] where, with `stack` (one of the same groupings), each row also holds its
/// `parts`: the same totals split by that second grouping (the control UI's stacked chart).
///
/// # Errors
/// An unknown `by` or `stack` (bad request) or a store failure.
pub fn usage_json_stacked(
    store: &Store,
    by: &str,
    days: u64,
    stack: Option<&str>,
) -> Result<Value, AdminError> {
    let since = usage_since(days);
    usage_of(
        store.usage_rows(&since).map_err(internal)?,
        by,
        &since,
        stack,
    )
}

/// One session's usage over the last `days` days, day by day: its turns (the user messages
/// of that day), LLM calls, tokens and spend, and per turn the input tokens and the cost, so
/// a chat's cost per turn can be followed over its life (`weft usage --session KEY`).
///
/// # Errors
/// A key that does not parse, no such session (bad request), or a store failure.
pub fn session_usage_json(store: &Store, key: &str, days: u64) -> Result<Value, AdminError> {
    let key = SessionKey::parse(key).map_err(bad_request)?;
    if store.session_meta(&key).map_err(internal)?.is_none() {
        return Err(bad_request(format!("no session `{key}`")));
    }
    let since = usage_since(days);
    let mut by_day: std::collections::BTreeMap<String, (UsageRow, u64)> = Default::default();
    for r in store.usage_rows(&since).map_err(internal)? {
        if r.session == key.as_str() {
            by_day.entry(r.day.clone()).or_default().0.add(&r);
        }
    }
    for m in store.load_transcript(&key).map_err(internal)? {
        if m.role != crate::llm::Role::User {
            continue;
        }
        if let Some(at) = m.at_ms {
            let day = crate::store::usage::day_of(at);
            if day >= since {
                by_day.entry(day).or_default().1 += 1;
            }
        }
    }
    let per_turn = |r: &UsageRow, turns: u64| {
        let mut v = usage_totals(r);
        v["turns"] = json!(turns);
        if let Some(tokens) = r.input_tokens.checked_div(turns) {
            v["input_tokens_per_turn"] = json!(tokens);
            #[allow(clippy::cast_precision_loss)]
            let cost = r.cost_usd / turns as f64;
            v["cost_usd_per_turn"] = json!(cost);
        }
        v
    };
    let mut total = (UsageRow::default(), 0);
    let rows: Vec<Value> = by_day
        .iter()
        .map(|(day, (r, turns))| {
            total.0.add(r);
            total.1 += turns;
            let mut v = per_turn(r, *turns);
            v["key"] = json!(day);
            v
        })
        .collect();
    Ok(json!({
        "by": "day",
        "session": key.as_str(),
        "since": since,
        "rows": rows,
        "total": per_turn(&total.0, total.1),
    }))
}

/// The first day of the last `days` days (UTC).
fn usage_since(days: u64) -> String {
    let now = clawft_channel_core::now_ms();
    let back = days.max(1).saturating_sub(1).saturating_mul(86_400_000);
    crate::store::usage::day_of(now.saturating_sub(back))
}

/// The group of `r` by `by` (day, session, model, user or agent).
fn usage_key(r: &UsageRow, by: &str) -> Result<String, AdminError> {
    Ok(match by {
        "day" => r.day.clone(),
        "session" => r.session.clone(),
        "model" => r.model.clone(),
        "user" => r.user.clone(),
        "agent" => crate::types::session_key::agent_of(&r.session).to_string(),
        other => {
            return Err(bad_request(format!(
                "unknown grouping `{other}`: use day, session, model, user or agent"
            )))
        }
    })
}

/// `rows` grouped `by` day, session, model, user or agent, with their total (and, with
/// `stack`, each group's parts by that second grouping).
fn usage_of(
    rows: Vec<UsageRow>,
    by: &str,
    since: &str,
    stack: Option<&str>,
) -> Result<Value, AdminError> {
    type Parts = std::collections::BTreeMap<String, UsageRow>;
    let mut groups: std::collections::BTreeMap<String, (UsageRow, Parts)> = Default::default();
    let mut total = UsageRow::default();
    for r in rows {
        let key = usage_key(&r, by)?;
        let part = stack.map(|s| usage_key(&r, s)).transpose()?;
        total.add(&r);
        let g = groups.entry(key).or_default();
        g.0.add(&r);
        if let Some(p) = part {
            g.1.entry(p).or_default().add(&r);
        }
    }
    Ok(json!({
        "by": by,
        "since": since,
        "rows": groups.iter().map(|(k, (r, parts))| {
            let mut v = usage_totals(r);
            v["key"] = json!(k);
            if stack.is_some() {
                v["parts"] = parts.iter().map(|(pk, p)| {
                    let mut pv = usage_totals(p);
                    pv["key"] = json!(pk);
                    pv
                }).collect::<Vec<_>>().into();
            }
            v
        }).collect::<Vec<_>>(),
        "total": usage_totals(&total),
    }))
}

/// `weft usage` in cluster mode: this node's rows (from its store) and every other node's (as
/// they published them), with a total per node under `nodes`. When NATS cannot be read, this
/// node's alone, with `cluster_error` saying why.
#[cfg(feature = "cluster")]
async fn cluster_usage_json(
    cluster: &crate::cluster::Cluster,
    store: &Store,
    by: &str,
    days: u64,
    stack: Option<&str>,
) -> Result<Value, AdminError> {
    let since = usage_since(days);
    let me = cluster.settings().node_id.clone();
    let mine = store.usage_rows(&since).map_err(internal)?;
    let seam = crate::daemon::cluster_state::seam(Some(cluster));
    let read = match seam {
        Some(seam) => crate::turn::shared_usage::by_node(seam, &since).await,
        None => Ok(Default::default()),
    };
    let mut nodes = match read {
        Ok(n) => n,
        Err(e) => {
            let mut v = usage_of(mine, by, &since, stack)?;
            v["cluster_error"] = json!(format!("only this node's usage: {e}"));
            return Ok(v);
        }
    };
    nodes.insert(me, mine);
    let per_node: serde_json::Map<String, Value> = nodes
        .iter()
        .map(|(n, rows)| {
            let mut t = UsageRow::default();
            for r in rows {
                t.add(r);
            }
            (n.clone(), usage_totals(&t))
        })
        .collect();
    let mut v = usage_of(nodes.into_values().flatten().collect(), by, &since, stack)?;
    v["nodes"] = Value::Object(per_node);
    Ok(v)
}

fn internal(e: impl std::fmt::Display) -> AdminError {
    AdminError::Internal(e.to_string())
}

fn bad_request(e: impl std::fmt::Display) -> AdminError {
    AdminError::BadRequest(e.to_string())
}

/// What every admin route answers while the daemon starts.
fn starting() -> AdminError {
    AdminError::Unavailable("starting".into())
}

struct Running {
    bus: BusRef,
    store: Store,
    outbox: Outbox,
    mcp: crate::daemon::McpSlot,
    scheduler: Arc<crate::scheduler::Scheduler>,
    approvals: Arc<crate::approval::Approvals>,
}

impl Running {
    fn channels(&self) -> &ChannelTable {
        self.outbox.channels()
    }

    fn mcp(&self) -> Option<Arc<crate::mcp::client::McpManager>> {
        self.mcp.read_locked().clone()
    }
}

/// The [`clawft_channel_http::Admin`] implementation: filled in once the daemon runs.
#[derive(Clone)]
pub struct AdminApi {
    config: Arc<Config>,
    running: Arc<OnceLock<Running>>,
    nodes: Arc<OnceLock<Arc<nodes::NodeHub>>>,
    /// The configuration in force (`config/show`), replaced when a reload applies.
    in_force: Arc<std::sync::RwLock<Arc<inspect::InForce>>>,
    /// Where `config/reload` asks the gateway's main loop for a reload.
    reloads: Arc<OnceLock<tokio::sync::mpsc::Sender<ops::ReloadRequest>>>,
    /// The agents' tools and workspaces and the memory service (`agents/list`, `memory/*`).
    inspect: Arc<OnceLock<inspect::Inspect>>,
    /// This node in the cluster (cluster mode): its health gates `/readyz`.
    cluster: Arc<OnceLock<crate::cluster::Cluster>>,
    /// The health of the providers the gateway calls (`status`, `/readyz`).
    providers: Arc<OnceLock<crate::llm::health::ProviderHealth>>,
}

impl AdminApi {
    /// Admin API for `config`; answers "starting" until [`AdminApi::attach`].
    pub fn new(config: Arc<Config>) -> Self {
        Self {
            in_force: Arc::new(std::sync::RwLock::new(Arc::new(inspect::InForce::new(
                config.clone(),
            )))),
            config,
            running: Arc::new(OnceLock::new()),
            nodes: Arc::new(OnceLock::new()),
            reloads: Arc::new(OnceLock::new()),
            inspect: Arc::new(OnceLock::new()),
            cluster: Arc::new(OnceLock::new()),
            providers: Arc::new(OnceLock::new()),
        }
    }

    /// Report the health of the providers the gateway calls (`status`, `/readyz`, doctor).
    pub fn set_provider_health(&self, health: crate::llm::health::ProviderHealth) {
        let _ = self.providers.set(health);
    }

    /// `providers` of the status: the configured ones (base URL, whether a key is set) with
    /// their health as the running gateway has seen it.
    fn providers_json(&self) -> Value {
        let health = self
            .providers
            .get()
            .map(crate::llm::health::ProviderHealth::to_json)
            .unwrap_or_default();
        Value::Array(
            health
                .into_iter()
                .map(|mut h| {
                    if let Some(p) = self
                        .config
                        .providers
                        .iter()
                        .find(|p| h["name"] == p.name.as_str())
                    {
                        h["base_url"] = json!(crate::types::scrub::redact_url(&p.base_url));
                        h["api_key"] = json!(p.api_key.is_some());
                    }
                    h
                })
                .collect(),
        )
    }

    /// Report the health of this node in the cluster (`/readyz`, `weft status`).
    pub fn set_cluster(&self, cluster: crate::cluster::Cluster) {
        let _ = self.cluster.set(cluster);
    }

    /// The cluster part of the status: `None` in single-node mode.
    fn cluster_json(&self) -> Option<Value> {
        #[cfg(feature = "cluster")]
        {
            let c = self.cluster.get()?;
            let h = c.health();
            Some(json!({
                "node_id": c.settings().node_id,
                "ok": h.ok,
                "reason": h.reason,
                "since_ms": h.since_ms,
                "nats_url": c.settings().nats_urls.iter().map(|u| crate::types::scrub::redact_url(u)).collect::<Vec<_>>(),
            }))
        }
        #[cfg(not(feature = "cluster"))]
        {
            let _ = &self.cluster;
            None
        }
    }

    /// The cluster as its registry and leases show it (`weft cluster status`'s nodes,
    /// partitions and connection leases), read on this node's NATS connection when it is
    /// healthy, at most 2 s; otherwise `view_error` says why it is missing.
    #[cfg(feature = "cluster")]
    async fn cluster_view(&self, into: &mut Value) {
        let Some(c) = self.cluster.get() else {
            return;
        };
        let js = match c.healthy_jetstream() {
            Ok(js) => js,
            Err(e) => {
                into["view_error"] = json!(e.to_string());
                return;
            }
        };
        let settings = c.settings().clone();
        let read = c
            .run_here(async move {
                tokio::time::timeout(
                    std::time::Duration::from_secs(2),
                    crate::cluster::status::collect_on(&js, &settings),
                )
                .await
            })
            .await;
        match read {
            Some(Ok(Ok(view))) => {
                for k in ["nodes", "partitions", "connections", "lease_ttl_secs"] {
                    into[k] = view[k].clone();
                }
            }
            Some(Ok(Err(e))) => into["view_error"] = json!(e.to_string()),
            Some(Err(_)) => into["view_error"] = json!("NATS did not answer within 2 s"),
            None => into["view_error"] = json!("the cluster is stopping"),
        }
    }

    /// Serve `nodes/*` from `hub` (the gateway's connected nodes).
    pub fn set_nodes(&self, hub: Arc<nodes::NodeHub>) {
        let _ = self.nodes.set(hub);
    }

    /// Connect it to the running daemon.
    pub fn attach(
        &self,
        bus: BusRef,
        store: Store,
        outbox: Outbox,
        mcp: crate::daemon::McpSlot,
        scheduler: Arc<crate::scheduler::Scheduler>,
        approvals: Arc<crate::approval::Approvals>,
    ) {
        let _ = self.running.set(Running {
            bus,
            store,
            outbox,
            mcp,
            scheduler,
            approvals,
        });
    }
}

#[async_trait]
impl clawft_channel_http::Admin for AdminApi {
    async fn status(&self) -> Value {
        match self.running.get() {
            Some(r) => {
                let live = crate::daemon::live_sessions(&r.bus).await;
                let mut v = status_json(&self.config, &r.store, Some(&live));
                v["mode"] = json!("gateway");
                if self.providers.get().is_some() {
                    v["providers"] = self.providers_json();
                }
                if let Some(c) = self.cluster_json() {
                    v["cluster"] = c;
                    #[cfg(feature = "cluster")]
                    self.cluster_view(&mut v["cluster"]).await;
                }
                v["channel_states"] = crate::daemon::channel_states(r.channels()).await;
                v["mcp_servers"] = mcp_json(r.mcp().as_deref());
                v["scheduler"] = cron::scheduler_json(
                    &r.scheduler.jobs().list().unwrap_or_default(),
                    r.scheduler.heartbeat(),
                    Some(&r.scheduler),
                );
                v
            }
            None => json!({"status": "starting"}),
        }
    }

    async fn sessions(&self) -> Result<Value, AdminError> {
        let r = self.running.get().ok_or_else(starting)?;
        sessions_json(&r.store)
    }

    async fn session(&self, key: &str) -> Result<Option<Value>, AdminError> {
        let r = self.running.get().ok_or_else(starting)?;
        session_json(&r.store, key, &sessions::windows_of(&self.config))
    }

    async fn clear_session(&self, key: &str) -> Result<bool, AdminError> {
        let r = self.running.get().ok_or_else(starting)?;
        let key = SessionKey::parse(key).map_err(bad_request)?;
        ractor::call_t!(
            r.bus,
            |reply| BusMsg::Clear { key, reply },
            CLEAR_TIMEOUT_MS
        )
        .map_err(internal)?
        .map_err(internal)
    }

    async fn hook(
        &self,
        name: &str,
        headers: &axum::http::HeaderMap,
        body: axum::body::Bytes,
    ) -> (axum::http::StatusCode, Value) {
        let Some(hook) = self.config.hooks.iter().find(|h| h.name == name) else {
            return (
                axum::http::StatusCode::NOT_FOUND,
                json!({"error": format!("no webhook `{name}` is configured (hooks.{name} in the configuration)")}),
            );
        };
        let Some(r) = self.running.get() else {
            return (
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "starting"}),
            );
        };
        let inbox = crate::bus::Inbox::new(r.bus.clone());
        let now = chrono::Utc::now().timestamp();
        hooks::handle(hook, &r.store, |e| inbox.route(e), headers, &body, now)
    }

    async fn ready(&self) -> Result<Value, Value> {
        let Some(r) = self.running.get() else {
            return Err(json!({"status": "starting"}));
        };
        // Not ready while store writes fail: nothing could be journaled or answered.
        let health = r.store.health();
        if !health.is_ok() {
            return Err(json!({"status": "store_degraded", "store": health}));
        }
        // Not ready while this node cannot reach the cluster: it holds no lease and takes no
        // new work through them.
        if let Some(c) = self.cluster_json().filter(|c| c["ok"] != json!(true)) {
            return Err(
                json!({"status": "cluster_unreachable", "reason": c["reason"], "cluster": c}),
            );
        }
        // Starting until every MCP server has ended its first connection attempt (connected or
        // failed): a request before then would wait for their tools (up to
        // tools.mcp_connect_wait_secs).
        // Not ready while no provider answers: every turn would fail (a stale key, a model the
        // provider does not serve, an unreachable server).
        if self
            .providers
            .get()
            .is_some_and(crate::llm::health::ProviderHealth::all_failing)
        {
            return Err(json!({
                "status": "provider_failing",
                "reason": "provider_failing",
                "providers": self.providers_json(),
            }));
        }
        let connecting = r.mcp().map(|m| m.first_connecting()).unwrap_or_default();
        if !connecting.is_empty() {
            return Err(json!({
                "status": "starting",
                "mcp_connecting": connecting,
                "mcp_servers": mcp_json(r.mcp().as_deref()),
            }));
        }
        Ok(json!({
            "store": health,
            "status": "ready",
            "channels": crate::daemon::channel_states(r.channels()).await,
            "providers": self.config.providers.iter().map(|p| json!({
                "name": p.name,
                "base_url": crate::types::scrub::redact_url(&p.base_url),
                "model": p.model,
            })).collect::<Vec<_>>(),
            "mcp_servers": mcp_json(r.mcp().as_deref()),
        }))
    }

    async fn metrics(&self) -> String {
        use crate::metrics::Gauge;
        let Some(r) = self.running.get() else {
            return crate::metrics::render(&[]);
        };
        let live = crate::daemon::live_sessions(&r.bus).await;
        let stored = r.store.sessions().map(|s| s.len()).unwrap_or(0);
        let g = |name: &'static str,
                 help: &'static str,
                 labels: Vec<(String, String)>,
                 value: f64| Gauge {
            name,
            help,
            labels,
            value,
        };
        let mut gauges = vec![
            g(
                "clawft_sessions_live",
                "Sessions in memory.",
                vec![],
                live.len() as f64,
            ),
            g(
                "clawft_sessions_stored",
                "Sessions in the store.",
                vec![],
                stored as f64,
            ),
            g(
                "clawft_queue_depth",
                "Messages waiting behind running turns, all sessions.",
                vec![],
                live.iter().map(|s| s.queued as f64).sum(),
            ),
            g(
                "clawft_turns_running",
                "Turns running now.",
                vec![],
                live.iter().filter(|s| s.running).count() as f64,
            ),
            g(
                "clawft_store_size_bytes",
                "Size of the store on disk.",
                vec![],
                r.store.size_on_disk() as f64,
            ),
        ];
        let health = r.store.health();
        gauges.push(g(
            "clawft_store_healthy",
            "1 while store writes work, 0 while they fail (no space left, I/O errors).",
            vec![],
            if health.is_ok() { 1.0 } else { 0.0 },
        ));
        gauges.push(g(
            "clawft_store_alert",
            "1 while a store found damaged at start and moved aside is being reported.",
            vec![],
            if health.alert.is_some() { 1.0 } else { 0.0 },
        ));
        for s in r.mcp().map(|m| m.status()).unwrap_or_default() {
            let state = serde_json::to_value(s.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            gauges.push(g(
                "clawft_mcp_server_up",
                "1 when the MCP server is connected.",
                vec![
                    ("server".into(), s.name.clone()),
                    ("state".into(), state.clone()),
                ],
                if state == "connected" { 1.0 } else { 0.0 },
            ));
        }
        gauges.extend(cron::gauges(
            &r.scheduler.jobs().list().unwrap_or_default(),
            r.scheduler.counts(),
            chrono::Utc::now(),
        ));
        crate::metrics::render(&gauges)
    }

    async fn command(&self, name: &str, body: Value) -> Result<Value, AdminError> {
        let running = || self.running.get().ok_or_else(starting);
        match AdminRequest::parse(name, body)? {
            AdminRequest::Inspect(req) => self.inspect_command(req).await,
            AdminRequest::Send {
                channel,
                chat_id,
                content,
            } => {
                let r = running()?;
                let names = r.channels().names();
                if !names.contains(&channel) {
                    return Err(AdminError::BadRequest(format!(
                        "no channel `{channel}` is running; running channels: {}",
                        names.join(", ")
                    )));
                }
                let msg = operator_message(&channel, &chat_id, &content)?;
                let id = msg.id.clone();
                r.outbox
                    .send_durable(msg)
                    .await
                    .map_err(|e| AdminError::Internal(format!("outbox: {e}")))?;
                Ok(json!({"status": "queued", "id": id}))
            }
            AdminRequest::ApprovalsList => {
                let r = running()?;
                // In cluster mode this reads the other nodes' questions from NATS.
                let a = r.approvals.clone();
                let all = tokio::task::spawn_blocking(move || a.list_all())
                    .await
                    .map_err(internal)?;
                Ok(json!({ "approvals": all }))
            }
            AdminRequest::LogsTail { after, level } => {
                let lines = crate::telemetry::recent().tail(after, level.as_deref(), 500);
                let next = lines.last().map_or(after, |l| l.seq);
                Ok(json!({"lines": lines, "next": next}))
            }
            AdminRequest::ApprovalsAnswer { id, decision } => {
                let r = running()?;
                // In cluster mode this may wait for another node to take the answer.
                let (a, owned) = (r.approvals.clone(), id.clone());
                let answered =
                    tokio::task::spawn_blocking(move || a.answer_anywhere(&owned, decision))
                        .await
                        .map_err(internal)?;
                match answered {
                    Ok(text) => Ok(json!({"id": id, "answered": text})),
                    Err(crate::approval::AnswerError::Cluster(e)) => {
                        Err(AdminError::Unavailable(e.to_string()))
                    }
                    Err(_) => {
                        let known = r.approvals.list().into_iter().find(|a| a.id == id);
                        Err(AdminError::BadRequest(match known {
                            Some(a) => format!(
                                "approval `{id}` is no longer pending: it was {}",
                                a.state.as_str()
                            ),
                            None => format!("no approval `{id}` (weft approvals list shows them)"),
                        }))
                    }
                }
            }
            AdminRequest::McpList => Ok(mcp_json(running()?.mcp().as_deref())),
            AdminRequest::SessionsSearch(query) => {
                let r = running()?;
                let store = r.store.clone();
                let windows = sessions::windows_of(&self.config);
                tokio::task::spawn_blocking(move || sessions::search(&store, &query, &windows))
                    .await
                    .map_err(internal)?
            }
            AdminRequest::SessionsCompact { session } => {
                let r = running()?;
                let inbox = crate::bus::Inbox::new(r.bus.clone());
                sessions::compact(
                    &r.store,
                    &r.channels().names(),
                    |e| inbox.route(e),
                    &session,
                )
            }
            AdminRequest::CanvasGet { session } => {
                crate::tools::canvas::canvas_json(&running()?.store, &session).map_err(internal)
            }
            AdminRequest::Usage {
                session: Some(key),
                days,
                ..
            } => {
                let r = running()?;
                let store = r.store.clone();
                tokio::task::spawn_blocking(move || session_usage_json(&store, &key, days))
                    .await
                    .map_err(internal)?
            }
            AdminRequest::Usage {
                session: None,
                by,
                days,
                stack,
            } => {
                let r = running()?;
                #[cfg(feature = "cluster")]
                if let Some(c) = self.cluster.get() {
                    return cluster_usage_json(c, &r.store, &by, days, stack.as_deref()).await;
                }
                usage_json_stacked(&r.store, &by, days, stack.as_deref())
            }
            AdminRequest::McpRestart { name } => {
                let r = running()?;
                let m = r
                    .mcp()
                    .ok_or_else(|| bad_request("no MCP servers are configured"))?;
                m.restart(&name).map_err(bad_request)?;
                Ok(json!({"restarting": name}))
            }
            AdminRequest::StoreCheck => {
                let r = running()?;
                let report = crate::store::backup::check(&r.store).map_err(internal)?;
                serde_json::to_value(report).map_err(internal)
            }
            AdminRequest::StoreBackup { path } => {
                let r = running()?;
                let store = r.store.clone();
                let to = path.clone();
                let n =
                    tokio::task::spawn_blocking(move || crate::store::backup::backup(&store, &to))
                        .await
                        .map_err(internal)?
                        .map_err(internal)?;
                Ok(
                    json!({"path": path.display().to_string(), "records": n.records, "counts": n.counts}),
                )
            }
            AdminRequest::NodesList => Ok(match self.nodes.get() {
                Some(hub) => hub.list_json(),
                None => nodes::NodeHub::new(running()?.store.clone()).list_json(),
            }),
            // On the blocking pool: the decision is flushed before it is answered.
            AdminRequest::Node { id, decision } => {
                let hub = match self.nodes.get() {
                    Some(hub) => hub.clone(),
                    None => nodes::NodeHub::new(running()?.store.clone()),
                };
                tokio::task::spawn_blocking(move || hub.decide(&id, decision))
                    .await
                    .map_err(internal)?
            }
            // On the blocking pool: shared jobs (cluster mode) wait on the cluster.
            AdminRequest::Cron { action, args } => {
                let r = running()?;
                let (scheduler, names) = (r.scheduler.clone(), r.channels().names());
                tokio::task::spawn_blocking(move || {
                    cron::command(&scheduler, &names, &action, &args)
                })
                .await
                .map_err(internal)?
            }
            AdminRequest::Pairing(req) => {
                let r = running()?;
                // In cluster mode approving and revoking wait for NATS.
                let shared = crate::daemon::cluster_state::seam(self.cluster.get())
                    .map(crate::ingress::access::SharedAccess::new);
                let store = r.store.clone();
                tokio::task::spawn_blocking(move || shared_pairing(&store, shared.as_ref(), &req))
                    .await
                    .map_err(internal)?
            }
        }
    }
}

/// MCP servers' states as JSON (an empty list when none is configured).
pub fn mcp_json(m: Option<&crate::mcp::client::McpManager>) -> Value {
    let rows = m
        .map(crate::mcp::client::McpManager::status)
        .unwrap_or_default();
    serde_json::to_value(rows).unwrap_or(Value::Null)
}

/// A message the operator sends (`weft send`): not subject to the `message` tool's routes.
///
/// # Errors
/// Empty fields or a chat id with `:`.
pub fn operator_message(
    channel: &str,
    chat: &str,
    content: &str,
) -> Result<clawft_channel_core::OutboundMessage, AdminError> {
    use clawft_channel_core::{ChannelId, ChatId};
    let content = crate::types::sanitize_content(content);
    if channel.is_empty() || chat.is_empty() || chat.contains(':') || content.trim().is_empty() {
        return Err(bad_request(
            "channel, chat id and text must be non-empty (and the chat id without `:`)",
        ));
    }
    Ok(clawft_channel_core::OutboundMessage::proactive(
        ChannelId::new(channel),
        ChatId::new(chat),
        None,
        content,
    ))
}

/// `pairing/list`, `pairing/approve {code}`, `pairing/revoke {who}` on `store`.
///
/// # Errors
/// Unknown command, bad arguments or store failure, as text.
pub fn pairing_command(store: &Store, name: &str, body: &Value) -> Result<Value, AdminError> {
    let AdminRequest::Pairing(req) = AdminRequest::parse(name, body.clone())? else {
        return Err(bad_request(format!("unknown admin command `{name}`")));
    };
    shared_pairing(store, None, &req)
}

/// A pairing command on `store`, writing the cluster's records first when `shared`.
///
/// # Errors
/// Bad arguments, the cluster unreachable or store failure.
pub fn shared_pairing(
    store: &Store,
    shared: Option<&crate::ingress::access::SharedAccess>,
    req: &PairingRequest,
) -> Result<Value, AdminError> {
    use crate::ingress::access;
    match req {
        PairingRequest::List => Ok(json!({
            "pending": access::pending(store).map_err(internal)?.iter().map(|p| json!({
                "code": p.code, "channel": p.channel, "user": p.user, "chat": p.chat, "created_ms": p.created_ms,
            })).collect::<Vec<_>>(),
            "paired": access::paired(store).map_err(internal)?,
        })),
        PairingRequest::Approve { code } => {
            let who = access::approve(store, shared, code, clawft_channel_core::now_ms()).map_err(
                |e| match e {
                    access::PairingError::Shared(m) => AdminError::Unavailable(m.to_string()),
                    e => bad_request(e),
                },
            )?;
            Ok(json!({"approved": who}))
        }
        PairingRequest::Revoke { who } => {
            let was = access::revoke(store, shared, who).map_err(|e| match e {
                access::PairingError::Shared(m) => AdminError::Unavailable(m.to_string()),
                e => internal(e),
            })?;
            Ok(json!({"revoked": was}))
        }
    }
}
