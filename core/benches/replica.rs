//! The webhook replica's answer for an unbooked user (the earliest start on every
//! model, for the "you can book from ..." of a stripped pod) with a year of planned
//! bookings in it, against the same answer with two weeks of them: the ratio says
//! whether the answer reads more as the bookings ahead grow. Also: a prune one
//! second after the last (the refresher prunes at every refresh), the same way.
//!
//! `cargo bench -p gpu-booking-core --bench replica` prints the figures (about 15 s);
//! run as a test (`cargo test --all-targets`) it answers once per size.

use std::collections::BTreeMap;
mod common;

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use gpu_booking_core::admission::replica::{
    AdmissionState, BookingState, ModelState, PolicyState, Query, Replica,
};
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::gpu_model::ModelName;
use gpu_booking_core::username::NameCase;

const MODELS: usize = 40;
const UNITS: u32 = 25;

fn now() -> DateTime<Utc> {
    "2026-11-01T00:00:00Z".parse().unwrap()
}

/// A replica whose models' units are each booked about half the time, in 1-3 day
/// bookings with 1-3 day gaps, from a week ago for `days`; one user a booking.
fn replica(days: i64) -> (Replica, usize) {
    let mut next = common::numbers(0x2545_f491_4f6c_dd1d_u64);
    let models: Vec<ModelState> = (0..MODELS)
        .map(|m| ModelState {
            name: ModelName::parse(&format!("model{m}")).unwrap(),
            units: UNITS,
            free: 0,
            gpumem_mib: 40960,
            gpumem_advertised_mib: Some(81408),
            usage_reported_at: Some(now()),
        })
        .collect();
    let until = now() + TimeDelta::days(days);
    let mut bookings = Vec::new();
    for m in 0..MODELS {
        for _unit in 0..UNITS {
            let mut at = now() - TimeDelta::days(7) + TimeDelta::hours(next(48));
            while at < until {
                let len = TimeDelta::days(1 + next(3));
                let id = bookings.len() as i64 + 1;
                bookings.push(BookingState {
                    id,
                    user: format!("user{id}"),
                    model: format!("model{m}"),
                    units: 1,
                    start: at,
                    end: at + len,
                });
                at = at + len + TimeDelta::days(1 + next(3));
            }
        }
    }
    let count = bookings.len();
    let state = AdmissionState {
        at: now(),
        names: NameCase::Lowercase,
        policy: PolicyState::from(&Policy::default()),
        models,
        held: BTreeMap::new(),
        offers: Vec::new(),
        groups: Vec::new(),
        position: Some(1),
        bookings: Some(bookings),
        users: Some(Vec::new()),
    };
    (Replica::from_state(state).unwrap(), count)
}

fn main() {
    let run_for = common::run_for();
    let mut answers = Vec::new();
    let mut prunes = Vec::new();
    for (days, label) in [(14, "two weeks"), (365, "a year")] {
        let (mut r, count) = replica(days);
        let answer = common::time(run_for, || {
            let a = r.answer(Query::User("nobody"), now()).unwrap();
            assert_eq!(a.schedulability.earliest_booking_by_model.len(), MODELS);
        });
        r.prune(now());
        let mut at = now();
        let prune = common::time(run_for, || {
            at += TimeDelta::seconds(1);
            r.prune(at);
        });
        println!(
            "{label:>9} ahead: {count:>6} bookings; unbooked answer {answer:>9.1?}; prune 1 s after the last {prune:>8.1?}"
        );
        answers.push(answer);
        prunes.push(prune);
    }
    let ratio = |v: &[Duration]| v[1].as_secs_f64() / v[0].as_secs_f64();
    println!(
        "a year / two weeks: unbooked answer {:.2} x, prune {:.2} x",
        ratio(&answers),
        ratio(&prunes)
    );
}
