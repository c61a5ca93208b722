//! Files in and out of Discord chats, against the fake, through the `Channel` API.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clawft_channel_core::media::{MediaKind, MediaRef, Multipart, OutboundFile};
use clawft_channel_core::{
    Ack, Channel, ChannelError, ChannelId, ChatId, GroupMode, InboundDelivery, InboundEvent,
    MemoryState, OutboundKind, OutboundMessage, PlatformEventId, StateStore,
};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::fake::{
    FakeAttachment, FakeDiscord, FakeFailure, FakeMessage, SentOp, BOT_ID, FAKE_TOKEN,
};
use crate::{DiscordChannel, DiscordConfig, MAX_UPLOAD_BYTES};

const WAIT: Duration = Duration::from_secs(5);

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "weft-discord-media-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    /// A file holding `bytes`, described as an attachment.
    fn file(&self, name: &str, mime: &str, bytes: &[u8]) -> OutboundFile {
        let path = self.0.join(name);
        std::fs::write(&path, bytes).unwrap();
        OutboundFile {
            path: path.to_string_lossy().into_owned(),
            name: name.into(),
            kind: MediaKind::of_mime(mime),
            mime: mime.into(),
            size: bytes.len() as u64,
        }
    }

    /// A sparse file of `size` bytes (nothing written).
    fn sparse(&self, name: &str, size: u64) -> OutboundFile {
        let path = self.0.join(name);
        std::fs::File::create(&path).unwrap().set_len(size).unwrap();
        OutboundFile {
            path: path.to_string_lossy().into_owned(),
            name: name.into(),
            kind: MediaKind::Document,
            mime: "application/pdf".into(),
            size,
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn out(id: &str, content: &str, files: Vec<OutboundFile>) -> OutboundMessage {
    OutboundMessage {
        id: id.into(),
        channel: ChannelId::new("discord"),
        chat: ChatId::new("111"),
        thread: None,
        in_reply_to: Some(PlatformEventId::new("1100000000000000042")),
        body: clawft_channel_core::OutboundBody::text_of(OutboundKind::Final, content.into()),
        attachments: files,
    }
}

fn sender(fake: &FakeDiscord, state: Arc<MemoryState>) -> DiscordChannel {
    DiscordChannel::new(fake.config(state)).unwrap()
}

/// Text posts (JSON message creations, not uploads).
fn text_posts(fake: &FakeDiscord) -> Vec<String> {
    let upload_ids: Vec<String> = fake.uploads().into_iter().map(|u| u.message_id).collect();
    fake.sent()
        .into_iter()
        .filter(|s| s.op == SentOp::Post && !upload_ids.contains(&s.message_id))
        .map(|s| s.text)
        .collect()
}

/// Multipart requests the fake received (answered or not).
fn upload_requests(fake: &FakeDiscord) -> usize {
    fake.requests()
        .iter()
        .filter(|r| r.method == "POST" && r.body.get("attachments").is_some())
        .count()
}

async fn listen(
    cfg: DiscordConfig,
) -> (
    Arc<DiscordChannel>,
    mpsc::Receiver<InboundDelivery>,
    CancellationToken,
) {
    let ch = Arc::new(DiscordChannel::new(cfg).unwrap());
    let (tx, rx) = mpsc::channel(16);
    let cancel = CancellationToken::new();
    let (c, k) = (ch.clone(), cancel.clone());
    tokio::spawn(async move { c.listen(tx, k).await });
    (ch, rx, cancel)
}

async fn next(rx: &mut mpsc::Receiver<InboundDelivery>) -> InboundEvent {
    let mut d = tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("no delivery within 5 s")
        .expect("listen ended");
    d.ack.take().unwrap().send(Ack::Accepted).unwrap();
    d.event
}

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR fake png bytes";
const PDF: &[u8] = b"%PDF-1.7\n fake pdf \r\n--boundary-looking line\n";

// ---------------------------------------------------------------------------------------------
// Inbound

#[tokio::test]
async fn photo_document_and_voice_message_arrive_as_attachments() {
    let fake = FakeDiscord::start().await;
    let (_ch, mut rx, cancel) = listen(fake.config(Arc::new(MemoryState::default()))).await;

    let id = fake.push_user_files(
        "111",
        "42",
        "what is in these?",
        vec![
            FakeAttachment::new("cat.png", "image/png", PNG),
            FakeAttachment::new("report.pdf", "application/pdf", PDF),
        ],
    );
    let ev = next(&mut rx).await;
    assert_eq!(ev.event_id.as_str(), id);
    assert_eq!(ev.content, "what is in these?");
    assert_eq!(ev.attachments.len(), 2);
    let (img, doc) = (&ev.attachments[0], &ev.attachments[1]);
    assert_eq!(img.kind, MediaKind::Image);
    assert_eq!(img.name.as_deref(), Some("cat.png"));
    assert_eq!(img.mime.as_deref(), Some("image/png"));
    assert_eq!(img.size, Some(PNG.len() as u64));
    assert!(img.url.as_deref().unwrap().starts_with(&format!(
        "{}/attachments/111/{}/cat.png?",
        fake.base_url(),
        img.id
    )));
    assert_eq!(doc.kind, MediaKind::Document);
    assert_eq!(doc.name.as_deref(), Some("report.pdf"));
    assert_ne!(img.id, doc.id);
    // Journaled with the event: no credential in it.
    assert!(!serde_json::to_string(&ev).unwrap().contains(FAKE_TOKEN));

    // A voice message: no text, flag IS_VOICE_MESSAGE → delivered, kind Voice.
    fake.push_voice_message("111", "42", b"OggS fake opus".to_vec(), 2.6);
    let ev = next(&mut rx).await;
    assert_eq!(ev.content, "");
    assert_eq!(ev.attachments.len(), 1);
    assert_eq!(ev.attachments[0].kind, MediaKind::Voice);
    assert_eq!(ev.attachments[0].duration_secs, Some(3));
    assert_eq!(ev.attachments[0].mime.as_deref(), Some("audio/ogg"));

    // An attachment-only file (no content type declared): delivered as a document.
    fake.push_user_files(
        "111",
        "42",
        "",
        vec![FakeAttachment {
            filename: "notes".into(),
            bytes: b"plain".to_vec(),
            ..FakeAttachment::default()
        }],
    );
    let ev = next(&mut rx).await;
    assert_eq!(ev.content, "");
    assert_eq!(ev.attachments[0].kind, MediaKind::Document);
    assert_eq!(ev.attachments[0].mime, None);
    cancel.cancel();
}

#[tokio::test]
async fn guild_files_follow_the_mention_rule() {
    let fake = FakeDiscord::start().await;
    let (_ch, mut rx, cancel) = listen(fake.config(Arc::new(MemoryState::default()))).await;
    let guild = |text: &str| FakeMessage {
        chat: "222".into(),
        user: "42".into(),
        text: text.into(),
        guild: Some("333".into()),
        attachments: vec![FakeAttachment::new("cat.png", "image/png", PNG)],
        ..FakeMessage::default()
    };
    fake.push_message(guild(""));
    fake.push_message(guild("a cat"));
    fake.push_message(guild(&format!("<@{BOT_ID}> look")));
    let ev = next(&mut rx).await;
    assert_eq!(ev.content, "look");
    assert_eq!(ev.attachments.len(), 1);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), rx.recv())
            .await
            .is_err(),
        "unmentioned guild files must not be delivered"
    );
    cancel.cancel();

    // In `all` mode an uncaptioned guild file is delivered.
    let fake = FakeDiscord::start().await;
    let mut cfg = fake.config(Arc::new(MemoryState::default()));
    cfg.group_mode = GroupMode::All;
    let (_ch, mut rx, cancel) = listen(cfg).await;
    fake.push_message(guild(""));
    let ev = next(&mut rx).await;
    assert_eq!((ev.content.as_str(), ev.attachments.len()), ("", 1));
    cancel.cancel();
}

