//! What the audit log stores it can always give back: hostile JSON
//! posted as an audit event's `details` (the schema's only JSON column,
//! `audit_event.details jsonb`) is either refused with a clear 4xx and nothing
//! stored, or read back by `GET /api/v1/audit` equal to what was sent.
//!
//! Runs on the real Postgres (`DATABASE_URL`) via `#[sqlx::test]`.

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use gpu_booking_api::clock::SystemClock;
use gpu_booking_api::testing::{test_state, token_for};
use gpu_booking_core::booking_policy::Policy;
use http_body_util::BodyExt;
use serde_json::Value;
use sqlx::PgPool;
use std::sync::Arc;
use tower::ServiceExt;

const SECRET: &[u8] = b"audit-roundtrip-secret-0123456789abcdef";

async fn call(
    app: &Router,
    method: Method,
    uri: &str,
    role: &str,
    body: String,
) -> (StatusCode, Value) {
    let token = token_for(SECRET, "someone", Some(role));
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "{status}: body is not JSON ({e}): {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    (status, value)
}

fn app(pool: PgPool) -> Router {
    gpu_booking_api::app::router(test_state(
        pool,
        Policy::default(),
        Arc::new(SystemClock),
        SECRET,
    ))
}

/// Equal as JSON values, numbers compared as the f64 they denote (`-0` reads back as
/// `0`, `1e-400` as `0`, `12345678901234567890123` as its nearest f64).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

/// `levels` arrays and objects nested alternately around a number.
fn nested(levels: usize) -> String {
    let mut s = "1".to_string();
    for level in 0..levels {
        s = if level % 2 == 0 {
            format!("[{s}]")
        } else {
            format!(r#"{{"d":{s}}}"#)
        };
    }
    s
}

async fn stored(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_event")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The schema's JSON columns: this test covers each; a new one fails it until it is.
#[sqlx::test(migrations = "../migrations")]
async fn every_json_column_is_covered(pool: PgPool) {
    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT table_name || '.' || column_name FROM information_schema.columns
         WHERE table_schema = 'public' AND data_type IN ('json', 'jsonb') ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        columns,
        // notice.details: tests/it/notices.rs, odd_audit_details_make_plain_notices.
        // notebook.state: written only from the checked wire type of a report and
        // read back into it (tests/it/notebooks.rs; a bad notebook changes nothing).
        // offer.state: likewise, from the checked offers report (tests/it/offers.rs:
        // read back as sent; a bad report changes nothing).
        [
            "audit_event.details",
            "notebook.state",
            "notice.details",
            "offer.state"
        ],
        "cover the new JSON column in this test"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn hostile_details_are_refused_or_read_back_equal(pool: PgPool) {
    let app = app(pool.clone());
    let long = "x".repeat(60 * 1024);
    let accepted: Vec<(&str, String)> = vec![
        ("largest f64", "1.7976931348623157e308".into()),
        ("most negative f64", "-1.7976931348623157e308".into()),
        ("1e308", "1e308".into()),
        ("smallest subnormal", "5e-324".into()),
        ("negative subnormal", "-5e-324".into()),
        ("smallest normal", "2.2250738585072014e-308".into()),
        ("negative zero", "-0".into()),
        ("negative zero float", "-0.0".into()),
        ("underflow to zero", "1e-400".into()),
        ("u64 max", "18446744073709551615".into()),
        ("i64 min", "-9223372036854775808".into()),
        ("beyond u64", "12345678901234567890123".into()),
        ("inexact decimal", "0.30000000000000004".into()),
        (
            "many numbers",
            "[1e300, -1e-300, 3.141592653589793, 0, -1]".into(),
        ),
        ("long string", format!("\"{long}\"")),
        (
            "unicode escapes",
            r#"{"\u00e9\ud83d\ude00": "\u2028\u2029\ud83d\ude00 \"q\" \\ \/ \t \u001f"}"#.into(),
        ),
        ("nesting at the limit", nested(63)),
    ];
    for (name, value) in &accepted {
        let sent: Value = serde_json::from_str(&format!(r#"{{"k":{value}}}"#)).unwrap();
        let body = format!(r#"{{"action":"test.hostile","details":{{"k":{value}}}}}"#);
        let (status, answer) = call(&app, Method::POST, "/api/v1/audit", "service", body).await;
        assert_eq!(status, StatusCode::CREATED, "{name}: {answer}");
        let (status, page) = call(
            &app,
            Method::GET,
            "/api/v1/audit?limit=1",
            "admin",
            String::new(),
        )
        .await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{name}: the log no longer reads back: {page}"
        );
        let got = &page[0]["details"];
        assert!(same(got, &sent), "{name}: stored {sent}, read back {got}");
    }
    // The whole log reads back in one page, every row as stored.
    let (status, page) = call(
        &app,
        Method::GET,
        "/api/v1/audit?limit=1000",
        "admin",
        String::new(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page.as_array().map(Vec::len), Some(accepted.len()));

    let refused: Vec<(&str, String, StatusCode)> = vec![
        (
            "nesting past the limit",
            nested(64),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "nesting past the parser",
            nested(200),
            StatusCode::BAD_REQUEST,
        ),
        ("beyond f64", "1e400".into(), StatusCode::BAD_REQUEST),
        (
            "NUL in a string",
            r#""a\u0000b""#.into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "NUL in a key",
            r#"{"\u0000": 1}"#.into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "lone surrogate",
            r#""\ud800""#.into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "over 64 KiB",
            format!("\"{}\"", "y".repeat(70 * 1024)),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ];
    let before = stored(&pool).await;
    for (name, value, expected) in refused {
        let body = format!(r#"{{"action":"test.hostile","details":{{"k":{value}}}}}"#);
        let (status, answer) = call(&app, Method::POST, "/api/v1/audit", "service", body).await;
        assert_eq!(status, expected, "{name}: {answer}");
        assert!(
            answer["error"].is_string() && answer["message"].is_string(),
            "{name}: {answer}"
        );
        assert_eq!(
            stored(&pool).await,
            before,
            "{name}: stored although refused"
        );
    }
}

/// A row no API call can write (jsonb takes numbers no f64 holds) still leaves the log
/// readable: its details come back as text, the other rows as stored.
#[sqlx::test(migrations = "../migrations")]
async fn a_row_written_by_hand_does_not_break_the_log(pool: PgPool) {
    let app = app(pool.clone());
    sqlx::query(
        "INSERT INTO audit_event (at, actor, action, details)
         VALUES (now(), 'dba', 'by.hand', '{\"k\": 1e400}'::jsonb),
                (now(), 'dba', 'by.hand', '{\"k\": 2}'::jsonb)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let (status, page) = call(&app, Method::GET, "/api/v1/audit", "admin", String::new()).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page[0]["details"], serde_json::json!({"k": 2}));
    let text = page[1]["details"][gpu_booking_api::store::audit::UNREADABLE_DETAILS]
        .as_str()
        .unwrap_or_else(|| panic!("{page}"));
    assert!(text.starts_with("{\"k\": 1000000000"), "{text}");
}
