//! The session tools (seed 004 §2, group `sessions`): `sessions_list` (the sessions this turn
//! may see, with their last activity), `sessions_history` (a session's transcript, paginated;
//! the registry scrubs it like every tool result), `sessions_send` (a message handed to another
//! session as an inbound turn, through the journal, exactly once per call) and
//! `session_status` (the current session: agent, model, tokens, budgets left, queue) and
//! `history_search` (words looked up in the current chat's own stored history, the part
//! compaction summarised included; never another chat's).
//!
//! Which sessions a turn may see is `tools.sessions` ([`crate::tools::sessions`]). The tools
//! reach the store, the usage ledger and the bus through a [`SessionDirectory`] the daemon
//! builds; it gets the bus once the bus runs ([`SessionDirectory::attach`]) and outlives
//! registry rebuilds (a reload builds new tools over the same directory).

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use chrono::SecondsFormat;
use clawft_channel_core::{ChannelId, ChatId, InboundEvent, PlatformEventId, ThreadId, UserId};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::llm::Role;
use crate::store::{InboxEntry, InboxState, JournalOutcome, Store};
use crate::tools::message::MAX_MESSAGE_BYTES;
use crate::tools::sessions::{may_see, send_event_id, SessionsSettings, Viewer, Visibility};
use crate::tools::{parse_args, schema_of, Effect, Tool, ToolContext, ToolError};
use crate::turn::usage::UsageLedger;
use crate::types::session_key::{subagent_task_id, SYSTEM_SENDER};
use crate::types::{sanitize_content, SessionKey};

/// Hands a journaled entry to its session (the bus's inbox); false when the bus is gone.
pub type Router = Arc<dyn Fn(InboxEntry) -> bool + Send + Sync>;

/// Most sessions `sessions_list` returns (default 20).
const MAX_LIST: usize = 100;
/// Most messages `sessions_history` returns in one page (default 20).
const MAX_HISTORY: usize = 50;
/// Characters of one message's text `sessions_history` returns; longer texts are cut.
const MAX_HISTORY_TEXT_CHARS: usize = 4000;
/// Characters of a tool result shown with `include_tools`.
const MAX_TOOL_TEXT_CHARS: usize = 500;

/// What the session tools read and where `sessions_send` hands messages: the store, the usage
/// ledger and the bus, set by the daemon.
pub struct SessionDirectory {
    store: Store,
    usage: OnceLock<Arc<UsageLedger>>,
    route: OnceLock<Router>,
}

impl SessionDirectory {
    /// A directory over `store`; `sessions_send` works once [`Self::attach`] gives it the bus.
    pub fn new(store: Store) -> Arc<Self> {
        Arc::new(Self {
            store,
            usage: OnceLock::new(),
            route: OnceLock::new(),
        })
    }

    /// Connect it to the bus.
    pub fn attach(&self, route: Router) {
        let _ = self.route.set(route);
    }

    /// The usage ledger (`session_status`'s tokens and budgets).
    pub fn set_usage(&self, usage: Arc<UsageLedger>) {
        let _ = self.usage.set(usage);
    }
}

/// The four tools over `dir`, with the visibility `settings` and the agent's default `model`.
pub fn session_tools(
    dir: Arc<SessionDirectory>,
    settings: SessionsSettings,
    model: String,
) -> Vec<Arc<dyn Tool>> {
    let shared = Arc::new(Shared {
        dir,
        settings,
        model,
    });
    vec![
        Arc::new(SessionsList(shared.clone())),
        Arc::new(SessionsHistory(shared.clone())),
        Arc::new(SessionsSend(shared.clone())),
        Arc::new(SessionStatus(shared.clone())),
        Arc::new(HistorySearch(shared)),
    ]
}

struct Shared {
    dir: Arc<SessionDirectory>,
    settings: SessionsSettings,
    model: String,
}

fn store_err(e: impl std::fmt::Display) -> ToolError {
    ToolError::ExecutionFailed(format!("could not read the sessions: {e}"))
}

