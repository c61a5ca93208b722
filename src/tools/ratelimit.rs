//! Per-session tool-call rate limiting (seed 004 §9): a token bucket per session key, checked
//! before a tool runs. A limited call gets a `RATE_LIMITED` result and is not executed, so a
//! looping model cannot hammer the shell or the network.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::types::MutexExt;

/// Most buckets kept; past it, full buckets (idle sessions) are forgotten.
const MAX_BUCKETS: usize = 4096;

/// Bucket parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimit {
    /// Tokens added per minute.
    pub per_minute: u32,
    /// Bucket size: calls allowed in a burst.
    pub burst: u32,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Token buckets by session.
#[derive(Debug)]
pub struct RateLimiter {
    limit: RateLimit,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl RateLimiter {
    /// A limiter with these parameters.
    pub fn new(limit: RateLimit) -> Self {
        Self {
            limit,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn rate(&self) -> f64 {
        f64::from(self.limit.per_minute) / 60.0
    }

    /// Take one token for `session` at `now`. `Err` holds how long until a token is available.
    ///
    /// # Errors
    /// The wait until the next token.
    pub fn check_at(&self, session: &str, now: Instant) -> Result<(), Duration> {
        let burst = f64::from(self.limit.burst.max(1));
        let rate = self.rate();
        let mut g = self.buckets.locked();
        if g.len() >= MAX_BUCKETS && !g.contains_key(session) {
            g.retain(|_, b| b.tokens + now.duration_since(b.at).as_secs_f64() * rate < burst);
        }
        let b = g.entry(session.to_string()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * rate).min(burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else if rate <= 0.0 {
            Err(Duration::from_secs(60))
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / rate))
        }
    }

    /// Take one token for `session` now.
    ///
    /// # Errors
    /// The wait until the next token.
    pub fn check(&self, session: &str) -> Result<(), Duration> {
        self.check_at(session, Instant::now())
    }

    /// The parameters.
    pub fn limit(&self) -> RateLimit {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn burst_then_refill_per_session() {
        let l = RateLimiter::new(RateLimit {
            per_minute: 60,
            burst: 3,
        });
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(l.check_at("a", t0).is_ok());
        }
        let wait = l.check_at("a", t0).unwrap_err();
        assert!(wait <= Duration::from_secs(1) && wait > Duration::ZERO);
        // Another session has its own bucket.
        assert!(l.check_at("b", t0).is_ok());
        // One token per second comes back.
        assert!(l.check_at("a", t0 + Duration::from_millis(1010)).is_ok());
        assert!(l.check_at("a", t0 + Duration::from_millis(1020)).is_err());
        // Never more than the burst after a long pause.
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..3 {
            assert!(l.check_at("a", later).is_ok());
        }
        assert!(l.check_at("a", later).is_err());
    }
}
