//! The keyword index: BM25 over the chunks of every memory document of one root, updated one
//! file at a time.

use std::collections::HashMap;
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

/// BM25 term-frequency saturation.
const K1: f32 = 1.2;
/// BM25 length normalisation.
const B: f32 = 0.75;

/// First bytes of a snapshot.
const MAGIC: &[u8; 8] = b"WEFTMIDX";
/// Snapshot format version: bumped on any change of the encoding; another version is
/// rejected (and the service rebuilds the index from the files).
const VERSION: u32 = 1;

/// Dead chunks (of removed or re-indexed documents) are compacted away once they are at
/// least this many and at least a quarter of all chunk slots: a bounded waste (postings of
/// dead chunks are skipped at search time) for an amortised cost per update.
const COMPACT_MIN_DEAD: usize = 256;

/// Marks a dead chunk in a renumbering table.
const GONE: u32 = u32::MAX;

/// One posting list: for each chunk containing the term, in ascending chunk order, the
/// varints `chunk - next`, `tf`, then `tf` positions (the first absolute, then deltas).
/// Compact (a few bytes per occurrence) and appendable, since a new chunk always has the
/// highest id.
#[derive(Debug, Default, Clone)]
struct Postings {
    bytes: Vec<u8>,
    /// One past the last chunk id in `bytes` (the base of the next delta).
    next: u32,
}

/// One indexed chunk.
#[derive(Debug, Clone)]
struct ChunkMeta {
    /// Slot in `Index::docs`.
    doc: u32,
    start_line: u32,
    end_line: u32,
    /// Indexed terms (BM25 length).
    len: u32,
    /// False once its document was removed or re-indexed: its postings stay until compaction
    /// and are skipped.
    live: bool,
}

/// One indexed document.
#[derive(Debug, Clone)]
struct DocEntry {
    path: Arc<str>,
    stamp: Stamp,
    /// Its chunks are ids `first..first + count` (allocated together at upsert).
    first: u32,
    count: u32,
}

/// The inverted index of one root.
///
/// Chunk ids only grow until a compaction renumbers them; every posting list is sorted by
/// chunk id, so an upsert appends and a removal only marks chunks dead. Document frequency is
/// counted over live entries at search time, so nothing needs the removed text.
#[derive(Debug, Default)]
pub struct Index {
    /// Term → id; the strings are shared with `term_text`.
    terms: HashMap<Arc<str>, u32>,
    term_text: Vec<Arc<str>>,
    /// By term id.
    postings: Vec<Postings>,
    /// By chunk id, dead ones included.
    chunks: Vec<ChunkMeta>,
    /// By slot; `None` for a removed document (until compaction).
    docs: Vec<Option<DocEntry>>,
    paths: HashMap<Arc<str>, u32>,
    live_chunks: usize,
    dead_chunks: usize,
    /// Sum of `len` over live chunks (BM25 average length).
    live_terms: u64,
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A bounds-checked reader over snapshot and posting bytes: every read is an `Option`, so
/// malformed input ends the read instead of panicking.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, at: 0 }
    }

    fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.bytes.get(self.at)?;
            self.at += 1;
            v |= u64::from(b & 0x7f).checked_shl(shift)?;
            if b < 0x80 {
                return Some(v);
            }
        }
        None
    }

    fn u32(&mut self) -> Option<u32> {
        u32::try_from(self.varint()?).ok()
    }

    fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(len)?;
        let out = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(out)
    }

    /// Skips `n` varints (the positions of an entry) without decoding them.
    fn skip_varints(&mut self, n: u32) -> Option<()> {
        let mut left = n;
        while left > 0 {
            let b = *self.bytes.get(self.at)?;
            self.at += 1;
            if b < 0x80 {
                left -= 1;
            }
        }
        Some(())
    }
}

/// One entry of a posting list, its positions still encoded.
struct Entry<'a> {
    chunk: u32,
    tf: u32,
    positions: &'a [u8],
}

/// The entries of a posting list in chunk order.
struct Entries<'a> {
    reader: Reader<'a>,
    next: u32,
}

impl<'a> Entries<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self {
            reader: Reader::new(bytes),
            next: 0,
        }
    }
}

impl<'a> Iterator for Entries<'a> {
    type Item = Entry<'a>;

    fn next(&mut self) -> Option<Entry<'a>> {
        if self.reader.done() {
            return None;
        }
        let chunk = self.next.checked_add(self.reader.u32()?)?;
        self.next = chunk.checked_add(1)?;
        let tf = self.reader.u32()?;
        let start = self.reader.at;
        self.reader.skip_varints(tf)?;
        let positions = self.reader.bytes.get(start..self.reader.at)?;
        Some(Entry {
            chunk,
            tf,
            positions,
        })
    }
}

/// Decodes an entry's positions (ascending).
fn decode_positions(bytes: &[u8], out: &mut Vec<u32>) {
    out.clear();
    let mut reader = Reader::new(bytes);
    let mut at = 0u32;
    while let Some(delta) = reader.u32() {
        at = at.saturating_add(delta);
        out.push(at);
    }
}

