//! The earliest valid start of a user's next booking of a model: first the user's own
//! rules (cooldown, an active or planned booking), then the model's capacity.
//!
//! One function for both places that tell a user when they can book:
//! `GET /api/v1/me/next-start` and the webhook's "you can book from ..." when it
//! strips a GPU (the rules alone would name a date on which every unit of the model
//! may be booked).

use chrono::{DateTime, TimeDelta, Utc};

use crate::booking_policy::Policy;
use crate::capacity;
use crate::rules::{self, Reason, Refusal, RuleCode};
use crate::window::Window;

/// When the next booking can start, and why not earlier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextStart {
    pub start: DateTime<Utc>,
    /// Every rule that holds it back; empty when it can start at `now`.
    pub reasons: Vec<Reason>,
}

/// The length of booking asked about when the caller names none: the shortest the
/// policy allows, in whole days (at least one).
pub fn default_days(policy: &Policy) -> i64 {
    ((policy.min_duration.num_seconds() + 86_399) / 86_400).max(1)
}

/// The earliest start of a booking of `need` units (GPUs) and `duration` on `model`
/// (which has `units` units) for a user whose bookings (not cancelled) are `own`,
/// given the model's bookings (not cancelled, one window per unit they hold) in
/// `booked`; those that end before the user's rules allow a start are simply never in
/// the way. A model with fewer than `need` units can never be booked for them.
#[allow(clippy::too_many_arguments)]
pub fn earliest_start(
    policy: &Policy,
    now: DateTime<Utc>,
    own: &[Window],
    model: &str,
    units: u32,
    need: u32,
    booked: &[Window],
    duration: TimeDelta,
) -> Result<NextStart, Refusal> {
    let need = need.max(1);
    let (after_rules, mut reasons) = rules::earliest_start_for_user(policy, now, own);
    let start = capacity::earliest_fit_units(units, booked, after_rules, duration, need)
        .ok_or_else(|| {
            let message = if units == 0 || need == 1 {
                format!("{model} has no units")
            } else {
                format!("{model} has {units} unit(s), fewer than the {need} asked for")
            };
            Refusal::new(RuleCode::Capacity, message)
        })?;
    if start > after_rules {
        let message = if need == 1 {
            format!(
                "all units of {model} booked until {}",
                rules::rfc3339(start)
            )
        } else {
            format!(
                "fewer than {need} units of {model} free until {}",
                rules::rfc3339(start)
            )
        };
        reasons.push(Reason {
            code: RuleCode::Capacity,
            message,
            until: start,
        });
    }
    Ok(NextStart { start, reasons })
}

/// Whether the bookings that overlap `[from, from + duration)`, `from` being the
/// user's earliest start by the rules, leave `need` of the model's `units` free
/// throughout it, knowing only a bound on the units they hold at any instant of it
/// (`overlapping_units`: the sum of their units, or the most units booked on one of
/// the days the window touches). When they do, the earliest start is
/// `from` and [`earliest_start`] with no bookings gives the whole answer, so a
/// question about many models reads one sum per model instead of every booking in
/// each model's horizon.
pub fn free_throughout(units: u32, need: u32, overlapping_units: u64) -> bool {
    overlapping_units.saturating_add(u64::from(need.max(1))) <= u64::from(units)
}

