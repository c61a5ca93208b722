//! The prompt window of a session (docs/architecture.md, "Prompt window and compaction").
//!
//! A session keeps in memory, and sends to the model, only its window: the summary of the
//! older conversation (one marked user message after the system prompt) and the messages
//! after the compaction point, verbatim. Before the prompt would pass
//! `compaction.threshold` of the model's context window, the agent gets one silent **memory
//! flush** turn (save what is worth keeping with `memory_write`; its reply and messages are
//! neither shown nor stored), then older turns are **summarised** by the model into the new
//! summary and the compaction point moves (a record in the store; the transcript itself is
//! never deleted). A provider's context-length error compacts and retries once; a message too
//! large for the window on its own is refused with its size.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::llm::{tokens, ChatRequest, Message, Role};
use crate::store::window::Compaction;
use crate::store::Store;
use crate::tools::builtin::Builtin;
use crate::turn::{run_turn, AgentDeps, TurnDeps, TurnEvent, TurnOutcome, TurnStatus};
use crate::types::MutexExt;
use crate::types::SessionKey;

/// How the summary enters the prompt (a user message right after the system prompt).
pub const SUMMARY_HEADER: &str = "[Summary of the earlier conversation, written by you for yourself when it was compacted. The full messages are no longer in this prompt; the history_search tool finds their words.]";

/// The instruction of the memory flush turn.
pub const FLUSH_PROMPT: &str = "[Context maintenance, not from the user] This conversation is about to be compacted: its older messages will be replaced by a summary. Save anything worth keeping for later (facts about the user, preferences, decisions, open tasks) with memory_write now. Then reply exactly NO_REPLY. Nothing of this exchange is shown to the user.";

/// The system prompt of the summary call.
pub const SUMMARY_SYSTEM: &str = "You summarise conversations between a user and an AI assistant for the assistant's future self. Summarise the conversation so far: facts learned, decisions made, open tasks and questions, user preferences, names, numbers and file paths that matter. Be concise, use short bullet points, and write nothing else.";

/// Tool results in the kept part of a window are cut to this many bytes.
pub const KEPT_TOOL_RESULT_BYTES: usize = 2048;

/// What the session holds of its window.
#[derive(Clone, Debug, Default)]
pub struct WindowState {
    /// The compaction record (default: never compacted).
    pub compaction: Compaction,
    /// Learned from a provider's context-length error: the window is at most this.
    pub learned_window: Option<u64>,
    /// Provider-reported prompt tokens / estimated ones, from the last call (>= 1).
    pub calibration: f64,
}

impl WindowState {
    fn calibrated(&self, est: u64) -> u64 {
        let f = if self.calibration.is_finite() {
            self.calibration.clamp(1.0, 3.0)
        } else {
            1.0
        };
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let v = (est as f64 * f).ceil() as u64;
        v
    }
}

/// A window change made while a turn ran, applied by the session when the turn finishes.
#[derive(Clone, Debug)]
pub struct WindowUpdate {
    /// The new state.
    pub state: WindowState,
    /// The new window messages when it was compacted (the turn's own messages come after).
    pub messages: Option<Vec<Message>>,
}

/// The session's window at start: the compaction record and the messages after it.
///
/// # Errors
/// Store failure.
pub fn load(
    store: &Store,
    key: &SessionKey,
) -> Result<(WindowState, Vec<Message>), crate::store::StoreError> {
    let compaction = store.compaction(key)?.unwrap_or_default();
    let mut msgs = Vec::new();
    for (seq, mut m) in store.load_transcript_from(key, compaction.from_seq)? {
        if seq < compaction.shortened_until {
            shorten(&mut m);
        }
        msgs.push(m);
    }
    Ok((
        WindowState {
            compaction,
            learned_window: None,
            calibration: 1.0,
        },
        msgs,
    ))
}

/// The history a turn is given: the summary (if any), then the window.
pub fn history(state: &WindowState, msgs: &[Message]) -> Vec<Message> {
    let mut h = Vec::with_capacity(msgs.len() + 1);
    if !state.compaction.summary.is_empty() {
        h.push(summary_message(&state.compaction.summary));
    }
    h.extend_from_slice(msgs);
    h
}

