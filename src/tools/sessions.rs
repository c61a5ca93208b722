//! The settings and the pure rules of the session tools (`sessions_list`, `sessions_history`,
//! `sessions_send`, `session_status`; the tools themselves are in `session::tools`, which may
//! read the store, the usage ledger and the bus).
//!
//! **Visibility** (`tools.sessions.visibility`), of the sessions a turn may list, read and send
//! to, besides its own:
//! - `"user"` (default): sessions of the same agent in which the turn's chat user (its sender, on
//!   the session's channel) has spoken: their DM, their per-user session in a group, a group chat
//!   they wrote in. Never a session only other users spoke in. A turn without a chat user on a
//!   platform channel (a subagent result, a scheduled run, a `sessions_send` hand-off) sees only
//!   its own session; the terminal and the control token (`cli:`, the operator) see every
//!   session of their agent.
//! - `"agent"`: every session of the same agent.
//! - `"all"`: every session of every agent, where another agent's sessions also need
//!   `tools.sessions.agent_to_agent` (enabled, and both agents in `allow`).
//!
//! Subagent sessions (`subagent:<id>`) are never listed or targeted: the `subagents` tool
//! manages them.

use serde::{Deserialize, Serialize};

use crate::types::session_key::subagent_task_id;
use crate::types::{SessionKey, SettingError};

/// Event-id prefix of a message handed to a session by `sessions_send` (reserved: ingress
/// refuses it from channels, `types::session_key::GATEWAY_EVENT_PREFIXES`).
pub const SEND_PREFIX: &str = "sessions:";

/// Longest origin (turn event or call id) kept in an event id (bytes); longer ones are cut.
const MAX_CALL_ID_BYTES: usize = 128;

/// Which sessions a turn may see.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Visibility {
    /// Sessions of this agent where the turn's user has spoken (the default).
    #[default]
    User,
    /// Every session of this agent.
    Agent,
    /// Every session of every agent (another agent's also needs `agent_to_agent`).
    All,
}

impl Visibility {
    /// As the config spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Visibility::User => "user",
            Visibility::Agent => "agent",
            Visibility::All => "all",
        }
    }
}

/// `tools.sessions.agent_to_agent` in the file.
#[derive(Debug, Default, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentToAgentFile {
    /// Whether a session may see and message another agent's sessions (default false).
    pub enabled: Option<bool>,
    /// Agents taking part, by name, or `*` for all (default: none). Both the calling agent and
    /// the target's must be listed.
    pub allow: Option<Vec<String>>,
}

/// `tools.sessions` in the file.
#[derive(Debug, Default, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionsFile {
    /// `"user"` (default), `"agent"` or `"all"`: which sessions the session tools may see.
    pub visibility: Option<String>,
    /// Another agent's sessions (with `visibility = "all"`).
    #[serde(default)]
    pub agent_to_agent: AgentToAgentFile,
}

/// The resolved `tools.sessions`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionsSettings {
    /// `tools.sessions.visibility`.
    pub visibility: Visibility,
    /// `tools.sessions.agent_to_agent.enabled`.
    pub agent_to_agent: bool,
    /// `tools.sessions.agent_to_agent.allow`.
    pub agent_allow: Vec<String>,
}

const KEY: &str = "tools.sessions";

