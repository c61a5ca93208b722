//! [`SessionKey`]: one conversation, `[@agent:]channel:chat[:thread]`, with its one storage
//! encoding, and the keys the gateway makes for itself (subagents).

use std::fmt;

use clawft_channel_core::{InboundEvent, Origin};
use serde::{Deserialize, Serialize};

/// Longest accepted session key, in bytes (seed 002).
pub const MAX_SESSION_KEY_BYTES: usize = 256;

/// One conversation: `[@agent:]channel:chat[:thread]` (or a per-user or subagent key). The
/// key is split into its parts once, when it is made: the agent, the channel, the chat, the
/// thread are read from those, never by splitting the text again. The text itself is what the
/// store and the logs see.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SessionKey {
    /// The rendered key (store encoding, logs, `Display`). Compared first, so keys order and
    /// hash by their text.
    text: String,
    /// Byte offset of the key past its `@agent:` component (0: the default agent's key).
    bare: usize,
    /// Byte ranges in `text` of the components after the agent's (channel, chat, thread,
    /// per-user sender …).
    parts: Vec<(usize, usize)>,
}

/// Why a session key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid session id `{shown}`: {reason}")]
pub struct InvalidSessionKey {
    shown: String,
    reason: &'static str,
}

impl SessionKey {
    /// Derive the key of an inbound event (the only constructor used by ingress).
    ///
    /// # Errors
    /// When a component is empty, has `:`, or the whole fails [`SessionKey::parse`].
    pub fn derive(ev: &InboundEvent) -> Result<Self, InvalidSessionKey> {
        let mut parts = vec![ev.channel.as_str(), ev.chat.as_str()];
        if let Some(t) = &ev.thread {
            parts.push(t.as_str());
        }
        Self::from_parts(&parts)
    }

    /// Build a key from components, each non-empty and without `:`.
    ///
    /// # Errors
    /// As [`SessionKey::parse`], or a component that is empty or contains `:`.
    pub fn from_parts(parts: &[&str]) -> Result<Self, InvalidSessionKey> {
        for p in parts {
            if p.is_empty() {
                return Err(invalid(&parts.join(":"), "empty component"));
            }
            if p.contains(':') {
                return Err(invalid(&parts.join(":"), "a component contains `:`"));
            }
        }
        Self::parse(&parts.join(":"))
    }

