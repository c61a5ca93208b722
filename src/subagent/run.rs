//! A child's run: the parent's dependencies narrowed for its depth, the turn, the timeout.

use super::task::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::subagents::SubagentSettings;

use crate::llm::Message;
use crate::tools::builtin::Builtin;
use crate::tools::policy::Pattern;
use crate::turn::{run_turn, AgentDeps, TurnDeps, TurnStatus};
use crate::types::SessionKey;

/// The parent's dependencies, narrowed for a child at `depth`.
pub(super) fn child_deps(base: &AgentDeps, s: &SubagentSettings, depth: u32) -> TurnDeps {
    let mut deny: Vec<Pattern> = ALWAYS_DENIED
        .iter()
        .map(|n| Pattern::Name((*n).to_string()))
        .collect();
    if !s.allow_memory_write {
        deny.push(Pattern::Name(Builtin::MemoryWrite.name().into()));
    }
    if depth >= s.max_spawn_depth {
        deny.extend(LEAF_DENIED.iter().map(|n| Pattern::Name((*n).to_string())));
    }
    deny.extend(s.deny.iter().cloned());
    let registry = base.tools.current().narrowed(deny);
    let mut agent = (*base.agent).clone();
    agent.max_tool_iterations = s.max_iterations;
    let leaf = depth >= s.max_spawn_depth;
    // The parent's base text and AGENTS.md/TOOLS.md only (`turn::context::SUBAGENT_FILES`).
    let suffix = format!(
        "\n\nYou are a subagent (depth {depth}) doing one task delegated by another agent. \
         Work on it with your tools and finish with a final answer that states the result: \
         that answer is passed back to the agent that delegated the task. Nobody reads your \
         intermediate messages and you cannot ask the user questions.{}",
        if leaf {
            " You cannot start subagents yourself."
        } else {
            ""
        }
    );
    let context = base.context.for_subagent(&suffix);
    Arc::new(AgentDeps {
        tools: crate::tools::registry::ToolsHandle::new(registry),
        agent: Arc::new(agent),
        context: Arc::new(context),
        ..base.clone()
    })
    .for_turn(None)
}

pub(super) async fn run_child(
    deps: &TurnDeps,
    key: &SessionKey,
    task: &str,
    cancel: &CancellationToken,
    timeout: Duration,
) -> ChildResult {
    let started = Instant::now();
    let user = Message::user(crate::types::sanitize_content(task));
    if let Err(e) = deps
        .shared
        .store
        .append_messages(key, std::slice::from_ref(&user))
    {
        return ChildResult {
            status: TurnStatus::Failed(format!("store failed: {e}")),
            reply: String::new(),
            usage: TaskUsage::default(),
            timed_out: None,
        };
    }
    let history = [user];
    let run = run_turn(deps, key, &history, None, cancel);
    let (outcome, timed_out) = match tokio::time::timeout(timeout, run).await {
        Ok(o) => (Some(o), None),
        Err(_) => {
            cancel.cancel();
            (None, Some(timeout.as_secs()))
        }
    };
    let wall_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    match outcome {
        Some(o) => {
            let skip = o.messages.len().saturating_sub(o.unpersisted);
            if let Err(e) = deps.shared.store.append_messages(key, &o.messages[skip..]) {
                tracing::error!(error = %e, "could not store the subagent's answer");
            }
            // Counted against the day's and the month's budgets (its own session key; no user).
            if let Err(e) = deps.shared.usage.record(key.as_str(), "", &o.by_model) {
                tracing::error!(error = %e, "could not store the subagent's usage");
            }
            ChildResult {
                usage: TaskUsage {
                    input_tokens: o.usage.input_tokens,
                    output_tokens: o.usage.output_tokens,
                    llm_calls: u64::from(o.llm_calls),
                    tool_calls: u64::from(o.tool_calls),
                    wall_ms,
                },
                status: o.status,
                reply: o.reply,
                timed_out,
            }
        }
        None => ChildResult {
            status: TurnStatus::Failed(String::new()),
            reply: String::new(),
            usage: TaskUsage {
                wall_ms,
                ..TaskUsage::default()
            },
            timed_out,
        },
    }
}
