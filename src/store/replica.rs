//! The replica hook of the store (cluster mode, docs/cluster.md "Session state"): a finished
//! turn and a delivered reply are told to a [`Replica`] (the cluster's session log), and the
//! turns another node recorded are applied to this store in one atomic batch each
//! ([`Store::apply_remote`]). Without a replica (single-node mode) nothing is built or called.

use std::sync::Arc;

use clawft_channel_core::OutboundMessage;
use serde::{Deserialize, Serialize};

use super::kv::Op;
use super::window::{window_key, Compaction};
use super::{
    decode_entry, encode, inbox_key_of, outbox_key, queue_key, session_meta_key, state_key,
    transcript_prefix, InboxEntry, InboxState, Store, StoreError,
};
use crate::llm::Message;
use crate::types::SessionKey;

/// A finished turn as the session log records it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TurnRecord {
    /// The session.
    pub session: SessionKey,
    /// The inbound message answered (channel, platform event id); none for a scheduled or
    /// proactive turn.
    pub inbound: Option<(String, String)>,
    /// Transcript sequence number of the first message of `messages`.
    pub from_seq: u64,
    /// The transcript messages from `from_seq` on (the user message, tool rounds, answer).
    pub messages: Vec<Message>,
    /// The session's prompt window after the turn, if it was ever compacted.
    pub window: Option<Compaction>,
    /// The replies put in the outbox with the turn.
    pub replies: Vec<OutboundMessage>,
}

/// A record of the session log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Record {
    /// A turn finished.
    Turn(TurnRecord),
    /// The platform accepted the outbox message of this id.
    Delivered(String),
}

/// Where finished turns and deliveries are told (the cluster's session log).
pub trait Replica: Send + Sync {
    /// The first transcript sequence number of `session` not yet in the log (0 when unknown).
    fn covered(&self, session: &SessionKey) -> u64;
    /// Whether turns of `session` are recorded here at all (its partition is owned).
    fn records(&self, session: &SessionKey) -> bool;
    /// A turn is about to be written locally (called before the local batch).
    fn turn(&self, rec: TurnRecord);
    /// The platform accepted outbox message `id` (called before its local removal).
    fn delivered(&self, id: &str);
}

impl Store {
    /// This handle telling finished turns and deliveries to `replica` (cluster mode): the
    /// daemon makes it before it shares the store with anything that finishes turns or
    /// delivers replies, and every clone made from it tells the same replica.
    #[must_use]
    pub fn with_replica(mut self, replica: Arc<dyn Replica>) -> Self {
        self.replica = Some(replica);
        self
    }

    /// The replica, if any.
    pub(super) fn replica(&self) -> Option<&Arc<dyn Replica>> {
        self.replica.as_ref()
    }

    /// The record of a turn about to be finished with `msgs` and `reply`, for the replica.
    pub(super) fn turn_record(
        &self,
        replica: &dyn Replica,
        session: &SessionKey,
        entry: Option<&InboxEntry>,
        msgs: &[Message],
        reply: Option<&OutboundMessage>,
    ) -> Result<Option<TurnRecord>, StoreError> {
        if !replica.records(session) {
            return Ok(None);
        }
        let from_seq = replica.covered(session);
        let mut messages: Vec<Message> = self
            .load_transcript_from(session, from_seq)?
            .into_iter()
            .map(|(_, m)| m)
            .collect();
        messages.extend(msgs.iter().cloned());
        Ok(Some(TurnRecord {
            session: session.clone(),
            inbound: entry
                .and_then(|e| e.event.as_ref())
                .map(|ev| (ev.channel.to_string(), ev.event_id.to_string())),
            from_seq,
            messages,
            window: self.compaction(session)?,
            replies: reply.cloned().into_iter().collect(),
        }))
    }

