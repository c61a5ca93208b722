//! The `browser` tool with a real headless Chromium against pages this test serves on
//! 127.0.0.1: the journey (open, snapshot, click, type and submit, screenshot) and hostile
//! pages, each checked by a canary listener that must see no connection at all.
//!
//! The page server is reachable because the browser's settings allow exactly its
//! address and port (`tools.browser.allow_private = ["127.0.0.1:PORT"]`); the canary listens
//! on another port of the same loopback address, which stays refused.
//!
//! One browser serves every test (starting Chromium costs ~0.5 s and 100 MB): the tests share
//! one runtime and take turns.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use clawft::browser::session::Browser;
use clawft::browser::tool::{png_size, BrowserTool};
use clawft::browser::BrowserSettings;
use clawft::tools::{Tool, ToolContext, ToolError, Workspace};
use clawft::types::SessionKey;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// A listener on every address of the host counting the connections it accepts.
struct Canary {
    port: u16,
    hits: Arc<AtomicUsize>,
}

impl Canary {
    fn start() -> Self {
        let l = TcpListener::bind("0.0.0.0:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        std::thread::spawn(move || {
            for s in l.incoming() {
                h.fetch_add(1, Ordering::SeqCst);
                if let Ok(mut s) = s {
                    let _ = s.write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 16\r\nConnection: close\r\n\r\nCANARY-REACHED!!",
                    );
                }
            }
        });
        Self { port, hits }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

fn page(body: &str) -> String {
    format!(
        "<!doctype html><html><head><meta charset=utf-8><title>T</title></head><body>{body}</body></html>"
    )
}

fn respond(mut s: TcpStream, canary: u16) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = [0u8; 8192];
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&got).to_string();
    let target = head.split(' ').nth(1).unwrap_or("/").to_string();
    // Absolute-form (through a proxy) or origin-form.
    let path = match target.find("://") {
        Some(i) => {
            let rest = &target[i + 3..];
            rest.find('/')
                .map_or("/".to_string(), |j| rest[j..].to_string())
        }
        None => target,
    };
    let canary_url = format!("http://127.0.0.1:{canary}/");
    let (status, extra, body) = match path.split('?').next().unwrap_or("/") {
        "/" => (
            "200 OK",
            String::new(),
            page(
                r#"<h1>Welcome to the test shop</h1><p>Fresh <b>apples</b> every <i>day</i>.</p>
            <a href="/next">Next page</a>
            <form action="/search" method="get"><label for=q>Query</label><input id=q name=q>
            <button type=submit>Search</button></form>
            <select id=fruit><option value=a>Apple</option><option value=p>Pear</option></select>"#,
            ),
        ),
        "/next" => (
            "200 OK",
            String::new(),
            page("<h1>Second page</h1><p>You followed the link.</p>"),
        ),
        "/search" => {
            let q = path.split("q=").nth(1).unwrap_or("").to_string();
            (
                "200 OK",
                String::new(),
                page(&format!("<p>You searched for: {q}</p>")),
            )
        }
        "/script-fetch" => (
            "200 OK",
            String::new(),
            page(&format!(
                r#"<p id=s>working</p><script>
            const u = "{canary_url}";
            const done = (m) => {{ document.getElementById('s').textContent = 'attempts done: ' + m; }};
            let n = 0; const one = () => {{ if (++n === 3) done(n); }};
            fetch(u).then(() => one(), () => one());
            fetch(u.replace('127.0.0.1', 'localhost')).then(() => one(), () => one());
            try {{ const ws = new WebSocket(u.replace('http', 'ws')); ws.onerror = one; ws.onopen = one; }} catch (e) {{ one(); }}
            </script>"#
            )),
        ),
        "/redirect" => (
            "302 Found",
            "Location: /redirect2\r\n".to_string(),
            String::new(),
        ),
        "/redirect2" => (
            "302 Found",
            format!("Location: {canary_url}\r\n"),
            String::new(),
        ),
        "/file-link" => (
            "200 OK",
            String::new(),
            page(
                r#"<a href="file:///etc/passwd">passwords</a> <a href="view-source:http://example.com/">source</a>"#,
            ),
        ),
        "/tabs" => (
            "200 OK",
            String::new(),
            page(
                r#"<p id=s>opening</p><script>for (let i = 0; i < 100; i++) { window.open('/next?' + i, '_blank'); } document.getElementById('s').textContent = 'opened all';</script>"#,
            ),
        ),
        "/never" => {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 100000\r\n\r\n<html><body><p>Partial content arrives</p>");
            std::thread::sleep(Duration::from_secs(120));
            return;
        }
        "/secret" => (
            "200 OK",
            String::new(),
            page("<p>Your key is sk-test-secret-123456 and the day is sunny.</p>"),
        ),
        "/login" => (
            "200 OK",
            String::new(),
            page(
                r#"<form action="/search"><input type=password name=q aria-label="Password" oninput="document.getElementById('echo').textContent = 'You typed ' + this.value"></form><p id=echo>nothing yet</p>"#,
            ),
        ),
        "/set-cookie" => {
            let v = path.split("v=").nth(1).unwrap_or("none").to_string();
            (
                "200 OK",
                format!("Set-Cookie: who={v}; Path=/\r\n"),
                page(&format!("<p>Cookie set to {v}</p>")),
            )
        }
        "/show-cookie" => {
            let cookie = head
                .lines()
                .find_map(|l| {
                    l.strip_prefix("Cookie: ")
                        .or_else(|| l.strip_prefix("cookie: "))
                })
                .unwrap_or("none")
                .to_string();
            (
                "200 OK",
                String::new(),
                page(&format!("<p>Cookies here: {cookie}.</p>")),
            )
        }
        "/busy" => (
            "200 OK",
            String::new(),
            page("<p>Busy page</p><button onclick='for(;;){}'>spin</button>"),
        ),
        _ => ("404 Not Found", String::new(), page("not found")),
    };
    let _ = s.write_all(
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
}

