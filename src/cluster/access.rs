//! Pairing shared by the nodes of the cluster (docs/cluster.md "Pairing").
//!
//! Bucket [`ACCESS_BUCKET`] (no expiry), authoritative in cluster mode:
//! `pending.<code>` → a pending pairing request (as the local store keeps it) and
//! `paired.<channel>.<user>` → an admitted sender. Each node mirrors the bucket into its local
//! store's pairing namespaces with a watch ([`ClusterAccess::mirror`]), so the per-message check
//! reads the local store and never waits on NATS; a change made on any node reaches every node
//! as fast as the watch delivers it. Approving and revoking write the bucket first and are
//! refused when NATS does not answer; a code issued by a node is published in the background.

use std::time::Duration;

use async_nats::jetstream::kv;

use super::node::{Cluster, LazyBucket};
use crate::store::Store;

/// The key-value bucket of pairing.
pub const ACCESS_BUCKET: &str = "weft_access";
/// How long a write waits for NATS.
pub const WAIT: Duration = Duration::from_secs(3);

/// The bucket key of pending code `code`.
pub fn pending_key(code: &str) -> String {
    format!("pending.{}", super::key_part(code))
}

/// The bucket key of paired sender `who` (`channel:user`).
pub fn paired_key(who: &str) -> String {
    let (channel, user) = who.split_once(':').unwrap_or((who, ""));
    format!(
        "paired.{}.{}",
        super::key_part(channel),
        super::key_part(user)
    )
}

