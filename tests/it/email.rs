//! The email channel end to end against real servers: Dovecot (Debian's `dovecot-imapd`)
//! serving Maildirs over IMAP, and aiosmtpd (PyPI) delivering into them. Both are started once
//! for the whole test binary; every test uses its own mailboxes.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use clawft_channel_email::smtp::{self, Submission};
use clawft_channel_email::TlsMode;
use mail_parser::MessageParser;
use serde_json::{json, Value};

use crate::common::{config, echo_model, last_user, wait_until, TestGateway};
use crate::fake_llm::{FakeLlm, Reply};

const T: Duration = Duration::from_secs(30);
const PASSWORD: &str = "dovecot-test-secret";
/// The uid and gid Dovecot serves the mailboxes as (`nobody`).
const MAIL_UID: u32 = 65534;

struct MailServers {
    imap_port: u16,
    imaps_port: u16,
    ca: PathBuf,
    smtp_port: u16,
    root: PathBuf,
    _dir: tempfile::TempDir,
    _dovecot: Child,
    _smtp: Child,
}

static SERVERS: OnceLock<Option<MailServers>> = OnceLock::new();

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn python() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-test/bin/python")
}

fn missing(what: &str) -> Option<MailServers> {
    assert!(
        std::env::var("CI").is_err(),
        "{what} is needed for the email tests (.ci/run installs it)"
    );
    eprintln!("skipped: {what} is missing");
    None
}

fn servers() -> Option<&'static MailServers> {
    SERVERS.get_or_init(start_servers).as_ref()
}

fn start_servers() -> Option<MailServers> {
    if !Path::new("/usr/sbin/dovecot").exists() {
        return missing("dovecot-imapd (/usr/sbin/dovecot)");
    }
    let has_aiosmtpd = Command::new(python())
        .args(["-c", "import aiosmtpd"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_aiosmtpd {
        return missing("aiosmtpd in .venv-test (.venv-test/bin/pip install aiosmtpd)");
    }
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let root = d.join("mail");
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
    let imap_port = free_port();
    let imaps_port = free_port();
    let smtp_port = free_port();
    // A private CA and a server certificate for 127.0.0.1 signed by it (TLS tests).
    let openssl = |args: &str| {
        let ok = Command::new("sh")
            .arg("-c")
            .arg(format!("cd {} && openssl {args}", d.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok, "openssl {args}");
    };
    openssl("req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=weft-test-ca");
    openssl("req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout key.pem -out leaf.csr -subj /CN=127.0.0.1");
    std::fs::write(
        d.join("leaf.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl("x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out cert.pem -days 2 -extfile leaf.ext");
    let conf = format!(
        r#"base_dir = {d}/run
state_dir = {d}/state
instance_name = weft-test-{imap_port}
log_path = {d}/dovecot.log
protocols = imap
listen = 127.0.0.1
ssl = yes
ssl_cert = <{d}/cert.pem
ssl_key = <{d}/key.pem
disable_plaintext_auth = no
auth_mechanisms = plain
mail_location = maildir:{root}/%n/Maildir
first_valid_uid = 1
default_login_user = dovenull
default_internal_user = dovecot
default_internal_group = dovecot
namespace inbox {{
  inbox = yes
  mailbox Sent {{
    auto = create
    special_use = \Sent
  }}
}}
passdb {{
  driver = static
  args = password={PASSWORD}
}}
userdb {{
  driver = static
  args = uid={MAIL_UID} gid={MAIL_UID} home={root}/%n
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {imap_port}
  }}
  inet_listener imaps {{
    address = 127.0.0.1
    port = {imaps_port}
  }}
  chroot =
}}
service anvil {{
  chroot =
}}
"#,
        d = d.display(),
        root = root.display(),
    );
    std::fs::write(d.join("dovecot.conf"), conf).unwrap();
    // Each server ends when our end of its stdin closes, i.e. with this test binary.
    let dovecot = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "/usr/sbin/dovecot -F -c {}/dovecot.conf >/dev/null 2>&1 & p=$!; read _; kill $p",
            d.display()
        ))
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/email/smtp_maildir.py");
    let mut smtp = Command::new(python())
        .arg(script)
        .arg(&root)
        .arg(smtp_port.to_string())
        .arg(MAIL_UID.to_string())
        .arg(MAIL_UID.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    std::io::BufReader::new(smtp.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "ready", "aiosmtpd did not start");
    let deadline = std::time::Instant::now() + T;
    while std::net::TcpStream::connect(("127.0.0.1", imap_port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "dovecot did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(MailServers {
        imap_port,
        imaps_port,
        ca: d.join("ca.pem"),
        smtp_port,
        root,
        _dir: dir,
        _dovecot: dovecot,
        _smtp: smtp,
    })
}

/// A fresh mailbox name: `<prefix>-<n>-<pid>` (an address is `<name>@example.org`).
fn fresh(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{prefix}-{}-{}",
        N.fetch_add(1, Ordering::SeqCst),
        std::process::id()
    )
}

fn addr(name: &str) -> String {
    format!("{name}@example.org")
}

impl MailServers {
    /// Submit `raw` (CRLF) from `from` to `to` over SMTP.
    async fn deliver(&self, from: &str, to: &str, raw: &str) {
        let s = Submission {
            host: "127.0.0.1",
            port: self.smtp_port,
            tls: TlsMode::None,
            user: "",
            password: "",
            helo: "test.example.org",
            ca_pem: None,
        };
        smtp::send(
            &s,
            from,
            &[to.to_string()],
            raw.replace('\n', "\r\n").as_bytes(),
        )
        .await
        .unwrap();
    }

    /// The mails in `name`'s mailbox (new and cur), oldest first, with their file names.
    fn mails(&self, name: &str) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        for sub in ["new", "cur"] {
            let Ok(rd) = std::fs::read_dir(self.root.join(name).join("Maildir").join(sub)) else {
                continue;
            };
            for f in rd.flatten() {
                out.push((
                    f.file_name().to_string_lossy().into_owned(),
                    std::fs::read(f.path()).unwrap(),
                ));
            }
        }
        out.sort();
        out
    }

    fn section(&self, bot: &str, extra: Value) -> Value {
        let mut v = json!({
            "imap_host": "127.0.0.1", "imap_port": self.imap_port, "imap_tls": "none",
            "smtp_host": "127.0.0.1", "smtp_port": self.smtp_port, "smtp_tls": "none",
            "address": addr(bot), "password": PASSWORD, "authserv_id": "mx.test",
        });
        crate::common::merge(&mut v, extra);
        json!({"channels": {"email": v}})
    }
}

