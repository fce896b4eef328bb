//! What a calendar feed may say about a booking: who booked a unit
//! is the booker's business, so a model's occupancy feed names only the feed owner's
//! own bookings unless the lab's policy publishes names. Every event names all the
//! units its booking holds, so a feed counts a 2-GPU booking as 2 units in use.

use crate::booking_policy::Policy;
use crate::holds::HoldKind;
use crate::notice_text::gpus;

/// `text` as an iCalendar TEXT value (RFC 5545, 3.3.11): a backslash, semicolon or
/// comma escaped with a backslash, a line break as `\n`. For the properties the
/// calendar library writes as it gets them (the calendar's `NAME` and
/// `X-WR-CALNAME`, whose value type it does not know); it escapes `SUMMARY` and
/// `DESCRIPTION` itself. User names hold no other control character (refused by
/// `username::Username`), so no other character can end a content line.
pub fn text_value(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' | ';' | ',' => {
                out.push('\\');
                out.push(c);
            }
            '\n' => out.push_str("\\n"),
            '\r' => {}
            _ => out.push(c),
        }
    }
    out
}

/// The units a booking holds, as a feed names them: "a100 #2" for one, "2 x a100
/// (#1, #3)" for several (`slots` are 0-based; a feed numbers units from 1).
pub fn units_of(model: &str, slots: &[i32]) -> String {
    let numbers: Vec<String> = slots
        .iter()
        .map(|slot| format!("#{}", i64::from(*slot) + 1))
        .collect();
    match numbers.as_slice() {
        [one] => format!("{model} {one}"),
        many => format!("{} x {model} ({})", many.len(), many.join(", ")),
    }
}

/// The title of a booking in a model's occupancy feed seen by `viewer`.
pub fn occupancy_summary(
    policy: &Policy,
    viewer: &str,
    owner: &str,
    model: &str,
    slots: &[i32],
) -> String {
    let units = units_of(model, slots);
    if owner == viewer {
        format!("{units}: your booking")
    } else if policy.feed_show_names {
        format!("{units}: {owner}")
    } else {
        format!("{units}: booked")
    }
}

/// The title of one of the viewer's own bookings in their feed.
pub fn own_summary(model: &str, slots: &[i32]) -> String {
    format!("GPU booking: {}", units_of(model, slots))
}

/// The description of a booking in either feed: its number and how many GPUs of
/// which units it holds ("Booking 12: 2 a100 GPUs, units #1 and #3.").
pub fn description(booking_id: i64, model: &str, slots: &[i32]) -> String {
    let numbers: Vec<String> = slots
        .iter()
        .map(|slot| format!("#{}", i64::from(*slot) + 1))
        .collect();
    let units = match numbers.as_slice() {
        [one] => format!("unit {one}"),
        [init @ .., last] => format!("units {} and {last}", init.join(", ")),
        [] => "no unit".to_owned(),
    };
    let count = u32::try_from(slots.len()).unwrap_or(u32::MAX);
    format!("Booking {booking_id}: {}, {units}.", gpus(count, model))
}

/// The title of a hold's row in a model's occupancy feed: the course's session
/// ("ML101 lab session, 4 units of a100") or the maintenance window ("Maintenance:
/// driver upgrade, 2 units of a100"). Everyone sees it: a hold is nobody's private
/// business.
pub fn hold_summary(kind: HoldKind, title: &str, model: &str, slots: &[i32]) -> String {
    let units = match slots.len() {
        1 => format!("1 unit of {model}"),
        n => format!("{n} units of {model}"),
    };
    match kind {
        HoldKind::Course => format!("{title}, {units}"),
        HoldKind::Maintenance => format!("Maintenance: {title}, {units}"),
    }
}

/// The description of a hold's row: which hold, and the units it holds.
pub fn hold_description(
    kind: HoldKind,
    id: i64,
    title: &str,
    model: &str,
    slots: &[i32],
) -> String {
    let what = match kind {
        HoldKind::Course => format!("Course reservation {id} ({title})"),
        HoldKind::Maintenance => format!("Maintenance window {id} ({title})"),
    };
    format!("{what}: {}.", units_of(model, slots))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_are_named_by_their_title_and_units() {
        assert_eq!(
            hold_summary(HoldKind::Course, "ML101 lab session", "a100", &[0, 1, 2, 3]),
            "ML101 lab session, 4 units of a100"
        );
        assert_eq!(
            hold_summary(HoldKind::Maintenance, "driver upgrade", "t4", &[1]),
            "Maintenance: driver upgrade, 1 unit of t4"
        );
        assert_eq!(
            hold_description(HoldKind::Maintenance, 3, "driver upgrade", "t4", &[0, 1]),
            "Maintenance window 3 (driver upgrade): 2 x t4 (#1, #2)."
        );
    }

    #[test]
    fn text_values_are_escaped_as_rfc_5545_asks() {
        assert_eq!(text_value("GPU bookings of bob"), "GPU bookings of bob");
        assert_eq!(text_value("a;b,c\\d\r\ne:f"), "a\\;b\\,c\\\\d\\ne:f");
    }

    #[test]
    fn others_are_named_only_when_the_policy_allows() {
        let closed = Policy::default();
        assert_eq!(
            occupancy_summary(&closed, "ann", "bob", "a100", &[0]),
            "a100 #1: booked"
        );
        assert_eq!(
            occupancy_summary(&closed, "ann", "ann", "a100", &[1]),
            "a100 #2: your booking"
        );
        let open = Policy {
            feed_show_names: true,
            ..Policy::default()
        };
        assert_eq!(
            occupancy_summary(&open, "ann", "bob", "a100", &[0]),
            "a100 #1: bob"
        );
    }

    #[test]
    fn a_booking_of_several_gpus_names_each_unit() {
        let closed = Policy::default();
        assert_eq!(
            occupancy_summary(&closed, "ann", "bob", "a100", &[0, 2]),
            "2 x a100 (#1, #3): booked"
        );
        assert_eq!(own_summary("a100", &[1]), "GPU booking: a100 #2");
        assert_eq!(
            own_summary("a100", &[0, 1, 3]),
            "GPU booking: 3 x a100 (#1, #2, #4)"
        );
        assert_eq!(
            description(12, "a100", &[0, 2]),
            "Booking 12: 2 a100 GPUs, units #1 and #3."
        );
        assert_eq!(
            description(5, "a100", &[0, 1, 3]),
            "Booking 5: 3 a100 GPUs, units #1, #2 and #4."
        );
        assert_eq!(
            description(7, "t4", &[1]),
            "Booking 7: one t4 GPU, unit #2."
        );
    }
}
