//! `reply_with_voice`: when a chat's answers are also spoken.

/// When the answers of a chat are spoken (`agents.*.reply_with_voice`, `/voice` in a chat).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VoiceReplies {
    /// Never: no spoken answer, and audio made by the `tts` tool stays in the workspace.
    Never,
    /// When the user asks for one (the model calls `tts`); the default.
    #[default]
    WhenAsked,
    /// A voice note is answered with a voice note (its text kept alongside).
    ToVoice,
}

impl VoiceReplies {
    /// Every value as written, in order.
    pub const NAMES: &'static [&'static str] = &["never", "when_asked", "to_voice"];

    /// The value of `s` (`never`, `when_asked`, `to_voice`), if it is one.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "never" => Some(Self::Never),
            "when_asked" => Some(Self::WhenAsked),
            "to_voice" => Some(Self::ToVoice),
            _ => None,
        }
    }

    /// As written in the config and the chat command.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Never => "never",
            Self::WhenAsked => "when_asked",
            Self::ToVoice => "to_voice",
        }
    }
}
