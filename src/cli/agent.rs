//! `weft agent`: one message (`-m`) or an interactive chat, in-process or through a running
//! gateway's HTTP API.

use std::io::Write;
use std::time::Duration;

use clawft_channel_core::{OutboundKind, OutboundMessage, PlatformEventId};
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
        Err(StoreError::Locked(path)) => Err(CliError::Failed(format!(
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
    // Ctrl-C is ours from here on: it cancels the running turn (as `/stop`) instead of killing
    // the process with the message journaled but unanswered (replayed silently at the next
    // start).
    let mut interrupts = Interrupts::new();
    match backend(config).await? {
        Backend::Gateway(client) => via_gateway(&client, message, session, &mut interrupts).await,
        Backend::Store(store) => in_process(config, store, message, session, &mut interrupts).await,
    }
}

/// The one-shot's error after Ctrl-C cancelled its turn.
const CANCELLED: &str =
    "cancelled (Ctrl-C): the turn was stopped, and the message will not be run again";
/// How long, after Ctrl-C, the terminal waits for the cancelled turn to end.
const CANCEL_WAIT: Duration = Duration::from_secs(5);
/// What the interactive terminal says when Ctrl-C cancels a turn.
const CANCELLING: &str =
    "  [Ctrl-C: cancelling the running turn; Ctrl-C again at the prompt exits]";

/// SIGINT (Ctrl-C), caught for the whole command.
struct Interrupts(Option<tokio::signal::unix::Signal>);

impl Interrupts {
    fn new() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        Self(signal(SignalKind::interrupt()).ok())
    }

    /// The next Ctrl-C (never, if the handler could not be installed).
    async fn next(&mut self) {
        match &mut self.0 {
            Some(s) => {
                if s.recv().await.is_none() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending::<()>().await,
        }
    }

    /// Whether Ctrl-C was pressed since the last look.
    fn pending(&mut self) -> bool {
        use futures::FutureExt;
        self.next().now_or_never().is_some()
    }
}

/// `/stop` for the terminal's session through a gateway.
async fn stop_via_gateway(client: &GatewayClient, session: &str) {
    let body = serde_json::json!({ "chat_id": session, "content": "/stop", "channel": "cli" });
    if let Err(e) = client.post("/v1/chat", &body).await {
        eprintln!("error: could not cancel the turn: {e}");
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
            StreamItem::Approval { id, text } => {
                if self.streamed {
                    let _ = writeln!(out);
                    let _ = out.flush();
                }
                eprintln!(
                    "{text}\n  [or from another shell: `weft approvals approve {id}`, `weft approvals deny {id}`]"
                );
                None
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
    if let (None, clawft_channel_core::OutboundBody::Approval { text, ask }) =
        (&m.in_reply_to, &m.body)
    {
        return StreamItem::Approval {
            id: ask.approval_id.clone(),
            text: text.clone(),
        };
    }
    match m.kind() {
        OutboundKind::Delta if m.is_restart() => StreamItem::Restart,
        OutboundKind::Delta => StreamItem::Delta(m.text().to_string()),
        OutboundKind::Progress => StreamItem::Progress(match &m.body {
            clawft_channel_core::OutboundBody::Progress(p) => {
                serde_json::to_value(p).unwrap_or_default()
            }
            _ => serde_json::Value::Null,
        }),
        OutboundKind::Final => StreamItem::Done(m.text().to_string()),
        OutboundKind::Error => StreamItem::Error(m.text().to_string()),
    }
}

async fn in_process(
    config: &Config,
    store: Store,
    message: Option<String>,
    session: &str,
    interrupts: &mut Interrupts,
) -> Result<(), CliError> {
    let model = build_model(config).map_err(CliError::msg)?;
    let (term, mut out) = TerminalChannel::new();
    let daemon = Daemon::start(config, store, model, vec![term.clone()])
        .await
        .map_err(CliError::msg)?;
    let result = match message {
        Some(m) => one_shot(&term, &mut out, session, &m, interrupts).await,
        None => interactive_local(&term, &mut out, session, interrupts).await,
    };
    daemon.shutdown().await;
    result
}

async fn one_shot(
    term: &TerminalChannel,
    out: &mut mpsc::UnboundedReceiver<OutboundMessage>,
    session: &str,
    message: &str,
    interrupts: &mut Interrupts,
) -> Result<(), CliError> {
    if interrupts.pending() {
        // Ctrl-C while starting: nothing was sent.
        return Err(CliError::Failed(
            "cancelled (Ctrl-C) before the message was sent".into(),
        ));
    }
    let id = term.submit(session, message).await.map_err(CliError::msg)?;
    let mut p = Printer::new(false);
    let mut cancelled = false;
    let deadline = tokio::time::sleep(Duration::MAX);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            m = out.recv() => {
                let Some(m) = m else { break };
                if m.in_reply_to.as_ref() != Some(&id) {
                    if let item @ StreamItem::Approval { .. } = to_item(&m) {
                        p.item(&item);
                    }
                    continue;
                }
                if let Some(end) = p.item(&to_item(&m)) {
                    // A reply that made it before the cancellation was printed: success.
                    if cancelled && end.is_err() {
                        return Err(CliError::Failed(CANCELLED.into()));
                    }
                    // A failed turn's reason (already scrubbed of secrets) is the command's
                    // error.
                    return end.map_err(CliError::Failed);
                }
            }
            () = interrupts.next(), if !cancelled => {
                // As `/stop`: the turn ends as cancelled and its journal entry is done, so the
                // next start does not run it again.
                cancelled = true;
                if let Err(e) = term.submit(session, "/stop").await {
                    eprintln!("error: could not cancel the turn: {e}");
                }
                deadline.as_mut().reset(tokio::time::Instant::now() + CANCEL_WAIT);
            }
            () = &mut deadline, if cancelled => {
                return Err(CliError::Failed(format!(
                    "cancelled (Ctrl-C), but the turn did not stop within {}s; it may still be answered at the next start",
                    CANCEL_WAIT.as_secs()
                )));
            }
        }
    }
    Err(CliError::Failed("the agent stopped before replying".into()))
}

/// The lines typed, read on a thread of its own: a read blocked on the terminal must not keep
/// the process from exiting (a read on Tokio's blocking pool holds the runtime's shutdown until
/// the next line, so Ctrl-C at the prompt could not exit).
fn stdin_lines() -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel(16);
    let spawned = std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || {
            use std::io::BufRead;
            for line in std::io::stdin().lock().lines() {
                let Ok(l) = line else { break };
                if tx.blocking_send(l).is_err() {
                    break;
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("error: cannot read the terminal: {e}");
    }
    rx
}

const HELP: &str = "Type a message. Ctrl-C (or /stop) cancels the running turn, /new starts a new conversation, Ctrl-C at the prompt or Ctrl-D exits.";

async fn interactive_local(
    term: &TerminalChannel,
    out: &mut mpsc::UnboundedReceiver<OutboundMessage>,
    session: &str,
    interrupts: &mut Interrupts,
) -> Result<(), CliError> {
    eprintln!("{HELP}");
    let mut lines = stdin_lines();
    let mut p = Printer::new(true);
    let mut waiting: Vec<PlatformEventId> = Vec::new();
    // The `/stop`s sent for Ctrl-C: their own answers are not shown (the cancelled turn's is).
    let mut stops: Vec<PlatformEventId> = Vec::new();
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
                if let Some(i) = stops.iter().position(|id| Some(id) == m.in_reply_to.as_ref()) {
                    if m.kind().is_durable() {
                        stops.swap_remove(i);
                    }
                    continue;
                }
                if p.item(&to_item(&m)).is_some() {
                    waiting.retain(|id| Some(id) != m.in_reply_to.as_ref());
                }
            }
            () = interrupts.next() => {
                if waiting.is_empty() {
                    // At the prompt: exit.
                    break;
                }
                eprintln!("{CANCELLING}");
                match term.submit(session, "/stop").await {
                    Ok(id) => stops.push(id),
                    Err(e) => eprintln!("error: could not cancel the turn: {e}"),
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
    interrupts: &mut Interrupts,
) -> Result<(), CliError> {
    if let Some(m) = message {
        if interrupts.pending() {
            return Err(CliError::Failed(
                "cancelled (Ctrl-C) before the message was sent".into(),
            ));
        }
        let mut p = Printer::new(false);
        let stream = client.chat_stream(session, &m, |i| {
            let _ = p.item(i);
        });
        tokio::pin!(stream);
        let last = tokio::select! {
            r = &mut stream => r?,
            () = interrupts.next() => {
                // As `/stop` in the chat: the gateway ends the turn as cancelled and marks its
                // journal entry done; wait (bounded) for the stream to say so.
                stop_via_gateway(client, session).await;
                match tokio::time::timeout(CANCEL_WAIT, &mut stream).await {
                    // The reply made it before the cancellation (and was printed).
                    Ok(Ok(StreamItem::Done(_))) => return Ok(()),
                    Ok(_) => return Err(CliError::Failed(CANCELLED.into())),
                    Err(_) => return Err(CliError::Failed(format!(
                        "cancelled (Ctrl-C), but the gateway did not end the turn within {}s; it may still be answered",
                        CANCEL_WAIT.as_secs()
                    ))),
                }
            }
        };
        return match last {
            StreamItem::Error(why) => Err(CliError::Failed(why)),
            StreamItem::Delta(_)
            | StreamItem::Restart
            | StreamItem::Progress(_)
            | StreamItem::Approval { .. }
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
            () = interrupts.next() => {
                if in_flight == 0 {
                    // At the prompt: exit.
                    break;
                }
                eprintln!("{CANCELLING}");
                stop_via_gateway(client, session).await;
            }
        }
    }
    Ok(())
}
