//! The layering of `src/` (docs/architecture.md, "Layers"): dependencies between top-level
//! modules point one way. This test walks every `crate::` path in the non-test code of each
//! top-level module and fails on an import that goes sideways or up, naming the file; a new
//! top-level module must be given a layer here (and in the doc) before it can land.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module of `src/` and its layer, from the bottom up. A module may import only
/// from modules of a lower layer.
const LAYERS: &[(&str, u32)] = &[
    // 0: leaf types and process-wide facilities.
    ("types", 0),
    ("metrics", 0),
    ("telemetry", 0),
    ("notify", 0),
    // 1-4: domain libraries, each usable alone.
    ("llm", 1),
    ("net", 1),
    ("store", 2),
    ("tools", 3),
    ("skills", 4),
    ("mcp", 4),
    ("media", 4),
    ("browser", 4),
    ("memory", 4),
    ("scheduler", 4),
    ("cluster", 4),
    // 5: configuration (aggregates the domain modules' settings types) and approvals.
    ("config", 5),
    ("approval", 5),
    // 6-9: the turn and the actors, talking through narrow handles.
    ("egress", 6),
    ("turn", 6),
    ("session", 7),
    ("bus", 8),
    ("ingress", 9),
    ("subagent", 9),
    // 10-12: the composition root, the control plane, the CLI.
    ("daemon", 10),
    ("admin", 11),
    ("cli", 12),
];

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file without its trailing `#[cfg(test)] mod …` and without comment lines.
fn production_code(text: &str) -> String {
    let cut = text.find("#[cfg(test)]\nmod ").unwrap_or(text.len());
    text[..cut]
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The top-level modules a piece of code names through `crate::` (also inside `use crate::{…}`).
fn crate_refs(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut start, mut end) = (1, 0, group.len());
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = j;
                            break;
                        }
                    }
                    ',' if depth == 1 => {
                        out.insert(ident(group[start..j].trim()).to_string());
                        start = j + 1;
                    }
                    _ => {}
                }
            }
            out.insert(ident(group[start..end].trim()).to_string());
        } else {
            out.insert(ident(rest).to_string());
        }
    }
    out.retain(|m| !m.is_empty() && m.chars().next().is_some_and(char::is_lowercase));
    out
}

#[test]
fn top_level_modules_depend_only_on_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let layer: BTreeMap<&str, u32> = LAYERS.iter().copied().collect();
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let mut violations = Vec::new();
    let mut modules = BTreeSet::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap();
        let name = rel.file_name().unwrap().to_string_lossy();
        if name == "tests.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if top == "lib" || top == "main" {
            continue;
        }
        let Some(&mine) = layer.get(top.as_str()) else {
            violations.push(format!(
                "src/{}: module `{top}` has no layer in tests/it/layering.rs",
                rel.display()
            ));
            continue;
        };
        modules.insert(top.clone());
        let code = production_code(&std::fs::read_to_string(&f).unwrap());
        for dep in crate_refs(&code) {
            if dep == top {
                continue;
            }
            match layer.get(dep.as_str()) {
                Some(&theirs) if theirs < mine => {}
                Some(&theirs) => violations.push(format!(
                    "src/{}: `{top}` (layer {mine}) imports `{dep}` (layer {theirs})",
                    rel.display()
                )),
                // A crate-root item (e.g. `crate::install_crypto_provider`).
                None => {}
            }
        }
    }
    assert!(
        violations.is_empty(),
        "imports against the layering:\n{}",
        violations.join("\n")
    );
    for (m, _) in LAYERS {
        assert!(
            modules.contains(*m),
            "layer table names `{m}`, which is not in src/"
        );
    }
}

#[test]
fn the_crate_docs_list_every_public_module() {
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let missing: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';'))
        .filter(|m| {
            let link = format!("[`{m}`]");
            !lib.lines()
                .any(|l| l.starts_with("//!") && l.contains(&link))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "src/lib.rs `# Layout` does not list: {missing:?}"
    );
}

#[test]
fn the_walker_sees_grouped_and_nested_imports() {
    let refs = crate_refs(&production_code(
        "use crate::{bus::Inbox, egress::{Outbox, ChannelTable}, types};\nlet x = crate::metrics::inc();\n    // crate::daemon\n#[cfg(test)]\nmod tests { use crate::cli; }\n",
    ));
    assert_eq!(
        refs.into_iter().collect::<Vec<_>>(),
        ["bus", "egress", "metrics", "types"]
    );
}

