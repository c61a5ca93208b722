//! Helpers shared by the `web_fetch` and `web_search` tests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::tools::{ToolContext, Workspace};
use crate::types::SessionKey;

pub(super) struct Ctx {
    _dir: tempfile::TempDir,
    pub(super) ctx: ToolContext,
}

pub(super) fn ctx() -> Ctx {
    crate::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let ctx = ToolContext {
        workspace: Arc::new(Workspace::open(dir.path()).unwrap()),
        session: SessionKey::parse("t:1").unwrap(),
        cancel: CancellationToken::new(),
        user_dir: None,
        sender: None,
        call_id: None,
        turn: Default::default(),
    };
    Ctx { _dir: dir, ctx }
}

/// A server on 127.0.0.2 that accepts and never answers.
pub(super) async fn silent_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.2:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    addr
}
