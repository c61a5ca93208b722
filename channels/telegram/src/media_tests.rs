//! Files in and out, against the fake Bot API, through the public `Channel` API.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clawft_channel_core::media::{MediaKind, MediaRef, OutboundFile};
use clawft_channel_core::{
    Ack, Channel, ChannelError, ChannelId, ChatId, InboundDelivery, InboundEvent, MemoryState,
    OutboundKind, OutboundMessage, StateStore, ThreadId,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::fake::{Failure, FakeMedia, FakeMediaKind, FakeTelegram};
use crate::{TelegramChannel, TelegramConfig, MAX_UPLOAD_BYTES};

const WAIT: Duration = Duration::from_secs(8);
const JPEG: &[u8] = b"\xFF\xD8\xFF\xE0 a tiny jpeg";
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n a tiny png \x00\x01\x02";

fn config(fake: &FakeTelegram) -> TelegramConfig {
    TelegramConfig {
        api_url: fake.api_url(),
        poll_timeout: Duration::from_secs(1),
        ..TelegramConfig::new(FakeTelegram::TOKEN)
    }
}

/// Listen until `n` deliveries arrived (each acknowledged), then stop.
async fn receive(ch: &Arc<TelegramChannel>, n: usize) -> Vec<InboundEvent> {
    let (tx, mut rx) = mpsc::channel::<InboundDelivery>(8);
    let cancel = CancellationToken::new();
    let (c2, k2) = (ch.clone(), cancel.clone());
    let task = tokio::spawn(async move { c2.listen(tx, k2).await });
    let mut out = Vec::new();
    while out.len() < n {
        let d = tokio::time::timeout(WAIT, rx.recv())
            .await
            .expect("no delivery in time")
            .expect("listener ended");
        d.ack.unwrap().send(Ack::Accepted).unwrap();
        out.push(d.event);
    }
    cancel.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    out
}

/// A file under a fresh temporary directory.
fn temp_file(name: &str, bytes: &[u8]) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "weft-tg-media-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn attachment(name: &str, kind: MediaKind, mime: &str, bytes: &[u8]) -> OutboundFile {
    OutboundFile {
        path: temp_file(name, bytes).to_string_lossy().into_owned(),
        name: name.into(),
        kind,
        mime: mime.into(),
        size: bytes.len() as u64,
    }
}

