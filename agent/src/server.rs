//! The plain-HTTP admin port: `/healthz`, `/readyz`, `/metrics`.

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use axum::Router;
use tokio::net::TcpListener;

use crate::metrics::Metrics;

/// Liveness, readiness (sampling has started) and the metrics.
pub fn admin_router(metrics: Arc<Metrics>, ready: Arc<AtomicBool>) -> Router {
    gpu_booking_process::admin_router(move || metrics.encode(), ready, "starting (or no NVML)")
}

/// Serves `router` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use std::sync::atomic::Ordering;
    use tower::ServiceExt;

    async fn get(router: &Router, path: &str) -> (StatusCode, String) {
        let response = router
            .clone()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn health_readiness_and_the_prd_metric_names() {
        let metrics = Arc::new(Metrics::new());
        metrics.reclaim("success", "idle");
        metrics.kill("TERM");
        let ready = Arc::new(AtomicBool::new(false));
        let router = admin_router(metrics, ready.clone());
        assert_eq!(get(&router, "/healthz").await.0, StatusCode::OK);
        assert_eq!(
            get(&router, "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        ready.store(true, Ordering::Release);
        assert_eq!(get(&router, "/readyz").await.0, StatusCode::OK);
        let (status, text) = get(&router, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        for line in [
            "# TYPE gpu_booking_agent_reclaim counter",
            "gpu_booking_agent_reclaim_total{result=\"success\",reason=\"idle\"} 1",
            "gpu_booking_agent_kill_total{signal=\"TERM\"} 1",
            "gpu_booking_agent_pid_attribution_fail_total 0",
            "gpu_booking_agent_idle_candidates 0",
            "gpu_booking_agent_nvml_up 0",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
