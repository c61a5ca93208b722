//! Approvals asked of the user through their own chat (exec `mode = "ask"`, seed 004 §4).
//!
//! A tool asks [`Approvals::request`]: the question goes to the session's chat as a durable
//! message ("reply `/approve ID`, `/approve ID always` or `/deny ID`"), and the call waits. The
//! answer comes back as an ordinary inbound message that the session handles as a command at
//! once, even while the turn is running, through [`Approvals::answer`]. Only the session that
//! asked can answer (a stranger who learns the id cannot approve), and under `tools.exec.approvers
//! = "operator"` (the default for commands on nodes) a chat user may only deny, unless listed in
//! `tools.exec.approver_ids`; who may approve is judged when the answer arrives, by the rules in
//! force then ([`Approvals::set_rules`], replaced at each reload). The caller bounds the wait
//! (2 minutes by default) and treats silence as a denial; a pending request dropped for any
//! reason (timeout, `/stop`) is kept as expired, for `weft approvals list`.
//!
//! The operator may answer any pending request from outside the chat ([`Approvals::answer_any`]:
//! `weft approvals approve ID`, the admin API). A question still queued for delivery when the
//! daemon stopped is never asked again after a restart: nobody is waiting for its answer any
//! more ([`Approvals::expired_at_start`]).
//!
//! In cluster mode the questions, the answers given on other gateways and the "always"
//! decisions are a piece of shared state ([`SharedApprovals`], bucket [`APPROVAL_BUCKET`]),
//! given to [`Approvals::sharing`] when it is made.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use clawft_channel_core::{ChannelId, ChatId, Surface, ThreadId};
use tokio::sync::oneshot;

use crate::store::shared::{
    self, Bucket, Payload, Replicated, Shared, SharedError, SharedErrorKind, Watched,
};
use crate::tools::exec::settings::{ApproverRules, Approvers};
use crate::tools::message::MessageSink;
use crate::tools::shell_policy::RunsOn;
use crate::types::MutexExt;
use crate::types::SessionKey;

/// `/approve` or `/deny` for a request that is not pending in this chat.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("No pending approval `{0}` in this chat (it may have timed out).")]
pub struct NotPending(pub String);

/// Why a chat user's `/approve` or `/deny` changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// No such question waits for this chat (or it expired).
    #[error(transparent)]
    NotPending(NotPending),
    /// Only the operator (or a listed approver) may approve it: `tools.exec.approvers =
    /// "operator"`, the default for commands on nodes. The question still waits.
    #[error("Only the operator can approve `{0}`: ask them to approve it in the control UI or with `weft approvals approve {0}`. Nothing was run; you can still `/deny {0}`.")]
    OperatorOnly(String),
}

impl Refused {
    /// Which refusal it is.
    pub fn kind(&self) -> RefusedKind {
        match self {
            Self::NotPending(_) => RefusedKind::NotPending,
            Self::OperatorOnly(_) => RefusedKind::OperatorOnly,
        }
    }
}

/// [`Refused`] without its details.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusedKind {
    /// See [`Refused::NotPending`].
    NotPending,
    /// See [`Refused::OperatorOnly`].
    OperatorOnly,
}

/// Who gives an answer.
enum Answerer<'a> {
    /// The operator (control UI, CLI, admin API) or another gateway of the cluster, which
    /// only forwards what an operator answered there.
    Operator,
    /// A chat user: the session they wrote in and who they are ("channel:user id").
    Chat {
        session: &'a SessionKey,
        sender: &'a str,
    },
}

/// Why the operator's answer was not given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// No gateway asks it.
    #[error(transparent)]
    NotPending(NotPending),
    /// It waits on another gateway of the cluster, which the answer could not reach.
    #[error("{0}")]
    Cluster(SharedError),
}

/// The user's answer (the chat commands' type).
pub use clawft_channel_core::command::Decision;

struct Pending {
    session: SessionKey,
    command: String,
    /// Where the command would run: decides who may approve it, read when the answer arrives.
    on: RunsOn,
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
    /// Who may answer it (pending ones), by the rules in force when it was listed: for a
    /// question of another gateway, by that gateway's rules when it asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub may_answer: Option<MayAnswer>,
}

