//! Approvals asked of the user through their own chat (exec `mode = "ask"`, seed 004 §4).
//!
//! A tool asks [`Approvals::request`]: the question goes to the session's chat as a durable
//! message ("reply `/approve ID`, `/approve ID always` or `/deny ID`"), and the call waits. The
//! answer comes back as an ordinary inbound message that the session handles as a command at
//! once, even while the turn is running, through [`Approvals::answer`]. Only the session that
//! asked can answer (a stranger who learns the id cannot approve). The caller bounds the wait
//! (2 minutes by default) and treats silence as a denial; a pending request dropped for any
//! reason (timeout, `/stop`) is kept as expired, for `weft approvals list`.
//!
//! The operator may answer any pending request from outside the chat ([`Approvals::answer_any`]:
//! `weft approvals approve ID`, the admin API). A question still queued for delivery when the
//! daemon stopped is never asked again after a restart: nobody is waiting for its answer any
//! more ([`Approvals::expired_at_start`]).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use clawft_channel_core::{ChannelId, ChatId, Surface, ThreadId};
use tokio::sync::oneshot;

use crate::tools::message::MessageSink;
use crate::types::MutexExt;
use crate::types::SessionKey;

/// `/approve` or `/deny` for a request that is not pending in this chat.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("No pending approval `{0}` in this chat (it may have timed out).")]
pub struct NotPending(pub String);

/// Why the operator's answer was not given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// No gateway asks it.
    #[error(transparent)]
    NotPending(NotPending),
    /// It waits on another gateway of the cluster, which the answer could not reach.
    #[error("{0}")]
    Cluster(String),
}

/// The user's answer (the chat commands' type).
pub use clawft_channel_core::command::Decision;

struct Pending {
    session: SessionKey,
    command: String,
    asked_ms: u64,
    tx: oneshot::Sender<Decision>,
}

/// Approvals answered or expired that [`Approvals::list`] still shows (the most recent 100).
const RECENT_APPROVALS: usize = 100;

/// Where an approval stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    /// Asked; the tool call waits for the answer.
    Pending,
    /// Approved once.
    Approved,
    /// Approved, and not asked again for this command in this session.
    ApprovedAlways,
    /// Denied.
    Denied,
    /// Nobody answered in time, the turn was stopped, or the daemon restarted meanwhile: the
    /// call was denied and cannot be answered any more.
    Expired,
}

impl ApprovalState {
    /// As shown to people: `pending`, `approved`, `approved always`, `denied`, `expired`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::ApprovedAlways => "approved always",
            Self::Denied => "denied",
            Self::Expired => "expired",
        }
    }
}

/// One approval as `weft approvals list` and the admin API show it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ApprovalInfo {
    /// The gateway where it waits, when another gateway of the cluster asked it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The id the user answers with.
    pub id: String,
    /// The session (chat) that asked.
    pub session: String,
    /// What it asked to run.
    pub command: String,
    /// When it was asked, ms since the Unix epoch (0: before the last restart).
    pub asked_ms: u64,
    /// Where it stands.
    pub state: ApprovalState,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[async_trait::async_trait]
impl crate::tools::shell_policy::Approver for Approvals {
    async fn approve(
        &self,
        session: &SessionKey,
        command: &str,
    ) -> crate::tools::shell_policy::Approval {
        use crate::tools::shell_policy::Approval;
        match self.request(session, command).await {
            Decision::Once => Approval::AllowOnce,
            Decision::Always => Approval::AllowAlways,
            Decision::Deny => Approval::Deny,
        }
    }

    async fn always_allowed(&self, session: &SessionKey, command: &str) -> bool {
        match self.shared.get() {
            Some(sh) => sh.always(session.as_str(), command).await,
            None => false,
        }
    }

    fn remember_always(&self, session: &SessionKey, command: &str) {
        if let Some(sh) = self.shared.get() {
            sh.remember_always(session.as_str(), command);
        }
    }
}

