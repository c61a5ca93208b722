//! The chat platform adapters, each built through its platform's contract from its
//! `channels.*` settings, the store-backed [`StateStore`] they keep offsets in (in cluster
//! mode the resume keys in the cluster, behind the connection's lease), and the HTTP chats'
//! mailboxes in the store ([`StoreMail`]). Knows no platform: a platform this build has no
//! cargo feature for is reported by its contract when built.

use std::sync::Arc;

use clawft_channel_core::spec::{Handles, PairedCheck};
use clawft_channel_core::{Channel, StateError, StateStore};
use clawft_channel_http::{MailEntry, MailStore};

use crate::config::Config;
use crate::store::Store;

/// Forward every canvas change announced in `changes` (from [`Store::changes`]) to the
/// control UI's open pages, until the store is closed.
#[cfg(feature = "ui")]
pub async fn canvas_to_web(
    mut changes: tokio::sync::broadcast::Receiver<crate::store::Change>,
    web: Arc<clawft_channel_http::ui::WebChannel>,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let c = match changes.recv().await {
            Ok(c) => c,
            Err(RecvError::Lagged(_)) => continue,
            Err(RecvError::Closed) => return,
        };
        if c.ns != crate::tools::canvas::NS {
            continue;
        }
        let Ok(key) = crate::types::SessionKey::parse(&c.key) else {
            continue;
        };
        let (channel, chat, _) = key.route();
        web.canvas_changed(key.as_str(), channel, chat, &c.detail);
    }
}

/// An adapter's durable state: values under the namespace `chan:<id>` in the store.
pub struct StoreState {
    store: Store,
    ns: String,
}

impl StoreState {
    /// State of channel `id`.
    pub fn new(store: Store, id: &str) -> Self {
        Self {
            store,
            ns: format!("chan:{id}"),
        }
    }
}

impl StateStore for StoreState {
    fn get(&self, key: &str) -> Option<String> {
        self.store.state_get(&self.ns, key).ok().flatten()
    }
    fn put(&self, key: &str, value: &str) -> Result<(), StateError> {
        self.store
            .state_put(&self.ns, key, Some(value))
            .map_err(state_error)
    }
    fn remove(&self, key: &str) -> Result<(), StateError> {
        self.store
            .state_put(&self.ns, key, None)
            .map_err(state_error)
    }
}

/// A store failure as the channels' state error.
fn state_error(e: impl std::fmt::Display) -> StateError {
    StateError(e.to_string())
}

/// The HTTP chats' mailboxes and reply record in the store: a state namespace per chat
/// (`http-mail:<chat id in hex>`, keys are the zero-padded `seq`) and one for the replies by
/// request (`http-replies`, keyed by event id). Writes are applied at once and made durable by
/// the flush that settles the message in the outbox.
pub struct StoreMail {
    store: Store,
    /// Replies recorded since the last removal of old ones.
    recorded: std::sync::atomic::AtomicU32,
}

/// Every this many recorded replies, the ones older than [`REPLY_RECORD_KEEP_MS`] are removed
/// (a gateway that runs for months keeps a week of them, not all).
const PRUNE_EVERY: u32 = 1024;

/// State namespace of the recorded replies.
const NS_REPLIES: &str = "http-replies";
/// How long a reply stays recorded for a resent request.
pub const REPLY_RECORD_KEEP_MS: u64 = 7 * 24 * 3600 * 1000;

impl StoreMail {
    /// The mailboxes in `store`; recorded replies older than [`REPLY_RECORD_KEEP_MS`] are
    /// removed now.
    pub fn new(store: Store) -> Self {
        prune_replies(&store);
        Self {
            store,
            recorded: std::sync::atomic::AtomicU32::new(0),
        }
    }

    fn ns(chat: &str) -> String {
        use std::fmt::Write;
        let mut ns = String::from("http-mail:");
        for b in chat.as_bytes() {
            let _ = write!(ns, "{b:02x}");
        }
        ns
    }

    fn entries(&self, chat: &str) -> Result<Vec<(String, MailEntry)>, StateError> {
        let all = self
            .store
            .state_scan(&Self::ns(chat))
            .map_err(state_error)?;
        Ok(all
            .into_iter()
            .filter_map(|(k, v)| serde_json::from_str(&v).ok().map(|e| (k, e)))
            .collect())
    }
}