#[tokio::test]
async fn media_request_fetches_the_exact_bytes_and_trusts_only_the_api_origin() {
    let fake = FakeDiscord::start().await;
    let (ch, mut rx, cancel) = listen(fake.config(Arc::new(MemoryState::default()))).await;
    fake.push_user_files(
        "111",
        "42",
        "",
        vec![FakeAttachment::new("report.pdf", "application/pdf", PDF)],
    );
    let ev = next(&mut rx).await;
    let req = ch.media_request(&ev.attachments[0]).await.unwrap();
    assert!(
        req.trusted,
        "the fake's CDN is on the configured API origin"
    );
    assert!(req.headers.is_empty(), "Discord CDN URLs are signed");
    assert!(!req.url.contains(FAKE_TOKEN));
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut get = http.get(&req.url);
    for (k, v) in &req.headers {
        get = get.header(k, v);
    }
    let resp = get.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.unwrap().as_ref(), PDF);
    let cdn = fake.cdn_requests();
    assert_eq!(cdn.len(), 1);
    assert_eq!(cdn[0].auth, None);

    // The fake's CDN is strict like Discord's: a URL whose signature is tampered with is 404.
    let tampered = req.url.replace("hm=", "hm=0");
    assert_eq!(http.get(&tampered).send().await.unwrap().status(), 404);

    // A crafted attachment naming another origin: passed on untrusted, with no credential.
    for url in [
        "http://169.254.169.254/latest/meta-data/",
        "https://cdn.discordapp.com/attachments/1/2/x.png?ex=1&hm=2",
        &format!("http://127.0.0.1:{}/x", port(&fake) ^ 1),
        &fake.base_url().replace("http://", "https://"),
    ] {
        fake.push_crafted_attachment("111", "42", "", url);
        let ev = next(&mut rx).await;
        assert_eq!(ev.attachments[0].url.as_deref(), Some(url));
        let req = ch.media_request(&ev.attachments[0]).await.unwrap();
        assert!(!req.trusted, "{url} must go through the SSRF guard");
        assert!(req.headers.is_empty());
        assert_eq!(req.url, url);
    }
    // Not an http(s) URL, or none at all: refused with the attachment named.
    fake.push_crafted_attachment("111", "42", "", "file:///etc/passwd");
    let ev = next(&mut rx).await;
    let e = ch.media_request(&ev.attachments[0]).await.unwrap_err();
    assert!(matches!(e, ChannelError::Rejected(_)), "{e:?}");
    assert!(e.to_string().contains(&ev.attachments[0].id), "{e}");
    let e = ch
        .media_request(&MediaRef::new(MediaKind::Image, "5"))
        .await
        .unwrap_err();
    assert!(matches!(e, ChannelError::Rejected(_)), "{e:?}");
    cancel.cancel();
}

