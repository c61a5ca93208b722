//! Logging: tracing with `RUST_LOG` honoured (default `info`), text or JSON lines on stderr.
//! Under systemd (`JOURNAL_STREAM` set) text logs drop the timestamp (journald adds its own) and
//! start with the `sd-daemon(3)` priority prefix (`<3>` error … `<7>` debug), so journald
//! records each line at its level (`journalctl -p warning` works).
//!
//! Colour (ANSI escapes) only where a person reads the lines: [`ColorChoice::Auto`] (the
//! default) colours when stderr is a terminal and `NO_COLOR` is unset or empty; `--color
//! always|never` overrides both. Logs sent to a file, a pipe or journald are plain text.
//!
//! Span field names used across the crate: `channel`, `chat`, `event_id`, `session`, `turn`,
//! `tool`, `call_id`, `attempt`. Message bodies are never logged above `debug`.

use std::fmt;

use tracing::level_filters::LevelFilter;
use tracing::{Event, Level, Subscriber};
use tracing_log::AsLog as _;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::{DefaultFields, Format, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The syslog priority journald reads from a `<N>` line prefix.
pub fn journald_priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// Text lines for journald: `<N>` then the usual line without a timestamp.
struct Journald(Format<tracing_subscriber::fmt::format::Full, ()>);

impl<S, N> FormatEvent<S, N> for Journald
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        write!(writer, "<{}>", journald_priority(event.metadata().level()))?;
        self.0.format_event(ctx, writer, event)
    }
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable text.
    Text,
    /// One JSON object per line.
    Json,
}

/// When log lines carry colour (`--color`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    /// Colour when stderr is a terminal and `NO_COLOR` is unset or empty.
    #[default]
    Auto,
    /// Always colour, even into a file or a pipe.
    Always,
    /// Never colour.
    Never,
}

impl ColorChoice {
    /// Whether to colour, given `NO_COLOR`'s value and whether stderr is a terminal.
    pub fn colour(self, no_color: Option<&str>, stderr_is_tty: bool) -> bool {
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => stderr_is_tty && no_color.is_none_or(str::is_empty),
        }
    }
}

/// Largest size of the log file before it is renamed to `NAME.1` (the one before is dropped).
pub const LOG_FILE_MAX_BYTES: u64 = 10 * 1024 * 1024;

/// A log file that starts over when it reaches [`LOG_FILE_MAX_BYTES`]: the full one becomes
/// `NAME.1` (replacing the previous one), so the logs of a gateway that runs for months take
/// at most twice that.
pub struct RotatingFile {
    path: std::path::PathBuf,
    file: std::fs::File,
    written: u64,
}

impl RotatingFile {
    /// Open (create, mode 0600, in a 0700 directory made if missing) `path` for appending.
    ///
    /// # Errors
    /// The directory or the file cannot be made or opened.
    pub fn open(path: &std::path::Path) -> std::io::Result<Self> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        if let Some(dir) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        let written = file.metadata()?.len();
        let mut f = Self {
            path: path.to_path_buf(),
            file,
            written,
        };
        if f.written >= LOG_FILE_MAX_BYTES {
            f.rotate()?;
        }
        Ok(f)
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        let mut old = self.path.clone().into_os_string();
        old.push(".1");
        std::fs::rename(&self.path, old)?;
        *self = Self::open(&self.path)?;
        Ok(())
    }
}

impl std::io::Write for RotatingFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.written >= LOG_FILE_MAX_BYTES {
            // A log that cannot rotate keeps growing rather than losing lines.
            let _ = self.rotate();
        }
        let n = self.file.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// The layer that copies every log line (plain text, or JSON with `json`) into `file`.
fn file_layer<S>(
    file: Option<RotatingFile>,
    json: bool,
) -> Option<Box<dyn tracing_subscriber::Layer<S> + Send + Sync>>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::sync::Mutex::new(file?))
        .with_ansi(false)
        .with_target(false);
    Some(if json {
        layer.json().flatten_event(true).boxed()
    } else {
        layer.boxed()
    })
}

/// Most lines the gateway keeps of its recent log (for the control UI's Logs page).
pub const RECENT_LINES: usize = 2000;
/// Longest line kept (longer ones are cut).
const RECENT_LINE_MAX: usize = 4096;

/// One line of the recent log.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LogLine {
    /// Increasing number of the line since start.
    pub seq: u64,
    /// `ERROR`, `WARN`, `INFO`, `DEBUG` or `TRACE`.
    pub level: &'static str,
    /// The line as the log file has it (plain text).
    pub text: String,
}

/// The last [`RECENT_LINES`] lines of this process's log, in memory.
#[derive(Default)]
pub struct RecentLog {
    lines: std::sync::Mutex<(u64, std::collections::VecDeque<LogLine>)>,
}

/// The recent log of this process.
pub fn recent() -> &'static RecentLog {
    static R: std::sync::OnceLock<RecentLog> = std::sync::OnceLock::new();
    R.get_or_init(RecentLog::default)
}

const LEVELS: [&str; 5] = ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"];

impl RecentLog {
    fn push(&self, text: &str) {
        let text = text.trim_end();
        if text.is_empty() {
            return;
        }
        let level = text
            .split_whitespace()
            .take(3)
            .find_map(|w| LEVELS.iter().find(|l| **l == w))
            .copied()
            .unwrap_or("INFO");
        let mut cut = text.len().min(RECENT_LINE_MAX);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut g = self
            .lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.0 += 1;
        let seq = g.0;
        if g.1.len() >= RECENT_LINES {
            g.1.pop_front();
        }
        g.1.push_back(LogLine {
            seq,
            level,
            text: text[..cut].to_string(),
        });
    }

