//! Typing-indicator failures, logged once per chat: a platform that refuses `typing` for a
//! chat (no permission, chat gone, a 5 s timeout) would otherwise be silent, or log every 4 s
//! for as long as a turn runs. A failure is logged at debug when the chat's calls start
//! failing; a success ends the streak, so the next failure is logged again.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use clawft_channel_core::{ChannelError, ChannelId, ChatId};

use crate::types::MutexExt;

/// Most chats remembered as failing; beyond, the set starts over (a few repeated lines).
const MAX_FAILING: usize = 1024;

/// The chats of one channel whose typing indicator is failing.
#[derive(Clone, Default)]
pub(super) struct Failing(Arc<Mutex<HashSet<ChatId>>>);

impl Failing {
    /// Note the outcome of one typing call (`Err(_)`: it timed out).
    pub(super) fn record(
        &self,
        channel: &ChannelId,
        chat: &ChatId,
        outcome: Result<Result<(), ChannelError>, tokio::time::error::Elapsed>,
    ) {
        let error = match outcome {
            Ok(Ok(())) => {
                self.0.locked().remove(chat);
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer within 5 s".to_string(),
        };
        let first = {
            let mut set = self.0.locked();
            if set.len() >= MAX_FAILING && !set.contains(chat) {
                set.clear();
            }
            set.insert(chat.clone())
        };
        if first {
            tracing::debug!(channel = %channel, chat = %chat, error, "typing indicator failed (logged once until it works again)");
        }
    }
}
