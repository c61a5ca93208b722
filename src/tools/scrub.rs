//! Credential scrubbing of tool results: the [`Scrubber`] lives in layer 0
//! ([`crate::types::scrub`]) so the LLM providers can scrub their error texts with it too; the
//! registry applies [`Scrubber::clean_value`] (sanitise, then scrub) to every result before it
//! is truncated, stored, logged or sent.

pub use crate::types::scrub::{redact_url, Scrubber, MIN_SECRET_LEN, REDACTED};
