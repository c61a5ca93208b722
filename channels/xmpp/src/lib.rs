//! The XMPP channel: a small RFC 6120/6121 client of its own (no XMPP crate: see below),
//! one-to-one chats in, replies out, through the gateway's platform contract and send path.
//!
//! - **Connection** ([`conn`]): TCP, then TLS (direct TLS, XEP-0368, or STARTTLS; the password
//!   never travels before TLS), SASL SCRAM-SHA-256 or SCRAM-SHA-1 with the server's signature
//!   checked, a bound resource, initial presence. The daemon restarts [`Channel::listen`] with
//!   its backoff when the stream ends.
//! - **Inbound**: `chat` (and untyped) messages with a body. Chat and sender are the sender's
//!   bare JID; `allow_from` and pairing are the gateway's (ingress). The event id is the
//!   sender's own stanza id (XEP-0359 `origin-id`, else the `id` attribute), scoped by the
//!   sender's bare JID, so a client's resend of the same message is a duplicate; the server's
//!   `stanza-id` (XEP-0359, `by` our account) when the client gave none. A delivery receipt
//!   (XEP-0184) is sent only after ingress journaled the message: a receipt means stored.
//! - **Roster**: a subscription request from an `allow_from` or paired user is accepted (and
//!   returned); anyone else's is left pending.
//! - **Outbound**: each chunk is a `chat` message with a body, asking for a receipt, carrying an
//!   `origin-id`; `typing` is a chat state (XEP-0085).
//!
//! Why no crate: tokio-xmpp and xmpp-parsers bring their own XML stack (rxml, minidom), DNS
//! resolver and SASL crates; what a bot needs here is a few hundred lines on the rustls and
//! ring already in the tree, so the channel adds no dependency of its own.
//!
//! Must not: read the environment or secret files (settings come validated), trust a
//! `stanza-id` that is not stamped by our own account.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use clawft_channel_core::draft::{DraftOptions, DraftPlatform, Edited, Slot};
use clawft_channel_core::lock::MutexExt;
use clawft_channel_core::media::OutboundFile;
use clawft_channel_core::send::{SendFiles, SendPath, SendPlatform};
use clawft_channel_core::spec::PairedCheck;
use clawft_channel_core::text::{split_markdown, Measure};
use clawft_channel_core::{
    Ack, Capabilities, Channel, ChannelError, ChannelId, ChatId, InboundDelivery, InboundEvent,
    MemoryState, OutboundMessage, PlatformEventId, SentRef, StateStore, ThreadId, UserId,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub mod conn;
pub mod scram;
mod settings;
pub mod xml;

pub use conn::{Login, TlsMode};
pub use settings::{Xmpp, XmppFile, XmppSettings};

use xml::{escape, Element, Event};

/// Longest body sent in one message (servers commonly cap stanzas at 256 KiB; clients show
/// long bodies badly).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024;
/// Outbound messages whose progress is remembered in memory (the journal keeps the rest).
const PROGRESS_KEPT: usize = 512;
const NS_RECEIPTS: &str = "urn:xmpp:receipts";
const NS_SID: &str = "urn:xmpp:sid:0";
const NS_CHATSTATES: &str = "http://jabber.org/protocol/chatstates";

/// Resolved settings of one XMPP account.
#[derive(Clone)]
pub struct XmppConfig {
    /// Channel id (default `xmpp`).
    pub id: ChannelId,
    /// How to connect and log in.
    pub login: Login,
    /// Users whose subscription requests are accepted (`allow_from`).
    pub allow_from: std::collections::BTreeSet<String>,
    /// Whether a user was admitted by pairing.
    pub is_paired: PairedCheck,
    /// Durable adapter state (the send journal).
    pub state: Arc<dyn StateStore>,
}

impl XmppConfig {
    /// Settings for `login` with the defaults of everything else.
    pub fn new(login: Login) -> Self {
        Self {
            id: ChannelId::new("xmpp"),
            login,
            allow_from: Default::default(),
            is_paired: Arc::new(|_| false),
            state: Arc::new(MemoryState::default()),
        }
    }
}

impl fmt::Debug for XmppConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XmppConfig")
            .field("id", &self.id)
            .field("jid", &self.login.jid)
            .field("host", &self.login.host)
            .field("port", &self.login.port)
            .finish_non_exhaustive()
    }
}

/// A stanza to write, and who waits for it to be written.
type Outgoing = (String, Option<oneshot::Sender<std::io::Result<()>>>);

struct Inner {
    cfg: XmppConfig,
    status: Mutex<String>,
    /// The writer of the current connection (none while disconnected).
    out: Mutex<Option<mpsc::UnboundedSender<Outgoing>>>,
    send: SendPath<String, String>,
}

