#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixStream};

use super::*;
use crate::net::ssrf::Cidr;

/// A TCP listener on 127.0.0.1 that counts the connections it accepts, reads one request head
/// (or anything) and answers with a fixed response that echoes what it read.
struct Canary {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    seen: Arc<std::sync::Mutex<Vec<u8>>>,
}

async fn canary() -> Canary {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (a, s) = (accepted.clone(), seen.clone());
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            a.fetch_add(1, Ordering::SeqCst);
            let s = s.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                s.lock().unwrap().extend_from_slice(&got);
                let body = b"hello from the canary";
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
                let _ = sock.write_all(body).await;
            });
        }
    });
    Canary {
        addr,
        accepted,
        seen,
    }
}

fn loopback_allowed() -> ProxyPolicy {
    ProxyPolicy {
        ssrf: SsrfPolicy::new(vec!["127.0.0.0/8".parse::<Cidr>().unwrap()]),
        allow_domains: Vec::new(),
        ..ProxyPolicy::default()
    }
}

/// Send `request` through the proxy at `path` and return everything it answers until close.
async fn through(path: &Path, request: &str) -> String {
    let mut s = UnixStream::connect(path).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("the proxy answered and closed")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

fn proxy(policy: ProxyPolicy) -> (tempfile::TempDir, EgressProxy) {
    let dir = tempfile::tempdir().unwrap();
    let p = EgressProxy::start(&dir.path().join("egress.sock"), policy).unwrap();
    (dir, p)
}

#[tokio::test]
async fn loopback_and_private_targets_are_refused_in_every_spelling_without_a_connection() {
    let c = canary().await;
    let (_d, p) = proxy(ProxyPolicy::default());
    let port = c.addr.port();
    for target in [
        format!("127.0.0.1:{port}"),
        format!("2130706433:{port}"),
        format!("0x7f.1:{port}"),
        format!("127.1:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
        format!("[::1]:{port}"),
        format!("localhost:{port}"),
        format!("foo.localhost:{port}"),
    ] {
        let answer = through(
            p.path(),
            &format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{target}: {answer}");
        assert!(
            answer.contains("allow_private"),
            "{target}: the refusal says what opens it: {answer}"
        );
        let answer = through(
            p.path(),
            &format!("GET http://{target}/x HTTP/1.1\r\nHost: {target}\r\n\r\n"),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{target}: {answer}");
    }
    for target in [
        "169.254.169.254:80",
        "metadata.google.internal:80",
        "10.0.0.1:22",
        "100.64.0.1:80",
        "[fd00::1]:80",
    ] {
        let answer = through(p.path(), &format!("CONNECT {target} HTTP/1.1\r\n\r\n")).await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{target}: {answer}");
    }
    assert_eq!(
        c.accepted.load(Ordering::SeqCst),
        0,
        "the canary counted a connection"
    );
}

#[tokio::test]
async fn an_allowed_target_is_tunnelled_by_connect() {
    let c = canary().await;
    let (_d, p) = proxy(loopback_allowed());
    let mut s = UnixStream::connect(p.path()).await.unwrap();
    s.write_all(
        format!(
            "CONNECT 127.0.0.1:{} HTTP/1.1\r\nHost: x\r\n\r\n",
            c.addr.port()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = vec![0u8; 39];
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"HTTP/1.1 200 Connection established\r\n\r\n");
    s.write_all(b"PING / HTTP/1.1\r\n\r\n").await.unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await.unwrap();
    assert!(String::from_utf8_lossy(&rest).ends_with("hello from the canary"));
    assert_eq!(c.accepted.load(Ordering::SeqCst), 1);
    assert!(c.seen.lock().unwrap().starts_with(b"PING / HTTP/1.1"));
}

#[tokio::test]
async fn plain_http_is_rewritten_to_origin_form_with_connection_close() {
    let c = canary().await;
    let (_d, p) = proxy(loopback_allowed());
    let port = c.addr.port();
    let answer = through(
        p.path(),
        &format!("GET http://127.0.0.1:{port}/a/b?q=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic eDp5\r\nUser-Agent: curl\r\n\r\n"),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(answer.ends_with("hello from the canary"));
    let seen = String::from_utf8(c.seen.lock().unwrap().clone()).unwrap();
    assert!(seen.starts_with("GET /a/b?q=1 HTTP/1.1\r\n"), "{seen}");
    assert!(seen.contains("User-Agent: curl\r\n"));
    assert!(seen.contains("Connection: close\r\n"));
    assert!(!seen.to_ascii_lowercase().contains("proxy-"), "{seen}");
}

#[tokio::test]
async fn the_domain_allowlist_admits_its_names_and_subdomains_only() {
    let c = canary().await;
    let port = c.addr.port();
    let mut policy = loopback_allowed();
    policy.allow_domains = vec!["localhost".into()];
    let (_d, p) = proxy(policy);
    let ok = through(
        p.path(),
        &format!("GET http://api.localhost:{port}/ HTTP/1.1\r\n\r\n"),
    )
    .await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    let refused = through(
        p.path(),
        &format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n"),
    )
    .await;
    assert!(
        refused.starts_with("HTTP/1.1 403") && refused.contains("allow_domains"),
        "{refused}"
    );
    assert_eq!(c.accepted.load(Ordering::SeqCst), 1);

    let mut policy = loopback_allowed();
    policy.allow_domains = vec!["example.org".into()];
    let (_d2, p2) = proxy(policy);
    let refused = through(
        p2.path(),
        &format!("CONNECT localhost:{port} HTTP/1.1\r\n\r\n"),
    )
    .await;
    assert!(
        refused.starts_with("HTTP/1.1 403")
            && refused.contains("localhost is not in tools.exec.allow_domains"),
        "{refused}"
    );
    let refused = through(
        p2.path(),
        &format!("CONNECT notexample.org:{port} HTTP/1.1\r\n\r\n"),
    )
    .await;
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    assert_eq!(c.accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn malformed_requests_get_a_clear_400() {
    let (_d, p) = proxy(ProxyPolicy::default());
    for (req, says) in [
        ("GET /relative HTTP/1.1\r\n\r\n", "absolute http:// URL"),
        ("GET https://example.org/ HTTP/1.1\r\n\r\n", "CONNECT"),
        ("CONNECT example.org HTTP/1.1\r\n\r\n", "no port"),
        ("NONSENSE\r\n\r\n", "malformed request line"),
        (
            "GET http://x/ HTTP/1.1\r\nbroken header\r\n\r\n",
            "malformed header",
        ),
    ] {
        let answer = through(p.path(), req).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{req:?}: {answer}");
        assert!(answer.contains(says), "{req:?}: {answer}");
    }
    let mut s = UnixStream::connect(p.path()).await.unwrap();
    let big = format!("GET http://x/ HTTP/1.1\r\nX: {}\r\n", "a".repeat(70 * 1024));
    let _ = s.write_all(big.as_bytes()).await;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 431"));
}

#[tokio::test]
async fn the_socket_is_private_and_removed_when_the_proxy_stops() {
    use std::os::unix::fs::PermissionsExt;
    let (d, p) = proxy(ProxyPolicy::default());
    let path = p.path().to_path_buf();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    drop(p);
    assert!(!path.exists());
    // A stale socket file from a killed daemon is replaced.
    std::fs::write(d.path().join("egress.sock"), b"stale").unwrap();
    let p = EgressProxy::start(&d.path().join("egress.sock"), ProxyPolicy::default()).unwrap();
    assert!(UnixStream::connect(p.path()).await.is_ok());
}

#[tokio::test]
async fn a_private_proxy_lives_in_its_own_0700_directory_removed_on_drop() {
    use std::os::unix::fs::PermissionsExt;
    let base = tempfile::tempdir().unwrap();
    let p = EgressProxy::start_private(base.path(), ProxyPolicy::default()).unwrap();
    let dir = p.path().parent().unwrap().to_path_buf();
    assert!(dir.starts_with(base.path()));
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert!(UnixStream::connect(p.path()).await.is_ok());
    drop(p);
    assert!(!dir.exists());
}

/// The loopback-TCP mode (the browser's proxy): an allowed endpoint is exactly one port of one
/// address; the same address's other ports, names for it and the rest of loopback stay refused,
/// and refusals name the browser's settings.
#[tokio::test]
async fn an_allowed_endpoint_opens_one_port_only() {
    let allowed = canary().await;
    let other = canary().await;
    let proxy = EgressProxy::start_tcp(ProxyPolicy {
        allow_endpoints: vec![allowed.addr],
        settings: "tools.browser",
        ..ProxyPolicy::default()
    })
    .await
    .unwrap();
    assert!(proxy.addr().ip().is_loopback());
    let paddr = proxy.addr();
    let through = |req: String| async move {
        let mut s = tokio::net::TcpStream::connect(paddr).await.unwrap();
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
            .await
            .unwrap()
            .unwrap();
        String::from_utf8_lossy(&out).into_owned()
    };
    let ok = through(format!(
        "GET http://{}/x HTTP/1.1\r\nHost: a\r\n\r\n",
        allowed.addr
    ))
    .await;
    assert!(ok.ends_with("hello from the canary"), "{ok}");
    let port = other.addr.port();
    for target in [
        format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: a\r\n\r\n"),
        format!("GET http://localhost:{port}/ HTTP/1.1\r\nHost: a\r\n\r\n"),
        format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n"),
        format!(
            "GET http://localhost:{}/ HTTP/1.1\r\nHost: a\r\n\r\n",
            allowed.addr.port()
        ),
    ] {
        let out = through(target.clone()).await;
        assert!(out.starts_with("HTTP/1.1 403"), "{target}: {out}");
        assert!(out.contains("tools.browser.allow_private"), "{out}");
    }
    assert_eq!(other.accepted.load(Ordering::SeqCst), 0);
    assert_eq!(allowed.accepted.load(Ordering::SeqCst), 1);
}
