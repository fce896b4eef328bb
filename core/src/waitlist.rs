//! The waitlist's decisions: whether a request to wait is acceptable, and the window
//! a waiting entry would be booked for now.
//!
//! An entry asks for "the first window of `duration` on a model, starting at or after
//! `not_before` and no later than `latest_start`". The window is the earliest start
//! that the user's own rules (cooldown, an active or planned booking) and the model's
//! capacity allow, exactly as `next_start` computes it for the page; the booking made
//! from it goes through every rule of the create again (`rules::check_request`,
//! `rules::check_user`, capacity), so an entry can never get what a booking could not.

use chrono::{DateTime, TimeDelta, Utc};

use crate::booking_policy::{human_duration, Policy};
use crate::capacity;
use crate::rules::{self, Refusal, RuleCode};
use crate::window::Window;

/// The longest span between `not_before` and `latest_start` an entry may wait for:
/// past a year, nobody is waiting any more, and a bound keeps every entry finite.
pub const MAX_WAIT_SPAN: TimeDelta = TimeDelta::days(366);

/// What an entry asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wish {
    pub not_before: DateTime<Utc>,
    pub latest_start: DateTime<Utc>,
    pub duration: TimeDelta,
}

/// Checks a new entry: its duration within the policy (as a booking at
/// `not_before` would be checked), `latest_start` not before `not_before` nor in the
/// past, and the span bounded. `not_before` in the past means "from now".
pub fn check_wish(policy: &Policy, now: DateTime<Utc>, wish: &Wish) -> Result<(), Refusal> {
    let from = wish.not_before.max(now);
    let end = from
        .checked_add_signed(wish.duration)
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    rules::check_request(policy, now, from, end, false)?;
    if wish.latest_start < from {
        return Err(Refusal::new(
            RuleCode::InvalidWindow,
            format!(
                "The latest start ({}) must not be before the first ({}).",
                rules::rfc3339(wish.latest_start),
                rules::rfc3339(from)
            ),
        ));
    }
    if wish.latest_start - from > MAX_WAIT_SPAN {
        return Err(Refusal::new(
            RuleCode::InvalidWindow,
            format!(
                "An entry may wait for a start within {} at most.",
                human_duration(MAX_WAIT_SPAN)
            ),
        ));
    }
    if !rules::in_supported_range(wish.latest_start) {
        return Err(Refusal::new(
            RuleCode::InvalidWindow,
            "Bookings must start and end between the years 1970 and 9999.",
        ));
    }
    Ok(())
}

/// Where a waiting entry stands now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chance {
    /// Book this window now.
    Fits(Window),
    /// Nothing fits before `latest_start` yet; keep waiting.
    Waiting,
    /// `latest_start` has passed: it can never be served.
    Expired,
}

/// The window an entry would get now, given the user's bookings that are not
/// cancelled (`own`) and the model's (`booked`, with its `units`).
pub fn chance(
    policy: &Policy,
    now: DateTime<Utc>,
    wish: &Wish,
    own: &[Window],
    units: u32,
    booked: &[Window],
) -> Chance {
    if now > wish.latest_start {
        return Chance::Expired;
    }
    let (after_rules, _) = rules::earliest_start_for_user(policy, now, own);
    let from = after_rules.max(wish.not_before).max(now);
    match capacity::earliest_fit(units, booked, from, wish.duration) {
        Some(start) if start <= wish.latest_start => {
            match start
                .checked_add_signed(wish.duration)
                .and_then(|end| Window::new(start, end).ok())
            {
                Some(w) => Chance::Fits(w),
                None => Chance::Waiting,
            }
        }
        _ => Chance::Waiting,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn w(a: &str, b: &str) -> Window {
        Window::new(t(a), t(b)).unwrap()
    }

    fn wish(from: &str, latest: &str, days: i64) -> Wish {
        Wish {
            not_before: t(from),
            latest_start: t(latest),
            duration: TimeDelta::days(days),
        }
    }

    const NOW: &str = "2026-12-01T00:00:00Z";

    #[test]
    fn fits_in_the_first_free_window_from_not_before() {
        let booked = [w("2026-12-01T00:00:00Z", "2026-12-10T00:00:00Z")];
        let got = chance(
            &Policy::default(),
            t(NOW),
            &wish("2026-12-03T00:00:00Z", "2026-12-20T00:00:00Z", 3),
            &[],
            1,
            &booked,
        );
        assert_eq!(
            got,
            Chance::Fits(w("2026-12-10T00:00:00Z", "2026-12-13T00:00:00Z"))
        );
    }

    #[test]
    fn waits_when_the_first_window_is_after_latest_start() {
        let booked = [w("2026-12-01T00:00:00Z", "2026-12-10T00:00:00Z")];
        let got = chance(
            &Policy::default(),
            t(NOW),
            &wish("2026-12-02T00:00:00Z", "2026-12-09T23:59:59Z", 3),
            &[],
            1,
            &booked,
        );
        assert_eq!(got, Chance::Waiting);
    }

    #[test]
    fn the_users_cooldown_holds_it_back() {
        // The user's last booking ended yesterday: 14 days of cooldown.
        let own = [w("2026-11-20T00:00:00Z", "2026-11-30T00:00:00Z")];
        let within = wish(NOW, "2026-12-14T00:00:00Z", 1);
        assert_eq!(
            chance(&Policy::default(), t(NOW), &within, &own, 1, &[]),
            Chance::Fits(w("2026-12-14T00:00:00Z", "2026-12-15T00:00:00Z"))
        );
        let too_early = wish(NOW, "2026-12-13T23:59:59Z", 1);
        assert_eq!(
            chance(&Policy::default(), t(NOW), &too_early, &own, 1, &[]),
            Chance::Waiting
        );
    }

    #[test]
    fn a_past_latest_start_expires() {
        let got = chance(
            &Policy::default(),
            t("2026-12-05T00:00:00.000001Z"),
            &wish(NOW, "2026-12-05T00:00:00Z", 1),
            &[],
            1,
            &[],
        );
        assert_eq!(got, Chance::Expired);
    }

    #[test]
    fn a_past_not_before_means_from_now() {
        let got = chance(
            &Policy::default(),
            t(NOW),
            &wish("2026-11-01T00:00:00Z", "2026-12-02T00:00:00Z", 1),
            &[],
            2,
            &[],
        );
        assert_eq!(got, Chance::Fits(w(NOW, "2026-12-02T00:00:00Z")));
    }

    #[test]
    fn wishes_are_checked_like_bookings() {
        let p = Policy::default();
        let now = t(NOW);
        assert!(check_wish(&p, now, &wish(NOW, "2026-12-05T00:00:00Z", 3)).is_ok());
        let code = |w: Wish| check_wish(&p, now, &w).unwrap_err().code;
        assert_eq!(
            code(wish(NOW, "2026-12-05T00:00:00Z", 15)),
            RuleCode::DurationTooLong
        );
        assert_eq!(
            code(wish(NOW, "2026-12-05T00:00:00Z", 0)),
            RuleCode::InvalidWindow
        );
        assert_eq!(
            code(wish("2026-12-05T00:00:00Z", "2026-12-04T00:00:00Z", 1)),
            RuleCode::InvalidWindow
        );
        assert_eq!(
            code(wish(NOW, "2028-12-05T00:00:00Z", 1)),
            RuleCode::InvalidWindow
        );
        let short = Wish {
            duration: TimeDelta::hours(1),
            ..wish(NOW, NOW, 1)
        };
        assert_eq!(code(short), RuleCode::DurationTooShort);
    }
}
