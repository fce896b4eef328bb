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

use crate::store::error::{Conflict, Record, StoreError};

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
    /// `If-Match` names a state the record no longer has: nothing was changed.
    #[error("{0}")]
    PreconditionFailed(String),
    /// Too many writes from one user or one address: try again after
    /// `retry_after` seconds.
    #[error("{message}")]
    RateLimited { message: String, retry_after: u64 },
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
    /// `payload_too_large`, `unsupported_media_type`, `precondition_failed` (412:
    /// `If-Match` names an older state), `rate_limited` (429, with `Retry-After`),
    /// `unavailable` (503, with `Retry-After`: the database is unreachable).
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
            ApiError::PreconditionFailed(_) => StatusCode::PRECONDITION_FAILED,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
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
            ApiError::PreconditionFailed(_) => "precondition_failed",
            ApiError::RateLimited { .. } => "rate_limited",
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

/// Whether `e` says the database is down, restarting, unreachable or out of
/// connections (the request may succeed if tried again), rather than refusing
/// one statement. Class 08 is a connection exception, 57 an operator intervention
/// (57P01 when a backend is terminated, 57P03 while the server starts), 53
/// insufficient resources (too many connections).
pub fn database_unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| ["08", "57", "53"].iter().any(|class| c.starts_with(class))),
        _ => false,
    }
}

/// A data exception's answer (class 22: the caller's input that got past
/// validation), in our words: the database's own text names its internals and is
/// never sent.
fn data_exception(code: &str) -> ApiError {
    let what = match code {
        // character_not_in_repertoire, untranslatable_character (`\u0000` in jsonb).
        "22021" | "22P05" => "a text holds a character that cannot be stored (such as U+0000)",
        "22001" => "a text is longer than the service stores",
        "22003" => "a number is out of range",
        "22007" | "22008" => "a date or time is out of range",
        _ => "a value cannot be stored as given",
    };
    ApiError::BadRequest(format!("invalid value: {what}"))
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> ApiError {
        if database_unreachable(&e) {
            return ApiError::Unavailable(e);
        }
        match &e {
            // Class 22 (data exception: a NUL byte, a value out of range) is the
            // caller's input that got past validation; 23503 names a row that does
            // not exist. Neither is the server's fault.
            sqlx::Error::Database(db) if db.code().is_some_and(|c| c.starts_with("22")) => {
                tracing::debug!(error = %db, "the database refused a value");
                data_exception(db.code().as_deref().unwrap_or_default())
            }
            sqlx::Error::Database(db) if db.code().as_deref() == Some("23503") => {
                ApiError::Invalid("the request refers to something that does not exist".into())
            }
            _ => ApiError::Internal(e.into()),
        }
    }
}

/// The store's failures as the API answers them: the refusals of `core` in their
/// own words, the rest worded here.
impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        match e {
            StoreError::Rule(refused) => ApiError::Rule(refused),
            StoreError::Capacity(refused) => ApiError::Rule(refused.into()),
            StoreError::UnknownModel(name) => ApiError::unknown_model(&name),
            StoreError::NotFound(Record::Booking, id) => {
                ApiError::NotFound(format!("no booking {id}"))
            }
            StoreError::NotFound(Record::WaitlistEntry, id) => {
                ApiError::NotFound(format!("no waitlist entry {id}"))
            }
            StoreError::Conflict(conflict) => conflict_error(conflict),
            StoreError::Database(e) => e.into(),
        }
    }
}

fn conflict_error(conflict: Conflict) -> ApiError {
    match conflict {
        Conflict::BookingNotCancellable { id, status } => ApiError::Conflict(
            "not_cancellable",
            format!(
                "booking {id} is {} and cannot be cancelled or ended",
                status.as_str()
            ),
        ),
        Conflict::BookingNotChangeable { id, status } => ApiError::Conflict(
            "not_changeable",
            format!("booking {id} is {} and cannot be changed", status.as_str()),
        ),
        Conflict::WaitlistEntryNotCancellable { id, state } => ApiError::Conflict(
            "not_cancellable",
            format!("waitlist entry {id} is {state} and cannot be cancelled"),
        ),
        Conflict::AlreadyWaiting { model } => ApiError::Conflict(
            "already_waiting",
            format!("You are already on the waitlist of {model}; cancel that entry to change it."),
        ),
        Conflict::Stale { id } => ApiError::PreconditionFailed(format!(
            "booking {id} has changed since the ETag sent in If-Match was read; nothing was \
             changed: read it again and decide on its current state"
        )),
        Conflict::UsernameCollision => ApiError::Conflict(
            "username_collision",
            "This user name cannot be told apart from another user's in the \
             labels JupyterHub puts on pods (its KubeSpawner slug, or the name \
             itself, is the other user's), so its pods could get the other \
             user's booking. Ask an admin to rename one of the two users."
                .into(),
        ),
    }
}

