//! The running gateway's side of the `gateway` tool ([`crate::tools::gateway::GatewayControl`]):
//! a compact, secret-free status, and a reload that goes through the same path as SIGHUP (the
//! gateway's main loop applies it and answers).

use std::time::Instant;

use async_trait::async_trait;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use super::AdminApi;

/// What a reload answers: the changes applied, or why the new configuration was rejected.
pub type ReloadResult = Result<Vec<String>, String>;
/// A reload asked of the gateway's main loop; it answers on the enclosed sender.
pub type ReloadRequest = oneshot::Sender<ReloadResult>;

/// The controls the `gateway` tool is given.
pub struct GatewayOps {
    admin: AdminApi,
    started: Instant,
    reloads: mpsc::Sender<ReloadRequest>,
}

impl GatewayOps {
    /// Controls over the running gateway behind `admin`; reloads are asked on `reloads`.
    pub fn new(admin: AdminApi, reloads: mpsc::Sender<ReloadRequest>) -> Self {
        Self {
            admin,
            started: Instant::now(),
            reloads,
        }
    }
}

#[async_trait]
impl crate::tools::gateway::GatewayControl for GatewayOps {
    async fn status(&self) -> Value {
        let Some(r) = self.admin.running.get() else {
            return json!({"status": "starting"});
        };
        let live = crate::daemon::live_sessions(&r.bus).await;
        let stored = r.store.sessions().map(|s| s.len()).unwrap_or(0);
        let jobs = r.scheduler.jobs().list().unwrap_or_default();
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_secs": self.started.elapsed().as_secs(),
            "channels": crate::daemon::channel_states(r.channels()).await,
            "sessions": {
                "live": live.len(),
                "stored": stored,
                "turns_running": live.iter().filter(|s| s.running).count(),
            },
            "scheduler": super::cron::scheduler_json(
                &jobs,
                r.scheduler.heartbeat(),
                Some(&r.scheduler),
            ),
            "store": {"health": r.store.health()},
        })
    }

    async fn reload(&self) -> ReloadResult {
        let (tx, rx) = oneshot::channel();
        self.reloads
            .send(tx)
            .await
            .map_err(|_| "the gateway is not taking reloads (it is stopping)".to_string())?;
        rx.await
            .map_err(|_| "the gateway stopped before it reloaded".to_string())?
    }
}
