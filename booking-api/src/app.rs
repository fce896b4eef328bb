//! The router: every route of the service, over the state of [`crate::state`].

use axum::routing::{delete, get, post, put};
use axum::Router;
use utoipa::OpenApi;

use crate::metrics;
use crate::openapi::ApiDoc;
use crate::routes::{
    admission, audit, availability, bookings, changes, health, me, models, notices, schedulability,
    units,
};
use crate::routes::{feeds, notebooks, offers, usage, waitlist};
use crate::routes::{maintenance, reservations};
use crate::state::AppState;

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
        .route(
            "/groups",
            get(crate::routes::groups::list).post(crate::routes::groups::create),
        )
        .route(
            "/groups/{name}",
            get(crate::routes::groups::get)
                .put(crate::routes::groups::put)
                .delete(crate::routes::groups::delete),
        )
        .route(
            "/groups/{name}/members/{user}",
            put(crate::routes::groups::put_member).delete(crate::routes::groups::delete_member),
        )
        .route("/groups/{name}/usage", get(crate::routes::groups::usage))
        .route(
            "/quota-terms",
            get(crate::routes::groups::terms).put(crate::routes::groups::put_terms),
        )
        .route("/held-units", put(units::put_held))
        .route("/notebooks", get(notebooks::list))
        .route("/offers", get(offers::list).put(offers::put))
        .route("/admin/usage", get(usage::get))
        .route("/waitlist", get(waitlist::list).post(waitlist::join))
        .route("/waitlist/{id}", delete(waitlist::cancel))
        .route(
            "/maintenance",
            get(maintenance::list).post(maintenance::create),
        )
        .route("/maintenance/{id}", delete(maintenance::remove))
        .route(
            "/reservations",
            get(reservations::list).post(reservations::create),
        )
        .route(
            "/reservations/{id}",
            get(reservations::get).delete(reservations::remove),
        )
        .route(
            "/reservations/{id}/occurrences/{start}",
            delete(reservations::cancel_occurrence),
        )
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
    // Before any handler reads the request (and so before the database sees it).
    let api = api.layer(axum::middleware::from_fn(crate::extract::refuse_nul));
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
            state.metrics.clone(),
            metrics::track,
        ))
        .with_state(state)
}
