//! The occurrences of a course reservation: an RFC 5545 recurrence rule evaluated on
//! wall-clock times in the lab's time zone, so that a session at 14:00-16:00 stays at
//! 14:00-16:00 local time on both sides of a daylight-saving change.
//!
//! How: the rule (the `rrule` crate) runs on the wall-clock start as if it were UTC,
//! where no day is longer or shorter than another, and gives each occurrence's
//! wall-clock start; its wall-clock end is that start plus the first occurrence's
//! wall-clock length. Each is then placed in the zone as RFC 5545 (3.3.5) reads a
//! local DATE-TIME:
//!
//! - a wall-clock time that occurs twice (the hour repeated when summer time ends) is
//!   the first of the two;
//! - one that does not occur (the hour skipped when summer time starts) is read with
//!   the UTC offset before the gap: 02:30 on a night that jumps from 02:00 to 03:00
//!   is 03:30 summer time, an hour after 01:30 winter time; a session that starts
//!   in the skipped hour and ends after it (02:30-03:15) keeps its length (03:30-04:15).
//!
//! `UNTIL` is a wall-clock time too (floating, or with `Z`, read alike). A rule must
//! end (`COUNT` or `UNTIL`): a course is for a term, and every occurrence is written
//! as a booking row when the reservation is made, up to the booking horizon (the
//! caller refuses an occurrence beyond it). Occurrences of one reservation never
//! overlap: a rule whose sessions would is refused.

use chrono::{DateTime, LocalResult, NaiveDateTime, TimeDelta, TimeZone, Utc};
use chrono_tz::Tz;

use crate::window::Window;

/// The most occurrences one reservation may have: a session a day for a year fits.
pub const MAX_OCCURRENCES: usize = 400;

/// A reservation's schedule as its creator gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// The rule's parts (`FREQ=WEEKLY;BYDAY=TU;COUNT=12`), optionally after `RRULE:`.
    pub rule: String,
    pub zone: Tz,
    /// The first occurrence's wall-clock start and end in `zone` (`DTSTART`, and the
    /// end that gives each occurrence its wall-clock length).
    pub local_start: NaiveDateTime,
    pub local_end: NaiveDateTime,
}

/// Why a schedule gives no occurrences to hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecurrenceError {
    #[error("the recurrence rule {rule:?} is not valid: {why}")]
    Rule { rule: String, why: String },
    #[error("the recurrence rule must end: give COUNT or UNTIL (a course is for a term)")]
    Unbounded,
    #[error("the session must end after it starts")]
    EmptySession,
    #[error("the rule gives more than {max} occurrences")]
    TooMany { max: usize },
    #[error("the rule gives no occurrence")]
    NoOccurrence,
    #[error("occurrences overlap: one from {first} runs past the start of the next at {second}")]
    Overlap {
        first: DateTime<Utc>,
        second: DateTime<Utc>,
    },
    #[error("an occurrence at {0} cannot be placed in the time zone")]
    Unplaceable(NaiveDateTime),
}

/// The instant a wall-clock time in `zone` names, as RFC 5545 reads a local time
/// (see the module): the first of two, or with the offset before a gap. `None` only
/// outside chrono's range.
pub fn resolve_local(zone: Tz, local: NaiveDateTime) -> Option<DateTime<Utc>> {
    match zone.from_local_datetime(&local) {
        LocalResult::Single(t) => Some(t.with_timezone(&Utc)),
        LocalResult::Ambiguous(first, _) => Some(first.with_timezone(&Utc)),
        LocalResult::None => {
            // The offset before the gap is the one in effect 16 hours (as UTC) before
            // the wall-clock time: earlier than the switch in every zone (offsets lie
            // within -12 h and +14 h, gaps are an hour or less), and later than the
            // switch before it (no zone switches twice in a day).
            let before = local.and_utc().checked_sub_signed(TimeDelta::hours(16))?;
            let offset = zone.offset_from_utc_datetime(&before.naive_utc());
            let offset = chrono::Offset::fix(&offset);
            let at = local
                .checked_sub_signed(TimeDelta::seconds(i64::from(offset.local_minus_utc())))?;
            Some(at.and_utc())
        }
    }
}

/// The rule's text without an `RRULE:` prefix, trimmed.
fn rule_body(rule: &str) -> &str {
    let rule = rule.trim();
    match rule.get(..6) {
        Some(p) if p.eq_ignore_ascii_case("RRULE:") => rule[6..].trim(),
        _ => rule,
    }
}

