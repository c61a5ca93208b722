//! Skills: `SKILL.md` files that give the agent instructions for a task and expose extra tools
//! (internal MCP tools included) while they are active.
//!
//! A skill lives in `<workspace>/skills/NAME/SKILL.md` or in the global directory
//! `~/.clawft/skills/NAME/SKILL.md` (a workspace skill replaces a global one of the same name).
//! The file starts with front matter:
//!
//! ```text
//! ---
//! name: release
//! description: Cut a release of the project
//! allowed_tools: ["github__*", "exec_shell", "read_file"]
//! ---
//! Instructions for the model...
//! ```
//!
//! (`allowed_tools` may also be a YAML list of `- pattern` lines.) The system prompt lists the
//! skills; one is activated by `/NAME` at the start of a message or by the model calling
//! `use_skill`; for the rest of that turn the model sees the tools its `allowed_tools` match
//! (`ToolRegistry::schemas_for_tools`). The tool policy still applies: a denied tool stays denied.
//!
//! Workspace skills are read through the workspace directory handle (kernel-checked), so a
//! symlink cannot make the daemon read a file outside the workspace into the prompt. Anyone who
//! can write the workspace (the agent included) can write a skill: skills widen what the model
//! *sees* among internal tools, never what the policy allows.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use rustix::fs::{Mode, OFlags};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::tools::{parse_args, schema_of, Effect, Tool, ToolContext, ToolError, Workspace};

/// Largest `SKILL.md` read (64 KiB).
const MAX_SKILL_BYTES: u64 = 64 * 1024;
/// Most skills listed.
const MAX_SKILLS: usize = 100;

/// One skill.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skill {
    /// Name (`/NAME` activates it).
    pub name: String,
    /// One line shown in the system prompt.
    pub description: String,
    /// Tool patterns exposed while active.
    pub allowed_tools: Vec<String>,
    /// The instructions (the file after the front matter).
    pub instructions: String,
    /// `workspace` or `global`.
    pub source: &'static str,
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    s.strip_prefix('"')
        .and_then(|x| x.strip_suffix('"'))
        .or_else(|| s.strip_prefix('\'').and_then(|x| x.strip_suffix('\'')))
        .unwrap_or(s)
        .to_string()
}

/// Why a `SKILL.md` was not accepted (the skill is skipped with a warning).
#[derive(Debug, thiserror::Error)]
pub enum SkillError {
    /// The file does not start with `---`.
    #[error("a SKILL.md starts with `---` front matter")]
    NoFrontMatter,
    /// No `---` line closes the front matter.
    #[error("the front matter is not closed with `---`")]
    UnclosedFrontMatter,
    /// A front matter line without `:` (the line, trimmed).
    #[error("front matter line `{0}` is not `key: value`")]
    NotKeyValue(String),
    /// `allowed_tools: [...]` is not a JSON-like list of strings.
    #[error("allowed_tools: expected a list like [\"read_file\", \"github__*\"]: {0}")]
    AllowedTools(#[source] serde_json::Error),
    /// The front matter has no `name`.
    #[error("the front matter has no `name`")]
    NoName,
    /// The name has other characters than letters, digits, `-` and `_`, or is too long.
    #[error("skill name `{0}` must be letters, digits, `-` or `_` (at most 64)")]
    InvalidName(String),
}

/// Parse a `SKILL.md`.
///
/// # Errors
/// No front matter, no valid `name`, or a malformed `allowed_tools`.
pub fn parse_skill(text: &str, source: &'static str) -> Result<Skill, SkillError> {
    let text = text.trim_start_matches('\u{feff}');
    let rest = text.strip_prefix("---").ok_or(SkillError::NoFrontMatter)?;
    let end = rest.find("\n---").ok_or(SkillError::UnclosedFrontMatter)?;
    let (front, body) = (&rest[..end], &rest[end + 4..]);
    let body = body.trim_start_matches(['-', '\r']);
    let (mut name, mut description, mut tools) = (None, String::new(), Vec::new());
    let mut in_list = false;
    for line in front.lines() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if in_list {
            if let Some(item) = t.strip_prefix("- ") {
                tools.push(unquote(item));
                continue;
            }
            in_list = false;
        }
        let Some((k, v)) = t.split_once(':') else {
            return Err(SkillError::NotKeyValue(t.to_string()));
        };
        let v = v.trim();
        match k.trim() {
            "name" => name = Some(unquote(v)),
            "description" => description = unquote(v),
            "allowed_tools" | "allowed-tools" => {
                if v.is_empty() {
                    in_list = true;
                } else if v.starts_with('[') {
                    tools = serde_json::from_str::<Vec<String>>(&v.replace('\'', "\""))
                        .map_err(SkillError::AllowedTools)?;
                } else {
                    tools = v
                        .split(',')
                        .map(unquote)
                        .filter(|s| !s.is_empty())
                        .collect();
                }
            }
            _ => {}
        }
    }
    let name = name.ok_or(SkillError::NoName)?;
    if !valid_name(&name) {
        return Err(SkillError::InvalidName(name));
    }
    Ok(Skill {
        name,
        description,
        allowed_tools: tools,
        instructions: body.trim().to_string(),
        source,
    })
}

