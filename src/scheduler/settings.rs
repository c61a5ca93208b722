//! `scheduler.*` settings: the file's shape and the checked values. The config layer aggregates
//! them; this module never imports it.

use serde::{Deserialize, Serialize};

use super::schedule::DEFAULT_MIN_INTERVAL_SECS;

/// Jobs one session may own unless configured otherwise (20).
pub const DEFAULT_MAX_JOBS_PER_SESSION: u32 = 20;
/// Runs one job may make in a UTC day unless configured otherwise (144, one every 10 minutes):
/// each run is an LLM turn; a schedule that would exceed it is refused when added.
pub const DEFAULT_MAX_RUNS_PER_DAY: u32 = 144;
/// Consecutive failed runs after which a job is paused and its owner told (3).
pub const DEFAULT_PAUSE_AFTER_FAILURES: u32 = 3;

/// `scheduler` in the config file.
#[derive(Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SchedulerFile {
    /// Jobs one session may own (default 20).
    pub max_jobs_per_session: Option<u32>,
    /// Shortest `every` interval in seconds (default 60).
    pub min_interval_secs: Option<u64>,
    /// Most runs of one job in a UTC day (default 144).
    pub max_runs_per_day: Option<u32>,
    /// Consecutive failures that pause a job (default 3).
    pub pause_after_failures: Option<u32>,
}

/// The checked `scheduler` settings: the limits [`super::jobs::JobStore`] enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerSettings {
    /// Jobs one owner session may have.
    pub max_jobs_per_session: u32,
    /// Shortest `every` interval, seconds.
    pub min_interval_secs: u64,
    /// Most runs of one job per UTC day.
    pub max_runs_per_day: u32,
    /// Consecutive failures that pause a job.
    pub pause_after_failures: u32,
}

impl Default for SchedulerSettings {
    fn default() -> Self {
        Self {
            max_jobs_per_session: DEFAULT_MAX_JOBS_PER_SESSION,
            min_interval_secs: DEFAULT_MIN_INTERVAL_SECS,
            max_runs_per_day: DEFAULT_MAX_RUNS_PER_DAY,
            pause_after_failures: DEFAULT_PAUSE_AFTER_FAILURES,
        }
    }
}

impl SchedulerFile {
    /// The checked settings.
    ///
    /// # Errors
    /// A value out of range, naming its key.
    pub fn resolve(&self) -> Result<SchedulerSettings, crate::types::SettingError> {
        let d = SchedulerSettings::default();
        let s = SchedulerSettings {
            max_jobs_per_session: self.max_jobs_per_session.unwrap_or(d.max_jobs_per_session),
            min_interval_secs: self.min_interval_secs.unwrap_or(d.min_interval_secs),
            max_runs_per_day: self.max_runs_per_day.unwrap_or(d.max_runs_per_day),
            pause_after_failures: self.pause_after_failures.unwrap_or(d.pause_after_failures),
        };
        let positive = |key: &str, v: u64| {
            if v == 0 {
                Err(crate::types::SettingError::new(
                    format!("scheduler.{key}"),
                    "must be at least 1",
                ))
            } else {
                Ok(())
            }
        };
        positive("max_jobs_per_session", s.max_jobs_per_session.into())?;
        positive("min_interval_secs", s.min_interval_secs)?;
        positive("max_runs_per_day", s.max_runs_per_day.into())?;
        positive("pause_after_failures", s.pause_after_failures.into())?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn defaults_and_overrides() {
        assert_eq!(
            SchedulerFile::default().resolve().unwrap(),
            SchedulerSettings::default()
        );
        let f: SchedulerFile = serde_json::from_value(
            serde_json::json!({"min_interval_secs": 300, "max_runs_per_day": 24}),
        )
        .unwrap();
        let s = f.resolve().unwrap();
        assert_eq!((s.min_interval_secs, s.max_runs_per_day), (300, 24));
    }

    #[test]
    fn zero_is_refused_naming_the_key() {
        let f = SchedulerFile {
            pause_after_failures: Some(0),
            ..SchedulerFile::default()
        };
        let e = f.resolve().unwrap_err();
        assert_eq!(e.key, "scheduler.pause_after_failures");
        let unknown =
            serde_json::from_value::<SchedulerFile>(serde_json::json!({"min_interval": 5}));
        assert!(unknown
            .unwrap_err()
            .to_string()
            .contains("unknown field `min_interval`"));
    }
}
