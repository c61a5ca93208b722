//! ⑤ The HTTP half shared by the providers: one JSON POST whose failures are classified into
//! [`LlmError`] (status, `Retry-After`, body), and a Server-Sent Events reader that yields
//! `(event, data)` items.
//!
//! Knows no wire format: the providers build the request body, add their auth headers and
//! interpret each event (`[DONE]`, `message_stop`, error events) themselves.
//!
//! Timeouts and cancellation: the provider's timeout is set on the request, so it covers the
//! whole exchange, the streamed body included (a stalled stream ends in [`LlmError::Timeout`]).
//! Cancellation is by dropping the future: [`SseReader::next`] is cancel-safe (a dropped call
//! loses no bytes), and dropping the reader closes the connection.

use std::collections::VecDeque;
use std::time::Duration;

use futures::{Stream, StreamExt};

use super::error::parse_retry_after;
use super::LlmError;
use crate::types::scrub::Scrubber;

/// Build the shared HTTP client of a provider (rustls; proxies from the environment stay
/// enabled: providers may legitimately sit behind one).
///
/// # Errors
/// [`LlmError::InvalidResponse`] naming `provider` when the client cannot be built (no TLS
/// backend).
pub(crate) fn http_client(provider: &str, timeout: Duration) -> Result<reqwest::Client, LlmError> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10).min(timeout))
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(90))
        .build()
        .map_err(|e| LlmError::InvalidResponse {
            provider: provider.to_string(),
            detail: e.to_string(),
        })
}

/// Where a provider posts its requests, and the names its errors carry.
#[derive(Clone, Copy)]
pub(crate) struct Endpoint<'a> {
    /// The provider's client (connection pool).
    pub http: &'a reqwest::Client,
    /// Provider name, for errors.
    pub provider: &'a str,
    /// The URL posted to, for connection errors.
    pub url: &'a str,
    /// Whole-exchange timeout, response body included.
    pub timeout: Duration,
    /// Whether a connection error's detail lists the whole cause chain (OpenAI-compatible) or
    /// only reqwest's top-level message (Anthropic). Kept as each provider reported it: the
    /// text reaches users in the turn's failure reply.
    pub full_cause: bool,
    /// Applied to an error response's body before it is cut to its first bytes (a key echoed
    /// across the cut would otherwise leave its first characters behind).
    pub scrubber: &'a Scrubber,
}

