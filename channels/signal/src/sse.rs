//! The inbound loop: `GET /api/v1/events` (Server-Sent Events), reconnecting with
//! `Last-Event-ID` from the stored cursor, each `receive` event handed to ingress and the
//! cursor advanced only once ingress answered it.

use std::sync::Arc;

use clawft_channel_core::backoff::Backoff;
use clawft_channel_core::{now_ms, Ack, ChannelError, InboundDelivery};
use futures::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::events::{self, Me};
use crate::{Inner, CURSOR_KEY};

/// One parsed Server-Sent Event.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Event {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
}

/// An incremental parser of an SSE byte stream (the WHATWG format signal-cli writes:
/// `id:`, `event:`, `data:` lines, a blank line ends an event, `:` lines are keep-alives).
#[derive(Default)]
pub(crate) struct Parser {
    buf: Vec<u8>,
    cur: Event,
    has_data: bool,
}

impl Parser {
    /// Feed bytes; answer the events completed by them.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Vec<Event> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(nl) = self.buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=nl).collect();
            let line = String::from_utf8_lossy(&line[..line.len() - 1]);
            let line = line.strip_suffix('\r').unwrap_or(&line);
            if line.is_empty() {
                if self.has_data || self.cur.id.is_some() {
                    out.push(std::mem::take(&mut self.cur));
                }
                self.has_data = false;
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line, ""),
            };
            match field {
                "id" => self.cur.id = Some(value.to_string()),
                "event" => self.cur.event = Some(value.to_string()),
                "data" => {
                    if self.has_data {
                        self.cur.data.push('\n');
                    }
                    self.cur.data.push_str(value);
                    self.has_data = true;
                }
                _ => {}
            }
        }
        out
    }
}

/// How a connection ended.
enum End {
    /// The token fired: stop listening.
    Cancelled,
    /// The stream ended or failed; `delivered` says whether anything arrived (the backoff
    /// restarts then).
    Lost { why: String, delivered: bool },
}

/// Listen until `cancel` fires.
pub(crate) async fn run(
    inner: Arc<Inner>,
    tx: mpsc::Sender<InboundDelivery>,
    cancel: CancellationToken,
) -> Result<(), ChannelError> {
    let mut backoff = Backoff::new(inner.cfg.backoff_min, inner.cfg.backoff_max);
    loop {
        if cancel.is_cancelled() {
            return Ok(());
        }
        match connect(&inner, &tx, &cancel).await {
            Ok(End::Cancelled) => return Ok(()),
            Ok(End::Lost { why, delivered }) => {
                if delivered {
                    backoff.reset();
                }
                inner.set_status(format!("reconnecting: {why}"));
                tracing::info!(channel = %inner.cfg.id, reason = %why, "signal events stream lost, reconnecting");
            }
            Err(e) => {
                inner.set_status(format!("reconnecting: {e}"));
                tracing::warn!(channel = %inner.cfg.id, error = %e, "signal-cli events not reachable");
                if matches!(e, ChannelError::Auth(_) | ChannelError::Fatal(_)) {
                    return Err(e);
                }
            }
        }
        let delay = backoff.next_delay();
        tokio::select! {
            () = cancel.cancelled() => return Ok(()),
            () = tokio::time::sleep(delay) => {}
        }
    }
}

