//! The Matrix channel against a real homeserver: Synapse from PyPI (`.venv-synapse`, installed
//! by `.ci/run`) on 127.0.0.1 with SQLite, started once for this test binary and shared; every
//! test registers its own users (shared-secret admin API) and rooms.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use clawft_channel_core::media::{MediaKind, OutboundFile};
use clawft_channel_core::{
    Channel, ChannelId, ChatId, MemoryState, OutboundBody, OutboundMessage, PlatformEventId,
};
use clawft_channel_matrix::{MatrixChannel, MatrixConfig};
use serde_json::{json, Value};

use crate::common::{config, last_user, messages, wait_until, TestGateway};
use crate::fake_llm::{FakeLlm, Reply};

const T: Duration = Duration::from_secs(60);
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR a chart";
const SECRET: &str = "weft-test-registration-secret";

/// One Synapse for the whole test binary; it ends with the binary (it runs under a shell that
/// kills it when our end of its stdin closes).
struct Synapse {
    base: String,
    _child: Child,
    _dir: tempfile::TempDir,
}

static SYNAPSE: OnceLock<Option<Synapse>> = OnceLock::new();

fn venv_python() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-synapse/bin/python")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn synapse() -> Option<&'static Synapse> {
    SYNAPSE
        .get_or_init(|| {
            let py = venv_python();
            let ok = py.exists()
                && Command::new(&py)
                    .args(["-c", "import synapse"])
                    .status()
                    .is_ok_and(|s| s.success());
            if !ok {
                assert!(
                    std::env::var("CI").is_err(),
                    "Synapse is needed for the Matrix tests: python3 -m venv .venv-synapse && .venv-synapse/bin/pip install matrix-synapse (.ci/run does this)"
                );
                eprintln!("skipped: no Synapse in .venv-synapse");
                return None;
            }
            let dir = tempfile::tempdir().unwrap();
            let cfg = dir.path().join("homeserver.yaml");
            let out = Command::new(&py)
                .args(["-m", "synapse.app.homeserver", "--server-name", "localhost"])
                .arg("--config-path")
                .arg(&cfg)
                .arg("--data-directory")
                .arg(dir.path())
                .args(["--generate-config", "--report-stats=no"])
                .current_dir(dir.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            let port = free_port();
            // The generated file ends without a newline; later keys replace earlier ones.
            let extra = format!(
                r#"
listeners:
  - port: {port}
    bind_addresses: ['127.0.0.1']
    type: http
    tls: false
    x_forwarded: false
    resources:
      - names: [client]
        compress: false
registration_shared_secret: "{SECRET}"
trusted_key_servers: []
suppress_key_server_warning: true
enable_metrics: false
rc_joins:
  local: {{per_second: 1000, burst_count: 1000}}
rc_invites:
  per_room: {{per_second: 1000, burst_count: 1000}}
  per_user: {{per_second: 1000, burst_count: 1000}}
  per_issuer: {{per_second: 1000, burst_count: 1000}}
rc_room_creation: {{per_second: 1000, burst_count: 1000}}
rc_media_create: {{per_second: 1000, burst_count: 1000}}
"#
            );
            let mut f = std::fs::OpenOptions::new().append(true).open(&cfg).unwrap();
            std::io::Write::write_all(&mut f, extra.as_bytes()).unwrap();
            let child = Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "'{}' -m synapse.app.homeserver -c '{}' >'{}/out.log' 2>&1 & p=$!; read _; kill $p",
                    py.display(),
                    cfg.display(),
                    dir.path().display()
                ))
                .stdin(Stdio::piped())
                // Its log file is relative to the working directory.
                .current_dir(dir.path())
                .spawn()
                .unwrap();
            let deadline = std::time::Instant::now() + T;
            loop {
                if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                    use std::io::{Read, Write};
                    let _ = s.write_all(b"GET /health HTTP/1.0\r\n\r\n");
                    let mut r = String::new();
                    let _ = s.read_to_string(&mut r);
                    if r.ends_with("OK") {
                        break;
                    }
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "Synapse did not start: {}",
                    std::fs::read_to_string(dir.path().join("out.log")).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            Some(Synapse {
                base: format!("http://127.0.0.1:{port}"),
                _child: child,
                _dir: dir,
            })
        })
        .as_ref()
}

