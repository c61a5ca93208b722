//! Files in and out of chats, end to end against each platform's wire fake (docs/media.md):
//! a Telegram photo reaches a strict model as an image part and lands in the inbox; a voice
//! note goes through a transcription server and its text is the message; crafted attachment
//! URLs pointing at loopback or the metadata address are refused with no connection made; an
//! oversized file is named, not downloaded; files sent back (the `message` tool and `MEDIA:`
//! lines) arrive once on each platform, also when the real `weft` is killed with SIGKILL in
//! the middle of the upload.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::post;
use base64::Engine as _;
use clawft_channel_core::media::parse_multipart;
use clawft_channel_telegram::fake::FakeTelegram;
use serde_json::{json, Value};

use crate::common::{
    config, config_value, counting_listener, echo_model, last_user, messages, shown_in, wait_until,
    TestGateway,
};
use crate::fake_llm::{FakeLlm, Reply};
use crate::process::{free_port, log_of, write_config, Daemon};

const T: Duration = Duration::from_secs(30);
const JPEG: &[u8] = b"\xFF\xD8\xFF\xE0\x00\x10JFIF\x00\x01 a small photo of a cat";
const OGG: &[u8] = b"OggS\x00\x02\x00\x00 opus voice note";
const PDF: &[u8] = b"%PDF-1.7\n weekly report";
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR a chart";

pub(crate) fn telegram(tg: &FakeTelegram) -> Value {
    json!({"token": FakeTelegram::TOKEN, "api_url": tg.api_url(), "allow_from": [111], "stream_edits": false})
}

fn discord(dc: &clawft_channel_discord::fake::FakeDiscord) -> Value {
    json!({"token": clawft_channel_discord::fake::FAKE_TOKEN, "proxy": dc.base_url(), "allow_from": ["111"], "stream_edits": false})
}

fn slack(sl: &clawft_channel_slack::fake::FakeSlack) -> Value {
    use clawft_channel_slack::fake::{APP_TOKEN, BOT_TOKEN};
    json!({"token": BOT_TOKEN, "app_token": APP_TOKEN, "api_url": sl.api_url(), "allow_from": ["U111"], "stream_edits": false})
}

/// The files under `ws/inbox/<date>/`, with their bytes.
fn inbox(ws: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let Ok(days) = std::fs::read_dir(ws.join("inbox")) else {
        return out;
    };
    for day in days.flatten() {
        for f in std::fs::read_dir(day.path()).unwrap().flatten() {
            let name = format!(
                "{}/{}",
                day.file_name().to_string_lossy(),
                f.file_name().to_string_lossy()
            );
            out.push((name, std::fs::read(f.path()).unwrap()));
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn a_telegram_photo_reaches_the_model_as_an_image_part_for_its_turn_and_is_in_the_inbox() {
    let tg = FakeTelegram::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.strict(None);
    llm.push(Reply::Text("A cat.".into()));
    llm.push(Reply::Text("Still a cat.".into()));
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"agents": {"defaults": {"vision": "on"}}, "channels": {"telegram": telegram(&tg)}}),
    ))
    .await;
    tg.push_photo(111, 111, JPEG, Some("what is this?"));
    assert!(
        wait_until(T, || shown_in(&tg, 111).iter().any(|t| t == "A cat.")).await,
        "{:?} {:?}",
        tg.sent(),
        llm.requests()
    );
    let req = &llm.requests()[0];
    let user = messages(req).last().cloned().unwrap();
    let parts = user["content"].as_array().expect("content parts").clone();
    assert_eq!(parts[0]["type"], "text");
    let text = parts[0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("what is this?\n\n[Attached image: inbox/"),
        "{text}"
    );
    let url = parts[1]["image_url"]["url"].as_str().unwrap();
    let data = url.strip_prefix("data:image/jpeg;base64,").unwrap();
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap(),
        JPEG
    );
    let files = inbox(&dir.path().join("ws"));
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].0.ends_with(".jpg"), "{files:?}");
    assert_eq!(files[0].1, JPEG);
    assert!(text.contains(&files[0].0), "{text} {files:?}");

    // The next turn sends the earlier message as text: the image went with its own turn only.
    tg.push_user_message(111, 111, "and now?");
    assert!(wait_until(T, || shown_in(&tg, 111).iter().any(|t| t == "Still a cat.")).await);
    let req = &llm.requests()[1];
    assert!(
        messages(req)
            .iter()
            .all(|m| m["content"].is_string() || m["content"].is_null()),
        "{req}"
    );
    assert!(req.to_string().contains("[Attached image: inbox/"), "{req}");
    gw.stop().await;
}

