//! The tool loop of one turn as named steps: [`Turn::prepare`] (skills, the tools offered, the
//! request's messages), then rounds of [`Turn::call`] (ask the model), [`Turn::record_calls`]
//! (admit the calls and persist them), [`Turn::run_tools`] (run them, persist their results,
//! take their effects) and [`Turn::decide`] (whether the turn goes on), until the model answers
//! or a step stops the turn ([`Stop`]).
//!
//! No tool is recognised by its name here: tools report what the turn must know through the
//! turn scope ([`crate::tools::TurnEffect`]). It never touches the journal or the outbox.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{answer, guard, offer, round, TurnDeps, TurnEvent, TurnOutcome, TurnStatus};
use crate::llm::{ChatRequest, ChatResponse, LlmError, Message, Role, ToolCall, ToolSpec};
use crate::tools::registry::ToolRegistry;
use crate::tools::{ToolContext, ToolError, TurnEffect};
use crate::types::SessionKey;

/// Why a turn ends: how, and the text the user is given.
pub(super) struct Stop {
    /// How it ended.
    status: TurnStatus,
    /// The text for the user.
    reply: String,
}

impl Stop {
    /// Ended as `status` with `reply` for the user.
    fn new(status: TurnStatus, reply: String) -> Self {
        Self { status, reply }
    }

    /// A failure whose reason is also what the user reads.
    fn failed(text: String) -> Self {
        Self::new(TurnStatus::Failed(text.clone()), text)
    }

    /// `/stop`, `/new` or shutdown.
    fn cancelled() -> Self {
        Self::new(
            TurnStatus::Cancelled,
            "Stopped: the turn was cancelled.".into(),
        )
    }

    /// The transcript could not be written.
    fn store(e: &impl std::fmt::Display) -> Self {
        Self::new(
            TurnStatus::Failed(format!("store failed: {e}")),
            "Internal error: could not save the conversation.".into(),
        )
    }

    /// `max_tool_iterations` rounds without a final answer.
    fn iteration_limit(max_iterations: u32) -> Self {
        Self::new(
            TurnStatus::IterationLimit,
            format!(
                "I stopped after {max_iterations} rounds of tool calls without reaching a final answer (agents.defaults.max_tool_iterations). Ask me to continue, or narrow the task."
            ),
        )
    }
}

/// One turn's state between its steps.
pub(super) struct Turn<'a> {
    deps: &'a TurnDeps,
    session: &'a SessionKey,
    events: Option<&'a mpsc::Sender<TurnEvent>>,
    cancel: &'a CancellationToken,
    /// What every call of the turn is given.
    ctx: ToolContext,
    /// The registry as of the turn's start (a reload does not change a running turn).
    registry: Arc<ToolRegistry>,
    skills: Vec<crate::skills::Skill>,
    /// Tool names (or globs) offered on top of the policy's (a skill's tools).
    exposed: Vec<String>,
    /// Tools loaded from the start ([`TurnDeps::preload`], a skill's).
    preload: Vec<String>,
    /// The tool schemas of the next request.
    tools: Arc<[ToolSpec]>,
    guard: guard::TurnGuard,
    /// The next request's messages (system prompt first).
    messages: Vec<Message>,
    /// A message reached the chat through a tool: an empty answer then ends the turn.
    messaged: bool,
    /// What the turn has produced so far.
    out: TurnOutcome,
}

impl<'a> Turn<'a> {
    /// Set up the turn over `history`: its skills (a `/NAME` command activates one), the tools
    /// the first request offers (waiting for MCP servers on their first connection), the
    /// system prompt, and the messages of the first request.
    pub(super) async fn prepare(
        deps: &'a TurnDeps,
        session: &'a SessionKey,
        history: &[Message],
        events: Option<&'a mpsc::Sender<TurnEvent>>,
        cancel: &'a CancellationToken,
        scope: &Arc<crate::tools::TurnScope>,
    ) -> Turn<'a> {
        let mut out = TurnOutcome::failed("");
        out.status = TurnStatus::Completed;
        let ctx = ToolContext {
            workspace: deps.shared.workspace.clone(),
            session: session.clone(),
            cancel: cancel.clone(),
            user_dir: deps.turn.user_dir.clone(),
            sender: deps.turn.sender.clone(),
            call_id: None,
            turn: scope.clone(),
        };
        // Skills: listed in the system prompt; `/NAME` activates one for this turn.
        let skill_dirs = crate::skills::SkillDirs {
            global: deps.shared.skills_global.clone(),
            workspace: deps.shared.workspace.clone(),
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
        let registry = deps.shared.tools.current();
        // MCP servers still on their first connection attempt: wait for them (bounded by
        // `tools.mcp_connect_wait_secs`) so the first turn after a start is offered their
        // tools; `/stop` ends the wait.
        tokio::select! {
            () = registry.first_connect() => {}
            () = cancel.cancelled() => {}
        }
        // The core tools in full, the others listed in the system prompt (`offer`); a skill
        // activated by `/NAME` loads its tools from the start.
        let mut preload: Vec<String> = deps.turn.preload.to_vec();
        preload.extend(registry.matching(&exposed));
        let first = registry.offer(
            &exposed,
            &offer::loaded_by(&registry, &preload, history),
            offer::omitted(&skills),
        );
        let mut system = offer::system_text(&deps.turn.system_prompt, &skills, &first.deferred);
        system.push_str(&super::time_note(&deps.shared.agent.timezone));
        system.extend(activated);
        let mut messages = Vec::with_capacity(history.len() + 1);
        messages.push(Message::system(&system));
        messages.extend_from_slice(history);
        super::stamp_times(&mut messages, &deps.shared.agent.timezone);
        if deps
            .shared
            .agent
            .shows_images(deps.turn.request_model.as_deref())
        {
            crate::media::load_images(&deps.shared.workspace, &mut messages);
        }
        Turn {
            deps,
            session,
            events,
            cancel,
            ctx,
            registry,
            skills,
            exposed,
            preload,
            tools: first.specs.into(),
            guard: guard::TurnGuard::new(&deps.shared.agent, history),
            messages,
            messaged: false,
            out,
        }
    }

