//! The email channel: one mailbox per account, IMAP `IDLE` in, SMTP out.
//!
//! - **Inbound.** `listen` logs in over IMAP, selects the mailbox and reads every message past
//!   the stored cursor (`UIDVALIDITY:next UID`, under the state key `cursor`), oldest first,
//!   then waits in `IDLE` for the next one. A message is fetched with `BODY.PEEK[]` (not marked
//!   read); after the daemon acknowledges it (journaled, a duplicate, or refused) it is marked
//!   `\Seen` and the cursor moves past it, so a restart reads nothing twice and misses nothing
//!   that arrived while it was down. Without a cursor (first start) or when the mailbox's
//!   `UIDVALIDITY` changed, the unread (`UNSEEN`) messages are read; the daemon dedupes on the
//!   event id (the `Message-ID`).
//! - **Senders.** The sender is the `From:` address (lower-cased). It is believed only as the
//!   configured [`SenderAuth`] says ([`auth`]); mail failing it, mail sent by machines
//!   (`Auto-Submitted`, `Precedence: bulk`) and our own mail are skipped (marked read, never
//!   delivered).
//! - **Threads.** A thread is a session: the chat is the sender's address, the thread id a hash
//!   of the thread's first `Message-ID` (the first of `References`, else `In-Reply-To`, else the
//!   mail's own). Replies answer the thread's latest mail: `Re:` subject, `In-Reply-To`,
//!   `References`, the mail quoted below the answer.
//! - **Outbound.** Markdown is sent as `multipart/alternative` (the Markdown as text, and HTML);
//!   files as `multipart/mixed`. The `Message-ID` is derived from the outbound id
//!   (`weft.<id>@<domain>`), so a resend is recognisable; a delivered id is journaled and not
//!   sent again, and with `sent_mailbox` the copy in that mailbox is looked up before sending.
//! - **Files in.** Attachments are reported as media `UIDVALIDITY.UID.INDEX`;
//!   `media_request` fetches the message again and hands the file over as a `data:` URL.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use clawft_channel_core::backoff::Backoff;
use clawft_channel_core::lock::MutexExt;
use clawft_channel_core::media::{MediaKind, MediaRef, MediaRequest};
use clawft_channel_core::{
    now_ms, Ack, Capabilities, Channel, ChannelError, ChannelId, ChatId, InboundDelivery,
    InboundEvent, MemoryState, OutboundMessage, PlatformEventId, SentRef, StateStore, ThreadId,
    UserId,
};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub mod auth;
pub mod imap;
pub mod mime;
pub mod net;
mod settings;
pub mod smtp;

pub use auth::SenderAuth;
pub use net::TlsMode;
pub use settings::{Email, EmailFile, EmailSettings};

use imap::{IdleEnd, Imap, ImapError};

/// State key of the cursor (`UIDVALIDITY:next UID`).
pub const CURSOR_KEY: &str = "cursor";
/// Longest reconnect backoff (5 min): the delay starts at 1 s and doubles up to it.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// Most `References` kept per thread.
const MAX_REFERENCES: usize = 20;
/// Most characters of a mail quoted in the reply.
const MAX_QUOTE_CHARS: usize = 2000;

/// 64-bit FNV-1a (stable across versions: thread ids and MIME boundaries).
pub fn fnv64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Resolved settings of one mailbox.
#[derive(Clone)]
pub struct EmailConfig {
    /// Channel id (default `email`).
    pub id: ChannelId,
    /// IMAP server.
    pub imap_host: String,
    /// IMAP port.
    pub imap_port: u16,
    /// IMAP TLS.
    pub imap_tls: TlsMode,
    /// SMTP submission server.
    pub smtp_host: String,
    /// SMTP port.
    pub smtp_port: u16,
    /// SMTP TLS.
    pub smtp_tls: TlsMode,
    /// Login name (IMAP and SMTP).
    pub username: String,
    /// Password. Never printed by `Debug`.
    pub password: String,
    /// The bot's address (`From:` of its mail).
    pub address: String,
    /// Display name on `From:`.
    pub from_name: Option<String>,
    /// The mailbox read (default `INBOX`).
    pub mailbox: String,
    /// A mailbox a copy of every sent mail is appended to, and looked up before a resend.
    pub sent_mailbox: Option<String>,
    /// How `From:` is believed.
    pub sender_auth: SenderAuth,
    /// How long one `IDLE` lasts before it is renewed (servers drop it after 30 min).
    pub idle_timeout: Duration,
    /// Largest inbound mail read, in bytes (a bigger one is skipped).
    pub max_mail_bytes: u64,
    /// Largest total of files attached to one outbound mail.
    pub max_upload_bytes: u64,
    /// Trust only these CA certificates (PEM) for IMAP and SMTP, instead of the Mozilla roots.
    pub ca_pem: Option<Vec<u8>>,
    /// Cursor, threads and sent ids across restarts.
    pub state: Arc<dyn StateStore>,
}

