#![allow(clippy::unwrap_used, clippy::expect_used)]

use clawft_channel_core::{ChannelId, ChatId, OutboundKind, PlatformEventId, UserId};

use super::*;

fn ev(id: &str) -> InboundEvent {
    InboundEvent {
        channel: ChannelId::new("http"),
        chat: ChatId::new("c1"),
        thread: None,
        sender: UserId::new("u"),
        sender_name: None,
        event_id: PlatformEventId::new(id),
        content: format!("hello {id}"),
        received_at_ms: 1,
        attachments: Vec::new(),
        origin: clawft_channel_core::Origin::User,
    }
}

fn both(f: impl Fn(Store)) {
    f(Store::memory());
    let dir = tempfile::tempdir().unwrap();
    f(Store::open(&dir.path().join("db"), 1 << 20).unwrap());
}

#[test]
fn journal_dedupes_and_recovers_in_order() {
    both(|s| {
        let key = SessionKey::parse("http:c1").unwrap();
        let JournalOutcome::New(a) = s.journal_inbound(&ev("a"), &key).unwrap() else {
            panic!("a not new")
        };
        assert!(matches!(
            s.journal_inbound(&ev("a"), &key).unwrap(),
            JournalOutcome::Duplicate
        ));
        let JournalOutcome::New(_b) = s.journal_inbound(&ev("b"), &key).unwrap() else {
            panic!("b not new")
        };
        let pending = s.pending_inbound().unwrap();
        let ids: Vec<_> = pending
            .iter()
            .map(|e| e.event.as_ref().unwrap().event_id.as_str().to_string())
            .collect();
        assert_eq!(ids, ["a", "b"]);

        s.begin_turn(&a, &Message::user("hello a")).unwrap();
        let pending = s.pending_inbound().unwrap();
        assert_eq!(pending[0].state, InboxState::Started);

        let reply = OutboundMessage {
            id: "r1".into(),
            channel: ChannelId::new("http"),
            chat: ChatId::new("c1"),
            thread: None,
            in_reply_to: Some(PlatformEventId::new("a")),
            body: clawft_channel_core::OutboundBody::text_of(OutboundKind::Final, "hi".into()),
            attachments: Vec::new(),
        };
        s.finish_turn(&key, Some(&a), &[Message::assistant("hi")], Some(&reply))
            .unwrap();
        assert_eq!(s.pending_inbound().unwrap().len(), 1);
        // Still deduped after done.
        assert!(matches!(
            s.journal_inbound(&ev("a"), &key).unwrap(),
            JournalOutcome::Duplicate
        ));
        assert_eq!(s.pending_outbound().unwrap(), vec![reply]);
        s.outbound_done("r1").unwrap();
        assert!(s.pending_outbound().unwrap().is_empty());

        let t = s.load_transcript(&key).unwrap();
        assert_eq!(t, vec![Message::user("hello a"), Message::assistant("hi")]);
        assert_eq!(s.sessions().unwrap().len(), 1);
        assert!(s.clear_session(&key).unwrap());
        assert!(s.load_transcript(&key).unwrap().is_empty());
        assert!(!s.clear_session(&key).unwrap());
    });
}

#[test]
fn transcript_order_survives_many_appends_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let key = SessionKey::parse("http:x").unwrap();
    {
        let s = Store::open(&dir.path().join("db"), 1 << 20).unwrap();
        for i in 0..300 {
            s.append_messages(&key, &[Message::user(format!("m{i}"))])
                .unwrap();
        }
        s.flush().unwrap();
    }
    let s = Store::open(&dir.path().join("db"), 1 << 20).unwrap();
    let t = s.load_transcript(&key).unwrap();
    assert_eq!(t.len(), 300);
    assert_eq!(t[299].content, "m299");
    assert_eq!(t[256].content, "m256");
}

/// A [`Kv`] over memory that counts backend flushes (each a little slow, like an fsync) and
/// fails writes while `full` is set, like a full disk.
#[derive(Default)]
struct Counting {
    mem: MemKv,
    flushes: std::sync::atomic::AtomicU64,
    full: std::sync::atomic::AtomicBool,
    /// Ops applied and then made durable by a flush.
    durable: std::sync::Mutex<u64>,
    applied: std::sync::atomic::AtomicU64,
}

