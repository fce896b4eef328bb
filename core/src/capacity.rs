//! Capacity by count, and the concrete unit (slot) each booking holds.
//!
//! A booking fits if, at every instant of its window, the model's bookings stay
//! within its units. Each booking also holds a slot so that the database's
//! exclusion constraint (model, slot, period) can forbid overbooking on its own.
//! Cancellations leave gaps that a fixed first-come slot choice cannot always use,
//! so planned bookings may change slot when a new booking needs it.

use chrono::{DateTime, TimeDelta, Utc};

use crate::window::Window;

/// A booking of the model as the slot planner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub id: i64,
    pub window: Window,
    pub slot: i32,
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

/// Whether one more booking over `window` keeps the model within `units`.
pub fn fits(units: u32, bookings: &[Window], window: &Window) -> bool {
    peak_in(bookings, window) < units as usize
}

/// The earliest start at or after `from` where a booking of `duration` fits.
/// Free capacity only ever appears when a booking ends, so the candidates are
/// `from` and the ends after it. `None` when the model has no units.
pub fn earliest_fit(
    units: u32,
    bookings: &[Window],
    from: DateTime<Utc>,
    duration: TimeDelta,
) -> Option<DateTime<Utc>> {
    if units == 0 || duration <= TimeDelta::zero() {
        return None;
    }
    let mut candidates: Vec<DateTime<Utc>> = std::iter::once(from)
        .chain(bookings.iter().map(|b| b.end()).filter(|&e| e > from))
        .collect();
    candidates.sort_unstable();
    candidates.dedup();
    candidates.into_iter().find(|&start| {
        Window::new(start, start + duration)
            .map(|w| fits(units, bookings, &w))
            .unwrap_or(false)
    })
}

/// Free units of the model over `window` (the worst instant counts).
pub fn free_in(units: u32, bookings: &[Window], window: &Window) -> u32 {
    (units as usize).saturating_sub(peak_in(bookings, window)) as u32
}

/// Where a new booking goes: its slot, and the planned bookings that must move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotPlan {
    pub slot: i32,
    pub moves: Vec<(i64, i32)>,
}

/// A slot free over `window` among `overlapping` (the model's bookings that
/// overlap it), without moving anything: the common, cheap case.
pub fn free_slot(units: u32, overlapping: &[Held], window: &Window) -> Option<i32> {
    (0..units as i32).find(|slot| {
        !overlapping
            .iter()
            .any(|h| h.slot == *slot && h.window.overlaps(window))
    })
}

/// Assigns slots so that every booking that fits by count gets one. Bookings that
/// start before `keep_before` keep their slot; the others and the new one are
/// placed greedily in order of start. Greedy by start is optimal for intervals:
/// when a booking starts, every slot taken at that instant belongs to a booking
/// that contains the instant, and there are fewer of those than units if it fits
/// by count. That needs every kept booking to start before every placed one,
/// which `keep_before` guarantees. Callers pass a moment just after `now` (only
/// planned bookings move) or, for an admin's booking in the past, its start
/// (slots are bookkeeping, not physical cards, so renumbering is harmless).
/// Bookings keep their slot when it is free.
pub fn replan(
    units: u32,
    keep_before: DateTime<Utc>,
    bookings: &[Held],
    new_window: &Window,
) -> Option<SlotPlan> {
    const NEW: i64 = i64::MIN;
    if new_window.start() < keep_before {
        return None;
    }
    let mut busy_until: Vec<Option<DateTime<Utc>>> = vec![None; units as usize];
    for h in bookings.iter().filter(|h| h.window.start() < keep_before) {
        if let Some(b) = usize::try_from(h.slot)
            .ok()
            .and_then(|s| busy_until.get_mut(s))
        {
            let end = h.window.end();
            *b = Some(b.map_or(end, |b| b.max(end)));
        }
    }
    let mut placed: Vec<Held> = bookings
        .iter()
        .filter(|h| h.window.start() >= keep_before)
        .copied()
        .collect();
    placed.push(Held {
        id: NEW,
        window: *new_window,
        slot: -1,
    });
    placed.sort_by_key(|h| (h.window.start(), h.id == NEW, h.id));

    let free_at = |busy: &Option<DateTime<Utc>>, t: DateTime<Utc>| busy.is_none_or(|b| b <= t);
    let mut plan = SlotPlan {
        slot: -1,
        moves: Vec::new(),
    };
    for h in placed {
        let start = h.window.start();
        let keep = usize::try_from(h.slot)
            .ok()
            .filter(|s| *s < busy_until.len() && free_at(&busy_until[*s], start));
        let slot = keep.or_else(|| busy_until.iter().position(|b| free_at(b, start)))?;
        busy_until[slot] = Some(h.window.end());
        let slot = slot as i32;
        if h.id == NEW {
            plan.slot = slot;
        } else if slot != h.slot {
            plan.moves.push((h.id, slot));
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
            slot,
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
        assert_eq!(free_slot(2, &bookings, &w(21, 23)), Some(1));
        let plan = replan(2, t(0), &bookings, &w(21, 23)).unwrap();
        assert_eq!(
            plan,
            SlotPlan {
                slot: 1,
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
        assert_eq!(free_slot(2, &bookings, &w(15, 35)), None);
        let plan = replan(2, t(0), &bookings, &w(15, 35)).unwrap();
        assert_eq!(
            plan,
            SlotPlan {
                slot: 1,
                moves: vec![(2, 0)]
            }
        );
    }

    #[test]
    fn started_bookings_keep_their_slot() {
        let now = t(12);
        let bookings = [held(1, 10, 20, 1), held(2, 30, 40, 0)];
        let plan = replan(2, now, &bookings, &w(15, 35)).unwrap();
        assert_eq!(plan.slot, 0);
        assert_eq!(plan.moves, vec![(2, 1)]);
    }

    #[test]
    fn a_past_window_renumbers_the_bookings_from_its_start() {
        // Ended [0,5) on slot 0, running [6,15) on slot 1; an override [2,8)
        // fits by count only if [6,15) moves to slot 0.
        let bookings = [held(1, 0, 5, 0), held(2, 6, 15, 1)];
        let plan = replan(2, t(2), &bookings, &w(2, 8)).unwrap();
        assert_eq!(
            plan,
            SlotPlan {
                slot: 1,
                moves: vec![(2, 0)]
            }
        );
        assert_eq!(
            replan(2, t(3), &bookings, &w(2, 8)),
            None,
            "must start at or after keep_before"
        );
    }

    #[test]
    fn replan_refuses_when_count_is_exceeded() {
        let bookings = [held(1, 10, 20, 0), held(2, 10, 20, 1)];
        assert_eq!(replan(2, t(0), &bookings, &w(15, 16)), None);
    }
}
