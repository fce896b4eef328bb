//! Capacity by count, and the concrete unit (slot) each booking holds.
//!
//! A booking fits if, at every instant of its window, the model's bookings stay
//! within its units. Each booking also holds a slot so that the database's
//! exclusion constraint (model, slot, period) can forbid overbooking on its own.
//! Cancellations leave gaps that a fixed first-come slot choice cannot always use,
//! so planned bookings may change slot when a new booking needs it.
//!
//! A booking for N units holds N slots, not necessarily adjacent
//! (adjacent slots would fragment: a 2-unit booking could be refused with two free
//! units). Where only windows are counted, a booking of N units is its window N
//! times ([`unit_windows`]), so every count below is a count of units.

use chrono::{DateTime, TimeDelta, Utc};

use crate::rules::{rfc3339, Refusal, RuleCode};
use crate::window::Window;

/// A booking of the model as the slot planner sees it: its window and the slots
/// (one per unit, ascending) it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub id: i64,
    pub window: Window,
    pub slots: Vec<i32>,
}

impl Held {
    /// The units the booking is for.
    pub fn units(&self) -> u32 {
        self.slots.len() as u32
    }
}

/// Each booking's window once per unit it holds: the form every count here takes.
pub fn unit_windows<'a>(bookings: impl IntoIterator<Item = (Window, u32)> + 'a) -> Vec<Window> {
    bookings
        .into_iter()
        .flat_map(|(w, units)| std::iter::repeat_n(w, units as usize))
        .collect()
}

/// The largest number of `bookings` that overlap at one instant inside `window`.
pub fn peak_in(bookings: &[Window], window: &Window) -> usize {
    // Sweep over the clipped intervals: +1 at a start, -1 at an end; ends sort
    // before starts at the same instant because the windows are half-open.
    let mut events: Vec<(DateTime<Utc>, i32)> = Vec::with_capacity(bookings.len() * 2);
    for b in bookings.iter().filter(|b| b.overlaps(window)) {
        events.push((b.start().max(window.start()), 1));
        events.push((b.end().min(window.end()), -1));
    }
    events.sort_unstable();
    let (mut current, mut peak) = (0i32, 0i32);
    for (_, delta) in events {
        current += delta;
        peak = peak.max(current);
    }
    peak.max(0) as usize
}

/// [`peak_in`] of each of `windows`, in one sweep over the bookings when the windows
/// follow one another (each starts at or after the end of the one before, as the days
/// of a calendar do). A year's availability asks 365 days of a model's ~2,000
/// bookings over the year: a [`peak_in`] per day walks all of them 365 times
/// (`cargo bench -p gpu-booking-core --bench capacity`). Windows in any other order
/// get a [`peak_in`] each.
pub fn peaks_in_each(bookings: &[Window], windows: &[Window]) -> Vec<usize> {
    let in_order = windows.windows(2).all(|p| p[0].end() <= p[1].start());
    let (Some(first), Some(last), true) = (windows.first(), windows.last(), in_order) else {
        return windows.iter().map(|w| peak_in(bookings, w)).collect();
    };
    let span = Window::new(first.start(), last.end()).unwrap_or(*first);
    // +1 at a start, -1 at an end; at one instant ends sort first (half-open windows).
    let mut events: Vec<(DateTime<Utc>, i32)> = bookings
        .iter()
        .filter(|b| b.overlaps(&span))
        .flat_map(|b| [(b.start(), 1), (b.end(), -1)])
        .collect();
    events.sort_unstable();
    let mut events = events.into_iter().peekable();
    let mut current = 0i32;
    windows
        .iter()
        .map(|w| {
            // The bookings that hold the window's first instant...
            while let Some((_, delta)) = events.next_if(|(at, _)| *at <= w.start()) {
                current += delta;
            }
            // ...and each that starts inside it.
            let mut peak = current;
            while let Some((_, delta)) = events.next_if(|(at, _)| *at < w.end()) {
                current += delta;
                peak = peak.max(current);
            }
            peak.max(0) as usize
        })
        .collect()
}

/// Whether one more booking of one unit over `window` keeps the model within `units`.
pub fn fits(units: u32, bookings: &[Window], window: &Window) -> bool {
    fits_units(units, bookings, window, 1)
}

/// Whether one more booking of `need` units over `window` keeps the model within
/// `units` (`bookings` counted per unit, see [`unit_windows`]).
pub fn fits_units(units: u32, bookings: &[Window], window: &Window, need: u32) -> bool {
    peak_in(bookings, window) + need as usize <= units as usize
}

/// The earliest start at or after `from` where a booking of one unit and `duration`
/// fits.
pub fn earliest_fit(
    units: u32,
    bookings: &[Window],
    from: DateTime<Utc>,
    duration: TimeDelta,
) -> Option<DateTime<Utc>> {
    earliest_fit_units(units, bookings, from, duration, 1)
}