/// What the transcription endpoint received: (model, file name, bytes).
type Calls = Arc<Mutex<Vec<(String, String, Vec<u8>)>>>;

/// A transcription endpoint: records each call and answers `text`.
async fn transcriber(text: &'static str) -> (String, Calls) {
    use axum::http::StatusCode;
    let calls: Calls = Arc::default();
    let c = calls.clone();
    let app = axum::Router::new().route(
        "/v1/audio/transcriptions",
        post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| async move {
                let ct = headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                let parts = parse_multipart(ct, &body).unwrap_or_default();
                let model = parts
                    .iter()
                    .find(|p| p.name == "model")
                    .map(|p| String::from_utf8_lossy(&p.data).into_owned());
                match (model, parts.iter().find(|p| p.name == "file")) {
                    (Some(m), Some(f)) => {
                        c.lock().unwrap().push((
                            m,
                            f.file_name.clone().unwrap_or_default(),
                            f.data.clone(),
                        ));
                        (StatusCode::OK, json!({"text": text}).to_string())
                    }
                    _ => (
                        StatusCode::BAD_REQUEST,
                        json!({"error": {"message": "model and file are required"}}).to_string(),
                    ),
                }
            },
        ),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    (base, calls)
}

#[tokio::test]
async fn a_voice_note_is_transcribed_and_its_text_is_the_message_the_model_gets_and_keeps() {
    let tg = FakeTelegram::start().await;
    let (base, calls) = transcriber("remind me to buy milk").await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({
            "channels": {"telegram": telegram(&tg)},
            "media": {"transcription": {"base_url": base, "model": "whisper-1"}},
        }),
    ))
    .await;
    tg.push_voice(111, 111, OGG, 3);
    assert!(
        wait_until(T, || shown_in(&tg, 111).len() == 1).await,
        "{:?}",
        tg.sent()
    );
    {
        let c = calls.lock().unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].0, "whisper-1");
        assert!(c[0].1.ends_with(".ogg"), "{}", c[0].1);
        assert_eq!(c[0].2, OGG);
    }
    let first = last_user(&llm.requests()[0]);
    assert!(
        first.starts_with("remind me to buy milk\n\n[Attached voice note: inbox/"),
        "{first}"
    );
    // Stored: the next turn's history has the transcript as the user's message.
    tg.push_user_message(111, 111, "what did I say?");
    assert!(wait_until(T, || shown_in(&tg, 111).len() == 2).await);
    let req = &llm.requests()[1];
    let users: Vec<String> = messages(req)
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(users[0].starts_with("remind me to buy milk"), "{users:?}");
    assert_eq!(calls.lock().unwrap().len(), 1, "transcribed once");
    gw.stop().await;
}

#[tokio::test]
async fn crafted_attachment_urls_to_loopback_and_metadata_are_refused_with_no_connection() {
    let dc = clawft_channel_discord::fake::FakeDiscord::start().await;
    let sl = clawft_channel_slack::fake::FakeSlack::start().await;
    let (addr, connections) = counting_listener().await;
    let url = format!("http://{addr}/internal/admin");
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"channels": {"discord": discord(&dc), "slack": slack(&sl)}}),
    ))
    .await;
    let metadata = "http://169.254.169.254/latest/meta-data/iam/security-credentials/";
    dc.push_crafted_attachment("500", "111", "see attached", &url);
    sl.push_crafted_file("D111", "U111", "see attached", metadata);
    dc.push_crafted_attachment("501", "111", "see this", metadata);
    sl.push_crafted_file("D112", "U111", "see this", &url);
    assert!(
        wait_until(T, || llm.requests().len() >= 4).await,
        "{:?}",
        llm.requests()
    );
    for req in llm.requests() {
        let text = last_user(&req);
        assert!(text.contains("[Not downloaded: "), "{text}");
        assert!(text.contains("refused"), "{text}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "the listener was reached"
    );
    assert!(inbox(&dir.path().join("ws")).is_empty());
    gw.stop().await;
}

