//! The Telegram channel: Bot API long polling (`getUpdates`) through teloxide-core's `Bot`,
//! without teloxide's `Dispatcher`.
//!
//! - **Inbound.** `listen` calls `getMe` once (a refused token ends it with
//!   [`ChannelError::Auth`] naming `channels.telegram.token`), then long-polls `getUpdates`
//!   with `offset`. An update is confirmed to Telegram only by the next `getUpdates` with
//!   `offset = update_id + 1`, and the offset advances only after the daemon acknowledged the
//!   delivery (`Accepted`, `Duplicate` or `Rejected`). The offset is stored in the
//!   [`StateStore`] under `offset` after each batch, so a restart does not refetch confirmed
//!   updates; unconfirmed ones are fetched again (Telegram keeps them 24 h) and the daemon
//!   dedupes them on `event_id` = `update_id`. Only `message` updates are fetched: edits are
//!   ignored. See [`inbound`] for which messages are delivered.
//! - **Liveness.** Failed polls are retried with backoff (1 s doubling to 60 s); a poll that
//!   does not answer within its `timeout` plus a grace (the timeout again, 1 to 10 s) is
//!   abandoned (watchdog) and retried on a new connection. A poll that comes back empty is
//!   followed by the next one no sooner than [`MIN_EMPTY_POLL_INTERVAL`] after it started, so a
//!   server that ignores `timeout` is not polled in a tight loop. `state()` tells `connected as @bot`, `reconnecting (attempt N): ...` or
//!   `auth failed: ...`.
//! - **Outbound.** Markdown is split under Telegram's 4096 UTF-16 limit, each chunk rendered
//!   to Telegram HTML ([`render`]); a chunk Telegram refuses to parse is resent as plain text.
//!   Progress per outbound id makes a retried `send` skip chunks already delivered. With
//!   `stream_edits`, deltas build one draft message edited at most once per `edit_interval`,
//!   and the final reply edits the draft into its first chunk.
//! - **Files.** Photos, voice notes, audio, videos and documents arrive as attachments (the
//!   caption is the text); `media_request` resolves them with `getFile`. A final reply's
//!   attachments are uploaded after its text, one `send*` per file, journaled so a retry
//!   uploads only the rest; a file over the upload limit becomes a note.
//! - **Replies.** In groups the first chunk replies to the user's message (the adapter keeps a
//!   bounded map from the last 1024 update ids to their message ids); in private chats it does
//!   not quote. Replies go to the same forum topic (`message_thread_id`).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use clawft_channel_core::backoff::Backoff;
use clawft_channel_core::bounded::BoundedMap;
use clawft_channel_core::draft::{DraftOptions, DraftPlatform, Edited, Slot};
use clawft_channel_core::lock::MutexExt;
use clawft_channel_core::media::{MediaRef, MediaRequest};
use clawft_channel_core::send::{SendPath, SendPlatform};
use clawft_channel_core::text::{split_markdown, Measure};
use clawft_channel_core::{
    now_ms, Ack, Capabilities, Channel, ChannelError, ChannelId, ChatId, InboundDelivery,
    InboundEvent, MemoryState, OutboundMessage, SentRef, StateStore, ThreadId, UserId,
};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

mod api;
mod ids;
pub mod inbound;
mod media;
pub mod render;
mod settings;

#[cfg(any(test, feature = "testing"))]
pub mod fake;

pub use settings::{Telegram, TelegramFile, TelegramSettings};

use api::{Api, CallError, EditMessageText, Me, ReplyParameters, SendChatAction, SendMessage};
use ids::{Chat, MessageId, Topic, UpdateId};

