//! File tools contained in the workspace by kernel-checked opens: `read_file`,
//! `list_directory`, `write_file`, `edit_file`; and [`file_tools`] to register the whole
//! file-tool family (search and memory tools included) in one line.
//!
//! Writes never follow a string path: the parent directory is opened beneath the workspace
//! (`openat2` RESOLVE_BENEATH), and the file is replaced by `renameat` of a temporary file
//! made in that directory, so neither symlinks nor hard links are ever written through.

use std::io::{Read, Seek};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use rustix::fs::{AtFlags, Mode, OFlags};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use super::file_settings::READ_FILE_MAX_BYTES;
pub(crate) use super::file_settings::{blocking, BINARY_SNIFF_BYTES};
pub use super::file_settings::{
    FileToolsFile, FileToolsSettings, DEFAULT_MAX_EDIT_BYTES, DEFAULT_MAX_WRITE_BYTES,
    DEFAULT_MEMORY_MAX_BYTES, DEFAULT_SEARCH_MAX_FILES, DEFAULT_SEARCH_MAX_FILE_BYTES,
    DEFAULT_SEARCH_MAX_LINE_CHARS,
};
use super::shared_docs::MemoryDocs;
use super::workspace::{check_replaceable, refuse_hard_link, write_atomic};
use super::{parse_args, schema_of, Effect, Tool, ToolContext, ToolError};

/// Most bytes of file content one `read_file` result carries (the registry cuts results to
/// 64 KiB anyway): reading stops there, at a line boundary when it can, so a call holds about
/// this much whatever the file's size.
const READ_FILE_CONTENT_BUDGET: usize = super::MAX_TOOL_RESULT_BYTES;
/// Room a `read_file` result keeps beside its content (the other members and the note).
const READ_FILE_ENVELOPE: usize = 512;
/// Read buffer of `read_file` (bytes).
const READ_FILE_CHUNK: usize = 64 * 1024;

/// What [`read_lines`] found.
#[derive(Debug, PartialEq, Eq)]
struct Lines {
    /// The selected lines (lossy UTF-8), at most the budget.
    content: String,
    /// Lines in the part of the file examined (the first [`READ_FILE_MAX_BYTES`]).
    total_lines: u64,
    /// The content budget stopped the selection before `take` lines.
    budget_hit: bool,
    /// 1-based number of the first line not returned.
    next_line: u64,
}

/// Stream the first [`READ_FILE_MAX_BYTES`] of `file` through a fixed buffer: skip `start`
/// lines, keep the next `take` lines up to `budget` bytes, count every line. Memory is the
/// buffer plus the budget, whatever the file's size or the length of its lines. `Ok(None)`
/// when the file is binary (NUL in its first [`BINARY_SNIFF_BYTES`]).
fn read_lines(
    file: &mut impl Read,
    start: u64,
    take: u64,
    budget: usize,
) -> std::io::Result<Option<Lines>> {
    let mut file = file.take(READ_FILE_MAX_BYTES);
    let mut buf = vec![0u8; READ_FILE_CHUNK];
    let mut content: Vec<u8> = Vec::new();
    let end = start.saturating_add(take);
    let mut line = 0u64; // 0-based index of the line being read
    let mut partial = false; // bytes of `line` seen without its newline yet
    let mut budget_hit = false;
    let mut next_line = None;
    let mut sniffed = 0usize;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let chunk = &buf[..n];
        if sniffed < BINARY_SNIFF_BYTES {
            let upto = chunk.len().min(BINARY_SNIFF_BYTES - sniffed);
            if chunk[..upto].contains(&0) {
                return Ok(None);
            }
            sniffed += upto;
        }
        let mut rest = chunk;
        while !rest.is_empty() {
            let (piece, newline) = match rest.iter().position(|&b| b == b'\n') {
                Some(i) => (&rest[..=i], true),
                None => (rest, false),
            };
            rest = &rest[piece.len()..];
            if (start..end).contains(&line) && !budget_hit {
                let room = budget - content.len();
                if piece.len() <= room {
                    content.extend_from_slice(piece);
                } else {
                    budget_hit = true;
                    // A line longer than the whole budget is cut; otherwise stop before it.
                    if content.is_empty() {
                        content.extend_from_slice(&piece[..room]);
                        next_line = Some(line + 2);
                    } else {
                        next_line = Some(line + 1);
                    }
                }
            }
            if newline {
                line += 1;
                partial = false;
            } else {
                partial = true;
            }
        }
    }
    let total_lines = line + u64::from(partial);
    let mut content = String::from_utf8_lossy(&content).into_owned();
    if budget_hit {
        // A cut inside a character left a replacement character: drop it.
        if content.len() > budget {
            let mut at = budget;
            while !content.is_char_boundary(at) {
                at -= 1;
            }
            content.truncate(at);
        }
    }
    Ok(Some(Lines {
        content,
        total_lines,
        budget_hit,
        next_line: next_line.unwrap_or(end.min(total_lines) + 1),
    }))
}

