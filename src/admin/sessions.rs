//! The sessions the control UI lists: search across channels (by key, channel, user and by
//! text in the transcripts, bounded and paged), each session's prompt window and usage, and
//! `sessions/compact` (the `/compact` chat command, asked by the operator).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use clawft_channel_core::{ChannelId, ChatId, InboundEvent, PlatformEventId, ThreadId, UserId};
use serde_json::{json, Value};

use super::{bad_request, internal, usage_totals};
use crate::llm::tokens;
use crate::store::usage::UsageRow;
use crate::store::{JournalOutcome, Store};
use crate::types::SessionKey;
use clawft_channel_http::AdminError;

/// Rows per page by default, and at most.
pub const DEFAULT_LIMIT: usize = 25;
/// Most rows of one page.
pub const MAX_LIMIT: usize = 100;
/// Most transcript bytes one search reads for its text (the rest of the sessions are then
/// matched by key, channel and user only, and the answer says the text search stopped).
pub const TEXT_SCAN_BYTES: usize = 32 * 1024 * 1024;
/// Characters of context shown around a text match.
const SNIPPET: usize = 60;
/// The sender of the messages the control UI asks for (`/compact`).
pub const OPERATOR_SENDER: &str = "operator";

/// Each agent's prompt window settings (the budget and the model's window), by agent name.
pub type Windows = HashMap<String, crate::config::WindowSettings>;

/// [`Windows`] of `config`: its own agent and every named one.
pub fn windows_of(config: &crate::config::Config) -> Windows {
    std::iter::once((config.agent_name.clone(), config.agent.window.clone()))
        .chain(
            config
                .agents
                .iter()
                .map(|a| (a.name.clone(), a.agent.window.clone())),
        )
        .collect()
}

/// A session's prompt window: messages in it vs stored, the estimated tokens of what the
/// model is sent (summary and window, by the same estimate the window code uses), the prompt
/// budget and the model's window of its agent (when known), the summary and the compactions
/// so far.
///
/// # Errors
/// Store failure.
pub fn window_json(
    store: &Store,
    key: &SessionKey,
    stored: u64,
    windows: &Windows,
) -> Result<Value, AdminError> {
    let (state, msgs) = crate::session::window::load(store, key).map_err(internal)?;
    let history = crate::session::window::history(&state, &msgs);
    let c = &state.compaction;
    let settings = windows.get(key.agent());
    Ok(json!({
        "stored": stored,
        "in_window": msgs.len(),
        "from_seq": c.from_seq,
        "compactions": c.count,
        "summarised": c.summarised,
        "summary_tokens": if c.summary.is_empty() { 0 } else { tokens::of_text(&c.summary) },
        "summary": c.summary,
        "tokens_estimate": history.iter().map(tokens::of_message).sum::<u64>(),
        "prompt_budget_tokens": settings.map(|w| w.prompt_budget),
        "context_window": settings.map(|w| w.context_window),
    }))
}

/// Usage totals and users of every session (one pass over the usage rows).
fn usage_by_session(
    store: &Store,
) -> Result<HashMap<String, (UsageRow, BTreeSet<String>)>, AdminError> {
    let mut by: HashMap<String, (UsageRow, BTreeSet<String>)> = HashMap::new();
    for r in store.usage_rows("").map_err(internal)? {
        let e = by.entry(r.session.clone()).or_default();
        e.0.add(&r);
        if !r.user.is_empty() {
            e.1.insert(r.user.clone());
        }
    }
    Ok(by)
}

/// Around the first place `q` (lower case) is in `text`.
fn snippet(text: &str, q: &str) -> Option<String> {
    let lower = text.to_lowercase();
    let at = lower.find(q)?;
    // Positions in `lower` may differ from `text`'s for a few characters; cut on chars.
    let chars: Vec<char> = text.chars().collect();
    let at_char = lower[..at].chars().count();
    let start = at_char.saturating_sub(SNIPPET);
    let end = (at_char + q.chars().count() + SNIPPET).min(chars.len());
    let mut s: String = chars[start.min(chars.len())..end].iter().collect();
    s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    Some(format!(
        "{}{s}{}",
        if start > 0 { "…" } else { "" },
        if end < chars.len() { "…" } else { "" }
    ))
}

/// The arguments of `sessions/search {q?, channel?, offset?, limit?}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchQuery {
    /// Words to find (lowercased; empty: every session).
    pub q: String,
    /// Only sessions of this channel (empty: any).
    pub channel: String,
    /// Matches skipped (the page's start).
    pub offset: usize,
    /// Matches returned (1 to [`MAX_LIMIT`]).
    pub limit: usize,
}

