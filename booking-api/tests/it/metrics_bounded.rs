//! Nobody can grow `/metrics`: every label value comes from a
//! closed set, so 10,000 requests with made-up methods, paths and ids add no series.
//!
//! Runs on the real Postgres (`DATABASE_URL`) via `#[sqlx::test]`.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request};
use axum::Router;
use gpu_booking_api::clock::SystemClock;
use gpu_booking_api::testing::test_state;
use gpu_booking_core::booking_policy::Policy;
use http_body_util::BodyExt;
use sqlx::PgPool;
use tower::ServiceExt;

const SECRET: &[u8] = b"metrics-bounded-secret-0123456789abcdef";

async fn send(app: &Router, method: &str, path: &str) {
    let method = Method::from_bytes(method.as_bytes()).unwrap();
    let req = Request::builder()
        .method(method)
        .uri(path)
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let _ = res.into_body().collect().await.unwrap();
}

/// The metric series (sample lines without their values) of `/metrics`, and its size.
async fn series(app: &Router) -> (Vec<String>, usize) {
    let req = Request::get("/metrics").body(Body::empty()).unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let text =
        String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    let lines = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            l.rsplit_once(' ')
                .map_or(l, |(series, _)| series)
                .to_string()
        })
        .collect();
    (lines, text.len())
}

/// Request `i` of the storm: a made-up method, a made-up path or a real route with a
/// made-up id, each different.
fn made_up(i: usize) -> (String, String) {
    match i % 4 {
        0 => (format!("FOO{i}"), "/api/v1/models".to_string()),
        1 => ("GET".to_string(), format!("/no/such/path/{i}")),
        2 => (format!("X-{i}"), format!("/api/v1/bookings/{i}")),
        _ => ("DELETE".to_string(), format!("/api/v1/bookings/{i}x")),
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn made_up_methods_and_paths_do_not_grow_metrics(pool: PgPool) {
    let state = test_state(pool, Policy::default(), Arc::new(SystemClock), SECRET);
    let app = gpu_booking_api::app::router(state);
    // Every kind once, so that the closed set's series exist.
    for i in 0..100 {
        let (method, path) = made_up(i);
        send(&app, &method, &path).await;
    }
    // The first scrape is counted only after it is answered.
    let _ = series(&app).await;
    let (before, size_before) = series(&app).await;
    for i in 100..10_100 {
        let (method, path) = made_up(i);
        send(&app, &method, &path).await;
    }
    let (after, size_after) = series(&app).await;
    println!(
        "/metrics: {} series, {size_before} bytes after 100 made-up requests; {} series, {size_after} bytes after 10,000 more",
        before.len(),
        after.len()
    );
    assert_eq!(before, after, "10,000 made-up requests added series");
    let text = after.join("\n");
    for leaked in ["FOO1", "X-2", "/no/such", "bookings/2\""] {
        assert!(!text.contains(leaked), "{leaked} reached a label:\n{text}");
    }
    assert!(text.contains("method=\"other\""), "{text}");
    assert!(text.contains("route=\"unmatched\""), "{text}");
}
