//! Dependencies point inward only (`docs/architecture.md`).
//!
//! Reads the workspace's own manifests with `cargo metadata --no-deps` (no network, no
//! build) and fails when a crate links one of ours that its layer must not: the
//! controller or the agent linking the booking service, `core` linking anything of
//! ours, the client linking a server. Only normal and build dependencies count: a
//! test may run the real booking service (`gpu_booking_api::testing::TestApi`) or the
//! fake API server, so dev-dependencies are free.
//!
//! A new workspace crate fails [`every_crate_has_a_place`] until it is given its
//! allowed dependencies below (and a line in `docs/architecture.md`).
//!
//! Inside every crate the modules form layers too: [`every_crates_modules_form_layers`]
//! fails on a circle of modules importing each other ([`module_scan`]).

// A crate root's modules sit beside it; this one belongs to this test alone.
#[path = "../architecture/module_scan.rs"]
mod module_scan;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// In [`ALLOWED`]: a composition crate, which may link any crate of ours (cargo
/// refuses a cycle).
const ANY: &[&str] = &["*"];

/// Each workspace crate (package name without `gpu-booking-`; the root package is
/// `gpu-booking`) and the crates of ours it may depend on. Must match the table in
/// `docs/architecture.md`.
const ALLOWED: &[(&str, &[&str])] = &[
    // Pure domain: decisions, no I/O.
    ("core", &[]),
    // Process plumbing shared by every binary: logs, shutdown, admin port, durations.
    ("process", &[]),
    // The HTTP client of the booking service, and the options that reach it (their
    // durations read by `process`'s one parser).
    ("client", &["core", "process"]),
    // The booking service (Postgres, REST, page).
    ("api", &["core", "process"]),
    // The edges that talk to the booking service through the client.
    ("webhook", &["core", "process", "client"]),
    ("controller", &["core", "process", "client"]),
    ("agent", &["core", "process", "client"]),
    ("certs", &["core", "process"]),
    // Test double of kube-apiserver + kube-scheduler.
    ("fake-apiserver", &["core"]),
    // The simulated lab (`gpu-booking demo`): composes every service in one process.
    ("sim", ANY),
    // The binary: every subcommand.
    ("gpu-booking", ANY),
];

/// Pairs that must never be linked, directly or through another crate (the edges
/// never link the booking service; `core` and `process` link nothing of ours),
/// checked over the transitive closure so that the message names the rule even
/// when an allowed-looking middle crate brings it in.
const NEVER: &[(&str, &str)] = &[
    ("controller", "api"),
    ("agent", "api"),
    ("webhook", "api"),
    ("client", "api"),
    ("core", "process"),
    ("core", "client"),
    ("core", "api"),
    ("process", "core"),
    ("process", "api"),
];

/// The short name of a workspace package (`gpu-booking-api` -> `api`).
fn short(package: &str) -> &str {
    package.strip_prefix("gpu-booking-").unwrap_or(package)
}

/// External crates that only one of ours may link, so that what they do is written
/// once: the duration syntax of every option is `process::duration::parse_duration`'s.
const ONLY_IN: &[(&str, &str)] = &[("humantime", "process")];

/// Each workspace crate -> the workspace crates it links (normal and build
/// dependencies), from `cargo metadata`.
fn workspace_graph() -> BTreeMap<String, BTreeSet<String>> {
    dependency_graph(false)
}

/// The workspace's packages, from `cargo metadata --no-deps`.
fn workspace_packages() -> Vec<Value> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata JSON");
    meta["packages"].as_array().expect("packages").clone()
}

/// Each workspace crate -> every crate it names as a normal or build dependency,
/// ours only (by short name), or `all` of them (external ones by their name).
fn dependency_graph(all: bool) -> BTreeMap<String, BTreeSet<String>> {
    let packages = workspace_packages();
    let ours: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().expect("name").to_string())
        .collect();
    packages
        .iter()
        .map(|p| {
            let name = p["name"].as_str().expect("name");
            let deps = p["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                // kind: null (normal), "build" or "dev".
                .filter(|d| d["kind"].as_str() != Some("dev"))
                .filter_map(|d| d["name"].as_str())
                .filter(|d| all || ours.contains(*d))
                .map(|d| short(d).to_string())
                .collect();
            (short(name).to_string(), deps)
        })
        .collect()
}

fn allowed() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    ALLOWED
        .iter()
        .map(|(c, deps)| (*c, deps.iter().copied().collect()))
        .collect()
}

