//! `weft cron list|add|remove|run|pause|resume|runs`: the scheduled jobs, through the running
//! gateway's control plane (the gateway owns the scheduler's timer; a job changed behind its
//! back would not be seen until its next wake-up).

use std::fmt::Write as _;

use chrono::{DateTime, FixedOffset, Utc};
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::client::GatewayClient;
use super::CliError;
use crate::config::Config;
use crate::scheduler::tz::Zone;

/// `weft cron` actions.
#[derive(Debug, Subcommand)]
pub enum CronAction {
    /// Every job: id, name, schedule, next run (local and UTC), last outcome, enabled.
    List {
        /// Print JSON (the jobs as the `cron` tool shows them, and the runs going now).
        #[arg(long)]
        json: bool,
    },
    /// Add a job delivering to a chat (owned by that chat's session, which sees it too).
    Add(AddArgs),
    /// Remove a job.
    Remove {
        /// Job id (`weft cron list`).
        id: String,
    },
    /// Run a job now (its schedule does not move).
    Run {
        /// Job id.
        id: String,
    },
    /// Pause a job: it does not run until resumed.
    Pause {
        /// Job id.
        id: String,
    },
    /// Resume a paused job (from its next occurrence; missed runs are not caught up).
    Resume {
        /// Job id.
        id: String,
    },
    /// A job's recorded runs, newest first.
    Runs {
        /// Job id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `weft cron add` arguments.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("when").required(true).args(["at", "every", "cron"])))]
pub struct AddArgs {
    /// Short name shown in lists.
    #[arg(long)]
    pub name: String,
    /// Once, at this time: RFC 3339 with its offset (`2026-12-01T09:00:00+01:00`).
    #[arg(long, value_name = "TIME", value_parser = parse_at)]
    pub at: Option<String>,
    /// Every interval: seconds, or with a unit (`90s`, `30m`, `2h`, `1d`).
    #[arg(long, value_name = "INTERVAL", value_parser = parse_interval)]
    pub every: Option<u64>,
    /// A cron expression, 5 fields (`min hour dom month dow`) or 6 with seconds first.
    #[arg(long, value_name = "EXPR")]
    pub cron: Option<String>,
    /// The IANA time zone of --cron (default UTC), e.g. `Europe/Berlin`.
    #[arg(long, value_name = "ZONE", requires = "cron")]
    pub tz: Option<String>,
    /// The task the agent gets on each run (or, with --text, the text sent).
    #[arg(long)]
    pub message: String,
    /// Send the message as it is (a reminder) instead of running a turn.
    #[arg(long)]
    pub text: bool,
    /// Channel id of the target chat (`http`, `telegram`, `discord`, `slack`).
    #[arg(long)]
    pub channel: String,
    /// Chat id on that channel.
    #[arg(long)]
    pub chat: String,
    /// Thread in that chat.
    #[arg(long)]
    pub thread: Option<String>,
    /// Runs missed while the gateway was down: once (one late run, the default), all, skip.
    #[arg(long, value_enum, default_value = "once")]
    pub catch_up: CatchUpArg,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `--catch-up` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CatchUpArg {
    /// One late run for all the missed ones.
    Once,
    /// Every missed run (at most 100).
    All,
    /// None: wait for the next occurrence.
    Skip,
}

impl CatchUpArg {
    fn as_str(self) -> &'static str {
        match self {
            CatchUpArg::Once => "once",
            CatchUpArg::All => "all",
            CatchUpArg::Skip => "skip",
        }
    }
}

/// `90`, `90s`, `30m`, `2h`, `1d` → seconds.
///
/// # Errors
/// Not a positive whole number with an optional unit.
pub fn parse_interval(s: &str) -> Result<u64, String> {
    crate::scheduler::settings::parse_every(s)
        .map(|d| d.as_secs())
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            format!("`{}` is not an interval: give seconds (`3600`) or a number with s, m, h or d (`30m`, `2h`)", s.trim())
        })
}

/// `--at`: RFC 3339 with an offset.
///
/// # Errors
/// Not such a time.
pub fn parse_at(s: &str) -> Result<String, String> {
    DateTime::parse_from_rfc3339(s.trim())
        .map(|_| s.trim().to_string())
        .map_err(|e| {
            format!("`{s}` is not an RFC 3339 time with its offset ({e}), e.g. `2026-12-01T09:00:00+01:00`")
        })
}

