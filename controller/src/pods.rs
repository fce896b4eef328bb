//! What the controller keeps of each pod: a few fields, read from a lean view of the
//! pod that the watch decodes (10,000 pods would not fit comfortably as full objects).

use std::borrow::Cow;
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use gpu_booking_core::admission::{
    container_budget_mib, detect_gpu, named_user, our_label, trusted_priority, AdmissionConfig,
    PodStanding, BOOKING_LABEL, BOOKING_UNITS_ANNOTATION, GPU_REMOVED_ANNOTATION,
    LAST_GPU_ACTIVITY_ANNOTATION, MODEL_LABEL, PREEMPT_AT_ANNOTATION, PREEMPT_FOR_ANNOTATION,
    PRIORITY_LABEL, RESTART_TOLD_ANNOTATION,
};
use gpu_booking_core::eviction::NodeConstraints;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Annotation on a Pending booked pod: the preemption rounds the controller has
/// started for it, written by the leader before each round's first eviction, so
/// that the bound (`--preemption-attempts`) holds across a change of leader. One of
/// our keys (defined in core with the others): the webhook removes it from a pod its
/// creator wrote it into.
pub use gpu_booking_core::admission::PREEMPTION_ROUNDS_ANNOTATION;

/// A pod with only what the controller reads: metadata, node, container resources,
/// phase, start time and conditions. Everything else in the JSON is skipped while
/// decoding.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct PodLite {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: SpecLite,
    #[serde(default)]
    pub status: StatusLite,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecLite {
    #[serde(default)]
    pub node_name: Option<String>,
    #[serde(default)]
    pub containers: Vec<ContainerLite>,
    #[serde(default)]
    pub init_containers: Vec<ContainerLite>,
    /// Where the pod may run (the webhook puts the model's node label here).
    #[serde(default)]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Set at creation and never changed: the webhook gives our high class only to
    /// booked pods, so it vouches for a `priority=high` label.
    #[serde(default)]
    pub priority_class_name: Option<String>,
    /// The class's value, resolved by the API server's Priority plugin.
    #[serde(default)]
    pub priority: Option<i32>,
    /// Its required node affinity counts where it may run (read by core).
    #[serde(default)]
    pub affinity: Option<Value>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct ContainerLite {
    #[serde(default)]
    pub resources: Option<Value>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusLite {
    #[serde(default)]
    pub phase: Option<String>,
    #[serde(default)]
    pub start_time: Option<Time>,
    #[serde(default)]
    pub conditions: Vec<ConditionLite>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct ConditionLite {
    #[serde(rename = "type", default)]
    pub type_: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
}

impl PodLite {
    /// Whether the scheduler cannot place the pod for want of `resource` (its
    /// message names the resource: "0/3 nodes are available: 3 Insufficient ...").
    pub fn unschedulable_for(&self, resource: &str) -> bool {
        self.spec.node_name.is_none()
            && self.status.conditions.iter().any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
                    && c.message.as_deref().is_some_and(|m| m.contains(resource))
            })
    }
}

impl kube::Resource for PodLite {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Pod".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "pods".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// `gpu-booking.io/priority`, as far as it is believed (core's [`trusted_priority`]).
pub type Priority = PodStanding;

/// The GPU resources of a pod: units per resource name, as the pod needs them at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuUse {
    pub units: u64,
    /// The model a per-model resource names (`nvidia.com/mig-1g.5gb`), if exactly one.
    pub model: Option<String>,
}

/// What the scheduler needs to place a pod, as far as preemption looks at it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// Its `nodeSelector` and required node affinity.
    pub constraints: NodeConstraints,
    /// Its declared VRAM budget (the `gpumem` resource of its containers), MiB.
    pub gpumem_mib: u64,
}

