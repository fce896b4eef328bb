//! The booking state on `/metrics` (issue 14, item 8): active and planned bookings,
//! and each model's declared, free, booked and lent units, read from the database at
//! each scrape; `gpu_booking_build_info` and the process metrics beside them; the
//! Prometheus text format when the scraper asks for it (and `promtool check metrics`
//! agrees with it, where promtool is installed).
//!
//! And the access log: one line per request, with its route template, never its path.
//!
//! Runs on the real Postgres (`DATABASE_URL`) via `#[sqlx::test]`.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use gpu_booking_api::clock::ManualClock;
use gpu_booking_api::testing::{test_state, token_for};
use gpu_booking_core::policy::Policy;
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
    match gpu_booking_ops::metrics::promtool_check(&text) {
        None => eprintln!("promtool not installed: `promtool check metrics` skipped"),
        Some(verdict) => verdict.expect("promtool check metrics"),
    }
}

/// What a `tracing` subscriber writes, kept for the test to read.
#[derive(Clone, Default)]
struct Capture(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Capture {
    type Writer = Capture;
    fn make_writer(&'a self) -> Capture {
        self.clone()
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn every_request_has_one_access_log_line_without_its_path(pool: PgPool) {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_writer(capture.clone())
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
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
    let text = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    let access: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["target"] == "gpu_booking_api::access")
        .collect();
    assert_eq!(access.len(), 3, "{text}");
    let routes: Vec<&str> = access
        .iter()
        .map(|l| l["fields"]["route"].as_str().unwrap())
        .collect();
    assert_eq!(routes, ["/api/v1/bookings/{id}", "/healthz", "unmatched"]);
    assert_eq!(access[0]["fields"]["method"], "GET");
    assert_eq!(access[0]["fields"]["status"], 401);
    assert_eq!(access[1]["fields"]["status"], 200);
    assert!(
        access.iter().all(|l| l["fields"]["latency_ms"].is_f64()),
        "{text}"
    );
    for secret in ["987654", "feed-secret-123", "not-a-real-token-456", "31337"] {
        assert!(!text.contains(secret), "{secret} reached the logs:\n{text}");
    }
}
