//! `memory.embeddings`: the embeddings client, the vector store and the fusion, against a fake
//! of OpenAI's `/v1/embeddings` served over real HTTP on 127.0.0.1.
//!
//! The fake behaves as OpenAI does where it matters: a bearer key checked (401 with OpenAI's
//! error JSON, the key masked), 400 on an empty input, `dimensions` honoured, `usage` reported.
//! Its vectors are deterministic: a hashed bag of words with a tiny synonym table, so
//! "automobile repair" lands near "car mechanic" although they share no word. It answers each
//! `data` list in reverse order (clients must order by `index`), and can be scripted to answer
//! 429 with `Retry-After`, an error status, a redirect, a malformed answer, or nothing at all.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, Response, StatusCode};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use clawft::memory::embed::{
    chunk_hash, fuse, EmbedError, Embedder, EmbeddingSettings, Vectors, MAX_INPUT_BYTES,
};
use clawft::types::Secret;
use serde_json::{json, Value};

/// The key the fake accepts.
const KEY: &str = "sk-test-embed-0123456789abcdef7890";
/// The variable named in `api_key_env` (never read: the test hands the key in).
const KEY_ENV: &str = "WEFT_TEST_EMBED_KEY";
/// The fake's vector size when `dimensions` is not asked for.
const FAKE_DIMS: usize = 64;

/// One scripted answer, taken before the normal one.
#[derive(Clone, Debug)]
enum Next {
    /// 429 with this `Retry-After` (seconds).
    RateLimited(u64),
    /// This status with an OpenAI error body.
    Status(u16),
    /// 307 to this URL.
    Redirect(String),
    /// Never answer.
    Hang,
    /// A normal answer whose last vector is one number shorter.
    MixedDims,
    /// A normal answer missing its last item.
    WrongCount,
}

#[derive(Default)]
struct Inner {
    script: VecDeque<Next>,
    /// Each request's body and `Authorization` header.
    requests: Vec<(Value, Option<String>)>,
    /// Ignore the request's `dimensions` (a model that does not support it).
    ignore_dimensions: bool,
}

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Inner>>);

struct FakeEmbeddings {
    addr: std::net::SocketAddr,
    shared: Shared,
    _server: tokio::task::JoinHandle<()>,
}

impl FakeEmbeddings {
    async fn start() -> Self {
        let shared = Shared::default();
        let app = Router::new()
            .route("/v1/embeddings", post(handle))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            addr,
            shared,
            _server: server,
        }
    }

    fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    fn push(&self, n: Next) {
        self.shared.0.lock().unwrap().script.push_back(n);
    }

    fn requests(&self) -> Vec<(Value, Option<String>)> {
        self.shared.0.lock().unwrap().requests.clone()
    }

    /// The `input` array of each request.
    fn inputs(&self) -> Vec<Vec<String>> {
        self.requests()
            .iter()
            .map(|(b, _)| {
                b["input"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_str().unwrap().to_string())
                    .collect()
            })
            .collect()
    }
}

