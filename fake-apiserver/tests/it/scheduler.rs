//! The fake's opt-in scheduler and kubelet against documented kube-scheduler behaviour.
//! Pages: "Assigning Pods to Nodes", "Taints and Tolerations", "Resource Management for
//! Pods and Containers" (extended resources), "Pod Priority and Preemption", "Pod
//! Lifecycle" (graceful termination, DisruptionTarget); messages as kube-scheduler's
//! `FitError` writes them.

use std::time::Duration;

use chrono::Utc;
use gpu_booking_fake_apiserver::{FakeApiServer, NodeBuilder};
use k8s_openapi::api::core::v1::{Node, Pod, PodCondition};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

const NS: &str = "jhub";
const GPU: &str = "nvidia.com/gpu";
const GPUMEM: &str = "gpu-booking.io/gpumem";
const PRODUCT: &str = "nvidia.com/gpu.product";

/// A notebook pod with one container and no resources.
fn pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "notebook", "image": "jupyter/base"}]}
    })
}

/// `limits` only, as GPU pods usually say it (the request defaults to the limit).
fn limits(mut pod: Value, resources: &[(&str, &str)]) -> Value {
    for (r, q) in resources {
        pod["spec"]["containers"][0]["resources"]["limits"][*r] = json!(q);
    }
    pod
}

fn requests(mut pod: Value, resources: &[(&str, &str)]) -> Value {
    for (r, q) in resources {
        pod["spec"]["containers"][0]["resources"]["requests"][*r] = json!(q);
    }
    pod
}

/// `spec.priority` as the Priority admission plugin would have resolved it.
fn priority(mut pod: Value, value: i32, policy: &str) -> Value {
    pod["spec"]["priority"] = json!(value);
    pod["spec"]["preemptionPolicy"] = json!(policy);
    pod
}

fn select(mut pod: Value, key: &str, value: &str) -> Value {
    pod["spec"]["nodeSelector"][key] = json!(value);
    pod
}

fn grace(mut pod: Value, seconds: i64) -> Value {
    pod["spec"]["terminationGracePeriodSeconds"] = json!(seconds);
    pod
}

async fn create(server: &FakeApiServer, pod: Value) -> Pod {
    let pods: Api<Pod> = Api::namespaced(server.client(), NS);
    let pod: Pod = serde_json::from_value(pod).unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap()
}

fn get(server: &FakeApiServer, name: &str) -> Pod {
    server
        .get::<Pod>(Some(NS), name)
        .unwrap_or_else(|| panic!("pod {name} is gone"))
}

fn condition(server: &FakeApiServer, name: &str, kind: &str) -> Option<PodCondition> {
    get(server, name)
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == kind)
}

/// The `PodScheduled=False` message of a pod the scheduler could not place.
fn unschedulable(server: &FakeApiServer, name: &str) -> String {
    let c = condition(server, name, "PodScheduled")
        .unwrap_or_else(|| panic!("{name} has no PodScheduled condition"));
    assert_eq!(
        (c.status.as_str(), c.reason.as_deref()),
        ("False", Some("Unschedulable")),
        "{name}: {c:?}"
    );
    c.message.unwrap_or_default()
}

fn nominated(server: &FakeApiServer, name: &str) -> Option<String> {
    get(server, name).status?.nominated_node_name
}

fn terminating(server: &FakeApiServer, name: &str) -> bool {
    server
        .get::<Pod>(Some(NS), name)
        .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
}

fn scheduled_server() -> FakeApiServer {
    let server = FakeApiServer::new();
    server.enable_scheduler();
    server
}

/// A clock for creation and start times that follows tokio's (paused) clock, so that
/// pods created after `tokio::time::advance` started later.
fn follow_tokio_clock(server: &FakeApiServer) {
    let (t0, wall0) = (tokio::time::Instant::now(), Utc::now());
    server.set_clock(move || {
        let elapsed = tokio::time::Instant::now() - t0;
        wall0 + chrono::TimeDelta::from_std(elapsed).unwrap_or_default()
    });
}

