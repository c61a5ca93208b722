//! The task model: records, states, usage, requests and the deny lists.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::tools::builtin::Builtin;
use crate::turn::TurnStatus;
use crate::types::session_key::subagent_key as session_key_of;
use crate::types::SessionKey;

/// Store namespace of task records.
pub const NS_TASKS: &str = "subagents";
/// Store namespace of announcement batches written but maybe not yet journaled.
pub(super) const NS_BATCHES: &str = "subagent_batches";
/// How long `steer` waits between cancelling and respawning.
pub const STEER_SETTLE: Duration = Duration::from_millis(500);
/// Most characters of one result quoted in an announcement.
pub(super) const ANNOUNCE_RESULT_CHARS: usize = 16_000;
/// Archived records are deleted (with their transcripts) this long after archiving.
pub(super) const DELETE_AFTER_ARCHIVE: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often finished tasks are checked for archiving.
pub(super) const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Tools no subagent may use, at any depth (seed 004's list, in this gateway's names): the
/// parent talks to the user, not its children.
pub const ALWAYS_DENIED: &[&str] = &[
    Builtin::Gateway.name(),
    Builtin::Nodes.name(),
    "agents_list",
    "whatsapp_login",
    Builtin::SessionStatus.name(),
    Builtin::Cron.name(),
    Builtin::SessionsSend.name(),
    Builtin::MemorySearch.name(),
    Builtin::MemoryGet.name(),
    Builtin::Message.name(),
];
/// Tools denied at the deepest level (besides `subagents` spawn/run, refused by the
/// supervisor).
pub const LEAF_DENIED: &[&str] = &[
    Builtin::Spawn.name(),
    "sessions_spawn",
    Builtin::SessionsList.name(),
    Builtin::SessionsHistory.name(),
];

/// Why a subagent was not started (told to the model that asked, which may work alone).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpawnRefused {
    /// The gateway is stopping.
    #[error("the gateway is shutting down; no new subagents start")]
    ShuttingDown,
    /// The calling task is not known.
    #[error("unknown parent task {0}")]
    UnknownParent(String),
    /// `max_spawn_depth = 0`.
    #[error("subagents are disabled (tools.subagents.max_spawn_depth = 0)")]
    Disabled,
    /// The caller is at the deepest level.
    #[error("max_spawn_depth ({max}) reached: a subagent at depth {depth} cannot spawn more subagents (tools.subagents.max_spawn_depth); do the work yourself")]
    Depth {
        /// The limit.
        max: u32,
        /// The caller's depth.
        depth: u32,
    },
    /// The caller has as many running children as allowed.
    #[error("max_children_per_agent ({max}) reached: this agent already has {running} running subagents (tools.subagents.max_children_per_agent); wait for one to finish or cancel one")]
    Children {
        /// The limit.
        max: usize,
        /// Its running children.
        running: usize,
    },
    /// As many subagents run across the gateway as allowed.
    #[error("max_concurrent ({max}) reached: {running} subagents are running across all sessions (tools.subagents.max_concurrent); try again when one has finished")]
    Concurrent {
        /// The limit.
        max: usize,
        /// Running now.
        running: usize,
    },
    /// The chat started as many as allowed in the last hour.
    #[error("max_spawns_per_hour ({max}) reached: this chat started {recent} subagents in the last hour (tools.subagents.max_spawns_per_hour); finish the work without more subagents")]
    PerHour {
        /// The limit.
        max: usize,
        /// Started in the last hour.
        recent: usize,
    },
    /// Nothing to do.
    #[error("`task` is empty: say what the subagent should do")]
    EmptyTask,
    /// The new task's id makes no session key (never with uuids).
    #[error("invalid task id")]
    InvalidId,
}

/// Why a cancel cancelled nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CancelRefused {
    /// No task has this id.
    #[error("no subagent task `{0}`; call subagents list for the ids")]
    Unknown(String),
    /// The task is not in the caller's tree.
    #[error("task `{0}` is not one of your subagents")]
    NotYours(String),
    /// The task already ended.
    #[error("task `{id}` is already {status}")]
    Ended {
        /// The task.
        id: String,
        /// How it ended.
        status: &'static str,
    },
}

/// Lifecycle state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// Accepted, not yet started.
    Spawning,
    /// Running.
    Running,
    /// Finished with a final answer.
    Completed,
    /// Provider failure, iteration limit, timeout, restart or shutdown.
    Failed,
    /// Cancelled by its parent, `steer`, `/stop` or `/new`.
    Cancelled,
    /// Finished long ago; hidden from `list` unless asked.
    Archived,
}

