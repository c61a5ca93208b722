//! Context files: workspace Markdown files assembled into the system prompt after the built-in
//! base text, in a fixed order, each under a heading naming the file (seed 004 §3).
//!
//! | order | file          | what it holds                                             |
//! |-------|---------------|-----------------------------------------------------------|
//! | 1     | `SOUL.md`     | persona, tone                                             |
//! | 2     | `IDENTITY.md` | name, what the agent is                                   |
//! | 3     | `AGENTS.md`   | operating instructions                                    |
//! | 4     | `TOOLS.md`    | notes on local tools                                      |
//! | 5     | `USER.md`     | who the user is                                           |
//! | 6     | `BOOTSTRAP.md`| first-run instructions, included while the file exists    |
//! | –     | `HEARTBEAT.md`| never in the prompt: reserved for the scheduler           |
//!
//! Each file is capped at [`FILE_CAP`] bytes and all of them together at [`TOTAL_CAP`], with a
//! visible marker where text was cut. A [`ContextPrompt`] is asked once per turn: it `stat`s
//! each file (one `statat` per file, no read) and rebuilds the prompt only when a file's
//! mtime, size or inode changed; otherwise it hands out the same `Arc<str>`, so the prompt is
//! byte-stable (provider prompt caches keep hitting) and pointer-stable (the session's
//! overhead-estimate cache is keyed by the pointer). Files are read through the workspace
//! handle (`openat2` RESOLVE_BENEATH): a context file that is a symlink leading out of the
//! workspace, or a protected path, is left out with one warning.

use std::sync::{Arc, Mutex};

use rustix::fs::AtFlags;

use crate::tools::Workspace;
use crate::types::MutexExt;

/// Largest part of one context file put in the prompt (20 KiB).
pub const FILE_CAP: usize = 20 * 1024;
/// Largest total of all context files' text in the prompt (64 KiB).
pub const TOTAL_CAP: usize = 64 * 1024;

/// The context files of an agent's prompt, in prompt order.
pub const AGENT_FILES: &[&str] = &[
    "SOUL.md",
    "IDENTITY.md",
    "AGENTS.md",
    "TOOLS.md",
    "USER.md",
    "BOOTSTRAP.md",
];
/// The context files a subagent's prompt gets (seed 004 is silent: the operating
/// instructions and the tool notes, not the persona, the user or first-run instructions).
pub const SUBAGENT_FILES: &[&str] = &["AGENTS.md", "TOOLS.md"];
/// Context files kept per chat user when a user directory is given (the workspace-level file
/// is the fallback).
pub const PER_USER_FILES: &[&str] = &["USER.md"];
/// Reserved: read by the scheduler, never put in the prompt.
pub const HEARTBEAT_FILE: &str = "HEARTBEAT.md";

/// Most cached prompts kept per [`ContextPrompt`] (one per user directory asked for).
const MAX_CACHED: usize = 64;

/// What identifies a file's version without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    size: i64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

struct Cached {
    user_dir: Option<String>,
    stamps: Vec<Option<Stamp>>,
    prompt: Arc<str>,
}

struct State {
    cache: Vec<Cached>,
    /// Files whose last read was refused (warned once until it reads again).
    warned: std::collections::BTreeSet<String>,
}

/// The system prompt of an agent: the base text and the workspace's context files, re-read
/// when they change.
pub struct ContextPrompt {
    base: Arc<str>,
    /// `None`: the operator's `agents.defaults.system_prompt` replaces everything.
    files: Option<&'static [&'static str]>,
    suffix: String,
    workspace: Arc<Workspace>,
    state: Mutex<State>,
}

