//! The demo's simulated lab cluster: the fake API server scheduling and admitting as
//! Kubernetes does, the lab's GPU nodes (2 x A100 on one node, 2 x 2 RTX A6000, a CPU
//! node), the real webhook, the real controller and a node agent per GPU node, all
//! from `gpu-booking-sim`, the seeded notebooks, and the routes of the booking page's
//! cluster view (`/demo/...`).

use std::sync::Arc;
use std::time::Duration;

use gpu_booking_api::store::models::Model;
use gpu_booking_sim::models::{declare, LabModel, DEMO_MODELS};
use gpu_booking_sim::{lab, scenes, BookingService, GpuNode, SimBuilder, SimCluster};
use sqlx::PgPool;

use crate::demo_args::DemoArgs;

/// Grace period of the demo's notebooks: long enough to see a pod terminating in the
/// cluster view, short enough not to wait for it.
const NOTEBOOK_GRACE_SECONDS: i64 = 5;
/// The node agents' idle window in the demo: a kernel left idle this long has its GPU
/// process reclaimed (the PRD's default is 30 minutes; a demo is watched for minutes).
const IDLE_MINUTES: u32 = 2;
/// ... and its warning before the reclaim (the agent's default is 5 minutes).
const RECLAIM_WARNING_MINUTES: i64 = 1;
/// The warning a lent notebook's user gets before its GPU is taken back for a booked
/// user (the controller's default is 2 minutes): long enough to see the mark on the
/// pod, short enough to watch the booked pod start.
const PREEMPTION_GRACE_SECONDS: u64 = 10;

/// The users of the demo's seeded notebooks, in spawn order: those lent the two a100s
/// stay (the "stripped" sample finds both in use, and zoë, booked, takes one back when
/// she spawns); the others are stopped again ([`seed_notebooks`]).
/// With the webhook lending the model with the most free units, the third and the
/// fifth land on the a100s.
const SEED_USERS: [&str; 6] = [
    "frank@uni.example",
    "grace@uni.example",
    "dave@uni.example",
    "heidi@uni.example",
    "erin@uni.example",
    "ivan@uni.example",
];

/// The a100s' own resource (the device plugin's renaming, seed 001), which the
/// "stripped" sample asks for: the a100 is that resource, not a node label.
const A100_RESOURCE: &str = "nvidia.com/a100";

/// The demo's models: the lab's, the a100 under its own resource.
const MODELS: [LabModel; 2] = [
    LabModel {
        resource: Some(A100_RESOURCE),
        ..DEMO_MODELS[0]
    },
    DEMO_MODELS[1],
];

/// The lab's nodes, with the a100 node's cards under their own resource.
fn nodes() -> Vec<GpuNode> {
    lab::demo_lab()
        .into_iter()
        .map(|node| match node.product.as_deref() {
            Some(product) if node.name == "gpu-a100-0" => GpuNode::gpu(
                &node.name,
                product,
                0,
                node.memory_mib,
            )
            .with_cards(A100_RESOURCE, product, node.gpus, node.memory_mib),
            _ => node,
        })
        .collect()
}

/// The demo's lab, not started yet: the API's authenticator verifies the lab's
/// ServiceAccount tokens with its [`SimBuilder::service_accounts`] first.
pub fn builder(args: &DemoArgs) -> SimBuilder {
    SimCluster::builder()
        .nodes(nodes())
        .webhook_listen(args.webhook_listen)
        .webhook_admin_listen(args.webhook_admin_listen)
        .apiserver_listen(args.apiserver_listen)
        .cert_dir(args.cert_dir.clone())
        .notebook_grace_period(NOTEBOOK_GRACE_SECONDS)
        .agent(|cfg| {
            cfg.policy.idle.idle_minutes = IDLE_MINUTES;
            cfg.reclaim_warning = chrono::TimeDelta::minutes(RECLAIM_WARNING_MINUTES);
        })
        .webhook_arg(format!("--model-resource=a100={}", A100_RESOURCE))
        .controller(|args| {
            args.preemption_grace = Duration::from_secs(PREEMPTION_GRACE_SECONDS);
        })
}

/// Declares the lab's models (if the database has none) and starts the cluster, its
/// webhook, its controller and its agents against the booking API at `booking_url`.
pub async fn start(
    lab: SimBuilder,
    pool: &PgPool,
    booking_url: String,
) -> anyhow::Result<Arc<SimCluster>> {
    declare(pool, &MODELS, lab.lab_nodes()).await?;
    let sim = lab.start(BookingService { url: booking_url }).await?;
    Ok(Arc::new(sim))
}

