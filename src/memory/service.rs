//! The memory search service: one keyword index per memory root (the agent's workspace, and
//! each chat user's `users/<id>` directory), loaded on first use from its snapshot, brought up
//! to date by a reconcile walk that re-indexes only the files whose stamp changed, and saved
//! back off the hot path.
//!
//! Freshness: a search re-walks a root (one `stat` per document) when the last walk is older
//! than [`RECHECK_AFTER`] or a memory tool wrote since; it waits for that walk at most
//! [`BUILD_WAIT`] and otherwise answers from what is indexed, flagged `indexing`. Nothing here
//! runs unless a memory search is made: an agent that never searches pays no memory and no I/O.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use serde::Serialize;
use tokio::sync::watch;

use super::embed::fnv1a;
use super::embed::{chunk_hash, fuse, Embedder, Vectors};
use super::index::{Hit, Index, IndexStats, Stamp};
use super::settings::MemorySettings;
use crate::store::Store;
use crate::tools::memory::{read_up_to, scope_workspace};
use crate::tools::shared_docs::MemoryDocs;
use crate::tools::{ToolContext, ToolError, Workspace};
use crate::types::SessionKey;
use crate::types::{MutexExt, RwLockExt};

/// A root is walked again before a search when its last walk is older than this.
pub const RECHECK_AFTER: Duration = Duration::from_secs(10);
/// Longest a search waits for a walk (the first build of a large corpus) before answering
/// from what is indexed so far.
pub const BUILD_WAIT: Duration = Duration::from_secs(3);
/// A changed index is saved this long after the change (changes in between share the write).
const SAVE_DELAY: Duration = Duration::from_secs(2);
/// Most memory documents indexed per root.
pub const MAX_FILES: usize = 50_000;
/// Deepest directory level under `memory/` walked.
const MAX_DEPTH: usize = 8;
/// Longest a search waits for the query's embedding before ranking by keywords alone.
const QUERY_EMBED_WAIT: Duration = Duration::from_secs(2);
/// A failed embedding pass is tried again this long after, at the next search.
const EMBED_RETRY: Duration = Duration::from_secs(60);
/// Chunks sent per embedding pass request group (the client batches further).
const EMBED_GROUP: usize = 256;
/// Longest snippet returned per hit (bytes).
const SNIPPET_BYTES: usize = 320;
/// The pseudo-directory of past conversations in results (`sessions/<key>`).
pub const TRANSCRIPTS: &str = "sessions/";

/// One result of [`MemoryService::search`].
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SearchHit {
    /// Workspace-relative path (`memory/MEMORY.md`, `users/telegram-42/memory/x.md`,
    /// `sessions/<key>` for a past conversation): what `memory_get` takes.
    pub path: String,
    /// First line of the match.
    pub start_line: u32,
    /// Last line (inclusive).
    pub end_line: u32,
    /// Relevance, higher is better (rounded to 4 decimals): BM25, or in hybrid mode the fused
    /// reciprocal-rank score.
    pub score: f64,
    /// The matching text, cut to about 300 bytes around the first query word.
    pub snippet: String,
}

/// What a search found.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SearchOutcome {
    /// Best first.
    pub results: Vec<SearchHit>,
    /// The index was still being built: results may be missing.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub indexing: bool,
    /// `keyword` (BM25 alone) or `hybrid` (fused with the embeddings' ranking).
    pub mode: &'static str,
    /// Why a search with embeddings configured ranked by keywords alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Figures of the indexes for `weft status` and `weft memory`.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct MemoryStats {
    /// `user` or `agent`.
    pub scope: &'static str,
    /// Whether past conversations are searched.
    pub search_transcripts: bool,
    /// Indexes (the agent's, one per user, past conversations).
    pub indexes: usize,
    /// Documents indexed.
    pub documents: usize,
    /// Chunks indexed.
    pub chunks: usize,
    /// Snapshot bytes on disk.
    pub index_bytes: u64,
    /// When an index was last saved (ms since the epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_ms: Option<u64>,
}

#[derive(Default)]
struct RootState {
    loaded: bool,
    running: bool,
    last: Option<Instant>,
    seen_gen: u64,
    save_pending: bool,
}

/// One indexed root.
struct Root {
    /// Its name in the index directory: `agent`, `user-<dir>` or `sessions-…`.
    name: String,
    /// The agent workspace it belongs to.
    ws: Arc<Workspace>,
    /// Where its snapshot and vectors are saved.
    dir: PathBuf,
    /// What it indexes.
    kind: RootKind,
    index: RwLock<Index>,
    state: Mutex<RootState>,
    /// Completed walks (waited on by searches).
    done: watch::Sender<u64>,
    /// Dense vectors of its chunks (hybrid search), loaded with the first embedding pass.
    vectors: RwLock<Option<Vectors>>,
    /// An embedding pass is running.
    embedding: Mutex<bool>,
    /// A pass stopped on a passing failure (rate limit, timeout, 5xx): run again after this.
    embed_retry: Mutex<Option<Instant>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum RootKind {
    /// Memory documents of the workspace (`None`) or of a user directory.
    Files(Option<String>),
    /// Past conversations whose key starts with this prefix (`""`: all).
    Transcripts(String),
}

/// The memory search service (every workspace it is asked about: each has its own indexes).
pub struct MemoryService {
    /// The state directory the snapshots go beneath.
    home: PathBuf,
    settings: MemorySettings,
    store: Option<Store>,
    max_file_bytes: u64,
    roots: Mutex<BTreeMap<String, Arc<Root>>>,
    /// The embeddings client (hybrid search), when `memory.embeddings` is set.
    embedder: Option<Arc<Embedder>>,
    /// Why embedding stopped for good (a refused key, a bad answer): searches are keyword-only.
    embed_broken: Mutex<Option<String>>,
    /// The daemon's memory documents: their write count tells when to look at the files again.
    docs: MemoryDocs,
}

impl std::fmt::Debug for MemoryService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryService")
            .field("home", &self.home)
            .finish_non_exhaustive()
    }
}

