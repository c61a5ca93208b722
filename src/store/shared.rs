//! The one seam of the state the gateways of a cluster share (docs/architecture.md, "Adding a
//! piece of shared state"): typed records in named buckets, read and written through one
//! handle ([`Replicated`]: the cluster's key-value buckets on NATS JetStream implement it), with
//! one error type whose kinds callers branch on ([`SharedError`]).
//!
//! A piece of shared state is a payload type ([`Payload`]: serde, JSON on the wire unless it says
//! otherwise) and a [`Bucket`]; the module that owns the state holds a [`Shared`] of it, given
//! at construction (nothing when the gateway runs alone). This module knows no NATS and holds no
//! state of its own; it never decides anything on the text of an error.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::mpsc;

/// What went wrong with a shared record: what callers branch on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedErrorKind {
    /// Another writer changed the record since the revision the write named (or the record
    /// exists, for a write that expected it absent).
    Conflict,
    /// The cluster is unreachable, not connected yet, or did not answer in time.
    Unavailable,
    /// The record is larger than the cluster stores.
    TooLarge,
    /// This node may not write the record any more: a later holder of its lease wrote it, or
    /// this node does not hold the lease.
    Fenced,
    /// The record could not be encoded or decoded.
    Invalid,
}

impl SharedErrorKind {
    /// A short name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Conflict => "conflict",
            Self::Unavailable => "unavailable",
            Self::TooLarge => "too_large",
            Self::Fenced => "fenced",
            Self::Invalid => "invalid",
        }
    }
}

/// An error of kind `K` and what happened (the shape of async-nats' `Error<Kind>`): callers
/// branch on [`Error::kind`]; the text is for people.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error<K> {
    kind: K,
    detail: String,
}

impl<K: Copy> Error<K> {
    /// An error of `kind`, saying `detail`.
    pub fn new(kind: K, detail: impl fmt::Display) -> Self {
        Self {
            kind,
            detail: detail.to_string(),
        }
    }

    /// What kind of failure it is.
    pub fn kind(&self) -> K {
        self.kind
    }

    /// What happened, for people.
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

impl<K> fmt::Display for Error<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl<K: fmt::Debug> std::error::Error for Error<K> {}

/// The error of every operation on shared state.
pub type SharedError = Error<SharedErrorKind>;

impl SharedError {
    /// The cluster cannot be used now.
    pub fn unavailable(detail: impl fmt::Display) -> Self {
        Self::new(SharedErrorKind::Unavailable, detail)
    }
}

/// A bucket of shared records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// Its name in the cluster (`weft_jobs`).
    pub name: &'static str,
    /// How long a record is kept after its last write (zero: forever).
    pub max_age: Duration,
    /// What it holds, as NATS tools show it.
    pub description: &'static str,
    /// How long one operation on it waits for the cluster.
    pub wait: Duration,
}

/// A value and the revision it was written at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned<V> {
    /// The value.
    pub value: V,
    /// Its revision (greater for every later write of the bucket).
    pub revision: u64,
}

/// What the cluster holds under a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry<V> {
    /// Never written, or expired.
    Absent,
    /// A value.
    Present(Versioned<V>),
    /// Deleted; the delete marker's revision.
    Removed(u64),
}

impl<V> Entry<V> {
    /// The value, when there is one.
    pub fn value(self) -> Option<Versioned<V>> {
        match self {
            Entry::Present(v) => Some(v),
            Entry::Absent | Entry::Removed(_) => None,
        }
    }

    /// The revision to name for a conditional write over this entry (0: nothing there).
    pub fn revision(&self) -> u64 {
        match self {
            Entry::Absent => 0,
            Entry::Present(v) => v.revision,
            Entry::Removed(r) => *r,
        }
    }
}

/// What a watch sees, in the order the bucket has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Watched<K, V> {
    /// The watch (re)started: every current record follows, then each change as it happens.
    Started,
    /// Record `key` written.
    Put {
        /// Its key.
        key: K,
        /// Its value.
        value: V,
        /// Its revision.
        revision: u64,
    },
    /// Record `key` deleted (or expired, or purged).
    Removed {
        /// Its key.
        key: K,
        /// The delete marker's revision.
        revision: u64,
    },
}

