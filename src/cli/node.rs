//! `weft node` (this machine as a node host of a gateway elsewhere) and `weft nodes
//! list|approve|deny|revoke` (the gateway's operator pairing nodes).
//!
//! The host connects out to the gateway's `/v1/nodes/connect` WebSocket, proves its Ed25519
//! key (made at first start, kept 0600 in its state directory), then answers the gateway's
//! calls with its own tools: `read_file`, `write_file`, `list_directory` in its workspace
//! (contained like every file tool) and `exec_shell` there (the same sandbox and jail as on a
//! gateway), under its own configuration's limits. What it offers is its choice; a call for
//! anything else is refused. When the connection drops, its running commands are cancelled
//! (their process groups killed).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use futures::{SinkExt as _, StreamExt as _};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use super::agent::{backend, Backend};
use super::CliError;
use crate::admin::nodes::{signed_text, Frame, NodeHub, CONNECT_PATH, MAX_FRAME_BYTES};
use crate::config::Config;
use crate::tools::{ToolContext, Workspace};
use crate::types::MutexExt;

/// What a node offers unless told otherwise (and `notify` where `notify-send` is installed).
pub const DEFAULT_OFFERS: &[&str] = &["info", "read", "write", "list", "run"];
/// Everything a node can offer.
const KNOWN_OFFERS: &[&str] = &["info", "read", "write", "list", "run", "notify"];
/// The desktop notifier a node runs for `notify` (libnotify's command line tool).
const NOTIFIER: &str = "notify-send";
/// Longest title and text of a notification, in characters.
const NOTIFY_TITLE_MAX: usize = 100;
const NOTIFY_TEXT_MAX: usize = 1000;
/// Time the notifier may take.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(10);

/// `notify-send` on this machine's `PATH`, if installed.
fn find_notifier() -> Option<PathBuf> {
    crate::config::env::Env::from_process()
        .get("PATH")
        .and_then(|path| {
            std::env::split_paths(path)
                .map(|d| d.join(NOTIFIER))
                .find(|p| p.is_file())
        })
}

