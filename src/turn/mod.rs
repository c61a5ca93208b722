//! ④ One turn: the LLM ⇄ tools loop of seed 002 for one user message.
//!
//! A plain async function run in a task the session spawns. It persists each assistant tool-call
//! message before running the tools and their results after, so a crash leaves at most orphan
//! calls that the session repairs on load. It never touches the journal or the outbox.

mod answer;
pub mod context;
pub mod guard;
pub mod offer;
mod round;
pub mod shared_usage;
pub mod usage;

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::AgentConfig;
use crate::llm::{
    ChatRequest, ChatResponse, DynModel, LlmError, Message, Role, StreamEvent, Usage,
};
use crate::store::Store;
use crate::tools::{ToolContext, ToolError, Workspace};
use crate::types::SessionKey;

/// What a turn needs, shared by all turns of all sessions.
#[derive(Clone)]
pub struct TurnDeps {
    /// The model (usually a retrying/failover wrapper).
    pub model: DynModel,
    /// Tools offered to the model (replaced on a config reload; a turn keeps the one it
    /// started with).
    pub tools: Arc<crate::tools::registry::ToolsHandle>,
    /// Where transcripts go.
    pub store: Store,
    /// Agent settings.
    pub agent: Arc<AgentConfig>,
    /// The workspace handle.
    pub workspace: Arc<Workspace>,
    /// The system prompt (as of this turn: see [`TurnDeps::for_turn`]).
    pub system_prompt: Arc<str>,
    /// Where the system prompt comes from: the base text and the workspace's context files.
    pub context: Arc<context::ContextPrompt>,
    /// Extra hint appended to provider connection errors (what to configure).
    pub connect_hint: Option<Arc<str>>,
    /// Per provider: where its key and base URL came from, told with an auth or connection
    /// failure.
    pub provider_hints:
        Arc<std::collections::BTreeMap<String, crate::config::provenance::ProviderHints>>,
    /// The global skills directory (`~/.clawft/skills`); workspace skills are always read.
    pub skills_global: Option<std::path::PathBuf>,
    /// Prices, budgets and today's spend (checked between LLM calls).
    pub usage: Arc<usage::UsageLedger>,
    /// `memory.scope`: whether chat users get their own memory.
    pub memory_scope: crate::memory::settings::Scope,
    /// This turn's chat user's memory directory (see [`TurnDeps::for_turn_by`]).
    pub user_dir: Option<Arc<str>>,
    /// This turn's chat user (sender id), given to the tools ([`ToolContext::sender`]).
    pub sender: Option<Arc<str>>,
    /// The model asked of the provider for this turn (`heartbeat.model`); `None`: the
    /// provider's configured model.
    pub request_model: Option<Arc<str>>,
    /// The event id of the inbound message this turn answers, given to the tools
    /// ([`crate::tools::TurnScope::event_id`]); `None` for a subagent's or a maintenance turn.
    pub turn_event: Option<Arc<str>>,
    /// Tools loaded from the turn's start, on top of the core ones (the memory flush's
    /// `memory_write`); see [`offer`].
    pub preload: Arc<[String]>,
    /// When this chat's answers are spoken (`reply_with_voice`, or the chat's `/voice`).
    pub voice: crate::types::VoiceReplies,
}

impl TurnDeps {
    /// These dependencies with the system prompt as of now (context files re-read if one
    /// changed; otherwise the same `Arc`). Asked once per turn.
    #[must_use]
    pub fn for_turn(&self) -> Self {
        self.for_turn_by(None)
    }

    /// [`Self::for_turn`] for a message from `user` (`(channel, sender id)`): under
    /// `memory.scope = "user"` the turn gets that user's memory directory
    /// (`users/<channel>-<sender>`) and their `USER.md`. `None` (the terminal, the control
    /// token, the gateway's own messages) keeps the agent's memory.
    #[must_use]
    pub fn for_turn_by(&self, user: Option<(&str, &str)>) -> Self {
        let user_dir: Option<Arc<str>> = match (self.memory_scope, user) {
            (crate::memory::settings::Scope::User, Some((channel, sender))) => {
                Some(crate::memory::scope::user_dir(channel, sender).into())
            }
            _ => None,
        };
        Self {
            system_prompt: self.context.current_for(user_dir.as_deref()),
            user_dir,
            sender: user.map(|(_, sender)| sender.into()),
            ..self.clone()
        }
    }
}

