//! Group commit: one flusher thread makes the writes of every caller durable, coalescing the
//! flush requests that arrive while a flush runs into the next one.
//!
//! A caller applies its batch, then asks for a flush and waits. The thread takes every request
//! queued so far, runs ONE backend flush, and answers them all: a request queued before that
//! flush started was made after its caller's writes were applied, so the flush covers them.
//! Requests arriving while it runs wait for the next flush. With 100 sessions finishing turns
//! at once, a handful of fsyncs serve them all instead of 100.
//!
//! Callers either block ([`GroupCommit::flush`], for synchronous code outside the runtime) or
//! take a [`FlushTicket`] ([`GroupCommit::ticket`]): the request is queued when the ticket is
//! made, and the ticket is a future that resolves once that flush is done, so async code never
//! blocks a runtime thread while the disk works, and an actor can hand the ticket to a task
//! instead of waiting in its handler.
//!
//! Between requests the thread also does the store's housekeeping ([`Housekeeping`]): while
//! the store is degraded it retries the backend (ENOSPC recovery), and now and then it records
//! the durable high-water mark in the sidecar file.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use super::StoreError;

use crate::types::MutexExt;

/// The outcome a waiter gets: `Err` carries the text and the error's kind.
type Answer = Result<(), (String, &'static str)>;

enum Waiter {
    Sync(std::sync::mpsc::SyncSender<Answer>),
    Async(tokio::sync::oneshot::Sender<Answer>),
}

impl Waiter {
    fn answer(self, a: Answer) {
        match self {
            Self::Sync(tx) => {
                let _ = tx.send(a);
            }
            Self::Async(tx) => {
                let _ = tx.send(a);
            }
        }
    }
}

#[derive(Default)]
struct Queue {
    waiters: Vec<Waiter>,
    stop: bool,
}

/// What the flusher thread does: flush the backend, and housekeeping between requests.
pub(crate) trait Housekeeping: Send + Sync + 'static {
    /// One backend flush (errors are recorded by the implementation).
    fn flush_once(&self) -> Result<(), StoreError>;
    /// Called when the thread has had no request for `idle` (and at least every second while
    /// the store is unhealthy). Returns how long to sleep before the next call.
    fn tick(&self) -> Duration;
}

/// The flusher: a queue of waiters and the thread that serves it.
pub(crate) struct GroupCommit {
    queue: Arc<(Mutex<Queue>, Condvar)>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl GroupCommit {
    /// Start the flusher thread over `hk`.
    pub(crate) fn start(hk: Arc<dyn Housekeeping>) -> Self {
        let queue: Arc<(Mutex<Queue>, Condvar)> = Arc::default();
        let q = queue.clone();
        let thread = std::thread::Builder::new()
            .name("store-flush".into())
            .spawn(move || run(&q, hk.as_ref()))
            .ok();
        if thread.is_none() {
            // No thread: every caller flushes by itself (the fallback).
            tracing::warn!("cannot start the store flusher thread; flushes are not coalesced");
            queue.0.locked().stop = true;
        }
        Self {
            queue,
            thread: Mutex::new(thread),
        }
    }

    fn enqueue(&self, w: Waiter) -> Result<(), Waiter> {
        let (m, cv) = &*self.queue;
        let mut q = m.locked();
        if q.stop {
            return Err(w);
        }
        q.waiters.push(w);
        cv.notify_one();
        Ok(())
    }

    /// Block until every write applied before this call is durable.
    ///
    /// # Errors
    /// The flush that would have covered them failed.
    pub(crate) fn flush(
        &self,
        fallback: &dyn Fn() -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        if self.enqueue(Waiter::Sync(tx)).is_err() {
            return fallback();
        }
        match rx.recv() {
            Ok(a) => a.map_err(to_err),
            Err(_) => fallback(),
        }
    }

    /// A ticket for the flush that makes every write applied before this call durable. The
    /// request is queued now (so it joins the next flush whether or not the ticket is polled
    /// yet); await the ticket for the outcome.
    pub(crate) fn ticket(&self, fallback: Fallback) -> FlushTicket {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.enqueue(Waiter::Async(tx)).is_err() {
            // No flusher thread: the caller's own flush (the rare fallback; it blocks).
            return FlushTicket {
                state: TicketState::Done(Some(fallback())),
            };
        }
        FlushTicket {
            state: TicketState::Queued(rx, fallback),
        }
    }
}

/// Flushes the backend directly, when the flusher thread is gone.
pub(crate) type Fallback = Arc<dyn Fn() -> Result<(), StoreError> + Send + Sync>;

/// The promise of a flush: resolves once every write applied before the ticket was made is
/// durable (or the flush failed). Made by [`crate::store::Store::flush_ticket`] and the
/// store's `*_ticket` writes; dropping it does not cancel the flush.
#[must_use = "a ticket says when the write is durable; await it before acting on durability"]
pub struct FlushTicket {
    state: TicketState,
}

enum TicketState {
    Queued(tokio::sync::oneshot::Receiver<Answer>, Fallback),
    Done(Option<Result<(), StoreError>>),
}

impl FlushTicket {
    /// A ticket that is already resolved (nothing to flush, or a write that failed).
    pub fn ready(r: Result<(), StoreError>) -> Self {
        Self {
            state: TicketState::Done(Some(r)),
        }
    }

