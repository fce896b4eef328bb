//! `GET /api/v1/admin/usage`: booked versus used, per user, per
//! model, per group or per booking over a period, as JSON or CSV; with the no-shows
//! and the idle bookings, and per group its use against its quota. Admins only.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Datelike, TimeDelta, Utc};
use gpu_booking_core::usage::{csv_field, csv_record, Use, UseStatus, DEFAULT_IDLE_AFTER};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract::Query;
use crate::routes::groups::{usage_of, GroupUsage};
use crate::routes::REPORT_YEARS;
use crate::state::AppState;
use crate::store::groups as group_store;
use crate::store::usage::{self, BookingUse};

/// The longest period one report covers.
pub const MAX_PERIOD_DAYS: i64 = 400;
/// The longest `idle_hours`: two weeks.
pub const MAX_IDLE_HOURS: i64 = 336;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum By {
    #[default]
    User,
    Model,
    /// The group each booking counts against (`booking.group_id`: the group whose
    /// policy applied when it was made), as the quota counts it.
    Group,
    Booking,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    #[default]
    Json,
    Csv,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    /// Start of the period (RFC 3339; default: 30 days before `to`), in the years
    /// 1970 to 9998.
    pub from: Option<DateTime<Utc>>,
    /// End of the period, exclusive (RFC 3339; default: now), in the years 1970 to
    /// 9998: after `from`, and at most 400 days after it.
    pub to: Option<DateTime<Utc>>,
    /// Rows per `user` (default), per `model`, per `group` (with each group's use
    /// against its quota), or per `booking`.
    #[param(inline)]
    pub by: Option<By>,
    /// `json` (default) or `csv` (RFC 4180, with a header row).
    #[param(inline)]
    pub format: Option<Format>,
    /// Hours without GPU activity after which a running booking counts as idle (and
    /// one never used as a no-show); default 4, 1 to 336.
    #[param(minimum = 1, maximum = 336)]
    pub idle_hours: Option<i64>,
}

/// One row of the report: a user's, a model's, a group's or a booking's totals.
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct UsageRow {
    /// The user, the model, the group (empty: the bookings that count against no
    /// group), or the booking id.
    pub key: String,
    pub bookings: u64,
    /// GPU-hours booked within the period (whole windows, planned ones too).
    pub booked_gpu_hours: f64,
    /// GPU-hours that the bookings' pods held, up to now.
    pub held_gpu_hours: f64,
    /// GPU-hours that the bookings' GPUs were active, up to now.
    pub active_gpu_hours: f64,
    /// Bookings started and never held by a pod.
    pub no_shows: u64,
    /// Bookings running and idle now.
    pub idle: u64,
    /// Per group only: the group's use against its quota as
    /// `GET /api/v1/groups/{name}/usage` answers it, at the report's last instant
    /// (just before `to`): the quota period that contains it, the GPU-hours used and
    /// left there, the units held at that instant and at most from it on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota_use: Option<GroupUsage>,
}

/// One booking's figures.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BookingUseView {
    pub id: i64,
    pub user: String,
    pub model: String,
    pub units: i32,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub booked_gpu_hours: f64,
    pub held_gpu_hours: f64,
    pub active_gpu_hours: f64,
    /// The last GPU activity seen.
    pub last_active: Option<DateTime<Utc>>,
    /// `planned`, `no_show`, `idle`, `running` or `ended`.
    #[schema(value_type = String)]
    pub status: UseStatus,
    /// For an idle booking: since when.
    pub idle_since: Option<DateTime<Utc>>,
}

/// The booked-versus-used report: per user, model or booking, the GPU time booked
/// and used in a period.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BookingUseReport {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub by: By,
    pub generated_at: DateTime<Utc>,
    pub idle_hours: i64,
    /// Totals per user, model or booking, by key; per group, in the admin's order
    /// (every group, with its quota use), then the bookings of no group.
    pub rows: Vec<UsageRow>,
    /// Totals of every row.
    pub total: UsageRow,
    /// Every booking in the period (not cancelled), by id.
    pub bookings: Vec<BookingUseView>,
    /// Bookings with status `no_show`.
    pub no_shows: Vec<BookingUseView>,
    /// Bookings with status `idle`.
    pub idle: Vec<BookingUseView>,
}

