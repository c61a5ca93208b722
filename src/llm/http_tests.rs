#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;

/// Every event of `chunks` read through an [`SseReader`].
async fn read_all(chunks: &[&[u8]]) -> Vec<SseEvent> {
    let body = futures::stream::iter(
        chunks
            .iter()
            .map(|c| Ok::<_, std::convert::Infallible>(c.to_vec())),
    );
    let mut reader = SseReader::new(body);
    let mut out = Vec::new();
    while let Some(ev) = reader.next().await {
        out.push(ev.unwrap());
    }
    out
}

fn data(d: &str) -> SseEvent {
    SseEvent {
        event: None,
        data: d.into(),
    }
}

fn typed(event: &str, d: &str) -> SseEvent {
    SseEvent {
        event: Some(event.into()),
        data: d.into(),
    }
}

/// An OpenAI-style and an Anthropic-style stream with the parts a parser gets wrong.
const STREAM: &str = ": keep-alive comment\n\
    data: {\"a\":1}\n\n\
    event: message_start\r\ndata: {\"type\":\"message_start\"}\r\n\r\n\
    id: 7\nretry: 100\nevent: ping\n\n\
    data: {\"multi\":\n\
    data:\"line\"}\n\n\
    event: content_block_delta\rdata: ü \r\r\
    data: [DONE]\n\n";

fn expected() -> Vec<SseEvent> {
    vec![
        data("{\"a\":1}"),
        typed("message_start", "{\"type\":\"message_start\"}"),
        // `event: ping` without data is not dispatched, and its type does not leak on.
        data("{\"multi\":\n\"line\"}"),
        typed("content_block_delta", "ü "),
        data("[DONE]"),
    ]
}

#[tokio::test]
async fn one_chunk_gives_every_event() {
    assert_eq!(read_all(&[STREAM.as_bytes()]).await, expected());
}

#[tokio::test]
async fn lines_split_across_chunks_at_any_byte() {
    let bytes = STREAM.as_bytes();
    for cut in 0..=bytes.len() {
        let (a, b) = bytes.split_at(cut);
        assert_eq!(read_all(&[a, b]).await, expected(), "split at {cut}");
    }
    let singles: Vec<&[u8]> = bytes.chunks(1).collect();
    assert_eq!(read_all(&singles).await, expected());
}

