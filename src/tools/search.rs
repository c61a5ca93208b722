//! Search tools: `glob` (file names) and `grep` (file contents), built on the ripgrep crates
//! (`ignore` walker, `globset`, `grep-regex`). The line search is ours ([`search_lines`], the
//! loop `grep-searcher` runs for a slice): that crate links `encoding_rs` and its tables
//! (~140 KB of the binary) for encodings grep never asks for.
//!
//! Containment: the search directory is checked beneath the workspace by the kernel
//! (`openat2` RESOLVE_BENEATH); the walk never follows symlinks; every reported file is
//! re-opened beneath the workspace by its workspace-relative path (grep reads its content only
//! through that descriptor), so a directory swapped for a symlink during the walk can neither
//! leak contents nor make an outside file appear. Ignore files above the search directory are
//! read through the workspace handle too, never from outside the workspace.

use std::io::Read;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use globset::{GlobBuilder, GlobMatcher};
use grep_matcher::{LineMatchKind, Matcher};
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use ignore::{Match, WalkBuilder};
use rustix::fs::{Mode, OFlags};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::file_settings::{blocking, FileToolsSettings, BINARY_SNIFF_BYTES};
use super::{parse_args, schema_of, Effect, Tool, ToolContext, ToolError, Workspace};

/// Most results returned by one call (the result is cut to 64 KiB anyway); page with `offset`.
pub const MAX_RESULTS: usize = 1000;
/// Most context lines before or after a grep match.
pub const MAX_CONTEXT_LINES: usize = 20;
/// Largest ignore file read above the search directory (bytes).
const MAX_IGNORE_FILE_BYTES: u64 = 1024 * 1024;

/// Cancels the blocking search when the call's future is dropped (registry timeout).
struct CancelOnDrop(CancellationToken);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// `dir` normalised lexically (`.` dropped, `x/..` folded) and checked beneath the workspace.
fn search_dir(ws: &Workspace, dir: Option<&str>) -> Result<String, ToolError> {
    let dir = dir.unwrap_or(".");
    if dir.contains('\0') {
        return Err(ToolError::InvalidPath(format!(
            "invalid directory {dir:?}: contains NUL"
        )));
    }
    let escape = || super::workspace::map_errno(dir, rustix::io::Errno::XDEV);
    if dir.starts_with('/') {
        return Err(escape());
    }
    let mut parts: Vec<&str> = Vec::new();
    for c in dir.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(escape());
                }
            }
            c => parts.push(c),
        }
    }
    let norm = parts.join("/");
    // Checked by the kernel and against the protected paths, then by type.
    let fd = ws.open_beneath(&norm, OFlags::PATH, Mode::empty())?;
    let st = rustix::fs::fstat(&fd).map_err(|e| super::workspace::map_errno(dir, e))?;
    if !rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir() {
        return Err(ToolError::InvalidPath(format!(
            "`{dir}` is not a directory; give a directory (default: the workspace root)"
        )));
    }
    Ok(norm)
}

/// Workspace-relative path of `rel` (relative to the search directory `dir`).
fn ws_path(dir: &str, rel: &str) -> String {
    if dir.is_empty() {
        rel.to_string()
    } else {
        format!("{dir}/{rel}")
    }
}

/// Ignore rules of the directories above `dir` inside the workspace, deepest first, read
/// through the workspace handle.
fn ancestor_ignores(ws: &Workspace, dir: &str) -> Vec<Gitignore> {
    let mut prefixes = vec![String::new()];
    let parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
    for i in 1..parts.len() {
        prefixes.push(parts[..i].join("/"));
    }
    if parts.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for p in prefixes {
        let root = if p.is_empty() {
            ws.root().to_path_buf()
        } else {
            ws.root().join(&p)
        };
        let mut b = GitignoreBuilder::new(&root);
        let mut any = false;
        for file in [".gitignore", ".ignore"] {
            let Ok(fd) = ws.open_beneath(
                &ws_path(&p, file),
                OFlags::RDONLY | OFlags::NONBLOCK,
                Mode::empty(),
            ) else {
                continue;
            };
            let f = std::fs::File::from(fd);
            if !f.metadata().is_ok_and(|m| m.is_file()) {
                continue;
            }
            let mut text = String::new();
            if f.take(MAX_IGNORE_FILE_BYTES)
                .read_to_string(&mut text)
                .is_err()
            {
                continue;
            }
            for line in text.lines() {
                // A bad line is skipped, as git does.
                let _ = b.add_line(None, line);
                any = true;
            }
        }
        if any {
            if let Ok(gi) = b.build() {
                out.push(gi);
            }
        }
    }
    out.reverse();
    out
}