/// Where skills are found.
#[derive(Clone, Debug)]
pub struct SkillDirs {
    /// `~/.clawft/skills` (operator's).
    pub global: Option<PathBuf>,
    /// The workspace (its `skills/` is read through the directory handle).
    pub workspace: Arc<Workspace>,
}

fn read_limited(mut f: impl Read) -> Option<String> {
    let mut buf = Vec::new();
    f.by_ref()
        .take(MAX_SKILL_BYTES)
        .read_to_end(&mut buf)
        .ok()?;
    String::from_utf8(buf).ok()
}

impl SkillDirs {
    /// Every valid skill, sorted by name; invalid files are logged and skipped.
    pub fn load(&self) -> Vec<Skill> {
        let mut by_name = std::collections::BTreeMap::new();
        if let Some(g) = &self.global {
            for (dir, text) in global_files(g) {
                insert(&mut by_name, &dir, &text, "global");
            }
        }
        for (dir, text) in workspace_files(&self.workspace) {
            insert(&mut by_name, &dir, &text, "workspace");
        }
        by_name.into_values().take(MAX_SKILLS).collect()
    }

    /// The skill called `name`.
    pub fn find(&self, name: &str) -> Option<Skill> {
        self.load().into_iter().find(|s| s.name == name)
    }
}

fn insert(
    map: &mut std::collections::BTreeMap<String, Skill>,
    dir: &str,
    text: &str,
    source: &'static str,
) {
    match parse_skill(text, source) {
        Ok(s) => {
            map.insert(s.name.clone(), s);
        }
        Err(e) => tracing::warn!(skill = dir, source, error = %e, "skill skipped"),
    }
}

fn global_files(root: &Path) -> Vec<(String, String)> {
    let Ok(rd) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let dir = e.file_name().to_string_lossy().into_owned();
        if let Some(text) = std::fs::File::open(e.path().join("SKILL.md"))
            .ok()
            .and_then(read_limited)
        {
            out.push((dir, text));
        }
    }
    out
}

fn workspace_files(ws: &Workspace) -> Vec<(String, String)> {
    let Ok(fd) = ws.open_beneath("skills", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
    else {
        return Vec::new();
    };
    let Ok(dir) = rustix::fs::Dir::read_from(&fd) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for ent in dir.flatten() {
        let name = ent.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let rel = format!("skills/{name}/SKILL.md");
        if let Some(text) = ws
            .open_beneath(&rel, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty())
            .ok()
            .map(std::fs::File::from)
            .filter(|f| f.metadata().is_ok_and(|m| m.is_file()))
            .and_then(read_limited)
        {
            out.push((name, text));
        }
    }
    out
}

/// Most bytes of the skills section of the system prompt (1 KiB): past it, the remaining
/// skills are counted, not listed; `skill_search` finds them.
const SECTION_BYTES: usize = 1024;

/// The skills paragraph appended to the system prompt (empty without skills): each skill by
/// name and the first line of its description, within [`SECTION_BYTES`]. `skill_search` is
/// named only when some skills are counted rather than listed (see [`all_listed`]).
pub fn prompt_section(skills: &[Skill]) -> String {
    if skills.is_empty() {
        return String::new();
    }
    let (listed, _) = listing(skills);
    let mut s = String::from(if listed.len() == skills.len() {
        "\n\nSkills (activate one with the use_skill tool when the task matches; the user can also type /NAME):"
    } else {
        "\n\nSkills (activate one with the use_skill tool when the task matches; skill_search finds one by what it does; the user can also type /NAME):"
    });
    for entry in &listed {
        s.push_str(entry);
    }
    if listed.len() < skills.len() {
        s.push_str(&format!(
            "\n- … and {} more (find them with skill_search)",
            skills.len() - listed.len()
        ));
    }
    s
}

/// Whether the prompt's skills section lists every skill: then `skill_search` has nothing to
/// find that the model does not already see, and is not offered (its schema costs ~400 bytes
/// of every request).
pub fn all_listed(skills: &[Skill]) -> bool {
    listing(skills).0.len() == skills.len()
}

/// The section's entry lines (`\n- name: first line`) that fit [`SECTION_BYTES`] with the
/// longer header, and that header's length.
fn listing(skills: &[Skill]) -> (Vec<String>, usize) {
    const HEADER: usize = 140;
    let mut used = HEADER;
    let mut out = Vec::new();
    for k in skills {
        let line = crate::tools::discovery::one_line(&k.description);
        let entry = if line.is_empty() {
            format!("\n- {}", k.name)
        } else {
            format!("\n- {}: {line}", k.name)
        };
        if used + entry.len() > SECTION_BYTES {
            break;
        }
        used += entry.len();
        out.push(entry);
    }
    (out, used)
}

/// The skill a message activates (`/NAME ...` at its start), if any.
pub fn from_command(dirs: &SkillDirs, text: &str) -> Option<Skill> {
    let word = text
        .trim_start()
        .strip_prefix('/')?
        .split_whitespace()
        .next()?;
    if !valid_name(word) {
        return None;
    }
    dirs.find(word)
}

/// Arguments of `use_skill`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UseSkillArgs {
    /// Name of the skill, as listed in the system prompt.
    pub name: String,
}