fn summary_message(summary: &str) -> Message {
    Message::user(format!("{SUMMARY_HEADER}\n\n{summary}"))
}

/// Cut a long tool result to [`KEPT_TOOL_RESULT_BYTES`], with a marker.
fn shorten(m: &mut Message) {
    if m.role != Role::Tool || m.content.len() <= KEPT_TOOL_RESULT_BYTES {
        return;
    }
    let mut cut = KEPT_TOOL_RESULT_BYTES;
    while !m.content.is_char_boundary(cut) {
        cut -= 1;
    }
    let total = m.content.len();
    m.content.truncate(cut);
    m.content.push_str(&format!(
        "\n[… tool result shortened from {total} bytes when the conversation was compacted]"
    ));
}

/// Sizes of the prompt window, in estimated tokens.
#[derive(Clone, Copy, Debug)]
struct Budget {
    /// The model's window (configured, or learned smaller).
    window: u64,
    /// Room left for the reply.
    reserve: u64,
    /// Compact when the prompt passes this.
    limit: u64,
    /// System prompt, skills, the list of tools not loaded, and the tool schemas: the core
    /// ones and those the window's messages loaded.
    overhead: u64,
}

impl Budget {
    /// The budget of a request over the window `msgs` (the tools they load are counted).
    fn of(deps: &TurnDeps, state: &WindowState, msgs: &[Message]) -> Self {
        let s = &deps.shared.agent.window;
        let window = state
            .learned_window
            .map_or(s.context_window, |l| l.min(s.context_window))
            .max(512);
        let reserve = reserve(&deps.shared.agent, window);
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let at = (window as f64 * s.threshold) as u64;
        // The prompt budget (never above the window) bounds the prompt too: older turns are
        // summarised before a request would carry more.
        let limit = at
            .saturating_sub(reserve)
            .max(window / 4)
            .min(s.prompt_budget.max(1024));
        Self {
            window,
            reserve,
            limit,
            overhead: state.calibrated(overhead(deps) + loaded_overhead(deps, msgs)),
        }
    }

    /// Room for summary plus window messages.
    fn room(&self) -> u64 {
        self.limit.saturating_sub(self.overhead)
    }

    /// Most tokens a summary may take.
    fn summary_cap(&self) -> u64 {
        (self.room() / 5).clamp(128, 2048)
    }
}

/// Room kept for the reply in a `window`: `max_tokens`, else 1/8 of the window (at most
/// 4096), never more than half.
fn reserve(agent: &crate::config::AgentConfig, window: u64) -> u64 {
    agent
        .max_tokens
        .map_or((window / 8).min(4096), u64::from)
        .min(window / 2)
}

/// How long an overhead estimate is reused: the skills directories are read again after it (a
/// skill added on disk is counted within this time; a reload of the tools at once).
const OVERHEAD_TTL: std::time::Duration = std::time::Duration::from_secs(5);

/// One cached overhead estimate: for this tool registry, system prompt and workspace. Weak
/// references: the cache must not keep a stopped gateway's tools (and through them its store)
/// alive, and a weak reference keeps the address from being reused while it is cached.
struct CachedOverhead {
    registry: std::sync::Weak<crate::tools::registry::ToolRegistry>,
    system: std::sync::Weak<str>,
    workspace: std::sync::Weak<crate::tools::Workspace>,
    at: std::time::Instant,
    tokens: u64,
}

