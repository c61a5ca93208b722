//! The gateway connection: HELLO → IDENTIFY/RESUME, heartbeats with an ACK watchdog, READY /
//! RESUMED / MESSAGE_CREATE dispatches, RECONNECT (op 7), INVALID_SESSION (op 9), close codes,
//! and the reconnect loop with backoff.
//!
//! When to reconnect: after op 7 RECONNECT at once (RESUME); after op 9 INVALID_SESSION after
//! a random 1–5 s, as Discord asks (RESUME when `d` is true, else IDENTIFY); after anything
//! else after the backoff (`reconnect_backoff`, doubling to 60 s). The backoff starts again
//! from its first step after a healthy connection: one whose session was established (READY
//! or RESUMED) and whose heartbeat was acknowledged since. A Close frame from Discord is
//! answered with a Close frame before the connection is dropped (RFC 6455 §5.5.1).
//!
//! Dispatches are queued and handed to the daemon one at a time in sequence order; the stored
//! `seq` moves past an event only after its delivery was acknowledged, so a RESUME (same
//! process or after a restart) makes Discord replay everything not yet journaled.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use clawft_channel_core::backoff::Backoff;
use clawft_channel_core::lock::MutexExt;
use clawft_channel_core::media::{MediaKind, MediaRef};
use clawft_channel_core::{
    now_ms, Ack, ChannelError, ChannelId, ChatId, InboundDelivery, InboundEvent, PlatformEventId,
    UserId,
};
use futures::{SinkExt, StreamExt};
use reqwest::Method;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use crate::{GroupMode, Inner, RESUME_URL_KEY, SEQ_KEY, SESSION_ID_KEY};

/// GUILD_MESSAGES | DIRECT_MESSAGES | MESSAGE_CONTENT.
pub(crate) const INTENTS: u64 = (1 << 9) | (1 << 12) | (1 << 15);
/// Longest backoff between reconnect attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// A connection up at least this long resets the backoff (even without heartbeat ACKs).
const STABLE_AFTER: Duration = Duration::from_secs(30);
/// Shortest and longest wait before reconnecting after op 9 INVALID_SESSION (Discord: "a
/// random amount of time between 1 and 5 seconds").
const INVALID_SESSION_WAIT: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(5));
/// Time allowed for the WebSocket handshake and HELLO.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Dispatches buffered while the daemon is slow; beyond, drop the connection and RESUME.
const MAX_QUEUED: usize = 10_000;
/// Our close code: not 1000/1001, which would end the session and lose RESUME.
const CLOSE_KEEP_SESSION: u16 = 4000;

/// The bot's own user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BotUser {
    /// Snowflake id.
    pub id: String,
    /// Username.
    pub name: String,
}

/// The RESUME state, mirrored in the state store.
#[derive(Default, Debug)]
struct Session {
    id: Option<String>,
    /// Last acknowledged (journaled) sequence.
    seq: u64,
    resume_url: Option<String>,
}

impl Session {
    fn load(inner: &Inner) -> Self {
        let st = &inner.cfg.state;
        Self {
            id: st.get(SESSION_ID_KEY).filter(|s| !s.is_empty()),
            seq: st.get(SEQ_KEY).and_then(|s| s.parse().ok()).unwrap_or(0),
            resume_url: st.get(RESUME_URL_KEY).filter(|s| !s.is_empty()),
        }
    }

    fn save(&self, inner: &Inner) {
        let st = &inner.cfg.state;
        let r = st
            .put(SESSION_ID_KEY, self.id.as_deref().unwrap_or(""))
            .and_then(|()| st.put(RESUME_URL_KEY, self.resume_url.as_deref().unwrap_or("")))
            .and_then(|()| st.put(SEQ_KEY, &self.seq.to_string()));
        if let Err(e) = r {
            tracing::warn!(error = %e, "discord: cannot store the gateway session");
        }
    }

