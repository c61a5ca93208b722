//! A minimal Chrome DevTools Protocol client over `--remote-debugging-pipe`: Chromium reads
//! JSON messages, each ended by a NUL byte, from its file descriptor 3 and writes its answers
//! and events the same way to descriptor 4. No TCP DevTools port exists, so neither pages nor
//! commands can reach the protocol.
//!
//! Calls are matched to answers by id; events are broadcast to whoever subscribed. Sessions
//! are "flat" (`Target.attachToTarget { flatten: true }`): a call to a tab carries its
//! `sessionId`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{broadcast, oneshot, Mutex};

use crate::types::MutexExt;

/// Longest message read (a full-page screenshot of the capped size, base64, with room).
const MAX_MESSAGE: usize = 96 * 1024 * 1024;

/// A protocol failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CdpError {
    /// The browser is gone (exited, crashed, or the pipe closed).
    #[error("the browser closed")]
    Closed,
    /// The browser answered with an error.
    #[error("{method}: {message}")]
    Protocol {
        /// The method called.
        method: String,
        /// The browser's message.
        message: String,
    },
}

/// An event from the browser.
#[derive(Debug, Clone)]
pub struct Event {
    /// `Page.loadEventFired`, `Target.targetCreated`, ...
    pub method: String,
    /// Its parameters.
    pub params: Value,
    /// The session (tab) it is about; `None` for the browser's own events.
    pub session: Option<String>,
}

type Pending = std::sync::Mutex<HashMap<u64, oneshot::Sender<Result<Value, String>>>>;

/// One connection to one browser.
pub struct Cdp {
    writer: Mutex<Box<dyn AsyncWrite + Send + Unpin>>,
    pending: Arc<Pending>,
    events: broadcast::Sender<Event>,
    next: AtomicU64,
    closed: tokio_util::sync::CancellationToken,
    reader: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Cdp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cdp")
            .field("closed", &self.closed.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl Cdp {
    /// Speak CDP over `to_browser` (the browser's fd 3) and `from_browser` (its fd 4).
    pub fn start(
        to_browser: impl AsyncWrite + Send + Unpin + 'static,
        from_browser: impl AsyncRead + Send + Unpin + 'static,
    ) -> Self {
        let pending: Arc<Pending> = Arc::default();
        let (events, _) = broadcast::channel(1024);
        let closed = tokio_util::sync::CancellationToken::new();
        let reader = tokio::spawn(read_loop(
            BufReader::new(from_browser),
            pending.clone(),
            events.clone(),
            closed.clone(),
        ));
        Self {
            writer: Mutex::new(Box::new(to_browser)),
            pending,
            events,
            next: AtomicU64::new(1),
            closed,
            reader,
        }
    }

    /// Events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Whether the browser is gone.
    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Resolves when the browser is gone.
    pub async fn closed(&self) {
        self.closed.cancelled().await;
    }

    /// Call `method` (on the tab of `session`, or on the browser) and wait for its answer.
    /// The caller bounds the wait (every action has a deadline).
    ///
    /// # Errors
    /// [`CdpError::Closed`] when the browser is gone, [`CdpError::Protocol`] for its error.
    pub async fn call(
        &self,
        session: Option<&str>,
        method: &str,
        params: Value,
    ) -> Result<Value, CdpError> {
        if self.is_closed() {
            return Err(CdpError::Closed);
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = session {
            msg["sessionId"] = Value::String(s.to_string());
        }
        let (tx, rx) = oneshot::channel();
        self.pending.locked().insert(id, tx);
        let mut bytes = serde_json::to_vec(&msg).unwrap_or_default();
        bytes.push(0);
        {
            let mut w = self.writer.lock().await;
            if w.write_all(&bytes).await.is_err() || w.flush().await.is_err() {
                self.pending.locked().remove(&id);
                self.closed.cancel();
                return Err(CdpError::Closed);
            }
        }
        let answer = tokio::select! {
            r = rx => r,
            () = self.closed.cancelled() => {
                self.pending.locked().remove(&id);
                return Err(CdpError::Closed);
            }
        };
        match answer {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(message)) => Err(CdpError::Protocol {
                method: method.to_string(),
                message,
            }),
            Err(_) => Err(CdpError::Closed),
        }
    }
}

impl Drop for Cdp {
    fn drop(&mut self) {
        self.reader.abort();
        self.closed.cancel();
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut from: BufReader<R>,
    pending: Arc<Pending>,
    events: broadcast::Sender<Event>,
    closed: tokio_util::sync::CancellationToken,
) {
    let mut buf = Vec::with_capacity(64 * 1024);
    loop {
        buf.clear();
        let n = (&mut from)
            .take(MAX_MESSAGE as u64)
            .read_until(0, &mut buf)
            .await
            .unwrap_or_default();
        if n == 0 || buf.last() != Some(&0) {
            // EOF, a read error, or a message over the cap (the stream cannot be resynced).
            break;
        }
        buf.pop();
        let Ok(msg) = serde_json::from_slice::<Value>(&buf) else {
            continue;
        };
        if let Some(id) = msg.get("id").and_then(Value::as_u64) {
            let answer = match msg.get("error") {
                Some(e) => Err(e
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("error")
                    .to_string()),
                None => Ok(msg.get("result").cloned().unwrap_or(Value::Null)),
            };
            if let Some(tx) = pending.locked().remove(&id) {
                let _ = tx.send(answer);
            }
        } else if let Some(method) = msg.get("method").and_then(Value::as_str) {
            let _ = events.send(Event {
                method: method.to_string(),
                params: msg.get("params").cloned().unwrap_or(Value::Null),
                session: msg
                    .get("sessionId")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            });
        }
    }
    closed.cancel();
    pending.locked().clear();
}
