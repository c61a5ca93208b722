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
        Ok(json!({"status": "ready", "providers": [{"base_url": "http://10.1.2.3/v1"}]}))
    }
    async fn command(&self, name: &str, _body: Value) -> Result<Value, AdminError> {
        Ok(json!({"ran": name}))
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

/// The control token every harness is started with (the daemon generates a random one).
const CONTROL: &str = "control-token-0123456789abcdef";

fn loopback(token: Option<&str>, timeout: Duration) -> HttpConfig {
    HttpConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        token: token.map(str::to_string),
        control_token: Some(CONTROL.into()),
        allow_loopback_without_token: false,
        reply_timeout: timeout,
        channel_id: "http".into(),
        max_inbound_bytes: clawft_channel_core::DEFAULT_MAX_INBOUND_BYTES,
        agents: vec!["main".into(), "work".into()],
        ui_hosts: Vec::new(),
        tls: None,
    }
}

async fn start(token: Option<&str>, mode: Mode, timeout: Duration) -> Harness {
    start_with(loopback(token, timeout), mode).await
}

async fn start_with(cfg: HttpConfig, mode: Mode) -> Harness {
    let ch = HttpChannel::bind(cfg, Arc::new(FakeAdmin)).await.unwrap();
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
                body: clawft_channel_core::OutboundBody::text_of(kind, content.to_string()),
                attachments: Vec::new(),
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
                    p.body = clawft_channel_core::OutboundBody::Progress(
                        clawft_channel_core::ToolProgress::ToolStarted {
                            tool: "read_file".into(),
                            call_id: "c1".into(),
                            arguments: None,
                        },
                    );
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
    /// `GET path` with the control token.
    async fn get(&self, path: &str) -> (u16, Value) {
        self.get_as(path, Some(CONTROL)).await
    }
    async fn get_as(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        let mut r = self.http.get(format!("{}{path}", self.base));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        let resp = r.send().await.unwrap();
        let s = resp.status().as_u16();
        (s, resp.json().await.unwrap_or(Value::Null))
    }
}

#[tokio::test]
async fn chat_round_trip_and_error_reply() {
    let h = start(None, Mode::Reply, Duration::from_secs(5)).await;
    let (s, v) = h
        .post(
            "/v1/chat",
            json!({"chat_id": "c", "content": "hi"}),
            Some(CONTROL),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["reply"], "echo: hi");
    assert_eq!(v["chat_id"], "c");
    let (s, v) = h
        .post(
            "/v1/chat",
            json!({"chat_id": "c", "content": "fail"}),
            Some(CONTROL),
        )
        .await;
    assert_eq!(s, 502);
    assert_eq!(v["error"], "echo: fail");
    assert_eq!(h.ch.pending_waiters(), 0);
}

#[tokio::test]
async fn duplicate_and_rejected() {
    let h = start(None, Mode::Duplicate, Duration::from_millis(300)).await;
    // Resent before its reply exists: it waits for the reply (here none comes: 504).
    let (s, v) = h
        .post(
            "/v1/chat",
            json!({"chat_id": "c", "content": "x", "event_id": "e1"}),
            Some(CONTROL),
        )
        .await;
    assert_eq!(s, 504, "{v}");
    assert_eq!(h.ch.pending_waiters(), 0);
    // Once answered, a resend gets the recorded reply.
    h.ch.send(&OutboundMessage {
        id: "r1".into(),
        channel: ChannelId::new("http"),
        chat: ChatId::new("c"),
        thread: None,
        in_reply_to: Some(clawft_channel_core::PlatformEventId::new("e1")),
        body: clawft_channel_core::OutboundBody::text_of(OutboundKind::Final, "the answer".into()),
        attachments: Vec::new(),
    })
    .await
    .unwrap();
    let (s, v) = h
        .post(
            "/v1/chat",
            json!({"chat_id": "c", "content": "x", "event_id": "e1"}),
            Some(CONTROL),
        )
        .await;
    assert_eq!(
        (s, &v["reply"], &v["replayed"]),
        (200, &json!("the answer"), &json!(true)),
        "{v}"
    );
    let h = start(None, Mode::Reject, Duration::from_secs(5)).await;
    let (s, v) = h
        .post(
            "/v1/chat",
            json!({"chat_id": "c", "content": "x"}),
            Some(CONTROL),
        )
        .await;
    assert_eq!((s, v["error"].as_str()), (403, Some("sender not allowed")));
    assert_eq!(h.ch.pending_waiters(), 0);
}