impl TaskStatus {
    /// Whether it still runs (or is about to).
    pub fn is_active(self) -> bool {
        matches!(self, TaskStatus::Spawning | TaskStatus::Running)
    }

    /// The name stored and shown to the model.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Spawning => "spawning",
            TaskStatus::Running => "running",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
            TaskStatus::Archived => "archived",
        }
    }
}

/// How the parent wants the result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Announced to the parent session when done.
    Spawn,
    /// Returned inline to the waiting `run` call.
    Run,
}

/// What a task consumed (its own run; `status` sums its subtree).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskUsage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// LLM calls.
    pub llm_calls: u64,
    /// Tool calls.
    pub tool_calls: u64,
    /// Wall-clock milliseconds.
    pub wall_ms: u64,
}

impl TaskUsage {
    pub(super) fn add(&mut self, o: &TaskUsage) {
        self.input_tokens += o.input_tokens;
        self.output_tokens += o.output_tokens;
        self.llm_calls += o.llm_calls;
        self.tool_calls += o.tool_calls;
        self.wall_ms += o.wall_ms;
    }
}

/// One task, as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// Task id (a UUIDv7).
    pub id: String,
    /// Short name given by the parent.
    pub label: String,
    /// The task message.
    pub task: String,
    /// The caller's session key (a chat session or `subagent:<id>`).
    pub parent: String,
    /// The chat session at the top of the tree: results are announced there.
    pub root: String,
    /// 1 for a chat session's children.
    pub depth: u32,
    /// Spawn or run.
    pub mode: Mode,
    /// State.
    pub status: TaskStatus,
    /// Epoch ms.
    pub created_ms: u64,
    /// Epoch ms when it finished.
    #[serde(default)]
    pub ended_ms: Option<u64>,
    /// Epoch ms when archived.
    #[serde(default)]
    pub archived_ms: Option<u64>,
    /// The final answer.
    #[serde(default)]
    pub result: Option<String>,
    /// Why it failed or was cancelled.
    #[serde(default)]
    pub error: Option<String>,
    /// What it consumed.
    #[serde(default)]
    pub usage: TaskUsage,
    /// Whether the parent was told (or needs no telling).
    #[serde(default)]
    pub announced: bool,
}

impl TaskRecord {
    /// The model-facing summary (no task text or result).
    pub fn summary(&self, now_ms: u64) -> serde_json::Value {
        let end = self.ended_ms.unwrap_or(now_ms);
        serde_json::json!({
            "id": self.id,
            "label": self.label,
            "status": self.status,
            "depth": self.depth,
            "parent": self.parent,
            "mode": self.mode,
            "runtime_ms": end.saturating_sub(self.created_ms),
        })
    }

    /// The session key the child runs under.
    pub fn session_key(&self) -> Option<SessionKey> {
        session_key_of(&self.id)
    }
}

/// A spawn or run request from the tool.
#[derive(Clone, Debug)]
pub struct SpawnRequest {
    /// The calling session (chat session or subagent).
    pub caller: SessionKey,
    /// Task message.
    pub task: String,
    /// Label.
    pub label: Option<String>,
    /// Spawn or run.
    pub mode: Mode,
    /// Shorter timeout than the configured one (run).
    pub timeout: Option<Duration>,
}

/// An accepted spawn.
#[derive(Debug)]
pub struct Spawned {
    /// The record as created.
    pub record: TaskRecord,
    /// Resolves with the final record (for `run`).
    pub done: Option<oneshot::Receiver<TaskRecord>>,
}

/// Why a running task is being cancelled.
#[derive(Clone, Debug, PartialEq)]
pub enum CancelReason {
    /// Its parent called `cancel`.
    ByParent,
    /// Replaced by `steer`.
    Steered,
    /// `/stop` or `/new` in the chat.
    SessionStopped,
    /// The gateway is shutting down.
    Shutdown,
}

/// Which tasks `cancel` targets.
#[derive(Clone, Debug, PartialEq)]
pub enum CancelTarget {
    /// One task (the caller's own child or descendant).
    Id(String),
    /// Every running child of the caller.
    All,
    /// The caller's most recently spawned running child.
    Last,
}

/// What a child's run produced.
#[derive(Debug)]
pub struct ChildResult {
    pub(super) status: TurnStatus,
    pub(super) reply: String,
    pub(super) usage: TaskUsage,
    pub(super) timed_out: Option<u64>,
}