fn time_of(ms: u64) -> Value {
    i64::try_from(ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map_or(Value::Null, |d| {
            Value::String(d.to_rfc3339_opts(SecondsFormat::Secs, true))
        })
}

fn cut(text: &str, max: usize) -> (String, bool) {
    match text.char_indices().nth(max) {
        Some((i, _)) => (format!("{}…", &text[..i]), true),
        None => (text.to_string(), false),
    }
}

impl Shared {
    fn viewer<'a>(ctx: &'a ToolContext) -> Viewer<'a> {
        Viewer {
            session: &ctx.session,
            sender: ctx.sender.as_deref(),
        }
    }

    fn participants_of(&self, key: &SessionKey) -> Result<Vec<String>, ToolError> {
        if self.settings.visibility != Visibility::User {
            return Ok(Vec::new());
        }
        Ok(self
            .dir
            .store
            .session_participants()
            .map_err(store_err)?
            .remove(key)
            .unwrap_or_default()
            .into_iter()
            .map(|(who, _)| who)
            .collect())
    }

    /// The session named by `raw`, if this turn may see it and it exists.
    fn target(&self, ctx: &ToolContext, raw: &str) -> Result<SessionKey, ToolError> {
        let key = SessionKey::parse(raw.trim()).map_err(|e| {
            ToolError::InvalidArgs(format!("{e}; use a session_key as sessions_list shows it"))
        })?;
        let participants = self.participants_of(&key)?;
        may_see(&self.settings, Self::viewer(ctx), &key, &participants)
            .map_err(ToolError::PermissionDenied)?;
        if self
            .dir
            .store
            .session_meta(&key)
            .map_err(store_err)?
            .is_none()
        {
            return Err(ToolError::InvalidArgs(format!(
                "no session `{key}`; sessions_list shows the sessions this conversation may see"
            )));
        }
        Ok(key)
    }
}

/// Arguments of `sessions_list`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    /// Max sessions (default 20, max 100).
    limit: Option<usize>,
    /// Only those active in the last N minutes.
    active_minutes: Option<u64>,
    /// Only this channel.
    channel: Option<String>,
    /// Only this agent.
    agent: Option<String>,
}

struct SessionsList(Arc<Shared>);

#[async_trait]
impl Tool for SessionsList {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::SessionsList.name()
    }
    fn description(&self) -> &str {
        "List the conversations this one may see (by default the current user's own), latest activity first. Returns: {sessions: [{session_key, channel, chat_id, current, messages, last_activity}], more}"
    }
    fn parameters(&self) -> Value {
        schema_of::<ListArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::ReadOnly
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: ListArgs = parse_args(self.name(), args)?;
        let limit = a.limit.unwrap_or(20).clamp(1, MAX_LIST);
        let s = &self.0;
        let participants = if s.settings.visibility == Visibility::User {
            s.dir.store.session_participants().map_err(store_err)?
        } else {
            std::collections::HashMap::new()
        };
        let now = clawft_channel_core::now_ms();
        let since = a
            .active_minutes
            .map(|m| now.saturating_sub(m.saturating_mul(60_000)));
        let viewer = Shared::viewer(ctx);
        let mut metas: Vec<_> = s
            .dir
            .store
            .sessions()
            .map_err(store_err)?
            .into_iter()
            .filter(|m| subagent_task_id(&m.key).is_none())
            .filter(|m| a.channel.as_deref().is_none_or(|c| m.key.channel() == c))
            .filter(|m| a.agent.as_deref().is_none_or(|g| m.key.agent() == g))
            .filter(|m| since.is_none_or(|t| m.updated_ms >= t))
            .filter(|m| {
                let p = participants.get(&m.key).map_or(Vec::new(), |v| {
                    v.iter().map(|(w, _)| w.clone()).collect::<Vec<_>>()
                });
                may_see(&s.settings, viewer, &m.key, &p).is_ok()
            })
            .collect();
        metas.sort_by_key(|m| std::cmp::Reverse(m.updated_ms));
        let more = metas.len() > limit;
        let sessions: Vec<Value> = metas
            .iter()
            .take(limit)
            .map(|m| {
                let (channel, chat, thread) = m.key.route();
                json!({
                    "session_key": m.key.as_str(),
                    "agent": m.key.agent(),
                    "channel": channel,
                    "chat_id": chat,
                    "thread": thread,
                    "current": m.key == ctx.session,
                    "messages": m.next_seq,
                    "last_activity": time_of(m.updated_ms),
                    "idle_minutes": now.saturating_sub(m.updated_ms) / 60_000,
                })
            })
            .collect();
        Ok(json!({
            "sessions": sessions,
            "count": sessions.len(),
            "more": more,
            "visibility": s.settings.visibility.as_str(),
        }))
    }
}

