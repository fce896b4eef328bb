//! HTTP: `POST /mutate` over TLS, and the plain admin port.

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::admit::Webhook;
use crate::metrics::Metrics;
use crate::review::{ReviewOut, API_VERSION_V1};
use crate::tls::CertStore;

/// Largest review body read; larger ones are answered `invalid` (the API server caps
/// objects at about 1.5 MiB, so a real review never comes close).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;
/// Longest a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest open connections get to finish their requests at shutdown.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The webhook's routes (`POST /mutate`), without TLS: tests drive it with
/// `tower::ServiceExt::oneshot`.
pub fn router(webhook: Arc<Webhook>) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .with_state(webhook)
}

async fn mutate(State(webhook): State<Arc<Webhook>>, body: Body) -> Response {
    let review = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(bytes) => webhook.review(&bytes).await,
        Err(e) => {
            webhook.metrics().admitted("invalid", Duration::ZERO);
            ReviewOut::invalid(
                API_VERSION_V1,
                "",
                format!("request body unreadable or over {MAX_BODY_BYTES} bytes: {e}"),
            )
        }
    };
    json_response(&review)
}

fn json_response(review: &ReviewOut) -> Response {
    // Serialising our own review type cannot fail.
    let body = serde_json::to_vec(review).unwrap_or_default();
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Liveness, readiness and metrics, for the plain admin port.
pub fn admin_router(metrics: Arc<Metrics>, ready: Arc<AtomicBool>) -> Router {
    gpu_booking_ops::admin_router(move || metrics.encode(), ready, "starting")
}

/// Serves `app` over TLS on `listener` until `shutdown` completes, then lets open
/// connections finish (at most [`DRAIN_TIMEOUT`]). Each connection takes the TLS
/// configuration current at its start, so a rotated certificate is used from the next
/// connection on.
pub async fn serve_tls(
    listener: TcpListener,
    certs: Arc<CertStore>,
    app: Router,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: back off, do not spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = TlsAcceptor::from(certs.current());
        let app = app.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let builder = auto::Builder::new(TokioExecutor::new());
            let conn = builder
                .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                .into_owned();
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after {DRAIN_TIMEOUT:?}; closing them");
    }
    Ok(())
}

/// Serves `app` over plain HTTP until `shutdown` completes.
pub async fn serve_plain(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}
