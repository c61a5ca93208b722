#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The seam's typed layer over an in-memory fake of the cluster's buckets ([`MemReplicated`],
//! the fake the domain modules' tests use too).

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::*;

/// The cluster's buckets in memory: one revision counter per bucket, as JetStream has.
#[derive(Default)]
pub struct MemReplicated {
    state: Mutex<MemState>,
    /// Fails every operation as unavailable while set.
    pub down: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct MemState {
    /// (bucket, key) → (value or delete marker, revision).
    records: BTreeMap<(&'static str, String), (Option<Bytes>, u64)>,
    revisions: BTreeMap<&'static str, u64>,
    watchers: Vec<Watcher>,
}

/// A watch: its bucket, its key prefix, where its changes go.
type Watcher = (&'static str, String, mpsc::Sender<Watched<String, Bytes>>);

impl MemReplicated {
    fn check(&self) -> Result<(), SharedError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(SharedError::unavailable("the cluster is not reachable"));
        }
        Ok(())
    }

    fn write(&self, bucket: Bucket, key: String, value: Option<Bytes>) -> u64 {
        let mut g = self.state.lock().unwrap();
        let rev = {
            let r = g.revisions.entry(bucket.name).or_insert(0);
            *r += 1;
            *r
        };
        g.records
            .insert((bucket.name, key.clone()), (value.clone(), rev));
        g.watchers.retain(|(b, prefix, tx)| {
            if *b != bucket.name || !key.starts_with(prefix.as_str()) {
                return !tx.is_closed();
            }
            let w = match &value {
                Some(v) => Watched::Put {
                    key: key.clone(),
                    value: v.clone(),
                    revision: rev,
                },
                None => Watched::Removed {
                    key: key.clone(),
                    revision: rev,
                },
            };
            tx.try_send(w).is_ok()
        });
        rev
    }
}

#[async_trait]
impl Replicated for MemReplicated {
    fn node(&self) -> &str {
        "mem"
    }

    fn healthy(&self) -> bool {
        self.check().is_ok()
    }

    async fn entry(&self, bucket: Bucket, key: String) -> Result<Entry<Bytes>, SharedError> {
        self.check()?;
        let g = self.state.lock().unwrap();
        Ok(match g.records.get(&(bucket.name, key)) {
            None => Entry::Absent,
            Some((None, r)) => Entry::Removed(*r),
            Some((Some(v), r)) => Entry::Present(Versioned {
                value: v.clone(),
                revision: *r,
            }),
        })
    }

    async fn put(&self, bucket: Bucket, key: String, value: Bytes) -> Result<u64, SharedError> {
        self.check()?;
        Ok(self.write(bucket, key, Some(value)))
    }

    async fn update(
        &self,
        bucket: Bucket,
        key: String,
        value: Bytes,
        revision: u64,
    ) -> Result<u64, SharedError> {
        self.check()?;
        let now = {
            let g = self.state.lock().unwrap();
            match g.records.get(&(bucket.name, key.clone())) {
                None => 0,
                // A deleted record may be created again (revision 0), as JetStream allows.
                Some((None, _)) if revision == 0 => 0,
                Some((_, r)) => *r,
            }
        };
        if now != revision {
            return Err(SharedError::new(
                SharedErrorKind::Conflict,
                format!("{key}: at revision {now}, not {revision}"),
            ));
        }
        Ok(self.write(bucket, key, Some(value)))
    }

    async fn delete(&self, bucket: Bucket, key: String) -> Result<(), SharedError> {
        self.check()?;
        self.write(bucket, key, None);
        Ok(())
    }

    async fn purge(&self, bucket: Bucket, key: String) -> Result<(), SharedError> {
        self.delete(bucket, key).await
    }

    async fn keys(&self, bucket: Bucket, prefix: String) -> Result<Vec<String>, SharedError> {
        self.check()?;
        let g = self.state.lock().unwrap();
        Ok(g.records
            .iter()
            .filter(|((b, k), (v, _))| *b == bucket.name && k.starts_with(&prefix) && v.is_some())
            .map(|((_, k), _)| k.clone())
            .collect())
    }