/// `use_skill`: activate a skill for the rest of the turn.
pub struct UseSkill {
    global: Option<PathBuf>,
}

impl UseSkill {
    /// A tool reading global skills from `global` (and workspace skills from the call's
    /// workspace).
    pub fn new(global: Option<PathBuf>) -> Self {
        Self { global }
    }
}

#[async_trait]
impl Tool for UseSkill {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::UseSkill.name()
    }
    fn description(&self) -> &str {
        "Activate a listed skill: returns {name, instructions, allowed_tools}; its tools are then available for this turn."
    }
    fn parameters(&self) -> Value {
        schema_of::<UseSkillArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::ReadOnly
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: UseSkillArgs = parse_args(self.name(), args)?;
        let skills = load_off_thread(self.global.clone(), ctx).await?;
        let names: Vec<&str> = skills.iter().map(|s| s.name.as_str()).collect();
        let s = skills.iter().find(|s| s.name == a.name).ok_or_else(|| {
            ToolError::InvalidArgs(format!(
                "no skill `{}`; available skills: {}",
                a.name,
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ))
        })?;
        // The skill's tools are offered from the turn's next round on.
        ctx.turn.expose(s.allowed_tools.iter().cloned());
        Ok(json!({
            "name": s.name,
            "instructions": s.instructions,
            "allowed_tools": s.allowed_tools,
        }))
    }
}

/// The skills `ctx`'s workspace and the global directory hold, read on a blocking thread.
async fn load_off_thread(
    global: Option<PathBuf>,
    ctx: &ToolContext,
) -> Result<Vec<Skill>, ToolError> {
    let dirs = SkillDirs {
        global,
        workspace: ctx.workspace.clone(),
    };
    tokio::task::spawn_blocking(move || dirs.load())
        .await
        .map_err(|e| ToolError::ExecutionFailed(format!("skills: {e}")))
}

/// The name of the skill search tool.
pub const SKILL_SEARCH: &str = crate::tools::builtin::Builtin::SkillSearch.name();

/// Arguments of `skill_search`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillSearchArgs {
    /// What the task is about.
    pub query: String,
    /// Results, default 5, max 20.
    pub limit: Option<usize>,
}

/// `skill_search`: BM25 over the skills' names, descriptions and instructions (seed 004,
/// "Other tools").
pub struct SkillSearch {
    global: Option<PathBuf>,
}

impl SkillSearch {
    /// A tool reading global skills from `global` (and workspace skills from the call's
    /// workspace).
    pub fn new(global: Option<PathBuf>) -> Self {
        Self { global }
    }
}