/// A user of the homeserver, driven over the Client-Server API.
#[derive(Clone)]
struct User {
    id: String,
    token: String,
    base: String,
    http: reqwest::Client,
}

fn http() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

fn unique(name: &str) -> String {
    format!("{name}{}", &uuid::Uuid::new_v4().simple().to_string()[..10])
}

/// Register a fresh user through the shared-secret admin API; `limited`: keep Synapse's
/// message rate limit for it (the others get it lifted, so tests do not crawl).
async fn register(hs: &Synapse, name: &str, limited: bool) -> User {
    let http = http();
    let url = format!("{}/_synapse/admin/v1/register", hs.base);
    let nonce: Value = http.get(&url).send().await.unwrap().json().await.unwrap();
    let nonce = nonce["nonce"].as_str().unwrap().to_string();
    let username = unique(name);
    let password = "pw-not-used-by-the-gateway";
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, SECRET.as_bytes());
    let msg = format!("{nonce}\0{username}\0{password}\0admin");
    let mac: String = ring::hmac::sign(&key, msg.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let v: Value = http
        .post(&url)
        .json(&json!({"nonce": nonce, "username": username, "password": password, "admin": true, "mac": mac}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let user = User {
        id: v["user_id"]
            .as_str()
            .unwrap_or_else(|| panic!("{v}"))
            .into(),
        token: v["access_token"].as_str().unwrap().into(),
        base: hs.base.clone(),
        http,
    };
    if !limited {
        let r = user
            .http
            .post(format!(
                "{}/_synapse/admin/v1/users/{}/override_ratelimit",
                hs.base, user.id
            ))
            .bearer_auth(&user.token)
            .json(&json!({"messages_per_second": 0, "burst_count": 0}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{:?}", r.text().await);
    }
    user
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

impl User {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut r = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let r = r.send().await.unwrap();
        let status = r.status();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "{path}: {status} {v}");
        v
    }

    async fn create_room(&self, invite: &[&str], encrypted: bool) -> String {
        let mut body =
            json!({"preset": "private_chat", "invite": invite, "is_direct": invite.len() == 1});
        if encrypted {
            body["initial_state"] = json!([{"type": "m.room.encryption", "state_key": "", "content": {"algorithm": "m.megolm.v1.aes-sha2"}}]);
        }
        let v = self
            .call(
                reqwest::Method::POST,
                "/_matrix/client/v3/createRoom",
                Some(body),
            )
            .await;
        v["room_id"].as_str().unwrap().to_string()
    }

    /// A room of version 10, whose id ends in `:localhost` (version 12, Synapse's default,
    /// has ids without a server name).
    async fn create_old_room(&self, invite: &[&str]) -> String {
        let body = json!({"preset": "private_chat", "invite": invite, "is_direct": invite.len() == 1, "room_version": "10"});
        let v = self
            .call(
                reqwest::Method::POST,
                "/_matrix/client/v3/createRoom",
                Some(body),
            )
            .await;
        let room = v["room_id"].as_str().unwrap().to_string();
        assert!(room.contains(':'), "{room}");
        room
    }

    async fn send(&self, room: &str, content: Value) -> String {
        let txn = uuid::Uuid::new_v4().simple().to_string();
        let v = self
            .call(
                reqwest::Method::PUT,
                &format!(
                    "/_matrix/client/v3/rooms/{}/send/m.room.message/{txn}",
                    enc(room)
                ),
                Some(content),
            )
            .await;
        v["event_id"].as_str().unwrap().to_string()
    }

    async fn say(&self, room: &str, text: &str) -> String {
        self.send(room, json!({"msgtype": "m.text", "body": text}))
            .await
    }

    async fn join(&self, room: &str) {
        self.call(
            reqwest::Method::POST,
            &format!("/_matrix/client/v3/rooms/{}/join", enc(room)),
            Some(json!({})),
        )
        .await;
    }

    /// The room's messages (oldest first) as this user sees them.
    async fn messages(&self, room: &str) -> Vec<Value> {
        let v = self
            .call(
                reqwest::Method::GET,
                &format!(
                    "/_matrix/client/v3/rooms/{}/messages?dir=b&limit=200",
                    enc(room)
                ),
                None,
            )
            .await;
        let mut out: Vec<Value> = v["chunk"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == "m.room.message")
            .cloned()
            .collect();
        out.reverse();
        out
    }

    /// The messages `from` posted in `room`.
    async fn messages_of(&self, room: &str, from: &str) -> Vec<Value> {
        self.messages(room)
            .await
            .into_iter()
            .filter(|e| e["sender"] == from)
            .collect()
    }

    /// `user`'s membership event content in `room` (as the room's state says).
    async fn membership(&self, room: &str, user: &str) -> Value {
        let r = self
            .http
            .get(format!(
                "{}/_matrix/client/v3/rooms/{}/state/m.room.member/{}",
                self.base,
                enc(room),
                enc(user)
            ))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap();
        r.json().await.unwrap_or(Value::Null)
    }
}

/// Poll `f` (an async check) until it holds or `T` passes.
async fn eventually<F, Fut>(mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + T;
    while tokio::time::Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

async fn joined(by: &User, room: &str, who: &str) -> bool {
    by.membership(room, who).await["membership"] == "join"
}

fn section(bot: &User, allow: &[&str], extra: Value) -> Value {
    let mut s = json!({
        "homeserver": bot.base,
        "access_token": bot.token,
        "user_id": bot.id,
        "allow_from": allow,
        "stream_edits": false,
    });
    crate::common::merge(&mut s, extra);
    json!({"channels": {"matrix": s}})
}

#[tokio::test]
async fn a_dm_from_an_allowed_user_is_answered_in_the_room_and_a_stranger_gets_a_pairing_code() {
    let Some(hs) = synapse() else { return };
    let bot = register(hs, "bot", false).await;
    let alice = register(hs, "alice", false).await;
    let bob = register(hs, "bob", false).await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("**Hello** Alice".into()));
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        section(
            &bot,
            &[&alice.id],
            json!({"pairing": true, "group_mode": "all"}),
        ),
    ))
    .await;
    let room = alice.create_old_room(&[&bot.id]).await;
    assert!(
        eventually(|| joined(&alice, &room, &bot.id)).await,
        "the bot did not join"
    );
    let asked = alice.say(&room, "hello bot").await;
    assert!(
        eventually(|| async { !alice.messages_of(&room, &bot.id).await.is_empty() }).await,
        "no reply: {:?}",
        llm.requests()
    );
    let reply = &alice.messages_of(&room, &bot.id).await[0];
    assert_eq!(reply["content"]["body"], "**Hello** Alice");
    assert_eq!(reply["content"]["format"], "org.matrix.custom.html");
    assert_eq!(
        reply["content"]["formatted_body"],
        "<p><strong>Hello</strong> Alice</p>"
    );
    assert_eq!(
        reply["content"]["m.relates_to"]["m.in_reply_to"]["event_id"],
        asked.as_str()
    );
    assert_eq!(last_user(&llm.requests()[0]), "hello bot");

    // A stranger in a room the bot is in: refused, never reaches the model, gets a code.
    let group = alice.create_room(&[&bot.id, &bob.id], false).await;
    assert!(eventually(|| joined(&alice, &group, &bot.id)).await);
    bob.join(&group).await;
    bob.say(&group, "let me in").await;
    assert!(
        eventually(|| async {
            alice.messages_of(&group, &bot.id).await.iter().any(|m| {
                m["content"]["body"]
                    .as_str()
                    .unwrap_or("")
                    .contains("pairing approve")
            })
        })
        .await,
        "no pairing code"
    );
    assert_eq!(llm.requests().len(), 1, "the stranger reached the model");

    // The operator approves the code: bob's own invite is now accepted too.
    let msgs = alice.messages_of(&group, &bot.id).await;
    let code = msgs
        .iter()
        .find_map(|m| {
            m["content"]["body"]
                .as_str()?
                .split("pairing approve ")
                .nth(1)
        })
        .unwrap()
        .split('`')
        .next()
        .unwrap()
        .to_string();
    let v = clawft::admin::pairing_command(
        gw.gateway.daemon.store(),
        "pairing/approve",
        &json!({ "code": code }),
    )
    .unwrap();
    assert_eq!(v["approved"], format!("matrix:{}", bob.id));
    let dm = bob.create_room(&[&bot.id], false).await;
    assert!(
        eventually(|| joined(&bob, &dm, &bot.id)).await,
        "a paired user's invite was rejected"
    );
    gw.stop().await;
}

#[tokio::test]
async fn invites_from_strangers_and_to_encrypted_rooms_are_refused() {
    let Some(hs) = synapse() else { return };
    let bot = register(hs, "bot", false).await;
    let alice = register(hs, "alice", false).await;
    let mallory = register(hs, "mallory", false).await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        section(&bot, &[&alice.id], json!({})),
    ))
    .await;
    let theirs = mallory.create_room(&[&bot.id], false).await;
    let secret = alice.create_room(&[&bot.id], true).await;
    let plain = alice.create_room(&[&bot.id], false).await;
    // The invite of the allowed user to an unencrypted room is accepted (and the others were
    // handled in the same or an earlier sync).
    assert!(eventually(|| joined(&alice, &plain, &bot.id)).await);
    assert!(
        eventually(|| async {
            mallory.membership(&theirs, &bot.id).await["membership"] == "leave"
        })
        .await,
        "the stranger's invite was not rejected"
    );
    assert!(
        eventually(|| async { alice.membership(&secret, &bot.id).await["membership"] == "leave" })
            .await,
        "the encrypted room's invite was not rejected"
    );
    let m = alice.membership(&secret, &bot.id).await;
    assert!(
        m["reason"].as_str().unwrap_or("").contains("encrypted"),
        "the inviter is not told why: {m}"
    );
    mallory.say(&theirs, "STRANGER-CANARY hello?").await;

    // A message over the inbound limit (32 KiB) is refused with a notice, unread.
    let marker = "OVERSIZED-CANARY-";
    alice
        .say(&plain, &marker.repeat(40 * 1024 / marker.len()))
        .await;
    assert!(
        eventually(|| async {
            alice.messages_of(&plain, &bot.id).await.iter().any(|m| {
                m["content"]["body"]
                    .as_str()
                    .unwrap_or("")
                    .contains("over the 32 KB limit")
            })
        })
        .await,
        "no notice for the oversized message"
    );
    assert!(llm.requests().is_empty());

    // A joined room that turns encryption on: the bot says why and leaves.
    alice
        .call(
            reqwest::Method::PUT,
            &format!(
                "/_matrix/client/v3/rooms/{}/state/m.room.encryption/",
                enc(&plain)
            ),
            Some(json!({"algorithm": "m.megolm.v1.aes-sha2"})),
        )
        .await;
    assert!(
        eventually(|| async { alice.membership(&plain, &bot.id).await["membership"] == "leave" })
            .await
    );
    gw.stop().await;
    // Nothing of the refused messages was stored.
    let stored = crate::common::bytes_under(&dir.path().join("store"));
    assert!(!stored.contains(marker), "the oversized text was stored");
    assert!(
        !stored.contains("STRANGER-CANARY"),
        "the stranger's message was stored"
    );
}

