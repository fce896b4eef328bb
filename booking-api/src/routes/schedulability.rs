//! `/api/v1/schedulability`: the one call the webhook makes per GPU pod.

use std::collections::BTreeMap;

use axum::extract::State;
use chrono::{DateTime, Utc};
use gpu_booking_core::rules;
use gpu_booking_core::username::Username;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::app::AppState;
use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract::Query;
use crate::store::{bookings, models, users};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct SchedulabilityQuery {
    /// The raw user name (pod annotation `hub.jupyter.org/username`).
    pub user: Option<String>,
    /// A KubeSpawner label slug (escape or safe scheme) when no raw name is known.
    pub slug: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Schedulability {
    /// The user has an active booking now.
    pub schedulable: bool,
    /// End of the active booking.
    pub until: Option<DateTime<Utc>>,
    pub model: Option<String>,
    pub booking_id: Option<i64>,
    /// The user the query resolved to, if any.
    pub user: Option<String>,
    /// Units of each model not in use right now.
    pub free: BTreeMap<String, i32>,
    /// Default VRAM budget (MiB) of each model.
    pub gpumem_mib: BTreeMap<String, i32>,
    /// When not booked: the earliest start the user's own bookings allow for a
    /// new booking (capacity aside).
    pub earliest_booking: Option<DateTime<Utc>>,
    /// The VRAM budget (MiB) one unit can hold, for each model whose every node
    /// advertises the budget resource; other models' pods get no budget.
    pub gpumem_advertised_mib: BTreeMap<String, i32>,
}

#[utoipa::path(get, path = "/api/v1/schedulability", tag = "webhook", params(SchedulabilityQuery),
    responses((status = 200, body = Schedulability), (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<SchedulabilityQuery>,
) -> Result<axum::Json<Schedulability>, ApiError> {
    caller.require_service()?;
    let candidates: Vec<String> = match (&q.user, &q.slug) {
        (Some(user), None) => {
            let user =
                Username::parse(user).map_err(|e| ApiError::Invalid(format!("user: {e}")))?;
            vec![user.into_inner()]
        }
        (None, Some(slug)) => {
            if slug.is_empty() || slug.len() > 256 || slug.chars().any(char::is_control) {
                return Err(ApiError::Invalid(
                    "slug must be 1 to 256 printable characters".into(),
                ));
            }
            users::by_slug(&state.pool, slug).await?
        }
        _ => {
            return Err(ApiError::Invalid(
                "give exactly one of user and slug".into(),
            ))
        }
    };
    let now = state.clock.now();
    let active = if candidates.is_empty() {
        None
    } else {
        bookings::active_for(&state.pool, &candidates, now).await?
    };
    let models = models::list(&state.pool).await?;
    let free = models
        .iter()
        .map(|m| (m.name.clone(), m.free_now()))
        .collect();
    let gpumem_mib = models
        .iter()
        .map(|m| (m.name.clone(), m.gpumem_mib))
        .collect();
    let gpumem_advertised_mib: BTreeMap<String, i32> = models
        .iter()
        .filter_map(|m| Some((m.name.clone(), m.advertised_unit_mib()?)))
        .collect();
    let answer = match active {
        Some(b) => Schedulability {
            schedulable: true,
            until: Some(b.end_at),
            model: Some(b.model),
            booking_id: Some(b.id),
            user: Some(b.user_name),
            free,
            gpumem_mib,
            earliest_booking: None,
            gpumem_advertised_mib,
        },
        None => {
            let user = candidates.into_iter().next();
            let earliest_booking = match &user {
                Some(u) => {
                    let own = bookings::user_windows(&state.pool, u).await?;
                    Some(rules::earliest_start_for_user(&state.policy, now, &own).0)
                }
                None => Some(now),
            };
            Schedulability {
                schedulable: false,
                until: None,
                model: None,
                booking_id: None,
                user,
                free,
                gpumem_mib,
                earliest_booking,
                gpumem_advertised_mib,
            }
        }
    };
    Ok(axum::Json(answer))
}
