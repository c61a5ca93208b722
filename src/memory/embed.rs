//! Optional dense retrieval through an OpenAI-compatible `/embeddings` endpoint: the client
//! ([`Embedder`]), the per-root vector store ([`Vectors`]) and the fusion of the keyword and
//! vector rankings ([`fuse`]).
//!
//! Knows no files and no config: the memory service decides what to embed and when, hands the
//! texts in, and keeps the [`Vectors`] of each root beside its keyword index. Never required:
//! every failure here is an [`EmbedError`] the caller turns into keyword-only search.
//!
//! The endpoint is the operator's own setting (like a provider's `base_url`), so it does not go
//! through the SSRF guard; but a redirect is followed only to the same host (an `http` to
//! `https` upgrade included), never elsewhere, so the key is never sent to a host the operator
//! did not name.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::index::Hit;
use crate::llm::error::parse_retry_after;
use crate::llm::http::join_url;
use crate::tools::truncate::floor_char as cut;
use crate::types::scrub::{redact_url, Scrubber};
use crate::types::Secret;

/// Longest `Retry-After` honoured on a 429 (10 s): embedding is background or search-time
/// work; a longer wait is the caller's to schedule (it falls back to keyword-only meanwhile).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(10);
/// Wait before the one retry of a 429 that names no `Retry-After` (1 s).
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);
/// Largest vector accepted (16,384 dimensions: above every hosted model's 3,072 and any
/// local one); also bounds what [`Vectors::decode`] allocates per vector.
pub const MAX_DIMS: usize = 16_384;
/// Most inputs in one request (OpenAI's limit on the `input` array).
pub const MAX_BATCH: usize = 2048;
/// Longest timeout accepted (300 s).
const MAX_TIMEOUT_SECS: u64 = 300;
/// Response bytes allowed per input (256 KiB: 16,384 numbers of ~16 characters) plus a fixed
/// 64 KiB; a bigger body is refused while it is read instead of being buffered whole.
const RESPONSE_BYTES_PER_INPUT: usize = 256 * 1024;
/// Bytes of one input sent (8 KiB, cut at a character boundary): at most ~2k tokens of English
/// and ~4k of CJK, under every common model's input limit (OpenAI's is 8,191 tokens), so one
/// huge paragraph cannot fail its whole batch with a 400; its first 8 KiB carry its meaning.
pub const MAX_INPUT_BYTES: usize = 8 * 1024;
/// Most redirect hops followed (to the same host).
const MAX_REDIRECTS: usize = 3;
/// Characters of a provider's error message kept in an [`EmbedError`].
const MAX_MESSAGE_CHARS: usize = 300;

fn default_timeout_secs() -> u64 {
    10
}

fn default_batch() -> usize {
    64
}

/// `memory.embeddings`: the optional OpenAI-compatible embeddings endpoint. The config layer
/// aggregates this type; the key itself is read by the caller from `api_key_env` and handed to
/// [`Embedder::new`] as a [`Secret`].
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingSettings {
    /// Base URL of the API (`https://api.openai.com/v1`, `http://127.0.0.1:11434/v1`);
    /// `/embeddings` is appended.
    pub base_url: String,
    /// Embedding model (`text-embedding-3-small`, `nomic-embed-text`).
    pub model: String,
    /// Environment variable holding the API key (sent as `Authorization: Bearer`); none for a
    /// local server without auth.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Vector size asked of the model (`dimensions`; OpenAI's `text-embedding-3-*` accept any
    /// size up to their native one). Smaller vectors cost less memory and disk: 256 dimensions
    /// are 1 KiB a chunk, 1,536 are 6 KiB.
    #[serde(default)]
    pub dimensions: Option<u32>,
    /// Seconds one request may take, the answer included.
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
    /// Inputs sent in one request.
    #[serde(default = "default_batch")]
    pub batch: usize,
}

impl EmbeddingSettings {
    /// Validate the settings.
    ///
    /// # Errors
    /// A message naming the key (`memory.embeddings.<field>`), what is wrong and the fix.
    pub fn check(&self) -> Result<(), String> {
        let url = url::Url::parse(&self.base_url).map_err(|e| {
            format!(
                "memory.embeddings.base_url: `{}` is not a URL ({e}); write the API's base, e.g. \"https://api.openai.com/v1\"",
                redact_url(&self.base_url)
            )
        })?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
            return Err(format!(
                "memory.embeddings.base_url: `{}` must be an http:// or https:// URL with a host, e.g. \"https://api.openai.com/v1\"",
                redact_url(&self.base_url)
            ));
        }
        if self.model.trim().is_empty() {
            return Err(
                "memory.embeddings.model: empty; name the embedding model, e.g. \"text-embedding-3-small\""
                    .into(),
            );
        }
        if let Some(env) = &self.api_key_env {
            if env.is_empty()
                || !env.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                || env.as_bytes()[0].is_ascii_digit()
            {
                return Err(format!(
                    "memory.embeddings.api_key_env: `{env}` is not an environment variable name (letters, digits and `_`), e.g. \"OPENAI_API_KEY\"; the key itself never goes in the file"
                ));
            }
        }
        if let Some(d) = self.dimensions {
            if d == 0 || d as usize > MAX_DIMS {
                return Err(format!(
                    "memory.embeddings.dimensions: {d} is out of range (1..={MAX_DIMS}); e.g. 256, or leave it out for the model's own size"
                ));
            }
        }
        if self.timeout_secs == 0 || self.timeout_secs > MAX_TIMEOUT_SECS {
            return Err(format!(
                "memory.embeddings.timeout_secs: {} is out of range (1..={MAX_TIMEOUT_SECS})",
                self.timeout_secs
            ));
        }
        if self.batch == 0 || self.batch > MAX_BATCH {
            return Err(format!(
                "memory.embeddings.batch: {} is out of range (1..={MAX_BATCH})",
                self.batch
            ));
        }
        Ok(())
    }
}

