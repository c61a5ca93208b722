//! Human-readable renderings of the admin JSON (`weft status`, `sessions list|show`, `mcp list`).
//!
//! The commands print these by default, whether stdout is a terminal or not (as `git`, `kubectl`
//! and `systemctl` do): scripts ask for JSON with `--json`, which prints the same JSON as before.
//! Each function takes the JSON the command would print with `--json`, so the text never says
//! more or less than the API.

use std::fmt::Write as _;

use serde_json::Value;

/// `YYYY-MM-DD HH:MM` (UTC) of a Unix time in milliseconds; `-` for none.
pub fn utc_minute(ms: Option<u64>) -> String {
    match ms {
        Some(ms) if ms > 0 => {
            let mins = (ms / 60_000) % (24 * 60);
            format!(
                "{} {:02}:{:02}",
                crate::store::usage::day_of(ms),
                mins / 60,
                mins % 60
            )
        }
        _ => "-".to_string(),
    }
}

/// A JSON value as short text: strings bare, `null` as `-`, the rest compact JSON.
fn short(v: &Value) -> String {
    match v {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn size(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let b = bytes as f64;
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", b / f64::from(1u32 << 20))
    } else if bytes >= 1 << 10 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{bytes} B")
    }
}

/// `weft status` as labelled lines.
pub fn status(v: &Value) -> String {
    let mut out = String::new();
    if v["status"] == "starting" {
        return "the gateway is starting: ask again in a moment\n".to_string();
    }
    let mut row = |label: &str, text: String| {
        let _ = writeln!(out, "{label:<11} {text}");
    };
    let mode = short(&v["mode"]);
    row(
        "mode",
        if mode == "gateway" {
            format!("gateway running (pid {})", short(&v["pid"]))
        } else {
            "no gateway running (read from the store directly)".to_string()
        },
    );
    row("config", short(&v["config"]));
    let cl = &v["cluster"];
    if !cl.is_null() {
        row(
            "cluster",
            if cl["ok"] == Value::Bool(true) {
                format!("node {}: NATS and JetStream answer", short(&cl["node_id"]))
            } else {
                format!(
                    "node {}: NOT READY: {} (no connection lease is held; webhooks still answered)",
                    short(&cl["node_id"]),
                    short(&cl["reason"])
                )
            },
        );
    }
    row("workspace", short(&v["workspace"]));
    let st = &v["store"];
    let mut store = short(&st["path"]);
    if let Some(b) = st["size_bytes"].as_u64() {
        let _ = write!(store, " ({}", size(b));
        if !st["schema"].is_null() {
            let _ = write!(store, ", schema {}", short(&st["schema"]));
        }
        store.push(')');
    }
    row("store", store);
    let health = &st["health"];
    if let Some(status) = health["status"].as_str() {
        let errors = health["errors"].as_object().filter(|e| !e.is_empty());
        row(
            "store state",
            match errors {
                Some(e) => format!("{status}: {}", Value::Object(e.clone())),
                None => status.to_string(),
            },
        );
    } else if !health.is_null() {
        row("store state", short(health));
    }
    let providers: Vec<String> = v["providers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            format!(
                "{} {} at {}{}",
                short(&p["name"]),
                short(&p["model"]),
                short(&p["base_url"]),
                if p["api_key"] == Value::Bool(true) {
                    " (API key set)"
                } else {
                    ""
                }
            )
        })
        .collect();
    row(
        "providers",
        if providers.is_empty() {
            "none".into()
        } else {
            providers.join("; ")
        },
    );
    row("  from", short(&v["provider_source"]));
    let ch = &v["channels"];
    let mut channels: Vec<String> = Vec::new();
    if !ch["http"].is_null() {
        channels.push(format!("http on {}", short(&ch["http"])));
    }
    for c in ch["chat"].as_array().into_iter().flatten() {
        channels.push(format!(
            "{} ({} allowed, pairing {}, groups: {})",
            short(&c["channel"]),
            short(&c["allow_from"]),
            if c["pairing"] == Value::Bool(true) {
                "on"
            } else {
                "off"
            },
            short(&c["group_mode"])
        ));
    }
    row(
        "channels",
        if channels.is_empty() {
            "none".into()
        } else {
            channels.join("; ")
        },
    );
    if let Some(states) = v["channel_states"].as_object().filter(|m| !m.is_empty()) {
        let states: Vec<String> = states
            .iter()
            .map(|(id, st)| format!("{id} {}", short(st)))
            .collect();
        row("  now", states.join("; "));
    }
    let s = &v["sessions"];
    row(
        "sessions",
        match s["live"].as_u64() {
            Some(live) => format!("{} stored, {live} in memory", short(&s["stored"])),
            None => format!("{} stored", short(&s["stored"])),
        },
    );
    let m = &v["memory"];
    if m.is_object() {
        row(
            "memory",
            format!(
                "scope {}, {} documents ({} chunks) in {} index(es), {} on disk{}",
                short(&m["scope"]),
                m["documents"].as_u64().unwrap_or(0),
                m["chunks"].as_u64().unwrap_or(0),
                m["indexes"].as_u64().unwrap_or(0),
                size(m["index_bytes"].as_u64().unwrap_or(0)),
                if m["search_transcripts"] == Value::Bool(true) {
                    ", past conversations searched"
                } else {
                    ""
                }
            ),
        );
    }
    let sc = &v["scheduler"];
    if sc.is_object() {
        let j = &sc["jobs"];
        let mut text = format!(
            "{} jobs ({} enabled, {} paused)",
            j["total"].as_u64().unwrap_or(0),
            j["enabled"].as_u64().unwrap_or(0),
            j["paused"].as_u64().unwrap_or(0)
        );
        if let Some(n) = sc["next_runs"].as_array().and_then(|n| n.first()) {
            let _ = write!(
                text,
                "; next: {} at {}",
                short(&n["name"]),
                short(&n["next_run"])
            );
        }
        if let Some(r) = sc["running"].as_array().filter(|r| !r.is_empty()) {
            let _ = write!(text, "; {} running", r.len());
        }
        let hb = &sc["heartbeat"];
        if hb["enabled"] == Value::Bool(true) {
            let secs = hb["every_secs"].as_u64().unwrap_or(0);
            let _ = write!(
                text,
                "; heartbeat every {} to {}:{}",
                if secs.is_multiple_of(60) {
                    format!("{}m", secs / 60)
                } else {
                    format!("{secs}s")
                },
                short(&hb["target"]["channel"]),
                short(&hb["target"]["chat_id"])
            );
        } else {
            text.push_str("; heartbeat off");
        }
        row("scheduler", text);
    }
    let t = &v["tools"];
    row(
        "tools",
        format!(
            "profile {}, exec mode {}",
            short(&t["profile"]),
            short(&t["exec_mode"])
        ),
    );
    row("sandbox", short(&t["sandbox"]["summary"]));
    if let Some(w) = t["sandbox"]["warning"].as_str() {
        row("warning", w.to_string());
    }
    if let Some(m) = v["mcp_servers"].as_array().filter(|m| !m.is_empty()) {
        let names: Vec<String> = m
            .iter()
            .map(|s| format!("{} {}", short(&s["name"]), short(&s["state"])))
            .collect();
        row("mcp", names.join("; "));
    }
    out.push_str("(JSON with --json)\n");
    out
}

