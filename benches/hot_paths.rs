//! Criterion benches of the gateway's hot paths (issue 8): tool dispatch through the registry,
//! scrubbing + truncation of a 64 KiB tool result, transcript append to the store (per message
//! with batched flushes, per turn with a flush per turn), LLM request building, and Markdown
//! rendering and splitting, memory search over 10,000 notes (issue 18).
//! `cargo bench --bench hot_paths` (see docs/performance.md).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clawft::config::{Config, Env};
use clawft::llm::openai::{OpenAiCompat, OpenAiConfig};
use clawft::llm::{ChatRequest, Message, ToolCall};
use clawft::store::{JournalOutcome, Store};
use clawft::tools::scrub::Scrubber;
use clawft::tools::truncate::truncate_result;
use clawft::tools::{ToolContext, ToolRegistry, Workspace, MAX_TOOL_RESULT_BYTES};
use clawft::types::SessionKey;
use clawft_channel_core::text::{split_markdown, Measure};
use clawft_channel_core::{
    now_ms, ChannelId, ChatId, InboundEvent, OutboundKind, OutboundMessage, PlatformEventId, UserId,
};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const SECRET: &str = "sk-bench-secret-value-0123456789";

/// A validated config over `dir` (workspace `dir/ws`, store `dir/store`).
fn config(dir: &Path) -> Config {
    let v = json!({
        "agents": { "defaults": { "workspace": dir.join("ws"), "model": "bench-model" } },
        "providers": { "openai": { "base_url": "http://127.0.0.1:9/v1", "api_key": SECRET } },
        "store": { "path": dir.join("store") },
        "tools": { "rate_limit": { "per_minute": 0 } },
    });
    let env = Env::from_pairs([
        ("HOME", dir.to_str().unwrap()),
        ("CLAWFT_HOME", dir.join(".clawft").to_str().unwrap()),
    ]);
    Config::from_str(&v.to_string(), false, &env).unwrap()
}