/// Re-encodes `bytes` keeping only chunks with a new id in `renumber` (monotone), into
/// `out`; returns the new `next`.
fn rewrite_postings(bytes: &[u8], renumber: &[u32], out: &mut Vec<u8>) -> u32 {
    let mut next = 0u32;
    for entry in Entries::new(bytes) {
        let new = renumber.get(entry.chunk as usize).copied().unwrap_or(GONE);
        if new == GONE {
            continue;
        }
        put_varint(out, u64::from(new - next));
        put_varint(out, u64::from(entry.tf));
        out.extend_from_slice(entry.positions);
        next = new + 1;
    }
    next
}

impl Index {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// The id of `term`, added to the dictionary when new.
    fn intern(&mut self, term: &str) -> u32 {
        if let Some(&id) = self.terms.get(term) {
            return id;
        }
        let id = self.term_text.len() as u32;
        let text: Arc<str> = Arc::from(term);
        self.terms.insert(text.clone(), id);
        self.term_text.push(text);
        self.postings.push(Postings::default());
        id
    }

    /// Marks the chunks of document `slot` dead.
    fn kill_chunks(&mut self, slot: u32) {
        let Some(Some(doc)) = self.docs.get(slot as usize) else {
            return;
        };
        let range = doc.first as usize..(doc.first + doc.count) as usize;
        for chunk in self.chunks.get_mut(range).into_iter().flatten() {
            if chunk.live {
                chunk.live = false;
                self.live_chunks -= 1;
                self.dead_chunks += 1;
                self.live_terms -= u64::from(chunk.len);
            }
        }
    }

    /// Index (or re-index) one document: chunks it, analyses each chunk, replaces whatever was
    /// indexed under `path` before. Cost proportional to this document only (plus, now and
    /// then, a compaction whose cost is amortised over the updates that made it due).
    pub fn upsert(&mut self, path: &str, stamp: Stamp, text: &str) {
        let slot = match self.paths.get(path) {
            Some(&slot) => {
                self.kill_chunks(slot);
                slot
            }
            None => {
                let slot = self.docs.len() as u32;
                self.docs.push(None);
                self.paths.insert(Arc::from(path), slot);
                slot
            }
        };
        let first = self.chunks.len() as u32;
        let mut occurrences: Vec<(u32, u32)> = Vec::new();
        for span in super::text::chunks(text) {
            occurrences.clear();
            let body = text.get(span.bytes.clone()).unwrap_or("");
            super::text::analyse(body, |term, at| {
                let id = self.intern(term);
                occurrences.push((id, at));
            });
            occurrences.sort_unstable();
            let chunk = self.chunks.len() as u32;
            for group in occurrences.chunk_by(|a, b| a.0 == b.0) {
                let postings = &mut self.postings[group[0].0 as usize];
                // Grow by a quarter, not the default doubling: posting lists are most of the
                // index and live for the life of the process (amortised O(1) all the same).
                let needed = 5 * (2 + group.len());
                if postings.bytes.capacity() - postings.bytes.len() < needed {
                    postings
                        .bytes
                        .reserve_exact(needed.max(postings.bytes.len() / 4));
                }
                put_varint(&mut postings.bytes, u64::from(chunk - postings.next));
                put_varint(&mut postings.bytes, group.len() as u64);
                let mut previous = 0;
                for &(_, at) in group {
                    put_varint(&mut postings.bytes, u64::from(at - previous));
                    previous = at;
                }
                postings.next = chunk + 1;
            }
            self.chunks.push(ChunkMeta {
                doc: slot,
                start_line: span.start_line,
                end_line: span.end_line,
                len: occurrences.len() as u32,
                live: true,
            });
            self.live_chunks += 1;
            self.live_terms += occurrences.len() as u64;
        }
        let path = match &self.docs[slot as usize] {
            Some(doc) => doc.path.clone(),
            None => self
                .paths
                .get_key_value(path)
                .map_or_else(|| Arc::from(path), |(key, _)| key.clone()),
        };
        self.docs[slot as usize] = Some(DocEntry {
            path,
            stamp,
            first,
            count: self.chunks.len() as u32 - first,
        });
        self.maybe_compact();
    }

    /// Forget a document; whether it was there.
    pub fn remove(&mut self, path: &str) -> bool {
        let Some(slot) = self.paths.remove(path) else {
            return false;
        };
        self.kill_chunks(slot);
        self.docs[slot as usize] = None;
        self.maybe_compact();
        true
    }

    /// The stamp a document was indexed with.
    pub fn stamp(&self, path: &str) -> Option<Stamp> {
        let slot = *self.paths.get(path)?;
        self.docs.get(slot as usize)?.as_ref().map(|doc| doc.stamp)
    }

    /// Every indexed document with its stamp (any order).
    pub fn documents(&self) -> Vec<(Arc<str>, Stamp)> {
        self.docs
            .iter()
            .flatten()
            .map(|doc| (doc.path.clone(), doc.stamp))
            .collect()
    }

    /// The live chunks renumbered densely in id order (dead → [`GONE`]), and the live
    /// documents in the order of their chunks (each with its chunks' new first id).
    fn renumbering(&self) -> (Vec<u32>, Vec<&DocEntry>) {
        let mut renumber = vec![GONE; self.chunks.len()];
        let mut next = 0u32;
        for (old, chunk) in self.chunks.iter().enumerate() {
            if chunk.live {
                renumber[old] = next;
                next += 1;
            }
        }
        let mut docs: Vec<&DocEntry> = self.docs.iter().flatten().collect();
        docs.sort_by_key(|doc| doc.first);
        (renumber, docs)
    }

