//! Which updates become deliveries, and with what text (pure functions).
//!
//! Only `message` updates are fetched (`allowed_updates = ["message"]`): edited messages,
//! channel posts, reactions and member changes are neither fetched nor delivered; an edit of a
//! message already answered would otherwise start a second turn. Text comes from `text` or,
//! for media, `caption`. A photo, voice note, audio, video, video note or document is
//! reported as an attachment ([`MediaRef`]) and delivered even without a caption (in groups it
//! still has to be addressed to the bot); a message with neither text nor such a file (a
//! sticker, a location) is skipped.

use clawft_channel_core::command::is_command_name;
use clawft_channel_core::media::{MediaKind, MediaRef};
use serde::Deserialize;
use serde_json::Value;

use crate::api::Me;
use crate::GroupMode;

#[derive(Debug, Deserialize)]
struct User {
    id: i64,
    #[serde(default)]
    is_bot: bool,
    #[serde(default)]
    first_name: String,
    #[serde(default)]
    last_name: String,
    #[serde(default)]
    username: String,
}

impl User {
    /// "First Last", or "@username" for an account without a name.
    fn display_name(&self) -> Option<String> {
        clawft_channel_core::display_name([self.first_name.as_str(), self.last_name.as_str()])
            .or_else(|| {
                (!self.username.is_empty())
                    .then(|| {
                        clawft_channel_core::display_name([format!("@{}", self.username).as_str()])
                    })
                    .flatten()
            })
    }
}

#[derive(Debug, Deserialize)]
struct Chat {
    id: i64,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Debug, Deserialize)]
struct Entity {
    #[serde(rename = "type")]
    kind: String,
    offset: usize,
    length: usize,
    #[serde(default)]
    user: Option<User>,
}

#[derive(Debug, Deserialize)]
struct Message {
    message_id: i64,
    #[serde(default)]
    message_thread_id: Option<i64>,
    #[serde(default)]
    is_topic_message: bool,
    #[serde(default)]
    from: Option<User>,
    chat: Chat,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    caption: Option<String>,
    #[serde(default)]
    entities: Vec<Entity>,
    #[serde(default)]
    caption_entities: Vec<Entity>,
    #[serde(default)]
    reply_to_message: Option<Box<ReplyTo>>,
    #[serde(default)]
    photo: Vec<PhotoSize>,
    #[serde(default)]
    voice: Option<File>,
    #[serde(default)]
    audio: Option<File>,
    #[serde(default)]
    video: Option<File>,
    #[serde(default)]
    video_note: Option<File>,
    #[serde(default)]
    document: Option<File>,
}

/// One size of a photo (Telegram sends several, from a thumbnail up).
#[derive(Debug, Deserialize)]
struct PhotoSize {
    file_id: String,
    #[serde(default)]
    width: u32,
    #[serde(default)]
    height: u32,
    #[serde(default)]
    file_size: Option<u64>,
}

/// The fields the file objects (`Voice`, `Audio`, `Video`, `VideoNote`, `Document`) share.
#[derive(Debug, Deserialize)]
struct File {
    file_id: String,
    #[serde(default)]
    file_name: Option<String>,
    #[serde(default)]
    mime_type: Option<String>,
    #[serde(default)]
    file_size: Option<u64>,
    #[serde(default)]
    duration: Option<u32>,
}

/// Longest side of the photo size picked for the model (larger ones cost tokens for nothing).
const PHOTO_MAX_SIDE: u32 = 2048;
/// The Bot API serves files up to 20 MB (`getFile`).
pub(crate) const DOWNLOAD_LIMIT: u64 = 20 * 1024 * 1024;

/// The photo size to download: the largest whose longer side is at most 2048 px and which the
/// Bot API serves (≤ 20 MB), else the smallest.
fn pick_photo(sizes: &[PhotoSize]) -> Option<&PhotoSize> {
    let area = |p: &PhotoSize| u64::from(p.width) * u64::from(p.height);
    sizes
        .iter()
        .filter(|p| {
            p.width.max(p.height) <= PHOTO_MAX_SIDE
                && p.file_size.is_none_or(|s| s <= DOWNLOAD_LIMIT)
        })
        .max_by_key(|p| area(p))
        .or_else(|| sizes.iter().min_by_key(|p| area(p)))
}

fn file_ref(kind: MediaKind, f: &File) -> MediaRef {
    MediaRef {
        kind,
        id: f.file_id.clone(),
        name: f.file_name.clone(),
        mime: f.mime_type.clone(),
        size: f.file_size,
        url: None,
        duration_secs: f.duration,
    }
}

