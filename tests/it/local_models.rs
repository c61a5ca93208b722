//! Local model servers as they really behave (docs/local-models.md): an Ollama that reads a
//! prompt with its default 4k window unless the request sets `options.num_ctx`, and cuts the
//! front of a longer one silently (the system prompt and tools first). Through the `ollama`
//! provider the window is asked for and never overrun; through an OpenAI-compatible endpoint
//! (which takes no window) a cut prompt is caught by its token count, and the turn compacts and
//! retries instead of answering from it. A 60-message conversation with tool use completes on
//! both, and no user ever sees an answer written from a prompt that lost its instructions.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};

use crate::common::{config_value, messages, test_env, TestGateway};
use crate::fake_llm::{FakeLlm, Reply, CUT_ANSWER};
use crate::window::{kind, Kind};

/// A model that keeps a note every fifth message (`memory_write`, then a short answer), writes
/// summaries and flushes when asked, and otherwise answers `ok N`.
fn route(llm: &FakeLlm) {
    let summaries = Arc::new(AtomicUsize::new(0));
    llm.route(move |req| {
        let msgs = messages(req);
        let last = msgs.last().cloned().unwrap_or(Value::Null);
        Some(match kind(req) {
            Kind::Summary => {
                let n = summaries.fetch_add(1, Ordering::SeqCst) + 1;
                Reply::Text(format!("SUMMARY-{n}: the user sends numbered notes."))
            }
            Kind::Flush if last["role"] == "tool" => Reply::Text("NO_REPLY".into()),
            Kind::Flush => Reply::ToolCalls(vec![(
                format!("flush_{}", msgs.len()),
                "memory_write".into(),
                json!({"content": "- the user sends numbered notes\n"}).to_string(),
            )]),
            Kind::Chat if last["role"] == "tool" => Reply::Text(format!("noted {}", msgs.len())),
            Kind::Chat => {
                let text = last["content"].as_str().unwrap_or_default();
                if text.contains("keep a note") {
                    Reply::ToolCalls(vec![(
                        format!("note_{}", msgs.len()),
                        "memory_write".into(),
                        json!({"content": format!("- {}\n", &text[..12])}).to_string(),
                    )])
                } else {
                    Reply::Text(format!("ok {}", msgs.len()))
                }
            }
        })
    });
}

/// Message `i`: about 1 KB (some 250 tokens); every fifth asks for a note (a tool call).
fn message(i: usize) -> String {
    let ask = if i % 5 == 4 {
        "keep a note of this. "
    } else {
        ""
    };
    format!(
        "m{i:03} {ask}{}",
        "the quick brown fox jumps over the lazy dog ".repeat(22)
    )
}

fn gateway_config(dir: &std::path::Path, providers: Value, model: &str) -> clawft::config::Config {
    let mut v = config_value(
        "http://unused.invalid/v1",
        dir,
        json!({
            "agents": {"defaults": {"stream": false, "model": model}},
            "tools": {"rate_limit": {"per_minute": 0}},
        }),
    );
    v["providers"] = providers;
    clawft::config::Config::from_str(&v.to_string(), false, &test_env(dir)).unwrap()
}

/// Send 60 messages; every one must be answered (200) with the model's own answer, never the
/// answer of a model whose instructions were cut away.
async fn sixty_messages(gw: &TestGateway) {
    for i in 0..60 {
        let (s, body) = gw.api.chat("local", &message(i)).await;
        assert_eq!(s, 200, "message {i}: {body}");
        let reply = body["reply"].as_str().unwrap_or_default();
        assert_ne!(
            reply, CUT_ANSWER,
            "message {i} was answered from a cut prompt"
        );
        assert!(
            reply.starts_with("ok ") || reply.starts_with("noted "),
            "message {i}: {reply}"
        );
    }
}

