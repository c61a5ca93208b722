//! The way out: the live [`ChannelTable`] (one per daemon, changed by reloads) and the
//! [`Outbox`] handle every sender uses. "Persist, then route" is written once, here: a durable
//! message is in the store's outbox before it is handed to its channel actor, so a crash between
//! the two resends it at the next start.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, RwLock};

use clawft_channel_core::{
    Capabilities, ChannelId, ChatId, OutboundKind, OutboundMessage, ThreadId,
};
use tokio_util::sync::CancellationToken;

use super::{ChannelMsg, ChannelRef};
use crate::store::{FlushTicket, InboxEntry, Store, StoreError};
use crate::types::RwLockExt;
use crate::types::SessionKey;

/// One running channel.
#[derive(Clone)]
pub struct ChannelEntry {
    /// Its actor (outbox worker, typing, state).
    pub actor: ChannelRef,
    /// Its adapter's capabilities, read when it started: what it takes besides durable
    /// messages (deltas, tool progress).
    pub caps: Capabilities,
    /// Stops its listener and outbox (a child of the daemon's channel token).
    pub stop: CancellationToken,
    /// The adapter itself (sessions ask it where an attachment is). Weak: adapters may hold
    /// handles that hold this table (the HTTP API holds the outbox), and a cycle would keep
    /// the store open after shutdown. The channel's actor and listener hold it strongly.
    pub adapter: std::sync::Weak<dyn clawft_channel_core::Channel>,
}

/// The channels running now, by id: the one table the daemon, the outbox, the `message` tool
/// and the admin API read. A reload changes it in place, so every reader sees the channels that
/// run, not the ones that ran at start.
#[derive(Clone, Default)]
pub struct ChannelTable(Arc<RwLock<BTreeMap<String, ChannelEntry>>>);

impl ChannelTable {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, ChannelEntry>> {
        self.0.read_locked()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, ChannelEntry>> {
        self.0.write_locked()
    }

    /// Add (or replace) a channel; returns the one it replaced.
    pub fn insert(&self, id: &str, entry: ChannelEntry) -> Option<ChannelEntry> {
        self.write().insert(id.to_string(), entry)
    }

    /// Remove a channel; returns it.
    pub fn remove(&self, id: &str) -> Option<ChannelEntry> {
        self.write().remove(id)
    }

    /// A channel by id.
    pub fn get(&self, id: &str) -> Option<ChannelEntry> {
        self.read().get(id).cloned()
    }

    /// Ids of the running channels, sorted.
    pub fn names(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    /// Every running channel with its actor, sorted by id.
    pub fn actors(&self) -> Vec<(String, ChannelRef)> {
        self.read()
            .iter()
            .map(|(k, e)| (k.clone(), e.actor.clone()))
            .collect()
    }

    /// Whether channel `id` runs and takes messages of `kind` ([`Capabilities::takes`]): the
    /// one place that decides whether a chat streams. The outbox routes by it, and a turn asks
    /// it before it has the provider stream.
    pub fn takes(&self, id: &str, kind: OutboundKind) -> bool {
        self.read().get(id).is_some_and(|e| e.caps.takes(kind))
    }
}

/// The handle through which sessions, tools, approvals, ingress and the admin API send: it
/// persists and routes. Cheap to clone.
///
/// Nothing here waits for the disk: a message is written, and the flush that makes it durable
/// is a [`FlushTicket`] that the outbox's router task awaits before it routes the message.
#[derive(Clone)]
pub struct Outbox {
    store: Store,
    channels: ChannelTable,
    /// Where the files of queued messages are copied (`~/.clawft/outbox-files/<id>/`).
    files: Option<std::path::PathBuf>,
    /// Messages waiting for their flush, in the order they were written.
    durable: Arc<OnceLock<DurableTx>>,
}

/// A written message and the ticket of the flush that makes it durable.
type DurableTx = tokio::sync::mpsc::UnboundedSender<(FlushTicket, OutboundMessage)>;

/// Route each message once its ticket resolves, in the order they were written: tickets
/// resolve in that order (one flush covers every request queued before it), so awaiting them
/// one after the other costs no extra wait, and two answers of one chat never swap places.
async fn route_when_durable(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<(FlushTicket, OutboundMessage)>,
    channels: ChannelTable,
) {
    while let Some((ticket, msg)) = rx.recv().await {
        if let Err(e) = ticket.await {
            // Written, not known durable: sent anyway (it stays in the outbox until settled).
            tracing::error!(error = %e, "could not flush a queued reply");
        }
        route_to(&channels, msg);
    }
}

fn route_to(channels: &ChannelTable, msg: OutboundMessage) {
    match channels.get(msg.channel.as_str()) {
        // A channel gets only what its capabilities say it takes.
        Some(e) if !e.caps.takes(msg.kind()) => {}
        Some(e) => {
            if e.actor.cast(ChannelMsg::Send(msg)).is_err() {
                tracing::warn!("channel actor gone; reply stays in the outbox");
            }
        }
        None => {
            tracing::warn!(channel = %msg.channel, "reply for an unknown channel; it stays in the outbox");
        }
    }
}

/// Remove the copies of `msg`'s attachments (it is settled: never sent again). Only files in
/// a directory named after the message are touched, which is where [`Outbox::stage`] puts
/// them.
pub fn remove_staged(msg: &OutboundMessage) {
    for f in &msg.attachments {
        let p = std::path::Path::new(&f.path);
        if let Some(dir) = p
            .parent()
            .filter(|d| d.file_name().is_some_and(|n| *n == *msg.id))
        {
            let _ = std::fs::remove_file(p);
            let _ = std::fs::remove_dir(dir);
        }
    }
}

impl Outbox {
    /// An outbox over `store` routing to the channels of `channels`.
    pub fn new(store: Store, channels: ChannelTable) -> Self {
        Self {
            store,
            channels,
            files: None,
            durable: Arc::default(),
        }
    }

