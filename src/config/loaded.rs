//! [`Config`]: the validated configuration as a whole, every section resolved, and what is
//! looked up across sections (an agent's view, the providers' hints). Built only by
//! [`super::resolve`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::channels::ChatChannelConfig;
use super::env::DeferredSecret;
use super::provenance::{Origin, ProviderHints};
use super::types::{
    AgentConfig, HttpChannelConfig, ProviderConfig, ProviderSource, SessionLimits, StoreConfig,
    ToolsConfig,
};
use crate::types::Secret;

/// The validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The file it was read from, if any.
    pub path: Option<PathBuf>,
    /// `~/.clawft`.
    pub home: PathBuf,
    /// The agent this configuration is for: `main` (`agents.defaults`), or a name of
    /// `agents.NAME` in a view made by [`Config::for_agent`].
    pub agent_name: String,
    /// Agent behaviour (of [`Config::agent_name`]).
    pub agent: AgentConfig,
    /// The other agents (`agents.NAME`), by name.
    pub agents: Vec<super::agents::NamedAgent>,
    /// `[[bindings]]`: which agent serves a message.
    pub bindings: super::agents::Bindings,
    /// `hooks.NAME`: signed inbound webhooks.
    pub hooks: Vec<super::hooks::HookConfig>,
    /// `media.*`: attachment caps and transcription.
    pub media: crate::media::MediaSettings,
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
    /// `channels.max_inbound_bytes`: the one size limit of an inbound message, every channel.
    pub max_inbound_bytes: usize,
    /// Every secret value, so tool output and logs can be scrubbed of them.
    pub secrets: Vec<Secret>,
    /// The service manager's notification socket (`$NOTIFY_SOCKET`; a leading `@` names an
    /// abstract socket). `None` when not run by systemd with `Type=notify`.
    pub notify_socket: Option<PathBuf>,
    /// How often to send `WATCHDOG=1`: half of `$WATCHDOG_USEC`, when it is set and
    /// `$WATCHDOG_PID` (if set) is this process.
    pub watchdog: Option<Duration>,
    /// `prices` and `budgets`.
    pub usage: super::usage::UsageConfig,
    /// Where the values came from (file key, environment variable, default).
    pub provenance: super::provenance::Provenance,
    /// `memory`.
    pub memory: crate::memory::settings::MemorySettings,
    /// `scheduler`: the limits of scheduled jobs.
    pub scheduler: crate::scheduler::SchedulerSettings,
    /// `heartbeat`: `None` when off.
    pub heartbeat: Option<crate::scheduler::HeartbeatSettings>,
    /// `[node]`: the settings of `weft node` (the workspace with `~/` expanded).
    pub node: super::file::NodeFile,
    /// `[cluster]`: `None` in single-node mode.
    pub cluster: Option<crate::cluster::settings::ClusterSettings>,
    /// Secrets of the running service that this command's environment does not hold (loaded
    /// with [`Env::for_client`](super::env::Env::for_client)); their values in this config are
    /// placeholders. Always empty for the service itself.
    pub deferred_secrets: Vec<DeferredSecret>,
}

impl Config {
    /// This configuration as seen by agent `name`: its behaviour, providers and tool policy in
    /// place of the default agent's; everything else shared. `None` for an unknown name.
    pub fn for_agent(&self, name: &str) -> Option<Config> {
        if name == self.agent_name {
            return Some(self.clone());
        }
        let a = self.agents.iter().find(|a| a.name == name)?;
        let mut c = self.clone();
        c.agent_name = a.name.clone();
        c.agent = a.agent.clone();
        c.providers = a.providers.clone();
        c.tools.policy = a.policy.clone();
        Some(c)
    }

    /// The names of every agent, the default one (`main`) first.
    pub fn agent_names(&self) -> Vec<&str> {
        std::iter::once(crate::types::session_key::DEFAULT_AGENT)
            .chain(self.agents.iter().map(|a| a.name.as_str()))
            .collect()
    }
}

impl Config {
    /// Each provider's [`ProviderHints`], by provider name.
    pub fn provider_hints(&self) -> BTreeMap<String, ProviderHints> {
        self.providers
            .iter()
            .map(|p| {
                let name = &p.name;
                let key = format!("providers.{name}.api_key");
                let auth = match (&p.api_key, self.provenance.origin(&key)) {
                    (None, _) => format!(
                        "No API key is set for provider `{name}`: set {key} (or api_key_env / api_key_file) in {}",
                        self.path.as_ref().map_or_else(
                            || "the config file".to_string(),
                            |p| p.display().to_string()
                        )
                    ),
                    (Some(_), Origin::Default) => {
                        format!("Check the API key of provider `{name}` ({key})")
                    }
                    (Some(_), origin) => format!(
                        "The API key of provider `{name}` came from {origin}: fix or replace it there"
                    ),
                };
                let url = crate::types::scrub::redact_url(&p.base_url);
                let connect = match self.provenance.origin(&format!("providers.{name}.base_url")) {
                    Origin::Default => format!(
                        "Provider `{name}` uses its default base URL {url}; set providers.{name}.base_url for another server"
                    ),
                    origin => format!(
                        "The base URL of provider `{name}` ({url}) came from {origin}: check that a server answers there"
                    ),
                };
                (name.clone(), ProviderHints { auth, connect })
            })
            .collect()
    }
}
