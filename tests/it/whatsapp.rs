//! WhatsApp end to end: the gateway with the real adapter, its webhooks on the gateway's HTTP
//! listener, against a fake of the Cloud API that signs its webhooks, retries them until they
//! are answered 200, and refuses what Meta refuses (wrong token, bad payloads, the 24-hour
//! window, rate limits).

use std::time::{Duration, Instant};

use base64::Engine as _;
use clawft_channel_whatsapp::fake::{Failure, FakeWhatsApp, PHONE_NUMBER_ID, TEMPLATE, TOKEN};
use serde_json::{json, Value};

use crate::common::{bytes_under, config, echo_model, messages, wait_until, TestGateway};
use crate::fake_llm::{FakeLlm, Reply};
use crate::platforms::{assert_in_order, long_reply};

const T: Duration = Duration::from_secs(30);
const USER: &str = "15550001111";
const STRANGER: &str = "15550002222";
const JPEG: &[u8] = b"\xFF\xD8\xFF\xE0\x00\x10JFIF\x00\x01 a small photo of a cat";
const PDF: &[u8] = b"%PDF-1.7\n weekly report";
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR a chart";

fn section(wa: &FakeWhatsApp, extra: Value) -> Value {
    let mut s = json!({
        "token": TOKEN,
        "app_secret": wa.app_secret(),
        "verify_token": wa.verify_token(),
        "phone_number_id": PHONE_NUMBER_ID,
        "api_url": wa.api_url(),
        "allow_from": [USER],
    });
    crate::common::merge(&mut s, extra);
    s
}

async fn start(
    wa: &FakeWhatsApp,
    llm: &FakeLlm,
    dir: &std::path::Path,
    extra: Value,
) -> TestGateway {
    let gw = TestGateway::start(config(
        llm,
        dir,
        json!({"channels": {"whatsapp": section(wa, extra)}}),
    ))
    .await;
    wa.set_webhook(format!("{}/whatsapp/whatsapp", gw.api.base));
    gw
}

fn count(sent: &[clawft_channel_whatsapp::fake::Sent], tag: &str) -> usize {
    sent.iter().map(|s| s.text.matches(tag).count()).sum()
}

/// A signed message reaches the model; the long reply arrives in order under 4,096 characters,
/// quoting the user's message, each chunk once although one was rate limited (130429) and
/// retried; the webhook was answered 200 only once journaled, and Meta's redelivery of it is
/// no second turn; the typing indicator marks the message read.
#[tokio::test]
async fn whatsapp_signed_message_in_long_reply_out_once_despite_rate_limit_and_redelivery() {
    let wa = FakeWhatsApp::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Delay(
        Duration::from_millis(600),
        Box::new(Reply::Text(long_reply())),
    ));
    let gw = start(&wa, &llm, dir.path(), json!({})).await;
    // The first chunk goes through, the second is refused for throughput: only the second is
    // sent again, after the delay.
    wa.fail_next(Failure::Succeed);
    wa.fail_next(Failure::Code(130_429));
    let started = Instant::now();
    let wamid = wa.push_text(USER, "tell me a **long** story");
    assert!(
        wait_until(T, || count(&wa.sent(), "para 29:") == 1).await,
        "{:?}",
        wa.sent()
    );
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "130429 not honoured"
    );
    let sent = wa.sent();
    assert!(sent.len() >= 3, "{sent:?}");
    assert!(sent
        .iter()
        .all(|s| s.to == USER && s.kind == "text" && s.text.chars().count() <= 4096));
    for i in 0..30 {
        assert_eq!(
            count(&sent, &format!("para {i:02}:")),
            1,
            "para {i} not once"
        );
    }
    let all: String = sent.iter().map(|s| s.text.as_str()).collect();
    assert_in_order(&all);
    assert_eq!(sent[0].context.as_deref(), Some(wamid.as_str()));
    assert!(sent[1..].iter().all(|s| s.context.is_none()));
    assert_eq!(wa.refused(), [130_429]);
    // The model saw the text as sent.
    assert_eq!(llm.requests().len(), 1);
    assert!(
        llm.requests()[0]
            .to_string()
            .contains("tell me a **long** story"),
        "{}",
        llm.requests()[0]
    );
    assert_eq!(wa.deliveries(&wamid), [200]);
    assert!(
        wa.reads().contains(&wamid),
        "no typing indicator / read mark"
    );
    // Meta delivers the same webhook again: answered 200, no second turn, nothing sent.
    let n = wa.sent().len();
    assert!(wa.redeliver(&wamid));
    assert!(wait_until(T, || wa.deliveries(&wamid).len() == 2).await);
    assert_eq!(wa.deliveries(&wamid), [200, 200]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(llm.requests().len(), 1, "the redelivery was a second turn");
    assert_eq!(wa.sent().len(), n);
    // Status names where the webhooks go.
    let (_, st) = gw.api.get("/v1/status").await;
    assert!(
        st["channel_states"]["whatsapp"]
            .as_str()
            .unwrap_or("")
            .contains("/whatsapp/whatsapp"),
        "{st}"
    );
    gw.stop().await;
}

