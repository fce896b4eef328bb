//! The demo's simulated lab cluster: the fake API server scheduling and admitting as
//! Kubernetes does, the lab's GPU nodes (2 x A100 on one node, 2 x 2 RTX A6000, a CPU
//! node), the real webhook and the real controller, all from `gpu-booking-sim`, and
//! the routes of the booking page's cluster view (`/demo/...`).

use std::sync::Arc;

use gpu_booking_sim::models::{declare, DEMO_MODELS};
use gpu_booking_sim::{lab, BookingService, SimCluster};
use sqlx::PgPool;

use crate::demo::DemoArgs;

/// Grace period of the demo's notebooks: long enough to see a pod terminating in the
/// cluster view, short enough not to wait for it.
const NOTEBOOK_GRACE_SECONDS: i64 = 5;

/// Declares the lab's models (if the database has none) and starts the cluster, its
/// webhook and its controller against the booking API at `booking_url`.
pub async fn start(
    args: &DemoArgs,
    pool: &PgPool,
    booking_url: String,
    service_token: String,
) -> anyhow::Result<Arc<SimCluster>> {
    let nodes = lab::demo_lab();
    declare(pool, &DEMO_MODELS, &nodes).await?;
    let sim = SimCluster::builder()
        .nodes(nodes)
        .webhook_listen(args.webhook_listen)
        .webhook_admin_listen(args.webhook_admin_listen)
        .cert_dir(args.cert_dir.clone())
        .notebook_grace_period(NOTEBOOK_GRACE_SECONDS)
        // The "stripped" sample asks for the a100 by its own resource name.
        .webhook_arg(format!(
            "--model-resource=a100={}",
            crate::demo::A100_RESOURCE
        ))
        .start(BookingService {
            url: booking_url,
            service_token,
        })
        .await?;
    Ok(Arc::new(sim))
}

/// The cluster view's routes, merged into the API's router.
pub fn routes(sim: Arc<SimCluster>) -> axum::Router {
    gpu_booking_sim::routes::router(sim)
}
