//! Files in and out of Slack chats, against the fake, through the `Channel` API.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use clawft_channel_core::media::{MediaKind, MediaRef, OutboundFile};
use clawft_channel_core::{Ack, Channel, ChannelError, OutboundKind, OutboundMessage, ThreadId};
use serde_json::{json, Value};

use crate::fake::{Failure, NewFile, BOT_TOKEN};
use crate::tests::{next, out, start, start_with, WAIT};
use crate::MAX_UPLOAD_BYTES;

const COMPLETE: &str = "files.completeUploadExternal";

/// A file on disk to attach, in a directory of its own.
fn attach(name: &str, mime: &str, bytes: &[u8]) -> OutboundFile {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "weft-slack-media-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    OutboundFile {
        path: path.to_string_lossy().into_owned(),
        name: name.into(),
        kind: MediaKind::of_mime(mime),
        mime: mime.into(),
        size: bytes.len() as u64,
    }
}

fn with_files(mut m: OutboundMessage, files: Vec<OutboundFile>) -> OutboundMessage {
    m.attachments = files;
    m
}

/// Distinct bytes of `n` length (every value 0..=255 appears, CR LF and `--` too).
fn blob(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

async fn get(url: &str, headers: &[(String, String)]) -> (u16, Vec<u8>) {
    let mut req = reqwest::Client::new().get(url);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.bytes().await.unwrap().to_vec())
}

#[tokio::test]
async fn a_message_with_files_arrives_with_its_attachments_and_a_file_only_message_is_delivered() {
    let mut h = start().await;
    let png = blob(300, 7);
    let ev = h.fake.push_files(
        "D1",
        "U1",
        "what is in this picture?",
        vec![NewFile::new("cat.png", "image/png", png.clone())],
    );
    let d = next(&mut h.rx).await;
    assert_eq!(d.event.event_id.as_str(), ev);
    assert_eq!(d.event.content, "what is in this picture?");
    assert_eq!(d.event.attachments.len(), 1);
    let a = &d.event.attachments[0];
    assert_eq!(a.kind, MediaKind::Image);
    assert_eq!(a.name.as_deref(), Some("cat.png"));
    assert_eq!(a.mime.as_deref(), Some("image/png"));
    assert_eq!(a.size, Some(300));
    let url = a.url.clone().unwrap();
    assert!(url.contains("/download/cat.png"), "{url}");
    // Nothing secret is journaled with the event.
    assert!(!serde_json::to_string(&d.event).unwrap().contains("xoxb"));
    d.ack.unwrap().send(Ack::Accepted).unwrap();

    // A voice clip and a document, no text at all: delivered with empty content.
    h.fake.push_files(
        "D1",
        "U1",
        "",
        vec![
            NewFile::voice("audio_message.webm", "audio/webm", b"OggS-ish".to_vec()),
            NewFile::new("report.pdf", "application/pdf", b"%PDF-1.7".to_vec()),
        ],
    );
    let d = next(&mut h.rx).await;
    assert_eq!(d.event.content, "");
    let kinds: Vec<MediaKind> = d.event.attachments.iter().map(|a| a.kind).collect();
    assert_eq!(kinds, [MediaKind::Voice, MediaKind::Document]);
    d.ack.unwrap().send(Ack::Accepted).unwrap();

    // In a channel: a file with a mention is delivered once (the app_mention twin), with
    // its file; a file without a mention is not for the bot.
    h.fake.push_files(
        "C1",
        "U1",
        "no mention here",
        vec![NewFile::new("a.txt", "text/plain", b"a".to_vec())],
    );
    let ev = h.fake.push_files(
        "C1",
        "U1",
        "<@UBOT> summarise",
        vec![NewFile::new("b.txt", "text/plain", b"b".to_vec())],
    );
    let d = next(&mut h.rx).await;
    assert_eq!(d.event.event_id.as_str(), ev);
    assert_eq!(d.event.content, "summarise");
    assert_eq!(d.event.attachments[0].name.as_deref(), Some("b.txt"));
    d.ack.unwrap().send(Ack::Accepted).unwrap();
    crate::tests::nothing_within(&mut h.rx, 200).await;
    h.stop().await;
}

