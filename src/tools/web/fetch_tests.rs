//! `web_fetch` tests: the SSRF guard end to end (canary listeners), redirects, bodies and
//! their decoding, settings.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap as AxHeaders, Method as AxMethod, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use tokio::net::TcpListener;

use super::*;
use crate::tools::web::test_support::{ctx, silent_server};
use crate::tools::web::{WebSearch, WebSearchSettings};

/// Listeners on 127.0.0.1 (and [::1] when it binds) that count accepted connections.
struct Canary {
    port: u16,
    v6_port: Option<u16>,
    hits: Arc<AtomicUsize>,
}

async fn canary() -> Canary {
    let hits = Arc::new(AtomicUsize::new(0));
    let l4 = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l4.local_addr().unwrap().port();
    let l6 = match TcpListener::bind(("::1", port)).await {
        Ok(l) => Some(l),
        Err(_) => TcpListener::bind("[::1]:0").await.ok(),
    };
    let v6_port = l6.as_ref().map(|l| l.local_addr().unwrap().port());
    for l in std::iter::once(l4).chain(l6) {
        let hits = hits.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                hits.fetch_add(1, Ordering::SeqCst);
                drop(s);
            }
        });
    }
    Canary {
        port,
        v6_port,
        hits,
    }
}

/// One request seen by the echo route: method, headers, body.
type Recorded = (String, HashMap<String, String>, String);

#[derive(Clone, Default)]
struct Seen {
    requests: Arc<Mutex<Vec<Recorded>>>,
}

fn chunked(total: Option<usize>) -> Body {
    let chunk = Bytes::from(vec![b'a'; 64 * 1024]);
    let stream = futures::stream::unfold(0usize, move |sent| {
        let chunk = chunk.clone();
        async move {
            match total {
                Some(t) if sent >= t => None,
                _ => Some((Ok::<_, std::io::Error>(chunk.clone()), sent + chunk.len())),
            }
        }
    });
    Body::from_stream(stream)
}

fn redirect(to: &str) -> Response {
    (StatusCode::FOUND, [("location", to.to_string())]).into_response()
}