/// One connection of the events stream.
async fn connect(
    inner: &Arc<Inner>,
    tx: &mpsc::Sender<InboundDelivery>,
    cancel: &CancellationToken,
) -> Result<End, ChannelError> {
    let cfg = &inner.cfg;
    let mut url = reqwest::Url::parse(&format!(
        "{}/api/v1/events",
        cfg.api_url.trim_end_matches('/')
    ))
    .map_err(|e| ChannelError::Fatal(format!("channels.signal.api_url: {e}")))?;
    url.query_pairs_mut().append_pair("account", &cfg.number);
    let mut req = inner.http.get(url).header("accept", "text/event-stream");
    let cursor = cfg.state.get(CURSOR_KEY).filter(|c| !c.is_empty());
    if let Some(c) = &cursor {
        req = req.header("last-event-id", c.as_str());
    }
    let resp = tokio::select! {
        () = cancel.cancelled() => return Ok(End::Cancelled),
        r = req.send() => r.map_err(|e| ChannelError::Transient(format!("signal-cli unreachable at {}: {}", cfg.api_url, e.without_url())))?,
    };
    let status = resp.status();
    if status == reqwest::StatusCode::NOT_FOUND {
        return Err(ChannelError::Fatal(format!(
            "{} has no /api/v1/events: run signal-cli 0.13 or later as `signal-cli -a {} daemon --http HOST:PORT` and point channels.signal.api_url at it",
            cfg.api_url, cfg.number
        )));
    }
    if !status.is_success() {
        return Err(ChannelError::Transient(format!(
            "signal-cli answered {status} to GET /api/v1/events"
        )));
    }
    inner.set_status(format!("connected as {}", cfg.number));
    let me = Me {
        channel: &cfg.id,
        number: &cfg.number,
        group_mode: cfg.group_mode,
    };
    let mut stream = resp.bytes_stream();
    let mut parser = Parser::default();
    let mut delivered = false;
    loop {
        let next = tokio::select! {
            () = cancel.cancelled() => return Ok(End::Cancelled),
            n = tokio::time::timeout(cfg.idle_timeout, stream.next()) => n,
        };
        let chunk = match next {
            Err(_) => {
                return Ok(End::Lost {
                    why: format!("nothing for {} s", cfg.idle_timeout.as_secs()),
                    delivered,
                })
            }
            Ok(None) => {
                return Ok(End::Lost {
                    why: "signal-cli closed the stream".into(),
                    delivered,
                })
            }
            Ok(Some(Err(e))) => {
                return Ok(End::Lost {
                    why: e.without_url().to_string(),
                    delivered,
                })
            }
            Ok(Some(Ok(c))) => c,
        };
        for ev in parser.feed(&chunk) {
            match handle(inner, &me, tx, cancel, &ev).await {
                Handled::Next => delivered = true,
                Handled::Cancelled => return Ok(End::Cancelled),
                Handled::Retry(why) => return Ok(End::Lost { why, delivered }),
            }
            if let Some(id) = &ev.id {
                if let Err(e) = cfg.state.put(CURSOR_KEY, id) {
                    tracing::warn!(error = %e, "signal events cursor not stored");
                }
            }
        }
    }
}

enum Handled {
    /// Answered (delivered, refused, a duplicate or nothing to deliver): advance the cursor.
    Next,
    Cancelled,
    /// Not stored: reconnect from before it.
    Retry(String),
}

async fn handle(
    inner: &Inner,
    me: &Me<'_>,
    tx: &mpsc::Sender<InboundDelivery>,
    cancel: &CancellationToken,
    ev: &Event,
) -> Handled {
    if ev.event.as_deref().is_some_and(|e| e != "receive") {
        return Handled::Next;
    }
    let Ok(v) = serde_json::from_str::<Value>(&ev.data) else {
        tracing::warn!(channel = %inner.cfg.id, "signal-cli sent an event that is not JSON");
        return Handled::Next;
    };
    // A multi-account daemon names the account; events of other accounts are not ours.
    if v.get("account")
        .and_then(Value::as_str)
        .is_some_and(|a| a != inner.cfg.number)
    {
        return Handled::Next;
    }
    let Some(env) = v.get("envelope") else {
        return Handled::Next;
    };
    let Some(event) = events::parse(me, env, now_ms()) else {
        return Handled::Next;
    };
    let (delivery, ack) = InboundDelivery::new(event);
    if tx.send(delivery).await.is_err() {
        return Handled::Cancelled;
    }
    let ack = tokio::select! {
        () = cancel.cancelled() => return Handled::Cancelled,
        a = ack => a,
    };
    match ack {
        Ok(Ack::Unavailable(why)) => Handled::Retry(why),
        Ok(_) => Handled::Next,
        // Ingress dropped the port (shutting down): not answered, so not passed.
        Err(_) => Handled::Retry("ingress did not answer".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_parser_handles_split_chunks_keepalives_and_multiline_data() {
        let mut p = Parser::default();
        assert!(p.feed(b":\n").is_empty());
        assert!(p.feed(b"id:1\nevent:receive\ndata:{\"a\"").is_empty());
        let evs = p.feed(b":1}\n\nid: 2\ndata:x\ndata:y\n\n");
        assert_eq!(
            evs,
            vec![
                Event {
                    id: Some("1".into()),
                    event: Some("receive".into()),
                    data: "{\"a\":1}".into()
                },
                Event {
                    id: Some("2".into()),
                    event: None,
                    data: "x\ny".into()
                }
            ]
        );
    }
}
