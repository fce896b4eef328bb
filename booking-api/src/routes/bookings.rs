//! `/api/v1/bookings`: create, list, read, cancel / end early.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use gpu_booking_core::precondition::booking_etag;
use gpu_booking_core::username::Username;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::create_queue::Create;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{Json, Path, Query};
use crate::metrics::ResultLabels;
use crate::routes::MAX_PAGE_LIMIT;
use crate::state::AppState;
use crate::store::{bookings, held};
use gpu_booking_core::window::BookingStatus;
use gpu_booking_core::wire::Booking;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBooking {
    /// Model name, e.g. `a100`.
    pub model: String,
    /// GPUs of the model (default 1; at most the policy's `max_units_per_booking`,
    /// see `GET /api/v1/policy`; `maximum` is the most any policy allows, which an
    /// admin's override may reach).
    #[serde(default = "one_unit")]
    #[schema(minimum = 1, maximum = 64, default = 1)]
    pub units: u32,
    /// RFC 3339 start (inclusive); in the years 1970 to 9999, like `end`.
    pub start: DateTime<Utc>,
    /// RFC 3339 end (exclusive): after `start`, in the years 1970 to 9999.
    pub end: DateTime<Utc>,
    /// Admins only: book for this user. A user name: its length counts UTF-8
    /// bytes (also once lowercased, where the service compares names in
    /// lowercase); no control character, no white space at either end.
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000](?:[^\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb]*[^\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000])?$"
    )]
    pub user: Option<String>,
    /// Admins only: skip every rule but capacity and the user's own overlap.
    #[serde(default, rename = "override")]
    pub override_rules: bool,
}

fn one_unit() -> u32 {
    1
}

#[utoipa::path(post, path = "/api/v1/bookings", tag = "bookings", request_body = CreateBooking,
    responses((status = 201, body = Booking), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    Json(body): Json<CreateBooking>,
) -> Result<(StatusCode, axum::Json<Booking>), ApiError> {
    if (body.user.is_some() || body.override_rules) && !caller.admin {
        return Err(ApiError::Forbidden(
            "only admins may book for another user or override the rules".into(),
        ));
    }
    let user = match &body.user {
        Some(name) => Username::normalised(name, state.names)
            .map_err(|e| ApiError::Invalid(format!("user: {e}")))?,
        None => caller.user.clone(),
    };
    // The token's groups decide the create's policy: recorded first (nothing is
    // read or written for a token without groups, or whose groups were recorded).
    crate::routes::groups::seen(&state, &caller).await?;
    let now = state.clock.now();
    let created = state
        .creates
        .create(
            now,
            Create {
                user,
                model: body.model,
                units: body.units,
                start: body.start,
                end: body.end,
                override_rules: body.override_rules,
                created_by: caller.user.as_str().to_owned(),
            },
        )
        .await;
    let result = named_refusal(&state, created).await.map_err(ApiError::from);
    let outcome = match &result {
        Ok(_) => "created",
        Err(e) => e.code(),
    };
    state
        .metrics
        .booking_creates
        .get_or_create(&ResultLabels {
            result: outcome.to_string(),
        })
        .inc();
    Ok((StatusCode::CREATED, axum::Json(result?.view(now))))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Admins: everyone's bookings.
    #[serde(default)]
    pub all: bool,
    /// Only this user's bookings (others than yourself: admins only). A user name:
    /// its length counts UTF-8 bytes; no control character, no white space at
    /// either end.
    #[param(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000](?:[^\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb]*[^\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000])?$"
    )]
    pub user: Option<String>,
    pub model: Option<String>,
    /// Bookings ending after this time.
    pub from: Option<DateTime<Utc>>,
    /// Bookings starting before this time.
    pub to: Option<DateTime<Utc>>,
    /// At most this many, newest start first (default 200, at most 1000).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
}

