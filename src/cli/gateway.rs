//! `weft gateway`: run the daemon until SIGINT/SIGTERM, then shut down in order. Under
//! systemd (`Type=notify`) it reports `READY=1` and a `STATUS=` line once the channels are up,
//! pings `WATCHDOG=1` only while the bus answers, and sends `STOPPING=1` before draining.
//!
//! Each start makes a new control token: the HTTP API accepts it on every route, it joins the
//! secrets the scrubber knows, and `control.json` in the store hands it to the local CLI
//! (removed again at a clean shutdown).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use clawft_channel_core::Channel;
use clawft_channel_http::{HttpChannel, HttpConfig};

use super::{control, CliError};
use crate::admin::AdminApi;
use crate::bus::{BusMsg, BusRef};
use crate::config::Config;
use crate::daemon::{build_model, Daemon};
use crate::notify::Notifier;
use crate::store::{Store, StoreError};
use crate::types::Secret;

/// Exit code of a start refused because of the store (`EX_CONFIG`): [`CliError::StoreRefused`].
pub const STORE_REFUSED_EXIT: u8 = 78;

/// A started gateway: the daemon plus the address its HTTP API listens on.
pub struct Gateway {
    /// The daemon.
    pub daemon: Daemon,
    /// Bound address of the HTTP API, when enabled.
    pub http_addr: Option<std::net::SocketAddr>,
    /// Bound address of its TLS listener (`channels.http.tls_bind`), when it has one.
    pub http_tls_addr: Option<std::net::SocketAddr>,
    /// This run's control token (when the HTTP API is enabled) and the store holding its
    /// `control.json`.
    control: Option<(Secret, std::path::PathBuf)>,
    /// Reloads asked by the `gateway` tool; [`run`] applies them as SIGHUP.
    reloads: Option<tokio::sync::mpsc::Receiver<crate::admin::ops::ReloadRequest>>,
    /// The connected nodes (with the HTTP API).
    nodes: Option<Arc<crate::admin::nodes::NodeHub>>,
    /// The admin API (told the configuration in force after each reload).
    admin: AdminApi,
    /// The sender of [`Gateway::reloads`]: [`run`] hands it to the admin API (`config/reload`).
    reload_tx: tokio::sync::mpsc::Sender<crate::admin::ops::ReloadRequest>,
    /// This node in the cluster (cluster mode).
    cluster: Option<crate::cluster::Cluster>,
}

/// Make what the gateway keeps private before it opens any of it: the umask for what it will
/// create, and the modes of what an earlier start (or a quick start under `umask 022`) left
/// readable by other local users: `~/.clawft`, the store and the workspace when they live
/// elsewhere. Says once what it tightened.
fn make_private(config: &Config) {
    crate::types::private::restrict_umask();
    let mut roots = vec![config.home.clone()];
    for extra in [&config.store.path, &config.agent.workspace] {
        if !extra.starts_with(&config.home) {
            roots.push(extra.clone());
        }
    }
    let changed: Vec<std::path::PathBuf> = roots
        .iter()
        .flat_map(|r| crate::types::private::tighten(r))
        .collect();
    if let Some(first) = changed.first() {
        let shown: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
        tracing::warn!(
            under = %shown.join(", "),
            changed = changed.len(),
            first = %first.display(),
            "files other local users could read were made private (directories 0700, files 0600)"
        );
    }
}