/// Every agent's dependencies; a session's are chosen by the agent of its key
/// ([`SessionKey::agent`]).
#[derive(Clone)]
pub struct Agents {
    main: TurnDeps,
    named: Arc<std::collections::BTreeMap<String, TurnDeps>>,
}

impl Agents {
    /// One agent, the default one.
    pub fn single(main: TurnDeps) -> Self {
        Self::new(main, std::collections::BTreeMap::new())
    }

    /// The default agent and the others by name.
    pub fn new(main: TurnDeps, named: std::collections::BTreeMap<String, TurnDeps>) -> Self {
        Self {
            main,
            named: Arc::new(named),
        }
    }

    /// The default agent's.
    pub fn main(&self) -> &TurnDeps {
        &self.main
    }

    /// Agent `name`'s (`main` included).
    pub fn get(&self, name: &str) -> Option<&TurnDeps> {
        if name == crate::types::session_key::DEFAULT_AGENT {
            return Some(&self.main);
        }
        self.named.get(name)
    }

    /// The dependencies of the session `key`. A key of an agent no longer configured (its
    /// messages journaled before a reconfiguration) is served by the default agent, so nothing
    /// journaled is left unanswered.
    pub fn for_key(&self, key: &SessionKey) -> &TurnDeps {
        let agent = key.agent();
        self.get(agent).unwrap_or_else(|| {
            tracing::warn!(session = %key, agent, "no agent of this name is configured: the default agent answers");
            &self.main
        })
    }

    /// Every agent: `(name, deps)`, the default one first.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &TurnDeps)> {
        std::iter::once((crate::types::session_key::DEFAULT_AGENT, &self.main))
            .chain(self.named.iter().map(|(k, v)| (k.as_str(), v)))
    }
}

/// Progress of a running turn, for streaming channels.
#[derive(Clone, Debug, PartialEq)]
pub enum TurnEvent {
    /// Text generated so far grew by this fragment.
    Delta(String),
    /// The text streamed so far is withdrawn: the model's answer was cut off (or empty) and is
    /// asked for again, whose text follows.
    Restart,
    /// A tool call started or finished (what a channel that shows progress is sent).
    Tool(clawft_channel_core::ToolProgress),
}

/// How a turn ended.
#[derive(Clone, Debug, PartialEq)]
pub enum TurnStatus {
    /// The model gave a final answer.
    Completed,
    /// `max_tool_iterations` rounds of tools without a final answer.
    IterationLimit,
    /// Cancelled by `/stop`, `/new` or shutdown.
    Cancelled,
    /// The provider failed (after retries and failover), or a tool failed fatally.
    Failed(String),
    /// A spending limit was reached between two LLM calls: the text says which.
    OverBudget(String),
}

/// The result of a turn.
#[derive(Clone, Debug)]
pub struct TurnOutcome {
    /// How it ended.
    pub status: TurnStatus,
    /// The text for the user (the answer, or what went wrong).
    pub reply: String,
    /// Messages this turn appended to the transcript, in order (tool rounds included). The last
    /// one (the final assistant answer, when there is one) is NOT yet persisted: the caller
    /// persists it atomically with the journal and outbox.
    pub messages: Vec<Message>,
    /// How many of `messages` at the end still need persisting.
    pub unpersisted: usize,
    /// LLM calls made.
    pub llm_calls: u32,
    /// Tool calls made.
    pub tool_calls: u32,
    /// Tokens used.
    pub usage: Usage,
    /// Tokens and cost per model that answered, for the usage records and budgets.
    pub by_model: Vec<usage::CallTally>,
    /// The provider refused the prompt as over the model's context window: the session
    /// compacts its prompt window and tries once more.
    pub context_overflow: bool,
    /// Of the last LLM call: its prompt as estimated before sending (`llm::tokens`) and as the
    /// provider reported it (0 when it reported nothing). The session calibrates its estimate.
    pub last_prompt: (u64, u64),
    /// Workspace files the turn's tools made for the chat (`tts`, `image`), sent with the
    /// reply.
    pub files: Vec<String>,
}

impl TurnOutcome {
    /// A turn that failed before producing anything.
    pub fn failed(reply: &str) -> Self {
        Self {
            status: TurnStatus::Failed(reply.to_string()),
            reply: reply.to_string(),
            messages: Vec::new(),
            unpersisted: 0,
            llm_calls: 0,
            tool_calls: 0,
            usage: Usage::default(),
            by_model: Vec::new(),
            context_overflow: false,
            last_prompt: (0, 0),
            files: Vec::new(),
        }
    }
}

