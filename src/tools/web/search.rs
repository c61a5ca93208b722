//! `web_search`: query the operator's search backend (SearXNG or Brave); its settings
//! (`tools.web_search`). Deliberately not behind the SSRF guard: the endpoint comes from the
//! operator's config, never from the model.

use std::time::Duration;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use url::Url;

use super::{default_user_agent, MAX_TIMEOUT_SECS};
use crate::net::ssrf::ClientBuildError;
use crate::tools::html;
use crate::tools::{parse_args, schema_of, Effect, Tool, ToolContext, ToolError};
use crate::types::{Secret, SettingError};

/// Default `web_search` deadline (seconds).
pub const DEFAULT_SEARCH_TIMEOUT_SECS: u64 = 15;
/// Default `num_results` of `web_search`.
pub const DEFAULT_NUM_RESULTS: usize = 5;
/// Most results one `web_search` call returns (Brave's own per-request limit).
pub const MAX_NUM_RESULTS: usize = 20;
/// Largest search backend response read (2 MiB): a results page is a few KiB.
const MAX_SEARCH_RESPONSE_BYTES: usize = 2 * 1024 * 1024;
/// Brave's web search API, used when `provider = "brave"` has no `endpoint`.
pub const BRAVE_DEFAULT_ENDPOINT: &str = "https://api.search.brave.com/res/v1/web/search";

/// A search backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchProvider {
    /// A SearXNG instance with the JSON format enabled.
    Searxng,
    /// The Brave Search API.
    Brave,
}

/// Resolved `web_search` settings. `provider: None` means not configured: the tool answers
/// with an informational result.
#[derive(Debug, Clone, PartialEq)]
pub struct WebSearchSettings {
    /// The backend (default: none, not configured).
    pub provider: Option<SearchProvider>,
    /// Base URL of the backend (SearXNG: the instance root; Brave: the full API URL).
    pub endpoint: Option<Url>,
    /// The API key resolved by the config layer from `api_key`/`api_key_env`/`api_key_file`.
    pub api_key: Option<Secret>,
    /// Deadline of one search (default 15 s).
    pub timeout: Duration,
}

impl Default for WebSearchSettings {
    fn default() -> Self {
        Self {
            provider: None,
            endpoint: None,
            api_key: None,
            timeout: Duration::from_secs(DEFAULT_SEARCH_TIMEOUT_SECS),
        }
    }
}

/// `tools.web_search` in the config file.
#[derive(Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WebSearchFile {
    /// `searxng` or `brave` (default `searxng` when `endpoint` is set; unset with no endpoint:
    /// search not configured).
    pub provider: Option<String>,
    /// Backend URL: the SearXNG instance (e.g. `http://127.0.0.1:8888`), or for Brave
    /// optionally another API URL (default `https://api.search.brave.com/res/v1/web/search`).
    /// Operator-chosen, so it is not subject to web_fetch's private-address blocking.
    pub endpoint: Option<String>,
    /// API key, inline (Brave; prefer `api_key_env` or `api_key_file`).
    pub api_key: Option<String>,
    /// Environment variable holding the API key.
    pub api_key_env: Option<String>,
    /// File holding the API key (relative paths resolve in `$CREDENTIALS_DIRECTORY`).
    pub api_key_file: Option<String>,
    /// Deadline of one search in seconds (default 15, 1..=300).
    pub timeout_secs: Option<u64>,
}