/// The demo's scene, played once the seeded notebooks hold both a100s (the end of
/// [`seed_notebooks`]): judy books one for
/// a few minutes and spawns: a lent notebook is marked and ends after the grace,
/// comes back on CPU wanting its GPU, and is offered the card when judy's booking
/// ends ([`scenes::booking_ends`]).
fn scene() -> scenes::BookingEnds {
    scenes::BookingEnds {
        user: SCENE_USER.into(),
        model: "a100".into(),
        length: chrono::TimeDelta::seconds(SCENE_BOOKING_SECONDS),
        wait: SEED_WAIT,
    }
}

/// The user of the demo's scene, who books an a100 for [`SCENE_BOOKING_SECONDS`].
pub const SCENE_USER: &str = "judy@uni.example";
/// Long enough to watch the grace count down and the booked notebook run, short
/// enough to see the offer that follows.
const SCENE_BOOKING_SECONDS: i64 = 90;

/// The cluster view's routes, merged into the API's router.
pub fn routes(sim: Arc<SimCluster>) -> axum::Router {
    gpu_booking_sim::routes::router(sim)
}

/// How long the demo waits for its seeded notebooks before it goes on without them.
const SEED_WAIT: Duration = Duration::from_secs(30);

/// The seeded notebooks: lent notebooks on both a100s (nobody holds a booking for
/// them), so that the "stripped" sample review finds no a100 free while zoë's booked
/// one still gets an a100 (a lent one is taken back when she spawns). The webhook
/// lends the model with the most free units (the first by name among equals), so
/// notebooks are spawned one at a time, each once the booking service counts the one
/// before, until the a100s are full; those that were lent an a6000 on the way are
/// stopped again. Says so when the a100s do not fill up.
pub async fn seed_notebooks(sim: &SimCluster, pool: &PgPool, play_scene: bool) {
    if let Err(e) = sim.controller_ready(SEED_WAIT).await {
        tracing::warn!(error = %e, "the simulated lab is not ready; no seeded notebooks");
        return;
    }
    let a100_full = |models: &[Model]| {
        models
            .iter()
            .any(|m| m.name == "a100" && m.in_use >= m.units)
    };
    let mut held = 0;
    let mut elsewhere = Vec::new();
    let mut spawned_at = None;
    for user in SEED_USERS {
        let models = match counted(pool, held, spawned_at).await {
            Some(models) => models,
            None => break,
        };
        if a100_full(&models) {
            break;
        }
        spawned_at = Some(chrono::Utc::now());
        if let Err(e) = sim.spawn(user, 1).await {
            tracing::warn!(user, error = %e, "the seeded notebook was refused");
            break;
        }
        held += 1;
        let bound = sim
            .wait_until(SEED_WAIT, |_| node_of(sim, user).is_some())
            .await;
        if !bound {
            break;
        }
        if node_of(sim, user).is_some_and(|n| !n.starts_with("gpu-a100")) {
            elsewhere.push(user);
        }
    }
    let full = counted(pool, held, spawned_at)
        .await
        .is_some_and(|m| a100_full(&m));
    for user in elsewhere {
        let _ = sim.stop_notebook(user).await;
    }
    if !full {
        tracing::warn!(
            "the seeded notebooks do not hold both a100s: the \"stripped\" sample review is lent one instead"
        );
        return;
    }
    if !play_scene {
        return;
    }
    if let Err(e) = scenes::booking_ends(sim, pool, &scene()).await {
        tracing::warn!(error = %e, "the demo's scene (a booking that ends) was not played");
    }
}

/// The webhook's `--lend-settle` (its default, which the demo keeps) and a margin:
/// a usage report received this long after an admission counts it, and the webhook's
/// lend ledger then stops subtracting it.
const LEND_SETTLE: chrono::TimeDelta = chrono::TimeDelta::milliseconds(3_500);

/// The lab's models once the booking service counts `held` units in use (the
/// controller's report lags the cluster) in reports the webhook trusts over its lend
/// ledger (received `LEND_SETTLE` after the last spawn; else the next spawn would be
/// counted twice and stripped); `None` when that does not happen within the wait.
async fn counted(
    pool: &PgPool,
    held: i32,
    spawned_at: Option<chrono::DateTime<chrono::Utc>>,
) -> Option<Vec<Model>> {
    let deadline = tokio::time::Instant::now() + SEED_WAIT;
    let settled = |m: &Model| match (spawned_at, m.usage_reported_at) {
        (None, _) => true,
        (Some(at), Some(report)) => report >= at + LEND_SETTLE,
        (Some(_), None) => false,
    };
    loop {
        if let Ok(models) = gpu_booking_api::store::models::list(pool).await {
            if models.iter().map(|m| m.in_use).sum::<i32>() >= held && models.iter().all(settled) {
                return Some(models);
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        // The booking service has no change feed: poll it.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The node `user`'s notebook is bound to.
fn node_of(sim: &SimCluster, user: &str) -> Option<String> {
    sim.notebook(user)?.spec?.node_name
}