impl std::fmt::Debug for ContextPrompt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextPrompt")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ContextPrompt {
    /// The agent's prompt: `base` then [`AGENT_FILES`]; with `custom` (the operator's
    /// `system_prompt`), that text alone and no file is ever read.
    pub fn new(base: &str, custom: Option<&str>, workspace: Arc<Workspace>) -> Self {
        match custom {
            Some(c) => Self::build(c.into(), None, String::new(), workspace),
            None => Self::build(base.into(), Some(AGENT_FILES), String::new(), workspace),
        }
    }

    fn build(
        base: Arc<str>,
        files: Option<&'static [&'static str]>,
        suffix: String,
        workspace: Arc<Workspace>,
    ) -> Self {
        Self {
            base,
            files,
            suffix,
            workspace,
            state: Mutex::new(State {
                cache: Vec::new(),
                warned: std::collections::BTreeSet::new(),
            }),
        }
    }

    /// A subagent's prompt: the same base text, [`SUBAGENT_FILES`] only, then `suffix`.
    pub fn for_subagent(&self, suffix: &str) -> Self {
        let files = self.files.map(|_| SUBAGENT_FILES);
        Self::build(
            self.base.clone(),
            files,
            suffix.to_string(),
            self.workspace.clone(),
        )
    }

    /// The prompt now (workspace-level files only).
    pub fn current(&self) -> Arc<str> {
        self.current_for(None)
    }

    /// The prompt now, with the files of [`PER_USER_FILES`] taken from `user_dir` (relative to
    /// the workspace) when it holds them. Costs one `stat` per file; files are read only when
    /// one changed, and an unchanged prompt is the same `Arc`.
    pub fn current_for(&self, user_dir: Option<&str>) -> Arc<str> {
        let Some(files) = self.files else {
            if self.suffix.is_empty() {
                return self.base.clone();
            }
            return self.cached_plain();
        };
        let paths: Vec<String> = files.iter().map(|f| self.path_of(f, user_dir)).collect();
        let stamps: Vec<Option<Stamp>> = paths.iter().map(|p| self.stamp(p)).collect();
        let mut state = self.state.locked();
        let slot = state
            .cache
            .iter()
            .position(|c| c.user_dir.as_deref() == user_dir);
        if let Some(i) = slot {
            if state.cache[i].stamps == stamps {
                return state.cache[i].prompt.clone();
            }
        }
        let mut parts = Vec::new();
        for (name, path) in files.iter().zip(&paths) {
            let text = match read_context_file(&self.workspace, path) {
                Ok(Some(t)) => {
                    state.warned.remove(path);
                    t
                }
                Ok(None) => {
                    state.warned.remove(path);
                    continue;
                }
                Err(e) => {
                    if state.warned.insert(path.clone()) {
                        tracing::warn!(
                            file = %path,
                            error = %e,
                            "context file left out of the system prompt"
                        );
                    }
                    continue;
                }
            };
            parts.push((*name, text));
        }
        let text = assemble(&self.base, &parts, &self.suffix);
        let prompt = match slot {
            Some(i) if *state.cache[i].prompt == *text => state.cache[i].prompt.clone(),
            _ => Arc::from(text),
        };
        if let Some(i) = slot {
            state.cache.remove(i);
        }
        if state.cache.len() >= MAX_CACHED {
            state.cache.remove(0);
        }
        state.cache.push(Cached {
            user_dir: user_dir.map(str::to_string),
            stamps,
            prompt: prompt.clone(),
        });
        prompt
    }

    /// The custom prompt with a suffix (a subagent under a custom prompt), built once.
    fn cached_plain(&self) -> Arc<str> {
        let mut state = self.state.locked();
        if let Some(c) = state.cache.first() {
            return c.prompt.clone();
        }
        let prompt: Arc<str> = format!("{}{}", self.base, self.suffix).into();
        state.cache.push(Cached {
            user_dir: None,
            stamps: Vec::new(),
            prompt: prompt.clone(),
        });
        prompt
    }

    fn path_of(&self, name: &str, user_dir: Option<&str>) -> String {
        if let Some(dir) = user_dir.filter(|_| PER_USER_FILES.contains(&name)) {
            let p = format!("{}/{name}", dir.trim_end_matches('/'));
            if self.stamp(&p).is_some() {
                return p;
            }
        }
        name.to_string()
    }

    /// One `statat` beneath the workspace directory (following a symlink: its target's change
    /// is then seen; a target outside is refused when read), or one `stat` in the users
    /// directory for a user's file.
    fn stamp(&self, rel: &str) -> Option<Stamp> {
        let st = match user_file(rel) {
            Some((name, file)) => {
                let users = self.workspace.users_dir()?;
                rustix::fs::stat(users.join(name).join(file)).ok()?
            }
            None => rustix::fs::statat(self.workspace.dir_fd(), rel, AtFlags::empty()).ok()?,
        };
        #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
        Some(Stamp {
            ino: st.st_ino as u64,
            size: st.st_size as i64,
            mtime: (st.st_mtime as i64, st.st_mtime_nsec as i64),
            ctime: (st.st_ctime as i64, st.st_ctime_nsec as i64),
        })
    }
}

