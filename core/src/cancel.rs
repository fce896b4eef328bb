//! What `DELETE /api/v1/bookings/{id}` does to a booking: a planned one is
//! cancelled (it frees its units and leaves no cooldown), a running one ends now
//! (the cooldown counts from now), an ended or cancelled one cannot change.
//!
//! The store applies the outcome under the booking's locks; the rules' property
//! test (`core/tests/rules_model.rs`) checks this same function against its
//! reference.

use chrono::{DateTime, TimeDelta, Utc};

use crate::window::BookingStatus;

/// What cancelling a booking does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// Cancelled: as if never booked.
    Cancel,
    /// Its end moves to now.
    EndEarly,
    /// Ended or cancelled already (the status it has): nothing changes.
    NotCancellable(BookingStatus),
}

/// The outcome for a booking in `status` that starts at `start`, at `now`.
/// Ending a booking within a microsecond of its start would leave an empty window
/// (the database keeps microseconds): that is a cancellation.
pub fn cancel_or_end(
    status: BookingStatus,
    start: DateTime<Utc>,
    now: DateTime<Utc>,
) -> CancelOutcome {
    match status {
        BookingStatus::Planned => CancelOutcome::Cancel,
        BookingStatus::Active if now <= start + TimeDelta::microseconds(1) => CancelOutcome::Cancel,
        BookingStatus::Active => CancelOutcome::EndEarly,
        status @ (BookingStatus::Ended | BookingStatus::Cancelled) => {
            CancelOutcome::NotCancellable(status)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::Window;
    use chrono::TimeZone;

    fn t(h: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, h, 0, 0).unwrap()
    }

    fn outcome(now: DateTime<Utc>, cancelled: bool) -> CancelOutcome {
        let window = Window::new(t(2), t(4)).unwrap();
        cancel_or_end(
            BookingStatus::at(now, &window, cancelled),
            window.start(),
            now,
        )
    }

    #[test]
    fn planned_is_cancelled_running_ends_early_over_stays() {
        assert_eq!(outcome(t(1), false), CancelOutcome::Cancel);
        assert_eq!(outcome(t(3), false), CancelOutcome::EndEarly);
        assert_eq!(
            outcome(t(4), false),
            CancelOutcome::NotCancellable(BookingStatus::Ended)
        );
        assert_eq!(
            outcome(t(1), true),
            CancelOutcome::NotCancellable(BookingStatus::Cancelled)
        );
    }

    #[test]
    fn at_its_first_instant_a_running_booking_is_cancelled() {
        assert_eq!(outcome(t(2), false), CancelOutcome::Cancel);
        let just_after = t(2) + TimeDelta::microseconds(1);
        assert_eq!(outcome(just_after, false), CancelOutcome::Cancel);
        let later = t(2) + TimeDelta::microseconds(2);
        assert_eq!(outcome(later, false), CancelOutcome::EndEarly);
    }
}