/// Show a desktop notification with `notifier` (argv only, no shell; bounded text).
async fn notify(notifier: &Path, args: &Value) -> Result<String, String> {
    let clip = |s: &str, n: usize| {
        s.chars()
            .filter(|c| !c.is_control() || *c == '\n')
            .take(n)
            .collect::<String>()
    };
    let text = args["message"]
        .as_str()
        .map(|s| clip(s, NOTIFY_TEXT_MAX))
        .unwrap_or_default();
    if text.trim().is_empty() {
        return Err("`message` is required for `notify`".into());
    }
    let title = args["title"]
        .as_str()
        .map(|s| clip(s, NOTIFY_TITLE_MAX))
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "weft".into());
    let urgency = match args["urgency"].as_str() {
        None | Some("") => "normal",
        Some(u @ ("low" | "normal" | "critical")) => u,
        Some(other) => {
            return Err(format!(
                "`urgency` `{}`: one of low, normal, critical",
                clip(other, 20)
            ))
        }
    };
    let mut cmd = tokio::process::Command::new(notifier);
    // Options first, then `--`: a title or text starting with `-` is never read as an option.
    cmd.args(["--app-name=weft", &format!("--urgency={urgency}"), "--"])
        .arg(&title)
        .arg(&text)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(NOTIFY_TIMEOUT, cmd.output())
        .await
        .map_err(|_| {
            format!(
                "{NOTIFIER} did not finish within {} s",
                NOTIFY_TIMEOUT.as_secs()
            )
        })?
        .map_err(|e| format!("cannot run {}: {e}", notifier.display()))?;
    if out.status.success() {
        Ok(format!("notification shown: {title}"))
    } else {
        Err(format!(
            "{NOTIFIER} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
/// Longest wait between two connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Wait between attempts while the key awaits approval.
const PENDING_RETRY: Duration = Duration::from_secs(2);

/// `weft nodes` actions.
#[derive(Debug, clap::Subcommand)]
pub enum NodesAction {
    /// Paired, pending and denied nodes, with their key fingerprints and whether they are
    /// online.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Admit a pending node (check its fingerprint first).
    Approve {
        /// Its id (or name), as `weft nodes list` shows it.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Refuse a node's key (it stays refused).
    Deny {
        /// Its id (or name).
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Forget a node's key and cut its connection at once.
    Revoke {
        /// Its id (or name).
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Run a `weft nodes` action through the running gateway (or on the store when none runs).
///
/// # Errors
/// Unknown node, no access to gateway or store.
pub async fn nodes(config: &Config, action: NodesAction) -> Result<(), CliError> {
    use crate::admin::nodes::NodeDecision;
    let (name, decision, as_json) = match action {
        NodesAction::List { json } => ("nodes/list", None, json),
        NodesAction::Approve { id, json } => {
            ("nodes/approve", Some((id, NodeDecision::Approve)), json)
        }
        NodesAction::Deny { id, json } => ("nodes/deny", Some((id, NodeDecision::Deny)), json),
        NodesAction::Revoke { id, json } => {
            ("nodes/revoke", Some((id, NodeDecision::Revoke)), json)
        }
    };
    let body = decision
        .as_ref()
        .map_or(Value::Null, |(id, _)| json!({ "id": id }));
    let v = match backend(config).await? {
        Backend::Gateway(c) => c.post(&format!("/v1/admin/{name}"), &body).await?,
        Backend::Store(s) => {
            let hub = NodeHub::new(s);
            match decision {
                Some((id, d)) => hub.decide(&id, d).map_err(CliError::msg)?,
                None => hub.list_json(),
            }
        }
    };
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(CliError::msg)?
        );
        return Ok(());
    }
    let s = |v: &Value| v.as_str().unwrap_or("-").to_string();
    if name == "nodes/list" {
        if let Some(fp) = v["gateway_fingerprint"].as_str() {
            println!("this gateway's key (nodes pin it at pairing): {fp}");
        }
        let rows = v["nodes"].as_array().cloned().unwrap_or_default();
        if rows.is_empty() {
            println!("no nodes: run `weft node --gateway URL` on another machine");
            return Ok(());
        }
        println!(
            "{:<17} {:<20} {:<9} {:<7} {:<30} FINGERPRINT",
            "ID", "NAME", "STATE", "ONLINE", "OFFERS"
        );
        for r in &rows {
            let offers: Vec<String> = r["offers"]
                .as_array()
                .map(|a| a.iter().map(s).collect())
                .unwrap_or_default();
            println!(
                "{:<17} {:<20} {:<9} {:<7} {:<30} {}",
                s(&r["id"]),
                s(&r["name"]),
                s(&r["state"]),
                if r["online"] == Value::Bool(true) {
                    "yes"
                } else {
                    "no"
                },
                offers.join(","),
                s(&r["fingerprint"]),
            );
        }
    } else {
        println!(
            "node {} ({}, {}): {}",
            s(&v["id"]),
            s(&v["name"]),
            s(&v["fingerprint"]),
            s(&v["state"])
        );
    }
    Ok(())
}

/// The settings of `weft node`.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// `ws://127.0.0.1:8080` or `wss://gateway.example.com` (the path is added); default:
    /// `node.gateway`.
    pub gateway: Option<String>,
    /// This node's name (default: the host name).
    pub name: Option<String>,
    /// The workspace (default: the configuration's `agent.workspace`).
    pub workspace: Option<PathBuf>,
    /// What it offers (default: [`DEFAULT_OFFERS`]).
    pub offers: Vec<String>,
    /// Where the key lives (default: `<home>/node`).
    pub state_dir: Option<PathBuf>,
    /// The gateway's key fingerprint (`SHA256:...`, from `weft nodes list` on the gateway),
    /// pinned before the first connection; default: `node.gateway_key`, else the key of the
    /// gateway that approves this node.
    pub gateway_key: Option<String>,
    /// A PEM file of the certificate authority (or self-signed certificate) to trust for a
    /// `wss://` gateway instead of the public web roots; default: `node.gateway_ca`.
    pub gateway_ca: Option<PathBuf>,
}

/// The WebSocket URL of `gateway`, refused when it would send the handshake in clear over a
/// network.
///
/// # Errors
/// Not a `ws://`/`wss://`/`http://`/`https://` URL, or a clear-text one to a non-loopback host.
pub fn connect_url(gateway: &str) -> Result<String, CliError> {
    let mut u = url::Url::parse(gateway)
        .map_err(|e| CliError::Failed(format!("--gateway {gateway}: not a URL ({e})")))?;
    let scheme = match u.scheme() {
        "ws" | "http" => "ws",
        "wss" | "https" => "wss",
        other => {
            return Err(CliError::Failed(format!(
                "--gateway {gateway}: scheme `{other}` is not supported; use wss://HOST (or ws://127.0.0.1:PORT on this machine)"
            )))
        }
    };
    let loopback = match u.host() {
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    };
    if scheme == "ws" && !loopback {
        return Err(CliError::Failed(format!(
            "--gateway {gateway}: refusing an unencrypted connection to a host other than this machine; put the gateway behind TLS and use wss://"
        )));
    }
    u.set_scheme(scheme)
        .map_err(|()| CliError::Failed(format!("--gateway {gateway}: bad URL")))?;
    u.set_path(CONNECT_PATH);
    Ok(u.to_string())
}

/// This node's key pair, made at first start (PKCS#8, mode 0600).
///
/// # Errors
/// The state directory or key file cannot be made or read, or holds no valid key.
pub fn load_or_make_key(dir: &Path) -> Result<ring::signature::Ed25519KeyPair, CliError> {
    crate::admin::nodes::load_or_make_key(&dir.join("node.key")).map_err(CliError::Failed)
}

/// Where a node keeps the fingerprint of the gateway it paired with.
const PIN_FILE: &str = "gateway.pin";

/// The rustls settings for a gateway whose certificate is signed by the authority in `ca`.
fn tls_trusting(ca: &Path) -> Result<Arc<rustls::ClientConfig>, CliError> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::CertificateDer;
    let fail =
        |e: &dyn std::fmt::Display| CliError::Failed(format!("--gateway-ca {}: {e}", ca.display()));
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).map_err(|e| fail(&e))? {
        roots
            .add(cert.map_err(|e| fail(&e))?)
            .map_err(|e| fail(&e))?;
    }
    if roots.is_empty() {
        return Err(fail(&"no certificate in the file"));
    }
    Ok(Arc::new(
        rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    ))
}

/// The gateway key this node trusts: the one given, else the one pinned at pairing.
fn pinned_gateway(given: Option<&str>, pin: &Path) -> Option<String> {
    given.map(str::to_string).or_else(|| {
        std::fs::read_to_string(pin)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    })
}

/// Check the gateway's welcome: its signature over this connection's challenge, and its key
/// against the pinned one (pinning it at the first pairing).
fn check_gateway(
    link: &Link,
    nonce: &str,
    session: &str,
    gateway_key: &str,
    gateway_sig: &str,
) -> Result<(), Ended> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let (Ok(pk), Ok(sig)) = (b64.decode(gateway_key), b64.decode(gateway_sig)) else {
        return Err(Ended::Denied(
            "the gateway's welcome is not signed: refusing to serve it".into(),
        ));
    };
    let text = crate::admin::nodes::gateway_signed_text(nonce, session, &link.pk);
    if ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, &pk)
        .verify(text.as_bytes(), &sig)
        .is_err()
    {
        return Err(Ended::Denied(
            "the gateway's signature does not verify for this connection: refusing to serve it"
                .into(),
        ));
    }
    let (_, fp) = crate::admin::nodes::key_id(&pk);
    match pinned_gateway(link.gateway_key.as_deref(), &link.pin) {
        Some(want) if want == fp => Ok(()),
        Some(want) => Err(Ended::Denied(format!(
            "the gateway's key changed: this node trusts {want}, the gateway at {} has {fp}. \
             Refusing to serve it. If you moved or reinstalled the gateway on purpose, delete {} \
             (or pass --gateway-key {fp}) and start the node again",
            link.url,
            link.pin.display()
        ))),
        None => {
            std::fs::write(&link.pin, format!("{fp}\n")).map_err(|e| {
                Ended::Denied(format!(
                    "cannot pin the gateway's key in {}: {e}",
                    link.pin.display()
                ))
            })?;
            eprintln!(
                "weft node: pinned the gateway's key {fp} in {}",
                link.pin.display()
            );
            Ok(())
        }
    }
}

