//! Real `kubectl` (scripts/chart-tools.sh installs it under target/chart-tools) against
//! the simulated lab's API server over HTTPS, with the kubeconfig the lab writes: what
//! a person looking at the demo's cluster types, answered as a cluster answers it.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common;

use common::*;
use gpu_booking_sim::spawner::NOTEBOOK_NAMESPACE;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Resource;
use sqlx::PgPool;

/// `$KUBECTL`, else the one `scripts/chart-tools.sh` installs.
fn kubectl_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("KUBECTL") {
        return PathBuf::from(path);
    }
    let installed =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("target/chart-tools/kubectl/kubectl");
    assert!(
        installed.exists(),
        "kubectl is not installed: run scripts/chart-tools.sh (it installs kubectl under target/chart-tools) or set KUBECTL"
    );
    installed
}

/// Runs `kubectl args` with `kubeconfig`, its discovery cache in `home`, off the
/// runtime's threads (the API server it asks runs on them).
async fn kubectl(kubeconfig: &Path, home: &Path, args: &[&str]) -> Output {
    let mut command = std::process::Command::new(kubectl_binary());
    command
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", home)
        .arg("--cache-dir")
        .arg(home.join("cache"));
    tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("kubectl ran")
        .expect("kubectl started")
}

/// Its standard output; fails naming the command and what it said when it failed.
async fn kubectl_ok(kubeconfig: &Path, home: &Path, args: &[&str]) -> String {
    let out = kubectl(kubeconfig, home, args).await;
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The line of `table` that contains `needle`; fails showing the table.
fn line_with<'a>(table: &'a str, needle: &str) -> Vec<&'a str> {
    table
        .lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{table}"))
        .split_whitespace()
        .collect()
}

#[sqlx::test(migrations = "./migrations")]
async fn kubectl_gets_and_describes_the_labs_pods_nodes_and_events(pool: PgPool) {
    let lab = Lab::start(pool).await;
    let pod = lab.sim.spawn("bob@example.com", 1).await.expect("spawned");
    let name = pod.metadata.name.clone().expect("a name");
    lab.expect("bob's notebook never ran", |s| {
        running(s, "bob@example.com").is_some()
    })
    .await;
    let pod: Pod = lab.notebook("bob@example.com").expect("bob's notebook");
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .expect("bound");
    // An Event about it, written as the lab's components write theirs
    // (events.k8s.io/v1), which kubectl reads as core Events.
    let recorder = Recorder::new(
        lab.sim.server.client(),
        Reporter {
            controller: "gpu-booking-controller".into(),
            instance: None,
        },
    );
    recorder
        .publish(
            &Event {
                type_: EventType::Normal,
                reason: "CheckedByKubectl".into(),
                note: Some("the lab's API server answers kubectl".into()),
                action: "Check".into(),
                secondary: None,
            },
            &pod.object_ref(&()),
        )
        .await
        .expect("the event is recorded");

    let home = tempfile::tempdir().expect("a home for kubectl's cache");
    let config = lab.sim.kubeconfig().to_owned();

    let pods = kubectl_ok(&config, home.path(), &["get", "pods", "-A"]).await;
    assert_eq!(
        pods.lines()
            .next()
            .map(|h| h.split_whitespace().collect::<Vec<_>>()),
        Some(vec![
            "NAMESPACE",
            "NAME",
            "READY",
            "STATUS",
            "RESTARTS",
            "AGE"
        ]),
        "the server's Table columns, with kubectl's NAMESPACE:\n{pods}"
    );
    assert_eq!(
        line_with(&pods, &name)[..5],
        [NOTEBOOK_NAMESPACE, name.as_str(), "1/1", "Running", "0"]
    );

    let described = kubectl_ok(
        &config,
        home.path(),
        &["describe", "pod", &name, "-n", NOTEBOOK_NAMESPACE],
    )
    .await;
    assert_eq!(line_with(&described, "Name:")[1], name);
    assert_eq!(line_with(&described, "Namespace:")[1], NOTEBOOK_NAMESPACE);
    assert!(
        line_with(&described, "Node:")[1].starts_with(&node),
        "{described}"
    );
    assert_eq!(line_with(&described, "Status:")[1], "Running");
    let events = described
        .split_once("Events:")
        .map(|(_, events)| events)
        .unwrap_or_else(|| panic!("no Events section:\n{described}"));
    assert!(
        events.contains("CheckedByKubectl")
            && events.contains("the lab's API server answers kubectl"),
        "describe lists the pod's events (a field selector on involvedObject):\n{described}"
    );

    let events = kubectl_ok(&config, home.path(), &["get", "events", "-A"]).await;
    let row = line_with(&events, "CheckedByKubectl");
    assert_eq!(row[0], NOTEBOOK_NAMESPACE);
    assert_eq!(row[2], "Normal");
    assert_eq!(row[4], format!("pod/{name}"));

    let nodes = kubectl_ok(&config, home.path(), &["get", "nodes"]).await;
    for lab_node in &lab.sim.nodes {
        let row = line_with(&nodes, &lab_node.name);
        assert_eq!(row[0], lab_node.name);
        assert_eq!(row[1], "Ready", "{nodes}");
        assert_eq!(row.last().copied(), Some("v1.30.0"), "{nodes}");
    }

    // No token the server issued: no answer.
    let wrong = home.path().join("wrong-kubeconfig");
    let text = std::fs::read_to_string(&config).expect("the kubeconfig");
    let token = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .expect("the kubeconfig holds a token");
    std::fs::write(&wrong, text.replace(token, "not-a-token")).expect("written");
    let refused = kubectl(&wrong, home.path(), &["get", "pods", "-A"]).await;
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("Unauthorized"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    lab.shutdown().await;
}
