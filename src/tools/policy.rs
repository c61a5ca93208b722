//! The tool policy engine (seed 004 §5, adapted to clawft's tool names): which tools the model
//! is shown and may call.
//!
//! Three layers, each with an optional `profile`, an optional `allow` list, a `deny` list and an
//! `also_allow` list: global (`tools.policy`), per provider (`tools.policy.by_provider.NAME`,
//! for the agent's primary provider) and per agent (`agents.defaults.tools`). A tool is allowed
//! when
//!
//! 1. the most specific profile set (agent, else provider, else global, else `full`) includes it,
//! 2. and every layer's `allow` list that is set matches it,
//! 3. or any layer's `also_allow` matches it (additive),
//! 4. and no layer's `deny` matches it: **deny always wins**.
//!
//! **Opt-in tools** ([`Builtin::opt_in`]: `gateway`) are denied by default, whatever the profile and the
//! `allow` lists say: one is allowed only when some layer's `also_allow` names it (its exact name,
//! or `group:automation`; a wildcard such as `*` does not count), and a `deny` still wins.
//!
//! Patterns are tool names, `*`/`?` wildcards (`github__*`), or groups: `group:fs`,
//! `group:runtime`, `group:web`, `group:memory`, `group:messaging`, `group:sessions`,
//! `group:automation` (`cron`, `gateway`), `group:custom` (the `tools.custom` tools, expanded
//! to their names once the configuration is read), `group:mcp` (every MCP tool) and
//! `group:mcp:NAME` (one server's tools).
//!
//! The registry shows the model only allowed tools, and a call to a registered but disallowed
//! tool is answered `PERMISSION_DENIED` without running it.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::builtin::{Builtin, Group};
use crate::types::SettingError;

/// The group of the custom tools (`tools.custom.NAME`): its members are known once the
/// configuration is read, so [`ToolPolicy::expand_custom`] replaces it by their names.
pub const CUSTOM_GROUP: &str = "custom";

/// Whether `p` opts `tool` in: its exact name (no wildcard) or a group that lists it.
fn opts_in(p: &Pattern, tool: &str) -> bool {
    match p {
        Pattern::Name(n) => n == tool,
        Pattern::Group(_) => p.matches(tool),
    }
}

/// The group a tool belongs to (`mcp` for `server__tool` names), for listings.
pub fn group_of(tool: &str) -> Option<&'static str> {
    if tool.contains("__") {
        return Some("mcp");
    }
    Builtin::named(tool)
        .and_then(Builtin::group)
        .map(Group::name)
}

/// The session tools of the `messaging` profile (seed 004's table).
const MESSAGING_SESSION_TOOLS: [Builtin; 5] = [
    Builtin::HistorySearch,
    Builtin::SessionsList,
    Builtin::SessionsHistory,
    Builtin::SessionsSend,
    Builtin::SessionStatus,
];

/// A named starting set of tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// Every registered tool but the opt-in ones ([`Builtin::opt_in`]: `gateway`); `cron` is included
    /// (it manages the session's own jobs only).
    Full,
    /// Files, runtime, memory, sessions, web, and `image`.
    Coding,
    /// Messaging and the session tools (seed 004: `group:messaging`, `sessions_list`,
    /// `sessions_history`, `sessions_send`, `session_status`, and `history_search` over the
    /// chat's own history; not `subagents` or `use_skill`).
    Messaging,
    /// `session_status` only (seed 004).
    Minimal,
}

impl Profile {
    /// The name as the config spells it (`full`, `coding`, `messaging`, `minimal`).
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Full => "full",
            Profile::Coding => "coding",
            Profile::Messaging => "messaging",
            Profile::Minimal => "minimal",
        }
    }

    fn includes(self, tool: &str) -> bool {
        let builtin = Builtin::named(tool);
        let in_groups = |groups: &[Group]| {
            builtin
                .and_then(Builtin::group)
                .is_some_and(|g| groups.contains(&g))
        };
        match self {
            Profile::Full => true,
            // Seed 004's `coding` also names `image`.
            Profile::Coding => {
                in_groups(&[
                    Group::Fs,
                    Group::Runtime,
                    Group::Memory,
                    Group::Sessions,
                    Group::Web,
                ]) || builtin == Some(Builtin::Image)
            }
            Profile::Messaging => {
                in_groups(&[Group::Messaging])
                    || builtin.is_some_and(|b| MESSAGING_SESSION_TOOLS.contains(&b))
            }
            Profile::Minimal => builtin == Some(Builtin::SessionStatus),
        }
    }
}

