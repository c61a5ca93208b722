//! The timing rules of a lease, apart from NATS so they are tested without sleeping.
//!
//! The server keeps a lease entry `ttl` after it was written (the bucket's max age), and only
//! then can another node create it. A holder measures on its own monotonic clock from the
//! moment it *sent* its last successful write, which is before the server wrote it: it owns
//! the lease until `sent + ttl - margin`, strictly before any other node can take it. The
//! margin covers clock rate differences and the time the holder needs to stop what the lease
//! guards. A renewal whose answer arrives late does not extend that: the send time counts.

use std::time::{Duration, Instant};

/// The rules for one TTL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    ttl: Duration,
    margin: Duration,
}

impl Fence {
    /// Rules for leases of `ttl`: the margin is a quarter of it, at least 500 ms (and at most
    /// half the TTL).
    pub fn new(ttl: Duration) -> Self {
        let margin = (ttl / 4).max(Duration::from_millis(500)).min(ttl / 2);
        Self { ttl, margin }
    }

    /// The lease TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The safety margin.
    pub fn margin(&self) -> Duration {
        self.margin
    }

    /// How often a holder renews, and a standby node tries to take a free lease: a third of
    /// the TTL, so two renewals can fail before the lease is lost.
    pub fn renew_every(&self) -> Duration {
        self.ttl / 3
    }

    /// Until when a holder whose last successful write was sent at `sent` may act.
    pub fn owned_until(&self, sent: Instant) -> Instant {
        sent + self.ttl - self.margin
    }

    /// Whether that holder may act at `now`.
    pub fn owns(&self, sent: Instant, now: Instant) -> bool {
        now < self.owned_until(sent)
    }

    /// The earliest another node could take the lease after a write sent at `sent` (the server
    /// wrote it no earlier than that, and keeps it `ttl`).
    pub fn free_at_earliest(&self, sent: Instant) -> Instant {
        sent + self.ttl
    }
}

/// A lease this node holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The lease key.
    pub key: String,
    /// The revision it was acquired at: the fencing token of the writes made under it (a
    /// later holder's token is always greater).
    pub token: u64,
    /// The revision of the last successful write (what a renewal or a release must match).
    pub revision: u64,
    /// When that write was sent (monotonic).
    pub sent: Instant,
    /// When it was acquired (Unix ms, shown by `weft cluster status`).
    pub acquired_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_stops_strictly_before_anyone_can_take_over() {
        for secs in [2, 3, 6, 30, 300] {
            let f = Fence::new(Duration::from_secs(secs));
            let t0 = Instant::now();
            let until = f.owned_until(t0);
            assert!(until < f.free_at_earliest(t0), "ttl {secs}");
            assert!(f.free_at_earliest(t0) - until >= Duration::from_millis(500));
            assert!(f.owns(t0, t0));
            assert!(f.owns(t0, until - Duration::from_nanos(1)));
            assert!(!f.owns(t0, until));
            assert!(!f.owns(t0, t0 + f.ttl()));
            // Renewals come often enough for two to fail before the lease is lost.
            assert!(f.renew_every() * 2 < until - t0, "ttl {secs}");
        }
    }

    #[test]
    fn a_late_answer_does_not_extend_the_lease() {
        let f = Fence::new(Duration::from_secs(6));
        let sent = Instant::now();
        // The answer came 4 s after the request: ownership still counts from the send.
        let answered = sent + Duration::from_secs(4);
        assert_eq!(f.owned_until(sent) - answered, Duration::from_millis(500));
        assert!(!f.owns(sent, sent + Duration::from_millis(4_500)));
    }

    #[test]
    fn the_margin_is_a_quarter_within_bounds() {
        assert_eq!(
            Fence::new(Duration::from_secs(6)).margin(),
            Duration::from_millis(1_500)
        );
        assert_eq!(
            Fence::new(Duration::from_secs(2)).margin(),
            Duration::from_millis(500)
        );
        assert_eq!(
            Fence::new(Duration::from_millis(800)).margin(),
            Duration::from_millis(400)
        );
    }
}