#[async_trait]
impl Tool for SkillSearch {
    fn name(&self) -> &str {
        SKILL_SEARCH
    }
    fn description(&self) -> &str {
        "Search the skills by name, description and instructions; activate one found with use_skill."
    }
    fn parameters(&self) -> Value {
        schema_of::<SkillSearchArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::ReadOnly
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: SkillSearchArgs = parse_args(self.name(), args)?;
        let limit = a.limit.unwrap_or(5).clamp(1, 20);
        let skills = load_off_thread(self.global.clone(), ctx).await?;
        let docs: Vec<Vec<String>> = skills
            .iter()
            .map(|s| {
                use crate::tools::discovery::terms;
                let name = terms(&s.name);
                let mut d = name.clone();
                d.extend(name);
                d.extend(terms(&s.description));
                d.extend(terms(&s.instructions));
                d
            })
            .collect();
        let query = crate::tools::discovery::terms(&a.query);
        let found: Vec<Value> = crate::tools::discovery::bm25(&docs, &query)
            .into_iter()
            .take(limit)
            .map(|(i, score)| {
                json!({
                    "name": skills[i].name,
                    "description": skills[i].description,
                    "score": (score * 1000.0).round() / 1000.0,
                })
            })
            .collect();
        let how = if found.is_empty() {
            format!(
                "No skill matches; {} skills exist. Try other words.",
                skills.len()
            )
        } else {
            "To use a skill, call use_skill with its name: it returns the skill's instructions and loads its tools.".to_string()
        };
        Ok(json!({ "skills": found, "how_to_use": how }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn front_matter_forms() {
        let s = parse_skill(
            "---\nname: release\ndescription: \"Cut a release\"\nallowed_tools: [\"github__*\", 'read_file']\n---\nStep 1.\n",
            "workspace",
        )
        .unwrap();
        assert_eq!(s.name, "release");
        assert_eq!(s.description, "Cut a release");
        assert_eq!(s.allowed_tools, ["github__*", "read_file"]);
        assert_eq!(s.instructions, "Step 1.");
        let s = parse_skill(
            "---\nname: mem\nallowed_tools:\n  - claude-flow__memory_*\n  - read_file\ndescription: x\n---\n",
            "global",
        )
        .unwrap();
        assert_eq!(s.allowed_tools, ["claude-flow__memory_*", "read_file"]);
        assert_eq!(s.description, "x");
        for bad in [
            "no front matter",
            "---\nname: x\n",
            "---\ndescription: no name\n---\n",
            "---\nname: ../etc\n---\n",
            "---\nname: ok\nallowed_tools: [unquoted\n---\n",
        ] {
            assert!(parse_skill(bad, "workspace").is_err(), "{bad}");
        }
    }

    #[test]
    fn parse_errors_read_as_before() {
        let err = |text: &str| parse_skill(text, "workspace").unwrap_err().to_string();
        assert_eq!(
            err("no front matter"),
            "a SKILL.md starts with `---` front matter"
        );
        assert_eq!(
            err("---\nname: x\n"),
            "the front matter is not closed with `---`"
        );
        assert_eq!(
            err("---\n what \n---\n"),
            "front matter line `what` is not `key: value`"
        );
        assert!(err("---\nallowed_tools: [x\n---\n")
            .starts_with("allowed_tools: expected a list like [\"read_file\", \"github__*\"]: "));
        assert_eq!(err("---\n---\n"), "the front matter has no `name`");
        assert_eq!(
            err("---\nname: ../etc\n---\n"),
            "skill name `../etc` must be letters, digits, `-` or `_` (at most 64)"
        );
    }

    #[test]
    fn workspace_skills_override_global_and_cannot_read_outside() {
        let d = tempfile::tempdir().unwrap();
        let global = d.path().join("global");
        let ws = d.path().join("ws");
        std::fs::create_dir_all(global.join("a")).unwrap();
        std::fs::create_dir_all(global.join("b")).unwrap();
        std::fs::create_dir_all(ws.join("skills/a")).unwrap();
        std::fs::create_dir_all(ws.join("skills/evil")).unwrap();
        std::fs::write(
            global.join("a/SKILL.md"),
            "---\nname: a\ndescription: global a\n---\n",
        )
        .unwrap();
        std::fs::write(
            global.join("b/SKILL.md"),
            "---\nname: b\ndescription: global b\n---\n",
        )
        .unwrap();
        std::fs::write(
            ws.join("skills/a/SKILL.md"),
            "---\nname: a\ndescription: ws a\n---\n",
        )
        .unwrap();
        // A skill file that is a symlink to a file outside the workspace is not read.
        std::fs::write(
            d.path().join("outside.md"),
            "---\nname: evil\ndescription: SECRET-OUTSIDE\n---\n",
        )
        .unwrap();
        std::os::unix::fs::symlink(d.path().join("outside.md"), ws.join("skills/evil/SKILL.md"))
            .unwrap();
        let dirs = SkillDirs {
            global: Some(global),
            workspace: Arc::new(Workspace::open(&ws).unwrap()),
        };
        let all = dirs.load();
        let names: Vec<_> = all
            .iter()
            .map(|s| (s.name.as_str(), s.description.as_str()))
            .collect();
        assert_eq!(names, [("a", "ws a"), ("b", "global b")]);
        assert!(prompt_section(&all).contains("- b: global b"));
        assert_eq!(from_command(&dirs, "/b do it").unwrap().name, "b");
        assert!(from_command(&dirs, "/stop").is_none());
        assert!(from_command(&dirs, "b").is_none());
    }
}
