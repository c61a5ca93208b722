//! The identity of every built-in tool, listed once: its wire name, its policy group, whether
//! each request carries it in full (core) and whether it must be opted in. The policy's groups,
//! the core set and the opt-in set are read from this table, and each built-in's
//! [`super::Tool::name`] returns its entry's name; nothing else spells a built-in's name.
//!
//! It decides nothing: the policy, the registry and the turn ask it.

/// A built-in tool (one the gateway itself provides; MCP and custom tools are not here).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Builtin {
    /// `read_file`.
    ReadFile,
    /// `write_file`.
    WriteFile,
    /// `edit_file`.
    EditFile,
    /// `list_directory`.
    ListDirectory,
    /// `glob`.
    Glob,
    /// `grep`.
    Grep,
    /// `exec_shell`.
    ExecShell,
    /// `spawn`.
    Spawn,
    /// `process`.
    Process,
    /// `web_search`.
    WebSearch,
    /// `web_fetch`.
    WebFetch,
    /// `memory_read`.
    MemoryRead,
    /// `memory_write`.
    MemoryWrite,
    /// `memory_search`.
    MemorySearch,
    /// `memory_get`.
    MemoryGet,
    /// `message`.
    Message,
    /// `sessions_list`.
    SessionsList,
    /// `sessions_history`.
    SessionsHistory,
    /// `sessions_send`.
    SessionsSend,
    /// `session_status`.
    SessionStatus,
    /// `history_search`.
    HistorySearch,
    /// `subagents`.
    Subagents,
    /// `use_skill`.
    UseSkill,
    /// `skill_search`.
    SkillSearch,
    /// `tool_search`.
    ToolSearch,
    /// `cron`.
    Cron,
    /// `gateway`.
    Gateway,
    /// `canvas`.
    Canvas,
    /// `nodes`.
    Nodes,
    /// `browser`.
    Browser,
    /// `tts`.
    Tts,
    /// `image`.
    Image,
}

/// A policy group of built-in tools (`group:NAME` in allow and deny lists).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Group {
    /// `group:fs`: the file tools.
    Fs,
    /// `group:runtime`: shell commands and processes.
    Runtime,
    /// `group:web`.
    Web,
    /// `group:memory`.
    Memory,
    /// `group:messaging`.
    Messaging,
    /// `group:sessions`: the session tools, subagents and skills.
    Sessions,
    /// `group:automation`: `cron` and `gateway`.
    Automation,
    /// `group:ui`: the canvas.
    Ui,
    /// `group:nodes`.
    Nodes,
}

impl Group {
    /// Every group, in the order listings show them.
    pub const ALL: [Group; 9] = [
        Group::Fs,
        Group::Runtime,
        Group::Web,
        Group::Memory,
        Group::Messaging,
        Group::Sessions,
        Group::Automation,
        Group::Ui,
        Group::Nodes,
    ];

    /// The name as patterns spell it (`group:fs` → `fs`).
    pub fn name(self) -> &'static str {
        match self {
            Group::Fs => "fs",
            Group::Runtime => "runtime",
            Group::Web => "web",
            Group::Memory => "memory",
            Group::Messaging => "messaging",
            Group::Sessions => "sessions",
            Group::Automation => "automation",
            Group::Ui => "ui",
            Group::Nodes => "nodes",
        }
    }

    /// The group named `name`.
    pub fn named(name: &str) -> Option<Group> {
        Group::ALL.into_iter().find(|g| g.name() == name)
    }

    /// Whether built-in `tool` (by name) is a member.
    pub fn has(self, tool: &str) -> bool {
        Builtin::named(tool).is_some_and(|b| b.group() == Some(self))
    }
}

impl Builtin {
    /// Every built-in tool.
    pub const ALL: [Builtin; 32] = [
        Builtin::ReadFile,
        Builtin::WriteFile,
        Builtin::EditFile,
        Builtin::ListDirectory,
        Builtin::Glob,
        Builtin::Grep,
        Builtin::ExecShell,
        Builtin::Spawn,
        Builtin::Process,
        Builtin::WebSearch,
        Builtin::WebFetch,
        Builtin::MemoryRead,
        Builtin::MemoryWrite,
        Builtin::MemorySearch,
        Builtin::MemoryGet,
        Builtin::Message,
        Builtin::SessionsList,
        Builtin::SessionsHistory,
        Builtin::SessionsSend,
        Builtin::SessionStatus,
        Builtin::HistorySearch,
        Builtin::Subagents,
        Builtin::UseSkill,
        Builtin::SkillSearch,
        Builtin::ToolSearch,
        Builtin::Cron,
        Builtin::Gateway,
        Builtin::Canvas,
        Builtin::Nodes,
        Builtin::Browser,
        Builtin::Tts,
        Builtin::Image,
    ];