    /// Apply a record another node wrote (replay at takeover) in one atomic batch, with the
    /// log's sequence number `applied` stored under `mark` in the same batch: the transcript
    /// messages written at their sequence numbers, the prompt window, the inbound message's
    /// journal entry marked done (so it is not answered again), the replies put in the outbox
    /// (a later `Delivered` record removes them). Returns the replies put in the outbox.
    ///
    /// # Errors
    /// Backend failure or a corrupt record: nothing is applied.
    pub fn apply_remote(
        &self,
        rec: &Record,
        mark: (&str, &str),
        applied: u64,
    ) -> Result<Vec<OutboundMessage>, StoreError> {
        let mut ops = Vec::new();
        let mut queued = Vec::new();
        match rec {
            Record::Delivered(id) => ops.push(Op::Del(outbox_key(id))),
            Record::Turn(t) => {
                let mut meta = self.meta_or_new(&t.session)?;
                let prefix = transcript_prefix(&t.session);
                let mut seq = t.from_seq;
                for m in &t.messages {
                    let mut k = prefix.clone();
                    k.extend(seq.to_be_bytes());
                    ops.push(Op::Put(k, encode(m)?));
                    seq += 1;
                }
                meta.next_seq = meta.next_seq.max(seq);
                meta.updated_ms = clawft_channel_core::now_ms();
                ops.push(Op::Put(session_meta_key(&t.session), encode(&meta)?));
                if let Some(w) = &t.window {
                    ops.push(Op::Put(window_key(&t.session), encode(w)?));
                }
                if let Some((ch, id)) = &t.inbound {
                    let key = inbox_key_of(ch, id);
                    let entry = match self.kv.get(&key)? {
                        Some(v) => {
                            let e = decode_entry(&key, &v)?;
                            ops.push(Op::Del(queue_key(e.seq)));
                            InboxEntry {
                                state: InboxState::Done,
                                event: None,
                                ..e
                            }
                        }
                        None => InboxEntry {
                            seq: self.kv.next_id()?,
                            session: t.session.clone(),
                            state: InboxState::Done,
                            event: None,
                        },
                    };
                    ops.push(Op::Put(key, encode(&entry)?));
                }
                for r in &t.replies {
                    ops.push(Op::Put(outbox_key(&r.id), encode(r)?));
                    queued.push(r.clone());
                }
            }
        }
        ops.push(Op::Put(
            state_key(mark.0, mark.1),
            super::seal(applied.to_string().as_bytes()),
        ));
        self.apply(ops)?;
        self.tell_settled();
        Ok(queued)
    }