/// Telegram's limit per message, in UTF-16 code units of the text after entity parsing.
pub const MAX_MESSAGE_UTF16: usize = 4096;
/// Markdown is split at this size first, leaving room for what rendering changes.
const SPLIT_AT: usize = 4000;
/// State key of the next `getUpdates` offset.
pub const OFFSET_KEY: &str = "offset";
/// Shortest time between the starts of two polls when the first came back empty (1 s): a
/// server or proxy that answers `getUpdates` at once, ignoring `timeout`, is polled once a
/// second instead of thousands of times; a message still arrives within about a second.
pub const MIN_EMPTY_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Longest reconnect backoff.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Telegram's upload limit for bots (50 MB).
pub const MAX_UPLOAD_BYTES: u64 = 50 * 1024 * 1024;
/// Remembered update → message ids (for replying), outbound progress entries and drafts.
const MAX_REMEMBERED: usize = 1024;

/// Which group messages are delivered (DMs always are).
pub use clawft_channel_core::GroupMode;

/// Resolved settings of the Telegram channel.
#[derive(Clone)]
pub struct TelegramConfig {
    /// Channel id (default `telegram`).
    pub id: ChannelId,
    /// Bot token from @BotFather (`123456:ABC...`). Never printed by `Debug`.
    pub token: String,
    /// Bot API base URL (default `https://api.telegram.org`; a local `telegram-bot-api`
    /// server, or the fake in tests).
    pub api_url: String,
    /// Which group messages are delivered (default [`GroupMode::Mention`]).
    pub group_mode: GroupMode,
    /// Stream replies by editing a draft message (default true).
    pub stream_edits: bool,
    /// Least time between two edits of a draft (default 1.5 s).
    pub edit_interval: Duration,
    /// Long-poll `timeout` of `getUpdates` (default 25 s; at least 1 s). The watchdog gives a
    /// poll this plus the same again (at most 10 s more) before it reconnects.
    pub poll_timeout: Duration,
    /// Where the `getUpdates` offset is kept across restarts.
    pub state: Arc<dyn StateStore>,
    /// Largest file uploaded (default [`MAX_UPLOAD_BYTES`], Telegram's 50 MB for bots; a local
    /// `telegram-bot-api` server takes up to 2000 MB). A bigger attachment is replaced by a
    /// short note in the chat.
    pub max_upload_bytes: u64,
}

impl TelegramConfig {
    /// Defaults with this token and an in-memory state store.
    pub fn new(token: impl Into<String>) -> Self {
        Self {
            token: token.into(),
            ..Self::default()
        }
    }
}

impl Default for TelegramConfig {
    fn default() -> Self {
        Self {
            id: ChannelId::new("telegram"),
            token: String::new(),
            api_url: "https://api.telegram.org".into(),
            group_mode: GroupMode::Mention,
            stream_edits: true,
            edit_interval: Duration::from_millis(1500),
            poll_timeout: Duration::from_secs(25),
            state: Arc::new(MemoryState::default()),
            max_upload_bytes: MAX_UPLOAD_BYTES,
        }
    }
}

impl fmt::Debug for TelegramConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TelegramConfig")
            .field("id", &self.id)
            .field("token", &"<redacted>")
            .field("api_url", &self.api_url)
            .field("group_mode", &self.group_mode)
            .field("stream_edits", &self.stream_edits)
            .field("edit_interval", &self.edit_interval)
            .field("poll_timeout", &self.poll_timeout)
            .field("max_upload_bytes", &self.max_upload_bytes)
            .finish_non_exhaustive()
    }
}

/// The message a delivered update came from.
#[derive(Clone, Copy)]
struct Origin {
    message_id: MessageId,
    group: bool,
}

/// One chunk ready to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Telegram HTML, or `None` when the chunk renders to no visible text.
    pub html: Option<String>,
    /// The Markdown source, sent as plain text if Telegram refuses the HTML.
    pub plain: String,
}

/// Split Markdown under Telegram's limit and render each chunk; a chunk whose rendering is
/// still too long is split further.
pub fn plan_chunks(markdown: &str) -> Vec<Chunk> {
    let mut out = Vec::new();
    plan_into(markdown, SPLIT_AT, &mut out);
    out
}