impl<'a> Endpoint<'a> {
    /// A POST of the JSON `body` with the endpoint's timeout; the provider adds its headers.
    pub(crate) fn post(&self, body: Vec<u8>) -> reqwest::RequestBuilder {
        self.http
            .post(self.url)
            .timeout(self.timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
    }

    /// Send `rb` and return the response when its status is 2xx.
    ///
    /// # Errors
    /// A transport failure ([`Endpoint::transport_error`]), or an error status classified by
    /// [`LlmError::from_status`] with the `Retry-After` header and the body text.
    pub(crate) async fn send(
        &self,
        rb: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, LlmError> {
        let resp = rb.send().await.map_err(|e| self.transport_error(&e))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let retry_after = parse_retry_after(
            resp.headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()),
        );
        let text = resp.text().await.unwrap_or_default();
        // Anthropic's 529 "overloaded" falls in 5xx: a server error.
        Err(LlmError::from_status(
            self.provider,
            status.as_u16(),
            &self.scrubber.scrub_str(&text),
            retry_after,
        ))
    }

    /// Classify a reqwest failure: a timeout, or a connection that could not be made or broke.
    pub(crate) fn transport_error(&self, e: &reqwest::Error) -> LlmError {
        if e.is_timeout() {
            LlmError::Timeout {
                provider: self.provider.to_string(),
                timeout: self.timeout,
            }
        } else {
            LlmError::Connect {
                provider: self.provider.to_string(),
                url: self.url.to_string(),
                detail: if self.full_cause {
                    error_chain(e)
                } else {
                    e.to_string()
                },
                refused: is_refused(e),
            }
        }
    }

    /// A failure while reading a response body whose status and headers arrived: the timeout
    /// elapsed ([`LlmError::Timeout`]), or the answer was cut off mid-way ([`LlmError::Cut`]).
    pub(crate) fn body_error(&self, e: &reqwest::Error) -> LlmError {
        if e.is_timeout() {
            return self.transport_error(e);
        }
        self.cut(if self.full_cause {
            error_chain(e)
        } else {
            e.to_string()
        })
    }

    /// An [`LlmError::Cut`] of this provider.
    pub(crate) fn cut(&self, detail: impl Into<String>) -> LlmError {
        LlmError::Cut {
            provider: self.provider.to_string(),
            detail: detail.into(),
        }
    }

    /// The whole body of a non-streaming `resp` and its JSON: a body that breaks off while
    /// read, or whose JSON ends early, is a cut answer ([`LlmError::Cut`]), not a malformed one.
    pub(crate) async fn json_body(
        &self,
        resp: reqwest::Response,
    ) -> Result<(bytes::Bytes, serde_json::Value), LlmError> {
        let bytes = resp.bytes().await.map_err(|e| self.body_error(&e))?;
        let v = serde_json::from_slice(&bytes).map_err(|e| {
            if e.is_eof() {
                self.cut(format!("the response body ended early ({e})"))
            } else {
                self.invalid(format!("not JSON: {e}"))
            }
        })?;
        Ok((bytes, v))
    }

    /// An [`LlmError::InvalidResponse`] of this provider.
    pub(crate) fn invalid(&self, detail: impl Into<String>) -> LlmError {
        LlmError::InvalidResponse {
            provider: self.provider.to_string(),
            detail: detail.into(),
        }
    }

    /// The body of `resp` read as Server-Sent Events, transport failures classified.
    pub(crate) fn events(
        self,
        resp: reqwest::Response,
    ) -> Events<'a, impl Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin> {
        Events {
            reader: SseReader::new(resp.bytes_stream()),
            endpoint: self,
        }
    }
}

/// `base` (a provider's `base_url`) with `path` appended to its path, the query and fragment
/// kept after it: `https://x/v1?key=K` and `/chat/completions` make
/// `https://x/v1/chat/completions?key=K`.
pub(crate) fn join_url(base: &str, path: &str) -> String {
    let (head, tail) = base.split_at(base.find(['?', '#']).unwrap_or(base.len()));
    format!("{}{path}{tail}", head.trim_end_matches('/'))
}

/// `e` and its sources, `: `-separated (reqwest's own message omits the cause).
/// Whether an I/O error in `e`'s source chain is a refused connection.
fn is_refused(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        cur = c.source();
    }
    false
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// A streamed response body as events, from [`Endpoint::events`].
pub(crate) struct Events<'a, S> {
    reader: SseReader<S>,
    endpoint: Endpoint<'a>,
}

impl<S> Events<'_, S>
where
    S: Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin,
{
    /// The next event; `None` at the end of the body. Cancel-safe.
    ///
    /// # Errors
    /// The connection broke mid-answer or the timeout elapsed ([`Endpoint::body_error`]).
    pub(crate) async fn next(&mut self) -> Option<Result<SseEvent, LlmError>> {
        Some(
            self.reader
                .next()
                .await?
                .map_err(|e| self.endpoint.body_error(&e)),
        )
    }
}

/// One Server-Sent Event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SseEvent {
    /// The `event:` field; `None` when absent or empty (the SSE default type, `message`).
    pub event: Option<String>,
    /// The `data:` lines of the event joined by `\n` (one leading space of each removed).
    pub data: String,
}