    /// The log sequence number stored under `mark` by [`Store::apply_remote`] (0 if none).
    ///
    /// # Errors
    /// Backend failure.
    pub fn applied_mark(&self, mark: (&str, &str)) -> Result<u64, StoreError> {
        Ok(self
            .state_get(mark.0, mark.1)?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use clawft_channel_core::{
        ChannelId, ChatId, InboundEvent, OutboundBody, OutboundKind, PlatformEventId, UserId,
    };
    use std::sync::Mutex;

    fn ev(id: &str) -> InboundEvent {
        InboundEvent {
            channel: ChannelId::new("telegram"),
            chat: ChatId::new("42"),
            thread: None,
            sender: UserId::new("42"),
            sender_name: None,
            event_id: PlatformEventId::new(id),
            content: format!("hello {id}"),
            received_at_ms: 1,
            attachments: Vec::new(),
            origin: clawft_channel_core::Origin::User,
        }
    }

    const MARK: (&str, &str) = ("test-log", "3");

    fn key() -> SessionKey {
        SessionKey::parse("telegram:42").unwrap()
    }

    fn reply(id: &str, to: &str) -> OutboundMessage {
        OutboundMessage {
            id: id.into(),
            channel: ChannelId::new("telegram"),
            chat: ChatId::new("42"),
            thread: None,
            in_reply_to: Some(PlatformEventId::new(to)),
            body: OutboundBody::text_of(OutboundKind::Final, "hi there".into()),
            attachments: Vec::new(),
        }
    }

    fn turn(from: u64, msgs: Vec<Message>, event: &str, replies: Vec<OutboundMessage>) -> Record {
        Record::Turn(TurnRecord {
            session: key(),
            inbound: Some(("telegram".into(), event.into())),
            from_seq: from,
            messages: msgs,
            window: None,
            replies,
        })
    }

    #[test]
    fn a_remote_turn_continues_the_history_and_is_not_answered_again() {
        let s = Store::memory();
        let r1 = turn(
            0,
            vec![Message::user("one"), Message::assistant("answer one")],
            "e1",
            vec![reply("o1", "e1")],
        );
        let q = s.apply_remote(&r1, MARK, 7).unwrap();
        assert_eq!(q.len(), 1);
        assert_eq!(s.pending_outbound().unwrap().len(), 1);
        // Applied twice (a replay that stopped before its mark): the same history.
        s.apply_remote(&r1, MARK, 7).unwrap();
        s.apply_remote(&Record::Delivered("o1".into()), MARK, 9)
            .unwrap();
        assert!(s.pending_outbound().unwrap().is_empty());
        assert_eq!(s.applied_mark(MARK).unwrap(), 9);
        let r2 = turn(
            2,
            vec![Message::user("two"), Message::assistant("answer two")],
            "e2",
            vec![],
        );
        s.apply_remote(&r2, MARK, 12).unwrap();
        let t = s.load_transcript(&key()).unwrap();
        assert_eq!(t.len(), 4);
        assert_eq!(s.next_seq(&key()).unwrap(), 4);
        // The answered message comes again from the inbound journal: a duplicate, done.
        assert!(matches!(
            s.journal_inbound(&ev("e2"), &key()).unwrap(),
            crate::store::JournalOutcome::Duplicate
        ));
        assert_eq!(
            s.journaled("telegram", "e2").unwrap().unwrap().state,
            InboxState::Done
        );
        assert!(s.pending_inbound().unwrap().is_empty());
    }

    #[test]
    fn a_journaled_entry_is_marked_done_by_a_remote_turn() {
        let s = Store::memory();
        s.journal_inbound(&ev("e1"), &key()).unwrap();
        assert_eq!(s.pending_inbound().unwrap().len(), 1);
        s.apply_remote(&turn(0, vec![Message::user("one")], "e1", vec![]), MARK, 1)
            .unwrap();
        assert!(s.pending_inbound().unwrap().is_empty());
        assert_eq!(
            s.journaled("telegram", "e1").unwrap().unwrap().state,
            InboxState::Done
        );
    }

    #[derive(Default)]
    struct Seen {
        turns: Mutex<Vec<TurnRecord>>,
        delivered: Mutex<Vec<String>>,
    }

    impl Replica for Seen {
        fn covered(&self, session: &SessionKey) -> u64 {
            self.turns
                .lock()
                .unwrap()
                .iter()
                .filter(|t| &t.session == session)
                .map(|t| t.from_seq + t.messages.len() as u64)
                .max()
                .unwrap_or(0)
        }
        fn records(&self, _: &SessionKey) -> bool {
            true
        }
        fn turn(&self, rec: TurnRecord) {
            self.turns.lock().unwrap().push(rec);
        }
        fn delivered(&self, id: &str) {
            self.delivered.lock().unwrap().push(id.into());
        }
    }

    #[test]
    fn finished_turns_and_deliveries_reach_the_replica() {
        let seen = Arc::new(Seen::default());
        let s = Store::memory().with_replica(seen.clone());
        let crate::store::JournalOutcome::New(entry) =
            s.journal_inbound(&ev("e1"), &key()).unwrap()
        else {
            panic!("not new")
        };
        s.begin_turn(&entry, &Message::user("one")).unwrap();
        let r = reply("o1", "e1");
        s.finish_turn(&key(), Some(&entry), &[Message::assistant("a1")], Some(&r))
            .unwrap();
        s.outbound_done("o1").unwrap();
        let turns = seen.turns.lock().unwrap().clone();
        assert_eq!(turns.len(), 1);
        assert_eq!(turns[0].from_seq, 0);
        assert_eq!(turns[0].messages.len(), 2);
        assert_eq!(turns[0].inbound, Some(("telegram".into(), "e1".into())));
        assert_eq!(turns[0].replies, vec![r]);
        assert_eq!(*seen.delivered.lock().unwrap(), vec!["o1".to_string()]);
        // The next turn records only what came after.
        s.finish_turn(&key(), None, &[Message::assistant("a2")], None)
            .unwrap();
        let turns = seen.turns.lock().unwrap().clone();
        assert_eq!(turns[1].from_seq, 2);
        assert_eq!(turns[1].messages, vec![Message::assistant("a2")]);
        // The other store, replaying those records, has the same history.
        let other = Store::memory();
        for (i, t) in turns.into_iter().enumerate() {
            other
                .apply_remote(&Record::Turn(t), MARK, i as u64 + 1)
                .unwrap();
        }
        assert_eq!(
            other.load_transcript(&key()).unwrap(),
            s.load_transcript(&key()).unwrap()
        );
    }
}