#[tokio::test]
async fn without_the_opt_in_pods_stay_unbound_as_before() {
    let server = FakeApiServer::new();
    server.add_node(NodeBuilder::new("n1"));
    create(&server, pod("a")).await;
    assert_eq!(server.pod_node(NS, "a"), None);
    assert!(condition(&server, "a", "PodScheduled").is_none());
    // The explicit pass still works.
    server.schedule_now();
    assert_eq!(server.pod_node(NS, "a").as_deref(), Some("n1"));
}

#[tokio::test]
async fn assigning_pods_to_nodes_node_selector_and_required_node_affinity() {
    let server = scheduled_server();
    server.add_node(NodeBuilder::new("cpu-1"));
    server.add_node(NodeBuilder::new("gpu-a100").label(PRODUCT, "NVIDIA-A100-SXM4-40GB"));
    server.add_node(NodeBuilder::new("gpu-a6000").label(PRODUCT, "NVIDIA-RTX-A6000"));

    create(
        &server,
        select(pod("by-selector"), PRODUCT, "NVIDIA-RTX-A6000"),
    )
    .await;
    assert_eq!(
        server.pod_node(NS, "by-selector").as_deref(),
        Some("gpu-a6000")
    );

    // Terms are ORed: the first matches no node, the second only the A100.
    let mut affine = pod("by-affinity");
    affine["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [
        {"matchExpressions": [{"key": PRODUCT, "operator": "In", "values": ["Tesla-T4"]}]},
        {"matchExpressions": [
            {"key": PRODUCT, "operator": "Exists"},
            {"key": PRODUCT, "operator": "NotIn", "values": ["NVIDIA-RTX-A6000"]}
        ]}
    ]}}});
    create(&server, affine).await;
    assert_eq!(
        server.pod_node(NS, "by-affinity").as_deref(),
        Some("gpu-a100")
    );

    create(&server, select(pod("nowhere"), PRODUCT, "Tesla-T4")).await;
    assert_eq!(server.pod_node(NS, "nowhere"), None);
    assert_eq!(
        unschedulable(&server, "nowhere"),
        "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. \
         preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
    );
    assert_eq!(
        get(&server, "nowhere").status.unwrap().phase.as_deref(),
        Some("Pending")
    );
}

#[tokio::test]
async fn taints_and_cordoned_nodes_filter_before_resources() {
    let server = scheduled_server();
    server.add_node(NodeBuilder::new("cordoned").gpus(1).unschedulable());
    server.add_node(
        NodeBuilder::new("tainted")
            .gpus(1)
            .taint("gpu", "reserved", "NoSchedule"),
    );
    server.add_node(NodeBuilder::new("small").gpus(0));
    create(&server, limits(pod("p"), &[(GPU, "1")])).await;
    assert_eq!(
        unschedulable(&server, "p"),
        "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint {gpu: reserved}, \
         1 node(s) were unschedulable. preemption: 0/3 nodes are available: 1 No preemption victims found for incoming pod, \
         2 Preemption is not helpful for scheduling."
    );
    let mut tolerant = limits(pod("tolerant"), &[(GPU, "1")]);
    tolerant["spec"]["tolerations"] =
        json!([{"key": "gpu", "operator": "Equal", "value": "reserved", "effect": "NoSchedule"}]);
    create(&server, tolerant).await;
    assert_eq!(server.pod_node(NS, "tolerant").as_deref(), Some("tainted"));
}

/// A VRAM budget without a node to hold it: the webhook gives a pod a VRAM budget, but no node
/// advertises `gpu-booking.io/gpumem`, so it stays Pending with kube-scheduler's message;
/// once a node's status advertises it (a node status update), the pod is bound.
#[tokio::test]
async fn issue_11_gpumem_budget_without_an_advertising_node_is_unschedulable_until_a_node_status_advertises_it(
) {
    let server = scheduled_server();
    server.add_node(NodeBuilder::new("cpu-1"));
    server.add_node(
        NodeBuilder::new("gpu-1")
            .gpus(1)
            .label(PRODUCT, "NVIDIA-A100"),
    );
    server.add_node(
        NodeBuilder::new("gpu-2")
            .gpus(1)
            .label(PRODUCT, "NVIDIA-A100"),
    );
    let budgeted = limits(
        select(pod("jupyter-alice"), PRODUCT, "NVIDIA-A100"),
        &[(GPU, "1"), (GPUMEM, "20000")],
    );
    create(&server, budgeted).await;
    assert_eq!(server.pod_node(NS, "jupyter-alice"), None);
    assert_eq!(
        server.unschedulable_reason(NS, "jupyter-alice"),
        Some(unschedulable(&server, "jupyter-alice"))
    );
    assert_eq!(
        unschedulable(&server, "jupyter-alice"),
        "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, \
         2 Insufficient gpu-booking.io/gpumem. preemption: 0/3 nodes are available: \
         1 Preemption is not helpful for scheduling, 2 No preemption victims found for incoming pod."
    );

    // The node agent (or an admin) patches the node's status: now it fits.
    let nodes: Api<Node> = Api::all(server.client());
    nodes
        .patch_status(
            "gpu-2",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocatable": {GPUMEM: "48000"}, "capacity": {GPUMEM: "48000"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        server.pod_node(NS, "jupyter-alice").as_deref(),
        Some("gpu-2")
    );
    let scheduled = condition(&server, "jupyter-alice", "PodScheduled").unwrap();
    assert_eq!(scheduled.status, "True");
    assert_eq!(server.unschedulable_reason(NS, "jupyter-alice"), None);
}