/// The walker over `dir` (workspace-relative, normalised): respects ignore files and skips
/// hidden files, never follows symlinks, sorted by name, pruned by the ancestors' rules and
/// by the daemon's protected paths (skipped silently; the open of each file checks again).
fn walker(
    ws: &Workspace,
    dir: &str,
    types: Option<ignore::types::Types>,
) -> (PathBuf, ignore::Walk) {
    let root = if dir.is_empty() {
        ws.root().to_path_buf()
    } else {
        ws.root().join(dir)
    };
    let ancestors = ancestor_ignores(ws, dir);
    let mut wb = WalkBuilder::new(&root);
    wb.standard_filters(true)
        .parents(false)
        .git_global(false)
        .require_git(false)
        .follow_links(false)
        .sort_by_file_name(std::cmp::Ord::cmp);
    if let Some(t) = types {
        wb.types(t);
    }
    let guard = ws.guard();
    let ws_root = ws.root().to_path_buf();
    if !ancestors.is_empty() || !guard.is_empty() {
        wb.filter_entry(move |e| {
            if let Ok(rel) = e.path().strip_prefix(&ws_root) {
                if guard.covers_rel(rel) {
                    return false;
                }
            }
            let is_dir = e.file_type().is_some_and(|t| t.is_dir());
            for gi in &ancestors {
                match gi.matched(e.path(), is_dir) {
                    Match::Ignore(_) => return false,
                    Match::Whitelist(_) => return true,
                    Match::None => {}
                }
            }
            true
        });
    }
    (root, wb.build())
}

/// Compile a glob for paths relative to the search directory (`*` stays within a directory,
/// `**` crosses directories).
fn compile_glob(pattern: &str, what: &str) -> Result<GlobMatcher, ToolError> {
    GlobBuilder::new(pattern.trim_start_matches("./"))
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| ToolError::InvalidArgs(format!("invalid {what} `{pattern}`: {e}")))
}

/// Slice `[offset, offset + limit)` of a result list and whether anything is left out.
fn page<T>(all: Vec<T>, offset: usize, limit: Option<usize>) -> (Vec<T>, bool) {
    let total = all.len();
    let limit = limit.unwrap_or(MAX_RESULTS).min(MAX_RESULTS);
    let out: Vec<T> = all.into_iter().skip(offset).take(limit).collect();
    let more = offset.saturating_add(out.len()) < total;
    (out, more)
}

/// The note added when the file budget stopped the walk.
fn scan_note(max: usize) -> String {
    format!(
        "stopped after examining {max} files; narrow `directory` or the pattern to see the rest"
    )
}

/// How `glob` orders its matches.
#[derive(Clone, Copy, Debug, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
pub enum GlobSort {
    /// By path.
    #[default]
    Name,
    /// Most recently modified first.
    Modified,
    /// Largest first.
    Size,
}

/// Arguments of `glob`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GlobArgs {
    /// E.g. `**/*.rs` (`*` stops at `/`, `**` does not), relative to `directory`.
    pub pattern: String,
    /// Relative to the workspace (default: its root).
    pub directory: Option<String>,
    /// `modified`: newest first; `size`: largest first.
    #[serde(default)]
    pub sort: GlobSort,
    /// Most matches (max 1000).
    pub head_limit: Option<usize>,
    /// Matches to skip (paging).
    #[serde(default)]
    pub offset: usize,
}

