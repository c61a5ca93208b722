//! The bounded prompt window: compaction with a memory flush before it, the context-length
//! retry, messages too large for the window, `/compact`, a restart that loads only the window,
//! and a byte-stable prompt prefix (docs/architecture.md, "Prompt window and compaction").

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};

use crate::common::{config, messages, TestGateway};
use crate::fake_llm::{est_tokens, FakeLlm, Reply};

const FLUSH_MARK: &str = "[Context maintenance";
const SUMMARY_MARK: &str = "You summarise conversations";
const SUMMARY_HEADER: &str = "[Summary of the earlier conversation";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Flush,
    Summary,
    Chat,
}

pub fn kind(req: &Value) -> Kind {
    let msgs = messages(req);
    if msgs
        .first()
        .and_then(|m| m["content"].as_str())
        .is_some_and(|c| c.starts_with(SUMMARY_MARK))
    {
        return Kind::Summary;
    }
    if msgs.iter().any(|m| {
        m["role"] == "user"
            && m["content"]
                .as_str()
                .is_some_and(|c| c.starts_with(FLUSH_MARK))
    }) {
        return Kind::Flush;
    }
    Kind::Chat
}

/// The prompt of a request as the fake sizes it (tools and messages, serialised), plus the
/// completion it asks room for.
pub fn size(req: &Value) -> u64 {
    let mut v = serde_json::to_vec(&req["tools"]).unwrap();
    v.extend(serde_json::to_vec(&req["messages"]).unwrap());
    est_tokens(v.len()) + req["max_tokens"].as_u64().unwrap_or(0)
}

/// A model that answers the flush with `memory_write` then NO_REPLY, the summary call with
/// `SUMMARY-n`, and chat with `ok`.
pub fn route(llm: &FakeLlm) {
    let summaries = Arc::new(AtomicUsize::new(0));
    llm.route(move |req| {
        let msgs = messages(req);
        Some(match kind(req) {
            Kind::Summary => {
                let n = summaries.fetch_add(1, Ordering::SeqCst) + 1;
                Reply::Text(format!(
                    "SUMMARY-{n}: the user sends numbered paragraphs of lorem ipsum."
                ))
            }
            Kind::Flush if msgs.last().unwrap()["role"] == "tool" => Reply::Text("NO_REPLY".into()),
            Kind::Flush => Reply::ToolCalls(vec![(
                format!("flush_{}", msgs.len()),
                "memory_write".into(),
                json!({"content": "- the user sends numbered paragraphs\n"}).to_string(),
            )]),
            Kind::Chat => Reply::Text(format!("ok {}", msgs.len())),
        })
    });
}

fn paragraph(i: usize) -> String {
    format!("m{i:03} {}", "lorem ipsum dolor sit amet ".repeat(37))
}

fn window_config(llm: &FakeLlm, dir: &std::path::Path, window: u64) -> clawft::config::Config {
    config(
        llm,
        dir,
        // Hundreds of messages a second: the per-session tool rate limit, which the memory
        // flushes count against, is not what these tests are about.
        json!({
            "agents": {"defaults": {"context_window": window, "stream": false}},
            "tools": {"rate_limit": {"per_minute": 0}},
        }),
    )
}

