//! `/api/v1/models`: the inventory, its usage, and free units per day.

use axum::extract::State;
use chrono::{DateTime, Datelike, NaiveDate, TimeDelta, Utc};
use gpu_booking_core::lab_days;
use gpu_booking_core::window::Window;
use gpu_booking_core::wire;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{Json, Path, Query};
use crate::routes::maintenance::{resolve, Answer, InTheWay, RoomFor};
use crate::routes::REPORT_YEARS;
use crate::state::AppState;
use crate::store::models::{self, Model, ModelSpec};

/// A model as the API shows it: the store's row, and what follows from it.
fn view(m: Model) -> wire::Model {
    wire::Model {
        free: wire::count(m.free_now()),
        mismatch: m.mismatch(),
        bookable: m.bookable(),
        over_declared: m.over_declared(),
        others_in_use: m.others_in_use.map(wire::count),
        units: wire::count(m.units),
        gpumem_mib: wire::count(m.gpumem_mib),
        in_use: wire::count(m.in_use),
        cards: m.cards.map(wire::count),
        gpumem_unit_mib: m.gpumem_unit_mib.map(wire::count),
        name: m.name,
        position: m.position,
        patterns: m.patterns,
        resource: m.resource,
        usage_reported_at: m.usage_reported_at,
        gpumem_advertised: m.gpumem_advertised,
        other_namespaces: m.other_namespaces,
    }
}

#[utoipa::path(get, path = "/api/v1/models", tag = "models",
    responses((status = 200, body = [wire::Model])), security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    _caller: Caller,
) -> Result<axum::Json<Vec<wire::Model>>, ApiError> {
    let models = models::list(&state.pool).await?;
    Ok(axum::Json(models.into_iter().map(view).collect()))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutModel {
    /// Units (GPUs) of the model: the bookable capacity.
    #[schema(minimum = 0, maximum = 100000)]
    pub units: i32,
    /// Ordered wildcard patterns over product names, e.g. `["*A100*"]`: `*` matches
    /// any run of characters; each pattern printable ASCII (the space included).
    #[serde(default)]
    #[schema(
        max_items = 64,
        min_length = 1,
        max_length = 128,
        pattern = r"^[ -~]+$"
    )]
    pub patterns: Vec<String>,
    /// VRAM budget per pod, MiB.
    #[serde(default)]
    #[schema(minimum = 0)]
    pub gpumem_mib: i32,
    /// Extended resource of this model, e.g. `nvidia.com/a100` (default `nvidia.com/gpu`):
    /// no white space or control character; its length counts UTF-8 bytes.
    #[schema(
        min_length = 1,
        max_length = 253,
        pattern = r"^[^\u0000-\u0020\u007f-\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+$"
    )]
    pub resource: Option<String>,
    /// Order when matching product names (default: after the others).
    pub position: Option<i32>,
    /// Lowering the units below what running or planned bookings hold lists them
    /// first (409 `units_in_use`, nothing changed); sent again with this, they are
    /// cancelled (ended now if they run) as chosen (`"cancel"`, or per booking id;
    /// `"shorten"` does the same here: the fewer units count from now), their users
    /// told, and the units lowered.
    pub resolve: Option<crate::routes::maintenance::Resolve>,
}

