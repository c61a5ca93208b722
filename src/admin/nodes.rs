//! Nodes: the user's other machines running `weft node`, connected out to this gateway over a
//! WebSocket on the HTTP listener (`GET /v1/nodes/connect`).
//!
//! **Handshake.** The gateway sends a challenge (a random nonce and a session id of its own);
//! the node answers with its Ed25519 public key, its name, what it offers, a timestamp and its
//! signature over all of them ([`signed_text`]). A signature that does not verify (wrong key,
//! a handshake replayed from another connection: its nonce differs), a timestamp more than
//! [`MAX_SKEW_MS`] away from the gateway's clock, or a second hello is refused.
//!
//! **Pairing.** An unknown key is recorded as a pending request with its fingerprint and
//! refused; the operator approves or denies it (`weft nodes approve|deny ID`). Approved keys
//! live in the store (they survive a restart); revoking one cuts its connection at once.
//!
//! **Direction.** The gateway sends calls; a node may only answer them: any other frame from
//! a node ends its connection. The node decides what it offers; a call for anything else is
//! refused here and again on the node.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use base64::Engine as _;
use futures::{SinkExt as _, StreamExt as _};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::store::{Store, StoreError};
use crate::tools::nodes::NodeCallError;
use crate::types::MutexExt;
use clawft_channel_http::AdminError;

/// The route the nodes connect to.
pub const CONNECT_PATH: &str = "/v1/nodes/connect";
/// Largest clock difference accepted in a handshake.
pub const MAX_SKEW_MS: u64 = 120_000;
/// Time a node has to answer the challenge.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest frame either side accepts (a file of up to 4 MiB, JSON-escaped, fits).
pub const MAX_FRAME_BYTES: usize = 32 * 1024 * 1024;
/// Interval of the gateway's pings.
const PING_EVERY: Duration = Duration::from_secs(15);
/// Most pending pairing requests kept: anyone who reaches the listener can ask, so beyond
/// this new keys are refused until the operator approves, denies or revokes some.
pub const MAX_PENDING: usize = 64;
/// The store namespace of the node records.
const NS: &str = "nodes";
/// The store namespace of the gateway's own node key (its identity the nodes pin).
const NS_GATEWAY: &str = "nodes-gateway";

/// The text a node signs in its hello.
pub fn signed_text(
    nonce: &str,
    session: &str,
    ts_ms: u64,
    name: &str,
    offers: &[String],
) -> String {
    format!(
        "clawft-node-v1\n{nonce}\n{session}\n{ts_ms}\n{name}\n{}",
        offers.join(",")
    )
}

/// The text the gateway signs in its welcome: the connection's challenge and the node's key,
/// so a welcome is good for that one connection only.
pub fn gateway_signed_text(nonce: &str, session: &str, node_key: &str) -> String {
    format!("clawft-gateway-v1\n{nonce}\n{session}\n{node_key}")
}

/// An Ed25519 key pair kept at `path` (PKCS#8, mode 0600), made there at first use.
///
/// # Errors
/// The directory or file cannot be made or read, is readable by others, or holds no valid
/// key.
pub fn load_or_make_key(path: &std::path::Path) -> Result<ring::signature::Ed25519KeyPair, String> {
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
    let fail = |what: &str, e: &dyn std::fmt::Display| format!("{what} {}: {e}", path.display());
    if !path.exists() {
        if let Some(dir) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| fail("cannot make the directory of", &e))?;
        }
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng)
            .map_err(|e| fail("cannot generate", &e))?;
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| fail("cannot write", &e))?;
        f.write_all(pkcs8.as_ref())
            .and_then(|()| f.sync_all())
            .map_err(|e| fail("cannot write", &e))?;
    }
    let meta = std::fs::metadata(path).map_err(|e| fail("cannot read", &e))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{} is readable by other users: `chmod 600` it (or delete it to make a new key, which then needs a new approval)",
            path.display()
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| fail("cannot read", &e))?;
    ring::signature::Ed25519KeyPair::from_pkcs8(&bytes).map_err(|e| fail("no valid key in", &e))
}

/// A key's id (16 hex digits of its SHA-256) and fingerprint (`SHA256:` and the digest in
/// base64, as ssh prints them).
pub fn key_id(public_key: &[u8]) -> (String, String) {
    let d = ring::digest::digest(&ring::digest::SHA256, public_key);
    let hex = clawft_channel_core::hex(&d.as_ref()[..8]);
    let fp = format!(
        "SHA256:{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(d.as_ref())
    );
    (hex, fp)
}

