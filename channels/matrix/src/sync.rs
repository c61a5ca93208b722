//! The `/sync` loop: invites, messages, and the `since` token advanced only after the batch is
//! journaled.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use clawft_channel_core::backoff::Backoff;
use clawft_channel_core::lock::MutexExt;
use clawft_channel_core::media::{MediaKind, MediaRef};
use clawft_channel_core::{
    now_ms, Ack, ChannelError, ChatId, GroupMode, InboundDelivery, InboundEvent, PlatformEventId,
    ThreadId, UserId,
};
use reqwest::Method;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{Inner, ENCRYPTED_REFUSAL};

/// State key of the stored `since` token.
pub const SINCE_KEY: &str = "since";

/// How a batch went.
enum Batch {
    /// Every event is journaled or refused: advance `since`.
    Done,
    /// Something could not be stored or done now: sync the same batch again later.
    Retry(String),
    /// Shutting down.
    Stop,
}

pub(crate) async fn run(
    inner: Arc<Inner>,
    tx: mpsc::Sender<InboundDelivery>,
    cancel: CancellationToken,
) -> Result<(), ChannelError> {
    let me = tokio::select! {
        () = cancel.cancelled() => return Ok(()),
        r = inner.me() => r,
    };
    let me = match me {
        Ok(me) => me,
        Err(e) => {
            inner.set_status(format!("{e}"));
            return Err(e);
        }
    };
    check_versions(&inner).await;
    inner.set_status(format!("connected as {me}"));
    let state = inner.cfg.state.clone();
    let mut since = state.get(SINCE_KEY).filter(|s| !s.is_empty());
    let mut backoff = Backoff::new(inner.cfg.backoff_min, inner.cfg.backoff_max);
    loop {
        let timeout = if since.is_some() {
            inner.cfg.sync_timeout
        } else {
            Duration::ZERO
        };
        let r = tokio::select! {
            () = cancel.cancelled() => return Ok(()),
            r = sync_once(&inner, since.as_deref(), timeout) => r,
        };
        let failed = match r {
            Err(e @ ChannelError::Auth(_)) => {
                inner.set_status(format!("{e}"));
                return Err(e);
            }
            Err(e) => e.to_string(),
            Ok(body) => {
                let next = body["next_batch"].as_str().unwrap_or_default().to_string();
                match handle(&inner, &me, &body, since.is_none(), &tx, &cancel).await {
                    Batch::Stop => return Ok(()),
                    Batch::Retry(why) => why,
                    Batch::Done if next.is_empty() => "sync answered no next_batch".into(),
                    Batch::Done => {
                        if let Err(e) = state.put(SINCE_KEY, &next) {
                            tracing::warn!(channel = %inner.cfg.id, error = %e, "the sync position was not stored");
                        }
                        since = Some(next);
                        backoff.reset();
                        inner.set_status(format!("connected as {me}"));
                        continue;
                    }
                }
            }
        };
        let delay = backoff.next_delay();
        tracing::warn!(channel = %inner.cfg.id, error = %failed, retry_in = ?delay, "matrix sync failed");
        inner.set_status(format!("reconnecting: {failed}"));
        tokio::select! {
            () = cancel.cancelled() => return Ok(()),
            () = tokio::time::sleep(delay) => {}
        }
    }
}

