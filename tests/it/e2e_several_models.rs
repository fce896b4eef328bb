//! End to end, on the simulated lab: nodes with cards of several models (seed 001).
//!
//! A model with a resource of its own (`nvidia.com/t4`, a MIG profile's
//! `nvidia.com/mig-3g.20gb`) is that resource, not a node: the webhook moves the
//! notebook's generic GPU request to it and writes no model node selector, so one node
//! serves several models. The controller labels such a node with each model it has,
//! and advertises each such model's VRAM budget apart (`gpu-booking.io/gpumem-<model>`,
//! the resource the webhook writes on the model's pods), so one model's pods cannot
//! take what another model's cards hold.

use crate::common;

use chrono::{TimeDelta, Utc};
use common::*;
use gpu_booking_api::store::models::{self, ModelSpec};
use gpu_booking_core::admission::PRIORITY_LABEL;
use gpu_booking_sim::{GpuNode, SimCluster};
use k8s_openapi::api::core::v1::{Node, Pod};
use sqlx::PgPool;

/// Declares a model as an admin would, before the lab starts (the lab then keeps it).
async fn declare(
    pool: &PgPool,
    name: &str,
    pattern: &str,
    units: i32,
    resource: Option<&str>,
    gpumem_mib: i32,
) {
    let patterns = vec![pattern.to_owned()];
    let spec = ModelSpec {
        name,
        units,
        patterns: &patterns,
        resource,
        gpumem_mib,
        position: None,
    };
    models::upsert(pool, spec, Utc::now())
        .await
        .expect("the model is declared");
}

/// A lab of `node` (A100s on the generic resource, one T4 under `nvidia.com/t4`) and a
/// CPU node, with `a100s` A100 units and the T4's budget `t4_gpumem_mib` declared.
/// The chart declares t4 with its resource: the webhook learns it from there.
async fn a100_and_t4_lab(pool: PgPool, a100s: i32, t4_gpumem_mib: i32, node: GpuNode) -> Lab {
    declare(&pool, "a100", "*A100*", a100s, None, 40960).await;
    declare(
        &pool,
        "t4",
        "Tesla T4",
        1,
        Some("nvidia.com/t4"),
        t4_gpumem_mib,
    )
    .await;
    let budget = format!("models.declared[0].gpumemMib={t4_gpumem_mib}");
    let chart = chart(&[
        "models.declared[0].name=t4",
        "models.declared[0].units=1",
        "models.declared[0].patterns[0]=Tesla T4",
        &budget,
        "models.declared[0].resource=nvidia.com/t4",
    ]);
    Lab::start_with(
        pool,
        SimCluster::builder()
            .rendered_chart(chart)
            .nodes(vec![node, GpuNode::cpu_only("cpu-0")]),
    )
    .await
}

/// The resources a pod asks for, GPU ones only (`nvidia.com/*`).
fn gpu_requests(pod: &Pod) -> Vec<(String, String)> {
    let limits = pod.spec.as_ref().unwrap().containers[0]
        .resources
        .as_ref()
        .and_then(|r| r.limits.clone())
        .unwrap_or_default();
    limits
        .into_iter()
        .filter(|(k, _)| k.starts_with("nvidia.com/"))
        .map(|(k, q)| (k, q.0))
        .collect()
}

fn model_selector(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()?
        .node_selector
        .as_ref()?
        .get("gpu-booking.io/model")
        .cloned()
}

