//! Approvals shared by the nodes of the cluster (docs/cluster.md "Approvals").
//!
//! Bucket [`APPROVAL_BUCKET`] (entries kept [`APPROVALS_KEPT`]):
//! - `ask.<id>` → `{"node": …, "record": …}`: a question waiting on node `node` (published by
//!   it when asked, deleted when answered or given up), so every node lists it;
//! - `answer.<id>` → `once`, `always` or `deny`: an answer given on another node; the asking
//!   node watches these keys, hands the answer to the waiting call and deletes both keys;
//! - `always.<session>.<digest of the command>` → the command: an "always" decision, read by
//!   whichever node runs the session next.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::kv;

use super::node::{Cluster, LazyBucket};

/// The key-value bucket of the approvals.
pub const APPROVAL_BUCKET: &str = "weft_approvals";
/// How long an entry is kept (an "always" decision for 90 days after it was given).
pub const APPROVALS_KEPT: Duration = Duration::from_secs(90 * 24 * 3600);
/// How long a read or write waits for NATS.
pub const WAIT: Duration = Duration::from_secs(2);
/// How long an answer given on another node waits for the asking node to take it.
pub const TAKEN_WAIT: Duration = Duration::from_secs(6);

/// What the watcher hands an answer to: (approval id, decision); whether it was pending here.
pub type OnAnswer = Arc<dyn Fn(&str, &str) -> bool + Send + Sync>;

fn always_key(session: &str, command: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, command.as_bytes());
    let hex: String = d
        .as_ref()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("always.{}.{hex}", super::key_part(session))
}

/// The cluster's approvals (cheap to clone).
#[derive(Clone)]
pub struct ClusterApprovals {
    cluster: Cluster,
    bucket: LazyBucket,
}

impl ClusterApprovals {
    /// The approvals of `cluster`.
    pub fn new(cluster: Cluster) -> Self {
        Self {
            cluster,
            bucket: LazyBucket::new(APPROVAL_BUCKET, APPROVALS_KEPT, "weft approvals"),
        }
    }

    fn me(&self) -> String {
        self.cluster.settings().node_id.clone()
    }