impl Gateway {
    /// Open the store, bind the HTTP API and start the daemon.
    ///
    /// # Errors
    /// Startup failures (store locked, bind refused, workspace), with what to fix.
    pub async fn start(config: Arc<Config>) -> Result<Self, CliError> {
        crate::tools::exec::prewarm();
        make_private(&config);
        let store = Store::open_with(
            &config.store.path,
            config.store.cache_bytes,
            config.store.on_corruption,
        )
        .map_err(store_refusal)?;
        let model = build_model(&config).map_err(CliError::msg)?;
        let token = if config.http.enabled {
            let t = control::new_token()
                .map_err(|e| CliError::Failed(format!("cannot generate the control token: {e}")))?;
            Some(Secret::new(t))
        } else {
            None
        };
        // The token is a secret of this run: scrubbed from tool output and kept out of the
        // environment of commands, like the configured ones.
        let config = match &token {
            Some(t) => {
                let mut c = (*config).clone();
                c.secrets.push(t.clone());
                Arc::new(c)
            }
            None => config,
        };
        let admin = AdminApi::new(config.clone());
        if let Some(h) = model.health() {
            admin.set_provider_health(h);
        }
        let mut channels: Vec<Arc<dyn Channel>> = Vec::new();
        let mut http_addr = None;
        let mut http_tls_addr = None;
        let mut nodes = None;
        if config.http.enabled {
            let http = HttpChannel::bind_with_mail(
                HttpConfig {
                    bind: config.http.bind,
                    token: config.http.token.as_ref().map(|t| t.expose().to_string()),
                    control_token: token.as_ref().map(|t| t.expose().to_string()),
                    allow_loopback_without_token: config.http.allow_loopback_without_token,
                    reply_timeout: config.http.reply_timeout,
                    channel_id: "http".into(),
                    max_inbound_bytes: config.max_inbound_bytes,
                    agents: config
                        .agent_names()
                        .into_iter()
                        .map(str::to_string)
                        .collect(),
                    ui_hosts: config.http.ui_hosts.clone(),
                    tls: config.http.tls.as_ref().map(|(bind, cert, key)| {
                        clawft_channel_http::TlsListen {
                            bind: *bind,
                            cert: cert.clone(),
                            key: key.clone(),
                        }
                    }),
                },
                Arc::new(admin.clone()),
                Arc::new(crate::daemon::channels::StoreMail::new(store.clone())),
            )
            .await
            .map_err(|e| CliError::Failed(format!("channels.http: {e}")))?;
            #[cfg(feature = "ui")]
            http.keep_ui_sessions(Arc::new(crate::daemon::channels::StoreState::new(
                store.clone(),
                "ui",
            )));
            http_addr = Some(http.local_addr());
            http_tls_addr = http.tls_addr();
            let hub = crate::admin::nodes::NodeHub::new(store.clone());
            http.add_routes(hub.routes());
            // WhatsApp's webhooks (signed; the channels they are for register themselves).
            #[cfg(feature = "whatsapp")]
            http.add_routes(clawft_channel_whatsapp::routes());
            admin.set_nodes(hub.clone());
            nodes = Some(hub);
            // The control UI's web chat, served on the same listener: a channel of its own.
            // Its pages see each canvas change at once (SSE).
            #[cfg(feature = "ui")]
            {
                tokio::spawn(crate::daemon::channels::canvas_to_web(
                    store.changes(),
                    http.web(),
                ));
                channels.push(http.web());
            }
            channels.push(http);
        }
        let cluster = join_cluster(&config, http_addr)?;
        if let Some(c) = &cluster {
            admin.set_cluster(c.clone());
        }
        channels.extend(crate::daemon::channels::chat_channels(
            &config,
            &store,
            cluster.as_ref(),
        ));
        let daemon = Daemon::start_in(&config, store, model, channels, cluster.clone())
            .await
            .map_err(CliError::msg)?;
        admin.attach(
            daemon.bus().clone(),
            daemon.store().clone(),
            daemon.outbox().clone(),
            daemon.mcp_slot(),
            daemon.scheduler().clone(),
            daemon.approvals().clone(),
        );
        let (agents, memory) = daemon.agent_parts();
        admin.set_inspect(crate::admin::inspect::Inspect {
            agents: agents
                .into_iter()
                .map(
                    |(name, tools, workspace)| crate::admin::inspect::AgentParts {
                        name,
                        tools: Arc::downgrade(&tools),
                        workspace,
                    },
                )
                .collect(),
            memory: Arc::downgrade(&memory),
        });
        if let Some(hub) = &nodes {
            let _ = daemon
                .nodes_slot()
                .set(hub.clone() as Arc<dyn crate::tools::nodes::NodeControl>);
        }
        // The `gateway` tool's controls: the status through the admin API, reloads through
        // the main loop of `run` (the SIGHUP path).
        let (reload_tx, reloads) = tokio::sync::mpsc::channel(4);
        let _ = daemon
            .gateway_slot()
            .set(Arc::new(crate::admin::ops::GatewayOps::new(
                admin.clone(),
                reload_tx.clone(),
            )));
        let control = match (token, http_addr) {
            (Some(token), Some(addr)) => {
                let store = config.store.path.clone();
                let info = control::ControlInfo {
                    addr: control::reachable(addr),
                    pid: std::process::id(),
                    token: token.expose().to_string(),
                    store: std::fs::canonicalize(&store).unwrap_or_else(|_| store.clone()),
                };
                if let Err(e) = control::write(&store, &info) {
                    daemon.shutdown().await;
                    return Err(CliError::Failed(format!(
                        "cannot write {} ({e}): the weft commands could not reach this gateway; check the permissions of store.path",
                        control::path(&store).display()
                    )));
                }
                Some((token, store))
            }
            _ => None,
        };
        match http_addr {
            Some(a) => match http_tls_addr {
                Some(tls) => tracing::info!(http = %a, https = %tls, "weft gateway ready"),
                None => tracing::info!(http = %a, "weft gateway ready"),
            },
            None => tracing::info!("weft gateway ready (HTTP API disabled)"),
        }
        Ok(Self {
            daemon,
            http_addr,
            http_tls_addr,
            control,
            reloads: Some(reloads),
            nodes,
            admin,
            reload_tx,
            cluster,
        })
    }

