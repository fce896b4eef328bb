//! `/api/v1/preemptions`: the webhook asks for a unit of a model to be freed for a
//! booked user; the controller takes the open requests and says what it did.

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::json;
use utoipa::ToSchema;

use crate::app::AppState;
use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{Json, Path};
use crate::routes::audit::Recorded;
use crate::store::audit;
use crate::store::preemptions::{self, NewPreemption, Preemption};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestPreemption {
    pub model: String,
    pub booking_id: Option<i64>,
    pub user: Option<String>,
    pub namespace: Option<String>,
    pub pod: Option<String>,
}

#[utoipa::path(post, path = "/api/v1/preemptions", tag = "webhook", request_body = RequestPreemption,
    responses((status = 202, body = Recorded), (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn request(
    State(state): State<AppState>,
    caller: Caller,
    Json(body): Json<RequestPreemption>,
) -> Result<(StatusCode, axum::Json<Recorded>), ApiError> {
    caller.require_service()?;
    for (name, v) in [
        ("namespace", &body.namespace),
        ("pod", &body.pod),
        ("user", &body.user),
    ] {
        if v.as_ref()
            .is_some_and(|v| v.len() > 256 || v.chars().any(char::is_control))
        {
            return Err(ApiError::Invalid(format!(
                "{name} must be at most 256 printable characters"
            )));
        }
    }
    if crate::store::models::get(&state.pool, &body.model)
        .await?
        .is_none()
    {
        return Err(ApiError::unknown_model(&body.model));
    }
    let now = state.clock.now();
    let mut tx = state.pool.begin().await?;
    let id = preemptions::create(
        &mut *tx,
        NewPreemption {
            model: &body.model,
            booking_id: body.booking_id,
            user: body.user.as_deref(),
            namespace: body.namespace.as_deref(),
            pod: body.pod.as_deref(),
            requested_by: caller.user.as_str(),
            at: now,
        },
    )
    .await?;
    let subject = match (&body.namespace, &body.pod) {
        (Some(ns), Some(pod)) => Some(format!("{ns}/{pod}")),
        _ => None,
    };
    audit::record(
        &mut *tx,
        audit::NewEvent {
            at: now,
            actor: caller.user.as_str(),
            action: "preemption.request",
            subject: subject.as_deref(),
            user: body.user.as_deref(),
            booking_id: body.booking_id,
            details: json!({ "model": body.model, "request": id }),
        },
    )
    .await?;
    tx.commit().await?;
    Ok((StatusCode::ACCEPTED, axum::Json(Recorded { id })))
}

#[utoipa::path(get, path = "/api/v1/preemptions", tag = "webhook",
    responses((status = 200, body = [Preemption]), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn open(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<axum::Json<Vec<Preemption>>, ApiError> {
    caller.require_service()?;
    Ok(axum::Json(preemptions::open(&state.pool).await?))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HandlePreemption {
    /// What was done, e.g. `preempted jhub/jupyter-bob` or `nothing to preempt`.
    pub outcome: String,
}

#[utoipa::path(put, path = "/api/v1/preemptions/{id}", tag = "webhook", request_body = HandlePreemption,
    params(("id" = i64, Path)),
    responses((status = 200, body = Preemption), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn handle(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
    Json(body): Json<HandlePreemption>,
) -> Result<axum::Json<Preemption>, ApiError> {
    caller.require_service()?;
    if body.outcome.is_empty() || body.outcome.len() > 512 {
        return Err(ApiError::Invalid(
            "outcome must be 1 to 512 characters".into(),
        ));
    }
    preemptions::handle(&state.pool, id, &body.outcome, state.clock.now())
        .await?
        .map(axum::Json)
        .ok_or_else(|| ApiError::NotFound(format!("no open preemption request {id}")))
}