impl Kv for Counting {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.mem.get(key)
    }
    fn scan_prefix(&self, prefix: &[u8]) -> Result<kv::Pairs, StoreError> {
        self.mem.scan_prefix(prefix)
    }
    fn apply(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        if self.full.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::Io {
                path: "test".into(),
                source: std::io::Error::from_raw_os_error(28),
            });
        }
        self.applied
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.mem.apply(ops)
    }
    fn flush(&self) -> Result<(), StoreError> {
        if self.full.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::Io {
                path: "test".into(),
                source: std::io::Error::from_raw_os_error(28),
            });
        }
        let upto = self.applied.load(std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(5));
        self.flushes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut d = self.durable.lock().unwrap();
        *d = (*d).max(upto);
        Ok(())
    }
    fn next_id(&self) -> Result<u64, StoreError> {
        self.mem.next_id()
    }
    fn size_on_disk(&self) -> u64 {
        0
    }
}

#[test]
fn concurrent_flushes_are_all_durable_and_share_backend_flushes() {
    let kv = Arc::new(Counting::default());
    let s = Store::with_kv(kv.clone());
    let n = 64;
    let barrier = Arc::new(std::sync::Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let (s, kv, barrier) = (s.clone(), kv.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                s.state_put("t", &format!("k{i}"), Some("v")).unwrap();
                // Durable after return: the backend flushed after this caller's write.
                kv.durable.lock().unwrap().to_owned()
            })
        })
        .collect();
    for t in threads {
        let durable_after = t.join().unwrap();
        assert!(durable_after >= 1);
    }
    let applied = kv.applied.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(applied, n as u64);
    assert_eq!(*kv.durable.lock().unwrap(), applied, "every write durable");
    let flushes = kv.flushes.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        flushes < n as u64,
        "{n} concurrent callers took {flushes} backend flushes"
    );
    assert_eq!(s.state_scan("t").unwrap().len(), n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_flush_waiters_are_durable_and_coalesced() {
    let kv = Arc::new(Counting::default());
    let s = Store::with_kv(kv.clone());
    let key = SessionKey::parse("http:c1").unwrap();
    let mut tasks = Vec::new();
    for i in 0..50 {
        let (s, kv, key) = (s.clone(), kv.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            s.append_messages(&key, &[Message::user(format!("m{i}"))])
                .unwrap();
            let mine = kv.applied.load(std::sync::atomic::Ordering::SeqCst);
            s.flush_async().await.unwrap();
            assert!(*kv.durable.lock().unwrap() >= mine);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(kv.flushes.load(std::sync::atomic::Ordering::SeqCst) < 50);
}

#[test]
fn a_full_disk_degrades_the_store_and_it_recovers_when_space_returns() {
    let kv = Arc::new(Counting::default());
    let s = Store::with_kv(kv.clone());
    s.state_put("t", "a", Some("1")).unwrap();
    assert!(s.health().is_ok());
    kv.full.store(true, std::sync::atomic::Ordering::SeqCst);
    let e = s.state_put("t", "b", Some("2")).unwrap_err();
    assert_eq!(e.kind(), "no_space", "{e}");
    let h = s.health();
    assert_eq!(h.status, "degraded");
    assert!(h.detail.unwrap().contains("No space left"));
    assert_eq!(h.errors.get("no_space"), Some(&1));
    kv.full.store(false, std::sync::atomic::Ordering::SeqCst);
    // The flusher retries every second: healthy again without a new write.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !s.health().is_ok() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(s.health().is_ok());
    s.state_put("t", "b", Some("2")).unwrap();
    assert_eq!(s.state_get("t", "b").unwrap().as_deref(), Some("2"));
}

fn five_sessions(dir: &std::path::Path) {
    let s = Store::open(dir, 1 << 20).unwrap();
    for i in 0..5 {
        let key = SessionKey::parse(&format!("http:c{i}")).unwrap();
        s.append_messages(&key, &[Message::user(format!("hello {i} ").repeat(200))])
            .unwrap();
    }
    s.flush().unwrap();
    drop(s);
}

#[test]
fn values_carry_a_checksum_and_a_flipped_byte_is_reported() {
    let s = Store::memory();
    let key = SessionKey::parse("http:c1").unwrap();
    s.append_messages(&key, &[Message::user("hello")]).unwrap();
    let (k, mut v) = s.kv.scan_prefix(b"t\0").unwrap().remove(0);
    assert_eq!(v[0], TAG);
    let last = v.len() - 2;
    v[last] ^= 0x20;
    s.kv.apply(vec![Op::Put(k, v)]).unwrap();
    let e = s.load_transcript(&key).unwrap_err();
    assert!(e.to_string().contains("checksum mismatch"), "{e}");
    let r = backup::check(&s).unwrap();
    assert!(!r.ok);
    assert_eq!(r.damaged, 1);
}

#[test]
fn a_store_that_lost_sessions_is_detected_and_quarantined_or_refused() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("store");
    five_sessions(&dir);
    // Simulate what sled does with a damaged log: it opens with what it could read.
    {
        let s = Store::open(&dir, 1 << 20).unwrap();
        assert_eq!(s.sessions().unwrap().len(), 5);
        let ops: Vec<Op> =
            s.kv.scan_prefix(b"s\0")
                .unwrap()
                .into_iter()
                .take(2)
                .map(|(k, _)| Op::Del(k))
                .collect();
        s.kv.apply(ops).unwrap();
        s.kv.flush().unwrap();
    }
    let e = Store::open(&dir, 1 << 20).err().unwrap();
    assert!(matches!(e, StoreError::Damaged { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("3 sessions could be read where 5 were recorded"),
        "{e}"
    );
    let s = Store::open_with(&dir, 1 << 20, OnCorruption::Quarantine).unwrap();
    assert_eq!(s.sessions().unwrap().len(), 0, "a fresh store");
    let alert = s.health().alert.unwrap();
    assert!(alert.contains(".corrupt-"), "{alert}");
    let aside: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("store.corrupt-")
        })
        .collect();
    assert_eq!(aside.len(), 1);
    assert!(aside[0].path().join("db").exists());
}

#[test]
fn a_schema_0_store_opens_and_migrates_and_a_newer_one_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("store");
    let key = SessionKey::parse("http:c1").unwrap();
    // What today's code wrote: bare JSON values, no manifest, no sidecar.
    {
        let kv = kv::SledKv::open(&dir, 1 << 20).unwrap();
        let meta = SessionMeta {
            key: key.clone(),
            created_ms: 1,
            updated_ms: 1,
            next_seq: 1,
        };
        let mut tk = transcript_prefix(&key);
        tk.extend(0u64.to_be_bytes());
        kv.apply(vec![
            Op::Put(session_meta_key(&key), serde_json::to_vec(&meta).unwrap()),
            Op::Put(tk, serde_json::to_vec(&Message::user("old")).unwrap()),
        ])
        .unwrap();
        kv.flush().unwrap();
    }
    {
        let s = Store::open(&dir, 1 << 20).unwrap();
        assert_eq!(s.load_transcript(&key).unwrap(), vec![Message::user("old")]);
        assert_eq!(s.manifest().unwrap().schema, SCHEMA_VERSION);
        s.append_messages(&key, &[Message::user("new")]).unwrap();
        s.flush().unwrap();
    }
    let s = Store::open(&dir, 1 << 20).unwrap();
    assert_eq!(s.load_transcript(&key).unwrap().len(), 2);
    drop(s);
    // A newer weft's store.
    let sc = dir.join(integrity::SIDECAR);
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&sc).unwrap()).unwrap();
    v["schema"] = serde_json::json!(SCHEMA_VERSION + 1);
    std::fs::write(&sc, v.to_string()).unwrap();
    let e = Store::open_with(&dir, 1 << 20, OnCorruption::Quarantine)
        .err()
        .unwrap();
    assert!(
        e.to_string()
            .contains("was written by a newer weft (schema 2"),
        "{e}"
    );
    assert!(e.to_string().contains("upgrade weft or restore a backup"));
}