#[tokio::test]
async fn ollama_provider_asks_for_its_window_and_a_60_message_chat_keeps_its_instructions() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.ollama(4096, 32768);
    route(&llm);
    let cfg = gateway_config(
        dir.path(),
        json!({"ollama": {"kind": "ollama", "base_url": llm.root_url(), "num_ctx_max": 8192}}),
        "qwen2.5:7b",
    );
    // The agent's window is the one asked of Ollama: the model's 32k capped by num_ctx_max.
    assert_eq!(cfg.agent.window.context_window, 8192);
    let gw = TestGateway::start(cfg).await;
    sixty_messages(&gw).await;
    let reqs = llm.requests();
    assert!(reqs.len() >= 60 + 12, "{} requests", reqs.len());
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(r["options"]["num_ctx"], 8192, "request {i}");
        assert_eq!(r["keep_alive"], "30m", "request {i}");
    }
    // Nothing was cut, and every prompt the model read began with the instructions.
    for (i, (read, cut)) in llm.read().iter().enumerate() {
        assert!(!cut, "request {i} was cut by the server");
        assert_eq!(messages(read)[0]["role"], "system", "request {i}");
    }
    // The tool calls ran (Ollama's calls carry no ids; results still pair with them).
    let results = reqs
        .iter()
        .flat_map(messages)
        .filter(|m| m["role"] == "tool" && m["tool_name"] == "memory_write")
        .count();
    assert!(results >= 12, "{results} memory_write results");
    // The conversation outgrew Ollama's default window: without num_ctx it would have been cut.
    assert!(
        reqs.iter().any(|r| crate::window::size(r) > 4096),
        "the test must outgrow the server's default window"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_prompt_cut_silently_by_an_openai_compatible_server_is_caught_compacted_and_retried() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    // Ollama's OpenAI-compatible endpoint: the server's 4k window, whatever the request says.
    llm.ollama(4096, 32768);
    route(&llm);
    let cfg = gateway_config(
        dir.path(),
        json!({"local": {"base_url": llm.base_url()}}),
        "fake-model",
    );
    let gw = TestGateway::start(cfg).await;
    sixty_messages(&gw).await;
    let read = llm.read();
    let cut: Vec<usize> = (0..read.len()).filter(|&i| read[i].1).collect();
    // The server did cut prompts (the agent assumed a 128k window at first), and each cut was
    // caught: the next request is the compaction and retry, and it was read whole.
    assert!(!cut.is_empty(), "the server never cut a prompt");
    assert!(
        cut.len() <= 3,
        "after the first cut the window was learned; cut again {} times",
        cut.len()
    );
    for &i in &cut {
        assert!(
            read.get(i + 1).is_some_and(|(_, c)| !c),
            "request {i} was cut and not retried whole"
        );
    }
    gw.stop().await;
}

#[tokio::test]
async fn tool_calls_written_as_text_in_each_format_are_run_not_shown() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    // A local server (127.0.0.1): tool calls are read from text (`tool_call_format = "auto"`).
    let cfg = crate::common::config(
        &llm,
        dir.path(),
        json!({"agents": {"defaults": {"stream": false}}}),
    );
    let gw = TestGateway::start(cfg).await;
    let formats = [
        // Hermes/Qwen, with single quotes.
        "<tool_call>\n{'name': 'memory_write', 'arguments': {'content': '- hermes\\n'}}\n</tool_call>",
        // Llama 3.x python tag.
        r#"<|python_tag|>{"name": "memory_write", "parameters": {"content": "- llama\n"}}<|eom_id|>"#,
        // Bare JSON with a trailing comma.
        r#"{"name": "memory_write", "parameters": {"content": "- bare\n",}}"#,
        // Mistral, arguments as a string.
        r#"[TOOL_CALLS][{"name": "memory_write", "arguments": "{\"content\": \"- mistral\\n\"}"}]"#,
        // A fenced block after some words.
        "I'll note that.\n```json\n{\"name\": \"memory_write\", \"arguments\": {\"content\": \"- fenced\\n\"}}\n```",
    ];
    for (i, text) in formats.iter().enumerate() {
        llm.push(Reply::Text((*text).to_string()));
        llm.push(Reply::Text(format!("done {i}")));
        let (s, body) = gw.api.chat(&format!("f{i}"), "please remember this").await;
        assert_eq!(s, 200, "{text}: {body}");
        assert_eq!(body["reply"], format!("done {i}"), "{text}");
        let reqs = llm.requests();
        let last = reqs.last().unwrap();
        let msgs = messages(last);
        let call = msgs.iter().rfind(|m| m["role"] == "assistant").unwrap();
        // The history goes back as a proper tool call, which the server accepts.
        assert_eq!(
            call["tool_calls"][0]["function"]["name"], "memory_write",
            "{text}"
        );
        let result = msgs.last().unwrap();
        assert_eq!(result["role"], "tool", "{text}");
        assert!(
            !result["content"].as_str().unwrap().contains("error"),
            "{text}: {result}"
        );
    }
    gw.stop().await;
}