async fn call_model(
    deps: &TurnDeps,
    req: &ChatRequest,
    events: Option<&mpsc::Sender<TurnEvent>>,
    cancel: &CancellationToken,
) -> Result<ChatResponse, LlmError> {
    let Some(events) = events else {
        return tokio::select! {
            biased;
            () = cancel.cancelled() => Err(LlmError::Cancelled),
            r = deps.model.complete(req, None) => r,
        };
    };
    let (tx, mut rx) = mpsc::channel::<StreamEvent>(64);
    let fut = deps.model.complete(req, Some(&tx));
    tokio::pin!(fut);
    loop {
        tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(LlmError::Cancelled),
            Some(StreamEvent::TextDelta(d)) = rx.recv() => {
                let _ = events.send(TurnEvent::Delta(d)).await;
            }
            r = &mut fut => {
                while let Ok(StreamEvent::TextDelta(d)) = rx.try_recv() {
                    let _ = events.send(TurnEvent::Delta(d)).await;
                }
                return r;
            }
        }
    }
}

/// Synthetic result for a call that never produced one.
pub fn synthetic_result(call: &crate::llm::ToolCall, why: &str) -> Message {
    let v = serde_json::json!({ "error": why, "error_code": "CANCELLED" });
    Message::tool_result(&call.id, &call.name, v.to_string())
}

/// Run one turn over `history` (system prompt excluded, the new user message last).
pub async fn run_turn(
    deps: &TurnDeps,
    session: &SessionKey,
    history: &[Message],
    events: Option<&mpsc::Sender<TurnEvent>>,
    cancel: &CancellationToken,
) -> TurnOutcome {
    let turn_id = uuid::Uuid::now_v7();
    // Inside the session's span (or a subagent's, which names its task): not repeated here.
    let span = tracing::info_span!("turn", turn = %turn_id);
    let scope = crate::tools::TurnScope::answering_with(deps.turn_event.clone(), deps.voice);
    // A turn resumed after a restart: what its earlier `tts` and `image` calls made for the
    // chat still goes with the reply.
    for m in history
        .iter()
        .rev()
        .take_while(|m| m.role != Role::User)
        .filter(|m| m.role == Role::Tool)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
    {
        for p in crate::media::tools::sent_paths(m.name.as_deref().unwrap_or(""), &m.content) {
            scope.send_with_reply(p);
        }
    }
    let mut out = run_turn_inner(deps, session, history, events, cancel, &scope)
        .instrument(span)
        .await;
    // Media made after the last budget check still counts.
    deps.usage
        .tally_media(&mut out.by_model, &scope.take_spent());
    out.files = scope.take_files();
    out
}

