#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use crate::store::shared::tests::MemReplicated;

#[test]
fn keys_round_trip_and_only_documents_are_shared() {
    for (scope, rel) in [
        (Scope::Agent, "MEMORY.md"),
        (Scope::Agent, "memory/2026-11/a b.md"),
        (Scope::User("telegram-42"), "USER.md"),
        (Scope::User("http-x.y"), "memory/n.md"),
    ] {
        let k = key_of(scope, rel);
        let (user, r) = parse_key(&k).unwrap_or_default();
        assert_eq!(r, rel);
        match scope {
            Scope::Agent => assert!(user.is_none()),
            Scope::User(u) => assert_eq!(user.as_deref(), Some(u)),
        }
    }
    assert_ne!(
        key_of(Scope::Agent, "a/b.md"),
        key_of(Scope::Agent, "a.b.md")
    );
    assert!(is_shared("USER.md") && is_shared("./MEMORY.md") && is_shared("memory/x.md"));
    assert!(!is_shared("notes.md") && !is_shared("memory/../x.md") && !is_shared("memory/x.txt"));
    // The keys the cluster has always used.
    assert_eq!(
        key_of(Scope::Agent, "memory/a b.md"),
        "ws.memory=2Fa=20b=2Emd"
    );
    assert_eq!(
        key_of(Scope::User("telegram-42"), "USER.md"),
        "user.telegram-42.USER=2Emd"
    );
}

/// A write that lost a race with another node is told apart by its kind, the local copy
/// goes back to the cluster's, and the next write from that revision goes through.
#[test]
fn a_write_over_another_nodes_change_is_a_typed_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let ws = Arc::new(Workspace::open(dir.path()).unwrap());
    let seam: Arc<dyn Replicated> = Arc::new(MemReplicated::default());
    let docs = MemoryDocs::shared(seam.clone(), ws.clone());
    let other = Shared::<Vec<u8>>::new(seam, DOCS_BUCKET, "");
    let p = docs.begin(&ws, Scope::Agent, "MEMORY.md").unwrap().unwrap();
    p.finish(b"mine").unwrap();
    let p = docs.begin(&ws, Scope::Agent, "MEMORY.md").unwrap().unwrap();
    // Another node writes in between.
    let now = shared::wait(other.get(&["ws", "MEMORY.md"]))
        .unwrap()
        .unwrap();
    shared::wait(other.update(&["ws", "MEMORY.md"], &b"theirs".to_vec(), now.revision)).unwrap();
    std::fs::write(dir.path().join("MEMORY.md"), "mine, changed").unwrap();
    let e = p.finish(b"mine, changed").unwrap_err();
    assert!(
        matches!(e, DocError::Conflict(ref r) if r == "MEMORY.md"),
        "{e:?}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("MEMORY.md")).unwrap(),
        "theirs"
    );
    assert!(docs.writes() > 0, "the index is told of the restored copy");
    let t = ToolError::from(e);
    assert!(t.to_string().contains("changed on another node"), "{t}");
    let p = docs.begin(&ws, Scope::Agent, "MEMORY.md").unwrap().unwrap();
    p.finish(b"after").unwrap();
    // Too large: refused by its kind, nothing written.
    let p = docs.begin(&ws, Scope::Agent, "MEMORY.md").unwrap().unwrap();
    let big = vec![b'x'; MAX_SHARED_BYTES + 1];
    assert!(matches!(p.finish(&big), Err(DocError::TooLarge { .. })));
}