impl MemoryService {
    /// The service keeping snapshots beneath the state directory `home` (see
    /// [`Self::index_dir_for`]), reading past conversations from `store`
    /// when `settings.search_transcripts`.
    pub fn new(home: PathBuf, settings: MemorySettings, store: Option<Store>) -> Self {
        let embedder = settings.embeddings.as_ref().and_then(|e| {
            match Embedder::new(e, settings.embeddings_key.clone()) {
                Ok(em) => Some(Arc::new(em)),
                Err(err) => {
                    tracing::warn!(error = %err, "memory search without embeddings");
                    None
                }
            }
        });
        Self {
            home,
            settings,
            store,
            max_file_bytes: crate::tools::fs::DEFAULT_MEMORY_MAX_BYTES,
            roots: Mutex::new(BTreeMap::new()),
            embedder,
            embed_broken: Mutex::new(None),
            docs: MemoryDocs::default(),
        }
    }

    /// Watching the writes of the daemon's memory documents `docs` (given to the tools that
    /// write them too), so a search after a write sees it.
    #[must_use]
    pub fn with_docs(mut self, docs: MemoryDocs) -> Self {
        self.docs = docs;
        self
    }

    /// The memory documents this service watches (the tools that write them get the same).
    pub fn docs(&self) -> &MemoryDocs {
        &self.docs
    }

    /// Index at most `max` bytes of each document (the memory tools' limit).
    #[must_use]
    pub fn with_max_file_bytes(mut self, max: u64) -> Self {
        self.max_file_bytes = max;
        self
    }

    /// The settings in force.
    pub fn settings(&self) -> &MemorySettings {
        &self.settings
    }

    /// Where the snapshots of `workspace` live beneath the state directory `home`:
    /// `memory-index/<hash of the workspace path>`.
    pub fn index_dir_for(home: &Path, workspace: &Path) -> PathBuf {
        let ws = crate::tools::protected::canonical(workspace);
        let h = fnv1a(ws.as_os_str().as_encoded_bytes());
        home.join("memory-index").join(format!("{h:016x}"))
    }

    fn root(&self, ws: &Arc<Workspace>, kind: RootKind) -> Arc<Root> {
        let name = match &kind {
            RootKind::Files(None) => "agent".to_string(),
            RootKind::Files(Some(dir)) => format!("user-{}", dir.rsplit('/').next().unwrap_or(dir)),
            RootKind::Transcripts(p) if p.is_empty() => "sessions".to_string(),
            RootKind::Transcripts(p) => format!("sessions-{:016x}", fnv1a(p.as_bytes())),
        };
        let key = format!("{}\0{name}", ws.root().display());
        let mut roots = self.roots.locked();
        roots
            .entry(key)
            .or_insert_with(|| {
                Arc::new(Root {
                    dir: Self::index_dir_for(&self.home, ws.root()),
                    ws: ws.clone(),
                    name,
                    kind,
                    index: RwLock::new(Index::new()),
                    state: Mutex::new(RootState::default()),
                    done: watch::channel(0).0,
                    vectors: RwLock::new(None),
                    embedding: Mutex::new(false),
                    embed_retry: Mutex::new(None),
                })
            })
            .clone()
    }

    /// The roots a caller searches: the agent's documents, the user's own (when they have a
    /// directory), their past conversations (when enabled).
    fn roots_for(&self, ctx: &ToolContext) -> Vec<Arc<Root>> {
        let ws = &ctx.workspace;
        let mut out = vec![self.root(ws, RootKind::Files(None))];
        if let Some(dir) = &ctx.user_dir {
            let exists = ws
                .users_dir()
                .is_some_and(|u| u.join(super::scope::user_name(dir)).is_dir());
            if exists {
                out.push(self.root(ws, RootKind::Files(Some(dir.to_string()))));
            }
        }
        if self.settings.search_transcripts && self.store.is_some() {
            out.push(self.root(ws, RootKind::Transcripts(transcript_prefix(ctx))));
        }
        out
    }

    /// Search the memory `ctx` may see for `query`.
    ///
    /// # Errors
    /// When a root cannot be read at all.
    pub async fn search(
        self: &Arc<Self>,
        ctx: &ToolContext,
        query: &str,
        max: usize,
        path_prefix: Option<&str>,
    ) -> Result<SearchOutcome, ToolError> {
        let roots = self.roots_for(ctx);
        let mut indexing = false;
        for r in &roots {
            indexing |= !self.fresh(r).await;
        }
        let (qvec, note) = match self.query_vector(&roots, query).await {
            Ok(v) => (v, None),
            Err(why) => (None, Some(why)),
        };
        let hybrid = qvec.is_some();
        let me = self.clone();
        let query = query.to_string();
        let prefix = path_prefix.map(str::to_string);
        let results = tokio::task::spawn_blocking(move || {
            me.search_blocking(&roots, &query, qvec.as_deref(), max, prefix.as_deref())
        })
        .await
        .map_err(|e| ToolError::ExecutionFailed(format!("memory search failed: {e}")))??;
        Ok(SearchOutcome {
            results,
            indexing,
            mode: if hybrid { "hybrid" } else { "keyword" },
            note,
        })
    }

