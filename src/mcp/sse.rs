//! The legacy HTTP+SSE client transport (MCP 2024-11-05), for servers that do not speak
//! streamable HTTP. rmcp 3 has none, so it is implemented here as an rmcp [`Transport`]:
//!
//! - `GET url` with `Accept: text/event-stream` opens the event stream; its first `endpoint`
//!   event names the URL to POST to (resolved against `url`; another origin is refused, so a
//!   server cannot make the client send its headers elsewhere);
//! - every client message is POSTed there as JSON (the answer is only an acknowledgement);
//! - the server's responses, requests and notifications arrive as `message` events.
//!
//! The stream ending (or failing) ends the transport, which the manager treats like a lost
//! connection. The HTTP client is the one of the streamable transport ([`super::http`]): same
//! SSRF guard, same configured headers. Events are bounded in size.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use reqwest13::header::{HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::service::RoleClient;
use rmcp::transport::Transport;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use url::Url;

/// Largest event accepted on the stream (a bigger one ends the connection).
pub(crate) const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;
/// Messages buffered between the stream reader and the service.
const CHANNEL: usize = 64;
/// Timeout of one POST.
const POST_TIMEOUT: Duration = Duration::from_secs(60);

/// Why the legacy transport failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SseError {
    /// The request could not be made (connection refused, SSRF guard, ...).
    #[error("{0}")]
    Http(#[from] reqwest13::Error),
    /// The server answered with a non-success status.
    #[error("HTTP {0}")]
    Status(reqwest13::StatusCode),
    /// The GET was answered, but not with an event stream.
    #[error("the answer to GET is not an event stream (content type {0:?})")]
    NotEventStream(String),
    /// The `endpoint` event is unusable.
    #[error("bad endpoint event `{0}`: {1}")]
    Endpoint(String, String),
    /// The stream ended before the `endpoint` event.
    #[error("the event stream ended before the endpoint event")]
    NoEndpoint,
    /// An event exceeded [`MAX_EVENT_BYTES`].
    #[error("an event exceeds {MAX_EVENT_BYTES} bytes")]
    TooLarge,
    /// The message could not be encoded.
    #[error("cannot encode the message: {0}")]
    Encode(#[from] serde_json::Error),
}

/// One server-sent event.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Event {
    /// `event:` field (`message` when absent).
    pub(crate) event: String,
    /// `data:` lines joined with `\n`.
    pub(crate) data: String,
}

/// Incremental `text/event-stream` parser (WHATWG HTML, "event stream interpretation"),
/// bounded: a line or an event over `max` bytes is an error.
#[derive(Debug)]
pub(crate) struct Parser {
    buf: Vec<u8>,
    event: Option<String>,
    data: Option<String>,
    /// Bytes of the event being assembled.
    size: usize,
    max: usize,
    /// The previous chunk ended with `\r`: a leading `\n` belongs to it.
    after_cr: bool,
}

impl Parser {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            buf: Vec::new(),
            event: None,
            data: None,
            size: 0,
            max,
            after_cr: false,
        }
    }

    /// Feed bytes; complete events are appended to `out`.
    pub(crate) fn feed(&mut self, mut chunk: &[u8], out: &mut Vec<Event>) -> Result<(), SseError> {
        if self.after_cr {
            if let Some(rest) = chunk.strip_prefix(b"\n") {
                chunk = rest;
            }
            self.after_cr = false;
        }
        while let Some(i) = chunk.iter().position(|&b| b == b'\n' || b == b'\r') {
            let mut line = std::mem::take(&mut self.buf);
            line.extend_from_slice(&chunk[..i]);
            let cr = chunk[i] == b'\r';
            chunk = &chunk[i + 1..];
            if cr {
                match chunk.first() {
                    Some(b'\n') => chunk = &chunk[1..],
                    None => self.after_cr = true,
                    Some(_) => {}
                }
            }
            self.size += line.len() + 1;
            if self.size > self.max {
                return Err(SseError::TooLarge);
            }
            self.line(&line, out);
        }
        if self.size + self.buf.len() + chunk.len() > self.max {
            return Err(SseError::TooLarge);
        }
        self.buf.extend_from_slice(chunk);
        Ok(())
    }

    fn line(&mut self, line: &[u8], out: &mut Vec<Event>) {
        if line.is_empty() {
            let event = self.event.take();
            if let Some(data) = self.data.take() {
                out.push(Event {
                    event: event
                        .filter(|e| !e.is_empty())
                        .unwrap_or_else(|| "message".into()),
                    data,
                });
            }
            self.size = 0;
            return;
        }
        let line = String::from_utf8_lossy(line);
        let (field, value) = match line.find(':') {
            Some(0) => return, // comment
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (&line[..], ""),
        };
        match field {
            "event" => self.event = Some(value.to_string()),
            "data" => match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            },
            _ => {} // id, retry, unknown: not used by MCP
        }
    }
}

