//! Running under systemd: the sd_notify protocol as the real `weft gateway` speaks it on a
//! test-owned notify socket, and `weft service install|uninstall|status` with and without
//! `systemctl` on PATH.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::config_value;
use crate::process::{weft, write_config};

fn recv_until(
    sock: &UnixDatagram,
    got: &mut Vec<(Instant, String)>,
    deadline: Instant,
    done: impl Fn(&[(Instant, String)]) -> bool,
) {
    let mut buf = [0u8; 1024];
    while !done(got) && Instant::now() < deadline {
        if let Ok(n) = sock.recv(&mut buf) {
            got.push((
                Instant::now(),
                String::from_utf8_lossy(&buf[..n]).into_owned(),
            ));
        }
    }
}

fn count(got: &[(Instant, String)], m: &str) -> usize {
    got.iter().filter(|(_, s)| s == m).count()
}

fn pos(got: &[(Instant, String)], f: impl Fn(&str) -> bool) -> Option<usize> {
    got.iter().position(|(_, s)| f(s))
}

#[test]
fn gateway_reports_ready_status_watchdog_and_stopping_to_the_notify_socket() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &config_value("http://127.0.0.1:9/v1", dir.path(), json!({})),
    );
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let log = std::fs::File::create(dir.path().join("gateway.log")).unwrap();
    let mut child = weft(dir.path())
        .arg("--config")
        .arg(&cfg)
        .arg("gateway")
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "400000")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let log_of = || std::fs::read_to_string(dir.path().join("gateway.log")).unwrap_or_default();

    let mut got = Vec::new();
    recv_until(
        &sock,
        &mut got,
        Instant::now() + Duration::from_secs(30),
        |g| g.iter().any(|(_, s)| s.starts_with("STATUS=")),
    );
    let ready = pos(&got, |s| s == "READY=1").unwrap_or_else(|| panic!("{got:?}\n{}", log_of()));
    let status = pos(&got, |s| s.starts_with("STATUS=")).unwrap();
    assert!(ready < status, "{got:?}");
    assert!(got[status].1.contains("channels http"), "{got:?}");
    assert!(!got[status].1.contains('\n'));

    // WATCHDOG_USEC=400000 → a ping every 200 ms: at least 2 within about a second.
    let ready_at = got[ready].0;
    recv_until(
        &sock,
        &mut got,
        ready_at + Duration::from_millis(1200),
        |g| count(g, "WATCHDOG=1") >= 3,
    );
    let pings: Vec<Duration> = got
        .iter()
        .filter(|(_, s)| s == "WATCHDOG=1")
        .map(|(t, _)| t.duration_since(ready_at))
        .collect();
    assert!(
        pings.len() >= 2,
        "pings after ready: {pings:?}\n{}",
        log_of()
    );
    assert!(pings[1] < Duration::from_millis(1000), "{pings:?}");

    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    recv_until(
        &sock,
        &mut got,
        Instant::now() + Duration::from_secs(20),
        |g| g.iter().any(|(_, s)| s == "STOPPING=1"),
    );
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(0), "{}", log_of());
    let stopping = pos(&got, |s| s == "STOPPING=1").unwrap_or_else(|| panic!("{got:?}"));
    let last_ping = got.iter().rposition(|(_, s)| s == "WATCHDOG=1").unwrap();
    assert!(
        status < stopping && ready < last_ping,
        "order: READY, STATUS, WATCHDOG…, STOPPING: {got:?}"
    );
    eprintln!("notify messages: {got:?}; pings after READY: {pings:?}");
    assert_eq!(count(&got, "READY=1"), 1, "{got:?}");
    assert_eq!(count(&got, "STOPPING=1"), 1, "{got:?}");
}

