//! Starting the service: connect, migrate, build the state, serve.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use gpu_booking_process::serve::BodyRefusal;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::net::TcpListener;

use crate::app::router;
use crate::auth::Authenticator;
use crate::clock::SystemClock;
use crate::config::{ApiArgs, ApiLimits, AuthArgs, DatabaseArgs, JwtSecretArgs};
use crate::error::ErrorBody;
use crate::metrics::Metrics;
use crate::state::AppState;
use crate::store::changes::ChangeFeed;
use crate::MIGRATOR;

/// How often booking changes past their retention are deleted.
const CHANGE_PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// A pooled connection idle for longer than this is pinged before it is handed out.
const PING_IF_IDLE: Duration = Duration::from_secs(1);

pub async fn connect(db: &DatabaseArgs) -> anyhow::Result<PgPool> {
    let url = db.url()?;
    pool_options(db.db_max_connections)
        .connect(&url)
        .await
        .context("connecting to the database (DATABASE_URL or --database-url-file)")
}

/// The service's pool settings (the benches build theirs from these too). sqlx pings
/// every connection it hands out by default, one more round trip for each statement
/// or transaction: in a profile of `/schedulability` (four reads) the pings took 11 %
/// of the API process's time. A connection used within the last [`PING_IF_IDLE`] is
/// handed out as it is; one idle longer (a restart of Postgres or a dropped network
/// path may have closed it meanwhile) is pinged first, and replaced if that fails.
pub fn pool_options(max_connections: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(5))
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_IF_IDLE {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
}

pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    MIGRATOR.run(pool).await.context("running migrations")
}

/// The HS256 secret from the flag or the file, if configured.
pub fn hs256_secret(args: &JwtSecretArgs) -> anyhow::Result<Option<Vec<u8>>> {
    let secret = match (&args.jwt_secret, &args.jwt_secret_file) {
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
    Authenticator::from_args(auth, hs256_secret(&auth.secret)?.as_deref())
}

pub fn state(pool: PgPool, args: &ApiArgs, auth: Authenticator) -> AppState {
    let policy = Arc::new(args.policy.policy());
    let metrics = Arc::new(Metrics::default());
    AppState {
        creates: crate::create_queue::CreateQueue::new(
            pool.clone(),
            policy.clone(),
            metrics.clone(),
        ),
        pool,
        policy,
        clock: Arc::new(SystemClock),
        auth,
        metrics,
        page: crate::page::Page::new(&args.oidc),
        names: args.names.name_case(),
        ambiguity_audit: crate::state::ambiguity_audit_bucket(),
        notices: crate::notices::Channels {
            email: args.notices.smtp_host.is_some(),
            webhook: args.notices.notice_webhook_url_file.is_some(),
        },
        changes: Default::default(),
    }
}

/// The waitlist sweep's period (`--waitlist-sweep`), at least a second.
pub fn sweep_interval(args: &ApiArgs) -> Duration {
    args.waitlist_sweep
        .to_std()
        .unwrap_or_default()
        .max(Duration::from_secs(1))
}

/// The backstop of the passes that follow each freeing change: a pass over every
/// model each `interval`, so that a change made elsewhere (or one whose process died
/// between its commit and its pass) still serves the waitlist, and entries expire.
pub fn spawn_waitlist_sweep(state: AppState, interval: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = state.clock.now();
            if let Err(e) =
                crate::store::waitlist::promote_all(&state.pool, &state.policy, now).await
            {
                tracing::warn!(error = %e, "waitlist sweep failed");
            }
        }
    })
}

/// `gpu-booking api`: migrate, then serve until SIGTERM / Ctrl-C.
pub async fn run(args: ApiArgs) -> anyhow::Result<()> {
    args.log.init();
    let mut auth = authenticator(&args.auth)?;
    if let Some(audience) = &args.auth.service_account_audience {
        let client = kube::Client::try_default().await.context(
            "--service-account-audience: connecting to the Kubernetes API for TokenReviews",
        )?;
        auth = auth.with_service_accounts(crate::service_accounts::ServiceAccounts::new(
            client,
            audience.clone(),
            args.auth.service_account.iter().cloned().collect(),
        ));
    }
    // Read first: a bad models file stops the start before anything is written.
    let declared = match &args.models.models_file {
        Some(path) => Some(crate::declared::read(path)?),
        None => None,
    };
    let pool = connect(&args.database).await?;
    migrate(&pool).await?;
    if let Some(declared) = declared {
        let written = crate::declared::reconcile(
            &pool,
            &declared,
            args.models.models_authority.core(),
            chrono::Utc::now(),
        )
        .await?;
        tracing::info!(declared = declared.len(), ?written, authority = ?args.models.models_authority, "declared models in place");
    }
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    tracing::info!(listen = %args.listen, "booking API listening");
    crate::store::changes::spawn_pruner(pool.clone(), args.change_retention, CHANGE_PRUNE_EVERY);
    crate::store::archive::spawn_archiver(pool.clone(), args.archive_after);
    let state = state(pool, &args, auth);
    let _sweep = spawn_waitlist_sweep(state.clone(), sweep_interval(&args));
    let notices = tokio::spawn(notice_worker(&state, &args.notices)?.run());
    let served = serve(listener, state, &args.limits).await;
    notices.abort();
    served
}

/// The notice worker of this replica: every replica fills the outbox and sends from
/// it (claims keep each notice to one sender). Secrets are read from their files now.
pub fn notice_worker(
    state: &AppState,
    args: &crate::notices::config::NoticeArgs,
) -> anyhow::Result<crate::notices::Worker> {
    Ok(crate::notices::Worker::new(
        state.pool.clone(),
        state.clock.clone(),
        crate::notices::send::Senders::from_args(args)?,
        crate::notices::Settings::from_args(args),
    ))
}

/// Serves the API on `listener` within `limits` (timeouts, connections, body size and
/// memory) until SIGTERM / Ctrl-C.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    limits: &ApiLimits,
) -> anyhow::Result<()> {
    let changes = state.changes.clone();
    serve_router(listener, router(state), limits, &changes).await
}

/// Serves `app` (the API's router, possibly with more routes merged in, as the demo
/// does) within `limits` until SIGTERM / Ctrl-C; then the long polls of `changes`
/// answer at once, so that the graceful shutdown does not wait them out.
pub async fn serve_router(
    listener: TcpListener,
    app: axum::Router,
    limits: &ApiLimits,
    changes: &ChangeFeed,
) -> anyhow::Result<()> {
    gpu_booking_process::serve::serve(
        listener,
        limits,
        app,
        refuse_body,
        |tcp| async move { Ok(tcp) },
        closing(changes.clone(), shutdown_signal()),
    )
    .await
    .context("serving the API")
}

/// `signal`, after which the long polls of `changes` answer at once.
pub async fn closing(changes: ChangeFeed, signal: impl std::future::Future<Output = ()>) {
    signal.await;
    changes.close();
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

pub use gpu_booking_process::shutdown_signal;
