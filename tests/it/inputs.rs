//! Inputs the daemon must bound or refuse (issue 14): oversized inbound messages on every
//! channel, allowlist entries that cannot match, protected paths in the file tools.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::common::{bytes_under, config, wait_until, TestGateway};
use crate::fake_llm::{FakeLlm, Reply};

const T: Duration = Duration::from_secs(30);

/// Marks the oversized text so its bytes can be looked for everywhere.
const BIG_MARK: &str = "OVERSIZED-7c1e";
/// What every channel's notice says (`clawft_channel_core::oversized_notice`).
const NOTICE: &str = "over the 32 KB limit for one message";

fn big_text(bytes: usize) -> String {
    let mut s = String::with_capacity(bytes + 64);
    while s.len() < bytes {
        s.push_str(BIG_MARK);
        s.push_str(" lorem ipsum dolor sit amet ");
    }
    s.truncate(bytes);
    s
}

/// The model saw the normal message only, the oversized one never; the store holds none of it.
fn assert_never_seen(llm: &FakeLlm, dir: &Path) {
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 1, "one request expected (the normal message)");
    let sent = serde_json::to_string(&reqs).unwrap();
    assert!(
        !sent.contains(BIG_MARK),
        "the oversized text reached the model"
    );
    assert!(sent.contains("hello again"));
    let disk = bytes_under(&dir.join("store"));
    assert!(
        disk.contains("hello again"),
        "the store is readable in clear"
    );
    assert!(
        !disk.contains(BIG_MARK),
        "the oversized text is in the store"
    );
}

#[tokio::test]
async fn an_oversized_telegram_text_gets_a_notice_and_the_chat_keeps_answering() {
    use clawft_channel_telegram::fake::FakeTelegram;
    let tg = FakeTelegram::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("second answer".into()));
    let cfg = config(
        &llm,
        dir.path(),
        json!({"channels": {"telegram": {"token": FakeTelegram::TOKEN, "api_url": tg.api_url(), "allow_from": [111], "stream_edits": false}}}),
    );
    let gw = TestGateway::start(cfg).await;
    // The 10 MB text of the report.
    tg.push_user_message(111, 111, &big_text(10 * 1024 * 1024));
    let sent = tg.wait_sent(1, T).await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].chat, 111);
    assert!(sent[0].visible.contains(NOTICE), "{}", sent[0].visible);
    assert!(sent[0].visible.contains("10240 KB"), "{}", sent[0].visible);
    // The update is confirmed (not fetched again), and the chat answers the next message.
    assert!(wait_until(T, || tg.pending_updates().is_empty()).await);
    tg.push_user_message(111, 111, "hello again");
    assert!(
        wait_until(T, || tg.sent().iter().any(|m| m.visible == "second answer")).await,
        "{:?}",
        tg.sent()
    );
    gw.stop().await;
    assert_never_seen(&llm, dir.path());
}

#[tokio::test]
async fn an_oversized_discord_text_gets_a_notice_and_the_chat_keeps_answering() {
    use clawft_channel_discord::fake::{FakeDiscord, FAKE_TOKEN};
    let dc = FakeDiscord::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("second answer".into()));
    let cfg = config(
        &llm,
        dir.path(),
        json!({"channels": {"discord": {"token": FAKE_TOKEN, "proxy": dc.base_url(), "allow_from": ["111"], "stream_edits": false}}}),
    );
    let gw = TestGateway::start(cfg).await;
    dc.push_user_message("500", "111", &big_text(1024 * 1024));
    assert!(wait_until(T, || !dc.sent().is_empty()).await);
    let sent = dc.sent();
    assert_eq!(sent[0].chat, "500");
    assert!(sent[0].text.contains(NOTICE), "{}", sent[0].text);
    dc.push_user_message("500", "111", "hello again");
    assert!(
        wait_until(T, || dc.sent().iter().any(|m| m.text == "second answer")).await,
        "{:?}",
        dc.sent()
    );
    gw.stop().await;
    assert_never_seen(&llm, dir.path());
}