impl MailStore for StoreMail {
    fn append(&self, chat: &str, mut entry: MailEntry, keep: usize) -> Result<u64, StateError> {
        // One scan serves the duplicate check and the trim below (a chat's sends are
        // sequential: nothing is appended to it in between).
        let old = self.entries(chat)?;
        if let Some((_, e)) = old.iter().find(|(_, e)| e.id == entry.id) {
            return Ok(e.seq);
        }
        // Never 0: `after=0` lists everything.
        let seq = self.store.next_unique().map_err(state_error)? + 1;
        entry.seq = seq;
        let v = serde_json::to_string(&entry).map_err(state_error)?;
        let ns = Self::ns(chat);
        let key = format!("{seq:020}");
        self.store
            .state_put_unflushed(&ns, &key, Some(&v))
            .map_err(state_error)?;
        let over = (old.len() + 1).saturating_sub(keep);
        let oldest = old.iter().map(|(k, _)| k).chain(std::iter::once(&key));
        for k in oldest.take(over) {
            tracing::warn!(
                chat,
                "HTTP mailbox full: the oldest unread message is dropped"
            );
            self.store
                .state_put_unflushed(&ns, k, None)
                .map_err(state_error)?;
        }
        Ok(seq)
    }
    fn list(&self, chat: &str, after: u64, limit: usize) -> Result<Vec<MailEntry>, StateError> {
        Ok(self
            .entries(chat)?
            .into_iter()
            .map(|(_, e)| e)
            .filter(|e| e.seq > after)
            .take(limit)
            .collect())
    }
    fn ack(&self, chat: &str, upto: u64) -> Result<(), StateError> {
        let ns = Self::ns(chat);
        for (k, e) in self.entries(chat)? {
            if e.seq <= upto {
                self.store
                    .state_put_unflushed(&ns, &k, None)
                    .map_err(state_error)?;
            }
        }
        Ok(())
    }
    fn put_reply(&self, event_id: &str, entry: &MailEntry) -> Result<(), StateError> {
        use std::sync::atomic::Ordering;
        if self.recorded.fetch_add(1, Ordering::Relaxed) + 1 >= PRUNE_EVERY {
            self.recorded.store(0, Ordering::Relaxed);
            let store = self.store.clone();
            // A scan of the namespace: off the runtime's workers.
            std::thread::spawn(move || prune_replies(&store));
        }
        let v = serde_json::to_string(entry).map_err(state_error)?;
        self.store
            .state_put_unflushed(NS_REPLIES, event_id, Some(&v))
            .map_err(state_error)
    }
    fn reply(&self, event_id: &str) -> Option<MailEntry> {
        let v = self.store.state_get(NS_REPLIES, event_id).ok()??;
        serde_json::from_str(&v).ok()
    }
}

/// Remove the recorded replies older than [`REPLY_RECORD_KEEP_MS`] (and unreadable ones).
fn prune_replies(store: &Store) {
    let cutoff = clawft_channel_core::now_ms().saturating_sub(REPLY_RECORD_KEEP_MS);
    if let Ok(all) = store.state_scan(NS_REPLIES) {
        for (k, v) in all {
            let old = serde_json::from_str::<MailEntry>(&v).map_or(true, |e| e.at_ms < cutoff);
            if old {
                let _ = store.state_put_unflushed(NS_REPLIES, &k, None);
            }
        }
    }
}

/// Build the enabled chat channels. One that cannot be built is reported and left out; the
/// others (and the HTTP API) still run.
///
/// In cluster mode (`cluster`), each channel's long-lived connection runs behind its lease
/// (only on the node holding it) and keeps its resume state in the cluster; a platform whose
/// messages arrive as webhooks (WhatsApp: on every node) runs as in single-node mode.
pub fn chat_channels(
    config: &Config,
    store: &Store,
    cluster: Option<&crate::cluster::Cluster>,
) -> Vec<Arc<dyn Channel>> {
    config
        .chat_channels
        .iter()
        .filter_map(|c| chat_channel(c, store, cluster))
        .collect()
}