/// `glob`: workspace files whose path matches a pattern.
pub struct Glob {
    max_files: usize,
}

impl Glob {
    /// With the file budget of `settings`.
    pub fn new(settings: &FileToolsSettings) -> Self {
        Self {
            max_files: settings.search_max_files,
        }
    }
}

#[async_trait]
impl Tool for Glob {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::Glob.name()
    }
    fn description(&self) -> &str {
        "Find workspace files by path pattern (skips hidden and ignored files)."
    }
    fn parameters(&self) -> Value {
        schema_of::<GlobArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::ReadOnly
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: GlobArgs = parse_args(self.name(), args)?;
        let matcher = compile_glob(&a.pattern, "glob pattern")?;
        let ws = ctx.workspace.clone();
        let cancel = ctx.cancel.child_token();
        let _guard = CancelOnDrop(cancel.clone());
        let max_files = self.max_files;
        blocking(move || {
            let dir = search_dir(&ws, a.directory.as_deref())?;
            let (root, walk) = walker(&ws, &dir, None);
            let mut found: Vec<(String, i64, u64)> = Vec::new();
            let mut examined = 0usize;
            let mut limit_hit = false;
            for ent in walk {
                if cancel.is_cancelled() {
                    return Err(ToolError::Cancelled);
                }
                let Ok(ent) = ent else { continue };
                if !ent.file_type().is_some_and(|t| t.is_file()) {
                    continue;
                }
                examined += 1;
                if examined > max_files {
                    limit_hit = true;
                    break;
                }
                let Some(rel) = rel_str(&root, ent.path()) else {
                    continue;
                };
                if !matcher.is_match(&rel) {
                    continue;
                }
                let path = ws_path(&dir, &rel);
                // Re-check by the kernel: the file is in the workspace now, by this path.
                let Ok(fd) = ws.open_beneath(&path, OFlags::PATH | OFlags::NOFOLLOW, Mode::empty())
                else {
                    continue;
                };
                let Ok(st) = rustix::fs::fstat(&fd) else {
                    continue;
                };
                if !rustix::fs::FileType::from_raw_mode(st.st_mode).is_file() {
                    continue;
                }
                found.push((path, st.st_mtime, u64::try_from(st.st_size).unwrap_or(0)));
            }
            match a.sort {
                GlobSort::Name => found.sort_by(|x, y| x.0.cmp(&y.0)),
                GlobSort::Modified => {
                    found.sort_by(|x, y| y.1.cmp(&x.1).then_with(|| x.0.cmp(&y.0)))
                }
                GlobSort::Size => found.sort_by(|x, y| y.2.cmp(&x.2).then_with(|| x.0.cmp(&y.0))),
            }
            let total = found.len();
            let (matches, more) = page(found, a.offset, a.head_limit);
            let matches: Vec<String> = matches.into_iter().map(|m| m.0).collect();
            let mut v = json!({
                "matches": matches,
                "count": matches.len(),
                "total_found": total,
                "truncated": more || limit_hit,
            });
            if limit_hit {
                v["note"] = json!(scan_note(max_files));
            }
            Ok(v)
        })
        .await
    }
}

/// `path` relative to `root` as UTF-8 with `/` separators.
fn rel_str(root: &Path, path: &Path) -> Option<String> {
    path.strip_prefix(root).ok()?.to_str().map(str::to_string)
}

/// What `grep` returns.
#[derive(Clone, Copy, Debug, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
#[schemars(inline)]
pub enum OutputMode {
    /// Matching lines: `{file, line, content, before?, after?}`.
    #[default]
    Content,
    /// Paths of files with a match.
    FilesWithMatches,
    /// `{file, count}` per file with a match.
    Count,
}