#[utoipa::path(get, path = "/api/v1/admin/usage", tag = "usage", params(UsageQuery),
    description = "Booked versus used over a period (admins): per user, model, group or booking, the GPU-hours \
                   booked, held by a pod (the controller's reports) and active (the node agent's); the \
                   no-shows (started, never held) and the idle bookings (running, no GPU activity for \
                   `idle_hours`). Per group (the group each booking counts against), each group's use \
                   against its quota too, as `GET /api/v1/groups/{name}/usage` answers it for the \
                   report's last instant. `format=csv` answers `text/csv` (RFC 4180, a header row; text a \
                   spreadsheet would run as a formula is prefixed with `'`).",
    responses(
        (status = 200, description = "The report", content(
            (BookingUseReport = "application/json"),
            (String = "text/csv"))),
        (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<UsageQuery>,
) -> Result<Response, ApiError> {
    caller.require_admin()?;
    let now = state.clock.now();
    let to = q.to.unwrap_or(now);
    let from = match q.from {
        Some(from) => from,
        None => to
            .checked_sub_signed(TimeDelta::days(30))
            .unwrap_or(DateTime::<Utc>::MIN_UTC),
    };
    for t in [from, to] {
        if !REPORT_YEARS.contains(&t.year()) {
            return Err(ApiError::Invalid(format!(
                "{} is outside the years 1970 to 9998",
                time(t)
            )));
        }
    }
    if from >= to {
        return Err(ApiError::Invalid("`from` must be before `to`".into()));
    }
    if to - from > TimeDelta::days(MAX_PERIOD_DAYS) {
        return Err(ApiError::Invalid(format!(
            "a report covers at most {MAX_PERIOD_DAYS} days"
        )));
    }
    let idle_hours = q.idle_hours.unwrap_or(DEFAULT_IDLE_AFTER.num_hours());
    if !(1..=MAX_IDLE_HOURS).contains(&idle_hours) {
        return Err(ApiError::Invalid(
            "idle_hours must be between 1 and 336".into(),
        ));
    }
    let by = q.by.unwrap_or_default();
    let rows = usage::bookings(&state.pool, from, to, now).await?;
    let group_of = match by {
        By::Group => {
            let ids: Vec<i64> = rows.iter().map(|b| b.id).collect();
            usage::groups_of(&state.pool, &ids).await?
        }
        _ => BTreeMap::new(),
    };
    let mut report = build(
        from,
        to,
        by,
        now,
        idle_hours,
        rows.into_iter().map(|b| view(b, now, idle_hours)).collect(),
        |b| match by {
            By::User => b.user.clone(),
            By::Model => b.model.clone(),
            By::Group => group_of.get(&b.id).cloned().unwrap_or_default(),
            By::Booking => b.id.to_string(),
        },
    );
    if by == By::Group {
        report.rows = with_quotas(&state, to, std::mem::take(&mut report.rows)).await?;
    }
    Ok(match q.format.unwrap_or_default() {
        Format::Json => axum::Json(report).into_response(),
        Format::Csv => (
            [
                (
                    header::CONTENT_TYPE,
                    "text/csv; charset=utf-8; header=present",
                ),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"gpu-usage.csv\"",
                ),
            ],
            csv(&report),
        )
            .into_response(),
    })
}

fn view(b: BookingUse, now: DateTime<Utc>, idle_hours: i64) -> BookingUseView {
    let u = Use {
        start: b.start_at,
        end: b.end_at,
        ever_held: b.ever_held,
        last_active: b.last_active,
    };
    let status = u.status(now, TimeDelta::hours(idle_hours));
    BookingUseView {
        id: b.id,
        user: b.user_name,
        model: b.model,
        units: b.units,
        start: b.start_at,
        end: b.end_at,
        booked_gpu_hours: round(b.booked_gpu_hours),
        held_gpu_hours: round(b.held_gpu_hours),
        active_gpu_hours: round(b.active_gpu_hours),
        last_active: b.last_active,
        idle_since: (status == UseStatus::Idle || (status == UseStatus::NoShow && now < b.end_at))
            .then(|| u.idle_since()),
        status,
    }
}

/// Hours to the nearest thousandth (3.6 s): no float noise in the report.
fn round(h: f64) -> f64 {
    (h * 1000.0).round() / 1000.0
}

/// Per group: a row for every group in the admin's order, each with its use
/// against its quota (from the code that answers `/groups/{name}/usage`, so that
/// the two never differ), then the rows of bookings whose group is none (or gone).
async fn with_quotas(
    state: &AppState,
    to: DateTime<Utc>,
    rows: Vec<UsageRow>,
) -> Result<Vec<UsageRow>, ApiError> {
    // The report's last instant: a report to a month's first midnight is about the
    // month before, and so is its quota period.
    let last = to
        .checked_sub_signed(TimeDelta::microseconds(1))
        .unwrap_or(to);
    let mut by_key: BTreeMap<String, UsageRow> =
        rows.into_iter().map(|r| (r.key.clone(), r)).collect();
    let mut out = Vec::with_capacity(by_key.len());
    for g in group_store::list(&state.pool).await? {
        let mut row = by_key.remove(&g.row.name).unwrap_or_else(|| UsageRow {
            key: g.row.name.clone(),
            ..UsageRow::default()
        });
        row.quota_use = Some(usage_of(state, &g, last, true).await?);
        out.push(row);
    }
    out.extend(by_key.into_values());
    Ok(out)
}