/// Why an embedding request failed. The caller falls back to keyword-only search on any of
/// them; [`EmbedError::is_retryable`] says whether trying again later may help.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// 401/403: the key is missing, wrong or lacks permission.
    #[error("embeddings at {url}: authentication failed (HTTP {status}): {message}; {fix}")]
    Auth {
        /// The endpoint (credentials redacted).
        url: String,
        /// HTTP status.
        status: u16,
        /// The provider's error message (secrets scrubbed, cut short).
        message: String,
        /// What to do, naming the key's environment variable.
        fix: String,
    },
    /// 429, still after the one retry (or asking for a wait over [`MAX_RETRY_AFTER`]).
    #[error("embeddings at {url}: rate limited (HTTP 429){}", fmt_after(*retry_after))]
    RateLimited {
        /// The endpoint (credentials redacted).
        url: String,
        /// The wait the server asked for, if it said.
        retry_after: Option<Duration>,
    },
    /// Another error status (400 bad input, 404 unknown model, 5xx, a redirect elsewhere).
    #[error("embeddings at {url}: HTTP {status}: {message}")]
    Status {
        /// The endpoint (credentials redacted).
        url: String,
        /// HTTP status.
        status: u16,
        /// The provider's error message, or what the status means (secrets scrubbed).
        message: String,
    },
    /// No complete answer within `memory.embeddings.timeout_secs`.
    #[error("embeddings at {url}: no answer within {} s (memory.embeddings.timeout_secs)", timeout.as_secs())]
    Timeout {
        /// The endpoint (credentials redacted).
        url: String,
        /// The timeout that elapsed.
        timeout: Duration,
    },
    /// The connection could not be made or broke.
    #[error("embeddings at {url}: connection failed: {detail}")]
    Connect {
        /// The endpoint (credentials redacted).
        url: String,
        /// The transport's reason.
        detail: String,
    },
    /// A 2xx answer that is not one finite vector per input, all of one size.
    #[error("embeddings at {url}: malformed answer: {detail}")]
    BadShape {
        /// The endpoint (credentials redacted).
        url: String,
        /// What was wrong.
        detail: String,
    },
}

fn fmt_after(d: Option<Duration>) -> String {
    d.map(|d| format!(", retry after {} s", d.as_secs_f64()))
        .unwrap_or_default()
}

impl EmbedError {
    /// A short fixed name for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            EmbedError::Auth { .. } => "auth",
            EmbedError::RateLimited { .. } => "rate_limited",
            EmbedError::Status { .. } => "status",
            EmbedError::Timeout { .. } => "timeout",
            EmbedError::Connect { .. } => "connect",
            EmbedError::BadShape { .. } => "bad_shape",
        }
    }

    /// Whether the same request may succeed later (rate limit, timeout, connection, 5xx);
    /// auth, bad input and malformed answers need the operator.
    pub fn is_retryable(&self) -> bool {
        match self {
            EmbedError::RateLimited { .. }
            | EmbedError::Timeout { .. }
            | EmbedError::Connect { .. } => true,
            EmbedError::Status { status, .. } => *status >= 500,
            EmbedError::Auth { .. } | EmbedError::BadShape { .. } => false,
        }
    }
}

/// The client of one embeddings endpoint. Cheap to share behind an `Arc`; requests are
/// independent.
pub struct Embedder {
    http: reqwest::Client,
    /// `<base_url>/embeddings`, as posted to.
    url: String,
    /// [`Self::url`] with credentials redacted, for errors.
    shown_url: String,
    model: String,
    key: Option<Secret>,
    /// Named in the fix of an auth error.
    key_env: Option<String>,
    dimensions: Option<u32>,
    timeout: Duration,
    batch: usize,
    /// Removes the key from provider error messages (some echo it).
    scrubber: Scrubber,
}

impl fmt::Debug for Embedder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Embedder")
            .field("url", &self.shown_url)
            .field("model", &self.model)
            .field("key", &self.key)
            .field("key_env", &self.key_env)
            .field("dimensions", &self.dimensions)
            .field("timeout", &self.timeout)
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

/// One `data` item of an OpenAI embeddings response.
#[derive(Deserialize)]
struct Item {
    index: usize,
    embedding: Vec<f32>,
}

#[derive(Deserialize)]
struct Response {
    data: Vec<Item>,
}