#[tokio::test]
async fn an_oversized_slack_text_gets_a_notice_and_the_chat_keeps_answering() {
    use clawft_channel_slack::fake::{FakeSlack, APP_TOKEN, BOT_TOKEN};
    let sl = FakeSlack::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("second answer".into()));
    let cfg = config(
        &llm,
        dir.path(),
        json!({"channels": {"slack": {"token": BOT_TOKEN, "app_token": APP_TOKEN, "api_url": sl.api_url(), "allow_from": ["U111"], "stream_edits": false}}}),
    );
    let gw = TestGateway::start(cfg).await;
    let ev = sl.push_user_message("D111", "U111", &big_text(1024 * 1024));
    let posted = sl.wait_posted(1, T).await;
    assert_eq!(posted[0].chat, "D111");
    assert!(posted[0].text.contains(NOTICE), "{}", posted[0].text);
    // Acknowledged: Slack does not redeliver it.
    assert!(wait_until(T, || sl.is_acked(&ev)).await);
    sl.push_user_message("D111", "U111", "hello again");
    assert!(
        wait_until(T, || sl.sent().iter().any(|p| p.text == "second answer")).await,
        "{:?}",
        sl.sent()
    );
    gw.stop().await;
    assert_never_seen(&llm, dir.path());
}

#[tokio::test]
async fn an_oversized_http_message_is_413_with_the_notice_and_the_chat_keeps_answering() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("second answer".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    // Over the message limit, under the body limit: the same notice as every channel.
    let (s, body) = gw.api.chat("h", &big_text(200 * 1024)).await;
    assert_eq!(s, 413, "{body}");
    assert!(body["error"].as_str().unwrap().contains(NOTICE), "{body}");
    // Over the body limit too: 413 saying what the limit is.
    let (s, body) = gw.api.chat("h", &big_text(10 * 1024 * 1024)).await;
    assert_eq!(s, 413, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("at most 32 KB"),
        "{body}"
    );
    let (s, body) = gw.api.chat("h", "hello again").await;
    assert_eq!((s, body["reply"].as_str()), (200, Some("second answer")));
    gw.stop().await;
    assert_never_seen(&llm, dir.path());
}

#[tokio::test]
async fn the_inbound_limit_is_configurable_and_checked_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("fits".into()));
    let cfg = config(
        &llm,
        dir.path(),
        // A 200 KB message is ~51k tokens: a model with a window that large.
        json!({"channels": {"max_inbound_bytes": 300 * 1024},
               "agents": {"defaults": {"context_window": 1_000_000}}}),
    );
    assert_eq!(cfg.max_inbound_bytes, 300 * 1024);
    let gw = TestGateway::start(cfg).await;
    let (s, body) = gw.api.chat("h", &big_text(200 * 1024)).await;
    assert_eq!((s, body["reply"].as_str()), (200, Some("fits")), "{body}");
    gw.stop().await;
    let v = crate::common::config_value(
        &llm.base_url(),
        dir.path(),
        json!({"channels": {"max_inbound_bytes": 10}}),
    );
    let err = clawft::config::Config::from_str(
        &v.to_string(),
        false,
        &crate::common::test_env(dir.path()),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("channels.max_inbound_bytes"), "{err}");
    assert!(err.contains("from 1024 to"), "{err}");
}

