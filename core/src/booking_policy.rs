//! The lab's booking policy: every fairness rule of docs/design.md ("The rules") is
//! one setting here.

use chrono::TimeDelta;

/// Settings the booking rules are checked against. `Default` is the policy of
/// docs/design.md: 1 to 14 days, a 14-day cooldown, nothing new while a booking runs,
/// at most one planned booking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Shortest booking accepted (inclusive).
    pub min_duration: TimeDelta,
    /// Longest booking accepted (inclusive).
    pub max_duration: TimeDelta,
    /// Time between the end of a user's booking and the start of their next one.
    pub cooldown: TimeDelta,
    /// Refuse a new booking while the user has one running.
    pub no_booking_while_active: bool,
    /// Planned (not yet started) bookings a user may hold at once.
    pub max_planned: u32,
    /// GPUs (units of its model) one booking may be for; 1: single-GPU bookings only.
    pub max_units_per_booking: u32,
    /// How far ahead a booking may start: a lab plans a term, not a century (and the
    /// calendar feeds show a year).
    pub max_ahead: TimeDelta,
    /// Calendar feeds of a model's occupancy name the users who booked it (off: a
    /// model's feed shows only that a unit is booked, and the caller's own bookings).
    pub feed_show_names: bool,
    /// The lab's time zone: where a group's quota month begins and ends
    /// (`crate::quota`).
    pub zone: chrono_tz::Tz,
}

/// The most units one booking may ever be for, whatever the policy says: far above
/// any lab's node, and it bounds what a booking costs (a row per unit is never kept,
/// but counts and slot lists grow with it).
pub const MAX_UNITS_PER_BOOKING_LIMIT: u32 = 64;

impl Default for Policy {
    fn default() -> Self {
        Policy {
            min_duration: TimeDelta::hours(24),
            max_duration: TimeDelta::days(14),
            cooldown: TimeDelta::days(14),
            no_booking_while_active: true,
            max_planned: 1,
            max_units_per_booking: 1,
            max_ahead: TimeDelta::days(365),
            feed_show_names: false,
            zone: chrono_tz::Tz::UTC,
        }
    }
}

/// Renders a duration the way the refusal messages show it: `14 days`, `1 day 2 h`,
/// `23 h 59 min 59 s`.
pub fn human_duration(d: TimeDelta) -> String {
    let total = d.num_seconds().max(0);
    let (days, rest) = (total / 86_400, total % 86_400);
    let (hours, rest) = (rest / 3_600, rest % 3_600);
    let (minutes, seconds) = (rest / 60, rest % 60);
    let mut parts = Vec::new();
    match days {
        0 => {}
        1 => parts.push("1 day".to_string()),
        n => parts.push(format!("{n} days")),
    }
    if hours > 0 {
        parts.push(format!("{hours} h"));
    }
    if minutes > 0 {
        parts.push(format!("{minutes} min"));
    }
    if seconds > 0 {
        parts.push(format!("{seconds} s"));
    }
    if parts.is_empty() {
        "0 s".to_string()
    } else {
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_text() {
        assert_eq!(human_duration(TimeDelta::days(14)), "14 days");
        assert_eq!(human_duration(TimeDelta::hours(26)), "1 day 2 h");
        assert_eq!(
            human_duration(TimeDelta::hours(24) - TimeDelta::seconds(1)),
            "23 h 59 min 59 s"
        );
        assert_eq!(human_duration(TimeDelta::zero()), "0 s");
    }
}