async fn run_turn_inner(
    deps: &TurnDeps,
    session: &SessionKey,
    history: &[Message],
    events: Option<&mpsc::Sender<TurnEvent>>,
    cancel: &CancellationToken,
    scope: &Arc<crate::tools::TurnScope>,
) -> TurnOutcome {
    let max_iterations = deps.agent.max_tool_iterations.max(1);
    // A `message` tool call already said what this turn had to say: an empty final answer is
    // then the model ending the turn, not a failed answer.
    let mut messaged = false;
    let mut out = TurnOutcome::failed("");
    out.status = TurnStatus::Completed;
    let ctx = ToolContext {
        workspace: deps.workspace.clone(),
        session: session.clone(),
        cancel: cancel.clone(),
        user_dir: deps.user_dir.clone(),
        sender: deps.sender.clone(),
        call_id: None,
        turn: scope.clone(),
    };
    // Skills: listed in the system prompt; `/NAME` activates one for this turn.
    let skill_dirs = crate::skills::SkillDirs {
        global: deps.skills_global.clone(),
        workspace: deps.workspace.clone(),
    };
    let skills = skill_dirs.load();
    let mut exposed: Vec<String> = Vec::new();
    let mut activated = None;
    if let Some(user) = history.last().filter(|m| m.role == Role::User) {
        if let Some(skill) = crate::skills::from_command(&skill_dirs, &user.content) {
            tracing::info!(skill = %skill.name, "skill activated by command");
            activated = Some(format!(
                "\n\nThe user activated the skill `{}`. Follow its instructions:\n{}",
                skill.name, skill.instructions
            ));
            exposed.extend(skill.allowed_tools);
        }
    }
    let registry = deps.tools.current();
    // MCP servers still on their first connection attempt: wait for them (bounded by
    // `tools.mcp_connect_wait_secs`) so the first turn after a start is offered their tools;
    // `/stop` ends the wait.
    tokio::select! {
        () = registry.first_connect() => {}
        () = cancel.cancelled() => {}
    }
    // The core tools in full, the others listed in the system prompt (`offer`); a skill
    // activated by `/NAME` loads its tools from the start.
    let mut preload: Vec<String> = deps.preload.to_vec();
    preload.extend(registry.matching(&exposed));
    let first = registry.offer(
        &exposed,
        &offer::loaded_by(&registry, &preload, history),
        offer::omitted(&skills),
    );
    let mut system = offer::system_text(&deps.system_prompt, &skills, &first.deferred);
    system.push_str(&time_note(&deps.agent.timezone));
    system.extend(activated);
    let mut tools: Arc<[crate::llm::ToolSpec]> = first.specs.into();
    let mut guard = guard::TurnGuard::new(&deps.agent, history);
    let mut messages = Vec::with_capacity(history.len() + 1);
    messages.push(Message::system(&system));
    messages.extend_from_slice(history);
    stamp_times(&mut messages, &deps.agent.timezone);
    if deps.agent.shows_images(deps.request_model.as_deref()) {
        crate::media::load_images(&deps.workspace, &mut messages);
    }

    for iteration in 0..max_iterations {
        let req = ChatRequest {
            model: deps
                .request_model
                .as_deref()
                .map(str::to_string)
                .unwrap_or_default(),
            messages: std::mem::take(&mut messages),
            tools: tools.clone(),
            max_tokens: deps.agent.max_tokens,
            temperature: deps.agent.temperature,
        };
        out.llm_calls += 1;
        out.last_prompt = (crate::llm::tokens::of_request(&req), 0);
        let started = std::time::Instant::now();
        let resp = answer::complete(deps, &req, events, cancel, &mut out.llm_calls, messaged).await;
        crate::metrics::observe_llm(deps.model.name(), started.elapsed().as_secs_f64());
        let used = resp
            .as_ref()
            .ok()
            .map(|r| usage::UsageLedger::usage_of(&req, r));
        messages = req.messages;
        let resp = match resp {
            Ok(r) => r,
            Err(LlmError::Cancelled) => {
                out.status = TurnStatus::Cancelled;
                out.reply = "Stopped: the turn was cancelled.".into();
                return out;
            }
            Err(e) => {
                // The providers scrub their errors; the registry's scrubber (whose secrets follow
                // config reloads) goes over the text once more before users, the store and the
                // logs see it.
                let shown = registry.scrubber().scrub_str(&e.to_string()).into_owned();
                let hint = answer::hint_for(&e, deps);
                let text = answer::failure_reason(&e, &shown, hint.as_deref());
                out.context_overflow = e.is_context_length();
                out.status = TurnStatus::Failed(text.clone());
                out.reply = text;
                return out;
            }
        };
        round::record_usage(deps, &mut out, &resp.model, used.unwrap_or_default());

        if resp.tool_calls.is_empty() {
            tracing::debug!(iteration, "tool loop complete");
            let msg = Message::assistant(&resp.content);
            out.reply = resp.content;
            out.messages.push(msg);
            out.unpersisted = 1;
            return out;
        }

        // Stored calls must replay: ids made unique, arguments made a JSON object (the call
        // is then not run), repeats noticed.
        let mut tool_calls = resp.tool_calls;
        let admits = guard.admit(&mut tool_calls);
        // Persist the calls before running them: after a crash they are repaired, not lost.
        // Credentials in them (a password typed into a page) are stored masked, and scrubbed
        // from everything after; this turn's model still sees its own call.
        let assistant = Message {
            role: Role::Assistant,
            content: resp.content,
            tool_calls,
            tool_call_id: None,
            name: None,
            images: Vec::new(),
            at_ms: None,
        };
        let mut stored = assistant.clone();
        for c in &mut stored.tool_calls {
            if let Some(masked) = registry.stored_arguments(&c.name, &c.arguments, &ctx) {
                c.arguments = masked;
            }
        }
        if let Err(e) = deps
            .store
            .append_messages(session, std::slice::from_ref(&stored))
        {
            out.status = TurnStatus::Failed(format!("store failed: {e}"));
            out.reply = "Internal error: could not save the conversation.".into();
            return out;
        }
        tracing::debug!(
            iteration,
            count = assistant.tool_calls.len(),
            "executing tool calls"
        );
        let calls = assistant.tool_calls.clone();
        messages.push(assistant);
        out.messages.push(stored);

        let outcomes = round::run_calls(&registry, &ctx, &exposed, events, &calls, &admits).await;
        out.tool_calls += u32::try_from(calls.len()).unwrap_or(u32::MAX);
        let mut results = Vec::with_capacity(calls.len());
        let mut fatal = None;
        for (call, o) in calls.iter().zip(outcomes) {
            if let Some(ToolError::Fatal(m)) = &o.error {
                fatal = Some(m.clone());
            }
            messaged |= call.name == "message" && o.error.is_none();
            results.push(Message::tool_result(&call.id, &call.name, o.content()));
        }
        if let Err(e) = deps.store.append_messages(session, &results) {
            out.status = TurnStatus::Failed(format!("store failed: {e}"));
            out.reply = "Internal error: could not save the conversation.".into();
            return out;
        }
        messages.extend_from_slice(&results);
        // Images a call produced (a browser screenshot) are shown to a model that can see,
        // for the rest of this turn (not stored: the results keep their paths).
        if deps.agent.shows_images(deps.request_model.as_deref()) {
            if let Some(m) = crate::media::tool_result_images(&deps.workspace, &results) {
                messages.push(m);
            }
        }
        out.messages.extend(results);
        // Tools a call exposed (`use_skill`: its skill's tools) are offered from the next
        // round on.
        for g in ctx.turn.exposed() {
            if !exposed.contains(&g) {
                exposed.push(g);
            }
        }
        // Tools this round loaded (`tool_search`, `use_skill`, a call by name) are appended.
        let may_load = calls.iter().any(|c| {
            c.name == crate::tools::discovery::TOOL_SEARCH
                || c.name == "use_skill"
                || !tools.iter().any(|t| t.name == c.name)
        });
        if may_load {
            let now = offer::tools_for(&registry, &skills, &exposed, &preload, &messages);
            if *now != *tools {
                tools = now.into();
            }
        }
        if let Some(m) = fatal {
            let m = registry.scrubber().scrub_str(&m).into_owned();
            out.status = TurnStatus::Failed(m.clone());
            out.reply = format!("A tool failed fatally: {m}");
            return out;
        }
        if let Some(why) = guard.stop_reason() {
            out.status = TurnStatus::Failed(why.to_string());
            out.reply = why.to_string();
            return out;
        }
        if cancel.is_cancelled() {
            out.status = TurnStatus::Cancelled;
            out.reply = "Stopped: the turn was cancelled.".into();
            return out;
        }
        deps.usage
            .tally_media(&mut out.by_model, &ctx.turn.take_spent());
        if let Err(r) = deps.usage.check_running(session.as_str(), &out.by_model) {
            out.status = TurnStatus::OverBudget(r.text.clone());
            out.reply = r.text;
            return out;
        }
    }
    tracing::warn!(max_iterations, "max tool iterations reached");
    out.status = TurnStatus::IterationLimit;
    out.reply = format!(
        "I stopped after {max_iterations} rounds of tool calls without reaching a final answer (agents.defaults.max_tool_iterations). Ask me to continue, or narrow the task."
    );
    out
}

/// What the system prompt says of the times before user messages (the same text every turn:
/// the provider's prompt cache keeps working).
fn time_note(tz: &crate::config::types::TimeZone) -> String {
    format!(
        "\n\nUser messages begin with when they were sent ({}); the last one is now.",
        tz.name
    )
}

/// Put the time each user message was sent before its text, in this request's copy (the
/// transcript keeps the text as sent). Each message always gets the same stamp, so the
/// request's prefix stays byte-stable from one turn to the next.
fn stamp_times(messages: &mut [Message], tz: &crate::config::types::TimeZone) {
    for m in messages.iter_mut().filter(|m| m.role == Role::User) {
        if let Some(at) = m.at_ms.take() {
            m.content = format!("{} {}", tz.stamp(at), m.content);
        }
    }
}