/// A frame of the node protocol (JSON text frames).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Frame {
    /// Gateway → node: prove your key.
    Challenge {
        /// Random, hex.
        nonce: String,
        /// The gateway's id of this connection.
        session: String,
        /// The gateway's clock.
        ts_ms: u64,
    },
    /// Node → gateway: the answer to the challenge.
    Hello {
        /// Ed25519 public key, base64.
        key: String,
        /// The node's name.
        name: String,
        /// What it offers.
        offers: Vec<String>,
        /// The node's clock.
        ts_ms: u64,
        /// Signature over [`signed_text`], base64.
        sig: String,
    },
    /// Gateway → node: paired, calls may come.
    Welcome {
        /// The node's id.
        id: String,
        /// The gateway's own Ed25519 public key, base64: the node pins it at pairing.
        gateway_key: String,
        /// The gateway's signature over [`gateway_signed_text`], base64.
        gateway_sig: String,
    },
    /// Gateway → node: not admitted (then the connection closes).
    Refused {
        /// `pending`, `denied`, `busy`, `bad_signature`, `clock_skew`, `bad_hello`.
        reason: String,
        /// What the operator should do or see.
        message: String,
        /// The key's id, when known.
        #[serde(default)]
        id: Option<String>,
        /// The key's fingerprint, when known.
        #[serde(default)]
        fingerprint: Option<String>,
    },
    /// Gateway → node: run `op`.
    Call {
        /// Call id.
        id: u64,
        /// `info`, `run`, `read`, `write`, `list`.
        op: String,
        /// The op's arguments.
        args: Value,
    },
    /// Gateway → node: stop call `id` (its time is up).
    Cancel {
        /// Call id.
        id: u64,
    },
    /// Node → gateway: the answer to a call.
    Result {
        /// Call id.
        id: u64,
        /// Whether it succeeded.
        ok: bool,
        /// Its text, or the error.
        content: String,
    },
}

impl Frame {
    /// As a JSON text.
    pub fn text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Where a node's pairing stands (stored as `pending`, `approved`, `denied`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// It connected; the operator has not answered yet.
    Pending,
    /// The operator approved its key: it may connect and be used.
    Approved,
    /// The operator denied its key: its connections are refused.
    Denied,
}

impl NodeState {
    /// As stored and shown (`pending`, `approved`, `denied`).
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Pending => "pending",
            NodeState::Approved => "approved",
            NodeState::Denied => "denied",
        }
    }
}

/// What the operator does to a node's pairing (`weft nodes approve|deny|revoke`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeDecision {
    /// Approve its key.
    Approve,
    /// Deny its key.
    Deny,
    /// Forget it: its next connection is a new pending request.
    Revoke,
}

/// A node as the store keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Key id.
    pub id: String,
    /// The public key, base64.
    pub key: String,
    /// `SHA256:...`.
    pub fingerprint: String,
    /// Its name at the last handshake.
    pub name: String,
    /// Whether the operator approved it.
    pub state: NodeState,
    /// What it offered at the last handshake.
    pub offers: Vec<String>,
    /// First seen.
    pub created_ms: u64,
    /// Last handshake.
    pub seen_ms: u64,
    /// The address it connected from last.
    #[serde(default)]
    pub addr: String,
}

type Waiters = Mutex<HashMap<u64, oneshot::Sender<Result<String, NodeCallError>>>>;

/// One connected, approved node.
struct Conn {
    id: String,
    name: String,
    offers: Vec<String>,
    tx: mpsc::Sender<String>,
    waiters: Waiters,
    cut: CancellationToken,
}

/// The connected nodes and their records.
pub struct NodeHub {
    store: Store,
    online: Mutex<HashMap<String, Arc<Conn>>>,
    next_call: AtomicU64,
    /// Fires when the gateway shuts down: every connection ends.
    closed: CancellationToken,
    /// The gateway's own key, loaded (or made) at the first welcome.
    key: std::sync::OnceLock<Option<ring::signature::Ed25519KeyPair>>,
}

fn now_ms() -> u64 {
    clawft_channel_core::now_ms()
}

