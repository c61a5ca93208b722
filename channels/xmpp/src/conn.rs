//! One XMPP client connection (RFC 6120): TCP, TLS (direct, or STARTTLS before anything else
//! is said), SASL SCRAM, resource binding. Gives back the stream, its reader and the full JID
//! the server bound. Must not: send the password before TLS, or accept a mechanism weaker than
//! SCRAM.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use ring::rand::SecureRandom;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub use clawft_channel_core::stream::Stream;
use tokio_rustls::TlsConnector;

use crate::scram::{Mechanism, Scram};
use crate::xml::{escape, Element, Event, Reader, XmlError};

const NS_TLS: &str = "urn:ietf:params:xml:ns:xmpp-tls";
const NS_SASL: &str = "urn:ietf:params:xml:ns:xmpp-sasl";
const NS_BIND: &str = "urn:ietf:params:xml:ns:xmpp-bind";

/// How the connection is secured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// TLS from the first byte (XEP-0368, port 5223).
    Direct,
    /// Plain first, upgraded with STARTTLS before the login (port 5222).
    StartTls,
}

/// What a connection needs.
#[derive(Clone)]
pub struct Login {
    /// Host to connect to.
    pub host: String,
    /// Port.
    pub port: u16,
    /// TLS.
    pub tls: TlsMode,
    /// The account's bare JID (`bot@example.org`).
    pub jid: String,
    /// Its password.
    pub password: String,
    /// Resource asked for.
    pub resource: String,
    /// CA certificates (PEM) trusted instead of the public roots.
    pub ca_pem: Option<Vec<u8>>,
    /// Time allowed for each step.
    pub timeout: Duration,
}

impl Login {
    /// The JID's domain part.
    pub fn domain(&self) -> &str {
        self.jid
            .split_once('@')
            .map_or(self.jid.as_str(), |(_, d)| d)
    }
    /// The JID's local part.
    pub fn local(&self) -> &str {
        self.jid.split_once('@').map_or("", |(l, _)| l)
    }
}

/// Why a connection failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// The network, TLS or a timeout: try again later.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The server's XML.
    #[error("{0}")]
    Xml(#[from] XmlError),
    /// The server refused the login (wrong password, unknown account): retrying will not help.
    #[error("{0}")]
    Auth(String),
    /// The server does not do what we require (TLS, SCRAM, binding).
    #[error("{0}")]
    Unsupported(String),
    /// The server ended the stream.
    #[error("the server closed the stream{0}")]
    Closed(String),
}

impl ConnError {
    /// Whether retrying later can help.
    pub fn is_retryable(&self) -> bool {
        match self {
            ConnError::Io(_) | ConnError::Xml(_) | ConnError::Closed(_) => true,
            ConnError::Auth(_) | ConnError::Unsupported(_) => false,
        }
    }
}

fn connector(ca_pem: Option<&[u8]>) -> io::Result<TlsConnector> {
    use rustls::pki_types::{pem::PemObject as _, CertificateDer};
    let roots = match ca_pem {
        None => rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert =
                    cert.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                roots
                    .add(cert)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            }
            roots
        }
    };
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(io::Error::other)?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(cfg)))
}

async fn tls(tcp: TcpStream, l: &Login) -> io::Result<Stream> {
    let name = rustls::pki_types::ServerName::try_from(l.domain().to_string())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let s = connector(l.ca_pem.as_deref())?.connect(name, tcp).await?;
    Ok(Stream::Tls(Box::new(s)))
}

/// A connected, logged-in stream.
pub struct Session {
    /// The stream.
    pub stream: Stream,
    /// Its reader (holds bytes already read past the login).
    pub reader: Reader,
    /// The full JID the server bound.
    pub bound: String,
    /// Whether the server offers stream management (XEP-0198).
    pub sm: bool,
}