/// The reason, when `e` is the gateway's certificate failing verification.
fn untrusted_certificate(e: &tokio_tungstenite::tungstenite::Error) -> Option<String> {
    use tokio_tungstenite::tungstenite::Error;
    let rustls_error = match e {
        Error::Io(io) => io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()),
        Error::Tls(tokio_tungstenite::tungstenite::error::TlsError::Rustls(r)) => Some(&**r),
        _ => None,
    };
    match rustls_error {
        Some(r @ rustls::Error::InvalidCertificate(_)) => Some(r.to_string()),
        _ => None,
    }
}

/// How to reach and recognise the gateway.
struct Link {
    url: String,
    /// This node's public key, base64.
    pk: String,
    /// `Some` for a gateway certificate signed by the operator's own authority.
    tls: Option<Arc<rustls::ClientConfig>>,
    /// The gateway key given by the operator.
    gateway_key: Option<String>,
    /// Where the pinned gateway key lives.
    pin: PathBuf,
}

/// The node host's tools: the file tools and `exec_shell` of its own configuration, in its
/// workspace.
struct Host {
    config: Config,
    registry: crate::tools::ToolRegistry,
    workspace: Arc<Workspace>,
    offers: Vec<String>,
    name: String,
    /// `notify-send`, when this node offers `notify`.
    notifier: Option<PathBuf>,
}

