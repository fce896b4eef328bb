//! The chart's bounds on what the controller may write, enforced by the fake API
//! server as kube-apiserver enforces them (its RBAC and ValidatingAdmissionPolicies,
//! stored from `helm template`):
//!
//! - the controller's ServiceAccount may change our labels on a node and our VRAM
//!   budget in its status, and create its marked copies of pods; a forged call (another
//!   label, a taint, another resource, a condition, an unmarked pod, a copy that
//!   mounts a host path or a Secret or runs as another ServiceAccount) is refused;
//! - the uninstall's post-delete hook Job (`gpu-booking cleanup-nodes`) runs as its
//!   own ServiceAccount under its RBAC, with its Job's environment: while a pod of the
//!   controller is left it changes nothing (the controller would put it back), then
//!   it leaves the nodes without our labels and resource, everything else on them as
//!   it was.

use crate::common;

use common::chart;
use gpu_booking_fake_apiserver::FakeApiServer;
use gpu_booking_sim::service_accounts::{self, CONTROLLER};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

const GPUMEM: &str = "gpu-booking.io/gpumem";

/// A GPU node as the controller finds it (what GPU feature discovery and the
/// kubelet wrote), with `ours` labels and our VRAM budget when `advertised`.
fn gpu_node(name: &str, ours: &[(&str, &str)], advertised: bool) -> Value {
    let mut labels = json!({
        "kubernetes.io/hostname": name,
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
    });
    for (k, v) in ours {
        labels[*k] = json!(v);
    }
    let mut resources = json!({"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "4"});
    if advertised {
        resources[GPUMEM] = json!("160000");
    }
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    })
}

fn refused(result: Result<impl std::fmt::Debug, kube::Error>, what: &str) -> String {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{what}: {}", status.message);
            status.message
        }
        other => panic!("{what}: the policy lets it through: {other:?}"),
    }
}

/// A lab API server with the chart's RBAC, admission policies and PriorityClasses.
fn server() -> FakeApiServer {
    let server = FakeApiServer::new();
    server.enable_admission();
    let chart = chart(&[]);
    chart.enforce_on(&server);
    for class in chart.of_kind("PriorityClass") {
        server.put_value("priorityclasses", class);
    }
    server
}

