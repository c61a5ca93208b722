//! `process` (group `runtime`): long-running commands in the background. A command is started
//! through the one spawn path of `exec_shell` ([`ExecRuntime::spawn_sandboxed`]: the command
//! gate with approvals, Landlock, the jail with the same network mode and egress proxy, the
//! cgroup limits, the scrubbed environment, its own process group), with stdin a pipe (`write`)
//! and stdout and stderr merged, in arrival order, into a ring buffer of [`RING_BYTES`] (older
//! output is dropped and the next read says how much). `poll` returns what is new since the
//! last poll, `log` the last lines, `list` the session's processes, `kill` ends one.
//!
//! Processes belong to their session ([`ProcessTable`], one per daemon, keyed by session): a
//! session sees only its own (another session's id is "not found"), at most
//! `tools.exec.max_background_processes` run at once per session, and the whole process group
//! is killed (SIGKILL, then reaped) on `kill`, on `/new` ([`ProcessTable::kill_session`]), when
//! nobody polled, read or wrote it for `tools.exec.background_idle_secs`, and at shutdown
//! ([`ProcessTable::shutdown`]). `/stop` stops the turn, not the background processes.
//!
//! A finished process stays listed, with its exit status and its output, until `kill` removes
//! it, `/new`, the idle time passes since it was last used, or more than the cap of finished
//! ones pile up in the session (the oldest finished is forgotten first).

use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::ChildStdin;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::cgroup::{CommandCgroup, Events};
use super::runtime::Spawned;
use super::ExecRuntime;
use crate::tools::{parse_args, Effect, Tool, ToolContext, ToolError};
use crate::types::MutexExt;
use crate::types::SessionKey;

/// Output kept per process (stdout and stderr merged); older output is dropped.
pub const RING_BYTES: usize = 256 * 1024;
/// What `poll` and `log` return at most by default.
const DEFAULT_READ_BYTES: usize = 16 * 1024;
/// The most `poll` and `log` return (below the registry's 64 KiB cap on a result).
const MAX_READ_BYTES: usize = 60 * 1024;
/// Lines `log` returns by default.
const DEFAULT_LOG_LINES: usize = 50;
/// The most `data` one `write` takes.
const MAX_WRITE_BYTES: usize = 64 * 1024;
/// How long a `write` waits for a process that does not read its stdin.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often idle processes are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// After exit or kill, how long to wait for the pipes to reach EOF.
const DRAIN_GRACE: Duration = Duration::from_millis(500);
/// How long shutdown waits for the killed processes to be reaped.
const SHUTDOWN_SETTLE: Duration = Duration::from_secs(5);
/// Read buffer for the pipes.
const READ_CHUNK: usize = 16 * 1024;

/// Bytes of output with absolute offsets: `start` is the offset of the first byte kept.
struct Ring {
    buf: VecDeque<u8>,
    cap: usize,
    start: u64,
}

impl Ring {
    fn new(cap: usize) -> Self {
        Self {
            buf: VecDeque::new(),
            cap,
            start: 0,
        }
    }

    fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }

    fn push(&mut self, bytes: &[u8]) {
        self.buf.extend(bytes);
        if self.buf.len() > self.cap {
            let excess = self.buf.len() - self.cap;
            self.buf.drain(..excess);
            self.start += excess as u64;
        }
    }

    /// The bytes from offset `from` (at least `start`) to the end.
    fn from(&self, from: u64) -> Vec<u8> {
        let skip = usize::try_from(from.saturating_sub(self.start)).unwrap_or(usize::MAX);
        self.buf.iter().skip(skip).copied().collect()
    }
}

/// The length of `b` without a UTF-8 sequence cut at its end.
fn complete_prefix(b: &[u8]) -> usize {
    for back in 1..=3.min(b.len()) {
        let c = b[b.len() - back];
        if c & 0xC0 == 0x80 {
            continue;
        }
        let need = match c {
            0xF0.. => 4,
            0xE0.. => 3,
            0xC0.. => 2,
            _ => 1,
        };
        if need > back {
            return b.len() - back;
        }
        break;
    }
    b.len()
}

/// How many UTF-8 continuation bytes (at most 3) `b` starts with: a character cut by the ring.
fn cut_head(b: &[u8]) -> usize {
    b.iter().take(3).take_while(|c| *c & 0xC0 == 0x80).count()
}

