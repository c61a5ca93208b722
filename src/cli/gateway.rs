//! `weft gateway`: run the daemon until SIGINT/SIGTERM, then shut down in order.

use std::sync::Arc;

use clawft_channel_core::Channel;
use clawft_channel_http::{HttpChannel, HttpConfig};

use super::CliError;
use crate::admin::AdminApi;
use crate::config::Config;
use crate::daemon::{build_model, Daemon};
use crate::store::{Store, StoreError};

/// A started gateway: the daemon plus the address its HTTP API listens on.
pub struct Gateway {
    /// The daemon.
    pub daemon: Daemon,
    /// Bound address of the HTTP API, when enabled.
    pub http_addr: Option<std::net::SocketAddr>,
}

impl Gateway {
    /// Open the store, bind the HTTP API and start the daemon.
    ///
    /// # Errors
    /// Startup failures (store locked, bind refused, workspace), with what to fix.
    pub async fn start(config: Arc<Config>) -> Result<Self, CliError> {
        let store = match Store::open(&config.store.path, config.store.cache_bytes) {
            Ok(s) => s,
            Err(StoreError::Locked(p)) => {
                return Err(CliError(format!(
                    "another weft process holds the store at {p}: is a gateway already running? (`weft status` tells)"
                )))
            }
            Err(e) => return Err(CliError::msg(e)),
        };
        let model = build_model(&config).map_err(CliError::msg)?;
        let admin = AdminApi::new(config.clone());
        let mut channels: Vec<Arc<dyn Channel>> = Vec::new();
        let mut http_addr = None;
        if config.http.enabled {
            let http = HttpChannel::bind(
                HttpConfig {
                    bind: config.http.bind,
                    token: config.http.token.as_ref().map(|t| t.expose().to_string()),
                    reply_timeout: config.http.reply_timeout,
                    channel_id: "http".into(),
                },
                Arc::new(admin.clone()),
            )
            .await
            .map_err(|e| CliError(format!("channels.http: {e}")))?;
            http_addr = Some(http.local_addr());
            channels.push(http);
        }
        channels.extend(crate::channels::chat_channels(&config, &store));
        let daemon = Daemon::start(&config, store, model, channels)
            .await
            .map_err(CliError::msg)?;
        admin.attach(
            daemon.bus().clone(),
            daemon.store().clone(),
            daemon.channels().to_vec(),
            daemon.mcp().cloned(),
        );
        match http_addr {
            Some(a) => tracing::info!(http = %a, "weft gateway ready"),
            None => tracing::info!("weft gateway ready (HTTP API disabled)"),
        }
        Ok(Self { daemon, http_addr })
    }

    /// Shut down in order.
    pub async fn shutdown(self) {
        self.daemon.shutdown().await;
    }
}

/// Run the gateway until `shutdown` resolves.
///
/// # Errors
/// Startup failures, as [`Gateway::start`].
pub async fn run(
    config: Config,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), CliError> {
    let gateway = Gateway::start(Arc::new(config)).await?;
    shutdown.await;
    gateway.shutdown().await;
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
pub async fn signals() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("SIGTERM received"),
                    _ = int.recv() => tracing::info!("SIGINT received"),
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
