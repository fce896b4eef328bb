//! The answers the OpenAPI document promises for what happens around the handlers:
//! 415 for a body that is not JSON, 413 for one over the limit (both JSON errors,
//! both documented), and every operation listing 401 and 503.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use gpu_booking_api::clock::SystemClock;
use gpu_booking_api::openapi::ApiDoc;
use gpu_booking_api::testing::{test_state, token_for};
use gpu_booking_core::booking_policy::Policy;
use http_body_util::BodyExt;
use serde_json::Value;
use sqlx::PgPool;
use tower::ServiceExt;
use utoipa::OpenApi;

const SECRET: &[u8] = b"contract-test-secret-0123456789abcdef";

async fn post(pool: PgPool, content_type: Option<&str>, body: Vec<u8>) -> (StatusCode, Value) {
    let app = gpu_booking_api::app::router(test_state(
        pool,
        Policy::default(),
        Arc::new(SystemClock),
        SECRET,
    ));
    let mut req = Request::post("/api/v1/bookings").header(
        header::AUTHORIZATION,
        format!("Bearer {}", token_for(SECRET, "alice", None)),
    );
    if let Some(ct) = content_type {
        req = req.header(header::CONTENT_TYPE, ct);
    }
    let resp = app
        .oneshot(req.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).expect("a JSON error body"),
    )
}

#[sqlx::test(migrations = "../migrations")]
async fn a_body_that_is_not_json_is_415(pool: PgPool) {
    let (status, body) = post(pool, Some("text/plain"), b"{}".to_vec()).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(body["error"], "unsupported_media_type");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_body_over_the_limit_is_413(pool: PgPool) {
    // axum's default body limit is 2 MB.
    let mut big = br#"{"model": ""#.to_vec();
    big.extend(std::iter::repeat_n(b'a', 3 * 1024 * 1024));
    big.extend(br#""}"#);
    let (status, body) = post(pool, Some("application/json"), big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body["error"], "payload_too_large");
}

#[test]
fn every_operation_documents_what_the_layers_answer() {
    let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
    let mut operations = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            operations += 1;
            let responses = op["responses"].as_object().unwrap();
            // Operations without a bearer token (the calendar feeds: the token is in
            // the URL) never answer 401.
            let secured = op.get("security").is_some();
            for status in ["401", "503"] {
                assert!(
                    responses.contains_key(status) || (status == "401" && !secured),
                    "{method} {path} lacks {status}"
                );
            }
            assert!(
                responses["503"]["headers"]["Retry-After"].is_object(),
                "{method} {path}: 503 without Retry-After"
            );
            if op.get("requestBody").is_some() {
                for status in ["400", "413", "415", "422"] {
                    assert!(
                        responses.contains_key(status),
                        "{method} {path} lacks {status}"
                    );
                }
            }
        }
    }
    assert!(operations >= 10);
}