/// Arguments of `sessions_history`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct HistoryArgs {
    /// From sessions_list.
    session_key: String,
    /// Max messages (default 20, max 50).
    limit: Option<usize>,
    /// The page before this index (next_before).
    before: Option<u64>,
    /// Include tool results.
    include_tools: Option<bool>,
}

struct SessionsHistory(Arc<Shared>);

#[async_trait]
impl Tool for SessionsHistory {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::SessionsHistory.name()
    }
    fn description(&self) -> &str {
        "Read a visible conversation's transcript (sessions_list), latest page first. Returns: {messages: [{index, role, text, tools}], next_before, total}"
    }
    fn parameters(&self) -> Value {
        schema_of::<HistoryArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::ReadOnly
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: HistoryArgs = parse_args(self.name(), args)?;
        let s = &self.0;
        let key = s.target(ctx, &a.session_key)?;
        let limit = a.limit.unwrap_or(20).clamp(1, MAX_HISTORY);
        let with_tools = a.include_tools.unwrap_or(false);
        let transcript = s.dir.store.load_transcript(&key).map_err(store_err)?;
        let total = transcript.len() as u64;
        let before = a.before.unwrap_or(total).min(total);
        let mut shown: Vec<Value> = Vec::new();
        let mut next_before = None;
        for (i, m) in transcript.iter().enumerate().rev() {
            let index = i as u64;
            if index >= before {
                continue;
            }
            let entry = match m.role {
                Role::System => continue,
                Role::Tool if !with_tools => continue,
                Role::Tool => {
                    let (text, cut_) = cut(&m.content, MAX_TOOL_TEXT_CHARS);
                    json!({"index": index, "role": "tool", "tool": m.name, "text": text, "truncated": cut_})
                }
                Role::User | Role::Assistant => {
                    let tools: Vec<&str> = m.tool_calls.iter().map(|c| c.name.as_str()).collect();
                    if m.content.trim().is_empty() && tools.is_empty() {
                        continue;
                    }
                    let (text, cut_) = cut(&m.content, MAX_HISTORY_TEXT_CHARS);
                    let role = if m.role == Role::User {
                        "user"
                    } else {
                        "assistant"
                    };
                    let mut v = json!({"index": index, "role": role, "text": text});
                    if !tools.is_empty() {
                        v["tools"] = json!(tools);
                    }
                    if cut_ {
                        v["truncated"] = json!(true);
                    }
                    v
                }
            };
            if shown.len() == limit {
                next_before = Some(index + 1);
                break;
            }
            shown.push(entry);
        }
        shown.reverse();
        Ok(json!({
            "session_key": key.as_str(),
            "messages": shown,
            "next_before": next_before,
            "total": total,
        }))
    }
}

/// Most results `history_search` returns (default 5).
const MAX_HISTORY_RESULTS: usize = 20;
/// Characters of one message `history_search` returns around its best match.
const HISTORY_HIT_CHARS: usize = 1200;

