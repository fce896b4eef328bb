//! `/api/v1/availability`: what the JupyterHub spawn form shows (models free now, the
//! user's booking now and next), in one small answer.

use axum::extract::State;
use chrono::{DateTime, Utc};
use gpu_booking_core::username::Username;
use gpu_booking_core::window::BookingStatus;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract::Query;
use crate::state::AppState;
use crate::store::bookings::{self, Filter};
use crate::store::models;
use gpu_booking_core::wire::Booking;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct SpawnAvailabilityQuery {
    /// Whose booking (the service and admin roles only, e.g. the hub's spawn form
    /// asking for the user who spawns); default: the caller. A user name: its
    /// length counts UTF-8 bytes; no control character, no white space at either
    /// end.
    #[param(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000](?:[^\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb]*[^\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000])?$"
    )]
    pub user: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SpawnModel {
    pub name: String,
    pub units: i32,
    /// Units with no pod on them now: an unbooked spawn is lent one of these.
    pub free_now: i32,
}

/// (Named apart from `models::Availability`: OpenAPI schemas are named by type name.)
#[derive(Debug, Serialize, ToSchema)]
pub struct SpawnAvailability {
    pub user: String,
    pub at: DateTime<Utc>,
    pub models: Vec<SpawnModel>,
    /// The booking running now, if any: a spawn gets its model until its end.
    pub active: Option<Booking>,
    /// The next planned booking, if any.
    pub next: Option<Booking>,
}

#[utoipa::path(get, path = "/api/v1/availability", tag = "bookings", params(SpawnAvailabilityQuery),
    responses((status = 200, body = SpawnAvailability), (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<SpawnAvailabilityQuery>,
) -> Result<axum::Json<SpawnAvailability>, ApiError> {
    let user = match q.user {
        Some(name) => {
            caller.require_service()?;
            Username::normalised(&name, state.names)
                .map_err(|e| ApiError::Invalid(format!("user: {e}")))?
                .into_inner()
        }
        None => caller.user.as_str().to_owned(),
    };
    let now = state.clock.now();
    let models = models::list(&state.pool)
        .await?
        .into_iter()
        .map(|m| SpawnModel {
            free_now: m.free_now(),
            name: m.name,
            units: m.units,
        })
        .collect();
    // A user holds at most a few bookings that have not ended.
    let ahead = bookings::list(
        &state.pool,
        Filter {
            user: Some(&user),
            model: None,
            from: Some(now),
            to: None,
            limit: 100,
        },
    )
    .await?;
    let views = ahead.iter().map(|b| b.view(now)).collect();
    let views = crate::routes::bookings::with_waiting(&state.pool, views).await?;
    let (mut active, mut next) = (None, None::<Booking>);
    for b in views {
        match b.status {
            BookingStatus::Active => active = Some(b),
            BookingStatus::Planned if next.as_ref().is_none_or(|n| b.start < n.start) => {
                next = Some(b)
            }
            _ => {}
        }
    }
    Ok(axum::Json(SpawnAvailability {
        user,
        at: now,
        models,
        active,
        next,
    }))
}
