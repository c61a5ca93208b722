//! The effective configuration as rows — each value with where it came from, secrets
//! masked — shared by `weft config show` and the control UI's Config page (through the admin
//! API), so both show the same thing.

use std::collections::BTreeMap;

use super::loaded::Config;
use super::provenance::{is_secret_key, Origin};
use super::types::ProviderSource;

/// What a secret shows instead of its value.
pub const MASKED: &str = "******** (set)";

/// One line of `weft config show`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Dotted key.
    pub key: String,
    /// The value (masked for secrets).
    pub value: String,
    /// Where it came from.
    pub source: String,
}

fn secs(d: std::time::Duration) -> String {
    d.as_secs().to_string()
}

/// The rows of `weft config show`: the resolved values (defaults included), then every other
/// key the file or the environment sets.
pub fn rows(config: &Config, set: &BTreeMap<String, String>) -> Vec<Row> {
    let p = &config.provenance;
    let mut out: Vec<Row> = Vec::new();
    let mut push = |key: String, value: String, origin: Origin| {
        out.push(Row {
            key,
            value,
            source: origin.to_string(),
        });
    };
    let order: Vec<&str> = config.providers.iter().map(|p| p.name.as_str()).collect();
    let order_source = match &config.provider_source {
        ProviderSource::Environment(vars) => Origin::Env {
            var: vars.join(", "),
            via: None,
        },
        ProviderSource::LocalDefault => Origin::Default,
        ProviderSource::Configured => p.origin("agents.defaults.provider"),
    };
    push(
        "agents.defaults.provider".into(),
        order.join(", "),
        order_source,
    );
    for pr in &config.providers {
        let k = |s: &str| format!("providers.{}.{s}", pr.name);
        push(
            k("base_url"),
            crate::types::scrub::redact_url(&pr.base_url).into_owned(),
            p.origin(&k("base_url")),
        );
        let model_origin = match p.origin("agents.defaults.model") {
            Origin::Default => p.origin(&k("model")),
            o => o,
        };
        push(k("model"), pr.model.clone(), model_origin);
        match &pr.api_key {
            Some(_) => push(k("api_key"), MASKED.into(), p.origin(&k("api_key"))),
            None => push(k("api_key"), "(none)".into(), Origin::Default),
        }
        push(
            k("timeout_secs"),
            secs(pr.timeout),
            p.origin(&k("timeout_secs")),
        );
        push(
            k("max_retries"),
            pr.max_retries.to_string(),
            p.origin(&k("max_retries")),
        );
    }
    let a = &config.agent;
    let d = |s: &str| format!("agents.defaults.{s}");
    push(
        d("workspace"),
        a.workspace.display().to_string(),
        p.origin(&d("workspace")),
    );
    push(
        d("max_tool_iterations"),
        a.max_tool_iterations.to_string(),
        p.origin(&d("max_tool_iterations")),
    );
    push(d("stream"), a.stream.to_string(), p.origin(&d("stream")));
    push(
        d("context_window"),
        a.window.context_window.to_string(),
        p.origin(&d("context_window")),
    );
    push(
        d("prompt_budget_tokens"),
        a.window.prompt_budget.to_string(),
        p.origin(&d("prompt_budget_tokens")),
    );
    let opt = |v: Option<String>| v.unwrap_or_else(|| "(not set)".into());
    let lower = |v: &dyn std::fmt::Debug| format!("{v:?}").to_lowercase();
    for (k, v) in [
        ("timezone", a.timezone.name.clone()),
        ("max_tokens", opt(a.max_tokens.map(|t| t.to_string()))),
        ("temperature", opt(a.temperature.map(|t| t.to_string()))),
        ("loop_repeat_limit", a.loop_repeat_limit.to_string()),
        (
            "max_tool_calls_per_turn",
            a.max_tool_calls_per_turn.to_string(),
        ),
        ("vision", lower(&a.vision)),
        ("reply_with_voice", a.reply_with_voice.as_str().to_string()),
        ("compaction.threshold", a.window.threshold.to_string()),
    ] {
        let key = d(k);
        let o = p.origin(&key);
        push(key, v, o);
    }
    let x = &config.tools.exec;
    for (k, v) in [
        ("tools.exec.mode", lower(&x.mode)),
        ("tools.exec.network", lower(&x.network)),
        ("tools.exec.timeout_secs", secs(x.timeout)),
        ("tools.exec.max_timeout_secs", secs(x.max_timeout)),
        ("tools.exec.approval_timeout_secs", secs(x.approval_timeout)),
        ("tools.exec.max_processes", x.max_processes.to_string()),
        ("tools.exec.max_memory_mb", x.max_memory_mb.to_string()),
        ("tools.exec.sandbox", x.sandbox.to_string()),
        ("tools.exec.require_sandbox", x.require_sandbox.to_string()),
        ("memory.scope", config.memory.scope.as_str().to_string()),
        (
            "memory.search_transcripts",
            config.memory.search_transcripts.to_string(),
        ),
        (
            "scheduler.max_jobs_per_session",
            config.scheduler.max_jobs_per_session.to_string(),
        ),
        (
            "scheduler.min_interval_secs",
            config.scheduler.min_interval_secs.to_string(),
        ),
        (
            "scheduler.max_runs_per_day",
            config.scheduler.max_runs_per_day.to_string(),
        ),
        (
            "channels.max_inbound_bytes",
            config.max_inbound_bytes.to_string(),
        ),
        (
            "channels.http.allow_loopback_without_token",
            config.http.allow_loopback_without_token.to_string(),
        ),
    ] {
        let o = p.origin(k);
        push(k.to_string(), v, o);
    }
    let h = &config.http;
    push(
        "channels.http.enabled".into(),
        h.enabled.to_string(),
        p.origin("channels.http.enabled"),
    );
    push(
        "channels.http.bind".into(),
        h.bind.to_string(),
        p.origin("channels.http.bind"),
    );
    push(
        "channels.http.token".into(),
        if h.token.is_some() { MASKED } else { "(none)" }.into(),
        p.origin("channels.http.token"),
    );
    push(
        "channels.http.reply_timeout_secs".into(),
        secs(h.reply_timeout),
        p.origin("channels.http.reply_timeout_secs"),
    );
    push(
        "store.path".into(),
        config.store.path.display().to_string(),
        p.origin("store.path"),
    );
    push(
        "store.cache_mb".into(),
        (config.store.cache_bytes / (1024 * 1024)).to_string(),
        p.origin("store.cache_mb"),
    );
    let s = &config.sessions;
    for (k, v) in [
        ("idle_secs", secs(s.idle)),
        ("max_queue", s.max_queue.to_string()),
        ("shutdown_grace_secs", secs(s.shutdown_grace)),
        ("max_in_memory", s.max_in_memory.to_string()),
    ] {
        let key = format!("sessions.{k}");
        let o = p.origin(&key);
        push(key, v, o);
    }
    for c in &config.chat_channels {
        let k = |s: &str| c.config_key(s);
        let token = k("token");
        let shown = match config.deferred_secrets.iter().find(|d| d.key == token) {
            Some(d) => format!("(not in this shell; the service reads it) {}", d.reason),
            None => MASKED.into(),
        };
        match c.settings.setup().account_label() {
            // Signal has no token: its account is the number.
            Some((key, value)) => push(k(key), value, p.origin(&k(key))),
            None => push(token.clone(), shown, p.origin(&token)),
        }
        let allow: Vec<&str> = c.allow_from.iter().map(String::as_str).collect();
        push(
            k("allow_from"),
            allow.join(", "),
            p.origin(&k("allow_from")),
        );
    }
    // Everything else the file or the environment sets, as written.
    let shown: std::collections::BTreeSet<String> = out.iter().map(|r| r.key.clone()).collect();
    for (key, value) in set {
        if shown.contains(key) {
            continue;
        }
        let value = if is_secret_key(key) {
            MASKED.to_string()
        } else {
            value.clone()
        };
        out.push(Row {
            key: key.clone(),
            value,
            source: p.origin(key).to_string(),
        });
    }
    out
}

/// The rows as JSON: `[{"key", "value", "source"}]` (what `weft config show --json` prints).
pub fn rows_json(rows: &[Row]) -> serde_json::Value {
    serde_json::Value::Array(
        rows.iter()
            .map(|r| serde_json::json!({"key": r.key, "value": r.value, "source": r.source}))
            .collect(),
    )
}