#[tokio::test]
async fn an_oversized_file_is_not_downloaded_and_the_user_is_told() {
    let tg = FakeTelegram::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"channels": {"telegram": telegram(&tg)}, "media": {"max_file_mb": 1}}),
    ))
    .await;
    let big = vec![b'z'; 1536 * 1024];
    tg.push_document(
        111,
        111,
        &big,
        "dump.zip",
        "application/zip",
        Some("keep this"),
    );
    assert!(
        wait_until(T, || shown_in(&tg, 111).len() == 1).await,
        "{:?}",
        tg.sent()
    );
    let shown = shown_in(&tg, 111);
    assert!(
        shown[0].contains("dump.zip (1.5 MB) is over the 1.0 MB limit per file"),
        "{shown:?}"
    );
    assert!(tg.downloads().is_empty(), "{:?}", tg.downloads());
    assert!(inbox(&dir.path().join("ws")).is_empty());
    gw.stop().await;
}

/// The model sends `report.pdf` with the `message` tool, then answers with a `MEDIA:` line.
fn file_sending_model(llm: &FakeLlm, channel: &str, chat: &str) {
    let args = json!({"channel": channel, "chat_id": chat, "content": "The report:", "attachments": ["report.pdf"]});
    llm.push(Reply::ToolCalls(vec![(
        "call_1".into(),
        "message".into(),
        args.to_string(),
    )]));
    llm.push(Reply::Text(
        "Sent. Here is the chart too.\nMEDIA: charts/week.png".into(),
    ));
}

fn workspace_with_files(dir: &std::path::Path) {
    let ws = dir.join("ws");
    std::fs::create_dir_all(ws.join("charts")).unwrap();
    std::fs::write(ws.join("report.pdf"), PDF).unwrap();
    std::fs::write(ws.join("charts/week.png"), PNG).unwrap();
}

/// One platform's fake, seen the same way by the outbound tests.
pub(crate) enum Fake {
    Telegram(FakeTelegram),
    Discord(clawft_channel_discord::fake::FakeDiscord),
    Slack(clawft_channel_slack::fake::FakeSlack),
}

impl Fake {
    pub(crate) async fn start(name: &str) -> Self {
        match name {
            "telegram" => Fake::Telegram(FakeTelegram::start().await),
            "discord" => Fake::Discord(clawft_channel_discord::fake::FakeDiscord::start().await),
            _ => Fake::Slack(clawft_channel_slack::fake::FakeSlack::start().await),
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            Fake::Telegram(_) => "telegram",
            Fake::Discord(_) => "discord",
            Fake::Slack(_) => "slack",
        }
    }

    /// The config section and the user's chat id.
    pub(crate) fn section(&self) -> (Value, &'static str) {
        match self {
            Fake::Telegram(f) => (telegram(f), "111"),
            Fake::Discord(f) => (discord(f), "500"),
            Fake::Slack(f) => (slack(f), "D111"),
        }
    }

    /// The user writes `text` in their chat.
    pub(crate) fn push(&self, text: &str) {
        match self {
            Fake::Telegram(f) => {
                f.push_user_message(111, 111, text);
            }
            Fake::Discord(f) => {
                f.push_user_message("500", "111", text);
            }
            Fake::Slack(f) => {
                f.push_user_message("D111", "U111", text);
            }
        }
    }

    /// Every uploaded file: (name, bytes).
    pub(crate) fn uploads(&self) -> Vec<(String, Vec<u8>)> {
        match self {
            Fake::Telegram(f) => f
                .uploads()
                .into_iter()
                .map(|u| (u.file_name.unwrap_or_default(), u.bytes))
                .collect(),
            Fake::Discord(f) => f
                .uploads()
                .into_iter()
                .map(|u| (u.file_name, u.bytes))
                .collect(),
            Fake::Slack(f) => f.uploads().into_iter().map(|u| (u.name, u.bytes)).collect(),
        }
    }

