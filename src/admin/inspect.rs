//! The admin commands behind the control UI's Config and Agents pages (and usable by any admin
//! client): `config/show` (the configuration in force, each value with where it came from,
//! secrets masked: the rows of `weft config show`), `config/validate` (the file on disk as it
//! is now, validated as a reload would), `config/reload` (the SIGHUP path, with its report),
//! `agents/list` (each agent's model, bindings, tools and skills), `memory/list` and
//! `memory/search` (the same search as `weft memory search`).

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::{bad_request, internal, AdminApi};
use crate::config::{Config, ConfigError, Env};
use crate::tools::registry::ToolsHandle;
use crate::tools::{ToolContext, Workspace};
use crate::types::session_key::DEFAULT_AGENT;
use crate::types::SessionKey;
use clawft_channel_http::AdminError;

/// The configuration in force and what its file and environment set (for `config/show`).
pub struct InForce {
    config: Arc<Config>,
    /// Every leaf value the file and the `CLAWFT_…` overrides set when it was loaded.
    set: BTreeMap<String, String>,
}

impl InForce {
    /// `config`, with the values its file and the process environment set now.
    pub fn new(config: Arc<Config>) -> Self {
        let set = crate::config::provenance::set_values(
            config.provenance.file().or(config.path.as_deref()),
            &Env::from_process(),
        );
        Self { config, set }
    }
}

/// One agent's running parts, for `agents/list` and `memory/*`. The tools and the memory
/// service are held weakly: the `gateway` tool holds this admin API, and a strong reference
/// back would keep the store (and its lock) alive after the daemon shut down.
pub struct AgentParts {
    /// Its name (`main` for the default agent).
    pub name: String,
    /// Its tools (replaced on a reload).
    pub tools: Weak<ToolsHandle>,
    /// Its workspace.
    pub workspace: Arc<Workspace>,
}

/// What the Agents page reads from the running daemon.
pub struct Inspect {
    /// Every agent, the default one first.
    pub agents: Vec<AgentParts>,
    /// The memory search service.
    pub memory: Weak<crate::memory::service::MemoryService>,
}

/// The agents of `config` as JSON (`weft agents list --json`): workspace, model, providers
/// and the bindings that choose each.
pub fn agents_json(config: &Config) -> Value {
    let agents: Vec<Value> = config
        .agent_names()
        .into_iter()
        .filter_map(|name| config.for_agent(name))
        .map(|c| {
            let bindings: Vec<String> = config
                .bindings
                .iter()
                .filter(|b| b.agent == c.agent_name)
                .map(crate::config::agents::Binding::describe)
                .collect();
            json!({
                "name": c.agent_name,
                "default": c.agent_name == DEFAULT_AGENT,
                "workspace": c.agent.workspace.display().to_string(),
                "model": c.providers.first().map(|p| p.model.clone()),
                "providers": c.providers.iter().map(|p| p.name.clone()).collect::<Vec<_>>(),
                "models": c.agent.models,
                "system_prompt": c.agent.system_prompt.is_some(),
                "bindings": bindings,
            })
        })
        .collect();
    json!({ "agents": agents })
}

fn stopping() -> AdminError {
    AdminError::Unavailable("the gateway is stopping".into())
}

/// The dotted key a configuration error is about, when it names one.
pub fn error_key(e: &ConfigError) -> Option<String> {
    match e {
        ConfigError::Invalid { key, .. } | ConfigError::Secret { key, .. } => Some(key.clone()),
        ConfigError::Parse { detail, .. } => {
            let quoted = |after: &str| {
                let rest = &detail[detail.find(after)? + after.len()..];
                rest.split('`').next().map(str::to_string)
            };
            match (quoted("unknown field `"), quoted("for key `")) {
                (Some(f), Some(k)) if !k.is_empty() => Some(format!("{k}.{f}")),
                (Some(f), _) => Some(f),
                (None, k) => k.filter(|k| !k.is_empty()),
            }
        }
        ConfigError::Missing(_) => None,
    }
}

impl AdminApi {
    /// The configuration in force changed (a reload applied): `config/show` shows it.
    pub fn set_in_force(&self, config: Config) {
        let v = Arc::new(InForce::new(Arc::new(config)));
        if let Ok(mut w) = self.in_force.write() {
            *w = v;
        }
    }

    /// Take reloads through `tx` (the gateway's main loop, the SIGHUP path).
    pub fn set_reloads(&self, tx: tokio::sync::mpsc::Sender<super::ops::ReloadRequest>) {
        let _ = self.reloads.set(tx);
    }

    /// Serve `agents/list` and `memory/*` from the running daemon's parts.
    pub fn set_inspect(&self, parts: Inspect) {
        let _ = self.inspect.set(parts);
    }

