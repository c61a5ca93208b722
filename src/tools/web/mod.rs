//! Web tools: `web_fetch` (model-chosen URLs, behind the SSRF guard of [`crate::net::ssrf`]) and
//! `web_search` (the operator's search backend: SearXNG or Brave).
//!
//! `web_fetch` never dials an address it has not checked (see [`crate::net::ssrf`]), reads at most
//! `max_bytes` of a body as a stream, and returns text only. `web_search` is deliberately NOT
//! behind the SSRF guard: its endpoint comes from the operator's config (people run SearXNG on
//! localhost), never from the model, and the query only goes into the query string.
//!
//! - [`fetch`]: `web_fetch` and its settings (`tools.web_fetch`).
//! - [`search`]: `web_search`, its settings (`tools.web_search`) and backends.
//! - [`decode`]: a fetched body to text (content types, charsets, HTML to text).

mod decode;
pub mod fetch;
pub mod search;

#[cfg(test)]
mod test_support;

pub use fetch::{
    HttpMethod, WebFetch, WebFetchArgs, WebFetchFile, WebFetchSettings, DEFAULT_FETCH_TIMEOUT_SECS,
    DEFAULT_MAX_BYTES, DEFAULT_MAX_REDIRECTS, MAX_MAX_BYTES, MAX_MAX_REDIRECTS,
};
pub use search::{
    SearchProvider, WebSearch, WebSearchArgs, WebSearchFile, WebSearchSettings,
    BRAVE_DEFAULT_ENDPOINT, DEFAULT_NUM_RESULTS, DEFAULT_SEARCH_TIMEOUT_SECS, MAX_NUM_RESULTS,
};

/// Longest deadline accepted for either web tool (seconds), as for exec_shell.
pub const MAX_TIMEOUT_SECS: u64 = 300;

/// `User-Agent` of both tools unless configured (`clawft/VERSION (web_fetch)`).
fn default_user_agent() -> String {
    concat!("clawft/", env!("CARGO_PKG_VERSION"), " (web_fetch)").to_string()
}
