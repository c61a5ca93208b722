//! The servers' tools as the registry sees them: [`McpTool`] (`{server}__{tool}`, calls with a
//! deadline and cancellation, results mapped to model-facing JSON) and [`McpManager`] as a
//! [`ToolSource`].

use std::collections::BTreeSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use rmcp::model::CallToolRequestParams;
use rmcp::service::ServiceError;
use serde_json::{json, Value};

use super::chain;
use super::manager::{McpManager, McpState, Slot};
use crate::tools::registry::{SourcedTool, ToolSource};
use crate::tools::truncate::floor_char as cut;
use crate::tools::{Effect, Tool, ToolContext, ToolError};

/// Longest tool name handed to the model (OpenAI and Anthropic accept 64).
const MAX_TOOL_NAME: usize = 64;
/// Longest tool description kept (bytes).
const MAX_DESCRIPTION: usize = 4096;
/// Most tools taken from one server.
const MAX_TOOLS_PER_SERVER: usize = 256;

impl ToolSource for McpManager {
    fn tools(&self) -> Vec<SourcedTool> {
        let mut out = Vec::new();
        for s in &self.slots {
            let g = s.lock();
            if matches!(g.state, McpState::Connected | McpState::Reconnecting) {
                out.extend(g.tools.iter().map(|t| SourcedTool {
                    tool: t.clone() as Arc<dyn Tool>,
                    internal: s.settings.internal_only,
                }));
            }
        }
        out
    }

    fn first_connect(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async move {
            self.first_attempts_done().await;
        })
    }
}

/// `[A-Za-z0-9_-]` only, at most [`MAX_TOOL_NAME`] with the prefix (a hash suffix keeps
/// shortened names distinct).
fn exposed_name(server: &str, tool: &str) -> String {
    let clean: String = tool
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let full = format!("{server}__{clean}");
    if full.len() <= MAX_TOOL_NAME {
        return full;
    }
    // FNV-1a of the original name.
    let mut h: u32 = 0x811c_9dc5;
    for b in tool.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    let suffix = format!("_{h:08x}");
    let keep = MAX_TOOL_NAME - suffix.len();
    format!("{}{suffix}", &full[..keep])
}

pub(super) fn make_tools(slot: &Arc<Slot>, list: Vec<rmcp::model::Tool>) -> Vec<Arc<McpTool>> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for t in list {
        if out.len() == MAX_TOOLS_PER_SERVER {
            tracing::warn!(mcp_server = %slot.name(), "more than {MAX_TOOLS_PER_SERVER} tools: the rest are ignored");
            break;
        }
        if !slot.settings.grants(&t.name) {
            // `tool_allow`/`tool_deny`: never offered, never callable.
            tracing::debug!(mcp_server = %slot.name(), tool = %t.name, "tool not granted by tool_allow/tool_deny");
            continue;
        }
        let name = exposed_name(slot.name(), &t.name);
        if !seen.insert(name.clone()) {
            tracing::warn!(mcp_server = %slot.name(), tool = %t.name, "tool name clashes after sanitising: skipped");
            continue;
        }
        let description = t
            .description
            .as_deref()
            .or(t.title.as_deref())
            .unwrap_or("");
        out.push(Arc::new(McpTool {
            name,
            remote: t.name.to_string(),
            description: cut(description, MAX_DESCRIPTION).to_string(),
            schema: Value::Object((*t.input_schema).clone()),
            slot: Arc::downgrade(slot),
            timeout: slot.settings.call_timeout,
        }));
    }
    out
}

/// One tool of an MCP server, as the registry sees it.
pub struct McpTool {
    name: String,
    remote: String,
    description: String,
    schema: Value,
    slot: Weak<Slot>,
    timeout: Duration,
}

impl McpTool {
    /// The tool's name on its server.
    pub fn remote_name(&self) -> &str {
        &self.remote
    }
}

