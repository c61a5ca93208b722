//! Socket Mode frames and Events API payloads → what to deliver (pure functions).
//!
//! Which events become deliveries:
//! - `message` with `channel_type` `im` (DMs): always.
//! - In channels (`channel`, `group`, `mpim`) with [`GroupMode::Mention`]: the `app_mention`
//!   event (Slack sends both a `message` and an `app_mention` for one mention, with different
//!   `event_id`s and the same `ts`; only the `app_mention` is delivered), plus `message`s in a
//!   thread the bot started (`parent_user_id` is the bot) that do not mention it.
//! - In channels with [`GroupMode::All`]: every `message`; `app_mention` is ignored (its
//!   `message` twin is delivered).
//! - Ignored: anything with `bot_id` (other bots and ourselves), the bot's own user id, message
//!   subtypes other than `file_share` and `thread_broadcast` (edits, deletes, joins...),
//!   messages with neither text nor files.
//!
//! Files (`files` on a `file_share` message, or on its `app_mention` twin) become
//! [`MediaRef`]s: `id`, `name`, `mimetype`, `size`, the URL `url_private_download` (else
//! `url_private`); a `slack_audio` clip is a voice note, the others follow their media type.
//! Deleted (`mode: tombstone`) and external files (Google Drive links...) are left out. A
//! message with files and no text is delivered with empty content (in channels the mention rules
//! above still apply: the text must mention the bot, or the message must be a reply in its thread).
//!
//! `chat` is the channel id, `thread` the `thread_ts` when the message is inside a thread
//! (replies go to that thread); a top-level channel message has no thread, so the reply goes to
//! the channel and the whole channel is one conversation. `sender` is the user id, `event_id`
//! the Events API `event_id` (identical across Slack's retries of one event).

use clawft_channel_core::media::{MediaKind, MediaRef};
use serde_json::Value;

use crate::api::Identity;
use crate::GroupMode;

/// One Socket Mode frame from Slack.
#[derive(Debug, PartialEq)]
pub(crate) enum Frame {
    /// The connection is ready.
    Hello,
    /// Slack will close this connection: open a new one.
    Disconnect {
        /// `refresh_requested`, `warning`, `link_disabled`...
        reason: String,
    },
    /// An envelope that must be acknowledged with its `envelope_id`.
    Envelope {
        /// The id to echo back.
        envelope_id: String,
        /// `events_api`, `slash_commands`, `interactive`...
        kind: String,
        /// 0 for the first delivery, 1..3 for Slack's retries.
        retry_attempt: u64,
        /// The payload.
        payload: Value,
    },
    /// Anything else (ignored).
    Other(String),
}

/// Parse a text frame.
pub(crate) fn parse_frame(text: &str) -> Result<Frame, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("bad JSON frame: {e}"))?;
    let kind = v
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if kind == "hello" {
        return Ok(Frame::Hello);
    }
    if kind == "disconnect" {
        let reason = v
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_string();
        return Ok(Frame::Disconnect { reason });
    }
    match v.get("envelope_id").and_then(Value::as_str) {
        Some(id) if !id.is_empty() => Ok(Frame::Envelope {
            envelope_id: id.to_string(),
            kind,
            retry_attempt: v.get("retry_attempt").and_then(Value::as_u64).unwrap_or(0),
            payload: v.get("payload").cloned().unwrap_or(Value::Null),
        }),
        _ => Ok(Frame::Other(kind)),
    }
}

/// A message to deliver.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Incoming {
    pub chat: String,
    pub thread: Option<String>,
    pub sender: String,
    pub event_id: String,
    pub content: String,
    pub attachments: Vec<MediaRef>,
}