struct Fx {
    rt: tokio::runtime::Runtime,
    tool: BrowserTool,
    browser: Arc<Browser>,
    ctx: ToolContext,
    ws: tempfile::TempDir,
    _state: tempfile::TempDir,
    server: SocketAddr,
    canary: Canary,
    turn: tokio::sync::Mutex<()>,
}

/// Whether a browser is installed; in CI its absence fails loudly.
fn have_browser() -> bool {
    let ok = BrowserSettings::default().find_executable().is_some();
    if !ok {
        assert!(
            std::env::var("CI").is_err(),
            "no Chromium installed: .ci/run installs it (apt-get install chromium)"
        );
        println!("SKIPPED: no Chromium installed (apt install chromium)");
    }
    ok
}

static FX: LazyLock<Fx> = LazyLock::new(|| {
    let canary = Canary::start();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = listener.local_addr().unwrap();
    let cport = canary.port;
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            std::thread::spawn(move || respond(s, cport));
        }
    });
    let ws = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let settings = BrowserSettings {
        allow_endpoints: vec![server],
        load_timeout: Duration::from_secs(4),
        action_timeout: Duration::from_secs(10),
        max_tabs: 4,
        ..BrowserSettings::default()
    };
    let browser = Browser::new(settings, "main", state.path().join("browser/main"));
    let tool = BrowserTool::new(browser.clone());
    let ctx = ToolContext {
        workspace: Arc::new(Workspace::open(ws.path()).unwrap()),
        session: SessionKey::parse("t:1").unwrap(),
        cancel: CancellationToken::new(),
        user_dir: None,
        sender: None,
        call_id: None,
        turn: Default::default(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    Fx {
        rt,
        tool,
        browser,
        ctx,
        ws,
        _state: state,
        server,
        canary,
        turn: tokio::sync::Mutex::new(()),
    }
});

impl Fx {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server)
    }

    async fn call(&self, args: Value) -> Result<Value, ToolError> {
        self.tool.execute(args, &self.ctx).await
    }

    async fn ok(&self, args: Value) -> Value {
        let a = args.clone();
        self.call(args).await.unwrap_or_else(|e| panic!("{a}: {e}"))
    }

    async fn snapshot(&self) -> String {
        let v = self.ok(json!({"action": "snapshot"})).await;
        v["untrusted_page_text"].as_str().unwrap().to_string()
    }
}

/// Run `f` with the shared browser, one test at a time.
fn with_browser<F, Fut>(f: F)
where
    F: FnOnce(&'static Fx) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    if !have_browser() {
        return;
    }
    let fx: &'static Fx = &FX;
    fx.rt.block_on(async {
        let _turn = fx.turn.lock().await;
        f(fx).await;
    });
}

/// The number of `[n]` in front of the line containing `needle`.
fn ref_of(snapshot: &str, needle: &str) -> u64 {
    let line = snapshot
        .lines()
        .find(|l| l.contains(needle) && l.starts_with('['))
        .unwrap_or_else(|| panic!("no ref for {needle} in:\n{snapshot}"));
    line[1..line.find(']').unwrap()].parse().unwrap()
}