/// What the controller keeps of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub priority: Option<Priority>,
    pub booking_id: Option<i64>,
    /// The GPUs its booking is for (the webhook's annotation), if a high-priority pod.
    pub booking_units: Option<u64>,
    /// `gpu-booking.io/model`: the model the webhook admitted the pod on.
    pub model_label: Option<String>,
    pub user: Option<String>,
    pub terminate_at: Option<DateTime<Utc>>,
    /// Has an owner (ReplicaSet, StatefulSet, Job ...) that recreates it.
    pub owned: bool,
    pub node: Option<String>,
    pub finished: bool,
    pub deleting: bool,
    pub placement: Placement,
    pub gpu: Option<GpuUse>,
    /// When it started (or was created, before it started).
    pub started: Option<DateTime<Utc>>,
    /// Last GPU activity, as the node agent reported it.
    pub last_activity: Option<DateTime<Utc>>,
    /// Chosen to give way to a booked pod: when it ends, and for whom (`namespace/name`)
    /// ([`PREEMPT_AT_ANNOTATION`], [`PREEMPT_FOR_ANNOTATION`]).
    pub preempt_at: Option<DateTime<Utc>>,
    pub preempt_for: Option<String>,
    /// Preemption rounds started for it, as recorded on it
    /// ([`PREEMPTION_ROUNDS_ANNOTATION`]; 0 when absent or unreadable).
    pub preemption_rounds: u32,
    /// kube-scheduler is evicting it for a pod of higher priority.
    pub scheduler_preempted: bool,
    /// The scheduler found no node for it.
    pub unschedulable: bool,
    /// ... for want of a GPU resource or of the VRAM budget.
    pub unschedulable_for_gpu: bool,
    /// In a namespace the controller serves (`--namespace`): it ends, re-creates
    /// and annotates this pod. Pods elsewhere are only counted.
    pub served: bool,
    /// Why its GPU was removed ([`GPU_REMOVED_ANNOTATION`]): a notebook stripped at
    /// spawn or re-created on CPU, kept for its user's list of notebooks.
    pub gpu_removed: Option<String>,
    /// The bookings whose start its user was told of ([`RESTART_TOLD_ANNOTATION`];
    /// ids that do not read are left out).
    pub restart_told: Vec<i64>,
}

/// The VRAM budget of the containers: each one's budget resources, the plain one and
/// a model's (core's [`container_budget_mib`]: limit, else request); init containers
/// run before them and hold nothing beside them.
fn gpumem_mib(containers: &[ContainerLite], resource: &str) -> u64 {
    containers
        .iter()
        .filter_map(|c| container_budget_mib(c.resources.as_ref()?, resource))
        .fold(0u64, u64::saturating_add)
}

fn parse_time(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s.trim())
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

