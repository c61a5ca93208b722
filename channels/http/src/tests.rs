#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawft_channel_core::{Ack, Channel, OutboundKind, OutboundMessage};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::*;

struct FakeAdmin;

#[async_trait]
impl Admin for FakeAdmin {
    async fn status(&self) -> Value {
        json!({"status": "fine"})
    }
    async fn sessions(&self) -> Result<Value, AdminError> {
        Ok(json!({"sessions": []}))
    }
    async fn session(&self, key: &str) -> Result<Option<Value>, AdminError> {
        Ok((key == "http:abc").then(|| json!({"key": key})))
    }
    async fn clear_session(&self, key: &str) -> Result<bool, AdminError> {
        Ok(key == "http:abc")
    }
    async fn ready(&self) -> Result<Value, Value> {
        Ok(json!({"status": "ready"}))
    }
}

/// How the fake daemon answers each delivery.
#[derive(Clone, Copy)]
enum Mode {
    Reply,
    Duplicate,
    Reject,
    Silent,
    Stream,
}

struct Harness {
    ch: Arc<HttpChannel>,
    base: String,
    cancel: CancellationToken,
    listen: tokio::task::JoinHandle<Result<(), ChannelError>>,
    http: reqwest::Client,
}

async fn start(token: Option<&str>, mode: Mode, timeout: Duration) -> Harness {
    let ch = HttpChannel::bind(
        HttpConfig {
            bind: "127.0.0.1:0".parse().unwrap(),
            token: token.map(str::to_string),
            reply_timeout: timeout,
            channel_id: "http".into(),
            max_inbound_bytes: clawft_channel_core::DEFAULT_MAX_INBOUND_BYTES,
        },
        Arc::new(FakeAdmin),
    )
    .await
    .unwrap();
    let (tx, mut rx) = mpsc::channel::<InboundDelivery>(8);
    let cancel = CancellationToken::new();
    let c2 = ch.clone();
    let cancel2 = cancel.clone();
    let listen = tokio::spawn(async move { c2.listen(tx, cancel2).await });
    let daemon_ch = ch.clone();
    tokio::spawn(async move {
        while let Some(d) = rx.recv().await {
            let ack = d.ack.unwrap();
            let ev = d.event;
            let reply = |kind, content: &str| OutboundMessage {
                id: format!("r-{}", ev.event_id),
                channel: ev.channel.clone(),
                chat: ev.chat.clone(),
                thread: None,
                in_reply_to: Some(ev.event_id.clone()),
                kind,
                content: content.to_string(),
                meta: None,
            };
            match mode {
                Mode::Duplicate => {
                    let _ = ack.send(Ack::Duplicate);
                }
                Mode::Reject => {
                    let _ = ack.send(Ack::Rejected("sender not allowed".into()));
                }
                Mode::Silent => {
                    let _ = ack.send(Ack::Accepted);
                }
                Mode::Reply => {
                    let _ = ack.send(Ack::Accepted);
                    let kind = if ev.content == "fail" {
                        OutboundKind::Error
                    } else {
                        OutboundKind::Final
                    };
                    daemon_ch
                        .send(&reply(OutboundKind::Delta, "ignored"))
                        .await
                        .unwrap();
                    daemon_ch
                        .send(&reply(kind, &format!("echo: {}", ev.content)))
                        .await
                        .unwrap();
                }
                Mode::Stream => {
                    let _ = ack.send(Ack::Accepted);
                    daemon_ch
                        .send(&reply(OutboundKind::Delta, "hel"))
                        .await
                        .unwrap();
                    let mut p = reply(OutboundKind::Progress, "running read_file");
                    p.meta = Some(json!({"event": "tool_started", "tool": "read_file"}));
                    daemon_ch.send(&p).await.unwrap();
                    daemon_ch
                        .send(&reply(OutboundKind::Delta, "lo"))
                        .await
                        .unwrap();
                    daemon_ch
                        .send(&reply(OutboundKind::Final, "hello"))
                        .await
                        .unwrap();
                }
            }
        }
    });
    let base = format!("http://{}", ch.local_addr());
    // Wait until listening.
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    for _ in 0..100 {
        if http.get(format!("{base}/healthz")).send().await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Harness {
        ch,
        base,
        cancel,
        listen,
        http,
    }
}

impl Harness {
    async fn post(&self, path: &str, body: Value, token: Option<&str>) -> (u16, Value) {
        let mut r = self.http.post(format!("{}{path}", self.base)).json(&body);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        let resp = r.send().await.unwrap();
        let s = resp.status().as_u16();
        (s, resp.json().await.unwrap_or(Value::Null))
    }
    async fn get(&self, path: &str) -> (u16, Value) {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        let s = resp.status().as_u16();
        (s, resp.json().await.unwrap_or(Value::Null))
    }
}

#[tokio::test]
async fn chat_round_trip_and_error_reply() {
    let h = start(None, Mode::Reply, Duration::from_secs(5)).await;
    let (s, v) = h
        .post("/v1/chat", json!({"chat_id": "c", "content": "hi"}), None)
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["reply"], "echo: hi");
    assert_eq!(v["chat_id"], "c");
    let (s, v) = h
        .post("/v1/chat", json!({"chat_id": "c", "content": "fail"}), None)
        .await;
    assert_eq!(s, 502);
    assert_eq!(v["error"], "echo: fail");
    assert_eq!(h.ch.pending_waiters(), 0);
}

