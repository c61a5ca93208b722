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
mod steps;
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
use crate::tools::Workspace;
use crate::types::SessionKey;

/// What an agent's turns need for as long as the daemon runs (rebuilt by a reload): shared by
/// every session of the agent and every turn of those sessions.
#[derive(Clone)]
pub struct AgentDeps {
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
}

/// What one turn is given on top of its agent's dependencies: the prompt as of its start, who
/// it answers, and how (the session's choices folded in when the turn starts).
#[derive(Clone)]
pub struct TurnInputs {
    /// The system prompt as of the turn's start.
    pub system_prompt: Arc<str>,
    /// This turn's chat user's memory directory (see [`AgentDeps::for_turn`]).
    pub user_dir: Option<Arc<str>>,
    /// This turn's chat user (sender id), given to the tools
    /// ([`crate::tools::ToolContext::sender`]).
    pub sender: Option<Arc<str>>,
    /// The model asked of the provider for this turn (the chat's `/model`,
    /// `heartbeat.model`); `None`: the provider's configured model.
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

/// A turn's dependencies: its agent's (shared) and its own.
#[derive(Clone)]
pub struct TurnDeps {
    /// The agent's, for the daemon's life.
    pub shared: Arc<AgentDeps>,
    /// The turn's own.
    pub turn: TurnInputs,
}

impl AgentDeps {
    /// The dependencies of a turn answering a message from `user` (`(channel, sender id)`),
    /// with the system prompt as of now (context files re-read if one changed; otherwise the
    /// same `Arc`). Under `memory.scope = "user"` the turn gets that user's memory directory
    /// (`users/<channel>-<sender>`) and their `USER.md`; `None` (the terminal, the control
    /// token, the gateway's own messages, a subagent) keeps the agent's memory.
    pub fn for_turn(self: &Arc<Self>, user: Option<(&str, &str)>) -> TurnDeps {
        let user_dir: Option<Arc<str>> = match (self.memory_scope, user) {
            (crate::memory::settings::Scope::User, Some((channel, sender))) => {
                Some(crate::memory::scope::user_dir(channel, sender).into())
            }
            _ => None,
        };
        TurnDeps {
            shared: self.clone(),
            turn: TurnInputs {
                system_prompt: self.context.current_for(user_dir.as_deref()),
                user_dir,
                sender: user.map(|(_, sender)| sender.into()),
                request_model: None,
                turn_event: None,
                preload: Arc::new([]),
                voice: self.agent.reply_with_voice,
            },
        }
    }
}

/// Every agent's dependencies; a session's are chosen by the agent of its key
/// ([`SessionKey::agent`]).
#[derive(Clone)]
pub struct Agents {
    main: Arc<AgentDeps>,
    named: Arc<std::collections::BTreeMap<String, Arc<AgentDeps>>>,
}

impl Agents {
    /// One agent, the default one.
    pub fn single(main: Arc<AgentDeps>) -> Self {
        Self::new(main, std::collections::BTreeMap::new())
    }

    /// The default agent and the others by name.
    pub fn new(
        main: Arc<AgentDeps>,
        named: std::collections::BTreeMap<String, Arc<AgentDeps>>,
    ) -> Self {
        Self {
            main,
            named: Arc::new(named),
        }
    }

    /// The default agent's.
    pub fn main(&self) -> &Arc<AgentDeps> {
        &self.main
    }

    /// Agent `name`'s (`main` included).
    pub fn get(&self, name: &str) -> Option<&Arc<AgentDeps>> {
        if name == crate::types::session_key::DEFAULT_AGENT {
            return Some(&self.main);
        }
        self.named.get(name)
    }

    /// The dependencies of the session `key`. A key of an agent no longer configured (its
    /// messages journaled before a reconfiguration) is served by the default agent, so nothing
    /// journaled is left unanswered.
    pub fn for_key(&self, key: &SessionKey) -> &Arc<AgentDeps> {
        let agent = key.agent();
        self.get(agent).unwrap_or_else(|| {
            tracing::warn!(session = %key, agent, "no agent of this name is configured: the default agent answers");
            &self.main
        })
    }

    /// Every agent: `(name, deps)`, the default one first.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arc<AgentDeps>)> {
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

/// Why the model gave no answer, as a chat user is told it: a plain sentence without status
/// codes or the provider's text (those go to the log, `status` and the operator).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderFailure {
    /// Only the operator can fix it (a refused key, no credit, a refused request).
    NeedsOperator,
    /// The provider is not answering (rate limited, overloaded, unreachable, slow).
    NotAnswering,
    /// The conversation is too long for the model, even compacted.
    TooLong,
    /// The answer came back cut or empty twice.
    Incomplete,
}

impl ProviderFailure {
    /// The class of `e` (`None`: a cancel, which is not a failure).
    pub fn of(e: &crate::llm::LlmError) -> Option<Self> {
        use crate::llm::LlmError;
        Some(match e {
            LlmError::Auth { .. }
            | LlmError::Quota { .. }
            | LlmError::BadRequest { .. }
            | LlmError::InvalidResponse { .. } => Self::NeedsOperator,
            LlmError::RateLimited { .. }
            | LlmError::Server { .. }
            | LlmError::Connect { .. }
            | LlmError::Timeout { .. } => Self::NotAnswering,
            LlmError::ContextLength { .. } => Self::TooLong,
            LlmError::Cut { .. } | LlmError::Empty { .. } => Self::Incomplete,
            LlmError::Cancelled => return None,
        })
    }

    /// What a chat user reads.
    pub fn plain_text(self) -> &'static str {
        match self {
            Self::NeedsOperator => {
                "Sorry, I can't answer right now: the AI service I use is failing on my side. The operator can see why in the gateway's status; please try again later."
            }
            Self::NotAnswering => {
                "Sorry, I can't answer right now: the AI service I use is not responding. Please try again in a few minutes."
            }
            Self::TooLong => {
                "This conversation has grown too long for me. Send /new to start a fresh one."
            }
            Self::Incomplete => {
                "Sorry, I could not put together a complete answer. Please try again or say it differently."
            }
        }
    }
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
    /// With `context_overflow`: the window the server showed it really has, when it said
    /// (a local server that cut the prompt silently, Ollama's `num_ctx`).
    pub overflow_window: Option<u64>,
    /// Of the last LLM call: its prompt as estimated before sending (`llm::tokens`) and as the
    /// provider reported it (0 when it reported nothing). The session calibrates its estimate.
    pub last_prompt: (u64, u64),
    /// Workspace files the turn's tools made for the chat (`tts`, `image`), sent with the
    /// reply.
    pub files: Vec<String>,
    /// The turn failed because the model gave no answer: what a chat user is told instead of
    /// `reply` (which carries the detail for the operator's surfaces and the log).
    pub provider_failure: Option<ProviderFailure>,
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
            overflow_window: None,
            last_prompt: (0, 0),
            files: Vec::new(),
            provider_failure: None,
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
            r = deps.shared.model.complete(req, None) => r,
        };
    };
    let (tx, mut rx) = mpsc::channel::<StreamEvent>(64);
    let fut = deps.shared.model.complete(req, Some(&tx));
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
    let scope =
        crate::tools::TurnScope::answering_with(deps.turn.turn_event.clone(), deps.turn.voice);
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
    let mut out = async {
        steps::Turn::prepare(deps, session, history, events, cancel, &scope)
            .await
            .run()
            .await
    }
    .instrument(span)
    .await;
    // Media made after the last budget check still counts.
    deps.shared
        .usage
        .tally_media(&mut out.by_model, &scope.take_spent());
    out.files = scope.take_files();
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