/// [`read_capped`] of a workspace file, or of a chat user's file (`users/<name>/USER.md`,
/// in the users directory outside the workspace) through that user's own directory handle.
fn read_context_file(ws: &Workspace, rel: &str) -> Result<Option<String>, String> {
    match user_file(rel) {
        Some((name, file)) => match ws.open_user(name, false) {
            Ok(sub) => read_capped(&sub, file),
            Err(crate::tools::ToolError::FileNotFound(_)) => Ok(None),
            Err(e) => Err(e.to_string()),
        },
        None => read_capped(ws, rel),
    }
}

/// `users/<name>/<file>` split into the user's directory name and the file.
fn user_file(rel: &str) -> Option<(&str, &str)> {
    let rest = rel
        .strip_prefix(crate::tools::memory::USERS_DIR)?
        .strip_prefix('/')?;
    rest.split_once('/')
}

/// A file's text, capped at [`FILE_CAP`] with the marker; `None` when it does not exist or
/// is empty. Non-UTF-8 bytes are replaced (lossy).
fn read_capped(ws: &Workspace, rel: &str) -> Result<Option<String>, String> {
    let Some(buf) = ws
        .read_beneath(rel, FILE_CAP as u64 + 4)
        .map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    let mut text = String::from_utf8_lossy(&buf).into_owned();
    let name = rel.rsplit('/').next().unwrap_or(rel);
    if text.len() > FILE_CAP || buf.len() > FILE_CAP {
        cut(&mut text, FILE_CAP);
        text = format!(
            "{}\n[… {name} truncated at {} KB]",
            text.trim_end(),
            FILE_CAP / 1024
        );
    }
    let text = without_comments(&text);
    if text
        .lines()
        .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
    {
        return Ok(None);
    }
    Ok(Some(text))
}