/// Arguments of `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// Relative to the workspace.
    pub path: String,
    /// First line, 1-based.
    pub offset: Option<u64>,
    /// Most lines (default: all).
    pub limit: Option<u64>,
}

/// `read_file`: the contents of a text file in the workspace.
pub struct ReadFile;

#[async_trait]
impl Tool for ReadFile {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::ReadFile.name()
    }
    fn description(&self) -> &str {
        "Read a text file in the workspace."
    }
    fn parameters(&self) -> Value {
        schema_of::<ReadFileArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::ReadOnly
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: ReadFileArgs = parse_args(self.name(), args)?;
        if a.offset == Some(0) {
            return Err(ToolError::InvalidArgs(
                "offset is 1-based: use 1 for the first line".into(),
            ));
        }
        let ws = ctx.workspace.clone();
        blocking(move || {
            // NONBLOCK: opening a FIFO must not hang the call (it is refused just below).
            let fd = ws.open_beneath(&a.path, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty())?;
            let mut file = std::fs::File::from(fd);
            let meta = file
                .metadata()
                .map_err(|e| ToolError::ExecutionFailed(format!("{}: {e}", a.path)))?;
            if meta.is_dir() {
                return Err(ToolError::InvalidArgs(format!(
                    "`{}` is a directory: use list_directory",
                    a.path
                )));
            }
            if !meta.is_file() {
                return Err(ToolError::InvalidArgs(format!(
                    "`{}` is not a regular file (device, FIFO or socket)",
                    a.path
                )));
            }
            let start = a.offset.unwrap_or(1).saturating_sub(1);
            let take = a.limit.unwrap_or(u64::MAX);
            let mut budget = READ_FILE_CONTENT_BUDGET;
            let mut r = read_lines(&mut file, start, take, budget)
                .map_err(|e| ToolError::ExecutionFailed(format!("{}: {e}", a.path)))?;
            // The budget is in file bytes, the cap in bytes the provider receives (quotes,
            // backslashes and newlines are escaped twice): read fewer lines until it fits, so
            // the registry never cuts the content behind the note's offset.
            for _ in 0..4 {
                let Some(l) = &r else { break };
                let wire = super::truncate::size(&json!(l.content));
                if wire + READ_FILE_ENVELOPE <= super::MAX_TOOL_RESULT_BYTES {
                    break;
                }
                budget = (budget.saturating_mul(super::MAX_TOOL_RESULT_BYTES - READ_FILE_ENVELOPE)
                    / wire)
                    .saturating_sub(64);
                file.seek(std::io::SeekFrom::Start(0))
                    .map_err(|e| ToolError::ExecutionFailed(format!("{}: {e}", a.path)))?;
                r = read_lines(&mut file, start, take, budget)
                    .map_err(|e| ToolError::ExecutionFailed(format!("{}: {e}", a.path)))?;
            }
            let Some(r) = r else {
                return Err(ToolError::BinaryFile(format!(
                    "`{}` is a binary file ({} bytes); it cannot be read as text",
                    a.path,
                    meta.len()
                )));
            };
            let cut_by_size = meta.len() > READ_FILE_MAX_BYTES;
            let truncated = cut_by_size || r.budget_hit || start.saturating_add(take) < r.total_lines;
            let mut v = json!({
                "content": r.content,
                "total_lines": r.total_lines,
                "truncated": truncated,
            });
            if r.budget_hit {
                v["note"] = json!(format!(
                    "content stops at about {budget} bytes; continue with offset {}",
                    r.next_line
                ));
            } else if cut_by_size {
                v["note"] = json!(format!(
                    "the file is {} bytes; only its first {READ_FILE_MAX_BYTES} bytes are read (total_lines counts the lines in them); use grep or exec_shell for the rest",
                    meta.len()
                ));
            }
            Ok(v)
        })
        .await
    }
}