#[test]
fn open_snapshot_click_type_submit_and_screenshot() {
    with_browser(|fx| async move {
        let started = Instant::now();
        let v = fx.ok(json!({"action": "open", "url": fx.url("/")})).await;
        assert_eq!(v["title"], "T", "{v}");
        println!("first open: {:?}", started.elapsed());
        let snap = fx.snapshot().await;
        assert!(snap.contains("# Welcome to the test shop"), "{snap}");
        assert!(snap.contains("Fresh apples every day."), "{snap}");
        assert!(snap.contains("link \"Next page\" -> /next"), "{snap}");

        // Click a reference: the link navigates.
        let link = ref_of(&snap, "Next page");
        let v = fx.ok(json!({"action": "click", "ref": link})).await;
        assert_eq!(v["url"], fx.url("/next"), "{v}");
        assert!(fx.snapshot().await.contains("You followed the link."));

        // Back, then type into the form and submit with Enter.
        let v = fx.ok(json!({"action": "back"})).await;
        assert_eq!(v["url"], fx.url("/"), "{v}");
        let snap = fx.snapshot().await;
        let q = ref_of(&snap, "textbox \"Query\"");
        let v = fx
            .ok(json!({"action": "type", "ref": q, "text": "green pears", "submit": true}))
            .await;
        assert!(
            v["url"].as_str().unwrap().contains("/search?q=green+pears"),
            "{v}"
        );
        assert!(fx
            .snapshot()
            .await
            .contains("You searched for: green+pears"));

        // Type without submitting, then a select and the search button by click.
        fx.ok(json!({"action": "back"})).await;
        let snap = fx.snapshot().await;
        fx.ok(
            json!({"action": "type", "ref": ref_of(&snap, "textbox \"Query\""), "text": "plums"}),
        )
        .await;
        let v = fx
            .ok(json!({"action": "select", "ref": ref_of(&snap, "combobox"), "value": "Pear"}))
            .await;
        assert_eq!(v["selected"], "Pear");
        let snap2 = fx.snapshot().await;
        assert!(snap2.contains("value=\"plums\""), "{snap2}");
        assert!(snap2.contains("*Pear"), "{snap2}");
        let v = fx
            .ok(json!({"action": "click", "ref": ref_of(&snap2, "button \"Search\"")}))
            .await;
        assert!(
            v["url"].as_str().unwrap().ends_with("/search?q=plums"),
            "{v}"
        );

        // A password typed into a page never comes back in a result: not from a page that
        // echoes it, nor in the URL a form puts it in.
        fx.ok(json!({"action": "open", "url": fx.url("/login")}))
            .await;
        let snap = fx.snapshot().await;
        let pw = ref_of(&snap, "\"Password\"");
        const PW: &str = "Tr0ub4dor-horse-staple";
        let v = fx
            .ok(json!({"action": "type", "ref": pw, "text": PW}))
            .await;
        assert!(!v.to_string().contains(PW), "{v}");
        let snap = fx.snapshot().await;
        assert!(snap.contains("You typed [typed credential]"), "{snap}");
        assert!(!snap.contains(PW), "{snap}");
        let v = fx.ok(json!({"action": "press", "key": "Enter"})).await;
        assert!(!v.to_string().contains(PW), "{v}");
        let snap = fx.snapshot().await;
        assert!(
            snap.contains("You searched for: [typed credential]"),
            "{snap}"
        );

        // A screenshot is a real PNG of the page's size, saved in the workspace.
        let v = fx.ok(json!({"action": "screenshot"})).await;
        let path = fx.ws.path().join(v["path"].as_str().unwrap());
        let png = std::fs::read(&path).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(png_size(&png), Some((1280, 800)), "{v}");
        assert_eq!(v["width"], 1280);
        // And a PDF.
        let v = fx.ok(json!({"action": "pdf"})).await;
        let pdf = std::fs::read(fx.ws.path().join(v["path"].as_str().unwrap())).unwrap();
        assert!(pdf.starts_with(b"%PDF-"));

        // Refs of an old page are refused with a clear error.
        fx.ok(json!({"action": "open", "url": fx.url("/next")}))
            .await;
        let e = fx
            .call(json!({"action": "click", "ref": 1}))
            .await
            .unwrap_err();
        assert!(matches!(e, ToolError::InvalidArgs(_)), "{e}");
        assert!(e.to_string().contains("snapshot"), "{e}");
        // JavaScript of the model's own is off by default.
        let e = fx
            .call(json!({"action": "evaluate", "script": "1+1"}))
            .await
            .unwrap_err();
        assert!(matches!(e, ToolError::PermissionDenied(_)), "{e}");
    });
}