/// The daemon's registry (every built-in tool, policy, scrubbing) over a temp dir.
fn registry(dir: &Path) -> ToolRegistry {
    clawft::install_crypto_provider();
    std::fs::create_dir_all(dir.join("ws")).unwrap();
    let config = config(dir);
    let hub = clawft::subagent::SubagentHub::new(config.tools.subagents.clone());
    clawft::daemon::build_registry(
        &config,
        None,
        None,
        Vec::new(),
        clawft::daemon::build::RegistryParts {
            subagents: Some(hub),
            ..Default::default()
        },
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn tool_dispatch(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path());
    std::fs::write(
        dir.path().join("ws/note.txt"),
        "hello from the benchmark workspace\nsecond line\n",
    )
    .unwrap();
    let ctx = ToolContext {
        workspace: Arc::new(Workspace::open(&dir.path().join("ws")).unwrap()),
        session: SessionKey::parse("http:bench").unwrap(),
        cancel: CancellationToken::new(),
        user_dir: None,
        sender: None,
        call_id: None,
        turn: Default::default(),
    };
    let rt = runtime();
    let mut g = c.benchmark_group("tool_dispatch");
    g.bench_function("read_file_small", |b| {
        b.iter(|| {
            rt.block_on(reg.dispatch(
                "read_file",
                "call_1",
                black_box(r#"{"path":"note.txt"}"#),
                &ctx,
            ))
        });
    });
    g.bench_function("list_directory_dot", |b| {
        b.iter(|| {
            rt.block_on(reg.dispatch(
                "list_directory",
                "call_1",
                black_box(r#"{"path":"."}"#),
                &ctx,
            ))
        });
    });
    g.bench_function("unknown_tool", |b| {
        b.iter(|| rt.block_on(reg.dispatch("no_such_tool", "call_1", black_box("{}"), &ctx)));
    });
    g.finish();
}

/// A tool result of about `bytes` of text: log-like lines, one secret near the end.
fn big_result(bytes: usize) -> Value {
    let mut s = String::with_capacity(bytes + 128);
    let mut i = 0;
    while s.len() < bytes {
        s.push_str(&format!(
            "{i:06} INFO request handled path=/api/items/{i} status=200 took=3ms user=alice\n"
        ));
        i += 1;
    }
    s.truncate(bytes - SECRET.len() - 8);
    s.push_str(" token=");
    s.push_str(SECRET);
    json!({ "path": "logs/app.log", "content": s, "lines": i })
}

fn scrub_truncate(c: &mut Criterion) {
    let scrubber = Scrubber::new(vec![SECRET.to_string()]);
    let v64 = big_result(64 * 1024);
    let v128 = big_result(128 * 1024);
    let mut g = c.benchmark_group("scrub_truncate");
    g.throughput(Throughput::Bytes(64 * 1024));
    g.bench_function("scrub_64k", |b| {
        b.iter_batched(
            || v64.clone(),
            |mut v| {
                scrubber.scrub_value(&mut v);
                v
            },
            BatchSize::SmallInput,
        );
    });
    g.bench_function("truncate_128k_to_64k", |b| {
        b.iter_batched(
            || v128.clone(),
            |v| truncate_result(v, MAX_TOOL_RESULT_BYTES),
            BatchSize::SmallInput,
        );
    });
    // What the registry does with every result: sanitise and scrub, truncate, serialise.
    g.bench_function("scrub_truncate_serialise_64k", |b| {
        b.iter_batched(
            || v64.clone(),
            |mut v| {
                scrubber.clean_value(&mut v);
                serde_json::to_string(&truncate_result(v, MAX_TOOL_RESULT_BYTES)).unwrap()
            },
            BatchSize::SmallInput,
        );
    });
    // Coloured output (every line has ANSI escapes): the sanitiser rewrites the whole text.
    let ansi = {
        let mut v = v64.clone();
        let text = v["content"]
            .as_str()
            .unwrap_or_default()
            .replace(" INFO ", " \u{1b}[32mINFO\u{1b}[0m ");
        v["content"] = json!(text);
        v
    };
    g.bench_function("clean_64k_ansi", |b| {
        b.iter_batched(
            || ansi.clone(),
            |mut v| {
                scrubber.clean_value(&mut v);
                v
            },
            BatchSize::SmallInput,
        );
    });
    g.finish();
}

fn event(i: u64) -> InboundEvent {
    InboundEvent {
        channel: ChannelId::new("http"),
        chat: ChatId::new("bench"),
        thread: None,
        sender: UserId::new("http"),
        sender_name: None,
        event_id: PlatformEventId::new(format!("ev-{i}")),
        content: "what does note.txt say?".into(),
        received_at_ms: now_ms(),
        attachments: Vec::new(),
        origin: clawft_channel_core::Origin::User,
    }
}

fn tool_round(i: u64) -> [Message; 2] {
    let mut a = Message::assistant("");
    a.tool_calls = vec![ToolCall {
        id: format!("call_{i}"),
        name: "read_file".into(),
        arguments: r#"{"path":"note.txt"}"#.into(),
    }];
    let r = Message::tool_result(
        format!("call_{i}"),
        "read_file",
        r#"{"path":"note.txt","content":"hello from the benchmark workspace\nsecond line\n","lines":2}"#,
    );
    [a, r]
}

/// One short turn as the daemon stores it: journal (flush), begin, tool round, finish (flush).
fn store_turn(store: &Store, key: &SessionKey, i: u64) {
    let JournalOutcome::New(entry) = store.journal_inbound(&event(i), key).unwrap() else {
        panic!("duplicate");
    };
    store
        .begin_turn(&entry, &Message::user("what does note.txt say?"))
        .unwrap();
    store.append_messages(key, &tool_round(i)).unwrap();
    let reply = OutboundMessage {
        id: format!("out-{i}"),
        channel: ChannelId::new("http"),
        chat: ChatId::new("bench"),
        thread: None,
        in_reply_to: Some(PlatformEventId::new(format!("ev-{i}"))),
        body: clawft_channel_core::OutboundBody::text_of(
            OutboundKind::Final,
            "Done: the note says hello.".into(),
        ),
        attachments: Vec::new(),
    };
    store
        .finish_turn(
            key,
            Some(&entry),
            &[Message::assistant("Done: the note says hello.")],
            Some(&reply),
        )
        .unwrap();
    store.outbound_done(&reply.id).unwrap();
}

fn store_append(c: &mut Criterion) {
    let mut g = c.benchmark_group("store");
    g.measurement_time(Duration::from_secs(5));
    // Per message, one flush per 100 messages.
    g.bench_function("append_message_batched_flush_per_100", |b| {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store"), 8 << 20).unwrap();
        let key = SessionKey::parse("http:bench").unwrap();
        let msg = [Message::user("a short one-line message of a chat")];
        b.iter_custom(|iters| {
            let t0 = Instant::now();
            for i in 0..iters {
                store.append_messages(&key, &msg).unwrap();
                if i % 100 == 99 {
                    store.flush().unwrap();
                }
            }
            store.flush().unwrap();
            t0.elapsed()
        });
    });
    // Per message, never flushed (sled's own background flush only): the apply cost alone.
    g.bench_function("append_message_no_flush", |b| {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store"), 8 << 20).unwrap();
        let key = SessionKey::parse("http:bench").unwrap();
        let msg = [Message::user("a short one-line message of a chat")];
        b.iter(|| store.append_messages(&key, &msg).unwrap());
    });
    // Per turn: journal + begin + tool round + finish, flushed twice as the daemon does.
    g.bench_function("short_turn_flush_per_turn", |b| {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store"), 8 << 20).unwrap();
        let key = SessionKey::parse("http:bench").unwrap();
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            store_turn(&store, &key, i);
        });
    });
    g.finish();
    // Bytes on disk per short turn, printed once (not a criterion figure).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = Store::open(&path, 8 << 20).unwrap();
    let key = SessionKey::parse("http:disk").unwrap();
    store_turn(&store, &key, 0);
    store.flush().unwrap();
    let before = store.size_on_disk();
    let n = 2000;
    for i in 1..=n {
        store_turn(&store, &key, i);
    }
    store.flush().unwrap();
    let after = store.size_on_disk();
    println!(
        "store/bytes_on_disk_per_short_turn: {:.0} bytes ({} -> {} over {n} turns; budget <= 2048)",
        after.saturating_sub(before) as f64 / n as f64,
        before,
        after
    );
}

fn request_building(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path());
    let provider = OpenAiCompat::new(OpenAiConfig {
        name: "openai".into(),
        base_url: "http://127.0.0.1:9/v1".into(),
        api_key: Some(SECRET.into()),
        model: "bench-model".into(),
        timeout: Duration::from_secs(60),
        extra_headers: vec![],
    })
    .unwrap();
    let system = clawft::session::prompt::system_prompt(None, &dir.path().join("ws"));
    let first = ChatRequest {
        model: String::new(),
        messages: vec![
            Message::system(system),
            Message::user("What does note.txt say?"),
        ],
        tools: reg.schemas().into(),
        max_tokens: None,
        temperature: None,
    };
    let mut after_tool = first.clone();
    after_tool.messages.extend(tool_round(1));
    println!(
        "request_building: first request {} bytes, {} tools (budget <= 16384 bytes)",
        provider.encode_request(&first, true).len(),
        first.tools.len()
    );
    let mut g = c.benchmark_group("request_building");
    g.bench_function("schemas_from_registry", |b| b.iter(|| reg.schemas()));
    g.bench_function("first_request_stream", |b| {
        b.iter(|| provider.encode_request(black_box(&first), true));
    });
    g.bench_function("after_tool_request_stream", |b| {
        b.iter(|| provider.encode_request(black_box(&after_tool), true));
    });
    g.finish();
}

