//! Starting the real API in-process for tests of this and other crates (the
//! webhook's end-to-end tests use it too).

use std::net::SocketAddr;
use std::sync::Arc;

use chrono::TimeDelta;
use gpu_booking_core::booking_policy::Policy;
use rand::RngCore;
use sqlx::PgPool;
use tokio::net::TcpListener;

use crate::auth::{mint_token, Authenticator, Role};
use crate::clock::{Clock, SystemClock};
use crate::metrics::Metrics;
use crate::state::AppState;

/// A running API on 127.0.0.1 with a fresh HS256 secret.
pub struct TestApi {
    pub url: String,
    pub addr: SocketAddr,
    pub pool: PgPool,
    /// The API's metrics, as its `/metrics` would show them.
    pub metrics: Arc<Metrics>,
    /// Its long polls' feed (closed when a server shuts down).
    pub changes: crate::store::changes::ChangeFeed,
    secret: Vec<u8>,
}

impl TestApi {
    /// The real API with the default policy and the wall clock.
    pub async fn start(pool: PgPool) -> anyhow::Result<TestApi> {
        TestApi::start_with(pool, Policy::default(), Arc::new(SystemClock)).await
    }

    pub async fn start_with(
        pool: PgPool,
        policy: Policy,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<TestApi> {
        let secret = random_secret();
        let state = test_state(pool.clone(), policy, clock, &secret);
        let metrics = state.metrics.clone();
        let changes = state.changes.clone();
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = crate::app::router(state);
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(TestApi {
            url: format!("http://{addr}"),
            addr,
            pool,
            metrics,
            changes,
            secret,
        })
    }

    /// A token for `user`, with role `admin` or `service` if given, valid 1 h.
    pub fn token(&self, user: &str, role: Option<&str>) -> String {
        token_for(&self.secret, user, role)
    }
}

/// State for driving the router without a socket.
pub fn test_state(pool: PgPool, policy: Policy, clock: Arc<dyn Clock>, secret: &[u8]) -> AppState {
    let policy = Arc::new(policy);
    let metrics = Arc::new(Metrics::default());
    AppState {
        creates: crate::create_queue::CreateQueue::new(
            pool.clone(),
            policy.clone(),
            metrics.clone(),
        ),
        pool,
        policy,
        clock,
        auth: Authenticator::new(Some(secret), None),
        metrics,
        page: crate::page::Page::default(),
        names: gpu_booking_core::username::NameCase::default(),
        ambiguity_audit: crate::state::ambiguity_audit_bucket(),
        notices: Default::default(),
        changes: Default::default(),
        // Tests that count writes set their own (`AppState::writes`).
        writes: crate::write_limits::WriteGate::off(),
    }
}

pub fn random_secret() -> Vec<u8> {
    let mut secret = vec![0u8; 32];
    rand::rng().fill_bytes(&mut secret);
    hex::encode(secret).into_bytes()
}

pub fn token_for(secret: &[u8], user: &str, role: Option<&str>) -> String {
    let role = match role {
        Some("admin") => Some(Role::Admin),
        Some("service") => Some(Role::Service),
        _ => None,
    };
    mint_token(secret, user, role, TimeDelta::hours(1)).unwrap_or_default()
}

/// How many (model, day) rows of `booking_day_units` differ from a count of the
/// bookings themselves, in units, in slots or in where the units begin and end
/// inside the day (migrations 20261128000100, 20261207000100, 20261209000100): 0 when
/// its triggers kept the table true through every change the test made. The oracle
/// writes each booking's entries out in its own terms (microseconds from the day's
/// midnight, not the migration's functions), so that a wrong function fails it too.
pub async fn day_units_mismatches(db: impl sqlx::PgExecutor<'_>) -> sqlx::Result<i64> {
    sqlx::query_scalar(
        "WITH per_unit AS (
           SELECT b.model, day, s,
                  (date '1970-01-01' + day)::timestamp AT TIME ZONE 'UTC' AS midnight,
                  b.start_at, b.end_at
           FROM booking b,
                generate_series(booking_day(b.start_at), booking_day(b.end_at - interval '1 microsecond')) AS day,
                unnest(b.slots) AS s
           WHERE b.cancelled_at IS NULL AND booking_counted_by_day(b.start_at, b.end_at)),
         edges AS (
           SELECT model, day, (extract(epoch FROM start_at - midnight) * 1000000)::bigint * 2 + 1 AS e
           FROM per_unit WHERE start_at >= midnight
           UNION ALL
           SELECT model, day, (extract(epoch FROM end_at - midnight) * 1000000)::bigint * 2
           FROM per_unit WHERE end_at < midnight + interval '1 day'),
         counted AS (
           SELECT model, day, count(*)::integer AS units, sort_asc(array_agg(s)) AS slots
           FROM per_unit GROUP BY model, day),
         counted_edges AS (
           SELECT model, day, array_agg(e ORDER BY e) AS edges FROM edges GROUP BY model, day)
         SELECT count(*) FROM counted c LEFT JOIN counted_edges ce USING (model, day)
           FULL JOIN booking_day_units d USING (model, day)
         WHERE coalesce(c.units, 0) <> coalesce(d.units, 0)
            OR coalesce(c.slots, '{}') <> coalesce(d.slots, '{}')
            OR coalesce(ce.edges, '{}')
               <> coalesce((SELECT array_agg(e ORDER BY e) FROM unnest(d.edges) AS e), '{}')",
    )
    .fetch_one(db)
    .await
}

/// `booking_unit` rows that no live booking's slot accounts for, plus live bookings'
/// slots without their row (migration 20261205000100): 0 when the table is what its
/// triggers write.
pub async fn unit_rows_mismatches(db: impl sqlx::PgExecutor<'_>) -> sqlx::Result<i64> {
    sqlx::query_scalar(
        "WITH live AS (
           SELECT b.id, booking_unit_key(m.id, s) AS unit_key, b.period
           FROM booking b JOIN gpu_model m ON m.name = b.model, unnest(b.slots) AS s
           WHERE b.cancelled_at IS NULL AND NOT b.archived)
         SELECT count(*) FROM live l FULL JOIN booking_unit u
           ON u.booking_id = l.id AND u.unit_key = l.unit_key AND u.period = l.period
         WHERE l.id IS NULL OR u.booking_id IS NULL",
    )
    .fetch_one(db)
    .await
}