#[test]
fn the_browser_cannot_reach_the_network_it_was_not_given() {
    with_browser(|fx| async move {
        let c = fx.canary.port;
        // A loopback port that is not the allowed one: the proxy refuses it.
        let v = fx
            .ok(json!({"action": "open", "url": format!("http://127.0.0.1:{c}/")}))
            .await;
        let snap = fx.snapshot().await;
        assert!(!snap.contains("CANARY-REACHED"), "{v} {snap}");
        assert!(
            snap.contains("refused") || v.get("error").is_some(),
            "{v} {snap}"
        );
        // `localhost` and other spellings of loopback.
        for host in ["localhost", "2130706433", "[::1]", "0x7f.1"] {
            let _ = fx
                .call(json!({"action": "open", "url": format!("http://{host}:{c}/")}))
                .await;
        }
        // HTTPS (CONNECT) to the canary.
        let v = fx
            .ok(json!({"action": "open", "url": format!("https://127.0.0.1:{c}/")}))
            .await;
        assert!(v.get("error").is_some(), "{v}");
        // Cloud metadata: refused by the guard (there is nothing to count there; the
        // refusal is what the proxy answers).
        fx.ok(json!({"action": "open", "url": "http://169.254.169.254/latest/meta-data/"}))
            .await;
        let snap = fx.snapshot().await;
        assert!(snap.contains("refused 169.254.169.254"), "{snap}");

        // The host's own non-loopback address.
        if let Some(ip) = host_address() {
            fx.ok(json!({"action": "open", "url": format!("http://{ip}:{c}/")}))
                .await;
            assert!(!fx.snapshot().await.contains("CANARY-REACHED"));
        } else {
            println!("no non-loopback address here: the host-address case is not run");
        }

        // A page whose scripts fetch loopback (fetch, WebSocket): they fail, and wait for it.
        fx.ok(json!({"action": "open", "url": fx.url("/script-fetch")}))
            .await;
        let v = fx
            .ok(json!({"action": "wait", "text": "attempts done", "timeout": 20}))
            .await;
        assert_eq!(v["found"], true, "{v}");

        // A redirect chain ending on loopback.
        let v = fx
            .ok(json!({"action": "open", "url": fx.url("/redirect")}))
            .await;
        assert!(!fx.snapshot().await.contains("CANARY-REACHED"), "{v}");

        assert_eq!(fx.canary.hits(), 0, "the canary was reached");
    });
}

/// An address of this host other than loopback (the one a default route would use).
fn host_address() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[test]
fn local_files_and_browser_pages_are_never_shown() {
    with_browser(|fx| async move {
        for url in [
            "file:///etc/passwd",
            "chrome://settings",
            "devtools://devtools/bundled/inspector.html",
            "view-source:http://127.0.0.1/",
        ] {
            let e = fx
                .call(json!({"action": "open", "url": url}))
                .await
                .unwrap_err();
            assert!(matches!(e, ToolError::PermissionDenied(_)), "{url}: {e}");
        }
        // A link to file:///etc/passwd on a web page.
        fx.ok(json!({"action": "open", "url": fx.url("/file-link")}))
            .await;
        let snap = fx.snapshot().await;
        let r = ref_of(&snap, "passwords");
        let _ = fx.call(json!({"action": "click", "ref": r})).await;
        let v = fx.ok(json!({"action": "snapshot"})).await;
        let text = v["untrusted_page_text"].as_str().unwrap();
        assert!(!text.contains("root:x:0:0"), "{v}");
        assert!(v["url"].as_str().unwrap().starts_with("http"), "{v}");
        // Downloads are refused; no file appears in the workspace but the captures.
        assert!(!fx.ws.path().join("passwd").exists());
    });
}

#[test]
fn tabs_are_capped_and_a_page_that_never_loads_does_not_hang() {
    with_browser(|fx| async move {
        // A page opening 100 tabs: at most max_tabs (4) stay.
        fx.ok(json!({"action": "open", "url": fx.url("/tabs")}))
            .await;
        let v = fx
            .ok(json!({"action": "wait", "text": "opened all", "timeout": 20}))
            .await;
        assert_eq!(v["found"], true, "{v}");
        let mut n = usize::MAX;
        for _ in 0..50 {
            let v = fx.ok(json!({"action": "tabs"})).await;
            n = v["tabs"].as_array().unwrap().len();
            if n <= 4 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(n <= 4, "{n} tabs open");
        // Close the others through the tool.
        loop {
            let v = fx.ok(json!({"action": "tabs"})).await;
            let tabs = v["tabs"].as_array().unwrap().clone();
            let Some(other) = tabs.iter().find(|t| t["current"] != true) else {
                break;
            };
            fx.ok(json!({"action": "tabs", "close": other["tab"]}))
                .await;
        }

        // A page that never finishes loading: the action returns after the load limit.
        let started = Instant::now();
        let v = fx
            .ok(json!({"action": "open", "url": fx.url("/never")}))
            .await;
        let took = started.elapsed();
        assert!(took < Duration::from_secs(10), "{took:?}");
        assert!(
            v["note"]
                .as_str()
                .unwrap_or("")
                .contains("not finished loading"),
            "{v}"
        );

        // A page stuck in a script: the action times out, /stop ends one at once, and the
        // browser keeps working (the tab is replaced).
        fx.ok(json!({"action": "open", "url": fx.url("/busy")}))
            .await;
        let snap = fx.snapshot().await;
        let spin = ref_of(&snap, "spin");
        let started = Instant::now();
        let e = fx
            .call(json!({"action": "click", "ref": spin}))
            .await
            .unwrap_err();
        assert!(matches!(e, ToolError::Timeout(_)), "{e}");
        assert!(started.elapsed() < Duration::from_secs(25));
        let stop = CancellationToken::new();
        let ctx = ToolContext {
            cancel: stop.clone(),
            ..fx.ctx.clone()
        };
        let s2 = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            s2.cancel();
        });
        let started = Instant::now();
        let _ = fx
            .tool
            .execute(
                json!({"action": "wait", "text": "never there", "timeout": 60}),
                &ctx,
            )
            .await;
        assert!(started.elapsed() < Duration::from_secs(5));
        let v = fx
            .ok(json!({"action": "open", "url": fx.url("/next")}))
            .await;
        assert_eq!(v["url"], fx.url("/next"));
        assert_eq!(fx.canary.hits(), 0);
    });
}

