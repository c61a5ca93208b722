//! `tools.browser`: where Chromium is, what it may reach, and its bounds.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::net::ssrf::Cidr;
use crate::types::SettingError;

/// Where a browser is looked for when `tools.browser.executable` is not set.
pub const CANDIDATES: &[&str] = &[
    "/usr/bin/chromium",
    "/usr/bin/chromium-browser",
    "/usr/bin/google-chrome-stable",
    "/usr/bin/google-chrome",
    "/snap/bin/chromium",
];

/// The resolved `tools.browser` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct BrowserSettings {
    /// Whether the `browser` tool is offered at all (default true, when a browser is found).
    pub enabled: bool,
    /// The Chromium executable; `None` to look in [`CANDIDATES`].
    pub executable: Option<PathBuf>,
    /// Non-public networks the browser may reach (default none).
    pub allow_private: Vec<Cidr>,
    /// Single non-public endpoints (`127.0.0.1:8080`) the browser may reach.
    pub allow_endpoints: Vec<SocketAddr>,
    /// When not empty, the only host names the browser may reach (and their subdomains).
    pub allow_domains: Vec<String>,
    /// Agents whose model may run its own JavaScript in pages (`evaluate`); default none.
    pub evaluate_agents: Vec<String>,
    /// Keep cookies and storage in the agent's profile between browser starts (default
    /// false: every start begins with an empty profile).
    pub persist_profile: bool,
    /// Run the browser in the commands' jail: its own network namespace, reaching out only
    /// through the proxy bridged in (default true; where the kernel gives no namespaces it
    /// runs without, told by its flags to use the proxy).
    pub jail: bool,
    /// The browser is closed after this long without an action (default 300 s).
    pub idle: Duration,
    /// Deadline of one action (default 30 s).
    pub action_timeout: Duration,
    /// How long a navigation waits for the page's load event (default 15 s); a page still
    /// loading then is reported as such, and the action returns.
    pub load_timeout: Duration,
    /// Tabs open at most; tabs a page opens beyond it are closed at once (default 8).
    pub max_tabs: usize,
    /// Characters of a snapshot at most (default 24000).
    pub max_snapshot_chars: usize,
    /// Bytes of a screenshot or PDF at most (default 8 MiB).
    pub max_capture_bytes: usize,
}

impl Default for BrowserSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            executable: None,
            allow_private: Vec::new(),
            allow_endpoints: Vec::new(),
            allow_domains: Vec::new(),
            evaluate_agents: Vec::new(),
            persist_profile: false,
            jail: true,
            idle: Duration::from_secs(300),
            action_timeout: Duration::from_secs(30),
            load_timeout: Duration::from_secs(15),
            max_tabs: 8,
            max_snapshot_chars: 24_000,
            max_capture_bytes: 8 * 1024 * 1024,
        }
    }
}

impl BrowserSettings {
    /// The browser to run: the configured executable, else the first candidate present.
    pub fn find_executable(&self) -> Option<PathBuf> {
        match &self.executable {
            Some(p) => p.is_file().then(|| p.clone()),
            None => CANDIDATES.iter().map(PathBuf::from).find(|p| p.is_file()),
        }
    }
}

/// `tools.browser` in the config file.
#[derive(Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserFile {
    /// Offer the `browser` tool (default true; it is offered only when a browser is found).
    pub enabled: Option<bool>,
    /// The Chromium (or Chrome) executable (default: the first of /usr/bin/chromium,
    /// /usr/bin/chromium-browser, /usr/bin/google-chrome-stable, /usr/bin/google-chrome,
    /// /snap/bin/chromium).
    pub executable: Option<String>,
    /// Non-public networks the browser may reach anyway: addresses or CIDRs
    /// (`"10.1.0.0/16"`), or one port of one address (`"127.0.0.1:8080"`, `"[::1]:3000"`),
    /// which leaves the other ports of that address refused. Default: none. Cloud metadata
    /// names stay blocked.
    pub allow_private: Option<Vec<String>>,
    /// When set, the only host names the browser may reach (each with its subdomains); IP
    /// literals are then refused, except the endpoints of `allow_private`.
    pub allow_domains: Option<Vec<String>>,
    /// Agents whose model may run JavaScript of its own in pages (the `evaluate` action).
    /// Default: none.
    pub evaluate_agents: Option<Vec<String>>,
    /// Keep cookies, storage and logins in each agent's browser profile between browser
    /// starts (default false: each start begins with an empty profile).
    pub persist_profile: Option<bool>,
    /// Run the browser in its own network namespace like commands (default true).
    pub jail: Option<bool>,
    /// Seconds without an action after which the browser is closed (default 300, 10..=86400).
    pub idle_secs: Option<u64>,
    /// Deadline of one action in seconds (default 30, 1..=300).
    pub action_timeout_secs: Option<u64>,
    /// Seconds a navigation waits for the page to load before returning with the page as
    /// it is (default 15, 1..=120).
    pub load_timeout_secs: Option<u64>,
    /// Tabs open at most (default 8, 1..=64); tabs beyond it are closed as they open.
    pub max_tabs: Option<u64>,
    /// Characters of a page snapshot at most (default 24000, 1000..=200000).
    pub max_snapshot_chars: Option<u64>,
    /// Bytes of a screenshot or PDF at most (default 8388608, up to 52428800).
    pub max_capture_bytes: Option<u64>,
}

