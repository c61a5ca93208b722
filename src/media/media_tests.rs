#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `Media::prepare` against a local "platform" (an axum server standing for the platform's
//! file host), a channel whose `media_request` says which origin is the configured one, a
//! listener that counts connections (the SSRF guard's target), and a local transcription
//! endpoint.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use axum::routing::{get, post};
use clawft_channel_core::media::{parse_multipart, MediaKind, MediaRef, MediaRequest};
use clawft_channel_core::{
    ChannelError, ChannelId, ChatId, InboundDelivery, InboundEvent, OutboundMessage,
    PlatformEventId, SentRef, UserId,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::*;

const JPEG: &[u8] = b"\xFF\xD8\xFF\xE0\x00\x10JFIF\x00 a tiny jpeg";
const OGG: &[u8] = b"OggS\x00\x02 opus voice";

/// What the transcription endpoint received: (model, file bytes).
type Calls = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// The platform's file host, and what the transcription endpoint received.
struct Host {
    base: String,
    transcribed: Calls,
}

async fn host() -> Host {
    let transcribed: Calls = Arc::default();
    let t = transcribed.clone();
    let app = axum::Router::new()
        .route("/files/photo", get(|| async { JPEG.to_vec() }))
        .route("/files/voice", get(|| async { OGG.to_vec() }))
        .route("/files/big", get(|| async { vec![b'x'; 3 * 1024 * 1024] }))
        .route(
            "/v1/audio/transcriptions",
            post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| async move {
                    let ct = headers
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string();
                    let parts = parse_multipart(&ct, &body).unwrap();
                    let model = parts.iter().find(|p| p.name == "model").unwrap();
                    let file = parts.iter().find(|p| p.name == "file").unwrap();
                    t.lock().unwrap().push((
                        String::from_utf8_lossy(&model.data).into_owned(),
                        file.data.clone(),
                    ));
                    axum::Json(serde_json::json!({"text": "buy milk and eggs"}))
                },
            ),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    Host { base, transcribed }
}

/// A listener that only counts the connections it gets.
async fn counting_listener() -> (String, Arc<AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/secret", l.local_addr().unwrap());
    let n = Arc::new(AtomicUsize::new(0));
    let c = n.clone();
    tokio::spawn(async move {
        while let Ok((_s, _)) = l.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
        }
    });
    (url, n)
}

/// A channel whose configured API origin is `origin`.
struct Chan {
    id: ChannelId,
    origin: String,
}

#[async_trait]
impl Channel for Chan {
    fn id(&self) -> &ChannelId {
        &self.id
    }
    async fn listen(
        &self,
        _tx: mpsc::Sender<InboundDelivery>,
        _cancel: CancellationToken,
    ) -> Result<(), ChannelError> {
        Ok(())
    }
    async fn send(&self, _msg: &OutboundMessage) -> Result<SentRef, ChannelError> {
        Ok(SentRef::Nothing)
    }
    async fn media_request(&self, m: &MediaRef) -> Result<MediaRequest, ChannelError> {
        let url = m.url.clone().unwrap_or_default();
        Ok(MediaRequest {
            trusted: url.starts_with(&format!("{}/", self.origin)),
            url,
            headers: Vec::new(),
        })
    }
}

fn event(content: &str, attachments: Vec<MediaRef>) -> InboundEvent {
    InboundEvent {
        channel: ChannelId::new("telegram"),
        chat: ChatId::new("42"),
        thread: None,
        sender: UserId::new("7"),
        sender_name: None,
        event_id: PlatformEventId::new("1001"),
        content: content.into(),
        received_at_ms: 1_795_000_000_000,
        attachments,
        origin: clawft_channel_core::Origin::User,
    }
}

fn media_at(kind: MediaKind, url: &str, name: Option<&str>) -> MediaRef {
    let mut m = MediaRef::new(kind, "f1");
    m.url = Some(url.into());
    m.name = name.map(Into::into);
    m
}