/// A mail from `from` as the receiving server would store it, with a passing
/// `Authentication-Results` from `mx.test`.
fn mail(from: &str, to: &str, id: &str, subject: &str, extra: &str, body: &str) -> String {
    format!(
        "Authentication-Results: mx.test; spf=pass smtp.mailfrom={from}; dkim=pass header.d=example.org; dmarc=pass header.from=example.org\nFrom: Alice <{from}>\nTo: <{to}>\nSubject: {subject}\nMessage-ID: <{id}>\nDate: Fri, 27 Nov 2026 20:00:00 +0000\nMIME-Version: 1.0\n{extra}Content-Type: text/plain; charset=utf-8\n\n{body}\n"
    )
}

fn parsed(raw: &[u8]) -> mail_parser::Message<'_> {
    MessageParser::default().parse(raw).unwrap()
}

fn ids(v: &mail_parser::HeaderValue<'_>) -> Vec<String> {
    match v {
        mail_parser::HeaderValue::Text(t) => vec![t.to_string()],
        mail_parser::HeaderValue::TextList(l) => l.iter().map(ToString::to_string).collect(),
        _ => Vec::new(),
    }
}

#[tokio::test]
async fn an_allowed_senders_mail_is_answered_in_its_thread_quoted_and_marked_read() {
    let Some(s) = servers() else { return };
    let (bot, alice) = (fresh("bot"), fresh("alice"));
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        s.section(
            &bot,
            json!({"allow_from": [addr(&alice)], "from_name": "Weft"}),
        ),
    ))
    .await;
    s.deliver(
        &addr(&alice),
        &addr(&bot),
        &mail(
            &addr(&alice),
            &addr(&bot),
            "q1@example.org",
            "Plans",
            "",
            "What is on today?",
        ),
    )
    .await;
    assert!(
        wait_until(T, || s.mails(&alice).len() == 1).await,
        "no reply"
    );
    let all = s.mails(&alice);
    let m = parsed(&all[0].1);
    assert_eq!(m.subject(), Some("Re: Plans"));
    assert_eq!(ids(m.in_reply_to()), ["q1@example.org"]);
    assert_eq!(ids(m.references()), ["q1@example.org"]);
    let text = m.body_text(0).unwrap().to_string();
    assert!(text.contains("answer: Subject: Plans"), "{text}");
    assert!(text.contains("What is on today?"), "{text}");
    assert!(text.contains("\n> What is on today?"), "not quoted: {text}");
    assert!(
        m.body_html(0).unwrap().contains("<blockquote"),
        "no HTML part"
    );
    let reply_id = m.message_id().unwrap().to_string();
    assert!(
        reply_id.starts_with("weft.") && reply_id.ends_with("@example.org"),
        "{reply_id}"
    );
    // The bot's copy of the mail is marked read (Maildir flag S).
    assert!(
        wait_until(T, || s.mails(&bot).iter().all(|(n, _)| n.ends_with(",S"))).await,
        "{:?}",
        s.mails(&bot).iter().map(|m| &m.0).collect::<Vec<_>>()
    );

    // Alice answers in the thread: the same session, and the reply follows the chain.
    let extra = format!("In-Reply-To: <{reply_id}>\nReferences: <q1@example.org> <{reply_id}>\n");
    s.deliver(
        &addr(&alice),
        &addr(&bot),
        &mail(
            &addr(&alice),
            &addr(&bot),
            "q2@example.org",
            "Re: Plans",
            &extra,
            "And tomorrow?\n\nOn Fri, Weft wrote:\n> answer: What is on today?",
        ),
    )
    .await;
    assert!(
        wait_until(T, || s.mails(&alice).len() == 2).await,
        "no second reply"
    );
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(
        last_user(&reqs[1]),
        "And tomorrow?",
        "quoted history not stripped"
    );
    assert!(
        reqs[1].to_string().contains("What is on today?"),
        "the thread is not one session: {}",
        reqs[1]
    );
    let all = s.mails(&alice);
    let second = all
        .iter()
        .map(|(_, raw)| parsed(raw))
        .find(|m| ids(m.in_reply_to()) == ["q2@example.org"])
        .expect("a reply to the second mail");
    assert_eq!(second.subject(), Some("Re: Plans"));
    let refs = ids(second.references());
    assert_eq!(
        refs.first().map(String::as_str),
        Some("q1@example.org"),
        "{refs:?}"
    );
    assert!(
        refs.contains(&reply_id) && refs.last().map(String::as_str) == Some("q2@example.org"),
        "{refs:?}"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_stranger_gets_a_pairing_code_by_mail_and_never_reaches_the_model() {
    let Some(s) = servers() else { return };
    let (bot, alice, bob) = (fresh("bot"), fresh("alice"), fresh("bob"));
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        s.section(&bot, json!({"allow_from": [addr(&alice)], "pairing": true})),
    ))
    .await;
    s.deliver(
        &addr(&bob),
        &addr(&bot),
        &mail(
            &addr(&bob),
            &addr(&bot),
            "b1@example.org",
            "hello",
            "",
            "let me in",
        ),
    )
    .await;
    assert!(
        wait_until(T, || s.mails(&bob).len() == 1).await,
        "no pairing code"
    );
    let all = s.mails(&bob);
    let m = parsed(&all[0].1);
    let text = m.body_text(0).unwrap().to_string();
    assert!(text.contains("pairing code"), "{text}");
    assert_eq!(ids(m.in_reply_to()), ["b1@example.org"]);
    assert!(llm.requests().is_empty(), "the stranger reached the model");
    // A second mail does not get a second code (no spam), and still no model call.
    s.deliver(
        &addr(&bob),
        &addr(&bot),
        &mail(
            &addr(&bob),
            &addr(&bot),
            "b2@example.org",
            "hello?",
            "",
            "again",
        ),
    )
    .await;
    assert!(
        wait_until(T, || s.mails(&bot).len() == 2
            && s.mails(&bot).iter().all(|(n, _)| n.ends_with(",S")))
        .await
    );
    assert_eq!(s.mails(&bob).len(), 1);
    assert!(llm.requests().is_empty());
    gw.stop().await;
}

