//! `gpu-booking webhook`: the mutating admission webhook.
//!
//! For every pod creation the API server sends, it decides with
//! [`gpu_booking_core::admission`] whether the pod is a GPU pod, whose it is, what the
//! booking service says about its owner, and answers with the one JSON Patch that
//! carries out the decision. I/O lives here; every decision lives in `core`.
//!
//! - [`WebhookArgs`] and [`run`]: what the binary calls.
//! - [`WebhookServer`]: the same pieces for starting in-process (demo, tests).
//! - [`router`]: `POST /mutate` without TLS, for `tower::ServiceExt::oneshot`.
#![forbid(unsafe_code)]

pub mod admit;
pub mod booking_source;
pub mod config;
pub mod error;
pub mod metrics;
pub mod replica;
pub mod review;
pub mod server;
pub mod tls;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use gpu_booking_core::admission::LendLedger;
pub use gpu_booking_process::init_logging;
use gpu_booking_process::shutdown_signal;
use tokio::net::TcpListener;

pub use admit::Webhook;
pub use booking_source::{BookingSource, TokenSource};
pub use config::{DecideFrom, LogFormat, OnBookingError, Unidentified, WebhookArgs};
pub use error::BookingError;
pub use metrics::Metrics;
pub use replica::{ReplicaHandle, ReplicaOptions};
pub use review::{ReviewOut, StatusOut};
pub use server::{admin_router, router, serve_plain, serve_tls, WebhookLimits, MAX_BODY_BYTES};
pub use tls::{CertStore, ClientAuth};

/// Longest wait, at shutdown, for the queued audit reports to be sent.
const AUDIT_FLUSH: std::time::Duration = std::time::Duration::from_secs(5);

/// Everything [`run`] builds from the options, before any socket is bound.
pub struct WebhookServer {
    pub webhook: Arc<Webhook>,
    pub certs: Arc<CertStore>,
    pub metrics: Arc<Metrics>,
    pub ready: Arc<AtomicBool>,
    /// Timeouts and limits of the HTTPS port.
    pub limits: WebhookLimits,
}

impl WebhookServer {
    /// Checks the options, loads the certificate and the token, builds the client;
    /// with `--decide-from replica` (the default) also starts the replica's tasks,
    /// so it must be called within a Tokio runtime.
    pub fn from_args(args: &WebhookArgs) -> anyhow::Result<Self> {
        let cfg = args.admission_config()?;
        let metrics = Arc::new(Metrics::new());
        let token = args.booking.token_source()?;
        let mut booking = BookingSource::new(
            args.booking.required_url()?,
            token,
            args.booking.booking_timeout,
            args.cache_ttl,
            metrics.clone(),
        )?
        .with_audit_rate(args.audit_burst, args.audit_per_second);
        if args.decide_from == DecideFrom::Replica {
            anyhow::ensure!(
                tokio::runtime::Handle::try_current().is_ok(),
                "the webhook's replica starts within a Tokio runtime"
            );
            booking = booking.with_replica(ReplicaOptions {
                wait: args.replica_wait.min(std::time::Duration::from_secs(30)),
                refresh: args.replica_refresh,
                max_staleness: args.replica_max_staleness,
                relist_after: args.replica_relist_after,
            });
        }
        let client = ClientAuth {
            ca: args.client_ca.clone(),
            names: args.client_names(),
        };
        let certs = CertStore::load_with(
            args.tls_cert.clone(),
            args.tls_key.clone(),
            client,
            metrics.clone(),
        )?;
        let webhook = Webhook::new(cfg, Arc::new(booking), metrics.clone())
            .with_ledger(LendLedger::new(args.lend_settle, args.lend_ttl))
            .with_source_limit(args.source_review_burst, args.source_reviews_per_second);
        Ok(Self {
            webhook: Arc::new(webhook),
            certs: Arc::new(certs),
            metrics,
            ready: Arc::new(AtomicBool::new(false)),
            limits: args.limits.clone(),
        })
    }

    /// `POST /mutate` without TLS.
    pub fn router(&self) -> axum::Router {
        router(self.webhook.clone())
    }

    /// `/healthz`, `/readyz`, `/metrics`.
    pub fn admin_router(&self) -> axum::Router {
        admin_router(self.metrics.clone(), self.ready.clone())
    }

    /// Serves `/mutate` over TLS on a bound listener until `shutdown` completes;
    /// ready from the first accept on.
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> anyhow::Result<()> {
        self.ready.store(true, Ordering::Release);
        let served = serve_tls(
            listener,
            self.certs.clone(),
            self.router(),
            &self.limits,
            shutdown,
        )
        .await;
        self.ready.store(false, Ordering::Release);
        // A clean shutdown sends the audit reports still queued.
        self.webhook.booking().flush(AUDIT_FLUSH).await;
        served
    }
}

/// Runs the webhook until SIGTERM or Ctrl-C: TLS on `--listen`, health and metrics on
/// `--admin-listen`.
pub async fn run(args: WebhookArgs) -> anyhow::Result<()> {
    args.log.init();
    let server = WebhookServer::from_args(&args)?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding --listen {}", args.listen))?;
    let admin = args.admin.bind().await?;
    tracing::info!(
        listen = %args.listen,
        admin = %args.admin.admin_listen,
        booking_url = %args.booking.url().unwrap_or_default(),
        "webhook serving"
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let admin_task = tokio::spawn(serve_plain(
        admin,
        server.admin_router(),
        stopped(stop_rx.clone()),
    ));
    let signal = async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
    };
    let served = server.serve(listener, signal).await;
    let _ = admin_task.await;
    served
}