/// The files of a message (Telegram puts at most one in a message; an album is several
/// messages).
fn attachments_of(msg: &Message) -> Vec<MediaRef> {
    let mut out = Vec::new();
    if let Some(p) = pick_photo(&msg.photo) {
        out.push(MediaRef {
            mime: Some("image/jpeg".into()),
            size: p.file_size,
            ..MediaRef::new(MediaKind::Image, p.file_id.clone())
        });
    }
    let files = [
        (MediaKind::Voice, &msg.voice),
        (MediaKind::Audio, &msg.audio),
        (MediaKind::Video, &msg.video),
        (MediaKind::Video, &msg.video_note),
        // An image sent "as a file" stays a document: the sender chose not to compress it.
        (MediaKind::Document, &msg.document),
    ];
    for (kind, f) in files {
        if let Some(f) = f {
            out.push(file_ref(kind, f));
        }
    }
    out
}

#[derive(Debug, Deserialize)]
struct ReplyTo {
    message_id: i64,
    #[serde(default)]
    from: Option<User>,
}

/// A message to deliver.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Incoming {
    pub chat: i64,
    pub thread: Option<i64>,
    pub sender: i64,
    pub sender_name: Option<String>,
    pub message_id: i64,
    pub group: bool,
    pub text: String,
    pub attachments: Vec<MediaRef>,
}

/// What to do with one update.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    Deliver(Incoming),
    /// Confirm it without delivering; the reason is logged.
    Skip(&'static str),
}

/// The update's id, if it has one.
pub(crate) fn update_id(update: &Value) -> Option<i64> {
    update.get("update_id").and_then(Value::as_i64)
}

fn utf16_slice(units: &[u16], offset: usize, length: usize) -> Option<String> {
    let end = offset.checked_add(length)?;
    units.get(offset..end).map(String::from_utf16_lossy)
}

/// Decide what to do with a `getUpdates` entry.
pub(crate) fn decide(update: &Value, me: &Me, mode: GroupMode) -> Decision {
    let Some(raw) = update.get("message") else {
        return Decision::Skip("not a new message");
    };
    // Deserialised from the borrowed value: the text is copied once, not the whole update.
    let msg: Message = match Message::deserialize(raw) {
        Ok(m) => m,
        Err(_) => return Decision::Skip("message without the expected fields"),
    };
    let Some(from) = &msg.from else {
        return Decision::Skip("no sender");
    };
    if from.is_bot {
        return Decision::Skip("sent by a bot");
    }
    let group = match msg.chat.kind.as_str() {
        "private" => false,
        "group" | "supergroup" => true,
        _ => return Decision::Skip("not a private or group chat"),
    };
    let attachments = attachments_of(&msg);
    let (text, entities) = match (&msg.text, &msg.caption) {
        (Some(t), _) => (t.as_str(), &msg.entities),
        (None, Some(c)) => (c.as_str(), &msg.caption_entities),
        (None, None) if !attachments.is_empty() => ("", &msg.caption_entities),
        (None, None) => return Decision::Skip("no text"),
    };
    // UTF-16 copies only when there are entities to look up (a mention, a command).
    let units: Vec<u16> = if entities.is_empty() {
        Vec::new()
    } else {
        text.encode_utf16().collect()
    };
    let me_at = format!("@{}", me.username);
    let mut mentioned = false;
    // UTF-16 ranges to cut out of the text (mentions of the bot, `@bot` of a command).
    let mut cuts: Vec<(usize, usize)> = Vec::new();
    let mut command: Option<String> = None;
    for e in entities {
        let Some(s) = utf16_slice(&units, e.offset, e.length) else {
            continue;
        };
        match e.kind.as_str() {
            "mention" if s.eq_ignore_ascii_case(&me_at) => {
                mentioned = true;
                cuts.push((e.offset, e.length));
            }
            "text_mention" if e.user.as_ref().is_some_and(|u| u.id == me.id) => {
                mentioned = true;
            }
            "bot_command" if e.offset == 0 => {
                let (name, target) = match s.split_once('@') {
                    Some((n, t)) => (n, Some(t)),
                    None => (s.as_str(), None),
                };
                match target {
                    Some(t) if t.eq_ignore_ascii_case(&me.username) => {
                        mentioned = true;
                        let at = name.encode_utf16().count();
                        cuts.push((e.offset + at, e.length.saturating_sub(at)));
                    }
                    Some(_) => return Decision::Skip("command for another bot"),
                    None => {}
                }
                command = Some(name.trim_start_matches('/').to_ascii_lowercase());
            }
            _ => {}
        }
    }
    let reply_to_bot = msg.reply_to_message.as_ref().is_some_and(|r| {
        // In a forum topic every message "replies" to the topic's first message.
        let topic_root = msg.is_topic_message && Some(r.message_id) == msg.message_thread_id;
        !topic_root && r.from.as_ref().is_some_and(|u| u.id == me.id)
    });
    // Commands pass in groups even without a mention (the daemon checks the sender).
    let known_command = command.as_deref().is_some_and(is_command_name);
    if group && mode == GroupMode::Mention && !mentioned && !reply_to_bot && !known_command {
        return Decision::Skip("group message not addressed to the bot");
    }
    let text = if cuts.is_empty() {
        text.trim().to_string()
    } else {
        cut(&units, &mut cuts)
    };
    if text.is_empty() && attachments.is_empty() {
        return Decision::Skip("empty after removing the mention");
    }
    Decision::Deliver(Incoming {
        chat: msg.chat.id,
        thread: msg.message_thread_id.filter(|_| msg.is_topic_message),
        sender: from.id,
        sender_name: from.display_name(),
        message_id: msg.message_id,
        group,
        text,
        attachments,
    })
}

