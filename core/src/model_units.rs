//! Lowering a model's units: never below what its bookings hold. Bookings hold
//! numbered units (slots `0..units`); a model lowered to `n` units must leave no
//! running or planned booking on a slot `>= n`, or the model is overbooked without
//! anyone being told (the page would show "2 booked of 1").

use chrono::{DateTime, Utc};

use crate::rules::rfc3339;

/// A running or planned booking that holds a unit a lowering would remove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InTheWay {
    pub id: i64,
    pub user: String,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
}

/// How many of the bookings in the way a refusal names (the count is always given).
const NAMED: usize = 5;

/// Why `model` cannot go to `units`, or `None` when nothing is in the way.
pub fn lowering_refusal(model: &str, units: i32, in_the_way: &[InTheWay]) -> Option<String> {
    if in_the_way.is_empty() {
        return None;
    }
    let named: Vec<String> = in_the_way
        .iter()
        .take(NAMED)
        .map(|b| {
            format!(
                "#{} of {} ({} to {})",
                b.id,
                b.user,
                rfc3339(b.start),
                rfc3339(b.end)
            )
        })
        .collect();
    let more = in_the_way.len().saturating_sub(NAMED);
    Some(format!(
        "{model} cannot go down to {units} unit{}: {} running or planned booking{} hold{} a unit beyond it: {}{}. Cancel or end {} first (an admin may), then lower the units.",
        if units == 1 { "" } else { "s" },
        in_the_way.len(),
        if in_the_way.len() == 1 { "" } else { "s" },
        if in_the_way.len() == 1 { "s" } else { "" },
        named.join(", "),
        if more > 0 { format!(" and {more} more") } else { String::new() },
        if in_the_way.len() == 1 { "it" } else { "them" },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn booking(id: i64) -> InTheWay {
        InTheWay {
            id,
            user: format!("u{id}"),
            start: Utc.with_ymd_and_hms(2026, 12, 1, 9, 0, 0).unwrap(),
            end: Utc.with_ymd_and_hms(2026, 12, 2, 9, 0, 0).unwrap(),
        }
    }

    #[test]
    fn nothing_in_the_way_is_no_refusal() {
        assert_eq!(lowering_refusal("t4", 1, &[]), None);
    }

    #[test]
    fn the_refusal_names_the_bookings_and_counts_the_rest() {
        let one = lowering_refusal("t4", 1, &[booking(7)]).unwrap();
        assert_eq!(
            one,
            "t4 cannot go down to 1 unit: 1 running or planned booking holds a unit beyond it: \
             #7 of u7 (2026-12-01T09:00:00Z to 2026-12-02T09:00:00Z). Cancel or end it first \
             (an admin may), then lower the units."
        );
        let many: Vec<InTheWay> = (1..=8).map(booking).collect();
        let text = lowering_refusal("a100", 2, &many).unwrap();
        assert!(
            text.starts_with("a100 cannot go down to 2 units: 8 running or planned bookings hold")
        );
        assert!(
            text.contains("#5 of u5") && !text.contains("#6 of u6"),
            "{text}"
        );
        assert!(
            text.contains("and 3 more. Cancel or end them first"),
            "{text}"
        );
    }
}
