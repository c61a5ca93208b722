//! Network guards shared by the tools and MCP: [`ssrf`] decides which addresses the daemon may
//! dial for a URL it did not choose (`web_fetch`, untrusted MCP URL servers) and provides the
//! guarded HTTP client that only dials what was checked.
//!
//! This module imports nothing from the crate except leaf types ([`crate::types`]).

pub mod proxy;
pub mod ssrf;
