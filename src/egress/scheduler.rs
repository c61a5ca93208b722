//! The outbox worker of one channel: per-chat FIFO queues, round-robin across the chats with
//! work, at most `max_in_flight` chats sending at once, a pause per chat (or for the whole
//! channel on a global rate limit), and the durable delivered mark.
//!
//! - **Order.** Messages of one chat are sent one after the other, in the order they were
//!   routed; the next send of a chat starts only after the previous one finished, its outbox
//!   removal included.
//! - **Fairness.** A chat with work waits in a ring; each free slot takes the chat at the head
//!   and sends ONE message of it, then the chat goes to the back of the ring. A chat with 1,000
//!   queued replies therefore delays another chat by at most one send per slot.
//! - **Rate limits.** `RateLimited` (or a transient failure) pauses that chat only, for
//!   `retry_after` (else 0.5 s doubling to 60 s); `RateLimitedGlobal` pauses the channel.
//! - **Durable mark.** After a durable message was delivered (or refused for good) its outbox
//!   entry is removed and the store flushed ([`mark_settled`]) before the chat's next send
//!   and before the message counts as done; then the adapter is told
//!   ([`Channel::settled`]) so it can drop what it journaled for a resend.
//! - **Deltas.** Consecutive queued deltas of the same reply are merged into one send (their
//!   fragments concatenated); progress notes beyond [`MAX_BEST_EFFORT_PER_CHAT`] are dropped.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use clawft_channel_core::{Channel, ChannelError, ChatId, OutboundKind, OutboundMessage};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::store::{Store, StoreError};

/// Longest wait between two send attempts of one message.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(60);
/// First wait after a failed send.
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(500);
/// Default of the number of chats of one channel sending at the same time
/// (`channels.<x>.max_chats_in_flight`).
pub const DEFAULT_MAX_CHATS_IN_FLIGHT: usize = crate::config::DEFAULT_MAX_CHATS_IN_FLIGHT;
/// Best-effort messages (deltas, progress) kept waiting per chat; more are dropped.
pub const MAX_BEST_EFFORT_PER_CHAT: usize = 256;

/// What the channel actor hands its worker.
pub(crate) enum Work {
    Send(Box<OutboundMessage>),
    Flush(oneshot::Sender<()>),
}

struct Item {
    seq: u64,
    msg: OutboundMessage,
    attempt: u32,
    delay: Duration,
}

#[derive(Default)]
struct ChatQueue {
    items: VecDeque<Item>,
    /// A send of this chat is running.
    busy: bool,
    /// Waiting in the ring (has items, not busy).
    queued: bool,
    paused_until: Option<Instant>,
}

/// How one send attempt ended.
enum Outcome {
    /// Delivered, refused for good, or recipient gone: the item is done.
    Done,
    /// Try again after this long; `global`: the whole channel waits.
    Retry { wait: Duration, global: bool },
    /// The worker is stopping; the item stays in the outbox.
    Stopped,
}

struct Finished {
    chat: ChatId,
    outcome: Outcome,
}

/// Per-chat scheduler state of one channel.
struct Scheduler {
    chats: HashMap<ChatId, ChatQueue>,
    ring: VecDeque<ChatId>,
    in_flight: usize,
    max_in_flight: usize,
    channel_paused_until: Option<Instant>,
    pending: BTreeSet<u64>,
    next_seq: u64,
    flushes: Vec<(u64, oneshot::Sender<()>)>,
}

impl Scheduler {
    fn new(max_in_flight: usize) -> Self {
        Self {
            chats: HashMap::new(),
            ring: VecDeque::new(),
            in_flight: 0,
            max_in_flight: max_in_flight.max(1),
            channel_paused_until: None,
            pending: BTreeSet::new(),
            next_seq: 0,
            flushes: Vec::new(),
        }
    }