/// The legacy SSE transport of one connection.
pub(crate) struct SseTransport {
    client: reqwest13::Client,
    endpoint: Url,
    headers: HashMap<HeaderName, HeaderValue>,
    rx: mpsc::Receiver<ServerJsonRpcMessage>,
    reader: JoinHandle<()>,
}

impl Drop for SseTransport {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

fn with_headers(
    mut req: reqwest13::RequestBuilder,
    headers: &HashMap<HeaderName, HeaderValue>,
) -> reqwest13::RequestBuilder {
    for (k, v) in headers {
        req = req.header(k, v);
    }
    req
}

/// The POST URL named by an `endpoint` event: resolved against the SSE URL, same origin only.
pub(crate) fn endpoint_url(sse_url: &Url, data: &str) -> Result<Url, SseError> {
    let data = data.trim();
    let u = sse_url
        .join(data)
        .map_err(|e| SseError::Endpoint(data.to_string(), e.to_string()))?;
    if u.origin() != sse_url.origin() {
        return Err(SseError::Endpoint(
            data.to_string(),
            format!(
                "it is not on the origin of `{}`",
                sse_url.origin().ascii_serialization()
            ),
        ));
    }
    Ok(u)
}

impl SseTransport {
    /// Open the event stream at `url` and wait for the `endpoint` event (the caller bounds the
    /// time this takes).
    pub(crate) async fn connect(
        client: reqwest13::Client,
        url: &Url,
        headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<Self, SseError> {
        let resp = with_headers(client.get(url.clone()), &headers)
            .header(ACCEPT, "text/event-stream")
            .send()
            .await?;
        if !resp.status().is_success() {
            return Err(SseError::Status(resp.status()));
        }
        let ct = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        if !ct
            .split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"))
        {
            return Err(SseError::NotEventStream(ct));
        }
        let mut body = resp.bytes_stream();
        let mut parser = Parser::new(MAX_EVENT_BYTES);
        let mut pending: Vec<Event> = Vec::new();
        let endpoint = 'found: loop {
            let Some(chunk) = body.next().await else {
                return Err(SseError::NoEndpoint);
            };
            parser.feed(&chunk?, &mut pending)?;
            while !pending.is_empty() {
                let ev = pending.remove(0);
                if ev.event == "endpoint" {
                    break 'found endpoint_url(url, &ev.data)?;
                }
                tracing::debug!(event = %ev.event, "SSE event before the endpoint ignored");
            }
        };
        let (tx, rx) = mpsc::channel(CHANNEL);
        let reader = tokio::spawn(async move {
            let mut events = pending;
            loop {
                for ev in events.drain(..) {
                    if ev.event != "message" {
                        continue;
                    }
                    match serde_json::from_str::<ServerJsonRpcMessage>(&ev.data) {
                        Ok(m) => {
                            if tx.send(m).await.is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "unparsable MCP message on the SSE stream ignored")
                        }
                    }
                }
                match body.next().await {
                    Some(Ok(chunk)) => {
                        if let Err(e) = parser.feed(&chunk, &mut events) {
                            tracing::warn!(error = %e, "SSE stream closed");
                            return;
                        }
                    }
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "SSE stream failed");
                        return;
                    }
                    None => return,
                }
            }
        });
        Ok(Self {
            client,
            endpoint,
            headers,
            rx,
            reader,
        })
    }
}

