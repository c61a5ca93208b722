//! A TCP connection that is plain or TLS (implicit, or upgraded by STARTTLS), and a line
//! reader over it that survives cancellation (a partial line stays in the buffer).

use std::io;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub use clawft_channel_core::stream::Stream;
use tokio_rustls::TlsConnector;

/// How a connection is secured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// TLS from the first byte (IMAPS 993, SMTPS 465).
    Implicit,
    /// Plain first, upgraded with `STARTTLS` before credentials are sent (IMAP 143, SMTP 587).
    StartTls,
    /// No TLS at all (only allowed to a loopback address).
    None,
}

impl TlsMode {
    /// Parse a setting value (`implicit`, `starttls`, `none`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "implicit" | "tls" => Some(TlsMode::Implicit),
            "starttls" => Some(TlsMode::StartTls),
            "none" => Some(TlsMode::None),
            _ => None,
        }
    }
}

/// Longest line accepted from a server (IMAP lines are short; literals are read apart).
const MAX_LINE: usize = 1 << 20;
/// Time to connect (TCP and TLS handshake).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

fn connector() -> io::Result<TlsConnector> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    let cfg = CONFIG.get_or_init(|| {
        let roots =
            rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map(|b| Arc::new(b.with_root_certificates(roots).with_no_client_auth()))
        .map_err(|e| e.to_string())
    });
    cfg.clone()
        .map(TlsConnector::from)
        .map_err(io::Error::other)
}

/// A connector trusting only the certificates of `ca_pem` (a private CA, a self-signed
/// server).
fn connector_with(ca_pem: &[u8]) -> io::Result<TlsConnector> {
    use rustls::pki_types::{pem::PemObject as _, CertificateDer};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        roots
            .add(cert)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    }
    if roots.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the CA file holds no PEM certificate",
        ));
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(io::Error::other)?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(cfg)))
}

/// Check that `ca_pem` holds at least one usable certificate.
///
/// # Errors
/// Not PEM, or no certificate in it.
pub fn check_ca(ca_pem: &[u8]) -> io::Result<()> {
    connector_with(ca_pem).map(|_| ())
}

async fn handshake(tcp: TcpStream, host: &str, ca_pem: Option<&[u8]>) -> io::Result<Stream> {
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let connector = match ca_pem {
        Some(pem) => connector_with(pem)?,
        None => connector()?,
    };
    let tls = connector.connect(name, tcp).await?;
    Ok(Stream::Tls(Box::new(tls)))
}

/// A server connection with a line buffer.
pub struct Conn {
    stream: Stream,
    buf: Vec<u8>,
    host: String,
    ca_pem: Option<Vec<u8>>,
}

impl Conn {
    /// Connect to `host:port`; with [`TlsMode::Implicit`], TLS at once.
    ///
    /// # Errors
    /// The connection or the TLS handshake failed or timed out.
    pub async fn connect(
        host: &str,
        port: u16,
        mode: TlsMode,
        ca_pem: Option<&[u8]>,
    ) -> io::Result<Self> {
        let go = async {
            let tcp = TcpStream::connect((host, port)).await?;
            tcp.set_nodelay(true)?;
            let stream = match mode {
                TlsMode::Implicit => handshake(tcp, host, ca_pem).await?,
                TlsMode::StartTls | TlsMode::None => Stream::Plain(tcp),
            };
            Ok::<_, io::Error>(stream)
        };
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, go)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
        Ok(Self {
            stream,
            buf: Vec::new(),
            host: host.to_string(),
            ca_pem: ca_pem.map(<[u8]>::to_vec),
        })
    }

    /// Upgrade a plain connection to TLS (after the server agreed to `STARTTLS`).
    ///
    /// # Errors
    /// The handshake failed.
    pub async fn start_tls(self) -> io::Result<Self> {
        match self.stream {
            Stream::Plain(tcp) => {
                let stream = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    handshake(tcp, &self.host, self.ca_pem.as_deref()),
                )
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS timed out"))??;
                Ok(Self {
                    stream,
                    buf: Vec::new(),
                    host: self.host,
                    ca_pem: self.ca_pem,
                })
            }
            tls @ Stream::Tls(_) => Ok(Self {
                stream: tls,
                buf: self.buf,
                host: self.host,
                ca_pem: self.ca_pem,
            }),
        }
    }

    /// Whether the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        matches!(self.stream, Stream::Tls(_))
    }

    async fn fill(&mut self) -> io::Result<()> {
        let mut tmp = [0u8; 16 * 1024];
        let n = self.stream.read(&mut tmp).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            ));
        }
        self.buf.extend_from_slice(&tmp[..n]);
        Ok(())
    }

    /// The next line without its CRLF. Cancel-safe: a partial line stays buffered.
    ///
    /// # Errors
    /// The connection failed or the line is too long.
    pub async fn read_line(&mut self) -> io::Result<Vec<u8>> {
        loop {
            if let Some(pos) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let mut line: Vec<u8> = self.buf.drain(..pos + 2).collect();
                line.truncate(pos);
                return Ok(line);
            }
            if self.buf.len() > MAX_LINE {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the server sent a line over 1 MiB",
                ));
            }
            self.fill().await?;
        }
    }

    /// Exactly `n` bytes (an IMAP literal).
    ///
    /// # Errors
    /// The connection failed.
    pub async fn read_exact(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() < n {
            self.fill().await?;
        }
        Ok(self.buf.drain(..n).collect())
    }

    /// Write all of `data` and flush.
    ///
    /// # Errors
    /// The connection failed.
    pub async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.stream.write_all(data).await?;
        self.stream.flush().await
    }
}
