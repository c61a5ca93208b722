//! `tts` and `image` (seed 004): speech and images made into the workspace and, unless the
//! call says `send: false`, sent to the chat with the turn's reply. Deferred tools: offered by
//! name and loaded through `tool_search`.
//!
//! The transcript keeps the call's text or prompt and the result's paths, never the bytes.

use std::sync::Arc;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use super::generate::{NO_IMAGES, NO_SPEECH};
use super::{human_size, write_file, Media, MediaError};
use crate::tools::{parse_args, schema_of, Effect, MediaUse, Tool, ToolContext, ToolError};
use crate::types::VoiceReplies;

/// The workspace path of a file made now: `media/<date>/<what>-<time>-<id>.<ext>`.
fn made_path(what: &str, ext: &str, n: Option<usize>) -> String {
    let now = chrono::Utc::now();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let n = n.map(|n| format!("-{n}")).unwrap_or_default();
    format!(
        "media/{}/{what}-{}-{}{n}.{ext}",
        now.format("%Y-%m-%d"),
        now.format("%H%M%S"),
        &id[..8]
    )
}

/// Speak `text` into a new workspace file: its path, the speech, and the spend to count.
///
/// # Errors
/// The speech failed ([`Media::speak`]) or the file could not be written.
pub async fn speak_into(
    media: &Media,
    ws: &crate::tools::Workspace,
    text: &str,
    voice: Option<&str>,
) -> Result<(String, super::generate::Spoken, MediaUse), MediaError> {
    let spoken = media.speak(text, voice).await?;
    let used = MediaUse {
        model: spoken.model.clone(),
        chars: spoken.chars,
        seconds: spoken.seconds.unwrap_or(0.0),
        images: 0,
    };
    let path = made_path("speech", crate::types::sniff::extension(spoken.mime), None);
    write_file(ws, &path, &spoken.bytes)
        .map_err(|e| MediaError::Failed(format!("the audio could not be saved: {e}")))?;
    Ok((path, spoken, used))
}

/// The workspace files a recorded `tts` or `image` result (`name`, its text `content`) sent
/// with the reply: a turn resumed after a restart sends them still.
pub fn sent_paths(name: &str, content: &str) -> Vec<String> {
    if name != "tts" && name != "image" {
        return Vec::new();
    }
    let Ok(v) = serde_json::from_str::<Value>(content) else {
        return Vec::new();
    };
    if v["sent"] != Value::Bool(true) {
        return Vec::new();
    }
    let one = v["path"].as_str().map(str::to_string);
    let many = v["images"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["path"].as_str().map(str::to_string));
    one.into_iter().chain(many).collect()
}

fn tool_error(e: MediaError) -> ToolError {
    match e {
        MediaError::Refused(m) => ToolError::InvalidArgs(m),
        MediaError::TooLarge => {
            ToolError::ExecutionFailed("the result is over the size limit".into())
        }
        MediaError::Failed(m) => ToolError::ExecutionFailed(m),
        MediaError::Blocked(m) => ToolError::PermissionDenied(m),
    }
}

/// Arguments of `tts`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TtsArgs {
    /// What to say.
    pub text: String,
    /// A voice name; the configured one when unset.
    pub voice: Option<String>,
    /// Send the audio to this chat with your reply (default true); false only saves it.
    pub send: Option<bool>,
}

/// The `tts` tool.
pub struct TtsTool {
    media: Arc<Media>,
}

impl TtsTool {
    /// Speaking through `media`.
    pub fn new(media: Arc<Media>) -> Self {
        Self { media }
    }
}

