//! `/api/v1/me/notices`: a user's notice preferences and newest notices.

use axum::extract::State;
use gpu_booking_core::notice::{is_address, NoticeKind, Prefs, MAX_ADDRESS_LEN};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract::Json;
use crate::notices::{self, Channels, SentNotice};
use crate::state::AppState;
use crate::store::offers;

/// Newest notices shown with the preferences.
const RECENT: i64 = 20;

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NoticePrefs {
    /// Where e-mail goes; `null` or empty: the user name, when it is an address.
    /// Surrounding white space is trimmed; what is left must be `local@domain`: one
    /// `@` with text on both sides, no white space, control character, `<`, `>`, `,`
    /// or `;`, a domain that neither starts nor ends with `.`, and at most
    /// `maxLength` bytes of UTF-8.
    #[schema(max_length = 254)]
    pub email: Option<String>,
    pub email_enabled: bool,
    pub webhook_enabled: bool,
    /// Kinds not wanted (a repeat is dropped, but counts towards `maxItems`).
    // Read as strings and checked with `NoticeKind::parse` (an unknown kind is a 422
    // naming it); documented as the kinds themselves.
    #[schema(value_type = Vec<NoticeKind>, inline, max_items = 10)]
    pub muted: Vec<String>,
    /// Restart my server on a GPU when one frees: when a GPU is offered back to a
    /// notebook of mine that runs on CPU, the controller restarts the server
    /// through JupyterHub once it is idle (where the controller runs with
    /// `--on-expiry hub-restart`). Absent: left as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_on_offer: Option<bool>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct NoticeSettings {
    pub prefs: NoticePrefs,
    /// The channels this installation sends on.
    pub channels: Channels,
    /// The address e-mail goes to, if any.
    pub address: Option<String>,
    /// Every kind of notice.
    pub kinds: Vec<String>,
    /// The newest notices, newest first.
    pub recent: Vec<SentNotice>,
}

async fn settings(state: &AppState, user: &str) -> Result<NoticeSettings, ApiError> {
    let mut conn = state.pool.acquire().await?;
    let p = notices::prefs(&mut conn, user).await?;
    let address = p
        .email
        .clone()
        .or_else(|| is_address(user).then(|| user.to_owned()));
    Ok(NoticeSettings {
        prefs: NoticePrefs {
            email: p.email,
            email_enabled: p.email_enabled,
            webhook_enabled: p.webhook_enabled,
            muted: p.muted.iter().map(|k| k.as_str().to_owned()).collect(),
            restart_on_offer: Some(offers::restart_on_offer(&mut *conn, user).await?),
        },
        channels: state.notices,
        address,
        kinds: NoticeKind::ALL
            .iter()
            .map(|k| k.as_str().to_owned())
            .collect(),
        recent: notices::recent(&state.pool, user, RECENT).await?,
    })
}

#[utoipa::path(get, path = "/api/v1/me/notices", tag = "notices",
    responses((status = 200, body = NoticeSettings)),
    security(("bearer" = [])))]
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<axum::Json<NoticeSettings>, ApiError> {
    Ok(axum::Json(settings(&state, caller.user.as_str()).await?))
}

#[utoipa::path(put, path = "/api/v1/me/notices", tag = "notices", request_body = NoticePrefs,
    responses((status = 200, body = NoticeSettings), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn put(
    State(state): State<AppState>,
    caller: Caller,
    Json(body): Json<NoticePrefs>,
) -> Result<axum::Json<NoticeSettings>, ApiError> {
    let email = match body.email.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(e) if is_address(e) => Some(e.to_owned()),
        Some(_) => {
            return Err(ApiError::Invalid(format!(
                "email must be an address (local@domain, at most {MAX_ADDRESS_LEN} characters)"
            )))
        }
    };
    if body.muted.len() > NoticeKind::ALL.len() {
        return Err(ApiError::Invalid(format!(
            "muted: at most {} kinds",
            NoticeKind::ALL.len()
        )));
    }
    let mut muted = Vec::new();
    for k in &body.muted {
        let kind = NoticeKind::parse(k)
            .ok_or_else(|| ApiError::Invalid(format!("muted: unknown kind {k:?}")))?;
        if !muted.contains(&kind) {
            muted.push(kind);
        }
    }
    let prefs = Prefs {
        email,
        email_enabled: body.email_enabled,
        webhook_enabled: body.webhook_enabled,
        muted,
    };
    let mut conn = state.pool.acquire().await?;
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    notices::set_prefs(&mut tx, caller.user.as_str(), &prefs, state.clock.now()).await?;
    if let Some(on) = body.restart_on_offer {
        offers::set_restart_on_offer(&mut *tx, caller.user.as_str(), on, state.clock.now()).await?;
    }
    tx.commit().await?;
    drop(conn);
    Ok(axum::Json(settings(&state, caller.user.as_str()).await?))
}