/// The admin command and body of `action`.
fn request(action: &CronAction) -> Result<(&'static str, Value), CliError> {
    Ok(match action {
        CronAction::List { .. } => ("cron/list", json!({})),
        CronAction::Add(a) => {
            let schedule = match (&a.at, a.every, &a.cron) {
                (Some(at), _, _) => json!({"kind": "at", "at": at}),
                (_, Some(secs), _) => json!({"kind": "every", "seconds": secs}),
                (_, _, Some(expr)) => match &a.tz {
                    Some(tz) => json!({"kind": "cron", "expr": expr, "tz": tz}),
                    None => json!({"kind": "cron", "expr": expr}),
                },
                (None, None, None) => {
                    return Err(CliError::Failed(
                        "give one of --at TIME, --every INTERVAL or --cron EXPR".into(),
                    ))
                }
            };
            let mut target = json!({"channel": a.channel, "chat_id": a.chat});
            if let Some(t) = &a.thread {
                target["thread"] = json!(t);
            }
            (
                "cron/add",
                json!({
                    "name": a.name,
                    "schedule": schedule,
                    "message": a.message,
                    "deliver": if a.text { "text" } else { "turn" },
                    "catch_up": a.catch_up.as_str(),
                    "target": target,
                }),
            )
        }
        CronAction::Remove { id } => ("cron/remove", json!({ "id": id })),
        CronAction::Run { id } => ("cron/run", json!({ "id": id })),
        CronAction::Pause { id } => ("cron/pause", json!({ "id": id })),
        CronAction::Resume { id } => ("cron/resume", json!({ "id": id })),
        CronAction::Runs { id, .. } => ("cron/runs", json!({ "id": id })),
    })
}

/// Run a `weft cron` action against the running gateway.
///
/// # Errors
/// No gateway running, or the gateway refused (the message names the field or the setting).
pub async fn run(config: &Config, action: CronAction) -> Result<(), CliError> {
    let (name, body) = request(&action)?;
    let c = GatewayClient::detect(config).await?.ok_or_else(|| {
        CliError::Failed(format!(
            "weft cron needs a running gateway for this config's store ({}), and none runs: start `weft gateway` with this config (the gateway owns the scheduler)",
            config.store.path.display()
        ))
    })?;
    let v = c.post(&format!("/v1/admin/{name}"), &body).await?;
    let as_json = match &action {
        CronAction::List { json } | CronAction::Runs { json, .. } => *json,
        CronAction::Add(a) => a.json,
        _ => false,
    };
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(CliError::msg)?
        );
        return Ok(());
    }
    let zone = local_zone();
    let text = match action {
        CronAction::List { .. } => table(&v, &zone),
        CronAction::Runs { .. } => runs(&v),
        CronAction::Add(_) | CronAction::Pause { .. } | CronAction::Resume { .. } => {
            let j = &v["job"];
            format!(
                "{} {} ({}): next run {}\n",
                s(&v["status"]),
                s(&j["name"]),
                s(&j["id"]),
                next_run(&j["next_run"], &zone)
            )
        }
        CronAction::Remove { .. } => format!("removed {} ({})\n", s(&v["name"]), s(&v["id"])),
        CronAction::Run { .. } => format!("started run {}: {}\n", s(&v["run_id"]), s(&v["note"])),
    };
    print!("{text}");
    Ok(())
}

fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The zone of local times: `$TZ` (a zone name), else `/etc/localtime`, else UTC.
fn local_zone() -> Zone {
    if let Some(tz) = crate::config::env::Env::from_process().get("TZ") {
        if let Ok(z) = Zone::load(tz.trim_start_matches(':')) {
            return z;
        }
    }
    std::fs::read("/etc/localtime")
        .ok()
        .and_then(|b| Zone::parse(&b).ok())
        .unwrap_or_else(Zone::utc)
}

/// `2026-12-01 09:00 +01:00 (08:00 UTC)`, or `-` for none.
fn next_run(v: &Value, zone: &Zone) -> String {
    let Some(t) = v
        .as_str()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
    else {
        return "-".into();
    };
    let utc = t.with_timezone(&Utc);
    let local = FixedOffset::east_opt(zone.offset_at(utc.timestamp()))
        .map(|o| utc.with_timezone(&o))
        .unwrap_or_else(|| utc.fixed_offset());
    format!(
        "{} ({} UTC)",
        local.format("%Y-%m-%d %H:%M %:z"),
        utc.format("%H:%M")
    )
}

fn schedule_text(v: &Value) -> String {
    match v["kind"].as_str() {
        Some("at") => format!("at {}", s(&v["at"])),
        Some("every") => {
            let secs = v["seconds"].as_u64().unwrap_or(0);
            match secs {
                n if n.is_multiple_of(86_400) => format!("every {}d", n / 86_400),
                n if n.is_multiple_of(3_600) => format!("every {}h", n / 3_600),
                n if n.is_multiple_of(60) => format!("every {}m", n / 60),
                n => format!("every {n}s"),
            }
        }
        Some("cron") => match v["tz"].as_str() {
            Some(tz) => format!("cron {} {tz}", s(&v["expr"])),
            None => format!("cron {} UTC", s(&v["expr"])),
        },
        _ => s(v),
    }
}

