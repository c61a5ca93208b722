//! Group commit: one flusher thread makes the writes of every caller durable, coalescing the
//! flush requests that arrive while a flush runs into the next one.
//!
//! A caller applies its batch, then asks for a flush and waits. The thread takes every request
//! queued so far, runs ONE backend flush, and answers them all: a request queued before that
//! flush started was made after its caller's writes were applied, so the flush covers them.
//! Requests arriving while it runs wait for the next flush. With 100 sessions finishing turns
//! at once, a handful of fsyncs serve them all instead of 100.
//!
//! Callers either block ([`GroupCommit::flush`], for synchronous code) or await
//! ([`GroupCommit::flush_async`], so a tokio worker is never blocked while the disk works).
//!
//! Between requests the thread also does the store's housekeeping ([`Housekeeping`]): while
//! the store is degraded it retries the backend (ENOSPC recovery), and now and then it records
//! the durable high-water mark in the sidecar file.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::StoreError;

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
            queue.0.lock().unwrap_or_else(PoisonError::into_inner).stop = true;
        }
        Self {
            queue,
            thread: Mutex::new(thread),
        }
    }

    fn enqueue(&self, w: Waiter) -> Result<(), Waiter> {
        let (m, cv) = &*self.queue;
        let mut q = m.lock().unwrap_or_else(PoisonError::into_inner);
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

    /// Wait (without blocking the runtime) until every write applied before this call is
    /// durable.
    ///
    /// # Errors
    /// The flush that would have covered them failed.
    pub(crate) async fn flush_async(
        &self,
        fallback: &(dyn Fn() -> Result<(), StoreError> + Sync),
    ) -> Result<(), StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.enqueue(Waiter::Async(tx)).is_err() {
            return fallback();
        }
        match rx.await {
            Ok(a) => a.map_err(to_err),
            Err(_) => fallback(),
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
            let mut q = m.lock().unwrap_or_else(PoisonError::into_inner);
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
            let mut q = m.lock().unwrap_or_else(PoisonError::into_inner);
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