fn plan_into(markdown: &str, max: usize, out: &mut Vec<Chunk>) {
    for piece in split_markdown(markdown, max, Measure::Utf16) {
        if piece.trim().is_empty() {
            continue;
        }
        let html = render::markdown_to_html(&piece);
        let visible = render::visible_len(&html);
        if visible > MAX_MESSAGE_UTF16 && max > 64 {
            // Rendering grew it (link URLs written out): split smaller, proportionally.
            let smaller = (max * MAX_MESSAGE_UTF16 / visible * 9 / 10).clamp(64, max - 1);
            plan_into(&piece, smaller, out);
            continue;
        }
        out.push(Chunk {
            html: (visible > 0 && !html.trim().is_empty()).then_some(html),
            plain: piece,
        });
    }
}

/// The Telegram channel.
pub struct TelegramChannel {
    cfg: TelegramConfig,
    api: Api,
    status: Mutex<String>,
    origins: Mutex<BoundedMap<UpdateId, Origin>>,
    /// Streamed drafts, the delivery progress of final replies and the attachments uploaded
    /// (journaled in the state store, so a resend after a restart edits instead of posting
    /// again).
    send: SendPath<MessageId, Chunk>,
}

/// The Telegram side of a streamed draft or final reply: where one outbound message goes.
struct Target<'a> {
    ch: &'a TelegramChannel,
    chat: Chat,
    thread: Option<Topic>,
    /// The user's message the draft and the first chunk quote (groups only).
    reply_to: Option<MessageId>,
}

#[async_trait]
impl DraftPlatform for Target<'_> {
    type Id = MessageId;
    type Text = Chunk;

    /// The draft shows the first chunk of the text so far; the final reply posts the rest.
    fn preview(&self, markdown: &str) -> Option<Chunk> {
        plan_chunks(markdown).into_iter().next()
    }

    async fn post(&self, slot: Slot, chunk: &Chunk) -> Result<Option<MessageId>, ChannelError> {
        let reply_to = match slot {
            Slot::Draft | Slot::Chunk(0) => self.reply_to,
            Slot::Chunk(_) => None,
        };
        self.ch
            .post(&self.chat, self.thread, reply_to, chunk)
            .await
            .map(Some)
    }

    async fn edit(&self, id: &MessageId, chunk: &Chunk) -> Result<Edited, ChannelError> {
        Ok(if self.ch.edit(&self.chat, *id, chunk).await? {
            Edited::Done
        } else {
            Edited::Gone
        })
    }
}

impl SendPlatform for Target<'_> {
    fn render(&self, markdown: &str) -> Vec<Chunk> {
        plan_chunks(markdown)
    }
}

/// What the processing of one batch ended with.
enum Flow {
    Continue,
    Stop,
    /// A delivery's ack was dropped: fetch the batch again after a pause.
    Unacked,
}

