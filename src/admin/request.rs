//! The `/v1/admin/*` commands as one typed request: the route's name and its JSON body are
//! read once, here, into an [`AdminRequest`] whose fields have their types; the handlers match
//! on it exhaustively and never read the body themselves. A missing or mistyped field is a
//! 400 that names the field and what it expects.
//!
//! It runs nothing: parsing only.

use std::path::PathBuf;

use serde_json::Value;

use super::nodes::NodeDecision;
use crate::approval::Decision;
use clawft_channel_http::AdminError;

/// One admin command with its arguments.
#[derive(Debug)]
pub enum AdminRequest {
    /// `config/*`, `agents/*`, `memory/*`: answered from the configuration in force, also
    /// while the gateway is starting.
    Inspect(InspectRequest),
    /// `send {channel, chat_id, content}`: a message from the operator (`weft send`).
    Send {
        /// The channel to send on.
        channel: String,
        /// The chat.
        chat_id: String,
        /// The text.
        content: String,
    },
    /// `approvals/list`.
    ApprovalsList,
    /// `approvals/answer {id, decision}`.
    ApprovalsAnswer {
        /// The approval's id.
        id: String,
        /// `approve`, `always` or `deny`.
        decision: Decision,
    },
    /// `logs/tail {after?, level?}`: the recent log lines after sequence `after`.
    LogsTail {
        /// The last sequence number already shown.
        after: u64,
        /// Only lines at this level or above.
        level: Option<String>,
    },
    /// `mcp/list`.
    McpList,
    /// `mcp/restart {name}`.
    McpRestart {
        /// The server's name.
        name: String,
    },
    /// `sessions/search {q?, channel?, offset?, limit?}`.
    SessionsSearch(super::sessions::SearchQuery),
    /// `sessions/compact {session}`.
    SessionsCompact {
        /// The session's key, as written.
        session: String,
    },
    /// `canvas/get {session}`.
    CanvasGet {
        /// The session's key, as written.
        session: String,
    },
    /// `usage {by?, days?, stack?, session?}`.
    Usage {
        /// One session's life, day by day with its turns (`weft usage --session KEY`);
        /// `by` and `stack` are then not used.
        session: Option<String>,
        /// `day`, `session`, `model`, `user` or `agent` (default `day`).
        by: String,
        /// How many days back (default 30).
        days: u64,
        /// A second grouping splitting each row into `parts` (the UI's stacked chart).
        stack: Option<String>,
    },
    /// `store/check`.
    StoreCheck,
    /// `store/backup {path}`: the gateway writes a backup to an absolute path.
    StoreBackup {
        /// Where (absolute).
        path: PathBuf,
    },
    /// `nodes/list`.
    NodesList,
    /// `nodes/approve|deny|revoke {id}`.
    Node {
        /// The node's id.
        id: String,
        /// What to do.
        decision: NodeDecision,
    },
    /// `cron/ACTION {...}`: the scheduler's commands, whose arguments the `cron` tool's own
    /// parser checks.
    Cron {
        /// The action (`list`, `add`, `run` …).
        action: String,
        /// Its arguments (a JSON object).
        args: Value,
    },
    /// `pairing/*`.
    Pairing(PairingRequest),
}

/// The commands that read the configuration in force and the agents' memory.
#[derive(Debug)]
pub enum InspectRequest {
    /// `config/show`: the settings in force and where each came from.
    ConfigShow,
    /// `config/validate`: the file on disk checked as a reload would.
    ConfigValidate,
    /// `config/reload`.
    ConfigReload,
    /// `agents/list`.
    AgentsList,
    /// `memory/list {agent?}`: an agent's memory documents.
    MemoryList {
        /// The agent (`None`: the default one).
        agent: Option<String>,
    },
    /// `memory/search {agent?, query, max?}`.
    MemorySearch {
        /// The agent (`None`: the default one).
        agent: Option<String>,
        /// The words to look for (not empty).
        query: String,
        /// Most results (1 to 50, default 8).
        max: usize,
        /// Only documents under this path.
        prefix: Option<String>,
    },
}

/// The pairing commands (`weft pairing list|approve|revoke`), also run on the store directly
/// when no gateway runs.
#[derive(Debug)]
pub enum PairingRequest {
    /// `pairing/list`.
    List,
    /// `pairing/approve {code}`.
    Approve {
        /// The code the sender was given.
        code: String,
    },
    /// `pairing/revoke {who}`.
    Revoke {
        /// `channel:user`.
        who: String,
    },
}

/// The body of a request, read field by field with the refusals the API has always given.
struct Body<'a>(&'a Value);

impl Body<'_> {
    /// Field `k` as a string, or a 400 saying `missing`.
    fn required(&self, k: &str, missing: &str) -> Result<String, AdminError> {
        self.0[k]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| AdminError::BadRequest(missing.to_string()))
    }

    /// Field `k` as a non-empty string, if it is one.
    fn optional(&self, k: &str) -> Option<String> {
        self.0[k]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    }

    /// Field `k` as a number, if it is one.
    fn number(&self, k: &str) -> Option<u64> {
        self.0[k].as_u64()
    }
}