/// The text [`super::key_part`] made `s` from.
pub fn unkey_part(s: &str) -> Option<String> {
    if s == "=00" {
        return Some(String::new());
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'=' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Which local record a bucket key mirrors: (pending?, local key).
fn local_of(key: &str) -> Option<(bool, String)> {
    if let Some(code) = key.strip_prefix("pending.") {
        return Some((true, unkey_part(code)?));
    }
    let rest = key.strip_prefix("paired.")?;
    let (channel, user) = rest.split_once('.')?;
    Some((
        false,
        format!("{}:{}", unkey_part(channel)?, unkey_part(user)?),
    ))
}

/// The cluster's pairing records (cheap to clone).
#[derive(Clone)]
pub struct ClusterAccess {
    cluster: Cluster,
    bucket: LazyBucket,
}

impl ClusterAccess {
    /// The pairing records of `cluster`.
    pub fn new(cluster: Cluster) -> Self {
        Self {
            cluster,
            bucket: LazyBucket::new(ACCESS_BUCKET, Duration::ZERO, "weft pairing"),
        }
    }

    /// Run `f` on the bucket, refused at once when the cluster is not healthy.
    fn write<F, Fut>(&self, what: &str, f: F) -> Result<(), String>
    where
        F: FnOnce(kv::Store) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<(), String>> + Send,
    {
        let refused = |why: String| {
            format!("{what} refused: {why} (pairing changes need the cluster; nothing was changed)")
        };
        let js = self.cluster.healthy_jetstream().map_err(refused)?;
        let cell = self.bucket.clone();
        // Dropped at the deadline on the cluster's thread too, so a write that timed out is
        // not made later.
        let write = async move {
            let b = cell.open(&js).await?;
            f(b).await
        };
        self.cluster
            .block_on(
                async move { tokio::time::timeout(WAIT, write).await },
                WAIT + Duration::from_millis(500),
            )
            .and_then(Result::ok)
            .unwrap_or_else(|| Err("NATS did not answer in time".into()))
            .map_err(refused)
    }

    /// Publish (`Some`) or drop (`None`) pending code `code` in the background.
    pub fn publish_pending(&self, code: &str, value: Option<&str>) {
        let key = pending_key(code);
        let value = value.map(|v| bytes::Bytes::from(v.to_string()));
        let c = self.clone();
        self.cluster.spawn(async move {
            for _ in 0..10 {
                let done = async {
                    let js = c
                        .cluster
                        .jetstream()
                        .ok_or("the cluster is not connected yet")?;
                    let b = c.bucket.open(&js).await?;
                    match &value {
                        Some(v) => b
                            .put(&key, v.clone())
                            .await
                            .map(drop)
                            .map_err(|e| e.to_string()),
                        None => b.delete(&key).await.map_err(|e| e.to_string()),
                    }
                };
                match tokio::time::timeout(WAIT, done).await {
                    Ok(Ok(())) => return,
                    Ok(Err(e)) => {
                        tracing::warn!(key, error = %e, "cluster: pairing code not published; retrying");
                    }
                    Err(_) => tracing::warn!(key, "cluster: pairing code not published in time; retrying"),
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }

    /// Admit `who` (`channel:user`, recorded as `value`) and drop code `code`, in the cluster.
    ///
    /// # Errors
    /// NATS did not answer or refused (then nothing was admitted).
    pub fn approve(&self, code: &str, who: &str, value: &str) -> Result<(), String> {
        let (pk, ck) = (paired_key(who), pending_key(code));
        let value = bytes::Bytes::from(value.to_string());
        self.write("pairing approval", move |b| async move {
            b.put(&pk, value).await.map_err(|e| e.to_string())?;
            // Admitted from here; a code left behind (NATS lost just now) admits the same
            // sender again, and expires.
            if let Err(e) = b.delete(&ck).await {
                tracing::warn!(error = %e, "cluster: approved pairing code not dropped");
            }
            Ok(())
        })
    }

    /// Remove paired sender `who` (`channel:user`) in the cluster.
    ///
    /// # Errors
    /// NATS did not answer or refused (then nothing was removed).
    pub fn revoke(&self, who: &str) -> Result<(), String> {
        let key = paired_key(who);
        self.write("pairing revocation", move |b| async move {
            b.delete(&key).await.map_err(|e| e.to_string())
        })
    }

    /// Keep the local store's namespaces `pending_ns` (codes) and `paired_ns` (senders) a copy
    /// of the bucket, from now on, in the background.
    pub fn mirror(&self, store: Store, pending_ns: &'static str, paired_ns: &'static str) {
        let c = self.clone();
        self.cluster.spawn(async move {
            loop {
                if let Err(e) = c.mirror_once(&store, pending_ns, paired_ns).await {
                    tracing::warn!(error = %e, "cluster: pairing watch interrupted; watching again");
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }

    async fn mirror_once(
        &self,
        store: &Store,
        pending_ns: &str,
        paired_ns: &str,
    ) -> Result<(), String> {
        use futures::StreamExt;
        let js = self
            .cluster
            .jetstream()
            .ok_or("the cluster is not connected yet")?;
        let b = self.bucket.open(&js).await?;
        let mut watch = b.watch_with_history(">").await.map_err(|e| e.to_string())?;
        while let Some(entry) = watch.next().await {
            let entry = entry.map_err(|e| e.to_string())?;
            let Some((pending, key)) = local_of(&entry.key) else {
                continue;
            };
            let ns = if pending { pending_ns } else { paired_ns };
            let value = match entry.operation {
                kv::Operation::Put => Some(String::from_utf8_lossy(&entry.value).into_owned()),
                kv::Operation::Delete | kv::Operation::Purge => None,
            };
            if let Err(e) = store.state_put(ns, &key, value.as_deref()) {
                tracing::error!(error = %e, key, "cluster: pairing record not mirrored in the store");
            }
        }
        Err("the watch ended".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_back_to_local_records() {
        assert_eq!(paired_key("telegram.bot2:7"), "paired.telegram=2Ebot2.7");
        assert_eq!(
            local_of(&paired_key("telegram.bot2:7")),
            Some((false, "telegram.bot2:7".to_string()))
        );
        assert_eq!(
            local_of(&pending_key("AB12CD34")),
            Some((true, "AB12CD34".to_string()))
        );
        assert_eq!(
            local_of(&paired_key("slack:U 1.x")),
            Some((false, "slack:U 1.x".to_string()))
        );
        assert_eq!(local_of("other.x"), None);
        assert_eq!(unkey_part("=ZZ"), None);
    }
}
