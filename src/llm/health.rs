//! [`ProviderHealth`]: what the running gateway knows of each provider and model it calls:
//! the last success, the last error with its kind, and since when it has been failing. Kept by
//! the model chain ([`super::retry::ResilientModel`]) as calls end, read by `weft status`,
//! `/readyz` (`provider_failing`), the dashboard and `weft doctor`.
//!
//! Must not: hold request or response contents (only the error's scrubbed text); decide
//! anything about retries (that is the chain's).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use super::LlmError;
use crate::types::MutexExt as _;

/// The last error of a provider/model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastError {
    /// [`LlmError::kind`]: `auth`, `bad_request`, `connect`, ….
    pub kind: &'static str,
    /// The error as the operator reads it (secrets scrubbed by the provider client).
    pub message: String,
    /// When, in milliseconds since the epoch.
    pub at_ms: u64,
}

/// One provider/model's record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// Last successful call, ms since the epoch.
    pub last_success_ms: Option<u64>,
    /// Last failed call.
    pub last_error: Option<LastError>,
    /// First failure after the last success (while failing).
    pub failing_since_ms: Option<u64>,
}

/// The state of an [`Entry`] as status shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// The last call succeeded.
    Ok,
    /// The last call failed for a reason of the provider's (key, model, reachability, server).
    Failing,
    /// Not called yet.
    Unknown,
}

impl State {
    /// `ok`, `failing`, `unknown`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            State::Ok => "ok",
            State::Failing => "failing",
            State::Unknown => "unknown",
        }
    }
}

impl Entry {
    /// Ok, failing or unknown.
    #[must_use]
    pub fn state(&self) -> State {
        match (self.failing_since_ms, self.last_success_ms) {
            (Some(_), _) => State::Failing,
            (None, Some(_)) => State::Ok,
            (None, None) => State::Unknown,
        }
    }
}

/// Entries by (configured position, provider name, model).
type Entries = BTreeMap<(usize, String, String), Entry>;

/// Shared, cheap to clone: the health of every provider/model the gateway calls, in the order
/// they are configured.
#[derive(Clone, Debug, Default)]
pub struct ProviderHealth {
    inner: Arc<Mutex<Entries>>,
}

/// Whether an error says something about the provider (rather than about this request or a
/// cancelled turn).
fn provider_fault(e: &LlmError) -> bool {
    match e {
        LlmError::RateLimited { .. }
        | LlmError::Server { .. }
        | LlmError::Auth { .. }
        | LlmError::BadRequest { .. }
        | LlmError::Quota { .. }
        | LlmError::Connect { .. }
        | LlmError::Timeout { .. }
        | LlmError::InvalidResponse { .. }
        | LlmError::Cut { .. }
        | LlmError::Empty { .. } => true,
        LlmError::ContextLength { .. } | LlmError::Cancelled => false,
    }
}

impl ProviderHealth {
    /// Health for these providers, `(name, model)` in configured order, all unknown.
    #[must_use]
    pub fn new(providers: &[(String, String)]) -> Self {
        let h = Self::default();
        {
            let mut m = h.inner.locked();
            for (i, (name, model)) in providers.iter().enumerate() {
                m.insert((i, name.clone(), model.clone()), Entry::default());
            }
        }
        h
    }

    fn with(&self, name: &str, model: &str, f: impl FnOnce(&mut Entry)) {
        let mut m = self.inner.locked();
        let found = m
            .iter_mut()
            .find(|((_, n, md), _)| n == name && md == model)
            .map(|(_, e)| e);
        match found {
            Some(e) => f(e),
            None => {
                let next = m.len();
                let e = m
                    .entry((next, name.to_string(), model.to_string()))
                    .or_default();
                f(e);
            }
        }
    }

    /// Add `name`/`model` (unknown until called) if it is not listed yet.
    pub fn declare(&self, name: &str, model: &str) {
        self.with(name, model, |_| {});
    }

    /// A call of `name`/`model` succeeded at `now_ms`.
    pub fn success(&self, name: &str, model: &str, now_ms: u64) {
        self.with(name, model, |e| {
            e.last_success_ms = Some(now_ms);
            e.failing_since_ms = None;
        });
    }

    /// A call of `name`/`model` failed with `err` at `now_ms` (errors that say nothing about
    /// the provider are not recorded).
    pub fn failure(&self, name: &str, model: &str, err: &LlmError, now_ms: u64) {
        if !provider_fault(err) {
            return;
        }
        self.with(name, model, |e| {
            e.last_error = Some(LastError {
                kind: err.kind(),
                message: err.to_string(),
                at_ms: now_ms,
            });
            e.failing_since_ms.get_or_insert(now_ms);
        });
    }

    /// Every provider/model with its entry, in configured order.
    #[must_use]
    pub fn entries(&self) -> Vec<(String, String, Entry)> {
        self.inner
            .locked()
            .iter()
            .map(|((_, n, m), e)| (n.clone(), m.clone(), e.clone()))
            .collect()
    }

    /// Whether the gateway cannot answer: some provider is failing and none is ok.
    #[must_use]
    pub fn all_failing(&self) -> bool {
        let e = self.entries();
        e.iter().any(|(_, _, e)| e.state() == State::Failing)
            && !e.iter().any(|(_, _, e)| e.state() == State::Ok)
    }

    /// The status shape: `[{"name","model","state","last_success_ms","last_error":
    /// {"kind","message","at_ms"}|null,"failing_since_ms"}]`.
    #[must_use]
    pub fn to_json(&self) -> Vec<Value> {
        self.entries()
            .into_iter()
            .map(|(name, model, e)| {
                json!({
                    "name": name,
                    "model": model,
                    "state": e.state().as_str(),
                    "last_success_ms": e.last_success_ms,
                    "last_error": e.last_error.as_ref().map(|l| json!({
                        "kind": l.kind,
                        "message": l.message,
                        "at_ms": l.at_ms,
                    })),
                    "failing_since_ms": e.failing_since_ms,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_provider_fails_since_its_first_error_until_a_success() {
        let h = ProviderHealth::new(&[("openai".into(), "gpt".into())]);
        assert_eq!(h.to_json()[0]["state"], "unknown");
        let auth = LlmError::Auth {
            provider: "openai".into(),
            status: 401,
            body: "bad key".into(),
        };
        h.failure("openai", "gpt", &auth, 10);
        h.failure("openai", "gpt", &auth, 20);
        let v = &h.to_json()[0];
        assert_eq!(v["state"], "failing");
        assert_eq!(v["failing_since_ms"], 10);
        assert_eq!(v["last_error"]["kind"], "auth");
        assert_eq!(v["last_error"]["at_ms"], 20);
        assert!(h.all_failing());
        h.failure("openai", "gpt", &LlmError::Cancelled, 25);
        assert_eq!(h.to_json()[0]["last_error"]["at_ms"], 20);
        h.success("openai", "gpt", 30);
        let v = &h.to_json()[0];
        assert_eq!(v["state"], "ok");
        assert_eq!(v["failing_since_ms"], Value::Null);
        assert_eq!(
            v["last_error"]["kind"], "auth",
            "the last error stays, for the record"
        );
        assert!(!h.all_failing());
    }
}
