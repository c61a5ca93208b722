//! Voice and images out (docs/media.md, "Speech and images"): the `tts` and `image` tools
//! against strict OpenAI-compatible speech and image servers (they refuse a missing model or
//! input and a wrong key, like OpenAI), found through `tool_search`; what they make arrives on
//! Telegram (`sendVoice` for Ogg/Opus, a file otherwise, `sendPhoto`), Discord and Slack
//! as uploads; a Telegram voice note answered with a voice note spoken by the real
//! `espeak-ng`; the spend counted in the usage and the budgets; a clear error without a
//! backend; the key never shown to the model.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use base64::Engine as _;
use clawft_channel_telegram::fake::FakeTelegram;
use serde_json::{json, Value};

use crate::common::{config, shown_in, tool_results, wait_until, TestGateway};
use crate::fake_llm::{FakeLlm, Reply};
use crate::media::{telegram, Fake};

const T: Duration = Duration::from_secs(30);
const OGG: &[u8] = b"OggS\x00\x02\x00\x00\x00\x00 opus speech from the server";
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR a drawn cat";
const KEY: &str = "sk-media-test-4f1d9c2b7a";

/// What a fake server accepted: the JSON bodies.
type Calls = Arc<Mutex<Vec<Value>>>;

/// An OpenAI error answer.
fn openai_error(status: StatusCode, msg: &str) -> (StatusCode, HeaderMap, Vec<u8>) {
    let mut h = HeaderMap::new();
    h.insert("content-type", "application/json".parse().unwrap());
    let body = json!({"error": {"message": msg, "type": "invalid_request_error"}});
    (status, h, body.to_string().into_bytes())
}

/// Check what OpenAI checks before answering: the key, a JSON body, the known arguments and
/// the required ones non-empty strings.
#[allow(clippy::result_large_err)]
fn check_request(
    headers: &HeaderMap,
    body: &[u8],
    known: &[&str],
    required: &[&str],
) -> Result<Value, (StatusCode, HeaderMap, Vec<u8>)> {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if auth != format!("Bearer {KEY}") {
        // Like OpenAI, the answer names the key it was given.
        let given = auth.strip_prefix("Bearer ").unwrap_or("");
        return Err(openai_error(
            StatusCode::UNAUTHORIZED,
            &format!("Incorrect API key provided: {given}."),
        ));
    }
    let ct = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !ct.starts_with("application/json") {
        return Err(openai_error(
            StatusCode::BAD_REQUEST,
            "expected a JSON body",
        ));
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|_| openai_error(StatusCode::BAD_REQUEST, "We could not parse the JSON body"))?;
    let Some(obj) = v.as_object() else {
        return Err(openai_error(StatusCode::BAD_REQUEST, "expected an object"));
    };
    if let Some(k) = obj.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(openai_error(
            StatusCode::BAD_REQUEST,
            &format!("Unrecognized request argument supplied: {k}"),
        ));
    }
    for r in required {
        if obj
            .get(*r)
            .and_then(Value::as_str)
            .is_none_or(|s| s.trim().is_empty())
        {
            return Err(openai_error(
                StatusCode::BAD_REQUEST,
                &format!("Missing required parameter: '{r}'."),
            ));
        }
    }
    Ok(v)
}

