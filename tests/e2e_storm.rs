//! End to end, on the simulated lab: a spawn storm. 200 users spawn GPU notebooks
//! as fast as JupyterHub lets them (its default `concurrent_spawn_limit`, 100 at a
//! time) on a lab of 6 cards: every pod is admitted with the webhook's decision, no
//! card is given twice, every notebook ends up running (on a GPU or on CPU) and none
//! waits for a card forever.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use futures::stream::{self, StreamExt};
use gpu_booking_core::admission::PRIORITY_LABEL;
use gpu_booking_sim::spawner::NOTEBOOK_NAMESPACE;
use k8s_openapi::api::core::v1::{Node, Pod};
use sqlx::PgPool;

const USERS: usize = 200;
/// JupyterHub's default `concurrent_spawn_limit`.
const CONCURRENT_SPAWNS: usize = 100;

// Fails today, as it should: the webhook lends from a free count that only the
// controller's usage reports update, so a storm is lent far more cards than exist and
// those pods stay Pending instead of running on CPU (issue 17's live replica of free
// units fixes it). Run with --ignored.
#[ignore = "the webhook's free count lags a spawn storm (issue 17)"]
#[sqlx::test(migrations = "./migrations")]
async fn spawn_storm_of_200_notebooks(pool: PgPool) {
    let lab = Lab::start(pool).await;
    let users: Vec<String> = (0..USERS)
        .map(|i| format!("user{i:03}@example.com"))
        .collect();
    let created = tokio::time::timeout(
        Duration::from_secs(120),
        stream::iter(users.iter().map(|u| lab.sim.spawn(u, 1)))
            .buffer_unordered(CONCURRENT_SPAWNS)
            .collect::<Vec<_>>(),
    )
    .await
    .expect("200 spawns did not complete within 2 minutes");
    let refused: Vec<_> = created.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        refused.is_empty(),
        "{} of {USERS} spawns refused, e.g. {:?}",
        refused.len(),
        refused.first()
    );

    // Every pod was decided by the webhook: none fell through to failurePolicy or
    // to the webhook's booking-error policy.
    let log = lab.sim.server.admission_log();
    let mut failures: BTreeMap<String, usize> = BTreeMap::new();
    for record in &log {
        if let Some(error) = &record.error {
            *failures
                .entry(error.chars().take(160).collect())
                .or_default() += 1;
        }
    }
    let undecided: Vec<String> = lab
        .sim
        .server
        .list::<Pod>(Some(NOTEBOOK_NAMESPACE))
        .into_iter()
        .filter(|p| label(p, PRIORITY_LABEL).is_none() && gpus(p) > 0)
        .filter_map(|p| p.metadata.name)
        .collect();
    assert!(
        undecided.is_empty() && failures.is_empty(),
        "{} of {USERS} GPU pods were admitted without the webhook's decision; failed webhook calls: {failures:#?}; warnings of the first: {:?}",
        undecided.len(),
        undecided.first().map(|n| lab.sim.admission_warnings(n)),
    );

    lab.expect(
        "not every notebook of the storm ended up running: lent pods beyond the free cards wait for a GPU instead of running on CPU",
        |s| {
            let pods = s.list::<Pod>(Some(NOTEBOOK_NAMESPACE));
            pods.len() == USERS && pods.iter().all(is_running)
        },
    )
    .await;

    // No card given twice: per node, the GPUs of its pods stay within what it has.
    let pods = lab.sim.server.list::<Pod>(Some(NOTEBOOK_NAMESPACE));
    let mut held: BTreeMap<String, u64> = BTreeMap::new();
    for pod in &pods {
        if let Some(node) = node_of(pod) {
            *held.entry(node.to_owned()).or_default() += gpus(pod);
        }
    }
    for node in lab.sim.server.list::<Node>(None) {
        let name = node.metadata.name.clone().unwrap();
        let has: u64 = node
            .status
            .and_then(|s| s.allocatable)
            .and_then(|a| a.get("nvidia.com/gpu").map(|q| q.0.parse().unwrap_or(0)))
            .unwrap_or(0);
        let used = held.get(&name).copied().unwrap_or(0);
        assert!(
            used <= has,
            "node {name} has {has} GPUs but {used} were given out"
        );
    }
    let on_gpu = pods.iter().filter(|p| gpus(p) > 0).count();
    assert_eq!(
        on_gpu, 6,
        "every one of the lab's 6 cards should be lent to someone"
    );
    lab.shutdown().await;
}
