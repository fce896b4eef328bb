//! A booking covers its units and no more, at run time (issue 12 item 3): the
//! controller's view of each booking's high-priority pods, for `core`'s rule
//! ([`gpu_booking_core::booking_units`]): what it reports to the booking service
//! (the webhook's count) and which pods it demotes.

use std::collections::HashMap;

use gpu_booking_core::booking_units::BookedPod;

use crate::pods::{PodInfo, Priority};

/// Every live high-priority GPU pod of a booking, keyed by uid. A Pending one counts:
/// it holds its units as soon as it is scheduled.
pub fn booked_pods(pods: &HashMap<String, PodInfo>) -> Vec<BookedPod<String>> {
    pods.values()
        .filter(|p| p.priority == Some(Priority::High) && !p.finished && !p.deleting)
        .filter_map(|p| {
            Some(BookedPod {
                key: p.uid.clone(),
                booking_id: p.booking_id?,
                booking_units: p.booking_units,
                units: p.gpu.as_ref()?.units,
                created: p.started,
            })
        })
        .collect()
}