/// A strict `/v1/audio/speech`: answers Ogg/Opus.
async fn speech_server() -> (String, Calls) {
    let calls: Calls = Arc::default();
    let c = calls.clone();
    let app = axum::Router::new().route(
        "/v1/audio/speech",
        post(
            move |headers: HeaderMap, body: axum::body::Bytes| async move {
                let v = match check_request(
                    &headers,
                    &body,
                    &[
                        "model",
                        "input",
                        "voice",
                        "response_format",
                        "speed",
                        "instructions",
                    ],
                    &["model", "input", "voice"],
                ) {
                    Ok(v) => v,
                    Err(e) => return e,
                };
                if v["input"].as_str().unwrap().chars().count() > 4096 {
                    return openai_error(StatusCode::BAD_REQUEST, "input is over 4096 characters");
                }
                let format = v["response_format"].as_str().unwrap_or("mp3");
                if !["mp3", "opus", "aac", "flac", "wav", "pcm"].contains(&format) {
                    return openai_error(StatusCode::BAD_REQUEST, "bad response_format");
                }
                c.lock().unwrap().push(v);
                let mut h = HeaderMap::new();
                h.insert("content-type", "audio/ogg".parse().unwrap());
                (StatusCode::OK, h, OGG.to_vec())
            },
        ),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    (base, calls)
}

/// A strict `/v1/images/generations`: answers `n` PNGs as `b64_json`.
async fn image_server() -> (String, Calls) {
    let calls: Calls = Arc::default();
    let c = calls.clone();
    let app = axum::Router::new().route(
        "/v1/images/generations",
        post(
            move |headers: HeaderMap, body: axum::body::Bytes| async move {
                let v = match check_request(
                    &headers,
                    &body,
                    &[
                        "model",
                        "prompt",
                        "n",
                        "size",
                        "quality",
                        "response_format",
                        "style",
                        "background",
                        "output_format",
                        "user",
                    ],
                    &["model", "prompt"],
                ) {
                    Ok(v) => v,
                    Err(e) => return e,
                };
                let n = v.get("n").map_or(Some(1), Value::as_u64);
                let Some(n) = n.filter(|n| (1..=10).contains(n)) else {
                    return openai_error(StatusCode::BAD_REQUEST, "n must be 1 to 10");
                };
                let size_ok = v.get("size").is_none_or(|s| {
                    s.as_str().is_some_and(|s| {
                        [
                            "auto",
                            "256x256",
                            "512x512",
                            "1024x1024",
                            "1536x1024",
                            "1024x1536",
                            "1792x1024",
                            "1024x1792",
                        ]
                        .contains(&s)
                    })
                });
                if !size_ok {
                    return openai_error(StatusCode::BAD_REQUEST, "Invalid size");
                }
                c.lock().unwrap().push(v);
                let b64 = base64::engine::general_purpose::STANDARD.encode(PNG);
                let data: Vec<Value> = (0..n).map(|_| json!({"b64_json": b64})).collect();
                let mut h = HeaderMap::new();
                h.insert("content-type", "application/json".parse().unwrap());
                (
                    StatusCode::OK,
                    h,
                    json!({"created": 1_795_000_000, "data": data})
                        .to_string()
                        .into_bytes(),
                )
            },
        ),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    (base, calls)
}

/// A key file holding `key`.
fn key_file(dir: &std::path::Path, key: &str) -> String {
    let p = dir.join("media.key");
    std::fs::write(&p, key).unwrap();
    p.to_str().unwrap().to_string()
}

/// The model finds `tool` with `tool_search`, calls it with `args`, then answers `reply`.
fn calling_model(llm: &FakeLlm, query: &str, tool: &str, args: Value, reply: &str) {
    llm.push(Reply::ToolCalls(vec![(
        "s1".into(),
        "tool_search".into(),
        json!({ "query": query }).to_string(),
    )]));
    llm.push(Reply::ToolCalls(vec![(
        "c1".into(),
        tool.into(),
        args.to_string(),
    )]));
    llm.push(Reply::Text(reply.into()));
}

/// The result of tool call `id` in the last request that has it.
fn result_of(llm: &FakeLlm, id: &str) -> Value {
    llm.requests()
        .iter()
        .rev()
        .find_map(|r| tool_results(r).into_iter().find(|(c, _)| c == id))
        .map(|(_, v)| v)
        .unwrap_or(Value::Null)
}

/// espeak-ng is installed: in CI it must be (`.ci/run` installs it); elsewhere a test without
/// it is skipped with the reason.
fn espeak() -> bool {
    if std::path::Path::new("/usr/bin/espeak-ng").exists() {
        return true;
    }
    assert!(
        std::env::var("CI").is_err(),
        "espeak-ng is not installed: apt-get install espeak-ng (.ci/run does)"
    );
    eprintln!("skipped: espeak-ng is not installed");
    false
}

#[tokio::test]
async fn tts_speech_arrives_as_a_telegram_voice_note_and_a_discord_and_slack_upload() {
    for name in ["telegram", "discord", "slack"] {
        let fake = Fake::start(name).await;
        let platform = fake.name();
        let (base, calls) = speech_server().await;
        let dir = tempfile::tempdir().unwrap();
        let llm = FakeLlm::start().await;
        calling_model(
            &llm,
            "text to speech: say it aloud as a voice note",
            "tts",
            json!({"text": "Good night, sleep well."}),
            "Here it is.",
        );
        let (section, _) = fake.section();
        let gw = TestGateway::start(config(
            &llm,
            dir.path(),
            json!({
                "channels": {platform: section},
                "media": {"tts": {"base_url": base, "model": "tts-1", "voice": "nova",
                    "api_key_file": key_file(dir.path(), KEY)}},
            }),
        ))
        .await;
        fake.push("say good night to me");
        assert!(
            wait_until(T, || !fake.uploads().is_empty()).await,
            "{platform}: {:?}",
            llm.requests().last()
        );
        let ups = fake.uploads();
        assert_eq!(ups.len(), 1, "{platform}");
        assert_eq!(ups[0].1, OGG, "{platform}");
        assert!(
            ups[0].0.starts_with("speech-") && ups[0].0.ends_with(".ogg"),
            "{platform}: {}",
            ups[0].0
        );
        assert!(
            wait_until(T, || !fake.texts("Here it is.").is_empty()).await,
            "{platform}"
        );
        if let Fake::Telegram(tg) = &fake {
            let u = &tg.uploads()[0];
            assert_eq!(
                (u.method.as_str(), u.field.as_str()),
                ("sendVoice", "voice")
            );
        }
        // The request the server took: the text, the model and voice configured, Ogg/Opus.
        let c = calls.lock().unwrap().clone();
        assert_eq!(c.len(), 1, "{platform}");
        assert_eq!(c[0]["input"], "Good night, sleep well.");
        assert_eq!(c[0]["model"], "tts-1");
        assert_eq!(c[0]["voice"], "nova");
        assert_eq!(c[0]["response_format"], "opus");
        // Found by the search (not in every request), and the transcript holds the path, not
        // the bytes.
        let found = result_of(&llm, "s1");
        assert!(found.to_string().contains("\"tts\""), "{found}");
        assert!(
            !llm.requests()[0]["tools"].to_string().contains("\"tts\""),
            "tts is offered on demand only"
        );
        let r = result_of(&llm, "c1");
        let path = r["path"].as_str().unwrap_or_default().to_string();
        assert!(path.starts_with("media/") && r["sent"] == true, "{r}");
        assert_eq!(
            std::fs::read(dir.path().join("ws").join(&path)).unwrap(),
            OGG
        );
        gw.stop().await;
    }
}

#[tokio::test]
async fn an_image_arrives_as_send_photo_and_as_uploads_with_its_prompt_and_paths_in_the_transcript()
{
    for name in ["telegram", "discord", "slack"] {
        let fake = Fake::start(name).await;
        let platform = fake.name();
        let (base, calls) = image_server().await;
        let dir = tempfile::tempdir().unwrap();
        let llm = FakeLlm::start().await;
        calling_model(
            &llm,
            "generate an image of something",
            "image",
            json!({"prompt": "a cat in a hat", "count": 2, "size": "1024x1024"}),
            "Two cats.",
        );
        let (section, _) = fake.section();
        let gw = TestGateway::start(config(
            &llm,
            dir.path(),
            json!({
                "channels": {platform: section},
                "media": {"images": {"base_url": base, "model": "gpt-image-1",
                    "api_key_file": key_file(dir.path(), KEY), "max_count": 3}},
            }),
        ))
        .await;
        fake.push("draw me two cats");
        assert!(
            wait_until(T, || fake.uploads().len() >= 2).await,
            "{platform}: {:?}",
            result_of(&llm, "c1")
        );
        assert!(
            wait_until(T, || !fake.texts("Two cats.").is_empty()).await,
            "{platform}"
        );
        let ups = fake.uploads();
        assert_eq!(ups.len(), 2, "{platform}");
        assert!(
            ups.iter().all(|u| u.1 == PNG && u.0.ends_with(".png")),
            "{platform}"
        );
        if let Fake::Telegram(tg) = &fake {
            assert!(tg.uploads().iter().all(|u| u.method == "sendPhoto"));
        }
        let c = calls.lock().unwrap().clone();
        assert_eq!(c.len(), 1);
        assert_eq!(
            (
                c[0]["prompt"].as_str(),
                c[0]["n"].as_u64(),
                c[0]["model"].as_str()
            ),
            (Some("a cat in a hat"), Some(2), Some("gpt-image-1"))
        );
        // Prompt and result in the transcript as text: paths, never the bytes.
        let b64 = base64::engine::general_purpose::STANDARD.encode(PNG);
        let all: String = llm.requests().iter().map(Value::to_string).collect();
        assert!(
            all.contains("a cat in a hat") && all.contains("media/"),
            "{all}"
        );
        assert!(!all.contains(&b64), "image bytes reached the model");
        gw.stop().await;
    }
}

#[tokio::test]
async fn images_count_against_the_budget_the_paid_ones_still_arrive_and_the_next_turn_is_refused() {
    let tg = FakeTelegram::start().await;
    let (base, _) = image_server().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::ToolCalls(vec![(
        "c1".into(),
        "image".into(),
        json!({"prompt": "two dogs", "count": 2}).to_string(),
    )]));
    llm.push(Reply::Text("Two dogs.".into()));
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({
            "channels": {"telegram": telegram(&tg)},
            "media": {"images": {"base_url": base, "model": "gpt-image-1",
                "api_key_file": key_file(dir.path(), KEY)}},
            "prices": {"gpt-image-1": {"image": 0.5}},
            "budgets": {"daily_usd": 1.0},
        }),
    ))
    .await;
    tg.push_user_message(111, 111, "draw two dogs");
    // Two images at US$0.50 reach the daily US$1.00: the turn stops before its next LLM call,
    // and the images paid for are delivered with the reason.
    assert!(
        wait_until(T, || shown_in(&tg, 111)
            .iter()
            .any(|t| t.contains("daily budget")))
        .await,
        "{:?}",
        shown_in(&tg, 111)
    );
    assert!(
        wait_until(T, || tg.uploads().len() == 2).await,
        "{}",
        tg.uploads().len()
    );
    assert_eq!(
        llm.requests().len(),
        1,
        "the LLM was called after the budget was reached"
    );
    tg.push_user_message(111, 111, "one more");
    assert!(
        wait_until(T, || shown_in(&tg, 111)
            .iter()
            .filter(|t| t.contains("daily budget"))
            .count()
            == 2)
        .await,
        "{:?}",
        shown_in(&tg, 111)
    );
    assert_eq!(
        llm.requests().len(),
        1,
        "the refused turn reached the model"
    );
    let r = gw
        .api
        .http
        .post(format!("{}/v1/admin/usage", gw.api.base))
        .json(&json!({"by": "model", "days": 1}))
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    let row = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == "gpt-image-1")
        .cloned();
    assert_eq!(
        row.as_ref().map(|r| r["cost_usd"].as_f64()),
        Some(Some(1.0)),
        "{v:#}"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_telegram_voice_note_is_answered_with_a_voice_note_spoken_by_espeak_ng() {
    if !espeak() {
        return;
    }
    let tg = FakeTelegram::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("Milk is on the list.".into()));
    llm.push(Reply::Text("Plain text this time.".into()));
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({
            "channels": {"telegram": telegram(&tg)},
            "agents": {"defaults": {"reply_with_voice": "to_voice"}},
            "prices": {"espeak-ng": {"characters": 1000.0}},
        }),
    ))
    .await;
    tg.push_voice(111, 111, b"OggS\x00\x02\x00\x00 a voice note", 2);
    assert!(
        wait_until(T, || !tg.uploads().is_empty()).await,
        "{:?}",
        tg.sent()
    );
    let u = tg.uploads().remove(0);
    // espeak-ng makes WAV; made Ogg/Opus by ffmpeg or opusenc it is a voice note, else the WAV
    // goes as a file (Telegram's music player takes only MP3 and M4A).
    let transcoder = [
        "/usr/bin/ffmpeg",
        "/usr/bin/opusenc",
        "/usr/local/bin/ffmpeg",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists());
    if transcoder {
        assert_eq!(u.method, "sendVoice");
        assert!(u.bytes.starts_with(b"OggS"));
        // Opus at speech rates: a few KB a second.
        assert!(u.bytes.len() > 2_000, "{} bytes of speech", u.bytes.len());
    } else {
        assert!(u.bytes.len() > 10_000, "{} bytes of speech", u.bytes.len());
        assert_eq!(u.method, "sendDocument");
        assert!(u.bytes.starts_with(b"RIFF") && &u.bytes[8..12] == b"WAVE");
        // The header carries the real length (espeak-ng's stdout header does not).
        let riff = u32::from_le_bytes(u.bytes[4..8].try_into().unwrap()) as usize;
        assert_eq!(riff, u.bytes.len() - 8);
    }
    // The text is kept alongside.
    assert!(
        wait_until(T, || shown_in(&tg, 111)
            .iter()
            .any(|t| t == "Milk is on the list."))
        .await
    );
    // A text message is answered with text only.
    tg.push_user_message(111, 111, "thanks");
    assert!(
        wait_until(T, || shown_in(&tg, 111)
            .iter()
            .any(|t| t == "Plain text this time."))
        .await
    );
    assert_eq!(tg.uploads().len(), 1);
    // The spoken characters count: "Milk is on the list." is 20 characters at US$1000 per million.
    let r = gw
        .api
        .http
        .post(format!("{}/v1/admin/usage", gw.api.base))
        .json(&json!({"by": "model", "days": 1}))
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    let row = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == "espeak-ng")
        .cloned()
        .unwrap_or_else(|| panic!("{v:#}"));
    assert_eq!(row["calls"], 1, "{row}");
    let usd = row["cost_usd"].as_f64().unwrap_or(-1.0);
    assert!((usd - 0.02).abs() < 1e-9, "{row}");
    gw.stop().await;
}

