//! Store faults as an operator meets them (issue 16, finding 3): a damaged store found at start
//! (flipped bytes, a file cut in half, a garbage `conf`, a leftover snapshot), the
//! `store.on_corruption` policies, `weft store check|backup|restore`, and a full disk that
//! frees up again while the gateway runs.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::Api;
use crate::fake_llm::FakeLlm;
use crate::process::{free_port, gateway_config, log_of, weft, Daemon};

const T: Duration = Duration::from_secs(30);

/// A gateway's store with 5 answered sessions, the gateway stopped cleanly.
async fn five_sessions(dir: &Path, llm: &FakeLlm, port: u16, extra: Value) -> std::path::PathBuf {
    let cfg = gateway_config(dir, llm, port, extra);
    let d = Daemon::start(dir, &cfg, port).await;
    for i in 0..5 {
        let (s, v) = d
            .api
            .chat(
                &format!("chat-{i}"),
                &format!("marker-{i} {}", "x".repeat(300)),
            )
            .await;
        assert_eq!(s, 200, "{v}");
    }
    let (_, v) = d.api.get("/v1/sessions").await;
    assert_eq!(v["sessions"].as_array().map(Vec::len), Some(5), "{v}");
    assert!(d.term().success());
    cfg
}

/// Flip 40 bytes of the store's log where the first session's message is.
fn flip_bytes(store: &Path) {
    let db = store.join("db");
    let mut b = std::fs::read(&db).unwrap();
    let at = b
        .windows(8)
        .position(|w| w == b"marker-0")
        .expect("the message is in the log");
    for x in &mut b[at..at + 40] {
        *x ^= 0x5a;
    }
    std::fs::write(&db, b).unwrap();
}

/// Cut the store's log in half.
fn truncate_half(store: &Path) {
    let db = store.join("db");
    let len = std::fs::metadata(&db).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&db).unwrap();
    f.set_len(len / 2).unwrap();
}

fn corrupt_dirs(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("store.corrupt-"))
        })
        .collect()
}

