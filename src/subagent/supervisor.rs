//! The supervisor actor, its hub, recovery at start, cancelling and archiving.

use super::{announce::*, run::*, task::*};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::subagents::SubagentSettings;
use crate::types::RwLockExt;

use crate::bus::Inbox;
use crate::store::Store;
use crate::turn::TurnStatus;
use crate::types::session_key::{
    subagent_key as session_key_of, subagent_task_id as task_id_of,
    subagent_task_id_in as task_id_in,
};
use crate::types::SessionKey;

/// Messages understood by the supervisor.
pub enum SupervisorMsg {
    /// Check limits, record and start a task.
    Spawn {
        /// The request.
        req: SpawnRequest,
        /// The record, or which limit refused it.
        reply: RpcReplyPort<Result<Spawned, SpawnRefused>>,
    },
    /// From a child's task when its run ends.
    Finished {
        /// Task id.
        id: String,
        /// Outcome.
        result: Box<ChildResult>,
    },
    /// Tasks of `caller` (its children and their descendants).
    List {
        /// Caller session.
        caller: SessionKey,
        /// Include archived ones.
        archived: bool,
        /// Answer.
        reply: RpcReplyPort<Vec<TaskRecord>>,
    },
    /// One task of `caller`'s subtree.
    Get {
        /// Caller session.
        caller: SessionKey,
        /// Task id.
        id: String,
        /// Answer (with its subtree's summed usage).
        reply: RpcReplyPort<Option<(TaskRecord, TaskUsage)>>,
    },
    /// Cancel tasks of `caller`.
    Cancel {
        /// Caller session.
        caller: SessionKey,
        /// Which.
        target: CancelTarget,
        /// Why.
        reason: CancelReason,
        /// The ids cancelled, or why nothing was.
        reply: RpcReplyPort<Result<Vec<String>, CancelRefused>>,
    },
    /// `/stop` or `/new` in a chat session: cancel its whole tree.
    CancelSession {
        /// The chat session.
        session: SessionKey,
    },
    /// Usage of `caller`'s subtree.
    Usage {
        /// Caller session.
        caller: SessionKey,
        /// Answer.
        reply: RpcReplyPort<TaskUsage>,
    },
    /// Debounce timer of a root session's announcements.
    Flush {
        /// Root session.
        root: String,
    },
    /// Archive timer.
    Sweep,
    /// Refuse new work, cancel running tasks and wait until they have reported.
    Shutdown {
        /// Answered when no task runs.
        reply: RpcReplyPort<()>,
    },
}

/// Handle to the supervisor.
pub type SupervisorRef = ActorRef<SupervisorMsg>;

/// The late-bound way from the `subagents` tool to the supervisor (the tool is built into
/// the registry before the supervisor exists).
#[derive(Default)]
pub struct SubagentHub {
    pub(super) actor: OnceLock<SupervisorRef>,
    pub(super) settings: std::sync::RwLock<SubagentSettings>,
}

impl SubagentHub {
    /// An unbound hub with `settings`.
    pub fn new(settings: SubagentSettings) -> Arc<Self> {
        Arc::new(Self {
            actor: OnceLock::new(),
            settings: std::sync::RwLock::new(settings),
        })
    }

    /// The supervisor, once started.
    pub fn actor(&self) -> Option<&SupervisorRef> {
        self.actor.get()
    }

    /// The limits in force.
    pub fn settings(&self) -> SubagentSettings {
        self.settings.read_locked().clone()
    }

    /// Cancel a chat session's subagents (`/stop`, `/new`).
    pub fn cancel_session(&self, session: &SessionKey) {
        if let Some(a) = self.actor() {
            let _ = a.cast(SupervisorMsg::CancelSession {
                session: session.clone(),
            });
        }
    }

    /// Apply reloaded limits (to new spawns; running tasks keep theirs).
    pub fn set_settings(&self, s: SubagentSettings) {
        *self.settings.write_locked() = s;
    }
}

impl crate::session::SubagentTree for SubagentHub {
    fn cancel_session(&self, session: &SessionKey) {
        SubagentHub::cancel_session(self, session);
    }
}

