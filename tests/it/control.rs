//! The control plane (issue 14, finding 1): the admin routes need the control token on every
//! bind, loopback included; `/v1/chat` needs one unless the operator opted in; `control.json`
//! is 0600, new at each start, gone after SIGTERM; a command run by `exec_shell` can neither
//! read it nor use the admin routes; a CLI of another store never reaches the running gateway.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{config, tool_results, Api, TestGateway};
use crate::fake_llm::{FakeLlm, Reply};
use crate::process::{control_token, free_port, gateway_config, log_of, weft, Daemon};

const T: Duration = Duration::from_secs(30);

fn control_file(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("store/control.json")).unwrap()).unwrap()
}

/// `weft --config CFG ARGS…` run from `home`: (success, stdout, stderr).
async fn run(home: &Path, cfg: &Path, args: &[&str]) -> (bool, String, String) {
    let (home, cfg) = (home.to_path_buf(), cfg.to_path_buf());
    let args: Vec<String> = args.iter().map(ToString::to_string).collect();
    let out = tokio::task::spawn_blocking(move || {
        weft(&home)
            .arg("--config")
            .arg(&cfg)
            .args(&args)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Proactive messages waiting for HTTP chat `chat` (read with the token, so they are seen).
async fn mailbox(api: &Api, chat: &str) -> Vec<Value> {
    let (s, v) = api.get(&format!("/v1/chats/{chat}/messages")).await;
    assert_eq!(s, 200, "{v}");
    v["messages"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn with_the_default_config_the_admin_routes_and_chat_need_the_control_token() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    // Default HTTP settings: loopback bind, no token configured.
    let cfg = gateway_config(dir.path(), &llm, port, json!({}));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    llm.push(Reply::Text("noted".into()));
    let (s, _) = d
        .api
        .chat("other", "my PIN is transcript-marker-4417")
        .await;
    assert_eq!(s, 200);

    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    for token in [None, Some("wrong-token"), Some("")] {
        let with = |r: reqwest::RequestBuilder| match token {
            Some(t) => r.bearer_auth(t),
            None => r,
        };
        let r = with(http.post(format!("{base}/v1/admin/send")))
            .json(&json!({"channel": "http", "chat_id": "victim", "content": "exfiltrated"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "admin/send with {token:?}");
        for path in [
            "/v1/sessions",
            "/v1/sessions/http:other",
            "/v1/status",
            "/metrics",
        ] {
            let r = with(http.get(format!("{base}{path}")))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 401, "{path} with {token:?}");
            let body = r.text().await.unwrap();
            assert!(!body.contains("transcript-marker-4417"), "{body}");
            assert!(!body.contains("http:other"), "{body}");
        }
        let r = with(http.delete(format!("{base}/v1/sessions/http:other")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
        let r = with(http.post(format!("{base}/v1/chat")))
            .json(&json!({"chat_id": "c", "content": "hi"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "chat with {token:?}");
        if token.is_none() {
            let v: Value = r.json().await.unwrap();
            assert!(
                v["error"]
                    .as_str()
                    .unwrap()
                    .contains("allow_loopback_without_token"),
                "{v}"
            );
        }
    }
    // Nothing reached the victim's chat, the transcript is intact, the model was asked once.
    assert_eq!(mailbox(&d.api, "victim").await, Vec::<Value>::new());
    let (s, v) = d.api.get("/v1/sessions/http:other").await;
    assert_eq!(s, 200);
    assert!(v.to_string().contains("transcript-marker-4417"));
    assert_eq!(llm.requests().len(), 1);
    // /healthz and the bare readiness stay open.
    let r = http.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = http
        .get(format!("{base}/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v, json!({"status": "ready"}));

    // The token from control.json opens them.
    let (s, v) = d.api.get("/v1/status").await;
    assert_eq!((s, v["mode"].as_str()), (200, Some("gateway")));
    let r = d
        .api
        .http
        .post(format!("{base}/v1/admin/send"))
        .json(&json!({"channel": "http", "chat_id": "victim", "content": "from the operator"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let deadline = std::time::Instant::now() + T;
    let got = loop {
        let got = mailbox(&d.api, "victim").await;
        if !got.is_empty() || std::time::Instant::now() > deadline {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["content"], "from the operator");
    assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));
}

#[tokio::test]
async fn tokenless_chat_is_an_explicit_loopback_opt_in() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({"channels": {"http": {"allow_loopback_without_token": true}}}),
    ))
    .await;
    llm.push(Reply::Text("hello local".into()));
    let open = Api::new(&gw.api.base);
    let (s, v) = open.chat("c", "hi").await;
    assert_eq!((s, v["reply"].as_str()), (200, Some("hello local")), "{v}");
    // The admin routes still refuse it.
    assert_eq!(open.get("/v1/sessions").await.0, 401);
    assert_eq!(open.get("/v1/sessions/http:c").await.0, 401);
    assert_eq!(gw.api.get("/v1/sessions/http:c").await.0, 200);
    gw.stop().await;

    // And the opt-in is refused on a non-loopback bind, naming the key.
    let cfg = crate::process::write_config(
        dir.path(),
        &crate::common::config_value(
            &llm.base_url(),
            dir.path(),
            json!({"channels": {"http": {
                "bind": "0.0.0.0:0", "token": "t0k3n-abcdef", "allow_loopback_without_token": true
            }}}),
        ),
    );
    let (ok, _, err) = run(dir.path(), &cfg, &["status"]).await;
    assert!(!ok);
    assert!(
        err.contains("channels.http.allow_loopback_without_token") && err.contains("loopback"),
        "{err}"
    );
}

#[tokio::test]
async fn control_json_is_0600_new_at_each_start_and_removed_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = gateway_config(dir.path(), &llm, port, json!({}));
    let path = dir.path().join("store/control.json");

    let d = Daemon::start(dir.path(), &cfg, port).await;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    let first = control_file(dir.path());
    let token = first["token"].as_str().unwrap().to_string();
    assert_eq!(token.len(), 64);
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{token}");
    assert_eq!(first["addr"], format!("127.0.0.1:{port}"));
    assert_eq!(first["pid"], d.child.id());
    // The token is not in the log.
    assert!(!log_of(dir.path()).contains(&token));
    assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));
    assert!(!path.exists(), "control.json left after SIGTERM");

    let d = Daemon::start(dir.path(), &cfg, port).await;
    let second = control_token(&cfg).unwrap();
    assert_ne!(second, token, "the token did not change across restarts");
    // The old token died with its gateway.
    let old = Api::with_token(&d.api.base, Some(&token));
    assert_eq!(old.get("/v1/sessions").await.0, 401);
    assert_eq!(d.api.get("/v1/sessions").await.0, 200);

    // After SIGKILL the file stays, naming a dead process: the CLI opens the store itself.
    d.kill9();
    assert!(path.exists());
    let (ok, out, err) = run(dir.path(), &cfg, &["status", "--json"]).await;
    assert!(ok, "{err}");
    assert!(err.contains("store opened directly"), "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["mode"], "direct");
    assert!(!log_of(dir.path()).contains(&second));
}

#[tokio::test]
async fn a_command_run_by_exec_shell_cannot_read_the_token_or_use_the_admin_routes() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = gateway_config(dir.path(), &llm, port, json!({}));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    llm.push(Reply::Text("noted".into()));
    assert_eq!(
        d.api
            .chat("other", "my PIN is transcript-marker-8812")
            .await
            .0,
        200
    );

    let file = dir.path().join("store/control.json");
    let f = file.display();
    let api = format!("http://127.0.0.1:{port}");
    // Everything a prompt-injected model would try: read the file (plainly and encoded), find
    // the token anywhere it can read, and call the admin routes with and without it.
    let command = format!(
        "cat {f}; base64 -w0 {f}; echo; grep -r token {dir} 2>/dev/null | head -c 2000; \
         TOK=$(sed -n 's/.*\"token\": *\"\\([0-9a-f]*\\)\".*/\\1/p' {f} 2>/dev/null); \
         curl -s -m 5 -X POST -H 'content-type: application/json' -H \"Authorization: Bearer $TOK\" \
           {api}/v1/admin/send -d '{{\"channel\":\"http\",\"chat_id\":\"victim\",\"content\":\"with-token\"}}'; echo; \
         curl -s -m 5 -X POST -H 'content-type: application/json' \
           {api}/v1/admin/send -d '{{\"channel\":\"http\",\"chat_id\":\"victim\",\"content\":\"without-token\"}}'; echo; \
         curl -s -m 5 {api}/v1/sessions/http:other; echo; \
         env; echo done",
        dir = dir.path().display()
    );
    llm.push(Reply::ToolCalls(vec![(
        "c1".into(),
        "exec_shell".into(),
        json!({ "command": command }).to_string(),
    )]));
    llm.push(Reply::EchoToolResults);
    let (s, body) = d.api.chat("attacker", "run the script").await;
    assert_eq!(s, 200, "{body}");

    let reqs = llm.requests();
    let results = tool_results(reqs.last().unwrap());
    assert_eq!(results.len(), 1);
    let result = results[0].1.to_string();
    assert!(result.contains("done"), "the command did not run: {result}");
    // The victim's chat got nothing, with or without the token; no other chat's transcript.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(mailbox(&d.api, "victim").await, Vec::<Value>::new());
    let token = control_token(&cfg).unwrap();
    let b64 = std::process::Command::new("base64")
        .arg("-w0")
        .arg(&file)
        .output()
        .unwrap()
        .stdout;
    let b64 = String::from_utf8(b64).unwrap();
    assert!(b64.len() > 40);
    for (what, text) in [("tool result", &result), ("chat reply", &body.to_string())] {
        assert!(
            !text.contains("transcript-marker-8812"),
            "{what} holds another chat's transcript: {text}"
        );
        assert!(!text.contains(&token), "{what} holds the token: {text}");
        assert!(
            !text.contains(&b64[..40]),
            "{what} holds control.json in base64: {text}"
        );
    }
    assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));
    assert!(!log_of(dir.path()).contains(&token));
}

#[tokio::test]
async fn the_control_token_is_scrubbed_from_tool_output_like_the_configured_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = gateway_config(dir.path(), &llm, port, json!({}));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    // Were the token ever in a command's output (a kernel without Landlock, a copy the
    // operator left in the workspace), the model, the chat and the store would not see it.
    let token = control_token(&cfg).unwrap();
    std::fs::write(dir.path().join("ws/copy.txt"), format!("tok={token}\n")).unwrap();
    llm.push(Reply::ToolCalls(vec![
        (
            "c1".into(),
            "exec_shell".into(),
            json!({ "command": "cat copy.txt; rev copy.txt | rev" }).to_string(),
        ),
        (
            "c2".into(),
            "read_file".into(),
            json!({ "path": "copy.txt" }).to_string(),
        ),
    ]));
    llm.push(Reply::EchoToolResults);
    let (s, body) = d.api.chat("leak", "show me").await;
    assert_eq!(s, 200, "{body}");
    let reqs = llm.requests();
    let results = tool_results(reqs.last().unwrap());
    assert_eq!(results.len(), 2, "{results:?}");
    for (_, r) in &results {
        assert!(!r.to_string().contains(&token), "{r}");
    }
    assert!(!body.to_string().contains(&token), "{body}");
    assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));
    // Every byte of the store (the control file is gone after SIGTERM).
    let mut stack = vec![dir.path().join("store")];
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                let bytes = std::fs::read(e.path()).unwrap();
                assert!(
                    !bytes.windows(token.len()).any(|w| w == token.as_bytes()),
                    "{} holds the token",
                    e.path().display()
                );
            }
        }
    }
}

