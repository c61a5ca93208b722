//! Shared helpers: configs pointing at the fake LLM, an in-process gateway, an API client.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clawft::cli::gateway::Gateway;
use clawft::config::{Config, Env};
use serde_json::{json, Value};

use crate::fake_llm::FakeLlm;

/// Deep-merge `patch` into `base`.
pub fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, p) => *b = p,
    }
}

/// `base` with `patch` merged in.
pub fn merged(mut base: Value, patch: Value) -> Value {
    merge(&mut base, patch);
    base
}

/// The provider key of [`config_value`]: a configured secret, which the scrubber knows.
pub const PROVIDER_KEY: &str = "sk-test-secret-123456";

/// A config file (JSON) for a gateway whose state lives in `dir` and whose LLM is `llm_url`.
pub fn config_value(llm_url: &str, dir: &Path, extra: Value) -> Value {
    let mut v = json!({
        "agents": { "defaults": { "workspace": dir.join("ws").to_str().unwrap(), "model": "fake-model" } },
        "providers": { "openai": {
            "base_url": llm_url,
            "api_key": PROVIDER_KEY,
            "timeout_secs": 30,
            "max_retries": 3,
        } },
        "channels": { "http": { "bind": "127.0.0.1:0", "reply_timeout_secs": 60 } },
        "store": { "path": dir.join("store").to_str().unwrap(), "cache_mb": 4 },
        "sessions": { "shutdown_grace_secs": 2 },
    });
    merge(&mut v, extra);
    v
}

/// The process environment a test gateway sees.
pub fn test_env(dir: &Path) -> Env {
    Env::from_pairs([
        ("HOME", dir.to_str().unwrap()),
        ("CLAWFT_HOME", dir.join(".clawft").to_str().unwrap()),
    ])
}

/// A validated config.
pub fn config(llm: &FakeLlm, dir: &Path, extra: Value) -> Config {
    let v = config_value(&llm.base_url(), dir, extra);
    Config::from_str(&v.to_string(), false, &test_env(dir)).unwrap()
}

/// A gateway in this process.
pub struct TestGateway {
    pub gateway: Gateway,
    pub api: Api,
}

impl TestGateway {
    pub async fn start(config: Config) -> Self {
        clawft::install_crypto_provider();
        let gateway = Gateway::start(Arc::new(config)).await.unwrap();
        let addr = gateway.http_addr.unwrap();
        let api = Api::with_token(&format!("http://{addr}"), gateway.control_token());
        Self { gateway, api }
    }

    pub async fn stop(self) {
        self.gateway.shutdown().await;
    }
}

/// A client of the HTTP API. Built `with_token`, every request (also through `http`) carries
/// `Authorization: Bearer <token>`.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
}

impl Api {
    /// Without a token.
    pub fn new(base: &str) -> Self {
        Self::with_token(base, None)
    }

    /// With `token` (the gateway's control token) on every request.
    pub fn with_token(base: &str, token: Option<&str>) -> Self {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(t) = token {
            headers.insert(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {t}").parse().unwrap(),
            );
        }
        Self {
            base: base.to_string(),
            http: reqwest::Client::builder()
                .no_proxy()
                .default_headers(headers)
                .build()
                .unwrap(),
        }
    }

    /// POST /v1/chat → (status, body).
    pub async fn chat(&self, chat_id: &str, content: &str) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}/v1/chat", self.base))
            .json(&json!({ "chat_id": chat_id, "content": content }))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// GET `path` as text (`/metrics`).
    pub async fn text(&self, path: &str) -> String {
        self.http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }
}

/// Poll `f` until it is true or `timeout` passes.
/// A listener on 127.0.0.1 that only counts the connections it accepts (a canary: a guard
/// that works leaves it at 0); its address.
pub async fn counting_listener() -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = n.clone();
    tokio::spawn(async move {
        while l.accept().await.is_ok() {
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    (addr, n)
}

pub async fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `messages` of a recorded LLM request.
/// The last user message of a recorded request ("" without one).
/// The model answers `answer: <the text of the user's last message>`.
pub fn echo_model(llm: &crate::fake_llm::FakeLlm) {
    llm.route(|req| {
        Some(crate::fake_llm::Reply::Text(format!(
            "answer: {}",
            last_user(req)
        )))
    });
}

pub fn last_user(req: &Value) -> String {
    messages(req)
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .map(|m| match m["content"].as_array() {
            // Content parts (images): the text parts.
            Some(parts) => parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            None => m["content"].as_str().unwrap_or_default().to_string(),
        })
        .unwrap_or_default()
}

/// Whether a recorded request ends with tool results (the model is asked again after tools).
pub fn has_tool_results(req: &Value) -> bool {
    messages(req).last().is_some_and(|m| m["role"] == "tool")
}

/// The system prompt of a recorded request ("" without one).
pub fn system_of(req: &Value) -> String {
    messages(req)
        .first()
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// The texts the fake Telegram chat `chat` shows, in order.
pub fn shown_in(tg: &clawft_channel_telegram::fake::FakeTelegram, chat: i64) -> Vec<String> {
    tg.sent()
        .into_iter()
        .filter(|m| m.chat == chat)
        .map(|m| m.visible)
        .collect()
}

pub fn messages(req: &Value) -> Vec<Value> {
    req["messages"].as_array().cloned().unwrap_or_default()
}

/// Tool results in a recorded request, as (tool_call_id, parsed content).
pub fn tool_results(req: &Value) -> Vec<(String, Value)> {
    messages(req)
        .into_iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            let content = m["content"].as_str().unwrap_or("");
            (
                m["tool_call_id"].as_str().unwrap_or("").to_string(),
                serde_json::from_str(content).unwrap_or(Value::String(content.to_string())),
            )
        })
        .collect()
}

/// Every byte of the files under `dir` (e.g. the sled store, read after the gateway stopped),
/// as text, so a test can assert that a secret's bytes are absent.
pub fn bytes_under(dir: &Path) -> String {
    let mut all = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                all.extend(std::fs::read(e.path()).unwrap());
            }
        }
    }
    assert!(!all.is_empty(), "nothing under {}", dir.display());
    String::from_utf8_lossy(&all).into_owned()
}

/// The names of the tools a recorded LLM request offered.
pub fn tool_names(req: &Value) -> Vec<String> {
    req["tools"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The tools a recorded LLM request listed as loadable on demand (the system prompt's "More
/// tools" section, issue 32): offered by name, loaded by `tool_search`.
pub fn listed_tools(req: &Value) -> Vec<String> {
    let system = system_of(req);
    let Some(at) = system.find("\n\nMore tools (") else {
        return Vec::new();
    };
    system[at + 2..]
        .lines()
        .skip(1)
        .map_while(|l| l.strip_prefix("- "))
        .map(|l| l.split(':').next().unwrap_or(l).trim().to_string())
        .filter(|n| !n.starts_with('…'))
        .collect()
}

/// The tools a recorded LLM request made reachable: offered with their schema
/// ([`tool_names`]) or listed to be loaded on demand ([`listed_tools`]).
pub fn reachable_tools(req: &Value) -> Vec<String> {
    let mut v = tool_names(req);
    v.extend(listed_tools(req));
    v
}

/// The real MCP test server, server-everything (`npm ci --prefix tests/mcp`).
pub fn everything_js() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        p.exists(),
        "{} is missing: run `npm ci --prefix tests/mcp`",
        p.display()
    );
    p.to_string_lossy().into_owned()
}
