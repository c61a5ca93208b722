//! What a request offers the model: the system prompt with its skills section and the list of
//! tools not loaded, and the tool schemas (the core tools, then the tools the conversation
//! loaded, in the order it loaded them).
//!
//! Which tools are loaded is read from the messages themselves, so it is the same on every
//! request built from the same window (between the rounds of a turn and across turns): a tool
//! the window's messages call, a tool a `tool_search` result in them returned, and the tools
//! a `use_skill` result in them names. Every tool called in the window is thus declared in
//! the request (strict providers refuse a call to an undeclared tool), and a load only ever
//! appends: the prefix providers cache stays byte-stable. A compaction that summarises the
//! messages that loaded a tool unloads it.

use crate::llm::{Message, Role, ToolSpec};
use crate::skills::Skill;
use crate::tools::builtin::Builtin;
use crate::tools::discovery;
use crate::tools::registry::ToolRegistry;

/// The skill tools: offered in full only when the agent has skills.
pub const SKILL_TOOLS: &[&str] = &[Builtin::UseSkill.name(), Builtin::SkillSearch.name()];

/// `skill_search` alone.
const SEARCH_TOOL: &[&str] = &[Builtin::SkillSearch.name()];

/// The names of the tools `messages` load, in order of first appearance (see the module
/// docs), and the tools of `preload` first.
pub fn loaded_by(registry: &ToolRegistry, preload: &[String], messages: &[Message]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let add = |n: &str, out: &mut Vec<String>| {
        if !out.iter().any(|o| o == n) {
            out.push(n.to_string());
        }
    };
    for n in preload {
        add(n, &mut out);
    }
    for m in messages {
        for c in &m.tool_calls {
            add(&c.name, &mut out);
        }
        if m.role != Role::Tool {
            continue;
        }
        match m.name.as_deref().and_then(Builtin::named) {
            Some(Builtin::ToolSearch) => {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&m.content) else {
                    continue;
                };
                for t in v["tools"].as_array().into_iter().flatten() {
                    if let Some(n) = t["name"].as_str() {
                        add(n, &mut out);
                    }
                }
            }
            Some(Builtin::UseSkill) => {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&m.content) else {
                    continue;
                };
                let globs: Vec<String> = v["allowed_tools"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|g| g.as_str().map(str::to_string))
                    .collect();
                for n in registry.matching(&globs) {
                    add(&n, &mut out);
                }
            }
            _ => {}
        }
    }
    out
}

/// The core tools taken out of the offer: the skill tools when there are no skills,
/// `skill_search` when the prompt lists every skill (nothing left for it to find).
pub fn omitted(skills: &[Skill]) -> &'static [&'static str] {
    if skills.is_empty() {
        SKILL_TOOLS
    } else if crate::skills::all_listed(skills) {
        SEARCH_TOOL
    } else {
        &[]
    }
}

/// The system prompt of a request: `base`, the skills section, the list of tools not loaded.
pub fn system_text(base: &str, skills: &[Skill], deferred: &[(String, String)]) -> String {
    format!(
        "{base}{}{}",
        crate::skills::prompt_section(skills),
        discovery::list_section(deferred)
    )
}

/// The tool schemas of a request over `messages`.
pub fn tools_for(
    registry: &ToolRegistry,
    skills: &[Skill],
    exposed: &[String],
    preload: &[String],
    messages: &[Message],
) -> Vec<ToolSpec> {
    let loaded = loaded_by(registry, preload, messages);
    registry.offer(exposed, &loaded, omitted(skills)).specs
}
