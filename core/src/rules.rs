//! The booking rules of docs/design.md ("The rules") as pure functions.
//!
//! The API checks them inside one transaction, under its per-user and per-model
//! locks, with the user's bookings and the model's bookings read under those locks.
//! Capacity (which needs the model's bookings) is in [`crate::capacity`].

use chrono::{DateTime, Datelike, SecondsFormat, Utc};
use serde::Serialize;

use crate::booking_policy::{human_duration, Policy, MAX_UNITS_PER_BOOKING_LIMIT};
use crate::window::Window;

/// The rule that refused a request. Serialised as the `error` field of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleCode {
    InvalidWindow,
    StartInPast,
    DurationTooShort,
    DurationTooLong,
    ActiveBookingExists,
    FutureBookingExists,
    Cooldown,
    Capacity,
    UnknownModel,
    /// Only reachable with an admin override: the user already holds a booking in
    /// that window. Without an override the cooldown rule refuses first.
    Overlap,
    /// More GPUs than one booking may be for (or none).
    InvalidUnits,
    /// A change would move the end of a booking into the past (end it early instead).
    EndInPast,
    /// A change would move the start of a booking that has started.
    BookingStarted,
    /// The booking would start beyond the policy's horizon (`max_ahead`).
    TooFarAhead,
    /// A maintenance window blocks the units (`core::holds`).
    Maintenance,
    /// A course reservation's occurrence holds the units (`core::holds`).
    Reserved,
    /// The caller's group may not book this model (`core::groups`).
    ModelNotAllowed,
    /// The group's GPU-hours of a period would be exceeded (`core::quota`).
    QuotaHours,
    /// The group's bookings would hold more units at once than its quota.
    QuotaUnits,
}

impl RuleCode {
    pub fn as_str(&self) -> &'static str {
        match self {
            RuleCode::InvalidWindow => "invalid_window",
            RuleCode::StartInPast => "start_in_past",
            RuleCode::DurationTooShort => "duration_too_short",
            RuleCode::DurationTooLong => "duration_too_long",
            RuleCode::ActiveBookingExists => "active_booking_exists",
            RuleCode::FutureBookingExists => "future_booking_exists",
            RuleCode::Cooldown => "cooldown",
            RuleCode::Capacity => "capacity",
            RuleCode::UnknownModel => "unknown_model",
            RuleCode::Overlap => "overlap",
            RuleCode::InvalidUnits => "invalid_units",
            RuleCode::EndInPast => "end_in_past",
            RuleCode::BookingStarted => "booking_started",
            RuleCode::TooFarAhead => "too_far_ahead",
            RuleCode::Maintenance => "maintenance",
            RuleCode::Reserved => "reserved",
            RuleCode::ModelNotAllowed => "model_not_allowed",
            RuleCode::QuotaHours => "quota_hours",
            RuleCode::QuotaUnits => "quota_units",
        }
    }

    /// Invalid requests (fix the request) versus conflicts with existing state
    /// (wait, or change the other booking).
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            RuleCode::ActiveBookingExists
                | RuleCode::FutureBookingExists
                | RuleCode::Cooldown
                | RuleCode::Capacity
                | RuleCode::Overlap
                | RuleCode::BookingStarted
                | RuleCode::Maintenance
                | RuleCode::Reserved
                | RuleCode::QuotaHours
                | RuleCode::QuotaUnits
        )
    }
}

/// Why a booking was refused, in words a user understands, and the earliest start
/// that this rule would accept, where there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: RuleCode,
    pub message: String,
    pub earliest_start: Option<DateTime<Utc>>,
}

impl Refusal {
    pub fn new(code: RuleCode, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            message: message.into(),
            earliest_start: None,
        }
    }

    pub fn with_earliest(mut self, t: DateTime<Utc>) -> Refusal {
        self.earliest_start = Some(t);
        self
    }
}