/// "Resource Management for Pods and Containers": an extended resource given only as a
/// limit is requested at that limit, and is never overcommitted.
#[tokio::test]
async fn extended_resource_limit_without_request_counts_as_the_request() {
    let server = scheduled_server();
    server.add_node(
        NodeBuilder::new("gpu-1")
            .gpus(2)
            .allocatable(GPUMEM, "48000"),
    );
    create(&server, limits(pod("a"), &[(GPU, "1"), (GPUMEM, "30000")])).await;
    assert_eq!(server.pod_node(NS, "a").as_deref(), Some("gpu-1"));
    // One GPU is still free, but not 30000 MiB of budget.
    create(&server, limits(pod("b"), &[(GPU, "1"), (GPUMEM, "30000")])).await;
    assert_eq!(server.pod_node(NS, "b"), None);
    assert!(
        unschedulable(&server, "b")
            .starts_with("0/1 nodes are available: 1 Insufficient gpu-booking.io/gpumem."),
        "{}",
        unschedulable(&server, "b")
    );
    create(&server, limits(pod("c"), &[(GPU, "1"), (GPUMEM, "18000")])).await;
    assert_eq!(server.pod_node(NS, "c").as_deref(), Some("gpu-1"));
    // The GPUs are all taken now.
    create(&server, limits(pod("d"), &[(GPU, "1")])).await;
    assert!(unschedulable(&server, "d")
        .starts_with("0/1 nodes are available: 1 Insufficient nvidia.com/gpu."));
    // CPU limits without requests count too (the API server copies the limit).
    create(&server, limits(pod("e"), &[("cpu", "17")])).await;
    assert!(unschedulable(&server, "e").starts_with("0/1 nodes are available: 1 Insufficient cpu."));
}

/// A node takes at most `allocatable.pods` pods (NodeResourcesFit's "Too many pods").
#[tokio::test]
async fn allocatable_pods_caps_how_many_pods_a_node_takes() {
    let server = scheduled_server();
    server.add_node(NodeBuilder::new("tiny").allocatable("pods", "1"));
    create(&server, pod("first")).await;
    create(&server, pod("second")).await;
    assert_eq!(server.pod_node(NS, "first").as_deref(), Some("tiny"));
    assert!(
        unschedulable(&server, "second").starts_with("0/1 nodes are available: 1 Too many pods.")
    );
}

/// The effective request is the larger of the containers' sum and the largest init
/// container ("Resource sharing within containers" in "Init Containers").
#[tokio::test]
async fn init_containers_count_by_their_peak() {
    let server = scheduled_server();
    server.add_node(NodeBuilder::new("n1").allocatable("cpu", "4").gpus(1));
    let mut big_init = requests(pod("big-init"), &[("cpu", "1")]);
    big_init["spec"]["initContainers"] = json!([{"name": "fetch", "image": "busybox", "resources": {"limits": {"cpu": "5", GPU: "1"}}}]);
    create(&server, big_init).await;
    assert!(unschedulable(&server, "big-init")
        .starts_with("0/1 nodes are available: 1 Insufficient cpu."));

    let mut small_init = requests(pod("small-init"), &[("cpu", "1")]);
    small_init["spec"]["initContainers"] = json!([{"name": "fetch", "image": "busybox", "resources": {"limits": {"cpu": "3", GPU: "1"}}}]);
    create(&server, small_init).await;
    assert_eq!(server.pod_node(NS, "small-init").as_deref(), Some("n1"));
    // Its init container's GPU is held: nothing else gets one.
    create(&server, limits(pod("gpu"), &[(GPU, "1")])).await;
    assert!(unschedulable(&server, "gpu").contains("Insufficient nvidia.com/gpu"));
}

