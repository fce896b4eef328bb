//! The lab's days: the calendar's days in the lab's time zone (`--time-zone`), each
//! from its local midnight to the next (23 or 25 hours where daylight saving
//! changes), and the busiest instant of a model's bookings in each.
//!
//! The booking store keeps what a count of a busiest instant needs per UTC day
//! (`capacity::DayLoad`, `booking_day_units`). A lab day overlaps one to three UTC
//! days and begins or ends inside them, so the UTC days' peaks do not give it; the
//! rows do, each read as the level of units over its day: the units in use at its
//! midnight, then +1 at each unit's start and -1 at each end inside it. A lab day's
//! busiest instant is the highest level over its part of each UTC day.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, NaiveTime, Utc};
use chrono_tz::Tz;

use crate::capacity::{utc_day_window, window_days, DayLoad};
use crate::recurrence::resolve_local;
use crate::window::Window;

/// The instant the lab day `date` begins in `zone`: its midnight, read as a course's
/// local times are read (`recurrence::resolve_local`): where a daylight-saving change
/// skips midnight, the instant the clocks jump; where midnight comes twice, the
/// first. `None` only outside chrono's range.
pub fn day_start(zone: Tz, date: NaiveDate) -> Option<DateTime<Utc>> {
    resolve_local(zone, date.and_time(NaiveTime::MIN))
}

/// The lab day `date` in `zone`: from its start to the next day's.
pub fn day_window(zone: Tz, date: NaiveDate) -> Option<Window> {
    Window::new(day_start(zone, date)?, day_start(zone, date.succ_opt()?)?).ok()
}

/// `count` lab days in `zone` from `first` on, in order: each ends where the next
/// begins. `None` past chrono's range.
pub fn day_windows(zone: Tz, first: NaiveDate, count: usize) -> Option<Vec<Window>> {
    first
        .iter_days()
        .take(count)
        .map(|date| day_window(zone, date))
        .collect()
}

/// The UTC days (days since 1970, as `capacity::utc_day` gives) that `windows`
/// touch, from the first window's start to the last one's end: the first, and how
/// many. `None` for no window.
pub fn utc_days(windows: &[Window]) -> Option<(i64, usize)> {
    let start = windows.iter().map(Window::start).min()?;
    let end = windows.iter().map(Window::end).max()?;
    let (first, last) = window_days(&Window::new(start, end).ok()?);
    Some((first, usize::try_from(last - first + 1).ok()?))
}

/// The units in use at the busiest instant of each of `windows`, from what the store
/// keeps of the model's bookings on every UTC day they touch (`loads`, by day; a day
/// without one holds nothing: see [`utc_days`]) and the bookings it does not keep
/// per day (`long`, each window once per unit): the same answer as
/// `capacity::peak_in` over every booking, for windows that begin and end anywhere
/// in a day. Each UTC day is swept once, however many windows touch it.
pub fn peaks_in_windows(
    loads: &BTreeMap<i64, DayLoad>,
    long: &[Window],
    windows: &[Window],
) -> Vec<usize> {
    let mut swept: BTreeMap<i64, Option<DayLevels>> = BTreeMap::new();
    windows
        .iter()
        .map(|w| {
            let (first, last) = window_days(w);
            let peak = (first..=last)
                .filter_map(|day| {
                    let levels = swept
                        .entry(day)
                        .or_insert_with(|| DayLevels::sweep(day, loads.get(&day), long))
                        .as_ref()?;
                    levels.peak_in(w)
                })
                .max()
                .unwrap_or(0);
            usize::try_from(peak).unwrap_or(0)
        })
        .collect()
}

/// The units in use over one UTC day: at its midnight, and after each instant inside
/// it where a unit begins or ends.
struct DayLevels {
    day: Window,
    at_midnight: i64,
    /// The level after each start or end, in order; at one instant ends come first
    /// (half-open windows), so no level between two changes of one instant is higher
    /// than the level after both.
    after: Vec<(DateTime<Utc>, i64)>,
}