/// The allowed test server on 127.0.0.2.
async fn server() -> (SocketAddr, Seen) {
    let seen = Seen::default();
    let app = Router::new()
        .route(
            "/page",
            get(|| async {
                (
                    [("content-type", "text/html; charset=utf-8")],
                    "<html><head><title>x</title><script>var TOKEN = 'SCRIPT_ONLY';</script></head>\
                     <body><h1>Title</h1><p>Read the <a href=\"/docs\">docs page</a> now.</p></body></html>",
                )
            }),
        )
        .route(
            "/untyped",
            get(|| async {
                Response::builder()
                    .body(Body::from("<!doctype html><p>sniffed <b>html</b></p>"))
                    .unwrap()
            }),
        )
        .route(
            "/unicode",
            get(|| async {
                (
                    [("content-type", "text/plain; charset=utf-8")],
                    "héllo 世界 🌍 — ok",
                )
            }),
        )
        .route(
            "/latin1",
            get(|| async {
                (
                    [("content-type", "text/plain; charset=ISO-8859-1")],
                    Bytes::from_static(b"caf\xe9 \x80"),
                )
            }),
        )
        .route(
            "/image",
            get(|| async { ([("content-type", "image/png")], vec![0x89u8, b'P', b'N', b'G', 0, 0, 1, 2]) }),
        )
        .route("/empty", get(|| async { ([("content-type", "text/plain")], "") }))
        .route("/missing", get(|| async { (StatusCode::NOT_FOUND, "no such page") }))
        .route(
            "/big",
            get(|| async { ([("content-type", "text/plain")], chunked(Some(12 * 1024 * 1024))) }),
        )
        .route(
            "/trickle",
            get(|| async {
                let first = futures::stream::once(async {
                    Ok::<_, std::io::Error>(Bytes::from_static(b"first part of a slow page"))
                });
                // Then nothing more, ever: the connection stays open.
                let rest = futures::stream::pending();
                (
                    [("content-type", "text/plain")],
                    Body::from_stream(futures::StreamExt::chain(first, rest)),
                )
            }),
        )
        .route(
            "/endless",
            get(|| async { ([("content-type", "text/plain")], chunked(None)) }),
        )
        .route(
            "/redir",
            get(|Query(q): Query<HashMap<String, String>>| async move {
                redirect(q.get("to").map_or("/", String::as_str))
            }),
        )
        .route(
            "/hop/{n}",
            get(|Path(n): Path<u32>| async move {
                if n == 0 {
                    "done".into_response()
                } else {
                    redirect(&format!("/hop/{}", n - 1))
                }
            }),
        )
        .route(
            "/echo",
            any(
                |State(seen): State<Seen>, m: AxMethod, h: AxHeaders, body: Bytes| async move {
                    let headers = h
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
                        .collect();
                    let body = String::from_utf8_lossy(&body).into_owned();
                    seen.requests.lock().unwrap().push((m.to_string(), headers, body));
                    ([("content-type", "application/json")], r#"{"ok":true}"#)
                },
            ),
        )
        .route(
            "/see-other",
            any(|| async {
                (StatusCode::SEE_OTHER, [("location", "/echo")]).into_response()
            }),
        )
        .with_state(seen.clone());
    let l = TcpListener::bind("127.0.0.2:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    (addr, seen)
}

fn settings() -> WebFetchSettings {
    WebFetchSettings {
        allow_private: vec!["127.0.0.2/32".parse().unwrap()],
        ..WebFetchSettings::default()
    }
}

fn fetcher(s: WebFetchSettings) -> WebFetch {
    WebFetch::new(s).unwrap()
}

fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

#[tokio::test]
async fn loopback_spellings_and_redirects_never_connect() {
    let c = ctx();
    let canary = canary().await;
    let (srv, _) = server().await;
    let tool = fetcher(settings());
    let p = canary.port;
    let mut targets: Vec<String> = [
        "http://127.0.0.1:{P}/",
        "http://2130706433:{P}/",
        "http://0x7f000001:{P}/",
        "http://0x7f.1:{P}/",
        "http://0177.0.0.1:{P}/",
        "http://127.1:{P}/",
        "http://127.0.0.1.:{P}/",
        "http://[::ffff:127.0.0.1]:{P}/",
        "http://[::127.0.0.1]:{P}/",
        "http://[64:ff9b::7f00:1]:{P}/",
        "http://localhost:{P}/",
        "http://LOCALHOST.:{P}/",
        "https://127.0.0.1:{P}/",
    ]
    .iter()
    .map(|t| t.replace("{P}", &p.to_string()))
    .collect();
    if let Some(p6) = canary.v6_port {
        targets.push(format!("http://[::1]:{p6}/"));
        targets.push(format!("http://[0:0:0:0:0:0:0:1]:{p6}/"));
    }
    let mut all = targets.clone();
    for t in &targets {
        all.push(format!("http://{srv}/redir?to={}", enc(t)));
    }
    // A redirect chain that ends on loopback after an allowed hop.
    all.push(format!(
        "http://{srv}/redir?to={}",
        enc(&format!("/redir?to={}", enc(&targets[0])))
    ));
    for u in &all {
        let e = tool
            .execute(json!({ "url": u }), &c.ctx)
            .await
            .expect_err(u);
        assert_eq!(e.code(), "PERMISSION_DENIED", "{u}: {e}");
        assert!(
            e.to_string().contains("tools.web_fetch.allow_private"),
            "{e}"
        );
    }
    assert_eq!(
        canary.hits.load(Ordering::SeqCst),
        0,
        "a blocked target was dialled"
    );
}

#[tokio::test]
async fn canary_detects_connections_when_allowed() {
    // Positive control: the same canary counts a connection when policy allows it, so the
    // zero above means "not dialled", not "canary broken".
    let c = ctx();
    let canary = canary().await;
    let tool = fetcher(WebFetchSettings {
        allow_private: vec!["127.0.0.0/8".parse().unwrap()],
        timeout: Duration::from_secs(2),
        ..WebFetchSettings::default()
    });
    let e = tool
        .execute(
            json!({"url": format!("http://localhost:{}/", canary.port)}),
            &c.ctx,
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), "EXECUTION_FAILED", "{e}");
    assert_eq!(canary.hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn rebinding_dns_only_dials_checked_addresses() {
    // A hostile DNS server: answers alternate between loopback only, and loopback mixed
    // with the allowed 127.0.0.2. Whatever it says, only 127.0.0.2 is ever dialled.
    let c = ctx();
    let canary = canary().await;
    let (srv, _) = server().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let calls2 = calls.clone();
    let lookup = Arc::new(move |_h: String| {
        let n = calls2.fetch_add(1, Ordering::SeqCst);
        let answer: Vec<SocketAddr> = if n.is_multiple_of(2) {
            vec!["127.0.0.1:0".parse().unwrap()]
        } else {
            vec![
                "127.0.0.1:0".parse().unwrap(),
                "127.0.0.2:0".parse().unwrap(),
                "[::1]:0".parse().unwrap(),
            ]
        };
        Box::pin(async move { Ok(answer) }) as _
    });
    let s = settings();
    let client = GuardedClient::with_lookup(
        SsrfPolicy::new(s.allow_private.clone()),
        s.max_redirects,
        Duration::from_secs(2),
        &s.user_agent,
        lookup,
    )
    .unwrap();
    let tool = WebFetch::with_client(client, s.max_bytes, s.timeout);
    let port = srv.port();
    for i in 0..6 {
        let r = tool
            .execute(
                json!({"url": format!("http://rebind.test:{port}/unicode")}),
                &c.ctx,
            )
            .await;
        let reached = matches!(&r, Ok(v) if v["status"] == 200);
        let denied = matches!(&r, Err(e) if e.code() == "PERMISSION_DENIED");
        assert!(reached || denied, "attempt {i}: {r:?}");
    }
    assert!(calls.load(Ordering::SeqCst) >= 2);
    assert_eq!(canary.hits.load(Ordering::SeqCst), 0);
    // Same port on the canary address: a bypass would have hit it.
    let lookup_canary = Arc::new(move |_h: String| {
        Box::pin(async move { Ok(vec!["127.0.0.1:0".parse().unwrap()]) }) as _
    });
    let client = GuardedClient::with_lookup(
        SsrfPolicy::new(s.allow_private.clone()),
        5,
        Duration::from_secs(2),
        &s.user_agent,
        lookup_canary,
    )
    .unwrap();
    let tool = WebFetch::with_client(client, s.max_bytes, s.timeout);
    let e = tool
        .execute(
            json!({"url": format!("http://evil.test:{}/", canary.port)}),
            &c.ctx,
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), "PERMISSION_DENIED", "{e}");
    assert_eq!(canary.hits.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn metadata_names_are_refused_without_dns() {
    let c = ctx();
    let tool = fetcher(WebFetchSettings {
        allow_private: vec!["0.0.0.0/0".parse().unwrap(), "::/0".parse().unwrap()],
        ..WebFetchSettings::default()
    });
    for u in [
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://metadata.google.internal./",
        "http://METADATA/",
        "http://metadata.goog/",
        "http://instance-data/latest/meta-data/",
    ] {
        let e = tool.execute(json!({ "url": u }), &c.ctx).await.unwrap_err();
        assert_eq!(e.code(), "PERMISSION_DENIED", "{u}: {e}");
        assert!(e.to_string().contains("metadata"), "{e}");
    }
    assert_eq!(tool.client.resolver().lookups(), 0, "no DNS query was made");
    // The metadata address itself (not allowed here) is refused before any connection.
    let strict = fetcher(WebFetchSettings::default());
    let e = strict
        .execute(
            json!({"url": "http://169.254.169.254/latest/meta-data/"}),
            &c.ctx,
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), "PERMISSION_DENIED");
    assert!(e.to_string().contains("cloud metadata"), "{e}");
}

#[tokio::test]
async fn redirect_limit_and_schemes() {
    let c = ctx();
    let (srv, _) = server().await;
    let tool = fetcher(settings());
    let v = tool
        .execute(json!({"url": format!("http://{srv}/hop/5")}), &c.ctx)
        .await
        .unwrap();
    assert_eq!(v["status"], 200);
    assert_eq!(v["body"], "done");
    assert_eq!(v["url"], format!("http://{srv}/hop/0"));
    let e = tool
        .execute(json!({"url": format!("http://{srv}/hop/6")}), &c.ctx)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "EXECUTION_FAILED");
    assert!(e.to_string().contains("more than 5 redirects"), "{e}");

    for u in [
        "file:///etc/passwd",
        "ftp://127.0.0.2/x",
        "gopher://127.0.0.2/",
        "not a url",
        "",
    ] {
        let e = tool.execute(json!({ "url": u }), &c.ctx).await.unwrap_err();
        assert_eq!(e.code(), "INVALID_ARGS", "{u}: {e}");
    }
    for to in ["file:///etc/passwd", "ftp://127.0.0.2/"] {
        let e = tool
            .execute(
                json!({"url": format!("http://{srv}/redir?to={}", enc(to))}),
                &c.ctx,
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), "EXECUTION_FAILED", "{to}: {e}");
        assert!(e.to_string().contains("only http and https"), "{e}");
    }
}

#[tokio::test]
async fn html_text_unicode_binary_and_status() {
    let c = ctx();
    let (srv, _) = server().await;
    let tool = fetcher(settings());
    let get = |path: &str| {
        let url = format!("http://{srv}{path}");
        let tool = &tool;
        let ctx = &c.ctx;
        async move { tool.execute(json!({ "url": url }), ctx).await.unwrap() }
    };
    let v = get("/page").await;
    let body = v["body"].as_str().unwrap();
    assert_eq!(
        body,
        format!("# Title\n\nRead the docs page (http://{srv}/docs) now.")
    );
    assert!(!body.contains("SCRIPT_ONLY"));
    assert_eq!(v["content_type"], "text/html; charset=utf-8");
    assert_eq!(v["truncated"], false);

    let v = get("/untyped").await;
    assert_eq!(v["body"], "sniffed html");

    let v = get("/unicode").await;
    assert_eq!(v["body"], "héllo 世界 🌍 — ok");
    assert_eq!(v["bytes"], "héllo 世界 🌍 — ok".len());

    let v = get("/latin1").await;
    assert_eq!(v["body"], "café €");

    let v = get("/image").await;
    let body = v["body"].as_str().unwrap();
    assert!(
        body.starts_with("[binary content: image/png, 8 bytes"),
        "{body}"
    );
    assert!(!body.contains("PNG"));

    let v = get("/empty").await;
    assert_eq!(
        (v["body"].as_str(), v["bytes"].as_u64()),
        (Some(""), Some(0))
    );

    let v = get("/missing").await;
    assert_eq!(v["status"], 404);
    assert_eq!(v["body"], "no such page");

    let v = tool
        .execute(
            json!({"url": format!("http://{srv}/page"), "method": "HEAD"}),
            &c.ctx,
        )
        .await
        .unwrap();
    assert_eq!(
        (v["status"].as_u64(), v["body"].as_str()),
        (Some(200), Some(""))
    );
}

#[tokio::test]
async fn large_bodies_are_cut_while_streaming() {
    let c = ctx();
    let (srv, _) = server().await;
    let tool = fetcher(settings());
    let v = tool
        .execute(json!({"url": format!("http://{srv}/big")}), &c.ctx)
        .await
        .unwrap();
    let suffix = format!("\n... [truncated: body exceeded {DEFAULT_MAX_BYTES} bytes]");
    let body = v["body"].as_str().unwrap();
    assert!(body.ends_with(&suffix));
    assert_eq!(body.len(), DEFAULT_MAX_BYTES + suffix.len());
    assert_eq!(v["bytes"], DEFAULT_MAX_BYTES);
    assert_eq!(v["truncated"], true);

    // An endless body: only a streaming reader that stops at the cap returns at all.
    let tool = fetcher(WebFetchSettings {
        max_bytes: 1024 * 1024,
        timeout: Duration::from_secs(5),
        ..settings()
    });
    let t = Instant::now();
    let v = tool
        .execute(json!({"url": format!("http://{srv}/endless")}), &c.ctx)
        .await
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(4));
    assert_eq!(v["truncated"], true);
    assert_eq!(v["bytes"], 1024 * 1024);
}