    /// This run's control token: what `control.json` holds (`None` without the HTTP API).
    pub fn control_token(&self) -> Option<&str> {
        self.control.as_ref().map(|(t, _)| t.expose())
    }

    /// Shut down in order. The control file goes first, while this process still holds the
    /// store, so it can never remove the file of a gateway started after it.
    pub async fn shutdown(self) {
        if let Some((token, store)) = &self.control {
            control::remove(store, token.expose());
        }
        if let Some(hub) = &self.nodes {
            hub.close();
        }
        self.daemon.shutdown().await;
        #[cfg(feature = "cluster")]
        if let Some(c) = &self.cluster {
            c.shutdown();
        }
        #[cfg(not(feature = "cluster"))]
        let _ = &self.cluster;
    }
}

/// Join the cluster of `[cluster]` (cluster mode), `None` in single-node mode.
///
/// # Errors
/// `[cluster]` is set in a build without the `cluster` feature, or the cluster thread could
/// not start.
fn join_cluster(
    config: &Config,
    http_addr: Option<std::net::SocketAddr>,
) -> Result<Option<crate::cluster::Cluster>, CliError> {
    let Some(s) = &config.cluster else {
        return Ok(None);
    };
    #[cfg(feature = "cluster")]
    {
        tracing::info!(node = %s.node_id, servers = s.nats_urls.len(), "cluster mode: joining the NATS cluster");
        crate::cluster::Cluster::start(
            s.clone(),
            crate::cluster::node::NodeSelf {
                address: http_addr.map(|a| a.to_string()),
            },
        )
        .map(Some)
        .map_err(|e| CliError::Failed(e.to_string()))
    }
    #[cfg(not(feature = "cluster"))]
    {
        let _ = (s, http_addr);
        Err(CliError::Failed(
            "[cluster] is set, but this build of weft has no cluster support (build it with `cargo build --release --features cluster`)".into(),
        ))
    }
}

