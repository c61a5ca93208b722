//! Hand-written HTTP/1.1 with keep-alive: the client that drives the gateway's API and the
//! message framing shared with the fake LLM. Just enough of the protocol for these two peers:
//! `Content-Length` or `chunked` bodies, no `Expect`, no pipelining.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The bearer token the benchmark's gateways are configured with (`channels.http.token`) and
/// every request sends: the API refuses callers without one, loopback included.
pub const API_TOKEN: &str = "bench-api-token-not-a-secret-0000";

/// Longest head accepted (requests and responses).
const MAX_HEAD: usize = 64 * 1024;
/// Longest body accepted.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// A parsed message head: the start line and the headers that matter here.
#[derive(Debug, Default)]
pub struct Head {
    /// Request: `METHOD PATH`; response: the status code as text.
    pub start: String,
    /// Status code of a response (0 for a request).
    pub status: u16,
    /// `Content-Length`, if given.
    pub content_length: Option<usize>,
    /// `Transfer-Encoding: chunked`.
    pub chunked: bool,
    /// `Connection: close`.
    pub close: bool,
}

/// Parse a head (up to and without the blank line).
fn parse_head(text: &str, response: bool) -> Result<Head, String> {
    let mut lines = text.split("\r\n");
    let start = lines.next().unwrap_or_default();
    let mut head = Head::default();
    if response {
        let code = start
            .split(' ')
            .nth(1)
            .ok_or_else(|| format!("bad status line `{start}`"))?;
        head.status = code
            .parse()
            .map_err(|e| format!("bad status `{code}`: {e}"))?;
        head.start = code.to_string();
    } else {
        let mut parts = start.split(' ');
        let method = parts.next().unwrap_or_default();
        let path = parts.next().unwrap_or_default();
        head.start = format!("{method} {path}");
    }
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            head.content_length = Some(
                value
                    .parse()
                    .map_err(|e| format!("bad content-length `{value}`: {e}"))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            head.chunked = value.to_ascii_lowercase().contains("chunked");
        } else if name.eq_ignore_ascii_case("connection") {
            head.close = value.eq_ignore_ascii_case("close");
        }
    }
    Ok(head)
}

/// Reads whole messages off one connection, keeping what follows for the next one.
pub struct Reader {
    buf: Vec<u8>,
}

impl Reader {
    /// An empty buffer.
    pub fn new() -> Self {
        Self {
            buf: Vec::with_capacity(16 * 1024),
        }
    }

    async fn fill(&mut self, s: &mut TcpStream) -> Result<usize, String> {
        let mut chunk = [0u8; 16 * 1024];
        let n = s.read(&mut chunk).await.map_err(|e| format!("read: {e}"))?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    /// Read one message. `Ok(None)` when the peer closed cleanly before a new message.
    pub async fn read_message(
        &mut self,
        s: &mut TcpStream,
        response: bool,
    ) -> Result<Option<(Head, Vec<u8>)>, String> {
        let head_end = loop {
            if let Some(p) = find(&self.buf, b"\r\n\r\n") {
                break p;
            }
            if self.buf.len() > MAX_HEAD {
                return Err("head too long".into());
            }
            if self.fill(s).await? == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err("connection closed inside a head".into());
            }
        };
        let text = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        let head = parse_head(&text, response)?;
        self.buf.drain(..head_end + 4);
        let body = if head.chunked {
            self.read_chunked(s).await?
        } else if let Some(n) = head.content_length {
            if n > MAX_BODY {
                return Err(format!("body of {n} bytes is too long"));
            }
            while self.buf.len() < n {
                if self.fill(s).await? == 0 {
                    return Err("connection closed inside a body".into());
                }
            }
            self.buf.drain(..n).collect()
        } else if response && head.status != 204 && head.status != 304 {
            // Until close.
            while self.fill(s).await? != 0 {}
            std::mem::take(&mut self.buf)
        } else {
            Vec::new()
        };
        Ok(Some((head, body)))
    }

