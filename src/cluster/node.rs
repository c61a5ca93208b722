//! This node in the cluster: the NATS connection on a runtime of its own (the daemon's
//! runtime has one thread, and channel state writes wait on NATS synchronously), the buckets
//! and streams it sets up, the heartbeat in the node registry, the health `/readyz` reports,
//! and the leases it holds ([`Cluster::hold`]). It imports none of the pieces that run on it
//! (partitions, the session log, shared state): they take a [`Cluster`].

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::fence::{Fence, Held};
use super::lease::{LeaseError, Leases};
use super::settings::{ClusterSettings, NatsAuth};
use crate::store::shared::{key_part, SharedError};
use crate::types::MutexExt;

pub use super::error::ClusterError;

/// The key-value bucket of the leases (history 1, max age = the lease TTL).
pub const LEASE_BUCKET: &str = "weft_leases";
/// The key-value bucket of the node registry (entries expire after three TTLs without a
/// heartbeat).
pub const NODE_BUCKET: &str = "weft_nodes";
/// The key-value bucket of the channels' resume state (no expiry).
pub const STATE_BUCKET: &str = "weft_channel_state";

/// What the registry says about a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Node id.
    pub node: String,
    /// Its HTTP API, when it has one.
    pub address: Option<String>,
    /// When it started (Unix ms).
    pub started_ms: u64,
    /// Its weft version.
    pub version: String,
    /// Its last heartbeat (Unix ms).
    pub seen_ms: u64,
}

/// Connect to the servers of `s` (one attempt, bounded by `timeout`; the client then
/// reconnects by itself).
///
/// # Errors
/// Unreadable credentials, or no server answered.
pub async fn connect(
    s: &ClusterSettings,
    timeout: Duration,
    retry: bool,
) -> Result<async_nats::Client, ClusterError> {
    let mut o = async_nats::ConnectOptions::new()
        .name(format!("weft {}", s.node_id))
        .connection_timeout(timeout)
        .request_timeout(Some(timeout))
        .ping_interval(Duration::from_secs(5))
        .max_reconnects(None::<usize>)
        .reconnect_delay_callback(|attempt| {
            Duration::from_millis(100 * 2u64.saturating_pow(attempt.min(5) as u32))
                .min(Duration::from_secs(2))
        });
    if retry {
        o = o.retry_on_initial_connect();
    }
    o = match &s.auth {
        NatsAuth::None => o,
        NatsAuth::UserPassword { user, password } => {
            o.user_and_password(user.clone(), password.expose().to_string())
        }
        NatsAuth::Token(t) => o.token(t.expose().to_string()),
        NatsAuth::NkeyFile(p) => {
            let seed = std::fs::read_to_string(p).map_err(|e| {
                ClusterError::Setup(format!("cluster.nkey_file {}: {e}", p.display()))
            })?;
            o.nkey(seed.trim().to_string())
        }
        NatsAuth::CredsFile(p) => o
            .credentials_file(p)
            .await
            .map_err(|e| ClusterError::Setup(format!("cluster.creds_file {}: {e}", p.display())))?,
    };
    if let Some(ca) = &s.tls_ca {
        o = o.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let Some((cert, key)) = &s.tls_client {
        o = o.add_client_certificate(cert.clone(), key.clone());
    }
    let mut addrs = Vec::new();
    for u in &s.nats_urls {
        addrs.push(
            u.parse::<async_nats::ServerAddr>()
                .map_err(|e| ClusterError::Setup(format!("cluster.nats_url `{u}`: {e}")))?,
        );
    }
    o.connect(addrs.as_slice())
        .await
        .map_err(|e| ClusterError::Nats(e.to_string()))
}

/// The buckets of the cluster, made if missing: replicated on three servers when the cluster
/// has them (one otherwise).
///
/// # Errors
/// JetStream refused or did not answer.
pub async fn buckets(
    js: &jetstream::Context,
    ttl: Duration,
) -> Result<(kv::Store, kv::Store, kv::Store), ClusterError> {
    let leases = bucket(js, LEASE_BUCKET, ttl, "weft leases").await?;
    let nodes = bucket(js, NODE_BUCKET, ttl * 3, "weft node registry").await?;
    let state = bucket(js, STATE_BUCKET, Duration::ZERO, "weft channel state").await?;
    Ok((leases, nodes, state))
}

/// The bucket `name`, made if missing (replicated on three servers when the cluster has them).
///
/// # Errors
/// JetStream refused or did not answer.
pub async fn bucket(
    js: &jetstream::Context,
    name: &str,
    max_age: Duration,
    description: &str,
) -> Result<kv::Store, ClusterError> {
    if let Ok(s) = js.get_key_value(name).await {
        return Ok(s);
    }
    let mut last = String::new();
    for replicas in [3, 1] {
        match js
            .create_key_value(kv::Config {
                bucket: name.to_string(),
                description: description.to_string(),
                history: 1,
                max_age,
                storage: jetstream::stream::StorageType::File,
                num_replicas: replicas,
                ..Default::default()
            })
            .await
        {
            Ok(s) => {
                if replicas == 1 {
                    tracing::warn!(bucket = name, "JetStream has fewer than three servers: the cluster's bucket is not replicated");
                }
                return Ok(s);
            }
            Err(e) => last = e.to_string(),
        }
        // Made by another node meanwhile?
        if let Ok(s) = js.get_key_value(name).await {
            return Ok(s);
        }
    }
    Err(ClusterError::Nats(format!("bucket {name}: {last}")))
}

/// The node's health as `/readyz` and `weft status` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Health {
    /// NATS and JetStream answer.
    pub ok: bool,
    /// Why not, when not.
    pub reason: Option<String>,
    /// Since when this state holds (Unix ms).
    pub since_ms: u64,
}