#[tokio::test]
async fn post_with_headers_and_body_reaches_the_server() {
    let c = ctx();
    let (srv, seen) = server().await;
    let tool = fetcher(settings());
    let v = tool
        .execute(
            json!({
                "url": format!("http://{srv}/echo"),
                "method": "POST",
                "headers": {"X-Test": "yes", "Content-Type": "application/json"},
                "body": "{\"q\": \"ünïcode\"}",
            }),
            &c.ctx,
        )
        .await
        .unwrap();
    assert_eq!(v["status"], 200);
    assert_eq!(v["body"], r#"{"ok":true}"#);
    {
        let reqs = seen.requests.lock().unwrap();
        let (m, h, b) = &reqs[0];
        assert_eq!(m, "POST");
        assert_eq!(h["x-test"], "yes");
        assert_eq!(h["content-type"], "application/json");
        assert!(h["user-agent"].starts_with("clawft/"));
        assert_eq!(b, "{\"q\": \"ünïcode\"}");
    }
    // 303 after POST continues as GET without the body.
    tool.execute(
        json!({"url": format!("http://{srv}/see-other"), "method": "post", "body": "x"}),
        &c.ctx,
    )
    .await
    .unwrap();
    let reqs = seen.requests.lock().unwrap();
    let (m, _, b) = reqs.last().unwrap();
    assert_eq!((m.as_str(), b.as_str()), ("GET", ""));
}

#[tokio::test]
async fn credentials_are_dropped_on_cross_origin_redirects() {
    let c = ctx();
    let (a, seen_a) = server().await;
    let (b, seen_b) = server().await;
    let tool = fetcher(settings());
    let headers = json!({"Authorization": "Bearer SECRET", "Cookie": "s=1", "X-Keep": "k"});
    // Same origin: kept.
    tool.execute(
        json!({"url": format!("http://{a}/redir?to=/echo"), "headers": headers}),
        &c.ctx,
    )
    .await
    .unwrap();
    let (_, h, _) = seen_a.requests.lock().unwrap()[0].clone();
    assert_eq!(h["authorization"], "Bearer SECRET");
    // Other origin (another port): credentials dropped, other headers kept.
    let to = enc(&format!("http://{b}/echo"));
    tool.execute(
        json!({"url": format!("http://{a}/redir?to={to}"), "headers": headers}),
        &c.ctx,
    )
    .await
    .unwrap();
    let (_, h, _) = seen_b.requests.lock().unwrap()[0].clone();
    assert!(
        !h.contains_key("authorization") && !h.contains_key("cookie"),
        "{h:?}"
    );
    assert_eq!(h["x-keep"], "k");
}

#[test]
fn schemas_and_descriptions() {
    crate::install_crypto_provider();
    let f = fetcher(settings());
    // Short: every request carries it (issue 32).
    assert!(f.description().len() < 120, "{}", f.description());
    let p = f.parameters();
    assert_eq!(p["required"], json!(["url"]));
    assert_eq!(p["additionalProperties"], json!(false));
    let text = p.to_string();
    for m in ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"] {
        assert!(text.contains(&format!("\"{m}\"")), "{text}");
    }
    assert_eq!(f.effect(), Effect::Network);
    let s = WebSearch::new(WebSearchSettings::default()).unwrap();
    assert!(s.description().len() < 120, "{}", s.description());
    assert_eq!(s.parameters()["required"], json!(["query"]));
    assert_eq!(s.effect(), Effect::Network);
}