    /// Validate a key given as text (CLI, HTTP admin API): not empty, at most 256 bytes, no
    /// `..`, no `/` or `\`, no NUL or control characters.
    ///
    /// # Errors
    /// [`InvalidSessionKey`] saying which rule was broken.
    pub fn parse(s: &str) -> Result<Self, InvalidSessionKey> {
        if s.is_empty() {
            return Err(invalid(s, "empty"));
        }
        if s.len() > MAX_SESSION_KEY_BYTES {
            return Err(invalid(s, "longer than 256 bytes"));
        }
        if s.contains("..") {
            return Err(invalid(s, "contains `..`"));
        }
        if s.contains('/') || s.contains('\\') {
            return Err(invalid(s, "contains a path separator"));
        }
        if s.chars().any(char::is_control) {
            return Err(invalid(s, "contains NUL or a control character"));
        }
        let text = s.to_string();
        let bare = text.len() - without_agent(&text).len();
        let mut parts = Vec::new();
        let mut start = bare;
        for piece in text[bare..].split(':') {
            parts.push((start, start + piece.len()));
            start += piece.len() + 1;
        }
        Ok(Self { text, bare, parts })
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The one storage encoding (never contains NUL, which the store uses as separator).
    pub fn to_store_key(&self) -> Vec<u8> {
        self.text.as_bytes().to_vec()
    }

    /// Component `i` after the agent's (0: the channel, 1: the chat, 2: the thread …).
    fn part(&self, i: usize) -> Option<&str> {
        self.parts.get(i).map(|&(a, b)| &self.text[a..b])
    }

    /// The channel component (after the agent's, if any).
    pub fn channel(&self) -> &str {
        self.part(0).unwrap_or("")
    }

    /// The agent serving this conversation: the `@NAME` first component, or
    /// [`DEFAULT_AGENT`] for keys without one (every key made before agents existed).
    pub fn agent(&self) -> &str {
        match self.bare {
            0 => DEFAULT_AGENT,
            n => Some(&self.text[1..n - 1])
                .filter(|a| !a.is_empty())
                .unwrap_or(DEFAULT_AGENT),
        }
    }

    /// The key without its agent component (`@work:telegram:42` → `telegram:42`).
    pub fn without_agent(&self) -> &str {
        &self.text[self.bare..]
    }

    /// This conversation served by `agent`: `@agent:` before the key, or the key alone for
    /// [`DEFAULT_AGENT`] (so the default agent's conversations keep the keys they had).
    ///
    /// # Errors
    /// An agent name that is empty or holds `:` or `@`, or a key grown over 256 bytes.
    pub fn with_agent(&self, agent: &str) -> Result<Self, InvalidSessionKey> {
        let bare = self.without_agent();
        if agent == DEFAULT_AGENT {
            return Self::parse(bare);
        }
        if agent.is_empty() || agent.contains([':', '@']) {
            return Err(invalid(
                agent,
                "an agent name is empty or contains `:` or `@`",
            ));
        }
        Self::parse(&format!("@{agent}:{bare}"))
    }

    /// The key of `ev` when the channel isolates users: one session per sender inside each
    /// chat/thread, `channel:chat:thread-or--:u<sender>` (four components; ordinary keys have
    /// two or three, so [`SessionKey::route`] tells them apart).
    ///
    /// # Errors
    /// As [`SessionKey::from_parts`].
    pub fn derive_per_user(ev: &InboundEvent) -> Result<Self, InvalidSessionKey> {
        // Matrix user ids (`@alice:example.org`) hold the separator.
        let user = format!("u{}", ev.sender.as_str().replace(':', "%3A"));
        let thread = ev.thread.as_ref().map_or("-", |t| t.as_str());
        Self::from_parts(&[ev.channel.as_str(), ev.chat.as_str(), thread, &user])
    }

    /// Where replies for this session go: (channel, chat, thread).
    pub fn route(&self) -> (&str, &str, Option<&str>) {
        match (self.part(0), self.part(1), self.part(2), self.parts.len()) {
            (Some(c), Some(chat), None, _) => (c, chat, None),
            (Some(c), Some(chat), Some(t), 3) => (c, chat, Some(t)),
            (Some(c), Some(chat), Some(t), _) => (c, chat, (t != "-").then_some(t)),
            _ => (self.channel(), "", None),
        }
    }
}

fn invalid(s: &str, reason: &'static str) -> InvalidSessionKey {
    let shown: String = s
        .chars()
        .take(64)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    InvalidSessionKey { shown, reason }
}

impl fmt::Display for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl TryFrom<String> for SessionKey {
    type Error = InvalidSessionKey;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<SessionKey> for String {
    fn from(k: SessionKey) -> String {
        k.text
    }
}

/// A chat user as the gateway records them across channels: `channel:sender`, the one form
/// pairing, allowlists, budgets per user and a session's participants use.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SenderId(String);

impl SenderId {
    /// `sender` on `channel`.
    pub fn new(channel: &str, sender: &str) -> Self {
        Self(format!("{channel}:{sender}"))
    }

    /// The sender of `ev`.
    pub fn of(ev: &InboundEvent) -> Self {
        Self::new(ev.channel.as_str(), ev.sender.as_str())
    }