/// The earliest start at or after `from` where a booking of `need` units and
/// `duration` fits. Free capacity only ever appears when a booking ends, so the
/// candidates are `from` and the ends after it. `None` when the model has fewer
/// than `need` units (or none).
pub fn earliest_fit_units(
    units: u32,
    bookings: &[Window],
    from: DateTime<Utc>,
    duration: TimeDelta,
    need: u32,
) -> Option<DateTime<Utc>> {
    if units == 0 || need == 0 || need > units || duration <= TimeDelta::zero() {
        return None;
    }
    let mut candidates: Vec<DateTime<Utc>> = std::iter::once(from)
        .chain(bookings.iter().map(|b| b.end()).filter(|&e| e > from))
        .collect();
    candidates.sort_unstable();
    candidates.dedup();
    candidates.into_iter().find(|&start| {
        Window::new(start, start + duration)
            .map(|w| fits_units(units, bookings, &w, need))
            .unwrap_or(false)
    })
}

/// Why a model cannot take a booking: a value the booking store returns, worded for
/// the user by its [`Refusal`] (rule `capacity`), so that the store writes no text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CapacityRefusal {
    /// Fewer than `need` of the model's `units` are free at some instant of
    /// `window`; `earliest_start` is the first start from which a booking of the same
    /// length and units fits ([`refuse_full`]).
    Full {
        model: String,
        units: u32,
        need: u32,
        window: Window,
        earliest_start: Option<DateTime<Utc>>,
    },
    /// It fits by count, but no assignment of units holds it (bookings that have
    /// started keep theirs).
    NoUnitAssignable,
    /// The database's exclusion constraint on units refused (the backstop of the
    /// count): a unit is taken in that window.
    UnitTaken,
}

/// The refusal of a booking of `need` units over `window` on `model` (`units` units)
/// that does not fit; `later` are the model's bookings from the window's start on
/// (per unit, see [`unit_windows`]), where the earliest fit is looked for.
pub fn refuse_full(
    model: &str,
    units: u32,
    need: u32,
    window: &Window,
    later: &[Window],
) -> CapacityRefusal {
    CapacityRefusal::Full {
        model: model.to_owned(),
        units,
        need,
        window: *window,
        earliest_start: earliest_fit_units(units, later, window.start(), window.duration(), need),
    }
}

impl From<CapacityRefusal> for Refusal {
    fn from(refused: CapacityRefusal) -> Refusal {
        match refused {
            CapacityRefusal::Full {
                model,
                units,
                need,
                window,
                earliest_start,
            } => {
                let (start, end) = (rfc3339(window.start()), rfc3339(window.end()));
                let message = if need <= 1 {
                    format!("All {units} units of {model} are booked at some point between {start} and {end}.")
                } else {
                    format!(
                        "Fewer than {need} of the {units} units of {model} are free at some point between {start} and {end}."
                    )
                };
                let refusal = Refusal::new(RuleCode::Capacity, message);
                match earliest_start {
                    Some(t) => refusal.with_earliest(t),
                    None => refusal,
                }
            }
            CapacityRefusal::NoUnitAssignable => Refusal::new(
                RuleCode::Capacity,
                "No unit of this model can be assigned over that window.",
            ),
            CapacityRefusal::UnitTaken => Refusal::new(
                RuleCode::Capacity,
                "Every unit of this model is booked in that window.",
            ),
        }
    }
}

/// Free units of the model over `window` (the worst instant counts).
pub fn free_in(units: u32, bookings: &[Window], window: &Window) -> u32 {
    (units as usize).saturating_sub(peak_in(bookings, window)) as u32
}

/// Where a new booking goes: its slots, and the planned bookings that must move
/// (with all their new slots).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotPlan {
    pub slots: Vec<i32>,
    pub moves: Vec<(i64, Vec<i32>)>,
}

/// `need` slots free over `window` among `overlapping` (the model's bookings that
/// overlap it), without moving anything: the common, cheap case. The lowest free
/// ones, ascending. The slots held over the window are gathered once and sorted, so
/// that the cost is that of the bookings' slots, not of the slots times the bookings
/// (a create on a crowded model walks past every held slot below the first free one).
pub fn free_slots(
    units: u32,
    overlapping: &[Held],
    window: &Window,
    need: u32,
) -> Option<Vec<i32>> {
    let mut held: Vec<i32> = overlapping
        .iter()
        .filter(|h| h.window.overlaps(window))
        .flat_map(|h| h.slots.iter().copied())
        .collect();
    held.sort_unstable();
    held.dedup();
    let mut held = held.into_iter().peekable();
    let mut slots = Vec::new();
    for slot in 0..i32::try_from(units).unwrap_or(i32::MAX) {
        if slots.len() == need as usize {
            break;
        }
        while held.next_if(|&h| h < slot).is_some() {}
        if held.next_if_eq(&slot).is_none() {
            slots.push(slot);
        }
    }
    (need > 0 && slots.len() == need as usize).then_some(slots)
}

