//! `/api/v1/me/next-start`: the earliest valid start of the caller's next booking.

use axum::extract::State;
use chrono::{DateTime, TimeDelta, Utc};
use gpu_booking_core::next_start;
use gpu_booking_core::rules::{self, Reason};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract::Query;
use crate::state::AppState;
use crate::store::{bookings, models};

/// The largest `days` asked about, either way (a length outside the policy's is
/// refused by the duration rules anyway; this bounds the arithmetic before them).
pub const MAX_DAYS: i64 = 36_500;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct NextStartQuery {
    pub model: String,
    /// Length of the booking in days (default: the shortest allowed, rounded up);
    /// within the policy's minimum and maximum duration (`GET /api/v1/policy`).
    #[param(minimum = -36500, maximum = 36500)]
    pub days: Option<i64>,
    /// GPUs (units of the model) the booking would be for (default 1; at most the
    /// policy's `max_units_per_booking`, whose largest value is `maximum`).
    #[param(minimum = 1, maximum = 64)]
    pub units: Option<u32>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ReasonView {
    /// The rule: `active_booking_exists`, `future_booking_exists`, `cooldown`, `capacity`.
    pub code: String,
    pub message: String,
    pub until: DateTime<Utc>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct NextStart {
    pub model: String,
    pub days: i64,
    /// The GPUs asked about: the start is the earliest with that many units free.
    pub units: u32,
    pub earliest_start: DateTime<Utc>,
    pub earliest_end: DateTime<Utc>,
    /// Why it is not now; empty when it is.
    pub reasons: Vec<ReasonView>,
}

impl From<Reason> for ReasonView {
    fn from(r: Reason) -> Self {
        ReasonView {
            code: r.code.as_str().to_string(),
            message: r.message,
            until: r.until,
        }
    }
}

#[utoipa::path(get, path = "/api/v1/me/next-start", tag = "bookings", params(NextStartQuery),
    responses((status = 200, body = NextStart), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn next_start(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<NextStartQuery>,
) -> Result<axum::Json<NextStart>, ApiError> {
    let policy = &state.policy;
    let days = q.days.unwrap_or_else(|| next_start::default_days(policy));
    if !(-MAX_DAYS..=MAX_DAYS).contains(&days) {
        return Err(ApiError::Invalid("days must be at most 36500".into()));
    }
    let duration = TimeDelta::days(days);
    // Asked about as a booking would be: 1 to the policy's maximum.
    let need = rules::check_units(policy, q.units.unwrap_or(1), false)?;
    let now = state.clock.now();
    // The duration rules, checked as a booking starting now would be.
    rules::check_request(policy, now, now, now + duration, false)?;
    let model = models::get(&state.pool, &q.model)
        .await?
        .ok_or_else(|| ApiError::unknown_model(&q.model))?;
    let own = bookings::user_windows(&state.pool, policy, now, caller.user.as_str()).await?;
    // The same function as the webhook's "you can book from ..." (schedulability).
    let question = models::StartQuestion {
        policy,
        now,
        own: &own,
        duration,
    };
    let next = models::earliest_start(&state.pool, &question, &model, need).await??;
    Ok(axum::Json(NextStart {
        model: model.name,
        days,
        units: need,
        earliest_start: next.start,
        earliest_end: next.start + duration,
        reasons: next.reasons.into_iter().map(ReasonView::from).collect(),
    }))
}