impl Default for EmailConfig {
    fn default() -> Self {
        Self {
            id: ChannelId::new("email"),
            imap_host: String::new(),
            imap_port: 993,
            imap_tls: TlsMode::Implicit,
            smtp_host: String::new(),
            smtp_port: 587,
            smtp_tls: TlsMode::StartTls,
            username: String::new(),
            password: String::new(),
            address: String::new(),
            from_name: None,
            mailbox: "INBOX".into(),
            sent_mailbox: None,
            sender_auth: SenderAuth::Unchecked,
            idle_timeout: Duration::from_secs(600),
            max_mail_bytes: 25 * 1024 * 1024,
            max_upload_bytes: 20 * 1024 * 1024,
            ca_pem: None,
            state: Arc::new(MemoryState::default()),
        }
    }
}

impl fmt::Debug for EmailConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmailConfig")
            .field("id", &self.id)
            .field("imap", &(&self.imap_host, self.imap_port, self.imap_tls))
            .field("smtp", &(&self.smtp_host, self.smtp_port, self.smtp_tls))
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field("address", &self.address)
            .field("mailbox", &self.mailbox)
            .field("sender_auth", &self.sender_auth)
            .finish_non_exhaustive()
    }
}

/// What a thread's next reply answers: its latest mail.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct ThreadMeta {
    subject: String,
    /// `Message-ID` of the latest mail (the reply's `In-Reply-To`).
    last: Option<String>,
    /// `References` of the reply.
    refs: Vec<String>,
    /// Who wrote the mail quoted, and when.
    quote_from: String,
    quote_date: Option<String>,
    quote: String,
}

/// What happened to one message.
enum Step {
    /// Handled (delivered and acknowledged, or skipped): mark it read, move the cursor.
    Done,
    /// Shut down while waiting.
    Stop,
    /// Not acknowledged: read it again later.
    Unacked(String),
}

/// The email channel.
pub struct EmailChannel {
    cfg: EmailConfig,
    status: Mutex<String>,
}

/// Whether `s` looks like a mail address usable as a chat id.
pub fn is_address(s: &str) -> bool {
    let Some((local, domain)) = s.rsplit_once('@') else {
        return false;
    };
    !local.is_empty()
        && domain.contains('.')
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && !s.contains("..")
        && s.len() <= 254
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "@.!#$%&'*+-=?^_`{|}~".contains(c))
}

/// The wait a refusal names (`try again in 30 seconds`), in seconds, at most an hour.
fn wait_named(text: &str) -> Option<u64> {
    text.split("in ").skip(1).find_map(|rest| {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let unit = rest[digits.len()..].trim_start();
        (!digits.is_empty() && unit.starts_with("sec"))
            .then(|| digits.parse::<u64>().ok())
            .flatten()
            .map(|n| n.min(3600))
    })
}

fn domain(addr: &str) -> &str {
    addr.rsplit_once('@').map_or("localhost", |(_, d)| d)
}

fn thread_key(chat: &str, thread: &str) -> String {
    format!("thread.{chat}.{thread}")
}

