//! What the booking API's router tests share: one request through the router, in
//! memory (`tower::ServiceExt::oneshot`), and its answer read whole. Each test file
//! keeps its own assertions on top (most refuse a 5xx).
#![allow(dead_code)] // each test file uses a part

use axum::body::{Body, Bytes};
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

/// An answer of the router, read whole.
pub struct Reply {
    pub status: StatusCode,
    /// The `Content-Type` header ("" without one).
    pub content_type: String,
    pub bytes: Bytes,
}

impl Reply {
    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    /// The body as JSON, `None` when it is not.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.bytes).ok()
    }

    /// The body as JSON, `Value::Null` when it is not.
    pub fn json_or_null(&self) -> Value {
        self.json().unwrap_or(Value::Null)
    }
}

/// A request with an optional bearer token and an optional JSON body.
pub fn request(
    method: Method,
    uri: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Request<Body> {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    match body {
        Some(b) => req
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(b.to_string())),
        None => req.body(Body::empty()),
    }
    .expect("a valid request")
}

/// Sends `req` through `app` and reads the answer whole.
pub async fn send(app: &Router, req: Request<Body>) -> Reply {
    let resp = app
        .clone()
        .oneshot(req)
        .await
        .expect("the router is infallible");
    let status = resp.status();
    let content_type = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    Reply {
        status,
        content_type,
        bytes,
    }
}

/// [`request`] then [`send`].
pub async fn call(
    app: &Router,
    method: Method,
    uri: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Reply {
    send(app, request(method, uri, token, body)).await
}

/// [`call`] as `who` (with `role`) under a token signed with `secret`, refusing a
/// 5xx; the body as JSON (`Value::Null` when it is not).
pub async fn call_as(
    app: &Router,
    secret: &[u8],
    method: Method,
    uri: &str,
    (who, role): (&str, Option<&str>),
    body: Option<&Value>,
) -> (StatusCode, Value) {
    let token = gpu_booking_api::testing::token_for(secret, who, role);
    let r = call(app, method, uri, Some(&token), body).await;
    let (status, bytes) = (r.status, &r.bytes);
    assert!(!status.is_server_error(), "{status}: {bytes:?}");
    (status, r.json_or_null())
}

/// The tests' "now": Monday 2030-01-07 00:00 UTC.
pub fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 1, 7, 0, 0, 0).unwrap()
}

pub fn secs(n: i64) -> TimeDelta {
    TimeDelta::seconds(n)
}

pub fn hours(n: i64) -> TimeDelta {
    TimeDelta::hours(n)
}

pub fn days(n: i64) -> TimeDelta {
    TimeDelta::days(n)
}

/// RFC 3339 as the API writes times (fractions only where there are any).
pub fn rfc(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

/// RFC 3339 in whole seconds.
pub fn rfc_secs(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