#[sqlx::test(migrations = "./migrations")]
async fn a_node_with_a100_and_t4_cards_runs_a_booked_t4_pod_through_its_resource(pool: PgPool) {
    let node = GpuNode::gpu("gpu-mixed-0", "NVIDIA-A100-SXM4-40GB", 1, 40960).with_cards(
        "nvidia.com/t4",
        "Tesla-T4",
        1,
        15360,
    );
    let lab = a100_and_t4_lab(pool, 1, 15360, node).await;
    lab.book("alice@example.com", "t4", TimeDelta::hours(2))
        .await;
    let pod = lab
        .sim
        .spawn("alice@example.com", 1)
        .await
        .expect("admitted");
    assert_eq!(label(&pod, PRIORITY_LABEL), Some("high"));
    assert_eq!(
        gpu_requests(&pod),
        [("nvidia.com/t4".to_owned(), "1".to_owned())],
        "the generic request did not become the model's resource"
    );
    assert_eq!(
        model_selector(&pod),
        None,
        "a model selector on a resource model"
    );
    lab.expect(
        "alice's booked t4 notebook never ran on the mixed node",
        |s| running(s, "alice@example.com").is_some_and(|p| node_of(&p) == Some("gpu-mixed-0")),
    )
    .await;
    // The node's generic card (a100) is lent through its label, beside it.
    let bob = lab.sim.spawn("bob@example.com", 1).await.expect("admitted");
    assert_eq!(label(&bob, PRIORITY_LABEL), Some("low"));
    assert_eq!(model_selector(&bob).as_deref(), Some("a100"));
    assert_eq!(
        gpu_requests(&bob),
        [("nvidia.com/gpu".to_owned(), "1".to_owned())]
    );
    lab.expect(
        "bob's lent a100 notebook never ran on the mixed node",
        |s| running(s, "bob@example.com").is_some_and(|p| node_of(&p) == Some("gpu-mixed-0")),
    )
    .await;
    // One label per model, and the single model label of its generic cards.
    lab.expect("the mixed node does not carry a label per model", |s| {
        s.get::<Node>(None, "gpu-mixed-0").is_some_and(|n| {
            let labels = n.metadata.labels.unwrap_or_default();
            labels.get("model.gpu-booking.io/a100").map(String::as_str) == Some("true")
                && labels.get("model.gpu-booking.io/t4").map(String::as_str) == Some("true")
                && labels.get("gpu-booking.io/model").map(String::as_str) == Some("a100")
        })
    })
    .await;
    lab.wait_in_use("t4", 1).await;
    lab.wait_in_use("a100", 1).await;
    lab.shutdown().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn two_mig_profiles_on_one_node_are_bookable_and_used(pool: PgPool) {
    declare(
        &pool,
        "mig-small",
        "*MIG-1g.5gb",
        4,
        Some("nvidia.com/mig-1g.5gb"),
        4864,
    )
    .await;
    declare(
        &pool,
        "mig-big",
        "*MIG-3g.20gb",
        1,
        Some("nvidia.com/mig-3g.20gb"),
        19968,
    )
    .await;
    let chart = chart(&[
        "webhook.modelResources.mig-small=nvidia.com/mig-1g.5gb",
        "webhook.modelResources.mig-big=nvidia.com/mig-3g.20gb",
    ]);
    let lab = Lab::start_with(
        pool,
        SimCluster::builder().rendered_chart(chart).nodes(vec![
            GpuNode::gpu("gpu-mig-0", "NVIDIA-A100-SXM4-40GB", 1, 40960)
                .mig("1g.5gb", 4, 4864)
                .with_cards(
                    "nvidia.com/mig-3g.20gb",
                    "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb",
                    1,
                    19968,
                ),
            GpuNode::cpu_only("cpu-0"),
        ]),
    )
    .await;
    lab.book("alice@example.com", "mig-big", TimeDelta::hours(2))
        .await;
    let alice = lab
        .sim
        .spawn("alice@example.com", 1)
        .await
        .expect("admitted");
    assert_eq!(label(&alice, PRIORITY_LABEL), Some("high"));
    assert_eq!(
        gpu_requests(&alice),
        [("nvidia.com/mig-3g.20gb".to_owned(), "1".to_owned())]
    );
    let bob = lab.sim.spawn("bob@example.com", 1).await.expect("admitted");
    assert_eq!(label(&bob, PRIORITY_LABEL), Some("low"));
    assert_eq!(
        gpu_requests(&bob),
        [("nvidia.com/mig-1g.5gb".to_owned(), "1".to_owned())],
        "the unbooked notebook is lent the profile with units free"
    );
    for user in ["alice@example.com", "bob@example.com"] {
        lab.expect(&format!("{user}'s MIG notebook never ran"), |s| {
            running(s, user).is_some_and(|p| node_of(&p) == Some("gpu-mig-0"))
        })
        .await;
    }
    lab.wait_in_use("mig-big", 1).await;
    lab.wait_in_use("mig-small", 1).await;
    lab.shutdown().await;
}

/// Lent pods with the controller's `PreemptedForBooking` Event, by uid.
fn victims(
    server: &gpu_booking_fake_apiserver::FakeApiServer,
) -> std::collections::BTreeSet<String> {
    server
        .list::<k8s_openapi::api::events::v1::Event>(Some("jhub"))
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("PreemptedForBooking"))
        .filter_map(|e| e.regarding.and_then(|r| r.uid))
        .collect()
}