    /// The query's vector, when hybrid search is on and some root has vectors (`Ok(None)`
    /// otherwise); `Err(why)` (keyword search alone) when embedding is broken, the endpoint
    /// fails or takes longer than [`QUERY_EMBED_WAIT`].
    async fn query_vector(
        &self,
        roots: &[Arc<Root>],
        query: &str,
    ) -> Result<Option<Vec<f32>>, String> {
        let Some(embedder) = self.embedder.as_ref() else {
            return Ok(None);
        };
        if let Some(why) = &*self.embed_broken.locked() {
            return Err(format!("embeddings stopped ({why}); keyword ranking only"));
        }
        let any = roots.iter().any(|r| {
            r.vectors
                .read_locked()
                .as_ref()
                .is_some_and(|v| !v.is_empty())
        });
        if !any {
            return Ok(None);
        }
        let q = [query.to_string()];
        match tokio::time::timeout(QUERY_EMBED_WAIT, embedder.embed(&q)).await {
            Ok(Ok(mut v)) => Ok(v.pop()),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "query not embedded; keyword search only");
                Err(format!(
                    "the query could not be embedded ({}); keyword ranking only",
                    e.kind()
                ))
            }
            Err(_) => {
                tracing::warn!("query embedding timed out; keyword search only");
                Err("the embeddings endpoint did not answer in 2 s; keyword ranking only".into())
            }
        }
    }

    fn search_blocking(
        &self,
        roots: &[Arc<Root>],
        query: &str,
        qvec: Option<&[f32]>,
        max: usize,
        prefix: Option<&str>,
    ) -> Result<Vec<SearchHit>, ToolError> {
        let mut all: Vec<(Arc<Root>, Hit)> = Vec::new();
        for r in roots {
            let keyword = r
                .index
                .read_locked()
                .search(query, max.saturating_mul(2), prefix);
            let hits = match (qvec, &*r.vectors.read_locked()) {
                (Some(q), Some(v)) if !v.is_empty() => {
                    fuse(&keyword, &v.search(q, max.saturating_mul(2), prefix), max)
                }
                _ => keyword,
            };
            all.extend(hits.into_iter().map(|h| (r.clone(), h)));
        }
        all.sort_by(|a, b| {
            b.1.score
                .total_cmp(&a.1.score)
                .then_with(|| a.1.path.cmp(&b.1.path))
                .then_with(|| a.1.start_line.cmp(&b.1.start_line))
        });
        all.truncate(max);
        let words = query_words(query);
        let mut out = Vec::with_capacity(all.len());
        // One read per document, however many of its chunks matched.
        let mut texts: BTreeMap<String, Option<String>> = BTreeMap::new();
        for (root, h) in all {
            let path = display_path(&root.kind, &h.path);
            let text = match texts.get(&path) {
                Some(t) => t.clone(),
                None => {
                    let t = self.document_text(&root, &h.path).ok();
                    texts.insert(path.clone(), t.clone());
                    t
                }
            };
            let Some(text) = text else { continue };
            out.push(SearchHit {
                snippet: snippet(&text, h.start_line, h.end_line, &words),
                path,
                start_line: h.start_line,
                end_line: h.end_line,
                score: (f64::from(h.score) * 10_000.0).round() / 10_000.0,
            });
        }
        Ok(out)
    }

    /// The text of a document of `kind` (root-relative `path`), as indexed.
    fn document_text(&self, root: &Root, path: &str) -> Result<String, ToolError> {
        match &root.kind {
            RootKind::Files(_) => {
                let ws = files_workspace(root)?;
                read_document(&ws, path, self.max_file_bytes)
            }
            RootKind::Transcripts(_) => {
                let key = path.strip_prefix(TRANSCRIPTS).unwrap_or(path);
                self.transcript_text(key)
            }
        }
    }

    fn transcript_text(&self, key: &str) -> Result<String, ToolError> {
        let store = self
            .store
            .as_ref()
            .ok_or_else(|| ToolError::FileNotFound(format!("{TRANSCRIPTS}{key}")))?;
        let key = SessionKey::parse(key)
            .map_err(|e| ToolError::InvalidPath(format!("{TRANSCRIPTS}{key}: {e}")))?;
        let msgs = store
            .load_transcript(&key)
            .map_err(|e| ToolError::ExecutionFailed(format!("reading the conversation: {e}")))?;
        Ok(render_transcript(&msgs))
    }

    /// Bring `root` up to date if due; whether it is (false: still building after
    /// [`BUILD_WAIT`]).
    async fn fresh(self: &Arc<Self>, root: &Arc<Root>) -> bool {
        let gen = self.docs.writes();
        let mut rx = root.done.subscribe();
        let before = *rx.borrow_and_update();
        let start = {
            let mut st = root.state.locked();
            let due = !st.loaded
                || st.seen_gen != gen
                || st.last.is_none_or(|t| t.elapsed() >= RECHECK_AFTER);
            if !due {
                return true;
            }
            if st.running {
                false
            } else {
                st.running = true;
                st.seen_gen = gen;
                true
            }
        };
        if start {
            let me = self.clone();
            let r = root.clone();
            tokio::task::spawn_blocking(move || {
                let changed = match me.reconcile(&r) {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::warn!(index = %r.name, error = %e, "memory index not brought up to date");
                        0
                    }
                };
                {
                    let mut st = r.state.locked();
                    st.running = false;
                    st.loaded = true;
                    st.last = Some(Instant::now());
                }
                r.done.send_modify(|g| *g += 1);
                if changed > 0 {
                    me.schedule_save(&r);
                }
                let first = r.vectors.read_locked().is_none();
                let retry = r.embed_retry.locked().is_some_and(|t| Instant::now() >= t);
                if changed > 0 || first || retry {
                    me.schedule_embedding(&r);
                }
            });
        }
        let done = tokio::time::timeout(BUILD_WAIT, rx.wait_for(|g| *g > before))
            .await
            .is_ok();
        done
    }

    /// Load the snapshot if not yet loaded, then re-index what changed; how many documents
    /// changed.
    fn reconcile(&self, root: &Root) -> Result<usize, ToolError> {
        let loaded = root.state.locked().loaded;
        if !loaded {
            if let Some(idx) = self.load_snapshot(root) {
                *root.index.write_locked() = idx;
            }
        }
        match &root.kind {
            RootKind::Files(_) => {
                let ws = match files_workspace(root) {
                    Ok(ws) => ws,
                    Err(ToolError::FileNotFound(_)) => {
                        let mut idx = root.index.write_locked();
                        let gone = idx.documents().len();
                        *idx = Index::new();
                        return Ok(gone);
                    }
                    Err(e) => return Err(e),
                };
                reconcile_files(&ws, &root.index, self.max_file_bytes)
            }
            RootKind::Transcripts(prefix) => self.reconcile_transcripts(root, prefix),
        }
    }

    fn reconcile_transcripts(&self, root: &Root, prefix: &str) -> Result<usize, ToolError> {
        let Some(store) = &self.store else {
            return Ok(0);
        };
        let metas = store
            .sessions()
            .map_err(|e| ToolError::ExecutionFailed(format!("listing conversations: {e}")))?;
        let wanted: BTreeMap<String, Stamp> = metas
            .iter()
            .filter(|m| in_scope(m.key.as_str(), prefix))
            .map(|m| {
                (
                    format!("{TRANSCRIPTS}{}", m.key.as_str()),
                    Stamp {
                        size: m.next_seq,
                        mtime_ns: i64::try_from(m.updated_ms).unwrap_or(i64::MAX),
                        ino: 0,
                    },
                )
            })
            .collect();
        let mut changed = 0;
        let stale: Vec<Arc<str>> = {
            let idx = root.index.read_locked();
            idx.documents()
                .into_iter()
                .filter(|(p, _)| !wanted.contains_key(&**p))
                .map(|(p, _)| p)
                .collect()
        };
        if !stale.is_empty() {
            let mut idx = root.index.write_locked();
            for p in &stale {
                idx.remove(p);
            }
            changed += stale.len();
        }
        for (path, stamp) in wanted {
            let known = root.index.read_locked().stamp(&path);
            if known == Some(stamp) {
                continue;
            }
            let key = path.strip_prefix(TRANSCRIPTS).unwrap_or(&path);
            let Ok(text) = self.transcript_text(key) else {
                continue;
            };
            root.index.write_locked().upsert(&path, stamp, &text);
            changed += 1;
        }
        Ok(changed)
    }

    fn load_snapshot(&self, root: &Root) -> Option<Index> {
        let path = snapshot_path(root);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "memory index unreadable; rebuilding it from the files");
                return None;
            }
        };
        match Index::decode(&bytes) {
            Ok(idx) => Some(idx),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "memory index snapshot is damaged; rebuilding it from the files");
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    fn schedule_save(self: &Arc<Self>, root: &Arc<Root>) {
        {
            let mut st = root.state.locked();
            if st.save_pending {
                return;
            }
            st.save_pending = true;
        }
        let me = self.clone();
        let r = root.clone();
        let save = move || {
            r.state.locked().save_pending = false;
            if let Err(e) = me.save(&r) {
                tracing::warn!(index = %r.name, error = %e, "could not save the memory index (it is rebuilt from the files when needed)");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(async move {
                    tokio::time::sleep(SAVE_DELAY).await;
                    let _ = tokio::task::spawn_blocking(save).await;
                });
            }
            Err(_) => save(),
        }
    }

    fn save(&self, root: &Root) -> std::io::Result<()> {
        let path = snapshot_path(root);
        let (bytes, stats) = {
            let idx = root.index.read_locked();
            (idx.encode(), idx.stats())
        };
        std::fs::create_dir_all(&root.dir)?;
        write_replace(&path, &bytes)?;
        record_summary(&root.dir, &root.name, &stats, bytes.len() as u64)
    }
}