#[tokio::test]
async fn duplicate_and_rejected() {
    let h = start(None, Mode::Duplicate, Duration::from_secs(5)).await;
    let (s, v) = h
        .post(
            "/v1/chat",
            json!({"chat_id": "c", "content": "x", "event_id": "e1"}),
            None,
        )
        .await;
    assert_eq!((s, v["error"].as_str()), (409, Some("duplicate event_id")));
    let h = start(None, Mode::Reject, Duration::from_secs(5)).await;
    let (s, v) = h
        .post("/v1/chat", json!({"chat_id": "c", "content": "x"}), None)
        .await;
    assert_eq!((s, v["error"].as_str()), (403, Some("sender not allowed")));
    assert_eq!(h.ch.pending_waiters(), 0);
}

#[tokio::test]
async fn reply_timeout_is_504_and_leaks_no_waiter() {
    let h = start(None, Mode::Silent, Duration::from_millis(200)).await;
    let (s, v) = h
        .post("/v1/chat", json!({"chat_id": "c", "content": "x"}), None)
        .await;
    assert_eq!(s, 504);
    assert!(v["error"]
        .as_str()
        .unwrap()
        .contains("will still be processed"));
    assert_eq!(h.ch.pending_waiters(), 0);
    // A reply arriving late has nowhere to go.
    let late = OutboundMessage {
        id: "late".into(),
        channel: ChannelId::new("http"),
        chat: ChatId::new("c"),
        thread: None,
        in_reply_to: Some(PlatformEventId::new(v["event_id"].as_str().unwrap())),
        kind: OutboundKind::Final,
        content: "late".into(),
        meta: None,
    };
    assert!(matches!(h.ch.send(&late).await, Err(ChannelError::Gone(_))));
}

