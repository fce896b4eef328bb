//! What a change of a booking does to its booked pods. The
//! controller follows the booking service's change stream (or, after a lost resume
//! point, a full listing) and asks this for each booked pod: keep it, give it a new
//! end, or end it now.

use chrono::{DateTime, TimeDelta, Utc};

/// Ends closer than this are the same (the webhook may write whole seconds).
pub const SAME_END: TimeDelta = TimeDelta::seconds(1);

/// A pod this much older than a listing was admitted against a booking that the
/// listing would hold if it were still current (the webhook read it committed before
/// the pod existed); younger pods are not judged by their absence (clock skew, and
/// the listing's request is older than its answer).
pub const LISTING_MARGIN: TimeDelta = TimeDelta::seconds(30);

/// A full listing of the bookings (`/booking-changes` without `after`) also holds
/// those that ended this recently (ended early or on time; cancelled ones never
/// had booked pods), so that a follower that lists again, having missed their
/// change (the stream held back by a long transaction, a lost resume point, a new
/// leader), ends their pods at once: an absent booking ends only pods older than
/// the listing by [`LISTING_MARGIN`]. Longer than that margin plus any staleness
/// of the webhook that admitted them, so that a pod of a booking that ended
/// before this is old enough to be ended by its booking's absence.
pub const LISTED_AFTER_END: TimeDelta = TimeDelta::minutes(10);

/// What the controller has read of a booked pod's booking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// The booking as it is now: over (cancelled or ended early) or not, and when
    /// its pods end.
    Booking { over: bool, pods_end: DateTime<Utc> },
    /// Absent from a full listing of the current bookings taken at `listed_at`.
    NotListed { listed_at: DateTime<Utc> },
    /// Not among the changes read: nothing new about it.
    Unchanged,
}

/// A booked pod's new end, and whether that is now; `None`: leave the pod as it is.
/// `current` is the pod's `terminate-at`, `started` when it started (or was created).
pub fn new_end(
    current: DateTime<Utc>,
    started: Option<DateTime<Utc>>,
    seen: Seen,
    now: DateTime<Utc>,
) -> Option<(DateTime<Utc>, bool)> {
    let (to, ends_now) = match seen {
        Seen::Booking {
            over: true,
            pods_end,
        } => (pods_end.min(now), true),
        Seen::Booking {
            over: false,
            pods_end,
        } => (pods_end, pods_end <= now),
        Seen::NotListed { listed_at }
            if started.is_some_and(|s| s < listed_at - LISTING_MARGIN) =>
        {
            (now, true)
        }
        Seen::NotListed { .. } | Seen::Unchanged => return None,
    };
    // A pod already due is the expiry timer's; an end within a second is the same.
    if current <= now || (current - to).abs() < SAME_END {
        return None;
    }
    Some((to, ends_now))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    const NOW: &str = "2026-11-23T12:00:00Z";

    fn booking(over: bool, pods_end: &str) -> Seen {
        Seen::Booking {
            over,
            pods_end: t(pods_end),
        }
    }

    #[test]
    fn a_booking_over_ends_its_pods_now() {
        let now = t(NOW);
        let end = t("2026-11-23T18:00:00Z");
        assert_eq!(
            new_end(end, None, booking(true, "2026-11-23T18:00:00Z"), now),
            Some((now, true))
        );
        // Ended early at 11:00 (its pods' end), read at noon: ends now, and says
        // when the booking ended.
        assert_eq!(
            new_end(end, None, booking(true, "2026-11-23T11:00:00Z"), now),
            Some((t("2026-11-23T11:00:00Z"), true))
        );
    }

    #[test]
    fn a_moved_end_re_times_the_pod_and_an_end_moved_into_the_past_ends_it() {
        let now = t(NOW);
        let end = t("2026-11-23T18:00:00Z");
        assert_eq!(
            new_end(end, None, booking(false, "2026-11-24T18:00:00Z"), now),
            Some((t("2026-11-24T18:00:00Z"), false))
        );
        assert_eq!(
            new_end(end, None, booking(false, "2026-11-23T14:00:00Z"), now),
            Some((t("2026-11-23T14:00:00Z"), false))
        );
        assert_eq!(
            new_end(end, None, booking(false, NOW), now),
            Some((now, true))
        );
    }

    #[test]
    fn the_same_end_a_due_pod_and_no_news_leave_the_pod() {
        let now = t(NOW);
        let end = t("2026-11-23T18:00:00Z");
        // Within a second (whole seconds on the pod).
        assert_eq!(
            new_end(end, None, booking(false, "2026-11-23T18:00:00.900Z"), now),
            None
        );
        // Already due: the expiry timer ends it.
        assert_eq!(new_end(now, None, booking(true, NOW), now), None);
        assert_eq!(new_end(end, None, Seen::Unchanged, now), None);
    }

    #[test]
    fn only_a_pod_clearly_older_than_a_listing_ends_for_its_missing_booking() {
        let now = t(NOW);
        let end = t("2026-11-23T18:00:00Z");
        let listed_at = t("2026-11-23T11:59:00Z");
        let seen = Seen::NotListed { listed_at };
        let old = Some(listed_at - LISTING_MARGIN - TimeDelta::seconds(1));
        let young = Some(listed_at - LISTING_MARGIN + TimeDelta::seconds(1));
        assert_eq!(new_end(end, old, seen, now), Some((now, true)));
        assert_eq!(new_end(end, young, seen, now), None);
        assert_eq!(new_end(end, None, seen, now), None);
    }
}
