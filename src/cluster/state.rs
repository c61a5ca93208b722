//! A channel's resume state in the cluster (Telegram's offset, Discord's session and sequence,
//! Matrix's `since`, the Signal and IMAP cursors): the next node to hold the channel's lease
//! resumes where the last one stopped. Other keys (a draft's journal, what a send delivered)
//! belong to the node that sends and stay in its local store.
//!
//! Writes are fenced: each value carries the fencing token of the lease it was written under
//! and is written with the key's expected revision; a write is refused when this node no
//! longer holds the lease (on its own clock) or when the value was written under a later
//! token.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::kv;
use clawft_channel_core::{StateError, StateStore};
use serde::{Deserialize, Serialize};

use super::node::{Cluster, Holding};
use crate::store::shared::{key_part, SharedError, SharedErrorKind};
use crate::types::MutexExt;

/// The stored form of a value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fenced {
    /// The value.
    pub v: String,
    /// The fencing token it was written under.
    pub token: u64,
    /// The node that wrote it.
    pub node: String,
}

#[derive(Default)]
struct Cache {
    /// Resume key → (value, revision) as last read or written; revision 0: absent.
    values: HashMap<String, (Option<String>, u64)>,
    /// The lease the cache was loaded under (its token), and its live state.
    lease: Option<(u64, tokio::sync::watch::Receiver<Option<Holding>>)>,
}

/// A channel's state: its resume keys in the cluster, the rest in `local`.
pub struct ClusterState {
    cluster: Cluster,
    local: Arc<dyn StateStore>,
    prefix: String,
    keys: &'static [&'static str],
    cache: Mutex<Cache>,
}

impl ClusterState {
    /// The state of channel `id`, whose resume keys (what the next connection holder needs,
    /// as its platform's contract names them) are `keys`.
    pub fn new(
        cluster: Cluster,
        id: &str,
        keys: &'static [&'static str],
        local: Arc<dyn StateStore>,
    ) -> Self {
        Self {
            cluster,
            local,
            prefix: format!("chan.{}", key_part(id)),
            keys,
            cache: Mutex::new(Cache::default()),
        }
    }

    fn kv_key(&self, key: &str) -> String {
        format!("{}.{}", self.prefix, key_part(key))
    }

    fn remote(&self, key: &str) -> bool {
        self.keys.contains(&key)
    }

    /// Read the resume keys from the cluster for the lease `holding` (call after taking the
    /// lease, before acting under it).
    ///
    /// # Errors
    /// NATS did not answer.
    pub async fn load(
        &self,
        holding: Holding,
        watch: tokio::sync::watch::Receiver<Option<Holding>>,
    ) -> Result<(), SharedError> {
        let kv = self
            .cluster
            .state_bucket()
            .ok_or_else(|| SharedError::unavailable("the cluster is not connected"))?;
        let keys: Vec<String> = self.keys.iter().map(|k| self.kv_key(k)).collect();
        let names: Vec<&'static str> = self.keys.to_vec();
        let got = self
            .cluster
            .run_here(async move {
                let mut out = Vec::new();
                for k in keys {
                    out.push(read(&kv, &k).await?);
                }
                Ok::<_, SharedError>(out)
            })
            .await
            .ok_or_else(|| SharedError::unavailable("the cluster runtime stopped"))??;
        let mut c = self.cache.locked();
        c.values = names
            .into_iter()
            .zip(got)
            .map(|(k, (v, rev))| (k.to_string(), (v.map(|f| f.v), rev)))
            .collect();
        c.lease = Some((holding.token, watch));
        Ok(())
    }

    /// Forget the lease (it was lost or given up): writes are refused until the next load.
    pub fn unload(&self) {
        self.cache.locked().lease = None;
    }
}

async fn read(kv: &kv::Store, key: &str) -> Result<(Option<Fenced>, u64), SharedError> {
    let e = kv.entry(key).await.map_err(SharedError::unavailable)?;
    Ok(match e {
        Some(e) if e.operation == kv::Operation::Put => {
            (serde_json::from_slice(&e.value).ok(), e.revision)
        }
        Some(e) => (None, e.revision),
        None => (None, 0),
    })
}