#[tokio::test]
async fn invalid_arguments() {
    let c = ctx();
    let tool = fetcher(settings());
    let u = "http://127.0.0.2:9/";
    for args in [
        json!({"url": u, "method": "TRACE"}),
        json!({"url": u, "body": "x"}),
        json!({"url": u, "headers": {"bad header": "x"}}),
        json!({"url": u, "headers": {"x": "line\nbreak"}}),
        json!({"url": u, "headers": {"Host": "other"}}),
        json!({"url": u, "headers": {"x": 1}}),
        json!({"url": u, "extra": true}),
        json!({}),
    ] {
        let e = tool.execute(args.clone(), &c.ctx).await.unwrap_err();
        assert_eq!(e.code(), "INVALID_ARGS", "{args}: {e}");
    }
}

#[tokio::test]
async fn connect_failure_timeout_and_cancel() {
    let c = ctx();
    // A port with nothing listening on the allowed address.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
        l.local_addr().unwrap()
    };
    let tool = fetcher(settings());
    let e = tool
        .execute(json!({"url": format!("http://{closed}/")}), &c.ctx)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "EXECUTION_FAILED", "{e}");

    let silent = silent_server().await;
    let tool = fetcher(WebFetchSettings {
        timeout: Duration::from_millis(400),
        ..settings()
    });
    let t = Instant::now();
    let e = tool
        .execute(json!({"url": format!("http://{silent}/")}), &c.ctx)
        .await
        .unwrap_err();
    assert_eq!(e, ToolError::Timeout(1));
    assert!(t.elapsed() < Duration::from_secs(2));

    // A body that trickles in: what arrived before the deadline comes back, marked as partial
    // (it used to be only a TIMEOUT error).
    let (addr, _) = server().await;
    let v = tool
        .execute(json!({"url": format!("http://{addr}/trickle")}), &c.ctx)
        .await
        .unwrap();
    assert_eq!(v["status"], json!(200), "{v}");
    assert_eq!(v["partial"], json!(true), "{v}");
    assert_eq!(v["truncated"], json!(true), "{v}");
    let body = v["body"].as_str().unwrap();
    assert!(body.starts_with("first part of a slow page"), "{v}");
    assert!(body.contains("[partial:"), "{v}");

    let tool = fetcher(settings());
    let cancel = c.ctx.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cancel.cancel();
    });
    let t = Instant::now();
    let e = tool
        .execute(json!({"url": format!("http://{silent}/")}), &c.ctx)
        .await
        .unwrap_err();
    assert_eq!(e, ToolError::Cancelled);
    assert!(t.elapsed() < Duration::from_secs(2));
}