/// Everything `from` links, directly or not.
fn closure(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from.to_string()];
    while let Some(c) = todo.pop() {
        for d in graph.get(&c).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

#[test]
fn every_crate_has_a_place() {
    let graph = workspace_graph();
    let allowed = allowed();
    let unplaced: Vec<&String> = graph
        .keys()
        .filter(|c| !allowed.contains_key(c.as_str()))
        .collect();
    assert!(
        unplaced.is_empty(),
        "workspace crates with no entry in tests/it/architecture.rs ALLOWED \
         (and docs/architecture.md): {unplaced:?}"
    );
    let gone: Vec<&&str> = allowed
        .keys()
        .filter(|c| !graph.contains_key(**c))
        .collect();
    assert!(
        gone.is_empty(),
        "ALLOWED names crates that no longer exist: {gone:?}"
    );
}

#[test]
fn dependencies_point_inward() {
    let graph = workspace_graph();
    let allowed = allowed();
    let mut wrong = Vec::new();
    for (krate, deps) in &graph {
        let Some(ok) = allowed.get(krate.as_str()) else {
            continue; // every_crate_has_a_place reports it
        };
        for d in deps {
            if !ok.contains("*") && !ok.contains(d.as_str()) {
                wrong.push(format!("{krate} -> {d}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "dependencies the architecture forbids (docs/architecture.md): {wrong:?}"
    );
}

#[test]
fn named_rules_hold_transitively() {
    let graph = workspace_graph();
    let mut broken = Vec::new();
    for (from, to) in NEVER {
        if closure(&graph, from).contains(*to) {
            broken.push(format!("{from} links {to}"));
        }
    }
    assert!(broken.is_empty(), "forbidden links: {broken:?}");
}

#[test]
fn the_allowed_table_has_no_cycle() {
    // A cycle in the table would make "inward" meaningless; cargo refuses one in
    // normal dependencies anyway, this keeps the table honest.
    let graph: BTreeMap<String, BTreeSet<String>> = ALLOWED
        .iter()
        .map(|(c, deps)| (c.to_string(), deps.iter().map(|d| d.to_string()).collect()))
        .collect();
    for (c, _) in ALLOWED {
        assert!(
            !closure(&graph, c).contains(*c),
            "{c} reaches itself in ALLOWED"
        );
    }
}

#[test]
fn the_checker_catches_a_forbidden_edge() {
    // The test above would pass vacuously if the graph came back empty or the names
    // were not shortened as ALLOWED spells them: check that the real graph has the
    // edges we know are there, and that a forbidden one would be reported.
    let graph = workspace_graph();
    assert!(graph["webhook"].contains("client"), "{graph:?}");
    assert!(graph["api"].contains("core"), "{graph:?}");
    let mut bad = graph.clone();
    bad.get_mut("controller")
        .expect("controller")
        .insert("api".into());
    assert!(closure(&bad, "controller").contains("api"));
    assert!(!allowed()["controller"].contains("api"));
}

#[test]
fn what_is_written_once_is_linked_once() {
    let graph = dependency_graph(true);
    let mut wrong = Vec::new();
    for (dep, owner) in ONLY_IN {
        for (krate, deps) in &graph {
            if deps.contains(*dep) && krate != owner {
                wrong.push(format!(
                    "{krate} -> {dep} (only {owner} may: use it from there)"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:?}");
}

/// Each workspace crate (short name) and its `src/` folder.
fn source_folders() -> Vec<(String, PathBuf)> {
    workspace_packages()
        .iter()
        .map(|p| {
            let manifest = PathBuf::from(p["manifest_path"].as_str().expect("manifest_path"));
            let src = manifest.parent().expect("crate folder").join("src");
            (short(p["name"].as_str().expect("name")).to_string(), src)
        })
        .collect()
}

#[test]
fn every_crates_modules_form_layers() {
    let folders = source_folders();
    assert!(folders.len() > 5, "too few crates found: {folders:?}");
    let mut wrong = Vec::new();
    for (krate, src) in &folders {
        let sources = module_scan::read_sources(src);
        let graph = module_scan::imports(&sources);
        for circle in module_scan::circles(&graph) {
            wrong.push(format!(
                "{krate}: {} modules in a circle: {}",
                circle.len(),
                module_scan::describe(&graph, &circle)
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "modules that import each other (move the shared piece down a layer; \
         docs/architecture.md):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_module_scan_catches_a_circle() {
    // The check above passes vacuously if the scan finds no imports: a two-module
    // circle, through a path and a `use` group, must be found; comments and test
    // modules must not count, nor imports of a module's own ancestors.
    let sources: module_scan::Sources = [
        (
            "",
            "pub mod a;\npub mod b;\npub mod c;\nuse crate::a::Thing;",
        ),
        (
            "a",
            "use crate::b::Other;\n// crate::c::Comment\nfn f() { crate::c::g() }",
        ),
        (
            "b",
            "use crate::{a::Thing, c};\n#[cfg(test)]\nmod tests { use crate::c::X; }",
        ),
        (
            "c",
            "/// [`crate::a::Thing`]\npub fn g() {}\n#[cfg(test)]\nuse crate::b::Y;",
        ),
        ("c::d", "use super::g;\nuse super::super::a::Thing;"),
    ]
    .into_iter()
    .map(|(m, text)| (m.to_owned(), text.to_owned()))
    .collect();
    let graph = module_scan::imports(&sources);
    let set =
        |names: &[&str]| -> BTreeSet<String> { names.iter().map(|n| n.to_string()).collect() };
    assert_eq!(graph["a"], set(&["b", "c"]), "{graph:?}");
    assert_eq!(graph["b"], set(&["a", "c"]), "{graph:?}");
    assert_eq!(graph["c"], set(&[]), "{graph:?}");
    assert_eq!(graph["c::d"], set(&["a"]), "{graph:?}");
    let circles = module_scan::circles(&graph);
    assert_eq!(circles, vec![set(&["a", "b"])]);
    assert_eq!(module_scan::describe(&graph, &circles[0]), "a -> b; b -> a");
}