/// Reads Server-Sent Events from a byte stream (the SSE format of the HTML standard): lines
/// end in LF, CRLF or CR, wherever the chunks split them; `:` lines are comments; `data:` lines
/// accumulate until a blank line dispatches the event; `id:`, `retry:` and unknown fields are
/// ignored; an event without `data:` is not dispatched.
///
/// At the end of the stream an event whose `data:` lines are complete is still delivered (some
/// servers close without the final blank line), but an unterminated last line is dropped: it
/// may be cut short.
pub(crate) struct SseReader<S> {
    body: S,
    parser: SseParser,
    /// Events parsed from the chunks read so far, not yet returned.
    ready: VecDeque<SseEvent>,
    ended: bool,
}

impl<S, B, E> SseReader<S>
where
    S: Stream<Item = Result<B, E>> + Unpin,
    B: AsRef<[u8]>,
{
    /// Read events from `body`.
    pub(crate) fn new(body: S) -> Self {
        Self {
            body,
            parser: SseParser::default(),
            ready: VecDeque::new(),
            ended: false,
        }
    }

    /// The next event; `None` once the body ended and every event was returned. Cancel-safe:
    /// bytes already read stay buffered in the reader.
    ///
    /// # Errors
    /// The body stream's own error; events completed before it were returned first.
    pub(crate) async fn next(&mut self) -> Option<Result<SseEvent, E>> {
        loop {
            if let Some(ev) = self.ready.pop_front() {
                return Some(Ok(ev));
            }
            if self.ended {
                return None;
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.parser.feed(chunk.as_ref(), &mut self.ready),
                Some(Err(e)) => return Some(Err(e)),
                None => {
                    self.ended = true;
                    self.ready.extend(self.parser.finish());
                }
            }
        }
    }
}

/// The incremental state of [`SseReader`]: bytes in, complete events out.
#[derive(Default)]
struct SseParser {
    /// The start of a line whose end has not arrived yet.
    line: Vec<u8>,
    /// The last byte read ended a line with CR: an LF right after it belongs to that line end.
    after_cr: bool,
    /// `event:` of the event being read.
    event: Option<String>,
    /// `data:` lines of the event being read, joined by `\n`.
    data: String,
    /// Whether the event being read had a `data:` line (its data may still be empty).
    has_data: bool,
}

impl SseParser {
    /// Consume `chunk`, pushing each event it completes to `out`.
    fn feed(&mut self, mut chunk: &[u8], out: &mut VecDeque<SseEvent>) {
        if self.after_cr && !chunk.is_empty() {
            self.after_cr = false;
            if chunk[0] == b'\n' {
                chunk = &chunk[1..];
            }
        }
        while let Some(end) = chunk.iter().position(|&b| b == b'\n' || b == b'\r') {
            if self.line.is_empty() {
                self.line_done(&chunk[..end], out);
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(&chunk[..end]);
                self.line_done(&line, out);
                line.clear();
                self.line = line;
            }
            let cr = chunk[end] == b'\r';
            chunk = &chunk[end + 1..];
            if cr {
                match chunk.first() {
                    Some(b'\n') => chunk = &chunk[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
        }
        self.line.extend_from_slice(chunk);
    }

    /// One complete line (without its end).
    fn line_done(&mut self, line: &[u8], out: &mut VecDeque<SseEvent>) {
        if line.is_empty() {
            if let Some(ev) = self.dispatch() {
                out.push_back(ev);
            }
            return;
        }
        let line = String::from_utf8_lossy(line);
        let (field, value) = match line.split_once(':') {
            Some(("", _)) => return, // a comment
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (&*line, ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = (!value.is_empty()).then(|| value.to_string()),
            _ => {}
        }
    }

    /// The event read so far, if it had data; the state is reset either way.
    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = self.event.take();
        if !std::mem::take(&mut self.has_data) {
            return None;
        }
        Some(SseEvent {
            event,
            data: std::mem::take(&mut self.data),
        })
    }

    /// The end of the stream: drop an unterminated line, deliver a pending event.
    fn finish(&mut self) -> Option<SseEvent> {
        self.line.clear();
        self.dispatch()
    }
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
