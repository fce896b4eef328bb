//! The agent's Kubernetes calls through a real `kube::Client` against the fake API
//! server: the node's pods by field selector, the last-activity annotation as a merge
//! patch, and the Event on the pod.

use crate::common;

use std::sync::Arc;

use common::*;
use gpu_booking_agent::agent::Agent;
use gpu_booking_agent::audit::RecordingAudit;
use gpu_booking_agent::cluster::{Cluster, EventKind, KubeCluster, PodEvent};
use gpu_booking_agent::fake_gpu::FakeGpu;
use gpu_booking_agent::pods::PodInfo;
use gpu_booking_agent::procfs::ProcFs;
use gpu_booking_agent::Metrics;
use gpu_booking_core::admission::AdmissionConfig;
use gpu_booking_fake_apiserver::{FakeApiServer, Verb};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;

fn on_node(p: Pod, node: &str) -> Pod {
    let mut p = p;
    if let Some(spec) = p.spec.as_mut() {
        spec.node_name = Some(node.into());
    }
    p
}

#[tokio::test]
async fn lists_only_this_nodes_pods_annotates_and_records_events() {
    let server = FakeApiServer::new();
    // The fake API server gives each pod a UID of its own, as the real one does.
    let mine = server.put(&on_node(pod("jhub", "mine", 1).build(), "gpu-node-1"));
    let mine_uid = mine.metadata.uid.clone().unwrap();
    server.put(&on_node(pod("jhub", "theirs", 2).build(), "gpu-node-2"));
    let cluster = KubeCluster::new(server.client(), "gpu-node-1".into());

    let pods = cluster.node_pods().await.unwrap();
    let names: Vec<_> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert_eq!(names, vec!["mine".to_owned()]);
    let list = server
        .requests()
        .into_iter()
        .find(|r| r.verb == Verb::List)
        .unwrap();
    assert!(
        list.query
            .contains("fieldSelector=spec.nodeName%3Dgpu-node-1"),
        "{}",
        list.query
    );

    let info = PodInfo::from_pod(&pods[0], &AdmissionConfig::default()).unwrap();
    cluster
        .annotate_pod(
            &info,
            "gpu-booking.io/last-gpu-activity",
            "2027-01-15T08:00:00Z",
        )
        .await
        .unwrap();
    let stored: Pod = server.get(Some("jhub"), "mine").unwrap();
    let annotations = stored.metadata.annotations.unwrap();
    assert_eq!(
        annotations["gpu-booking.io/last-gpu-activity"],
        "2027-01-15T08:00:00Z"
    );
    assert_eq!(
        annotations["hub.jupyter.org/username"], "user-mine",
        "others kept"
    );
    let patch = server
        .requests()
        .into_iter()
        .find(|r| r.verb == Verb::Patch)
        .unwrap();
    assert_eq!(patch.body.unwrap()["metadata"]["uid"], mine_uid.as_str());

    let event = PodEvent {
        kind: EventKind::Warning,
        reason: "GPUProcessesReclaimed".into(),
        action: "ReclaimIdleGPU".into(),
        note: "x".repeat(3000),
    };
    cluster.pod_event(&info, &event).await.unwrap();
    let events: Vec<Event> = server.list(Some("jhub"));
    assert_eq!(events.len(), 1);
    let e = &events[0];
    assert_eq!(e.reason.as_deref(), Some("GPUProcessesReclaimed"));
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(
        e.note.as_ref().map(String::len),
        Some(1024),
        "cut to the API's limit"
    );
    let regarding = e.regarding.as_ref().unwrap();
    assert_eq!(regarding.name.as_deref(), Some("mine"));
    assert_eq!(regarding.uid.as_deref(), Some(mine_uid.as_str()));
    assert_eq!(e.reporting_controller.as_deref(), Some("gpu-booking-agent"));
}

#[tokio::test]
async fn the_agent_end_to_end_against_the_fake_api_server() {
    let server = FakeApiServer::new();
    let stored = server.put(&on_node(pod("jhub", "idle", 3).build(), "gpu-node-1"));
    let pod_uid = stored.metadata.uid.clone().unwrap();
    // What the kubelet reports once the container runs.
    server.modify::<Pod>(Some("jhub"), "idle", |p| {
        p["status"] = serde_json::json!({"phase": "Running", "containerStatuses": [{
            "name": "notebook", "containerID": format!("containerd://{}", cid(3)),
            "image": "jupyter", "imageID": "", "ready": true, "restartCount": 0}]});
    });
    let cluster = Arc::new(KubeCluster::new(server.client(), "gpu-node-1".into()));
    let mut node = Node::new(config(), vec![]);
    let metrics = Arc::new(Metrics::new());
    let gpu = Arc::new(FakeGpu::new(1, GPU_MIB));
    let agent = Agent::new(
        config(),
        gpu.clone(),
        cluster,
        Arc::new(RecordingAudit::default()),
        ProcFs::new(node.proc_dir.path()),
        metrics,
    );
    // The child lives in the fake /proc of `node`; the agent under test samples `gpu`.
    let pid = node.spawn_in(&["sleep", "60"], 0, &cgroup(0, &pod_uid, &cid(3)), 1_000);
    gpu.add_process(0, pid, 1_000);
    gpu.follow_real_process(pid);
    let mut last = None;
    for m in 0..=30 {
        last = Some(agent.tick(node.at(m)).await);
    }
    let report = last.unwrap();
    assert_eq!(report.actions.len(), 1, "{report:?}");
    assert_eq!(report.actions[0].result, "success");
    let stored: Pod = server.get(Some("jhub"), "idle").unwrap();
    assert_eq!(
        stored.metadata.annotations.unwrap()["gpu-booking.io/last-gpu-activity"],
        "2027-01-15T08:00:00Z"
    );
    let events: Vec<Event> = server.list(Some("jhub"));
    assert_eq!(events[0].reason.as_deref(), Some("GPUProcessesReclaimed"));
    assert_eq!(
        server.count(Verb::Delete, "pods"),
        0,
        "the pod is never deleted"
    );
    assert!(server.get::<Pod>(Some("jhub"), "idle").is_some());
}
