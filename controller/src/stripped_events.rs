//! A Warning Event on each notebook that runs without the GPU it asked for, saying
//! why: JupyterHub's KubeSpawner shows a pod's Events in the hub's spawn progress,
//! and nothing else of the webhook's reaches the user there. The webhook's admission
//! warning travels as the create's `Warning` response header, which KubeSpawner's
//! client does not read, and the webhook cannot write an Event itself: it decides
//! before the pod exists. So the controller does, once per pod, from the note the
//! webhook wrote on it ([`GPU_REMOVED_ANNOTATION`], which it removes from any pod
//! another creator wrote it into). The controller's own CPU-only copies carry the
//! same note and get the same Event: they too run without the GPU their notebook
//! asked for.
//!
//! [`GPU_REMOVED_ANNOTATION`]: gpu_booking_core::admission::GPU_REMOVED_ANNOTATION

use std::collections::HashSet;
use std::sync::Arc;

use chrono::{DateTime, TimeDelta, Utc};

use crate::actions::{self, Ctx, PodRef};
use crate::pods::PodInfo;

/// How long after a pod starts its Event is still worth writing: KubeSpawner's
/// default `start_timeout`, the longest a spawn's progress is shown. A pod first seen
/// later (the controller restarted, or became the leader) was stripped before, and
/// its Event written then.
pub const SPAWN_WINDOW: TimeDelta = TimeDelta::minutes(5);

/// The Event's reason (`kubectl get events --field-selector reason=GpuRemoved`).
pub const REASON: &str = "GpuRemoved";

/// Whether `pod` is due its Event at `now`: a notebook in a namespace the controller
/// serves, running or about to without the GPU it asked for, that started within
/// [`SPAWN_WINDOW`].
pub fn due(pod: &PodInfo, now: DateTime<Utc>) -> bool {
    pod.gpu_removed.is_some()
        && pod.gpu.is_none()
        && pod.served
        && !pod.finished
        && !pod.deleting
        && pod
            .started
            .is_some_and(|at| now.signed_duration_since(at) <= SPAWN_WINDOW)
}

/// The Event's message: the webhook's reason, as its admission warning words it.
pub fn message(reason: &str) -> String {
    let reason: String = reason
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    format!("gpu-booking: GPU removed ({reason}); running on CPU. A booking keeps a GPU.")
}

/// The pods whose Event was written by this replica (their uids), forgotten with the
/// pods: bounded by the pods the controller keeps.
pub struct StrippedEvents {
    ctx: Arc<Ctx>,
    noted: HashSet<String>,
}

impl StrippedEvents {
    pub fn new(ctx: Arc<Ctx>) -> Self {
        Self {
            ctx,
            noted: HashSet::new(),
        }
    }

    /// A pod seen by the watch: its Event is written (on a task of its own) when due,
    /// by the leader, and not before by this replica.
    pub fn seen(&mut self, pod: &PodInfo) {
        if self.ctx.dry_run
            || !self.ctx.leadership.is_leader()
            || self.noted.contains(&pod.uid)
            || !due(pod, self.ctx.clock.now())
        {
            return;
        }
        let Some(reason) = pod.gpu_removed.as_deref() else {
            return;
        };
        self.noted.insert(pod.uid.clone());
        let ctx = self.ctx.clone();
        let (namespace, name, uid) = (pod.namespace.clone(), pod.name.clone(), pod.uid.clone());
        let message = message(reason);
        tokio::spawn(async move {
            let at = PodRef {
                namespace: &namespace,
                name: &name,
                uid: &uid,
            };
            actions::warn_pod(&ctx, &at, REASON, &message, "Admit").await;
        });
    }

    /// The pod is gone (or no longer kept).
    pub fn forget(&mut self, uid: &str) {
        self.noted.remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::PodLite;
    use gpu_booking_core::admission::AdmissionConfig;
    use serde_json::{json, Value};

    fn pod(annotations: Value, limits: Value, phase: &str) -> PodInfo {
        let lite: PodLite = serde_json::from_value(json!({
            "metadata": {"name": "jupyter-bob", "namespace": "jhub", "uid": "u1",
                "creationTimestamp": "2026-11-30T09:00:00Z", "annotations": annotations},
            "spec": {"nodeName": "cpu-0", "containers": [{"resources": {"limits": limits}}]},
            "status": {"phase": phase, "startTime": "2026-11-30T09:00:01Z"}
        }))
        .unwrap();
        PodInfo::from_pod(&lite, &AdmissionConfig::default()).unwrap()
    }

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn stripped() -> PodInfo {
        pod(
            json!({"gpu-booking.io/gpu-removed": "no free a100 GPU and no active booking"}),
            json!({"cpu": "4"}),
            "Running",
        )
    }

    #[test]
    fn a_pod_stripped_at_spawn_is_due_while_its_spawn_may_still_be_shown() {
        let p = stripped();
        assert!(due(&p, at("2026-11-30T09:00:02Z")));
        assert!(due(&p, at("2026-11-30T09:05:01Z")));
        assert!(!due(&p, at("2026-11-30T09:05:02Z")), "past the window");
    }

    #[test]
    fn other_pods_are_not_due() {
        let now = at("2026-11-30T09:00:02Z");
        let plain = pod(json!({}), json!({"cpu": "4"}), "Running");
        let with_gpu = pod(
            json!({"gpu-booking.io/gpu-removed": "forged"}),
            json!({"nvidia.com/gpu": "1"}),
            "Running",
        );
        let finished = pod(
            json!({"gpu-booking.io/gpu-removed": "x"}),
            json!({}),
            "Succeeded",
        );
        let mut elsewhere = stripped();
        elsewhere.served = false;
        let mut deleting = stripped();
        deleting.deleting = true;
        for (what, p) in [
            ("no note", plain),
            ("a GPU", with_gpu),
            ("finished", finished),
            ("not served", elsewhere),
            ("deleting", deleting),
        ] {
            assert!(!due(&p, now), "{what}");
        }
    }

    #[test]
    fn the_message_is_the_webhooks_reason_on_one_line() {
        assert_eq!(
            message(" no free a100 GPU and no active booking\n"),
            "gpu-booking: GPU removed (no free a100 GPU and no active booking); running on \
             CPU. A booking keeps a GPU."
        );
        assert!(!message("a\nb\tc").contains(['\n', '\t']));
    }
}