fn port(fake: &FakeDiscord) -> u16 {
    fake.base_url().rsplit(':').next().unwrap().parse().unwrap()
}

// ---------------------------------------------------------------------------------------------
// Outbound

#[tokio::test]
async fn a_final_with_text_and_two_files_shows_the_text_once_and_each_file_once() {
    let fake = FakeDiscord::start().await;
    let ch = sender(&fake, Arc::new(MemoryState::default()));
    assert_eq!(ch.capabilities().max_upload_bytes, 10 * 1024 * 1024);
    let dir = Scratch::new();
    let files = vec![
        dir.file("cat.png", "image/png", PNG),
        dir.file("report.pdf", "application/pdf", PDF),
    ];
    let sent = ch.send(&out("o1", "Here **you** go", files)).await.unwrap();
    assert_eq!(text_posts(&fake), ["Here **you** go"]);
    let ups = fake.uploads();
    assert_eq!(ups.len(), 2);
    assert_eq!(
        ups.iter()
            .map(|u| (u.file_name.as_str(), u.bytes.as_slice()))
            .collect::<Vec<_>>(),
        [("cat.png", PNG), ("report.pdf", PDF)]
    );
    assert_eq!(ups[0].content_type.as_deref(), Some("image/png"));
    assert_eq!(ups[1].content_type.as_deref(), Some("application/pdf"));
    assert!(ups.iter().all(|u| u.chat == "111" && u.text.is_empty()));
    assert!(ups.iter().all(|u| u.field == "files[0]"));
    // One message per file, each with its own enforced nonce.
    assert_ne!(ups[0].message_id, ups[1].message_id);
    assert_ne!(ups[0].nonce, ups[1].nonce);
    assert!(ups
        .iter()
        .all(|u| u.payload["enforce_nonce"] == true && u.nonce.as_ref().unwrap().len() <= 25));
    // The text's message is the reference.
    let text_id = fake
        .sent()
        .into_iter()
        .find(|s| s.text == "Here **you** go")
        .unwrap()
        .message_id;
    assert_eq!(sent.0, text_id);
    // A late retry of the delivered message sends nothing more.
    ch.send(&out("o1", "Here **you** go", ch_files(&dir)))
        .await
        .unwrap();
    assert_eq!(fake.uploads().len(), 2);
    assert_eq!(text_posts(&fake).len(), 1);
}

fn ch_files(dir: &Scratch) -> Vec<OutboundFile> {
    vec![
        dir.file("cat.png", "image/png", PNG),
        dir.file("report.pdf", "application/pdf", PDF),
    ]
}

