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

/// Why a file made outside a chat's turn is not sent.
const NO_CHAT: &str =
    "saved; not sent: this run answers no chat (a subagent, a direct tool call): name the path in your result";

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
        crate::tools::builtin::Builtin::Tts.name()
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
        } else if ctx.turn.event_id.is_none() {
            (false, NO_CHAT)
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
        crate::tools::builtin::Builtin::Image.name()
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
        // Only a turn answering a chat message has a reply to carry the files (not a
        // subagent's run, not `weft tools call`).
        let chat = ctx.turn.event_id.is_some();
        let send = a.send.unwrap_or(true) && chat;
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
            "note": if send {
                "sent to this chat with your reply"
            } else if chat {
                "saved; not sent (send: false)"
            } else {
                NO_CHAT
            },
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::media::generate::SpeechBackend;
    use crate::media::MediaSettings;
    use crate::tools::{TurnScope, Workspace};

    fn ctx(dir: &std::path::Path, turn: Arc<TurnScope>) -> ToolContext {
        ToolContext {
            workspace: Arc::new(Workspace::open(dir).unwrap()),
            session: crate::types::SessionKey::parse("telegram:42").unwrap(),
            cancel: tokio_util::sync::CancellationToken::new(),
            user_dir: None,
            sender: None,
            call_id: None,
            turn,
        }
    }

    /// The real espeak-ng: a chat's turn sends the speech with its reply, `/voice never` and a
    /// run answering no chat only save it; every call is counted.
    #[tokio::test]
    async fn tts_with_espeak_ng_saves_wav_and_sends_only_in_a_chat_turn() {
        let espeak = std::path::PathBuf::from("/usr/bin/espeak-ng");
        if !espeak.exists() {
            assert!(std::env::var("CI").is_err(), "espeak-ng is not installed");
            eprintln!("skipped: espeak-ng is not installed");
            return;
        }
        let media = Arc::new(
            Media::new(MediaSettings {
                tts: SpeechBackend::Espeak {
                    path: espeak,
                    voice: Some("en".into()),
                },
                ..MediaSettings::default()
            })
            .unwrap(),
        );
        let tool = TtsTool::new(media);
        let d = tempfile::tempdir().unwrap();
        for (turn, sent) in [
            (TurnScope::answering(Some("7".into())), true),
            (
                TurnScope::answering_with(Some("8".into()), VoiceReplies::Never),
                false,
            ),
            (TurnScope::answering(None), false),
        ] {
            let c = ctx(d.path(), turn.clone());
            let v = tool
                .execute(json!({"text": "Good morning."}), &c)
                .await
                .unwrap();
            assert_eq!(v["sent"], sent, "{v}");
            let path = v["path"].as_str().unwrap();
            let wav = std::fs::read(d.path().join(path)).unwrap();
            assert!(wav.starts_with(b"RIFF") && path.ends_with(".wav"), "{path}");
            assert!(v["seconds"].as_f64().unwrap() > 0.3, "{v}");
            assert_eq!(
                turn.take_files(),
                if sent { vec![path.to_string()] } else { vec![] }
            );
            let spent = turn.take_spent();
            assert_eq!((spent[0].model.as_str(), spent[0].chars), ("espeak-ng", 13));
        }
        let e = tool
            .execute(
                json!({"text": "   "}),
                &ctx(d.path(), TurnScope::answering(None)),
            )
            .await
            .unwrap_err();
        assert!(e.to_string().contains("no text"), "{e}");
    }

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