/// A Markdown reply of about `paras` paragraphs with code, lists, links and emphasis.
fn markdown(paras: usize) -> String {
    let mut s = String::new();
    for i in 0..paras {
        s.push_str(&format!(
            "## Section {i}\n\nSome **bold** and _italic_ text with `inline code`, a [link](https://example.com/{i}) and <angle> & ampersands.\n\n- item one\n- item two with **bold**\n\n```rust\nfn main() {{ println!(\"{i}\"); }}\n```\n\n"
        ));
    }
    s
}

fn markdown_render(c: &mut Criterion) {
    let short = markdown(2);
    let long = markdown(60);
    let mut g = c.benchmark_group("markdown");
    g.throughput(Throughput::Bytes(long.len() as u64));
    g.bench_function("split_markdown_long_4096_utf16", |b| {
        b.iter(|| split_markdown(black_box(&long), 4096, Measure::Utf16));
    });
    g.bench_function("split_markdown_long_2000_chars", |b| {
        b.iter(|| split_markdown(black_box(&long), 2000, Measure::Chars));
    });
    g.bench_function("telegram_html_long", |b| {
        b.iter(|| clawft_channel_telegram::render::markdown_to_html(black_box(&long)));
    });
    g.bench_function("discord_chunks_long", |b| {
        b.iter(|| clawft_channel_discord::render::render_chunks(black_box(&long)));
    });
    g.bench_function("slack_mrkdwn_long", |b| {
        b.iter(|| clawft_channel_slack::render::render(black_box(&long)));
    });
    g.finish();
    let mut g = c.benchmark_group("markdown_short");
    g.bench_function("telegram_html_short", |b| {
        b.iter(|| clawft_channel_telegram::render::markdown_to_html(black_box(&short)));
    });
    g.bench_function("split_markdown_short", |b| {
        b.iter(|| split_markdown(black_box(&short), 4096, Measure::Utf16));
    });
    g.finish();
}