/// The siblings in `folder` (a file stem, or a subfolder's name) that `code` of a file in it
/// names through `super::X`, `crate::<folder>::X` or `use super::{X, …}`.
fn sibling_refs(code: &str, folder: &str, siblings: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let prefix = format!("crate::{folder}::");
    for marker in ["super::", prefix.as_str()] {
        let mut rest = code;
        while let Some(i) = rest.find(marker) {
            // `super::super::` goes above the folder.
            let before = &rest[..i];
            rest = &rest[i + marker.len()..];
            if marker == "super::" && (rest.starts_with("super::") || before.ends_with("super::")) {
                continue;
            }
            let names: Vec<String> = match rest.strip_prefix('{') {
                Some(group) => {
                    let end = group.find('}').unwrap_or(group.len());
                    group[..end]
                        .split(',')
                        .map(|p| ident(p.trim()).to_string())
                        .collect()
                }
                None => vec![ident(rest).to_string()],
            };
            out.extend(names.into_iter().filter(|n| siblings.contains(n)));
        }
    }
    out
}

/// A cycle of files in `graph`, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in graph.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == m).unwrap_or(0);
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(m, graph, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(n, graph, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// docs/architecture.md ("Layers"): inside `config/`, `cluster/` and `tools/` the files import
/// one way, so each can be read from the bottom up (a subfolder counts as one file; `mod.rs`,
/// which declares them all, is left out).
#[test]
fn files_inside_config_cluster_and_tools_import_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut failures = Vec::new();
    for folder in ["config", "cluster", "tools"] {
        let dir = src.join(folder);
        let mut nodes: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            if p.is_dir() {
                let mut files = Vec::new();
                rs_files(&p, &mut files);
                nodes.insert(name, files);
            } else if let Some(stem) = name.strip_suffix(".rs") {
                if stem != "mod" && stem != "tests" && !stem.ends_with("_tests") {
                    nodes.insert(stem.to_string(), vec![p]);
                }
            }
        }
        let siblings: BTreeSet<String> = nodes.keys().cloned().collect();
        let mut graph = BTreeMap::new();
        for (node, files) in &nodes {
            let mut refs = BTreeSet::new();
            for f in files {
                let code = production_code(&std::fs::read_to_string(f).unwrap());
                // Files of a subfolder reach the folder's files through `super::super::`
                // or the crate path; their own `super::` is the subfolder.
                let inside_sub = f.parent() != Some(dir.as_path());
                let code = if inside_sub {
                    code.replace("super::super::", "crate::__up__::")
                        .replace("super::", "crate::__sub__::")
                        .replace("crate::__up__::", "super::")
                } else {
                    code
                };
                refs.extend(sibling_refs(&code, folder, &siblings));
            }
            refs.remove(node);
            graph.insert(node.clone(), refs);
        }
        if let Some(cycle) = find_cycle(&graph) {
            failures.push(format!("src/{folder}: {}", cycle.join(" -> ")));
        }
    }
    assert!(
        failures.is_empty(),
        "files that import each other in a circle:\n{}",
        failures.join("\n")
    );
}

/// Only `src/config/` reads the process environment (CONVENTIONS C6): everything else is
/// given what it needs.
#[test]
fn only_config_reads_the_environment() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let mut readers = Vec::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap();
        let name = rel.file_name().unwrap().to_string_lossy();
        if rel.starts_with("config") || name == "tests.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        let code = production_code(&std::fs::read_to_string(&f).unwrap());
        for needle in ["env::var(", "env::vars(", "env::var_os(", "env::vars_os("] {
            if code.contains(needle) {
                readers.push(format!("src/{} ({needle}…)", rel.display()));
            }
        }
    }
    assert!(
        readers.is_empty(),
        "the environment is read outside src/config/:\n{}",
        readers.join("\n")
    );
}

/// Nothing reaches the turn's code through a task-local (CONVENTIONS C5: handles are passed).
#[test]
fn no_task_locals() {
    let mut files = Vec::new();
    for dir in ["src", "channels"] {
        rs_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join(dir), &mut files);
    }
    let found: Vec<String> = files
        .iter()
        .filter(|f| production_code(&std::fs::read_to_string(f).unwrap()).contains("task_local!"))
        .map(|f| f.display().to_string())
        .collect();
    assert!(found.is_empty(), "task_local! in {found:?}");
}
