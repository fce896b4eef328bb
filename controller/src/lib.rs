//! `gpu-booking controller`: the enforcement half of gpu-booking.
//!
//! - **Expiry**: a timer per booked pod (`gpu-booking.io/priority=high` with a
//!   `terminate-at`), fired within milliseconds of that time (pods that expired while
//!   the controller was down fire at once); `--on-expiry` recreates the pod CPU-only
//!   (default), deletes it, or demotes it to low priority.
//! - **Preemption**: decided from the cluster's state only. For booked pods the
//!   scheduler cannot place, the lent pods that core's eviction order picks (least
//!   recently GPU-active first, sparing those that may coexist) are treated like an
//!   expiry; bounded rounds, no second victim while one terminates. Pods of ours that
//!   kube-scheduler preempts are recreated CPU-only too.
//! - **Inventory**: cards per model from the nodes, cards in use from the pods, pushed
//!   to the booking service on change beside the declared units; each GPU node
//!   labelled with its model and advertising its VRAM budget ([`node_capacity`]).
//! - **Booking changes** ([`follow`]): the leader follows the booking service's
//!   change stream and re-times the pods of a booking whose end moved, or ends them
//!   when it was cancelled or ended early (through the expiry path), within seconds.
//! - **Leader election** with a Lease; Events, audit rows, metrics, `--dry-run`.
//!
//! Modules: [`config`] (options), [`event_loop`] (the loop, routing events to the parts that own the state),
//! [`actions`] (one action on one pod), [`recreate`] (the CPU-only copy),
//! [`intent`] (two-step actions recorded so that the next leader finishes them),
//! [`hub`] (JupyterHub's API for `--on-expiry hub-restart`),
//! [`inventory`] and [`victims`] (pure decisions), [`pods`] (what is kept of a pod),
//! [`notebooks`] (every user's running notebooks, for their page),
//! [`offers`] (GPUs offered back to users on CPU),
//! [`stripped_events`] (the Warning a notebook stripped at admission shows in the hub),
//! [`leader`], [`booking`], [`metrics`], [`clock`]; [`cleanup`] (`gpu-booking
//! cleanup-nodes`, what it wrote on nodes removed at uninstall).
#![forbid(unsafe_code)]

pub mod actions;
pub mod booking;
pub mod booking_units;
pub mod cleanup;
pub mod clock;
pub mod config;
pub mod event_loop;
pub mod follow;
pub mod hub;
pub mod intent;
pub mod inventory;
pub mod leader;
pub mod live_config;
pub mod metrics;
pub mod node_capacity;
pub mod notebooks;
pub mod offers;
pub mod pods;
pub mod recreate;
pub mod stripped_events;
pub mod victims;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context;
use gpu_booking_client::BookingClient;
use gpu_booking_process::shutdown_signal;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::events::{Recorder, Reporter};
use tokio::task::JoinHandle;

pub use booking::Booking;
pub use clock::{Clock, SharedClock, SystemClock, TokioClock};
pub use config::{ControllerArgs, OnExpiry};
pub use metrics::Metrics;

/// A running controller (its loop and its part in the election). Dropping it stops
/// both; actions already started finish on their own tasks.
pub struct Controller {
    pub metrics: Arc<Metrics>,
    pub ready: Arc<AtomicBool>,
    pub leadership: Arc<leader::Leadership>,
    task: JoinHandle<()>,
    /// Ends the actions in flight too ([`Controller::kill`]).
    halt: tokio_util::sync::CancellationToken,
}

