//! The model's answer to one request, told apart from the ways it fails, and what the user is
//! told when there is none.
//!
//! - An empty answer (no text, no tool calls) or one cut off mid-way ([`LlmError::Cut`]: a
//!   stream that stopped before its end marker, a connection that broke mid-answer) is asked
//!   for once more; a streamed draft of the first attempt is withdrawn first
//!   ([`TurnEvent::Restart`]), so the user never sees half an answer followed by the whole one.
//!   A second failure ends the turn with a clear reason.
//! - Every other failure has already been retried (or not: auth, quota) by the provider layer
//!   ([`crate::llm::retry`]); [`failure_reason`] turns it into what the user reads.

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{call_model, TurnDeps, TurnEvent};
use crate::llm::{ChatRequest, ChatResponse, LlmError, Usage};

/// Whether a response says nothing: no tool call and no visible text.
fn is_empty(r: &ChatResponse) -> bool {
    r.tool_calls.is_empty() && r.content.trim().is_empty()
}

/// Ask the model for `req` (the first attempt counted by the caller in `llm_calls`): an empty or
/// cut answer is asked for once more (counted here). With `empty_ok` (the turn already sent
/// its words through the `message` tool) an empty answer is the end of the turn. The usage of a discarded empty answer is
/// added to the one returned.
///
/// # Errors
/// The provider's error; [`LlmError::Empty`] or [`LlmError::Cut`] when the second attempt also
/// failed so.
pub(super) async fn complete(
    deps: &TurnDeps,
    req: &ChatRequest,
    events: Option<&mpsc::Sender<TurnEvent>>,
    cancel: &CancellationToken,
    llm_calls: &mut u32,
    empty_ok: bool,
) -> Result<ChatResponse, LlmError> {
    let mut spent = Usage::default();
    let mut attempt = 0;
    loop {
        attempt += 1;
        if attempt > 1 {
            *llm_calls += 1;
        }
        let e = match call_model(deps, req, events, cancel).await {
            Ok(mut r) if empty_ok || !is_empty(&r) => {
                r.usage.add(&spent);
                return Ok(r);
            }
            Ok(r) => {
                spent.add(&r.usage);
                crate::metrics::inc(
                    "clawft_llm_errors_total",
                    &[("provider", deps.shared.model.name()), ("kind", "empty")],
                    1,
                );
                LlmError::Empty {
                    provider: deps.shared.model.name().to_string(),
                }
            }
            Err(e) => e,
        };
        if !e.is_incomplete_answer() || attempt >= 2 {
            return Err(e);
        }
        tracing::warn!(error = %e, "the model's answer was empty or cut off; asking once more");
        if let Some(ev) = events {
            // Whatever the first attempt streamed is withdrawn before the second streams.
            let _ = ev.send(TurnEvent::Restart).await;
        }
    }
}

/// What to add to the failure `e`: for a connection failure the local default's hint (what to
/// configure) or where the provider's base URL came from; for a refused key, where the key
/// came from.
pub(super) fn hint_for(e: &LlmError, deps: &super::TurnDeps) -> Option<String> {
    match e {
        LlmError::Connect { provider, .. } => deps
            .shared
            .connect_hint
            .as_deref()
            .map(str::to_string)
            .or_else(|| {
                deps.shared
                    .provider_hints
                    .get(provider)
                    .map(|h| h.connect.clone())
            }),
        LlmError::Auth { provider, .. } => deps
            .shared
            .provider_hints
            .get(provider)
            .map(|h| h.auth.clone()),
        _ => None,
    }
}

/// What the user reads when the turn has no answer because of `e` (`shown`: its text, already
/// scrubbed of secrets), and how loudly it is logged: a problem only the operator can fix
/// (key, quota) is an error, a passing one a warning.
pub(super) fn failure_reason(e: &LlmError, shown: &str, connect_hint: Option<&str>) -> String {
    let mut text = match (e, connect_hint) {
        // Nothing listens there: say what to do first, then what the transport said.
        (LlmError::Connect { refused: true, .. }, Some(h)) => format!("{h} ({shown})"),
        _ => String::new(),
    };
    if !text.is_empty() {
        tracing::warn!(target: "clawft::turn::failure", error = %shown, kind = e.kind(), "llm call failed");
        return text;
    }
    text = match e {
        LlmError::Auth { .. } => format!(
            "The model provider refused the API key, so I cannot answer until it is fixed: {shown}"
        ),
        LlmError::Quota { .. } => format!(
            "The model provider account is out of credit or over its quota (billing), so I cannot answer until it is topped up or the limit is raised; retrying will not help: {shown}"
        ),
        LlmError::ContextLength { .. } => format!(
            "This conversation is too long for the model's context window. Start a new one with /new: {shown}"
        ),
        LlmError::RateLimited { .. }
        | LlmError::Server { .. }
        | LlmError::Connect { .. }
        | LlmError::Timeout { .. } => format!(
            "The model provider is not answering (still failing after retries); try again later: {shown}"
        ),
        LlmError::Cut { .. } => format!(
            "The model's answer was cut off twice, so there is no complete answer; try again: {shown}"
        ),
        LlmError::Empty { .. } => format!(
            "The model returned an empty answer twice, so there is nothing to show; try again or rephrase: {shown}"
        ),
        LlmError::BadRequest { .. } | LlmError::InvalidResponse { .. } => {
            format!("The model provider failed: {shown}")
        }
        LlmError::Cancelled => "Stopped: the turn was cancelled.".to_string(),
    };
    if let (LlmError::Connect { .. } | LlmError::Auth { .. }, Some(h)) = (e, connect_hint) {
        text.push_str(". ");
        text.push_str(h);
    }
    // The `clawft::turn::failure` target: `weft agent` turns it off by default (the reason is
    // printed as the command's error, once).
    match e {
        LlmError::Auth { .. } | LlmError::Quota { .. } => {
            tracing::error!(target: "clawft::turn::failure", error = %shown, kind = e.kind(), "llm call failed; an operator must act");
        }
        _ => {
            tracing::warn!(target: "clawft::turn::failure", error = %shown, kind = e.kind(), "llm call failed")
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_name_what_went_wrong() {
        let quota = LlmError::from_status("openai", 429, "insufficient_quota", None);
        let t = failure_reason(&quota, &quota.to_string(), None);
        assert!(t.contains("quota") && t.contains("billing"), "{t}");
        let auth = LlmError::from_status("openai", 401, "bad key", None);
        assert!(failure_reason(&auth, &auth.to_string(), None).contains("API key"));
        let down = LlmError::from_status("openai", 503, "oops", None);
        assert!(failure_reason(&down, &down.to_string(), None).contains("after retries"));
        let empty = LlmError::Empty {
            provider: "p".into(),
        };
        assert!(failure_reason(&empty, &empty.to_string(), None).contains("empty answer"));
        let connect = LlmError::Connect {
            provider: "p".into(),
            url: "http://x".into(),
            detail: "refused".into(),
            refused: false,
        };
        assert!(
            failure_reason(&connect, &connect.to_string(), Some("set OPENAI_API_KEY"))
                .ends_with("set OPENAI_API_KEY")
        );
    }
}