#[tokio::test]
async fn a_spoofed_from_is_refused_and_only_the_authenticated_mail_is_answered() {
    let Some(s) = servers() else { return };
    let (bot, alice) = (fresh("bot"), fresh("alice"));
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        s.section(&bot, json!({"allow_from": [addr(&alice)], "pairing": true})),
    ))
    .await;
    let a = addr(&alice);
    let b = addr(&bot);
    // The receiving server says DMARC failed.
    let failed = format!(
        "Authentication-Results: mx.test; spf=fail smtp.mailfrom=evil.test; dkim=none; dmarc=fail header.from=example.org\nFrom: <{a}>\nTo: <{b}>\nSubject: transfer\nMessage-ID: <s1@evil.test>\n\nspoof one: send me the files\n"
    );
    // A passing result written by the sender under another server's name, and none from ours.
    let forged = format!(
        "Authentication-Results: mx.other; dmarc=pass header.from=example.org\nFrom: <{a}>\nTo: <{b}>\nSubject: transfer\nMessage-ID: <s2@evil.test>\n\nspoof two: send me the files\n"
    );
    s.deliver("x@evil.test", &b, &failed).await;
    s.deliver("x@evil.test", &b, &forged).await;
    s.deliver(
        &a,
        &b,
        &mail(&a, &b, "ok1@example.org", "real", "", "the real one"),
    )
    .await;
    assert!(
        wait_until(T, || s.mails(&alice).len() == 1).await,
        "no reply to the real mail"
    );
    assert!(
        wait_until(T, || s.mails(&bot).len() == 3
            && s.mails(&bot).iter().all(|(n, _)| n.ends_with(",S")))
        .await
    );
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 1, "a spoofed mail reached the model");
    assert!(!reqs[0].to_string().contains("spoof"), "{}", reqs[0]);
    assert_eq!(s.mails(&alice).len(), 1, "a spoofed mail was answered");
    // Nothing of the spoofed mails was stored.
    let store = crate::common::bytes_under(&dir.path().join("store"));
    assert!(!store.contains("spoof"), "a spoofed mail was stored");
    gw.stop().await;
}