impl MemoryService {
    /// Start an embedding pass over `root` in the background (when hybrid search is on and
    /// none is running).
    fn schedule_embedding(self: &Arc<Self>, root: &Arc<Root>) {
        if self.embedder.is_none() || self.embed_broken.locked().is_some() {
            return;
        }
        {
            let mut running = root.embedding.locked();
            if *running {
                return;
            }
            *running = true;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            *root.embedding.locked() = false;
            return;
        };
        let me = self.clone();
        let r = root.clone();
        handle.spawn(async move {
            let retry = match me.embed_pass(&r).await {
                Ok(()) => None,
                Err(e) => {
                    tracing::warn!(index = %r.name, error = %e, "memory embeddings not brought up to date");
                    Some(Instant::now() + EMBED_RETRY)
                }
            };
            *r.embed_retry.locked() = retry;
            *r.embedding.locked() = false;
        });
    }

    /// Embed the chunks of `root` that have no vector yet (and drop the vectors of chunks that
    /// are gone), then save the vectors. Runs off the turns; a search meanwhile uses what is
    /// there.
    async fn embed_pass(self: &Arc<Self>, root: &Arc<Root>) -> Result<(), String> {
        let Some(embedder) = self.embedder.clone() else {
            return Ok(());
        };
        let me = self.clone();
        let r = root.clone();
        let model = embedder.model().to_string();
        // The chunks without a vector, read from the documents as indexed.
        let missing = tokio::task::spawn_blocking(move || me.chunks_to_embed(&r, &model))
            .await
            .map_err(|e| e.to_string())?;
        for group in missing.chunks(EMBED_GROUP) {
            let texts: Vec<String> = group.iter().map(|c| c.text.clone()).collect();
            let vecs = match embedder.embed(&texts).await {
                Ok(v) => v,
                Err(e) => {
                    if !e.is_retryable() {
                        *self.embed_broken.locked() = Some(e.to_string());
                    }
                    return Err(e.to_string());
                }
            };
            let mut guard = root.vectors.write_locked();
            for (c, v) in group.iter().zip(vecs) {
                let store = guard.get_or_insert_with(|| Vectors::new(embedder.model(), v.len()));
                store
                    .insert(&c.path, c.start_line, c.end_line, c.hash, v)
                    .map_err(|e| e.to_string())?;
            }
        }
        let r = root.clone();
        tokio::task::spawn_blocking(move || save_vectors(&r))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }

    /// Load `root`'s saved vectors (if not yet loaded, and made with `model`), drop those of
    /// documents and chunks no longer indexed, and list the chunks still without one.
    fn chunks_to_embed(&self, root: &Root, model: &str) -> Vec<PendingChunk> {
        {
            let mut v = root.vectors.write_locked();
            if v.is_none() {
                *v = load_vectors(root).filter(|x| x.model() == model);
            }
        }
        let docs = root.index.read_locked().documents();
        let mut pending = Vec::new();
        let mut vectors = root.vectors.write_locked();
        if let Some(v) = vectors.as_mut() {
            let live: std::collections::HashSet<&str> = docs.iter().map(|(p, _)| &**p).collect();
            v.retain_paths(|p| live.contains(p));
        }
        for (path, _) in &docs {
            let Ok(text) = self.document_text(root, path) else {
                continue;
            };
            let mut keep = Vec::new();
            for span in super::text::chunks(&text) {
                let chunk = text.get(span.bytes.clone()).unwrap_or("").trim();
                if chunk.is_empty() {
                    continue;
                }
                let hash = chunk_hash(chunk);
                keep.push((span.start_line, hash));
                if !vectors
                    .as_ref()
                    .is_some_and(|v| v.get(path, span.start_line, hash))
                {
                    pending.push(PendingChunk {
                        path: path.to_string(),
                        start_line: span.start_line,
                        end_line: span.end_line,
                        hash,
                        text: chunk.to_string(),
                    });
                }
            }
            if let Some(v) = vectors.as_mut() {
                v.retain_path(path, &keep);
            }
        }
        pending
    }
}

/// A chunk waiting for its vector.
struct PendingChunk {
    path: String,
    start_line: u32,
    end_line: u32,
    hash: u64,
    text: String,
}

fn vectors_path(root: &Root) -> PathBuf {
    root.dir.join(format!("{}.vec", root.name))
}

fn load_vectors(root: &Root) -> Option<Vectors> {
    let path = vectors_path(root);
    let bytes = std::fs::read(&path).ok()?;
    match Vectors::decode(&bytes) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "memory vectors damaged; embedding again");
            None
        }
    }
}

fn save_vectors(root: &Root) -> std::io::Result<()> {
    let path = vectors_path(root);
    let bytes = match &*root.vectors.read_locked() {
        Some(v) => v.encode(),
        None => return Ok(()),
    };
    std::fs::create_dir_all(&root.dir)?;
    write_replace(&path, &bytes)
}

fn snapshot_path(root: &Root) -> PathBuf {
    root.dir.join(format!("{}.idx", root.name))
}

/// The workspace a files root walks: the agent's, or a user's directory in it.
fn files_workspace(root: &Root) -> Result<Arc<Workspace>, ToolError> {
    match &root.kind {
        RootKind::Files(Some(d)) => Ok(Arc::new(
            root.ws.open_user(super::scope::user_name(d), false)?,
        )),
        _ => Ok(root.ws.clone()),
    }
}

impl MemoryService {}