impl EmailChannel {
    /// Check the settings. Nothing is contacted yet.
    ///
    /// # Errors
    /// [`ChannelError::Fatal`] naming the setting that is wrong.
    pub fn new(cfg: EmailConfig) -> Result<Self, ChannelError> {
        if cfg.imap_host.trim().is_empty() {
            return Err(ChannelError::Fatal(
                "channels.email.imap_host is not set".into(),
            ));
        }
        if cfg.smtp_host.trim().is_empty() {
            return Err(ChannelError::Fatal(
                "channels.email.smtp_host is not set".into(),
            ));
        }
        if !is_address(&cfg.address) {
            return Err(ChannelError::Fatal(format!(
                "channels.email.address `{}` is not a mail address",
                cfg.address
            )));
        }
        Ok(Self {
            cfg,
            status: Mutex::new("not started".into()),
        })
    }

    /// The config key of setting `k` of this mailbox (`channels.email.k`, or
    /// `channels.email.accounts.NAME.k` for the channel `email.NAME`).
    fn key(&self, k: &str) -> String {
        match self.cfg.id.as_str().split_once('.') {
            Some((_, account)) => format!("channels.email.accounts.{account}.{k}"),
            None => format!("channels.email.{k}"),
        }
    }

    fn set_status(&self, s: impl Into<String>) {
        *self.status.locked() = s.into();
    }

    fn imap_error(&self, e: ImapError) -> ChannelError {
        match e {
            ImapError::Auth(m) => ChannelError::Auth(format!(
                "the IMAP server refused the login of {} ({m}): check {} and {}",
                self.cfg.username,
                self.key("username"),
                self.key("password")
            )),
            other => ChannelError::Transient(other.to_string()),
        }
    }

    async fn connect(&self) -> Result<Imap, ChannelError> {
        Imap::login(
            &self.cfg.imap_host,
            self.cfg.imap_port,
            self.cfg.imap_tls,
            &self.cfg.username,
            &self.cfg.password,
            usize::try_from(self.cfg.max_mail_bytes)
                .unwrap_or(usize::MAX)
                .saturating_add(64 * 1024),
            self.cfg.ca_pem.as_deref(),
        )
        .await
        .map_err(|e| self.imap_error(e))
    }

    fn cursor(&self) -> Option<(u32, u32)> {
        let v = self.cfg.state.get(CURSOR_KEY)?;
        let (a, b) = v.split_once(':')?;
        Some((a.parse().ok()?, b.parse().ok()?))
    }

    fn save_cursor(&self, validity: u32, next: u32) {
        if let Err(e) = self
            .cfg
            .state
            .put(CURSOR_KEY, &format!("{validity}:{next}"))
        {
            tracing::warn!(error = %e, "could not store the email cursor");
        }
    }

    fn thread_meta(&self, chat: &str, thread: &str) -> Option<ThreadMeta> {
        let v = self.cfg.state.get(&thread_key(chat, thread))?;
        serde_json::from_str(&v).ok()
    }

    fn put_thread_meta(&self, chat: &str, thread: &str, meta: &ThreadMeta) {
        let Ok(v) = serde_json::to_string(meta) else {
            return;
        };
        if let Err(e) = self.cfg.state.put(&thread_key(chat, thread), &v) {
            tracing::warn!(error = %e, "could not store the email thread");
        }
    }