/// Approvals shared with the other gateways of a cluster: questions asked here are listed and
/// answered on every gateway, and "always" decisions follow the session to another gateway.
#[async_trait::async_trait]
pub trait SharedApprovals: Send + Sync {
    /// Question `info` waits here. Must not block.
    fn asked(&self, info: &ApprovalInfo);
    /// Question `id` no longer waits here. Must not block.
    fn settled(&self, id: &str);
    /// The questions waiting on the other gateways.
    ///
    /// # Errors
    /// They cannot be read now.
    fn others(&self) -> Result<Vec<ApprovalInfo>, String>;
    /// Answer question `id`, waiting on another gateway: the gateway that took the answer, or
    /// `None` when no gateway asks it. Blocks until the asking gateway took it.
    ///
    /// # Errors
    /// The answer could not be given (the cluster unreachable, the asking gateway silent).
    fn forward(&self, id: &str, d: Decision) -> Result<Option<String>, String>;
    /// Whether `command` was always allowed in `session` (on any gateway).
    async fn always(&self, session: &str, command: &str) -> bool;
    /// Remember that `command` is always allowed in `session`. Must not block.
    fn remember_always(&self, session: &str, command: &str);
}

/// A decision as the cluster's records spell it.
pub fn decision_str(d: Decision) -> &'static str {
    match d {
        Decision::Once => "once",
        Decision::Always => "always",
        Decision::Deny => "deny",
    }
}

/// [`decision_str`] read back.
pub fn parse_decision(s: &str) -> Option<Decision> {
    match s {
        "once" => Some(Decision::Once),
        "always" => Some(Decision::Always),
        "deny" => Some(Decision::Deny),
        _ => None,
    }
}

/// Pending approval requests, shared by the tools that ask and the sessions that answer.
pub struct Approvals {
    sink: Arc<dyn MessageSink>,
    pending: Mutex<HashMap<String, Pending>>,
    /// Answered and expired requests, newest last.
    recent: Mutex<VecDeque<ApprovalInfo>>,
    /// The other gateways of the cluster (cluster mode).
    shared: std::sync::OnceLock<Arc<dyn SharedApprovals>>,
}

/// Removes a request when its asker stops waiting; unanswered, it is kept as expired.
struct Forget<'a>(&'a Approvals, String);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        let gone = self.0.lock().remove(&self.1);
        if let Some(p) = gone {
            self.0.remember(&self.1, &p, ApprovalState::Expired);
            if let Some(sh) = self.0.shared.get() {
                sh.settled(&self.1);
            }
        }
    }
}

impl Approvals {
    /// Approvals whose questions go out through `sink`.
    pub fn new(sink: Arc<dyn MessageSink>) -> Self {
        Self {
            sink,
            pending: Mutex::new(HashMap::new()),
            recent: Mutex::new(VecDeque::new()),
            shared: std::sync::OnceLock::new(),
        }
    }

    /// Share the questions and "always" decisions with the other gateways of the cluster
    /// (the first call wins).
    pub fn set_shared(&self, shared: Arc<dyn SharedApprovals>) {
        let _ = self.shared.set(shared);
    }

    fn remember(&self, id: &str, p: &Pending, state: ApprovalState) {
        self.push_recent(ApprovalInfo {
            node: None,
            id: id.to_string(),
            session: p.session.to_string(),
            command: p.command.clone(),
            asked_ms: p.asked_ms,
            state,
        });
    }

    fn push_recent(&self, info: ApprovalInfo) {
        let mut r = self.recent.locked();
        if r.len() >= RECENT_APPROVALS {
            r.pop_front();
        }
        r.push_back(info);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        self.pending.locked()
    }

