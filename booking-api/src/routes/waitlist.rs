//! `/api/v1/waitlist`: wait for the first window of a length on a model.

use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, TimeDelta, Utc};
use gpu_booking_core::username::Username;
use gpu_booking_core::waitlist::Wish;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{Json, Path, Query};
use crate::routes::MAX_PAGE_LIMIT;
use crate::state::AppState;
use crate::store::waitlist::{self, Entry, NewEntry};

/// How long an entry waits for a start when it names no `latest_start`.
pub const DEFAULT_WAIT: TimeDelta = TimeDelta::days(7);
/// The longest `days` an entry may ask for (ten years; the policy's maximum
/// duration refuses a long one before this does).
pub const MAX_DAYS: i64 = 3660;
/// The longest `hours`: as many as [`MAX_DAYS`].
pub const MAX_HOURS: i64 = MAX_DAYS * 24;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JoinWaitlist {
    /// Model name, e.g. `a100`.
    pub model: String,
    /// The booking may start at or after this time (default: now; a time in the
    /// past means now), in the years up to 9999.
    pub from: Option<DateTime<Utc>>,
    /// ... and no later than this (default: 7 days after `from`): not before
    /// `from`, at most 366 days after it, in the years 1970 to 9999.
    pub latest_start: Option<DateTime<Utc>>,
    /// The booking's length in days; give exactly one of `days` and `hours`. Within
    /// the policy's minimum and maximum duration (`GET /api/v1/policy`).
    #[schema(minimum = 1, maximum = 3660)]
    pub days: Option<i64>,
    /// The booking's length in hours (instead of `days`).
    #[schema(minimum = 1, maximum = 87840)]
    pub hours: Option<i64>,
    /// Admins only: put this user on the waitlist. A user name: its length counts
    /// UTF-8 bytes; no control character, no white space at either end.
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000](?:[^\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb]*[^\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000])?$"
    )]
    pub user: Option<String>,
}

#[utoipa::path(post, path = "/api/v1/waitlist", tag = "waitlist", request_body = JoinWaitlist,
    description = "Waits for the first window of `days` (or `hours`) on `model` that starts between `from` and \
                   `latest_start` and that every booking rule accepts. Entries of a model are served in the order \
                   they joined; one that fits now is booked at once (201 with `state: booked` and `booking_id`), \
                   otherwise it is booked the moment one fits (a cancellation, an early end, more units). \
                   One waiting entry per user and model (409 `already_waiting`).",
    responses((status = 201, body = Entry), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody),
              (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn join(
    State(state): State<AppState>,
    caller: Caller,
    Json(body): Json<JoinWaitlist>,
) -> Result<(StatusCode, axum::Json<Entry>), ApiError> {
    let user = match &body.user {
        Some(name) => {
            caller.require_admin()?;
            Username::normalised(name, state.names)
                .map_err(|e| ApiError::Invalid(format!("user: {e}")))?
        }
        None => caller.user.clone(),
    };
    let duration = match (body.days, body.hours) {
        (Some(d), None) if (1..=MAX_DAYS).contains(&d) => TimeDelta::days(d),
        (None, Some(h)) if (1..=MAX_HOURS).contains(&h) => TimeDelta::hours(h),
        (Some(_), Some(_)) | (None, None) => {
            return Err(ApiError::Invalid(
                "give exactly one of days and hours".into(),
            ))
        }
        _ => {
            return Err(ApiError::Invalid(
                "days must be 1 to 3660, hours 1 to 87840".into(),
            ))
        }
    };
    let now = state.clock.now();
    let from = body.from.unwrap_or(now).max(now);
    let latest_start = match body.latest_start {
        Some(t) => t,
        None => from.checked_add_signed(DEFAULT_WAIT).unwrap_or(from),
    };
    let entry = waitlist::join(
        &state.pool,
        &state.policy,
        now,
        NewEntry {
            user: &user,
            model: &body.model,
            wish: Wish {
                not_before: from,
                latest_start,
                duration,
            },
            created_by: caller.user.as_str(),
        },
    )
    .await?;
    Ok((StatusCode::CREATED, axum::Json(entry)))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Admins: everyone's entries.
    #[serde(default)]
    pub all: bool,
    /// Only this model's entries.
    pub model: Option<String>,
    /// At most this many (default 100, at most 1000): waiting ones first, in order.
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
}

#[utoipa::path(get, path = "/api/v1/waitlist", tag = "waitlist", params(ListQuery),
    description = "The caller's entries (admins: `all=true` for everyone's), waiting ones first in queue order with \
                   their `position` in their model's queue, then the latest others.",
    responses((status = 200, body = [Entry]), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> Result<axum::Json<Vec<Entry>>, ApiError> {
    if q.all {
        caller.require_admin()?;
    }
    let limit = q.limit.unwrap_or(100);
    if !(1..=MAX_PAGE_LIMIT).contains(&limit) {
        return Err(ApiError::Invalid("limit must be between 1 and 1000".into()));
    }
    let user = (!q.all).then(|| caller.user.as_str());
    Ok(axum::Json(
        waitlist::list(&state.pool, user, q.model.as_deref(), limit).await?,
    ))
}

#[utoipa::path(delete, path = "/api/v1/waitlist/{id}", tag = "waitlist", params(("id" = i64, Path)),
    description = "Takes a waiting entry off the waitlist (409 `not_cancellable` once booked, cancelled or expired).",
    responses((status = 200, body = Entry), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
) -> Result<axum::Json<Entry>, ApiError> {
    // Another user's entry answers exactly like a missing one.
    waitlist::get(&state.pool, id)
        .await?
        .filter(|e| caller.admin || e.user == caller.user.as_str())
        .ok_or_else(|| ApiError::NotFound(format!("no waitlist entry {id}")))?;
    let now = state.clock.now();
    Ok(axum::Json(
        waitlist::cancel(&state.pool, id, now, caller.user.as_str()).await?,
    ))
}