async fn stored_user_messages(gw: &TestGateway, key: &str) -> Vec<String> {
    let (s, v) = gw.api.get(&format!("/v1/sessions/{key}")).await;
    assert_eq!(s, 200, "{v}");
    v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn two_hundred_messages_in_an_8k_window_stay_bounded_and_all_answered() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.strict(Some(8192));
    route(&llm);
    let gw = TestGateway::start(window_config(&llm, dir.path(), 8192)).await;
    for i in 0..200 {
        let (s, body) = gw.api.chat("long", &paragraph(i)).await;
        assert_eq!(s, 200, "message {i}: {body}");
        let reply = body["reply"].as_str().unwrap();
        assert!(reply.starts_with("ok "), "message {i}: {reply}");
    }
    let reqs = llm.requests();
    let kinds: Vec<Kind> = reqs.iter().map(kind).collect();
    // Every request fitted the window (the strict fake would have refused it).
    for (i, r) in reqs.iter().enumerate() {
        assert!(size(r) <= 8192, "request {i} is {} tokens", size(r));
    }
    let summaries: Vec<usize> = (0..kinds.len())
        .filter(|&i| kinds[i] == Kind::Summary)
        .collect();
    assert!(
        summaries.len() >= 5,
        "200 KB through an 8k window needs many compactions, saw {}",
        summaries.len()
    );
    // A flush (memory_write, then NO_REPLY) right before each summary.
    for &i in &summaries {
        assert_eq!(kinds[i - 1], Kind::Flush, "request {}", i - 1);
        assert_eq!(kinds[i - 2], Kind::Flush, "request {}", i - 2);
        let tool = messages(&reqs[i - 1])
            .into_iter()
            .rfind(|m| m["role"] == "tool")
            .unwrap();
        assert!(
            !tool["content"].as_str().unwrap().contains("error"),
            "{tool}"
        );
    }
    // After each compaction, the chat requests carry the newest summary after the system
    // prompt.
    for (n, &i) in summaries.iter().enumerate() {
        let next = (i..reqs.len()).find(|&j| kinds[j] == Kind::Chat).unwrap();
        let m = messages(&reqs[next]);
        let first = m[1]["content"].as_str().unwrap();
        assert!(first.starts_with(SUMMARY_HEADER), "{first}");
        assert!(first.contains(&format!("SUMMARY-{}:", n + 1)), "{first}");
    }
    // Chat requests number 200: no turn was retried or lost.
    assert_eq!(kinds.iter().filter(|k| **k == Kind::Chat).count(), 200);
    // The store holds the whole conversation.
    let users = stored_user_messages(&gw, "http:long").await;
    assert_eq!(users.len(), 200);
    for (i, u) in users.iter().enumerate() {
        assert_eq!(u, &paragraph(i));
    }
    // The chat never saw the flush.
    let (_, v) = gw.api.get("/v1/sessions/http:long").await;
    let all = v.to_string();
    assert!(!all.contains("NO_REPLY") && !all.contains(FLUSH_MARK));
    println!(
        "requests: {}, compactions: {}, largest prompt: {} tokens",
        reqs.len(),
        summaries.len(),
        reqs.iter().map(size).max().unwrap()
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_context_length_error_compacts_and_retries_once() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    // The provider's real window is smaller than the configured one. It leaves ~4.6k tokens
    // for the conversation after the tool schemas (~5.3k with the memory, cron, process and
    // session tools).
    const WINDOW: u64 = 9216 + 800;
    llm.strict(Some(WINDOW));
    route(&llm);
    let gw = TestGateway::start(window_config(&llm, dir.path(), 65536)).await;
    for i in 0..40 {
        let (s, body) = gw.api.chat("retry", &paragraph(i)).await;
        assert_eq!(s, 200, "message {i}: {body}");
        assert!(body["reply"].as_str().unwrap().starts_with("ok "), "{body}");
    }
    // Sizes as sent (the times before the messages included).
    let reqs = llm.raw_requests();
    let refused: Vec<usize> = (0..reqs.len())
        .filter(|&i| size(&reqs[i]) > WINDOW)
        .collect();
    assert!(!refused.is_empty(), "the window was never exceeded");
    // The first refusal was followed by a flush, a summary and the retried turn, answered.
    let i = refused[0];
    assert_eq!(kind(&reqs[i]), Kind::Chat);
    let after: Vec<Kind> = reqs[i + 1..].iter().map(kind).collect();
    let summary = after.iter().position(|k| *k == Kind::Summary).unwrap();
    assert!(
        summary > 0 && after[..summary].iter().all(|k| *k == Kind::Flush),
        "{after:?}"
    );
    let retried = i + 1 + after.iter().position(|k| *k == Kind::Chat).unwrap();
    assert!(size(&reqs[retried]) <= WINDOW);
    // Once learned, the smaller window holds: refusals stay rare, and compaction does not
    // run on every turn.
    assert!(refused.len() <= 2, "refused {} times", refused.len());
    let summaries = reqs.iter().filter(|r| kind(r) == Kind::Summary).count();
    // Every request carries the tool schemas (~4.5k of these 9k tokens), so a compaction every
    // few messages is expected; one per message is not.
    assert!(summaries <= 16, "{summaries} summary calls for 40 messages");
    assert_eq!(stored_user_messages(&gw, "http:retry").await.len(), 40);
    gw.stop().await;
}

#[tokio::test]
async fn a_message_larger_than_the_window_is_refused_with_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.strict(Some(8192));
    route(&llm);
    let gw = TestGateway::start(window_config(&llm, dir.path(), 8192)).await;
    // Under the HTTP channel's 32 KB limit, over the window with the tools beside it.
    let big = "x".repeat(30_000);
    let (s, body) = gw.api.chat("big", &big).await;
    assert_eq!(s, 502, "{body}");
    let err = body["error"].as_str().unwrap();
    assert!(
        err.contains("~7504 tokens") && err.contains("window is 8192"),
        "{err}"
    );
    assert!(err.contains("as a file or in parts"), "{err}");
    assert!(llm.requests().is_empty(), "the model was asked anyway");
    // The session goes on.
    let (s, body) = gw.api.chat("big", "hello").await;
    assert_eq!(s, 200, "{body}");
    assert!(body["reply"].as_str().unwrap().starts_with("ok"));
    assert!(!llm.requests()[0].to_string().contains(&big[..100]));
    gw.stop().await;
}