impl Embedder {
    /// A client for `settings` (checked here), sending `api_key` as a bearer token when given.
    ///
    /// # Errors
    /// The message of [`EmbeddingSettings::check`], or the HTTP client could not be built.
    pub fn new(settings: &EmbeddingSettings, api_key: Option<Secret>) -> Result<Self, String> {
        settings.check()?;
        let timeout = Duration::from_secs(settings.timeout_secs);
        // As `llm::http::http_client` (rustls, proxies from the environment kept: the endpoint
        // may sit behind one), but redirects only to the host configured.
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10).min(timeout))
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(90))
            .redirect(reqwest::redirect::Policy::custom(same_host_redirects))
            .build()
            .map_err(|e| format!("memory.embeddings: cannot build the HTTP client: {e}"))?;
        let url = join_url(&settings.base_url, "/embeddings");
        let scrubber = Scrubber::new(api_key.iter().map(|k| k.expose().to_string()).collect());
        Ok(Self {
            http,
            shown_url: redact_url(&url).into_owned(),
            url,
            model: settings.model.clone(),
            key: api_key.filter(|k| !k.expose().is_empty()),
            key_env: settings.api_key_env.clone(),
            dimensions: settings.dimensions,
            timeout,
            batch: settings.batch,
            scrubber,
        })
    }

    /// The model asked for (vectors of different models are not comparable: a changed model
    /// means embedding everything again).
    pub fn model(&self) -> &str {
        &self.model
    }

    /// One vector per input, in the order of `inputs`, `batch` inputs a request. The vectors
    /// are as the provider sent them (not normalised); all have one size, the configured
    /// `dimensions` when set.
    ///
    /// # Errors
    /// The first failing request's [`EmbedError`]; a 429 is retried once after its
    /// `Retry-After` (at most [`MAX_RETRY_AFTER`]).
    pub async fn embed(&self, inputs: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut out = Vec::with_capacity(inputs.len());
        let mut dims = self.dimensions.map(|d| d as usize);
        for chunk in inputs.chunks(self.batch) {
            let vectors = self.embed_batch(chunk).await?;
            for v in &vectors {
                let want = *dims.get_or_insert(v.len());
                if v.len() != want {
                    return Err(self.bad_shape(format!(
                        "a vector of {} dimensions where {want} were expected{}",
                        v.len(),
                        if self.dimensions.is_some() {
                            " (memory.embeddings.dimensions; does the model support it?)"
                        } else {
                            ""
                        }
                    )));
                }
            }
            out.extend(vectors);
        }
        Ok(out)
    }

    /// One request (retried once on a 429), its answer checked and put in input order.
    async fn embed_batch(&self, inputs: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let input: Vec<&str> = inputs.iter().map(|s| cut(s, MAX_INPUT_BYTES)).collect();
        let mut body = serde_json::json!({ "model": self.model, "input": input });
        if let Some(d) = self.dimensions {
            body["dimensions"] = d.into();
        }
        let body = bytes::Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
        let mut retried = false;
        loop {
            let mut rb = self
                .http
                .post(&self.url)
                .timeout(self.timeout)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.clone());
            if let Some(key) = &self.key {
                rb = rb.bearer_auth(key.expose());
            }
            let resp = rb.send().await.map_err(|e| self.transport_error(&e))?;
            let status = resp.status();
            if status.is_success() {
                let limit = 64 * 1024 + inputs.len().saturating_mul(RESPONSE_BYTES_PER_INPUT);
                let bytes = self.read_body(resp, limit).await?;
                return self.parse(&bytes, inputs.len());
            }
            let retry_after = parse_retry_after(
                resp.headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok()),
            );
            if status.as_u16() == 429 {
                let wait = retry_after.unwrap_or(DEFAULT_RETRY_AFTER);
                if retried || wait > MAX_RETRY_AFTER {
                    return Err(EmbedError::RateLimited {
                        url: self.shown_url.clone(),
                        retry_after,
                    });
                }
                retried = true;
                drop(resp);
                tokio::time::sleep(wait).await;
                continue;
            }
            let location = resp
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(|l| redact_url(l).into_owned());
            let text = self.read_body(resp, 64 * 1024).await.unwrap_or_default();
            return Err(self.status_error(status.as_u16(), &text, location));
        }
    }

    /// The body of `resp`, refused past `limit` bytes.
    async fn read_body(
        &self,
        mut resp: reqwest::Response,
        limit: usize,
    ) -> Result<Vec<u8>, EmbedError> {
        let mut buf = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| self.transport_error(&e))? {
            if buf.len() + chunk.len() > limit {
                return Err(self.bad_shape(format!("the answer is over {limit} bytes")));
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(buf)
    }

    /// The vectors of a 2xx body, ordered by their `index`.
    fn parse(&self, bytes: &[u8], n: usize) -> Result<Vec<Vec<f32>>, EmbedError> {
        let resp: Response = serde_json::from_slice(bytes).map_err(|e| {
            self.bad_shape(format!(
                "not an embeddings response ({{\"data\":[{{\"index\",\"embedding\"}}]}}): {e}"
            ))
        })?;
        if resp.data.len() != n {
            return Err(self.bad_shape(format!("{} vectors for {n} inputs", resp.data.len())));
        }
        let mut slots: Vec<Option<Vec<f32>>> = vec![None; n];
        let mut dims = None;
        for item in resp.data {
            let slot = slots
                .get_mut(item.index)
                .ok_or_else(|| self.bad_shape(format!("index {} for {n} inputs", item.index)))?;
            if slot.is_some() {
                return Err(self.bad_shape(format!("index {} twice", item.index)));
            }
            let len = item.embedding.len();
            if len == 0 || len > MAX_DIMS {
                return Err(self.bad_shape(format!(
                    "a vector of {len} dimensions (1..={MAX_DIMS} accepted)"
                )));
            }
            if *dims.get_or_insert(len) != len {
                return Err(self.bad_shape(format!(
                    "vectors of mixed sizes ({} and {len} dimensions)",
                    dims.unwrap_or_default()
                )));
            }
            if item.embedding.iter().any(|x| !x.is_finite()) {
                return Err(self.bad_shape(format!(
                    "vector {} holds a number that is not finite",
                    item.index
                )));
            }
            *slot = Some(item.embedding);
        }
        // Every slot is filled: n items, each in range and none twice.
        Ok(slots.into_iter().flatten().collect())
    }

    fn bad_shape(&self, detail: String) -> EmbedError {
        EmbedError::BadShape {
            url: self.shown_url.clone(),
            detail,
        }
    }

    fn transport_error(&self, e: &reqwest::Error) -> EmbedError {
        if e.is_timeout() {
            return EmbedError::Timeout {
                url: self.shown_url.clone(),
                timeout: self.timeout,
            };
        }
        let mut detail = e.to_string();
        let mut cur = std::error::Error::source(e);
        while let Some(c) = cur {
            detail.push_str(": ");
            detail.push_str(&c.to_string());
            cur = c.source();
        }
        EmbedError::Connect {
            url: self.shown_url.clone(),
            detail: redact_url(&self.scrubber.scrub_str(&detail)).into_owned(),
        }
    }

    /// The error of a non-2xx, non-429 answer.
    fn status_error(&self, status: u16, body: &[u8], location: Option<String>) -> EmbedError {
        let text = String::from_utf8_lossy(body);
        let text = self.scrubber.scrub_str(&text);
        let mut message = provider_message(&text);
        if message.is_empty() {
            message = match (status, location) {
                (300..=399, Some(loc)) => format!(
                    "redirected to `{loc}`, which is not followed (another host); set memory.embeddings.base_url to the final address"
                ),
                _ => "(no error message)".into(),
            };
        }
        if status == 401 || status == 403 {
            let fix = match (&self.key_env, &self.key) {
                (Some(env), Some(_)) => format!(
                    "check the key in the environment variable `{env}` (memory.embeddings.api_key_env)"
                ),
                (Some(env), None) => format!(
                    "the environment variable `{env}` (memory.embeddings.api_key_env) is unset or empty: set it to the key"
                ),
                (None, _) => "no key was sent: set memory.embeddings.api_key_env to the environment variable holding the key".into(),
            };
            return EmbedError::Auth {
                url: self.shown_url.clone(),
                status,
                message,
                fix,
            };
        }
        EmbedError::Status {
            url: self.shown_url.clone(),
            status,
            message,
        }
    }
}

