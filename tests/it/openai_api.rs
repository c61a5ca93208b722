//! The OpenAI-compatible API (`POST /v1/chat/completions`, `GET /v1/models`) driven by the
//! official `openai` Python SDK against an in-process gateway with two agents.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::common::{config, system_of, tool_results, TestGateway};
use crate::fake_llm::{FakeLlm, Reply};

/// The Python with the `openai` SDK: `$CLAWFT_TEST_PYTHON`, else `.venv-test/bin/python` at
/// the repo root (both set up by `.ci/run`).
fn python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CLAWFT_TEST_PYTHON").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv-test/bin/python");
    venv.exists().then_some(venv)
}

const SETUP: &str = "python3 -m venv .venv-test && .venv-test/bin/pip install -q 'openai>=1.40,<2' (what .ci/run does), or set CLAWFT_TEST_PYTHON to a python with the openai package";

const SCRIPT: &str = r#"
import json, sys
import openai

base, token = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key=token, max_retries=0)
out = {}

r = client.chat.completions.create(
    model="weft",
    user="alice",
    messages=[
        {"role": "system", "content": "CLIENT-SYSTEM"},
        {"role": "user", "content": "EARLIER-QUESTION"},
        {"role": "assistant", "content": "EARLIER-ANSWER"},
        {"role": "user", "content": "hello main"},
    ],
)
out["plain"] = {
    "id": r.id,
    "object": r.object,
    "model": r.model,
    "content": r.choices[0].message.content,
    "role": r.choices[0].message.role,
    "finish": r.choices[0].finish_reason,
    "tool_calls": r.choices[0].message.tool_calls,
    "prompt_tokens": r.usage.prompt_tokens,
    "completion_tokens": r.usage.completion_tokens,
    "total_tokens": r.usage.total_tokens,
}

deltas, roles, finish, usage, objects = [], [], None, None, set()
stream = client.chat.completions.create(
    model="agent:work",
    messages=[{"role": "user", "content": [{"type": "text", "text": "hello work"}]}],
    stream=True,
    stream_options={"include_usage": True},
    extra_headers={"X-Session-Id": "s-work"},
)
for chunk in stream:
    objects.add(chunk.object)
    if chunk.usage is not None:
        usage = chunk.usage.total_tokens
    for c in chunk.choices:
        if c.delta.role:
            roles.append(c.delta.role)
        if c.delta.content:
            deltas.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
out["stream"] = {"deltas": deltas, "roles": roles, "finish": finish, "total_tokens": usage,
                 "objects": sorted(objects)}

out["models"] = [m.id for m in client.models.list()]

bad = openai.OpenAI(base_url=base + "/v1", api_key="not-the-token", max_retries=0)
try:
    bad.models.list()
    out["bad_key"] = None
except openai.AuthenticationError as e:
    out["bad_key"] = {"status": e.status_code, "code": e.code, "type": e.type}

try:
    # Its one-token budget is spent by the first call to the model (the tool round): the turn
    # stops there.
    client.chat.completions.create(model="agent:broke", messages=[{"role": "user", "content": "spend"}])
    out["budget"] = None
except openai.RateLimitError as e:
    out["budget"] = {"status": e.status_code, "code": e.code, "message": e.message}

try:
    client.chat.completions.create(model="agent:nope", messages=[{"role": "user", "content": "hi"}])
    out["unknown"] = None
except openai.NotFoundError as e:
    out["unknown"] = {"status": e.status_code, "code": e.code, "param": e.param, "type": e.type,
                      "message": e.message}