fn openai_error(status: StatusCode, message: &str, kind: &str, code: Value) -> Response<Body> {
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn handle(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> Response<Body> {
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let (next, ignore_dimensions) = {
        let mut inner = shared.0.lock().unwrap();
        inner.requests.push((req.clone(), auth.clone()));
        (inner.script.pop_front(), inner.ignore_dimensions)
    };
    if auth.as_deref() != Some(&format!("Bearer {KEY}")) {
        // OpenAI masks all but the ends of the key it was given.
        let given = auth
            .as_deref()
            .and_then(|a| a.strip_prefix("Bearer "))
            .unwrap_or("");
        let masked = if given.len() > 8 {
            format!("{}****{}", &given[..3], &given[given.len() - 4..])
        } else {
            String::new()
        };
        return openai_error(
            StatusCode::UNAUTHORIZED,
            &format!("Incorrect API key provided: {masked}. You can find your API key at https://platform.openai.com/account/api-keys."),
            "invalid_request_error",
            json!("invalid_api_key"),
        );
    }
    match next {
        Some(Next::RateLimited(secs)) => {
            return Response::builder()
                .status(StatusCode::TOO_MANY_REQUESTS)
                .header(header::RETRY_AFTER, secs.to_string())
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(
                    json!({"error": {"message": "Rate limit reached for text-embedding-3-small", "type": "requests", "param": null, "code": "rate_limit_exceeded"}}).to_string(),
                ))
                .unwrap();
        }
        Some(Next::Status(s)) => {
            return openai_error(
                StatusCode::from_u16(s).unwrap(),
                "The server had an error while processing your request. Sorry about that!",
                "server_error",
                Value::Null,
            );
        }
        Some(Next::Redirect(to)) => {
            return Response::builder()
                .status(StatusCode::TEMPORARY_REDIRECT)
                .header(header::LOCATION, to)
                .body(Body::empty())
                .unwrap();
        }
        Some(Next::Hang) => std::future::pending::<()>().await,
        Some(Next::MixedDims | Next::WrongCount) | None => {}
    }
    let inputs: Vec<String> = match &req["input"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .collect(),
        _ => Vec::new(),
    };
    if inputs.is_empty() || inputs.iter().any(String::is_empty) {
        return openai_error(
            StatusCode::BAD_REQUEST,
            "'$.input' is invalid. Please check the API reference: https://platform.openai.com/docs/api-reference.",
            "invalid_request_error",
            Value::Null,
        );
    }
    let dims = match req["dimensions"].as_u64() {
        Some(d) if !ignore_dimensions => d as usize,
        _ => FAKE_DIMS,
    };
    let mut data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let mut v = fake_vector(text, dims);
            if matches!(next, Some(Next::MixedDims)) && i + 1 == inputs.len() {
                v.pop();
            }
            json!({"object": "embedding", "index": i, "embedding": v})
        })
        .collect();
    if matches!(next, Some(Next::WrongCount)) {
        data.pop();
    }
    data.reverse();
    let tokens: usize = inputs.iter().map(|s| s.split_whitespace().count()).sum();
    let body = json!({
        "object": "list",
        "data": data,
        "model": req["model"],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

/// The fake model: a signed hashed bag of (synonym-folded) words, unit length.
fn fake_vector(text: &str, dims: usize) -> Vec<f32> {
    const SYNONYMS: &[(&str, &str)] = &[
        ("automobile", "car"),
        ("vehicle", "car"),
        ("auto", "car"),
        ("repair", "mechanic"),
        ("repairs", "mechanic"),
        ("fix", "mechanic"),
        ("garage", "mechanic"),
    ];
    let mut v = vec![0f32; dims];
    for word in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let word = word.to_lowercase();
        let word = SYNONYMS
            .iter()
            .find(|(w, _)| *w == word)
            .map_or(word.as_str(), |(_, s)| s);
        let h = chunk_hash(word);
        let sign = if h >> 63 == 0 { 1.0 } else { -1.0 };
        v[(h % dims as u64) as usize] += sign;
    }
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

fn settings(base_url: &str) -> EmbeddingSettings {
    EmbeddingSettings {
        base_url: base_url.to_string(),
        model: "text-embedding-3-small".into(),
        api_key_env: Some(KEY_ENV.into()),
        dimensions: None,
        timeout_secs: 10,
        batch: 64,
    }
}

fn embedder(s: &EmbeddingSettings) -> Embedder {
    Embedder::new(s, Some(Secret::new(KEY))).unwrap()
}

fn texts(t: &[&str]) -> Vec<String> {
    t.iter().map(ToString::to_string).collect()
}

fn assert_close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-6, "{a:?} vs {b:?}");
    }
}