#[async_trait]
impl Tool for TtsTool {
    fn name(&self) -> &str {
        "tts"
    }
    fn description(&self) -> &str {
        "Text to speech: say text aloud as a voice note, saved in the workspace and sent to this chat with your reply."
    }
    fn parameters(&self) -> Value {
        schema_of::<TtsArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::Network
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: TtsArgs = parse_args(self.name(), args)?;
        if !self.media.speaks() {
            return Err(ToolError::ExecutionFailed(NO_SPEECH.into()));
        }
        let (path, spoken, used) = tokio::select! {
            r = speak_into(&self.media, &ctx.workspace, &a.text, a.voice.as_deref()) => r.map_err(tool_error)?,
            () = ctx.cancel.cancelled() => return Err(ToolError::Cancelled),
        };
        ctx.turn.spend(used);
        let (sent, note) = if !a.send.unwrap_or(true) {
            (false, "saved; not sent (send: false)")
        } else if ctx.turn.voice == VoiceReplies::Never {
            (
                false,
                "saved; not sent: voice replies are off in this chat (/voice)",
            )
        } else {
            ctx.turn.send_with_reply(path.clone());
            (true, "sent to this chat with your reply")
        };
        let mut v = json!({
            "path": path,
            "type": spoken.mime,
            "size": human_size(spoken.bytes.len() as u64),
            "sent": sent,
            "note": note,
        });
        if let Some(s) = spoken.seconds {
            v["seconds"] = json!((s * 10.0).round() / 10.0);
        }
        Ok(v)
    }
}

/// Arguments of `image`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageArgs {
    /// What to draw.
    pub prompt: String,
    /// WIDTHxHEIGHT (e.g. 1024x1024) or auto; the configured size when unset.
    pub size: Option<String>,
    /// How many images (default 1).
    pub count: Option<u32>,
    /// Send the images to this chat with your reply (default true); false only saves them.
    pub send: Option<bool>,
}

/// The `image` tool.
pub struct ImageTool {
    media: Arc<Media>,
}

impl ImageTool {
    /// Drawing through `media`.
    pub fn new(media: Arc<Media>) -> Self {
        Self { media }
    }
}

#[async_trait]
impl Tool for ImageTool {
    fn name(&self) -> &str {
        "image"
    }
    fn description(&self) -> &str {
        "Generate images from a prompt: saved in the workspace and sent to this chat with your reply."
    }
    fn parameters(&self) -> Value {
        schema_of::<ImageArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::Network
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: ImageArgs = parse_args(self.name(), args)?;
        if !self.media.draws() {
            return Err(ToolError::ExecutionFailed(NO_IMAGES.into()));
        }
        let count = a.count.unwrap_or(1);
        let (made, model) = tokio::select! {
            r = self.media.draw(&a.prompt, a.size.as_deref(), count) => r.map_err(tool_error)?,
            () = ctx.cancel.cancelled() => return Err(ToolError::Cancelled),
        };
        ctx.turn.spend(MediaUse {
            model,
            images: made.len() as u64,
            ..MediaUse::default()
        });
        let send = a.send.unwrap_or(true);
        let many = made.len() > 1;
        let mut files = Vec::new();
        for (i, m) in made.iter().enumerate() {
            let path = made_path(
                "image",
                crate::types::sniff::extension(m.mime),
                many.then_some(i + 1),
            );
            write_file(&ctx.workspace, &path, &m.bytes).map_err(|e| {
                ToolError::ExecutionFailed(format!("the image could not be saved: {e}"))
            })?;
            if send {
                ctx.turn.send_with_reply(path.clone());
            }
            files.push(json!({
                "path": path,
                "type": m.mime,
                "size": human_size(m.bytes.len() as u64),
            }));
        }
        Ok(json!({
            "images": files,
            "sent": send,
            "note": if send { "sent to this chat with your reply" } else { "saved; not sent (send: false)" },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_result_names_the_files_it_sent() {
        let tts = json!({"path": "media/d/speech-1.ogg", "sent": true}).to_string();
        assert_eq!(sent_paths("tts", &tts), vec!["media/d/speech-1.ogg"]);
        let img =
            json!({"images": [{"path": "media/d/a.png"}, {"path": "media/d/b.png"}], "sent": true});
        assert_eq!(
            sent_paths("image", &img.to_string()),
            vec!["media/d/a.png", "media/d/b.png"]
        );
        let kept = json!({"path": "media/d/speech-2.ogg", "sent": false}).to_string();
        assert!(sent_paths("tts", &kept).is_empty());
        assert!(sent_paths("read_file", &tts).is_empty());
        assert!(sent_paths("tts", "not json").is_empty());
    }
}