    /// The rendered form, `channel:sender`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SenderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<SenderId> for String {
    fn from(s: SenderId) -> String {
        s.0
    }
}

/// The agent of keys without an `@NAME` component: the one `agents.defaults` configures.
pub const DEFAULT_AGENT: &str = "main";

/// [`SessionKey::without_agent`] of a key kept as a string.
pub fn without_agent(key: &str) -> &str {
    match key.strip_prefix('@') {
        Some(r) => r.split_once(':').map_or("", |(_, rest)| rest),
        None => key,
    }
}

/// [`SessionKey::agent`] of a key kept as a string (a usage record's session).
pub fn agent_of(key: &str) -> &str {
    key.strip_prefix('@')
        .and_then(|r| r.split(':').next())
        .filter(|a| !a.is_empty())
        .unwrap_or(DEFAULT_AGENT)
}

/// Session keys of subagents are `subagent:<task id>`.
pub const SUBAGENT_KEY_PREFIX: &str = "subagent";

/// The sender of the inbound events the gateway journals for itself (subagent announcements):
/// their replies answer the chat, not an event.
pub const SYSTEM_SENDER: &str = "clawft-subagents";

/// Event-id prefixes of the inbound events the gateway journals for itself: subagent results,
/// scheduled runs (a turn, or a text delivered as it is), heartbeats, messages one session hands
/// another (`sessions_send`), signed webhook deliveries (`hook:NAME:DELIVERY`). Ingress refuses them from channels, so only the gateway makes them.
pub const GATEWAY_EVENT_PREFIXES: &[&str] = &[
    "subagents:",
    "cron:",
    "cron-text:",
    "heartbeat:",
    "sessions:",
    "hook:",
];

/// Whether `event_id` is in the gateway's own namespace ([`GATEWAY_EVENT_PREFIXES`]).
pub fn is_reserved_event_id(event_id: &str) -> bool {
    GATEWAY_EVENT_PREFIXES
        .iter()
        .any(|p| event_id.starts_with(p))
}

/// Whether `ev` was made by the gateway itself (subagent results, a scheduled run, a
/// heartbeat): its reply answers the chat, not an event, it streams nothing and it is never a
/// chat command.
pub fn is_gateway_event(ev: &InboundEvent) -> bool {
    !ev.origin.is_user()
}

/// The origin of a journal record written before events carried one (those records have
/// none, so they read as [`Origin::User`]): the gateway's own events were told apart by their
/// event-id prefix then. Applied once, where the store decodes a journal entry; nothing else
/// looks at prefixes.
pub fn legacy_origin(ev: &InboundEvent) -> Origin {
    let id = ev.event_id.as_str();
    let after = |p: &str| id.strip_prefix(p).map(str::to_string);
    if !ev.origin.is_user() {
        return ev.origin.clone();
    }
    if let Some(run) = after("cron-text:") {
        Origin::Scheduled { run, text: true }
    } else if let Some(run) = after("cron:") {
        Origin::Scheduled { run, text: false }
    } else if id.starts_with("heartbeat:") {
        Origin::Heartbeat
    } else if id.starts_with("subagents:") || ev.sender.as_str() == SYSTEM_SENDER {
        Origin::Subagent
    } else if id.starts_with("sessions:") {
        Origin::Session {
            from: String::new(),
        }
    } else if let Some(rest) = after("hook:") {
        Origin::Webhook {
            hook: rest.split(':').next().unwrap_or("").to_string(),
        }
    } else {
        Origin::User
    }
}

/// `subagent:<id>`.
pub fn subagent_key(id: &str) -> Option<SessionKey> {
    SessionKey::from_parts(&[SUBAGENT_KEY_PREFIX, id]).ok()
}

/// The task id if `key` is a subagent's session.
pub fn subagent_task_id(key: &SessionKey) -> Option<&str> {
    subagent_task_id_in(key.as_str())
}

/// [`subagent_task_id`] for a key kept as a string (a record's `parent`).
pub fn subagent_task_id_in(key: &str) -> Option<&str> {
    without_agent(key)
        .strip_prefix(SUBAGENT_KEY_PREFIX)
        .and_then(|r| r.strip_prefix(':'))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn journal_records_without_an_origin_get_the_one_their_prefix_meant() {
        let ev = |id: &str, sender: &str| InboundEvent {
            channel: clawft_channel_core::ChannelId::new("telegram"),
            chat: clawft_channel_core::ChatId::new("42"),
            thread: None,
            sender: clawft_channel_core::UserId::new(sender),
            sender_name: None,
            event_id: clawft_channel_core::PlatformEventId::new(id),
            content: String::new(),
            received_at_ms: 0,
            attachments: Vec::new(),
            origin: Origin::User,
        };
        assert_eq!(
            legacy_origin(&ev("cron-text:j1:2026", "7")),
            Origin::Scheduled {
                run: "j1:2026".into(),
                text: true
            }
        );
        assert_eq!(
            legacy_origin(&ev("cron:j1:2026", "7")),
            Origin::Scheduled {
                run: "j1:2026".into(),
                text: false
            }
        );
        assert_eq!(
            legacy_origin(&ev("heartbeat:1", SYSTEM_SENDER)),
            Origin::Heartbeat
        );
        assert_eq!(
            legacy_origin(&ev("subagents:t1", SYSTEM_SENDER)),
            Origin::Subagent
        );
        assert_eq!(
            legacy_origin(&ev("hook:deploy:d1", "hook:deploy")),
            Origin::Webhook {
                hook: "deploy".into()
            }
        );
        assert_eq!(legacy_origin(&ev("12345", "7")), Origin::User);
        // An origin already recorded is kept as it is.
        let mut e = ev("12345", "7");
        e.origin = Origin::Heartbeat;
        assert_eq!(legacy_origin(&e), Origin::Heartbeat);
    }

    #[test]
    fn a_key_keeps_its_parts() {
        let k = SessionKey::parse("@work:telegram:-100:7").unwrap();
        assert_eq!(k.agent(), "work");
        assert_eq!(k.channel(), "telegram");
        assert_eq!(k.without_agent(), "telegram:-100:7");
        assert_eq!(k.route(), ("telegram", "-100", Some("7")));
        assert_eq!(k.as_str(), "@work:telegram:-100:7");
        let d = SessionKey::parse("http:me").unwrap();
        assert_eq!(
            (d.agent(), d.channel(), d.route()),
            ("main", "http", ("http", "me", None))
        );
        let s = subagent_key("t1").unwrap();
        assert_eq!(subagent_task_id(&s), Some("t1"));
        // The parts follow the text through serde (the store's form).
        let back: SessionKey = serde_json::from_str(&serde_json::to_string(&k).unwrap()).unwrap();
        assert_eq!(back, k);
        assert_eq!(back.route(), k.route());
        assert_eq!(SenderId::new("telegram", "42").as_str(), "telegram:42");
    }

    #[test]
    fn routes_of_chat_thread_and_per_user_keys() {
        let k = |s: &str| SessionKey::parse(s).unwrap();
        assert_eq!(k("telegram:42").route(), ("telegram", "42", None));
        assert_eq!(k("slack:C1:171.2").route(), ("slack", "C1", Some("171.2")));
        assert_eq!(k("telegram:-100:-:u42").route(), ("telegram", "-100", None));
        assert_eq!(
            k("telegram:-100:7:u42").route(),
            ("telegram", "-100", Some("7"))
        );
    }

    #[test]
    fn the_agent_is_a_leading_component_and_the_default_agent_has_none() {
        let k = |s: &str| SessionKey::parse(s).unwrap();
        let plain = k("telegram:42");
        assert_eq!(plain.agent(), DEFAULT_AGENT);
        let work = plain.with_agent("work").unwrap();
        assert_eq!(work.as_str(), "@work:telegram:42");
        assert_eq!(work.agent(), "work");
        assert_eq!(work.channel(), "telegram");
        assert_eq!(work.route(), ("telegram", "42", None));
        assert_eq!(work.without_agent(), "telegram:42");
        assert_eq!(work.with_agent(DEFAULT_AGENT).unwrap(), plain);
        assert_eq!(
            k("@w:telegram:-100:7:u42").route(),
            ("telegram", "-100", Some("7"))
        );
        assert!(plain.with_agent("a:b").is_err());
        assert_eq!(subagent_task_id_in("@w:subagent:t1"), Some("t1"));
        assert_eq!(subagent_task_id_in("subagent:t1"), Some("t1"));
    }

    #[test]
    fn keys_are_validated() {
        assert!(SessionKey::parse("http:abc").is_ok());
        for bad in [
            "",
            "a/../b",
            "a/b",
            "a\\b",
            "a\0b",
            "a\x07b",
            &"x".repeat(257),
        ] {
            assert!(SessionKey::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(SessionKey::parse(&"x".repeat(256)).is_ok());
        assert!(SessionKey::from_parts(&["http", "a:b"]).is_err());
        assert!(SessionKey::from_parts(&["http", ""]).is_err());
        assert_eq!(
            SessionKey::from_parts(&["slack", "C1", "17.5"])
                .unwrap()
                .as_str(),
            "slack:C1:17.5"
        );
    }
}