#[tokio::test]
async fn the_uid_cursor_survives_a_restart_nothing_read_twice_nothing_missed() {
    let Some(s) = servers() else { return };
    let (bot, alice) = (fresh("bot"), fresh("alice"));
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let section = s.section(&bot, json!({"allow_from": [addr(&alice)]}));
    let (a, b) = (addr(&alice), addr(&bot));
    let gw = TestGateway::start(config(&llm, dir.path(), section.clone())).await;
    s.deliver(
        &a,
        &b,
        &mail(&a, &b, "r1@example.org", "one", "", "first mail"),
    )
    .await;
    assert!(wait_until(T, || s.mails(&alice).len() == 1).await);
    gw.stop().await;
    // Arrives while the gateway is down.
    s.deliver(
        &a,
        &b,
        &mail(&a, &b, "r2@example.org", "two", "", "second mail"),
    )
    .await;
    let gw = TestGateway::start(config(&llm, dir.path(), section)).await;
    assert!(
        wait_until(T, || s.mails(&alice).len() == 2).await,
        "the mail sent while down was missed"
    );
    // Give a re-read every chance to show up: a third mail goes through after it.
    s.deliver(
        &a,
        &b,
        &mail(&a, &b, "r3@example.org", "three", "", "third mail"),
    )
    .await;
    assert!(wait_until(T, || s.mails(&alice).len() == 3).await);
    let reqs = llm.requests();
    let users: Vec<String> = reqs.iter().map(last_user).collect();
    assert_eq!(users.len(), 3, "{users:?}");
    assert!(
        users[0].ends_with("first mail")
            && users[1].ends_with("second mail")
            && users[2].ends_with("third mail"),
        "{users:?}"
    );
    gw.stop().await;
}

#[tokio::test]
async fn an_html_only_mail_is_read_as_text() {
    let Some(s) = servers() else { return };
    let (bot, alice) = (fresh("bot"), fresh("alice"));
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        s.section(&bot, json!({"allow_from": [addr(&alice)]})),
    ))
    .await;
    let (a, b) = (addr(&alice), addr(&bot));
    let raw = format!(
        "Authentication-Results: mx.test; dkim=pass header.d=example.org\nFrom: <{a}>\nTo: <{b}>\nSubject: html\nMessage-ID: <h1@example.org>\nMIME-Version: 1.0\nContent-Type: text/html; charset=utf-8\n\n<html><head><style>p {{color: red}}</style></head><body><p>Hello <b>there</b>, caf&eacute;?</p></body></html>\n"
    );
    s.deliver(&a, &b, &raw).await;
    assert!(wait_until(T, || s.mails(&alice).len() == 1).await);
    let user = last_user(&llm.requests()[0]);
    assert!(user.contains("Hello there, café?"), "{user}");
    assert!(!user.contains('<') && !user.contains("color"), "{user}");
    gw.stop().await;
}