/// How a process ended.
struct Exit {
    code: Option<i32>,
    signal: Option<i32>,
    at: Instant,
    events: Events,
}

struct ProcState {
    out: Ring,
    /// Offset up to which `poll` has returned output.
    cursor: u64,
    exit: Option<Exit>,
    /// Last `poll`, `log` or `write` (or the start).
    last_used: Instant,
    /// Why it was killed by the gateway or the model, when it was.
    killed: Option<&'static str>,
}

/// One background process.
struct Proc {
    id: String,
    command: String,
    /// Host pid of the process group leader (the jail's first process when it is active).
    pid: u32,
    started: Instant,
    idle: Duration,
    max_processes: u32,
    max_memory_mb: u64,
    state: Mutex<ProcState>,
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    kill: CancellationToken,
}

impl Proc {
    fn state(&self) -> std::sync::MutexGuard<'_, ProcState> {
        self.state.locked()
    }

    fn running(&self) -> bool {
        self.state().exit.is_none()
    }

    /// Kill the process group (the watcher reaps it); `why` is what `list` and `poll` show.
    fn kill(&self, why: &'static str) {
        {
            let mut s = self.state();
            if s.exit.is_none() && s.killed.is_none() {
                s.killed = Some(why);
            }
        }
        self.kill.cancel();
    }

    /// `{id, pid, command, status, exit_code?, signal?, killed_by?, running_secs, unread_bytes}`.
    fn summary(&self, s: &ProcState) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("pid".into(), json!(self.pid));
        m.insert("command".into(), json!(self.command));
        match &s.exit {
            None => {
                m.insert("status".into(), json!("running"));
                m.insert(
                    "running_secs".into(),
                    json!(self.started.elapsed().as_secs()),
                );
            }
            Some(e) => {
                let status = if s.killed.is_some() {
                    "killed"
                } else {
                    "exited"
                };
                m.insert("status".into(), json!(status));
                m.insert("exit_code".into(), json!(e.code.unwrap_or(-1)));
                if let Some(sig) = e.signal {
                    m.insert("signal".into(), json!(sig));
                }
                if let Some(why) = s.killed {
                    m.insert("killed_by".into(), json!(why));
                }
                m.insert(
                    "ran_secs".into(),
                    json!(e.at.saturating_duration_since(self.started).as_secs()),
                );
                let mut notes = Vec::new();
                if e.events.oom_kills > 0 {
                    notes.push(format!(
                        "out of memory: the command used more than its {} MiB (tools.exec.max_memory_mb) and the kernel killed it",
                        self.max_memory_mb
                    ));
                }
                if e.events.pids_max > 0 {
                    notes.push(format!(
                        "process limit: the command reached {} processes and threads (tools.exec.max_processes); further forks failed",
                        self.max_processes
                    ));
                }
                if !notes.is_empty() {
                    m.insert("note".into(), json!(notes.join("; ")));
                }
            }
        }
        m.insert(
            "unread_bytes".into(),
            json!(s.out.end() - s.cursor.max(s.out.start)),
        );
        m
    }
}

/// The background processes of every session (one per daemon, shared by every registry it
/// builds, so a reload keeps them).
pub struct ProcessTable {
    sessions: Mutex<HashMap<SessionKey, Vec<Arc<Proc>>>>,
    next: AtomicU64,
    tasks: TaskTracker,
    closed: AtomicBool,
}

impl ProcessTable {
    /// An empty table; looks for idle processes every 5 s (when called inside a Tokio runtime).
    pub fn new() -> Arc<Self> {
        Self::with_sweep(SWEEP_EVERY)
    }