/// Arguments of `history_search`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct HistorySearchArgs {
    /// Words to look for.
    query: String,
    /// Default 5, max 20.
    max_results: Option<usize>,
}

/// `history_search`: the current chat's stored messages before its compaction point (those
/// the summary replaced) that match the most words of the query (stemmed, case and accents
/// folded, as memory search reads them), best first, with when they were said. Only the
/// calling session's own transcript is read: the tool takes no session key.
struct HistorySearch(Arc<Shared>);

#[async_trait]
impl Tool for HistorySearch {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::HistorySearch.name()
    }
    fn description(&self) -> &str {
        "Search this chat's messages older than the summary."
    }
    fn parameters(&self) -> Value {
        schema_of::<HistorySearchArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::ReadOnly
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: HistorySearchArgs = parse_args(self.name(), args)?;
        let query = a.query.trim();
        if query.is_empty() {
            return Err(ToolError::InvalidArgs("query is empty".into()));
        }
        let max = a.max_results.unwrap_or(5).clamp(1, MAX_HISTORY_RESULTS);
        let store = self.0.dir.store.clone();
        let key = ctx.session.clone();
        let query = query.to_string();
        // A long chat is tens of megabytes: read and match it off the async threads.
        tokio::task::spawn_blocking(move || history_search(&store, &key, &query, max))
            .await
            .map_err(|e| ToolError::ExecutionFailed(format!("history search stopped: {e}")))?
    }
}

/// The best `max` matches of `query` in `key`'s transcript.
fn history_search(
    store: &Store,
    key: &SessionKey,
    query: &str,
    max: usize,
) -> Result<Value, ToolError> {
    let wanted: std::collections::BTreeSet<String> =
        crate::memory::text::terms(query).into_iter().collect();
    let from_seq = store
        .compaction(key)
        .map_err(store_err)?
        .map_or(0, |c| c.from_seq);
    // Only what the prompt no longer holds: the rest is in front of the model already.
    let mut transcript = store.load_transcript_from(key, 0).map_err(store_err)?;
    transcript.retain(|(seq, _)| *seq < from_seq);
    let searched = transcript.len();
    if searched == 0 {
        return Ok(json!({
            "results": [],
            "searched": 0,
            "message": "nothing of this conversation has been summarised yet: all of it is in your prompt",
        }));
    }
    // (score, seq): distinct query terms found, a literal match of the whole query worth
    // one more; newer first among equals.
    let mut hits: Vec<(usize, u64, usize)> = Vec::new();
    let mut said_at = Vec::with_capacity(transcript.len());
    let mut last_at = None;
    for (i, (seq, m)) in transcript.iter().enumerate() {
        if m.at_ms.is_some() {
            last_at = m.at_ms;
        }
        said_at.push(last_at);
        if m.role == Role::System || m.content.trim().is_empty() {
            continue;
        }
        let found: std::collections::BTreeSet<String> =
            crate::memory::text::terms(&m.content).into_iter().collect();
        let mut score = wanted.intersection(&found).count();
        if crate::memory::text::contains_phrase(&m.content, query) {
            score += 1;
        }
        if score > 0 {
            hits.push((score, *seq, i));
        }
    }
    hits.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
    let results: Vec<Value> = hits
        .iter()
        .take(max)
        .map(|&(score, seq, i)| {
            let m = &transcript[i].1;
            let (text, truncated) = cut(&m.content, HISTORY_HIT_CHARS);
            let mut v = json!({
                "index": seq,
                "role": m.role,
                "said_at": said_at[i].map_or(Value::Null, time_of),
                "text": text,
                "score": score,
            });
            if truncated {
                v["truncated"] = json!(true);
            }
            v
        })
        .collect();
    let mut out = json!({ "results": results, "searched": searched });
    if hits.is_empty() {
        out["message"] = json!("nothing in this conversation's history matches; try other words");
    }
    Ok(out)
}

/// Arguments of `sessions_send`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SendArgs {
    /// From sessions_list.
    session_key: String,
    /// The message.
    message: String,
}