impl TelegramChannel {
    /// Validate the settings and build the client. Nothing is contacted yet.
    ///
    /// # Errors
    /// [`ChannelError::Auth`] for an empty or malformed token, [`ChannelError::Fatal`] for an
    /// unusable `api_url`.
    pub fn new(cfg: TelegramConfig) -> Result<Self, ChannelError> {
        let token = cfg.token.trim();
        if token.is_empty() {
            return Err(ChannelError::Auth(
                "no Telegram bot token: set channels.telegram.token (token_env or token_file) \
                 to the token @BotFather gave you"
                    .into(),
            ));
        }
        if !token.contains(':')
            || !token
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '_' | '-'))
        {
            return Err(ChannelError::Auth(
                "channels.telegram.token does not look like a bot token (`123456:ABC-...`): \
                 copy it again from @BotFather"
                    .into(),
            ));
        }
        let url = reqwest::Url::parse(cfg.api_url.trim()).map_err(|e| {
            ChannelError::Fatal(format!(
                "channels.telegram.api_url `{}` is not a URL: {e}",
                cfg.api_url
            ))
        })?;
        if !matches!(url.scheme(), "http" | "https")
            || url.cannot_be_a_base()
            || url.host_str().is_none()
            || url.query().is_some()
            || url.fragment().is_some()
        {
            return Err(ChannelError::Fatal(format!(
                "channels.telegram.api_url `{}` must be an http(s) base URL like \
                 https://api.telegram.org",
                cfg.api_url
            )));
        }
        if url.scheme() == "http" {
            tracing::warn!(api_url = %url, "the Telegram bot token is sent over plain http");
        }
        let api = Api::new(token, url)?;
        let mut cfg = cfg;
        cfg.poll_timeout = cfg.poll_timeout.max(Duration::from_secs(1));
        Ok(Self {
            send: SendPath::new(
                DraftOptions {
                    edit_interval: cfg.edit_interval,
                    capacity: MAX_REMEMBERED,
                    skip_repeated_deltas: false,
                },
                cfg.state.clone(),
            ),
            cfg,
            api,
            status: Mutex::new("not started".into()),
            origins: Mutex::new(BoundedMap::new(MAX_REMEMBERED)),
        })
    }

    fn set_status(&self, s: impl Into<String>) {
        *self.status.locked() = s.into();
    }

    fn classify(&self, e: &CallError) -> ChannelError {
        match e.classify(self.api.token()) {
            // A second bot (channel id `telegram.NAME`) has its token under
            // `channels.telegram.accounts.NAME`: name the key the operator has to fix.
            ChannelError::Auth(m) => match self.cfg.id.as_str().split_once('.') {
                Some((_, account)) => ChannelError::Auth(m.replace(
                    "channels.telegram.token",
                    &format!("channels.telegram.accounts.{account}.token"),
                )),
                None => ChannelError::Auth(m),
            },
            other => other,
        }
    }

    fn save_offset(&self, offset: Option<UpdateId>) {
        if let Some(o) = offset {
            if let Err(e) = self.cfg.state.put(OFFSET_KEY, &o.0.to_string()) {
                tracing::warn!(error = %e, "could not store the Telegram offset");
            }
        }
    }

    /// Deliver a batch in order, advancing `offset` past each acknowledged (or skipped) one.
    async fn process(
        &self,
        me: &Me,
        updates: Vec<Value>,
        offset: &mut Option<UpdateId>,
        tx: &mpsc::Sender<InboundDelivery>,
        cancel: &CancellationToken,
    ) -> Flow {
        let mut updates: Vec<(UpdateId, Value)> = updates
            .into_iter()
            .filter_map(|u| inbound::update_id(&u).map(|id| (UpdateId(id), u)))
            .collect();
        updates.sort_by_key(|(id, _)| *id);
        for (id, update) in updates {
            if offset.is_some_and(|o| id < o) {
                continue;
            }
            let incoming = match inbound::decide(&update, me, self.cfg.group_mode) {
                inbound::Decision::Deliver(i) => i,
                inbound::Decision::Skip(why) => {
                    tracing::debug!(update_id = id.0, why, "telegram update skipped");
                    *offset = Some(id.next());
                    continue;
                }
            };
            self.origins.locked().insert(
                id,
                Origin {
                    message_id: MessageId(incoming.message_id),
                    group: incoming.group,
                },
            );
            let (delivery, ack) = InboundDelivery::new(InboundEvent {
                channel: self.cfg.id.clone(),
                chat: ChatId::new(incoming.chat.to_string()),
                thread: incoming.thread.map(|t| ThreadId::new(t.to_string())),
                sender: UserId::new(incoming.sender.to_string()),
                sender_name: incoming.sender_name,
                event_id: id.event_id(),
                content: incoming.text,
                received_at_ms: now_ms(),
                attachments: incoming.attachments,
                origin: clawft_channel_core::Origin::User,
            });
            tokio::select! {
                r = tx.send(delivery) => if r.is_err() { return Flow::Stop },
                () = cancel.cancelled() => return Flow::Stop,
            }
            let ack = tokio::select! {
                a = ack => a,
                () = cancel.cancelled() => return Flow::Stop,
            };
            match ack {
                Ok(Ack::Accepted | Ack::Duplicate) => {}
                Ok(Ack::Rejected(why)) => {
                    tracing::info!(
                        update_id = id.0,
                        why,
                        "telegram message refused by the daemon"
                    );
                }
                // Not stored: the update is fetched again (the offset stays).
                Ok(Ack::Unavailable(why)) => {
                    tracing::warn!(
                        update_id = id.0,
                        why,
                        "the daemon cannot store messages now; the update will be fetched again"
                    );
                    return Flow::Unacked;
                }
                Err(_) => return Flow::Unacked,
            }
            *offset = Some(id.next());
        }
        Flow::Continue
    }

    /// Post one chunk; HTML refused by Telegram's parser is resent as plain text.
    async fn post(
        &self,
        chat: &Chat,
        thread: Option<Topic>,
        reply_to: Option<MessageId>,
        chunk: &Chunk,
    ) -> Result<MessageId, ChannelError> {
        let msg = |text: String, parse_mode| SendMessage {
            chat_id: chat.clone(),
            text,
            parse_mode,
            message_thread_id: thread,
            reply_parameters: reply_to.map(|m| ReplyParameters {
                message_id: m,
                allow_sending_without_reply: true,
            }),
        };
        if let Some(html) = &chunk.html {
            match self.api.call_default(msg(html.clone(), Some("HTML"))).await {
                Ok(m) => return Ok(m.message_id),
                Err(e) if e.is_parse_entities() => {
                    tracing::warn!(error = %self.classify(&e), "Telegram refused the HTML; sending plain text");
                }
                Err(e) => return Err(self.classify(&e)),
            }
        }
        self.api
            .call_default(msg(chunk.plain.clone(), None))
            .await
            .map(|m| m.message_id)
            .map_err(|e| self.classify(&e))
    }

    /// Edit a message into a chunk. `Ok(false)` when the message can no longer be edited.
    async fn edit(
        &self,
        chat: &Chat,
        message_id: MessageId,
        chunk: &Chunk,
    ) -> Result<bool, ChannelError> {
        let edit = |text: String, parse_mode| EditMessageText {
            chat_id: chat.clone(),
            message_id,
            text,
            parse_mode,
        };
        let r = match &chunk.html {
            Some(html) => match self
                .api
                .call_default(edit(html.clone(), Some("HTML")))
                .await
            {
                Err(e) if e.is_parse_entities() => {
                    self.api.call_default(edit(chunk.plain.clone(), None)).await
                }
                r => r,
            },
            None => self.api.call_default(edit(chunk.plain.clone(), None)).await,
        };
        match r {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_modified() => Ok(true),
            Err(e) if e.is_edit_target_gone() => Ok(false),
            Err(e) => Err(self.classify(&e)),
        }
    }

    /// Where `msg` goes; the user's message it quotes in a group, if the update it answers
    /// was delivered by this process.
    fn target(&self, msg: &OutboundMessage) -> Result<Target<'_>, ChannelError> {
        let update = msg.in_reply_to.as_ref().and_then(UpdateId::of);
        let reply_to = update.and_then(|u| {
            let origins = self.origins.locked();
            origins.get(&u).filter(|o| o.group).map(|o| o.message_id)
        });
        Ok(Target {
            ch: self,
            chat: Chat::of(&msg.chat),
            thread: Topic::of(msg.thread.as_ref())?,
            reply_to,
        })
    }
}