impl Transport<RoleClient> for SseTransport {
    type Error = SseError;

    fn name() -> std::borrow::Cow<'static, str> {
        "legacy-sse".into()
    }

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let req = serde_json::to_vec(&item).map(|body| {
            with_headers(self.client.post(self.endpoint.clone()), &self.headers)
                .header(CONTENT_TYPE, "application/json")
                .timeout(POST_TIMEOUT)
                .body(body)
        });
        async move {
            let resp = req?.send().await?;
            if resp.status().is_success() {
                Ok(())
            } else {
                Err(SseError::Status(resp.status()))
            }
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<ServerJsonRpcMessage>> + Send {
        self.rx.recv()
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.reader.abort();
        self.rx.close();
        std::future::ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn parse(chunks: &[&[u8]], max: usize) -> Result<Vec<Event>, SseError> {
        let mut p = Parser::new(max);
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, &mut out)?;
        }
        Ok(out)
    }

    fn ev(event: &str, data: &str) -> Event {
        Event {
            event: event.into(),
            data: data.into(),
        }
    }

    #[test]
    fn parses_events_across_chunks_and_line_endings() {
        let out = parse(
            &[
                b": comment\r\nevent: endpoint\r",
                b"\ndata: /messages?sessionId=1\r\n\r\n",
                b"data: {\"a\":\ndata:1}\n\nid: 3\nevent:message\ndata: \xc3\xa9t\xc3",
                b"\xa9\r\rdata: no blank line yet",
            ],
            1024,
        )
        .unwrap();
        assert_eq!(
            out,
            vec![
                ev("endpoint", "/messages?sessionId=1"),
                ev("message", "{\"a\":\n1}"),
                ev("message", "été"),
            ]
        );
        assert!(parse(&[b"event: x\n\n"], 1024).unwrap().is_empty());
        assert!(parse(&[], 1024).unwrap().is_empty());
    }

    #[test]
    fn events_are_bounded() {
        let big = vec![b'a'; 100];
        assert!(matches!(
            parse(&[b"data: ", &big], 64),
            Err(SseError::TooLarge)
        ));
        let mut many = Vec::new();
        for _ in 0..10 {
            many.extend_from_slice(b"data: 0123456789\n");
        }
        assert!(matches!(parse(&[&many], 64), Err(SseError::TooLarge)));
        // The bound is per event: many small events pass.
        let mut ok = Vec::new();
        for _ in 0..100 {
            ok.extend_from_slice(b"data: 0123456789\n\n");
        }
        assert_eq!(parse(&[&ok], 64).unwrap().len(), 100);
    }

    #[test]
    fn endpoint_is_resolved_on_the_same_origin_only() {
        let base = Url::parse("https://mcp.example.com/v1/sse?k=1").unwrap();
        assert_eq!(
            endpoint_url(&base, "/messages?sessionId=a")
                .unwrap()
                .as_str(),
            "https://mcp.example.com/messages?sessionId=a"
        );
        assert_eq!(
            endpoint_url(&base, "msg?s=1").unwrap().as_str(),
            "https://mcp.example.com/v1/msg?s=1"
        );
        assert_eq!(
            endpoint_url(&base, "https://mcp.example.com:443/m")
                .unwrap()
                .as_str(),
            "https://mcp.example.com/m"
        );
        for bad in [
            "https://evil.example/m",
            "//169.254.169.254/latest",
            "http://mcp.example.com/m",
            "https://mcp.example.com:8443/m",
        ] {
            assert!(
                matches!(endpoint_url(&base, bad), Err(SseError::Endpoint(..))),
                "{bad}"
            );
        }
    }
}
