//! `/api/v1/reservations`: course reservations. `units` of a model for a group at
//! each occurrence of an RFC 5545 rule in a time zone (`core::recurrence`), made by
//! an admin or an owner of the group. Each occurrence holds its units as a booking
//! does (`core::holds`); one can be cancelled (a holiday), which frees its units.

use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, NaiveDateTime, Utc};
use gpu_booking_core::holds::HoldKind;
use gpu_booking_core::recurrence::{self, Schedule};
use gpu_booking_core::rules::{rfc3339, Refusal, RuleCode};
use gpu_booking_core::window::Window;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{Json, Path};
use crate::routes::maintenance::{check_title, remove_hold};
use crate::state::AppState;
use crate::store::bookings;
use crate::store::holds::{self as store, HoldRow, Made, NewHold, OccurrenceRow};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewReservation {
    /// The model, e.g. `a100`.
    pub model: String,
    /// Units each occurrence holds (1 to 64, at most the model's).
    #[schema(minimum = 1, maximum = 64)]
    pub units: u32,
    /// The group (its name) whose members' pods get the units.
    pub group: String,
    /// What the feeds and the page call it ("ML101 lab session").
    #[schema(min_length = 1, max_length = 200)]
    pub title: String,
    /// The first session's start and end, wall-clock times in `time_zone`
    /// (`2027-02-02T14:00:00`): DTSTART, and each occurrence's wall-clock length.
    #[schema(value_type = String, example = "2027-02-02T14:00:00")]
    pub start: NaiveDateTime,
    #[schema(value_type = String, example = "2027-02-02T16:00:00")]
    pub end: NaiveDateTime,
    /// The RFC 5545 rule, with `COUNT` or `UNTIL` (`FREQ=WEEKLY;BYDAY=TU;COUNT=12`).
    #[schema(max_length = 1000, example = "FREQ=WEEKLY;BYDAY=TU;COUNT=12")]
    pub rrule: String,
    /// IANA time zone of the wall-clock times (default: the lab's, `--time-zone`).
    #[schema(example = "Europe/Berlin")]
    pub time_zone: Option<String>,
    /// Occurrences not to hold (a holiday known ahead), by their wall-clock start.
    #[serde(default)]
    #[schema(value_type = Vec<String>)]
    pub skip: Vec<NaiveDateTime>,
    /// Leave out the occurrences that do not fit instead of refusing the whole.
    #[serde(default)]
    pub skip_conflicts: bool,
}

/// One occurrence of a reservation.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Occurrence {
    /// The booking row that holds its units (its user is the reservation's own,
    /// `" course <id> group <group id>"`, in the booking change stream).
    pub booking_id: i64,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub cancelled: bool,
}

/// A course reservation with its occurrences.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Reservation {
    pub id: i64,
    pub model: String,
    pub units: u32,
    pub title: String,
    pub group: Option<String>,
    pub group_id: Option<i32>,
    pub rrule: String,
    pub time_zone: String,
    #[schema(value_type = String)]
    pub start: Option<NaiveDateTime>,
    #[schema(value_type = String)]
    pub end: Option<NaiveDateTime>,
    /// Occurrences not held: in the past when it was made, skipped by its creator,
    /// or left out for conflicts.
    pub skipped: Vec<DateTime<Utc>>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub removed_at: Option<DateTime<Utc>>,
    pub occurrences: Vec<Occurrence>,
}

async fn view(
    state: &AppState,
    h: HoldRow,
    rows: Vec<OccurrenceRow>,
) -> Result<Reservation, ApiError> {
    let group = match h.group_id {
        Some(g) => store::group_name(&state.pool, g).await?,
        None => None,
    };
    Ok(Reservation {
        id: h.id,
        model: h.model,
        units: u32::try_from(h.units).unwrap_or(0),
        title: h.title,
        group,
        group_id: h.group_id,
        rrule: h.rrule.unwrap_or_default(),
        time_zone: h.time_zone.unwrap_or_default(),
        start: h.local_start,
        end: h.local_end,
        skipped: h.skipped,
        created_by: h.created_by,
        created_at: h.created_at,
        removed_at: h.removed_at,
        occurrences: rows
            .into_iter()
            .map(|r| Occurrence {
                booking_id: r.booking_id,
                start: r.start_at,
                end: r.end_at,
                cancelled: r.cancelled_at.is_some(),
            })
            .collect(),
    })
}