impl SearchQuery {
    /// The query of a request body.
    ///
    /// # Errors
    /// `limit` out of range or `q` too long (400).
    pub fn of(body: &Value) -> Result<Self, AdminError> {
        let q = body["q"].as_str().unwrap_or("").trim().to_lowercase();
        let limit = match body["limit"].as_u64() {
            None => DEFAULT_LIMIT,
            Some(n) if (1..=MAX_LIMIT as u64).contains(&n) => {
                usize::try_from(n).unwrap_or(MAX_LIMIT)
            }
            Some(n) => {
                return Err(bad_request(format!(
                    "`limit` must be 1 to {MAX_LIMIT}, got {n}"
                )))
            }
        };
        if q.len() > 200 {
            return Err(bad_request("`q` is at most 200 bytes"));
        }
        Ok(Self {
            q,
            channel: body["channel"].as_str().unwrap_or("").trim().to_string(),
            offset: usize::try_from(body["offset"].as_u64().unwrap_or(0)).unwrap_or(usize::MAX),
            limit,
        })
    }
}

/// `sessions/search`: the stored sessions, most recently updated first, that match `q` (in
/// the key, the channel, a user who wrote in it, or the text of its transcript) and
/// `channel`; one page of them, each with its window and usage.
///
/// # Errors
/// A store failure.
pub fn search(store: &Store, query: &SearchQuery, windows: &Windows) -> Result<Value, AdminError> {
    let SearchQuery {
        q,
        channel,
        offset,
        limit,
    } = query.clone();
    let mut metas = store.sessions().map_err(internal)?;
    metas.sort_by(|a, b| b.updated_ms.cmp(&a.updated_ms).then(a.key.cmp(&b.key)));
    let usage = usage_by_session(store)?;
    let names = store.user_names().map_err(internal)?;
    let none = (UsageRow::default(), BTreeSet::new());
    let mut budget = TEXT_SCAN_BYTES;
    let mut text_incomplete = false;
    let mut matched = 0usize;
    let mut rows = Vec::new();
    let mut more = false;
    for m in &metas {
        if !channel.is_empty() && m.key.channel() != channel {
            continue;
        }
        let (u, users) = usage.get(m.key.as_str()).unwrap_or(&none);
        let hit: Option<(&str, Option<String>)> = if q.is_empty() {
            Some(("all", None))
        } else if m.key.as_str().to_lowercase().contains(&q) {
            Some(("key", None))
        } else if let Some(user) = users.iter().find(|x| {
            x.to_lowercase().contains(&q)
                || names.get(*x).is_some_and(|n| n.to_lowercase().contains(&q))
        }) {
            Some(("user", Some(user.clone())))
        } else if budget == 0 {
            text_incomplete = true;
            None
        } else {
            let mut found = None;
            for msg in store.load_transcript(&m.key).map_err(internal)? {
                let n = msg.content.len().min(budget);
                budget -= n;
                if let Some(s) = snippet(&msg.content, &q) {
                    found = Some(("text", Some(s)));
                    break;
                }
                if budget == 0 {
                    text_incomplete = true;
                    break;
                }
            }
            found
        };
        let Some((by, detail)) = hit else {
            continue;
        };
        matched += 1;
        if matched <= offset {
            continue;
        }
        if rows.len() == limit {
            more = true;
            break;
        }
        rows.push(json!({
            "key": m.key.as_str(),
            "channel": m.key.channel(),
            "agent": m.key.agent(),
            "messages": m.next_seq,
            "created_ms": m.created_ms,
            "updated_ms": m.updated_ms,
            "users": users,
            // The display names of those users whose platform gave one (decoration only).
            "names": users
                .iter()
                .filter_map(|u| names.get(u).map(|n| (u.clone(), n.clone())))
                .collect::<BTreeMap<_, _>>(),
            "match": by,
            "snippet": detail,
            "window": window_json(store, &m.key, m.next_seq, windows)?,
            "usage": usage_totals(u),
        }));
    }
    Ok(json!({
        "sessions": rows,
        "offset": offset,
        "limit": limit,
        "next_offset": more.then_some(offset + limit),
        "total_sessions": metas.len(),
        "text_search_incomplete": text_incomplete,
    }))
}

