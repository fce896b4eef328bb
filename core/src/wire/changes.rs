//! `GET /api/v1/booking-changes`: the stream of booking changes that the controller
//! and the webhook's replica follow (`gpu_booking_client::Follower`), with resume and
//! long poll.

use std::time::{Duration, Instant};

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

impl BookingChange {
    /// The maintenance window or course reservation whose row this is, `None` for a
    /// person's booking: a hold's row is a booking of the hold's own user
    /// ([`crate::holds::HoldRef::user_name`], a name no person can have). A follower
    /// gives a maintenance window's units to nobody and a course occurrence's to its
    /// group's members, up to the booking's `units`, between its `start` and `end`.
    pub fn hold(&self) -> Option<crate::holds::HoldRef> {
        crate::holds::HoldRef::from_user(&self.booking.user)
    }
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

impl BookingChanges {
    /// How far this answer says the stream lags the database; `None` for a full
    /// answer (`more`): the follower is no newer than before until it has read on.
    pub fn lag(&self) -> Option<Duration> {
        (!self.more).then(|| Duration::from_millis(self.behind_ms))
    }

    /// Whether a long transaction in the booking database holds changes back.
    pub fn held_back(&self) -> bool {
        self.behind_ms > 0
    }

    /// Up to when a read that started at `started` makes its follower current: back
    /// by [`BookingChanges::lag`] (the service measured it at its read, which came
    /// after `started`, so this errs on the old side). `None` (no newer than before)
    /// for a full answer, or when the lag goes back beyond the clock's origin.
    pub fn current_as_of(&self, started: Instant) -> Option<Instant> {
        started.checked_sub(self.lag()?)
    }

    /// Whether a follower that is current as of `current_as_of` should list again
    /// after this answer: the stream is held back and what the follower holds is
    /// `relist_after` old or older (never for a zero `relist_after`). A listing
    /// reads the bookings themselves, which the hold does not delay, so a follower
    /// that lists by this rule stays about `relist_after` behind them at most, and
    /// lists at most once per `relist_after` (a listing makes it current as of its
    /// start). The webhook's replica and the controller's follower both list by it.
    pub fn calls_for_listing(
        &self,
        current_as_of: Option<Instant>,
        relist_after: Duration,
    ) -> bool {
        self.held_back()
            && !relist_after.is_zero()
            && current_as_of.is_some_and(|at| at.elapsed() >= relist_after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(behind_ms: u64, more: bool) -> BookingChanges {
        BookingChanges {
            changes: vec![],
            next: 0,
            behind_ms,
            more,
        }
    }

    #[test]
    fn a_read_is_current_as_of_its_start_less_the_streams_lag() {
        let started = Instant::now() + Duration::from_secs(10);
        assert_eq!(page(0, false).current_as_of(started), Some(started));
        assert_eq!(
            page(1500, false).current_as_of(started),
            Some(started - Duration::from_millis(1500))
        );
        assert_eq!(page(0, true).lag(), None);
        assert_eq!(page(0, true).current_as_of(started), None);
    }

    #[test]
    fn only_a_held_stream_with_old_bookings_calls_for_a_listing() {
        let age = Duration::from_secs(30);
        let old = Instant::now().checked_sub(Duration::from_secs(31));
        let young = Some(Instant::now());
        assert!(page(5, false).calls_for_listing(old, age));
        // A full answer still counts as held back: it says nothing newer.
        assert!(page(5, true).calls_for_listing(old, age));
        assert!(!page(0, false).calls_for_listing(old, age), "not held back");
        assert!(
            !page(5, false).calls_for_listing(young, age),
            "listed lately"
        );
        assert!(
            !page(5, false).calls_for_listing(None, age),
            "never current"
        );
        assert!(
            !page(5, false).calls_for_listing(old, Duration::ZERO),
            "off"
        );
    }
}