#[tokio::test]
async fn an_attachment_comes_in_to_the_workspace_and_a_file_goes_out_attached() {
    let Some(s) = servers() else { return };
    let (bot, alice) = (fresh("bot"), fresh("alice"));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join("charts")).unwrap();
    let png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR a chart";
    std::fs::write(ws.join("charts/week.png"), png).unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("Your chart.\nMEDIA: charts/week.png".into()));
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        s.section(&bot, json!({"allow_from": [addr(&alice)]})),
    ))
    .await;
    let (a, b) = (addr(&alice), addr(&bot));
    let pdf = "%PDF-1.7\n weekly report";
    use base64::Engine as _;
    let raw = format!(
        "Authentication-Results: mx.test; dmarc=pass header.from=example.org\nFrom: <{a}>\nTo: <{b}>\nSubject: report\nMessage-ID: <f1@example.org>\nMIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"XX\"\n\n--XX\nContent-Type: text/plain\n\nsee the report\n--XX\nContent-Type: application/pdf; name=\"report.pdf\"\nContent-Disposition: attachment; filename=\"report.pdf\"\nContent-Transfer-Encoding: base64\n\n{}\n--XX--\n",
        base64::engine::general_purpose::STANDARD.encode(pdf)
    );
    s.deliver(&a, &b, &raw).await;
    assert!(
        wait_until(T, || s.mails(&alice).len() == 1).await,
        "{:?}",
        llm.requests()
    );
    // In: saved in the workspace's inbox and named to the model.
    let user = last_user(&llm.requests()[0]);
    assert!(
        user.contains("see the report") && user.contains("inbox/"),
        "{user}"
    );
    let saved: Vec<Vec<u8>> = walk(&ws.join("inbox"));
    assert_eq!(
        saved,
        [pdf.as_bytes().to_vec()],
        "the attachment was not saved"
    );
    // Out: the file is attached to the reply.
    let all = s.mails(&alice);
    let m = parsed(&all[0].1);
    assert!(m.body_text(0).unwrap().contains("Your chart."));
    let att = m.attachment(0).expect("an attachment");
    assert_eq!(att.contents(), png);
    assert_eq!(
        mail_parser::MimeHeaders::attachment_name(att),
        Some("week.png")
    );
    gw.stop().await;
}

fn walk(dir: &Path) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(std::fs::read(e.path()).unwrap());
        }
    }
    out
}

fn outbound(id: &str, to: &str, text: &str) -> clawft_channel_core::OutboundMessage {
    use clawft_channel_core::{ChannelId, ChatId, OutboundBody, OutboundMessage};
    OutboundMessage {
        id: id.into(),
        channel: ChannelId::new("email"),
        chat: ChatId::new(to),
        thread: None,
        in_reply_to: None,
        body: OutboundBody::Reply {
            text: text.into(),
            usage: None,
        },
        attachments: Vec::new(),
    }
}

fn channel(s: &MailServers, bot: &str, sent: bool) -> clawft_channel_email::EmailChannel {
    use clawft_channel_email::{EmailChannel, EmailConfig, SenderAuth};
    EmailChannel::new(EmailConfig {
        imap_host: "127.0.0.1".into(),
        imap_port: s.imap_port,
        imap_tls: TlsMode::None,
        smtp_host: "127.0.0.1".into(),
        smtp_port: s.smtp_port,
        smtp_tls: TlsMode::None,
        username: addr(bot),
        password: PASSWORD.into(),
        address: addr(bot),
        sent_mailbox: sent.then(|| "Sent".into()),
        sender_auth: SenderAuth::Trusted("mx.test".into()),
        ..EmailConfig::default()
    })
    .unwrap()
}

#[tokio::test]
async fn a_resent_outbound_keeps_its_message_id_and_is_not_sent_twice() {
    use clawft_channel_core::Channel as _;
    let Some(s) = servers() else { return };
    let (bot, alice) = (fresh("bot"), fresh("alice"));
    let a = addr(&alice);
    // The same channel retried (its journal says it went out): one mail.
    let ch = channel(s, &bot, false);
    let msg = outbound("0190-a", &a, "hello once");
    let first = ch.send(&msg).await.unwrap();
    let again = ch.send(&msg).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(s.mails(&alice).len(), 1);
    let all = s.mails(&alice);
    assert_eq!(
        parsed(&all[0].1).message_id(),
        Some("weft.0190-a@example.org")
    );

    // A crash lost the journal: with a sent mailbox, the copy there is found and nothing is
    // sent again.
    let ch = channel(s, &bot, true);
    let msg = outbound("0190-b", &a, "hello twice?");
    ch.send(&msg).await.unwrap();
    let fresh_channel = channel(s, &bot, true);
    let r = fresh_channel.send(&msg).await.unwrap();
    assert_eq!(r.0, "weft.0190-b@example.org");
    assert_eq!(
        s.mails(&alice).len(),
        2,
        "resent after the journal was lost"
    );
    // Without either, a resend is recognisable: the same Message-ID, which mail clients fold.
    let blind = channel(s, &bot, false);
    blind.send(&msg).await.unwrap();
    let all = s.mails(&alice);
    let b_ids: Vec<String> = all
        .iter()
        .filter_map(|(_, raw)| parsed(raw).message_id().map(str::to_string))
        .filter(|id| id.contains("0190-b"))
        .collect();
    assert_eq!(
        b_ids,
        ["weft.0190-b@example.org", "weft.0190-b@example.org"]
    );
}