fn build(
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    by: By,
    now: DateTime<Utc>,
    idle_hours: i64,
    bookings: Vec<BookingUseView>,
    key_of: impl Fn(&BookingUseView) -> String,
) -> BookingUseReport {
    let mut groups: BTreeMap<String, UsageRow> = BTreeMap::new();
    let mut total = UsageRow {
        key: "total".into(),
        ..UsageRow::default()
    };
    for b in &bookings {
        let key = key_of(b);
        let row = groups.entry(key.clone()).or_insert_with(|| UsageRow {
            key,
            ..UsageRow::default()
        });
        for r in [row, &mut total] {
            r.bookings += 1;
            r.booked_gpu_hours += b.booked_gpu_hours;
            r.held_gpu_hours += b.held_gpu_hours;
            r.active_gpu_hours += b.active_gpu_hours;
            r.no_shows += u64::from(b.status == UseStatus::NoShow);
            r.idle += u64::from(b.status == UseStatus::Idle);
        }
    }
    let mut rows: Vec<UsageRow> = groups.into_values().collect();
    if by == By::Booking {
        rows.sort_by_key(|r| r.key.parse::<i64>().unwrap_or(i64::MAX));
    }
    for r in rows.iter_mut().chain(std::iter::once(&mut total)) {
        r.booked_gpu_hours = round(r.booked_gpu_hours);
        r.held_gpu_hours = round(r.held_gpu_hours);
        r.active_gpu_hours = round(r.active_gpu_hours);
    }
    let pick = |s: UseStatus| -> Vec<BookingUseView> {
        bookings.iter().filter(|b| b.status == s).cloned().collect()
    };
    BookingUseReport {
        from,
        to,
        by,
        generated_at: now,
        idle_hours,
        rows,
        total,
        no_shows: pick(UseStatus::NoShow),
        idle: pick(UseStatus::Idle),
        bookings,
    }
}

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The report as CSV: per user, model or group, one row each (per group with its
/// quota use, empty where a figure is none); per booking, the booking's own figures.
/// Every text field through [`csv_field`].
fn csv(r: &BookingUseReport) -> String {
    let mut out = String::new();
    if r.by == By::Booking {
        out.push_str(&csv_record([
            "id",
            "user",
            "model",
            "units",
            "start",
            "end",
            "booked_gpu_hours",
            "held_gpu_hours",
            "active_gpu_hours",
            "last_active",
            "status",
        ]));
        for b in &r.bookings {
            out.push_str(&csv_record([
                b.id.to_string(),
                csv_field(&b.user),
                csv_field(&b.model),
                b.units.to_string(),
                time(b.start),
                time(b.end),
                b.booked_gpu_hours.to_string(),
                b.held_gpu_hours.to_string(),
                b.active_gpu_hours.to_string(),
                b.last_active.map(time).unwrap_or_default(),
                b.status.as_str().to_owned(),
            ]));
        }
        return out;
    }
    let key = match r.by {
        By::User => "user",
        By::Model => "model",
        _ => "group",
    };
    let mut header = vec![
        key,
        "bookings",
        "booked_gpu_hours",
        "held_gpu_hours",
        "active_gpu_hours",
        "no_shows",
        "idle",
    ];
    if r.by == By::Group {
        header.extend(QUOTA_COLUMNS);
    }
    out.push_str(&csv_record(header));
    for row in &r.rows {
        let mut fields = vec![
            csv_field(&row.key),
            row.bookings.to_string(),
            row.booked_gpu_hours.to_string(),
            row.held_gpu_hours.to_string(),
            row.active_gpu_hours.to_string(),
            row.no_shows.to_string(),
            row.idle.to_string(),
        ];
        if r.by == By::Group {
            fields.extend(quota_fields(row.quota_use.as_ref()));
        }
        out.push_str(&csv_record(fields));
    }
    out
}

/// The CSV's columns of a group's quota use.
const QUOTA_COLUMNS: [&str; 8] = [
    "quota_period",
    "quota_period_start",
    "quota_period_end",
    "quota_gpu_hours",
    "quota_used_gpu_hours",
    "quota_left_gpu_hours",
    "quota_units",
    "quota_units_now",
];

/// A row's [`QUOTA_COLUMNS`]: empty where there is no figure (no quota, no period,
/// or the bookings of no group).
fn quota_fields(u: Option<&GroupUsage>) -> [String; 8] {
    let Some(u) = u else {
        return Default::default();
    };
    let text = |n: Option<String>| n.unwrap_or_default();
    [
        text(u.period.as_deref().map(csv_field)),
        text(u.period_start.map(time)),
        text(u.period_end.map(time)),
        text(u.quota.gpu_hours.map(|h| h.to_string())),
        u.used_gpu_hours.to_string(),
        text(u.left_gpu_hours.map(|h| h.to_string())),
        text(u.quota.units.map(|n| n.to_string())),
        u.units_now.to_string(),
    ]
}