    /// The lines after `after` at `level` or more severe (`None`: every level), oldest first,
    /// at most `max`.
    pub fn tail(&self, after: u64, level: Option<&str>, max: usize) -> Vec<LogLine> {
        let rank = |l: &str| LEVELS.iter().position(|x| x.eq_ignore_ascii_case(l));
        let floor = level.and_then(rank).unwrap_or(LEVELS.len() - 1);
        let g = self
            .lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let v: Vec<LogLine> =
            g.1.iter()
                .filter(|l| l.seq > after && rank(l.level).is_some_and(|r| r <= floor))
                .cloned()
                .collect();
        v[v.len().saturating_sub(max)..].to_vec()
    }
}

/// The writer of the recent log: each formatted event is one line.
struct RecentWriter;

impl std::io::Write for RecentWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for line in String::from_utf8_lossy(buf).lines() {
            recent().push(line);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The layer that keeps the recent log in memory (plain text).
fn recent_layer<S>() -> Box<dyn tracing_subscriber::Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    tracing_subscriber::fmt::layer()
        .with_writer(|| RecentWriter)
        .with_ansi(false)
        .with_target(false)
        .boxed()
}

/// Install the global subscriber, filtered by `RUST_LOG` (`rust_log`, read by the caller) over
/// `default_level`: `journald` drops timestamps; `ansi` colours the text lines (see
/// [`ColorChoice::colour`]); every line is also written to `file` (a gateway run by hand keeps its log in
/// `~/.clawft/logs/gateway.log`, which `weft logs` reads).
pub fn init_with_file(
    format: LogFormat,
    default_level: &str,
    rust_log: Option<&str>,
    journald: bool,
    ansi: bool,
    file: Option<RotatingFile>,
) {
    let json = format == LogFormat::Json;
    let filter = filter(rust_log, default_level);
    let max = max_level(&filter);
    let builder = tracing_subscriber::fmt()
        .with_max_level(max)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false);
    let _ = match (format, journald) {
        (LogFormat::Json, _) => builder
            .with_ansi(false)
            .json()
            .flatten_event(true)
            .finish()
            .with(filter)
            .with(file_layer(file, json))
            .with(recent_layer())
            .try_init(),
        (LogFormat::Text, true) => builder
            .with_ansi(false)
            .fmt_fields(DefaultFields::new())
            .event_format(Journald(
                Format::default()
                    .without_time()
                    .with_target(false)
                    .with_ansi(false),
            ))
            .finish()
            .with(filter)
            .with(file_layer(file, json))
            .with(recent_layer())
            .try_init(),
        (LogFormat::Text, false) => builder
            .finish()
            .with(filter)
            .with(file_layer(file, json))
            .with(recent_layer())
            .try_init(),
    };
    // The `log` records of the dependencies (sled) stop at the same level, before they are
    // built: installing the subscriber let them all through to the filter.
    log::set_max_level(max.as_log());
}

/// The most verbose level any directive of `filter` lets through.
pub fn max_level(filter: &Targets) -> LevelFilter {
    filter
        .iter()
        .map(|(_, level)| level)
        .chain(filter.default_level())
        .max()
        .unwrap_or(LevelFilter::OFF)
}

/// The log filter: `RUST_LOG` when it is set and parses (`warn`, `info,clawft=debug`,
/// `sled=off`: a default level and `target=level` directives), else `default_level`. Span and
/// field filters (`[span{field=x}]`) and regular expressions are not supported: a plain target
/// filter needs no regex engine in the binary and costs less per event.
pub fn filter(rust_log: Option<&str>, default_level: &str) -> Targets {
    rust_log
        .filter(|s| !s.trim().is_empty())
        .and_then(|s| s.parse::<Targets>().ok())
        .or_else(|| default_level.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(tracing::Level::WARN))
}

#[cfg(test)]
mod tests {
    use super::filter;
    use tracing::level_filters::LevelFilter;
    use tracing::Level;

    #[test]
    fn rust_log_sets_a_default_level_and_per_target_levels_and_falls_back_when_unusable() {
        let f = filter(Some("warn,clawft::session=debug,sled=off"), "info");
        assert!(f.would_enable("clawft::session::actor", &Level::DEBUG));
        assert!(!f.would_enable("clawft::session::actor", &Level::TRACE));
        assert!(!f.would_enable("clawft::turn", &Level::INFO));
        assert!(f.would_enable("clawft::turn", &Level::WARN));
        assert!(!f.would_enable("sled::pagecache", &Level::ERROR));

        assert_eq!(super::max_level(&f), LevelFilter::DEBUG);
        assert_eq!(
            super::max_level(&filter(Some("off"), "info")),
            LevelFilter::OFF
        );
        assert_eq!(
            super::max_level(&filter(None, "warn,clawft::turn::failure=off")),
            LevelFilter::WARN
        );

        // Unset, empty or unparsable: the command's default level.
        for unusable in [None, Some(""), Some("  "), Some("clawft=loud")] {
            let f = filter(unusable, "info");
            assert!(f.would_enable("clawft::turn", &Level::INFO), "{unusable:?}");
            assert!(
                !f.would_enable("clawft::turn", &Level::DEBUG),
                "{unusable:?}"
            );
        }
    }
}
