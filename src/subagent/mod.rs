//! ⑦ The [`SupervisorActor`] (seed 004 §6): child agents that run a delegated task in
//! parallel, bounded by depth, children and concurrency limits, watched through the
//! `subagents` tool, and reporting back to their parent session through the bus.
//!
//! - Each task is a record in the store (namespace `subagents`), written at every state
//!   change: Spawning → Running → Completed | Failed | Cancelled → Archived. Tasks found
//!   Spawning or Running at start were interrupted by a restart: they become Failed and their
//!   parent session is told.
//! - A child runs [`crate::turn::run_turn`] under its own session key `subagent:<id>` (so its
//!   transcript is stored and inspectable), with the parent's tool registry narrowed by the
//!   subagent deny lists, `max_iterations` rounds and a wall-clock timeout. Its cancellation
//!   token is a child of its parent task's (or of the supervisor's root), so cancelling a task
//!   cancels its subtree, and the tools' own cancellation kills their processes.
//! - Results of `spawn`ed tasks are announced to the root chat session as one journaled
//!   inbound message per batch (debounced): the same exactly-once path as a user message, so
//!   an announcement is neither lost nor doubled by a crash (the batch is written before it is
//!   journaled, and journaling is deduplicated on the batch id).
//!
//! Files: [`task`] (the task model and its limits), [`supervisor`] (the actor, its hub, recovery,
//! cancelling, archiving), [`run`] (a child's narrowed dependencies and its run), [`announce`]
//! (batched announcements through the journal).

mod announce;
mod run;
pub mod supervisor;
pub mod task;
pub mod tool;

pub use supervisor::*;
pub use task::*;

#[cfg(test)]
mod tests;