    /// One connection: read what is pending, `IDLE`, repeat. `Ok` when cancelled.
    async fn session(
        &self,
        tx: &mpsc::Sender<InboundDelivery>,
        cancel: &CancellationToken,
        backoff: &mut Backoff,
    ) -> Result<(), ChannelError> {
        let mut imap = tokio::select! {
            r = self.connect() => r?,
            () = cancel.cancelled() => return Ok(()),
        };
        let sel = imap
            .select(&self.cfg.mailbox, false)
            .await
            .map_err(|e| self.imap_error(e))?;
        self.set_status(format!("connected as {}", self.cfg.address));
        backoff.reset();
        loop {
            let uids = match self.cursor() {
                Some((v, next)) if v == sel.validity => imap
                    .search(&format!("UID {next}:*"))
                    .await
                    .map_err(|e| self.imap_error(e))?
                    .into_iter()
                    .filter(|u| *u >= next)
                    .collect(),
                other => {
                    if other.is_some() {
                        tracing::warn!(
                            mailbox = %self.cfg.mailbox,
                            "the mailbox's UIDVALIDITY changed: reading its unread messages"
                        );
                    }
                    let uids = imap
                        .search("UNSEEN")
                        .await
                        .map_err(|e| self.imap_error(e))?;
                    if uids.is_empty() {
                        self.save_cursor(sel.validity, sel.next);
                    }
                    uids
                }
            };
            for uid in uids {
                match self
                    .deliver_one(&mut imap, sel.validity, uid, tx, cancel)
                    .await?
                {
                    Step::Done => {
                        imap.mark_seen(uid).await.map_err(|e| self.imap_error(e))?;
                        self.save_cursor(sel.validity, uid.saturating_add(1));
                    }
                    Step::Stop => {
                        imap.logout().await;
                        return Ok(());
                    }
                    Step::Unacked(why) => return Err(ChannelError::Transient(why)),
                }
            }
            match imap
                .idle(self.cfg.idle_timeout, cancel)
                .await
                .map_err(|e| self.imap_error(e))?
            {
                IdleEnd::Cancelled => {
                    imap.logout().await;
                    return Ok(());
                }
                IdleEnd::Changed | IdleEnd::Timeout => {}
            }
        }
    }

