//! A build without the `ui` cargo feature: no `/ui/` routes, no web chat, and
//! `weft dashboard` says this build has no control UI. (Run with the features wanted but
//! `ui`, e.g. `cargo test --test it --no-default-features --features telegram,browser -- no_ui::`.)

use serde_json::json;

use crate::fake_llm::FakeLlm;
use crate::process::{free_port, gateway_config, weft, Daemon};

#[tokio::test]
async fn without_the_ui_feature_there_is_no_ui_and_dashboard_says_so() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ws")).unwrap();
    let llm = FakeLlm::start().await;
    let port = free_port();
    let cfg = gateway_config(dir.path(), &llm, port, json!({}));
    let d = Daemon::start(dir.path(), &cfg, port).await;
    for path in ["/ui/", "/ui/app.js", "/ui/login"] {
        let r = d
            .api
            .http
            .get(format!("{}{path}", d.api.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{path}");
        let body = r.text().await.unwrap();
        assert!(body.contains("no control UI"), "{body}");
    }
    let (s, v) = d.api.get("/v1/status").await;
    assert_eq!(s, 200, "{v}");
    let states = v["channel_states"].to_string();
    assert!(!states.contains("\"web\""), "{states}");
    let r = d
        .api
        .http
        .post(format!("{}/v1/admin/ui/link", d.api.base))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let body = r.text().await.unwrap();
    assert!(body.contains("no control UI"), "{body}");
    let out = weft(dir.path())
        .arg("--config")
        .arg(&cfg)
        .args(["dashboard", "--no-open"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("this build of weft has no control UI"),
        "{err}"
    );
    d.term();
}