/// One entry of an allow/deny list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// `group:NAME` (or `group:mcp:SERVER`).
    Group(String),
    /// A name, possibly with `*`/`?` wildcards.
    Name(String),
}

/// A tool pattern that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// Nothing but whitespace.
    #[error("empty tool pattern")]
    Empty,
    /// `group:NAME` with a group that does not exist.
    #[error("unknown tool group `{pattern}`: expected one of {expected}")]
    UnknownGroup {
        /// The pattern as written.
        pattern: String,
        /// The groups that exist.
        expected: String,
    },
}

impl Pattern {
    /// Parse one pattern.
    ///
    /// # Errors
    /// An unknown group or an empty pattern, with what is expected.
    pub fn parse(s: &str) -> Result<Self, PatternError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(PatternError::Empty);
        }
        if let Some(g) = s.strip_prefix("group:") {
            let known = g == "mcp"
                || g == CUSTOM_GROUP
                || g.strip_prefix("mcp:").is_some_and(|n| !n.is_empty())
                || Group::named(g).is_some();
            if !known {
                let names: Vec<&str> = Group::ALL.iter().map(|g| g.name()).collect();
                return Err(PatternError::UnknownGroup {
                    pattern: s.to_string(),
                    expected: format!(
                        "group:{}, group:custom, group:mcp, group:mcp:SERVER",
                        names.join(", group:")
                    ),
                });
            }
            return Ok(Pattern::Group(g.to_string()));
        }
        Ok(Pattern::Name(s.to_string()))
    }

    /// Whether `tool` matches.
    pub fn matches(&self, tool: &str) -> bool {
        match self {
            Pattern::Name(p) => wildcard(p.as_bytes(), tool.as_bytes()),
            Pattern::Group(g) if g == "mcp" => tool.contains("__"),
            Pattern::Group(g) => match g.strip_prefix("mcp:") {
                Some(server) => tool
                    .strip_prefix(server)
                    .is_some_and(|rest| rest.starts_with("__")),
                None => Group::named(g).is_some_and(|g| g.has(tool)),
            },
        }
    }
}

/// `*` matches any run, `?` one byte; everything else literally.
pub fn wildcard(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while si < s.len() {
        if pi < p.len() && (p[pi] == b'?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some(pi);
            mark = si;
            pi += 1;
        } else if let Some(st) = star {
            pi = st + 1;
            mark += 1;
            si = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == b'*')
}

fn any(list: &[Pattern], tool: &str) -> bool {
    list.iter().any(|p| p.matches(tool))
}

/// The raw shape of one policy layer in the config file.
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyLayerFile {
    /// Starting set: `full`, `coding`, `messaging` or `minimal`.
    pub profile: Option<Profile>,
    /// If set, only tools matching one of these patterns (names, wildcards, `group:NAME`).
    pub allow: Option<Vec<String>>,
    /// Tools never allowed (deny wins over every allow).
    pub deny: Option<Vec<String>>,
    /// Tools added back on top of the profile and allow lists (not over a deny).
    pub also_allow: Option<Vec<String>>,
    /// Tools always offered with their full schema, like the core tools (names, wildcards,
    /// `group:NAME`); the others are loaded on demand by `tool_search`. Pins nothing the
    /// policy does not allow.
    pub always: Option<Vec<String>>,
}

/// `tools.policy`: the global layer plus per-provider layers.
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    /// Global profile (default `full`).
    pub profile: Option<Profile>,
    /// Global allow list.
    pub allow: Option<Vec<String>>,
    /// Global deny list.
    pub deny: Option<Vec<String>>,
    /// Global additions.
    pub also_allow: Option<Vec<String>>,
    /// Tools offered in full in every request, for every agent (see
    /// [`PolicyLayerFile::always`]).
    pub always: Option<Vec<String>>,
    /// Layers applied when the agent's primary provider has this name.
    #[serde(default)]
    pub by_provider: std::collections::BTreeMap<String, PolicyLayerFile>,
}