/// The cluster's buckets, as the gateway uses them: raw bytes under full keys. Every
/// operation waits at most its bucket's [`Bucket::wait`] and fails at once, as
/// [`SharedErrorKind::Unavailable`], while the cluster is unhealthy. Callers use a typed
/// [`Shared`] over it.
#[async_trait]
pub trait Replicated: Send + Sync {
    /// This node's id in the cluster.
    fn node(&self) -> &str;
    /// Whether the cluster answers now.
    fn healthy(&self) -> bool;
    /// What `key` holds.
    async fn entry(&self, bucket: Bucket, key: String) -> Result<Entry<Bytes>, SharedError>;
    /// Write `value` under `key` whatever is there; its revision.
    async fn put(&self, bucket: Bucket, key: String, value: Bytes) -> Result<u64, SharedError>;
    /// Write `value` under `key` if its revision is still `revision` (0: absent or deleted);
    /// the new revision, or [`SharedErrorKind::Conflict`].
    async fn update(
        &self,
        bucket: Bucket,
        key: String,
        value: Bytes,
        revision: u64,
    ) -> Result<u64, SharedError>;
    /// Delete `key` (a delete marker stays).
    async fn delete(&self, bucket: Bucket, key: String) -> Result<(), SharedError>;
    /// Delete `key` and its history.
    async fn purge(&self, bucket: Bucket, key: String) -> Result<(), SharedError>;
    /// The keys of the records starting with `prefix`.
    async fn keys(&self, bucket: Bucket, prefix: String) -> Result<Vec<String>, SharedError>;
    /// Every record under `prefix` (a key prefix ending in `.`, or empty for all), then every
    /// change, until the receiver is dropped or the cluster stops; made again (from
    /// [`Watched::Started`]) after NATS was away.
    fn watch(&self, bucket: Bucket, prefix: String) -> mpsc::Receiver<Watched<String, Bytes>>;
}

/// A record type kept in the cluster: JSON (serde) by default; a payload that is already text
/// or bytes on the wire says so by encoding itself.
pub trait Payload: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The bytes stored.
    ///
    /// # Errors
    /// [`SharedErrorKind::Invalid`] when it cannot be encoded.
    fn encode(&self) -> Result<Bytes, SharedError> {
        serde_json::to_vec(self)
            .map(Bytes::from)
            .map_err(|e| SharedError::new(SharedErrorKind::Invalid, format!("encode: {e}")))
    }

    /// The value of stored bytes.
    ///
    /// # Errors
    /// [`SharedErrorKind::Invalid`] when they do not decode.
    fn decode(bytes: &[u8]) -> Result<Self, SharedError> {
        serde_json::from_slice(bytes)
            .map_err(|e| SharedError::new(SharedErrorKind::Invalid, format!("decode: {e}")))
    }
}

/// Bytes, stored as they are (documents).
impl Payload for Vec<u8> {
    fn encode(&self) -> Result<Bytes, SharedError> {
        Ok(Bytes::copy_from_slice(self))
    }

    fn decode(bytes: &[u8]) -> Result<Self, SharedError> {
        Ok(bytes.to_vec())
    }
}

/// Text, stored as its UTF-8 bytes (not as a JSON string).
impl Payload for String {
    fn encode(&self) -> Result<Bytes, SharedError> {
        Ok(Bytes::copy_from_slice(self.as_bytes()))
    }

    fn decode(bytes: &[u8]) -> Result<Self, SharedError> {
        String::from_utf8(bytes.to_vec())
            .map_err(|e| SharedError::new(SharedErrorKind::Invalid, format!("decode: {e}")))
    }
}

/// A number, stored as its decimal digits (the same bytes as its JSON).
impl Payload for u64 {}

/// A key part for `s`: A-Z a-z 0-9 - _ kept, every other byte as `=XX` (empty: `=00`).
pub fn key_part(s: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "={b:02X}");
        }
    }
    if out.is_empty() {
        out.push_str("=00");
    }
    out
}

/// The text [`key_part`] made `s` from.
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

/// Writes of [`in_background`] tried at most.
const BACKGROUND_TRIES: usize = 10;

