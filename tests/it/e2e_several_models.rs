//! End to end, on the simulated lab: nodes with cards of several models (seed 001).
//!
//! A model with a resource of its own (`nvidia.com/t4`, a MIG profile's
//! `nvidia.com/mig-3g.20gb`) is that resource, not a node: the webhook moves the
//! notebook's generic GPU request to it and writes no model node selector, so one node
//! serves several models. The controller labels such a node with each model it has.

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
    declare(&pool, "a100", "*A100*", 1, None, 40960).await;
    declare(&pool, "t4", "Tesla T4", 1, Some("nvidia.com/t4"), 15360).await;
    // The chart declares t4 with its resource: the webhook learns it from there.
    let chart = chart(&[
        "models.declared[0].name=t4",
        "models.declared[0].units=1",
        "models.declared[0].patterns[0]=Tesla T4",
        "models.declared[0].gpumemMib=15360",
        "models.declared[0].resource=nvidia.com/t4",
    ]);
    let lab = Lab::start_with(
        pool,
        SimCluster::builder().rendered_chart(chart).nodes(vec![
            GpuNode::gpu("gpu-mixed-0", "NVIDIA-A100-SXM4-40GB", 1, 40960).with_cards(
                "nvidia.com/t4",
                "Tesla-T4",
                1,
                15360,
            ),
            GpuNode::cpu_only("cpu-0"),
        ]),
    )
    .await;
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