/// The figures of the saved indexes of the workspace at `ws` beneath the state directory
/// `home` (from `summary.json`: no index is loaded and no service is needed).
pub fn saved_stats(home: &Path, settings: &MemorySettings, ws: &Path) -> MemoryStats {
    let mut s = MemoryStats {
        scope: settings.scope.as_str(),
        search_transcripts: settings.search_transcripts,
        ..MemoryStats::default()
    };
    let dir = MemoryService::index_dir_for(home, ws);
    let all: BTreeMap<String, serde_json::Value> = std::fs::read(dir.join("summary.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    for v in all.values() {
        let n = |k: &str| v.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
        s.indexes += 1;
        s.documents += usize::try_from(n("documents")).unwrap_or(0);
        s.chunks += usize::try_from(n("chunks")).unwrap_or(0);
        s.index_bytes += n("bytes");
        s.updated_ms = s.updated_ms.max(Some(n("updated_ms")));
    }
    s
}

/// `summary.json` beside the snapshots: per index, its figures (read by `weft status`
/// without loading any index).
fn record_summary(dir: &Path, name: &str, stats: &IndexStats, bytes: u64) -> std::io::Result<()> {
    let _lock = SUMMARY_LOCK.locked();
    let path = dir.join("summary.json");
    let mut all: BTreeMap<String, serde_json::Value> = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    all.insert(
        name.to_string(),
        serde_json::json!({
            "documents": stats.docs,
            "chunks": stats.chunks,
            "terms": stats.terms,
            "bytes": bytes,
            "updated_ms": now_ms(),
        }),
    );
    let text = serde_json::to_vec_pretty(&all).map_err(std::io::Error::other)?;
    write_replace(&path, &text)
}

impl MemoryService {
    /// Rebuild every index of this workspace from its files: the agent's, every user's under
    /// `users/`, and past conversations when enabled. Saved at once. Returns the figures.
    ///
    /// # Errors
    /// When a root cannot be walked or a snapshot cannot be written.
    pub fn reindex_all(&self, ws: &Arc<Workspace>) -> Result<MemoryStats, ToolError> {
        let mut kinds = vec![RootKind::Files(None)];
        for name in ws.users_dir().map(list_dirs).unwrap_or_default() {
            kinds.push(RootKind::Files(Some(format!(
                "{}/{name}",
                super::scope::USERS_DIR
            ))));
        }
        if self.settings.search_transcripts && self.store.is_some() {
            kinds.push(RootKind::Transcripts(String::new()));
        }
        for kind in kinds {
            let root = self.root(ws, kind);
            *root.index.write_locked() = Index::new();
            root.state.locked().loaded = true;
            self.reconcile(&root)?;
            root.state.locked().last = Some(Instant::now());
            self.save(&root)
                .map_err(|e| ToolError::ExecutionFailed(format!("saving the index: {e}")))?;
        }
        Ok(self.stats(ws.root()))
    }

    /// The figures of the saved indexes of the workspace at `ws` ([`saved_stats`]).
    pub fn stats(&self, ws: &Path) -> MemoryStats {
        saved_stats(&self.home, &self.settings, ws)
    }

    /// Read a memory document (or a past conversation) `ctx` may see: `path` as
    /// [`SearchHit::path`] shows it. Returns the root-relative text.
    ///
    /// # Errors
    /// `PermissionDenied` for another user's directory; `InvalidPath` for a path that is not a
    /// memory document; the open's errors (escapes, symlinks out, protected paths).
    pub fn read(&self, ctx: &ToolContext, path: &str) -> Result<String, ToolError> {
        let p = path.trim().trim_start_matches("./");
        if let Some(key) = p.strip_prefix(TRANSCRIPTS) {
            if !(self.settings.search_transcripts && self.store.is_some()) {
                return Err(ToolError::PermissionDenied(
                    "past conversations are not searchable here (memory.search_transcripts = false)".into(),
                ));
            }
            if !in_scope(key, &transcript_prefix(ctx)) {
                return Err(ToolError::PermissionDenied(format!(
                    "`{p}` is another conversation than this chat's"
                )));
            }
            return self.transcript_text(key);
        }
        let users = format!("{}/", super::scope::USERS_DIR);
        if p.starts_with(&users) {
            let own = ctx
                .user_dir
                .as_deref()
                .map(|d| format!("{}/", d.trim_end_matches('/')));
            let Some(rel) = own.as_deref().and_then(|o| p.strip_prefix(o)) else {
                return Err(ToolError::PermissionDenied(format!(
                    "`{p}` is another user's memory"
                )));
            };
            check_document(rel, path)?;
            let ws = scope_workspace(ctx, false)?
                .ok_or_else(|| ToolError::FileNotFound(format!("{p}: no such memory document")))?;
            return read_document(&ws, rel, self.max_file_bytes);
        }
        check_document(p, path)?;
        read_document(&ctx.workspace, p, self.max_file_bytes)
    }
}

static SUMMARY_LOCK: Mutex<()> = Mutex::new(());

/// Whether `rel` (root-relative) names a memory document `memory_get` serves.
fn check_document(rel: &str, shown: &str) -> Result<(), ToolError> {
    if rel == "USER.md" || crate::tools::memory::is_memory_path(rel) {
        Ok(())
    } else {
        Err(ToolError::InvalidPath(format!(
            "`{shown}` is not a memory document (MEMORY.md, USER.md, memory/…); use read_file for other files"
        )))
    }
}

/// Sessions whose past conversations `ctx` may search: its agent's (`@NAME:` keys for another
/// agent, keys without one for the default agent); under a user's scope, of those only this
/// chat's (the key's channel and chat, every thread).
fn transcript_prefix(ctx: &ToolContext) -> String {
    let agent = match ctx.session.agent() {
        crate::types::session_key::DEFAULT_AGENT => String::new(),
        a => format!("@{a}:"),
    };
    if ctx.user_dir.is_none() {
        return agent;
    }
    let key = ctx.session.without_agent();
    let mut parts = key.splitn(3, ':');
    match (parts.next(), parts.next()) {
        (Some(c), Some(chat)) => format!("{agent}{c}:{chat}"),
        _ => format!("{agent}{key}"),
    }
}

/// Whether the session `key` is within `prefix` (`""`: every session of the default agent;
/// `@NAME:`: every session of agent NAME; otherwise that chat and its threads).
fn in_scope(key: &str, prefix: &str) -> bool {
    if prefix.is_empty() {
        return !key.starts_with('@');
    }
    if prefix.ends_with(':') {
        return key.starts_with(prefix);
    }
    key == prefix
        || key
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with(':'))
}

/// The path shown for a root-relative `path` of `kind`.
fn display_path(kind: &RootKind, path: &str) -> String {
    match kind {
        RootKind::Files(Some(dir)) => format!("{dir}/{path}"),
        RootKind::Files(None) | RootKind::Transcripts(_) => path.to_string(),
    }
}