/// Arguments of the supervisor.
pub struct SupervisorArgs {
    /// Every agent's turn dependencies (store, model, tools, workspace): a child gets its
    /// parent's agent's, narrowed.
    pub agents: crate::turn::Agents,
    /// Where task records and announcements are kept.
    pub store: crate::store::Store,
    /// The limits in force (changed by a reload).
    pub hub: Arc<SubagentHub>,
    /// Where announcements are routed once journaled.
    pub inbox: Inbox,
    /// Tracks child tasks (the daemon waits for them).
    pub tasks: TaskTracker,
    /// Parent of every task's cancellation.
    pub root_cancel: CancellationToken,
    /// Cancelled when the gateway stops taking messages: announcements are then only
    /// journaled (the next start routes them).
    pub intake: CancellationToken,
}

pub(super) struct Running {
    pub(super) cancel: CancellationToken,
    pub(super) reason: Option<CancelReason>,
    pub(super) waiters: Vec<oneshot::Sender<TaskRecord>>,
}

/// State of the supervisor.
pub struct SupervisorState {
    pub(super) args: SupervisorArgs,
    pub(super) records: HashMap<String, TaskRecord>,
    pub(super) running: HashMap<String, Running>,
    pub(super) flush_pending: std::collections::HashSet<String>,
    pub(super) shutting_down: bool,
    pub(super) shutdown_waiters: Vec<RpcReplyPort<()>>,
}

/// The supervisor actor.
pub struct SupervisorActor;

/// Start the supervisor (after recovering what a crash left behind) and bind its hub to it.
///
/// # Errors
/// The store could not be read, or the actor not spawned.
pub async fn start(args: SupervisorArgs) -> Result<SupervisorRef, ActorProcessingErr> {
    let hub = args.hub.clone();
    let (actor, _) = Actor::spawn(None, SupervisorActor, args).await?;
    let _ = hub.actor.set(actor.clone());
    Ok(actor)
}

pub(super) fn now_ms() -> u64 {
    clawft_channel_core::now_ms()
}

#[ractor::async_trait]
impl Actor for SupervisorActor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        args: SupervisorArgs,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let mut state = SupervisorState {
            args,
            records: HashMap::new(),
            running: HashMap::new(),
            flush_pending: std::collections::HashSet::new(),
            shutting_down: false,
            shutdown_waiters: Vec::new(),
        };
        recover(&mut state)?;
        myself.send_interval(SWEEP_EVERY, || SupervisorMsg::Sweep);
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Spawn { req, reply } => {
                let r = spawn(&myself, state, req);
                let _ = reply.send(r);
            }
            SupervisorMsg::Finished { id, result } => {
                finished(&myself, state, &id, *result);
            }
            SupervisorMsg::List {
                caller,
                archived,
                reply,
            } => {
                let mut v: Vec<TaskRecord> = state
                    .records
                    .values()
                    .filter(|r| archived || r.status != TaskStatus::Archived)
                    .filter(|r| is_descendant_of(state, r, caller.as_str()))
                    .cloned()
                    .collect();
                v.sort_by(|a, b| a.created_ms.cmp(&b.created_ms).then(a.id.cmp(&b.id)));
                let _ = reply.send(v);
            }
            SupervisorMsg::Get { caller, id, reply } => {
                let r = state
                    .records
                    .get(&id)
                    .filter(|r| is_descendant_of(state, r, caller.as_str()))
                    .map(|r| (r.clone(), subtree_usage(state, &r.id)));
                let _ = reply.send(r);
            }
            SupervisorMsg::Cancel {
                caller,
                target,
                reason,
                reply,
            } => {
                let _ = reply.send(cancel(state, &caller, &target, &reason));
            }
            SupervisorMsg::CancelSession { session } => {
                let ids: Vec<String> = state
                    .running
                    .keys()
                    .filter(|id| {
                        state
                            .records
                            .get(*id)
                            .is_some_and(|r| r.root == session.as_str())
                    })
                    .cloned()
                    .collect();
                if !ids.is_empty() {
                    tracing::info!(session = %session, count = ids.len(), "cancelling the session's subagents");
                }
                for id in ids {
                    cancel_one(state, &id, &CancelReason::SessionStopped);
                }
            }
            SupervisorMsg::Usage { caller, reply } => {
                let _ = reply.send(children_usage(state, caller.as_str()));
            }
            SupervisorMsg::Flush { root } => {
                state.flush_pending.remove(&root);
                if let Err(e) = announce(state, &root, true) {
                    tracing::error!(error = %e, "could not announce subagent results; retried at the next start");
                }
            }
            SupervisorMsg::Sweep => sweep(state),
            SupervisorMsg::Shutdown { reply } => {
                state.shutting_down = true;
                let ids: Vec<String> = state.running.keys().cloned().collect();
                for id in ids {
                    cancel_one(state, &id, &CancelReason::Shutdown);
                }
                if state.running.is_empty() {
                    let _ = reply.send(());
                } else {
                    state.shutdown_waiters.push(reply);
                }
            }
        }
        Ok(())
    }
}