/// Run the gateway until `shutdown` resolves, keeping the service manager informed.
///
/// # Errors
/// Startup failures, as [`Gateway::start`].
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), CliError> {
    let notifier = Notifier::new(config.notify_socket.clone(), config.watchdog);
    let path = config.path.clone();
    let mut gateway = Gateway::start(Arc::new(config)).await?;
    notifier.ready();
    notifier.status(&summary(&gateway).await);
    let watchdog = notifier.watchdog_interval().map(|every| {
        let bus = gateway.daemon.bus().clone();
        let n = notifier.clone();
        tokio::spawn(watchdog_loop(n, every, move || {
            bus_alive(bus.clone(), every)
        }))
    });
    let mut hup = hangups();
    let mut hup_open = true;
    let mut asked = gateway
        .reloads
        .take()
        .unwrap_or_else(|| tokio::sync::mpsc::channel(1).1);
    // The admin API's `config/reload` (the control UI's Reload button) takes the same path.
    gateway.admin.set_reloads(gateway.reload_tx.clone());
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            got = hup.recv(), if hup_open => {
                match got {
                    // No SIGHUP stream on this platform: only reloads the `gateway` tool asks.
                    None => hup_open = false,
                    Some(()) => {
                        tracing::info!("SIGHUP received: reloading the configuration");
                        let _ = reload(&mut gateway, path.as_deref(), &notifier).await;
                    }
                }
            }
            Some(answer) = asked.recv() => {
                tracing::info!("the gateway tool asked for a reload of the configuration");
                let result = reload(&mut gateway, path.as_deref(), &notifier).await;
                let _ = answer.send(result);
            }
        }
    }
    notifier.stopping();
    notifier.status("stopping: draining sessions and outboxes");
    gateway.shutdown().await;
    if let Some(w) = watchdog {
        w.abort();
    }
    Ok(())
}

/// SIGHUP as a stream of `()`; closed where it cannot be installed.
fn hangups() -> tokio::sync::mpsc::Receiver<()> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut s) = signal(SignalKind::hangup()) {
            tokio::spawn(async move {
                while s.recv().await.is_some() {
                    if tx.send(()).await.is_err() {
                        return;
                    }
                }
            });
        }
    }
    #[cfg(not(unix))]
    drop(tx);
    rx
}

/// Reload the configuration file (SIGHUP, or the `gateway` tool): a config that does not load
/// is rejected with the reason and the running one stays in force; otherwise what changed is
/// applied and logged. Returns the changes, or why the new config was rejected.
async fn reload(
    gateway: &mut Gateway,
    path: Option<&std::path::Path>,
    notifier: &Notifier,
) -> Result<Vec<String>, String> {
    match Config::load(path, &crate::config::Env::from_process()) {
        Err(e) => {
            tracing::error!(error = %e, "new configuration rejected; the running one stays in force");
            notifier.status(&format!("config reload rejected: {e}"));
            Err(e.to_string())
        }
        Ok(mut new) => {
            // The control token stays a secret of the reloaded tools.
            new.secrets
                .extend(gateway.control.as_ref().map(|(t, _)| t.clone()));
            let provenance = new.provenance.clone();
            let changes = gateway.daemon.reload(new).await;
            // `config/show` shows what is in force now, with where the new file set it.
            let mut in_force = gateway.daemon.config().clone();
            in_force.provenance = provenance;
            gateway.admin.set_in_force(in_force);
            for c in &changes {
                tracing::info!(change = %c, "configuration reloaded");
            }
            notifier.status(&summary(gateway).await);
            Ok(changes)
        }
    }
}

/// The one-line `STATUS=` summary: channels, live sessions, MCP servers, HTTP API.
pub async fn summary(gateway: &Gateway) -> String {
    let d = &gateway.daemon;
    let channels = d.channel_table().names();
    let mut line = if channels.is_empty() {
        "ready: no channels".to_string()
    } else {
        format!("ready: channels {}", channels.join(","))
    };
    line.push_str(&format!(
        "; {} live sessions",
        d.live_sessions().await.len()
    ));
    if let Some(m) = d.mcp() {
        let st = m.status();
        let up = st
            .iter()
            .filter(|s| s.state == crate::mcp::client::McpState::Connected)
            .count();
        line.push_str(&format!("; MCP {up}/{} connected", st.len()));
    }
    if let Some(a) = gateway.http_addr {
        line.push_str(&format!("; API {a}"));
    }
    line
}

/// Whether the bus answers a `Sessions` call within `timeout` (clamped to 100 ms..5 s).
async fn bus_alive(bus: BusRef, timeout: Duration) -> bool {
    let ms = u64::try_from(timeout.as_millis())
        .unwrap_or(u64::MAX)
        .clamp(100, 5_000);
    ractor::call_t!(bus, |reply| BusMsg::Sessions { reply }, ms).is_ok()
}