impl DayLevels {
    /// The day's level from its row (`load`; `None`: nothing kept per day touches
    /// it) and the long bookings over it. `None` outside chrono's range.
    fn sweep(day: i64, load: Option<&DayLoad>, long: &[Window]) -> Option<DayLevels> {
        let day = utc_day_window(day)?;
        // The row's units that began before the day are in use at its midnight.
        let mut level = load.map_or(0, |l| {
            let starts = l.edges.iter().filter(|(_, start)| *start).count();
            i64::from(l.units) - starts as i64
        });
        let mut events: Vec<(DateTime<Utc>, i64)> = load
            .map(|l| &l.edges[..])
            .unwrap_or_default()
            .iter()
            .map(|&(at, start)| (at, if start { 1 } else { -1 }))
            .collect();
        for w in long.iter().filter(|w| w.overlaps(&day)) {
            if w.start() <= day.start() {
                level += 1;
            } else {
                events.push((w.start(), 1));
            }
            if w.end() < day.end() {
                events.push((w.end(), -1));
            }
        }
        events.sort_unstable();
        let at_midnight = level;
        let after = events
            .into_iter()
            .map(|(at, delta)| {
                level += delta;
                (at, level)
            })
            .collect();
        Some(DayLevels {
            day,
            at_midnight,
            after,
        })
    }

