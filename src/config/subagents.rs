//! `tools.subagents`: the supervisor's limits (seed 004 §6 defaults).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::types::SettingError;

/// The resolved limits.
#[derive(Clone, Debug, PartialEq)]
pub struct SubagentSettings {
    /// Subagents running at once across all parents.
    pub max_concurrent: usize,
    /// Deepest nesting: a chat session is depth 0, its children depth 1.
    pub max_spawn_depth: u32,
    /// Running children one agent (session or subagent) may have.
    pub max_children_per_agent: usize,
    /// Subagents one chat session's tree may start per rolling hour: a model that spawns
    /// again each time a result wakes it stops here.
    pub max_spawns_per_hour: usize,
    /// LLM rounds per subagent run.
    pub max_iterations: u32,
    /// Wall-clock limit of one run.
    pub run_timeout: Duration,
    /// Finished tasks are archived (hidden from `list`) after this long.
    pub archive_after: Duration,
    /// Results finishing within this window are announced to the parent together.
    pub announce_debounce: Duration,
    /// Whether subagents may call `memory_write`.
    pub allow_memory_write: bool,
    /// More tools denied to subagents (names, `*` wildcards, `group:NAME`).
    pub deny: Vec<crate::tools::policy::Pattern>,
}

impl Default for SubagentSettings {
    fn default() -> Self {
        Self {
            max_concurrent: 8,
            max_spawn_depth: 1,
            max_children_per_agent: 5,
            max_spawns_per_hour: 100,
            max_iterations: 20,
            run_timeout: Duration::from_secs(300),
            archive_after: Duration::from_secs(3600),
            announce_debounce: Duration::from_millis(1000),
            allow_memory_write: false,
            deny: Vec::new(),
        }
    }
}

/// `tools.subagents` as written in the config file.
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SubagentsFile {
    /// Subagents running at once across all sessions (default 8, 1-256).
    pub max_concurrent: Option<u64>,
    /// Deepest nesting; a chat session is depth 0 (default 1: subagents cannot spawn; 0
    /// disables subagents; at most 5).
    pub max_spawn_depth: Option<u32>,
    /// Running children per agent (default 5, 1-64).
    pub max_children_per_agent: Option<u64>,
    /// Subagents one chat session's tree may start per rolling hour (default 100, 1-10000).
    pub max_spawns_per_hour: Option<u64>,
    /// LLM rounds per subagent run (default 20, 1-200).
    pub max_iterations: Option<u32>,
    /// Wall-clock limit of one run in seconds (default 300, 1-86400).
    pub run_timeout_secs: Option<u64>,
    /// Minutes after which finished tasks are archived (default 60, 1-10080).
    pub archive_after_minutes: Option<u64>,
    /// Results finishing within this many milliseconds are announced together (default 1000,
    /// at most 60000).
    pub announce_debounce_ms: Option<u64>,
    /// Let subagents call `memory_write` (default false).
    pub allow_memory_write: Option<bool>,
    /// More tools denied to subagents (names, `*` wildcards, `group:NAME`; default none).
    pub deny: Option<Vec<String>>,
}

/// Errors of this section are about `tools.subagents`; the detail names the field.
const KEY: &str = "tools.subagents";

fn ranged(
    key: &str,
    v: Option<u64>,
    default: u64,
    min: u64,
    max: u64,
) -> Result<u64, SettingError> {
    match v {
        None => Ok(default),
        Some(n) if (min..=max).contains(&n) => Ok(n),
        Some(n) => Err(SettingError::new(
            KEY,
            format!("{key} = {n}: expected {min} to {max}"),
        )),
    }
}

impl SubagentsFile {
    /// Validate.
    ///
    /// # Errors
    /// The key and the accepted range.
    pub fn resolve(&self) -> Result<SubagentSettings, SettingError> {
        let d = SubagentSettings::default();
        let deny = self
            .deny
            .iter()
            .flatten()
            .map(|p| {
                crate::tools::policy::Pattern::parse(p)
                    .map_err(|e| SettingError::new(KEY, format!("deny: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SubagentSettings {
            max_concurrent: usize::try_from(ranged(
                "max_concurrent",
                self.max_concurrent,
                8,
                1,
                256,
            )?)
            .unwrap_or(8),
            max_spawn_depth: u32::try_from(ranged(
                "max_spawn_depth",
                self.max_spawn_depth.map(u64::from),
                1,
                0,
                5,
            )?)
            .unwrap_or(1),
            max_children_per_agent: usize::try_from(ranged(
                "max_children_per_agent",
                self.max_children_per_agent,
                5,
                1,
                64,
            )?)
            .unwrap_or(5),
            max_spawns_per_hour: usize::try_from(ranged(
                "max_spawns_per_hour",
                self.max_spawns_per_hour,
                100,
                1,
                10_000,
            )?)
            .unwrap_or(100),
            max_iterations: u32::try_from(ranged(
                "max_iterations",
                self.max_iterations.map(u64::from),
                20,
                1,
                200,
            )?)
            .unwrap_or(20),
            run_timeout: Duration::from_secs(ranged(
                "run_timeout_secs",
                self.run_timeout_secs,
                300,
                1,
                86_400,
            )?),
            archive_after: Duration::from_secs(
                60 * ranged(
                    "archive_after_minutes",
                    self.archive_after_minutes,
                    60,
                    1,
                    10_080,
                )?,
            ),
            announce_debounce: Duration::from_millis(ranged(
                "announce_debounce_ms",
                self.announce_debounce_ms,
                1000,
                0,
                60_000,
            )?),
            allow_memory_write: self.allow_memory_write.unwrap_or(d.allow_memory_write),
            deny,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn defaults_are_seed_004s() {
        let s = SubagentsFile::default().resolve().unwrap();
        assert_eq!(s, SubagentSettings::default());
        assert_eq!(
            (
                s.max_concurrent,
                s.max_spawn_depth,
                s.max_children_per_agent
            ),
            (8, 1, 5)
        );
        assert_eq!(s.max_iterations, 20);
        assert_eq!(s.run_timeout, Duration::from_secs(300));
        assert_eq!(s.archive_after, Duration::from_secs(3600));
    }

    #[test]
    fn out_of_range_values_name_the_key() {
        let f = SubagentsFile {
            max_concurrent: Some(0),
            ..SubagentsFile::default()
        };
        assert_eq!(
            f.resolve().unwrap_err(),
            SettingError::new("tools.subagents", "max_concurrent = 0: expected 1 to 256")
        );
        let f = SubagentsFile {
            max_spawn_depth: Some(9),
            ..SubagentsFile::default()
        };
        assert!(f
            .resolve()
            .unwrap_err()
            .detail
            .contains("max_spawn_depth = 9"));
        let f = SubagentsFile {
            deny: Some(vec!["group:nope".into()]),
            ..SubagentsFile::default()
        };
        assert!(f
            .resolve()
            .unwrap_err()
            .detail
            .starts_with("deny: unknown tool group"));
    }
}
