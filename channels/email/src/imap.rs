//! A small IMAP4rev1 client: what the channel needs and nothing more (`AUTHENTICATE PLAIN`,
//! `SELECT`, `UID SEARCH`, `UID FETCH`, `UID STORE`, `IDLE`, `LOGOUT`).

use std::io;
use std::time::Duration;

use base64::Engine as _;
use tokio_util::sync::CancellationToken;

use crate::net::{Conn, TlsMode};

/// Time a command may take to complete (a `FETCH` of a large message included).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// Why an IMAP operation failed.
#[derive(Debug)]
pub enum ImapError {
    /// The connection failed (retry later).
    Io(io::Error),
    /// The server refused the credentials.
    Auth(String),
    /// The server answered `NO`/`BAD`, or something unexpected.
    Protocol(String),
}

impl std::fmt::Display for ImapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImapError::Io(e) => write!(f, "IMAP connection: {e}"),
            ImapError::Auth(m) => write!(f, "IMAP login refused: {m}"),
            ImapError::Protocol(m) => write!(f, "IMAP: {m}"),
        }
    }
}

impl From<io::Error> for ImapError {
    fn from(e: io::Error) -> Self {
        ImapError::Io(e)
    }
}

/// One server response: its text (each literal replaced by `{}`) and the literals in order.
#[derive(Debug, Default)]
pub struct Response {
    /// The lines joined, literals replaced by `{}`.
    pub text: String,
    /// The literal data.
    pub literals: Vec<Vec<u8>>,
}

/// What ended an `IDLE`.
#[derive(Debug, PartialEq, Eq)]
pub enum IdleEnd {
    /// The mailbox changed (`EXISTS`).
    Changed,
    /// The idle time ran out.
    Timeout,
    /// Shut down.
    Cancelled,
}

/// The state of the selected mailbox.
#[derive(Debug, Clone, Copy)]
pub struct Selected {
    /// `UIDVALIDITY`.
    pub validity: u32,
    /// `UIDNEXT` (the next UID the server will give).
    pub next: u32,
}

/// A logged-in session.
pub struct Imap {
    conn: Conn,
    tag: u32,
    /// Largest literal accepted (a message over it is refused before it is read).
    max_literal: usize,
}

/// Quote `s` as an IMAP quoted string.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

fn literal_len(line: &[u8]) -> Option<usize> {
    let s = std::str::from_utf8(line).ok()?;
    let s = s.strip_suffix('}')?;
    let open = s.rfind('{')?;
    s[open + 1..].trim_end_matches('+').parse().ok()
}