#[tokio::test]
async fn vectors_come_back_in_input_order_whatever_the_order_of_data() {
    let fake = FakeEmbeddings::start().await;
    let e = embedder(&settings(&fake.base_url()));
    let inputs = texts(&["car mechanic", "milk and eggs", "Lisbon in May", "brakes"]);
    let out = e.embed(&inputs).await.unwrap();
    assert_eq!(out.len(), 4);
    for (text, v) in inputs.iter().zip(&out) {
        assert_close(v, &fake_vector(text, FAKE_DIMS));
    }
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        reqs[0].0,
        json!({"model": "text-embedding-3-small", "input": inputs})
    );
    assert_eq!(reqs[0].1.as_deref(), Some(&*format!("Bearer {KEY}")));
    assert_eq!(e.model(), "text-embedding-3-small");
    // Nothing to embed: no request.
    assert!(e.embed(&[]).await.unwrap().is_empty());
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn inputs_are_sent_in_batches_and_dimensions_asked_for() {
    let fake = FakeEmbeddings::start().await;
    let mut s = settings(&fake.base_url());
    s.batch = 2;
    s.dimensions = Some(16);
    let inputs = texts(&["one", "two", "three", "four", "five"]);
    let out = embedder(&s).embed(&inputs).await.unwrap();
    assert_eq!(
        fake.inputs(),
        vec![
            texts(&["one", "two"]),
            texts(&["three", "four"]),
            texts(&["five"])
        ]
    );
    assert!(fake.requests().iter().all(|(b, _)| b["dimensions"] == 16));
    for (text, v) in inputs.iter().zip(&out) {
        assert_close(v, &fake_vector(text, 16));
    }

    // A huge chunk is sent cut to its first 8 KiB (at a character boundary), not refused.
    let huge = "é".repeat(10_000);
    let out = embedder(&s)
        .embed(std::slice::from_ref(&huge))
        .await
        .unwrap();
    assert_eq!(out.len(), 1);
    let sent = &fake.inputs()[3][0];
    assert_eq!(sent.len(), MAX_INPUT_BYTES);
    assert!(huge.starts_with(sent.as_str()));
}

#[tokio::test]
async fn a_wrong_key_names_its_variable_and_never_shows_the_key() {
    let fake = FakeEmbeddings::start().await;
    let wrong = "sk-wrong-key-abcdefghijklmnop";
    let e = Embedder::new(&settings(&fake.base_url()), Some(Secret::new(wrong))).unwrap();
    let err = e.embed(&texts(&["hello"])).await.unwrap_err();
    let shown = format!("{err} / {err:?} / {e:?}");
    assert!(
        matches!(err, EmbedError::Auth { status: 401, .. }),
        "{shown}"
    );
    assert_eq!(err.kind(), "auth");
    assert!(!err.is_retryable());
    assert!(shown.contains(KEY_ENV), "{shown}");
    assert!(shown.contains("memory.embeddings.api_key_env"), "{shown}");
    assert!(shown.contains("Incorrect API key provided"), "{shown}");
    assert!(!shown.contains(wrong), "{shown}");
    assert!(!shown.contains(KEY), "{shown}");

    // No key at all: the fix says what to configure.
    let mut s = settings(&fake.base_url());
    s.api_key_env = None;
    let err = Embedder::new(&s, None)
        .unwrap()
        .embed(&texts(&["hello"]))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("set memory.embeddings.api_key_env"),
        "{err}"
    );
    // A variable named but empty.
    let err = Embedder::new(&settings(&fake.base_url()), None)
        .unwrap()
        .embed(&texts(&["hello"]))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("is unset or empty"), "{err}");
    assert!(fake.requests()[2].1.is_none(), "no Authorization header");
}