struct SessionsSend(Arc<Shared>);

#[async_trait]
impl Tool for SessionsSend {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::SessionsSend.name()
    }
    fn description(&self) -> &str {
        "Hand a message to another visible conversation (sessions_list) as an incoming message; its assistant replies in that chat, not here. Returns: {status: sent|duplicate}"
    }
    fn parameters(&self) -> Value {
        schema_of::<SendArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::Network
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: SendArgs = parse_args(self.name(), args)?;
        let s = &self.0;
        let Some(route) = s.dir.route.get() else {
            return Err(ToolError::ExecutionFailed(
                "sessions_send works in the running gateway only (`weft gateway`)".into(),
            ));
        };
        let message = sanitize_content(&a.message);
        if message.trim().is_empty() {
            return Err(ToolError::InvalidArgs("message is empty".into()));
        }
        if message.len() > MAX_MESSAGE_BYTES {
            return Err(ToolError::InvalidArgs(format!(
                "message is {} bytes; the limit is {MAX_MESSAGE_BYTES}: send a shorter message",
                message.len()
            )));
        }
        if SessionKey::parse(a.session_key.trim()).is_ok_and(|k| k == ctx.session) {
            return Err(ToolError::InvalidArgs(
                "that is this session: answer here instead of sending to yourself".into(),
            ));
        }
        let target = s.target(ctx, &a.session_key)?;
        // What a repeat must share to be recognised: the message this turn answers (the same
        // when the turn resumes after a crash, whatever call ids the model makes up then), else
        // the tool call (outside a turn: `weft tools call`).
        let origin = ctx
            .turn
            .event_id
            .as_ref()
            .map(|e| format!("turn:{e}"))
            .or_else(|| ctx.call_id.as_ref().map(|c| format!("call:{c}")))
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let event_id = send_event_id(&ctx.session, &origin, &target, &message);
        let (channel, chat, thread) = target.route();
        let ev = InboundEvent {
            channel: ChannelId::new(channel),
            chat: ChatId::new(chat),
            thread: thread.map(ThreadId::new),
            sender: UserId::new(SYSTEM_SENDER),
            sender_name: None,
            event_id: PlatformEventId::new(event_id),
            content: format!(
                "[Message from session {} (agent {}) via sessions_send. It is not from this chat's user; answer it here, in this chat.]\n{message}",
                ctx.session,
                ctx.session.agent()
            ),
            received_at_ms: clawft_channel_core::now_ms(),
            attachments: Vec::new(),
            origin: clawft_channel_core::Origin::Session {
                from: ctx.session.to_string(),
            },
        };
        let outcome = s
            .dir
            .store
            .journal_inbound_async(&ev, &target)
            .await
            .map_err(|e| ToolError::ExecutionFailed(format!("could not queue the message: {e}")))?;
        let status = match outcome {
            JournalOutcome::New(entry) => {
                tracing::info!(from = %ctx.session, to = %target, "message handed to another session");
                if !route(entry) {
                    tracing::warn!(to = %target, "bus gone; the message stays journaled for the next start");
                }
                "sent"
            }
            JournalOutcome::Duplicate => "duplicate",
        };
        Ok(json!({
            "status": status,
            "session_key": target.as_str(),
            "note": if status == "sent" {
                "queued as an incoming message there; its reply goes to that chat"
            } else {
                "this message was already handed to that session in this turn; it is not sent again"
            },
        }))
    }
}

/// Arguments of `session_status` (none).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct StatusArgs {}

struct SessionStatus(Arc<Shared>);

fn row_json(r: &crate::store::usage::UsageRow) -> Value {
    json!({
        "input_tokens": r.input_tokens,
        "output_tokens": r.output_tokens,
        "cached_tokens": r.cached_tokens,
        "cost_usd": (r.cost_usd * 10_000.0).round() / 10_000.0,
    })
}