    async fn deliver_one(
        &self,
        imap: &mut Imap,
        validity: u32,
        uid: u32,
        tx: &mpsc::Sender<InboundDelivery>,
        cancel: &CancellationToken,
    ) -> Result<Step, ChannelError> {
        let Some(size) = imap.size(uid).await.map_err(|e| self.imap_error(e))? else {
            return Ok(Step::Done);
        };
        if size > self.cfg.max_mail_bytes {
            tracing::warn!(
                uid,
                size,
                limit = self.cfg.max_mail_bytes,
                "mail over max_mail_mb skipped"
            );
            return Ok(Step::Done);
        }
        let Some(raw) = imap.fetch(uid).await.map_err(|e| self.imap_error(e))? else {
            return Ok(Step::Done);
        };
        let Some(m) = mime::parse(&raw) else {
            tracing::warn!(uid, "mail without a From: address skipped");
            return Ok(Step::Done);
        };
        if m.from == self.cfg.address.to_ascii_lowercase() {
            return Ok(Step::Done);
        }
        if m.automatic {
            tracing::info!(uid, from = %m.from, "automatic mail (Auto-Submitted or bulk) not answered");
            return Ok(Step::Done);
        }
        if !is_address(&m.from) {
            tracing::warn!(uid, from = %m.from, "mail from an address that cannot name a chat skipped");
            return Ok(Step::Done);
        }
        if let Err(why) = auth::check(&self.cfg.sender_auth, &m.auth_results, &m.from) {
            tracing::warn!(uid, from = %m.from, reason = %why, "mail refused: its sender is not authenticated");
            return Ok(Step::Done);
        }
        let fallback = format!("uid-{validity}-{uid}");
        let own = m.message_id.clone().unwrap_or_else(|| fallback.clone());
        let root = m
            .references
            .first()
            .or(m.in_reply_to.as_ref())
            .cloned()
            .unwrap_or_else(|| own.clone());
        let thread = format!("{:016x}", fnv64(root.as_bytes()));
        let mut refs = m.references.clone();
        if refs.is_empty() {
            refs.extend(m.in_reply_to.clone());
        }
        refs.push(own.clone());
        let skip = refs.len().saturating_sub(MAX_REFERENCES);
        // Keep the root (first) and the most recent ones.
        if skip > 0 {
            refs.drain(1..=skip);
        }
        // What a reply needs to thread; the text to quote only once the gateway took the mail
        // (a refused one, too big or from a stranger, leaves nothing of its text behind).
        let mut meta = ThreadMeta {
            subject: m.subject.clone(),
            last: Some(own.clone()),
            refs,
            quote_from: m.from.clone(),
            quote_date: m.date.clone(),
            quote: String::new(),
        };
        self.put_thread_meta(&m.from, &thread, &meta);
        let attachments = m
            .attachments
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let mut r =
                    MediaRef::new(MediaKind::of_mime(&a.mime), format!("{validity}.{uid}.{i}"));
                r.name.clone_from(&a.name);
                r.mime = Some(a.mime.clone());
                r.size = Some(a.size);
                r
            })
            .collect();
        let new_thread = m.references.is_empty() && m.in_reply_to.is_none();
        let content = if new_thread && !m.subject.is_empty() {
            format!("Subject: {}\n\n{}", m.subject, m.text)
        } else {
            m.text.clone()
        };
        let event = InboundEvent {
            channel: self.cfg.id.clone(),
            chat: ChatId::new(m.from.clone()),
            thread: Some(ThreadId::new(thread.clone())),
            sender: UserId::new(m.from.clone()),
            sender_name: m.from_name.clone(),
            event_id: PlatformEventId::new(own),
            content,
            received_at_ms: now_ms(),
            attachments,
            origin: clawft_channel_core::Origin::User,
        };
        let (delivery, ack) = InboundDelivery::new(event);
        tokio::select! {
            r = tx.send(delivery) => if r.is_err() { return Ok(Step::Stop) },
            () = cancel.cancelled() => return Ok(Step::Stop),
        }
        let ack = tokio::select! {
            a = ack => a,
            () = cancel.cancelled() => return Ok(Step::Stop),
        };
        Ok(match ack {
            Ok(Ack::Accepted | Ack::Duplicate) => {
                meta.quote = m.text.chars().take(MAX_QUOTE_CHARS).collect();
                self.put_thread_meta(&m.from, &thread, &meta);
                Step::Done
            }
            Ok(Ack::Rejected(why)) => {
                tracing::info!(uid, reason = %why, "mail refused by the gateway");
                Step::Done
            }
            Ok(Ack::Unavailable(why)) => Step::Unacked(why),
            Err(_) => Step::Unacked("a delivery was not acknowledged".into()),
        })
    }

    fn message_id(&self, outbound_id: &str) -> String {
        let clean: String = outbound_id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        format!("weft.{clean}@{}", domain(&self.cfg.address))
    }

    fn smtp_error(&self, e: smtp::SmtpError) -> ChannelError {
        match e {
            smtp::SmtpError::Io(e) => ChannelError::Transient(format!("SMTP: {e}")),
            smtp::SmtpError::Reply { code, text } => {
                let lower = text.to_ascii_lowercase();
                if matches!(code, 530 | 534 | 535) {
                    ChannelError::Auth(format!(
                        "the SMTP server refused the login ({code} {text}): check {} and {}",
                        self.key("username"),
                        self.key("password")
                    ))
                } else if (400..500).contains(&code)
                    && (lower.contains("rate")
                        || lower.contains("too many")
                        || lower.contains("throttl")
                        || lower.contains("4.7.0"))
                {
                    ChannelError::RateLimited {
                        retry_after: Some(Duration::from_secs(wait_named(&lower).unwrap_or(60))),
                    }
                } else if (400..500).contains(&code) {
                    ChannelError::Transient(format!("SMTP {code} {text}"))
                } else {
                    ChannelError::Rejected(format!("SMTP {code} {text}"))
                }
            }
            smtp::SmtpError::Config(m) => ChannelError::Fatal(format!(
                "{m}: check {} and {}",
                self.key("smtp_tls"),
                self.key("smtp_port")
            )),
        }
    }

    /// Whether `sent_mailbox` already holds the mail with this `Message-ID`.
    async fn already_in_sent(&self, mailbox: &str, message_id: &str) -> Result<bool, ChannelError> {
        let mut imap = self.connect().await?;
        let r = async {
            imap.select(mailbox, true).await?;
            imap.search(&format!(
                "HEADER Message-ID {}",
                imap::quote(&format!("<{message_id}>"))
            ))
            .await
        }
        .await;
        imap.logout().await;
        r.map(|u| !u.is_empty()).map_err(|e| self.imap_error(e))
    }

    async fn append_sent(&self, mailbox: &str, raw: &[u8]) -> Result<(), ChannelError> {
        let mut imap = self.connect().await?;
        let r = imap.append(mailbox, "\\Seen", raw).await;
        imap.logout().await;
        r.map_err(|e| self.imap_error(e))
    }
}

