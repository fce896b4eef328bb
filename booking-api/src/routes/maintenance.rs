//! `/api/v1/maintenance`: an admin blocks some or all units of a model for a window
//! (`core::holds`). Bookings in the way are listed first (409, nothing changed); sent
//! again with `resolve`, they are shortened or cancelled as chosen, their users told,
//! and the window written, all in one transaction. Lowering a model's units (`PUT /api/v1/models/{name}`)
//! resolves the bookings in its way the same way ([`resolve`]).

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use gpu_booking_core::holds::{self, Choice, HoldKind, HoldRef, Resolution};
use gpu_booking_core::notice::{Message, NoticeKind};
use gpu_booking_core::rules::rfc3339;
use gpu_booking_core::window::Window;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::{Postgres, Transaction};
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{Json, Path};
use crate::state::AppState;
use crate::store::bookings::{self, WindowRequest};
use crate::store::holds::{self as store, HoldRow, InTheWayRow, Made, NewHold, OccurrenceRow};

/// What to do with the bookings in the way: one choice for all (`"shorten"` or
/// `"cancel"`), or one per booking id (`{"12": "shorten", "14": "cancel"}`).
/// Shortening ends a booking where the window starts; one that starts inside the
/// window, or runs when the window has begun, can only be cancelled (ended now).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Resolve {
    #[schema(example = "shorten")]
    All(String),
    Each(BTreeMap<String, String>),
}

impl Resolve {
    /// The choice for booking `id`, `None` when the request names none for it.
    fn choice(&self, id: i64) -> Result<Option<Choice>, ApiError> {
        let text = match self {
            Resolve::All(c) => Some(c.as_str()),
            Resolve::Each(m) => m.get(&id.to_string()).map(String::as_str),
        };
        text.map(|t| {
            Choice::parse(t).ok_or_else(|| {
                ApiError::Invalid(format!(
                    "resolve: {t:?} is neither \"shorten\" nor \"cancel\""
                ))
            })
        })
        .transpose()
    }

    pub fn check(&self) -> Result<(), ApiError> {
        let ok = match self {
            Resolve::All(c) => Choice::parse(c).is_some(),
            Resolve::Each(m) => m
                .iter()
                .all(|(id, c)| id.parse::<i64>().is_ok() && Choice::parse(c).is_some()),
        };
        if ok {
            Ok(())
        } else {
            Err(ApiError::Invalid(
                "resolve: give \"shorten\" or \"cancel\", or an object of booking ids to either"
                    .into(),
            ))
        }
    }
}

/// A booking in the way, as the 409 lists it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct InTheWayBooking {
    pub id: i64,
    pub user: String,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub units: u32,
    /// Set when the row is another hold's (a course occurrence, another window).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold: Option<i64>,
}

/// The 409 answer of a change that bookings are in the way of: nothing was changed;
/// send it again with `resolve` to shorten or cancel them.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct InTheWay {
    /// `bookings_in_the_way`.
    pub error: String,
    pub message: String,
    pub bookings: Vec<InTheWayBooking>,
}

impl InTheWay {
    pub fn new(what: &str, rows: &[InTheWayRow]) -> InTheWay {
        let message = format!(
            "{} booking{} in the way of {what}: send the request again with \"resolve\" \
             (\"shorten\" or \"cancel\", for all or per booking id) to shorten or cancel them.",
            rows.len(),
            if rows.len() == 1 { " is" } else { "s are" }
        );
        InTheWay::with("bookings_in_the_way", message, rows)
    }

    /// With its own code and sentence (`units_in_use` keeps its words).
    pub fn with(error: &str, message: String, rows: &[InTheWayRow]) -> InTheWay {
        InTheWay {
            error: error.into(),
            message,
            bookings: rows
                .iter()
                .map(|r| InTheWayBooking {
                    id: r.id,
                    user: r.user_name.clone(),
                    start: r.start_at,
                    end: r.end_at,
                    units: u32::try_from(r.units).unwrap_or(0),
                    hold: r.hold_id,
                })
                .collect(),
        }
    }
}

/// An answer that is either the thing asked for or the bookings in its way.
pub enum Answer<T> {
    Done(StatusCode, T),
    InTheWay(InTheWay),
}

impl<T: Serialize> IntoResponse for Answer<T> {
    fn into_response(self) -> Response {
        match self {
            Answer::Done(status, body) => (status, axum::Json(body)).into_response(),
            Answer::InTheWay(body) => (StatusCode::CONFLICT, axum::Json(body)).into_response(),
        }
    }
}

/// The change that resolved bookings make room for.
pub struct RoomFor<'a> {
    /// The maintenance window; for a lowering of units, from now on.
    pub window: &'a Window,
    /// As the users' notices say it ("maintenance of a100 (driver upgrade)").
    pub why: &'a str,
    pub now: DateTime<Utc>,
}

