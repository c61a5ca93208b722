//! `web_search` tests: backends (SearXNG, Brave) against local servers, errors, settings.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Query, State};
use axum::http::{HeaderMap as AxHeaders, StatusCode};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use super::*;
use crate::tools::web::test_support::{ctx, silent_server};

type Captured = Arc<Mutex<Vec<(HashMap<String, String>, Option<String>)>>>;

async fn search_server(status: u16, body: &'static str) -> (SocketAddr, Captured) {
    let seen: Captured = Arc::default();
    let handler = move |State(seen): State<Captured>,
                        Query(q): Query<HashMap<String, String>>,
                        h: AxHeaders| async move {
        let token = h
            .get("x-subscription-token")
            .map(|v| v.to_str().unwrap().to_string());
        seen.lock().unwrap().push((q, token));
        (
            StatusCode::from_u16(status).unwrap(),
            [("content-type", "application/json")],
            body,
        )
    };
    let app = Router::new()
        .route("/search", get(handler))
        .route("/res/v1/web/search", get(handler))
        .with_state(seen.clone());
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    (addr, seen)
}

const SEARXNG_JSON: &str = r#"{"query":"rust","number_of_results":0,"results":[
        {"url":"https://www.rust-lang.org/","title":"Rust Programming Language","content":"A language empowering everyone","engine":"duckduckgo","score":1.0},
        {"url":"https://doc.rust-lang.org/book/","title":"The Rust Book","content":"Learn Rust","engine":"bing"},
        {"url":"https://crates.io/","title":"crates.io","engine":"google"}],
        "answers":[],"corrections":[],"infoboxes":[],"suggestions":[],"unresponsive_engines":[]}"#;

const BRAVE_JSON: &str = r#"{"type":"search","query":{"original":"rust"},"mixed":{},
        "web":{"type":"search","results":[
        {"title":"Rust Programming Language","url":"https://www.rust-lang.org/","description":"A language empowering <strong>everyone</strong> &amp; more","is_source_local":false,"language":"en"},
        {"title":"Rust (video game)","url":"https://rust.facepunch.com/","description":"Survive"}],"family_friendly":true}}"#;

fn searcher(provider: SearchProvider, endpoint: String, key: Option<&str>) -> WebSearch {
    crate::install_crypto_provider();
    WebSearch::new(WebSearchSettings {
        provider: Some(provider),
        endpoint: Some(Url::parse(&endpoint).unwrap()),
        api_key: key.map(Secret::new),
        timeout: Duration::from_secs(5),
    })
    .unwrap()
}

#[tokio::test]
async fn searxng_results_are_normalised() {
    let c = ctx();
    let (addr, seen) = search_server(200, SEARXNG_JSON).await;
    let tool = searcher(SearchProvider::Searxng, format!("http://{addr}/"), None);
    let v = tool
        .execute(
            json!({"query": "rust ünïcode & more", "num_results": 2}),
            &c.ctx,
        )
        .await
        .unwrap();
    assert_eq!(
        v,
        json!({"query": "rust ünïcode & more", "count": 2, "results": [
            {"title": "Rust Programming Language", "url": "https://www.rust-lang.org/", "snippet": "A language empowering everyone"},
            {"title": "The Rust Book", "url": "https://doc.rust-lang.org/book/", "snippet": "Learn Rust"},
        ]})
    );
    let (q, _) = seen.lock().unwrap()[0].clone();
    assert_eq!(q["q"], "rust ünïcode & more");
    assert_eq!(q["format"], "json");
    let v = tool
        .execute(json!({"query": "rust"}), &c.ctx)
        .await
        .unwrap();
    assert_eq!(v["count"], 3);
    assert_eq!(v["results"][2]["snippet"], "");
}

#[tokio::test]
async fn brave_sends_the_key_and_count() {
    let c = ctx();
    let (addr, seen) = search_server(200, BRAVE_JSON).await;
    let tool = searcher(
        SearchProvider::Brave,
        format!("http://{addr}/res/v1/web/search"),
        Some("KEY123"),
    );
    let v = tool
        .execute(json!({"query": "rust", "num_results": 50}), &c.ctx)
        .await
        .unwrap();
    assert_eq!(v["count"], 2);
    assert_eq!(
        v["results"][0],
        json!({"title": "Rust Programming Language", "url": "https://www.rust-lang.org/", "snippet": "A language empowering everyone & more"})
    );
    let (q, token) = seen.lock().unwrap()[0].clone();
    assert_eq!(token.as_deref(), Some("KEY123"));
    assert_eq!(q["count"], "20", "num_results is capped at 20");
    assert_eq!(q["q"], "rust");
    tool.execute(json!({"query": "rust", "num_results": 1}), &c.ctx)
        .await
        .unwrap();
    assert_eq!(seen.lock().unwrap()[1].0["count"], "1");
}

