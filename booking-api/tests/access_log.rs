//! The API's access log: one line per request, with its route
//! template, never its path, query or headers.
//!
//! Alone in its test binary: it captures `tracing` output with a thread-local
//! subscriber, and tracing's callsite interest, which is process-wide, can be settled
//! by a test running beside it on another thread (seen on the merged tree: no line
//! captured).
//!
//! Runs on the real Postgres (`DATABASE_URL`) via `#[sqlx::test]`.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request};
use chrono::{DateTime, TimeZone, Utc};
use gpu_booking_api::clock::ManualClock;
use gpu_booking_api::testing::test_state;
use gpu_booking_core::booking_policy::Policy;
use http_body_util::BodyExt;
use serde_json::Value;
use sqlx::PgPool;
use tower::ServiceExt;

const SECRET: &[u8] = b"access-log-test-secret-0123456789abcdef!";

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 3, 4, 0, 0, 0).unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn every_request_has_one_access_log_line_without_its_path(pool: PgPool) {
    let (capture, _guard) = gpu_booking_process::testing::LogCapture::start();
    let app = gpu_booking_api::app::router(test_state(
        pool,
        Policy::default(),
        Arc::new(ManualClock::new(t0())),
        SECRET,
    ));
    let requests = [
        (
            "/api/v1/bookings/987654?token=feed-secret-123",
            Some("Bearer not-a-real-token-456"),
        ),
        ("/healthz", None),
        ("/no/such/place/31337", None),
    ];
    for (uri, auth) in requests {
        let mut req = Request::get(uri);
        if let Some(a) = auth {
            req = req.header(header::AUTHORIZATION, a);
        }
        let res = app
            .clone()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let _ = res.into_body().collect().await.unwrap();
    }
    let text = capture.text();
    let access: Vec<Value> = capture.lines_of("gpu_booking_api::access");
    assert_eq!(access.len(), 3, "{text}");
    let routes: Vec<&str> = access
        .iter()
        .map(|l| l["fields"]["route"].as_str().unwrap())
        .collect();
    assert_eq!(routes, ["/api/v1/bookings/{id}", "/healthz", "unmatched"]);
    assert_eq!(access[0]["fields"]["method"], "GET");
    assert_eq!(access[0]["fields"]["status"], 401);
    assert_eq!(access[1]["fields"]["status"], 200);
    // A person's request and a miss are at info; the probe, answered, at debug.
    let levels: Vec<&str> = access
        .iter()
        .map(|l| l["level"].as_str().unwrap())
        .collect();
    assert_eq!(levels, ["INFO", "DEBUG", "INFO"], "{text}");
    assert!(
        access.iter().all(|l| l["fields"]["latency_ms"].is_f64()),
        "{text}"
    );
    for secret in ["987654", "feed-secret-123", "not-a-real-token-456", "31337"] {
        assert!(!text.contains(secret), "{secret} reached the logs:\n{text}");
    }
}