/// Shortens or cancels each of `rows` as `resolve` chooses, for the change `room`
/// says, and tells their users why (`booking_changed_by_admin`). `None` when every
/// row had a choice; the rows without one otherwise, and nothing was changed.
///
/// All in the caller's transaction (`store::holds::begin_resolving`, which holds the
/// locks of the rows' groups and users and the model's, in that order), in which the
/// caller then writes its change and commits once: every booking is resolved and
/// the change made, or nothing is.
pub async fn resolve(
    tx: &mut Transaction<'_, Postgres>,
    state: &AppState,
    caller: &Caller,
    rows: &[InTheWayRow],
    how: &Resolve,
    room: &RoomFor<'_>,
) -> Result<Option<Vec<InTheWayRow>>, ApiError> {
    let mut plan = Vec::new();
    let mut missing = Vec::new();
    for r in rows {
        match how.choice(r.id)? {
            Some(choice) => plan.push((r, choice)),
            None => missing.push(r.clone()),
        }
    }
    if !missing.is_empty() {
        return Ok(Some(missing));
    }
    let (actor, now, why) = (caller.user.as_str(), room.now, room.why);
    for (r, choice) in plan {
        let Ok(booking) = Window::new(r.start_at, r.end_at) else {
            continue;
        };
        let outcome = match holds::resolution(choice, &booking, room.window, now) {
            Resolution::EndAt(end) => {
                let change = WindowRequest {
                    start: None,
                    end,
                    override_rules: true,
                };
                bookings::change_window_in(tx, &state.policy, r.id, now, change, actor, None)
                    .await
                    .map(|_| format!("now ends at {}", rfc3339(end)))
            }
            Resolution::CancelOrEnd => bookings::cancel_or_end_in(tx, r.id, now, actor, None)
                .await
                .map(|b| {
                    if b.cancelled_at.is_some() {
                        "was cancelled".to_owned()
                    } else {
                        "was ended now".to_owned()
                    }
                }),
        };
        let outcome = match outcome {
            Ok(o) => o,
            // Ended or cancelled already: out of the way (the refusal wrote nothing).
            Err(crate::store::StoreError::Conflict(_)) => continue,
            Err(e) => return Err(e.into()),
        };
        if HoldRef::from_user(&r.user_name).is_some() {
            continue;
        }
        let message = Message {
            title: "An admin changed your booking".into(),
            text: format!(
                "Your booking {} ({} to {}) {outcome} to make room for {why}.",
                r.id,
                rfc3339(r.start_at),
                rfc3339(r.end_at)
            ),
        };
        let key = format!("admin-change:{}:{}", r.id, now.timestamp_micros());
        crate::notices::enqueue(
            tx,
            state.notices,
            crate::notices::NewNotice {
                key: &key,
                user: &r.user_name,
                kind: NoticeKind::BookingChangedByAdmin,
                booking_id: Some(r.id),
                audit_id: None,
                message,
                details: json!({ "why": why, "outcome": outcome }),
            },
            now,
        )
        .await?;
    }
    Ok(None)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewMaintenance {
    /// The model, e.g. `a100`.
    pub model: String,
    /// Units blocked (default: all of the model's, at most 64).
    #[schema(minimum = 1, maximum = 64)]
    pub units: Option<u32>,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// Why, as users will read it ("driver upgrade").
    #[schema(min_length = 1, max_length = 200)]
    pub reason: String,
    /// On confirmation: what to do with the bookings in the way (see [`Resolve`]).
    pub resolve: Option<Resolve>,
}

/// A maintenance window.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Maintenance {
    pub id: i64,
    pub model: String,
    pub units: u32,
    pub reason: String,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// The booking row that holds its units (in the booking change stream, its user
    /// is the window's own, `" maintenance <id>"`).
    pub booking_id: Option<i64>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub removed_at: Option<DateTime<Utc>>,
}

fn view(h: HoldRow, rows: &[OccurrenceRow]) -> Maintenance {
    let row = rows.first();
    Maintenance {
        id: h.id,
        model: h.model,
        units: u32::try_from(h.units).unwrap_or(0),
        reason: h.title,
        start: row.map_or(h.created_at, |r| r.start_at),
        end: row.map_or(h.created_at, |r| r.end_at),
        booking_id: row.map(|r| r.booking_id),
        created_by: h.created_by,
        created_at: h.created_at,
        removed_at: h.removed_at,
    }
}

/// The longest reason (characters) and title of a hold.
pub const MAX_TITLE_CHARS: usize = 200;

/// A hold's title as given: 1 to 200 characters, no control character.
pub fn check_title(what: &str, title: &str) -> Result<String, ApiError> {
    let t = title.trim();
    if t.is_empty() || t.chars().count() > MAX_TITLE_CHARS || t.chars().any(char::is_control) {
        return Err(ApiError::Invalid(format!(
            "{what}: 1 to {MAX_TITLE_CHARS} characters without control characters"
        )));
    }
    Ok(t.to_owned())
}