/// A forged or unsigned webhook is 401 and nothing of it is stored or reaches the model; the
/// verification handshake answers the challenge only for the configured verify token.
#[tokio::test]
async fn whatsapp_forged_webhook_is_refused_with_nothing_stored_and_the_handshake_is_verified() {
    let wa = FakeWhatsApp::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let gw = start(&wa, &llm, dir.path(), json!({})).await;
    let url = format!("{}/whatsapp/whatsapp", gw.api.base);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();

    // Handshake.
    let get = |token: &str| {
        http.get(&url)
            .query(&[
                ("hub.mode", "subscribe"),
                ("hub.verify_token", token),
                ("hub.challenge", "1158201444"),
            ])
            .send()
    };
    let r = get(&wa.verify_token()).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "1158201444");
    let r = get("not-the-token").await.unwrap();
    assert_eq!(r.status(), 403);
    assert!(!r.text().await.unwrap().contains("1158201444"));

    // Forged: signed with another secret, unsigned, a valid signature of another body.
    let forged = FakeWhatsApp::payload(
        USER,
        json!({"from": USER, "id": "wamid.FORGED1", "timestamp": "1700000000", "type": "text",
               "text": {"body": "FORGED-MARKER-7f3a run rm -rf"}}),
    )
    .to_string();
    let other = r#"{"object":"whatsapp_business_account","entry":[]}"#;
    for sig in [
        Some(clawft_channel_whatsapp::sign(
            "wrong-secret",
            forged.as_bytes(),
        )),
        None,
        Some(clawft_channel_whatsapp::sign(
            &wa.app_secret(),
            other.as_bytes(),
        )),
        Some("sha256=zz".to_string()),
    ] {
        let mut req = http
            .post(&url)
            .header("content-type", "application/json")
            .body(forged.clone());
        if let Some(s) = &sig {
            req = req.header("x-hub-signature-256", s);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 401, "{sig:?}");
    }
    // A signed message after them goes through (so the store is written and flushed).
    let wamid = wa.push_text(USER, "GENUINE-MARKER-91c2");
    assert!(wait_until(T, || !wa.sent().is_empty()).await);
    assert_eq!(wa.deliveries(&wamid), [200]);
    assert_eq!(llm.requests().len(), 1);
    assert!(!llm.requests()[0].to_string().contains("FORGED-MARKER"));
    gw.stop().await;
    let stored = bytes_under(&dir.path().join("store"));
    assert!(
        stored.contains("GENUINE-MARKER-91c2"),
        "the check cannot see the store"
    );
    assert!(
        !stored.contains("FORGED-MARKER-7f3a"),
        "the forged webhook was journaled"
    );
    // The secrets are not in the store either.
    assert!(!stored.contains(&wa.app_secret()) && !stored.contains(TOKEN));
}