/// RFC 3339 in UTC with whole seconds, as the API and the messages show times.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Times a booking may hold: far enough from chrono's and Postgres' limits that
/// adding any policy duration cannot overflow.
pub fn in_supported_range(t: DateTime<Utc>) -> bool {
    (1970..=9999).contains(&t.year())
}

/// Checks that need only the request: a non-empty window, not in the past, a
/// duration within the policy. An admin override skips all but the first.
pub fn check_request(
    policy: &Policy,
    now: DateTime<Utc>,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    override_rules: bool,
) -> Result<Window, Refusal> {
    let window = Window::new(start, end).map_err(|_| {
        Refusal::new(
            RuleCode::InvalidWindow,
            format!(
                "The booking must end after it starts (start {}, end {}).",
                rfc3339(start),
                rfc3339(end)
            ),
        )
    })?;
    if !(in_supported_range(start) && in_supported_range(end)) {
        return Err(Refusal::new(
            RuleCode::InvalidWindow,
            "Bookings must start and end between the years 1970 and 9999.",
        ));
    }
    if override_rules {
        return Ok(window);
    }
    if start < now {
        return Err(Refusal::new(
            RuleCode::StartInPast,
            format!("The booking cannot start in the past ({}).", rfc3339(start)),
        )
        .with_earliest(now));
    }
    if start - now > policy.max_ahead {
        return Err(Refusal::new(
            RuleCode::TooFarAhead,
            format!(
                "Bookings may start at most {} ahead (by {}); this one starts {}.",
                human_duration(policy.max_ahead),
                rfc3339(now + policy.max_ahead),
                rfc3339(start)
            ),
        ));
    }
    let duration = window.duration();
    if duration < policy.min_duration {
        return Err(Refusal::new(
            RuleCode::DurationTooShort,
            format!(
                "Bookings must last at least {}; this one lasts {}.",
                human_duration(policy.min_duration),
                human_duration(duration)
            ),
        ));
    }
    if duration > policy.max_duration {
        return Err(Refusal::new(
            RuleCode::DurationTooLong,
            format!(
                "Bookings may last at most {}; this one lasts {}.",
                human_duration(policy.max_duration),
                human_duration(duration)
            ),
        ));
    }
    Ok(window)
}

/// The GPUs a booking may be for: 1 to the policy's `max_units_per_booking`; an
/// admin's override may go past the policy's maximum, never past
/// [`MAX_UNITS_PER_BOOKING_LIMIT`] (what the database accepts).
pub fn check_units(policy: &Policy, units: u32, override_rules: bool) -> Result<u32, Refusal> {
    let max = if override_rules {
        MAX_UNITS_PER_BOOKING_LIMIT
    } else {
        policy
            .max_units_per_booking
            .min(MAX_UNITS_PER_BOOKING_LIMIT)
    };
    if (1..=max).contains(&units) {
        return Ok(units);
    }
    let message = match max {
        1 => format!("A booking is for one GPU here; this one asks for {units}."),
        _ => format!("A booking is for 1 to {max} GPUs; this one asks for {units}."),
    };
    Err(Refusal::new(RuleCode::InvalidUnits, message))
}

/// Checks against the user's own bookings (not cancelled; `end` is the effective
/// end, so a booking ended early counts from when it really ended).
pub fn check_user(
    policy: &Policy,
    now: DateTime<Utc>,
    window: &Window,
    own: &[Window],
    override_rules: bool,
) -> Result<(), Refusal> {
    if override_rules {
        // An override may break every rule but the user's own overlap (and
        // capacity, checked elsewhere): two bookings at once would be one user on
        // two GPUs, which the database forbids anyway.
        return overlap(window, own);
    }
    if let Some(active) = blocking_active(policy, now, own) {
        return Err(Refusal::new(
            RuleCode::ActiveBookingExists,
            format!(
                "You have a booking running until {}; book again once it has ended.",
                rfc3339(active.end())
            ),
        )
        .with_earliest(cooldown_end(policy, active.end())));
    }
    if let Some(planned) = planned_at_limit(policy, now, own) {
        let message = match planned.first() {
            Some(first) if planned.len() == 1 => format!(
                "You already have a planned booking from {}; cancel it or wait until it has ended.",
                rfc3339(first.start())
            ),
            _ => format!(
                "You already have {} planned bookings, the most allowed.",
                planned.len()
            ),
        };
        let last_end = planned.iter().map(|b| b.end()).max().unwrap_or(now);
        return Err(Refusal::new(RuleCode::FutureBookingExists, message)
            .with_earliest(cooldown_end(policy, last_end)));
    }
    cooldown(policy, window, own)
}

