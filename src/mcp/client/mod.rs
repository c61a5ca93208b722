//! The MCP client side: [`McpManager`] connects every configured server in the background,
//! keeps each one's state (connecting / connected / reconnecting / failed), health-checks it,
//! reconnects with backoff, and offers the servers' tools to the [`ToolRegistry`] as
//! [`ToolSource`] (`{server}__{tool}`). It never blocks startup, and a call to a server that is
//! down fails at once with the reason.
//!
//! [`ToolRegistry`]: crate::tools::ToolRegistry
//!
//! - [`manager`]: [`McpManager`]: one supervisor per server, states, health checks, reconnects
//!   with backoff, restart, shutdown.
//! - [`connect`]: one connection: a stdio child, streamable HTTP, or the legacy HTTP+SSE
//!   transport a URL server falls back to.
//! - [`adapter`]: the servers' tools as [`Tool`]s ([`McpTool`]) and the manager as a
//!   [`ToolSource`].
//! - [`transport`]: the one transport type the three kinds of connection are served through.
//!
//! [`Tool`]: crate::tools::Tool
//! [`ToolSource`]: crate::tools::registry::ToolSource

mod adapter;
mod connect;
mod manager;
mod transport;

pub use adapter::McpTool;
pub use manager::{McpManager, McpOptions, McpServerStatus, McpState};

use crate::types::text::error_chain as chain;
