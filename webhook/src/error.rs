//! Why the booking service gave no usable answer: one type for both ways of asking
//! (a lookup in [`crate::booking_source`], the live [`crate::replica`]), in a module of its
//! own so that neither imports the other for it.

use std::time::Duration;

/// Why the booking service gave no usable answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BookingError {
    #[error("booking service answered HTTP {0}")]
    Status(u16),
    #[error("booking service did not answer within {0:?}")]
    Timeout(Duration),
    #[error("booking service unreachable: {0}")]
    Transport(String),
    #[error("booking service sent an unreadable answer: {0}")]
    Body(String),
    #[error("no service token: {0}")]
    Token(String),
    #[error("the admission replica has not listed the booking service's state yet")]
    NotSynced,
    #[error("the admission replica is {} s old, past --replica-max-staleness", .0.as_secs())]
    Stale(Duration),
    #[error("booking service would refuse the query: {0}")]
    Invalid(String),
}

impl BookingError {
    /// The outcome label of the booking-request metric.
    pub(crate) fn outcome(&self) -> &'static str {
        match self {
            BookingError::Timeout(_) => "timeout",
            _ => "error",
        }
    }
}

impl From<gpu_booking_client::TokenError> for BookingError {
    fn from(e: gpu_booking_client::TokenError) -> Self {
        BookingError::Token(e.0)
    }
}
