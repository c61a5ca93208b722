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

/// Default time between heartbeats (30 minutes).
pub const DEFAULT_HEARTBEAT_EVERY: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// `heartbeat` in the config file. Off unless `enabled = true`.
#[derive(Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatFile {
    /// Run the heartbeat (default false).
    pub enabled: Option<bool>,
    /// Time between heartbeats: `"30m"` (default), `"1h"`, `"90s"`, or seconds.
    pub every: Option<String>,
    /// Where a heartbeat's findings are delivered (required when enabled).
    pub target: Option<super::jobs::Target>,
    /// Model asked for heartbeat turns (a cheaper one); default: the agent's.
    pub model: Option<String>,
    /// Run only between these local times.
    pub active_hours: Option<ActiveHoursFile>,
}

/// `heartbeat.active_hours`.
#[derive(Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ActiveHoursFile {
    /// Start, `HH:MM` local time (inclusive).
    pub start: String,
    /// End, `HH:MM` local time (exclusive); before `start` means the window spans midnight.
    pub end: String,
    /// IANA zone of the times (default `UTC`).
    pub tz: Option<String>,
}

/// The checked heartbeat settings (present only when enabled).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeartbeatSettings {
    /// Time between heartbeats.
    pub every: std::time::Duration,
    /// Where findings go.
    pub target: super::jobs::Target,
    /// Model for heartbeat turns.
    pub model: Option<String>,
    /// The local window, if any.
    pub active_hours: Option<ActiveHours>,
}

/// A daily window of local time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActiveHours {
    /// Start, minutes after local midnight.
    pub start: u32,
    /// End, minutes after local midnight (exclusive).
    pub end: u32,
    /// Zone name.
    pub tz: String,
}

impl ActiveHours {
    /// Whether `now` falls in the window (a zone that cannot be read counts as UTC, with a
    /// warning; it was checked when the config was loaded).
    pub fn contains(&self, now: chrono::DateTime<chrono::Utc>) -> bool {
        let zone = super::tz::Zone::load(&self.tz).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "heartbeat.active_hours.tz unreadable; using UTC");
            super::tz::Zone::utc()
        });
        let t = now.timestamp();
        let local = t + i64::from(zone.offset_at(t));
        let minute = u32::try_from(local.rem_euclid(86_400) / 60).unwrap_or(0);
        if self.start <= self.end {
            (self.start..self.end).contains(&minute)
        } else {
            minute >= self.start || minute < self.end
        }
    }
}

/// `"30m"`, `"1h"`, `"90s"`, `"1d"`, `"2h30m"` or plain seconds (`heartbeat.every`,
/// `weft cron add --every`); `None` when it does not parse.
pub fn parse_every(text: &str) -> Option<std::time::Duration> {
    let text = text.trim();
    if let Ok(n) = text.parse::<u64>() {
        return Some(std::time::Duration::from_secs(n));
    }
    let (mut total, mut num) = (0u64, String::new());
    for c in text.chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let n: u64 = num.parse().ok()?;
        num.clear();
        total += n * match c {
            'd' => 86_400,
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return None,
        };
    }
    num.is_empty()
        .then_some(std::time::Duration::from_secs(total))
}

fn parse_hhmm(key: &str, text: &str) -> Result<u32, crate::types::SettingError> {
    let bad = || {
        crate::types::SettingError::new(
            key,
            format!("`{text}` is not a time of day; write it as HH:MM, e.g. \"08:00\""),
        )
    };
    let (h, m) = text.trim().split_once(':').ok_or_else(bad)?;
    let (h, m): (u32, u32) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if h > 24 || m > 59 || (h == 24 && m > 0) {
        return Err(bad());
    }
    Ok(h * 60 + m)
}

impl HeartbeatFile {
    /// The checked settings: `None` when the heartbeat is off.
    ///
    /// # Errors
    /// A value that does not parse or a missing target, naming its key.
    pub fn resolve(&self) -> Result<Option<HeartbeatSettings>, crate::types::SettingError> {
        let every = match &self.every {
            None => DEFAULT_HEARTBEAT_EVERY,
            Some(t) => parse_every(t).filter(|d| !d.is_zero()).ok_or_else(|| {
                crate::types::SettingError::new(
                    "heartbeat.every",
                    format!("`{t}` is not a duration; write e.g. \"30m\", \"1h\" or \"90s\""),
                )
            })?,
        };
        let active_hours = match &self.active_hours {
            None => None,
            Some(a) => {
                let tz = a.tz.clone().unwrap_or_else(|| "UTC".into());
                super::tz::Zone::load(&tz).map_err(|e| {
                    crate::types::SettingError::new("heartbeat.active_hours.tz", e.to_string())
                })?;
                let h = ActiveHours {
                    start: parse_hhmm("heartbeat.active_hours.start", &a.start)?,
                    end: parse_hhmm("heartbeat.active_hours.end", &a.end)?,
                    tz,
                };
                if h.start == h.end {
                    return Err(crate::types::SettingError::new(
                        "heartbeat.active_hours",
                        "start and end are equal: the window would be empty; remove active_hours to run at any hour",
                    ));
                }
                Some(h)
            }
        };
        if self.enabled != Some(true) {
            return Ok(None);
        }
        let target = self.target.clone().ok_or_else(|| {
            crate::types::SettingError::new(
                "heartbeat.target",
                "is required when the heartbeat is enabled: the chat its findings go to, e.g. { channel = \"telegram\", chat_id = \"123456\" }",
            )
        })?;
        if target.channel.trim().is_empty() || target.chat_id.trim().is_empty() {
            return Err(crate::types::SettingError::new(
                "heartbeat.target",
                "needs a non-empty `channel` and `chat_id`",
            ));
        }
        Ok(Some(HeartbeatSettings {
            every,
            target,
            model: self.model.clone().filter(|m| !m.trim().is_empty()),
            active_hours,
        }))
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
    fn heartbeat_settings() {
        let off = HeartbeatFile::default().resolve().unwrap();
        assert_eq!(off, None);
        let f: HeartbeatFile = serde_json::from_value(serde_json::json!({
            "enabled": true, "every": "1h30m",
            "target": {"channel": "telegram", "chat_id": "42"},
            "active_hours": {"start": "22:00", "end": "07:00", "tz": "Europe/Berlin"}
        }))
        .unwrap();
        let h = f.resolve().unwrap().unwrap();
        assert_eq!(h.every, std::time::Duration::from_secs(5400));
        let hours = h.active_hours.unwrap();
        // 2026-06-01 21:30 UTC = 23:30 CEST: inside a window spanning midnight.
        let t = |s: &str| chrono::DateTime::parse_from_rfc3339(s).unwrap().to_utc();
        assert!(hours.contains(t("2026-06-01T21:30:00Z")));
        assert!(!hours.contains(t("2026-06-01T10:00:00Z")));
        assert!(hours.contains(t("2026-06-02T04:59:00Z")));
        assert!(!hours.contains(t("2026-06-02T05:00:00Z")));
        let no_target: HeartbeatFile =
            serde_json::from_value(serde_json::json!({"enabled": true})).unwrap();
        assert_eq!(no_target.resolve().unwrap_err().key, "heartbeat.target");
        let bad: HeartbeatFile =
            serde_json::from_value(serde_json::json!({"every": "soon"})).unwrap();
        assert_eq!(bad.resolve().unwrap_err().key, "heartbeat.every");
        assert_eq!(parse_every("90s"), Some(std::time::Duration::from_secs(90)));
        assert_eq!(parse_every("5x"), None);
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