/// One validated layer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyLayer {
    /// Profile, if set at this layer.
    pub profile: Option<Profile>,
    /// Allow list, if set.
    pub allow: Option<Vec<Pattern>>,
    /// Deny list.
    pub deny: Vec<Pattern>,
    /// Additions.
    pub also_allow: Vec<Pattern>,
    /// Tools offered in full in every request (`always`).
    pub always: Vec<Pattern>,
}

fn parse_list(key: &str, list: Option<&Vec<String>>) -> Result<Option<Vec<Pattern>>, SettingError> {
    list.map(|l| {
        l.iter()
            .map(|s| Pattern::parse(s).map_err(|e| SettingError::new(key, e.to_string())))
            .collect()
    })
    .transpose()
}

impl PolicyLayerFile {
    /// Validate. `key` is the dotted path used in error messages.
    ///
    /// # Errors
    /// A pattern that does not parse, naming the key.
    pub fn resolve(&self, key: &str) -> Result<PolicyLayer, SettingError> {
        Ok(PolicyLayer {
            profile: self.profile,
            allow: parse_list(&format!("{key}.allow"), self.allow.as_ref())?,
            deny: parse_list(&format!("{key}.deny"), self.deny.as_ref())?.unwrap_or_default(),
            also_allow: parse_list(&format!("{key}.also_allow"), self.also_allow.as_ref())?
                .unwrap_or_default(),
            always: parse_list(&format!("{key}.always"), self.always.as_ref())?.unwrap_or_default(),
        })
    }
}

impl PolicyFile {
    /// Validate, picking the layer of `provider` (the agent's primary provider).
    ///
    /// # Errors
    /// A pattern that does not parse, naming the key.
    pub fn resolve(
        &self,
        provider: Option<&str>,
        agent: &PolicyLayer,
    ) -> Result<ToolPolicy, SettingError> {
        let global = PolicyLayerFile {
            profile: self.profile,
            allow: self.allow.clone(),
            deny: self.deny.clone(),
            also_allow: self.also_allow.clone(),
            always: self.always.clone(),
        }
        .resolve("tools.policy")?;
        let mut by_provider = None;
        for (name, layer) in &self.by_provider {
            let l = layer.resolve(&format!("tools.policy.by_provider.{name}"))?;
            if Some(name.as_str()) == provider {
                by_provider = Some(l);
            }
        }
        Ok(ToolPolicy {
            global,
            provider: by_provider,
            agent: agent.clone(),
            narrowed: Vec::new(),
        })
    }
}

/// The validated policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolPolicy {
    /// `tools.policy`.
    pub global: PolicyLayer,
    /// `tools.policy.by_provider.<primary provider>`.
    pub provider: Option<PolicyLayer>,
    /// `agents.defaults.tools`.
    pub agent: PolicyLayer,
    /// Extra deny lists added by [`ToolPolicy::narrowed`] (subagents): never widened.
    pub narrowed: Vec<Vec<Pattern>>,
}

/// Replace `group:custom` in `list` by the custom tools' `names`.
pub fn expand_custom_in(list: &mut Vec<Pattern>, names: &[String]) {
    let is_custom = |p: &Pattern| matches!(p, Pattern::Group(g) if g == CUSTOM_GROUP);
    if list.iter().any(is_custom) {
        list.retain(|p| !is_custom(p));
        list.extend(names.iter().map(|n| Pattern::Name(n.clone())));
    }
}

impl PolicyLayer {
    fn expand_custom(&mut self, names: &[String]) {
        if let Some(a) = &mut self.allow {
            expand_custom_in(a, names);
        }
        expand_custom_in(&mut self.deny, names);
        expand_custom_in(&mut self.also_allow, names);
        expand_custom_in(&mut self.always, names);
    }
}

