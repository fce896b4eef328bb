//! Calendar feeds (RFC 5545): a user's own bookings and a model's occupancy, opened by
//! a per-user feed token in the URL (calendar apps cannot send a bearer token), and
//! the token's issue and revocation.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use gpu_booking_core::feed;
use gpu_booking_core::holds::HoldKind;
use icalendar::{Calendar, Component, Event, EventLike, EventStatus};
use serde::Serialize;
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract::Path;
use crate::state::AppState;
use crate::store::feeds::{self, FeedBooking};
use crate::store::models;

/// The product identifier of the feeds (RFC 5545, 3.7.3).
const PRODID: &str = "-//gpu-booking//booking feed//EN";
/// How often calendar apps should fetch a feed again.
const REFRESH: chrono::TimeDelta = chrono::TimeDelta::minutes(15);

#[derive(Debug, Serialize, ToSchema)]
pub struct FeedToken {
    /// Whether the caller has a feed token.
    pub active: bool,
    /// When it was issued.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub issued_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct IssuedFeedToken {
    /// The token: shown this once, kept by the service only as its hash.
    pub token: String,
    pub issued_at: DateTime<Utc>,
    /// The path of the feed of the caller's bookings (prefix the service's URL).
    pub bookings_path: String,
    /// The path of a model's occupancy feed, with `{model}` to fill in.
    pub model_path_template: String,
}

#[utoipa::path(get, path = "/api/v1/me/feed-token", tag = "feeds",
    description = "Whether the caller has a calendar feed token (the token itself is not kept).",
    responses((status = 200, body = FeedToken)), security(("bearer" = [])))]
pub async fn token_status(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<axum::Json<FeedToken>, ApiError> {
    let issued_at = feeds::issued_at(&state.pool, caller.user.as_str()).await?;
    Ok(axum::Json(FeedToken {
        active: issued_at.is_some(),
        issued_at,
    }))
}

#[utoipa::path(post, path = "/api/v1/me/feed-token", tag = "feeds",
    description = "Issues a calendar feed token for the caller, revoking the one before: every feed URL with \
                   the old token answers 404 from now on.",
    responses((status = 201, body = IssuedFeedToken)), security(("bearer" = [])))]
pub async fn issue_token(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<(StatusCode, axum::Json<IssuedFeedToken>), ApiError> {
    let now = state.clock.now();
    let token = feeds::issue(&state.pool, caller.user.as_str(), now).await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(IssuedFeedToken {
            bookings_path: format!("/api/v1/feeds/{token}/bookings.ics"),
            model_path_template: format!("/api/v1/feeds/{token}/models/{{model}}/occupancy.ics"),
            token,
            issued_at: now,
        }),
    ))
}

#[utoipa::path(delete, path = "/api/v1/me/feed-token", tag = "feeds",
    description = "Revokes the caller's calendar feed token (204; 404 when there was none).",
    responses((status = 204), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn revoke_token(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<StatusCode, ApiError> {
    let now = state.clock.now();
    if feeds::revoke(&state.pool, caller.user.as_str(), now).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFound("no feed token to revoke".into()))
    }
}

#[utoipa::path(get, path = "/api/v1/feeds/{token}/bookings.ics", tag = "feeds",
    params(("token" = String, Path, min_length = 64, max_length = 64, pattern = r"^[0-9a-fA-F]{64}$",
            description = "The caller's feed token: 64 hex digits (anything else is 404, as an unknown token is)")),
    description = "The token owner's bookings as an iCalendar feed (`text/calendar`): from 90 days ago to 366 days \
                   ahead, at most 1000 events, times in UTC; cancelled bookings with `STATUS:CANCELLED`. \
                   An unknown or revoked token is 404.",
    responses((status = 200, content_type = "text/calendar", body = String), (status = 404, body = ErrorBody)))]
pub async fn own_feed(
    State(state): State<AppState>,
    Path(token): Path<String>,
) -> Result<Response, ApiError> {
    let user = feed_user(&state, &token).await?;
    let now = state.clock.now();
    let rows = feeds::own(&state.pool, &user, now).await?;
    let events = rows.iter().map(|b| {
        event(
            b,
            &format!("booking-{}@gpu-booking", b.id),
            &feed::own_summary(&b.model, &b.slots),
            &feed::description(b.id, &b.model, &b.slots),
        )
    });
    Ok(calendar(&format!("GPU bookings of {user}"), events))
}