#[test]
fn leftover_snapshot_is_removed_and_garbage_conf_is_quarantined() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("store");
    five_sessions(&dir);
    std::fs::write(dir.join("snap.0000000000001234.generating"), b"half").unwrap();
    let s = Store::open(&dir, 1 << 20).unwrap();
    assert_eq!(s.sessions().unwrap().len(), 5);
    drop(s);
    assert!(!dir.join("snap.0000000000001234.generating").exists());
    std::fs::write(dir.join("conf"), b"\x00garbage\xff not a sled config").unwrap();
    let e = Store::open(&dir, 1 << 20).err().unwrap();
    assert!(matches!(e, StoreError::Damaged { .. }), "{e}");
    let s = Store::open_with(&dir, 1 << 20, OnCorruption::Quarantine).unwrap();
    assert!(s.health().alert.is_some());
    assert_eq!(s.sessions().unwrap().len(), 0);
}

#[test]
fn backup_and_restore_bring_the_sessions_back() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("store");
    five_sessions(&dir);
    let file = d.path().join("b.jsonl");
    {
        let s = Store::open(&dir, 1 << 20).unwrap();
        assert_eq!(backup::backup(&s, &file).unwrap().records, 11);
        let key = SessionKey::parse("http:c0").unwrap();
        s.clear_session(&key).unwrap();
        assert_eq!(s.sessions().unwrap().len(), 4);
    }
    let aside = backup::restore(&file, &dir, 1 << 20)
        .unwrap()
        .previous_store
        .unwrap();
    assert!(aside.join("db").exists());
    let s = Store::open(&dir, 1 << 20).unwrap();
    assert_eq!(s.sessions().unwrap().len(), 5);
    assert!(backup::check(&s).unwrap().ok);
    drop(s);
    // A cut backup is refused.
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, &text[..text.len() / 2]).unwrap();
    assert!(backup::restore(&file, &dir, 1 << 20).is_err());
}

