//! Which signal-cli envelopes become inbound events, and how.
//!
//! - Only `dataMessage`s with text or attachments from someone else: typing, receipts, calls,
//!   sync messages (the account's own sends from a linked phone), reactions, deletions, group
//!   updates and stories are skipped.
//! - The sender is the envelope's `sourceNumber` (E.164) when it has one, else its
//!   `sourceUuid` (ACI): what `allow_from` and pairing match.
//! - A direct message's chat is the sender; a group message's chat is `group.<groupId>`.
//! - In groups with `group_mode = "mention"` only messages that @mention the account or quote
//!   one of its messages are delivered; the mention is removed from the text. Other mentions
//!   (U+FFFC placeholders) read as `@name`.
//! - The event id is `<sender>:<timestamp>`: Signal identifies a message by its author and its
//!   timestamp, so a replay (a reconnect from an older cursor) is the same event.

use clawft_channel_core::media::{MediaKind, MediaRef};
use clawft_channel_core::{ChannelId, ChatId, GroupMode, InboundEvent, PlatformEventId, UserId};
use serde_json::Value;

/// The prefix of a group chat id.
pub const GROUP_PREFIX: &str = "group.";

/// Signal's placeholder for a mention in the text.
const MENTION: char = '\u{FFFC}';

/// What the parser needs to know about the account and channel.
pub(crate) struct Me<'a> {
    pub channel: &'a ChannelId,
    pub number: &'a str,
    pub group_mode: GroupMode,
}

/// The sender of an envelope: its number, else its ACI.
pub(crate) fn sender(env: &Value) -> Option<String> {
    let s = |k: &str| {
        env.get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    s("sourceNumber")
        .or_else(|| s("sourceUuid"))
        .or_else(|| s("source"))
}

fn is_me(me: &Me<'_>, v: &Value) -> bool {
    ["number", "authorNumber", "author"]
        .iter()
        .any(|k| v.get(*k).and_then(Value::as_str) == Some(me.number))
}

/// The inbound event an envelope carries, if it is one to deliver.
pub(crate) fn parse(me: &Me<'_>, env: &Value, received_at_ms: u64) -> Option<InboundEvent> {
    let dm = env.get("dataMessage").filter(|d| d.is_object())?;
    let from = sender(env)?;
    if from == me.number {
        return None;
    }
    if dm.get("reaction").is_some_and(|r| !r.is_null())
        || dm.get("remoteDelete").is_some_and(|r| !r.is_null())
    {
        return None;
    }
    let ts = env
        .get("timestamp")
        .and_then(Value::as_u64)
        .or_else(|| dm.get("timestamp").and_then(Value::as_u64))?;
    let group = dm
        .pointer("/groupInfo/groupId")
        .and_then(Value::as_str)
        .filter(|g| !g.is_empty());
    let text = dm.get("message").and_then(Value::as_str).unwrap_or("");
    let mentions: Vec<&Value> = dm
        .get("mentions")
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let mentioned = mentions.iter().any(|m| is_me(me, m));
    let quoted_me = dm.get("quote").is_some_and(|q| is_me(me, q));
    if group.is_some() && me.group_mode == GroupMode::Mention && !mentioned && !quoted_me {
        return None;
    }
    let content = replace_mentions(me, text, &mentions);
    let attachments: Vec<MediaRef> = dm
        .get("attachments")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(attachment).collect())
        .unwrap_or_default();
    if content.trim().is_empty() && attachments.is_empty() {
        return None;
    }
    let chat = match group {
        Some(g) => format!("{GROUP_PREFIX}{g}"),
        None => from.clone(),
    };
    Some(InboundEvent {
        channel: me.channel.clone(),
        chat: ChatId::new(chat),
        thread: None,
        sender: UserId::new(from.clone()),
        // The profile name signal-cli knows for the sender (its contact or profile).
        sender_name: env
            .get("sourceName")
            .and_then(Value::as_str)
            .and_then(|n| clawft_channel_core::display_name([n])),
        event_id: PlatformEventId::new(format!("{from}:{ts}")),
        content,
        received_at_ms,
        attachments,
        origin: Default::default(),
    })
}

