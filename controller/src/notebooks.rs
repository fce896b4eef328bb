//! Every user's running notebooks, as the controller reports them with the units
//! held: the pods it keeps, read for core's decision ([`gpu_booking_core::notebooks`]).

use std::collections::HashMap;

use gpu_booking_client::Notebook;
use gpu_booking_core::notebooks::{self, PodFacts};

use crate::pods::PodInfo;

/// The notebooks among `pods` (keyed by uid), sorted by namespace and pod.
pub fn of(pods: &HashMap<String, PodInfo>) -> Vec<Notebook> {
    notebooks::notebooks(pods.values().map(facts))
}

fn facts(p: &PodInfo) -> PodFacts<'_> {
    PodFacts {
        namespace: &p.namespace,
        name: &p.name,
        user: p.user.as_deref(),
        standing: p.priority,
        gpus: p.gpu.as_ref().map(|g| g.units),
        // The model its resource names, else the one the webhook admitted it on.
        model: p
            .gpu
            .as_ref()
            .and_then(|g| g.model.as_deref())
            .or(p.model_label.as_deref()),
        booking_id: p.booking_id,
        gpu_removed: p.gpu_removed.as_deref(),
        // Core believes it on a booked pod only.
        terminate_at: p.terminate_at,
        preempt_at: p.preempt_at,
        last_activity: p.last_activity,
        started: p.started,
        live: !p.finished && !p.deleting,
        served: p.served,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::PodLite;
    use gpu_booking_client::{NextStep, NotebookStanding};
    use gpu_booking_core::admission::AdmissionConfig;
    use serde_json::{json, Value};

    fn info(
        name: &str,
        labels: Value,
        annotations: Value,
        class: Option<&str>,
        gpu: bool,
    ) -> PodInfo {
        let resources = if gpu {
            json!({"limits": {"nvidia.com/gpu": "1"}})
        } else {
            json!({})
        };
        let lite: PodLite = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "jhub", "uid": name,
                "creationTimestamp": "2026-11-30T09:00:00Z",
                "labels": labels, "annotations": annotations},
            "spec": {"nodeName": "n1", "priorityClassName": class, "priority": class.map(|_| 1000),
                "containers": [{"resources": resources}]},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        PodInfo::from_pod(&lite, &AdmissionConfig::default()).unwrap()
    }

    #[test]
    fn reports_booked_lent_and_stripped_notebooks_from_our_marks() {
        let pods: HashMap<String, PodInfo> = [
            info(
                "jupyter-alice",
                json!({"gpu-booking.io/priority": "high", "gpu-booking.io/booking": "7",
                    "gpu-booking.io/model": "a100"}),
                json!({"hub.jupyter.org/username": "alice", "terminate-at": "2026-12-01T10:00:00Z",
                    "gpu-booking.io/last-gpu-activity": "2026-11-30T10:00:00Z"}),
                Some("gpu-booking-high"),
                true,
            ),
            info(
                "jupyter-bob",
                json!({"gpu-booking.io/priority": "low", "gpu-booking.io/model": "a100"}),
                json!({"hub.jupyter.org/username": "bob",
                    "gpu-booking.io/preempt-at": "2026-11-30T10:32:00Z"}),
                Some("gpu-booking-low"),
                true,
            ),
            info(
                "jupyter-carol",
                json!({}),
                json!({"hub.jupyter.org/username": "carol",
                    "gpu-booking.io/gpu-removed": "no free a100 GPU and no active booking"}),
                None,
                false,
            ),
            // A CPU pod without the note, and a GPU pod of another workload.
            info(
                "plain",
                json!({}),
                json!({"hub.jupyter.org/username": "dan"}),
                None,
                false,
            ),
            info(
                "job",
                json!({}),
                json!({"hub.jupyter.org/username": "erin"}),
                None,
                true,
            ),
        ]
        .into_iter()
        .map(|p| (p.uid.clone(), p))
        .collect();
        let got = of(&pods);
        let names: Vec<(&str, &str, NotebookStanding)> = got
            .iter()
            .map(|n| (n.user.as_str(), n.pod.as_str(), n.standing))
            .collect();
        assert_eq!(
            names,
            vec![
                ("alice", "jupyter-alice", NotebookStanding::Booked),
                ("bob", "jupyter-bob", NotebookStanding::Lent),
                ("carol", "jupyter-carol", NotebookStanding::Stripped),
            ]
        );
        let (alice, bob, carol) = (&got[0], &got[1], &got[2]);
        assert_eq!(alice.model.as_deref(), Some("a100"));
        assert_eq!(alice.ends_at, "2026-12-01T10:00:00Z".parse().ok());
        assert_eq!(alice.last_activity, "2026-11-30T10:00:00Z".parse().ok());
        assert_eq!(bob.taken_back_at, "2026-11-30T10:32:00Z".parse().ok());
        assert_eq!(carol.why, "on CPU: no free a100 GPU and no active booking");
        assert_eq!(carol.next, vec![NextStep::Book]);
    }

    #[test]
    fn a_forged_high_label_reads_as_lent_and_its_end_is_not_shown() {
        let forged = info(
            "jupyter-mallory",
            json!({"gpu-booking.io/priority": "high", "gpu-booking.io/booking": "7",
                "gpu-booking.io/model": "a100"}),
            json!({"hub.jupyter.org/username": "mallory", "terminate-at": "2030-01-01T00:00:00Z"}),
            None,
            true,
        );
        let got = of(&HashMap::from([(forged.uid.clone(), forged)]));
        assert_eq!(got[0].standing, NotebookStanding::Lent);
        assert_eq!((got[0].ends_at, got[0].booking_id), (None, None));
    }
}
