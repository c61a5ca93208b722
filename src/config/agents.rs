//! Several agents in one gateway: `agents.NAME` over `agents.defaults` ([`merge_agent`]), and
//! the `[[bindings]]` that choose which agent serves a message ([`Bindings`]).

use std::collections::BTreeMap;

use super::error::ConfigError;
use super::file::{AgentDefaultsFile, BindingFile};
use super::subagents::SubagentsFile;
use super::types::{AgentConfig, ProviderConfig};
use crate::types::session_key::DEFAULT_AGENT;

/// Longest agent name.
const MAX_AGENT_NAME: usize = 32;

/// Check an agent name: 1-32 of `a-z`, `0-9`, `_`, `-`.
///
/// # Errors
/// [`ConfigError::Invalid`] naming `agents.NAME`.
pub fn check_agent_name(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_AGENT_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid {
            key: format!("agents.{name}"),
            detail: "an agent name is 1 to 32 of a-z, 0-9, `_` and `-` (it is part of session keys and metric labels)".into(),
        })
    }
}

/// `over`'s keys over `base`'s: `over.key.or(base.key)` for each listed key.
macro_rules! overlay {
    ($base:expr, $over:expr; $($f:ident),+ $(,)?) => {
        $( $base.$f = $over.$f.or($base.$f.take()); )+
    };
}

/// Two optional tables merged key by key with `merge`.
fn table<T>(base: Option<T>, over: Option<T>, merge: impl Fn(&mut T, T)) -> Option<T> {
    match (base, over) {
        (Some(mut b), Some(o)) => {
            merge(&mut b, o);
            Some(b)
        }
        (b, o) => o.or(b),
    }
}

/// `tools.subagents` keys of `over` over `base`'s.
pub fn merge_subagents(base: &mut SubagentsFile, over: SubagentsFile) {
    overlay!(base, over; max_concurrent, max_spawn_depth, max_children_per_agent,
        max_spawns_per_hour, max_iterations, run_timeout_secs, archive_after_minutes,
        announce_debounce_ms, allow_memory_write, deny);
}

/// `agents.NAME` over `agents.defaults`: every key the agent sets replaces the default's; the
/// tables (`tools`, `compaction`, `budgets`, `subagents`) are merged key by key.
pub fn merge_agent(defaults: &AgentDefaultsFile, over: AgentDefaultsFile) -> AgentDefaultsFile {
    let mut b = defaults.clone();
    let o = over;
    overlay!(b, o; model, max_tool_iterations, loop_repeat_limit, max_tool_calls_per_turn,
        workspace, provider, fallback, system_prompt, max_tokens, temperature, stream,
        context_window, models, mcp_servers, vision, timezone, reply_with_voice, nodes,
        prompt_budget_tokens);
    b.tools = table(b.tools.take(), o.tools, |b, o| {
        overlay!(b, o; profile, allow, deny, also_allow);
    });
    b.compaction = table(b.compaction.take(), o.compaction, |b, o| {
        overlay!(b, o; threshold, model);
    });
    b.budgets = table(b.budgets.take(), o.budgets, |b, o| {
        overlay!(b, o; daily_usd, monthly_usd, daily_tokens, monthly_tokens);
    });
    b.subagents = table(b.subagents.take(), o.subagents, merge_subagents);
    b
}

/// Rename the key of an error found while resolving `agents.NAME` (the resolvers name
/// `agents.defaults.*`).
pub fn rename_error(e: ConfigError, name: &str) -> ConfigError {
    let fix = |k: String| match k.strip_prefix("agents.defaults") {
        Some(rest) => format!("agents.{name}{rest}"),
        None => k,
    };
    match e {
        ConfigError::Invalid { key, detail } => ConfigError::Invalid {
            key: fix(key),
            detail,
        },
        ConfigError::Secret { key, detail } => ConfigError::Secret {
            key: fix(key),
            detail,
        },
        other => other,
    }
}

/// One agent beside the default one (`agents.NAME`), resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedAgent {
    /// `NAME`.
    pub name: String,
    /// Its behaviour (workspace, prompt, limits, models).
    pub agent: AgentConfig,
    /// Its providers in fallback order.
    pub providers: Vec<ProviderConfig>,
    /// Its tool policy (its `tools` layer over `tools.policy`, for its primary provider).
    pub policy: crate::tools::policy::ToolPolicy,
}

/// One `[[bindings]]` entry, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The agent it selects.
    pub agent: String,
    /// `channel`.
    pub channel: Option<String>,
    /// `account`.
    pub account: Option<String>,
    /// `chat`.
    pub chat: Option<String>,
    /// `user`.
    pub user: Option<String>,
    /// `thread`.
    pub thread: Option<String>,
    /// Its position in the file (1-based), for messages.
    pub index: usize,
}