#[utoipa::path(put, path = "/api/v1/models/{name}", tag = "models", request_body = PutModel,
    params(("name" = String, Path, min_length = 1, max_length = 63, pattern = r"^[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?$",
            description = "The model's name: lowercase letters `a-z`, digits, `-` and `.`, starting and ending \
                           with a letter or digit (it becomes a Kubernetes label value).")),
    responses((status = 200, body = wire::Model), (status = 403, body = ErrorBody),
        (status = 409, body = crate::routes::maintenance::InTheWay, description = "`units_in_use`: running or planned bookings hold units beyond the new number (the message and `bookings` name them); send again with `resolve`"),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn put(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Json(body): Json<PutModel>,
) -> Result<Answer<wire::Model>, ApiError> {
    caller.require_admin()?;
    // One rule for the admin API and the models declared in the chart's values.
    let name = gpu_booking_core::declared_models::check_model(
        &name,
        body.units,
        &body.patterns,
        body.gpumem_mib,
        body.resource.as_deref(),
    )
    .map_err(ApiError::Invalid)?;
    let now = state.clock.now();
    let resolving = match &body.resolve {
        Some(how) => {
            how.check()?;
            let change = crate::store::holds::Change::Units(body.units);
            crate::store::holds::begin_resolving(&state.pool, name.as_str(), change, now)
                .await?
                .map(|(tx, rows)| (how, tx, rows))
        }
        None => None,
    };
    // Confirmed: the bookings resolved, their users told and the units lowered in
    // one transaction. Otherwise (or when new bookings kept getting in the way of a
    // confirmation) the bookings in the way are listed below and nothing changes.
    let mut tx = match resolving {
        Some((how, mut tx, rows)) => {
            let from_now = Window::new(now, DateTime::<Utc>::MAX_UTC)
                .map_err(|_| ApiError::Internal(anyhow::anyhow!("no window from now")))?;
            let why = format!("{name} going down to {} units", body.units);
            let room = RoomFor {
                window: &from_now,
                why: &why,
                now,
            };
            if let Some(missing) = resolve(&mut tx, &state, &caller, &rows, how, &room).await? {
                tx.rollback().await?;
                let text = format!("{} of them have no choice in \"resolve\".", missing.len());
                return Ok(Answer::InTheWay(InTheWay::with(
                    "units_in_use",
                    text,
                    &missing,
                )));
            }
            tx
        }
        None => state.pool.begin().await?,
    };
    let in_the_way = models::bookings_beyond(&mut tx, name.as_str(), body.units, now).await?;
    if let Some(why) =
        gpu_booking_core::model_units::lowering_refusal(name.as_str(), body.units, &in_the_way)
    {
        tx.rollback().await?;
        let ids: Vec<i64> = in_the_way.iter().map(|b| b.id).collect();
        let rows = crate::store::holds::rows_by_ids(&state.pool, &ids).await?;
        return Ok(Answer::InTheWay(InTheWay::with("units_in_use", why, &rows)));
    }
    let model = models::put(
        &mut tx,
        ModelSpec {
            name: name.as_str(),
            units: body.units,
            patterns: &body.patterns,
            resource: body.resource.as_deref(),
            gpumem_mib: body.gpumem_mib,
            position: body.position,
        },
        now,
        caller.user.as_str(),
        None,
    )
    .await?;
    tx.commit()
        .await
        .map_err(crate::store::bookings::constraint_refusal)?;
    // More units may be what a waiting entry needs.
    crate::store::waitlist::after_freeing(&state.pool, &state.policy, now, name.as_str()).await;
    Ok(Answer::Done(axum::http::StatusCode::OK, view(model)))
}

#[utoipa::path(put, path = "/api/v1/models/{name}/usage", tag = "models", request_body = wire::UsageReport,
    params(("name" = String, Path)),
    responses((status = 200, body = wire::Model), (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn put_usage(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Json(mut body): Json<wire::UsageReport>,
) -> Result<axum::Json<wire::Model>, ApiError> {
    caller.require_service()?;
    if body.in_use < 0
        || body
            .cards
            .is_some_and(|u| !(0..=wire::MAX_REPORTED_CARDS).contains(&u))
    {
        return Err(ApiError::Invalid(
            "in_use and cards must be between 0 and 100000".into(),
        ));
    }
    if body.gpumem_unit_mib.is_some_and(|m| m < 0) {
        return Err(ApiError::Invalid(
            "gpumem_unit_mib must not be negative".into(),
        ));
    }
    if let Some(problem) = body.others_problem() {
        return Err(ApiError::Invalid(problem));
    }
    // Namespaces are recorded with their count, never without it.
    if body.others_in_use.is_none() && !body.other_namespaces.is_empty() {
        return Err(ApiError::Invalid(
            "other_namespaces needs others_in_use".into(),
        ));
    }
    // Shown as a list: each once, in order, whatever the reporter sent.
    body.other_namespaces.sort_unstable();
    body.other_namespaces.dedup();
    // The count's time, not the receipt's: the webhook's lend ledger keeps what it
    // admitted until a count taken after it, however late that count arrives.
    let reported_at = body.reported_at(state.clock.now());
    let model = models::set_usage(&state.pool, &name, &body, reported_at)
        .await?
        .ok_or_else(|| ApiError::unknown_model(&name))?;
    Ok(axum::Json(view(model)))
}

/// The most days one availability answer covers.
pub const MAX_SPAN_DAYS: i64 = 366;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct AvailabilityQuery {
    /// First day (`YYYY-MM-DD`, or an RFC 3339 time: its day in the zone; default
    /// today there) of the lab's time zone (or `time_zone`), in the years 1970 to 9998.
    pub from: Option<String>,
    /// Day after the last (default: 28 days after `from`): 1 to 366 days after
    /// `from`, in the years 1970 to 9998.
    pub to: Option<String>,
    /// IANA time zone whose days to count (default: the lab's, `--time-zone`; the
    /// booking page sends the zone its calendar shows).
    pub time_zone: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DayAvailability {
    /// A day of the lab's time zone (or the query's `time_zone`): from its midnight
    /// to the next (23 or 25 hours where daylight saving changes).
    pub date: NaiveDate,
    /// Units free for the whole day.
    pub free: u32,
    /// Units booked at the busiest instant of the day (bookings, maintenance windows
    /// and course reservations together).
    pub booked: u32,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Availability {
    pub model: String,
    pub units: i32,
    pub days: Vec<DayAvailability>,
}

/// A day of `zone` as the query names it: a date, or an RFC 3339 time's date there.
fn parse_day(s: &str, zone: chrono_tz::Tz) -> Result<NaiveDate, ApiError> {
    let day = NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .or_else(|_| DateTime::parse_from_rfc3339(s).map(|t| t.with_timezone(&zone).date_naive()))
        .map_err(|_| {
            ApiError::BadRequest(format!("{s:?} is neither YYYY-MM-DD nor an RFC 3339 time"))
        })?;
    if !REPORT_YEARS.contains(&day.year()) {
        return Err(ApiError::Invalid(format!(
            "{s:?} is outside the years 1970 to 9998"
        )));
    }
    Ok(day)
}

#[utoipa::path(get, path = "/api/v1/models/{name}/availability", tag = "models",
    description = "Units free per day of the lab's time zone (`--time-zone`, or `time_zone`), each day from \
                   its midnight to the next: the model's units less those held at the day's busiest instant.",
    params(("name" = String, Path), AvailabilityQuery),
    responses((status = 200, body = Availability), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn availability(
    State(state): State<AppState>,
    _caller: Caller,
    Path(name): Path<String>,
    Query(q): Query<AvailabilityQuery>,
) -> Result<axum::Json<Availability>, ApiError> {
    let zone = crate::extract::time_zone_or(state.policy.zone, q.time_zone.as_deref())?;
    let from = match &q.from {
        Some(s) => parse_day(s, zone)?,
        None => state.clock.now().with_timezone(&zone).date_naive(),
    };
    let to = match &q.to {
        Some(s) => parse_day(s, zone)?,
        None => from + TimeDelta::days(28),
    };
    let span = (to - from).num_days();
    if !(1..=MAX_SPAN_DAYS).contains(&span) {
        return Err(ApiError::Invalid(
            "to must be 1 to 366 days after from".into(),
        ));
    }
    let model = models::get(&state.pool, &name)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no model {name:?}")))?;
    let count = usize::try_from(span).unwrap_or(0);
    let windows = lab_days::day_windows(zone, from, count).ok_or_else(|| {
        ApiError::Invalid("the days are outside the times the service keeps".into())
    })?;
    // The store keeps the model's bookings per UTC day: every one the lab days touch.
    let (first, utc_count) = lab_days::utc_days(&windows).unwrap_or((0, 0));
    let (loads, long) = models::day_loads(&state.pool, &model.name, first, utc_count).await?;
    let units = u32::try_from(model.units).unwrap_or(0);
    let days = from
        .iter_days()
        .zip(lab_days::peaks_in_windows(&loads, &long, &windows))
        .map(|(date, peak)| {
            let peak = u32::try_from(peak).unwrap_or(u32::MAX);
            DayAvailability {
                date,
                free: units.saturating_sub(peak),
                booked: peak,
            }
        })
        .collect();
    Ok(axum::Json(Availability {
        model: model.name,
        units: model.units,
        days,
    }))
}
