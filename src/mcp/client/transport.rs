//! One transport type for every client connection, so rmcp's generic client service (its
//! message loop, the initialize handshake, their drop glue: ~30 KB per transport type after
//! LTO) is compiled once instead of once per transport (stdio child, streamable HTTP, legacy
//! SSE). Each transport's own code is unchanged; its futures are boxed.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;

use rmcp::service::{RoleClient, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A client transport of any kind.
pub(super) struct ClientTransport(Box<dyn DynTransport>);

impl ClientTransport {
    pub(super) fn new<T: Transport<RoleClient> + 'static>(t: T) -> Self {
        Self(Box::new(t))
    }
}

/// An error of the wrapped transport: its message, and the error itself as `source()` (so
/// `error_chain` shows it once and callers can still downcast it).
#[derive(Debug)]
pub(crate) struct ClientTransportError {
    /// The wrapped transport's [`Transport::name`].
    transport: Cow<'static, str>,
    error: Box<dyn std::error::Error + Send + Sync>,
}

impl std::fmt::Display for ClientTransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.transport, self.error)
    }
}

impl std::error::Error for ClientTransportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.error.as_ref())
    }
}

impl ClientTransportError {
    fn new<T: Transport<RoleClient>>(e: T::Error) -> Self {
        Self {
            transport: T::name(),
            error: Box::new(e),
        }
    }
}

/// The object-safe form of [`Transport`]`<RoleClient>`.
trait DynTransport: Send {
    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> BoxFuture<'static, Result<(), ClientTransportError>>;
    fn receive(&mut self) -> BoxFuture<'_, Option<RxJsonRpcMessage<RoleClient>>>;
    fn close(&mut self) -> BoxFuture<'_, Result<(), ClientTransportError>>;
}

impl<T: Transport<RoleClient> + 'static> DynTransport for T {
    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> BoxFuture<'static, Result<(), ClientTransportError>> {
        let f = Transport::send(self, item);
        Box::pin(async move { f.await.map_err(ClientTransportError::new::<T>) })
    }

    fn receive(&mut self) -> BoxFuture<'_, Option<RxJsonRpcMessage<RoleClient>>> {
        Box::pin(Transport::receive(self))
    }

    fn close(&mut self) -> BoxFuture<'_, Result<(), ClientTransportError>> {
        let f = Transport::close(self);
        Box::pin(async move { f.await.map_err(ClientTransportError::new::<T>) })
    }
}

impl Transport<RoleClient> for ClientTransport {
    type Error = ClientTransportError;

    fn name() -> Cow<'static, str> {
        "mcp client".into()
    }

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.0.send(item)
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.0.receive()
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.0.close()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use rmcp::model::ClientJsonRpcMessage;
    use rmcp::transport::DynamicTransportError;

    use super::*;
    use crate::mcp::sse::SseError;
    use crate::types::text::error_chain;

    /// A transport whose sends fail the way the legacy SSE one can.
    struct Failing;

    impl Transport<RoleClient> for Failing {
        type Error = SseError;

        fn name() -> Cow<'static, str> {
            "failing".into()
        }

        fn send(
            &mut self,
            _item: TxJsonRpcMessage<RoleClient>,
        ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
            std::future::ready(Err(SseError::NoEndpoint))
        }

        fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
            std::future::ready(None)
        }

        fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
            std::future::ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_wrapped_transport_error_keeps_its_message_and_stays_downcastable() {
        let mut t = ClientTransport::new(Failing);
        let msg: ClientJsonRpcMessage = serde_json::from_value(serde_json::json!({
            "jsonrpc": "2.0", "method": "notifications/initialized"
        }))
        .unwrap();
        let e = Transport::send(&mut t, msg).await.unwrap_err();
        // What rmcp wraps a transport's error in (initialize failures, lost connections).
        let e = DynamicTransportError::new::<ClientTransport, RoleClient>(e);
        assert_eq!(
            error_chain(&e),
            "Transport [mcp client] error: failing: the event stream ended before the endpoint event"
        );
        // `connect::legacy_status` and `http::find_blocked` find the transport's own error
        // among the sources.
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        let mut found = false;
        while let Some(c) = cur {
            found |= matches!(c.downcast_ref::<SseError>(), Some(SseError::NoEndpoint));
            cur = c.source();
        }
        assert!(found, "the SseError is not among the sources of {e:?}");
        assert!(Transport::receive(&mut t).await.is_none());
        assert!(Transport::close(&mut t).await.is_ok());
    }
}