    async fn read_chunked(&mut self, s: &mut TcpStream) -> Result<Vec<u8>, String> {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(p) = find(&self.buf, b"\r\n") {
                    break p;
                }
                if self.fill(s).await? == 0 {
                    return Err("connection closed inside a chunk size".into());
                }
            };
            let line = String::from_utf8_lossy(&self.buf[..line_end]).into_owned();
            let size_text = line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size_text, 16)
                .map_err(|e| format!("bad chunk size `{size_text}`: {e}"))?;
            self.buf.drain(..line_end + 2);
            if size == 0 {
                // Trailers (none expected) end with a blank line.
                loop {
                    if let Some(p) = find(&self.buf, b"\r\n") {
                        let blank = p == 0;
                        self.buf.drain(..p + 2);
                        if blank {
                            return Ok(body);
                        }
                    } else if self.fill(s).await? == 0 {
                        return Ok(body);
                    }
                }
            }
            if body.len() + size > MAX_BODY {
                return Err("chunked body too long".into());
            }
            while self.buf.len() < size + 2 {
                if self.fill(s).await? == 0 {
                    return Err("connection closed inside a chunk".into());
                }
            }
            body.extend_from_slice(&self.buf[..size]);
            self.buf.drain(..size + 2);
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// One keep-alive client connection to `addr`, reconnecting when the server closed it.
pub struct Client {
    addr: std::net::SocketAddr,
    conn: Option<(TcpStream, Reader)>,
    timeout: Duration,
}

impl Client {
    /// A client; connects on first use.
    pub fn new(addr: std::net::SocketAddr, timeout: Duration) -> Self {
        Self {
            addr,
            conn: None,
            timeout,
        }
    }

    async fn connect(&mut self) -> Result<(), String> {
        let s = TcpStream::connect(self.addr)
            .await
            .map_err(|e| format!("connect {}: {e}", self.addr))?;
        let _ = s.set_nodelay(true);
        self.conn = Some((s, Reader::new()));
        Ok(())
    }

    /// Send one request and read the response: (status, body). One write per request. A
    /// request on a reused connection that the server had closed is retried once on a new one.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<(u16, Vec<u8>), String> {
        let mut msg = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {API_TOKEN}\r\n",
            self.addr
        );
        if let Some(b) = body {
            msg.push_str("Content-Type: application/json\r\n");
            msg.push_str(&format!("Content-Length: {}\r\n", b.len()));
        }
        msg.push_str("\r\n");
        let mut bytes = msg.into_bytes();
        if let Some(b) = body {
            bytes.extend_from_slice(b);
        }
        let reused = self.conn.is_some();
        match tokio::time::timeout(self.timeout, self.exchange(&bytes)).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(Retry::Stale)) if reused => {
                self.conn = None;
                match tokio::time::timeout(self.timeout, self.exchange(&bytes)).await {
                    Ok(Ok(r)) => Ok(r),
                    Ok(Err(Retry::Stale)) => {
                        self.conn = None;
                        Err("connection closed before a response".into())
                    }
                    Ok(Err(Retry::Fail(e))) => {
                        self.conn = None;
                        Err(e)
                    }
                    Err(_) => {
                        self.conn = None;
                        Err(format!("no response within {:?}", self.timeout))
                    }
                }
            }
            Ok(Err(Retry::Stale)) => {
                self.conn = None;
                Err("connection closed before a response".into())
            }
            Ok(Err(Retry::Fail(e))) => {
                self.conn = None;
                Err(e)
            }
            Err(_) => {
                self.conn = None;
                Err(format!("no response within {:?}", self.timeout))
            }
        }
    }

    async fn exchange(&mut self, bytes: &[u8]) -> Result<(u16, Vec<u8>), Retry> {
        if self.conn.is_none() {
            self.connect().await.map_err(Retry::Fail)?;
        }
        let Some((s, r)) = self.conn.as_mut() else {
            return Err(Retry::Fail("no connection".into()));
        };
        if s.write_all(bytes).await.is_err() {
            return Err(Retry::Stale);
        }
        match r.read_message(s, true).await {
            Ok(Some((head, body))) => {
                if head.close {
                    self.conn = None;
                }
                Ok((head.status, body))
            }
            Ok(None) => Err(Retry::Stale),
            Err(e) if e.contains("reset") => Err(Retry::Stale),
            Err(e) => Err(Retry::Fail(e)),
        }
    }
}

enum Retry {
    /// The connection was closed before any response byte: safe to resend.
    Stale,
    Fail(String),
}

/// Write a whole response (head and body) with one `write_all` call on a `TCP_NODELAY` socket.
pub async fn write_response(
    s: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &[u8],
) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(body.len() + 160);
    out.extend_from_slice(
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: keep-alive\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    out.extend_from_slice(body);
    s.write_all(&out).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn heads_parse() {
        let h = parse_head(
            "HTTP/1.1 200 OK\r\ncontent-length: 12\r\nConnection: close",
            true,
        )
        .unwrap();
        assert_eq!((h.status, h.content_length, h.close), (200, Some(12), true));
        let h = parse_head(
            "POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked",
            false,
        )
        .unwrap();
        assert_eq!(h.start, "POST /v1/chat/completions");
        assert!(h.chunked);
    }
}