#[tokio::test]
async fn a_cli_of_another_store_never_reaches_the_running_gateway() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg_a = gateway_config(a.path(), &llm, port, json!({}));
    // B binds A's address: before, its CLI talked to whatever answered there.
    let cfg_b = gateway_config(b.path(), &llm, port, json!({}));
    let d = Daemon::start(a.path(), &cfg_a, port).await;
    llm.push(Reply::Text("a reply".into()));
    assert_eq!(d.api.chat("a-chat", "hello A").await.0, 200);
    let (_, before) = d.api.get("/v1/sessions").await;
    let (_, transcript_before) = d.api.get("/v1/sessions/http:a-chat").await;

    let (ok, out, err) = run(b.path(), &cfg_b, &["status", "--json"]).await;
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["mode"], "direct", "{out}");
    assert_eq!(v["sessions"]["stored"], 0);
    assert!(!err.contains("using the running gateway"), "{err}");

    let (ok, out, err) = run(b.path(), &cfg_b, &["sessions", "list"]).await;
    assert!(ok, "{err}");
    assert!(!out.contains("a-chat"), "{out}");
    let (ok, _, err) = run(b.path(), &cfg_b, &["sessions", "show", "http:a-chat"]).await;
    assert!(!ok && err.contains("no session"), "{err}");

    llm.push(Reply::Text("b reply".into()));
    let (ok, out, err) = run(b.path(), &cfg_b, &["agent", "-m", "hello B"]).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "b reply");
    assert!(err.contains("store opened directly"), "{err}");

    let (ok, _, err) = run(b.path(), &cfg_b, &["send", "http", "a-chat", "into A"]).await;
    assert!(!ok);
    assert!(err.contains("needs a running gateway"), "{err}");

    // A control file in B's store naming A's address and a live process, with a token A does
    // not know (what a stale file looks like when the port was taken over): refused, clearly.
    std::fs::write(
        b.path().join("store/control.json"),
        json!({"addr": format!("127.0.0.1:{port}"), "pid": d.child.id(), "token": "f".repeat(64),
               "store": b.path().join("store")})
        .to_string(),
    )
    .unwrap();
    for args in [
        &["status"][..],
        &["sessions", "clear", "http:a-chat"][..],
        &["send", "http", "a-chat", "into A"][..],
    ] {
        let (ok, _, err) = run(b.path(), &cfg_b, args).await;
        assert!(!ok, "{args:?} succeeded");
        assert!(
            err.contains("refused this store's control token") && err.contains("not the gateway"),
            "{args:?}: {err}"
        );
    }

    // A is untouched: same sessions, same transcript, nothing in its chats.
    let (_, after) = d.api.get("/v1/sessions").await;
    assert_eq!(before, after);
    let (_, transcript_after) = d.api.get("/v1/sessions/http:a-chat").await;
    assert_eq!(transcript_before, transcript_after);
    assert_eq!(mailbox(&d.api, "a-chat").await, Vec::<Value>::new());

    // A's own CLI still goes through A, with no setup.
    let (ok, out, err) = run(a.path(), &cfg_a, &["sessions", "list"]).await;
    assert!(ok, "{err}");
    assert!(err.contains("using the running gateway"), "{err}");
    assert!(out.contains("http:a-chat"), "{out}");
    assert_eq!(d.term().code(), Some(0), "{}", log_of(a.path()));
}
