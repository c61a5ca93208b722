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
    #[error("{provider}: authentication failed (HTTP {status}): {body}")]
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
    /// The prompt does not fit the model's context window (OpenAI `context_length_exceeded`,
    /// Anthropic `prompt is too long`, a 400/413 saying so). Never retried as is: the caller
    /// compacts the prompt and tries once more.
    #[error("{provider}: the conversation is too long for the model's context window (HTTP {status}): {body}")]
    ContextLength {
        /// Provider name.
        provider: String,
        /// HTTP status.
        status: u16,
        /// First bytes of the response body.
        body: String,
        /// The window the server showed it really has, in its tokens, when known: a local
        /// server that cut the front of the prompt silently and read only this many tokens,
        /// or Ollama's `num_ctx` a prompt did not fit. The session shrinks its window below it.
        window: Option<u64>,
    },
    /// The account is out of credit or over its quota (`insufficient_quota`, billing errors).
    /// Never retried: waiting does not help.
    #[error("{provider}: the provider account is out of credit or quota (HTTP {status}): {body}")]
    Quota {
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
        /// Nothing listens there (connection refused): a server that is not running, not a
        /// passing failure.
        refused: bool,
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
    /// The answer stopped before it was complete: the connection broke mid-answer, or a stream
    /// ended without its end marker (OpenAI `finish_reason` / `[DONE]`, Anthropic
    /// `message_stop`), or a body was cut short. Not retried by the HTTP layer: the turn retries
    /// once (the half answer may already be on the user's screen and is withdrawn first).
    #[error("{provider}: the answer was cut off before it was complete: {detail}")]
    Cut {
        /// Provider name.
        provider: String,
        /// What was seen.
        detail: String,
    },
    /// A completion with no text and no tool calls. Produced by the turn (which retries once),
    /// never by a provider: an empty answer is a valid HTTP response.
    #[error("{provider}: the model returned an empty answer (no text and no tool calls)")]
    Empty {
        /// Provider name.
        provider: String,
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
            | LlmError::ContextLength { .. }
            | LlmError::Quota { .. }
            | LlmError::InvalidResponse { .. }
            | LlmError::Cut { .. }
            | LlmError::Empty { .. }
            | LlmError::Cancelled => false,
        }
    }

    /// Whether the turn asks once more (a cut or empty answer: the next attempt usually
    /// completes).
    pub fn is_incomplete_answer(&self) -> bool {
        matches!(self, LlmError::Cut { .. } | LlmError::Empty { .. })
    }

    /// Whether another provider of a fallback list may succeed where this one failed.
    pub fn allows_failover(&self) -> bool {
        !matches!(self, LlmError::Cancelled)
    }

    /// Whether the connection was refused (nothing listens at the provider's address).
    pub fn is_refused(&self) -> bool {
        matches!(self, LlmError::Connect { refused: true, .. })
    }

    /// Whether the prompt was over the model's context window.
    pub fn is_context_length(&self) -> bool {
        matches!(self, LlmError::ContextLength { .. })
    }

    /// For a context-length error: the window the server showed it really has, if known.
    pub fn known_window(&self) -> Option<u64> {
        if let LlmError::ContextLength { window, .. } = self {
            *window
        } else {
            None
        }
    }

    /// The delay the server asked for.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            LlmError::RateLimited { retry_after, .. } | LlmError::Server { retry_after, .. } => {
                *retry_after
            }
            LlmError::Auth { .. }
            | LlmError::BadRequest { .. }
            | LlmError::ContextLength { .. }
            | LlmError::Quota { .. }
            | LlmError::Connect { .. }
            | LlmError::Timeout { .. }
            | LlmError::InvalidResponse { .. }
            | LlmError::Cut { .. }
            | LlmError::Empty { .. }
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
            LlmError::ContextLength { .. } => "context_length",
            LlmError::Quota { .. } => "quota",
            LlmError::Connect { .. } => "connect",
            LlmError::Timeout { .. } => "timeout",
            LlmError::InvalidResponse { .. } => "invalid_response",
            LlmError::Cut { .. } => "cut",
            LlmError::Empty { .. } => "empty",
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
            LlmError::ContextLength {
                provider,
                status,
                body,
                window,
            } => LlmError::ContextLength {
                provider,
                status,
                body: clean(body),
                window,
            },
            LlmError::Quota {
                provider,
                status,
                body,
            } => LlmError::Quota {
                provider,
                status,
                body: clean(body),
            },
            LlmError::Connect {
                provider,
                url,
                detail,
                refused,
            } => LlmError::Connect {
                provider,
                url: clean(url),
                detail: clean(detail),
                refused,
            },
            LlmError::InvalidResponse { provider, detail } => LlmError::InvalidResponse {
                provider,
                detail: clean(detail),
            },
            LlmError::Cut { provider, detail } => LlmError::Cut {
                provider,
                detail: clean(detail),
            },
            e @ (LlmError::RateLimited { .. }
            | LlmError::Timeout { .. }
            | LlmError::Empty { .. }
            | LlmError::Cancelled) => e,
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
        let lower = body.to_ascii_lowercase();
        let body: String = body.chars().take(500).collect();
        if matches!(status, 400 | 402 | 403 | 429) && is_quota(&lower) {
            return LlmError::Quota {
                provider,
                status,
                body,
            };
        }
        if matches!(status, 400 | 413 | 422) && is_context_length(&lower) {
            return LlmError::ContextLength {
                provider,
                status,
                body,
                window: None,
            };
        }
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

/// Whether an error body says the account is out of credit (OpenAI `insufficient_quota`,
/// Anthropic `credit balance is too low`, OpenRouter 402 `insufficient credits`, billing).
fn is_quota(lower: &str) -> bool {
    [
        "insufficient_quota",
        "exceeded your current quota",
        "credit balance is too low",
        "insufficient credits",
        "insufficient_credits",
        "billing",
        "payment required",
    ]
    .iter()
    .any(|w| lower.contains(w))
}

/// Whether an error body says the prompt is over the context window (OpenAI
/// `context_length_exceeded`, Anthropic `prompt is too long`, vLLM / llama.cpp wordings).
fn is_context_length(lower: &str) -> bool {
    [
        "context_length_exceeded",
        "maximum context length",
        "prompt is too long",
        "context length",
        "context window",
        "too many tokens",
        "exceeds the context",
        "request too large",
    ]
    .iter()
    .any(|w| lower.contains(w))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_and_context_length_are_told_apart_from_rate_limits_and_bad_requests() {
        let openai_quota = r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","code":"insufficient_quota"}}"#;
        let e = LlmError::from_status("openai", 429, openai_quota, None);
        assert_eq!(e.kind(), "quota");
        assert!(!e.is_retryable());
        let ctx = r#"{"error":{"message":"This model's maximum context length is 8192 tokens.","code":"context_length_exceeded"}}"#;
        assert!(LlmError::from_status("openai", 400, ctx, None).is_context_length());
        let anthropic = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#;
        assert!(LlmError::from_status("anthropic", 400, anthropic, None).is_context_length());
        assert!(LlmError::from_status("x", 413, "Request too large", None).is_context_length());
        assert_eq!(
            LlmError::from_status("openai", 429, "slow down", None).kind(),
            "rate_limited"
        );
        assert_eq!(
            LlmError::from_status("openai", 400, "unknown model", None).kind(),
            "bad_request"
        );
    }
}
