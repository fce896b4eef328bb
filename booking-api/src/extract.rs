//! axum's extractors with our error body: a malformed body, query or path is a
//! JSON 400 like every other error, never axum's plain-text rejection. And
//! [`refuse_nul`], which answers input that the database would refuse before a
//! handler reads it, and [`time_zone_or`], a request's optional zone read alike.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::middleware::Next;
use axum::response::Response;
use gpu_booking_core::input::{json_holds_nul, target_holds_nul};

use crate::error::ApiError;

#[derive(FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct Json<T>(pub T);

#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct Query<T>(pub T);

#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct Path<T>(pub T);

impl From<JsonRejection> for ApiError {
    /// A body over the limit stays 413 and a body that is not JSON 415 (as the
    /// OpenAPI document says); every other rejection is the caller's malformed JSON.
    fn from(r: JsonRejection) -> ApiError {
        match r.status() {
            axum::http::StatusCode::PAYLOAD_TOO_LARGE => ApiError::TooLarge(r.body_text()),
            axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE => {
                ApiError::UnsupportedMediaType(r.body_text())
            }
            _ => ApiError::BadRequest(r.body_text()),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> ApiError {
        ApiError::BadRequest(r.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> ApiError {
        ApiError::BadRequest(r.body_text())
    }
}

/// Refuses a request whose path, query or body holds a NUL character (U+0000) with
/// a 400 in our words: Postgres stores none in text or JSON, and its own refusal
/// names its internals. The body is in memory already (the server reads it whole
/// within its limits before routing).
pub async fn refuse_nul(req: Request, next: Next) -> Result<Response, ApiError> {
    const NUL: &str =
        "the request holds a NUL character (U+0000, `%00` or `\\u0000`), which no field accepts";
    let target = req.uri().path_and_query().map_or("", |pq| pq.as_str());
    if target_holds_nul(target) {
        return Err(ApiError::BadRequest(NUL.into()));
    }
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .map_err(|_| ApiError::BadRequest("the request body could not be read".into()))?;
    if json_holds_nul(&bytes) {
        return Err(ApiError::BadRequest(NUL.into()));
    }
    Ok(next
        .run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await)
}

/// The IANA time zone a request names in its field `time_zone`, else `lab` (the lab's,
/// `--time-zone`); an unknown name is a 422.
pub fn time_zone_or(lab: chrono_tz::Tz, named: Option<&str>) -> Result<chrono_tz::Tz, ApiError> {
    match named.map(str::trim) {
        None => Ok(lab),
        Some(name) => name
            .parse()
            .map_err(|_| ApiError::Invalid(format!("time_zone: {name:?} is no IANA time zone"))),
    }
}
