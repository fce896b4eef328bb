//! `/api/v1/admission-state`: what the webhook's replica decides admissions from.
//! A full answer at the webhook's start and after the change stream's
//! resume point is gone; the figures alone (`?full=false`) every second or so.

use axum::extract::State;
use gpu_booking_core::wire::{AdmissionState, PolicyState};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract::Query;
use crate::state::AppState;
use crate::store::admission;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct AdmissionStateQuery {
    /// `true` (the default): also the bookings that can matter to an admission (not
    /// cancelled and not over, and each user's last ended one if its cooldown is not
    /// over), the known users with
    /// their KubeSpawner slugs, and the change stream `position` to follow from.
    /// `false`: the per-model figures and units held only.
    pub full: Option<bool>,
}

#[utoipa::path(get, path = "/api/v1/admission-state", tag = "webhook", params(AdmissionStateQuery),
    description = "What the webhook keeps a replica of, so that an admission makes no call: the booking rules, \
                   each model's units, free units, VRAM budgets and last usage report, the units each booking's \
                   pods hold, the GPUs offered back and held for their users, and (full answers) the bookings, users and the `/booking-changes` position to \
                   follow from, all from one snapshot. Service role.",
    responses((status = 200, body = AdmissionState),
              (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<AdmissionStateQuery>,
) -> Result<axum::Json<AdmissionState>, ApiError> {
    caller.require_service()?;
    let now = state.clock.now();
    let mut answer = AdmissionState {
        at: now,
        names: state.names,
        policy: PolicyState::from(&*state.policy),
        models: Vec::new(),
        held: Default::default(),
        offers: Vec::new(),
        groups: Vec::new(),
        position: None,
        bookings: None,
        users: None,
    };
    if q.full.unwrap_or(true) {
        let (models, held, full) = admission::full(&state.pool, now, state.policy.cooldown).await?;
        answer.models = models;
        answer.held = held;
        answer.position = Some(full.position);
        answer.bookings = Some(full.bookings);
        answer.users = Some(full.users);
    } else {
        let mut conn = state.pool.acquire().await?;
        let (models, held) = admission::figures(&mut conn).await?;
        answer.models = models;
        answer.held = held;
    }
    let mut conn = state.pool.acquire().await?;
    answer.offers = admission::offers(&mut conn, now).await?;
    answer.groups = admission::course_members(&mut conn, now).await?;
    Ok(axum::Json(answer))
}