#[async_trait]
impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn parameters(&self) -> Value {
        self.schema.clone()
    }
    fn effect(&self) -> Effect {
        // Server annotations are hints from another program: assume the worst.
        Effect::Executes
    }
    fn time_budget(&self) -> Option<Duration> {
        Some(self.timeout + Duration::from_secs(1))
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let slot = self
            .slot
            .upgrade()
            .ok_or_else(|| ToolError::ExecutionFailed("the MCP client has shut down".into()))?;
        let peer = {
            let g = slot.lock();
            if g.state == McpState::Connected {
                g.peer.clone()
            } else {
                None
            }
        };
        let Some(peer) = peer else {
            return Err(ToolError::ExecutionFailed(slot.down_message()));
        };
        let arguments = match args {
            Value::Object(m) => Some(m),
            Value::Null => None,
            other => {
                return Err(ToolError::InvalidArgs(format!(
                    "arguments for {} must be a JSON object, got {}",
                    self.name,
                    crate::types::json_type_name(&other)
                )))
            }
        };
        let mut params = CallToolRequestParams::new(self.remote.clone());
        params.arguments = arguments;
        // Dropping the call future (timeout, cancel) makes rmcp send notifications/cancelled.
        let call = tokio::time::timeout(self.timeout, peer.call_tool(params));
        let r = tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => return Err(ToolError::Cancelled),
            r = call => r,
        };
        match r {
            Err(_) => Err(ToolError::Timeout(self.timeout.as_secs())),
            Ok(Ok(result)) => map_result(&self.name, &result),
            Ok(Err(ServiceError::TransportClosed)) => Err(ToolError::ExecutionFailed(format!(
                "MCP server {} closed the connection during the call; it is being reconnected, try again shortly{}",
                slot.name(),
                slot.tail.suffix()
            ))),
            Ok(Err(ServiceError::McpError(e))) => Err(ToolError::ExecutionFailed(format!(
                "MCP server {} refused the call to {}: {} (code {})",
                slot.name(),
                self.remote,
                e.message,
                e.code.0
            ))),
            Ok(Err(e)) => Err(ToolError::ExecutionFailed(format!(
                "MCP server {}: {}",
                slot.name(),
                chain(&e)
            ))),
        }
    }
}

/// Decoded size of base64 text.
fn b64_len(s: &str) -> usize {
    let s = s.trim_end();
    let pad = s.bytes().rev().take_while(|b| *b == b'=').count();
    (s.len() / 4 * 3 + (s.len() % 4) * 3 / 4).saturating_sub(pad)
}

/// One content block as text: text as is, the rest as a short placeholder.
fn describe_block(b: &Value) -> String {
    let s = |k: &str| b.get(k).and_then(Value::as_str).unwrap_or("");
    match s("type") {
        "text" => s("text").to_string(),
        kind @ ("image" | "audio") => {
            format!("[{kind}: {}, {} bytes]", s("mimeType"), b64_len(s("data")))
        }
        "resource" => {
            let r = b.get("resource").cloned().unwrap_or(Value::Null);
            let rs = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            let size = match (
                r.get("text").and_then(Value::as_str),
                r.get("blob").and_then(Value::as_str),
            ) {
                (Some(t), _) => format!("{} bytes of text", t.len()),
                (None, Some(bl)) => format!("{} bytes", b64_len(bl)),
                _ => "empty".into(),
            };
            let mime = rs("mimeType");
            if mime.is_empty() {
                format!("[resource: {}, {size}]", rs("uri"))
            } else {
                format!("[resource: {}, {mime}, {size}]", rs("uri"))
            }
        }
        "resource_link" => format!("[resource link: {} ({})]", s("uri"), s("name")),
        other => format!("[{other} content]"),
    }
}