#[tokio::test]
async fn the_voice_command_turns_spoken_answers_on_and_off_per_chat() {
    if !espeak() {
        return;
    }
    let tg = FakeTelegram::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("First answer.".into()));
    llm.push(Reply::Text("Second answer.".into()));
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"channels": {"telegram": telegram(&tg)}}),
    ))
    .await;
    // Default `when_asked`: a voice note gets text.
    tg.push_voice(111, 111, b"OggS\x00\x02\x00\x00 one", 1);
    assert!(
        wait_until(T, || shown_in(&tg, 111)
            .iter()
            .any(|t| t == "First answer."))
        .await
    );
    tg.push_user_message(111, 111, "/voice to_voice");
    assert!(
        wait_until(T, || shown_in(&tg, 111)
            .iter()
            .any(|t| t.contains("Voice replies in this chat: to_voice")))
        .await,
        "{:?}",
        shown_in(&tg, 111)
    );
    tg.push_voice(111, 111, b"OggS\x00\x02\x00\x00 two", 1);
    assert!(
        wait_until(T, || shown_in(&tg, 111)
            .iter()
            .any(|t| t == "Second answer."))
        .await
    );
    assert!(
        wait_until(T, || tg.uploads().len() == 1).await,
        "{:?}",
        tg.uploads().len()
    );
    tg.push_user_message(111, 111, "/voice loud");
    assert!(
        wait_until(T, || shown_in(&tg, 111)
            .iter()
            .any(|t| t.contains("loud is not a voice setting")))
        .await
    );
    gw.stop().await;
}

