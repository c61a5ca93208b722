//! The XMPP channel against a real server: Debian's Prosody, started once by this test on
//! 127.0.0.1 with a throw-away certificate, and a real client library on the other side
//! (slixmpp from PyPI, `tests/peer.py`, in `.venv-test`). Waits on events (log lines, stanzas),
//! never on time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use clawft_channel_core::{
    Ack, Channel, ChannelError, ChannelId, ChatId, InboundDelivery, OutboundMessage,
};
use clawft_channel_xmpp::conn::{self, ConnError};
use clawft_channel_xmpp::{Login, TlsMode, XmppChannel, XmppConfig};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);
const SETUP: &str = "install Prosody (apt-get install prosody) and slixmpp in .venv-test (.venv-test/bin/pip install 'slixmpp==1.8.6'), as .ci/run does";

struct Prosody {
    child: Child,
    dir: PathBuf,
    c2s: u16,
    direct: u16,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Prosody {
    async fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("weft-prosody-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data")).unwrap();
        // A throw-away CA and a server certificate for `localhost` signed by it.
        std::fs::write(
            dir.join("leaf.ext"),
            "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        let openssl = |args: &[&str]| {
            let ok = std::process::Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .unwrap();
            assert!(ok.success(), "openssl {args:?} failed");
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=weft test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ]);
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "key.pem",
            "-out",
            "leaf.csr",
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "leaf.ext",
            "-out",
            "cert.pem",
        ]);
        let (c2s, direct) = (free_port(), free_port());
        let d = dir.display();
        let cfg = format!(
            r#"run_as_root = true
data_path = "{d}/data"
plugin_paths = {{}}
c2s_ports = {{ {c2s} }}
c2s_direct_tls_ports = {{ {direct} }}
s2s_ports = {{}}
interfaces = {{ "127.0.0.1" }}
certificates = "{d}"
authentication = "internal_hashed"
log = {{ info = "*console" }}
modules_enabled = {{ "roster", "saslauth", "tls", "disco", "carbons", "ping", "mam", "offline" }}
modules_disabled = {{ "s2s", "admin_shell", "posix" }}
ssl = {{ certificate = "{d}/cert.pem", key = "{d}/key.pem" }}
VirtualHost "localhost"
"#
        );
        std::fs::write(dir.join("prosody.cfg.lua"), cfg).unwrap();
        for (user, pw) in [
            ("bot", "bot-pw"),
            ("alice", "alice-pw"),
            ("mallory", "mallory-pw"),
        ] {
            let st = std::process::Command::new("prosodyctl")
                .arg("--config")
                .arg(dir.join("prosody.cfg.lua"))
                .args(["register", user, "localhost", pw])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .unwrap_or_else(|e| panic!("prosodyctl: {e}: {SETUP}"));
            assert!(st.success(), "prosodyctl register {user} failed");
        }
        let mut child = Command::new("prosody")
            .arg("-F")
            .arg("--config")
            .arg(dir.join("prosody.cfg.lua"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("prosody: {e}: {SETUP}"));
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = tokio::time::timeout(WAIT, async {
            let mut seen = (false, false);
            while let Some(l) = lines.next_line().await.unwrap() {
                seen.0 |= l.contains("Activated service 'c2s' ");
                seen.1 |= l.contains("Activated service 'c2s_direct_tls'");
                if seen == (true, true) {
                    return true;
                }
            }
            false
        })
        .await;
        assert_eq!(ready, Ok(true), "prosody did not start");
        // Keep draining its log so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Prosody {
            child,
            dir,
            c2s,
            direct,
        }
    }

    fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    fn login(&self, tls: TlsMode, user: &str, pw: &str) -> Login {
        Login {
            host: "localhost".into(),
            port: match tls {
                TlsMode::StartTls => self.c2s,
                TlsMode::Direct => self.direct,
            },
            tls,
            jid: format!("{user}@localhost"),
            password: pw.into(),
            resource: "weft".into(),
            ca_pem: Some(std::fs::read(self.ca()).unwrap()),
            timeout: WAIT,
        }
    }
}