    fn watch(&self, bucket: Bucket, prefix: String) -> mpsc::Receiver<Watched<String, Bytes>> {
        let (tx, rx) = mpsc::channel(1024);
        let mut g = self.state.lock().unwrap();
        let _ = tx.try_send(Watched::Started);
        for ((b, k), (v, r)) in &g.records {
            if *b == bucket.name && k.starts_with(&prefix) {
                let _ = tx.try_send(match v {
                    Some(v) => Watched::Put {
                        key: k.clone(),
                        value: v.clone(),
                        revision: *r,
                    },
                    None => Watched::Removed {
                        key: k.clone(),
                        revision: *r,
                    },
                });
            }
        }
        g.watchers.push((bucket.name, prefix, tx));
        rx
    }
}

const B: Bucket = Bucket {
    name: "weft_test",
    max_age: Duration::ZERO,
    description: "test",
    wait: Duration::from_secs(1),
};

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Note {
    text: String,
}

impl Payload for Note {}

#[tokio::test]
async fn typed_records_round_trip_with_revisions_and_conflicts() {
    let seam: Arc<dyn Replicated> = Arc::new(MemReplicated::default());
    let notes: Shared<Note> = Shared::new(seam.clone(), B, "note");
    let n = |t: &str| Note { text: t.into() };
    assert_eq!(notes.entry(&["a b"]).await.unwrap(), Entry::Absent);
    let r1 = notes.update(&["a b"], &n("one"), 0).await.unwrap();
    // A second create loses: the record exists.
    let e = notes.update(&["a b"], &n("two"), 0).await.unwrap_err();
    assert_eq!(e.kind(), SharedErrorKind::Conflict);
    // A write naming a stale revision loses too.
    let r2 = notes.update(&["a b"], &n("two"), r1).await.unwrap();
    let e = notes.update(&["a b"], &n("three"), r1).await.unwrap_err();
    assert_eq!(e.kind(), SharedErrorKind::Conflict);
    assert_eq!(
        notes.get(&["a b"]).await.unwrap(),
        Some(Versioned {
            value: n("two"),
            revision: r2
        })
    );
    // Stored as JSON under the encoded key.
    let raw = seam.entry(B, "note.a=20b".into()).await.unwrap();
    assert_eq!(
        raw.value().unwrap().value,
        Bytes::from_static(br#"{"text":"two"}"#)
    );
    notes.delete(&["a b"]).await.unwrap();
    let gone = notes.entry(&["a b"]).await.unwrap();
    assert!(matches!(gone, Entry::Removed(r) if r > r2), "{gone:?}");
    // A deleted record may be created again.
    notes.update(&["a b"], &n("again"), 0).await.unwrap();
    notes.put(&["x", "y.z"], &n("two parts")).await.unwrap();
    let mut keys = notes.keys().await.unwrap();
    keys.sort();
    assert_eq!(
        keys,
        vec![vec!["a b".to_string()], vec!["x".into(), "y.z".into()]]
    );
    // Text and bytes are stored as they are.
    let text: Shared<String> = Shared::new(seam.clone(), B, "t");
    text.put(&["k"], &"once".to_string()).await.unwrap();
    assert_eq!(
        seam.entry(B, "t.k".into())
            .await
            .unwrap()
            .value()
            .unwrap()
            .value,
        Bytes::from_static(b"once")
    );
}

#[tokio::test]
async fn a_watch_sees_the_current_records_then_each_change() {
    let seam: Arc<dyn Replicated> = Arc::new(MemReplicated::default());
    let notes: Shared<Note> = Shared::new(seam.clone(), B, "note");
    let other: Shared<Note> = Shared::new(seam.clone(), B, "other");
    notes.put(&["a"], &Note { text: "1".into() }).await.unwrap();
    let mut w = notes.watch();
    assert_eq!(w.next().await, Some(Watched::Started));
    assert!(matches!(w.next().await, Some(Watched::Put { key, .. }) if key == ["a"]));
    other.put(&["b"], &Note { text: "x".into() }).await.unwrap();
    // Undecodable values are skipped.
    seam.put(B, "note.bad".into(), Bytes::from_static(b"{"))
        .await
        .unwrap();
    notes.delete(&["a"]).await.unwrap();
    assert!(matches!(w.next().await, Some(Watched::Removed { key, .. }) if key == ["a"]));
}

#[test]
fn key_parts_round_trip() {
    for s in ["", "a.b c", "telegram.bot2", "ü", "=00"] {
        assert_eq!(unkey_part(&key_part(s)).as_deref(), Some(s), "{s}");
    }
    assert_eq!(key_part("a.b c"), "a=2Eb=20c");
    assert_ne!(key_part("a.b"), key_part("a=2Eb"));
    assert_eq!(unkey_part("=ZZ"), None);
    assert_eq!(
        SharedError::unavailable("NATS did not answer").to_string(),
        "NATS did not answer"
    );
}
