//! The module import graph of one crate, read from its source text, and the circles in
//! it (`every_crates_modules_form_layers`). A text scan, not the compiler: good enough
//! to keep layers honest.
//!
//! Each file of `src/` is a module (`a/mod.rs` and `lib.rs` name their folder's
//! module). Its imports are the `crate::a::b` and `super::` paths, and the items of
//! `use crate::x::{a, b}` groups, outside comments and before its first
//! `#[cfg(test)]` (test modules may reach anywhere); each path counts as an import of
//! the longest module it names. Paths to the crate root itself are not counted: the
//! root composes every module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A crate's modules (`a::b`; the root is `""`) and their source text.
pub type Sources = BTreeMap<String, String>;

/// Each module and the modules it imports.
pub type Imports = BTreeMap<String, BTreeSet<String>>;

/// Every `.rs` file under `src`, by module name.
pub fn read_sources(src: &Path) -> Sources {
    let mut sources = Sources::new();
    let mut todo = vec![src.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}")) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(src)
                    .expect("under src")
                    .with_extension("");
                let mut parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
                    parts.pop();
                }
                let text =
                    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
                sources.insert(parts.join("::"), text);
            }
        }
    }
    sources
}

/// The import graph of `sources`.
pub fn imports(sources: &Sources) -> Imports {
    sources
        .iter()
        .map(|(module, text)| {
            let code = without_comments(before_tests(text));
            let parent: Vec<&str> = module.split("::").filter(|p| !p.is_empty()).collect();
            let parent = &parent[..parent.len().saturating_sub(1)];
            let targets = paths(&code, parent)
                .iter()
                .filter_map(|path| longest_module(sources, path))
                .filter(|t| t != module && !module.starts_with(&format!("{t}::")))
                .collect();
            (module.clone(), targets)
        })
        .collect()
}

/// The circles of `graph`: each set of two or more modules that all reach each other.
pub fn circles(graph: &Imports) -> Vec<BTreeSet<String>> {
    let reach: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reachable(graph, m))).collect();
    let mut found: Vec<BTreeSet<String>> = Vec::new();
    for (m, from_m) in &reach {
        let circle: BTreeSet<String> = from_m
            .iter()
            .filter(|w| reach.get(w).is_some_and(|r| r.contains(*m)))
            .cloned()
            .collect();
        if circle.len() > 1 && !found.contains(&circle) {
            found.push(circle);
        }
    }
    found
}

/// A circle as a message: each member and the members it imports.
pub fn describe(graph: &Imports, circle: &BTreeSet<String>) -> String {
    let name = |m: &str| {
        if m.is_empty() {
            "(root)".to_owned()
        } else {
            m.to_owned()
        }
    };
    circle
        .iter()
        .map(|m| {
            let inside: Vec<String> = graph[m]
                .iter()
                .filter(|w| circle.contains(*w))
                .map(|w| name(w))
                .collect();
            format!("{} -> {}", name(m), inside.join(" "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Every module `from` reaches, itself included when it is on a circle.
fn reachable(graph: &Imports, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from.to_owned()];
    while let Some(m) = todo.pop() {
        for w in graph.get(&m).into_iter().flatten() {
            if seen.insert(w.clone()) {
                todo.push(w.clone());
            }
        }
    }
    seen
}

fn before_tests(text: &str) -> &str {
    text.find("#[cfg(test)]").map_or(text, |i| &text[..i])
}

/// `text` without `//` comments (doc comments included: an intra-doc link is not an
/// import).
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|line| line.find("//").map_or(line, |i| &line[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The module paths `code` names from the crate root: `crate::a::b` as `[a, b]`,
/// `super::c` (in a module whose parent is `parent`) as `parent + [c]`, and each item
/// of a `{...}` group after either.
fn paths(code: &str, parent: &[&str]) -> BTreeSet<Vec<String>> {
    let mut found = BTreeSet::new();
    let mut at = 0;
    while let Some(i) = next_head(code, at) {
        let (mut base, mut rest) = if code[i..].starts_with("crate") {
            (Vec::new(), &code[i + "crate".len()..])
        } else {
            let mut base: Vec<String> = parent.iter().map(|p| p.to_string()).collect();
            let mut rest = &code[i + "super".len()..];
            while let Some(r) = rest.strip_prefix("::super") {
                base.pop();
                rest = r;
            }
            (base, rest)
        };
        while let Some(r) = rest.strip_prefix("::") {
            let ident: String = r.chars().take_while(|c| is_ident(*c)).collect();
            if ident.is_empty() {
                if let Some(group) = r.strip_prefix('{') {
                    let group = &group[..group.find('}').unwrap_or(group.len())];
                    for item in group.split(',') {
                        let item = item.split(" as ").next().unwrap_or("").trim();
                        let item: Vec<String> = item
                            .split("::")
                            .map(|p| p.trim().to_owned())
                            .filter(|p| !p.is_empty())
                            .collect();
                        if item.first().is_some_and(|first| first != "self") {
                            found.insert(base.iter().cloned().chain(item).collect());
                        }
                    }
                }
                break;
            }
            rest = &r[ident.len()..];
            base.push(ident);
        }
        if !base.is_empty() {
            found.insert(base);
        }
        at = code.len() - rest.len();
    }
    found
}

/// Where the next `crate` or `super` path head starts at or after `from`: the word,
/// not part of a longer identifier, followed by `::`.
fn next_head(code: &str, from: usize) -> Option<usize> {
    let mut at = from;
    loop {
        let i = ["crate::", "super::"]
            .iter()
            .filter_map(|w| code[at..].find(w).map(|i| at + i))
            .min()?;
        if !code[..i].ends_with(is_ident) {
            return Some(i);
        }
        at = i + 1;
    }
}

/// The longest prefix of `path` that is a module of `sources` (never the root).
fn longest_module(sources: &Sources, path: &[String]) -> Option<String> {
    (1..=path.len())
        .rev()
        .map(|k| path[..k].join("::"))
        .find(|m| sources.contains_key(m))
}