#[test]
fn fetch_config_resolves_and_rejects() {
    let s = WebFetchFile::default().resolve().unwrap();
    assert_eq!(s.max_bytes, DEFAULT_MAX_BYTES);
    assert_eq!(s.max_redirects, 5);
    assert_eq!(s.timeout, Duration::from_secs(30));
    assert!(s.allow_private.is_empty());
    let s = WebFetchFile {
        allow_private: Some(vec![
            "10.0.0.0/8".into(),
            "127.0.0.2".into(),
            "fd00::/8".into(),
        ]),
        max_bytes: Some(1000),
        timeout_secs: Some(5),
        user_agent: Some("bot/1".into()),
        max_redirects: Some(10),
    }
    .resolve()
    .unwrap();
    assert_eq!(s.allow_private.len(), 3);
    assert_eq!((s.max_bytes, s.max_redirects), (1000, 10));
    for (f, key) in [
        (
            WebFetchFile {
                allow_private: Some(vec!["ok".into()]),
                ..Default::default()
            },
            "allow_private[0]",
        ),
        (
            WebFetchFile {
                allow_private: Some(vec!["10.0.0.0/8".into(), "1.2.3.4/40".into()]),
                ..Default::default()
            },
            "allow_private[1]",
        ),
        (
            WebFetchFile {
                max_bytes: Some(0),
                ..Default::default()
            },
            "max_bytes",
        ),
        (
            WebFetchFile {
                max_bytes: Some(1 << 40),
                ..Default::default()
            },
            "max_bytes",
        ),
        (
            WebFetchFile {
                timeout_secs: Some(0),
                ..Default::default()
            },
            "timeout_secs",
        ),
        (
            WebFetchFile {
                timeout_secs: Some(301),
                ..Default::default()
            },
            "timeout_secs",
        ),
        (
            WebFetchFile {
                max_redirects: Some(11),
                ..Default::default()
            },
            "max_redirects",
        ),
        (
            WebFetchFile {
                user_agent: Some(String::new()),
                ..Default::default()
            },
            "user_agent",
        ),
        (
            WebFetchFile {
                user_agent: Some("a\nb".into()),
                ..Default::default()
            },
            "user_agent",
        ),
    ] {
        let e = f.resolve().unwrap_err().to_string();
        assert!(e.starts_with(&format!("tools.web_fetch.{key}")), "{e}");
    }
    let f: Result<WebFetchFile, _> = serde_json::from_value(json!({"allow": []}));
    assert!(f.is_err());
}