    fn save_seq(&self, inner: &Inner) {
        if let Err(e) = inner.cfg.state.put(SEQ_KEY, &self.seq.to_string()) {
            tracing::warn!(error = %e, "discord: cannot store the gateway sequence");
        }
    }

    fn clear(&mut self, inner: &Inner) {
        *self = Self::default();
        self.save(inner);
    }
}

/// Why a connection ended.
enum End {
    Cancelled,
    Fatal(ChannelError),
    /// Reconnect after the backoff.
    Reconnect(String),
    /// Op 7: Discord asked for a reconnect; RESUME at once.
    ReconnectNow(String),
    /// Op 9: reconnect after a random 1–5 s.
    InvalidSession(String),
}

/// Parse a MESSAGE_CREATE payload into an inbound event, or `None` when it is not for us
/// (bots, webhooks, system messages, unmentioned guild messages in `Mention` mode, empty).
pub fn parse_message(
    d: &Value,
    bot: &BotUser,
    mode: GroupMode,
    channel: &ChannelId,
) -> Option<InboundEvent> {
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let author = d.get("author")?;
    let author_id = s(author, "id")?;
    if author.get("bot").and_then(Value::as_bool).unwrap_or(false)
        || author
            .get("system")
            .and_then(Value::as_bool)
            .unwrap_or(false)
        || author_id == bot.id
        || d.get("webhook_id").is_some_and(|w| !w.is_null())
    {
        return None;
    }
    // 0 = default, 19 = reply; everything else is a system message (joins, pins, ...).
    let kind = d.get("type").and_then(Value::as_u64).unwrap_or(0);
    if kind != 0 && kind != 19 {
        return None;
    }
    let id = s(d, "id")?;
    let chat = s(d, "channel_id")?;
    let content = s(d, "content").unwrap_or_default();
    let mentions = [format!("<@{}>", bot.id), format!("<@!{}>", bot.id)];
    let in_guild = d.get("guild_id").is_some_and(|g| !g.is_null());
    let content = if in_guild {
        let mentioned = mentions.iter().any(|m| content.contains(m.as_str()));
        let replies_to_bot = d
            .get("referenced_message")
            .and_then(|r| r.get("author"))
            .and_then(|a| s(a, "id"))
            .is_some_and(|a| a == bot.id);
        if mode == GroupMode::Mention && !mentioned && !replies_to_bot {
            return None;
        }
        mentions
            .iter()
            .fold(content, |c, m| c.replace(m.as_str(), " "))
    } else {
        content
    };
    let content = normalise_command(content.trim());
    let attachments = attachments_of(d);
    if content.is_empty() && attachments.is_empty() {
        return None;
    }
    Some(InboundEvent {
        channel: channel.clone(),
        chat: ChatId::new(chat),
        thread: None,
        sender: UserId::new(author_id),
        // The server nickname, else the global display name, else the username.
        sender_name: ["member", "author"]
            .into_iter()
            .zip(["nick", "global_name"])
            .find_map(|(o, k)| d.get(o).and_then(|o| s(o, k)))
            .or_else(|| s(author, "username"))
            .and_then(|n| clawft_channel_core::display_name([n.as_str()])),
        event_id: PlatformEventId::new(id),
        content,
        received_at_ms: now_ms(),
        attachments,
        origin: clawft_channel_core::Origin::User,
    })
}

/// Message flag of a voice message (its one attachment is the recording).
const IS_VOICE_MESSAGE: u64 = 1 << 13;

