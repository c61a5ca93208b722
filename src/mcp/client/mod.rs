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
//!
//! [`Tool`]: crate::tools::Tool
//! [`ToolSource`]: crate::tools::registry::ToolSource

mod adapter;
mod connect;
mod manager;

pub use adapter::McpTool;
pub use manager::{McpManager, McpOptions, McpServerStatus, McpState};

/// Render an error with its sources (rmcp's and reqwest's own messages are often bare).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}
