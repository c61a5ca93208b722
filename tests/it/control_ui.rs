//! The control UI under `/ui/`: the login link, cookie sessions, CSRF and CSP refusals over
//! plain HTTP, then the pages in a real headless Chromium driven over WebDriver (chat with a
//! streamed reply, an approval asked on another channel, usage, the canvas).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{json, Value};

use crate::fake_llm::{FakeLlm, Reply};
use crate::process::{free_port, gateway_config, weft, Daemon};

const T: Duration = Duration::from_secs(30);

/// `weft --config CFG ARGS` → (success, stdout, stderr).
pub(crate) async fn run(dir: &Path, cfg: &Path, args: &[&str]) -> (bool, String, String) {
    let (dir, cfg) = (dir.to_path_buf(), cfg.to_path_buf());
    let args: Vec<String> = args.iter().map(|a| (*a).to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        weft(&dir)
            .env("RUST_LOG", "warn")
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

/// A login link from `weft dashboard --no-open` (extra args: `--read-only`).
pub(crate) async fn link(dir: &Path, cfg: &Path, extra: &[&str]) -> String {
    let mut args = vec!["dashboard", "--no-open"];
    args.extend_from_slice(extra);
    let (ok, out, err) = run(dir, cfg, &args).await;
    assert!(ok, "{out}\n{err}");
    let url = out.trim().to_string();
    assert!(url.contains("/ui/login#"), "{url}");
    url
}

/// Log `b` in as the operator with a fresh link, and wait until the page says so.
pub(crate) async fn log_in(b: &Browser, dir: &Path, cfg: &Path) {
    let url = link(dir, cfg, &[]).await;
    b.goto(&url).await;
    b.until(
        "return document.getElementById('me') && document.getElementById('me').textContent.includes('operator')",
        "logged in",
    )
    .await;
}

pub(crate) fn plain() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// Exchange the token of `url` as the login page does: (status, cookie value, Set-Cookie).
pub(crate) async fn exchange(base: &str, url: &str, origin: &str) -> (u16, Option<String>, String) {
    let token = url.split_once('#').unwrap().1;
    let r = plain()
        .post(format!("{base}/ui/login"))
        .header("origin", origin)
        .body(json!({ "token": token }).to_string())
        .send()
        .await
        .unwrap();
    let set = r
        .headers()
        .get("set-cookie")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let cookie = set
        .split(';')
        .next()
        .and_then(|kv| kv.strip_prefix("weft_ui="))
        .filter(|v| !v.is_empty())
        .map(str::to_string);
    (r.status().as_u16(), cookie, set)
}

/// A request of the UI API with a cookie, an origin and a CSRF token.
pub(crate) async fn ui_post(
    base: &str,
    path: &str,
    cookie: &str,
    origin: Option<&str>,
    csrf: Option<&str>,
    body: Value,
) -> (u16, Value) {
    let mut rb = plain()
        .post(format!("{base}{path}"))
        .header("cookie", format!("weft_ui={cookie}"))
        .json(&body);
    if let Some(o) = origin {
        rb = rb.header("origin", o);
    }
    if let Some(c) = csrf {
        rb = rb.header("x-csrf-token", c);
    }
    let r = rb.send().await.unwrap();
    let s = r.status().as_u16();
    (s, r.json().await.unwrap_or(Value::Null))
}

pub(crate) async fn ui_get(base: &str, path: &str, cookie: &str) -> (u16, Value) {
    let r = plain()
        .get(format!("{base}{path}"))
        .header("cookie", format!("weft_ui={cookie}"))
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    (s, r.json().await.unwrap_or(Value::Null))
}

pub(crate) fn setup(llm: &FakeLlm, extra: Value) -> (tempfile::TempDir, std::path::PathBuf, u16) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    let port = free_port();
    let cfg = gateway_config(dir.path(), llm, port, extra);
    (dir, cfg, port)
}

/// The login link works once, for a request from this origin; the cookie is HttpOnly and
/// SameSite=Strict; a state change needs this origin and the CSRF token; a forged cookie, a
/// read-only session and a revoked one are refused. Each refusal is checked by its outcome:
/// the model never hears of the refused messages.
#[tokio::test]
async fn login_link_cookie_csrf_and_revocation_refuse_what_they_must() {
    let llm = FakeLlm::start().await;
    let (dir, cfg, port) = setup(
        &llm,
        json!({"channels": {"http": {"ui_hosts": ["gw.example.org"]}}}),
    );
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let base = d.api.base.clone();
    let me = base.clone(); // the origin a browser sends for pages of this server

    // Without a session: the pages load (nothing secret in them), the API does not.
    let r = plain().get(format!("{base}/ui/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // Only for this server's own names: a page of another site whose name was made to
    // resolve here (DNS rebinding) sends its own name, and gets nothing.
    for (host, want) in [
        (format!("evil.example:{port}"), 421),
        (format!("localhost:{port}"), 200),
        ("gw.example.org".to_string(), 200), // listed in channels.http.ui_hosts
    ] {
        for path in ["/ui/", "/ui/login", "/ui/api/me"] {
            let r = plain()
                .get(format!("{base}{path}"))
                .header("host", &host)
                .send()
                .await
                .unwrap();
            let got = r.status().as_u16();
            if want == 421 {
                assert_eq!(got, 421, "{host} {path}");
            } else {
                assert_ne!(got, 421, "{host} {path}");
            }
        }
    }
    let csp = r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("default-src 'none'"),
        "{csp}"
    );
    assert_eq!(r.headers()["x-frame-options"], "DENY");
    let html = r.text().await.unwrap();
    assert!(!html.contains("<script>"), "no inline script: {html}");
    let (s, _) = ui_get(&base, "/ui/api/me", "").await;
    assert_eq!(s, 401);
    // First load of the chat page stays small.
    let mut bytes = html.len();
    for a in ["/ui/app.js", "/ui/app.css"] {
        let r = plain().get(format!("{base}{a}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{a}");
        bytes += r.bytes().await.unwrap().len();
    }
    assert!(bytes < 200 * 1024, "first load {bytes} bytes");

    // A link exchanged from another origin is refused (and stays unused).
    let url = link(dir.path(), &cfg, &[]).await;
    let (s, c, _) = exchange(&base, &url, "http://evil.example").await;
    assert_eq!((s, c), (403, None));
    // From this origin: a cookie, HttpOnly, SameSite=Strict, not Secure over plain HTTP.
    let (s, cookie, set) = exchange(&base, &url, &me).await;
    assert_eq!(s, 200, "{set}");
    let cookie = cookie.unwrap();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    assert!(!set.contains("Secure"), "{set}");
    // The same link again: refused, no second session.
    let (s, c, _) = exchange(&base, &url, &me).await;
    assert_eq!((s, c), (401, None), "a used link must not log in again");

    let (s, v) = ui_get(&base, "/ui/api/me", &cookie).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["role"], "operator");
    let csrf = v["csrf"].as_str().unwrap().to_string();

    // State changes: another origin, no origin, no token, a wrong token are all refused; the
    // model hears nothing of them.
    let msg = json!({"chat": "main", "content": "should not arrive"});
    for (origin, token) in [
        (Some("http://evil.example"), Some(csrf.as_str())),
        (None, Some(csrf.as_str())),
        (Some(me.as_str()), None),
        (Some(me.as_str()), Some("0000")),
    ] {
        let (s, v) = ui_post(&base, "/ui/api/chat", &cookie, origin, token, msg.clone()).await;
        assert_eq!(s, 403, "origin {origin:?} token {token:?}: {v}");
    }
    // A forged cookie is nobody.
    let forged = "ab".repeat(32);
    let (s, _) = ui_get(&base, "/ui/api/me", &forged).await;
    assert_eq!(s, 401);
    let (s, _) = ui_post(
        &base,
        "/ui/api/chat",
        &forged,
        Some(&me),
        Some(&csrf),
        msg.clone(),
    )
    .await;
    assert_eq!(s, 401);
    // The CLI's own commands are not reachable with a cookie.
    let (s, _) = ui_post(
        &base,
        "/ui/api/admin/ui/link",
        &cookie,
        Some(&me),
        Some(&csrf),
        json!({}),
    )
    .await;
    assert_eq!(s, 403);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        llm.requests().is_empty(),
        "a refused message reached the model"
    );

    // The right origin and token: the message goes to the web chat and on to the model.
    llm.push(Reply::Text("web reply".into()));
    let (s, v) = ui_post(
        &base,
        "/ui/api/chat",
        &cookie,
        Some(&me),
        Some(&csrf),
        json!({"chat": "main", "content": "hello from the page"}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    llm.wait_requests(1, T).await;
    let deadline = std::time::Instant::now() + T;
    loop {
        let (s, v) = ui_get(&base, "/ui/api/sessions/web:main", &cookie).await;
        if s == 200 && v.to_string().contains("web reply") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A read-only session reads but changes nothing.
    let ro = link(dir.path(), &cfg, &["--read-only"]).await;
    let (_, ro_cookie, _) = exchange(&base, &ro, &me).await;
    let ro_cookie = ro_cookie.unwrap();
    let (_, v) = ui_get(&base, "/ui/api/me", &ro_cookie).await;
    assert_eq!(v["role"], "read-only");
    let ro_csrf = v["csrf"].as_str().unwrap().to_string();
    let (s, _) = ui_post(
        &base,
        "/ui/api/admin/approvals/list",
        &ro_cookie,
        Some(&me),
        Some(&ro_csrf),
        json!({}),
    )
    .await;
    assert_eq!(s, 200);
    let (s, _) = ui_post(
        &base,
        "/ui/api/chat",
        &ro_cookie,
        Some(&me),
        Some(&ro_csrf),
        msg.clone(),
    )
    .await;
    assert_eq!(s, 403);

    // Revoked: every session ends.
    let (ok, out, err) = run(dir.path(), &cfg, &["dashboard", "--revoke-all"]).await;
    assert!(ok, "{out}{err}");
    assert!(out.contains("ended 2"), "{out}");
    for c in [&cookie, &ro_cookie] {
        let (s, _) = ui_get(&base, "/ui/api/me", c).await;
        assert_eq!(s, 401);
    }
    assert_eq!(llm.requests().len(), 1);
    d.term();
}

// ---- WebDriver ----

/// A chromedriver for this test binary, started once and shared; it ends with the binary (it
/// runs under a shell that kills it when our end of its stdin closes).
pub(crate) struct Driver {
    base: String,
    _child: Child,
}

static DRIVER: OnceLock<Option<Driver>> = OnceLock::new();

pub(crate) fn driver() -> Option<&'static Driver> {
    DRIVER
        .get_or_init(|| {
            let have = |c: &str| Path::new(c).exists();
            if !have("/usr/bin/chromedriver") || !have("/usr/bin/chromium") {
                assert!(
                    std::env::var("CI").is_err(),
                    "chromium and chromium-driver are needed for the control UI tests (apt-get install chromium chromium-driver)"
                );
                eprintln!("skipped: /usr/bin/chromium or /usr/bin/chromedriver is missing");
                return None;
            }
            let port = free_port();
            let child = Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "/usr/bin/chromedriver --port={port} >/dev/null 2>&1 & p=$!; read _; kill $p"
                ))
                .stdin(Stdio::piped())
                .spawn()
                .unwrap();
            let base = format!("http://127.0.0.1:{port}");
            let deadline = std::time::Instant::now() + T;
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(std::time::Instant::now() < deadline, "chromedriver did not start");
                std::thread::sleep(Duration::from_millis(50));
            }
            Some(Driver {
                base,
                _child: child,
            })
        })
        .as_ref()
}