impl ToolPolicy {
    /// Replace `group:custom` in every layer by the names of the custom tools (exact names:
    /// a custom tool named with a `*` is matched literally).
    pub fn expand_custom(&mut self, names: &[String]) {
        self.global.expand_custom(names);
        if let Some(p) = &mut self.provider {
            p.expand_custom(names);
        }
        self.agent.expand_custom(names);
    }

    /// Everything allowed (the `full` profile, no lists).
    pub fn allow_all() -> Self {
        Self::default()
    }

    fn layers(&self) -> impl Iterator<Item = &PolicyLayer> {
        std::iter::once(&self.global)
            .chain(self.provider.as_ref())
            .chain(std::iter::once(&self.agent))
    }

    /// The profile in force.
    pub fn profile(&self) -> Profile {
        self.agent
            .profile
            .or(self.provider.as_ref().and_then(|p| p.profile))
            .or(self.global.profile)
            .unwrap_or(Profile::Full)
    }

    /// Whether a layer pins `tool` (`always`): offered in full in every request, not loaded
    /// on demand. Says nothing about whether it is allowed.
    pub fn pinned(&self, tool: &str) -> bool {
        self.layers().any(|l| any(&l.always, tool))
    }

    /// Whether the model may see and call `tool`.
    pub fn allows(&self, tool: &str) -> bool {
        if super::builtin::is_opt_in(tool) {
            return self
                .layers()
                .any(|l| l.also_allow.iter().any(|p| opts_in(p, tool)))
                && !self.layers().any(|l| any(&l.deny, tool))
                && !self.narrowed.iter().any(|d| any(d, tool));
        }
        let mut ok = self.profile().includes(tool)
            && self
                .layers()
                .all(|l| l.allow.as_ref().is_none_or(|a| any(a, tool)));
        if !ok {
            ok = self.layers().any(|l| any(&l.also_allow, tool));
        }
        ok && !self.layers().any(|l| any(&l.deny, tool))
            && !self.narrowed.iter().any(|d| any(d, tool))
    }

    /// This policy with `deny` added: the result never allows more than `self`.
    pub fn narrowed(&self, deny: Vec<Pattern>) -> Self {
        let mut p = self.clone();
        p.narrowed.push(deny);
        p
    }

    /// The allowed subset of `names`.
    pub fn filter<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> BTreeSet<&'a str> {
        names.into_iter().filter(|n| self.allows(n)).collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    const ALL: &[&str] = &[
        "read_file",
        "write_file",
        "edit_file",
        "list_directory",
        "glob",
        "grep",
        "exec_shell",
        "spawn",
        "web_search",
        "web_fetch",
        "memory_read",
        "memory_write",
        "message",
        "sessions_list",
        "sessions_history",
        "sessions_send",
        "session_status",
        "subagents",
        "use_skill",
        "github__create_issue",
        "fs__read",
    ];

    fn layer(toml_text: &str) -> PolicyLayer {
        let f: PolicyLayerFile = serde_json::from_str(toml_text).unwrap();
        f.resolve("x").unwrap()
    }

