//! `weft completions bash|zsh|fish`: a completion script generated from the clap command tree
//! (subcommands, flags, the values of enum options, paths for path options). A small
//! generator of our own instead of `clap_complete`, to keep the release binary within its size
//! budget (docs/performance.md).

use std::fmt::Write;

use clap::{Arg, ArgAction, Command, ValueHint};

/// A shell with completion support.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Shell {
    /// Bash (bash-completion).
    Bash,
    /// Zsh (compsys).
    Zsh,
    /// Fish.
    Fish,
}

/// One command of the tree: its path (`weft sessions show`) and what completes after it.
struct Node {
    path: Vec<String>,
    subcommands: Vec<(String, String)>,
    flags: Vec<Flag>,
}

struct Flag {
    long: Option<String>,
    short: Option<char>,
    help: String,
    /// Takes a value.
    takes_value: bool,
    /// The accepted values (enum options).
    values: Vec<String>,
    /// A file or directory path.
    path: bool,
}

fn first_line(s: Option<&clap::builder::StyledStr>) -> String {
    s.map(ToString::to_string)
        .unwrap_or_default()
        .lines()
        .next()
        .unwrap_or_default()
        .trim_end_matches('.')
        .to_string()
}

fn flag(a: &Arg) -> Option<Flag> {
    if a.is_positional() || a.is_hide_set() {
        return None;
    }
    let takes_value = !matches!(
        a.get_action(),
        ArgAction::SetTrue
            | ArgAction::SetFalse
            | ArgAction::Count
            | ArgAction::Help
            | ArgAction::HelpShort
            | ArgAction::HelpLong
            | ArgAction::Version
    );
    let values = a
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| v.get_name().to_string())
        .collect();
    let path = matches!(
        a.get_value_hint(),
        ValueHint::FilePath | ValueHint::DirPath | ValueHint::AnyPath
    ) || a.get_value_names().is_some_and(|n| {
        n.iter()
            .any(|n| matches!(n.as_str(), "PATH" | "DIR" | "FILE"))
    });
    Some(Flag {
        long: a.get_long().map(str::to_string),
        short: a.get_short(),
        help: first_line(a.get_help()),
        takes_value,
        values,
        path,
    })
}

fn walk(cmd: &Command, path: Vec<String>, out: &mut Vec<Node>) {
    let subs: Vec<&Command> = cmd
        .get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
        .collect();
    out.push(Node {
        path: path.clone(),
        subcommands: subs
            .iter()
            .map(|c| (c.get_name().to_string(), first_line(c.get_about())))
            .collect(),
        flags: cmd.get_arguments().filter_map(flag).collect(),
    });
    for c in subs {
        let mut p = path.clone();
        p.push(c.get_name().to_string());
        walk(c, p, out);
    }
}

fn nodes(cmd: &mut Command) -> Vec<Node> {
    cmd.build();
    let mut out = Vec::new();
    walk(cmd, vec![cmd.get_name().to_string()], &mut out);
    out
}

