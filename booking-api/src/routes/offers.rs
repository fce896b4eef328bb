//! `/api/v1/offers`: GPUs offered back to users whose notebooks run on CPU. The
//! controller decides the offers (core's `offers`) and reports the whole list each
//! round (`PUT`, service role); the service keeps them for the webhook's replica
//! (each offer's units held for its user), tells each newly offered user (a notice,
//! sent by the notice worker) and shows them on the notebook card (`GET`).

use axum::extract::State;
use gpu_booking_core::wire::{Offers, OffersReport};

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract::Json;
use crate::state::AppState;
use crate::store::offers;

#[utoipa::path(put, path = "/api/v1/offers", tag = "webhook", request_body = OffersReport,
    description = "The controller's offers, the whole list (an offer left out is over): each holds `units` of \
                   `model` for `user` until `until`, against lending to anyone else. Offers to users with a \
                   booking now are not kept (they are named in `booked`); each kept offer comes back with \
                   `restart` set when its user opted in to be restarted on a GPU. Service role.",
    responses((status = 200, body = Offers), (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn put(
    State(state): State<AppState>,
    caller: Caller,
    Json(body): Json<OffersReport>,
) -> Result<axum::Json<Offers>, ApiError> {
    caller.require_service()?;
    if let Some(problem) = body.problem() {
        return Err(ApiError::Invalid(problem));
    }
    let answer = offers::replace(&state.pool, &body.offers, state.names, state.clock.now()).await?;
    Ok(axum::Json(answer))
}

#[utoipa::path(get, path = "/api/v1/offers", tag = "bookings",
    description = "The offers as last reported: a service or an admin sees every user's (the controller \
                   takes them back when it is elected), anyone else their own (an offer whose `until` passed is over).",
    responses((status = 200, body = Offers), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<axum::Json<Offers>, ApiError> {
    let user = caller
        .require_service()
        .is_err()
        .then(|| caller.user.as_str());
    let offers = offers::list(&state.pool, user, None).await?;
    Ok(axum::Json(Offers {
        offers,
        booked: Vec::new(),
    }))
}
