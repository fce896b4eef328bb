//! A booking covers its units and no more, at run time: the
//! controller's view of each booking's high-priority pods, for `core`'s rule
//! ([`gpu_booking_core::booking_units`]): what it reports to the booking service
//! (the webhook's count) and which pods it demotes.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};

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

/// The last GPU activity of each booking's live high-priority GPU pods (the latest
/// of the node agent's last-activity annotations), for the usage report.
pub fn last_active_by_booking(pods: &HashMap<String, PodInfo>) -> BTreeMap<i64, DateTime<Utc>> {
    let mut out: BTreeMap<i64, DateTime<Utc>> = BTreeMap::new();
    for p in pods.values() {
        if p.priority != Some(Priority::High) || p.finished || p.deleting || p.gpu.is_none() {
            continue;
        }
        let (Some(id), Some(at)) = (p.booking_id, p.last_activity) else {
            continue;
        };
        let e = out.entry(id).or_insert(at);
        *e = (*e).max(at);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::PodLite;
    use gpu_booking_core::admission::AdmissionConfig;
    use serde_json::json;

    fn pod(uid: &str, priority: &str, booking: &str, active: Option<&str>) -> PodInfo {
        let mut annotations = json!({"hub.jupyter.org/username": "alice"});
        if let Some(at) = active {
            annotations["gpu-booking.io/last-gpu-activity"] = json!(at);
        }
        let lite: PodLite = serde_json::from_value(json!({
            "metadata": {"name": uid, "namespace": "jhub", "uid": uid,
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {"gpu-booking.io/priority": priority, "gpu-booking.io/booking": booking},
                "annotations": annotations},
            "spec": {"priorityClassName": format!("gpu-booking-{priority}"), "priority": 1000,
                "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        PodInfo::from_pod(&lite, &AdmissionConfig::default()).unwrap()
    }

    #[test]
    fn last_activity_per_booking_is_its_pods_newest() {
        let pods: HashMap<String, PodInfo> = [
            pod("a", "high", "7", Some("2026-01-01T05:00:00Z")),
            pod("b", "high", "7", Some("2026-01-01T06:00:00Z")),
            pod("c", "high", "8", None),
            // A lent pod's activity is not its user's booking's.
            pod("d", "low", "9", Some("2026-01-01T07:00:00Z")),
        ]
        .into_iter()
        .map(|p| (p.uid.clone(), p))
        .collect();
        let got = last_active_by_booking(&pods);
        assert_eq!(
            got,
            BTreeMap::from([(7, "2026-01-01T06:00:00Z".parse::<DateTime<Utc>>().unwrap())])
        );
    }
}