impl Host {
    async fn answer(
        &self,
        op: &str,
        args: &Value,
        cancel: CancellationToken,
    ) -> Result<String, String> {
        if !self.offers.iter().any(|o| o == op) {
            return Err(format!("this node does not offer `{op}`"));
        }
        let (tool, args) = match op {
            "info" => return Ok(self.info()),
            "notify" => {
                return match &self.notifier {
                    Some(n) => notify(n, args).await,
                    None => Err(format!("{NOTIFIER} is not installed on this node")),
                }
            }
            "read" => ("read_file", json!({"path": args["path"]})),
            "write" => (
                "write_file",
                json!({"path": args["path"], "content": args["content"]}),
            ),
            "list" => ("list_directory", json!({"path": args["path"]})),
            "run" => (
                "exec_shell",
                json!({"command": args["command"], "timeout": args["timeout"]}),
            ),
            other => return Err(format!("unknown operation `{other}`")),
        };
        let ctx = ToolContext {
            workspace: self.workspace.clone(),
            session: crate::types::SessionKey::from_parts(&["node", "gateway"])
                .map_err(|e| e.to_string())?,
            cancel,
            user_dir: None,
            sender: None,
            call_id: None,
            turn: Default::default(),
        };
        let outcome = self
            .registry
            .dispatch(tool, "node", &args.to_string(), &ctx)
            .await;
        match outcome.error {
            None => Ok(outcome.content()),
            Some(_) => Err(outcome.content()),
        }
    }

    /// Whether this node shows notifications, and why not.
    fn notify_status(&self) -> String {
        if self.offers.iter().any(|o| o == "notify") {
            "offered (notify-send)".into()
        } else if self.notifier.is_none() {
            format!("not offered: no {NOTIFIER} on this node's PATH (Debian: apt install libnotify-bin)")
        } else {
            "not offered: left out of this node's --offer".into()
        }
    }

