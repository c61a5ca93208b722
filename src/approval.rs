//! Approvals asked of the user through their own chat (exec `mode = "ask"`, seed 004 §4).
//!
//! A tool asks [`Approvals::request`]: the question goes to the session's chat as a durable
//! message ("reply `/approve ID`, `/approve ID always` or `/deny ID`"), and the call waits. The
//! answer comes back as an ordinary inbound message that the session handles as a command at
//! once, even while the turn is running, through [`Approvals::answer`]. Only the session that
//! asked can answer (a stranger who learns the id cannot approve). The caller bounds the wait
//! (2 minutes by default) and treats silence as a denial; a pending request dropped for any
//! reason (timeout, `/stop`) is forgotten.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use clawft_channel_core::{ChannelId, ChatId, ThreadId};
use tokio::sync::oneshot;

use crate::tools::message::MessageSink;
use crate::types::SessionKey;

/// `/approve` or `/deny` for a request that is not pending in this chat.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("No pending approval `{0}` in this chat (it may have timed out).")]
pub struct NotPending(pub String);

/// The user's answer (the chat commands' type).
pub use clawft_channel_core::command::Decision;

struct Pending {
    session: SessionKey,
    tx: oneshot::Sender<Decision>,
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
}

/// Pending approval requests, shared by the tools that ask and the sessions that answer.
pub struct Approvals {
    sink: Arc<dyn MessageSink>,
    pending: Mutex<HashMap<String, Pending>>,
}

/// Removes a request when its asker stops waiting.
struct Forget<'a>(&'a Approvals, String);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.lock().remove(&self.1);
    }
}

impl Approvals {
    /// Approvals whose questions go out through `sink`.
    pub fn new(sink: Arc<dyn MessageSink>) -> Self {
        Self {
            sink,
            pending: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
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
                tx,
            },
        );
        let _forget = Forget(self, id.clone());
        let (channel, chat, thread) = session.route();
        if chat.is_empty() {
            return Decision::Deny;
        }
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
                },
            },
        );
        if let Err(e) = self.sink.send(msg) {
            tracing::warn!(error = %e, "could not ask for approval; denying");
            return Decision::Deny;
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
        let mut g = self.lock();
        if g.get(id).is_none_or(|p| p.session != *session) {
            return Err(NotPending(id.to_string()));
        }
        let p = g.remove(id).ok_or_else(|| NotPending(id.to_string()))?;
        let _ = p.tx.send(d);
        Ok(match d {
            Decision::Once => format!("Approved `{id}` once."),
            Decision::Always => format!("Approved `{id}`; this command will not be asked again."),
            Decision::Deny => format!("Denied `{id}`."),
        })
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
