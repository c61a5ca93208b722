//! The listener's own TLS (`channels.http.tls_bind`, `tls_cert`, `tls_key`): a second listener
//! serving the same routes over HTTPS, so node hosts on other machines (and browsers) can reach
//! the gateway with `wss://`/`https://` without a reverse proxy in front.
//!
//! Handshakes run beside the accept loop (one slow or silent client holds up nobody) and are
//! bounded in time; a failed handshake is dropped without reaching the routes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

/// Longest a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server to take them.
const QUEUE: usize = 64;

/// Where and with what the listener serves TLS.
#[derive(Clone, Debug)]
pub struct TlsListen {
    /// Address of the TLS listener.
    pub bind: SocketAddr,
    /// PEM file: the server certificate, then its chain.
    pub cert: PathBuf,
    /// PEM file: the certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// The rustls server settings for `cert` and `key` (PEM files).
///
/// # Errors
/// A file that cannot be read, holds no certificate or key, or a key that does not match.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| format!("tls_cert {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "tls_cert {}: no certificate in the file (expected PEM)",
            cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        format!(
            "tls_key {}: {e} (expected a PEM private key)",
            key.display()
        )
    })?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .map_err(|e| format!("tls_cert and tls_key: {e}"))?;
    Ok(Arc::new(config))
}

/// A listener handing axum connections whose TLS handshake has finished.
pub(crate) struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
}

impl TlsListener {
    /// Accept on `tcp` and handshake with `config` until `stop` fires.
    pub(crate) fn start(
        tcp: tokio::net::TcpListener,
        config: Arc<rustls::ServerConfig>,
        stop: CancellationToken,
    ) -> std::io::Result<Self> {
        let addr = tcp.local_addr()?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = tokio::select! {
                    () = stop.cancelled() => return,
                    r = tcp.accept() => match r {
                        Ok(c) => c,
                        Err(e) => {
                            tracing::debug!(error = %e, "TLS listener: accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        }
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(Self { rx, addr })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The accept loop stopped (shutdown): no more connections.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}
