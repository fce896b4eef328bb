//! The demo's scripted scene, played once the lab's lent notebooks hold every card of
//! a model: a short booking starts and its user spawns, so that a lent notebook is
//! marked to give way (its grace deadline counts down in the cluster view and on its
//! user's notebook card) and comes back on CPU, waiting for a GPU; when the booking
//! ends its card is offered back to that user.

use std::time::Duration;

use chrono::{TimeDelta, Utc};
use gpu_booking_api::store::bookings::{self, NewBooking};
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::username::Username;
use sqlx::PgPool;

use crate::view::ClusterView;
use crate::SimCluster;

/// Who books, what, and for how long.
#[derive(Debug, Clone)]
pub struct BookingEnds {
    pub user: String,
    pub model: String,
    /// The booking's length from the moment it is made: short, so that the offer
    /// comes while someone watches (made past the policy's minimum, as an admin may).
    pub length: TimeDelta,
    /// How long to wait for the lent notebooks to fill the model's cards first.
    pub wait: Duration,
}

/// Whether every unit of `model`'s nodes is held by a lent pod still running, and
/// no pod is ending (the lab has settled).
fn all_lent(view: &ClusterView, model: &str) -> bool {
    let ending = view
        .nodes
        .iter()
        .flat_map(|n| n.pods.iter())
        .chain(view.cpu.iter())
        .any(|p| p.terminating);
    let nodes: Vec<_> = view
        .nodes
        .iter()
        .filter(|n| n.model.as_deref() == Some(model))
        .collect();
    !ending
        && !nodes.is_empty()
        && nodes.iter().all(|n| {
            n.units.iter().all(Option::is_some)
                && n.pods.iter().all(|p| p.kind == "lent" && !p.terminating)
        })
}

/// Plays the scene: waits until lent notebooks hold every card of the model (and
/// nothing is ending), books one for the user from now on and, once the webhook
/// knows the booking, spawns their notebook as JupyterHub would.
/// The controller does the rest (the grace, the CPU copy, the offer at the end).
pub async fn booking_ends(
    sim: &SimCluster,
    pool: &PgPool,
    scene: &BookingEnds,
) -> anyhow::Result<()> {
    let full = sim
        .wait_until(scene.wait, |server| {
            all_lent(&ClusterView::of(server), &scene.model)
        })
        .await;
    anyhow::ensure!(
        full,
        "the lent notebooks never held every {} card",
        scene.model
    );
    let user = Username::parse(&scene.user)?;
    let now = Utc::now();
    let booking = NewBooking {
        user: &user,
        model: &scene.model,
        units: 1,
        start: now,
        end: now + scene.length,
        override_rules: true,
        created_by: "demo",
    };
    let made = bookings::create(pool, &Policy::default(), now, booking).await?;
    if let Some(replica) = sim.webhook_replica().await {
        let deadline = tokio::time::Instant::now() + scene.wait;
        while replica.booking(made.id).is_none() {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the webhook never learnt of booking {}",
                made.id
            );
            // The replica has no change notification: poll it.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    sim.spawn(user.as_str(), 1).await?;
    Ok(())
}