#[tokio::test]
async fn compact_command_summarises_now_and_new_still_clears() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    route(&llm);
    let gw = TestGateway::start(window_config(&llm, dir.path(), 128_000)).await;
    for i in 0..6 {
        assert_eq!(gw.api.chat("cmd", &format!("fact {i}")).await.0, 200);
    }
    let (s, body) = gw.api.chat("cmd", "/compact").await;
    assert_eq!(s, 200, "{body}");
    let reply = body["reply"].as_str().unwrap();
    assert!(
        reply.starts_with("Compacted 10 messages into a summary"),
        "{reply}"
    );
    assert!(reply.contains("the last 2 stay verbatim"), "{reply}");
    let kinds: Vec<Kind> = llm.requests().iter().map(kind).collect();
    assert_eq!(
        &kinds[6..],
        [Kind::Flush, Kind::Flush, Kind::Summary],
        "{kinds:?}"
    );
    // The next turn sees the summary and the last exchange, not the older ones.
    gw.api.chat("cmd", "and now?").await;
    let last = llm.requests().last().unwrap().clone();
    let m = messages(&last);
    assert!(m[1]["content"].as_str().unwrap().contains("SUMMARY-1"));
    assert_eq!(m[2]["content"], "fact 5");
    assert!(!last.to_string().contains("fact 4"));
    // /compact itself is not in the transcript; everything else is.
    let users = stored_user_messages(&gw, "http:cmd").await;
    assert_eq!(users.len(), 7, "{users:?}");
    // /new drops the summary too.
    assert_eq!(gw.api.chat("cmd", "/new").await.0, 200);
    gw.api.chat("cmd", "fresh").await;
    let last = llm.requests().last().unwrap().clone();
    assert!(!last.to_string().contains("SUMMARY-1"), "{last}");
    assert_eq!(messages(&last).len(), 2);
    gw.stop().await;
}