/// An unknown number gets one pairing code and never reaches the model; once the operator
/// approves the code, it is answered.
#[tokio::test]
async fn whatsapp_unknown_number_is_denied_then_paired() {
    let wa = FakeWhatsApp::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let gw = start(&wa, &llm, dir.path(), json!({"pairing": true})).await;
    let w1 = wa.push_text(STRANGER, "let me in");
    assert!(
        wait_until(T, || !wa.sent().is_empty()).await,
        "{:?} {:?}",
        wa.deliveries(&w1),
        wa.refused()
    );
    // Refused, but acknowledged: Meta does not retry it.
    assert!(wait_until(T, || wa.deliveries(&w1) == [200]).await);
    let sent = wa.sent();
    assert_eq!(sent[0].to, STRANGER);
    let code = sent[0]
        .text
        .split("pairing approve ")
        .nth(1)
        .expect("a pairing code")
        .split(|c: char| !c.is_ascii_alphanumeric())
        .next()
        .unwrap()
        .to_string();
    assert_eq!(llm.requests().len(), 0, "the stranger reached the model");
    let r = gw
        .api
        .http
        .post(format!("{}/v1/admin/pairing/approve", gw.api.base))
        .json(&json!({ "code": code }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    wa.push_text(STRANGER, "hello now");
    assert!(
        wait_until(T, || wa
            .sent()
            .iter()
            .any(|s| s.text.contains("answer: hello now")))
        .await,
        "{:?}",
        wa.sent()
    );
    assert_eq!(llm.requests().len(), 1);
    gw.stop().await;
}

/// A photo in reaches the model as an image (downloaded through the media id with the access
/// token); files out are uploaded and sent by id, a PNG as an image and a PDF as a document.
#[tokio::test]
async fn whatsapp_media_in_and_out() {
    let wa = FakeWhatsApp::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join("charts")).unwrap();
    std::fs::write(ws.join("report.pdf"), PDF).unwrap();
    std::fs::write(ws.join("charts/week.png"), PNG).unwrap();
    let llm = FakeLlm::start().await;
    llm.strict(None);
    llm.push(Reply::Text(
        "A cat. Here are the files.\nMEDIA: charts/week.png\nMEDIA: report.pdf".into(),
    ));
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"agents": {"defaults": {"vision": "on"}}, "channels": {"whatsapp": section(&wa, json!({}))}}),
    ))
    .await;
    wa.set_webhook(format!("{}/whatsapp/whatsapp", gw.api.base));
    wa.push_media(USER, "image", "image/jpeg", JPEG, "what is this?");
    assert!(
        wait_until(T, || wa.sent().len() >= 3).await,
        "{:?} {:?}",
        wa.sent(),
        llm.requests()
    );
    let req = &llm.requests()[0];
    let user = messages(req).last().cloned().unwrap();
    let parts = user["content"].as_array().expect("content parts").clone();
    assert!(parts[0]["text"]
        .as_str()
        .unwrap()
        .starts_with("what is this?"));
    let data = parts[1]["image_url"]["url"]
        .as_str()
        .unwrap()
        .strip_prefix("data:image/jpeg;base64,")
        .unwrap();
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap(),
        JPEG
    );
    let sent = wa.sent();
    assert_eq!(sent[0].kind, "text");
    assert!(sent[0].text.starts_with("A cat."), "{sent:?}");
    assert_eq!(sent[1].kind, "image");
    assert_eq!(wa.media(sent[1].media_id.as_ref().unwrap()).unwrap().2, PNG);
    assert_eq!(sent[2].kind, "document");
    assert_eq!(sent[2].filename.as_deref(), Some("report.pdf"));
    assert_eq!(wa.media(sent[2].media_id.as_ref().unwrap()).unwrap().2, PDF);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(wa.sent().len(), 3, "a file was sent twice");
    assert_eq!(wa.unauthorized(), 0);
    gw.stop().await;
}