impl Controller {
    /// Starts the controller on `client` and `booking`, with time from `clock`.
    pub fn start(
        client: kube::Client,
        booking: Arc<dyn Booking>,
        clock: SharedClock,
        args: &ControllerArgs,
    ) -> anyhow::Result<Self> {
        let cfg = args.admission_config()?;
        let hub = args.hub()?.map(Arc::new);
        let metrics = Arc::new(Metrics::new());
        let identity = args.identity();
        let leadership = if args.leader_elect {
            leader::Leadership::follower(metrics.clone())
        } else {
            leader::Leadership::always(metrics.clone())
        };
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "gpu-booking-controller".into(),
                instance: Some(identity.clone()),
            },
        );
        let ctx = Arc::new(actions::Ctx {
            client: client.clone(),
            booking,
            recorder,
            metrics: metrics.clone(),
            leadership: leadership.clone(),
            clock: clock.clone(),
            cfg: live_config::LiveConfig::new(cfg),
            on_expiry: args.on_expiry,
            dry_run: args.dry_run,
            gone: actions::GoneSignals::default(),
            gone_timeout: args.gone_timeout,
            hub,
            intent_namespace: args.lease_namespace.clone(),
            policy: args.preemption_policy(),
            halt: tokio_util::sync::CancellationToken::new(),
        });
        if let Some(hub) = ctx.hub.clone() {
            ctx.metrics.hub_usable.set(1);
            tokio::spawn(check_hub_token(ctx.clone(), hub));
        }
        let halt = ctx.halt.clone();
        let ready = Arc::new(AtomicBool::new(false));
        let main = event_loop::Loop::new(ctx, args.clone(), ready.clone());
        let election = args.leader_elect.then(|| {
            let api: Api<Lease> = Api::namespaced(client, &args.lease_namespace);
            let cfg = leader::LeaseConfig {
                name: args.lease_name.clone(),
                identity,
                duration: args.lease_duration,
                renew: args.lease_renew,
            };
            leader::run(api, cfg, clock, leadership.clone())
        });
        let task = tokio::spawn(async move {
            match election {
                Some(election) => {
                    tokio::select! {
                        _ = election => {}
                        _ = main.run() => {}
                    }
                }
                None => main.run().await,
            }
        });
        Ok(Self {
            metrics,
            ready,
            leadership,
            task,
            halt,
        })
    }

    /// Stops the loop and the election at once.
    pub fn stop(&self) {
        self.task.abort();
    }

    /// Stops everything at once, the actions in flight included, wherever they are
    /// (between a delete and its re-create too), without giving up the Lease: what
    /// SIGKILL does to the process. Tests use it to show that the next leader finishes
    /// what this one started ([`intent`]).
    pub fn kill(&self) {
        self.halt.cancel();
        self.task.abort();
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Runs the controller until SIGTERM or Ctrl-C: in-cluster (or kubeconfig)
/// credentials, the booking service at `--booking-url`, health and metrics on
/// `--admin-listen`.
pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    args.log.init();
    args.admission_config()?;
    let token = args.booking.token_source()?;
    let booking = BookingClient::new(
        args.booking.required_url()?,
        token,
        args.booking.booking_timeout,
        concat!("gpu-booking-controller/", env!("CARGO_PKG_VERSION")),
    )?;
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster or kubeconfig)")?;
    let admin = args.admin.bind().await?;
    let controller = Controller::start(client, Arc::new(booking), Arc::new(SystemClock), &args)?;
    let router = metrics::admin_router(controller.metrics.clone(), controller.ready.clone());
    tracing::info!(
        admin = %args.admin.admin_listen,
        booking_url = %args.booking.url().unwrap_or_default(),
        on_expiry = ?args.on_expiry,
        dry_run = args.dry_run,
        identity = %args.identity(),
        "controller running"
    );
    tokio::select! {
        served = axum::serve(admin, router) => served.context("admin server")?,
        _ = shutdown_signal() => tracing::info!("shutting down"),
    }
    controller.stop();
    Ok(())
}

/// Asks JupyterHub at start whether the token may restart servers: one that may not
/// would leave booked pods on their GPUs past their bookings, so restarts fall back to
/// CPU-only copies at once (and the critical alert fires) rather than after a 403 per
/// pod. A hub that cannot be asked now is asked again by the first restart.
async fn check_hub_token(ctx: Arc<actions::Ctx>, hub: Arc<hub::Hub>) {
    match hub.may_restart_servers().await {
        Ok(Some(true)) | Ok(None) => {}
        Ok(Some(false)) => actions::refused(&ctx, &hub),
        Err(e) => tracing::warn!(error = %e, "could not read the JupyterHub token's scopes"),
    }
}
