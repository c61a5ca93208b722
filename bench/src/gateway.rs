//! `weft gateway` as a separate process: a temp home with its config, workspace and store; the
//! start-to-ready poll; figures read from `/proc`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::fake_llm::TOOL_FILE;

/// Clock ticks per second of `/proc/PID/stat` (`USER_HZ`, 100 on every Linux port in use).
const TICKS_PER_SEC: f64 = 100.0;

/// A scratch directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new directory under the system temp dir.
    pub fn new(tag: &str) -> Result<Self, String> {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("weft-bench-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).map_err(|e| format!("create {}: {e}", p.display()))?;
        Ok(Self(p))
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A free port on 127.0.0.1 (bound and released; the gateway binds it right after).
pub fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("addr: {e}"))
}

/// One gateway home: config file, workspace (with the note the tool reads) and store.
pub struct Home {
    pub dir: TempDir,
    pub config: PathBuf,
    pub port: u16,
}

impl Home {
    /// Write the config. `extra_channels` are merged into `channels` (platform fakes).
    ///
    /// Limits set so that they are not what is measured: `tools.rate_limit.per_minute = 0`
    /// (the per-session tool-call limit is off); one message in flight per session, so
    /// `sessions.max_queue` (100) is never reached; `reply_timeout_secs` 120; provider
    /// `max_retries` 0 so an error shows as an error, not as latency.
    pub fn new(tag: &str, llm_base: &str, extra_channels: Option<Value>) -> Result<Self, String> {
        let dir = TempDir::new(tag)?;
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).map_err(|e| format!("workspace: {e}"))?;
        std::fs::write(
            ws.join(TOOL_FILE),
            "hello from the benchmark workspace\nsecond line\n",
        )
        .map_err(|e| format!("note: {e}"))?;
        let port = free_port()?;
        let mut channels = json!({ "http": { "bind": format!("127.0.0.1:{port}"), "reply_timeout_secs": 120, "token": crate::http::API_TOKEN } });
        if let (Some(Value::Object(extra)), Some(obj)) = (extra_channels, channels.as_object_mut())
        {
            obj.extend(extra);
        }
        let cfg = json!({
            "agents": { "defaults": { "workspace": ws, "model": "bench-model" } },
            "providers": { "openai": {
                "base_url": llm_base,
                "api_key": "sk-bench-not-a-secret-0000",
                "timeout_secs": 60,
                "max_retries": 0,
            } },
            "channels": channels,
            "store": { "path": dir.path().join("store") },
            "sessions": { "shutdown_grace_secs": 1 },
            "tools": { "rate_limit": { "per_minute": 0 } },
        });
        let config = dir.path().join("config.json");
        let text = serde_json::to_string_pretty(&cfg).map_err(|e| format!("config: {e}"))?;
        std::fs::write(&config, text).map_err(|e| format!("write config: {e}"))?;
        Ok(Self { dir, config, port })
    }

    /// Set `agents.defaults.KEY = value` in the written config (before the gateway starts).
    pub fn set_agent(&self, key: &str, value: Value) -> Result<(), String> {
        let text = std::fs::read_to_string(&self.config).map_err(|e| format!("config: {e}"))?;
        let mut cfg: Value = serde_json::from_str(&text).map_err(|e| format!("config: {e}"))?;
        cfg["agents"]["defaults"][key] = value;
        let text = serde_json::to_string_pretty(&cfg).map_err(|e| format!("config: {e}"))?;
        std::fs::write(&self.config, text).map_err(|e| format!("write config: {e}"))
    }

    /// The HTTP API address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Bytes of every file under the store directory (apparent sizes).
    pub fn store_bytes(&self) -> u64 {
        dir_bytes(&self.dir.path().join("store"))
    }
}