#[async_trait]
impl Tool for SessionStatus {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::SessionStatus.name()
    }
    fn description(&self) -> &str {
        "Show this conversation's status: agent, model, tokens and cost today, budgets left and queue."
    }
    fn parameters(&self) -> Value {
        schema_of::<StatusArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::ReadOnly
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let _: StatusArgs = parse_args(self.name(), args)?;
        let s = &self.0;
        let key = &ctx.session;
        let meta = s.dir.store.session_meta(key).map_err(store_err)?;
        // `/model NAME` chose one for this chat, else the agent's.
        let model = s
            .dir
            .store
            .state_get(super::MODEL_NS, key.as_str())
            .map_err(store_err)?
            .unwrap_or_else(|| s.model.clone());
        let (mut pending, mut running) = (0u64, 0u64);
        for e in s.dir.store.pending_inbound().map_err(store_err)? {
            if &e.session == key {
                match e.state {
                    InboxState::Pending => pending += 1,
                    InboxState::Started => running += 1,
                    InboxState::Done => {}
                }
            }
        }
        let user = ctx
            .sender
            .as_deref()
            .map(|u| crate::tools::sessions::participant(key.channel(), u));
        let (usage, budgets_left) = match s.dir.usage.get() {
            Some(ledger) => {
                let snap = ledger.snapshot(key.as_str());
                let u = user.as_deref().map(|u| ledger.user_today(u));
                let b = ledger.config().budgets;
                let mut left = serde_json::Map::new();
                let usd = |l: f64, spent: f64| {
                    json!(((l - spent).max(0.0) * 10_000.0).round() / 10_000.0)
                };
                let tok = |l: u64, spent: u64| json!(l.saturating_sub(spent));
                if let Some(l) = b.daily_usd {
                    left.insert("daily_usd".into(), usd(l, snap.today.cost_usd));
                }
                if let Some(l) = b.monthly_usd {
                    left.insert("monthly_usd".into(), usd(l, snap.month.cost_usd));
                }
                if let Some(l) = b.per_session_daily_usd {
                    left.insert(
                        "per_session_daily_usd".into(),
                        usd(l, snap.session.cost_usd),
                    );
                }
                if let (Some(l), Some(u)) = (b.per_user_daily_usd, &u) {
                    left.insert("per_user_daily_usd".into(), usd(l, u.cost_usd));
                }
                if let Some(l) = b.daily_tokens {
                    left.insert("daily_tokens".into(), tok(l, snap.today.tokens()));
                }
                if let Some(l) = b.monthly_tokens {
                    left.insert("monthly_tokens".into(), tok(l, snap.month.tokens()));
                }
                if let Some(l) = b.per_session_daily_tokens {
                    left.insert(
                        "per_session_daily_tokens".into(),
                        tok(l, snap.session.tokens()),
                    );
                }
                if let (Some(l), Some(u)) = (b.per_user_daily_tokens, &u) {
                    left.insert("per_user_daily_tokens".into(), tok(l, u.tokens()));
                }
                (
                    json!({
                        "session_today": row_json(&snap.session),
                        "all_sessions_today": row_json(&snap.today),
                        "all_sessions_month": row_json(&snap.month),
                    }),
                    Value::Object(left),
                )
            }
            None => (Value::Null, Value::Null),
        };
        Ok(json!({
            "session_key": key.as_str(),
            "agent": key.agent(),
            "model": model,
            "messages": meta.as_ref().map_or(0, |m| m.next_seq),
            "last_activity": meta.as_ref().map_or(Value::Null, |m| time_of(m.updated_ms)),
            "usage": usage,
            "budgets_left": budgets_left,
            "queue": {"running": running, "queued": pending},
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::sync::Mutex;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::llm::Message;
    use crate::tools::Workspace;

    fn ctx(dir: &std::path::Path, session: &str, sender: Option<&str>) -> ToolContext {
        ToolContext {
            workspace: Arc::new(Workspace::open(dir).unwrap()),
            session: SessionKey::parse(session).unwrap(),
            cancel: CancellationToken::new(),
            user_dir: None,
            sender: sender.map(Into::into),
            call_id: None,
            turn: Default::default(),
        }
    }

    fn chat(store: &Store, session: &str, sender: &str, text: &str, id: &str) {
        let key = SessionKey::parse(session).unwrap();
        let (channel, chat, _) = key.route();
        let ev = InboundEvent {
            channel: ChannelId::new(channel),
            chat: ChatId::new(chat),
            thread: None,
            sender: UserId::new(sender),
            sender_name: None,
            event_id: PlatformEventId::new(id),
            content: text.into(),
            received_at_ms: 1,
            attachments: Vec::new(),
            origin: clawft_channel_core::Origin::User,
        };
        let JournalOutcome::New(entry) = store.journal_inbound(&ev, &key).unwrap() else {
            panic!("dup")
        };
        store.begin_turn(&entry, &Message::user(text)).unwrap();
        store
            .finish_turn(&key, Some(&entry), &[Message::assistant("ok")], None)
            .unwrap();
    }

    fn tool<'a>(tools: &'a [Arc<dyn Tool>], name: &str) -> &'a Arc<dyn Tool> {
        tools.iter().find(|t| t.name() == name).unwrap()
    }

    #[tokio::test]
    async fn history_search_reads_only_the_calling_chats_summarised_messages() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::memory();
        chat(&store, "telegram:100", "100", "the boat will be teal", "e1");
        chat(&store, "telegram:200", "200", "bob's boat is red", "e2");
        chat(&store, "telegram:100", "100", "the boat needs oars", "e3");
        let tools = session_tools(
            SessionDirectory::new(store.clone()),
            SessionsSettings::default(),
            "m".into(),
        );
        let search = tool(&tools, "history_search");
        let alice = ctx(d.path(), "telegram:100", Some("100"));
        // Nothing summarised yet: all of it is in the prompt.
        let v = search
            .execute(json!({"query": "boat"}), &alice)
            .await
            .unwrap();
        assert_eq!(v["searched"], 0, "{v}");
        // The first exchange summarised (the window starts at the second user message).
        let key = SessionKey::parse("telegram:100").unwrap();
        let c = crate::store::window::Compaction {
            summary: "S".into(),
            from_seq: 2,
            shortened_until: 2,
            summarised: 2,
            count: 1,
        };
        store.put_compaction(&key, &c).unwrap().await.unwrap();
        let v = search
            .execute(json!({"query": "what colour is the boat"}), &alice)
            .await
            .unwrap();
        let texts: Vec<&str> = v["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["text"].as_str().unwrap())
            .collect();
        assert_eq!(texts, ["the boat will be teal"], "{v}");
        assert_eq!(v["searched"], 2);
        // Bob's chat is never read, whatever the query.
        let v = search
            .execute(json!({"query": "red"}), &alice)
            .await
            .unwrap();
        assert!(v["results"].as_array().unwrap().is_empty(), "{v}");
        assert!(search.execute(json!({"query": " "}), &alice).await.is_err());
    }

    #[tokio::test]
    async fn a_user_lists_and_reads_their_own_sessions_only_and_sends_once_per_call() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::memory();
        chat(&store, "telegram:100", "100", "alice here", "e1");
        chat(&store, "telegram:200", "200", "bob's secret plan", "e2");
        chat(&store, "telegram:-5", "100", "alice in the group", "e3");
        let dir = SessionDirectory::new(store.clone());
        let routed = Arc::new(Mutex::new(Vec::new()));
        let r = routed.clone();
        dir.attach(Arc::new(move |e| {
            r.lock().unwrap().push(e);
            true
        }));
        let tools = session_tools(dir.clone(), SessionsSettings::default(), "m".into());
        let alice = ctx(d.path(), "telegram:100", Some("100"));
        let v = tool(&tools, "sessions_list")
            .execute(json!({}), &alice)
            .await
            .unwrap();
        let keys: Vec<&str> = v["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["session_key"].as_str().unwrap())
            .collect();
        assert_eq!(keys.len(), 2, "{v}");
        assert!(keys.contains(&"telegram:100") && keys.contains(&"telegram:-5"));
        assert!(v["sessions"][0]["last_activity"].is_string(), "{v}");
        let e = tool(&tools, "sessions_history")
            .execute(json!({"session_key": "telegram:200"}), &alice)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "PERMISSION_DENIED");
        assert!(e.to_string().contains("tools.sessions.visibility"), "{e}");
        let e = tool(&tools, "sessions_send")
            .execute(
                json!({"session_key": "telegram:200", "message": "hi"}),
                &alice,
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), "PERMISSION_DENIED");
        let h = tool(&tools, "sessions_history")
            .execute(json!({"session_key": "telegram:-5", "limit": 1}), &alice)
            .await
            .unwrap();
        assert_eq!(h["messages"].as_array().unwrap().len(), 1, "{h}");
        assert_eq!(h["messages"][0]["text"], "ok");
        assert_eq!(h["next_before"], 1, "{h}");
        let h = tool(&tools, "sessions_history")
            .execute(json!({"session_key": "telegram:-5", "before": 1}), &alice)
            .await
            .unwrap();
        assert_eq!(h["messages"][0]["text"], "alice in the group", "{h}");
        assert!(h["next_before"].is_null(), "{h}");

        // The same call twice (a replay) is journaled and routed once.
        let send = tool(&tools, "sessions_send");
        let args = json!({"session_key": "telegram:-5", "message": "ping"});
        let reg = {
            let mut r = crate::tools::ToolRegistry::new();
            r.register(send.clone());
            r
        };
        let a = reg
            .dispatch("sessions_send", "call-9", &args.to_string(), &alice)
            .await;
        let b = reg
            .dispatch("sessions_send", "call-9", &args.to_string(), &alice)
            .await;
        assert_eq!(a.value["status"], "sent", "{:?}", a.value);
        assert_eq!(b.value["status"], "duplicate", "{:?}", b.value);
        // In a turn, the same message to the same session is one delivery whatever the call
        // ids (a resumed turn's model makes up new ones); another message is another.
        let in_turn_ctx = ToolContext {
            turn: crate::tools::TurnScope::answering(Some("100001".into())),
            ..alice.clone()
        };
        let in_turn = |id: &'static str, msg: &'static str| {
            let reg = &reg;
            let ctx = &in_turn_ctx;
            async move {
                let args = json!({"session_key": "telegram:-5", "message": msg});
                reg.dispatch("sessions_send", id, &args.to_string(), ctx)
                    .await
            }
        };
        assert_eq!(in_turn("c1", "hand-off").await.value["status"], "sent");
        assert_eq!(
            in_turn("c1_2", "hand-off").await.value["status"],
            "duplicate"
        );
        assert_eq!(in_turn("c3", "another").await.value["status"], "sent");
        let routed = routed.lock().unwrap();
        let via_call: Vec<_> = routed
            .iter()
            .filter(|e| {
                e.event
                    .as_ref()
                    .is_some_and(|ev| ev.event_id.as_str().contains("#call:call-9#"))
            })
            .collect();
        assert_eq!(via_call.len(), 1);
        let turns = routed
            .iter()
            .filter(|e| {
                e.event
                    .as_ref()
                    .is_some_and(|ev| ev.event_id.as_str().contains("#turn:100001#"))
            })
            .count();
        assert_eq!(turns, 2);
        let ev = via_call[0].event.as_ref().unwrap();
        assert_eq!(via_call[0].session.as_str(), "telegram:-5");
        assert!(
            ev.content.starts_with("[Message from session telegram:100"),
            "{}",
            ev.content
        );
        assert!(ev.content.ends_with("\nping"));
    }
}