fn channel(bot: &User, state: std::sync::Arc<MemoryState>) -> MatrixChannel {
    MatrixChannel::new(MatrixConfig {
        homeserver: bot.base.clone(),
        access_token: bot.token.clone(),
        state,
        ..MatrixConfig::default()
    })
    .unwrap()
}

fn outbound(id: &str, room: &str, text: &str) -> OutboundMessage {
    OutboundMessage {
        id: id.into(),
        channel: ChannelId::new("matrix"),
        chat: ChatId::new(clawft_channel_matrix::chat_of(room)),
        thread: None,
        in_reply_to: None::<PlatformEventId>,
        body: OutboundBody::Reply {
            text: text.into(),
            usage: None,
        },
        attachments: Vec::new(),
    }
}

/// A send retried after a crash (the adapter's own journal lost with it) reuses its
/// transaction ids: the homeserver posts each chunk and file once. The file goes through the
/// media repository and comes back byte for byte through the authenticated download.
#[tokio::test]
async fn a_resent_reply_posts_once_and_files_go_through_the_media_repository() {
    let Some(hs) = synapse() else { return };
    let bot = register(hs, "bot", false).await;
    let alice = register(hs, "alice", false).await;
    let room = alice.create_old_room(&[&bot.id]).await;
    let first = channel(&bot, Default::default());
    bot.join(&room).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chart.png");
    std::fs::write(&path, PNG).unwrap();
    let mut msg = outbound("out-1", &room, "the chart you asked for");
    msg.attachments.push(OutboundFile {
        path: path.to_str().unwrap().into(),
        name: "chart.png".into(),
        kind: MediaKind::Image,
        mime: "image/png".into(),
        size: PNG.len() as u64,
    });
    first.send(&msg).await.unwrap();
    // Another adapter with empty state: as after kill -9 before the outbox settled.
    let second = channel(&bot, Default::default());
    second.send(&msg).await.unwrap();
    let posted = alice.messages_of(&room, &bot.id).await;
    assert_eq!(posted.len(), 2, "{posted:#?}");
    assert_eq!(posted[0]["content"]["body"], "the chart you asked for");
    assert_eq!(posted[1]["content"]["msgtype"], "m.image");
    let uri = posted[1]["content"]["url"].as_str().unwrap();
    let req = second
        .media_request(&clawft_channel_core::media::MediaRef::new(
            MediaKind::Image,
            uri,
        ))
        .await
        .unwrap();
    assert!(
        req.url.contains("/_matrix/client/v1/media/download/"),
        "{}",
        req.url
    );
    let mut get = http().get(&req.url);
    for (k, v) in &req.headers {
        get = get.header(k, v);
    }
    let bytes = get.send().await.unwrap().bytes().await.unwrap();
    assert_eq!(&bytes[..], PNG);
    // Without the token the authenticated download is refused.
    let anon = http().get(&req.url).send().await.unwrap();
    assert_eq!(anon.status(), 401);

    // Typing shows in the room.
    second
        .typing(&ChatId::new(clawft_channel_matrix::chat_of(&room)), None)
        .await
        .unwrap();
    let typing = || async {
        let v = alice
            .call(
                reqwest::Method::GET,
                "/_matrix/client/v3/sync?timeout=0",
                None,
            )
            .await;
        v["rooms"]["join"][&room]["ephemeral"]["events"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["type"] == "m.typing" && e["content"]["user_ids"][0] == bot.id.as_str())
    };
    assert!(eventually(typing).await, "the bot is not shown typing");
}