#[tokio::test]
async fn media_request_gets_the_exact_bytes_and_credentials_go_only_to_slack_hosts() {
    let mut h = start().await;
    let bytes = blob(5000, 3);
    h.fake.push_files(
        "D1",
        "U1",
        "",
        vec![NewFile::new(
            "data.bin",
            "application/octet-stream",
            bytes.clone(),
        )],
    );
    let d = next(&mut h.rx).await;
    let media = d.event.attachments[0].clone();
    let req = h.ch.media_request(&media).await.unwrap();
    assert!(req.trusted, "the fake is on the configured api_url origin");
    assert_eq!(
        req.headers,
        [("Authorization".to_string(), format!("Bearer {BOT_TOKEN}"))]
    );
    let (status, got) = get(&req.url, &req.headers).await;
    assert_eq!(status, 200);
    assert_eq!(got, bytes);
    // Like Slack, without the token the "file" is a login page.
    let (status, page) = get(&req.url, &[]).await;
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&page).contains("<html"));

    // A file the event named without URLs is looked up with files.info.
    let bare = MediaRef::new(MediaKind::Document, media.id.clone());
    let req = h.ch.media_request(&bare).await.unwrap();
    assert!(req.trusted);
    assert_eq!(get(&req.url, &req.headers).await.1, bytes);

    // A URL a payload names elsewhere: not trusted, no token.
    let crafted = "http://169.254.169.254/latest/meta-data/iam";
    h.fake.push_crafted_file("D1", "U1", "look", crafted);
    let d = next(&mut h.rx).await;
    let m = &d.event.attachments[0];
    assert_eq!(m.url.as_deref(), Some(crafted));
    let req = h.ch.media_request(m).await.unwrap();
    assert_eq!(req.url, crafted);
    assert!(!req.trusted);
    assert!(req.headers.is_empty());

    let fake_port = reqwest::Url::parse(&h.fake.api_url())
        .unwrap()
        .port()
        .unwrap();
    for (url, trusted, token) in [
        (
            "https://files.slack.com/files-pri/T1-F1/download/x.png",
            false,
            true,
        ),
        ("http://files.slack.com/files-pri/T1-F1/x.png", false, false),
        (
            "https://files.slack.com:8443/files-pri/T1-F1/x.png",
            false,
            false,
        ),
        ("https://files.slack.com.evil.example/x.png", false, false),
        ("https://files.slack.com@evil.example/x.png", false, false),
        ("https://evil.example/files.slack.com/x.png", false, false),
        (
            &format!("http://localhost:{fake_port}/files-pri/x"),
            false,
            false,
        ),
        (
            &format!("http://127.0.0.1:{}/x", fake_port + 1),
            false,
            false,
        ),
        (
            &format!("http://127.0.0.1:{fake_port}/elsewhere/x"),
            true,
            true,
        ),
        ("not a url", false, false),
    ] {
        let mut m = MediaRef::new(MediaKind::Image, "F9");
        m.url = Some(url.to_string());
        let req = h.ch.media_request(&m).await.unwrap();
        assert_eq!(req.trusted, trusted, "{url}");
        assert_eq!(!req.headers.is_empty(), token, "{url}");
    }
    h.stop().await;
}