/// A lease this node holds, as the code acting under it sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holding {
    /// The fencing token (the revision it was acquired at).
    pub token: u64,
    /// Until when this node may act (monotonic).
    pub until: Instant,
}

impl Holding {
    /// Whether this node may act now.
    pub fn valid(&self) -> bool {
        Instant::now() < self.until
    }
}

struct Inner {
    settings: ClusterSettings,
    fence: Fence,
    rt: tokio::runtime::Handle,
    health: Mutex<Health>,
    ready: watch::Receiver<Option<Ready>>,
    stop: CancellationToken,
}

#[derive(Clone)]
struct Ready {
    leases: Leases,
    state: kv::Store,
    js: jetstream::Context,
}

/// This node in the cluster (cheap to clone).
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

/// What the node registry says about this node.
pub struct NodeSelf {
    /// Its HTTP API.
    pub address: Option<String>,
}

impl Cluster {
    /// Join the cluster: connect (in the background, retrying), make the buckets, register and
    /// heartbeat. Returns at once; [`Cluster::health`] tells when NATS answers.
    ///
    /// # Errors
    /// The runtime thread could not start, or the settings cannot be used.
    pub fn start(settings: ClusterSettings, me: NodeSelf) -> Result<Self, ClusterError> {
        let (rt_tx, rt_rx) = std::sync::mpsc::sync_channel(1);
        let stop = CancellationToken::new();
        let thread_stop = stop.clone();
        std::thread::Builder::new()
            .name("weft-cluster".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = rt_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let _ = rt_tx.send(Ok(rt.handle().clone()));
                rt.block_on(thread_stop.cancelled());
            })
            .map_err(|e| ClusterError::Setup(format!("cannot start the cluster thread: {e}")))?;
        let rt = rt_rx
            .recv()
            .map_err(|e| ClusterError::Setup(e.to_string()))?
            .map_err(ClusterError::Setup)?;
        let (ready_tx, ready) = watch::channel(None);
        let fence = Fence::new(settings.lease_ttl);
        let inner = Arc::new(Inner {
            settings,
            fence,
            rt,
            health: Mutex::new(Health {
                ok: false,
                reason: Some("connecting to NATS".into()),
                since_ms: clawft_channel_core::now_ms(),
            }),
            ready,
            stop,
        });
        let c = Cluster { inner };
        let run = c.clone();
        c.inner.rt.spawn(async move { run.run(me, ready_tx).await });
        Ok(c)
    }

    /// The settings.
    pub fn settings(&self) -> &ClusterSettings {
        &self.inner.settings
    }

    /// The lease timing rules.
    pub fn fence(&self) -> Fence {
        self.inner.fence
    }

    /// The health now.
    pub fn health(&self) -> Health {
        self.inner.health.locked().clone()
    }

    fn set_health(&self, reason: Option<String>) {
        let mut h = self.inner.health.locked();
        if h.reason != reason {
            match &reason {
                None => tracing::info!("cluster: NATS and JetStream answer"),
                Some(r) => tracing::warn!(reason = %r, "cluster: not healthy"),
            }
            *h = Health {
                ok: reason.is_none(),
                reason,
                since_ms: clawft_channel_core::now_ms(),
            };
        }
    }

    async fn run(self, me: NodeSelf, ready_tx: watch::Sender<Option<Ready>>) {
        let s = &self.inner.settings;
        let client = loop {
            match connect(s, Duration::from_secs(5), true).await {
                Ok(c) => break c,
                Err(e) => {
                    self.set_health(Some(e.to_string()));
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_secs(5)) => {}
                        () = self.inner.stop.cancelled() => return,
                    }
                }
            }
        };
        let js = jetstream::new(client.clone());
        let every = self.inner.fence.renew_every();
        let (leases, nodes, state) = loop {
            let made = async {
                let b = buckets(&js, s.lease_ttl).await?;
                super::streams::ensure_inbound(&js).await?;
                super::streams::ensure_session_log(&js).await?;
                Ok::<_, ClusterError>(b)
            };
            match made.await {
                Ok(b) => break b,
                Err(e) => {
                    self.set_health(Some(unreachable(&client, &e.to_string())));
                    tokio::select! {
                        () = tokio::time::sleep(every) => {}
                        () = self.inner.stop.cancelled() => return,
                    }
                }
            }
        };
        let _ = ready_tx.send(Some(Ready {
            leases: Leases::new(leases, self.inner.fence, s.node_id.clone()),
            state,
            js: js.clone(),
        }));
        let started_ms = clawft_channel_core::now_ms();
        let key = key_part(&s.node_id);
        let grace = s.lease_ttl.saturating_sub(self.inner.fence.margin());
        let mut last_ok = Instant::now();
        loop {
            let info = NodeInfo {
                node: s.node_id.clone(),
                address: me.address.clone(),
                started_ms,
                version: env!("CARGO_PKG_VERSION").to_string(),
                seen_ms: clawft_channel_core::now_ms(),
            };
            let body = serde_json::to_vec(&info).unwrap_or_default();
            let put = tokio::time::timeout(
                every.max(Duration::from_secs(1)),
                nodes.put(&key, body.into()),
            )
            .await;
            let failure = match put {
                Ok(Ok(_)) => None,
                Ok(Err(e)) => Some(unreachable(&client, &e.to_string())),
                Err(_) => Some(unreachable(&client, "JetStream did not answer")),
            };
            match failure {
                None => {
                    last_ok = Instant::now();
                    self.set_health(None);
                }
                // A failure shorter than a lease's life (a server lost, the client moving to
                // another) is not an outage: leases survive it too.
                Some(why) if last_ok.elapsed() >= grace => self.set_health(Some(why)),
                Some(why) => tracing::debug!(why, "cluster: heartbeat failed; retrying"),
            }
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = self.inner.stop.cancelled() => break,
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), nodes.delete(&key)).await;
    }

    async fn ready(&self) -> Option<Ready> {
        let mut rx = self.inner.ready.clone();
        let r = rx.wait_for(Option::is_some).await.ok()?.clone();
        r
    }

    /// Hold lease `key` for as long as this node can: take it when free, renew it, let it go
    /// when it cannot be renewed in time. The handle's watch says when this node may act
    /// under it; [`LeaseHold::release`] gives it up.
    pub fn hold(&self, key: &str) -> LeaseHold {
        let (tx, rx) = watch::channel(None);
        let stop = CancellationToken::new();
        let c = self.clone();
        let k = key.to_string();
        let s = stop.clone();
        let task = self
            .inner
            .rt
            .spawn(async move { c.hold_loop(k, tx, s).await });
        LeaseHold {
            key: key.to_string(),
            rx,
            stop,
            task: Some(task),
        }
    }

    async fn hold_loop(
        self,
        key: String,
        tx: watch::Sender<Option<Holding>>,
        stop: CancellationToken,
    ) {
        let ready = tokio::select! {
            r = self.ready() => r,
            () = stop.cancelled() => None,
            () = self.inner.stop.cancelled() => None,
        };
        let Some(ready) = ready else { return };
        let leases = ready.leases;
        let fence = self.inner.fence;
        let every = fence.renew_every();
        let mut held: Option<Held> = None;
        loop {
            match &mut held {
                None => {
                    let r = tokio::time::timeout(every, leases.acquire(&key)).await;
                    if let Ok(Ok(Some(h))) = r {
                        tracing::info!(lease = %key, token = h.token, "cluster: lease acquired");
                        let _ = tx.send(Some(Holding {
                            token: h.token,
                            until: fence.owned_until(h.sent),
                        }));
                        held = Some(h);
                        continue;
                    }
                    if let Ok(Err(e)) = r {
                        tracing::debug!(lease = %key, error = %e, "cluster: cannot take the lease");
                    }
                    tokio::select! {
                        () = tokio::time::sleep(every) => {}
                        () = stop.cancelled() => return,
                        () = self.inner.stop.cancelled() => return,
                    }
                }
                Some(h) => {
                    let until = tokio::time::Instant::from_std(fence.owned_until(h.sent));
                    tokio::select! {
                        () = tokio::time::sleep(every) => {}
                        () = tokio::time::sleep_until(until) => {}
                        () = stop.cancelled() => {
                            let _ = tokio::time::timeout(Duration::from_secs(1), leases.release(h)).await;
                            let _ = tx.send(None);
                            tracing::info!(lease = %key, "cluster: lease released");
                            return;
                        }
                        () = self.inner.stop.cancelled() => {
                            let _ = tx.send(None);
                            return;
                        }
                    }
                    let r = tokio::time::timeout_at(until, leases.renew(h)).await;
                    match r {
                        Ok(Ok(())) => {
                            let _ = tx.send(Some(Holding {
                                token: h.token,
                                until: fence.owned_until(h.sent),
                            }));
                        }
                        Ok(Err(LeaseError::Nats(e)))
                            if Instant::now() < fence.owned_until(h.sent) =>
                        {
                            // Not lost yet: the next attempt may still come in time.
                            tracing::warn!(lease = %key, error = %e, "cluster: lease renewal failed");
                        }
                        other => {
                            let why = match other {
                                Ok(Err(e)) => e.to_string(),
                                _ => "not renewed in time".into(),
                            };
                            tracing::warn!(lease = %key, why, "cluster: lease lost: stopping what it guards");
                            let _ = tx.send(None);
                            held = None;
                        }
                    }
                }
            }
        }
    }

    /// Run `fut` on the cluster's runtime and wait for it from synchronous code (never from
    /// the cluster's own thread); `None` after `timeout`.
    pub fn block_on<F>(&self, fut: F, timeout: Duration) -> Option<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.inner.rt.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv_timeout(timeout).ok()
    }

    /// Run `fut` on the cluster's runtime in the background.
    pub fn spawn<F>(&self, fut: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.inner.rt.spawn(fut);
    }

    /// Run `fut` on the cluster's runtime and await it from anywhere (another runtime, or a
    /// plain thread through [`crate::store::shared::wait`]); `None` when the cluster stopped
    /// first.
    pub async fn run_here<F>(&self, fut: F) -> Option<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.inner.rt.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.await.ok()
    }

    /// The channel state bucket, once NATS answered.
    pub fn state_bucket(&self) -> Option<kv::Store> {
        self.inner.ready.borrow().as_ref().map(|r| r.state.clone())
    }

    /// The JetStream context as soon as NATS answers (`None`: the cluster stopped first).
    pub async fn jetstream_ready(&self) -> Option<jetstream::Context> {
        self.ready().await.map(|r| r.js)
    }

    /// The JetStream context, once NATS answered.
    pub fn jetstream(&self) -> Option<jetstream::Context> {
        self.inner.ready.borrow().as_ref().map(|r| r.js.clone())
    }

    /// The JetStream context when the cluster is healthy now, else why not (for the callers
    /// that would rather fail at once than wait on NATS).
    ///
    /// # Errors
    /// The cluster is not reachable, or NATS has not answered yet.
    pub fn healthy_jetstream(&self) -> Result<jetstream::Context, SharedError> {
        let health = self.health();
        if !health.ok {
            return Err(SharedError::unavailable(format!(
                "the cluster is not reachable: {}",
                health.reason.unwrap_or_default()
            )));
        }
        self.jetstream()
            .ok_or_else(|| SharedError::unavailable("the cluster is not connected yet"))
    }

    /// The lease store, once NATS answered.
    pub fn leases(&self) -> Option<Leases> {
        self.inner.ready.borrow().as_ref().map(|r| r.leases.clone())
    }

    /// Leave: stop the heartbeat and every lease loop (leases held are released by their
    /// holders' [`LeaseHold::release`] first).
    pub fn shutdown(&self) {
        self.inner.stop.cancel();
    }
}

fn unreachable(client: &async_nats::Client, e: &str) -> String {
    match client.connection_state() {
        async_nats::connection::State::Connected => format!("JetStream: {e}"),
        _ => "NATS unreachable: no server of cluster.nats_url answers".into(),
    }
}

/// A lease held in the background ([`Cluster::hold`]).
pub struct LeaseHold {
    key: String,
    rx: watch::Receiver<Option<Holding>>,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl LeaseHold {
    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The holding now (`None`: not this node's, or no longer valid).
    pub fn current(&self) -> Option<Holding> {
        (*self.rx.borrow()).filter(Holding::valid)
    }

    /// A receiver of the changes.
    pub fn watch(&self) -> watch::Receiver<Option<Holding>> {
        self.rx.clone()
    }

    /// Give the lease up (released in NATS when held) and wait for that, at most 2 s.
    pub async fn release(mut self) {
        self.stop.cancel();
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
        }
    }
}

impl Drop for LeaseHold {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