/// Synapse's own rate limit (10 messages, then 0.2 per second) answers 429 with
/// `retry_after_ms`: the adapter reports it as a rate limit with that wait, and the retry
/// sends only the chunks not yet delivered.
#[tokio::test]
async fn synapse_429_is_a_rate_limit_and_the_retry_sends_only_the_rest() {
    let Some(hs) = synapse() else { return };
    let bot = register(hs, "bot", true).await;
    let alice = register(hs, "alice", false).await;
    let room = alice.create_room(&[&bot.id], false).await;
    bot.join(&room).await;
    let ch = channel(&bot, Default::default());
    let para = "word ".repeat(3000);
    let text: Vec<String> = (0..12).map(|i| format!("part {i}: {para}")).collect();
    let msg = outbound("out-long", &room, &text.join("\n\n"));
    let err = ch
        .send(&msg)
        .await
        .expect_err("12 chunks were sent without a 429");
    assert_eq!(err.kind(), "rate_limited", "{err}");
    let wait = err.retry_after().expect("retry_after_ms");
    tokio::time::sleep(wait).await;
    let mut tries = 0;
    while let Err(e) = ch.send(&msg).await {
        assert!(e.is_retryable(), "{e}");
        tries += 1;
        assert!(tries < 20);
        tokio::time::sleep(e.retry_after().unwrap_or(Duration::from_secs(1))).await;
    }
    let posted = alice.messages_of(&room, &bot.id).await;
    let bodies: Vec<&str> = posted
        .iter()
        .map(|m| m["content"]["body"].as_str().unwrap())
        .collect();
    let parts: Vec<String> = bodies
        .iter()
        .flat_map(|b| {
            b.split("\n\n")
                .map(|p| p.split(':').next().unwrap().to_string())
        })
        .collect();
    let want: Vec<String> = (0..12).map(|i| format!("part {i}")).collect();
    assert_eq!(parts, want, "a chunk is missing, repeated or out of order");
}