/// Who may answer a pending approval (`tools.exec.approvers` and `approver_ids`, as the
/// security guide's "Who may approve" tells). Anyone in the asking chat may always deny.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MayAnswer {
    /// `chat`: anyone in the asking chat, and the operator; `operator`: only the operator
    /// (control UI, `weft approvals`, admin API, local terminal) and the listed users.
    pub approvers: Approvers,
    /// Chat users (`channel:user id`) who may approve from any chat.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approver_ids: Vec<String>,
    /// The command would run on a paired node (whose default is `operator`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub on_node: bool,
}

impl MayAnswer {
    /// Who may answer a command that runs `on`, by `rules`.
    pub fn of(rules: &ApproverRules, on: RunsOn) -> Self {
        Self {
            approvers: rules.for_run(on),
            approver_ids: rules.approver_ids.clone(),
            on_node: on == RunsOn::Node,
        }
    }
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
        on: RunsOn,
    ) -> crate::tools::shell_policy::Approval {
        use crate::tools::shell_policy::Approval;
        match self.request_on(session, command, on).await {
            Decision::Once => Approval::AllowOnce,
            Decision::Always => Approval::AllowAlways,
            Decision::Deny => Approval::Deny,
        }
    }

    async fn always_allowed(&self, session: &SessionKey, command: &str) -> bool {
        match &self.shared {
            Some(sh) => sh.always(session.as_str(), command).await,
            None => false,
        }
    }

    fn remember_always(&self, session: &SessionKey, command: &str) {
        if let Some(sh) = &self.shared {
            sh.remember_always(session.as_str(), command);
        }
    }
}

/// The bucket of the approvals shared with the other gateways of a cluster (entries kept 90
/// days, how long an "always" decision lasts after it was given):
/// - `ask.<id>` → a question waiting on a gateway ([`Asked`]), published by it when asked and
///   deleted when answered or given up, so every gateway lists it;
/// - `answer.<id>` → `once`, `always` or `deny`: an answer given on another gateway; the asking
///   gateway watches these keys, hands the answer to the waiting call and deletes both keys;
/// - `always.<session>.<digest of the command>` → the command: an "always" decision, read by
///   whichever gateway runs the session next.
pub const APPROVAL_BUCKET: Bucket = Bucket {
    name: "weft_approvals",
    max_age: std::time::Duration::from_secs(90 * 24 * 3600),
    description: "weft approvals",
    wait: std::time::Duration::from_secs(2),
};

/// How long an answer given on another gateway waits for the asking gateway to take it.
const TAKEN_WAIT: std::time::Duration = std::time::Duration::from_secs(6);

/// A question waiting on a gateway, as the cluster holds it: `{"node": …, "record": "<the
/// approval as JSON>"}`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Asked {
    /// The gateway where it waits.
    pub node: String,
    /// The approval (a JSON text inside the record, as the first version wrote it).
    #[serde(with = "json_text")]
    pub record: ApprovalInfo,
}

impl Payload for Asked {}

/// A value kept as a JSON text inside JSON.
mod json_text {
    use serde::de::{DeserializeOwned, Error as _};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<T: Serialize, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        let text = serde_json::to_string(v).map_err(serde::ser::Error::custom)?;
        s.serialize_str(&text)
    }

    pub fn deserialize<'de, T: DeserializeOwned, D: Deserializer<'de>>(
        d: D,
    ) -> Result<T, D::Error> {
        let text = String::deserialize(d)?;
        serde_json::from_str(&text).map_err(D::Error::custom)
    }
}

