//! A database that cannot answer is the documented 503 with `Retry-After`, never a
//! 500: a pool pointed at a closed port, and a backend terminated (as a Postgres
//! restart or failover does) while a request waits on it. A connection whose backend
//! was terminated while it sat idle is replaced before a request gets it.
//!
//! Runs on the real Postgres (`DATABASE_URL`); `#[sqlx::test]` gives each test a
//! fresh, migrated database.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::response::Response;
use axum::Router;
use chrono::{TimeDelta, TimeZone, Utc};
use gpu_booking_api::clock::ManualClock;
use gpu_booking_api::testing::{test_state, token_for};
use gpu_booking_core::booking_policy::Policy;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tower::ServiceExt;

const SECRET: &[u8] = b"db-unavailable-test-secret-0123456789";

fn app(pool: PgPool) -> Router {
    let clock = Arc::new(ManualClock::new(
        Utc.with_ymd_and_hms(2030, 1, 7, 0, 0, 0).unwrap(),
    ));
    gpu_booking_api::app::router(test_state(pool, Policy::default(), clock, SECRET))
}

fn request(
    method: Method,
    path: &str,
    user: &str,
    role: Option<&str>,
    body: Option<Value>,
) -> Request<Body> {
    let builder = Request::builder().method(method).uri(path).header(
        header::AUTHORIZATION,
        format!("Bearer {}", token_for(SECRET, user, role)),
    );
    match body {
        Some(b) => builder
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(b.to_string())),
        None => builder.body(Body::empty()),
    }
    .unwrap()
}

async fn assert_unavailable(resp: Response, what: &str) {
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE, "{what}");
    assert_eq!(
        resp.headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap()),
        Some("2"),
        "{what}: Retry-After"
    );
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"], "unavailable", "{what}: {body}");
}

#[tokio::test]
async fn a_database_on_a_closed_port_answers_503_with_retry_after() {
    // Port 1 on loopback: nothing listens, connections are refused at once.
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(300))
        .connect_lazy("postgres://postgres@127.0.0.1:1/postgres")
        .unwrap();
    let app = app(pool);
    let start = "2030-01-08T00:00:00Z";
    let end = "2030-01-10T00:00:00Z";
    for (method, path, role, body) in [
        (Method::GET, "/api/v1/bookings", None, None),
        (Method::GET, "/api/v1/bookings/1", None, None),
        (Method::DELETE, "/api/v1/bookings/1", None, None),
        (
            Method::POST,
            "/api/v1/bookings",
            None,
            Some(json!({"model": "a100", "start": start, "end": end})),
        ),
        (Method::GET, "/api/v1/models", None, None),
        (Method::GET, "/api/v1/me/next-start?model=a100", None, None),
        (
            Method::GET,
            "/api/v1/schedulability?user=alice",
            Some("service"),
            None,
        ),
        (Method::GET, "/api/v1/audit", Some("admin"), None),
    ] {
        let what = format!("{method} {path}");
        let resp = app
            .clone()
            .oneshot(request(method, path, "alice", role, body))
            .await
            .unwrap();
        assert_unavailable(resp, &what).await;
    }
}

/// The backend serving a booking request is terminated while the request waits
/// for the user's lock (SQLSTATE 57P01, what a restart or failover does).
#[sqlx::test(migrations = "../migrations")]
async fn a_backend_terminated_mid_request_answers_503(pool: PgPool) {
    let app = app(pool.clone());
    let admin = request(
        Method::PUT,
        "/api/v1/models/a100",
        "root",
        Some("admin"),
        Some(json!({"units": 1})),
    );
    assert_eq!(
        app.clone().oneshot(admin).await.unwrap().status(),
        StatusCode::OK
    );

    // Hold alice's booking lock (migration 0002) so that her request waits on it.
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(7262, hashtext('alice'))")
        .execute(&mut *holder)
        .await
        .unwrap();
    let start = Utc.with_ymd_and_hms(2030, 1, 8, 0, 0, 0).unwrap();
    let body = json!({"model": "a100", "start": start.to_rfc3339(),
                      "end": (start + TimeDelta::days(2)).to_rfc3339()});
    let pending = tokio::spawn(app.clone().oneshot(request(
        Method::POST,
        "/api/v1/bookings",
        "alice",
        None,
        Some(body),
    )));

    // The request's backend, once it waits on the advisory lock: polled, because
    // Postgres has no notification for "a backend started waiting".
    let victim: i32 = loop {
        let pid: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'
                AND wait_event = 'advisory' AND pid <> pg_backend_pid()",
        )
        .fetch_optional(&pool)
        .await
        .unwrap();
        if let Some(pid) = pid {
            break pid;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(victim)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(killed);
    let resp = pending.await.unwrap().unwrap();
    assert_unavailable(resp, "POST /api/v1/bookings, backend terminated").await;
    holder.rollback().await.unwrap();

    // Nothing was booked, and the service answers again with a fresh connection.
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM booking")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(count, 0);
    let resp = app
        .oneshot(request(
            Method::GET,
            "/api/v1/bookings",
            "alice",
            None,
            None,
        ))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

/// The service's pool hands a connection used within the last second out as it is
/// (sqlx's default pings every one: a round trip more per statement), and pings one
/// idle for longer first: a connection whose backend was terminated while it sat idle
/// (a Postgres restart, a failover) is replaced, not handed to a request.
#[sqlx::test(migrations = "../migrations")]
async fn a_connection_terminated_while_idle_is_replaced(pool: PgPool) {
    let service = gpu_booking_api::server::pool_options(1)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let first = backend_pid(&service).await.unwrap();
    // Used a moment ago: the same connection, not pinged.
    assert_eq!(backend_pid(&service).await.unwrap(), first);
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(first)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(killed);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = backend_pid(&service)
        .await
        .expect("an idle connection whose backend is gone is pinged and replaced");
    assert_ne!(second, first);
    service.close().await;
}

async fn backend_pid(pool: &PgPool) -> sqlx::Result<i32> {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(pool)
        .await
}