/// Estimated tokens of the system prompt (with the skills section) and the tool list. Every
/// turn asks up to three times, and computing it reads the skills directories and serialises
/// every tool schema: it is cached per (registry, system prompt, workspace) for
/// [`OVERHEAD_TTL`].
fn overhead(deps: &TurnDeps) -> u64 {
    static CACHE: std::sync::Mutex<Vec<CachedOverhead>> = std::sync::Mutex::new(Vec::new());
    let registry = deps.shared.tools.current();
    let now = std::time::Instant::now();
    let same = |c: &CachedOverhead| {
        std::ptr::eq(c.registry.as_ptr(), std::sync::Arc::as_ptr(&registry))
            && std::ptr::addr_eq(
                c.system.as_ptr(),
                std::sync::Arc::as_ptr(&deps.turn.system_prompt),
            )
            && std::ptr::eq(
                c.workspace.as_ptr(),
                std::sync::Arc::as_ptr(&deps.shared.workspace),
            )
    };
    {
        let cache = CACHE.locked();
        if let Some(c) = cache
            .iter()
            .find(|c| same(c) && now.duration_since(c.at) < OVERHEAD_TTL)
        {
            return c.tokens;
        }
    }
    let skills = crate::skills::SkillDirs {
        global: deps.shared.skills_global.clone(),
        workspace: deps.shared.workspace.clone(),
    }
    .load();
    let tokens = overhead_of(
        &registry,
        &deps.turn.system_prompt,
        &skills,
        &deps.turn.preload,
    );
    let mut cache = CACHE.locked();
    cache.retain(|c| {
        !same(c) && c.registry.strong_count() > 0 && now.duration_since(c.at) < OVERHEAD_TTL
    });
    cache.push(CachedOverhead {
        registry: std::sync::Arc::downgrade(&registry),
        system: std::sync::Arc::downgrade(&deps.turn.system_prompt),
        workspace: std::sync::Arc::downgrade(&deps.shared.workspace),
        at: now,
        tokens,
    });
    tokens
}

/// Estimated tokens of what every request carries: the system prompt `system` with the
/// skills section and the list of tools not loaded, and the schemas of the core tools (and of
/// `preload`).
pub fn overhead_of(
    registry: &crate::tools::registry::ToolRegistry,
    system: &str,
    skills: &[crate::skills::Skill],
    preload: &[String],
) -> u64 {
    let offer = registry.offer(&[], preload, crate::turn::offer::omitted(skills));
    let system = crate::turn::offer::system_text(system, skills, &offer.deferred);
    tokens::of_message(&Message::system(system)) + tokens::of_tools(&offer.specs)
}

/// Tokens of a short user message counted as "one exchange" by [`fits_one_exchange`] (the
/// reply is the reserve).
const ONE_LINE_TOKENS: u64 = 64;

/// Whether a model with `agent`'s window can answer anything at all: the instructions and the
/// core tools (`overhead`, estimated tokens, see [`overhead_of`]) plus a one-line message and
/// the room kept for the reply. Checked at the gateway's start and by `weft doctor` (issue
/// 32), so a window too small is known before the first message.
///
/// # Errors
/// What is wrong and what to change, with the numbers.
pub fn fits_one_exchange(agent: &crate::config::AgentConfig, overhead: u64) -> Result<(), String> {
    let window = agent.window.context_window.max(512);
    let reserve = reserve(agent, window);
    if overhead + ONE_LINE_TOKENS + reserve <= window {
        return Ok(());
    }
    Err(format!(
        "this model's context window is {window} tokens ({overhead} of them taken by the instructions and tools, {reserve} kept for the reply), so no message can be answered: set agents.defaults.context_window to the model's real window, lower max_tokens, shorten the context files, or pin fewer tools (tools.always)"
    ))
}

/// [`fits_one_exchange`] for an agent's dependencies, as its first turn would see them.
///
/// # Errors
/// See [`fits_one_exchange`].
pub fn check_fits(deps: &Arc<AgentDeps>) -> Result<(), String> {
    fits_one_exchange(&deps.agent, overhead(&deps.for_turn(None)))
}

/// Estimated tokens of the schemas of the tools `msgs` load beyond the core ones
/// (`turn::offer`): what a request over them sends on top of [`overhead`].
fn loaded_overhead(deps: &TurnDeps, msgs: &[Message]) -> u64 {
    let registry = deps.shared.tools.current();
    let loaded = crate::turn::offer::loaded_by(&registry, &deps.turn.preload, msgs);
    if loaded.is_empty() {
        return 0;
    }
    let offer = registry.offer(&[], &loaded, &[]);
    tokens::of_tools(offer.specs.get(offer.core..).unwrap_or_default())
}