    /// Ask the user of `session` whether `what` may happen; waits for the answer. A question
    /// that cannot be sent is a denial.
    pub async fn request(&self, session: &SessionKey, what: &str) -> Decision {
        if crate::types::session_key::subagent_task_id(session).is_some() {
            // A subagent has no chat to ask in: nobody could answer.
            tracing::info!(session = %session, "a subagent cannot ask for approval; denying");
            return Decision::Deny;
        }
        let id = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
        let (tx, rx) = oneshot::channel();
        self.lock().insert(
            id.clone(),
            Pending {
                session: session.clone(),
                command: what.to_string(),
                asked_ms: now_ms(),
                tx,
            },
        );
        let _forget = Forget(self, id.clone());
        let (channel, chat, thread) = session.route();
        if chat.is_empty() {
            return Decision::Deny;
        }
        // The terminal through a gateway: no `cli` channel runs there; the terminal's stream
        // on the HTTP API carries the question.
        let terminal = Surface::of(channel) == Some(Surface::Terminal)
            && !self
                .sink
                .channels()
                .iter()
                .any(|c| c == Surface::Terminal.id());
        let channel = if terminal {
            Surface::Http.id()
        } else {
            channel
        };
        let msg = clawft_channel_core::OutboundMessage::proactive_body(
            ChannelId::new(channel),
            ChatId::new(chat),
            thread.map(ThreadId::new),
            clawft_channel_core::OutboundBody::Approval {
                text: format!(
                    "Approval needed to run:\n```\n{what}\n```\nReply `/approve {id}` to run it once, `/approve {id} always` to stop asking for this command, or `/deny {id}`."
                ),
                ask: clawft_channel_core::ApprovalAsk {
                    approval_id: id.clone(),
                    command: what.to_string(),
                    terminal,
                },
            },
        );
        if let Err(e) = self.sink.send(msg) {
            tracing::warn!(error = %e, "could not ask for approval; denying");
            return Decision::Deny;
        }
        if let Some(sh) = self.shared.get() {
            sh.asked(&ApprovalInfo {
                node: None,
                id: id.clone(),
                session: session.to_string(),
                command: what.to_string(),
                asked_ms: now_ms(),
                state: ApprovalState::Pending,
            });
        }
        rx.await.unwrap_or(Decision::Deny)
    }

    /// Answer request `id` from `session`. Returns the text to reply to the user.
    ///
    /// # Errors
    /// No such pending request for this session.
    pub fn answer(
        &self,
        session: &SessionKey,
        id: &str,
        d: Decision,
    ) -> Result<String, NotPending> {
        self.resolve(Some(session), id, d)
    }

    /// Answer request `id` whichever session asked (the operator: `weft approvals`, the admin
    /// API). Returns the text to show.
    ///
    /// # Errors
    /// No such pending request.
    pub fn answer_any(&self, id: &str, d: Decision) -> Result<String, NotPending> {
        self.resolve(None, id, d)
    }

    /// [`Approvals::answer_any`], or, when the question waits on another gateway of the
    /// cluster, answered there (blocks until that gateway took the answer).
    ///
    /// # Errors
    /// No gateway asks it, or the cluster could not carry the answer.
    pub fn answer_anywhere(&self, id: &str, d: Decision) -> Result<String, AnswerError> {
        match (self.resolve(None, id, d), self.shared.get()) {
            (Ok(text), _) => Ok(text),
            (Err(e), None) => Err(AnswerError::NotPending(e)),
            (Err(e), Some(sh)) => match sh.forward(id, d).map_err(AnswerError::Cluster)? {
                Some(node) => Ok(format!(
                    "{} (asked on node {node})",
                    match d {
                        Decision::Once => format!("Approved `{id}` once."),
                        Decision::Always =>
                            format!("Approved `{id}`; this command will not be asked again."),
                        Decision::Deny => format!("Denied `{id}`."),
                    }
                )),
                None => Err(AnswerError::NotPending(e)),
            },
        }
    }

    /// An answer the cluster brought for question `id` (given on another gateway): whether it
    /// was waiting here.
    pub fn answer_from_cluster(&self, id: &str, decision: &str) -> bool {
        parse_decision(decision).is_some_and(|d| self.resolve(None, id, d).is_ok())
    }

    /// [`Approvals::list`] plus the questions waiting on the other gateways of the cluster
    /// (those with `node`), pending ones first.
    pub fn list_all(&self) -> Vec<ApprovalInfo> {
        let mut out = self.list();
        if let Some(sh) = self.shared.get() {
            match sh.others() {
                Ok(mut others) => {
                    let at = out
                        .iter()
                        .position(|a| a.state != ApprovalState::Pending)
                        .unwrap_or(out.len());
                    others.sort_by_key(|a| a.asked_ms);
                    out.splice(at..at, others);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the other gateways' approvals cannot be listed")
                }
            }
        }
        out
    }