/// The GPU units and VRAM budget (MiB) the bound pods of `node` ask for.
fn bound_on(server: &gpu_booking_fake_apiserver::FakeApiServer, node: &str) -> (u64, u64) {
    let mut units = 0;
    let mut mib = 0;
    for pod in server.list::<Pod>(None) {
        if node_of(&pod) != Some(node) {
            continue;
        }
        let finished = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        if finished {
            continue;
        }
        for c in &pod.spec.as_ref().unwrap().containers {
            let limits = c
                .resources
                .as_ref()
                .and_then(|r| r.limits.clone())
                .unwrap_or_default();
            let n = |k: &str| {
                limits
                    .get(k)
                    .and_then(|q| q.0.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            units += n("nvidia.com/gpu");
            mib += n("gpu-booking.io/gpumem");
        }
    }
    (units, mib)
}

/// Waits until the booking service holds a report of `model` taken after `after`
/// (the controller reports every model every few seconds) and the webhook's
/// replica has read the figures since.
async fn reported_after(lab: &Lab, model: &str, after: chrono::DateTime<Utc>) {
    eventually(|| async {
        let at = lab
            .models()
            .await
            .into_iter()
            .find(|m| m["name"] == model)
            .and_then(|m| {
                m["usage_reported_at"]
                    .as_str()?
                    .parse::<chrono::DateTime<Utc>>()
                    .ok()
            });
        if at.is_some_and(|at| at >= after) {
            return Ok(());
        }
        Err(format!("no report of {model} after {after}"))
    })
    .await;
    lab.webhook_refreshed().await;
}

/// Time-sliced T4s, as in the university bench: a unit is a card, so the webhook
/// lends until every card has a pod on it, which the controller counts from the
/// replicas (13 pods on the 16 replicas of four cards are four cards in use): 3
/// replicas and their budgets stay free. Booked users (one card each) take those
/// first; only the pod beyond them costs a victim, exactly one (a lent pod frees one
/// replica and its budget, which holds the booked pod's).
#[sqlx::test(migrations = "./migrations")]
async fn time_sliced_t4_victims_are_the_booked_pods_beyond_the_room(pool: PgPool) {
    // The university's T4 node: 4 cards time-sliced 4 ways, 16 replicas; a pod's
    // budget a quarter of a card less a little (3,584 MiB of 14,848 per card).
    declare(&pool, "t4", "Tesla T4", 4, None, 3584).await;
    let chart = chart(&["webhook.lendSettle=500ms"]);
    let lab = Lab::start_with(
        pool,
        SimCluster::builder().rendered_chart(chart).nodes(vec![
            GpuNode::gpu("gpu-t4-0", "Tesla-T4", 4, 15360).time_sliced(4),
            GpuNode::cpu_only("cpu-0"),
        ]),
    )
    .await;
    // Unbooked users spawn until the webhook lends no more.
    let mut lent = 0;
    let mut strips_in_a_row = 0;
    let mut i = 0;
    while strips_in_a_row < 3 && i < 40 {
        let user = format!("student{i}@example.com");
        i += 1;
        let admitted = chrono::Utc::now();
        let pod = lab.sim.spawn(&user, 1).await.expect("admitted");
        if label(&pod, PRIORITY_LABEL) == Some("low") {
            lent += 1;
            strips_in_a_row = 0;
            lab.expect(&format!("{user}'s lent notebook never ran"), |s| {
                running(s, &user).is_some_and(|p| on_gpu(&p))
            })
            .await;
        } else {
            strips_in_a_row += 1;
        }
        // A report taken past the webhook's settle time counts the admission; the
        // webhook's replica reads it.
        reported_after(&lab, "t4", admitted + TimeDelta::seconds(1)).await;
    }
    let (units, mib) = bound_on(&lab.sim.server, "gpu-t4-0");
    let room = (16 - units).min((4 * (15360 - 512) - mib) / 3584);
    assert_eq!(
        (lent, units, room),
        (13, 13, 3),
        "lent until every card has a pod: 13 of 16 replicas, room for 3 ({mib} MiB bound)"
    );
    let lent_before: std::collections::BTreeSet<String> = lab
        .sim
        .server
        .list::<Pod>(Some("jhub"))
        .into_iter()
        .filter(|p| label(p, PRIORITY_LABEL) == Some("low") && on_gpu(p))
        .filter_map(|p| p.metadata.uid)
        .collect();
    // Four booked users (one card each) spawn.
    for b in 0..4 {
        lab.book(&format!("booked{b}@example.com"), "t4", TimeDelta::hours(2))
            .await;
    }
    for b in 0..4 {
        let pod = lab
            .sim
            .spawn(&format!("booked{b}@example.com"), 1)
            .await
            .expect("admitted");
        assert_eq!(label(&pod, PRIORITY_LABEL), Some("high"));
    }
    for b in 0..4 {
        let user = format!("booked{b}@example.com");
        lab.expect(&format!("{user}'s booked notebook never ran"), |s| {
            running(s, &user).is_some_and(|p| on_gpu(&p))
        })
        .await;
    }
    let needed = 4u64.saturating_sub(room);
    // The Event is on the lent pod and on its CPU-only copy: the lent ones count.
    let victims = victims(&lab.sim.server).intersection(&lent_before).count() as u64;
    assert_eq!(
        (victims, needed),
        (1, 1),
        "victims against the booked pods beyond the room"
    );
    lab.shutdown().await;
}

/// A booked pod on a MIG device needs exactly one victim: the device is its alone
/// (no co-tenant shares its memory), so no VRAM cushion is asked beside its budget.
/// Both devices' budgets fill the node's advertised VRAM exactly, as the
/// university's do: a cushion would have cost the second lent pod too.
#[sqlx::test(migrations = "./migrations")]
async fn a_booked_pod_on_a_mig_device_costs_one_victim(pool: PgPool) {
    declare(
        &pool,
        "mig-big",
        "*MIG-3g.20gb",
        2,
        Some("nvidia.com/mig-3g.20gb"),
        19968 - 512,
    )
    .await;
    let chart = chart(&[
        "webhook.modelResources.mig-big=nvidia.com/mig-3g.20gb",
        "webhook.lendSettle=500ms",
    ]);
    let lab = Lab::start_with(
        pool,
        SimCluster::builder().rendered_chart(chart).nodes(vec![
            GpuNode::gpu("gpu-mig-0", "NVIDIA-A100-SXM4-40GB", 1, 40960).mig("3g.20gb", 2, 19968),
            GpuNode::cpu_only("cpu-0"),
        ]),
    )
    .await;
    // Bob first: his is the least recently active of the two lent notebooks.
    for (user, in_use) in [("bob@example.com", 1), ("carol@example.com", 2)] {
        let pod = lab.sim.spawn(user, 1).await.expect("admitted");
        assert_eq!(
            label(&pod, PRIORITY_LABEL),
            Some("low"),
            "{user} is lent a device"
        );
        lab.expect(
            &format!("{user}'s lent notebook never ran on a device"),
            |s| running(s, user).is_some_and(|p| on_gpu(&p)),
        )
        .await;
        lab.wait_in_use("mig-big", in_use).await;
        // Past the webhook's settle time, a report counts the admission.
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        lab.wait_in_use("mig-big", in_use).await;
    }
    let node = lab
        .sim
        .server
        .get::<Node>(None, "gpu-mig-0")
        .expect("the node");
    // mig-big has a resource of its own: its budget is its own resource too.
    let allocatable = node.status.and_then(|s| s.allocatable).unwrap_or_default();
    let advertised = allocatable
        .get("gpu-booking.io/gpumem-mig-big")
        .map(|q| q.0.clone());
    assert_eq!(
        advertised.as_deref(),
        Some("38912"),
        "the node advertises its two devices' budgets, nothing spare"
    );
    assert!(!allocatable.contains_key("gpu-booking.io/gpumem"));
    let bob = lab.notebook("bob@example.com").unwrap();
    let carol = lab.notebook("carol@example.com").unwrap();
    lab.book_and_run("alice@example.com", "mig-big").await;
    lab.expect("bob's lent notebook did not come back CPU-only", |s| {
        running(s, "bob@example.com")
            .is_some_and(|p| p.metadata.uid != bob.metadata.uid && gpus(&p) == 0)
    })
    .await;
    let still = lab.notebook("carol@example.com").unwrap();
    assert!(
        still.metadata.uid == carol.metadata.uid && on_gpu(&still),
        "carol's lent notebook was ended too: a cushion asked beside a MIG device's budget"
    );
    // The Event is on the lent pod and on its CPU-only copy: the lent ones count.
    let lent_before = [
        bob.metadata.uid.clone().unwrap(),
        carol.metadata.uid.clone().unwrap(),
    ];
    let ended: Vec<String> = victims(&lab.sim.server)
        .into_iter()
        .filter(|uid| lent_before.contains(uid))
        .collect();
    assert_eq!(
        ended,
        [lent_before[0].clone()],
        "one victim for one booked device"
    );
    lab.shutdown().await;
}

/// What `pod`'s first container asks for of `resource` (its limit).
fn limit(pod: &Pod, resource: &str) -> Option<String> {
    pod.spec.as_ref()?.containers[0]
        .resources
        .as_ref()?
        .limits
        .as_ref()?
        .get(resource)
        .map(|q| q.0.clone())
}

/// `resource` as `node` advertises it (allocatable).
fn allocatable(lab: &Lab, node: &str, resource: &str) -> Option<String> {
    let node = lab.sim.server.get::<Node>(None, node)?;
    let allocatable = node.status?.allocatable?;
    allocatable.get(resource).map(|q| q.0.clone())
}

/// A research job in a namespace the webhook and the controller leave alone, asking
/// for a replica of the T4 and `mib` of its budget, put straight into the cluster.
fn t4_job(lab: &Lab, name: &str, mib: u64) {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "research"},
        "spec": {"containers": [{"name": "train", "image": "train", "resources": {
            "limits": {"nvidia.com/t4": "1", "gpu-booking.io/gpumem-t4": mib.to_string()}}}]}
    }))
    .expect("a pod");
    lab.sim.server.put(&pod);
}

