//! [`LlmError`]: why a completion failed, classified for retry and for the user-facing message.

use std::time::Duration;

use crate::types::scrub::Scrubber;

/// Why a completion failed.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// 429: slow down; `retry_after` from the `Retry-After` header when present.
    #[error("{provider}: rate limited (HTTP 429){}", fmt_after(*retry_after))]
    RateLimited {
        /// Provider name.
        provider: String,
        /// Delay asked for by the server.
        retry_after: Option<Duration>,
    },
    /// 5xx or an overloaded server.
    #[error("{provider}: server error (HTTP {status}): {body}")]
    Server {
        /// Provider name.
        provider: String,
        /// HTTP status.
        status: u16,
        /// First bytes of the response body.
        body: String,
        /// Delay asked for by the server.
        retry_after: Option<Duration>,
    },
    /// 401/403: the key is missing, wrong or lacks permission. Never retried.
    #[error("{provider}: authentication failed (HTTP {status}): {body}. Check the API key configured for this provider (providers.<name>.api_key / api_key_env / api_key_file)")]
    Auth {
        /// Provider name.
        provider: String,
        /// HTTP status.
        status: u16,
        /// First bytes of the response body.
        body: String,
    },
    /// Another 4xx: the request itself was refused (unknown model, context too long).
    #[error("{provider}: request rejected (HTTP {status}): {body}")]
    BadRequest {
        /// Provider name.
        provider: String,
        /// HTTP status.
        status: u16,
        /// First bytes of the response body.
        body: String,
    },
    /// Could not connect, or the connection broke.
    #[error("{provider}: cannot reach {url}: {detail}")]
    Connect {
        /// Provider name.
        provider: String,
        /// The URL dialled.
        url: String,
        /// What the transport said.
        detail: String,
    },
    /// No answer within the configured timeout.
    #[error("{provider}: no response within {0:?}", .timeout)]
    Timeout {
        /// Provider name.
        provider: String,
        /// The timeout that elapsed.
        timeout: Duration,
    },
    /// The server answered something that is not a valid completion.
    #[error("{provider}: invalid response: {detail}")]
    InvalidResponse {
        /// Provider name.
        provider: String,
        /// What was wrong.
        detail: String,
    },
    /// The turn was cancelled while waiting.
    #[error("cancelled")]
    Cancelled,
}

fn fmt_after(d: Option<Duration>) -> String {
    d.map(|d| format!(", retry after {}s", d.as_secs_f32()))
        .unwrap_or_default()
}

impl LlmError {
    /// Whether the same request may succeed later (429, 5xx, connection errors, timeouts).
    pub fn is_retryable(&self) -> bool {
        match self {
            LlmError::RateLimited { .. }
            | LlmError::Server { .. }
            | LlmError::Connect { .. }
            | LlmError::Timeout { .. } => true,
            LlmError::Auth { .. }
            | LlmError::BadRequest { .. }
            | LlmError::InvalidResponse { .. }
            | LlmError::Cancelled => false,
        }
    }

    /// Whether another provider of a fallback list may succeed where this one failed.
    pub fn allows_failover(&self) -> bool {
        !matches!(self, LlmError::Cancelled)
    }

    /// The delay the server asked for.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            LlmError::RateLimited { retry_after, .. } | LlmError::Server { retry_after, .. } => {
                *retry_after
            }
            LlmError::Auth { .. }
            | LlmError::BadRequest { .. }
            | LlmError::Connect { .. }
            | LlmError::Timeout { .. }
            | LlmError::InvalidResponse { .. }
            | LlmError::Cancelled => None,
        }
    }

    /// A short stable name for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            LlmError::RateLimited { .. } => "rate_limited",
            LlmError::Server { .. } => "server",
            LlmError::Auth { .. } => "auth",
            LlmError::BadRequest { .. } => "bad_request",
            LlmError::Connect { .. } => "connect",
            LlmError::Timeout { .. } => "timeout",
            LlmError::InvalidResponse { .. } => "invalid_response",
            LlmError::Cancelled => "cancelled",
        }
    }

    /// This error with the secrets of `s` (the configured values and their encodings, header
    /// echoes such as `Authorization: Bearer …`, URL passwords and `?key=` parameters) redacted
    /// from every text it carries: response bodies, URLs and transport details reach users
    /// (the turn's failure reply), the store and the logs.
    #[must_use]
    pub fn scrubbed(self, s: &Scrubber) -> Self {
        let clean = |t: String| match s.scrub_str(&t) {
            std::borrow::Cow::Borrowed(_) => t,
            std::borrow::Cow::Owned(o) => o,
        };
        match self {
            LlmError::Server {
                provider,
                status,
                body,
                retry_after,
            } => LlmError::Server {
                provider,
                status,
                body: clean(body),
                retry_after,
            },
            LlmError::Auth {
                provider,
                status,
                body,
            } => LlmError::Auth {
                provider,
                status,
                body: clean(body),
            },
            LlmError::BadRequest {
                provider,
                status,
                body,
            } => LlmError::BadRequest {
                provider,
                status,
                body: clean(body),
            },
            LlmError::Connect {
                provider,
                url,
                detail,
            } => LlmError::Connect {
                provider,
                url: clean(url),
                detail: clean(detail),
            },
            LlmError::InvalidResponse { provider, detail } => LlmError::InvalidResponse {
                provider,
                detail: clean(detail),
            },
            e @ (LlmError::RateLimited { .. } | LlmError::Timeout { .. } | LlmError::Cancelled) => {
                e
            }
        }
    }

    /// Classify an HTTP error status.
    pub fn from_status(
        provider: &str,
        status: u16,
        body: &str,
        retry_after: Option<Duration>,
    ) -> Self {
        let provider = provider.to_string();
        let body: String = body.chars().take(500).collect();
        match status {
            429 => LlmError::RateLimited {
                provider,
                retry_after,
            },
            401 | 403 => LlmError::Auth {
                provider,
                status,
                body,
            },
            500..=599 => LlmError::Server {
                provider,
                status,
                body,
                retry_after,
            },
            _ => LlmError::BadRequest {
                provider,
                status,
                body,
            },
        }
    }
}

/// Parse a `Retry-After` header value given in seconds (HTTP dates are ignored).
pub fn parse_retry_after(value: Option<&str>) -> Option<Duration> {
    let v = value?.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    v.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
}