    fn info(&self) -> String {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let uptime = read("/proc/uptime")
            .split_whitespace()
            .next()
            .and_then(|s| s.parse::<f64>().ok())
            .map_or_else(|| "-".into(), |s| format!("{:.1} h", s / 3600.0));
        let load = read("/proc/loadavg")
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ");
        let disk = rustix::fs::statvfs(self.workspace.root())
            .map(|s| {
                let gib = |b: u64| b as f64 / (1024.0 * 1024.0 * 1024.0);
                format!(
                    "{:.1} GiB free of {:.1} GiB",
                    gib(s.f_bavail.saturating_mul(s.f_frsize)),
                    gib(s.f_blocks.saturating_mul(s.f_frsize))
                )
            })
            .unwrap_or_else(|_| "-".into());
        json!({
            "name": self.name,
            "os": format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
            "kernel": read("/proc/sys/kernel/osrelease").trim(),
            "load": load,
            "uptime": uptime,
            "workspace_disk": disk,
            "offers": self.offers,
            "notify": self.notify_status(),
            "sandbox": crate::tools::exec::sandbox_status(&self.config.tools.exec).summary(),
        })
        .to_string()
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "node".into())
}

/// Run `weft node` until interrupted: connect, serve, reconnect with backoff.
///
/// # Errors
/// Bad options, or the key cannot be made or read.
pub async fn run(config: &Config, opts: NodeOptions) -> Result<(), CliError> {
    let file = &config.node;
    let gateway = opts
        .gateway
        .clone()
        .or_else(|| file.gateway.clone())
        .ok_or_else(|| {
            CliError::Failed(
                "no gateway: pass --gateway wss://HOST, or set node.gateway in the configuration"
                    .into(),
            )
        })?;
    let url = connect_url(&gateway)?;
    let offers: Vec<String> = if !opts.offers.is_empty() {
        opts.offers.clone()
    } else if let Some(o) = &file.offer {
        o.clone()
    } else {
        let mut d: Vec<String> = DEFAULT_OFFERS.iter().map(|s| (*s).to_string()).collect();
        if find_notifier().is_some() {
            d.push("notify".into());
        }
        d
    };
    let opts = NodeOptions {
        name: opts.name.clone().or_else(|| file.name.clone()),
        workspace: opts
            .workspace
            .clone()
            .or_else(|| file.workspace.as_ref().map(PathBuf::from)),
        ..opts
    };
    if let Some(bad) = offers.iter().find(|o| !KNOWN_OFFERS.contains(&o.as_str())) {
        return Err(CliError::Failed(format!(
            "--offer {bad}: unknown; one of {}",
            KNOWN_OFFERS.join(", ")
        )));
    }
    let notifier = find_notifier();
    if notifier.is_none() && offers.iter().any(|o| o == "notify") {
        return Err(CliError::Failed(format!(
            "--offer notify: no {NOTIFIER} on this machine's PATH (Debian: apt install libnotify-bin)"
        )));
    }
    let name = opts.name.clone().unwrap_or_else(host_name);
    let dir = opts
        .state_dir
        .clone()
        .unwrap_or_else(|| config.home.join("node"));
    let key = load_or_make_key(&dir)?;
    crate::tools::exec::prewarm();
    let mut config = config.clone();
    if let Some(ws) = &opts.workspace {
        std::fs::create_dir_all(ws).map_err(|e| {
            CliError::Failed(format!("cannot make the workspace {}: {e}", ws.display()))
        })?;
        config.agent.workspace = std::fs::canonicalize(ws).map_err(CliError::msg)?;
    }
    let workspace = Arc::new(super::open_workspace(&config)?);
    let registry = crate::daemon::build_registry(
        &config,
        None,
        None,
        Vec::new(),
        crate::daemon::build::RegistryParts::default(),
    );
    let host = Arc::new(Host {
        config,
        registry,
        workspace,
        offers,
        name,
        notifier,
    });
    let pk = base64::engine::general_purpose::STANDARD
        .encode(ring::signature::KeyPair::public_key(&key).as_ref());
    let gateway_ca = opts
        .gateway_ca
        .clone()
        .or_else(|| file.gateway_ca.as_ref().map(PathBuf::from));
    let tls = match &gateway_ca {
        Some(ca) if url.starts_with("wss://") => Some(tls_trusting(ca)?),
        Some(_) => {
            return Err(CliError::Failed(
                "--gateway-ca is for a wss:// gateway".into(),
            ))
        }
        None => None,
    };
    let gateway_key = opts
        .gateway_key
        .clone()
        .or_else(|| file.gateway_key.clone());
    if let Some(k) = &gateway_key {
        if !k.starts_with("SHA256:") || k.len() != 50 {
            return Err(CliError::Failed(format!(
                "--gateway-key {k}: not a key fingerprint (`SHA256:` and 43 characters, as `weft nodes list` prints it on the gateway)"
            )));
        }
    }
    let link = Link {
        url: url.clone(),
        pk,
        tls,
        gateway_key,
        pin: dir.join(PIN_FILE),
    };
    let (id, fp) = crate::admin::nodes::key_id(ring::signature::KeyPair::public_key(&key).as_ref());
    eprintln!(
        "weft node `{}`: key {id} ({fp}), workspace {}, offers {}; connecting to {url}",
        host.name,
        host.workspace.root().display(),
        host.offers.join(",")
    );
    // A connection that stayed up a minute starts the backoff again.
    let mut backoff =
        clawft_channel_core::backoff::Backoff::new(Duration::from_millis(500), MAX_BACKOFF)
            .reset_after(Duration::from_secs(60));
    loop {
        let started = std::time::Instant::now();
        let wait = match session(&link, &key, &host).await {
            Ok(Ended::Pending(msg)) => {
                eprintln!("weft node: {msg}");
                backoff.next_delay();
                PENDING_RETRY
            }
            Ok(Ended::Denied(msg)) => return Err(CliError::Failed(msg)),
            Ok(Ended::Closed) => {
                eprintln!("weft node: connection closed; reconnecting");
                backoff.ended(started.elapsed());
                backoff.next_delay()
            }
            Err(e) => {
                let delay = backoff.next_delay();
                eprintln!("weft node: {e}; retrying in {} s", delay.as_secs_f32());
                delay
            }
        };
        tokio::time::sleep(wait).await;
    }
}