/// A pod being deleted still holds its resources until it is gone; then the pending pod
/// is scheduled.
#[tokio::test]
async fn terminating_pods_still_hold_their_resources() {
    let server = scheduled_server();
    server.add_node(NodeBuilder::new("gpu-1").gpus(1));
    create(&server, limits(pod("old"), &[(GPU, "1")])).await;
    let pods: Api<Pod> = Api::namespaced(server.client(), NS);
    pods.delete("old", &DeleteParams::default()).await.unwrap();
    assert!(terminating(&server, "old"));
    create(&server, limits(pod("new"), &[(GPU, "1")])).await;
    assert_eq!(server.pod_node(NS, "new"), None);
    assert!(unschedulable(&server, "new")
        .starts_with("0/1 nodes are available: 1 Insufficient nvidia.com/gpu."));
    assert!(server.pod_gone(NS, "old"));
    assert_eq!(server.pod_node(NS, "new").as_deref(), Some("gpu-1"));
}

/// Finished pods hold nothing (the scheduler ignores Succeeded and Failed pods).
#[tokio::test]
async fn finished_pods_free_their_resources() {
    let server = scheduled_server();
    server.add_node(NodeBuilder::new("gpu-1").gpus(1));
    create(&server, limits(pod("job"), &[(GPU, "1")])).await;
    create(&server, limits(pod("next"), &[(GPU, "1")])).await;
    assert_eq!(server.pod_node(NS, "next"), None);
    server.modify::<Pod>(Some(NS), "job", |p| {
        p["status"]["phase"] = json!("Succeeded")
    });
    assert_eq!(server.pod_node(NS, "next").as_deref(), Some("gpu-1"));
}

/// "Pod Priority and Preemption": the scheduling queue orders pending pods by priority,
/// then by arrival; when room appears the more important pod gets it.
#[tokio::test]
async fn queue_order_is_priority_then_arrival() {
    let server = scheduled_server();
    server.add_node(NodeBuilder::new("gpu-1").gpus(0));
    create(
        &server,
        priority(limits(pod("low-first"), &[(GPU, "1")]), 10, "Never"),
    )
    .await;
    create(
        &server,
        priority(limits(pod("high"), &[(GPU, "1")]), 100, "Never"),
    )
    .await;
    create(
        &server,
        priority(limits(pod("low-second"), &[(GPU, "1")]), 10, "Never"),
    )
    .await;
    server.modify::<Node>(None, "gpu-1", |n| {
        n["status"]["allocatable"][GPU] = json!("1")
    });
    assert_eq!(server.pod_node(NS, "high").as_deref(), Some("gpu-1"));
    assert_eq!(server.pod_node(NS, "low-first"), None);
    server.modify::<Node>(None, "gpu-1", |n| {
        n["status"]["allocatable"][GPU] = json!("2")
    });
    assert_eq!(server.pod_node(NS, "low-first").as_deref(), Some("gpu-1"));
    assert_eq!(server.pod_node(NS, "low-second"), None);
}

