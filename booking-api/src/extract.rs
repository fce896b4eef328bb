//! axum's extractors with our error body: a malformed body, query or path is a
//! JSON 400 like every other error, never axum's plain-text rejection.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts};

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