/// Read the next event, reading from the socket as needed.
///
/// # Errors
/// The socket, malformed XML, or the stream closed.
pub async fn read_event(
    stream: &mut (impl AsyncRead + Unpin),
    reader: &mut Reader,
) -> Result<Event, ConnError> {
    let mut buf = [0u8; 8192];
    loop {
        if let Some(ev) = reader.next_event()? {
            return Ok(ev);
        }
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err(ConnError::Closed(" (the connection ended)".into()));
        }
        reader.feed(&buf[..n])?;
    }
}

async fn stanza(stream: &mut Stream, reader: &mut Reader) -> Result<Element, ConnError> {
    loop {
        match read_event(stream, reader).await? {
            Event::Open(_) => continue,
            Event::Stanza(el) if el.name == "stream:error" => {
                let cond = el
                    .children
                    .first()
                    .map_or("unknown", |c| c.name.as_str())
                    .to_string();
                return Err(ConnError::Closed(format!(": {cond}")));
            }
            Event::Stanza(el) => return Ok(el),
            Event::Close => return Err(ConnError::Closed(String::new())),
        }
    }
}

async fn open(stream: &mut Stream, reader: &mut Reader, l: &Login) -> Result<Element, ConnError> {
    reader.reset();
    let hdr = format!(
        "<?xml version='1.0'?><stream:stream to='{}' version='1.0' xmlns='jabber:client' xmlns:stream='http://etherx.jabber.org/streams'>",
        escape(l.domain())
    );
    stream.write_all(hdr.as_bytes()).await?;
    stream.flush().await?;
    // The features follow the server's stream header.
    let f = stanza(stream, reader).await?;
    if f.name != "stream:features" {
        return Err(ConnError::Unsupported(format!(
            "expected stream features, got <{}>",
            f.name
        )));
    }
    Ok(f)
}

fn nonce() -> Result<String, ConnError> {
    use base64::Engine;
    let mut b = [0u8; 18];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| ConnError::Io(io::Error::other("no system randomness")))?;
    Ok(base64::engine::general_purpose::STANDARD.encode(b))
}

/// A random id for a stanza.
pub fn random_id() -> String {
    nonce().map_or_else(
        |_| format!("{:x}", std::process::id()),
        |n| n.chars().filter(char::is_ascii_alphanumeric).collect(),
    )
}

