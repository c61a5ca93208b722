//! The one reconnect backoff of the adapters' listen loops (and of the daemon's listener
//! restart): a delay from `initial`, doubled after each failed attempt up to `max`, back to
//! `initial` once a connection proved healthy.
//!
//! It only counts and computes: it never sleeps, logs or decides what "healthy" means. Each
//! loop keeps its own timings (the settings or constants it always had), decides when a
//! connection was healthy, and sleeps the delay itself, beside its cancellation token.

use std::time::Duration;

/// Reconnect delays: `initial`, `2 × initial`, `4 × initial` … at most `max`; the attempts
/// since the last healthy connection are counted (what `weft status` shows).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    /// A connection up at least this long was healthy when it ends ([`Backoff::ended`]).
    reset_after: Option<Duration>,
    /// Delays handed out since the last reset (the next is the `steps + 1`th).
    steps: u32,
    /// Attempts since the last reset, with or without a delay.
    attempt: u32,
}

impl Backoff {
    /// Delays from `initial`, doubled after each, at most `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            reset_after: None,
            steps: 0,
            attempt: 0,
        }
    }

    /// A connection that stayed up at least `up` counts as healthy when it ends
    /// ([`Backoff::ended`]), even if nothing else said so.
    #[must_use]
    pub fn reset_after(mut self, up: Duration) -> Self {
        self.reset_after = Some(up);
        self
    }

    /// The `n`th delay (counted from 1): `initial` doubled `n - 1` times, at most `max`.
    pub fn nth(&self, n: u32) -> Duration {
        let doublings = n.saturating_sub(1).min(31);
        self.initial.saturating_mul(1u32 << doublings).min(self.max)
    }

    /// The delay before the next attempt, which is counted; the delay after it is doubled.
    pub fn next_delay(&mut self) -> Duration {
        self.steps = self.steps.saturating_add(1);
        self.attempt = self.attempt.saturating_add(1);
        self.nth(self.steps)
    }

    /// An attempt made without the backoff's delay (at once, or after a wait the platform
    /// set): counted, and the next delay is not doubled for it.
    pub fn count_attempt(&mut self) {
        self.attempt = self.attempt.saturating_add(1);
    }

    /// The connection proved healthy: the next delay is `initial` again and attempts count
    /// from the start.
    pub fn reset(&mut self) {
        self.steps = 0;
        self.attempt = 0;
    }

    /// A connection that was up for `up` ended: it was healthy (reset) when `up` reached
    /// [`Backoff::reset_after`].
    pub fn ended(&mut self, up: Duration) {
        if self.reset_after.is_some_and(|r| up >= r) {
            self.reset();
        }
    }

    /// Attempts since the last reset (0: connected, or never failed).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn delays_double_to_the_cap_and_restart_after_a_reset() {
        let mut b = Backoff::new(S, 60 * S);
        let d: Vec<u64> = (0..9).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(d, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(b.attempt(), 9);
        b.reset();
        assert_eq!((b.attempt(), b.next_delay()), (0, S));
        assert_eq!(b.attempt(), 1);
    }

    #[test]
    fn an_attempt_without_a_delay_is_counted_and_does_not_double_it() {
        let mut b = Backoff::new(S, 60 * S);
        assert_eq!(b.next_delay(), S);
        b.count_attempt();
        assert_eq!(b.attempt(), 2);
        assert_eq!(b.next_delay(), 2 * S);
    }

    #[test]
    fn a_connection_up_long_enough_resets_it_and_a_short_one_does_not() {
        let mut b = Backoff::new(S, 60 * S).reset_after(30 * S);
        b.next_delay();
        b.next_delay();
        b.ended(29 * S);
        assert_eq!(b.next_delay(), 4 * S);
        b.ended(30 * S);
        assert_eq!((b.attempt(), b.next_delay()), (0, S));
        // Without a threshold nothing resets it but `reset`.
        let mut plain = Backoff::new(S, 60 * S);
        plain.next_delay();
        plain.ended(3600 * S);
        assert_eq!(plain.next_delay(), 2 * S);
    }

    #[test]
    fn huge_attempt_numbers_saturate_at_the_cap() {
        let b = Backoff::new(Duration::from_millis(500), 30 * S);
        assert_eq!(b.nth(0), Duration::from_millis(500));
        assert_eq!(b.nth(u32::MAX), 30 * S);
        assert_eq!(
            Backoff::new(Duration::MAX, Duration::MAX).nth(40),
            Duration::MAX
        );
    }
}
