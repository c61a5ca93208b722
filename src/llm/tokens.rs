//! Token estimates for when a provider reports no usage, and for sizing a prompt before it is
//! sent. The rule is documented in `docs/architecture.md`: one token per 4 bytes of UTF-8 text
//! (rounded up), plus 4 tokens of framing per message. Real tokenizers give 3.5–4.5 bytes per
//! token for English and code; the estimate errs a little high, which is the safe side for a
//! context window.

use super::{ChatRequest, Message, ToolSpec};

/// Bytes per token of the estimate.
pub const BYTES_PER_TOKEN: usize = 4;
/// Framing tokens counted per message (role, separators).
pub const PER_MESSAGE: u64 = 4;

/// Estimated tokens of a text.
pub fn of_text(text: &str) -> u64 {
    u64::try_from(text.len().div_ceil(BYTES_PER_TOKEN)).unwrap_or(u64::MAX)
}

/// Estimated tokens of one message (content, tool calls and their arguments).
pub fn of_message(m: &Message) -> u64 {
    let calls: u64 = m
        .tool_calls
        .iter()
        .map(|c| of_text(&c.id) + of_text(&c.name) + of_text(&c.arguments))
        .sum();
    PER_MESSAGE + of_text(&m.content) + calls + m.tool_call_id.as_deref().map_or(0, of_text)
}

/// Estimated tokens of tool schemas as sent to the model.
pub fn of_tools(tools: &[ToolSpec]) -> u64 {
    tools
        .iter()
        .map(|t| of_text(&t.name) + of_text(&t.description) + of_text(&t.parameters.to_string()))
        .sum()
}

/// Estimated prompt tokens of a whole request.
pub fn of_request(req: &ChatRequest) -> u64 {
    req.messages.iter().map(of_message).sum::<u64>() + of_tools(&req.tools)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_bytes_a_token_rounded_up_plus_framing() {
        assert_eq!(of_text(""), 0);
        assert_eq!(of_text("abcd"), 1);
        assert_eq!(of_text("abcde"), 2);
        assert_eq!(of_message(&Message::user("abcdefgh")), PER_MESSAGE + 2);
    }
}