impl Inner {
    fn set_status(&self, s: impl Into<String>) {
        *self.status.locked() = s.into();
    }

    /// Write `stanza` on the current connection and wait until it is flushed.
    async fn write(&self, stanza: String) -> Result<(), ChannelError> {
        let (tx, rx) = oneshot::channel();
        let out = self.out.locked().clone();
        let Some(out) = out else {
            return Err(ChannelError::Transient(
                "not connected to the XMPP server".into(),
            ));
        };
        out.send((stanza, Some(tx)))
            .map_err(|_| ChannelError::Transient("the XMPP connection closed".into()))?;
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(ChannelError::Transient(format!("XMPP write: {e}"))),
            Err(_) => Err(ChannelError::Transient("the XMPP connection closed".into())),
        }
    }

    /// Queue `stanza` without waiting (receipts, presence answers).
    fn push(&self, stanza: String) {
        if let Some(out) = self.out.locked().as_ref() {
            let _ = out.send((stanza, None));
        }
    }
}

/// The XMPP channel adapter.
pub struct XmppChannel {
    inner: Arc<Inner>,
}

impl XmppChannel {
    /// Build the adapter (no network until [`Channel::listen`]).
    pub fn new(cfg: XmppConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                send: SendPath::new(
                    DraftOptions {
                        edit_interval: Duration::from_secs(1),
                        capacity: PROGRESS_KEPT,
                        skip_repeated_deltas: true,
                    },
                    cfg.state.clone(),
                ),
                cfg,
                status: Mutex::new("not started".into()),
                out: Mutex::new(None),
            }),
        }
    }
}

/// The bare JID of `jid` (`user@host/res` → `user@host`), lower-cased in its local and domain
/// parts (RFC 7622 compares them case-insensitively for ASCII).
pub fn bare(jid: &str) -> String {
    jid.split_once('/').map_or(jid, |(b, _)| b).to_lowercase()
}

