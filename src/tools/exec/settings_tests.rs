//! `tools.exec` settings tests: defaults and the key named by each rejected value.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::tools::shell_policy::{ExecMode, DEFAULT_DENY_PATTERNS};

#[test]
fn config_resolves_defaults_and_names_bad_keys() {
    let d = ExecFile::default().resolve().unwrap();
    assert_eq!(d.mode, ExecMode::Denylist);
    assert_eq!(d.timeout, Duration::from_secs(30));
    assert_eq!(d.spawn_timeout, Duration::from_secs(60));
    assert_eq!(d.max_timeout, Duration::from_secs(300));
    assert_eq!(d.max_output_bytes, 1 << 20);
    assert_eq!(d.max_concurrent_spawns, 5);
    assert_eq!(d.approval_timeout, Duration::from_secs(120));
    assert!(d.sandbox && !d.require_sandbox);
    assert_eq!(d.network, NetworkMode::Proxy);
    assert_eq!((d.max_processes, d.max_memory_mb), (512, 1024));
    assert!(d.allow_domains.is_empty() && d.allow_private.is_empty());
    assert_eq!(d.deny_patterns.len(), DEFAULT_DENY_PATTERNS.len());

    let f: ExecFile = serde_json::from_value(json!({
        "mode": "ask",
        "deny_patterns": ["foo"],
        "extra_deny_patterns": ["bar *baz"],
        "allow_commands": ["ls"],
        "network": false,
        "read_paths": ["/srv/data"],
        "env_passthrough": ["RUST_LOG"],
        "max_output_bytes": 4096
    }))
    .unwrap();
    let s = f.resolve().unwrap();
    assert_eq!(s.mode, ExecMode::Ask);
    assert_eq!(s.deny_patterns, ["foo", "bar *baz"]);
    assert_eq!(s.network, NetworkMode::Off);
    assert_eq!(s.max_output_bytes, 4096);

    assert!(serde_json::from_value::<ExecFile>(json!({"modee": "x"})).is_err());
    for (f, key) in [
        (json!({"mode": "yolo"}), "`mode`"),
        (json!({"mode": "allowlist"}), "`allow_commands`"),
        (json!({"allow_commands": ["ls -la"]}), "`allow_commands`"),
        (json!({"timeout_secs": 0}), "`timeout_secs`"),
        (json!({"timeout_secs": 400}), "`timeout_secs`"),
        (json!({"max_timeout_secs": 10}), "`timeout_secs`"),
        (json!({"read_paths": ["relative/dir"]}), "`read_paths`"),
        (json!({"write_paths": ["/a/../etc"]}), "`write_paths`"),
        (
            json!({"env_passthrough": ["GITHUB_TOKEN"]}),
            "`env_passthrough`",
        ),
        (
            json!({"env_passthrough": ["LD_PRELOAD"]}),
            "`env_passthrough`",
        ),
        (json!({"max_output_bytes": 0}), "`max_output_bytes`"),
        (
            json!({"max_concurrent_spawns": 0}),
            "`max_concurrent_spawns`",
        ),
        (json!({"deny_patterns": [" * "]}), "`deny_patterns`"),
        (json!({"network": "yes please"}), "`network`"),
        (json!({"max_processes": 3}), "`max_processes`"),
        (json!({"max_memory_mb": 1}), "`max_memory_mb`"),
        (
            json!({"allow_domains": ["https://pypi.org/"]}),
            "`allow_domains`",
        ),
        (json!({"allow_private": ["10.0.0.0/33"]}), "`allow_private`"),
    ] {
        let e = serde_json::from_value::<ExecFile>(f.clone())
            .unwrap()
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(e.contains(key), "{f}: {e}");
    }
    // The mode by name, the booleans of earlier versions, the limits and the proxy's lists.
    for (v, mode) in [
        (json!("proxy"), NetworkMode::Proxy),
        (json!("off"), NetworkMode::Off),
        (json!("direct"), NetworkMode::Direct),
        (json!(true), NetworkMode::Proxy),
        (json!(false), NetworkMode::Off),
    ] {
        let f: ExecFile = serde_json::from_value(json!({ "network": v })).unwrap();
        assert_eq!(f.resolve().unwrap().network, mode, "{v}");
    }
    let f: ExecFile = serde_json::from_value(json!({
        "max_processes": 0,
        "max_memory_mb": 0,
        "allow_domains": ["PyPI.org", "*.github.com"],
        "allow_private": ["10.1.0.0/16"],
    }))
    .unwrap();
    let s = f.resolve().unwrap();
    assert_eq!((s.max_processes, s.max_memory_mb), (0, 0));
    assert_eq!(s.allow_domains, ["pypi.org", "github.com"]);
    assert_eq!(s.allow_private.len(), 1);

    let schema = serde_json::to_value(schemars::schema_for!(ExecFile)).unwrap();
    assert!(schema["properties"]["mode"].is_object());
}

#[test]
fn background_process_limits_default_resolve_and_refuse_bad_values() {
    let d = ExecFile::default().resolve().unwrap();
    assert_eq!(d.max_background_processes, DEFAULT_MAX_BACKGROUND_PROCESSES);
    assert_eq!(d.background_idle, Duration::from_secs(1800));
    let f: ExecFile =
        serde_json::from_value(json!({"max_background_processes": 2, "background_idle_secs": 60}))
            .unwrap();
    let s = f.resolve().unwrap();
    assert_eq!(
        (s.max_background_processes, s.background_idle),
        (2, Duration::from_secs(60))
    );
    for (f, key) in [
        (
            json!({"max_background_processes": 0}),
            "`max_background_processes`: expected 1 to 64",
        ),
        (
            json!({"max_background_processes": 65}),
            "`max_background_processes`",
        ),
        (json!({"background_idle_secs": 0}), "`background_idle_secs`"),
    ] {
        let e = serde_json::from_value::<ExecFile>(f.clone())
            .unwrap()
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(e.contains(key) && e.contains("tools.exec"), "{f}: {e}");
    }
}