/// Listening TCP sockets (inodes) of the host, from /proc/net/tcp{,6}.
fn listening_inodes() -> Vec<String> {
    let mut out = Vec::new();
    for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for l in text.lines().skip(1) {
            let cols: Vec<&str> = l.split_whitespace().collect();
            if cols.get(3) == Some(&"0A") {
                out.push(cols[9].to_string());
            }
        }
    }
    out
}

/// Socket inodes held by the processes of group `pgid`.
/// The processes of group `pgid`.
fn group_pids(pgid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        if after.split_whitespace().nth(2) == Some(pgid.to_string().as_str()) {
            out.push(pid);
        }
    }
    out
}

fn sockets_of_group(pgid: u32) -> Vec<String> {
    let mut out = Vec::new();
    for pid in group_pids(pgid) {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(t) = std::fs::read_link(fd.path()) {
                let t = t.to_string_lossy().to_string();
                if let Some(i) = t.strip_prefix("socket:[") {
                    out.push(i.trim_end_matches(']').to_string());
                }
            }
        }
    }
    out
}

#[test]
fn no_devtools_port_exists_and_commands_cannot_reach_the_browser() {
    with_browser(|fx| async move {
        fx.ok(json!({"action": "open", "url": fx.url("/next")}))
            .await;
        let pid = fx.browser.pid().await.unwrap();
        // No process of the browser listens on any TCP port: CDP is a pipe.
        let listening = listening_inodes();
        let held = sockets_of_group(pid);
        assert!(!held.is_empty(), "the browser's processes were not found");
        let open: Vec<_> = held.iter().filter(|i| listening.contains(i)).collect();
        assert!(open.is_empty(), "the browser listens on TCP: {open:?}");
        // Chromium itself (the jail's own processes lead its group).
        let chromium = group_pids(pid)
            .into_iter()
            .find(|p| {
                std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
                    let c = String::from_utf8_lossy(&c);
                    c.contains("--remote-debugging-pipe") && !c.contains("--type=")
                })
            })
            .expect("no Chromium process in the browser's group");
        let cmdline = std::fs::read(format!("/proc/{chromium}/cmdline")).unwrap();
        let cmdline = String::from_utf8_lossy(&cmdline);
        assert!(!cmdline.contains("--remote-debugging-port"));
        // It runs confined like commands: no new privileges, no capabilities, and the
        // environment is not the daemon's.
        let status = std::fs::read_to_string(format!("/proc/{chromium}/status")).unwrap();
        assert!(status.contains("NoNewPrivs:\t1"), "{status}");
        assert!(status.contains("CapEff:\t0000000000000000"), "{status}");
        let environ = std::fs::read(format!("/proc/{chromium}/environ")).unwrap();
        let environ = String::from_utf8_lossy(&environ);
        assert!(!environ.contains("CARGO"), "{environ}");

        let rt = std::sync::Arc::new(
            clawft::tools::exec::ExecRuntime::new(
                clawft::tools::exec::ExecSettings::default(),
                clawft::tools::exec::ExecDeps {
                    protected_paths: Vec::new(),
                    secrets: Vec::new(),
                    env: vec![("PATH".into(), "/usr/bin:/bin".into())],
                    approver: None,
                    tmp_base: fx.ws.path().to_path_buf(),
                    proxy_socket: None,
                    proxy: None,
                },
            )
            .unwrap(),
        );
        let st = rt.sandbox_status();
        let loopback_get = format!(
            "GET http://127.0.0.1:{}/ HTTP/1.1\r\nHost: x\r\n\r\n",
            fx.canary.port
        );
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut out = String::new();
        if st.jail.is_some_and(|j| j.pid_namespace) {
            // Where the kernel gives namespaces, Chromium is in its own network namespace,
            // like commands: whatever its flags or a compromised renderer do, the only way
            // out is the proxy bridged in. Every one of its processes is.
            let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/net")).unwrap();
            let ours = ns("self");
            for p in group_pids(pid) {
                if std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains("chromium"))
                {
                    assert_ne!(
                        ns(&p.to_string()),
                        ours,
                        "Chromium process {p} shares the daemon's network"
                    );
                }
            }
            assert!(
                fx.browser.proxy_addr().await.is_none(),
                "a TCP proxy was opened"
            );
            // The proxy (a socket in the browser's private directory) refuses what the
            // browser may not reach.
            let sock = fx.browser.proxy_socket().await.unwrap();
            let mut s = tokio::net::UnixStream::connect(&sock).await.unwrap();
            s.write_all(loopback_get.as_bytes()).await.unwrap();
            s.read_to_string(&mut out).await.unwrap();
        } else {
            println!(
                "SKIPPED namespace part: no namespaces here ({}); the browser uses its proxy by its flags",
                st.summary()
            );
            // The browser's proxy port is the only loopback listener it has.
            let proxy = fx.browser.proxy_addr().await.unwrap();
            let mut s = tokio::net::TcpStream::connect(proxy).await.unwrap();
            s.write_all(loopback_get.as_bytes()).await.unwrap();
            s.read_to_string(&mut out).await.unwrap();
        }
        assert!(out.starts_with("HTTP/1.1 403"), "{out}");
        assert!(out.contains("tools.browser.allow_private"), "{out}");
        assert_eq!(fx.canary.hits(), 0);
    });
}

