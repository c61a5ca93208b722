//! The fixture shared by the process-tool tests: a workspace, a canary directory outside
//! it, a runtime over them, and helpers to run commands and watch processes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::tools::exec::jail::NsSupport;
use crate::tools::exec::{ExecDeps, ExecRuntime, ExecSettings, ExecShell};
use crate::tools::shell_policy::Approver;
use crate::tools::{Tool, ToolContext, ToolError, Workspace};
use crate::types::SessionKey;

pub(super) const CANARY_TEXT: &str = "CANARY-7f3a9c-do-not-leak";

/// A workspace, a canary directory outside it, and a runtime over them.
pub(super) struct Fx {
    pub(super) root: tempfile::TempDir,
    pub(super) outside: tempfile::TempDir,
    pub(super) ws: PathBuf,
    pub(super) canary: PathBuf,
    pub(super) rt: Arc<ExecRuntime>,
    pub(super) ctx: ToolContext,
}

pub(super) fn env_source() -> Vec<(OsString, OsString)> {
    [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("LANG", "C.UTF-8"),
        ("FOO_TOKEN", "tok-5d1e2b-value"),
        ("API_KEY", "key-9a8b7c-value"),
        ("MY_VAR", "visible-value"),
        ("LEAKY_VAR", "prefix-daemon-secret-9q8w-suffix"),
        ("OTHER_VAR", "not-passed-value"),
    ]
    .into_iter()
    .map(|(a, b)| (a.into(), b.into()))
    .collect()
}

pub(super) fn fixture_with(
    settings: ExecSettings,
    protected: impl FnOnce(&Path) -> Vec<PathBuf>,
    approver: Option<Arc<dyn Approver>>,
) -> Fx {
    fixture_jailed(settings, protected, approver, None)
}

/// `fixture_with`, with the namespace support and cgroups forced when `jail` is given.
pub(super) fn fixture_jailed(
    settings: ExecSettings,
    protected: impl FnOnce(&Path) -> Vec<PathBuf>,
    approver: Option<Arc<dyn Approver>>,
    jail: Option<(NsSupport, bool)>,
) -> Fx {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let ws = root.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let canary = outside.path().join("CANARY");
    std::fs::write(&canary, CANARY_TEXT).unwrap();
    let deps = ExecDeps {
        protected_paths: protected(&ws),
        secrets: vec!["daemon-secret-9q8w".into()],
        env: env_source(),
        approver,
        tmp_base: root.path().to_path_buf(),
        proxy_socket: None,
        proxy: None,
    };
    let rt = Arc::new(match jail {
        None => ExecRuntime::new(settings, deps).unwrap(),
        Some((ns, cgroups)) => ExecRuntime::with_jail(settings, deps, ns, cgroups).unwrap(),
    });
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
        root,
        outside,
        ws,
        canary,
        rt,
        ctx,
    }
}

pub(super) fn fixture() -> Fx {
    fixture_with(ExecSettings::default(), |_| Vec::new(), None)
}

/// Landlock is what these tests check; say so loudly where the kernel lacks it.
pub(super) fn landlock_or_skip(fx: &Fx) -> bool {
    let s = fx.rt.sandbox_status();
    if !s.fs_enforced {
        println!(
            "SKIPPED: Landlock unavailable on this kernel: {}",
            s.summary()
        );
    }
    s.fs_enforced
}

pub(super) async fn sh(fx: &Fx, command: &str) -> Result<Value, ToolError> {
    ExecShell::new(fx.rt.clone())
        .execute(json!({ "command": command }), &fx.ctx)
        .await
}

pub(super) async fn sh_ok(fx: &Fx, command: &str) -> Value {
    sh(fx, command)
        .await
        .unwrap_or_else(|e| panic!("{command}: {e}"))
}

pub(super) fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(s) => !matches!(
            s.rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next()),
            Some("Z" | "X")
        ),
    }
}

/// Whether `pid` is gone (or a zombie) within `within`.
pub(super) async fn gone_within(pid: i32, within: Duration) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    !alive(pid)
}

pub(super) async fn wait_for_file(p: &Path) -> String {
    for _ in 0..250 {
        if let Ok(s) = std::fs::read_to_string(p) {
            if s.ends_with('\n') {
                return s;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{} never appeared", p.display());
}