/// The text with each U+FFFC placeholder replaced: the account's own mention removed, the
/// others as `@name`.
fn replace_mentions(me: &Me<'_>, text: &str, mentions: &[&Value]) -> String {
    if mentions.is_empty() || !text.contains(MENTION) {
        return text.trim().to_string();
    }
    // Mentions by UTF-16 start, in order.
    let mut by_start: Vec<(u64, String)> = mentions
        .iter()
        .filter_map(|m| {
            let start = m.get("start").and_then(Value::as_u64)?;
            let name = if is_me(me, m) {
                String::new()
            } else {
                let n = m
                    .get("name")
                    .or_else(|| m.get("number"))
                    .and_then(Value::as_str)
                    .unwrap_or("someone");
                format!("@{n}")
            };
            Some((start, name))
        })
        .collect();
    by_start.sort();
    let mut out = String::with_capacity(text.len());
    let mut pos: u64 = 0;
    for c in text.chars() {
        if c == MENTION {
            match by_start.iter().find(|(s, _)| *s == pos) {
                Some((_, name)) => out.push_str(name),
                None => out.push('@'),
            }
        } else {
            out.push(c);
        }
        pos += c.len_utf16() as u64;
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// An attachment of a `dataMessage` (signal-cli's `JsonAttachment`).
fn attachment(a: &Value) -> Option<MediaRef> {
    let id = a
        .get("id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())?;
    let mime = a
        .get("contentType")
        .and_then(Value::as_str)
        .map(str::to_string);
    let kind = match mime.as_deref().map(MediaKind::of_mime) {
        // Signal sends voice notes as audio attachments (AAC); a file of sound is one too.
        Some(MediaKind::Audio)
            if a.get("voiceNote").and_then(Value::as_bool) != Some(false)
                && a.get("filename").is_none_or(Value::is_null) =>
        {
            MediaKind::Voice
        }
        Some(k) => k,
        None => MediaKind::Document,
    };
    let mut m = MediaRef::new(kind, id);
    m.name = a
        .get("filename")
        .and_then(Value::as_str)
        .map(str::to_string);
    m.mime = mime;
    m.size = a.get("size").and_then(Value::as_u64);
    Some(m)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn me(ch: &ChannelId, mode: GroupMode) -> Me<'_> {
        Me {
            channel: ch,
            number: "+15550000000",
            group_mode: mode,
        }
    }

    fn envelope(dm: Value) -> Value {
        json!({"source": "+15551111111", "sourceNumber": "+15551111111", "sourceUuid": "a1b2c3d4-0000-4000-8000-000000000001",
            "sourceName": "Alice", "sourceDevice": 1, "timestamp": 1700000000123u64, "dataMessage": dm})
    }

    #[test]
    fn direct_and_group_messages_mentions_and_skips() {
        let ch = ChannelId::new("signal");
        let m = me(&ch, GroupMode::Mention);
        let ev = parse(
            &m,
            &envelope(json!({"timestamp": 1700000000123u64, "message": "hi"})),
            5,
        )
        .unwrap();
        assert_eq!(ev.chat.as_str(), "+15551111111");
        assert_eq!(ev.sender.as_str(), "+15551111111");
        assert_eq!(ev.event_id.as_str(), "+15551111111:1700000000123");
        // A group message that does not mention the account is not delivered...
        let g = json!({"message": "hello all", "groupInfo": {"groupId": "R3JvdXA=", "type": "DELIVER"}});
        assert!(parse(&m, &envelope(g.clone()), 5).is_none());
        // ...unless the mode is `all`.
        let all = me(&ch, GroupMode::All);
        assert_eq!(
            parse(&all, &envelope(g), 5).unwrap().chat.as_str(),
            "group.R3JvdXA="
        );
        // A mention of the account is removed, another one reads as @name.
        let g = json!({"message": "\u{FFFC} ask \u{FFFC} please", "groupInfo": {"groupId": "R3JvdXA="},
            "mentions": [{"name": "+15550000000", "number": "+15550000000", "start": 0, "length": 1},
                         {"name": "Bob", "number": "+15552222222", "start": 6, "length": 1}]});
        assert_eq!(
            parse(&m, &envelope(g), 5).unwrap().content,
            "ask @Bob please"
        );
        // Typing, receipts, reactions and the account's own syncs are skipped.
        let typing = json!({"sourceNumber": "+15551111111", "timestamp": 1, "typingMessage": {"action": "STARTED", "timestamp": 1}});
        assert!(parse(&m, &typing, 5).is_none());
        let reaction = envelope(json!({"reaction": {"emoji": "👍", "targetSentTimestamp": 1}}));
        assert!(parse(&m, &reaction, 5).is_none());
    }

    #[test]
    fn attachments_become_media_refs() {
        let ch = ChannelId::new("signal");
        let m = me(&ch, GroupMode::Mention);
        let ev = parse(
            &m,
            &envelope(json!({"attachments": [
                {"contentType": "image/png", "filename": "cat.png", "id": "Xy12.png", "size": 120},
                {"contentType": "audio/aac", "filename": null, "id": "v01.aac", "size": 50}]})),
            5,
        )
        .unwrap();
        assert_eq!(ev.content, "");
        assert_eq!(ev.attachments.len(), 2);
        assert_eq!(ev.attachments[0].kind, MediaKind::Image);
        assert_eq!(ev.attachments[0].id, "Xy12.png");
        assert_eq!(ev.attachments[1].kind, MediaKind::Voice);
    }
}