#[tokio::test]
async fn search_errors() {
    let c = ctx();
    for status in [500u16, 429, 403] {
        let (addr, _) = search_server(status, "{}").await;
        let tool = searcher(SearchProvider::Searxng, format!("http://{addr}"), None);
        let e = tool
            .execute(json!({"query": "x"}), &c.ctx)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "EXECUTION_FAILED");
        assert!(e.to_string().contains(&status.to_string()), "{e}");
    }
    let (addr, _) = search_server(200, "<html>not json</html>").await;
    let tool = searcher(SearchProvider::Searxng, format!("http://{addr}"), None);
    let e = tool
        .execute(json!({"query": "x"}), &c.ctx)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "EXECUTION_FAILED");
    assert!(e.to_string().contains("expected JSON"), "{e}");
    let (addr, _) = search_server(200, r#"{"web": {"results": "nope"}}"#).await;
    let tool = searcher(
        SearchProvider::Brave,
        format!("http://{addr}/res/v1/web/search"),
        Some("k"),
    );
    let e = tool
        .execute(json!({"query": "x"}), &c.ctx)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("web.results"), "{e}");
    // Brave omits `web` when nothing is found.
    let (addr, _) = search_server(200, r#"{"type":"search"}"#).await;
    let tool = searcher(
        SearchProvider::Brave,
        format!("http://{addr}/res/v1/web/search"),
        Some("k"),
    );
    let v = tool.execute(json!({"query": "x"}), &c.ctx).await.unwrap();
    assert_eq!(v["count"], 0);

    for args in [
        json!({"query": "  "}),
        json!({"query": "x", "num_results": 0}),
        json!({"q": "x"}),
    ] {
        let e = tool.execute(args, &c.ctx).await.unwrap_err();
        assert_eq!(e.code(), "INVALID_ARGS");
    }
    // Nothing listening: a clear execution failure; a silent backend: timeout.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let tool = searcher(SearchProvider::Searxng, format!("http://{closed}"), None);
    let e = tool
        .execute(json!({"query": "x"}), &c.ctx)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "EXECUTION_FAILED", "{e}");
    let silent = silent_server().await;
    let mut s = searcher(SearchProvider::Searxng, format!("http://{silent}"), None);
    s.settings.timeout = Duration::from_millis(300);
    let e = s.execute(json!({"query": "x"}), &c.ctx).await.unwrap_err();
    assert_eq!(e.code(), "TIMEOUT");
}

#[tokio::test]
async fn search_not_configured_is_informational() {
    let c = ctx();
    let tool = WebSearch::new(WebSearchSettings::default()).unwrap();
    let v = tool
        .execute(json!({"query": "rust"}), &c.ctx)
        .await
        .unwrap();
    assert_eq!(
        v,
        json!({
            "error": "web search not configured",
            "message": "No search API endpoint is configured. Set 'tools.web_search.endpoint' in your config.",
            "query": "rust",
        })
    );
}

#[test]
fn search_config_resolves_and_rejects() {
    let s = WebSearchFile::default().resolve(None).unwrap();
    assert!(s.provider.is_none());
    let s = WebSearchFile {
        endpoint: Some("http://127.0.0.1:8888".into()),
        ..Default::default()
    }
    .resolve(None)
    .unwrap();
    assert_eq!(s.provider, Some(SearchProvider::Searxng));
    let s = WebSearchFile {
        provider: Some("brave".into()),
        api_key_env: Some("BRAVE_KEY".into()),
        ..Default::default()
    }
    .resolve(Some(Secret::new("k")))
    .unwrap();
    assert_eq!(s.endpoint.unwrap().as_str(), BRAVE_DEFAULT_ENDPOINT);
    assert_eq!(s.api_key.unwrap().expose(), "k");
    for (f, key) in [
        (
            WebSearchFile {
                provider: Some("google".into()),
                ..Default::default()
            },
            "provider",
        ),
        (
            WebSearchFile {
                provider: Some("searxng".into()),
                ..Default::default()
            },
            "endpoint",
        ),
        (
            WebSearchFile {
                provider: Some("brave".into()),
                ..Default::default()
            },
            "api_key",
        ),
        (
            WebSearchFile {
                endpoint: Some("ftp://x".into()),
                ..Default::default()
            },
            "endpoint",
        ),
        (
            WebSearchFile {
                endpoint: Some("nope".into()),
                ..Default::default()
            },
            "endpoint",
        ),
        (
            WebSearchFile {
                endpoint: Some("http://x".into()),
                timeout_secs: Some(0),
                ..Default::default()
            },
            "timeout_secs",
        ),
    ] {
        let e = f.resolve(None).unwrap_err().to_string();
        assert!(e.starts_with(&format!("tools.web_search.{key}")), "{e}");
    }
}
