//! The store's health as operators see it (`/readyz`, `weft status`, `/metrics`): ok, or
//! degraded since a write failed (no space left, I/O error) until a retry succeeds; plus the
//! alert left by a quarantine at open.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::Serialize;

use crate::types::MutexExt;

/// How long the quarantine alert stays in `/readyz` and `weft status` (it stays in the log).
const ALERT_FOR_MS: u64 = 24 * 3600 * 1000;

/// A snapshot of the store's health.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StoreHealth {
    /// `ok` or `degraded` (writes fail).
    pub status: &'static str,
    /// Why it is degraded: the last error, e.g. "no space left on device".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Since when (milliseconds since the epoch) it is degraded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
    /// The store was found damaged at open and moved aside: what was found and where it went.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alert: Option<String>,
    /// Errors since start, by kind (`no_space`, `io`, `backend`, `corrupt`, ...).
    pub errors: BTreeMap<&'static str, u64>,
}

impl StoreHealth {
    /// Whether writes work.
    pub fn is_ok(&self) -> bool {
        self.status == "ok"
    }
}

#[derive(Default)]
struct Inner {
    degraded: Option<(u64, String)>,
    alert: Option<(u64, String)>,
    errors: BTreeMap<&'static str, u64>,
}

/// Shared health state of one store.
#[derive(Default)]
pub(crate) struct Health {
    inner: Mutex<Inner>,
}

impl Health {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.locked()
    }

    /// A write or flush failed with an error of `kind`. `degrade` is false for errors that
    /// say nothing about the backend (a record that does not decode).
    pub(crate) fn failed(&self, kind: &'static str, detail: &str, degrade: bool) {
        crate::metrics::inc("clawft_store_errors_total", &[("kind", kind)], 1);
        let mut g = self.lock();
        *g.errors.entry(kind).or_insert(0) += 1;
        if degrade && g.degraded.is_none() {
            tracing::error!(kind, error = %detail, "store writes fail; retrying every second until they work again");
            g.degraded = Some((clawft_channel_core::now_ms(), detail.to_string()));
        } else if degrade {
            if let Some((_, d)) = g.degraded.as_mut() {
                detail.clone_into(d);
            }
        }
    }

    /// Whether writes are failing now.
    pub(crate) fn is_degraded(&self) -> bool {
        self.lock().degraded.is_some()
    }

    /// A write went through: no longer degraded.
    pub(crate) fn recovered(&self) {
        let mut g = self.lock();
        if let Some((since, _)) = g.degraded.take() {
            tracing::warn!(
                degraded_ms = clawft_channel_core::now_ms().saturating_sub(since),
                "store writes work again"
            );
        }
    }

    /// Remember an alert (quarantine at open).
    pub(crate) fn alert(&self, text: String) {
        crate::metrics::inc("clawft_store_errors_total", &[("kind", "corrupt")], 1);
        let mut g = self.lock();
        *g.errors.entry("corrupt").or_insert(0) += 1;
        g.alert = Some((clawft_channel_core::now_ms(), text));
    }

    /// The snapshot.
    pub(crate) fn snapshot(&self) -> StoreHealth {
        let g = self.lock();
        let now = clawft_channel_core::now_ms();
        StoreHealth {
            status: if g.degraded.is_some() {
                "degraded"
            } else {
                "ok"
            },
            detail: g.degraded.as_ref().map(|(_, d)| d.clone()),
            since_ms: g.degraded.as_ref().map(|(s, _)| *s),
            alert: g
                .alert
                .as_ref()
                .filter(|(at, _)| now.saturating_sub(*at) < ALERT_FOR_MS)
                .map(|(_, t)| t.clone()),
            errors: g.errors.clone(),
        }
    }
}