/// Remove the UTF-16 ranges from the text, with one space next to each, and trim.
fn cut(units: &[u16], cuts: &mut [(usize, usize)]) -> String {
    cuts.sort_unstable();
    let mut out: Vec<u16> = Vec::with_capacity(units.len());
    let mut i = 0;
    let space = u16::from(b' ');
    for &(off, len) in cuts.iter() {
        if off < i {
            continue;
        }
        out.extend_from_slice(&units[i..off.min(units.len())]);
        i = (off + len).min(units.len());
        // "@bot hello" → "hello", "hi @bot there" → "hi there".
        let before_blank = out
            .last()
            .is_none_or(|c| *c == space || *c == u16::from(b'\n'));
        if before_blank && units.get(i) == Some(&space) {
            i += 1;
        }
    }
    out.extend_from_slice(&units[i.min(units.len())..]);
    String::from_utf16_lossy(&out).trim().to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    fn me() -> Me {
        Me {
            id: 42,
            username: "clawbot".into(),
        }
    }

    fn upd(message: Value) -> Value {
        json!({"update_id": 7, "message": message})
    }

    fn group_msg(text: &str, entities: Value) -> Value {
        upd(json!({
            "message_id": 5, "date": 0,
            "chat": {"id": -100, "type": "supergroup", "title": "g"},
            "from": {"id": 9, "is_bot": false, "first_name": "U"},
            "text": text, "entities": entities,
        }))
    }

    fn text_of(d: Decision) -> String {
        match d {
            Decision::Deliver(i) => i.text,
            Decision::Skip(why) => panic!("skipped: {why}"),
        }
    }

    #[test]
    fn private_message_is_delivered() {
        let d = decide(
            &upd(json!({
                "message_id": 3, "date": 0,
                "chat": {"id": 9, "type": "private"},
                "from": {"id": 9, "is_bot": false, "first_name": "U", "username": "u"},
                "text": "hello 😀",
            })),
            &me(),
            GroupMode::Mention,
        );
        assert_eq!(
            d,
            Decision::Deliver(Incoming {
                chat: 9,
                thread: None,
                sender: 9,
                sender_name: Some("U".into()),
                message_id: 3,
                group: false,
                text: "hello 😀".into(),
                attachments: Vec::new(),
            })
        );
    }

    #[test]
    fn mentions_are_detected_in_utf16_and_stripped() {
        // "😀" is two UTF-16 units: the entity offset counts them.
        let d = decide(
            &group_msg(
                "😀 @ClawBot what's up",
                json!([{"type": "mention", "offset": 3, "length": 8}]),
            ),
            &me(),
            GroupMode::Mention,
        );
        assert_eq!(text_of(d), "😀 what's up");
        let d = decide(
            &group_msg(
                "@clawbot hi",
                json!([{"type": "mention", "offset": 0, "length": 8}]),
            ),
            &me(),
            GroupMode::Mention,
        );
        assert_eq!(text_of(d), "hi");
    }

    #[test]
    fn unaddressed_group_messages_are_skipped_unless_mode_all() {
        let m = group_msg(
            "@otherbot hi",
            json!([{"type": "mention", "offset": 0, "length": 9}]),
        );
        assert!(matches!(
            decide(&m, &me(), GroupMode::Mention),
            Decision::Skip(_)
        ));
        assert_eq!(text_of(decide(&m, &me(), GroupMode::All)), "@otherbot hi");
    }

    #[test]
    fn replies_to_the_bot_count_as_mentions_but_not_topic_roots() {
        let mut m = group_msg("yes", json!([]));
        m["message"]["reply_to_message"] = json!({"message_id": 4, "date": 0, "chat": {"id": -100, "type": "supergroup"}, "from": {"id": 42, "is_bot": true, "first_name": "B"}});
        assert_eq!(text_of(decide(&m, &me(), GroupMode::Mention)), "yes");
        m["message"]["message_thread_id"] = json!(4);
        m["message"]["is_topic_message"] = json!(true);
        assert!(matches!(
            decide(&m, &me(), GroupMode::Mention),
            Decision::Skip(_)
        ));
    }

    #[test]
    fn commands_are_normalised() {
        let d = decide(
            &group_msg(
                "/stop@ClawBot",
                json!([{"type": "bot_command", "offset": 0, "length": 13}]),
            ),
            &me(),
            GroupMode::Mention,
        );
        assert_eq!(text_of(d), "/stop");
        let d = decide(
            &group_msg(
                "/approve@clawbot abc always",
                json!([{"type": "bot_command", "offset": 0, "length": 16}]),
            ),
            &me(),
            GroupMode::Mention,
        );
        assert_eq!(text_of(d), "/approve abc always");
        // A bare known command in a group is passed through; one for another bot is not.
        let d = decide(
            &group_msg(
                "/deny x1",
                json!([{"type": "bot_command", "offset": 0, "length": 5}]),
            ),
            &me(),
            GroupMode::Mention,
        );
        assert_eq!(text_of(d), "/deny x1");
        // Every command the session answers passes a group without a mention: a bare `/model`
        // and `/model NAME` too (they were dropped here while `/stop` passed).
        for (text, len) in [
            ("/model", 6),
            ("/model gpt-4o", 6),
            ("/compact", 8),
            ("/new", 4),
        ] {
            let d = decide(
                &group_msg(
                    text,
                    json!([{"type": "bot_command", "offset": 0, "length": len}]),
                ),
                &me(),
                GroupMode::Mention,
            );
            assert_eq!(text_of(d), text);
        }
        let d = decide(
            &group_msg(
                "/stop@otherbot",
                json!([{"type": "bot_command", "offset": 0, "length": 14}]),
            ),
            &me(),
            GroupMode::All,
        );
        assert!(matches!(d, Decision::Skip(_)));
    }

    #[test]
    fn bots_channels_and_non_text_are_skipped() {
        let mut m = group_msg(
            "@clawbot hi",
            json!([{"type": "mention", "offset": 0, "length": 8}]),
        );
        m["message"]["from"]["is_bot"] = json!(true);
        assert!(matches!(
            decide(&m, &me(), GroupMode::All),
            Decision::Skip(_)
        ));
        let mut m = group_msg("x", json!([]));
        m["message"]["chat"]["type"] = json!("channel");
        assert!(matches!(
            decide(&m, &me(), GroupMode::All),
            Decision::Skip(_)
        ));
        let mut m = group_msg("x", json!([]));
        m["message"].as_object_mut().unwrap().remove("text");
        assert!(matches!(
            decide(&m, &me(), GroupMode::All),
            Decision::Skip(_)
        ));
        m["message"]["caption"] = json!("a photo");
        assert_eq!(text_of(decide(&m, &me(), GroupMode::All)), "a photo");
        assert!(matches!(
            decide(
                &json!({"update_id": 1, "edited_message": {}}),
                &me(),
                GroupMode::All
            ),
            Decision::Skip(_)
        ));
        // Hostile entity offsets never panic.
        let m = group_msg(
            "hi",
            json!([{"type": "mention", "offset": 999, "length": 999999}]),
        );
        assert!(matches!(
            decide(&m, &me(), GroupMode::Mention),
            Decision::Skip(_)
        ));
    }

    /// The text and its entities moved to `caption` and `caption_entities`.
    fn as_caption(m: &mut Value) {
        let msg = m["message"].as_object_mut().unwrap();
        let text = msg.remove("text").unwrap();
        let entities = msg.remove("entities").unwrap();
        msg.insert("caption".into(), text);
        msg.insert("caption_entities".into(), entities);
    }

    fn attachments(d: Decision) -> Vec<MediaRef> {
        match d {
            Decision::Deliver(i) => i.attachments,
            Decision::Skip(why) => panic!("skipped: {why}"),
        }
    }

    #[test]
    fn the_photo_size_is_the_largest_within_2048_px_and_20_mb() {
        let photo = |sizes: Value| {
            let mut m = group_msg(
                "@clawbot look",
                json!([{"type": "mention", "offset": 0, "length": 8}]),
            );
            as_caption(&mut m);
            m["message"]["photo"] = sizes;
            let a = attachments(decide(&m, &me(), GroupMode::Mention));
            assert_eq!(a.len(), 1);
            assert_eq!(a[0].kind, MediaKind::Image);
            assert_eq!(a[0].mime.as_deref(), Some("image/jpeg"));
            a[0].id.clone()
        };
        let big = 21 * 1024 * 1024;
        assert_eq!(
            photo(json!([
                {"file_id": "s", "width": 90, "height": 60, "file_size": 1000},
                {"file_id": "m", "width": 1280, "height": 853, "file_size": 90000},
                {"file_id": "l", "width": 2048, "height": 1365},
                {"file_id": "xl", "width": 2560, "height": 1706, "file_size": 400000},
            ])),
            "l"
        );
        assert_eq!(
            photo(json!([
                {"file_id": "m", "width": 1280, "height": 853, "file_size": 90000},
                {"file_id": "l", "width": 2000, "height": 1500, "file_size": big},
            ])),
            "m"
        );
        // None fits: the smallest.
        assert_eq!(
            photo(json!([
                {"file_id": "xl", "width": 4000, "height": 3000},
                {"file_id": "xxl", "width": 8000, "height": 6000},
            ])),
            "xl"
        );
    }

    #[test]
    fn files_without_text_are_delivered_only_when_addressed() {
        let mut m = upd(json!({
            "message_id": 3, "date": 0,
            "chat": {"id": 9, "type": "private"},
            "from": {"id": 9, "is_bot": false, "first_name": "U"},
            "document": {"file_id": "D1", "file_unique_id": "u", "file_name": "a.png",
                         "mime_type": "image/png", "file_size": 12},
        }));
        let a = attachments(decide(&m, &me(), GroupMode::Mention));
        assert_eq!(
            a,
            vec![MediaRef {
                name: Some("a.png".into()),
                mime: Some("image/png".into()),
                size: Some(12),
                ..MediaRef::new(MediaKind::Document, "D1")
            }]
        );
        m["message"]["chat"] = json!({"id": -100, "type": "supergroup"});
        assert!(matches!(
            decide(&m, &me(), GroupMode::Mention),
            Decision::Skip(_)
        ));
        m["message"]["reply_to_message"] = json!({"message_id": 4, "date": 0, "from": {"id": 42, "is_bot": true, "first_name": "B"}});
        assert_eq!(attachments(decide(&m, &me(), GroupMode::Mention)).len(), 1);
        // A caption that is only the mention: delivered with empty text.
        let mut m = group_msg(
            "@clawbot",
            json!([{"type": "mention", "offset": 0, "length": 8}]),
        );
        as_caption(&mut m);
        m["message"]["voice"] =
            json!({"file_id": "V", "file_unique_id": "v", "duration": 4, "mime_type": "audio/ogg"});
        match decide(&m, &me(), GroupMode::Mention) {
            Decision::Deliver(i) => {
                assert_eq!(i.text, "");
                assert_eq!(i.attachments[0].kind, MediaKind::Voice);
                assert_eq!(i.attachments[0].duration_secs, Some(4));
            }
            d => panic!("{d:?}"),
        }
        // A sticker (no file we report) is still skipped.
        let mut m = group_msg("x", json!([]));
        m["message"].as_object_mut().unwrap().remove("text");
        m["message"]["sticker"] = json!({"file_id": "S"});
        assert!(matches!(
            decide(&m, &me(), GroupMode::All),
            Decision::Skip(_)
        ));
    }

    #[test]
    fn forum_topic_sets_the_thread() {
        let mut m = group_msg(
            "@clawbot hi",
            json!([{"type": "mention", "offset": 0, "length": 8}]),
        );
        m["message"]["message_thread_id"] = json!(77);
        m["message"]["is_topic_message"] = json!(true);
        match decide(&m, &me(), GroupMode::Mention) {
            Decision::Deliver(i) => assert_eq!(i.thread, Some(77)),
            d => panic!("{d:?}"),
        }
        // A reply thread in a non-forum group is not a topic.
        m["message"]["is_topic_message"] = json!(false);
        match decide(&m, &me(), GroupMode::Mention) {
            Decision::Deliver(i) => assert_eq!(i.thread, None),
            d => panic!("{d:?}"),
        }
    }
}
