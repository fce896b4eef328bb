//! `/api/v1/schedulability`: the one call the webhook makes per GPU pod.

use std::collections::BTreeMap;

use std::time::Instant;

use axum::extract::State;
use chrono::{DateTime, TimeDelta, Utc};
use gpu_booking_core::gpu_model::ModelName;
use gpu_booking_core::holds;
use gpu_booking_core::next_start;
use gpu_booking_core::username::{SlugMatch, Username};
use gpu_booking_core::wire::{count, ActiveBooking, ModelState, Schedulability};
use serde::Deserialize;
use serde_json::json;
use utoipa::IntoParams;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract::Query;
use crate::state::AppState;
use crate::store::{admission, audit, bookings, held, models, users};

/// Longest `slug`, in bytes.
pub const MAX_SLUG_LEN: usize = 256;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct SchedulabilityQuery {
    /// The raw user name (pod annotation `hub.jupyter.org/username`), compared as
    /// JupyterHub normalises names. A user name: its length counts UTF-8 bytes; no
    /// control character, no white space at either end. Not with `slug`.
    #[param(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000](?:[^\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb]*[^\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000])?$"
    )]
    pub user: Option<String>,
    /// A KubeSpawner label slug (escape or safe scheme) when no raw name is known. It
    /// resolves only when exactly one known user has it; an ambiguous slug resolves to
    /// nobody (and is audited). Give neither `user` nor `slug` for a pod without
    /// identity: then only the free units are answered; never both. Its length
    /// counts UTF-8 bytes; no control character.
    #[param(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\u0000-\u001f\u007f-\u009f]*$"
    )]
    pub slug: Option<String>,
}

/// Whom a query names.
enum Owner {
    /// Nobody was named (a pod without identity): free units only.
    Anonymous,
    /// A user (known or not yet): their bookings and rules apply.
    User(String),
    /// A slug that no known user has: someone who has never booked.
    Unknown,
    /// A slug that several users share: nobody's.
    Ambiguous,
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
    let now = state.clock.now();
    let owner = match (&q.user, &q.slug) {
        (Some(user), None) => {
            let user = Username::normalised(user, state.names)
                .map_err(|e| ApiError::Invalid(format!("user: {e}")))?;
            Owner::User(user.into_inner())
        }
        (None, Some(slug)) => {
            if slug.is_empty() || slug.len() > MAX_SLUG_LEN || slug.chars().any(char::is_control) {
                return Err(ApiError::Invalid(
                    "slug must be 1 to 256 printable characters".into(),
                ));
            }
            match SlugMatch::of(users::by_slug(&state.pool, slug).await?) {
                SlugMatch::Nobody => Owner::Unknown,
                SlugMatch::One(user) => Owner::User(user),
                SlugMatch::Ambiguous(users) => {
                    audit_ambiguous(&state, &caller, slug, &users, now).await?;
                    Owner::Ambiguous
                }
            }
        }
        (None, None) => Owner::Anonymous,
        (Some(_), Some(_)) => {
            return Err(ApiError::Invalid(
                "give at most one of user and slug".into(),
            ))
        }
    };
    // A member of a course running now, without a booking of their own, is booked
    // against its occurrence (as the replica answers).
    // The user's own booking, else a course's session they have as a member.
    let (active, course) = match &owner {
        Owner::User(user) => {
            match bookings::active_for(&state.pool, std::slice::from_ref(user), now).await? {
                Some(b) => (Some((b.id, b.model, b.units, b.end_at)), false),
                None => {
                    let course = admission::course_for(&state.pool, user, now).await?;
                    let is_course = course.is_some();
                    (course, is_course)
                }
            }
        }
        _ => (None, false),
    };
    // Models whose name the webhook could not read are left out (it could not read
    // an answer that named them), as in the replica's snapshot.
    let declared = models::list(&state.pool).await?;
    let models: Vec<ModelState> = declared.iter().filter_map(admission::model_state).collect();
    let blocked = admission::maintenance_at(&state.pool, now).await?;
    if let (Some((id, model, units, end)), Owner::User(user)) = (active, &owner) {
        let units_held = held::units_held(&state.pool, id).await?;
        let mut answer = Schedulability::booked(
            &models,
            ActiveBooking {
                id,
                until: end,
                model: ModelName::parse(&model).ok(),
                user: user.clone(),
                units: count(units),
                units_held: count(units_held),
            },
        );
        answer.course = course;
        holds::withhold(&mut answer.free, &blocked);
        return Ok(axum::Json(answer));
    }
    let own = match &owner {
        Owner::User(user) => {
            Some(bookings::user_windows(&state.pool, &state.policy, now, user).await?)
        }
        Owner::Unknown => Some(Vec::new()),
        Owner::Anonymous | Owner::Ambiguous => None,
    };
    let mut earliest_booking_by_model = BTreeMap::new();
    if let Some(own) = own {
        // What /me/next-start answers for each model, by the same function.
        let question = models::StartQuestion {
            policy: &state.policy,
            now,
            own: &own,
            duration: TimeDelta::days(next_start::default_days(&state.policy)),
        };
        let answers = models::earliest_starts(&state.pool, &question, &declared).await?;
        for (model, next) in answers {
            if let (Ok(model), Ok(next)) = (ModelName::parse(&model), next) {
                earliest_booking_by_model.insert(model, next.start);
            }
        }
    }
    let user = match owner {
        Owner::User(user) => Some(user),
        _ => None,
    };
    let mut answer = Schedulability::unbooked(&models, user, earliest_booking_by_model);
    holds::withhold(&mut answer.free, &blocked);
    Ok(axum::Json(answer))
}

/// Records that `slug` names several users, unless such rows exceed their rate (the
/// service role can ask about any slug, as often as it likes).
async fn audit_ambiguous(
    state: &AppState,
    caller: &Caller,
    slug: &str,
    users: &[String],
    now: DateTime<Utc>,
) -> Result<(), ApiError> {
    let allowed = state
        .ambiguity_audit
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .allow(Instant::now());
    if !allowed {
        tracing::debug!(slug, "ambiguous slug; audit row over the rate, not written");
        return Ok(());
    }
    tracing::warn!(
        slug,
        users = users.len(),
        "a slug names several users; resolved to nobody"
    );
    audit::record(
        &state.pool,
        audit::NewEvent {
            at: now,
            actor: caller.user.as_str(),
            action: "schedulability.ambiguous_slug",
            subject: Some(slug),
            user: None,
            booking_id: None,
            details: json!({ "slug": slug, "users": users }),
        },
    )
    .await?;
    Ok(())
}