fn dir_bytes(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// A running gateway; killed (SIGKILL) and reaped on drop.
pub struct Gateway {
    child: Child,
    pub pid: u32,
    /// Spawn → first 200 from `/healthz`.
    pub start_to_ready: Duration,
    log: PathBuf,
}

impl Gateway {
    /// Spawn `weft --config CFG gateway` with a clean environment (HOME and CLAWFT_HOME in the
    /// temp dir, PATH kept, RUST_LOG unset: the default log level) and poll `/healthz` tightly
    /// until it answers 200. Blocking: call from `spawn_blocking`.
    pub fn start(weft: &Path, home: &Home, timeout: Duration) -> Result<Gateway, String> {
        Self::start_with_env(weft, home, timeout, &[])
    }

    /// [`Gateway::start`] with `env` added to its environment (`LD_PRELOAD` of the slow-disk
    /// shim).
    pub fn start_with_env(
        weft: &Path,
        home: &Home,
        timeout: Duration,
        env: &[(String, String)],
    ) -> Result<Gateway, String> {
        let log = home.dir.path().join("gateway.log");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| format!("log: {e}"))?;
        let err = out.try_clone().map_err(|e| format!("log: {e}"))?;
        let mut cmd = Command::new(weft);
        cmd.env_clear()
            .env("HOME", home.dir.path())
            .env("CLAWFT_HOME", home.dir.path().join(".clawft"))
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .arg("--config")
            .arg(&home.config)
            .arg("gateway")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let t0 = Instant::now();
        let child = cmd
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", weft.display()))?;
        let pid = child.id();
        let mut gw = Gateway {
            child,
            pid,
            start_to_ready: Duration::ZERO,
            log,
        };
        let addr = home.addr();
        loop {
            if healthz_ok(addr) {
                gw.start_to_ready = t0.elapsed();
                return Ok(gw);
            }
            if let Ok(Some(st)) = gw.child.try_wait() {
                return Err(format!(
                    "gateway exited ({st}) before ready:\n{}",
                    gw.log_tail()
                ));
            }
            if t0.elapsed() > timeout {
                return Err(format!(
                    "gateway not ready within {timeout:?}:\n{}",
                    gw.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// VmRSS in bytes.
    pub fn rss(&self) -> Result<u64, String> {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .map_err(|e| format!("/proc/{}/status: {e}", self.pid))?;
        let line = s
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .ok_or("no VmRSS")?;
        let kb: u64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("bad line `{line}`"))?;
        Ok(kb * 1024)
    }

    /// utime + stime in seconds.
    pub fn cpu_secs(&self) -> Result<f64, String> {
        let s = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .map_err(|e| format!("/proc/{}/stat: {e}", self.pid))?;
        // Fields after the command name, which is in parentheses and may contain spaces.
        let rest = s.rsplit_once(')').map(|(_, r)| r).ok_or("bad stat")?;
        let f: Vec<&str> = rest.split_whitespace().collect();
        // rest[0] is field 3 (state); utime is field 14, stime 15.
        let tick = |i: usize| -> Result<f64, String> {
            f.get(i)
                .and_then(|v| v.parse::<u64>().ok())
                .map(|v| v as f64 / TICKS_PER_SEC)
                .ok_or_else(|| format!("bad stat field {}", i + 3))
        };
        Ok(tick(11)? + tick(12)?)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One blocking `GET /healthz` on a fresh connection: 200?
pub fn healthz_ok(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut buf = [0u8; 12];
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) | Err(_) => return false,
            Ok(n) => got += n,
        }
    }
    buf.starts_with(b"HTTP/1.1 200")
}

/// Whether an ELF file still has a symbol table (`SHT_SYMTAB`): `None` when not ELF64 LE.
pub fn elf_has_symtab(path: &Path) -> Option<bool> {
    let data = std::fs::read(path).ok()?;
    if data.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(data.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(data.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(data.get(o..o + 8)?.try_into().ok()?));
    let shoff = usize::try_from(u64_at(0x28)?).ok()?;
    let shentsize = usize::from(u16_at(0x3A)?);
    let shnum = usize::from(u16_at(0x3C)?);
    Some((0..shnum).any(|i| u32_at(shoff + i * shentsize + 4) == Some(2)))
}