impl SessionsFile {
    /// Check and resolve.
    ///
    /// # Errors
    /// The key and what is accepted.
    pub fn resolve(&self) -> Result<SessionsSettings, SettingError> {
        let visibility = match self.visibility.as_deref() {
            None | Some("user") => Visibility::User,
            Some("agent") => Visibility::Agent,
            Some("all") => Visibility::All,
            Some(v) => {
                return Err(SettingError::new(
                    format!("{KEY}.visibility"),
                    format!("expected \"user\" (a user's own sessions), \"agent\" (every session of the agent) or \"all\" (every agent's, with agent_to_agent), got `{v}`"),
                ))
            }
        };
        let a2a = &self.agent_to_agent;
        let agent_allow = a2a.allow.clone().unwrap_or_default();
        for a in &agent_allow {
            if a.is_empty() || a.contains([':', '@']) || (a.contains('*') && a != "*") {
                return Err(SettingError::new(
                    format!("{KEY}.agent_to_agent.allow"),
                    format!(
                        "expected agent names (no `:` or `@`) or \"*\" for every agent, got `{a}`"
                    ),
                ));
            }
        }
        let agent_to_agent = a2a.enabled.unwrap_or(false);
        if agent_to_agent && agent_allow.is_empty() {
            return Err(SettingError::new(
                format!("{KEY}.agent_to_agent.allow"),
                "agent_to_agent.enabled = true lets no agent through while allow is empty: list the agents (e.g. [\"main\", \"work\"]) or \"*\"",
            ));
        }
        Ok(SessionsSettings {
            visibility,
            agent_to_agent,
            agent_allow,
        })
    }
}

/// Who is asking: the calling session and its turn's chat user.
#[derive(Clone, Copy, Debug)]
pub struct Viewer<'a> {
    /// The calling session.
    pub session: &'a SessionKey,
    /// The turn's chat user (`ToolContext::sender`).
    pub sender: Option<&'a str>,
}

impl Viewer<'_> {
    /// The terminal or the control token: no chat user, on the `cli` channel.
    pub fn is_operator(&self) -> bool {
        self.sender.is_none()
            && clawft_channel_core::Surface::of(self.session.channel())
                == Some(clawft_channel_core::Surface::Terminal)
    }

    /// The chat user as recorded among a session's participants (`channel:sender`).
    pub fn user(&self) -> Option<String> {
        self.sender.map(|s| participant(self.session.channel(), s))
    }
}

/// How a session's participant is recorded: `channel:sender`.
pub fn participant(channel: &str, sender: &str) -> String {
    crate::types::SenderId::new(channel, sender).into()
}

/// Whether `target` belongs to the user `channel:sender` by its key alone: their per-user
/// session in a group (`channel:chat:thread:u<sender>`) or a DM whose chat id is their id
/// (Telegram).
fn owned_by_key(target: &SessionKey, channel: &str, sender: &str) -> bool {
    if target.channel() != channel {
        return false;
    }
    let parts: Vec<&str> = target.without_agent().split(':').collect();
    match parts.as_slice() {
        [_, chat] | [_, chat, _] => *chat == sender,
        [_, _, _, u] => u.strip_prefix('u') == Some(sender),
        _ => false,
    }
}

/// Why a session may not be seen: the text of the `PERMISSION_DENIED` error.
pub type Denied = String;

/// Whether `viewer` may see `target` (list it, read it, send to it). `participants` are the
/// `channel:sender` users who have spoken in `target` (recorded at each turn).
///
/// # Errors
/// Why not, naming the setting to change.
pub fn may_see(
    settings: &SessionsSettings,
    viewer: Viewer<'_>,
    target: &SessionKey,
    participants: &[String],
) -> Result<(), Denied> {
    if target == viewer.session {
        return Ok(());
    }
    if subagent_task_id(target).is_some() {
        return Err(format!(
            "`{target}` is a subagent's session: use the subagents tool for it"
        ));
    }
    let (mine, theirs) = (viewer.session.agent(), target.agent());
    if mine != theirs {
        if settings.visibility != Visibility::All {
            return Err(format!(
                "`{target}` belongs to agent `{theirs}`; this session (agent `{mine}`) sees only its own agent's sessions (tools.sessions.visibility = \"{}\"): set tools.sessions.visibility = \"all\" and tools.sessions.agent_to_agent to allow both agents",
                settings.visibility.as_str()
            ));
        }
        return agent_to_agent(settings, mine, theirs);
    }
    match settings.visibility {
        Visibility::Agent | Visibility::All => Ok(()),
        Visibility::User if viewer.is_operator() => Ok(()),
        Visibility::User => {
            let (channel, sender) = (viewer.session.channel(), viewer.sender);
            let ok = sender.is_some_and(|s| {
                let me = participant(channel, s);
                participants.contains(&me) || owned_by_key(target, channel, s)
            });
            if ok {
                Ok(())
            } else if sender.is_none() {
                Err(format!(
                    "this turn has no chat user (the gateway woke it), so it sees only its own session, not `{target}` (tools.sessions.visibility = \"user\"); set tools.sessions.visibility = \"agent\" to let every session of the agent see the others"
                ))
            } else {
                Err(format!(
                    "`{target}` is not one of this user's sessions: with tools.sessions.visibility = \"user\" (the default) a user sees only sessions they have spoken in; set tools.sessions.visibility = \"agent\" to share every session of the agent"
                ))
            }
        }
    }
}

