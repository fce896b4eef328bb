//! `/api/v1/booking-changes`: the stream of booking changes that the controller and
//! the webhook's replica follow, with resume and long poll.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract::Query;
use crate::state::AppState;
use crate::store::changes::{self, Read};
use gpu_booking_core::wire::{BookingChange, BookingChanges};

/// Longest long poll, seconds.
pub const MAX_WAIT_SECS: u64 = 30;
/// While a long poll waits, it also looks again this often: a change is served only
/// once every older transaction has finished, and the end of an unrelated one sends
/// no notification.
const RECHECK: Duration = Duration::from_secs(1);

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ChangesQuery {
    /// The position to resume from (`next` of the previous answer). Without it, the
    /// answer lists the current bookings (planned and running, and those that ended
    /// in the last 10 minutes, status `ended`) as `kind: current` and the position
    /// from which to follow: list, then follow, with no gap.
    pub after: Option<i64>,
    /// Seconds to wait for a change when there is none yet (long poll); 0 (the
    /// default) answers at once.
    #[param(minimum = 0, maximum = 30)]
    pub wait: Option<u64>,
}

/// The 410 answer: the resume point is older than the changes kept (retention), or
/// not from this service's log.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChangesGone {
    /// `resume_point_gone`.
    #[schema(example = "resume_point_gone")]
    pub error: String,
    pub message: String,
    /// Changes of transactions up to this position are no longer kept.
    pub pruned_through: i64,
}

#[utoipa::path(get, path = "/api/v1/booking-changes", tag = "bookings", params(ChangesQuery),
    description = "Every change to a booking (created, cancelled, ended early, start or end moved), by anyone, \
                   in commit-safe order: a change is served once every transaction older than it has finished, \
                   so a follower that resumes from `next` sees each change exactly once; a long transaction of the booking \
                   database holds back the changes after it, and `behind_ms` says how long the oldest of them has waited \
                   (meanwhile a long poll answers within about a second). \
                   Service and admin roles. \
                   Without `after`: the current bookings (and those that ended in the last 10 minutes, so that a \
                   follower that lists again ends their pods at once) and the position to follow from. A resume point older \
                   than the retention answers 410: list again (no `after`).",
    responses((status = 200, body = BookingChanges), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
              (status = 410, body = ChangesGone, description = "The resume point is gone: list again without `after`."),
              (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<ChangesQuery>,
) -> Result<Response, ApiError> {
    caller.require_service()?;
    let wait = q.wait.unwrap_or(0);
    if wait > MAX_WAIT_SECS {
        return Err(ApiError::Invalid(format!(
            "wait must be between 0 and {MAX_WAIT_SECS} seconds"
        )));
    }
    let deadline = Instant::now() + Duration::from_secs(wait);
    // Subscribed before the first read, so that a change committed between the read
    // and the wait still wakes it. No place among the waiters: answer at once.
    let mut waiter = match (wait, q.after) {
        (0, _) | (_, None) => None,
        _ => state.changes.waiter(&state.pool),
    };
    let mut first = true;
    loop {
        let now = state.clock.now();
        match changes::read(&state.pool, q.after, now).await? {
            Read::Gone { oldest } => {
                let body = ChangesGone {
                    error: "resume_point_gone".into(),
                    message: format!(
                        "Changes after position {} are no longer all kept (retention); list the \
                         bookings again with GET /api/v1/booking-changes (no `after`) and follow from its `next`.",
                        q.after.unwrap_or_default()
                    ),
                    pruned_through: oldest,
                };
                return Ok((StatusCode::GONE, axum::Json(body)).into_response());
            }
            Read::Changes {
                changes,
                next,
                behind,
                more,
            } => {
                let left = deadline.saturating_duration_since(Instant::now());
                // While a transaction holds the stream back, a long poll answers at
                // its first wake (a change made, or the recheck within a second)
                // instead of at its end: the follower sees the lag grow and may
                // list again (`gpu_booking_client::Follower::relist_after`).
                let held = !behind.is_zero() && !first;
                first = false;
                match &mut waiter {
                    Some(w) if changes.is_empty() && !left.is_zero() && !held => {
                        if !w.changed(left.min(RECHECK)).await {
                            // Shutting down: answer what there is (nothing yet).
                            waiter = None;
                        }
                    }
                    _ => {
                        let body = BookingChanges {
                            changes: changes
                                .into_iter()
                                .map(|c| BookingChange {
                                    seq: c.seq,
                                    kind: c.kind,
                                    at: c.at,
                                    booking: c.booking.view(now),
                                })
                                .collect(),
                            next,
                            behind_ms: u64::try_from(behind.num_milliseconds()).unwrap_or(0),
                            more,
                        };
                        return Ok(axum::Json(body).into_response());
                    }
                }
            }
        }
    }
}
