//! The node's pods as the agent needs them: UID, name, containers and their IDs,
//! annotations, labels, the declared VRAM budget and whether the pod is booked; and
//! the index that maps a cgroup's pod UID and container ID to them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use gpu_booking_core::admission::{
    container_budget_mib as budget_of_container, named_user, our_label, trusted_priority,
    AdmissionConfig, PodStanding, PRIORITY_LABEL,
};
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod};

use crate::cgroup::{status_container_id, ContainerRef};

/// Static pods: the kubelet's cgroups carry the pod's own UID; the API's mirror pod has
/// another UID and keeps the original in this annotation.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// One pod of the node.
#[derive(Debug, Clone, PartialEq)]
pub struct PodInfo {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Every container (init, regular, ephemeral) with its runtime ID once it has one.
    pub containers: Vec<(String, Option<String>)>,
    /// The declared VRAM budget: the sum over containers of their budget resources,
    /// the plain `gpumem` one and a model's own `<gpumem>-<model>` (each its limit,
    /// else its request), in MiB; `None` when no container declares one.
    pub gpumem_budget_mib: Option<u64>,
    /// Booked (high) or lent (low), as the controller believes it: our priority label
    /// counts as high only with our high priority class, which a pod's creator cannot
    /// give itself (core's [`trusted_priority`]).
    pub standing: Option<PodStanding>,
}

impl PodInfo {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The JupyterHub user the pod names, as written, for audit rows and logs (not a
    /// trust decision: [`named_user`]).
    pub fn username(&self) -> Option<&str> {
        named_user(
            |k| self.annotations.get(k).map(String::as_str),
            |k| self.labels.get(k).map(String::as_str),
        )
    }

    /// The name of the container with runtime ID `id`.
    pub fn container_named_by(&self, id: &str) -> Option<&str> {
        self.containers.iter().find_map(|(name, cid)| {
            cid.as_deref()
                .filter(|c| c.eq_ignore_ascii_case(id))
                .map(|_| name.as_str())
        })
    }

    /// The parts of a pod the agent uses, read with `cfg`'s VRAM budget resource and
    /// priority classes; `None` for a pod without UID, namespace or name (the API
    /// server always sets them).
    pub fn from_pod(pod: &Pod, cfg: &AdmissionConfig) -> Option<Self> {
        let gpumem_resource = cfg.gpumem_resource.as_str();
        let meta = &pod.metadata;
        let uid = meta.uid.clone()?;
        let namespace = meta.namespace.clone()?;
        let name = meta.name.clone()?;
        let mut containers = Vec::new();
        let mut budget: Option<u64> = None;
        let status = pod.status.as_ref();
        let statuses = [
            status.and_then(|s| s.init_container_statuses.as_ref()),
            status.and_then(|s| s.container_statuses.as_ref()),
            status.and_then(|s| s.ephemeral_container_statuses.as_ref()),
        ];
        let id_of = |name: &str| {
            statuses
                .iter()
                .flatten()
                .flat_map(|list| list.iter())
                .find(|s: &&ContainerStatus| s.name == name)
                .and_then(|s| s.container_id.as_deref())
                .and_then(status_container_id)
                .map(str::to_ascii_lowercase)
        };
        if let Some(spec) = &pod.spec {
            let lists: [&[Container]; 2] = [
                spec.init_containers.as_deref().unwrap_or_default(),
                &spec.containers,
            ];
            for c in lists.iter().flat_map(|l| l.iter()) {
                containers.push((c.name.clone(), id_of(&c.name)));
                if let Some(mib) = container_budget_mib(c, gpumem_resource) {
                    budget = Some(budget.unwrap_or(0).saturating_add(mib));
                }
            }
            for c in spec.ephemeral_containers.iter().flatten() {
                containers.push((c.name.clone(), id_of(&c.name)));
            }
        }
        let labels = meta.labels.clone().unwrap_or_default();
        let spec = pod.spec.as_ref();
        let standing = trusted_priority(
            our_label(|k| labels.get(k).map(String::as_str), PRIORITY_LABEL),
            spec.and_then(|s| s.priority_class_name.as_deref()),
            spec.and_then(|s| s.priority),
            cfg,
        );
        Some(Self {
            uid: uid.to_ascii_lowercase(),
            namespace,
            name,
            labels,
            annotations: meta.annotations.clone().unwrap_or_default(),
            containers,
            gpumem_budget_mib: budget,
            standing,
        })
    }
}

/// A container's budget in MiB: every budget resource it names (limits win, as in
/// the webhook's planner), read by core's one reader.
fn container_budget_mib(c: &Container, resource: &str) -> Option<u64> {
    let resources = serde_json::to_value(c.resources.as_ref()?).ok()?;
    budget_of_container(&resources, resource)
}

/// Why a process in a pod cgroup could not be matched to a pod of this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PodMiss {
    /// No pod of this node has the UID.
    UnknownPod,
    /// The pod is known but none of its containers has the ID (yet).
    UnknownContainer,
}