/// Every occurrence of `schedule`, in order, as UTC windows: at most
/// [`MAX_OCCURRENCES`], none overlapping another.
pub fn occurrences(schedule: &Schedule) -> Result<Vec<Window>, RecurrenceError> {
    let length = schedule.local_end - schedule.local_start;
    if length <= TimeDelta::zero() {
        return Err(RecurrenceError::EmptySession);
    }
    let body = rule_body(&schedule.rule);
    let invalid = |why: String| RecurrenceError::Rule {
        rule: body.to_owned(),
        why,
    };
    // A content line of its own: no DTSTART or second rule can ride along in it.
    if body.is_empty() || body.contains(['\n', '\r', ':']) {
        return Err(invalid(
            "give the rule's parts only, e.g. FREQ=WEEKLY;BYDAY=TU;COUNT=12".into(),
        ));
    }
    let rule: rrule::RRule<rrule::Unvalidated> = body
        .parse()
        .map_err(|e: rrule::RRuleError| invalid(e.to_string()))?;
    if rule.get_count().is_none() && rule.get_until().is_none() {
        return Err(RecurrenceError::Unbounded);
    }
    // Wall-clock times, evaluated as UTC (see the module).
    let start = rrule::Tz::UTC.from_utc_datetime(&schedule.local_start);
    let set = rule.build(start).map_err(|e| invalid(e.to_string()))?;
    let limit = u16::try_from(MAX_OCCURRENCES + 1).unwrap_or(u16::MAX);
    let found = set.all(limit);
    if found.dates.len() > MAX_OCCURRENCES {
        return Err(RecurrenceError::TooMany {
            max: MAX_OCCURRENCES,
        });
    }
    let mut windows = Vec::with_capacity(found.dates.len());
    for date in found.dates {
        let local = date.naive_utc();
        let end_local = local
            .checked_add_signed(length)
            .ok_or(RecurrenceError::Unplaceable(local))?;
        let window = match (
            resolve_local(schedule.zone, local),
            resolve_local(schedule.zone, end_local),
        ) {
            // A start in a skipped hour moves forward by the gap and the end, past
            // it, does not: the session then keeps its wall-clock length instead.
            (Some(s), Some(e)) if e <= s => {
                Window::new(s, s + length).map_err(|_| RecurrenceError::Unplaceable(local))?
            }
            (Some(s), Some(e)) => {
                Window::new(s, e).map_err(|_| RecurrenceError::Unplaceable(local))?
            }
            _ => return Err(RecurrenceError::Unplaceable(local)),
        };
        windows.push(window);
    }
    if windows.is_empty() {
        return Err(RecurrenceError::NoOccurrence);
    }
    windows.sort_by_key(|w| w.start());
    if let Some(pair) = windows.windows(2).find(|p| p[0].end() > p[1].start()) {
        return Err(RecurrenceError::Overlap {
            first: pair[0].start(),
            second: pair[1].start(),
        });
    }
    Ok(windows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{NaiveDate, Timelike};
    use chrono_tz::{America, Europe};

    fn local(y: i32, m: u32, d: u32, h: u32, min: u32) -> NaiveDateTime {
        NaiveDate::from_ymd_opt(y, m, d)
            .and_then(|d| d.and_hms_opt(h, min, 0))
            .unwrap()
    }

    fn schedule(rule: &str, zone: Tz, start: NaiveDateTime, hours: i64) -> Schedule {
        Schedule {
            rule: rule.into(),
            zone,
            local_start: start,
            local_end: start + TimeDelta::hours(hours),
        }
    }

    #[test]
    fn tuesdays_at_two_stay_at_two_across_the_summer_time_change() {
        // Berlin leaves summer time on 2027-10-31: four Tuesdays before, four after.
        let s = schedule(
            "FREQ=WEEKLY;BYDAY=TU;COUNT=8",
            Europe::Berlin,
            local(2027, 10, 12, 14, 0),
            2,
        );
        let all = occurrences(&s).unwrap();
        assert_eq!(all.len(), 8);
        for w in &all {
            let start = w.start().with_timezone(&Europe::Berlin);
            let end = w.end().with_timezone(&Europe::Berlin);
            assert_eq!((start.hour(), start.minute()), (14, 0), "{start}");
            assert_eq!((end.hour(), end.minute()), (16, 0), "{end}");
        }
        // 12:00 UTC in summer time, 13:00 UTC after it.
        assert_eq!(all[0].start().hour(), 12);
        assert_eq!(all[7].start().hour(), 13);
    }

    #[test]
    fn a_skipped_hour_reads_with_the_offset_before_the_gap() {
        // New York, 2027-03-14: 02:00 EST jumps to 03:00 EDT; 02:30 is 03:30 EDT (RFC
        // 5545, 3.3.5), i.e. 07:30 UTC.
        let t = resolve_local(America::New_York, local(2027, 3, 14, 2, 30)).unwrap();
        assert_eq!(t, Utc.with_ymd_and_hms(2027, 3, 14, 7, 30, 0).unwrap());
    }

    #[test]
    fn a_repeated_hour_is_the_first_of_the_two() {
        // New York, 2027-11-07: 01:30 happens in EDT (05:30 UTC) and in EST (06:30 UTC).
        let t = resolve_local(America::New_York, local(2027, 11, 7, 1, 30)).unwrap();
        assert_eq!(t, Utc.with_ymd_and_hms(2027, 11, 7, 5, 30, 0).unwrap());
    }

    #[test]
    fn a_session_across_the_change_keeps_its_wall_clock_times() {
        // 01:00-04:00 on the night summer time ends in Berlin: four hours long.
        let s = schedule(
            "FREQ=DAILY;COUNT=1",
            Europe::Berlin,
            local(2027, 10, 31, 1, 0),
            3,
        );
        let w = occurrences(&s).unwrap()[0];
        assert_eq!(w.duration(), TimeDelta::hours(4));
    }

    #[test]
    fn an_rrule_prefix_and_until_are_accepted() {
        let s = schedule(
            "RRULE:FREQ=WEEKLY;BYDAY=TU,TH;UNTIL=20270131T235959Z",
            Europe::Berlin,
            local(2027, 1, 5, 9, 0),
            1,
        );
        // Jan 5 to Jan 28: four Tuesdays, four Thursdays.
        assert_eq!(occurrences(&s).unwrap().len(), 8);
    }

    #[test]
    fn bad_rules_are_refused_with_their_reason() {
        let at = local(2027, 1, 5, 9, 0);
        let refused = |rule: &str, hours: i64| occurrences(&schedule(rule, Tz::UTC, at, hours));
        assert_eq!(
            refused("FREQ=WEEKLY;BYDAY=TU", 2),
            Err(RecurrenceError::Unbounded)
        );
        assert!(matches!(
            refused("FREQ=SOMETIMES;COUNT=2", 2),
            Err(RecurrenceError::Rule { .. })
        ));
        assert!(matches!(refused("", 2), Err(RecurrenceError::Rule { .. })));
        assert!(matches!(
            refused("FREQ=DAILY;COUNT=2\nRRULE:FREQ=HOURLY;COUNT=9", 2),
            Err(RecurrenceError::Rule { .. })
        ));
        assert_eq!(
            refused("FREQ=DAILY;COUNT=2", 0),
            Err(RecurrenceError::EmptySession)
        );
        assert_eq!(
            refused("FREQ=HOURLY;COUNT=1000", 1),
            Err(RecurrenceError::TooMany {
                max: MAX_OCCURRENCES
            })
        );
        assert!(matches!(
            refused("FREQ=HOURLY;COUNT=3", 2),
            Err(RecurrenceError::Overlap { .. })
        ));
    }

    fn zones() -> impl proptest::strategy::Strategy<Value = Tz> {
        proptest::sample::select(vec![
            Tz::UTC,
            Europe::Berlin,
            America::New_York,
            chrono_tz::Australia::Lord_Howe,
            chrono_tz::America::Sao_Paulo,
            chrono_tz::Asia::Kolkata,
        ])
    }

    proptest::proptest! {
        /// Whatever the rule, zone and start (across DST changes of several kinds,
        /// Lord Howe's half hour included): occurrences are in order, never overlap,
        /// at most the maximum, the first starts where DTSTART says, and each starts
        /// at the rule's wall-clock time unless that time does not exist that day.
        #[test]
        fn occurrences_never_overlap_and_keep_their_wall_clock(
            zone in zones(),
            day in 0i64..730,
            minute in 0u32..(24 * 60),
            length_min in 1i64..(6 * 60),
            freq in proptest::sample::select(vec!["DAILY", "WEEKLY", "WEEKLY;BYDAY=MO,WE,FR", "MONTHLY"]),
            count in 1u32..60,
        ) {
            let start = local(2027, 1, 1, 0, 0) + TimeDelta::days(day) + TimeDelta::minutes(i64::from(minute));
            let s = Schedule {
                rule: format!("FREQ={freq};COUNT={count}"),
                zone,
                local_start: start,
                local_end: start + TimeDelta::minutes(length_min),
            };
            // Sessions shorter than the gaps between them: every rule here is valid.
            let all = occurrences(&s);
            proptest::prop_assert!(all.is_ok(), "{:?}", all);
            let all = all.unwrap_or_default();
            proptest::prop_assert!(!all.is_empty() && all.len() <= MAX_OCCURRENCES);
            proptest::prop_assert!(all.len() <= count as usize);
            for pair in all.windows(2) {
                proptest::prop_assert!(pair[0].end() <= pair[1].start());
            }
            if !freq.contains("BYDAY") {
                // DTSTART is the first occurrence when the rule picks its day.
                proptest::prop_assert_eq!(Some(all[0].start()), resolve_local(zone, start));
            }
            for w in &all {
                let wall = w.start().with_timezone(&zone).naive_local();
                if matches!(zone.from_local_datetime(&(wall.date().and_time(start.time()))), LocalResult::None) {
                    continue;
                }
                proptest::prop_assert_eq!(wall.time(), start.time());
            }
        }
    }
}