fn random_hex(n: usize) -> String {
    use ring::rand::SecureRandom as _;
    let mut b = vec![0u8; n];
    // A failure of the system RNG leaves zeros: the session id (a uuid) still differs.
    let _ = ring::rand::SystemRandom::new().fill(&mut b);
    clawft_channel_core::hex(&b)
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl NodeHub {
    /// The hub over `store` (where approved keys persist).
    pub fn new(store: Store) -> Arc<Self> {
        Arc::new(Self {
            store,
            online: Mutex::new(HashMap::new()),
            next_call: AtomicU64::new(1),
            closed: CancellationToken::new(),
            key: std::sync::OnceLock::new(),
        })
    }

    /// The gateway's own node key, made and stored at first use; `None` when the store
    /// fails (then no node is welcomed).
    fn gateway_key(&self) -> Option<&ring::signature::Ed25519KeyPair> {
        self.key
            .get_or_init(|| {
                if let Some(k) = self.stored_gateway_key() {
                    return Some(k);
                }
                let b64 = base64::engine::general_purpose::STANDARD;
                let rng = ring::rand::SystemRandom::new();
                let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).ok()?;
                let made = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).ok()?;
                match self
                    .store
                    .state_put(NS_GATEWAY, "key", Some(&b64.encode(pkcs8.as_ref())))
                {
                    Ok(()) => Some(made),
                    Err(e) => {
                        tracing::error!(error = %e, "cannot store the gateway's node key: nodes are refused");
                        None
                    }
                }
            })
            .as_ref()
    }

    /// The fingerprint of the gateway's node key, when it has one (`weft nodes list`).
    fn gateway_fingerprint(&self) -> Option<String> {
        let k = self.stored_gateway_key()?;
        Some(key_id(ring::signature::KeyPair::public_key(&k).as_ref()).1)
    }

    /// The gateway's node key as the store holds it (`None`: not made yet, or unreadable).
    fn stored_gateway_key(&self) -> Option<ring::signature::Ed25519KeyPair> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let pkcs8 = self
            .store
            .state_get(NS_GATEWAY, "key")
            .ok()
            .flatten()
            .and_then(|s| b64.decode(s).ok())?;
        ring::signature::Ed25519KeyPair::from_pkcs8(&pkcs8).ok()
    }

    /// End every node connection and refuse new ones (the gateway is shutting down).
    pub fn close(&self) {
        self.closed.cancel();
        let all: Vec<Arc<Conn>> = self.online.locked().drain().map(|(_, c)| c).collect();
        for c in all {
            c.cut.cancel();
        }
    }

    /// The WebSocket route the nodes connect to.
    pub fn routes(self: &Arc<Self>) -> Router {
        Router::new()
            .route(CONNECT_PATH, get(connect))
            .with_state(self.clone())
    }

    fn record(&self, id: &str) -> Option<NodeRecord> {
        self.store
            .state_get(NS, id)
            .ok()
            .flatten()
            .and_then(|s| serde_json::from_str(&s).ok())
    }

    /// Write `r` (applied now, durable with the next flush: the caller makes it durable).
    fn write(&self, r: &NodeRecord) -> Result<(), StoreError> {
        let text = serde_json::to_string(r).map_err(|e| StoreError::Backend(e.to_string()))?;
        self.store.state_put_unflushed(NS, &r.id, Some(&text))
    }

    /// Every record, by name.
    pub fn records(&self) -> Vec<NodeRecord> {
        let mut v: Vec<NodeRecord> = self
            .store
            .state_scan(NS)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(_, s)| serde_json::from_str(&s).ok())
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)));
        v
    }

    fn is_online(&self, id: &str) -> bool {
        self.online.locked().contains_key(id)
    }

    /// The record of `who` (id, or name when one record has it).
    fn find(&self, who: &str) -> Result<NodeRecord, AdminError> {
        if let Some(r) = self.record(who) {
            return Ok(r);
        }
        let named: Vec<NodeRecord> = self
            .records()
            .into_iter()
            .filter(|r| r.name == who)
            .collect();
        match named.as_slice() {
            [one] => Ok(one.clone()),
            [] => Err(AdminError::BadRequest(format!(
                "no node `{who}` (`weft nodes list` shows their ids)"
            ))),
            _ => Err(AdminError::BadRequest(format!(
                "several nodes are named `{who}`: name one by its id (`weft nodes list`)"
            ))),
        }
    }

    /// Cut the connection of node `id`, if any.
    fn disconnect(&self, id: &str) {
        if let Some(c) = self.online.locked().remove(id) {
            c.cut.cancel();
        }
    }

    /// `nodes/list` of the admin API: every node with whether it is online, and the gateway's
    /// fingerprint.
    pub fn list_json(&self) -> Value {
        json!({"nodes": self.records().iter().map(|r| {
            let mut v = serde_json::to_value(r).unwrap_or(Value::Null);
            v["online"] = json!(self.is_online(&r.id));
            v
        }).collect::<Vec<_>>(), "gateway_fingerprint": self.gateway_fingerprint()})
    }

    /// `nodes/approve|deny|revoke {id}` of the admin API.
    ///
    /// # Errors
    /// Unknown node, store failure.
    pub fn decide(&self, who: &str, decision: NodeDecision) -> Result<Value, AdminError> {
        let mut r = self.find(who)?;
        let state = match decision {
            NodeDecision::Revoke => {
                // Forgotten: its next connection is a new pending request.
                self.store
                    .state_put(NS, &r.id, None)
                    .map_err(|e| AdminError::Internal(e.to_string()))?;
                "revoked"
            }
            NodeDecision::Approve | NodeDecision::Deny => {
                r.state = if decision == NodeDecision::Approve {
                    NodeState::Approved
                } else {
                    NodeState::Denied
                };
                self.write(&r)
                    .and_then(|()| self.store.flush())
                    .map_err(|e| AdminError::Internal(e.to_string()))?;
                r.state.as_str()
            }
        };
        if decision != NodeDecision::Approve {
            self.disconnect(&r.id);
        }
        tracing::info!(node = %r.id, name = %r.name, state, "node pairing changed");
        Ok(json!({"id": r.id, "name": r.name, "fingerprint": r.fingerprint, "state": state}))
    }

    /// Serve one node connection until it ends.
    async fn serve(self: Arc<Self>, mut ws: WebSocket, addr: String) {
        if self.closed.is_cancelled() {
            return;
        }
        let nonce = random_hex(32);
        let session = uuid::Uuid::new_v4().to_string();
        let challenge = Frame::Challenge {
            nonce: nonce.clone(),
            session: session.clone(),
            ts_ms: now_ms(),
        };
        if ws
            .send(Message::Text(challenge.text().into()))
            .await
            .is_err()
        {
            return;
        }
        let first = tokio::select! {
            r = tokio::time::timeout(HELLO_TIMEOUT, ws.next()) => r,
            () = self.closed.cancelled() => return,
        };
        let hello = match first {
            Ok(Some(Ok(Message::Text(t)))) => serde_json::from_str::<Frame>(t.as_str()).ok(),
            _ => None,
        };
        let refuse =
            |reason: &str, message: String, id: Option<&str>, fp: Option<&str>| Frame::Refused {
                reason: reason.into(),
                message,
                id: id.map(str::to_string),
                fingerprint: fp.map(str::to_string),
            };
        let mut node_key = String::new();
        let admitted = match hello {
            Some(Frame::Hello {
                key,
                name,
                offers,
                ts_ms,
                sig,
            }) => {
                node_key.clone_from(&key);
                self.admit(&nonce, &session, &key, &name, offers, ts_ms, &sig, &addr)
            }
            _ => Err(refuse(
                "bad_hello",
                "the first frame must be a hello".into(),
                None,
                None,
            )),
        };
        // The node's record (seen, pending, its offers) is durable before it is answered.
        if let Err(e) = self.store.flush_ticket().await {
            tracing::warn!(%addr, error = %e, "node record not flushed");
        }
        let conn = match admitted {
            Ok(c) => c,
            Err(f) => {
                tracing::warn!(%addr, refusal = %f.text(), "node refused");
                let _ = ws.send(Message::Text(f.text().into())).await;
                let _ = ws.send(Message::Close(None)).await;
                return;
            }
        };
        let Some(gw_key) = self.gateway_key() else {
            self.gone(&conn);
            return;
        };
        let b64 = base64::engine::general_purpose::STANDARD;
        let welcome = Frame::Welcome {
            id: conn.id.clone(),
            gateway_key: b64.encode(ring::signature::KeyPair::public_key(gw_key).as_ref()),
            gateway_sig: b64.encode(
                gw_key
                    .sign(gateway_signed_text(&nonce, &session, &node_key).as_bytes())
                    .as_ref(),
            ),
        };
        let (mut sink, mut stream) = ws.split();
        if sink
            .send(Message::Text(welcome.text().into()))
            .await
            .is_err()
        {
            self.gone(&conn);
            return;
        }
        tracing::info!(node = %conn.id, name = %conn.name, %addr, "node connected");
        let (tx, mut rx) = mpsc::channel::<String>(64);
        // The sender the calls use is the connection's; swap in the real one.
        let conn = Arc::new(Conn {
            id: conn.id.clone(),
            name: conn.name.clone(),
            offers: conn.offers.clone(),
            tx,
            waiters: Mutex::new(HashMap::new()),
            cut: self.closed.child_token(),
        });
        if let Some(old) = self.online.locked().insert(conn.id.clone(), conn.clone()) {
            old.cut.cancel();
        }
        let mut ping = tokio::time::interval(PING_EVERY);
        loop {
            tokio::select! {
                () = conn.cut.cancelled() => break,
                Some(text) = rx.recv() => {
                    if sink.send(Message::Text(text.into())).await.is_err() { break; }
                }
                _ = ping.tick() => {
                    if sink.send(Message::Ping(Vec::new().into())).await.is_err() { break; }
                }
                m = stream.next() => match m {
                    Some(Ok(Message::Text(t))) => match serde_json::from_str::<Frame>(t.as_str()) {
                        Ok(Frame::Result { id, ok, content }) => {
                            if let Some(w) = conn.waiters.locked().remove(&id) {
                                let _ = w.send(if ok { Ok(content) } else { Err(NodeCallError::Failed(content)) });
                            }
                        }
                        _ => {
                            tracing::warn!(node = %conn.id, "node sent something other than a result: disconnected");
                            break;
                        }
                    },
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                    _ => break,
                },
            }
        }
        let _ = sink.send(Message::Close(None)).await;
        self.gone(&conn);
        tracing::info!(node = %conn.id, name = %conn.name, "node disconnected");
    }

    /// Forget `conn` (if it is still the node's current connection) and fail its calls.
    fn gone(&self, conn: &Arc<Conn>) {
        let mut online = self.online.locked();
        if online.get(&conn.id).is_some_and(|c| Arc::ptr_eq(c, conn)) {
            online.remove(&conn.id);
        }
        drop(online);
        conn.waiters.locked().clear();
    }

    /// Check a hello; the admitted node's connection skeleton, or the refusal to send.
    #[allow(clippy::too_many_arguments)]
    fn admit(
        &self,
        nonce: &str,
        session: &str,
        key: &str,
        name: &str,
        offers: Vec<String>,
        ts_ms: u64,
        sig: &str,
        addr: &str,
    ) -> Result<Arc<Conn>, Frame> {
        let refuse =
            |reason: &str, message: &str, id: Option<&str>, fp: Option<&str>| Frame::Refused {
                reason: reason.into(),
                message: message.into(),
                id: id.map(str::to_string),
                fingerprint: fp.map(str::to_string),
            };
        let b64 = base64::engine::general_purpose::STANDARD;
        let (Ok(pk), Ok(sig_bytes)) = (b64.decode(key), b64.decode(sig)) else {
            return Err(refuse(
                "bad_hello",
                "key and sig must be base64",
                None,
                None,
            ));
        };
        if !valid_name(name) || offers.len() > 16 || offers.iter().any(|o| !valid_name(o)) {
            return Err(refuse(
                "bad_hello",
                "the name and offers must be 1-64 letters, digits, '-', '_' or '.'",
                None,
                None,
            ));
        }
        let text = signed_text(nonce, session, ts_ms, name, &offers);
        let verified = ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, &pk)
            .verify(text.as_bytes(), &sig_bytes)
            .is_ok();
        if !verified {
            return Err(refuse(
                "bad_signature",
                "the signature does not verify for this key and this connection's challenge",
                None,
                None,
            ));
        }
        let now = now_ms();
        if now.abs_diff(ts_ms) > MAX_SKEW_MS {
            return Err(refuse(
                "clock_skew",
                "the node's clock differs from the gateway's by more than 2 minutes: fix the time on one of them",
                None,
                None,
            ));
        }
        let (id, fp) = key_id(&pk);
        let known = self.record(&id);
        if known.is_none()
            && self
                .records()
                .iter()
                .filter(|r| r.state == NodeState::Pending)
                .count()
                >= MAX_PENDING
        {
            return Err(refuse(
                "busy",
                "too many pairing requests are waiting on the gateway: its operator must answer some first (`weft nodes list`)",
                Some(&id),
                Some(&fp),
            ));
        }
        let mut r = known.unwrap_or_else(|| NodeRecord {
            id: id.clone(),
            key: key.to_string(),
            fingerprint: fp.clone(),
            name: name.to_string(),
            state: NodeState::Pending,
            offers: Vec::new(),
            created_ms: now,
            seen_ms: now,
            addr: String::new(),
        });
        r.name = name.to_string();
        r.offers.clone_from(&offers);
        r.seen_ms = now;
        r.addr = addr.to_string();
        // Made durable by the connection before it answers (a flush ticket, not a wait here).
        if let Err(e) = self.write(&r) {
            tracing::warn!(node = %r.id, error = %e, "node record not written");
        }
        match r.state {
            NodeState::Approved => {}
            NodeState::Denied => {
                return Err(refuse(
                    "denied",
                    "the gateway's operator denied this node's key",
                    Some(&id),
                    Some(&fp),
                ))
            }
            NodeState::Pending => {
                return Err(refuse(
                    "pending",
                    &format!("waiting for approval: on the gateway run `weft nodes approve {id}` after checking the fingerprint {fp}"),
                    Some(&id),
                    Some(&fp),
                ))
            }
        }
        let (tx, _) = mpsc::channel(1);
        Ok(Arc::new(Conn {
            id,
            name: name.to_string(),
            offers,
            tx,
            waiters: Mutex::new(HashMap::new()),
            cut: CancellationToken::new(),
        }))
    }
}

