//! Model Context Protocol, with the official SDK (rmcp).
//!
//! - [`client`]: [`McpManager`] connects the servers of `tools.mcp_servers` (stdio children and
//!   streamable HTTP, falling back to the legacy HTTP+SSE transport of [`sse`] when a URL
//!   server only speaks that) in the background and offers their tools to the registry as
//!   `{server}__{tool}` through [`crate::tools::registry::ToolSource`]; health checks,
//!   reconnects with backoff, `list_changed` refreshes, no orphaned children.
//! - [`server`]: `weft mcp-server`, clawft's own tools served over stdio through
//!   [`server::ToolProvider`]s.
//! - [`config`]: the `tools.mcp_servers.NAME` section and its validation.
//!
//! This module must not read the process environment (the config module passes a lookup),
//! must not print to stdout (server mode owns it), and must not let an MCP server's failure
//! delay startup or another server.

mod child;
pub mod client;
pub mod config;
mod http;
pub mod server;
mod sse;

#[cfg(test)]
mod tests;

pub use client::{McpManager, McpOptions, McpServerStatus, McpState, McpTool};
pub use config::{McpServerFile, McpServerSettings, McpTransport};
pub use server::{
    serve, serve_stdio, BuiltinProvider, CompositeProvider, ToolCallOutput, ToolDefinition,
    ToolProvider,
};