/// What token accounting adds to a turn of one LLM call: price it, check the budgets before
/// and between calls, and write the usage record (read, add, encode, apply; the flush is the
/// turn's own and not counted here).
fn usage_accounting(c: &mut Criterion) {
    let mut g = c.benchmark_group("usage");
    g.measurement_time(Duration::from_secs(5));
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store"), 8 << 20).unwrap();
    let mut config = clawft::config::usage::UsageConfig::default();
    config.budgets.daily_usd = Some(1e9);
    config.budgets.per_session_daily_usd = Some(1e9);
    config.budgets.per_user_daily_usd = Some(1e9);
    let ledger = clawft::turn::usage::UsageLedger::load(store, config).unwrap();
    let used = clawft::llm::Usage {
        input_tokens: 1200,
        output_tokens: 80,
        cached_tokens: 1024,
        estimated: false,
    };
    g.bench_function("per_turn_one_call", |b| {
        b.iter(|| {
            ledger.admit("http:bench", "http:alice", &[]).unwrap();
            let mut turn = Vec::new();
            ledger.tally(&mut turn, "gpt-4o-mini-2024-07-18", black_box(&used));
            ledger.check_running("http:bench", &turn).unwrap();
            ledger.record("http:bench", "http:alice", &turn).unwrap();
        });
    });
    g.finish();
}