impl WebSearchFile {
    /// Validate into [`WebSearchSettings`]. `api_key` is the key the config layer resolved from
    /// `api_key`/`api_key_env`/`api_key_file` (this type only holds those strings).
    ///
    /// # Errors
    /// A message naming the key (`tools.web_search.…`) and what is expected.
    pub fn resolve(&self, api_key: Option<Secret>) -> Result<WebSearchSettings, SettingError> {
        let provider = match self.provider.as_deref().map(str::trim) {
            None if self.endpoint.is_none() => None,
            None => Some(SearchProvider::Searxng),
            Some(p) if p.eq_ignore_ascii_case("searxng") => Some(SearchProvider::Searxng),
            Some(p) if p.eq_ignore_ascii_case("brave") => Some(SearchProvider::Brave),
            Some(p) => {
                return Err(SettingError::new(
                    "tools.web_search.provider",
                    format!("expected \"searxng\" or \"brave\", got \"{p}\""),
                ))
            }
        };
        let endpoint = match &self.endpoint {
            None => None,
            Some(e) => {
                let u = Url::parse(e.trim()).map_err(|err| {
                    SettingError::new(
                        "tools.web_search.endpoint",
                        format!("`{e}` is not a URL ({err}); expected e.g. http://127.0.0.1:8888"),
                    )
                })?;
                if !matches!(u.scheme(), "http" | "https") {
                    return Err(SettingError::new(
                        "tools.web_search.endpoint",
                        format!("expected an http:// or https:// URL, got `{e}`"),
                    ));
                }
                Some(u)
            }
        };
        let endpoint = match provider {
            Some(SearchProvider::Searxng) if endpoint.is_none() => {
                return Err(SettingError::new("tools.web_search.endpoint", "the searxng provider needs the URL of a SearXNG instance (e.g. http://127.0.0.1:8888)"))
            }
            Some(SearchProvider::Brave) if api_key.is_none() => {
                return Err(SettingError::new("tools.web_search.api_key", "the brave provider needs an API key (set tools.web_search.api_key_env or api_key_file)"))
            }
            Some(SearchProvider::Brave) if endpoint.is_none() => {
                Some(
                    Url::parse(BRAVE_DEFAULT_ENDPOINT)
                        .map_err(|e| SettingError::new("tools.web_search", e.to_string()))?,
                )
            }
            _ => endpoint,
        };
        let timeout = match self.timeout_secs {
            None => Duration::from_secs(DEFAULT_SEARCH_TIMEOUT_SECS),
            Some(n) if (1..=MAX_TIMEOUT_SECS).contains(&n) => Duration::from_secs(n),
            Some(n) => {
                return Err(SettingError::new(
                    "tools.web_search.timeout_secs",
                    format!("expected 1..={MAX_TIMEOUT_SECS} seconds, got {n}"),
                ))
            }
        };
        Ok(WebSearchSettings {
            provider,
            endpoint,
            api_key,
            timeout,
        })
    }
}

/// Arguments of `web_search`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WebSearchArgs {
    /// Search query.
    pub query: String,
    /// 1 to 20, default 5.
    pub num_results: Option<u64>,
}

#[derive(Deserialize)]
struct SearxngResponse {
    results: Vec<SearxngResult>,
}

#[derive(Deserialize)]
struct SearxngResult {
    #[serde(default)]
    title: String,
    #[serde(default)]
    url: String,
    #[serde(default)]
    content: Option<String>,
}

#[derive(Deserialize)]
struct BraveResponse {
    #[serde(default)]
    web: Option<BraveWeb>,
}

#[derive(Deserialize)]
struct BraveWeb {
    #[serde(default)]
    results: Vec<BraveResult>,
}

#[derive(Deserialize)]
struct BraveResult {
    #[serde(default)]
    title: String,
    #[serde(default)]
    url: String,
    #[serde(default)]
    description: Option<String>,
}

/// `web_search`: query the operator's search backend.
pub struct WebSearch {
    client: reqwest::Client,
    settings: WebSearchSettings,
}