#[tokio::test]
async fn a_second_upload_failing_once_is_retried_alone() {
    for failure in [
        FakeFailure::ServerError(500),
        FakeFailure::RateLimited {
            retry_after: 0.05,
            global: false,
        },
    ] {
        let fake = FakeDiscord::start().await;
        let state = Arc::new(MemoryState::default());
        let ch = sender(&fake, state.clone());
        let dir = Scratch::new();
        let m = out("o2", "two files", ch_files(&dir));
        // Text and the first file pass; the second file's upload fails.
        fake.pass_next(2);
        fake.fail_next(failure.clone());
        let e = ch.send(&m).await.unwrap_err();
        assert!(e.is_retryable(), "{failure:?}: {e:?}");
        assert_eq!(fake.uploads().len(), 1);
        assert_eq!(upload_requests(&fake), 2);
        ch.send(&m).await.unwrap();
        let names: Vec<String> = fake.uploads().into_iter().map(|u| u.file_name).collect();
        assert_eq!(names, ["cat.png", "report.pdf"], "{failure:?}");
        assert_eq!(text_posts(&fake), ["two files"]);
        // Only the second file was requested again.
        assert_eq!(upload_requests(&fake), 3);
        assert_eq!(fake.uploads()[1].bytes, PDF);
        // Settled: the journal forgets it.
        assert_eq!(state.get("files:o2").as_deref(), Some("2"));
        ch.settled(&m);
        assert_eq!(state.get("files:o2"), None);
    }
}

#[tokio::test]
async fn a_resend_after_a_crash_mid_upload_shows_each_file_once() {
    let fake = FakeDiscord::start().await;
    let state = Arc::new(MemoryState::default());
    let dir = Scratch::new();
    let m = out("o3", "", ch_files(&dir));

    // The process dies while the first upload is on the wire (Discord never got it).
    fake.hold_uploads(true);
    let ch = Arc::new(sender(&fake, state.clone()));
    let (c, mm) = (ch.clone(), m.clone());
    let task = tokio::spawn(async move { c.send(&mm).await });
    wait_for(|| upload_requests(&fake) == 1).await;
    task.abort();
    assert!(fake.uploads().is_empty());
    fake.hold_uploads(false);

    // It dies again after Discord applied the first upload but before the answer came.
    fake.hold_answers(true);
    let ch = Arc::new(sender(&fake, state.clone()));
    let (c, mm) = (ch.clone(), m.clone());
    let task = tokio::spawn(async move { c.send(&mm).await });
    wait_for(|| fake.uploads().len() == 1).await;
    task.abort();
    fake.hold_answers(false);

    // The restarted process resends: the nonce dedupes the first file, the second goes once.
    let ch = sender(&fake, state);
    ch.send(&m).await.unwrap();
    let names: Vec<String> = fake.uploads().into_iter().map(|u| u.file_name).collect();
    assert_eq!(names, ["cat.png", "report.pdf"]);
    assert!(text_posts(&fake).is_empty());
}