/// A deterministic synthetic memory corpus: `notes` notes of ~300–600 bytes, words drawn from
/// a Zipf-distributed vocabulary of 5,000 made-up words (syllable compounds, so stemming and
/// folding do real work), a heading now and then, and three rare words in a few notes each.
fn memory_corpus(notes: usize) -> Vec<(String, String)> {
    const SYLLABLES: [&str; 24] = [
        "ka", "lo", "mi", "ne", "sa", "tu", "ri", "po", "ve", "da", "fen", "gar", "hol", "jin",
        "mor", "pal", "quin", "rust", "sel", "tor", "ung", "vix", "wel", "zor",
    ];
    const SUFFIXES: [&str; 6] = ["", "s", "ing", "ed", "er", "ly"];
    let mut rng = fastrand::Rng::with_seed(18);
    let vocabulary: Vec<String> = (0..5000)
        .map(|i| {
            let mut w = String::new();
            let mut n = i + 24;
            while n > 0 {
                w.push_str(SYLLABLES[n % 24]);
                n /= 24;
            }
            w
        })
        .collect();
    // Zipf (s = 1): cumulative weights 1/rank.
    let mut cumulative = Vec::with_capacity(vocabulary.len());
    let mut total = 0f64;
    for rank in 1..=vocabulary.len() {
        total += 1.0 / rank as f64;
        cumulative.push(total);
    }
    let rare = ["quetzalcoatl", "zanzibar", "xylophonist"];
    (0..notes)
        .map(|i| {
            let target = rng.usize(300..600);
            let mut text = String::new();
            if i % 4 == 0 {
                text.push_str("# Notes of the day\n\n");
            }
            let mut line = 0;
            while text.len() < target {
                let x = rng.f64() * total;
                let rank = cumulative
                    .partition_point(|&c| c < x)
                    .min(vocabulary.len() - 1);
                text.push_str(&vocabulary[rank]);
                text.push_str(SUFFIXES[rng.usize(0..SUFFIXES.len())]);
                line += 1;
                text.push_str(match (line % 12, rng.u8(0..20)) {
                    (0, 0..=4) => ".\n\n",
                    (0, _) => "\n",
                    (_, 0) => ", ",
                    _ => " ",
                });
            }
            if i % 3000 == 7 {
                text.push_str(&format!(" {}", rare[(i / 3000) % rare.len()]));
            }
            (
                format!("memory/2026-{:02}-{:02}-{i}.md", i % 12 + 1, i % 28 + 1),
                text,
            )
        })
        .collect()
}

/// Memory search (issue 18) over 10,000 notes: a typical three-word query and a rare word.
fn memory_search_10k(c: &mut Criterion) {
    use clawft::memory::index::{Index, Stamp};
    let corpus = memory_corpus(10_000);
    let started = Instant::now();
    let mut index = Index::new();
    for (i, (path, text)) in corpus.iter().enumerate() {
        let stamp = Stamp {
            size: text.len() as u64,
            mtime_ns: i as i64,
            ino: i as u64,
        };
        index.upsert(path, stamp, text);
    }
    let built = started.elapsed();
    let started = Instant::now();
    let snapshot = index.encode();
    let encoded = started.elapsed();
    let started = Instant::now();
    let decoded = Index::decode(&snapshot).unwrap();
    let decode_time = started.elapsed();
    let corpus_bytes: usize = corpus.iter().map(|(_, t)| t.len()).sum();
    eprintln!(
        "memory_search_10k: corpus {corpus_bytes} bytes, build {built:?}, snapshot {} bytes \
         (encode {encoded:?}, decode {decode_time:?}), stats {:?}, decoded stats {:?}",
        snapshot.len(),
        index.stats(),
        decoded.stats()
    );
    // Mid-frequency words (ranks ~40, ~150, ~600 of the vocabulary) as a user would type them.
    let typical = "quinmi riposing kamilo";
    let rare = "quetzalcoatl";
    eprintln!(
        "memory_search_10k: {:?} -> {} hits, {:?} -> {} hits",
        typical,
        index.search(typical, usize::MAX, None).len(),
        rare,
        index.search(rare, usize::MAX, None).len()
    );
    let mut g = c.benchmark_group("memory_search_10k");
    g.bench_function("three_words_top10", |b| {
        b.iter(|| index.search(black_box(typical), 10, None));
    });
    g.bench_function("rare_word_top10", |b| {
        b.iter(|| index.search(black_box(rare), 10, None));
    });
    g.bench_function("upsert_one_note", |b| {
        let (path, text) = &corpus[1234];
        b.iter(|| index.upsert(black_box(path), Stamp::default(), black_box(text)));
    });
    g.finish();
}

criterion_group!(
    benches,
    tool_dispatch,
    scrub_truncate,
    store_append,
    request_building,
    markdown_render,
    usage_accounting,
    memory_search_10k
);
criterion_main!(benches);
