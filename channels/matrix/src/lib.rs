//! The Matrix channel: a plain Client-Server API client on reqwest.
//!
//! Not `matrix-sdk`: with end-to-end encryption it brings 125–166 more crates and C builds
//! (SQLite for its crypto store); the handful of calls a bot needs are a few hundred lines here,
//! and every step the daemon's guarantees depend on (the `since` token advanced only after the
//! events are journaled, transaction ids derived from the outbound id) is in view.
//!
//! - **Inbound** ([`Channel::listen`]): `whoami`, then `/sync` long-polls. The `since` token is
//!   stored ([`StateStore`], key `since`) only after every message of the batch was
//!   acknowledged by the daemon (journaled or refused): a gateway killed mid-batch syncs the
//!   batch again and the daemon drops the events it already has (same event id). The first
//!   sync of a fresh gateway only records where the rooms are (old history is not answered).
//! - **Invites** are accepted only from the users in `allow_from`; others are rejected with a
//!   reason. A room with encryption on (`m.room.encryption` in the invite, or appearing later)
//!   is refused: this client has no crypto store and could read nothing there (see
//!   `docs/channels.md`).
//! - **Rooms and DMs**: a room with two members is a DM (every message is for the bot); in a
//!   bigger room only messages that mention the bot (`m.mentions`, its user id or name) are
//!   delivered, unless `group_mode = "all"`.
//! - **Threads and replies**: a message in a thread (`m.thread`) has the thread root as its
//!   thread; the reply goes in the same thread and answers the message (`m.in_reply_to`).
//!   Reply fallbacks (`> <@user> quoted`) are stripped from what the agent reads.
//! - **Outbound** ([`Channel::send`]): Markdown rendered as `org.matrix.custom.html` plus a
//!   plain body ([`render`]), split under [`MAX_CHUNK_BYTES`]; each chunk is a `PUT
//!   /rooms/{room}/send/m.room.message/{txnId}` with txnId `<outbound id>-<chunk>`: a resend
//!   after a crash reuses the transaction id and the homeserver answers the event it already
//!   has instead of posting again.
//! - **Streaming**: deltas post a draft and edit it (`m.replace`) at most once per
//!   `edit_interval`; the final reply edits the draft into its first chunk.
//! - **Rate limits**: `429` / `M_LIMIT_EXCEEDED` with `retry_after_ms` is
//!   [`ChannelError::RateLimited`], which the outbox waits out.
//! - **Media**: uploads to the media repository (`/_matrix/media/v3/upload`), sent as
//!   `m.image` / `m.audio` / `m.video` / `m.file`; downloads through the authenticated
//!   `/_matrix/client/v1/media/download` (with the access token), or the legacy
//!   `/_matrix/media/v3/download` on homeservers older than v1.11.
//! - **Typing**: `PUT /rooms/{room}/typing/{user}` for 10 s.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use clawft_channel_core::draft::{DraftOptions, DraftPlatform, Edited, Slot};
use clawft_channel_core::lock::MutexExt;
use clawft_channel_core::media::{MediaKind, MediaRef, MediaRequest, OutboundFile};
use clawft_channel_core::send::{SendFiles, SendPath, SendPlatform};
use clawft_channel_core::text::{split_markdown, Measure};
pub use clawft_channel_core::GroupMode;
use clawft_channel_core::{
    Capabilities, Channel, ChannelError, ChannelId, ChatId, InboundDelivery, MemoryState,
    OutboundMessage, PlatformEventId, SentRef, StateStore, ThreadId,
};
use reqwest::{Method, Url};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

mod api;
pub mod render;
mod settings;
mod sync;

pub use settings::{Matrix, MatrixFile, MatrixSettings};
pub use sync::SINCE_KEY;

pub use api::classify;
use render::Rendered;

/// Largest body (plain + HTML) of one message we send, in bytes: Matrix events are capped at
/// 65,536 bytes including their envelope.
pub const MAX_CHUNK_BYTES: usize = 40_000;
/// Markdown bytes per chunk before rendering (a chunk that renders too big is split again).
const SPLIT_BYTES: usize = 16_000;
/// Largest file we upload (read into memory; Synapse's default `max_upload_size` is 50 MiB).
pub const MAX_UPLOAD_BYTES: u64 = 50 * 1024 * 1024;
/// Outbound messages whose progress is remembered (drafts and finished replies, each).
const PROGRESS_KEPT: usize = 512;
/// What the bot says (as the reason of its refusal, or in the room) when a room is encrypted.
pub const ENCRYPTED_REFUSAL: &str = "This room is end-to-end encrypted, and this assistant cannot read encrypted rooms. Make an unencrypted room and invite it there (in Element: + then New room, turn \"Enable end-to-end encryption\" off, then invite).";