    /// Run rounds until the model answers or a step stops the turn, and return what the turn
    /// produced.
    pub(super) async fn run(mut self) -> TurnOutcome {
        let max_iterations = self.deps.shared.agent.max_tool_iterations.max(1);
        let stop = match self.rounds(max_iterations).await {
            Ok(()) => {
                tracing::warn!(max_iterations, "max tool iterations reached");
                Stop::iteration_limit(max_iterations)
            }
            Err(stop) => stop,
        };
        self.out.status = stop.status;
        self.out.reply = stop.reply;
        self.out
    }

    /// Up to `max_iterations` rounds; `Ok` when none ended the turn.
    async fn rounds(&mut self, max_iterations: u32) -> Result<(), Stop> {
        for iteration in 0..max_iterations {
            let resp = self.call().await?;
            if resp.tool_calls.is_empty() {
                tracing::debug!(iteration, "tool loop complete");
                return Err(self.answer(resp));
            }
            let (calls, admits) = self.record_calls(resp)?;
            tracing::debug!(iteration, count = calls.len(), "executing tool calls");
            let fatal = self.run_tools(&calls, &admits).await?;
            self.decide(fatal)?;
        }
        Ok(())
    }

    /// Ask the model (an empty or cut answer once more) and count what the call cost.
    async fn call(&mut self) -> Result<ChatResponse, Stop> {
        let deps = self.deps;
        let req = ChatRequest {
            model: deps
                .turn
                .request_model
                .as_deref()
                .map(str::to_string)
                .unwrap_or_default(),
            messages: std::mem::take(&mut self.messages),
            tools: self.tools.clone(),
            max_tokens: deps.shared.agent.max_tokens,
            temperature: deps.shared.agent.temperature,
        };
        self.out.llm_calls += 1;
        self.out.last_prompt = (crate::llm::tokens::of_request(&req), 0);
        let started = std::time::Instant::now();
        let resp = answer::complete(
            deps,
            &req,
            self.events,
            self.cancel,
            &mut self.out.llm_calls,
            self.messaged,
        )
        .await;
        crate::metrics::observe_llm(deps.shared.model.name(), started.elapsed().as_secs_f64());
        let used = resp
            .as_ref()
            .ok()
            .map(|r| super::usage::UsageLedger::usage_of(&req, r));
        self.messages = req.messages;
        match resp {
            Ok(r) => {
                round::record_usage(deps, &mut self.out, &r.model, used.unwrap_or_default());
                Ok(r)
            }
            Err(LlmError::Cancelled) => Err(Stop::cancelled()),
            Err(e) => {
                // The providers scrub their errors; the registry's scrubber (whose secrets
                // follow config reloads) goes over the text once more before users, the store
                // and the logs see it.
                let shown = self
                    .registry
                    .scrubber()
                    .scrub_str(&e.to_string())
                    .into_owned();
                let hint = answer::hint_for(&e, deps);
                self.out.context_overflow = e.is_context_length();
                self.out.overflow_window = e.known_window();
                self.out.provider_failure = super::ProviderFailure::of(&e);
                Err(Stop::failed(answer::failure_reason(
                    &e,
                    &shown,
                    hint.as_deref(),
                )))
            }
        }
    }

    /// The model answered without calls: its text is the reply, and the final message is
    /// left for the caller to persist with the journal and the outbox.
    fn answer(&mut self, resp: ChatResponse) -> Stop {
        self.out.messages.push(Message::assistant(&resp.content));
        self.out.unpersisted = 1;
        Stop::new(TurnStatus::Completed, resp.content)
    }

