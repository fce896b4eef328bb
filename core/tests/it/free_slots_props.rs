//! `capacity::free_slots` against its definition: the lowest `need` slots below
//! `units` that no booking overlapping the window holds, ascending; `None` when
//! fewer are free or none is asked for. The function sorts the held slots once
//! instead of asking every booking about every slot, so its answer is checked here
//! against the question asked the slow way.

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use gpu_booking_core::capacity::{free_slots, Held};
use gpu_booking_core::window::Window;
use proptest::prelude::*;

fn t(hours: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap() + TimeDelta::hours(hours)
}

fn window(start: i64, hours: i64) -> Window {
    Window::new(t(start), t(start + hours)).unwrap()
}

fn by_definition(units: u32, bookings: &[Held], w: &Window, need: u32) -> Option<Vec<i32>> {
    let free: Vec<i32> = (0..units as i32)
        .filter(|s| {
            !bookings
                .iter()
                .any(|h| h.window.overlaps(w) && h.slots.contains(s))
        })
        .take(need as usize)
        .collect();
    (need > 0 && free.len() == need as usize).then_some(free)
}

fn booking() -> impl Strategy<Value = (i64, i64, Vec<i32>)> {
    (
        0i64..48,
        1i64..24,
        prop::collection::btree_set(0i32..14, 1..4),
    )
        .prop_map(|(start, hours, slots)| (start, hours, slots.into_iter().collect()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn free_slots_are_the_lowest_that_nothing_overlapping_holds(
        units in 0u32..12,
        raw in prop::collection::vec(booking(), 0..10),
        (start, hours) in (0i64..48, 1i64..24),
        need in 0u32..6,
    ) {
        let bookings: Vec<Held> = raw
            .into_iter()
            .enumerate()
            .map(|(i, (s, h, slots))| Held { id: i as i64, window: window(s, h), slots })
            .collect();
        let w = window(start, hours);
        prop_assert_eq!(free_slots(units, &bookings, &w, need), by_definition(units, &bookings, &w, need));
    }
}