impl Drop for Prosody {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("CLAWFT_TEST_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv-test/bin/python")
}

/// A slixmpp client.
struct Peer {
    _child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Peer {
    async fn start(p: &Prosody, user: &str, pw: &str) -> Self {
        let mut child = Command::new(python())
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peer.py"))
            .args([
                format!("{user}@localhost"),
                pw.to_string(),
                p.c2s.to_string(),
            ])
            .arg(p.ca())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("python: {e}: {SETUP}"));
        let mut peer = Peer {
            stdin: child.stdin.take().unwrap(),
            lines: BufReader::new(child.stdout.take().unwrap()).lines(),
            _child: child,
        };
        assert_eq!(peer.next().await, json!({"ready": true}));
        peer
    }

    async fn next(&mut self) -> Value {
        let l = tokio::time::timeout(WAIT, self.lines.next_line())
            .await
            .expect("the XMPP peer said nothing")
            .unwrap()
            .expect("the XMPP peer ended");
        serde_json::from_str(&l).unwrap()
    }

    async fn cmd(&mut self, v: Value) {
        self.stdin
            .write_all(format!("{v}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
    }

    async fn say(&mut self, id: &str, body: &str) {
        self.cmd(json!({"send": {"to": "bot@localhost", "body": body, "id": id, "receipt": true}}))
            .await;
    }
}

/// The next event the channel delivers, answered with `ack`.
async fn take(
    rx: &mut mpsc::Receiver<InboundDelivery>,
    ack: Ack,
) -> clawft_channel_core::InboundEvent {
    let d = tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("no event from the channel")
        .expect("the channel stopped");
    let _ = d.ack.expect("an ack port").send(ack);
    d.event
}

struct Running {
    ch: Arc<XmppChannel>,
    rx: mpsc::Receiver<InboundDelivery>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), ChannelError>>,
}

fn run(p: &Prosody) -> Running {
    let mut cfg = XmppConfig::new(p.login(TlsMode::StartTls, "bot", "bot-pw"));
    cfg.allow_from = ["alice@localhost".to_string()].into();
    let ch = Arc::new(XmppChannel::new(cfg));
    let (tx, rx) = mpsc::channel(8);
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let (ch, cancel) = (ch.clone(), cancel.clone());
        async move { ch.listen(tx, cancel).await }
    });
    Running {
        ch,
        rx,
        cancel,
        task,
    }
}