fn setup(transcription: Option<&str>) -> (tempfile::TempDir, Workspace, Media) {
    let d = tempfile::tempdir().unwrap();
    let ws = Workspace::open(d.path()).unwrap();
    let media = Media::new(MediaSettings {
        max_file_bytes: 2 * 1024 * 1024,
        max_message_bytes: 4 * 1024 * 1024,
        transcription: transcription.map(|base| TranscriptionSettings {
            base_url: format!("{base}/v1"),
            model: "whisper-1".into(),
            api_key: None,
            language: None,
        }),
        ..MediaSettings::default()
    })
    .unwrap();
    (d, ws, media)
}

#[tokio::test]
async fn a_photo_lands_in_the_inbox_sniffed_and_becomes_an_image_part() {
    let h = host().await;
    let (d, ws, media) = setup(None);
    let ch: Arc<dyn Channel> = Arc::new(Chan {
        id: ChannelId::new("telegram"),
        origin: h.base.clone(),
    });
    // Declared as a PDF named "photo": the bytes say JPEG.
    let mut m = media_at(
        MediaKind::Document,
        &format!("{}/files/photo", h.base),
        Some("photo"),
    );
    m.mime = Some("application/pdf".into());
    let ev = event("look", vec![m]);
    let p = media
        .prepare(&ws, &ev, Some(ch.clone()), &CancellationToken::new())
        .await;
    let rel = "inbox/2026-11-18/1001-photo.jpg";
    assert_eq!(std::fs::read(d.path().join(rel)).unwrap(), JPEG);
    assert!(
        p.text
            .starts_with("look\n\n[Attached image: inbox/2026-11-18/1001-photo.jpg (image/jpeg"),
        "{}",
        p.text
    );
    assert_eq!(p.images.len(), 1);
    assert_eq!(p.images[0].path, rel);
    assert_eq!(p.images[0].mime, "image/jpeg");
    // A resumed turn finds the file instead of fetching it again (the host is gone now).
    let gone: Arc<dyn Channel> = Arc::new(Chan {
        id: ChannelId::new("telegram"),
        origin: "http://127.0.0.1:9".into(),
    });
    let again = media
        .prepare(&ws, &ev, Some(gone), &CancellationToken::new())
        .await;
    assert_eq!(again, p);
    // Loaded for the model: base64 of the bytes.
    let mut msgs = vec![{
        let mut u = crate::llm::Message::user(p.text.clone());
        u.images = p.images.clone();
        u
    }];
    load_images(&ws, &mut msgs);
    use base64::Engine as _;
    assert_eq!(
        msgs[0].images[0].data.as_deref(),
        Some(
            base64::engine::general_purpose::STANDARD
                .encode(JPEG)
                .as_str()
        )
    );
}

#[tokio::test]
async fn a_url_off_the_platform_origin_pointing_at_private_addresses_is_refused_without_a_connection(
) {
    let h = host().await;
    let (d, ws, media) = setup(None);
    let (url, connections) = counting_listener().await;
    let ch: Arc<dyn Channel> = Arc::new(Chan {
        id: ChannelId::new("discord"),
        origin: h.base.clone(),
    });
    let ev = event(
        "",
        vec![
            media_at(MediaKind::Image, &url, Some("a.png")),
            media_at(
                MediaKind::Image,
                "http://169.254.169.254/latest/meta-data/iam",
                Some("b.png"),
            ),
        ],
    );
    let p = media
        .prepare(&ws, &ev, Some(ch), &CancellationToken::new())
        .await;
    assert_eq!(connections.load(Ordering::SeqCst), 0);
    assert!(p.images.is_empty());
    assert_eq!(p.text.matches("[Not downloaded: ").count(), 2, "{}", p.text);
    assert!(p.text.contains("refused"), "{}", p.text);
    assert!(
        !d.path().join("inbox").exists()
            || std::fs::read_dir(d.path().join("inbox/2026-11-18"))
                .map(Iterator::count)
                .unwrap_or(0)
                == 0
    );
}