/// Whether a user may invite the bot (beyond `allow_from`).
pub type InviteCheck = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// Resolved settings of the Matrix channel.
#[derive(Clone)]
pub struct MatrixConfig {
    /// Channel id (default `matrix`).
    pub id: ChannelId,
    /// Homeserver base URL, e.g. `https://matrix.example.org`.
    pub homeserver: String,
    /// The bot account's access token. Never printed.
    pub access_token: String,
    /// The bot's user id, if configured: checked against `whoami` at start.
    pub user_id: Option<String>,
    /// Users whose invites are accepted (`allow_from`); every other invite is rejected.
    pub invite_from: BTreeSet<String>,
    /// Whether a user not in `invite_from` was admitted since (paired): their invites are
    /// accepted too.
    pub invite_paired: Option<InviteCheck>,
    /// Which room messages are delivered (DMs always are).
    pub group_mode: GroupMode,
    /// Stream replies by editing a draft (default true).
    pub stream_edits: bool,
    /// Least time between two edits of a streamed draft (default 1.5 s).
    pub edit_interval: Duration,
    /// Durable state: the `since` token, drafts and chunks delivered.
    pub state: Arc<dyn StateStore>,
    /// How long one `/sync` waits for news (default 30 s).
    pub sync_timeout: Duration,
    /// First retry delay after a failed sync, doubled per failure (default 1 s).
    pub backoff_min: Duration,
    /// Largest retry delay (default 60 s).
    pub backoff_max: Duration,
    /// Largest attachment uploaded, in bytes (default [`MAX_UPLOAD_BYTES`]).
    pub max_upload_bytes: u64,
}

impl Default for MatrixConfig {
    fn default() -> Self {
        Self {
            id: ChannelId::new("matrix"),
            homeserver: String::new(),
            access_token: String::new(),
            user_id: None,
            invite_from: BTreeSet::new(),
            invite_paired: None,
            group_mode: GroupMode::Mention,
            stream_edits: true,
            edit_interval: Duration::from_millis(1500),
            state: Arc::new(MemoryState::default()),
            sync_timeout: Duration::from_secs(30),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            max_upload_bytes: MAX_UPLOAD_BYTES,
        }
    }
}

impl fmt::Debug for MatrixConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MatrixConfig")
            .field("id", &self.id)
            .field("homeserver", &self.homeserver)
            .field("access_token", &"<redacted>")
            .field("user_id", &self.user_id)
            .field("invite_from", &self.invite_from)
            .field("group_mode", &self.group_mode)
            .field("stream_edits", &self.stream_edits)
            .field("edit_interval", &self.edit_interval)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    pub(crate) cfg: MatrixConfig,
    pub(crate) api: api::Client,
    pub(crate) status: Mutex<String>,
    /// The bot's user id, once `whoami` answered.
    pub(crate) me: Mutex<Option<String>>,
    /// The homeserver serves authenticated media (`/_matrix/client/v1/media`).
    pub(crate) authenticated_media: AtomicBool,
    /// Joined members per room (a room of two is a DM).
    pub(crate) members: Mutex<HashMap<String, u64>>,
    /// Members' display names per (room, user), from the syncs' `m.room.member` events or
    /// asked once per sender (`None`: asked, none set). Shown to the operator only.
    pub(crate) display_names: Mutex<HashMap<(String, String), Option<String>>>,
    /// Streamed drafts, the delivery progress of final replies and the attachments delivered.
    send: SendPath<String, Rendered>,
}

impl Inner {
    pub(crate) fn set_status(&self, s: impl Into<String>) {
        *self.status.locked() = s.into();
    }

    /// The bot's user id (asked once).
    pub(crate) async fn me(&self) -> Result<String, ChannelError> {
        if let Some(me) = self.me.locked().clone() {
            return Ok(me);
        }
        let v = self
            .api
            .call(
                Method::GET,
                self.api
                    .url(&["_matrix", "client", "v3", "account", "whoami"]),
                None,
                Duration::from_secs(30),
            )
            .await?;
        let me = v["user_id"]
            .as_str()
            .ok_or_else(|| ChannelError::Transient("whoami answered no user_id".into()))?
            .to_string();
        if let Some(want) = &self.cfg.user_id {
            if want != &me {
                return Err(ChannelError::Auth(format!(
                    "channels.matrix.user_id is {want} but the access token belongs to {me}: fix one of them"
                )));
            }
        }
        *self.me.locked() = Some(me.clone());
        Ok(me)
    }