/// Admins, and owners of the group.
async fn require_owner(
    state: &AppState,
    caller: &Caller,
    group_id: Option<i32>,
) -> Result<(), ApiError> {
    if caller.require_admin().is_ok() {
        return Ok(());
    }
    match group_id {
        Some(g) if crate::store::groups::is_owner(&state.pool, g, caller.user.as_str()).await? => {
            Ok(())
        }
        _ => Err(ApiError::Forbidden(
            "this needs the admin role or to own the reservation's group".into(),
        )),
    }
}

#[utoipa::path(post, path = "/api/v1/reservations", tag = "reservations", request_body = NewReservation,
    description = "Reserves `units` of `model` for `group` at each occurrence of `rrule` (wall-clock times in \
                   `time_zone`; daylight-saving changes keep them: a time that occurs twice is the first, one that \
                   does not occur reads with the offset before the gap, RFC 5545 3.3.5). Every occurrence is held \
                   now, as a booking is; the rule must end (COUNT or UNTIL), give at most 400 occurrences, none \
                   overlapping another, none starting beyond the booking horizon. Occurrences already over are \
                   left out. One that does not fit refuses the whole (409, naming it and the maintenance window or \
                   reservation in its way), unless `skip_conflicts`. An admin, or an owner of the group.",
    responses((status = 201, body = Reservation), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody),
              (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    Json(body): Json<NewReservation>,
) -> Result<(StatusCode, axum::Json<Reservation>), ApiError> {
    let group_id = store::group_id(&state.pool, &body.group)
        .await?
        .ok_or_else(|| ApiError::Invalid(format!("no group {:?}", body.group)))?;
    require_owner(&state, &caller, Some(group_id)).await?;
    let title = check_title("title", &body.title)?;
    // A reservation's times are the lab's (`--time-zone`) unless it names a zone.
    let zone = crate::extract::time_zone_or(state.policy.zone, body.time_zone.as_deref())?;
    if body.rrule.len() > 1000 {
        return Err(ApiError::Invalid("rrule: at most 1000 characters".into()));
    }
    let schedule = Schedule {
        rule: body.rrule.trim().to_owned(),
        zone,
        local_start: body.start,
        local_end: body.end,
    };
    let all = recurrence::occurrences(&schedule).map_err(|e| ApiError::Invalid(e.to_string()))?;
    let now = state.clock.now();
    let mut skipped = Vec::new();
    let mut windows: Vec<Window> = Vec::new();
    let mut unmatched: Vec<NaiveDateTime> = body.skip.clone();
    for w in all {
        let local = w.start().with_timezone(&zone).naive_local();
        if let Some(i) = unmatched.iter().position(|s| *s == local) {
            unmatched.swap_remove(i);
            skipped.push(w.start());
        } else if w.end() <= now {
            skipped.push(w.start());
        } else {
            windows.push(w);
        }
    }
    if let Some(s) = unmatched.first() {
        return Err(ApiError::Invalid(format!(
            "skip: {s} is not an occurrence's start"
        )));
    }
    if let Some(w) = windows
        .iter()
        .find(|w| w.start() - now > state.policy.max_ahead)
    {
        return Err(ApiError::Rule(Refusal::new(
            RuleCode::TooFarAhead,
            format!(
                "The occurrence at {} starts beyond the booking horizon ({}).",
                rfc3339(w.start()),
                rfc3339(now + state.policy.max_ahead)
            ),
        )));
    }
    if windows.is_empty() {
        return Err(ApiError::Invalid("no occurrence is left to hold".into()));
    }
    let made = store::create(
        &state.pool,
        now,
        NewHold {
            kind: HoldKind::Course,
            model: &body.model,
            units: Some(body.units),
            title: &title,
            group_id: Some(group_id),
            windows,
            schedule: Some(&schedule),
            skipped,
            skip_conflicts: body.skip_conflicts,
            actor: caller.user.as_str(),
        },
    )
    .await?;
    match made {
        Made::Created(h, rows) => Ok((
            StatusCode::CREATED,
            axum::Json(view(&state, *h, rows).await?),
        )),
        // Only maintenance windows list what is in their way.
        Made::InTheWay(_) => Err(ApiError::Internal(anyhow::anyhow!(
            "a reservation listed bookings in its way"
        ))),
    }
}