/// Connect, secure, log in and bind a resource.
///
/// # Errors
/// See [`ConnError`]; each step within `l.timeout`.
pub async fn connect(l: &Login) -> Result<Session, ConnError> {
    let t = l.timeout;
    let step = |what: &'static str| {
        move |_| {
            ConnError::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{what} took over {}s", t.as_secs()),
            ))
        }
    };
    let tcp = tokio::time::timeout(t, TcpStream::connect((l.host.as_str(), l.port)))
        .await
        .map_err(step("connecting"))??;
    let _ = tcp.set_nodelay(true);
    let mut stream = match l.tls {
        TlsMode::Direct => tokio::time::timeout(t, tls(tcp, l))
            .await
            .map_err(step("the TLS handshake"))??,
        TlsMode::StartTls => Stream::Plain(tcp),
    };
    let mut reader = Reader::default();
    let mut features = tokio::time::timeout(t, open(&mut stream, &mut reader, l))
        .await
        .map_err(step("opening the stream"))??;
    if let Stream::Plain(_) = stream {
        if features.child("starttls", Some(NS_TLS)).is_none() {
            return Err(ConnError::Unsupported(format!(
                "{} does not offer STARTTLS: the password is never sent in clear",
                l.host
            )));
        }
        stream
            .write_all(format!("<starttls xmlns='{NS_TLS}'/>").as_bytes())
            .await?;
        let p = tokio::time::timeout(t, stanza(&mut stream, &mut reader))
            .await
            .map_err(step("STARTTLS"))??;
        if p.name != "proceed" {
            return Err(ConnError::Unsupported(format!(
                "{} refused STARTTLS",
                l.host
            )));
        }
        let Stream::Plain(tcp) = stream else {
            return Err(ConnError::Unsupported("STARTTLS on a TLS stream".into()));
        };
        stream = tokio::time::timeout(t, tls(tcp, l))
            .await
            .map_err(step("the TLS handshake"))??;
        features = tokio::time::timeout(t, open(&mut stream, &mut reader, l))
            .await
            .map_err(step("opening the stream"))??;
    }
    let mechs: Vec<&str> = features
        .child("mechanisms", Some(NS_SASL))
        .map(|m| {
            m.children
                .iter()
                .filter(|c| c.name == "mechanism")
                .map(|c| c.text.trim())
                .collect()
        })
        .unwrap_or_default();
    let mech = if mechs.contains(&"SCRAM-SHA-256") {
        Mechanism::Sha256
    } else if mechs.contains(&"SCRAM-SHA-1") {
        Mechanism::Sha1
    } else {
        return Err(ConnError::Unsupported(format!(
            "{} offers no SCRAM login (offers: {}): the password is only ever sent as a SCRAM proof",
            l.host,
            mechs.join(", ")
        )));
    };
    let (mut scram, first) = Scram::start(mech, l.local(), &nonce()?);
    stream
        .write_all(
            format!(
                "<auth xmlns='{NS_SASL}' mechanism='{}'>{first}</auth>",
                mech.name()
            )
            .as_bytes(),
        )
        .await?;
    loop {
        let s = tokio::time::timeout(t, stanza(&mut stream, &mut reader))
            .await
            .map_err(step("the login"))??;
        match s.name.as_str() {
            "challenge" => {
                let r = scram
                    .respond(&s.text, &l.password)
                    .map_err(|e| ConnError::Auth(e.0))?;
                stream
                    .write_all(format!("<response xmlns='{NS_SASL}'>{r}</response>").as_bytes())
                    .await?;
            }
            "success" => {
                scram.verify(&s.text).map_err(|e| ConnError::Auth(e.0))?;
                break;
            }
            "failure" => {
                let cond = s
                    .children
                    .iter()
                    .find(|c| c.name != "text")
                    .map_or("not-authorized", |c| c.name.as_str());
                let text = s
                    .child("text", None)
                    .map(|c| format!(" ({})", c.text))
                    .unwrap_or_default();
                return Err(ConnError::Auth(format!(
                    "{} refused the login of {}: {cond}{text}",
                    l.host, l.jid
                )));
            }
            other => {
                return Err(ConnError::Unsupported(format!(
                    "unexpected <{other}> during the login"
                )))
            }
        }
    }
    let features = tokio::time::timeout(t, open(&mut stream, &mut reader, l))
        .await
        .map_err(step("opening the stream"))??;
    if features.child("bind", Some(NS_BIND)).is_none() {
        return Err(ConnError::Unsupported(format!(
            "{} offers no resource binding",
            l.host
        )));
    }
    let sm = features.child("sm", Some("urn:xmpp:sm:3")).is_some();
    stream
        .write_all(
            format!(
                "<iq type='set' id='bind'><bind xmlns='{NS_BIND}'><resource>{}</resource></bind></iq>",
                escape(&l.resource)
            )
            .as_bytes(),
        )
        .await?;
    let r = tokio::time::timeout(t, stanza(&mut stream, &mut reader))
        .await
        .map_err(step("binding"))??;
    let bound = r
        .child("bind", Some(NS_BIND))
        .and_then(|b| b.child("jid", None))
        .map(|j| j.text.trim().to_string())
        .filter(|_| r.attr("type") == Some("result"))
        .ok_or_else(|| {
            ConnError::Unsupported(format!(
                "{} refused to bind resource {}",
                l.host, l.resource
            ))
        })?;
    // RFC 3921 sessions, where a legacy server still requires one.
    if let Some(s) = features.child("session", Some("urn:ietf:params:xml:ns:xmpp-session")) {
        if s.child("optional", None).is_none() {
            stream
                .write_all(b"<iq type='set' id='sess'><session xmlns='urn:ietf:params:xml:ns:xmpp-session'/></iq>")
                .await?;
            let _ = tokio::time::timeout(t, stanza(&mut stream, &mut reader))
                .await
                .map_err(step("the session"))??;
        }
    }
    Ok(Session {
        stream,
        reader,
        bound,
        sm,
    })
}