/// Load the records; fail what a restart interrupted; journal what was never announced.
pub(super) fn recover(state: &mut SupervisorState) -> Result<(), crate::store::StoreError> {
    let store = state.args.store.clone();
    for (id, v) in store.state_scan(NS_TASKS)? {
        match serde_json::from_str::<TaskRecord>(&v) {
            Ok(mut r) => {
                if r.status.is_active() {
                    tracing::warn!(task = %r.id, "subagent interrupted by a restart");
                    r.status = TaskStatus::Failed;
                    r.error = Some("interrupted by restart".into());
                    r.ended_ms = Some(now_ms());
                    // Its parent is told whatever the mode: a waiting `run` died too.
                    r.announced = false;
                    persist(&store, &r);
                }
                state.records.insert(id, r);
            }
            Err(e) => tracing::error!(task = %id, error = %e, "unreadable subagent record skipped"),
        }
    }
    // Batches written but perhaps not journaled: journal again (deduplicated on the id).
    for (batch, v) in store.state_scan(NS_BATCHES)? {
        if let Ok(b) = serde_json::from_str::<Batch>(&v) {
            if let Err(e) = journal_batch(state, &batch, &b, false) {
                tracing::error!(error = %e, "could not journal a subagent announcement");
            }
        }
    }
    let roots: Vec<String> = state
        .records
        .values()
        .filter(|r| needs_announcing(r))
        .map(|r| r.root.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    for root in roots {
        announce(state, &root, false)?;
    }
    Ok(())
}

pub(super) fn persist(store: &Store, r: &TaskRecord) {
    match serde_json::to_string(r) {
        Ok(v) => {
            if let Err(e) = store.state_put(NS_TASKS, &r.id, Some(&v)) {
                tracing::error!(task = %r.id, error = %e, "could not persist a subagent record");
            }
        }
        Err(e) => tracing::error!(error = %e, "could not encode a subagent record"),
    }
}

pub(super) fn needs_announcing(r: &TaskRecord) -> bool {
    !r.announced && !r.status.is_active() && r.status != TaskStatus::Archived
}

/// Whether `r` is a child or deeper descendant of `caller`.
pub(super) fn is_descendant_of(state: &SupervisorState, r: &TaskRecord, caller: &str) -> bool {
    let mut parent = r.parent.as_str();
    for _ in 0..16 {
        if parent == caller {
            return true;
        }
        let Some(id) = task_id_in(parent) else {
            return false;
        };
        match state.records.get(id) {
            Some(p) => parent = p.parent.as_str(),
            None => return false,
        }
    }
    false
}

/// A task's usage plus its descendants'.
pub(super) fn subtree_usage(state: &SupervisorState, id: &str) -> TaskUsage {
    let mut u = state.records.get(id).map(|r| r.usage).unwrap_or_default();
    if let Some(key) = session_key_of(id) {
        u.add(&children_usage(state, key.as_str()));
    }
    u
}

/// The summed usage of every task below `parent` (a chat session or a subagent's key).
pub(super) fn children_usage(state: &SupervisorState, parent: &str) -> TaskUsage {
    let mut u = TaskUsage::default();
    for r in state.records.values().filter(|r| r.parent == parent) {
        u.add(&subtree_usage(state, &r.id));
    }
    u
}

pub(super) fn spawn(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState,
    req: SpawnRequest,
) -> Result<Spawned, SpawnRefused> {
    let mut s = state.args.hub.settings();
    // The caller's agent's own limits (`agents.NAME.subagents`); how many run at once stays
    // the gateway's.
    if let Some(own) = &state.args.agents.for_key(&req.caller).agent.subagents {
        let max_concurrent = s.max_concurrent;
        s = own.clone();
        s.max_concurrent = max_concurrent;
    }
    if state.shutting_down {
        return Err(SpawnRefused::ShuttingDown);
    }
    let (depth, root) = match task_id_of(&req.caller) {
        Some(pid) => {
            let p = state
                .records
                .get(pid)
                .ok_or_else(|| SpawnRefused::UnknownParent(pid.to_string()))?;
            (p.depth + 1, p.root.clone())
        }
        None => (1, req.caller.to_string()),
    };
    if depth > s.max_spawn_depth {
        return Err(if s.max_spawn_depth == 0 {
            SpawnRefused::Disabled
        } else {
            SpawnRefused::Depth {
                max: s.max_spawn_depth,
                depth: depth - 1,
            }
        });
    }
    let children = state
        .records
        .values()
        .filter(|r| r.parent == req.caller.as_str() && r.status.is_active())
        .count();
    if children >= s.max_children_per_agent {
        return Err(SpawnRefused::Children {
            max: s.max_children_per_agent,
            running: children,
        });
    }
    if state.running.len() >= s.max_concurrent {
        return Err(SpawnRefused::Concurrent {
            max: s.max_concurrent,
            running: state.running.len(),
        });
    }
    let hour_ago = now_ms().saturating_sub(3_600_000);
    let recent = state
        .records
        .values()
        .filter(|r| r.root == root && r.created_ms >= hour_ago)
        .count();
    if recent >= s.max_spawns_per_hour {
        return Err(SpawnRefused::PerHour {
            max: s.max_spawns_per_hour,
            recent,
        });
    }
    let task = req.task.trim().to_string();
    if task.is_empty() {
        return Err(SpawnRefused::EmptyTask);
    }
    let id = uuid::Uuid::now_v7().to_string();
    let label = req
        .label
        .map(|l| l.chars().filter(|c| !c.is_control()).take(80).collect())
        .filter(|l: &String| !l.trim().is_empty())
        .unwrap_or_else(|| task.chars().take(40).collect());
    let mut record = TaskRecord {
        id: id.clone(),
        label,
        task: task.clone(),
        parent: req.caller.to_string(),
        root,
        depth,
        mode: req.mode,
        status: TaskStatus::Spawning,
        created_ms: now_ms(),
        ended_ms: None,
        archived_ms: None,
        result: None,
        error: None,
        usage: TaskUsage::default(),
        announced: false,
    };
    let store = &state.args.store;
    persist(store, &record);
    // The child is its parent's agent's: its key says so, for its own children.
    let key = session_key_of(&id)
        .and_then(|k| k.with_agent(req.caller.agent()).ok())
        .ok_or(SpawnRefused::InvalidId)?;
    let parent_cancel = task_id_of(&req.caller)
        .and_then(|pid| state.running.get(pid))
        .map_or_else(|| state.args.root_cancel.clone(), |p| p.cancel.clone());
    let cancel = parent_cancel.child_token();
    let deps = child_deps(state.args.agents.for_key(&req.caller), &s, depth);
    let timeout = req.timeout.map_or(s.run_timeout, |t| t.min(s.run_timeout));
    let me = myself.clone();
    let token = cancel.clone();
    let span = tracing::info_span!("subagent", task = %id, depth);
    let tid = id.clone();
    state.args.tasks.spawn(tracing::Instrument::instrument(
        async move {
            let result = run_child(&deps, &key, &task, &token, timeout).await;
            let _ = me.cast(SupervisorMsg::Finished {
                id: tid,
                result: Box::new(result),
            });
        },
        span,
    ));
    record.status = TaskStatus::Running;
    persist(store, &record);
    crate::metrics::inc("clawft_subagents_total", &[("event", "spawned")], 1);
    tracing::info!(task = %id, depth, parent = %record.parent, mode = ?record.mode, "subagent started");
    let (tx, rx) = oneshot::channel();
    let done = (req.mode == Mode::Run).then_some(rx);
    let mut waiters = Vec::new();
    if done.is_some() {
        waiters.push(tx);
    }
    state.running.insert(
        id.clone(),
        Running {
            cancel,
            reason: None,
            waiters,
        },
    );
    state.records.insert(id, record.clone());
    Ok(Spawned { record, done })
}

pub(super) fn finished(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState,
    id: &str,
    result: ChildResult,
) {
    let running = state.running.remove(id);
    let reason = running.as_ref().and_then(|r| r.reason.clone());
    let Some(mut r) = state.records.get(id).cloned() else {
        return;
    };
    r.ended_ms = Some(now_ms());
    r.usage = result.usage;
    let (status, error, tell) = match (&reason, &result.status, result.timed_out) {
        (Some(CancelReason::Shutdown), _, _) => (
            TaskStatus::Failed,
            Some("interrupted: the gateway shut down".to_string()),
            true,
        ),
        (_, _, Some(s)) => (
            TaskStatus::Failed,
            Some(if s == state.args.hub.settings().run_timeout.as_secs() {
                format!("timed out after {s}s (tools.subagents.run_timeout_secs); it was cancelled")
            } else {
                format!("timed out after {s}s (the run call's timeout_secs); it was cancelled")
            }),
            r.mode == Mode::Spawn,
        ),
        (Some(CancelReason::ByParent), _, _) => (
            TaskStatus::Cancelled,
            Some("cancelled by its parent".to_string()),
            false,
        ),
        (Some(CancelReason::Steered), _, _) => (
            TaskStatus::Cancelled,
            Some("replaced by steer".to_string()),
            false,
        ),
        (Some(CancelReason::SessionStopped), _, _) | (None, TurnStatus::Cancelled, _) => (
            TaskStatus::Cancelled,
            Some("cancelled by /stop or /new".to_string()),
            false,
        ),
        (None, TurnStatus::Completed, _) => (TaskStatus::Completed, None, r.mode == Mode::Spawn),
        (None, TurnStatus::IterationLimit, _) => (
            TaskStatus::Failed,
            Some(format!(
                "stopped after {} rounds of tool calls without a final answer (tools.subagents.max_iterations)",
                state.args.hub.settings().max_iterations
            )),
            r.mode == Mode::Spawn,
        ),
        (None, TurnStatus::Failed(m) | TurnStatus::OverBudget(m), _) => (
            TaskStatus::Failed,
            Some(m.clone()),
            r.mode == Mode::Spawn,
        ),
    };
    r.status = status;
    r.error = error;
    if status == TaskStatus::Completed || result.status == TurnStatus::IterationLimit {
        r.result = Some(result.reply);
    }
    r.announced = !tell;
    persist(&state.args.store, &r);
    crate::metrics::inc(
        "clawft_subagents_total",
        &[(
            "event",
            match status {
                TaskStatus::Completed => "completed",
                TaskStatus::Cancelled => "cancelled",
                _ => "failed",
            },
        )],
        1,
    );
    tracing::info!(task = %id, status = ?status, llm_calls = r.usage.llm_calls, tool_calls = r.usage.tool_calls, wall_ms = r.usage.wall_ms, "subagent finished");
    state.records.insert(id.to_string(), r.clone());
    if let Some(run) = running {
        for w in run.waiters {
            let _ = w.send(r.clone());
        }
    }
    if tell {
        if state.shutting_down {
            if let Err(e) = announce(state, &r.root, false) {
                tracing::error!(error = %e, "could not journal a subagent announcement");
            }
        } else if state.flush_pending.insert(r.root.clone()) {
            let root = r.root.clone();
            myself.send_after(state.args.hub.settings().announce_debounce, move || {
                SupervisorMsg::Flush { root }
            });
        }
    }
    if state.running.is_empty() {
        for w in state.shutdown_waiters.drain(..) {
            let _ = w.send(());
        }
    }
}

pub(super) fn cancel_one(state: &mut SupervisorState, id: &str, reason: &CancelReason) -> bool {
    match state.running.get_mut(id) {
        Some(r) => {
            if r.reason.is_none() {
                r.reason = Some(reason.clone());
            }
            r.cancel.cancel();
            true
        }
        None => false,
    }
}

pub(super) fn cancel(
    state: &mut SupervisorState,
    caller: &SessionKey,
    target: &CancelTarget,
    reason: &CancelReason,
) -> Result<Vec<String>, CancelRefused> {
    let mine: Vec<TaskRecord> = state
        .records
        .values()
        .filter(|r| r.status.is_active() && is_descendant_of(state, r, caller.as_str()))
        .cloned()
        .collect();
    let ids: Vec<String> = match target {
        CancelTarget::Id(id) => {
            let Some(r) = state.records.get(id) else {
                return Err(CancelRefused::Unknown(id.clone()));
            };
            if !is_descendant_of(state, r, caller.as_str()) {
                return Err(CancelRefused::NotYours(id.clone()));
            }
            if !r.status.is_active() {
                return Err(CancelRefused::Ended {
                    id: id.clone(),
                    status: r.status.as_str(),
                });
            }
            vec![id.clone()]
        }
        CancelTarget::All => mine.iter().map(|r| r.id.clone()).collect(),
        CancelTarget::Last => mine
            .iter()
            .filter(|r| r.parent == caller.as_str())
            .max_by(|a, b| a.created_ms.cmp(&b.created_ms).then(a.id.cmp(&b.id)))
            .map(|r| vec![r.id.clone()])
            .unwrap_or_default(),
    };
    for id in &ids {
        cancel_one(state, id, reason);
    }
    Ok(ids)
}

/// What the archive sweep does to a record.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum SweepAction {
    Keep,
    Archive,
    Delete,
}