#[tokio::test]
async fn a_429_is_retried_once_after_retry_after() {
    let fake = FakeEmbeddings::start().await;
    let e = embedder(&settings(&fake.base_url()));
    fake.push(Next::RateLimited(1));
    let out = e.embed(&texts(&["car"])).await.unwrap();
    assert_close(&out[0], &fake_vector("car", FAKE_DIMS));
    assert_eq!(fake.requests().len(), 2);

    // Twice in a row: an error after the one retry.
    fake.push(Next::RateLimited(1));
    fake.push(Next::RateLimited(1));
    let err = e.embed(&texts(&["car"])).await.unwrap_err();
    assert!(
        matches!(err, EmbedError::RateLimited { retry_after: Some(d), .. } if d == Duration::from_secs(1)),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert_eq!(fake.requests().len(), 4);

    // A wait over the bound is not waited for.
    fake.push(Next::RateLimited(3600));
    let err = e.embed(&texts(&["car"])).await.unwrap_err();
    assert_eq!(err.kind(), "rate_limited");
    assert!(err.to_string().contains("retry after 3600 s"), "{err}");
    assert_eq!(fake.requests().len(), 5);
}

#[tokio::test]
async fn server_errors_bad_input_and_timeouts_are_typed() {
    let fake = FakeEmbeddings::start().await;
    let mut s = settings(&fake.base_url());
    s.timeout_secs = 1;
    let e = embedder(&s);

    fake.push(Next::Status(500));
    let err = e.embed(&texts(&["x"])).await.unwrap_err();
    assert!(
        matches!(err, EmbedError::Status { status: 500, .. }),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert!(err.to_string().contains("Sorry about that"), "{err}");

    let err = e.embed(&texts(&["ok", ""])).await.unwrap_err();
    assert!(
        matches!(err, EmbedError::Status { status: 400, .. }),
        "{err:?}"
    );
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("'$.input' is invalid"), "{err}");

    fake.push(Next::Hang);
    let err = e.embed(&texts(&["x"])).await.unwrap_err();
    assert!(matches!(err, EmbedError::Timeout { .. }), "{err:?}");
    assert!(
        err.to_string().contains("memory.embeddings.timeout_secs"),
        "{err}"
    );

    // Nothing listening: a connection error naming the endpoint.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let err = embedder(&settings(&format!("http://{closed}/v1")))
        .embed(&texts(&["x"]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "connect", "{err:?}");
    assert!(err.to_string().contains(&closed.to_string()), "{err}");
}

#[tokio::test]
async fn malformed_answers_are_refused() {
    let fake = FakeEmbeddings::start().await;
    let e = embedder(&settings(&fake.base_url()));
    fake.push(Next::MixedDims);
    let err = e.embed(&texts(&["a", "b", "c"])).await.unwrap_err();
    assert!(matches!(err, EmbedError::BadShape { .. }), "{err:?}");
    assert!(err.to_string().contains("mixed sizes"), "{err}");

    fake.push(Next::WrongCount);
    let err = e.embed(&texts(&["a", "b"])).await.unwrap_err();
    assert!(err.to_string().contains("1 vectors for 2 inputs"), "{err}");

    // `dimensions` asked for but not honoured by the model: refused, naming the setting.
    fake.shared.0.lock().unwrap().ignore_dimensions = true;
    let mut s = settings(&fake.base_url());
    s.dimensions = Some(32);
    let err = embedder(&s).embed(&texts(&["a"])).await.unwrap_err();
    assert_eq!(err.kind(), "bad_shape");
    assert!(
        err.to_string()
            .contains("64 dimensions where 32 were expected"),
        "{err}"
    );
    assert!(
        err.to_string().contains("memory.embeddings.dimensions"),
        "{err}"
    );

    // Vectors of another size than the store's are refused on insert.
    let mut store = Vectors::new("text-embedding-3-small", 32);
    let v = embedder(&settings(&fake.base_url()))
        .embed(&texts(&["a"]))
        .await
        .unwrap();
    assert!(store.insert("a.md", 1, 1, 1, v[0].clone()).is_err());
    assert!(store.is_empty());
}

#[tokio::test]
async fn a_redirect_to_another_host_is_not_followed() {
    let fake = FakeEmbeddings::start().await;
    let elsewhere = FakeEmbeddings::start().await;
    // `localhost` is another host name than `127.0.0.1`, though the same machine.
    fake.push(Next::Redirect(format!(
        "http://localhost:{}/v1/embeddings",
        elsewhere.addr.port()
    )));
    let err = embedder(&settings(&fake.base_url()))
        .embed(&texts(&["x"]))
        .await
        .unwrap_err();
    assert!(
        matches!(err, EmbedError::Status { status: 307, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("not followed"), "{err}");
    assert!(elsewhere.requests().is_empty(), "the key went elsewhere");

    // The same host: followed, and the key with it.
    fake.push(Next::Redirect(format!("{}/embeddings", fake.base_url())));
    let out = embedder(&settings(&fake.base_url()))
        .embed(&texts(&["x"]))
        .await
        .unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(fake.requests().len(), 3);
}

/// A memory root's chunks: (path, start line, end line, text).
const CHUNKS: &[(&str, u32, u32, &str)] = &[
    (
        "MEMORY.md",
        1,
        3,
        "The user prefers short answers and metric units.",
    ),
    (
        "memory/2026-11-20.md",
        1,
        2,
        "Groceries: milk, eggs, bread.",
    ),
    (
        "memory/2026-11-20.md",
        4,
        6,
        "Called the car mechanic about the brakes; pick up Friday.",
    ),
    (
        "memory/2026-11-21.md",
        1,
        2,
        "Trip to Lisbon booked for May.",
    ),
];

#[tokio::test]
async fn a_query_finds_by_meaning_what_keywords_miss_and_edits_embed_only_new_chunks() {
    let fake = FakeEmbeddings::start().await;
    let e = embedder(&settings(&fake.base_url()));
    let inputs: Vec<String> = CHUNKS.iter().map(|c| c.3.to_string()).collect();
    let vs = e.embed(&inputs).await.unwrap();
    let mut store = Vectors::new(e.model(), vs[0].len());
    for (c, v) in CHUNKS.iter().zip(vs) {
        store.insert(c.0, c.1, c.2, chunk_hash(c.3), v).unwrap();
    }
    assert_eq!(store.len(), 4);

    let query = "automobile repair";
    // No chunk holds a word of the query: a keyword ranking has nothing.
    for c in CHUNKS {
        let text = c.3.to_lowercase();
        assert!(!text.contains("automobile") && !text.contains("repair"));
    }
    let keyword = [];
    let q = e.embed(&[query.to_string()]).await.unwrap();
    let vector = store.search(&q[0], 5, None);
    assert_eq!(vector[0].path.as_ref(), "memory/2026-11-20.md");
    assert_eq!((vector[0].start_line, vector[0].end_line), (4, 6));
    let fused = fuse(&keyword, &vector, 5);
    assert_eq!(fused[0].path.as_ref(), "memory/2026-11-20.md");
    assert_eq!(fused[0].start_line, 4);
    // The prefix filter applies.
    assert!(store
        .search(&q[0], 5, Some("memory/2026-11-21"))
        .iter()
        .all(|h| h.path.as_ref() == "memory/2026-11-21.md"));

    // The stored form survives a restart.
    let store = Vectors::decode(&store.encode()).unwrap();
    assert_eq!(store.search(&q[0], 5, None), vector);

    // memory/2026-11-20.md edited: its second chunk changed, the first kept.
    let mut store = store;
    let edited = [
        (1, 2, "Groceries: milk, eggs, bread."),
        (4, 6, "Car is fixed; the mechanic charged 240 EUR."),
    ];
    let to_embed: Vec<_> = edited
        .iter()
        .filter(|c| !store.get("memory/2026-11-20.md", c.0, chunk_hash(c.2)))
        .collect();
    assert_eq!(to_embed.len(), 1);
    let before = fake.requests().len();
    let vs = e
        .embed(&to_embed.iter().map(|c| c.2.to_string()).collect::<Vec<_>>())
        .await
        .unwrap();
    for (c, v) in to_embed.iter().zip(vs) {
        store
            .insert("memory/2026-11-20.md", c.0, c.1, chunk_hash(c.2), v)
            .unwrap();
    }
    let keep: Vec<(u32, u64)> = edited.iter().map(|c| (c.0, chunk_hash(c.2))).collect();
    store.retain_path("memory/2026-11-20.md", &keep);
    assert_eq!(fake.inputs()[before], texts(&[edited[1].2]));
    assert_eq!(store.len(), 4);
    assert!(!store.get("memory/2026-11-20.md", 4, chunk_hash(CHUNKS[2].3)));
    let hits = store.search(&q[0], 1, None);
    assert_eq!(
        (hits[0].path.as_ref(), hits[0].start_line),
        ("memory/2026-11-20.md", 4)
    );
    store.remove_path("memory/2026-11-20.md");
    assert_eq!(store.len(), 2);
}

/// Through a gateway: `memory.embeddings` set, notes are embedded in the background after the
/// first search indexes them, and the next search finds by meaning what keywords miss (mode
/// `hybrid`); the key never reaches the model.
#[tokio::test]
async fn a_gateway_with_embeddings_finds_by_meaning_after_its_background_pass() {
    use crate::common::{config_value, tool_results, TestGateway};
    use crate::fake_llm::{FakeLlm, Reply};
    let fake = FakeEmbeddings::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join("memory")).unwrap();
    std::fs::write(
        ws.join("memory/MEMORY.md"),
        "# People\n\nLuigi is our car mechanic, on Elm Street.\n\n# Food\n\nThe bakery sells rye bread on Saturdays.\n",
    )
    .unwrap();
    let llm = FakeLlm::start().await;
    let v = config_value(
        &llm.base_url(),
        dir.path(),
        json!({ "memory": { "scope": "agent", "embeddings": {
            "base_url": fake.base_url(), "model": "text-embedding-3-small", "api_key_env": KEY_ENV,
        } } }),
    );
    let env = clawft::config::Env::from_pairs([
        ("HOME", dir.path().to_str().unwrap()),
        ("CLAWFT_HOME", dir.path().join(".clawft").to_str().unwrap()),
        (KEY_ENV, KEY),
    ]);
    let cfg = clawft::config::Config::from_str(&v.to_string(), false, &env).unwrap();
    let gw = TestGateway::start(cfg).await;
    let search = |id: &str| {
        Reply::ToolCalls(vec![(
            id.to_string(),
            "memory_search".to_string(),
            json!({ "query": "automobile repair" }).to_string(),
        )])
    };
    // First search: keyword only (nothing embedded yet), and it starts the embedding pass.
    llm.push(search("s1"));
    llm.push(Reply::Text("done".into()));
    assert_eq!(gw.api.chat("c", "go").await.0, 200);
    let r = tool_results(&llm.requests()[1]);
    assert_eq!(r[0].1["mode"], "keyword", "{r:?}");
    assert_eq!(r[0].1["results"], json!([]), "{r:?}");
    let vec_file = |d: &std::path::Path| {
        std::fs::read_dir(d.join(".clawft/memory-index"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.path().join("agent.vec").exists())
    };
    assert!(
        crate::common::wait_until(Duration::from_secs(10), || vec_file(dir.path())).await,
        "no vectors saved; embedding requests: {:?}",
        fake.inputs()
    );
    // The chunks went to the endpoint with the key; the next search is hybrid.
    assert!(fake
        .requests()
        .iter()
        .all(|(_, auth)| auth.as_deref() == Some(&format!("Bearer {KEY}"))));
    llm.push(search("s2"));
    llm.push(Reply::Text("done".into()));
    assert_eq!(gw.api.chat("c", "again").await.0, 200);
    let reqs = llm.requests();
    let r = tool_results(&reqs[3]);
    let last = &r.last().unwrap().1;
    assert_eq!(last["mode"], "hybrid", "{r:?}");
    let first = &last["results"][0];
    assert_eq!(first["path"], "memory/MEMORY.md", "{r:?}");
    assert!(
        first["snippet"].as_str().unwrap().contains("Luigi"),
        "{r:?}"
    );
    // The endpoint failing at search time: keyword ranking, said so, still answered.
    fake.push(Next::Status(500));
    fake.push(Next::Status(500));
    llm.push(Reply::ToolCalls(vec![(
        "s3".into(),
        "memory_search".into(),
        json!({ "query": "rye bread" }).to_string(),
    )]));
    llm.push(Reply::Text("done".into()));
    assert_eq!(gw.api.chat("c", "bread?").await.0, 200);
    let reqs = llm.requests();
    let r = tool_results(reqs.last().unwrap());
    let last = &r.last().unwrap().1;
    assert_eq!(last["mode"], "keyword", "{r:?}");
    assert!(
        last["note"]
            .as_str()
            .unwrap()
            .contains("keyword ranking only"),
        "{r:?}"
    );
    assert!(last["results"][0]["snippet"]
        .as_str()
        .unwrap()
        .contains("rye bread"));
    let all = serde_json::to_string(&reqs).unwrap();
    assert!(!all.contains(KEY), "the key reached the model");
    gw.stop().await;
}
