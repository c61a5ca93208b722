#![allow(clippy::unwrap_used)]
use super::*;

#[test]
fn only_web_urls_are_opened() {
    assert!(check_url("https://example.com/a").is_ok());
    assert_eq!(check_url("example.com").unwrap(), "https://example.com/");
    assert_eq!(
        check_url("localhost:8080/a").unwrap(),
        "https://localhost:8080/a"
    );
    for bad in [
        "file:///etc/passwd",
        "chrome://settings",
        "devtools://devtools/bundled/inspector.html",
        "view-source:https://example.com",
        "javascript:alert(1)",
        "data:text/html,<b>x</b>",
        "FILE:///etc/passwd",
        "file:/etc/passwd",
        "mailto:a@example.com",
        "chrome:settings",
    ] {
        assert!(
            matches!(check_url(bad), Err(BrowserError::Refused(_))),
            "{bad}"
        );
    }
    assert!(allowed_shown("about:blank"));
    assert!(!allowed_shown("chrome-error://chromewebdata/"));
    assert!(!allowed_shown("file:///etc/passwd"));
}

#[test]
fn every_request_goes_through_the_proxy() {
    let a = chromium_args(Path::new("/p"), "127.0.0.1:4000", false);
    assert!(a.contains(&"--proxy-server=http://127.0.0.1:4000".to_string()));
    assert!(a.contains(&"--proxy-bypass-list=<-loopback>".to_string()));
    assert!(a.contains(&"--remote-debugging-pipe".to_string()));
    assert!(!a.iter().any(|x| x.starts_with("--remote-debugging-port")));
    assert!(!a.contains(&"--no-sandbox".to_string()));
}