    fn allowed(p: &ToolPolicy) -> Vec<&'static str> {
        ALL.iter().copied().filter(|t| p.allows(t)).collect()
    }

    #[test]
    fn wildcards() {
        assert!(wildcard(b"github__*", b"github__create_issue"));
        assert!(wildcard(b"*_file", b"read_file"));
        assert!(wildcard(b"re?d_file", b"read_file"));
        assert!(!wildcard(b"read", b"read_file"));
        assert!(wildcard(b"*", b""));
        assert!(!wildcard(b"a*b", b"ac"));
    }

    #[test]
    fn profiles() {
        let mut p = ToolPolicy::allow_all();
        assert_eq!(allowed(&p).len(), ALL.len());
        p.global.profile = Some(Profile::Coding);
        let a = allowed(&p);
        assert!(a.contains(&"exec_shell") && a.contains(&"grep") && a.contains(&"web_fetch"));
        assert!(!a.contains(&"message") && !a.contains(&"github__create_issue"));
        assert!(a.contains(&"sessions_send") && a.contains(&"subagents"));
        // Seed 004's table: messaging is the messaging group and four session tools, minimal
        // is session_status alone.
        p.global.profile = Some(Profile::Messaging);
        assert_eq!(
            allowed(&p),
            [
                "message",
                "sessions_list",
                "sessions_history",
                "sessions_send",
                "session_status"
            ]
        );
        p.global.profile = Some(Profile::Minimal);
        assert_eq!(allowed(&p), ["session_status"]);
        // The agent layer's profile is the most specific.
        p.agent.profile = Some(Profile::Full);
        assert_eq!(allowed(&p).len(), ALL.len());
    }

    #[test]
    fn allow_lists_intersect_also_allow_adds_and_deny_wins() {
        let p = ToolPolicy {
            global: layer(r#"{"allow": ["group:fs", "group:mcp", "exec_shell"]}"#),
            provider: Some(layer(
                r#"{"allow": ["group:fs", "github__*", "exec_shell"]}"#,
            )),
            agent: layer(
                r#"{"deny": ["write_file", "exec_shell"], "also_allow": ["memory_read", "exec_shell"]}"#,
            ),
            narrowed: vec![],
        };
        assert_eq!(
            allowed(&p),
            [
                "read_file",
                "edit_file",
                "list_directory",
                "glob",
                "grep",
                "memory_read",
                "github__create_issue"
            ]
        );
        let n = p.narrowed(vec![Pattern::parse("group:mcp:github").unwrap()]);
        assert!(!n.allows("github__create_issue"));
        assert!(n.allows("read_file"));
        // Narrowing never widens.
        for t in ALL {
            assert!(!n.allows(t) || p.allows(t));
        }
    }

    #[test]
    fn unknown_groups_are_config_errors_naming_the_key() {
        let f: PolicyLayerFile = serde_json::from_str(r#"{"deny": ["group:nope"]}"#).unwrap();
        let e = f.resolve("agents.defaults.tools").unwrap_err();
        assert_eq!(e.key, "agents.defaults.tools.deny");
        let e = e.to_string();
        assert!(e.contains("agents.defaults.tools.deny"), "{e}");
        assert!(e.contains("group:fs"), "{e}");
        assert!(Pattern::parse("group:mcp:github").is_ok());
        assert!(Pattern::parse(" ").is_err());
    }

    #[test]
    fn gateway_is_opt_in_by_name_or_group_and_deny_still_wins() {
        // Denied under every profile and every allow list, even `*`.
        let mut p = ToolPolicy::allow_all();
        assert!(!p.allows("gateway") && p.allows("cron"));
        p.global = layer(r#"{"allow": ["*"], "also_allow": ["*", "gate*"]}"#);
        assert!(!p.allows("gateway"), "a wildcard opted gateway in");
        // Named in any layer's also_allow: allowed.
        p.agent = layer(r#"{"also_allow": ["gateway"]}"#);
        assert!(p.allows("gateway"));
        p.agent = PolicyLayer::default();
        p.provider = Some(layer(r#"{"also_allow": ["group:automation"]}"#));
        assert!(p.allows("gateway"));
        // Deny wins, and so does a narrowing (subagents).
        p.global = layer(r#"{"deny": ["group:automation"]}"#);
        assert!(!p.allows("gateway") && !p.allows("cron"));
        p.global = PolicyLayer::default();
        assert!(p.allows("gateway"));
        let n = p.narrowed(vec![Pattern::Name("gateway".into())]);
        assert!(!n.allows("gateway"));
        assert_eq!(group_of("cron"), Some("automation"));
    }

    #[test]
    fn provider_layer_applies_only_to_its_provider() {
        let f: PolicyFile =
            serde_json::from_str(r#"{"by_provider": {"openrouter": {"deny": ["group:runtime"]}}}"#)
                .unwrap();
        let p = f.resolve(Some("openai"), &PolicyLayer::default()).unwrap();
        assert!(p.allows("exec_shell"));
        let p = f
            .resolve(Some("openrouter"), &PolicyLayer::default())
            .unwrap();
        assert!(!p.allows("exec_shell") && !p.allows("spawn") && p.allows("read_file"));
        assert_eq!(group_of("spawn"), Some("runtime"));
        assert_eq!(group_of("x__y"), Some("mcp"));
    }
}