#[utoipa::path(get, path = "/api/v1/reservations", tag = "reservations",
    description = "Course reservations not removed with an occurrence that has not ended, with their occurrences.",
    responses((status = 200, body = [Reservation])), security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    _caller: Caller,
) -> Result<axum::Json<Vec<Reservation>>, ApiError> {
    let mut out = Vec::new();
    for h in store::list(&state.pool, HoldKind::Course, state.clock.now()).await? {
        let rows = store::occurrences(&state.pool, h.id).await?;
        out.push(view(&state, h, rows).await?);
    }
    Ok(axum::Json(out))
}

#[utoipa::path(get, path = "/api/v1/reservations/{id}", tag = "reservations", params(("id" = i64, Path)),
    responses((status = 200, body = Reservation), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get(
    State(state): State<AppState>,
    _caller: Caller,
    Path(id): Path<i64>,
) -> Result<axum::Json<Reservation>, ApiError> {
    let h = store::get(&state.pool, HoldKind::Course, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no reservation {id}")))?;
    let rows = store::occurrences(&state.pool, id).await?;
    Ok(axum::Json(view(&state, h, rows).await?))
}

#[utoipa::path(delete, path = "/api/v1/reservations/{id}", tag = "reservations", params(("id" = i64, Path)),
    description = "Removes a reservation: its occurrences to come are cancelled, one that runs ends now. An admin, \
                   or an owner of the group.",
    responses((status = 200, body = Reservation), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn remove(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
) -> Result<axum::Json<Reservation>, ApiError> {
    let h = store::get(&state.pool, HoldKind::Course, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no reservation {id}")))?;
    require_owner(&state, &caller, h.group_id).await?;
    let now = state.clock.now();
    let model = remove_hold(&state, &caller, HoldKind::Course, id, now).await?;
    crate::store::waitlist::after_freeing(&state.pool, &state.policy, now, &model).await;
    get(State(state), caller, Path(id)).await
}

#[utoipa::path(delete, path = "/api/v1/reservations/{id}/occurrences/{start}", tag = "reservations",
    params(("id" = i64, Path), ("start" = String, Path, description = "The occurrence's start, RFC 3339")),
    description = "Cancels one occurrence (a holiday): its units are free again (one that runs ends now). An admin, \
                   or an owner of the group.",
    responses((status = 200, body = Reservation), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn cancel_occurrence(
    State(state): State<AppState>,
    caller: Caller,
    Path((id, start)): Path<(i64, DateTime<Utc>)>,
) -> Result<axum::Json<Reservation>, ApiError> {
    let h = store::get(&state.pool, HoldKind::Course, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no reservation {id}")))?;
    require_owner(&state, &caller, h.group_id).await?;
    let rows = store::occurrences(&state.pool, id).await?;
    let row = rows.iter().find(|r| r.start_at == start).ok_or_else(|| {
        ApiError::NotFound(format!(
            "reservation {id} has no occurrence at {}",
            rfc3339(start)
        ))
    })?;
    let now = state.clock.now();
    bookings::cancel_or_end(&state.pool, row.booking_id, now, caller.user.as_str(), None).await?;
    crate::store::waitlist::after_freeing(&state.pool, &state.policy, now, &h.model).await;
    get(State(state), caller, Path(id)).await
}