/// Arguments of `grep`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrepArgs {
    /// Rust regex, matched per line.
    pub pattern: String,
    /// Relative to the workspace (default: its root).
    pub directory: Option<String>,
    /// Glob of file names (of paths if it has `/`).
    pub file_pattern: Option<String>,
    /// File type, e.g. `rust`, `py`, `md`.
    #[serde(rename = "type")]
    pub file_type: Option<String>,
    /// Default: content (matching lines).
    #[serde(default)]
    pub output_mode: OutputMode,
    /// Ignore case.
    #[serde(default)]
    pub case_insensitive: bool,
    /// Lines around each match (max 20).
    pub context: Option<usize>,
    /// Lines before each match.
    pub before_context: Option<usize>,
    /// Lines after each match.
    pub after_context: Option<usize>,
    /// Most results (max 1000).
    pub head_limit: Option<usize>,
    /// Results to skip (paging).
    #[serde(default)]
    pub offset: usize,
}

/// `grep`: search file contents in the workspace with a regular expression.
pub struct Grep {
    max_files: usize,
    max_file_bytes: u64,
    max_line_chars: usize,
}

impl Grep {
    /// With the limits of `settings`.
    pub fn new(settings: &FileToolsSettings) -> Self {
        Self {
            max_files: settings.search_max_files,
            max_file_bytes: settings.search_max_file_bytes,
            max_line_chars: settings.search_max_line_chars,
        }
    }
}

/// Counts matching lines and keeps the byte ranges of those whose result index (`first` +
/// position in this file) falls in `keep`, so memory stays bounded by the page. With
/// `stop_at_first`, stops at the first match.
#[derive(Default)]
struct Collect {
    first: usize,
    keep: std::ops::Range<usize>,
    stop_at_first: bool,
    count: usize,
    lines: Vec<(u64, std::ops::Range<usize>)>,
}

/// A file holding a NUL byte in its first 64 KiB is binary and skipped (what `grep-searcher`
/// checked when searching a slice).
const BINARY_WINDOW: usize = 64 * 1024;

/// The text to search: a UTF-16 file (by its byte-order mark) decoded to UTF-8, a UTF-8 mark
/// dropped, anything else as it is (`grep-searcher`'s BOM sniffing, which this replaces).
fn decode_bom(buf: Vec<u8>) -> Vec<u8> {
    let utf16 = |body: &[u8], unit: fn([u8; 2]) -> u16| -> Vec<u8> {
        let units = body.chunks_exact(2).map(|c| unit([c[0], c[1]]));
        let mut text: String = char::decode_utf16(units)
            .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect();
        if body.len() % 2 == 1 {
            text.push(char::REPLACEMENT_CHARACTER);
        }
        text.into_bytes()
    };
    if let Some(body) = buf.strip_prefix(b"\xEF\xBB\xBF") {
        body.to_vec()
    } else if let Some(body) = buf.strip_prefix(b"\xFF\xFE") {
        utf16(body, u16::from_le_bytes)
    } else if let Some(body) = buf.strip_prefix(b"\xFE\xFF") {
        utf16(body, u16::from_be_bytes)
    } else {
        buf
    }
}