    /// The highest level in the part of `window` inside the day; `None` when they do
    /// not overlap.
    fn peak_in(&self, window: &Window) -> Option<i64> {
        let (start, end) = (
            window.start().max(self.day.start()),
            window.end().min(self.day.end()),
        );
        if start >= end {
            return None;
        }
        // The level at the part's first instant: after every change up to it.
        let from = self.after.partition_point(|(at, _)| *at <= start);
        let first = from
            .checked_sub(1)
            .map_or(self.at_midnight, |i| self.after[i].1);
        let to = self.after.partition_point(|(at, _)| *at < end);
        Some(
            self.after
                .get(from..to)
                .unwrap_or_default()
                .iter()
                .map(|(_, level)| *level)
                .fold(first, i64::max),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::{peak_in, peaks_of_days, stored_day_loads, utc_day};
    use chrono::{TimeDelta, TimeZone};
    use proptest::prelude::*;

    fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
    }

    fn date(y: i32, mo: u32, d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(y, mo, d).unwrap()
    }

    const AUCKLAND: Tz = chrono_tz::Pacific::Auckland;

    #[test]
    fn a_lab_day_runs_from_local_midnight_to_the_next() {
        // NZDT (+13): 2030-01-08 begins at 11:00 UTC the day before.
        let w = day_window(AUCKLAND, date(2030, 1, 8)).unwrap();
        assert_eq!(
            (w.start(), w.end()),
            (at(2030, 1, 7, 11, 0), at(2030, 1, 8, 11, 0))
        );
        assert_eq!(
            day_window(Tz::UTC, date(2030, 1, 8)).unwrap(),
            utc_day_window(utc_day(at(2030, 1, 8, 0, 0))).unwrap()
        );
    }

    #[test]
    fn daylight_saving_days_are_23_and_25_hours() {
        // New Zealand: clocks go back an hour on 2030-04-07, forward on 2030-09-29.
        let back = day_window(AUCKLAND, date(2030, 4, 7)).unwrap();
        assert_eq!(back.duration(), TimeDelta::hours(25));
        let forward = day_window(AUCKLAND, date(2030, 9, 29)).unwrap();
        assert_eq!(forward.duration(), TimeDelta::hours(23));
        let days = day_windows(AUCKLAND, date(2030, 4, 6), 3).unwrap();
        assert_eq!(days[1], back);
        assert!(days.windows(2).all(|p| p[0].end() == p[1].start()));
    }

    #[test]
    fn a_skipped_midnight_begins_the_day_where_the_clocks_jump() {
        // Chile: 2030-09-08 00:00 does not exist (clocks jump to 01:00, -04 to -03).
        let zone = chrono_tz::America::Santiago;
        let w = day_window(zone, date(2030, 9, 8)).unwrap();
        assert_eq!(w.start(), at(2030, 9, 8, 4, 0));
        assert_eq!(w.duration(), TimeDelta::hours(23));
    }

    #[test]
    fn the_utc_days_a_lab_day_touches() {
        let days = day_windows(AUCKLAND, date(2030, 1, 8), 2).unwrap();
        let first = utc_day(at(2030, 1, 7, 0, 0));
        assert_eq!(utc_days(&days), Some((first, 3)));
        assert_eq!(utc_days(&[]), None);
    }

    #[test]
    fn bookings_on_two_utc_days_of_one_lab_day() {
        // One unit 12:00-14:00 UTC on the 7th and another 01:00-03:00 UTC on the
        // 8th: both in the Auckland day of the 8th, never at once.
        let bookings = [
            Window::new(at(2030, 1, 7, 12, 0), at(2030, 1, 7, 14, 0)).unwrap(),
            Window::new(at(2030, 1, 8, 1, 0), at(2030, 1, 8, 3, 0)).unwrap(),
            Window::new(at(2030, 1, 7, 13, 0), at(2030, 1, 8, 2, 0)).unwrap(),
        ];
        let (loads, long) = stored_day_loads(&bookings);
        let days = day_windows(AUCKLAND, date(2030, 1, 7), 3).unwrap();
        assert_eq!(peaks_in_windows(&loads, &long, &days), [0, 2, 0]);
        assert_eq!(peaks_in_windows(&loads, &long, &days[1..2]), [2]);
    }

    #[test]
    fn a_booking_that_ends_at_a_utc_midnight_inside_a_lab_day_ends_there() {
        // The store keeps no end for it: the day after its end holds nothing of it.
        let bookings = [Window::new(at(2030, 1, 7, 20, 0), at(2030, 1, 8, 0, 0)).unwrap()];
        let (loads, long) = stored_day_loads(&bookings);
        let lab = day_windows(AUCKLAND, date(2030, 1, 8), 2).unwrap();
        let after = Window::new(at(2030, 1, 8, 0, 0), at(2030, 1, 8, 11, 0)).unwrap();
        assert_eq!(peaks_in_windows(&loads, &long, &lab), [1, 0]);
        assert_eq!(peaks_in_windows(&loads, &long, &[after]), [0]);
    }

    fn window(start_min: i64, len_min: i64) -> Window {
        let base = at(2030, 3, 25, 0, 0);
        Window::new(
            base + TimeDelta::minutes(start_min),
            base + TimeDelta::minutes(start_min + len_min),
        )
        .unwrap()
    }

    proptest! {
        /// Over UTC days the answer is the UTC days' (`capacity::peaks_of_days`), and
        /// over the lab's days, in a zone whose clocks change among them, that of a
        /// count over every booking.
        #[test]
        fn the_peaks_are_those_of_every_booking(
            bookings in prop::collection::vec((0i64..30 * 1440, prop_oneof![1i64..3000, 40i64 * 1440..50 * 1440]), 0..40),
            first in 0u32..20,
        ) {
            let bookings: Vec<Window> = bookings.into_iter().map(|(s, l)| window(s, l)).collect();
            let (loads, long) = stored_day_loads(&bookings);
            let origin = utc_day(at(2030, 3, 25, 0, 0)) + i64::from(first);
            let utc: Vec<Window> = (origin..origin + 20).filter_map(utc_day_window).collect();
            prop_assert_eq!(peaks_in_windows(&loads, &long, &utc), peaks_of_days(origin, 20, &loads, &long));
            let lab = day_windows(AUCKLAND, date(2030, 3, 25) + TimeDelta::days(i64::from(first)), 20).unwrap();
            let each: Vec<usize> = lab.iter().map(|w| peak_in(&bookings, w)).collect();
            prop_assert_eq!(peaks_in_windows(&loads, &long, &lab), each);
        }
    }
}