#[tokio::test]
async fn a_final_with_text_and_two_files_shows_the_text_once_and_each_file_once() {
    let h = start().await;
    let a = blob(70_000, 1);
    let b = blob(1234, 2);
    let mut msg = with_files(
        out(OutboundKind::Final, "o-files", "C1", "Here are **both**."),
        vec![
            attach("notes.txt", "text/plain", &a),
            attach("chart.png", "image/png", &b),
        ],
    );
    msg.thread = Some(ThreadId::new("1700000000.000001"));
    h.ch.send(&msg).await.unwrap();
    let shown = h.fake.sent();
    let what: Vec<(&str, &str)> = shown
        .iter()
        .map(|p| (p.method.as_str(), p.text.as_str()))
        .collect();
    assert_eq!(
        what,
        [
            ("chat.postMessage", "Here are *both*."),
            (COMPLETE, "notes.txt"),
            (COMPLETE, "chart.png"),
        ]
    );
    assert!(shown
        .iter()
        .all(|p| p.chat == "C1" && p.thread.as_deref() == Some("1700000000.000001")));
    let ups = h.fake.uploads();
    assert_eq!(ups.len(), 2);
    assert_eq!(
        (ups[0].name.as_str(), ups[0].title.as_deref()),
        ("notes.txt", Some("notes.txt"))
    );
    assert_eq!(ups[0].bytes, a);
    assert_eq!(ups[0].content_type.as_deref(), Some("text/plain"));
    assert_eq!(ups[1].name, "chart.png");
    assert_eq!(ups[1].bytes, b);
    assert_eq!(ups[1].content_type.as_deref(), Some("image/png"));
    assert!(ups.iter().all(|u| u.chat == "C1"
        && u.thread.as_deref() == Some("1700000000.000001")
        && u.method == COMPLETE));
    // The reservation went as form fields with the exact length, and no request body holds
    // the token.
    let calls = h.fake.calls();
    let reserve: Vec<&Value> = calls
        .iter()
        .filter(|c| c.method == "files.getUploadURLExternal")
        .map(|c| &c.body)
        .collect();
    assert_eq!(
        reserve,
        [
            &json!({"filename": "notes.txt", "length": "70000"}),
            &json!({"filename": "chart.png", "length": "1234"})
        ]
    );
    assert!(calls.iter().all(|c| !c.body.to_string().contains("xoxb")));
    // Sent again (the outbox retrying a delivered message): nothing new.
    h.ch.send(&msg).await.unwrap();
    assert_eq!(h.fake.sent().len(), 3);
    assert_eq!(h.fake.uploads().len(), 2);
    h.stop().await;
}

#[tokio::test]
async fn a_failed_second_upload_fails_the_send_and_the_retry_uploads_only_that_file() {
    let h = start().await;
    let msg = with_files(
        out(OutboundKind::Final, "o-retry", "D1", "two files"),
        vec![
            attach("one.txt", "text/plain", b"first file"),
            attach("two.txt", "text/plain", b"second file"),
        ],
    );
    h.fake.fail_upload_after(1, Failure::ServerError);
    let err = h.ch.send(&msg).await.unwrap_err();
    assert!(matches!(err, ChannelError::Transient(_)), "{err:?}");
    assert_eq!(h.fake.uploads().len(), 1);
    h.ch.send(&msg).await.unwrap();
    let names: Vec<String> = h.fake.uploads().into_iter().map(|u| u.name).collect();
    assert_eq!(names, ["one.txt", "two.txt"]);
    let texts: Vec<String> = h.fake.sent().into_iter().map(|p| p.text).collect();
    assert_eq!(texts, ["two files", "one.txt", "two.txt"]);

    // A 429 on the bytes: rate limited with Slack's Retry-After; a 429 on the completion
    // likewise; each retry uploads only what is missing.
    let msg = with_files(
        out(OutboundKind::Final, "o-429", "D1", ""),
        vec![
            attach("three.txt", "text/plain", b"3"),
            attach("four.txt", "text/plain", b"4"),
        ],
    );
    h.fake.fail_upload(Failure::RateLimited {
        retry_after_secs: 9,
    });
    let err = h.ch.send(&msg).await.unwrap_err();
    assert!(matches!(err, ChannelError::RateLimited { .. }), "{err:?}");
    assert_eq!(err.retry_after(), Some(Duration::from_secs(9)));
    h.fake.fail_method(
        COMPLETE,
        Failure::RateLimited {
            retry_after_secs: 0,
        },
    );
    let err = h.ch.send(&msg).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    h.ch.send(&msg).await.unwrap();
    let names: Vec<String> = h.fake.uploads().into_iter().map(|u| u.name).collect();
    assert_eq!(names, ["one.txt", "two.txt", "three.txt", "four.txt"]);
    h.stop().await;
}