async fn wait_for(mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_file_over_the_upload_limit_becomes_a_note() {
    let fake = FakeDiscord::start().await;
    let ch = sender(&fake, Arc::new(MemoryState::default()));
    let dir = Scratch::new();
    let big = dir.sparse("huge_report.pdf", 60 * 1024 * 1024);
    let edge = dir.sparse("edge.pdf", MAX_UPLOAD_BYTES + 1);
    let small = dir.file("cat.png", "image/png", PNG);
    ch.send(&out("o4", "", vec![big, small, edge]))
        .await
        .unwrap();
    assert_eq!(
        text_posts(&fake),
        [
            "huge\\_report.pdf (60 MB) is over Discord's 10 MB limit for bots, so it was not sent.",
            "edge.pdf (10.1 MB) is over Discord's 10 MB limit for bots, so it was not sent.",
        ]
    );
    let ups = fake.uploads();
    assert_eq!(ups.len(), 1);
    assert_eq!(ups[0].file_name, "cat.png");
    assert_eq!(upload_requests(&fake), 1, "no upload of the big files");
}

#[tokio::test]
async fn a_file_discord_refuses_as_too_large_becomes_a_note_and_the_next_goes_on() {
    let fake = FakeDiscord::start().await;
    let state = Arc::new(MemoryState::default());
    let ch = sender(&fake, state.clone());
    fake.set_max_upload_bytes(1024);
    let dir = Scratch::new();
    let files = vec![
        dir.file("big.bin", "application/octet-stream", &[7u8; 3000]),
        dir.file("cat.png", "image/png", PNG),
    ];
    ch.send(&out("o8", "", files)).await.unwrap();
    assert_eq!(
        text_posts(&fake),
        ["big.bin (0.1 MB) is over Discord's upload limit for this chat, so it was not sent."]
    );
    let ups = fake.uploads();
    assert_eq!(ups.len(), 1);
    assert_eq!(ups[0].file_name, "cat.png");
    assert_eq!(state.get("files:o8").as_deref(), Some("2"));
}

#[tokio::test]
async fn an_attachment_only_final_posts_no_text() {
    let fake = FakeDiscord::start().await;
    let ch = sender(&fake, Arc::new(MemoryState::default()));
    let dir = Scratch::new();
    let sent = ch
        .send(&out("o5", "", vec![dir.file("cat.png", "image/png", PNG)]))
        .await
        .unwrap();
    assert!(text_posts(&fake).is_empty());
    let posts: Vec<_> = fake
        .sent()
        .into_iter()
        .filter(|s| s.op == SentOp::Post)
        .collect();
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0].text, "");
    assert_eq!(fake.uploads().len(), 1);
    assert_eq!(sent.0, fake.uploads()[0].message_id);
    // A thread is where it goes when given (threads are channels on Discord).
    let mut m = out("o6", "", vec![dir.file("cat.png", "image/png", PNG)]);
    m.thread = Some(clawft_channel_core::ThreadId::new("777"));
    ch.send(&m).await.unwrap();
    assert_eq!(fake.uploads()[1].chat, "777");
    // A file that disappeared is refused, not retried forever.
    let mut gone = dir.file("gone.txt", "text/plain", b"x");
    gone.path = dir.0.join("missing.txt").to_string_lossy().into_owned();
    let e = ch.send(&out("o7", "", vec![gone])).await.unwrap_err();
    assert!(matches!(e, ChannelError::Rejected(_)), "{e:?}");
    assert!(e.to_string().contains("gone.txt"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// The fake is as strict as Discord

async fn raw_upload(fake: &FakeDiscord, ct: String, body: Vec<u8>) -> (u16, Value) {
    let r = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("{}/api/v10/channels/111/messages", fake.base_url()))
        .header("authorization", format!("Bot {FAKE_TOKEN}"))
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .unwrap();
    (
        r.status().as_u16(),
        r.json::<Value>().await.unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn the_fake_refuses_empty_oversized_and_inconsistent_uploads() {
    let fake = FakeDiscord::start().await;
    // Neither content nor files.
    let (ct, body) = Multipart::new()
        .text("payload_json", r#"{"attachments": []}"#)
        .finish();
    let (s, v) = raw_upload(&fake, ct, body).await;
    assert_eq!((s, v["code"].as_u64()), (400, Some(50006)));
    let (ct, body) = Multipart::new().text("other", "x").finish();
    assert_eq!(raw_upload(&fake, ct, body).await.0, 400);
    // A file over 10 MiB.
    let big = vec![0u8; 10 * 1024 * 1024 + 1];
    let (ct, body) = Multipart::new()
        .text(
            "payload_json",
            r#"{"attachments": [{"id": 0, "filename": "b.bin"}]}"#,
        )
        .file("files[0]", "b.bin", "application/octet-stream", &big)
        .finish();
    let (s, v) = raw_upload(&fake, ct, body).await;
    assert_eq!((s, v["code"].as_u64()), (413, Some(40005)));
    // `attachments` naming a file part that is not there; a body that is not multipart.
    let (ct, body) = Multipart::new()
        .text(
            "payload_json",
            r#"{"attachments": [{"id": 1, "filename": "b.bin"}]}"#,
        )
        .file("files[0]", "b.bin", "application/octet-stream", b"x")
        .finish();
    let (s, v) = raw_upload(&fake, ct, body).await;
    assert_eq!((s, v["code"].as_u64()), (400, Some(50035)));
    let (s, _) = raw_upload(
        &fake,
        "multipart/form-data; boundary=zzz".into(),
        b"junk".to_vec(),
    )
    .await;
    assert_eq!(s, 400);
    // Invalid payload_json.
    let (ct, body) = Multipart::new()
        .text("payload_json", "{nope")
        .file("files[0]", "b.bin", "application/octet-stream", b"x")
        .finish();
    let (s, v) = raw_upload(&fake, ct, body).await;
    assert_eq!((s, v["code"].as_u64()), (400, Some(50109)));
    assert!(fake.uploads().is_empty());
    assert!(fake.sent().is_empty());
    // A well-formed upload is shown, and its file served back from the CDN.
    let (ct, body) = Multipart::new()
        .text(
            "payload_json",
            r#"{"content": "hi", "attachments": [{"id": 0, "filename": "a.txt"}]}"#,
        )
        .file("files[0]", "a.txt", "text/plain", b"abc")
        .finish();
    let (s, v) = raw_upload(&fake, ct, body).await;
    assert_eq!(s, 200);
    assert_eq!(fake.uploads().len(), 1);
    assert_eq!(fake.uploads()[0].text, "hi");
    let url = v["attachments"][0]["url"].as_str().unwrap();
    let got = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(url)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(got.as_ref(), b"abc");
}