/// A reply after the 24-hour window: the configured template goes instead, once; without a
/// template the reply fails for good (no endless retries) and nothing is sent.
#[tokio::test]
async fn whatsapp_outside_the_window_sends_the_template_or_fails_clearly() {
    for template in [true, false] {
        let wa = FakeWhatsApp::start().await;
        let dir = tempfile::tempdir().unwrap();
        let llm = FakeLlm::start().await;
        llm.push(Reply::Delay(
            Duration::from_millis(500),
            Box::new(Reply::Text("late answer".into())),
        ));
        let extra = if template {
            json!({"template": TEMPLATE, "template_language": "en_US"})
        } else {
            json!({})
        };
        let gw = start(&wa, &llm, dir.path(), extra).await;
        let wamid = wa.push_text(USER, "question");
        assert!(wait_until(T, || wa.deliveries(&wamid) == [200]).await);
        // The user's window closes before the answer is ready.
        wa.close_window(USER);
        if template {
            assert!(
                wait_until(T, || !wa.sent().is_empty()).await,
                "{:?}",
                wa.refused()
            );
            let sent = wa.sent();
            assert_eq!(sent[0].kind, "template");
            assert_eq!(sent[0].template.as_deref(), Some(TEMPLATE));
        } else {
            assert!(
                wait_until(T, || wa.refused() == [131_047]).await,
                "{:?} {:?}",
                wa.refused(),
                wa.sent()
            );
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(wa.refused(), [131_047], "retried after a permanent refusal");
        assert_eq!(wa.sent().len(), usize::from(template), "{:?}", wa.sent());
        gw.stop().await;
    }
}

/// HTTP 429 with Retry-After (80007) pauses the chat as long as asked, then the reply goes.
#[tokio::test]
async fn whatsapp_http_429_is_honoured() {
    let wa = FakeWhatsApp::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let gw = start(&wa, &llm, dir.path(), json!({})).await;
    wa.fail_next(Failure::Http429 {
        retry_after_secs: 2,
    });
    let started = Instant::now();
    wa.push_text(USER, "hi");
    assert!(wait_until(T, || !wa.sent().is_empty()).await);
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "Retry-After not honoured"
    );
    assert_eq!(wa.sent().len(), 1);
    assert_eq!(wa.refused(), [80_007]);
    gw.stop().await;
}