/// Whether agent `from` may reach agent `to`'s sessions under `tools.sessions.agent_to_agent`.
///
/// # Errors
/// Why not, naming the setting.
pub fn agent_to_agent(settings: &SessionsSettings, from: &str, to: &str) -> Result<(), Denied> {
    if !settings.agent_to_agent {
        return Err(format!(
            "agent `{from}` may not reach agent `{to}`'s sessions: set tools.sessions.agent_to_agent = {{ enabled = true, allow = [\"{from}\", \"{to}\"] }}"
        ));
    }
    let listed = |a: &str| settings.agent_allow.iter().any(|p| p == "*" || p == a);
    for a in [from, to] {
        if !listed(a) {
            return Err(format!(
                "agent `{a}` is not in tools.sessions.agent_to_agent.allow; add it (both the sending and the receiving agent must be listed)"
            ));
        }
    }
    Ok(())
}

/// The event id of a `sessions_send` hand-off: the calling session, `origin` (the turn it
/// answers, `turn:<event id>`, or outside a turn the tool call, `call:<id>`) and a digest of the
/// target and the message. A turn resumed after a crash answers the same event, so a model
/// repeating the hand-off then (under a new call id: the gateway renames reused ones) is
/// recognised by the journal and delivers nothing more.
pub fn send_event_id(
    from: &SessionKey,
    origin: &str,
    target: &SessionKey,
    message: &str,
) -> String {
    let mut call: String = origin
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if call.len() > MAX_CALL_ID_BYTES {
        let mut end = MAX_CALL_ID_BYTES;
        while !call.is_char_boundary(end) {
            end -= 1;
        }
        call.truncate(end);
    }
    let mut h = Fnv::default();
    h.write(target.as_str().as_bytes());
    h.write(&[0]);
    h.write(message.as_bytes());
    format!("{SEND_PREFIX}{from}#{call}#{:016x}", h.0)
}