#[tokio::test]
async fn without_a_backend_the_tools_say_what_to_configure_and_a_wrong_key_is_not_shown() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let (base, calls) = speech_server().await;
    let wrong = "sk-wrong-key-77d1e0aa93";
    llm.push(Reply::ToolCalls(vec![
        (
            "i1".into(),
            "image".into(),
            json!({"prompt": "a dog"}).to_string(),
        ),
        (
            "t1".into(),
            "tts".into(),
            json!({"text": "hello"}).to_string(),
        ),
    ]));
    llm.push(Reply::Text("No luck.".into()));
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"media": {"tts": {"base_url": base, "model": "tts-1",
            "api_key_file": key_file(dir.path(), wrong)}}}),
    ))
    .await;
    let (s, body) = gw.api.chat("nb", "draw and say").await;
    assert_eq!(s, 200, "{body}");
    let img = result_of(&llm, "i1").to_string();
    assert!(
        img.contains("no image backend is configured: set [media.images]"),
        "{img}"
    );
    let tts = result_of(&llm, "t1").to_string();
    assert!(tts.contains("the speech endpoint answered 401"), "{tts}");
    assert!(!tts.contains(wrong), "the key reached the model: {tts}");
    assert!(calls.lock().unwrap().is_empty());
    gw.stop().await;

    // No endpoint and the offline voice turned off: `tts` says what to configure.
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::ToolCalls(vec![(
        "t2".into(),
        "tts".into(),
        json!({"text": "hello"}).to_string(),
    )]));
    llm.push(Reply::Text("No voice.".into()));
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"media": {"tts": {"offline": false}}}),
    ))
    .await;
    let (s, body) = gw.api.chat("nb", "say hello").await;
    assert_eq!(s, 200, "{body}");
    let tts = result_of(&llm, "t2").to_string();
    assert!(tts.contains("no speech backend is configured"), "{tts}");
    gw.stop().await;
}