/// Whether the homeserver serves authenticated media (Matrix v1.11); older ones get the
/// legacy download path.
async fn check_versions(inner: &Inner) {
    let url = inner.api.url(&["_matrix", "client", "versions"]);
    let Ok(v) = inner
        .api
        .call(Method::GET, url, None, Duration::from_secs(30))
        .await
    else {
        return;
    };
    let versions: Vec<&str> = v["versions"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let newer = versions.iter().any(|s| {
        s.strip_prefix("v1.")
            .and_then(|m| m.parse::<u32>().ok())
            .is_some_and(|m| m >= 11)
    });
    let unstable = v["unstable_features"]["org.matrix.msc3916.stable"] == json!(true);
    inner
        .authenticated_media
        .store(newer || unstable, Ordering::Relaxed);
}

async fn sync_once(
    inner: &Inner,
    since: Option<&str>,
    timeout: Duration,
) -> Result<Value, ChannelError> {
    let mut url = inner.api.url(&["_matrix", "client", "v3", "sync"]);
    {
        let mut q = url.query_pairs_mut();
        q.append_pair("timeout", &timeout.as_millis().to_string());
        // No presence, account data or ephemeral events: only rooms.
        q.append_pair(
            "filter",
            r#"{"presence":{"types":[]},"account_data":{"types":[]},"room":{"ephemeral":{"types":[]},"account_data":{"types":[]}}}"#,
        );
        if let Some(s) = since {
            q.append_pair("since", s);
        }
    }
    inner
        .api
        .call(Method::GET, url, None, timeout + Duration::from_secs(30))
        .await
}

async fn handle(
    inner: &Inner,
    me: &str,
    body: &Value,
    first: bool,
    tx: &mpsc::Sender<InboundDelivery>,
    cancel: &CancellationToken,
) -> Batch {
    let empty = serde_json::Map::new();
    let invites = body["rooms"]["invite"].as_object().unwrap_or(&empty);
    for (room, r) in invites {
        if let Err(e) = invite(inner, me, room, r).await {
            return Batch::Retry(format!("invite to {room}: {e}"));
        }
    }
    let joined = body["rooms"]["join"].as_object().unwrap_or(&empty);
    for (room, r) in joined {
        if let Some(n) = r["summary"]["m.joined_member_count"].as_u64() {
            inner.members.locked().insert(room.clone(), n);
        }
        let events = || {
            r["state"]["events"]
                .as_array()
                .into_iter()
                .flatten()
                .chain(r["timeline"]["events"].as_array().into_iter().flatten())
        };
        {
            let mut names = inner.display_names.locked();
            for e in events().filter(|e| e["type"] == "m.room.member") {
                if let Some(user) = e["state_key"].as_str() {
                    let name = e["content"]["displayname"]
                        .as_str()
                        .and_then(|n| clawft_channel_core::display_name([n]));
                    names.insert((room.clone(), user.to_string()), name);
                }
            }
        }
        if events().any(|e| e["type"] == "m.room.encryption") {
            if let Err(e) = refuse_encrypted(inner, room).await {
                return Batch::Retry(format!("leaving encrypted room {room}: {e}"));
            }
            continue;
        }
        if first {
            // History from before this gateway first ran is not answered.
            continue;
        }
        let timeline = r["timeline"]["events"].as_array().into_iter().flatten();
        for ev in timeline {
            let Some(event) = inbound(inner, me, room, ev).await else {
                continue;
            };
            let (delivery, ack) = InboundDelivery::new(event);
            if tx.send(delivery).await.is_err() {
                return Batch::Stop;
            }
            let ack = tokio::select! {
                () = cancel.cancelled() => return Batch::Stop,
                a = ack => a,
            };
            match ack {
                Ok(Ack::Accepted | Ack::Duplicate | Ack::Rejected(_)) => {}
                Ok(Ack::Unavailable(why)) => return Batch::Retry(why),
                Err(_) => return Batch::Stop,
            }
        }
    }
    Batch::Done
}

/// Accept an invite from an allowed user into an unencrypted room; reject every other.
async fn invite(inner: &Inner, me: &str, room: &str, r: &Value) -> Result<(), ChannelError> {
    let events: Vec<&Value> = r["invite_state"]["events"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let inviter = events
        .iter()
        .find(|e| {
            e["type"] == "m.room.member"
                && e["state_key"] == me
                && e["content"]["membership"] == "invite"
        })
        .and_then(|e| e["sender"].as_str())
        .unwrap_or_default();
    let encrypted = events.iter().any(|e| e["type"] == "m.room.encryption");
    let allowed = inner.cfg.invite_from.contains(inviter)
        || inner.cfg.invite_paired.as_ref().is_some_and(|f| f(inviter));
    if !allowed {
        tracing::warn!(channel = %inner.cfg.id, room, inviter, "invite rejected: the inviter is neither in allow_from nor paired");
        return inner
            .leave(
                room,
                "This assistant only joins rooms when invited by the people it is set up for.",
            )
            .await;
    }
    if encrypted {
        tracing::warn!(channel = %inner.cfg.id, room, inviter, "invite rejected: the room is end-to-end encrypted, which this channel cannot read");
        return inner.leave(room, ENCRYPTED_REFUSAL).await;
    }
    let url = inner
        .api
        .url(&["_matrix", "client", "v3", "rooms", room, "join"]);
    inner
        .api
        .call(Method::POST, url, Some(&json!({})), Duration::from_secs(60))
        .await?;
    tracing::info!(channel = %inner.cfg.id, room, inviter, "joined");
    Ok(())
}

/// Tell a room that turned encryption on why the bot goes, and leave it.
async fn refuse_encrypted(inner: &Inner, room: &str) -> Result<(), ChannelError> {
    tracing::warn!(channel = %inner.cfg.id, room, "leaving: the room turned on end-to-end encryption, which this channel cannot read");
    let content = json!({"msgtype": "m.notice", "body": ENCRYPTED_REFUSAL});
    // One notice per room, however often this is retried.
    let txn = format!("encrypted-{room}");
    match inner
        .send_event(room, "m.room.message", &txn, &content)
        .await
    {
        Ok(_) | Err(ChannelError::Rejected(_)) => {}
        Err(e) => return Err(e),
    }
    match inner.leave(room, ENCRYPTED_REFUSAL).await {
        Ok(()) | Err(ChannelError::Rejected(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether `room` is a DM (two members), asking the homeserver when the sync did not say.
async fn is_direct(inner: &Inner, room: &str) -> bool {
    if let Some(n) = inner.members.locked().get(room) {
        return *n <= 2;
    }
    let url = inner
        .api
        .url(&["_matrix", "client", "v3", "rooms", room, "joined_members"]);
    let n = inner
        .api
        .call(Method::GET, url, None, Duration::from_secs(30))
        .await
        .ok()
        .and_then(|v| v["joined"].as_object().map(|o| o.len() as u64));
    match n {
        Some(n) => {
            inner.members.locked().insert(room.to_string(), n);
            n <= 2
        }
        None => false,
    }
}

/// The inbound event of a timeline event, if it is a message for the bot.
async fn inbound(inner: &Inner, me: &str, room: &str, ev: &Value) -> Option<InboundEvent> {
    let sender = ev["sender"].as_str()?;
    if sender == me {
        return None;
    }
    if ev["type"] == "m.room.encrypted" {
        tracing::warn!(channel = %inner.cfg.id, room, "an encrypted message cannot be read (this channel has no end-to-end encryption)");
        return None;
    }
    if ev["type"] != "m.room.message" {
        return None;
    }
    let event_id = ev["event_id"].as_str()?;
    let c = &ev["content"];
    let rel = &c["m.relates_to"];
    if rel["rel_type"] == "m.replace" {
        // An edit of an earlier message: the original was answered already.
        return None;
    }
    let thread = (rel["rel_type"] == "m.thread")
        .then(|| rel["event_id"].as_str())
        .flatten()
        .map(|t| ThreadId::new(crate::chat_of(t)));
    let mut text = c["body"].as_str().unwrap_or_default().to_string();
    if !rel["m.in_reply_to"].is_null() && thread.is_none() {
        text = strip_reply_fallback(&text);
    }
    let msgtype = c["msgtype"].as_str().unwrap_or_default();
    let mut attachments = Vec::new();
    let kind = match msgtype {
        "m.image" => Some(MediaKind::Image),
        "m.audio" if c.get("org.matrix.msc3245.voice").is_some() => Some(MediaKind::Voice),
        "m.audio" => Some(MediaKind::Audio),
        "m.video" => Some(MediaKind::Video),
        "m.file" => Some(MediaKind::Document),
        _ => None,
    };
    if let Some(kind) = kind {
        let url = c["url"].as_str()?;
        let name = c["filename"].as_str().unwrap_or(&text).to_string();
        let mut m = MediaRef::new(kind, url);
        m.mime = c["info"]["mimetype"].as_str().map(str::to_string);
        m.size = c["info"]["size"].as_u64();
        m.duration_secs = c["info"]["duration"]
            .as_u64()
            .and_then(|ms| u32::try_from(ms / 1000).ok());
        // The body is a caption only when a separate file name is given.
        if c["filename"].as_str().is_none_or(|f| f == text) {
            text.clear();
        }
        m.name = Some(name);
        attachments.push(m);
    }
    if inner.cfg.group_mode == GroupMode::Mention && !is_direct(inner, room).await {
        let mentioned = c["m.mentions"]["user_ids"]
            .as_array()
            .is_some_and(|a| a.iter().any(|u| u == me))
            || text.contains(me);
        if !mentioned {
            return None;
        }
        text = text.replace(me, "").trim().to_string();
    }
    Some(InboundEvent {
        channel: inner.cfg.id.clone(),
        chat: ChatId::new(crate::chat_of(room)),
        thread,
        sender_name: display_name(inner, room, sender).await,
        sender: UserId::new(sender),
        event_id: PlatformEventId::new(event_id),
        content: text,
        received_at_ms: now_ms(),
        attachments,
        origin: Default::default(),
    })
}

/// The sender's display name in `room`: from the syncs' member events, else asked once from
/// the room's state (a sender whose join came before this gateway's sync token).
async fn display_name(inner: &Inner, room: &str, sender: &str) -> Option<String> {
    let key = (room.to_string(), sender.to_string());
    if let Some(n) = inner.display_names.locked().get(&key) {
        return n.clone();
    }
    let url = inner.api.url(&[
        "_matrix",
        "client",
        "v3",
        "rooms",
        room,
        "state",
        "m.room.member",
        sender,
    ]);
    let name = inner
        .api
        .call(Method::GET, url, None, Duration::from_secs(10))
        .await
        .ok()
        .and_then(|v| {
            v["displayname"]
                .as_str()
                .and_then(|n| clawft_channel_core::display_name([n]))
        });
    inner.display_names.locked().insert(key, name.clone());
    name
}

/// A reply's body without the quoted fallback (`> <@user:hs> quoted` lines and the blank
/// line after them).
fn strip_reply_fallback(body: &str) -> String {
    if !body.starts_with("> ") {
        return body.to_string();
    }
    let mut lines = body.lines().skip_while(|l| l.starts_with('>'));
    let rest: Vec<&str> = lines.by_ref().collect();
    let rest = rest.join("\n");
    rest.trim_start_matches('\n').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_fallback_is_stripped() {
        assert_eq!(
            strip_reply_fallback("> <@a:hs> earlier\n> more\n\nthe answer"),
            "the answer"
        );
        assert_eq!(strip_reply_fallback("plain"), "plain");
    }
}