    /// The name the model calls it by.
    pub const fn name(self) -> &'static str {
        match self {
            Builtin::ReadFile => "read_file",
            Builtin::WriteFile => "write_file",
            Builtin::EditFile => "edit_file",
            Builtin::ListDirectory => "list_directory",
            Builtin::Glob => "glob",
            Builtin::Grep => "grep",
            Builtin::ExecShell => "exec_shell",
            Builtin::Spawn => "spawn",
            Builtin::Process => "process",
            Builtin::WebSearch => "web_search",
            Builtin::WebFetch => "web_fetch",
            Builtin::MemoryRead => "memory_read",
            Builtin::MemoryWrite => "memory_write",
            Builtin::MemorySearch => "memory_search",
            Builtin::MemoryGet => "memory_get",
            Builtin::Message => "message",
            Builtin::SessionsList => "sessions_list",
            Builtin::SessionsHistory => "sessions_history",
            Builtin::SessionsSend => "sessions_send",
            Builtin::SessionStatus => "session_status",
            Builtin::HistorySearch => "history_search",
            Builtin::Subagents => "subagents",
            Builtin::UseSkill => "use_skill",
            Builtin::SkillSearch => "skill_search",
            Builtin::ToolSearch => "tool_search",
            Builtin::Cron => "cron",
            Builtin::Gateway => "gateway",
            Builtin::Canvas => "canvas",
            Builtin::Nodes => "nodes",
            Builtin::Browser => "browser",
            Builtin::Tts => "tts",
            Builtin::Image => "image",
        }
    }

    /// The built-in called `name`.
    pub fn named(name: &str) -> Option<Builtin> {
        Builtin::ALL.into_iter().find(|b| b.name() == name)
    }

    /// Its policy group, if it has one (`browser`, `tts`, `image` and the search tools have
    /// none: patterns name them directly).
    pub const fn group(self) -> Option<Group> {
        match self {
            Builtin::ReadFile
            | Builtin::WriteFile
            | Builtin::EditFile
            | Builtin::ListDirectory
            | Builtin::Glob
            | Builtin::Grep => Some(Group::Fs),
            Builtin::ExecShell | Builtin::Spawn | Builtin::Process => Some(Group::Runtime),
            Builtin::WebSearch | Builtin::WebFetch => Some(Group::Web),
            Builtin::MemoryRead
            | Builtin::MemoryWrite
            | Builtin::MemorySearch
            | Builtin::MemoryGet => Some(Group::Memory),
            Builtin::Message => Some(Group::Messaging),
            Builtin::SessionsList
            | Builtin::SessionsHistory
            | Builtin::SessionsSend
            | Builtin::SessionStatus
            | Builtin::HistorySearch
            | Builtin::Subagents
            | Builtin::UseSkill => Some(Group::Sessions),
            Builtin::Cron | Builtin::Gateway => Some(Group::Automation),
            Builtin::Canvas => Some(Group::Ui),
            Builtin::Nodes => Some(Group::Nodes),
            Builtin::SkillSearch
            | Builtin::ToolSearch
            | Builtin::Browser
            | Builtin::Tts
            | Builtin::Image => None,
        }
    }

    /// Whether every request carries it in full (a core tool): what a chat assistant uses in
    /// most turns (the file tools, a shell, the web, searching memory), the
    /// search tool itself, and the skill tools (left out when the agent has no skills). The
    /// others are listed by name and loaded with `tool_search`.
    pub const fn core(self) -> bool {
        match self {
            Builtin::ReadFile
            | Builtin::WriteFile
            | Builtin::EditFile
            | Builtin::ListDirectory
            | Builtin::Glob
            | Builtin::ExecShell
            | Builtin::WebFetch
            | Builtin::WebSearch
            | Builtin::MemorySearch
            | Builtin::ToolSearch
            | Builtin::UseSkill
            | Builtin::SkillSearch => true,
            // Listed by name, loaded on demand: searching file contents is a coding task
            // (and `exec_shell` can run `grep`), and a reply reaches its chat without
            // `message`; their schemas (~1.8 KB) kept a one-line message over 8 KB.
            // `history_search` has nothing to find until a chat was summarised; its line in
            // the list is enough for a model to call it by name then.
            Builtin::Grep
            | Builtin::Message
            | Builtin::HistorySearch
            | Builtin::Spawn
            | Builtin::Process
            | Builtin::MemoryRead
            | Builtin::MemoryWrite
            | Builtin::MemoryGet
            | Builtin::SessionsList
            | Builtin::SessionsHistory
            | Builtin::SessionsSend
            | Builtin::SessionStatus
            | Builtin::Subagents
            | Builtin::Cron
            | Builtin::Gateway
            | Builtin::Canvas
            | Builtin::Nodes
            | Builtin::Browser
            | Builtin::Tts
            | Builtin::Image => false,
        }
    }

    /// Whether it is denied unless a layer's `also_allow` names it: `gateway` reads the
    /// gateway's status and reloads its configuration, an operator's power; `nodes` acts on
    /// the user's other machines.
    pub const fn opt_in(self) -> bool {
        matches!(self, Builtin::Gateway | Builtin::Nodes)
    }
}

/// Whether `name` is a core tool ([`Builtin::core`]).
pub fn is_core(name: &str) -> bool {
    Builtin::named(name).is_some_and(Builtin::core)
}

/// Whether `name` must be opted in ([`Builtin::opt_in`]).
pub fn is_opt_in(name: &str) -> bool {
    Builtin::named(name).is_some_and(Builtin::opt_in)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_name_their_entry() {
        let mut seen = std::collections::BTreeSet::new();
        for b in Builtin::ALL {
            assert!(seen.insert(b.name()), "{} twice", b.name());
            assert_eq!(Builtin::named(b.name()), Some(b));
        }
        for g in Group::ALL {
            assert_eq!(Group::named(g.name()), Some(g));
        }
        assert_eq!(Builtin::named("github__search"), None);
    }
}
