//! Starting the service: connect, migrate, build the state, serve.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::net::TcpListener;

use crate::app::{router, AppState};
use crate::auth::Authenticator;
use crate::clock::SystemClock;
use crate::config::{ApiArgs, AuthArgs, DatabaseArgs};
use crate::jwks::JwksCache;
use crate::metrics::Metrics;
use crate::MIGRATOR;

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
    let secret = hs256_secret(auth)?;
    anyhow::ensure!(
        secret.is_some() || auth.jwks_url.is_some(),
        "configure --jwt-secret(-file) or --jwks-url: no token could be verified"
    );
    Ok(Authenticator::new(
        secret.as_deref(),
        auth.jwks_url.clone().map(JwksCache::new),
        auth.jwt_issuer.clone(),
        auth.jwt_audience.clone(),
    ))
}

pub fn state(pool: PgPool, args: &ApiArgs, auth: Authenticator) -> AppState {
    AppState {
        pool,
        policy: Arc::new(args.policy.policy()),
        clock: Arc::new(SystemClock),
        auth,
        metrics: Arc::new(Metrics::default()),
        page: crate::page::Page::new(&args.oidc),
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
    serve(listener, state(pool, &args, auth)).await
}

pub async fn serve(listener: TcpListener, state: AppState) -> anyhow::Result<()> {
    serve_router(listener, router(state)).await
}

/// Serves `app` (the API's router, possibly with more routes merged in, as the demo
/// does) until SIGTERM / Ctrl-C.
pub async fn serve_router(listener: TcpListener, app: axum::Router) -> anyhow::Result<()> {
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await
        .context("serving the API")
}

pub use gpu_booking_ops::shutdown_signal;