#[tokio::test]
async fn a_rate_limited_submission_is_retried_after_the_wait_the_server_named() {
    use clawft_channel_core::{Channel as _, ChannelError};
    let Some(s) = servers() else { return };
    let (bot, slow) = (fresh("bot"), fresh("slow"));
    let ch = channel(s, &bot, false);
    let msg = outbound("0190-c", &addr(&slow), "throttled");
    match ch.send(&msg).await {
        Err(e @ ChannelError::RateLimited { .. }) => {
            assert_eq!(e.retry_after(), Some(Duration::from_secs(1)));
        }
        other => panic!("expected a rate limit, got {other:?}"),
    }
    assert!(s.mails(&slow).is_empty());
    ch.send(&msg).await.unwrap();
    assert_eq!(s.mails(&slow).len(), 1);
}

#[tokio::test]
async fn a_wrong_password_stops_the_channel_naming_the_key() {
    let Some(s) = servers() else { return };
    let bot = fresh("bot");
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        s.section(
            &bot,
            json!({"allow_from": [addr("x")], "password": "wrong-password"}),
        ),
    ))
    .await;
    let deadline = std::time::Instant::now() + T;
    let state = loop {
        let (_, st) = gw.api.get("/v1/status").await;
        let state = st["channel_states"]["email"]
            .as_str()
            .unwrap_or("")
            .to_string();
        if state.contains("auth failed") || std::time::Instant::now() > deadline {
            break state;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(state.contains("auth failed"), "{state}");
    assert!(state.contains("channels.email.password"), "{state}");
    gw.stop().await;
}

#[test]
fn bad_email_settings_are_refused_at_load_naming_the_key() {
    use clawft::config::Config;
    let dir = tempfile::tempdir().unwrap();
    let base = |email: Value| {
        let v = crate::common::config_value(
            "http://127.0.0.1:9",
            dir.path(),
            json!({"channels": {"email": email}}),
        );
        Config::from_str(&v.to_string(), false, &crate::common::test_env(dir.path()))
    };
    let ok = json!({"imap_host": "imap.example.org", "address": "bot@example.org", "password": "p", "authserv_id": "mx.example.org"});
    assert!(base(ok.clone()).is_ok());
    let cases = [
        (json!({"authserv_id": null}), "channels.email.authserv_id"),
        (json!({"imap_tls": "none"}), "channels.email.imap_tls"),
        (json!({"smtp_tls": "ssl"}), "channels.email.smtp_tls"),
        (json!({"address": "bot"}), "channels.email.address"),
        (json!({"password": null}), "channels.email.password"),
        (
            json!({"allow_from": ["@alice"]}),
            "channels.email.allow_from",
        ),
        (json!({"imap_host": null}), "channels.email.imap_host"),
        (
            json!({"sender_auth": "unchecked"}),
            "channels.email.sender_auth",
        ),
        (json!({"imap_port": 993, "imap_prot": 1}), "imap_prot"),
    ];
    for (patch, key) in cases {
        let mut v = ok.clone();
        crate::common::merge(&mut v, patch.clone());
        if let Value::Object(m) = &mut v {
            m.retain(|_, x| !x.is_null());
        }
        let err = base(v)
            .err()
            .unwrap_or_else(|| panic!("{patch} was accepted"))
            .to_string();
        assert!(err.contains(key), "{patch}: {err}");
    }
}

/// The real `weft`, killed with SIGKILL at each point of the send path (`WEFT_FAULT`) and
/// restarted on the same store: the user gets exactly one reply.
#[tokio::test]
async fn kill_9_at_every_point_of_the_send_path_sends_one_mail() {
    use crate::process::{free_port, log_of, weft, write_config, Daemon};
    use std::os::unix::process::ExitStatusExt as _;
    let Some(s) = servers() else { return };
    for point in [
        "egress.before_send",
        "egress.after_send",
        "egress.after_mark",
    ] {
        let (bot, alice) = (fresh("bot"), fresh("alice"));
        let (a, b) = (addr(&alice), addr(&bot));
        let dir = tempfile::tempdir().unwrap();
        let llm = FakeLlm::start().await;
        llm.push(Reply::Text("the one and only answer".into()));
        let port = free_port();
        let mut v = crate::common::config_value(
            &llm.base_url(),
            dir.path(),
            s.section(&bot, json!({"allow_from": [a]})),
        );
        crate::common::merge(
            &mut v,
            json!({"channels": {"http": {"bind": format!("127.0.0.1:{port}")}}}),
        );
        let cfg = write_config(dir.path(), &v);
        let log = std::fs::File::create(dir.path().join("gateway.log")).unwrap();
        let mut child = weft(dir.path())
            .env("WEFT_FAULT", point)
            .arg("--config")
            .arg(&cfg)
            .arg("gateway")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        s.deliver(
            &a,
            &b,
            &mail(
                &a,
                &b,
                &format!("k-{bot}@example.org"),
                "kill",
                "",
                "are you there?",
            ),
        )
        .await;
        let deadline = std::time::Instant::now() + T;
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("{point} never reached\n{}", log_of(dir.path()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(
            status.signal(),
            Some(9),
            "{status:?}\n{}",
            log_of(dir.path())
        );
        let want = usize::from(point != "egress.before_send");
        assert_eq!(s.mails(&alice).len(), want, "{point}");
        let d = Daemon::start(dir.path(), &cfg, port).await;
        assert!(
            wait_until(T, || s.mails(&alice).len() == 1).await,
            "{point}: no reply after the restart\n{}",
            log_of(dir.path())
        );
        // Give a duplicate every chance: a second mail is answered after it.
        llm.push(Reply::Text("second".into()));
        s.deliver(
            &a,
            &b,
            &mail(
                &a,
                &b,
                &format!("k2-{bot}@example.org"),
                "again",
                "",
                "still?",
            ),
        )
        .await;
        assert!(
            wait_until(T, || s.mails(&alice).len() >= 2).await,
            "{point}"
        );
        d.term();
        let all = s.mails(&alice);
        let texts: Vec<String> = all
            .iter()
            .map(|(_, raw)| parsed(raw).body_text(0).unwrap().to_string())
            .collect();
        assert_eq!(texts.len(), 2, "{point}: {texts:?}");
        assert_eq!(
            texts
                .iter()
                .filter(|t| t.contains("the one and only answer"))
                .count(),
            1,
            "{point}: {texts:?}"
        );
    }
}

#[tokio::test]
async fn an_oversized_mail_is_refused_with_a_notice_and_never_reaches_the_model() {
    let Some(s) = servers() else { return };
    let (bot, alice) = (fresh("bot"), fresh("alice"));
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        s.section(&bot, json!({"allow_from": [addr(&alice)]})),
    ))
    .await;
    let (a, b) = (addr(&alice), addr(&bot));
    let big = "lorem ipsum dolor sit amet\n".repeat(1600);
    s.deliver(&a, &b, &mail(&a, &b, "big1@example.org", "long", "", &big))
        .await;
    assert!(
        wait_until(T, || s.mails(&alice).len() == 1).await,
        "no notice"
    );
    let all = s.mails(&alice);
    let m = parsed(&all[0].1);
    let text = m.body_text(0).unwrap().to_string();
    assert!(text.contains("KB limit"), "{text}");
    assert_eq!(ids(m.in_reply_to()), ["big1@example.org"]);
    assert!(
        llm.requests().is_empty(),
        "the oversized mail reached the model"
    );
    let store = crate::common::bytes_under(&dir.path().join("store"));
    assert!(
        !store.contains("lorem ipsum dolor"),
        "the oversized mail was stored"
    );
    gw.stop().await;
}

#[tokio::test]
async fn two_mailboxes_in_one_gateway_each_answer_their_own_mail() {
    let Some(s) = servers() else { return };
    let (bot, work, alice) = (fresh("bot"), fresh("work"), fresh("alice"));
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let mut section = s.section(&bot, json!({"allow_from": [addr(&alice)]}));
    crate::common::merge(
        &mut section,
        json!({"channels": {"email": {"accounts": {"work": {"address": addr(&work), "password_env": "WORK_MAIL_PASSWORD"}}}}}),
    );
    let v = crate::common::config_value(&llm.base_url(), dir.path(), section);
    let mut env = vec![
        ("HOME".to_string(), dir.path().to_str().unwrap().to_string()),
        ("WORK_MAIL_PASSWORD".to_string(), PASSWORD.to_string()),
    ];
    env.push((
        "CLAWFT_HOME".into(),
        dir.path().join(".clawft").to_str().unwrap().into(),
    ));
    let cfg = clawft::config::Config::from_str(
        &v.to_string(),
        false,
        &clawft::config::Env::from_pairs(env),
    )
    .unwrap();
    let ids: Vec<String> = cfg
        .chat_channels
        .iter()
        .map(clawft::config::ChatChannelConfig::id)
        .collect();
    assert_eq!(ids, ["email", "email.work"]);
    let gw = TestGateway::start(cfg).await;
    let a = addr(&alice);
    s.deliver(
        &a,
        &addr(&work),
        &mail(
            &a,
            &addr(&work),
            "w1@example.org",
            "for work",
            "",
            "work question",
        ),
    )
    .await;
    assert!(wait_until(T, || s.mails(&alice).len() == 1).await);
    let all = s.mails(&alice);
    let m = parsed(&all[0].1);
    let from = m
        .from()
        .and_then(|f| f.first())
        .and_then(|f| f.address())
        .unwrap()
        .to_string();
    assert_eq!(from, addr(&work));
    assert!(s.mails(&bot).is_empty());
    gw.stop().await;
}

#[test]
fn email_accounts_name_their_own_keys_and_need_their_own_mailbox() {
    use clawft::config::Config;
    let dir = tempfile::tempdir().unwrap();
    let load = |email: Value| {
        let v = crate::common::config_value(
            "http://127.0.0.1:9",
            dir.path(),
            json!({"channels": {"email": email}}),
        );
        Config::from_str(&v.to_string(), false, &crate::common::test_env(dir.path()))
    };
    let top = json!({"imap_host": "imap.example.org", "address": "bot@example.org", "password": "p", "authserv_id": "mx.example.org"});
    let with = |acc: Value| {
        let mut v = top.clone();
        crate::common::merge(&mut v, json!({"accounts": {"work": acc}}));
        v
    };
    let c = load(with(
        json!({"address": "work@example.org", "password": "q"}),
    ))
    .unwrap();
    let work = &c.chat_channels[1];
    assert_eq!(work.id(), "email.work");
    let clawft::config::ChannelSettings::Email(e) = &work.settings else {
        panic!("{work:?}")
    };
    assert_eq!(
        (e.imap_host.as_str(), e.username.as_str()),
        ("imap.example.org", "work@example.org")
    );
    let err = load(with(json!({"address": "work@example.org"})))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("channels.email.accounts.work.password"),
        "{err}"
    );
    let err = load(with(json!({"address": "bot@example.org", "password": "q"})))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("channels.email.accounts.work.address"),
        "{err}"
    );
    let err = load(with(
        json!({"address": "work@example.org", "password": "q", "imap_tls": "none"}),
    ))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("channels.email.accounts.work.imap_tls"),
        "{err}"
    );
}