#[utoipa::path(post, path = "/api/v1/maintenance", tag = "maintenance", request_body = NewMaintenance,
    description = "Blocks `units` (default all) of `model` from `start` to `end`: no booking or course \
                   reservation gets them meanwhile (refused with rule `maintenance`, naming the window), and the \
                   webhook lends none of them. Bookings in the way are listed first (409 \
                   `bookings_in_the_way`, nothing changed); sent again with `resolve`, they are shortened or \
                   cancelled as chosen, their users get a `booking_changed_by_admin` notice, and the window is \
                   written. Admins only.",
    responses((status = 201, body = Maintenance), (status = 403, body = ErrorBody),
              (status = 409, body = InTheWay, description = "`bookings_in_the_way`: the bookings listed hold units the window needs"),
              (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    Json(body): Json<NewMaintenance>,
) -> Result<Answer<Maintenance>, ApiError> {
    caller.require_admin()?;
    let reason = check_title("reason", &body.reason)?;
    let window = Window::new(body.start, body.end)
        .map_err(|_| ApiError::Invalid("the window must end after it starts".into()))?;
    if !(gpu_booking_core::rules::in_supported_range(body.start)
        && gpu_booking_core::rules::in_supported_range(body.end))
    {
        return Err(ApiError::Invalid(
            "the window must lie in the years 1970 to 9999".into(),
        ));
    }
    let now = state.clock.now();
    if body.end <= now {
        return Err(ApiError::Invalid("the window is over already".into()));
    }
    if let Some(r) = &body.resolve {
        r.check()?;
    }
    let why = format!("maintenance of {} ({reason})", body.model);
    let new_hold = || NewHold {
        kind: HoldKind::Maintenance,
        model: &body.model,
        units: body.units,
        title: &reason,
        group_id: None,
        windows: vec![window],
        schedule: None,
        skipped: Vec::new(),
        skip_conflicts: false,
        actor: caller.user.as_str(),
    };
    let done = |h: Box<HoldRow>, rows: Vec<OccurrenceRow>| {
        Ok(Answer::Done(StatusCode::CREATED, view(*h, &rows)))
    };
    let listed = |rows: &[InTheWayRow]| {
        Ok(Answer::InTheWay(InTheWay::new(
            "the maintenance window",
            rows,
        )))
    };
    let change = store::Change::Window {
        window: &window,
        units: body.units,
    };
    let resolving = match &body.resolve {
        Some(how) => store::begin_resolving(&state.pool, &body.model, change, now)
            .await?
            .map(|(tx, rows)| (how, tx, rows)),
        None => None,
    };
    // Without a confirmation (or when new bookings kept getting in the way of one):
    // the window, or the bookings in its way listed and nothing changed.
    let Some((how, mut tx, rows)) = resolving else {
        return match store::create(&state.pool, now, new_hold()).await? {
            Made::Created(h, rows) => done(h, rows),
            Made::InTheWay(rows) => listed(&rows),
        };
    };
    let room = RoomFor {
        window: &window,
        why: &why,
        now,
    };
    // One transaction: the bookings resolved, their users told and the window
    // written commit together, or none of it does.
    if let Some(missing) = resolve(&mut tx, &state, &caller, &rows, how, &room).await? {
        tx.rollback().await?;
        return listed(&missing);
    }
    match store::create_in(&mut tx, now, new_hold()).await? {
        Made::Created(h, rows) => {
            tx.commit().await.map_err(bookings::constraint_refusal)?;
            done(h, rows)
        }
        Made::InTheWay(rows) => {
            tx.rollback().await?;
            listed(&rows)
        }
    }
}

#[utoipa::path(get, path = "/api/v1/maintenance", tag = "maintenance",
    description = "Maintenance windows not removed that have not ended, first starting first.",
    responses((status = 200, body = [Maintenance])), security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    _caller: Caller,
) -> Result<axum::Json<Vec<Maintenance>>, ApiError> {
    let now = state.clock.now();
    let mut out = Vec::new();
    for h in store::list(&state.pool, HoldKind::Maintenance, now).await? {
        let rows = store::occurrences(&state.pool, h.id).await?;
        out.push(view(h, &rows));
    }
    Ok(axum::Json(out))
}

#[utoipa::path(delete, path = "/api/v1/maintenance/{id}", tag = "maintenance",
    description = "Removes a maintenance window: its units are free again from now (one that runs ends now). Admins only.",
    params(("id" = i64, Path)),
    responses((status = 200, body = Maintenance), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn remove(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
) -> Result<axum::Json<Maintenance>, ApiError> {
    caller.require_admin()?;
    let now = state.clock.now();
    let model = remove_hold(&state, &caller, HoldKind::Maintenance, id, now).await?;
    let hold = store::get(&state.pool, HoldKind::Maintenance, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no maintenance window {id}")))?;
    let rows = store::occurrences(&state.pool, id).await?;
    crate::store::waitlist::after_freeing(&state.pool, &state.policy, now, &model).await;
    Ok(axum::Json(view(hold, &rows)))
}

/// Marks a hold removed and cancels or ends its rows that are not over, all in one
/// transaction (`store::holds::remove`); its model.
pub async fn remove_hold(
    state: &AppState,
    caller: &Caller,
    kind: HoldKind,
    id: i64,
    now: DateTime<Utc>,
) -> Result<String, ApiError> {
    store::remove(&state.pool, kind, id, now, caller.user.as_str())
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no {} {id}", kind.as_str())))
}