async fn damaged_store_is_quarantined(damage: fn(&Path), what: &str) {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = five_sessions(dir.path(), &llm, port, json!({})).await;
    damage(&dir.path().join("store"));
    // Default policy: quarantine. The gateway starts (no restart loop), on a fresh store,
    // and says what happened.
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let aside = corrupt_dirs(dir.path());
    assert_eq!(aside.len(), 1, "{what}: {aside:?}\n{}", log_of(dir.path()));
    assert!(
        aside[0].join("db").exists(),
        "{what}: the damaged files kept"
    );
    let (s, ready) = d.api.get("/readyz").await;
    assert_eq!(s, 200, "{ready}");
    let alert = ready["store"]["alert"].as_str().unwrap_or_default();
    assert!(
        alert.contains("damaged") && alert.contains(".corrupt-"),
        "{what}: {ready}"
    );
    let (_, status) = d.api.get("/v1/status").await;
    assert!(status["store"]["health"]["alert"].is_string(), "{status}");
    let metrics = d.api.text("/metrics").await;
    assert!(metrics.contains("clawft_store_alert 1"), "{metrics}");
    assert!(metrics.contains("clawft_store_healthy 1"), "{metrics}");
    let (_, v) = d.api.get("/v1/sessions").await;
    assert_eq!(
        v["sessions"].as_array().map(Vec::len),
        Some(0),
        "{what}: a fresh store, not a partial one: {v}"
    );
    let (s, v) = d.api.chat("after", "still there?").await;
    assert_eq!(s, 200, "{v}");
    assert!(log_of(dir.path()).contains("the store was damaged"));
    assert!(d.term().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_bytes_are_found_and_the_store_quarantined() {
    damaged_store_is_quarantined(flip_bytes, "flipped bytes").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_cut_in_half_is_found_and_quarantined() {
    damaged_store_is_quarantined(truncate_half, "truncated").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_conf_is_quarantined_not_a_restart_loop() {
    damaged_store_is_quarantined(
        |s| std::fs::write(s.join("conf"), b"\xffnot a sled config at all\x00").unwrap(),
        "garbage conf",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leftover_snapshot_does_not_stop_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = five_sessions(dir.path(), &llm, port, json!({})).await;
    let left = dir.path().join("store/snap.00000000000A1B2C.generating");
    std::fs::write(&left, vec![7u8; 4096]).unwrap();
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let (_, v) = d.api.get("/v1/sessions").await;
    assert_eq!(v["sessions"].as_array().map(Vec::len), Some(5), "{v}");
    assert!(!left.exists());
    assert!(corrupt_dirs(dir.path()).is_empty());
    assert!(d.term().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_policy_refuses_with_one_clear_error_and_exit_78() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = five_sessions(
        dir.path(),
        &llm,
        port,
        json!({"store": {"on_corruption": "fail"}}),
    )
    .await;
    truncate_half(&dir.path().join("store"));
    let out = weft(dir.path())
        .arg("--config")
        .arg(&cfg)
        .arg("gateway")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("is damaged"), "{err}");
    assert!(err.contains("weft store check"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        corrupt_dirs(dir.path()).is_empty(),
        "nothing moved under `fail`"
    );
    // `weft store check` says the same and exits non-zero.
    let out = weft(dir.path())
        .arg("--config")
        .arg(&cfg)
        .args(["store", "check", "--json"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false, "{v}");
    // The systemd units do not restart on it.
    for unit in [
        include_str!("../../deploy/systemd/clawft.service"),
        include_str!("../../deploy/systemd/clawft-user.service"),
    ] {
        assert!(unit.contains("RestartPreventExitStatus=78"));
    }
}

/// The exit code follows the error's variant, never its text: a usage error 2 (clap), a plain
/// failure 1, a store written by a newer weft 78 (like a damaged one under `fail`), and the
/// message carries no marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_follow_the_kind_of_error() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = five_sessions(dir.path(), &llm, port, json!({})).await;
    let out = weft(dir.path())
        .arg("--config")
        .arg(&cfg)
        .arg("--no-such-flag")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "usage error");
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{").unwrap();
    let out = weft(dir.path())
        .arg("--config")
        .arg(&bad)
        .arg("status")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    // A newer weft's store: refused under every `on_corruption` policy.
    let sc = dir.path().join("store").join("clawft-store.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&sc).unwrap()).unwrap();
    v["schema"] = json!(v["schema"].as_u64().unwrap() + 1);
    std::fs::write(&sc, v.to_string()).unwrap();
    let out = weft(dir.path())
        .arg("--config")
        .arg(&cfg)
        .arg("gateway")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("written by a newer weft"), "{err}");
    assert!(!err.contains("[store refused]"), "{err}");
    assert!(corrupt_dirs(dir.path()).is_empty(), "nothing moved aside");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_check_backup_while_running_and_restore() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = five_sessions(dir.path(), &llm, port, json!({})).await;
    // Check, directly (no gateway).
    let out = weft(dir.path())
        .arg("--config")
        .arg(&cfg)
        .args(["store", "check", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["counts"]["sessions"], 5, "{v}");
    assert_eq!(v["schema"], 1, "{v}");
    // Backup while the gateway runs (through it), with a turn going on.
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let backup = dir.path().join("backup.jsonl");
    let out = weft(dir.path())
        .arg("--config")
        .arg(&cfg)
        .args(["store", "backup"])
        .arg(&backup)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(backup.exists());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.starts_with("wrote ") && said.contains("weft store restore"),
        "{said}"
    );
    // Restore is refused while it runs.
    let out = weft(dir.path())
        .arg("--config")
        .arg(&cfg)
        .args(["store", "restore"])
        .arg(&backup)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("stop it first"));
    // Lose everything, then restore with the gateway stopped.
    for i in 0..5 {
        let r = d
            .api
            .http
            .delete(format!("{}/v1/sessions/http:chat-{i}", d.api.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
    }
    assert!(d.term().success());
    let out = weft(dir.path())
        .arg("--config")
        .arg(&cfg)
        .args(["store", "restore"])
        .arg(&backup)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let (_, v) = d.api.get("/v1/sessions").await;
    assert_eq!(v["sessions"].as_array().map(Vec::len), Some(5), "{v}");
    let (s, v) = d.api.get("/v1/sessions/http:chat-3").await;
    assert_eq!(s, 200);
    assert!(v.to_string().contains("marker-3"), "{v}");
    assert!(d.term().success());
}

/// A real full disk: the store on a 16 MiB tmpfs in the gateway's own mount namespace (needs
/// root and `unshare`; skipped with a message otherwise). Filled from outside through
/// `/proc/PID/root`, then freed: the next message is answered without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_makes_the_gateway_unready_and_it_serves_again_once_space_is_freed() {
    let probe = std::process::Command::new("unshare")
        .args([
            "-m",
            "sh",
            "-c",
            "mount -t tmpfs -o size=1m tmpfs /mnt && umount /mnt",
        ])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("SKIPPED a_full_disk_...: needs root and `unshare -m` to mount a small tmpfs");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let store = dir.path().join("store");
    std::fs::create_dir_all(&store).unwrap();
    let cfg = gateway_config(
        dir.path(),
        &llm,
        port,
        json!({"channels": {"http": {"token": "tok-full-disk-test-123"}}}),
    );
    let weft_bin = weft(dir.path()).get_program().to_owned();
    let script = format!(
        "mount -t tmpfs -o size=16m tmpfs '{}' && exec '{}' --config '{}' gateway",
        store.display(),
        Path::new(&weft_bin).display(),
        cfg.display()
    );
    let log = std::fs::File::create(dir.path().join("gateway.log")).unwrap();
    let cmd = weft(dir.path());
    let envs: Vec<_> = cmd
        .get_envs()
        .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned())))
        .collect();
    let mut child = std::process::Command::new("unshare")
        .env_clear()
        .envs(envs)
        .args(["-m", "sh", "-c", &script])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let api = Api::with_token(
        &format!("http://127.0.0.1:{port}"),
        Some("tok-full-disk-test-123"),
    );
    let ready = |api: Api| async move {
        api.http
            .get(format!("{}/readyz", api.base))
            .send()
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or(0)
    };
    let deadline = std::time::Instant::now() + T;
    while ready(api.clone()).await != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "not ready\n{}",
            log_of(dir.path())
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "exited\n{}",
            log_of(dir.path())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (s, v) = api.chat("full", "before").await;
    assert_eq!(s, 200, "{v}");
    // Fill the tmpfs, as seen by the gateway.
    let filler = Path::new(&format!("/proc/{}/root", child.id()))
        .join(store.strip_prefix("/").unwrap())
        .join("filler");
    {
        use std::io::Write as _;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![1u8; 64 * 1024];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.flush();
    }
    // Messages fail (no silent loss) and /readyz says why.
    let mut failed = None;
    for i in 0..20 {
        let (s, v) = api
            .chat("full", &format!("during {i} {}", "y".repeat(20_000)))
            .await;
        if s != 200 {
            failed = Some((s, v));
            break;
        }
    }
    let (s, v) = failed
        .unwrap_or_else(|| panic!("writes kept working on a full disk\n{}", log_of(dir.path())));
    // 503 (try again) with a sentence, not 403 with the store's debug text.
    assert_eq!(s, 503, "{v}");
    let said = v["error"].as_str().unwrap_or_default();
    assert!(
        said.contains("disk is full") && !said.contains("Os {"),
        "{v}"
    );
    let r = api
        .http
        .get(format!("{}/readyz", api.base))
        .send()
        .await
        .unwrap();
    let code = r.status().as_u16();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    assert_eq!(code, 503, "{body}\n{}", log_of(dir.path()));
    assert!(body.to_string().contains("degraded"), "{body}");
    let (_, st) = api.get("/v1/status").await;
    assert_eq!(st["store"]["health"]["status"], "degraded", "{st}");
    // Free the space: ready again, and the next message answered, without a restart.
    std::fs::remove_file(&filler).unwrap();
    let deadline = std::time::Instant::now() + T;
    while ready(api.clone()).await != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "never ready again\n{}",
            log_of(dir.path())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (s, v) = api.chat("full", "after").await;
    assert_eq!(s, 200, "{v}\n{}", log_of(dir.path()));
    assert!(child.try_wait().unwrap().is_none(), "no restart");
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let _ = child.wait();
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Started by hand under the usual `umask 022` (the README's quick start): the data directory,
/// the store, the workspace, the log and every backup are private (0700/0600); what an earlier
/// start left open is tightened at start and said once; `weft doctor` fails on what is open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_private_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    // The test process's umask is what the gateway it starts inherits.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o022));
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join(".clawft");
    // What an older quick start left: an open data directory and a readable file in it.
    std::fs::create_dir_all(home.join("skills")).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(home.join("skills/old.md"), "x").unwrap();
    assert_eq!(mode(&home.join("skills/old.md")), 0o644);
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = gateway_config(dir.path(), &llm, port, json!({}));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let (s, v) = d.api.chat("modes", "hello").await;
    assert_eq!(s, 200, "{v}");
    let backup = dir.path().join("backups/b.jsonl");
    let out = weft(dir.path())
        .arg("--config")
        .arg(&cfg)
        .args(["store", "backup", "--json"])
        .arg(&backup)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(d.term().success());
    let store = dir.path().join("store");
    for p in [&home, &home.join("skills"), &store, &dir.path().join("ws")] {
        assert_eq!(mode(p), 0o700, "{}", p.display());
    }
    for p in [
        home.join("skills/old.md"),
        store.join("db"),
        home.join("logs/gateway.log"),
        backup.clone(),
    ] {
        assert_eq!(mode(&p), 0o600, "{}", p.display());
    }
    let log = log_of(dir.path());
    assert_eq!(
        log.matches("were made private").count(),
        1,
        "said once: {log}"
    );

    // Doctor: ok now; a failure naming the file once something is opened again.
    let doctor = |cfg: &Path| {
        weft(dir.path())
            .arg("--config")
            .arg(cfg)
            .args(["doctor", "--json"])
            .output()
            .unwrap()
    };
    let line = |out: &std::process::Output| -> Value {
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .find(|f| f["check"] == "private files")
            .cloned()
            .unwrap_or_default()
    };
    let f = line(&doctor(&cfg));
    assert_eq!(f["level"], "ok", "{f}");
    std::fs::set_permissions(store.join("db"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = doctor(&cfg);
    let f = line(&out);
    assert_eq!(f["level"], "fail", "{f}");
    assert!(f["detail"].as_str().unwrap().contains("store/db"), "{f}");
    assert!(!out.status.success());

    // A restore under umask 022 makes a private store too.
    let out = weft(dir.path())
        .arg("--config")
        .arg(&cfg)
        .args(["store", "restore"])
        .arg(&backup)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.starts_with("restored ") && said.contains("sessions"),
        "{said}"
    );
    assert_eq!(mode(&store), 0o700);
    assert_eq!(mode(&store.join("db")), 0o600);
}