/// What a message offers to the bindings.
#[derive(Clone, Copy, Debug)]
pub struct Route<'a> {
    /// The channel id of the message (`telegram`, or `telegram.work` for a second bot).
    pub channel_id: &'a str,
    /// Chat id.
    pub chat: &'a str,
    /// Sender id.
    pub user: &'a str,
    /// Thread id.
    pub thread: Option<&'a str>,
}

impl Binding {
    fn fields(&self) -> [Option<&str>; 5] {
        [
            self.channel.as_deref(),
            self.account.as_deref(),
            self.chat.as_deref(),
            self.user.as_deref(),
            self.thread.as_deref(),
        ]
    }

    /// How many keys it sets: the more, the more specific.
    pub fn specificity(&self) -> usize {
        self.fields().iter().flatten().count()
    }

    /// Whether `r` matches every key it sets.
    pub fn matches(&self, r: &Route<'_>) -> bool {
        let (channel, account) = super::channels::split_channel_id(r.channel_id);
        let got = [
            Some(channel),
            Some(account),
            Some(r.chat),
            Some(r.user),
            r.thread,
        ];
        self.fields()
            .iter()
            .zip(got)
            .all(|(want, got)| want.is_none_or(|w| Some(w) == got))
    }

    /// Whether one message could match both (no key both set to different values).
    fn overlaps(&self, other: &Binding) -> bool {
        self.fields()
            .iter()
            .zip(other.fields())
            .all(|(a, b)| match (a, b) {
                (Some(a), Some(b)) => *a == b,
                _ => true,
            })
    }

    /// `[[bindings]] #N (agent = "work", channel = "telegram", chat = "42")`.
    pub fn describe(&self) -> String {
        let mut parts = vec![format!("agent = \"{}\"", self.agent)];
        for (k, v) in ["channel", "account", "chat", "user", "thread"]
            .iter()
            .zip(self.fields())
        {
            if let Some(v) = v {
                parts.push(format!("{k} = \"{v}\""));
            }
        }
        format!("[[bindings]] #{} ({})", self.index, parts.join(", "))
    }
}

/// The bindings, most specific first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bindings(Vec<Binding>);

impl Bindings {
    /// Check `[[bindings]]` against the agents that exist (`main` and `named`).
    ///
    /// # Errors
    /// An unknown agent, a binding without any key, or two bindings one message could match
    /// with the same number of keys (naming both).
    pub fn resolve(
        files: Vec<BindingFile>,
        named: &BTreeMap<String, AgentDefaultsFile>,
    ) -> Result<Self, ConfigError> {
        let mut out: Vec<Binding> = Vec::new();
        for (i, f) in files.into_iter().enumerate() {
            let key = format!("bindings[{i}]");
            if f.agent != DEFAULT_AGENT && !named.contains_key(&f.agent) {
                let mut known = vec![DEFAULT_AGENT.to_string()];
                known.extend(named.keys().cloned());
                return Err(ConfigError::Invalid {
                    key: format!("{key}.agent"),
                    detail: format!(
                        "no agent named `{}`; agents: {} (add [agents.{}])",
                        f.agent,
                        known.join(", "),
                        f.agent
                    ),
                });
            }
            let text = |v: Option<super::file::IdFile>| v.map(|v| v.to_string());
            let b = Binding {
                agent: f.agent,
                channel: f.channel.map(|c| c.trim().to_string()),
                account: f.account.map(|c| c.trim().to_string()),
                chat: text(f.chat),
                user: text(f.user),
                thread: text(f.thread),
                index: i + 1,
            };
            if b.specificity() == 0 {
                return Err(ConfigError::Invalid {
                    key,
                    detail: "a binding needs at least one of channel, account, chat, user, thread (the default agent `main` serves what no binding matches)".into(),
                });
            }
            if b.fields().iter().flatten().any(|v| v.is_empty()) {
                return Err(ConfigError::Invalid {
                    key,
                    detail: "a binding's keys cannot be empty".into(),
                });
            }
            if let Some(o) = out
                .iter()
                .find(|o| o.specificity() == b.specificity() && o.overlaps(&b))
            {
                return Err(ConfigError::Invalid {
                    key,
                    detail: format!(
                        "{} and {} can both match the same message with the same number of keys, so which agent serves it would be ambiguous: add a key to the more specific one, or remove one",
                        o.describe(),
                        b.describe()
                    ),
                });
            }
            out.push(b);
        }
        out.sort_by_key(|b| std::cmp::Reverse(b.specificity()));
        Ok(Self(out))
    }