    fn maybe_compact(&mut self) {
        if self.dead_chunks >= COMPACT_MIN_DEAD && self.dead_chunks * 4 >= self.chunks.len() {
            self.compact();
        }
    }

    /// Drops dead chunks, removed documents and terms left without postings.
    fn compact(&mut self) {
        let (renumber, docs) = self.renumbering();
        let mut slot_of = vec![GONE; self.docs.len()];
        let mut new_docs = Vec::with_capacity(docs.len());
        for (slot, doc) in docs.into_iter().enumerate() {
            if let Some(&old) = self.paths.get(&doc.path) {
                slot_of[old as usize] = slot as u32;
            }
            let first = renumber.get(doc.first as usize).copied().unwrap_or(GONE);
            new_docs.push(Some(DocEntry {
                first: if first == GONE { 0 } else { first },
                ..doc.clone()
            }));
        }
        let chunks: Vec<ChunkMeta> = self
            .chunks
            .iter()
            .filter(|chunk| chunk.live)
            .map(|chunk| ChunkMeta {
                doc: slot_of[chunk.doc as usize],
                ..chunk.clone()
            })
            .collect();
        let mut terms = HashMap::new();
        let mut term_text = Vec::new();
        let mut postings = Vec::new();
        for (text, old) in self.term_text.iter().zip(&self.postings) {
            let mut bytes = Vec::new();
            let next = rewrite_postings(&old.bytes, &renumber, &mut bytes);
            if bytes.is_empty() {
                continue;
            }
            terms.insert(text.clone(), term_text.len() as u32);
            term_text.push(text.clone());
            postings.push(Postings { bytes, next });
        }
        self.paths = new_docs
            .iter()
            .flatten()
            .enumerate()
            .map(|(slot, doc)| (doc.path.clone(), slot as u32))
            .collect();
        self.docs = new_docs;
        self.chunks = chunks;
        self.terms = terms;
        self.term_text = term_text;
        self.postings = postings;
        self.dead_chunks = 0;
        self.shrink();
    }

    /// Returns the tables' spare capacity (after a decode or a compaction, which know the
    /// final sizes).
    fn shrink(&mut self) {
        self.terms.shrink_to_fit();
        self.term_text.shrink_to_fit();
        self.postings.shrink_to_fit();
        self.chunks.shrink_to_fit();
        self.docs.shrink_to_fit();
        self.paths.shrink_to_fit();
    }