/// Arguments of `list_directory`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListDirectoryArgs {
    /// Relative to the workspace (`.`: its root).
    pub path: String,
}

/// `list_directory`: immediate children of a workspace directory, sorted by name.
pub struct ListDirectory;

#[async_trait]
impl Tool for ListDirectory {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::ListDirectory.name()
    }
    fn description(&self) -> &str {
        "List a workspace directory."
    }
    fn parameters(&self) -> Value {
        schema_of::<ListDirectoryArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::ReadOnly
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: ListDirectoryArgs = parse_args(self.name(), args)?;
        let ws = ctx.workspace.clone();
        blocking(move || {
            let fd = ws.open_beneath(&a.path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
            let dir = rustix::fs::Dir::read_from(&fd)
                .map_err(|e| super::workspace::map_errno(&a.path, e))?;
            let guard = ws.guard();
            let protected = guard.listing(std::os::fd::AsFd::as_fd(&fd), &a.path)?;
            let mut entries = Vec::new();
            for ent in dir {
                let ent = ent.map_err(|e| super::workspace::map_errno(&a.path, e))?;
                let name = ent.file_name().to_string_lossy().into_owned();
                if name == "." || name == ".." {
                    continue;
                }
                let st = rustix::fs::statat(&fd, ent.file_name(), AtFlags::SYMLINK_NOFOLLOW).ok();
                let is_dir = st
                    .as_ref()
                    .is_some_and(|s| rustix::fs::FileType::from_raw_mode(s.st_mode).is_dir());
                // Named, so the model knows not to try; never opened.
                if let Some(kind) = protected.kind_of(
                    std::ffi::OsStr::from_bytes(ent.file_name().to_bytes()),
                    st.as_ref(),
                ) {
                    entries.push(json!({
                        "name": name, "is_dir": is_dir, "protected": kind.describe(),
                    }));
                    continue;
                }
                let size = st.map_or(0, |s| u64::try_from(s.st_size).unwrap_or(0));
                entries.push(json!({ "name": name, "is_dir": is_dir, "size": size }));
            }
            entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
            Ok(json!({ "entries": entries }))
        })
        .await
    }
}

/// Every workspace file tool of this module family, ready to register: `read_file`,
/// `list_directory`, `write_file`, `edit_file`, `glob`, `grep`, `memory_read`, `memory_write`.
/// `memory_fallback` is the legacy memory file read when `memory/MEMORY.md` is missing
/// (`~/.nanobot/workspace/memory/MEMORY.md`), or `None`.
pub fn file_tools(
    settings: &FileToolsSettings,
    memory_fallback: Option<PathBuf>,
) -> Vec<Arc<dyn Tool>> {
    file_tools_writing(settings, memory_fallback, &MemoryDocs::default())
}