/// One browser session (a fresh profile).
pub(crate) struct Browser {
    http: reqwest::Client,
    url: String,
    _profile: tempfile::TempDir,
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Browser {
    pub(crate) async fn start(d: &Driver) -> Self {
        let http = plain();
        let profile = tempfile::tempdir().unwrap();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--window-size=420,900",
                    format!("--user-data-dir={}", profile.path().display())],
            },
        }}});
        let v: Value = http
            .post(format!("{}/session", d.base))
            .json(&caps)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {v}"));
        Self {
            url: format!("{}/session/{id}", d.base),
            http,
            _profile: profile,
        }
    }

    async fn cmd(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut rb = self.http.request(method, format!("{}{path}", self.url));
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let v: Value = rb.send().await.unwrap().json().await.unwrap();
        v["value"].clone()
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.cmd(reqwest::Method::POST, path, Some(body)).await
    }

    /// Resize the browser's window (CSS pixels; headless: the viewport too).
    pub(crate) async fn resize(&self, width: u32, height: u32) {
        let v = self
            .post("/window/rect", json!({"width": width, "height": height}))
            .await;
        assert!(v["width"].is_number(), "resize: {v}");
    }

    /// A PNG of the viewport.
    pub(crate) async fn screenshot(&self) -> Vec<u8> {
        use base64::Engine as _;
        let v = self.cmd(reqwest::Method::GET, "/screenshot", None).await;
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_else(|| panic!("screenshot: {v}")))
            .unwrap()
    }

    /// Emulate the system's colour scheme (`light` or `dark`) through Chromium's DevTools.
    pub(crate) async fn color_scheme(&self, scheme: &str) {
        let v = self
            .post(
                "/goog/cdp/execute",
                json!({"cmd": "Emulation.setEmulatedMedia",
                       "params": {"features": [{"name": "prefers-color-scheme", "value": scheme}]}}),
            )
            .await;
        assert!(v.is_object(), "emulate {scheme}: {v}");
    }

    pub(crate) async fn goto(&self, url: &str) {
        let v = self.post("/url", json!({ "url": url })).await;
        assert!(v.is_null(), "{v}");
    }

    /// Run `script` (a function body; `arguments` as in WebDriver) in the page.
    pub(crate) async fn js(&self, script: &str, args: Value) -> Value {
        self.post("/execute/sync", json!({"script": script, "args": args}))
            .await
    }

    /// Run `script` (a function body whose last argument is the callback) in the page and wait
    /// for what it passes to the callback.
    pub(crate) async fn js_async(&self, script: &str) -> Value {
        self.post("/execute/async", json!({"script": script, "args": []}))
            .await
    }

    /// The element matching `css`, waiting for it.
    pub(crate) async fn find(&self, css: &str) -> String {
        let deadline = std::time::Instant::now() + T;
        loop {
            let v = self
                .post("/element", json!({"using": "css selector", "value": css}))
                .await;
            if let Some(id) = v[ELEMENT].as_str() {
                return id.to_string();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no element {css}: {v}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) async fn click(&self, css: &str) {
        let e = self.find(css).await;
        let v = self.post(&format!("/element/{e}/click"), json!({})).await;
        assert!(v.is_null(), "click {css}: {v}");
    }

    pub(crate) async fn type_in(&self, css: &str, text: &str) {
        let e = self.find(css).await;
        let v = self
            .post(&format!("/element/{e}/value"), json!({ "text": text }))
            .await;
        assert!(v.is_null(), "type in {css}: {v}");
    }

    /// Wait until `script` returns something truthy; return it.
    pub(crate) async fn until(&self, script: &str, what: &str) -> Value {
        let deadline = std::time::Instant::now() + T;
        loop {
            let v = self.js(script, json!([])).await;
            if !(v.is_null() || v == json!(false) || v == json!("")) {
                return v;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out: {what} (last {v})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Browser {
    /// End the browser session (and its Chromium) even when the test failed: a blocking
    /// `DELETE /session/ID` on a plain socket.
    fn drop(&mut self) {
        use std::io::{Read as _, Write as _};
        let Some(rest) = self.url.strip_prefix("http://") else {
            return;
        };
        let Some((host, path)) = rest.split_once('/') else {
            return;
        };
        if let Ok(mut s) = std::net::TcpStream::connect(host) {
            let _ = s.set_read_timeout(Some(T));
            let _ = write!(
                s,
                "DELETE /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            // The answer comes once the browser has quit (the driver keeps the socket open).
            let _ = s.read(&mut [0u8; 512]);
        }
    }
}

/// Another origin on 127.0.0.1: a server answering every request with a bare page.
async fn evil_site() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let _ = s.read(&mut [0u8; 4096]).await;
                let body = "<!doctype html><title>elsewhere</title><p>another site</p>";
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    addr
}

fn numbers_as_f64(v: &Value) -> Value {
    match v {
        Value::Number(n) => json!(n.as_f64().unwrap()),
        Value::Array(a) => Value::Array(a.iter().map(numbers_as_f64).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), numbers_as_f64(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn exec_call(id: &str, command: &str) -> Reply {
    Reply::ToolCalls(vec![(
        id.into(),
        "exec_shell".into(),
        json!({ "command": command }).to_string(),
    )])
}

/// In a real browser: log in with the link, chat and see the streamed reply, approve an
/// `exec_shell` asked on the HTTP API and see it run, see the usage `weft usage --json` prints.
#[tokio::test]
async fn in_a_browser_login_chat_approve_and_usage() {
    let Some(drv) = driver() else { return };
    let llm = FakeLlm::start().await;
    let (dir, cfg, port) = setup(
        &llm,
        json!({"tools": {"exec": {"mode": "ask", "approval_timeout_secs": 60}}}),
    );
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let b = Browser::start(drv).await;

    // Log in: the page trades the link for a cookie and lands on the chat.
    log_in(&b, dir.path(), &cfg).await;
    let here = b
        .js("return location.pathname + location.hash", json!([]))
        .await;
    assert!(here.as_str().unwrap().starts_with("/ui/"), "{here}");
    // The cookie is out of the page's reach.
    let cookies = b.js("return document.cookie", json!([])).await;
    assert_eq!(cookies, json!(""));
    b.until(
        "return document.body.dataset.live === 'yes'",
        "event stream open",
    )
    .await;

    // A page of another origin on this host (same site: the browser sends the cookie) posting
    // to the API with the browser's credentials: refused, and the model hears nothing.
    let evil = evil_site().await;
    b.goto(&format!("http://{evil}/")).await;
    let status = b
        .post(
            "/execute/async",
            json!({"script": format!(
                "const done = arguments[arguments.length - 1];
                 fetch('http://127.0.0.1:{port}/ui/api/chat', {{method: 'POST', credentials: 'include', mode: 'no-cors',
                   headers: {{'Content-Type': 'text/plain'}}, body: JSON.stringify({{chat: 'main', content: 'cross-site'}})}})
                   .then(() => done('sent'), (e) => done('error ' + e));"
            ), "args": []}),
        )
        .await;
    assert_eq!(status, "sent");
    b.goto(&format!("http://127.0.0.1:{port}/ui/#chat")).await;
    b.until(
        "return document.body.dataset.live === 'yes'",
        "event stream open",
    )
    .await;
    assert!(
        llm.requests().is_empty(),
        "a cross-site post reached the model"
    );

    // Chat: the streamed reply shows up.
    llm.push(Reply::Text("Hello from the model, streamed.".into()));
    b.js(
        "window.deltas = 0; new MutationObserver(() => { if (document.querySelector('#chat-log li.streaming')) window.deltas++; })
           .observe(document.getElementById('chat-log'), {childList: true, subtree: true, characterData: true});",
        json!([]),
    )
    .await;
    b.type_in("#chat-input", "hi there").await;
    b.click("#chat-form button[type=submit]").await;
    let reply = b
        .until(
            "const l = document.querySelector('#chat-log li.agent:not(.streaming)'); return l && l.textContent",
            "reply in the chat",
        )
        .await;
    assert_eq!(reply, "Hello from the model, streamed.");
    let deltas = b.js("return window.deltas", json!([])).await;
    assert!(
        deltas.as_u64().unwrap() > 0,
        "no delta was shown before the reply"
    );
    let req = llm.requests();
    assert_eq!(crate::common::last_user(&req[0]), "hi there");

    // An approval asked on another channel (HTTP API) is answered from the approvals page.
    llm.push(exec_call("c1", "echo yes > approved.txt"));
    llm.push(Reply::Text("ran it".into()));
    let api = d.api.clone();
    let asker = tokio::spawn(async move {
        api.http
            .post(format!("{}/v1/chat", api.base))
            .json(&json!({"chat_id": "asker", "content": "make the file"}))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    });
    b.goto(&format!("http://127.0.0.1:{port}/ui/#approvals"))
        .await;
    b.until(
        "const r = document.querySelector('#approvals-rows tr'); return r && r.textContent.includes('approved.txt') && r.textContent.includes('http:asker')",
        "the pending approval listed",
    )
    .await;
    b.click("#approvals-rows button[data-decision=approve]")
        .await;
    let v = tokio::time::timeout(T, asker).await.unwrap().unwrap();
    assert_eq!(v["reply"], "ran it", "{v}");
    assert!(dir.path().join("ws/approved.txt").exists());

    // Usage: the page's figures are `weft usage --json`'s.
    b.goto(&format!("http://127.0.0.1:{port}/ui/#usage")).await;
    let shown = b
        .until(
            "return document.getElementById('usage-json').textContent",
            "usage shown",
        )
        .await;
    let shown: Value = serde_json::from_str(shown.as_str().unwrap()).unwrap();
    let (ok, out, err) = run(dir.path(), &cfg, &["usage", "--json"]).await;
    assert!(ok, "{err}");
    let cli: Value = serde_json::from_str(&out).unwrap();
    // (JavaScript writes 0.0 as 0: numbers are compared as numbers.)
    assert_eq!(numbers_as_f64(&shown), numbers_as_f64(&cli));
    assert!(cli["total"]["calls"].as_u64().unwrap() >= 3, "{cli}");

    // Automations, channels and MCP: the tables load from the admin handles.
    b.goto(&format!("http://127.0.0.1:{port}/ui/#ops")).await;
    b.until(
        "return document.querySelector('#cron-table thead th') && document.querySelector('#mcp-table thead th') && document.getElementById('notice').hidden",
        "the operations page loaded",
    )
    .await;
    // Channels: each running channel with its state (`weft status`).
    b.until(
        "return [...document.querySelectorAll('#channels-table tbody tr')].some(r => r.textContent.startsWith('http'))",
        "the channels' health listed",
    )
    .await;
    // Nodes: a pairing request shows with its fingerprint; approving it here brings the node
    // online, and the node pins the gateway key the page shows.
    let node_dir = dir.path().join("node-desk");
    let _node = crate::nodes::start_node(
        &node_dir,
        &llm.base_url(),
        &format!("ws://127.0.0.1:{port}"),
        "desk-ui",
    );
    b.until(
        "const r = document.querySelector('#nodes-table tbody tr'); return r && r.textContent.includes('desk-ui') && r.textContent.includes('pending') && r.textContent.includes('SHA256:')",
        "the node's pairing request listed",
    )
    .await;
    b.click("#nodes-table tbody tr button").await;
    b.until(
        "const r = document.querySelector('#nodes-table tbody tr'); return r && r.textContent.includes('approved') && r.textContent.includes('online')",
        "the approved node online",
    )
    .await;
    let shown = b
        .js(
            "return document.getElementById('gateway-key').textContent",
            json!([]),
        )
        .await;
    let pin = std::fs::read_to_string(node_dir.join(".clawft/node/gateway.pin")).unwrap();
    assert!(
        shown.as_str().unwrap().ends_with(pin.trim()),
        "{shown} vs {pin}"
    );

    // Logs: the gateway's recent log, live, with a level filter.
    b.goto(&format!("http://127.0.0.1:{port}/ui/#logs")).await;
    b.until(
        "return document.getElementById('log-lines').textContent.includes('node connected')",
        "the log shows the node's connection",
    )
    .await;
    b.js(
        "const s = document.getElementById('log-level'); s.value = 'warn'; s.dispatchEvent(new Event('change'));",
        json!([]),
    )
    .await;
    let warn = b
        .until(
            "const t = document.getElementById('log-lines').textContent; return t.includes('node refused') && !t.includes('node connected') && t",
            "only warnings after the filter",
        )
        .await;
    assert!(!warn.as_str().unwrap().contains(" INFO "), "{warn}");

    // The canvas: the model presents a page; it shows next to the chat, and its script can
    // reach neither the page around it, nor the cookie, nor the API.
    llm.push(Reply::ToolCalls(vec![(
        "s1".into(),
        "tool_search".into(),
        json!({"query": "canvas"}).to_string(),
    )]));
    llm.push(Reply::ToolCalls(vec![(
        "v1".into(),
        "canvas".into(),
        json!({"action": "present", "title": "Plan", "html": CANVAS_PAGE}).to_string(),
    )]));
    llm.push(Reply::Text("presented".into()));
    b.goto(&format!("http://127.0.0.1:{port}/ui/#chat")).await;
    b.until(
        "return document.body.dataset.live === 'yes'",
        "event stream open",
    )
    .await;
    b.type_in("#chat-input", "show me the plan").await;
    b.click("#chat-form button[type=submit]").await;
    b.until(
        "return [...document.querySelectorAll('#chat-log li.agent')].some(l => l.textContent === 'presented')",
        "reply after the canvas",
    )
    .await;
    let frame = b.find("#canvas").await;
    assert_eq!(
        b.js(
            "return document.getElementById('canvas').getAttribute('sandbox')",
            json!([])
        )
        .await,
        "allow-scripts"
    );
    let v = b.post("/frame", json!({"id": {ELEMENT: frame}})).await;
    assert!(v.is_null(), "{v}");
    let out = b
        .until(
            "const o = document.getElementById('out'); return o && o.textContent !== 'pending' && o.textContent",
            "the canvas script ran",
        )
        .await;
    let title = b
        .js("return document.querySelector('h1').textContent", json!([]))
        .await;
    assert_eq!(title, "Canvas works");
    assert_eq!(out, "parent:blocked cookie:blocked api:blocked");
    b.post("/frame/parent", json!({})).await;

    // Live: the model updates the canvas; the frame shows the new page at once, pushed over
    // the event stream, without the page around it reloading (a mark set in it survives) and
    // before the turn's reply.
    b.js("window.stayed = 'yes';", json!([])).await;
    llm.push(Reply::ToolCalls(vec![(
        "s2".into(),
        "tool_search".into(),
        json!({"query": "canvas"}).to_string(),
    )]));
    llm.push(Reply::ToolCalls(vec![(
        "v2".into(),
        "canvas".into(),
        json!({"action": "update", "html": "<h1>Updated live</h1>"}).to_string(),
    )]));
    // The reply after the update comes late: the frame must change before it.
    llm.push(Reply::Delay(
        Duration::from_secs(8),
        Box::new(Reply::Text("updated".into())),
    ));
    b.type_in("#chat-input", "change it").await;
    b.click("#chat-form button[type=submit]").await;
    b.until(
        "return document.getElementById('canvas-state').textContent.includes('version 2')",
        "the canvas event reached the page",
    )
    .await;
    let frame = b.find("#canvas").await;
    b.post("/frame", json!({"id": {ELEMENT: frame}})).await;
    b.until(
        "const h = document.querySelector('h1'); return h && h.textContent === 'Updated live'",
        "the frame shows the update",
    )
    .await;
    b.post("/frame/parent", json!({})).await;
    let replied = b
        .js(
            "return [...document.querySelectorAll('#chat-log li.agent')].some(l => l.textContent === 'updated')",
            json!([]),
        )
        .await;
    assert_eq!(replied, false, "the frame changed only after the reply");
    assert_eq!(b.js("return window.stayed", json!([])).await, "yes");
    b.until(
        "return [...document.querySelectorAll('#chat-log li.agent')].some(l => l.textContent === 'updated')",
        "the reply after the update",
    )
    .await;
    drop(b);

    // The canvas is kept per session across a restart.
    d.term();
    let d = Daemon::start(dir.path(), &cfg, port).await;
    let page = d.api.text("/ui/canvas/web:main").await;
    assert!(page.contains("Updated live"), "{page}");
    let (s, v) = d.api.get("/v1/status").await;
    assert_eq!(s, 200, "{v}");
    d.term();
}

/// A page whose script reaches for what a canvas must never reach, and writes what it got.
const CANVAS_PAGE: &str = r#"<h1>Canvas works</h1><p id="out">pending</p>
<script>
const r = [];
try { r.push('parent:' + parent.document.title); } catch (e) { r.push('parent:blocked'); }
try { r.push('cookie:' + (document.cookie || 'none')); } catch (e) { r.push('cookie:blocked'); }
fetch('/ui/api/me').then((x) => r.push('api:' + x.status)).catch(() => r.push('api:blocked'))
  .finally(() => { document.getElementById('out').textContent = r.join(' '); });
</script>"#;
