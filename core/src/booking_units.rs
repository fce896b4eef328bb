//! A booking covers its units and no more, at run time: how many
//! GPUs each booking's high-priority pods hold, and which of them go past the
//! booking's units. The webhook decides each new pod from the count
//! ([`crate::admission::BeyondBooking`]); the controller reports the count and
//! demotes what goes past, from the cluster's state, so that two pods admitted
//! before the count caught up do not both keep high priority.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

/// A live (not finished, not being deleted) high-priority GPU pod of a booking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BookedPod<K> {
    pub key: K,
    pub booking_id: i64,
    /// The booking's units, as the webhook wrote them on the pod; `None` (a pod
    /// admitted before bookings had units): not limited.
    pub booking_units: Option<u64>,
    /// GPU units the pod holds (or will, once scheduled).
    pub units: u64,
    /// When it was created: the newest go first.
    pub created: Option<DateTime<Utc>>,
}

/// The units each booking's pods hold (every pod counts, including those beyond
/// the booking's units, until they are demoted).
pub fn held_by_booking<K>(pods: &[BookedPod<K>]) -> BTreeMap<i64, u64> {
    let mut held = BTreeMap::new();
    for p in pods {
        let n: &mut u64 = held.entry(p.booking_id).or_default();
        *n = n.saturating_add(p.units);
    }
    held
}

/// The pods to demote so that each booking's pods hold at most its units: the
/// newest first (ties: the greater key), until the rest fit. Returned newest first.
pub fn beyond_units<K: Ord + Clone>(pods: &[BookedPod<K>]) -> Vec<K> {
    let mut by_booking: BTreeMap<i64, Vec<&BookedPod<K>>> = BTreeMap::new();
    for p in pods {
        by_booking.entry(p.booking_id).or_default().push(p);
    }
    let mut demote = Vec::new();
    for (_, mut list) in by_booking {
        // A booking's pods agree on its units; the smallest stated one is the safe
        // reading if a forged or stale annotation disagrees.
        let Some(units) = list.iter().filter_map(|p| p.booking_units).min() else {
            continue;
        };
        let mut held: u64 = list.iter().map(|p| p.units).fold(0, u64::saturating_add);
        // Newest first: creation time, then key, both descending (no time: newest).
        list.sort_by(|a, b| {
            (b.created.is_none(), b.created, &b.key).cmp(&(a.created.is_none(), a.created, &a.key))
        });
        for p in list {
            if held <= units {
                break;
            }
            held = held.saturating_sub(p.units);
            demote.push(p.key.clone());
        }
    }
    demote
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(
        key: &str,
        booking: i64,
        booked: Option<u64>,
        units: u64,
        minute: i64,
    ) -> BookedPod<String> {
        BookedPod {
            key: key.to_owned(),
            booking_id: booking,
            booking_units: booked,
            units,
            created: Some(
                "2026-11-01T00:00:00Z".parse::<DateTime<Utc>>().unwrap()
                    + chrono::TimeDelta::minutes(minute),
            ),
        }
    }

    #[test]
    fn within_units_nothing_is_demoted() {
        let pods = [pod("a", 1, Some(2), 1, 0), pod("b", 1, Some(2), 1, 1)];
        assert!(beyond_units(&pods).is_empty());
        assert_eq!(held_by_booking(&pods), BTreeMap::from([(1, 2)]));
    }

    #[test]
    fn the_newest_go_until_the_rest_fit() {
        // A 2-unit booking with pods of 1, 1 and 1 unit: the newest goes.
        let pods = [
            pod("old", 1, Some(2), 1, 0),
            pod("new", 1, Some(2), 1, 5),
            pod("mid", 1, Some(2), 1, 2),
        ];
        assert_eq!(beyond_units(&pods), vec!["new".to_owned()]);
        // Newest first, until within units: 1 + 2 + 1 on 2 units leaves only the oldest.
        let pods = [
            pod("a", 1, Some(2), 1, 0),
            pod("b", 1, Some(2), 2, 1),
            pod("c", 1, Some(2), 1, 2),
        ];
        assert_eq!(beyond_units(&pods), vec!["c".to_owned(), "b".to_owned()]);
        // One pod alone beyond its booking (4 GPUs on a 1-unit booking) goes too.
        let pods = [pod("big", 2, Some(1), 4, 0)];
        assert_eq!(beyond_units(&pods), vec!["big".to_owned()]);
        assert_eq!(held_by_booking(&pods), BTreeMap::from([(2, 4)]));
    }

    #[test]
    fn bookings_are_counted_apart_and_unknown_units_are_not_limited() {
        let pods = [
            pod("a", 1, Some(1), 1, 0),
            pod("b", 2, Some(1), 1, 1),
            pod("c", 3, None, 1, 0),
            pod("d", 3, None, 1, 1),
        ];
        assert!(beyond_units(&pods).is_empty());
        // Same creation time: the greater key is the newer.
        let pods = [pod("x", 1, Some(1), 1, 0), pod("y", 1, Some(1), 1, 0)];
        assert_eq!(beyond_units(&pods), vec!["y".to_owned()]);
        // A disagreeing annotation: the smaller count holds.
        let pods = [pod("x", 1, Some(1), 1, 0), pod("y", 1, Some(4), 1, 1)];
        assert_eq!(beyond_units(&pods), vec!["y".to_owned()]);
    }
}
