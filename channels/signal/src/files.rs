//! Inbound attachments for the daemon's downloader: signal-cli serves them only through the
//! JSON-RPC method `getAttachment` (base64 in the answer), while the daemon downloads a URL
//! (with its size caps and content sniffing). This is the bridge: an HTTP endpoint on
//! 127.0.0.1, started on the first download, under a random path known only to this process,
//! that answers `GET /<secret>/<attachment id>` with the bytes from `getAttachment`.

use std::sync::{Arc, Weak};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use base64::Engine;
use clawft_channel_core::ChannelError;
use serde_json::{Map, Value};
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use crate::Inner;

/// The file endpoint of one adapter.
#[derive(Default)]
pub(crate) struct FileServer {
    /// `http://127.0.0.1:PORT/<secret>`, once started.
    base: OnceCell<String>,
    stop: CancellationToken,
}

/// Whether `id` can be a signal-cli attachment id (its file name in the attachments
/// directory): no path separators, nothing hidden.
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 200
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'='))
}

impl FileServer {
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }

    /// The URL the daemon downloads attachment `id` from.
    pub(crate) async fn url_for(
        &self,
        inner: &Arc<Inner>,
        id: &str,
    ) -> Result<String, ChannelError> {
        if !valid_id(id) {
            return Err(ChannelError::Rejected(format!(
                "`{id}` is not a Signal attachment id"
            )));
        }
        let weak = Arc::downgrade(inner);
        let stop = self.stop.clone();
        let base = self.base.get_or_try_init(|| start(weak, stop)).await?;
        Ok(format!("{base}/{id}"))
    }
}

async fn start(inner: Weak<Inner>, stop: CancellationToken) -> Result<String, ChannelError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| ChannelError::Transient(format!("attachment endpoint: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| ChannelError::Transient(format!("attachment endpoint: {e}")))?;
    let secret = uuid::Uuid::new_v4().simple().to_string();
    let app = Router::new()
        .route(&format!("/{secret}/{{id}}"), get(serve))
        .with_state(inner);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
    });
    Ok(format!("http://{addr}/{secret}"))
}

async fn serve(State(inner): State<Weak<Inner>>, Path(id): Path<String>) -> Response {
    let Some(inner) = inner.upgrade() else {
        return StatusCode::GONE.into_response();
    };
    if !valid_id(&id) {
        return StatusCode::NOT_FOUND.into_response();
    }
    let mut p = Map::new();
    p.insert("id".into(), Value::String(id));
    match inner.rpc.call("getAttachment", p).await {
        Ok(v) => {
            let data = v.get("data").and_then(Value::as_str).unwrap_or("");
            match base64::engine::general_purpose::STANDARD.decode(data) {
                Ok(bytes) => bytes.into_response(),
                Err(_) => (StatusCode::BAD_GATEWAY, "signal-cli sent bad base64").into_response(),
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "signal attachment not fetched");
            let status = if e.is_retryable() {
                StatusCode::BAD_GATEWAY
            } else {
                StatusCode::NOT_FOUND
            };
            (status, e.to_string()).into_response()
        }
    }
}