/// Estimated tokens of the time a request puts before each user message ("[Tue 2026-12-08
/// 09:14 Europe/Paris] "): counted here as the request estimate counts it.
const STAMP_TOKENS: u64 = 10;

fn est_messages(state: &WindowState, msgs: &[Message]) -> u64 {
    state.calibrated(
        msgs.iter()
            .map(|m| {
                tokens::of_message(m)
                    + if m.at_ms.is_some() && m.role == Role::User {
                        STAMP_TOKENS
                    } else {
                        0
                    }
            })
            .sum(),
    )
}

/// When a message alone cannot fit the model's window: what to tell the user.
pub fn too_large(deps: &TurnDeps, state: &WindowState, text: &str) -> Option<String> {
    let b = Budget::of(deps, state, &[]);
    let tokens = state.calibrated(tokens::of_message(&Message::user(text)));
    (b.overhead + tokens + b.reserve > b.window).then(|| {
        format!(
            "Your message is ~{tokens} tokens; this model's context window is {} tokens ({} of them taken by the instructions and tools, {} kept for the reply), so it cannot be answered. Send it as a file or in parts.",
            b.window, b.overhead, b.reserve
        )
    })
}

/// What compaction did.
#[derive(Clone, Debug, Default)]
pub struct Compacted {
    /// Messages summarised by this compaction.
    pub summarised: usize,
    /// Messages left verbatim.
    pub kept: usize,
    /// Estimated tokens of the summary.
    pub summary_tokens: u64,
    /// Whether the memory flush turn ran and completed.
    pub flushed: bool,
}

/// Why nothing was compacted.
#[derive(Clone, Debug)]
pub enum NotCompacted {
    /// Nothing older than the current turn to summarise.
    Nothing,
    /// The summary call failed.
    Failed(String),
    /// Cancelled.
    Cancelled,
}

/// Compact `msgs` (the window; a pending user message last stays verbatim): memory flush,
/// then summary of the older messages, then the record. On success `state` and `msgs` are
/// the new window.
async fn compact(
    deps: &TurnDeps,
    key: &SessionKey,
    state: &mut WindowState,
    msgs: &mut Vec<Message>,
    unstored: usize,
    force: bool,
    cancel: &CancellationToken,
) -> Result<Compacted, NotCompacted> {
    let b = Budget::of(deps, state, msgs);
    // Shorten long tool results of earlier turns first (the store keeps them whole).
    let last_user = msgs.iter().rposition(|m| m.role == Role::User).unwrap_or(0);
    for m in &mut msgs[..last_user] {
        shorten(m);
    }
    // The cut: at a user message (never between a tool call and its results), keeping the
    // most recent turns within half of the room left beside the summary.
    let keep_budget = b.room().saturating_sub(b.summary_cap()) / 2;
    let mut cut = last_user;
    let mut kept = est_messages(state, &msgs[last_user..]);
    if force {
        // `/compact`: everything before the last exchange.
        cut = msgs[..last_user]
            .iter()
            .rposition(|m| m.role == Role::User)
            .unwrap_or(last_user);
        kept = u64::MAX;
    }
    for i in (0..last_user).rev() {
        kept = kept.saturating_add(est_messages(state, std::slice::from_ref(&msgs[i])));
        if kept > keep_budget {
            break;
        }
        if msgs[i].role == Role::User {
            cut = i;
        }
    }
    if cut == 0 {
        return Err(NotCompacted::Nothing);
    }
    let base = deps
        .shared
        .store
        .next_seq(key)
        .map_err(|e| NotCompacted::Failed(e.to_string()))?
        .saturating_sub((msgs.len() - unstored) as u64);

    // The flush sees as much of the conversation as fits the prompt budget (from a user
    // message on): it is a request like the others.
    let mut start = 0;
    let fits = b.limit.saturating_sub(
        b.overhead + flush_overhead(deps, state) + tokens::of_text(FLUSH_PROMPT) + 16,
    );
    while start < last_user && est_messages(state, &history(state, &msgs[start..last_user])) > fits
    {
        start = msgs[start + 1..last_user]
            .iter()
            .position(|m| m.role == Role::User)
            .map_or(last_user, |p| start + 1 + p);
    }
    let flushed = flush(deps, key, state, &msgs[start..last_user], cancel).await;
    if cancel.is_cancelled() {
        return Err(NotCompacted::Cancelled);
    }
    let summary = summarise(deps, state, &b, &msgs[..cut], cancel).await?;
    let summary_tokens = tokens::of_text(&summary);
    let c = &state.compaction;
    let record = Compaction {
        summary,
        from_seq: base + cut as u64,
        shortened_until: base + last_user as u64,
        summarised: c.summarised + cut as u64,
        count: c.count + 1,
    };
    let durable = deps
        .shared
        .store
        .put_compaction(key, &record)
        .map_err(|e| NotCompacted::Failed(e.to_string()))?;
    durable
        .await
        .map_err(|e| NotCompacted::Failed(e.to_string()))?;
    crate::metrics::inc("clawft_compactions_total", &[], 1);
    tracing::info!(
        summarised = cut,
        kept = msgs.len() - cut,
        summary_tokens,
        flushed,
        from_seq = record.from_seq,
        "prompt window compacted"
    );
    state.compaction = record;
    msgs.drain(..cut);
    Ok(Compacted {
        summarised: cut,
        kept: msgs.len(),
        summary_tokens,
        flushed,
    })
}