/// An image endpoint that answers with URLs: `/files/cat.png` on its own origin, then `other`.
async fn url_image_server(other: String) -> String {
    let app = axum::Router::new()
        .route(
            "/v1/images/generations",
            post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let other = other.clone();
                async move {
                    if let Err(e) = check_request(
                        &headers,
                        &body,
                        &["model", "prompt", "n", "size"],
                        &["model", "prompt"],
                    ) {
                        return e;
                    }
                    let host = headers.get("host").unwrap().to_str().unwrap().to_string();
                    let own = format!("http://{host}/files/cat.png");
                    let n = serde_json::from_slice::<Value>(&body).unwrap()["n"].as_u64();
                    let data = if n == Some(1) {
                        json!([{ "url": own }])
                    } else {
                        json!([{ "url": own }, { "url": other }])
                    };
                    let mut h = HeaderMap::new();
                    h.insert("content-type", "application/json".parse().unwrap());
                    (
                        StatusCode::OK,
                        h,
                        json!({ "data": data }).to_string().into_bytes(),
                    )
                }
            }),
        )
        .route(
            "/files/cat.png",
            axum::routing::get(|| async { PNG.to_vec() }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    base
}

#[tokio::test]
async fn an_image_url_on_the_endpoint_is_fetched_and_one_elsewhere_goes_through_the_ssrf_guard() {
    let (addr, hits) = crate::common::counting_listener().await;
    let base = url_image_server(format!("http://{addr}/steal.png")).await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::ToolCalls(vec![(
        "c1".into(),
        "image".into(),
        json!({"prompt": "a cat", "send": false}).to_string(),
    )]));
    llm.push(Reply::Text("one".into()));
    llm.push(Reply::ToolCalls(vec![(
        "c2".into(),
        "image".into(),
        json!({"prompt": "two cats", "count": 2}).to_string(),
    )]));
    llm.push(Reply::Text("two".into()));
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"media": {"images": {"base_url": base, "model": "dall-e-3",
            "api_key_file": key_file(dir.path(), KEY)}}}),
    ))
    .await;
    let (s, body) = gw.api.chat("u", "draw a cat").await;
    assert_eq!((s, body["reply"].as_str()), (200, Some("one")), "{body}");
    let r = result_of(&llm, "c1");
    let path = r["images"][0]["path"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(r["sent"], false, "{r}");
    assert_eq!(
        std::fs::read(dir.path().join("ws").join(&path)).unwrap(),
        PNG
    );
    // A URL the answer names on another origin (here loopback) is refused before connecting.
    let (s, body) = gw.api.chat("u", "draw two").await;
    assert_eq!(s, 200, "{body}");
    let r = result_of(&llm, "c2").to_string();
    assert!(
        r.contains("PERMISSION_DENIED") && r.contains("SSRF guard refuses: 127.0.0.1"),
        "{r}"
    );
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 0, "{r}");
    gw.stop().await;
}