    /// [`ProcessTable::new`], looking for idle processes every `every`.
    pub fn with_sweep(every: Duration) -> Arc<Self> {
        let t = Arc::new(Self {
            sessions: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            tasks: TaskTracker::new(),
            closed: AtomicBool::new(false),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let weak: Weak<Self> = Arc::downgrade(&t);
            rt.spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    match weak.upgrade() {
                        Some(t) if !t.closed.load(Ordering::Relaxed) => t.sweep(),
                        _ => return,
                    }
                }
            });
        }
        t
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<SessionKey, Vec<Arc<Proc>>>> {
        self.sessions.locked()
    }

    /// Kill processes idle for their idle time; forget finished ones unused for as long.
    fn sweep(&self) {
        let mut map = self.sessions();
        for procs in map.values_mut() {
            procs.retain(|p| {
                let s = p.state();
                let unused = s.last_used.elapsed();
                match &s.exit {
                    None if unused >= p.idle => {
                        drop(s);
                        p.kill("idle timeout (tools.exec.background_idle_secs)");
                        true
                    }
                    Some(e) => unused.min(e.at.elapsed()) < p.idle,
                    None => true,
                }
            });
        }
        map.retain(|_, v| !v.is_empty());
    }

    /// Kill every process of `session` and forget them (`/new`).
    pub fn kill_session(&self, session: &SessionKey) {
        let procs = self.sessions().remove(session).unwrap_or_default();
        for p in procs {
            p.kill("/new");
        }
    }

    /// Refuse new processes, kill every process and wait (up to 5 s) until all are reaped.
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::Relaxed);
        let all: Vec<Arc<Proc>> = self.sessions().drain().flat_map(|(_, v)| v).collect();
        for p in &all {
            p.kill("shutdown");
        }
        self.tasks.close();
        if tokio::time::timeout(SHUTDOWN_SETTLE, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("background processes not reaped within 5 s of their kill");
        }
    }

    /// Processes running, across all sessions.
    pub fn running(&self) -> usize {
        self.sessions()
            .values()
            .flatten()
            .filter(|p| p.running())
            .count()
    }

    fn find(&self, session: &SessionKey, id: &str) -> Result<Arc<Proc>, ToolError> {
        self.sessions()
            .get(session)
            .and_then(|v| v.iter().find(|p| p.id == id).cloned())
            .ok_or_else(|| {
                ToolError::NotFound(format!(
                    "no background process `{id}` in this chat; `process` with action \"list\" shows this chat's processes"
                ))
            })
    }

    fn list(&self, session: &SessionKey) -> Vec<Arc<Proc>> {
        self.sessions().get(session).cloned().unwrap_or_default()
    }

    fn remove(&self, session: &SessionKey, id: &str) {
        let mut map = self.sessions();
        if let Some(v) = map.get_mut(session) {
            v.retain(|p| p.id != id);
            if v.is_empty() {
                map.remove(session);
            }
        }
    }

    fn cap_error(cap: usize) -> ToolError {
        ToolError::ExecutionFailed(format!(
            "background process limit reached: at most {cap} may run at once in this chat (tools.exec.max_background_processes); kill one (action \"kill\") or wait for one to finish"
        ))
    }

    fn check_room(&self, session: &SessionKey, cap: usize) -> Result<(), ToolError> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(ToolError::ExecutionFailed(
                "the gateway is shutting down: no new background processes".into(),
            ));
        }
        let running = self
            .sessions()
            .get(session)
            .map_or(0, |v| v.iter().filter(|p| p.running()).count());
        if running >= cap {
            return Err(Self::cap_error(cap));
        }
        Ok(())
    }

    /// Start `command` (`sh -c`) for `ctx.session` in the runtime's sandbox.
    async fn start(
        &self,
        rt: &Arc<ExecRuntime>,
        ctx: &ToolContext,
        command: &str,
    ) -> Result<Arc<Proc>, ToolError> {
        let cap = rt.settings.max_background_processes;
        self.check_room(&ctx.session, cap)?;
        rt.gate
            .check_shell(&ctx.session, command, &ctx.cancel)
            .await?;
        let Spawned {
            mut child,
            group,
            cgroup,
            ..
        } = rt
            .spawn_sandboxed(
                ctx,
                OsStr::new("sh"),
                &["-c".into(), command.into()],
                &[],
                Stdio::piped(),
            )
            .await?;
        let stdin = child.stdin.take();
        let pid = child.id().unwrap_or(0);
        let watched = Watched {
            stdout: child.stdout.take(),
            stderr: child.stderr.take(),
            child,
            group,
            cgroup,
        };
        let id = format!("p{}", self.next.fetch_add(1, Ordering::Relaxed));
        let now = Instant::now();
        let p = Arc::new(Proc {
            id,
            command: command.to_string(),
            pid,
            started: now,
            idle: rt.settings.background_idle,
            max_processes: rt.settings.max_processes,
            max_memory_mb: rt.settings.max_memory_mb,
            state: Mutex::new(ProcState {
                out: Ring::new(RING_BYTES),
                cursor: 0,
                exit: None,
                last_used: now,
                killed: None,
            }),
            stdin: tokio::sync::Mutex::new(stdin),
            kill: CancellationToken::new(),
        });
        {
            // Checked again with the process in hand: calls of one turn run in parallel.
            let mut map = self.sessions();
            if self.closed.load(Ordering::Relaxed) {
                return Err(ToolError::ExecutionFailed(
                    "the gateway is shutting down: no new background processes".into(),
                ));
            }
            if ctx.cancel.is_cancelled() {
                // `/new` or `/stop` while it was starting: it would outlive what asked for it.
                return Err(ToolError::Cancelled);
            }
            let procs = map.entry(ctx.session.clone()).or_default();
            if procs.iter().filter(|p| p.running()).count() >= cap {
                // Dropping `watched` kills the group.
                return Err(Self::cap_error(cap));
            }
            let finished = procs.iter().filter(|p| !p.running()).count();
            if finished >= cap {
                if let Some(i) = procs.iter().position(|p| !p.running()) {
                    procs.remove(i);
                }
            }
            procs.push(p.clone());
        }
        self.tasks.spawn(watch(p.clone(), watched, rt.clone()));
        Ok(p)
    }
}