#[tokio::test]
async fn reply_timeout_is_504_and_leaks_no_waiter() {
    let h = start(None, Mode::Silent, Duration::from_millis(200)).await;
    let (s, v) = h
        .post(
            "/v1/chat",
            json!({"chat_id": "c", "content": "x"}),
            Some(CONTROL),
        )
        .await;
    assert_eq!(s, 504);
    assert!(v["error"]
        .as_str()
        .unwrap()
        .contains("will still be processed"));
    assert_eq!(h.ch.pending_waiters(), 0);
    // A reply arriving late waits in the chat's mailbox (it used to be dropped).
    let late = OutboundMessage {
        id: "late".into(),
        channel: ChannelId::new("http"),
        chat: ChatId::new("c"),
        thread: None,
        in_reply_to: Some(PlatformEventId::new(v["event_id"].as_str().unwrap())),
        body: clawft_channel_core::OutboundBody::text_of(OutboundKind::Final, "late".into()),
        attachments: Vec::new(),
    };
    h.ch.send(&late).await.unwrap();
    let (_, v) = h.get("/v1/chats/c/messages").await;
    assert_eq!(v["messages"][0]["content"], "late", "{v}");
    // A late delta has nowhere to go.
    let delta = OutboundMessage {
        id: "d".into(),
        body: clawft_channel_core::OutboundBody::text_of(OutboundKind::Delta, "la".into()),
        ..late
    };
    assert!(matches!(
        h.ch.send(&delta).await,
        Err(ChannelError::Gone(_))
    ));
}

#[tokio::test]
async fn sse_stream_delivers_deltas_progress_and_done() {
    let h = start(None, Mode::Stream, Duration::from_secs(5)).await;
    let text = h
        .http
        .post(format!("{}/v1/chat/stream", h.base))
        .bearer_auth(CONTROL)
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
    let (s, _) = h.get_as("/healthz", None).await;
    assert_eq!(s, 200);
    let (s, v) = h.get_as("/v1/status", None).await;
    assert_eq!(s, 401);
    assert!(v["error"].as_str().unwrap().contains("channels.http.token"));
    let (s, _) = h
        .post(
            "/v1/chat",
            json!({"chat_id": "c", "content": "x"}),
            Some("wrong"),
        )
        .await;
    assert_eq!(s, 401);
    let (s, v) = h
        .post("/v1/chat", json!({"chat_id": "c", "content": "x"}), None)
        .await;
    assert_eq!(s, 401);
    assert!(v["error"]
        .as_str()
        .unwrap()
        .contains("Authorization: Bearer"));
    // The configured token and the control token both admit every route.
    for token in ["s3cret", CONTROL] {
        let (s, v) = h
            .post(
                "/v1/chat",
                json!({"chat_id": "c", "content": "x"}),
                Some(token),
            )
            .await;
        assert_eq!((s, v["reply"].as_str()), (200, Some("echo: x")));
        assert_eq!(h.get_as("/v1/status", Some(token)).await.0, 200);
    }
}

