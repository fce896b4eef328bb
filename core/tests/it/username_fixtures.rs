//! The slug functions against real KubeSpawner pod bodies (tests/fixtures/kubespawner,
//! copies of the project's shared fixtures):
//! the raw-name annotation must encode to exactly the label KubeSpawner wrote.

use std::fs;
use std::path::{Path, PathBuf};

use gpu_booking_core::username::{escape_decode, escape_encode, safe_slug, Username};
use serde_json::Value;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/kubespawner");
const USERNAME: &str = "hub.jupyter.org/username";
const SERVERNAME: &str = "hub.jupyter.org/servername";

struct Pod {
    file: String,
    version: String,
    metadata: Value,
}

impl Pod {
    fn label(&self, key: &str) -> Option<&str> {
        self.metadata["labels"][key].as_str()
    }

    fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata["annotations"][key].as_str()
    }
}

fn pods() -> Vec<Pod> {
    let dir = Path::new(FIXTURES);
    let mut paths: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("fixtures folder {}: {e}", dir.display()))
        .map(|entry| entry.expect("readable folder entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let file = path
                .file_name()
                .and_then(|n| n.to_str())
                .expect("UTF-8 file name")
                .to_owned();
            let body: Value = serde_json::from_str(
                &fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}")),
            )
            .unwrap_or_else(|e| panic!("{file}: {e}"));
            let version = file.split('-').next().expect("version prefix").to_owned();
            Pod {
                file,
                version,
                metadata: body["metadata"].clone(),
            }
        })
        .collect()
}

#[test]
fn fixtures_are_there() {
    let pods = pods();
    assert_eq!(pods.len(), 12, "six users x two KubeSpawner versions");
    assert_eq!(pods.iter().filter(|p| p.version == "6.2.0").count(), 6);
    assert_eq!(pods.iter().filter(|p| p.version == "7.1.0").count(), 6);
}

#[test]
fn kubespawner_6_labels_are_escape_slugs() {
    for pod in pods().iter().filter(|p| p.version == "6.2.0") {
        let name = pod.annotation(USERNAME).expect("username annotation");
        let label = pod.label(USERNAME).expect("username label");
        assert_eq!(escape_encode(name), label, "{}", pod.file);
        assert_eq!(escape_decode(label).as_deref(), Ok(name), "{}", pod.file);
        assert!(Username::parse(name).is_ok(), "{}", pod.file);

        // The servername label uses the same scheme (empty on the default server).
        let server = pod.annotation(SERVERNAME).unwrap_or("");
        let server_label = pod.label(SERVERNAME).expect("servername label");
        assert_eq!(escape_encode(server), server_label, "{}", pod.file);
        assert_eq!(
            escape_decode(server_label).as_deref(),
            Ok(server),
            "{}",
            pod.file
        );
    }
}

#[test]
fn kubespawner_7_labels_are_safe_slugs() {
    for pod in pods().iter().filter(|p| p.version == "7.1.0") {
        let name = pod.annotation(USERNAME).expect("username annotation");
        let label = pod.label(USERNAME).expect("username label");
        assert_eq!(safe_slug(name), label, "{}", pod.file);
        assert!(Username::parse(name).is_ok(), "{}", pod.file);

        let server = pod.annotation(SERVERNAME).unwrap_or("");
        let server_label = pod.label(SERVERNAME).expect("servername label");
        assert_eq!(safe_slug(server), server_label, "{}", pod.file);
    }
}

#[test]
fn both_versions_agree_on_the_raw_name() {
    let pods = pods();
    for old in pods.iter().filter(|p| p.version == "6.2.0") {
        let twin = old.file.replacen("6.2.0", "7.1.0", 1);
        let new = pods
            .iter()
            .find(|p| p.file == twin)
            .unwrap_or_else(|| panic!("no 7.1.0 twin of {}", old.file));
        assert_eq!(
            old.annotation(USERNAME),
            new.annotation(USERNAME),
            "{}",
            old.file
        );
    }
}