/// A conversation as text: one paragraph per user or assistant message (`user: …`,
/// `assistant: …`), tool traffic left out. The line numbers of search results refer to it.
pub fn render_transcript(msgs: &[crate::llm::Message]) -> String {
    use crate::llm::Role;
    let mut out = String::new();
    for m in msgs {
        let who = match m.role {
            Role::User => "user",
            Role::Assistant => "assistant",
            _ => continue,
        };
        let text = m.content.trim();
        if text.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push_str("\n\n");
        }
        out.push_str(who);
        out.push_str(": ");
        out.push_str(text);
    }
    out
}

/// The documents of a root: `MEMORY.md` and every `*.md` under `memory/` (no symlinks, at most
/// [`MAX_FILES`], [`MAX_DEPTH`] levels), with their stamps.
pub fn list_documents(ws: &Workspace) -> Vec<(String, Stamp)> {
    let mut out = Vec::new();
    if let Some(st) = stamp_at(ws.dir_fd(), "MEMORY.md") {
        out.push(("MEMORY.md".to_string(), st));
    }
    walk(ws, "memory", 0, &mut out);
    out
}

fn walk(ws: &Workspace, rel: &str, depth: usize, out: &mut Vec<(String, Stamp)>) {
    if depth > MAX_DEPTH || out.len() >= MAX_FILES {
        return;
    }
    let Ok(fd) = ws.open_beneath(
        rel,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
        Mode::empty(),
    ) else {
        return;
    };
    let Ok(dir) = rustix::fs::Dir::read_from(&fd) else {
        return;
    };
    let mut subdirs = Vec::new();
    for entry in dir.flatten() {
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if name == "." || name == ".." || name.starts_with('.') {
            continue;
        }
        match entry.file_type() {
            FileType::Directory => subdirs.push(name.to_string()),
            FileType::RegularFile | FileType::Unknown if name.ends_with(".md") => {
                if let Some(st) = stamp_at(rustix::fd::AsFd::as_fd(&fd), name) {
                    out.push((format!("{rel}/{name}"), st));
                    if out.len() >= MAX_FILES {
                        return;
                    }
                }
            }
            _ => {}
        }
    }
    subdirs.sort();
    for d in subdirs {
        walk(ws, &format!("{rel}/{d}"), depth + 1, out);
    }
}

/// The stamp of a regular file `name` in `dir` (not following a symlink).
fn stamp_at(dir: rustix::fd::BorrowedFd<'_>, name: &str) -> Option<Stamp> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return None;
    }
    #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
    Some(Stamp {
        size: st.st_size as u64,
        mtime_ns: (st.st_mtime as i64)
            .saturating_mul(1_000_000_000)
            .saturating_add(st.st_mtime_nsec as i64),
        ino: st.st_ino as u64,
    })
}

/// Re-index the documents of `ws` whose stamp changed and forget the removed ones; how many
/// changed. Files are read before the index is locked, so searches wait only for the updates.
fn reconcile_files(
    ws: &Workspace,
    index: &RwLock<Index>,
    max_bytes: u64,
) -> Result<usize, ToolError> {
    let docs = list_documents(ws);
    let (gone, changed): (Vec<Arc<str>>, Vec<(String, Stamp)>) = {
        let idx = index.read_locked();
        let names: std::collections::HashSet<&str> = docs.iter().map(|(p, _)| p.as_str()).collect();
        let gone = idx
            .documents()
            .into_iter()
            .filter(|(p, _)| !names.contains(&**p))
            .map(|(p, _)| p)
            .collect();
        let changed = docs
            .iter()
            .filter(|(p, st)| idx.stamp(p) != Some(*st))
            .cloned()
            .collect();
        (gone, changed)
    };
    let n = gone.len() + changed.len();
    if !gone.is_empty() {
        let mut idx = index.write_locked();
        for p in &gone {
            idx.remove(p);
        }
    }
    // In batches, so a first build of a large corpus does not hold the lock throughout.
    for batch in changed.chunks(256) {
        let texts: Vec<(&str, Stamp, String)> = batch
            .iter()
            .filter_map(|(p, st)| {
                read_document(ws, p, max_bytes)
                    .ok()
                    .map(|t| (p.as_str(), *st, t))
            })
            .collect();
        let mut idx = index.write_locked();
        for (p, st, t) in texts {
            idx.upsert(p, st, &t);
        }
    }
    Ok(n)
}

/// A memory document's text (at most `max` bytes, lossy UTF-8), opened beneath `ws` with the
/// kernel check and the protected-path guard.
fn read_document(ws: &Workspace, rel: &str, max: u64) -> Result<String, ToolError> {
    let flags = OFlags::RDONLY | OFlags::NONBLOCK;
    let (fd, rel) = match ws.open_beneath(rel, flags, Mode::empty()) {
        // `MEMORY.md` (a bare document name) is what a model calls the file the memory tools
        // write, `memory/MEMORY.md`: read that when the root has no such file.
        Err(ToolError::FileNotFound(_)) if !rel.contains('/') && rel.ends_with(".md") => {
            let under = format!("memory/{rel}");
            let fd = ws.open_beneath(&under, flags, Mode::empty())?;
            (fd, std::borrow::Cow::Owned(under))
        }
        r => (r?, std::borrow::Cow::Borrowed(rel)),
    };
    let rel = rel.as_ref();
    let f = std::fs::File::from(fd);
    let meta = f
        .metadata()
        .map_err(|e| ToolError::ExecutionFailed(format!("{rel}: {e}")))?;
    if !meta.is_file() {
        return Err(ToolError::InvalidPath(format!(
            "`{rel}` is not a regular file"
        )));
    }
    read_up_to(f, max, rel).map(|(text, _)| text)
}