/// The human part of an error body: OpenAI's `error.message`, a bare `error` or `message` or
/// `detail` string, else the text itself; cut to [`MAX_MESSAGE_CHARS`].
fn provider_message(text: &str) -> String {
    let v: Option<serde_json::Value> = serde_json::from_str(text).ok();
    let picked = v.as_ref().and_then(|v| {
        [
            &v["error"]["message"],
            &v["error"],
            &v["message"],
            &v["detail"],
        ]
        .into_iter()
        .find_map(|x| x.as_str())
        .map(str::to_string)
    });
    let s = picked.unwrap_or_else(|| text.trim().to_string());
    match s.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

/// The redirect policy: follow at most [`MAX_REDIRECTS`] hops, each to the host first asked
/// (an `http` to `https` upgrade allowed, never the reverse); otherwise stop and return the 3xx
/// answer, which [`Embedder::embed`] reports.
fn same_host_redirects(attempt: reqwest::redirect::Attempt<'_>) -> reqwest::redirect::Action {
    let (Some(first), Some(last)) = (attempt.previous().first(), attempt.previous().last()) else {
        return attempt.stop();
    };
    let next = attempt.url();
    let same_host = first.host_str() == next.host_str();
    // Against the hop before: an upgrade to https is never undone by a later hop.
    let secure_enough = next.scheme() == last.scheme() || next.scheme() == "https";
    if attempt.previous().len() > MAX_REDIRECTS || !same_host || !secure_enough {
        attempt.stop()
    } else {
        attempt.follow()
    }
}

/// 64-bit FNV-1a of `text`'s UTF-8 bytes: stable across runs, platforms and versions (it keys
/// the vectors kept on disk).
pub fn chunk_hash(text: &str) -> u64 {
    fnv1a(text.as_bytes())
}

/// 64-bit FNV-1a of `bytes` (the memory module's one stable hash: chunk keys, user
/// directory suffixes, index directory names).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME))
}

/// One embedded chunk.
#[derive(Clone, Debug, PartialEq)]
struct Entry {
    start_line: u32,
    end_line: u32,
    hash: u64,
    /// Unit length: cosine similarity is the dot product.
    v: Box<[f32]>,
}

/// The vectors of one root's chunks, keyed by (path, start line, [`chunk_hash`] of the text):
/// an edited file keeps the vectors of its unchanged chunks, and only new or changed chunks
/// are embedded again. Vectors are stored normalised (unit length).
///
/// Memory: `dims × 4` bytes a chunk plus ~40 bytes of key; 10,000 chunks cost 10 MiB at 256
/// dimensions, 30 MiB at 768 and 60 MiB at 1,536.
#[derive(Clone, Debug, PartialEq)]
pub struct Vectors {
    model: String,
    dims: usize,
    /// Entries of each path, in (start line, hash) order.
    files: BTreeMap<Arc<str>, Vec<Entry>>,
    len: usize,
}

/// The first bytes of an encoded [`Vectors`].
const MAGIC: &[u8; 8] = b"CLWFTVEC";
/// The encoding's version; another is refused (the caller embeds again).
const VERSION: u32 = 1;
/// Longest model name or path accepted when decoding (4 KiB).
const MAX_NAME: usize = 4096;

impl Vectors {
    /// An empty store for vectors of `model`, `dims` long.
    pub fn new(model: &str, dims: usize) -> Self {
        Self {
            model: model.to_string(),
            dims,
            files: BTreeMap::new(),
            len: 0,
        }
    }

    /// The model the vectors came from.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Dimensions of every vector.
    pub fn dims(&self) -> usize {
        self.dims
    }

    /// Vectors held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none are held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Approximate heap bytes.
    pub fn bytes(&self) -> usize {
        self.files
            .iter()
            .map(|(p, es)| p.len() + 48 + es.len() * (std::mem::size_of::<Entry>() + self.dims * 4))
            .sum()
    }

    /// Whether the chunk of `path` at `start_line` with text hash `hash` is embedded already.
    pub fn get(&self, path: &str, start_line: u32, hash: u64) -> bool {
        self.files.get(path).is_some_and(|es| {
            es.binary_search_by(|e| (e.start_line, e.hash).cmp(&(start_line, hash)))
                .is_ok()
        })
    }

    /// Keep `v` (normalised) for the chunk of `path` at `start_line..=end_line` with text hash
    /// `hash`, replacing the vector kept for that same key.
    ///
    /// # Errors
    /// `v` is not [`Self::dims`] long, holds a non-finite number, or is all zeros.
    pub fn insert(
        &mut self,
        path: &str,
        start_line: u32,
        end_line: u32,
        hash: u64,
        v: Vec<f32>,
    ) -> Result<(), VectorsError> {
        if v.len() != self.dims {
            return Err(format!(
                "a vector of {} dimensions for a store of {} ({}): the model or memory.embeddings.dimensions changed; embed again",
                v.len(),
                self.dims,
                self.model
            ).into());
        }
        let v = normalise(v).ok_or(VectorsError(
            "a vector that is all zeros or holds a non-finite number".into(),
        ))?;
        let entry = Entry {
            start_line,
            end_line,
            hash,
            v,
        };
        let es = match self.files.get_mut(path) {
            Some(es) => es,
            None => self.files.entry(Arc::from(path)).or_default(),
        };
        match es.binary_search_by(|e| (e.start_line, e.hash).cmp(&(start_line, hash))) {
            Ok(i) => es[i] = entry,
            Err(i) => {
                es.insert(i, entry);
                self.len += 1;
            }
        }
        Ok(())
    }