/// What the watcher owns: dropping it kills the process group.
struct Watched {
    child: tokio::process::Child,
    stdout: Option<tokio::process::ChildStdout>,
    stderr: Option<tokio::process::ChildStderr>,
    group: Option<super::runtime::GroupKiller>,
    cgroup: Option<CommandCgroup>,
}

/// Read a pipe into the process's ring until EOF.
async fn pump(p: &Proc, pipe: Option<impl AsyncRead + Unpin>) {
    let Some(mut pipe) = pipe else { return };
    let mut chunk = vec![0u8; READ_CHUNK];
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => p.state().out.push(&chunk[..n]),
        }
    }
}

/// Capture the output of `p` until it exits or is killed; then kill its group, reap it, and
/// record how it ended.
async fn watch(p: Arc<Proc>, w: Watched, rt: Arc<ExecRuntime>) {
    let Watched {
        mut child,
        stdout,
        stderr,
        group,
        cgroup,
    } = w;
    let reading = async { tokio::join!(pump(&p, stdout), pump(&p, stderr)) };
    tokio::pin!(reading);
    let mut read_all = false;
    let status = loop {
        tokio::select! {
            s = child.wait() => break s.ok(),
            _ = &mut reading, if !read_all => read_all = true,
            () = p.kill.cancelled() => break None,
        }
    };
    // Exited or killed: nothing it started outlives it.
    drop(group);
    let status = match status {
        Some(s) => Some(s),
        None => {
            let _ = child.start_kill();
            child.wait().await.ok()
        }
    };
    if !read_all {
        let _ = tokio::time::timeout(DRAIN_GRACE, &mut reading).await;
    }
    let events = cgroup
        .as_ref()
        .map(CommandCgroup::events)
        .unwrap_or_default();
    if let Some(cg) = cgroup {
        drop(tokio::task::spawn_blocking(move || cg.finish()));
    }
    *p.stdin.lock().await = None;
    p.state().exit = Some(Exit {
        code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        at: Instant::now(),
        events,
    });
    drop(rt);
}

/// Arguments of `process`; which fields an action reads is in the schema.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProcessArgs {
    action: String,
    command: Option<String>,
    id: Option<String>,
    data: Option<String>,
    eof: Option<bool>,
    lines: Option<u64>,
    max_bytes: Option<u64>,
}

/// The JSON Schema of the tool's arguments.
const PARAMETERS: &str = r#"{"type":"object","properties":{
"action":{"enum":["start","list","poll","log","write","kill"]},
"command":{"type":"string","description":"start: sh -c command line"},
"id":{"type":"string"},"data":{"type":"string","description":"write: to stdin"},
"eof":{"type":"boolean","description":"write: close stdin"},
"lines":{"type":"integer","description":"log: default 50"},
"max_bytes":{"type":"integer","description":"poll, log: default 16384"}},
"required":["action"]}"#;

/// The `process` tool over the exec runtime and the daemon's process table.
pub struct ProcessTool {
    rt: Arc<ExecRuntime>,
    table: Arc<ProcessTable>,
    description: String,
    parameters: Value,
}

