//! Conditional requests of the resources that have an `ETag` (bookings, groups):
//! the answer with its tag, and the request's `If-Match` (RFC 9110 §13.1.1), read
//! once for all of them.

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use gpu_booking_core::precondition::{IfMatch, MalformedIfMatch};
use serde::Serialize;

use crate::error::ApiError;

/// `body` as JSON with the `ETag` header `etag` (left out if it is no valid header
/// value: the tags are ours, so never).
pub fn with_etag(etag: &str, body: impl Serialize) -> Response {
    let mut response = axum::Json(body).into_response();
    if let Ok(value) = axum::http::HeaderValue::from_str(etag) {
        response
            .headers_mut()
            .insert(axum::http::header::ETAG, value);
    }
    response
}

/// The request's `If-Match` condition, if it sends one; 400 when it is malformed.
pub fn if_match(headers: &HeaderMap) -> Result<Option<IfMatch>, ApiError> {
    let Some(value) = headers.get(axum::http::header::IF_MATCH) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| ApiError::BadRequest(MalformedIfMatch.to_string()))?;
    IfMatch::parse(value)
        .map(Some)
        .map_err(|e| ApiError::BadRequest(e.to_string()))
}
