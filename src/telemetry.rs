//! Logging: tracing with `RUST_LOG` honoured (default `info`), text or JSON lines on stderr.
//! Under systemd (`JOURNAL_STREAM` set) text logs drop the timestamp: journald adds its own.
//!
//! Span field names used across the crate: `channel`, `chat`, `event_id`, `session`, `turn`,
//! `tool`, `call_id`, `attempt`. Message bodies are never logged above `debug`.

use tracing_subscriber::EnvFilter;

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable text.
    Text,
    /// One JSON object per line.
    Json,
}

/// Install the global subscriber. `journald` drops timestamps.
pub fn init(format: LogFormat, default_level: &str, journald: bool) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = match (format, journald) {
        (LogFormat::Json, _) => builder.json().flatten_event(true).try_init(),
        (LogFormat::Text, true) => builder.without_time().with_ansi(false).try_init(),
        (LogFormat::Text, false) => builder.try_init(),
    };
}