impl ProcessTool {
    /// The tool over the shared runtime and table.
    pub fn new(rt: Arc<ExecRuntime>, table: Arc<ProcessTable>) -> Self {
        let s = &rt.settings;
        let description = format!(
            "Run a long-running shell command in the background (server, watcher, build) and manage it: start -> {{id, pid}}; list; poll -> output since the last poll and status/exit_code; log -> last lines; write -> stdin; kill. Same sandbox and rules as exec_shell; stdout+stderr merged, last {} KiB kept. At most {} running per chat; killed after {} s without poll/log/write, by /new and at shutdown.",
            RING_BYTES / 1024,
            s.max_background_processes,
            s.background_idle.as_secs(),
        );
        let parameters = serde_json::from_str(PARAMETERS).unwrap_or_else(|_| json!({}));
        Self {
            rt,
            table,
            description,
            parameters,
        }
    }
}

fn read_cap(max_bytes: Option<u64>) -> Result<usize, ToolError> {
    match max_bytes {
        None => Ok(DEFAULT_READ_BYTES),
        Some(0) => Err(ToolError::InvalidArgs(format!(
            "max_bytes must be at least 1 (default {DEFAULT_READ_BYTES}, max {MAX_READ_BYTES})"
        ))),
        Some(n) => Ok(usize::try_from(n)
            .unwrap_or(MAX_READ_BYTES)
            .min(MAX_READ_BYTES)),
    }
}

fn need<'a>(v: Option<&'a String>, what: &str, action: &str) -> Result<&'a str, ToolError> {
    match v.map(String::as_str) {
        Some(s) if !s.trim().is_empty() => Ok(s),
        _ => Err(ToolError::InvalidArgs(format!(
            "action \"{action}\" needs `{what}`"
        ))),
    }
}

/// New output of `p` since the last poll, at most `cap` bytes; the cursor moves past it.
fn poll(p: &Proc, cap: usize) -> Value {
    let mut s = p.state();
    let from = s.cursor.max(s.out.start);
    let dropped = from - s.cursor;
    let mut bytes = s.out.from(from);
    let mut more = false;
    if bytes.len() > cap {
        bytes.truncate(cap);
        more = true;
    }
    let head = if dropped > 0 { cut_head(&bytes) } else { 0 };
    let mut end = bytes.len();
    if more || s.exit.is_none() {
        // The rest of a cut character comes with the next poll (unless `max_bytes` is smaller
        // than one character: then it is returned, replaced).
        let whole = complete_prefix(&bytes[head..]);
        if whole > 0 || !more {
            end = head + whole;
        }
    }
    s.cursor = from + end as u64;
    let mut m = p.summary(&s);
    m.insert(
        "output".into(),
        json!(String::from_utf8_lossy(&bytes[head..end])),
    );
    if dropped > 0 {
        m.insert("dropped_bytes".into(), json!(dropped));
    }
    if more {
        m.insert("more".into(), json!(true));
    }
    s.last_used = Instant::now();
    Value::Object(m)
}

/// The last `lines` lines of `p`'s output, at most `cap` bytes; the poll cursor stays.
fn log(p: &Proc, lines: usize, cap: usize) -> Value {
    let mut s = p.state();
    let bytes = s.out.from(s.out.start);
    let body = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
    let mut start = 0;
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == lines {
                start = i + 1;
                break;
            }
        }
    }
    let mut tail = &bytes[start..];
    if start == 0 && s.out.start > 0 {
        tail = &tail[cut_head(tail)..];
    }
    let mut cut = start > 0 || s.out.start > 0;
    if tail.len() > cap {
        tail = &tail[tail.len() - cap..];
        tail = &tail[cut_head(tail)..];
        cut = true;
    }
    let mut m = p.summary(&s);
    m.insert("output".into(), json!(String::from_utf8_lossy(tail)));
    if cut {
        m.insert("earlier_output_omitted".into(), json!(true));
    }
    s.last_used = Instant::now();
    Value::Object(m)
}