    /// This outbox with attachments copied under `dir` when queued.
    #[must_use]
    pub fn with_files(mut self, dir: std::path::PathBuf) -> Self {
        self.files = Some(dir);
        self
    }

    /// Remove the attachment copies of messages that are not in the outbox any more: copies
    /// made for a message whose outbox entry was never written (a crash between the two, a
    /// `message` call refused after copying). Called at start, before anything is queued;
    /// `pending` are the ids still in the outbox. Returns how many were removed.
    pub fn sweep_staged(&self, pending: &[OutboundMessage]) -> usize {
        let Some(root) = &self.files else {
            return 0;
        };
        let Ok(entries) = std::fs::read_dir(root) else {
            return 0;
        };
        let mut removed = 0;
        for e in entries.flatten() {
            let name = e.file_name();
            if pending.iter().any(|m| *m.id == *name) {
                continue;
            }
            if std::fs::remove_dir_all(e.path()).is_ok() {
                removed += 1;
            }
        }
        removed
    }

    /// Copy `bytes` as attachment `name` of message `id`; returns the copy's path.
    ///
    /// # Errors
    /// No files directory, or the write failed.
    pub fn stage(&self, id: &str, name: &str, bytes: &[u8]) -> Result<String, String> {
        let Some(root) = &self.files else {
            return Err("this gateway sends no files".into());
        };
        let dir = root.join(id);
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot stage {name}: {e}"))?;
        let path = dir.join(name);
        std::fs::write(&path, bytes).map_err(|e| format!("cannot stage {name}: {e}"))?;
        path.to_str()
            .map(str::to_string)
            .ok_or_else(|| "the files directory is not UTF-8".into())
    }

    /// The live channel table.
    pub fn channels(&self) -> &ChannelTable {
        &self.channels
    }

    /// Persist `msg` in the outbox, then route it to its channel once the write is durable (a
    /// message that answers no inbound event: pairing codes, approval questions, the `message`
    /// tool, `weft send`). Returns at once: the flush is awaited by the outbox's router task.
    ///
    /// # Errors
    /// The store refused the message; nothing was routed.
    pub fn send(&self, msg: OutboundMessage) -> Result<(), StoreError> {
        self.store.enqueue_outbound_unflushed(&msg)?;
        self.route_after(self.store.flush_ticket(), msg);
        Ok(())
    }

    /// [`Outbox::send`] for a caller that reports durability (`weft send`): returns once the
    /// message is durable, then routes it (in order with the router's other messages).
    ///
    /// # Errors
    /// The store refused the message or its flush failed (it stays in the outbox and is sent
    /// after a restart).
    pub async fn send_durable(&self, msg: OutboundMessage) -> Result<(), StoreError> {
        self.store.enqueue_outbound_unflushed(&msg)?;
        self.store.flush_ticket().await?;
        self.route_after(FlushTicket::ready(Ok(())), msg);
        Ok(())
    }