    /// `PUT /rooms/{room}/send/{type}/{txn}`: the event id.
    pub(crate) async fn send_event(
        &self,
        room: &str,
        kind: &str,
        txn: &str,
        content: &Value,
    ) -> Result<String, ChannelError> {
        let url = self
            .api
            .url(&["_matrix", "client", "v3", "rooms", room, "send", kind, txn]);
        let v = self
            .api
            .call(Method::PUT, url, Some(content), Duration::from_secs(60))
            .await?;
        Ok(v["event_id"].as_str().unwrap_or_default().to_string())
    }

    /// Leave (or reject the invite to) `room`, with a reason the inviter sees.
    pub(crate) async fn leave(&self, room: &str, reason: &str) -> Result<(), ChannelError> {
        let url = self
            .api
            .url(&["_matrix", "client", "v3", "rooms", room, "leave"]);
        self.api
            .call(
                Method::POST,
                url,
                Some(&json!({ "reason": reason })),
                Duration::from_secs(30),
            )
            .await
            .map(drop)
    }
}

/// The Matrix channel adapter.
pub struct MatrixChannel {
    inner: Arc<Inner>,
}

impl MatrixChannel {
    /// Validate the settings and build the client (no network until [`Channel::listen`]).
    ///
    /// # Errors
    /// [`ChannelError::Auth`] for a missing token, [`ChannelError::Fatal`] for a bad
    /// homeserver URL.
    pub fn new(cfg: MatrixConfig) -> Result<Self, ChannelError> {
        if cfg.access_token.trim().is_empty() {
            return Err(ChannelError::Auth(
                "channels.matrix.access_token is empty: set access_token_env or access_token_file to the bot account's access token".into(),
            ));
        }
        let mut base = Url::parse(&cfg.homeserver).map_err(|e| {
            ChannelError::Fatal(format!(
                "channels.matrix.homeserver `{}` is not a URL: {e}",
                cfg.homeserver
            ))
        })?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(ChannelError::Fatal(format!(
                "channels.matrix.homeserver `{}` must be an http(s) URL like https://matrix.example.org",
                cfg.homeserver
            )));
        }
        base.set_query(None);
        let api = api::Client::new(base, cfg.access_token.clone())?;
        Ok(Self {
            inner: Arc::new(Inner {
                send: SendPath::new(
                    DraftOptions {
                        edit_interval: cfg.edit_interval,
                        capacity: PROGRESS_KEPT,
                        skip_repeated_deltas: true,
                    },
                    cfg.state.clone(),
                ),
                me: Mutex::new(None),
                authenticated_media: AtomicBool::new(true),
                members: Mutex::new(HashMap::new()),
                display_names: Mutex::new(HashMap::new()),
                cfg,
                api,
                status: Mutex::new("not started".into()),
            }),
        })
    }

    fn target<'a>(&'a self, msg: &'a OutboundMessage) -> Target<'a> {
        Target {
            inner: &self.inner,
            room: room_of(msg.chat.as_str()),
            thread: msg.thread.as_ref().map(|t| room_of(t.as_str())),
            reply_to: msg.in_reply_to.as_ref().map(PlatformEventId::as_str),
            outbound: &msg.id,
        }
    }
}

/// The Matrix side of one outbound message: its room, thread, the event it answers, its id.
struct Target<'a> {
    inner: &'a Inner,
    room: String,
    thread: Option<String>,
    reply_to: Option<&'a str>,
    outbound: &'a str,
}

impl Target<'_> {
    /// Put the message in its thread, and (`reply`) make it answer the inbound message.
    fn relate(&self, content: &mut Value, reply: bool) {
        let reply_to = self.reply_to.filter(|_| reply);
        match (self.thread.as_deref(), reply_to) {
            (Some(root), r) => {
                let mut rel = json!({"rel_type": "m.thread", "event_id": root});
                match r {
                    Some(e) => rel["m.in_reply_to"] = json!({"event_id": e}),
                    // Clients without threads show it as a reply to the root.
                    None => {
                        rel["is_falling_back"] = json!(true);
                        rel["m.in_reply_to"] = json!({"event_id": root});
                    }
                }
                content["m.relates_to"] = rel;
            }
            (None, Some(e)) => {
                content["m.relates_to"] = json!({"m.in_reply_to": {"event_id": e}});
            }
            (None, None) => {}
        }
    }
}

fn text_content(r: &Rendered) -> Value {
    json!({
        "msgtype": "m.text",
        "body": r.plain,
        "format": "org.matrix.custom.html",
        "formatted_body": r.html,
    })
}