#[tokio::test]
async fn admin_routes_need_a_token_on_loopback_too() {
    let h = start(None, Mode::Reply, Duration::from_secs(5)).await;
    let post = |path: &'static str, token: Option<&'static str>| {
        let mut r = h.http.post(format!("{}{path}", h.base)).json(&json!({
            "channel": "http", "chat_id": "victim", "content": "hi"
        }));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        async move {
            let resp = r.send().await.unwrap();
            let s = resp.status().as_u16();
            let www = resp.headers().get("www-authenticate").cloned();
            (s, www, resp.text().await.unwrap())
        }
    };
    for token in [None, Some("wrong"), Some(""), Some("control-token")] {
        for path in [
            "/v1/status",
            "/v1/sessions",
            "/v1/sessions/http:abc",
            "/metrics",
        ] {
            let (s, v) = h.get_as(path, token).await;
            assert_eq!(s, 401, "{path} with {token:?}: {v}");
            assert!(v["error"].as_str().unwrap().contains("control.json"), "{v}");
        }
        let (s, www, body) = post("/v1/admin/send", token).await;
        assert_eq!(s, 401, "{body}");
        assert_eq!(www.unwrap(), "Bearer");
        assert!(!body.contains("ran"), "{body}");
        let resp = h
            .http
            .delete(format!("{}/v1/sessions/http:abc", h.base))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401);
    }
    // With the control token they answer (the scheme is case-insensitive).
    let (s, v) = h.get_as("/v1/sessions/http:abc", Some(CONTROL)).await;
    assert_eq!((s, v["key"].as_str()), (200, Some("http:abc")));
    let (s, _, body) = post("/v1/admin/send", Some(CONTROL)).await;
    assert_eq!((s, body.as_str()), (200, r#"{"ran":"send"}"#));
    let resp = h
        .http
        .get(format!("{}/v1/status", h.base))
        .header("authorization", format!("bearer {CONTROL}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // /readyz: the status for anyone, the details for the authenticated only.
    let (s, v) = h.get_as("/readyz", None).await;
    assert_eq!((s, v), (200, json!({"status": "ready"})));
    let (s, v) = h.get_as("/readyz", Some(CONTROL)).await;
    assert_eq!(
        (s, v["providers"][0]["base_url"].as_str()),
        (200, Some("http://10.1.2.3/v1"))
    );
}

#[tokio::test]
async fn chat_without_a_token_needs_the_loopback_opt_in() {
    let h = start(None, Mode::Reply, Duration::from_secs(5)).await;
    let body = json!({"chat_id": "c", "content": "x"});
    let (s, v) = h.post("/v1/chat", body.clone(), None).await;
    assert_eq!(s, 401);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("channels.http.allow_loopback_without_token = true"),
        "{v}"
    );
    assert_eq!(h.post("/v1/chat/stream", body.clone(), None).await.0, 401);
    assert_eq!(h.get_as("/v1/chats/c/messages", None).await.0, 401);

    let mut cfg = loopback(None, Duration::from_secs(5));
    cfg.allow_loopback_without_token = true;
    let h = start_with(cfg, Mode::Reply).await;
    let (s, v) = h.post("/v1/chat", body.clone(), None).await;
    assert_eq!((s, v["reply"].as_str()), (200, Some("echo: x")));
    assert_eq!(h.get_as("/v1/chats/c/messages", None).await.0, 200);
    // A token that is sent is still checked; the admin routes still need one.
    assert_eq!(h.post("/v1/chat", body, Some("wrong")).await.0, 401);
    assert_eq!(h.get_as("/v1/sessions", None).await.0, 401);
    assert_eq!(h.get_as("/v1/status", None).await.0, 401);
}

#[tokio::test]
async fn non_loopback_bind_needs_a_token_and_refuses_tokenless_chat() {
    let cfg = |token: Option<&str>, open: bool| HttpConfig {
        bind: "0.0.0.0:0".parse().unwrap(),
        token: token.map(str::to_string),
        control_token: Some(CONTROL.into()),
        allow_loopback_without_token: open,
        reply_timeout: Duration::from_secs(1),
        channel_id: "http".into(),
        max_inbound_bytes: clawft_channel_core::DEFAULT_MAX_INBOUND_BYTES,
        agents: Vec::new(),
        ui_hosts: Vec::new(),
        tls: None,
    };
    let e = HttpChannel::bind(cfg(None, false), Arc::new(FakeAdmin))
        .await
        .err()
        .unwrap();
    assert!(matches!(e, HttpError::NonLoopbackWithoutToken { .. }));
    assert!(e.to_string().contains("channels.http.token"));
    let e = HttpChannel::bind(cfg(Some("t"), true), Arc::new(FakeAdmin))
        .await
        .err()
        .unwrap();
    assert!(matches!(e, HttpError::OpenChatOnNonLoopback { .. }));
    assert!(e
        .to_string()
        .contains("channels.http.allow_loopback_without_token"));
    assert!(
        HttpChannel::bind(cfg(Some("t"), false), Arc::new(FakeAdmin))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn bad_requests_get_json_errors() {
    let h = start(None, Mode::Reply, Duration::from_secs(5)).await;
    let resp = h
        .http
        .post(format!("{}/v1/chat", h.base))
        .bearer_auth(CONTROL)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert!(v["error"].as_str().unwrap().contains("chat_id"));
    let (s, v) = h
        .post(
            "/v1/chat",
            json!({"chat_id": "", "content": "x"}),
            Some(CONTROL),
        )
        .await;
    assert_eq!(s, 400);
    assert!(v["error"].as_str().unwrap().contains("chat_id"));
    let (s, _) = h
        .post(
            "/v1/chat",
            json!({"chat_id": "c", "content": 5}),
            Some(CONTROL),
        )
        .await;
    assert_eq!(s, 400);
    let big = "x".repeat(2 * 1024 * 1024);
    let resp = h
        .http
        .post(format!("{}/v1/chat", h.base))
        .bearer_auth(CONTROL)
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
        .bearer_auth(CONTROL)
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
        body: clawft_channel_core::OutboundBody::text_of(OutboundKind::Final, "ping".into()),
        attachments: Vec::new(),
    };
    h.ch.send(&m).await.unwrap();
    // Sent again (the outbox after a crash): kept once.
    h.ch.send(&m).await.unwrap();
    let (_, v) = h.get("/v1/chats/room/messages").await;
    assert_eq!(v["messages"][0]["content"], "ping");
    assert_eq!(v["messages"].as_array().unwrap().len(), 1, "{v}");
    let seq = v["messages"][0]["seq"].as_u64().unwrap();
    // Not acknowledged: still there.
    let (_, v) = h.get("/v1/chats/room/messages").await;
    assert_eq!(v["messages"][0]["seq"], json!(seq), "{v}");
    let (_, v) = h.get(&format!("/v1/chats/room/messages?after={seq}")).await;
    assert_eq!(v["messages"], json!([]));
    assert_eq!(v["next_after"], json!(seq));
    let (_, v) = h.get("/v1/chats/room/messages").await;
    assert_eq!(v["messages"], json!([]));
}

#[tokio::test]
async fn a_reply_whose_request_is_gone_waits_in_the_mailbox_and_a_resent_request_gets_it() {
    let h = start(None, Mode::Silent, Duration::from_secs(5)).await;
    let reply = |id: &str, to: &str| OutboundMessage {
        id: id.into(),
        channel: ChannelId::new("http"),
        chat: ChatId::new("c9"),
        thread: None,
        in_reply_to: Some(clawft_channel_core::PlatformEventId::new(to)),
        body: clawft_channel_core::OutboundBody::text_of(OutboundKind::Final, "late answer".into()),
        attachments: Vec::new(),
    };
    // No request waits for e1 (it was cut off): the reply is kept, not dropped.
    h.ch.send(&reply("r1", "e1")).await.unwrap();
    let (_, v) = h.get("/v1/chats/c9/messages").await;
    assert_eq!(v["messages"][0]["content"], "late answer", "{v}");
    assert_eq!(v["messages"][0]["in_reply_to"], "e1", "{v}");
}

#[tokio::test]
async fn cancel_stops_listen_and_answers_waiting_requests() {
    let h = start(None, Mode::Silent, Duration::from_secs(30)).await;
    let http = h.http.clone();
    let base = h.base.clone();
    let waiting = tokio::spawn(async move {
        http.post(format!("{base}/v1/chat"))
            .bearer_auth(CONTROL)
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

#[tokio::test]
async fn openai_completion_is_one_event_for_session_at_agent_and_openai_shaped() {
    let h = start(None, Mode::Reply, Duration::from_secs(5)).await;
    let (s, v) = h
        .post(
            "/v1/chat/completions",
            json!({"model": "agent:work", "user": "alice",
                   "messages": [{"role": "user", "content": "old"}, {"role": "user", "content": "hi"}]}),
            Some(CONTROL),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "agent:work");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    // The fake daemon echoes the event's content: only the last user message was sent.
    assert_eq!(v["choices"][0]["message"]["content"], "echo: hi");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["total_tokens"], 0);
    // A failed turn: 502 with an OpenAI error, and no SDK retry.
    let r = h
        .http
        .post(format!("{}/v1/chat/completions", h.base))
        .bearer_auth(CONTROL)
        .json(&json!({"model": "weft", "messages": [{"role": "user", "content": "fail"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 502);
    assert_eq!(r.headers()["x-should-retry"], "false");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "turn_failed");
    // Without a token: refused like every chat route.
    let (s, _) = h
        .post(
            "/v1/chat/completions",
            json!({"model": "weft", "messages": [{"role": "user", "content": "hi"}]}),
            None,
        )
        .await;
    assert_eq!(s, 401);
    // `/v1/chat` cannot pose as this route to pick an agent.
    let (s, v) = h
        .post(
            "/v1/chat",
            json!({"chat_id": "x@work", "content": "hi", "sender": OPENAI_SENDER}),
            Some(CONTROL),
        )
        .await;
    assert_eq!(s, 400, "{v}");
    let (s, v) = h.get("/v1/models").await;
    assert_eq!(s, 200);
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][2]["id"], "agent:work");
    assert_eq!(v["data"][2]["owned_by"], "weft");
    assert_eq!(h.ch.pending_waiters(), 0);
}

#[tokio::test]
async fn openai_stream_sends_chunks_then_done() {
    let h = start(None, Mode::Stream, Duration::from_secs(5)).await;
    let body = h
        .http
        .post(format!("{}/v1/chat/completions", h.base))
        .bearer_auth(CONTROL)
        .json(
            &json!({"model": "weft", "stream": true, "stream_options": {"include_usage": true},
                      "messages": [{"role": "user", "content": "hi"}]}),
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let data: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{body}");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "hello");
    let n = chunks.len();
    assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "stop");
    assert_eq!(chunks[n - 1]["choices"], json!([]));
    assert_eq!(chunks[n - 1]["usage"]["total_tokens"], 0);
}
