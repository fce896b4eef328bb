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
pub mod booking;
pub mod config;
pub mod metrics;
pub mod review;
pub mod server;
pub mod tls;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use gpu_booking_core::admission::LendLedger;
pub use gpu_booking_ops::init_logging;
use gpu_booking_ops::shutdown_signal;
use tokio::net::TcpListener;

pub use admit::Webhook;
pub use booking::{BookingClient, BookingError, TokenSource};
pub use config::{LogFormat, OnBookingError, Unidentified, WebhookArgs};
pub use metrics::Metrics;
pub use review::{ReviewOut, StatusOut};
pub use server::{admin_router, router, serve_plain, serve_tls, WebhookLimits, MAX_BODY_BYTES};
pub use tls::CertStore;

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
    /// Checks the options, loads the certificate and the token, builds the client.
    pub fn from_args(args: &WebhookArgs) -> anyhow::Result<Self> {
        let cfg = args.admission_config()?;
        let metrics = Arc::new(Metrics::new());
        let token = match (&args.service_token, &args.service_token_file) {
            (Some(token), _) if !token.trim().is_empty() => {
                TokenSource::Static(token.trim().to_owned())
            }
            (_, Some(path)) => TokenSource::file(path.clone())
                .with_context(|| format!("reading --service-token-file {}", path.display()))?,
            _ => anyhow::bail!("give --service-token or --service-token-file"),
        };
        let booking = BookingClient::new(
            &args.booking_url,
            token,
            args.booking_timeout,
            args.cache_ttl,
            metrics.clone(),
        )?
        .with_audit_rate(args.audit_burst, args.audit_per_second);
        let certs = CertStore::load(args.tls_cert.clone(), args.tls_key.clone(), metrics.clone())?;
        let webhook = Webhook::new(cfg, Arc::new(booking), metrics.clone())
            .with_ledger(LendLedger::new(args.lend_settle, args.lend_ttl));
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
        served
    }
}

/// Runs the webhook until SIGTERM or Ctrl-C: TLS on `--listen`, health and metrics on
/// `--admin-listen`.
pub async fn run(args: WebhookArgs) -> anyhow::Result<()> {
    init_logging(args.log_format);
    let server = WebhookServer::from_args(&args)?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding --listen {}", args.listen))?;
    let admin = TcpListener::bind(args.admin_listen)
        .await
        .with_context(|| format!("binding --admin-listen {}", args.admin_listen))?;
    tracing::info!(
        listen = %args.listen,
        admin = %args.admin_listen,
        booking_url = %args.booking_url,
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