fn final_msg(chat: &str, id: &str, content: &str, files: Vec<OutboundFile>) -> OutboundMessage {
    OutboundMessage {
        id: id.into(),
        channel: ChannelId::new("telegram"),
        chat: ChatId::new(chat),
        thread: None,
        in_reply_to: None,
        body: clawft_channel_core::OutboundBody::text_of(OutboundKind::Final, content.into()),
        attachments: files,
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

#[tokio::test]
async fn photo_voice_and_document_arrive_as_attachments_even_without_text() {
    let fake = FakeTelegram::start().await;
    let ch = Arc::new(TelegramChannel::new(config(&fake)).unwrap());
    fake.push_photo(1001, 1001, JPEG, Some("what is this?"));
    fake.push_voice(1001, 1001, b"OggS voice", 7);
    fake.push_document(
        1001,
        1001,
        b"%PDF-1.4",
        "report.pdf",
        "application/pdf",
        None,
    );
    // In a group, a file must be addressed to the bot like text: the first is skipped.
    fake.push_media(FakeMedia::new(-100, 1001, FakeMediaKind::Document, &b"x"[..]).name("a.txt"));
    fake.push_media(
        FakeMedia::new(-100, 1001, FakeMediaKind::Document, PNG)
            .name("scan.png")
            .mime("image/png")
            .caption("@clawft_test_bot read this"),
    );
    let ev = receive(&ch, 4).await;
    let files = fake.files();
    let bytes_of = |m: &MediaRef| files.get(&m.id).map(|f| f.bytes.clone());

    assert_eq!(ev[0].content, "what is this?");
    assert_eq!(ev[0].attachments.len(), 1);
    let photo = &ev[0].attachments[0];
    assert_eq!(photo.kind, MediaKind::Image);
    assert_eq!(photo.mime.as_deref(), Some("image/jpeg"));
    assert_eq!(photo.size, Some(JPEG.len() as u64));
    // The full size (1280 px), not the thumbnail.
    assert_eq!(bytes_of(photo).as_deref(), Some(JPEG));

    assert_eq!(ev[1].content, "");
    let voice = &ev[1].attachments[0];
    assert_eq!(voice.kind, MediaKind::Voice);
    assert_eq!(voice.duration_secs, Some(7));
    assert_eq!(voice.mime.as_deref(), Some("audio/ogg"));
    assert_eq!(bytes_of(voice).as_deref(), Some(&b"OggS voice"[..]));

    assert_eq!(ev[2].content, "");
    let doc = &ev[2].attachments[0];
    assert_eq!(doc.kind, MediaKind::Document);
    assert_eq!(doc.name.as_deref(), Some("report.pdf"));
    assert_eq!(doc.mime.as_deref(), Some("application/pdf"));
    assert_eq!(doc.url, None);

    assert_eq!(ev[3].chat.as_str(), "-100");
    assert_eq!(ev[3].content, "read this");
    // An image sent as a file stays a document.
    assert_eq!(ev[3].attachments[0].kind, MediaKind::Document);
    assert_eq!(ev[3].attachments[0].name.as_deref(), Some("scan.png"));
    // Nothing journaled holds the token.
    let journaled = serde_json::to_string(&ev).unwrap();
    assert!(!journaled.contains("TEST-fake_token"));
}

#[tokio::test]
async fn media_request_gives_a_url_serving_exactly_the_bytes() {
    let fake = FakeTelegram::start().await;
    let ch = Arc::new(TelegramChannel::new(config(&fake)).unwrap());
    let bin: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    fake.push_document(5, 5, &bin, "data.bin", "application/octet-stream", None);
    fake.push_document(
        5,
        5,
        &vec![0u8; 20 * 1024 * 1024 + 1],
        "huge.bin",
        "application/octet-stream",
        None,
    );
    let ev = receive(&ch, 2).await;
    let media = &ev[0].attachments[0];

    let req = ch.media_request(media).await.unwrap();
    assert!(req.trusted, "the fake is the configured API origin");
    assert!(req.url.starts_with(&format!("{}/file/bot", fake.api_url())));
    let mut get = http().get(&req.url);
    for (k, v) in &req.headers {
        get = get.header(k, v);
    }
    let resp = get.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.unwrap().as_ref(), &bin[..]);
    assert_eq!(fake.downloads().len(), 1);
    // The file server wants the token: without it, 404 like Telegram.
    let wrong = req.url.replace(FakeTelegram::TOKEN, "123456:WRONG");
    assert_eq!(http().get(&wrong).send().await.unwrap().status(), 404);

    // A URL on any other origin (another port of the same host included) is not trusted and
    // gets no credentials.
    for url in [
        "https://files.example.net/x.pdf".to_string(),
        format!("http://127.0.0.1:1/file/{}", media.id),
    ] {
        let foreign = MediaRef {
            url: Some(url.clone()),
            ..media.clone()
        };
        let r = ch.media_request(&foreign).await.unwrap();
        assert!(!r.trusted, "{url}");
        assert!(r.headers.is_empty());
        assert!(!r.url.contains("TEST-fake_token"), "{url}");
    }

    // Over the Bot API's 20 MB download limit, and an unknown id: refused, named.
    let err = ch.media_request(&ev[1].attachments[0]).await.unwrap_err();
    assert!(
        matches!(&err, ChannelError::Rejected(m) if m.contains("file is too big")),
        "{err:?}"
    );
    let unknown = MediaRef::new(MediaKind::Document, "nope");
    let err = ch.media_request(&unknown).await.unwrap_err();
    assert!(
        matches!(&err, ChannelError::Rejected(m) if m.contains("invalid file_id")),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_final_with_text_and_two_files_shows_each_once() {
    let fake = FakeTelegram::start().await;
    let ch = TelegramChannel::new(config(&fake)).unwrap();
    let pdf = b"%PDF-1.4 \x00\xFF\r\n--boundary-looking bytes".to_vec();
    let files = vec![
        attachment("report.pdf", MediaKind::Document, "application/pdf", &pdf),
        attachment("chart.png", MediaKind::Image, "image/png", PNG),
    ];
    let mut msg = final_msg("-100", "out-1", "Here **you** go", files);
    msg.thread = Some(ThreadId::new("77"));
    ch.send(&msg).await.unwrap();

    let sent = fake.sent();
    let methods: Vec<&str> = sent.iter().map(|m| m.method.as_str()).collect();
    assert_eq!(methods, ["sendMessage", "sendDocument", "sendPhoto"]);
    assert_eq!(sent[0].visible, "Here you go");
    let up = fake.uploads();
    assert_eq!(up.len(), 2);
    assert_eq!(up[0].file_name.as_deref(), Some("report.pdf"));
    assert_eq!(up[0].content_type.as_deref(), Some("application/pdf"));
    assert_eq!(up[0].bytes, pdf);
    assert_eq!(up[1].field, "photo");
    assert_eq!(up[1].file_name.as_deref(), Some("chart.png"));
    assert_eq!(up[1].bytes, PNG);
    assert!(up.iter().all(|u| u.chat == -100 && u.thread == Some(77)));
}

#[tokio::test]
async fn a_failed_upload_is_retried_alone_and_never_twice() {
    let fake = FakeTelegram::start().await;
    let state = Arc::new(MemoryState::default());
    let ch = TelegramChannel::new(TelegramConfig {
        state: state.clone(),
        ..config(&fake)
    })
    .unwrap();
    let files = vec![
        attachment("a.txt", MediaKind::Document, "text/plain", b"first file"),
        attachment("b.txt", MediaKind::Document, "text/plain", b"second file"),
    ];
    let msg = final_msg("42", "out-2", "two files", files);

    fake.fail_later(
        "sendDocument",
        1,
        Failure::Status(500, "Internal Server Error".into()),
    );
    let err = ch.send(&msg).await.unwrap_err();
    assert!(matches!(err, ChannelError::Transient(_)), "{err:?}");
    assert_eq!(fake.uploads().len(), 1);
    fake.fail_next("sendDocument", Failure::RateLimit(3));
    let err = ch.send(&msg).await.unwrap_err();
    assert_eq!(err.retry_after(), Some(Duration::from_secs(3)), "{err:?}");
    ch.send(&msg).await.unwrap();
    // Once more, as after a lost acknowledgement: nothing new.
    ch.send(&msg).await.unwrap();

    let up = fake.uploads();
    let names: Vec<_> = up.iter().map(|u| u.file_name.clone().unwrap()).collect();
    assert_eq!(names, ["a.txt", "b.txt"]);
    assert_eq!(up[1].bytes, b"second file");
    let texts = fake
        .sent()
        .iter()
        .filter(|m| m.method == "sendMessage")
        .count();
    assert_eq!(texts, 1);
    // Settled: the journal forgets it.
    assert_eq!(state.get("files:out-2").as_deref(), Some("2"));
    ch.settled(&msg);
    assert_eq!(state.get("files:out-2"), None);
}

#[tokio::test]
async fn an_upload_cut_off_mid_way_is_sent_again_by_the_retry() {
    let fake = FakeTelegram::start().await;
    let ch = Arc::new(TelegramChannel::new(config(&fake)).unwrap());
    let msg = final_msg(
        "42",
        "out-3",
        "",
        vec![attachment(
            "a.txt",
            MediaKind::Document,
            "text/plain",
            b"aaa",
        )],
    );
    fake.hold_uploads(true);
    let (c2, m2) = (ch.clone(), msg.clone());
    let task = tokio::spawn(async move { c2.send(&m2).await });
    fake.wait_calls("sendDocument", 1, WAIT).await;
    assert!(fake.uploads().is_empty(), "a held upload is not recorded");
    fake.hold_uploads(false);
    let r = tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    assert!(matches!(r, Err(ChannelError::Transient(_))), "{r:?}");
    ch.send(&msg).await.unwrap();
    assert_eq!(fake.uploads().len(), 1);
}

#[tokio::test]
async fn a_file_over_the_limit_becomes_a_note() {
    let fake = FakeTelegram::start().await;
    let default = TelegramChannel::new(config(&fake)).unwrap();
    assert_eq!(default.capabilities().max_upload_bytes, MAX_UPLOAD_BYTES);
    let ch = TelegramChannel::new(TelegramConfig {
        max_upload_bytes: 4096,
        ..config(&fake)
    })
    .unwrap();
    assert_eq!(ch.capabilities().max_upload_bytes, 4096);
    // Over the adapter's limit: never uploaded. Under it but over the server's (a 413):
    // the same note. The small one still goes.
    fake.set_upload_limit(3000);
    let files = vec![
        attachment(
            "big.bin",
            MediaKind::Document,
            "application/octet-stream",
            &[7u8; 5000],
        ),
        attachment(
            "mid.bin",
            MediaKind::Document,
            "application/octet-stream",
            &[8u8; 3500],
        ),
        attachment("small.txt", MediaKind::Document, "text/plain", b"ok"),
    ];
    ch.send(&final_msg("42", "out-4", "", files)).await.unwrap();
    let up = fake.uploads();
    assert_eq!(up.len(), 1);
    assert_eq!(up[0].file_name.as_deref(), Some("small.txt"));
    let notes: Vec<String> = fake
        .sent()
        .into_iter()
        .filter(|m| m.method == "sendMessage")
        .map(|m| m.visible)
        .collect();
    assert_eq!(
        notes,
        [
            "big.bin (4 KB) is over Telegram's 4 KB limit for bots, so it was not sent.",
            "mid.bin (3 KB) is over Telegram's 4 KB limit for bots, so it was not sent.",
        ]
    );
    // No upload request left for the first file.
    assert_eq!(fake.calls("sendDocument").len(), 2);
}

#[tokio::test]
async fn an_attachment_only_final_posts_no_text_and_picks_methods_by_type() {
    let fake = FakeTelegram::start().await;
    let ch = TelegramChannel::new(config(&fake)).unwrap();
    let files = vec![
        attachment("v.ogg", MediaKind::Voice, "audio/ogg", b"OggS..."),
        attachment("v.wav", MediaKind::Voice, "audio/wav", b"RIFF....WAVE"),
        attachment("song.mp3", MediaKind::Audio, "audio/mpeg", b"ID3..."),
        attachment("clip.mp4", MediaKind::Video, "video/mp4", b"....ftypmp42"),
        attachment("pic.gif", MediaKind::Image, "image/gif", b"GIF89a"),
    ];
    let sent = ch.send(&final_msg("42", "out-5", "", files)).await.unwrap();
    let msgs = fake.sent();
    assert!(msgs.iter().all(|m| m.method != "sendMessage"), "{msgs:?}");
    let methods: Vec<String> = fake.uploads().into_iter().map(|u| u.method).collect();
    assert_eq!(
        methods,
        [
            "sendVoice",
            "sendDocument",
            "sendAudio",
            "sendVideo",
            "sendDocument"
        ]
    );
    // The reply's reference is the first file's message.
    assert_eq!(sent.0, msgs[0].message_id.to_string());
}

#[tokio::test]
async fn in_groups_a_file_only_reply_quotes_the_users_message() {
    let fake = FakeTelegram::start().await;
    let ch = Arc::new(TelegramChannel::new(config(&fake)).unwrap());
    fake.push_user_message(-100, 9, "@clawft_test_bot draw it");
    let ev = receive(&ch, 1).await;
    // The fake numbers messages from 1: the user's is the first.
    let asked = 1;
    let mut msg = final_msg(
        "-100",
        "out-6",
        "",
        vec![
            attachment("a.png", MediaKind::Image, "image/png", PNG),
            attachment("b.png", MediaKind::Image, "image/png", PNG),
        ],
    );
    msg.in_reply_to = Some(ev[0].event_id.clone());
    ch.send(&msg).await.unwrap();
    let up = fake.uploads();
    assert_eq!(up.len(), 2);
    assert_eq!(up[0].reply_to, Some(asked));
    assert_eq!(up[1].reply_to, None);
}

#[tokio::test]
async fn a_refused_photo_goes_as_a_file_and_a_refused_file_becomes_a_note() {
    let fake = FakeTelegram::start().await;
    let ch = TelegramChannel::new(config(&fake)).unwrap();
    // Claimed PNG, but not an image Telegram can process.
    let broken = b"\x89PNG but broken";
    fake.fail_next(
        "sendDocument",
        Failure::BadRequest("Bad Request: wrong file type".into()),
    );
    let files = vec![
        attachment(
            "bad.exe",
            MediaKind::Document,
            "application/x-msdownload",
            b"MZ",
        ),
        attachment("odd.png", MediaKind::Image, "image/png", broken),
        attachment("fine.txt", MediaKind::Document, "text/plain", b"fine"),
    ];
    ch.send(&final_msg("42", "out-7", "", files)).await.unwrap();
    let up = fake.uploads();
    let got: Vec<(String, String)> = up
        .iter()
        .map(|u| (u.method.clone(), u.file_name.clone().unwrap()))
        .collect();
    assert_eq!(
        got,
        [
            ("sendDocument".to_string(), "odd.png".to_string()),
            ("sendDocument".to_string(), "fine.txt".to_string()),
        ]
    );
    assert_eq!(up[0].bytes, broken);
    let notes: Vec<String> = fake
        .sent()
        .into_iter()
        .filter(|m| m.method == "sendMessage")
        .map(|m| m.visible)
        .collect();
    assert_eq!(
        notes,
        ["bad.exe could not be sent: Telegram refused it (Bad Request: wrong file type)."]
    );
    assert_eq!(fake.calls("sendPhoto").len(), 1);
}

#[tokio::test]
async fn a_revoked_token_during_an_upload_is_an_auth_error() {
    let fake = FakeTelegram::start().await;
    let ch = TelegramChannel::new(config(&fake)).unwrap();
    fake.fail_next("sendDocument", Failure::Unauthorized);
    let files = vec![attachment("a.txt", MediaKind::Document, "text/plain", b"a")];
    let err = ch
        .send(&final_msg("42", "out-8", "", files))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ChannelError::Auth(m) if m.contains("channels.telegram.token")),
        "{err:?}"
    );
    assert!(fake.uploads().is_empty());
    assert!(fake.sent().is_empty(), "no note for a refused token");
}