    /// After `path` was indexed again: drop its vectors whose (start line, hash) is not in
    /// `keep` (the chunks the file has now).
    pub fn retain_path(&mut self, path: &str, keep: &[(u32, u64)]) {
        let Some(es) = self.files.get_mut(path) else {
            return;
        };
        let before = es.len();
        let keep: std::collections::HashSet<(u32, u64)> = keep.iter().copied().collect();
        es.retain(|e| keep.contains(&(e.start_line, e.hash)));
        self.len -= before - es.len();
        if es.is_empty() {
            self.files.remove(path);
        }
    }

    /// Keep only the vectors of the paths `keep` accepts (the documents still indexed).
    pub fn retain_paths(&mut self, mut keep: impl FnMut(&str) -> bool) {
        let mut dropped = 0;
        self.files.retain(|p, es| {
            let k = keep(p);
            if !k {
                dropped += es.len();
            }
            k
        });
        self.len -= dropped;
    }

    /// Drop every vector of `path` (the file is gone).
    pub fn remove_path(&mut self, path: &str) {
        if let Some(es) = self.files.remove(path) {
            self.len -= es.len();
        }
    }

    /// The `max` chunks most similar to `query` (cosine), best first, among the paths starting
    /// with `path_prefix`; ties by path, then start line. Chunks of similarity ≤ 0 (unrelated)
    /// are left out; a query of the wrong size, all zeros or not finite finds nothing.
    pub fn search(&self, query: &[f32], max: usize, path_prefix: Option<&str>) -> Vec<Hit> {
        if query.len() != self.dims || max == 0 {
            return Vec::new();
        }
        let Some(q) = normalise(query.to_vec()) else {
            return Vec::new();
        };
        let mut scored: Vec<(f32, &Arc<str>, &Entry)> = Vec::new();
        for (path, es) in &self.files {
            if path_prefix.is_some_and(|p| !path.starts_with(p)) {
                continue;
            }
            for e in es {
                let s: f32 = e.v.iter().zip(q.iter()).map(|(a, b)| a * b).sum();
                if s > 0.0 {
                    scored.push((s, path, e));
                }
            }
        }
        let order = |a: &(f32, &Arc<str>, &Entry), b: &(f32, &Arc<str>, &Entry)| {
            b.0.total_cmp(&a.0)
                .then_with(|| a.1.cmp(b.1))
                .then_with(|| (a.2.start_line, a.2.hash).cmp(&(b.2.start_line, b.2.hash)))
        };
        if scored.len() > max {
            scored.select_nth_unstable_by(max - 1, order);
            scored.truncate(max);
        }
        scored.sort_unstable_by(order);
        scored
            .into_iter()
            .map(|(score, path, e)| Hit {
                path: Arc::clone(path),
                start_line: e.start_line,
                end_line: e.end_line,
                score,
            })
            .collect()
    }

