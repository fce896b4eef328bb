//! What a calendar feed may say about a booking: who booked a unit
//! is the booker's business, so a model's occupancy feed names only the feed owner's
//! own bookings unless the lab's policy publishes names.

use crate::booking_policy::Policy;

/// The title of a booking in a model's occupancy feed seen by `viewer`.
pub fn occupancy_summary(
    policy: &Policy,
    viewer: &str,
    owner: &str,
    model: &str,
    slot: i32,
) -> String {
    let unit = i64::from(slot) + 1;
    if owner == viewer {
        format!("{model} #{unit}: your booking")
    } else if policy.feed_show_names {
        format!("{model} #{unit}: {owner}")
    } else {
        format!("{model} #{unit}: booked")
    }
}

/// The title of one of the viewer's own bookings in their feed.
pub fn own_summary(model: &str, slot: i32) -> String {
    format!("GPU booking: {model} #{}", i64::from(slot) + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn others_are_named_only_when_the_policy_allows() {
        let closed = Policy::default();
        assert_eq!(
            occupancy_summary(&closed, "ann", "bob", "a100", 0),
            "a100 #1: booked"
        );
        assert_eq!(
            occupancy_summary(&closed, "ann", "ann", "a100", 1),
            "a100 #2: your booking"
        );
        let open = Policy {
            feed_show_names: true,
            ..Policy::default()
        };
        assert_eq!(
            occupancy_summary(&open, "ann", "bob", "a100", 0),
            "a100 #1: bob"
        );
    }
}