/// Estimated tokens the flush adds to a request's tools: the schema of `memory_write`, which it
/// loads.
fn flush_overhead(deps: &TurnDeps, state: &WindowState) -> u64 {
    let registry = deps.shared.tools.current();
    let offer = registry.offer(&[], &[Builtin::MemoryWrite.name().to_string()], &[]);
    state.calibrated(tokens::of_tools(
        offer.specs.get(offer.core..).unwrap_or_default(),
    ))
}

/// The memory flush: one silent turn asking the agent to save what it wants to keep. Its
/// messages go to a throwaway store and its reply nowhere. Skipped when `memory_write` is not
/// among the tools.
async fn flush(
    deps: &TurnDeps,
    key: &SessionKey,
    state: &WindowState,
    before: &[Message],
    cancel: &CancellationToken,
) -> bool {
    let has_memory = deps
        .shared
        .tools
        .current()
        .allowed_names()
        .iter()
        .any(|t| t == Builtin::MemoryWrite.name());
    if !has_memory || before.is_empty() {
        return false;
    }
    let mut silent = deps.clone();
    silent.shared = Arc::new(AgentDeps {
        store: Store::memory(),
        ..(*deps.shared).clone()
    });
    silent.turn.preload = Arc::from([Builtin::MemoryWrite.name().to_string()]);
    let mut h = history(state, before);
    h.push(Message::user(FLUSH_PROMPT));
    let o = run_turn(&silent, key, &h, None, cancel).await;
    tracing::info!(status = ?o.status, tool_calls = o.tool_calls, "memory flush before compaction");
    o.status == TurnStatus::Completed
}

/// One transcript message as text for the summariser.
fn render(m: &Message, out: &mut String) {
    let content = if m.role == Role::Tool && m.content.len() > KEPT_TOOL_RESULT_BYTES {
        let mut t = m.clone();
        shorten(&mut t);
        t.content
    } else {
        m.content.clone()
    };
    match m.role {
        Role::System => return,
        Role::User => out.push_str("User: "),
        Role::Assistant => out.push_str("Assistant: "),
        Role::Tool => {
            out.push_str(&format!(
                "Tool result ({}): ",
                m.name.as_deref().unwrap_or("tool")
            ));
        }
    }
    out.push_str(&content);
    for c in &m.tool_calls {
        out.push_str(&format!("\n(called {} with {})", c.name, c.arguments));
    }
    out.push_str("\n\n");
}