/// Finished and told for `archive_ms`: archive; archived for [`DELETE_AFTER_ARCHIVE`]: delete.
/// Running tasks and results the parent has not been told yet are kept.
pub(super) fn sweep_action(r: &TaskRecord, now: u64, archive_ms: u64) -> SweepAction {
    let delete_ms = u64::try_from(DELETE_AFTER_ARCHIVE.as_millis()).unwrap_or(u64::MAX);
    match (r.status, r.ended_ms, r.archived_ms) {
        (TaskStatus::Archived, _, Some(at)) if now.saturating_sub(at) >= delete_ms => {
            SweepAction::Delete
        }
        (s, Some(end), _)
            if !s.is_active()
                && s != TaskStatus::Archived
                && r.announced
                && now.saturating_sub(end) >= archive_ms =>
        {
            SweepAction::Archive
        }
        _ => SweepAction::Keep,
    }
}

pub(super) fn sweep(state: &mut SupervisorState) {
    let now = now_ms();
    let archive_ms =
        u64::try_from(state.args.hub.settings().archive_after.as_millis()).unwrap_or(u64::MAX);
    let store = state.args.store.clone();
    let mut gone = Vec::new();
    for r in state.records.values_mut() {
        match sweep_action(r, now, archive_ms) {
            SweepAction::Delete => gone.push(r.id.clone()),
            SweepAction::Archive => {
                // Only the summary stays in memory; the answer is still in the task's
                // transcript (`subagent:<id>`) until the record is deleted.
                r.status = TaskStatus::Archived;
                r.archived_ms = Some(now);
                r.result = None;
                r.task = r.task.chars().take(200).collect();
                persist(&store, r);
            }
            SweepAction::Keep => {}
        }
    }
    for id in gone {
        state.records.remove(&id);
        let _ = store.state_put(NS_TASKS, &id, None);
        if let Some(k) = session_key_of(&id) {
            let _ = store.clear_session(&k);
        }
    }
}