    fn enqueue(&mut self, msg: OutboundMessage) {
        let chat = msg.chat.clone();
        let q = self.chats.entry(chat.clone()).or_default();
        // Merge a delta into the delta of the same reply waiting at the tail.
        if msg.kind() == OutboundKind::Delta {
            if let Some(last) = q.items.back_mut().filter(|l| {
                l.attempt == 0
                    && l.msg.kind() == OutboundKind::Delta
                    && l.msg.in_reply_to == msg.in_reply_to
                    && l.msg.thread == msg.thread
            }) {
                if let Some(t) = last.msg.text_mut() {
                    t.push_str(msg.text());
                }
                return;
            }
        }
        if !msg.kind().is_durable()
            && q.items
                .iter()
                .filter(|i| !i.msg.kind().is_durable())
                .count()
                >= MAX_BEST_EFFORT_PER_CHAT
        {
            tracing::debug!(chat = %chat, "too many best-effort messages waiting; one dropped");
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.pending.insert(seq);
        q.items.push_back(Item {
            seq,
            msg,
            attempt: 0,
            delay: FIRST_RETRY_DELAY,
        });
        if !q.busy && !q.queued {
            q.queued = true;
            self.ring.push_back(chat);
        }
    }

    fn flush(&mut self, done: oneshot::Sender<()>) {
        match self.next_seq.checked_sub(1) {
            Some(last) if self.pending.first().is_some_and(|&p| p <= last) => {
                self.flushes.push((last, done));
            }
            _ => {
                let _ = done.send(());
            }
        }
    }

    fn answer_flushes(&mut self) {
        let first = self.pending.first().copied();
        let (ready, wait): (Vec<_>, Vec<_>) = std::mem::take(&mut self.flushes)
            .into_iter()
            .partition(|(upto, _)| first.is_none_or(|p| p > *upto));
        self.flushes = wait;
        for (_, done) in ready {
            let _ = done.send(());
        }
    }

    /// The next chat to send for, with its head message, if a slot is free and a chat is due.
    fn next(&mut self, now: Instant) -> Option<(ChatId, OutboundMessage, u32)> {
        if self.in_flight >= self.max_in_flight
            || self.channel_paused_until.is_some_and(|t| t > now)
        {
            return None;
        }
        for _ in 0..self.ring.len() {
            let chat = self.ring.pop_front()?;
            let Some(q) = self.chats.get_mut(&chat) else {
                continue;
            };
            if q.paused_until.is_some_and(|t| t > now) {
                self.ring.push_back(chat);
                continue;
            }
            let Some(head) = q.items.front_mut() else {
                q.queued = false;
                continue;
            };
            head.attempt += 1;
            let (msg, attempt) = (head.msg.clone(), head.attempt);
            q.queued = false;
            q.busy = true;
            q.paused_until = None;
            self.in_flight += 1;
            return Some((chat, msg, attempt));
        }
        None
    }

    fn finished(&mut self, f: Finished, now: Instant) {
        self.in_flight = self.in_flight.saturating_sub(1);
        let Some(q) = self.chats.get_mut(&f.chat) else {
            return;
        };
        q.busy = false;
        match f.outcome {
            Outcome::Done | Outcome::Stopped => {
                if let Some(item) = q.items.pop_front() {
                    self.pending.remove(&item.seq);
                }
            }
            Outcome::Retry { wait, global } => {
                if let Some(head) = q.items.front_mut() {
                    let wait = if wait.is_zero() { head.delay } else { wait };
                    head.delay = (head.delay * 2).min(MAX_RETRY_DELAY);
                    let until = now + wait.min(MAX_RETRY_DELAY);
                    if global {
                        self.channel_paused_until = Some(until);
                    } else {
                        q.paused_until = Some(until);
                    }
                }
            }
        }
        if q.items.is_empty() {
            self.chats.remove(&f.chat);
        } else if !q.queued {
            q.queued = true;
            self.ring.push_back(f.chat);
        }
        self.answer_flushes();
    }

    /// When the earliest pause of a waiting chat (or of the channel) ends, if a slot is free.
    fn next_wake(&self, now: Instant) -> Option<Instant> {
        if self.in_flight >= self.max_in_flight || self.ring.is_empty() {
            return None;
        }
        if let Some(t) = self.channel_paused_until.filter(|t| *t > now) {
            return Some(t);
        }
        self.ring
            .iter()
            .filter_map(|c| self.chats.get(c).and_then(|q| q.paused_until))
            .filter(|t| *t > now)
            .min()
    }
}

/// Run the outbox of `channel` until `stop` fires or the actor is gone.
pub(crate) async fn outbox_worker(
    channel: Arc<dyn Channel>,
    store: Store,
    mut rx: mpsc::UnboundedReceiver<Work>,
    stop: CancellationToken,
    max_in_flight: usize,
) {
    let mut s = Scheduler::new(max_in_flight);
    let mut sends: JoinSet<Finished> = JoinSet::new();
    let mut open = true;
    loop {
        let now = Instant::now();
        while let Some((chat, msg, attempt)) = s.next(now) {
            let (ch, st, stop) = (channel.clone(), store.clone(), stop.clone());
            let span =
                tracing::info_span!("send", channel = %msg.channel, chat = %msg.chat, attempt);
            sends.spawn(
                async move {
                    let outcome = send_once(ch.as_ref(), &st, &msg, attempt, &stop).await;
                    Finished { chat, outcome }
                }
                .instrument(span),
            );
        }
        if !open && sends.is_empty() {
            return;
        }
        let wake = s.next_wake(now);
        tokio::select! {
            () = stop.cancelled(), if open => {
                // Sends under way finish (or notice `stop`); nothing new starts.
                open = false;
                s.ring.clear();
                s.max_in_flight = 0;
            }
            w = rx.recv(), if open => match w {
                Some(Work::Send(m)) => s.enqueue(*m),
                Some(Work::Flush(done)) => s.flush(done),
                None => {
                    open = false;
                    s.max_in_flight = 0;
                }
            },
            Some(r) = sends.join_next(), if !sends.is_empty() => match r {
                Ok(f) => s.finished(f, Instant::now()),
                Err(e) => {
                    tracing::error!(error = %e, "a send task failed");
                    s.in_flight = s.in_flight.saturating_sub(1);
                }
            },
            () = sleep_until(wake), if wake.is_some() => {}
        }
    }
}

async fn sleep_until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// One attempt to send `msg`; a durable message that is done is marked settled durably.
async fn send_once(
    channel: &dyn Channel,
    store: &Store,
    msg: &OutboundMessage,
    attempt: u32,
    stop: &CancellationToken,
) -> Outcome {
    let durable = msg.kind().is_durable();
    if durable {
        fault::point("egress.before_send");
    }
    let r = tokio::select! {
        r = channel.send(msg) => r,
        // A send cut short stays in the outbox and is resent at the next start.
        () = stop.cancelled() => return Outcome::Stopped,
    };
    match r {
        Ok(_) => {}
        Err(ChannelError::Gone(why)) => {
            tracing::debug!(why, "recipient gone; message dropped");
        }
        Err(e) if e.is_retryable() && durable => {
            let wait = e.retry_after().unwrap_or_default();
            tracing::warn!(error = %e, attempt, wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX), "send failed; retrying");
            return Outcome::Retry {
                wait,
                global: matches!(e, ChannelError::RateLimitedGlobal { .. }),
            };
        }
        Err(e) => {
            if durable {
                tracing::error!(error = %e, kind = e.kind(), "send failed permanently; message dropped");
            } else if let Some(wait) = e.retry_after() {
                // A best-effort message is dropped, but the chat still waits as asked.
                return Outcome::Retry {
                    wait,
                    global: matches!(e, ChannelError::RateLimitedGlobal { .. }),
                };
            }
        }
    }
    if durable {
        fault::point("egress.after_send");
        if let Err(e) = mark_settled(store, &msg.id).await {
            tracing::error!(error = %e, "could not clear the outbox entry");
            return Outcome::Done;
        }
        channel.settled(msg);
        super::outbox::remove_staged(msg);
        fault::point("egress.after_mark");
    }
    Outcome::Done
}

/// Remove a settled message from the outbox, durably: when this returns the message will not
/// be sent again after a crash. The one place the egress waits for the disk.
pub(crate) async fn mark_settled(store: &Store, id: &str) -> Result<(), StoreError> {
    // One flush shared with every other chat and session finishing now (group commit).
    store.outbound_done_durable(id).await
}

/// Named crash points for the `kill -9` tests: with `WEFT_FAULT=<point>` in its environment
/// the process SIGKILLs itself when it reaches that point (a crash at an exact place of the
/// send path). Unset in production; read once.
pub(crate) mod fault {
    use std::sync::OnceLock;

    static POINT: OnceLock<Option<String>> = OnceLock::new();

    /// Crash here if `WEFT_FAULT` names `name`.
    pub(crate) fn point(name: &str) {
        let set = POINT.get_or_init(crate::config::env::Env::fault_point);
        if set.as_deref() == Some(name) {
            tracing::warn!(point = name, "WEFT_FAULT: killing the process here");
            let _ = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::KILL,
            );
        }
    }
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;