/// The `since` token outlives the gateway: a message sent while it was down is answered after
/// the restart, and the one answered before is not read again.
#[tokio::test]
async fn since_survives_a_restart_and_an_image_reaches_the_model() {
    let Some(hs) = synapse() else { return };
    let bot = register(hs, "bot", false).await;
    let alice = register(hs, "alice", false).await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.strict(None);
    llm.push(Reply::Text("first answer".into()));
    llm.push(Reply::Text("second answer".into()));
    llm.push(Reply::Text("A chart.".into()));
    let extra = json!({"agents": {"defaults": {"vision": "on"}}});
    let mut cfg = section(&bot, &[&alice.id], json!({}));
    crate::common::merge(&mut cfg, extra);
    let gw = TestGateway::start(config(&llm, dir.path(), cfg.clone())).await;
    let room = alice.create_old_room(&[&bot.id]).await;
    assert!(eventually(|| joined(&alice, &room, &bot.id)).await);
    alice.say(&room, "one").await;
    assert!(eventually(|| async { alice.messages_of(&room, &bot.id).await.len() == 1 }).await);
    gw.stop().await;

    alice.say(&room, "two, while you were away").await;
    let gw = TestGateway::start(config(&llm, dir.path(), cfg.clone())).await;
    assert!(
        eventually(|| async { alice.messages_of(&room, &bot.id).await.len() == 2 }).await,
        "the message sent while the gateway was down was missed"
    );
    assert_eq!(llm.requests().len(), 2);
    assert_eq!(last_user(&llm.requests()[1]), "two, while you were away");

    // An image the user uploads reaches the model as an image part.
    let up: Value = alice
        .http
        .post(format!(
            "{}/_matrix/media/v3/upload?filename=chart.png",
            alice.base
        ))
        .bearer_auth(&alice.token)
        .header("content-type", "image/png")
        .body(PNG)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    alice
        .send(
            &room,
            json!({"msgtype": "m.image", "body": "chart.png", "url": up["content_uri"], "info": {"mimetype": "image/png", "size": PNG.len()}}),
        )
        .await;
    assert!(
        eventually(|| async { alice.messages_of(&room, &bot.id).await.len() == 3 }).await,
        "{:?}",
        llm.requests().len()
    );
    let req = &llm.requests()[2];
    let user = messages(req).last().cloned().unwrap();
    let parts = user["content"].as_array().expect("content parts").clone();
    let url = parts[1]["image_url"]["url"].as_str().unwrap();
    assert!(url.starts_with("data:image/png;base64,"), "{url}");
    assert!(
        wait_until(Duration::from_secs(1), || llm.requests().len() == 3).await,
        "a message was read twice"
    );
    gw.stop().await;
}

