//! Starting the service: connect, migrate, build the state, serve.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use gpu_booking_ops::serve::BodyRefusal;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::net::TcpListener;

use crate::app::{router, AppState};
use crate::auth::Authenticator;
use crate::clock::SystemClock;
use crate::config::{ApiArgs, ApiLimits, AuthArgs, DatabaseArgs};
use crate::error::ErrorBody;
use crate::metrics::Metrics;
use crate::MIGRATOR;

/// How often booking changes past their retention are deleted.
const CHANGE_PRUNE_EVERY: Duration = Duration::from_secs(3600);

pub async fn connect(db: &DatabaseArgs) -> anyhow::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(db.db_max_connections)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&db.database_url)
        .await
        .context("connecting to the database (DATABASE_URL)")
}

pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    MIGRATOR.run(pool).await.context("running migrations")
}

/// The HS256 secret from the flag or the file, if configured.
pub fn hs256_secret(auth: &AuthArgs) -> anyhow::Result<Option<Vec<u8>>> {
    let secret = match (&auth.jwt_secret, &auth.jwt_secret_file) {
        (Some(s), _) => Some(s.clone().into_bytes()),
        (None, Some(path)) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?
                .trim()
                .as_bytes()
                .to_vec(),
        ),
        (None, None) => None,
    };
    if let Some(s) = &secret {
        anyhow::ensure!(s.len() >= 32, "the JWT secret must be at least 32 bytes");
    }
    Ok(secret)
}

pub fn authenticator(auth: &AuthArgs) -> anyhow::Result<Authenticator> {
    Authenticator::from_args(auth, hs256_secret(auth)?.as_deref())
}

pub fn state(pool: PgPool, args: &ApiArgs, auth: Authenticator) -> AppState {
    AppState {
        pool,
        policy: Arc::new(args.policy.policy()),
        clock: Arc::new(SystemClock),
        auth,
        metrics: Arc::new(Metrics::default()),
        page: crate::page::Page::new(&args.oidc),
        names: gpu_booking_core::username::NameCase::from_switch(args.case_sensitive_names),
        ambiguity_audit: crate::app::ambiguity_audit_bucket(),
        changes: Default::default(),
    }
}

/// `gpu-booking api`: migrate, then serve until SIGTERM / Ctrl-C.
pub async fn run(args: ApiArgs) -> anyhow::Result<()> {
    crate::config::init_logging(args.log_format);
    let auth = authenticator(&args.auth)?;
    let pool = connect(&args.database).await?;
    migrate(&pool).await?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    tracing::info!(listen = %args.listen, "booking API listening");
    crate::store::changes::spawn_pruner(pool.clone(), args.change_retention, CHANGE_PRUNE_EVERY);
    serve(listener, state(pool, &args, auth), &args.limits).await
}

/// Serves the API on `listener` within `limits` (timeouts, connections, body size and
/// memory) until SIGTERM / Ctrl-C.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    limits: &ApiLimits,
) -> anyhow::Result<()> {
    serve_router(listener, router(state), limits).await
}

/// Serves `app` (the API's router, possibly with more routes merged in, as the demo
/// does) within `limits` until SIGTERM / Ctrl-C.
pub async fn serve_router(
    listener: TcpListener,
    app: axum::Router,
    limits: &ApiLimits,
) -> anyhow::Result<()> {
    gpu_booking_ops::serve::serve(
        listener,
        limits,
        app,
        refuse_body,
        |tcp| async move { Ok(tcp) },
        shutdown_signal(),
    )
    .await
    .context("serving the API")
}

/// The API's answer to a body it did not read: 413 `payload_too_large`, 408
/// `request_timeout` or 400 `bad_request`, as JSON `{error, message}`.
pub fn refuse_body(refusal: &BodyRefusal) -> Response {
    let (status, error) = match refusal {
        BodyRefusal::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
        BodyRefusal::TimedOut { .. } => (StatusCode::REQUEST_TIMEOUT, "request_timeout"),
        BodyRefusal::Unreadable(_) => (StatusCode::BAD_REQUEST, "bad_request"),
    };
    let body = ErrorBody {
        error: error.to_string(),
        message: refusal.to_string(),
        earliest_start: None,
    };
    (status, axum::Json(body)).into_response()
}

pub use gpu_booking_ops::shutdown_signal;