/// The UTC day an instant lies in, in days since 1970-01-01: the booking store's
/// `booking_day` (migration 20261129000100).
pub fn utc_day(t: DateTime<Utc>) -> i64 {
    t.timestamp().div_euclid(86_400)
}

/// The UTC days a window touches, first and last (its end is not in it).
pub fn window_days(window: &Window) -> (i64, i64) {
    (
        utc_day(window.start()),
        utc_day(window.end() - TimeDelta::microseconds(1)),
    )
}

/// Whether the store keeps a booking over `window` per day (`booking_day_units`): its
/// window touches at most 31 UTC days (`booking_counted_by_day`, migration
/// 20261128000100).
pub fn counted_by_day(window: &Window) -> bool {
    let (first, last) = window_days(window);
    last - first < 31
}

/// What the model's bookings hold on the UTC days a window touches, as the booking
/// store keeps it per model and day (`booking_day_units`, for bookings of at most 31
/// days): the units held on each of those days, and every slot held on any of them.
/// Each booking over the window touches one of its days, so no instant of the window
/// holds more than [`DaysHeld::peak`] of those units, and a slot not in `slots` is
/// free throughout the window as far as they go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DaysHeld {
    /// Units per day (days since 1970), for the days that hold any.
    units: std::collections::BTreeMap<i64, u32>,
    /// Ascending, distinct.
    pub slots: Vec<i32>,
}

impl DaysHeld {
    /// Adds one day as the store keeps it: the units and the slots its bookings hold.
    pub fn add_day(&mut self, day: i64, units: u32, slots: &[i32]) {
        *self.units.entry(day).or_default() += units;
        self.add_slots(slots);
    }

    /// Adds a booking kept per day that is not written yet (an earlier create of the
    /// same batch), as the store's trigger will count it: its units on each of its
    /// days that `window` (the create deciding) touches, and its slots if there is
    /// one. So a create decides the same whether it comes after that one in a batch
    /// or after it was written.
    pub fn add_booking(&mut self, window: &Window, booking: &Held) {
        let (first, last) = window_days(window);
        let (from, to) = window_days(&booking.window);
        let days = first.max(from)..=last.min(to);
        if days.is_empty() {
            return;
        }
        for day in days {
            *self.units.entry(day).or_default() += booking.units();
        }
        self.add_slots(&booking.slots);
    }

    fn add_slots(&mut self, slots: &[i32]) {
        self.slots.extend_from_slice(slots);
        self.slots.sort_unstable();
        self.slots.dedup();
    }

    /// The most units held on one of the days.
    pub fn peak(&self) -> u32 {
        self.units.values().copied().max().unwrap_or(0)
    }
}

/// A UTC day's window: from its midnight to the next (`day` in days since 1970, as
/// [`utc_day`] gives).
pub fn utc_day_window(day: i64) -> Option<Window> {
    let midnight = DateTime::<Utc>::from_timestamp(day.checked_mul(86_400)?, 0)?;
    Window::new(midnight, midnight.checked_add_signed(TimeDelta::days(1))?).ok()
}

/// What the booking store keeps of one model's bookings on one UTC day for a count
/// of the day's busiest instant (`booking_day_units`, migration 20261209000100): the
/// units of the bookings kept per day that touch the day, and where inside the day
/// each of those units begins or ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DayLoad {
    /// Units of the counted bookings that touch the day.
    pub units: u32,
    /// Each counted unit's start (`true`) or end (`false`) inside the day, in any
    /// order. A unit that began before the day has no start here, one that lasts
    /// past it no end.
    pub edges: Vec<(DateTime<Utc>, bool)>,
}