    /// Run `f` on the bucket in the background, a few times until it succeeds.
    fn background<F, Fut>(&self, what: &'static str, f: F)
    where
        F: Fn(kv::Store) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), String>> + Send,
    {
        let c = self.clone();
        self.cluster.spawn(async move {
            for _ in 0..10 {
                let done = async {
                    let js = c
                        .cluster
                        .jetstream()
                        .ok_or("the cluster is not connected yet")?;
                    f(c.bucket.open(&js).await?).await
                };
                match tokio::time::timeout(WAIT, done).await {
                    Ok(Ok(())) => return,
                    Ok(Err(e)) => tracing::warn!(what, error = %e, "cluster: approval record not written; retrying"),
                    Err(_) => tracing::warn!(what, "cluster: approval record not written in time; retrying"),
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }

    /// Put `body` under `key` in the background ([`Self::background`]).
    fn put_background(&self, what: &'static str, key: String, body: String) {
        self.background(what, move |b| {
            let (key, body) = (key.clone(), body.clone());
            async move {
                b.put(&key, body.into())
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
        });
    }

    /// Run `f` on the bucket and wait for it (from synchronous code, never on the cluster's
    /// thread), refused at once when the cluster is not healthy.
    fn now<T, F, Fut>(&self, f: F, wait: Duration) -> Result<T, String>
    where
        T: Send + 'static,
        F: FnOnce(kv::Store) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, String>> + Send,
    {
        let js = self.cluster.healthy_jetstream()?;
        let cell = self.bucket.clone();
        let run = async move { f(cell.open(&js).await?).await };
        self.cluster
            .block_on(
                async move { tokio::time::timeout(wait, run).await },
                wait + Duration::from_millis(500),
            )
            .and_then(Result::ok)
            .unwrap_or_else(|| Err("NATS did not answer in time".into()))
    }

    /// Question `id` (its record as JSON) waits on this node.
    pub fn asked(&self, id: &str, record: &str) {
        let key = format!("ask.{}", super::key_part(id));
        let body = serde_json::json!({"node": self.me(), "record": record}).to_string();
        self.put_background("ask", key, body);
    }

    /// Question `id` is no longer waiting here.
    pub fn settled(&self, id: &str) {
        let (ask, answer) = (
            format!("ask.{}", super::key_part(id)),
            format!("answer.{}", super::key_part(id)),
        );
        self.background("settle", move |b| {
            let (ask, answer) = (ask.clone(), answer.clone());
            async move {
                b.delete(&ask).await.map_err(|e| e.to_string())?;
                b.purge(&answer).await.map_err(|e| e.to_string())
            }
        });
    }

    /// The questions waiting on the other nodes: (node, record).
    ///
    /// # Errors
    /// NATS failed or did not answer, or the cluster is not healthy.
    pub fn others(&self) -> Result<Vec<(String, String)>, String> {
        let me = self.me();
        self.now(
            move |b| async move {
                use futures::StreamExt;
                let mut keys = b.keys().await.map_err(|e| e.to_string())?;
                let mut asks = Vec::new();
                while let Some(k) = keys.next().await {
                    let k = k.map_err(|e| e.to_string())?;
                    if k.starts_with("ask.") {
                        asks.push(k);
                    }
                }
                let mut out = Vec::new();
                for k in asks {
                    let Some(v) = b.get(&k).await.map_err(|e| e.to_string())? else {
                        continue;
                    };
                    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&v) else {
                        continue;
                    };
                    let node = v["node"].as_str().unwrap_or_default().to_string();
                    if node != me {
                        out.push((node, v["record"].as_str().unwrap_or_default().to_string()));
                    }
                }
                Ok(out)
            },
            WAIT,
        )
    }

    /// Answer question `id` waiting on another node with `decision`: the node that asked
    /// (`Some`) took it, or no node asks it (`None`).
    ///
    /// # Errors
    /// NATS failed or did not answer, or the asking node did not take the answer in time.
    pub fn forward(&self, id: &str, decision: &str) -> Result<Option<String>, String> {
        let (ask, answer) = (
            format!("ask.{}", super::key_part(id)),
            format!("answer.{}", super::key_part(id)),
        );
        let decision = decision.to_string();
        self.now(
            move |b| async move {
                let Some(v) = b.get(&ask).await.map_err(|e| e.to_string())? else {
                    return Ok(None);
                };
                let node = serde_json::from_slice::<serde_json::Value>(&v)
                    .ok()
                    .and_then(|v| v["node"].as_str().map(str::to_string))
                    .unwrap_or_default();
                b.put(&answer, decision.into())
                    .await
                    .map_err(|e| e.to_string())?;
                let start = Instant::now();
                while start.elapsed() < TAKEN_WAIT {
                    if b.get(&ask).await.map_err(|e| e.to_string())?.is_none() {
                        return Ok(Some(node));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let _ = b.purge(&answer).await;
                Err(format!(
                    "node {node}, where the question waits, did not take the answer in time"
                ))
            },
            TAKEN_WAIT + WAIT * 2,
        )
    }

    /// Hand the answers given on other nodes to `on_answer`, from now on, in the background.
    pub fn watch_answers(&self, on_answer: OnAnswer) {
        let c = self.clone();
        self.cluster.spawn(async move {
            loop {
                if let Err(e) = c.watch_once(&on_answer).await {
                    tracing::warn!(error = %e, "cluster: approval watch interrupted; watching again");
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }

    async fn watch_once(&self, on_answer: &OnAnswer) -> Result<(), String> {
        use futures::StreamExt;
        let js = self
            .cluster
            .jetstream()
            .ok_or("the cluster is not connected yet")?;
        let b = self.bucket.open(&js).await?;
        let mut watch = b
            .watch_with_history("answer.>")
            .await
            .map_err(|e| e.to_string())?;
        while let Some(entry) = watch.next().await {
            let entry = entry.map_err(|e| e.to_string())?;
            if entry.operation != kv::Operation::Put {
                continue;
            }
            let Some(id) = entry
                .key
                .strip_prefix("answer.")
                .and_then(super::access::unkey_part)
            else {
                continue;
            };
            let decision = String::from_utf8_lossy(&entry.value).into_owned();
            if on_answer(&id, &decision) {
                tracing::info!(id, decision, "cluster: approval answered on another node");
            }
        }
        Err("the watch ended".into())
    }

    /// Remember that `command` is always allowed in `session`, in the cluster (background).
    pub fn remember_always(&self, session: &str, command: &str) {
        let key = always_key(session, command);
        let body = command.to_string();
        self.put_background("always", key, body);
    }

    /// Whether `command` was always allowed in `session` on any node. `false` when NATS
    /// cannot tell (the user is then asked).
    pub async fn always(&self, session: &str, command: &str) -> bool {
        let Ok(js) = self.cluster.healthy_jetstream() else {
            return false;
        };
        let key = always_key(session, command);
        let command = command.to_string();
        let cell = self.bucket.clone();
        let read = async move {
            let b = cell.open(&js).await?;
            Ok::<_, String>(
                b.get(&key)
                    .await
                    .map_err(|e| e.to_string())?
                    .is_some_and(|v| *v == *command.as_bytes()),
            )
        };
        matches!(
            self.cluster
                .run_here(async move { tokio::time::timeout(WAIT, read).await })
                .await,
            Some(Ok(Ok(true)))
        )
    }
}
