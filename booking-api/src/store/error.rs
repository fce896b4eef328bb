//! What the store's changes can fail with: the values of `core` that refused, a
//! record that is not there, a conflict with the state of one, or the database.
//! No message text and no HTTP status: `crate::error` words and answers them.

use gpu_booking_core::capacity::CapacityRefusal;
use gpu_booking_core::rules::Refusal;
use gpu_booking_core::window::BookingStatus;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A booking rule of `core::rules` (or `core::waitlist`) refused.
    #[error("{}", .0.message)]
    Rule(Refusal),
    /// The model cannot take the booking.
    #[error("refused for capacity: {0:?}")]
    Capacity(CapacityRefusal),
    /// No model of that name.
    #[error("unknown model {0:?}")]
    UnknownModel(String),
    /// No record of that kind and id.
    #[error("no {0:?} {1}")]
    NotFound(Record, i64),
    /// The record's state does not allow the change.
    #[error("conflict: {0:?}")]
    Conflict(Conflict),
    /// The database failed (or refused what no rule above covers).
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// The kinds of record a change names by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    Booking,
    WaitlistEntry,
}

/// A change that the state of what it names does not allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conflict {
    /// Cancelling or ending a booking that has ended or is cancelled.
    BookingNotCancellable { id: i64, status: BookingStatus },
    /// Changing the window of a booking that has ended, was ended early or is
    /// cancelled.
    BookingNotChangeable { id: i64, status: BookingStatus },
    /// Cancelling a waitlist entry that is no longer waiting (`state`: booked,
    /// expired, cancelled).
    WaitlistEntryNotCancellable { id: i64, state: String },
    /// The user already waits for the model.
    AlreadyWaiting { model: String },
    /// The user's name cannot be told apart from another user's in pod labels.
    UsernameCollision,
    /// `If-Match` names a state the booking no longer has.
    Stale { id: i64 },
}

impl From<Refusal> for StoreError {
    fn from(refused: Refusal) -> StoreError {
        StoreError::Rule(refused)
    }
}

impl From<CapacityRefusal> for StoreError {
    fn from(refused: CapacityRefusal) -> StoreError {
        StoreError::Capacity(refused)
    }
}