#[tokio::test]
async fn allow_from_usernames_stop_the_gateway_at_start_and_are_refused_by_a_reload() {
    use crate::process::{free_port, gateway_config, log_of, weft, Daemon};
    use clawft_channel_telegram::fake::FakeTelegram;
    let tg = FakeTelegram::start().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let telegram = |allow: serde_json::Value| json!({"channels": {"telegram": {"token": FakeTelegram::TOKEN, "api_url": tg.api_url(), "allow_from": allow, "stream_edits": false}}});

    // At start: the gateway does not start, and says which key, which entry, how to fix it.
    let cfg = gateway_config(dir.path(), &llm, port, telegram(json!(["@alice"])));
    let out = weft(dir.path())
        .arg("--config")
        .arg(&cfg)
        .arg("gateway")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started with @alice: {err}");
    for needle in [
        "channels.telegram.allow_from",
        "`@alice`",
        "@userinfobot",
        "weft pairing",
    ] {
        assert!(err.contains(needle), "`{needle}` not in: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");

    // On SIGHUP: the new file is rejected and the running allowlist stays in force.
    let cfg = gateway_config(dir.path(), &llm, port, telegram(json!([111])));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    gateway_config(dir.path(), &llm, port, telegram(json!(["@alice", 111])));
    let pid = rustix::process::Pid::from_child(&d.child);
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    assert!(
        wait_until(T, || log_of(dir.path())
            .contains("new configuration rejected"))
        .await,
        "{}",
        log_of(dir.path())
    );
    let log = log_of(dir.path());
    assert!(log.contains("channels.telegram.allow_from"), "{log}");
    assert!(!log.contains("channel telegram restarted"), "{log}");
    llm.push(Reply::Text("still here".into()));
    tg.push_user_message(111, 111, "hi");
    assert!(
        wait_until(T, || tg.sent().iter().any(|m| m.visible == "still here")).await,
        "{:?}\n{}",
        tg.sent(),
        log_of(dir.path())
    );
    assert_eq!(d.term().code(), Some(0), "{}", log_of(dir.path()));
}

/// Issue 14, finding 3: the workspace is the service's home, which holds the state directory
/// (config, store) and the credentials directory. No file tool reads or changes them, by their
/// path, a symlink or a hard link; everything else in the home stays usable.
#[tokio::test]
async fn file_tools_never_touch_the_config_store_or_credentials_inside_the_workspace() {
    use crate::common::tool_results;
    use crate::fake_llm::check_tool_pairing;
    const CONFIG_MARK: &str = "CONFIG-MARK-5e0a";
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let llm = FakeLlm::start().await;
    std::fs::create_dir_all(home.join(".clawft")).unwrap();
    std::fs::create_dir_all(home.join("creds")).unwrap();
    let key = "sk-test-from-credentials-dir-0001";
    std::fs::write(home.join("creds/openai.key"), key).unwrap();
    let config_text = format!(
        "# {CONFIG_MARK}\n[agents.defaults]\nworkspace = \"{home}\"\nmodel = \"fake-model\"\n\n\
         [providers.openai]\nbase_url = \"{llm}\"\napi_key_file = \"openai.key\"\ntimeout_secs = 30\n\n\
         [channels.http]\nbind = \"127.0.0.1:0\"\n\n[store]\npath = \"{home}/.clawft/store\"\ncache_mb = 4\n\n\
         [sessions]\nshutdown_grace_secs = 2\n\n[tools.exec]\nsandbox = true\n",
        home = home.display(),
        llm = llm.base_url(),
    );
    let config_path = home.join(".clawft/config.toml");
    std::fs::write(&config_path, &config_text).unwrap();
    let env = clawft::config::Env::from_pairs([
        ("HOME", home.to_str().unwrap()),
        ("CLAWFT_HOME", home.join(".clawft").to_str().unwrap()),
        (
            "CREDENTIALS_DIRECTORY",
            home.join("creds").to_str().unwrap(),
        ),
    ]);
    let config = clawft::config::Config::load(Some(&config_path), &env).unwrap();
    let gw = TestGateway::start(config).await;
    // The exec sandbox gets the same list: commands cannot read them either, by their paths
    // or a symlink, even with a hard link to them beside (Landlock follows paths: the link's
    // own name stays readable to commands, see docs/security.md).
    if clawft::tools::sandbox::probe().fs_enforced {
        std::os::unix::fs::symlink(".clawft/config.toml", home.join("cfg-sym")).unwrap();
        std::fs::hard_link(&config_path, home.join("cfg-beside")).unwrap();
        let cat = "cat .clawft/config.toml cfg-sym creds/openai.key; ls .clawft/store";
        llm.push(Reply::ToolCalls(vec![(
            "x".into(),
            "exec_shell".into(),
            json!({ "command": cat }).to_string(),
        )]));
        llm.push(Reply::Text("ran".into()));
        let (s, body) = gw.api.chat("x", "cat the config").await;
        assert_eq!((s, body["reply"].as_str()), (200, Some("ran")), "{body}");
        let exec = tool_results(&llm.requests()[1])[0].1.clone();
        assert_ne!(exec["exit_code"], 0, "{exec}");
        assert_eq!(exec["stdout"], "", "{exec}");
        let denied = exec["stderr"]
            .as_str()
            .unwrap()
            .matches("Permission denied");
        assert_eq!(denied.count(), 4, "{exec}");
        std::fs::remove_file(home.join("cfg-sym")).unwrap();
        std::fs::remove_file(home.join("cfg-beside")).unwrap();
    } else {
        println!("SKIPPED the exec part: Landlock is unavailable on this kernel");
    }
    let base = llm.requests().len();
    let store = home.join(".clawft/store");
    let store_file = std::fs::read_dir(&store)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_file())
        .expect("a file in the store");
    // Other names of the protected files, inside the workspace.
    std::os::unix::fs::symlink(".clawft/config.toml", home.join("cfg-link")).unwrap();
    std::os::unix::fs::symlink("creds", home.join("keys")).unwrap();
    std::fs::hard_link(&config_path, home.join("cfg-hard")).unwrap();
    std::fs::hard_link(home.join("creds/openai.key"), home.join("key-hard")).unwrap();
    std::fs::hard_link(&store_file, home.join("store-hard")).unwrap();
    std::fs::write(home.join("notes.txt"), "ordinary notes").unwrap();

    let unsandbox = "[tools.exec]\nsandbox = false\n";
    let calls: Vec<(&str, &str, serde_json::Value)> = vec![
        (
            "w1",
            "write_file",
            json!({"path": ".clawft/config.toml", "content": unsandbox}),
        ),
        (
            "w2",
            "edit_file",
            json!({"path": ".clawft/config.toml", "old_text": "sandbox = true", "new_text": "sandbox = false"}),
        ),
        (
            "w3",
            "write_file",
            json!({"path": "cfg-link", "content": unsandbox}),
        ),
        (
            "w4",
            "edit_file",
            json!({"path": "cfg-hard", "old_text": "sandbox = true", "new_text": "sandbox = false"}),
        ),
        (
            "w5",
            "write_file",
            json!({"path": "creds/openai.key", "content": "sk-attacker"}),
        ),
        (
            "w6",
            "write_file",
            json!({"path": "keys/openai.key", "content": "sk-attacker"}),
        ),
        (
            "w7",
            "write_file",
            json!({"path": ".clawft/store/control.json", "content": "{}"}),
        ),
        ("r1", "read_file", json!({"path": ".clawft/config.toml"})),
        ("r2", "read_file", json!({"path": "cfg-link"})),
        ("r3", "read_file", json!({"path": "cfg-hard"})),
        ("r4", "read_file", json!({"path": "creds/openai.key"})),
        ("r5", "read_file", json!({"path": "keys/openai.key"})),
        ("r6", "read_file", json!({"path": "key-hard"})),
        ("r7", "read_file", json!({"path": "store-hard"})),
        ("l1", "list_directory", json!({"path": ".clawft/store"})),
        (
            "g1",
            "grep",
            json!({"pattern": "sandbox", "directory": ".clawft"}),
        ),
    ];
    llm.push(Reply::ToolCalls(
        calls
            .iter()
            .map(|(id, name, args)| (id.to_string(), name.to_string(), args.to_string()))
            .collect(),
    ));
    llm.push(Reply::ToolCalls(vec![(
        "ok".into(),
        "read_file".into(),
        r#"{"path":"notes.txt"}"#.into(),
    )]));
    llm.push(Reply::Text("done".into()));
    let (s, body) = gw.api.chat("h", "rewrite the config").await;
    assert_eq!((s, body["reply"].as_str()), (200, Some("done")), "{body}");
    let reqs = llm.requests().split_off(base);
    for r in &reqs {
        check_tool_pairing(r).unwrap();
    }
    let results = tool_results(&reqs[1]);
    assert_eq!(results.len(), calls.len());
    for (id, v) in &results {
        assert_eq!(v["error_code"], "PERMISSION_DENIED", "{id}: {v}");
        // Writes never go through a symlink at all (refused before the target is looked at).
        let why = if id == "w3" {
            "symbolic link"
        } else {
            "file tools never"
        };
        assert!(v["error"].as_str().unwrap().contains(why), "{id}: {v}");
    }
    let notes = &tool_results(&reqs[2]).last().unwrap().1.clone();
    assert_eq!(notes["content"], "ordinary notes", "{notes}");
    let sent = serde_json::to_string(&reqs).unwrap();
    assert!(!sent.contains(CONFIG_MARK), "the config reached the model");
    assert!(!sent.contains(key), "the key reached the model");
    gw.stop().await;
    assert_eq!(std::fs::read_to_string(&config_path).unwrap(), config_text);
    assert_eq!(
        std::fs::read_to_string(home.join("creds/openai.key")).unwrap(),
        key
    );
    assert!(!store.join("control.json").exists());
    let names: Vec<_> = std::fs::read_dir(home.join("creds")).unwrap().collect();
    assert_eq!(
        names.len(),
        1,
        "a file appeared in the credentials directory"
    );
}

/// Who a message comes from is carried as a type, never guessed from the sender's name: an
/// HTTP client that calls itself `clawft-subagents` (the gateway's own sender for subagent
/// results) is still a person. Its `/help` is a chat command and its question gets the reply
/// on its own request (the gateway's own events answer the chat, not a request: the POST
/// waited in vain before).
#[tokio::test]
async fn a_client_named_like_the_gateway_is_still_a_user() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    llm.push(Reply::Text("the answer".into()));
    let gw = TestGateway::start(config(&llm, dir.path(), json!({}))).await;
    let post = |content: &'static str| {
        gw.api
            .http
            .post(format!("{}/v1/chat", gw.api.base))
            .json(&json!({"chat_id": "c1", "content": content, "sender": "clawft-subagents"}))
            .send()
    };
    let r = post("/help").await.unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(
        v["reply"]
            .as_str()
            .unwrap_or("")
            .starts_with("Chat commands:"),
        "{v}"
    );
    let r = post("what is it?").await.unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["reply"], "the answer", "{v}");
    assert_eq!(llm.requests().len(), 1);
    gw.stop().await;
}