/// The line holding byte `at` of `buf`, its terminator included.
fn line_at_offset(buf: &[u8], at: usize) -> std::ops::Range<usize> {
    let start = buf[..at]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let end = buf[at..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(buf.len(), |i| at + i + 1);
    start..end
}

/// Every line of `buf` that `matcher` matches, into `sink`, with its 1-based number: the
/// line-by-line search of `grep-searcher` (a candidate line found in the rest of the buffer,
/// confirmed by the matcher on that line alone, its terminator stripped, so `^` and `$` are
/// the line's). The matcher's line terminator is `\n`, so no match spans lines.
fn search_lines(
    matcher: &RegexMatcher,
    buf: &[u8],
    sink: &mut Collect,
) -> Result<(), grep_matcher::NoError> {
    let (mut pos, mut line_no, mut counted) = (0usize, 1u64, 0usize);
    while pos < buf.len() {
        let (at, confirmed) = match matcher.find_candidate_line(&buf[pos..])? {
            None => break,
            Some(LineMatchKind::Confirmed(i)) => (pos + i, true),
            Some(LineMatchKind::Candidate(i)) => (pos + i, false),
        };
        let line = line_at_offset(buf, at);
        if line.start == buf.len() {
            // An empty match after the last terminator: not a line.
            break;
        }
        pos = line.end;
        let text = &buf[line.clone()];
        if !confirmed && !matcher.is_match(text.strip_suffix(b"\n").unwrap_or(text))? {
            continue;
        }
        line_no += buf[counted..line.start]
            .iter()
            .filter(|&&b| b == b'\n')
            .count() as u64;
        counted = line.start;
        if sink.keep.contains(&(sink.first + sink.count)) {
            sink.lines.push((line_no, line));
        }
        sink.count += 1;
        if sink.stop_at_first {
            break;
        }
    }
    Ok(())
}

/// A line for the result: lossy UTF-8 without its terminator, cut at `max` characters.
fn show_line(bytes: &[u8], max: usize) -> String {
    let s = String::from_utf8_lossy(bytes);
    let s = s.trim_end_matches(['\n', '\r']);
    let n = s.chars().count();
    if n <= max {
        s.to_string()
    } else {
        let head: String = s.chars().take(max).collect();
        format!("{head}… [line truncated: {n} characters]")
    }
}

#[async_trait]
impl Tool for Grep {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::Grep.name()
    }
    fn description(&self) -> &str {
        "Search workspace file contents with a regex (skips hidden, ignored and binary files)."
    }
    fn parameters(&self) -> Value {
        schema_of::<GrepArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::ReadOnly
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: GrepArgs = parse_args(self.name(), args)?;
        // Multi-line mode only gives `^` and `$` their per-line meaning (as in grep and
        // ripgrep; `crlf`: also before a `\r\n`); a match still never spans lines (the line
        // terminator is excluded).
        let matcher: RegexMatcher = RegexMatcherBuilder::new()
            .case_insensitive(a.case_insensitive)
            .multi_line(true)
            .crlf(true)
            .line_terminator(Some(b'\n'))
            .build(&a.pattern)
            .map_err(|e| ToolError::InvalidArgs(format!("invalid regex `{}`: {e}", a.pattern)))?;
        let file_glob = match a.file_pattern.as_deref() {
            Some(p) => Some((compile_glob(p, "file_pattern")?, p.contains('/'))),
            None => None,
        };
        let types = match a.file_type.as_deref() {
            Some(t) => Some(
                ignore::types::TypesBuilder::new()
                    .add_defaults()
                    .select(t)
                    .build()
                    .map_err(|e| ToolError::InvalidArgs(format!("invalid type `{t}`: {e}; use a name like rust, py, js, ts, go, md, json")))?,
            ),
            None => None,
        };
        let ctx_n = a.context.unwrap_or(0);
        let before = a.before_context.unwrap_or(ctx_n).min(MAX_CONTEXT_LINES);
        let after = a.after_context.unwrap_or(ctx_n).min(MAX_CONTEXT_LINES);
        let ws = ctx.workspace.clone();
        let cancel = ctx.cancel.child_token();
        let _guard = CancelOnDrop(cancel.clone());
        let (max_files, max_bytes, max_chars) =
            (self.max_files, self.max_file_bytes, self.max_line_chars);
        blocking(move || {
            let dir = search_dir(&ws, a.directory.as_deref())?;
            let (root, walk) = walker(&ws, &dir, types);
            let limit = a.head_limit.unwrap_or(MAX_RESULTS).min(MAX_RESULTS);
            let window = a.offset..a.offset.saturating_add(limit);
            let mut entries = 0usize; // results (lines, files or file counts) seen
            let mut total_lines = 0usize;
            let mut out: Vec<Value> = Vec::new();
            let mut examined = 0usize;
            let mut limit_hit = false;
            for ent in walk {
                if cancel.is_cancelled() {
                    return Err(ToolError::Cancelled);
                }
                let Ok(ent) = ent else { continue };
                if !ent.file_type().is_some_and(|t| t.is_file()) {
                    continue;
                }
                let Some(rel) = rel_str(&root, ent.path()) else {
                    continue;
                };
                if let Some((g, by_path)) = &file_glob {
                    let subject = if *by_path {
                        rel.as_str()
                    } else {
                        rel.rsplit('/').next().unwrap_or(&rel)
                    };
                    if !g.is_match(subject) {
                        continue;
                    }
                }
                examined += 1;
                if examined > max_files {
                    limit_hit = true;
                    break;
                }
                let path = ws_path(&dir, &rel);
                // Content only ever comes through a descriptor the kernel checked.
                let Ok(fd) = ws.open_beneath(
                    &path,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK,
                    Mode::empty(),
                ) else {
                    continue;
                };
                let file = std::fs::File::from(fd);
                if !file.metadata().is_ok_and(|m| m.is_file()) {
                    continue;
                }
                let mut buf = Vec::new();
                if file.take(max_bytes).read_to_end(&mut buf).is_err() {
                    continue;
                }
                if buf[..buf.len().min(BINARY_SNIFF_BYTES)].contains(&0) {
                    continue;
                }
                let buf = decode_bom(buf);
                if buf[..buf.len().min(BINARY_WINDOW)].contains(&0) {
                    continue;
                }
                let mut sink = Collect {
                    first: entries,
                    keep: if a.output_mode == OutputMode::Content {
                        window.clone()
                    } else {
                        0..0
                    },
                    stop_at_first: a.output_mode == OutputMode::FilesWithMatches,
                    ..Collect::default()
                };
                if search_lines(&matcher, &buf, &mut sink).is_err() {
                    continue;
                }
                if sink.count == 0 {
                    continue;
                }
                total_lines += sink.count;
                match a.output_mode {
                    OutputMode::FilesWithMatches => {
                        if window.contains(&entries) {
                            out.push(json!(path));
                        }
                        entries += 1;
                    }
                    OutputMode::Count => {
                        if window.contains(&entries) {
                            out.push(json!({"file": path, "count": sink.count}));
                        }
                        entries += 1;
                    }
                    OutputMode::Content => {
                        let starts: Vec<usize> = if before + after > 0 && !sink.lines.is_empty() {
                            std::iter::once(0)
                                .chain(
                                    buf.iter()
                                        .enumerate()
                                        .filter(|(_, &b)| b == b'\n')
                                        .map(|(i, _)| i + 1),
                                )
                                .filter(|&i| i < buf.len())
                                .collect()
                        } else {
                            Vec::new()
                        };
                        let line_at = |i: usize| -> String {
                            let s = starts[i];
                            let e = starts.get(i + 1).copied().unwrap_or(buf.len());
                            show_line(&buf[s..e], max_chars)
                        };
                        for (ln, range) in &sink.lines {
                            let mut m = json!({
                                "file": path,
                                "line": ln,
                                "content": show_line(&buf[range.clone()], max_chars),
                            });
                            let idx = usize::try_from(*ln).unwrap_or(1).saturating_sub(1);
                            if before > 0 {
                                let from = idx.saturating_sub(before);
                                m["before"] = json!((from..idx).map(line_at).collect::<Vec<_>>());
                            }
                            if after > 0 {
                                let to = (idx + 1 + after).min(starts.len());
                                m["after"] = json!((idx + 1..to).map(line_at).collect::<Vec<_>>());
                            }
                            out.push(m);
                        }
                        entries += sink.count;
                    }
                }
            }
            let total_found = match a.output_mode {
                OutputMode::Content | OutputMode::Count => total_lines,
                OutputMode::FilesWithMatches => entries,
            };
            let more = a.offset.saturating_add(out.len()) < entries;
            let mut v = json!({
                "count": out.len(),
                "matches": out,
                "total_found": total_found,
                "truncated": more || limit_hit,
            });
            if limit_hit {
                v["note"] = json!(scan_note(max_files));
            }
            Ok(v)
        })
        .await
    }
}

#[cfg(test)]
#[path = "search_tests.rs"]
mod tests;