#[utoipa::path(get, path = "/api/v1/bookings", tag = "bookings", params(ListQuery),
    responses((status = 200, body = [Booking]), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> Result<axum::Json<Vec<Booking>>, ApiError> {
    let named = match &q.user {
        Some(u) => Some(
            Username::normalised(u, state.names)
                .map_err(|e| ApiError::Invalid(format!("user: {e}")))?,
        ),
        None => None,
    };
    let user = match (&named, q.all) {
        (Some(u), _) => {
            caller.require_self_or_admin(u.as_str())?;
            Some(u.as_str())
        }
        (None, true) => {
            caller.require_admin()?;
            None
        }
        (None, false) => Some(caller.user.as_str()),
    };
    let limit = q.limit.unwrap_or(200);
    if !(1..=MAX_PAGE_LIMIT).contains(&limit) {
        return Err(ApiError::Invalid("limit must be between 1 and 1000".into()));
    }
    let rows = bookings::list(
        &state.pool,
        bookings::Filter {
            user,
            model: q.model.as_deref(),
            from: q.from,
            to: q.to,
            limit,
        },
    )
    .await?;
    let now = state.clock.now();
    let views = rows.iter().map(|r| r.view(now)).collect();
    Ok(axum::Json(with_waiting(&state.pool, views).await?))
}

#[utoipa::path(get, path = "/api/v1/bookings/{id}", tag = "bookings", params(("id" = i64, Path)),
    responses((status = 200, body = Booking, headers(("ETag" = String, description = "The booking's stored state (window, units, cancellation, early end): send it in `If-Match` with `PATCH` or `DELETE` to change the booking only in that state."))),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
) -> Result<Tagged, ApiError> {
    let row = owned_booking(&state, &caller, id).await?;
    let view = with_waiting(&state.pool, vec![row.view(state.clock.now())]).await?;
    Ok(Tagged(
        view.into_iter().next().expect("one booking in, one out"),
    ))
}

/// A booking answered with its `ETag` (`core::precondition`).
pub struct Tagged(Booking);

impl axum::response::IntoResponse for Tagged {
    fn into_response(self) -> axum::response::Response {
        crate::routes::conditional::with_etag(&booking_etag(&self.0), self.0)
    }
}

#[utoipa::path(delete, path = "/api/v1/bookings/{id}", tag = "bookings",
    params(("id" = i64, Path), ("If-Match" = Option<String>, Header, description = "An `ETag` of this booking (or `*`): the change is made only while the booking is in that state, else 412 and nothing changes. Without it, the change applies to the booking as it is.")),
    description = "Cancels a planned booking (no cooldown) or ends an active one now (cooldown from now).",
    responses((status = 200, body = Booking, headers(("ETag" = String, description = "The booking's stored state (window, units, cancellation, early end): send it in `If-Match` with `PATCH` or `DELETE` to change the booking only in that state."))),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody),
              (status = 412, body = ErrorBody, description = "`precondition_failed`: the booking has changed since the `ETag` sent in `If-Match`; nothing was changed.")),
    security(("bearer" = [])))]