/// `weft sessions list` as a table.
pub fn sessions(v: &Value) -> String {
    let rows = v["sessions"].as_array().cloned().unwrap_or_default();
    if rows.is_empty() {
        return "no stored sessions yet: talk to the agent (`weft agent`, a chat channel or \
                the HTTP API) and its conversations appear here\n"
            .to_string();
    }
    let width = rows
        .iter()
        .map(|r| short(&r["key"]).len())
        .max()
        .unwrap_or(0)
        .max(7);
    let mut out = format!(
        "{:<width$}  {:>8}  {:<16}  {:<16}\n",
        "SESSION", "MESSAGES", "CREATED (UTC)", "UPDATED (UTC)"
    );
    for r in &rows {
        let _ = writeln!(
            out,
            "{:<width$}  {:>8}  {:<16}  {:<16}",
            short(&r["key"]),
            short(&r["messages"]),
            utc_minute(r["created_ms"].as_u64()),
            utc_minute(r["updated_ms"].as_u64()),
        );
    }
    out
}

fn usage_line(u: &Value) -> String {
    format!(
        "{} calls, {} input tokens ({} cached), {} output tokens, US${:.4}",
        u["calls"].as_u64().unwrap_or(0),
        u["input_tokens"].as_u64().unwrap_or(0),
        u["cached_tokens"].as_u64().unwrap_or(0),
        u["output_tokens"].as_u64().unwrap_or(0),
        u["cost_usd"].as_f64().unwrap_or(0.0)
    )
}