impl WebSearch {
    /// Build the tool and its HTTP client (system proxies off, as everywhere in the daemon,
    /// which reads the environment only in config).
    ///
    /// # Errors
    /// The HTTP client cannot be built.
    pub fn new(settings: WebSearchSettings) -> Result<Self, ClientBuildError> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::limited(3))
            .connect_timeout(settings.timeout.min(Duration::from_secs(10)))
            .user_agent(default_user_agent())
            .build()
            .map_err(|e| ClientBuildError {
                tool: "web_search",
                reason: e.to_string(),
            })?;
        Ok(Self { client, settings })
    }

    fn timeout_error(&self) -> ToolError {
        ToolError::Timeout(self.settings.timeout.as_secs_f64().ceil() as u64)
    }

    async fn search(
        &self,
        provider: SearchProvider,
        endpoint: &Url,
        query: &str,
        n: usize,
    ) -> Result<Vec<Value>, ToolError> {
        let (what, rb) = match provider {
            SearchProvider::Searxng => {
                let mut u = endpoint.clone();
                if !u.path().trim_end_matches('/').ends_with("/search") {
                    let p = format!("{}/search", u.path().trim_end_matches('/'));
                    u.set_path(&p);
                }
                u.query_pairs_mut()
                    .append_pair("q", query)
                    .append_pair("format", "json");
                ("SearXNG", self.client.get(u))
            }
            SearchProvider::Brave => {
                let mut u = endpoint.clone();
                u.query_pairs_mut()
                    .append_pair("q", query)
                    .append_pair("count", &n.to_string());
                let mut rb = self.client.get(u).header("Accept", "application/json");
                if let Some(k) = &self.settings.api_key {
                    rb = rb.header("X-Subscription-Token", k.expose());
                }
                ("Brave", rb)
            }
        };
        let mut resp = rb.send().await.map_err(|e| {
            if e.is_timeout() {
                self.timeout_error()
            } else {
                ToolError::ExecutionFailed(format!(
                    "the {what} search backend at {} cannot be reached: {e}",
                    endpoint.origin().ascii_serialization()
                ))
            }
        })?;
        let status = resp.status();
        if !status.is_success() {
            let hint = match (provider, status.as_u16()) {
                (_, 429) => "; the backend is rate limiting, retry later",
                (SearchProvider::Searxng, 403) => {
                    "; SearXNG answers 403 when `json` is not in search.formats of its settings.yml"
                }
                (SearchProvider::Brave, 401 | 403) => "; check the Brave API key",
                _ => "",
            };
            return Err(ToolError::ExecutionFailed(format!(
                "the {what} search backend answered HTTP {status}{hint}"
            )));
        }
        let mut buf = Vec::new();
        while let Some(c) = resp.chunk().await.map_err(|e| {
            if e.is_timeout() {
                self.timeout_error()
            } else {
                ToolError::ExecutionFailed(format!("reading the {what} response failed: {e}"))
            }
        })? {
            if buf.len() + c.len() > MAX_SEARCH_RESPONSE_BYTES {
                return Err(ToolError::ExecutionFailed(format!(
                    "the {what} response is larger than {MAX_SEARCH_RESPONSE_BYTES} bytes"
                )));
            }
            buf.extend_from_slice(&c);
        }
        let snippet =
            |s: Option<String>| s.map(|s| html::html_to_text(&s, None)).unwrap_or_default();
        let results: Vec<Value> = match provider {
            SearchProvider::Searxng => {
                let r: SearxngResponse = serde_json::from_slice(&buf).map_err(|e| {
                    ToolError::ExecutionFailed(format!(
                        "the SearXNG response is not the expected JSON (an object with `results`: [{{title, url, content}}]): {e}"
                    ))
                })?;
                r.results
                    .into_iter()
                    .map(|x| json!({"title": html::html_to_text(&x.title, None), "url": x.url, "snippet": snippet(x.content)}))
                    .collect()
            }
            SearchProvider::Brave => {
                let r: BraveResponse = serde_json::from_slice(&buf).map_err(|e| {
                    ToolError::ExecutionFailed(format!(
                        "the Brave response is not the expected JSON (an object with `web.results`: [{{title, url, description}}]): {e}"
                    ))
                })?;
                r.web
                    .map(|w| w.results)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|x| json!({"title": html::html_to_text(&x.title, None), "url": x.url, "snippet": snippet(x.description)}))
                    .collect()
            }
        };
        Ok(results.into_iter().take(n).collect())
    }
}

#[async_trait]
impl Tool for WebSearch {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::WebSearch.name()
    }
    fn description(&self) -> &str {
        "Search the web: titles, URLs and snippets (read a page with web_fetch)."
    }
    fn parameters(&self) -> Value {
        schema_of::<WebSearchArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::Network
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: WebSearchArgs = parse_args(self.name(), args)?;
        let query = a.query.trim();
        if query.is_empty() {
            return Err(ToolError::InvalidArgs(
                "`query` is empty: give the words to search for".into(),
            ));
        }
        let n = match a.num_results {
            None => DEFAULT_NUM_RESULTS,
            Some(0) => {
                return Err(ToolError::InvalidArgs(format!(
                    "`num_results` must be 1 to {MAX_NUM_RESULTS}"
                )))
            }
            Some(n) => usize::try_from(n)
                .unwrap_or(MAX_NUM_RESULTS)
                .min(MAX_NUM_RESULTS),
        };
        let (Some(provider), Some(endpoint)) = (self.settings.provider, &self.settings.endpoint)
        else {
            return Ok(json!({
                "error": "web search not configured",
                "message": "No search API endpoint is configured. Set 'tools.web_search.endpoint' in your config.",
                "query": query,
            }));
        };
        let results = tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => return Err(ToolError::Cancelled),
            r = tokio::time::timeout(self.settings.timeout, self.search(provider, endpoint, query, n)) => {
                r.unwrap_or_else(|_| Err(self.timeout_error()))?
            }
        };
        Ok(json!({"query": query, "count": results.len(), "results": results}))
    }
}

#[cfg(test)]
#[path = "search_tests.rs"]
mod tests;