/// Marks an answer given because the database could not be reached.
#[derive(Debug, Clone, Copy)]
pub struct DatabaseUnreachable;

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
        match self {
            ApiError::Unavailable(_) => {
                // Worth another try soon (RFC 9110, 10.2.3).
                response.headers_mut().insert(
                    axum::http::header::RETRY_AFTER,
                    axum::http::HeaderValue::from_static(RETRY_AFTER_SECS),
                );
                // For the metrics middleware: the database is down (`database_up`).
                response.extensions_mut().insert(DatabaseUnreachable);
            }
            ApiError::RateLimited { retry_after, .. } => {
                response.headers_mut().insert(
                    axum::http::header::RETRY_AFTER,
                    axum::http::HeaderValue::from(retry_after),
                );
            }
            _ => {}
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_booking_core::capacity::CapacityRefusal;
    use gpu_booking_core::rules::overlap_backstop;
    use gpu_booking_core::window::{BookingStatus, Window};

    fn answer(e: StoreError) -> (StatusCode, &'static str, String) {
        let api = ApiError::from(e);
        (api.status(), api.code(), api.to_string())
    }

    /// The store's values answer as its `ApiError`s did before it had its own error
    /// type: the same status, code and words.
    #[test]
    fn store_errors_answer_as_before() {
        let t = |s: &str| s.parse::<DateTime<Utc>>().unwrap();
        let window = Window::new(t("2026-03-01T00:00:00Z"), t("2026-03-03T00:00:00Z")).unwrap();
        let full = CapacityRefusal::Full {
            model: "a100".into(),
            units: 2,
            need: 1,
            window,
            earliest_start: Some(t("2026-03-05T00:00:00Z")),
        };
        let api = ApiError::from(StoreError::Capacity(full));
        assert_eq!(api.status(), StatusCode::CONFLICT);
        assert_eq!(api.code(), "capacity");
        assert_eq!(
            api.to_string(),
            "All 2 units of a100 are booked at some point between 2026-03-01T00:00:00Z and 2026-03-03T00:00:00Z."
        );
        assert!(
            matches!(api, ApiError::Rule(r) if r.earliest_start == Some(t("2026-03-05T00:00:00Z")))
        );
        let cases = [
            (
                StoreError::Capacity(CapacityRefusal::Full {
                    model: "a100".into(),
                    units: 4,
                    need: 3,
                    window,
                    earliest_start: None,
                }),
                StatusCode::CONFLICT,
                "capacity",
                "Fewer than 3 of the 4 units of a100 are free at some point between 2026-03-01T00:00:00Z and 2026-03-03T00:00:00Z.",
            ),
            (
                StoreError::Capacity(CapacityRefusal::NoUnitAssignable),
                StatusCode::CONFLICT,
                "capacity",
                "No unit of this model can be assigned over that window.",
            ),
            (
                StoreError::Capacity(CapacityRefusal::UnitTaken),
                StatusCode::CONFLICT,
                "capacity",
                "Every unit of this model is booked in that window.",
            ),
            (
                StoreError::Rule(overlap_backstop()),
                StatusCode::CONFLICT,
                "overlap",
                "The user already holds a booking in that window.",
            ),
            (
                StoreError::UnknownModel("h100".into()),
                StatusCode::UNPROCESSABLE_ENTITY,
                "unknown_model",
                "There is no GPU model called \"h100\".",
            ),
            (
                StoreError::NotFound(Record::Booking, 7),
                StatusCode::NOT_FOUND,
                "not_found",
                "no booking 7",
            ),
            (
                StoreError::NotFound(Record::WaitlistEntry, 8),
                StatusCode::NOT_FOUND,
                "not_found",
                "no waitlist entry 8",
            ),
            (
                StoreError::Conflict(Conflict::BookingNotCancellable {
                    id: 7,
                    status: BookingStatus::Ended,
                }),
                StatusCode::CONFLICT,
                "not_cancellable",
                "booking 7 is ended and cannot be cancelled or ended",
            ),
            (
                StoreError::Conflict(Conflict::BookingNotChangeable {
                    id: 7,
                    status: BookingStatus::Cancelled,
                }),
                StatusCode::CONFLICT,
                "not_changeable",
                "booking 7 is cancelled and cannot be changed",
            ),
            (
                StoreError::Conflict(Conflict::WaitlistEntryNotCancellable {
                    id: 8,
                    state: "booked".into(),
                }),
                StatusCode::CONFLICT,
                "not_cancellable",
                "waitlist entry 8 is booked and cannot be cancelled",
            ),
            (
                StoreError::Conflict(Conflict::AlreadyWaiting {
                    model: "a100".into(),
                }),
                StatusCode::CONFLICT,
                "already_waiting",
                "You are already on the waitlist of a100; cancel that entry to change it.",
            ),
            (
                StoreError::Conflict(Conflict::UsernameCollision),
                StatusCode::CONFLICT,
                "username_collision",
                "This user name cannot be told apart from another user's in the labels \
                 JupyterHub puts on pods (its KubeSpawner slug, or the name itself, is the \
                 other user's), so its pods could get the other user's booking. Ask an \
                 admin to rename one of the two users.",
            ),
            (
                StoreError::Database(sqlx::Error::PoolTimedOut),
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the booking database is unavailable",
            ),
        ];
        for (store, status, code, message) in cases {
            assert_eq!(answer(store), (status, code, message.to_string()));
        }
    }
}
