//! Our marks on a pod (labels, annotations, priority class) and when they are to be
//! believed.
//!
//! Anyone who can create a pod can write any label or annotation into it, and name
//! any priority class. So:
//!
//! - the webhook removes every key of ours that a pod's creator wrote, on every path
//!   (a GPU pod it decides, a pod without a GPU, a pod it lets through unchecked),
//!   and writes back only what its decision says ([`is_our_key`]);
//! - the controller believes a pod is booked only when its priority class is our
//!   high class, which only the webhook's booked decision gives (a creator's own
//!   high class is taken away on every other path), and the API server resolved it
//!   into `spec.priority` ([`trusted_priority`]). A priority class cannot be changed
//!   after creation, unlike labels and annotations.

use std::time::Duration;

use super::{AdmissionConfig, GPU_REMOVED_ANNOTATION, KEY_DOMAIN, LEGACY_LABEL_PREFIX};

/// Prefixes of our label and annotation keys: the one we write, and the legacy one
/// that pods created before the upgrade carry. Both are ours to strip from what a
/// creator wrote, and to drop from a pod's copies.
pub const OUR_PREFIXES: [&str; 2] = [KEY_DOMAIN, LEGACY_LABEL_PREFIX];

/// What every key in [`OUR_PREFIXES`] starts with (and our default priority classes):
/// a pod whose JSON lacks it carries no mark of ours (the webhook's quick scan).
pub const OUR_KEY_STEM: &str = "gpu-booking";

/// Whether `key` (a label or annotation key) is ours: one of our prefixes, or the
/// configured `terminate-at` annotation.
pub fn is_our_key(key: &str, cfg: &AdmissionConfig) -> bool {
    key == cfg.terminate_at_annotation || OUR_PREFIXES.iter().any(|p| key.starts_with(p))
}

/// Our keys that a creator may write without gaining a GPU: the note that says why
/// a pod runs without its GPU and what it asked for (the controller's CPU-only
/// copies carry both). They still put a "stripped" notebook on the named user's
/// page and in the line for a GPU offered back, so on a pod without a GPU only the
/// controller's are kept (`patch::plan_no_gpu`), and a stripped GPU pod gets the
/// webhook's own.
pub fn is_harmless_key(key: &str) -> bool {
    key == GPU_REMOVED_ANNOTATION || key == crate::offers::GPU_WANTED_ANNOTATION
}

/// A GPU pod's standing, as the controller may believe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodStanding {
    /// Booked: ended at `terminate-at`, never preempted.
    High,
    /// Lent: preemptible for a booked pod.
    Low,
}

/// The standing of a pod with the priority `label`, priority class `class` and
/// resolved `spec.priority`. High only when the label says so *and* the class is our
/// high class (with its priority resolved by the API server); a pod that calls
/// itself high otherwise is treated as lent. Without a configured high class there
/// is nothing to check the label against, and it is taken as written.
pub fn trusted_priority(
    label: Option<&str>,
    class: Option<&str>,
    spec_priority: Option<i32>,
    cfg: &AdmissionConfig,
) -> Option<PodStanding> {
    match label {
        Some("high") => {
            let vouched = match cfg.high_priority_class.as_deref() {
                Some(high) => class == Some(high) && spec_priority.is_some(),
                None => true,
            };
            Some(if vouched {
                PodStanding::High
            } else {
                PodStanding::Low
            })
        }
        Some("low") => Some(PodStanding::Low),
        _ => None,
    }
}

/// What becomes of a lent pod the scheduler could not place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingLent {
    /// Not such a pod: nothing to do.
    NotConcerned,
    /// It may still get its GPU (a unit may come free): wait.
    Wait,
    /// It was lent a GPU that is not there (several webhook replicas, or a usage
    /// report too late, lent more units than exist) and has waited `grace`: it is
    /// recreated without its GPU, as a pod stripped at admission would have run.
    RunOnCpu,
}