/// What an `events_api` payload becomes: a delivery, or the reason it is ignored.
pub(crate) fn from_event(
    payload: &Value,
    me: &Identity,
    mode: GroupMode,
) -> Result<Incoming, &'static str> {
    if payload.get("type").and_then(Value::as_str) != Some("event_callback") {
        return Err("not an event_callback");
    }
    let event_id = str_of(payload, "event_id").ok_or("no event_id")?;
    let ev = payload.get("event").ok_or("no event")?;
    let ev_type = str_of(ev, "type").unwrap_or_default();
    if ev.get("bot_id").is_some_and(|b| !b.is_null()) {
        return Err("from a bot");
    }
    if let Some(sub) = str_of(ev, "subtype") {
        if sub != "file_share" && sub != "thread_broadcast" {
            return Err("message subtype");
        }
    }
    let sender = str_of(ev, "user").ok_or("no user")?;
    if sender == me.user_id {
        return Err("our own message");
    }
    let chat = str_of(ev, "channel").ok_or("no channel")?;
    let text = str_of(ev, "text").unwrap_or_default();
    let ts = str_of(ev, "ts").unwrap_or_default();
    let thread = str_of(ev, "thread_ts").filter(|t| *t != ts);
    let mentioned = mentions(&text, &me.user_id);
    let deliver = match ev_type.as_str() {
        "message" => {
            let dm = str_of(ev, "channel_type").as_deref() == Some("im");
            match (dm, mode) {
                (true, _) | (false, GroupMode::All) => true,
                // The app_mention twin is delivered instead.
                (false, GroupMode::Mention) if mentioned => false,
                // A reply in a thread the bot started.
                (false, GroupMode::Mention) => {
                    thread.is_some()
                        && str_of(ev, "parent_user_id").as_deref() == Some(me.user_id.as_str())
                }
            }
        }
        // app_mention in a DM has a message.im twin; in All mode a message twin.
        "app_mention" => mode == GroupMode::Mention && !chat.starts_with('D'),
        _ => return Err("not a message event"),
    };
    if !deliver {
        return Err("not addressed to the bot");
    }
    let content = clean_text(&text, &me.user_id);
    let attachments = files_of(ev);
    if content.is_empty() && attachments.is_empty() {
        return Err("empty text");
    }
    Ok(Incoming {
        chat,
        thread,
        sender,
        event_id,
        content,
        attachments,
    })
}

/// The `files` of a message event as [`MediaRef`]s (entries without an id are skipped).
fn files_of(ev: &Value) -> Vec<MediaRef> {
    let Some(files) = ev.get("files").and_then(Value::as_array) else {
        return Vec::new();
    };
    files
        .iter()
        .filter_map(|f| {
            // A deleted file (`tombstone`) has nothing to fetch; an external one (Google
            // Drive...) is a link to another service, already in the text.
            let mode = str_of(f, "mode");
            if mode.as_deref() == Some("tombstone") || mode.as_deref() == Some("external") {
                return None;
            }
            if f.get("is_external").and_then(Value::as_bool) == Some(true) {
                return None;
            }
            let id = str_of(f, "id")?;
            let mime = str_of(f, "mimetype");
            let kind = if str_of(f, "subtype").as_deref() == Some("slack_audio") {
                MediaKind::Voice
            } else {
                mime.as_deref()
                    .map_or(MediaKind::Document, MediaKind::of_mime)
            };
            let mut m = MediaRef::new(kind, id);
            m.name = str_of(f, "name").or_else(|| str_of(f, "title"));
            m.mime = mime;
            m.size = f.get("size").and_then(Value::as_u64);
            m.url = str_of(f, "url_private_download").or_else(|| str_of(f, "url_private"));
            m.duration_secs = f
                .get("duration_ms")
                .and_then(Value::as_u64)
                .map(|ms| u32::try_from(ms.div_ceil(1000)).unwrap_or(u32::MAX));
            Some(m)
        })
        .collect()
}

/// What a `slash_commands` payload becomes (`/stop`, `/new`... registered as slash commands).
pub(crate) fn from_slash_command(payload: &Value) -> Result<Incoming, &'static str> {
    let command = str_of(payload, "command").ok_or("no command")?;
    let text = str_of(payload, "text").unwrap_or_default();
    let sender = str_of(payload, "user_id").ok_or("no user_id")?;
    let chat = str_of(payload, "channel_id").ok_or("no channel_id")?;
    let trigger = str_of(payload, "trigger_id").ok_or("no trigger_id")?;
    let content = format!("{} {}", command.trim(), unescape(text.trim()));
    Ok(Incoming {
        chat,
        thread: None,
        sender,
        event_id: format!("slash-{trigger}"),
        content: content.trim().to_string(),
        attachments: Vec::new(),
    })
}