/// Every `every`, ask `probe` whether the daemon is alive and only then send `WATCHDOG=1`:
/// a wedged bus stops the pings, so systemd restarts the service (`WatchdogSec=`).
pub async fn watchdog_loop<F, Fut>(notifier: Notifier, every: Duration, probe: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut wedged = false;
    loop {
        tick.tick().await;
        if probe().await {
            if wedged {
                tracing::info!("bus answers again; watchdog pings resume");
                wedged = false;
            }
            notifier.watchdog();
        } else if !wedged {
            tracing::error!("bus not answering; withholding watchdog pings");
            wedged = true;
        }
    }
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is called, not when the
/// future is first polled: `weft gateway` calls it before starting, so a SIGTERM during the
/// start (systemd stopping a unit that is still starting) is a clean shutdown once started,
/// never the default action that kills the process mid-write.
pub fn signals() -> impl Future<Output = ()> {
    #[cfg(unix)]
    let streams = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        )
    };
    async move {
        #[cfg(unix)]
        match streams {
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
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Why the gateway could not open its store, as the CLI reports it: a damaged store (under
/// `store.on_corruption = "fail"`) or a newer one is [`CliError::StoreRefused`], so the
/// service manager does not restart into the same refusal; anything else is a plain failure.
fn store_refusal(e: StoreError) -> CliError {
    match e {
        StoreError::Locked(p) => CliError::Failed(format!(
            "another weft process holds the store at {p}: is a gateway already running? (`weft status` tells)"
        )),
        e @ StoreError::Damaged { .. } => CliError::StoreRefused(format!(
            "{e}. store.on_corruption = \"fail\": refusing to start. Inspect it with `weft store check`, restore a backup with `weft store restore PATH`, or set store.on_corruption = \"quarantine\" to move it aside and start fresh"
        )),
        e @ StoreError::Newer { .. } => CliError::StoreRefused(e.to_string()),
        e => CliError::msg(e),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::os::unix::net::UnixDatagram;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    fn drain(sock: &UnixDatagram) -> Vec<String> {
        let mut out = Vec::new();
        let mut buf = [0u8; 128];
        while let Ok(n) = sock.recv(&mut buf) {
            out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        out
    }

    /// The exit code follows the variant: a refused store ends with `EX_CONFIG` (78, which the
    /// systemd units do not restart on), a store held by another process with 1.
    #[test]
    fn store_refusals_choose_the_exit_code() {
        let path = "/tmp/store".to_string();
        let cases = [
            (StoreError::Locked(path.clone()), 1, "another weft process"),
            (
                StoreError::Damaged {
                    path: path.clone(),
                    detail: "sled cannot read it".into(),
                },
                STORE_REFUSED_EXIT,
                "weft store check",
            ),
            (
                StoreError::Newer { path, schema: 99 },
                STORE_REFUSED_EXIT,
                "newer weft",
            ),
            (StoreError::Backend("boom".into()), 1, "boom"),
        ];
        for (e, code, text) in cases {
            let kind = e.kind();
            let err = store_refusal(e);
            assert_eq!(err.code(), code, "{kind}: {err}");
            assert!(err.to_string().contains(text), "{kind}: {err}");
            assert!(!err.to_string().contains("[store"), "{kind}: {err}");
        }
        assert_eq!(STORE_REFUSED_EXIT, 78);
        assert_eq!(CliError::msg("x").code(), 1);
    }

    #[tokio::test]
    async fn watchdog_pings_only_while_the_probe_answers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_nonblocking(true).unwrap();
        let alive = Arc::new(AtomicBool::new(true));
        let a = alive.clone();
        let every = Duration::from_millis(20);
        let task = tokio::spawn(watchdog_loop(
            Notifier::new(Some(path), Some(every)),
            every,
            move || {
                let a = a.clone();
                async move { a.load(Ordering::SeqCst) }
            },
        ));
        tokio::time::sleep(Duration::from_millis(150)).await;
        let healthy = drain(&sock);
        assert!(healthy.len() >= 3, "{healthy:?}");
        assert!(healthy.iter().all(|m| m == "WATCHDOG=1"));
        alive.store(false, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(40)).await;
        drain(&sock);
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(drain(&sock), Vec::<String>::new(), "pinged while wedged");
        task.abort();
    }
}
