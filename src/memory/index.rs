//! The keyword index: BM25 over the chunks of every memory document of one root, updated one
//! file at a time.

use std::sync::Arc;

/// What a file looked like when it was indexed: a changed stamp means re-index it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// Inode number (an atomic replace changes it).
    pub ino: u64,
}

/// One ranked chunk.
#[derive(Clone, Debug, PartialEq)]
pub struct Hit {
    /// The document, relative to its root (`MEMORY.md`, `memory/2026-11-23.md`).
    pub path: Arc<str>,
    /// First line of the chunk (1-based).
    pub start_line: u32,
    /// Last line of the chunk (inclusive).
    pub end_line: u32,
    /// Relevance (higher is better; BM25 for keyword hits).
    pub score: f32,
}

/// Size figures of an index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Documents (files).
    pub docs: usize,
    /// Chunks (searchable units).
    pub chunks: usize,
    /// Distinct terms.
    pub terms: usize,
    /// Approximate heap bytes.
    pub bytes: usize,
}

/// The inverted index of one root.
#[derive(Debug, Default)]
pub struct Index {}