    /// The store as bytes (little-endian): magic, version, model, dims, then each path with
    /// its entries, then a CRC-32 of all that precedes it.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.bytes());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        put_str(&mut out, &self.model);
        put_u32(&mut out, self.dims);
        put_u32(&mut out, self.files.len());
        for (path, es) in &self.files {
            put_str(&mut out, path);
            put_u32(&mut out, es.len());
            for e in es {
                out.extend_from_slice(&e.start_line.to_le_bytes());
                out.extend_from_slice(&e.end_line.to_le_bytes());
                out.extend_from_slice(&e.hash.to_le_bytes());
                for x in e.v.iter() {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// A store from [`Self::encode`]'s bytes.
    ///
    /// # Errors
    /// Another format or version, a checksum mismatch, truncated or trailing bytes, sizes out
    /// of range, paths out of order: the caller drops the file and embeds again. Nothing is
    /// allocated beyond what the bytes themselves hold.
    pub fn decode(bytes: &[u8]) -> Result<Self, VectorsError> {
        let body_len = bytes
            .len()
            .checked_sub(4)
            .ok_or("vectors: truncated (no checksum)")?;
        let (body, crc) = bytes.split_at(body_len);
        if !body.starts_with(MAGIC) {
            return Err("vectors: not a vector file (bad magic)".into());
        }
        let mut r = Reader {
            buf: &body[MAGIC.len()..],
        };
        let version = r.u32()?;
        if version != VERSION {
            return Err(
                format!("vectors: format version {version}, this build reads {VERSION}").into(),
            );
        }
        if crc32fast::hash(body).to_le_bytes() != crc {
            return Err("vectors: checksum mismatch (corrupt or truncated)".into());
        }
        let model = r.str()?;
        let dims = r.u32()? as usize;
        if dims == 0 || dims > MAX_DIMS {
            return Err(format!("vectors: {dims} dimensions (1..={MAX_DIMS})").into());
        }
        let mut out = Vectors::new(&model, dims);
        let nfiles = r.u32()?;
        let entry_bytes = 16 + dims * 4;
        for _ in 0..nfiles {
            let path: Arc<str> = Arc::from(r.str()?);
            if out
                .files
                .keys()
                .next_back()
                .is_some_and(|last| *last >= path)
            {
                return Err(format!("vectors: path `{path}` out of order or repeated").into());
            }
            let n = r.u32()? as usize;
            if n == 0 || n.checked_mul(entry_bytes).is_none_or(|b| b > r.buf.len()) {
                return Err(format!("vectors: bad entry count {n} for `{path}`").into());
            }
            let mut es: Vec<Entry> = Vec::with_capacity(n);
            for _ in 0..n {
                let start_line = r.u32()?;
                let end_line = r.u32()?;
                let hash = r.u64()?;
                let raw = r.take(dims * 4)?;
                let v: Box<[f32]> = raw
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                if v.iter().any(|x| !x.is_finite()) {
                    return Err(format!("vectors: a non-finite number in `{path}`").into());
                }
                if es
                    .last()
                    .is_some_and(|l| (l.start_line, l.hash) >= (start_line, hash))
                {
                    return Err(format!("vectors: entries of `{path}` out of order").into());
                }
                es.push(Entry {
                    start_line,
                    end_line,
                    hash,
                    v,
                });
            }
            out.len += es.len();
            out.files.insert(path, es);
        }
        if !r.buf.is_empty() {
            return Err(format!("vectors: {} trailing bytes", r.buf.len()).into());
        }
        Ok(out)
    }
}

/// `v` scaled to unit length; `None` when it is all zeros or not finite.
fn normalise(mut v: Vec<f32>) -> Option<Box<[f32]>> {
    let norm = v
        .iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt();
    if !norm.is_finite() || norm == 0.0 {
        return None;
    }
    for x in &mut v {
        *x = (f64::from(*x) / norm) as f32;
    }
    Some(v.into_boxed_slice())
}

fn put_u32(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u32(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

/// Why vectors were refused: one of the wrong size, or a vector file that does not decode (the
/// caller drops it and embeds again).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct VectorsError(String);

impl From<String> for VectorsError {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for VectorsError {
    fn from(s: &str) -> Self {
        Self(s.to_string())
    }
}

/// A bounds-checked cursor over the encoded bytes.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], VectorsError> {
        if n > self.buf.len() {
            return Err("vectors: truncated".into());
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, VectorsError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, VectorsError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn str(&mut self) -> Result<String, VectorsError> {
        let n = self.u32()? as usize;
        if n > MAX_NAME {
            return Err(format!("vectors: a name of {n} bytes (at most {MAX_NAME})").into());
        }
        String::from_utf8(self.take(n)?.to_vec())
            .map_err(|_| VectorsError("vectors: a name is not UTF-8".into()))
    }
}

/// The `k` of reciprocal rank fusion (60, the value of Cormack et al. and of most hybrid
/// search engines): damps the weight of the very first ranks.
pub const RRF_K: f32 = 60.0;

/// Reciprocal rank fusion of the keyword and vector rankings of the same chunks (the same path
/// and start line are the same chunk): each chunk scores the sum of `1 / (RRF_K + rank)` over
/// the lists it is in (rank from 1; a chunk repeated in one list counts at its best rank).
/// Best first, `max` kept; ties go to the chunk ranked in the keyword list (then the better
/// keyword rank), then by path and start line. The line range is the keyword hit's when both
/// have the chunk.
pub fn fuse(keyword: &[Hit], vector: &[Hit], max: usize) -> Vec<Hit> {
    struct Fused<'a> {
        hit: &'a Hit,
        score: f32,
        keyword_rank: usize,
    }
    let mut by_chunk: HashMap<(&str, u32), Fused<'_>> = HashMap::new();
    for (list, is_keyword) in [(keyword, true), (vector, false)] {
        let mut seen = std::collections::HashSet::new();
        for (i, hit) in list.iter().enumerate() {
            let key = (&*hit.path, hit.start_line);
            if !seen.insert(key) {
                continue;
            }
            let add = 1.0 / (RRF_K + (i + 1) as f32);
            let f = by_chunk.entry(key).or_insert(Fused {
                hit,
                score: 0.0,
                keyword_rank: usize::MAX,
            });
            f.score += add;
            if is_keyword {
                f.keyword_rank = i;
            }
        }
    }
    let mut fused: Vec<Fused<'_>> = by_chunk.into_values().collect();
    fused.sort_unstable_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| a.keyword_rank.cmp(&b.keyword_rank))
            .then_with(|| a.hit.path.cmp(&b.hit.path))
            .then_with(|| a.hit.start_line.cmp(&b.hit.start_line))
    });
    fused
        .into_iter()
        .take(max)
        .map(|f| Hit {
            score: f.score,
            ..f.hit.clone()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn hit(path: &str, line: u32) -> Hit {
        Hit {
            path: Arc::from(path),
            start_line: line,
            end_line: line + 1,
            score: 1.0,
        }
    }

    fn ids(hits: &[Hit]) -> Vec<(String, u32)> {
        hits.iter()
            .map(|h| (h.path.to_string(), h.start_line))
            .collect()
    }

    fn settings() -> EmbeddingSettings {
        EmbeddingSettings {
            base_url: "https://api.openai.com/v1".into(),
            model: "text-embedding-3-small".into(),
            api_key_env: Some("OPENAI_API_KEY".into()),
            dimensions: None,
            timeout_secs: 10,
            batch: 64,
        }
    }

    #[test]
    fn chunk_hash_is_fnv1a_and_stable() {
        // The published FNV-1a 64 test vectors: a change here orphans every stored vector.
        assert_eq!(chunk_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(chunk_hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(chunk_hash("foobar"), 0x8594_4171_f739_67e8);
        assert_ne!(chunk_hash("car mechanic"), chunk_hash("car mechanic "));
    }

    #[test]
    fn fuse_puts_a_chunk_high_in_both_lists_first() {
        let keyword = [hit("a.md", 1), hit("b.md", 1), hit("c.md", 1)];
        let vector = [hit("d.md", 1), hit("b.md", 1), hit("a.md", 9)];
        let f = fuse(&keyword, &vector, 10);
        // b: 1/62 + 1/62 beats a (1/61) and d (1/61).
        assert_eq!(f[0].path.as_ref(), "b.md");
        assert!((f[0].score - 2.0 / 62.0).abs() < 1e-6);
        // Only-in-one chunks still rank, by their rank; a tie at rank 1 goes to the keyword
        // list's chunk.
        assert_eq!(
            ids(&f),
            vec![
                ("b.md".into(), 1),
                ("a.md".into(), 1),
                ("d.md".into(), 1),
                ("c.md".into(), 1),
                ("a.md".into(), 9),
            ]
        );
        // `max` keeps the best.
        assert_eq!(ids(&fuse(&keyword, &vector, 2)), ids(&f[..2]));
    }

    #[test]
    fn fuse_ties_are_deterministic_and_repeats_count_once() {
        // Same ranks in the vector list only: path, then start line, decides.
        let vector = [hit("z.md", 1)];
        let vector2 = [hit("a.md", 5), hit("a.md", 5), hit("a.md", 2)];
        let f = fuse(&[], &vector2, 10);
        assert_eq!(ids(&f), vec![("a.md".into(), 5), ("a.md".into(), 2)]);
        let f = fuse(&vector, &[], 10);
        assert_eq!(ids(&f), vec![("z.md".into(), 1)]);
        // Two chunks each first in one list: the keyword one wins; then the rest by path.
        let a = fuse(&[hit("m.md", 1)], &[hit("b.md", 1)], 10);
        assert_eq!(ids(&a), vec![("m.md".into(), 1), ("b.md".into(), 1)]);
        // Input order of the HashMap never shows: the same call gives the same answer.
        for _ in 0..20 {
            assert_eq!(fuse(&[hit("m.md", 1)], &[hit("b.md", 1)], 10), a);
        }
        assert!(fuse(&[], &[], 10).is_empty());
        // The keyword hit's line range is kept.
        let mut k = hit("x.md", 3);
        k.end_line = 40;
        let f = fuse(&[k], &[hit("x.md", 3)], 1);
        assert_eq!(f[0].end_line, 40);
    }

    #[test]
    fn vectors_search_best_first_with_prefix_and_ties() {
        let mut v = Vectors::new("m", 3);
        v.insert("memory/b.md", 1, 2, 10, vec![1.0, 0.0, 0.0])
            .unwrap();
        v.insert("memory/a.md", 7, 9, 11, vec![2.0, 0.0, 0.0])
            .unwrap(); // same direction
        v.insert("MEMORY.md", 1, 3, 12, vec![1.0, 1.0, 0.0])
            .unwrap();
        v.insert("memory/c.md", 1, 1, 13, vec![0.0, 0.0, 1.0])
            .unwrap(); // orthogonal
        v.insert("memory/d.md", 1, 1, 14, vec![-1.0, 0.0, 0.0])
            .unwrap(); // opposite
        assert_eq!(v.len(), 5);
        let q = [3.0, 0.0, 0.0];
        let hits = v.search(&q, 10, None);
        // a and b tie at 1.0 (normalised): path order; MEMORY.md at 0.707; c and d left out.
        assert_eq!(
            ids(&hits),
            vec![
                ("memory/a.md".into(), 7),
                ("memory/b.md".into(), 1),
                ("MEMORY.md".into(), 1)
            ]
        );
        assert!((hits[0].score - 1.0).abs() < 1e-6);
        assert!((hits[2].score - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-6);
        assert_eq!(hits[0].end_line, 9);
        assert_eq!(ids(&v.search(&q, 1, None)), vec![("memory/a.md".into(), 7)]);
        assert_eq!(
            ids(&v.search(&q, 10, Some("MEMORY"))),
            vec![("MEMORY.md".into(), 1)]
        );
        // A query of the wrong size or all zeros finds nothing.
        assert!(v.search(&[1.0, 0.0], 10, None).is_empty());
        assert!(v.search(&[0.0, 0.0, 0.0], 10, None).is_empty());
        assert!(v.search(&q, 0, None).is_empty());
    }

    #[test]
    fn vectors_insert_rejects_wrong_dims_and_bad_numbers() {
        let mut v = Vectors::new("text-embedding-3-small", 4);
        let e = v
            .insert("a.md", 1, 1, 1, vec![1.0; 3])
            .unwrap_err()
            .to_string();
        assert!(e.contains("3 dimensions") && e.contains("of 4"), "{e}");
        assert!(v.insert("a.md", 1, 1, 1, vec![0.0; 4]).is_err());
        assert!(v
            .insert("a.md", 1, 1, 1, vec![f32::NAN, 1.0, 0.0, 0.0])
            .is_err());
        assert!(v.is_empty());
        // The same key replaces, not adds.
        v.insert("a.md", 1, 1, 1, vec![1.0, 0.0, 0.0, 0.0]).unwrap();
        v.insert("a.md", 1, 2, 1, vec![0.0, 1.0, 0.0, 0.0]).unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(v.search(&[0.0, 1.0, 0.0, 0.0], 5, None)[0].end_line, 2);
    }

    #[test]
    fn retain_and_remove_drop_only_what_they_name() {
        let mut v = Vectors::new("m", 2);
        for (line, hash) in [(1, 100), (5, 200), (9, 300)] {
            v.insert("a.md", line, line + 3, hash, vec![1.0, 0.5])
                .unwrap();
        }
        v.insert("b.md", 1, 2, 400, vec![0.5, 1.0]).unwrap();
        assert!(v.get("a.md", 5, 200));
        // a.md re-chunked: the chunk at 5 changed (new hash), 1 and 9 kept.
        v.retain_path("a.md", &[(1, 100), (5, 201), (9, 300)]);
        assert!(v.get("a.md", 1, 100) && v.get("a.md", 9, 300));
        assert!(!v.get("a.md", 5, 200) && !v.get("a.md", 5, 201));
        assert_eq!(v.len(), 3);
        v.retain_path("nope.md", &[]);
        v.remove_path("b.md");
        assert!(!v.get("b.md", 1, 400));
        assert_eq!(v.len(), 2);
        v.retain_path("a.md", &[]);
        assert!(v.is_empty());
        assert!(v.search(&[1.0, 1.0], 10, None).is_empty());
    }

    #[test]
    fn encode_decode_round_trip() {
        let mut v = Vectors::new("text-embedding-3-small", 3);
        v.insert(
            "memory/2026-11-23.md",
            1,
            4,
            chunk_hash("x"),
            vec![0.1, 0.2, 0.3],
        )
        .unwrap();
        v.insert(
            "memory/2026-11-23.md",
            6,
            8,
            chunk_hash("y"),
            vec![-0.5, 0.2, 0.0],
        )
        .unwrap();
        v.insert("MEMORY.md", 1, 2, chunk_hash("z"), vec![1.0, 0.0, 0.0])
            .unwrap();
        let bytes = v.encode();
        let back = Vectors::decode(&bytes).unwrap();
        assert_eq!(back, v);
        assert_eq!(back.model(), "text-embedding-3-small");
        assert_eq!(back.dims(), 3);
        assert_eq!(back.len(), 3);
        assert_eq!(back.encode(), bytes);
        let empty = Vectors::new("m", 8);
        assert_eq!(Vectors::decode(&empty.encode()).unwrap(), empty);
    }

    #[test]
    fn decode_refuses_garbage_truncation_and_corruption() {
        let mut v = Vectors::new("m", 4);
        v.insert("a.md", 1, 2, 7, vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let bytes = v.encode();
        // Every truncation fails cleanly.
        for n in 0..bytes.len() {
            assert!(Vectors::decode(&bytes[..n]).is_err(), "truncated to {n}");
        }
        // Every single flipped byte fails (magic, version, checksum or CRC).
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(Vectors::decode(&b).is_err(), "byte {i} flipped");
        }
        assert!(Vectors::decode(b"hello, world").is_err());
        assert!(Vectors::decode(&[]).is_err());
        let mut trailing = bytes.clone();
        trailing.insert(bytes.len() - 4, 0);
        assert!(Vectors::decode(&trailing).is_err());
        // A valid checksum over absurd counts: refused before any allocation of that size.
        let mut forged = Vec::new();
        forged.extend_from_slice(MAGIC);
        forged.extend_from_slice(&VERSION.to_le_bytes());
        put_str(&mut forged, "m");
        put_u32(&mut forged, 4);
        put_u32(&mut forged, 1);
        put_str(&mut forged, "a.md");
        put_u32(&mut forged, u32::MAX as usize);
        let crc = crc32fast::hash(&forged);
        forged.extend_from_slice(&crc.to_le_bytes());
        let e = Vectors::decode(&forged).unwrap_err().to_string();
        assert!(e.contains("entry count"), "{e}");
        // Another version is refused by name.
        let mut other = bytes;
        other[8] = 2;
        assert!(Vectors::decode(&other)
            .unwrap_err()
            .to_string()
            .contains("version 2"));
    }

    #[test]
    fn settings_check_names_the_key() {
        settings().check().unwrap();
        type Mutate = fn(&mut EmbeddingSettings);
        let cases: Vec<(Mutate, &str)> = vec![
            (
                |s| s.base_url = "not a url".into(),
                "memory.embeddings.base_url",
            ),
            (
                |s| s.base_url = "ftp://x/v1".into(),
                "memory.embeddings.base_url",
            ),
            (|s| s.model = " ".into(), "memory.embeddings.model"),
            (
                |s| s.api_key_env = Some("sk-abc".into()),
                "memory.embeddings.api_key_env",
            ),
            (
                |s| s.api_key_env = Some(String::new()),
                "memory.embeddings.api_key_env",
            ),
            (|s| s.dimensions = Some(0), "memory.embeddings.dimensions"),
            (
                |s| s.dimensions = Some(100_000),
                "memory.embeddings.dimensions",
            ),
            (|s| s.timeout_secs = 0, "memory.embeddings.timeout_secs"),
            (|s| s.batch = 0, "memory.embeddings.batch"),
            (|s| s.batch = 5000, "memory.embeddings.batch"),
        ];
        for (mutate, key) in cases {
            let mut s = settings();
            mutate(&mut s);
            let e = s.check().unwrap_err().to_string();
            assert!(e.starts_with(key), "{e}");
            assert!(Embedder::new(&s, None).is_err());
        }
        // The defaults, and unknown keys refused.
        let s: EmbeddingSettings = serde_json::from_str(
            r#"{"base_url":"http://127.0.0.1:11434/v1","model":"nomic-embed-text"}"#,
        )
        .unwrap();
        assert_eq!((s.timeout_secs, s.batch, s.dimensions), (10, 64, None));
        assert!(serde_json::from_str::<EmbeddingSettings>(
            r#"{"base_url":"http://x/v1","model":"m","api_key":"sk-1"}"#
        )
        .is_err());
    }

    #[test]
    fn debug_and_url_never_show_the_key() {
        let key = "sk-live-0123456789abcdef";
        let mut s = settings();
        s.base_url = "https://user:hunter2hunter2@api.example.com/v1?api-key=qwertyuiop123".into();
        let e = Embedder::new(&s, Some(Secret::new(key))).unwrap();
        let d = format!("{e:?}");
        assert!(
            !d.contains(key) && !d.contains("hunter2hunter2") && !d.contains("qwertyuiop123"),
            "{d}"
        );
        assert!(d.contains("Secret(***)"), "{d}");
        assert_eq!(
            e.url,
            "https://user:hunter2hunter2@api.example.com/v1/embeddings?api-key=qwertyuiop123"
        );
        assert_eq!(e.model(), "text-embedding-3-small");
    }

    #[test]
    fn a_key_echoed_by_the_provider_is_scrubbed() {
        let key = "sk-live-0123456789abcdef";
        let e = Embedder::new(&settings(), Some(Secret::new(key))).unwrap();
        let body = format!(r#"{{"error":{{"message":"Incorrect API key provided: {key}."}}}}"#);
        let err = e.status_error(401, body.as_bytes(), None);
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains(key), "{shown}");
        assert!(shown.contains("Incorrect API key provided"), "{shown}");
        assert!(shown.contains("`OPENAI_API_KEY`"), "{shown}");
        let err = e.status_error(500, body.as_bytes(), None);
        assert!(!format!("{err} {err:?}").contains(key));
    }

    #[test]
    fn inputs_are_cut_at_a_character_boundary_and_the_client_is_shareable() {
        assert_eq!(cut("abc", 8), "abc");
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("héllo", 3), "hé");
        fn shareable<T: Send + Sync>() {}
        shareable::<Embedder>();
        shareable::<Vectors>();
        fn send<T: Send>(_: &T) {}
        let e = Embedder::new(&settings(), None).unwrap();
        let inputs = vec!["x".to_string()];
        send(&e.embed(&inputs));
    }

    #[test]
    fn provider_messages_are_picked_and_cut() {
        assert_eq!(
            provider_message(r#"{"error":{"message":"bad key","type":"invalid_request_error"}}"#),
            "bad key"
        );
        assert_eq!(
            provider_message(r#"{"error":"model not found"}"#),
            "model not found"
        );
        assert_eq!(provider_message("  plain text\n"), "plain text");
        assert_eq!(
            provider_message(&"é".repeat(400)).chars().count(),
            MAX_MESSAGE_CHARS + 1
        );
    }
}
