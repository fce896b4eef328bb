//! A batch of booking creates decided as if they were made one after the other.
//!
//! Creates that arrive together are written in one transaction: the store takes the
//! locks of all of them and reads, for each, what its decision needs ([`Found`]);
//! [`judge`] decides each from that alone, and [`accept`] counts an accepted create
//! in what every later create of the batch found, as the store will hold it once
//! written. So a create is answered the same whether it came in a batch or alone
//! after the ones before it (`booking-api/tests/it/create_batch.rs` compares the
//! two on random batches). The store only reads and writes.

use chrono::{DateTime, Utc};

use crate::booking_policy::Policy;
use crate::capacity::{self, DaysHeld, Held};
use crate::rules::{self, Refusal};
use crate::window::Window;

/// One create of a batch, checked before any lock.
#[derive(Debug, Clone)]
pub struct Create<'a> {
    pub user: &'a str,
    pub model: &'a str,
    /// When it arrived: the rules' "now".
    pub now: DateTime<Utc>,
    pub window: Window,
    /// Units it asks for.
    pub need: u32,
    /// An admin's override of the rules (not of overlap and capacity).
    pub override_rules: bool,
}

/// What a create's locked reads found: the model's units (`None`: no such model),
/// the user's bookings, and what the model holds over the window.
#[derive(Debug, Clone, Default)]
pub struct Found {
    pub units: Option<u32>,
    pub own: Vec<Window>,
    /// What the window's days hold (per day, and the batch's earlier creates kept per
    /// day), for a window kept per day; `None` when the bookings over the window were
    /// read instead. A day without a row holds nothing.
    pub days: Option<DaysHeld>,
    /// Bookings of the model over the window, from the database: with `days`, only
    /// those too long to be kept per day; without, all of them.
    pub held: Vec<Held>,
    /// The creates of the batch before this one that were accepted, over its window
    /// (not written yet; with `days`, those kept per day are counted there too).
    pub made: Vec<Held>,
}

impl Found {
    /// Nothing read yet for a create over `window`: its days are read for a window
    /// kept per day, by the rule the store's read follows too.
    pub fn for_window(window: &Window) -> Self {
        Found {
            days: capacity::counted_by_day(window).then(DaysHeld::default),
            ..Found::default()
        }
    }
}

/// The decision on one create from what its locks read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judged {
    /// Created on these units.
    Slots(Vec<i32>),
    /// It fits by count, but only if planned bookings move to other units.
    NeedsMoves,
    /// It does not fit: refused, with the earliest start that would (which the
    /// store reads).
    Full,
    /// The window's days do not decide: the bookings over the window must be read.
    ReadBookings,
    /// The model does not exist.
    UnknownModel,
}

/// Decides `create` from `found`: the user's rules, then capacity, by the days
/// where they decide and by the bookings over the window otherwise.
pub fn judge(policy: &Policy, create: &Create<'_>, found: &Found) -> Result<Judged, Refusal> {
    let Some(units) = found.units else {
        return Ok(Judged::UnknownModel);
    };
    rules::check_user(
        policy,
        create.now,
        &create.window,
        &found.own,
        create.override_rules,
    )?;
    if let Some(days) = &found.days {
        // The batch's earlier creates kept per day are in `days` already.
        let others: Vec<Held> = found
            .held
            .iter()
            .chain(
                found
                    .made
                    .iter()
                    .filter(|h| !capacity::counted_by_day(&h.window)),
            )
            .cloned()
            .collect();
        return Ok(
            match capacity::free_slots_by_days(units, days, &others, &create.window, create.need) {
                Some(slots) => Judged::Slots(slots),
                None => Judged::ReadBookings,
            },
        );
    }
    let others: Vec<Held> = found.held.iter().chain(&found.made).cloned().collect();
    let overlapping = capacity::unit_windows(others.iter().map(|h| (h.window, h.units())));
    if !capacity::fits_units(units, &overlapping, &create.window, create.need) {
        return Ok(Judged::Full);
    }
    Ok(
        match capacity::free_slots(units, &others, &create.window, create.need) {
            Some(slots) => Judged::Slots(slots),
            None => Judged::NeedsMoves,
        },
    )
}

