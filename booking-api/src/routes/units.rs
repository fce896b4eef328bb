//! Multi-GPU bookings: the policy's limits as the page and
//! clients read them, and the controller's count of the units each booking's pods
//! hold (what the webhook needs to give high priority only up to a booking's units).

use axum::extract::State;
use gpu_booking_core::wire::notebooks::notebooks_problem;
use gpu_booking_core::wire::{HeldReport, HeldReported, MAX_HELD_UNITS, MAX_REPORTED_BOOKINGS};
use serde::Serialize;
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract::Json;
use crate::state::AppState;
use crate::store::{held, notebooks, usage};

/// The booking policy (the API's settings).
#[derive(Debug, Serialize, ToSchema)]
pub struct PolicyView {
    /// Shortest booking, seconds (inclusive).
    pub min_duration_seconds: i64,
    /// Longest booking, seconds (inclusive).
    pub max_duration_seconds: i64,
    /// Gap between a user's bookings, seconds.
    pub cooldown_seconds: i64,
    /// Planned bookings a user may hold at once.
    pub max_planned: u32,
    /// Whether a new booking is refused while the user has one running.
    pub no_booking_while_active: bool,
    /// GPUs one booking may be for (`units` of `POST /bookings`).
    pub max_units_per_booking: u32,
    /// How far ahead a booking may start, seconds.
    pub max_ahead_seconds: i64,
}

#[utoipa::path(get, path = "/api/v1/policy", tag = "bookings",
    responses((status = 200, body = PolicyView), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn policy(
    State(state): State<AppState>,
    _caller: Caller,
) -> Result<axum::Json<PolicyView>, ApiError> {
    let p = &state.policy;
    Ok(axum::Json(PolicyView {
        min_duration_seconds: p.min_duration.num_seconds(),
        max_duration_seconds: p.max_duration.num_seconds(),
        cooldown_seconds: p.cooldown.num_seconds(),
        max_planned: p.max_planned,
        no_booking_while_active: p.no_booking_while_active,
        max_units_per_booking: p.max_units_per_booking,
        max_ahead_seconds: p.max_ahead.num_seconds(),
    }))
}

#[utoipa::path(put, path = "/api/v1/held-units", tag = "webhook", request_body = HeldReport,
    responses((status = 200, body = HeldReported), (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn put_held(
    State(state): State<AppState>,
    caller: Caller,
    Json(body): Json<HeldReport>,
) -> Result<axum::Json<HeldReported>, ApiError> {
    caller.require_service()?;
    if body.bookings.len() > MAX_REPORTED_BOOKINGS || body.active.len() > MAX_REPORTED_BOOKINGS {
        return Err(ApiError::Invalid(format!(
            "at most {MAX_REPORTED_BOOKINGS} bookings per report"
        )));
    }
    if body
        .bookings
        .values()
        .any(|n| !(0..=MAX_HELD_UNITS).contains(n))
    {
        return Err(ApiError::Invalid(
            "units held must be between 0 and 100000".into(),
        ));
    }
    if let Some(problem) = body.waiting_problem() {
        return Err(ApiError::Invalid(problem));
    }
    if let Some(problem) = notebooks_problem(&body.notebooks) {
        return Err(ApiError::Invalid(problem));
    }
    let now = state.clock.now();
    held::replace(&state.pool, &body.bookings, &body.waiting, now).await?;
    notebooks::replace(&state.pool, &body.notebooks, state.names, now).await?;
    usage::record(&state.pool, &body.bookings, &body.active, now).await?;
    Ok(axum::Json(HeldReported {
        bookings: body.bookings.len(),
    }))
}