/// The `UID n` of a `FETCH` response.
fn uid_of(text: &str) -> Option<u32> {
    let at = text.find("UID ")? + 4;
    text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

impl Imap {
    /// Connect, secure (per `mode`) and authenticate.
    ///
    /// # Errors
    /// Connection, TLS or login failure.
    pub async fn login(
        host: &str,
        port: u16,
        mode: TlsMode,
        user: &str,
        password: &str,
        max_literal: usize,
        ca_pem: Option<&[u8]>,
    ) -> Result<Self, ImapError> {
        let conn = Conn::connect(host, port, mode, ca_pem).await?;
        let mut me = Self {
            conn,
            tag: 0,
            max_literal,
        };
        let greeting = me.read_response().await?;
        if greeting.text.starts_with("* BYE") {
            return Err(ImapError::Protocol(greeting.text));
        }
        if mode == TlsMode::StartTls {
            me.command("STARTTLS").await?;
            let Imap {
                conn,
                tag,
                max_literal,
            } = me;
            me = Self {
                conn: conn.start_tls().await?,
                tag,
                max_literal,
            };
        }
        if greeting.text.starts_with("* PREAUTH") {
            return Ok(me);
        }
        let token =
            base64::engine::general_purpose::STANDARD.encode(format!("\0{user}\0{password}"));
        me.tag += 1;
        let tag = format!("A{}", me.tag);
        me.conn
            .write_all(format!("{tag} AUTHENTICATE PLAIN\r\n").as_bytes())
            .await?;
        loop {
            let r = me.read_response().await?;
            if r.text.starts_with('+') {
                me.conn.write_all(format!("{token}\r\n").as_bytes()).await?;
                continue;
            }
            if let Some(rest) = r.text.strip_prefix(&format!("{tag} ")) {
                if rest.starts_with("OK") {
                    return Ok(me);
                }
                return Err(ImapError::Auth(rest.to_string()));
            }
        }
    }

    async fn read_response(&mut self) -> Result<Response, ImapError> {
        let mut r = Response::default();
        loop {
            let line = self.conn.read_line().await?;
            match literal_len(&line) {
                Some(n) => {
                    if n > self.max_literal {
                        return Err(ImapError::Protocol(format!(
                            "the server sent {n} bytes, over the {} limit",
                            self.max_literal
                        )));
                    }
                    let cut = line.iter().rposition(|b| *b == b'{').unwrap_or(line.len());
                    r.text.push_str(&String::from_utf8_lossy(&line[..cut]));
                    r.text.push_str("{}");
                    r.literals.push(self.conn.read_exact(n).await?);
                }
                None => {
                    r.text.push_str(&String::from_utf8_lossy(&line));
                    return Ok(r);
                }
            }
        }
    }

    /// Run `cmd`; the untagged responses, or the server's `NO`/`BAD`.
    ///
    /// # Errors
    /// A refusal or a failed connection.
    pub async fn command(&mut self, cmd: &str) -> Result<Vec<Response>, ImapError> {
        tokio::time::timeout(COMMAND_TIMEOUT, self.command_inner(cmd))
            .await
            .map_err(|_| ImapError::Io(io::Error::new(io::ErrorKind::TimedOut, "IMAP timeout")))?
    }

    async fn command_inner(&mut self, cmd: &str) -> Result<Vec<Response>, ImapError> {
        self.tag += 1;
        let tag = format!("A{}", self.tag);
        self.conn
            .write_all(format!("{tag} {cmd}\r\n").as_bytes())
            .await?;
        let mut out = Vec::new();
        loop {
            let r = self.read_response().await?;
            if let Some(rest) = r.text.strip_prefix(&format!("{tag} ")) {
                if rest.starts_with("OK") {
                    return Ok(out);
                }
                let verb = cmd.split(' ').next().unwrap_or(cmd);
                return Err(ImapError::Protocol(format!("{verb} refused: {rest}")));
            }
            if r.text.starts_with("* BYE") {
                return Err(ImapError::Io(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    r.text,
                )));
            }
            out.push(r);
        }
    }

    /// `SELECT` (or `EXAMINE`, read-only) a mailbox.
    ///
    /// # Errors
    /// The mailbox does not exist or the connection failed.
    pub async fn select(&mut self, mailbox: &str, read_only: bool) -> Result<Selected, ImapError> {
        let verb = if read_only { "EXAMINE" } else { "SELECT" };
        let rs = self.command(&format!("{verb} {}", quote(mailbox))).await?;
        let num = |key: &str| {
            rs.iter().find_map(|r| {
                let at = r.text.find(key)? + key.len();
                r.text[at..]
                    .trim_start()
                    .split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse::<u32>()
                    .ok()
            })
        };
        let validity = num("UIDVALIDITY")
            .ok_or_else(|| ImapError::Protocol("SELECT gave no UIDVALIDITY".into()))?;
        Ok(Selected {
            validity,
            next: num("UIDNEXT").unwrap_or(1),
        })
    }

    /// `UID SEARCH <criteria>`: the UIDs, ascending.
    ///
    /// # Errors
    /// A refusal or a failed connection.
    pub async fn search(&mut self, criteria: &str) -> Result<Vec<u32>, ImapError> {
        let rs = self.command(&format!("UID SEARCH {criteria}")).await?;
        let mut uids: Vec<u32> = rs
            .iter()
            .filter_map(|r| r.text.strip_prefix("* SEARCH"))
            .flat_map(|s| s.split_whitespace().filter_map(|n| n.parse().ok()))
            .collect();
        uids.sort_unstable();
        uids.dedup();
        Ok(uids)
    }

    /// The size of message `uid` (`RFC822.SIZE`), `None` when it is gone.
    ///
    /// # Errors
    /// A refusal or a failed connection.
    pub async fn size(&mut self, uid: u32) -> Result<Option<u64>, ImapError> {
        let rs = self
            .command(&format!("UID FETCH {uid} (RFC822.SIZE)"))
            .await?;
        Ok(rs.iter().find_map(|r| {
            let at = r.text.find("RFC822.SIZE ")? + "RFC822.SIZE ".len();
            r.text[at..]
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        }))
    }

    /// The whole message `uid` without setting `\Seen`; `None` when it is gone.
    ///
    /// # Errors
    /// A refusal or a failed connection.
    pub async fn fetch(&mut self, uid: u32) -> Result<Option<Vec<u8>>, ImapError> {
        let rs = self
            .command(&format!("UID FETCH {uid} (UID BODY.PEEK[])"))
            .await?;
        Ok(rs
            .into_iter()
            .find(|r| uid_of(&r.text) == Some(uid) && r.literals.len() == 1)
            .and_then(|mut r| r.literals.pop()))
    }

    /// Set `\Seen` on `uid`.
    ///
    /// # Errors
    /// A refusal or a failed connection.
    pub async fn mark_seen(&mut self, uid: u32) -> Result<(), ImapError> {
        self.command(&format!("UID STORE {uid} +FLAGS.SILENT (\\Seen)"))
            .await
            .map(|_| ())
    }

    /// `IDLE` until the mailbox changes, `timeout` passes or `cancel` fires.
    ///
    /// # Errors
    /// A refusal or a failed connection.
    pub async fn idle(
        &mut self,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> Result<IdleEnd, ImapError> {
        self.tag += 1;
        let tag = format!("A{}", self.tag);
        self.conn
            .write_all(format!("{tag} IDLE\r\n").as_bytes())
            .await?;
        loop {
            let line = self.conn.read_line().await?;
            if line.starts_with(b"+") {
                break;
            }
            if line.starts_with(tag.as_bytes()) {
                return Err(ImapError::Protocol(format!(
                    "IDLE refused: {}",
                    String::from_utf8_lossy(&line)
                )));
            }
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let end = loop {
            tokio::select! {
                line = self.conn.read_line() => {
                    let line = line?;
                    let text = String::from_utf8_lossy(&line);
                    if text.starts_with("* BYE") {
                        return Err(ImapError::Io(io::Error::new(io::ErrorKind::ConnectionAborted, text.into_owned())));
                    }
                    if text.starts_with('*') && (text.ends_with(" EXISTS") || text.ends_with(" RECENT")) {
                        break IdleEnd::Changed;
                    }
                }
                () = tokio::time::sleep_until(deadline) => break IdleEnd::Timeout,
                () = cancel.cancelled() => break IdleEnd::Cancelled,
            }
        };
        self.conn.write_all(b"DONE\r\n").await?;
        let done = async {
            loop {
                let line = self.conn.read_line().await?;
                if line.starts_with(tag.as_bytes()) {
                    return Ok::<_, io::Error>(());
                }
            }
        };
        tokio::time::timeout(COMMAND_TIMEOUT, done)
            .await
            .map_err(|_| ImapError::Io(io::Error::new(io::ErrorKind::TimedOut, "IDLE DONE")))??;
        Ok(end)
    }

    /// `APPEND` a message to `mailbox` with `flags` (e.g. `\Seen`).
    ///
    /// # Errors
    /// A refusal or a failed connection.
    pub async fn append(
        &mut self,
        mailbox: &str,
        flags: &str,
        message: &[u8],
    ) -> Result<(), ImapError> {
        self.tag += 1;
        let tag = format!("A{}", self.tag);
        self.conn
            .write_all(
                format!(
                    "{tag} APPEND {} ({flags}) {{{}}}\r\n",
                    quote(mailbox),
                    message.len()
                )
                .as_bytes(),
            )
            .await?;
        let mut sent = false;
        loop {
            let r = self.read_response().await?;
            if r.text.starts_with('+') && !sent {
                self.conn.write_all(message).await?;
                self.conn.write_all(b"\r\n").await?;
                sent = true;
                continue;
            }
            if let Some(rest) = r.text.strip_prefix(&format!("{tag} ")) {
                if rest.starts_with("OK") {
                    return Ok(());
                }
                return Err(ImapError::Protocol(format!("APPEND refused: {rest}")));
            }
        }
    }

    /// Say goodbye (best effort).
    pub async fn logout(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), self.command("LOGOUT")).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_uids_and_quoting_are_read_and_written_as_imap_says() {
        assert_eq!(literal_len(b"* 1 FETCH (UID 7 BODY[] {42}"), Some(42));
        assert_eq!(literal_len(b"A1 APPEND x {5+}"), Some(5));
        assert_eq!(literal_len(b"* OK done"), None);
        assert_eq!(uid_of("* 3 FETCH (UID 50 BODY[] {})"), Some(50));
        assert_ne!(uid_of("* 3 FETCH (UID 50 BODY[] {})"), Some(5));
        assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