/// The names of the real directories (not symlinks) in `dir`, sorted.
fn list_dirs(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    out.sort();
    out
}

/// Lower-cased words of a query (for placing snippets).
fn query_words(q: &str) -> Vec<String> {
    q.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// Lines `start..=end` of `text`, cut to [`SNIPPET_BYTES`] around the first query word found.
fn snippet(text: &str, start: u32, end: u32, words: &[String]) -> String {
    let lines: Vec<&str> = text
        .lines()
        .skip(start.saturating_sub(1) as usize)
        .take((end.saturating_sub(start) + 1) as usize)
        .collect();
    let joined = lines.join("\n");
    let trimmed = joined.trim();
    if trimmed.len() <= SNIPPET_BYTES {
        return trimmed.to_string();
    }
    let lower = trimmed.to_lowercase();
    let at = words
        .iter()
        .filter_map(|w| lower.find(w.as_str()))
        .min()
        .unwrap_or(0);
    // `lower` may differ in length from `trimmed` for a few scripts: clamp and align.
    let mut from = at.saturating_sub(SNIPPET_BYTES / 3).min(trimmed.len());
    while !trimmed.is_char_boundary(from) {
        from -= 1;
    }
    let mut to = (from + SNIPPET_BYTES).min(trimmed.len());
    while !trimmed.is_char_boundary(to) {
        to -= 1;
    }
    format!(
        "{}{}{}",
        if from > 0 { "…" } else { "" },
        &trimmed[from..to],
        if to < trimmed.len() { "…" } else { "" }
    )
}

/// Write `bytes` to `path` through a temporary file and a rename.
fn write_replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_data()?;
    }
    std::fs::rename(&tmp, path)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::memory::settings::Scope;

    fn ctx(ws: &Path, user_dir: Option<&str>) -> ToolContext {
        ToolContext {
            workspace: Arc::new(Workspace::open(ws).unwrap()),
            session: SessionKey::parse("telegram:42").unwrap(),
            cancel: tokio_util::sync::CancellationToken::new(),
            user_dir: user_dir.map(Arc::from),
            sender: None,
            call_id: None,
            turn: Default::default(),
        }
    }

    fn service(home: &Path) -> Arc<MemoryService> {
        Arc::new(MemoryService::new(
            home.to_path_buf(),
            MemorySettings {
                scope: Scope::Agent,
                ..MemorySettings::default()
            },
            None,
        ))
    }

    #[tokio::test]
    async fn a_changed_file_is_reindexed_alone_and_a_removed_one_leaves_the_index() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("memory/notes")).unwrap();
        for i in 0..50 {
            std::fs::write(
                ws.join(format!("memory/notes/{i}.md")),
                format!("note {i} about topic{i}\n"),
            )
            .unwrap();
        }
        let svc = service(dir.path());
        let c = ctx(&ws, None);
        let root = svc.root(&c.workspace, RootKind::Files(None));
        assert_eq!(
            svc.reconcile(&root).unwrap(),
            50,
            "the first build reads all"
        );
        assert_eq!(
            svc.reconcile(&root).unwrap(),
            0,
            "nothing changed, nothing read"
        );
        std::fs::write(ws.join("memory/notes/7.md"), "note 7 now about zebras\n").unwrap();
        std::fs::remove_file(ws.join("memory/notes/8.md")).unwrap();
        assert_eq!(svc.reconcile(&root).unwrap(), 2, "one changed, one removed");
        let out = svc.search(&c, "zebras", 5, None).await.unwrap();
        assert_eq!(out.results[0].path, "memory/notes/7.md");
        assert!(svc
            .search(&c, "topic7", 5, None)
            .await
            .unwrap()
            .results
            .is_empty());
        assert!(svc
            .search(&c, "topic8", 5, None)
            .await
            .unwrap()
            .results
            .is_empty());
    }

    #[tokio::test]
    async fn a_damaged_snapshot_is_rebuilt_from_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("memory")).unwrap();
        std::fs::write(
            ws.join("memory/MEMORY.md"),
            "The wifi password hint is the cat's name.\n",
        )
        .unwrap();
        let c = ctx(&ws, None);
        let svc = service(dir.path());
        let stats = svc.reindex_all(&c.workspace).unwrap();
        assert_eq!(stats.documents, 1);
        let snap = MemoryService::index_dir_for(dir.path(), &ws).join("agent.idx");
        assert!(snap.exists());
        std::fs::write(&snap, b"garbage, not an index").unwrap();
        // A new process: loads (and refuses) the snapshot, rebuilds from the files.
        let svc = service(dir.path());
        let out = svc.search(&c, "wifi", 5, None).await.unwrap();
        assert_eq!(out.results.len(), 1, "{out:?}");
        assert!(!out.indexing);
    }

    #[tokio::test]
    async fn a_snapshot_spares_the_rebuild_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("memory")).unwrap();
        std::fs::write(ws.join("memory/a.md"), "alpha\n").unwrap();
        std::fs::write(ws.join("memory/b.md"), "beta\n").unwrap();
        let c = ctx(&ws, None);
        service(dir.path()).reindex_all(&c.workspace).unwrap();
        let svc = service(dir.path());
        let root = svc.root(&c.workspace, RootKind::Files(None));
        assert_eq!(svc.reconcile(&root).unwrap(), 0, "loaded, nothing re-read");
        assert_eq!(
            svc.search(&c, "beta", 5, None).await.unwrap().results.len(),
            1
        );
    }
}