/// FNV-1a, 64 bits: a stable digest (not a defence; the call id and sender are the key).
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn k(s: &str) -> SessionKey {
        SessionKey::parse(s).unwrap()
    }

    fn settings(v: Visibility) -> SessionsSettings {
        SessionsSettings {
            visibility: v,
            ..SessionsSettings::default()
        }
    }

    #[test]
    fn by_default_a_user_sees_only_the_sessions_they_spoke_in() {
        let s = settings(Visibility::User);
        let me = k("telegram:100");
        let alice = Viewer {
            session: &me,
            sender: Some("100"),
        };
        // Their own session, their DM by key, their per-user session in a group.
        assert!(may_see(&s, alice, &me, &[]).is_ok());
        assert!(may_see(&s, alice, &k("telegram:-5:-:u100"), &[]).is_ok());
        // A group they spoke in.
        assert!(may_see(&s, alice, &k("telegram:-5"), &["telegram:100".into()]).is_ok());
        // Bob's DM, Bob's per-user session, a group only Bob spoke in.
        let e = may_see(&s, alice, &k("telegram:200"), &["telegram:200".into()]).unwrap_err();
        assert!(e.contains("tools.sessions.visibility"), "{e}");
        assert!(may_see(&s, alice, &k("telegram:-5:-:u200"), &[]).is_err());
        assert!(may_see(&s, alice, &k("telegram:-6"), &["telegram:200".into()]).is_err());
        // The same id on another channel is another user.
        assert!(may_see(&s, alice, &k("slack:100"), &["slack:100".into()]).is_err());
        // A turn the gateway woke (no user) sees only itself; the operator sees all.
        let woke = Viewer {
            session: &me,
            sender: None,
        };
        assert!(may_see(&s, woke, &me, &[]).is_ok());
        assert!(may_see(&s, woke, &k("telegram:200"), &[]).is_err());
        let cli = k("cli:default");
        let op = Viewer {
            session: &cli,
            sender: None,
        };
        assert!(may_see(&s, op, &k("telegram:200"), &[]).is_ok());
    }

    #[test]
    fn agent_visibility_shares_the_agent_and_all_needs_agent_to_agent() {
        let me = k("telegram:100");
        let v = Viewer {
            session: &me,
            sender: Some("100"),
        };
        let bob = k("telegram:200");
        assert!(may_see(&settings(Visibility::Agent), v, &bob, &[]).is_ok());
        let other = k("@work:telegram:200");
        let e = may_see(&settings(Visibility::Agent), v, &other, &[]).unwrap_err();
        assert!(e.contains("visibility = \"all\""), "{e}");
        let e = may_see(&settings(Visibility::All), v, &other, &[]).unwrap_err();
        assert!(e.contains("agent_to_agent"), "{e}");
        let mut s = settings(Visibility::All);
        s.agent_to_agent = true;
        s.agent_allow = vec!["work".into()];
        let e = may_see(&s, v, &other, &[]).unwrap_err();
        assert!(e.contains("`main`"), "both sides must be listed: {e}");
        s.agent_allow = vec!["work".into(), "main".into()];
        assert!(may_see(&s, v, &other, &[]).is_ok());
        s.agent_allow = vec!["*".into()];
        assert!(may_see(&s, v, &other, &[]).is_ok());
        // Subagent sessions are the subagents tool's.
        assert!(may_see(&s, v, &k("subagent:t1"), &[]).is_err());
    }

    #[test]
    fn settings_are_checked() {
        let f: SessionsFile = serde_json::from_value(serde_json::json!({})).unwrap();
        assert_eq!(f.resolve().unwrap(), SessionsSettings::default());
        let f: SessionsFile =
            serde_json::from_value(serde_json::json!({"visibility": "everyone"})).unwrap();
        assert_eq!(f.resolve().unwrap_err().key, "tools.sessions.visibility");
        let f: SessionsFile =
            serde_json::from_value(serde_json::json!({"agent_to_agent": {"enabled": true}}))
                .unwrap();
        assert_eq!(
            f.resolve().unwrap_err().key,
            "tools.sessions.agent_to_agent.allow"
        );
        let f: SessionsFile = serde_json::from_value(
            serde_json::json!({"agent_to_agent": {"enabled": true, "allow": ["a:b"]}}),
        )
        .unwrap();
        assert!(f.resolve().is_err());
    }

    #[test]
    fn the_event_id_is_the_sender_and_the_call_and_stable() {
        let from = k("telegram:100");
        let to = k("telegram:200");
        let a = send_event_id(&from, "call_1", &to, "hello");
        assert!(a.starts_with("sessions:telegram:100#call_1#"), "{a}");
        assert!(crate::types::session_key::is_reserved_event_id(&a));
        assert_eq!(a, send_event_id(&from, "call_1", &to, "hello"));
        assert_ne!(a, send_event_id(&from, "call_2", &to, "hello"));
        assert_ne!(a, send_event_id(&from, "call_1", &to, "hello again"));
        assert_ne!(a, send_event_id(&k("telegram:300"), "call_1", &to, "hello"));
        let long = send_event_id(&from, &"é".repeat(200), &to, "x");
        assert!(long.len() < 200 + 64, "{}", long.len());
        assert!(!send_event_id(&from, "a\u{7}b", &to, "x").contains('\u{7}'));
    }
}