enum Ended {
    Pending(String),
    Denied(String),
    Closed,
}

/// One connection: handshake, then answer calls until it ends; running calls are cancelled
/// when it does.
async fn session(
    link: &Link,
    key: &ring::signature::Ed25519KeyPair,
    host: &Arc<Host>,
) -> Result<Ended, String> {
    let url = link.url.as_str();
    let cfg = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_FRAME_BYTES))
        .max_frame_size(Some(MAX_FRAME_BYTES));
    let (ws, _) = tokio::time::timeout(
        Duration::from_secs(15),
        tokio_tungstenite::connect_async_tls_with_config(
            url,
            Some(cfg),
            false,
            link.tls.clone().map(tokio_tungstenite::Connector::Rustls),
        ),
    )
    .await
    .map_err(|_| format!("{url}: no connection within 15 s"))?
    .map_err(|e| match untrusted_certificate(&e) {
        Some(t) => format!(
            "{url}: refusing to connect, the gateway's TLS certificate is not trusted ({t}). \
             If the gateway's certificate changed on purpose, give this node the authority that \
             signed the new one (--gateway-ca FILE, or node.gateway_ca) and start it again"
        ),
        None => format!("{url}: {e}"),
    })?;
    let (mut sink, mut stream) = ws.split();
    let next_frame = |m: Option<Result<Message, _>>| -> Option<Frame> {
        match m {
            Some(Ok(Message::Text(t))) => serde_json::from_str(t.as_str()).ok(),
            _ => None,
        }
    };
    let Some(Frame::Challenge { nonce, session, .. }) = next_frame(stream.next().await) else {
        return Err("the gateway sent no challenge".into());
    };
    let ts_ms = clawft_channel_core::now_ms();
    let sig = key.sign(signed_text(&nonce, &session, ts_ms, &host.name, &host.offers).as_bytes());
    let hello = Frame::Hello {
        key: link.pk.clone(),
        name: host.name.clone(),
        offers: host.offers.clone(),
        ts_ms,
        sig: base64::engine::general_purpose::STANDARD.encode(sig.as_ref()),
    };
    sink.send(Message::Text(hello.text().into()))
        .await
        .map_err(|e| e.to_string())?;
    match next_frame(stream.next().await) {
        Some(Frame::Welcome {
            id,
            gateway_key,
            gateway_sig,
        }) => {
            if let Err(ended) = check_gateway(link, &nonce, &session, &gateway_key, &gateway_sig) {
                return Ok(ended);
            }
            eprintln!("weft node: paired as {id}; serving");
        }
        Some(Frame::Refused {
            reason, message, ..
        }) => {
            return Ok(match reason.as_str() {
                "pending" => Ended::Pending(message),
                "denied" => Ended::Denied(message),
                _ => return Err(format!("refused ({reason}): {message}")),
            })
        }
        _ => return Err("the gateway closed the connection during the handshake".into()),
    }
    let conn = CancellationToken::new();
    let _cancel_all = conn.clone().drop_guard();
    let running: Arc<Mutex<HashMap<u64, CancellationToken>>> = Arc::default();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(64);
    loop {
        tokio::select! {
            Some(text) = rx.recv() => {
                if sink.send(Message::Text(text.into())).await.is_err() { break; }
            }
            m = stream.next() => match m {
                Some(Ok(Message::Text(t))) => match serde_json::from_str::<Frame>(t.as_str()) {
                    Ok(Frame::Call { id, op, args }) => {
                        let cancel = conn.child_token();
                        running.locked().insert(id, cancel.clone());
                        let (host, tx, running) = (host.clone(), tx.clone(), running.clone());
                        tokio::spawn(async move {
                            let r = host.answer(&op, &args, cancel).await;
                            running.locked().remove(&id);
                            let (ok, content) = match r { Ok(c) => (true, c), Err(e) => (false, e) };
                            let _ = tx.send(Frame::Result { id, ok, content }.text()).await;
                        });
                    }
                    Ok(Frame::Cancel { id }) => {
                        if let Some(c) = running.locked().remove(&id) { c.cancel(); }
                    }
                    _ => {}
                },
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_) | Message::Binary(_))) => {}
                _ => break,
            },
        }
    }
    // `_cancel_all` cancels every running call (their process groups are killed).
    Ok(Ended::Closed)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::connect_url;

    #[test]
    fn gateway_urls_are_encrypted_unless_loopback() {
        for (given, url) in [
            (
                "wss://gw.example.com",
                "wss://gw.example.com/v1/nodes/connect",
            ),
            (
                "https://gw.example.com:8443/x",
                "wss://gw.example.com:8443/v1/nodes/connect",
            ),
            (
                "ws://127.0.0.1:18790",
                "ws://127.0.0.1:18790/v1/nodes/connect",
            ),
            ("http://localhost:1", "ws://localhost:1/v1/nodes/connect"),
            ("ws://[::1]:2", "ws://[::1]:2/v1/nodes/connect"),
        ] {
            assert_eq!(connect_url(given).unwrap(), url, "{given}");
        }
        for bad in [
            "ws://192.168.1.5:18790",
            "http://gw.example.com",
            "ws://127.0.0.1.example.com",
            "ftp://gw.example.com",
            "gw.example.com",
        ] {
            assert!(connect_url(bad).is_err(), "{bad} accepted");
        }
    }
}
