//! End to end, on the simulated lab: pods admitted before the upgrade that moved our
//! labels under `gpu-booking.io/` carry the legacy keys (`gpu-booking/priority`,
//! `/booking`, `/model`). For one release the controller reads them: such a booked
//! pod still ends at its booking's end, and such a lent pod is still preempted for a
//! booked user; what the controller creates in their place carries only the new keys.
//!
//! A pod "from before the upgrade" is made here by renaming the keys the webhook
//! wrote, in the API server's store (as the last release's webhook wrote them).
//!
//! Runs on the real Postgres (`DATABASE_URL`), each test on a fresh database.

use crate::common;

use chrono::TimeDelta;
use common::*;
use gpu_booking_core::admission::{
    GPU_REMOVED_ANNOTATION, LEGACY_LABELS, LEGACY_LABEL_PREFIX, PRIORITY_LABEL,
};

use gpu_booking_sim::spawner::{pod_name, NOTEBOOK_NAMESPACE};
use gpu_booking_sim::{GpuNode, SimCluster};
use k8s_openapi::api::core::v1::Pod;
use sqlx::PgPool;

const ALICE: &str = "alice@example.com";

/// Renames our labels on `user`'s notebook to the legacy keys, as the webhook of the
/// last release wrote them.
fn admitted_before_the_upgrade(lab: &Lab, user: &str) {
    let renamed = lab
        .sim
        .server
        .modify::<Pod>(Some(NOTEBOOK_NAMESPACE), &pod_name(user), |pod| {
            let labels = pod["metadata"]["labels"]
                .as_object_mut()
                .expect("an admitted GPU pod has labels");
            for (current, legacy) in LEGACY_LABELS {
                if let Some(value) = labels.remove(current) {
                    labels.insert(legacy.to_owned(), value);
                }
            }
        });
    assert!(renamed, "{user}'s notebook is not there");
    let pod = lab.notebook(user).unwrap();
    assert_eq!(label(&pod, PRIORITY_LABEL), None);
    assert!(label(&pod, LEGACY_LABELS[0].1).is_some());
}

/// No label or annotation of ours under the legacy prefix, and no priority.
fn only_new_keys(pod: &Pod, what: &str) {
    let legacy: Vec<&String> = [&pod.metadata.labels, &pod.metadata.annotations]
        .into_iter()
        .flatten()
        .flat_map(|map| map.keys())
        .filter(|k| k.starts_with(LEGACY_LABEL_PREFIX))
        .collect();
    assert!(legacy.is_empty(), "{what} carries legacy keys: {legacy:?}");
}

#[sqlx::test(migrations = "./migrations")]
async fn a_booked_pod_from_before_the_upgrade_ends_with_its_booking(pool: PgPool) {
    let lab = Lab::start(pool).await;
    lab.book(ALICE, "a100", TimeDelta::seconds(8)).await;
    lab.sim.spawn(ALICE, 1).await.expect("admitted");
    lab.expect("alice's booked notebook never ran on a GPU", |s| {
        running(s, ALICE).is_some_and(|p| gpus(&p) > 0 && label(&p, PRIORITY_LABEL) == Some("high"))
    })
    .await;
    let uid = lab.notebook(ALICE).unwrap().metadata.uid;
    admitted_before_the_upgrade(&lab, ALICE);
    lab.expect(
        "alice's notebook under the legacy labels did not end at her booking's end and come back CPU-only",
        |s| {
            running(s, ALICE).is_some_and(|p| p.metadata.uid != uid && gpus(&p) == 0)
        },
    )
    .await;
    let copy = lab.notebook(ALICE).unwrap();
    assert!(annotation(&copy, GPU_REMOVED_ANNOTATION).is_some());
    assert_eq!(label(&copy, PRIORITY_LABEL), None);
    only_new_keys(&copy, "the CPU-only copy");
    lab.shutdown().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn a_lent_pod_from_before_the_upgrade_gives_way_to_a_booked_one(pool: PgPool) {
    let lab = Lab::start_with(
        pool,
        SimCluster::builder().nodes(vec![
            GpuNode::gpu("gpu-a100-0", "NVIDIA-A100-SXM4-40GB", 1, 40960),
            GpuNode::cpu_only("cpu-0"),
        ]),
    )
    .await;
    let bob = "bob@example.com";
    let pod = lab.sim.spawn(bob, 1).await.expect("admitted");
    assert_eq!(label(&pod, PRIORITY_LABEL), Some("low"));
    lab.expect("bob's lent notebook never ran on a GPU", |s| {
        running(s, bob).is_some_and(|p| gpus(&p) > 0)
    })
    .await;
    lab.wait_in_use("a100", 1).await;
    let lent_uid = lab.notebook(bob).unwrap().metadata.uid;
    admitted_before_the_upgrade(&lab, bob);

    lab.book(ALICE, "a100", TimeDelta::hours(2)).await;
    let alice = lab.sim.spawn(ALICE, 1).await.expect("admitted");
    assert_eq!(label(&alice, PRIORITY_LABEL), Some("high"));
    lab.expect(
        "alice's booked notebook never got the card bob's lent pod (legacy labels) held",
        |s| running(s, ALICE).is_some_and(|p| gpus(&p) > 0),
    )
    .await;
    lab.expect(
        "bob's lent notebook under the legacy labels did not come back CPU-only",
        |s| running(s, bob).is_some_and(|p| p.metadata.uid != lent_uid && gpus(&p) == 0),
    )
    .await;
    only_new_keys(&lab.notebook(bob).unwrap(), "bob's CPU-only copy");
    lab.shutdown().await;
}
