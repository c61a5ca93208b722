//! Secrets the scrubber must catch however they are spelled, and tool output that must be made
//! safe before anyone sees it (issue 14, findings 4 and 6). Every test plants something, runs
//! the real pipeline, and reads what the fake LLM received, the store's bytes on disk, the chat
//! (the HTTP API) and, where a process runs, its trace-level logs.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;

use crate::common::{bytes_under, config, config_value, tool_results, Api, TestGateway};
use crate::fake_llm::{FakeLlm, Reply};
use crate::process::{weft, write_config};

const T: Duration = Duration::from_secs(30);

/// The provider key of [`config_value`]: a configured secret, scrubbed by value.
const KEY: &str = "sk-test-secret-123456";

fn calls(v: &[(&str, &str, String)]) -> Reply {
    Reply::ToolCalls(
        v.iter()
            .map(|(id, name, args)| (id.to_string(), name.to_string(), args.clone()))
            .collect(),
    )
}

fn exec(cmd: &str) -> String {
    json!({ "command": cmd }).to_string()
}

fn b64_value(c: u8) -> Option<u32> {
    Some(u32::from(match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' | b'-' => 62,
        b'/' | b'_' => 63,
        _ => return None,
    }))
}

fn b64_decode(s: &[u8]) -> Vec<u8> {
    let (mut acc, mut bits, mut out) = (0u32, 0, Vec::new());
    for &c in s {
        acc = (acc << 6) | b64_value(c).unwrap();
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

fn hex_decode(s: &[u8]) -> Vec<u8> {
    s.chunks(2)
        .filter(|c| c.len() == 2)
        .map(|c| u8::from_str_radix(std::str::from_utf8(c).unwrap(), 16).unwrap())
        .collect()
}

fn pct_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b.get(i + 1..i + 3);
        if b[i] == b'%' && hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
            out.extend(hex_decode(&b[i + 1..i + 3]));
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Whether `secret` can be read back from `hay`: as it is, percent-decoded, or by decoding any
/// run of base64 (either alphabet, any alignment, across line breaks, JSON-escaped or not) or
/// hex. The outcome that matters: not "a function was called", but "the bytes are gone".
pub(crate) fn recoverable(hay: &str, secret: &str) -> bool {
    if hay.contains(secret) {
        return true;
    }
    // Line breaks, real or JSON-escaped (at any depth), joined.
    let mut flat = String::with_capacity(hay.len());
    let mut after_backslash = false;
    for c in hay.chars() {
        match c {
            '\\' => after_backslash = true,
            'n' | 'r' if after_backslash => after_backslash = false,
            '\n' | '\r' => {}
            c => {
                after_backslash = false;
                flat.push(c);
            }
        }
    }
    let secret = secret.as_bytes();
    if contains(&pct_decode(&flat), secret) {
        return true;
    }
    let bytes = flat.as_bytes();
    let runs = |is: fn(u8) -> bool| {
        let mut out = Vec::new();
        let mut start = None;
        for (i, &b) in bytes.iter().chain(std::iter::once(&b' ')).enumerate() {
            match (is(b), start) {
                (true, None) => start = Some(i),
                (false, Some(s)) => {
                    out.push(&bytes[s..i]);
                    start = None;
                }
                _ => {}
            }
        }
        out
    };
    for run in runs(|b| b64_value(b).is_some()) {
        for shift in 0..4.min(run.len()) {
            if contains(&b64_decode(&run[shift..]), secret) {
                return true;
            }
        }
    }
    for run in runs(|b| b.is_ascii_hexdigit()) {
        for shift in 0..2.min(run.len()) {
            if contains(&hex_decode(&run[shift..]), secret) {
                return true;
            }
        }
    }
    false
}

/// Percent-encoding as `urlencode` writes it: everything but unreserved characters.
fn url_encoded(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[test]
fn the_checker_finds_encoded_secrets() {
    let s = "S3cr3t/Pass+Word?x=1";
    assert!(recoverable(&format!("a {s} b"), s));
    assert!(recoverable(&url_encoded(s), s));
    let hex: String = s.bytes().map(|b| format!("{b:02x}")).collect();
    assert!(recoverable(&format!("x{hex}"), s));
    // base64 of "ab" + s (offset 2), split over escaped lines.
    let out = std::process::Command::new("base64")
        .arg("-w")
        .arg("8")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin
                .take()
                .unwrap()
                .write_all(format!("ab{s}").as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    let wrapped = String::from_utf8(out.stdout).unwrap();
    assert!(recoverable(&wrapped, s));
    assert!(recoverable(&wrapped.replace('\n', "\\\\n"), s));
    // With the second line (inside the secret) redacted, it cannot be read back.
    let line2 = wrapped.lines().nth(1).unwrap();
    assert!(!recoverable(&wrapped.replacen(line2, "[REDACTED]", 1), s));
}

#[tokio::test]
async fn encoded_forms_of_a_configured_secret_never_reach_the_model_the_store_or_the_chat() {
    // Not shaped like any known key: only the configured value (and its encodings) can catch it.
    const SECRET: &str = "S3cr3t/Pass+Word?x=1";
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("secret.txt"), SECRET).unwrap();
    std::fs::write(
        ws.join("url.txt"),
        format!("cb?state={}\n", url_encoded(SECRET)),
    )
    .unwrap();
    // The secret at every offset mod 3 of a `base64 .env`, and once across its 76-column wrap.
    let prefixes = ["", "X", "XY", &"#".repeat(46)];
    for (i, p) in prefixes.iter().enumerate() {
        std::fs::write(
            ws.join(format!(".env{i}")),
            format!("{p}KEY={SECRET}\nDEBUG=1\n"),
        )
        .unwrap();
    }
    let llm = FakeLlm::start().await;
    let mut list = vec![
        ("b64", "exec_shell", exec("base64 secret.txt")),
        (
            "b64url",
            "exec_shell",
            exec("base64 -w0 secret.txt | tr '+/' '-_' | tr -d '='"),
        ),
        ("hex", "exec_shell", exec("xxd -p secret.txt")),
        ("HEX", "exec_shell", exec("xxd -p -u secret.txt")),
        ("url", "read_file", json!({"path": "url.txt"}).to_string()),
    ];
    let envs: Vec<(String, String)> = (0..prefixes.len())
        .map(|i| (format!("env{i}"), exec(&format!("base64 .env{i}"))))
        .collect();
    for (id, args) in &envs {
        list.push((id.as_str(), "exec_shell", args.clone()));
    }
    llm.push(calls(&list));
    // The model repeats every tool result: the chat sees what the model saw.
    llm.push(Reply::EchoToolResults);
    let cfg = config(
        &llm,
        dir.path(),
        json!({"providers": {"openai": {"api_key": SECRET}}}),
    );
    let gw = TestGateway::start(cfg).await;
    let (s, body) = gw.api.chat("enc", "show me the encodings").await;
    assert_eq!(s, 200, "{body}");
    let reqs = llm.requests();
    let results = tool_results(&reqs[1]);
    assert_eq!(results.len(), list.len(), "{results:?}");
    for (id, v) in &results {
        let text = v.to_string();
        // The tools really ran and printed something: the scrubber had work to do.
        assert!(text.contains("[REDACTED]"), "{id}: {text}");
    }
    let (_, transcript) = gw.api.get("/v1/sessions/http:enc").await;
    gw.stop().await;
    let sent = serde_json::to_string(&reqs).unwrap();
    let reply = body["reply"].as_str().unwrap();
    let disk = bytes_under(&dir.path().join("store"));
    assert!(
        disk.contains("[REDACTED]"),
        "the store holds the transcript in clear"
    );
    for (what, text) in [
        ("the LLM requests", sent.as_str()),
        ("the chat reply", reply),
        ("the transcript", &transcript.to_string()),
        ("the store on disk", &disk),
    ] {
        assert!(
            !recoverable(text, SECRET),
            "the secret can be read back from {what}"
        );
    }
    // The text around the secret survived: the redaction is targeted.
    assert!(reply.contains("cb?state=[REDACTED]"), "{reply}");
}

#[tokio::test]
async fn a_password_in_a_connection_url_never_reaches_the_model_the_store_or_the_chat() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(
        ws.join("app.env"),
        "DATABASE_URL=postgres://app:S3cretPass@db/x\nCACHE=redis://:hunter2cache@cache:6379/0\n",
    )
    .unwrap();
    let llm = FakeLlm::start().await;
    llm.push(calls(&[
        ("r", "read_file", json!({"path": "app.env"}).to_string()),
        ("c", "exec_shell", exec("cat app.env")),
    ]));
    llm.push(Reply::EchoToolResults);
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let (s, body) = gw.api.chat("db", "what database do we use?").await;
    assert_eq!(s, 200, "{body}");
    let sent = serde_json::to_string(&llm.requests()).unwrap();
    let (_, transcript) = gw.api.get("/v1/sessions/http:db").await;
    gw.stop().await;
    let reply = body["reply"].as_str().unwrap();
    let disk = bytes_under(&dir.path().join("store"));
    for (what, text) in [
        ("the LLM requests", sent.as_str()),
        ("the chat reply", reply),
        ("the transcript", &transcript.to_string()),
        ("the store on disk", &disk),
    ] {
        for pass in ["S3cretPass", "hunter2cache"] {
            assert!(!text.contains(pass), "{pass} in {what}");
        }
    }
    // Scheme, user, host and database stay readable.
    assert!(reply.contains("postgres://app:[REDACTED]@db/x"), "{reply}");
    assert!(
        reply.contains("redis://:[REDACTED]@cache:6379/0"),
        "{reply}"
    );
}

#[tokio::test]
async fn terminal_escapes_and_invisible_characters_in_tool_output_never_reach_the_model() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    // What a terminal would show as a few harmless lines. The raw bytes exist only in the
    // file, never in the model's tool calls.
    let tty = concat!(
        "safe output\rEVIL OVERWRITE\n",
        "\u{1b}[1;31mred text\u{1b}[0m\n",
        "\u{1b}]52;c;Y3VybCBldmlsLmV4YW1wbGU=\u{7}clip\n",
        "\u{1b}]8;;https://evil.example/\u{1b}\\link text\u{1b}]8;;\u{1b}\\\n",
        "ding\u{7}\n",
        "hid\u{e0049}\u{e0049}den\n",
        "\u{202e}reversed\n",
    );
    std::fs::write(dir.path().join("ws/build.log"), tty).unwrap();
    let llm = FakeLlm::start().await;
    llm.push(calls(&[
        ("p", "exec_shell", exec("cat build.log")),
        ("r", "read_file", json!({"path": "build.log"}).to_string()),
    ]));
    llm.push(Reply::EchoToolResults);
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let (s, body) = gw.api.chat("esc", "run it").await;
    assert_eq!(s, 200, "{body}");
    let reqs = llm.requests();
    let (_, transcript) = gw.api.get("/v1/sessions/http:esc").await;
    gw.stop().await;
    let results = tool_results(&reqs[1]);
    let stdout = results[0].1["stdout"].as_str().unwrap().to_string();
    let content = results[1].1["content"].as_str().unwrap().to_string();
    let reply = body["reply"].as_str().unwrap().to_string();
    let disk = bytes_under(&dir.path().join("store"));
    // The visible text is all there, each overwritten line on its own line.
    for visible in [
        "safe output\nEVIL OVERWRITE\n",
        "red text\n",
        "clip\n",
        "link text\n",
        "ding\u{2407}\n",
        "hidden\n",
        "[U+202E]reversed\n",
    ] {
        assert!(
            stdout.contains(visible),
            "{visible:?} missing from {stdout:?}"
        );
    }
    let raw = [
        "\u{1b}",
        "\u{7}",
        "\r",
        "\u{e0049}",
        "\u{202e}",
        // The OSC 8 target and the OSC 52 clipboard payload went with their sequences.
        "evil.example",
        "Y3VybCBldmlsLmV4YW1wbGU",
    ];
    for (what, text) in [
        ("the exec_shell result the model got", stdout.as_str()),
        ("the read_file result the model got", &content),
        ("the LLM requests", &serde_json::to_string(&reqs).unwrap()),
        ("the chat reply", &reply),
        ("the transcript", &transcript.to_string()),
    ] {
        for r in raw {
            // Checked on the parsed text and on the JSON text (where an escape would be `\u001b`).
            assert!(!text.contains(r), "{r:?} in {what}");
        }
        for escaped in ["\\u001b", "\\u0007", "\\r"] {
            assert!(!text.contains(escaped), "{escaped} in {what}");
        }
    }
    // On disk, sled's own framing holds arbitrary bytes: look for the sequences, raw or
    // JSON-escaped at any depth.
    for r in [
        "\u{1b}[1;31m",
        // Two bytes alone (ESC ]) turn up by chance in sled's binary framing; the
        // sequences themselves are longer.
        "\u{1b}]52;",
        "\u{1b}]8;;",
        "ding\u{7}",
        "\rEVIL",
        "\\rEVIL",
        "\u{e0049}",
        "\u{202e}",
        "u001b",
        "u0007",
        "evil.example",
        "Y3VybCBldmlsLmV4YW1wbGU",
    ] {
        assert!(!disk.contains(r), "{r:?} in the store on disk");
    }
    assert!(
        disk.contains("ding\u{2407}"),
        "the store holds the transcript in clear"
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A gateway process logging everything at trace level as JSON into `dir/gateway.log`.
struct TracedGateway {
    child: std::process::Child,
    api: Api,
    log: std::path::PathBuf,
}

impl TracedGateway {
    async fn start(dir: &Path, cfg: &Path, port: u16) -> Self {
        let log = dir.join("gateway.log");
        let file = std::fs::File::create(&log).unwrap();
        let child = weft(dir)
            .env("RUST_LOG", "trace")
            .args(["--log-format", "json", "--config"])
            .arg(cfg)
            .arg("gateway")
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        let mut g = Self {
            child,
            api: Api::new(&format!("http://127.0.0.1:{port}")),
            log,
        };
        let deadline = std::time::Instant::now() + T;
        loop {
            let (s, _) = g.get_raw("/readyz").await;
            // Ready, and its control token written (the admin and chat routes need it).
            if let (200, Some(token)) = (s, crate::process::control_token(cfg)) {
                g.api = Api::with_token(&format!("http://127.0.0.1:{port}"), Some(&token));
                return g;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "not ready:\n{}",
                g.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// GET `path` → (status, body text); 0 when nothing answers yet.
    async fn get_raw(&self, path: &str) -> (u16, String) {
        match self
            .api
            .http
            .get(format!("{}{path}", self.api.base))
            .send()
            .await
        {
            Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
            Err(_) => (0, String::new()),
        }
    }

    /// POST /v1/chat → (status, body text).
    async fn chat_raw(&self, chat: &str, content: &str) -> (u16, String) {
        let r = self
            .api
            .http
            .post(format!("{}/v1/chat", self.api.base))
            .json(&json!({"chat_id": chat, "content": content}))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then wait: the log is complete afterwards.
    fn stop(mut self) -> String {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        assert!(self.child.wait().unwrap().success(), "{}", self.log());
        self.log()
    }
}

/// base64 of `s` (standard, padded), for planting.
fn base64_of(s: &str) -> String {
    use std::io::Write;
    let mut c = std::process::Command::new("base64")
        .arg("-w0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    String::from_utf8(c.wait_with_output().unwrap().stdout).unwrap()
}

#[tokio::test]
async fn a_provider_error_echoing_the_key_never_reaches_the_chat_the_http_api_the_store_or_the_logs(
) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    let llm = FakeLlm::start().await;
    // What badly behaved providers and proxies answer: the request's headers echoed back, the
    // key in a URL, in Basic credentials, base64-encoded.
    llm.push(Reply::Status(
        401,
        None,
        format!("Incorrect API key provided: {KEY}. Request headers: {{\"Authorization\": \"Bearer {KEY}\", \"x-api-key\": \"{KEY}\"}}"),
    ));
    llm.push(Reply::Status(
        500,
        None,
        format!(
            "upstream https://proxy.internal/v1/chat?api_key={KEY} failed with Authorization: Basic {} (key b64 {})",
            base64_of(&format!("user:{KEY}")),
            base64_of(KEY)
        ),
    ));
    let port = free_port();
    let cfg = config_value(
        &llm.base_url(),
        dir.path(),
        json!({
            "providers": {"openai": {"max_retries": 0}},
            "channels": {"http": {"bind": format!("127.0.0.1:{port}")}},
        }),
    );
    let cfg = write_config(dir.path(), &cfg);
    let gw = TracedGateway::start(dir.path(), &cfg, port).await;
    let (s401, body401) = gw.chat_raw("e1", "hello").await;
    let (s500, body500) = gw.chat_raw("e2", "hello").await;
    let log = gw.stop();
    // The turns failed and said why (the HTTP API answers 502 with the error text).
    assert_eq!(s401, 502, "{body401}");
    assert!(
        body401.contains("authentication failed (HTTP 401)"),
        "{body401}"
    );
    assert!(body401.contains("Bearer [REDACTED]"), "{body401}");
    assert_eq!(s500, 502, "{body500}");
    assert!(body500.contains("server error (HTTP 500)"), "{body500}");
    // The log really holds the failures (the check below can see keys if they were logged).
    assert!(log.contains("llm provider failed"), "{log}");
    let disk = bytes_under(&dir.path().join("store"));
    for (what, text) in [
        ("the HTTP API error of the 401", body401.as_str()),
        ("the HTTP API error of the 500", &body500),
        ("the trace-level logs", &log),
        ("the store on disk", &disk),
    ] {
        assert!(
            !recoverable(text, KEY),
            "the key can be read back from {what}"
        );
    }
}

#[tokio::test]
async fn a_key_in_base_url_never_shows_in_status_readyz_doctor_errors_or_the_logs() {
    const URL_KEY: &str = "BaseUrlSecret0042";
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("hello through a keyed URL".into()));
    let port = free_port();
    let base = format!("{}?key={URL_KEY}", llm.base_url());
    let cfg = config_value(
        &base,
        dir.path(),
        json!({"channels": {"http": {"bind": format!("127.0.0.1:{port}")}}}),
    );
    let cfg_path = write_config(dir.path(), &cfg);
    let gw = TracedGateway::start(dir.path(), &cfg_path, port).await;
    let (_, ready) = gw.get_raw("/readyz").await;
    let (_, status_api) = gw.get_raw("/v1/status").await;
    // The path goes before the query: the request reaches /v1/chat/completions.
    let (s, reply) = gw.chat_raw("u", "hi").await;
    assert_eq!(s, 200, "{reply}");
    assert!(reply.contains("hello through a keyed URL"), "{reply}");
    let cli = |args: &'static [&'static str]| {
        let (d, c) = (dir.path().to_path_buf(), cfg_path.clone());
        tokio::task::spawn_blocking(move || {
            let out = weft(&d)
                .arg("--config")
                .arg(&c)
                .args(args)
                .output()
                .unwrap();
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    };
    let status_cli = cli(&["status"]).await.unwrap();
    let log = gw.stop();
    let doctor = cli(&["doctor", "--json"]).await.unwrap();
    // Nothing listens on the LLM port any more: the connection error names the URL.
    let unreachable = {
        let mut c = cfg.clone();
        c["providers"]["openai"]["base_url"] =
            json!(format!("http://127.0.0.1:{}/v1?key={URL_KEY}", free_port()));
        c["providers"]["openai"]["max_retries"] = json!(0);
        write_config(dir.path(), &c);
        cli(&["agent", "-m", "hi"]).await.unwrap()
    };
    assert!(ready.contains("key=[REDACTED]"), "{ready}");
    assert!(status_api.contains("key=[REDACTED]"), "{status_api}");
    assert!(status_cli.contains("key=[REDACTED]"), "{status_cli}");
    assert!(doctor.contains("provider openai"), "{doctor}");
    assert!(unreachable.contains("cannot reach"), "{unreachable}");
    for (what, text) in [
        ("/readyz", ready.as_str()),
        ("/v1/status", &status_api),
        ("weft status", &status_cli),
        ("weft doctor", &doctor),
        ("the connection error", &unreachable),
        ("the trace-level logs", &log),
    ] {
        assert!(
            !text.contains(URL_KEY),
            "{URL_KEY} shown by {what}:\n{text}"
        );
    }
    // The fake LLM did receive the key: it was sent where it belongs.
    assert!(!llm.requests().is_empty());
}