/// The files of a MESSAGE_CREATE (`attachments`), as the payload declares them. The signed
/// CDN `url` is kept (it expires after about a day and carries no bot credential).
fn attachments_of(d: &Value) -> Vec<MediaRef> {
    let voice = d
        .get("flags")
        .and_then(Value::as_u64)
        .is_some_and(|f| f & IS_VOICE_MESSAGE != 0);
    let Some(list) = d.get("attachments").and_then(Value::as_array) else {
        return Vec::new();
    };
    let s = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .filter(|x| !x.is_empty())
            .map(str::to_string)
    };
    list.iter()
        .filter_map(|a| {
            // Snowflakes are strings; tolerate a number.
            let id = s(a, "id")
                .or_else(|| a.get("id").and_then(Value::as_u64).map(|n| n.to_string()))?;
            let mime = s(a, "content_type");
            let kind = if voice {
                MediaKind::Voice
            } else {
                mime.as_deref()
                    .map_or(MediaKind::Document, MediaKind::of_mime)
            };
            Some(MediaRef {
                kind,
                id,
                name: s(a, "filename"),
                mime,
                size: a.get("size").and_then(Value::as_u64),
                url: s(a, "url"),
                duration_secs: a
                    .get("duration_secs")
                    .and_then(Value::as_f64)
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .map(|x| x.round().min(f64::from(u32::MAX)) as u32),
            })
        })
        .collect()
}

/// `/stop@botname rest` → `/stop rest`; anything else unchanged.
fn normalise_command(text: &str) -> String {
    if let Some(cmd) = text.strip_prefix('/') {
        let end = cmd.find(char::is_whitespace).unwrap_or(cmd.len());
        let (word, rest) = cmd.split_at(end);
        if let Some((name, _bot)) = word.split_once('@') {
            if !name.is_empty() {
                return format!("/{name}{rest}");
            }
        }
    }
    text.to_string()
}

fn with_query(url: &str) -> String {
    let base = url.trim_end_matches('/');
    if base.contains('?') {
        base.to_string()
    } else {
        format!("{base}/?v=10&encoding=json")
    }
}

type AckFuture = Pin<Box<dyn Future<Output = Result<Option<Ack>, ()>> + Send>>;

pub(crate) async fn run(
    inner: Arc<Inner>,
    tx: mpsc::Sender<InboundDelivery>,
    cancel: CancellationToken,
) -> Result<(), ChannelError> {
    let min = inner.cfg.reconnect_backoff.max(Duration::from_millis(1));
    let mut backoff = Backoff::new(min, MAX_BACKOFF).reset_after(STABLE_AFTER);
    let mut session = Session::load(&inner);
    let mut gateway: Option<String> = inner.cfg.gateway_url.clone();
    inner.set_status("connecting");
    loop {
        let started = Instant::now();
        let mut healthy = false;
        let end = connect_once(
            &inner,
            &tx,
            &cancel,
            &mut session,
            &mut gateway,
            &mut healthy,
        )
        .await;
        if healthy {
            backoff.reset();
        } else {
            backoff.ended(started.elapsed());
        }
        let (reason, delay) = match end {
            End::Cancelled => {
                inner.set_status("stopped");
                return Ok(());
            }
            End::Fatal(e) => {
                inner.set_status(match &e {
                    ChannelError::Auth(m) => format!("auth failed: {m}"),
                    e => format!("failed: {e}"),
                });
                return Err(e);
            }
            End::Reconnect(r) => (r, backoff.next_delay()),
            End::ReconnectNow(r) => {
                backoff.count_attempt();
                (r, Duration::ZERO)
            }
            End::InvalidSession(r) => {
                backoff.count_attempt();
                let (lo, hi) = INVALID_SESSION_WAIT;
                (r, lo + (hi - lo).mul_f64(jitter()))
            }
        };
        let attempt = backoff.attempt();
        tracing::info!(attempt, reason = %reason, delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX), "discord: reconnecting");
        inner.set_status(format!("reconnecting (attempt {attempt}): {reason}"));
        tokio::select! {
            () = cancel.cancelled() => {
                inner.set_status("stopped");
                return Ok(());
            }
            () = tokio::time::sleep(delay) => {}
        }
    }
}

