//! `GET /api/v1/notebooks`: a user's running notebooks (booked, lent, or stripped
//! to CPU), as the controller last reported them with the units held.

use axum::extract::State;
use gpu_booking_core::username::Username;
use gpu_booking_core::wire::Notebooks;
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract::Query;
use crate::state::AppState;
use crate::store::notebooks;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct NotebooksQuery {
    /// Whose notebooks (default: the caller's; another user's: admins only). A user
    /// name: its length counts UTF-8 bytes; no control character, no white space at
    /// either end.
    #[param(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000](?:[^\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb]*[^\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000])?$"
    )]
    pub user: Option<String>,
}

#[utoipa::path(get, path = "/api/v1/notebooks", tag = "bookings", params(NotebooksQuery),
    responses((status = 200, body = Notebooks), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<NotebooksQuery>,
) -> Result<axum::Json<Notebooks>, ApiError> {
    let user = match &q.user {
        Some(u) => Username::normalised(u, state.names)
            .map_err(|e| ApiError::Invalid(format!("user: {e}")))?
            .into_inner(),
        None => caller.user.as_str().to_owned(),
    };
    if user != caller.user.as_str() && !caller.admin {
        return Err(ApiError::Forbidden(
            "only admins read another user's notebooks".into(),
        ));
    }
    let (reported_at, notebooks) = notebooks::of_user(&state.pool, &user, state.names).await?;
    Ok(axum::Json(Notebooks {
        user,
        reported_at,
        notebooks,
    }))
}