/// The user's bookings that end at or before this cannot change [`check_user`]'s
/// answer for a window that starts at `start` (nor [`earliest_start_for_user`]'s,
/// with `start` = `now`), so the store reads only those that end later: a create
/// reads the user's recent and planned bookings, not their whole history. Every
/// rule looks at bookings that end after it: a running one ends after `now`, a
/// planned one after `now`, one that overlaps the window after `start`, and one
/// within the cooldown of the window after `start` less the cooldown.
/// (`core/tests/rules_model.rs` composes the rules with this bound.)
pub fn own_bookings_from(
    policy: &Policy,
    now: DateTime<Utc>,
    start: DateTime<Utc>,
) -> DateTime<Utc> {
    now.min(start)
        .checked_sub_signed(policy.cooldown.max(chrono::TimeDelta::zero()))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// The user's running booking, when the policy allows no new booking while one runs.
fn blocking_active<'a>(
    policy: &Policy,
    now: DateTime<Utc>,
    own: &'a [Window],
) -> Option<&'a Window> {
    if !policy.no_booking_while_active {
        return None;
    }
    own.iter().find(|b| b.contains(now))
}

/// The user's planned bookings, when they are as many as the policy allows (so no
/// other can be added).
fn planned_at_limit<'a>(
    policy: &Policy,
    now: DateTime<Utc>,
    own: &'a [Window],
) -> Option<Vec<&'a Window>> {
    let planned: Vec<&Window> = own.iter().filter(|b| b.start() > now).collect();
    (planned.len() as u64 >= u64::from(policy.max_planned)).then_some(planned)
}

/// When the cooldown after a booking that ends at `end` is over: the one place the
/// cooldown is counted, for the refusals and for the earliest start alike.
fn cooldown_end(policy: &Policy, end: DateTime<Utc>) -> DateTime<Utc> {
    end + policy.cooldown
}

/// The user already holds one of `own` in `window`.
fn overlap(window: &Window, own: &[Window]) -> Result<(), Refusal> {
    match own.iter().find(|b| b.overlaps(window)) {
        Some(b) => Err(Refusal::new(
            RuleCode::Overlap,
            format!(
                "The user already holds a booking from {} to {}.",
                rfc3339(b.start()),
                rfc3339(b.end())
            ),
        )),
        None => Ok(()),
    }
}

/// The database's exclusion constraint on one user's bookings refused: the
/// backstop of [`check_user`]'s overlap (and cooldown), in the same rule's words.
pub fn overlap_backstop() -> Refusal {
    Refusal::new(
        RuleCode::Overlap,
        "The user already holds a booking in that window.",
    )
}