#[tokio::test]
async fn sse_stream_delivers_deltas_progress_and_done() {
    let h = start(None, Mode::Stream, Duration::from_secs(5)).await;
    let text = h
        .http
        .post(format!("{}/v1/chat/stream", h.base))
        .json(&json!({"chat_id": "c", "content": "hi"}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events: Vec<(String, Value)> = text
        .split("\n\n")
        .filter_map(|b| {
            let ev = b
                .lines()
                .find_map(|l| l.strip_prefix("event:"))?
                .trim()
                .to_string();
            let data = b.lines().find_map(|l| l.strip_prefix("data:"))?.trim();
            Some((ev, serde_json::from_str(data).unwrap()))
        })
        .collect();
    let names: Vec<_> = events.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(names, ["delta", "progress", "delta", "done"]);
    assert_eq!(events[0].1["text"], "hel");
    assert_eq!(events[1].1["tool"], "read_file");
    assert_eq!(events[3].1["reply"], "hello");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(h.ch.pending_waiters(), 0);
}

#[tokio::test]
async fn bearer_token_required_except_healthz() {
    let h = start(Some("s3cret"), Mode::Reply, Duration::from_secs(5)).await;
    let (s, _) = h.get("/healthz").await;
    assert_eq!(s, 200);
    let (s, v) = h.get("/v1/status").await;
    assert_eq!(s, 401);
    assert_eq!(v["error"], "missing or invalid bearer token");
    let (s, _) = h
        .post(
            "/v1/chat",
            json!({"chat_id": "c", "content": "x"}),
            Some("wrong"),
        )
        .await;
    assert_eq!(s, 401);
    let (s, v) = h
        .post(
            "/v1/chat",
            json!({"chat_id": "c", "content": "x"}),
            Some("s3cret"),
        )
        .await;
    assert_eq!((s, v["reply"].as_str()), (200, Some("echo: x")));
}

#[tokio::test]
async fn non_loopback_bind_needs_a_token() {
    let cfg = |token: Option<&str>| HttpConfig {
        bind: "0.0.0.0:0".parse().unwrap(),
        token: token.map(str::to_string),
        reply_timeout: Duration::from_secs(1),
        channel_id: "http".into(),
        max_inbound_bytes: clawft_channel_core::DEFAULT_MAX_INBOUND_BYTES,
    };
    let e = HttpChannel::bind(cfg(None), Arc::new(FakeAdmin))
        .await
        .err()
        .unwrap();
    assert!(matches!(e, HttpError::NonLoopbackWithoutToken { .. }));
    assert!(e.to_string().contains("channels.http.token"));
    assert!(HttpChannel::bind(cfg(Some("t")), Arc::new(FakeAdmin))
        .await
        .is_ok());
}

#[tokio::test]
async fn bad_requests_get_json_errors() {
    let h = start(None, Mode::Reply, Duration::from_secs(5)).await;
    let resp = h
        .http
        .post(format!("{}/v1/chat", h.base))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert!(v["error"].as_str().unwrap().contains("chat_id"));
    let (s, v) = h
        .post("/v1/chat", json!({"chat_id": "", "content": "x"}), None)
        .await;
    assert_eq!(s, 400);
    assert!(v["error"].as_str().unwrap().contains("chat_id"));
    let (s, _) = h
        .post("/v1/chat", json!({"chat_id": "c", "content": 5}), None)
        .await;
    assert_eq!(s, 400);
    let big = "x".repeat(2 * 1024 * 1024);
    let resp = h
        .http
        .post(format!("{}/v1/chat", h.base))
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
}

#[tokio::test]
async fn admin_routes_and_percent_encoded_keys() {
    let h = start(None, Mode::Reply, Duration::from_secs(5)).await;
    assert_eq!(h.get("/v1/status").await.1["status"], "fine");
    assert_eq!(h.get("/readyz").await.0, 200);
    let (s, v) = h.get("/v1/sessions/http%3Aabc").await;
    assert_eq!((s, v["key"].as_str()), (200, Some("http:abc")));
    let (s, _) = h.get("/v1/sessions/http:abc").await;
    assert_eq!(s, 200);
    assert_eq!(h.get("/v1/sessions/http%3Anope").await.0, 404);
    let resp = h
        .http
        .delete(format!("{}/v1/sessions/http%3Aabc", h.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.json::<Value>().await.unwrap()["cleared"], true);
}

#[tokio::test]
async fn proactive_messages_wait_in_the_mailbox() {
    let h = start(None, Mode::Reply, Duration::from_secs(5)).await;
    let m = OutboundMessage {
        id: "p1".into(),
        channel: ChannelId::new("http"),
        chat: ChatId::new("room"),
        thread: None,
        in_reply_to: None,
        kind: OutboundKind::Final,
        content: "ping".into(),
        meta: None,
    };
    h.ch.send(&m).await.unwrap();
    let (_, v) = h.get("/v1/chats/room/messages").await;
    assert_eq!(v["messages"][0]["content"], "ping");
    let (_, v) = h.get("/v1/chats/room/messages").await;
    assert_eq!(v["messages"], json!([]));
}

#[tokio::test]
async fn cancel_stops_listen_and_answers_waiting_requests() {
    let h = start(None, Mode::Silent, Duration::from_secs(30)).await;
    let http = h.http.clone();
    let base = h.base.clone();
    let waiting = tokio::spawn(async move {
        http.post(format!("{base}/v1/chat"))
            .json(&json!({"chat_id": "c", "content": "x"}))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    });
    for _ in 0..100 {
        if h.ch.pending_waiters() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    h.cancel.cancel();
    assert_eq!(waiting.await.unwrap(), 503);
    tokio::time::timeout(Duration::from_secs(5), h.listen)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