#[tokio::test]
async fn the_charts_policies_let_the_controller_change_only_what_is_ours() {
    let server = server();
    server.put_value("nodes", gpu_node("gpu-1", &[], false));
    let controller = server.client_as(
        &service_accounts::username(CONTROLLER),
        &service_accounts::GROUPS,
    );
    let nodes: Api<Node> = Api::all(controller.clone());
    let pp = PatchParams::default();

    // What the controller does: the model labels, the VRAM budget.
    let labels = json!({"metadata": {"labels": {
        "gpu-booking.io/model": "a100", "model.gpu-booking.io/a100": "true"}}});
    nodes
        .patch("gpu-1", &pp, &Patch::Merge(&labels))
        .await
        .expect("the controller labels a GPU node with its model");
    let budget: json_patch::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/status/capacity/gpu-booking.io~1gpumem", "value": "160000"},
        {"op": "add", "path": "/status/allocatable/gpu-booking.io~1gpumem", "value": "160000"},
    ]))
    .unwrap();
    nodes
        .patch_status("gpu-1", &pp, &Patch::Json::<()>(budget))
        .await
        .expect("the controller advertises the VRAM budget");

    // What a compromised controller would do.
    for (forged, what) in [
        (
            json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}),
            "another label",
        ),
        (
            json!({"metadata": {"labels": {"nvidia.com/gpu.product": "NVIDIA-H100"}}}),
            "GPU discovery's label",
        ),
        (
            json!({"metadata": {"annotations": {"lab.example/owner": "mallory"}}}),
            "an annotation",
        ),
        (json!({"spec": {"taints": null}}), "the taints"),
        (json!({"spec": {"unschedulable": true}}), "cordon"),
    ] {
        let message = refused(
            nodes.patch("gpu-1", &pp, &Patch::Merge(&forged)).await,
            what,
        );
        assert!(
            message.contains("ValidatingAdmissionPolicy 'gpu-booking-controller-nodes'"),
            "{what}: {message}"
        );
    }
    for (ops, what) in [
        (
            json!([{"op": "replace", "path": "/status/capacity/nvidia.com~1gpu", "value": "8"}]),
            "the GPU count",
        ),
        (
            json!([{"op": "add", "path": "/status/allocatable/lab.example~1fpga", "value": "1"}]),
            "another resource",
        ),
        (
            json!([{"op": "replace", "path": "/status/conditions/0/status", "value": "False"}]),
            "a condition",
        ),
    ] {
        let patch: json_patch::Patch = serde_json::from_value(ops).unwrap();
        let message = refused(
            nodes
                .patch_status("gpu-1", &pp, &Patch::Json::<()>(patch))
                .await,
            what,
        );
        assert!(
            message.contains("ValidatingAdmissionPolicy 'gpu-booking-controller-node-status'"),
            "{what}: {message}"
        );
    }

    // Pods: the CPU-only copy of a notebook it ended passes; anything else does not.
    let notebook = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "jupyter-bob",
            "namespace": "jhub",
            "labels": {"component": "singleuser-server", "hub.jupyter.org/username": "bob",
                       "gpu-booking.io/priority": "high", "gpu-booking.io/model": "a100"},
            "annotations": {"hub.jupyter.org/username": "bob"},
        },
        "spec": {"containers": [{"name": "notebook", "image": "jupyter/base",
                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    });
    let cfg = gpu_booking_core::admission::AdmissionConfig::default();
    let copy =
        gpu_booking_controller::recreate::cpu_only_copy(&notebook, &cfg, "booking ended").unwrap();
    let pods: Api<Pod> = Api::namespaced(controller, "jhub");
    let create = |pod: &Value| {
        let pod: Pod = serde_json::from_value(pod.clone()).unwrap();
        let pods = pods.clone();
        async move { pods.create(&PostParams::default(), &pod).await }
    };
    create(&copy)
        .await
        .expect("the controller creates its CPU-only copy");
    let forgeries = [
        (
            json!({"metadata": {"name": "unmarked", "annotations": null}}),
            "an unmarked pod",
        ),
        (
            json!({"metadata": {"name": "host", "annotations": {}}, "spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}}),
            "a host path",
        ),
        (
            json!({"metadata": {"name": "secrets", "annotations": {}}, "spec": {"volumes": [{"name": "hub", "secret": {"secretName": "hub"}}]}}),
            "the hub's Secret",
        ),
        (
            json!({"metadata": {"name": "env", "annotations": {}}, "spec": {"containers": [{"name": "notebook", "image": "jupyter/base",
            "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "hub.config.ConfigurableHTTPProxy.auth_token"}}}]}]}}),
            "a Secret in the environment",
        ),
        (
            json!({"metadata": {"name": "as-hub", "annotations": {}}, "spec": {"serviceAccountName": "hub"}}),
            "the hub's ServiceAccount",
        ),
        (
            json!({"metadata": {"name": "booked", "annotations": {}}, "spec": {"priorityClassName": "gpu-booking-high"}}),
            "the booked priority class",
        ),
        (
            json!({"metadata": {"name": "hostnet", "annotations": {}}, "spec": {"hostNetwork": true}}),
            "the host network",
        ),
    ];
    for (change, what) in forgeries {
        let mut pod = copy.clone();
        json_patch::merge(&mut pod, &change);
        let message = refused(create(&pod).await, what);
        assert!(
            message.contains("ValidatingAdmissionPolicy 'gpu-booking-controller-pod-create'"),
            "{what}: {message}"
        );
    }
    assert_eq!(server.denials(), Vec::new(), "RBAC refused a call");
}

#[derive(clap::Parser)]
struct CleanupCli {
    #[command(flatten)]
    args: gpu_booking_controller::cleanup::CleanupNodesArgs,
}

#[tokio::test]
async fn the_uninstall_hook_takes_our_labels_and_budget_off_every_node() {
    let server = server();
    let ours = [
        ("gpu-booking.io/model", "a100"),
        ("model.gpu-booking.io/a100", "true"),
        ("gpu-booking.io/gpu-memory-mib", "40960"),
    ];
    server.put_value("nodes", gpu_node("gpu-1", &ours, true));
    server.put_value("nodes", gpu_node("gpu-2", &ours[..1], true));
    let untouched = gpu_node("cpu-1", &[], false);
    server.put_value("nodes", untouched.clone());

    let chart = chart(&[]);
    let job = chart
        .find("Job", "gpu-booking-cleanup-nodes")
        .expect("the chart renders the cleanup Job");
    assert_eq!(
        job["metadata"]["annotations"]["helm.sh/hook"],
        "post-delete"
    );
    let workload = chart
        .workload("Job", "gpu-booking-cleanup-nodes")
        .unwrap_or_else(|e| panic!("{e:#}"));
    let volumes = tempfile::tempdir().unwrap();
    let lab = gpu_booking_sim::rendered::LabEnvironment {
        pod_name: "gpu-booking-cleanup-nodes-0".into(),
        ..Default::default()
    };
    let mut cli: CleanupCli =
        gpu_booking_sim::rendered::options(&workload, &lab, volumes.path(), &[])
            .unwrap_or_else(|e| panic!("{e:#}"));
    let namespace = cli
        .args
        .namespace
        .clone()
        .expect("the Job names its namespace");
    let hook = || server.client_as(&workload.username(), &service_accounts::GROUPS);

    // A controller pod still terminating: nothing is touched, and the Job says why.
    let controller_pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-booking-controller-7d4f-x2", "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": "gpu-booking",
                                "app.kubernetes.io/instance": "gpu-booking",
                                "app.kubernetes.io/component": "controller"}},
        "spec": {"containers": [{"name": "controller", "image": "gpu-booking"}]},
    });
    server.put_value("pods", controller_pod);
    let patient = cli.args.wait_timeout;
    cli.args.wait_timeout = std::time::Duration::ZERO;
    let waiting = gpu_booking_controller::cleanup::run(hook(), &namespace, &cli.args)
        .await
        .expect_err("the controller still runs");
    assert!(
        format!("{waiting:#}").contains("gpu-booking-controller-7d4f-x2"),
        "{waiting:#}"
    );
    let node: Value = serde_json::to_value(server.get::<Node>(None, "gpu-1").unwrap()).unwrap();
    assert_eq!(node["metadata"]["labels"]["gpu-booking.io/model"], "a100");
    Api::<Pod>::namespaced(server.client(), &namespace)
        .delete("gpu-booking-controller-7d4f-x2", &Default::default())
        .await
        .unwrap();
    cli.args.wait_timeout = patient;

    let report = gpu_booking_controller::cleanup::run(hook(), &namespace, &cli.args)
        .await
        .unwrap_or_else(|e| panic!("the cleanup Job: {e:#}"));
    assert_eq!(report.unlabelled, ["gpu-1", "gpu-2"]);
    assert_eq!(report.unadvertised, ["gpu-1", "gpu-2"]);

    for name in ["gpu-1", "gpu-2"] {
        let node: Value = serde_json::to_value(server.get::<Node>(None, name).unwrap()).unwrap();
        let expected = gpu_node(name, &[], false);
        assert_eq!(
            node["metadata"]["labels"], expected["metadata"]["labels"],
            "{name}"
        );
        assert_eq!(
            node["metadata"]["annotations"], expected["metadata"]["annotations"],
            "{name}"
        );
        assert_eq!(node["spec"], expected["spec"], "{name}");
        for field in ["capacity", "allocatable", "conditions"] {
            assert_eq!(
                node["status"][field], expected["status"][field],
                "{name} {field}"
            );
        }
    }
    let cpu: Value = serde_json::to_value(server.get::<Node>(None, "cpu-1").unwrap()).unwrap();
    assert_eq!(cpu["metadata"]["labels"], untouched["metadata"]["labels"]);
    assert_eq!(
        server.denials(),
        Vec::new(),
        "the hook's RBAC refused a call"
    );

    // A second run (a retried hook) finds nothing to do.
    let again = gpu_booking_controller::cleanup::run(hook(), &namespace, &cli.args)
        .await
        .unwrap();
    assert_eq!(again, gpu_booking_controller::cleanup::Report::default());
}