/// Cooldown around every other booking of the user, in both directions, so that no
/// configuration of the other settings lets two bookings come closer. The refusal
/// names the bound that was crossed: a booking before this one (which it must start
/// a cooldown after), one after it (which it must end a cooldown before), or both.
/// Its earliest start is after the cooldown of the latest of them all, a start this
/// rule accepts whatever the window's length.
fn cooldown(policy: &Policy, window: &Window, own: &[Window]) -> Result<(), Refusal> {
    let close: Vec<&Window> = own
        .iter()
        .filter(|b| {
            window.start() < cooldown_end(policy, b.end())
                && b.start() < cooldown_end(policy, window.end())
        })
        .collect();
    let Some(last_end) = close.iter().map(|b| b.end()).max() else {
        return Ok(());
    };
    // Before: it started first, so this window must start a cooldown after its end.
    // After: this window must end a cooldown before it starts.
    let before_end = close
        .iter()
        .filter(|b| b.start() < window.start())
        .map(|b| b.end())
        .max();
    let after_start = close
        .iter()
        .filter(|b| b.start() >= window.start())
        .map(|b| b.start())
        .min();
    let gap = human_duration(policy.cooldown);
    let message = match (before_end, after_start) {
        (Some(end), None) => format!(
            "Your last booking ended {}; after a booking there is a cooldown of {gap}, so your next one can start from {}.",
            rfc3339(end),
            rfc3339(cooldown_end(policy, end))
        ),
        (None, Some(start)) => format!(
            "Your next booking starts {}; bookings keep a cooldown of {gap} between them, so this one must end by {}.",
            rfc3339(start),
            rfc3339(start - policy.cooldown)
        ),
        (Some(end), Some(start)) => format!(
            "Your booking before this one ends {} and your next one starts {}; bookings keep a cooldown of {gap} between them, so this one must start from {} and end by {}.",
            rfc3339(end),
            rfc3339(start),
            rfc3339(cooldown_end(policy, end)),
            rfc3339(start - policy.cooldown)
        ),
        (None, None) => unreachable!("a close booking starts before the window or not"),
    };
    Err(Refusal::new(RuleCode::Cooldown, message).with_earliest(cooldown_end(policy, last_end)))
}

/// A requested change of a booking's window.
#[derive(Debug, Clone, Copy)]
pub struct WindowChange<'a> {
    /// The booking's window now.
    pub current: Window,
    /// Whether it has started.
    pub started: bool,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// The user's other bookings (not cancelled).
    pub others: &'a [Window],
    /// An admin's override of the rules.
    pub override_rules: bool,
}

/// Whether a change asks for the window the booking has (`start` and `end` as it
/// is): nothing to check and nothing to write, so the booking is answered as it is
/// and no audit row or booking change records a change that did not happen.
pub fn changes_nothing(current: &Window, start: DateTime<Utc>, end: DateTime<Utc>) -> bool {
    start == current.start() && end == current.end()
}

/// A change of a planned or running booking's window (`PATCH`): `current` is its
/// window now, `started` whether it has started, `others` the user's other bookings
/// (not cancelled). A started booking keeps its start; no end goes into the past
/// (ending now is `DELETE`); the duration stays within the policy's maximum (and,
/// for a booking not yet started, its minimum: a running one may be shortened as it
/// may be ended early); the cooldown to the user's other bookings is checked again
/// from the new window. An admin override skips all but the first two and the
/// user's own overlap. Capacity (the model's bookings) is the caller's.
pub fn check_change(
    policy: &Policy,
    now: DateTime<Utc>,
    change: &WindowChange<'_>,
) -> Result<Window, Refusal> {
    let WindowChange {
        current,
        started,
        start,
        end,
        others,
        override_rules,
    } = *change;
    if started && start != current.start() {
        return Err(Refusal::new(
            RuleCode::BookingStarted,
            format!(
                "The booking started at {}; only its end can change.",
                rfc3339(current.start())
            ),
        ));
    }
    if end <= now {
        return Err(Refusal::new(
            RuleCode::EndInPast,
            format!(
                "The end cannot move into the past ({}); to end the booking now, end it early.",
                rfc3339(end)
            ),
        ));
    }
    if started {
        // The start is fixed (possibly in the past): only the new window's shape is
        // checked, not its start against now.
        let window = check_request(policy, start, start, end, true)?;
        if !override_rules && window.duration() > policy.max_duration {
            return Err(Refusal::new(
                RuleCode::DurationTooLong,
                format!(
                    "Bookings may last at most {}; this one would last {}.",
                    human_duration(policy.max_duration),
                    human_duration(window.duration())
                ),
            ));
        }
        // Its start cannot move, so no refusal offers another one.
        check_others(policy, &window, others, override_rules).map_err(|r| Refusal {
            earliest_start: None,
            ..r
        })?;
        return Ok(window);
    }
    let window = check_request(policy, now, start, end, override_rules)?;
    check_others(policy, &window, others, override_rules)?;
    Ok(window)
}