/// `weft sessions show KEY` as a transcript.
pub fn session(v: &Value) -> String {
    let msgs = v["messages"].as_array().cloned().unwrap_or_default();
    let mut out = format!(
        "session {}: {} messages, created {}, updated {} (UTC)\nusage today: {}\nusage total: {}\n",
        short(&v["key"]),
        msgs.len(),
        utc_minute(v["created_ms"].as_u64()),
        utc_minute(v["updated_ms"].as_u64()),
        usage_line(&v["usage"]["today"]),
        usage_line(&v["usage"]["total"]),
    );
    let w = &v["window"];
    if w.is_object() {
        let _ = writeln!(
            out,
            "window: {} of {} messages, ≈{} tokens of conversation, {} compactions",
            w["in_window"], w["stored"], w["tokens_estimate"], w["compactions"]
        );
        if let Some(budget) = w["prompt_budget_tokens"].as_u64() {
            let _ = writeln!(
                out,
                "prompt budget: {budget} tokens a request (the model's window: {} tokens); older turns are summarised beyond it",
                w["context_window"]
            );
        }
        if let Some(summary) = w["summary"].as_str().filter(|t| !t.is_empty()) {
            let _ = writeln!(
                out,
                "summary of the {} messages before the window (≈{} tokens):",
                w["summarised"], w["summary_tokens"]
            );
            for line in summary.lines() {
                let _ = writeln!(out, "  {line}");
            }
        }
    }
    for m in &msgs {
        out.push('\n');
        let role = short(&m["role"]);
        let content = m["content"].as_str().unwrap_or_default();
        match role.as_str() {
            "tool" => {
                let _ = writeln!(
                    out,
                    "[tool result {}] {}",
                    m["name"].as_str().unwrap_or("?"),
                    content
                );
            }
            _ => {
                if !content.is_empty() {
                    let _ = writeln!(out, "[{role}] {content}");
                }
                for c in m["tool_calls"].as_array().into_iter().flatten() {
                    let _ = writeln!(
                        out,
                        "[{role} calls {}] {}",
                        c["name"].as_str().unwrap_or("?"),
                        c["arguments"].as_str().unwrap_or_default()
                    );
                }
            }
        }
    }
    out
}

/// Where MCP servers go, with an example (for an empty `weft mcp list`).
pub fn mcp_hint(config_path: Option<&std::path::Path>) -> String {
    format!(
        "no MCP servers configured. Add them under `tools.mcp_servers` in {}, e.g.:\n\n\
         [tools.mcp_servers.files]\n\
         command = \"npx\"\n\
         args = [\"-y\", \"@modelcontextprotocol/server-filesystem\", \"/home/me/notes\"]\n\n\
         [tools.mcp_servers.search]\n\
         url = \"https://mcp.example.com/mcp\"\n\n\
         Their tools are named SERVER__TOOL (docs/mcp.md).\n",
        config_path.map_or_else(
            || "the config file (~/.clawft/config.toml)".to_string(),
            |p| p.display().to_string()
        )
    )
}

/// `weft mcp list` as a table (or the hint when there are none).
pub fn mcp(v: &Value, config_path: Option<&std::path::Path>) -> String {
    let rows = v.as_array().cloned().unwrap_or_default();
    if rows.is_empty() {
        return mcp_hint(config_path);
    }
    let width = rows
        .iter()
        .map(|r| short(&r["name"]).len())
        .max()
        .unwrap_or(0)
        .max(6);
    let mut out = format!(
        "{:<width$}  {:<12}  {:>5}  {:<9}  TARGET / LAST ERROR\n",
        "SERVER", "STATE", "TOOLS", "TRANSPORT"
    );
    for r in &rows {
        let mut state = short(&r["state"]);
        if let Some(a) = r["attempt"].as_u64() {
            let _ = write!(state, " #{a}");
        }
        let detail = match r["last_error"].as_str() {
            Some(e) if r["state"] != "connected" => e.to_string(),
            _ => short(&r["target"]),
        };
        let _ = writeln!(
            out,
            "{:<width$}  {:<12}  {:>5}  {:<9}  {}{}",
            short(&r["name"]),
            state,
            short(&r["tools"]),
            short(&r["transport"]),
            detail,
            if r["internal_only"] == Value::Bool(true) {
                " (internal only)"
            } else {
                ""
            }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_are_utc() {
        assert_eq!(utc_minute(Some(0)), "-");
        assert_eq!(utc_minute(None), "-");
        // 2024-02-29 13:05:59 UTC
        assert_eq!(utc_minute(Some(1_709_211_959_000)), "2024-02-29 13:05");
    }

    #[test]
    fn a_session_shows_its_budget_window_and_summary() {
        let v = serde_json::json!({"key": "telegram:1", "messages": [], "usage": {},
            "window": {"in_window": 12, "stored": 80, "tokens_estimate": 5100, "compactions": 3,
                "prompt_budget_tokens": 24000, "context_window": 128000, "summarised": 68,
                "summary_tokens": 40, "summary": "- boat: teal\n- trip in May"}});
        let t = session(&v);
        assert!(
            t.contains("window: 12 of 80 messages, ≈5100 tokens of conversation, 3 compactions"),
            "{t}"
        );
        assert!(
            t.contains("prompt budget: 24000 tokens a request (the model's window: 128000 tokens)"),
            "{t}"
        );
        assert!(t.contains("summary of the 68 messages before the window (≈40 tokens):\n  - boat: teal\n  - trip in May\n"), "{t}");
    }
}