/// Run `op` in the background on the current runtime until it succeeds, at most
/// [`BACKGROUND_TRIES`] times a second apart: a shared record whose writer does not wait for
/// it (a pairing code issued, an approval asked). Outside a runtime nothing is written (logged).
pub fn in_background<F, Fut>(what: &'static str, op: F)
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), SharedError>> + Send,
{
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(what, "shared record not written: no runtime");
        return;
    };
    rt.spawn(async move {
        for _ in 0..BACKGROUND_TRIES {
            match op().await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(what, error = %e, "cluster: shared record not written; retrying");
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
}

/// Wait for a shared-state operation from synchronous code (a blocking thread, the CLI's
/// commands): the operation runs on the cluster's own thread and is bounded by its bucket's
/// wait. Never call it on the cluster's thread.
pub fn wait<F: Future>(op: F) -> F::Output {
    futures::executor::block_on(op)
}

/// Records of type `V` under the keys `<prefix>.<part>.<part>…` of a bucket (each part as
/// [`key_part`] writes it). Cheap to clone.
pub struct Shared<V> {
    seam: Arc<dyn Replicated>,
    bucket: Bucket,
    prefix: &'static str,
    _v: PhantomData<fn() -> V>,
}

impl<V> Clone for Shared<V> {
    fn clone(&self) -> Self {
        Self {
            seam: self.seam.clone(),
            bucket: self.bucket,
            prefix: self.prefix,
            _v: PhantomData,
        }
    }
}

/// A watch on the records of a [`Shared`], decoded.
pub struct Watch<V> {
    rx: mpsc::Receiver<Watched<String, Bytes>>,
    prefix: &'static str,
    bucket: &'static str,
    _v: PhantomData<fn() -> V>,
}

impl<V: Payload> Watch<V> {
    /// The next record or change (`None`: the cluster stopped). A value that does not decode
    /// is logged and skipped.
    pub async fn next(&mut self) -> Option<Watched<Vec<String>, V>> {
        loop {
            let w = self.rx.recv().await?;
            let (key, value, revision) = match w {
                Watched::Started => return Some(Watched::Started),
                Watched::Put {
                    key,
                    value,
                    revision,
                } => (key, Some(value), revision),
                Watched::Removed { key, revision } => (key, None, revision),
            };
            let Some(parts) = parts_of(self.prefix, &key) else {
                continue;
            };
            return Some(match value {
                None => Watched::Removed {
                    key: parts,
                    revision,
                },
                Some(v) => match V::decode(&v) {
                    Ok(value) => Watched::Put {
                        key: parts,
                        value,
                        revision,
                    },
                    Err(e) => {
                        tracing::warn!(bucket = self.bucket, key, error = %e, "shared record undecodable; skipped");
                        continue;
                    }
                },
            });
        }
    }
}

/// The decoded parts of `key` under `prefix` (`None`: another prefix, or not a key we wrote).
fn parts_of(prefix: &str, key: &str) -> Option<Vec<String>> {
    let rest = if prefix.is_empty() {
        key
    } else {
        key.strip_prefix(prefix)?.strip_prefix('.')?
    };
    rest.split('.').map(unkey_part).collect()
}

impl<V: Payload> Shared<V> {
    /// Records of `V` under `prefix` in `bucket`, through `seam`.
    pub fn new(seam: Arc<dyn Replicated>, bucket: Bucket, prefix: &'static str) -> Self {
        Self {
            seam,
            bucket,
            prefix,
            _v: PhantomData,
        }
    }

    /// This node's id in the cluster.
    pub fn node(&self) -> &str {
        self.seam.node()
    }

    /// Whether the cluster answers now.
    pub fn healthy(&self) -> bool {
        self.seam.healthy()
    }

    /// The full key of the record whose key parts are `parts`.
    pub fn key(&self, parts: &[&str]) -> String {
        let mut k = String::from(self.prefix);
        for p in parts {
            if !k.is_empty() {
                k.push('.');
            }
            k.push_str(&key_part(p));
        }
        k
    }

    /// What the record `parts` is.
    ///
    /// # Errors
    /// The cluster failed ([`SharedErrorKind::Unavailable`]) or the value does not decode.
    pub async fn entry(&self, parts: &[&str]) -> Result<Entry<V>, SharedError> {
        Ok(match self.seam.entry(self.bucket, self.key(parts)).await? {
            Entry::Absent => Entry::Absent,
            Entry::Removed(r) => Entry::Removed(r),
            Entry::Present(v) => Entry::Present(Versioned {
                value: V::decode(&v.value)?,
                revision: v.revision,
            }),
        })
    }

    /// The record `parts`, when there is one.
    ///
    /// # Errors
    /// As [`Shared::entry`].
    pub async fn get(&self, parts: &[&str]) -> Result<Option<Versioned<V>>, SharedError> {
        Ok(self.entry(parts).await?.value())
    }

    /// Write `value` as record `parts`, whatever is there; its revision.
    ///
    /// # Errors
    /// The cluster failed, or the value is too large.
    pub async fn put(&self, parts: &[&str], value: &V) -> Result<u64, SharedError> {
        let body = value.encode()?;
        self.seam.put(self.bucket, self.key(parts), body).await
    }

    /// Write `value` as record `parts` if it is still at `revision` (0: absent or deleted);
    /// the new revision.
    ///
    /// # Errors
    /// [`SharedErrorKind::Conflict`] when another write came first; the cluster failed, or
    /// the value is too large.
    pub async fn update(
        &self,
        parts: &[&str],
        value: &V,
        revision: u64,
    ) -> Result<u64, SharedError> {
        let body = value.encode()?;
        self.seam
            .update(self.bucket, self.key(parts), body, revision)
            .await
    }

    /// Delete record `parts`.
    ///
    /// # Errors
    /// The cluster failed.
    pub async fn delete(&self, parts: &[&str]) -> Result<(), SharedError> {
        self.seam.delete(self.bucket, self.key(parts)).await
    }

    /// Delete record `parts` and its history.
    ///
    /// # Errors
    /// The cluster failed.
    pub async fn purge(&self, parts: &[&str]) -> Result<(), SharedError> {
        self.seam.purge(self.bucket, self.key(parts)).await
    }

    /// The key parts of every record of this kind.
    ///
    /// # Errors
    /// The cluster failed.
    pub async fn keys(&self) -> Result<Vec<Vec<String>>, SharedError> {
        let prefix = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}.", self.prefix)
        };
        Ok(self
            .seam
            .keys(self.bucket, prefix)
            .await?
            .iter()
            .filter_map(|k| parts_of(self.prefix, k))
            .collect())
    }

    /// Every record of this kind, then each change ([`Replicated::watch`]).
    pub fn watch(&self) -> Watch<V> {
        let prefix = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}.", self.prefix)
        };
        Watch {
            rx: self.seam.watch(self.bucket, prefix),
            prefix: self.prefix,
            bucket: self.bucket.name,
            _v: PhantomData,
        }
    }
}

#[cfg(test)]
#[path = "shared_tests.rs"]
pub(crate) mod tests;
