//! The one error type of the API. Every error is JSON `{error, message, ...}`;
//! the caller's mistakes are 4xx, and internal failures are logged and answered
//! without detail.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use gpu_booking_core::rules::{Refusal, RuleCode};
use serde::Serialize;
use utoipa::ToSchema;

/// `Retry-After` of a 503 answer, in seconds.
pub const RETRY_AFTER_SECS: &str = "2";

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A booking rule refused the request.
    #[error("{}", .0.message)]
    Rule(Refusal),
    /// Malformed JSON, query or time.
    #[error("{0}")]
    BadRequest(String),
    /// The body is larger than the service accepts.
    #[error("{0}")]
    TooLarge(String),
    /// The body is not JSON (`Content-Type`).
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// Well-formed but not acceptable (outside the booking rules).
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    /// A conflict with existing state that is not a booking rule.
    #[error("{1}")]
    Conflict(&'static str, String),
    /// The database cannot be reached or is overloaded: try again.
    #[error("the booking database is unavailable")]
    Unavailable(#[source] sqlx::Error),
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

/// The body of every error answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// Machine-readable code: a rule (`cooldown`, `capacity`, ...) or
    /// `bad_request`, `invalid_request`, `unauthorized`, `forbidden`, `not_found`,
    /// `payload_too_large`, `unsupported_media_type`, `unavailable` (503, with
    /// `Retry-After`: the database is unreachable).
    pub error: String,
    /// What went wrong, in plain words.
    pub message: String,
    /// The earliest start this rule would accept, where there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub earliest_start: Option<DateTime<Utc>>,
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Rule(r) if r.code.is_conflict() => StatusCode::CONFLICT,
            ApiError::Rule(_) | ApiError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(..) => StatusCode::CONFLICT,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Rule(r) => r.code.as_str(),
            ApiError::BadRequest(_) => "bad_request",
            ApiError::TooLarge(_) => "payload_too_large",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::Invalid(_) => "invalid_request",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::NotFound(_) => "not_found",
            ApiError::Conflict(code, _) => code,
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Internal(_) => "internal",
        }
    }

    pub fn unknown_model(name: &str) -> ApiError {
        ApiError::Rule(Refusal::new(
            RuleCode::UnknownModel,
            format!("There is no GPU model called {name:?}."),
        ))
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> ApiError {
        match &e {
            // The database is down, restarting, unreachable or out of connections:
            // the request may succeed if tried again. Class 08 is a connection
            // exception, 57 an operator intervention (57P01 when a backend is
            // terminated, 57P03 while the server starts), 53 insufficient
            // resources (too many connections).
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => ApiError::Unavailable(e),
            sqlx::Error::Database(db)
                if db.code().is_some_and(|c| {
                    ["08", "57", "53"].iter().any(|class| c.starts_with(class))
                }) =>
            {
                ApiError::Unavailable(e)
            }
            // Class 22 (data exception: a NUL byte, a value out of range) is the
            // caller's input that got past validation; 23503 names a row that does
            // not exist. Neither is the server's fault.
            sqlx::Error::Database(db) if db.code().is_some_and(|c| c.starts_with("22")) => {
                ApiError::BadRequest(format!("invalid value: {}", db.message()))
            }
            sqlx::Error::Database(db) if db.code().as_deref() == Some("23503") => {
                ApiError::Invalid("the request refers to something that does not exist".into())
            }
            _ => ApiError::Internal(e.into()),
        }
    }
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> ApiError {
        ApiError::Rule(r)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::error!(error = ?self, "request failed");
        }
        let earliest_start = match &self {
            ApiError::Rule(r) => r.earliest_start,
            _ => None,
        };
        let body = ErrorBody {
            error: self.code().to_string(),
            message: self.to_string(),
            earliest_start,
        };
        let mut response = (status, Json(body)).into_response();
        if matches!(self, ApiError::Unavailable(_)) {
            // Worth another try soon (RFC 9110, 10.2.3).
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        }
        response
    }
}
