//! `GET /api/v1/booking-changes`: the stream of booking changes that the controller
//! and the webhook's replica follow (`gpu_booking_client::Follower`), with resume and
//! long poll.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::Booking;

/// One change of one booking, with the booking as it is now (a follower needs no
/// second call).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BookingChange {
    /// The change's number (unique, increasing within a transaction; 0 for `current`).
    pub seq: i64,
    /// `created`, `cancelled`, `ended_early`, `moved` (start or end changed),
    /// `updated` (its unit reassigned), or `current` (a listing without `after`).
    #[cfg_attr(feature = "openapi", schema(example = "ended_early"))]
    pub kind: String,
    /// When the change was made.
    pub at: DateTime<Utc>,
    /// The booking's current state (not as it was at the change).
    pub booking: Booking,
}

/// One answer of the stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BookingChanges {
    /// In the order the changes were made, each transaction's changes together.
    pub changes: Vec<BookingChange>,
    /// Pass as `after` to get what comes next.
    pub next: i64,
    /// How far the stream lags the database, in milliseconds: every change committed
    /// more than this before the answer is in it or in an earlier one (unless
    /// `more`). About 0 while all is well. A change is served only once every older
    /// transaction of the booking database has finished, so one that runs long (a
    /// bulk load, a migration, a session left open) holds back every booking change
    /// made after it began, and this grows until it ends: a follower counts it as
    /// staleness (the webhook's replica does). Absent from older services: 0.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(example = 0))]
    pub behind_ms: u64,
    /// The answer is full: more changes wait beyond `next` (read again at once), and
    /// the follower is not current until an answer without `more`.
    #[serde(default)]
    pub more: bool,
}
