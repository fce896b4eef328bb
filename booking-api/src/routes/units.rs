//! Multi-GPU bookings: the policy's limits as the page and
//! clients read them, and the controller's count of the units each booking's pods
//! hold (what the webhook needs to give high priority only up to a booking's units).

use axum::extract::State;
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::wire::notebooks::notebooks_problem;
use gpu_booking_core::wire::{HeldReport, HeldReported, MAX_HELD_UNITS, MAX_REPORTED_BOOKINGS};
use serde::Serialize;
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract::Json;
use crate::state::AppState;
use crate::store::{held, notebooks, usage};

/// A policy's settings.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Limits {
    /// Shortest booking, seconds (inclusive).
    pub min_duration_seconds: i64,
    /// Longest booking, seconds (inclusive).
    pub max_duration_seconds: i64,
    /// Gap between a user's bookings, seconds.
    pub cooldown_seconds: i64,
    /// Planned bookings a user may hold at once.
    pub max_planned: u32,
    /// Whether a new booking is refused while the user has one running.
    pub no_booking_while_active: bool,
    /// GPUs one booking may be for (`units` of `POST /bookings`).
    pub max_units_per_booking: u32,
    /// How far ahead a booking may start, seconds (the booking horizon).
    pub max_ahead_seconds: i64,
}

impl Limits {
    fn of(p: &Policy) -> Self {
        Limits {
            min_duration_seconds: p.min_duration.num_seconds(),
            max_duration_seconds: p.max_duration.num_seconds(),
            cooldown_seconds: p.cooldown.num_seconds(),
            max_planned: p.max_planned,
            no_booking_while_active: p.no_booking_while_active,
            max_units_per_booking: p.max_units_per_booking,
            max_ahead_seconds: p.max_ahead.num_seconds(),
        }
    }
}

/// A group of the caller's.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MyGroup {
    pub name: String,
    /// `member` or `owner`.
    pub role: String,
    /// `admin`, `oidc` or `hub`.
    pub source: String,
}

/// The caller's policy for one model.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelLimits {
    pub model: String,
    /// Whether the caller may book it.
    pub allowed: bool,
    /// The settings for it (absent where it may not be booked).
    pub policy: Option<Limits>,
    /// The page's sentence: "As a member of ml-lab you may book up to 7 days of an
    /// a100, ...".
    pub sentence: String,
}

/// The booking policy for the caller: the settings of the group whose policy
/// applies to them (the first of their groups in the admin's order; the lab's
/// without a group), per model, and their group's remaining quota.
#[derive(Debug, Serialize, ToSchema)]
pub struct PolicyView {
    /// The caller's settings (their group's over the lab's; a model may differ:
    /// `models`).
    #[serde(flatten)]
    pub limits: Limits,
    /// The lab's settings (the service's options): a user in no group's.
    pub lab: Limits,
    /// The caller's groups, in the admin's order.
    pub groups: Vec<MyGroup>,
    /// The group whose policy applies and whose quota new bookings count against.
    pub group: Option<String>,
    /// Per model: the caller's policy.
    pub models: Vec<ModelLimits>,
    /// That group's use against its quota (absent without a group).
    pub quota: Option<crate::routes::groups::GroupUsage>,
}

#[utoipa::path(get, path = "/api/v1/policy", tag = "bookings",
    responses((status = 200, body = PolicyView), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn policy(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<axum::Json<PolicyView>, ApiError> {
    crate::routes::groups::seen(&state, &caller).await?;
    let lab = &state.policy;
    let mut conn = state.pool.acquire().await?;
    let mine = crate::store::groups::of_user(&mut conn, caller.user.as_str()).await?;
    drop(conn);
    let applying = mine.first().map(|(g, m)| (g, m.role == "owner"));
    let group_policy = applying.map(|(g, _)| g.policy());
    let limits = match &group_policy {
        Some(gp) => gp.overrides.over(lab),
        None => lab.as_ref().clone(),
    };
    let group_name = applying.map(|(g, _)| g.row.name.as_str());
    let models = crate::store::models::list(&state.pool)
        .await?
        .into_iter()
        .map(|m| {
            let p = match (&group_policy, group_name) {
                (Some(gp), Some(name)) => {
                    gpu_booking_core::groups::resolve(lab, Some((name, gp)), &m.name).ok()
                }
                _ => Some(lab.as_ref().clone()),
            };
            ModelLimits {
                allowed: p.is_some(),
                sentence: match &p {
                    Some(p) => gpu_booking_core::groups::sentence(group_name, &m.name, p),
                    None => {
                        gpu_booking_core::groups::model_not_allowed(
                            group_name.unwrap_or_default(),
                            &m.name,
                        )
                        .message
                    }
                },
                policy: p.as_ref().map(Limits::of),
                model: m.name,
            }
        })
        .collect();
    let quota = match applying {
        Some((g, owner)) => Some(
            crate::routes::groups::usage_of(&state, g, state.clock.now(), owner || caller.admin)
                .await?,
        ),
        None => None,
    };
    Ok(axum::Json(PolicyView {
        limits: Limits::of(&limits),
        lab: Limits::of(lab),
        groups: mine
            .iter()
            .map(|(g, m)| MyGroup {
                name: g.row.name.clone(),
                role: m.role.clone(),
                source: m.source.clone(),
            })
            .collect(),
        group: group_name.map(str::to_owned),
        models,
        quota,
    }))
}

#[utoipa::path(put, path = "/api/v1/held-units", tag = "webhook", request_body = HeldReport,
    responses((status = 200, body = HeldReported), (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn put_held(
    State(state): State<AppState>,
    caller: Caller,
    Json(body): Json<HeldReport>,
) -> Result<axum::Json<HeldReported>, ApiError> {
    caller.require_service()?;
    if body.bookings.len() > MAX_REPORTED_BOOKINGS || body.active.len() > MAX_REPORTED_BOOKINGS {
        return Err(ApiError::Invalid(format!(
            "at most {MAX_REPORTED_BOOKINGS} bookings per report"
        )));
    }
    if body
        .bookings
        .values()
        .any(|n| !(0..=MAX_HELD_UNITS).contains(n))
    {
        return Err(ApiError::Invalid(
            "units held must be between 0 and 100000".into(),
        ));
    }
    if let Some(problem) = body.waiting_problem() {
        return Err(ApiError::Invalid(problem));
    }
    if let Some(problem) = notebooks_problem(&body.notebooks) {
        return Err(ApiError::Invalid(problem));
    }
    let now = state.clock.now();
    held::replace(&state.pool, &body.bookings, &body.waiting, now).await?;
    notebooks::replace(&state.pool, &body.notebooks, state.names, now).await?;
    usage::record(&state.pool, &body.bookings, &body.active, now).await?;
    Ok(axum::Json(HeldReported {
        bookings: body.bookings.len(),
    }))
}