/// Summarise `older` (with the previous summary) into one text, in chunks that fit the
/// window.
async fn summarise(
    deps: &TurnDeps,
    state: &WindowState,
    b: &Budget,
    older: &[Message],
    cancel: &CancellationToken,
) -> Result<String, NotCompacted> {
    let cap = b.summary_cap();
    // Each summary call: instructions + previous summary + a chunk + the reply.
    let chunk_tokens = b
        .window
        .saturating_sub(b.reserve.max(cap) + 2 * cap + 256)
        .max(256)
        / 2;
    let chunk_bytes =
        usize::try_from(chunk_tokens).unwrap_or(usize::MAX) * tokens::BYTES_PER_TOKEN * 10 / 12;
    let mut summary = state.compaction.summary.clone();
    let mut text = String::new();
    let mut i = 0;
    while i < older.len() {
        text.clear();
        while i < older.len() {
            let before = text.len();
            render(&older[i], &mut text);
            if text.len() > chunk_bytes && before > 0 {
                text.truncate(before);
                break;
            }
            i += 1;
        }
        if text.len() > chunk_bytes {
            // One message larger than a chunk: its beginning stands for it.
            let mut cut = chunk_bytes;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push_str("\n[… cut]\n");
        }
        let mut prompt = String::new();
        if !summary.is_empty() {
            prompt.push_str("Summary of the conversation before these messages:\n");
            prompt.push_str(&summary);
            prompt.push_str("\n\n");
        }
        prompt.push_str("Messages:\n\n");
        prompt.push_str(&text);
        prompt.push_str("Write the updated summary now.");
        let req = ChatRequest {
            model: deps
                .shared
                .agent
                .window
                .summary_model
                .clone()
                .unwrap_or_default(),
            messages: vec![Message::system(SUMMARY_SYSTEM), Message::user(prompt)],
            tools: Arc::new([]),
            max_tokens: Some(u32::try_from(cap).unwrap_or(2048)),
            temperature: None,
        };
        let r = tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(NotCompacted::Cancelled),
            r = deps.shared.model.complete(&req, None) => r,
        };
        match r {
            Ok(r) if !r.content.trim().is_empty() => {
                let mut s = r.content.trim().to_string();
                let max = usize::try_from(cap).unwrap_or(usize::MAX) * tokens::BYTES_PER_TOKEN;
                if s.len() > max {
                    let mut cut = max;
                    while !s.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    s.truncate(cut);
                }
                summary = s;
            }
            Ok(_) => return Err(NotCompacted::Failed("the summary came back empty".into())),
            Err(e) => {
                tracing::warn!(error = %e, "summary for compaction failed");
                return Err(NotCompacted::Failed(e.to_string()));
            }
        }
    }
    Ok(summary)
}

fn too_long_reply(deps: &TurnDeps, state: &WindowState, msgs: &[Message]) -> String {
    let b = Budget::of(deps, state, msgs);
    let user = msgs
        .iter()
        .rev()
        .find(|m| m.role == Role::User)
        .map_or(0, |m| state.calibrated(tokens::of_message(m)));
    format!(
        "The model refused the conversation as too long for its context window, even after compacting it: your message is ~{user} tokens; this model's window is ~{} tokens. Send it as a file or in parts, or /new to start over.",
        b.window
    )
}