/// Why `pod` is not scheduled, if it is not.
fn unschedulable(lab: &Lab, namespace: &str, name: &str) -> Option<String> {
    let pod = lab.sim.server.get::<Pod>(Some(namespace), name)?;
    if node_of(&pod).is_some() {
        return None;
    }
    pod.status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .and_then(|c| c.message)
}

/// Two A100s on the generic resource and a T4 time-sliced four ways under its own:
/// the node advertises each model's budget apart, a T4 notebook's budget is the
/// T4's, and T4 pods together get no more than the T4's memory however idle the
/// A100s are (on one budget per node, 2 x 40,448 + 14,848 MiB, four of them would fit).
#[sqlx::test(migrations = "./migrations")]
async fn t4_pods_share_the_t4s_budget_not_the_a100s(pool: PgPool) {
    let node = GpuNode::gpu("gpu-mixed-0", "NVIDIA-A100-SXM4-40GB", 2, 40960).with_shared_cards(
        "nvidia.com/t4",
        "Tesla-T4",
        1,
        15360,
        4,
    );
    let lab = a100_and_t4_lab(pool, 2, 8000, node).await;
    // Each model's budget: the A100s' under the plain resource, the T4's apart
    // (less the chart's 512 MiB reserve per card).
    lab.expect(
        "the mixed node does not advertise a budget per model",
        |s| {
            let node = s.get::<Node>(None, "gpu-mixed-0");
            let alloc = node
                .and_then(|n| n.status)
                .and_then(|s| s.allocatable)
                .unwrap_or_default();
            let get = |r: &str| alloc.get(r).map(|q| q.0.as_str());
            get("gpu-booking.io/gpumem") == Some("80896")
                && get("gpu-booking.io/gpumem-t4") == Some("14848")
        },
    )
    .await;
    lab.book("alice@example.com", "t4", TimeDelta::hours(2))
        .await;
    let alice = lab
        .sim
        .spawn("alice@example.com", 1)
        .await
        .expect("admitted");
    assert_eq!(label(&alice, PRIORITY_LABEL), Some("high"));
    assert_eq!(limit(&alice, "nvidia.com/t4").as_deref(), Some("1"));
    assert_eq!(
        limit(&alice, "gpu-booking.io/gpumem-t4").as_deref(),
        Some("8000"),
        "the T4 notebook's budget is not the T4's own"
    );
    assert_eq!(limit(&alice, "gpu-booking.io/gpumem"), None);
    lab.expect(
        "alice's booked t4 notebook never ran on the mixed node",
        |s| running(s, "alice@example.com").is_some_and(|p| node_of(&p) == Some("gpu-mixed-0")),
    )
    .await;
    // A second T4 pod of 8,000 MiB: three replicas are free, and 80,896 MiB of the
    // A100s' budget, but only 6,848 of the T4's.
    t4_job(&lab, "big", 8000);
    lab.expect(
        "the second T4 pod was not refused for the T4's budget",
        |_| {
            unschedulable(&lab, "research", "big")
                .is_some_and(|m| m.contains("Insufficient gpu-booking.io/gpumem-t4"))
        },
    )
    .await;
    assert_eq!(
        allocatable(&lab, "gpu-mixed-0", "gpu-booking.io/gpumem").as_deref(),
        Some("80896"),
        "the A100s' budget is all there, idle"
    );
    // One that fits in what the T4 has left runs beside alice's.
    t4_job(&lab, "small", 6000);
    lab.expect("a T4 pod within the T4's budget was not scheduled", |s| {
        s.get::<Pod>(Some("research"), "small")
            .is_some_and(|p| node_of(&p) == Some("gpu-mixed-0"))
    })
    .await;
    assert!(
        unschedulable(&lab, "research", "big").is_some(),
        "T4 pods took more than the T4's memory"
    );
    lab.shutdown().await;
}
