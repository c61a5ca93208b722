//! One round of the tool loop, the parts that need nothing of the loop's state: running the
//! calls of a response (concurrently, results in call order, progress events around each), and
//! counting what the LLM call cost.

use clawft_channel_core::ToolProgress;
use futures::future::join_all;
use tokio::sync::mpsc;

use super::{guard, TurnDeps, TurnEvent, TurnOutcome};
use crate::llm::ToolCall;
use crate::tools::registry::{ToolOutcome, ToolRegistry};
use crate::tools::ToolContext;

/// Run `calls` (with the guard's verdict for each) concurrently; the outcomes come back in
/// call order. A refused call is not run; `events` gets a started and a finished event around
/// each call that runs.
pub(super) async fn run_calls(
    registry: &ToolRegistry,
    ctx: &ToolContext,
    exposed: &[String],
    events: Option<&mpsc::Sender<TurnEvent>>,
    calls: &[ToolCall],
    admits: &[guard::Admit],
) -> Vec<ToolOutcome> {
    let runs = calls.iter().zip(admits).map(|(call, admit)| async move {
        if let Some(e) = admit.refused() {
            return guard::refused_outcome(e, admit, registry.scrubber());
        }
        if let Some(ev) = events {
            // As the transcript keeps them: credentials the tool names masked, and every
            // secret the scrubber knows.
            let shown = registry
                .stored_arguments(&call.name, &call.arguments, ctx)
                .unwrap_or_else(|| call.arguments.clone());
            let shown = registry.scrubber().scrub_str(&shown);
            let _ = ev
                .send(TurnEvent::Tool(ToolProgress::ToolStarted {
                    tool: call.name.clone(),
                    call_id: call.id.clone(),
                    arguments: Some(clawft_channel_core::progress_text(&shown)),
                }))
                .await;
        }
        let mut o = registry
            .dispatch_with(&call.name, &call.id, &call.arguments, ctx, exposed)
            .await;
        if let Some(n) = &admit.notice {
            guard::add_notice(&mut o.value, n);
        }
        if let Some(ev) = events {
            let _ = ev
                .send(TurnEvent::Tool(ToolProgress::ToolFinished {
                    tool: call.name.clone(),
                    call_id: call.id.clone(),
                    error_code: o.error.as_ref().map(|e| e.code().to_string()),
                    // The content the transcript stores (the registry scrubbed the value).
                    result: Some(clawft_channel_core::progress_text(&o.content())),
                }))
                .await;
        }
        o
    });
    join_all(runs).await
}

/// Count one LLM call's usage in the turn: its totals, its model's tally (priced now), the
/// token metrics, and the prompt size the provider reported (for the window's calibration).
/// `answered_by` is the model the provider says answered (empty: the provider's name).
pub(super) fn record_usage(
    deps: &TurnDeps,
    out: &mut TurnOutcome,
    answered_by: &str,
    used: crate::llm::Usage,
) {
    out.usage.add(&used);
    let provider = deps.shared.model.name();
    let model = if answered_by.is_empty() {
        provider
    } else {
        answered_by
    };
    deps.shared.usage.tally(&mut out.by_model, model, &used);
    for (kind, n) in [
        ("input", used.input_tokens),
        ("output", used.output_tokens),
        ("cached", used.cached_tokens),
    ] {
        crate::metrics::inc(
            "clawft_llm_tokens_total",
            &[("provider", provider), ("kind", kind)],
            n,
        );
    }
    out.last_prompt.1 = if used.estimated { 0 } else { used.input_tokens };
}
