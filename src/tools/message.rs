//! `message` (seed 000): send a message to a channel and chat through the bus.
//!
//! Deny by default: a session may message its own chat, and the chats matched by
//! `tools.message.allow` (patterns over `channel:chat_id`, `*` wildcards, e.g.
//! `"telegram:123456"`, `"slack:C024*"`); anything else is `PERMISSION_DENIED`, so a hostile
//! prompt cannot make the agent spam or exfiltrate to arbitrary chats. The message is put in the
//! durable outbox before it is handed to the bus, so it is delivered even across a crash.

use std::sync::Arc;

use async_trait::async_trait;
use clawft_channel_core::{ChannelId, ChatId, OutboundMessage, ThreadId};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use super::policy::wildcard;
use super::{parse_args, schema_of, Effect, Tool, ToolContext, ToolError};
use crate::types::sanitize_content;

/// Longest message the tool accepts, in bytes (channels split long messages themselves).
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024;

/// Where the tool hands messages: implemented by the daemon's outbox (`egress::Outbox`).
pub trait MessageSink: Send + Sync + 'static {
    /// Ids of the channels that are running now.
    fn channels(&self) -> Vec<String>;
    /// Persist `msg` in the outbox and route it to its channel.
    ///
    /// # Errors
    /// The store could not queue it.
    fn send(&self, msg: OutboundMessage) -> Result<(), crate::store::StoreError>;
    /// Copy `bytes` as attachment `name` of outbound message `id` (kept until the message is
    /// settled); returns the copy's absolute path.
    ///
    /// # Errors
    /// The sink takes no files, or the copy failed.
    fn stage(&self, _id: &str, _name: &str, _bytes: &[u8]) -> Result<String, String> {
        Err("this gateway sends no files".into())
    }
    /// Whether channel `id` uploads files (the HTTP API and the terminal carry text only).
    fn sends_files(&self, _id: &str) -> bool {
        true
    }
}

/// A sink that sends nothing and knows no channel: builds a registry whose `message` tool is
/// counted and described (`weft doctor`'s window check) without a running outbox.
pub struct NoSink;

impl MessageSink for NoSink {
    fn channels(&self) -> Vec<String> {
        Vec::new()
    }
    fn send(&self, _msg: OutboundMessage) -> Result<(), crate::store::StoreError> {
        Ok(())
    }
}

/// Most files one message carries.
pub const MAX_ATTACHMENTS: usize = 10;
/// Largest file a message carries (the platform's own limit may be lower: it then gets a note
/// instead of the file).
pub const MAX_ATTACHMENT_BYTES: u64 = 50 * 1024 * 1024;

/// Read the workspace files `paths` (contained like every file tool) and stage them as the
/// attachments of outbound message `id` through `sink`.
///
/// # Errors
/// Too many files, a path that is missing, outside the workspace, protected or too large, or
/// the copy failed: the message is then not sent.
pub fn attach(
    sink: &dyn MessageSink,
    ws: &super::Workspace,
    id: &str,
    paths: &[String],
) -> Result<Vec<clawft_channel_core::media::OutboundFile>, ToolError> {
    if paths.len() > MAX_ATTACHMENTS {
        return Err(ToolError::InvalidArgs(format!(
            "{} attachments; one message carries at most {MAX_ATTACHMENTS}",
            paths.len()
        )));
    }
    attach_each(sink, ws, id, paths).into_iter().collect()
}

/// [`attach`] file by file: each path's file or why it cannot be sent.
pub fn attach_each(
    sink: &dyn MessageSink,
    ws: &super::Workspace,
    id: &str,
    paths: &[String],
) -> Vec<Result<clawft_channel_core::media::OutboundFile, ToolError>> {
    paths
        .iter()
        .enumerate()
        .map(|(i, p)| attach_one(sink, ws, id, i, p))
        .collect()
}