fn str_of(v: &Value, key: &str) -> Option<String> {
    v.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// Whether `text` mentions the user `<@id>` or `<@id|name>`.
fn mentions(text: &str, id: &str) -> bool {
    !id.is_empty() && (text.contains(&format!("<@{id}>")) || text.contains(&format!("<@{id}|")))
}

/// Strip mentions of the bot, turn Slack's entity escapes back into text, normalise commands.
pub(crate) fn clean_text(text: &str, bot: &str) -> String {
    let mut s = text.to_string();
    if !bot.is_empty() {
        s = s.replace(&format!("<@{bot}>"), "");
        let open = format!("<@{bot}|");
        while let Some(start) = s.find(&open) {
            match s[start..].find('>') {
                Some(end) => s.replace_range(start..start + end + 1, ""),
                None => break,
            }
        }
    }
    let s = unescape(s.trim());
    normalize_command(&s)
}

/// Slack sends `&`, `<`, `>` typed by users as entities.
fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// `/stop@clawbot args` → `/stop args`; a leading ":" or "," after a stripped mention removed.
fn normalize_command(s: &str) -> String {
    let s = s.trim_start_matches([':', ',']).trim();
    if let Some(rest) = s.strip_prefix('/') {
        let (word, tail) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        if let Some((cmd, _bot)) = word.split_once('@') {
            if !cmd.is_empty() {
                return format!("/{cmd} {}", tail.trim()).trim_end().to_string();
            }
        }
    }
    s.to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    fn me() -> Identity {
        Identity {
            user_id: "UBOT".into(),
            user: "clawbot".into(),
            team: "T".into(),
        }
    }

    fn payload(event_id: &str, ev: Value) -> Value {
        json!({"type": "event_callback", "event_id": event_id, "event": ev})
    }

    #[test]
    fn frames() {
        assert_eq!(
            parse_frame(r#"{"type":"hello","num_connections":1}"#),
            Ok(Frame::Hello)
        );
        assert_eq!(
            parse_frame(r#"{"type":"disconnect","reason":"refresh_requested"}"#),
            Ok(Frame::Disconnect {
                reason: "refresh_requested".into()
            })
        );
        let f = parse_frame(
            r#"{"envelope_id":"e1","type":"events_api","retry_attempt":2,"retry_reason":"timeout","payload":{"a":1}}"#,
        )
        .unwrap();
        assert_eq!(
            f,
            Frame::Envelope {
                envelope_id: "e1".into(),
                kind: "events_api".into(),
                retry_attempt: 2,
                payload: json!({"a": 1})
            }
        );
        assert!(parse_frame("not json").is_err());
        assert_eq!(parse_frame(r#"{"type":"x"}"#), Ok(Frame::Other("x".into())));
    }

    #[test]
    fn dm_and_thread() {
        let p = payload(
            "Ev1",
            json!({"type":"message","channel_type":"im","channel":"D1","user":"U1","text":"hi &lt;b&gt; &amp;","ts":"1.1"}),
        );
        let i = from_event(&p, &me(), GroupMode::Mention).unwrap();
        assert_eq!(
            i,
            Incoming {
                chat: "D1".into(),
                thread: None,
                sender: "U1".into(),
                event_id: "Ev1".into(),
                content: "hi <b> &".into(),
                attachments: Vec::new(),
            }
        );
        let p = payload(
            "Ev2",
            json!({"type":"message","channel_type":"im","channel":"D1","user":"U1","text":"x","ts":"2.2","thread_ts":"1.1"}),
        );
        assert_eq!(
            from_event(&p, &me(), GroupMode::Mention)
                .unwrap()
                .thread
                .as_deref(),
            Some("1.1")
        );
    }

    #[test]
    fn mention_twin_is_delivered_once() {
        let text = "<@UBOT> what's up";
        let msg = payload(
            "EvM",
            json!({"type":"message","channel_type":"channel","channel":"C1","user":"U1","text":text,"ts":"5.5"}),
        );
        let mention = payload(
            "EvA",
            json!({"type":"app_mention","channel":"C1","user":"U1","text":text,"ts":"5.5"}),
        );
        // Mention mode: the app_mention only.
        assert!(from_event(&msg, &me(), GroupMode::Mention).is_err());
        let i = from_event(&mention, &me(), GroupMode::Mention).unwrap();
        assert_eq!(
            (i.event_id.as_str(), i.content.as_str()),
            ("EvA", "what's up")
        );
        // All mode: the message only.
        assert_eq!(
            from_event(&msg, &me(), GroupMode::All).unwrap().content,
            "what's up"
        );
        assert!(from_event(&mention, &me(), GroupMode::All).is_err());
    }

    #[test]
    fn ignored_events() {
        let m = GroupMode::Mention;
        for ev in [
            json!({"type":"message","channel_type":"im","channel":"D1","user":"U1","text":"x","bot_id":"B9"}),
            json!({"type":"message","channel_type":"im","channel":"D1","user":"UBOT","text":"x"}),
            json!({"type":"message","subtype":"message_changed","channel_type":"im","channel":"D1","user":"U1","text":"x"}),
            json!({"type":"message","subtype":"bot_message","channel_type":"im","channel":"D1","text":"x"}),
            json!({"type":"message","channel_type":"channel","channel":"C1","user":"U1","text":"no mention"}),
            json!({"type":"message","channel_type":"im","channel":"D1","user":"U1","text":"   "}),
            json!({"type":"app_mention","channel":"D1","user":"U1","text":"<@UBOT> dm twin"}),
            json!({"type":"reaction_added","user":"U1"}),
        ] {
            assert!(
                from_event(&payload("Ev", ev.clone()), &me(), m).is_err(),
                "{ev}"
            );
        }
        assert!(from_event(&json!({"type":"url_verification"}), &me(), m).is_err());
    }

    #[test]
    fn thread_reply_to_the_bot_in_mention_mode() {
        let ev = json!({"type":"message","channel_type":"channel","channel":"C1","user":"U1","text":"follow up","ts":"9.9","thread_ts":"8.8","parent_user_id":"UBOT"});
        let i = from_event(&payload("Ev", ev), &me(), GroupMode::Mention).unwrap();
        assert_eq!(i.thread.as_deref(), Some("8.8"));
        let ev = json!({"type":"message","channel_type":"channel","channel":"C1","user":"U1","text":"other","ts":"9.9","thread_ts":"8.8","parent_user_id":"U2"});
        assert!(from_event(&payload("Ev", ev), &me(), GroupMode::Mention).is_err());
    }

    #[test]
    fn commands_pass_through() {
        assert_eq!(clean_text("<@UBOT> /stop", "UBOT"), "/stop");
        assert_eq!(
            clean_text("<@UBOT|clawbot>: /approve 12 always", "UBOT"),
            "/approve 12 always"
        );
        assert_eq!(clean_text("/stop@clawbot", "UBOT"), "/stop");
        assert_eq!(clean_text("/deny@bot 7", "UBOT"), "/deny 7");
        assert_eq!(clean_text("mail me at a@b.c", "UBOT"), "mail me at a@b.c");
        let p =
            json!({"command":"/stop","text":"","user_id":"U1","channel_id":"C1","trigger_id":"t1"});
        let i = from_slash_command(&p).unwrap();
        assert_eq!(
            (i.content.as_str(), i.event_id.as_str()),
            ("/stop", "slash-t1")
        );
    }

    #[test]
    fn files_become_attachments_and_a_file_only_message_is_delivered() {
        let ev = json!({"type":"message","subtype":"file_share","channel_type":"im","channel":"D1","user":"U1","text":"","ts":"3.3",
        "files":[
            {"id":"F1","name":"cat.png","mimetype":"image/png","size":12,"url_private":"https://files.slack.com/files-pri/T1-F1/cat.png","url_private_download":"https://files.slack.com/files-pri/T1-F1/download/cat.png"},
            {"id":"F2","name":"audio_message.webm","mimetype":"audio/webm","subtype":"slack_audio","size":3,"duration_ms":2500,"url_private":"https://files.slack.com/files-pri/T1-F2/a.webm"},
            {"id":"F3","file_access":"check_file_info"},
            {"name":"no id"},
            {"id":"F4","mode":"tombstone"},
            {"id":"F5","mode":"external","is_external":true,"url_private":"https://docs.example/x"}
        ]});
        let i = from_event(&payload("EvF", ev), &me(), GroupMode::Mention).unwrap();
        assert_eq!(i.content, "");
        assert_eq!(i.attachments.len(), 3);
        let a = &i.attachments[0];
        assert_eq!(
            (
                a.kind,
                a.id.as_str(),
                a.name.as_deref(),
                a.mime.as_deref(),
                a.size
            ),
            (
                MediaKind::Image,
                "F1",
                Some("cat.png"),
                Some("image/png"),
                Some(12)
            )
        );
        assert_eq!(
            a.url.as_deref(),
            Some("https://files.slack.com/files-pri/T1-F1/download/cat.png")
        );
        let v = &i.attachments[1];
        assert_eq!((v.kind, v.duration_secs), (MediaKind::Voice, Some(3)));
        assert_eq!(
            v.url.as_deref(),
            Some("https://files.slack.com/files-pri/T1-F2/a.webm")
        );
        let c = &i.attachments[2];
        assert_eq!((c.kind, c.url.as_deref()), (MediaKind::Document, None));
        // In a channel a file without a mention is not for the bot; with one it is.
        let ev = json!({"type":"message","subtype":"file_share","channel_type":"channel","channel":"C1","user":"U1","text":"","ts":"4.4",
            "files":[{"id":"F1","name":"x.pdf","mimetype":"application/pdf"}]});
        assert!(from_event(&payload("EvC", ev), &me(), GroupMode::Mention).is_err());
        let ev = json!({"type":"app_mention","channel":"C1","user":"U1","text":"<@UBOT> look","ts":"4.5",
            "files":[{"id":"F1","name":"x.pdf","mimetype":"application/pdf"}]});
        let i = from_event(&payload("EvM", ev), &me(), GroupMode::Mention).unwrap();
        assert_eq!((i.content.as_str(), i.attachments.len()), ("look", 1));
        // Edits and bot files stay ignored.
        let ev = json!({"type":"message","subtype":"message_changed","channel_type":"im","channel":"D1","user":"U1","ts":"5.5",
            "files":[{"id":"F1"}]});
        assert!(from_event(&payload("EvE", ev), &me(), GroupMode::Mention).is_err());
        let ev = json!({"type":"message","subtype":"file_share","bot_id":"B9","channel_type":"im","channel":"D1","user":"U9","ts":"5.6",
            "files":[{"id":"F1"}]});
        assert!(from_event(&payload("EvB", ev), &me(), GroupMode::Mention).is_err());
    }
}
