//! The application state and the router.

use std::sync::{Arc, Mutex};

use axum::routing::{delete, get, post, put};
use axum::Router;
use gpu_booking_core::policy::Policy;
use gpu_booking_core::rate::TokenBucket;
use gpu_booking_core::username::NameCase;
use sqlx::PgPool;
use utoipa::OpenApi;

use crate::auth::Authenticator;
use crate::clock::Clock;
use crate::metrics::{self, Metrics};
use crate::openapi::ApiDoc;
use crate::routes::{
    admission, audit, availability, bookings, changes, health, me, models, notices, schedulability,
    units,
};
use crate::routes::{feeds, usage, waitlist};

#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub policy: Arc<Policy>,
    pub clock: Arc<dyn Clock>,
    pub auth: Authenticator,
    pub metrics: Arc<Metrics>,
    /// The booking page as served (with the OIDC settings in it).
    pub page: crate::page::Page,
    /// How user names compare (JupyterHub lowercases by default).
    pub names: NameCase,
    /// Bounds the audit rows that ambiguous slug lookups write (anyone with the
    /// service role can ask about any slug).
    pub ambiguity_audit: Arc<Mutex<TokenBucket>>,
    /// The channels notices go out on (`crate::notices::enqueue` takes them).
    pub notices: crate::notices::Channels,
    /// Wakes long polls of `/api/v1/booking-changes` (one watch per process).
    pub changes: crate::store::changes::ChangeFeed,
}

/// Audit rows for ambiguous slugs at once, and per second after that.
const AMBIGUITY_AUDIT_BURST: u32 = 10;
const AMBIGUITY_AUDIT_PER_SECOND: f64 = 0.2;

/// A fresh bucket for [`AppState::ambiguity_audit`].
pub fn ambiguity_audit_bucket() -> Arc<Mutex<TokenBucket>> {
    Arc::new(Mutex::new(TokenBucket::new(
        AMBIGUITY_AUDIT_BURST,
        AMBIGUITY_AUDIT_PER_SECOND,
    )))
}

/// Every route of the service; tests drive it with `tower::ServiceExt::oneshot`.
pub fn router(state: AppState) -> Router {
    let api = Router::new()
        .route("/bookings", get(bookings::list).post(bookings::create))
        .route(
            "/bookings/{id}",
            get(bookings::get)
                .delete(bookings::cancel)
                .patch(bookings::change),
        )
        .route("/booking-changes", get(changes::list))
        .route("/me/next-start", get(me::next_start))
        .route("/me/notices", get(notices::get).put(notices::put))
        .route("/availability", get(availability::get))
        .route("/models", get(models::list))
        .route("/models/{name}", put(models::put))
        .route("/models/{name}/usage", put(models::put_usage))
        .route("/models/{name}/availability", get(models::availability))
        .route("/schedulability", get(schedulability::get))
        .route("/admission-state", get(admission::get))
        .route("/audit", get(audit::list).post(audit::report))
        .route("/audit/batch", post(audit::report_batch))
        .route("/policy", get(units::policy))
        .route("/held-units", put(units::put_held))
        .route("/admin/usage", get(usage::get))
        .route("/waitlist", get(waitlist::list).post(waitlist::join))
        .route("/waitlist/{id}", delete(waitlist::cancel))
        .route(
            "/me/feed-token",
            get(feeds::token_status)
                .post(feeds::issue_token)
                .delete(feeds::revoke_token),
        )
        .route("/feeds/{token}/bookings.ics", get(feeds::own_feed))
        .route(
            "/feeds/{token}/models/{model}/occupancy.ics",
            get(feeds::model_feed),
        );
    Router::new()
        .nest("/api/v1", api)
        .route(
            "/api/openapi.json",
            get(|| async { axum::Json(ApiDoc::openapi()) }),
        )
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .merge(crate::page::routes())
        .fallback(|| async { crate::error::ApiError::NotFound("no such route".into()) })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            metrics::track,
        ))
        .with_state(state)
}