/// `sessions/compact {session}`: summarise the session now, exactly as its `/compact` chat
/// command does (in order with its queued messages; the chat sees the usual notice). The
/// command is journaled like a message of the chat, so a restart does not lose it.
///
/// # Errors
/// Not a chat session, unknown session, or a store failure.
pub fn compact(
    store: &Store,
    running: &[String],
    route: impl FnOnce(crate::store::InboxEntry) -> bool,
    session: &str,
) -> Result<Value, AdminError> {
    let key = SessionKey::parse(session).map_err(bad_request)?;
    if store.session_meta(&key).map_err(internal)?.is_none() {
        return Err(bad_request(format!("no session `{key}` is stored")));
    }
    let (channel, chat, thread) = key.route();
    if chat.is_empty() || !running.iter().any(|c| c == channel) {
        return Err(bad_request(format!(
            "`{key}` is not the session of a chat on a running channel: it is compacted by its own turns"
        )));
    }
    let now = clawft_channel_core::now_ms();
    let event_id = format!("ui-compact:{now:x}:{:04x}", fastrand::u16(..));
    let ev = InboundEvent {
        channel: ChannelId::new(channel),
        chat: ChatId::new(chat),
        thread: thread.map(ThreadId::new),
        sender: UserId::new(OPERATOR_SENDER),
        sender_name: None,
        event_id: PlatformEventId::new(event_id.clone()),
        content: "/compact".into(),
        received_at_ms: now,
        attachments: Vec::new(),
        origin: clawft_channel_core::Origin::User,
    };
    match store.journal_inbound(&ev, &key).map_err(internal)? {
        JournalOutcome::New(entry) => {
            if !route(entry) {
                tracing::warn!(session = %key, "compaction journaled but the bus is gone; it runs at the next start");
            }
            Ok(json!({"session": key.as_str(), "compacting": true, "event_id": event_id}))
        }
        JournalOutcome::Duplicate => Err(AdminError::Internal("duplicate event id".into())),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Thousands of sessions: one page comes back quickly, the text search reads at most its
    /// budget and says when it stopped, and paging walks the matches without repeating one.
    #[test]
    fn a_search_over_thousands_of_sessions_is_bounded_and_paged() {
        use crate::llm::Message;
        let store = Store::memory();
        let filler = "lorem ipsum dolor sit amet ".repeat(400); // ~10 KB a message
        for i in 0..3000 {
            let key = SessionKey::parse(&format!("telegram:{i}")).unwrap();
            let mut msgs = vec![Message::user(filler.clone()), Message::assistant(&filler)];
            if i % 1000 == 7 {
                msgs.push(Message::user(format!("the secret word is zebra{i}")));
            }
            store.append_messages(&key, &msgs).unwrap();
        }
        let t = std::time::Instant::now();
        let v = search(
            &store,
            &SearchQuery::of(&json!({"q": "zebra"})).unwrap(),
            &Windows::new(),
        )
        .unwrap();
        let took = t.elapsed();
        // 3,000 × 20 KB = 60 MB of text: the budget (32 MB) stops the text search.
        assert_eq!(v["text_search_incomplete"], true, "{v}");
        assert!(took < std::time::Duration::from_secs(20), "{took:?}");
        // By key: every session is matched, a page at a time, without reading transcripts.
        let mut seen = std::collections::HashSet::new();
        let mut offset = 0;
        for _ in 0..3 {
            let q = json!({"q": "telegram:", "limit": 100, "offset": offset});
            let v = search(&store, &SearchQuery::of(&q).unwrap(), &Windows::new()).unwrap();
            let rows = v["sessions"].as_array().unwrap();
            assert_eq!(rows.len(), 100);
            for r in rows {
                assert!(seen.insert(r["key"].as_str().unwrap().to_string()), "{r}");
                assert_eq!(r["window"]["stored"], r["window"]["in_window"]);
            }
            offset = v["next_offset"].as_u64().unwrap();
            assert_eq!(v["total_sessions"], 3000);
            assert_eq!(v["text_search_incomplete"], false);
        }
        assert_eq!(offset, 300);
        // Within the budget, the text is found.
        let v = search(
            &store,
            &SearchQuery::of(&json!({"q": "zebra2007", "channel": "telegram"})).unwrap(),
            &Windows::new(),
        )
        .unwrap();
        let found: Vec<&str> = v["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["key"].as_str().unwrap())
            .collect();
        // (the newest sessions are read first: this one is within the budget)
        assert_eq!(found, ["telegram:2007"], "{v}");
        assert_eq!(v["sessions"][0]["match"], "text");
    }

    #[test]
    fn a_snippet_shows_the_match_with_context_on_char_boundaries() {
        let t = format!("{}needle é here{}", "a ".repeat(100), " b".repeat(100));
        let s = snippet(&t, "needle é").unwrap();
        assert!(
            s.starts_with('…') && s.ends_with('…') && s.contains("needle é here"),
            "{s}"
        );
        assert!(snippet("nothing", "needle").is_none());
        assert_eq!(
            snippet("Ünïcode NEEDLE", "needle").unwrap(),
            "Ünïcode NEEDLE"
        );
    }
}
