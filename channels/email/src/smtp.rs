//! A small SMTP submission client: `EHLO`, `STARTTLS`, `AUTH PLAIN`, one message.

use std::io;
use std::time::Duration;

use base64::Engine as _;

use crate::net::{Conn, TlsMode};

/// Time one whole submission may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(120);

/// Why a submission failed.
#[derive(Debug)]
pub enum SmtpError {
    /// The connection failed.
    Io(io::Error),
    /// The server answered with an error code.
    Reply {
        /// The reply code (4xx: try later, 5xx: refused).
        code: u16,
        /// The reply text (every line).
        text: String,
    },
    /// The server wants credentials over a connection that is not encrypted, or offers no way
    /// to log in that this client speaks.
    Config(String),
}

impl std::fmt::Display for SmtpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SmtpError::Io(e) => write!(f, "SMTP connection: {e}"),
            SmtpError::Reply { code, text } => write!(f, "SMTP server answered {code} {text}"),
            SmtpError::Config(m) => write!(f, "SMTP: {m}"),
        }
    }
}

impl From<io::Error> for SmtpError {
    fn from(e: io::Error) -> Self {
        SmtpError::Io(e)
    }
}

/// Where and how to submit.
#[derive(Clone, Debug)]
pub struct Submission<'a> {
    /// Server host.
    pub host: &'a str,
    /// Server port.
    pub port: u16,
    /// TLS mode.
    pub tls: TlsMode,
    /// Login (empty: no `AUTH`).
    pub user: &'a str,
    /// Password.
    pub password: &'a str,
    /// Our name in `EHLO`.
    pub helo: &'a str,
    /// Trust only these CA certificates (PEM) instead of the Mozilla roots.
    pub ca_pem: Option<&'a [u8]>,
}

async fn reply(conn: &mut Conn) -> Result<(u16, String), SmtpError> {
    let mut text = String::new();
    loop {
        let line = conn.read_line().await?;
        let line = String::from_utf8_lossy(&line);
        let code = line
            .get(..3)
            .and_then(|c| c.parse::<u16>().ok())
            .ok_or_else(|| SmtpError::Config(format!("not an SMTP reply: {line}")))?;
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(line.get(4..).unwrap_or(""));
        if line.as_bytes().get(3) != Some(&b'-') {
            return Ok((code, text));
        }
    }
}

async fn expect(conn: &mut Conn, cmd: Option<&str>, ok: &[u16]) -> Result<String, SmtpError> {
    if let Some(c) = cmd {
        conn.write_all(format!("{c}\r\n").as_bytes()).await?;
    }
    let (code, text) = reply(conn).await?;
    if ok.contains(&code) {
        Ok(text)
    } else {
        Err(SmtpError::Reply { code, text })
    }
}

/// `data` with lines starting with `.` doubled and the terminating `.` line.
pub fn dot_stuff(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 64);
    let mut at_line_start = true;
    for &b in data {
        if at_line_start && b == b'.' {
            out.push(b'.');
        }
        out.push(b);
        at_line_start = b == b'\n';
    }
    if !out.ends_with(b"\r\n") {
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b".\r\n");
    out
}

/// Submit one message from `from` to `to`.
///
/// # Errors
/// A classified [`SmtpError`].
pub async fn send(
    s: &Submission<'_>,
    from: &str,
    to: &[String],
    data: &[u8],
) -> Result<(), SmtpError> {
    tokio::time::timeout(SEND_TIMEOUT, send_inner(s, from, to, data))
        .await
        .map_err(|_| SmtpError::Io(io::Error::new(io::ErrorKind::TimedOut, "SMTP timed out")))?
}

async fn send_inner(
    s: &Submission<'_>,
    from: &str,
    to: &[String],
    data: &[u8],
) -> Result<(), SmtpError> {
    let mut conn = Conn::connect(s.host, s.port, s.tls, s.ca_pem).await?;
    expect(&mut conn, None, &[220]).await?;
    let mut ext = expect(&mut conn, Some(&format!("EHLO {}", s.helo)), &[250]).await?;
    if s.tls == TlsMode::StartTls {
        expect(&mut conn, Some("STARTTLS"), &[220]).await?;
        conn = conn.start_tls().await?;
        ext = expect(&mut conn, Some(&format!("EHLO {}", s.helo)), &[250]).await?;
    }
    let auth = ext
        .lines()
        .find(|l| l.to_ascii_uppercase().starts_with("AUTH"))
        .map(str::to_ascii_uppercase);
    if !s.user.is_empty() {
        match auth {
            Some(mechs) if mechs.split_whitespace().any(|m| m == "PLAIN") => {
                let token = base64::engine::general_purpose::STANDARD
                    .encode(format!("\0{}\0{}", s.user, s.password));
                expect(&mut conn, Some(&format!("AUTH PLAIN {token}")), &[235]).await?;
            }
            Some(mechs) => {
                return Err(SmtpError::Config(format!(
                    "the server offers {mechs}, not AUTH PLAIN"
                )))
            }
            // No AUTH offered: a relay that trusts this host (loopback, a LAN smarthost).
            None => {}
        }
    }
    expect(&mut conn, Some(&format!("MAIL FROM:<{from}>")), &[250]).await?;
    for r in to {
        expect(&mut conn, Some(&format!("RCPT TO:<{r}>")), &[250, 251]).await?;
    }
    expect(&mut conn, Some("DATA"), &[354]).await?;
    conn.write_all(&dot_stuff(data)).await?;
    expect(&mut conn, None, &[250]).await?;
    let _ = expect(&mut conn, Some("QUIT"), &[221]).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dots_at_line_starts_are_doubled() {
        assert_eq!(dot_stuff(b".a\r\nb\r\n.\r\n"), b"..a\r\nb\r\n..\r\n.\r\n");
        assert_eq!(dot_stuff(b"x"), b"x\r\n.\r\n");
    }
}
