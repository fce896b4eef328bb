//! HTTP: `POST /mutate` over TLS, and the plain admin port.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use gpu_booking_process::serve::BodyRefusal;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::admit::Webhook;
use crate::metrics::Metrics;
use crate::review::{ReviewOut, API_VERSION_V1};
use crate::tls::CertStore;

/// Largest review body read; larger ones are answered `invalid` (the API server caps
/// objects at about 1.5 MiB, so a real review never comes close).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;
/// The webhook's port limits (`--max-body-bytes` defaults to [`MAX_BODY_BYTES`]).
pub type WebhookLimits = gpu_booking_process::serve::ServerLimits<MAX_BODY_BYTES>;

/// The webhook's routes (`POST /mutate`), without TLS: tests drive it with
/// `tower::ServiceExt::oneshot`.
pub fn router(webhook: Arc<Webhook>) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .with_state(webhook)
}

async fn mutate(State(webhook): State<Arc<Webhook>>, request: Request) -> Response {
    // The client's address (the server sets it; a request without one, from a test,
    // is not limited).
    let source = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.ip());
    let body = request.into_body();
    let review = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(bytes) => webhook.review_from(&bytes, source).await,
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
    gpu_booking_process::admin_router(move || metrics.encode(), ready, "starting")
}

/// Serves `app` over TLS on `listener` within `limits` until `shutdown` completes,
/// then lets open connections finish (the shared serving of `gpu_booking_process::serve`).
/// Each connection takes the TLS configuration current at its start, so a rotated
/// certificate is used from the next connection on.
pub async fn serve_tls(
    listener: TcpListener,
    certs: Arc<CertStore>,
    app: Router,
    limits: &WebhookLimits,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let handshake = move |tcp| {
        let acceptor = TlsAcceptor::from(certs.current());
        let certs = certs.clone();
        async move {
            let accepted = acceptor.accept(tcp).await;
            let allowed = accepted
                .as_ref()
                .is_ok_and(|tls| certs.client_allowed(tls.get_ref().1.peer_certificates()));
            if certs.requires_client_certificate() && !allowed {
                certs.client_refused();
            }
            let tls = accepted?;
            if !allowed {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    "the client certificate carries none of --client-name",
                ));
            }
            Ok(tls)
        }
    };
    gpu_booking_process::serve::serve(listener, limits, app, refuse_body, handshake, shutdown).await
}

/// A body the server did not read (over the limit, too slow) is answered as every
/// request is: an AdmissionReview that refuses the pod and says why (its `uid` is
/// unknown, the review having not been read), on HTTP/1.1 and HTTP/2 alike.
pub fn refuse_body(refusal: &BodyRefusal) -> Response {
    json_response(&ReviewOut::invalid(API_VERSION_V1, "", refusal.to_string()))
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
