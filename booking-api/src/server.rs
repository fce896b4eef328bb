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
    adopt_reworded_migrations(pool).await?;
    MIGRATOR.run(pool).await.context("running migrations")
}

/// Migrations whose comments were reworded after they were released, no statement
/// changed: each with the SHA-384 it had then. sqlx refuses to run when an applied
/// migration's checksum differs from its file's; a database that applied one of these
/// with its old text takes the new checksum first, and only then, so the check still
/// guards every statement.
pub const REWORDED_MIGRATIONS: [(i64, &str); 19] = [
    (20261123000010, "f767a8aed32e178cf5f394c96407d2e37c58b1afddb276ea51a3eed7216267b02e6a1ae221e17cf016b400adc36aaee5"),
    (20261124000040, "84bff23a3a805e43dc1039714b0492c603109b261bbe1d1aa373c08ecb921d466dfc1787af2c56472ca3a4ba83eef04f"),
    (20261124000070, "c4b811462ffae84e845f5f44c35fd464b57ab836298792c8a44c234a033b47d223ea852fc150edd97a4fb6a308e9d805"),
    (20261124000080, "f66349692eeefa7d6410c801f69c798d9f070b010f81702938dd3d7efd801d27253ba2407458d8ac12c0c0c91832262d"),
    (20261125000200, "f57847bcb3cc28a6d2369c166f96c4397ca8380e9ea341144055f27882920cb2722a20cc433eb0c596be324144c071da"),
    (20261125000500, "4687b7598e31a93bcf12187613956aefc1d6ef59b1f2a7c2814d3e71ebc3f76d056095f48470e1299e0814657310298a"),
    (20261126000100, "3159bf3f3b2527c75064e152877b052e9cc0eca20b60c327dfa7cf3e4e0f4ec2291ccbb366b574db02b7d724db347684"),
    (20261127000100, "d5a69b183cacb5fa6ec8f6ef1269da0090ca52002956d4cdf209d9f7bc4e705570c885a79fa506422e43067f3c5867a4"),
    (20261127000200, "965f2fbab3c091a061d426c694734e0b096f920e72dfd6da2bb7c0fed650172c46d1a751539ed90359af844f273e726b"),
    (20261128000100, "240754d3b77f39f44d84bda39f3adb4d684166cb59a9ab4360d070946b335cd859884bf164e8908c07aa2fd916de6d2d"),
    (20261129000100, "5d3599ef094e713ae1eb1e293355b5023e660e6e8e2b97bf70616a2cee4937aedf1cf4dc4ff74841ad357e474595584a"),
    (20261130000100, "0a26b614a2742becf45ab579a70e52ba44403208e08db33bf064730ac14e6835ccd3ca9ec981b6010d737efa3ab616a9"),
    (20261201000100, "c6f702d70a2e3767515cf79c908bc6acd43a775e152d67df3db46f3f09dffdc40ab837aae7fb0e54d95eef549ed7de57"),
    (20261204000100, "b862b8c27d5577f909a52cafb7d1cb4c07c6841fa209f6648fecc9f098636b286f9fd7bf866f86cbd0ca857ff7d25d5e"),
    (20261205000100, "91b7c853cb81939535f14c01365c490fa01e65601f0d6bb61dcdb4310dc531a1ae4c4c9128b26c8f1db4d7aaceabbe83"),
    (20261207000100, "53bb8e686b83e036401ad0115e22b2852f9816ca60823923930baaf1d9beaa6172b7be02e6b4143eac91d1bedacff8e8"),
    (20261208000100, "eed6a06e8a5ca4402b4ff75f7d72952a4eac457e5dee2b19906eaf26b6cd5acbd3640a1a2252ef328bbd095cbfe19e4e"),
    (20261209000100, "0ccbd76d0ab593367c3420762dc81134c30cf787af068491e355a7fc28f7340ba888d8fe407e4f34688de647712e4bcd"),
    (20261210000100, "751c2be5fc804604901df2e3033b82ff2d57293119ae3011789cd25fffa7715e791233f6e27242ee83f2084812591dfa"),
];

/// Gives the migrations of [`REWORDED_MIGRATIONS`] that a database applied with their
/// old text the checksum of their current text; nothing for a new database.
async fn adopt_reworded_migrations(pool: &PgPool) -> anyhow::Result<()> {
    let applied: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await
        .context("looking for applied migrations")?;
    if !applied {
        return Ok(());
    }
    for (version, old) in REWORDED_MIGRATIONS {
        let Some(migration) = MIGRATOR.iter().find(|m| m.version == version) else {
            continue;
        };
        let old = hex::decode(old).context("a reworded migration's old checksum")?;
        // A runtime statement: `_sqlx_migrations` is sqlx's table, not in `.sqlx/`.
        sqlx::query(
            "UPDATE _sqlx_migrations SET checksum = $1 WHERE version = $2 AND checksum = $3",
        )
        .bind(migration.checksum.as_ref())
        .bind(version)
        .bind(old)
        .execute(pool)
        .await
        .with_context(|| format!("adopting the reworded migration {version}"))?;
    }
    Ok(())
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

/// The page's JupyterHub sign-in, if `--hub-login-url` sets it up.
pub fn hub_login(args: &ApiArgs) -> anyhow::Result<Option<crate::hub_login::HubLogin>> {
    let secret = hs256_secret(&args.auth.secret)?;
    crate::hub_login::HubLogin::from_args(
        &args.hub_login,
        crate::hub_login::HubLoginContext {
            hs256_secret: secret.as_deref(),
            page_url: args.notices.page_url.as_deref(),
            claims: &args.auth.claims,
            max_token_lifetime: args.auth.max_token_lifetime,
            names: args.names.name_case(),
        },
    )
}

pub fn authenticator(auth: &AuthArgs) -> anyhow::Result<Authenticator> {
    Authenticator::from_args(auth, hs256_secret(&auth.secret)?.as_deref())
}

pub fn state(pool: PgPool, args: &ApiArgs, auth: Authenticator) -> AppState {
    let policy = Arc::new(args.lab_policy());
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
        page: crate::page::Page::new(&args.oidc).with_time_zone(args.notices.time_zone),
        names: args.names.name_case(),
        ambiguity_audit: crate::state::ambiguity_audit_bucket(),
        notices: crate::notices::Channels {
            email: args.notices.smtp_host.is_some(),
            webhook: args.notices.notice_webhook_url_file.is_some(),
        },
        changes: Default::default(),
        writes: crate::write_limits::WriteGate::new(args.write_limits.limits()),
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

/// Keeps `gpu_booking_database_up` current: a probe now and every
/// [`crate::metrics::DATABASE_PROBE_EVERY`].
pub fn spawn_database_probe(state: AppState) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(crate::metrics::DATABASE_PROBE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            state.metrics.probe_database(&state.pool).await;
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
    // Checked before anything starts: incomplete settings name the option to set.
    let hub_login = hub_login(&args)?;
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
    let mut state = state(pool, &args, auth);
    if let Some(hub_login) = hub_login {
        state.page = state.page.with_hub_login(hub_login);
    }
    let _probe = spawn_database_probe(state.clone());
    let _sweep = spawn_waitlist_sweep(state.clone(), sweep_interval(&args));
    let _hub_groups =
        crate::hub_groups::HubGroups::from_args(&args.hub_login, args.names.name_case())?
            .map(|hub| hub.spawn(state.pool.clone(), args.hub_login.hub_groups_refresh));
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
