//! signal-cli's HTTP daemon as a client sees it: JSON-RPC 2.0 requests on `POST /api/v1/rpc`,
//! and the classification of its errors for the outbox.
//!
//! Every request carries the `account` parameter: a daemon started for one account
//! (`signal-cli -a +N daemon --http`) ignores it, a multi-account daemon (`signal-cli daemon
//! --http`) requires it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clawft_channel_core::ChannelError;
use serde_json::{json, Map, Value};

/// How long one request may take (a send to a large group fans out to every member's devices).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// The wait after a rate-limit error that named no delay: Signal's limits are per account and
/// recipient and lift within seconds to minutes.
pub const DEFAULT_RATE_LIMIT_WAIT: Duration = Duration::from_secs(10);

/// signal-cli's error codes (`SignalJsonRpcCommandHandler`).
mod code {
    /// `UserErrorException`: the request was wrong (unknown group, unregistered number).
    pub const USER_ERROR: i64 = -1;
    /// `IOErrorException`: the network to Signal's servers failed.
    pub const IO_ERROR: i64 = -3;
    /// `UntrustedKeyErrorException`: a recipient's safety number changed.
    pub const UNTRUSTED_KEY_ERROR: i64 = -4;
    /// `RateLimitErrorException`: Signal's servers rate limited the account.
    pub const RATE_LIMIT_ERROR: i64 = -5;
    /// JSON-RPC: the method does not exist.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// JSON-RPC: invalid params (also a missing or unknown `account`).
    pub const INVALID_PARAMS: i64 = -32602;
    /// JSON-RPC: internal error (an unexpected exception in signal-cli).
    pub const INTERNAL_ERROR: i64 = -32603;
}

/// A JSON-RPC client of one signal-cli account.
pub(crate) struct Rpc {
    http: reqwest::Client,
    /// `<base>/api/v1/rpc`.
    url: String,
    account: String,
    next_id: AtomicU64,
}

impl Rpc {
    pub(crate) fn new(http: reqwest::Client, base: &str, account: &str) -> Self {
        Self {
            http,
            url: format!("{}/api/v1/rpc", base.trim_end_matches('/')),
            account: account.to_string(),
            next_id: AtomicU64::new(1),
        }
    }

    /// Call `method` with `params` (the account is added) and answer its `result`.
    ///
    /// # Errors
    /// The classified failure: see [`classify`].
    pub(crate) async fn call(
        &self,
        method: &str,
        mut params: Map<String, Value>,
    ) -> Result<Value, ChannelError> {
        params.insert("account".into(), Value::String(self.account.clone()));
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let body = json!({"jsonrpc": "2.0", "method": method, "params": params, "id": id});
        let resp = self
            .http
            .post(&self.url)
            .timeout(REQUEST_TIMEOUT)
            .json(&body)
            .send()
            .await
            .map_err(|e| {
                ChannelError::Transient(format!(
                    "signal-cli unreachable ({method}): {}",
                    e.without_url()
                ))
            })?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| {
            ChannelError::Transient(format!("signal-cli ({method}): {}", e.without_url()))
        })?;
        let v: Value = match serde_json::from_str(&text) {
            Ok(v) => v,
            Err(_) if status.is_server_error() => {
                return Err(ChannelError::Transient(format!(
                    "signal-cli answered {status} to {method}"
                )))
            }
            Err(_) => {
                return Err(ChannelError::Fatal(format!(
                    "signal-cli answered {status} to {method} without JSON-RPC: is channels.signal.api_url the address of `signal-cli daemon --http`?"
                )))
            }
        };
        if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
            return Err(classify(method, err));
        }
        Ok(v.get("result").cloned().unwrap_or(Value::Null))
    }
}

/// A JSON-RPC error object of signal-cli → the outbox's classification.
pub(crate) fn classify(method: &str, err: &Value) -> ChannelError {
    let c = err.get("code").and_then(Value::as_i64).unwrap_or(0);
    let msg = err
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("no message");
    match c {
        code::RATE_LIMIT_ERROR => ChannelError::RateLimited {
            retry_after: Some(retry_after(err).unwrap_or(DEFAULT_RATE_LIMIT_WAIT)),
        },
        code::IO_ERROR | code::INTERNAL_ERROR => {
            ChannelError::Transient(format!("signal-cli {method}: {msg}"))
        }
        code::UNTRUSTED_KEY_ERROR => ChannelError::Rejected(format!(
            "signal-cli {method}: {msg} (a recipient's safety number changed: verify it, then `signal-cli -a ACCOUNT trust RECIPIENT`)"
        )),
        code::INVALID_PARAMS if msg.contains("account") => ChannelError::Auth(format!(
            "signal-cli refused the account of channels.signal.number: {msg} (register or link it with signal-cli first)"
        )),
        code::METHOD_NOT_FOUND => ChannelError::Fatal(format!(
            "signal-cli does not know `{method}` ({msg}): use signal-cli 0.13 or later"
        )),
        code::USER_ERROR => ChannelError::Rejected(format!("signal-cli {method}: {msg}")),
        _ => ChannelError::Rejected(format!("signal-cli {method}: {msg} (code {c})")),
    }
}

/// The longest `retryAfterSeconds` of the rate-limited recipients of a failed send, if any
/// said.
fn retry_after(err: &Value) -> Option<Duration> {
    err.pointer("/data/response/results")?
        .as_array()?
        .iter()
        .filter_map(|r| r.get("retryAfterSeconds").and_then(Value::as_u64))
        .max()
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_cli_errors_are_classified_for_the_outbox() {
        let rl = json!({"code": -5, "message": "Failed to send message due to rate limiting",
            "data": {"response": {"timestamp": 1, "results": [
                {"recipientAddress": {"number": "+1"}, "type": "RATE_LIMIT_FAILURE", "retryAfterSeconds": 7}]}}});
        let e = classify("send", &rl);
        assert!(e.is_retryable());
        assert_eq!(e.retry_after(), Some(Duration::from_secs(7)));
        let bare = json!({"code": -5, "message": "rate limited"});
        assert_eq!(
            classify("send", &bare).retry_after(),
            Some(DEFAULT_RATE_LIMIT_WAIT)
        );
        assert!(classify("send", &json!({"code": -3, "message": "io"})).is_retryable());
        assert!(
            !classify("send", &json!({"code": -1, "message": "Invalid group id"})).is_retryable()
        );
        assert_eq!(
            classify(
                "send",
                &json!({"code": -32602, "message": "Specified account does not exist"})
            )
            .kind(),
            "auth"
        );
    }
}