    /// Block the calling thread until the flush is done: only for threads outside the async
    /// runtime (the CLI, tests, a fallback without a runtime).
    ///
    /// # Errors
    /// The flush failed.
    pub fn wait(self) -> Result<(), StoreError> {
        match self.state {
            TicketState::Done(r) => r.unwrap_or(Ok(())),
            TicketState::Queued(rx, fallback) => match rx.blocking_recv() {
                Ok(a) => a.map_err(to_err),
                Err(_) => fallback(),
            },
        }
    }
}

impl std::fmt::Debug for FlushTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.state {
            TicketState::Queued(..) => "FlushTicket(queued)",
            TicketState::Done(_) => "FlushTicket(done)",
        })
    }
}

impl Future for FlushTicket {
    type Output = Result<(), StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match &mut this.state {
            TicketState::Done(r) => Poll::Ready(r.take().unwrap_or(Ok(()))),
            TicketState::Queued(rx, fallback) => match Pin::new(rx).poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Ok(a)) => {
                    this.state = TicketState::Done(None);
                    Poll::Ready(a.map_err(to_err))
                }
                Poll::Ready(Err(_)) => {
                    // The flusher thread ended (the store is closing): flush here, once.
                    let r = fallback();
                    this.state = TicketState::Done(None);
                    Poll::Ready(r)
                }
            },
        }
    }
}

fn to_err((text, kind): (String, &'static str)) -> StoreError {
    StoreError::Flush { kind, detail: text }
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        {
            let (m, cv) = &*self.queue;
            let mut q = m.locked();
            q.stop = true;
            cv.notify_one();
        }
        let t = self
            .thread
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(t) = t {
            // Never join from the flusher thread itself (it holds no `GroupCommit`, but be safe).
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

fn run(queue: &(Mutex<Queue>, Condvar), hk: &dyn Housekeeping) {
    let (m, cv) = queue;
    let mut next_tick = hk.tick();
    let mut last_tick = std::time::Instant::now();
    loop {
        // Housekeeping runs on time whether or not requests keep coming.
        if last_tick.elapsed() >= next_tick {
            next_tick = hk.tick();
            last_tick = std::time::Instant::now();
        }
        let batch = {
            let mut q = m.locked();
            while q.waiters.is_empty() && !q.stop {
                let left = next_tick.saturating_sub(last_tick.elapsed());
                if left.is_zero() {
                    break;
                }
                q = cv
                    .wait_timeout(q, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            if q.waiters.is_empty() && q.stop {
                drop(q);
                // A last record of the high-water mark at a clean close.
                hk.tick();
                return;
            }
            std::mem::take(&mut q.waiters)
        };
        if batch.is_empty() {
            continue;
        }
        let answer: Answer = hk.flush_once().map_err(|e| (e.to_string(), e.kind()));
        for w in batch {
            w.answer(answer.clone());
        }
    }
}