#[test]
fn clearing_sessions_while_the_high_water_mark_is_recorded_never_deadlocks() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(&d.path().join("store"), 1 << 20).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let s2 = s.clone();
    std::thread::spawn(move || {
        // Past the flusher's 5 s record tick, with deletions holding the mark most of the time.
        let until = std::time::Instant::now() + RECORD_EVERY + std::time::Duration::from_secs(1);
        let mut i = 0u64;
        while std::time::Instant::now() < until {
            let key = SessionKey::parse(&format!("http:c{}", i % 4)).unwrap();
            s2.append_messages(&key, &[Message::user("x")]).unwrap();
            s2.clear_session(&key).unwrap();
            i += 1;
        }
        let _ = tx.send(i);
    });
    let done = rx.recv_timeout(std::time::Duration::from_secs(60));
    assert!(done.is_ok(), "clear_session and the flusher deadlocked");
    assert!(s.health().is_ok());
}

#[test]
fn a_restart_with_nothing_new_leaves_the_sidecar_as_it_is_and_a_new_session_raises_it() {
    use std::os::unix::fs::MetadataExt as _;
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("store");
    five_sessions(&dir);
    let sc = dir.join(integrity::SIDECAR);
    let sidecar = |sc: &std::path::Path| {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(sc).unwrap()).unwrap();
        (
            v["sessions"].as_u64().unwrap(),
            std::fs::metadata(sc).unwrap().ino(),
        )
    };
    drop(Store::open(&dir, 1 << 20).unwrap());
    let before = sidecar(&sc);
    let text = std::fs::read(&sc).unwrap();
    drop(Store::open(&dir, 1 << 20).unwrap());
    // Not rewritten: the same file (inode), the same bytes (its `updated_ms` too).
    assert_eq!(sidecar(&sc), before);
    assert_eq!(std::fs::read(&sc).unwrap(), text);
    assert_eq!(before.0, 5);

    let s = Store::open(&dir, 1 << 20).unwrap();
    let key = SessionKey::parse("http:c6").unwrap();
    s.append_messages(&key, &[Message::user("six")]).unwrap();
    s.flush().unwrap();
    drop(s);
    drop(Store::open(&dir, 1 << 20).unwrap());
    assert_eq!(sidecar(&sc).0, 6);
}

#[test]
fn reopening_neither_grows_the_log_by_a_segment_nor_loses_what_it_holds() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("store");
    five_sessions(&dir);
    let len = || std::fs::metadata(dir.join("db")).unwrap().len();
    drop(Store::open(&dir, 1 << 20).unwrap());
    let first = len();
    for i in 0..3 {
        let s = Store::open(&dir, 1 << 20).unwrap();
        assert_eq!(s.sessions().unwrap().len(), 5 + i);
        let key = SessionKey::parse(&format!("http:more{i}")).unwrap();
        s.append_messages(&key, &[Message::user(format!("more {i}"))])
            .unwrap();
        s.flush().unwrap();
    }
    let s = Store::open(&dir, 1 << 20).unwrap();
    assert_eq!(s.sessions().unwrap().len(), 8);
    let key = SessionKey::parse("http:more2").unwrap();
    assert_eq!(
        s.load_transcript(&key).unwrap(),
        vec![Message::user("more 2")]
    );
    drop(s);
    // sled's segments are 512 KiB: zeroing the active one's tail at every open grew the file
    // to a whole segment even for a few KB of sessions.
    assert!(len() < 256 * 1024, "{first} -> {}", len());
}

