//! `weft agent`: one message (`-m`) or an interactive chat, in-process or through a running
//! gateway's HTTP API.

use std::io::Write;

use clawft_channel_core::{OutboundKind, OutboundMessage, PlatformEventId};
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;

use super::client::{GatewayClient, StreamItem};
use super::terminal::TerminalChannel;
use super::CliError;
use crate::config::Config;
use crate::daemon::{build_model, Daemon};
use crate::store::{Store, StoreError};

/// Where a command reads the sessions from.
pub enum Backend {
    /// A running gateway's API.
    Gateway(GatewayClient),
    /// The store, opened by this process.
    Store(Store),
}

/// Use the running gateway of this store if there is one, else open the store; never a raw
/// lock error.
///
/// # Errors
/// The store is locked by a process whose API does not answer, or cannot be opened; the
/// store's control file cannot be read.
pub async fn backend(config: &Config) -> Result<Backend, CliError> {
    if let Some(c) = GatewayClient::detect(config).await? {
        eprintln!("(using the running gateway at {})", c.base());
        return Ok(Backend::Gateway(c));
    }
    match Store::open(&config.store.path, config.store.cache_bytes) {
        Ok(s) => {
            eprintln!("(store opened directly: {})", config.store.path.display());
            Ok(Backend::Store(s))
        }
        Err(StoreError::Locked(path)) => Err(CliError(format!(
            "the store at {path} is in use by another weft process, and no gateway of this store answers (none is running with its HTTP API, or it is starting or stopping). Wait for that process to finish, or stop it, then retry"
        ))),
        Err(e) => Err(CliError::msg(e)),
    }
}

/// Run `weft agent`.
///
/// # Errors
/// Provider failure (after retries) or infrastructure errors, with a clear message.
pub async fn run(config: &Config, message: Option<String>, session: &str) -> Result<(), CliError> {
    crate::types::SessionKey::from_parts(&["cli", session]).map_err(CliError::msg)?;
    match backend(config).await? {
        Backend::Gateway(client) => via_gateway(&client, message, session).await,
        Backend::Store(store) => in_process(config, store, message, session).await,
    }
}

struct Printer {
    streamed: bool,
    /// Print a failed turn's reason (interactive); a one-shot returns it as its error instead,
    /// so it is printed once, as the command's failure.
    print_errors: bool,
}

impl Printer {
    fn new(print_errors: bool) -> Self {
        Self {
            streamed: false,
            print_errors,
        }
    }

    /// Print one item; returns `Some(Ok(()))` when it ended a reply, `Some(Err(why))` when it
    /// ended the turn without one.
    fn item(&mut self, item: &StreamItem) -> Option<Result<(), String>> {
        let mut out = std::io::stdout();
        match item {
            StreamItem::Delta(t) => {
                self.streamed = true;
                let _ = write!(out, "{t}");
                let _ = out.flush();
                None
            }
            StreamItem::Restart => {
                // The text printed cannot be taken back: end its line and say it is void.
                if self.streamed {
                    let _ = writeln!(out);
                    let _ = out.flush();
                    eprintln!("  [the answer was cut off; asking again]");
                }
                self.streamed = false;
                None
            }
            StreamItem::Progress(v) => {
                if v.get("event").and_then(|e| e.as_str()) == Some("tool_started") {
                    let tool = v.get("tool").and_then(|t| t.as_str()).unwrap_or("?");
                    eprintln!("  [{tool}]");
                }
                None
            }
            StreamItem::Done(text) => {
                if self.streamed {
                    let _ = writeln!(out);
                } else {
                    let _ = writeln!(out, "{text}");
                }
                self.streamed = false;
                Some(Ok(()))
            }
            StreamItem::Error(text) => {
                if self.streamed {
                    let _ = writeln!(out);
                }
                if self.print_errors {
                    eprintln!("error: {text}");
                }
                self.streamed = false;
                Some(Err(text.clone()))
            }
        }
    }
}

fn to_item(m: &OutboundMessage) -> StreamItem {
    match m.kind {
        OutboundKind::Delta if m.is_restart() => StreamItem::Restart,
        OutboundKind::Delta => StreamItem::Delta(m.content.clone()),
        OutboundKind::Progress => StreamItem::Progress(m.meta.clone().unwrap_or_default()),
        OutboundKind::Final => StreamItem::Done(m.content.clone()),
        OutboundKind::Error => StreamItem::Error(m.content.clone()),
    }
}