#[async_trait]
impl Tool for ProcessTool {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::Process.name()
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn parameters(&self) -> Value {
        self.parameters.clone()
    }
    fn effect(&self) -> Effect {
        Effect::Executes
    }
    fn time_budget(&self) -> Option<Duration> {
        Some(self.rt.settings.approval_timeout + Duration::from_secs(30))
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: ProcessArgs = parse_args(self.name(), args)?;
        let session = &ctx.session;
        match a.action.as_str() {
            "start" => {
                let command = need(a.command.as_ref(), "command", "start")?;
                if command.contains('\0') {
                    return Err(ToolError::InvalidArgs("command contains a NUL byte".into()));
                }
                let p = self.table.start(&self.rt, ctx, command).await?;
                let mut m = p.summary(&p.state());
                m.insert(
                    "hint".into(),
                    json!("poll with this id for its output; kill it when done"),
                );
                Ok(Value::Object(m))
            }
            "list" => {
                let procs: Vec<Value> = self
                    .table
                    .list(session)
                    .iter()
                    .map(|p| Value::Object(p.summary(&p.state())))
                    .collect();
                Ok(json!({ "processes": procs }))
            }
            "poll" => {
                let cap = read_cap(a.max_bytes)?;
                let p = self
                    .table
                    .find(session, need(a.id.as_ref(), "id", "poll")?)?;
                Ok(poll(&p, cap))
            }
            "log" => {
                let cap = read_cap(a.max_bytes)?;
                let lines = match a.lines {
                    None => DEFAULT_LOG_LINES,
                    Some(0) => {
                        return Err(ToolError::InvalidArgs(
                            "lines must be at least 1 (default 50)".into(),
                        ))
                    }
                    Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
                };
                let p = self
                    .table
                    .find(session, need(a.id.as_ref(), "id", "log")?)?;
                Ok(log(&p, lines, cap))
            }
            "write" => {
                let p = self
                    .table
                    .find(session, need(a.id.as_ref(), "id", "write")?)?;
                let data = a.data.unwrap_or_default();
                let eof = a.eof.unwrap_or(false);
                if data.is_empty() && !eof {
                    return Err(ToolError::InvalidArgs(
                        "action \"write\" needs `data` (or `eof`: true to close stdin)".into(),
                    ));
                }
                if data.len() > MAX_WRITE_BYTES {
                    return Err(ToolError::InvalidArgs(format!(
                        "data is {} bytes; at most {MAX_WRITE_BYTES} per write",
                        data.len()
                    )));
                }
                p.state().last_used = Instant::now();
                let mut stdin = p.stdin.lock().await;
                let Some(pipe) = stdin.as_mut() else {
                    return Err(ToolError::ExecutionFailed(format!(
                        "`{}` has no stdin any more (closed with eof, or the process ended)",
                        p.id
                    )));
                };
                if !data.is_empty() {
                    let wrote = tokio::time::timeout(WRITE_TIMEOUT, async {
                        pipe.write_all(data.as_bytes()).await?;
                        pipe.flush().await
                    })
                    .await;
                    match wrote {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            *stdin = None;
                            return Err(ToolError::ExecutionFailed(format!(
                                "writing to `{}` failed: {e} (the process closed its stdin or ended)",
                                p.id
                            )));
                        }
                        Err(_) => {
                            return Err(ToolError::ExecutionFailed(format!(
                                "`{}` did not read its stdin within {} s; part of the data may have been written",
                                p.id,
                                WRITE_TIMEOUT.as_secs()
                            )))
                        }
                    }
                }
                if eof {
                    *stdin = None;
                }
                drop(stdin);
                let mut m = p.summary(&p.state());
                m.insert("written_bytes".into(), json!(data.len()));
                if eof {
                    m.insert("stdin_closed".into(), json!(true));
                }
                Ok(Value::Object(m))
            }
            "kill" => {
                let p = self
                    .table
                    .find(session, need(a.id.as_ref(), "id", "kill")?)?;
                if !p.running() {
                    self.table.remove(session, &p.id);
                    let mut m = p.summary(&p.state());
                    m.insert("removed".into(), json!(true));
                    return Ok(Value::Object(m));
                }
                p.kill("kill");
                // Reaped within moments; report the end when it is seen.
                let end = Instant::now() + Duration::from_secs(2);
                while p.running() && Instant::now() < end {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let m = p.summary(&p.state());
                Ok(Value::Object(m))
            }
            other => Err(ToolError::InvalidArgs(format!(
                "unknown action `{other}`; one of start, list, poll, log, write, kill"
            ))),
        }
    }
}

#[cfg(test)]
#[path = "process_tests.rs"]
mod tests;