impl PodInfo {
    /// The pod as the controller sees it; `None` for a pod without a name or uid.
    pub fn from_pod(pod: &PodLite, cfg: &AdmissionConfig) -> Option<Self> {
        let meta = &pod.metadata;
        let labels = meta.labels.as_ref();
        let annotations = meta.annotations.as_ref();
        let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
        // Ours under the current key or, on a pod from before the upgrade, the legacy one.
        let ours = |k: &str| our_label(label, k);
        let annotation = |k: &str| annotations.and_then(|a| a.get(k)).map(String::as_str);
        // A label anyone could have written is believed only with our class.
        let priority = trusted_priority(
            ours(PRIORITY_LABEL),
            pod.spec.priority_class_name.as_deref(),
            pod.spec.priority,
            cfg,
        );
        let resources = |list: &[ContainerLite]| -> Vec<Value> {
            list.iter()
                .map(|c| json!({"resources": c.resources.clone().unwrap_or(Value::Null)}))
                .collect()
        };
        let view = json!({"spec": {
            "containers": resources(&pod.spec.containers),
            "initContainers": resources(&pod.spec.init_containers),
        }});
        let gpu = detect_gpu(&view, cfg).map(|req| GpuUse {
            units: req.units,
            model: req.model().map(|m| m.as_str().to_owned()),
        });
        let conditions = &pod.status.conditions;
        let scheduler_preempted = conditions.iter().any(|c| {
            c.type_ == "DisruptionTarget"
                && c.status == "True"
                && c.reason.as_deref() == Some("PreemptionByScheduler")
        });
        let unschedulable = conditions.iter().any(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        });
        let unschedulable_for_gpu = cfg
            .gpu_resource_names()
            .chain([&cfg.gpumem_resource])
            .any(|resource| pod.unschedulable_for(resource));
        Some(Self {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone()?,
            uid: meta.uid.clone()?,
            priority,
            booking_id: ours(BOOKING_LABEL).and_then(|b| b.parse().ok()),
            booking_units: annotation(BOOKING_UNITS_ANNOTATION).and_then(|u| u.trim().parse().ok()),
            model_label: ours(MODEL_LABEL).map(str::to_owned),
            user: named_user(annotation, label).map(str::to_owned),
            terminate_at: annotation(&cfg.terminate_at_annotation).and_then(parse_time),
            owned: meta
                .owner_references
                .as_ref()
                .is_some_and(|o| !o.is_empty()),
            node: pod.spec.node_name.clone().filter(|n| !n.is_empty()),
            finished: matches!(pod.status.phase.as_deref(), Some("Succeeded" | "Failed")),
            deleting: meta.deletion_timestamp.is_some(),
            placement: Placement {
                constraints: NodeConstraints {
                    node_selector: pod.spec.node_selector.clone().unwrap_or_default(),
                    ..NodeConstraints::from_pod_spec(&json!({"affinity": pod.spec.affinity}))
                },
                gpumem_mib: gpumem_mib(&pod.spec.containers, &cfg.gpumem_resource),
            },
            gpu,
            started: pod
                .status
                .start_time
                .as_ref()
                .or(meta.creation_timestamp.as_ref())
                .map(|t| t.0),
            last_activity: annotation(LAST_GPU_ACTIVITY_ANNOTATION).and_then(parse_time),
            preempt_at: annotation(PREEMPT_AT_ANNOTATION).and_then(parse_time),
            preempt_for: annotation(PREEMPT_FOR_ANNOTATION).map(str::to_owned),
            preemption_rounds: annotation(PREEMPTION_ROUNDS_ANNOTATION)
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0),
            scheduler_preempted,
            unschedulable,
            unschedulable_for_gpu,
            served: true,
            gpu_removed: annotation(GPU_REMOVED_ANNOTATION).map(str::to_owned),
            restart_told: annotation(RESTART_TOLD_ANNOTATION)
                .map(|v| {
                    v.split(',')
                        .filter_map(|id| id.trim().parse().ok())
                        .collect()
                })
                .unwrap_or_default(),
        })
    }

    /// Worth keeping: it has a GPU or one of our priority labels, or it is a
    /// notebook that lost its GPU (its user sees it in their notebooks).
    pub fn relevant(&self) -> bool {
        self.gpu.is_some() || self.priority.is_some() || self.gpu_removed.is_some()
    }

    /// A booked pod with an end, still running or waiting to, where the controller
    /// acts (one elsewhere is not its to end).
    pub fn expiry(&self) -> Option<DateTime<Utc>> {
        (self.served && self.priority == Some(Priority::High) && !self.finished && !self.deleting)
            .then_some(self.terminate_at)
            .flatten()
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Holds GPU units on a node now.
    pub fn holds_gpu(&self) -> bool {
        self.node.is_some() && !self.finished && self.gpu.is_some()
    }

    /// The time that orders victims: the last GPU activity the agent reported, else
    /// the start. Least recent goes first.
    pub fn last_used(&self) -> Option<DateTime<Utc>> {
        self.last_activity.or(self.started)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lite(v: Value) -> PodLite {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn reads_what_matters() {
        // A pod admitted since the upgrade, and one admitted before it (legacy keys).
        for labels in [
            json!({"gpu-booking.io/priority": "high", "gpu-booking.io/booking": "7", "gpu-booking.io/model": "a100"}),
            json!({"gpu-booking/priority": "high", "gpu-booking/booking": "7", "gpu-booking/model": "a100"}),
        ] {
            reads_what_matters_with(labels);
        }
    }

    fn reads_what_matters_with(labels: Value) {
        let pod = lite(json!({
            "metadata": {"name": "p", "namespace": "jhub", "uid": "u1",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": labels,
                "annotations": {"terminate-at": "2026-01-02T00:00:00Z",
                    "hub.jupyter.org/username": "alice@example.com",
                    "gpu-booking.io/last-gpu-activity": "2026-01-01T05:00:00Z"}},
            "spec": {"nodeName": "n1", "priorityClassName": "gpu-booking-high", "priority": 1000000,
                "containers": [{"name": "a", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                               {"name": "b", "resources": {"requests": {"nvidia.com/gpu": 1}}}],
                "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running", "conditions": [
                {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]}
        }));
        let info = PodInfo::from_pod(&pod, &AdmissionConfig::default()).unwrap();
        assert_eq!(info.priority, Some(Priority::High));
        assert_eq!(info.booking_id, Some(7));
        assert_eq!(info.model_label.as_deref(), Some("a100"));
        assert_eq!(info.user.as_deref(), Some("alice@example.com"));
        assert_eq!(info.gpu.as_ref().unwrap().units, 2);
        assert_eq!(info.expiry(), parse_time("2026-01-02T00:00:00Z"));
        assert_eq!(info.last_used(), parse_time("2026-01-01T05:00:00Z"));
        assert!(info.scheduler_preempted && info.holds_gpu() && !info.owned);
    }

    #[test]
    fn reads_where_a_pod_may_run_and_its_vram_budget() {
        let pod = lite(json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"nodeSelector": {"gpu-booking.io/model": "a100"},
                "containers": [
                    {"resources": {"limits": {"nvidia.com/gpu": "1", "gpu-booking.io/gpumem": "40960"}}},
                    {"resources": {"requests": {"gpu-booking.io/gpumem": "1024"}}},
                    {"resources": {"limits": {"nvidia.com/gpu": "1", "gpu-booking.io/gpumem-t4": "2048"}}},
                    {"resources": {"limits": {"gpu-booking.io/gpumem": "lots"}}}],
                "initContainers": [{"resources": {"limits": {"gpu-booking.io/gpumem": "99999"}}}]}
        }));
        let info = PodInfo::from_pod(&pod, &AdmissionConfig::default()).unwrap();
        assert_eq!(
            info.placement.gpumem_mib,
            41_984 + 2048,
            "a model's budget resource counts too"
        );
        assert_eq!(
            info.placement
                .constraints
                .node_selector
                .get("gpu-booking.io/model")
                .map(String::as_str),
            Some("a100")
        );
    }

    #[test]
    fn odd_values_are_ignored_not_fatal() {
        let pod = lite(json!({
            "metadata": {"name": "p", "uid": "u", "labels": {"gpu-booking.io/priority": "urgent", "gpu-booking.io/booking": "x"},
                "annotations": {"terminate-at": "tomorrow"}},
            "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "lots"}}}]}
        }));
        let info = PodInfo::from_pod(&pod, &AdmissionConfig::default()).unwrap();
        assert_eq!(
            (info.priority, info.booking_id, info.terminate_at),
            (None, None, None)
        );
        // An unreadable quantity counts as a GPU request (core errs on the safe side).
        assert!(info.relevant());
        assert!(PodInfo::from_pod(&PodLite::default(), &AdmissionConfig::default()).is_none());
    }

    #[test]
    fn forged_high_is_lent_and_its_end_ignored() {
        // The creator wrote the label and terminate-at, not our class.
        let pod = |class: Option<&str>| {
            lite(json!({
                "metadata": {"name": "p", "uid": "u",
                    "labels": {"gpu-booking.io/priority": "high", "gpu-booking.io/booking": "7"},
                    "annotations": {"terminate-at": "2026-01-02T00:00:00Z"}},
                "spec": {"nodeName": "n1", "priorityClassName": class, "priority": class.map(|_| 0),
                    "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
                "status": {"conditions": [{"type": "PodScheduled", "status": "False",
                    "reason": "Unschedulable", "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]}
            }))
        };
        let cfg = AdmissionConfig::default();
        for class in [None, Some("gpu-booking-low"), Some("other")] {
            let info = PodInfo::from_pod(&pod(class), &cfg).unwrap();
            assert_eq!(info.priority, Some(Priority::Low), "{class:?}");
            assert_eq!(info.expiry(), None, "a forged terminate-at is not an end");
        }
        let info = PodInfo::from_pod(&pod(Some("gpu-booking-high")), &cfg).unwrap();
        assert_eq!(info.priority, Some(Priority::High));
        assert!(info.expiry().is_some());
        // Bound pods are not waiting; an unbound one is, for want of a GPU.
        let mut waiting = pod(None);
        waiting.spec.node_name = None;
        assert!(
            PodInfo::from_pod(&waiting, &cfg)
                .unwrap()
                .unschedulable_for_gpu
        );
    }
}