/// [`file_tools`] writing the daemon's memory documents `docs` (the memory index watches
/// their writes; in cluster mode the cluster's copy is written first).
pub fn file_tools_writing(
    settings: &FileToolsSettings,
    memory_fallback: Option<PathBuf>,
    docs: &MemoryDocs,
) -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(ReadFile),
        Arc::new(ListDirectory),
        Arc::new(WriteFile {
            docs: docs.clone(),
            ..WriteFile::new(settings)
        }),
        Arc::new(EditFile {
            docs: docs.clone(),
            ..EditFile::new(settings)
        }),
        Arc::new(super::search::Glob::new(settings)),
        Arc::new(super::search::Grep::new(settings)),
        Arc::new(
            super::memory::MemoryRead::new(memory_fallback)
                .with_max_bytes(settings.memory_max_bytes),
        ),
        Arc::new(
            super::memory::MemoryWrite::new()
                .with_max_bytes(settings.memory_max_bytes)
                .with_docs(docs.clone()),
        ),
    ]
}

/// Arguments of `write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// Relative to the workspace.
    pub path: String,
    /// The whole new content.
    pub content: String,
    /// Keep the old content as `PATH.bak`.
    #[serde(default)]
    pub backup: bool,
}

/// `write_file`: create or replace a file atomically.
pub struct WriteFile {
    max_bytes: u64,
    /// The daemon's memory documents (a context file or memory document written here is the
    /// cluster's copy in cluster mode, and the memory index is told).
    docs: MemoryDocs,
}

impl WriteFile {
    /// With the write limit of `settings`.
    pub fn new(settings: &FileToolsSettings) -> Self {
        Self {
            max_bytes: settings.max_write_bytes,
            docs: MemoryDocs::default(),
        }
    }
}

/// Read all of an open regular file, refusing more than `max` bytes.
fn read_capped(
    file: &mut std::fs::File,
    max: u64,
    rel: &str,
    what: &str,
) -> Result<Vec<u8>, ToolError> {
    let mut buf = Vec::new();
    file.take(max.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(|e| ToolError::ExecutionFailed(format!("reading `{rel}`: {e}")))?;
    if buf.len() as u64 > max {
        return Err(ToolError::InvalidArgs(format!(
            "`{rel}` is larger than {max} bytes, too large to {what}"
        )));
    }
    Ok(buf)
}

/// Open `name` in `dir` for reading without following a symlink or blocking on a FIFO, and
/// check that it is still a single-link regular file.
fn open_regular(dir: &OwnedFd, name: &str, rel: &str) -> Result<std::fs::File, ToolError> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| super::workspace::map_errno(rel, e))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| super::workspace::map_errno(rel, e))?;
    if !rustix::fs::FileType::from_raw_mode(st.st_mode).is_file() {
        return Err(ToolError::InvalidArgs(format!(
            "`{rel}` is not a regular file"
        )));
    }
    refuse_hard_link(&st, rel)?;
    Ok(std::fs::File::from(fd))
}