/// Write `value` (under its token) to `key`, expecting revision `rev` (0: absent); on a
/// revision conflict, overwrite only a value written under an earlier token. Returns the new
/// revision.
///
/// # Errors
/// [`SharedErrorKind::Fenced`] (a later token wrote it: this writer is fenced off),
/// [`SharedErrorKind::Conflict`] (the value kept changing), or NATS failed.
pub async fn write_fenced(
    kv: &kv::Store,
    key: &str,
    value: Fenced,
    mut rev: u64,
) -> Result<u64, SharedError> {
    let body: bytes::Bytes = serde_json::to_vec(&value)
        .map_err(|e| SharedError::new(SharedErrorKind::Invalid, e))?
        .into();
    for _ in 0..3 {
        // Whether the write lost a race: the client's kind, or the server's code down the
        // error's sources.
        let r = if rev == 0 {
            kv.create(key, body.clone()).await.map_err(|e| {
                (
                    e.kind() == kv::CreateErrorKind::AlreadyExists
                        || super::kv::classify(&e) == SharedErrorKind::Conflict,
                    SharedError::unavailable(e),
                )
            })
        } else {
            kv.update(key, body.clone(), rev).await.map_err(|e| {
                (
                    e.kind() == kv::UpdateErrorKind::WrongLastRevision
                        || super::kv::classify(&e) == SharedErrorKind::Conflict,
                    SharedError::unavailable(e),
                )
            })
        };
        match r {
            Ok(new) => return Ok(new),
            Err((true, _)) => {
                let (cur, cur_rev) = read(kv, key).await?;
                if let Some(c) = cur.filter(|c| c.token > value.token) {
                    return Err(SharedError::new(
                        SharedErrorKind::Fenced,
                        format!(
                            "fenced: written by node {} under a later lease (token {} > {})",
                            c.node, c.token, value.token
                        ),
                    ));
                }
                rev = cur_rev;
            }
            Err((false, e)) => return Err(e),
        }
    }
    Err(SharedError::new(
        SharedErrorKind::Conflict,
        "the value kept changing",
    ))
}

/// How long a state write may wait for NATS.
const WRITE_WAIT: Duration = Duration::from_secs(2);

impl StateStore for ClusterState {
    fn get(&self, key: &str) -> Option<String> {
        if !self.remote(key) {
            return self.local.get(key);
        }
        self.cache
            .locked()
            .values
            .get(key)
            .and_then(|(v, _)| v.clone())
    }

    fn put(&self, key: &str, value: &str) -> Result<(), StateError> {
        if !self.remote(key) {
            return self.local.put(key, value);
        }
        let (holding, rev) = {
            let c = self.cache.locked();
            let live = c
                .lease
                .as_ref()
                .and_then(|(token, w)| (*w.borrow()).filter(|h| h.token == *token && h.valid()));
            (live, c.values.get(key).map_or(0, |(_, r)| *r))
        };
        let Some(holding) = holding else {
            return Err(StateError(format!(
                "not written: this node does not hold the connection lease of {}",
                self.prefix
            )));
        };
        let kv = self
            .cluster
            .state_bucket()
            .ok_or_else(|| StateError("the cluster is not connected".into()))?;
        let fenced = Fenced {
            v: value.to_string(),
            token: holding.token,
            node: self.cluster.settings().node_id.clone(),
        };
        let k = self.kv_key(key);
        let wait = holding
            .until
            .saturating_duration_since(std::time::Instant::now())
            .min(WRITE_WAIT);
        let r = self
            .cluster
            .block_on(
                async move { write_fenced(&kv, &k, fenced, rev).await },
                wait,
            )
            .ok_or_else(|| StateError("NATS did not answer in time".into()))?
            .map_err(|e| StateError(e.to_string()))?;
        self.cache
            .locked()
            .values
            .insert(key.to_string(), (Some(value.to_string()), r));
        Ok(())
    }

    fn remove(&self, key: &str) -> Result<(), StateError> {
        if !self.remote(key) {
            return self.local.remove(key);
        }
        self.put(key, "")
    }
}