/// A message in a thread is answered in that thread, as a reply to it, streamed as a draft the
/// final reply edits (`m.replace`) instead of posting again.
#[tokio::test]
async fn a_thread_message_is_answered_in_its_thread_by_an_edited_draft() {
    let Some(hs) = synapse() else { return };
    let bot = register(hs, "bot", false).await;
    let alice = register(hs, "alice", false).await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let answer = "Here is a longer answer, streamed in parts to the room.";
    llm.push(Reply::Text("Noted.".into()));
    llm.push(Reply::Text(answer.into()));
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        section(
            &bot,
            &[&alice.id],
            json!({"stream_edits": true, "edit_interval_ms": 200}),
        ),
    ))
    .await;
    let room = alice.create_old_room(&[&bot.id]).await;
    assert!(eventually(|| joined(&alice, &room, &bot.id)).await);
    let root = alice.say(&room, "a topic").await;
    assert!(eventually(|| async { !alice.messages_of(&room, &bot.id).await.is_empty() }).await);
    let asked = alice
        .send(
            &room,
            json!({"msgtype": "m.text", "body": "in the thread", "m.relates_to": {"rel_type": "m.thread", "event_id": root, "is_falling_back": true, "m.in_reply_to": {"event_id": root}}}),
        )
        .await;
    let in_thread = |ms: Vec<Value>| -> Vec<Value> {
        let ids: Vec<Value> = ms
            .iter()
            .filter(|m| m["content"]["m.relates_to"]["rel_type"] == "m.thread")
            .map(|m| m["event_id"].clone())
            .collect();
        ms.into_iter()
            .filter(|m| {
                m["content"]["m.relates_to"]["rel_type"] == "m.thread"
                    || ids.contains(&m["content"]["m.relates_to"]["event_id"])
            })
            .collect()
    };
    let shows_answer = |ms: &[Value]| {
        ms.iter().any(|m| {
            m["content"]["m.new_content"]["body"] == answer
                || (m["content"]["body"] == answer
                    && m["content"]["m.relates_to"]["rel_type"] == "m.thread")
        })
    };
    assert!(
        eventually(|| async { shows_answer(&in_thread(alice.messages_of(&room, &bot.id).await)) })
            .await,
        "{:#?}",
        alice.messages_of(&room, &bot.id).await
    );
    let posted = in_thread(alice.messages_of(&room, &bot.id).await);
    let originals: Vec<&Value> = posted
        .iter()
        .filter(|m| m["content"]["m.relates_to"]["rel_type"] != "m.replace")
        .collect();
    let summary: Vec<String> = posted
        .iter()
        .map(|m| format!("{} {}", m["content"]["body"], m["content"]["m.relates_to"]))
        .collect();
    assert_eq!(
        originals.len(),
        1,
        "the reply was posted twice: {summary:#?}"
    );
    let rel = &originals[0]["content"]["m.relates_to"];
    assert_eq!(rel["rel_type"], "m.thread");
    assert_eq!(rel["event_id"], root.as_str());
    assert_eq!(rel["m.in_reply_to"]["event_id"], asked.as_str());
    assert_eq!(last_user(&llm.requests()[1]), "in the thread");
    gw.stop().await;
}