#[tokio::test]
async fn a_file_over_the_upload_limit_becomes_a_note_and_is_not_uploaded() {
    let h = start_with(|c| c.max_upload_bytes = 1000).await;
    assert_eq!(h.ch.capabilities().max_upload_bytes, 1000);
    let msg = with_files(
        out(OutboundKind::Final, "o-big", "D1", "the results"),
        vec![
            attach("big.csv", "text/csv", &blob(4000, 0)),
            attach("small.csv", "text/csv", b"a,b\n1,2\n"),
        ],
    );
    h.ch.send(&msg).await.unwrap();
    let texts: Vec<String> = h.fake.sent().into_iter().map(|p| p.text).collect();
    assert_eq!(texts.len(), 3, "{texts:?}");
    assert_eq!(texts[0], "the results");
    assert!(
        texts[1].contains("big.csv (4 KB)") && texts[1].contains("not sent"),
        "{}",
        texts[1]
    );
    assert_eq!(texts[2], "small.csv");
    let names: Vec<String> = h.fake.uploads().into_iter().map(|u| u.name).collect();
    assert_eq!(names, ["small.csv"]);
    assert!(!h
        .fake
        .calls()
        .iter()
        .any(|c| c.method == "files.getUploadURLExternal" && c.body["filename"] == "big.csv"));
    // An empty file: Slack refuses a zero length, so it is a note too.
    let msg = with_files(
        out(OutboundKind::Final, "o-empty", "D1", ""),
        vec![attach("empty.log", "text/plain", b"")],
    );
    h.ch.send(&msg).await.unwrap();
    let last = h.fake.sent().pop().unwrap();
    assert_eq!(last.method, "chat.postMessage");
    assert!(last.text.contains("empty.log is empty"), "{}", last.text);
    assert_eq!(h.fake.uploads().len(), 1);
    h.stop().await;

    // The default limit is ours (uploads are held in memory), under Slack's 1 GB.
    let h = start().await;
    assert_eq!(h.ch.capabilities().max_upload_bytes, MAX_UPLOAD_BYTES);
    assert_eq!(MAX_UPLOAD_BYTES, 100 * 1024 * 1024);
    h.stop().await;
}

#[tokio::test]
async fn an_attachment_only_final_posts_no_text() {
    let h = start().await;
    let msg = with_files(
        out(OutboundKind::Final, "o-only", "D1", ""),
        vec![attach("photo.jpg", "image/jpeg", &blob(900, 9))],
    );
    h.ch.send(&msg).await.unwrap();
    let shown = h.fake.sent();
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!(
        (shown[0].method.as_str(), shown[0].text.as_str()),
        (COMPLETE, "photo.jpg")
    );
    assert!(!h
        .fake
        .calls()
        .iter()
        .any(|c| c.method == "chat.postMessage"));
    assert_eq!(h.fake.uploads()[0].bytes, blob(900, 9));
    h.stop().await;
}

#[tokio::test]
async fn a_held_upload_is_not_recorded_and_the_resend_uploads_it_once() {
    let h = start().await;
    let msg = with_files(
        out(OutboundKind::Final, "o-held", "D1", "file follows"),
        vec![attach("held.txt", "text/plain", b"held bytes")],
    );
    h.fake.hold_uploads(true);
    let send = tokio::spawn({
        let ch = h.ch.clone();
        let msg = msg.clone();
        async move { ch.send(&msg).await }
    });
    assert_eq!(h.fake.wait_held_uploads(1, WAIT).await, 1);
    assert!(h.fake.uploads().is_empty());
    assert_eq!(h.fake.sent().len(), 1, "only the text so far");
    h.fake.hold_uploads(false);
    let r = tokio::time::timeout(WAIT, send).await.unwrap().unwrap();
    assert!(r.unwrap_err().is_retryable());
    assert_eq!(h.fake.held_uploads(), 0);
    assert!(h.fake.uploads().is_empty());
    h.ch.send(&msg).await.unwrap();
    let ups = h.fake.wait_uploads(1, WAIT).await;
    assert_eq!(ups.len(), 1);
    assert_eq!(ups[0].bytes, b"held bytes");
    let texts: Vec<String> = h.fake.sent().into_iter().map(|p| p.text).collect();
    assert_eq!(texts, ["file follows", "held.txt"]);
    h.stop().await;
}