#[utoipa::path(get, path = "/api/v1/feeds/{token}/models/{model}/occupancy.ics", tag = "feeds",
    params(("token" = String, Path, min_length = 64, max_length = 64, pattern = r"^[0-9a-fA-F]{64}$",
            description = "The caller's feed token: 64 hex digits (anything else is 404, as an unknown token is)"),
           ("model" = String, Path)),
    description = "When the units of a model are booked, as an iCalendar feed: one event per booking, naming every \
                   unit it holds (`2 x a100 (#1, #3): booked`); the token owner's own bookings by name, others' only \
                   as `booked` unless the service runs with `--feed-show-names`. Same span and bound as the bookings \
                   feed; 404 for an unknown or revoked token or an unknown model.",
    responses((status = 200, content_type = "text/calendar", body = String), (status = 404, body = ErrorBody)))]
pub async fn model_feed(
    State(state): State<AppState>,
    Path((token, model)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let user = feed_user(&state, &token).await?;
    let model = models::get(&state.pool, &model)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no model {model:?}")))?;
    let now = state.clock.now();
    let rows = feeds::occupancy(&state.pool, &model.name, now).await?;
    let events = rows.iter().map(|b| {
        let hold = b.hold_kind.as_deref().and_then(HoldKind::parse);
        let summary = match (hold, &b.hold_title) {
            (Some(kind), Some(title)) => feed::hold_summary(kind, title, &b.model, &b.slots),
            _ => feed::occupancy_summary(&state.policy, &user, &b.user_name, &b.model, &b.slots),
        };
        let description = match (hold, b.hold_id, &b.hold_title) {
            (Some(kind), Some(id), Some(title)) => {
                feed::hold_description(kind, id, title, &b.model, &b.slots)
            }
            _ => feed::description(b.id, &b.model, &b.slots),
        };
        event(
            b,
            // Not the booking's own UID: the same booking in a user's two feeds is
            // two calendar entries, and a calendar app must not merge them.
            &format!("booking-{}-occupancy@gpu-booking", b.id),
            &summary,
            &description,
        )
    });
    Ok(calendar(&format!("{} occupancy", model.name), events))
}

/// The owner of `token`; 404 (not 401: the URL is the credential, and a revoked
/// feed is gone) for anything else.
async fn feed_user(state: &AppState, token: &str) -> Result<String, ApiError> {
    feeds::user_of(&state.pool, token)
        .await?
        .ok_or_else(|| ApiError::NotFound("no such feed".into()))
}

/// One booking as a VEVENT, one per booking however many units it holds: its
/// SUMMARY and DESCRIPTION name them all. Times are UTC (`...Z`), so no VTIMEZONE is needed;
/// DTSTAMP and LAST-MODIFIED are when the booking last changed, as RFC 5545 (3.8.7.2)
/// asks of a calendar without a METHOD, so an unchanged feed reads the same each time.
fn event(b: &FeedBooking, uid: &str, summary: &str, description: &str) -> Event {
    Event::new()
        .uid(uid)
        .timestamp(b.updated_at)
        .created(b.created_at)
        .last_modified(b.updated_at)
        .starts(b.start_at)
        .ends(b.end_at)
        .summary(summary)
        .description(description)
        .status(if b.cancelled_at.is_some() {
            EventStatus::Cancelled
        } else {
            EventStatus::Confirmed
        })
        .done()
}

fn calendar(name: &str, events: impl Iterator<Item = Event>) -> Response {
    let mut cal = Calendar::empty();
    cal.append_property(("VERSION", "2.0"));
    cal.append_property(("PRODID", PRODID));
    cal.append_property(("CALSCALE", "GREGORIAN"));
    // RFC 7986's NAME and its older X-WR-CALNAME are TEXT, which the library writes
    // unescaped: escaped here, as a user name may hold `;`, `,` or `\`.
    let name = feed::text_value(name);
    cal.append_property(("NAME", name.as_str()));
    cal.append_property(("X-WR-CALNAME", name.as_str()));
    cal.ttl(&REFRESH);
    for e in events {
        cal.push(e);
    }
    (
        [
            (header::CONTENT_TYPE, "text/calendar; charset=utf-8"),
            // The URL is a credential: keep the feed out of shared caches.
            (header::CACHE_CONTROL, "private, max-age=300"),
        ],
        cal.done().to_string(),
    )
        .into_response()
}