/// The jail, not Chromium's flags, keeps it off the network: a jailed Chromium started with
/// `--no-proxy-server` (every request direct, as a renderer exploit ignoring its proxy
/// settings would do) reaches neither the canary (on every address of the host) nor even the
/// page server its proxy would allow.
#[test]
fn a_jailed_browser_without_its_proxy_flags_reaches_nothing() {
    with_browser(|fx| async move {
        let state = tempfile::tempdir().unwrap();
        let settings = BrowserSettings {
            allow_endpoints: vec![fx.server],
            load_timeout: Duration::from_secs(4),
            ..BrowserSettings::default()
        };
        let b = Browser::new(settings, "direct", state.path().join("browser/direct"))
            .ignoring_proxy_flags_in_jail();
        let tool = BrowserTool::new(b.clone());
        let call = |args: Value| {
            let tool = &tool;
            async move { tool.execute(args, &fx.ctx).await }
        };
        let c = fx.canary.port;
        let v = call(json!({"action": "open", "url": fx.url("/")})).await;
        if b.proxy_socket().await.is_none() {
            b.close().await;
            println!("SKIPPED: no namespaces here; the browser runs on the host's network with its proxy flags (kept)");
            return;
        }
        let v = v.unwrap();
        // Its flags really are gone.
        let pid = b.pid().await.unwrap();
        let cmdline = group_pids(pid)
            .into_iter()
            .filter_map(|p| std::fs::read(format!("/proc/{p}/cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).to_string())
            .find(|c| c.contains("--remote-debugging-pipe") && !c.contains("--type="))
            .unwrap();
        assert!(cmdline.contains("--no-proxy-server"), "{cmdline}");
        assert!(!cmdline.contains("--proxy-server="), "{cmdline}");
        // Direct, the allowed page server is out of reach too: the namespace has nothing but
        // its own loopback (and the proxy, which this Chromium no longer uses).
        assert!(v.get("error").is_some(), "{v}");
        assert_ne!(v["title"], "T", "{v}");
        let mut targets = vec![
            format!("http://127.0.0.1:{c}/"),
            format!("http://localhost:{c}/"),
            format!("https://127.0.0.1:{c}/"),
        ];
        if let Some(ip) = host_address() {
            targets.push(format!("http://{ip}:{c}/"));
        }
        for url in targets {
            let v = call(json!({"action": "open", "url": url})).await.unwrap();
            assert!(v.get("error").is_some(), "{url}: {v}");
        }
        let snap = call(json!({"action": "snapshot"})).await.unwrap();
        assert!(!snap.to_string().contains("CANARY-REACHED"), "{snap}");
        assert_eq!(fx.canary.hits(), 0, "a direct connection left the jail");
        b.close().await;
    });
}

#[test]
fn the_profile_is_private_and_closing_ends_every_process() {
    with_browser(|fx| async move {
        fx.ok(json!({"action": "open", "url": fx.url("/next")}))
            .await;
        let pid = fx.browser.pid().await.unwrap();
        let starts = fx.browser.starts();
        // A crash is survived: the next action starts a new browser.
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        let ok = crate::common::wait_until(Duration::from_secs(10), || {
            !Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z "))
        })
        .await;
        assert!(ok);
        let v = fx.ok(json!({"action": "open", "url": fx.url("/")})).await;
        assert_eq!(v["title"], "T");
        assert_eq!(fx.browser.starts(), starts + 1);
        let pid = fx.browser.pid().await.unwrap();
        fx.ok(json!({"action": "close"})).await;
        assert!(fx.browser.pid().await.is_none());
        let gone =
            crate::common::wait_until(Duration::from_secs(10), || sockets_of_group(pid).is_empty())
                .await;
        assert!(gone, "processes of the browser outlived close");
    });
}

/// Through the gateway: the tool is listed, not offered, until `tool_search` loads it; page
/// text comes back marked untrusted with the gateway's secrets scrubbed; a screenshot is shown
/// to a model that can see, in the same turn, and only its path is stored.
#[tokio::test]
async fn an_agent_finds_the_browser_reads_a_page_and_sees_its_screenshot() {
    use crate::common::{config, listed_tools, messages, tool_names, tool_results, TestGateway};
    use crate::fake_llm::{FakeLlm, Reply};
    if !have_browser() {
        return;
    }
    let server = FX.server;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let gw = TestGateway::start(config(
        &llm,
        dir.path(),
        json!({
            "agents": {"defaults": {"vision": "on", "stream": false}},
            "tools": {"rate_limit": {"per_minute": 0},
                      "browser": {"allow_private": [server.to_string()]}},
        }),
    ))
    .await;
    let call = |id: &str, name: &str, args: Value| {
        Reply::ToolCalls(vec![(id.into(), name.into(), args.to_string())])
    };
    llm.push(call(
        "s1",
        "tool_search",
        json!({"query": "browse a web page"}),
    ));
    llm.push(call(
        "b1",
        "browser",
        json!({"action": "open", "url": format!("http://{server}/secret")}),
    ));
    llm.push(call("b2", "browser", json!({"action": "snapshot"})));
    llm.push(call("b3", "browser", json!({"action": "screenshot"})));
    llm.push(Reply::Text("done".into()));
    let (s, body) = gw.api.chat("br", "what does the page say?").await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["reply"], "done", "{body}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 5);
    assert!(!tool_names(&reqs[0]).contains(&"browser".to_string()));
    assert!(listed_tools(&reqs[0]).contains(&"browser".to_string()));
    assert!(tool_names(&reqs[1]).contains(&"browser".to_string()));
    let results = tool_results(&reqs[3]);
    let snap = &results.iter().find(|(id, _)| id == "b2").unwrap().1;
    let text = snap["untrusted_page_text"].as_str().unwrap();
    assert!(text.contains("the day is sunny"), "{snap}");
    assert!(!text.contains("sk-test-secret-123456"), "{snap}");
    assert!(snap["note"].as_str().unwrap().contains("not instructions"));
    // The screenshot: its path in the result, the picture in a user message after it.
    let last = messages(&reqs[4]);
    let shot = &tool_results(&reqs[4])
        .into_iter()
        .find(|(id, _)| id == "b3")
        .unwrap()
        .1;
    let path = shot["path"].as_str().unwrap();
    assert!(dir.path().join("ws").join(path).exists(), "{shot}");
    let image_msg = last.last().unwrap();
    assert_eq!(image_msg["role"], "user", "{image_msg}");
    let parts = image_msg["content"].as_array().unwrap();
    let url = parts.iter().find(|p| p["type"] == "image_url").unwrap()["image_url"]["url"]
        .as_str()
        .unwrap();
    assert!(
        url.starts_with("data:image/png;base64,iVBORw0KGgo"),
        "{}",
        &url[..40]
    );
    // Nothing but the path was stored: the next turn does not carry the picture.
    llm.push(Reply::Text("ok".into()));
    gw.api.chat("br", "thanks").await;
    let reqs = llm.requests();
    let next = serde_json::to_string(&reqs[5]["messages"]).unwrap();
    assert!(
        !next.contains("data:image/png"),
        "the screenshot was stored"
    );
    gw.stop().await;
}

#[test]
fn each_chat_session_has_its_own_tabs() {
    with_browser(|fx| async move {
        // Two chats of the same agent share its browser, not their tabs: one cannot see,
        // switch to or close the other's pages, and each keeps its current page.
        let other = ToolContext {
            session: SessionKey::parse("t:2").unwrap(),
            ..fx.ctx.clone()
        };
        let as_other = |args: Value| {
            let other = other.clone();
            async move { fx.tool.execute(args, &other).await }
        };
        fx.ok(json!({"action": "close"})).await;
        fx.ok(json!({"action": "open", "url": fx.url("/next")}))
            .await;
        let v = as_other(json!({"action": "tabs"})).await.unwrap();
        assert_eq!(v["tabs"], json!([]), "another chat's tab is listed: {v}");
        let e = as_other(json!({"action": "snapshot"})).await.unwrap_err();
        assert!(e.to_string().contains("open"), "{e}");
        let e = as_other(json!({"action": "tabs", "close": 1}))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("no tab 1"), "{e}");
        as_other(json!({"action": "open", "url": fx.url("/search?q=theirs")}))
            .await
            .unwrap();
        // The first chat still reads its own page, and lists only its tab.
        assert!(fx.snapshot().await.contains("You followed the link."));
        let mine = fx.ok(json!({"action": "tabs"})).await;
        assert_eq!(mine["tabs"].as_array().unwrap().len(), 1, "{mine}");
        assert!(mine.to_string().contains("/next"), "{mine}");
        assert!(!mine.to_string().contains("theirs"), "{mine}");
        let theirs = as_other(json!({"action": "snapshot"})).await.unwrap();
        assert!(
            theirs.to_string().contains("You searched for: theirs"),
            "{theirs}"
        );
        // Each has its own cookies (a browser context per chat session).
        fx.ok(json!({"action": "open", "url": fx.url("/set-cookie?v=mine")}))
            .await;
        as_other(json!({"action": "open", "url": fx.url("/set-cookie?v=theirs")}))
            .await
            .unwrap();
        fx.ok(json!({"action": "open", "url": fx.url("/show-cookie")}))
            .await;
        assert!(fx.snapshot().await.contains("Cookies here: who=mine."));
        as_other(json!({"action": "open", "url": fx.url("/show-cookie")}))
            .await
            .unwrap();
        let theirs = as_other(json!({"action": "snapshot"})).await.unwrap();
        assert!(
            theirs.to_string().contains("Cookies here: who=theirs."),
            "{theirs}"
        );
        // The cap on tabs is per chat session: the other one's tab does not count.
        for _ in 1..4 {
            fx.ok(json!({"action": "open", "url": fx.url("/next"), "new_tab": true}))
                .await;
        }
        let e = fx
            .call(json!({"action": "open", "url": fx.url("/next"), "new_tab": true}))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("max_tabs"), "{e}");
        // Closing is per chat session too: the other one's page stays.
        let pid = fx.browser.pid().await.unwrap();
        fx.ok(json!({"action": "close"})).await;
        assert_eq!(fx.browser.pid().await, Some(pid));
        assert_eq!(fx.ok(json!({"action": "tabs"})).await["tabs"], json!([]));
        let theirs = as_other(json!({"action": "snapshot"})).await.unwrap();
        assert!(theirs.to_string().contains("Cookies here"), "{theirs}");
        as_other(json!({"action": "close"})).await.unwrap();
        assert_eq!(fx.browser.pid().await, None);
        fx.ok(json!({"action": "close"})).await;
    });
}

/// A password the agent types into a page's password field, which the page echoes in its
/// visible text, is in no tool result, nowhere in the store (the stored call included) and
/// not in the gateway's log (debug level): the real `weft` binary, a fake model.
#[tokio::test]
async fn a_typed_password_is_in_no_result_nor_the_store_nor_the_log() {
    use crate::common::{bytes_under, tool_results};
    use crate::fake_llm::{FakeLlm, Reply};
    use crate::process::{free_port, gateway_config, log_of, Daemon};
    const PW: &str = "Hunter2-Correct-Horse-77";
    if !have_browser() {
        return;
    }
    let server = FX.server;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = gateway_config(
        dir.path(),
        &llm,
        port,
        json!({"tools": {"rate_limit": {"per_minute": 0},
                         "browser": {"allow_private": [server.to_string()]}}}),
    );
    let d = Daemon::start_with_env(dir.path(), &cfg, port, &[("RUST_LOG", "debug")]).await;
    let call = |id: &str, name: &str, args: Value| {
        Reply::ToolCalls(vec![(id.into(), name.into(), args.to_string())])
    };
    llm.push(call("s1", "tool_search", json!({"query": "browser"})));
    llm.push(call(
        "b1",
        "browser",
        json!({"action": "open", "url": format!("http://{server}/login")}),
    ));
    llm.push(call("b2", "browser", json!({"action": "snapshot"})));
    llm.push(call(
        "b3",
        "browser",
        json!({"action": "type", "ref": 1, "text": PW}),
    ));
    llm.push(call("b4", "browser", json!({"action": "snapshot"})));
    llm.push(Reply::Text("logged in".into()));
    let (s, body) = d.api.chat("pw", "log me in").await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["reply"], "logged in", "{body}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 6);
    let results = tool_results(&reqs[5]);
    let first = &results.iter().find(|(id, _)| id == "b2").unwrap().1;
    assert!(
        first
            .to_string()
            .contains(r#"[1] password \"Password\" (empty)"#),
        "{first}"
    );
    // The page echoed it: the snapshot shows the echo, without the password.
    let echo = &results.iter().find(|(id, _)| id == "b4").unwrap().1;
    assert!(echo.to_string().contains("You typed ["), "{echo}");
    for (id, r) in &results {
        assert!(!r.to_string().contains(PW), "{id}: {r}");
    }
    // The next turn's history comes from the store: the call is there, masked.
    llm.push(Reply::Text("ok".into()));
    let (s, _) = d.api.chat("pw", "thanks").await;
    assert_eq!(s, 200);
    let next = serde_json::to_string(&llm.requests()[6]["messages"]).unwrap();
    assert!(next.contains("You typed ["), "{next}");
    assert!(!next.contains(PW), "{next}");
    assert_eq!(d.term().code(), Some(0));
    let store = bytes_under(&dir.path().join("store"));
    assert!(
        store.contains("You typed ["),
        "the transcript was not found in the store"
    );
    assert!(!store.contains(PW), "the password is in the store");
    let log = log_of(dir.path());
    assert!(log.contains("browser"), "{log}");
    assert!(!log.contains(PW), "the password is in the log");
}