pub async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
    headers: HeaderMap,
) -> Result<Tagged, ApiError> {
    let condition = crate::routes::conditional::if_match(&headers)?;
    owned_booking(&state, &caller, id).await?;
    let now = state.clock.now();
    let updated = bookings::cancel_or_end(
        &state.pool,
        id,
        now,
        caller.user.as_str(),
        condition.as_ref(),
    )
    .await?;
    // The unit it held may be what a waiting entry needs.
    crate::store::waitlist::after_freeing(&state.pool, &state.policy, now, &updated.model).await;
    Ok(Tagged(updated.view(now)))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChangeBooking {
    /// RFC 3339 new end (exclusive): later to extend, earlier to shorten; never in
    /// the past (to end a booking now, `DELETE` it); in the years 1970 to 9999.
    pub end: DateTime<Utc>,
    /// RFC 3339 new start, for a booking that has not started (a started booking
    /// keeps its start: `booking_started`); in the years 1970 to 9999.
    pub start: Option<DateTime<Utc>>,
    /// Admins only: skip the duration and cooldown rules (capacity, the past and
    /// the user's own overlap still hold).
    #[serde(default, rename = "override")]
    pub override_rules: bool,
}

#[utoipa::path(patch, path = "/api/v1/bookings/{id}", tag = "bookings",
    params(("id" = i64, Path), ("If-Match" = Option<String>, Header, description = "An `ETag` of this booking (or `*`): the change is made only while the booking is in that state, else 412 and nothing changes. Without it, the change applies to the booking as it is.")),
    request_body = ChangeBooking,
    description = "Extends or shortens a planned or running booking (its owner, or an admin): within the policy's \
                   maximum duration (and minimum, before it starts) and the model's capacity, with the cooldown to \
                   the user's other bookings checked from the new window. A started booking keeps its start; the end \
                   never moves into the past. The controller re-times the booking's pods within seconds.",
    responses((status = 200, body = Booking, headers(("ETag" = String, description = "The booking's stored state (window, units, cancellation, early end): send it in `If-Match` with `PATCH` or `DELETE` to change the booking only in that state."))),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "`capacity`, `cooldown`, `overlap`, `booking_started`, `quota_hours`, `quota_units` (the group's quota; the message says what is left), or `not_changeable` (ended or cancelled)."),
              (status = 412, body = ErrorBody, description = "`precondition_failed`: the booking has changed since the `ETag` sent in `If-Match`; nothing was changed."),
              (status = 422, body = ErrorBody, description = "`end_in_past`, `invalid_window`, `duration_too_long`, `duration_too_short`, `start_in_past`.")),
    security(("bearer" = [])))]
pub async fn change(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
    headers: HeaderMap,
    Json(body): Json<ChangeBooking>,
) -> Result<Tagged, ApiError> {
    let condition = crate::routes::conditional::if_match(&headers)?;
    if body.override_rules && !caller.admin {
        return Err(ApiError::Forbidden(
            "only admins may override the rules".into(),
        ));
    }
    owned_booking(&state, &caller, id).await?;
    crate::routes::groups::seen(&state, &caller).await?;
    let now = state.clock.now();
    let changed = bookings::change_window(
        &state.pool,
        &state.policy,
        id,
        now,
        bookings::WindowRequest {
            start: body.start,
            end: body.end,
            override_rules: body.override_rules,
        },
        caller.user.as_str(),
        condition.as_ref(),
    )
    .await;
    let updated = named_refusal(&state, changed).await?;
    Ok(Tagged(updated.view(now)))
}

/// A refusal for capacity names the maintenance window or course session in the
/// way, if one is (read only for refusals).
async fn named_refusal<T>(
    state: &AppState,
    result: Result<T, crate::store::StoreError>,
) -> Result<T, crate::store::StoreError> {
    match result {
        Err(e) => Err(crate::store::holds::name_refusal(&state.pool, e).await),
        ok => ok,
    }
}

/// `views` with why each active one's pod waits for a card, as the controller last
/// reported it (`waiting`); a booking that is not active never waits. Read beside the
/// booking, not from it: the change stream builds its bookings without this, so that
/// its followers are not sent what changes with the cluster.
pub(crate) async fn with_waiting(
    pool: &sqlx::PgPool,
    mut views: Vec<Booking>,
) -> Result<Vec<Booking>, ApiError> {
    let active: Vec<i64> = views
        .iter()
        .filter(|b| b.status == BookingStatus::Active)
        .map(|b| b.id)
        .collect();
    let mut why = held::waiting(pool, &active).await?;
    for b in &mut views {
        if b.status == BookingStatus::Active {
            b.waiting = why.remove(&b.id);
        }
    }
    Ok(views)
}

/// The booking `id`, if the caller may see it (its owner or an admin). Another
/// user's booking answers exactly like a missing one, so that ids cannot be probed
/// for who booked what.
async fn owned_booking(
    state: &AppState,
    caller: &Caller,
    id: i64,
) -> Result<bookings::BookingRow, ApiError> {
    bookings::get(&state.pool, id)
        .await?
        .filter(|row| caller.admin || caller.user.as_str() == row.user_name)
        .ok_or_else(|| ApiError::NotFound(format!("no booking {id}")))
}
