//! The terminal channel (`cli`): `weft agent` submits lines as inbound events and reads replies,
//! deltas and progress from the outbound side.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use clawft_channel_core::{
    now_ms, Ack, Capabilities, Channel, ChannelError, ChannelId, ChatId, InboundDelivery,
    InboundEvent, OutboundMessage, PlatformEventId, SentRef, UserId,
};
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::types::MutexExt;

/// Why a typed line was not taken.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The daemon's ingress is gone (shutdown, crash).
    #[error("the agent stopped")]
    AgentStopped,
    /// Ingress refused the line; the reason is shown to the user as is.
    #[error("{0}")]
    Rejected(String),
}

/// The terminal as a channel.
pub struct TerminalChannel {
    id: ChannelId,
    listener: Mutex<Option<mpsc::Sender<InboundDelivery>>>,
    ready: Notify,
    out: mpsc::UnboundedSender<OutboundMessage>,
}

impl TerminalChannel {
    /// The channel and the receiver of everything it is asked to send.
    pub fn new() -> (Arc<Self>, mpsc::UnboundedReceiver<OutboundMessage>) {
        let (out, rx) = mpsc::unbounded_channel();
        (
            Arc::new(Self {
                id: clawft_channel_core::Surface::Terminal.channel(),
                listener: Mutex::new(None),
                ready: Notify::new(),
                out,
            }),
            rx,
        )
    }

    /// Submit a line typed by the user; returns its event id once it is journaled.
    ///
    /// # Errors
    /// The daemon refused it or is gone.
    pub async fn submit(&self, chat: &str, text: &str) -> Result<PlatformEventId, SubmitError> {
        let tx = loop {
            let notified = self.ready.notified();
            if let Some(tx) = self.listener.locked().clone() {
                break tx;
            }
            notified.await;
        };
        let event_id = PlatformEventId::new(uuid::Uuid::now_v7().to_string());
        let (delivery, ack) = InboundDelivery::new(InboundEvent {
            channel: self.id.clone(),
            chat: ChatId::new(chat),
            thread: None,
            sender: UserId::new("terminal"),
            sender_name: None,
            event_id: event_id.clone(),
            content: text.to_string(),
            received_at_ms: now_ms(),
            attachments: Vec::new(),
            origin: clawft_channel_core::Origin::User,
        });
        tx.send(delivery)
            .await
            .map_err(|_| SubmitError::AgentStopped)?;
        match ack.await {
            Ok(Ack::Accepted | Ack::Duplicate) => Ok(event_id),
            Ok(Ack::Rejected(why) | Ack::Unavailable(why)) => Err(SubmitError::Rejected(why)),
            Err(_) => Err(SubmitError::AgentStopped),
        }
    }
}

#[async_trait]
impl Channel for TerminalChannel {
    fn id(&self) -> &ChannelId {
        &self.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            streaming: true,
            progress: true,
            max_message_bytes: usize::MAX,
            max_upload_bytes: 0,
        }
    }

    async fn listen(
        &self,
        tx: mpsc::Sender<InboundDelivery>,
        cancel: CancellationToken,
    ) -> Result<(), ChannelError> {
        *self.listener.locked() = Some(tx);
        self.ready.notify_waiters();
        cancel.cancelled().await;
        // Drop the sender with the listener: the ingress pump ends when its last sender is
        // gone, and shutdown waits for it (a clone kept here stalled every direct `weft agent`
        // for the 5 s of the task deadline).
        *self.listener.locked() = None;
        Ok(())
    }

    async fn send(&self, msg: &OutboundMessage) -> Result<SentRef, ChannelError> {
        self.out
            .send(msg.clone())
            .map_err(|_| ChannelError::Gone("terminal closed".into()))?;
        Ok(SentRef::message(msg.id.clone()))
    }
}