print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_chats_streams_lists_models_and_gets_404_for_unknown_model() {
    let Some(py) = python() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "no python with the openai SDK for it::openai_api: run .ci/run, or {SETUP}"
        );
        eprintln!("SKIPPED it::openai_api: no python with the openai SDK; run {SETUP}");
        return;
    };
    let llm = FakeLlm::start().await;
    // Asked a question, the model first reads its memory (a tool the gateway runs), then
    // answers naming the agent its system prompt describes.
    llm.route(|req| {
        if tool_results(req).is_empty() {
            return Some(Reply::ToolCalls(vec![(
                "m1".into(),
                "memory_read".into(),
                "{}".into(),
            )]));
        }
        let who = if system_of(req).contains("You are WORK.") {
            "work"
        } else {
            "main"
        };
        Some(Reply::Text(format!("answer from the {who} agent")))
    });
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &llm,
        dir.path(),
        json!({"agents": {
            "defaults": {"system_prompt": "You are MAIN."},
            "work": {"system_prompt": "You are WORK."},
            "broke": {"system_prompt": "You are BROKE.", "budgets": {"daily_tokens": 1}},
        }}),
    );
    let gw = TestGateway::start(cfg).await;
    let token = gw.gateway.control_token().unwrap().to_string();
    let script = dir.path().join("client.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let base = gw.api.base.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(py)
            .arg(script)
            .arg(base)
            .arg(token)
            .env("NO_PROXY", "127.0.0.1")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the openai SDK script failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();

    // Plain: only the final answer reaches the client, with the turn's tokens.
    let p = &v["plain"];
    assert_eq!(p["object"], "chat.completion");
    assert_eq!(p["model"], "weft");
    assert!(p["id"].as_str().unwrap().starts_with("chatcmpl-"), "{p}");
    assert_eq!(p["role"], "assistant");
    assert_eq!(p["content"], "answer from the main agent");
    assert_eq!(p["finish"], "stop");
    assert_eq!(p["tool_calls"], Value::Null);
    assert!(p["total_tokens"].as_u64().unwrap() > 0, "{p}");
    assert_eq!(
        p["total_tokens"].as_u64(),
        Some(p["prompt_tokens"].as_u64().unwrap() + p["completion_tokens"].as_u64().unwrap())
    );

    // Streamed, `agent:work`: chunks, the work agent's answer, a stop, then the usage chunk.
    let s = &v["stream"];
    assert_eq!(s["objects"], json!(["chat.completion.chunk"]));
    assert_eq!(s["roles"], json!(["assistant"]));
    let text: String = s["deltas"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(text, "answer from the work agent");
    assert_eq!(s["finish"], "stop");
    assert!(s["total_tokens"].as_u64().unwrap() > 0, "{s}");

    assert_eq!(
        v["models"],
        json!(["weft", "agent:main", "agent:broke", "agent:work"])
    );
    // A wrong key: OpenAI's error object, so the SDK raises AuthenticationError with its code.
    let b = &v["bad_key"];
    assert_eq!(
        (&b["status"], &b["code"]),
        (&json!(401), &json!("invalid_api_key")),
        "{b}"
    );
    // A spending limit reached: 429 insufficient_quota (it was a 502), the reason in the text.
    let q = &v["budget"];
    assert_eq!(
        (&q["status"], &q["code"]),
        (&json!(429), &json!("insufficient_quota")),
        "{q}"
    );
    assert!(
        q["message"].as_str().unwrap_or_default().contains("budget"),
        "{q}"
    );
    let u = &v["unknown"];
    assert_eq!(u["status"], 404, "{u}");
    assert_eq!(u["code"], "model_not_found");
    assert_eq!(u["param"], "model");
    assert_eq!(u["type"], "invalid_request_error");

    // What the model received: each agent's own system prompt; the tool ran server-side (its
    // result went back to the model); only the last user message of the request was sent.
    let reqs = llm.requests();
    let work: Vec<&Value> = reqs
        .iter()
        .filter(|r| system_of(r).contains("You are WORK."))
        .collect();
    assert_eq!(work.len(), 2, "a tool round and the answer");
    assert!(work[0].to_string().contains("hello work"));
    assert_eq!(tool_results(work[1]).len(), 1);
    let main: Vec<&Value> = reqs
        .iter()
        .filter(|r| system_of(r).contains("You are MAIN."))
        .collect();
    assert_eq!(main.len(), 2);
    assert_eq!(tool_results(main[1]).len(), 1);
    for r in &reqs {
        let body = r.to_string();
        for absent in ["CLIENT-SYSTEM", "EARLIER-QUESTION", "EARLIER-ANSWER"] {
            assert!(!body.contains(absent), "{absent} reached the model: {body}");
        }
    }

    // The sessions: `user` and `X-Session-Id` name them, each under its agent.
    let (_, sessions) = gw.api.get("/v1/sessions").await;
    let keys = sessions.to_string();
    assert!(keys.contains("\"http:alice\""), "{keys}");
    assert!(keys.contains("\"@work:http:s-work\""), "{keys}");
    gw.stop().await;
}