fn attach_one(
    sink: &dyn MessageSink,
    ws: &super::Workspace,
    id: &str,
    i: usize,
    p: &str,
) -> Result<clawft_channel_core::media::OutboundFile, ToolError> {
    use clawft_channel_core::media::{MediaKind, OutboundFile};
    let rel = p.trim().trim_start_matches("./");
    let bytes = ws
        .read_beneath(rel, MAX_ATTACHMENT_BYTES + 1)?
        .ok_or_else(|| ToolError::FileNotFound(format!("{rel}: no such file in the workspace")))?;
    if bytes.len() as u64 > MAX_ATTACHMENT_BYTES {
        return Err(ToolError::InvalidArgs(format!(
            "{rel} is over {} MB, the largest file a message carries",
            MAX_ATTACHMENT_BYTES / (1024 * 1024)
        )));
    }
    let mime = crate::types::sniff::sniff(&bytes).unwrap_or("application/octet-stream");
    let name = rel.rsplit('/').next().unwrap_or(rel).to_string();
    let kind = MediaKind::of_mime(mime);
    let kind = if kind == MediaKind::Audio && mime == "audio/ogg" {
        MediaKind::Voice
    } else {
        kind
    };
    // Two files of the same name go out under their position.
    let staged = format!("{}-{}", i + 1, crate::types::sniff::safe_file_name(&name));
    let path = sink
        .stage(id, &staged, &bytes)
        .map_err(ToolError::ExecutionFailed)?;
    Ok(OutboundFile {
        path,
        name,
        kind,
        mime: mime.to_string(),
        size: bytes.len() as u64,
    })
}

/// Split `MEDIA: path` lines (files to attach to a final reply) off `text`: the text without
/// them, and the paths (backticks and quotes around a path are dropped).
pub fn media_lines(text: &str) -> (String, Vec<String>) {
    let mut paths = Vec::new();
    let mut kept = Vec::new();
    for line in text.lines() {
        match line.trim().strip_prefix("MEDIA:") {
            Some(p) if !p.trim().is_empty() => {
                paths.push(p.trim().trim_matches(['`', '"', '\'']).to_string());
            }
            _ => kept.push(line),
        }
    }
    if paths.is_empty() {
        return (text.to_string(), paths);
    }
    (kept.join("\n").trim_end().to_string(), paths)
}

/// Arguments of `message`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageArgs {
    /// E.g. `telegram`.
    pub channel: String,
    /// The chat's id on that channel.
    pub chat_id: String,
    /// Markdown.
    #[serde(default)]
    pub content: String,
    /// Workspace files (at most 10, 50 MB each).
    #[serde(default)]
    pub attachments: Vec<String>,
}

/// The `message` tool.
pub struct MessageTool {
    sink: Arc<dyn MessageSink>,
    allow: Vec<String>,
}

impl MessageTool {
    /// A tool sending through `sink`, allowed to reach the session's own chat and the chats
    /// matching `allow` (`channel:chat_id` patterns).
    pub fn new(sink: Arc<dyn MessageSink>, allow: Vec<String>) -> Self {
        Self { sink, allow }
    }

    fn allowed(&self, ctx: &ToolContext, channel: &str, chat: &str) -> bool {
        let (own_channel, own_chat, _) = ctx.session.route();
        (own_channel == channel && own_chat == chat) || route_listed(&self.allow, channel, chat)
    }
}

/// Whether `tools.message.allow` (`allow`, patterns over `channel:chat_id`) lists the chat: the
/// one rule for reaching a chat other than the session's own (the `message` tool, scheduled
/// jobs).
pub fn route_listed(allow: &[String], channel: &str, chat: &str) -> bool {
    let route = format!("{channel}:{chat}");
    allow
        .iter()
        .any(|p| wildcard(p.as_bytes(), route.as_bytes()))
}