    /// Admit the response's calls (ids made unique, arguments made a JSON object, repeats
    /// noticed) and persist them before they run: after a crash they are repaired, not lost.
    /// Credentials in them (a password typed into a page) are stored masked; this turn's
    /// model still sees its own call.
    fn record_calls(
        &mut self,
        resp: ChatResponse,
    ) -> Result<(Vec<ToolCall>, Vec<guard::Admit>), Stop> {
        let mut tool_calls = resp.tool_calls;
        let admits = self.guard.admit(&mut tool_calls);
        let assistant = Message {
            role: Role::Assistant,
            content: resp.content,
            tool_calls,
            tool_call_id: None,
            name: None,
            images: Vec::new(),
            at_ms: None,
            from: None,
        };
        let mut stored = assistant.clone();
        for c in &mut stored.tool_calls {
            if let Some(masked) = self
                .registry
                .stored_arguments(&c.name, &c.arguments, &self.ctx)
            {
                c.arguments = masked;
            }
        }
        self.deps
            .shared
            .store
            .append_messages(self.session, std::slice::from_ref(&stored))
            .map_err(|e| Stop::store(&e))?;
        let calls = assistant.tool_calls.clone();
        self.messages.push(assistant);
        self.out.messages.push(stored);
        Ok((calls, admits))
    }

    /// Run the calls (concurrently, results in call order), persist their results, show the
    /// images they made to a model that sees, and take their effects. Returns the message of
    /// a fatal tool failure, if one happened.
    async fn run_tools(
        &mut self,
        calls: &[ToolCall],
        admits: &[guard::Admit],
    ) -> Result<Option<String>, Stop> {
        let outcomes = round::run_calls(
            &self.registry,
            &self.ctx,
            &self.exposed,
            self.events,
            calls,
            admits,
        )
        .await;
        self.out.tool_calls += u32::try_from(calls.len()).unwrap_or(u32::MAX);
        let mut fatal = None;
        let results: Vec<Message> = calls
            .iter()
            .zip(outcomes)
            .map(|(call, o)| {
                if let Some(ToolError::Fatal(m)) = &o.error {
                    fatal = Some(m.clone());
                }
                Message::tool_result(&call.id, &call.name, o.content())
            })
            .collect();
        self.deps
            .shared
            .store
            .append_messages(self.session, &results)
            .map_err(|e| Stop::store(&e))?;
        self.messages.extend_from_slice(&results);
        // Images a call produced (a browser screenshot) are shown to a model that can see,
        // for the rest of this turn (not stored: the results keep their paths).
        if self
            .deps
            .shared
            .agent
            .shows_images(self.deps.turn.request_model.as_deref())
        {
            if let Some(m) = crate::media::tool_result_images(&self.deps.shared.workspace, &results)
            {
                self.messages.push(m);
            }
        }
        self.out.messages.extend(results);
        self.take_effects(calls);
        Ok(fatal)
    }

    /// Act on what the round's calls reported: a message sent, tools loaded or exposed (their
    /// schemas are appended from the next request on). A call to a tool the request did not
    /// offer (the model named one from the list) loads it too.
    fn take_effects(&mut self, calls: &[ToolCall]) {
        let mut reload = calls
            .iter()
            .any(|c| !self.tools.iter().any(|t| t.name == c.name));
        for effect in self.ctx.turn.take_effects() {
            match effect {
                TurnEffect::MessageSent => self.messaged = true,
                TurnEffect::ToolsLoaded => reload = true,
            }
        }
        for g in self.ctx.turn.exposed() {
            if !self.exposed.contains(&g) {
                self.exposed.push(g);
            }
        }
        if reload {
            let now = offer::tools_for(
                &self.registry,
                &self.skills,
                &self.exposed,
                &self.preload,
                &self.messages,
            );
            if *now != *self.tools {
                self.tools = now.into();
            }
        }
    }

    /// Whether the turn goes on after a round: not after a fatal tool failure, a stop of the
    /// loop guard, a cancel, or a spending limit reached.
    fn decide(&mut self, fatal: Option<String>) -> Result<(), Stop> {
        if let Some(m) = fatal {
            let m = self.registry.scrubber().scrub_str(&m).into_owned();
            return Err(Stop::new(
                TurnStatus::Failed(m.clone()),
                format!("A tool failed fatally: {m}"),
            ));
        }
        if let Some(why) = self.guard.stop_reason() {
            return Err(Stop::failed(why.to_string()));
        }
        if self.cancel.is_cancelled() {
            return Err(Stop::cancelled());
        }
        let deps = self.deps;
        deps.shared
            .usage
            .tally_media(&mut self.out.by_model, &self.ctx.turn.take_spent());
        if let Err(r) = deps
            .shared
            .usage
            .check_running(self.session.as_str(), &self.out.by_model)
        {
            return Err(Stop::new(TurnStatus::OverBudget(r.text.clone()), r.text));
        }
        Ok(())
    }
}