    /// The agent serving `r`: the most specific matching binding's, or `main`.
    pub fn agent_for(&self, r: &Route<'_>) -> &str {
        self.0
            .iter()
            .find(|b| b.matches(r))
            .map_or(DEFAULT_AGENT, |b| b.agent.as_str())
    }

    /// The bindings, most specific first.
    pub fn iter(&self) -> impl Iterator<Item = &Binding> {
        self.0.iter()
    }

    /// No bindings.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn files(text: &str) -> Vec<BindingFile> {
        #[derive(serde::Deserialize)]
        struct F {
            bindings: Vec<BindingFile>,
        }
        config::Config::builder()
            .add_source(config::File::from_str(text, config::FileFormat::Toml))
            .build()
            .unwrap()
            .try_deserialize::<F>()
            .unwrap()
            .bindings
    }

    fn named(names: &[&str]) -> BTreeMap<String, AgentDefaultsFile> {
        names
            .iter()
            .map(|n| ((*n).to_string(), AgentDefaultsFile::default()))
            .collect()
    }

    fn route<'a>(ch: &'a str, chat: &'a str, user: &'a str) -> Route<'a> {
        Route {
            channel_id: ch,
            chat,
            user,
            thread: None,
        }
    }

    #[test]
    fn the_most_specific_binding_wins_and_nothing_matching_is_main() {
        let b = Bindings::resolve(
            files(
                r#"
[[bindings]]
agent = "family"
channel = "telegram"
[[bindings]]
agent = "work"
channel = "telegram"
chat = -100
[[bindings]]
agent = "bot2"
account = "work"
"#,
            ),
            &named(&["family", "work", "bot2"]),
        );
        // `channel = telegram` and `account = work` tie on telegram.work: refused.
        let e = b.unwrap_err().to_string();
        assert!(e.contains("#1") && e.contains("#3"), "{e}");

        let b = Bindings::resolve(
            files(
                r#"
[[bindings]]
agent = "family"
channel = "telegram"
[[bindings]]
agent = "work"
channel = "telegram"
chat = -100
[[bindings]]
agent = "bot2"
channel = "telegram"
account = "work"
chat = "5"
"#,
            ),
            &named(&["family", "work", "bot2"]),
        )
        .unwrap();
        assert_eq!(b.agent_for(&route("telegram", "-100", "7")), "work");
        assert_eq!(b.agent_for(&route("telegram", "5", "7")), "family");
        assert_eq!(b.agent_for(&route("telegram.work", "5", "7")), "bot2");
        assert_eq!(b.agent_for(&route("telegram.work", "-100", "7")), "work");
        assert_eq!(b.agent_for(&route("slack", "C1", "U1")), "main");
    }

    #[test]
    fn bindings_to_unknown_agents_or_without_keys_are_refused() {
        let e = Bindings::resolve(
            files("[[bindings]]\nagent = \"nope\"\nchannel = \"telegram\"\n"),
            &named(&["work"]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("bindings[0].agent") && e.contains("main, work"),
            "{e}"
        );
        let e = Bindings::resolve(files("[[bindings]]\nagent = \"work\"\n"), &named(&["work"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least one"), "{e}");
    }

    #[test]
    fn an_agent_inherits_every_default_it_does_not_set() {
        let d: AgentDefaultsFile = serde_json::from_str(
            r#"{"model": "m1", "system_prompt": "base", "tools": {"deny": ["exec_shell"]}, "compaction": {"threshold": 0.5}}"#,
        )
        .unwrap();
        let w: AgentDefaultsFile =
            serde_json::from_str(r#"{"model": "m2", "compaction": {"model": "cheap"}}"#).unwrap();
        let m = merge_agent(&d, w);
        assert_eq!(m.model.as_deref(), Some("m2"));
        assert_eq!(m.system_prompt.as_deref(), Some("base"));
        assert_eq!(m.tools.unwrap().deny, Some(vec!["exec_shell".to_string()]));
        let c = m.compaction.unwrap();
        assert_eq!(
            (c.threshold, c.model.as_deref()),
            (Some(0.5), Some("cheap"))
        );
    }

    #[test]
    fn agent_names_are_checked() {
        for ok in ["work", "a", "family-bot_2"] {
            assert!(check_agent_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Work", "a:b", "a@b", "a.b", &"x".repeat(33)] {
            assert!(check_agent_name(bad).is_err(), "{bad:?}");
        }
    }
}