/// An answer given on another gateway, as the cluster holds it: `once`, `always` or `deny`
/// (bare text).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
struct Answer(#[serde(with = "decision_text")] Decision);

mod decision_text {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    use super::Decision;

    pub fn serialize<S: Serializer>(d: &Decision, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(super::decision_str(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Decision, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_decision(&text)
            .ok_or_else(|| D::Error::custom(format!("not a decision: {text}")))
    }
}

impl Payload for Answer {
    fn encode(&self) -> Result<bytes::Bytes, SharedError> {
        Ok(bytes::Bytes::from_static(decision_str(self.0).as_bytes()))
    }

    fn decode(b: &[u8]) -> Result<Self, SharedError> {
        std::str::from_utf8(b)
            .ok()
            .and_then(parse_decision)
            .map(Answer)
            .ok_or_else(|| SharedError::new(SharedErrorKind::Invalid, "not a decision"))
    }
}

/// Approvals shared with the other gateways of a cluster: questions asked here are listed and
/// answered on every gateway, and "always" decisions follow the session to another gateway.
/// Cheap to clone.
#[derive(Clone)]
pub struct SharedApprovals {
    asks: Shared<Asked>,
    answers: Shared<Answer>,
    always: Shared<String>,
}

/// The key parts of the "always" decision for `command` in `session`.
fn always_parts(session: &str, command: &str) -> [String; 2] {
    let d = ring::digest::digest(&ring::digest::SHA256, command.as_bytes());
    let hex: String = d
        .as_ref()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect();
    [session.to_string(), hex]
}

impl SharedApprovals {
    /// The approvals kept through `seam`.
    pub fn new(seam: Arc<dyn Replicated>) -> Self {
        Self {
            asks: Shared::new(seam.clone(), APPROVAL_BUCKET, "ask"),
            answers: Shared::new(seam.clone(), APPROVAL_BUCKET, "answer"),
            always: Shared::new(seam, APPROVAL_BUCKET, "always"),
        }
    }

    /// Question `info` waits here (published in the background).
    fn asked(&self, info: &ApprovalInfo) {
        let asks = self.asks.clone();
        let asked = Asked {
            node: asks.node().to_string(),
            record: info.clone(),
        };
        shared::in_background("approval asked", move || {
            let (asks, asked) = (asks.clone(), asked.clone());
            async move { asks.put(&[&asked.record.id], &asked).await.map(drop) }
        });
    }

    /// Question `id` no longer waits here (dropped in the background).
    fn settled(&self, id: &str) {
        let (asks, answers, id) = (self.asks.clone(), self.answers.clone(), id.to_string());
        shared::in_background("approval settled", move || {
            let (asks, answers, id) = (asks.clone(), answers.clone(), id.clone());
            async move {
                asks.delete(&[&id]).await?;
                answers.purge(&[&id]).await
            }
        });
    }

    /// The questions waiting on the other gateways. Blocking.
    fn others(&self) -> Result<Vec<ApprovalInfo>, SharedError> {
        let me = self.asks.node().to_string();
        shared::wait(async {
            let mut out = Vec::new();
            for k in self.asks.keys().await? {
                let parts: Vec<&str> = k.iter().map(String::as_str).collect();
                match self.asks.get(&parts).await {
                    Ok(Some(v)) if v.value.node != me => {
                        let mut a = v.value.record;
                        a.node = Some(v.value.node);
                        out.push(a);
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == SharedErrorKind::Invalid => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(out)
        })
    }

    /// Answer question `id`, waiting on another gateway: the gateway that took the answer, or
    /// `None` when no gateway asks it. Blocks until the asking gateway took it.
    fn forward(&self, id: &str, d: Decision) -> Result<Option<String>, SharedError> {
        let Some(asked) = shared::wait(self.asks.get(&[id]))? else {
            return Ok(None);
        };
        let node = asked.value.node;
        shared::wait(self.answers.put(&[id], &Answer(d)))?;
        let start = std::time::Instant::now();
        while start.elapsed() < TAKEN_WAIT {
            if shared::wait(self.asks.get(&[id]))?.is_none() {
                return Ok(Some(node));
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = shared::wait(self.answers.purge(&[id]));
        Err(SharedError::unavailable(format!(
            "node {node}, where the question waits, did not take the answer in time"
        )))
    }

    /// Hand the answers given on other gateways to `approvals` while it lives (spawned on the
    /// current runtime).
    fn watch_answers(&self, approvals: std::sync::Weak<Approvals>) {
        let mut watch = self.answers.watch();
        tokio::spawn(async move {
            while let Some(w) = watch.next().await {
                let Watched::Put { key, value, .. } = w else {
                    continue;
                };
                let Some(a) = approvals.upgrade() else {
                    return;
                };
                let [id] = key.as_slice() else {
                    continue;
                };
                if a.answer_any(id, value.0).is_ok() {
                    tracing::info!(
                        id,
                        decision = decision_str(value.0),
                        "cluster: approval answered on another node"
                    );
                }
            }
        });
    }

    /// Whether `command` was always allowed in `session` on any gateway. `false` when the
    /// cluster cannot tell (the user is then asked).
    async fn always(&self, session: &str, command: &str) -> bool {
        if !self.always.healthy() {
            return false;
        }
        let [s, d] = always_parts(session, command);
        matches!(self.always.get(&[&s, &d]).await, Ok(Some(v)) if v.value == command)
    }

    /// Remember that `command` is always allowed in `session`, in the cluster (background).
    fn remember_always(&self, session: &str, command: &str) {
        let (always, parts, command) = (
            self.always.clone(),
            always_parts(session, command),
            command.to_string(),
        );
        shared::in_background("approval always", move || {
            let (always, parts, command) = (always.clone(), parts.clone(), command.clone());
            async move {
                let [s, d] = &parts;
                always.put(&[s, d], &command).await.map(drop)
            }
        });
    }
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
    shared: Option<SharedApprovals>,
    /// Who may answer (`tools.exec.approvers`, `approver_ids`), replaced by a reload and read
    /// when an answer arrives.
    rules: Mutex<ApproverRules>,
}

/// Removes a request when its asker stops waiting; unanswered, it is kept as expired.
struct Forget<'a>(&'a Approvals, String);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        let gone = self.0.lock().remove(&self.1);
        if let Some(p) = gone {
            self.0.remember(&self.1, &p, ApprovalState::Expired);
            if let Some(sh) = &self.0.shared {
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
            shared: None,
            rules: Mutex::new(ApproverRules::default()),
        }
    }

    /// Who may answer from now on (at start and at each reload); questions already asked are
    /// judged by these rules when their answer arrives.
    pub fn set_rules(&self, rules: ApproverRules) {
        *self.rules.locked() = rules;
    }

    /// Approvals whose questions go out through `sink`, shared with the other gateways of the
    /// cluster through `shared` (cluster mode): the answers given there reach the questions
    /// waiting here (watched on the current runtime).
    pub fn sharing(sink: Arc<dyn MessageSink>, shared: Option<SharedApprovals>) -> Arc<Self> {
        let watched = shared.clone();
        let me = Arc::new(Self {
            shared,
            ..Self::new(sink)
        });
        if let Some(sh) = watched {
            sh.watch_answers(Arc::downgrade(&me));
        }
        me
    }

    fn remember(&self, id: &str, p: &Pending, state: ApprovalState) {
        self.push_recent(ApprovalInfo {
            node: None,
            id: id.to_string(),
            session: p.session.to_string(),
            command: p.command.clone(),
            asked_ms: p.asked_ms,
            state,
            may_answer: None,
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

    /// Ask the user of `session` whether `what` may happen on the gateway; waits for the
    /// answer. A question that cannot be sent is a denial.
    pub async fn request(&self, session: &SessionKey, what: &str) -> Decision {
        self.request_on(session, what, RunsOn::Gateway).await
    }

    /// [`Approvals::request`] for a command that runs `on` the gateway or a node.
    pub async fn request_on(&self, session: &SessionKey, what: &str, on: RunsOn) -> Decision {
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
                on,
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
                text: self.question(&id, what, on),
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
        if let Some(sh) = &self.shared {
            sh.asked(&ApprovalInfo {
                node: None,
                id: id.clone(),
                session: session.to_string(),
                command: what.to_string(),
                asked_ms: now_ms(),
                state: ApprovalState::Pending,
                may_answer: Some(MayAnswer::of(&self.rules.locked(), on)),
            });
        }
        rx.await.unwrap_or(Decision::Deny)
    }

    /// The question as the chat shows it: what would run, and who may answer.
    fn question(&self, id: &str, what: &str, on: RunsOn) -> String {
        let rules = self.rules.locked().clone();
        match rules.for_run(on) {
            Approvers::Chat => format!(
                "Approval needed to run:\n```\n{what}\n```\nReply `/approve {id}` to run it once, `/approve {id} always` to stop asking for this command, or `/deny {id}`."
            ),
            Approvers::Operator => format!(
                "Approval needed to run:\n```\n{what}\n```\nOnly the operator can approve it (in the control UI, with `weft approvals approve {id}`{}). Anyone here can refuse it with `/deny {id}`.",
                if rules.approver_ids.is_empty() {
                    String::new()
                } else {
                    format!(", or an approver replying `/approve {id}`")
                }
            ),
        }
    }

    /// Answer request `id` from chat user `sender` ("channel:user id") writing in `session`,
    /// judged by the rules in force now (not those when it was asked). Returns the text to
    /// reply to the user.
    ///
    /// # Errors
    /// No such pending request for this session ([`Refused::NotPending`]), or an approval that
    /// only the operator may give ([`Refused::OperatorOnly`]; the question still waits).
    pub fn answer(
        &self,
        session: &SessionKey,
        sender: &str,
        id: &str,
        d: Decision,
    ) -> Result<String, Refused> {
        self.resolve(Answerer::Chat { session, sender }, id, d)
    }

    /// Answer request `id` whichever session asked (the operator: `weft approvals`, the admin
    /// API). Returns the text to show.
    ///
    /// # Errors
    /// No such pending request.
    pub fn answer_any(&self, id: &str, d: Decision) -> Result<String, NotPending> {
        self.resolve(Answerer::Operator, id, d)
            .map_err(|e| match e {
                Refused::NotPending(n) => n,
                // The operator may approve anything.
                Refused::OperatorOnly(id) => NotPending(id),
            })
    }

    /// [`Approvals::answer_any`], or, when the question waits on another gateway of the
    /// cluster, answered there (blocks until that gateway took the answer).
    ///
    /// # Errors
    /// No gateway asks it, or the cluster could not carry the answer.
    pub fn answer_anywhere(&self, id: &str, d: Decision) -> Result<String, AnswerError> {
        match (self.answer_any(id, d), &self.shared) {
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

    /// [`Approvals::list`] plus the questions waiting on the other gateways of the cluster
    /// (those with `node`), pending ones first.
    pub fn list_all(&self) -> Vec<ApprovalInfo> {
        let mut out = self.list();
        if let Some(sh) = &self.shared {
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

    fn resolve(&self, who: Answerer<'_>, id: &str, d: Decision) -> Result<String, Refused> {
        let not_pending = || Refused::NotPending(NotPending(id.to_string()));
        let p = {
            let mut g = self.lock();
            let Some(p) = g.get(id) else {
                return Err(not_pending());
            };
            if let Answerer::Chat { session, sender } = who {
                // Authority is judged now, by the rules in force now.
                let rules = self.rules.locked().clone();
                let listed = rules.is_listed(sender);
                if p.session != *session && !listed {
                    return Err(not_pending());
                }
                if d != Decision::Deny && !listed && rules.for_run(p.on) == Approvers::Operator {
                    tracing::info!(
                        id,
                        sender,
                        "an approval only the operator may give was refused to a chat user"
                    );
                    return Err(Refused::OperatorOnly(id.to_string()));
                }
            }
            g.remove(id).ok_or_else(not_pending)?
        };
        let state = match d {
            Decision::Once => ApprovalState::Approved,
            Decision::Always => ApprovalState::ApprovedAlways,
            Decision::Deny => ApprovalState::Denied,
        };
        self.remember(id, &p, state);
        if let Some(sh) = &self.shared {
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
        let rules = self.rules.locked().clone();
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
                may_answer: Some(MayAnswer::of(&rules, p.on)),
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
            may_answer: None,
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
        assert!(a.answer(&other, "telegram:2", &id, Decision::Once).is_err());
        assert!(a.answer(&me, "telegram:1", "nope", Decision::Once).is_err());
        a.answer(&me, "telegram:1", &id, Decision::Always).unwrap();
        assert_eq!(waiting.await.unwrap(), Decision::Always);
        assert_eq!(a.pending(), 0);

        // A caller that gives up leaves nothing behind.
        let r = tokio::time::timeout(Duration::from_millis(20), a.request(&me, "x")).await;
        assert!(r.is_err());
        assert_eq!(a.pending(), 0);
    }

    /// Wait for the next question in `sink` and return its id and text.
    async fn next_question(sink: &Sink, n: usize) -> (String, String) {
        loop {
            if let Some(m) = sink.0.lock().unwrap().get(n).cloned() {
                let id = match &m.body {
                    clawft_channel_core::OutboundBody::Approval { ask, .. } => {
                        ask.approval_id.clone()
                    }
                    other => panic!("not an approval question: {other:?}"),
                };
                return (id, m.text().to_string());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_command_on_a_node_is_approved_only_by_the_operator_by_default() {
        let sink = Arc::new(Sink::default());
        let a = Arc::new(Approvals::new(sink.clone()));
        let me = SessionKey::parse("telegram:1").unwrap();
        let (a2, me2) = (a.clone(), me.clone());
        let waiting = tokio::spawn(async move {
            a2.request_on(&me2, "[on node home] uname -a", RunsOn::Node)
                .await
        });
        let (id, text) = next_question(&sink, 0).await;
        assert!(text.contains("Only the operator can approve"), "{text}");
        let e = a
            .answer(&me, "telegram:1", &id, Decision::Once)
            .unwrap_err();
        assert_eq!(e.kind(), RefusedKind::OperatorOnly);
        assert!(e.to_string().contains("Nothing was run"), "{e}");
        assert_eq!(a.pending(), 1, "a refused approval changes nothing");
        // Anyone in the chat may still refuse it.
        a.answer(&me, "telegram:1", &id, Decision::Deny).unwrap();
        assert_eq!(waiting.await.unwrap(), Decision::Deny);

        // On the gateway, the default is the chat.
        let (a2, me2) = (a.clone(), me.clone());
        let waiting = tokio::spawn(async move { a2.request(&me2, "uname -a").await });
        let (id, _) = next_question(&sink, 1).await;
        a.answer(&me, "telegram:1", &id, Decision::Once).unwrap();
        assert_eq!(waiting.await.unwrap(), Decision::Once);
    }

    #[tokio::test]
    async fn authority_is_judged_by_the_rules_in_force_when_the_answer_arrives() {
        let sink = Arc::new(Sink::default());
        let a = Arc::new(Approvals::new(sink.clone()));
        a.set_rules(ApproverRules {
            approvers: Some(Approvers::Operator),
            approver_ids: vec!["telegram:7".into()],
        });
        let me = SessionKey::parse("telegram:1").unwrap();
        let boss = SessionKey::parse("telegram:7").unwrap();
        let (a2, me2) = (a.clone(), me.clone());
        let waiting = tokio::spawn(async move { a2.request(&me2, "uname -a").await });
        let (id, _) = next_question(&sink, 0).await;
        // Removed before answering: the listed approver's answer no longer counts.
        a.set_rules(ApproverRules {
            approvers: Some(Approvers::Operator),
            approver_ids: Vec::new(),
        });
        let e = a
            .answer(&boss, "telegram:7", &id, Decision::Once)
            .unwrap_err();
        assert_eq!(e.kind(), RefusedKind::NotPending);
        assert_eq!(a.pending(), 1);
        // Listed again (a later reload), the same answer is taken.
        a.set_rules(ApproverRules {
            approvers: Some(Approvers::Operator),
            approver_ids: vec!["telegram:7".into()],
        });
        a.answer(&boss, "telegram:7", &id, Decision::Once).unwrap();
        assert_eq!(waiting.await.unwrap(), Decision::Once);
    }
}