    /// The text messages the chat shows that contain `needle`.
    pub(crate) fn texts(&self, needle: &str) -> Vec<String> {
        let all: Vec<String> = match self {
            Fake::Telegram(f) => shown_in(f, 111),
            Fake::Discord(f) => f.sent().into_iter().map(|m| m.text).collect(),
            Fake::Slack(f) => f.sent().into_iter().map(|m| m.text).collect(),
        };
        all.into_iter().filter(|t| t.contains(needle)).collect()
    }

    fn hold_uploads(&self, on: bool) {
        match self {
            Fake::Telegram(f) => f.hold_uploads(on),
            Fake::Discord(f) => f.hold_uploads(on),
            Fake::Slack(f) => f.hold_uploads(on),
        }
    }
}

const PLATFORMS: [&str; 3] = ["telegram", "discord", "slack"];

#[tokio::test]
async fn files_sent_back_arrive_once_on_each_platform() {
    for name in PLATFORMS {
        let fake = Fake::start(name).await;
        let platform = fake.name();
        let dir = tempfile::tempdir().unwrap();
        workspace_with_files(dir.path());
        let llm = FakeLlm::start().await;
        let (section, chat) = fake.section();
        file_sending_model(&llm, platform, chat);
        let gw = TestGateway::start(config(
            &llm,
            dir.path(),
            json!({"channels": {platform: section}}),
        ))
        .await;
        fake.push("send me the report");
        let names = || fake.uploads().into_iter().map(|u| u.0).collect::<Vec<_>>();
        assert!(
            wait_until(T, || fake.uploads().len() >= 2).await,
            "{platform}: {:?}",
            names()
        );
        tokio::time::sleep(Duration::from_millis(800)).await;
        let got = fake.uploads();
        assert_eq!(got.len(), 2, "{platform}: {:?}", names());
        assert_eq!(got[0].0, "report.pdf", "{platform}");
        assert_eq!(got[0].1, PDF, "{platform}");
        assert_eq!(got[1].0, "week.png", "{platform}");
        assert_eq!(got[1].1, PNG, "{platform}");
        // The copies in the outbox are gone once delivered.
        let staged = dir.path().join(".clawft/outbox-files");
        assert!(
            wait_until(T, || std::fs::read_dir(&staged)
                .map(|d| d.count() == 0)
                .unwrap_or(true))
            .await,
            "{platform}: staged copies left"
        );
        gw.stop().await;
    }
}

/// Kill the real `weft` while the upload of the reply's file hangs; after the restart the
/// chat shows the reply's text once and the file once.
#[tokio::test]
async fn kill_9_in_the_middle_of_an_upload_still_delivers_the_file_once_on_each_platform() {
    for name in PLATFORMS {
        let fake = Fake::start(name).await;
        let platform = fake.name();
        let dir = tempfile::tempdir().unwrap();
        workspace_with_files(dir.path());
        let llm = FakeLlm::start().await;
        llm.push(Reply::Text("Your chart.\nMEDIA: charts/week.png".into()));
        let port = free_port();
        let cfg = write_config(
            dir.path(),
            &config_value(
                &llm.base_url(),
                dir.path(),
                json!({"channels": {"http": {"bind": format!("127.0.0.1:{port}")}, platform: fake.section().0}}),
            ),
        );
        fake.hold_uploads(true);
        let d = Daemon::start(dir.path(), &cfg, port).await;
        fake.push("chart please");
        // The text goes first; then the upload starts and hangs.
        assert!(
            wait_until(T, || !fake.texts("Your chart").is_empty()).await,
            "{platform}: no text\n{}",
            log_of(dir.path())
        );
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(
            fake.uploads().is_empty(),
            "{platform}: the held upload was recorded"
        );
        d.kill9();
        fake.hold_uploads(false);
        let d = Daemon::start(dir.path(), &cfg, port).await;
        assert!(
            wait_until(T, || !fake.uploads().is_empty()).await,
            "{platform}: no upload after the restart\n{}",
            log_of(dir.path())
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let bytes: Vec<Vec<u8>> = fake.uploads().into_iter().map(|u| u.1).collect();
        assert_eq!(bytes, vec![PNG.to_vec()], "{platform}");
        assert_eq!(
            fake.texts("Your chart").len(),
            1,
            "{platform}: {:?}",
            fake.texts("Your chart")
        );
        assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));
    }
}