#[async_trait]
impl Channel for EmailChannel {
    fn id(&self) -> &ChannelId {
        &self.cfg.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            streaming: false,
            progress: false,
            max_message_bytes: 1 << 20,
            max_upload_bytes: self.cfg.max_upload_bytes,
        }
    }

    async fn listen(
        &self,
        tx: mpsc::Sender<InboundDelivery>,
        cancel: CancellationToken,
    ) -> Result<(), ChannelError> {
        let mut backoff = Backoff::new(Duration::from_secs(1), MAX_BACKOFF);
        loop {
            let err = match self.session(&tx, &cancel, &mut backoff).await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if let ChannelError::Auth(m) = &err {
                self.set_status(format!("auth failed: {m}"));
                return Err(err);
            }
            let delay = backoff.next_delay();
            let attempt = backoff.attempt();
            tracing::warn!(attempt, ?delay, error = %err, "email: IMAP failed; reconnecting");
            self.set_status(format!("reconnecting (attempt {attempt}): {err}"));
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = cancel.cancelled() => return Ok(()),
            }
        }
    }

    async fn send(&self, msg: &OutboundMessage) -> Result<SentRef, ChannelError> {
        // Deltas and progress: a mail is sent whole.
        if !self.capabilities().takes(msg.kind()) {
            return Ok(SentRef::Nothing);
        }
        let sent_key = format!("sent.{}", msg.id);
        if let Some(mid) = self.cfg.state.get(&sent_key).filter(|v| !v.is_empty()) {
            return Ok(SentRef::message(mid));
        }
        let to = msg.chat.as_str();
        if !is_address(to) {
            return Err(ChannelError::Rejected(format!(
                "`{to}` is not a mail address"
            )));
        }
        let mid = self.message_id(&msg.id);
        if let Some(sent_box) = &self.cfg.sent_mailbox {
            match self.already_in_sent(sent_box, &mid).await {
                Ok(true) => {
                    tracing::info!(message_id = %mid, "already in the sent mailbox: not sent again");
                    let _ = self.cfg.state.put(&sent_key, &mid);
                    return Ok(SentRef::message(mid));
                }
                Ok(false) => {}
                Err(e) => return Err(e),
            }
        }
        let thread = msg.thread.as_ref().map(ThreadId::as_str);
        let meta = thread.and_then(|t| self.thread_meta(to, t));
        let mut text = msg.text().to_string();
        let mut files = Vec::new();
        let mut total = 0u64;
        for f in &msg.attachments {
            if total.saturating_add(f.size) > self.cfg.max_upload_bytes {
                text.push_str(&format!(
                    "\n\n({} was not attached: over the {} MB limit of one mail)",
                    f.name,
                    self.cfg.max_upload_bytes / (1024 * 1024)
                ));
                continue;
            }
            total = total.saturating_add(f.size);
            files.push(mime::OutFile {
                name: f.name.clone(),
                mime: f.mime.clone(),
                bytes: clawft_channel_core::media::read_file(f).await?,
            });
        }
        let subject = match &meta {
            Some(m) => mime::reply_subject(&m.subject),
            None => match &self.cfg.from_name {
                Some(n) => format!("A message from {n}"),
                None => "A message for you".into(),
            },
        };
        let date = mime::rfc5322_date(now_ms() / 1000);
        let quote = meta
            .as_ref()
            .filter(|m| !m.quote.is_empty())
            .map(|m| mime::Quote {
                attribution: match &m.quote_date {
                    Some(d) => format!("On {d}, {} wrote:", m.quote_from),
                    None => format!("{} wrote:", m.quote_from),
                },
                text: m.quote.clone(),
            });
        let empty = Vec::new();
        let raw = mime::build(&mime::Outgoing {
            from: &self.cfg.address,
            from_name: self.cfg.from_name.as_deref(),
            to,
            subject: &subject,
            message_id: &mid,
            in_reply_to: meta.as_ref().and_then(|m| m.last.as_deref()),
            references: meta.as_ref().map_or(&empty, |m| &m.refs),
            date: &date,
            markdown: &text,
            quote,
            files,
        });
        let sub = smtp::Submission {
            host: &self.cfg.smtp_host,
            port: self.cfg.smtp_port,
            tls: self.cfg.smtp_tls,
            user: &self.cfg.username,
            password: &self.cfg.password,
            helo: domain(&self.cfg.address),
            ca_pem: self.cfg.ca_pem.as_deref(),
        };
        smtp::send(&sub, &self.cfg.address, &[to.to_string()], &raw)
            .await
            .map_err(|e| self.smtp_error(e))?;
        if let Err(e) = self.cfg.state.put(&sent_key, &mid) {
            tracing::warn!(error = %e, "could not journal a sent mail");
        }
        if let (Some(t), Some(mut m)) = (thread, meta) {
            // The next mail of this thread follows this one.
            m.refs.push(mid.clone());
            let skip = m.refs.len().saturating_sub(MAX_REFERENCES);
            if skip > 0 {
                m.refs.drain(1..=skip);
            }
            m.last = Some(mid.clone());
            self.put_thread_meta(to, t, &m);
        }
        if let Some(sent_box) = &self.cfg.sent_mailbox {
            if let Err(e) = self.append_sent(sent_box, &raw).await {
                tracing::warn!(error = %e, "could not keep a copy in the sent mailbox");
            }
        }
        Ok(SentRef::message(mid))
    }

    async fn media_request(&self, media: &MediaRef) -> Result<MediaRequest, ChannelError> {
        let bad =
            || ChannelError::Rejected(format!("`{}` is not an email attachment id", media.id));
        let mut it = media.id.split('.');
        let (Some(v), Some(u), Some(i), None) = (it.next(), it.next(), it.next(), it.next()) else {
            return Err(bad());
        };
        let (Ok(validity), Ok(uid), Ok(index)) =
            (v.parse::<u32>(), u.parse::<u32>(), i.parse::<usize>())
        else {
            return Err(bad());
        };
        let mut imap = self.connect().await?;
        let r = async {
            let sel = imap.select(&self.cfg.mailbox, true).await?;
            if sel.validity != validity {
                return Ok(None);
            }
            imap.fetch(uid).await
        }
        .await;
        imap.logout().await;
        let raw = r
            .map_err(|e| self.imap_error(e))?
            .ok_or_else(|| ChannelError::Rejected("the mail is no longer in the mailbox".into()))?;
        let bytes = mime::attachment_bytes(&raw, index)
            .ok_or_else(|| ChannelError::Rejected("the mail has no such attachment".into()))?;
        let mime = media
            .mime
            .as_deref()
            .filter(|m| m.is_ascii() && !m.contains([',', ';', ' ']))
            .unwrap_or("application/octet-stream");
        Ok(MediaRequest {
            url: format!(
                "data:{mime};base64,{}",
                base64::engine::general_purpose::STANDARD.encode(bytes)
            ),
            headers: Vec::new(),
            trusted: true,
        })
    }

    fn state(&self) -> String {
        self.status.locked().clone()
    }

    fn settled(&self, msg: &OutboundMessage) {
        if let Err(e) = self.cfg.state.remove(&format!("sent.{}", msg.id)) {
            tracing::debug!(error = %e, "could not drop a sent mail's journal entry");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_wait_is_read_from_the_refusal() {
        assert_eq!(
            wait_named("4.7.0 rate limit exceeded, try again in 30 seconds"),
            Some(30)
        );
        assert_eq!(wait_named("too many messages in 1 hour"), None);
        assert_eq!(wait_named("retry in 99999 sec"), Some(3600));
    }

    #[test]
    fn addresses_that_can_name_a_chat() {
        assert!(is_address("alice@example.org"));
        assert!(
            !is_address("alice@localhost") && !is_address("a:b@x.org") && !is_address("a..b@x.org")
        );
    }
}