#[test]
fn gateway_without_notify_socket_runs_and_stops_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &config_value("http://127.0.0.1:9/v1", dir.path(), json!({})),
    );
    let child = weft(dir.path())
        .arg("--config")
        .arg(&cfg)
        .arg("gateway")
        .env("WATCHDOG_USEC", "400000")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the store is held (the gateway started), then stop it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !dir.path().join("store").exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn service(home: &Path, path_dir: &Path, args: &[&str]) -> Output {
    // systemd "runs" (the probe directory exists), whatever this machine has.
    let probe = home.join("run-systemd-system");
    std::fs::create_dir_all(&probe).unwrap();
    weft(home)
        .env("PATH", path_dir)
        .env("WEFT_TEST_SYSTEMD_PROBE", &probe)
        .arg("service")
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn service_install_without_systemctl_writes_the_unit_and_says_what_to_run() {
    let home = tempfile::tempdir().unwrap();
    let bin = home.path().join("bin"); // no systemctl here
    std::fs::create_dir(&bin).unwrap();
    let cfg = home.path().join("c.toml");
    std::fs::write(&cfg, "").unwrap();
    let cfg_s = cfg.to_str().unwrap();
    let unit = home.path().join(".config/systemd/user/clawft.service");

    let out = service(home.path(), &bin, &["--config", cfg_s, "install"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let written = std::fs::read_to_string(&unit).unwrap();
    let exec = format!(
        "\nExecStart={} gateway --config {cfg_s}\n",
        env!("CARGO_BIN_EXE_weft")
    );
    assert!(written.contains(&exec), "{written}");
    assert!(written.contains("\nType=notify\n"));
    assert!(t.contains(&format!("wrote {}", unit.display())), "{t}");
    assert!(t.contains("systemctl --user daemon-reload"), "{t}");
    assert!(
        t.contains("systemctl --user enable --now clawft.service"),
        "{t}"
    );

    // Same content again: fine, nothing rewritten.
    let out = service(home.path(), &bin, &["--config", cfg_s, "install"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("unchanged"));

    // A different unit (another config) is refused without --force and left as it was.
    let other = home.path().join("other.toml");
    let other_s = other.to_str().unwrap();
    let out = service(home.path(), &bin, &["--config", other_s, "install"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("--force"), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&unit).unwrap(), written);
    let out = service(
        home.path(),
        &bin,
        &["--config", other_s, "install", "--force"],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(std::fs::read_to_string(&unit)
        .unwrap()
        .contains(&format!("--config {other_s}\n")));
    assert!(text(&out).contains("does not exist yet"), "{}", text(&out));

    // The state is unknown here: exit 3, as `systemctl status` for a unit that is not running.
    let out = service(home.path(), &bin, &["status"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(text(&out).contains("systemctl not found"), "{}", text(&out));

    let out = service(home.path(), &bin, &["uninstall"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!unit.exists());
    assert!(text(&out).contains(&format!("removed {}", unit.display())));
    assert!(text(&out).contains("systemctl --user disable --now clawft.service"));
}

#[test]
fn service_install_with_systemctl_reloads_and_enables_the_user_unit() {
    let home = tempfile::tempdir().unwrap();
    let bin = home.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let calls = home.path().join("calls.txt");
    let fake = bin.join("systemctl");
    std::fs::write(
        &fake,
        format!("#!/bin/sh\necho \"$*\" >> '{}'\n", calls.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();

    let out = service(home.path(), &bin, &["install"]);
    assert!(out.status.success(), "{}", text(&out));
    let unit = home.path().join(".config/systemd/user/clawft.service");
    // Default config path: $CLAWFT_HOME/config.json when no config.toml exists.
    assert!(std::fs::read_to_string(&unit).unwrap().contains(&format!(
        "--config {}\n",
        home.path().join(".clawft/config.json").display()
    )));
    let out = service(home.path(), &bin, &["uninstall"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!unit.exists());
    assert_eq!(
        std::fs::read_to_string(&calls).unwrap(),
        "--user daemon-reload\n--user enable --now clawft.service\n\
         --user disable --now clawft.service\n--user daemon-reload\n"
    );
}

/// systemd may stop a unit while it is still starting: a SIGTERM as soon as the store is open
/// (mid-start, before "ready") ends in a clean shutdown with status 0, not in the default action
/// of the signal.
#[test]
fn sigterm_during_start_is_a_clean_shutdown() {
    for _ in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let cfg = write_config(
            dir.path(),
            &config_value("http://127.0.0.1:9/v1", dir.path(), json!({})),
        );
        let child = weft(dir.path())
            .arg("--config")
            .arg(&cfg)
            .arg("gateway")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !dir.path().join("store").exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let pid = rustix::process::Pid::from_child(&child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{:?}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