/// Run a turn over the window: compacted first when the prompt would pass the threshold, and
/// compacted and retried once when the provider answers with a context-length error.
pub async fn run_windowed(
    deps: &TurnDeps,
    key: &SessionKey,
    mut state: WindowState,
    mut msgs: Vec<Message>,
    events: Option<&mpsc::Sender<TurnEvent>>,
    cancel: &CancellationToken,
) -> (TurnOutcome, Option<WindowUpdate>) {
    let mut compacted = false;
    // MCP servers still on their first connection attempt: wait (bounded, as `run_turn` does)
    // before the budget is estimated, so their tool schemas are counted in it.
    let registry = deps.shared.tools.current();
    tokio::select! {
        () = registry.first_connect() => {}
        () = cancel.cancelled() => {}
    }
    drop(registry);
    let b = Budget::of(deps, &state, &msgs);
    if b.overhead + est_messages(&state, &history(&state, &msgs)) > b.limit {
        match compact(deps, key, &mut state, &mut msgs, 0, false, cancel).await {
            Ok(_) => compacted = true,
            Err(e) => tracing::warn!(reason = ?e, "the prompt window could not be compacted"),
        }
    }
    let mut outcome = run_turn(deps, key, &history(&state, &msgs), events, cancel).await;
    if outcome.context_overflow {
        // The real window is smaller than assumed: below the refused prompt.
        let refused = state.calibrated(outcome.last_prompt.0.max(1));
        // A server that said what it really holds (a local server that cut the prompt
        // silently, Ollama's `num_ctx`): below that, with room for the answer.
        let shown = outcome
            .overflow_window
            .map_or(u64::MAX, |w| (w * 90 / 100).max(1024));
        state.learned_window = Some(
            (refused * 95 / 100)
                .min(shown)
                .min(state.learned_window.unwrap_or(u64::MAX)),
        );
        tracing::warn!(
            refused_tokens = refused,
            server_window = outcome.overflow_window,
            learned_window = state.learned_window,
            "context window exceeded (or the prompt was cut by the server); compacting and retrying once"
        );
        // Tool rounds of the refused turn are stored: they belong to the window.
        msgs.append(&mut outcome.messages);
        let usage = outcome.usage;
        match compact(deps, key, &mut state, &mut msgs, 0, false, cancel).await {
            Ok(_) => {
                compacted = true;
                outcome = run_turn(deps, key, &history(&state, &msgs), events, cancel).await;
                outcome.usage.add(&usage);
                if outcome.context_overflow {
                    outcome.messages.clear();
                    outcome.reply = too_long_reply(deps, &state, &msgs);
                    outcome.status = TurnStatus::Failed(outcome.reply.clone());
                }
            }
            Err(_) => {
                compacted = true; // the refused turn's messages moved into `msgs`
                outcome.reply = too_long_reply(deps, &state, &msgs);
                outcome.status = TurnStatus::Failed(outcome.reply.clone());
            }
        }
    }
    if outcome.last_prompt.0 > 0 && outcome.last_prompt.1 > 0 {
        #[allow(clippy::cast_precision_loss)]
        let f = outcome.last_prompt.1 as f64 / outcome.last_prompt.0 as f64;
        state.calibration = f.clamp(1.0, 3.0);
    }
    let update = WindowUpdate {
        state,
        messages: compacted.then_some(msgs),
    };
    (outcome, Some(update))
}

/// `/compact`: flush and compact now, whatever the size. The reply says what was done.
pub async fn compact_now(
    deps: &TurnDeps,
    key: &SessionKey,
    mut state: WindowState,
    mut msgs: Vec<Message>,
    cancel: &CancellationToken,
) -> (TurnOutcome, Option<WindowUpdate>) {
    // Keep the last turn verbatim: compact as if a new message followed it.
    msgs.push(Message::user(String::new()));
    let r = compact(deps, key, &mut state, &mut msgs, 1, true, cancel).await;
    msgs.pop();
    let mut o = TurnOutcome::failed("");
    let (status, reply, changed) = match r {
        Ok(c) => (
            TurnStatus::Completed,
            format!(
                "Compacted {} messages into a summary (≈{} tokens){}; the last {} stay verbatim. The full history stays stored.",
                c.summarised,
                c.summary_tokens,
                if c.flushed { " after saving notes to memory" } else { "" },
                c.kept.saturating_sub(1)
            ),
            true,
        ),
        Err(NotCompacted::Nothing) => (
            TurnStatus::Completed,
            "Nothing to compact yet: the conversation is only the last exchange.".to_string(),
            false,
        ),
        Err(NotCompacted::Cancelled) => (
            TurnStatus::Cancelled,
            "Stopped: compaction was cancelled.".to_string(),
            false,
        ),
        Err(NotCompacted::Failed(e)) => {
            let t = format!("Compaction failed: {e}");
            (TurnStatus::Failed(t.clone()), t, false)
        }
    };
    o.status = status;
    o.reply = reply;
    let update = WindowUpdate {
        state,
        messages: changed.then_some(msgs),
    };
    (o, Some(update))
}
