//! The time a usage report is recorded at, on the real Postgres: the controller's
//! count's (`counted_at`), never later than the report's receipt, the receipt when
//! the report does not say. The webhook's lend ledger reads it from the
//! schedulability answer and keeps a unit it admitted until a count taken after it.

use crate::common;

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use chrono::{DateTime, TimeDelta, Utc};
use common::t0;
use gpu_booking_api::clock::ManualClock;
use gpu_booking_api::testing::test_state;
use gpu_booking_core::booking_policy::Policy;
use serde_json::{json, Value};
use sqlx::PgPool;

const SECRET: &[u8] = b"usage-time-test-secret-0123456789abcdefghij";

const ADMIN: (&str, Option<&str>) = ("root@lab", Some("admin"));
const SERVICE: (&str, Option<&str>) = ("controller", Some("service"));

async fn call(
    app: &axum::Router,
    method: Method,
    uri: &str,
    who: (&str, Option<&str>),
    body: Option<Value>,
) -> (StatusCode, Value) {
    common::call_as(app, SECRET, method, uri, who, body.as_ref()).await
}

/// a100 as `GET /models` shows it and the time the schedulability answer (what the
/// webhook reads) gives its report.
async fn recorded(app: &axum::Router) -> (Value, Option<DateTime<Utc>>) {
    let (s, models) = call(app, Method::GET, "/api/v1/models", ADMIN, None).await;
    assert_eq!(s, StatusCode::OK, "{models}");
    let a100 = models
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["name"] == "a100"))
        .cloned()
        .expect("a100 listed");
    let (s, answer) = call(app, Method::GET, "/api/v1/schedulability", SERVICE, None).await;
    assert_eq!(s, StatusCode::OK, "{answer}");
    let at = |v: &Value| serde_json::from_value::<DateTime<Utc>>(v.clone()).ok();
    assert_eq!(
        at(&a100["usage_reported_at"]),
        at(&answer["usage_reported_at"]["a100"]),
        "the models and the webhook's answer agree"
    );
    (a100.clone(), at(&a100["usage_reported_at"]))
}

#[sqlx::test(migrations = "../migrations")]
async fn a_usage_report_is_recorded_at_its_count_never_after_its_receipt(pool: PgPool) {
    let clock = Arc::new(ManualClock::new(t0()));
    let app =
        gpu_booking_api::app::router(test_state(pool, Policy::default(), clock.clone(), SECRET));
    let (s, b) = call(
        &app,
        Method::PUT,
        "/api/v1/models/a100",
        ADMIN,
        Some(json!({"units": 2})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let usage = |body: Value| {
        call(
            &app,
            Method::PUT,
            "/api/v1/models/a100/usage",
            SERVICE,
            Some(body),
        )
    };
    let secs = TimeDelta::seconds;

    // Counted 4 s before it arrived (a slow send): the count's time.
    let (s, b) = usage(json!({"in_use": 1, "cards": 2, "counted_at": t0() - secs(4)})).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (m, at) = recorded(&app).await;
    assert_eq!(at, Some(t0() - secs(4)));
    assert_eq!(m["in_use"], 1);

    // A count stamped after its receipt (a controller's clock ahead): the receipt.
    let (s, b) = usage(json!({"in_use": 2, "cards": 2, "counted_at": t0() + secs(60)})).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(recorded(&app).await.1, Some(t0()));

    // An older controller's report, without the count's time: the receipt.
    clock.advance(secs(10));
    let (s, b) = usage(json!({"in_use": 0, "cards": 2})).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (m, at) = recorded(&app).await;
    assert_eq!(at, Some(t0() + secs(10)));
    assert_eq!(m["in_use"], 0);

    // A time that is none: refused, nothing changed.
    let (s, b) = usage(json!({"in_use": 2, "cards": 2, "counted_at": "yesterday"})).await;
    assert!(s.is_client_error(), "{s} {b}");
    let (m, at) = recorded(&app).await;
    assert_eq!((m["in_use"].clone(), at), (json!(0), Some(t0() + secs(10))));
}