#[async_trait]
impl Tool for WriteFile {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::WriteFile.name()
    }
    fn description(&self) -> &str {
        "Create or replace a whole file in the workspace (to change part of one, use edit_file)."
    }
    fn parameters(&self) -> Value {
        schema_of::<WriteFileArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::Writes
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: WriteFileArgs = parse_args(self.name(), args)?;
        if a.content.len() as u64 > self.max_bytes {
            return Err(ToolError::InvalidArgs(format!(
                "content is {} bytes; write_file accepts at most {} bytes",
                a.content.len(),
                self.max_bytes
            )));
        }
        let ws = ctx.workspace.clone();
        let max_backup = self.max_bytes;
        let docs = self.docs.clone();
        blocking(move || {
            let rel = a.path.as_str();
            // Cluster mode: a context file or memory document is the cluster's copy.
            let shared = docs.begin(&ws, super::shared_docs::Scope::Agent, rel)?;
            if let Some(p) = &shared {
                p.check_size(a.content.len())?;
            }
            let (dir, name) = ws.open_parent(rel, true)?;
            let existing = check_replaceable(&ws, &dir, &name, rel)?;
            let mut backup = None;
            if let (true, Some(old)) = (a.backup, existing) {
                let mut f = open_regular(&dir, &name, rel)?;
                let data = read_capped(&mut f, max_backup, rel, "back up")?;
                let bak_name = format!("{name}.bak");
                let bak_rel = format!("{rel}.bak");
                ws.guard()
                    .check_entry(std::os::fd::AsFd::as_fd(&dir), &bak_name, &bak_rel)?;
                let bak_old = check_replaceable(&ws, &dir, &bak_name, &bak_rel)?;
                write_atomic(&dir, &bak_name, &data, old.mode, bak_old, &bak_rel)?;
                backup = Some(bak_rel);
            }
            let mode = existing.map_or(0o644, |e| e.mode);
            write_atomic(&dir, &name, a.content.as_bytes(), mode, existing, rel)?;
            if let Some(p) = shared {
                p.finish(a.content.as_bytes())?;
            }
            if super::memory::is_memory_path(rel) {
                docs.touched();
            }
            let bytes = a.content.len();
            let mut v = json!({
                "message": format!("Successfully wrote {bytes} bytes to {rel}"),
                "bytes": bytes,
                "created": existing.is_none(),
            });
            if let Some(b) = backup {
                v["backup"] = json!(b);
            }
            Ok(v)
        })
        .await
    }
}

/// Arguments of `edit_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditFileArgs {
    /// Relative to the workspace.
    pub path: String,
    /// Exact text, whitespace included; must occur once unless `replace_all`.
    pub old_text: String,
    /// Replacement.
    pub new_text: String,
    /// Replace every occurrence.
    #[serde(default)]
    pub replace_all: bool,
}

/// `edit_file`: replace an exact piece of text in a file, atomically.
pub struct EditFile {
    max_read: u64,
    max_write: u64,
    /// As [`WriteFile`]'s.
    docs: MemoryDocs,
}

impl EditFile {
    /// With the limits of `settings`.
    pub fn new(settings: &FileToolsSettings) -> Self {
        Self {
            max_read: settings.max_edit_bytes,
            max_write: settings.max_write_bytes,
            docs: MemoryDocs::default(),
        }
    }
}

/// Largest file searched for a near match when `old_text` is not found (bytes).
const EDIT_HINT_MAX_BYTES: usize = 1024 * 1024;
/// Most candidate line numbers listed when `old_text` matches several times.
const EDIT_MAX_LISTED_MATCHES: usize = 10;

/// 1-based line number of byte offset `at` in `text`.
fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// `text` folded for a loose comparison (whitespace dropped and/or lowercased), with the byte
/// offset in `text` of every byte of the folded string.
fn fold(text: &str, drop_ws: bool, lower: bool) -> (String, Vec<usize>) {
    let mut out = String::new();
    let mut at = Vec::new();
    for (i, ch) in text.char_indices() {
        if drop_ws && ch.is_whitespace() {
            continue;
        }
        let mut push = |c: char| {
            out.push(c);
            at.extend(std::iter::repeat_n(i, c.len_utf8()));
        };
        if lower {
            ch.to_lowercase().for_each(&mut push);
        } else {
            push(ch);
        }
    }
    (out, at)
}

/// Where `needle` occurs in `hay` under a loose comparison: the 1-based line and its text.
fn loose_match(hay: &str, needle: &str, drop_ws: bool, lower: bool) -> Option<(usize, String)> {
    let (n, _) = fold(needle, drop_ws, lower);
    if n.is_empty() || hay.len() > EDIT_HINT_MAX_BYTES {
        return None;
    }
    let (h, at) = fold(hay, drop_ws, lower);
    let pos = h.find(&n)?;
    let off = *at.get(pos)?;
    let line = line_of(hay, off);
    let text = hay.lines().nth(line - 1).unwrap_or("").trim_end();
    let text: String = text.chars().take(200).collect();
    Some((line, text))
}