fn words(n: &Node) -> String {
    let mut w: Vec<String> = n.subcommands.iter().map(|(s, _)| s.clone()).collect();
    for f in &n.flags {
        w.extend(f.long.iter().map(|l| format!("--{l}")));
        w.extend(f.short.iter().map(|s| format!("-{s}")));
    }
    w.join(" ")
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The completion script for `shell`, for the command tree `cmd` (named `weft`).
pub fn script(shell: Shell, cmd: &mut Command) -> String {
    let nodes = nodes(cmd);
    let name = cmd.get_name().to_string();
    match shell {
        Shell::Bash => bash(&name, &nodes),
        Shell::Zsh => zsh(&name, &nodes),
        Shell::Fish => fish(&name, &nodes),
    }
}

/// `case` arms finding the command path from the words typed so far (shared by bash and zsh).
fn path_arms(nodes: &[Node]) -> String {
    let mut s = String::new();
    for n in nodes.iter().skip(1) {
        let _ = writeln!(
            s,
            "            {}) cmdpath={} ;;",
            quote(&n.path.join(" ")),
            quote(&n.path.join(" "))
        );
    }
    s
}

/// `case` arms completing the value of the option just typed (`$prev`).
fn value_arms(nodes: &[Node], enum_values: &str, files: &str) -> String {
    let mut seen = std::collections::BTreeSet::new();
    let mut s = String::new();
    for f in nodes
        .iter()
        .flat_map(|n| &n.flags)
        .filter(|f| f.takes_value)
    {
        let mut pats = Vec::new();
        pats.extend(f.long.iter().map(|l| format!("--{l}")));
        pats.extend(f.short.iter().map(|c| format!("-{c}")));
        let pats: Vec<String> = pats
            .into_iter()
            .filter(|p| seen.insert(p.clone()))
            .collect();
        if pats.is_empty() {
            continue;
        }
        let action = if !f.values.is_empty() {
            enum_values.replace("{}", &f.values.join(" "))
        } else if f.path {
            files.to_string()
        } else {
            "return 0".to_string()
        };
        let _ = writeln!(s, "        {}) {action} ;;", pats.join("|"));
    }
    s
}

fn bash(name: &str, nodes: &[Node]) -> String {
    let mut words_arms = String::new();
    for n in nodes {
        let _ = writeln!(
            words_arms,
            "        {}) opts={} ;;",
            quote(&n.path.join(" ")),
            quote(&words(n))
        );
    }
    format!(
        r#"# bash completion for {name} (generated by `{name} completions bash`)
_{name}() {{
    local cur prev cmdpath="{name}" i w opts
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${{COMP_WORDS[i]}}"
        case "$cmdpath $w" in
{path}        esac
    done
    case "$prev" in
{values}    esac
    case "$cmdpath" in
{words_arms}    esac
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}}
complete -F _{name} {name}
"#,
        path = path_arms(nodes),
        values = value_arms(
            nodes,
            "COMPREPLY=($(compgen -W '{}' -- \"$cur\")); return 0",
            "COMPREPLY=($(compgen -f -- \"$cur\")); return 0"
        ),
    )
}

fn zsh(name: &str, nodes: &[Node]) -> String {
    let mut arms = String::new();
    for n in nodes {
        let mut items: Vec<String> = n
            .subcommands
            .iter()
            .map(|(s, h)| quote(&format!("{s}:{}", h.replace(':', "\\:"))))
            .collect();
        for f in &n.flags {
            for w in f
                .long
                .iter()
                .map(|l| format!("--{l}"))
                .chain(f.short.iter().map(|c| format!("-{c}")))
            {
                items.push(quote(&format!("{w}:{}", f.help.replace(':', "\\:"))));
            }
        }
        let _ = writeln!(
            arms,
            "        {}) items=({}) ;;",
            quote(&n.path.join(" ")),
            items.join(" ")
        );
    }
    format!(
        r#"#compdef {name}
# zsh completion for {name} (generated by `{name} completions zsh`)
_{name}() {{
    local cmdpath="{name}" i w prev items
    prev="${{words[CURRENT-1]}}"
    for ((i = 2; i < CURRENT; i++)); do
        w="${{words[i]}}"
        case "$cmdpath $w" in
{path}        esac
    done
    case "$prev" in
{values}    esac
    case "$cmdpath" in
{arms}    esac
    _describe -t commands '{name}' items
}}
if [ "$funcstack[1]" = "_{name}" ]; then
    _{name} "$@"
else
    compdef _{name} {name}
fi
"#,
        path = path_arms(nodes),
        values = value_arms(nodes, "compadd -- {}; return 0", "_files; return 0"),
    )
}

fn fish(name: &str, nodes: &[Node]) -> String {
    let mut s = format!(
        "# fish completion for {name} (generated by `{name} completions fish`)\ncomplete -c {name} -f\n"
    );
    for n in nodes {
        // The condition: this command's path was typed, and none of its subcommands yet.
        let depth = n.path.len() - 1;
        let mut cond = if depth == 0 {
            "__fish_use_subcommand".to_string()
        } else {
            n.path[1..]
                .iter()
                .map(|p| format!("__fish_seen_subcommand_from {p}"))
                .collect::<Vec<_>>()
                .join("; and ")
        };
        if depth > 0 && !n.subcommands.is_empty() {
            let subs: Vec<&str> = n.subcommands.iter().map(|(s, _)| s.as_str()).collect();
            let _ = write!(
                cond,
                "; and not __fish_seen_subcommand_from {}",
                subs.join(" ")
            );
        }
        for (sub, help) in &n.subcommands {
            let _ = writeln!(
                s,
                "complete -c {name} -n {} -a {sub} -d {}",
                quote(&cond),
                quote(help)
            );
        }
        for f in &n.flags {
            let mut line = format!("complete -c {name}");
            if depth > 0 {
                let c = n.path[1..]
                    .iter()
                    .map(|p| format!("__fish_seen_subcommand_from {p}"))
                    .collect::<Vec<_>>()
                    .join("; and ");
                let _ = write!(line, " -n {}", quote(&c));
            }
            if let Some(l) = &f.long {
                let _ = write!(line, " -l {l}");
            }
            if let Some(c) = f.short {
                let _ = write!(line, " -s {c}");
            }
            if f.takes_value {
                if !f.values.is_empty() {
                    let _ = write!(line, " -x -a {}", quote(&f.values.join(" ")));
                } else if f.path {
                    line.push_str(" -r -F");
                } else {
                    line.push_str(" -x");
                }
            }
            let _ = writeln!(s, "{line} -d {}", quote(&f.help));
        }
    }
    s
}