async fn in_process(
    config: &Config,
    store: Store,
    message: Option<String>,
    session: &str,
) -> Result<(), CliError> {
    let model = build_model(config).map_err(CliError::msg)?;
    let (term, mut out) = TerminalChannel::new();
    let daemon = Daemon::start(config, store, model, vec![term.clone()])
        .await
        .map_err(CliError::msg)?;
    let result = match message {
        Some(m) => one_shot(&term, &mut out, session, &m).await,
        None => interactive_local(&term, &mut out, session).await,
    };
    daemon.shutdown().await;
    result
}

async fn one_shot(
    term: &TerminalChannel,
    out: &mut mpsc::UnboundedReceiver<OutboundMessage>,
    session: &str,
    message: &str,
) -> Result<(), CliError> {
    let id = term.submit(session, message).await.map_err(CliError::msg)?;
    let mut p = Printer::new(false);
    while let Some(m) = out.recv().await {
        if m.in_reply_to.as_ref() != Some(&id) {
            continue;
        }
        if let Some(end) = p.item(&to_item(&m)) {
            // A failed turn's reason (already scrubbed of secrets) is the command's error.
            return end.map_err(CliError);
        }
    }
    Err(CliError("the agent stopped before replying".into()))
}

fn stdin_lines() -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(l)) = lines.next_line().await {
            if tx.send(l).await.is_err() {
                break;
            }
        }
    });
    rx
}

const HELP: &str =
    "Type a message. /stop cancels the running turn, /new starts a new conversation, Ctrl-D exits.";

async fn interactive_local(
    term: &TerminalChannel,
    out: &mut mpsc::UnboundedReceiver<OutboundMessage>,
    session: &str,
) -> Result<(), CliError> {
    eprintln!("{HELP}");
    let mut lines = stdin_lines();
    let mut p = Printer::new(true);
    let mut waiting: Vec<PlatformEventId> = Vec::new();
    let mut eof = false;
    loop {
        if eof && waiting.is_empty() {
            break;
        }
        tokio::select! {
            line = lines.recv(), if !eof => {
                // Ctrl-D: exit once the replies already asked for have arrived.
                let Some(line) = line else { eof = true; continue };
                if line.trim().is_empty() { continue; }
                match term.submit(session, &line).await {
                    Ok(id) => waiting.push(id),
                    Err(e) => eprintln!("error: {e}"),
                }
            }
            m = out.recv() => {
                let Some(m) = m else { break };
                if p.item(&to_item(&m)).is_some() {
                    waiting.retain(|id| Some(id) != m.in_reply_to.as_ref());
                }
            }
        }
    }
    Ok(())
}

async fn via_gateway(
    client: &GatewayClient,
    message: Option<String>,
    session: &str,
) -> Result<(), CliError> {
    if let Some(m) = message {
        let mut p = Printer::new(false);
        let last = client
            .chat_stream(session, &m, |i| {
                let _ = p.item(i);
            })
            .await?;
        return match last {
            StreamItem::Error(why) => Err(CliError(why)),
            StreamItem::Delta(_)
            | StreamItem::Restart
            | StreamItem::Progress(_)
            | StreamItem::Done(_) => Ok(()),
        };
    }
    let mut p = Printer::new(true);
    eprintln!("{HELP}");
    let mut lines = stdin_lines();
    let (items_tx, mut items) = mpsc::unbounded_channel::<StreamItem>();
    let mut in_flight = 0usize;
    let mut eof = false;
    loop {
        if eof && in_flight == 0 {
            break;
        }
        tokio::select! {
            line = lines.recv(), if !eof => {
                // Ctrl-D: exit once the replies already asked for have arrived.
                let Some(line) = line else { eof = true; continue };
                if line.trim().is_empty() { continue; }
                in_flight += 1;
                let c = client.clone();
                let tx = items_tx.clone();
                let session = session.to_string();
                tokio::spawn(async move {
                    let r = c.chat_stream(&session, &line, |i| { let _ = tx.send(i.clone()); }).await;
                    if let Err(e) = r {
                        let _ = tx.send(StreamItem::Error(e.to_string()));
                    }
                });
            }
            Some(i) = items.recv() => {
                if p.item(&i).is_some() {
                    in_flight = in_flight.saturating_sub(1);
                }
            }
        }
    }
    Ok(())
}