/// Whether `s` is a bare JID of a user (`local@domain`, no resource).
pub fn is_bare_jid(s: &str) -> bool {
    match s.split_once('@') {
        Some((l, d)) => {
            !l.is_empty()
                && !d.is_empty()
                && !s.contains('/')
                && !l.contains(['"', '&', '\'', ':', '<', '>', '@', ' '])
                && !d.contains(['@', ' ', '/'])
                && d.contains(|c: char| c.is_alphanumeric())
        }
        None => false,
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The event id of message `m` from `from_bare` (see the crate's notes), if it has one.
pub fn event_id(m: &Element, from_bare: &str, own_bare: &str) -> Option<String> {
    let origin = m
        .child("origin-id", Some(NS_SID))
        .and_then(|o| o.attr("id"))
        .or_else(|| m.attr("id"))
        .filter(|i| !i.is_empty());
    if let Some(id) = origin {
        return Some(format!("{from_bare}:{id}"));
    }
    m.children
        .iter()
        .find(|c| {
            c.name == "stanza-id"
                && c.ns() == NS_SID
                && c.attr("by").map(bare).as_deref() == Some(own_bare)
        })
        .and_then(|c| c.attr("id"))
        .map(|id| format!("sid:{id}"))
}

/// A `chat` message to `to` with `body`, asking for a receipt.
fn chat_message(to: &str, id: &str, body: &str) -> String {
    format!(
        "<message type='chat' to='{}' id='{id}'><body>{}</body><request xmlns='{NS_RECEIPTS}'/><origin-id xmlns='{NS_SID}' id='{id}'/><active xmlns='{NS_CHATSTATES}'/></message>",
        escape(to),
        escape(body)
    )
}

/// What the connection's reader does with one stanza.
async fn on_stanza(
    inner: &Inner,
    own_bare: &str,
    el: Element,
    tx: &mpsc::Sender<InboundDelivery>,
) -> Result<(), ChannelError> {
    match el.name.as_str() {
        "message" => on_message(inner, own_bare, el, tx).await,
        "iq" => {
            on_iq(inner, &el);
            Ok(())
        }
        "presence" => {
            on_presence(inner, &el);
            Ok(())
        }
        _ => Ok(()),
    }
}

async fn on_message(
    inner: &Inner,
    own_bare: &str,
    m: Element,
    tx: &mpsc::Sender<InboundDelivery>,
) -> Result<(), ChannelError> {
    let kind = m.attr("type").unwrap_or("normal");
    if !matches!(kind, "chat" | "normal") {
        return Ok(());
    }
    let Some(from) = m.attr("from") else {
        return Ok(());
    };
    let from_bare = bare(from);
    if from_bare == own_bare || !is_bare_jid(&from_bare) {
        return Ok(());
    }
    let Some(body) = m.child("body", None).map(|b| b.text.clone()) else {
        return Ok(());
    };
    let Some(event_id) = event_id(&m, &from_bare, own_bare) else {
        tracing::warn!(channel = %inner.cfg.id, from = %from_bare, "XMPP message without an id: read, but a resend of it cannot be recognised");
        return deliver(
            inner,
            &m,
            from,
            &from_bare,
            format!("t:{}", now_ms()),
            body,
            tx,
        )
        .await;
    };
    deliver(inner, &m, from, &from_bare, event_id, body, tx).await
}

async fn deliver(
    inner: &Inner,
    m: &Element,
    from: &str,
    from_bare: &str,
    event_id: String,
    body: String,
    tx: &mpsc::Sender<InboundDelivery>,
) -> Result<(), ChannelError> {
    let event = InboundEvent {
        channel: inner.cfg.id.clone(),
        chat: ChatId::new(from_bare),
        thread: None,
        sender: UserId::new(from_bare),
        sender_name: None,
        event_id: PlatformEventId::new(event_id),
        content: body,
        received_at_ms: now_ms(),
        attachments: Vec::new(),
        origin: Default::default(),
    };
    let (d, ack) = InboundDelivery::new(event);
    tx.send(d)
        .await
        .map_err(|_| ChannelError::Fatal("the gateway stopped taking messages".into()))?;
    let wants_receipt = m.child("request", Some(NS_RECEIPTS)).is_some();
    match ack.await {
        Ok(Ack::Accepted | Ack::Duplicate) => {
            if let (true, Some(id)) = (wants_receipt, m.attr("id")) {
                inner.push(format!(
                    "<message to='{}' id='{}'><received xmlns='{NS_RECEIPTS}' id='{}'/></message>",
                    escape(from),
                    conn::random_id(),
                    escape(id)
                ));
            }
        }
        Ok(Ack::Rejected(why)) => {
            tracing::info!(channel = %inner.cfg.id, from = %from_bare, %why, "XMPP message refused");
        }
        Ok(Ack::Unavailable(why)) => {
            // Never silence: the sender learns it was not stored (no receipt is sent).
            inner.push(chat_message(from_bare, &conn::random_id(), &why));
        }
        Err(_) => {}
    }
    Ok(())
}

fn on_iq(inner: &Inner, iq: &Element) {
    let (Some(kind), Some(id)) = (iq.attr("type"), iq.attr("id")) else {
        return;
    };
    if !matches!(kind, "get" | "set") {
        return;
    }
    let to = iq
        .attr("from")
        .map(|f| format!(" to='{}'", escape(f)))
        .unwrap_or_default();
    let id = escape(id);
    if iq.child("ping", Some("urn:xmpp:ping")).is_some() {
        inner.push(format!("<iq type='result' id='{id}'{to}/>"));
        return;
    }
    if iq
        .child("query", Some("http://jabber.org/protocol/disco#info"))
        .is_some()
    {
        inner.push(format!(
            "<iq type='result' id='{id}'{to}><query xmlns='http://jabber.org/protocol/disco#info'><identity category='client' type='bot' name='weft'/><feature var='http://jabber.org/protocol/disco#info'/><feature var='{NS_RECEIPTS}'/><feature var='{NS_CHATSTATES}'/><feature var='urn:xmpp:ping'/></query></iq>"
        ));
        return;
    }
    if iq.child("query", Some("jabber:iq:roster")).is_some() && kind == "set" {
        // A roster push from our server: acknowledged.
        inner.push(format!("<iq type='result' id='{id}'{to}/>"));
        return;
    }
    inner.push(format!(
        "<iq type='error' id='{id}'{to}><error type='cancel'><service-unavailable xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'/></error></iq>"
    ));
}

fn on_presence(inner: &Inner, p: &Element) {
    if p.attr("type") != Some("subscribe") {
        return;
    }
    let Some(from) = p.attr("from").map(bare) else {
        return;
    };
    if inner.cfg.allow_from.contains(&from) || (inner.cfg.is_paired)(&from) {
        let to = escape(&from);
        inner.push(format!("<presence to='{to}' type='subscribed'/>"));
        inner.push(format!("<presence to='{to}' type='subscribe'/>"));
    } else {
        tracing::info!(channel = %inner.cfg.id, %from, "XMPP subscription request left pending: not in allow_from and not paired");
    }
}

/// One connection, until it ends or `cancel`.
async fn run(
    inner: &Arc<Inner>,
    tx: &mpsc::Sender<InboundDelivery>,
    cancel: &CancellationToken,
) -> Result<(), ChannelError> {
    let l = &inner.cfg.login;
    inner.set_status(format!("connecting to {}:{}", l.host, l.port));
    let session = tokio::select! {
        s = conn::connect(l) => s,
        () = cancel.cancelled() => return Ok(()),
    };
    let session = session.map_err(|e| {
        inner.set_status(format!("login failed: {e}"));
        if e.is_retryable() {
            ChannelError::Transient(e.to_string())
        } else {
            match e {
                conn::ConnError::Auth(m) => ChannelError::Auth(m),
                other => ChannelError::Fatal(other.to_string()),
            }
        }
    })?;
    let own_bare = bare(&session.bound);
    let (mut rd, mut wr) = tokio::io::split(session.stream);
    let mut reader = session.reader;
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Outgoing>();
    let writer = tokio::spawn(async move {
        while let Some((s, done)) = out_rx.recv().await {
            let r = match wr.write_all(s.as_bytes()).await {
                Ok(()) => wr.flush().await,
                Err(e) => Err(e),
            };
            let failed = r.is_err();
            if let Some(d) = done {
                let _ = d.send(r);
            }
            if failed {
                break;
            }
        }
        let _ = wr.write_all(b"</stream:stream>").await;
        let _ = wr.shutdown().await;
    });
    *inner.out.locked() = Some(out_tx);
    inner.push("<presence/>".into());
    inner.set_status(format!("connected as {}", session.bound));
    tracing::info!(channel = %inner.cfg.id, jid = %session.bound, "XMPP connected");
    let result = loop {
        let ev = tokio::select! {
            ev = conn::read_event(&mut rd, &mut reader) => ev,
            () = cancel.cancelled() => break say_goodbye(inner, &own_bare, &mut rd, &mut reader, tx).await,
        };
        match ev {
            Ok(Event::Stanza(el)) if el.name == "stream:error" => {
                let cond = el.children.first().map_or("unknown", |c| c.name.as_str());
                break Err(ChannelError::Transient(format!(
                    "the XMPP server ended the stream: {cond}"
                )));
            }
            Ok(Event::Stanza(el)) => {
                if let Err(e) = on_stanza(inner, &own_bare, el, tx).await {
                    break Err(e);
                }
            }
            Ok(Event::Open(_)) => {}
            Ok(Event::Close) => {
                break Err(ChannelError::Transient(
                    "the XMPP server closed the stream".into(),
                ))
            }
            Err(e) => break Err(ChannelError::Transient(e.to_string())),
        }
    };
    // Dropping the sender ends the writer, which closes the stream.
    *inner.out.locked() = None;
    let _ = writer.await;
    inner.set_status(match &result {
        Ok(()) => "stopped".to_string(),
        Err(e) => format!("disconnected: {e}"),
    });
    result
}

/// How long a stop waits for the server to confirm the bot is offline.
const GOODBYE_WAIT: Duration = Duration::from_secs(5);

/// A graceful stop: tell the server the bot is offline, then read until the server confirms it
/// (a ping answered after the presence), taking in the messages it routed here meanwhile. From
/// then on the server keeps new messages for the next login (offline storage) instead of
/// writing them to a connection about to close, where they would be lost.
async fn say_goodbye<R: tokio::io::AsyncRead + Unpin>(
    inner: &Inner,
    own_bare: &str,
    rd: &mut R,
    reader: &mut xml::Reader,
    tx: &mpsc::Sender<InboundDelivery>,
) -> Result<(), ChannelError> {
    let id = format!("bye-{}", conn::random_id());
    inner.push("<presence type='unavailable'/>".into());
    inner.push(format!(
        "<iq type='get' id='{id}'><ping xmlns='urn:xmpp:ping'/></iq>"
    ));
    let drained = tokio::time::timeout(GOODBYE_WAIT, async {
        loop {
            match conn::read_event(rd, reader).await {
                Ok(Event::Stanza(el)) if el.name == "iq" && el.attr("id") == Some(id.as_str()) => {
                    return Ok(())
                }
                Ok(Event::Stanza(el)) if el.name == "stream:error" => return Ok(()),
                Ok(Event::Stanza(el)) => on_stanza(inner, own_bare, el, tx).await?,
                Ok(Event::Open(_)) => {}
                Ok(Event::Close) | Err(_) => return Ok::<(), ChannelError>(()),
            }
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!(channel = %inner.cfg.id, "the XMPP server did not confirm the bot went offline within 5 s; closing anyway");
    }
    Ok(())
}

/// One outbound message's target, for the send path.
struct Target<'a> {
    ch: &'a XmppChannel,
    msg: &'a OutboundMessage,
}

#[async_trait]
impl DraftPlatform for Target<'_> {
    type Id = String;
    type Text = String;

    /// Not streamed yet: nothing is shown before the final reply.
    fn preview(&self, _markdown: &str) -> Option<String> {
        None
    }

    async fn post(&self, _slot: Slot, text: &String) -> Result<Option<String>, ChannelError> {
        let id = conn::random_id();
        let to = self.msg.chat.as_str();
        self.ch.inner.write(chat_message(to, &id, text)).await?;
        Ok(Some(id))
    }

    /// Never reached (no drafts); a message to replace is posted again.
    async fn edit(&self, _id: &String, _text: &String) -> Result<Edited, ChannelError> {
        Ok(Edited::Gone)
    }
}

#[async_trait]
impl SendFiles for Target<'_> {
    /// Files are not sent yet: a short note says so.
    async fn send_file(
        &self,
        _index: usize,
        f: &OutboundFile,
        _first: bool,
    ) -> Result<SentRef, ChannelError> {
        let id = conn::random_id();
        let note = format!(
            "{} could not be sent: this chat does not take files yet.",
            f.name
        );
        self.ch
            .inner
            .write(chat_message(self.msg.chat.as_str(), &id, &note))
            .await?;
        Ok(SentRef::of(Some(&id)))
    }
}

impl SendPlatform for Target<'_> {
    fn render(&self, markdown: &str) -> Vec<String> {
        split_markdown(markdown, MAX_MESSAGE_BYTES, Measure::Bytes)
            .into_iter()
            .filter(|c| !c.trim().is_empty())
            .collect()
    }
}

#[async_trait]
impl Channel for XmppChannel {
    fn id(&self) -> &ChannelId {
        &self.inner.cfg.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            streaming: false,
            progress: false,
            max_message_bytes: MAX_MESSAGE_BYTES,
            max_upload_bytes: 0,
        }
    }

    async fn listen(
        &self,
        tx: mpsc::Sender<InboundDelivery>,
        cancel: CancellationToken,
    ) -> Result<(), ChannelError> {
        run(&self.inner, &tx, &cancel).await
    }

    async fn send(&self, msg: &OutboundMessage) -> Result<SentRef, ChannelError> {
        let caps = self.capabilities();
        self.inner
            .send
            .send(&caps, msg, || Ok(Target { ch: self, msg }))
            .await
    }

    async fn typing(&self, chat: &ChatId, _thread: Option<&ThreadId>) -> Result<(), ChannelError> {
        self.inner
            .write(format!(
                "<message type='chat' to='{}'><composing xmlns='{NS_CHATSTATES}'/></message>",
                escape(chat.as_str())
            ))
            .await
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
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn msg(s: &str) -> Element {
        let mut r = xml::Reader::default();
        r.feed(s.as_bytes()).unwrap();
        match r.next_event().unwrap() {
            Some(Event::Stanza(e)) => e,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_event_id_is_the_senders_id_else_our_servers_stanza_id() {
        let own = "bot@example.org";
        let m = msg("<message id='a1'><origin-id xmlns='urn:xmpp:sid:0' id='o1'/><stanza-id xmlns='urn:xmpp:sid:0' by='bot@example.org' id='s1'/></message>");
        assert_eq!(
            event_id(&m, "al@example.org", own).as_deref(),
            Some("al@example.org:o1")
        );
        let m = msg("<message id='a1'/>");
        assert_eq!(
            event_id(&m, "al@example.org", own).as_deref(),
            Some("al@example.org:a1")
        );
        let m = msg("<message><stanza-id xmlns='urn:xmpp:sid:0' by='evil@example.org' id='x'/><stanza-id xmlns='urn:xmpp:sid:0' by='bot@example.org' id='s1'/></message>");
        assert_eq!(
            event_id(&m, "al@example.org", own).as_deref(),
            Some("sid:s1")
        );
        let m = msg(
            "<message><stanza-id xmlns='urn:xmpp:sid:0' by='evil@example.org' id='x'/></message>",
        );
        assert_eq!(event_id(&m, "al@example.org", own), None);
    }

    #[test]
    fn bare_jids_are_checked_and_compared_lower_case() {
        assert!(is_bare_jid("alice@example.org"));
        assert!(!is_bare_jid("alice@example.org/phone"));
        assert!(!is_bare_jid("example.org"));
        assert_eq!(bare("Alice@Example.org/Phone"), "alice@example.org");
    }
}