/// `text` without its `<!-- … -->` comments: notes for the person editing the file, not for
/// the model (an unclosed comment runs to the end). Lines left empty by a comment go too.
fn without_comments(text: &str) -> String {
    if !text.contains("<!--") {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("<!--") {
        out.push_str(&rest[..at]);
        rest = rest[at..]
            .find("-->")
            .map_or("", |end| &rest[at + end + 3..]);
        // A comment on its own line leaves no blank line behind.
        if out.ends_with('\n') || out.is_empty() {
            rest = rest.strip_prefix('\n').unwrap_or(rest);
        }
    }
    out.push_str(rest);
    out
}

/// Truncate at a char boundary at or below `max` bytes.
fn cut(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut at = max;
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    s.truncate(at);
}

/// The prompt: `base`, then each file under `## NAME` (in the order given), within
/// [`TOTAL_CAP`], then `suffix`.
pub fn assemble(base: &str, files: &[(&str, String)], suffix: &str) -> String {
    let mut out = base.to_string();
    if !files.is_empty() {
        out.push_str(
            "\n\n# Context files\n\nThese workspace files describe who you are, how to work and \
             who you work for; follow them. You may edit them with the file tools.",
        );
    }
    let mut left = TOTAL_CAP;
    for (name, text) in files {
        out.push_str(&format!("\n\n## {name}\n\n"));
        if left == 0 {
            out.push_str(&format!(
                "[… {name} left out: context files total {} KB]",
                TOTAL_CAP / 1024
            ));
            continue;
        }
        let text = text.trim_end();
        if text.len() <= left {
            out.push_str(text);
            left -= text.len();
        } else {
            let mut t = text.to_string();
            cut(&mut t, left);
            out.push_str(t.trim_end());
            out.push_str(&format!(
                "\n[… {name} truncated: context files total {} KB]",
                TOTAL_CAP / 1024
            ));
            left = 0;
        }
    }
    out.push_str(suffix);
    out
}

/// The context-file templates `weft onboard` writes, and the gateway writes into the workspace
/// it makes for a new agent; never over an existing file.
pub const TEMPLATES: &[(&str, &str)] = &[
    (
        "SOUL.md",
        "# Soul\n\n<!-- Your assistant's persona and tone. Edit freely; text in comments like \
         this one is not sent to the model. -->\n\
         - Be direct and friendly; skip filler and flattery.\n\
         - Say so when you are unsure, and check facts with your tools.\n\
         - Ask before doing anything destructive or hard to undo.\n",
    ),
    (
        "IDENTITY.md",
        "# Identity\n\n- Name: weft\n- What you are: a personal assistant reached through chat, \
         running on the operator's own machine.\n",
    ),
    (
        "AGENTS.md",
        "# Operating instructions\n\n\
         - Keep notes worth remembering with `memory_write`; read them with `memory_read`.\n\
         - Work in the workspace with relative paths.\n\
         - Prefer one clear answer over several partial ones.\n",
    ),
    (
        "USER.md",
        "# User\n\n<!-- Who the assistant works for: name, time zone, language, preferences. \
         Left out of the prompt until something is written outside this comment. -->\n",
    ),
    (
        "BOOTSTRAP.md",
        "# First run\n\nThis file is shown to you until it is deleted. In your first \
         conversation: introduce yourself, ask the user their name, time zone and how they like \
         answers, write what you learn into USER.md (and your chosen name into IDENTITY.md), \
         then delete this file.\n",
    ),
];

/// Write the [`TEMPLATES`] missing from `workspace`; returns the files written.
/// `BOOTSTRAP.md` only into a fresh workspace (none of the templates there yet): once deleted
/// after the first run, a later `onboard --force` does not start a first run again.
pub fn write_templates(
    workspace: &std::path::Path,
) -> Result<Vec<std::path::PathBuf>, (std::path::PathBuf, std::io::Error)> {
    let fresh = TEMPLATES.iter().all(|(n, _)| !workspace.join(n).exists());
    let mut written = Vec::new();
    for (name, text) in TEMPLATES {
        if *name == "BOOTSTRAP.md" && !fresh {
            continue;
        }
        let path = workspace.join(name);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path);
        match file {
            Ok(mut f) => {
                use std::io::Write;
                f.write_all(text.as_bytes())
                    .map_err(|e| (path.clone(), e))?;
                written.push(path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err((path, e)),
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn ws() -> (tempfile::TempDir, Arc<Workspace>) {
        let d = tempfile::tempdir().unwrap();
        let w = Arc::new(
            Workspace::open(&d.path().join("ws"))
                .unwrap()
                .with_users_dir(d.path().join("users")),
        );
        (d, w)
    }

    /// Cluster mode shares the context files by name: a file added to the prompt's list must
    /// be shared too, or each node would keep its own.
    #[test]
    fn comments_are_for_the_editor_and_a_file_of_headings_is_left_out() {
        assert_eq!(
            without_comments("# A\n\n<!-- note\nfor you -->\n- kept <!-- x --> too\n<!-- open"),
            "# A\n\n- kept  too\n"
        );
        let (_d, ws) = ws();
        std::fs::write(ws.root().join("USER.md"), TEMPLATES[3].1).unwrap();
        assert_eq!(read_capped(&ws, "USER.md").unwrap(), None);
        std::fs::write(ws.root().join("SOUL.md"), TEMPLATES[0].1).unwrap();
        let soul = read_capped(&ws, "SOUL.md").unwrap().unwrap();
        assert!(soul.starts_with("# Soul\n\n- Be direct"), "{soul}");
    }

    #[test]
    fn every_context_file_is_shared_in_cluster_mode() {
        let shared = crate::tools::shared_docs::CONTEXT_FILES;
        for f in AGENT_FILES
            .iter()
            .chain(SUBAGENT_FILES)
            .chain(PER_USER_FILES)
            .chain([&HEARTBEAT_FILE])
        {
            assert!(shared.contains(f), "{f} is not shared in cluster mode");
        }
    }

    #[test]
    fn order_headings_and_no_files_means_base_only() {
        let (d, w) = ws();
        let p = ContextPrompt::new("BASE", None, w);
        assert_eq!(&*p.current(), "BASE");
        let root = d.path().join("ws");
        for f in AGENT_FILES.iter().rev().chain([&HEARTBEAT_FILE]) {
            std::fs::write(root.join(f), format!("text of {f}\n")).unwrap();
        }
        let s = p.current();
        assert!(s.starts_with("BASE\n\n# Context files\n\n"), "{s}");
        let mut at = 0;
        for f in AGENT_FILES {
            let h = format!("\n\n## {f}\n\ntext of {f}");
            let i = s.find(&h).unwrap_or_else(|| panic!("{f} missing in {s}"));
            assert!(i > at, "{f} out of order");
            at = i;
        }
        assert!(!s.contains("HEARTBEAT"), "{s}");
    }

    #[test]
    fn stable_arc_until_a_file_changes_and_empty_files_are_left_out() {
        let (d, w) = ws();
        let root = d.path().join("ws");
        std::fs::write(root.join("SOUL.md"), "calm").unwrap();
        std::fs::write(root.join("TOOLS.md"), "  \n").unwrap();
        let p = ContextPrompt::new("B", None, w);
        let a = p.current();
        let b = p.current();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!a.contains("TOOLS.md"), "{a}");
        std::fs::write(root.join("SOUL.md"), "cheerful!").unwrap();
        let c = p.current();
        assert!(c.contains("cheerful!") && !c.contains("calm"), "{c}");
        // Rewritten with the same text (a new inode and mtime): re-read, same Arc.
        std::fs::write(root.join("SOUL.tmp"), "cheerful!").unwrap();
        std::fs::rename(root.join("SOUL.tmp"), root.join("SOUL.md")).unwrap();
        assert!(Arc::ptr_eq(&c, &p.current()));
        std::fs::remove_file(root.join("SOUL.md")).unwrap();
        assert_eq!(&*p.current(), "B");
    }

    #[test]
    fn caps_show_markers_and_lossy_utf8() {
        let mut big = "é".repeat(FILE_CAP);
        let (d, w) = ws();
        let root = d.path().join("ws");
        std::fs::write(root.join("SOUL.md"), &big).unwrap();
        std::fs::write(root.join("IDENTITY.md"), b"name: \xff\xfe bot").unwrap();
        let p = ContextPrompt::new("B", None, w);
        let s = p.current();
        assert!(
            s.contains("[… SOUL.md truncated at 20 KB]"),
            "marker missing"
        );
        assert!(s.contains("name: \u{fffd}\u{fffd} bot"));
        assert!(s.len() < FILE_CAP + 1000);
        // The total cap.
        big = "x".repeat(FILE_CAP);
        let files: Vec<(&str, String)> = AGENT_FILES.iter().map(|f| (*f, big.clone())).collect();
        let s = assemble("B", &files, "");
        assert!(s.contains("[… TOOLS.md truncated: context files total 64 KB]"));
        assert!(s.contains("[… USER.md left out: context files total 64 KB]"));
        assert!(s.len() < TOTAL_CAP + 1000);
    }

    #[test]
    fn custom_prompt_replaces_files_and_subagents_get_agents_and_tools_only() {
        let (d, w) = ws();
        let root = d.path().join("ws");
        for f in AGENT_FILES {
            std::fs::write(root.join(f), format!("text of {f}")).unwrap();
        }
        let custom = ContextPrompt::new("B", Some("MINE"), w.clone());
        assert_eq!(&*custom.current(), "MINE");
        assert_eq!(&*custom.for_subagent(" SUB").current(), "MINE SUB");
        let p = ContextPrompt::new("B", None, w);
        let s = p.for_subagent("\n\nSUB").current();
        assert!(
            s.contains("## AGENTS.md") && s.contains("## TOOLS.md"),
            "{s}"
        );
        assert!(!s.contains("SOUL") && !s.contains("USER.md") && !s.contains("BOOTSTRAP"));
        assert!(s.ends_with("\n\nSUB"));
    }

    #[test]
    fn outside_symlink_is_left_out_and_user_dir_overrides_user_md() {
        let (d, w) = ws();
        let root = d.path().join("ws");
        std::fs::write(d.path().join("outside.md"), "SECRET").unwrap();
        std::os::unix::fs::symlink(d.path().join("outside.md"), root.join("SOUL.md")).unwrap();
        std::fs::write(root.join("USER.md"), "workspace user").unwrap();
        std::fs::create_dir_all(d.path().join("users/tg-1")).unwrap();
        std::fs::write(d.path().join("users/tg-1/USER.md"), "alice").unwrap();
        let p = ContextPrompt::new("B", None, w);
        let s = p.current();
        assert!(!s.contains("SECRET") && s.contains("workspace user"), "{s}");
        let u = p.current_for(Some("users/tg-1"));
        assert!(u.contains("alice") && !u.contains("workspace user"), "{u}");
        let other = p.current_for(Some("users/tg-2"));
        assert!(other.contains("workspace user"), "{other}");
        assert!(Arc::ptr_eq(&s, &p.current()));
    }
}