#[tokio::test]
async fn crlf_split_between_chunks_is_one_line_end() {
    let evs = read_all(&[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n", b"data: c\r\r"]).await;
    assert_eq!(evs, [data("a\nb"), data("c")]);
    // A lone CR at the end of a chunk followed by more text: CR ended the line.
    let evs = read_all(&[b"data: a\r", b"\r", b"data: b\n\n"]).await;
    assert_eq!(evs, [data("a"), data("b")]);
}

#[tokio::test]
async fn comments_and_unknown_fields_are_ignored() {
    let evs = read_all(&[b":\n: x\nfoo: bar\nid: 1\ndata\n\ndata:  two spaces\n\n"]).await;
    // A bare `data` line is an empty data line; only one leading space is removed.
    assert_eq!(evs, [data(""), data(" two spaces")]);
}

#[tokio::test]
async fn multi_line_data_is_joined_with_lf() {
    let evs = read_all(&[b"event: e\ndata: 1\ndata:\ndata: 3\n\n"]).await;
    assert_eq!(evs, [typed("e", "1\n\n3")]);
}

#[tokio::test]
async fn a_stream_cut_mid_event() {
    // Complete data lines without the final blank line are still delivered.
    assert_eq!(
        read_all(&[b"data: {\"a\":1}\n\ndata: {\"b\":2}\n"]).await,
        [data("{\"a\":1}"), data("{\"b\":2}")]
    );
    assert_eq!(
        read_all(&[b"data: x\r"]).await,
        [data("x")],
        "CR ends a line at the end of the stream"
    );
    // An unterminated last line may be cut JSON: dropped, with the rest of its event.
    assert_eq!(
        read_all(&[b"data: {\"a\":1}\n\ndata: 1\ndata: {\"b\""]).await,
        [data("{\"a\":1}"), data("1")]
    );
    assert_eq!(read_all(&[b"event: e\ndata: {\"b\""]).await, []);
    assert_eq!(read_all(&[]).await, []);
}

#[tokio::test]
async fn events_before_a_transport_error_come_first_then_the_error() {
    let body = futures::stream::iter([
        Ok(b"data: 1\n\ndata: 2\n\ndata: 3".to_vec()),
        Err("reset"),
        Ok(b"\n\n".to_vec()),
    ]);
    let mut reader = SseReader::new(body);
    assert_eq!(reader.next().await, Some(Ok(data("1"))));
    assert_eq!(reader.next().await, Some(Ok(data("2"))));
    assert_eq!(reader.next().await, Some(Err("reset")));
}

/// A one-route HTTP server on 127.0.0.1 answering every POST with `resp`.
async fn serve(
    resp: impl Fn() -> axum::response::Response + Clone + Send + Sync + 'static,
) -> String {
    let app = axum::Router::new().route("/", axum::routing::post(move || async move { resp() }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/")
}

fn endpoint<'a>(http: &'a reqwest::Client, url: &'a str, timeout: Duration) -> Endpoint<'a> {
    Endpoint {
        http,
        provider: "p",
        url,
        timeout,
        full_cause: true,
        scrubber: Box::leak(Box::new(crate::types::scrub::Scrubber::default())),
    }
}

#[tokio::test]
async fn send_classifies_error_statuses_with_retry_after_and_body() {
    let url = serve(|| {
        axum::response::Response::builder()
            .status(429)
            .header("retry-after", "3")
            .body(axum::body::Body::from("slow down"))
            .unwrap()
    })
    .await;
    let http = http_client("p", Duration::from_secs(5)).unwrap();
    let ep = endpoint(&http, &url, Duration::from_secs(5));
    let err = ep.send(ep.post(b"{}".to_vec())).await.unwrap_err();
    assert!(matches!(err, LlmError::RateLimited { .. }), "{err:?}");
    assert_eq!(err.retry_after(), Some(Duration::from_secs(3)));

    let url = serve(|| {
        axum::response::Response::builder()
            .status(529)
            .body(axum::body::Body::from("overloaded"))
            .unwrap()
    })
    .await;
    let ep = endpoint(&http, &url, Duration::from_secs(5));
    let err = ep.send(ep.post(b"{}".to_vec())).await.unwrap_err();
    assert_eq!(err.to_string(), "p: server error (HTTP 529): overloaded");
}

#[tokio::test]
async fn streamed_events_and_a_stalled_stream_times_out() {
    let url = serve(|| {
        let frames = futures::stream::iter([
            Ok::<_, std::convert::Infallible>(bytes::Bytes::from_static(b"data: he")),
            Ok(bytes::Bytes::from_static(b"llo\n\nda")),
        ])
        .chain(futures::stream::pending());
        axum::response::Response::builder()
            .header("content-type", "text/event-stream")
            .body(axum::body::Body::from_stream(frames))
            .unwrap()
    })
    .await;
    let http = http_client("p", Duration::from_secs(5)).unwrap();
    let ep = endpoint(&http, &url, Duration::from_millis(500));
    let resp = ep.send(ep.post(b"{}".to_vec())).await.unwrap();
    let mut events = ep.events(resp);
    assert_eq!(events.next().await.unwrap().unwrap(), data("hello"));
    let err = events.next().await.unwrap().unwrap_err();
    assert!(matches!(err, LlmError::Timeout { .. }), "{err:?}");
}

#[tokio::test]
async fn connection_refused_is_a_connect_error_with_its_cause() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    drop(listener);
    let http = http_client("p", Duration::from_secs(5)).unwrap();
    let mut ep = endpoint(&http, &url, Duration::from_secs(5));
    let err = ep.send(ep.post(Vec::new())).await.unwrap_err();
    let LlmError::Connect { detail, .. } = &err else {
        panic!("{err:?}")
    };
    let full = detail.clone();
    ep.full_cause = false;
    let LlmError::Connect { detail, .. } = ep.send(ep.post(Vec::new())).await.unwrap_err() else {
        panic!("not a connect error")
    };
    assert!(
        full.starts_with(&detail) && full.len() > detail.len(),
        "{full} / {detail}"
    );
}

#[test]
fn join_url_keeps_the_query_after_the_path() {
    for (base, path, want) in [
        (
            "https://api.openai.com/v1",
            "/chat/completions",
            "https://api.openai.com/v1/chat/completions",
        ),
        ("http://h/v1/", "/models", "http://h/v1/models"),
        (
            "https://x/v1?key=K&a=b",
            "/chat/completions",
            "https://x/v1/chat/completions?key=K&a=b",
        ),
        (
            "https://x/v1/?key=K#f",
            "/messages",
            "https://x/v1/messages?key=K#f",
        ),
    ] {
        assert_eq!(join_url(base, path), want, "{base}");
    }
}

#[tokio::test]
async fn an_error_body_is_scrubbed_before_it_is_cut() {
    const KEY: &str = "my-provider-key-0123456789";
    // The key straddles the 500-character cut of the stored body.
    let body = format!("{}{KEY} trailing", "x".repeat(490));
    let url = serve(move || {
        axum::response::Response::builder()
            .status(401)
            .body(axum::body::Body::from(body.clone()))
            .unwrap()
    })
    .await;
    let http = http_client("p", Duration::from_secs(5)).unwrap();
    let scrubber = crate::types::scrub::Scrubber::new(vec![KEY.into()]);
    let ep = Endpoint {
        scrubber: &scrubber,
        ..endpoint(&http, &url, Duration::from_secs(5))
    };
    let err = ep.send(ep.post(b"{}".to_vec())).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("[REDACTED]"), "{text}");
    assert!(!text.contains("my-prov"), "{text}");
}