fn table(v: &Value, zone: &Zone) -> String {
    let jobs = v["jobs"].as_array().cloned().unwrap_or_default();
    if jobs.is_empty() {
        return "no scheduled jobs: add one with `weft cron add` (or ask the agent, with the cron tool)\n".into();
    }
    let rows: Vec<[String; 6]> = jobs
        .iter()
        .map(|j| {
            [
                s(&j["id"]),
                s(&j["name"]),
                schedule_text(&j["schedule"]),
                next_run(&j["next_run"], zone),
                j["last_run"]["outcome"]
                    .as_str()
                    .map_or_else(|| "-".into(), str::to_string),
                if j["enabled"] == Value::Bool(true) {
                    "yes".into()
                } else {
                    format!("no ({})", s(&j["paused_reason"]))
                },
            ]
        })
        .collect();
    let heads = ["ID", "NAME", "SCHEDULE", "NEXT RUN", "LAST", "ENABLED"];
    let mut w = heads.map(str::len);
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: [&str; 6]| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            let _ = write!(l, "{c:<width$}  ", width = w[i]);
        }
        let _ = writeln!(out, "{}", l.trim_end());
    };
    line(heads);
    for r in &rows {
        line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]]);
    }
    let running = v["running"].as_array().map_or(0, Vec::len);
    if running > 0 {
        let _ = writeln!(out, "({running} running now)");
    }
    out
}

/// An RFC 3339 time as `2026-11-27 18:03:05` (UTC, to the second; it was printed with its
/// nanoseconds); anything else as it is.
fn utc_seconds(v: &Value) -> String {
    match v.as_str().map(chrono::DateTime::parse_from_rfc3339) {
        Some(Ok(t)) => t
            .with_timezone(&chrono::Utc)
            .format("%Y-%m-%d %H:%M:%S")
            .to_string(),
        _ => s(v),
    }
}

fn runs(v: &Value) -> String {
    let rows = v["runs"].as_array().cloned().unwrap_or_default();
    if rows.is_empty() {
        return format!("job {} has no recorded runs yet\n", s(&v["id"]));
    }
    let mut out = String::from("SCHEDULED (UTC)       FINISHED (UTC)        OUTCOME    DETAIL\n");
    for r in &rows {
        let _ = writeln!(
            out,
            "{:<21} {:<21} {:<10} {}{}",
            utc_seconds(&r["scheduled"]),
            utc_seconds(&r["finished"]),
            s(&r["outcome"]),
            if r["late"] == Value::Bool(true) {
                "(late) "
            } else {
                ""
            },
            r["detail"].as_str().unwrap_or("")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn run_times_are_printed_to_the_second() {
        let v = serde_json::json!({"id": "j", "runs": [{"scheduled": "2026-11-27T17:00:00.123456789Z", "finished": "2026-11-27T18:00:01.5+01:00", "outcome": "ok"}]});
        let t = runs(&v);
        assert!(
            t.contains("2026-11-27 17:00:00   2026-11-27 17:00:01"),
            "{t}"
        );
        assert!(!t.contains("123456789"), "{t}");
    }

    #[test]
    fn intervals_take_units() {
        assert_eq!(parse_interval("90"), Ok(90));
        assert_eq!(parse_interval("90s"), Ok(90));
        assert_eq!(parse_interval("30m"), Ok(1_800));
        assert_eq!(parse_interval("2h"), Ok(7_200));
        assert_eq!(parse_interval("1d"), Ok(86_400));
        for bad in ["", "0", "m", "-5", "1.5h", "10w"] {
            let e = parse_interval(bad).unwrap_err();
            assert!(e.contains("30m"), "{bad}: {e}");
        }
    }

    #[test]
    fn at_needs_an_offset() {
        assert!(parse_at("2026-12-01T09:00:00+01:00").is_ok());
        let e = parse_at("2026-12-01 09:00").unwrap_err();
        assert!(e.contains("+01:00"), "{e}");
    }

    #[test]
    fn the_table_shows_local_and_utc_times() {
        let v = json!({"jobs": [{
            "id": "j1", "name": "digest", "enabled": false, "paused_reason": "by request",
            "schedule": {"kind": "every", "seconds": 1800},
            "next_run": "2026-12-01T08:00:00Z",
            "last_run": {"outcome": "ok"},
        }], "running": []});
        let t = table(&v, &Zone::utc());
        assert!(t.contains("every 30m"), "{t}");
        assert!(t.contains("2026-12-01 08:00 +00:00 (08:00 UTC)"), "{t}");
        assert!(t.contains("no (by request)") && t.contains("ok"), "{t}");
    }
}