/// The event the cluster's partition owners acknowledge on: it moves after a turn's end, a
/// delivered reply and a record of another node, and not after other writes.
#[test]
fn the_settled_event_moves_when_a_message_may_have_settled() {
    let s = Store::memory();
    let mut rx = s.settled();
    let session = SessionKey::parse("http:c1").unwrap();
    let JournalOutcome::New(entry) = s.journal_inbound(&ev("e1"), &session).unwrap() else {
        panic!("not new")
    };
    s.begin_turn(&entry, &Message::user("hello e1")).unwrap();
    s.state_put("ns", "k", Some("v")).unwrap();
    assert!(
        !rx.has_changed().unwrap(),
        "moved on writes that settle nothing"
    );
    s.finish_turn(&session, Some(&entry), &[Message::assistant("hi")], None)
        .unwrap();
    assert!(rx.has_changed().unwrap(), "a turn's end");
    rx.mark_unchanged();
    s.outbound_done("o1").unwrap();
    assert!(rx.has_changed().unwrap(), "a reply delivered");
    rx.mark_unchanged();
    s.apply_remote(
        &crate::store::replica::Record::Delivered("o2".into()),
        ("applied", "0"),
        1,
    )
    .unwrap();
    assert!(rx.has_changed().unwrap(), "a record of another node");
}

/// A store holding at least one record of every kind (usage and compaction windows included).
fn every_kind(dir: &std::path::Path) -> Store {
    let s = Store::open(dir, 1 << 20).unwrap();
    let key = SessionKey::parse("http:c1").unwrap();
    let msgs: Vec<Message> = (0..51).map(|i| Message::user(format!("m{i}"))).collect();
    s.append_messages(&key, &msgs).unwrap();
    let JournalOutcome::New(_) = s.journal_inbound(&ev("a"), &key).unwrap() else {
        panic!("a not new")
    };
    s.enqueue_outbound(&OutboundMessage {
        id: "r1".into(),
        channel: ChannelId::new("http"),
        chat: ChatId::new("c1"),
        thread: None,
        in_reply_to: None,
        body: clawft_channel_core::OutboundBody::text_of(OutboundKind::Final, "hi".into()),
        attachments: Vec::new(),
    })
    .unwrap();
    s.state_put("ns", "k", Some("v")).unwrap();
    s.record_usage(&[usage::UsageRow {
        day: "2026-12-07".into(),
        session: key.to_string(),
        user: "u".into(),
        model: "m".into(),
        calls: 3,
        input_tokens: 100,
        output_tokens: 20,
        ..Default::default()
    }])
    .unwrap();
    let _durable_at_flush_below = s
        .put_compaction(
            &key,
            &window::Compaction {
                summary: "the summary".into(),
                from_seq: 43,
                ..Default::default()
            },
        )
        .unwrap();
    s.flush().unwrap();
    s
}

#[test]
fn a_backup_holds_every_kind_of_record_and_restore_checks_it() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("store");
    let file = d.path().join("b.jsonl");
    let before;
    {
        let s = every_kind(&dir);
        before = backup::check(&s).unwrap();
        // Every kind the store knows has a record here, so none can be left out below.
        for kind in backup::Kind::ALL {
            assert!(
                before.counts.get(kind.name()).copied().unwrap_or(0) > 0,
                "no {} record written: extend every_kind()",
                kind.name()
            );
        }
        assert!(
            !before.counts.contains_key("unknown"),
            "{:?}",
            before.counts
        );
        let n = backup::backup(&s, &file).unwrap();
        assert_eq!(n.counts["usage"], 1);
        assert_eq!(n.counts["window"], 1);
        assert_eq!(n.counts["messages"], 51);
    }
    let done = backup::restore(&file, &dir, 1 << 20).unwrap();
    assert_eq!(done.counts.counts["usage"], 1);
    assert!(
        done.counts.sentence().contains("1 window"),
        "{}",
        done.counts.sentence()
    );
    let s = Store::open(&dir, 1 << 20).unwrap();
    let after = backup::check(&s).unwrap();
    assert_eq!(
        before.counts, after.counts,
        "store check before and after disagree"
    );
    let key = SessionKey::parse("http:c1").unwrap();
    assert_eq!(s.compaction(&key).unwrap().unwrap().from_seq, 43);
    assert_eq!(s.usage_rows("2026-12-01").unwrap()[0].input_tokens, 100);
    drop(s);

    // A backup whose manifest disagrees with its records is refused before anything moves.
    let text = std::fs::read_to_string(&file).unwrap();
    let (body, trailer) = text.trim_end().rsplit_once('\n').unwrap();
    let forged = trailer.replace("\"usage\":1", "\"usage\":2");
    assert_ne!(forged, trailer);
    // Keep the checksum right: only the counts lie.
    std::fs::write(&file, format!("{body}\n{forged}\n")).unwrap();
    let e = backup::restore(&file, &dir, 1 << 20).unwrap_err();
    assert!(
        e.to_string().contains("2 usage records but it holds 1"),
        "{e}"
    );
}
