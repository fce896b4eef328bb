//! The booking state on `/metrics`: active and planned bookings,
//! and each model's declared, free, booked and lent units, read from the database at
//! each scrape; `gpu_booking_build_info` and the process metrics beside them; the
//! Prometheus text format when the scraper asks for it (and `promtool check metrics`
//! agrees with it, where promtool is installed).
//!
//! Runs on the real Postgres (`DATABASE_URL`) via `#[sqlx::test]`.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use gpu_booking_api::clock::ManualClock;
use gpu_booking_api::testing::{test_state, token_for};
use gpu_booking_core::booking_policy::Policy;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use sqlx::PgPool;
use tower::ServiceExt;

const SECRET: &[u8] = b"metrics-state-test-secret-0123456789abcdef";

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 3, 4, 0, 0, 0).unwrap()
}

async fn call(
    app: &axum::Router,
    method: Method,
    uri: &str,
    who: &str,
    role: Option<&str>,
    body: Value,
) -> StatusCode {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header(
            header::AUTHORIZATION,
            format!("Bearer {}", token_for(SECRET, who, role)),
        )
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    assert!(status.is_success(), "{uri}: {status}: {bytes:?}");
    status
}

async fn scrape(app: &axum::Router, accept: Option<&str>) -> (String, String) {
    let mut req = Request::get("/metrics");
    if let Some(a) = accept {
        req = req.header(header::ACCEPT, a);
    }
    let res = app
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let content_type = res.headers()[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .to_owned();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (content_type, String::from_utf8(body.to_vec()).unwrap())
}

fn has(text: &str, line: &str) {
    assert!(
        text.lines().any(|l| l == line),
        "no line `{line}` in:\n{text}"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn bookings_and_units_per_model_are_gauges(pool: PgPool) {
    let clock = Arc::new(ManualClock::new(t0()));
    let policy = Policy {
        max_units_per_booking: 4,
        ..Policy::default()
    };
    let app = gpu_booking_api::app::router(test_state(pool.clone(), policy, clock.clone(), SECRET));
    for (model, units) in [("a100", 4), ("t4", 2)] {
        call(
            &app,
            Method::PUT,
            &format!("/api/v1/models/{model}"),
            "root@lab",
            Some("admin"),
            json!({"units": units}),
        )
        .await;
    }
    let day = |n: i64| t0() + TimeDelta::days(n);
    // Alice books 2 a100 from day 1 to 3, Bob 1 a100 from day 5 to 6.
    for (who, units, from, to) in [("alice", 2, 1, 3), ("bob", 1, 5, 6)] {
        let body = json!({"model": "a100", "units": units, "start": day(from), "end": day(to)});
        call(&app, Method::POST, "/api/v1/bookings", who, None, body).await;
    }

    let (_, text) = scrape(&app, None).await;
    has(&text, "gpu_booking_api_bookings{status=\"active\"} 0");
    has(&text, "gpu_booking_api_bookings{status=\"planned\"} 2");
    has(&text, "gpu_booking_api_model_units{model=\"a100\"} 4");
    has(&text, "gpu_booking_api_model_units_free{model=\"t4\"} 2");

    // Day 2: Alice's booking runs; the controller reports 3 a100 in use (her 2 and
    // one lent to an unbooked pod).
    clock.set(day(2));
    sqlx::query("UPDATE gpu_model SET in_use = 3 WHERE name = 'a100'")
        .execute(&pool)
        .await
        .unwrap();
    let (content_type, text) = scrape(&app, None).await;
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    has(&text, "gpu_booking_api_bookings{status=\"active\"} 1");
    has(&text, "gpu_booking_api_bookings{status=\"planned\"} 1");
    has(&text, "gpu_booking_api_model_units_free{model=\"a100\"} 1");
    has(
        &text,
        "gpu_booking_api_model_units_booked{model=\"a100\"} 2",
    );
    has(&text, "gpu_booking_api_model_units_lent{model=\"a100\"} 1");
    has(&text, "gpu_booking_api_model_units_lent{model=\"t4\"} 0");
    has(&text, "gpu_booking_api_state_refresh_errors_total 0");
    assert!(
        text.contains(&format!(
            "gpu_booking_build_info{{component=\"api\",version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        )),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"));

    // A model deleted loses its series.
    sqlx::query("DELETE FROM gpu_model WHERE name = 't4'")
        .execute(&pool)
        .await
        .unwrap();
    let (content_type, text) = scrape(&app, Some("text/plain; version=0.0.4")).await;
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    assert!(!text.contains("model=\"t4\""), "{text}");
    has(&text, "# TYPE gpu_booking_api_http_requests_total counter");
    assert!(!text.contains("# EOF"), "{text}");
    match gpu_booking_process::metrics::promtool_check(&text) {
        None => eprintln!("promtool not installed: `promtool check metrics` skipped"),
        Some(verdict) => verdict.expect("promtool check metrics"),
    }
}

/// Running bookings no pod has held a GPU for, from 4 hours after their start (the
/// usage report's no-shows), per model: the no-show alert reads the gauge.
#[sqlx::test(migrations = "../migrations")]
async fn no_shows_per_model_are_a_gauge(pool: PgPool) {
    let clock = Arc::new(ManualClock::new(t0()));
    let app = gpu_booking_api::app::router(test_state(
        pool.clone(),
        Policy::default(),
        clock.clone(),
        SECRET,
    ));
    for model in ["a100", "t4"] {
        let uri = format!("/api/v1/models/{model}");
        call(
            &app,
            Method::PUT,
            &uri,
            "root@lab",
            Some("admin"),
            json!({"units": 2}),
        )
        .await;
    }
    let start = t0() + TimeDelta::days(1);
    for who in ["alice", "bob"] {
        let body = json!({"model": "a100", "start": start, "end": start + TimeDelta::days(2)});
        call(&app, Method::POST, "/api/v1/bookings", who, None, body).await;
    }
    // Started, but not yet 4 hours ago: not a no-show yet.
    clock.set(start + TimeDelta::hours(3));
    let (_, text) = scrape(&app, None).await;
    has(&text, "gpu_booking_api_bookings_no_show{model=\"a100\"} 0");
    // Bob's pod held a GPU once; Alice's never did.
    sqlx::query(
        "INSERT INTO booking_use (booking_id, kind, units, since, until)
         SELECT id, 'held', 1, $1, $1 + interval '1 minute' FROM booking WHERE user_name = 'bob'",
    )
    .bind(start + TimeDelta::minutes(10))
    .execute(&pool)
    .await
    .unwrap();
    clock.set(start + TimeDelta::hours(4));
    let (_, text) = scrape(&app, None).await;
    has(&text, "gpu_booking_api_bookings_no_show{model=\"a100\"} 1");
    has(&text, "gpu_booking_api_bookings_no_show{model=\"t4\"} 0");
    // Ended: no longer running, no longer in the gauge (the report keeps it).
    clock.set(start + TimeDelta::days(2));
    let (_, text) = scrape(&app, None).await;
    has(&text, "gpu_booking_api_bookings_no_show{model=\"a100\"} 0");
}
