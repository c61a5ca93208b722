//! Socket Mode: connect, deliver, acknowledge after the daemon's ack, reconnect.
//!
//! One session: `auth.test` → `apps.connections.open` → WebSocket to the returned URL (used
//! as is, `ws://` in tests) → `hello` → envelopes. Envelopes for deliveries are acknowledged
//! (`{"envelope_id": ...}`) only once the delivery's ack arrives; a dropped ack leaves the
//! envelope unacknowledged so Slack redelivers it. Everything else is acknowledged at once.
//! A `disconnect` frame reconnects at once; errors reconnect with backoff (doubling from
//! `backoff_min` to `backoff_max`); a watchdog reconnects when no frame or pong arrived for
//! `watchdog_timeout` (pings every `ping_interval`).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use clawft_channel_core::backoff::Backoff;
use clawft_channel_core::{
    now_ms, ChannelError, ChannelId, ChatId, InboundDelivery, InboundEvent, PlatformEventId,
    ThreadId, UserId,
};
use futures::stream::FuturesUnordered;
use futures::{Future, SinkExt, StreamExt};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use crate::events::{self, Frame, Incoming};
use crate::Inner;

/// Largest WebSocket message accepted from Slack.
const MAX_WS_MESSAGE: usize = 4 * 1024 * 1024;
/// How long to wait for the WebSocket handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a delivery may wait for the daemon's ack before its envelope is left to Slack's
/// retry (the daemon journals within milliseconds; this only bounds memory).
const ACK_WAIT: Duration = Duration::from_secs(60);