#[tokio::test]
async fn a_restarted_gateway_loads_only_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    route(&llm);
    let gw = TestGateway::start(window_config(&llm, dir.path(), 128_000)).await;
    for i in 0..6 {
        assert_eq!(gw.api.chat("again", &format!("fact {i}")).await.0, 200);
    }
    assert_eq!(gw.api.chat("again", "/compact").await.0, 200);
    gw.stop().await;

    let gw = TestGateway::start(window_config(&llm, dir.path(), 128_000)).await;
    let (s, body) = gw.api.chat("again", "still there?").await;
    assert_eq!(s, 200, "{body}");
    let last = llm.requests().last().unwrap().clone();
    let m = messages(&last);
    assert!(
        m[1]["content"].as_str().unwrap().contains("SUMMARY-1"),
        "{last}"
    );
    let contents: Vec<&str> = m[2..]
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(contents[0], "fact 5");
    assert_eq!(contents.last().unwrap(), &"still there?");
    assert_eq!(contents.len(), 3, "{contents:?}");
    assert_eq!(stored_user_messages(&gw, "http:again").await.len(), 7);
    gw.stop().await;
}

#[tokio::test]
async fn the_prompt_prefix_is_byte_stable_and_cached() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    route(&llm);
    let gw = TestGateway::start(window_config(&llm, dir.path(), 128_000)).await;
    for t in ["first", "second", "third"] {
        assert_eq!(gw.api.chat("cache", t).await.0, 200);
    }
    let reqs = llm.requests();
    let prefix =
        |r: &Value| serde_json::to_string(&(r["tools"].clone(), messages(r)[0].clone())).unwrap();
    assert_eq!(prefix(&reqs[0]), prefix(&reqs[1]));
    assert_eq!(prefix(&reqs[1]), prefix(&reqs[2]));
    // The provider reported cached prompt tokens, counted in the metrics.
    let text = gw
        .api
        .http
        .get(format!("{}/metrics", gw.api.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let cached: u64 = text
        .lines()
        .filter(|l| l.starts_with("clawft_llm_tokens_total{") && l.contains("kind=\"cached\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(cached > 0, "{text}");
    gw.stop().await;
}

/// The prompt of a request as the fake sizes it (tools and messages), without the completion.
fn prompt_size(req: &Value) -> u64 {
    size(req) - req["max_tokens"].as_u64().unwrap_or(0)
}

#[tokio::test]
async fn a_chat_past_its_prompt_budget_stays_under_it_and_still_finds_what_was_said_first() {
    // The done-when test of the prompt budget: one chat driven far past a small budget in a
    // big window. Every request stays under the budget, the strict provider accepts every
    // transcript, and a fact of the first turn, long summarised away (the summaries do not
    // keep it, nor does memory), is found through the chat's own history.
    const BUDGET: u64 = 8000;
    const FACT: &str = "teal-7731";
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.strict(Some(128_000));
    let summaries = Arc::new(AtomicUsize::new(0));
    llm.route(move |req| {
        let msgs = messages(req);
        let last = msgs.last().unwrap();
        Some(match kind(req) {
            Kind::Summary => {
                let n = summaries.fetch_add(1, Ordering::SeqCst) + 1;
                Reply::Text(format!("SUMMARY-{n}: the user sends numbered paragraphs."))
            }
            // Nothing saved to memory: only the history can answer.
            Kind::Flush => Reply::Text("NO_REPLY".into()),
            Kind::Chat if last["role"] == "tool" => {
                let found = last["content"]
                    .as_str()
                    .unwrap()
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                    .find(|w| w.starts_with("teal-"))
                    .map(str::to_string);
                Reply::Text(match found {
                    Some(colour) => format!("In March we decided on {colour}."),
                    None => "I could not find it.".into(),
                })
            }
            Kind::Chat
                if last["content"]
                    .as_str()
                    .is_some_and(|c| c.contains("What colour did we decide")) =>
            {
                Reply::ToolCalls(vec![(
                    "h1".into(),
                    "history_search".into(),
                    json!({"query": "boat painted colour March"}).to_string(),
                )])
            }
            Kind::Chat => Reply::Text(format!("ok {}", msgs.len())),
        })
    });
    let cfg = config(
        &llm,
        dir.path(),
        json!({
            "agents": {"defaults": {"prompt_budget_tokens": BUDGET, "context_window": 128_000, "stream": false}},
            "tools": {"rate_limit": {"per_minute": 0}},
        }),
    );
    assert_eq!(cfg.agent.window.prompt_budget, BUDGET);
    let gw = TestGateway::start(cfg).await;
    let first = format!("For the record: in March we decided the boat will be painted {FACT}.");
    let (s, body) = gw.api.chat("budget", &first).await;
    assert_eq!(s, 200, "{body}");
    for i in 0..40 {
        let (s, body) = gw.api.chat("budget", &paragraph(i)).await;
        assert_eq!(s, 200, "message {i}: {body}");
        assert!(body["reply"].as_str().unwrap().starts_with("ok "), "{body}");
    }
    let (s, body) = gw
        .api
        .chat(
            "budget",
            "What colour did we decide for the boat back in March?",
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let reply = body["reply"].as_str().unwrap();
    assert!(reply.contains(FACT), "{reply}");

    let reqs = llm.raw_requests();
    let kinds: Vec<Kind> = reqs.iter().map(kind).collect();
    let compactions = kinds.iter().filter(|k| **k == Kind::Summary).count();
    assert!(compactions >= 2, "{compactions} compactions");
    // Every request the chat sent stayed under the budget (tool schemas included), the
    // memory flush's too; the summary calls have no tools and are smaller.
    for (i, r) in reqs.iter().enumerate() {
        assert!(
            prompt_size(r) <= BUDGET,
            "request {i} ({:?}) carries {} tokens, over the budget of {BUDGET}",
            kinds[i],
            prompt_size(r)
        );
    }
    // The question's turn: the first turn is no longer in its prompt (only a summary that
    // does not know the fact), the model searched the history, and the result held the fact.
    let asked = reqs.len() - 2;
    let sent = messages(&reqs[asked])
        .iter()
        .map(ToString::to_string)
        .collect::<String>();
    assert!(
        !sent.contains(FACT),
        "the first turn is still in the prompt"
    );
    assert!(sent.contains(SUMMARY_HEADER), "no summary in the prompt");
    let m = messages(&reqs[asked + 1]);
    let result = m.last().unwrap();
    assert_eq!(result["role"], "tool");
    let found: Value = serde_json::from_str(result["content"].as_str().unwrap()).unwrap();
    let top = &found["results"][0];
    assert!(top["text"].as_str().unwrap().contains(FACT), "{found}");
    assert_eq!(top["role"], "user");
    assert_eq!(top["index"], 0, "{found}");
    assert!(top["said_at"].is_string(), "{found}");
    // The session view shows the budget, the window and the summary.
    let (s, v) = gw.api.get("/v1/sessions/http:budget").await;
    assert_eq!(s, 200, "{v}");
    let w = &v["window"];
    assert_eq!(w["prompt_budget_tokens"], BUDGET, "{w}");
    assert_eq!(w["context_window"], 128_000, "{w}");
    assert!(
        w["summary"].as_str().unwrap().starts_with("SUMMARY-"),
        "{w}"
    );
    assert!(w["tokens_estimate"].as_u64().unwrap() < BUDGET, "{w}");
    // `weft usage --session`: the chat's turns, and its input tokens per turn, which the
    // budget keeps under it.
    let r = gw
        .api
        .http
        .post(format!("{}/v1/admin/usage", gw.api.base))
        .json(&json!({"session": "http:budget", "days": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let u: Value = r.json().await.unwrap();
    assert_eq!(u["total"]["turns"], 42, "{u}");
    let chat_calls = kinds.iter().filter(|k| **k == Kind::Chat).count() as u64;
    assert!(u["total"]["calls"].as_u64().unwrap() >= chat_calls, "{u}");
    let per_turn = u["total"]["input_tokens_per_turn"].as_u64().unwrap();
    assert!(per_turn > 0 && per_turn < BUDGET, "{u}");
    println!(
        "requests: {}, compactions: {compactions}, largest chat prompt: {} tokens",
        reqs.len(),
        reqs.iter()
            .zip(&kinds)
            .filter(|(_, k)| **k == Kind::Chat)
            .map(|(r, _)| prompt_size(r))
            .max()
            .unwrap()
    );
    gw.stop().await;
}