#[async_trait]
impl Tool for EditFile {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::EditFile.name()
    }
    fn description(&self) -> &str {
        "Replace exact text in a workspace file."
    }
    fn parameters(&self) -> Value {
        schema_of::<EditFileArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::Writes
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: EditFileArgs = parse_args(self.name(), args)?;
        if a.old_text.is_empty() {
            return Err(ToolError::InvalidArgs(
                "old_text is empty: give the exact text to replace (use write_file to write a whole file)".into(),
            ));
        }
        let ws = ctx.workspace.clone();
        let (max_read, max_write) = (self.max_read, self.max_write);
        let docs = self.docs.clone();
        blocking(move || {
            let rel = a.path.as_str();
            let shared = docs.begin(&ws, super::shared_docs::Scope::Agent, rel)?;
            let (dir, name) = ws.open_parent(rel, false)?;
            let Some(existing) = check_replaceable(&ws, &dir, &name, rel)? else {
                return Err(ToolError::FileNotFound(format!(
                    "`{rel}` does not exist in the workspace; use write_file to create it"
                )));
            };
            let mut f = open_regular(&dir, &name, rel)?;
            let st = rustix::fs::fstat(&f).map_err(|e| super::workspace::map_errno(rel, e))?;
            if (st.st_dev, st.st_ino) != existing.id {
                return Err(ToolError::ExecutionFailed(format!(
                    "`{rel}` changed while being opened; retry"
                )));
            }
            let data = read_capped(&mut f, max_read, rel, "edit (use write_file to replace it)")?;
            if data[..data.len().min(BINARY_SNIFF_BYTES)].contains(&0) {
                return Err(ToolError::BinaryFile(format!(
                    "`{rel}` is a binary file; edit_file only edits text"
                )));
            }
            let text = String::from_utf8(data).map_err(|_| {
                ToolError::BinaryFile(format!(
                    "`{rel}` is not valid UTF-8; edit_file only edits UTF-8 text"
                ))
            })?;
            let positions: Vec<usize> = text.match_indices(&a.old_text).map(|(i, _)| i).collect();
            match positions.len() {
                0 => {
                    let mut msg = format!("old_text was not found in `{rel}`.");
                    if let Some((line, t)) = loose_match(&text, &a.old_text, true, false) {
                        msg.push_str(&format!(
                            " A match that differs only in whitespace exists at line {line}: `{t}`; copy the text exactly (read_file) including indentation."
                        ));
                    } else if let Some((line, t)) = loose_match(&text, &a.old_text, false, true) {
                        msg.push_str(&format!(
                            " A match that differs only in letter case exists at line {line}: `{t}`; copy the text exactly."
                        ));
                    } else {
                        msg.push_str(" Read the file and copy the exact text to replace.");
                    }
                    return Err(ToolError::InvalidArgs(msg));
                }
                1 => {}
                n if !a.replace_all => {
                    let lines: Vec<String> = positions
                        .iter()
                        .take(EDIT_MAX_LISTED_MATCHES)
                        .map(|&p| line_of(&text, p).to_string())
                        .collect();
                    let more = if n > EDIT_MAX_LISTED_MATCHES { ", …" } else { "" };
                    return Err(ToolError::InvalidArgs(format!(
                        "old_text matches {n} times in `{rel}` (lines {}{more}). Add surrounding lines to old_text so it matches once, or set replace_all to true to replace every occurrence.",
                        lines.join(", ")
                    )));
                }
                _ => {}
            }
            let replacements = positions.len();
            let new = text.replace(&a.old_text, &a.new_text);
            if new.len() as u64 > max_write {
                return Err(ToolError::InvalidArgs(format!(
                    "the edited file would be {} bytes; the limit is {max_write}",
                    new.len()
                )));
            }
            if let Some(p) = &shared {
                p.check_size(new.len())?;
            }
            write_atomic(&dir, &name, new.as_bytes(), existing.mode, Some(existing), rel)?;
            if let Some(p) = shared {
                p.finish(new.as_bytes())?;
            }
            if super::memory::is_memory_path(rel) {
                docs.touched();
            }
            Ok(json!({
                "message": format!("Successfully edited {rel} ({replacements} replacement{})", if replacements == 1 { "" } else { "s" }),
                "replacements": replacements,
            }))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::sync::Arc;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::tools::Workspace;
    use crate::types::SessionKey;

    fn ctx(dir: &std::path::Path) -> ToolContext {
        ToolContext {
            workspace: Arc::new(Workspace::open(dir).unwrap()),
            session: SessionKey::parse("t:1").unwrap(),
            cancel: CancellationToken::new(),
            user_dir: None,
            sender: None,
            call_id: None,
            turn: Default::default(),
        }
    }

    #[tokio::test]
    async fn read_file_pages_and_refuses_escapes() {
        let root = tempfile::tempdir().unwrap();
        let ws = root.path().join("ws");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::write(ws.join("a.txt"), "one\ntwo\nthree\n").unwrap();
        std::fs::write(root.path().join("secret.txt"), "top secret").unwrap();
        std::os::unix::fs::symlink(root.path().join("secret.txt"), ws.join("link")).unwrap();
        std::fs::write(ws.join("bin"), b"\x7fELF\0\0\x01").unwrap();
        let c = ctx(&ws);

        let v = ReadFile
            .execute(json!({"path": "a.txt", "offset": 2, "limit": 1}), &c)
            .await
            .unwrap();
        assert_eq!(
            v,
            json!({"content": "two\n", "total_lines": 3, "truncated": true})
        );

        for bad in ["../secret.txt", "link", "sub/../../secret.txt"] {
            let e = ReadFile
                .execute(json!({ "path": bad }), &c)
                .await
                .unwrap_err();
            assert_eq!(e.code(), "INVALID_PATH", "{bad}: {e}");
        }
        let abs = root.path().join("secret.txt");
        let e = ReadFile
            .execute(json!({ "path": abs.to_str().unwrap() }), &c)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "INVALID_PATH");
        let e = ReadFile
            .execute(json!({"path": "nope"}), &c)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "FILE_NOT_FOUND");
        let e = ReadFile
            .execute(json!({"path": "bin"}), &c)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "BINARY_FILE");
        let e = ReadFile
            .execute(json!({"file": "a.txt"}), &c)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "INVALID_ARGS");
    }

    #[tokio::test]
    async fn list_directory_is_sorted_and_contained() {
        let root = tempfile::tempdir().unwrap();
        let ws = root.path().join("ws");
        std::fs::create_dir_all(ws.join("zdir")).unwrap();
        std::fs::write(ws.join("b.txt"), "12345").unwrap();
        std::fs::write(ws.join("a.txt"), "1").unwrap();
        let c = ctx(&ws);
        let mut v = ListDirectory
            .execute(json!({"path": "."}), &c)
            .await
            .unwrap();
        // A directory's size depends on the filesystem.
        v["entries"][2]["size"] = json!(0);
        assert_eq!(
            v,
            json!({"entries": [
                {"name": "a.txt", "is_dir": false, "size": 1},
                {"name": "b.txt", "is_dir": false, "size": 5},
                {"name": "zdir", "is_dir": true, "size": 0},
            ]})
        );
        let e = ListDirectory
            .execute(json!({"path": ".."}), &c)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "INVALID_PATH");
        let e = ListDirectory
            .execute(json!({"path": "/"}), &c)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "INVALID_PATH");
    }
}

#[cfg(test)]
#[path = "fs_write_edit_tests.rs"]
mod write_edit_tests;

#[cfg(test)]
#[path = "fs_read_tests.rs"]
mod read_tests;