async fn who_am_i(inner: &Inner) -> Result<BotUser, End> {
    if let Some(b) = inner.bot.locked().clone() {
        return Ok(b);
    }
    let v = inner
        .rest
        .call(Method::GET, "GET /users/@me", "/users/@me", None)
        .await
        .map_err(classify)?;
    let id = v.get("id").and_then(Value::as_str).unwrap_or_default();
    if id.is_empty() {
        return Err(End::Reconnect("GET /users/@me returned no id".into()));
    }
    let b = BotUser {
        id: id.to_string(),
        name: v
            .get("username")
            .and_then(Value::as_str)
            .unwrap_or("bot")
            .to_string(),
    };
    *inner.bot.locked() = Some(b.clone());
    Ok(b)
}

fn classify(e: ChannelError) -> End {
    match e {
        e @ ChannelError::Auth(_) => End::Fatal(e),
        e => End::Reconnect(e.to_string()),
    }
}

async fn gateway_url(inner: &Inner, cached: &mut Option<String>) -> Result<String, End> {
    if let Some(u) = cached {
        return Ok(u.clone());
    }
    let v = inner
        .rest
        .call(Method::GET, "GET /gateway/bot", "/gateway/bot", None)
        .await
        .map_err(classify)?;
    let url = v
        .get("url")
        .and_then(Value::as_str)
        .filter(|u| u.starts_with("ws://") || u.starts_with("wss://"))
        .ok_or_else(|| End::Reconnect("GET /gateway/bot returned no ws(s):// url".into()))?;
    *cached = Some(url.to_string());
    Ok(url.to_string())
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn send_json(ws: &mut Ws, v: &Value) -> Result<(), End> {
    ws.send(Message::text(v.to_string()))
        .await
        .map_err(|e| End::Reconnect(format!("gateway send failed: {e}")))
}

/// Close without ending the Discord session (so it stays resumable).
async fn close_keep(ws: &mut Ws) {
    let frame = CloseFrame {
        code: CloseCode::from(CLOSE_KEEP_SESSION),
        reason: "reconnecting".into(),
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), ws.close(Some(frame))).await;
}

/// Answer a Close frame from Discord with one instead of dropping the TCP connection (RFC 6455
/// §5.5.1). tungstenite queued the reply when it read the frame but writes it only on the next
/// read or flush (`close()` would refuse: sending after a received close), so flush it.
async fn answer_close(ws: &mut Ws) {
    let _ = tokio::time::timeout(Duration::from_secs(2), ws.flush()).await;
}

/// Pseudo-random fraction in [0, 1) for the first heartbeat's jitter and the op 9 wait.
fn jitter() -> f64 {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    f64::from(n % 1000) / 1000.0
}

/// Map a close code to what to do. `None`: reconnect (resume when possible).
fn close_code(inner: &Inner, code: u16, reason: &str, session: &mut Session) -> End {
    match code {
        4004 => End::Fatal(ChannelError::Auth(format!(
            "Discord gateway refused the bot token (4004 {reason}): set a valid bot token in channels.discord.token"
        ))),
        4014 => End::Fatal(ChannelError::Fatal(format!(
            "Discord refused privileged intents (4014 {reason}): enable \"Message Content Intent\" for the bot in the Discord Developer Portal (Bot → Privileged Gateway Intents)"
        ))),
        4010..=4013 => End::Fatal(ChannelError::Fatal(format!(
            "Discord gateway closed with {code} {reason}: this adapter's gateway settings are not accepted"
        ))),
        4007 | 4009 => {
            session.clear(inner);
            End::Reconnect(format!("gateway closed ({code} {reason}): starting a new session"))
        }
        _ => End::Reconnect(format!("gateway closed ({code} {reason})")),
    }
}