/// Counts create `i` of `batch`, accepted as `booking` (its window as the database
/// will keep it), in what each later create found: the user's own bookings, and
/// the model's days and bookings over the later create's window.
pub fn accept(batch: &[Create<'_>], found: &mut [Found], i: usize, booking: &Held) {
    let Some(create) = batch.get(i) else {
        return;
    };
    for (later, f) in batch.iter().zip(found.iter_mut()).skip(i + 1) {
        if later.user == create.user {
            f.own.push(booking.window);
        }
        if later.model == create.model {
            if let Some(days) = f
                .days
                .as_mut()
                .filter(|_| capacity::counted_by_day(&booking.window))
            {
                days.add_booking(&later.window, booking);
            }
            if later.window.overlaps(&booking.window) {
                f.made.push(booking.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeDelta, TimeZone};

    fn t(hours: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2030, 1, 7, 0, 0, 0).unwrap() + TimeDelta::hours(hours)
    }

    fn create<'a>(user: &'a str, from: i64, to: i64) -> Create<'a> {
        Create {
            user,
            model: "a100",
            now: t(0),
            window: Window::new(t(from), t(to)).unwrap(),
            need: 1,
            override_rules: true,
        }
    }

    fn read(units: u32, c: &Create<'_>) -> Found {
        Found {
            units: Some(units),
            ..Found::for_window(&c.window)
        }
    }

    #[test]
    fn an_unknown_model_and_a_broken_rule_are_refused_before_capacity() {
        let policy = Policy::default();
        let c = create("ada", 1, 25);
        assert_eq!(
            judge(&policy, &c, &Found::default()),
            Ok(Judged::UnknownModel)
        );
        let mut found = read(1, &c);
        found.own.push(Window::new(t(2), t(3)).unwrap());
        assert!(
            judge(&policy, &c, &found).is_err(),
            "her own overlapping booking"
        );
    }

    #[test]
    fn later_creates_count_the_accepted_ones() {
        let policy = Policy::default();
        let batch = [
            create("ada", 30, 54),
            create("ben", 30, 54),
            create("cai", 30, 54),
        ];
        let mut found: Vec<Found> = batch.iter().map(|c| read(2, c)).collect();
        let mut verdicts = Vec::new();
        for i in 0..batch.len() {
            let mut judged = judge(&policy, &batch[i], &found[i]);
            if judged == Ok(Judged::ReadBookings) {
                // As the store does: the bookings over the window decide.
                found[i].days = None;
                judged = judge(&policy, &batch[i], &found[i]);
            }
            if let Ok(Judged::Slots(slots)) = &judged {
                let booking = Held {
                    id: -1 - i as i64,
                    window: batch[i].window,
                    slots: slots.clone(),
                };
                accept(&batch, &mut found, i, &booking);
            }
            verdicts.push(judged);
        }
        assert_eq!(
            verdicts,
            [
                Ok(Judged::Slots(vec![0])),
                Ok(Judged::Slots(vec![1])),
                Ok(Judged::Full)
            ],
            "two units: the third create of the same window is full"
        );
        assert_eq!(
            found[2].made.len(),
            2,
            "both earlier creates count for the third"
        );
    }

    #[test]
    fn a_users_accepted_create_is_hers_in_her_later_ones() {
        let batch = [create("ada", 30, 54), create("ada", 100, 124)];
        let mut found: Vec<Found> = batch.iter().map(|c| read(2, c)).collect();
        let booking = Held {
            id: -1,
            window: batch[0].window,
            slots: vec![0],
        };
        accept(&batch, &mut found, 0, &booking);
        assert_eq!(found[1].own, vec![batch[0].window]);
        assert!(found[1].made.is_empty(), "not over the later window");
    }
}