/// Exactly once across `kill -9`: the real `weft` kills itself before the send, after the
/// Graph API accepted the reply (its wamid journaled, the outbox entry not yet removed) and
/// after the outbox removal; restarted on the same store, the chat shows the answer once.
#[tokio::test]
async fn whatsapp_kill_9_at_every_point_of_the_send_path_shows_one_reply() {
    use std::os::unix::process::ExitStatusExt;

    use crate::common::config_value;
    use crate::process::{free_port, log_of, weft, write_config, Daemon};
    const ANSWER: &str = "the one and only answer";
    for (point, shown_before) in [
        ("egress.before_send", 0),
        ("egress.after_send", 1),
        ("egress.after_mark", 1),
    ] {
        let wa = FakeWhatsApp::start().await;
        let dir = tempfile::tempdir().unwrap();
        let llm = FakeLlm::start().await;
        let port = free_port();
        let cfg = write_config(
            dir.path(),
            &config_value(
                &llm.base_url(),
                dir.path(),
                json!({"channels": {"http": {"bind": format!("127.0.0.1:{port}")}, "whatsapp": section(&wa, json!({}))}}),
            ),
        );
        wa.set_webhook(format!("http://127.0.0.1:{port}/whatsapp/whatsapp"));
        llm.push(Reply::Text(ANSWER.into()));
        let log = std::fs::File::create(dir.path().join("gateway.log")).unwrap();
        let mut child = weft(dir.path())
            .env("WEFT_FAULT", point)
            .arg("--config")
            .arg(&cfg)
            .arg("gateway")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let ready = format!("http://127.0.0.1:{port}/readyz");
        let mut up = false;
        for _ in 0..600 {
            if http
                .get(&ready)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                up = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(up, "not ready\n{}", log_of(dir.path()));
        let wamid = wa.push_text(USER, "are you there?");
        let mut status = None;
        for _ in 0..1500 {
            if let Some(st) = child.try_wait().unwrap() {
                status = Some(st);
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let Some(status) = status else {
            let _ = child.kill();
            panic!("{point} never reached\n{}", log_of(dir.path()));
        };
        assert_eq!(
            status.signal(),
            Some(9),
            "{status:?}\n{}",
            log_of(dir.path())
        );
        assert_eq!(wa.sent().len(), shown_before, "{point}: {:?}", wa.sent());
        // The webhook was answered 200 before the death (the event was journaled).
        assert_eq!(wa.deliveries(&wamid), [200], "{point}");

        let d = Daemon::start(dir.path(), &cfg, port).await;
        assert!(
            wait_until(T, || wa.sent().iter().any(|s| s.text.contains(ANSWER))).await,
            "{point}: no answer after the restart: {:?}\n{}",
            wa.sent(),
            log_of(dir.path())
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            wa.sent().len(),
            1,
            "{point}: the chat shows {:?}\n{}",
            wa.sent(),
            log_of(dir.path())
        );
        assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));
    }
}

/// A bad `channels.whatsapp` is refused at load with the key named.
#[test]
fn whatsapp_bad_configuration_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let base = json!({"token": "t", "app_secret": "s", "verify_token": "v", "phone_number_id": "1065", "allow_from": ["15550001111"]});
    for (patch, key, words) in [
        (
            json!({"phone_number_id": "+1 555 0001"}),
            "channels.whatsapp.phone_number_id",
            "phone number's id",
        ),
        (
            json!({"app_secret": null}),
            "channels.whatsapp.app_secret",
            "app secret",
        ),
        (
            json!({"verify_token": null}),
            "channels.whatsapp.verify_token",
            "verify token",
        ),
        (
            json!({"allow_from": ["+15550001111"]}),
            "channels.whatsapp.allow_from",
            "without `+`",
        ),
        (
            json!({"template": "Reply Waiting"}),
            "channels.whatsapp.template",
            "lower-case",
        ),
        (
            json!({"template_language": "de"}),
            "channels.whatsapp.template_language",
            "not set",
        ),
        (
            json!({"api_version": "21"}),
            "channels.whatsapp.api_version",
            "v21.0",
        ),
    ] {
        let mut section = base.clone();
        crate::common::merge(&mut section, patch);
        let section: serde_json::Map<String, Value> = section
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let v = crate::common::config_value(
            "http://127.0.0.1:9/v1",
            dir.path(),
            json!({"channels": {"whatsapp": section}}),
        );
        let e = clawft::config::Config::from_str(
            &v.to_string(),
            false,
            &crate::common::test_env(dir.path()),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains(key) && e.contains(words), "{key}: {e}");
    }
    // Webhooks need the HTTP listener.
    let v = crate::common::config_value(
        "http://127.0.0.1:9/v1",
        dir.path(),
        json!({"channels": {"http": {"enabled": false}, "whatsapp": base}}),
    );
    let e = clawft::config::Config::from_str(
        &v.to_string(),
        false,
        &crate::common::test_env(dir.path()),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("channels.whatsapp.enabled") && e.contains("channels.http.enabled"),
        "{e}"
    );
    // The WhatsApp keys belong to WhatsApp.
    let v = crate::common::config_value(
        "http://127.0.0.1:9/v1",
        dir.path(),
        json!({"channels": {"telegram": {"token": "1:a", "allow_from": [1], "phone_number_id": "1"}}}),
    );
    let e = clawft::config::Config::from_str(
        &v.to_string(),
        false,
        &crate::common::test_env(dir.path()),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("channels.telegram.phone_number_id"), "{e}");
}

