//! A model's availability over a year, day by day (`GET /models/{m}/availability`),
//! from its bookings over the year: one sweep over the bookings
//! (`capacity::peaks_in_each`) against the baseline of a `capacity::peak_in` per day,
//! which walks every booking once per day; and from what the store keeps per day
//! (`capacity::peaks_of_days`: one row per day with where its units begin and end,
//! as the service reads it since migration 20261209000100; the API's part only, the
//! read of the rows is Postgres's). 25 units, each booked about half the
//! time in bookings of 1 to 3 days (about 2,300 over the year, as a model of the
//! history bench holds).
//!
//! `cargo bench -p gpu-booking-core --bench capacity` prints both and their ratio
//! (about 9 s); run as a test (`cargo test --all-targets`) it checks once that all
//! give the same days.

mod common;

use chrono::{DateTime, TimeDelta, Utc};
use gpu_booking_core::capacity::{
    peak_in, peaks_in_each, peaks_of_days, stored_day_loads, utc_day,
};
use gpu_booking_core::window::Window;

const UNITS: usize = 25;

fn start() -> DateTime<Utc> {
    "2026-11-01T00:00:00Z".parse().unwrap()
}

/// Each unit's bookings over `days` from `start()`, one after the other with gaps
/// of 1 to 3 days.
fn bookings(days: i64) -> Vec<Window> {
    let mut next = common::numbers(0x9e37_79b9_7f4a_7c15_u64);
    let until = start() + TimeDelta::days(days);
    let mut all = Vec::new();
    for _unit in 0..UNITS {
        let mut at = start() - TimeDelta::days(2) + TimeDelta::hours(next(48));
        while at < until {
            let len = TimeDelta::days(1) + TimeDelta::hours(next(48));
            all.push(Window::new(at, at + len).unwrap());
            at = at + len + TimeDelta::days(1) + TimeDelta::hours(next(48));
        }
    }
    all
}

fn main() {
    let run_for = common::run_for();
    let booked = bookings(366);
    let days: Vec<Window> = (0..365)
        .map(|d| {
            let day = start() + TimeDelta::days(d);
            Window::new(day, day + TimeDelta::days(1)).unwrap()
        })
        .collect();
    let each: Vec<usize> = days.iter().map(|d| peak_in(&booked, d)).collect();
    assert_eq!(peaks_in_each(&booked, &days), each);
    let (loads, long) = stored_day_loads(&booked);
    let first = utc_day(start());
    assert_eq!(peaks_of_days(first, days.len(), &loads, &long), each);
    let per_day = common::time(run_for, || {
        let peaks: Vec<usize> = days.iter().map(|d| peak_in(&booked, d)).collect();
        assert_eq!(peaks.len(), days.len());
    });
    let sweep = common::time(run_for, || {
        assert_eq!(peaks_in_each(&booked, &days).len(), days.len());
    });
    let from_days = common::time(run_for, || {
        assert_eq!(
            peaks_of_days(first, days.len(), &loads, &long).len(),
            days.len()
        );
    });
    println!(
        "a year of days over {} bookings: a peak_in per day {per_day:>9.1?}, one sweep {sweep:>9.1?}, from {} day rows {from_days:>9.1?}; sweep / per day {:.3}, day rows / per day {:.3}",
        booked.len(),
        loads.len(),
        sweep.as_secs_f64() / per_day.as_secs_f64(),
        from_days.as_secs_f64() / per_day.as_secs_f64()
    );
}