fn ranged(key: &str, v: Option<u64>, lo: u64, hi: u64, d: u64) -> Result<u64, SettingError> {
    match v {
        None => Ok(d),
        Some(n) if (lo..=hi).contains(&n) => Ok(n),
        Some(n) => Err(SettingError::new(
            format!("tools.browser.{key}"),
            format!("expected {lo}..={hi}, got {n}"),
        )),
    }
}

fn as_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

impl BrowserFile {
    /// Validate into [`BrowserSettings`].
    ///
    /// # Errors
    /// A message naming the key (`tools.browser.…`) and what is expected.
    pub fn resolve(&self) -> Result<BrowserSettings, SettingError> {
        let d = BrowserSettings::default();
        let mut allow_private = Vec::new();
        let mut allow_endpoints = Vec::new();
        for (i, s) in self.allow_private.iter().flatten().enumerate() {
            let s = s.trim();
            if let Ok(ep) = s.parse::<SocketAddr>() {
                allow_endpoints.push(ep);
                continue;
            }
            allow_private.push(s.parse::<Cidr>().map_err(|e| {
                SettingError::new(
                    format!("tools.browser.allow_private[{i}]"),
                    format!("{e}, or `ADDRESS:PORT` for one port"),
                )
            })?);
        }
        let mut allow_domains = Vec::new();
        for (i, dom) in self.allow_domains.iter().flatten().enumerate() {
            let dom = dom.trim().trim_start_matches("*.").to_ascii_lowercase();
            if dom.is_empty()
                || !dom
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
            {
                return Err(SettingError::new(
                    format!("tools.browser.allow_domains[{i}]"),
                    format!("expected a host name like `example.com`, got `{dom}`"),
                ));
            }
            allow_domains.push(dom);
        }
        let executable = match &self.executable {
            None => None,
            Some(p) if p.starts_with('/') => Some(PathBuf::from(p)),
            Some(p) => {
                return Err(SettingError::new(
                    "tools.browser.executable",
                    format!("expected an absolute path, got `{p}`"),
                ))
            }
        };
        let secs = |key, v, lo, hi, d: Duration| {
            ranged(key, v, lo, hi, d.as_secs()).map(Duration::from_secs)
        };
        Ok(BrowserSettings {
            enabled: self.enabled.unwrap_or(d.enabled),
            executable,
            allow_private,
            allow_endpoints,
            allow_domains,
            evaluate_agents: self.evaluate_agents.clone().unwrap_or_default(),
            persist_profile: self.persist_profile.unwrap_or(d.persist_profile),
            jail: self.jail.unwrap_or(d.jail),
            idle: secs("idle_secs", self.idle_secs, 10, 86_400, d.idle)?,
            action_timeout: secs(
                "action_timeout_secs",
                self.action_timeout_secs,
                1,
                300,
                d.action_timeout,
            )?,
            load_timeout: secs(
                "load_timeout_secs",
                self.load_timeout_secs,
                1,
                120,
                d.load_timeout,
            )?,
            max_tabs: as_usize(ranged("max_tabs", self.max_tabs, 1, 64, 8)?),
            max_snapshot_chars: as_usize(ranged(
                "max_snapshot_chars",
                self.max_snapshot_chars,
                1000,
                200_000,
                24_000,
            )?),
            max_capture_bytes: as_usize(ranged(
                "max_capture_bytes",
                self.max_capture_bytes,
                1024,
                50 * 1024 * 1024,
                8 * 1024 * 1024,
            )?),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn endpoints_and_networks_are_told_apart() {
        let f = BrowserFile {
            allow_private: Some(vec!["127.0.0.1:8080".into(), "10.0.0.0/8".into()]),
            ..BrowserFile::default()
        };
        let s = f.resolve().unwrap();
        assert_eq!(s.allow_endpoints, vec!["127.0.0.1:8080".parse().unwrap()]);
        assert_eq!(s.allow_private.len(), 1);
        let bad = BrowserFile {
            allow_private: Some(vec!["localhost:80".into()]),
            ..BrowserFile::default()
        };
        let e = bad.resolve().unwrap_err().to_string();
        assert!(e.contains("tools.browser.allow_private[0]"), "{e}");
        let bad = BrowserFile {
            max_tabs: Some(0),
            ..BrowserFile::default()
        };
        assert!(bad.resolve().is_err());
    }
}