/// Two lent pods on one node, as kube-scheduler resolves it: a 2-GPU node runs two lent
/// (low-priority) pods; a booked pod (high priority, PreemptLowerPriority) needs one GPU.
/// Exactly one victim: all lower-priority pods are removed, then the most important is
/// reprieved first (same priority: the one that started earlier), so the newest goes.
/// The victim gets DisruptionTarget/PreemptionByScheduler, then a graceful deletion;
/// the preemptor is nominated, waits (no second round while the victim terminates) and
/// is bound when the grace period is over.
#[tokio::test(start_paused = true)]
async fn preemption_evicts_exactly_one_victim_the_newest_of_equal_priority() {
    let server = scheduled_server();
    server.enable_kubelet();
    follow_tokio_clock(&server);
    server.add_node(NodeBuilder::new("gpu-1").gpus(2));
    create(
        &server,
        grace(
            priority(
                limits(pod("lent-old"), &[(GPU, "1")]),
                0,
                "PreemptLowerPriority",
            ),
            30,
        ),
    )
    .await;
    tokio::time::advance(Duration::from_secs(60)).await;
    create(
        &server,
        grace(
            priority(
                limits(pod("lent-new"), &[(GPU, "1")]),
                0,
                "PreemptLowerPriority",
            ),
            30,
        ),
    )
    .await;
    assert_eq!(
        get(&server, "lent-new").status.unwrap().phase.as_deref(),
        Some("Running")
    );

    create(
        &server,
        priority(
            limits(pod("booked"), &[(GPU, "1")]),
            1000,
            "PreemptLowerPriority",
        ),
    )
    .await;
    assert!(
        terminating(&server, "lent-new"),
        "the newest lent pod is the victim"
    );
    assert!(!terminating(&server, "lent-old"), "exactly one victim");
    let target =
        condition(&server, "lent-new", "DisruptionTarget").expect("DisruptionTarget condition");
    assert_eq!(target.status, "True");
    assert_eq!(target.reason.as_deref(), Some("PreemptionByScheduler"));
    assert_eq!(
        target.message.as_deref(),
        Some("default-scheduler: preempting to accommodate a higher priority pod")
    );
    let victim = get(&server, "lent-new");
    assert_eq!(victim.metadata.deletion_grace_period_seconds, Some(30));
    assert_eq!(nominated(&server, "booked").as_deref(), Some("gpu-1"));
    assert_eq!(
        unschedulable(&server, "booked"),
        "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    );

    // While the victim terminates, other changes come; one that makes the scheduler
    // retry the preemptor (a node update) finds it waiting, not preempting again.
    create(&server, pod("unrelated")).await;
    server.modify::<Node>(None, "gpu-1", |n| {
        n["metadata"]["labels"]["touched"] = json!("yes")
    });
    assert!(!terminating(&server, "lent-old"));
    assert_eq!(nominated(&server, "booked").as_deref(), Some("gpu-1"));
    assert_eq!(
        unschedulable(&server, "booked"),
        "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. \
         preemption: not eligible due to a terminating pod on the nominated node."
    );

    // The grace period passes on the tokio clock: the victim is gone, the booked pod runs.
    tokio::time::advance(Duration::from_secs(29)).await;
    tokio::task::yield_now().await;
    assert!(
        terminating(&server, "lent-new"),
        "still in its grace period"
    );
    server
        .wait_until(|s| s.pod_node(NS, "booked").is_some())
        .await;
    assert!(server.get::<Pod>(Some(NS), "lent-new").is_none());
    assert_eq!(server.pod_node(NS, "booked").as_deref(), Some("gpu-1"));
    assert_eq!(server.pod_node(NS, "lent-old").as_deref(), Some("gpu-1"));
    let booked = get(&server, "booked").status.unwrap();
    assert_eq!(
        booked.nominated_node_name, None,
        "binding clears the nomination"
    );
    assert_eq!(booked.phase.as_deref(), Some("Running"));
}

/// Only strictly lower priority is preempted: a pod of equal priority waits.
#[tokio::test]
async fn equal_priority_is_never_preempted() {
    let server = scheduled_server();
    server.add_node(NodeBuilder::new("gpu-1").gpus(1));
    create(
        &server,
        priority(
            limits(pod("first"), &[(GPU, "1")]),
            1000,
            "PreemptLowerPriority",
        ),
    )
    .await;
    create(
        &server,
        priority(
            limits(pod("second"), &[(GPU, "1")]),
            1000,
            "PreemptLowerPriority",
        ),
    )
    .await;
    assert!(!terminating(&server, "first"));
    assert_eq!(
        unschedulable(&server, "second"),
        "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. \
         preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
    );
    assert_eq!(nominated(&server, "second"), None);
    // And a lower priority one never preempts a higher one.
    create(
        &server,
        priority(
            limits(pod("lower"), &[(GPU, "1")]),
            5,
            "PreemptLowerPriority",
        ),
    )
    .await;
    assert!(!terminating(&server, "first"));
}

/// `preemptionPolicy: Never`: the pod waits in the queue (ahead of lower priorities) and
/// preempts nobody.
#[tokio::test]
async fn preemption_policy_never_waits_without_preempting() {
    let server = scheduled_server();
    server.add_node(NodeBuilder::new("gpu-1").gpus(1));
    create(
        &server,
        priority(
            limits(pod("lent"), &[(GPU, "1")]),
            0,
            "PreemptLowerPriority",
        ),
    )
    .await;
    create(
        &server,
        priority(limits(pod("polite"), &[(GPU, "1")]), 1000, "Never"),
    )
    .await;
    assert!(!terminating(&server, "lent"));
    assert_eq!(
        unschedulable(&server, "polite"),
        "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. \
         preemption: not eligible due to preemptionPolicy=Never."
    );
    assert_eq!(nominated(&server, "polite"), None);
    create(
        &server,
        priority(
            limits(pod("later-low"), &[(GPU, "1")]),
            0,
            "PreemptLowerPriority",
        ),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(server.client(), NS);
    pods.delete("lent", &DeleteParams::default()).await.unwrap();
    server.pod_gone(NS, "lent");
    assert_eq!(server.pod_node(NS, "polite").as_deref(), Some("gpu-1"));
    assert_eq!(server.pod_node(NS, "later-low"), None);
}

/// Victims are on one node, chosen by kube-scheduler's criteria: the node whose
/// highest-priority victim is lowest; a node where even removing every lower-priority
/// pod would not make room is not a candidate.
#[tokio::test]
async fn preemption_picks_one_node_with_the_least_important_victims() {
    let server = scheduled_server();
    server.add_node(NodeBuilder::new("a").gpus(1));
    server.add_node(NodeBuilder::new("b").gpus(1));
    server.add_node(NodeBuilder::new("c").gpus(2));
    let on = |name: &str, node: &str, prio: i32| {
        let mut p = priority(
            limits(pod(name), &[(GPU, "1")]),
            prio,
            "PreemptLowerPriority",
        );
        p["spec"]["nodeName"] = json!(node);
        p
    };
    create(&server, on("mid-a", "a", 500)).await;
    create(&server, on("low-b", "b", 100)).await;
    // On c the least important pod holds no GPU: evicting it would not help.
    let mut low_c = priority(
        requests(pod("low-c"), &[("cpu", "1")]),
        50,
        "PreemptLowerPriority",
    );
    low_c["spec"]["nodeName"] = json!("c");
    create(&server, low_c).await;
    let mut top_c = priority(
        limits(pod("top-c"), &[(GPU, "2")]),
        2000,
        "PreemptLowerPriority",
    );
    top_c["spec"]["nodeName"] = json!("c");
    create(&server, top_c).await;
    create(
        &server,
        priority(
            limits(pod("booked"), &[(GPU, "1")]),
            1000,
            "PreemptLowerPriority",
        ),
    )
    .await;
    assert_eq!(nominated(&server, "booked").as_deref(), Some("b"));
    assert!(terminating(&server, "low-b"));
    for other in ["mid-a", "low-c", "top-c"] {
        assert!(
            !terminating(&server, other),
            "{other} must not be preempted"
        );
    }
}

/// The room a preemption made is kept for the preemptor: while it waits for its last
/// victim, a lower-priority pod that arrives does not take the part already freed (the
/// nominated pod counts on its node, "Pod Priority and Preemption").
#[tokio::test]
async fn room_made_by_preemption_is_kept_for_the_preemptor() {
    let server = scheduled_server();
    server.add_node(NodeBuilder::new("gpu-1").gpus(2));
    create(
        &server,
        priority(
            limits(pod("lent-1"), &[(GPU, "1")]),
            0,
            "PreemptLowerPriority",
        ),
    )
    .await;
    create(
        &server,
        priority(
            limits(pod("lent-2"), &[(GPU, "1")]),
            0,
            "PreemptLowerPriority",
        ),
    )
    .await;
    create(
        &server,
        priority(
            limits(pod("booked"), &[(GPU, "2")]),
            1000,
            "PreemptLowerPriority",
        ),
    )
    .await;
    assert!(terminating(&server, "lent-1") && terminating(&server, "lent-2"));
    assert_eq!(nominated(&server, "booked").as_deref(), Some("gpu-1"));
    server.pod_gone(NS, "lent-1");
    // One GPU is free, but it is the booked pod's.
    create(
        &server,
        priority(
            limits(pod("sneaky"), &[(GPU, "1")]),
            10,
            "PreemptLowerPriority",
        ),
    )
    .await;
    assert_eq!(server.pod_node(NS, "sneaky"), None);
    assert!(unschedulable(&server, "sneaky")
        .starts_with("0/1 nodes are available: 1 Insufficient nvidia.com/gpu."));
    server.pod_gone(NS, "lent-2");
    assert_eq!(server.pod_node(NS, "booked").as_deref(), Some("gpu-1"));
    assert_eq!(server.pod_node(NS, "sneaky"), None);
}

/// "Pod Lifecycle": the kubelet starts a bound pod (Running, startTime, ready
/// containers, Ready), and a graceful deletion ends after the pod's grace period:
/// the delete's `gracePeriodSeconds`, else `terminationGracePeriodSeconds`, else 30 s.
#[tokio::test(start_paused = true)]
async fn kubelet_runs_bound_pods_and_ends_them_after_their_grace_period() {
    let server = scheduled_server();
    server.enable_kubelet();
    server.add_node(NodeBuilder::new("n1"));
    for name in ["default", "spec", "explicit"] {
        let p = if name == "spec" {
            grace(pod(name), 10)
        } else {
            pod(name)
        };
        create(&server, p).await;
    }
    let running = get(&server, "default");
    let status = running.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert!(status.start_time.is_some());
    let ready: Vec<bool> = status
        .container_statuses
        .unwrap()
        .iter()
        .map(|c| c.ready)
        .collect();
    assert_eq!(ready, [true]);
    assert_eq!(
        condition(&server, "default", "Ready").unwrap().status,
        "True"
    );

    let pods: Api<Pod> = Api::namespaced(server.client(), NS);
    pods.delete("default", &DeleteParams::default())
        .await
        .unwrap();
    pods.delete("spec", &DeleteParams::default()).await.unwrap();
    pods.delete("explicit", &DeleteParams::default().grace_period(5))
        .await
        .unwrap();
    let start = tokio::time::Instant::now();
    let mut gone = Vec::new();
    for name in ["explicit", "spec", "default"] {
        server
            .wait_until(|s| s.get::<Pod>(Some(NS), name).is_none())
            .await;
        gone.push((name, (tokio::time::Instant::now() - start).as_secs()));
    }
    assert_eq!(gone, [("explicit", 5), ("spec", 10), ("default", 30)]);
}

/// The explicit hooks still end a terminating pod before its grace period.
#[tokio::test(start_paused = true)]
async fn pod_gone_and_finish_deletions_still_end_pods_early() {
    let server = scheduled_server();
    server.enable_kubelet();
    server.add_node(NodeBuilder::new("gpu-1").gpus(1));
    create(&server, limits(pod("a"), &[(GPU, "1")])).await;
    create(&server, limits(pod("b"), &[(GPU, "1")])).await;
    let pods: Api<Pod> = Api::namespaced(server.client(), NS);
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(server.finish_deletions(), 1);
    assert_eq!(server.pod_node(NS, "b").as_deref(), Some("gpu-1"));
    assert_eq!(
        get(&server, "b").status.unwrap().phase.as_deref(),
        Some("Running")
    );
    // The timer of the pod already gone finds nothing to do.
    tokio::time::advance(Duration::from_secs(31)).await;
    tokio::task::yield_now().await;
    assert!(server.get::<Pod>(Some(NS), "b").is_some());
}

#[tokio::test]
async fn no_nodes_at_all() {
    let server = scheduled_server();
    create(&server, pod("p")).await;
    assert_eq!(
        unschedulable(&server, "p"),
        "no nodes available to schedule pods"
    );
}

#[tokio::test]
async fn unreadable_quantities_leave_the_pod_pending_with_a_reason() {
    let server = scheduled_server();
    server.add_node(NodeBuilder::new("n1"));
    create(&server, requests(pod("p"), &[("cpu", "lots")])).await;
    assert_eq!(server.pod_node(NS, "p"), None);
    assert!(unschedulable(&server, "p").contains("cpu is not a quantity"));
}

/// A spawn storm: 200 GPU pods at once on 4 nodes of 2 GPUs. Every GPU is used exactly
/// once, never twice; the rest wait with the reason.
#[tokio::test]
async fn spawn_storm_never_overcommits_a_gpu() {
    let server = scheduled_server();
    server.enable_kubelet();
    server.keep_request_log(false);
    for n in 0..4 {
        server.add_node(NodeBuilder::new(&format!("gpu-{n}")).gpus(2));
    }
    let creates =
        (0..200).map(|i| create(&server, limits(pod(&format!("nb-{i:03}")), &[(GPU, "1")])));
    futures::future::join_all(creates).await;
    let pods = server.list::<Pod>(Some(NS));
    let mut per_node = std::collections::BTreeMap::<String, usize>::new();
    for p in &pods {
        match p.spec.as_ref().and_then(|s| s.node_name.clone()) {
            Some(node) => *per_node.entry(node).or_default() += 1,
            None => {
                let name = p.metadata.name.as_deref().unwrap_or_default();
                assert!(unschedulable(&server, name)
                    .starts_with("0/4 nodes are available: 4 Insufficient nvidia.com/gpu."));
            }
        }
    }
    let expected: std::collections::BTreeMap<String, usize> =
        (0..4).map(|n| (format!("gpu-{n}"), 2)).collect();
    assert_eq!(per_node, expected);
}

/// An unschedulable pod is retried when its own spec changes (here a toleration is
/// added), not only when nodes or other pods change.
#[tokio::test]
async fn a_pending_pod_given_a_toleration_is_retried() {
    let server = scheduled_server();
    server.add_node(
        NodeBuilder::new("gpu-1")
            .gpus(1)
            .taint("dedicated", "ml", "NoSchedule"),
    );
    create(&server, limits(pod("p"), &[(GPU, "1")])).await;
    assert!(unschedulable(&server, "p").contains("untolerated taint {dedicated: ml}"));
    let pods: Api<Pod> = Api::namespaced(server.client(), NS);
    let toleration = json!({"spec": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}});
    pods.patch("p", &PatchParams::default(), &Patch::Merge(toleration))
        .await
        .unwrap();
    assert_eq!(server.pod_node(NS, "p").as_deref(), Some("gpu-1"));
}

/// Pods for another scheduler (`spec.schedulerName`) are left alone.
#[tokio::test]
async fn pods_of_another_scheduler_are_left_alone() {
    let server = scheduled_server();
    server.add_node(NodeBuilder::new("n1"));
    let mut other = pod("other");
    other["spec"]["schedulerName"] = json!("volcano");
    create(&server, other).await;
    assert_eq!(server.pod_node(NS, "other"), None);
    assert!(condition(&server, "other", "PodScheduled").is_none());
}

fn pod_ip(server: &FakeApiServer, name: &str) -> Option<String> {
    get(server, name).status?.pod_ip
}

/// Each started pod has its own address: the lowest free `127.0.0.N`, one a pod that
/// went no longer holds, or the network plugin's.
#[tokio::test]
async fn started_pods_get_addresses_of_their_own() {
    let server = scheduled_server();
    server.enable_kubelet();
    server.set_pod_network(|pod| {
        (pod["metadata"]["name"] == "plugged").then(|| "127.9.9.9".to_owned())
    });
    server.add_node(NodeBuilder::new("n1"));
    create(&server, pod("a")).await;
    create(&server, pod("b")).await;
    assert_eq!(pod_ip(&server, "a").as_deref(), Some("127.0.0.2"));
    assert_eq!(pod_ip(&server, "b").as_deref(), Some("127.0.0.3"));
    let ips = get(&server, "b").status.unwrap().pod_ips.unwrap();
    assert_eq!(ips[0].ip, "127.0.0.3");
    assert!(server.pod_gone(NS, "a"));
    create(&server, pod("c")).await;
    assert_eq!(
        pod_ip(&server, "c").as_deref(),
        Some("127.0.0.2"),
        "a's address is free again"
    );
    create(&server, pod("plugged")).await;
    assert_eq!(pod_ip(&server, "plugged").as_deref(), Some("127.9.9.9"));
    // Not started, no address.
    create(&server, select(pod("nowhere"), "missing", "label")).await;
    assert_eq!(pod_ip(&server, "nowhere"), None);
}