    /// The best `max` chunks for `query` by BM25 (k1 = 1.2, b = 0.75,
    /// idf = ln(1 + (N - df + 0.5)/(df + 0.5))) over all live chunks, only documents whose
    /// path starts with `path_prefix` when given; ties broken by path then line.
    ///
    /// A chunk holding the query's terms at the query's relative positions (the phrase, after
    /// stemming; dropped stop words keep their gap) ranks above every other chunk: its score
    /// is its BM25 plus the best BM25 of the query, so the order is the order of `score`.
    /// Empty or all-dropped query → empty result.
    pub fn search(&self, query: &str, max: usize, path_prefix: Option<&str>) -> Vec<Hit> {
        let mut query_terms: Vec<(Option<u32>, u32)> = Vec::new();
        super::text::analyse(query, |term, at| {
            query_terms.push((self.terms.get(term).copied(), at));
        });
        // Distinct known terms in query order, and each query term's index among them.
        let mut distinct: Vec<u32> = Vec::new();
        let mut phrase: Vec<(usize, u32)> = Vec::new();
        for &(id, at) in &query_terms {
            let Some(id) = id else { continue };
            let index = distinct.iter().position(|&d| d == id).unwrap_or_else(|| {
                distinct.push(id);
                distinct.len() - 1
            });
            phrase.push((index, at));
        }
        if max == 0 || distinct.is_empty() || self.live_chunks == 0 {
            return Vec::new();
        }
        let allowed: Option<Vec<bool>> = path_prefix.map(|prefix| {
            self.docs
                .iter()
                .map(|doc| doc.as_ref().is_some_and(|doc| doc.path.starts_with(prefix)))
                .collect()
        });
        let is_allowed = |chunk: &ChunkMeta| {
            chunk.live
                && allowed
                    .as_ref()
                    .is_none_or(|a| a.get(chunk.doc as usize).copied().unwrap_or(false))
        };
        let n = self.live_chunks as f32;
        let average = (self.live_terms as f32 / n).max(1.0);
        let mut score = vec![0f32; self.chunks.len()];
        let mut matched = vec![0u64; self.chunks.len()];
        let mut touched: Vec<u32> = Vec::new();
        for (index, &id) in distinct.iter().enumerate() {
            let bytes = &self.postings[id as usize].bytes;
            let df = Entries::new(bytes)
                .filter(|e| self.chunks.get(e.chunk as usize).is_some_and(|c| c.live))
                .count() as f32;
            let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
            for entry in Entries::new(bytes) {
                let c = entry.chunk as usize;
                let Some(chunk) = self.chunks.get(c).filter(|chunk| is_allowed(chunk)) else {
                    continue;
                };
                let tf = entry.tf as f32;
                let norm = K1 * (1.0 - B + B * chunk.len as f32 / average);
                if matched[c] == 0 {
                    touched.push(entry.chunk);
                }
                matched[c] |= 1u64 << index.min(63);
                score[c] += idf * tf * (K1 + 1.0) / (tf + norm);
            }
        }
        // Exact phrase: every query term known, at least two, positions lined up.
        let all_known = query_terms.iter().all(|(id, _)| id.is_some());
        if all_known && phrase.len() >= 2 && distinct.len() <= 64 {
            let full = if distinct.len() == 64 {
                u64::MAX
            } else {
                (1u64 << distinct.len()) - 1
            };
            let best = touched
                .iter()
                .map(|&c| score[c as usize])
                .fold(0f32, f32::max);
            let mut slot = vec![GONE; self.chunks.len()];
            let mut candidates: Vec<u32> = Vec::new();
            for &c in &touched {
                if matched[c as usize] == full {
                    slot[c as usize] = candidates.len() as u32;
                    candidates.push(c);
                }
            }
            // positions[candidate * distinct.len() + term]
            let mut positions: Vec<Vec<u32>> = vec![Vec::new(); candidates.len() * distinct.len()];
            for (index, &id) in distinct.iter().enumerate() {
                for entry in Entries::new(&self.postings[id as usize].bytes) {
                    let s = slot.get(entry.chunk as usize).copied().unwrap_or(GONE);
                    if s != GONE {
                        decode_positions(
                            entry.positions,
                            &mut positions[s as usize * distinct.len() + index],
                        );
                    }
                }
            }
            let (first_term, first_at) = phrase[0];
            for (s, &c) in candidates.iter().enumerate() {
                let of = |term: usize| &positions[s * distinct.len() + term];
                let found = of(first_term).iter().any(|&start| {
                    phrase.iter().all(|&(term, at)| {
                        of(term)
                            .binary_search(&start.saturating_add(at - first_at))
                            .is_ok()
                    })
                });
                if found {
                    score[c as usize] += best;
                }
            }
        }
        let path_of = |c: u32| -> &str {
            self.chunks
                .get(c as usize)
                .and_then(|chunk| self.docs.get(chunk.doc as usize))
                .and_then(Option::as_ref)
                .map_or("", |doc| &doc.path)
        };
        let line_of = |c: u32| {
            self.chunks
                .get(c as usize)
                .map_or(0, |chunk| chunk.start_line)
        };
        let order = |a: &u32, b: &u32| {
            score[*b as usize]
                .total_cmp(&score[*a as usize])
                .then_with(|| path_of(*a).cmp(path_of(*b)))
                .then_with(|| line_of(*a).cmp(&line_of(*b)))
        };
        if touched.len() > max {
            touched.select_nth_unstable_by(max - 1, order);
            touched.truncate(max);
        }
        touched.sort_unstable_by(order);
        touched
            .into_iter()
            .filter_map(|c| {
                let chunk = self.chunks.get(c as usize)?;
                let doc = self.docs.get(chunk.doc as usize)?.as_ref()?;
                Some(Hit {
                    path: doc.path.clone(),
                    start_line: chunk.start_line,
                    end_line: chunk.end_line,
                    score: score[c as usize],
                })
            })
            .collect()
    }

    /// Size figures: live documents and chunks, dictionary size, approximate heap bytes.
    pub fn stats(&self) -> IndexStats {
        let arc = 2 * std::mem::size_of::<usize>();
        let map_entry = std::mem::size_of::<(Arc<str>, u32)>() + 1;
        let terms: usize = self.term_text.iter().map(|t| t.len() + arc).sum::<usize>()
            + self.terms.capacity() * map_entry
            + self.term_text.capacity() * std::mem::size_of::<Arc<str>>();
        let postings: usize = self
            .postings
            .iter()
            .map(|p| p.bytes.capacity())
            .sum::<usize>()
            + self.postings.capacity() * std::mem::size_of::<Postings>();
        let docs: usize = self
            .docs
            .iter()
            .flatten()
            .map(|doc| doc.path.len() + arc)
            .sum::<usize>()
            + self.docs.capacity() * std::mem::size_of::<Option<DocEntry>>()
            + self.paths.capacity() * map_entry;
        IndexStats {
            docs: self.paths.len(),
            chunks: self.live_chunks,
            terms: self.terms.len(),
            bytes: terms
                + postings
                + docs
                + self.chunks.capacity() * std::mem::size_of::<ChunkMeta>(),
        }
    }