async fn connect(State(hub): State<Arc<NodeHub>>, ws: WebSocketUpgrade) -> Response {
    ws.max_message_size(MAX_FRAME_BYTES)
        .on_upgrade(move |sock| hub.serve(sock, String::new()))
}

#[async_trait]
impl crate::tools::nodes::NodeControl for NodeHub {
    fn list(&self) -> Value {
        json!({"nodes": self.records().into_iter().filter(|r| r.state == NodeState::Approved).map(|r| json!({
            "id": r.id,
            "name": r.name,
            "online": self.is_online(&r.id),
            "offers": r.offers,
        })).collect::<Vec<_>>()})
    }

    async fn call(
        &self,
        node: &str,
        op: &str,
        args: Value,
        timeout: Duration,
    ) -> Result<String, NodeCallError> {
        let conn = {
            let online = self.online.locked();
            online
                .get(node)
                .cloned()
                .or_else(|| online.values().find(|c| c.name == node).cloned())
        };
        let Some(conn) = conn else {
            let names: Vec<String> = self
                .records()
                .into_iter()
                .filter(|r| r.state == NodeState::Approved)
                .map(|r| r.name)
                .collect();
            return Err(if names.iter().any(|n| n == node) {
                NodeCallError::Offline(node.to_string())
            } else {
                NodeCallError::Unknown {
                    node: node.to_string(),
                    paired: names,
                }
            });
        };
        if !conn.offers.iter().any(|o| o == op) {
            return Err(NodeCallError::NotOffered {
                node: conn.name.clone(),
                op: op.to_string(),
                offers: conn.offers.clone(),
            });
        }
        let id = self.next_call.fetch_add(1, Ordering::Relaxed);
        let (wtx, wrx) = oneshot::channel();
        conn.waiters.locked().insert(id, wtx);
        let frame = Frame::Call {
            id,
            op: op.into(),
            args,
        };
        if conn.tx.send(frame.text()).await.is_err() {
            conn.waiters.locked().remove(&id);
            return Err(NodeCallError::Disconnected(conn.name.clone()));
        }
        match tokio::time::timeout(timeout, wrx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(NodeCallError::DroppedCall(conn.name.clone())),
            Err(_) => {
                conn.waiters.locked().remove(&id);
                let _ = conn.tx.try_send(Frame::Cancel { id }.text());
                Err(NodeCallError::TimedOut {
                    node: conn.name.clone(),
                    secs: timeout.as_secs(),
                })
            }
        }
    }
}