impl DayLoad {
    /// The day's row as the store writes it: `edges` of microseconds since the
    /// day's midnight, times two, plus one for a start. `None` for an entry outside
    /// the day (a row the store could not have written).
    pub fn from_stored(day: i64, units: i32, edges: &[i64]) -> Option<DayLoad> {
        let day_window = utc_day_window(day)?;
        let edges = edges
            .iter()
            .map(|&e| {
                let at = day_window
                    .start()
                    .checked_add_signed(TimeDelta::microseconds(e.checked_div(2)?))?;
                (e >= 0 && at < day_window.end()).then_some((at, e % 2 == 1))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(DayLoad {
            units: u32::try_from(units).ok()?,
            edges,
        })
    }
}

/// What the store keeps of `bookings` (each window once per unit) for
/// [`peaks_of_days`]: each day row they touch, written as migration 20261209000100
/// writes it and read back by [`DayLoad::from_stored`], and apart the windows too
/// long to be kept per day. For tests and benches: the service reads the rows.
pub fn stored_day_loads(
    bookings: &[Window],
) -> (std::collections::BTreeMap<i64, DayLoad>, Vec<Window>) {
    let mut loads = std::collections::BTreeMap::<i64, DayLoad>::new();
    let mut long = Vec::new();
    let micros = |d: TimeDelta| d.num_microseconds().unwrap_or(i64::MAX);
    for b in bookings {
        if !counted_by_day(b) {
            long.push(*b);
            continue;
        }
        let (first, last) = window_days(b);
        for day in first..=last {
            let Some(midnight) = utc_day_window(day).map(|w| w.start()) else {
                continue;
            };
            let mut stored = Vec::new();
            if utc_day(b.start()) == day {
                stored.push(micros(b.start() - midnight) * 2 + 1);
            }
            if utc_day(b.end()) == day {
                stored.push(micros(b.end() - midnight) * 2);
            }
            let load = loads.entry(day).or_default();
            if let Some(row) = DayLoad::from_stored(day, 1, &stored) {
                load.units += row.units;
                load.edges.extend(row.edges);
            }
        }
    }
    (loads, long)
}

/// [`peak_in`] of each UTC day from `first` on, `count` of them, from what the store
/// keeps per day (`loads`, by day; a day without one holds nothing) and the bookings
/// it does not keep per day (`long`, each window once per unit): the same answer as
/// [`peaks_in_each`] over every booking, from one row per day instead of every
/// booking over the days (a year's availability: 365 rows, against 2,000-9,500
/// bookings each on a table page of its own in the history bench).
pub fn peaks_of_days(
    first: i64,
    count: usize,
    loads: &std::collections::BTreeMap<i64, DayLoad>,
    long: &[Window],
) -> Vec<usize> {
    let none = DayLoad::default();
    (first..)
        .take(count)
        .map(|day| {
            let Some(window) = utc_day_window(day) else {
                return 0;
            };
            let load = loads.get(&day).unwrap_or(&none);
            // Units in use at the day's first instant, then +1 at a start and -1 at an
            // end; at one instant ends sort first (half-open windows).
            let starts = load.edges.iter().filter(|(_, start)| *start).count();
            let mut level = i64::from(load.units) - starts as i64;
            let mut events: Vec<(DateTime<Utc>, i64)> = load
                .edges
                .iter()
                .map(|&(at, start)| (at, if start { 1 } else { -1 }))
                .collect();
            for w in long.iter().filter(|w| w.overlaps(&window)) {
                if w.start() <= window.start() {
                    level += 1;
                } else {
                    events.push((w.start(), 1));
                }
                if w.end() < window.end() {
                    events.push((w.end(), -1));
                }
            }
            events.sort_unstable();
            let mut peak = level;
            for (_, delta) in events {
                level += delta;
                peak = peak.max(level);
            }
            usize::try_from(peak).unwrap_or(0)
        })
        .collect()
}

/// `need` slots free over `window` decided from its days (`days`) and the model's
/// bookings over the window that the days do not count (`others`: too long to be
/// kept per day, or made in the same transaction and not written yet), without
/// reading the rest: the lowest slots held on none of the days and by none of
/// `others` over the window, provided the units the days and `others` can hold at
/// once leave `need` free. `None` when that does not decide: the model is nearly
/// full by the days' bound, or its free slots are each held on part of the window's
/// days; then only the bookings over the window tell ([`fits_units`],
/// [`free_slots`]). Whenever this gives slots, those two would accept the booking
/// on the same count and find those slots free.
pub fn free_slots_by_days(
    units: u32,
    days: &DaysHeld,
    others: &[Held],
    window: &Window,
    need: u32,
) -> Option<Vec<i32>> {
    let others_over: Vec<&Held> = others
        .iter()
        .filter(|h| h.window.overlaps(window))
        .collect();
    let others_windows = unit_windows(others_over.iter().map(|h| (h.window, h.units())));
    let bound = days.peak() as usize + peak_in(&others_windows, window);
    if need == 0 || bound + need as usize > units as usize {
        return None;
    }
    let slots: Vec<i32> = (0..units as i32)
        .filter(|slot| {
            days.slots.binary_search(slot).is_err()
                && !others_over.iter().any(|h| h.slots.contains(slot))
        })
        .take(need as usize)
        .collect();
    (slots.len() == need as usize).then_some(slots)
}

/// Assigns slots so that every booking that fits by count gets its units. Bookings
/// that start before `keep_before` keep their slots; the others and the new one
/// (of `need` units) are placed greedily in order of start. Greedy by start is
/// optimal for intervals, however many units each holds: when a booking starts,
/// every slot taken at that instant belongs to a booking that contains the instant,
/// and those hold at most `units - need` slots if it fits by count. That needs every
/// kept booking to start before every placed one, which `keep_before` guarantees.
/// Callers pass a moment just after `now` (only planned bookings move) or, for an
/// admin's booking in the past, its start (slots are bookkeeping, not physical
/// cards, so renumbering is harmless). Bookings keep each slot that is free.
pub fn replan(
    units: u32,
    keep_before: DateTime<Utc>,
    bookings: &[Held],
    new_window: &Window,
    need: u32,
) -> Option<SlotPlan> {
    const NEW: i64 = i64::MIN;
    if new_window.start() < keep_before || need == 0 {
        return None;
    }
    let mut busy_until: Vec<Option<DateTime<Utc>>> = vec![None; units as usize];
    for h in bookings.iter().filter(|h| h.window.start() < keep_before) {
        for slot in &h.slots {
            if let Some(b) = usize::try_from(*slot)
                .ok()
                .and_then(|s| busy_until.get_mut(s))
            {
                let end = h.window.end();
                *b = Some(b.map_or(end, |b| b.max(end)));
            }
        }
    }
    let mut placed: Vec<Held> = bookings
        .iter()
        .filter(|h| h.window.start() >= keep_before)
        .cloned()
        .collect();
    placed.push(Held {
        id: NEW,
        window: *new_window,
        slots: vec![-1; need as usize],
    });
    placed.sort_by_key(|h| (h.window.start(), h.id == NEW, h.id));

    let free_at = |busy: &Option<DateTime<Utc>>, t: DateTime<Utc>| busy.is_none_or(|b| b <= t);
    let mut plan = SlotPlan {
        slots: Vec::new(),
        moves: Vec::new(),
    };
    for h in placed {
        let start = h.window.start();
        // Its own slots that are still free, then the lowest free others.
        let mut slots: Vec<usize> = h
            .slots
            .iter()
            .filter_map(|s| usize::try_from(*s).ok())
            .filter(|s| *s < busy_until.len() && free_at(&busy_until[*s], start))
            .collect();
        for (s, busy) in busy_until.iter().enumerate() {
            if slots.len() >= h.slots.len() {
                break;
            }
            if free_at(busy, start) && !slots.contains(&s) {
                slots.push(s);
            }
        }
        if slots.len() < h.slots.len() {
            return None;
        }
        for s in &slots {
            busy_until[*s] = Some(h.window.end());
        }
        let mut slots: Vec<i32> = slots.into_iter().map(|s| s as i32).collect();
        slots.sort_unstable();
        if h.id == NEW {
            plan.slots = slots;
        } else if slots != h.slots {
            plan.moves.push((h.id, slots));
        }
    }
    Some(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(d: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap() + TimeDelta::days(d)
    }
    fn w(a: i64, b: i64) -> Window {
        Window::new(t(a), t(b)).unwrap()
    }
    fn held(id: i64, a: i64, b: i64, slot: i32) -> Held {
        Held {
            id,
            window: w(a, b),
            slots: vec![slot],
        }
    }

    #[test]
    fn peak_counts_only_simultaneous_bookings() {
        let bookings = [w(0, 2), w(2, 4), w(1, 3)];
        assert_eq!(peak_in(&bookings, &w(0, 4)), 2);
        assert_eq!(peak_in(&bookings, &w(3, 4)), 1);
        assert_eq!(peak_in(&bookings, &w(4, 5)), 0);
        assert!(fits(3, &bookings, &w(0, 4)));
        assert!(!fits(2, &bookings, &w(1, 2)));
    }

    #[test]
    fn peaks_of_days_in_one_sweep() {
        // A booking ending as another starts is not simultaneous with it; one
        // starting before the first day and one ending after the last count.
        let bookings = [w(-2, 1), w(1, 3), w(1, 2), w(2, 6), w(5, 9)];
        let days: Vec<Window> = (0..8).map(|d| w(d, d + 1)).collect();
        assert_eq!(peaks_in_each(&bookings, &days), [1, 2, 2, 1, 1, 2, 1, 1]);
        // Gaps between the windows, and windows out of order, as [`peak_in`] each.
        let spaced = [w(0, 1), w(2, 3), w(7, 8)];
        assert_eq!(peaks_in_each(&bookings, &spaced), [1, 2, 1]);
        let unordered = [w(5, 6), w(0, 4)];
        assert_eq!(peaks_in_each(&bookings, &unordered), [2, 2]);
        assert!(peaks_in_each(&bookings, &[]).is_empty());
    }

    #[test]
    fn peaks_of_days_from_the_stored_days() {
        let day = |d: i64| utc_day(t(d));
        // Starts and ends at midnight, inside days, back to back, and one of 40 days.
        let h = |a: i64, b: i64| hours(a, b);
        let bookings = [
            h(-30, 5),
            h(5, 30),
            h(10, 20),
            h(20, 24),
            h(24, 48),
            h(30, 50),
            h(-24 * 40, 60),
        ];
        let (loads, long) = stored_day_loads(&bookings);
        assert_eq!(long.len(), 1);
        let days: Vec<Window> = (-1..4).map(|d| w(d, d + 1)).collect();
        let peaks = peaks_of_days(day(-1), 5, &loads, &long);
        assert_eq!(peaks, peaks_in_each(&bookings, &days));
        assert_eq!(peaks, [2, 3, 3, 2, 0]);
        // An entry outside its day is not a row the store writes.
        assert_eq!(DayLoad::from_stored(day(0), 1, &[86_400_000_000 * 2]), None);
        assert_eq!(DayLoad::from_stored(day(0), 1, &[-1]), None);
        assert_eq!(DayLoad::from_stored(day(0), -1, &[]), None);
    }

    #[test]
    fn earliest_fit_waits_for_an_end() {
        let bookings = [w(0, 5), w(1, 3)];
        assert_eq!(
            earliest_fit(2, &bookings, t(0), TimeDelta::days(1)),
            Some(t(0))
        );
        assert_eq!(
            earliest_fit(2, &bookings, t(1), TimeDelta::days(1)),
            Some(t(3))
        );
        assert_eq!(
            earliest_fit(1, &bookings, t(0), TimeDelta::days(1)),
            Some(t(5))
        );
        assert_eq!(earliest_fit(0, &bookings, t(0), TimeDelta::days(1)), None);
    }

    #[test]
    fn a_free_slot_is_taken_without_moves() {
        let bookings = [held(1, 10, 22, 0), held(2, 23, 30, 1)];
        assert_eq!(free_slots(2, &bookings, &w(21, 23), 1), Some(vec![1]));
        let plan = replan(2, t(0), &bookings, &w(21, 23), 1).unwrap();
        assert_eq!(
            plan,
            SlotPlan {
                slots: vec![1],
                moves: vec![]
            }
        );
    }

    #[test]
    fn replan_moves_planned_bookings_to_use_gaps() {
        // Slot 0 is busy over [10,20), slot 1 over [30,40) (the booking that
        // shared it was cancelled). [15,35) fits by count but no slot is free
        // over all of it until [30,40) moves to slot 0.
        let bookings = [held(1, 10, 20, 0), held(2, 30, 40, 1)];
        assert_eq!(free_slots(2, &bookings, &w(15, 35), 1), None);
        let plan = replan(2, t(0), &bookings, &w(15, 35), 1).unwrap();
        assert_eq!(
            plan,
            SlotPlan {
                slots: vec![1],
                moves: vec![(2, vec![0])]
            }
        );
    }

    #[test]
    fn started_bookings_keep_their_slot() {
        let now = t(12);
        let bookings = [held(1, 10, 20, 1), held(2, 30, 40, 0)];
        let plan = replan(2, now, &bookings, &w(15, 35), 1).unwrap();
        assert_eq!(plan.slots, vec![0]);
        assert_eq!(plan.moves, vec![(2, vec![1])]);
    }

    #[test]
    fn a_past_window_renumbers_the_bookings_from_its_start() {
        // Ended [0,5) on slot 0, running [6,15) on slot 1; an override [2,8)
        // fits by count only if [6,15) moves to slot 0.
        let bookings = [held(1, 0, 5, 0), held(2, 6, 15, 1)];
        let plan = replan(2, t(2), &bookings, &w(2, 8), 1).unwrap();
        assert_eq!(
            plan,
            SlotPlan {
                slots: vec![1],
                moves: vec![(2, vec![0])]
            }
        );
        assert_eq!(
            replan(2, t(3), &bookings, &w(2, 8), 1),
            None,
            "must start at or after keep_before"
        );
    }

    #[test]
    fn replan_refuses_when_count_is_exceeded() {
        let bookings = [held(1, 10, 20, 0), held(2, 10, 20, 1)];
        assert_eq!(replan(2, t(0), &bookings, &w(15, 16), 1), None);
    }

    fn held_n(id: i64, a: i64, b: i64, slots: &[i32]) -> Held {
        Held {
            id,
            window: w(a, b),
            slots: slots.to_vec(),
        }
    }

    #[test]
    fn units_are_counted_not_bookings() {
        let two = held_n(1, 0, 10, &[0, 1]);
        let one = held_n(2, 5, 15, &[2]);
        let windows = unit_windows([(two.window, two.units()), (one.window, one.units())]);
        assert_eq!(peak_in(&windows, &w(0, 20)), 3);
        assert!(fits_units(4, &windows, &w(5, 6), 1));
        assert!(!fits_units(4, &windows, &w(5, 6), 2));
        assert!(fits_units(4, &windows, &w(10, 12), 3));
        assert_eq!(
            earliest_fit_units(4, &windows, t(0), TimeDelta::days(1), 2),
            Some(t(0))
        );
        assert_eq!(
            earliest_fit_units(4, &windows, t(0), TimeDelta::days(1), 3),
            Some(t(10))
        );
        assert_eq!(
            earliest_fit_units(4, &windows, t(0), TimeDelta::days(1), 4),
            Some(t(15))
        );
        assert_eq!(
            earliest_fit_units(4, &windows, t(0), TimeDelta::days(1), 5),
            None
        );
        assert_eq!(
            free_slots(4, &[two.clone(), one.clone()], &w(5, 6), 1),
            Some(vec![3])
        );
        assert_eq!(free_slots(4, &[two, one], &w(5, 6), 2), None);
    }

    #[test]
    fn a_multi_unit_booking_takes_slots_that_are_not_adjacent() {
        // Slots 0 and 2 are free, 1 and 3 are not: two units fit without moving.
        let bookings = [held_n(1, 0, 10, &[1]), held_n(2, 0, 10, &[3])];
        assert_eq!(free_slots(4, &bookings, &w(2, 4), 2), Some(vec![0, 2]));
        // A started booking [0,10) on slot 1 and a planned one [12,20) on 0 and 2:
        // [5,15) for 2 units fits by count (at most 3 of 4 at once), but only if
        // the planned one moves off slot 0 or 2.
        let now = t(1);
        let bookings = [held_n(1, 0, 10, &[1]), held_n(2, 12, 20, &[0, 2])];
        assert_eq!(free_slots(4, &bookings, &w(5, 15), 2), None);
        let plan = replan(4, now, &bookings, &w(5, 15), 2).unwrap();
        assert_eq!(plan.slots, vec![0, 2]);
        assert_eq!(plan.moves, vec![(2, vec![1, 3])]);
        // 3 units with 1 held throughout: refused by count.
        assert_eq!(replan(4, now, &bookings, &w(5, 15), 4), None);
    }

    /// What the booking store keeps of `bookings` (those of at most 31 days) for the
    /// days `window` touches: per UTC day, the units and slots of the bookings that
    /// touch it.
    fn days_of(bookings: &[Held], window: &Window) -> DaysHeld {
        let mut days = DaysHeld::default();
        let (first, last) = window_days(window);
        for d in first..=last {
            let touching: Vec<&Held> = bookings
                .iter()
                .filter(|h| {
                    let (from, to) = window_days(&h.window);
                    from <= d && d <= to
                })
                .collect();
            let units = touching.iter().map(|h| h.units()).sum();
            let slots: Vec<i32> = touching.iter().flat_map(|h| h.slots.clone()).collect();
            days.add_day(d, units, &slots);
        }
        days
    }

    fn hours(a: i64, b: i64) -> Window {
        Window::new(t(0) + TimeDelta::hours(a), t(0) + TimeDelta::hours(b)).unwrap()
    }

    #[test]
    fn the_days_decide_where_they_leave_slots_free_throughout() {
        // Two units; slot 0 held from 06:00 to 12:00 on day 0.
        let morning = Held {
            id: 1,
            window: hours(6, 12),
            slots: vec![0],
        };
        let days = days_of(std::slice::from_ref(&morning), &hours(13, 20));
        assert_eq!(
            free_slots_by_days(2, &days, &[], &hours(13, 20), 1),
            Some(vec![1])
        );
        // The afternoon of a one-unit model: free, but a day's count says the unit
        // is held at some hour of the day, so the days do not decide.
        assert_eq!(free_slots_by_days(1, &days, &[], &hours(13, 20), 1), None);
        assert_eq!(
            free_slots(1, std::slice::from_ref(&morning), &hours(13, 20), 1),
            Some(vec![0])
        );
        // Slot 0 held on day 0, slot 1 on day 1, each for part of it: one unit in
        // use on each day, but no slot held on neither.
        let evening = Held {
            id: 2,
            window: hours(30, 40),
            slots: vec![1],
        };
        let both = [morning, evening];
        let window = hours(13, 29);
        let days = days_of(&both, &window);
        assert_eq!(days.peak(), 1);
        assert_eq!(free_slots_by_days(2, &days, &[], &window, 1), None);
        assert_eq!(free_slots(2, &both, &window, 1), Some(vec![0]));
        // A booking the days do not count holds its slots over the window.
        let long = Held {
            id: 3,
            window: hours(0, 24 * 40),
            slots: vec![2],
        };
        assert_eq!(
            free_slots_by_days(4, &days, std::slice::from_ref(&long), &window, 1),
            Some(vec![3])
        );
        assert_eq!(free_slots_by_days(4, &days, &[long], &window, 2), None);
        // A model cut to one unit while a booking holds slot 1 for days: slot 0 is
        // free, but the one unit the model has is in use by count.
        let kept = Held {
            id: 4,
            window: hours(0, 90),
            slots: vec![1],
        };
        let window = hours(50, 60);
        let days = days_of(std::slice::from_ref(&kept), &window);
        assert_eq!(free_slots_by_days(1, &days, &[], &window, 1), None);
        assert_eq!(
            free_slots_by_days(1, &DaysHeld::default(), &[kept], &window, 1),
            None
        );
    }

    proptest::proptest! {
        /// The sweep over consecutive windows gives each window's [`peak_in`].
        #[test]
        fn peaks_in_each_is_peak_in_each(
            bookings in proptest::collection::vec((0i64..120, 1i64..50), 0..30),
            first in 0i64..60,
            lengths in proptest::collection::vec((0i64..6, 1i64..30), 0..12),
        ) {
            let bookings: Vec<Window> = bookings.into_iter().map(|(a, len)| hours(a, a + len)).collect();
            let mut windows = Vec::new();
            let mut at = first;
            for (gap, len) in lengths {
                windows.push(hours(at + gap, at + gap + len));
                at += gap + len;
            }
            let each: Vec<usize> = windows.iter().map(|w| peak_in(&bookings, w)).collect();
            proptest::prop_assert_eq!(peaks_in_each(&bookings, &windows), each);
        }
    }

    proptest::proptest! {
        /// A day's busiest instant from what the store keeps per day is the one the
        /// bookings themselves give, whatever their windows: inside a day, across
        /// midnights, back to back, to the microsecond, and too long to be kept per day.
        #[test]
        fn peaks_of_days_are_peaks_in_each(
            // Hours, so that windows often meet end to start; a microsecond off now and then.
            bookings in proptest::collection::vec((0i64..(24 * 8), 1i64..72, 0u32..3, proptest::bool::ANY, 0i64..4), 0..25),
            first in -2i64..8,
            count in 0usize..8,
        ) {
            let hour = |h: i64| t(0) + TimeDelta::hours(h);
            let windows: Vec<Window> = bookings
                .into_iter()
                .flat_map(|(a, len, units, is_long, micros)| {
                    let start = if is_long { hour(a) - TimeDelta::days(35) } else { hour(a) };
                    let off = TimeDelta::microseconds(i64::from(micros == 3));
                    let w = Window::new(start + off, hour(a + len)).unwrap();
                    std::iter::repeat_n(w, units as usize)
                })
                .collect();
            let (loads, long) = stored_day_loads(&windows);
            let days: Vec<Window> = (first..first + count as i64).map(|d| w(d, d + 1)).collect();
            proptest::prop_assert_eq!(
                peaks_of_days(utc_day(t(first)), count, &loads, &long),
                peaks_in_each(&windows, &days)
            );
        }
    }

    proptest::proptest! {
        /// Whatever bookings the model holds, slots that the days give are free
        /// throughout the window, and the booking fits by count: the exact decision
        /// from every booking over the window would accept it too.
        #[test]
        fn slots_from_the_days_are_free_throughout(
            units in 1u32..6,
            // Units the model had when the bookings were made (an admin may take
            // units away since: bookings keep slots the model no longer has).
            earlier in 0u32..3,
            asked in proptest::collection::vec((0i64..96, 1i64..40, 1u32..3, proptest::bool::ANY), 0..14),
            start in 0i64..96,
            length in 1i64..50,
            need in 1u32..4,
        ) {
            // Bookings placed as the store places them: the lowest free slots.
            let mut short: Vec<Held> = Vec::new();
            let mut long: Vec<Held> = Vec::new();
            for (i, (a, len, n, is_long)) in asked.into_iter().enumerate() {
                let window = if is_long { hours(a - 24 * 40, a + len) } else { hours(a, a + len) };
                let all: Vec<Held> = short.iter().chain(&long).cloned().collect();
                if let Some(slots) = free_slots(units + earlier, &all, &window, n) {
                    let h = Held { id: i as i64, window, slots };
                    if is_long { long.push(h) } else { short.push(h) }
                }
            }
            let window = hours(start, start + length);
            let days = days_of(&short, &window);
            // The last booking added as a batch adds one not written yet: the same
            // bound and slots as the store's rows once it is written.
            if let Some((last, before)) = short.split_last() {
                let mut pending = days_of(before, &window);
                pending.add_booking(&window, last);
                proptest::prop_assert_eq!(pending.peak(), days.peak());
                proptest::prop_assert_eq!(&pending.slots, &days.slots);
            }
            if let Some(slots) = free_slots_by_days(units, &days, &long, &window, need) {
                let all: Vec<Held> = short.iter().chain(&long).cloned().collect();
                let windows = unit_windows(all.iter().map(|h| (h.window, h.units())));
                proptest::prop_assert!(fits_units(units, &windows, &window, need));
                proptest::prop_assert_eq!(slots.len(), need as usize);
                for slot in &slots {
                    proptest::prop_assert!(*slot >= 0 && (*slot as u32) < units);
                    proptest::prop_assert!(!all.iter().any(|h| h.slots.contains(slot) && h.window.overlaps(&window)));
                }
            }
            // With nothing held on its days, the days decide as the bookings would.
            if short.iter().chain(&long).all(|h| !h.window.overlaps(&window))
                && days.slots.is_empty()
            {
                proptest::prop_assert_eq!(
                    free_slots_by_days(units, &days, &long, &window, need),
                    free_slots(units, &[], &window, need)
                );
            }
        }
    }
}