#[tokio::test]
async fn imap_over_implicit_tls_and_starttls_checks_the_servers_certificate() {
    let Some(s) = servers() else { return };
    let alice = fresh("alice");
    let a = addr(&alice);
    let ca = s.ca.to_str().unwrap();
    let cases = [
        ("implicit", s.imaps_port, true),
        ("starttls", s.imap_port, true),
        // Without the CA the certificate is unknown: the channel never logs in.
        ("implicit", s.imaps_port, false),
    ];
    for (n, (mode, port, trusted)) in cases.into_iter().enumerate() {
        let bot = fresh("bot");
        let dir = tempfile::tempdir().unwrap();
        let llm = FakeLlm::start().await;
        echo_model(&llm);
        let mut extra = json!({"allow_from": [a], "imap_tls": mode, "imap_port": port});
        if trusted {
            crate::common::merge(&mut extra, json!({"tls_ca_file": ca}));
        }
        let gw = TestGateway::start(config(&llm, dir.path(), s.section(&bot, extra))).await;
        let deadline = std::time::Instant::now() + T;
        let state = loop {
            let (_, st) = gw.api.get("/v1/status").await;
            let state = st["channel_states"]["email"]
                .as_str()
                .unwrap_or("")
                .to_string();
            if state.contains("connected")
                || state.contains("reconnecting")
                || std::time::Instant::now() > deadline
            {
                break state;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if !trusted {
            assert!(
                state.contains("reconnecting") && state.contains("certificate"),
                "{state}"
            );
            gw.stop().await;
            continue;
        }
        assert!(state.contains("connected"), "{mode}: {state}");
        let id = format!("tls{n}-{bot}@example.org");
        s.deliver(
            &a,
            &addr(&bot),
            &mail(&a, &addr(&bot), &id, "tls", "", "over TLS"),
        )
        .await;
        assert!(
            wait_until(T, || s.mails(&alice).iter().any(|(_, raw)| ids(parsed(
                raw
            )
            .in_reply_to())
                == [id.clone()]))
            .await,
            "{mode}: no reply"
        );
        gw.stop().await;
    }
}