    /// The snapshot bytes: `WEFTMIDX`, the format version (u32 LE), then varints: the live
    /// documents (path, stamp, chunk count) in chunk order, their chunks (start line, line
    /// count - 1, length), the terms with their posting lists (dead chunks dropped, ids
    /// renumbered), and a CRC-32 (LE) of everything before it.
    pub fn encode(&self) -> Vec<u8> {
        let (renumber, docs) = self.renumbering();
        let mut out = Vec::with_capacity(self.stats().bytes / 2 + 64);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        put_varint(&mut out, docs.len() as u64);
        for doc in &docs {
            put_varint(&mut out, doc.path.len() as u64);
            out.extend_from_slice(doc.path.as_bytes());
            put_varint(&mut out, doc.stamp.size);
            put_varint(
                &mut out,
                ((doc.stamp.mtime_ns << 1) ^ (doc.stamp.mtime_ns >> 63)) as u64,
            );
            put_varint(&mut out, doc.stamp.ino);
            put_varint(&mut out, u64::from(doc.count));
            let range = doc.first as usize..(doc.first + doc.count) as usize;
            for chunk in self.chunks.get(range).into_iter().flatten() {
                put_varint(&mut out, u64::from(chunk.start_line));
                put_varint(&mut out, u64::from(chunk.end_line - chunk.start_line));
                put_varint(&mut out, u64::from(chunk.len));
            }
        }
        let mut terms: Vec<(&Arc<str>, Vec<u8>)> = Vec::new();
        for (text, postings) in self.term_text.iter().zip(&self.postings) {
            let mut bytes = Vec::new();
            rewrite_postings(&postings.bytes, &renumber, &mut bytes);
            if !bytes.is_empty() {
                terms.push((text, bytes));
            }
        }
        put_varint(&mut out, terms.len() as u64);
        for (text, bytes) in terms {
            put_varint(&mut out, text.len() as u64);
            out.extend_from_slice(text.as_bytes());
            put_varint(&mut out, bytes.len() as u64);
            out.extend_from_slice(&bytes);
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Read a snapshot written by [`Index::encode`].
    ///
    /// # Errors
    ///
    /// A truncated, corrupted or other-version snapshot, with a message saying which; never a
    /// panic, and no allocation larger than the input from a length field.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        const HEADER: usize = 12;
        if bytes.len() < HEADER + 4 || &bytes[..8] != MAGIC {
            return Err("not a memory index snapshot (bad magic header or too short)".into());
        }
        let mut version = [0u8; 4];
        version.copy_from_slice(&bytes[8..12]);
        let version = u32::from_le_bytes(version);
        if version != VERSION {
            return Err(format!(
                "memory index snapshot version {version} is not supported (this build reads version {VERSION})"
            ));
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        let mut stored = [0u8; 4];
        stored.copy_from_slice(crc);
        if crc32fast::hash(body) != u32::from_le_bytes(stored) {
            return Err(
                "memory index snapshot is corrupted or truncated (checksum mismatch)".into(),
            );
        }
        Self::decode_body(&body[HEADER..])
    }

    fn decode_body(body: &[u8]) -> Result<Self, String> {
        let truncated = || "memory index snapshot is truncated or malformed".to_owned();
        let mut r = Reader::new(body);
        let mut index = Index::new();
        let doc_count = r.varint().ok_or_else(truncated)?;
        for _ in 0..doc_count {
            let len = r.varint().ok_or_else(truncated)? as usize;
            let path = std::str::from_utf8(r.take(len).ok_or_else(truncated)?)
                .map_err(|_| "memory index snapshot has a path that is not UTF-8".to_owned())?;
            let size = r.varint().ok_or_else(truncated)?;
            let zigzag = r.varint().ok_or_else(truncated)?;
            let mtime_ns = ((zigzag >> 1) as i64) ^ -((zigzag & 1) as i64);
            let ino = r.varint().ok_or_else(truncated)?;
            let count = r.u32().ok_or_else(truncated)?;
            let slot = index.docs.len() as u32;
            let path: Arc<str> = Arc::from(path);
            if index.paths.insert(path.clone(), slot).is_some() {
                return Err(format!("memory index snapshot lists {path} twice"));
            }
            let first = index.chunks.len() as u32;
            for _ in 0..count {
                let start_line = r.u32().ok_or_else(truncated)?;
                let end_line = start_line
                    .checked_add(r.u32().ok_or_else(truncated)?)
                    .ok_or_else(truncated)?;
                let len = r.u32().ok_or_else(truncated)?;
                index.chunks.push(ChunkMeta {
                    doc: slot,
                    start_line,
                    end_line,
                    len,
                    live: true,
                });
                index.live_terms += u64::from(len);
            }
            index.docs.push(Some(DocEntry {
                path,
                stamp: Stamp {
                    size,
                    mtime_ns,
                    ino,
                },
                first,
                count,
            }));
        }
        index.live_chunks = index.chunks.len();
        let term_count = r.varint().ok_or_else(truncated)?;
        for _ in 0..term_count {
            let len = r.varint().ok_or_else(truncated)? as usize;
            let text = std::str::from_utf8(r.take(len).ok_or_else(truncated)?)
                .map_err(|_| "memory index snapshot has a term that is not UTF-8".to_owned())?;
            let len = r.varint().ok_or_else(truncated)? as usize;
            let bytes = r.take(len).ok_or_else(truncated)?;
            // Walk the list: chunk ids in range and ascending, positions complete.
            let mut next = 0u32;
            let mut walker = Reader::new(bytes);
            while !walker.done() {
                let chunk = walker
                    .u32()
                    .and_then(|delta| next.checked_add(delta))
                    .filter(|&chunk| (chunk as usize) < index.chunks.len())
                    .ok_or_else(|| {
                        format!("memory index snapshot: bad posting list for {text:?}")
                    })?;
                let tf = walker.u32().filter(|&tf| tf > 0).ok_or_else(truncated)?;
                walker.skip_varints(tf).ok_or_else(truncated)?;
                next = chunk + 1;
            }
            let id = index.term_text.len() as u32;
            let text: Arc<str> = Arc::from(text);
            if text.is_empty() || index.terms.insert(text.clone(), id).is_some() {
                return Err(format!(
                    "memory index snapshot lists the term {text:?} twice or empty"
                ));
            }
            index.term_text.push(text);
            index.postings.push(Postings {
                bytes: bytes.to_vec(),
                next,
            });
        }
        if !r.done() {
            return Err("memory index snapshot has trailing bytes".into());
        }
        index.shrink();
        Ok(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn stamp(n: u64) -> Stamp {
        Stamp {
            size: n,
            mtime_ns: -(n as i64) * 1_000_000_007,
            ino: n * 31,
        }
    }

    fn paths(hits: &[Hit]) -> Vec<&str> {
        hits.iter().map(|h| &*h.path).collect()
    }

    fn index(docs: &[(&str, &str)]) -> Index {
        let mut index = Index::new();
        for (i, (path, text)) in docs.iter().enumerate() {
            index.upsert(path, stamp(i as u64), text);
        }
        index
    }

    #[test]
    fn stemming_and_folding_find_other_forms() {
        let index = index(&[
            ("memory/a.md", "She remembered the Café on the corner."),
            ("memory/b.md", "Nothing related here."),
        ]);
        assert_eq!(paths(&index.search("remembers", 10, None)), ["memory/a.md"]);
        assert_eq!(paths(&index.search("cafe", 10, None)), ["memory/a.md"]);
        assert_eq!(paths(&index.search("CAFÉS", 10, None)), ["memory/a.md"]);
        assert_eq!(index.search("unrelated words", 10, None), []);
    }

    #[test]
    fn cjk_query_finds_the_note() {
        let index = index(&[
            ("memory/2026-01-01.md", "明日は東京へ行く。"),
            ("memory/2026-01-02.md", "京都に行った。"),
        ]);
        let hits = index.search("東京", 10, None);
        // Both contain 京; only the first has the phrase 東京, and it ranks first.
        assert_eq!(
            paths(&hits),
            ["memory/2026-01-01.md", "memory/2026-01-02.md"]
        );
        assert!(hits[0].score > hits[1].score);
    }

    #[test]
    fn exact_phrase_ranks_above_partial_matches() {
        let index = index(&[
            // Many whales, short: the best plain BM25 for "whale".
            ("a.md", "Whale whale whale. A whale."),
            // All the words, scattered.
            (
                "b.md",
                "The migration of birds, a blue sky and a whale song. Migration again, blue.",
            ),
            // The phrase, in a long note.
            (
                "c.md",
                "Long note about the ocean and many other things that are not relevant at all. \
                 We watched the Blue Whale migration from the boat, with coffee, in the rain, \
                 for hours, and then went home to write it down in the diary of the trip.",
            ),
        ]);
        let hits = index.search("blue whale migration", 10, None);
        assert_eq!(paths(&hits), ["c.md", "b.md", "a.md"], "{hits:?}");
        for pair in hits.windows(2) {
            assert!(pair[0].score > pair[1].score, "{hits:?}");
        }
        // Without the phrase bonus the scattered note would win: check the premise.
        let plain = index.search("migration blue whale", 10, None);
        assert_eq!(paths(&plain)[0], "b.md", "{plain:?}");
    }

    #[test]
    fn phrase_uses_stemmed_terms_and_keeps_stop_word_gaps() {
        let index = index(&[
            ("a.md", "house and more cards house"),
            ("b.md", "the house of cards"),
            ("c.md", "big houses, card games"),
        ]);
        // "of" is dropped but keeps its gap: only b.md has card two words after house.
        assert_eq!(paths(&index.search("House of Cards", 10, None))[0], "b.md");
        // "houses card" is the phrase of stems "hous card": c.md, although its chunk is
        // the longest one with both words.
        assert_eq!(paths(&index.search("houses card", 10, None))[0], "c.md");
    }

    #[test]
    fn hits_carry_the_chunk_lines() {
        let text = "# Groceries\nmilk\n\n# Travel\nbook the train to Lyon\nhotel\n";
        let index = index(&[("MEMORY.md", text)]);
        let hits = index.search("train", 10, None);
        assert_eq!(
            hits,
            [Hit {
                path: Arc::from("MEMORY.md"),
                start_line: 4,
                end_line: 6,
                score: hits[0].score,
            }]
        );
        assert!(hits[0].score > 0.0);
    }

    #[test]
    fn upsert_replaces_the_old_text() {
        let mut index = index(&[("a.md", "the old password is swordfish")]);
        assert_eq!(index.search("swordfish", 10, None).len(), 1);
        index.upsert("a.md", stamp(9), "the new password is hunter2");
        assert_eq!(index.search("swordfish", 10, None), []);
        assert_eq!(paths(&index.search("hunter2", 10, None)), ["a.md"]);
        assert_eq!(index.stamp("a.md"), Some(stamp(9)));
        let stats = index.stats();
        assert_eq!((stats.docs, stats.chunks), (1, 1));
    }

    #[test]
    fn remove_forgets_the_document() {
        let mut index = index(&[("a.md", "apples"), ("b.md", "apples and pears")]);
        assert!(index.remove("a.md"));
        assert!(!index.remove("a.md"));
        assert!(!index.remove("never.md"));
        assert_eq!(paths(&index.search("apples", 10, None)), ["b.md"]);
        assert_eq!(index.stamp("a.md"), None);
        assert_eq!(index.documents(), [(Arc::from("b.md"), stamp(1))]);
        assert_eq!(index.stats().docs, 1);
    }

    #[test]
    fn empty_documents_are_listed_but_never_found() {
        let index = index(&[("empty.md", ""), ("a.md", "text")]);
        let mut docs = index.documents();
        docs.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            docs,
            [
                (Arc::from("a.md"), stamp(1)),
                (Arc::from("empty.md"), stamp(0))
            ]
        );
        assert_eq!(index.search("", 10, None), []);
        assert_eq!(index.search("the of", 10, None), []);
        assert_eq!(index.search("text", 0, None), []);
    }

    #[test]
    fn path_prefix_limits_the_documents() {
        let index = index(&[
            ("MEMORY.md", "tea preferences: green"),
            ("memory/2026-11-23.md", "bought green tea"),
            ("users/7/memory/x.md", "green tea again"),
        ]);
        assert_eq!(
            paths(&index.search("green tea", 10, Some("memory/"))),
            ["memory/2026-11-23.md"]
        );
        assert_eq!(index.search("green tea", 10, Some("nowhere/")), []);
        assert_eq!(index.search("green tea", 10, None).len(), 3);
    }

    #[test]
    fn ties_are_broken_by_path_then_line_and_max_applies_after() {
        let same = "# Note\nidentical words here\n";
        let mut docs = Vec::new();
        for name in ["d.md", "b.md", "a.md", "c.md"] {
            docs.push((name, same));
        }
        let mut index = index(&docs);
        // Two identical chunks in one document.
        index.upsert(
            "e.md",
            stamp(5),
            "# One\nidentical words here\n\n# Two\nidentical words here\n",
        );
        let hits = index.search("identical words", 10, None);
        let order: Vec<_> = hits.iter().map(|h| (&*h.path, h.start_line)).collect();
        assert_eq!(
            order,
            [
                ("a.md", 1),
                ("b.md", 1),
                ("c.md", 1),
                ("d.md", 1),
                ("e.md", 1),
                ("e.md", 4)
            ]
        );
        assert_eq!(
            paths(&index.search("identical words", 2, None)),
            ["a.md", "b.md"]
        );
    }

    #[test]
    fn dead_chunks_are_compacted() {
        let mut index = index(&[("keep.md", "stable content kept")]);
        for i in 0..2000u64 {
            index.upsert(
                "churn.md",
                stamp(i),
                &format!("version {i}\n\nword{i} churn"),
            );
        }
        // Every dead version was dropped at some compaction: the slots stay bounded.
        assert!(
            index.chunks.len() < 2 * COMPACT_MIN_DEAD,
            "{}",
            index.chunks.len()
        );
        assert!(
            index.terms.len() < 2 * COMPACT_MIN_DEAD + 10,
            "{}",
            index.terms.len()
        );
        assert_eq!(paths(&index.search("word1999", 10, None)), ["churn.md"]);
        assert_eq!(index.search("word1998", 10, None), []);
        assert_eq!(paths(&index.search("stable", 10, None)), ["keep.md"]);
        assert_eq!(index.stats().docs, 2);
        assert_eq!(index.stats().chunks, 2);
        assert_eq!(index.stamp("churn.md"), Some(stamp(1999)));
    }

    /// A deterministic corpus with removals and re-indexing, for the round-trip checks.
    fn churned() -> Index {
        let mut rng = fastrand::Rng::with_seed(18);
        let words = [
            "alpha", "beta", "gamma", "delta", "café", "東京", "running", "2026",
        ];
        let mut index = Index::new();
        for i in 0..300u64 {
            let text: Vec<&str> = (0..rng.usize(0..40))
                .map(|_| words[rng.usize(0..words.len())])
                .collect();
            let path = format!("memory/{}.md", rng.u64(0..120));
            index.upsert(
                &path,
                stamp(i),
                &text.join(if i % 3 == 0 { "\n\n" } else { " " }),
            );
            if i % 7 == 0 {
                index.remove(&format!("memory/{}.md", rng.u64(0..120)));
            }
        }
        index
    }

    #[test]
    fn encode_decode_round_trip_gives_the_same_results() {
        let index = churned();
        let bytes = index.encode();
        let back = match Index::decode(&bytes) {
            Ok(back) => back,
            Err(err) => panic!("{err}"),
        };
        let mut a = index.documents();
        let mut b = back.documents();
        a.sort_by(|x, y| x.0.cmp(&y.0));
        b.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(a, b);
        for query in [
            "alpha",
            "beta gamma",
            "cafe running",
            "東京",
            "2026 delta alpha",
            "none",
        ] {
            for prefix in [None, Some("memory/1")] {
                assert_eq!(
                    index.search(query, 20, prefix),
                    back.search(query, 20, prefix),
                    "{query}"
                );
            }
        }
        let (s, t) = (index.stats(), back.stats());
        assert_eq!((s.docs, s.chunks), (t.docs, t.chunks));
        assert!(t.terms <= s.terms);
        // The decoded index keeps working: encode again to the same bytes, then update it.
        assert_eq!(back.encode(), bytes);
        let mut back = back;
        back.upsert("memory/new.md", stamp(1), "zeta alpha");
        assert_eq!(paths(&back.search("zeta", 5, None)), ["memory/new.md"]);
        assert_eq!(
            Index::decode(&Index::new().encode()).map(|i| i.stats().docs),
            Ok(0)
        );
    }

    #[test]
    fn decode_rejects_bad_snapshots_with_an_error() {
        let bytes = churned().encode();
        // Every truncation.
        for len in 0..bytes.len() {
            assert!(Index::decode(&bytes[..len]).is_err(), "truncated at {len}");
        }
        // Flipped bits anywhere.
        let mut rng = fastrand::Rng::with_seed(1);
        for _ in 0..500 {
            let mut bad = bytes.clone();
            let at = rng.usize(0..bad.len());
            bad[at] ^= 1 << rng.u8(0..8);
            assert!(Index::decode(&bad).is_err(), "flip at {at}");
        }
        // Garbage and another version.
        assert!(Index::decode(b"hello").is_err());
        let mut other = bytes;
        other[8] = 2;
        let err = Index::decode(&other).err().unwrap_or_default();
        assert!(err.contains("version 2"), "{err}");
    }

    /// A snapshot body with a valid header and checksum: what a hostile writer could craft.
    fn framed(body: &[u8]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(body);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    #[test]
    fn decode_rejects_hostile_lengths_and_ids_without_panicking() {
        let mut huge = Vec::new();
        put_varint(&mut huge, u64::MAX);
        // A huge document count, a huge path length, a huge chunk count.
        assert!(Index::decode(&framed(&huge)).is_err());
        let mut body = vec![1];
        body.extend_from_slice(&huge);
        assert!(Index::decode(&framed(&body)).is_err());
        let mut body = vec![1, 1, b'a', 0, 0, 0];
        put_varint(&mut body, u64::from(u32::MAX));
        assert!(Index::decode(&framed(&body)).is_err());
        // One document with one chunk, then a posting list pointing at chunk 5.
        let chunk = [1, 1, b'a', 0, 0, 0, 1, 1, 0, 1];
        let mut body = chunk.to_vec();
        body.extend_from_slice(&[1, 1, b'x', 3, 5, 1, 0]);
        let err = Index::decode(&framed(&body)).err().unwrap_or_default();
        assert!(err.contains("posting"), "{err}");
        // The same with chunk 0 decodes; a zero tf, a duplicate term and trailing bytes do not.
        let mut ok = chunk.to_vec();
        ok.extend_from_slice(&[1, 1, b'x', 3, 0, 1, 0]);
        assert!(Index::decode(&framed(&ok)).is_ok());
        let mut body = chunk.to_vec();
        body.extend_from_slice(&[1, 1, b'x', 2, 0, 0]);
        assert!(Index::decode(&framed(&body)).is_err());
        let mut body = chunk.to_vec();
        body.extend_from_slice(&[2, 1, b'x', 3, 0, 1, 0, 1, b'x', 3, 0, 1, 0]);
        assert!(Index::decode(&framed(&body)).is_err());
        let mut body = ok.clone();
        body.push(0);
        assert!(Index::decode(&framed(&body)).is_err());
    }

    #[test]
    fn search_matches_a_naive_bm25_property() {
        // Single-term queries (no phrase bonus) against a direct computation of the formula.
        let index = churned();
        let chunks: Vec<(&ChunkMeta, &str)> = index
            .chunks
            .iter()
            .filter(|c| c.live)
            .filter_map(|c| Some((c, &*index.docs[c.doc as usize].as_ref()?.path)))
            .collect();
        let n = chunks.len() as f32;
        let avg = chunks.iter().map(|(c, _)| c.len as f32).sum::<f32>() / n;
        for word in ["alpha", "cafe", "run", "2026"] {
            let id = index.terms[word];
            let tf_of = |chunk: u32| {
                Entries::new(&index.postings[id as usize].bytes)
                    .find(|e| e.chunk == chunk)
                    .map_or(0, |e| e.tf)
            };
            let ids: Vec<u32> = (0..index.chunks.len() as u32)
                .filter(|&c| index.chunks[c as usize].live)
                .collect();
            let df = ids.iter().filter(|&&c| tf_of(c) > 0).count() as f32;
            let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
            let mut expected: Vec<(f32, &str, u32)> = ids
                .iter()
                .filter(|&&c| tf_of(c) > 0)
                .map(|&c| {
                    let chunk = &index.chunks[c as usize];
                    let tf = tf_of(c) as f32;
                    let s = idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * chunk.len as f32 / avg));
                    (
                        s,
                        chunks
                            .iter()
                            .find(|(m, _)| std::ptr::eq(*m, chunk))
                            .map_or("", |x| x.1),
                        chunk.start_line,
                    )
                })
                .collect();
            expected.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)).then(a.2.cmp(&b.2)));
            let got = index.search(word, usize::MAX, None);
            assert_eq!(got.len(), expected.len(), "{word}");
            for (hit, (score, path, line)) in got.iter().zip(&expected) {
                assert!(
                    (hit.score - score).abs() < 1e-4,
                    "{word}: {hit:?} vs {score}"
                );
                assert_eq!((&*hit.path, hit.start_line), (*path, *line));
            }
        }
    }
}