#[allow(clippy::too_many_lines)]
async fn connect_once(
    inner: &Inner,
    tx: &mpsc::Sender<InboundDelivery>,
    cancel: &CancellationToken,
    session: &mut Session,
    gateway: &mut Option<String>,
    healthy: &mut bool,
) -> End {
    let bot = match who_am_i(inner).await {
        Ok(b) => b,
        Err(e) => return e,
    };
    let resuming = session.id.is_some();
    let url = match (&session.resume_url, resuming) {
        (Some(u), true) => u.clone(),
        _ => match gateway_url(inner, gateway).await {
            Ok(u) => u,
            Err(e) => return e,
        },
    };
    let connected = tokio::select! {
        () = cancel.cancelled() => return End::Cancelled,
        r = tokio::time::timeout(CONNECT_TIMEOUT, tokio_tungstenite::connect_async(with_query(&url))) => r,
    };
    let mut ws = match connected {
        Ok(Ok((ws, _))) => ws,
        Ok(Err(e)) => {
            // A dead resume URL: fall back to a fresh gateway URL next time (still RESUME).
            session.resume_url = None;
            return End::Reconnect(format!("gateway connect failed: {e}"));
        }
        Err(_) => {
            session.resume_url = None;
            return End::Reconnect("gateway connect timed out".into());
        }
    };
    // HELLO.
    let hello = tokio::select! {
        () = cancel.cancelled() => return End::Cancelled,
        r = tokio::time::timeout(CONNECT_TIMEOUT, ws.next()) => r,
    };
    let interval = match hello {
        Ok(Some(Ok(Message::Text(t)))) => serde_json::from_str::<Value>(&t)
            .ok()
            .filter(|v| v["op"] == 10)
            .and_then(|v| v["d"]["heartbeat_interval"].as_u64()),
        _ => None,
    };
    let Some(interval) = interval.filter(|i| *i > 0) else {
        return End::Reconnect("gateway sent no HELLO".into());
    };
    let interval = Duration::from_millis(interval);
    let token = inner.cfg.token.trim();
    let hello_reply = match (&session.id, resuming) {
        (Some(id), true) => {
            json!({"op": 6, "d": {"token": token, "session_id": id, "seq": session.seq}})
        }
        _ => json!({"op": 2, "d": {
            "token": token,
            "intents": INTENTS,
            "properties": {"os": std::env::consts::OS, "browser": "clawft", "device": "clawft"},
        }}),
    };
    if let Err(e) = send_json(&mut ws, &hello_reply).await {
        return e;
    }
    let mut last_received: Option<u64> = (session.seq > 0).then_some(session.seq);
    let mut acked = true;
    // READY or RESUMED arrived on this connection (a heartbeat ACK after it makes it healthy).
    let mut established = false;
    let mut next_beat =
        Instant::now() + Duration::from_secs_f64(interval.as_secs_f64() * jitter().max(0.05));
    // Dispatches waiting for delivery: (seq, event to deliver).
    let mut queue: VecDeque<(u64, Option<InboundEvent>)> = VecDeque::new();
    let mut inflight: Option<(u64, AckFuture)> = None;
    loop {
        // Start the next delivery, advancing over events that need none.
        while inflight.is_none() {
            let Some((s, ev)) = queue.pop_front() else {
                break;
            };
            match ev {
                None => session.seq = session.seq.max(s),
                Some(ev) => {
                    let (delivery, rx) = InboundDelivery::new(ev);
                    let tx = tx.clone();
                    let fut: AckFuture = Box::pin(async move {
                        tx.send(delivery).await.map_err(|_| ())?;
                        Ok(rx.await.ok())
                    });
                    inflight = Some((s, fut));
                }
            }
        }
        let ack_fut = async {
            match inflight.as_mut() {
                Some((_, f)) => f.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = cancel.cancelled() => {
                close_keep(&mut ws).await;
                return End::Cancelled;
            }
            r = ack_fut => {
                let s = inflight.take().map_or(0, |(s, _)| s);
                match r {
                    Ok(Some(Ack::Accepted | Ack::Duplicate | Ack::Rejected(_))) => {
                        session.seq = session.seq.max(s);
                        session.save_seq(inner);
                    }
                    Ok(None | Some(Ack::Unavailable(_))) => {
                        close_keep(&mut ws).await;
                        return End::Reconnect(format!(
                            "delivery of event seq {s} was not acknowledged; resuming from seq {}",
                            session.seq
                        ));
                    }
                    Err(()) => {
                        close_keep(&mut ws).await;
                        return End::Fatal(ChannelError::Fatal("the daemon's inbound queue is closed".into()));
                    }
                }
            }
            () = tokio::time::sleep_until(next_beat) => {
                if !acked {
                    close_keep(&mut ws).await;
                    return End::Reconnect(format!(
                        "no heartbeat ACK within {} ms (zombie connection)",
                        interval.as_millis()
                    ));
                }
                if let Err(e) = send_json(&mut ws, &json!({"op": 1, "d": last_received})).await {
                    return e;
                }
                acked = false;
                next_beat = Instant::now() + interval;
            }
            frame = ws.next() => {
                let text = match frame {
                    Some(Ok(Message::Text(t))) => t.to_string(),
                    Some(Ok(Message::Binary(b))) => String::from_utf8_lossy(&b).into_owned(),
                    Some(Ok(Message::Close(c))) => {
                        let (code, reason) = c
                            .map(|c| (u16::from(c.code), c.reason.to_string()))
                            .unwrap_or((1005, String::new()));
                        answer_close(&mut ws).await;
                        return close_code(inner, code, &reason, session);
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return End::Reconnect(format!("gateway read failed: {e}")),
                    None => return End::Reconnect("gateway connection closed".into()),
                };
                let Ok(v) = serde_json::from_str::<Value>(&text) else {
                    tracing::warn!("discord: unparseable gateway frame ignored");
                    continue;
                };
                match v["op"].as_u64() {
                    Some(0) => {
                        let s = v["s"].as_u64();
                        if let Some(s) = s {
                            last_received = Some(last_received.map_or(s, |l| l.max(s)));
                        }
                        let t = v["t"].as_str().unwrap_or("");
                        let d = &v["d"];
                        match t {
                            "READY" => {
                                session.id = d["session_id"].as_str().map(str::to_string);
                                session.resume_url = d["resume_gateway_url"].as_str().map(str::to_string);
                                session.seq = s.unwrap_or(0);
                                queue.clear();
                                session.save(inner);
                                let name = d["user"]["username"].as_str().unwrap_or(&bot.name);
                                inner.set_status(format!("connected as @{name}"));
                                established = true;
                                continue;
                            }
                            "RESUMED" => {
                                inner.set_status(format!("connected as @{} (resumed)", bot.name));
                                established = true;
                            }
                            _ => {}
                        }
                        let Some(s) = s else { continue };
                        // A replayed event we already acknowledged.
                        if s <= session.seq || queue.back().is_some_and(|(q, _)| *q >= s) {
                            continue;
                        }
                        let ev = (t == "MESSAGE_CREATE")
                            .then(|| parse_message(d, &bot, inner.cfg.group_mode, &inner.cfg.id))
                            .flatten();
                        queue.push_back((s, ev));
                        if queue.len() > MAX_QUEUED {
                            close_keep(&mut ws).await;
                            return End::Reconnect("daemon too slow: inbound backlog full".into());
                        }
                    }
                    Some(1) => {
                        if let Err(e) = send_json(&mut ws, &json!({"op": 1, "d": last_received})).await {
                            return e;
                        }
                    }
                    Some(7) => {
                        close_keep(&mut ws).await;
                        let reason = "gateway asked to reconnect".to_string();
                        // A server that asks again before the session is up gets the backoff.
                        return if established { End::ReconnectNow(reason) } else { End::Reconnect(reason) };
                    }
                    Some(9) => {
                        if v["d"].as_bool() != Some(true) {
                            session.clear(inner);
                        }
                        close_keep(&mut ws).await;
                        return End::InvalidSession("gateway invalidated the session".into());
                    }
                    Some(11) => {
                        acked = true;
                        *healthy |= established;
                    }
                    _ => {}
                }
            }
        }
    }
}