/// The model-facing value of a `tools/call` result: text joined; structured content as JSON;
/// media as placeholders; `isError` → `ExecutionFailed` with the text.
fn map_result(tool: &str, result: &rmcp::model::CallToolResult) -> Result<Value, ToolError> {
    let v = serde_json::to_value(result)
        .map_err(|e| ToolError::ExecutionFailed(format!("unreadable result from {tool}: {e}")))?;
    let blocks = v
        .get("content")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let only_text = blocks
        .iter()
        .all(|b| b.get("type").and_then(Value::as_str) == Some("text"));
    let text = blocks
        .iter()
        .map(describe_block)
        .collect::<Vec<_>>()
        .join("\n");
    if result.is_error == Some(true) {
        let msg = if text.trim().is_empty() {
            match &result.structured_content {
                Some(s) => s.to_string(),
                None => format!("{tool} reported an error without details"),
            }
        } else {
            text
        };
        return Err(ToolError::ExecutionFailed(msg));
    }
    Ok(match &result.structured_content {
        // The text blocks are (by the spec) its serialisation: do not send it twice.
        Some(s) if only_text => s.clone(),
        Some(s) => json!({ "structured_content": s, "content": text }),
        None => Value::String(text),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn names_are_sanitised_and_bounded() {
        assert_eq!(exposed_name("fs", "read_file"), "fs__read_file");
        assert_eq!(exposed_name("e", "get-sum"), "e__get-sum");
        assert_eq!(exposed_name("e", "a.b/c d"), "e__a_b_c_d");
        assert_eq!(exposed_name("e", "ünï"), "e___n_");
        let long = "x".repeat(100);
        let n = exposed_name("srv", &long);
        assert_eq!(n.len(), 64);
        assert_ne!(n, exposed_name("srv", &format!("{long}y")));
    }

    #[test]
    fn base64_sizes() {
        assert_eq!(b64_len(""), 0);
        assert_eq!(b64_len("YQ=="), 1);
        assert_eq!(b64_len("YWI="), 2);
        assert_eq!(b64_len("YWJj"), 3);
        assert_eq!(b64_len("YWJjZA"), 4);
    }

    #[test]
    fn results_map_text_structured_media_and_errors() {
        let r: rmcp::model::CallToolResult = serde_json::from_value(json!({
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
        }))
        .unwrap();
        assert_eq!(map_result("t", &r).unwrap(), json!("a\nb"));
        let r: rmcp::model::CallToolResult = serde_json::from_value(json!({
            "content": [{"type": "text", "text": "{\"x\":1}"}], "structuredContent": {"x": 1}
        }))
        .unwrap();
        assert_eq!(map_result("t", &r).unwrap(), json!({"x": 1}));
        let r: rmcp::model::CallToolResult = serde_json::from_value(json!({
            "content": [
                {"type": "image", "data": "YWJj", "mimeType": "image/png"},
                {"type": "audio", "data": "YQ==", "mimeType": "audio/wav"},
                {"type": "resource", "resource": {"uri": "file:///a.txt", "mimeType": "text/plain", "text": "héllo"}},
                {"type": "resource_link", "uri": "file:///b", "name": "b"}
            ]
        }))
        .unwrap();
        assert_eq!(
            map_result("t", &r).unwrap(),
            json!("[image: image/png, 3 bytes]\n[audio: audio/wav, 1 bytes]\n[resource: file:///a.txt, text/plain, 6 bytes of text]\n[resource link: file:///b (b)]")
        );
        let r: rmcp::model::CallToolResult = serde_json::from_value(json!({
            "content": [{"type": "text", "text": "boom"}], "isError": true
        }))
        .unwrap();
        assert_eq!(
            map_result("t", &r).unwrap_err(),
            ToolError::ExecutionFailed("boom".into())
        );
        let r: rmcp::model::CallToolResult =
            serde_json::from_value(json!({"content": [], "isError": true})).unwrap();
        assert!(map_result("t", &r)
            .unwrap_err()
            .to_string()
            .contains("without details"));
        let r: rmcp::model::CallToolResult =
            serde_json::from_value(json!({"content": []})).unwrap();
        assert_eq!(map_result("t", &r).unwrap(), json!(""));
    }
}