#[tokio::test]
async fn an_upload_url_off_slack_is_refused_without_sending_the_bytes() {
    let h = start().await;
    let msg = with_files(
        out(OutboundKind::Final, "o-evil", "D1", ""),
        vec![attach("secret.txt", "text/plain", b"do not leak")],
    );
    for base in [
        "https://evil.example",
        "http://files.slack.com",
        "https://files.slack.com.evil.example",
    ] {
        h.fake.set_upload_url_base(Some(base));
        let err = h.ch.send(&msg).await.unwrap_err();
        assert!(matches!(err, ChannelError::Rejected(_)), "{base}: {err:?}");
        assert!(err.to_string().contains("secret.txt"), "{err}");
    }
    assert!(h.fake.uploads().is_empty());
    // Back on the fake's origin (the configured api_url's), the same message goes out.
    h.fake.set_upload_url_base(None);
    h.ch.send(&msg).await.unwrap();
    assert_eq!(h.fake.uploads()[0].bytes, b"do not leak");
    h.stop().await;
}

/// The fake refuses what Slack refuses, so the adapter's calls are checked against it.
#[tokio::test]
async fn the_fake_upload_api_is_as_strict_as_slack() {
    let h = start().await;
    let api = h.fake.api_url();
    let http = reqwest::Client::new();
    let call = |method: &str, body: Value, form: bool| {
        let req = http.post(format!("{api}{method}")).bearer_auth(BOT_TOKEN);
        let req = if form {
            let pairs: Vec<(String, String)> = body
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect();
            req.form(&pairs)
        } else {
            req.json(&body)
        };
        async move { req.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let err = |v: Value| v["error"].as_str().unwrap_or("ok").to_string();
    // JSON bodies, a missing length, a zero length.
    let json_body = json!({"filename": "a.txt", "length": "3"});
    assert_eq!(
        err(call("files.getUploadURLExternal", json_body, false).await),
        "invalid_arguments"
    );
    assert_eq!(
        err(call(
            "files.getUploadURLExternal",
            json!({"filename": "a.txt"}),
            true
        )
        .await),
        "invalid_arguments"
    );
    assert_eq!(
        err(call(
            "files.getUploadURLExternal",
            json!({"filename": "a.txt", "length": "0"}),
            true
        )
        .await),
        "missing_argument"
    );
    let v = call(
        "files.getUploadURLExternal",
        json!({"filename": "a.txt", "length": "3"}),
        true,
    )
    .await;
    let (url, id) = (
        v["upload_url"].as_str().unwrap().to_string(),
        v["file_id"].as_str().unwrap().to_string(),
    );
    let complete = json!({"files": [{"id": id, "title": "a"}], "channel_id": "D1"});
    // Not uploaded yet, then a short upload: refused at completion.
    assert_eq!(
        err(call(COMPLETE, complete.clone(), false).await),
        "file_not_found"
    );
    let r = http.post(&url).body(b"ab".to_vec()).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        err(call(COMPLETE, complete.clone(), false).await),
        "file_upload_size_mismatch"
    );
    // A malformed multipart body is refused at the upload URL.
    let r = http
        .post(&url)
        .header("content-type", "multipart/form-data; boundary=x")
        .body("garbage")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = http.post(&url).body(b"abc".to_vec()).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "OK - 3");
    assert_eq!(err(call(COMPLETE, complete.clone(), false).await), "ok");
    // Completed once only; unknown ids are not found.
    assert_eq!(
        err(call(COMPLETE, complete.clone(), false).await),
        "file_not_found"
    );
    let unknown = json!({"files": [{"id": "F404"}], "channel_id": "D1"});
    assert_eq!(err(call(COMPLETE, unknown, false).await), "file_not_found");
    assert_eq!(h.fake.uploads().len(), 1);
    assert_eq!(h.fake.uploads()[0].bytes, b"abc");
    h.stop().await;
}
