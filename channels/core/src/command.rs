//! Chat commands: the one list of commands every adapter and the session use. The text of an
//! inbound message is parsed once into a [`ChatCommand`]; adapters that filter group messages
//! ask [`is_command_name`] so every command the session answers also passes them.

/// The user's answer to an approval request (`/approve ID [once|always]`, `/deny ID`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Run this once.
    Once,
    /// Run it and do not ask again for the same command in this session.
    Always,
    /// Do not run it.
    Deny,
}

/// The name of every chat command (without the `/`), as typed in a chat.
pub const NAMES: &[&str] = &[
    "stop", "new", "status", "help", "start", "compact", "model", "voice", "approve", "deny",
];

/// Whether `name` (without `/` and `@bot`, any case) is a chat command: adapters let these
/// through in groups even when the bot is not mentioned (the daemon still checks the sender).
pub fn is_command_name(name: &str) -> bool {
    NAMES.iter().any(|n| n.eq_ignore_ascii_case(name))
}

/// A command typed in a chat, answered by the session without a turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChatCommand {
    /// `/stop`: cancel the running turn and the session's subagents.
    Stop,
    /// `/new`: start a new conversation.
    New,
    /// `/status`: the session's state.
    Status,
    /// `/help` (and `/start`, what Telegram sends when a user opens the bot): the list of chat
    /// commands.
    Help,
    /// `/compact`: save notes to memory and summarise the older conversation now.
    Compact,
    /// `/model` (which model, and which the agent allows) or `/model NAME` (switch this chat).
    Model(Option<String>),
    /// `/voice` (when this chat's answers are spoken) or `/voice never|when_asked|to_voice`
    /// (set it for this chat; `/voice default` goes back to the agent's setting).
    Voice(Option<String>),
    /// `/approve ID [once|always]` or `/deny ID`: answer a pending approval.
    Approval {
        /// The approval's id.
        id: String,
        /// The answer.
        decision: Decision,
    },
}

/// What `/help` answers.
pub const HELP: &str = "Chat commands:\n/new: start a new conversation\n/stop: stop the running turn (and its subagents)\n/status: this session's state\n/compact: summarise the older conversation now (the model keeps a summary and the last turns; the history stays stored)\n/model [NAME]: the model of this chat, or switch to another the assistant allows\n/voice [never|when_asked|to_voice|default]: when answers are spoken (to_voice: a voice note is answered with a voice note)\n/approve ID [always]: allow a command the assistant asked to run\n/deny ID: refuse it\n/help: this list\nAnything else goes to the assistant.";

impl ChatCommand {
    /// The command `text` is, if it is one (surrounding whitespace ignored). Anything else,
    /// including an unknown `/word`, is a message for the model.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        match text {
            "/stop" => return Some(Self::Stop),
            "/new" => return Some(Self::New),
            "/status" => return Some(Self::Status),
            "/help" | "/start" => return Some(Self::Help),
            "/compact" => return Some(Self::Compact),
            _ => {}
        }
        let mut words = text.split_whitespace();
        let cmd = words.next()?;
        if cmd == "/start" {
            // Telegram deep links send `/start PAYLOAD`.
            return Some(Self::Help);
        }
        if cmd == "/model" {
            let name = words.next().map(str::to_string);
            return words.next().is_none().then_some(Self::Model(name));
        }
        if cmd == "/voice" {
            let mode = words.next().map(str::to_string);
            return words.next().is_none().then_some(Self::Voice(mode));
        }
        let id = words.next()?.to_string();
        let rest = words.next();
        if words.next().is_some() {
            return None;
        }
        let decision = match (cmd, rest) {
            ("/approve", None | Some("once")) => Decision::Once,
            ("/approve", Some("always")) => Decision::Always,
            ("/deny", None) => Decision::Deny,
            _ => return None,
        };
        Some(Self::Approval { id, decision })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_parsed_command_is_a_listed_name() {
        for text in [
            "/stop",
            "/new",
            "/status",
            "/help",
            "/start",
            "/compact",
            "/model",
            "/voice",
            "/voice to_voice",
            "/approve a",
            "/deny a",
        ] {
            assert!(ChatCommand::parse(text).is_some(), "{text}");
            assert!(
                is_command_name(text[1..].split(' ').next().unwrap_or("")),
                "{text}"
            );
        }
        assert!(is_command_name("MODEL"));
        assert!(!is_command_name("weather"));
    }

    #[test]
    fn commands_parse_once_and_the_rest_is_for_the_model() {
        assert_eq!(ChatCommand::parse(" /stop "), Some(ChatCommand::Stop));
        assert_eq!(ChatCommand::parse("/new"), Some(ChatCommand::New));
        assert_eq!(ChatCommand::parse("/status"), Some(ChatCommand::Status));
        assert_eq!(ChatCommand::parse("/help"), Some(ChatCommand::Help));
        assert_eq!(ChatCommand::parse("/start"), Some(ChatCommand::Help));
        assert_eq!(ChatCommand::parse("/start ref-42"), Some(ChatCommand::Help));
        assert_eq!(ChatCommand::parse("/compact"), Some(ChatCommand::Compact));
        assert_eq!(ChatCommand::parse("/model"), Some(ChatCommand::Model(None)));
        assert_eq!(
            ChatCommand::parse("/model gpt-4o"),
            Some(ChatCommand::Model(Some("gpt-4o".into())))
        );
        assert_eq!(ChatCommand::parse("/model a b"), None);
        assert_eq!(ChatCommand::parse("/voice"), Some(ChatCommand::Voice(None)));
        assert_eq!(
            ChatCommand::parse("/voice to_voice"),
            Some(ChatCommand::Voice(Some("to_voice".into())))
        );
        assert_eq!(ChatCommand::parse("/voice a b"), None);
        assert_eq!(
            ChatCommand::parse("/approve ab12"),
            Some(ChatCommand::Approval {
                id: "ab12".into(),
                decision: Decision::Once
            })
        );
        assert_eq!(
            ChatCommand::parse("/approve ab12 always"),
            Some(ChatCommand::Approval {
                id: "ab12".into(),
                decision: Decision::Always
            })
        );
        assert_eq!(
            ChatCommand::parse("/deny ab12"),
            Some(ChatCommand::Approval {
                id: "ab12".into(),
                decision: Decision::Deny
            })
        );
        for text in [
            "/stop now",
            "/deny ab12 always",
            "/approve",
            "/approve a b c",
            "/weather",
            "stop",
            "",
        ] {
            assert_eq!(ChatCommand::parse(text), None, "{text:?}");
        }
    }
}