impl PodMiss {
    pub fn as_str(self) -> &'static str {
        match self {
            PodMiss::UnknownPod => "unknown_pod",
            PodMiss::UnknownContainer => "unknown_container",
        }
    }
}

/// The node's pods by UID (and static pods by their kubelet UID).
#[derive(Debug, Default, Clone)]
pub struct PodIndex {
    by_uid: HashMap<String, Arc<PodInfo>>,
}

impl PodIndex {
    pub fn new(pods: impl IntoIterator<Item = PodInfo>) -> Self {
        let mut by_uid = HashMap::new();
        for pod in pods {
            let pod = Arc::new(pod);
            if let Some(mirror) = pod.annotations.get(MIRROR_ANNOTATION) {
                by_uid.insert(mirror.to_ascii_lowercase(), pod.clone());
            }
            by_uid.insert(pod.uid.clone(), pod);
        }
        Self { by_uid }
    }

    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }

    /// The pod and container name of a process's cgroup.
    pub fn resolve(&self, c: &ContainerRef) -> Result<(Arc<PodInfo>, String), PodMiss> {
        let pod = self.by_uid.get(&c.pod_uid).ok_or(PodMiss::UnknownPod)?;
        let name = pod
            .container_named_by(&c.container_id)
            .ok_or(PodMiss::UnknownContainer)?;
        Ok((pod.clone(), name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::Runtime;
    use serde_json::json;

    const CID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_label_only_pod_names_its_slug() {
        // As the controller's audit does: the annotation, else the label as written.
        let p = pod(json!({
            "metadata": {"name": "jupyter-bob", "namespace": "jhub", "uid": "u1",
                "labels": {"hub.jupyter.org/username": "bob-2esmith"}},
            "spec": {"containers": [{"name": "notebook"}]}
        }));
        let info = PodInfo::from_pod(&p, &AdmissionConfig::default()).unwrap();
        assert_eq!(info.username(), Some("bob-2esmith"));
    }

    #[test]
    fn reads_containers_budget_and_user() {
        let p = pod(json!({
            "metadata": {"name": "jupyter-alice", "namespace": "jhub",
                "uid": "6B1C0F1E-2D3A-4B5C-8D9E-0A1B2C3D4E5F",
                "annotations": {"hub.jupyter.org/username": "alice@example.com"}},
            "spec": {
                "initContainers": [{"name": "init", "resources": {"requests": {"gpu-booking.io/gpumem": "1024"}}}],
                "containers": [
                    {"name": "notebook", "resources": {
                        "limits": {"nvidia.com/gpu": "1", "gpu-booking.io/gpumem": "8192"},
                        "requests": {"gpu-booking.io/gpumem": "4096"}}},
                    {"name": "sidecar"}
                ]},
            "status": {"containerStatuses": [
                {"name": "notebook", "containerID": format!("containerd://{CID}"),
                 "image": "x", "imageID": "", "ready": true, "restartCount": 0},
                {"name": "sidecar", "image": "x", "imageID": "", "ready": false, "restartCount": 0}
            ]}
        }));
        let info = PodInfo::from_pod(&p, &AdmissionConfig::default()).unwrap();
        assert_eq!(info.uid, "6b1c0f1e-2d3a-4b5c-8d9e-0a1b2c3d4e5f");
        assert_eq!(info.key(), "jhub/jupyter-alice");
        assert_eq!(info.gpumem_budget_mib, Some(8192 + 1024));
        assert_eq!(info.username(), Some("alice@example.com"));
        assert_eq!(info.container_named_by(CID), Some("notebook"));
        assert_eq!(info.containers.len(), 3);

        let index = PodIndex::new([info]);
        let c = ContainerRef {
            pod_uid: "6b1c0f1e-2d3a-4b5c-8d9e-0a1b2c3d4e5f".into(),
            container_id: CID.into(),
            runtime: Runtime::Containerd,
        };
        assert_eq!(index.resolve(&c).unwrap().1, "notebook");
        let other = ContainerRef {
            container_id: "f".repeat(64),
            ..c.clone()
        };
        assert_eq!(
            index.resolve(&other).unwrap_err(),
            PodMiss::UnknownContainer
        );
        let stranger = ContainerRef {
            pod_uid: "00000000-0000-0000-0000-000000000000".into(),
            ..c
        };
        assert_eq!(index.resolve(&stranger).unwrap_err(), PodMiss::UnknownPod);
    }

    /// A pod of a model with a resource of its own has its budget under the model's
    /// budget resource (`gpu-booking.io/gpumem-t4`): that is its budget, added to any
    /// plain one, limits first.
    #[test]
    fn a_models_own_budget_resource_is_the_budget() {
        let p = pod(json!({
            "metadata": {"name": "jupyter-carol", "namespace": "jhub", "uid": "u"},
            "spec": {"containers": [
                {"name": "notebook", "resources": {
                    "limits": {"nvidia.com/t4": "1", "gpu-booking.io/gpumem-t4": "6000"},
                    "requests": {"gpu-booking.io/gpumem-t4": "3000"}}},
                {"name": "helper", "resources": {"requests": {"gpu-booking.io/gpumem": "500"}}},
                {"name": "other", "resources": {"limits": {"example.com/gpumem-t4": "7"}}}
            ]}
        }));
        let info = PodInfo::from_pod(&p, &AdmissionConfig::default()).unwrap();
        assert_eq!(info.gpumem_budget_mib, Some(6000 + 500));
    }

    #[test]
    fn no_budget_and_odd_quantities() {
        let p = pod(json!({
            "metadata": {"name": "a", "namespace": "b", "uid": "u"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"gpu-booking.io/gpumem": "lots"}}}]}
        }));
        assert_eq!(
            PodInfo::from_pod(&p, &AdmissionConfig::default())
                .unwrap()
                .gpumem_budget_mib,
            None
        );
        let p = pod(json!({"metadata": {"name": "a", "namespace": "b", "uid": "u"}}));
        assert_eq!(
            PodInfo::from_pod(&p, &AdmissionConfig::default())
                .unwrap()
                .gpumem_budget_mib,
            None
        );
        let p = pod(json!({"metadata": {"name": "a"}}));
        assert!(PodInfo::from_pod(&p, &AdmissionConfig::default()).is_none());
    }

    #[test]
    fn booked_only_with_our_high_class_and_its_resolved_priority() {
        let standing =
            |labels: serde_json::Value, spec: serde_json::Value, cfg: &AdmissionConfig| {
                let mut spec = spec;
                spec["containers"] = json!([{"name": "notebook"}]);
                let p = pod(json!({
                    "metadata": {"name": "a", "namespace": "jhub", "uid": "u", "labels": labels},
                    "spec": spec
                }));
                PodInfo::from_pod(&p, cfg).unwrap().standing
            };
        let cfg = AdmissionConfig::default();
        let high = json!({"gpu-booking.io/priority": "high"});
        let ours = json!({"priorityClassName": "gpu-booking-high", "priority": 1000});
        assert_eq!(
            standing(high.clone(), ours.clone(), &cfg),
            Some(PodStanding::High)
        );
        // Pods from before the label moved carry the legacy key.
        assert_eq!(
            standing(json!({"gpu-booking/priority": "high"}), ours.clone(), &cfg),
            Some(PodStanding::High)
        );
        // A label its creator wrote, without our class (or its resolved priority): lent.
        for spec in [
            json!({}),
            json!({"priorityClassName": "other-high", "priority": 1000}),
            json!({"priorityClassName": "gpu-booking-high"}),
        ] {
            assert_eq!(
                standing(high.clone(), spec.clone(), &cfg),
                Some(PodStanding::Low),
                "{spec}"
            );
        }
        // Our class alone, without the label, is not a booking's pod.
        assert_eq!(standing(json!({}), ours.clone(), &cfg), None);
        // The configured class is the one believed.
        let renamed = AdmissionConfig {
            high_priority_class: Some("lab-booked".into()),
            ..AdmissionConfig::default()
        };
        assert_eq!(
            standing(high.clone(), ours, &renamed),
            Some(PodStanding::Low)
        );
        assert_eq!(
            standing(
                high,
                json!({"priorityClassName": "lab-booked", "priority": 5}),
                &renamed
            ),
            Some(PodStanding::High)
        );
    }

    #[test]
    fn static_pods_by_mirror_uid() {
        let p = pod(json!({
            "metadata": {"name": "s", "namespace": "kube-system", "uid": "api-uid",
                "annotations": {"kubernetes.io/config.mirror": "6b1c0f1e-2d3a-4b5c-8d9e-0a1b2c3d4e5f"}},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"containerStatuses": [{"name": "c", "containerID": format!("cri-o://{CID}"),
                "image": "x", "imageID": "", "ready": true, "restartCount": 0}]}
        }));
        let cfg = AdmissionConfig {
            gpumem_resource: "x/y".into(),
            ..AdmissionConfig::default()
        };
        let index = PodIndex::new([PodInfo::from_pod(&p, &cfg).unwrap()]);
        let c = ContainerRef {
            pod_uid: "6b1c0f1e-2d3a-4b5c-8d9e-0a1b2c3d4e5f".into(),
            container_id: CID.into(),
            runtime: Runtime::CriO,
        };
        assert_eq!(index.resolve(&c).unwrap().0.name, "s");
    }
}
