//! Process-wide counters and the LLM latency histogram, rendered in the Prometheus text
//! exposition format (`GET /metrics`). Gauges (sessions, queues, MCP states, store size) are
//! read at render time by the admin API and passed in.
//!
//! Counters are a small mutex-guarded map: they are touched a few times per turn, far from the
//! per-token hot path.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock};

// From the channel contract directly: `types` is on the same layer (tests/it/layering.rs).
use clawft_channel_core::lock::MutexExt;

/// Upper bounds (seconds) of the LLM latency histogram buckets.
const BUCKETS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

type Labels = Vec<(String, String)>;

#[derive(Default)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

#[derive(Default)]
struct Inner {
    counters: BTreeMap<(&'static str, Labels), u64>,
    llm: BTreeMap<String, Histogram>,
}

fn inner() -> &'static Mutex<Inner> {
    static M: OnceLock<Mutex<Inner>> = OnceLock::new();
    M.get_or_init(Mutex::default)
}

fn labels(l: &[(&str, &str)]) -> Labels {
    l.iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

/// Add `by` to counter `name` with these labels.
pub fn inc(name: &'static str, l: &[(&str, &str)], by: u64) {
    let mut g = inner().locked();
    *g.counters.entry((name, labels(l))).or_insert(0) += by;
}

/// Record one LLM call of `secs` seconds to `provider`.
pub fn observe_llm(provider: &str, secs: f64) {
    let mut g = inner().locked();
    let h = g.llm.entry(provider.to_string()).or_default();
    if h.counts.is_empty() {
        h.counts = vec![0; BUCKETS.len()];
    }
    for (i, b) in BUCKETS.iter().enumerate() {
        if secs <= *b {
            h.counts[i] += 1;
        }
    }
    h.sum += secs;
    h.count += 1;
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn label_text(l: &[(String, String)]) -> String {
    if l.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = l
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", parts.join(","))
}

/// Help text of each counter.
const HELP: &[(&str, &str)] = &[
    ("clawft_turns_total", "Turns finished, by agent and status."),
    (
        "clawft_tool_calls_total",
        "Tool calls, by tool and outcome (ok or the error code).",
    ),
    (
        "clawft_llm_tokens_total",
        "Tokens used, by provider and kind (input, output, and cached: the part of input served from the provider's prompt cache). Estimated where the provider reported none.",
    ),
    (
        "clawft_llm_cost_microusd_total",
        "Spend in millionths of a US dollar, by model, from the price table (unpriced models count 0).",
    ),
    (
        "clawft_budget_refusals_total",
        "Turns refused or stopped because a budget was reached, by budget key.",
    ),
    (
        "clawft_llm_errors_total",
        "Failed LLM calls (each attempt, retried or not), by provider and kind (auth, quota, rate_limited, server, cut, empty…).",
    ),
    (
        "clawft_subagents_total",
        "Subagent tasks, by event (spawned, completed, failed, cancelled).",
    ),
    (
        "clawft_channel_restarts_total",
        "Channel listener restarts (reconnects after a failure).",
    ),
    (
        "clawft_compactions_total",
        "Prompt-window compactions (older turns summarised).",
    ),
    (
        "clawft_scheduler_runs_total",
        "Scheduled job runs finished, by outcome (ok, failed, cancelled).",
    ),
    ("clawft_heartbeats_total", "Heartbeat turns started."),
    (
        "clawft_heartbeats_quiet_total",
        "Heartbeat replies not delivered (HEARTBEAT_OK: nothing to report).",
    ),
];

/// A gauge value read at render time.
pub struct Gauge {
    /// Metric name.
    pub name: &'static str,
    /// Help text.
    pub help: &'static str,
    /// Labels.
    pub labels: Vec<(String, String)>,
    /// Value.
    pub value: f64,
}

/// Everything in the Prometheus text format, with `gauges` appended.
pub fn render(gauges: &[Gauge]) -> String {
    let g = inner().locked();
    let mut out = String::new();
    for (name, help) in HELP {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for ((n, l), v) in &g.counters {
            if n == name {
                let _ = writeln!(out, "{name}{} {v}", label_text(l));
            }
        }
    }
    let name = "clawft_llm_request_duration_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} LLM request latency, by provider.\n# TYPE {name} histogram"
    );
    for (provider, h) in &g.llm {
        let p = escape(provider);
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}_bucket{{provider=\"{p}\",le=\"{b}\"}} {}",
                h.counts[i]
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{provider=\"{p}\",le=\"+Inf\"}} {}",
            h.count
        );
        let _ = writeln!(out, "{name}_sum{{provider=\"{p}\"}} {}", h.sum + 0.0);
        let _ = writeln!(out, "{name}_count{{provider=\"{p}\"}} {}", h.count);
    }
    let mut last = "";
    for gauge in gauges {
        if gauge.name != last {
            let _ = writeln!(
                out,
                "# HELP {} {}\n# TYPE {} {}",
                gauge.name,
                gauge.help,
                gauge.name,
                // A `_total` value read from elsewhere (the scheduler's counts) is a counter.
                if gauge.name.ends_with("_total") {
                    "counter"
                } else {
                    "gauge"
                }
            );
            last = gauge.name;
        }
        let _ = writeln!(
            out,
            "{}{} {}",
            gauge.name,
            label_text(&gauge.labels),
            // `-0` (a sum that cancelled out) is written `0`.
            gauge.value + 0.0
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gauge that sums to minus zero (spend refunded, a cancelled reservation) is written `0`:
    /// `-0` confused dashboards.
    #[test]
    fn minus_zero_is_written_zero() {
        let text = render(&[Gauge {
            name: "clawft_test_gauge",
            help: "test",
            labels: Vec::new(),
            value: -0.0,
        }]);
        assert!(text.contains("\nclawft_test_gauge 0\n"), "{text}");
        assert!(!text.contains("-0"), "{text}");
    }
}