#[async_trait]
impl Tool for MessageTool {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::Message.name()
    }
    fn description(&self) -> &str {
        "Send a message (and workspace files) to this chat or an allowed one. To attach files to your reply instead, add lines `MEDIA: path`."
    }
    fn parameters(&self) -> Value {
        schema_of::<MessageArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::Network
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: MessageArgs = parse_args(self.name(), args)?;
        let content = sanitize_content(&a.content);
        if content.trim().is_empty() && a.attachments.is_empty() {
            return Err(ToolError::InvalidArgs(
                "content is empty and there are no attachments".into(),
            ));
        }
        if content.len() > MAX_MESSAGE_BYTES {
            return Err(ToolError::InvalidArgs(format!(
                "content is {} bytes; the limit is {MAX_MESSAGE_BYTES}: send a shorter message or several",
                content.len()
            )));
        }
        if a.channel.is_empty() || a.chat_id.is_empty() || a.chat_id.contains(':') {
            return Err(ToolError::InvalidArgs(
                "channel and chat_id must be non-empty and chat_id must not contain `:`".into(),
            ));
        }
        if !self.allowed(ctx, &a.channel, &a.chat_id) {
            return Err(ToolError::PermissionDenied(format!(
                "this session may not message {}:{}; only its own chat and routes in tools.message.allow are allowed",
                a.channel, a.chat_id
            )));
        }
        let channels = self.sink.channels();
        if !channels.contains(&a.channel) {
            return Err(ToolError::InvalidArgs(format!(
                "no channel `{}` is running; running channels: {}",
                a.channel,
                channels.join(", ")
            )));
        }
        if !a.attachments.is_empty() && !self.sink.sends_files(&a.channel) {
            return Err(ToolError::InvalidArgs(format!(
                "channel `{}` carries text only, not files; send the text, or name the file's path in it",
                a.channel
            )));
        }
        // A message to the session's own chat stays in its thread.
        let thread = match ctx.session.route() {
            (c, chat, Some(t)) if c == a.channel && chat == a.chat_id => Some(ThreadId::new(t)),
            _ => None,
        };
        let len = content.chars().count();
        let mut msg = clawft_channel_core::OutboundMessage::proactive(
            ChannelId::new(&a.channel),
            ChatId::new(&a.chat_id),
            thread,
            content,
        );
        msg.attachments = attach(self.sink.as_ref(), &ctx.workspace, &msg.id, &a.attachments)?;
        let files = msg.attachments.len();
        self.sink
            .send(msg)
            .map_err(|e| ToolError::ExecutionFailed(format!("could not queue the message: {e}")))?;
        ctx.turn.report(super::TurnEffect::MessageSent);
        Ok(json!({
            "status": "sent",
            "channel": a.channel,
            "chat_id": a.chat_id,
            "content_length": len,
            "attachments": files,
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::sync::Mutex;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::tools::Workspace;
    use crate::types::SessionKey;
    use clawft_channel_core::OutboundKind;

    #[derive(Default)]
    struct Sink(Mutex<Vec<OutboundMessage>>);
    impl MessageSink for Sink {
        fn channels(&self) -> Vec<String> {
            vec!["telegram".into(), "http".into()]
        }
        fn sends_files(&self, id: &str) -> bool {
            id != "http"
        }
        fn send(&self, msg: OutboundMessage) -> Result<(), crate::store::StoreError> {
            self.0.lock().unwrap().push(msg);
            Ok(())
        }
    }

    #[tokio::test]
    async fn own_chat_and_allowed_routes_only() {
        let d = tempfile::tempdir().unwrap();
        let ctx = ToolContext {
            workspace: Arc::new(Workspace::open(d.path()).unwrap()),
            session: SessionKey::parse("telegram:42:7").unwrap(),
            cancel: CancellationToken::new(),
            user_dir: None,
            sender: None,
            call_id: None,
            turn: Default::default(),
        };
        let sink = Arc::new(Sink::default());
        let t = MessageTool::new(sink.clone(), vec!["http:ops-*".into()]);
        let v = t
            .execute(
                json!({"channel": "telegram", "chat_id": "42", "content": "héllo ✓"}),
                &ctx,
            )
            .await
            .unwrap();
        assert_eq!(v["status"], "sent");
        assert_eq!(v["content_length"], 7);
        t.execute(
            json!({"channel": "http", "chat_id": "ops-room", "content": "deploy done"}),
            &ctx,
        )
        .await
        .unwrap();
        for (channel, chat) in [("telegram", "43"), ("http", "other"), ("slack", "42")] {
            let e = t
                .execute(
                    json!({"channel": channel, "chat_id": chat, "content": "x"}),
                    &ctx,
                )
                .await
                .unwrap_err();
            assert_eq!(e.code(), "PERMISSION_DENIED", "{channel}:{chat}");
        }
        let sent = sink.0.lock().unwrap().clone();
        assert_eq!(sent.len(), 2);
        assert_eq!(sent[0].thread.as_ref().map(ThreadId::as_str), Some("7"));
        assert_eq!(sent[0].kind(), OutboundKind::Final);
        assert_eq!(sent[1].chat.as_str(), "ops-room");
        assert!(sent[1].thread.is_none());

        let e = t
            .execute(
                json!({"channel": "telegram", "chat_id": "42", "content": " \u{0} "}),
                &ctx,
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), "INVALID_ARGS");
        let big = "x".repeat(MAX_MESSAGE_BYTES + 1);
        let e = t
            .execute(
                json!({"channel": "telegram", "chat_id": "42", "content": big}),
                &ctx,
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), "INVALID_ARGS");
        let t = MessageTool::new(sink.clone(), vec!["*".into()]);
        let e = t
            .execute(
                json!({"channel": "discord", "chat_id": "1", "content": "x"}),
                &ctx,
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), "INVALID_ARGS");
        assert!(e.to_string().contains("telegram, http"), "{e}");
    }

    /// A sink that stages into a directory, like the daemon's outbox.
    struct Staging(Sink, std::path::PathBuf);
    impl MessageSink for Staging {
        fn channels(&self) -> Vec<String> {
            self.0.channels()
        }
        fn send(&self, msg: OutboundMessage) -> Result<(), crate::store::StoreError> {
            self.0.send(msg)
        }
        fn sends_files(&self, id: &str) -> bool {
            self.0.sends_files(id)
        }
        fn stage(&self, id: &str, name: &str, bytes: &[u8]) -> Result<String, String> {
            let dir = self.1.join(id);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(name), bytes).unwrap();
            Ok(dir.join(name).to_string_lossy().into_owned())
        }
    }

    #[tokio::test]
    async fn attachments_are_workspace_files_copied_with_their_sniffed_type_and_nothing_outside() {
        let d = tempfile::tempdir().unwrap();
        let ws = d.path().join("ws");
        std::fs::create_dir_all(ws.join("reports")).unwrap();
        std::fs::write(ws.join("reports/week.pdf"), b"%PDF-1.7 numbers").unwrap();
        std::fs::write(d.path().join("secret.txt"), b"canary").unwrap();
        std::os::unix::fs::symlink(d.path().join("secret.txt"), ws.join("link.txt")).unwrap();
        let ctx = ToolContext {
            workspace: Arc::new(Workspace::open(&ws).unwrap()),
            session: SessionKey::parse("telegram:42").unwrap(),
            cancel: CancellationToken::new(),
            user_dir: None,
            sender: None,
            call_id: None,
            turn: Default::default(),
        };
        let sink = Arc::new(Staging(Sink::default(), d.path().join("staged")));
        let t = MessageTool::new(sink.clone(), Vec::new());
        let v = t
            .execute(
                json!({"channel": "telegram", "chat_id": "42", "attachments": ["reports/week.pdf"]}),
                &ctx,
            )
            .await
            .unwrap();
        assert_eq!(v["attachments"], 1);
        // Editing the workspace file afterwards does not change what is sent.
        std::fs::write(ws.join("reports/week.pdf"), b"changed").unwrap();
        let sent = sink.0 .0.lock().unwrap().clone();
        let f = &sent[0].attachments[0];
        assert_eq!(f.name, "week.pdf");
        assert_eq!(f.mime, "application/pdf");
        assert!(f.path.contains(&sent[0].id), "{}", f.path);
        assert_eq!(std::fs::read(&f.path).unwrap(), b"%PDF-1.7 numbers");
        assert!(sent[0].text().is_empty());
        for bad in ["../secret.txt", "/etc/passwd", "link.txt", "missing.pdf"] {
            let e = t
                .execute(
                    json!({"channel": "telegram", "chat_id": "42", "content": "x", "attachments": [bad]}),
                    &ctx,
                )
                .await
                .unwrap_err();
            assert!(!e.to_string().contains("canary"), "{bad}: {e}");
        }
        // A channel that carries text only refuses files instead of dropping them.
        let ctx_http = ToolContext {
            session: SessionKey::parse("http:42").unwrap(),
            ..ctx
        };
        let e = t
            .execute(
                json!({"channel": "http", "chat_id": "42", "attachments": ["reports/week.pdf"]}),
                &ctx_http,
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), "INVALID_ARGS");
        assert!(e.to_string().contains("text only"), "{e}");
        assert_eq!(
            sink.0 .0.lock().unwrap().len(),
            1,
            "nothing else was queued"
        );
    }

    #[test]
    fn media_lines_are_split_off_the_reply() {
        let (text, paths) =
            media_lines("Here is the chart.\nMEDIA: out/chart.png\n  MEDIA: `a b.pdf`\nbye");
        assert_eq!(text, "Here is the chart.\nbye");
        assert_eq!(paths, ["out/chart.png", "a b.pdf"]);
        let (text, paths) = media_lines("no files: MEDIA: inline is text");
        assert_eq!(text, "no files: MEDIA: inline is text");
        assert!(paths.is_empty());
    }
}