    /// Answer `entry` of `session` at once with `reply` (a chat command, a refusal): the entry
    /// is finished and the reply put in the outbox in one atomic write, routed once that write
    /// is durable. Returns at once (the caller is usually an actor's handler). A failed write
    /// is logged and the reply still routed (the entry is then replayed after a restart).
    pub fn answer(&self, session: &SessionKey, entry: &InboxEntry, reply: OutboundMessage) {
        let ticket = match self.store.finish_turn_unflushed(
            session,
            Some(entry),
            &[],
            Some(&reply),
            Vec::new(),
        ) {
            Ok(()) => self.store.flush_ticket(),
            Err(e) => {
                tracing::error!(error = %e, "could not record the reply");
                FlushTicket::ready(Ok(()))
            }
        };
        self.route_after(ticket, reply);
    }

    /// Route `msg` once `ticket` resolves, in order with every other message routed this way.
    /// Outside a runtime (synchronous callers, tests) the calling thread waits instead.
    pub fn route_after(&self, ticket: FlushTicket, msg: OutboundMessage) {
        let tx = match tokio::runtime::Handle::try_current() {
            Ok(rt) => self.durable.get_or_init(|| {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                rt.spawn(route_when_durable(rx, self.channels.clone()));
                tx
            }),
            Err(_) => {
                if let Err(e) = ticket.wait() {
                    tracing::error!(error = %e, "could not flush a queued reply");
                }
                return self.route(msg);
            }
        };
        if let Err(back) = tx.send((ticket, msg)) {
            // The router ended (its runtime is shutting down): the message stays in the
            // outbox and is sent at the next start.
            tracing::warn!(id = %back.0 .1.id, "router gone; message stays in the outbox");
        }
    }

    /// Hand a message that needs no (more) persisting to its channel: a reply already written
    /// with its turn, or a streaming delta or progress note. A message for a channel that is
    /// not running stays in the store's outbox (durable ones are resent when it runs).
    pub fn route(&self, msg: OutboundMessage) {
        route_to(&self.channels, msg);
    }

    /// Show the typing indicator in a chat (best effort).
    pub fn typing(&self, channel: &ChannelId, chat: ChatId, thread: Option<ThreadId>) {
        if let Some(e) = self.channels.get(channel.as_str()) {
            let _ = e.actor.cast(ChannelMsg::Typing { chat, thread });
        }
    }
}

impl crate::tools::message::MessageSink for Outbox {
    fn channels(&self) -> Vec<String> {
        self.channels.names()
    }

    fn send(&self, msg: OutboundMessage) -> Result<(), StoreError> {
        Outbox::send(self, msg)
    }

    fn stage(&self, id: &str, name: &str, bytes: &[u8]) -> Result<String, String> {
        Outbox::stage(self, id, name, bytes)
    }

    fn sends_files(&self, id: &str) -> bool {
        self.channels
            .get(id)
            .and_then(|c| c.adapter.upgrade())
            .is_some_and(|a| a.capabilities().max_upload_bytes > 0)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn copies_live_until_settled_and_orphans_are_swept_at_start() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(&d.path().join("store"), 1 << 20).unwrap();
        let files = d.path().join("outbox-files");
        let outbox = Outbox::new(store.clone(), ChannelTable::default()).with_files(files.clone());
        let mut queued = OutboundMessage::proactive(
            ChannelId::new("telegram"),
            ChatId::new("1"),
            None,
            String::new(),
        );
        let path = outbox.stage(&queued.id, "1-a.pdf", b"%PDF").unwrap();
        queued
            .attachments
            .push(clawft_channel_core::media::OutboundFile {
                path: path.clone(),
                name: "a.pdf".into(),
                kind: clawft_channel_core::media::MediaKind::Document,
                mime: "application/pdf".into(),
                size: 4,
            });
        store.enqueue_outbound(&queued).unwrap();
        // Copied for a message that was never queued (a crash between the two).
        outbox.stage("orphan-id", "1-b.png", b"png").unwrap();
        let pending = store.pending_outbound().unwrap();
        assert_eq!(outbox.sweep_staged(&pending), 1);
        assert!(!files.join("orphan-id").exists());
        assert_eq!(std::fs::read(&path).unwrap(), b"%PDF");
        // Settled: its copy and directory go.
        remove_staged(&queued);
        assert!(!files.join(&queued.id).exists());
    }
}