#[async_trait]
impl Channel for TelegramChannel {
    fn id(&self) -> &ChannelId {
        &self.cfg.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            streaming: self.cfg.stream_edits,
            progress: false,
            max_message_bytes: MAX_MESSAGE_UTF16,
            max_upload_bytes: self.cfg.max_upload_bytes,
        }
    }

    async fn listen(
        &self,
        tx: mpsc::Sender<InboundDelivery>,
        cancel: CancellationToken,
    ) -> Result<(), ChannelError> {
        let mut offset: Option<UpdateId> = self
            .cfg
            .state
            .get(OFFSET_KEY)
            .and_then(|s| s.trim().parse().ok())
            .map(UpdateId);
        let mut me: Option<Me> = None;
        let mut backoff = Backoff::new(Duration::from_secs(1), MAX_BACKOFF);
        self.set_status("connecting");
        loop {
            let failure: String;
            let mut wait = None;
            if let Some(bot) = &me {
                let started = tokio::time::Instant::now();
                let polled = tokio::select! {
                    r = self.api.get_updates(offset, self.cfg.poll_timeout) => r,
                    () = cancel.cancelled() => return Ok(()),
                };
                match polled {
                    Ok(updates) => {
                        if backoff.attempt() > 0 {
                            backoff.reset();
                            self.set_status(format!("connected as @{}", bot.username));
                        }
                        if updates.is_empty() {
                            // An empty answer before the long-poll timeout: pace the next poll.
                            tokio::select! {
                                () = tokio::time::sleep_until(started + MIN_EMPTY_POLL_INTERVAL) => {}
                                () = cancel.cancelled() => return Ok(()),
                            }
                            continue;
                        }
                        let before = offset;
                        let flow = self.process(bot, updates, &mut offset, &tx, &cancel).await;
                        if offset != before {
                            self.save_offset(offset);
                        }
                        match flow {
                            Flow::Continue => continue,
                            Flow::Stop => return Ok(()),
                            Flow::Unacked => {
                                failure =
                                    "a delivery was not acknowledged; fetching it again".into();
                            }
                        }
                    }
                    Err(e) if e.is_webhook_active() => {
                        tracing::warn!(
                            "a webhook is set for this bot; deleting it to use getUpdates"
                        );
                        if let Err(e) = self
                            .api
                            .call_default(api::DeleteWebhook {
                                drop_pending_updates: false,
                            })
                            .await
                        {
                            tracing::warn!(error = %self.classify(&e), "deleteWebhook failed");
                        }
                        failure = "a webhook was set; deleted it".into();
                    }
                    Err(e) => {
                        let err = self.classify(&e);
                        if let ChannelError::Auth(m) = &err {
                            self.set_status(format!("auth failed: {m}"));
                            return Err(err);
                        }
                        wait = err.retry_after();
                        failure = match &e {
                            CallError::Timeout(_) => format!("getUpdates watchdog: {err}"),
                            _ => err.to_string(),
                        };
                    }
                }
            } else {
                let r = tokio::select! {
                    r = self.api.get_me() => r,
                    () = cancel.cancelled() => return Ok(()),
                };
                match r {
                    Ok(m) => {
                        tracing::info!(bot = %m.username, "Telegram connected");
                        self.set_status(format!("connected as @{}", m.username));
                        me = Some(m);
                        backoff.reset();
                        continue;
                    }
                    Err(e) => {
                        let err = self.classify(&e);
                        if let ChannelError::Auth(m) = &err {
                            self.set_status(format!("auth failed: {m}"));
                            return Err(err);
                        }
                        wait = err.retry_after();
                        failure = format!("getMe: {err}");
                    }
                }
            }
            let delay = backoff.next_delay().max(wait.unwrap_or_default());
            let attempt = backoff.attempt();
            tracing::warn!(attempt, ?delay, error = %failure, "Telegram polling failed; retrying");
            self.set_status(format!("reconnecting (attempt {attempt}): {failure}"));
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = cancel.cancelled() => return Ok(()),
            }
        }
    }

    async fn send(&self, msg: &OutboundMessage) -> Result<SentRef, ChannelError> {
        let caps = self.capabilities();
        self.send.send(&caps, msg, || self.target(msg)).await
    }

    async fn typing(&self, chat: &ChatId, thread: Option<&ThreadId>) -> Result<(), ChannelError> {
        let action = SendChatAction {
            chat_id: Chat::of(chat),
            action: "typing",
            message_thread_id: Topic::of(thread)?,
        };
        self.api
            .call_default(action)
            .await
            .map(|_| ())
            .map_err(|e| self.classify(&e))
    }

    async fn media_request(&self, media: &MediaRef) -> Result<MediaRequest, ChannelError> {
        self.file_request(media).await
    }

    fn state(&self) -> String {
        self.status.locked().clone()
    }

    fn settled(&self, msg: &OutboundMessage) {
        self.send.settled(msg);
    }
}

#[cfg(test)]
mod media_tests;
#[cfg(test)]
mod tests;