/// The backstop of the webhook's lend ledger: a lent pod (`standing` Low) that is not
/// bound to a node and that the scheduler found no room for for want of a GPU
/// resource (or of the VRAM budget) runs on CPU once it has waited `grace`.
pub fn pending_lent(
    standing: Option<PodStanding>,
    bound: bool,
    unschedulable_for_gpu: bool,
    waited: Duration,
    grace: Duration,
) -> PendingLent {
    if standing != Some(PodStanding::Low) || bound || !unschedulable_for_gpu {
        PendingLent::NotConcerned
    } else if waited >= grace {
        PendingLent::RunOnCpu
    } else {
        PendingLent::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_keys() {
        let cfg = AdmissionConfig::default();
        for ours in [
            "gpu-booking/priority",
            "gpu-booking/anything",
            "gpu-booking.io/priority",
            "gpu-booking.io/last-gpu-activity",
            "terminate-at",
        ] {
            assert!(is_our_key(ours, &cfg), "{ours}");
        }
        for theirs in [
            "hub.jupyter.org/username",
            "app",
            "gpu-booking",
            "x/gpu-booking/",
        ] {
            assert!(!is_our_key(theirs, &cfg), "{theirs}");
        }
        assert!(is_harmless_key(GPU_REMOVED_ANNOTATION));
        assert!(is_harmless_key(crate::offers::GPU_WANTED_ANNOTATION));
        assert!(is_our_key(crate::offers::GPU_WANTED_ANNOTATION, &cfg));
        assert!(OUR_PREFIXES.iter().all(|p| p.starts_with(OUR_KEY_STEM)));
    }

    #[test]
    fn every_key_is_under_one_domain_and_legacy_labels_are_ours() {
        use crate::admission::*;
        for key in [
            PRIORITY_LABEL,
            BOOKING_LABEL,
            MODEL_LABEL,
            BOOKING_UNITS_ANNOTATION,
            GPU_REMOVED_ANNOTATION,
            LAST_GPU_ACTIVITY_ANNOTATION,
            PREEMPTION_ROUNDS_ANNOTATION,
            PREEMPT_AT_ANNOTATION,
            PREEMPT_FOR_ANNOTATION,
            INTENT_LABEL,
            WEBHOOK_OPT_OUT_LABEL,
            NVML_MEMORY_LABEL,
            DEFAULT_GPUMEM_RESOURCE,
            DEFAULT_MODEL_NODE_LABEL,
        ] {
            assert!(key.starts_with("gpu-booking.io/"), "{key}");
            assert!(super::super::is_qualified_name(key), "{key}");
        }
        let cfg = AdmissionConfig::default();
        for (current, legacy) in LEGACY_LABELS {
            assert_eq!(
                current.strip_prefix(KEY_DOMAIN),
                legacy.strip_prefix(LEGACY_LABEL_PREFIX)
            );
            assert!(is_our_key(legacy, &cfg), "{legacy}");
        }
    }

    #[test]
    fn labels_are_read_under_either_key_the_new_one_first() {
        use crate::admission::{our_label, pod_label, BOOKING_LABEL, PRIORITY_LABEL};
        use serde_json::json;
        let old = json!({"metadata": {"labels": {"gpu-booking/priority": "high"}}});
        assert_eq!(pod_label(&old, PRIORITY_LABEL), Some("high"));
        assert_eq!(pod_label(&old, BOOKING_LABEL), None);
        let both = json!({"metadata": {"labels": {
            "gpu-booking/priority": "high", "gpu-booking.io/priority": "low"}}});
        assert_eq!(pod_label(&both, PRIORITY_LABEL), Some("low"));
        assert_eq!(pod_label(&json!({}), PRIORITY_LABEL), None);
        // Only our moved labels have a legacy key.
        let other = json!({"metadata": {"labels": {"gpu-booking/other": "x"}}});
        assert_eq!(
            our_label(
                |k| other["metadata"]["labels"][k].as_str(),
                "gpu-booking.io/other"
            ),
            None
        );
    }

    #[test]
    fn high_needs_our_class_and_its_priority() {
        let cfg = AdmissionConfig::default();
        let high = Some("gpu-booking-high");
        assert_eq!(
            trusted_priority(Some("high"), high, Some(1_000_000), &cfg),
            Some(PodStanding::High)
        );
        // A label written by the creator, without the class: lent.
        for (class, prio) in [
            (None, None),
            (Some("gpu-booking-low"), Some(0)),
            (Some("system-cluster-critical"), Some(2_000_000_000)),
            (high, None),
        ] {
            assert_eq!(
                trusted_priority(Some("high"), class, prio, &cfg),
                Some(PodStanding::Low),
                "{class:?} {prio:?}"
            );
        }
        assert_eq!(
            trusted_priority(Some("low"), None, None, &cfg),
            Some(PodStanding::Low)
        );
        assert_eq!(trusted_priority(None, high, Some(1), &cfg), None);
        assert_eq!(trusted_priority(Some("urgent"), high, Some(1), &cfg), None);
        let classless = AdmissionConfig {
            high_priority_class: None,
            ..AdmissionConfig::default()
        };
        assert_eq!(
            trusted_priority(Some("high"), None, None, &classless),
            Some(PodStanding::High)
        );
    }

    #[test]
    fn pending_lent_pods_wait_then_run_on_cpu() {
        let grace = Duration::from_secs(10);
        let low = Some(PodStanding::Low);
        let s = Duration::from_secs;
        assert_eq!(
            pending_lent(low, false, true, s(3), grace),
            PendingLent::Wait
        );
        assert_eq!(
            pending_lent(low, false, true, s(10), grace),
            PendingLent::RunOnCpu
        );
        for (standing, bound, gpu) in [
            (Some(PodStanding::High), false, true),
            (None, false, true),
            (low, true, true),
            (low, false, false),
        ] {
            assert_eq!(
                pending_lent(standing, bound, gpu, s(100), grace),
                PendingLent::NotConcerned
            );
        }
    }
}