/// TLS for `wss://` with the ring provider and the webpki roots.
pub(crate) fn tls_config() -> Result<Arc<rustls::ClientConfig>, ChannelError> {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| ChannelError::Fatal(format!("TLS setup: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// How a session ended without a fatal error.
enum End {
    Cancelled,
    /// Reconnect; `immediate` after Slack's own `disconnect`, `healthy` if `hello` came.
    Reconnect {
        why: String,
        healthy: bool,
        immediate: bool,
    },
}

/// The listen loop with reconnects.
pub(crate) async fn run(
    inner: Arc<Inner>,
    tx: mpsc::Sender<InboundDelivery>,
    cancel: CancellationToken,
) -> Result<(), ChannelError> {
    let cfg = &inner.cfg;
    let mut backoff = Backoff::new(cfg.backoff_min, cfg.backoff_max);
    loop {
        if cancel.is_cancelled() || tx.is_closed() {
            inner.set_status("stopped");
            return Ok(());
        }
        let (why, delay) = match session(&inner, &tx, &cancel).await {
            Ok(End::Cancelled) => {
                inner.set_status("stopped");
                return Ok(());
            }
            Ok(End::Reconnect {
                why,
                healthy,
                immediate,
            }) => {
                if healthy {
                    backoff.reset();
                }
                let delay = if immediate {
                    backoff.count_attempt();
                    Duration::ZERO
                } else {
                    backoff.next_delay()
                };
                (why, delay)
            }
            Err(e @ ChannelError::Auth(_)) => {
                inner.set_status(format!("auth failed: {e}"));
                tracing::error!(channel = %cfg.id, error = %e, "Slack refused the credentials");
                return Err(e);
            }
            Err(e @ ChannelError::Fatal(_)) => {
                inner.set_status(format!("failed: {e}"));
                return Err(e);
            }
            Err(e) => {
                let delay = backoff.next_delay();
                (e.to_string(), e.retry_after().unwrap_or(delay).max(delay))
            }
        };
        let attempt = backoff.attempt();
        inner.set_status(format!("reconnecting (attempt {attempt}): {why}"));
        tracing::warn!(channel = %cfg.id, attempt, delay_ms = delay.as_millis() as u64, reason = %why, "Slack Socket Mode reconnecting");
        tokio::select! {
            () = cancel.cancelled() => {
                inner.set_status("stopped");
                return Ok(());
            }
            () = tokio::time::sleep(delay) => {}
        }
    }
}

type AckWait = Pin<Box<dyn Future<Output = Option<String>> + Send>>;

/// One connection, until it ends.
async fn session(
    inner: &Inner,
    tx: &mpsc::Sender<InboundDelivery>,
    cancel: &CancellationToken,
) -> Result<End, ChannelError> {
    let cfg = &inner.cfg;
    let me = inner.api.auth_test().await?;
    let url = inner.api.open_connection().await?;
    let lower = url.to_ascii_lowercase();
    if !(lower.starts_with("wss://") || lower.starts_with("ws://")) {
        return Err(ChannelError::Transient(
            "apps.connections.open returned a non-WebSocket URL".into(),
        ));
    }
    let ws_cfg = WebSocketConfig::default()
        .max_message_size(Some(MAX_WS_MESSAGE))
        .max_frame_size(Some(MAX_WS_MESSAGE));
    let connect = tokio_tungstenite::connect_async_tls_with_config(
        url.as_str(),
        Some(ws_cfg),
        false,
        Some(tokio_tungstenite::Connector::Rustls(inner.tls.clone())),
    );
    let (ws, _) = tokio::select! {
        () = cancel.cancelled() => return Ok(End::Cancelled),
        r = tokio::time::timeout(CONNECT_TIMEOUT, connect) => match r {
            Err(_) => return Err(ChannelError::Transient("Socket Mode connect timed out".into())),
            // The error text may hold the URL (with its one-time ticket): keep it out.
            Ok(Err(e)) => return Err(ChannelError::Transient(format!("Socket Mode connect failed: {}", ws_error_kind(&e)))),
            Ok(Ok(ok)) => ok,
        }
    };
    let (mut sink, mut stream) = ws.split();
    let mut healthy = false;
    let connected_at = Instant::now();
    let mut last_seen = connected_at;
    let mut ping = tokio::time::interval_at(Instant::now() + cfg.ping_interval, cfg.ping_interval);
    let mut pending: FuturesUnordered<AckWait> = FuturesUnordered::new();
    let reconnect = |why: String, healthy: bool| {
        Ok(End::Reconnect {
            why,
            healthy,
            immediate: false,
        })
    };
    loop {
        tokio::select! {
            () = cancel.cancelled() => {
                let _ = tokio::time::timeout(Duration::from_secs(1), sink.send(Message::Close(None))).await;
                return Ok(End::Cancelled);
            }
            Some(acked) = pending.next(), if !pending.is_empty() => {
                if let Some(envelope_id) = acked {
                    if let Err(e) = sink.send(ack_frame(&envelope_id)).await {
                        return reconnect(format!("ack failed: {e}"), healthy);
                    }
                }
            }
            _ = ping.tick() => {
                if !healthy && connected_at.elapsed() >= cfg.watchdog_timeout {
                    return reconnect("no hello from Slack".into(), false);
                }
                if last_seen.elapsed() >= cfg.watchdog_timeout {
                    return reconnect(format!("no traffic from Slack for {:?}", last_seen.elapsed()), healthy);
                }
                if let Err(e) = sink.send(Message::Ping(Vec::new().into())).await {
                    return reconnect(format!("ping failed: {e}"), healthy);
                }
            }
            frame = stream.next() => {
                last_seen = Instant::now();
                let text = match frame {
                    None => return reconnect("connection closed".into(), healthy),
                    Some(Err(e)) => return reconnect(format!("WebSocket error: {}", ws_error_kind(&e)), healthy),
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(Message::Close(f))) => {
                        let why = f.map(|f| format!("closed by Slack ({} {})", u16::from(f.code), f.reason)).unwrap_or_else(|| "closed by Slack".into());
                        return reconnect(why, healthy);
                    }
                    Some(Ok(_)) => continue,
                };
                match events::parse_frame(text.as_str()) {
                    Err(e) => tracing::warn!(channel = %cfg.id, error = %e, "ignoring a Socket Mode frame"),
                    Ok(Frame::Hello) => {
                        healthy = true;
                        inner.set_status(format!("connected as @{} ({})", me.user, me.team));
                        tracing::info!(channel = %cfg.id, user = %me.user, "Slack Socket Mode connected");
                    }
                    Ok(Frame::Disconnect { reason }) => {
                        if reason == "link_disabled" {
                            return Err(ChannelError::Fatal(
                                "Slack disabled Socket Mode for this app (link_disabled): enable Socket Mode in the app settings".into(),
                            ));
                        }
                        return Ok(End::Reconnect { why: format!("Slack asked to reconnect ({reason})"), healthy, immediate: true });
                    }
                    Ok(Frame::Envelope { envelope_id, kind, retry_attempt, payload }) => {
                        let incoming = match kind.as_str() {
                            "events_api" => events::from_event(&payload, &me, cfg.group_mode),
                            "slash_commands" => events::from_slash_command(&payload),
                            _ => Err("not a message envelope"),
                        };
                        match incoming {
                            Err(why) => {
                                tracing::debug!(channel = %cfg.id, envelope = %envelope_id, why, "acknowledging an envelope that is not delivered");
                                if let Err(e) = sink.send(ack_frame(&envelope_id)).await {
                                    return reconnect(format!("ack failed: {e}"), healthy);
                                }
                            }
                            Ok(inc) => {
                                tracing::debug!(channel = %cfg.id, envelope = %envelope_id, event = %inc.event_id, retry_attempt, "Slack message");
                                let (delivery, rx) = InboundDelivery::new(to_event(&cfg.id, inc));
                                tokio::select! {
                                    () = cancel.cancelled() => return Ok(End::Cancelled),
                                    r = tx.send(delivery) => if r.is_err() {
                                        return Ok(End::Cancelled);
                                    }
                                }
                                last_seen = Instant::now();
                                pending.push(Box::pin(async move {
                                    match tokio::time::timeout(ACK_WAIT, rx).await {
                                        // Not stored: Slack redelivers it.
                                        Ok(Ok(clawft_channel_core::Ack::Unavailable(_))) => None,
                                        Ok(Ok(_)) => Some(envelope_id),
                                        // Dropped or too slow: leave it to Slack's retry.
                                        _ => None,
                                    }
                                }));
                            }
                        }
                    }
                    Ok(Frame::Other(kind)) => tracing::debug!(channel = %cfg.id, kind, "ignoring a Socket Mode frame"),
                }
            }
        }
    }
}

fn ack_frame(envelope_id: &str) -> Message {
    Message::Text(json!({ "envelope_id": envelope_id }).to_string().into())
}

/// A WebSocket error without the URL (whose query holds a connection ticket).
fn ws_error_kind(e: &tokio_tungstenite::tungstenite::Error) -> String {
    use tokio_tungstenite::tungstenite::Error as E;
    match e {
        E::Http(resp) => format!("HTTP {}", resp.status()),
        E::Url(_) => "bad URL".into(),
        other => other.to_string(),
    }
}

fn to_event(channel: &ChannelId, inc: Incoming) -> InboundEvent {
    InboundEvent {
        channel: channel.clone(),
        chat: ChatId::new(inc.chat),
        thread: inc.thread.map(ThreadId::new),
        sender: UserId::new(inc.sender),
        sender_name: None,
        event_id: PlatformEventId::new(inc.event_id),
        content: inc.content,
        received_at_ms: now_ms(),
        attachments: inc.attachments,
        origin: clawft_channel_core::Origin::User,
    }
}