impl AdminRequest {
    /// The request of command `name` with `body`.
    ///
    /// # Errors
    /// An unknown command, or a field missing or of the wrong type (400).
    pub fn parse(name: &str, body: Value) -> Result<Self, AdminError> {
        let b = Body(&body);
        let string = |k: &str| b.required(k, &format!("`{k}` (a string) is required"));
        Ok(match name {
            "config/show" => AdminRequest::Inspect(InspectRequest::ConfigShow),
            "config/validate" => AdminRequest::Inspect(InspectRequest::ConfigValidate),
            "config/reload" => AdminRequest::Inspect(InspectRequest::ConfigReload),
            "agents/list" => AdminRequest::Inspect(InspectRequest::AgentsList),
            "memory/list" => AdminRequest::Inspect(InspectRequest::MemoryList {
                agent: b.optional("agent"),
            }),
            "memory/search" => AdminRequest::Inspect(InspectRequest::MemorySearch {
                agent: b.optional("agent"),
                query: b.0["query"]
                    .as_str()
                    .map(str::trim)
                    .filter(|q| !q.is_empty())
                    .map(str::to_string)
                    .ok_or_else(|| {
                        AdminError::BadRequest("`query` (the words to look for) is required".into())
                    })?,
                max: usize::try_from(b.number("max").unwrap_or(8).clamp(1, 50)).unwrap_or(8),
                prefix: b.0["prefix"].as_str().map(str::to_string),
            }),
            "send" => AdminRequest::Send {
                channel: string("channel")?,
                chat_id: string("chat_id")?,
                content: string("content")?,
            },
            "approvals/list" => AdminRequest::ApprovalsList,
            "approvals/answer" => AdminRequest::ApprovalsAnswer {
                id: string("id")?,
                decision: match b.0["decision"].as_str() {
                    Some("approve") => Decision::Once,
                    Some("always") => Decision::Always,
                    Some("deny") => Decision::Deny,
                    _ => {
                        return Err(AdminError::BadRequest(
                            "`decision` must be \"approve\", \"always\" or \"deny\"".into(),
                        ))
                    }
                },
            },
            "logs/tail" => AdminRequest::LogsTail {
                after: b.number("after").unwrap_or(0),
                level: b.optional("level"),
            },
            "mcp/list" => AdminRequest::McpList,
            "mcp/restart" => AdminRequest::McpRestart {
                name: b.required("name", "`name` is required")?,
            },
            "sessions/search" => {
                AdminRequest::SessionsSearch(super::sessions::SearchQuery::of(&body)?)
            }
            "sessions/compact" => AdminRequest::SessionsCompact {
                session: b.required("session", "`session` (a session key) is required")?,
            },
            "canvas/get" => AdminRequest::CanvasGet {
                session: b.required("session", "`session` (a session key) is required")?,
            },
            "usage" => AdminRequest::Usage {
                session: b.0["session"].as_str().map(str::to_string),
                by: b.0["by"].as_str().unwrap_or("day").to_string(),
                days: b.number("days").unwrap_or(30),
                stack: b.0["stack"].as_str().map(str::to_string),
            },
            "store/check" => AdminRequest::StoreCheck,
            "store/backup" => {
                let path =
                    PathBuf::from(b.required("path", "`path` (an absolute path) is required")?);
                if !path.is_absolute() {
                    return Err(AdminError::BadRequest("`path` must be absolute".into()));
                }
                AdminRequest::StoreBackup { path }
            }
            "nodes/list" => AdminRequest::NodesList,
            "nodes/approve" | "nodes/deny" | "nodes/revoke" => AdminRequest::Node {
                id: b.required("id", "`id` (a node id) is required")?,
                decision: match name {
                    "nodes/approve" => NodeDecision::Approve,
                    "nodes/deny" => NodeDecision::Deny,
                    _ => NodeDecision::Revoke,
                },
            },
            "pairing/list" => AdminRequest::Pairing(PairingRequest::List),
            "pairing/approve" => AdminRequest::Pairing(PairingRequest::Approve {
                code: b.required("code", "`code` is required")?,
            }),
            "pairing/revoke" => AdminRequest::Pairing(PairingRequest::Revoke {
                who: b.required("who", "`who` (channel:user) is required")?,
            }),
            other => match other.strip_prefix("cron/") {
                Some(action) => AdminRequest::Cron {
                    action: action.to_string(),
                    args: body,
                },
                None => {
                    return Err(AdminError::BadRequest(format!(
                        "unknown admin command `{other}`"
                    )))
                }
            },
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn commands_parse_into_typed_requests_and_refusals_name_the_field() {
        let r = AdminRequest::parse(
            "approvals/answer",
            json!({"id": "ab", "decision": "always"}),
        )
        .unwrap();
        assert!(matches!(
            r,
            AdminRequest::ApprovalsAnswer { ref id, decision: Decision::Always } if id == "ab"
        ));
        let e = AdminRequest::parse("approvals/answer", json!({"id": "ab", "decision": "maybe"}))
            .unwrap_err();
        assert!(matches!(e, AdminError::BadRequest(ref m) if m.contains("`decision`")));
        let e = AdminRequest::parse("send", json!({"channel": "telegram"})).unwrap_err();
        assert!(matches!(e, AdminError::BadRequest(ref m) if m.contains("`chat_id`")));
        assert!(matches!(
            AdminRequest::parse("nodes/deny", json!({"id": "n1"})).unwrap(),
            AdminRequest::Node {
                decision: NodeDecision::Deny,
                ..
            }
        ));
        assert!(matches!(
            AdminRequest::parse("store/backup", json!({"path": "rel/x"})).unwrap_err(),
            AdminError::BadRequest(_)
        ));
        assert!(matches!(
            AdminRequest::parse("no/such", json!({})).unwrap_err(),
            AdminError::BadRequest(ref m) if m.contains("unknown admin command")
        ));
    }
}
