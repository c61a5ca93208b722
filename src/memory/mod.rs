//! ④ Memory: the agent's (and each chat user's) memory documents in the workspace, their
//! search index and the memory tools.
//!
//! Files are the source of truth (users edit them by hand); the index is derived data, kept
//! in its own directory beneath the state directory and rebuilt from the files whenever it is
//! missing, stale or unreadable.
//!
//! - [`text`]: the analyser (case and accent folding, unicode words, CJK, English stemming) and
//!   the chunker (Markdown sections and paragraphs with their line ranges).
//! - [`index`]: the BM25 inverted index over chunks, incremental per file, with its snapshot
//!   encoding.
//! - [`embed`]: optional dense vectors from an OpenAI-compatible `/embeddings` endpoint, fused
//!   with the keyword ranking.

pub mod embed;
pub mod index;
pub mod scope;
pub mod service;
pub mod settings;
pub mod text;
pub mod tools;