/// Bad Matrix settings are refused at load with the key named.
#[test]
fn bad_matrix_settings_name_their_key() {
    let dir = tempfile::tempdir().unwrap();
    let env = crate::common::test_env(dir.path());
    let cases = [
        (
            json!({"access_token": "t", "allow_from": ["@a:hs"]}),
            "channels.matrix.homeserver",
        ),
        (
            json!({"homeserver": "matrix.example.org", "access_token": "t"}),
            "channels.matrix.homeserver",
        ),
        (
            json!({"homeserver": "https://hs", "allow_from": ["@a:hs"]}),
            "channels.matrix.access_token",
        ),
        (
            json!({"homeserver": "https://hs", "access_token": "t", "allow_from": ["alice"]}),
            "channels.matrix.allow_from",
        ),
        (
            json!({"homeserver": "https://hs", "access_token": "t", "user_id": "weft"}),
            "channels.matrix.user_id",
        ),
    ];
    for (section, key) in cases {
        let v = crate::common::config_value(
            "http://127.0.0.1:9",
            dir.path(),
            json!({"channels": {"matrix": section}}),
        );
        let e = clawft::config::Config::from_str(&v.to_string(), false, &env)
            .err()
            .unwrap_or_else(|| panic!("{section} was accepted"))
            .to_string();
        assert!(e.contains(key), "{section}: {e}");
    }
    let v = crate::common::config_value(
        "http://127.0.0.1:9",
        dir.path(),
        json!({"channels": {"matrix": {"homeserver": "https://hs", "access_token_env": "MX", "allow_from": ["@a:hs"]}}}),
    );
    assert!(clawft::config::Config::from_str(&v.to_string(), false, &env).is_err());
}

