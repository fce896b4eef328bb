//! End to end, on the simulated lab: a spawn storm. 200 users spawn GPU notebooks
//! as fast as JupyterHub lets them (its default `concurrent_spawn_limit`, 100 at a
//! time) on a lab of 6 cards: every pod is admitted with the webhook's decision, no
//! card is given twice, every notebook ends up running (on a GPU or on CPU) and none
//! waits for a card forever.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use futures::stream::{self, StreamExt};
use gpu_booking_core::admission::PRIORITY_LABEL;
use gpu_booking_sim::spawner::NOTEBOOK_NAMESPACE;
use gpu_booking_sim::SimCluster;
use k8s_openapi::api::core::v1::{Node, Pod};
use sqlx::PgPool;

/// One storm at a time: each lab is a whole cluster in this process, and three at
/// once on a 2-core machine make the API server's 5 s webhook timeout the thing
/// under test.
static ONE_STORM: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const USERS: usize = 200;
/// JupyterHub's default `concurrent_spawn_limit`.
const CONCURRENT_SPAWNS: usize = 100;

// The webhook's free count comes from the controller's usage reports, which lag a
// storm; its lend ledger subtracts what it admitted since (docs/webhook.md, "Spawn
// storms"), and the controller recreates CPU-only a lent pod left waiting for a GPU.
//
// The webhook decides from its replica of the booking service: no call
// per admission, and its own admission times show it (200 decisions, 0.45 s in all,
// each under 0.1 s, printed below). On the 2-core machine with nothing else running
// the storm takes about 3 s and all 200 pods run after 3.1 s (3 runs of 3). On a machine
// busy with other builds (load 10 to 13) 100 simultaneous new TLS connections to
// the debug-build webhook have outlasted the API server's 5 s webhook timeout for
// some pods: a failure here under such load is that, not a decision.
#[sqlx::test(migrations = "./migrations")]
async fn spawn_storm_of_200_notebooks(pool: PgPool) {
    let _one = ONE_STORM.lock().await;
    let lab = Lab::start(pool).await;
    storm(&lab, "ledger on", USERS, CONCURRENT_SPAWNS).await;
    lab.shutdown().await;
}

/// 40 users, 10 spawns at a time, on 6 cards: fast enough for the booking service
/// here, and far faster than the controller's usage reports (every spawn of the
/// storm reads a free count of 6 without the ledger).
#[sqlx::test(migrations = "./migrations")]
async fn spawn_storm_of_40_notebooks(pool: PgPool) {
    let _one = ONE_STORM.lock().await;
    let lab = Lab::start(pool).await;
    storm(&lab, "ledger on", 40, 10).await;
    lab.shutdown().await;
}

/// The backstop alone: with the webhook's ledger off (`--lend-ttl=0s`), the storm is
/// lent more cards than exist, and the controller turns every lent pod left waiting
/// for a GPU into its CPU-only copy, so the same end state holds.
#[sqlx::test(migrations = "./migrations")]
async fn spawn_storm_without_the_ledger_is_caught_by_the_controller(pool: PgPool) {
    let _one = ONE_STORM.lock().await;
    let lab = Lab::start_with(pool, SimCluster::builder().webhook_arg("--lend-ttl=0s")).await;
    storm(&lab, "ledger off", 40, 10).await;
    lab.shutdown().await;
}

async fn storm(lab: &Lab, what: &str, users: usize, at_once: usize) {
    let started = Instant::now();
    let names: Vec<String> = (0..users)
        .map(|i| format!("user{i:03}@example.com"))
        .collect();
    let created = tokio::time::timeout(
        Duration::from_secs(120),
        stream::iter(names.iter().map(|u| lab.sim.spawn(u, 1)))
            .buffer_unordered(at_once)
            .collect::<Vec<_>>(),
    )
    .await
    .expect("the spawns did not complete within 2 minutes");
    let spawned = started.elapsed();
    // Admitted with a GPU (booked or lent), before anything was recreated.
    let admitted_with_gpu = lab
        .sim
        .server
        .list::<Pod>(Some(NOTEBOOK_NAMESPACE))
        .iter()
        .filter(|p| gpus(p) > 0 && label(p, PRIORITY_LABEL).is_some())
        .count();
    let refused: Vec<_> = created.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        refused.is_empty(),
        "{} of {users} spawns refused, e.g. {:?}",
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
    // What the webhook itself took (its histogram), beside what the API server saw.
    let took: Vec<String> = lab
        .sim
        .webhook_metrics()
        .await
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.starts_with("gpu_booking_webhook_admission_duration_seconds_")
                && !l.contains("no_gpu")
                && !l.ends_with(" 0")
        })
        .map(str::to_owned)
        .collect();
    println!(
        "storm ({what}): the webhook's own admission times:\n{}",
        took.join("\n")
    );
    assert!(
        undecided.is_empty() && failures.is_empty(),
        "{} of {users} GPU pods were admitted without the webhook's decision; failed webhook calls: {failures:#?}; warnings of the first: {:?}",
        undecided.len(),
        undecided.first().map(|n| lab.sim.admission_warnings(n)),
    );

    lab.expect(
        "not every notebook of the storm ended up running: lent pods beyond the free cards wait for a GPU instead of running on CPU",
        |s| {
            let pods = s.list::<Pod>(Some(NOTEBOOK_NAMESPACE));
            pods.len() == users && pods.iter().all(is_running)
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
    if what == "ledger on" {
        assert_eq!(
            on_gpu, 6,
            "every one of the lab's 6 cards should be lent to someone"
        );
    } else {
        // Without the ledger every spawn reads the same stale counts and is lent the
        // model with most free units (a6000): the a100s may stay idle.
        assert!((1..=6).contains(&on_gpu), "{on_gpu} pods on a GPU");
    }
    // The figures of docs/webhook.md (printed, not asserted: they depend on the machine).
    println!(
        "storm ({what}): {users} spawns in {spawned:?}; {admitted_with_gpu} admitted with a GPU \
         ({} beyond the 6 cards); all running after {:?}",
        admitted_with_gpu.saturating_sub(6),
        started.elapsed()
    );
}