fn check_others(
    policy: &Policy,
    window: &Window,
    others: &[Window],
    override_rules: bool,
) -> Result<(), Refusal> {
    overlap(window, others)?;
    if override_rules {
        return Ok(());
    }
    cooldown(policy, window, others)
}

/// One reason why a user's next booking cannot start right now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reason {
    pub code: RuleCode,
    pub message: String,
    pub until: DateTime<Utc>,
}

/// The earliest start the user's own bookings allow (capacity aside) and why it
/// is not `now`. The API then moves it forward to where the model has a free unit.
pub fn earliest_start_for_user(
    policy: &Policy,
    now: DateTime<Utc>,
    own: &[Window],
) -> (DateTime<Utc>, Vec<Reason>) {
    let mut earliest = now;
    let mut reasons = Vec::new();
    if let Some(active) = blocking_active(policy, now, own) {
        reasons.push(Reason {
            code: RuleCode::ActiveBookingExists,
            message: format!("booking running until {}", rfc3339(active.end())),
            until: active.end(),
        });
    }
    if let Some(last) =
        planned_at_limit(policy, now, own).and_then(|p| p.iter().map(|b| b.end()).max())
    {
        reasons.push(Reason {
            code: RuleCode::FutureBookingExists,
            message: format!("planned booking until {}", rfc3339(last)),
            until: last,
        });
    }
    if let Some(last_end) = own.iter().map(|b| b.end()).max() {
        let until = cooldown_end(policy, last_end);
        if until > now {
            earliest = earliest.max(until);
            reasons.push(Reason {
                code: RuleCode::Cooldown,
                message: format!("cooldown until {}", rfc3339(until)),
                until,
            });
        }
    }
    (earliest, reasons)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeDelta, TimeZone};

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 3, 1, 12, 0, 0).unwrap()
    }
    fn days(n: i64) -> TimeDelta {
        TimeDelta::days(n)
    }
    fn secs(n: i64) -> TimeDelta {
        TimeDelta::seconds(n)
    }
    fn w(start: DateTime<Utc>, end: DateTime<Utc>) -> Window {
        Window::new(start, end).unwrap()
    }
    fn request(start: DateTime<Utc>, end: DateTime<Utc>) -> Result<Window, Refusal> {
        check_request(&Policy::default(), now(), start, end, false)
    }
    fn code<T>(r: Result<T, Refusal>) -> Option<RuleCode> {
        r.err().map(|e| e.code)
    }

    #[test]
    fn duration_limits_are_inclusive() {
        let s = now() + days(1);
        assert!(request(s, s + days(1)).is_ok());
        assert_eq!(
            code(request(s, s + days(1) - secs(1))),
            Some(RuleCode::DurationTooShort)
        );
        assert!(request(s, s + days(14)).is_ok());
        assert_eq!(
            code(request(s, s + days(14) + secs(1))),
            Some(RuleCode::DurationTooLong)
        );
    }

    #[test]
    fn the_horizon_is_inclusive_and_an_override_passes_it() {
        let edge = now() + Policy::default().max_ahead;
        assert!(request(edge, edge + days(1)).is_ok());
        let refusal = request(edge + secs(1), edge + days(1)).unwrap_err();
        assert_eq!(refusal.code, RuleCode::TooFarAhead);
        assert!(
            !refusal.code.is_conflict(),
            "the request is to fix, not to wait for"
        );
        assert!(refusal.message.contains("365 days"), "{}", refusal.message);
        assert!(
            refusal.message.contains("2027-03-01T12:00:00Z"),
            "{}",
            refusal.message
        );
        // The year 9999 the window allows is far past it.
        let far = Utc.with_ymd_and_hms(9999, 1, 1, 0, 0, 0).unwrap();
        assert_eq!(
            code(request(far, far + days(1))),
            Some(RuleCode::TooFarAhead)
        );
        assert!(check_request(&Policy::default(), now(), far, far + days(1), true).is_ok());
        // A planned booking's start moved past it is refused as a new one would be.
        let planned = w(now() + days(20), now() + days(21));
        assert_eq!(
            change(planned, false, edge + secs(1), edge + days(1), &[]),
            Err(RuleCode::TooFarAhead)
        );
    }

    #[test]
    fn start_now_is_accepted_a_second_earlier_is_not() {
        assert!(request(now(), now() + days(2)).is_ok());
        let refusal = request(now() - secs(1), now() + days(2)).unwrap_err();
        assert_eq!(refusal.code, RuleCode::StartInPast);
        assert_eq!(refusal.earliest_start, Some(now()));
    }

    #[test]
    fn reversed_window_is_invalid_even_with_override() {
        let r = check_request(&Policy::default(), now(), now(), now(), true);
        assert_eq!(code(r), Some(RuleCode::InvalidWindow));
    }

    #[test]
    fn override_skips_duration_and_past() {
        let r = check_request(
            &Policy::default(),
            now(),
            now() - days(40),
            now() - days(39) - secs(5),
            true,
        );
        assert!(r.is_ok());
    }

    #[test]
    fn cooldown_is_exact_to_the_second() {
        let ended = now() - days(3);
        let own = [w(ended - days(2), ended)];
        let p = Policy::default();
        let ok = w(ended + days(14), ended + days(15));
        assert!(check_user(&p, now(), &ok, &own, false).is_ok());
        let early = w(ended + days(14) - secs(1), ended + days(15));
        let refusal = check_user(&p, now(), &early, &own, false).unwrap_err();
        assert_eq!(refusal.code, RuleCode::Cooldown);
        assert_eq!(refusal.earliest_start, Some(ended + days(14)));
    }

    #[test]
    fn active_then_planned_then_cooldown() {
        let p = Policy::default();
        let far = w(now() + days(60), now() + days(61));
        let active = [w(now() - days(1), now() + days(1))];
        let r = check_user(&p, now(), &far, &active, false).unwrap_err();
        assert_eq!(r.code, RuleCode::ActiveBookingExists);
        assert_eq!(r.earliest_start, Some(now() + days(15)));
        let planned = [w(now() + days(2), now() + days(3))];
        let r = check_user(&p, now(), &far, &planned, false).unwrap_err();
        assert_eq!(r.code, RuleCode::FutureBookingExists);
        assert_eq!(r.earliest_start, Some(now() + days(17)));
    }

    #[test]
    fn units_within_the_policys_maximum() {
        let p = Policy::default();
        assert_eq!(check_units(&p, 1, false), Ok(1));
        let refused = check_units(&p, 2, false).unwrap_err();
        assert_eq!(refused.code, RuleCode::InvalidUnits);
        assert!(refused.message.contains("one GPU"), "{}", refused.message);
        assert_eq!(
            code(check_units(&p, 0, false).map(|_| ())),
            Some(RuleCode::InvalidUnits)
        );
        let p = Policy {
            max_units_per_booking: 4,
            ..Policy::default()
        };
        assert_eq!(check_units(&p, 4, false), Ok(4));
        assert!(check_units(&p, 5, false)
            .unwrap_err()
            .message
            .contains("1 to 4"));
        // An admin's override goes past the policy, not past the database's limit.
        assert_eq!(check_units(&p, 5, true), Ok(5));
        assert!(check_units(&p, MAX_UNITS_PER_BOOKING_LIMIT + 1, true).is_err());
        assert!(check_units(&p, 0, true).is_err());
    }

    #[test]
    fn two_planned_allowed_when_configured_but_not_closer_than_cooldown() {
        let p = Policy {
            max_planned: 2,
            ..Policy::default()
        };
        let planned = [w(now() + days(2), now() + days(3))];
        let close = w(now() + days(10), now() + days(11));
        assert_eq!(
            code(check_user(&p, now(), &close, &planned, false)),
            Some(RuleCode::Cooldown)
        );
        let far = w(now() + days(17), now() + days(18));
        assert!(check_user(&p, now(), &far, &planned, false).is_ok());
        // Before the planned one, also cooldown apart.
        let p = Policy {
            max_planned: 2,
            cooldown: days(1),
            ..Policy::default()
        };
        let later = [w(now() + days(20), now() + days(21))];
        let before = w(now() + days(6), now() + days(19) + secs(1));
        assert_eq!(
            code(check_user(&p, now(), &before, &later, false)),
            Some(RuleCode::Cooldown)
        );
        let before = w(now() + days(6), now() + days(19));
        assert!(check_user(&p, now(), &before, &later, false).is_ok());
    }

    #[test]
    fn override_refuses_only_own_overlap() {
        let p = Policy::default();
        let own = [w(now() - days(1), now() + days(1))];
        let overlapping = w(now(), now() + days(2));
        assert_eq!(
            code(check_user(&p, now(), &overlapping, &own, true)),
            Some(RuleCode::Overlap)
        );
        let touching = w(now() + days(1), now() + days(2));
        assert!(check_user(&p, now(), &touching, &own, true).is_ok());
    }

    #[test]
    fn next_start_explains_itself() {
        let p = Policy::default();
        let (t, reasons) = earliest_start_for_user(&p, now(), &[]);
        assert_eq!(t, now());
        assert!(reasons.is_empty());
        let own = [w(now() - days(1), now() + days(1))];
        let (t, reasons) = earliest_start_for_user(&p, now(), &own);
        assert_eq!(t, now() + days(15));
        let codes: Vec<_> = reasons.iter().map(|r| r.code).collect();
        assert_eq!(
            codes,
            vec![RuleCode::ActiveBookingExists, RuleCode::Cooldown]
        );
    }

    fn change(
        current: Window,
        started: bool,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
        others: &[Window],
    ) -> Result<Window, RuleCode> {
        let c = WindowChange {
            current,
            started,
            start,
            end,
            others,
            override_rules: false,
        };
        check_change(&Policy::default(), now(), &c).map_err(|r| r.code)
    }

    #[test]
    fn a_running_booking_changes_only_its_end_within_the_policy() {
        let running = w(now() - days(2), now() + days(3));
        let s = running.start();
        // Extended to the maximum, shortened below the minimum (as an early end may).
        assert!(change(running, true, s, s + days(14), &[]).is_ok());
        assert!(change(running, true, s, now() + secs(60), &[]).is_ok());
        assert_eq!(
            change(running, true, s, s + days(14) + secs(1), &[]),
            Err(RuleCode::DurationTooLong)
        );
        assert_eq!(
            change(running, true, s + secs(1), running.end(), &[]),
            Err(RuleCode::BookingStarted)
        );
        assert_eq!(
            change(running, true, s, now(), &[]),
            Err(RuleCode::EndInPast)
        );
        assert_eq!(
            change(running, true, s, now() - secs(1), &[]),
            Err(RuleCode::EndInPast)
        );
        // The cooldown to the user's planned booking is checked from the new end.
        let planned = w(now() + days(20), now() + days(21));
        assert!(change(running, true, s, now() + days(5), &[planned]).is_ok());
        assert_eq!(
            change(running, true, s, now() + days(7), &[planned]),
            Err(RuleCode::Cooldown)
        );
        // An admin override may pass the maximum, never the past or the user's overlap.
        let admin = |end, others| {
            let c = WindowChange {
                current: running,
                started: true,
                start: s,
                end,
                others,
                override_rules: true,
            };
            check_change(&Policy::default(), now(), &c).map_err(|r| r.code)
        };
        assert!(admin(s + days(30), &[]).is_ok());
        assert_eq!(admin(now(), &[]), Err(RuleCode::EndInPast));
        assert_eq!(admin(now() + days(21), &[planned]), Err(RuleCode::Overlap));
    }

    #[test]
    fn a_cooldown_refusal_names_the_bound_it_crossed() {
        let p = Policy {
            max_planned: 3,
            ..Policy::default()
        };
        let earlier = w(now() - days(3), now() - days(1));
        let later = w(now() + days(30), now() + days(31));
        // Too close to a booking after it: it must end by that one's start less the
        // cooldown, not "start after" that later booking.
        let before_later = w(now() + days(15), now() + days(20));
        let r = check_user(&p, now(), &before_later, &[later], false).unwrap_err();
        assert_eq!(r.code, RuleCode::Cooldown);
        assert_eq!(
            r.message,
            "Your next booking starts 2026-03-31T12:00:00Z; bookings keep a cooldown of 14 \
             days between them, so this one must end by 2026-03-17T12:00:00Z."
        );
        assert_eq!(r.earliest_start, Some(later.end() + days(14)));
        // Too close to one before it: it may start a cooldown after that one's end.
        let after_earlier = w(now() + days(2), now() + days(4));
        let r = check_user(&p, now(), &after_earlier, &[earlier], false).unwrap_err();
        assert_eq!(
            r.message,
            "Your last booking ended 2026-02-28T12:00:00Z; after a booking there is a \
             cooldown of 14 days, so your next one can start from 2026-03-14T12:00:00Z."
        );
        assert_eq!(r.earliest_start, Some(earlier.end() + days(14)));
        // Between two: both bounds.
        let between = w(now() + days(10), now() + days(20));
        let r = check_user(&p, now(), &between, &[earlier, later], false).unwrap_err();
        assert!(
            r.message.contains("must start from 2026-03-14T12:00:00Z")
                && r.message.contains("end by 2026-03-17T12:00:00Z"),
            "{}",
            r.message
        );
        // A running booking shortened while still too close to the next one: the end
        // it must keep to, and no start offered (a started booking keeps its start).
        let running = w(now() - days(1), now() + days(10));
        let next = w(now() + days(20), now() + days(22));
        let c = WindowChange {
            current: running,
            started: true,
            start: running.start(),
            end: now() + days(8),
            others: &[next],
            override_rules: false,
        };
        let r = check_change(&p, now(), &c).unwrap_err();
        assert_eq!(r.code, RuleCode::Cooldown);
        assert!(
            r.message
                .starts_with("Your next booking starts 2026-03-21T12:00:00Z;")
                && r.message.ends_with("must end by 2026-03-07T12:00:00Z."),
            "{}",
            r.message
        );
        assert_eq!(r.earliest_start, None);
    }

    #[test]
    fn a_change_to_the_same_window_changes_nothing() {
        let b = w(now() + days(1), now() + days(3));
        assert!(changes_nothing(&b, b.start(), b.end()));
        assert!(!changes_nothing(&b, b.start(), b.end() + secs(1)));
        assert!(!changes_nothing(&b, b.start() - secs(1), b.end()));
    }

    #[test]
    fn a_planned_booking_keeps_the_rules_of_a_new_one() {
        let planned = w(now() + days(1), now() + days(3));
        let s = planned.start();
        assert!(change(planned, false, s, s + days(14), &[]).is_ok());
        assert_eq!(
            change(planned, false, s, s + TimeDelta::hours(23), &[]),
            Err(RuleCode::DurationTooShort)
        );
        assert!(change(planned, false, s + days(1), s + days(3), &[]).is_ok());
        assert_eq!(
            change(planned, false, now() - secs(1), s + days(3), &[]),
            Err(RuleCode::StartInPast)
        );
        assert_eq!(
            change(planned, false, s, s - secs(1), &[]),
            Err(RuleCode::EndInPast).or(Err(RuleCode::InvalidWindow))
        );
    }
}