/// The delivery test of the other platforms, on Matrix: the real `weft` binary killed (-9) by
/// itself with the reply in the outbox, just after Synapse accepted it, and after the outbox
/// removal; after the restart the room shows exactly one reply (the transaction id of the
/// resend is the same, and Synapse answers it with the event it already has).
#[tokio::test]
async fn matrix_kill_9_at_every_point_of_the_send_path_shows_one_reply() {
    use std::os::unix::process::ExitStatusExt as _;
    let Some(hs) = synapse() else { return };
    const ANSWER: &str = "the one and only answer";
    for (point, shown_before) in [
        ("egress.before_send", 0),
        ("egress.after_send", 1),
        ("egress.after_mark", 1),
    ] {
        let bot = register(hs, "bot", false).await;
        let alice = register(hs, "alice", false).await;
        let dir = tempfile::tempdir().unwrap();
        let llm = FakeLlm::start().await;
        llm.push(Reply::Text(ANSWER.into()));
        let port = crate::process::free_port();
        let mut extra = section(&bot, &[&alice.id], json!({}));
        crate::common::merge(
            &mut extra,
            json!({"channels": {"http": {"bind": format!("127.0.0.1:{port}")}}}),
        );
        let cfg = crate::process::write_config(
            dir.path(),
            &crate::common::config_value(&llm.base_url(), dir.path(), extra),
        );
        let mut d = crate::process::Daemon::start_with_env(
            dir.path(),
            &cfg,
            port,
            &[("WEFT_FAULT", point)],
        )
        .await;
        let room = alice.create_room(&[&bot.id], false).await;
        assert!(eventually(|| joined(&alice, &room, &bot.id)).await);
        alice.say(&room, "are you there?").await;
        let Some(status) = d.exited_within(T).await else {
            panic!(
                "{point} never reached\n{}",
                crate::process::log_of(dir.path())
            );
        };
        assert_eq!(status.signal(), Some(9), "{point}: {status:?}");
        drop(d);
        assert_eq!(
            alice.messages_of(&room, &bot.id).await.len(),
            shown_before,
            "{point}"
        );
        let d = crate::process::Daemon::start(dir.path(), &cfg, port).await;
        assert!(
            eventually(|| async {
                alice
                    .messages_of(&room, &bot.id)
                    .await
                    .iter()
                    .any(|m| m["content"]["body"] == ANSWER)
            })
            .await,
            "{point}: no answer after the restart\n{}",
            crate::process::log_of(dir.path())
        );
        // Give a duplicate every chance to show up.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let shown = alice.messages_of(&room, &bot.id).await;
        assert_eq!(shown.len(), 1, "{point}: {shown:?}");
        assert_eq!(d.term().code(), Some(0));
    }
}