    fn resolve(
        &self,
        session: Option<&SessionKey>,
        id: &str,
        d: Decision,
    ) -> Result<String, NotPending> {
        let p = {
            let mut g = self.lock();
            if g.get(id)
                .is_none_or(|p| session.is_some_and(|s| p.session != *s))
            {
                return Err(NotPending(id.to_string()));
            }
            g.remove(id).ok_or_else(|| NotPending(id.to_string()))?
        };
        let state = match d {
            Decision::Once => ApprovalState::Approved,
            Decision::Always => ApprovalState::ApprovedAlways,
            Decision::Deny => ApprovalState::Denied,
        };
        self.remember(id, &p, state);
        if let Some(sh) = self.shared.get() {
            sh.settled(id);
        }
        let _ = p.tx.send(d);
        Ok(match d {
            Decision::Once => format!("Approved `{id}` once."),
            Decision::Always => format!("Approved `{id}`; this command will not be asked again."),
            Decision::Deny => format!("Denied `{id}`."),
        })
    }

    /// Pending requests (oldest first), then answered and expired ones (newest first).
    pub fn list(&self) -> Vec<ApprovalInfo> {
        let mut out: Vec<ApprovalInfo> = self
            .lock()
            .iter()
            .map(|(id, p)| ApprovalInfo {
                node: None,
                id: id.clone(),
                session: p.session.to_string(),
                command: p.command.clone(),
                asked_ms: p.asked_ms,
                state: ApprovalState::Pending,
            })
            .collect();
        out.sort_by_key(|a| a.asked_ms);
        out.extend(self.recent.locked().iter().rev().cloned());
        out
    }

    /// A question found undelivered at start-up (`msg`, if it is one): nobody waits for its
    /// answer any more, so it is kept as expired instead of being asked. Returns whether `msg`
    /// was such a question.
    pub fn expired_at_start(&self, msg: &clawft_channel_core::OutboundMessage) -> bool {
        let (None, clawft_channel_core::OutboundBody::Approval { ask, .. }) =
            (&msg.in_reply_to, &msg.body)
        else {
            return false;
        };
        self.push_recent(ApprovalInfo {
            node: None,
            id: ask.approval_id.clone(),
            session: format!("{}:{}", msg.channel.as_str(), msg.chat.as_str()),
            command: ask.command.clone(),
            asked_ms: 0,
            state: ApprovalState::Expired,
        });
        true
    }

    /// Number of requests waiting (for status and tests).
    pub fn pending(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::time::Duration;

    use super::*;
    use clawft_channel_core::OutboundMessage;

    #[derive(Default)]
    struct Sink(Mutex<Vec<OutboundMessage>>);
    impl MessageSink for Sink {
        fn channels(&self) -> Vec<String> {
            vec!["telegram".into()]
        }
        fn send(&self, msg: OutboundMessage) -> Result<(), crate::store::StoreError> {
            self.0.lock().unwrap().push(msg);
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_subagent_is_denied_at_once_without_asking_anyone() {
        let sink = Arc::new(Sink::default());
        let a = Approvals::new(sink.clone());
        let sub = SessionKey::parse("subagent:0192abc").unwrap();
        let d = tokio::time::timeout(Duration::from_secs(1), a.request(&sub, "rm x"))
            .await
            .unwrap();
        assert_eq!(d, Decision::Deny);
        assert!(sink.0.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn only_the_asking_session_can_answer_and_drops_forget() {
        let sink = Arc::new(Sink::default());
        let a = Arc::new(Approvals::new(sink.clone()));
        let me = SessionKey::parse("telegram:1").unwrap();
        let other = SessionKey::parse("telegram:2").unwrap();
        let (a2, me2) = (a.clone(), me.clone());
        let waiting = tokio::spawn(async move { a2.request(&me2, "rm -r build").await });
        let msg = loop {
            if let Some(m) = sink.0.lock().unwrap().first().cloned() {
                break m;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert_eq!(msg.chat.as_str(), "1");
        let id = match &msg.body {
            clawft_channel_core::OutboundBody::Approval { ask, .. } => ask.approval_id.clone(),
            other => panic!("not an approval question: {other:?}"),
        };
        assert!(msg.text().contains("rm -r build") && msg.text().contains(&id));
        assert!(a.answer(&other, &id, Decision::Once).is_err());
        assert!(a.answer(&me, "nope", Decision::Once).is_err());
        a.answer(&me, &id, Decision::Always).unwrap();
        assert_eq!(waiting.await.unwrap(), Decision::Always);
        assert_eq!(a.pending(), 0);

        // A caller that gives up leaves nothing behind.
        let r = tokio::time::timeout(Duration::from_millis(20), a.request(&me, "x")).await;
        assert!(r.is_err());
        assert_eq!(a.pending(), 0);
    }
}