/// Build one chat channel through its platform's contract; `None` (reported) when it cannot
/// be built.
pub fn chat_channel(
    c: &crate::config::ChatChannelConfig,
    store: &Store,
    cluster: Option<&crate::cluster::Cluster>,
) -> Option<Arc<dyn Channel>> {
    let id = c.id();
    let state: Arc<dyn StateStore> = Arc::new(StoreState::new(store.clone(), &id));
    let paired: PairedCheck = {
        let (store, id) = (store.clone(), id.clone());
        Arc::new(move |user: &str| crate::ingress::access::is_paired(&store, &id, user))
    };
    let handles = |state: Arc<dyn StateStore>| Handles {
        account: c.account_ref(),
        shared: c.shared(),
        state,
        is_paired: paired,
    };
    let setup = c.settings.setup();
    #[cfg(feature = "cluster")]
    if let (Some(cl), intake @ clawft_channel_core::spec::Intake::Connection(_)) =
        (cluster, c.settings.intake())
    {
        // The long-lived connection runs behind its lease, its resume state in the cluster.
        use crate::cluster::{leased::LeasedChannel, state::ClusterState};
        let keys = intake.resume_keys();
        let st = Arc::new(ClusterState::new(cl.clone(), &id, keys, state));
        return match setup.build(handles(st.clone())) {
            Ok(ch) => Some(Arc::new(LeasedChannel::new(ch, cl.clone(), &id, Some(st)))),
            Err(e) => {
                tracing::error!(channel = %id, error = %e, "channel not started");
                None
            }
        };
    }
    #[cfg(not(feature = "cluster"))]
    let _ = cluster;
    match setup.build(handles(state)) {
        Ok(ch) => Some(ch),
        Err(e) => {
            tracing::error!(channel = %id, error = %e, "channel not started");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn state_survives_a_reopen() {
        let d = tempfile::tempdir().unwrap();
        {
            let s = Store::open(d.path(), 1 << 20).unwrap();
            let st = StoreState::new(s.clone(), "telegram");
            assert_eq!(st.get("offset"), None);
            st.put("offset", "42").unwrap();
            assert_eq!(StoreState::new(s, "discord").get("offset"), None);
        }
        let s = Store::open(d.path(), 1 << 20).unwrap();
        assert_eq!(
            StoreState::new(s, "telegram").get("offset").as_deref(),
            Some("42")
        );
    }
}

#[cfg(test)]
mod mail_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn entry(at_ms: u64) -> MailEntry {
        MailEntry {
            seq: 0,
            id: "m".into(),
            kind: "final".into(),
            content: "the reply".into(),
            in_reply_to: Some("e".into()),
            at_ms,
        }
    }

    /// Replies are kept a week, not for the life of the gateway: old ones go at start and every
    /// 1,024 recorded replies.
    #[test]
    fn old_reply_records_are_removed() {
        let store = Store::memory();
        let now = clawft_channel_core::now_ms();
        let mail = StoreMail::new(store.clone());
        mail.put_reply("old", &entry(now - REPLY_RECORD_KEEP_MS - 1))
            .unwrap();
        mail.put_reply("new", &entry(now)).unwrap();
        assert!(mail.reply("old").is_some());
        // A restart removes it.
        let mail = StoreMail::new(store);
        assert!(mail.reply("old").is_none());
        assert_eq!(mail.reply("new").unwrap().content, "the reply");
        // So does a long run.
        mail.put_reply("old2", &entry(now - REPLY_RECORD_KEEP_MS - 1))
            .unwrap();
        for i in 0..PRUNE_EVERY {
            mail.put_reply(&format!("r{i}"), &entry(now)).unwrap();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while mail.reply("old2").is_some() {
            assert!(std::time::Instant::now() < deadline, "never removed");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(mail.reply("r0").is_some());
    }

    /// The mailbox keeps a message sent twice once, in order, and an acknowledgement removes
    /// what was read.
    #[test]
    fn the_mailbox_keeps_order_dedupes_and_acknowledges() {
        let mail = StoreMail::new(Store::memory());
        let mut a = entry(1);
        a.id = "a".into();
        let mut b = entry(2);
        b.id = "b".into();
        let sa = mail.append("chat\u{0}x", a.clone(), 10).unwrap();
        assert_eq!(mail.append("chat\u{0}x", a, 10).unwrap(), sa);
        let sb = mail.append("chat\u{0}x", b, 10).unwrap();
        assert!(sb > sa);
        // Another chat whose id is a prefix sees nothing of it.
        assert!(mail.list("chat", 0, 10).unwrap().is_empty());
        let l = mail.list("chat\u{0}x", 0, 10).unwrap();
        assert_eq!(
            l.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        // Full (keep 2): the oldest goes.
        let mut c = entry(3);
        c.id = "c".into();
        mail.append("chat\u{0}x", c, 2).unwrap();
        let l = mail.list("chat\u{0}x", 0, 10).unwrap();
        assert_eq!(
            l.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
            ["b", "c"]
        );
        mail.ack("chat\u{0}x", sa).unwrap();
        mail.ack("chat\u{0}x", sb).unwrap();
        let l = mail.list("chat\u{0}x", 0, 10).unwrap();
        assert_eq!(l.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), ["c"]);
    }
}