#[tokio::test]
async fn files_over_the_caps_are_named_not_downloaded() {
    let h = host().await;
    let (d, ws, media) = setup(None);
    let ch: Arc<dyn Channel> = Arc::new(Chan {
        id: ChannelId::new("telegram"),
        origin: h.base.clone(),
    });
    // Declared too big: refused before any request. Undeclared but too big: cut off.
    let mut declared = media_at(
        MediaKind::Document,
        &format!("{}/files/photo", h.base),
        Some("huge.zip"),
    );
    declared.size = Some(25 * 1024 * 1024);
    let silent = media_at(
        MediaKind::Document,
        &format!("{}/files/big", h.base),
        Some("big.bin"),
    );
    let p = media
        .prepare(
            &ws,
            &event("two files", vec![declared, silent]),
            Some(ch),
            &CancellationToken::new(),
        )
        .await;
    assert!(
        p.text
            .contains("[Not downloaded: huge.zip (25.0 MB) is over the 2.0 MB limit per file]"),
        "{}",
        p.text
    );
    assert!(p.text.contains("[Not downloaded: big.bin"), "{}", p.text);
    assert!(
        std::fs::read_dir(d.path().join("inbox/2026-11-18"))
            .map(Iterator::count)
            .unwrap_or(0)
            == 0
    );
}

#[tokio::test]
async fn a_voice_note_is_transcribed_once_and_its_transcript_is_the_message() {
    let h = host().await;
    let (d, ws, media) = setup(Some(&h.base));
    let ch: Arc<dyn Channel> = Arc::new(Chan {
        id: ChannelId::new("telegram"),
        origin: h.base.clone(),
    });
    let ev = event(
        "",
        vec![media_at(
            MediaKind::Voice,
            &format!("{}/files/voice", h.base),
            None,
        )],
    );
    let p = media
        .prepare(&ws, &ev, Some(ch.clone()), &CancellationToken::new())
        .await;
    assert!(p.text.starts_with("buy milk and eggs\n\n[Attached voice note: inbox/2026-11-18/1001-voice_note.ogg (audio/ogg"), "{}", p.text);
    {
        let got = h.transcribed.lock().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "whisper-1");
        assert_eq!(got[0].1, OGG);
    }
    assert_eq!(
        std::fs::read_to_string(d.path().join("inbox/2026-11-18/1001-voice_note.ogg.txt")).unwrap(),
        "buy milk and eggs"
    );
    // Resumed: the cached transcript, no second call.
    let again = media
        .prepare(&ws, &ev, Some(ch.clone()), &CancellationToken::new())
        .await;
    assert_eq!(again.text, p.text);
    assert_eq!(h.transcribed.lock().unwrap().len(), 1);

    // Without an endpoint the model is told where the voice note is.
    let (_d2, ws2, plain) = setup(None);
    let p = plain
        .prepare(&ws2, &ev, Some(ch), &CancellationToken::new())
        .await;
    assert_eq!(
        p.text,
        "[Attached voice note: inbox/2026-11-18/1001-voice_note.ogg (audio/ogg, 1 KB); no transcription is configured]"
    );
}

#[test]
fn images_of_tool_results_are_shown_for_the_turn() {
    let d = tempfile::tempdir().unwrap();
    let ws = Workspace::open(d.path()).unwrap();
    // A 1x1 PNG.
    let png: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89\0\0\0\rIDATx\x9cc\xf8\x0f\x00\x00\x01\x01\x00\x05\x18\xd8N\0\0\0\0IEND\xaeB`\x82";
    std::fs::create_dir_all(d.path().join("browser")).unwrap();
    std::fs::write(d.path().join("browser/shot.png"), png).unwrap();
    std::fs::write(d.path().join("notes.txt"), "not an image").unwrap();
    let results = vec![
        crate::llm::Message::tool_result(
            "c1",
            "browser",
            r#"{"image": "browser/shot.png", "path": "browser/shot.png"}"#,
        ),
        crate::llm::Message::tool_result("c2", "x", r#"{"image": "notes.txt"}"#),
        crate::llm::Message::tool_result("c3", "y", r#"{"image": "../outside.png"}"#),
        crate::llm::Message::tool_result("c4", "z", "plain text"),
    ];
    let m = tool_result_images(&ws, &results).unwrap();
    assert_eq!(m.role, crate::llm::Role::User);
    assert_eq!(m.images.len(), 1);
    assert_eq!(m.images[0].mime, "image/png");
    assert!(m.images[0].data.is_some());
    assert!(
        m.content.contains("browser/shot.png (browser)"),
        "{}",
        m.content
    );
    assert!(tool_result_images(&ws, &results[1..]).is_none());
}