    fn in_force(&self) -> Arc<InForce> {
        self.in_force
            .read()
            .map(|r| r.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// `config/*`, `agents/*` and `memory/*`.
    pub(super) async fn inspect_command(
        &self,
        req: super::request::InspectRequest,
    ) -> Result<Value, AdminError> {
        use super::request::InspectRequest;
        match req {
            InspectRequest::ConfigShow => Ok(self.config_show()),
            InspectRequest::ConfigValidate => Ok(self.config_validate()),
            InspectRequest::ConfigReload => self.config_reload().await,
            InspectRequest::AgentsList => self.agents_list(),
            InspectRequest::MemoryList { agent } => self.memory_list(agent.as_deref()),
            InspectRequest::MemorySearch {
                agent,
                query,
                max,
                prefix,
            } => {
                self.memory_search(agent.as_deref(), &query, max, prefix.as_deref())
                    .await
            }
        }
    }

    fn config_show(&self) -> Value {
        let f = self.in_force();
        let rows = crate::config::show::rows(&f.config, &f.set);
        json!({
            "path": f.config.path.as_ref().map(|p| p.display().to_string()),
            "rows": crate::config::show::rows_json(&rows),
        })
    }

    /// Load and validate the file on disk now, as a reload would; nothing is applied.
    fn config_validate(&self) -> Value {
        let path = self.config.path.clone();
        let shown = path.as_ref().map(|p| p.display().to_string());
        match Config::load(path.as_deref(), &Env::from_process()) {
            Ok(c) => json!({
                "valid": true,
                "path": shown,
                "providers": c.providers.iter().map(|p| p.name.clone()).collect::<Vec<_>>(),
            }),
            Err(e) => json!({
                "valid": false,
                "path": shown,
                "key": error_key(&e),
                "error": e.to_string(),
            }),
        }
    }

    /// The reload SIGHUP and the `gateway` tool run: the changes applied, or why the file was
    /// rejected (nothing applied).
    async fn config_reload(&self) -> Result<Value, AdminError> {
        let tx = self.reloads.get().ok_or_else(|| {
            AdminError::Unavailable(
                "this gateway takes no reloads from the admin API (run it with `weft gateway`)"
                    .into(),
            )
        })?;
        let (answer, rx) = tokio::sync::oneshot::channel();
        tx.send(answer)
            .await
            .map_err(|_| AdminError::Unavailable("the gateway is stopping".into()))?;
        match rx.await {
            Ok(Ok(changes)) => Ok(json!({"status": "reloaded", "changes": changes})),
            Ok(Err(why)) => Ok(json!({
                "status": "rejected",
                "error": why,
                "key": Config::load(self.config.path.as_deref(), &Env::from_process())
                    .err()
                    .as_ref()
                    .and_then(error_key),
            })),
            Err(_) => Err(AdminError::Unavailable(
                "the gateway stopped before it reloaded".into(),
            )),
        }
    }

    fn agents_list(&self) -> Result<Value, AdminError> {
        let config = self.in_force().config.clone();
        let mut v = agents_json(&config);
        let Some(parts) = self.inspect.get() else {
            return Ok(v);
        };
        for a in v["agents"].as_array_mut().into_iter().flatten() {
            let Some(p) = parts.agents.iter().find(|p| a["name"] == p.name.as_str()) else {
                continue;
            };
            let skills = crate::skills::SkillDirs {
                global: Some(config.home.join("skills")),
                workspace: p.workspace.clone(),
            }
            .load();
            let Some(tools) = p.tools.upgrade() else {
                return Err(stopping());
            };
            let reg = tools.current();
            let offer = reg.offer(&[], &[], crate::turn::offer::omitted(&skills));
            a["tools"] = json!({
                "offered": offer.specs.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
                "deferred": offer.deferred.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
            });
            a["skills"] = skills
                .iter()
                .map(|s| {
                    json!({
                        "name": s.name,
                        "description": s.description,
                        "source": s.source,
                        "allowed_tools": s.allowed_tools,
                    })
                })
                .collect();
        }
        Ok(v)
    }

    /// The agent `agent` names (the default one without), and its parts.
    fn agent_parts(&self, agent: Option<&str>) -> Result<(&Inspect, &AgentParts), AdminError> {
        let parts = self.inspect.get().ok_or_else(super::starting)?;
        let name = agent.unwrap_or(DEFAULT_AGENT);
        let agent = parts
            .agents
            .iter()
            .find(|a| a.name == name)
            .ok_or_else(|| bad_request(format!("no agent `{name}`")))?;
        Ok((parts, agent))
    }

    fn memory_list(&self, agent: Option<&str>) -> Result<Value, AdminError> {
        let (_, a) = self.agent_parts(agent)?;
        let docs = crate::memory::service::list_documents(&a.workspace);
        Ok(json!({
            "agent": a.name,
            "documents": docs.iter().map(|(path, st)| json!({
                "path": path,
                "bytes": st.size,
                "modified_ms": st.mtime_ns / 1_000_000,
            })).collect::<Vec<_>>(),
        }))
    }

    /// `memory/search {query, agent?, max?, prefix?}`: as `weft memory search`.
    async fn memory_search(
        &self,
        agent: Option<&str>,
        query: &str,
        max: usize,
        prefix: Option<&str>,
    ) -> Result<Value, AdminError> {
        let (parts, a) = self.agent_parts(agent)?;
        let ctx = ToolContext {
            workspace: a.workspace.clone(),
            session: SessionKey::from_parts(&[
                clawft_channel_core::Surface::Terminal.id(),
                "memory",
            ])
            .map_err(internal)?,
            cancel: CancellationToken::new(),
            user_dir: None,
            sender: None,
            call_id: None,
            turn: Default::default(),
        };
        let memory = parts.memory.upgrade().ok_or_else(stopping)?;
        let out = memory
            .search(&ctx, query, max, prefix)
            .await
            .map_err(internal)?;
        serde_json::to_value(out).map_err(internal)
    }
}
