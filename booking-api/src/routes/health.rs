//! Liveness, readiness (the database answers) and metrics.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;

use crate::state::AppState;

pub async fn healthz() -> &'static str {
    "ok"
}

pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let answered = sqlx::query("SELECT 1").execute(&state.pool).await;
    state.metrics.database_seen(answered.as_ref().map(drop));
    match answered {
        Ok(_) => (StatusCode::OK, "ready"),
        Err(e) => {
            tracing::warn!(error = %e, "not ready: database unreachable");
            (StatusCode::SERVICE_UNAVAILABLE, "database unreachable")
        }
    }
}

/// The booking state is read into its gauges first; OpenMetrics, or the text format
/// when the scraper asks for it.
pub async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> impl IntoResponse {
    state.metrics.refresh(&state.pool, state.clock.now()).await;
    gpu_booking_process::metrics::response(&headers, state.metrics.encode())
}