/// An oversized message is refused before it is stored (the sender is told, the model never
/// sees it) and acknowledged to Meta; a stranger without pairing gets nothing at all.
#[tokio::test]
async fn whatsapp_oversized_message_and_stranger_are_refused_with_nothing_stored() {
    let wa = FakeWhatsApp::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let gw = start(&wa, &llm, dir.path(), json!({})).await;
    let big = format!("OVERSIZED-MARKER {}", "x".repeat(40 * 1024));
    let w1 = wa.push_text(USER, &big);
    let w2 = wa.push_text(STRANGER, "STRANGER-MARKER hello");
    assert!(wait_until(T, || !wa.sent().is_empty()).await);
    assert!(
        wait_until(T, || wa.deliveries(&w1) == [200]
            && wa.deliveries(&w2) == [200])
        .await
    );
    let sent = wa.sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].to, USER);
    assert!(sent[0].text.contains("over the 32 KB limit"), "{sent:?}");
    // A normal message afterwards is answered (and flushes the store).
    wa.push_text(USER, "small one");
    assert!(
        wait_until(T, || wa
            .sent()
            .iter()
            .any(|s| s.text.contains("answer: small one")))
        .await
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(wa.sent().iter().filter(|s| s.to == STRANGER).count(), 0);
    assert_eq!(llm.requests().len(), 1);
    gw.stop().await;
    let stored = bytes_under(&dir.path().join("store"));
    assert!(stored.contains("small one"));
    assert!(!stored.contains("OVERSIZED-MARKER") && !stored.contains("STRANGER-MARKER"));
}

/// Meta's retries cover a gateway that is down: the webhook fails while nothing listens and
/// is answered 200 once the gateway runs and journaled it; the message gets its one reply.
#[tokio::test]
async fn whatsapp_webhook_retried_until_the_gateway_journals_it() {
    let wa = FakeWhatsApp::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    echo_model(&llm);
    let port = crate::process::free_port();
    wa.set_webhook(format!("http://127.0.0.1:{port}/whatsapp/whatsapp"));
    let wamid = wa.push_text(USER, "sent while you were down");
    assert!(wait_until(T, || !wa.deliveries(&wamid).is_empty()).await);
    assert_ne!(wa.deliveries(&wamid)[0], 200);
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"channels": {"http": {"bind": format!("127.0.0.1:{port}")}, "whatsapp": section(&wa, json!({}))}}),
    ))
    .await;
    assert!(
        wait_until(T, || wa
            .sent()
            .iter()
            .any(|s| s.text.contains("answer: sent while you were down")))
        .await,
        "{:?}",
        wa.deliveries(&wamid)
    );
    assert_eq!(wa.deliveries(&wamid).last(), Some(&200));
    assert_eq!(
        wa.deliveries(&wamid).iter().filter(|s| **s == 200).count(),
        1
    );
    assert_eq!(llm.requests().len(), 1);
    gw.stop().await;
}

/// `weft doctor` checks the access token against the phone number, and says which key to fix
/// without showing the token.
#[tokio::test]
async fn whatsapp_doctor_checks_the_token() {
    let wa = FakeWhatsApp::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    for (token, level) in [(TOKEN, "ok"), ("EAAG-expired-token-1234", "fail")] {
        let cfg = config(
            &llm,
            dir.path(),
            json!({"channels": {"whatsapp": section(&wa, json!({"token": token}))}}),
        );
        let findings = clawft::cli::doctor::check(&cfg).await.unwrap();
        let f = findings
            .iter()
            .find(|f| f.check == "channel whatsapp" && f.level != "warn")
            .unwrap_or_else(|| {
                panic!(
                    "{:?}",
                    findings.iter().map(|f| &f.check).collect::<Vec<_>>()
                )
            });
        assert_eq!(f.level, level, "{}", f.detail);
        if level == "ok" {
            assert!(f.detail.contains("Test Business"), "{}", f.detail);
        } else {
            assert!(f.detail.contains("channels.whatsapp.token"), "{}", f.detail);
            assert!(!f.detail.contains(token), "{}", f.detail);
        }
    }
}