/// The first horizon to read a model's bookings up to when looking for the earliest
/// start after `from`: the booking's length and a week more. [`settled_before`] says
/// whether an answer from those bookings stands; if not, read up to [`wider`].
pub fn first_horizon(from: DateTime<Utc>, duration: TimeDelta) -> DateTime<Utc> {
    from.checked_add_signed(duration + TimeDelta::days(7))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// A horizon four times as far from `from` as `horizon`; the end of time past ten
/// years, so that the search ends.
pub fn wider(from: DateTime<Utc>, horizon: DateTime<Utc>) -> DateTime<Utc> {
    let span = (horizon - from) * 4;
    if span > TimeDelta::days(3650) {
        return DateTime::<Utc>::MAX_UTC;
    }
    from.checked_add_signed(span)
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Whether `next`, computed by [`earliest_start`] from only the model's bookings that
/// start before `horizon`, is the answer for all of them. It is when the booking it
/// proposes ends by `horizon`: the bookings left out cannot overlap it, every earlier
/// candidate start was refused with fewer bookings than there are (so it would be
/// with all of them), and the bookings left out end after it, so they add no
/// earlier candidate. This bounds the read by what the answer needs instead of by
/// every planned booking of the model.
pub fn settled_before(next: &NextStart, duration: TimeDelta, horizon: DateTime<Utc>) -> bool {
    horizon == DateTime::<Utc>::MAX_UTC
        || next
            .start
            .checked_add_signed(duration)
            .is_some_and(|end| end <= horizon)
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_answer_from_the_bookings_before_a_horizon_stands_when_it_ends_by_it() {
        let now = t("2026-11-01T00:00:00Z");
        let day = TimeDelta::days(1);
        // One unit, booked for the first 10 days, then a booking from day 12 that
        // starts after the first horizon (day 8).
        let all = [
            w("2026-11-01T00:00:00Z", "2026-11-11T00:00:00Z"),
            w("2026-11-12T00:00:00Z", "2026-11-20T00:00:00Z"),
        ];
        let policy = Policy::default();
        let full = earliest_start(&policy, now, &[], "a100", 1, 1, &all, day).unwrap();
        let mut horizon = first_horizon(now, day);
        loop {
            let seen: Vec<Window> = all
                .iter()
                .copied()
                .filter(|b| b.start() < horizon)
                .collect();
            let next = earliest_start(&policy, now, &[], "a100", 1, 1, &seen, day).unwrap();
            if settled_before(&next, day, horizon) {
                assert_eq!(next, full);
                break;
            }
            horizon = wider(now, horizon);
        }
        assert_eq!(full.start, t("2026-11-11T00:00:00Z"));
        // A booking too long for the gap: the answer is after day 20, beyond the
        // first horizons, and still the same as from all bookings.
        let two = TimeDelta::days(2);
        let full = earliest_start(&policy, now, &[], "a100", 1, 1, &all, two).unwrap();
        let mut horizon = first_horizon(now, two);
        let next = loop {
            let seen: Vec<Window> = all
                .iter()
                .copied()
                .filter(|b| b.start() < horizon)
                .collect();
            let next = earliest_start(&policy, now, &[], "a100", 1, 1, &seen, two).unwrap();
            if settled_before(&next, two, horizon) {
                break next;
            }
            horizon = wider(now, horizon);
        };
        assert_eq!(next, full);
        assert_eq!(full.start, t("2026-11-20T00:00:00Z"));
    }
    use super::*;

    proptest::proptest! {
        /// When the overlapping bookings' units add up to few enough, the answer from
        /// no bookings is the answer from all of them.
        #[test]
        fn a_sum_that_leaves_room_gives_the_answer_of_no_bookings(
            bookings in proptest::collection::vec((0i64..400, 1i64..200), 0..12),
            own in proptest::option::of((0i64..300, 1i64..100)),
            units in 0u32..8,
            need in 0u32..4,
            hours in 1i64..96,
        ) {
            let now = t("2026-11-01T00:00:00Z");
            let at = |h: i64| now + TimeDelta::hours(h - 100);
            let booked: Vec<Window> = bookings
                .iter()
                .filter_map(|&(s, len)| Window::new(at(s), at(s + len)).ok())
                .collect();
            let own: Vec<Window> = own
                .into_iter()
                .filter_map(|(s, len)| Window::new(at(s), at(s + len)).ok())
                .collect();
            let policy = Policy::default();
            let duration = TimeDelta::hours(hours);
            let (from, _) = rules::earliest_start_for_user(&policy, now, &own);
            let to = from + duration;
            let overlapping = booked
                .iter()
                .filter(|b| b.start() < to && from < b.end())
                .count() as u64;
            if free_throughout(units, need, overlapping) {
                let all = earliest_start(&policy, now, &own, "m", units, need, &booked, duration);
                let none = earliest_start(&policy, now, &own, "m", units, need, &[], duration);
                proptest::prop_assert_eq!(all, none);
            }
        }
    }

    #[test]
    fn free_throughout_counts_the_units_asked_for() {
        assert!(free_throughout(4, 1, 3));
        assert!(!free_throughout(4, 1, 4));
        assert!(!free_throughout(4, 2, 3));
        // Zero is read as one, as in earliest_start; a model without units never fits.
        assert!(!free_throughout(4, 0, 4));
        assert!(!free_throughout(0, 1, 0));
        assert!(!free_throughout(u32::MAX, 1, u64::MAX));
    }

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn w(a: &str, b: &str) -> Window {
        Window::new(t(a), t(b)).unwrap()
    }

    #[test]
    fn default_days_round_up() {
        assert_eq!(default_days(&Policy::default()), 1);
        let policy = Policy {
            min_duration: TimeDelta::hours(25),
            ..Policy::default()
        };
        assert_eq!(default_days(&policy), 2);
        let policy = Policy {
            min_duration: TimeDelta::zero(),
            ..Policy::default()
        };
        assert_eq!(default_days(&policy), 1);
    }

    #[test]
    fn free_model_without_history_is_now() {
        let now = t("2026-11-01T00:00:00Z");
        let next = earliest_start(
            &Policy::default(),
            now,
            &[],
            "a100",
            2,
            1,
            &[],
            TimeDelta::days(1),
        );
        assert_eq!(
            next,
            Ok(NextStart {
                start: now,
                reasons: vec![]
            })
        );
    }

    #[test]
    fn cooldown_then_capacity() {
        let now = t("2026-11-01T00:00:00Z");
        // Ended a booking yesterday: cooldown until 14 days after.
        let own = [w("2026-10-25T00:00:00Z", "2026-10-31T00:00:00Z")];
        let next = earliest_start(
            &Policy::default(),
            now,
            &own,
            "a100",
            1,
            1,
            &[],
            TimeDelta::days(1),
        )
        .unwrap();
        assert_eq!(next.start, t("2026-11-14T00:00:00Z"));
        assert_eq!(next.reasons.len(), 1);
        assert_eq!(next.reasons[0].code, RuleCode::Cooldown);
        // The one unit is booked across the end of the cooldown: later still.
        let booked = [w("2026-11-10T00:00:00Z", "2026-11-20T00:00:00Z")];
        let next = earliest_start(
            &Policy::default(),
            now,
            &own,
            "a100",
            1,
            1,
            &booked,
            TimeDelta::days(1),
        )
        .unwrap();
        assert_eq!(next.start, t("2026-11-20T00:00:00Z"));
        assert_eq!(
            next.reasons.last().map(|r| r.code),
            Some(RuleCode::Capacity)
        );
    }

    #[test]
    fn a_model_without_units_is_refused() {
        let now = t("2026-11-01T00:00:00Z");
        let refused = earliest_start(
            &Policy::default(),
            now,
            &[],
            "gone",
            0,
            1,
            &[],
            TimeDelta::days(1),
        );
        assert_eq!(refused.map_err(|r| r.code), Err(RuleCode::Capacity));
    }

    #[test]
    fn several_units_wait_until_that_many_are_free() {
        let now = t("2026-11-01T00:00:00Z");
        // Four units: one booked until day 3, another until day 6, a third until day 9.
        let booked = [
            w("2026-10-30T00:00:00Z", "2026-11-03T00:00:00Z"),
            w("2026-10-30T00:00:00Z", "2026-11-06T00:00:00Z"),
            w("2026-10-30T00:00:00Z", "2026-11-09T00:00:00Z"),
        ];
        let at = |need| {
            earliest_start(
                &Policy::default(),
                now,
                &[],
                "a100",
                4,
                need,
                &booked,
                TimeDelta::days(1),
            )
        };
        let expected = [
            (1, "2026-11-01T00:00:00Z"),
            (2, "2026-11-03T00:00:00Z"),
            (3, "2026-11-06T00:00:00Z"),
            (4, "2026-11-09T00:00:00Z"),
        ];
        for (need, start) in expected {
            let next = at(need).unwrap();
            assert_eq!(next.start, t(start), "{need} unit(s)");
            assert_eq!(next.reasons.is_empty(), need == 1, "{need} unit(s)");
        }
        assert!(at(2).unwrap().reasons[0]
            .message
            .contains("fewer than 2 units"));
        // Zero is read as one; more than the model has is refused.
        assert_eq!(at(0).unwrap().start, now);
        let refused = at(5).unwrap_err();
        assert_eq!(refused.code, RuleCode::Capacity);
        assert!(
            refused.message.contains("fewer than the 5"),
            "{}",
            refused.message
        );
    }
}