#[async_trait]
impl DraftPlatform for Target<'_> {
    type Id = String;
    type Text = Rendered;

    fn preview(&self, markdown: &str) -> Option<Rendered> {
        let first = chunks(markdown).into_iter().next()?;
        Some(first)
    }

    async fn post(&self, slot: Slot, text: &Rendered) -> Result<Option<String>, ChannelError> {
        let (txn, reply) = match slot {
            // A draft is best effort: a fresh transaction id.
            Slot::Draft => (format!("{}-draft", self.outbound), true),
            Slot::Chunk(i) => (format!("{}-{i}", self.outbound), i == 0),
        };
        let mut content = text_content(text);
        self.relate(&mut content, reply);
        let id = self
            .inner
            .send_event(&self.room, "m.room.message", &txn, &content)
            .await?;
        Ok(Some(id).filter(|i| !i.is_empty()))
    }

    async fn edit(&self, id: &String, text: &Rendered) -> Result<Edited, ChannelError> {
        let mut content = text_content(&Rendered {
            plain: format!("* {}", text.plain),
            html: format!("* {}", text.html),
        });
        content["m.new_content"] = text_content(text);
        content["m.relates_to"] = json!({"rel_type": "m.replace", "event_id": id});
        // The outbound id is unique per delta and per final: an edit resent after a crash
        // reuses its transaction id.
        let txn = format!("{}-edit", self.outbound);
        self.inner
            .send_event(&self.room, "m.room.message", &txn, &content)
            .await?;
        Ok(Edited::Done)
    }
}

#[async_trait]
impl SendFiles for Target<'_> {
    /// Upload the file and post it in the room and thread (no quote), with transaction id
    /// `<outbound id>-f<index>` (a resend reuses it); a file over the limit becomes a notice.
    async fn send_file(
        &self,
        index: usize,
        f: &OutboundFile,
        _first: bool,
    ) -> Result<SentRef, ChannelError> {
        let txn = format!("{}-f{index}", self.outbound);
        let limit = self.inner.cfg.max_upload_bytes;
        let bytes = if f.size > limit {
            None
        } else {
            Some(clawft_channel_core::media::read_file(f).await?)
        };
        let Some(bytes) = bytes.filter(|b| b.len() as u64 <= limit) else {
            let note = format!(
                "{} ({} KB) is over the {} KB limit for files sent to Matrix, so it was not sent.",
                f.name,
                f.size.div_ceil(1024),
                limit / 1024
            );
            let mut content = json!({"msgtype": "m.notice", "body": note});
            self.relate(&mut content, false);
            return self
                .inner
                .send_event(&self.room, "m.room.message", &txn, &content)
                .await
                .map(SentRef::from);
        };
        let size = bytes.len();
        let uri = self.inner.api.upload(&f.name, &f.mime, bytes).await?;
        let msgtype = match f.kind {
            MediaKind::Image => "m.image",
            MediaKind::Voice | MediaKind::Audio => "m.audio",
            MediaKind::Video => "m.video",
            MediaKind::Document => "m.file",
        };
        let mut content = json!({
            "msgtype": msgtype,
            "body": f.name,
            "filename": f.name,
            "url": uri,
            "info": {"mimetype": f.mime, "size": size},
        });
        self.relate(&mut content, false);
        self.inner
            .send_event(&self.room, "m.room.message", &txn, &content)
            .await
            .map(SentRef::from)
    }
}

impl SendPlatform for Target<'_> {
    fn render(&self, markdown: &str) -> Vec<Rendered> {
        chunks(markdown)
    }
}

/// Markdown → rendered chunks of at most [`MAX_CHUNK_BYTES`] (plain + HTML), in order.
pub fn chunks(md: &str) -> Vec<Rendered> {
    let mut out = Vec::new();
    chunk_into(md, SPLIT_BYTES, &mut out);
    out
}

fn chunk_into(md: &str, max: usize, out: &mut Vec<Rendered>) {
    for piece in split_markdown(md, max, Measure::Bytes) {
        let r = render::render(&piece);
        if r.size() <= MAX_CHUNK_BYTES || max <= 256 {
            if !r.plain.trim().is_empty() {
                out.push(r);
            }
        } else {
            chunk_into(&piece, max / 2, out);
        }
    }
}

/// The chat id of a room (or the thread id of an event): its id with `%` written `%25` and `:`
/// written `%3A`, since session keys use `:` between their parts. Room ids of room versions
/// before 12 end in `:server`; user ids never go through this.
pub fn chat_of(room: &str) -> String {
    room.replace('%', "%25").replace(':', "%3A")
}

