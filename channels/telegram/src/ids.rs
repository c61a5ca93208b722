//! Telegram's ids as types, parsed once where they enter the adapter's send and delivery code
//! (an update's numbers as a delivery is recorded, the daemon's chat, thread and event ids of
//! an outbound message) and written out only in a Bot API payload or as the daemon's string
//! ids, whose form does not change (`ChatId` is the decimal chat id, `ThreadId` the topic's).
//!
//! Parsing and printing only: nothing here calls the API or decides what to send.

use std::fmt;
use std::str::FromStr;

use clawft_channel_core::{ChannelError, ChatId, PlatformEventId, ThreadId};
use serde::{Deserialize, Serialize};

/// A chat to send to: its numeric id (`-1001234567890`), or a public chat's `@username` (what
/// an operator may name in `weft send`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub(crate) enum Chat {
    /// The numeric id (what the adapter reports as the daemon's chat id).
    Id(i64),
    /// `@channelusername`.
    Username(String),
}

impl Chat {
    /// The chat the daemon's `chat` names.
    pub(crate) fn of(chat: &ChatId) -> Self {
        match chat.as_str().parse::<i64>() {
            Ok(n) => Chat::Id(n),
            Err(_) => Chat::Username(chat.as_str().to_string()),
        }
    }
}

impl fmt::Display for Chat {
    /// The `chat_id` form field of an upload: the number, or the `@username`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Chat::Id(n) => write!(f, "{n}"),
            Chat::Username(u) => f.write_str(u),
        }
    }
}

/// A message in a chat (`message_id`): what a draft, a chunk or a file became, and what a
/// reply quotes. Journaled as its decimal form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct MessageId(pub i64);

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for MessageId {
    type Err = std::num::ParseIntError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(MessageId)
    }
}

/// A forum topic of a chat (`message_thread_id`): the daemon's thread id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub(crate) struct Topic(pub i64);

impl Topic {
    /// The topic the daemon's `thread` names, if any.
    ///
    /// # Errors
    /// [`ChannelError::Rejected`] for a thread id that is not a number.
    pub(crate) fn of(thread: Option<&ThreadId>) -> Result<Option<Self>, ChannelError> {
        thread
            .map(|t| {
                t.as_str().parse::<i64>().map(Topic).map_err(|_| {
                    ChannelError::Rejected(format!(
                        "Telegram thread ids are numeric message_thread_ids, got `{t}`"
                    ))
                })
            })
            .transpose()
    }
}

impl fmt::Display for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An update (`update_id`): the daemon's event id of the message it carried. As the
/// `getUpdates` offset: the first update not confirmed yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub(crate) struct UpdateId(pub i64);

impl UpdateId {
    /// The offset that confirms this update (and every one before it).
    pub(crate) fn next(self) -> Self {
        UpdateId(self.0.saturating_add(1))
    }

    /// The update an outbound message answers (`in_reply_to`), if it names one.
    pub(crate) fn of(event: &PlatformEventId) -> Option<Self> {
        event.as_str().parse().ok().map(UpdateId)
    }

    /// The daemon's event id of this update.
    pub(crate) fn event_id(self) -> PlatformEventId {
        PlatformEventId::new(self.0.to_string())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ids_keep_the_daemons_string_forms() {
        assert_eq!(Chat::of(&ChatId::new("-1001")), Chat::Id(-1001));
        assert_eq!(
            Chat::of(&ChatId::new("@news")),
            Chat::Username("@news".into())
        );
        assert_eq!(serde_json::to_string(&Chat::Id(-5)).unwrap(), "-5");
        assert_eq!(
            serde_json::to_string(&Chat::Username("@n".into())).unwrap(),
            "\"@n\""
        );
        assert_eq!(Chat::Id(-5).to_string(), "-5");
        assert_eq!("12".parse::<MessageId>().unwrap(), MessageId(12));
        assert_eq!(MessageId(12).to_string(), "12");
        assert_eq!(
            Topic::of(Some(&ThreadId::new("7"))).unwrap(),
            Some(Topic(7))
        );
        assert!(Topic::of(Some(&ThreadId::new("x"))).is_err());
        let ev = UpdateId(900).event_id();
        assert_eq!(
            (ev.as_str(), UpdateId::of(&ev)),
            ("900", Some(UpdateId(900)))
        );
        assert_eq!(UpdateId::of(&PlatformEventId::new("cron:1")), None);
        assert_eq!(UpdateId(900).next(), UpdateId(901));
    }
}