/// Whether Prosody and slixmpp are here; outside CI a missing one skips the test (saying
/// so), in CI it fails it.
fn available() -> bool {
    let prosody = std::process::Command::new("prosodyctl")
        .arg("about")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    let slixmpp = std::process::Command::new(python())
        .args(["-c", "import slixmpp"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if prosody && slixmpp {
        return true;
    }
    let what = if prosody { "slixmpp" } else { "prosody" };
    assert!(std::env::var("CI").is_err(), "{what} is missing: {SETUP}");
    eprintln!("skipped: {what} is missing: {SETUP}");
    false
}

#[tokio::test]
async fn one_to_one_chats_against_a_real_prosody() {
    if !available() {
        return;
    }
    let p = Prosody::start().await;

    // Logins: a wrong password is an authentication error (not retried as a network one);
    // direct TLS binds like STARTTLS.
    match conn::connect(&p.login(TlsMode::StartTls, "bot", "wrong")).await {
        Err(e @ ConnError::Auth(_)) => assert!(!e.is_retryable()),
        Err(other) => panic!("expected an auth error, got {other}"),
        Ok(_) => panic!("a wrong password logged in"),
    }
    let s = conn::connect(&p.login(TlsMode::Direct, "bot", "bot-pw"))
        .await
        .unwrap();
    assert!(s.bound.starts_with("bot@localhost/"), "{}", s.bound);
    drop(s);

    let mut alice = Peer::start(&p, "alice", "alice-pw").await;
    let mut mallory = Peer::start(&p, "mallory", "mallory-pw").await;
    let mut bot = run(&p);

    // A message: the sender's bare JID is chat and sender, its stanza id the event id, and the
    // receipt comes only after the gateway took it.
    alice.say("m1", "hello <bot> & co").await;
    let ev = take(&mut bot.rx, Ack::Accepted).await;
    assert_eq!(ev.chat.as_str(), "alice@localhost");
    assert_eq!(ev.sender.as_str(), "alice@localhost");
    assert_eq!(ev.event_id.as_str(), "alice@localhost:m1");
    assert_eq!(ev.content, "hello <bot> & co");
    assert_eq!(alice.next().await, json!({"receipt": "m1"}));

    // The client sends it again (it never saw the receipt): the same event id, so ingress
    // finds the duplicate; the receipt is sent again so the client stops resending.
    alice.say("m1", "hello <bot> & co").await;
    let again = take(&mut bot.rx, Ack::Duplicate).await;
    assert_eq!(again.event_id, ev.event_id);
    assert_eq!(alice.next().await, json!({"receipt": "m1"}));

    // A stranger refused by the gateway gets no receipt (their next, accepted, message is the
    // first one acknowledged).
    mallory.say("x1", "let me in").await;
    let ev = take(&mut bot.rx, Ack::Rejected("not allowed".into())).await;
    assert_eq!(ev.sender.as_str(), "mallory@localhost");
    mallory.say("x2", "code?").await;
    take(&mut bot.rx, Ack::Accepted).await;
    assert_eq!(mallory.next().await, json!({"receipt": "x2"}));

    // When the gateway cannot store, the sender is told so (and gets no receipt).
    alice.say("m2", "are you there").await;
    take(
        &mut bot.rx,
        Ack::Unavailable("I cannot take messages right now.".into()),
    )
    .await;
    let told = alice.next().await;
    assert_eq!(told["message"]["body"], "I cannot take messages right now.");
    assert_eq!(told["message"]["from"], "bot@localhost");

    // A reply reaches the user as sent.
    let reply = OutboundMessage::proactive(
        ChannelId::new("xmpp"),
        ChatId::new("alice@localhost"),
        None,
        "Hi **Alice** <3 & goodbye".into(),
    );
    let sent = bot.ch.send(&reply).await.unwrap();
    let got = alice.next().await;
    assert_eq!(got["message"]["body"], "Hi **Alice** <3 & goodbye");
    assert_eq!(got["message"]["from"], "bot@localhost");
    bot.ch
        .typing(&ChatId::new("alice@localhost"), None)
        .await
        .unwrap();

    // An allowed user's subscription request is accepted; the roster then has the bot.
    alice.cmd(json!({"subscribe": "bot@localhost"})).await;
    assert_eq!(alice.next().await, json!({"subscribed": "bot@localhost"}));

    // The bot goes away, saying so: the stop returns once the server took the goodbye, so
    // what alice sends from then on is kept by the server and delivered at the next login,
    // with its id (before, a message sent right after the stop could still be written to the
    // closing connection and be lost). Its contact sees it offline.
    bot.cancel.cancel();
    bot.task.await.unwrap().unwrap();
    alice.say("m3", "while you were out").await;
    assert_eq!(alice.next().await, json!({"unavailable": "bot@localhost"}));
    // The reply already delivered is not sent again (the send journal has it); a new one
    // fails as transient while disconnected, so the outbox keeps it for later.
    let again = bot.ch.send(&reply).await.unwrap();
    assert_eq!(again, sent);
    let later = OutboundMessage::proactive(
        ChannelId::new("xmpp"),
        ChatId::new("alice@localhost"),
        None,
        "later".into(),
    );
    let r = bot.ch.send(&later).await;
    assert!(matches!(r, Err(ChannelError::Transient(_))), "{r:?}");
    let mut bot = run(&p);
    let ev = take(&mut bot.rx, Ack::Accepted).await;
    assert_eq!(ev.event_id.as_str(), "alice@localhost:m3");
    assert_eq!(ev.content, "while you were out");
    assert_eq!(alice.next().await, json!({"receipt": "m3"}));
    bot.cancel.cancel();
    bot.task.await.unwrap().unwrap();
}