/// The room (or event) id a chat (or thread) id stands for ([`chat_of`] undone).
pub fn room_of(chat: &str) -> String {
    let mut out = String::with_capacity(chat.len());
    let mut rest = chat;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(t) = tail
            .strip_prefix("%3A")
            .or_else(|| tail.strip_prefix("%3a"))
        {
            out.push(':');
            rest = t;
        } else if let Some(t) = tail.strip_prefix("%25") {
            out.push('%');
            rest = t;
        } else {
            out.push('%');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// `mxc://server/media` → (`server`, `media`).
fn parse_mxc(uri: &str) -> Option<(&str, &str)> {
    let rest = uri.strip_prefix("mxc://")?;
    let (server, media) = rest.split_once('/')?;
    let ok = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:[]".contains(&b))
    };
    (ok(server) && ok(media)).then_some((server, media))
}

#[async_trait]
impl Channel for MatrixChannel {
    fn id(&self) -> &ChannelId {
        &self.inner.cfg.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            streaming: self.inner.cfg.stream_edits,
            progress: false,
            max_message_bytes: MAX_CHUNK_BYTES,
            max_upload_bytes: self.inner.cfg.max_upload_bytes,
        }
    }

    async fn listen(
        &self,
        tx: mpsc::Sender<InboundDelivery>,
        cancel: CancellationToken,
    ) -> Result<(), ChannelError> {
        sync::run(self.inner.clone(), tx, cancel).await
    }

    async fn send(&self, msg: &OutboundMessage) -> Result<SentRef, ChannelError> {
        let caps = self.capabilities();
        self.inner
            .send
            .send(&caps, msg, || Ok(self.target(msg)))
            .await
    }

    async fn typing(&self, chat: &ChatId, _thread: Option<&ThreadId>) -> Result<(), ChannelError> {
        let me = self.inner.me().await?;
        let room = room_of(chat.as_str());
        let url = self
            .inner
            .api
            .url(&["_matrix", "client", "v3", "rooms", &room, "typing", &me]);
        self.inner
            .api
            .call(
                Method::PUT,
                url,
                Some(&json!({"typing": true, "timeout": 10_000})),
                Duration::from_secs(15),
            )
            .await
            .map(drop)
    }

    async fn media_request(&self, media: &MediaRef) -> Result<MediaRequest, ChannelError> {
        let (server, id) = parse_mxc(&media.id).ok_or_else(|| {
            ChannelError::Rejected(format!("`{}` is not an mxc:// media URI", media.id))
        })?;
        let api = &self.inner.api;
        let authenticated = self.inner.authenticated_media.load(Ordering::Relaxed);
        let url = if authenticated {
            api.url(&["_matrix", "client", "v1", "media", "download", server, id])
        } else {
            api.url(&["_matrix", "media", "v3", "download", server, id])
        };
        let headers = if authenticated {
            vec![(
                "Authorization".to_string(),
                format!("Bearer {}", api.token()),
            )]
        } else {
            Vec::new()
        };
        Ok(MediaRequest {
            url: url.to_string(),
            headers,
            // The configured homeserver's own origin.
            trusted: true,
        })
    }

    fn state(&self) -> String {
        self.inner.status.locked().clone()
    }

    fn settled(&self, msg: &OutboundMessage) {
        self.inner.send.settled(msg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_splits_under_the_event_limit_in_order() {
        let para = "word ".repeat(200);
        let md = (0..200)
            .map(|i| format!("{i}: {para}"))
            .collect::<Vec<_>>()
            .join("\n\n");
        let c = chunks(&md);
        assert!(c.len() > 1);
        assert!(c.iter().all(|r| r.size() <= MAX_CHUNK_BYTES));
        let all: String = c
            .iter()
            .map(|r| r.plain.as_str())
            .collect::<Vec<_>>()
            .join("\n\n");
        assert!(all.starts_with("0: ") && all.contains("199: "));
    }

    #[test]
    fn room_ids_with_colons_make_chat_ids_without_and_back() {
        for room in [
            "!abc:example.org",
            "!hash-no-server",
            "!a%3A:[::1]:8448",
            "$ev:hs",
        ] {
            let chat = chat_of(room);
            assert!(!chat.contains(':'), "{chat}");
            assert_eq!(room_of(&chat), room);
        }
    }

    #[test]
    fn mxc_uris_parse_and_hostile_ones_do_not() {
        assert_eq!(
            parse_mxc("mxc://localhost/AbC_1"),
            Some(("localhost", "AbC_1"))
        );
        assert_eq!(parse_mxc("mxc://h/../../x"), None);
        assert_eq!(parse_mxc("https://h/x"), None);
    }
}
